"""OpenAICompatModel against a real HTTP server on loopback (tests/stub_server.py)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from drvenus.llm import LLMError, SamplingParams
from drvenus.llm.openai_compat import OpenAICompatModel, estimate_tokens, normalize_base_url
from drvenus.protocol import STOP_STRINGS, parse_turn
from drvenus.protocol.grammar import grammar_for_kind, protocol_grammar
from stub_server import Reply, StubServer

MESSAGES = [{"role": "system", "content": "sys"}, {"role": "user", "content": "What is 6x7?"}]


def run(coro):
    return asyncio.run(coro)


async def _generate(model: OpenAICompatModel, **kw):
    try:
        return await model.generate(MESSAGES, SamplingParams(**kw.pop("params", {})), **kw)
    finally:
        await model.aclose()


@pytest.fixture
def server():
    with StubServer() as s:
        yield s


def _fast(url: str, **kw) -> OpenAICompatModel:
    kw.setdefault("backoff_base", 0.01)
    kw.setdefault("backoff_max", 0.05)
    return OpenAICompatModel(url, kw.pop("model", "stub-model"), **kw)


def test_request_body_carries_sampling_settings(server):
    gen = run(_generate(_fast(server.base_url), params={"seed": 7}))
    assert parse_turn(gen.text).answer == "stub answer"
    (req,) = server.chat_requests
    body = req.json
    assert req.path == "/v1/chat/completions"
    assert body["model"] == "stub-model"
    assert body["messages"] == MESSAGES
    assert body["stop"] == list(STOP_STRINGS)
    assert body["top_k"] == 20 and body["top_p"] == 0.95
    assert body["temperature"] == 1.0 and body["presence_penalty"] == 1.1
    assert body["max_tokens"] == 15000 and body["seed"] == 7
    assert "grammar" not in body and "structured_outputs" not in body


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_base_url_with_or_without_v1(server, suffix):
    gen = run(_generate(_fast(server.url + suffix)))
    assert gen.text
    assert server.chat_requests[0].path == "/v1/chat/completions"


def test_normalize_base_url():
    assert normalize_base_url("localhost:8000") == "http://localhost:8000/v1"
    assert normalize_base_url("http://h/v1/chat/completions") == "http://h/v1"
    assert normalize_base_url("https://api.example.com/v1/") == "https://api.example.com/v1"


def test_usage_and_finish_reason_mapping(server):
    server.add_replies(
        Reply(
            content="x", usage={"prompt_tokens": 11, "completion_tokens": 5}, finish_reason="length"
        )
    )
    gen = run(_generate(_fast(server.base_url)))
    assert (gen.prompt_tokens, gen.completion_tokens, gen.finish_reason) == (11, 5, "length")


def test_none_content_becomes_empty_string(server):
    server.add_replies(Reply(content=None))
    assert run(_generate(_fast(server.base_url))).text == ""


def test_reasoning_content_is_merged_into_think(server):
    server.add_replies(
        Reply(content="<answer>\n42\n</answer>", reasoning_content="six times seven")
    )
    gen = run(_generate(_fast(server.base_url)))
    assert gen.text == "<think>\nsix times seven\n</think>\n<answer>\n42\n</answer>"
    assert parse_turn(gen.text).answer == "42"


def test_prefilled_think_is_restored(server):
    server.add_replies(Reply(content="t\n</think>\n<answer>\n1\n</answer>"))
    gen = run(_generate(_fast(server.base_url, prefilled_think=True)))
    assert gen.text == "<think>\nt\n</think>\n<answer>\n1\n</answer>"


def test_reasoning_not_duplicated_when_content_has_think(server):
    content = "<think>\nt\n</think>\n<answer>\n1\n</answer>"
    server.add_replies(Reply(content=content, reasoning_content="t"))
    assert run(_generate(_fast(server.base_url))).text == content


@pytest.mark.parametrize(
    ("mode", "key"),
    [("gbnf-field", "grammar"), ("vllm-legacy", "guided_grammar"), ("sglang", "ebnf")],
)
def test_constrained_sends_grammar(server, mode, key):
    run(_generate(_fast(server.base_url, grammar_mode=mode), grammar="any"))
    assert server.chat_requests[0].json[key] == protocol_grammar()


def test_constrained_vllm_structured_outputs(server):
    model = _fast(server.base_url, grammar_mode="vllm", prefilled_think=True)
    run(_generate(model, grammar="any"))
    body = server.chat_requests[0].json
    assert body["structured_outputs"] == {"grammar": protocol_grammar(True)}


def test_grammar_only_when_asked_for(server):
    model = _fast(server.base_url, grammar_mode="gbnf-field")
    run(_generate(model, grammar="answer"))
    run(_generate(model))
    first, second = server.chat_requests
    assert first.json["grammar"] == grammar_for_kind("answer") and "grammar" not in second.json
    assert not server.requests[0].path.endswith("/models")  # a set mode needs no probe


def test_grammar_with_grammar_mode_none_is_an_error(server):
    with pytest.raises(LLMError, match="grammar_mode"):
        run(_generate(_fast(server.base_url, grammar_mode="none"), grammar="any"))


def test_auto_grammar_mode_and_model_discovery():
    with StubServer(model="served-name", owned_by="vllm") as server:
        model = _fast(server.base_url, model=None, grammar_mode="auto")
        run(_generate(model, grammar="any"))
        assert model.name == "served-name"
        body = server.chat_requests[0].json
        assert body["model"] == "served-name" and "structured_outputs" in body


def test_retry_on_500_then_success(server):
    server.fail_next(2, status=500)
    gen = run(_generate(_fast(server.base_url, max_retries=3)))
    assert parse_turn(gen.text).ok
    assert len(server.chat_requests) == 3


def test_retry_on_429_then_success(server):
    server.add_replies(Reply(status=429, content="slow down", headers={"Retry-After": "0"}))
    assert run(_generate(_fast(server.base_url, max_retries=1))).text
    assert len(server.chat_requests) == 2


def test_retries_are_bounded(server):
    server.fail_next(10, status=503, message="overloaded")
    with pytest.raises(LLMError) as info:
        run(_generate(_fast(server.base_url, max_retries=2)))
    assert len(server.chat_requests) == 3
    msg = str(info.value)
    assert server.base_url in msg and "503" in msg and "overloaded" in msg and "\n" not in msg


def test_no_retry_on_400(server):
    server.add_replies(Reply(status=400, content="bad request: max_tokens too large"))
    with pytest.raises(LLMError, match="HTTP 400: bad request"):
        run(_generate(_fast(server.base_url, max_retries=3)))
    assert len(server.chat_requests) == 1


def test_malformed_response_is_an_error(server):
    server.add_replies(Reply(body={"unexpected": True}))
    with pytest.raises(LLMError, match="no choices"):
        run(_generate(_fast(server.base_url)))


def test_dropped_connection_is_retried(server):
    server.add_replies(Reply(drop=True))
    assert run(_generate(_fast(server.base_url, max_retries=1))).text
    assert len(server.chat_requests) == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_down_fails_fast():
    url = f"http://127.0.0.1:{_free_port()}"
    start = time.monotonic()
    with pytest.raises(LLMError, match="cannot connect") as info:
        run(_generate(_fast(url, max_retries=2)))
    assert time.monotonic() - start < 3
    assert "model server at http://127.0.0.1" in str(info.value)
    assert "after 3 attempts" in str(info.value)


def test_slow_server_times_out():
    with StubServer(delay=60.0) as server:  # without the timeout: two minutes
        start = time.monotonic()
        with pytest.raises(LLMError, match="timeout"):
            run(_generate(_fast(server.base_url, timeout=0.3, max_retries=1)))
        assert time.monotonic() - start < 10  # 2 x 0.3 s expected; loose for a busy machine
        assert len(server.chat_requests) == 2


def test_a_trickling_server_cannot_outlast_the_request_timeout():
    """Headers at once, then a byte every 0.2 s: each read is quick, the response never ends.
    The timeout is a deadline for the whole response."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def trickle() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 100000\r\n\r\n")
                while not stop.is_set():
                    try:
                        conn.sendall(b" ")
                    except OSError:
                        break
                    time.sleep(0.2)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    start = time.monotonic()
    try:
        # the deadline's own text (the trickle itself would last 20,000 s, and the outer
        # wait_for would end it with a bare TimeoutError)
        with pytest.raises(LLMError, match="response timeout, not complete after 1s"):
            run(asyncio.wait_for(_generate(_fast(url, timeout=1.0, max_retries=0)), 30))
        assert time.monotonic() - start < 10
    finally:
        stop.set()
        listener.close()


def test_concurrent_generations_share_one_client():
    async def many(model):
        try:
            params = SamplingParams()
            return await asyncio.gather(*(model.generate(MESSAGES, params) for _ in range(8)))
        finally:
            await model.aclose()

    with StubServer(delay=1.0) as server:
        gens = run(many(_fast(server.base_url)))
        assert len(gens) == 8 and all(g.text for g in gens)
        assert server.max_in_flight >= 2  # concurrent (in series it would be 1)


def test_api_key_only_from_the_argument(server, monkeypatch):
    """The client never reads the environment: Settings decides which key goes where."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("DRVENUS_API_KEY", "sk-drvenus")
    model = _fast(server.base_url, api_key="sk-arg")
    run(_generate(model))
    run(_generate(_fast(server.base_url)))
    auth = [r.headers.get("Authorization") for r in server.chat_requests]
    assert auth == ["Bearer sk-arg", None]
    assert "sk-" not in repr(model)


def test_no_api_key_sends_no_authorization(server, monkeypatch):
    monkeypatch.delenv("DRVENUS_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    run(_generate(_fast(server.base_url)))
    assert "Authorization" not in server.chat_requests[0].headers


def test_count_tokens_estimate_and_tokenizer():
    model = OpenAICompatModel("http://127.0.0.1:9", "m")
    assert model.count_tokens("") == 0
    assert model.count_tokens("abcd") == 1 and model.count_tokens("abcde") == 2
    assert estimate_tokens("é" * 4) == 2  # UTF-8 bytes, not characters
    exact = OpenAICompatModel("http://127.0.0.1:9", "m", tokenizer=lambda t: len(t.split()))
    assert exact.count_tokens("one two three") == 3


def test_invalid_grammar_mode_rejected():
    with pytest.raises(ValueError, match="grammar_mode"):
        OpenAICompatModel("http://127.0.0.1:9", "m", grammar_mode="xml")


def test_stub_server_streams_sse():
    import httpx

    with StubServer(["hello"]) as server:
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        r = httpx.post(server.base_url + "/chat/completions", json=body, timeout=5)
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert '"content": "hello"' in "".join(events)
        assert httpx.get(server.base_url + "/models").json()["data"][0]["id"] == "stub-model"
        assert httpx.post(server.url + "/nope", json={}).status_code == 404


@pytest.mark.parametrize("prefilled", [False, True])
def test_a_turn_the_grammar_fixes_is_written_without_the_model(server, prefilled):
    """A grammar that admits one text (a given query, no thought) needs no request; any
    other turn still goes to the server."""

    def builder(kind: str, prefilled_think: bool, state: object) -> str:
        if kind == "search":
            return protocol_grammar(prefilled_think, allow_answer=False, tools=("search",),
                                    search_query="Bram Stoker", max_think_chars=0)
        return grammar_for_kind(kind, prefilled_think)

    model = _fast(server.base_url, grammar_mode="gbnf-field", grammar_builder=builder,
                  prefilled_think=prefilled)
    gen = run(_generate(model, grammar="search"))
    assert server.chat_requests == []
    assert gen.text == ('<think>\n\n</think>\n<tool_call>\n{"name": "search", "arguments": '
                        '{"query": ["Bram Stoker"]}}\n</tool_call>')
    assert parse_turn(gen.text).tool_call.arguments == {"query": ["Bram Stoker"]}
    assert gen.completion_tokens == 0 and gen.extra["fixed_by_grammar"]
    run(_generate(model, grammar="any"))
    assert len(server.chat_requests) == 1
