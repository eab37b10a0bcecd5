"""Page extractors: pull the evidence relevant to a goal out of a page, with a summary.

Two implementations share one interface, ``await extractor.extract(page_text, goal, url)``,
which returns an :class:`Extraction` or None when the page could not be processed (the visit
tool then writes the protocol's failure frame):

- :class:`ExtractiveExtractor`: offline, no model. Splits the page into passages, ranks them
  against the goal with BM25 and returns the best passages in page order.
- :class:`LLMExtractor`: asks a chat model for ``{"rational", "evidence", "summary"}`` JSON,
  as DR-Venus's visit tool does; parses it leniently and retries a bounded number of times.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from drvenus.llm.base import ChatModel, LLMError, SamplingParams
from drvenus.protocol import after_thinking
from drvenus.protocol._json import loads_json5
from drvenus.text import split_sentences

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Extraction:
    """What a page holds for a goal. ``evidence`` None means a summary-only visit frame."""

    evidence: str | None
    summary: str
    rational: str | None = None


@runtime_checkable
class Extractor(Protocol):
    async def extract(self, page_text: str, goal: str, url: str) -> Extraction | None:
        """Evidence for ``goal`` in ``page_text`` (fetched from ``url``); None on failure."""
        ...


# --- text helpers ------------------------------------------------------------------------------

_WORD = re.compile(r"\w+")
_STOPWORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    find information info details detail page article regarding related relevant specifically
    specific look looking identify determine confirm verify extract get know tell mention
    mentioned mentions whether any""".split()
)

def _fold(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def _stem(word: str) -> str:
    """A light, consistent suffix stripper (enough to match plurals and simple verb forms)."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 5 and word.endswith("ing"):
        return word[:-3]
    if len(word) > 4 and word.endswith("ed"):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def terms(text: str) -> list[str]:
    """Index terms of ``text``: folded lowercase words, stopwords dropped, lightly stemmed."""
    return [_stem(w) for w in _WORD.findall(_fold(text)) if w not in _STOPWORDS]


def split_passages(text: str, max_chars: int = 400) -> list[list[str]]:
    """Passages (lists of consecutive sentences, at most ``max_chars`` unless a single sentence is
    longer), never crossing a paragraph break."""
    passages: list[list[str]] = []
    for paragraph in re.split(r"\n\s*\n|\n(?=\s*[-*#\d])", text):
        paragraph = " ".join(paragraph.split())
        if not paragraph:
            continue
        current: list[str] = []
        size = 0
        for sentence in split_sentences(paragraph):
            if current and size + len(sentence) + 1 > max_chars:
                passages.append(current)
                current, size = [], 0
            current.append(sentence)
            size += len(sentence) + 1
        if current:
            passages.append(current)
    return passages


class BM25:
    """Okapi BM25 over a small in-memory collection (the passages of one page)."""

    def __init__(self, documents: list[list[str]], k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.tfs = [Counter(doc) for doc in documents]
        self.lengths = [len(doc) for doc in documents]
        self.avg_length = (sum(self.lengths) / len(documents)) if documents else 0.0
        df: Counter[str] = Counter()
        for tf in self.tfs:
            df.update(tf.keys())
        n = len(documents)
        self.idf = {t: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: list[str]) -> list[float]:
        unique = set(query)
        out = []
        for tf, length in zip(self.tfs, self.lengths, strict=True):
            norm = self.k1 * (1.0 - self.b + self.b * length / (self.avg_length or 1.0))
            score = 0.0
            for term in unique:
                f = tf.get(term)
                if f:
                    score += self.idf[term] * f * (self.k1 + 1.0) / (f + norm)
            out.append(score)
        return out


# --- the extractive (offline) extractor --------------------------------------------------------


class ExtractiveExtractor:
    """Evidence = the page passages that best match the goal (BM25), in page order."""

    def __init__(
        self,
        *,
        max_passages: int = 4,
        max_evidence_chars: int = 2000,
        passage_chars: int = 400,
        summary_sentences: int = 2,
    ) -> None:
        self.max_passages = max_passages
        self.max_evidence_chars = max_evidence_chars
        self.passage_chars = passage_chars
        self.summary_sentences = summary_sentences

    async def extract(self, page_text: str, goal: str, url: str) -> Extraction | None:
        # Off the event loop: a page at the full visit budget takes a fraction of a second.
        return await asyncio.to_thread(self.extract_sync, page_text, goal)

    def extract_sync(self, page_text: str, goal: str) -> Extraction | None:
        passages = split_passages(page_text or "", self.passage_chars)
        if not passages:
            return None
        texts = [" ".join(p) for p in passages]
        query = terms(goal)
        scores = BM25([terms(t) for t in texts]).scores(query) if query else [0.0] * len(texts)
        best = max(scores)
        if best <= 0.0:
            return self._lead(passages, texts)

        chosen: list[int] = []
        used = 0
        for i in sorted(range(len(texts)), key=lambda j: -scores[j]):
            if len(chosen) >= self.max_passages or scores[i] < 0.25 * best:
                break
            if chosen and used + len(texts[i]) > self.max_evidence_chars:
                continue
            chosen.append(i)
            used += len(texts[i])
        chosen.sort()
        evidence = "\n\n".join(_clip(texts[i], self.max_evidence_chars) for i in chosen)

        sentences = [s for i in chosen for s in passages[i]]
        sentence_scores = BM25([terms(s) for s in sentences]).scores(query)
        top = sorted(range(len(sentences)), key=lambda j: -sentence_scores[j])
        picked = sorted(j for j in top[: self.summary_sentences] if sentence_scores[j] > 0)
        summary = " ".join(sentences[j] for j in picked) or sentences[0]
        return Extraction(evidence=evidence, summary=summary)

    def _lead(self, passages: list[list[str]], texts: list[str]) -> Extraction:
        lead: list[str] = []
        used = 0
        for text in texts:
            if lead and used + len(text) > min(800, self.max_evidence_chars):
                break
            lead.append(_clip(text, self.max_evidence_chars))
            used += len(text)
        sentences = [s for p in passages for s in p]
        first = next((s for s in sentences if len(s.split()) >= 6), sentences[0])
        summary = f"The page does not directly address the goal. It begins: {_clip(first, 300)}"
        return Extraction(evidence="\n\n".join(lead), summary=summary)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + "..."


# --- the LLM extractor -------------------------------------------------------------------------

EXTRACTION_PROMPT = """You are reading a web page for a research assistant, who needs one thing \
from it.

## Page
URL: {url}

{page}

## Goal
{goal}

## What to do
1. Decide which parts of the page bear on the goal, and say why (the "rational").
2. Copy those parts into "evidence": the full relevant passages with enough context to stand \
on their own, verbatim where you can. Keep numbers, names and dates exactly as written.
3. Write a "summary": a short, plain answer to the goal drawn only from the evidence. If the \
page does not contain what the goal asks for, say so and note anything close to it.

Reply with a single JSON object and nothing else:
{{"rational": "...", "evidence": "...", "summary": "..."}}"""

# DR-Venus's summariser: temperature 0.7 and no cap on the reply, so the JSON is never cut off
# (``max_tokens`` None: the server's own limit applies).
DEFAULT_EXTRACTION_PARAMS = SamplingParams(
    temperature=0.7,
    top_p=0.95,
    top_k=20,
    presence_penalty=0.0,
    max_tokens=None,  # not sent: the server's own limit
    stop=(),
)
MIN_REPLY_CHARS = 10  # DR-Venus: a shorter reply means the page was too much for the model
SHORTEN_RATIO = 0.7
SHORTEN_RETRIES = 3
LAST_RESORT_CHARS = 25_000
JSON_RETRIES = 3

_FENCE = re.compile(r"```(?:json5?|JSON5?)?\s*\n?(.*?)```", re.DOTALL)


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list | tuple):
        return "\n".join(t for t in (_as_text(v) for v in value) if t)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value).strip()


def _candidates(text: str) -> list[str]:
    """Where the JSON object may be in a reply: fenced blocks, the outermost braces, all."""
    text = after_thinking(text)
    candidates = [m.group(1) for m in _FENCE.finditer(text)]
    start, end = text.find("{"), text.rfind("}")
    if start != -1 and end > start:
        candidates.append(text[start : end + 1])
    candidates.append(text)
    return [c.strip() for c in candidates]


def _as_extraction(obj: Any) -> Extraction | None:
    if not isinstance(obj, dict):
        return None
    lowered = {str(k).lower(): v for k, v in obj.items()}
    evidence = _as_text(lowered.get("evidence"))
    summary = _as_text(lowered.get("summary"))
    rational = _as_text(lowered.get("rational", lowered.get("rationale"))) or None
    if not evidence and not summary:
        return None
    return Extraction(evidence=evidence or None, summary=summary or evidence, rational=rational)


def parse_extraction(text: str, *, lenient: bool = True) -> Extraction | None:
    """The extraction in a model reply: a JSON object, possibly fenced or after a think block.
    ``lenient``: also JSON5 (single quotes, trailing commas, comments), the repair step; else
    strict JSON, as DR-Venus's tool reads it. None unless the object has a non-empty
    ``evidence`` or ``summary``."""
    for candidate in _candidates(text):
        try:
            obj = loads_json5(candidate) if lenient else json.loads(candidate)
        except Exception:  # json5 raises several types
            continue
        extraction = _as_extraction(obj)
        if extraction is not None:
            return extraction
    return None


class LLMExtractor:
    """Evidence extraction by a chat model, as DR-Venus's visit summariser does it.

    1. Ask for the ``{"rational", "evidence", "summary"}`` JSON. A reply shorter than
       ``min_reply_chars`` (or a failed model call) means the page was too much: ask again with
       the page cut to ``shorten_ratio`` of its length, up to ``shorten_retries`` times, then
       once with its first ``last_resort_chars`` characters.
    2. A reply that is not a usable JSON object: ask again, up to ``json_retries`` times.
    3. Then repair: the replies read leniently (JSON5, the outermost braces), newest first.

    ``max_attempts`` caps the model calls per page (default: all the steps above). When every
    step fails, ``fallback``'s extraction (e.g. the offline :class:`ExtractiveExtractor`) or
    None (the visit tool's failure frame). ``repair`` False leaves step 3 out (DR-Venus has
    none). ``prompt``: a :meth:`str.format` template; ``{page}`` (or ``{webpage_content}``, the
    name DR-Venus's template uses), ``{goal}`` and ``{url}`` are filled in.
    """

    def __init__(
        self,
        model: ChatModel,
        *,
        params: SamplingParams = DEFAULT_EXTRACTION_PARAMS,
        max_attempts: int | None = None,
        fallback: Extractor | None = None,
        prompt: str = EXTRACTION_PROMPT,
        min_reply_chars: int = MIN_REPLY_CHARS,
        shorten_ratio: float = SHORTEN_RATIO,
        shorten_retries: int = SHORTEN_RETRIES,
        last_resort_chars: int = LAST_RESORT_CHARS,
        json_retries: int = JSON_RETRIES,
        repair: bool = True,
    ) -> None:
        if max_attempts is not None and max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not 0 < shorten_ratio < 1:
            raise ValueError("shorten_ratio must be between 0 and 1")
        self.model = model
        self.params = params
        self.max_attempts = max_attempts or 2 + shorten_retries + json_retries
        self.fallback = fallback
        self.prompt = prompt
        self.min_reply_chars = min_reply_chars
        self.shorten_ratio = shorten_ratio
        self.shorten_retries = shorten_retries
        self.last_resort_chars = last_resort_chars
        self.json_retries = json_retries
        self.repair = repair

    def __repr__(self) -> str:
        return f"LLMExtractor({self.model!r})"

    def messages(self, page_text: str, goal: str, url: str) -> list[dict[str, str]]:
        content = self.prompt.format(url=url, page=page_text, webpage_content=page_text,
                                     goal=goal)
        return [{"role": "user", "content": content}]

    async def _ask(self, page: str, goal: str, url: str, calls: list[int]) -> str:
        """One model call; its reply text ("" when the call failed)."""
        calls[0] += 1
        try:
            generation = await self.model.generate(self.messages(page, goal, url), self.params)
        except LLMError as exc:
            log.warning("extractor model failed on %s (call %d): %s", url, calls[0], exc)
            return ""
        return after_thinking(generation.text or "").strip()

    def _shorter(self, page: str, step: int) -> str:
        if step < self.shorten_retries:
            return page[: int(self.shorten_ratio * len(page))]
        return page[: self.last_resort_chars]

    async def extract(self, page_text: str, goal: str, url: str) -> Extraction | None:
        calls = [0]
        page = page_text
        reply = await self._ask(page, goal, url, calls)
        step = 0
        while len(reply) < self.min_reply_chars and step <= self.shorten_retries:
            if calls[0] >= self.max_attempts:
                break
            page = self._shorter(page, step)
            log.info("extractor reply for %s too short: retrying on %d chars", url, len(page))
            reply = await self._ask(page, goal, url, calls)
            step += 1
        replies = [reply]
        for retry in range(self.json_retries + 1):
            extraction = parse_extraction(reply, lenient=False)
            if extraction is not None:
                return extraction
            if retry == self.json_retries or calls[0] >= self.max_attempts:
                break
            log.warning("extractor reply for %s is not usable JSON: %.120r", url, reply)
            reply = await self._ask(page, goal, url, calls)
            replies.append(reply)
        for earlier in reversed(replies if self.repair else []):  # the repair: lenient parsing
            extraction = parse_extraction(earlier)
            if extraction is not None:
                return extraction
        if self.fallback is not None:
            log.info("falling back to %s for %s", type(self.fallback).__name__, url)
            return await self.fallback.extract(page_text, goal, url)
        return None

    async def aclose(self) -> None:
        await self.model.aclose()
