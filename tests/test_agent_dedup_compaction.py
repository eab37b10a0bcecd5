"""The duplicate-call rule after a context compaction: a call whose result the model no longer
sees (restarted from a report, or its result stubbed by keep-last-k) is no duplicate to retry;
a call whose result is still in view is."""

from __future__ import annotations

import asyncio
import json

from drvenus import protocol
from drvenus.agent import AgentConfig, ContextPolicy, ResearchAgent
from scripted import ScriptedModel, ScriptedTools, answer

PAGE = "x" * 8_000  # 2,000 tokens at the scripted model's four characters per token
REPORT = "Found so far: q1 gave a long page. Next: look again."


def _search(query: str) -> str:
    body = json.dumps({"name": "search", "arguments": {"query": [query]}})
    return protocol.render_tool_call_turn("s", body)


class Repeater:
    """Searches q1, q2, ... until the conversation is compacted; then repeats the last query
    made before the compaction, then q1, then answers (decided by the tool calls made, so a
    re-sample of a turn gets the same reply)."""

    def __init__(self, tools: ScriptedTools) -> None:
        self.tools = tools
        self.compacted_at: int | None = None

    def __call__(self, messages: list[dict[str, str]]) -> str:
        last = messages[-1]["content"]
        if last == protocol.SUMMARY_REQUEST:
            return REPORT
        if protocol.notice_kind(protocol.unwrap_tool_response(last) or "") is not None:
            return answer("best guess")
        made = len(self.tools.calls)
        if self.compacted_at is None and any(
            REPORT in m["content"] or protocol.is_elided(m["content"]) for m in messages
        ):
            self.compacted_at = made
        if self.compacted_at is None:
            return _search(f"q{made + 1}")
        after = made - self.compacted_at
        if after == 0:
            return _search(f"q{self.compacted_at}")  # the last query before the compaction
        if after == 1:
            return _search("q1")  # long out of view
        return answer("done")


def _run(strategy: str) -> tuple[list[str], int]:
    tools = ScriptedTools(PAGE)
    model = ScriptedModel([Repeater(tools)])
    model.window = 16_384
    config = AgentConfig(
        max_steps=40, max_attempts=3, backoff_base=0.0,
        context=ContextPolicy(strategy=strategy, keep_last=2),  # type: ignore[arg-type]
    )
    events: list = []
    record = asyncio.run(ResearchAgent(model, tools, config).run("Which page?", events.append))
    assert record.prediction == "done", record.termination
    assert any(e.type == "compaction" for e in events)
    duplicates = [json.loads(e.data["message"])["arguments"]["query"][0]
                  for e in events if e.type == "error" and e.data["kind"] == "duplicate_tool_call"]
    return duplicates, record.dedup_count


def test_a_model_restarted_from_a_report_may_repeat_its_queries():
    duplicates, count = _run("summarise")
    assert duplicates == [] and count == 0


def test_keep_last_k_forgets_only_the_calls_whose_results_are_stubbed():
    duplicates, count = _run("keep-last-k")
    assert duplicates, "the query whose result is still in view is a duplicate"
    assert "q1" not in duplicates  # q1's result is stubbed: repeating it is no duplicate
    assert count == len(duplicates)
