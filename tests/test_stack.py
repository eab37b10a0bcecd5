"""Settings -> assembled stack: presets, per-client keys, URL credentials, ownership."""

from __future__ import annotations

import asyncio

from drvenus.config import load_settings
from drvenus.llm.base import SamplingParams
from drvenus.small.preset import EMBEDDED_AGENT
from drvenus.stack import FULL_AGENT, agent_config, build_stack
from stub_server import StubServer


def test_settings_from_env_and_dotenv(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("DRVENUS_MODEL_NAME=from-dotenv\nDRVENUS_API_KEY=sk-dotenv\n")
    monkeypatch.setenv("DRVENUS_MAX_STEPS", "17")
    s = load_settings(base_url="http://127.0.0.1:8000/v1", max_context=None)
    assert s.model_name == "from-dotenv" and s.max_steps == 17 and s.max_context is None
    assert s.api_key_value() == "sk-dotenv"
    assert "sk-dotenv" not in repr(s) and "sk-dotenv" not in str(s.model_dump())
    # flags win over the environment
    assert load_settings(max_steps=3).max_steps == 3


def test_presets_and_overrides(tmp_path):
    assert agent_config(load_settings()) == EMBEDDED_AGENT
    full = agent_config(load_settings(model_path=tmp_path / "x.gguf"))
    assert full == FULL_AGENT and full.max_steps == 200 and full.max_context_tokens == 230_000
    assert full.sampling.temperature == 1.0 and full.sampling.top_k == 20
    prompt = tmp_path / "p.txt"
    prompt.write_text("Custom prompt\nCurrent date: 2026-03-01\n")
    s = load_settings(
        base_url="http://127.0.0.1:1", max_steps=9, time_limit=5.0, constrained=True,
        max_attempts=2,
    )
    cfg = agent_config(s, str(prompt))
    assert (cfg.max_steps, cfg.time_limit, cfg.constrained, cfg.max_attempts) == (9, 5.0, True, 2)
    assert cfg.system_prompt.startswith("Custom prompt")


def _ask(model) -> None:
    messages = [{"role": "user", "content": "hi"}]
    asyncio.run(model.generate(messages, SamplingParams(max_tokens=8)))


def test_each_client_uses_its_own_key(monkeypatch):
    """The extractor never inherits the agent model's key (nor OPENAI_API_KEY)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-for-the-agent")
    with StubServer() as agent_server, StubServer() as extractor_server:
        settings = load_settings(
            base_url=agent_server.base_url, model_name="stub-model",
            extractor_base_url=extractor_server.base_url, extractor_model="stub-model",
        )
        stack = build_stack(settings)
        _ask(stack.model)
        _ask(stack.tools["visit"].extractor.model)
        asyncio.run(stack.aclose())
        assert agent_server.requests[-1].headers.get("Authorization") == (
            "Bearer sk-openai-for-the-agent"
        )
        assert "Authorization" not in extractor_server.requests[-1].headers

        monkeypatch.setenv("DRVENUS_API_KEY", "sk-agent")
        monkeypatch.setenv("DRVENUS_EXTRACTOR_API_KEY", "sk-extractor")
        stack = build_stack(load_settings(
            base_url=agent_server.base_url, model_name="stub-model",
            extractor_base_url=extractor_server.base_url, extractor_model="stub-model",
        ))
        _ask(stack.model)
        _ask(stack.tools["visit"].extractor.model)
        asyncio.run(stack.aclose())
        assert agent_server.requests[-1].headers["Authorization"] == "Bearer sk-agent"
        assert extractor_server.requests[-1].headers["Authorization"] == "Bearer sk-extractor"


def test_url_credentials_never_echoed(tmp_path):
    """A key inside the URL reaches the server but never a record, trace or log line."""
    from drvenus.agent import ResearchAgent
    from drvenus.agent.events import TraceEvent
    from drvenus.llm.factory import make_model

    model = make_model(base_url="http://user:s3cret@127.0.0.1:9/v1", model_name="m")
    assert "s3cret" not in repr(model) and "s3cret" not in model.name

    class NoTools:
        async def call(self, tool_call):
            return "[]"

    events: list[TraceEvent] = []
    agent = ResearchAgent(model, NoTools(), FULL_AGENT.__class__(max_attempts=1, time_limit=10))
    record = asyncio.run(agent.run("q?", events.append))
    assert record.termination == "llm_error"
    assert "s3cret" not in str(record.to_dict()) and "***@127.0.0.1:9" in record.error
    assert all("s3cret" not in str(e.to_dict()) for e in events)


def test_stack_closes_what_it_opened():
    with StubServer() as agent_server, StubServer() as extractor_server:
        stack = build_stack(load_settings(
            base_url=agent_server.base_url, model_name="stub-model",
            extractor_base_url=extractor_server.base_url, extractor_model="stub-model",
        ))

        async def use_then_close():
            messages = [{"role": "user", "content": "hi"}]
            await stack.model.generate(messages, SamplingParams(max_tokens=8))
            extractor = stack.tools["visit"].extractor.model
            await extractor.generate(messages, SamplingParams(max_tokens=8))
            clients = [stack.model.transport._clients.current, extractor.transport._clients.current]
            await stack.aclose()
            return clients

        clients = asyncio.run(use_then_close())
        assert all(c is not None and c.is_closed for c in clients)
