"""Reading-comprehension data for the neural reader (``drvenus.small.neural``), built offline.

Two sources, both over the built-in corpus's *training* articles only (the reserved bucket,
which every dev and test question comes from, never appears, not even as a distractor):

- ``cloze``: questions made from the leads' own sentences (cloze translation, as in
  unsupervised QA): a sentence's span (a year, a number, a name, the object after a
  preposition) is replaced in place by the question phrase its form asks for ("in what year",
  "how many X", "who", "where", "what"), the article's title in the sentence by how someone
  who does not know it describes it (its short description: "the order of carnivorous
  marsupials"), parentheses dropped, and the clause cut around the answer. The result reads
  like the questions people ask about a described subject ("... was the first of how many Sikh
  Gurus?").
- ``recipe``: the recipe's own single-hop questions (``drvenus.recipe.questions.single_hop``,
  every phrasing, named and described subjects).

Each question is paired with its article's text (the answer's character offset given) and,
for one in three, with another training article's text that does not hold the answer (a
no-answer example: the reader learns to score a text that cannot answer below one that can).

SQuAD-style data from the web (CC BY-SA) can be mixed in with ``--squad FILE`` (the official
``train-v1.1.json`` from :data:`SQUAD_URL`; its SHA-256 goes into the manifest, and
``--squad-sha256`` checks it): the machine the shipped reader was trained on could not fetch
it, so the shipped reader was trained without it.

With ``--search N``, N of the questions are also read the way the agent reads them: the
question's first search (its content words) over the built-in index, one example per result
(title and snippet) of a training article, with the answer's offset where that text holds it
and none where it does not (results of reserved articles are dropped).

Usage: python recipes/embedded/reader_data.py --out DIR [--search N] [--squad FILE] [--seed 0]
Writes DIR/train.jsonl, DIR/dev.jsonl (1,000 held-out cloze/recipe questions of other
articles) and DIR/manifest.json (counts, sources and the SHA-256 of each file).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from drvenus.recipe.articles import Article, load_articles
from drvenus.recipe.questions import described_mention, lower_words, single_hop
from drvenus.text import split_sentences

SQUAD_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/train-v1.1.json"

_PAREN = re.compile(r"\s*\([^()]*\)")
_YEAR = re.compile(r"\b(1[0-9]{3}|20[0-2][0-9])\b(?!\s*BC)")
_NUMBER = re.compile(r"\b(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?:\s+(million|billion|thousand))?"
                     r"(?:\s+([a-z]+s)\b)?")
_NAME = re.compile(r"\b((?:[A-Z][\w'\-]+)(?:\s+(?:of|the|de|von|van|and|la|du|al)?\s*"
                   r"[A-Z][\w'\-]+){0,4})")
_OBJECT = re.compile(r"\b(of|by|as|from|into|with|called|named|for)\s+((?:[a-z][a-z\-]+\s+){0,2}"
                     r"[a-z][a-z\-]{2,})(?=[,.;:]|\s+(?:and|or|which|that|in|on)\b)")
_PLACE_PREP = ("in", "at", "near", "from", "into", "on")
_STOP_START = frozenset({"the", "a", "an", "its", "his", "her", "their", "this", "these", "it"})


def sentence_spans(sentence: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, wh-phrase) of each span of ``sentence`` a question could ask for."""
    for m in _YEAR.finditer(sentence):
        yield m.start(1), m.end(1), "in what year"
    for m in _NUMBER.finditer(sentence):
        if _YEAR.fullmatch(m.group(1)):
            continue
        end = m.end(2) if m.group(2) else m.end(1)
        yield m.start(1), end, "how many" if m.group(3) else "what number"
    for m in _NAME.finditer(sentence):
        if m.start(1) == 0:
            continue
        before = sentence[: m.start(1)].split()
        prev = before[-1].lower() if before else ""
        wh = "where" if prev in _PLACE_PREP else ("whom" if prev == "by" else "what")
        if wh == "what" and len(m.group(1).split()) >= 2 and prev not in ("the", "of"):
            wh = "who"
        start = m.start(1)
        if wh == "where":
            start = m.start(1) - len(prev) - 1  # "in Paris" -> "where"
            yield start, m.end(1), wh
            continue
        yield start, m.end(1), wh
    for m in _OBJECT.finditer(sentence):
        words = m.group(2).split()
        if words[0] in _STOP_START:
            continue
        yield m.start(2), m.end(2), "what"


def _subject(article: Article, lower: frozenset[str], rng: random.Random) -> str:
    """How the question names the article's subject: described mostly, named sometimes."""
    described = described_mention(article, lower)
    if described is not None and rng.random() < 0.75:
        return described
    return article.title


def _answer_of(sentence: str, start: int, end: int, wh: str) -> str:
    text = sentence[start:end]
    if wh == "where":
        text = text.split(" ", 1)[1]
    return text


def cloze_questions(article: Article, lower: frozenset[str], rng: random.Random,
                    per_article: int) -> Iterator[dict[str, Any]]:
    """Up to ``per_article`` cloze questions of ``article``'s lead sentences."""
    lead = article.extract or article.text
    sentences = [s for s in split_sentences(" ".join(lead.split())) if 40 <= len(s) <= 400]
    options = []
    for sentence in sentences:
        plain = _PAREN.sub("", sentence)
        for start, end, wh in sentence_spans(plain):
            answer = _answer_of(plain, start, end, wh)
            if answer.lower() in article.title.lower() or len(answer.split()) > 6:
                continue
            options.append((plain, start, end, wh, answer))
    rng.shuffle(options)
    seen: set[str] = set()
    for plain, start, end, wh, answer in options[: per_article * 2]:
        if answer in seen or len(seen) >= per_article:
            continue
        question = _cloze_question(plain, start, end, wh, article, lower, rng)
        if question is None or article.text.find(answer) < 0:
            continue
        seen.add(answer)
        yield {"question": question, "answer": answer, "title": article.title,
               "source": "cloze"}


def _cloze_question(plain: str, start: int, end: int, wh: str, article: Article,
                    lower: frozenset[str], rng: random.Random) -> str | None:
    left, right = plain[:start], plain[end:]
    # cut the clause: keep at most 18 words before and 10 after the question phrase
    lw, rw = left.split(), right.split()
    if len(lw) > 18:
        lw = lw[-18:]
    if len(rw) > 10:
        rw = rw[:10]
    text = re.sub(r"\s+([,;:])", r"\1", " ".join([*lw, wh, *rw])).rstrip(" ,;:.")
    subject = _subject(article, lower, rng)
    title = article.title
    if title in text:
        text = text.replace(title, subject, 1)
    elif re.match(r"^(It|He|She|They|This|The [a-z]+)\b", text):
        text = re.sub(r"^(It|He|She|They|This|The [a-z]+)\b", subject, text, count=1)
    elif rng.random() < 0.5:
        text = f"{text} ({subject})" if rng.random() < 0.3 else f"Of {subject}: {text}"
    if len(text.split()) < 5:
        return None
    text = text[0].upper() + text[1:]
    return text + "?"


def recipe_questions(articles: list[Article], rng: random.Random) -> Iterator[dict[str, Any]]:
    for q in single_hop(articles, rng, per_article=3, described=0.7):
        answers = q.answer if isinstance(q.answer, list) else [q.answer]
        yield {"question": q.question, "answer": str(answers[0]), "title": q.gold_titles[0],
               "source": "recipe"}


def squad_rows(data: bytes) -> Iterator[dict[str, Any]]:
    """SQuAD v1.1 rows (question, context, answer offset)."""
    for entry in json.loads(data)["data"]:
        for para in entry["paragraphs"]:
            for qa in para["qas"]:
                ans = qa["answers"][0]
                yield {"question": qa["question"], "context": para["context"],
                       "answer": ans["text"], "answer_start": ans["answer_start"],
                       "title": entry["title"], "source": "squad"}


def attach(row: dict[str, Any], by_title: dict[str, Article], pool: list[Article],
           rng: random.Random) -> list[dict[str, Any]]:
    """The question with its article's text (answer offset), and sometimes a no-answer text."""
    art = by_title[row["title"]]
    at = art.text.find(row["answer"])
    if at < 0:
        return []
    out = [{**row, "context": art.text, "answer_start": at}]
    if rng.random() < 1 / 3:
        other = rng.choice(pool)
        if other.title != art.title and row["answer"].lower() not in other.text.lower():
            out.append({**row, "context": other.text, "answer_start": -1, "answer": "",
                        "title": other.title})
    return out


async def _search_all(queries: list[str]) -> list[list[tuple[str, str]]]:
    from drvenus.config import load_settings
    from drvenus.protocol.render import parse_search_body
    from drvenus.protocol.tools import ToolCall
    from drvenus.stack import build_toolbox

    toolbox = build_toolbox(load_settings())
    out = []
    try:
        for query in queries:
            body = await toolbox.call(ToolCall("search", {"query": [query]}))
            out.append([(h["title"], f"{h['title']}\n{h['snippet']}")
                        for e in parse_search_body(body) or [] for h in e["web_page_info_list"]])
    finally:
        await toolbox.aclose()
    return out


def searched(rows: list[dict[str, Any]], limit: int, rng: random.Random) -> list[dict[str, Any]]:
    """Examples as the agent reads them: each question's first search (its own content words),
    one example per result that is a training article: the answer's offset where the result's
    text holds it, no answer where it does not. Reserved articles' results are left out."""
    import asyncio

    from drvenus.recipe.articles import is_reserved
    from drvenus.small.spans import question_query

    picked = rng.sample(rows, min(limit, len(rows)))
    results = asyncio.run(_search_all([question_query(r["question"]) for r in picked]))
    out = []
    for row, hits in zip(picked, results, strict=True):
        for title, text in hits:
            if is_reserved(title):
                continue
            at = text.find(row["answer"])
            out.append({**row, "context": text, "answer_start": at,
                        "answer": row["answer"] if at >= 0 else "", "title": title,
                        "source": row["source"] + "-search"})
    return out


def build(seed: int, per_article: int, squad: bytes | None,
          search: int = 0) -> tuple[list, list, Counter]:
    rng = random.Random(seed)
    articles = [a for a in load_articles() if not a.reserved]
    lower = lower_words(articles)
    by_title = {a.title: a for a in articles}
    titles = sorted(by_title)
    rng.shuffle(titles)
    dev_titles = set(titles[:300])
    rows: list[dict[str, Any]] = []
    for art in articles:
        rows.extend(cloze_questions(art, lower, rng, per_article))
    rows.extend(recipe_questions(articles, rng))
    train, dev = [], []
    for row in rows:
        for ex in attach(row, by_title, articles, rng):
            (dev if row["title"] in dev_titles else train).append(ex)
    dev = [r for r in dev if r["answer_start"] >= 0][:1000]
    if search:
        train.extend(searched([r for r in rows if r["title"] not in dev_titles], search, rng))
    if squad is not None:
        train.extend(squad_rows(squad))
    rng.shuffle(train)
    return train, dev, Counter(r["source"] for r in train)


def write(path: Path, rows: list[dict[str, Any]]) -> str:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return hashlib.sha256(data).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-article", type=int, default=4)
    ap.add_argument("--squad", type=Path, default=None)
    ap.add_argument("--search", type=int, default=0,
                    help="also N questions read from their first search's results")
    ap.add_argument("--squad-sha256", default=None, help="refuse a --squad file without it")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    squad, squad_sha = None, None
    if args.squad is not None:
        squad = args.squad.read_bytes()
        squad_sha = hashlib.sha256(squad).hexdigest()
        if args.squad_sha256 and squad_sha != args.squad_sha256:
            raise SystemExit(f"{args.squad}: SHA-256 {squad_sha}, expected {args.squad_sha256}")
    train, dev, sources = build(args.seed, args.per_article, squad, args.search)
    manifest = {
        "train": {"rows": len(train), "sha256": write(args.out / "train.jsonl", train),
                  "sources": dict(sources)},
        "dev": {"rows": len(dev), "sha256": write(args.out / "dev.jsonl", dev)},
        "seed": args.seed, "per_article": args.per_article, "search": args.search,
        "squad": None if squad is None else {"url": SQUAD_URL, "sha256": squad_sha},
        "reserved_articles": 0,
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main()
