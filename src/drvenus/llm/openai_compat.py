"""A model behind an OpenAI-compatible ``/v1/chat/completions`` endpoint.

Works with vLLM, SGLang, llama-server (llama.cpp) and Ollama. Requests carry the DR-Venus
sampling settings (``top_k`` as an extra body field, which these servers accept). Transient
failures (connection errors, timeouts, HTTP 429 and 5xx) are retried with exponential backoff
and jitter, a bounded number of times; other HTTP errors fail at once. Every failure surfaces as
one :class:`~drvenus.llm.base.LLMError` line naming the server.

Constrained decoding sends the protocol grammar (:mod:`drvenus.llm.grammar`) in the field the
server understands, chosen by ``grammar_mode``:

- ``"gbnf-field"``: ``{"grammar": GBNF}`` (llama-server)
- ``"vllm"``: ``{"structured_outputs": {"grammar": GBNF}}`` (vLLM >= 0.10)
- ``"vllm-legacy"``: ``{"guided_grammar": GBNF}`` (older vLLM)
- ``"sglang"``: ``{"ebnf": GBNF}``
- ``"auto"``: asks ``GET /v1/models`` who serves the model (``owned_by``) and picks one of the above
- ``"none"``: no grammar (the default; a constrained request then raises :class:`LLMError`)
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from drvenus.llm.base import Constraint, Generation, LLMError, SamplingParams, grammar_kind
from drvenus.llm.grammar import grammar_for_kind

log = logging.getLogger(__name__)

GRAMMAR_MODES: tuple[str, ...] = ("none", "gbnf-field", "vllm", "vllm-legacy", "sglang", "auto")
API_KEY_ENV_VARS: tuple[str, ...] = ("DRVENUS_API_KEY", "OPENAI_API_KEY")

_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def normalize_base_url(base_url: str) -> str:
    """``http://host:port``, ``.../v1`` or ``.../v1/`` -> ``http://host:port/v1``."""
    url = base_url.strip().rstrip("/")
    if not url:
        raise ValueError("base_url is empty")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    for suffix in ("/chat/completions", "/completions"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url if url.endswith("/v1") else url + "/v1"


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate: about four UTF-8 bytes per token."""
    return math.ceil(len(text.encode("utf-8")) / 4)


def grammar_fields(mode: str, grammar: str) -> dict[str, Any]:
    """The request-body fields that carry ``grammar`` for a server of kind ``mode``."""
    if mode == "gbnf-field":
        return {"grammar": grammar}
    if mode == "vllm":
        return {"structured_outputs": {"grammar": grammar}}
    if mode == "vllm-legacy":
        return {"guided_grammar": grammar}
    if mode == "sglang":
        return {"ebnf": grammar}
    raise ValueError(f"grammar mode {mode!r} sends no grammar")


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_detail(response: httpx.Response) -> str:
    """The server's error message (OpenAI ``{"error": {"message": ...}}`` or raw text)."""
    try:
        body = response.json()
    except ValueError:
        return _one_line(response.text) or response.reason_phrase
    if isinstance(body, Mapping):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, Mapping):
            err = err.get("message", err)
        if err:
            return _one_line(err)
    return _one_line(response.text)


class _RetryableError(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class OpenAICompatModel:
    """A :class:`~drvenus.llm.base.ChatModel` served over the OpenAI chat-completions API."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
        max_retries: int = 3,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        grammar_mode: str = "none",
        constrained_default: bool = False,
        prefilled_think: bool = False,
        grammar: str | None = None,
        tokenizer: Callable[[str], int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        """``model``: the served model name; ``None`` takes the first one ``/v1/models`` lists.
        ``api_key``: else ``$DRVENUS_API_KEY``, else ``$OPENAI_API_KEY`` (read here, not at
        import). ``timeout``: seconds for one whole request (a long turn takes minutes);
        ``max_retries``: extra attempts after the first on transient failures.
        ``prefilled_think``: the server's chat template opens the turn with ``<think>\n``
        (Qwen3-Thinking): the grammar variant without it is sent and the tag is restored in the
        returned text. ``grammar``: a GBNF grammar replacing the protocol one.
        ``tokenizer``: a callable returning exact token counts, else counts are estimated.
        ``extra_body``: more fields merged into every request (e.g. ``chat_template_kwargs``).
        """
        if grammar_mode not in GRAMMAR_MODES:
            raise ValueError(f"grammar_mode must be one of {', '.join(GRAMMAR_MODES)}")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.base_url = normalize_base_url(base_url)
        self.url = self.base_url + "/chat/completions"
        self.model = model
        self.name = model or self.base_url
        self.grammar_mode = grammar_mode
        self.constrained_default = constrained_default
        self.prefilled_think = prefilled_think
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.extra_body = dict(extra_body or {})
        self._grammar = grammar
        self._tokenizer = tokenizer
        self._timeout = httpx.Timeout(timeout, connect=min(connect_timeout, timeout))
        if api_key is None:
            api_key = next((os.environ[v] for v in API_KEY_ENV_VARS if os.environ.get(v)), None)
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._probe_lock: asyncio.Lock | None = None
        self._owned_by: str | None = None

    def __repr__(self) -> str:  # never shows the API key
        return f"OpenAICompatModel(base_url={self.base_url!r}, model={self.model!r})"

    # -- ChatModel ---------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        if self._tokenizer is not None:
            return int(self._tokenizer(text))
        return estimate_tokens(text)

    async def generate(
        self,
        messages: list[dict[str, str]],
        params: SamplingParams,
        *,
        constrained: Constraint = None,
    ) -> Generation:
        kind = grammar_kind(constrained, self.constrained_default)
        if self.model is None or (kind and self.grammar_mode == "auto"):
            await self._probe()
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "presence_penalty": params.presence_penalty,
            "max_tokens": params.max_tokens,
            "stop": list(params.stop),
            "stream": False,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        body.update(self.extra_body)
        if kind:
            body.update(grammar_fields(self._resolved_grammar_mode(), self.grammar_of(kind)))
        data = await self._post_json(self.url, body)
        return self._to_generation(data)

    async def aclose(self) -> None:
        client, self._client, self._client_loop = self._client, None, None
        if client is not None:
            await client.aclose()

    # -- helpers -----------------------------------------------------------------------------

    @property
    def grammar(self) -> str:
        """The GBNF grammar sent when constrained (any well-formed turn)."""
        return self.grammar_of("any")

    def grammar_of(self, kind: str) -> str:
        """The GBNF grammar for one turn kind; a user-supplied grammar is used for every kind."""
        return self._grammar or grammar_for_kind(kind, self.prefilled_think)

    def _resolved_grammar_mode(self) -> str:
        mode = self.grammar_mode
        if mode == "none":
            raise LLMError(
                f"model server at {self.base_url}: constrained decoding was requested but "
                "grammar_mode is 'none' (choose gbnf-field, vllm, vllm-legacy, sglang or auto)"
            )
        if mode == "auto":
            owner = (self._owned_by or "").lower()
            if "vllm" in owner:
                return "vllm"
            if "sglang" in owner:
                return "sglang"
            return "gbnf-field"
        return mode

    def _http(self) -> httpx.AsyncClient:
        """One client per event loop (a pooled connection cannot move between loops)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = httpx.AsyncClient(timeout=self._timeout, headers=self._headers)
            self._client_loop = loop
            self._probe_lock = asyncio.Lock()
        return self._client

    async def _probe(self) -> None:
        """Ask ``/v1/models`` for the served model name and its owner (server kind)."""
        self._http()
        assert self._probe_lock is not None
        async with self._probe_lock:
            known_owner = self._owned_by is not None or self.grammar_mode != "auto"
            if self.model is not None and known_owner:
                return
            data = await self._request("GET", self.base_url + "/models", None)
            models = data.get("data") if isinstance(data, Mapping) else None
            if not isinstance(models, list) or not models or not isinstance(models[0], Mapping):
                raise LLMError(f"model server at {self.base_url}: /models lists no model")
            entry = next((m for m in models if m.get("id") == self.model), models[0])
            if self.model is None:
                self.model = str(entry.get("id"))
                self.name = self.model
            self._owned_by = str(entry.get("owned_by") or "")

    async def _post_json(self, url: str, body: dict[str, Any]) -> Any:
        return await self._request("POST", url, body)

    async def _request(self, method: str, url: str, body: dict[str, Any] | None) -> Any:
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return await self._attempt(method, url, body)
            except _RetryableError as exc:
                if attempt == attempts:
                    suffix = f" (after {attempts} attempts)" if attempts > 1 else ""
                    raise LLMError(f"model server at {url}: {exc.reason}{suffix}") from None
                delay = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
                delay = delay * (0.5 + random.random() / 2)  # jitter in [delay/2, delay]
                if exc.retry_after is not None:
                    delay = min(self.backoff_max, max(delay, exc.retry_after))
                log.warning(
                    "model server at %s: %s; retry %d/%d in %.2fs",
                    url,
                    exc.reason,
                    attempt,
                    self.max_retries,
                    delay,
                )
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _attempt(self, method: str, url: str, body: dict[str, Any] | None) -> Any:
        client = self._http()
        try:
            response = await client.request(method, url, json=body)
        except httpx.ConnectError as exc:
            raise _RetryableError(
                f"cannot connect ({_one_line(exc) or 'connection refused'})"
            ) from None
        except httpx.TimeoutException as exc:
            kind = type(exc).__name__.replace("Timeout", " timeout").strip().lower()
            raise _RetryableError(f"{kind} after {self._timeout.read}s") from None
        except httpx.TransportError as exc:
            raise _RetryableError(
                f"transport error: {_one_line(exc) or type(exc).__name__}"
            ) from None
        if response.status_code in _RETRY_STATUS:
            retry_after = None
            header = response.headers.get("retry-after")
            if header:
                try:
                    retry_after = float(header)
                except ValueError:
                    retry_after = None
            raise _RetryableError(
                f"HTTP {response.status_code}: {_error_detail(response)}", retry_after
            )
        if response.status_code >= 400:
            raise LLMError(
                f"model server at {url}: HTTP {response.status_code}: {_error_detail(response)}"
            )
        try:
            return response.json()
        except ValueError:
            raise LLMError(
                f"model server at {url}: response is not JSON: {_one_line(response.text, 120)}"
            ) from None

    def _to_generation(self, data: Any) -> Generation:
        try:
            choice = data["choices"][0]
            message = choice.get("message") or {}
        except (KeyError, IndexError, TypeError, AttributeError):
            raise LLMError(
                f"model server at {self.url}: response has no choices: {_one_line(data, 120)}"
            ) from None
        text = message.get("content") or ""
        if not isinstance(text, str):  # content parts (rare): join the text pieces
            text = "".join(p.get("text", "") for p in text if isinstance(p, Mapping))
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if isinstance(reasoning, str) and reasoning.strip() and "<think>" not in text:
            text = f"<think>\n{reasoning.strip()}\n</think>\n{text.lstrip()}"
        elif self.prefilled_think and text and not text.lstrip().startswith("<think>"):
            text = "<think>\n" + text  # the chat template put it in the prompt
        usage = data.get("usage") or {}
        extra: dict[str, Any] = {"model": data.get("model", self.model)}
        if reasoning:
            extra["reasoning_separate"] = True
        return Generation(
            text=text,
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            finish_reason=choice.get("finish_reason"),
            extra=extra,
        )


__all__ = [
    "API_KEY_ENV_VARS",
    "GRAMMAR_MODES",
    "OpenAICompatModel",
    "estimate_tokens",
    "grammar_fields",
    "normalize_base_url",
]
