"""`drvenus ask` as a user runs it: Ctrl-C, dead servers, bad input (real subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drvenus.agent import read_trace, replay_messages
from helpers.cli import ANSWER, ROOT, drvenus, search_turn
from stub_server import Reply, StubServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ctrl_c_stops_ask_within_a_second_and_closes_the_trace(tmp_path, corpus):
    trace = tmp_path / "trace.jsonl"
    with StubServer([search_turn("Dracula author")], default=Reply(content=ANSWER, delay=30)) as server:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "drvenus", "ask", "Who wrote Dracula?", "--corpus", str(corpus),
             "--base-url", server.base_url, "--model-name", "stub-model", "--trace", str(trace)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        deadline = time.monotonic() + 60
        while len(server.chat_requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # the second model call hangs: interrupt it
        assert len(server.chat_requests) == 2
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=10)
        stopped = time.monotonic() - start
    assert proc.returncode == 130 and stopped < 1.5, (stopped, stderr)
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("interrupted")
    (events,) = read_trace(trace)
    assert events[-1]["type"] == "finished"
    record = events[-1]["data"]["record"]
    assert record["termination"] == "interrupted"
    assert replay_messages(events) == record["messages"]


def test_dead_server_is_one_clear_error_quickly(corpus):
    url = f"http://127.0.0.1:{_free_port()}/v1"
    start = time.monotonic()
    r = drvenus("ask", "q?", "--corpus", str(corpus), "--base-url", url, "--model-name", "m",
                "--json", env={"DRVENUS_MAX_ATTEMPTS": "2"}, timeout=120)
    assert r.returncode == 1
    record = json.loads(r.stdout)
    assert record["termination"] == "llm_error" and "cannot connect" in record["error"]
    assert "(after" not in record["error"]  # the agent retried; the client did not retry too
    assert time.monotonic() - start < 20


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-steps", "0"], "--max-steps"),
        (["--max-context", "10"], "--max-context"),
        (["--time-limit", "-1"], "--time-limit"),
        (["--base-url", "http://host:notaport", "--model-name", "m"], "port"),
        (["--trace", "/nonexistent-dir/trace.jsonl"], "nonexistent-dir"),
    ],
)
def test_bad_options_are_one_line_exit_2(args, message, corpus):
    r = drvenus("ask", "q?", "--corpus", str(corpus), *args, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], r.stderr


def test_invalid_utf8_question_is_exit_2(corpus):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run(
        [sys.executable.encode(), b"-m", b"drvenus", b"ask", b"caf\xe9 ?", b"--corpus", bytes(Path(corpus))],
        capture_output=True, env=env, timeout=60,
    )
    assert r.returncode == 2 and b"UTF-8" in r.stderr and b"Traceback" not in r.stderr
