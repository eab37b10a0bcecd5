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

from drvenus.protocol import DRVENUS_TEXTS, TextsLike
from drvenus.serve.agents import AgentPool, Choice, whole_number
from drvenus.serve.runs import MAX_QUESTION_CHARS, Run, RunRegistry
from drvenus.serve.view import final_text, progress_line
from drvenus.text import BYTES_PER_TOKEN, estimate_tokens, one_line

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
    """A message's text: a string, or the text parts of a list of content parts (a user
    message's other parts are refused by :func:`check_supported`)."""
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
    """What a chat request researches: its last user message, after the conversation's
    earlier turns when it has any (a follow-up such as "When was he born?" keeps its subject);
    ApiError when there is no user message with text."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty list")
    turns = [m for m in messages if isinstance(m, Mapping)
             and m.get("role") in ("user", "assistant")]
    last = max((i for i, m in enumerate(turns) if m.get("role") == "user"), default=None)
    question = _text_of(turns[last].get("content")).strip() if last is not None else ""
    if not question:
        raise ApiError("the conversation has no user message with text to research")
    room = MAX_QUESTION_CHARS - len(question) - len(EARLIER) - len(FOLLOW_UP) - 3
    earlier = _earlier_turns(turns[:last], min(MAX_CONTEXT_CHARS, room))
    return f"{EARLIER}\n{earlier}\n\n{FOLLOW_UP}{question}" if earlier else question


EARLIER = "Earlier in this conversation:"
FOLLOW_UP = "Question (it follows up on the conversation above): "
MAX_CONTEXT_CHARS = 2000  # the earlier turns a follow-up carries, newest first
MAX_TURN_CHARS = 600


def _earlier_turns(turns: list[Mapping[str, Any]], budget: int) -> str:
    """The earlier turns as ``User: ...`` / ``Assistant: ...`` lines (an answer without its
    sources list), the newest that fit in ``budget`` characters."""
    lines: list[str] = []
    for message in reversed(turns):
        text = _text_of(message.get("content")).split("\n\nSources:\n", 1)[0].strip()
        if not text:
            continue
        who = "User" if message.get("role") == "user" else "Assistant"
        line = f"{who}: {one_line(text, MAX_TURN_CHARS)}"
        if sum(len(x) + 1 for x in lines) + len(line) > budget:
            break
        lines.append(line)
    return "\n".join(reversed(lines))


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
    """ApiError for what one research run cannot give: several choices, the caller's tools, a
    JSON response format, content other than text (images, audio, files); and for ``stop``
    and ``max_tokens`` that cannot be honoured (see :func:`shape_content`)."""
    n = body.get("n")
    if n is not None and n != 1:
        raise ApiError("n must be 1: each request is one research run with one answer",
                         param="n")
    if body.get("tools") or body.get("functions"):
        raise ApiError("tools are not supported: drvenus researches with its own search and "
                         "visit tools and answers in text", param="tools")
    response_format = body.get("response_format")
    if response_format is not None and not (
        isinstance(response_format, Mapping) and response_format.get("type") == "text"
    ):
        raise ApiError("response_format is not supported: drvenus answers in text (Markdown) "
                       "with its sources; only {\"type\": \"text\"} is accepted",
                       param="response_format")
    _parts_check(body.get("messages"))
    _stops(body.get("stop"))
    _max_tokens(body)


def _parts_check(messages: Any) -> None:
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, Mapping) else None
        for part in content if isinstance(content, list) else []:
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind != "text":
                what = {"image_url": "images", "input_audio": "audio", "file": "files"}.get(
                    str(kind), f"content parts of type {kind!r}")
                raise ApiError(f"{what} are not supported: drvenus researches questions "
                               "written as text", param="messages")


def _stops(stop: Any) -> list[str]:
    """``stop`` as a list of strings (up to 4, as OpenAI takes them); ApiError otherwise."""
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(
        isinstance(x, str) and x for x in stops
    ):
        raise ApiError("stop must be a non-empty string or a list of up to 4 of them",
                       param="stop")
    return stops


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    """``max_completion_tokens`` (or the older ``max_tokens``): a whole number from 1, or None."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ApiError(f"{name} must be a whole number from 1", param=name)
        return value
    return None


def shape_content(record: Mapping[str, Any], body: Mapping[str, Any],
                  texts: TextsLike = DRVENUS_TEXTS) -> tuple[str, str]:
    """The reply's content and ``finish_reason``: the answer (see :func:`final_text`; its
    sources read in ``texts``' words, the run's profile's) cut at the first ``stop`` string
    (``stop``) or to ``max_tokens`` estimated tokens (``length``)."""
    text, finish = final_text(record, texts), finish_reason(record)
    cuts = [i for stop in _stops(body.get("stop")) if (i := text.find(stop)) != -1]
    if cuts:
        text, finish = text[: min(cuts)], "stop"
    limit = _max_tokens(body)
    if limit is not None and estimate_tokens(text) > limit:
        text, finish = _clip_tokens(text, limit), "length"
    return text, finish


def _clip_tokens(text: str, limit: int) -> str:
    """The longest start of ``text`` (at a word where it can) of at most ``limit`` tokens."""
    data = text.encode("utf-8")[: int(limit * BYTES_PER_TOKEN)]
    head = data.decode("utf-8", "ignore")
    cut = head.rfind(" ")
    return head[:cut] if cut > len(head) // 2 else head


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


async def complete(run: Run, model: str, body: Mapping[str, Any] | None = None
                   ) -> dict[str, Any]:
    """The whole chat.completion once the run is over (``body``: the request's ``stop`` and
    ``max_tokens``)."""
    record = await run.wait() or {}
    content, finish = shape_content(record, body or {}, run.texts)
    reasoning = "\n".join(
        line for event in run.events if (line := progress_line(event, run.texts)) is not None
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
                    "content": content,
                    "reasoning_content": reasoning,
                },
                "finish_reason": finish,
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


async def stream(run: Run, model: str, *, include_usage: bool = False,
                 body: Mapping[str, Any] | None = None) -> AsyncIterator[bytes]:
    """Server-sent chat.completion.chunk events: progress as reasoning, then the answer (and,
    with ``include_usage``, a usage chunk, as OpenAI sends it). Closing the stream leaves the
    run going (its result stays in the registry)."""
    yield _chunk(run, model, {"role": "assistant", "content": ""})
    async for item in run.follow():
        if item is None:
            yield b": keep-alive\n\n"
            continue
        line = progress_line(item[1], run.texts)
        if line is not None:
            yield _chunk(run, model, {"reasoning_content": line + "\n"})
    content, finish = shape_content(run.record or {}, body or {}, run.texts)
    yield _chunk(run, model, {"content": content})
    yield _chunk(run, model, {}, finish=finish)
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
    "shape_content",
    "start_run",
    "stream",
    "wants_usage",
]
