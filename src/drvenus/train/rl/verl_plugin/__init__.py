"""IGPO on verl (pinned: verl 0.6.1): the drvenus agent loop, reward manager and advantage
estimator, an IG scoring hook on the actor, and a launcher.

Modules that import verl: :mod:`.agent_loop` (``drvenus_agent``), :mod:`.reward`
(``drvenus_igpo``), :mod:`.advantage` (``grpo_info_gain``) and :mod:`.main` (the entry point).
:mod:`.convert` and :mod:`.launch` need no verl. See docs/RL.md.
"""

from __future__ import annotations

from drvenus.train.launch import VERL_VERSION

ENTRY_MODULE = "drvenus.train.rl.verl_plugin.main"

__all__ = ["ENTRY_MODULE", "VERL_VERSION"]
