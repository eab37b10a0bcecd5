"""Rollouts for IGPO: n trajectories per question through the agent loop, token-exact.

Each trajectory runs :class:`drvenus.agent.ResearchAgent` (the inference loop, protocol and
tools) on its own :class:`~drvenus.train.rl.recorder.TokenRecorder`, so what the trainer scores
is exactly what the policy saw and sampled. Two modes, as in DR-Venus:

* ``deterministic`` (default): one attempt per step, no retries. A malformed turn gets the
  format-error reply and the run goes on; a repeated tool call is executed again. Reproducible
  with a seed: rollout r of question q at step s samples with its own seed.
* ``robust``: the inference loop's retries (repetition, parse errors, duplicate tool calls),
  ``robust_max_retries + 1`` attempts per step; the discarded samples are not trained on.

DR-Venus also jitters each batch's turn limit by up to +-5 around ``max_turns``
(``max_turns_jitter``). ``protocol dr-venus``: the same loop with DR-Venus's RL hooks
(:mod:`drvenus.train.rl.environment`). Both take inference's context strategies
(``context_strategy``, default ``none``), and a traced step keeps every trajectory's trace
events (:mod:`drvenus.agent.events`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drvenus.agent import AgentConfig, ContextPolicy, ResearchAgent
from drvenus.agent.record import ResultRecord
from drvenus.llm.base import SamplingParams
from drvenus.protocol.dr_venus import reopen_think
from drvenus.protocol.profiles import DEFAULT_PROTOCOL
from drvenus.reference.profiles import profile
from drvenus.train.rl.config import ROLLOUT_MODES, RLConfig
from drvenus.train.rl.engine import TokenEngine
from drvenus.train.rl.environment import (
    CompletionCutoff,
    EnvConfig,
    env_config,
    run_trajectory,
    turn_limit,
)
from drvenus.train.rl.recorder import ChatTemplateParts, TokenRecorder
from drvenus.train.rl.rollout import RolloutRecord

if TYPE_CHECKING:
    from drvenus.reference.dr_venus_rl import RLTexts

log = logging.getLogger(__name__)


def context_budget(max_model_len: int) -> int:
    """Tokens a trajectory may fill before the context-limit notice: DR-Venus leaves 10,000 of
    the window for the answer; small windows keep a quarter free."""
    if max_model_len > 40_000:
        return max_model_len - 10_000
    return max_model_len * 3 // 4


@dataclass(frozen=True)
class RolloutConfig:
    """How trajectories are sampled: built from an :class:`RLConfig` (:meth:`from_rl`; the
    defaults live there only). ``max_context_tokens``: :func:`context_budget` of the model
    length; ``max_new_tokens``: per turn; ``system_prompt``: the text (None: the protocol's).
    ``protocol`` dr-venus: ``texts`` are DR-Venus's RL texts and ``max_model_len``,
    ``tool_timeout`` and ``cutoff`` configure its environment (:meth:`environment`)."""

    n: int
    mode: str
    robust_max_retries: int
    max_turns: int
    max_turns_jitter: int
    max_context_tokens: int
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    time_limit: float
    concurrency: int
    seed: int | None
    system_prompt: str | None
    current_date: str | None
    protocol: str = DEFAULT_PROTOCOL
    texts: RLTexts | None = None
    max_model_len: int = 0
    tool_timeout: float = 0.0
    cutoff: float = 0.0
    context: ContextPolicy = field(default_factory=ContextPolicy)  # as in inference

    @classmethod
    def from_rl(cls, config: RLConfig | None = None, **overrides: Any) -> RolloutConfig:
        """The rollout settings of ``config`` (default: RLConfig's defaults), ``overrides``
        (field names of this class) on top. The system prompt file is read here, once."""
        from drvenus.protocol import load_system_prompt
        from drvenus.records import check_prompt_file

        c = config or RLConfig()
        protocol = overrides.get("protocol") or c.protocol_name()
        values: dict[str, Any] = {
            "n": c.n_rollouts, "mode": c.rollout_mode,
            "robust_max_retries": c.robust_max_retries, "max_turns": c.max_turns,
            "max_turns_jitter": c.max_turns_jitter,
            "max_context_tokens": context_budget(c.max_model_len),
            "max_new_tokens": c.max_response_len, "temperature": c.temperature,
            "top_p": c.top_p, "top_k": c.top_k, "time_limit": c.rollout_time_limit,
            "concurrency": c.rollout_concurrency, "seed": c.seed,
            "current_date": c.current_date, "system_prompt": None, "protocol": protocol,
            "max_model_len": c.max_model_len, "tool_timeout": c.tool_timeout,
            "cutoff": c.completion_cutoff,
            "context": ContextPolicy(c.context_strategy, c.keep_last),  # type: ignore[arg-type]
        }
        if "system_prompt" not in overrides and c.system_prompt_file:
            check_prompt_file(c.system_prompt_file)
            values["system_prompt"] = load_system_prompt(c.system_prompt_file)
        if "texts" not in overrides:
            values["texts"] = profile(protocol).rl_texts()
        return cls(**{**values, **overrides})

    def __post_init__(self) -> None:
        if self.mode not in ROLLOUT_MODES:
            raise ValueError(f"rollout mode {self.mode!r}: expected one of {ROLLOUT_MODES}")
        if self.n < 1 or self.max_turns < 1 or self.concurrency < 1:
            raise ValueError("n, max_turns and concurrency must be at least 1")

    @property
    def attempts(self) -> int:
        return 1 if self.mode == "deterministic" else self.robust_max_retries + 1

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            presence_penalty=0.0, max_tokens=self.max_new_tokens, seed=self.seed,
        )

    def agent_config(self, max_turns: int) -> AgentConfig:
        """The inference loop's settings for a trajectory of ``max_turns`` turns: its tool
        steps and then the forced answer (``max_turns - 1`` steps)."""
        return AgentConfig(
            max_steps=max(0, max_turns - 1),
            max_context_tokens=self.max_context_tokens,
            time_limit=self.time_limit,
            max_attempts=self.attempts,
            backoff_base=0.0,
            max_unreadable_turns=0,  # a malformed turn is the rollout's to keep, not an error
            sampling=self.sampling(),
            constrained=False,
            system_prompt=self.system_prompt,
            current_date=self.current_date,
            context=self.context,
        )

    def environment(self) -> EnvConfig:
        """DR-Venus's RL environment of these settings (protocol dr-venus)."""
        if self.texts is None:
            raise ValueError("protocol dr-venus needs DR-Venus's RL texts")
        return env_config(self.texts, system_prompt=self.system_prompt,
                          current_date=self.current_date, max_model_len=self.max_model_len,
                          max_new_tokens=self.max_new_tokens, sampling=self.sampling(),
                          attempts=self.attempts, tool_timeout=self.tool_timeout,
                          time_limit=self.time_limit, context=self.context)

    def completion_cutoff(self, total: int | None = None) -> CompletionCutoff:
        """The completion cut-off of a batch of ``total`` trajectories (None: waves, verl's
        worker); it never fires without the profile's environment."""
        return CompletionCutoff(self.cutoff if self.texts is not None else None, total=total)

    def turn_limit(self, step: int, group: int = 0, index: int = 0) -> int:
        """The turn limit of trajectory ``index`` of question ``group`` at ``step``:
        ``max_turns`` plus its own seeded jitter (DR-Venus draws it per trajectory); unseeded
        (``seed`` None): a fresh draw."""
        rng = random.Random(f"{self.seed}:{step}:{group}:{index}") if self.seed is not None \
            else random.Random()
        return turn_limit(self.max_turns, self.max_turns_jitter, rng)


@dataclass
class Rollout:
    """One trajectory: its group (question), the agent's result and the token record (None
    when the policy sampled no usable turn)."""

    group: int
    index: int
    question: str
    ground_truth: str
    result: ResultRecord
    tokens: RolloutRecord | None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)  # its trace (when traced)


async def run_rollout(
    config: RolloutConfig, engine: TokenEngine, tools: Any, question: str, *, max_turns: int,
    seed: int | None = None, parts: ChatTemplateParts | None = None,
    cutoff: CompletionCutoff | None = None, prompt: Sequence[Mapping[str, Any]] | None = None,
    on_event: Callable[[Any], None] | None = None,
) -> tuple[TokenRecorder, ResultRecord]:
    """One trajectory, for the one-machine trainer and verl's agent loop alike: the agent loop
    on a fresh :class:`TokenRecorder`, with the profile's RL environment where it has one (its
    RL texts: ``config.texts``; DR-Venus's loop as hooks, :func:`run_trajectory`, with
    ``cutoff`` and the data row's ``prompt``), else with inference's hooks. ``seed``: the
    trajectory's sampling seed."""
    env = config.texts is not None
    recorder = TokenRecorder(engine, parts, rerender_queries=env,
                             segments=config.context.strategy != "none",
                             reopen_think=reopen_think if env else None)
    if env:
        cfg = config.environment()
        cfg = replace(cfg, sampling=replace(cfg.sampling, seed=seed))
        result = await run_trajectory(recorder, tools, cfg, question, max_turns=max_turns,
                                      cutoff=cutoff, prompt=prompt, on_event=on_event)
    else:
        base = config.agent_config(max_turns)
        agent = ResearchAgent(recorder, tools,
                              replace(base, sampling=replace(base.sampling, seed=seed)))
        result = await agent.run(question, on_event)
    return recorder, result


def traced_step(interval: int, step: int) -> bool:
    """Whether training step ``step`` (counted from 1) keeps its rollouts' trace events:
    every ``interval`` steps (``trace_save_interval``; 0: never)."""
    return interval > 0 and step > 0 and step % interval == 0


def trace_file(folder: str | Path, step: int, *, events: bool = False) -> Path:
    """A training step's trace file in ``folder`` (the run's ``traces/``, both trainers):
    ``step-NNNNNN.jsonl``, or with ``events`` its trace events, ``step-NNNNNN.events.jsonl``."""
    return Path(folder) / f"step-{step:06d}{'.events' if events else ''}.jsonl"


def _rollout_seed(base: int | None, step: int, group: int, index: int) -> int | None:
    if base is None:
        return None
    return (base * 1_000_003 + step * 10_007 + group * 101 + index) % (2**31)


async def run_rollouts(
    items: Sequence[tuple[str, str]],
    engine: TokenEngine,
    tools: Any,
    config: RolloutConfig,
    *,
    step: int = 0,
    on_done: Callable[[Rollout], None] | None = None,
    trace: bool = False,
) -> list[Rollout]:
    """``config.n`` trajectories for each ``(question, ground_truth)``, at most
    ``config.concurrency`` at once; ordered by question, then rollout index. ``trace``: keep
    each trajectory's trace events (:mod:`drvenus.agent.events`) in ``Rollout.events``."""
    parts = ChatTemplateParts(engine.tokenizer)
    gate = asyncio.Semaphore(config.concurrency)
    cutoff = config.completion_cutoff(total=len(items) * config.n)

    async def one(group: int, index: int, question: str, gt: str) -> Rollout:
        seed = _rollout_seed(config.seed, step, group, index)
        limit = config.turn_limit(step, group, index)
        events: list[dict[str, Any]] = []
        on_event = (lambda e: events.append(e.to_dict())) if trace else None
        try:
            async with gate:
                recorder, result = await run_rollout(
                    config, engine, tools, question, max_turns=limit, seed=seed, parts=parts,
                    cutoff=cutoff, on_event=on_event)
        finally:
            cutoff.finish()
        tokens = recorder.record(result.messages)
        rollout = Rollout(group, index, question, gt, result, tokens,
                          error=result.error if tokens is None else None, events=events)
        if on_done is not None:
            on_done(rollout)
        return rollout

    jobs = [one(g, i, q, gt) for g, (q, gt) in enumerate(items) for i in range(config.n)]
    return list(await asyncio.gather(*jobs))


__all__ = ["ROLLOUT_MODES", "context_budget", "Rollout", "RolloutConfig", "run_rollout",
           "run_rollouts",
           "trace_file", "traced_step"]
