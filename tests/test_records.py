"""One reader per kind of file: question files (run / eval / rl) and trajectory files (data
clean, sft, --system-prompt-file, the demo's replay) mean the same thing to every command."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_fixtures import tiny_clean_row
from drvenus.data.options import CleanOptions
from drvenus.data.pipeline import run_clean
from drvenus.eval.benchmarks import load
from drvenus.protocol import ANSWER_SPLIT, load_system_prompt
from drvenus.questions import read_questions
from drvenus.records import RecordsError, json_layout, parse_json_text
from drvenus.serve.view import load_saved
from drvenus.train.rl.questions import question_rows
from drvenus.train.sft.data import read_conversations

RL_ROW = {
    "data_source": "nq", "prompt": [{"role": "user", "content": "Who?"}],
    "reward_model": {"ground_truth": f"X{ANSWER_SPLIT}Y", "style": "rule"},
    "extra_info": {"index": "nq_1", "split": "test"},
}


def _question_files(tmp_path):
    rows = [{"problem": "What is P?", "answers": ["p", "pee"]}, RL_ROW,
            {"id": 3, "question": "Third?", "answer": "3"}]
    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    array = tmp_path / "q.json"
    array.write_text("\n\n" + json.dumps(rows, indent=1), encoding="utf-8")
    parquet = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": r.get("question") or r.get("problem")
                                          or "Who?", "answer": "a"} for r in rows]), parquet)
    return jsonl, array, parquet


def test_run_eval_and_rl_read_the_same_question_files(tmp_path):
    jsonl, array, parquet = _question_files(tmp_path)
    for path in (jsonl, array):
        report = read_questions(path)
        assert report.malformed == 0, report.problems
        assert [q.question for q in report.items] == ["What is P?", "Who?", "Third?"]
        assert [q.answers for q in report.items] == [["p", "pee"], ["X", "Y"], ["3"]]
        assert report.items[1].id == "nq_1" and report.items[2].id == "3"
        evaluated = load("jsonl", path)
        assert [(i.id, i.question, i.answers) for i in evaluated] == [
            (q.id, q.question, q.answers) for q in report.items]
        assert question_rows(path) == [(q.question, ANSWER_SPLIT.join(q.answers))
                                      for q in report.items]
    assert len(read_questions(parquet).items) == 3


def test_need_answer_counts_rows_without_one(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "No answer?"}) + "\n" + "{bad\n", encoding="utf-8")
    assert len(read_questions(path).items) == 1
    report = read_questions(path, need_answer=True)
    assert report.items == [] and report.malformed == 2
    assert report.problems[0].startswith("line 1: no answer field")
    assert report.problems[1] == "line 2: invalid JSON"


def test_run_accepts_a_problem_answers_row(tmp_path):
    """`drvenus run` reads the row `eval` and `rl` read (it refused it before): with its answer
    already in the output, the run finds nothing left to do."""
    from typer.testing import CliRunner

    from drvenus.cli import app
    from drvenus.questions import question_id

    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"problem": "What is P?", "answers": ["p"]}) + "\n",
                    encoding="utf-8")
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"id": question_id("What is P?"), "question": "What is P?",
                               "termination": "answered", "prediction": "p"}) + "\n")
    res = CliRunner().invoke(app, ["run", str(path), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "All 1 questions are already in" in res.output


def test_json_layout_ignores_leading_blanks_and_bom():
    assert json_layout(b"\n\n  [{}]") == "document"
    assert json_layout("\ufeff{}".encode()) == "document"
    assert json_layout(b'"a"\n"b"') == "lines"
    assert parse_json_text('{"a": 1}\n{"a": 2}\n') == [{"a": 1}, {"a": 2}]
    assert parse_json_text('\n[{"a": 1}]') == [{"a": 1}]
    with pytest.raises(RecordsError, match="line 2 is not valid JSON"):
        parse_json_text('{"a": 1}\n{oops\n')


def test_a_json_array_starting_with_a_newline_is_one_file_everywhere(tmp_path):
    rows = [tiny_clean_row(k) for k in range(3)]
    path = tmp_path / "in" / "train.json"
    path.parent.mkdir()
    path.write_text("\n" + json.dumps(rows, indent=2), encoding="utf-8")
    stats = run_clean(CleanOptions(input=path, output_dir=tmp_path / "out",
                                   correctness="off", workers=1))
    assert stats["rows"]["source"] == 3 and "unreadable_row" not in stats["drop_reasons"]
    assert len(read_conversations(path)) == 3
    assert load_system_prompt(path) == "S"
    assert [run["question"] for run in load_saved(path.read_text())] == ["Q0?", "Q1?", "Q2?"]
