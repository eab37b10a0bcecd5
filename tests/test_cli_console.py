"""The CLI's terminal output: a batch's live progress (a line per question in flight, rate and
ETA), a Markdown answer rendered on a terminal, and a dead model endpoint told at once."""

from __future__ import annotations

import time

from rich.console import Console

from drvenus.agent import TraceEvent
from drvenus.cli.console import BatchProgress, LiveTrace, _pace
from drvenus.questions import Question
from helpers.cli import drvenus


def _console() -> Console:
    return Console(record=True, force_terminal=True, width=140, color_system=None)


def test_batch_progress_shows_each_question_in_flight_with_its_step_and_query():
    console = _console()
    progress = BatchProgress(console, total=3)
    a, b = Question("q1", "Who wrote Dracula?"), Question("q2", "When was it published?")
    progress.event(a, TraceEvent("started", 0, {"question": a.question}))
    progress.event(a, TraceEvent("step_started", 1, {"context_tokens": 10}))
    progress.event(a, TraceEvent("tool_call", 1, {"name": "search",
                                                  "arguments": {"query": ["Dracula author"]}}))
    progress.event(b, TraceEvent("step_started", 0, {"context_tokens": 10}))
    console.print(progress.__rich__())
    text = console.export_text()
    assert "Who wrote Dracula?" in text and "step 2" in text
    assert "search: Dracula author" in text
    assert "When was it published?" in text and "step 1" in text and "thinking" in text
    progress.event(a, TraceEvent("finished", 1, {"record": {}}))
    assert set(progress.active) == {"q2"}
    # eval: ids only (a benchmark's questions may be encrypted)
    hidden = BatchProgress(console, total=1, label_of=lambda item: item.id)
    hidden.event(a, TraceEvent("step_started", 0, {}))
    assert hidden.active["q1"][0] == "q1"


def test_pace_gives_a_rate_and_an_eta():
    assert _pace(0, 10, 30.0) == ""
    assert _pace(2, 10, 60.0) == "2.0/min · eta 0:04:00"
    assert _pace(1, 3, 7200.0) == "0.5/h · eta 4:00:00"
    assert _pace(10, 10, 2.0).startswith("5.0/s")


def test_a_markdown_answer_is_rendered_on_a_terminal():
    console = _console()
    LiveTrace(console)(TraceEvent("answer", 2, {"answer": "**Bram Stoker** wrote:\n\n"
                                                "| book | year |\n|---|---|\n| Dracula | 1897 |",
                                                "forced": False}))
    text = console.export_text()
    assert "Bram Stoker" in text and "**" not in text
    assert "Dracula" in text and "|---|" not in text  # a table, not its source


def test_a_dead_model_endpoint_is_told_at_once_with_a_hint(tmp_path):
    start = time.monotonic()
    r = drvenus("ask", "Who wrote Dracula?", "--base-url", "http://127.0.0.1:9/v1",
                "--model-name", "m", env={"DRVENUS_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 1, r.stderr  # the run failed (as README says), not bad input
    assert "is the server running at http://127.0.0.1:9/v1?" in r.stderr
    assert r.stderr.count("error:") == 1
    assert time.monotonic() - start < 60  # no rounds of retries (about 13 s before)
    questions = tmp_path / "q.txt"
    questions.write_text("Who wrote Dracula?\n")
    r = drvenus("run", str(questions), "-o", str(tmp_path / "out.jsonl"), "--base-url",
                "http://127.0.0.1:9/v1", "--model-name", "m",
                env={"DRVENUS_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 1 and "is the server running at" in r.stderr, r.stderr
