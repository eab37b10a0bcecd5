"""``--protocol dr-venus`` takes DR-Venus's model habits (Inference/run_demo.py
``_call_llm_once`` and ``_generate``), drvenus's own profile keeps its own: a reply stripped
before it is stored; a blank reply on a step's last attempt ends the run as ``llm_error``;
every model error retried, an HTTP 400 too. And an empty extractor reply, on which DR-Venus's
visit crashes, reads as a reply too short (docs/AGENT.md)."""

from __future__ import annotations

import asyncio

from dr_venus_functions import NEEDS_REFERENCE
from drvenus.agent import AgentConfig, ResearchAgent
from drvenus.llm.base import LLMError
from drvenus.protocol.dr_venus import DR_VENUS_READER
from drvenus.reference.profiles import profile
from scripted import ScriptedModel, ScriptedTools, answer, call

NO_CALL = "<think>x</think>no call and no answer"


def config(name: str) -> AgentConfig:
    """The loop settings a profile changes (its texts aside: they need the pinned files)."""
    chosen = profile(name)
    return AgentConfig(current_date="2026-12-06", backoff_base=0.0, reader=chosen.reader(),
                       retry_every_model_error=chosen.retry_every_model_error,
                       blank_ends_run=chosen.blank_ends_run)


def run(model: ScriptedModel, name: str):
    agent = ResearchAgent(model, ScriptedTools("[]"), config(name))
    return asyncio.run(agent.run("Who wrote Dune?"))


def test_a_reply_is_stored_stripped():
    reply = "\n  " + answer("Frank Herbert") + "  \n"
    record = run(ScriptedModel([reply]), "dr-venus")
    assert record.messages[-1]["content"] == answer("Frank Herbert")
    assert DR_VENUS_READER.read(reply).content == answer("Frank Herbert")
    ours = run(ScriptedModel([reply]), "drvenus")
    assert ours.messages[-1]["content"] == answer("Frank Herbert")  # drvenus's repair strips too


def test_a_blank_last_attempt_ends_the_run_as_llm_error():
    script = [NO_CALL, "  ", " \n", "", "   ", answer("late")]
    record = run(ScriptedModel(script), "dr-venus")
    assert record.termination == "llm_error" and record.turns == 0
    # drvenus's own: the step's last readable sample is used (the error notice follows)
    ours = run(ScriptedModel(script), "drvenus")
    assert ours.termination == "answered" and ours.prediction == "late"


def test_every_model_error_is_retried_an_http_400_too():
    script = [LLMError("HTTP 400: bad request", retryable=False), answer("Frank Herbert")]
    record = run(ScriptedModel(script), "dr-venus")
    assert record.termination == "answered" and record.prediction == "Frank Herbert"
    ours = run(ScriptedModel(script), "drvenus")
    assert ours.termination == "llm_error"


def test_a_search_call_then_an_answer_still_runs_under_both_profiles():
    for name in ("dr-venus", "drvenus"):
        record = run(ScriptedModel([call("search", query=["Dune"]), answer("x")]), name)
        assert record.termination == "answered" and record.tool_call_count == 1


def test_an_empty_extractor_reply_reads_as_too_short_then_the_failure_frame():
    """DR-Venus's call_server returns None for an empty reply and its visit raises on
    ``len(None)`` (the frame becomes "Error fetching <url>: object of type 'NoneType' has no
    len()"); drvenus reads it as the short reply its code is written for: the page cut and
    asked again (4 times), then 3 re-asks for JSON, then the failure frame (None here)."""
    from drvenus.tools.extract import LLMExtractor

    model = ScriptedModel([""])
    extractor = LLMExtractor(model, prompt="{webpage_content} {goal}", fallback=None,
                             repair=False)
    assert asyncio.run(extractor.extract("page " * 100, "goal", "https://a.example")) is None
    assert len(model.calls) == 8


def test_the_profiles_say_their_habits():
    assert profile("dr-venus").retry_every_model_error and profile("dr-venus").blank_ends_run
    assert not profile("drvenus").retry_every_model_error
    assert not profile("drvenus").blank_ends_run
    assert profile("dr-venus").reader() is DR_VENUS_READER


@NEEDS_REFERENCE
def test_the_stack_gives_the_loop_the_profile_habits():
    from drvenus.config import Settings
    from drvenus.stack import agent_config

    ours = agent_config(Settings(protocol="dr-venus", base_url="http://127.0.0.1:9/v1"))
    assert ours.retry_every_model_error and ours.blank_ends_run
    assert ours.reader is DR_VENUS_READER
    assert ours.time_limit == 18_000  # Inference/run_demo.sh's TIME_LIMIT
    given = Settings(protocol="dr-venus", base_url="http://127.0.0.1:9/v1", time_limit=60)
    assert agent_config(given).time_limit == 60
    default = agent_config(Settings(base_url="http://127.0.0.1:9/v1"))
    assert not default.retry_every_model_error and not default.blank_ends_run
    assert default.time_limit == 9000
