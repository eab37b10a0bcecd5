"""Data conversion between drvenus rollouts and verl batches (pure Python, no verl import).

* :func:`agent_loop_fields`: a token record as verl's ``AgentLoopOutput`` fields: prompt ids,
  response ids (sampled turns and tool responses), response mask (1 on sampled tokens), and in
  ``extra_fields`` the per-turn data the reward manager needs (response-relative boundaries,
  tool names, turn texts), which verl carries in ``non_tensor_batch``.
* :func:`ig_rows`: the IG requests of one trajectory: for each kept boundary, the prefix
  ``ids[:b]`` and the pseudo answer appended after it; the actor's log-probs of those tails give
  the boundary scores (:func:`ig_scores`).
* :func:`reward_rows`: the token-level rewards of a batch (IG or penalties at turn ends, the
  outcome at the last valid response token), as :mod:`drvenus.train.rl.batch` builds them.
* :func:`reward_config`, :func:`advantage_knobs`, :func:`agent_rollout`: the settings of the
  reward manager, the advantage estimator and the agent loop from what verl passes them, every
  value verl does not pass taken from :class:`~drvenus.train.rl.config.RLConfig` (no defaults
  of their own).
* :data:`TURN_CAP`: the sampling key that carries the per-turn cap to our capped rollout
  servers (:mod:`.servers`).
* Trace events: the trainer tells each row its training step (:data:`STEP_KEY`, a batch
  column); on a step :func:`traces_step` picks, the agent loop returns the trajectory's events
  in :data:`EXTRA_EVENTS` and the trainer writes them (:mod:`.main`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from drvenus.llm.base import SamplingParams
from drvenus.train.rl.collect import RolloutConfig, traced_step
from drvenus.train.rl.config import RLConfig
from drvenus.train.rl.ig import IGConfig, info_gains, kept_boundaries
from drvenus.train.rl.rewards import apply_format_penalty, reward_row
from drvenus.train.rl.rollout import Boundary, RolloutRecord

TURN_CAP = "drvenus_max_tokens"  # new tokens per turn, read by our rollout servers
EXTRA_BOUNDARIES = "igpo_boundaries"
EXTRA_TOOLS = "igpo_tools"
EXTRA_TURNS = "igpo_turns"
EXTRA_EVENTS = "drvenus_events"  # a traced trajectory's trace events (dicts)
STEP_KEY = "drvenus_step"  # the training step of a row, added by our trainer (not validation)
# the reward manager's ``reward_kwargs`` (RLConfig field names) and their types
REWARD_KWARGS: dict[str, Callable[[Any], Any]] = {
    "protocol": str, "reward_type": str, "judge_url": str, "judge_model": str,
    "judge_concurrency": int,
    "use_info_gain": bool,
    "info_gain_type": str, "ig_tool_filter": str, "ig_compute_freq": int,
    "use_format_penalty": bool, "format_penalty_scale": float,
}
# agent-loop config keys -> RLConfig fields (what the launcher writes, see :mod:`.launch`)
AGENT_LOOP_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "protocol": ("protocol", str), "max_turns": ("max_turns", int),
    "max_turns_jitter": ("max_turns_jitter", int), "mode": ("rollout_mode", str),
    "robust_max_retries": ("robust_max_retries", int), "current_date": ("current_date", str),
    "max_response_len": ("max_response_len", int), "tool_timeout": ("tool_timeout", float),
    "completion_cutoff": ("completion_cutoff", float),
    "context_strategy": ("context_strategy", str), "keep_last": ("keep_last", int),
    "system_prompt_file": ("system_prompt_file", str),
    "trace_save_interval": ("trace_save_interval", int),
}


def reward_config(reward_kwargs: Mapping[str, Any]) -> RLConfig:
    """The reward manager's settings: RLConfig's defaults with ``reward_kwargs`` on top."""
    given = {k: cast(reward_kwargs[k]) for k, cast in REWARD_KWARGS.items()
             if reward_kwargs.get(k) is not None}
    return replace(RLConfig(), **given)


def advantage_knobs(config: Any) -> dict[str, Any]:
    """``igpo_advantages`` keywords from verl's ``algorithm`` config (RLConfig's defaults for
    keys it lacks)."""
    d = RLConfig()
    get = config.get if config is not None else (lambda k, default=None: default)
    return {
        "norm_mode": get("igpo_norm_mode", d.norm_mode),
        "gamma": float(get("gamma", d.gamma)),
        "ig_weight": float(get("igpo_ig_weight", d.ig_weight)),
        "norm_by_std": bool(get("norm_adv_by_std_in_grpo", d.norm_by_std)),
    }


def agent_rollout(settings: Mapping[str, Any], *, max_model_len: int, temperature: float,
                  top_p: float, top_k: Any = None) -> RolloutConfig:
    """The rollout settings of one verl agent-loop sample: the agent-loop config entry
    (``settings``) and verl's rollout config, RLConfig's defaults for the rest; one trajectory,
    no seed (verl samples; each trajectory draws its own turn limit)."""
    given = {field: cast(settings[key]) for key, (field, cast) in AGENT_LOOP_KEYS.items()
             if settings.get(key) is not None}
    rl = replace(RLConfig(), max_model_len=int(max_model_len), temperature=float(temperature),
                 top_p=float(top_p), **given)
    if top_k is not None:
        rl = replace(rl, top_k=int(top_k))
    return RolloutConfig.from_rl(rl, n=1, seed=None)


def traces_step(settings: Mapping[str, Any], step: Any) -> bool:
    """Whether a row of training step ``step`` (None: not a training row) keeps its trace
    events: every ``trace_save_interval`` steps of the agent-loop config (RLConfig's default
    when it has none), as the one-machine trainer does."""
    if step is None:
        return False
    interval = settings.get("trace_save_interval")
    every = RLConfig().trace_save_interval if interval is None else int(interval)
    return traced_step(every, int(step))


def server_sampling(params: SamplingParams) -> dict[str, Any]:
    """The sampling parameters our agent loop sends verl's server manager: the policy's
    sampling, stop strings kept out of the text, and the per-turn cap as :data:`TURN_CAP`
    (verl's own servers size ``max_tokens`` themselves; ours cap it, :mod:`.servers`)."""
    out: dict[str, Any] = {"temperature": params.temperature, "top_p": params.top_p,
                           "top_k": params.top_k, "stop": list(params.stop),
                           "include_stop_str_in_output": False}
    if params.max_tokens is not None:
        out[TURN_CAP] = int(params.max_tokens)
    return out


def agent_loop_fields(record: RolloutRecord) -> dict[str, Any]:
    """Keyword arguments for verl's ``AgentLoopOutput`` (metrics excepted)."""
    p = record.prompt_len
    return {
        "prompt_ids": list(record.input_ids[:p]),
        "response_ids": list(record.input_ids[p:]),
        "response_mask": list(record.loss_mask[p:]),
        "num_turns": 2 * len(record.turns),
        "extra_fields": {
            EXTRA_BOUNDARIES: [b.token_len - p for b in record.boundaries],
            EXTRA_TOOLS: [b.tool_name or "" for b in record.boundaries],
            EXTRA_TURNS: list(record.turns),
        },
    }


def question_of(raw_prompt: Any) -> str:
    """The question of an RL row's prompt (its last user message; a string as it is)."""
    if isinstance(raw_prompt, str):
        return raw_prompt
    for m in reversed(list(raw_prompt) if raw_prompt is not None else []):
        if isinstance(m, Mapping) and m.get("role") == "user":
            return str(m.get("content", ""))
    raise ValueError("the row's prompt has no user message")


def boundaries_from_extra(extra: Mapping[str, Any], prompt_len: int) -> list[Boundary]:
    """Absolute boundaries from the extra fields of one sample (prompt length unpadded)."""
    raw_starts, raw_tools = extra.get(EXTRA_BOUNDARIES), extra.get(EXTRA_TOOLS)
    starts = [] if raw_starts is None else list(raw_starts)
    tools = [""] * len(starts) if raw_tools is None else list(raw_tools)
    return [Boundary(prompt_len + int(s), t or None) for s, t in zip(starts, tools, strict=False)]


@dataclass(frozen=True)
class IGRow:
    """One IG request: sample ``sample``'s boundary ``turn`` (index into its boundaries)."""

    sample: int
    turn: int
    prefix: list[int]
    tail: list[int]
    span: tuple[int, int]  # ground-truth tokens within ``tail``


def ig_rows(sample: int, ids: Sequence[int], boundaries: Sequence[Boundary], pseudo: Sequence[int],
            span: tuple[int, int], config: IGConfig) -> list[IGRow]:
    """The IG requests of one trajectory (its kept boundaries, see :mod:`..ig`)."""
    rows = []
    prev = 0
    offsets = []
    for b in boundaries:
        prev = min(max(int(b.token_len), prev), len(ids))
        offsets.append(prev)
    for k in kept_boundaries(boundaries, config):
        rows.append(IGRow(sample, k, list(ids[: offsets[k]]), list(pseudo), span))
    return rows


def ig_scores(rows: Sequence[IGRow], tail_logprobs: Sequence[Sequence[float]]
              ) -> dict[int, dict[int, float | None]]:
    """Per sample, the score of each kept boundary: the mean log-prob of its ground-truth
    tokens (None when not finite)."""
    out: dict[int, dict[int, float | None]] = {}
    for row, lps in zip(rows, tail_logprobs, strict=True):
        lo, hi = row.span
        picked = [float(x) for x in lps[lo:hi]]
        value = sum(picked) / len(picked) if picked else math.nan
        out.setdefault(row.sample, {})[row.turn] = value if math.isfinite(value) else None
    return out


def sample_gains(scores: Mapping[int, float | None], n_turns: int, info_gain_type: str
                 ) -> list[float | None]:
    """IG per non-final turn from the kept boundary scores."""
    return info_gains(dict(scores), max(n_turns - 1, 0), info_gain_type)


def reward_rows(lengths: Sequence[int], turn_ends: Sequence[Sequence[int]],
                gains: Sequence[Sequence[float | None]], turns: Sequence[Sequence[str]],
                outcomes: Sequence[float], penalty_scale: float | None) -> list[list[float]]:
    """Token rewards per sample (response-relative, ``lengths[i]`` valid tokens)."""
    rows = []
    for n, ends, g, t, o in zip(lengths, turn_ends, gains, turns, outcomes, strict=True):
        rewarded, answer_penalty = list(g), None
        if penalty_scale is not None:
            rewarded, answer_penalty = apply_format_penalty(g, t, penalty_scale)
        rows.append(reward_row(n, ends, rewarded, o, answer_penalty))
    return rows


__all__ = [
    "AGENT_LOOP_KEYS", "EXTRA_BOUNDARIES", "EXTRA_EVENTS", "EXTRA_TOOLS", "EXTRA_TURNS", "IGRow",
    "REWARD_KWARGS", "STEP_KEY", "TURN_CAP", "advantage_knobs", "agent_loop_fields",
    "agent_rollout", "boundaries_from_extra", "ig_rows", "ig_scores", "question_of",
    "reward_config", "reward_rows", "sample_gains", "server_sampling", "traces_step",
]
