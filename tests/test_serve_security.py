"""``drvenus serve`` safety: the token on every route (page, /api, /v1, /mcp), the browser's
cookie, the Host check without a token, and the CLI refusing a public address without a token.
Also ``drvenus mcp`` over stdio with the MCP SDK's client."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import httpx
import pytest

from drvenus.net.guard import COOKIE, host_of
from drvenus.serve.app import create_app
from drvenus.serve.server import ServeThread
from helpers.serve import DRACULA, make_registry

TOKEN = "s3cret-token-for-tests-0123456789"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    app = create_app(make_registry(tmp_path_factory.mktemp("runs")), token=TOKEN)
    with ServeThread(app) as running:
        yield running


def test_every_route_but_health_needs_the_token(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        assert c.get("/health").status_code == 200
        for method, path in [("GET", "/"), ("GET", "/static/app.js"), ("GET", "/api/config"),
                             ("GET", "/api/runs"), ("GET", "/v1/models"),
                             ("POST", "/v1/chat/completions"), ("POST", "/mcp"),
                             ("GET", "/mcp"), ("POST", "/api/runs")]:
            expected = 403 if path == "/mcp" else 401  # no OAuth challenge for MCP clients
            r = c.request(method, path, json={})
            assert r.status_code == expected, (method, path)
            wrong = c.request(method, path, json={}, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == expected, (method, path)
            assert ("www-authenticate" in r.headers) == (expected == 401)
        mcp = c.post("/mcp", json={})
        assert "missing or wrong token" in mcp.text and "Authorization: Bearer" in mcp.text
        ok = c.get("/api/config", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
        page = c.get("/")  # the page without its token: a form to enter it
        assert page.status_code == 401 and "text/html" in page.headers["content-type"]
        assert '<form method="post" action="/">' in page.text and 'name="token"' in page.text
        assert "not the right one" not in page.text
        wrong_page = c.get("/?token=wrong")
        assert wrong_page.status_code == 401 and "not the right one" in wrong_page.text


def test_the_page_gets_a_cookie_from_the_token_link(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.get(f"/?token={TOKEN}")
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = r.headers["set-cookie"]
        # Lax: a run link opened from another site carries it (POSTs must be JSON anyway)
        assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
        assert c.get("/").status_code == 200  # the client kept the cookie
        run = c.post("/api/runs", json={"question": "direct with cookie"})
        assert run.status_code == 201
        events = c.get(f"/api/runs/{run.json()['id']}/events")
        assert events.status_code == 200 and '"prediction": "42"' in events.text


def test_the_login_form_posts_the_token(server):
    """The form sends the token in the body (never in the address bar, history or logs)."""
    with httpx.Client(base_url=server.url, timeout=30) as c:
        wrong = c.post("/", data={"token": "wrong"})
        assert wrong.status_code == 401 and "not the right one" in wrong.text
        r = c.post("/", data={"token": TOKEN})
        assert r.status_code == 303 and r.headers["location"] == "/"
        assert r.headers["set-cookie"].startswith(f"{COOKIE}=")
        assert TOKEN not in r.headers["location"]
        assert c.get("/").status_code == 200  # the client kept the cookie


def test_openai_client_with_the_token_as_api_key(server):
    openai = pytest.importorskip("openai")
    good = openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0)
    reply = good.chat.completions.create(
        model="drvenus", messages=[{"role": "user", "content": "direct question"}]
    )
    assert reply.choices[0].message.content == "42"
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        bad.models.list()
    assert refused.value.code == "invalid_api_key"  # OpenAI's error JSON, not plain text
    assert refused.value.body["message"] == "missing or wrong token"


def test_mcp_client_with_the_token(server):
    pytest.importorskip("mcp")
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def go():
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            transport = streamable_http_client(server.url + "/mcp", http_client=http)
            async with Client(transport) as mcp_client:
                return await mcp_client.call_tool("search", {"query": "Dracula"})

    result = asyncio.run(go())
    assert DRACULA in result.content[0].text


def test_without_a_token_only_loopback_host_names_are_answered(tmp_path):
    app = create_app(make_registry(tmp_path), mcp=False)
    with ServeThread(app) as running, httpx.Client(base_url=running.url, timeout=30) as c:
        assert c.get("/").status_code == 200
        assert c.get("/", headers={"Host": "localhost:8000"}).status_code == 200
        assert c.get("/", headers={"Host": "evil.example:8000"}).status_code == 421
        assert c.get("/api/config", headers={"Host": "attacker.test"}).status_code == 421


def test_host_of():
    assert host_of("127.0.0.1:8000") == "127.0.0.1"
    assert host_of("[::1]:8000") == "[::1]"
    assert host_of("localhost") == "localhost"


def _pythonpath() -> str:
    return os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)


def _drvenus(*args: str, timeout: float = 120) -> object:
    import subprocess

    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    env.pop("DRVENUS_SERVE_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "drvenus", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def test_cli_refuses_a_public_address_without_a_token():
    r = _drvenus("serve", "--host", "0.0.0.0", "--port", "0")
    assert r.returncode == 2
    assert "without a token" in r.stderr
    assert "DRVENUS_SERVE_TOKEN" in r.stderr and "DRVENUS_TOOLS_TOKEN" not in r.stderr  # its own


@pytest.mark.slow
def test_mcp_over_stdio_with_the_sdk_client(tmp_path, models_dir):
    pytest.importorskip("mcp")
    from mcp import Client, StdioServerParameters

    env = {**os.environ, "PYTHONPATH": _pythonpath(), "DRVENUS_MODELS_DIR": str(models_dir),
           "DRVENUS_CACHE_DIR": str(tmp_path / "cache")}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "drvenus", "mcp", "--runs-dir", str(tmp_path)],
        env=env,
    )

    async def go():
        async with Client(params, read_timeout_seconds=300) as mcp_client:
            tools = {t.name for t in (await mcp_client.list_tools()).tools}
            found = await mcp_client.call_tool("search", {"query": "Bram Stoker Dracula"})
            read = await mcp_client.call_tool(
                "visit", {"url": DRACULA, "goal": "who wrote the novel"}
            )
            page = await mcp_client.call_tool("fetch", {"id": DRACULA})
            return tools, found.structured_content, read.content[0].text, page.structured_content

    tools, found, read, page = asyncio.run(asyncio.wait_for(go(), 400))
    assert tools == {"deep_research", "start_research", "research_status", "search", "fetch",
                     "visit"}
    assert found["results"] and all(
        r["id"] == r["url"] and r["url"].startswith("https://en.wikipedia.org/wiki/")
        for r in found["results"])
    assert DRACULA in read and "Stoker" in read
    # fetch: the whole page as visit reads it (the corpus's text), not a goal's extract
    assert page["id"] == page["url"] == DRACULA and page["metadata"] == {"whole_page": True}
    assert "Stoker" in page["text"] and page["title"]
