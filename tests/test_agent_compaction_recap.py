"""After a context compaction the model is told the searches and pages it already made (issue
44, item 3): inside the report's message (summarise), or in a message after the question once
keep-last-k drops turns; bounded. DR-Venus's profile has no such note: what ``--protocol
dr-venus`` shows is drvenus's compaction wording alone, as before."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from drvenus import protocol
from drvenus.agent import AgentConfig, ContextPolicy, ResearchAgent, replay_messages
from drvenus.protocol import ProtocolTexts
from drvenus.protocol.compaction import RECAP_MAX_CHARS, RECAP_MAX_QUERIES
from drvenus.reference.profiles import profile
from helpers.reference import use_fixture_reference
from scripted import ScriptedModel, ScriptedTools, answer

WINDOW = 16_384
PAGE = "x" * 8_000  # 2,000 tokens at the scripted model's four characters per token
REPORT = "Found so far: nothing conclusive. Next: search further."
URL = "https://example.org/first-page"


def _turn(name: str, **arguments) -> str:
    return protocol.render_tool_call_turn(
        "s", json.dumps({"name": name, "arguments": arguments}))


class Researcher:
    """Opens one page, then searches q1, q2, ... with short turns; writes the report when asked;
    answers when told a limit is reached (``texts``' notices). Keeps every prompt it is sent."""

    def __init__(self, texts: ProtocolTexts) -> None:
        self.texts = texts
        self.prompts: list[list[dict[str, str]]] = []
        self.n = 0

    def __call__(self, messages: list[dict[str, str]]) -> str:
        self.prompts.append([dict(m) for m in messages])
        last = messages[-1]["content"]
        if last == protocol.SUMMARY_REQUEST:
            return REPORT
        if self.texts.context_limit in last or self.texts.step_limit in last:
            return answer("best guess")
        self.n += 1
        if self.n == 1:
            return _turn("visit", url=[URL], goal="the date")
        return _turn("search", query=[f"q{self.n - 1}"])


def _run(strategy: str, config: AgentConfig | None = None, max_steps: int = 40):
    config = config or AgentConfig()
    model_script = Researcher(config.texts)
    model = ScriptedModel([model_script])
    model.window = WINDOW
    config = replace(config, max_steps=max_steps, max_attempts=1, backoff_base=0.0,
                     context=ContextPolicy(strategy=strategy, keep_last=2))  # type: ignore[arg-type]
    events: list = []
    record = asyncio.run(ResearchAgent(model, ScriptedTools(PAGE), config).run(
        "Which page says it?", events.append))
    compactions = [i for i, e in enumerate(events) if e.type == "compaction"]
    assert compactions, "the run compacted"
    assert replay_messages(events) == record.messages  # the trace replays exactly
    return record, events, compactions, model_script


def _made_before(events: list, index: int) -> tuple[list[str], list[str]]:
    """The queries and pages of the tool calls before event ``index``."""
    calls = [e.data for e in events[:index] if e.type == "tool_call"]
    queries = [q for c in calls if c["name"] == "search" for q in c["arguments"]["query"]]
    pages = [u for c in calls if c["name"] == "visit" for u in c["arguments"]["url"]]
    return queries, pages


def test_a_model_restarted_from_its_report_is_told_what_it_already_did():
    record, events, compactions, model_script = _run("summarise")
    for i in compactions:
        queries, pages = _made_before(events, i)
        assert queries and pages == [URL]
        note = protocol.recap(queries, pages)
        assert events[i].data["messages"][2] == protocol.summary_message(REPORT, note)
    # the prompt right after the first compaction: system, question, the report with the recap
    first = events[compactions[0]].data["messages"]
    restarted = next(p for p in model_script.prompts if p[:3] == first)
    queries, _ = _made_before(events, compactions[0])
    text = restarted[2]["content"]
    assert REPORT in text and URL in text
    assert all(f"- {q}\n" in text for q in queries)


def test_keep_last_k_tells_the_queries_of_the_dropped_turns_after_the_question():
    record, events, compactions, _ = _run("keep-last-k")
    dropping = [i for i in compactions if events[i].data["dropped"]]
    assert dropping, "turns were dropped"
    for i in compactions:  # a compaction that only stubs results adds no note
        assert ("recap" in events[i].data) == (i in dropping)
    # the first drop inserts the note after the question; later ones replace it there
    assert [events[i].data["recap_inserted"] for i in dropping] == [True] + [False] * (
        len(dropping) - 1)
    for i in dropping:
        # the note names the queries and page of the turns no longer in view, and only those
        queries, pages = _made_before(events, i)
        after = replay_messages(events[:i + 1])
        turns = " ".join(m["content"] for m in after[3:] if m["role"] == "assistant")
        gone = [q for q in queries if f'"{q}"' not in turns]
        assert gone and len(gone) < len(queries)
        note = protocol.recap_message(protocol.recap(gone, pages))
        assert events[i].data["recap"] == note and after[2] == note
    messages = record.messages
    assert sum(protocol.is_recap(m["content"]) for m in messages) == 1
    assert messages[:2] == replay_messages(events[:1])  # the head stays first
    assert URL in messages[2]["content"] and "earlier not listed" in messages[2]["content"]


def test_the_recap_is_bounded_and_plain():
    assert protocol.recap([], []) is None
    queries = [f"query number {i} " + "word " * 30 for i in range(100)]
    pages = [f"https://example.org/{i}/" + "p" * 300 for i in range(50)]
    text = protocol.recap(queries, pages)
    assert text is not None and len(text) <= RECAP_MAX_CHARS
    assert "query number 99 " in text and "query number 0 " not in text  # the latest
    listed = sum(line.startswith("- query number") for line in text.splitlines())
    assert 0 < listed <= RECAP_MAX_QUERIES
    assert f"- ({100 - listed} earlier not listed)" in text
    assert "https://example.org/49/" in text
    assert "<" not in text  # no protocol markup
    short = protocol.recap(["a\nb", "c"], [])
    assert short == f"{protocol.compaction.RECAP_QUERIES}\n- a b\n- c"


def test_the_profiles_say_whether_a_compaction_recaps():
    assert profile().compaction_recap is True
    assert profile("dr-venus").compaction_recap is False


@pytest.mark.parametrize("strategy", ["summarise", "keep-last-k"])
def test_dr_venus_s_profile_compacts_without_a_recap(strategy, monkeypatch, tmp_path):
    from drvenus.config import load_settings
    from drvenus.stack import agent_config

    use_fixture_reference(monkeypatch, tmp_path)
    config = agent_config(load_settings(base_url="http://127.0.0.1:9/v1",
                                        protocol="dr-venus", context_strategy=strategy))
    assert config.compaction_recap is False
    assert config.texts.name != "drvenus"  # DR-Venus's texts (the fixtures' words)
    record, events, compactions, _ = _run(strategy, config)
    assert not any(protocol.is_recap(m["content"]) for m in record.messages)
    for i in compactions:  # the compaction events and messages of before the recap existed
        data = events[i].data
        if strategy == "summarise":
            assert data["messages"][2] == protocol.summary_message(REPORT)
            assert set(data) == {"strategy", "messages", "report", "tokens_before",
                                 "tokens_after"}
        else:
            assert set(data) == {"strategy", "elided", "message", "head", "dropped",
                                 "tokens_before", "tokens_after"}
            assert data["head"] == 2
    if strategy == "keep-last-k":
        assert any(events[i].data["dropped"] for i in compactions)
