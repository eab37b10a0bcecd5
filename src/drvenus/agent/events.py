"""Structured trace events: one stream for the CLI, traces on disk, the web demo and evaluation.

A run is a replayable record. Every change to the conversation is an event that carries the
message it adds (``data["message"]``):

- ``started``: the conversation's first messages (system prompt, question) in ``messages``
- ``turn``: an assistant turn appended (``kind``: tool_call / answer / error; ``forced``)
- ``tool_result``: the tool response appended (``name``, the raw ``content``)
- ``format_error``: the error reply appended after a turn that could not be used
- ``limit_notice``: the step or context limit notice; ``replace`` says whether it took the
  place of the last message (the newest tool response) or was appended
- ``compaction``: the context strategy freed room (:mod:`drvenus.agent.context`): ``strategy``,
  ``tokens_before`` / ``tokens_after``, and either the restarted conversation in ``messages``
  (with the ``report``) or the indices in ``elided`` that now hold the stub ``message``, the
  ``dropped`` rounds after ``head``, and the ``recap`` message put after them
  (``recap_inserted``) or in place of the previous one

and :func:`replay_messages` rebuilds the final ``messages`` from them. The other events say
what happened without changing the conversation: ``step_started``, ``model_output`` (one per
sampled attempt, with token usage), ``tool_call``, ``answer``, ``error`` (retries and their
reasons) and ``finished`` (the result record). ``step`` is the index of the agent step the
event belongs to (0 for the first model turn); a forced answer at the step limit has
``step == max_steps``. Heavy mode's runs (:mod:`drvenus.agent.heavy`) tag their events with
``heavy_run`` (the run's index); :func:`split_runs` splits interleaved runs apart,
:func:`split_researches` keeps a Heavy research (its runs and its decision) together.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

from drvenus.agent.context import apply_compaction
from drvenus.jsonl import read_jsonl

log = logging.getLogger(__name__)

EventType = Literal[
    "started",
    "step_started",
    "model_output",
    "turn",
    "tool_call",
    "tool_result",
    "format_error",
    "limit_notice",
    "compaction",
    "answer",
    "error",
    "finished",
]
MESSAGE_EVENTS = frozenset({"turn", "tool_result", "format_error", "limit_notice"})


@dataclass(frozen=True)
class TraceEvent:
    """One thing that happened during a run. ``data`` is JSON-serialisable."""

    type: EventType
    step: int
    data: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


EventCallback = Callable[[TraceEvent], Awaitable[None] | None]


def replay_messages(events: Iterable[TraceEvent | Mapping[str, Any]]) -> list[dict[str, str]]:
    """The conversation a run's events describe (the events of ONE run, in order)."""
    messages: list[dict[str, str]] = []
    for event in events:
        kind = event.type if isinstance(event, TraceEvent) else event["type"]
        data = event.data if isinstance(event, TraceEvent) else event["data"]
        if kind == "started":
            messages = [dict(m) for m in data["messages"]]
        elif kind == "compaction":
            messages = apply_compaction(messages, data)
        elif kind in MESSAGE_EVENTS:
            message = dict(data["message"])
            if kind == "limit_notice" and data.get("replace"):
                messages[-1] = message
            else:
                messages.append(message)
    return messages


def split_runs(events: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Event dicts grouped into runs: each ``started`` event opens one. Heavy mode's runs
    interleave; their events carry ``heavy_run`` (the run's index) and are grouped by it."""
    runs: list[list[dict[str, Any]]] = []
    current: dict[Any, list[dict[str, Any]]] = {}  # the open run of each heavy_run tag
    for event in events:
        tag = (event.get("data") or {}).get("heavy_run")
        if event.get("type") == "started" or tag not in current:
            runs.append([])
            current[tag] = runs[-1]
        current[tag].append(event)
    return runs


def split_researches(events: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Event dicts grouped by research, each in its own order: a plain run, or Heavy mode's N
    runs (events tagged ``heavy_run``) with the final answer after them. A research ends with
    a ``finished`` event no ``heavy_run`` tags; one cut short (no such event) ends where the
    next begins (a plain run's ``started``, or a Heavy run's index seen again)."""
    researches: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    seen: set[Any] = set()  # the Heavy run indices that started in ``current``
    for event in events:
        data = event.get("data") or {}
        tag = data.get("heavy_run")
        if event.get("type") == "started" and current:
            plain = tag is None and not data.get("heavy")
            if plain or (tag is not None and tag in seen):
                researches.append(current)
                current, seen = [], set()
        if event.get("type") == "started" and tag is not None:
            seen.add(tag)
        current.append(event)
        if event.get("type") == "finished" and "heavy_run" not in data:
            researches.append(current)
            current, seen = [], set()
    if current:
        researches.append(current)
    return researches


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """The event dicts of a trace file (JSONL, as ``drvenus ask --trace`` writes), in order;
    ValueError for a line that is not JSON."""
    events = []
    for row in read_jsonl(path):
        if not row.ok:
            raise ValueError(f"{path}, line {row.lineno}: {row.error}")
        events.append(row.value)
    return events


def read_trace(path: str | Path) -> list[list[dict[str, Any]]]:
    """The runs in a trace file (JSONL of events, as ``drvenus ask --trace`` writes), each a
    list of event dicts from ``started`` to ``finished``."""
    return split_runs(read_events(path))


def event_line(event: TraceEvent | Mapping[str, Any]) -> str:
    """One event as a line of a trace file (JSON, newline-terminated)."""
    data = event.to_dict() if isinstance(event, TraceEvent) else event
    return json.dumps(data, ensure_ascii=False) + "\n"


def write_events(path: str | Path, events: Iterable[TraceEvent | Mapping[str, Any]]) -> Path:
    """A trace file of ``events`` (replaced when it exists; the RL trainers' step traces);
    :func:`read_trace` reads it back, ``drvenus serve`` replays it."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for event in events:
            fh.write(event_line(event))
    return out


class TraceWriter:
    """Writes every event as one JSON line to a file (``drvenus ask --trace``, the run traces of
    ``drvenus serve``); :func:`read_trace` reads them back.

    A path that cannot be opened raises here, before any work. A write that fails later (a
    full disk, a quota) never stops the run it traces: the writer stops writing, keeps the
    error in :attr:`error`, and its owner says so once (the run's answer is not lost)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.error: OSError | None = None  # the first write that failed
        self._fh: TextIO | None = open(path, "a", encoding="utf-8")  # closed in close()

    def __call__(self, event: TraceEvent) -> None:
        if self._fh is None:
            return
        try:
            self._fh.write(event_line(event))
            self._fh.flush()
        except OSError as exc:
            self._stop(exc)

    def _stop(self, exc: OSError) -> None:
        if self.error is None:
            self.error = exc
            log.debug("trace %s: a write failed, no more events written: %s", self.path, exc)
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()
            except OSError:  # the buffer's last flush fails the same way
                pass

    def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is None:
            return
        try:
            fh.close()
        except OSError as exc:
            self.error = self.error or exc
