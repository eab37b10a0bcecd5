"""The run registry (ids, stored events, limits, stop, reload from disk) and the views of events
and saved files, without HTTP."""

from __future__ import annotations

import asyncio
import json

import pytest

from drvenus.agent import AgentConfig, ResearchAgent
from drvenus.serve.agents import AgentPool, Choice, Preset
from drvenus.serve.runs import Busy, RunRegistry
from drvenus.serve.view import final_text, load_saved, progress_line
from helpers.serve import DRACULA, make_registry
from scripted import ScriptedModel, ScriptedTools, answer


def run(coro):
    return asyncio.run(coro)


def test_finished_runs_are_read_back_from_their_files(tmp_path):
    async def go():
        registry = make_registry(tmp_path)
        started = registry.start("Who wrote Dracula?", owner="visitor-1")
        record = await started.wait()
        return started.id, record

    run_id, record = run(go())
    assert record["prediction"] == "Bram Stoker"
    fresh = make_registry(tmp_path)  # a new server on the same runs folder
    again = fresh.get(run_id)
    assert again is not None and again.status == "done"
    assert again.question == "Who wrote Dracula?" and again.record["prediction"] == "Bram Stoker"
    assert [r["id"] for r in fresh.list()] == [run_id]
    # who started it, and from where, is kept in its file: a visitor still sees their own
    assert again.origin == "page" and again.owner == "visitor-1"
    assert [r["id"] for r in fresh.list(everyone=False, owner="visitor-1")] == [run_id]
    assert fresh.list(everyone=False, owner="visitor-2") == []
    assert fresh.list(everyone=False) == []
    # a file cut short (the server died mid-run) is a "lost" run
    lines = (tmp_path / f"{run_id}.jsonl").read_text().splitlines()
    (tmp_path / "20200101-000000-dead.jsonl").write_text("\n".join(lines[:3]) + "\n")
    lost = fresh.get("20200101-000000-dead")
    assert lost is not None and lost.status == "lost" and lost.record is None
    assert fresh.get("../etc/passwd") is None and fresh.get("missing") is None


def test_limits_and_bad_choices(tmp_path):
    async def go():
        registry = make_registry(tmp_path, max_running=1, max_waiting=0)
        first = registry.start("slow one")
        with pytest.raises(Busy):
            registry.start("slow two")
        with pytest.raises(ValueError):
            registry.start(" ")
        await registry.aclose()
        return first

    first = run(go())
    assert first.record["termination"] == "interrupted"
    with pytest.raises(ValueError, match="unknown model preset"):
        make_registry(tmp_path).pool.check(Choice(model="gpt"))
    with pytest.raises(ValueError, match="max_steps"):
        make_registry(tmp_path).pool.check(Choice(max_steps=10_000))


def test_a_model_that_cannot_be_built_ends_the_run_with_its_error(tmp_path):
    def broken():
        raise OSError("no such model file: x.gguf")

    pool = AgentPool({"default": Preset("broken", broken)},
                     {"default": Preset("tools", ScriptedTools)})

    async def go():
        registry = RunRegistry(pool, tmp_path)
        return await registry.start("anything").wait()

    record = run(go())
    assert record["termination"] == "exception" and "x.gguf" in record["error"]


def test_the_step_limit_of_a_run_is_its_own(tmp_path):
    model = ScriptedModel([answer("fine")])
    agent = ResearchAgent(model, ScriptedTools(), AgentConfig(max_steps=3))
    pool = AgentPool.fixed(agent)

    async def go():
        one = await pool.agent(Choice(max_steps=1))
        default = await pool.agent(Choice())
        return one.config.max_steps, default.config.max_steps

    assert run(go()) == (1, 3)


def test_load_saved_accepts_the_saved_formats():
    record = {
        "question": "Q?", "prediction": "A", "termination": "answered",
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "Q?"},
                     {"role": "assistant", "content": answer("A")}],
    }
    for text in (json.dumps(record), json.dumps([record, record]),
                 json.dumps(record) + "\n" + json.dumps(record) + "\n"):
        runs = load_saved(text)
        assert runs[0]["question"] == "Q?"
        assert [e["type"] for e in runs[0]["events"]][-2:] == ["answer", "finished"]
    for bad in ("", "[1, 2]", '{"a": 1}', "{\nnot json"):
        with pytest.raises(ValueError):
            load_saved(bad)


def test_final_text_and_progress_lines():
    messages = [{"role": "user", "content": "<tool_response>\nnot a frame\n</tool_response>"}]
    failed = {"termination": "llm_error", "error": "model down", "prediction": "No answer found",
              "messages": messages}
    assert final_text(failed) == "The model could not be reached: model down."
    dead = {**failed, "error": "model server at http://10.0.0.7:8000/v1: cannot connect (refused);"
                               " is the server running at http://10.0.0.7:8000/v1?"}
    assert final_text(dead) == ("The model could not be reached: the model server: cannot connect "
                               "(refused).")
    ok = {"termination": "answered", "prediction": "Stoker", "messages": []}
    assert final_text(ok) == "Stoker"
    event = {"type": "tool_call", "step": 0,
             "data": {"name": "visit", "arguments": {"url": [DRACULA], "goal": "g"}}}
    assert progress_line(event) == f"Visiting: {DRACULA}"
    assert progress_line({"type": "turn", "step": 0, "data": {}}) is None


def test_serve_says_when_its_model_server_is_down_and_logs_each_run(tmp_path):
    """``serve --base-url`` with a dead model server warns the operator at start (with its
    address) and tells visitors it is not answering, never where it is (config, a run's events
    and result); with a live one, the page names the model the server reports and the
    operator's console gets a line per run started and finished."""
    import os
    import time

    import httpx

    from helpers.cli import ANSWER, ROOT
    from helpers.serve import Served
    from stub_server import StubServer

    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "DRVENUS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("DRVENUS_SERVE_TOKEN", None)
    address = "127.0.0.1:9"
    dead = Served(tmp_path / "r1", env | {"DRVENUS_MAX_ATTEMPTS": "1"}, "--base-url",
                  f"http://{address}/v1")
    try:
        warning = [line for line in dead.lines if "warning:" in line]
        assert warning and "not answering" in warning[0] and address in warning[0]
        config = httpx.get(dead.url + "/api/config", timeout=30).json()
        assert config["problem"] == "the model server is not answering"
        assert address not in json.dumps(config)
        run_id = httpx.post(dead.url + "/api/runs", json={"question": "Who wrote Dracula?"},
                            timeout=30).json()["id"]
        events = httpx.get(f"{dead.url}/api/runs/{run_id}/events", timeout=60).text
        result = httpx.get(f"{dead.url}/api/runs/{run_id}", timeout=30).json()["result"]
        assert result["termination"] == "llm_error" and "the model server" in result["error"]
        assert "llm_error" in events and address not in events + json.dumps(result)
        assert address in (tmp_path / "r1" / f"{run_id}.jsonl").read_text()  # the operator's
    finally:
        dead.stop()
    assert any(f"run {run_id} finished: llm_error" in line and address in line
               for line in dead.lines)  # the operator's console says where
    with StubServer([ANSWER], default=ANSWER) as model:
        live = Served(tmp_path / "r2", env, "--base-url", model.base_url)
        try:
            config = httpx.get(live.url + "/api/config", timeout=30).json()
            assert config["problem"] is None
            assert config["models"][0]["label"] == "stub-model"  # the name the server reports
            run_id = httpx.post(live.url + "/api/runs", json={"question": "Who wrote Dracula?"},
                                timeout=30).json()["id"]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(
                f"run {run_id} finished" in line for line in live.lines
            ):
                time.sleep(0.2)
        finally:
            live.stop()
    text = "".join(live.lines)
    assert f"run {run_id} started: Who wrote Dracula?" in text
    assert f"run {run_id} finished: answered" in text


def test_heavy_views_are_short_and_say_what_chose_the_answer():
    from drvenus.serve.view import finished_view, headline

    answer = ("**Bram Stoker** wrote [Dracula](https://en.wikipedia.org/wiki/Dracula_(novel)) "
              "in 1897.\n\n| book | year |\n|---|---|\n| Dracula | 1897 |\n\n" + "More. " * 50)
    assert headline(answer) == "Bram Stoker wrote Dracula in 1897."  # its first paragraph
    line = headline("More. " * 50)
    assert len(line) <= 100 and line.endswith("...")
    assert headline("snake_case and 2*3*4") == "snake_case and 2*3*4"
    # past a heading, a table or a code fence; a list's items in a row
    assert headline("## Who wrote it\n**Bram Stoker** wrote it.\nIn 1897.") == \
        "Bram Stoker wrote it. In 1897."
    assert headline("| book | year |\n|---|---|\n| Dracula | 1897 |\n\nBy *Stoker*.") == \
        "By Stoker."
    assert headline("```\ncode\n```") == "code"  # nothing else: the whole answer
    assert headline("- Bram Stoker\n- 1897") == "Bram Stoker 1897"
    assert headline("| book | year |\n|---|---|\n| Dracula | 1897 |") == "book year Dracula 1897"
    run = {"termination": "answered", "prediction": "A", "messages": []}
    for chosen_by, how in (("synthesis", "synthesised"), ("vote", "by vote"),
                           ("interrupted", "stopped before an answer was chosen")):
        record = {"termination": "interrupted", "prediction": "No answer found", "messages": [],
                  "extra": {"heavy": {"chosen_by": chosen_by, "runs": [run, run]}}}
        assert finished_view(record)["heavy"]["how"] == how


def test_a_model_named_by_its_server_is_called_so_in_the_run_and_tokens_used_are_counted(
        tmp_path):
    """A model configured by its server's address alone: the run's view names it as the
    server reported it ("fake"), as the settings menu does, not "the configured model
    server"; the result counts the tokens used apart from the final context's size."""
    from drvenus.serve.agents import UNNAMED_MODEL
    from drvenus.serve.view import finished_view, for_client

    model = ScriptedModel([answer("Bram Stoker")], usage=True)
    model.model = "fake"  # what the server's /models said
    pool = AgentPool({"default": Preset(UNNAMED_MODEL, lambda: model)},
                     {"default": Preset("tools", ScriptedTools)})

    async def go():
        registry = RunRegistry(pool, tmp_path)
        started = registry.start("Who wrote Dracula?")
        await started.wait()
        return started

    done = run(go())
    assert pool.options()["models"][0]["label"] == "fake"
    assert for_client(0, done.events[0])["view"]["model"] == "fake"
    view = finished_view(done.record)
    usage = done.record["usage"]
    assert view["tokens_used"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert view["tokens_used"] != view["final_token_count"]
