"""Benchmark loaders: ``load(name, path)`` reads a local file into :class:`EvalItem` s.

One section per benchmark (loader, then its spec in :data:`BENCHMARKS`, which names its grader
in :mod:`drvenus.eval.judges`). Nothing is downloaded. Encrypted sets (BrowseComp,
BrowseComp-ZH, xbench-DeepSearch) are decrypted in memory only; their plaintext is never logged
and the runner never writes their questions or answers to disk.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drvenus.corpus.urls import pseudo_url, wikipedia_url
from drvenus.questions import read_questions
from drvenus.records import read_records

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalItem:
    """One benchmark question. ``answer`` is the first accepted answer, ``answers`` all of
    them; ``meta`` holds benchmark fields (``level``, ``answer_type``, ``gold_urls`` ...)."""

    id: str
    question: str
    answer: str
    answers: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def _item(item_id: Any, question: Any, answers: Iterable[Any], **meta: Any) -> EvalItem:
    accepted = [str(a).strip() for a in answers if a is not None and str(a).strip()]
    return EvalItem(
        str(item_id).strip(), str(question or "").strip(), accepted[0] if accepted else "",
        accepted, meta,
    )


# ---------------------------------------------------------------------------- encryption
def _xor(data: bytes, key: bytes) -> bytes:
    """``data`` XOR ``key`` repeated to its length."""
    reps = len(data) // len(key) + 1
    return bytes(a ^ b for a, b in zip(data, key * reps, strict=False))


def browsecomp_key(canary: str) -> bytes:
    """BrowseComp's key: the SHA-256 digest of the canary string."""
    return hashlib.sha256(canary.encode("utf-8")).digest()


def xbench_key(canary: str) -> bytes:
    """xbench-DeepSearch's key: the canary's UTF-8 bytes themselves."""
    return canary.encode("utf-8")


def decrypt(field_b64: str, key: bytes) -> str:
    """base64-decode then XOR with ``key`` repeated; UTF-8 text. ValueError when the field is
    not base64, UnicodeDecodeError when the key does not turn it into text."""
    return _xor(base64.b64decode("".join(field_b64.split()), validate=True), key).decode("utf-8")


def _decrypted(row: dict[str, Any], column: str, key: bytes, where: str) -> str:
    """:func:`decrypt` of ``row[column]``; one line naming ``where`` (file, row), the column
    and what to check when it cannot be decrypted."""
    try:
        return decrypt(str(row[column]), key)
    except UnicodeDecodeError:
        problem = ("does not decrypt to text with the row's canary (another canary, or an "
                   "edited file?)")
    except ValueError:  # binascii.Error: not base64
        problem = ("is not encrypted (not base64): give the benchmark's encrypted release; a "
                   "plain question,answer file runs with -b jsonl")
    raise ValueError(f"{where}, column {column}: {problem}") from None


def encrypt(text: str, key: bytes) -> str:
    """The inverse of :func:`decrypt` (for tests and synthetic files)."""
    return base64.b64encode(_xor(text.encode("utf-8"), key)).decode("ascii")


def _need(rows: list[dict[str, Any]], columns: Iterable[str], name: str) -> None:
    missing = [c for c in columns if rows and c not in rows[0]]
    if missing:
        raise ValueError(f"{name}: missing column(s) {', '.join(missing)}")


# ---------------------------------------------------------------------------- BrowseComp(-ZH)
def load_browsecomp(path: Path) -> list[EvalItem]:
    """BrowseComp CSV ``problem,answer,canary`` (and ``problem_topic``), SHA-256 key."""
    rows = read_records(path)
    _need(rows, ("problem", "answer", "canary"), "browsecomp")
    items = []
    for i, r in enumerate(rows, 1):
        key, where = browsecomp_key(str(r["canary"])), f"{path.name} row {i}"
        items.append(_item(i, _decrypted(r, "problem", key, where),
                           [_decrypted(r, "answer", key, where)], topic=r.get("problem_topic")))
    return items


def load_browsecomp_zh(path: Path) -> list[EvalItem]:
    """BrowseComp-ZH xlsx/CSV ``Topic,Question,Answer,canary``; every field encrypted."""
    rows = read_records(path)
    _need(rows, ("Topic", "Question", "Answer", "canary"), "browsecomp-zh")
    items = []
    for i, r in enumerate(rows, 1):
        key, where = browsecomp_key(str(r["canary"])), f"{path.name} row {i}"
        topic = _decrypted(r, "Topic", key, where) if r.get("Topic") else None
        items.append(_item(i, _decrypted(r, "Question", key, where),
                           [_decrypted(r, "Answer", key, where)], topic=topic))
    return items


# ---------------------------------------------------------------------------- xbench-DeepSearch
def load_xbench(path: Path) -> list[EvalItem]:
    """xbench-DeepSearch CSV ``id,prompt,answer,reference_steps,canary``; key = canary bytes."""
    rows = read_records(path)
    _need(rows, ("id", "prompt", "answer", "canary"), "xbench-deepsearch")
    items = []
    for i, r in enumerate(rows, 1):
        key, where = xbench_key(str(r["canary"])), f"{path.name} row {i}"
        steps = _decrypted(r, "reference_steps", key, where) if r.get("reference_steps") else None
        items.append(_item(r.get("id") or i, _decrypted(r, "prompt", key, where),
                           [_decrypted(r, "answer", key, where)], reference_steps=steps))
    return items


# ---------------------------------------------------------------------------- GAIA
def load_gaia(path: Path, *, text_only: bool = False) -> list[EvalItem]:
    """GAIA ``metadata.jsonl`` or a JSON/JSONL/parquet export (``Question``, ``Final answer``,
    ``Level``, ``file_name``). ``text_only``: drop items with an attached file."""
    rows = read_records(path)
    items = []
    for i, r in enumerate(rows, 1):
        question = r.get("Question", r.get("question"))
        answer = r.get("Final answer", r.get("final_answer", r.get("answer")))
        file_name = r.get("file_name") or ""
        if question is None or answer is None or (text_only and file_name):
            continue
        level = r.get("Level", r.get("level"))
        items.append(_item(r.get("task_id") or i, question, [answer],
                           level=str(level) if level is not None else None,
                           file_name=file_name or None))
    return items


# ---------------------------------------------------------------------------- HLE
def load_hle(path: Path, *, text_only: bool = False) -> list[EvalItem]:
    """Humanity's Last Exam: the dataset's parquet (or a JSON/JSONL/CSV export) with ``id``,
    ``question``, ``answer``, ``answer_type``, ``category`` and ``image`` (empty for text-only
    questions). ``text_only``: drop the questions with an image (the agent cannot see them)."""
    rows = read_records(path)
    _need(rows, ("question", "answer"), "hle")
    items = []
    for i, r in enumerate(rows, 1):
        image = r.get("image") or ""
        if text_only and image:
            continue
        items.append(_item(r.get("id") or i, r["question"], [r["answer"]],
                           answer_type=r.get("answer_type"), category=r.get("category"),
                           has_image=bool(image)))
    return items


# ---------------------------------------------------------------------------- DeepSearchQA
def load_deepsearchqa(path: Path) -> list[EvalItem]:
    """DeepSearchQA CSV ``example_id,problem,problem_category,answer,answer_type``."""
    rows = read_records(path)
    _need(rows, ("problem", "answer"), "deepsearchqa")
    return [
        _item(r.get("example_id") or i, r["problem"], [r["answer"]],
              category=r.get("problem_category"),
              answer_type=str(r.get("answer_type") or "Single").strip())
        for i, r in enumerate(rows, 1)
    ]


# ---------------------------------------------------------------------------- FRAMES, SimpleQA
def load_frames(path: Path) -> list[EvalItem]:
    """FRAMES CSV/TSV export: ``Prompt``, ``Answer``, ``reasoning_types``."""
    rows = read_records(path)
    _need(rows, ("Prompt", "Answer"), "frames")
    return [
        _item(r.get("Unnamed: 0") or r.get("") or i, r["Prompt"], [r["Answer"]],
              reasoning_types=r.get("reasoning_types"))
        for i, r in enumerate(rows, 1)
    ]


def load_simpleqa(path: Path) -> list[EvalItem]:
    """SimpleQA CSV ``metadata,problem,answer``."""
    rows = read_records(path)
    _need(rows, ("problem", "answer"), "simpleqa")
    return [_item(i, r["problem"], [r["answer"]]) for i, r in enumerate(rows, 1)]


# ---------------------------------------------------------------------------- generic QA
def is_set_answer(meta: dict[str, Any]) -> bool:
    """DeepSearchQA's ``answer_type`` names a set: "Set Answer" (the dataset's spelling) or
    "Set"; "Single Answer" / "Single" do not."""
    return str(meta.get("answer_type") or "").strip().lower() in ("set", "set answer")


GENERIC_META = ("level", "data_source", "answer_type")


def load_generic(path: Path) -> list[EvalItem]:
    """Any question file with answers (:func:`drvenus.questions.read_questions`: JSONL /
    parquet / JSON / CSV question/answer rows, or RL-format rows); rows without a question
    and an answer are skipped and counted."""
    report = read_questions(path, need_answer=True)
    skipped = report.malformed + report.duplicates
    if skipped:
        log.warning("%s: %d row(s) without a question and answer, or repeated, skipped%s",
                    path, skipped, f" ({report.problems[0]})" if report.problems else "")
    return [
        _item(q.id, q.question, q.answers, **{k: q.meta[k] for k in GENERIC_META if k in q.meta})
        for q in report.items
    ]


# ---------------------------------------------------------------------------- HotpotQA (offline)
HOTPOT_CORPUS = "hotpotqa-paragraphs"
HOTPOT_OFFICIAL = "hotpotqa"
# a row's paragraphs: (title, text, is it a supporting paragraph)
Paragraphs = Callable[[dict[str, Any]], list[tuple[str, str, bool]]]


def _ircot_paragraphs(row: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """IRCoT's ``contexts[]{title, paragraph_text, is_supporting}``."""
    return [(str(c.get("title") or ""), str(c.get("paragraph_text") or ""),
             bool(c.get("is_supporting"))) for c in row.get("contexts") or []]


def _official_paragraphs(row: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """HotpotQA's ``context`` (``[title, [sentences]]``), one paragraph per title with its
    sentences concatenated as given (they carry their own spacing); a paragraph supports when
    ``supporting_facts`` names its title."""
    support = {str(fact[0]) for fact in row.get("supporting_facts") or []
               if isinstance(fact, list) and fact}
    out = []
    for entry in row.get("context") or []:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
            continue  # not [title, [sentences]]
        title = str(entry[0] or "")
        out.append((title, "".join(str(s) for s in entry[1]), title in support))
    return out


# the two layouts: rows with these keys, what they are called, the benchmark that reads them
_HOTPOT_LAYOUTS = {
    HOTPOT_OFFICIAL: (("_id", "context"), "HotpotQA's official JSON (_id, question, context)"),
    HOTPOT_CORPUS: (("question_id", "contexts"), "IRCoT-style HotpotQA JSONL "
                    "(question_id, question_text, contexts)"),
}


def _hotpot_rows(path: Path, benchmark: str) -> list[dict[str, Any]]:
    """The rows of a HotpotQA file in ``benchmark``'s layout; a file in the other layout, or in
    neither, is one ValueError naming the file and the benchmark that reads it."""
    rows = read_records(path)
    first = rows[0] if rows else {}
    for name, (keys, what) in _HOTPOT_LAYOUTS.items():
        if any(k in first for k in keys):
            if name != benchmark:
                raise ValueError(f"{path} is {what}: read it with --benchmark {name}")
            return rows
    raise ValueError(f"{path} is not {_HOTPOT_LAYOUTS[benchmark][1]}, which --benchmark "
                     f"{benchmark} reads")


def _hotpot_docs(
    rows: list[dict[str, Any]], paragraphs: Paragraphs
) -> dict[tuple[str, str], dict[str, str]]:
    """Each distinct (title, paragraph) as a corpus document, in order of first appearance:
    the Wikipedia URL of its title, or a pseudo URL for a second paragraph of one title."""
    docs: dict[tuple[str, str], dict[str, str]] = {}
    titles: set[str] = set()
    for row in rows:
        for title, text, _ in paragraphs(row):
            if (title, text) in docs or not text:
                continue
            doc_id = "hp-" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:12]
            url = wikipedia_url(title) if title and title not in titles else pseudo_url(
                HOTPOT_CORPUS, doc_id)
            titles.add(title)
            docs[(title, text)] = {"id": doc_id, "title": title, "url": url, "text": text}
    return docs


def _gold_urls(
    row: dict[str, Any], paragraphs: Paragraphs, docs: dict[tuple[str, str], dict[str, str]]
) -> list[str]:
    return [docs[(title, text)]["url"] for title, text, gold in paragraphs(row) if gold and text]


def load_hotpotqa(path: Path) -> list[EvalItem]:
    """IRCoT-style HotpotQA JSONL; ``meta['gold_urls']``: URLs of the supporting paragraphs."""
    rows = _hotpot_rows(path, HOTPOT_CORPUS)
    docs = _hotpot_docs(rows, _ircot_paragraphs)
    items = []
    for i, r in enumerate(rows, 1):
        answers = [s for a in r.get("answers_objects") or [] for s in a.get("spans") or []]
        items.append(_item(r.get("question_id") or i, r.get("question_text"), answers,
                           gold_urls=_gold_urls(r, _ircot_paragraphs, docs)))
    return items


def load_hotpotqa_official(path: Path) -> list[EvalItem]:
    """HotpotQA as published: a JSON list of ``_id, question, answer, type, level,
    supporting_facts, context``; ids are the ``_id`` s; ``meta``: ``type`` (bridge /
    comparison), ``level`` and ``gold_urls`` (the supporting paragraphs). The test set has no
    answers: its items load, and score nothing."""
    rows = _hotpot_rows(path, HOTPOT_OFFICIAL)
    docs = _hotpot_docs(rows, _official_paragraphs)
    items = []
    for i, r in enumerate(rows, 1):
        meta = {k: str(r[k]) for k in ("type", "level") if r.get(k) is not None}
        items.append(_item(r.get("_id") or i, r.get("question"), [r.get("answer")],
                           gold_urls=_gold_urls(r, _official_paragraphs, docs), **meta))
    unanswered = sum(not item.answers for item in items)
    if unanswered:
        log.warning("%s: %d question(s) without an answer (the test set?): they cannot score",
                    path, unanswered)
    return items


def hotpotqa_corpus(path: Path) -> Iterator[dict[str, str]]:
    """The paragraphs of an IRCoT-style HotpotQA file as corpus rows ``id,title,url,text``."""
    yield from _hotpot_docs(_hotpot_rows(path, HOTPOT_CORPUS), _ircot_paragraphs).values()


def hotpotqa_official_corpus(path: Path) -> Iterator[dict[str, str]]:
    """The distractor corpus of an official HotpotQA file: every paragraph of its contexts."""
    yield from _hotpot_docs(_hotpot_rows(path, HOTPOT_OFFICIAL), _official_paragraphs).values()


def write_corpus(rows: Iterable[dict[str, str]], out: Path) -> int:
    """Write corpus rows as JSONL (atomically); returns how many."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    tmp.replace(out)
    return n


# ---------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class BenchmarkSpec:
    """A benchmark: its loader, its grader (a name in ``judges.GRADERS``), whether its data
    is encrypted (then no question or answer text is written), and its corpus, if any."""

    name: str
    loader: Callable[[Path], list[EvalItem]]
    grader: str
    encrypted: bool = False
    corpus: Callable[[Path], Iterable[dict[str, str]]] | None = None
    description: str = ""


BENCHMARKS: dict[str, BenchmarkSpec] = {
    s.name: s
    for s in (
        BenchmarkSpec("browsecomp", load_browsecomp, "browsecomp", True,
                      description="BrowseComp (OpenAI), encrypted CSV"),
        BenchmarkSpec("browsecomp-zh", load_browsecomp_zh, "browsecomp", True,
                      description="BrowseComp-ZH, encrypted xlsx/CSV"),
        BenchmarkSpec("xbench-deepsearch", load_xbench, "xbench", True,
                      description="xbench-DeepSearch, encrypted CSV"),
        BenchmarkSpec("gaia", load_gaia, "gaia", description="GAIA, all items"),
        BenchmarkSpec("gaia-text", lambda p: load_gaia(p, text_only=True), "gaia",
                      description="GAIA, items without an attached file"),
        BenchmarkSpec("hle", load_hle, "hle", description="Humanity's Last Exam, all items"),
        BenchmarkSpec("hle-text", lambda p: load_hle(p, text_only=True), "hle",
                      description="Humanity's Last Exam, items without an image"),
        BenchmarkSpec("deepsearchqa", load_deepsearchqa, "deepsearchqa",
                      description="DeepSearchQA CSV (Single / Set answers)"),
        BenchmarkSpec("frames", load_frames, "qa", description="FRAMES CSV"),
        BenchmarkSpec("simpleqa", load_simpleqa, "qa", description="SimpleQA CSV"),
        BenchmarkSpec("jsonl", load_generic, "qa", description="generic JSONL"),
        BenchmarkSpec("parquet", load_generic, "qa", description="generic parquet / RL format"),
        BenchmarkSpec(HOTPOT_CORPUS, load_hotpotqa, "hotpotqa", corpus=hotpotqa_corpus,
                      description="HotpotQA with its paragraphs as the local corpus (offline)"),
        BenchmarkSpec(HOTPOT_OFFICIAL, load_hotpotqa_official, "hotpotqa",
                      corpus=hotpotqa_official_corpus,
                      description="HotpotQA's official JSON, its contexts as the local corpus"),
    )
}


def get_spec(name: str) -> BenchmarkSpec:
    spec = BENCHMARKS.get(name.strip().lower())
    if spec is None:
        raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    return spec


def load(name: str, path: str | Path) -> list[EvalItem]:
    """The items of benchmark ``name`` from the local file ``path`` (nothing is downloaded)."""
    items = get_spec(name).loader(Path(path))
    seen: set[str] = set()
    unique = []
    for item in items:
        if item.id in seen:
            log.warning("%s: duplicate id %r skipped", name, item.id)
            continue
        seen.add(item.id)
        unique.append(item)
    return unique


__all__ = [
    "BENCHMARKS",
    "BenchmarkSpec",
    "EvalItem",
    "browsecomp_key",
    "decrypt",
    "encrypt",
    "get_spec",
    "hotpotqa_corpus",
    "hotpotqa_official_corpus",
    "load",
    "read_records",
    "write_corpus",
    "xbench_key",
]
