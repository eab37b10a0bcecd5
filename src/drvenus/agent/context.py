"""Context strategies: what a run does when its conversation nears the context budget.

- ``none``: nothing; the run ends with the forced answer when the budget fills (DR-Venus).
- ``keep-last-k``: every tool response but the last ``keep_last`` becomes a one-line stub
  (:func:`drvenus.protocol.elided_tool_response`); the turns that asked for them stay, until
  the stubbed rounds themselves crowd the budget: then the oldest of them (the turn and its
  stub) go, down to half the threshold.
- ``summarise``: the model writes a report of what it has found, and the conversation restarts
  from the system prompt, the question and the report (ReSum's restartable state).

With a recap (drvenus's profile: ``AgentConfig.compaction_recap``; DR-Venus's has none), the
model is also told the searches and pages it already made that it no longer sees
(:func:`drvenus.protocol.recap`): all of them inside the report's message; once keep-last-k
drops turns, those of the dropped turns, in a message after the question that joins the head
(replaced, not repeated, by later compactions).

Compaction is rare and in large blocks: it happens only once the context passes ``compact_at``
of the budget, and then frees all it can at once, so between two compactions the prompt only
grows and a prefix cache (llama.cpp's slots, vLLM's prefix cache) re-evaluates just the new
messages. The system prompt and the question always stay first, and a report always opens with
the same words. When nothing more can be freed, the loop's budget check forces the answer, as
with ``none``. The loop applies a :class:`Compaction` and records it as a ``compaction`` trace
event (see :mod:`drvenus.agent.events`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from drvenus import protocol
from drvenus.config import CONTEXT_STRATEGIES, ContextStrategyName

# Tool responses kept whole by keep-last-k unless told otherwise.
DEFAULT_KEEP_LAST = 3
# Share of the context budget past which a strategy compacts.
DEFAULT_COMPACT_AT = 0.75
# A model window below this, and a quarter of the budget asked for or less, gets a warning:
# research fills it after a page or two (Ollama's default 2-4K context, a small -c).
SMALL_WINDOW = 8192

Messages = list[dict[str, str]]
# Writes the report of a conversation (the summary request already appended): the report, or
# None when the model could not write one.
Reporter = Callable[[Messages], Awaitable[str | None]]
# The tokens of a conversation, as the run counts them.
Counter = Callable[[Messages], int]
# The recap of the searches and pages a run made that are not in ``kept`` (the turns a
# compaction keeps after the head): drvenus.protocol.recap, or None when there are none.
Recapper = Callable[[Messages], str | None]


@dataclass(frozen=True)
class ContextPolicy:
    """Which strategy a run uses, and its knobs."""

    strategy: ContextStrategyName = "none"
    keep_last: int = DEFAULT_KEEP_LAST
    compact_at: float = DEFAULT_COMPACT_AT

    def __post_init__(self) -> None:
        if self.strategy not in CONTEXT_STRATEGIES:
            raise ValueError(
                f"unknown context strategy {self.strategy!r}; choose from "
                + ", ".join(CONTEXT_STRATEGIES)
            )
        if self.keep_last < 0:
            raise ValueError("keep_last must be 0 or more")
        if not 0 < self.compact_at <= 1:
            raise ValueError("compact_at must be in (0, 1]")


@dataclass(frozen=True)
class Compaction:
    """One compaction: the new conversation, and what changed (for the trace)."""

    strategy: str
    messages: Messages
    head: int  # leading messages that stay (a limit notice never takes their place)
    elided: tuple[int, ...] = ()  # keep-last-k: the indices now holding the stub
    dropped: int = 0  # keep-last-k: stubbed rounds (turn + stub) then removed after the head
    report: str | None = None  # summarise: the report the conversation restarts from
    # keep-last-k: the recap message put at ``head - 1`` (inserted there, or replacing the
    # previous compaction's), or None
    recap: dict[str, str] | None = None
    recap_inserted: bool = False

    def event_data(self) -> dict[str, Any]:
        """What the ``compaction`` event carries: enough to replay the conversation."""
        if self.report is not None:
            return {"strategy": self.strategy, "messages": [dict(m) for m in self.messages],
                    "report": self.report}
        stub = protocol.elided_tool_response()
        before = self.head - 1 if self.recap_inserted else self.head  # where rounds were dropped
        data = {"strategy": self.strategy, "elided": list(self.elided),
                "message": {"role": "user", "content": stub}, "head": before,
                "dropped": self.dropped}
        if self.recap is not None:
            data |= {"recap": dict(self.recap), "recap_inserted": self.recap_inserted}
        return data


def elide_old_tool_responses(
    messages: Messages, head: int, keep_last: int
) -> tuple[Messages, tuple[int, ...]]:
    """``messages`` with every tool response after ``head`` but the last ``keep_last`` replaced
    by the stub, and the indices replaced."""
    whole = [
        i for i in range(head, len(messages))
        if messages[i]["role"] == "user"
        and protocol.unwrap_tool_response(messages[i]["content"]) is not None
        and not protocol.is_elided(messages[i]["content"])
    ]
    drop = tuple(whole[: max(0, len(whole) - keep_last)])
    if not drop:
        return messages, ()
    stub = protocol.elided_tool_response()
    new = list(messages)
    for i in drop:
        new[i] = {"role": "user", "content": stub}
    return new, drop


def drop_elided_rounds(messages: Messages, head: int, fits: Callable[[Messages], bool]) -> int:
    """How many of the oldest rounds after ``head`` (an assistant turn and its stubbed
    response) must go for the rest to ``fit``: only stubbed rounds, oldest first."""
    n = 0
    while not fits([*messages[:head], *messages[head + 2 * n:]]):
        i = head + 2 * n
        if i + 1 >= len(messages) or messages[i]["role"] != "assistant" or not (
            protocol.is_elided(messages[i + 1]["content"])
        ):
            break
        n += 1
    return n


class ContextManager:
    """The strategy of one run: when to compact, and how."""

    def __init__(self, policy: ContextPolicy, budget: int) -> None:
        self.policy = policy
        self.threshold = int(budget * policy.compact_at)
        self.low_water = self.threshold // 2  # where keep-last-k's dropping of rounds stops
        self.count = 0  # compactions done
        self.exhausted = False  # summarise: the model could not write a report

    @property
    def active(self) -> bool:
        return self.policy.strategy != "none" and not self.exhausted

    def due(self, tokens: int) -> bool:
        """Whether a context of ``tokens`` should be compacted now."""
        return self.active and tokens > self.threshold

    async def compact(
        self, messages: Messages, head: int, report: Reporter, count: Counter,
        recap: Recapper | None = None,
    ) -> Compaction | None:
        """The compacted conversation, or None when nothing could be freed. ``recap``: writes
        what the model is told it already did, or None (no recap)."""
        if not self.active:
            return None
        if self.policy.strategy == "keep-last-k":
            new, elided = elide_old_tool_responses(messages, head, self.policy.keep_last)
            dropped = drop_elided_rounds(new, head, lambda m: count(m) <= self.low_water)
            if not elided and not dropped:
                return None
            new = [*new[:head], *new[head + 2 * dropped:]]
            note, inserted = None, False
            text = recap(new[head:]) if dropped and recap else None
            if text:  # turns that made calls left the model's view
                note = protocol.recap_message(text)
                if head and new[head - 1]["role"] == "user" and protocol.is_recap(
                    new[head - 1]["content"]
                ):
                    new[head - 1] = note
                else:
                    new.insert(head, note)
                    head, inserted = head + 1, True
            done = Compaction("keep-last-k", new, head, elided=elided, dropped=dropped,
                              recap=note, recap_inserted=inserted)
        else:
            if len(messages) <= head:  # nothing since the last restart
                return None
            text = await report([*messages, protocol.summary_request()])
            if not text:
                self.exhausted = True  # asking again would fail the same way; answer instead
                return None
            new = [*messages[:2], protocol.summary_message(text, recap([]) if recap else None)]
            done = Compaction("summarise", new, len(new), report=text)
            if count(new) > self.threshold:  # the report alone fills the budget: compacting
                self.exhausted = True  # again each step would only cost a report each time
        self.count += 1
        return done

    def extra(self) -> dict[str, Any]:
        """The record's ``extra`` fields of this run's compactions."""
        if not self.count:
            return {}
        return {"context_strategy": self.policy.strategy, "compactions": self.count}


def keep_last_warning(strategy: str | None, keep_last: int | None) -> str | None:
    """The warning for a ``keep_last`` that the run's strategy will not use, or None."""
    if keep_last is None or (strategy or "none") == "keep-last-k":
        return None
    return (f"--keep-last {keep_last} does nothing with --context-strategy {strategy or 'none'}"
            " (it is keep-last-k's): add --context-strategy keep-last-k, or drop --keep-last")


def small_window_warning(window: int | None, budget: int) -> str | None:
    """The warning for a model window far smaller than the context budget, or None."""
    if not window or window >= SMALL_WINDOW or window * 4 > budget:
        return None
    return (
        f"the model's context window is {window} tokens, far below the {budget}-token budget: "
        "a research run will end after a page or two. Give the server a larger context "
        "(Ollama: OLLAMA_CONTEXT_LENGTH or num_ctx; llama-server: -c; vLLM: --max-model-len), "
        "or use --context-strategy summarise"
    )


def apply_compaction(messages: Messages, data: dict[str, Any]) -> Messages:
    """The conversation after a ``compaction`` event's ``data`` (trace replay)."""
    if "messages" in data:
        return [dict(m) for m in data["messages"]]
    new = list(messages)
    for i in data.get("elided", []):
        new[i] = dict(data["message"])
    head, dropped = data.get("head", 0), data.get("dropped", 0)
    new = [*new[:head], *new[head + 2 * dropped:]]
    if "recap" in data:
        if data.get("recap_inserted"):
            new.insert(head, dict(data["recap"]))
        else:
            new[head - 1] = dict(data["recap"])
    return new
