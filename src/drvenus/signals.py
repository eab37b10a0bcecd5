"""SIGTERM handled like SIGINT (Ctrl-C), in every command.

Service managers, ``timeout`` and container runtimes stop a process with SIGTERM, whose
default action ends it on the spot: no worker stopped, no temporary file removed, no message.
Here SIGTERM does what SIGINT does at that moment, so each command's Ctrl-C path runs for it
too, and only the exit code differs (:data:`TERMINATED`, 143 = 128 + SIGTERM, against 130):

- :func:`install` (the ``drvenus`` entry point): SIGTERM calls the current SIGINT handler
  (asyncio's, which cancels the main task, or Python's, which raises ``KeyboardInterrupt``);
  where SIGINT is ignored (a background job) it raises ``KeyboardInterrupt`` itself.
  :func:`terminated` says whether SIGTERM came.
- :func:`deferred`: a block that must not be cut short (a checkpoint being written): SIGINT and
  SIGTERM wait until it ends, then act as they would have.
- :func:`worker_init`: a worker process ignores both (its parent stops it and waits for it)
  and, on Linux, dies with its parent, so it is never orphaned.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

log = logging.getLogger(__name__)

INTERRUPTED = 128 + signal.SIGINT  # 130: the exit code after Ctrl-C
TERMINATED = 128 + signal.SIGTERM  # 143: the exit code after SIGTERM
_PR_SET_PDEATHSIG = 1  # prctl(2)

_received: set[int] = set()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _received.add(signal.SIGTERM)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not _on_sigterm:
        handler(signal.SIGINT, frame)  # whatever Ctrl-C does now
        return
    raise KeyboardInterrupt


def install() -> None:
    """Handle SIGTERM like SIGINT from now on (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def terminated() -> bool:
    """Whether SIGTERM was received since :func:`install`."""
    return signal.SIGTERM in _received


def stopped_by() -> str:
    """How a stopped command says it was stopped: ``terminated (SIGTERM)`` or ``interrupted``."""
    return "terminated (SIGTERM)" if terminated() else "interrupted"


def exit_code(code: int) -> int:
    """The process's exit code: a command's Ctrl-C code becomes 143 when SIGTERM stopped it."""
    return TERMINATED if code == INTERRUPTED and terminated() else code


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back while the block runs, then delivered (main thread only;
    elsewhere the block just runs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if not pending:
            log.warning("%s received: stopping once the checkpoint is written",
                        signal.Signals(signum).name)
        pending.append(signum)

    old = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if pending:
            signal.raise_signal(pending[0])


def worker_init(parent: int | None = None) -> None:
    """A worker process's signals: SIGINT and SIGTERM ignored (the parent stops it); on Linux,
    SIGKILL when the parent dies, so a killed parent leaves no worker behind. ``parent``: the
    parent's pid (its ``os.getpid()``), to catch a parent that died before this ran."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the parent's shutdown still stops it
        return
    if parent is not None and os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)


__all__ = ["INTERRUPTED", "TERMINATED", "deferred", "exit_code", "install", "stopped_by",
           "terminated", "worker_init"]
