from __future__ import annotations

from drvenus.app import EMBEDDED_AGENT, FULL_AGENT, _agent_config
from drvenus.config import load_settings


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
    s = load_settings()
    assert _agent_config(s, True, None) == EMBEDDED_AGENT
    full = _agent_config(s, False, None)
    assert full == FULL_AGENT and full.max_steps == 200 and full.max_context_tokens == 230_000
    assert full.sampling.temperature == 1.0 and full.sampling.top_k == 20
    prompt = tmp_path / "p.txt"
    prompt.write_text("Custom prompt\nCurrent date: 2026-03-01\n")
    s = load_settings(max_steps=9, time_limit=5.0, constrained=True, max_attempts=2)
    cfg = _agent_config(s, False, str(prompt))
    assert (cfg.max_steps, cfg.time_limit, cfg.constrained, cfg.max_attempts) == (9, 5.0, True, 2)
    assert cfg.system_prompt.startswith("Custom prompt")
