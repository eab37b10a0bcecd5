"""The ``drvenus`` command as a user runs it: a subprocess on this checkout's source, scripted
model turns, and a two-page corpus."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ANSWER = "<think>\nDone.\n</think>\n<answer>\nBram Stoker\n</answer>"
CORPUS_ROWS = [
    {"id": "1", "title": "Dracula", "url": "https://en.wikipedia.org/wiki/Dracula",
     "text": "Dracula is an 1897 Gothic horror novel by the Irish author Bram Stoker. "
             "It introduced the vampire Count Dracula."},
    {"id": "2", "title": "Emma (novel)", "url": "https://en.wikipedia.org/wiki/Emma_(novel)",
     "text": "Emma is a novel written by Jane Austen, first published in 1815."},
]


def drvenus(*args: str, env: dict | None = None, timeout: float = 300, cwd=None):
    full_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "drvenus", *args],
        capture_output=True, text=True, env=full_env, timeout=timeout, cwd=cwd,
    )


def search_turn(query: str) -> str:
    call = json.dumps({"name": "search", "arguments": {"query": [query]}})
    return f"<think>\nLet me search.\n</think>\n<tool_call>\n{call}\n</tool_call>"


def visit_turn(url: str, goal: str) -> str:
    call = json.dumps({"name": "visit", "arguments": {"url": [url], "goal": goal}})
    return f"<think>\nOpen it.\n</think>\n<tool_call>\n{call}\n</tool_call>"


def write_corpus(path: Path) -> Path:
    """The two-page corpus (Dracula, Emma) as JSONL at ``path``."""
    path.write_text("\n".join(json.dumps(r) for r in CORPUS_ROWS) + "\n")
    return path


def eval_env() -> dict[str, str]:
    """The environment of ``drvenus eval`` tests: no judge from the caller's environment, one
    attempt per model call."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRVENUS_JUDGE_")}
    return {**env, "PYTHONPATH": str(ROOT / "src"), "DRVENUS_MAX_ATTEMPTS": "1"}


def drvenus_eval(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``drvenus ARGS`` in :func:`eval_env`."""
    return subprocess.run([sys.executable, "-m", "drvenus", *args], capture_output=True,
                          text=True, env=eval_env(), timeout=timeout)
