"""End to end on the real embedded model (SmolLM2 GGUF) and the real built-in corpus."""

from __future__ import annotations

import json

import pytest

from drvenus import protocol
from drvenus.agent import TERMINATIONS
from drvenus.protocol.state import TurnState
from drvenus.small.spans import clause_words, span_sources
from helpers.cli import drvenus


@pytest.mark.slow
def test_ask_dracula_on_the_embedded_defaults(tmp_path):
    trace = tmp_path / "trace.jsonl"
    r = drvenus("ask", "Who wrote the novel Dracula?", "--json", "--trace", str(trace), timeout=400)
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["termination"] in TERMINATIONS
    assert rec["termination"] not in ("exception", "llm_error"), rec.get("error")
    # at least one executed search whose results come from the built-in Wikipedia corpus
    searches = [
        protocol.parse_search_body(protocol.unwrap_tool_response(m["content"]) or "")
        for m in rec["messages"][2:]
        if m["role"] == "user"
    ]
    hits = [h for s in searches if s for entry in s for h in entry["web_page_info_list"]]
    assert hits and all(h["url"].startswith("https://en.wikipedia.org/wiki/") for h in hits)
    assert rec["tool_call_count"] >= 1
    # every assistant turn the grammar produced is well formed
    turns = [m["content"] for m in rec["messages"] if m["role"] == "assistant"]
    assert all(protocol.check_turn_format(t, False) for t in turns[:-1])
    events = [json.loads(line)["type"] for line in trace.read_text().splitlines()]
    assert "tool_result" in events and events[-1] == "finished"
    # the answer is a span of what the agent read or thought (issue #17): never garbled
    assert rec["termination"].startswith("answered"), rec["termination"]
    answer = rec["prediction"]
    texts = span_sources(TurnState.of(rec["messages"][:-1]), thinking=True)
    spans = {" ".join(c[i:j]) for t in texts for c in clause_words(t)
             for i in range(len(c)) for j in range(i + 1, len(c) + 1)}
    assert answer in spans, answer
