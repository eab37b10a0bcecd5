"""IGPO policy update: PPO clipped objective plus a low-variance KL loss to a frozen reference.

Semantics follow DR-Venus's verl actor (``compute_policy_loss_vanilla``, ``kl_penalty`` and
``agg_loss`` with ``loss_agg_mode="token-mean"``), rewritten here:

* ``ratio = exp(clamp(logp - old_logp, -20, 20))``; per token
  ``max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))``; for ``A < 0`` that value
  is further capped at ``-A * clip_ratio_c`` (dual clip, default 3.0);
* "token-mean" = ``sum(loss * mask) / (sum(mask) + 1e-8)`` over the whole batch, so every
  unmasked token weighs the same whatever its trajectory's length; tool-response tokens have
  mask 0 and contribute nothing;
* KL loss ``low_var_kl`` (k3): with ``d = clamp(ref - logp, -20, 20)``,
  ``kl = clamp(exp(d) - d - 1, -10, 10)``, token-mean aggregated with the same mask and added
  as ``kl_coef * kl`` (DR-Venus: 0.001);
* entropy bonus: ``- entropy_coef * H``, ``H`` the token-mean (same mask) of the per-token
  entropy of the tempered distribution; off (coefficient 0) by default, ``H`` still logged;
* log-probabilities come from ``logits / temperature`` (the rollout temperature).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from drvenus.train.rl.config import RLConfig

log = logging.getLogger(__name__)

KL_TYPES = ("low_var_kl", "k3", "kl", "k1", "mse", "k2", "abs")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean of ``values`` over ``mask`` (the reference's ``+ 1e-8`` denominator)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / (mask.sum() + 1e-8)


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token KL estimate of the policy against the reference (k1, k2, abs or k3)."""
    if kl_type in ("kl", "k1"):
        return logprobs - ref_logprobs
    if kl_type == "abs":
        return (logprobs - ref_logprobs).abs()
    if kl_type in ("mse", "k2"):
        return 0.5 * (logprobs - ref_logprobs).square()
    if kl_type in ("low_var_kl", "k3"):
        delta = torch.clamp(ref_logprobs - logprobs, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(delta) - delta - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"unknown kl_type {kl_type!r}; expected one of {KL_TYPES}")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip: float | None = None,
    clip_low: float | None = None,
    clip_high: float | None = None,
    clip_ratio_c: float | None = None,
    kl_coef: float | None = None,
    kl_type: str | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped loss (token-mean over ``loss_mask``) plus ``kl_coef`` times the KL loss.

    All tensors share one shape (e.g. batch x response length). ``ref_logprobs=None`` or
    ``kl_coef=0`` drops the KL term. ``entropy`` (per token) is reported, and subtracted times
    ``entropy_coef`` when that is nonzero. Returns the scalar loss and float metrics. ``clip``
    (``clip_ratio``), ``clip_ratio_c``, ``kl_coef``, ``kl_type``, ``entropy_coef`` not given:
    :class:`RLConfig`'s.
    """
    d = RLConfig()
    clip = d.clip_ratio if clip is None else clip
    clip_ratio_c = d.clip_ratio_c if clip_ratio_c is None else clip_ratio_c
    kl_coef = d.kl_coef if kl_coef is None else kl_coef
    kl_type = d.kl_type if kl_type is None else kl_type
    entropy_coef = d.entropy_coef if entropy_coef is None else entropy_coef
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
    shape = logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("advantages", advantages),
                    ("loss_mask", loss_mask), ("ref_logprobs", ref_logprobs)):
        if t is not None and t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    low = clip if clip_low is None else clip_low
    high = clip if clip_high is None else clip_high
    mask = loss_mask.to(logprobs.dtype)
    advantages = advantages.to(logprobs.dtype)

    log_ratio = torch.clamp(logprobs - old_logprobs.detach(), min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    clipped_max = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    pg_mat = torch.where(negative, torch.minimum(clipped_max, dual_bound), clipped_max)
    pg_loss = masked_mean(pg_mat, mask)
    loss = pg_loss

    metrics: dict[str, float] = {
        "actor/pg_loss": pg_loss.item(),
        "actor/pg_clipfrac": masked_mean((clipped > unclipped).to(mask.dtype), mask).item(),
        "actor/pg_clipfrac_lower": masked_mean(
            ((clipped_max > dual_bound) & negative).to(mask.dtype), mask
        ).item(),
        "actor/ppo_kl": masked_mean(-log_ratio.detach(), mask).item(),
        "actor/ratio_mean": masked_mean(ratio.detach(), mask).item(),
        "actor/loss_tokens": float(mask.sum().item()),
    }
    if entropy is not None:
        entropy_mean = masked_mean(entropy, mask)
        metrics["actor/entropy"] = entropy_mean.item()
        if entropy_coef:
            loss = loss - entropy_coef * entropy_mean
    if ref_logprobs is not None and kl_coef:
        kl_loss = masked_mean(kl_estimate(logprobs, ref_logprobs.detach(), kl_type), mask)
        loss = loss + kl_coef * kl_loss
        metrics["actor/kl_loss"] = kl_loss.item()
        metrics["actor/kl_coef"] = float(kl_coef)
    metrics["actor/loss"] = loss.item()
    return loss, metrics


def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    *,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Next-token log-probs: ``out[:, t] = log p(input_ids[:, t + 1] | input_ids[:, :t + 1])``.

    Shape ``(batch, seq - 1)``; logits are divided by ``temperature`` first (the rollout's).
    With ``with_entropy`` also returns the per-position entropy of that tempered distribution
    (``entropy_grad=False``: computed without a graph, for a metric only). Gradients flow unless
    the caller wraps the call in ``torch.no_grad()``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
        attention_mask = None if attention_mask is None else attention_mask.unsqueeze(0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    logits = logits[:, :-1, :].float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    targets = input_ids[:, 1:].unsqueeze(-1)
    picked = torch.gather(log_probs, -1, targets).squeeze(-1)
    if not with_entropy:
        return picked
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return picked, entropy
