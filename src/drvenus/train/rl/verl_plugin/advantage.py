"""The IGPO advantage estimator in verl: registered as ``grpo_info_gain`` (DR-Venus's name).

verl hands estimators the policy-loss mask (0 on tool-response tokens), but IGPO's turn anchors
sit on tool-response tokens and the estimator needs the response's attention mask (DR-Venus
passes all ones). :func:`compute_advantage` therefore replaces verl's for this estimator (the
trainer installs it, see :mod:`.main`) and passes the attention mask; other estimators go to
verl's own. The knobs are ``algorithm.igpo_*`` keys (``+algorithm.igpo_norm_mode=...``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from drvenus.train.rl.advantage import igpo_advantages
from drvenus.train.rl.verl_plugin.convert import advantage_knobs

ESTIMATOR = "grpo_info_gain"


@core_algos.register_adv_est(ESTIMATOR)
def grpo_info_gain(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                   index: np.ndarray | None = None, config: Any = None,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature: (advantages, returns)."""
    groups = index if index is not None else np.arange(token_level_rewards.shape[0])
    adv, metrics = igpo_advantages(token_level_rewards, response_mask, groups,
                                   **advantage_knobs(config))
    grpo_info_gain.last_metrics = metrics  # type: ignore[attr-defined]
    return adv, adv


def compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
    """verl's ``compute_advantage`` with the attention mask for ``grpo_info_gain``."""
    name = getattr(adv_estimator, "value", adv_estimator)
    if name != ESTIMATOR:
        return _VERL_COMPUTE_ADVANTAGE(data, adv_estimator, *args, **kwargs)
    rewards = data.batch["token_level_rewards"]
    width = rewards.shape[1]
    mask = data.batch["attention_mask"][:, -width:].to(rewards.dtype)
    config = kwargs.get("config")
    adv, returns = grpo_info_gain(rewards, mask, index=data.non_tensor_batch.get("uid"),
                                  config=config)
    data.batch["advantages"] = adv
    data.batch["returns"] = returns
    return data


def _verl_compute_advantage() -> Any:
    from verl.trainer.ppo import ray_trainer

    return ray_trainer.compute_advantage


_VERL_COMPUTE_ADVANTAGE = _verl_compute_advantage()

__all__ = ["ESTIMATOR", "compute_advantage", "grpo_info_gain"]
