from __future__ import annotations

import asyncio
import json

import pytest

from drvenus.agent import AgentConfig, ResearchAgent
from drvenus.batch import JsonlAppender, done_ids, load_questions, run_batch
from scripted import ScriptedModel, ScriptedTools, answer, call

FAST = AgentConfig(backoff_base=0.0)


def agent():
    return ResearchAgent(ScriptedModel([call("search", query=["x"]), answer("A")]), ScriptedTools(), FAST)


def write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_load_questions_counts_malformed_lines(tmp_path):
    f = tmp_path / "q.jsonl"
    write(f, [
        json.dumps({"id": 1, "question": "Who?", "answer": "me"}),
        "{not json",
        json.dumps({"prompt": "What?"}),
        json.dumps({"question": "   "}),
        json.dumps([1, 2]),
        json.dumps({"id": 1, "question": "dup"}),
        "",
        json.dumps("Plain string question?"),
    ])
    rep = load_questions(f)
    assert [it.question for it in rep.items] == ["Who?", "What?", "Plain string question?"]
    assert rep.items[0].id == "1" and rep.items[0].answer == "me"
    assert rep.malformed == 3 and rep.duplicates == 1
    assert any("line 2" in p for p in rep.problems)


def test_plain_text_questions(tmp_path):
    f = tmp_path / "q.txt"
    write(f, ["Who wrote Dracula?", "", "Who wrote Emma?"])
    rep = load_questions(f)
    assert len(rep.items) == 2 and rep.items[0].id.startswith("q-")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="questions file not found"):
        load_questions(tmp_path / "nope.jsonl")


def test_batch_appends_and_resumes(tmp_path):
    f = tmp_path / "q.jsonl"
    write(f, [json.dumps({"id": i, "question": f"Question {i}?", "answer": str(i)}) for i in range(6)])
    out = tmp_path / "out" / "results.jsonl"
    items = load_questions(f).items
    s1 = asyncio.run(run_batch(agent(), items[:4], out, workers=3))
    assert s1.finished == 4 and s1.terminations["answered"] == 4
    # simulate a crash that tore the last line
    with out.open("a") as fh:
        fh.write('{"id": "torn", "quest')
    s2 = asyncio.run(run_batch(agent(), items, out, workers=3))
    assert s2.skipped == 4 and s2.finished == 2
    ids, bad = done_ids(out)
    assert ids == {str(i) for i in range(6)} and bad == 1
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.startswith('{"id": "') and "torn" not in line]
    assert {r["answer"] for r in rows} == {str(i) for i in range(6)}
    assert all(r["termination"] == "answered" and r["prediction"] == "A" for r in rows)
    s3 = asyncio.run(run_batch(agent(), items, out, workers=3))
    assert s3.finished == 0 and s3.skipped == 6


def test_appender_starts_fresh_line_after_torn_tail(tmp_path):
    p = tmp_path / "o.jsonl"
    p.write_text('{"id": "a"}\n{"id": "b"')
    w = JsonlAppender(p)
    w.write({"id": "c"})
    w.close()
    assert p.read_text().splitlines()[-1] == '{"id": "c"}'
