"""The loop against the real limits: window-fitted budgets, deadlines, one retry policy,
context overflow, cancellation, usage accounting and replayable traces."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

from drvenus import protocol as P
from drvenus.agent import AgentConfig, ResearchAgent, fit_to_window, read_trace, replay_messages
from drvenus.agent.events import TraceWriter
from drvenus.llm.base import Generation, LLMError
from scripted import ScriptedModel, ScriptedTools, answer, call, llm_down

FAST = AgentConfig(backoff_base=0.0, current_date="2026-11-30")
SEARCH_BODY = '[{"query": "q", "web_page_info_list": []}]'


def run(model, config=FAST, tools=None, events=None):
    agent = ResearchAgent(model, tools or ScriptedTools(SEARCH_BODY), config)
    return asyncio.run(agent.run("Who wrote Dracula?", events.append if events is not None else None))


def searches(n):
    return [call("search", query=[f"query {i}"]) for i in range(n)]


# ------------------------------------------------------------------ budgets fit the window
def test_budgets_fit_the_window():
    full = AgentConfig()
    small = fit_to_window(full, 32_768)
    assert small.sampling.max_tokens == 8192 and small.max_context_tokens == 32_768 - 8192
    assert fit_to_window(full, 262_144) == replace(full, max_context_tokens=230_000)
    assert fit_to_window(full, None) is full


def test_a_run_that_fills_the_window_ends_with_the_forced_answer():
    def reply(messages):
        if "maximum context length" in messages[-1]["content"]:
            return answer("Stoker")
        return call("search", query=[f"query {len(messages)}"])

    model = ScriptedModel([reply])
    model.window = 2048
    tools = ScriptedTools("x" * 2000)  # ~500 tokens per tool response
    rec = run(model, FAST, tools)
    assert rec.termination == "answered_token_limit" and rec.prediction == "Stoker"
    assert rec.messages[-2]["content"] == P.wrap_tool_response(P.CONTEXT_LIMIT_MESSAGE)
    assert all(c["max_tokens"] <= 512 for c in model.calls)  # a quarter of the window


def test_context_overflow_from_the_server_forces_the_answer():
    overflow = LLMError("HTTP 400: the request exceeds the available context size", context_overflow=True)
    model = ScriptedModel([call("search", query=["a"]), overflow, answer("Stoker")])
    events = []
    rec = run(model, FAST, events=events)
    assert rec.termination == "answered_token_limit" and rec.error is None
    assert rec.messages[-2]["content"] == P.wrap_tool_response(P.CONTEXT_LIMIT_MESSAGE)
    assert len(model.calls) == 3  # an overflow is not retried
    assert replay_messages(events) == rec.messages


# ------------------------------------------------------------------ deadlines and retries
def test_time_limit_is_honoured_within_a_second():
    model = ScriptedModel([call("search", query=["a"])], delay=60.0)
    start = time.monotonic()
    rec = run(model, replace(FAST, time_limit=1.0))
    # ~1 s expected; the model alone would take a minute (loose for a busy machine)
    assert rec.termination == "timeout" and time.monotonic() - start < 10
    assert len(model.calls) == 1
    assert 0 < model.calls[0]["timeout"] <= 1.5  # the request's deadline is what is left


def test_failing_model_ends_as_llm_error_whatever_the_time_limit():
    # backoff longer than the time limit: no retry fits, the error is the outcome
    model = ScriptedModel([llm_down()])
    start = time.monotonic()
    rec = run(model, replace(FAST, time_limit=20.0, backoff_base=60.0, backoff_max=120.0))
    assert rec.termination == "llm_error" and "connection refused" in rec.error
    assert len(model.calls) == 1  # no retry: a backoff of 30-60 s does not fit the 20 s left
    assert time.monotonic() - start < 10  # nor any wait for the 20 s limit

    class Hanging(ScriptedModel):  # fails, then hangs: time runs out while it is failing
        async def generate(self, messages, params, **kw):
            if not self.calls:
                self.calls.append(kw)
                raise llm_down()
            self.calls.append(kw)
            await asyncio.sleep(30)

    rec = run(Hanging([]), replace(FAST, time_limit=1.0, backoff_base=0.01))
    assert rec.termination == "timeout"  # the second call was in progress, not failing


def test_one_retry_policy_bounds_the_requests():
    model = ScriptedModel([llm_down()])
    events = []
    rec = run(model, replace(FAST, max_attempts=3), events=events)
    assert rec.termination == "llm_error" and len(model.calls) == 3
    assert [e.data["last"] for e in events if e.type == "error"] == [False, False, True]
    denied = ScriptedModel([LLMError("HTTP 401: bad key")])  # not transient: no retry at all
    rec = run(denied, FAST)
    assert rec.termination == "llm_error" and len(denied.calls) == 1 and "401" in rec.error


# ------------------------------------------------------------------ usage
def test_usage_counts_prompt_tokens_evaluated_versus_cached():
    class Cached(ScriptedModel):
        async def generate(self, messages, params, **kw):
            g = await super().generate(messages, params, **kw)
            prompt = 100 * len(messages)
            return Generation(g.text, prompt_tokens=prompt, completion_tokens=10,
                              cached_tokens=prompt - 100 if len(messages) > 2 else 0)

    rec = run(Cached([call("search", query=["a"]), answer("x")]))
    assert rec.usage == {
        "calls": 2, "prompt_tokens": 200 + 400, "prompt_tokens_evaluated": 200 + 100,
        "completion_tokens": 20,
    }
    assert json.loads(json.dumps(rec.to_dict()))["usage"]["calls"] == 2


# ------------------------------------------------------------------ cancellation
def test_cancelled_run_closes_its_trace_with_an_interrupted_record():
    events = []

    async def go():
        agent = ResearchAgent(ScriptedModel([call("search", query=["a"])], delay=5), ScriptedTools(SEARCH_BODY), FAST)
        task = asyncio.create_task(agent.run("q?", events.append))
        await asyncio.sleep(0.2)
        task.cancel()
        return await asyncio.gather(task, return_exceptions=True)

    (result,) = asyncio.run(go())
    assert isinstance(result, asyncio.CancelledError)
    assert events[-1].type == "finished"
    assert events[-1].data["record"]["termination"] == "interrupted"


# ------------------------------------------------------------------ replay
def test_trace_replays_to_the_exact_messages(tmp_path):
    """Every kind of change: turns, tool results, a format error, the step-limit notice."""
    replies = [
        call("search", query=["a"]),
        "no tags at all",  # unusable turn: parse errors, then the format-error reply
        call("visit", url=["https://en.wikipedia.org/wiki/Dracula"], goal="author"),
        answer("Stoker"),
    ]
    model = ScriptedModel(replies)
    model.replies = [replies[0], *[replies[1]] * 5, replies[2], replies[3]]
    trace = tmp_path / "trace.jsonl"
    writer = TraceWriter(str(trace))
    events = []

    def both(e):
        events.append(e)
        writer(e)

    agent = ResearchAgent(model, ScriptedTools(SEARCH_BODY), replace(FAST, max_steps=3))
    rec = asyncio.run(agent.run("Who wrote Dracula?", both))
    writer.close()
    kinds = {e.type for e in events}
    assert {"started", "turn", "tool_result", "format_error", "limit_notice"} <= kinds
    assert rec.termination == "answered_max_steps"
    assert replay_messages(events) == rec.messages
    (run_events,) = read_trace(trace)
    assert replay_messages(run_events) == rec.messages  # from disk too
    assert run_events[-1]["data"]["record"]["messages"] == rec.messages
    steps = [e.step for e in events]
    assert steps == sorted(steps) and steps[-1] == 3  # one meaning: the agent step
