"""Which of two things came first: the years the texts read give each of them.

A question that names two things and asks which came first ("Who was born first, Erika Jayne
or Marco Da Silva?", "Which band formed earlier, Lit or Adorable?", "Which film is newer, ...")
is answered by the texts, not by a guess: each choice's own passage (the result titled with its
name, else the passage that starts with it) gives a year, and the earlier (or later) one wins.
The year is the one its title gives ("Battle of Guam (1944)"), the year a person died for "died
first", else the passage's first year: a lead sentence gives a person's birth year and a work's
year first ("Ed Wood is a 1994 American ... film", "Reynolds v. Sims, 377 U.S. 533 (1964)").
Measured against the year after a word of the kind asked ("founded", "released"): that word
often comes after the year that matters ("a 2015 film ... produced by ... in 1987"). When a
choice has no passage, no year, or the two years are the same, nothing is chosen and the model
chooses as before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

Order = Literal["early", "late"]

# "which came first", "born earlier", "is older"; never "the first" ("Who was the first
# Russian composer to ...": a superlative about one thing, not an order of two)
_EARLY = re.compile(r"\b(?:first|earlier|earliest|older|oldest|sooner)\b", re.I)
_LATE = re.compile(r"\b(?:more recent(?:ly)?|most recent(?:ly)?|later|latest|younger|youngest|"
                   r"newer|newest)\b", re.I)
_NOT_ORDER = re.compile(r"\bthe (?:first|earliest|oldest|latest|newest|youngest)\b", re.I)
_DIED = re.compile(r"\b(?:died|death|passed away)\b", re.I)
# a year: 1000-2099, or a number of at most four digits with its era ("305 BC", "AD 43")
_YEAR = re.compile(r"\b(?:AD\s+(\d{1,4})|(\d{1,4})\s*(BCE?|AD|CE)\b|(1\d{3}|20\d{2}))\b")
CUE_REACH = 80  # characters after "died" or "founded" that its year may be found in
# a question about when things began, and the words a passage gives that year by: the year
# after them comes before the passage's first year ("Recife ... 1.6 million in 2022 ...
# founded in 1537")
_FOUNDING_ASKED = re.compile(r"\b(?:found(?:ed|ing)?|establish(?:ed)?|set up|formed|"
                             r"incorporated|began operating)\b", re.I)
_FOUNDED = re.compile(r"\b(?:found(?:ed|ing)|establish(?:ed|ment)|set up|formed|"
                      r"incorporated|chartered)\b", re.I)
_TITLE_END = re.compile(r"\s*\([^()]*\)\s*$")


def order_asked(question: str) -> Order | None:
    """"early" when ``question`` asks which came first (first, earlier, older, ...), "late"
    when it asks which came last (more recently, later, younger, newer, ...), else None."""
    if _NOT_ORDER.search(question):
        return None
    early, late = _EARLY.search(question), _LATE.search(question)
    if bool(early) == bool(late):
        return None
    return "early" if early else "late"


def _name(text: str) -> str:
    """A name as compared: quotes, a possessive, a leading "the" and a title's bracketed end
    dropped, case and spacing folded."""
    text = _TITLE_END.sub("", text).strip().strip("\"'“”‘’").strip()
    text = re.sub(r"(?:'s|’s|s')$", "", text)
    text = " ".join(text.split()).casefold()
    return text[4:] if text.startswith("the ") else text


def choice_passages(choice: str, parts: Sequence[str]) -> list[str]:
    """The passages of ``parts`` about ``choice``, best first: those whose first line (a
    result's title) is its name, then those whose title holds its name or is held in it
    ("Apple Inc." for Apple, after the fruit's "Apple"), then those that start with it."""
    name = _name(choice)
    if not name:
        return []
    titled = [(p, _name(p.split("\n", 1)[0])) for p in parts]
    exact = [p for p, title in titled if title == name]
    within = [p for p, title in titled if title and "\n" in p and title != name
              and (name in title or title in name)]
    starts = [p for p in parts
              if _name(p.split("\n", 1)[-1][:len(choice) + 8]).startswith(name)]
    return list(dict.fromkeys(exact + within + starts))


def choice_passage(choice: str, parts: Sequence[str]) -> str | None:
    """The best of :func:`choice_passages`, or None when there is none."""
    found = choice_passages(choice, parts)
    return found[0] if found else None


def choice_year(choice: str, parts: Sequence[str], question: str) -> int | None:
    """The year the first of ``choice``'s passages that gives one gives it
    (:func:`choice_passages`, :func:`passage_year`); None when none does."""
    for passage in choice_passages(choice, parts):
        year = passage_year(passage, question)
        if year is not None:
            return year
    return None


def _years(text: str) -> list[tuple[int, int]]:
    """(offset, year) of each year in ``text``; a year before the common era is negative."""
    out = []
    for m in _YEAR.finditer(text):
        if m.group(1):
            out.append((m.start(), int(m.group(1))))
        elif m.group(2):
            year = int(m.group(2))
            out.append((m.start(), -year if m.group(3).upper().startswith("B") else year))
        else:
            out.append((m.start(), int(m.group(4))))
    return out


def passage_year(passage: str, question: str) -> int | None:
    """The year ``passage`` gives its subject: the year its title line ends with in brackets
    ("Battle of Guam (1944)", "Hamlet (1948 film)"); for a question about who "died" first,
    the second year of the first bracket of its text that holds two ("(25 January 1882 – 28
    March 1941)"), else the year after "died"; for one about what was founded (set up,
    formed, ...) first, the year just after "founded" (established, formed, ...) in its text
    when there is one; else the first year of its text. None when it gives none."""
    title, body = passage.split("\n", 1) if "\n" in passage else ("", passage)
    if _DIED.search(question):
        for bracket in re.finditer(r"\(([^()]*)\)", body):
            years = _years(bracket.group(1))
            if len(years) >= 2:
                return years[1][1]
        died = re.search(r"\bdied\b", body, re.I)
        after = _years(body[died.end():died.end() + CUE_REACH]) if died else []
        return after[0][1] if after else None
    end = _TITLE_END.search(title)
    dated = _years(end.group()) if end else []
    if dated:
        return dated[0][1]
    if _FOUNDING_ASKED.search(question):
        for cue in _FOUNDED.finditer(body):
            near = _years(body[cue.end():cue.end() + CUE_REACH])
            if near:
                return near[0][1]
    years = _years(body)
    return years[0][1] if years else None


def choose_by_year(question: str, choices: Sequence[str], parts: Sequence[str]) -> str | None:
    """The one of two ``choices`` that came first (or last, as ``question`` asks,
    :func:`order_asked`) by the years their passages among ``parts`` give
    (:func:`choice_year`); None when the question asks no order, or a choice has no year, or
    the years are the same."""
    order = order_asked(question)
    if order is None or len(choices) != 2:
        return None
    years = []
    for choice in choices:
        year = choice_year(choice, parts, question)
        if year is None:
            return None
        years.append(year)
    if years[0] == years[1]:
        return None
    first = 0 if years[0] < years[1] else 1
    return choices[first if order == "early" else 1 - first]


def missing_choice(question: str, choices: Sequence[str], parts: Sequence[str]) -> str | None:
    """The first of two ``choices`` that ``parts`` give no year for, when ``question`` asks
    which came first or last: the name to search for next, without quotes or a possessive
    ("Maria Theresa" for "Maria Theresa's"); None when both have one or no order is asked."""
    if order_asked(question) is None or len(choices) != 2:
        return None
    for choice in choices:
        if choice_year(choice, parts, question) is None:
            name = re.sub(r"(?:'s|’s)$", "", choice.strip().strip("\"'“”‘’").strip())
            return name or None
    return None


__all__ = ["CUE_REACH", "choice_passage", "choice_passages", "choice_year", "choose_by_year",
           "missing_choice", "order_asked", "passage_year"]
