"""A model that speaks the OpenAI chat-completions API, over HTTP or in process.

The request body (DR-Venus sampling settings, ``top_k`` as an extra field, the grammar in the
field the server understands), the response parsing (content, ``reasoning_content``, usage and
cached prompt tokens) and the error mapping live here once. Where the requests go is a
*transport*: :class:`HttpTransport` for vLLM, SGLang, llama-server, Ollama and gateways, or
:class:`drvenus.llm.llamacpp.InProcessTransport` for a GGUF run by llama.cpp inside this process
(the embedded default). Each call is one attempt; the caller's :class:`RetryPolicy` decides on
more (``max_retries``, 0 for the agent, whose loop owns the retries).

``grammar_mode`` picks the grammar field:

- ``"gbnf-field"``: ``{"grammar": GBNF}`` (llama-server, the in-process llama.cpp)
- ``"vllm"``: ``{"structured_outputs": {"grammar": GBNF}}`` (vLLM >= 0.10)
- ``"vllm-legacy"``: ``{"guided_grammar": GBNF}`` (older vLLM)
- ``"sglang"``: ``{"ebnf": GBNF}``
- ``"auto"`` (the default): asks ``GET /v1/models`` who serves the model (``owned_by``) and
  picks one above, the first time a grammar is asked for
- ``"none"``: the server takes no grammar (a request for one raises :class:`LLMError`)
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import httpx

from drvenus.llm.base import Generation, GrammarBuilder, GrammarKind, LLMError, SamplingParams
from drvenus.net import (
    DEFAULT_REQUEST_TIMEOUT,
    LoopClient,
    RetryPolicy,
    is_context_overflow,
    is_retryable_status,
    normalize_base_url,
    parse_retry_after,
    redact_url,
    with_retries,
)
from drvenus.protocol import assistant_text
from drvenus.protocol.grammar import fixed_text, grammar_for_kind
from drvenus.protocol.state import TurnState
from drvenus.text import estimate_tokens, one_line

log = logging.getLogger(__name__)

GRAMMAR_MODES: tuple[str, ...] = ("none", "gbnf-field", "vllm", "vllm-legacy", "sglang", "auto")



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


def error_detail(body: Any, fallback: str = "") -> str:
    """The message of an OpenAI-style error body (``{"error": {"message": ...}}``) or text."""
    if isinstance(body, Mapping):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, Mapping):
            err = err.get("message", err)
        if err:
            return one_line(err)
    return one_line(body if isinstance(body, str) else fallback)


def status_error(
    where: str, status: int, detail: str, retry_after: float | None = None, body: Any = None
) -> LLMError:
    """The :class:`LLMError` for an HTTP-style error status from a model server (``body``: the
    whole error reply, whose ``type`` / ``code`` may say more than ``detail``)."""
    return LLMError(
        f"{where}: HTTP {status}: {detail}",
        retryable=is_retryable_status(status),
        retry_after=retry_after,
        context_overflow=is_context_overflow(status, detail, body),
    )


class Transport(Protocol):
    """Where OpenAI-style requests go. ``where`` names it in errors (no secrets)."""

    where: str

    async def request(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float | None
    ) -> Any:
        """The JSON answer to ``method path`` (``/chat/completions``, ``/models``);
        one attempt; :class:`LLMError` on failure."""
        ...

    async def aclose(self) -> None: ...


SERVER_AT = "model server at "  # how this module's errors name the server: then its address
_ADDRESS = re.compile(re.escape(SERVER_AT) + r"\S+?(?=: |[;,)]?\s|[;,)]?$)")
_RUNNING_HINT = re.compile(r"; is the server running at \S+\?")


def without_address(text: str) -> str:
    """``text`` (an error of this module, e.g. in a run's record) with the model server's
    address left out: for people who should not learn it (a web demo's visitors)."""
    return _ADDRESS.sub("the model server", _RUNNING_HINT.sub("", text))


class HttpTransport:
    """Requests to a server's ``/v1`` over HTTP (httpx), one client per event loop."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        connect_timeout: float = 10.0,
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        self.where = SERVER_AT + redact_url(self.base_url)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._clients = LoopClient(lambda: httpx.AsyncClient(headers=self._headers))

    def __repr__(self) -> str:  # never shows the key or URL credentials
        return f"HttpTransport({redact_url(self.base_url)!r})"

    def _http(self) -> httpx.AsyncClient:
        return self._clients.get()

    async def request(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float | None
    ) -> Any:
        seconds = self.timeout if timeout is None else min(self.timeout, timeout)
        limits = httpx.Timeout(seconds, connect=min(self.connect_timeout, seconds))
        # Paths are under /v1; one starting with "/../" is under the server root (/props).
        if path.startswith("/../"):
            url = self.base_url.removesuffix("/v1") + path[3:]
        else:
            url = self.base_url + path
        try:
            # httpx's timeouts bound each read; the deadline bounds the whole response (a
            # server trickling a byte a second never trips a read timeout)
            async with asyncio.timeout(seconds):
                response = await self._http().request(method, url, json=body, timeout=limits)
        except TimeoutError:
            raise LLMError(f"{self.where}: response timeout, not complete after {seconds:g}s",
                           retryable=True) from None
        except httpx.ConnectError as exc:
            reason = one_line(exc) or "connection refused"
            raise LLMError(f"{self.where}: cannot connect ({reason}); is the server running at "
                           f"{redact_url(self.base_url)}?", retryable=True, unreachable=True
                           ) from None
        except httpx.TimeoutException as exc:
            kind = type(exc).__name__.replace("Timeout", " timeout").strip().lower()
            raise LLMError(f"{self.where}: {kind} after {seconds:g}s", retryable=True) from None
        except httpx.TransportError as exc:
            reason = one_line(exc) or type(exc).__name__
            raise LLMError(f"{self.where}: transport error: {reason}", retryable=True) from None
        if response.status_code >= 400:
            try:
                answer = response.json()
                detail = error_detail(answer)
            except ValueError:
                answer = None
                detail = one_line(response.text) or response.reason_phrase
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            raise status_error(self.where, response.status_code, detail, retry_after, answer)
        try:
            return response.json()
        except ValueError:
            raise LLMError(
                f"{self.where}: response is not JSON: {one_line(response.text, 120)}"
            ) from None

    async def aclose(self) -> None:
        await self._clients.aclose()


# what Ollama's /v1/models says owns a model; its window is not listed there
OLLAMA_OWNERS = ("library", "ollama")
OLLAMA_WINDOW_NOTE = (
    "Ollama does not report its context window, which is 2-4K tokens unless set: a research "
    "run needs 32K or more (OLLAMA_CONTEXT_LENGTH=32768, or num_ctx in a Modelfile), and "
    "--max-context to match"
)


class OpenAICompatModel:
    """A :class:`~drvenus.llm.base.ChatModel` over the OpenAI chat-completions API."""

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        *,
        transport: Transport | None = None,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        connect_timeout: float = 10.0,
        max_retries: int = 0,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        grammar_mode: str = "auto",
        prefilled_think: bool = False,
        grammar: str | None = None,
        grammar_builder: GrammarBuilder | None = None,
        tokenizer: Callable[[str], int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        """``base_url`` (HTTP) or ``transport`` (anything else, e.g. in-process llama.cpp).
        ``model``: the served model name; None takes the first one ``/v1/models`` lists.
        ``api_key``: sent as a bearer token (HTTP); never read from the environment here.
        ``timeout``: seconds for one whole request; ``max_retries``: extra attempts on
        transient failures (0: the caller retries). ``prefilled_think``: the chat template opens
        the turn inside the think block (Qwen3-Thinking): the grammar variant without it is sent
        and the tag is restored in the returned text. ``grammar``: a GBNF grammar replacing the
        protocol one; ``grammar_builder``: builds each constrained turn's grammar from its kind
        and the conversation's state (the small agent's; None: the plain protocol grammar).
        ``tokenizer``: exact token counts, else estimated. ``extra_body``: merged into every
        request (e.g. ``chat_template_kwargs``).
        """
        if grammar_mode not in GRAMMAR_MODES:
            raise ValueError(f"grammar_mode must be one of {', '.join(GRAMMAR_MODES)}")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if transport is None:
            if base_url is None:
                raise ValueError("give a base_url or a transport")
            transport = HttpTransport(
                base_url, api_key, timeout=timeout, connect_timeout=connect_timeout
            )
        self.transport = transport
        self.model = model
        self.name = model or transport.where
        self.timeout = timeout
        self.retry = RetryPolicy(max_retries + 1, backoff_base, backoff_max)
        self.grammar_mode = grammar_mode
        self.prefilled_think = prefilled_think
        self.extra_body = dict(extra_body or {})
        self._grammar = grammar
        self._grammar_builder = grammar_builder
        self._tokenizer = tokenizer
        self._probe_lock: asyncio.Lock | None = None
        self._probed = False
        self._owned_by: str | None = None
        self._window: int | None = None

    def __repr__(self) -> str:  # never shows the API key
        return f"OpenAICompatModel({self.transport!r}, model={self.model!r})"

    @property
    def base_url(self) -> str | None:
        return getattr(self.transport, "base_url", None)

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
        grammar: GrammarKind | None = None,
        state: TurnState | None = None,
        timeout: float | None = None,
    ) -> Generation:
        if self.model is None or (grammar and self.grammar_mode == "auto"):
            await self._probe(timeout)
        body, turn_grammar = self._request(messages, params, grammar, state)
        fixed = fixed_text(turn_grammar) if turn_grammar else None
        if fixed is not None:  # the grammar admits one text: written without the model
            return Generation(
                text=assistant_text(fixed, None, prefilled_think=self.prefilled_think),
                completion_tokens=0, finish_reason="stop",
                extra={"model": self.model, "fixed_by_grammar": True},
            )

        async def attempt(seconds: float | None) -> Any:
            return await self.transport.request("POST", "/chat/completions", body, seconds)

        data = await with_retries(
            attempt, self.retry, timeout=timeout or self.timeout, what=self.transport.where
        )
        return self.parse_response(data)

    async def check(self, timeout: float = 5.0) -> None:
        """Is the server up and serving a model? Raises :class:`LLMError` saying why not."""
        try:
            data = await self.transport.request("GET", "/models", None, timeout)
        except LLMError as exc:
            raise LLMError(f"the model server is not answering: {exc}",
                           unreachable=exc.unreachable) from None
        models = data.get("data") if isinstance(data, Mapping) else None
        if not isinstance(models, list) or not models:
            raise LLMError(f"{self.transport.where}: /models lists no model")

    async def context_window(self) -> int | None:
        try:
            await self._probe(30.0)
        except LLMError as exc:  # the first generation will report it properly
            log.debug("no context window from %s: %s", self.transport.where, exc)
        return self._window

    async def aclose(self) -> None:
        await self.transport.aclose()

    # -- request and response ----------------------------------------------------------------

    def request_body(
        self, messages: list[dict[str, str]], params: SamplingParams, kind: str | None,
        state: TurnState | None = None,
    ) -> dict[str, Any]:
        return self._request(messages, params, kind, state)[0]

    def _request(
        self, messages: list[dict[str, str]], params: SamplingParams, kind: str | None,
        state: TurnState | None = None,
    ) -> tuple[dict[str, Any], str | None]:
        """The request body, and the turn's grammar (None without one)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "presence_penalty": params.presence_penalty,
            "stop": list(params.stop),
            "stream": False,
        }
        for unset in ("top_p", "top_k", "presence_penalty"):  # None: the server's default
            if body[unset] is None:
                del body[unset]
        if params.max_tokens is not None:  # None: the server's own limit
            body["max_tokens"] = params.max_tokens
        if params.seed is not None:
            body["seed"] = params.seed
        body.update(self.extra_body)
        grammar = None
        if kind:
            grammar = self.grammar_of(kind, messages, state)
            body.update(grammar_fields(self._resolved_grammar_mode(), grammar))
        return body, grammar

    def parse_response(self, data: Any) -> Generation:
        try:
            choice = data["choices"][0]
            message = choice.get("message") or {}
        except (KeyError, IndexError, TypeError, AttributeError):
            raise LLMError(
                f"{self.transport.where}: response has no choices: {one_line(data, 120)}"
            ) from None
        text = message.get("content") or ""
        if not isinstance(text, str):  # content parts (rare): join the text pieces
            text = "".join(p.get("text", "") for p in text if isinstance(p, Mapping))
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if not isinstance(reasoning, str):
            reasoning = None
        text = assistant_text(text, reasoning, prefilled_think=self.prefilled_think)
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        extra: dict[str, Any] = {"model": data.get("model", self.model)}
        if reasoning:
            extra["reasoning_separate"] = True
        if isinstance(data.get("timings"), Mapping):
            extra["timings"] = dict(data["timings"])
        return Generation(
            text=text,
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            cached_tokens=details.get("cached_tokens") if isinstance(details, Mapping) else None,
            finish_reason=choice.get("finish_reason"),
            extra=extra,
        )

    # -- grammar -----------------------------------------------------------------------------

    def grammar_of(self, kind: str, messages: list[dict[str, str]] | None = None,
                   state: TurnState | None = None) -> str:
        """The GBNF grammar for one turn kind: a user-supplied grammar for every kind, else the
        builder's for the conversation's ``state`` (None: read from ``messages``), else the
        plain protocol grammar."""
        if self._grammar:
            return self._grammar
        if self._grammar_builder is not None:
            if state is None:
                state = TurnState.of(messages or ())
            return self._grammar_builder(kind, self.prefilled_think, state)
        return grammar_for_kind(kind, self.prefilled_think)

    def _resolved_grammar_mode(self) -> str:
        mode = self.grammar_mode
        if mode == "none":
            raise LLMError(
                f"{self.transport.where}: a grammar was asked for but grammar_mode is 'none' "
                "(choose gbnf-field, vllm, vllm-legacy, sglang or auto)"
            )
        if mode == "auto":
            owner = (self._owned_by or "").lower()
            if "vllm" in owner:
                return "vllm"
            if "sglang" in owner:
                return "sglang"
            return "gbnf-field"
        return mode

    # -- discovery ---------------------------------------------------------------------------

    async def _probe(self, timeout: float | None) -> None:
        """Ask ``/models`` once for the served model name, its owner (the server kind) and the
        context window it reports (``max_model_len``: vLLM, SGLang; llama-server's ``/props``)."""
        if self._probe_lock is None:
            self._probe_lock = asyncio.Lock()
        async with self._probe_lock:
            if self._probed:
                return
            data = await self.transport.request("GET", "/models", None, timeout)
            models = data.get("data") if isinstance(data, Mapping) else None
            if not isinstance(models, list) or not models or not isinstance(models[0], Mapping):
                raise LLMError(f"{self.transport.where}: /models lists no model")
            entry = next((m for m in models if m.get("id") == self.model), models[0])
            if self.model is None:
                self.model = str(entry.get("id"))
                self.name = self.model
            self._owned_by = str(entry.get("owned_by") or "")
            window = entry.get("max_model_len") or entry.get("context_length")
            if not window and "llamacpp" in self._owned_by.lower():
                window = await self._llama_server_window(timeout)
            self._window = int(window) if window else None
            if self._window is None and self._owned_by.lower() in OLLAMA_OWNERS:
                log.warning(OLLAMA_WINDOW_NOTE)
            self._probed = True

    async def _llama_server_window(self, timeout: float | None) -> int | None:
        """llama-server's per-slot context (``/props``, outside ``/v1``)."""
        base = self.base_url
        if base is None or not isinstance(self.transport, HttpTransport):
            return None
        try:
            props = await self.transport.request("GET", "/../props", None, timeout)
        except LLMError:
            return None
        settings = props.get("default_generation_settings") if isinstance(props, Mapping) else None
        n_ctx = settings.get("n_ctx") if isinstance(settings, Mapping) else None
        return int(n_ctx) if isinstance(n_ctx, int) and n_ctx > 0 else None


__all__ = [
    "GRAMMAR_MODES",
    "HttpTransport",
    "OpenAICompatModel",
    "Transport",
    "error_detail",
    "grammar_fields",
    "normalize_base_url",
    "status_error",
    "without_address",
]
