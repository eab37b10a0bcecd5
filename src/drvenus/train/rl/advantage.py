"""IGPO advantages: DR-Venus's ``grpo_info_gain`` estimator, written from its semantics.

Layout of ``token_level_rewards`` (one row per trajectory): the outcome reward sits at the last
position of the response mask; every other nonzero entry under the mask is a turn's
information-gain reward (so a true zero IG must be stored as a tiny sentinel, see
``rewards.ZERO_IG_SENTINEL``). Rewards are normalised per group (the n rollouts of one question),
then, per trajectory, accumulated backwards across its turn positions
(``A_k = r_k + gamma * A_(k+1)``) and each ``A_k`` is broadcast over its segment
``(previous turn position, this turn position]`` under the mask.

Reference quirks reproduced on purpose (they change numbers):

* group std is the population std of ``var + 1e-8`` (never 0), replaced by 1 for groups with at
  most one value; the normalisation divides by ``std + epsilon``;
* ``raw_ig`` always divides IG by its group std, even with ``norm_by_std=False``, applies
  ``ig_weight`` before adding the trajectory's normalised outcome to each IG position, and forces
  ``gamma = 0`` (adaptive gamma off);
* ``scaled_separate``'s factor uses batch means of absolute *normalised* values, floors the
  outcome side at 0.3 (1.0 when there is none) and caps the factor at 10, with no lower bound;
* positions after the last turn position get advantage 0; a zero normalised reward at a turn
  position still ends a segment;
* the turn recursion runs in double precision and is cast back to the rewards' dtype.

One deliberate difference: ``igpo/all_same_outcome_ratio`` tests the variance without the 1e-8
floor; the reference tests the floored std against 1e-6, which can never be true, so it always
reports 0.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from drvenus.train.rl.config import NORM_MODES, RLConfig

log = logging.getLogger(__name__)

STD_FLOOR = 1e-8  # added to the group variance before the square root
SCALE_OUTCOME_FLOOR = 0.3  # scaled_separate: floor of mean |normalised outcome|
SCALE_MAX = 10.0  # scaled_separate: cap of the IG rescaling factor


@dataclass
class _Groups:
    index: torch.Tensor  # (bsz,) group number of each row
    count: int


def _groups(group_ids: Any, device: torch.device) -> _Groups:
    """Rows with equal ids form a group (numbered like ``np.unique(..., return_inverse=True)``)."""
    if isinstance(group_ids, torch.Tensor):
        group_ids = group_ids.detach().cpu().numpy()
    uniq, inverse = np.unique(np.asarray(group_ids), return_inverse=True)
    index = torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device)
    return _Groups(index=index, count=len(uniq))


def position_masks(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(outcome mask, IG mask): the last masked position of each row, and every other masked
    position holding a nonzero reward (the reference's ``f1_mask`` / ``ig_mask``)."""
    valid = response_mask == 1
    seq_len = valid.shape[1]
    positions = torch.arange(seq_len, device=valid.device).expand_as(valid)
    last = torch.where(valid, positions, torch.full_like(positions, -1)).max(dim=1).values
    outcome = (positions == last.unsqueeze(1)) & valid
    ig = valid & ~outcome & (token_level_rewards != 0)
    return outcome, ig


def group_stats(
    values: torch.Tensor, mask: torch.Tensor, groups: _Groups
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group (mean, std, count) of ``values[mask]`` with the reference's std rules."""
    n = groups.count
    row_group = groups.index.unsqueeze(1).expand_as(mask)[mask]
    picked = values[mask]
    dtype = values.dtype
    count = torch.zeros(n, dtype=dtype, device=values.device).index_add_(
        0, row_group, torch.ones_like(picked)
    )
    total = torch.zeros(n, dtype=dtype, device=values.device).index_add_(0, row_group, picked)
    mean = total / count.clamp(min=1.0)
    sq = (picked - mean[row_group]) ** 2
    var = torch.zeros(n, dtype=dtype, device=values.device).index_add_(0, row_group, sq)
    var = var / count.clamp(min=1.0)
    std = torch.sqrt(var + STD_FLOOR)
    std = torch.where(count <= 1, torch.ones_like(std), std)
    return mean, std, count


def _normalise(
    values: torch.Tensor,
    mask: torch.Tensor,
    groups: _Groups,
    *,
    centre: bool,
    scale: bool,
    epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values - group mean) / (group std + epsilon)`` over the whole tensor (the caller keeps
    the masked positions), and the per-group std."""
    mean, std, _ = group_stats(values, mask, groups)
    out = values - mean[groups.index].unsqueeze(1) if centre else values
    if scale:
        out = out / (std[groups.index].unsqueeze(1) + epsilon)
    return out, std


def _masked_abs_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if not bool(mask.any()):
        return torch.tensor(1.0, dtype=values.dtype, device=values.device)
    return values[mask].abs().mean()


def _normalised_rewards(
    rewards: torch.Tensor,
    outcome: torch.Tensor,
    ig: torch.Tensor,
    groups: _Groups,
    *,
    mode: str,
    ig_weight: float,
    norm_by_std: bool,
    epsilon: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Normalised rewards at outcome/IG positions (0 elsewhere) for one norm mode."""
    diag: dict[str, float] = {}
    out = torch.zeros_like(rewards)
    if mode == "joint":
        joint = outcome | ig
        norm, _ = _normalise(rewards, joint, groups, centre=True, scale=norm_by_std,
                             epsilon=epsilon)
        out = torch.where(joint, norm, out)
    else:
        norm_out, _ = _normalise(rewards, outcome, groups, centre=True, scale=norm_by_std,
                                 epsilon=epsilon)
        out = torch.where(outcome, norm_out, out)
        if mode == "raw_ig":
            norm_ig, _ = _normalise(rewards, ig, groups, centre=False, scale=True, epsilon=epsilon)
            norm_ig = norm_ig * ig_weight
            out = torch.where(ig, norm_ig, out)
            per_row_outcome = (out * outcome.to(out.dtype)).sum(dim=1, keepdim=True)
            return out + per_row_outcome * ig.to(out.dtype), diag
        norm_ig, _ = _normalise(rewards, ig, groups, centre=True, scale=norm_by_std,
                                epsilon=epsilon)
        if mode == "scaled_separate":
            outcome_abs = _masked_abs_mean(out, outcome).clamp(min=SCALE_OUTCOME_FLOOR)
            ig_abs = _masked_abs_mean(norm_ig, ig)
            factor = (outcome_abs / (ig_abs + epsilon)).clamp(max=SCALE_MAX)
            diag = {
                "igpo/ig_scale": float(factor),
                "igpo/outcome_norm_abs_mean": float(outcome_abs),
                "igpo/ig_norm_abs_mean": float(ig_abs),
            }
            norm_ig = norm_ig * factor
        out = torch.where(ig, norm_ig, out)
    if ig_weight != 1.0:
        out = torch.where(ig, out * ig_weight, out)
    return out, diag


def turn_advantages(
    normalised: torch.Tensor,
    response_mask: torch.Tensor,
    turn_mask: torch.Tensor,
    gamma: float,
    adaptive_gamma_min_weight: float = 0.0,
) -> tuple[torch.Tensor, list[float], list[int]]:
    """Discounted turn returns broadcast over their segments (the reference's
    ``_compute_turn_level_advantage``), plus each non-empty row's gamma and turn count.

    ``adaptive_gamma_min_weight > 0`` gives a row with ``k > 1`` turns the gamma
    ``min_weight ** (1 / k)``."""
    bsz, _ = normalised.shape
    counts = turn_mask.sum(dim=1).tolist()
    max_turns = int(max(counts, default=0))
    gammas = [
        adaptive_gamma_min_weight ** (1.0 / k) if adaptive_gamma_min_weight > 0 and k > 1 else gamma
        for k in counts
    ]
    # rewards at turn positions, left-aligned per row, padded with zeros (exact: pads add 0)
    slot = torch.cumsum(turn_mask.to(torch.long), dim=1) - turn_mask.to(torch.long)
    table = torch.zeros(bsz, max_turns + 1, dtype=torch.float64, device=normalised.device)
    rows = torch.arange(bsz, device=normalised.device).unsqueeze(1).expand_as(turn_mask)
    table[rows[turn_mask], slot[turn_mask]] = normalised[turn_mask].to(torch.float64)
    g = torch.tensor(gammas, dtype=torch.float64, device=normalised.device)
    for k in range(max_turns - 1, -1, -1):  # column max_turns stays 0
        table[:, k] = table[:, k] + g * table[:, k + 1]
    adv = table.gather(1, slot).to(normalised.dtype) * response_mask.to(normalised.dtype)
    kept = [i for i, k in enumerate(counts) if k > 0]
    return adv, [float(gammas[i]) for i in kept], [int(counts[i]) for i in kept]


def _check_ig_present(
    rewards: torch.Tensor, outcome: torch.Tensor, ig: torch.Tensor
) -> None:
    """The reference's guard: no IG position at all but nonzero non-outcome rewards means the
    IG sits where the mask is 0 (a caller bug) -> RuntimeError; no IG at all -> a warning."""
    if bool(ig.any()):
        return
    stray = int(((rewards != 0) & ~outcome).sum())
    if stray > 0:
        raise RuntimeError(
            f"igpo: {stray} nonzero IG rewards lie where response_mask is 0; the advantage would "
            "degrade to plain GRPO (build the mask to cover every turn-end position)"
        )
    log.warning("igpo: no IG positions in this batch (bsz=%d): plain GRPO", rewards.shape[0])


def igpo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: Sequence[Any] | np.ndarray | torch.Tensor,
    *,
    norm_mode: str | None = None,
    gamma: float | None = None,
    ig_weight: float | None = None,
    norm_by_std: bool | None = None,
    epsilon: float = 1e-6,
    adaptive_gamma_min_weight: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantages (bsz, seq_len) and ``igpo/*`` diagnostics, following DR-Venus's
    ``grpo_info_gain`` estimator (see the module docstring for the layout and quirks).

    ``group_ids``: one id per row (any hashable numpy-sortable values). ``norm_mode``: joint
    (outcome and IG pooled), separate, scaled_separate (IG rescaled to the outcome's
    magnitude) or raw_ig. ``ig_weight`` multiplies IG after normalisation. ``norm_mode``,
    ``gamma``, ``ig_weight``, ``norm_by_std`` not given: :class:`RLConfig`'s."""
    d = RLConfig()
    norm_mode = d.norm_mode if norm_mode is None else norm_mode
    gamma = d.gamma if gamma is None else gamma
    ig_weight = d.ig_weight if ig_weight is None else ig_weight
    norm_by_std = d.norm_by_std if norm_by_std is None else norm_by_std
    if norm_mode not in NORM_MODES:
        raise ValueError(f"norm_mode={norm_mode!r}: expected one of {NORM_MODES}")
    if token_level_rewards.dim() != 2 or token_level_rewards.shape != response_mask.shape:
        raise ValueError("token_level_rewards and response_mask must both be (bsz, seq_len)")
    rewards = token_level_rewards.detach()
    groups = _groups(group_ids, rewards.device)
    if groups.index.numel() != rewards.shape[0]:
        raise ValueError(f"{groups.index.numel()} group ids for {rewards.shape[0]} rows")
    with torch.no_grad():
        outcome, ig = position_masks(rewards, response_mask)
        normalised, scale_diag = _normalised_rewards(
            rewards, outcome, ig, groups, mode=norm_mode, ig_weight=ig_weight,
            norm_by_std=norm_by_std, epsilon=epsilon,
        )
        _check_ig_present(rewards, outcome, ig)
        if norm_mode == "raw_ig":
            gamma, adaptive_gamma_min_weight = 0.0, 0.0
        adv, gammas, turns = turn_advantages(
            normalised, response_mask, outcome | ig, gamma, adaptive_gamma_min_weight
        )
        metrics = _diagnostics(rewards, response_mask, outcome, ig, groups, adv, gammas, turns)
    metrics.update(scale_diag)
    return adv, metrics


def _all_same_outcome_ratio(rewards: torch.Tensor, outcome: torch.Tensor, groups: _Groups) -> float:
    """Share of groups with more than one outcome whose outcomes are all equal."""
    mean, _, count = group_stats(rewards, outcome, groups)
    row_group = groups.index.unsqueeze(1).expand_as(outcome)[outcome]
    sq = (rewards[outcome] - mean[row_group]) ** 2
    var = torch.zeros_like(count).index_add_(0, row_group, sq) / count.clamp(min=1.0)
    multi = count > 1
    return int((multi & (var < 1e-12)).sum()) / max(int(multi.sum()), 1)


def _diagnostics(
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    outcome: torch.Tensor,
    ig: torch.Tensor,
    groups: _Groups,
    adv: torch.Tensor,
    gammas: list[float],
    turns: list[int],
) -> dict[str, float]:
    """The reference's ``igpo/*`` metrics (see the module docstring for the one fix)."""
    bsz = rewards.shape[0]
    active = int(ig.any(dim=1).sum())
    m: dict[str, float] = {
        "igpo/ig_active_samples": active,
        "igpo/ig_active_ratio": active / max(bsz, 1),
        "igpo/ig_total_positions": int(ig.sum()),
        "igpo/f1_total_positions": int(outcome.sum()),
        "igpo/num_groups": groups.count,
    }
    if bool(ig.any()):
        raw = rewards[ig]
        m["igpo/raw_ig_mean"] = float(raw.mean())
        m["igpo/raw_ig_std"] = float(raw.std()) if raw.numel() > 1 else 0.0
        m["igpo/raw_ig_positive_ratio"] = float((raw > 0).float().mean())
        m["igpo/raw_ig_negative_count"] = int((raw < 0).sum())
        m["igpo/raw_ig_abs_mean"] = float(raw.abs().mean())
        m["igpo/ig_mean_over_std"] = m["igpo/raw_ig_mean"] / max(m["igpo/raw_ig_std"], 1e-8)
    if bool(outcome.any()):
        m["igpo/outcome_reward_mean"] = float(rewards[outcome].mean())
    m["igpo/all_same_outcome_ratio"] = _all_same_outcome_ratio(rewards, outcome, groups)
    if gammas:
        m["igpo/effective_gamma_mean"] = sum(gammas) / len(gammas)
        m["igpo/effective_gamma_min"] = min(gammas)
        m["igpo/effective_gamma_max"] = max(gammas)
        m["igpo/num_turns_mean"] = sum(turns) / len(turns)
        m["igpo/num_turns_min"] = min(turns)
        m["igpo/num_turns_max"] = max(turns)
    live = adv[response_mask == 1]
    if live.numel() > 0:
        m["igpo/adv_abs_mean"] = float(live.abs().mean())
        m["igpo/adv_std"] = float(live.std()) if live.numel() > 1 else 0.0
        m["igpo/adv_positive_ratio"] = float((live > 0).float().mean())
    if bool(ig.any()):
        m["igpo/adv_ig_positions_mean"] = float(adv[ig].mean())
    if bool(outcome.any()):
        m["igpo/adv_f1_positions_mean"] = float(adv[outcome].mean())
    return m
