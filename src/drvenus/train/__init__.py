"""Training: supervised fine-tuning (``sft``) and reinforcement learning.

Everything here needs the ``train`` extra (``pip install 'drvenus[train]'``: torch, transformers);
importing the package itself does not.
"""
