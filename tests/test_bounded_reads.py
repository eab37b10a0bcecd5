"""File inputs read with a bound (issue 43): a huge one-line file is refused or skipped after
reading at most the bound, never read whole (questions for `run`, runs for `from-runs`, trace
and JSONL rows, `--system-prompt-file`, `sft --config`)."""

from __future__ import annotations

import io
import json
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from drvenus import jsonl
from drvenus.cli import app
from drvenus.jsonl import bounded_lines, read_jsonl

runner = CliRunner()


class Reads(io.BytesIO):
    """A binary file that records the largest read asked of it."""

    largest = 0

    def readline(self, size: int | None = -1) -> bytes:  # type: ignore[override]
        assert size is not None and size > 0, "an unbounded readline"
        self.largest = max(self.largest, size)
        return super().readline(size)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 300), max_size=12), limit=st.integers(1, 120),
       last_newline=st.booleans())
def test_lines_are_read_within_the_bound(lengths, limit, last_newline):
    lines = [b"x" * n for n in lengths]
    data = b"\n".join(lines) + (b"\n" if last_newline and lines else b"")
    fh = Reads(data)
    got = list(bounded_lines(fh, limit))
    assert fh.largest <= max(limit + 1, 1 << 20)  # the skip reads a bounded piece at a time
    expected = [None if len(line) + 1 > limit + 1 else line for line in lines]
    if lines and not data.endswith(b"\n") and len(lines[-1]) <= limit:
        expected[-1] = lines[-1]
    if lines and not lines[-1] and not last_newline:
        expected = expected[:-1]  # a file ending in "\n" has no empty last line
    assert [g.rstrip(b"\n") if g is not None else None for g in got] == expected


def test_a_long_line_is_an_error_row_and_the_rest_is_read():
    data = b'{"a": 1}\n' + b'{"b": "' + b"y" * 5000 + b'"}\n' + b'{"c": 3}\n'
    rows = list(read_jsonl(io.BytesIO(data), max_line_bytes=100))
    assert [(r.lineno, r.ok) for r in rows] == [(1, True), (2, False), (3, True)]
    assert "longer than 100 bytes" in rows[1].error
    assert rows[2].value == {"c": 3}


def test_a_huge_line_is_never_held_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 64 << 10)
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as fh:
        fh.write(b'{"question": "')
        for _ in range(64):
            fh.write(b"q" * (128 << 10))  # 8 MiB on one line
        fh.write(b'"}\n{"question": "Who wrote Dracula?"}\n')
    tracemalloc.start()
    try:
        rows = list(read_jsonl(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [r.ok for r in rows] == [False, True]
    assert peak < 4 << 20  # a few pieces, not the 8 MiB line


def _huge_line(path: Path, size: int, prefix: bytes = b'{"question": "') -> Path:
    with path.open("wb") as fh:
        fh.write(prefix + b"q" * size + b'"}\n')
    return path


def test_run_reports_an_over_long_question_line(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 1 << 10)
    questions = _huge_line(tmp_path / "q.jsonl", 50_000)
    for name in ("q.jsonl", "q.txt"):
        if name == "q.txt":
            questions = tmp_path / name
            questions.write_bytes(b"q" * 50_000 + b"\n")
        res = runner.invoke(app, ["run", str(questions), "-o", str(tmp_path / "out.jsonl")])
        assert res.exit_code == 2, res.output
        assert "longer than 1,024 bytes" in " ".join(res.output.split()), res.output
        assert "Traceback" not in res.output


def test_from_runs_skips_an_over_long_line(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 1 << 10)
    runs = _huge_line(tmp_path / "results.jsonl", 50_000)
    res = runner.invoke(app, ["data", "from-runs", str(runs), "-o", str(tmp_path / "raw")])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "raw" / "from_runs.json").read_text())
    assert report["skipped"] == {"unreadable_row": 1}


def test_a_huge_json_document_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from drvenus import records

    monkeypatch.setattr(records, "MAX_DOCUMENT_BYTES", 1 << 10)
    doc = _huge_line(tmp_path / "q.json", 50_000, prefix=b'[{"question": "')
    with pytest.raises(records.RecordsError, match="too large to read whole.*JSON lines"):
        list(records.iter_json_file(doc))


def test_a_huge_system_prompt_file_is_one_line(tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes(b"p" * ((1 << 20) + 1))
    res = runner.invoke(app, ["ask", "Who wrote Dracula?", "--system-prompt-file", str(prompt),
                              "--json"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "over the 1,048,576-byte limit" in lines[0], res.output


def test_a_huge_sft_config_is_one_line(tmp_path):
    config = tmp_path / "sft.yaml"
    config.write_bytes(b"# " + b"c" * (1 << 20) + b"\n")
    res = runner.invoke(app, ["sft", "--config", str(config), "--dry-run"])
    assert res.exit_code == 2, res.output
    assert "too large to read whole" in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output


def test_a_huge_csv_line_is_refused_after_the_bound(tmp_path, monkeypatch):
    from drvenus import records

    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 1 << 10)
    small = tmp_path / "ok.csv"
    small.write_text('question,answer\n"Who, really?",Bram Stoker\n"multi\nline",x\n')
    assert [r["answer"] for r in records.read_records(small)] == ["Bram Stoker", "x"]
    huge = tmp_path / "q.csv"
    huge.write_text("question,answer\n" + "q" * 50_000 + ",a\n")
    with pytest.raises(records.RecordsError, match="longer than 1,024 characters"):
        records.read_records(huge)
