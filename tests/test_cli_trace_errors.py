"""A trace that cannot be written (issue 43): the run goes on, the answer is printed, and the
failure is one clear line, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drvenus.agent import TraceEvent, TraceWriter
from stub_server import StubServer

ROOT = Path(__file__).resolve().parents[1]
ANSWER = "<think>\nDone.\n</think>\n<answer>\nBram Stoker\n</answer>"


class FullDisk:
    """A file whose writes fail with ENOSPC from the ``fail_at``-th on (its close too)."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.writes: list[str] = []
        self.closed = False
        self.failed = False

    def write(self, text: str) -> int:
        if len(self.writes) >= self.fail_at:
            self.failed = True
            raise OSError(28, "No space left on device")
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True
        if self.failed:  # the last flush fails the same way
            raise OSError(28, "No space left on device")


@settings(max_examples=25, deadline=None)
@given(events=st.integers(1, 12), fail_at=st.integers(0, 12))
def test_a_failing_trace_write_never_raises_and_is_kept(tmp_path_factory, events, fail_at):
    writer = TraceWriter(str(tmp_path_factory.mktemp("t") / "trace.jsonl"))
    writer._fh.close()
    disk = FullDisk(fail_at)
    writer._fh = disk  # type: ignore[assignment]
    for i in range(events):
        writer(TraceEvent("step_started", i, {}))  # never raises
    writer.close()
    writer.close()  # twice is fine
    assert len(disk.writes) == min(events, fail_at) and disk.closed
    assert (writer.error is not None) == (events > fail_at)
    if writer.error is not None:
        assert writer.error.errno == 28


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("as_json", [False, True])
def test_ask_on_a_full_disk_prints_the_answer_and_one_error_line(tmp_path, as_json):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "title": "Dracula", "url": "https://x.org/d",
                                  "text": "Dracula is a novel by Bram Stoker."}) + "\n")
    with StubServer([ANSWER]) as server:
        args = ["ask", "Who wrote Dracula?", "--corpus", str(corpus), "--base-url",
                server.base_url, "--model-name", "stub-model", "--trace", "/dev/full"]
        r = subprocess.run(
            [sys.executable, "-m", "drvenus", *args, *(["--json"] if as_json else [])],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )
    assert "Traceback" not in r.stderr, r.stderr
    if as_json:
        assert json.loads(r.stdout)["prediction"] == "Bram Stoker"
    else:
        assert r.stdout == "Bram Stoker\n"
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "/dev/full" in errors[0] and "No space left" in errors[0]
    assert r.returncode == 2
