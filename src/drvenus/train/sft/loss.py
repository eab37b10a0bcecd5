"""The SFT loss: next-token cross-entropy on the trained tokens, averaged over a global batch.

Per token: the cross-entropy (in fp32) of target ``t + 1`` given the logits at ``t``, where the
target's label is not -100. ``loss_aggregation`` decides how one optimizer step (all micro
batches of the gradient accumulation, all processes) averages them:

* ``row-mean`` (the default): the mean over the rows of each row's mean token loss,
  ``L = (1/R) sum_r (1/n_r) sum_{t in r} l_t`` (``R`` rows with at least one trained token,
  ``n_r`` trained tokens of row ``r``). A packed sequence counts as its rows. This is what
  verl's FSDP SFT trainer computes with DR-Venus's micro batch of one row: every micro batch
  gets the token mean of its own tokens, divided by the number of micro batches of the step,
  and the processes' gradients are averaged (``_compute_loss_and_backward`` and
  ``training_step`` in ``verl/trainer/fsdp_sft_trainer.py``). A short trajectory weighs as much
  as a long one.
* ``token-mean``: every trained token of the global batch weighs the same,
  ``L = sum_t l_t / N`` (transformers' Trainer does this with ``num_items_in_batch``). Long
  trajectories weigh more.

With gradient accumulation over processes, a micro batch contributes its sum (of row means, or
of token losses) divided by the step's global count (``R`` or ``N``, counted over every micro
batch of the step and summed over the processes before the first forward), times the number of
processes (DDP, FSDP and DeepSpeed average the processes' gradients). Evaluation batches are
averaged on their own (:func:`batch_loss`).

Torch is imported inside the functions.
"""

from __future__ import annotations

from typing import Any

from drvenus.train.sft.config import LossAggregation
from drvenus.train.sft.tokenize import IGNORE_INDEX

AGGREGATIONS: tuple[str, ...] = ("row-mean", "token-mean")


def token_losses(logits: Any, labels: Any) -> tuple[Any, Any]:
    """Per-target cross-entropy ``[B, T-1]`` (fp32, 0 where untrained) and the trained mask
    (``labels[:, 1:] != -100``) of ``logits [B, T, V]`` against ``labels [B, T]``."""
    import torch.nn.functional as F

    targets = labels[:, 1:]
    shifted = logits[:, :-1].float()
    losses = F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), targets.reshape(-1),
                             ignore_index=IGNORE_INDEX, reduction="none")
    return losses.view(targets.shape), targets != IGNORE_INDEX


def _target_rows(row_index: Any, mask: Any) -> Any:
    """The row of each target (``row_index`` shifted by one); one row per batch row when the
    batch has no ``row_index``."""
    import torch

    if row_index is None:
        batch, width = mask.shape
        return torch.arange(batch, device=mask.device)[:, None].expand(batch, width)
    return row_index[:, 1:].to(mask.device)


def aggregate(losses: Any, mask: Any, row_index: Any, mode: LossAggregation) -> tuple[Any, Any]:
    """``(total, items)`` of one micro batch: ``token-mean``: the sum of the trained tokens'
    losses and their number; ``row-mean``: the sum of each row's mean token loss and the number
    of rows with a trained token. ``total / items`` is the micro batch's own mean."""
    import torch

    if mode not in AGGREGATIONS:
        raise ValueError(f"loss aggregation {mode!r}: choose one of {', '.join(AGGREGATIONS)}")
    zero = (losses * 0).sum()  # keeps the graph when nothing is trained
    if mode == "token-mean":
        return zero + (losses * mask).sum(), mask.sum()
    rows = _target_rows(row_index, mask)
    keep = mask & (rows >= 0)
    ids, values = rows[keep], losses[keep]
    if ids.numel() == 0:
        return zero, torch.zeros((), dtype=torch.long, device=mask.device)
    size = int(ids.max()) + 1
    sums = torch.zeros(size, dtype=values.dtype, device=values.device).index_add(0, ids, values)
    counts = torch.bincount(ids, minlength=size)
    has = counts > 0
    return zero + (sums[has] / counts[has]).sum(), has.sum()


def count_items(labels: Any, row_index: Any, mode: LossAggregation) -> Any:
    """What :func:`aggregate` counts for a micro batch (trained targets, or rows with one),
    without a forward pass: the global normaliser sums it over the step's micro batches."""
    import torch

    mask = labels[:, 1:] != IGNORE_INDEX
    if mode == "token-mean":
        return mask.sum()
    rows = _target_rows(row_index, mask)
    found = torch.unique(rows[mask & (rows >= 0)]).numel()
    return torch.tensor(found, dtype=torch.long, device=mask.device)


def step_loss(total: Any, global_items: Any, processes: int) -> Any:
    """A micro batch's share of the step's loss (see the module doc): its ``total`` over the
    step's ``global_items`` (all processes), times ``processes``, whose gradients are averaged."""
    import torch

    items = torch.as_tensor(global_items, device=total.device).clamp(min=1)
    return total / items * processes


def batch_loss(total: Any, items: Any) -> Any:
    """The mean of one batch alone (evaluation)."""
    return total / items.clamp(min=1)


__all__ = ["AGGREGATIONS", "aggregate", "batch_loss", "count_items", "step_loss", "token_losses"]
