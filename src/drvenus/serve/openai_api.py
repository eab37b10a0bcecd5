"""The OpenAI-compatible face: ``GET /v1/models`` and ``POST /v1/chat/completions``.

A chat completion researches the conversation's last user message with the run registry (so it
counts against the same run limit and its trace is kept). The final message's ``content`` is the
answer followed by the visited sources; the progress (steps, searches, pages read) is the
message's ``reasoning_content``, streamed as ``reasoning_content`` deltas when ``stream`` is on,
which chat UIs such as Open WebUI show as the model's thinking. ``model`` may name a model
preset (``drvenus`` or ``drvenus:<preset>``); anything else means the default.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from drvenus.serve.agents import AgentPool, Choice
from drvenus.serve.runs import Run, RunRegistry
from drvenus.serve.view import final_text, progress_line

MODEL_ID = "drvenus"


class BadRequest(ValueError):
    """A request the endpoint cannot serve (answered 400 in OpenAI's error shape)."""


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def models_list(pool: AgentPool) -> dict[str, Any]:
    ids = [MODEL_ID] + [f"{MODEL_ID}:{key}" for key in pool.models]
    return {
        "object": "list",
        "data": [{"id": i, "object": "model", "created": 0, "owned_by": "drvenus"} for i in ids],
    }


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
    """The last user message of a chat request; BadRequest when there is none."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            text = _text_of(message.get("content")).strip()
            if text:
                return text
            break
    raise BadRequest("the conversation has no user message with text to research")


def choice_of(body: Mapping[str, Any], pool: AgentPool) -> Choice:
    model = str(body.get("model") or "")
    preset = model.split(":", 1)[1] if model.startswith(f"{MODEL_ID}:") else None
    return Choice(model=preset if preset in pool.models else None)


def start_run(body: Mapping[str, Any], registry: RunRegistry) -> Run:
    """Start the research a chat request asks for (BadRequest, Busy)."""
    question = question_of(body)
    try:
        return registry.start(question, choice_of(body, registry.pool))
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def _usage(record: Mapping[str, Any]) -> dict[str, int]:
    usage = record.get("usage") or {}
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


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
                "finish_reason": "stop",
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
    yield _chunk(run, model, {}, finish="stop")
    if include_usage:
        body = {
            "id": f"chatcmpl-{run.id}", "object": "chat.completion.chunk",
            "created": int(run.created), "model": model or MODEL_ID, "choices": [],
            "usage": _usage(run.record or {}),
        }
        yield b"data: " + json.dumps(body).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


__all__ = [
    "MODEL_ID",
    "BadRequest",
    "complete",
    "error_body",
    "models_list",
    "question_of",
    "start_run",
    "stream",
    "wants_usage",
]
