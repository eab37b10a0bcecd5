"""What ``drvenus ask`` prints: the answer's exact text when stdout is a pipe or a file (scripts
read it), rich output on a terminal, and a run without an answer in words, never the model's
raw markup."""

from __future__ import annotations

import json

from rich.console import Console

from drvenus.agent import TraceEvent
from drvenus.cli.console import LiveTrace
from helpers.cli import drvenus
from stub_server import StubServer

MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>")
LONG = "A sentence that goes on " * 12  # far over 80 columns
ANSWER_TEXT = (
    "See [the list](https://example.org/list) and [red]this[/red] and [bold]that[/].\n"
    f"{LONG.strip()}\n\n| a | b |\n|---|---|\n| 1 | 2 |"
)
RAW_TURN = ('<think>\nI had found that Bram Stoker wrote it.\n</think>\n<tool_call>\n'
            '{"name": "search", "arguments": {"query": ["Dracula 1897"]}}\n</tool_call>')


def _answer_turn(text: str) -> str:
    return f"<think>\nDone.\n</think>\n<answer>\n{text}\n</answer>"


def test_piped_ask_prints_exactly_the_answer(corpus):
    with StubServer([], default=_answer_turn(ANSWER_TEXT)) as server:
        r = drvenus("ask", "Who wrote Dracula?", "--base-url", server.base_url,
                    "--model-name", "m", "--corpus", str(corpus), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ANSWER_TEXT + "\n"


def test_piped_ask_without_an_answer_says_why_on_stderr_in_words(corpus):
    search = ('<think>\nLet me search.\n</think>\n<tool_call>\n'
              + json.dumps({"name": "search", "arguments": {"query": ["Dracula"]}})
              + "\n</tool_call>")
    with StubServer([], default=search) as server:
        r = drvenus("ask", "Who wrote Dracula?", "--base-url", server.base_url,
                    "--model-name", "m", "--corpus", str(corpus), "--max-steps", "1",
                    timeout=120)
    assert r.stdout == ""  # nothing that could be taken for an answer
    assert not any(tag in r.stderr for tag in MARKUP), r.stderr


def _render(record: dict) -> str:
    console = Console(record=True, force_terminal=True, width=100, color_system=None)
    LiveTrace(console)(TraceEvent("finished", 3, {"record": record}))
    return console.export_text()


def test_a_stopped_run_on_the_terminal_is_told_in_words():
    """Ctrl-C in ask: the finished event of an interrupted run, as the terminal shows it."""
    record = {"termination": "interrupted", "error": "interrupted", "prediction": RAW_TURN,
              "messages": [{"role": "user", "content": "q"},
                           {"role": "assistant", "content": RAW_TURN}],
              "tool_call_count": 2, "turns": 3, "final_token_count": 900,
              "elapsed_seconds": 4.2}
    text = _render(record)
    assert not any(tag in text for tag in MARKUP), text
    assert "Stopped before the model gave an answer." in text
    assert "I had found that Bram Stoker wrote it." in text
    assert "interrupted" not in text and "last output" not in text


def test_the_terminal_says_tokens_used_apart_from_the_context_and_ends_in_words():
    from drvenus.cli.console import summary_table

    record = {"termination": "answered_max_steps", "prediction": "Bram Stoker", "messages": [],
              "tool_call_count": 1, "turns": 2, "final_token_count": 115,
              "elapsed_seconds": 1.0, "usage": {"prompt_tokens": 200, "completion_tokens": 20}}
    text = _render(record)
    assert "context 115 tokens · 220 tokens used" in text
    assert "Answered at the step limit" in text and "answered_max_steps" not in text
    assert "Forced answer" in text
    console = Console(record=True, width=100, color_system=None)
    console.print(summary_table({"answered": 3, "llm_error": 1}, [1.0, 2.0], 0))
    table = console.export_text()
    assert "The model could not be reached" in table and "llm_error" not in table


def test_ask_help_has_examples_and_grouped_options():
    r = drvenus("ask", "--help", env={"COLUMNS": "80", "TERM": "dumb"}, timeout=60)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "Examples:" in text and 'drvenus ask "..." > answer.txt' in text
    for panel in ("─ Model ", "─ Tools ", "─ Research "):
        assert panel in text, text
    # each option is under its group: the model's flags are not among the research budgets
    model, research = text.index("─ Model "), text.index("─ Research ")
    assert model < text.index("│ --base-url") < text.index("─ Tools ")
    assert research < text.index("│ --max-steps")
    assert all(len(line) <= 80 for line in text.splitlines()), text
