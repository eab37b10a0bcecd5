"""IGPO reinforcement learning pieces: advantages, information-gain scoring, token rewards.

``advantage.igpo_advantages`` follows DR-Venus's ``grpo_info_gain`` estimator; ``ig`` scores
the policy's log-probability of the ground truth at turn boundaries; ``rewards`` builds the
token-level reward tensor (IG / format penalties at turn ends, outcome at the last token).
Needs the ``train`` extra (torch, transformers).
"""
