"""drvenus data clean when things go wrong: data faults vs our own bugs, interrupted and failed
runs (atomic outputs, Ctrl-C), a leading system message in raw rows, no process-wide state."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from data_fixtures import (
    HOLD_DIR,
    load_trajectories,
    raw_row,
    tiny_clean_row,
    write_parquet,
    write_raw_parquet,
)
from drvenus.data import pipeline, rows
from drvenus.data.normalize import normalize_row
from drvenus.data.pipeline import CleanOptions, run_clean

ANSWER = "<think>\nfound it\n</think>\n<answer>\nParis\n</answer>"
CALL = ('<think>\nsearch\n</think>\n<tool_call>\n{"name": "search", "arguments": '
        '{"query": ["capital of France"]}}\n</tool_call>')


def _opts(inp: Path, out: Path, **kw) -> CleanOptions:
    return CleanOptions(input=inp, output_dir=out, correctness="off", current_date="2026-03-01",
                        **{"workers": 1, **kw})


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


# --------------------------------------------------------------------------- bug: system first


@pytest.mark.parametrize("mode", ["template", "row"])
def test_raw_row_starting_with_a_system_message_keeps_its_question(mode):
    row = {"meta": {"question": "What is the capital of France?", "answer": "Paris"},
           "messages": [{"role": "system", "content": "You are a raw-data assistant."},
                        {"role": "user", "content": "What is the capital of France?"},
                        {"role": "assistant", "content": CALL},
                        {"role": "user", "content": "<tool_response>\nParis.\n</tool_response>"},
                        {"role": "assistant", "content": ANSWER}]}
    out, reason = normalize_row(row, mode=mode, template="T")
    assert reason is None
    system = "T" if mode == "template" else "You are a raw-data assistant."
    assert [m["role"] for m in out["messages"]] == ["system", "user", "assistant", "user",
                                                    "assistant"]
    assert out["messages"][0]["content"] == system
    assert out["messages"][1]["content"] == "What is the capital of France?"
    without = dict(row, messages=row["messages"][1:])  # the same row without the system turn
    assert normalize_row(without, mode="template", template="T")[0]["messages"][1:] == \
        out["messages"][1:]


# --------------------------------------------------------------------------- faults vs bugs


def test_data_faults_are_counted_as_before_without_warnings(tmp_path, caplog):
    good = tiny_clean_row(0)
    not_a_dict = dict(tiny_clean_row(1), messages=[*tiny_clean_row(1)["messages"][:2], "oops"])
    int_content = tiny_clean_row(2)
    int_content["messages"][2] = {"role": "assistant", "content": 7}
    lines = [json.dumps(r) for r in (good, not_a_dict, int_content)] + ["{broken", "[1]"]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train-0.jsonl").write_text("\n".join(lines))
    with caplog.at_level(logging.WARNING):
        st = run_clean(_opts(tmp_path / "in", tmp_path / "out", file_pattern="*.jsonl"))
    assert st["drop_reasons"] == {"row_error": 1, "non_str_content_at_2": 1,
                                  "unreadable_row": 2}
    assert st["unexpected_errors"] == 0 and st["rows"]["final_resampled"] == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("workers", [1, 2])
def test_unexpected_errors_are_logged_with_position_and_counted_apart(
    tmp_path, caplog, monkeypatch, workers
):
    real = rows.dedup

    def buggy_dedup(messages, stats, read_calls):
        if "q4" in messages[2]["content"]:
            raise RuntimeError("boom in our own code")
        return real(messages, stats, read_calls)

    monkeypatch.setattr(rows, "dedup", buggy_dedup)  # workers are forked: they see it too
    inp = write_parquet([tiny_clean_row(k) for k in range(6)], tmp_path / "in" / "train-0.parquet")
    with caplog.at_level(logging.WARNING):
        st = run_clean(_opts(inp, tmp_path / "out", workers=workers, chunk_rows=4))
    assert st["unexpected_errors"] == 1
    assert st["per_file"]["train-0.parquet"]["unexpected_errors"] == 1
    assert "row_error" not in st["drop_reasons"]
    assert st["rows"]["final_resampled"] == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("row 4 of train-0.parquet" in w and "RuntimeError: boom in our own code" in w
               for w in warnings), warnings


# --------------------------------------------------------------------------- atomic outputs


def test_successful_run_leaves_only_its_outputs(tmp_path):
    inp = write_parquet([tiny_clean_row(k) for k in range(3)], tmp_path / "in" / "train-0.parquet")
    run_clean(_opts(inp, tmp_path / "out", keep_intermediate=True, write_jsonl=True))
    assert _files(tmp_path / "out") == [
        "cleaned_resampled.jsonl", "cleaned_resampled.parquet", "stage1_normalized.parquet",
        "stage2_deduped.parquet", "stats.json"]


def test_failed_run_leaves_previous_outputs_untouched(tmp_path, monkeypatch):
    inp = write_parquet([tiny_clean_row(k) for k in range(3)], tmp_path / "in" / "train-0.parquet")
    out = tmp_path / "out"
    run_clean(_opts(inp, out))
    before = {n: (out / n).read_bytes() for n in _files(out)}
    real = pipeline.write_final

    def fail_after_writing(*args, **kwargs):
        real(*args, **kwargs)
        raise RuntimeError("disk full")

    monkeypatch.setattr(pipeline, "write_final", fail_after_writing)
    with pytest.raises(RuntimeError, match="disk full"):
        run_clean(_opts(inp, out, write_jsonl=True))
    assert {n: (out / n).read_bytes() for n in _files(out)} == before


@pytest.mark.parametrize("workers", [1, 2])
def test_interrupted_run_writes_nothing(tmp_path, workers):
    inp = write_parquet([tiny_clean_row(k) for k in range(20)], tmp_path / "in" / "train-0.parquet")

    def ctrl_c(done: int, total: int | None) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_clean(_opts(inp, tmp_path / "new", workers=workers, chunk_rows=2), ctrl_c)
    assert not (tmp_path / "new").exists()  # created by the run, removed again
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "notes.txt").write_text("mine")
    with pytest.raises(KeyboardInterrupt):
        run_clean(_opts(inp, tmp_path / "old", workers=workers, keep_intermediate=True), ctrl_c)
    assert _files(tmp_path / "old") == ["notes.txt"]


def test_ctrl_c_in_the_cli_leaves_no_output_and_no_tracebacks(tmp_path, shared_data):
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
    try:
        deadline = time.monotonic() + 120
        while not any(n.startswith("started-") for n in _files(hold)):  # a chunk in a worker
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
    finally:
        (hold / "go").touch()  # the held chunks finish; the run stops after them
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert "interrupted" in stderr
    assert _files(out) == []


def test_a_run_removes_the_temporary_files_of_killed_runs(tmp_path):
    """SIGKILL leaves the hidden temporary files of a run; the next run in the folder removes
    those of processes that are gone, and nothing else."""
    inp = write_parquet([tiny_clean_row(k) for k in range(3)], tmp_path / "in" / "train-0.parquet")
    out = tmp_path / "out"
    out.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = [out / f".valid.arrow.{gone.pid}.tmp", out / f".cleaned_resampled.parquet.{gone.pid}.tmp"]
    kept = [out / f".valid.arrow.{os.getppid()}.tmp",  # a run still going
            out / f".notes.{gone.pid}.tmp"]  # not one of ours
    for path in stale + kept:
        path.write_bytes(b"x" * 10)
    run_clean(_opts(inp, out))
    assert [p.exists() for p in stale + kept] == [False, False, True, True]
    assert (out / "cleaned_resampled.parquet").is_file()


# --------------------------------------------------------------------------- no global state


def _module_state() -> dict[str, object]:
    """The plain module-level values of every drvenus.data / drvenus.protocol module."""
    state: dict[str, object] = {}
    for name, module in list(sys.modules.items()):
        if name.startswith(("drvenus.data", "drvenus.protocol")):
            for attr, value in vars(module).items():
                if isinstance(value, bool | int | float | str | type(None)):
                    state[f"{name}.{attr}"] = value
    return state


def test_a_run_changes_no_module_state(tmp_path):
    inp = write_parquet([tiny_clean_row(k) for k in range(3)], tmp_path / "in" / "train-0.parquet")
    before = _module_state()
    run_clean(_opts(inp, tmp_path / "out", workers=1))
    after = _module_state()
    assert {k: v for k, v in after.items() if k in before and before[k] != v} == {}
    assert pq.read_metadata(tmp_path / "out" / "cleaned_resampled.parquet").num_rows == 3


def _mapped_table(path: Path, batches: int, rows: int, width: int):
    import pyarrow as pa

    schema = pa.schema([("id", pa.int64()), ("messages", pa.string())])
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as out:
        for b in range(batches):
            ids = list(range(b * rows, (b + 1) * rows))
            text = [f"{i:08d}" + "x" * width for i in ids]
            out.write_batch(pa.record_batch([pa.array(ids), pa.array(text)], schema=schema))
    return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()


def test_final_rows_are_taken_batch_by_batch_in_any_order(tmp_path):
    """The final write takes rows from the memory-mapped valid rows without concatenating the
    columns first (at 20K rows that overflowed 32-bit string offsets and held the whole
    messages column in memory): the rows asked for, in request order, repeats kept, as
    one-row views of their batches (nothing copied)."""
    import pyarrow as pa

    from drvenus.data.writing import RowTaker

    table = _mapped_table(tmp_path / "valid.arrow", batches=64, rows=32, width=20_000)
    taker = RowTaker(table)
    rng = random.Random(5)
    wanted = [rng.randrange(table.num_rows) for _ in range(256)] + [0, 0, table.num_rows - 1]
    before = pa.total_allocated_bytes()
    part = taker.take(wanted)
    used = pa.total_allocated_bytes() - before
    assert part.column("id").to_pylist() == wanted
    assert [m[:8] for m in part.column("messages").to_pylist()] == [f"{i:08d}" for i in wanted]
    assert used < 2**16  # views of the mapped rows: no copy of them, nor of the column
    assert taker.take([]).num_rows == 0
    with pytest.raises(IndexError, match="out of range"):
        taker.take([table.num_rows])


@pytest.mark.slow
def test_final_rows_from_more_than_2_gib_of_messages(tmp_path):
    """Past 2 GiB of message text a plain ``take`` fails (32-bit string offsets); the final
    write's batch-by-batch take does not, and copies only the rows asked for."""
    import pyarrow as pa

    from drvenus.data.writing import RowTaker

    table = _mapped_table(tmp_path / "valid.arrow", batches=110, rows=1000, width=20_000)
    assert table.column("messages").nbytes > 2**31
    wanted = [109_999, 0, 54_321, 0]
    with pytest.raises(pa.ArrowInvalid, match="offset overflow"):
        table.take(pa.array(wanted))  # the control: what stage 8 did before
    before = pa.total_allocated_bytes()
    part = RowTaker(table).take(wanted)
    assert part.column("id").to_pylist() == wanted
    assert pa.total_allocated_bytes() - before < 2**20
