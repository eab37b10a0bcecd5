"""Fit the span reader's weights (``drvenus.small.reader``) on a recipe build's questions.

For every question of the build (``DATA/questions.jsonl``: the ``train-sft`` and ``train-rl``
splits to fit, the build's own ``dev`` split to choose the regularisation; never the natural
sets we report on), the embedded corpus is searched with the question's own content words, as
the agent's first search does, and every candidate span of the response gets its features.
A question whose gold answer (or an alias) is among its candidates is a training list; the
weights maximise the softmax probability of the gold spans in each list (listwise logistic
regression, L2, full-batch gradient descent with Adam). Comparison and yes/no questions are
left out: their answers are the choices the question names, not a span.

Writes the weights to ``--out`` (default: the package's ``drvenus/small/reader.json``) and
prints top-1 and top-3 accuracy on the dev lists and on all dev questions.

Usage: python recipes/embedded/train_reader.py --data DATA [--out FILE] [--limit N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np

from drvenus.config import load_settings
from drvenus.protocol.state import tool_response_text
from drvenus.protocol.tools import ToolCall
from drvenus.small.reader import FEATURES, candidates
from drvenus.small.spans import answer_shape, question_query
from drvenus.stack import build_toolbox

PACKAGE_WEIGHTS = Path(__file__).resolve().parents[2] / "src/drvenus/small/reader.json"
SKIP_SOURCES = ("wiki-comparison", "wiki-yes-no")
L2_GRID = (1e-4, 1e-3, 1e-2)


def norm(text: str) -> str:
    """Lower case, accents folded, punctuation dropped, articles dropped."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c))
    words = re.sub(r"[^\w\s]", " ", text.lower()).split()
    return " ".join(w for w in words if w not in ("a", "an", "the"))


def golds(row: dict[str, Any]) -> set[str]:
    answers = row["answer"] if isinstance(row["answer"], list) else [row["answer"]]
    return {norm(a) for a in [*answers, *(row.get("aliases") or [])] if norm(a)}


async def searched(rows: list[dict[str, Any]]) -> list[str]:
    toolbox = build_toolbox(load_settings())
    try:
        return [tool_response_text(await toolbox.call(
            ToolCall("search", {"query": [question_query(r["question"])]}))) for r in rows]
    finally:
        await toolbox.aclose()


def lists(rows: list[dict[str, Any]], texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(features, gold mask) of each question, the shaped candidates only (as ranked)."""
    out = []
    for row, text in zip(rows, texts, strict=True):
        shape = answer_shape(row["question"])
        found = candidates([text], row["question"])
        shaped = [c for c in found if shape.first(c[0][0])] or found
        if not shaped:
            out.append((np.zeros((0, len(FEATURES))), np.zeros(0, bool)))
            continue
        x = np.array([[f[k] for k in FEATURES] for _, f in shaped])
        gold = golds(row)
        y = np.array([norm(" ".join(w)) in gold for w, _ in shaped])
        out.append((x, y))
    return out


def fit(data: list[tuple[np.ndarray, np.ndarray]], l2: float, steps: int = 400) -> np.ndarray:
    usable = [(x, y) for x, y in data if y.any()]
    w = np.zeros(len(FEATURES))
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    lr, b1, b2 = 0.05, 0.9, 0.999
    for t in range(1, steps + 1):
        grad = l2 * w * len(usable)
        for x, y in usable:
            s = x @ w
            p = np.exp(s - s.max())
            p /= p.sum()
            q = y / y.sum()
            grad += x.T @ (p - q)
        grad /= len(usable)
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad**2
        w -= lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + 1e-8)
    return w


def accuracy(data: list[tuple[np.ndarray, np.ndarray]], w: np.ndarray, k: int) -> float:
    """Share of the lists whose gold is among the top k (a list without candidates: wrong)."""
    hits = 0
    for x, y in data:
        if len(y):
            top = np.argsort(-(x @ w), kind="stable")[:k]
            hits += bool(y[top].any())
    return hits / max(len(data), 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a recipe build (questions.jsonl)")
    p.add_argument("--out", type=Path, default=PACKAGE_WEIGHTS)
    p.add_argument("--limit", type=int, default=0, help="at most N questions per split")
    p.add_argument("--sources", default="wiki-described",
                   help="question sources to fit on, comma-separated ('' for all but the "
                        "comparison and yes/no ones)")
    args = p.parse_args()
    rows = [json.loads(line) for line in (args.data / "questions.jsonl").open()]
    rows = [r for r in rows if r.get("source") not in SKIP_SOURCES]
    if args.sources:
        rows = [r for r in rows if r.get("source") in args.sources.split(",")]
    train = [r for r in rows if r.get("split") in ("train-sft", "train-rl")]
    dev = [r for r in rows if r.get("split") == "dev"]
    if args.limit:
        train, dev = train[: args.limit], dev[: args.limit]
    train_lists = lists(train, asyncio.run(searched(train)))
    dev_lists = lists(dev, asyncio.run(searched(dev)))
    dev_with_gold = [d for d in dev_lists if d[1].any()]
    print(f"train: {len(train)} questions, {sum(d[1].any() for d in train_lists)} with the gold "
          f"among the candidates; dev: {len(dev)}, {len(dev_with_gold)}")
    best = None
    for l2 in L2_GRID:
        w = fit(train_lists, l2)
        acc = accuracy(dev_with_gold, w, 1)
        print(f"l2 {l2:g}: dev top-1 {acc:.3f} (of the lists with the gold)")
        if best is None or acc > best[0]:
            best = (acc, l2, w)
    assert best is not None
    _, l2, w = best
    print(f"chosen l2 {l2:g}: dev top-1 {accuracy(dev_with_gold, w, 1):.3f}, top-3 "
          f"{accuracy(dev_with_gold, w, 3):.3f} of the lists with the gold; of all dev "
          f"questions top-1 {accuracy(dev_lists, w, 1):.3f}, top-3 {accuracy(dev_lists, w, 3):.3f}")
    weights = {name: round(float(x), 4) for name, x in zip(FEATURES, w, strict=True)}
    args.out.write_text(json.dumps({
        "features": weights,
        "fitted_on": f"{args.data.name}: {len(train)} train-sft/train-rl questions, "
                     f"l2 {l2:g} chosen on {len(dev)} build dev questions",
    }, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
