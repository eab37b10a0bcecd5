"""DR-Venus's RL rollout environment (``drvenus rl --protocol dr-venus``), in drvenus's own code.

DR-Venus trains in the loop of its verl agent loop (``RL/scrl/llm_agent/dr_agent_loop.py``,
``DRAgentLoop.run``), which differs from its inference loop. :func:`run_trajectory` follows it,
with its texts read at run time from the pinned files (:mod:`drvenus.reference.dr_venus_rl`).
One trajectory has at most ``max_turns`` turns (a limit drawn per trajectory, see
:func:`turn_limit`); before each turn, in this order:

1. after the first turn, a prompt longer than ``context_limit`` tokens (the window minus the
   per-turn cap): the context notice replaces the last message, and this turn is the last;
2. else, once the step's completion cut-off has fired (:class:`CompletionCutoff`): the cut-off
   notice, appended to the question (after a blank line) on the first turn, else in place of
   the last message; the last turn;
3. else, on turn ``max_turns - 1``: the step-limit notice in place of the last message (none on
   the first turn); the last turn.

The three notices are plain user messages, not ``<tool_response>`` frames. Under a Qwen3
thinking template a plain user message is a new query, so the template drops the reasoning of
every earlier assistant turn; DR-Venus re-renders the conversation for every turn, so its policy
answers the notice without its earlier thinking. With ``rerender_queries`` the
:class:`~drvenus.train.rl.recorder.TokenRecorder` does the same for that last turn (and records
the trajectory as DR-Venus does then: the final conversation rendered once).

Then the turn is sampled (``robust``: up to ``attempts`` samples, again on a repetitive tail, a
malformed turn or a call already made), its tags are fixed as DR-Venus fixes them
(:func:`fix_tags`) and it is read as DR-Venus reads it (:func:`classify_turn`): the last turn or
an answer ends the trajectory; a malformed turn, an empty one included, gets the malformed
message and the trajectory goes on; a call runs the tool (at most ``tool_timeout`` seconds, then
DR-Venus's timeout text; a tool that raises gives its error text) and its result comes back in a
``<tool_response>`` frame.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from drvenus import protocol
from drvenus.agent.loop import ToolExecutor, is_repetitive
from drvenus.agent.record import ResultRecord, Termination
from drvenus.llm.base import ChatModel, LLMError, SamplingParams
from drvenus.protocol import wrap_tool_response
from drvenus.protocol.dr_venus import EnvTurn, classify_turn, first_answer, fix_tags
from drvenus.reference.dr_venus_rl import RLTexts
from drvenus.text import MESSAGE_OVERHEAD_TOKENS

log = logging.getLogger(__name__)

# DR-Venus's numbers (the 0.9 cut-off, the 150 s tool timeout) are RLConfig's defaults
CUTOFF_JOIN = "\n\n"  # between the question and the cut-off notice on the first turn

_DATE_LINE = re.compile(r"^Current date: (\d{4}-\d{2}-\d{2})[ \t]*$", re.MULTILINE)


def turn_limit(max_turns: int, jitter: int, rng: random.Random) -> int:
    """A trajectory's turn limit: ``max_turns`` plus ``int(u * 2j - j)`` for a uniform ``u``
    (DR-Venus draws it per trajectory: ``int(random() * 10 - 5)`` for ``j`` = 5), at least 1."""
    if jitter <= 0:
        return max(1, max_turns)
    return max(1, max_turns + int(rng.random() * 2 * jitter - jitter))


def with_prompt_date(prompt: str, current_date: str) -> str:
    """``prompt`` with the date of its last ``Current date: YYYY-MM-DD`` line replaced (DR-Venus's
    RL prompt carries a fixed one); ValueError when it has none."""
    import datetime as _dt

    _dt.date.fromisoformat(current_date)
    found = list(_DATE_LINE.finditer(prompt))
    if not found:
        raise ValueError("the system prompt has no 'Current date: YYYY-MM-DD' line to set")
    start, end = found[-1].span(1)
    return prompt[:start] + current_date + prompt[end:]


class CompletionCutoff:
    """DR-Venus's completion cut-off (``ASYNC_COMPLETION_CUTOFF``): once ``ratio`` of a batch's
    trajectories have finished, the others are told the budget is reached and answer now.

    ``total`` known (the local trainer: the step's trajectories): the ratio is of ``total``.
    ``total`` None (verl's agent-loop worker, which runs its share of a step at once): a batch
    is a wave of trajectories, counted as they :meth:`start`; a wave begins when one starts while
    none is running. ``ratio`` 0 or None: never."""

    def __init__(self, ratio: float | None, total: int | None = None) -> None:
        self.ratio = ratio if ratio and ratio > 0 else None
        self.total = total
        self.started = self.done = self.running = 0
        self.triggered = False

    def start(self) -> None:
        if self.running == 0 and self.total is None:  # a new wave (the previous one is done)
            self.started = self.done = 0
            self.triggered = False
        self.running += 1
        self.started += 1

    def finish(self) -> None:
        self.running = max(0, self.running - 1)
        self.done += 1
        total = self.total if self.total is not None else self.started
        if self.ratio is not None and not self.triggered and total \
                and self.done / total >= self.ratio:
            self.triggered = True
            log.info("completion cut-off: %d of %d trajectories done (%.0f%%); the other %d "
                     "answer now", self.done, total, 100 * self.ratio, total - self.done)


def refusal_text(texts: RLTexts, turn: EnvTurn) -> str | None:
    """What a call that cannot run gets back: DR-Venus's tool server's own texts for a tool it
    does not route and for a call without a tool's fields; drvenus's reason for a value our
    tools cannot take; None for a call that runs."""
    if turn.problem == "unknown_tool":
        return texts.unknown_tool_text(turn.call_name)
    if turn.problem == "missing_arguments" and turn.call_name in texts.bad_arguments:
        return texts.bad_arguments[turn.call_name]
    if turn.kind == "tool_call" and turn.call is None:
        return str(turn.call_error)
    return None


@dataclass(frozen=True)
class EnvConfig:
    """One trajectory's environment: DR-Venus's texts and drvenus's rollout settings."""

    texts: RLTexts
    system_prompt: str
    context_limit: int  # prompt tokens after which the context notice is sent
    sampling: SamplingParams
    attempts: int  # samples per turn (robust mode: retries + 1)
    tool_timeout: float
    time_limit: float


class _Trajectory:
    def __init__(self, model: ChatModel, tools: ToolExecutor, cfg: EnvConfig, question: str,
                 max_turns: int, cutoff: CompletionCutoff | None,
                 prompt: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.model, self.tools, self.cfg = model, tools, cfg
        self.question, self.max_turns, self.cutoff = question, max_turns, cutoff
        self.messages: list[dict[str, str]] = (
            protocol.initial_messages(question, cfg.system_prompt) if prompt is None
            else row_messages(prompt, cfg.system_prompt))
        self.start = time.monotonic()
        self.turns = self.parse_errors = self.tool_calls = self.dedups = 0
        self.calls_made = 0
        self.seen: set[str] = set()
        self.was_cutoff = False
        self.last_error: str | None = None
        self.retries = {"repetition": 0, "parse": 0, "dedup": 0}
        parts = getattr(model, "parts", None)
        self.prefilled_think = bool(getattr(parts, "prefilled_think", False))

    # -- helpers ---------------------------------------------------------------------------

    def prompt_tokens(self) -> int:
        exact = getattr(self.model, "prompt_length", None)
        if callable(exact):
            return int(exact(self.messages))
        return sum(self.model.count_tokens(m["content"]) + MESSAGE_OVERHEAD_TOKENS
                   for m in self.messages)

    def _params(self) -> SamplingParams:
        p = self.cfg.sampling
        if p.seed is not None:
            p = replace(p, seed=p.seed + self.calls_made)
        self.calls_made += 1
        return p

    def _replace_last(self, content: str) -> None:
        self.messages[-1] = {"role": "user", "content": content}

    def record(self, termination: Termination, prediction: str | None = None) -> ResultRecord:
        if prediction is None:
            prediction = "No answer found"
            for m in reversed(self.messages):
                if m["role"] == "assistant":
                    prediction = protocol.extract_answer(m["content"]) or m["content"].strip() \
                        or prediction
                    break
        extra: dict[str, Any] = {"cutoff": self.was_cutoff, "turn_limit": self.max_turns}
        if any(self.retries.values()):
            extra["robust_retries"] = dict(self.retries)
        return ResultRecord(
            question=self.question, messages=self.messages, prediction=prediction,
            termination=termination, turns=self.turns, parse_error_count=self.parse_errors,
            tool_call_count=self.tool_calls, dedup_count=self.dedups,
            elapsed_seconds=round(time.monotonic() - self.start, 3),
            error=self.last_error if not termination.startswith("answered") else None,
            extra=extra,
        )

    # -- one turn --------------------------------------------------------------------------

    async def sample(self) -> EnvTurn:
        """Sample the turn (robust mode: again on a repetitive tail, a malformed turn or a
        repeated call, all but the last attempt)."""
        attempts = max(1, self.cfg.attempts)
        turn = EnvTurn("malformed", "")
        for attempt in range(attempts):
            last = attempt == attempts - 1
            gen = await self.model.generate(self.messages, self._params())
            raw = gen.text or ""
            if not last and is_repetitive(raw):
                self.retries["repetition"] += 1
                continue
            turn = classify_turn(fix_tags(raw, self.prefilled_think))
            if not last and turn.kind == "malformed":
                self.retries["parse"] += 1
                continue
            if not last and turn.call_key is not None and turn.call_key in self.seen:
                self.retries["dedup"] += 1
                continue
            break
        return turn

    async def execute(self, turn: EnvTurn) -> str:
        if turn.call_key is not None:
            self.seen.add(turn.call_key)
        refused = refusal_text(self.cfg.texts, turn)
        if refused is not None:
            return refused
        try:
            return str(await asyncio.wait_for(self.tools.call(turn.call),
                                              timeout=self.cfg.tool_timeout))
        except TimeoutError:
            return self.cfg.texts.timeout_text(self.cfg.tool_timeout)
        except Exception as exc:  # a tool that raised: DR-Venus's error text, the run goes on
            return self.cfg.texts.error_text(exc)

    async def run(self) -> ResultRecord:
        texts = self.cfg.texts
        termination: Termination = "max_steps"
        for step in range(self.max_turns):
            is_last = False
            reason: str | None = None
            if step > 0 and self.prompt_tokens() > self.cfg.context_limit:
                self._replace_last(texts.context_limit)
                is_last, reason = True, "context"
            if not is_last and self.cutoff is not None and self.cutoff.triggered:
                is_last, reason, self.was_cutoff = True, "cutoff", True
                if step == 0:
                    first = self.messages[-1]
                    self.messages[-1] = {"role": first["role"],
                                         "content": first["content"] + CUTOFF_JOIN + texts.cutoff}
                else:
                    self._replace_last(texts.cutoff)
            if step == self.max_turns - 1 and not is_last:
                is_last, reason = True, "steps"
                if step > 0:
                    self._replace_last(texts.step_limit)
            try:
                turn = await self.sample()
            except LLMError as exc:
                self.last_error = str(exc)
                return self.record("token_limit_no_answer" if exc.context_overflow
                                   else "llm_error")
            self.messages.append({"role": "assistant", "content": turn.content})
            self.turns += 1
            if turn.kind == "answer" or is_last:
                answer = first_answer(turn.content)
                prediction = answer.strip() if answer is not None else None
                if reason == "context":
                    termination = "answered_token_limit" if answer else "token_limit_no_answer"
                elif reason in ("steps", "cutoff"):
                    termination = "answered_max_steps" if answer else "max_steps"
                else:
                    termination = "answered"
                return self.record(termination, prediction)
            if turn.kind == "malformed":
                self.parse_errors += 1
                self.messages.append({"role": "user", "content": texts.malformed})
                continue
            self.tool_calls += 1
            body = await self.execute(turn)
            self.messages.append({"role": "user", "content": wrap_tool_response(body)})
        return self.record(termination)  # max_turns < 1 cannot happen (turn_limit >= 1)


def row_messages(prompt: Sequence[Mapping[str, Any]], system_prompt: str) -> list[dict[str, Any]]:
    """A data row's own prompt messages, as DR-Venus's RL loop starts from them: all kept (its
    system message and extra messages too), the environment's system prompt put first only when
    the row has no system message."""
    messages = [dict(m) for m in prompt]
    if not any(m.get("role") == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


async def run_trajectory(model: ChatModel, tools: ToolExecutor, cfg: EnvConfig, question: str,
                         *, max_turns: int, cutoff: CompletionCutoff | None = None,
                         prompt: Sequence[Mapping[str, Any]] | None = None) -> ResultRecord:
    """One trajectory in DR-Venus's RL environment (see the module doc). ``prompt``: the data
    row's own messages (verl's ``raw_prompt``, :func:`row_messages`), else the system prompt and
    ``question``. Never raises for run-time failures: they end as a termination
    (``llm_error``, ``timeout``, ``exception``)."""
    if not question or not question.strip():
        raise ValueError("the question is empty")
    state = _Trajectory(model, tools, cfg, question, max(1, max_turns), cutoff, prompt)
    try:
        return await asyncio.wait_for(state.run(), timeout=cfg.time_limit)
    except TimeoutError:
        state.last_error = f"time limit of {cfg.time_limit:g}s reached"
        return state.record("timeout")
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # recorded, never raised to the caller
        log.exception("rollout failed")
        state.last_error = f"{type(exc).__name__}: {exc}"
        return state.record("exception")


def env_config(texts: RLTexts, *, system_prompt: str | None, current_date: str | None,
               max_model_len: int, max_new_tokens: int, sampling: SamplingParams,
               attempts: int, tool_timeout: float, time_limit: float) -> EnvConfig:
    """The environment of a run: DR-Venus's RL system prompt unless a prompt is given (its date
    set to ``current_date`` when one is given), the context notice at ``max_model_len -
    max_new_tokens`` prompt tokens (DR-Venus: ``max_len - response_length``)."""
    prompt = system_prompt if system_prompt is not None else texts.system_prompt
    if current_date and system_prompt is None:
        prompt = with_prompt_date(prompt, current_date)
    limit = max(1, max_model_len - max_new_tokens)
    return EnvConfig(texts=texts, system_prompt=prompt, context_limit=limit, sampling=sampling,
                     attempts=attempts, tool_timeout=tool_timeout, time_limit=time_limit)


def is_plain_user(message: Mapping[str, Any]) -> bool:
    """A user message that is not a ``<tool_response>`` frame: a new query to a Qwen3 template."""
    content = str(message.get("content", ""))
    return message.get("role") == "user" and not (
        content.startswith(protocol.TOOL_RESPONSE_OPEN)
        and content.endswith(protocol.TOOL_RESPONSE_CLOSE))

__all__ = ["CUTOFF_JOIN", "CompletionCutoff", "EnvConfig", "EnvTurn", "classify_turn",
           "env_config", "fix_tags", "is_plain_user", "refusal_text", "row_messages",
           "run_trajectory", "turn_limit", "with_prompt_date"]
