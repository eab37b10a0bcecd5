"""The batch runner as a library: loading, per-question results, resume, failures, locking."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from drvenus.agent import AgentConfig, ResearchAgent
from drvenus.batch import (
    BatchRun,
    OutputLockedError,
    ResultsFile,
    plan,
    read_results,
    run_batch,
)
from drvenus.questions import Question, read_questions
from scripted import PerQuestionModel, ScriptedTools, answer, call, llm_down

FAST = AgentConfig(backoff_base=0.0, max_attempts=2)


def n_calls(question: str) -> int:
    """Question i ("Question i?") makes i tool calls, then answers "A<i>"."""
    return int(re.search(r"\d+", question).group())


def script(question: str) -> list[str]:
    i = n_calls(question)
    return [call("search", query=[f"{question} step {k}"]) for k in range(i)] + [answer(f"A{i}")]


def per_question_agent(delay=None, script=script) -> ResearchAgent:
    # later questions answer sooner, so rows finish out of input order
    delay = delay or (lambda q: 0.001 * (10 - n_calls(q) % 10))
    return ResearchAgent(PerQuestionModel(script, delay=delay), ScriptedTools(), FAST)


def write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def questions(tmp_path, n, name="q.jsonl"):
    f = tmp_path / name
    write(f, [json.dumps({"id": i, "question": f"Question {i}?", "answer": str(i)}) for i in range(n)])
    return read_questions(f).items


def rows(path):
    """Every line must be valid JSON (the file is valid JSONL)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------------------- loading
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
        json.dumps({"id": {"x": 1}, "question": "Bad id?"}),
    ])
    rep = read_questions(f)
    assert [it.question for it in rep.items] == ["Who?", "What?", "Plain string question?"]
    assert rep.items[0].id == "1" and rep.items[0].answer == "me"
    assert rep.malformed == 4 and rep.duplicates == 1
    assert any("line 2" in p for p in rep.problems)
    assert any("line 9" in p and "id" in p for p in rep.problems)


def test_int_and_string_ids_collide_and_the_warning_names_lines(tmp_path):
    f = tmp_path / "q.jsonl"
    write(f, [
        json.dumps({"id": "a", "question": "First?"}),
        json.dumps({"id": 7, "question": "Seven?"}),
        json.dumps({"id": "b", "question": "Other?"}),
        json.dumps({"id": "a", "question": "Again a?"}),
        json.dumps({"id": "7", "question": "Seven as a string?"}),
    ])
    rep = read_questions(f)
    assert [it.id for it in rep.items] == ["a", "7", "b"]
    assert rep.items[1].question == "Seven?"
    assert rep.duplicates == 2
    assert rep.duplicate_notes == [
        "duplicate id 'a' on line 4 (first on line 1), skipped",
        "duplicate id '7' on line 5 (first on line 2), skipped",
    ]


def test_plain_text_questions(tmp_path):
    f = tmp_path / "q.txt"
    write(f, ["Who wrote Dracula?", "", "Who wrote Emma?"])
    rep = read_questions(f)
    assert len(rep.items) == 2 and rep.items[0].id.startswith("q-")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="questions file not found"):
        read_questions(tmp_path / "nope.jsonl")


# ---------------------------------------------------------------------------- results
def test_each_row_is_its_own_question_with_its_own_script(tmp_path):
    items = questions(tmp_path, 7)
    out = tmp_path / "out" / "results.jsonl"
    s = asyncio.run(run_batch(per_question_agent(), items, out, workers=3))
    assert s.finished == 7 and s.failed == 0 and s.terminations["answered"] == 7
    got = rows(out)
    assert sorted(r["id"] for r in got) == [str(i) for i in range(7)]
    for r in got:
        i = int(r["id"])
        assert r["question"] == f"Question {i}?"
        assert r["answer"] == str(i)
        assert r["tool_call_count"] == i
        assert r["prediction"] == f"A{i}"
        assert r["termination"] == "answered"
        # its conversation holds only its own question and its own searches
        searches = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
        assert len(searches) == i + 1
        assert all(f"Question {i}? step" in c for c in searches[:-1])


def test_batch_appends_and_resumes(tmp_path):
    items = questions(tmp_path, 6)
    out = tmp_path / "results.jsonl"
    s1 = asyncio.run(run_batch(per_question_agent(), items[:4], out, workers=3))
    assert s1.finished == 4
    s2 = asyncio.run(run_batch(per_question_agent(), items, out, workers=3))
    assert s2.skipped == 4 and s2.finished == 2
    assert sorted(int(r["id"]) for r in rows(out)) == list(range(6))
    s3 = asyncio.run(run_batch(per_question_agent(), items, out, workers=3))
    assert s3.finished == 0 and s3.skipped == 6
    assert len(rows(out)) == 6


def test_torn_last_line_is_cut_then_appended_cleanly(tmp_path):
    items = questions(tmp_path, 4)
    out = tmp_path / "results.jsonl"
    asyncio.run(run_batch(per_question_agent(), items[:2], out, workers=2))
    before = out.read_bytes()
    with out.open("ab") as fh:  # a crash in the middle of writing item 2's row
        fh.write(b'{"id": "2", "question": "Question 2?", "termin')
    state = read_results(out)
    assert state.bad_lines == 1 and set(state.latest) == {"0", "1"}
    s = asyncio.run(run_batch(per_question_agent(), items, out, workers=2))
    assert s.skipped == 2 and s.finished == 2
    data = out.read_bytes()
    assert data.startswith(before) and data.endswith(b"\n")
    got = rows(out)  # valid JSONL: no torn fragment left, nothing glued to it
    assert sorted(r["id"] for r in got) == ["0", "1", "2", "3"]


def test_a_complete_last_row_without_newline_is_kept(tmp_path):
    out = tmp_path / "results.jsonl"
    out.write_text('{"id": "a", "termination": "answered"}\n{"id": "b", "termination": "answered"}')
    with ResultsFile(out) as results:
        assert results.torn_bytes == 0 and set(results.state.latest) == {"a", "b"}
        results.write({"id": "c", "termination": "answered"})
    assert [r["id"] for r in rows(out)] == ["a", "b", "c"]


# ---------------------------------------------------------------------------- failures
class ExplodingAgent(ResearchAgent):
    """Raises out of run() for "boom" questions; returns an unsaveable record for "unsaveable"."""

    async def run(self, question, on_event=None):
        if "boom" in question:
            raise RuntimeError("kaboom")
        record = await super().run(question, on_event)
        if "unsaveable" in question:
            record.extra["handle"] = object()  # JSON cannot encode it
        return record


def test_one_items_exception_is_its_row_and_the_others_finish(tmp_path):
    f = tmp_path / "q.jsonl"
    write(f, [json.dumps({"id": i, "question": q}) for i, q in enumerate(
        ["Question 1?", "Question 2 boom?", "Question 3?", "Question 4 unsaveable?", "Question 0?"]
    )])
    items = read_questions(f).items
    out = tmp_path / "results.jsonl"
    agent = ExplodingAgent(PerQuestionModel(script), ScriptedTools(), FAST)
    seen = []

    def on_done(item, record):
        seen.append(item.id)
        if item.id == "0":
            raise ValueError("a broken progress display")

    s = asyncio.run(run_batch(agent, items, out, workers=2, on_done=on_done))
    assert s.finished == 5 and s.failed == 2 and s.terminations["exception"] == 2
    assert sorted(seen) == ["0", "1", "2", "3", "4"]
    by_id = {r["id"]: r for r in rows(out)}
    assert by_id["1"]["termination"] == "exception" and "kaboom" in by_id["1"]["error"]
    assert by_id["1"]["question"] == "Question 2 boom?"
    assert by_id["3"]["termination"] == "exception"
    assert "could not save" in by_id["3"]["error"]
    assert [by_id[k]["termination"] for k in ("0", "2", "4")] == ["answered"] * 3


def test_rerun_retries_failed_items_and_the_latest_row_wins(tmp_path):
    items = questions(tmp_path, 5)
    out = tmp_path / "results.jsonl"
    down = {"Question 1?", "Question 3?"}

    def outage(question):
        return [llm_down()] if question in down else script(question)

    s1 = asyncio.run(run_batch(per_question_agent(script=outage), items, out, workers=2))
    assert s1.finished == 5 and s1.failed == 2 and s1.terminations["llm_error"] == 2
    # an older run also left an `exception` row for 4, then answered it: 4 is done
    with ResultsFile(out) as results:
        results.write({"id": "4", "question": "Question 4?", "termination": "exception"})
        results.write({"id": 4, "question": "Question 4?", "termination": "answered"})
        # ...and 0 was answered once, then failed on a later rerun: 0 must be retried
        results.write({"id": "0", "question": "Question 0?", "termination": "exception"})
    state = read_results(out)
    p = plan(items, state)
    assert sorted(it.id for it in p.todo) == ["0", "1", "3"] and p.done == 2 and p.retry == 3

    model_calls = PerQuestionModel(script)
    agent = ResearchAgent(model_calls, ScriptedTools(), FAST)
    s2 = asyncio.run(run_batch(agent, items, out, workers=2))
    assert s2.skipped == 2 and s2.retried == 3 and s2.finished == 3 and s2.failed == 0
    assert set(model_calls.calls) == {"Question 0?", "Question 1?", "Question 3?"}
    final = read_results(out)
    assert all(final.is_done(str(i)) for i in range(5))
    s3 = asyncio.run(run_batch(per_question_agent(), items, out, workers=2))
    assert s3.finished == 0 and s3.skipped == 5
    # nothing was rewritten: every row of every run is still there
    assert len(rows(out)) == 5 + 3 + 3


def test_a_slow_item_does_not_hold_up_the_others(tmp_path):
    items = questions(tmp_path, 8)
    out = tmp_path / "results.jsonl"
    others_done = asyncio.Event()
    running = {"now": 0, "max": 0}
    finished = []

    class Agent(ResearchAgent):
        async def run(self, question, on_event=None):
            running["now"] += 1
            running["max"] = max(running["max"], running["now"])
            try:
                if question == "Question 0?":
                    await others_done.wait()  # only the other 7 finishing can release it
                return await super().run(question, on_event)
            finally:
                running["now"] -= 1

    def on_done(item, record):
        finished.append(item.id)
        if len(finished) == 7:
            others_done.set()

    agent = Agent(PerQuestionModel(script), ScriptedTools(), FAST)
    coro = run_batch(agent, items, out, workers=2, on_done=on_done)
    s = asyncio.run(asyncio.wait_for(coro, timeout=30))
    assert s.finished == 8 and finished[-1] == "0"
    assert running["max"] == 2  # bounded by the number of workers


# ---------------------------------------------------------------------------- cancel, lock
def test_cancelling_keeps_finished_rows_writes_nothing_in_flight_and_unlocks(tmp_path):
    items = questions(tmp_path, 6)
    out = tmp_path / "results.jsonl"
    stuck = asyncio.Event()  # never set: questions 3..5 hang until cancelled

    class Agent(ResearchAgent):
        async def run(self, question, on_event=None):
            if n_calls(question) >= 3:
                await stuck.wait()
            return await super().run(question, on_event)

    agent = Agent(PerQuestionModel(script), ScriptedTools(), FAST)

    async def main():
        results = ResultsFile(out)
        runner = BatchRun(agent, plan(items, results.state), results, workers=3)
        task = asyncio.create_task(runner.run())
        while runner.summary.finished < 3:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        results.close()
        return runner

    runner = asyncio.run(main())
    assert runner.summary.finished == 3 and runner.in_flight == {"3", "4", "5"}
    assert sorted(r["id"] for r in rows(out)) == ["0", "1", "2"]
    s = asyncio.run(run_batch(per_question_agent(), items, out, workers=3))  # lock released
    assert s.skipped == 3 and s.finished == 3
    assert sorted(r["id"] for r in rows(out)) == [str(i) for i in range(6)]


def test_a_second_writer_fails_at_once_with_a_clear_message(tmp_path):
    items = [Question("1", "Question 1?")]
    out = tmp_path / "results.jsonl"
    with ResultsFile(out):
        with pytest.raises(OutputLockedError, match="locked by another drvenus run") as info:
            asyncio.run(run_batch(per_question_agent(), items, out))
        assert "\n" not in str(info.value)
        assert out.read_text() == ""
    s = asyncio.run(run_batch(per_question_agent(), items, out))  # released on close
    assert s.finished == 1
