"""The OpenAI-compatible face: ``GET /v1/models`` and ``POST /v1/chat/completions``.

A chat completion researches the conversation's last user message with the run registry (so it
counts against the same run limit and its trace is kept). The final message's ``content`` is the
answer followed by the visited sources; the progress (steps, searches, pages read) is the
message's ``reasoning_content``, streamed as ``reasoning_content`` deltas when ``stream`` is on,
which chat UIs such as Open WebUI show as the model's thinking. ``model`` names ``drvenus`` (the
default preset) or ``drvenus:<preset>`` (``GET /v1/models`` lists them; a request without one
gets the default); any other name is 404 ``model_not_found``, as OpenAI answers. A request
asking for what a research run cannot give (``n`` > 1, ``tools``) is 400. Every error under
``/v1``, the access guard's included, is OpenAI's error JSON (:class:`OpenAIErrors`).

Heavy mode (N parallel runs, then one answer) per request: the body field ``heavy`` (OpenAI
clients send it as an extra body field, e.g. ``extra_body={"heavy": 4}`` in the Python client),
or, for chat UIs that only let people pick a model, the model id suffix ``+heavy<N>``
(``drvenus+heavy4``, ``drvenus:embedded+heavy2``; ``GET /v1/models`` lists ``drvenus+heavy<cap>``).
N goes from 1 to the server's cap (``drvenus serve --max-heavy``); the runs' progress is
reasoning, each line marked ``[run i]``, and the final answer is the content.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from http import HTTPStatus
from typing import Any

from drvenus.serve.agents import AgentPool, Choice, whole_number
from drvenus.serve.runs import Run, RunRegistry
from drvenus.serve.view import final_text, progress_line

MODEL_ID = "drvenus"
HEAVY_SUFFIX = re.compile(r"^(?P<base>.+)\+heavy(?P<runs>[0-9]{1,6})$")  # drvenus+heavy4


PREFIX = "/v1/"


class ApiError(ValueError):
    """A request the endpoint cannot serve, answered with ``status`` (400 by default) in
    OpenAI's error shape."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def body(self) -> dict[str, Any]:
        return error_body(str(self), param=self.param, code=self.code)


def error_body(message: str, kind: str = "invalid_request_error", *, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def model_ids(pool: AgentPool) -> list[str]:
    """The ids ``GET /v1/models`` lists (any of them may also end in ``+heavy<N>``)."""
    heavy = [f"{MODEL_ID}+heavy{pool.heavy_cap}"] if pool.heavy_cap > 1 else []
    return [MODEL_ID] + [f"{MODEL_ID}:{key}" for key in pool.models] + heavy


def _split_heavy(model: str) -> tuple[str, int | None]:
    """``drvenus:embedded+heavy2`` -> (``drvenus:embedded``, 2); no suffix: (model, None)."""
    match = HEAVY_SUFFIX.match(model)
    return (match["base"], int(match["runs"])) if match else (model, None)


def _base_ids(pool: AgentPool) -> list[str]:
    return [MODEL_ID] + [f"{MODEL_ID}:{key}" for key in pool.models]


def _model_object(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "drvenus"}


def models_list(pool: AgentPool) -> dict[str, Any]:
    return {"object": "list", "data": [_model_object(i) for i in model_ids(pool)]}


def _unknown_model(model: str) -> ApiError:
    return ApiError(f"The model '{model}' does not exist; this server offers "
                      "drvenus and drvenus:<preset> (GET /v1/models)",
                      status=404, param="model", code="model_not_found")


def model_info(model: str, pool: AgentPool) -> dict[str, Any]:
    """``GET /v1/models/{model}``: the model object; ApiError 404 for an unknown one."""
    base, runs = _split_heavy(model)
    if base not in _base_ids(pool) or (runs is not None and not 1 <= runs <= pool.heavy_cap):
        raise _unknown_model(model)
    return _model_object(model)


def _text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return ""


def question_of(body: Mapping[str, Any]) -> str:
    """The last user message of a chat request; ApiError when there is none."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty list")
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            text = _text_of(message.get("content")).strip()
            if text:
                return text
            break
    raise ApiError("the conversation has no user message with text to research")


def choice_of(body: Mapping[str, Any], pool: AgentPool) -> Choice:
    """The model preset and Heavy runs the request asks for (ApiError 404 for a model this
    server lacks, 400 for a bad ``heavy``)."""
    model = body.get("model")
    try:
        heavy = whole_number(body.get("heavy"), "heavy")
    except ValueError as exc:
        raise ApiError(str(exc), param="heavy") from None
    preset, runs, param = None, None, "heavy"
    if model is not None and model != "":
        if not isinstance(model, str):
            raise _unknown_model(str(model))
        base, runs = _split_heavy(model)
        if base not in _base_ids(pool):
            raise _unknown_model(model)
        preset = base.split(":", 1)[1] if ":" in base else None
    if runs is not None:
        if heavy is not None and heavy != runs:
            raise ApiError(f"the model id asks for {runs} runs and 'heavy' for {heavy}",
                           param="heavy")
        heavy, param = runs, "model"
    try:
        return pool.check(Choice(model=preset, heavy=heavy))
    except ValueError as exc:
        raise ApiError(str(exc), param=param) from None


def check_supported(body: Mapping[str, Any]) -> None:
    """ApiError for what one research run cannot give: several choices, the caller's tools."""
    n = body.get("n")
    if n is not None and n != 1:
        raise ApiError("n must be 1: each request is one research run with one answer",
                         param="n")
    if body.get("tools") or body.get("functions"):
        raise ApiError("tools are not supported: drvenus researches with its own search and "
                         "visit tools and answers in text", param="tools")


def start_run(body: Mapping[str, Any], registry: RunRegistry) -> Run:
    """Start the research a chat request asks for (ApiError, Busy)."""
    choice = choice_of(body, registry.pool)
    check_supported(body)
    question = question_of(body)
    try:
        return registry.start(question, choice, origin="v1")
    except ValueError as exc:
        raise ApiError(str(exc)) from None


def _usage(record: Mapping[str, Any]) -> dict[str, int]:
    usage = record.get("usage") or {}
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def finish_reason(record: Mapping[str, Any]) -> str:
    """``stop`` for a run that answered (a forced answer too: it is marked in the content),
    ``length`` for one cut short without an answer (a budget, the time limit, Stop, a failure):
    the content is then why, in words, not an answer."""
    return "stop" if str(record.get("termination", "")).startswith("answered") else "length"


async def complete(run: Run, model: str) -> dict[str, Any]:
    """The whole chat.completion once the run is over."""
    record = await run.wait() or {}
    reasoning = "\n".join(
        line for event in run.events if (line := progress_line(event)) is not None
    )
    return {
        "id": f"chatcmpl-{run.id}",
        "object": "chat.completion",
        "created": int(run.created),
        "model": model or MODEL_ID,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": final_text(record),
                    "reasoning_content": reasoning,
                },
                "finish_reason": finish_reason(record),
            }
        ],
        "usage": _usage(record),
    }


def _chunk(run: Run, model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": f"chatcmpl-{run.id}",
        "object": "chat.completion.chunk",
        "created": int(run.created),
        "model": model or MODEL_ID,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


def wants_usage(body: Mapping[str, Any]) -> bool:
    """``stream_options.include_usage``: a last chunk with the token usage and no choices."""
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


async def stream(run: Run, model: str, *, include_usage: bool = False) -> AsyncIterator[bytes]:
    """Server-sent chat.completion.chunk events: progress as reasoning, then the answer (and,
    with ``include_usage``, a usage chunk, as OpenAI sends it). Closing the stream leaves the
    run going (its result stays in the registry)."""
    yield _chunk(run, model, {"role": "assistant", "content": ""})
    async for item in run.follow():
        if item is None:
            yield b": keep-alive\n\n"
            continue
        line = progress_line(item[1])
        if line is not None:
            yield _chunk(run, model, {"reasoning_content": line + "\n"})
    yield _chunk(run, model, {"content": final_text(run.record or {})})
    yield _chunk(run, model, {}, finish=finish_reason(run.record or {}))
    if include_usage:
        body = {
            "id": f"chatcmpl-{run.id}", "object": "chat.completion.chunk",
            "created": int(run.created), "model": model or MODEL_ID, "choices": [],
            "usage": _usage(run.record or {}),
        }
        yield b"data: " + json.dumps(body).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


ERROR_KINDS = {401: ("invalid_request_error", "invalid_api_key"),
               429: ("rate_limit_error", None)}


def _as_openai_error(status: int, body: bytes) -> bytes | None:
    """An error body in OpenAI's shape, or None when it is in that shape already."""
    try:
        data: Any = json.loads(body)
    except ValueError:
        data = body.decode("utf-8", "replace").strip()
    if isinstance(data, dict):
        inner = data.get("error")
        if isinstance(inner, dict) and "message" in inner:
            return None
        data = inner if isinstance(inner, str) else data.get("detail") or inner or ""
    kind, code = ERROR_KINDS.get(status, ("server_error" if status >= 500
                                          else "invalid_request_error", None))
    message = str(data) or HTTPStatus(status).phrase
    return json.dumps(error_body(message, kind, code=code), ensure_ascii=False).encode()


class OpenAIErrors:
    """ASGI middleware: every error under ``/v1/`` (the access guard's 401 and 415, a 404 for
    an unknown route, a too-large body) answered in OpenAI's error JSON, so OpenAI clients
    raise their typed errors with the reason."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def relay(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held["start"] = message
                return
            if "start" not in held:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            start, body = held.pop("start"), b"".join(chunks)
            shaped = _as_openai_error(start["status"], body)
            if shaped is not None:
                body = shaped
            headers = [(k, v) for k, v in start.get("headers", [])
                       if k.lower() not in (b"content-length", b"content-type")]
            headers += [(b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, relay)


__all__ = [
    "MODEL_ID",
    "ApiError",
    "OpenAIErrors",
    "complete",
    "error_body",
    "finish_reason",
    "model_info",
    "models_list",
    "question_of",
    "start_run",
    "stream",
    "wants_usage",
]
