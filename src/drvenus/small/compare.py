"""Which of two things came first, or has more: the years and amounts the texts read give.

A question that names two things and asks which came first ("Who was born first, Erika Jayne
or Marco Da Silva?", "Which band formed earlier, Lit or Adorable?", "Which film is newer, ...")
is answered by the texts, not by a guess: each choice's own passage (the result titled with its
name, else one whose title holds it, else one that starts with it) gives a year, and the
earlier (or later) one wins. The year is the one its title gives ("Battle of Guam (1944)"), the
year a person died for "died first", the year after "founded" for what was founded first, else
the passage's first year: a lead sentence gives a person's birth year and a work's year first
("Ed Wood is a 1994 American ... film", "Reynolds v. Sims, 377 U.S. 533 (1964)"). Measured
against the year after a word of any kind asked ("released"): that word often comes after the
year that matters ("a 2015 film ... produced by ... in 1987").

A question of which has more (or fewer) of something ("Which city has more inhabitants, ...",
"Which country is larger in area, ...", "Which river is longer, ...", "Which genus has more
species, ...") is answered the same way by the amount each passage gives: a population (the
number after "population", or before "inhabitants" / "people" / "residents"), an area, a
length or a height (a number with its unit, in one unit), or a count (the number before the
noun counted: "about 40 species"). When a choice has no passage or no value, or the two are
the same, nothing is chosen and the model chooses as before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Order = Literal["early", "late"]
Measure = Literal["year", "population", "area", "length", "height", "count"]

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


def _holds(text: str, words: str) -> bool:
    """Whether ``words`` are whole words of ``text`` ("lit" is not in "literature")."""
    return f" {words} " in f" {text} "


def choice_passages(choice: str, parts: Sequence[str]) -> list[str]:
    """The passages of ``parts`` about ``choice``, best first: those whose first line (a
    result's title) is its name, then those whose title holds its name as whole words ("Apple
    Inc." for Apple, after the fruit's "Apple") or is a name of two words or more that it holds
    ("White Zombie" for "Rob Zombie's band White Zombie", never "Manila" for "the Battle of
    Manila"), then those that start with it."""
    name = _name(choice)
    if not name:
        return []
    titled = [(p, _name(p.split("\n", 1)[0])) for p in parts]
    exact = [p for p, title in titled if title == name]
    within = [p for p, title in titled if title and "\n" in p and title != name
              and (_holds(title, name) or (len(title.split()) > 1 and _holds(name, title)))]
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


# which has more (or fewer): the direction, what is not an amount a passage states, and what
# is measured
_MORE = re.compile(r"\b(?:more|larger|bigger|greater|longer|taller|higher|busier|most|largest|"
                   r"biggest|greatest|longest|tallest|highest)\b", re.I)
_LESS = re.compile(r"\b(?:fewer|less|smaller|shorter|lower|fewest|least|smallest|shortest|"
                   r"lowest)\b", re.I)
_NO_AMOUNT = re.compile(r"\b(?:ratio|often|frequently|career|life|for (?:longer|shorter)|ranking|"
                        r"lasted|lasting|reigned|ruled|served|lived|different|important|"
                        r"popular|famous|successful|known)\b", re.I)
_POPULATION_ASKED = re.compile(r"\b(?:people|inhabitants|residents|population|populous)\b", re.I)
_COUNTED = re.compile(r"\b(?:more|fewer|most|fewest)\s+(?:[\w'’-]+\s+){0,3}?([a-z]+s)\b")
_LENGTH_ASKED = re.compile(r"\b(?:longer|shorter|longest|shortest)\b", re.I)
_HEIGHT_ASKED = re.compile(r"\b(?:taller|tallest|higher|highest)\b", re.I)
_SIZE_ASKED = re.compile(r"\b(?:area|larger|bigger|smaller|largest|biggest|smallest)\b", re.I)
_NUMBER = r"(\d[\d,]*(?:\.\d+)?)(?:\s*(million|billion|thousand))?"
_SCALE = {"thousand": 1e3, "million": 1e6, "billion": 1e9}
_WORD_NUMBERS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
# units and what one of them is in the unit compared (km², km, m)
_AREA_UNITS = ((r"km2|km²|km\^2|square kilomet(?:re|er)s?|sq\.? ?km", 1.0),
               (r"sq\.? ?mi|square miles?|mi2|mi²", 2.58999), (r"hectares?|ha", 0.01),
               (r"acres?", 0.00404686))
_LENGTH_UNITS = ((r"km|kilomet(?:re|er)s?", 1.0), (r"mi|miles?", 1.60934))
_HEIGHT_UNITS = ((r"m|metres?|meters?", 1.0), (r"ft|feet|foot", 0.3048))
AMOUNT_REACH = 60  # characters after "population" that its number may be found in


@dataclass(frozen=True)
class Asked:
    """What a question compares two things by: ``measure`` (a year, a population, an area, a
    length, a height or a ``count`` of ``noun``), and whether the larger value wins."""

    measure: Measure
    most: bool
    noun: str = ""


def compared(question: str) -> Asked | None:
    """What ``question`` compares its two things by (:class:`Asked`), or None: an order (first,
    earlier, more recently, ...: :func:`order_asked`), else an amount with a direction (more,
    larger, longer, taller, fewer, ...) and a measure the texts state as a number; not how
    often, how well known or for how long."""
    order = order_asked(question)
    if order is not None:
        return Asked("year", order == "late")
    more, less = _MORE.search(question), _LESS.search(question)
    if bool(more) == bool(less) or _NO_AMOUNT.search(question):
        return None
    most = bool(more)
    if _POPULATION_ASKED.search(question):
        return Asked("population", most)
    counted = _COUNTED.search(question)
    if counted:
        return Asked("count", most, counted.group(1).lower())
    if re.search(r"\barea\b", question, re.I):
        return Asked("area", most)
    if _LENGTH_ASKED.search(question):
        return Asked("length", most)
    if _HEIGHT_ASKED.search(question):
        return Asked("height", most)
    if _SIZE_ASKED.search(question):
        return Asked("area", most)
    return None


def _number(digits: str, scale: str | None) -> float:
    return float(digits.replace(",", "")) * _SCALE.get((scale or "").lower(), 1.0)


def _measured(body: str, units: tuple[tuple[str, float], ...]) -> float | None:
    """The first number of ``body`` with one of ``units`` after it, in the first unit."""
    found: list[tuple[int, float]] = []
    for unit, factor in units:
        pattern = _NUMBER + r"\s*(?:" + unit + r")(?![\w²2^])"
        for m in re.finditer(pattern, body, re.I):
            found.append((m.start(), _number(m.group(1), m.group(2)) * factor))
    return min(found)[1] if found else None


def _population(body: str) -> float | None:
    """The number after "population" (within :data:`AMOUNT_REACH` characters, not a year), or
    before "inhabitants", "people" or "residents", whichever the text gives first."""
    found: list[tuple[int, float]] = []
    for cue in re.finditer(r"\bpopulation\b", body, re.I):
        for m in re.finditer(_NUMBER, body[cue.end():cue.end() + AMOUNT_REACH]):
            value = _number(m.group(1), m.group(2))
            if m.group(2) or "," in m.group(1) or not 1000 <= value <= 2099:
                found.append((cue.start(), value))
                break
    for m in re.finditer(_NUMBER + r"\s+(?:[a-z]+\s+)?(?:inhabitants|people|residents)\b",
                         body, re.I):
        found.append((m.start(), _number(m.group(1), m.group(2))))
    return min(found)[1] if found else None


def _count(body: str, noun: str) -> float | None:
    """The number (in digits, or a word up to twenty) at most two words before ``noun`` (or
    its singular) in ``body``."""
    stem = re.escape(noun[:-1] if noun.endswith("s") and not noun.endswith("ies") else noun)
    pattern = (r"\b(\d[\d,]*|" + "|".join(_WORD_NUMBERS) + r")\s+(?:[\w-]+\s+){0,2}?"
               + stem + r"\w*\b")
    m = re.search(pattern, body, re.I)
    if m is None:
        return None
    word = m.group(1).lower()
    return float(_WORD_NUMBERS[word]) if word in _WORD_NUMBERS else float(word.replace(",", ""))


def passage_value(passage: str, question: str, asked: Asked) -> float | None:
    """The value ``passage`` gives its subject for what ``asked`` measures (a year:
    :func:`passage_year`); None when it gives none. Its title line is not read."""
    if asked.measure == "year":
        year = passage_year(passage, question)
        return None if year is None else float(year)
    body = passage.split("\n", 1)[1] if "\n" in passage else passage
    if asked.measure == "population":
        return _population(body)
    if asked.measure == "area":
        return _measured(body, _AREA_UNITS)
    if asked.measure == "length":
        return _measured(body, _LENGTH_UNITS)
    if asked.measure == "height":
        return _measured(body, _HEIGHT_UNITS)
    return _count(body, asked.noun)


def choice_value(choice: str, parts: Sequence[str], question: str,
                 asked: Asked) -> float | None:
    """The value the first of ``choice``'s passages that gives one gives it
    (:func:`choice_passages`, :func:`passage_value`); None when none does."""
    for passage in choice_passages(choice, parts):
        value = passage_value(passage, question, asked)
        if value is not None:
            return value
    return None


def choose(question: str, choices: Sequence[str], parts: Sequence[str]) -> str | None:
    """The one of two ``choices`` that came first (or last), or has more (or less), as
    ``question`` asks (:func:`compared`), by the values their passages among ``parts`` give
    (:func:`choice_value`); None when the question compares by nothing the texts state, or a
    choice has no value, or the values are the same."""
    asked = compared(question)
    if asked is None or len(choices) != 2:
        return None
    values = []
    for choice in choices:
        value = choice_value(choice, parts, question, asked)
        if value is None:
            return None
        values.append(value)
    if values[0] == values[1]:
        return None
    larger = 0 if values[0] > values[1] else 1
    return choices[larger if asked.most else 1 - larger]


def choose_by_year(question: str, choices: Sequence[str], parts: Sequence[str]) -> str | None:
    """:func:`choose` for a question of which came first or last only (None for any other)."""
    return choose(question, choices, parts) if order_asked(question) else None


def missing_choice(question: str, choices: Sequence[str], parts: Sequence[str]) -> str | None:
    """The first of two ``choices`` that ``parts`` give no value for, when ``question``
    compares them by one (:func:`compared`): the name to search for next, without quotes or a
    possessive ("Maria Theresa" for "Maria Theresa's"); None when both have one or nothing
    the texts state is compared."""
    asked = compared(question)
    if asked is None or len(choices) != 2:
        return None
    for choice in choices:
        if choice_value(choice, parts, question, asked) is None:
            name = re.sub(r"(?:'s|’s)$", "", choice.strip().strip("\"'“”‘’").strip())
            return name or None
    return None


__all__ = ["AMOUNT_REACH", "CUE_REACH", "Asked", "choice_passage", "choice_passages",
           "choice_value", "choice_year", "choose", "choose_by_year", "compared",
           "missing_choice", "order_asked", "passage_value", "passage_year"]
