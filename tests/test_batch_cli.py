"""`drvenus run` as a user runs it: subprocesses against the real local stub server.

Exit codes, a locked output, failed items retried by a rerun, kill -9 and Ctrl-C mid-run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drvenus.batch import ResultsFile
from stub_server import Reply, StubServer

ROOT = Path(__file__).resolve().parents[1]
ANSWER = "<think>\nDone.\n</think>\n<answer>\nBram Stoker\n</answer>"
POSIX_ONLY = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "DRVENUS_MAX_ATTEMPTS": "1"}


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "drvenus", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )


def drvenus(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "drvenus", *args],
        capture_output=True, text=True, env=_env(), timeout=timeout,
    )


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    rows = [
        {"id": "1", "title": "Dracula", "url": "https://en.wikipedia.org/wiki/Dracula",
         "text": "Dracula is an 1897 Gothic horror novel by the Irish author Bram Stoker."},
        {"id": "2", "title": "Emma (novel)", "url": "https://en.wikipedia.org/wiki/Emma_(novel)",
         "text": "Emma is a novel written by Jane Austen, first published in 1815."},
    ]
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def questions_file(tmp_path: Path, n: int) -> Path:
    qs = tmp_path / "questions.jsonl"
    qs.write_text("\n".join(
        json.dumps({"id": f"q{i}", "question": f"Who wrote book {i}?"}) for i in range(n)
    ) + "\n")
    return qs


def run_args(qs: Path, out: Path, server: StubServer, corpus: Path, workers: int = 2):
    return ("run", str(qs), "-o", str(out), "--workers", str(workers),
            "--base-url", server.base_url, "--model-name", "stub", "--corpus", str(corpus))


def valid_rows(out: Path) -> list[dict]:
    """The output parsed line by line: every line must be valid JSON."""
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def wait_for_rows(out: Path, proc: subprocess.Popen, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if out.exists() and out.read_bytes().count(b"\n") >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError(f"no {n} rows in {out} within {timeout}s")


def assert_complete(out: Path, n: int) -> None:
    rows = valid_rows(out)
    ok = [r["id"] for r in rows if r["termination"] not in ("llm_error", "exception", "interrupted")]
    assert sorted(ok) == sorted(f"q{i}" for i in range(n))  # each id once, none lost
    for r in rows:
        assert r["question"] == f"Who wrote book {r['id'][1:]}?"


def test_a_locked_output_is_a_one_line_error(corpus, tmp_path):
    qs, out = questions_file(tmp_path, 2), tmp_path / "out.jsonl"
    with ResultsFile(out):  # another run holds the file
        r = drvenus(*run_args(qs, out, _NoServer(), corpus))
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "locked by another drvenus run" in lines[0]
    assert out.read_text() == ""


def test_duplicate_ids_are_named_with_their_lines(corpus, tmp_path):
    qs = tmp_path / "questions.jsonl"
    qs.write_text("\n".join(json.dumps(o) for o in [
        {"id": 7, "question": "Who wrote book 7?"},
        {"id": "8", "question": "Who wrote book 8?"},
        {"id": "7", "question": "Who wrote book 7 again?"},
    ]) + "\n")
    out = tmp_path / "out.jsonl"
    with StubServer([], default=ANSWER) as server:
        r = drvenus(*run_args(qs, out, server, corpus))
    assert r.returncode == 0, r.stderr
    assert "duplicate id '7' on line 3 (first on line 1), skipped" in r.stderr
    rows = valid_rows(out)
    assert sorted(r["id"] for r in rows) == ["7", "8"]
    assert {r["id"]: r["question"] for r in rows}["7"] == "Who wrote book 7?"


@pytest.mark.slow
def test_failed_items_exit_1_and_a_rerun_retries_them(corpus, tmp_path):
    qs, out = questions_file(tmp_path, 4), tmp_path / "out.jsonl"

    def flaky(request):  # books 1 and 3 fail while the server is "down"
        question = request.json["messages"][1]["content"]
        return Reply(status=503, content="down") if question[-2] in "13" else ANSWER

    with StubServer([], default=flaky) as server:
        r1 = drvenus(*run_args(qs, out, server, corpus))
    assert r1.returncode == 1, r1.stderr
    assert "2 of 4 question(s) failed" in r1.stderr
    terms = {r["id"]: r["termination"] for r in valid_rows(out)}
    assert terms == {"q0": "answered", "q1": "llm_error", "q2": "answered", "q3": "llm_error"}

    with StubServer([], default=ANSWER) as server:
        r2 = drvenus(*run_args(qs, out, server, corpus))
        asked = sorted(req.json["messages"][1]["content"] for req in server.chat_requests)
    assert r2.returncode == 0, r2.stderr
    assert "2 already done" in r2.stdout and "2 failed before" in r2.stdout
    assert asked == ["Who wrote book 1?", "Who wrote book 3?"]
    assert_complete(out, 4)
    with StubServer([], default=ANSWER) as server:
        r3 = drvenus(*run_args(qs, out, server, corpus))
    assert r3.returncode == 0 and "All 4 questions are already in" in r3.stdout


@pytest.mark.slow
@POSIX_ONLY
def test_kill_9_mid_run_then_rerun_loses_and_duplicates_nothing(corpus, tmp_path):
    n = 8
    qs, out = questions_file(tmp_path, n), tmp_path / "out.jsonl"
    with StubServer([], default=ANSWER, delay=0.3) as server:
        proc = start(*run_args(qs, out, server, corpus))
        try:
            wait_for_rows(out, proc, 2)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        first = valid_rows(out)
        assert 2 <= len(first) < n
        with out.open("ab") as fh:  # what a kill in the middle of a write can leave
            fh.write(b'{"id": "q7", "question": "Who wrote bo')
        r = drvenus(*run_args(qs, out, server, corpus))
    assert r.returncode == 0, r.stderr
    assert f"{len(first)} already done" in r.stdout
    assert_complete(out, n)
    assert len(valid_rows(out)) == n


@pytest.mark.slow
@POSIX_ONLY
@pytest.mark.parametrize(("sig", "code", "said"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_ctrl_c_exits_130_keeps_finished_rows_and_a_rerun_completes(corpus, tmp_path, sig, code,
                                                                    said):
    n = 8
    qs, out = questions_file(tmp_path, n), tmp_path / "out.jsonl"
    with StubServer([], default=ANSWER, delay=0.3) as server:
        proc = start(*run_args(qs, out, server, corpus))
        try:
            wait_for_rows(out, proc, 2)
            proc.send_signal(sig)  # SIGTERM is handled as Ctrl-C is, exit 143
            _, stderr = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == code, stderr
        first = valid_rows(out)
        assert 2 <= len(first) < n
        assert f"{said}: {len(first)} finished" in stderr
        assert "rerun the same command to resume" in stderr
        assert "Traceback" not in stderr
        r = drvenus(*run_args(qs, out, server, corpus))
    assert r.returncode == 0, r.stderr
    assert_complete(out, n)
    assert len(valid_rows(out)) == n


class _NoServer:
    base_url = "http://127.0.0.1:9/v1"  # never reached: the lock check comes first
