"""The LLM judge: an OpenAI-compatible chat endpoint decides whether a final answer is
equivalent to the ground truth (``data clean``'s correctness filter, ``eval``'s judges and
``rl``'s LLM outcome all ask through :class:`JudgeClient`).

Verdicts are cached persistently in SQLite, keyed by a hash of (question, answer, ground truth,
judge model), so a rerun only asks about what it has not seen. Calls run concurrently with a
timeout and bounded retries with backoff. A call that still fails is reported as a failure
(``correct is None``), never as a wrong answer, and is not cached.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field
from pydantic.dataclasses import dataclass as options_dataclass

from drvenus.flags import Cli
from drvenus.llm.base import LLMError, SamplingParams
from drvenus.llm.openai_compat import OpenAICompatModel
from drvenus.net import normalize_base_url, with_retries
from drvenus.protocol import ANSWER_SPLIT
from drvenus.protocol.legacy import strip_thinking

log = logging.getLogger(__name__)

JUDGE_PROMPT = """You are grading the answer of a research assistant.

Question: {question}

Ground-truth answer (alternatives separated by " | "): {gt}

Predicted answer: {answer}

Is the predicted answer equivalent to the ground-truth answer (the same entity, value or fact, \
allowing different wording, formatting, or extra correct detail)? Reply with exactly one word: \
Correct or Incorrect."""

_VERDICT = re.compile(r"\b(incorrect|correct)\b", re.IGNORECASE)

# On the command line, endpoint and model are optional: they may come from the environment.
_FROM_ENV = Cli(type=str | None, default=None)


@options_dataclass(frozen=True)
class JudgeConfig:
    """Where and how to ask. ``api_key`` never appears in logs or reprs."""

    base_url: Annotated[
        str,
        _FROM_ENV,
        Field(description="OpenAI-compatible base URL (…/v1); env DRVENUS_JUDGE_BASE_URL."),
    ]
    model: Annotated[
        str, _FROM_ENV, Field(description="Judge model name; env DRVENUS_JUDGE_MODEL.")
    ]
    api_key: Annotated[str | None, Cli(hidden=True)] = field(default=None, repr=False)
    concurrency: Annotated[int, Field(ge=1, description="Concurrent judge requests.")] = 16
    retries: Annotated[int, Field(ge=0, description="Retries per judge request.")] = 3
    timeout_s: Annotated[
        float,
        Cli(flags=("--judge-timeout",)),
        Field(gt=0, description="Seconds per judge request."),
    ] = 60.0
    # no cap by default: a thinking judge cut off before its verdict would be a judge error
    max_tokens: Annotated[int | None, Cli(hidden=True), Field(ge=1)] = None
    cache_path: Annotated[
        Path | None,
        Cli(flags=("--judge-cache",)),
        Field(description="SQLite verdict cache (default <output-dir>/judge_cache.sqlite)."),
    ] = None

    @classmethod
    def from_options(
        cls, base_url: str | None, model: str | None, **kwargs
    ) -> JudgeConfig | None:
        """Options first, then ``DRVENUS_JUDGE_BASE_URL``/``_MODEL``/``_API_KEY`` from the
        environment or ``.env``; None when no endpoint is configured. ``kwargs`` (timeout,
        retries, ...) are checked even then; an endpoint without a model is refused (a judge
        named nowhere would be silently left out)."""
        from drvenus.config import load_settings

        settings = load_settings()
        base_url = base_url or settings.judge_base_url
        model = model or settings.judge_model
        if not base_url:
            cls(base_url="http://judge.invalid/v1", model="unset", **kwargs)  # kwargs checked
            return None
        if not model:
            raise ValueError("a judge endpoint (--judge-base-url / DRVENUS_JUDGE_BASE_URL) "
                             "needs its model: --judge-model (or DRVENUS_JUDGE_MODEL)")
        try:  # a malformed endpoint fails here, before any agent run, not at the first verdict
            normalize_base_url(base_url)
        except ValueError as exc:
            raise ValueError(f"judge endpoint (--judge-base-url / DRVENUS_JUDGE_BASE_URL): {exc}"
                             ) from None
        return cls(base_url=base_url, model=model, api_key=settings.judge_api_key_value(), **kwargs)

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> JudgeConfig | None:
        """:meth:`from_options` of a command's judge options (this class's fields; None: not
        given), as ``data clean`` and ``eval`` take them."""
        given = {k: v for k, v in values.items() if v is not None}
        return cls.from_options(given.pop("base_url", None), given.pop("model", None), **given)


@dataclass(frozen=True)
class Verdict:
    correct: bool | None  # None: the judge could not be asked successfully
    cached: bool = False
    error: str | None = None


def cache_key(question: str, answer: str, gt: str, model: str) -> str:
    blob = json.dumps([question, answer, gt, model], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class VerdictCache:
    """A small SQLite table ``key -> verdict``; safe to reuse across runs."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path))
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS verdicts "
            "(key TEXT PRIMARY KEY, correct INTEGER NOT NULL, reply TEXT, model TEXT, ts REAL)"
        )
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL, "
            "model TEXT, ts REAL)"
        )
        self._db.commit()

    def get(self, key: str) -> bool | None:
        row = self._db.execute("SELECT correct FROM verdicts WHERE key = ?", (key,)).fetchone()
        return None if row is None else bool(row[0])

    def put(self, key: str, correct: bool, reply: str, model: str) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?)",
            (key, int(correct), reply, model, time.time()),
        )
        self._db.commit()

    def get_reply(self, key: str) -> str | None:
        """A stored judge reply (the ``replies`` table, used by :class:`JudgeClient`)."""
        row = self._db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def put_reply(self, key: str, reply: str, model: str) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?)", (key, reply, model, time.time())
        )
        self._db.commit()

    def close(self) -> None:
        self._db.close()


def parse_verdict(reply: str) -> bool | None:
    """True/False from the judge's reply, None when it says neither."""
    text = strip_thinking(reply)
    m = _VERDICT.search(text)
    if m is None:
        return None
    return m.group(1).lower() == "correct"


JUDGE_SAMPLING = SamplingParams(
    temperature=0.0, top_p=1.0, top_k=-1, presence_penalty=0.0, max_tokens=None, stop=()
)


async def _ask_parsed(
    model: OpenAICompatModel, cfg: JudgeConfig, prompt: str, parse: Callable[[str], Any]
) -> tuple[Any, str]:
    """Ask ``prompt`` until ``parse(reply)`` is not None (``cfg.retries`` more times); returns
    (parsed, reply). HTTP failures are retried inside the model client. Raises RuntimeError
    when no parseable reply could be had."""
    messages = [{"role": "user", "content": prompt}]
    params = replace(JUDGE_SAMPLING, max_tokens=cfg.max_tokens)
    last_error = "no attempt"
    for _ in range(cfg.retries + 1):
        try:
            reply = (await model.generate(messages, params)).text
        except LLMError as exc:
            raise RuntimeError(str(exc)) from None
        parsed = parse(reply)
        if parsed is not None:
            return parsed, reply
        last_error = f"unparseable judge reply: {reply[:80]!r}"
    raise RuntimeError(last_error)


async def _ask_exact(
    model: OpenAICompatModel, cfg: JudgeConfig, messages: list[dict[str, str]],
    fields: dict[str, Any], parse: Callable[[str], Any],
) -> tuple[Any, str]:
    """One request of exactly ``model``, ``messages`` and ``fields`` (HTTP failures retried by
    the client's policy), asked again while ``parse`` finds nothing; (parsed, content)."""
    body: dict[str, Any] = {"model": cfg.model, "messages": messages, **fields}

    async def attempt(seconds: float | None) -> Any:
        return await model.transport.request("POST", "/chat/completions", body, seconds)

    last_error = "no attempt"
    for _ in range(cfg.retries + 1):
        try:
            data = await with_retries(attempt, model.retry, timeout=cfg.timeout_s,
                                      what=model.transport.where)
            reply = strip_thinking(model.parse_response(data).text).strip()
        except LLMError as exc:
            raise RuntimeError(str(exc)) from None
        parsed = parse(reply)
        if parsed is not None:
            return parsed, reply
        last_error = f"unparseable judge reply: {reply[:80]!r}"
    raise RuntimeError(last_error)


async def _ask(
    model: OpenAICompatModel, cfg: JudgeConfig, question: str, answer: str, gt: str
) -> tuple[bool, str]:
    """One verdict; raises RuntimeError when no verdict could be had."""
    prompt = JUDGE_PROMPT.format(
        question=question, gt=" | ".join(gt.split(ANSWER_SPLIT)), answer=answer
    )
    return await _ask_parsed(model, cfg, prompt, parse_verdict)


class JudgeClient:
    """One judge endpoint for any prompt: concurrency limit, retries of failed and unparseable
    replies, and the persistent reply cache (``cfg.cache_path``). Used by ``drvenus eval``."""

    def __init__(self, cfg: JudgeConfig) -> None:
        self.cfg = cfg
        self.cache = VerdictCache(cfg.cache_path) if cfg.cache_path else None
        self._sem = asyncio.Semaphore(max(1, cfg.concurrency))
        self._model: OpenAICompatModel | None = None

    def _client(self) -> OpenAICompatModel:
        if self._model is None:
            self._model = OpenAICompatModel(
                self.cfg.base_url, self.cfg.model, api_key=self.cfg.api_key,
                timeout=self.cfg.timeout_s, max_retries=self.cfg.retries,
            )
        return self._model

    async def ask(
        self,
        prompt: str,
        parse: Callable[[str], Any] | None = None,
        store: Callable[[Any], str] | None = None,
    ) -> tuple[Any, bool]:
        """``(parse(reply), cached)`` for ``prompt`` (the reply text itself without ``parse``).
        The cache keeps ``store(parsed)`` (default: the reply), which ``parse`` must read back.
        Raises RuntimeError when no parseable reply could be had (nothing is cached then)."""
        parse = parse or (lambda text: text)
        key = cache_key(prompt, "", "", self.cfg.model)
        hit = self.cache.get_reply(key) if self.cache else None
        if hit is not None and (value := parse(hit)) is not None:
            return value, True
        async with self._sem:
            value, reply = await _ask_parsed(self._client(), self.cfg, prompt, parse)
        if self.cache:
            self.cache.put_reply(key, store(value) if store else reply, self.cfg.model)
        return value, False

    async def ask_exact(
        self,
        messages: Sequence[Mapping[str, str]],
        request: Mapping[str, Any],
        parse: Callable[[str], Any],
        store: Callable[[Any], str] | None = None,
    ) -> tuple[Any, bool]:
        """Like :meth:`ask`, for an official grader: the request holds the model, ``messages``
        and the ``request`` fields (its sampling, token cap, response format) and nothing of
        drvenus's own sampling. ``parse`` gets the reply's content without think blocks; when it
        returns None the reply is asked again (``cfg.retries`` more times). Cached by messages,
        request and judge model. Raises RuntimeError when no parseable reply could be had."""
        msgs = [dict(m) for m in messages]
        fields = dict(request)
        key = cache_key(json.dumps(msgs, ensure_ascii=False),
                        json.dumps(fields, sort_keys=True, ensure_ascii=False), "exact",
                        self.cfg.model)
        hit = self.cache.get_reply(key) if self.cache else None
        if hit is not None and (value := parse(hit)) is not None:
            return value, True
        async with self._sem:
            value, reply = await _ask_exact(self._client(), self.cfg, msgs, fields, parse)
        if self.cache:
            self.cache.put_reply(key, store(value) if store else reply, self.cfg.model)
        return value, False

    async def aclose(self) -> None:
        if self._model is not None:
            await self._model.aclose()
            self._model = None
        if self.cache:
            self.cache.close()
            self.cache = None


async def judge_many_async(
    items: Sequence[tuple[str, str, str]],
    cfg: JudgeConfig,
    on_done: Callable[[int], None] | None = None,
) -> list[Verdict]:
    """A verdict for each ``(question, answer, gt)``, in order."""
    cache = VerdictCache(cfg.cache_path) if cfg.cache_path else None
    out: list[Verdict | None] = [None] * len(items)
    todo: list[tuple[int, str]] = []
    for i, (q, a, g) in enumerate(items):
        key = cache_key(q, a, g, cfg.model)
        hit = cache.get(key) if cache else None
        if hit is not None:
            out[i] = Verdict(hit, cached=True)
            if on_done:
                on_done(1)
        else:
            todo.append((i, key))
    sem = asyncio.Semaphore(max(1, cfg.concurrency))
    failures = 0

    async def one(model: OpenAICompatModel, i: int, key: str) -> None:
        nonlocal failures
        q, a, g = items[i]
        async with sem:
            try:
                verdict, reply = await _ask(model, cfg, q, a, g)
            except RuntimeError as exc:
                failures += 1
                if failures <= 3:
                    log.warning("judge call failed after %d attempts: %s", cfg.retries + 1, exc)
                out[i] = Verdict(None, error=str(exc))
            else:
                out[i] = Verdict(verdict)
                if cache:
                    cache.put(key, verdict, reply, cfg.model)
        if on_done:
            on_done(1)

    try:
        if todo:
            model = OpenAICompatModel(
                cfg.base_url, cfg.model, api_key=cfg.api_key, timeout=cfg.timeout_s,
                max_retries=cfg.retries,
            )
            try:
                await asyncio.gather(*(one(model, i, key) for i, key in todo))
            finally:
                await model.aclose()
    finally:
        if cache:
            cache.close()
    if failures:
        log.warning("%d of %d judge calls failed", failures, len(todo))
    return [v if v is not None else Verdict(None, error="not judged") for v in out]


def judge_many(
    items: Sequence[tuple[str, str, str]],
    cfg: JudgeConfig,
    on_done: Callable[[int], None] | None = None,
) -> list[Verdict]:
    """Synchronous wrapper of :func:`judge_many_async`."""
    return asyncio.run(judge_many_async(items, cfg, on_done))
