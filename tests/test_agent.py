from __future__ import annotations

import asyncio
import time

import pytest

from drvenus import protocol as P
from drvenus.agent import TERMINATIONS, AgentConfig, ResearchAgent, is_repetitive
from drvenus.agent.loop import MESSAGE_OVERHEAD_TOKENS, ContextMeter
from drvenus.llm.base import SamplingParams
from scripted import ScriptedModel, ScriptedTools, answer, call, llm_down, server_tokens

FAST = AgentConfig(backoff_base=0.0, current_date="2026-11-30")


def run(model, tools=None, config=FAST, question="Who wrote Dracula?", events=None):
    agent = ResearchAgent(model, tools or ScriptedTools('[{"query": "q", "web_page_info_list": []}]'), config)
    return asyncio.run(agent.run(question, events.append if events is not None else None))


def cfg(**kw):
    from dataclasses import replace

    return replace(FAST, **kw)


# ------------------------------------------------------------------ terminations
def test_answered_after_a_search():
    tools = ScriptedTools()
    rec = run(ScriptedModel([call("search", query=["dracula author"]), answer("Bram Stoker")]), tools)
    assert rec.termination == "answered" and rec.prediction == "Bram Stoker"
    assert rec.turns == 2 and rec.tool_call_count == 1
    assert tools.calls == [P.ToolCall("search", {"query": ["dracula author"]})]
    roles = [m["role"] for m in rec.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert rec.messages[1]["content"] == "Who wrote Dracula?"
    assert rec.messages[3]["content"].startswith("<tool_response>\n")
    assert rec.messages[0]["content"].rstrip().endswith("Current date: 2026-11-30")
    assert rec.final_token_count > 0 and rec.elapsed_seconds >= 0
    assert set(rec.to_dict()) >= {
        "question", "messages", "prediction", "termination", "turns", "parse_error_count",
        "tool_call_count", "dedup_count", "final_token_count", "elapsed_seconds",
    }


def test_answered_token_limit_replaces_newest_tool_response():
    big = ScriptedTools("x" * 4000)  # ~1000 tokens with the scripted counter
    rec = run(ScriptedModel([call("search", query=["a"]), answer("A")]), big, cfg(max_context_tokens=600))
    assert rec.termination == "answered_token_limit" and rec.prediction == "A"
    assert P.CONTEXT_LIMIT_MESSAGE in rec.messages[-2]["content"]
    assert "x" * 100 not in rec.messages[-2]["content"]


def test_token_limit_no_answer():
    model = ScriptedModel([call("search", query=["a"]), call("search", query=["b"])])
    rec = run(model, ScriptedTools("x" * 4000), cfg(max_context_tokens=600, max_attempts=1))
    assert rec.termination == "token_limit_no_answer"


def test_answered_max_steps_and_max_steps():
    replies = [call("search", query=[f"q{i}"]) for i in range(3)] + [answer("late")]
    rec = run(ScriptedModel(replies), config=cfg(max_steps=3))
    assert rec.termination == "answered_max_steps" and rec.prediction == "late"
    assert rec.tool_call_count == 3
    assert P.STEP_LIMIT_MESSAGE in rec.messages[-2]["content"]
    # the step-limit notice replaces the newest tool response, it is not added after it
    assert [m["role"] for m in rec.messages[-3:]] == ["assistant", "user", "assistant"]

    replies = [call("search", query=[f"q{i}"]) for i in range(10)]
    rec = run(ScriptedModel(replies), config=cfg(max_steps=2, max_attempts=1))
    assert rec.termination == "max_steps"


def test_timeout():
    model = ScriptedModel([call("search", query=["a"]), call("search", query=["b"])], delay=0.15)
    rec = run(model, config=cfg(time_limit=0.1))
    assert rec.termination == "timeout" and "time limit" in rec.error


def test_timeout_mid_step_is_enforced():
    model = ScriptedModel([answer("never")], delay=30)
    t0 = time.monotonic()
    rec = run(model, config=cfg(time_limit=0.1))
    assert rec.termination == "timeout"
    assert time.monotonic() - t0 < 10


def test_llm_error_after_retries():
    model = ScriptedModel([llm_down()])
    rec = run(model)
    assert rec.termination == "llm_error" and "connection refused" in rec.error
    assert len(model.calls) == 5


def test_exception_is_recorded_not_raised():
    rec = run(ScriptedModel([call("search", query=["a"])]), ScriptedTools(fail=True))
    assert rec.termination == "exception" and "tool exploded" in rec.error


def test_empty_question_is_rejected():
    with pytest.raises(ValueError):
        run(ScriptedModel([answer("x")]), question="   ")


def test_all_terminations_are_known():
    assert set(TERMINATIONS) == {
        "answered", "answered_token_limit", "token_limit_no_answer", "answered_max_steps",
        "max_steps", "timeout", "llm_error", "tool_error", "exception", "interrupted",
    }


# ------------------------------------------------------------------ retry causes
def test_retry_on_api_failure_then_success():
    model = ScriptedModel([llm_down(), answer("ok")])
    model.replies = [llm_down(), answer("ok")]
    rec = run(model)
    assert rec.termination == "answered" and len(model.calls) == 2


def test_retry_on_empty_output():
    model = ScriptedModel(["   ", answer("ok")])
    events = []
    rec = run(model, events=events)
    assert rec.termination == "answered"
    assert any(e.type == "error" and e.data["kind"] == "empty_output" for e in events)


def test_empty_output_every_time_is_an_llm_error():
    rec = run(ScriptedModel([""]))
    assert rec.termination == "llm_error" and "empty" in rec.error


def test_retry_on_repetitive_tail():
    looping = "<think>\n" + "the same words again and again and again. " * 20
    model = ScriptedModel([looping, answer("ok")])
    events = []
    rec = run(model, events=events)
    assert rec.termination == "answered" and len(model.calls) == 2
    assert any(e.data.get("kind") == "repetition" for e in events if e.type == "error")


def test_retry_on_parse_error_counts_errors():
    model = ScriptedModel(["<think>x</think><tool_call>{bad json</tool_call>", answer("ok")])
    rec = run(model)
    assert rec.termination == "answered" and rec.parse_error_count == 1 and rec.turns == 1


def test_parse_error_after_all_attempts_gets_error_tool_response():
    model = ScriptedModel(["<think>x</think>no call"] * 5 + [answer("ok")])
    rec = run(model)
    assert rec.termination == "answered" and rec.parse_error_count == 5
    assert rec.messages[3]["content"] == P.wrap_tool_response(P.FORMAT_ERROR_MESSAGE)
    assert rec.turns == 2


def test_unknown_tool_is_a_parse_error_listing_tools():
    events = []
    bad = '<think>x</think><tool_call>{"name": "python", "arguments": {}}</tool_call>'
    rec = run(ScriptedModel([bad, answer("ok")]), events=events)
    assert rec.parse_error_count == 1
    msg = [e.data["message"] for e in events if e.type == "error"][0]
    assert "Available tools: search, visit" in msg


def test_duplicate_tool_call_is_resampled():
    same = call("search", query=["a"])
    tools = ScriptedTools()
    model = ScriptedModel([same, same, call("search", query=["b"]), answer("ok")])
    rec = run(model, tools)
    assert rec.dedup_count == 1 and rec.tool_call_count == 2
    assert [c.arguments["query"] for c in tools.calls] == [["a"], ["b"]]


def test_duplicate_after_all_attempts_is_executed_anyway():
    same = call("search", query=["a"])
    tools = ScriptedTools()
    rec = run(ScriptedModel([same] * 6 + [answer("ok")]), tools)
    assert rec.dedup_count == 5 and len(tools.calls) == 2


def test_seed_varies_across_retries():
    model = ScriptedModel(["junk", answer("ok")])
    run(model, config=cfg(sampling=SamplingParams(seed=7)))
    assert [c["seed"] for c in model.calls] == [8, 9]


def test_grammar_kind_requested_per_step():
    model = ScriptedModel([call("search", query=["a"]), call("search", query=["b"]), answer("x")])
    run(model, config=cfg(constrained=True, min_searches=1, max_steps=2))
    assert [c["grammar"] for c in model.calls] == ["search", "any", "answer"]
    model = ScriptedModel([answer("x")])
    run(model, config=cfg(constrained=False))
    assert model.calls[0]["grammar"] is None


def test_repair_applies_to_prefilled_think_output():
    rec = run(ScriptedModel(["I know it.\n</think>\n<answer>Bram Stoker</answer>"]))
    assert rec.termination == "answered" and rec.prediction == "Bram Stoker"
    assert rec.messages[-1]["content"].startswith("<think>\n")


# ------------------------------------------------------------------ tokens + events
def test_context_tokens_are_counted_incrementally():
    """Each message is tokenised once: total tokenised text stays linear in the history."""
    steps = 60
    replies = [call("search", query=[f"q{i}"]) for i in range(steps)] + [answer("done")]
    model = ScriptedModel(replies)
    rec = run(model, ScriptedTools("y" * 2000), cfg(max_steps=200))
    total_chars = sum(len(m["content"]) for m in rec.messages)
    assert model.tokenized_chars <= total_chars * 1.05
    assert rec.final_token_count == pytest.approx(total_chars / 4 + 4 * len(rec.messages), rel=0.05)


def test_server_usage_numbers_anchor_the_count():
    """The server counts twice the local estimate: the record follows the server."""
    model = ScriptedModel([call("search", query=["a"]), answer("x")], usage=True)
    rec = run(model)
    server = sum(server_tokens(m["content"]) + 4 for m in rec.messages)
    local = sum(len(m["content"]) // 4 + 4 for m in rec.messages)
    assert server > local + 50
    assert rec.final_token_count == pytest.approx(server, rel=0.05)


def test_context_meter_anchors_and_extrapolates():
    meter = ContextMeter(lambda text: len(text) // 4)
    meter.add("x" * 400)
    assert meter.tokens == 100 + MESSAGE_OVERHEAD_TOKENS
    meter.anchor(300)  # the server's count of the history: 400 chars cost 300 tokens
    assert meter.tokens == 300
    meter.add("y" * 40)  # estimated at the server's ratio, not the local 4 chars a token
    assert meter.tokens == 300 + 30 + MESSAGE_OVERHEAD_TOKENS
    meter.add("z", tokens=7)  # a known count (the completion) is taken as is
    assert meter.tokens == 300 + 30 + 7 + 2 * MESSAGE_OVERHEAD_TOKENS
    meter.replace("y" * 40, "w" * 80)
    assert meter.tokens == 300 + 60 + 7 + 2 * MESSAGE_OVERHEAD_TOKENS
    meter.anchor(0)  # no usage reported: nothing changes
    assert meter.tokens == 300 + 60 + 7 + 2 * MESSAGE_OVERHEAD_TOKENS


def test_event_stream_order_and_record():
    model = ScriptedModel([call("visit", url=["https://en.wikipedia.org/wiki/Dracula"], goal="author"), answer("Stoker")])
    agent = ResearchAgent(model, ScriptedTools("page"), FAST)

    async def collect():
        return [e async for e in agent.stream("Who wrote Dracula?")]

    events = asyncio.run(collect())
    types = [e.type for e in events]
    assert types[0] == "started" and types[1] == "step_started" and types[-1] == "finished"
    assert types.index("tool_call") < types.index("tool_result") < types.index("answer")
    tc = next(e for e in events if e.type == "tool_call")
    assert tc.data == {"name": "visit", "arguments": {"url": ["https://en.wikipedia.org/wiki/Dracula"], "goal": "author"}}
    assert events[-1].data["record"]["prediction"] == "Stoker"
    assert all(isinstance(e.to_dict(), dict) for e in events)


def test_async_callback_is_awaited():
    seen = []

    async def cb(event):
        await asyncio.sleep(0)
        seen.append(event.type)

    agent = ResearchAgent(ScriptedModel([answer("x")]), ScriptedTools(), FAST)
    asyncio.run(agent.run("q?", cb))
    assert seen[-1] == "finished" and "answer" in seen


def test_many_questions_run_concurrently():
    model = ScriptedModel([call("search", query=["a"]), answer("x")], delay=0.2)

    async def many():
        agents = [ResearchAgent(ScriptedModel(model.replies, delay=0.2), ScriptedTools(), FAST) for _ in range(20)]
        return await asyncio.gather(*(a.run(f"q{i}") for i, a in enumerate(agents)))

    t0 = time.monotonic()
    records = asyncio.run(many())
    assert all(r.termination == "answered" for r in records)
    assert time.monotonic() - t0 < 20 * 0.4 / 2  # far below running them one after another


def test_is_repetitive():
    assert not is_repetitive("short")
    assert is_repetitive("abcde" * 100)
    assert not is_repetitive(" ".join(str(i) for i in range(300)))
