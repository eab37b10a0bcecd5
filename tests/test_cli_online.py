"""The online tools as a user runs them: `drvenus ask` with Serper / SearXNG / Jina / direct
fetch pointed at real local servers, and `drvenus tools serve` with a token and the URL policy.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from helpers.cli import ANSWER, ROOT, drvenus, search_turn, visit_turn
from helpers.search import KEY, FakeSearchServer
from stub_server import StubServer
from web_site import WebSite

GOAL = "when was the lighthouse built"


def _tool_responses(record: dict) -> list[str]:
    return [m["content"] for m in record["messages"][2:] if m["role"] == "user"]


def _ask(model_url: str, *args: str, env: dict) -> dict:
    r = drvenus(
        "ask", "When was Rivermouth lighthouse built?", "--base-url", model_url, "--json",
        "--no-constrained", *args, env={"DRVENUS_CACHE_DIR": env.pop("cache"), **env},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_ask_with_serper_and_direct_fetch(tmp_path):
    with FakeSearchServer("serper") as serper, WebSite() as site:
        page = site.url + "/article.html"
        replies = [search_turn("Rivermouth lighthouse"), visit_turn(page, GOAL), ANSWER]
        with StubServer(replies) as model:
            record = _ask(
                model.base_url, "--search", "serper", "--visit", "fetch", "--allow-private-urls",
                env={"cache": str(tmp_path), "DRVENUS_SERPER_URL": serper.url,
                     "SERPER_KEY_ID": KEY},
            )
        assert [s.json for s in serper.requests] == [
            {"q": "Rivermouth lighthouse", "location": "United States", "gl": "us", "hl": "en"}
        ]
        assert site.hits["/article.html"] == 1
    search, visit = _tool_responses(record)[:2]
    assert "Rivermouth lighthouse - result 1" in search
    assert f"The useful information in {page} for user goal {GOAL}" in visit
    assert "1871" in visit and "Evidence in page" in visit
    assert record["termination"] == "answered"


def test_ask_with_searxng_and_jina(tmp_path):
    with FakeSearchServer("searxng") as searxng, WebSite() as site:
        page = "https://lighthouses.example/rivermouth"
        replies = [search_turn("Rivermouth lighthouse"), visit_turn(page, GOAL), ANSWER]
        with StubServer(replies) as model:
            record = _ask(
                model.base_url, "--search", "searxng", "--visit", "jina",
                env={"cache": str(tmp_path), "DRVENUS_SEARXNG_URL": searxng.url,
                     "DRVENUS_JINA_URL": site.url + "/jina", "JINA_API_KEYS": "jina-key"},
            )
        assert len(searxng.requests) == 1
        assert site.hits[f"/jina/{page}"] == 1
    visit = _tool_responses(record)[1]
    assert "Thomas Hale" in visit or "1871" in visit


def test_visit_refuses_loopback_without_the_flag(tmp_path):
    with WebSite() as site:
        page = site.url + "/article.html"
        with StubServer([visit_turn(page, GOAL), ANSWER]) as model:
            record = _ask(model.base_url, "--visit", "fetch", env={"cache": str(tmp_path)})
        assert site.hits["/article.html"] == 0  # nothing was sent to the loopback site
    response = _tool_responses(record)[0]
    assert "could not be processed" in response  # the failure frame, saying why in the record
    assert "loopback address" in response and "--allow-private-urls" in response


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def tool_server(tmp_path, corpus):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "DRVENUS_CACHE_DIR": str(tmp_path),
           "DRVENUS_TOOLS_TOKEN": "a-long-enough-test-token"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "drvenus", "tools", "serve", "--port", str(port),
         "--search", "local", "--visit", "fetch", "--corpus", str(corpus)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail(f"tool server did not start: {proc.communicate()[1]}")
    yield url
    proc.terminate()
    proc.communicate(timeout=20)


def test_tool_server_needs_its_token_and_never_fetches_loopback(tool_server):
    auth = {"Authorization": "Bearer a-long-enough-test-token"}
    query = {"query": ["Dracula novel"]}
    assert httpx.post(tool_server + "/search", json=query, timeout=30).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(tool_server + "/search", json=query, headers=wrong).status_code == 401
    found = httpx.post(tool_server + "/search", json=query, headers=auth, timeout=30)
    assert found.status_code == 200 and "Bram Stoker" in found.json()["content"]
    with WebSite() as site:
        for target in (site.url + "/article.html", f"http://localhost:{site.port}/article.html",
                       "http://169.254.169.254/latest/meta-data/", "file:///etc/passwd"):
            visit = httpx.post(tool_server + "/visit", json={"url": [target], "goal": GOAL},
                               headers=auth, timeout=60)
            assert visit.status_code == 200
            content = visit.json()["content"]
            assert "could not be processed" in content  # the failure frame
            assert target.startswith("file:") or "The page was not read: " in content
        assert not site.seen  # not one request reached the loopback site


def test_ask_through_the_tool_server(tool_server, tmp_path):
    with StubServer([search_turn("Dracula novel author"), ANSWER]) as model:
        record = _ask(model.base_url, "--tools-url", tool_server,
                      env={"cache": str(tmp_path), "DRVENUS_TOOLS_TOKEN": "a-long-enough-test-token"})
    assert "Bram Stoker" in _tool_responses(record)[0]
    assert record["prediction"] == "Bram Stoker"


def test_a_dead_tool_server_or_a_wrong_token_fails_before_any_question(tool_server, tmp_path):
    """Not a tool-less benchmark that looks answered: one line, exit 2, the model never asked."""
    for url, token, expected in (
        (tool_server, "wrong-token-of-length", "401, the token is wrong"),
        (tool_server, "", "401, it needs a token"),
        ("http://127.0.0.1:9", "x" * 20, "not reachable"),
    ):
        with StubServer([ANSWER]) as model:
            r = drvenus("ask", "Who wrote Dracula?", "--base-url", model.base_url, "--json",
                        "--tools-url", url, env={"DRVENUS_CACHE_DIR": str(tmp_path),
                                                 "DRVENUS_TOOLS_TOKEN": token}, timeout=120)
            assert model.chat_requests == []
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and expected in lines[0], r.stderr
