"""The hand-written natural question sets (recipes/embedded/natural/): what the README's and
docs/BENCHMARKS.md's embedded-agent numbers are measured on. Each row must be answerable from
the built-in corpus, over reserved articles only (the bucket rule), with dev and test disjoint."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from drvenus.recipe.articles import is_reserved, load_articles

NATURAL = Path(__file__).resolve().parents[1] / "recipes" / "embedded" / "natural"
KINDS = {"single-hop": 1, "two-hop": 2, "comparison": 2, "yes-no": 2}
MINIMUM = {"single-hop": 80, "two-hop": 25, "comparison": 12, "yes-no": 12}
SHARES = {"dev": "01234567", "test": "89abcdef"}


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _contains(haystack: str, needle: str) -> bool:
    """``needle`` in ``haystack`` as whole words (case and spacing aside)."""
    return re.search(rf"(?<!\w){re.escape(_norm(needle))}(?!\w)", _norm(haystack)) is not None


@pytest.fixture(scope="module")
def extracts() -> dict[str, str]:
    return {a.title: a.extract for a in load_articles()}


@pytest.mark.parametrize("split", sorted(SHARES))
def test_natural_set_rows(split: str, extracts: dict[str, str]) -> None:
    rows = [json.loads(line) for line in
            (NATURAL / f"{split}.jsonl").read_text(encoding="utf-8").splitlines() if line]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    counts = {k: sum(r["kind"] == k for r in rows) for k in KINDS}
    assert all(counts[k] >= n for k, n in MINIMUM.items()), counts
    for r in rows:
        assert r["kind"] in KINDS and r["hops"] == KINDS[r["kind"]], r["id"]
        titles, answers, question = r["gold_titles"], r["answer"], r["question"]
        assert answers and all(isinstance(a, str) and a.strip() for a in answers), r["id"]
        for title in titles:
            assert title in extracts, (r["id"], title)
            assert is_reserved(title), (r["id"], title)
            assert hashlib.sha256(title.encode()).hexdigest()[1] in SHARES[split], r["id"]
        if r["kind"] == "yes-no":
            assert answers in (["yes"], ["no"]), r["id"]
            continue
        if r["kind"] != "comparison":
            # the answer is read in the (last) gold article, and the question names neither
            assert _norm(answers[0]) in _norm(extracts[titles[-1]]), r["id"]
            assert not _contains(question, titles[0]), r["id"]
        assert not any(_contains(question, a) for a in answers) or r["kind"] == "comparison", \
            r["id"]


def test_dev_and_test_are_disjoint() -> None:
    seen = {}
    for split in SHARES:
        rows = (NATURAL / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        seen[split] = {t for line in rows if line for t in json.loads(line)["gold_titles"]}
    assert not seen["dev"] & seen["test"]
