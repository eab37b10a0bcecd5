"""Whether a tool body is one of the loop's notices, or a visit frame a failure, depends only on
the profile it is read for (issue 42, item 3: "no global text table whose answers depend on
history"): the readers are handed the profile's texts; loading DR-Venus's pinned files
registers nothing. Shown in fresh processes that build the dr-venus stack then the default one,
and the other way round: the same answers. DR-Venus's words are the fixture checkout's
(tests/fixtures/reference), so this runs without the real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from drvenus import protocol as P
from drvenus.reference.dr_venus import load_dr_venus_texts
from helpers.cli import ROOT
from helpers.reference import FIXTURES, fixture_source, fixture_store

# Builds each profile's stack (the agent preset and the server's pool) in the order given,
# then reads the same bodies for each, through the readers and the product paths (the
# conversation state the loop keeps, /api/replay of a saved record, a run's sources).
SCRIPT = r"""
import json, sys
from drvenus.reference.sources import SOURCES, Source
given = json.loads(sys.stdin.read())
SOURCES["DR-Venus"] = Source(**given["source"])
from drvenus import protocol as P
from drvenus.config import load_settings
from drvenus.protocol.state import TurnState
from drvenus.serve.agents import pool_from_settings
from drvenus.serve.view import finished_view, load_saved
from drvenus.stack import agent_config

answers = {}
for name in given["order"]:
    settings = load_settings(base_url="http://127.0.0.1:9/v1", protocol=name)
    config, pool = agent_config(settings), pool_from_settings(settings)
    texts = config.texts
    record = given["record"]
    answers[name] = {
        "texts": texts.name,
        "notices": [P.notice_kind(b, texts) for b in given["bodies"]],
        "messages": [P.classify_tool_response(P.wrap_tool_response(b), texts)
                     for b in given["bodies"]],
        "failures": [P.is_visit_failure(s, texts) for s in given["summaries"]],
        "read": list(TurnState.of(record["messages"], texts).read),
        "replay": [e["type"] for e in load_saved(json.dumps(record), pool.texts)[0]["events"]],
        "sources": finished_view(record, pool.texts)["sources"],
    }
print(json.dumps(answers))
"""


def _inputs(tmp_path: Path) -> dict:
    ours = P.DRVENUS_TEXTS
    theirs = load_dr_venus_texts(fixture_store(tmp_path)).protocol_texts()
    bodies = [ours.format_error, ours.step_limit, theirs.format_error, theirs.context_limit,
              "an ordinary page"]
    summaries = [ours.visit_failed_summary, theirs.visit_failed_summary, "The page says so."]
    frames = [P.render_visit(f"https://example.org/{i}", "g", s, "e")
              for i, s in enumerate(summaries)]
    turn = P.render_tool_call_turn("s", json.dumps(
        {"name": "visit", "arguments": {"url": ["https://example.org/0"], "goal": "g"}}))
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q?"},
                {"role": "assistant", "content": turn},
                {"role": "user", "content": P.wrap_tool_response(P.join_visits(frames))},
                {"role": "assistant", "content": "no call"},
                {"role": "user", "content": P.wrap_tool_response(theirs.format_error)},
                {"role": "assistant", "content": "no call"},
                {"role": "user", "content": P.wrap_tool_response(ours.format_error)},
                {"role": "assistant", "content": P.render_answer_turn("t", "done")}]
    record = {"question": "q?", "messages": messages, "prediction": "done",
              "termination": "answered"}
    source = asdict(fixture_source())
    source["files"] = dict(source["files"])
    return {"source": source, "bodies": bodies, "summaries": summaries, "record": record}


def _answers(tmp_path: Path, order: list[str], given: dict) -> dict:
    """The answers of a fresh process that builds the stacks in ``order``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRVENUS_")}
    env.update(PYTHONPATH=str(ROOT / "src"), DRVENUS_REFERENCE_DIR=str(FIXTURES),
               DRVENUS_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", SCRIPT], input=json.dumps({**given,
                          "order": order}), capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_answers_do_not_depend_on_which_profile_was_built_first(tmp_path):
    given = _inputs(tmp_path)
    first = _answers(tmp_path, ["dr-venus", "drvenus"], given)
    second = _answers(tmp_path, ["drvenus", "dr-venus"], given)
    assert first == second
    ours, theirs = first["drvenus"], first["dr-venus"]
    assert (ours["texts"], theirs["texts"]) == ("drvenus", "dr-venus")
    # each profile knows its own notices and failure frame, not the other's
    assert ours["notices"] == ["format_error", "step_limit", None, None, None]
    assert theirs["notices"] == [None, None, "format_error", "context_limit", None]
    assert ours["messages"] == ["message", "message", None, None, None]
    assert theirs["messages"] == [None, None, "message", "message", None]
    assert ours["failures"] == [True, False, False]
    assert theirs["failures"] == [False, True, False]
    # the conversation state leaves out only the profile's own notices
    assert given["bodies"][2] in ours["read"] and given["bodies"][0] not in ours["read"]
    assert given["bodies"][0] in theirs["read"] and given["bodies"][2] not in theirs["read"]
    # a dr-venus server reads DR-Venus's words and drvenus's (a saved file of ours replayed);
    # a drvenus server only its own: DR-Venus's format error is a tool's reply there
    assert theirs["replay"].count("format_error") == 2
    assert ours["replay"].count("format_error") == 1
    assert theirs["sources"] == ["https://example.org/2"]  # both failure frames left out
    assert ours["sources"] == ["https://example.org/1", "https://example.org/2"]


def test_loading_dr_venus_s_texts_changes_no_default_answer(tmp_path):
    """In this process too: the default readers answer the same before and after DR-Venus's
    texts are loaded (nothing is registered by loading them)."""
    theirs_body = "FIXTURE-STEPS: no tool calls are left. Answer in `<answer></answer>` now."
    before = (P.notice_kind(theirs_body), P.classify_tool_response(
        P.wrap_tool_response(theirs_body)), P.visit_failure_marks())
    theirs = load_dr_venus_texts(fixture_store(tmp_path)).protocol_texts()
    assert theirs.step_limit.strip() == theirs_body  # the fixture's words
    after = (P.notice_kind(theirs_body), P.classify_tool_response(
        P.wrap_tool_response(theirs_body)), P.visit_failure_marks())
    assert before == after == (None, None, (P.DRVENUS_TEXTS.visit_failed_summary,))
    assert not hasattr(P, "register_texts")


def test_a_tool_server_keeps_out_of_its_cache_the_failure_frames_of_its_own_profile(tmp_path):
    from drvenus.tools.pages import FetchReader
    from drvenus.tools.server import ResponseCache, cacheable, toolbox_texts
    from drvenus.tools.toolbox import Toolbox
    from drvenus.tools.visit import Visit

    theirs = load_dr_venus_texts(fixture_store(tmp_path)).protocol_texts()
    box = Toolbox([Visit([FetchReader()], texts=theirs)])
    assert toolbox_texts(box) is theirs and toolbox_texts(object()) is P.DRVENUS_TEXTS
    failed = theirs.visit_failure("https://example.org/", "g")
    assert not cacheable(failed, theirs) and cacheable(failed)  # drvenus's words: a page
    cache = ResponseCache(texts=toolbox_texts(box))
    cache.put("k", failed)
    assert cache.get("k") is None

