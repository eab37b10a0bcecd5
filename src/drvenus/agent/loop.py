"""The research loop: think, call a tool, read the result, repeat, answer.

Budgets (steps, context tokens, wall clock), bounded retries with backoff (API failure,
empty output, repetitive tail, parse error, duplicate tool call), the error tool response,
forced final answers at the limits, and the result record, as DR-Venus inference does them.
Context tokens are counted incrementally: the tokens of each new message, corrected by the
server's usage numbers whenever a generation reports them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from drvenus import protocol
from drvenus.agent.events import EventCallback, TraceEvent
from drvenus.agent.record import ResultRecord, Termination
from drvenus.llm.base import ChatModel, Constraint, LLMError, SamplingParams
from drvenus.protocol import ParsedTurn, ToolCall

log = logging.getLogger(__name__)

# Tokens a chat template adds around each message (role header, end-of-turn marker).
MESSAGE_OVERHEAD_TOKENS = 4


class ToolExecutor(Protocol):
    """Runs a normalised tool call and returns the response body; never raises."""

    async def call(self, tool_call: ToolCall) -> str: ...


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
    sampling: SamplingParams = field(default_factory=SamplingParams)
    constrained: bool | None = None
    min_searches: int = 0  # with a grammar: the first N tool calls must be searches
    system_prompt: str | None = None
    current_date: str | None = None


def is_repetitive(text: str, tail: int = 50, threshold: int = 5) -> bool:
    """True when the last ``tail`` characters occur more than ``threshold`` times in ``text``."""
    if len(text) < tail:
        return False
    return text.count(text[-tail:]) > threshold


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

    def replace(self, old: str, new: str) -> None:
        self.tokens += self.measure(new) - self.measure(old)
        self.chars += len(new) - len(old)

    def anchor(self, prompt_tokens: int) -> None:
        """The server's count for the whole current history."""
        if prompt_tokens > 0:
            self.tokens = prompt_tokens
            self._chars_per_token = self.chars / prompt_tokens


@dataclass
class _Attempt:
    """The outcome of one step's generation after retries."""

    parsed: ParsedTurn | None  # None: the model could not be reached / gave nothing
    error: str | None = None
    completion_tokens: int | None = None


class _Run:
    """State of one question. Not shared between questions, so runs are independent."""

    def __init__(self, agent: ResearchAgent, question: str, emit: EventCallback | None) -> None:
        self.agent, self.cfg, self.model = agent, agent.config, agent.model
        self.question = question
        self._emit_cb = emit
        system = self.cfg.system_prompt or protocol.build_system_prompt(self.cfg.current_date)
        self.messages = protocol.initial_messages(question, system)
        self.start = time.monotonic()
        self.turns = self.parse_errors = self.tool_calls = self.dedups = 0
        self.seen_calls: set[str] = set()
        self.meter = ContextMeter(self.model.count_tokens)
        for m in self.messages:
            self.meter.add(m["content"])
        self.calls_made = 0  # model calls, to vary the seed across retries
        self.last_error: str | None = None

    # ---- bookkeeping ----
    @property
    def context_tokens(self) -> int:
        return self.meter.tokens

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    async def emit(self, type_: str, step: int, **data: Any) -> None:
        if self._emit_cb is None:
            return
        result = self._emit_cb(TraceEvent(type_, step, data))  # type: ignore[arg-type]
        if inspect.isawaitable(result):
            await result

    def append(self, role: str, content: str, tokens: int | None = None) -> None:
        self.messages.append({"role": role, "content": content})
        self.meter.add(content, tokens)

    def replace_last(self, content: str) -> None:
        old = self.messages[-1]["content"]
        self.messages[-1] = {"role": "user", "content": content}
        self.meter.replace(old, content)

    def record(self, termination: Termination, prediction: str | None = None) -> ResultRecord:
        if prediction is None:
            prediction = self._last_prediction()
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
        )

    def _last_prediction(self) -> str:
        for msg in reversed(self.messages):
            if msg["role"] == "assistant":
                content = msg["content"].strip()
                return protocol.extract_answer(content) or content or "No answer found"
        return "No answer found"

    # ---- generation with retries ----
    def _constraint(self, forced: bool) -> Constraint:
        """Grammar for this call: the configured switch, narrowed to the turn kind we need."""
        c = self.cfg.constrained
        if not c:
            return c
        if forced:
            return "answer"
        if self.tool_calls < self.cfg.min_searches:
            return "search"
        return True

    def _params(self) -> SamplingParams:
        p = self.cfg.sampling
        if p.seed is not None:
            p = replace(p, seed=p.seed + self.calls_made)
        return p

    async def _sleep_backoff(self, attempt: int) -> None:
        if self.cfg.backoff_base <= 0:
            return
        delay = min(self.cfg.backoff_base * 2**attempt + random.uniform(0, 1), self.cfg.backoff_max)
        await asyncio.sleep(min(delay, max(0.0, self.cfg.time_limit - self.elapsed())))

    async def generate(self, step: int, forced: bool = False) -> _Attempt:
        """One step's turn, retried up to ``max_attempts`` times (see module doc)."""
        last: ParsedTurn | None = None
        attempts = max(1, self.cfg.max_attempts)
        for attempt in range(attempts):
            final_try = attempt == attempts - 1
            self.calls_made += 1
            try:
                gen = await self.model.generate(
                    self.messages, self._params(), constrained=self._constraint(forced)
                )
            except LLMError as exc:
                self.last_error = str(exc)
                await self.emit("error", step, kind="llm_error", attempt=attempt, message=str(exc))
                if final_try:
                    return _Attempt(None, str(exc))
                await self._sleep_backoff(attempt)
                continue
            text = gen.text or ""
            if not text.strip():
                self.last_error = "the model returned empty output"
                await self.emit("error", step, kind="empty_output", attempt=attempt)
                if final_try:
                    return _Attempt(None, self.last_error)
                await self._sleep_backoff(attempt)
                continue
            if gen.prompt_tokens is not None:
                self.meter.anchor(gen.prompt_tokens)  # the server's count of the history
            repetitive = is_repetitive(
                text.strip(), self.cfg.repetition_tail, self.cfg.repetition_threshold
            )
            parsed = protocol.parse_turn(protocol.repair_turn(text))
            await self.emit(
                "model_output",
                step,
                attempt=attempt,
                text=parsed.content,
                kind=parsed.kind,
                error=parsed.error,
                completion_tokens=gen.completion_tokens,
            )
            last = parsed
            if repetitive and not final_try:
                await self.emit("error", step, kind="repetition", attempt=attempt)
                await self._sleep_backoff(attempt)
                continue
            if not parsed.ok:
                self.parse_errors += 1
                await self.emit(
                    "error", step, kind="parse_error", attempt=attempt, message=parsed.error
                )
                if final_try:
                    return _Attempt(parsed, completion_tokens=gen.completion_tokens)
                await self._sleep_backoff(attempt)
                continue
            if parsed.tool_call is not None and parsed.tool_call.key() in self.seen_calls:
                self.dedups += 1
                await self.emit(
                    "error", step, kind="duplicate_tool_call", attempt=attempt,
                    message=parsed.tool_call.to_json(),
                )
                if final_try:  # executed anyway, as DR-Venus does
                    return _Attempt(parsed, completion_tokens=gen.completion_tokens)
                await self._sleep_backoff(attempt)
                continue
            self.last_error = None  # recovered: an earlier attempt's failure no longer applies
            return _Attempt(parsed, completion_tokens=gen.completion_tokens)
        return _Attempt(last)

    # ---- the loop ----
    async def force_answer(self, step: int, ok: Termination, fail: Termination) -> ResultRecord:
        outcome = await self.generate(step, forced=True)
        if outcome.parsed is None:
            return self.record(fail)
        self.append("assistant", outcome.parsed.content, outcome.completion_tokens)
        self.turns += 1
        if outcome.parsed.kind == "answer":
            await self.emit("answer", step, answer=outcome.parsed.answer, forced=True)
            return self.record(ok, outcome.parsed.answer)
        return self.record(fail)

    async def execute(self, step: int, call: ToolCall) -> str:
        await self.emit("tool_call", step, name=call.name, arguments=call.arguments)
        body = await self.agent.tools.call(call)
        await self.emit("tool_result", step, name=call.name, content=body)
        return body

    async def run(self) -> ResultRecord:
        cfg = self.cfg
        for step in range(cfg.max_steps):
            if self.elapsed() > cfg.time_limit:
                self.last_error = f"time limit of {cfg.time_limit:g}s reached"
                return self.record("timeout")
            await self.emit("step_started", step, context_tokens=self.context_tokens)
            outcome = await self.generate(step)
            parsed = outcome.parsed
            if parsed is None:
                return self.record("llm_error")
            self.append("assistant", parsed.content, outcome.completion_tokens)
            self.turns += 1
            if parsed.kind == "answer":
                await self.emit("answer", step, answer=parsed.answer, forced=False)
                return self.record("answered", parsed.answer)
            if parsed.tool_call is not None:
                self.tool_calls += 1
                self.seen_calls.add(parsed.tool_call.key())
                body = await self.execute(step, parsed.tool_call)
                self.append("user", protocol.wrap_tool_response(body))
            else:
                self.append("user", protocol.wrap_tool_response(protocol.FORMAT_ERROR_MESSAGE))
            if self.context_tokens > cfg.max_context_tokens:
                self.replace_last(protocol.wrap_tool_response(protocol.CONTEXT_LIMIT_MESSAGE))
                return await self.force_answer(
                    step + 1, "answered_token_limit", "token_limit_no_answer"
                )
        if self.messages[-1]["role"] == "user" and len(self.messages) > 2:
            self.replace_last(protocol.wrap_tool_response(protocol.STEP_LIMIT_MESSAGE))
        else:
            self.append("user", protocol.wrap_tool_response(protocol.STEP_LIMIT_MESSAGE))
        return await self.force_answer(cfg.max_steps, "answered_max_steps", "max_steps")


class ResearchAgent:
    """A deep research agent: a model, the tools, and budgets. Safe to share across tasks:
    each :meth:`run` keeps its own state, so many questions can run concurrently."""

    def __init__(
        self, model: ChatModel, tools: ToolExecutor, config: AgentConfig | None = None
    ) -> None:
        self.model = model
        self.tools = tools
        self.config = config or AgentConfig()

    async def run(self, question: str, on_event: EventCallback | None = None) -> ResultRecord:
        """Research ``question`` to a result record. Never raises for run-time failures:
        they end as a termination reason (``llm_error``, ``timeout``, ``exception``)."""
        if not question or not question.strip():
            raise ValueError("the question is empty")
        state = _Run(self, question, on_event)
        await state.emit("step_started", -1, question=question, context_tokens=state.context_tokens)
        try:
            remaining = self.config.time_limit + 5.0
            record = await asyncio.wait_for(state.run(), timeout=remaining)
        except TimeoutError:
            state.last_error = f"time limit of {self.config.time_limit:g}s reached mid-step"
            record = state.record("timeout")
        except Exception as exc:  # noqa: BLE001 - recorded, never raised to the caller
            log.exception("agent run failed")
            state.last_error = f"{type(exc).__name__}: {exc}"
            record = state.record("exception")
        await state.emit("finished", state.turns, record=record.to_dict())
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
