"""Information-gain scoring (IGPO), following DR-Venus's KV-cache IG path.

At each kept turn boundary (the token offset before an assistant turn, generation header
included) the pseudo answer ``protocol.IG_PSEUDO_ANSWER`` with the ground truth, then the
end-of-turn token, is appended; the boundary's score is the mean log-probability, at the rollout
temperature, of the tokens that overlap the ground-truth characters. The IG of turn k is the score
at boundary k+1 minus the score at the previous kept boundary (boundary 0: the prompt alone).

Reference semantics kept here (DR-Venus ``_compute_async_info_gain``, ``compute_ig_with_kv_cache``):

* ground truth: the first accepted answer, stripped; a JSON list of ``{"label": ...}`` objects
  becomes ``"false"`` if any label is false, else ``"true"``;
* the pseudo answer is tokenised on its own (no special tokens added) and appended to the
  trajectory's token ids; gt tokens = first token ending after the gt start through the last
  token starting before the gt end (offset mapping);
* boundary k >= 1 is kept iff ``k % ig_compute_freq == 0`` and, with a tool filter, turn k-1
  called a tool in the filter (case-insensitive); turns not kept get ``None`` (no reward);
* ``prob_diff`` compares ``exp(mean log-prob)``; a non-finite score or IG gives 0.0 and leaves
  the previous kept score unchanged; a non-finite baseline (or no gt tokens) gives no IG at all.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from drvenus.protocol import ANSWER_SPLIT, IG_PSEUDO_ANSWER
from drvenus.train.rl.config import INFO_GAIN_TYPES, RLConfig
from drvenus.train.rl.rollout import Boundary
from drvenus.train.templates import turn_markers

log = logging.getLogger(__name__)


@dataclass
class IGConfig:
    """The IG knobs of a run, taken from :class:`RLConfig` (:meth:`from_rl`; the defaults
    live there only). ``chunk_size``: trajectory tokens per forward when building the cache."""

    info_gain_type: str
    ig_tool_filter: str | Iterable[str]
    ig_compute_freq: int
    temperature: float
    chunk_size: int

    @classmethod
    def from_rl(cls, config: RLConfig | None = None, **overrides: Any) -> IGConfig:
        """The IG settings of ``config`` (default: RLConfig's defaults), ``overrides`` (field
        names of this class) on top."""
        c = config or RLConfig()
        values: dict[str, Any] = {
            "info_gain_type": c.info_gain_type, "ig_tool_filter": c.ig_tool_filter,
            "ig_compute_freq": c.ig_compute_freq, "temperature": c.temperature,
            "chunk_size": c.ig_chunk_size,
        }
        return cls(**{**values, **overrides})

    def tool_filter(self) -> frozenset[str]:
        """The filter as a lower-case set; empty means every turn is scored."""
        raw = self.ig_tool_filter
        names = raw.split(",") if isinstance(raw, str) else list(raw)
        return frozenset(n.strip().lower() for n in names if n and n.strip())


@dataclass
class IGResult:
    """Per turn k < len(boundaries) - 1: its IG or None; and the raw score of each kept
    boundary (mean gt log-prob; None where not finite)."""

    info_gains: list[float | None]
    scores: dict[int, float | None] = field(default_factory=dict)


def ig_ground_truth(ground_truth: str) -> str:
    """The text scored as the answer (first accepted answer; label lists -> true/false)."""
    text = ground_truth.split(ANSWER_SPLIT)[0].strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError:
            return text
        if isinstance(items, list):
            false = any(
                isinstance(it, dict) and str(it.get("label", "")).lower() == "false"
                for it in items
            )
            return "false" if false else "true"
    return text


def pseudo_answer(
    tokenizer: Any, ground_truth: str, end_of_turn: str | None = None
) -> tuple[list[int], tuple[int, int]]:
    """Token ids of the pseudo answer for ``ground_truth`` and the [start, end) span of its gt
    tokens (empty span: nothing to score). ``end_of_turn``: default the chat template's (ChatML
    ``<|im_end|>``). Needs a fast tokenizer (offset mapping)."""
    gt = ig_ground_truth(ground_truth)
    prefix = IG_PSEUDO_ANSWER.split("{gt}")[0]
    eot = turn_markers(tokenizer).end_of_turn if end_of_turn is None else end_of_turn
    text = IG_PSEUDO_ANSWER.format(gt=gt) + eot
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    lo, hi = len(prefix), len(prefix) + len(gt)
    start = next((i for i, (_, e) in enumerate(offsets) if e > lo), len(ids))
    end = max((i + 1 for i, (s, e) in enumerate(offsets) if s < hi and e > 0), default=len(ids))
    return ids, (start, end)


def kept_boundaries(boundaries: Sequence[Boundary], config: IGConfig) -> list[int]:
    """Indices of the boundaries to score: 0 (baseline) and each k >= 1 passing freq/filter."""
    freq = max(1, int(config.ig_compute_freq))
    tools = config.tool_filter()
    kept = [0] if boundaries else []
    for k in range(1, len(boundaries)):
        if k % freq:
            continue
        prev = (boundaries[k - 1].tool_name or "").lower()
        if tools and prev not in tools:
            continue
        kept.append(k)
    return kept


def info_gains(
    scores: dict[int, float | None], n_turns: int, info_gain_type: str
) -> list[float | None]:
    """IG per turn from boundary scores (see the module docstring for the NaN rules)."""
    if info_gain_type not in INFO_GAIN_TYPES:
        raise ValueError(f"info_gain_type={info_gain_type!r}: expected one of {INFO_GAIN_TYPES}")
    out: list[float | None] = [None] * n_turns
    base = scores.get(0)
    if base is None or not math.isfinite(base):
        return out

    def value(lp: float) -> float:
        return lp if info_gain_type == "log_prob_diff" else math.exp(lp)

    prev = value(base)
    for k in sorted(s for s in scores if 0 < s <= n_turns):
        lp = scores[k]
        if lp is None or not math.isfinite(lp):
            out[k - 1] = 0.0
            continue
        cur = value(lp)
        gain = cur - prev
        if not math.isfinite(gain):
            out[k - 1] = 0.0
            continue
        out[k - 1], prev = gain, cur
    return out


def _mean_gt_logprob(
    logits: torch.Tensor, pseudo: torch.Tensor, span: tuple[int, int], temperature: float
) -> float | None:
    """Mean log-prob of ``pseudo[span]`` given ``logits`` (row i predicts pseudo[i])."""
    lo, hi = span
    logp = torch.log_softmax(logits[lo:hi].float() / temperature, dim=-1)
    mean = logp.gather(1, pseudo[lo:hi].unsqueeze(1)).mean().item()
    return mean if math.isfinite(mean) else None


@torch.no_grad()
def boundary_scores(
    model: Any,
    ids: Sequence[int],
    positions: Sequence[int],
    pseudo: Sequence[int],
    span: tuple[int, int],
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> dict[int, float | None]:
    """Score each boundary (a token offset into ``ids``) with one KV cache: a chunked forward
    over ``ids[:max - 1]`` (``chunk_size`` tokens at a time; default RLConfig's
    ``ig_chunk_size``), then, from the largest boundary down, crop the cache to ``b - 1`` and run
    ``ids[b - 1]`` + pseudo answer on top of it."""
    from transformers import DynamicCache

    chunk_size = chunk_size or RLConfig().ig_chunk_size

    device = next(model.parameters()).device
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(core.forward).parameters
    kw: dict[str, Any] = {"use_cache": True}
    key = "cache" if "cache" in params else "past_key_values"  # the llm.hf quirk
    todo = sorted({b for b in positions if 1 <= b <= len(ids)}, reverse=True)
    scores: dict[int, float | None] = {b: None for b in positions}
    if not todo or span[0] >= span[1]:
        return scores
    cache = DynamicCache(config=core.config)
    prefix = torch.tensor([list(ids[: todo[0] - 1])], dtype=torch.long, device=device)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    for i in range(0, prefix.shape[1], chunk_size):
        model(input_ids=prefix[:, i : i + chunk_size], **kw, **keep, **{key: cache})
    layers = getattr(cache, "layers", ())
    if prefix.shape[1] and not all(getattr(x, "is_croppable", True) for x in layers):
        log.warning("IG: this model's KV cache cannot be cropped; scoring without it")
        return boundary_scores_naive(model, ids, positions, pseudo, span, temperature=temperature)
    tail = torch.tensor(list(pseudo), dtype=torch.long, device=device)
    for b in todo:
        if b == 1:
            cache = DynamicCache(config=core.config)
        elif cache.get_seq_length() > b - 1:  # transformers 5: crop(-n) drops the last n
            cache.crop(b - 1 - cache.get_seq_length())
        step = torch.cat([torch.tensor([ids[b - 1]], device=device), tail]).unsqueeze(0)
        logits = model(input_ids=step, **kw, **{key: cache}).logits[0, :-1]
        scores[b] = _mean_gt_logprob(logits, tail, span, temperature)
    return scores


@torch.no_grad()
def boundary_scores_naive(
    model: Any,
    ids: Sequence[int],
    positions: Sequence[int],
    pseudo: Sequence[int],
    span: tuple[int, int],
    *,
    temperature: float = 1.0,
) -> dict[int, float | None]:
    """Test oracle for :func:`boundary_scores`: one full forward of prefix + pseudo answer per
    boundary, no cache."""
    device = next(model.parameters()).device
    tail = torch.tensor(list(pseudo), dtype=torch.long, device=device)
    scores: dict[int, float | None] = {}
    for b in positions:
        if not 1 <= b <= len(ids) or span[0] >= span[1]:
            scores[b] = None
            continue
        full = torch.cat([torch.tensor(list(ids[:b]), device=device), tail]).unsqueeze(0)
        logits = model(input_ids=full, use_cache=False).logits[0, b - 1 : -1]
        scores[b] = _mean_gt_logprob(logits, tail, span, temperature)
    return scores


def score_trajectory(
    model: Any,
    tokenizer: Any,
    ids: Sequence[int],
    boundaries: Sequence[Boundary],
    ground_truth: str,
    config: IGConfig | None = None,
    *,
    naive: bool = False,
) -> IGResult:
    """IG of each non-final turn of one trajectory (``ids``: every token the policy saw and
    generated; ``boundaries``: one per assistant turn, the final answer turn included)."""
    config = config or IGConfig.from_rl()
    pseudo, span = pseudo_answer(tokenizer, ground_truth)
    kept = kept_boundaries(boundaries, config)
    # the reference clamps offsets to be non-decreasing and within the trajectory
    offsets, prev = [], 0
    for b in boundaries:
        prev = min(max(int(b.token_len), prev), len(ids))
        offsets.append(prev)
    wanted = [offsets[k] for k in kept]
    if naive:
        by_pos = boundary_scores_naive(model, ids, wanted, pseudo, span,
                                       temperature=config.temperature)
    else:
        by_pos = boundary_scores(model, ids, wanted, pseudo, span,
                                 temperature=config.temperature, chunk_size=config.chunk_size)
    scores = {k: by_pos[offsets[k]] for k in kept}
    gains = info_gains(scores, max(len(boundaries) - 1, 0), config.info_gain_type)
    log.debug("IG: %d turns, %d scored, gains %s", len(boundaries) - 1, len(kept) - 1, gains)
    return IGResult(info_gains=gains, scores=scores)


async def score_trajectory_remote(
    prompt_logprobs: Callable[[list[int]], Awaitable[Sequence[float | None]]],
    tokenizer: Any,
    ids: Sequence[int],
    boundaries: Sequence[Boundary],
    ground_truth: str,
    config: IGConfig | None = None,
) -> IGResult:
    """:func:`score_trajectory` from a serving engine's prompt log-probabilities
    (``prompt_logprobs(ids)`` -> the log-prob of each token given the ones before it; vLLM's
    ``prompt_logprobs``, SGLang's ``input_token_logprobs``). Servers report untempered
    log-probs, so this needs temperature 1.0."""
    config = config or IGConfig.from_rl()
    if config.temperature != 1.0:
        raise ValueError("IG from the serving engine needs temperature 1.0 (servers report "
                         "log-probs before temperature); use the trainer's IG")
    pseudo, (lo, hi) = pseudo_answer(tokenizer, ground_truth)
    kept = kept_boundaries(boundaries, config)
    offsets, prev = [], 0
    for b in boundaries:
        prev = min(max(int(b.token_len), prev), len(ids))
        offsets.append(prev)
    scores: dict[int, float | None] = {}
    for k in kept:
        b = offsets[k]
        lps = await prompt_logprobs(list(ids[:b]) + pseudo)
        picked = [lps[b + i] for i in range(lo, hi)]
        vals = [float(x) for x in picked if x is not None]
        mean = sum(vals) / len(vals) if vals and len(vals) == len(picked) else math.nan
        scores[k] = mean if math.isfinite(mean) else None
    gains = info_gains(scores, max(len(boundaries) - 1, 0), config.info_gain_type)
    return IGResult(info_gains=gains, scores=scores)
