"""Dense article vectors beside a BM25 index, fused with its ranking (hybrid retrieval).

Questions written the way people ask describe their subject ("the river that flows through
the capital of Hungary") in words its article may not use; BM25 needs those words. A small
embedding model closes part of that gap: WordLlama's default model (``pip install
'drvenus[dense]'``: a 256-dimension token embedding table of 16 MB inside the ``wordllama``
wheel, mean-pooled; no download).
On the built-in corpus it puts the gold article first for 69% of natural single-hop questions
against BM25's 52%, and fused with BM25 in the top 5 for 95% against 84%
(``benchmarks/bench_hybrid_recall.py``, docs/BENCHMARKS.md).

The vectors of an index are built once, from its stored pages in (segment, doc) order, and
saved in the index folder (``dense/``: float16 vectors, the pages' addresses, the model's
hash); an index never changes once built, so they stay valid. A search fuses the BM25 top
:data:`DEPTH` with the dense top :data:`DEPTH` by reciprocal rank (:func:`fuse`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tantivy

from drvenus.corpus.documents import CorpusError
from drvenus.corpus.impact import row_chunks

log = logging.getLogger(__name__)

DEPTH = 100  # each ranking's depth for the fusion
RRF_K = 60  # reciprocal rank fusion's constant (Cormack et al., 2009)
DENSE_DIR = "dense"
_VECTORS = "vectors.npy"
_ADDRESSES = "addresses.npy"
_META = "meta.json"
_CHUNK = 2048  # pages read and embedded at a time while building
MODEL_NAME = "wordllama-l2_supercat-256"
INSTALL_HINT = "pip install 'drvenus[dense]'"
Address = tuple[int, int]  # (segment, doc): a page's place in its tantivy index


class DenseUnavailable(CorpusError):
    """The embedding model is not installed (or its files are missing)."""


def dense_available() -> bool:
    """Whether the embedding model's package is installed."""
    import importlib.util

    return importlib.util.find_spec("wordllama") is not None


def use_hybrid(retrieval: str | None, corpus: object | None) -> bool:
    """Whether an index build prepares hybrid search (its article vectors): ``retrieval``
    ("bm25" / "hybrid") when given, else for the built-in corpus (``corpus`` None), which the
    embedded preset searches hybrid (:func:`drvenus.small.preset.hybrid_search`), when the
    model's package is installed."""
    if retrieval is not None:
        return retrieval == "hybrid"
    return corpus is None and dense_available()


_MODEL_LOCK = threading.Lock()
_MODEL: Any = None


def load_model() -> Any:
    """WordLlama's default model, read from the files inside its wheel (never downloaded)."""
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is not None:
            return _MODEL
        try:
            import wordllama
            from wordllama import WordLlama
        except ImportError as exc:
            raise DenseUnavailable(f"hybrid search needs wordllama ({INSTALL_HINT})") from exc
        folder = Path(wordllama.__file__).parent
        try:
            # the package looks for its tokenizer under a folder name it does not ship; its
            # cache layout (weights/, tokenizers/) is the wheel's own, so the wheel serves
            _MODEL = WordLlama.load(cache_dir=folder, disable_download=True)
        except (FileNotFoundError, OSError) as exc:
            raise DenseUnavailable(f"wordllama's model files are missing: {exc}") from exc
        return _MODEL


def model_hash() -> str:
    """sha256 of the model's weights file: vectors built with another model are rebuilt."""
    import wordllama

    weights = sorted((Path(wordllama.__file__).parent / "weights").glob("*.safetensors"))
    digest = hashlib.sha256()
    for path in weights:
        digest.update(path.name.encode())
        digest.update(str(path.stat().st_size).encode())
        with path.open("rb") as f:
            digest.update(f.read(1 << 20))  # the header and the first rows identify it
    return digest.hexdigest()[:16]


def embed(texts: Sequence[str]) -> Any:
    """Unit-length float32 vectors of ``texts``."""
    import numpy as np

    model = load_model()
    return np.asarray(model.embed(list(texts), norm=True, batch_size=256), dtype=np.float32)


def fuse(rankings: Sequence[Sequence[Address]], k: int) -> list[tuple[Address, float]]:
    """The top ``k`` (address, score) of reciprocal rank fusion: each ranking adds
    ``1 / (RRF_K + rank)``; ties keep the order of first appearance."""
    score: dict[Address, float] = {}
    for ranking in rankings:
        for rank, address in enumerate(ranking, start=1):
            score[address] = score.get(address, 0.0) + 1.0 / (RRF_K + rank)
    order = {a: i for i, a in enumerate(score)}
    best = sorted(score, key=lambda a: (-score[a], order[a]))[:k]
    return [(a, score[a]) for a in best]


class DenseVectors:
    """The article vectors of one index (see the module doc). Thread-safe."""

    def __init__(self, vectors: Any, addresses: Any) -> None:
        self.vectors = vectors  # (n, dim) float16, unit length
        self.addresses = addresses  # (n, 2) int64

    def __len__(self) -> int:
        return len(self.addresses)

    def top(self, query: str, k: int = DEPTH) -> list[Address]:
        """The addresses of the ``k`` pages nearest to ``query`` (cosine), best first."""
        import numpy as np

        n = len(self.addresses)
        if n == 0 or k <= 0 or not query.strip():
            return []
        q = embed([query])[0].astype(np.float16)
        scores = (self.vectors @ q).astype(np.float32)
        k = min(k, n)
        best = np.argpartition(-scores, k - 1)[:k]
        best = best[np.argsort(-scores[best], kind="stable")]
        return [(int(s), int(d)) for s, d in self.addresses[best]]

    @classmethod
    def open(cls, index_path: Path, searcher: tantivy.Searcher,
             schema: tantivy.Schema) -> DenseVectors:
        """The vectors saved beside the index, built first when missing or stale."""
        import numpy as np

        folder = Path(index_path) / DENSE_DIR
        meta = _read_meta(folder)
        expected = {"model": MODEL_NAME, "model_hash": model_hash(),
                    "doc_count": searcher.num_docs}
        if meta is not None and all(meta.get(key) == value for key, value in expected.items()):
            try:
                return cls(np.load(folder / _VECTORS), np.load(folder / _ADDRESSES))
            except (OSError, ValueError) as exc:
                log.warning("%s: unreadable dense vectors (%s); building them again", folder, exc)
        vectors, addresses, seconds = _build(searcher, schema)
        _save(folder, vectors, addresses, {**expected, "seconds": round(seconds, 3)})
        return cls(vectors, addresses)


def vectors_saved(index_path: Path) -> bool:
    """Whether the index folder holds article vectors (built by an earlier open)."""
    return (Path(index_path) / DENSE_DIR / _META).is_file()


def _build(searcher: tantivy.Searcher, schema: tantivy.Schema) -> tuple[Any, Any, float]:
    """Every stored page's vector ("title. text") and address, in row order."""
    import numpy as np

    start = time.perf_counter()
    n = searcher.num_docs
    parts: list[Any] = []
    places: list[Address] = []
    for addresses in row_chunks(searcher, schema, n, _CHUNK):
        texts = []
        for address in addresses:
            doc = searcher.doc(address)
            texts.append(f"{doc.get_first('title') or ''}. {doc.get_first('text') or ''}")
            places.append((address.segment_ord, address.doc))
        if texts:
            parts.append(embed(texts).astype(np.float16))
    vectors = np.concatenate(parts) if parts else np.zeros((0, 1), np.float16)
    addresses = np.asarray(places, dtype=np.int64).reshape(-1, 2)
    seconds = time.perf_counter() - start
    log.info("dense vectors: %d pages in %.1fs", len(addresses), seconds)
    return vectors, addresses, seconds


def _save(folder: Path, vectors: Any, addresses: Any, meta: dict[str, Any]) -> None:
    """Written beside the index, each file replaced atomically, the metadata last."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    for name, array in ((_VECTORS, vectors), (_ADDRESSES, addresses)):
        tmp = folder / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        with tmp.open("wb") as f:
            np.save(f, array)
        os.replace(tmp, folder / name)
    tmp = folder / f".{_META}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_text(json.dumps(meta, indent=2), encoding="utf-8")
    os.replace(tmp, folder / _META)


def _read_meta(folder: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((folder / _META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


__all__ = ["DEPTH", "DenseUnavailable", "DenseVectors", "dense_available", "embed", "fuse",
           "load_model", "use_hybrid"]
