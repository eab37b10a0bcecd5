"""Heavy mode: N research runs of one question in parallel, then one synthesis turn.

The runs share the agent (and so the loaded model's slots, or a server's concurrency); each is
an ordinary run with its own trace events, tagged ``heavy_run`` (0..N-1) so that interleaved
runs split apart again (:func:`drvenus.agent.events.split_runs`). Run 0 samples as a single
run would; the others get their own seeds, and, when the preset decodes greedily (the embedded
model), :data:`MEMBER_TEMPERATURE`: N greedy runs would all be the same run. Then:

- ``synthesise`` (default): the model reads each run's answer, its final reasoning and the
  sources it read (:func:`drvenus.protocol.synthesis_messages`) and writes the final answer in
  one answer turn. Constrained, the turn's state names the original question and the runs'
  answers with what each run read (:class:`~drvenus.protocol.state.RunAnswer`), so that the
  model's grammar can make it choose among those answers (the small agent's does:
  :mod:`drvenus.small.heavy`). If that turn fails (no answer, the model unreachable; under a
  grammar, an answer that is none of the runs' answers), the vote decides.
- ``vote``: a deterministic majority over the normalised answers of the runs that answered
  (:func:`drvenus.grading.match.normalize_answer`); a tie goes to the answer the policy's
  ``scorer`` rates best in its runs' evidence (the small agent's reader), then to the earliest
  run.

The final decision is a run of its own in the trace (``started`` with ``heavy`` set to N and
``heavy_mode`` to ``synthesis`` or ``vote``, then its turn, ``answer`` and ``finished``). Its
record sums the runs' counts and usage, and keeps every run's record under
``extra["heavy"]["runs"]``. Cancelled (Ctrl-C, a stopped server run), it still ends with an
untagged ``finished``: an ``interrupted`` record with the runs that had finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from drvenus import protocol
from drvenus.agent.events import EventCallback, TraceEvent
from drvenus.agent.record import ResultRecord
from drvenus.config import HEAVY_MODES, HeavyModeName
from drvenus.grading.match import normalize_answer
from drvenus.llm.base import ChatModel, LLMError, SamplingParams
from drvenus.protocol.state import RunAnswer, TurnState

# rates each run's answer in the evidence that run read (higher is better): a vote's tie-break
EvidenceScorer = Callable[[str, Sequence[RunAnswer]], list[float]]

# characters of the synthesis prompt per token of the context budget (a safe underestimate)
CHARS_PER_BUDGET_TOKEN = 3
# the temperature of runs 1..N-1 when the preset decodes greedily (temperature 0)
MEMBER_TEMPERATURE = 0.7
# seeds of runs 1..N-1: the preset's seed plus this much per run
MEMBER_SEED_STRIDE = 7919


@dataclass(frozen=True)
class HeavyPolicy:
    """How many runs, and how their answers become one (``scorer``: the vote's tie-break)."""

    runs: int = 1
    mode: HeavyModeName = "synthesise"
    scorer: EvidenceScorer | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ValueError("heavy runs must be 1 or more")
        if self.mode not in HEAVY_MODES:
            raise ValueError(f"unknown heavy mode {self.mode!r}; choose from "
                             + ", ".join(HEAVY_MODES))


class Member(Protocol):
    """What Heavy mode needs of the agent."""

    model: ChatModel

    async def run_one(self, question: str, on_event: EventCallback | None = None,
                      sampling: SamplingParams | None = None) -> ResultRecord: ...


def member_sampling(base: SamplingParams, run: int) -> SamplingParams:
    """The sampling of Heavy mode's run ``run`` (see module doc)."""
    if run == 0:
        return base
    temperature = base.temperature if base.temperature > 0 else MEMBER_TEMPERATURE
    return replace(base, temperature=temperature,
                   seed=(base.seed or 0) + MEMBER_SEED_STRIDE * run)


def candidate_of(record: ResultRecord,
                 parse: Callable[[str], protocol.ParsedTurn] = protocol.parse_turn,
                 ) -> protocol.Candidate:
    """A run's answer, its last reasoning, and the sources it read or searched for; ``parse``:
    the profile's reading of a stored turn (``AgentConfig.reader.parse``)."""
    reasoning, sources = "", []
    for message in record.messages:
        if message["role"] != "assistant":
            continue
        turn = parse(message["content"])
        reasoning = turn.thinking or reasoning
        call = turn.tool_call
        if call is None:
            continue
        if call.name == protocol.VISIT:
            sources += [str(u) for u in call.arguments.get("url") or []]
        else:
            sources += [f"search: {q}" for q in call.arguments.get("query") or []]
    answer = record.prediction if record.answered and record.prediction.strip() else None
    return protocol.Candidate(answer, reasoning, tuple(dict.fromkeys(sources)))


def run_answers(records: Sequence[ResultRecord],
                texts: protocol.TextsLike = protocol.DRVENUS_TEXTS) -> list[RunAnswer]:
    """Each run's answer ("" when it found none) and the texts it read (its notices, in
    ``texts``' words, the profile's, left out)."""
    return [RunAnswer(r.prediction if r.answered and r.prediction.strip() else "",
                      TurnState.of(r.messages, texts).read) for r in records]


def votes(records: Sequence[ResultRecord]) -> Counter[str]:
    return Counter(normalize_answer(r.prediction) for r in records
                   if r.answered and r.prediction.strip())


def majority_vote(records: Sequence[ResultRecord],
                  scores: Sequence[float] | None = None) -> int | None:
    """The index of the run whose answer most runs gave; on a tie, the run whose answer
    ``scores`` (one a run) rates best, then the earliest; None when no run answered."""
    counts = votes(records)
    if not counts:
        return None
    best = max(counts.values())
    tied = [i for i, r in enumerate(records) if r.answered and r.prediction.strip()
            and counts[normalize_answer(r.prediction)] == best]
    if scores is None:
        return tied[0]
    return max(tied, key=lambda i: (scores[i], -i))


class _Emitter:
    def __init__(self, on_event: EventCallback | None) -> None:
        self.on_event = on_event
        self.finished: dict[int, ResultRecord] = {}  # the records of the runs that ended

    async def __call__(self, event: TraceEvent) -> None:
        if self.on_event is not None:
            result = self.on_event(event)
            if inspect.isawaitable(result):
                await result

    def member(self, i: int) -> EventCallback:
        async def forward(event: TraceEvent) -> None:
            if event.type == "finished":
                self.finished[i] = ResultRecord(**event.data["record"])
            await self(TraceEvent(event.type, event.step, {**event.data, "heavy_run": i},
                                  event.time))
        return forward


async def run_heavy(agent: Member, config: Any, question: str,
                    on_event: EventCallback | None = None) -> ResultRecord:
    """``config.heavy.runs`` runs of ``question``, and the final answer (see module doc).
    ``config``: the agent's fitted :class:`~drvenus.agent.loop.AgentConfig`."""
    policy: HeavyPolicy = config.heavy
    emit = _Emitter(on_event)
    start = time.monotonic()
    try:
        records = list(await asyncio.gather(
            *(agent.run_one(question, emit.member(i), member_sampling(config.sampling, i))
              for i in range(policy.runs))
        ))
    except asyncio.CancelledError:
        done = [emit.finished[i] for i in sorted(emit.finished)]
        stopped = _combined(question, [], "No answer found", "interrupted", done, "interrupted")
        stopped.error = "interrupted"
        stopped.elapsed_seconds = round(time.monotonic() - start, 3)
        with contextlib.suppress(asyncio.CancelledError, Exception):  # best effort
            await asyncio.shield(emit(TraceEvent("finished", 0, {"record": stopped.to_dict()})))
        raise
    final: ResultRecord | None = None
    note: str | None = None
    if policy.mode == "synthesise" and votes(records):
        final, note = await _synthesise(agent, config, question, records, emit)
    if final is None:
        scores = (policy.scorer(question, run_answers(records, config.texts))
                  if policy.scorer else None)
        final = await _vote(agent, question, records, emit, note, scores)
    final.elapsed_seconds = round(time.monotonic() - start, 3)
    await emit(TraceEvent("finished", 0, {"record": final.to_dict()}))
    return final


async def _synthesise(
    agent: Member, config: Any, question: str, records: list[ResultRecord],
    emit: _Emitter,
) -> tuple[ResultRecord | None, str | None]:
    messages = protocol.synthesis_messages(
        question, [candidate_of(r, config.reader.parse) for r in records],
        max_chars=config.max_context_tokens * CHARS_PER_BUDGET_TOKEN,
    )
    await emit(TraceEvent("started", 0, {
        "question": question, "messages": [dict(m) for m in messages], "model": agent.model.name,
        "heavy": len(records), "heavy_mode": "synthesis",
        "max_context_tokens": config.max_context_tokens, "max_steps": 1,
    }))
    try:
        gen = await agent.model.generate(
            messages, config.sampling, grammar="answer" if config.constrained else None,
            state=TurnState(question=question,
                            answers=tuple(a for a in run_answers(records, config.texts)
                                          if a.answer)),
            timeout=config.time_limit,
        )
    except LLMError as exc:
        await emit(TraceEvent("error", 0, {"kind": "synthesis_failed", "attempt": 0,
                                           "message": str(exc), "last": True}))
        return None, f"synthesis failed: {exc}"
    turn = config.reader.read(gen.text or "")  # the profile's reader (--protocol)
    await emit(TraceEvent("model_output", 0, {
        "attempt": 0, "text": turn.content, "kind": turn.kind, "error": turn.error,
        "completion_tokens": gen.completion_tokens, "prompt_tokens": gen.prompt_tokens,
        "cached_tokens": gen.cached_tokens,
    }))
    reason = None
    if turn.kind != "answer" or not (turn.answer or "").strip():
        reason = turn.error or "the synthesis turn gave no answer"
    elif config.constrained and normalize_answer(str(turn.answer)) not in votes(records):
        # a grammar-bound small model copies spans of the prompt ("Researcher 1"): it may only
        # pick one of the runs' answers
        reason = f"the synthesis answer {turn.answer!r} is none of the runs' answers"
    if reason:
        await emit(TraceEvent("error", 0, {"kind": "synthesis_failed", "attempt": 0,
                                           "message": reason, "last": True}))
        return None, f"synthesis failed: {reason}"
    reply = {"role": "assistant", "content": turn.content}
    await emit(TraceEvent("turn", 0, {"message": reply, "kind": "answer", "forced": False}))
    await emit(TraceEvent("answer", 0, {"answer": turn.answer, "forced": False}))
    final = _combined(question, [*messages, reply], str(turn.answer), "answered", records,
                      "synthesis")
    final.turns += 1
    usage = {"calls": 1, "prompt_tokens": gen.prompt_tokens or 0,
             "prompt_tokens_evaluated": max(0, (gen.prompt_tokens or 0) - (gen.cached_tokens or 0)),
             "completion_tokens": gen.completion_tokens or 0}
    final.usage = {k: final.usage.get(k, 0) + v for k, v in usage.items()}
    final.final_token_count = gen.prompt_tokens or final.final_token_count
    return final, None


async def _vote(agent: Member, question: str, records: list[ResultRecord], emit: _Emitter,
                note: str | None, scores: Sequence[float] | None = None) -> ResultRecord:
    chosen = majority_vote(records, scores)
    base = records[chosen if chosen is not None else 0]
    await emit(TraceEvent("started", 0, {
        "question": question, "messages": [dict(m) for m in base.messages],
        "model": agent.model.name, "heavy": len(records), "heavy_mode": "vote", "max_steps": 0,
    }))
    if chosen is not None:
        await emit(TraceEvent("answer", 0, {"answer": base.prediction, "forced": False}))
    final = _combined(question, base.messages, base.prediction, base.termination, records,
                      "vote")
    final.error = base.error if chosen is None else None
    final.final_token_count = base.final_token_count
    if note:
        final.extra["heavy"]["note"] = note
    return final


def _combined(question: str, messages: list[dict[str, str]], prediction: str,
              termination: Any, records: list[ResultRecord], chosen_by: str) -> ResultRecord:
    usage: Counter[str] = Counter()
    for r in records:
        usage.update(r.usage)
    return ResultRecord(
        question=question, messages=list(messages), prediction=prediction,
        termination=termination,
        turns=sum(r.turns for r in records),
        parse_error_count=sum(r.parse_error_count for r in records),
        tool_call_count=sum(r.tool_call_count for r in records),
        dedup_count=sum(r.dedup_count for r in records),
        usage=dict(usage),
        extra={"heavy": {"runs_count": len(records), "chosen_by": chosen_by,
                         "votes": dict(votes(records)),
                         "runs": [r.to_dict() for r in records]}},
    )
