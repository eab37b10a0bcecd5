"""DR-Venus's RL rollout environment (``drvenus rl --protocol dr-venus``), in drvenus's own code.

DR-Venus trains in the loop of its verl agent loop (``RL/scrl/llm_agent/dr_agent_loop.py``,
``DRAgentLoop.run``), which differs from its inference loop. Here it is not a second loop:
:func:`run_trajectory` runs the agent loop (:mod:`drvenus.agent.loop`) with
:class:`DrVenusHooks` (:mod:`drvenus.agent.hooks`), with its texts read at run time from the
pinned files (:mod:`drvenus.reference.dr_venus_rl`), so a rollout emits the same trace events
as inference and takes the same context strategies (``none`` unless set).
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

Then the loop samples the turn (``robust``: up to ``attempts`` samples, again on a repetitive
tail, a malformed turn or a call already made; a model error ends the trajectory), its tags are
fixed as DR-Venus fixes them (:func:`fix_tags`) and it is read as DR-Venus reads it
(:func:`classify_turn`, :func:`drvenus.protocol.dr_venus.rl_reader`): the last turn or
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from drvenus.agent.context import ContextPolicy
from drvenus.agent.events import EventCallback
from drvenus.agent.hooks import RunHooks, RunView, ToolExecutor
from drvenus.agent.loop import AgentConfig, ResearchAgent
from drvenus.agent.record import ResultRecord, Termination
from drvenus.llm.base import ChatModel, SamplingParams
from drvenus.protocol import ParsedTurn, ProtocolTexts
from drvenus.protocol.dr_venus import EnvTurn, classify_turn, first_answer, fix_tags, rl_reader
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
    """What a call that cannot run gets back (:meth:`RLTexts.refusal`)."""
    return texts.refusal(turn)


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
    context: ContextPolicy = field(default_factory=ContextPolicy)  # none: DR-Venus's

    def agent_config(self, max_turns: int, prefilled_think: bool) -> AgentConfig:
        """The agent loop's settings of a trajectory of ``max_turns`` turns (the last one
        announced by :class:`DrVenusHooks`): no backoff between samples, DR-Venus's RL reader."""
        return AgentConfig(
            max_steps=max_turns, max_context_tokens=self.context_limit,
            time_limit=self.time_limit, max_attempts=max(1, self.attempts), backoff_base=0.0,
            max_unreadable_turns=0,  # a malformed turn is the rollout's to keep, not an error
            sampling=self.sampling, system_prompt=self.system_prompt,
            reader=rl_reader(prefilled_think, self.texts.refusal), context=self.context,
            compaction_recap=False,  # DR-Venus's environment has no such note
        )


class DrVenusHooks(RunHooks):
    """DR-Venus's RL environment as hooks of the agent loop (see the module doc): a model
    error or a full window ends the trajectory, an empty sample is a malformed turn, the
    notices are plain user messages, the budgets are DR-Venus's (not fitted)."""

    retry_model_errors = False
    read_empty = True
    raw_repetition = True
    fit_window = False

    def __init__(self, cfg: EnvConfig, max_turns: int, cutoff: CompletionCutoff | None = None,
                 prompt: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.cfg, self.texts, self.max_turns = cfg, cfg.texts, max(1, max_turns)
        self.cutoff, self.prompt = cutoff, prompt
        self.was_cutoff = False

    def messages(self, question: str, system: str) -> list[dict[str, str]]:
        if self.prompt is None:
            return super().messages(question, system)
        return row_messages(self.prompt, system)

    async def before_turn(self, run: RunView) -> str | None:
        step, texts = run.step, self.texts
        if step > 0 and prompt_tokens(run.model, run.messages) > self.cfg.context_limit:
            await run.replace_last(texts.context_limit, reason="context")
            return "context"
        if self.cutoff is not None and self.cutoff.triggered:
            self.was_cutoff = True
            if step == 0:
                first = run.messages[-1]
                await run.replace_last(first["content"] + CUTOFF_JOIN + texts.cutoff,
                                       first["role"], reason="cutoff")
            else:
                await run.replace_last(texts.cutoff, reason="cutoff")
            return "cutoff"
        if step == self.max_turns - 1:
            if step > 0:
                await run.replace_last(texts.step_limit, reason="steps")
            return "steps"
        return None

    def last_turn(self, reason: str, parsed: ParsedTurn) -> tuple[Termination, str | None]:
        answer = first_answer(parsed.content)
        termination: Termination
        if reason == "context":
            termination = "answered_token_limit" if answer else "token_limit_no_answer"
        else:
            termination = "answered_max_steps" if answer else "max_steps"
        return termination, answer.strip() if answer is not None else None

    def context_full(self, tokens: int, budget: int) -> bool:
        return False  # checked before the next turn, on the exact prompt (before_turn)

    def malformed(self, texts: ProtocolTexts) -> str:
        return self.texts.malformed

    async def call_tool(self, tools: ToolExecutor, parsed: ParsedTurn) -> Any:
        if parsed.error is not None:  # a call that cannot run: the tool server's answer
            return parsed.error
        assert parsed.tool_call is not None
        timeout = self.cfg.tool_timeout
        try:
            return str(await asyncio.wait_for(tools.call(parsed.tool_call), timeout=timeout))
        except TimeoutError:
            return self.texts.timeout_text(timeout)
        except Exception as exc:  # a tool that raised: DR-Venus's error text, the run goes on
            return self.texts.error_text(exc)

    def exhausted(self) -> Termination | None:
        return "token_limit_no_answer"

    def extra(self, retries: dict[str, int]) -> dict[str, Any]:
        extra: dict[str, Any] = {"cutoff": self.was_cutoff, "turn_limit": self.max_turns}
        robust = {name: retries.get(kind, 0) for name, kind in _RETRY_NAMES.items()}
        if any(robust.values()):
            extra["robust_retries"] = robust
        return extra


# the record's names of the loop's re-sample reasons
_RETRY_NAMES = {"repetition": "repetition", "parse": "parse_error", "dedup": "duplicate_tool_call"}


def prompt_tokens(model: Any, messages: Sequence[Mapping[str, Any]]) -> int:
    """The prompt's tokens: the recorder's exact count, else the model's estimate."""
    exact = getattr(model, "prompt_length", None)
    if callable(exact):
        return int(exact(messages))
    return sum(model.count_tokens(m["content"]) + MESSAGE_OVERHEAD_TOKENS for m in messages)


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
                         prompt: Sequence[Mapping[str, Any]] | None = None,
                         on_event: EventCallback | None = None) -> ResultRecord:
    """One trajectory in DR-Venus's RL environment: the agent loop with :class:`DrVenusHooks`
    (see the module doc). ``prompt``: the data row's own messages (verl's ``raw_prompt``,
    :func:`row_messages`), else the system prompt and ``question``; ``on_event``: the run's
    trace events. Never raises for run-time failures: they end as a termination
    (``llm_error``, ``timeout``, ``exception``)."""
    if not question or not question.strip():
        raise ValueError("the question is empty")
    hooks = DrVenusHooks(cfg, max_turns, cutoff, prompt)
    parts = getattr(model, "parts", None)
    config = cfg.agent_config(hooks.max_turns, bool(getattr(parts, "prefilled_think", False)))
    return await ResearchAgent(model, tools, config).run_one(question, on_event, hooks=hooks)


def env_config(texts: RLTexts, *, system_prompt: str | None, current_date: str | None,
               max_model_len: int, max_new_tokens: int, sampling: SamplingParams,
               attempts: int, tool_timeout: float, time_limit: float,
               context: ContextPolicy | None = None) -> EnvConfig:
    """The environment of a run: DR-Venus's RL system prompt unless a prompt is given (its date
    set to ``current_date`` when one is given), the context notice at ``max_model_len -
    max_new_tokens`` prompt tokens (DR-Venus: ``max_len - response_length``)."""
    prompt = system_prompt if system_prompt is not None else texts.system_prompt
    if current_date and system_prompt is None:
        prompt = with_prompt_date(prompt, current_date)
    limit = max(1, max_model_len - max_new_tokens)
    return EnvConfig(texts=texts, system_prompt=prompt, context_limit=limit, sampling=sampling,
                     attempts=attempts, tool_timeout=tool_timeout, time_limit=time_limit,
                     context=context or ContextPolicy())


__all__ = ["CUTOFF_JOIN", "CompletionCutoff", "DrVenusHooks", "EnvConfig", "EnvTurn",
           "classify_turn", "env_config", "fix_tags", "prompt_tokens", "refusal_text",
           "row_messages", "run_trajectory", "turn_limit", "with_prompt_date"]
