"""The run registry shared by the web page, ``/v1`` and MCP ``deep_research``.

Each run has an id; its trace events are kept in memory and appended, as they happen, to
``<runs dir>/<id>.jsonl`` (the same JSONL as ``drvenus ask --trace``), so a client can
reconnect to a running stream, fetch a finished result, and finished runs outlive the server.
At most ``max_running`` runs go on at once; ``max_waiting`` more may wait for a slot; beyond
that :class:`Busy`. A run can be stopped (it ends as ``interrupted``). A Heavy-mode run
(``Choice.heavy``) is one run here: its N parallel runs' events (tagged ``heavy_run``) and then
the final answer's, in one list and one file.

Every face starts runs through :meth:`RunRegistry.start`, so one rule holds for every question
(:func:`check_question`): not empty, at most :data:`MAX_QUESTION_CHARS` characters, valid Unicode
(a lone surrogate would make the run unwritable and its listing unanswerable).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from drvenus.agent import TraceEvent, TraceWriter
from drvenus.agent.events import read_events
from drvenus.agent.record import ResultRecord
from drvenus.net.server import Busy  # every run slot taken and the waiting line full
from drvenus.protocol import DRVENUS_TEXTS, ProtocolTexts
from drvenus.serve.agents import AgentPool, Choice
from drvenus.serve.server import DEFAULT_MAX_RUNNING, DEFAULT_MAX_WAITING
from drvenus.text import counted, one_line

log = logging.getLogger(__name__)

RunStatus = Literal["queued", "running", "done", "lost"]
Origin = Literal["page", "v1", "mcp"]  # the face a run was started from
ORIGINS: tuple[str, ...] = Origin.__args__  # type: ignore[attr-defined]
_SURROGATE = re.compile("[\ud800-\udfff]")  # in a str, always a lone one
RUN_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z_-]{0,63}$")
DEFAULT_KEEP = 200
HEARTBEAT_SECONDS = 15.0
MAX_QUESTION_CHARS = 8000


def unknown_run(run_id: str) -> str:
    """The plain sentence for a run id this server does not know: the id named only when it
    is one (a link's garbled or hostile text is not echoed back)."""
    if isinstance(run_id, str) and RUN_ID.match(run_id):
        return f"no run {run_id} on this server (a wrong id, or a run forgotten since)"
    return "no run with that id on this server (a run id is letters, digits, - and _)"


class BadQuestion(ValueError):
    """A question no run is started for; ``status``: the HTTP status that says why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def check_question(question: str) -> str:
    """``question`` without surrounding space; :class:`BadQuestion` when it is empty, over
    :data:`MAX_QUESTION_CHARS` characters or not valid Unicode."""
    if not isinstance(question, str) or not question.strip():
        raise BadQuestion("the question is empty")
    if len(question) > MAX_QUESTION_CHARS:
        raise BadQuestion(
            f"the question is over {MAX_QUESTION_CHARS} characters ({len(question)})", 413
        )
    try:
        question.encode("utf-8")
    except UnicodeEncodeError:
        raise BadQuestion(
            "the question holds a lone surrogate (such as \\ud800), not valid Unicode"
        ) from None
    return question.strip()


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(4)


def valid_text(event: TraceEvent) -> TraceEvent:
    """``event`` with every lone surrogate in its data (a model's or a page's odd output)
    replaced by U+FFFD, so that the run can be written, listed and streamed as UTF-8."""
    text = json.dumps(event.data, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return replace(event, data=json.loads(_SURROGATE.sub("\ufffd", text)))
    return event


@dataclass
class Run:
    """One research run and its events (dicts, as written to its trace file)."""

    id: str
    question: str
    choice: Choice = field(default_factory=Choice)
    created: float = field(default_factory=time.time)
    events: list[dict[str, Any]] = field(default_factory=list)
    status: RunStatus = "queued"
    origin: str = "page"
    owner: str | None = None  # the page's visitor who started it (their cookie's value)
    # whose fixed words its views read (notices, failure frames): the pool's profiles
    texts: tuple[ProtocolTexts, ...] = (DRVENUS_TEXTS,)
    task: asyncio.Task[None] | None = None
    writer: TraceWriter | None = None
    _wake: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def finished(self) -> bool:
        return self.status in ("done", "lost")

    @property
    def record(self) -> dict[str, Any] | None:
        """The result record once the run is over (not one of Heavy mode's runs')."""
        last = self.events[-1] if self.events else None
        if last is not None and last.get("type") == "finished" and "heavy_run" not in last["data"]:
            return last["data"].get("record")
        return None

    def add(self, event: TraceEvent) -> None:
        """Keep an event, write it to the run's file and wake the followers."""
        event = valid_text(event)
        if self.writer is not None:
            try:
                self.writer(event)
            except (OSError, ValueError):  # a full disk must not kill the run
                log.exception("run %s: could not write its trace; continuing in memory", self.id)
                self.writer = None
        self.events.append(event.to_dict())
        self._notify()

    def _notify(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    def end(self) -> None:
        self.status = "done"
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self._notify()

    async def follow(
        self, after: int = -1, heartbeat: float = HEARTBEAT_SECONDS
    ) -> AsyncIterator[tuple[int, dict[str, Any]] | None]:
        """(index, event) for every event after index ``after``, live until the run ends;
        None every ``heartbeat`` seconds without news (for keep-alives)."""
        i = max(after + 1, 0)
        while True:
            while i < len(self.events):
                yield i, self.events[i]
                i += 1
            if self.finished:
                return
            wake = self._wake
            try:
                await asyncio.wait_for(wake.wait(), heartbeat)
            except TimeoutError:
                yield None

    async def wait(self) -> dict[str, Any] | None:
        """The result record once the run has ended."""
        async for _ in self.follow(len(self.events) - 1):
            pass
        return self.record

    def summary(self) -> dict[str, Any]:
        record = self.record or {}
        return {
            "id": self.id,
            "question": self.question,
            "status": self.status,
            "origin": self.origin,
            "created": self.created,
            "events": len(self.events),
            "termination": record.get("termination"),
            "prediction": record.get("prediction"),
        }


class RunRegistry:
    """Starts, stores, finds and stops runs (see the module doc)."""

    def __init__(
        self,
        pool: AgentPool,
        runs_dir: Path | None = None,
        *,
        max_running: int = DEFAULT_MAX_RUNNING,
        max_waiting: int = DEFAULT_MAX_WAITING,
        keep: int = DEFAULT_KEEP,
        notify: Callable[[str], None] | None = None,
    ) -> None:
        if max_running < 1 or max_waiting < 0:
            raise ValueError("max_running must be >= 1 and max_waiting >= 0")
        self.pool, self.runs_dir = pool, runs_dir
        self.max_running, self.max_waiting, self.keep = max_running, max_waiting, keep
        self.notify = notify  # the operator's console: a line per run started and finished
        self._runs: dict[str, Run] = {}
        self._sem: asyncio.Semaphore | None = None
        if runs_dir is not None:
            runs_dir.mkdir(parents=True, exist_ok=True)

    @property
    def active(self) -> int:
        return sum(1 for run in self._runs.values() if not run.finished)

    def start(self, question: str, choice: Choice | None = None, *, origin: str = "page",
              owner: str | None = None) -> Run:
        """Queue a run started from ``origin`` (by the page's visitor ``owner``);
        :class:`BadQuestion` (see :func:`check_question`), ValueError for a bad choice, Busy
        when full."""
        question = check_question(question)
        choice = self.pool.check(choice or Choice())
        if self.active >= self.max_running + self.max_waiting:
            raise Busy(f"{self.active} runs are already going on or waiting")
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.max_running)
        run = Run(new_run_id(), question, choice, origin=origin, owner=owner,
                  texts=self.pool.texts)
        if self.runs_dir is not None:
            try:
                run.writer = TraceWriter(str(self.runs_dir / f"{run.id}.jsonl"))
            except OSError:
                log.exception("cannot write run files in %s; keeping run %s in memory",
                              self.runs_dir, run.id)
        self._runs[run.id] = run
        run.task = asyncio.create_task(self._go(run), name=f"drvenus-run-{run.id}")
        self._forget_old()
        return run

    async def _go(self, run: Run) -> None:
        assert self._sem is not None
        try:
            async with self._sem:
                run.status = "running"
                run._notify()
                self._say(f"run {run.id} started: {one_line(run.question, 80)}")
                agent = await self.pool.agent(run.choice)
                label = self.pool.label_of(self.pool.check(run.choice).model or "")

                def add(event: TraceEvent) -> None:
                    if event.type == "started":  # the preset's name, never the server's URL
                        event.data.update(model=label, origin=run.origin, owner=run.owner)
                    run.add(event)

                await agent.run(run.question, add)
        except asyncio.CancelledError:
            if run.record is None:  # stopped while waiting or while the model was built
                self._fail(run, "interrupted", "stopped before the research began")
        except Exception as exc:  # a model or corpus that cannot be built, a bad config
            log.exception("run %s failed", run.id)
            self._fail(run, "exception", f"{type(exc).__name__}: {exc}")
        finally:
            run.end()
            record = run.record or {}
            why = f" ({one_line(record['error'], 300)})" if record.get("error") else ""
            self._say(f"run {run.id} finished: {record.get('termination', 'no record')}{why}, "
                      f"{counted(record.get('tool_call_count', 0), 'tool call')}, "
                      f"{record.get('elapsed_seconds', 0):.1f} s")

    def _say(self, line: str) -> None:
        log.info("%s", line)
        if self.notify is not None:
            try:
                self.notify(line)
            except Exception:  # a console that cannot print must not end the run
                log.exception("could not report a run")

    @staticmethod
    def _fail(run: Run, termination: str, error: str) -> None:
        run.add(TraceEvent("error", 0, {"kind": termination, "message": error, "last": True}))
        record = ResultRecord(
            run.question, [], "No answer found", termination, error=error  # type: ignore[arg-type]
        )
        run.add(TraceEvent("finished", 0, {"record": record.to_dict()}))

    def get(self, run_id: str) -> Run | None:
        """A run in memory, else one read back from its file (None when unknown)."""
        run = self._runs.get(run_id)
        if run is not None or self.runs_dir is None or not RUN_ID.match(run_id):
            return run
        path = self.runs_dir / f"{run_id}.jsonl"
        if not path.is_file():
            return None
        try:
            events = read_events(path)
        except (OSError, ValueError):
            log.exception("cannot read run file %s", path)
            return None
        run = Run(run_id, "", created=path.stat().st_mtime, events=events,
                  texts=self.pool.texts)
        run.status = "done" if run.record is not None else "lost"
        started = (next((e for e in events if e.get("type") == "started"), None) or {}).get(
            "data") or {}
        run.question = started.get("question", "") or str((run.record or {}).get("question", ""))
        origin, owner = started.get("origin"), started.get("owner")
        run.origin = origin if origin in ORIGINS else "page"
        run.owner = owner if isinstance(owner, str) else None
        return run

    def list(self, limit: int = 50, *, everyone: bool = True, owner: str | None = None
             ) -> list[dict[str, Any]]:
        """The newest runs (in memory, then the newest files), newest first: all of them
        (``/v1`` and MCP runs too), or, ``everyone`` False, those the page's visitor ``owner``
        started from the page."""
        def shown(run: Run) -> bool:
            return everyone or (owner is not None and run.origin == "page"
                                and run.owner == owner)

        runs = {run.id: run for run in self._runs.values() if shown(run)}
        if self.runs_dir is not None and len(runs) < limit:
            files = sorted(self.runs_dir.glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
            for path in reversed(files[-limit * 4:]):  # a bounded look back at the files
                if len(runs) >= limit:
                    break
                if path.stem not in runs and (run := self.get(path.stem)) is not None \
                        and shown(run):
                    runs[run.id] = run
        ordered = sorted(runs.values(), key=lambda r: r.created, reverse=True)
        return [run.summary() for run in ordered[:limit]]

    async def cancel(self, run_id: str) -> bool:
        """Stop a run; False when it is unknown or already over."""
        run = self._runs.get(run_id)
        if run is None or run.finished or run.task is None:
            return False
        run.task.cancel()
        await asyncio.gather(run.task, return_exceptions=True)
        self._stopped(run)
        return True

    def _stopped(self, run: Run) -> None:
        """Close a run whose task was cancelled before its body ever ran."""
        if not run.finished:
            self._fail(run, "interrupted", "stopped before the research began")
            run.end()

    def _forget_old(self) -> None:
        """Keep at most ``keep`` finished runs in memory (their files stay)."""
        done = [run for run in self._runs.values() if run.finished]
        for run in sorted(done, key=lambda r: r.created)[: max(0, len(done) - self.keep)]:
            del self._runs[run.id]

    async def aclose(self) -> None:
        """Stop every run that is still going on (they end as ``interrupted``)."""
        runs = [run for run in self._runs.values() if run.task and not run.task.done()]
        for run in runs:
            assert run.task is not None
            run.task.cancel()
        await asyncio.gather(*(run.task for run in runs if run.task), return_exceptions=True)
        for run in runs:
            self._stopped(run)


__all__ = [
    "MAX_QUESTION_CHARS",
    "ORIGINS",
    "BadQuestion",
    "Busy",
    "Run",
    "RunRegistry",
    "RunStatus",
    "check_question",
    "new_run_id",
    "unknown_run",
]
