"""``drvenus serve`` as third-party clients meet it (real servers on 127.0.0.1, a scripted model,
the official ``openai`` and ``mcp`` clients): what a stopped run says, whose runs a visitor
sees, and the details of ``/v1`` in a chat app."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx
import pytest

from drvenus import protocol
from drvenus.agent import AgentConfig, ResearchAgent
from drvenus.serve.agents import AgentPool
from drvenus.serve.app import create_app
from drvenus.serve.runs import RunRegistry
from drvenus.serve.server import ServeThread
from scripted import PerQuestionModel, ScriptedTools, answer, call

PAGE = "https://en.wikipedia.org/wiki/Dracula"
MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<answer>")


def _forced(messages: list[dict[str, str]]) -> str:
    """Searches until told the budget is spent, then answers (a forced answer)."""
    notice = protocol.notice_kind(protocol.unwrap_tool_response(messages[-1]["content"]) or "")
    if notice is not None:
        return answer("Bram Stoker")
    turn = sum(1 for m in messages if m["role"] == "assistant")
    return call("search", query=[f"Dracula author {turn}"])


def script(question: str) -> list:
    if question.startswith("forced"):
        return [_forced]
    if question.startswith(("visit", "cites")):
        reply = ("Bram Stoker.\n\n**Sources:**\n- " + PAGE if question.startswith("cites")
                 else "Bram Stoker")
        return [call("search", query=["Dracula author"]), call("visit", url=[PAGE], goal="who"),
                answer(reply)]
    if question.startswith("slow"):
        return [call("search", query=["Dracula author"]), call("visit", url=[PAGE], goal="who"),
                answer("Bram Stoker")]
    return [call("search", query=["Dracula author"]), answer("Bram Stoker")]


def delay(question: str) -> float:
    return 3.0 if question.startswith("slow") else 0.0  # time enough to stop it mid-run


def tool_body(tool_call) -> str:
    if tool_call.name == "search":
        hits = [{"title": "Dracula", "url": PAGE, "snippet": "1897 novel by Bram Stoker"}]
        return protocol.render_search([(q, hits) for q in tool_call.arguments["query"]])
    return protocol.join_visits([protocol.render_visit(
        u, tool_call.arguments["goal"], "Bram Stoker wrote it.", "Bram Stoker wrote Dracula.")
        for u in tool_call.arguments["url"]])


def _registry(runs_dir: Path) -> RunRegistry:
    agent = ResearchAgent(
        PerQuestionModel(script, delay=delay), ScriptedTools(tool_body),
        AgentConfig(max_steps=5, max_attempts=1, backoff_base=0.0),
    )
    return RunRegistry(AgentPool.fixed(agent, "scripted"), runs_dir, max_running=4,
                       max_waiting=4)


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def server(runs_dir):
    app = create_app(_registry(runs_dir), mcp_quick_answer_seconds=0.3)
    with ServeThread(app) as running:
        yield running


def _wait_for_a_step(client: httpx.Client, run_id: str) -> None:
    """Until the run has done its first turn (a tool call), so Stop lands mid-research."""
    for _ in range(200):
        body = client.get(f"/api/runs/{run_id}").json()
        if body.get("events", 0) >= 5 or body["status"] not in ("queued", "running"):
            return
        time.sleep(0.05)


def _stop(base: str, run_id: str) -> None:
    with httpx.Client(base_url=base, timeout=30) as client:
        _wait_for_a_step(client, run_id)
        client.post(f"/api/runs/{run_id}/cancel", json={})


def _assert_stopped_in_words(text: str) -> None:
    assert text.startswith("Stopped before the model gave an answer."), text
    assert not any(tag in text for tag in MARKUP), text
    assert "interrupted" not in text and "Last output" not in text


def test_a_stopped_run_on_v1_says_so_in_words_with_finish_reason_length(server):
    openai = pytest.importorskip("openai")
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    stream = oa.chat.completions.create(
        model="drvenus", stream=True,
        messages=[{"role": "user", "content": "slow: who wrote Dracula?"}])
    chunks = []
    for chunk in stream:
        if not chunks:  # the first chunk names the run: stop it as the page's Stop does
            _stop(server.url, chunk.id.removeprefix("chatcmpl-"))
        chunks.append(chunk)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    _assert_stopped_in_words(content)
    assert "The model's last thoughts:\nI should use search." in content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_stopped_run_in_mcp_research_status_says_so_in_words(server):
    pytest.importorskip("mcp")
    from mcp import Client

    async def go():
        async with Client(server.url + "/mcp", read_timeout_seconds=20) as mcp_client:
            started = await mcp_client.call_tool("start_research",
                                                 {"question": "slow: who wrote it?"})
            run_id = started.structured_content["run_id"]
            await asyncio.to_thread(_stop, server.url, run_id)
            status = await mcp_client.call_tool(
                "research_status", {"run_id": run_id, "wait_seconds": 10})
            return status.structured_content

    status = asyncio.run(go())
    assert status["status"] == "done"
    _assert_stopped_in_words(status["answer"])


# ------------------------------------------------------------------- whose runs a visitor sees


def _listed(client: httpx.Client) -> dict[str, dict]:
    body = client.get("/api/runs").json()
    return {run["id"]: run for run in body["runs"]}


def test_a_visitor_sees_their_own_runs_not_others_nor_v1_or_mcp_ones(server, runs_dir):
    openai = pytest.importorskip("openai")
    pytest.importorskip("mcp")
    from mcp import Client

    with httpx.Client(base_url=server.url, timeout=30) as alice, \
            httpx.Client(base_url=server.url, timeout=30) as bob:
        assert alice.get("/").status_code == 200 and "drvenus_visitor" in alice.cookies
        mine = alice.post("/api/runs", json={"question": "alice: who wrote it?"}).json()
        assert mine["origin"] == "page"
        theirs = bob.post("/api/runs", json={"question": "bob: who wrote it?"}).json()
        oa = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        reply = oa.chat.completions.create(
            model="drvenus", messages=[{"role": "user", "content": "v1: who wrote it?"}])
        v1_id = reply.id.removeprefix("chatcmpl-")

        async def mcp_run() -> str:
            async with Client(server.url + "/mcp", read_timeout_seconds=20) as mcp_client:
                started = await mcp_client.call_tool("start_research",
                                                     {"question": "mcp: who wrote it?"})
                return started.structured_content["run_id"]

        mcp_id = asyncio.run(mcp_run())
        alice_sees, bob_sees = _listed(alice), _listed(bob)
        with httpx.Client(base_url=server.url, timeout=30) as stranger:
            assert _listed(stranger) == {}
        # a run is still reachable by its id (a shared link), only not listed
        assert alice.get(f"/api/runs/{theirs['id']}").status_code == 200
    assert mine["id"] in alice_sees and theirs["id"] not in alice_sees
    assert theirs["id"] in bob_sees and mine["id"] not in bob_sees
    for run_id in (v1_id, mcp_id):
        assert run_id not in alice_sees and run_id not in bob_sees
    # the operator may list every run to every visitor (read back from the files here), with
    # where each came from
    with ServeThread(create_app(_registry(runs_dir), mcp=False, all_runs=True)) as other, \
            httpx.Client(base_url=other.url, timeout=30) as anyone:
        body = anyone.get("/api/runs").json()
    assert body["all"] is True
    origins = {run["id"]: run["origin"] for run in body["runs"]}
    assert origins[mine["id"]] == "page" and origins[theirs["id"]] == "page"
    assert origins[v1_id] == "v1" and origins[mcp_id] == "mcp"


# ------------------------------------------------------------------ Ctrl-C while a page follows


def test_ctrl_c_on_serve_while_a_page_follows_a_run_ends_cleanly(tmp_path):
    """The followed run is stopped at once: the page's stream ends with the run's last events
    (``interrupted``) instead of being cut, and no CancelledError traceback is printed."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import threading

    from stub_server import Reply, StubServer

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "title": "Dracula", "url": PAGE,
                                  "text": "Dracula is an 1897 novel by Bram Stoker."}) + "\n")
    search = call("search", query=["Dracula"])
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "DRVENUS_CACHE_DIR": str(tmp_path)}
    with StubServer([search], default=Reply(content=search, delay=30)) as stub:
        proc = subprocess.Popen(
            [sys.executable, "-m", "drvenus", "serve", "--port", "0", "--base-url",
             stub.base_url, "--model-name", "m", "--corpus", str(corpus)],
            stderr=subprocess.PIPE, text=True, env=env)
        try:
            url = None
            while url is None:
                line = proc.stderr.readline()
                assert line, "serve exited before it was ready"
                found = re.search(r"serving on (http://\S+?):? ", line)
                url = found.group(1) if found else None
            page = httpx.Client(base_url=url, timeout=60)
            run_id = page.post("/api/runs", json={"question": "Who wrote Dracula?"}).json()["id"]
            received: list[str] = []

            def follow() -> None:
                with page.stream("GET", f"/api/runs/{run_id}/events") as r:
                    received.extend(r.iter_lines())

            follower = threading.Thread(target=follow, daemon=True)
            follower.start()
            for _ in range(600):  # the second model call hangs: the run is mid-research
                if len(stub.chat_requests) >= 2:
                    break
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
            follower.join(30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr
    assert "event: end" in received  # the stream ended properly, not cut
    finished = [json.loads(line[5:]) for line in received
                if line.startswith("data:") and '"type": "finished"' in line]
    assert finished and finished[-1]["view"]["termination"] == "interrupted"


# ------------------------------------------------------------------------- /v1 in a chat app


def _client(server):
    openai = pytest.importorskip("openai")
    return openai, openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_v1_marks_a_forced_answer(server):
    _, oa = _client(server)
    reply = oa.chat.completions.create(
        model="drvenus", messages=[{"role": "user", "content": "forced: who wrote Dracula?"}])
    content = reply.choices[0].message.content
    assert content.startswith("Bram Stoker\n\n_Forced answer: the step or token budget ran out")
    assert reply.choices[0].finish_reason == "stop"


def test_v1_researches_a_follow_up_with_the_conversation_as_context(server):
    _, oa = _client(server)
    reply = oa.chat.completions.create(model="drvenus", messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Who wrote Dracula?"},
        {"role": "assistant", "content": f"Bram Stoker\n\nSources:\n- {PAGE}"},
        {"role": "user", "content": "When was he born?"},
    ])
    run_id = reply.id.removeprefix("chatcmpl-")
    with httpx.Client(base_url=server.url, timeout=30) as c:
        question = c.get(f"/api/runs/{run_id}").json()["question"]
    assert "User: Who wrote Dracula?" in question and "Assistant: Bram Stoker" in question
    assert question.endswith("When was he born?") and PAGE not in question
    assert "Be brief." not in question
    # a first question is researched as it is
    first = oa.chat.completions.create(
        model="drvenus", messages=[{"role": "user", "content": "Who wrote Dracula?"}])
    with httpx.Client(base_url=server.url, timeout=30) as c:
        body = c.get(f"/api/runs/{first.id.removeprefix('chatcmpl-')}").json()
    assert body["question"] == "Who wrote Dracula?"


def test_v1_honours_stop_and_max_tokens_and_refuses_what_it_cannot_do(server):
    openai, oa = _client(server)
    question = [{"role": "user", "content": "Who wrote Dracula?"}]
    stopped = oa.chat.completions.create(model="drvenus", messages=question, stop=["Stoker"])
    assert stopped.choices[0].message.content == "Bram "
    assert stopped.choices[0].finish_reason == "stop"
    short = oa.chat.completions.create(model="drvenus", messages=question, max_tokens=1)
    assert short.choices[0].message.content == "Bram"  # about four bytes a token
    assert short.choices[0].finish_reason == "length"
    chunks = list(oa.chat.completions.create(model="drvenus", messages=question, stream=True,
                                             max_completion_tokens=1))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Bram"
    assert chunks[-1].choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as json_format:
        oa.chat.completions.create(model="drvenus", messages=question,
                                   response_format={"type": "json_object"})
    assert json_format.value.param == "response_format"
    image = [{"role": "user", "content": [
        {"type": "text", "text": "Who is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    with pytest.raises(openai.BadRequestError) as pictures:
        oa.chat.completions.create(model="drvenus", messages=image)
    assert pictures.value.param == "messages" and "images" in pictures.value.message
    with pytest.raises(openai.BadRequestError) as bad_stop:
        oa.chat.completions.create(model="drvenus", messages=question, stop=[""])
    assert bad_stop.value.param == "stop"
    text = oa.chat.completions.create(model="drvenus", messages=question,
                                      response_format={"type": "text"})
    assert text.choices[0].message.content.startswith("Bram Stoker")


# ------------------------------------------------------------------------ reports to take away


def test_a_run_report_and_trace_can_be_downloaded(server, tmp_path):
    from drvenus.agent import read_trace

    with httpx.Client(base_url=server.url, timeout=30) as page:
        running = page.post("/api/runs", json={"question": "slow: who wrote it?"}).json()["id"]
        early = page.get(f"/api/runs/{running}/report")
        run_id = page.post("/api/runs", json={"question": "visit: who wrote Dracula?"}).json()["id"]
        with page.stream("GET", f"/api/runs/{run_id}/events") as r:
            for _ in r.iter_lines():
                pass
        report = page.get(f"/api/runs/{run_id}/report")
        trace = page.get(f"/api/runs/{run_id}/trace")
        missing = page.get("/api/runs/nope/report")
        page.post(f"/api/runs/{running}/cancel", json={})
    assert early.status_code == 409 and "not over" in early.json()["error"]
    assert missing.status_code == 404
    assert report.status_code == 200 and report.headers["content-type"].startswith("text/markdown")
    assert report.headers["content-disposition"] == f'attachment; filename="drvenus-{run_id}.md"'
    text = report.text
    assert text.startswith("# visit: who wrote Dracula?\n\nBram Stoker\n\n## Sources\n\n")
    assert f"- [Dracula]({PAGE})" in text and "Answered · 2 tool calls · 3 turns" in text
    assert trace.headers["content-disposition"].endswith(f'drvenus-{run_id}.jsonl"')
    path = tmp_path / "trace.jsonl"
    path.write_bytes(trace.content)
    [events] = read_trace(path)
    assert events[0]["type"] == "started" and events[-1]["type"] == "finished"


def test_v1_does_not_add_a_second_sources_list_to_an_answer_that_has_one(server):
    _, oa = _client(server)
    cites = oa.chat.completions.create(
        model="drvenus", messages=[{"role": "user", "content": "cites: who wrote Dracula?"}])
    content = cites.choices[0].message.content
    assert content.lower().count("sources") == 1, content
    plain = oa.chat.completions.create(
        model="drvenus", messages=[{"role": "user", "content": "visit: who wrote Dracula?"}])
    assert plain.choices[0].message.content == f"Bram Stoker\n\nSources:\n- [Dracula]({PAGE})"


# --------------------------------------------------------------------------- MCP for scripts


def test_mcp_deep_research_has_a_structured_result_with_the_run_id(server):
    pytest.importorskip("mcp")
    from mcp import Client

    async def go():
        async with Client(server.url + "/mcp", read_timeout_seconds=20) as mcp_client:
            tools = {t.name: t for t in (await mcp_client.list_tools()).tools}
            quick = await mcp_client.call_tool("deep_research",
                                               {"question": "visit: who wrote Dracula?"})
            slow = await mcp_client.call_tool("deep_research", {"question": "slow: who?"})
            status = await mcp_client.call_tool(
                "research_status",
                {"run_id": slow.structured_content["run_id"], "wait_seconds": 0.1})
            return tools["deep_research"], quick, slow, status.structured_content

    tool, quick, slow, status = asyncio.run(go())
    assert set(tool.output_schema["properties"]) >= {"run_id", "status", "answer", "sources"}
    done = quick.structured_content
    assert done["status"] == "done" and done["answered"] is True and done["run_id"]
    assert done["answer"].startswith("Bram Stoker") and done["sources"] == [PAGE]
    assert quick.content[0].text == done["answer"]  # people and models read the same text
    waiting = slow.structured_content
    assert waiting["status"] in ("queued", "running") and waiting["answer"] is None
    assert f'run_id "{waiting["run_id"]}"' in slow.content[0].text
    # the latest action says what the agent does, never a bare "Step N"
    assert not re.fullmatch(r"Step \d+", status["last"]), status
