"""Batch research runs: concurrent, append-only, resumable JSONL that loses nothing.

- The output file is locked (exclusively, non-blocking) for the whole run, so two runs can never
  write the same file; the second one fails at once with :class:`OutputLockedError`.
- A torn last line left by a crash is cut off before anything is appended.
- Each finished question is appended as one JSON line and fsync'd; an in-flight question whose
  run is cancelled (Ctrl-C) writes nothing.
- One item's unexpected failure becomes that item's ``exception`` row; it never ends the batch.
- A rerun skips items whose latest row is a finished outcome and retries those whose latest row
  failed (``llm_error``, ``tool_error``, ``exception``, ``interrupted``). Nothing is rewritten in
  place: the latest row of an id wins.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from drvenus.agent import FAILED_TERMINATIONS, ResearchAgent, ResultRecord, TraceEvent
from drvenus.jsonl import read_jsonl
from drvenus.questions import Question, normalize_id

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- the output file
class OutputLockedError(RuntimeError):
    """Another run holds the lock on the output file."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            f"{path} is locked by another drvenus run; wait for it to finish or use another output"
        )
        self.path = path


def iter_jsonl(fh: Iterable[bytes]) -> Iterator[dict[str, Any] | None]:
    """Every non-blank line of a binary JSONL stream: the object, or None for an unreadable line
    (e.g. a torn last line left by a crash)."""
    for row in read_jsonl(fh):
        yield row.value if row.ok else None


@dataclass
class ResultsState:
    """What an output file holds: the termination of each id's latest row."""

    latest: dict[str, str | None] = field(default_factory=dict)
    rows: int = 0
    bad_lines: int = 0

    def is_done(self, item_id: str) -> bool:
        """True when the id's latest row is a finished outcome (not a failed run)."""
        termination = self.latest.get(item_id)
        return isinstance(termination, str) and termination not in FAILED_TERMINATIONS

    def add(self, row: dict[str, Any] | None) -> None:
        item_id = normalize_id(row.get("id")) if row is not None else None
        if item_id is None:
            self.bad_lines += 1
            return
        self.rows += 1
        termination = row.get("termination")  # type: ignore[union-attr]
        self.latest[item_id] = termination if isinstance(termination, str) else None


def read_results(path: Path) -> ResultsState:
    """The state of an output file (the one reader used for resuming; a missing file is empty)."""
    state = ResultsState()
    if not path.exists():
        return state
    with path.open("rb") as fh:
        for row in iter_jsonl(fh):
            state.add(row)
    return state


_WIN_LOCK_OFFSET = 0x7FFFFFFE  # lock a byte past any real data, so readers are never blocked


def _lock(fh: IO[bytes]) -> bool:
    """Exclusive, non-blocking lock on the open file: False when someone else holds it
    (other failures, e.g. a file system without locks, raise OSError)."""
    if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
        import msvcrt

        pos = fh.tell()
        fh.seek(_WIN_LOCK_OFFSET)
        try:
            msvcrt.locking(fh.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        finally:
            fh.seek(pos)
        return True
    import fcntl

    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if isinstance(exc, BlockingIOError) or exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


def _unlock(fh: IO[bytes]) -> None:
    if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
        import msvcrt

        fh.seek(_WIN_LOCK_OFFSET)
        msvcrt.locking(fh.fileno(), msvcrt.LK_UNLCK, 1)
    else:
        import fcntl

        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


class ResultsFile:
    """The output JSONL, locked for as long as it is open; append-only, each row fsync'd.

    Opening it takes the lock (:class:`OutputLockedError` if another run holds it), cuts off a
    torn last line and reads the rows already there into :attr:`state`.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Unbuffered, append mode: each row goes to the file with os-level writes.
        self._fh: IO[bytes] = open(self.path, "a+b", buffering=0)  # see close()
        try:
            locked = _lock(self._fh)
        except OSError as exc:
            self._fh.close()
            raise OSError(f"cannot lock {self.path}: {exc}") from exc
        if not locked:
            self._fh.close()
            raise OutputLockedError(self.path)
        try:
            self.torn_bytes = self._repair_tail()
            self.state = read_results(self.path)  # a buffered reader; the lock byte is far away
            self._size = os.fstat(self._fh.fileno()).st_size
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def _repair_tail(self) -> int:
        """Cut off an unfinished last line; returns how many bytes were dropped."""
        fh = self._fh
        end = fh.seek(0, os.SEEK_END)
        if end == 0:
            return 0
        fh.seek(end - 1)
        if fh.read(1) == b"\n":
            return 0
        start, pos = 0, end
        while pos > 0:
            step = min(1 << 16, pos)
            pos -= step
            fh.seek(pos)
            newline = fh.read(step).rfind(b"\n")
            if newline >= 0:
                start = pos + newline + 1
                break
        fh.seek(start)
        tail = fh.read()
        if next(iter_jsonl([tail]), None) is not None:  # type: ignore[arg-type]
            self._write_all(b"\n")  # a complete row that only lacks its newline: keep it
            return 0
        fh.truncate(start)
        os.fsync(fh.fileno())
        log.warning("dropped a torn last line (%d bytes) from %s", end - start, self.path)
        return end - start

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = self._fh.write(view)
            view = view[written or 0 :]
        os.fsync(self._fh.fileno())

    def write(self, row: dict[str, Any]) -> None:
        """Append one row and fsync it. Raises (TypeError/ValueError for a row JSON cannot encode,
        OSError for the disk); a failed write leaves the file as it was."""
        data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        try:
            self._write_all(data)
        except BaseException:
            try:  # we hold the only lock: cutting back to the last full row is safe
                os.ftruncate(self._fh.fileno(), self._size)
            except OSError:
                log.exception("could not cut a partial row from %s", self.path)
            raise
        self._size += len(data)
        self.state.add(row)

    def close(self) -> None:
        if self._fh.closed:
            return
        try:
            _unlock(self._fh)
        except OSError:  # closing releases it anyway
            pass
        self._fh.close()

    def __enter__(self) -> ResultsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------- the batch
@dataclass
class Plan:
    """Which items a run does: ``todo`` (new and ``retry`` failed ones) and how many are done."""

    todo: list[Question]
    done: int = 0
    retry: int = 0


def plan(items: Iterable[Question], state: ResultsState) -> Plan:
    result = Plan(todo=[])
    for item in items:
        if state.is_done(item.id):
            result.done += 1
            continue
        if item.id in state.latest:
            result.retry += 1
        result.todo.append(item)
    return result


@dataclass
class BatchSummary:
    total: int = 0
    skipped: int = 0  # already done in the output
    retried: int = 0  # failed before, run again
    finished: int = 0  # rows written by this run
    failed: int = 0  # items of this run that ended with a failed termination (or were not saved)
    terminations: Counter = field(default_factory=Counter)
    elapsed: list[float] = field(default_factory=list)


def exception_record(question: str, exc: BaseException, context: str = "") -> ResultRecord:
    error = f"{type(exc).__name__}: {exc}"
    return ResultRecord(
        question=question,
        messages=[],
        prediction="No answer found",
        termination="exception",
        error=f"{context}: {error}" if context else error,
    )


def _row(item: Question, record: ResultRecord) -> dict[str, Any]:
    row: dict[str, Any] = {"id": item.id, **record.to_dict()}
    row.setdefault("question", item.question)
    if item.answer is not None:
        row["answer"] = item.answer
    if item.meta:
        row["meta"] = item.meta
    return row


OnDone = Callable[[Question, ResultRecord], None]
OnEvent = Callable[[Question, TraceEvent], None]


class BatchRun:
    """``workers`` tasks pull items from one queue, research each and append its row.

    While it runs (and after it was cancelled), :attr:`summary` counts what was saved and
    :attr:`in_flight` holds the ids that were started but not saved. ``on_event`` gets every
    trace event of every item as it happens (a live display); ``on_done`` each saved record.
    """

    def __init__(
        self,
        agent: ResearchAgent,
        todo: Plan | list[Question],
        output: ResultsFile,
        *,
        workers: int = 4,
        on_done: OnDone | None = None,
        on_event: OnEvent | None = None,
    ) -> None:
        self.plan = todo if isinstance(todo, Plan) else Plan(list(todo))
        self.on_event = on_event
        self.agent = agent
        self.output = output
        self.workers = max(1, workers)
        self.on_done = on_done
        self.summary = BatchSummary(
            total=len(self.plan.todo) + self.plan.done,
            skipped=self.plan.done,
            retried=self.plan.retry,
        )
        self.in_flight: set[str] = set()

    async def run(self) -> BatchSummary:
        queue: asyncio.Queue[Question] = asyncio.Queue()
        for item in self.plan.todo:
            queue.put_nowait(item)
        n = min(self.workers, len(self.plan.todo))
        tasks = [asyncio.create_task(self._worker(queue), name=f"batch-{i}") for i in range(n)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return self.summary

    async def _worker(self, queue: asyncio.Queue[Question]) -> None:
        while True:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            self.in_flight.add(item.id)
            record = await self._research(item)  # cancelled: nothing is written for the item
            self._save(item, record)
            self.in_flight.discard(item.id)

    def listener(self, item: Question) -> Callable[[TraceEvent], None] | None:
        """The trace-event callback of ``item``'s run (None without ``on_event``)."""
        on_event = self.on_event
        if on_event is None:
            return None

        def forward(event: TraceEvent) -> None:
            try:
                on_event(item, event)
            except Exception:  # a progress display must not end the run
                log.exception("on_event callback failed for question %s", item.id)

        return forward

    async def _research(self, item: Question) -> ResultRecord:
        try:
            return await self.agent.run(item.question, self.listener(item))
        except Exception as exc:  # one item's failure is its row, not the batch's
            log.exception("question %s failed", item.id)
            return exception_record(item.question, exc)

    def _save(self, item: Question, record: ResultRecord) -> None:
        try:
            self.output.write(_row(item, record))
        except Exception as exc:  # e.g. a value JSON cannot encode, a full disk
            log.exception("could not save the result of question %s", item.id)
            record = exception_record(item.question, exc, "could not save the result")
            try:
                self.output.write(_row(item, record))
            except Exception:
                log.exception("could not save question %s at all; a rerun retries it", item.id)
                self.summary.failed += 1
                self.summary.terminations["exception"] += 1
                return
        s = self.summary
        s.finished += 1
        s.terminations[record.termination] += 1
        s.elapsed.append(record.elapsed_seconds)
        if record.failed:
            s.failed += 1
        if self.on_done is not None:
            try:
                self.on_done(item, record)
            except Exception:  # a progress display must not end the batch
                log.exception("on_done callback failed for question %s", item.id)


async def run_batch(
    agent: ResearchAgent,
    items: list[Question],
    output: Path,
    *,
    workers: int = 4,
    on_done: OnDone | None = None,
) -> BatchSummary:
    """Research every pending item of ``items`` (new, or failed in an earlier run) with
    ``workers`` concurrent runs, appending each row to ``output`` (locked while it runs)."""
    with ResultsFile(output) as results:
        runner = BatchRun(
            agent, plan(items, results.state), results, workers=workers, on_done=on_done
        )
        return await runner.run()
