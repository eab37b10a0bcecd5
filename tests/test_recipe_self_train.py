"""recipes/embedded/self_train.py: which training questions it runs, and its guard when no
run is right (the recipe's commands themselves are tested in test_data_from_runs and the
miniature rebuild)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes" / "embedded"))

import self_train  # noqa: E402


def _row(i: int, split: str, source: str) -> dict:
    return {"id": f"q{i}", "question": f"Question {i}?", "answer": f"A{i}", "aliases": [f"a{i}"],
            "split": split, "source": source}


def test_pick_questions_takes_the_split_and_sources_in_hash_order(tmp_path):
    rows = [_row(i, split, source) for i, (split, source) in enumerate(
        [("train-rl", "wiki-described"), ("train-rl", "wiki-single-hop"),
         ("dev", "wiki-described"), ("train-rl", "wiki-two-hop"),
         ("train-rl", "deepresearcher-mix:nq"), ("train-sft", "wiki-yes-no"),
         ("train-rl", "wiki-yes-no")])]
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    picked = self_train.pick_questions(path, self_train.NATURAL_SOURCES, 0)
    assert sorted(r["id"] for r in picked) == ["q0", "q3", "q6"]
    assert picked[0].keys() == {"id", "question", "answer", "aliases"}
    # the order is the ids' hash order, not the file's, and n takes its head
    assert [r["id"] for r in self_train.pick_questions(path, self_train.NATURAL_SOURCES, 2)] \
        == [r["id"] for r in picked[:2]]
    # a source is matched by its name before ":"
    mixed = self_train.pick_questions(path, ("deepresearcher-mix",), 0)
    assert [r["id"] for r in mixed] == ["q4"]


def test_no_right_run_stops_before_fine_tuning(tmp_path, monkeypatch):
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "questions.jsonl").write_text(json.dumps(_row(1, "train-rl", "wiki-described")) + "\n")
    calls: list[tuple[str, ...]] = []

    def fake_drvenus(*args: str, check: bool = True) -> int:
        calls.append(args)
        if args[:2] == ("data", "clean"):  # every run wrong: clean keeps no row
            (out / "clean").mkdir(parents=True)
            pq.write_table(pa.table({"question": pa.array([], pa.string())}),
                           out / "clean" / "cleaned_resampled.parquet")
        return 0

    monkeypatch.setattr(self_train, "drvenus", fake_drvenus)
    (out).mkdir()
    (out / "start.gguf").write_bytes(b"GGUF")
    with pytest.raises(SystemExit, match="no run was right"):
        self_train.main(["--data", str(data), "--start", str(tmp_path / "adapter"),
                         "--out", str(out), "--samples", "3"])
    commands = [c[:2] for c in calls]
    assert ("sft", "--config") not in commands and ("data", "from-runs") in commands
    run = next(c for c in calls if c[0] == "run")
    assert run[run.index("--heavy") + 1] == "3" and "--adapter" in run
    assert [json.loads(x)["id"] for x in (out / "questions.jsonl").read_text().splitlines()] \
        == ["q1"]
