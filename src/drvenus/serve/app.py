"""The ``drvenus serve`` app: one FastAPI server, three faces on the same agents and run registry.

- ``/``: the web demo (static page in ``static/``) over a small JSON + server-sent-events API:
  ``GET /api/config``; ``POST /api/runs`` ``{"question", "model", "tools", "max_steps",
  "heavy"}`` (``heavy``: Heavy mode's runs, up to the pool's ``heavy_cap``);
  ``GET /api/runs``; ``GET /api/runs/{id}`` (summary, record when over);
  ``GET /api/runs/{id}/events`` (SSE; ``Last-Event-ID`` or ``?after=N`` resumes);
  ``POST /api/runs/{id}/cancel``; ``POST /api/replay`` ``{"text"}`` (a saved trace or results
  file, as events to replay).
- ``/v1``: OpenAI-compatible chat completions (:mod:`drvenus.serve.openai_api`).
- ``/mcp``: MCP over Streamable HTTP (:mod:`drvenus.serve.mcp_server`).
- ``/health``: liveness, the only route without the token.

Access control is :class:`drvenus.net.guard.Guard` (the tool server's too), with the browser
login on (the token cookie, ``/?token=``) and JSON-only POSTs under ``/api/`` and ``/v1/``.

Limits: JSON bodies up to ``max_body_bytes`` (replayed files up to ``max_replay_bytes``),
questions up to :data:`MAX_QUESTION_CHARS`, runs bounded by the registry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drvenus import __version__
from drvenus.net.guard import OPEN_PATHS, Guard
from drvenus.net.server import MAX_BODY_BYTES, Busy, Reject, read_json_body, require_serve_extra
from drvenus.serve.agents import Choice, whole_number
from drvenus.serve.runs import MAX_QUESTION_CHARS, BadQuestion, Run, RunRegistry, unknown_run
from drvenus.serve.view import finished_view, for_client, load_saved, report_markdown

if TYPE_CHECKING:
    from fastapi import FastAPI, Request
    from fastapi.responses import Response

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
MAX_REPLAY_BYTES = 32 << 20
JSON_ONLY_PREFIXES = ("/api/", "/v1/")  # POSTs there must be JSON (MCP checks its own)
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
MODEL_DOWN = "the model server is not answering"
VISITOR_COOKIE = "drvenus_visitor"  # who started a page's runs: the Runs list shows their own
VISITOR_ID = re.compile(r"^[0-9a-f]{32}$")
VISITOR_MAX_AGE = 400 * 24 * 3600


def _visitor(request: Request) -> str | None:
    """The page visitor's id from their cookie (None: no valid one)."""
    value = request.cookies.get(VISITOR_COOKIE, "")
    return value if VISITOR_ID.match(value) else None


def _remember_visitor(response: Response, visitor: str) -> Response:
    response.set_cookie(VISITOR_COOKIE, visitor, max_age=VISITOR_MAX_AGE, httponly=True,
                        samesite="lax", path="/")
    return response


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    from fastapi.responses import Response

    try:
        data = json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate (from a model or a page): escaped, never a 500
        data = json.dumps(body).encode()
    return Response(data, status, headers, media_type="application/json")


def _choice(body: dict[str, Any]) -> Choice:
    try:
        steps, heavy = whole_number(body.get("max_steps"), "max_steps"), whole_number(
            body.get("heavy"), "heavy")
    except ValueError as exc:
        raise Reject(400, {"error": str(exc)}) from None
    model, tools = body.get("model"), body.get("tools")
    if not all(v is None or isinstance(v, str) for v in (model, tools)):
        raise Reject(400, {"error": "model and tools must be preset names"})
    return Choice(model or None, tools or None, steps, heavy)


def _question(body: dict[str, Any]) -> str:
    question = body.get("question")
    if not isinstance(question, str) or not question.strip():
        raise Reject(400, {"error": "'question' must be a non-empty string"})
    return question  # the registry checks the rest (its length, valid Unicode)


def _start(registry: RunRegistry, question: str, choice: Choice, owner: str) -> Run:
    try:
        return registry.start(question, choice, origin="page", owner=owner)
    except Busy as exc:
        raise Reject(503, {"error": f"busy: {exc}"}, retry_after=5) from None
    except BadQuestion as exc:
        raise Reject(exc.status, {"error": str(exc)}) from None
    except ValueError as exc:
        raise Reject(400, {"error": str(exc)}) from None


RUN_NOT_FOUND = "run_not_found"  # the ``code`` of an unknown run's 404
RUN_ACTIONS = ("", "events", "report", "trace", "cancel")  # /api/runs/{id}/<action>


def _no_run(run_id: str) -> Reject:
    return Reject(404, {"error": unknown_run(run_id), "code": RUN_NOT_FOUND})


def _run_or_404(registry: RunRegistry, run_id: str) -> Run:
    run = registry.get(run_id)
    if run is None:
        raise _no_run(run_id)
    return run


def _run_body(run: Run) -> dict[str, Any]:
    body = run.summary()
    record = run.record
    if record is not None:
        body["result"] = finished_view(record, run.texts)
    return body


def _resume_index(request: Request) -> int:
    """The index of the last event the client has (-1: none)."""
    raw = request.headers.get("last-event-id") or request.query_params.get("after") or "-1"
    try:
        return int(raw)
    except ValueError:
        raise Reject(400, {"error": "Last-Event-ID / after must be an event index"}) from None


def _download(registry: RunRegistry, run_id: str, what: str) -> Response:
    """A run's ``report`` (Markdown, once it is over) or its ``trace`` (JSONL), as a file."""
    from fastapi.responses import Response

    run = _run_or_404(registry, run_id)
    if what == "trace":
        lines = [json.dumps(e, ensure_ascii=False) for e in run.events]
        body, kind, ext = "".join(x + "\n" for x in lines), "application/x-ndjson", "jsonl"
    elif run.record is None:
        raise Reject(409, {"error": "the run is not over yet: its report comes at its end"})
    else:
        body, kind, ext = report_markdown(run.record, run.id, run.texts), "text/markdown", "md"
    disposition = f'attachment; filename="drvenus-{run.id}.{ext}"'
    return Response(body.encode("utf-8", "replace"), 200, media_type=f"{kind}; charset=utf-8",
                    headers={"Content-Disposition": disposition, "Cache-Control": "no-store"})


async def _sse(run: Run, after: int) -> AsyncIterator[bytes]:
    yield f"event: run\ndata: {json.dumps(run.summary(), ensure_ascii=False)}\n\n".encode()
    async for item in run.follow(after):
        if item is None:
            yield b": keep-alive\n\n"
            continue
        index, event = item
        data = json.dumps(for_client(index, event, run.texts), ensure_ascii=False)
        yield f"id: {index}\nevent: trace\ndata: {data}\n\n".encode()
    yield f"event: end\ndata: {json.dumps(run.summary(), ensure_ascii=False)}\n\n".encode()


def _api_routes(app: FastAPI, registry: RunRegistry, limits: dict[str, int]) -> None:
    from fastapi.responses import StreamingResponse

    async def config(request: Request) -> Response:
        problem = await registry.pool.problem()  # first: it learns a server's model name
        options = registry.pool.options()
        # the operator's console has the details (the address); visitors get the fact
        options.update(version=__version__, max_running=registry.max_running,
                       max_question_chars=MAX_QUESTION_CHARS,
                       problem=MODEL_DOWN if problem else None)
        return _json(200, options)

    async def create(request: Request) -> Response:
        body = await read_json_body(request, limits["body"])
        visitor = _visitor(request)
        owner = visitor or secrets.token_hex(16)
        run = _start(registry, _question(body), _choice(body), owner)
        response = _json(201, run.summary())
        return response if visitor else _remember_visitor(response, owner)

    async def listing(request: Request) -> Response:
        runs = registry.list(owner=_visitor(request), everyone=limits["all_runs"] > 0)
        return _json(200, {"runs": runs, "all": limits["all_runs"] > 0})

    async def one(request: Request) -> Response:
        return _json(200, _run_body(_run_or_404(registry, request.path_params["run_id"])))

    async def events(request: Request) -> Response:
        run = _run_or_404(registry, request.path_params["run_id"])
        stream = _sse(run, _resume_index(request))
        return StreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)

    async def report(request: Request) -> Response:
        return _download(registry, request.path_params["run_id"], "report")

    async def trace(request: Request) -> Response:
        return _download(registry, request.path_params["run_id"], "trace")

    async def cancel(request: Request) -> Response:

        run = _run_or_404(registry, request.path_params["run_id"])
        stopped = await registry.cancel(run.id)
        return _json(200, {"stopped": stopped, **run.summary()})


    app.add_route("/api/config", config, methods=["GET"])
    app.add_route("/api/runs", create, methods=["POST"])
    app.add_route("/api/runs", listing, methods=["GET"])
    app.add_route("/api/runs/{run_id}", one, methods=["GET"])
    app.add_route("/api/runs/{run_id}/events", events, methods=["GET"])
    app.add_route("/api/runs/{run_id}/cancel", cancel, methods=["POST"])
    app.add_route("/api/runs/{run_id}/report", report, methods=["GET"])
    app.add_route("/api/runs/{run_id}/trace", trace, methods=["GET"])
    _replay_route(app, registry, limits)

    async def no_such_run(request: Request) -> Response:
        """What the routes above do not take: an unknown run (its id holding a "/", say),
        or a known run asked for something it does not have."""
        rest = request.path_params["rest"]
        run_id, _, action = rest.partition("/")
        if registry.get(run_id) is None:
            raise _no_run(rest)
        if action in RUN_ACTIONS:  # the other method's route
            raise Reject(405, {"error": f"{request.method} is not allowed here"})
        raise Reject(404, {"error": "a run has no such page: its summary, events, report, "
                                    "trace, or cancel"})

    app.add_route("/api/runs/{rest:path}", no_such_run, methods=["GET", "POST"])


def _replay_route(app: FastAPI, registry: RunRegistry, limits: dict[str, int]) -> None:
    """``POST /api/replay``: a saved trace file's runs, in the page's event form."""

    async def replay(request: Request) -> Response:
        body = await read_json_body(request, limits["replay"])
        text = body.get("text")
        if not isinstance(text, str):
            raise Reject(400, {"error": "'text' must be the saved file's content"})
        texts = registry.pool.texts  # a saved file: in the words of this server's profiles

        def parse() -> dict[str, Any]:  # tens of MB: off the event loop, streams keep flowing
            runs = load_saved(text, texts)
            return {"runs": [
                {"question": r["question"],
                 "events": [for_client(i, e, texts) for i, e in enumerate(r["events"])]}
                for r in runs
            ]}

        try:
            answer = await asyncio.to_thread(parse)
        except ValueError as exc:
            raise Reject(422, {"error": f"cannot replay this file: {exc}"}) from None
        except (TypeError, AttributeError, KeyError) as exc:  # a shape load_saved let through
            log.warning("replay: unexpected shape: %s: %s", type(exc).__name__, exc)
            raise Reject(422, {"error": "cannot replay this file: an entry has an unexpected "
                                        f"shape ({type(exc).__name__}: {exc})"}) from None
        return _json(200, answer)

    app.add_route("/api/replay", replay, methods=["POST"])


def _openai_routes(app: FastAPI, registry: RunRegistry, limits: dict[str, int]) -> None:
    from fastapi.responses import StreamingResponse

    from drvenus.serve import openai_api as oa

    async def models(request: Request) -> Response:
        return _json(200, oa.models_list(registry.pool))

    async def model(request: Request) -> Response:
        try:
            return _json(200, oa.model_info(request.path_params["model"], registry.pool))
        except oa.ApiError as exc:
            return _json(exc.status, exc.body())

    async def chat(request: Request) -> Response:
        try:
            body = await read_json_body(request, limits["body"])
            run = oa.start_run(body, registry)
        except Reject as exc:
            return _json(exc.status, oa.error_body(str(exc.body.get("error", ""))))
        except oa.ApiError as exc:
            return _json(exc.status, exc.body())
        except Busy as exc:
            return _json(429, oa.error_body(f"busy: {exc}", "rate_limit_error"),
                         {"Retry-After": "5"})
        model = str(body.get("model") or oa.MODEL_ID)
        if body.get("stream"):
            return StreamingResponse(
                oa.stream(run, model, include_usage=oa.wants_usage(body), body=body),
                media_type="text/event-stream", headers=SSE_HEADERS,
            )
        return _json(200, await oa.complete(run, model, body))

    app.add_route("/v1/models", models, methods=["GET"])
    app.add_route("/v1/models/{model:path}", model, methods=["GET"])
    app.add_route("/v1/chat/completions", chat, methods=["POST"])


FAVICON = (  # a small mark in the page's accent colour
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><circle cx="14" cy="14" r="9" '
    b'fill="none" stroke="#3b5bdb" stroke-width="4"/><path d="M21 21l7 7" stroke="#3b5bdb" '
    b'stroke-width="4" stroke-linecap="round"/></svg>'
)


def _page_routes(app: FastAPI) -> None:
    from fastapi.responses import FileResponse, Response
    from fastapi.staticfiles import StaticFiles

    async def index(request: Request) -> Response:
        page = FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})
        return page if _visitor(request) else _remember_visitor(page, secrets.token_hex(16))

    async def health(request: Request) -> Response:
        return _json(200, {"status": "ok"})

    async def favicon(request: Request) -> Response:
        return Response(FAVICON, media_type="image/svg+xml",
                        headers={"Cache-Control": "max-age=86400"})

    app.add_route("/", index, methods=["GET"])
    app.add_route("/health", health, methods=["GET"])
    app.add_route("/favicon.ico", favicon, methods=["GET"])
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")


def _mcp_route(app: FastAPI, registry: RunRegistry, max_body: int, quick_answer: float | None
               ) -> Any:
    """Mount MCP's Streamable HTTP endpoint at /mcp; returns its session manager."""
    from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
    from mcp.server.transport_security import TransportSecuritySettings

    from drvenus.serve.mcp_server import QUICK_ANSWER_SECONDS, build_mcp

    server = build_mcp(registry, quick_answer_seconds=quick_answer or QUICK_ANSWER_SECONDS)
    # the Guard checks the Host header and the token in front of every route, /mcp included
    server.streamable_http_app(
        streamable_http_path="/mcp",
        max_request_body_size=max_body,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    manager = server.session_manager
    app.add_route("/mcp", StreamableHTTPASGIApp(manager), methods=["GET", "POST", "DELETE"])
    return manager


def create_app(
    registry: RunRegistry,
    *,
    token: str | None = None,
    mcp: bool = True,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_replay_bytes: int = MAX_REPLAY_BYTES,
    mcp_quick_answer_seconds: float | None = None,
    all_runs: bool = False,
) -> FastAPI:
    """The server app over ``registry`` (see the module doc). Its lifespan runs the MCP
    session manager and, at shutdown, stops the runs and closes the agents' models and tools.
    ``mcp`` False leaves ``/mcp`` out (no ``mcp`` package needed);
    ``mcp_quick_answer_seconds``: see :func:`drvenus.serve.mcp_server.build_mcp`. The page's
    Runs list shows each visitor the runs they started there (a cookie says who they are);
    ``all_runs`` shows every run, ``/v1`` and MCP ones too, to every visitor."""
    require_serve_extra()
    from fastapi import FastAPI

    holder: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            if "mcp" in holder:
                async with holder["mcp"].run():
                    yield
            else:
                yield
        finally:
            await registry.aclose()
            await registry.pool.aclose()

    app = FastAPI(title="drvenus", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    limits = {"body": max_body_bytes, "replay": max_replay_bytes, "all_runs": int(all_runs)}
    _page_routes(app)
    _api_routes(app, registry, limits)
    _openai_routes(app, registry, limits)
    if mcp:
        holder["mcp"] = _mcp_route(app, registry, max_body_bytes, mcp_quick_answer_seconds)

    @app.exception_handler(Reject)
    async def rejected(request: Request, exc: Reject) -> Response:
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
        return _json(exc.status, exc.body, headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.error("server error on %s", request.url.path, exc_info=exc)
        return _json(500, {"error": "internal error"})

    app.state.registry = registry
    app.add_middleware(Guard, token=token, json_prefixes=JSON_ONLY_PREFIXES, browser_login=True,
                       open_paths=OPEN_PATHS | {"/favicon.ico"})
    from drvenus.serve.openai_api import OpenAIErrors

    app.add_middleware(OpenAIErrors)  # outside the guard: its refusals under /v1 too
    return app


__all__ = ["MAX_QUESTION_CHARS", "MAX_REPLAY_BYTES", "STATIC_DIR", "create_app"]
