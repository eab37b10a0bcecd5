"""The research loop: think, call a tool, read the result, repeat, answer.

Budgets (steps, context tokens, wall clock), bounded retries with backoff (API failure,
empty output, repetitive tail, parse error, duplicate tool call), the error tool response,
forced final answers at the limits, and the result record, as DR-Venus inference does them.

- The context budget is clamped to the model's real window minus the per-turn token cap, and a
  server that says the prompt no longer fits ends the run with the forced answer, never an error.
- The time limit counts from the run's first step; every model request gets the time that is
  left as its deadline. A model that keeps failing ends as ``llm_error`` with its last error,
  whatever the time limit; a model that is working but slow ends as ``timeout``.
- Context tokens are counted incrementally: the tokens of each new message, anchored to the
  backend's usage numbers whenever a generation reports them.
- Tools that cannot be used at all (the tool server down, or refusing our token) end the run as
  ``tool_error`` after ``max_unusable_tool_calls`` such calls in a row, instead of spending the
  rest of the step budget on calls that cannot succeed.
- Unusable output (unreadable, repetitive, a duplicate call) is sampled again at once with
  another seed, no backoff, within ``max_attempts`` and ``resample_seconds`` a turn; a model
  whose turns stay unreadable ``max_unreadable_turns`` times in a row ends the run as
  ``llm_error``. A tool call is never the prediction.
- A context strategy (:mod:`drvenus.agent.context`) may compact the conversation when it nears
  the budget, or when the server says it no longer fits; the forced answer comes when nothing
  more can be freed. Compactions are counted in the record's ``extra``.
- Every change to the conversation is a trace event (see :mod:`drvenus.agent.events`), so a
  trace replays to the exact final ``messages``.
- It is the one loop of inference and RL rollouts: an environment changes a run's edges only
  through :class:`~drvenus.agent.hooks.RunHooks` (notices, the last turn, the malformed-turn
  message, how tools run, sampling habits); inference's are the defaults.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from drvenus import protocol
from drvenus.agent.context import ContextManager, ContextPolicy, Messages, small_window_warning
from drvenus.agent.events import EventCallback, TraceEvent
from drvenus.agent.heavy import HeavyPolicy, run_heavy
from drvenus.agent.hooks import INFERENCE, RunHooks, ToolExecutor
from drvenus.agent.record import ResultRecord, Termination
from drvenus.llm.base import ChatModel, Generation, GrammarKind, LLMError, SamplingParams
from drvenus.net.retry import RetryPolicy
from drvenus.net.secrets import redact
from drvenus.protocol import DRVENUS_TEXTS, ParsedTurn, ProtocolTexts
from drvenus.protocol.parse import DRVENUS_READER, TurnReader
from drvenus.protocol.state import TurnState
from drvenus.text import MESSAGE_OVERHEAD_TOKENS

log = logging.getLogger(__name__)

# Tokens a chat template adds around each message (role header, end-of-turn marker).
# Seconds a model request may outlive the run's time limit (the run ends first).
REQUEST_GRACE = 0.5
# Tool calls in a row that find the tools unusable (a dead tool server, each call already
# retried) before the run gives up as ``tool_error``: a circuit breaker.
DEFAULT_MAX_UNUSABLE_TOOL_CALLS = 3
# Turns in a row that could not be read even after their re-samples (an unknown tool, no tool
# call or answer, bad JSON) before the run gives up as ``llm_error``: the model's breaker.
DEFAULT_MAX_UNREADABLE_TURNS = 5
# Seconds one turn's re-samples of unusable output (unreadable, repetitive, a duplicate call)
# may take in all; past it the turn is used as it is.
DEFAULT_RESAMPLE_SECONDS = 60.0
# The clock of the time limit and the re-sample bound (a fake one in tests).
_now = time.monotonic


@dataclass(frozen=True)
class AgentConfig:
    """Budgets and robustness settings; defaults are DR-Venus inference's."""

    max_steps: int = 200
    max_context_tokens: int = 230_000
    time_limit: float = 9000.0
    max_attempts: int = 5
    backoff_base: float = 1.0
    backoff_max: float = 30.0
    repetition_tail: int = 50
    repetition_threshold: int = 5
    max_unusable_tool_calls: int = DEFAULT_MAX_UNUSABLE_TOOL_CALLS
    max_unreadable_turns: int = DEFAULT_MAX_UNREADABLE_TURNS  # 0: no breaker (RL rollouts)
    resample_seconds: float = DEFAULT_RESAMPLE_SECONDS  # a turn's re-samples, in all
    sampling: SamplingParams = field(default_factory=SamplingParams)
    constrained: bool = False  # decode under the protocol grammar (the embedded preset's)
    min_searches: int = 0  # with a grammar: the first N tool calls must be searches
    system_prompt: str | None = None  # replaces the profile's prompt verbatim
    current_date: str | None = None
    # the words of the prompt, the notices (format error, context and step limits): ours, or
    # DR-Venus's read from its pinned source (drvenus.reference.dr_venus)
    texts: ProtocolTexts = DRVENUS_TEXTS
    # how a sampled turn is repaired and read (the profile's: drvenus.reference.profiles)
    reader: TurnReader = DRVENUS_READER
    context: ContextPolicy = field(default_factory=ContextPolicy)  # what to do near the budget
    heavy: HeavyPolicy = field(default_factory=HeavyPolicy)  # runs per question, and how joined
    # the profile's model habits (drvenus.protocol.profiles.Profile): a model error that is not
    # retryable (an HTTP 400) tried again too; a blank reply on a step's last attempt ends the
    # run as llm_error (not the step's last readable sample)
    retry_every_model_error: bool = False
    blank_ends_run: bool = False
    # after a compaction the model is told the searches and pages it already made
    # (drvenus's profile; DR-Venus's has no such note: protocol.recap)
    compaction_recap: bool = True

    @property
    def retry(self) -> RetryPolicy:
        return RetryPolicy(max(1, self.max_attempts), self.backoff_base, self.backoff_max)


def fit_to_window(config: AgentConfig, window: int | None) -> AgentConfig:
    """``config`` with its budgets inside a ``window``-token context: the per-turn cap is at
    most a quarter of the window, the context budget at most the window minus that cap."""
    if not window or window <= 0:
        return config
    quarter = max(64, window // 4)
    requested = config.sampling.max_tokens
    max_tokens = quarter if requested is None else min(requested, quarter)
    budget = min(config.max_context_tokens, window - max_tokens)
    if max_tokens == config.sampling.max_tokens and budget == config.max_context_tokens:
        return config
    return replace(
        config,
        max_context_tokens=budget,
        sampling=replace(config.sampling, max_tokens=max_tokens),
    )


def is_repetitive(text: str, tail: int = 50, threshold: int = 5) -> bool:
    """True when the last ``tail`` characters occur more than ``threshold`` times in ``text``."""
    if len(text) < tail:
        return False
    return text.count(text[-tail:]) > threshold


class ToolCallsMade:
    """The queries searched and the pages opened by tool calls, each once, latest use last."""

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, None]] = {protocol.SEARCH: {}, protocol.VISIT: {}}

    @property
    def queries(self) -> list[str]:
        return list(self._seen[protocol.SEARCH])

    @property
    def pages(self) -> list[str]:
        return list(self._seen[protocol.VISIT])

    def add(self, call: protocol.ToolCall) -> None:
        seen = self._seen.get(call.name)
        if seen is None:
            return
        value = call.arguments.get("query" if call.name == protocol.SEARCH else "url")
        items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        for item in map(str, items):
            seen.pop(item, None)
            seen[item] = None


class ContextMeter:
    """Running count of the context's tokens, without re-tokenising the history.

    Each new message is counted once. When the backend reports usage, its prompt-token count
    replaces the running total (exact), its completion count is used for the new assistant turn,
    and later messages are estimated from the characters-per-token ratio observed so far, so no
    local tokenisation is needed at all; the next generation's usage corrects any drift.
    """

    def __init__(self, count_tokens: Callable[[str], int]) -> None:
        self._count = count_tokens
        self.tokens = 0
        self.chars = 0
        self._chars_per_token: float | None = None

    def measure(self, content: str) -> int:
        if self._chars_per_token:
            return math.ceil(len(content) / self._chars_per_token)
        return self._count(content)

    def add(self, content: str, tokens: int | None = None) -> None:
        n = self.measure(content) if tokens is None else tokens
        self.tokens += n + MESSAGE_OVERHEAD_TOKENS
        self.chars += len(content)

    def reset(self, contents: list[str]) -> None:
        """Count a new conversation (after a compaction) at the ratio observed so far."""
        self.tokens = sum(self.measure(c) + MESSAGE_OVERHEAD_TOKENS for c in contents)
        self.chars = sum(len(c) for c in contents)

    def replace(self, old: str, new: str) -> None:
        self.tokens += self.measure(new) - self.measure(old)
        self.chars += len(new) - len(old)

    def anchor(self, prompt_tokens: int) -> None:
        """The server's count for the whole current history."""
        if prompt_tokens > 0:
            self.tokens = prompt_tokens
            self._chars_per_token = self.chars / prompt_tokens


@dataclass
class Usage:
    """Token accounting of one run: what the prompts held versus what was really evaluated
    (the rest came from the backend's prompt cache)."""

    calls: int = 0
    prompt_tokens: int = 0
    prompt_tokens_evaluated: int = 0
    completion_tokens: int = 0

    def add(self, gen: Generation) -> None:
        self.calls += 1
        prompt = gen.prompt_tokens or 0
        self.prompt_tokens += prompt
        cached = gen.cached_tokens if gen.cached_tokens is not None else 0
        self.prompt_tokens_evaluated += max(0, prompt - cached)
        self.completion_tokens += gen.completion_tokens or 0

    def to_dict(self) -> dict[str, int]:
        return {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_evaluated": self.prompt_tokens_evaluated,
            "completion_tokens": self.completion_tokens,
        }


@dataclass
class _Attempt:
    """The outcome of one step's generation after retries."""

    parsed: ParsedTurn | None  # None: the model could not be reached / gave nothing
    completion_tokens: int | None = None
    overflow: bool = False  # the prompt no longer fits the model's window


class _QuestionRun:
    """State of one question. Not shared between questions, so runs are independent."""

    def __init__(
        self, agent: ResearchAgent, config: AgentConfig, question: str, emit: EventCallback | None,
        hooks: RunHooks = INFERENCE,
    ) -> None:
        self.agent, self.cfg, self.model, self.hooks = agent, config, agent.model, hooks
        self.question = question
        self._emit_cb = emit
        system = self.cfg.system_prompt or self.cfg.texts.prompt(self.cfg.current_date)
        self.messages = hooks.messages(question, system)
        self.head = len(self.messages)  # messages a limit notice never replaces
        # what the conversation holds (question, texts read, queries): a turn grammar's input
        self.state = TurnState.of(self.messages, self.cfg.texts)
        self.context = ContextManager(config.context, config.max_context_tokens)
        self.start = _now()
        self.step = 0
        self.turns = self.parse_errors = self.tool_calls = self.dedups = 0
        self.unusable_calls = 0  # tool calls that found the tools unusable (see execute)
        self.unusable_streak = 0  # ... of the latest calls, in a row
        self.unreadable_streak = 0  # turns in a row that could not be read after re-samples
        self.tool_problem: str | None = None
        self.seen_calls: set[str] = set()
        self.made = ToolCallsMade()  # the queries and pages of this run (the recap)
        self.retries: dict[str, int] = {}  # re-samples of a turn, by reason
        self.meter = ContextMeter(self.model.count_tokens)
        for m in self.messages:
            self.meter.add(m["content"])
        self.usage = Usage()
        self.calls_made = 0  # model calls, to vary the seed across retries
        self.last_error: str | None = None
        self.failing = False  # the latest model call raised and none has succeeded since

    # ---- bookkeeping ----
    @property
    def context_tokens(self) -> int:
        return self.meter.tokens

    def elapsed(self) -> float:
        return _now() - self.start

    def remaining(self) -> float:
        return max(0.0, self.cfg.time_limit - self.elapsed())

    async def emit(self, type_: str, **data: Any) -> None:
        if self._emit_cb is None:
            return
        result = self._emit_cb(TraceEvent(type_, self.step, data))  # type: ignore[arg-type]
        if inspect.isawaitable(result):
            await result

    async def append(
        self, event: str, role: str, content: str, tokens: int | None = None, /, **data: Any
    ) -> None:
        """Add a message to the conversation and say so in the trace."""
        message = {"role": role, "content": content}
        self.messages.append(message)
        self.meter.add(content, tokens)
        await self.emit(event, message=message, **data)

    async def replace_last(self, content: str, role: str = "user", **data: Any) -> None:
        """Replace the last message (a tool response) with a limit notice."""
        old = self.messages[-1]["content"]
        message = {"role": role, "content": content}
        self.messages[-1] = message
        self.state = TurnState.of(self.messages, self.cfg.texts)
        self.meter.replace(old, content)
        await self.emit("limit_notice", message=message, replace=True, **data)

    def record(self, termination: Termination, prediction: str | None = None) -> ResultRecord:
        if prediction is None:
            prediction = self._last_prediction()
        if self.tool_calls and self.unusable_calls == self.tool_calls and termination not in (
            "interrupted", "llm_error"
        ):  # not one tool could be used: a failed run, not the question's outcome
            termination, self.last_error = "tool_error", self.tool_problem
        return ResultRecord(
            question=self.question,
            messages=self.messages,
            prediction=prediction,
            termination=termination,
            turns=self.turns,
            parse_error_count=self.parse_errors,
            tool_call_count=self.tool_calls,
            dedup_count=self.dedups,
            final_token_count=self.context_tokens,
            elapsed_seconds=round(self.elapsed(), 3),
            error=self.last_error if not termination.startswith("answered") else None,
            usage=self.usage.to_dict(),
            extra={**self.context.extra(), **self.hooks.extra(self.retries)},
        )

    def _last_prediction(self) -> str:
        for msg in reversed(self.messages):
            if msg["role"] == "assistant":
                content = msg["content"].strip()
                answer = protocol.extract_answer(content)
                if answer:
                    return answer
                # a tool call (or an unreadable one) is no answer: never its raw markup
                if content and protocol.TOOL_CALL_OPEN not in content:
                    return content
                return "No answer found"
        return "No answer found"

    # ---- generation with retries ----
    def _grammar(self, forced: bool) -> GrammarKind | None:
        """The grammar of this call (None: free), narrowed to the turn kind we need."""
        if not self.cfg.constrained:
            return None
        if forced:
            return "answer"
        if self.tool_calls < self.cfg.min_searches:
            return "search"
        return "any"

    def _params(self) -> SamplingParams:
        p = self.cfg.sampling
        if p.seed is not None:
            p = replace(p, seed=p.seed + self.calls_made)
        return p

    async def _backoff(self, failures: int, retry_after: float | None = None) -> bool:
        """Wait before the next attempt; False when the time limit leaves no room for it."""
        wait = self.cfg.retry.delay(failures, retry_after)
        if wait >= self.remaining():
            return False
        if wait > 0:
            await asyncio.sleep(wait)
        return True

    def _may_resample(self, started: float) -> bool:
        """Whether a turn whose sampling began at ``started`` may be sampled again."""
        spent = _now() - started
        return spent < self.cfg.resample_seconds and self.remaining() > 0

    async def _call_model(self, forced: bool, messages: Messages | None = None) -> Generation:
        """One model call on the conversation (or on ``messages``, free text: a report)."""
        self.calls_made += 1
        self.failing = False  # a call in flight when time runs out is a timeout, not an error
        try:
            gen = await self.model.generate(
                self.messages if messages is None else messages,
                self._params(),
                grammar=self._grammar(forced) if messages is None else None,
                state=self.state if messages is None else None,
                # a little past the run's own limit, so that a slow model ends as "timeout"
                timeout=self.remaining() + REQUEST_GRACE,
            )
        except LLMError as exc:
            self.failing = True
            self.last_error = str(exc)
            raise
        self.failing = False
        self.usage.add(gen)
        return gen

    async def generate(self, forced: bool = False) -> _Attempt:
        """One step's turn, tried up to ``max_attempts`` times (see module doc)."""
        last: ParsedTurn | None = None
        attempts = self.cfg.retry.attempts
        started = _now()
        for attempt in range(attempts):
            final_try = attempt == attempts - 1
            try:
                gen = await self._call_model(forced)
            except LLMError as exc:
                await self.emit(
                    "error", kind="llm_error", attempt=attempt, message=str(exc),
                    last=final_try or not exc.retryable or exc.context_overflow,
                )
                if exc.context_overflow:
                    return _Attempt(None, overflow=True)
                retryable = exc.retryable or self.cfg.retry_every_model_error
                if final_try or not retryable or not self.hooks.retry_model_errors \
                        or not await self._backoff(attempt + 1, exc.retry_after):
                    return _Attempt(None)
                continue
            text = gen.text or ""
            if not text.strip() and not self.hooks.read_empty:
                self.last_error = "the model returned empty output"
                await self.emit("error", kind="empty_output", attempt=attempt, last=final_try)
                if final_try and self.cfg.blank_ends_run:
                    return _Attempt(None)
                if final_try or not await self._backoff(attempt + 1):
                    return _Attempt(last)
                continue
            if gen.prompt_tokens is not None:
                self.meter.anchor(gen.prompt_tokens)  # the server's count of the history
            parsed = self.cfg.reader.read(text)
            await self.emit(
                "model_output",
                attempt=attempt,
                text=parsed.content,
                kind=parsed.kind,
                error=parsed.error,
                completion_tokens=gen.completion_tokens,
                prompt_tokens=gen.prompt_tokens,
                cached_tokens=gen.cached_tokens,
            )
            last = parsed
            problem = self._problem(text, parsed)
            if problem is None:
                self.last_error = None  # recovered: an earlier failure no longer applies
                return _Attempt(parsed, gen.completion_tokens)
            kind, message = problem
            await self.emit("error", kind=kind, attempt=attempt, message=message, last=final_try)
            if not final_try:
                self.retries[kind] = self.retries.get(kind, 0) + 1
            # The model did answer: a new sample (another seed) is tried at once, no backoff,
            # while the turn's re-samples stay within their time. A repetitive or duplicate
            # turn is used anyway on the last try, as DR-Venus does.
            if final_try or not self._may_resample(started):
                return _Attempt(parsed, gen.completion_tokens)
        return _Attempt(last)

    def _problem(self, text: str, parsed: ParsedTurn) -> tuple[str, str | None] | None:
        """Why a well-received turn should be sampled again, if it should."""
        probe = text if self.hooks.raw_repetition else text.strip()
        if is_repetitive(probe, self.cfg.repetition_tail, self.cfg.repetition_threshold):
            return "repetition", None
        if not parsed.ok:
            self.parse_errors += 1
            return "parse_error", parsed.error
        if parsed.tool_call is not None and parsed.dedup_key() in self.seen_calls:
            self.dedups += 1
            return "duplicate_tool_call", parsed.tool_call.to_json()
        return None

    # ---- the loop ----
    async def force_answer(self, ok: Termination, fail: Termination) -> ResultRecord:
        outcome = await self.generate(forced=True)
        if outcome.parsed is None:
            return self.record("llm_error" if self.failing else fail)
        await self.append(
            "turn", "assistant", outcome.parsed.content, outcome.completion_tokens,
            kind=outcome.parsed.kind, forced=True,
        )
        self.turns += 1
        if outcome.parsed.kind == "answer":
            await self.emit("answer", answer=outcome.parsed.answer, forced=True)
            return self.record(ok, outcome.parsed.answer)
        return self.record(fail)

    async def limit_reached(self, reason: str, notice: str) -> None:
        """Put the limit notice in place of the last tool response (or after the question)."""
        wrapped = protocol.wrap_tool_response(notice)
        if self.messages[-1]["role"] == "user" and len(self.messages) > self.head:
            await self.replace_last(wrapped, reason=reason)
        else:
            await self.append("limit_notice", "user", wrapped, reason=reason, replace=False)

    async def execute(self, parsed: ParsedTurn) -> None:
        call = parsed.tool_call
        assert call is not None
        self.tool_calls += 1
        self.seen_calls.add(parsed.dedup_key() or call.key())
        self.made.add(call)
        await self.emit("tool_call", name=call.name, arguments=call.arguments)
        body = await self.hooks.call_tool(self.agent.tools, parsed)
        if getattr(body, "unusable", False):  # the tool server is down or refuses us
            self.unusable_calls += 1
            self.unusable_streak += 1
            self.tool_problem = str(body)
        else:
            self.unusable_streak = 0
        await self.append(
            "tool_result", "user", protocol.wrap_tool_response(body), name=call.name, content=body
        )
        self.state = self.state.after_response(str(body), self.cfg.texts)

    async def run(self) -> ResultRecord:
        cfg = self.cfg
        await self.emit(
            "started",
            question=self.question,
            messages=list(self.messages),
            model=self.model.name,
            context_window=self.agent.window,
            max_context_tokens=cfg.max_context_tokens,
            max_steps=cfg.max_steps,
        )
        for step in range(cfg.max_steps):
            self.step = step
            if self.remaining() <= 0:
                self.last_error = f"time limit of {cfg.time_limit:g}s reached"
                return self.record("timeout")
            await self.emit("step_started", context_tokens=self.context_tokens)
            last = await self.hooks.before_turn(self)  # an environment's notice: the last turn
            outcome = await self.generate(forced=last is not None)
            if outcome.overflow:
                # the server's window is smaller than we thought (a turn announced as the last
                # one stays the last: its notice is in place)
                if last is None and await self.compact():
                    continue
                return await self._context_limit()
            parsed = outcome.parsed
            if parsed is None:  # unreachable, failing, or empty output every time
                return self.record("llm_error")
            await self.append(
                "turn", "assistant", parsed.content, outcome.completion_tokens,
                kind=parsed.kind, forced=last is not None,
            )
            self.state = self.state.after_turn(parsed.content, parsed.tool_call)
            self.turns += 1
            if last is not None:
                return await self._last_turn(last, parsed)
            if parsed.kind == "answer":
                await self.emit("answer", answer=parsed.answer, forced=False)
                return self.record("answered", parsed.answer)
            if parsed.tool_call is not None:
                self.unreadable_streak = 0
                await self.execute(parsed)
                if self.unusable_streak >= max(1, cfg.max_unusable_tool_calls):
                    return await self._tools_unusable()
            else:
                await self.append("format_error", "user", self.hooks.malformed(cfg.texts))
                self.unreadable_streak += 1
                if 0 < cfg.max_unreadable_turns <= self.unreadable_streak:
                    return await self._turns_unreadable(parsed)
            if self.context.due(self.context_tokens):
                await self.compact()
            if self.hooks.context_full(self.context_tokens, cfg.max_context_tokens):
                return await self._context_limit()
        self.step = cfg.max_steps
        await self.limit_reached("steps", cfg.texts.step_limit)
        return await self.force_answer("answered_max_steps", "max_steps")

    # ---- context management ----
    async def compact(self) -> bool:
        """Free context with the run's strategy; False when nothing could be freed."""
        before = self.context_tokens
        done = await self.context.compact(self.messages, self.head, self._report, self._count,
                                          self._recap if self.cfg.compaction_recap else None)
        if done is None:
            return False
        self.messages, self.head = done.messages, done.head
        self.state = TurnState.of(self.messages, self.cfg.texts)
        self.seen_calls = self._visible_calls()
        self.meter.reset([m["content"] for m in self.messages])
        await self.emit(
            "compaction", **done.event_data(), tokens_before=before,
            tokens_after=self.context_tokens,
        )
        return True

    def _recap(self, kept: Messages) -> str | None:
        """The recap of the queries and pages made whose calls are not among ``kept``."""
        in_view = ToolCallsMade()
        for m in kept:
            if m["role"] == "assistant":
                call = self.cfg.reader.read(m["content"]).tool_call
                if call is not None:
                    in_view.add(call)
        queries, pages = set(in_view.queries), set(in_view.pages)
        return protocol.recap([q for q in self.made.queries if q not in queries],
                              [u for u in self.made.pages if u not in pages])

    def _visible_calls(self) -> set[str]:
        """The calls whose results the model still sees: after a compaction, a call it made
        before (restarted from a report, or its result stubbed) is no duplicate to retry."""
        keys: set[str] = set()
        for i in range(self.head, len(self.messages) - 1):
            turn, reply = self.messages[i], self.messages[i + 1]
            if turn["role"] == "assistant" and not protocol.is_elided(reply["content"]):
                key = self.cfg.reader.read(turn["content"]).dedup_key()
                if key is not None:
                    keys.add(key)
        return keys

    def _count(self, messages: Messages) -> int:
        return sum(self.meter.measure(m["content"]) + MESSAGE_OVERHEAD_TOKENS for m in messages)

    async def _report(self, messages: Messages) -> str | None:
        """The model's report of the research so far (summarise), or None."""
        try:
            gen = await self._call_model(False, messages)
        except LLMError as exc:
            await self.emit("error", kind="compaction_failed", attempt=0, message=str(exc),
                            last=True)
            return None
        report = protocol.report_text(gen.text or "")
        if not report:
            await self.emit("error", kind="compaction_failed", attempt=0,
                            message="the model wrote an empty report", last=True)
        return report or None

    async def _tools_unusable(self) -> ResultRecord:
        """The circuit breaker: the tools failed as unusable too many times in a row."""
        self.tool_problem = (
            f"{self.unusable_streak} tool calls in a row found the tools unusable; the run "
            f"stopped. Last: {self.tool_problem}"
        )
        self.last_error = self.tool_problem
        await self.emit("error", kind="tool_error", attempt=0, message=self.tool_problem,
                        last=True)
        return self.record("tool_error")

    async def _turns_unreadable(self, parsed: ParsedTurn) -> ResultRecord:
        """The model's breaker: its turns could not be read, re-samples and all, too many
        times in a row (a model that keeps calling an unknown tool, say)."""
        self.last_error = (
            f"{self.unreadable_streak} turns in a row could not be read, each sampled up to "
            f"{self.cfg.retry.attempts} times; the run stopped. Last: {parsed.error}"
        )
        await self.emit("error", kind="unreadable_turns", attempt=0, message=self.last_error,
                        last=True)
        return self.record("llm_error")

    async def _last_turn(self, reason: str, parsed: ParsedTurn) -> ResultRecord:
        """End the run with the last turn an environment announced (``before_turn``)."""
        termination, prediction = self.hooks.last_turn(reason, parsed)
        if termination.startswith("answered"):
            await self.emit("answer", answer=prediction, forced=True)
        return self.record(termination, prediction)

    async def _context_limit(self) -> ResultRecord:
        ended = self.hooks.exhausted()
        if ended is not None:  # the environment ends a full run itself
            return self.record(ended)
        self.step += 1
        await self.limit_reached("context", self.cfg.texts.context_limit)
        return await self.force_answer("answered_token_limit", "token_limit_no_answer")


class ResearchAgent:
    """A deep research agent: a model, the tools, and budgets. Safe to share across tasks:
    each :meth:`run` keeps its own state, so many questions can run concurrently."""

    def __init__(
        self, model: ChatModel, tools: ToolExecutor, config: AgentConfig | None = None
    ) -> None:
        self.model = model
        self.tools = tools
        self.config = config or AgentConfig()
        self._fitted: AgentConfig | None = None
        self.window: int | None = None

    async def effective_config(self) -> AgentConfig:
        """The config with its budgets fitted to the model's context window (asked once)."""
        if self._fitted is None:
            self.window = await self.model.context_window()
            warning = small_window_warning(self.window, self.config.max_context_tokens)
            if warning:
                log.warning("%s", warning)
            fitted = fit_to_window(self.config, self.window)
            if fitted != self.config:
                log.info(
                    "context window %d tokens: budget %d, %d new tokens per turn",
                    self.window, fitted.max_context_tokens, fitted.sampling.max_tokens,
                )
            self._fitted = fitted
        return self._fitted

    async def run(self, question: str, on_event: EventCallback | None = None) -> ResultRecord:
        """Research ``question`` to a result record. Never raises for run-time failures:
        they end as a termination reason (``llm_error``, ``timeout``, ``exception``).
        Cancellation (Ctrl-C) emits ``finished`` with an ``interrupted`` record, then
        propagates."""
        if not question or not question.strip():
            raise ValueError("the question is empty")
        config = await self.effective_config()
        if config.heavy.runs > 1:  # Heavy mode: several runs, then one answer
            return await run_heavy(self, config, question, on_event)
        return await self.run_one(question, on_event)

    async def run_one(
        self, question: str, on_event: EventCallback | None = None,
        sampling: SamplingParams | None = None, hooks: RunHooks = INFERENCE,
    ) -> ResultRecord:
        """One research run of ``question``, whatever ``heavy`` says (each of Heavy mode's
        runs is one, with its own ``sampling``); ``hooks``: an RL environment's
        (:mod:`drvenus.agent.hooks`)."""
        config = await self.effective_config() if hooks.fit_window else self.config
        if sampling is not None:
            config = replace(config, sampling=sampling)
        state = _QuestionRun(self, config, question, on_event, hooks)
        try:
            record = await asyncio.wait_for(state.run(), timeout=config.time_limit)
        except TimeoutError:
            if state.failing:  # the model was failing when time ran out: its error is the story
                record = state.record("llm_error")
            else:
                state.last_error = f"time limit of {config.time_limit:g}s reached"
                record = state.record("timeout")
        except asyncio.CancelledError:
            state.last_error = "interrupted"
            await _shielded_emit(state, state.record("interrupted"))
            raise
        except Exception as exc:  # recorded, never raised to the caller
            log.exception("agent run failed")
            state.last_error = redact(f"{type(exc).__name__}: {exc}")
            record = state.record("exception")
        await state.emit("finished", record=record.to_dict())
        return record

    async def stream(self, question: str) -> AsyncIterator[TraceEvent]:
        """The run as an async iterator of events; the last one is ``finished``, whose data
        holds the full record under ``"record"``."""
        queue: asyncio.Queue[TraceEvent | None] = asyncio.Queue()

        async def runner() -> None:
            try:
                await self.run(question, queue.put_nowait)
            finally:
                queue.put_nowait(None)

        task = asyncio.create_task(runner())
        try:
            while (event := await queue.get()) is not None:
                yield event
            await task  # surfaces a ValueError for an empty question
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


async def _shielded_emit(state: _QuestionRun, record: ResultRecord) -> None:
    """Emit ``finished`` for an interrupted run (the callback may be async)."""
    try:
        await asyncio.shield(state.emit("finished", record=record.to_dict()))
    except (asyncio.CancelledError, Exception):  # best effort while cancelled
        log.debug("could not emit the final event of an interrupted run", exc_info=True)
