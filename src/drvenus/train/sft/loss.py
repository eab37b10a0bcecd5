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

Memory: :func:`token_losses` takes the model's logits ``[B, T, V]`` and keeps their fp32
log-probabilities for the backward (20 GB at 32K tokens with Qwen3's 151,936-token vocabulary).
:func:`chunked_token_losses` computes the same per-token losses from the final hidden states
instead: only the positions whose target is trained go through the LM head, a chunk of them at a
time, and each chunk's logits are recomputed in the backward (``torch.utils.checkpoint``), so
memory holds one chunk's logits whatever the length. :func:`forward_hidden` runs the model
(through whatever wraps it: peft, DDP, FSDP, DeepSpeed) with the logits of its last position
only and hands back the final hidden states and the LM head as a callable (:func:`logits_head`:
the output-embedding module itself, so a LoRA adapter on it takes part, then the final logit
transform the model's forward applies: Gemma's soft-capping, Cohere's and Granite's scales).

Torch is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable
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


# --------------------------------------------------------------------------- from hidden states

# What a causal LM's forward does to its LM head's output, by model type (transformers' modeling
# files): (prefix of model_type, config attribute, "mul" or "div"). Soft-capping
# (``final_logit_softcapping``, Gemma and others) is read from any config that sets it.
_LOGIT_SCALES: tuple[tuple[str, str, str], ...] = (
    ("cohere", "logit_scale", "mul"),
    ("granite", "logits_scaling", "div"),
    ("minicpm3", "logits_scaling", "div"),  # divides the hidden states: the same for a linear head
    ("hyperclovax", "logits_scaling", "mul"),
)


def causal_lm(model: Any) -> Any:
    """The transformers causal LM inside ``model`` (a peft model's base model, LoRA layers in
    place; ``model`` itself otherwise). Unwrap DDP / FSDP / DeepSpeed first."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def logits_head(lm: Any) -> Callable[[Any], Any] | None:
    """``hidden [..., H] -> logits [..., V]`` as the causal LM ``lm``'s forward computes them
    from its final hidden states: its output-embedding module, called (a LoRA adapter on the LM
    head takes part; tied embeddings are that module's weight), then the model type's final
    scale and soft-capping. None when ``lm`` has no output embeddings."""
    proj = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    if proj is None:
        return None
    config = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
    kind = str(getattr(config, "model_type", "") or "")
    scales = [(float(getattr(config, name)), op) for prefix, name, op in _LOGIT_SCALES
              if kind.startswith(prefix) and getattr(config, name, None) is not None]
    cap = getattr(config, "final_logit_softcapping", None)

    def head(hidden: Any) -> Any:
        import torch

        logits = proj(hidden)
        for value, op in scales:
            logits = logits * value if op == "mul" else logits / value
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return head


def _autocast(state: tuple[str, Any, bool] | None) -> Any:
    import contextlib

    import torch

    if state is None:
        return contextlib.nullcontext()
    device, dtype, enabled = state
    return torch.autocast(device, dtype=dtype, enabled=enabled)


def _chunk_losses(head: Callable[[Any], Any], states: Any, targets: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(head(states).float(), targets, reduction="none")


def chunked_token_losses(hidden: Any, labels: Any, head: Callable[[Any], Any], chunk_tokens: int,
                         autocast: tuple[str, Any, bool] | None = None) -> tuple[Any, Any]:
    """:func:`token_losses` of the logits ``head(hidden)`` without ever holding them: the final
    hidden states ``hidden [B, T, H]`` of the trained targets' positions (``labels[:, 1:] !=
    -100``; the others are skipped) go through ``head`` ``chunk_tokens`` at a time, each chunk's
    logits recomputed in the backward (``torch.utils.checkpoint``, no graph kept under
    ``torch.no_grad``). Memory: one chunk's logits, not ``[B, T, V]``. ``autocast``:
    ``(device type, dtype, enabled)`` of the model's forward, so that ``head`` runs as it would
    inside it (:func:`forward_hidden`). Returns the losses ``[B, T-1]`` (fp32, 0 where
    untrained, in the graph even when nothing is trained) and the trained mask."""
    import functools

    import torch
    from torch.utils.checkpoint import checkpoint

    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens {chunk_tokens}: give at least 1")
    targets = labels[:, 1:].to(hidden.device)
    mask = targets != IGNORE_INDEX
    states, wanted = hidden[:, :-1][mask], targets[mask]  # [N, H], [N]
    run = functools.partial(_chunk_losses, head)
    keep_graph = torch.is_grad_enabled()
    pieces = []
    with _autocast(autocast):
        for start in range(0, wanted.numel(), chunk_tokens):
            part = (states[start:start + chunk_tokens], wanted[start:start + chunk_tokens])
            pieces.append(checkpoint(run, *part, use_reentrant=False) if keep_graph
                          else run(*part))
    losses = torch.zeros(targets.shape, dtype=torch.float32, device=hidden.device)
    if pieces:
        return losses.masked_scatter(mask, torch.cat(pieces)), mask
    return losses + hidden[..., :1].sum().float() * 0, mask  # nothing trained: still a graph


def _keep_argument(lm: Any) -> str | None:
    """The forward argument that limits the logits to the last positions, under this
    transformers' name (``logits_to_keep``; ``num_logits_to_keep`` before 4.50), or None."""
    import inspect

    try:
        names = inspect.signature(lm.forward).parameters
    except (TypeError, ValueError):
        return None
    return next((n for n in ("logits_to_keep", "num_logits_to_keep") if n in names), None)


def _has_live_dropout(module: Any) -> bool:
    import torch

    return any(isinstance(m, torch.nn.Dropout) and m.training and m.p > 0
               for m in module.modules())


def forward_hidden(model: Any, inputs: dict[str, Any], lm: Any, check: bool = False
                   ) -> tuple[Any, Any, Callable[[Any], Any], tuple[str, Any, bool]] | str:
    """Run ``model(**inputs)`` (``model`` as the Trainer holds it, wrapper and all, so that
    peft, DDP, FSDP and DeepSpeed see their own forward) computing the logits of the last
    position only, and catch the final hidden states on their way to the LM head (a forward
    hook on ``lm``'s decoder; ``lm``: :func:`causal_lm` of the unwrapped model). Returns
    ``(outputs, hidden [B, T, H], head, autocast state of the forward)`` (``head``:
    :func:`logits_head`), or why it cannot (then compute the loss from the full logits).
    ``check``: also compare ``head`` on the last position with the model's own logits there,
    which catches a final transform :func:`logits_head` does not know."""
    import torch

    keep = _keep_argument(lm)
    head = logits_head(lm)
    decoder = lm.get_decoder() if hasattr(lm, "get_decoder") else None
    name = type(lm).__name__
    if keep is None:
        return f"{name}.forward has no logits_to_keep argument"
    if head is None:
        return f"{name} has no output embeddings"
    if decoder is None or decoder is lm:
        return f"{name} has no decoder module of its own"
    seen: dict[str, Any] = {}

    def catch(module: Any, args: Any, output: Any) -> None:
        hidden = getattr(output, "last_hidden_state", None)
        hidden = output[0] if hidden is None else hidden
        device = hidden.device.type
        seen["hidden"] = hidden
        seen["autocast"] = (device, torch.get_autocast_dtype(device),
                            torch.is_autocast_enabled(device))

    handle = decoder.register_forward_hook(catch)
    try:
        outputs = model(**inputs, **{keep: 1})
    finally:
        handle.remove()
    if "hidden" not in seen:
        return f"{type(decoder).__name__} (the decoder) was not called by the forward"
    hidden, state = seen["hidden"], seen["autocast"]
    proj = lm.get_output_embeddings()
    if check and not _has_live_dropout(proj):
        with torch.no_grad(), _autocast(state):
            ours = head(hidden[:, -1:]).float()
        theirs = outputs.logits[:, -1:].detach().float()
        if ours.shape != theirs.shape:
            return f"the LM head gives logits {tuple(ours.shape)}, the model {tuple(theirs.shape)}"
        diff = float((ours - theirs).abs().max())
        if not diff <= 1e-2 * float(theirs.abs().max()) + 1e-4:
            return (f"the LM head on the final hidden states differs from the model's logits "
                    f"(max abs diff {diff:.3g}): {type(lm).__name__} transforms its logits in a "
                    "way drvenus does not know")
    return outputs, hidden, head, state


__all__ = ["AGGREGATIONS", "aggregate", "batch_loss", "causal_lm", "chunked_token_losses",
           "count_items", "forward_hidden", "logits_head", "step_loss", "token_losses"]
