"""Context strategies (drvenus.agent.context) on a model that never stops searching."""

from __future__ import annotations

import asyncio
import json

import pytest

from drvenus import protocol
from drvenus.agent import AgentConfig, ContextPolicy, ResearchAgent, replay_messages
from drvenus.agent.context import ContextManager, elide_old_tool_responses
from drvenus.agent.loop import MESSAGE_OVERHEAD_TOKENS
from drvenus.protocol import DRVENUS_TEXTS
from drvenus.protocol.compaction import SUMMARY_CLOSING
from scripted import ScriptedModel, ScriptedTools, answer

WINDOW = 16_384
PAGE = "x" * 8_000  # 2,000 tokens at the scripted model's four characters per token
REPORT = "Found so far: nothing conclusive. Next: search further."


def prompt_tokens(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) // 4 + MESSAGE_OVERHEAD_TOKENS for m in messages)


class Searcher:
    """Searches forever with short turns; answers only when told the context or steps are
    spent; writes a report when asked. Records the size of every prompt."""

    def __init__(self) -> None:
        self.prompts: list[int] = []
        self.n = 0

    def __call__(self, messages: list[dict[str, str]]) -> str:
        self.prompts.append(prompt_tokens(messages))
        last = messages[-1]["content"]
        if last == protocol.SUMMARY_REQUEST:
            return REPORT
        if protocol.notice_kind(protocol.unwrap_tool_response(last) or "") in (
            "context_limit", "step_limit"
        ):
            return answer("best guess")
        self.n += 1
        body = json.dumps({"name": "search", "arguments": {"query": [f"q{self.n}"]}})
        return protocol.render_tool_call_turn("s", body)


def run(strategy: str, keep_last: int = 2, max_steps: int = 200):
    searcher = Searcher()
    model = ScriptedModel([searcher])
    model.window = WINDOW
    config = AgentConfig(
        max_steps=max_steps, max_attempts=1, backoff_base=0.0,
        context=ContextPolicy(strategy=strategy, keep_last=keep_last),  # type: ignore[arg-type]
    )
    agent = ResearchAgent(model, ScriptedTools(PAGE), config)
    events = []
    record = asyncio.run(agent.run("Which page says it?", events.append))
    return record, searcher, events, agent


def test_none_is_forced_to_answer_after_a_few_steps():
    record, searcher, events, _ = run("none")
    assert record.termination == "answered_token_limit"
    assert record.prediction == "best guess"
    assert record.tool_call_count < 8
    assert not any(e.type == "compaction" for e in events)


@pytest.mark.parametrize("strategy", ["keep-last-k", "summarise"])
def test_strategies_reach_the_step_limit_inside_the_window(strategy):
    record, searcher, events, agent = run(strategy)
    cfg = agent._fitted
    assert record.termination == "answered_max_steps"
    assert record.tool_call_count == 200
    # every prompt, the reply's room included, fits the window
    assert max(searcher.prompts) + cfg.sampling.max_tokens <= WINDOW
    compactions = [e for e in events if e.type == "compaction"]
    assert compactions and record.extra["compactions"] == len(compactions)
    # rare and in large blocks: each frees a good share of the budget
    assert len(compactions) <= 200 // 2
    for e in compactions:
        assert e.data["tokens_before"] - e.data["tokens_after"] >= cfg.max_context_tokens // 4
    # the trace replays to the final conversation; the head is stable
    assert replay_messages(events) == record.messages
    assert record.messages[:2] == replay_messages(events[:1])
    if strategy == "summarise":
        # the report, and the recap of the searches made (tests/test_agent_compaction_recap.py)
        assert record.messages[2]["content"].startswith(
            protocol.summary_message(REPORT)["content"].removesuffix(SUMMARY_CLOSING))
        assert record.usage["calls"] == 201 + len(compactions)  # the reports are model calls


def test_keep_last_k_stubs_all_but_the_last_k():
    wrapped = protocol.wrap_tool_response
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    for i in range(4):
        messages += [{"role": "assistant", "content": f"t{i}"},
                     {"role": "user", "content": wrapped(f"page {i}")}]
    new, elided = elide_old_tool_responses(messages, 2, 1)
    assert elided == (3, 5, 7)
    assert all(protocol.is_elided(new[i]["content"]) for i in elided)
    assert new[9] == messages[9] and new[:3] == messages[:3]
    assert elide_old_tool_responses(new, 2, 1) == (new, ())  # nothing more to free


def test_nothing_to_free_still_forces_the_answer():
    # keep 10 pages whole: more than the budget holds, so stubbing frees nothing in time
    record, _, events, _ = run("keep-last-k", keep_last=10)
    assert record.termination == "answered_token_limit"
    assert not any(e.type == "compaction" for e in events)


def test_a_failed_report_ends_with_the_forced_answer():
    def replies(messages):
        if messages[-1]["content"] == protocol.SUMMARY_REQUEST:
            return ""  # no report
        return Searcher()(messages) if "context" not in messages[-1]["content"] else answer("a")

    model = ScriptedModel([replies])
    model.window = WINDOW
    config = AgentConfig(max_attempts=1, backoff_base=0.0,
                         context=ContextPolicy(strategy="summarise"))
    events = []
    record = asyncio.run(
        ResearchAgent(model, ScriptedTools(PAGE), config).run("q?", events.append)
    )
    assert record.termination.startswith("answered_token_limit") or record.termination.startswith(
        "token_limit")
    assert any(e.type == "error" and e.data["kind"] == "compaction_failed" for e in events)
    assert record.messages[:2] == replay_messages(events[:1])


def test_compaction_is_due_only_past_the_threshold():
    manager = ContextManager(ContextPolicy(strategy="keep-last-k", compact_at=0.5), 1000)
    assert not manager.due(500) and manager.due(501)
    assert not ContextManager(ContextPolicy(), 1000).due(10**6)
    with pytest.raises(ValueError, match="unknown context strategy"):
        ContextPolicy(strategy="bogus")  # type: ignore[arg-type]
    assert DRVENUS_TEXTS.context_limit  # the notice the forced answer follows


def test_settings_choose_the_strategy(monkeypatch):
    from drvenus.config import load_settings
    from drvenus.stack import agent_config

    monkeypatch.setenv("DRVENUS_CONTEXT_STRATEGY", "summarise")
    cfg = agent_config(load_settings(base_url="http://127.0.0.1:9/v1", keep_last=4))
    assert (cfg.context.strategy, cfg.context.keep_last) == ("summarise", 4)
    assert agent_config(load_settings(base_url="http://127.0.0.1:9/v1",
                                      context_strategy="none")).context == ContextPolicy()


@pytest.mark.parametrize("strategy", ["keep-last-k", "summarise"])
def test_compactions_are_shown_in_the_terminal_and_the_web_views(strategy):
    from rich.console import Console

    from drvenus.cli.console import LiveTrace
    from drvenus.serve.view import describe, progress_line

    _, _, events, _ = run(strategy, max_steps=12)
    event = next(e for e in events if e.type == "compaction")
    view = describe(event.to_dict())
    assert view["strategy"] == strategy and view["tokens_after"] < view["tokens_before"]
    assert (view["report"] == REPORT) == (strategy == "summarise")
    assert progress_line(event.to_dict()).startswith("Context compacted")
    console = Console(record=True, width=200)
    LiveTrace(console)(event)
    assert "context compacted" in console.export_text()


def test_a_window_far_below_the_budget_is_warned_about(caplog):
    from drvenus.agent.context import small_window_warning

    assert small_window_warning(None, 230_000) is None
    assert small_window_warning(32_768, 230_000) is None  # small machines' usual window
    assert small_window_warning(4096, 6500) is None  # the embedded preset: budget fits
    model = ScriptedModel([answer("x")])
    model.window = 2048
    with caplog.at_level("WARNING"):
        asyncio.run(ResearchAgent(model, ScriptedTools(), AgentConfig()).run("q?"))
    assert "2048 tokens, far below the 230000-token budget" in caplog.text


def test_ollama_is_told_to_raise_its_window(caplog):
    from drvenus.llm.openai_compat import OpenAICompatModel
    from stub_server import StubServer

    with StubServer([answer("x")], owned_by="library") as server, caplog.at_level("WARNING"):
        model = OpenAICompatModel(server.base_url, None, None)
        assert asyncio.run(model.context_window()) is None
    assert "OLLAMA_CONTEXT_LENGTH" in caplog.text
