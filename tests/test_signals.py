"""SIGTERM handled like SIGINT (issue 43): drvenus.signals, and `data clean` stopped by SIGTERM
(workers stopped, no output, one line, exit 143) or killed (its workers die with it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drvenus import signals

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@pytest.fixture()
def sigterm_installed():
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signals._received.clear()
    signals.install()
    yield
    for s, handler in old.items():
        signal.signal(s, handler)
    signals._received.clear()


def test_sigterm_does_what_ctrl_c_does(sigterm_installed):
    assert not signals.terminated() and signals.exit_code(130) == 130
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGTERM)
    assert signals.terminated()
    assert signals.exit_code(130) == 143 and signals.exit_code(2) == 2
    assert signals.stopped_by() == "terminated (SIGTERM)"


def test_sigterm_stops_even_where_ctrl_c_is_ignored(sigterm_installed):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGTERM)


def test_sigterm_follows_the_current_ctrl_c_handler(sigterm_installed):
    seen = []
    signal.signal(signal.SIGINT, lambda s, f: seen.append(s))  # asyncio's, say
    signal.raise_signal(signal.SIGTERM)
    assert seen == [signal.SIGINT]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_deferred_block_finishes_before_the_signal_acts(sigterm_installed, sig):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with signals.deferred():
            signal.raise_signal(sig)
            signal.raise_signal(sig)  # twice: still one stop, after the block
            done.append("written")
    assert done == ["written"]
    assert signal.getsignal(signal.SIGTERM) is signals._on_sigterm  # handlers restored


# --------------------------------------------------------------------------- data clean
def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in status  # a zombie: dead, waiting to be reaped


def _start_clean(tmp_path: Path, shared_data: Path):
    import random

    from data_fixtures import HOLD_DIR, load_trajectories, raw_row, write_raw_parquet

    trajs = load_trajectories()
    base = [raw_row(t, random.Random(i)) for i, t in enumerate(trajs)]
    inp = write_raw_parquet(base * 4, tmp_path / "in" / "train-0.parquet")
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.mkdir()
    argv = ["data", "clean", "-i", str(inp), "-o", str(out), "--correctness", "off",
            "--workers", "2", "--chunk-rows", "2"]
    code = f"from data_fixtures import run_cli_with_held_chunks as run; run({argv!r})"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), HOLD_DIR: str(hold)}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while not any(p.name.startswith("started-") for p in hold.iterdir()):  # a chunk in a worker
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    workers = {int(p.name.split("-")[1]) for p in hold.iterdir() if p.name.startswith("started-")}
    return proc, out, hold, workers


@pytest.mark.parametrize("group", [False, True], ids=["main-process", "process-group"])
def test_sigterm_stops_data_clean_like_ctrl_c(tmp_path, shared_data, group):
    proc, out, hold, workers = _start_clean(tmp_path, shared_data)
    try:
        if group:  # a service manager: every process of the unit
            os.killpg(proc.pid, signal.SIGTERM)
        else:  # timeout(1), docker stop: the main process only
            os.kill(proc.pid, signal.SIGTERM)
    finally:
        (hold / "go").touch()  # the held chunks finish; the run stops after them
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert "terminated (SIGTERM): no output written" in stderr
    assert not out.exists() or list(out.iterdir()) == []
    deadline = time.monotonic() + 30
    while not all(_gone(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(pid) for pid in workers)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_a_killed_data_clean(tmp_path, shared_data):
    proc, _, hold, workers = _start_clean(tmp_path, shared_data)
    os.kill(proc.pid, signal.SIGKILL)  # no handler runs: only the workers' own setting helps
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while not all(_gone(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(pid) for pid in workers)


# --------------------------------------------------------------------------- ask
def test_sigterm_stops_ask_like_ctrl_c_and_closes_the_trace(tmp_path):
    from drvenus.agent import read_trace
    from helpers.cli import ANSWER, ROOT, search_turn, write_corpus
    from stub_server import Reply, StubServer

    corpus = write_corpus(tmp_path / "corpus.jsonl")
    trace = tmp_path / "trace.jsonl"
    with StubServer([search_turn("Dracula author")],
                    default=Reply(content=ANSWER, delay=30)) as server:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "drvenus", "ask", "Who wrote Dracula?", "--corpus",
             str(corpus), "--base-url", server.base_url, "--model-name", "stub-model",
             "--trace", str(trace)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 120
        while len(server.chat_requests) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)  # the second model call hangs: stop it there
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr and "terminated (SIGTERM): no answer" in stderr
    (events,) = read_trace(trace)
    assert events[-1]["type"] == "finished"
    assert events[-1]["data"]["record"]["termination"] == "interrupted"
