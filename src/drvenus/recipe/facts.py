"""Facts read from the lead of a summary with fixed patterns, each with question templates.

A :class:`Fact` is ``(subject article, kind, answer span)``: the answer is a short span that
occurs verbatim in the article text. Each kind has several question phrasings (``{s}``: how the
subject is named) and, where the answer is itself an entity, a *bridge phrase* ("the author of
{s}") so that a second article's fact can be asked about it (two-hop questions). No model is
involved; the patterns favour precision over recall.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from drvenus.grading.match import normalize_answer
from drvenus.recipe.articles import Article
from drvenus.text import DEMONYMS, split_sentences

# --- words ------------------------------------------------------------------------------------

_MONTHS = (
    "January|February|March|April|May|June|July|August|September|October|November|December"
)
_NUMBER_WORDS = "two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|\\d{1,4}"
_CONNECTORS = frozenset("of the de del della da di du von van der den la le al bin y".split())
_HONORIFICS = frozenset(
    "Sir Dame President Professor Prof. Dr. Dr King Queen Emperor Empress General Lord Lady "
    "Pope Prince Princess Captain Admiral".split()
)
_WORD = re.compile(r"[\w'’.\-]+")
_CAPITAL = re.compile(r"[A-ZÀ-ÖØ-Þ]")

MAX_ANSWER_WORDS = 6
MAX_SUBJECT_CHARS = 50


def _is_cap(word: str) -> bool:
    return bool(_CAPITAL.match(word))


def name_after(text: str, pos: int, *, skip: int = 4) -> str | None:
    """The proper name that starts at or shortly after ``pos``: up to ``skip`` leading words
    that are articles, lower-case words or demonyms are passed over ("by the French composer
    Georges Bizet" -> "Georges Bizet"); then the run of capitalised words (with connectors such
    as "of" or "von" inside it). None when no capitalised word comes first."""
    words = list(_WORD.finditer(text, pos))
    i = 0
    while i < len(words) and i < skip:
        w = words[i].group()
        gap = text[(words[i - 1].end() if i else pos) : words[i].start()]
        if any(c in gap for c in ".;:()\"") and i:
            return None
        if w.lower() in ("the", "a", "an") or (not _is_cap(w) and w.isalpha()):
            i += 1
            continue
        demonym = w in DEMONYMS or w.split("-")[0] in DEMONYMS
        if demonym and i + 1 < len(words) and not _is_cap(words[i + 1].group()):
            i += 1
            continue
        break
    if i >= len(words) or not _is_cap(words[i].group()):
        return None
    start = words[i].start()
    end = words[i].end()
    j = i + 1
    count = 1
    while j < len(words) and count < MAX_ANSWER_WORDS:
        gap = text[words[j - 1].end() : words[j].start()]
        if gap not in (" ", "\u00a0") or words[j - 1].group().endswith((".", ",")):
            if not (words[j - 1].group().endswith(".") and len(words[j - 1].group()) <= 3):
                break
        w = words[j].group()
        if _is_cap(w):
            end = words[j].end()
            count += 1
            j += 1
            continue
        if w in _CONNECTORS and j + 1 < len(words) and _is_cap(words[j + 1].group()):
            j += 1
            continue
        break
    name = text[start:end].rstrip(".,'’-")
    if name.endswith("'s"):
        name = name[:-2]
    head, _, rest = name.partition(" ")
    if head in _HONORIFICS and rest:
        name = rest
    return name or None


def sentences(text: str) -> list[str]:
    """Sentences of a text (not split after initials such as "Charles M. Schulz")."""
    return [s for para in text.split("\n") for s in split_sentences(" ".join(para.split()))]


def contains_answer(haystack: str, answer: str) -> bool:
    """``answer`` occurs in ``haystack`` as whole words after SQuAD normalisation."""
    a = normalize_answer(answer)
    if not a:
        return False
    return f" {a} " in f" {normalize_answer(haystack)} "


def find_span(haystack: str, answer: str) -> str | None:
    """The verbatim occurrence of ``answer`` in ``haystack`` (case-insensitive), or None."""
    words = answer.split()
    if not words:
        return None
    pattern = r"\s+".join(re.escape(w) for w in words)
    m = re.search(rf"(?<!\w){pattern}(?!\w)", haystack, re.IGNORECASE)
    return m.group() if m else None


# --- facts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    """A fact about ``subject`` (an article): the question ``kind``, the verbatim ``answer``,
    the phrasings (``{s}``: the subject), and a bridge phrase when the answer is an entity."""

    subject: str
    kind: str
    answer: str
    templates: tuple[str, ...]
    evidence: str
    category: str
    bridge: str | None = None  # e.g. "the author of {s}"
    aliases: tuple[str, ...] = field(default_factory=tuple)
    phrase_ok: bool = True  # the templates read well with a noun phrase as the subject
    phrase_templates: tuple[str, ...] = ()  # for a noun-phrase subject, when ``templates`` are not

    def templates_for_phrase(self) -> tuple[str, ...]:
        return self.phrase_templates or (self.templates if self.phrase_ok else ())


_CREATOR_VERBS = {
    "written": (("Who wrote {s}?", "Who is the author of {s}?", "{s} was written by whom?",
                 "Which writer wrote {s}?"), "the author of {s}"),
    "directed": (("Who directed {s}?", "Who was the director of {s}?",
                  "{s} was directed by whom?", "Which filmmaker directed {s}?"),
                 "the director of {s}"),
    "composed": (("Who composed {s}?", "Who is the composer of {s}?",
                  "{s} was composed by whom?"), "the composer of {s}"),
    "painted": (("Who painted {s}?", "Which artist painted {s}?", "{s} was painted by whom?"),
                "the painter of {s}"),
    "designed": (("Who designed {s}?", "{s} was designed by whom?",
                  "Who was the designer of {s}?"), "the designer of {s}"),
    "developed": (("Who developed {s}?", "{s} was developed by whom?",
                   "Which person or company developed {s}?"), "the developer of {s}"),
    "invented": (("Who invented {s}?", "{s} was invented by whom?",
                  "Who is credited with inventing {s}?"), "the inventor of {s}"),
    "discovered": (("Who discovered {s}?", "{s} was discovered by whom?",
                    "Who is credited with the discovery of {s}?"), "the discoverer of {s}"),
    "founded": (("Who founded {s}?", "{s} was founded by whom?", "Who was the founder of {s}?"),
                "the founder of {s}"),
    "created": (("Who created {s}?", "{s} was created by whom?", "Who is the creator of {s}?"),
                "the creator of {s}"),
    "illustrated": (("Who illustrated {s}?", "{s} was illustrated by whom?"),
                    "the illustrator of {s}"),
    "produced": (("Who produced {s}?", "{s} was produced by whom?"), "the producer of {s}"),
    "sculpted": (("Who sculpted {s}?", "Which artist sculpted {s}?"), "the sculptor of {s}"),
}
_CREATOR = re.compile(r"\b(" + "|".join(_CREATOR_VERBS) + r")\s+by\s+")

_YEAR_VERBS = {
    "founded": "founded", "established": "established", "formed": "formed",
    "opened": "opened", "completed": "completed", "built": "built", "launched": "launched",
    "first published": "first published", "published": "published", "released": "released",
    "discovered": "discovered", "incorporated": "incorporated", "premiered": "premiered",
    "first performed": "first performed", "adopted": "adopted", "ratified": "ratified",
}
_YEAR_EVENT = re.compile(
    r"\b(" + "|".join(sorted(_YEAR_VERBS, key=len, reverse=True)) + r")\s+(?:on|in)\s+"
    r"(?:[A-Za-z0-9]+\s+){0,3}?(\d{4})\b(?!\s*BC)"
)
_HISTORY_VERBS = {
    "fought": "In what year was {s} fought?",
    "took place": "In what year did {s} take place?",
    "occurred": "In what year did {s} occur?",
    "signed": "In what year was {s} signed?",
    "began": "In what year did {s} begin?",
    "started": "In what year did {s} start?",
    "ended": "In what year did {s} end?",
}
_HISTORY = re.compile(
    r"\b(fought|took place|occurred|signed|began|started|ended)\b(?:[^.;]{0,40}?)\b(\d{4})\b"
    r"(?!\s*BC)"
)
_LIFE = re.compile(r"\((?:c\.\s*)?(\d{3,4})\s*[–-]\s*(?:c\.\s*)?(\d{3,4})\)")
_BORN_YEAR = re.compile(r"\(born (\d{4})\)")
_BORN_DATE = re.compile(
    rf"\bborn\s+(?:on\s+)?((?:\d{{1,2}} (?:{_MONTHS}) \d{{4}})"
    rf"|(?:(?:{_MONTHS}) \d{{1,2}}, \d{{4}}))"
)
_BORN_IN = re.compile(r"\bborn\b([^.;()]{0,45}?)\bin\s+")
_IS_A = re.compile(r"\b(is|was) (?:a|an) ")
_CAPITAL_IS = re.compile(
    r"\b[Ii]ts capital(?: city)?(?: and (?:largest|most populous) city)?,? is\s+"
    r"|\b[Tt]he capital(?: city)?(?: and (?:largest|most populous) city)?(?: of the [a-z]+)?"
    r",? is\s+"
    r"|\bwith (?:its|the) capital (?:at|in)\s+"
)
_CAPITAL_OF = re.compile(r"^\S.*? is the capital(?: city)?(?: and [a-z ]{0,30}? city)? of\s+")
_DESC_PLACE = re.compile(
    r"^([A-Z][a-z]+(?: [a-z]+){0,3}) (in|of) ([A-Z][^,]*?)(?:, ([A-Z][^,]*))?$"
)
_DESC_WORK = re.compile(r"^(\d{4}) ([a-z][a-z \-]{2,40}?)(?: by (.+))?$")
_POPULATION = re.compile(
    r"\bpopulation of (?:about |approximately |around |over |more than |nearly |roughly |almost "
    r"|some |just over |just under |an estimated |)(\d[\d,.]*(?:[ \u00a0](?:million|billion))?)"
)
_NOT_OWN_POPULATION = re.compile(
    r"metropolitan|urban|greater|agglomeration|region|area|diaspora|speakers|worldwide", re.I
)
_EVENT_TITLE = re.compile(
    r"\b(war|battle|revolution|treaty|siege|crisis|rebellion|revolt|conflict|massacre|uprising|"
    r"campaign|crusade|invasion|coup|genocide|disaster|attack|attacks|conquest|reformation|"
    r"restoration|partition|pandemic|famine|election|olympics|landing|bombing|riots?|strike|"
    r"crash|expedition|conference|congress|council|accord|agreement|declaration|act)\b", re.I
)
_ATOMIC = re.compile(r"\batomic number (\d{1,3})\b")
_SYMBOL = re.compile(r"\bsymbol ([A-Z][a-z]?)\b")
_NAMED_AFTER = re.compile(r"\bnamed (?:after|for)\s+")
_AKA = re.compile(r"\balso (?:known|called|referred to) as\s+")
_LOCATED = re.compile(r"\b(?:is |was )?located (?:in|on)\s+")
_COUNT = re.compile(
    rf"\b(?:consists of|comprises|is made up of|is divided into) ({_NUMBER_WORDS}) "
    r"([a-z]+s)\b"
)
_RELEASED_NOUNS = ("film", "album", "single", "song", "video game", "game", "series", "EP")
_PUBLISHED_NOUNS = ("novel", "book", "poem", "novella", "play", "essay", "comic", "manga")

CATEGORY = {
    "People": "people", "Geography": "places", "History": "history", "Arts": "arts",
    "Physical sciences": "science", "Biology and health sciences": "science",
    "Mathematics": "science", "Technology": "technology",
}


def _category(article: Article) -> str:
    return CATEGORY.get(article.topic, "general")


def _first(text: str, n: int = 2) -> str:
    return " ".join(sentences(text)[:n])


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


@dataclass(frozen=True)
class _Lead:
    """What the patterns read of one article: its title, description, first two sentences
    (``lead``) and first sentence, its category, and whether it is about a person."""

    article: Article
    title: str
    desc: str
    lead: str
    first: str
    cat: str
    person: bool

    def fact(self, kind, answer, templates, evidence, bridge=None, aliases=(),  # type: ignore[no-untyped-def]
             phrase_ok=True, phrase_templates=()) -> Fact:
        return Fact(self.title, kind, answer.strip(), tuple(templates), evidence, self.cat,
                    bridge, tuple(aliases), phrase_ok, tuple(phrase_templates))


def _lead_of(article: Article) -> _Lead:
    desc, first = article.description, _first(article.extract, 1)
    life = _LIFE.search(desc)
    is_a = _IS_A.search(first)
    nat_word = first[is_a.end():].split(" ", 1)[0].split("-")[0] if is_a else ""
    person = article.topic == "People" or (life is not None and nat_word in DEMONYMS)
    return _Lead(article, article.title, desc, _first(article.extract, 2), first,
                 _category(article), person)


def _people_facts(c: _Lead) -> Iterator[Fact]:
    """Life years, birth date and place, nationality, occupation."""
    desc, lead, first, person, fact = c.desc, c.lead, c.first, c.person, c.fact
    life = _LIFE.search(desc) if person else None
    if life and "BC" not in desc:
        yield fact("birth_year", life.group(1),
                   ("In what year was {s} born?", "What year was {s} born in?",
                    "When was {s} born? Give the year.", "{s} was born in which year?"), desc)
        yield fact("death_year", life.group(2),
                   ("In what year did {s} die?", "When did {s} die? Give the year.",
                    "{s} died in which year?", "What year did {s} die in?"), desc)
    elif (born := _BORN_YEAR.search(desc)) is not None:
        yield fact("birth_year", born.group(1),
                   ("In what year was {s} born?", "What year was {s} born in?",
                    "{s} was born in which year?"), desc)
    if (m := _BORN_DATE.search(lead)) is not None:
        yield fact("birth_date", m.group(1),
                   ("On what date was {s} born?", "What is the date of birth of {s}?",
                    "When was {s} born? Give the full date."), lead)
    if person and (m := _BORN_IN.search(lead)) is not None:
        place = name_after(lead, m.end(), skip=1)
        if place and not re.match(rf"(?:{_MONTHS})\b", place):
            yield fact("birthplace", place,
                       ("Where was {s} born?", "In which place was {s} born?",
                        "What is the birthplace of {s}?"), lead, "the birthplace of {s}")
    if person and (m := _IS_A.search(first)) is not None:
        words = first[m.end():].split()
        if words:
            nat = words[0].split("-")[0].rstrip(",")
            tense = m.group(1)
            if nat in DEMONYMS and nat not in ("Ancient", "Roman"):
                yield fact("nationality", nat,
                           (f"What nationality {tense} {{s}}?",
                            "What was the nationality of {s}?" if tense == "was"
                            else "What is the nationality of {s}?",
                            f"{{s}} {tense} of which nationality?"), first)
                occ = []
                ended = False
                for w in words[1:4]:
                    bare = w.rstrip(",.;")
                    if not bare.isalpha() or not bare.islower():
                        break
                    if bare in ("and", "who", "known", "best", "from", "born", "of", "in"):
                        break
                    occ.append(bare)
                    if bare != w:
                        ended = True
                        break
                after = words[len(occ) + 1] if len(words) > len(occ) + 1 else ""
                if not ended and after in ("and", "or", "of"):
                    occ = []  # "film and theatre director": no clean span
                if occ and len(words) > len(occ) + 1:
                    yield fact("occupation", " ".join(occ),
                               (f"What {tense} {{s}}'s profession?",
                                f"What {'did' if tense == 'was' else 'does'} {{s}} do for "
                                "a living?",
                                f"What kind of work {'was' if tense == 'was' else 'is'} {{s}} "
                                "known for? Give the profession."), first, phrase_ok=False)


def _work_facts(c: _Lead) -> Iterator[Fact]:
    """Creators and the year of a work, event and history years."""
    t, desc, lead = c.title, c.desc, c.lead
    first, person, fact, article = c.first, c.person, c.fact, c.article
    for m in _CREATOR.finditer("" if person else first):
        who = name_after(first, m.end())
        if m.group(1) == "produced" and article.topic != "Arts":
            continue
        if who:
            templates, bridge = _CREATOR_VERBS[m.group(1)]
            yield fact(f"{m.group(1)}_by", who, templates, lead, bridge)
            break
    if (m := _DESC_WORK.match(desc)) is not None and len(m.group(2).split()) <= 3:
        year, noun, by = m.group(1), m.group(2).strip(), m.group(3)
        if any(n in noun for n in _RELEASED_NOUNS):
            verb = "released"
        elif any(n in noun for n in _PUBLISHED_NOUNS):
            verb = "published"
        elif "painting" in noun:
            verb = "painted"
        else:
            verb = "created"
        yield fact("work_year", year,
                   (f"In what year was the {noun} {{s}} {verb}?",
                    f"When was the {noun} {{s}} {verb}? Give the year.",
                    f"The {noun} {{s}} was {verb} in which year?"), desc, phrase_ok=False)
        if by:
            who = name_after(by, 0, skip=0)
            if who and not any(f.kind.endswith("_by") for f in ()):
                yield fact("creator", who,
                           (f"Who created the {noun} {{s}}?",
                            f"Who is the creator of the {noun} {{s}}?",
                            f"The {noun} {{s}} is the work of whom?"), desc,
                           f"the creator of the {noun} {{s}}", phrase_ok=False)
    if not person and (m := _YEAR_EVENT.search(lead)) is not None:
        verb = _YEAR_VERBS[m.group(1)]
        yield fact("event_year", m.group(2),
                   (f"In what year was {{s}} {verb}?", f"When was {{s}} {verb}? Give the year.",
                    f"{{s}} was {verb} in which year?"), lead, phrase_ok=False)
    if _EVENT_TITLE.search(t) and (m := _HISTORY.search(lead)) is not None:
        q = _HISTORY_VERBS[m.group(1)]
        yield fact("history_year", m.group(2), (q, q.replace("In what year", "What year")),
                   lead, phrase_ok=False)


def _place_facts(c: _Lead) -> Iterator[Fact]:
    """Capitals, the country or region of a place."""
    desc, lead, first, person, fact, article = c.desc, c.lead, c.first, c.person, c.fact, c.article
    if not person and (m := _CAPITAL_IS.search(lead)) is not None:
        city = name_after(lead, m.end(), skip=0)
        if city:
            yield fact("capital", city,
                       ("What is the capital of {s}?", "Which city is the capital of {s}?",
                        "Name the capital city of {s}."), lead, "the capital of {s}",
                       phrase_templates=("What is the capital of {s}?",
                                         "Which city is the capital of {s}?"))
    if (m := _CAPITAL_OF.search(first)) is not None:
        where = name_after(first, m.end(), skip=1)
        if where:
            yield fact("capital_of", where,
                       ("{s} is the capital of which country or region?",
                        "Of which country or region is {s} the capital?"), first,
                       "the country or region whose capital is {s}", phrase_ok=False)
    if (m := _DESC_PLACE.match(desc)) is not None and article.topic == "Geography":
        noun, prep, part1, part2 = m.group(1), m.group(2), m.group(3), m.group(4)
        noun_l = noun.lower()
        if _SUPERLATIVE.search(noun_l) and not noun_l.startswith("capital"):
            noun_l = "place"  # "Largest city in Scotland": not "the largest city Glasgow"
        the_s = "{s}" if noun_l == "place" else f"the {noun_l} {{s}}"
        if prep == "of" and noun_l.startswith("capital"):
            yield fact("capital_of", part1.strip(),
                       ("{s} is the capital of which country or region?",
                        "Of which country or region is {s} the capital?"), desc,
                       "the country or region whose capital is {s}", phrase_ok=False)
        elif prep == "in" and part2:
            yield fact("country", part2.strip(),
                       (f"{{s}} is a {noun_l} in which country?", "In which country is {s}?",
                        "{s} is located in which country?"), desc,
                       "the country where {s} is located", phrase_ok=False,
                       phrase_templates=("In which country is {s}?",
                                         "{s} lies in which country?"))
            yield fact("region", part1.strip(),
                       (f"{{s}} is a {noun_l} in which state or region?",
                        f"In which state or region is {the_s}?"), desc,
                       "the state or region where {s} is located", phrase_ok=False,
                       phrase_templates=("In which state or region is {s}?",))
        elif prep == "in":
            yield fact("located_in", part1.strip(),
                       (f"{{s}} is a {noun_l} in which part of the world?",
                        f"Where is {the_s}?"), desc,
                       "the country or region where {s} lies", phrase_ok=False)


def _population_facts(c: _Lead) -> Iterator[Fact]:
    """Population and location."""
    first, fact, article = c.first, c.fact, c.article
    pop_sentence = next((s for s in sentences(article.extract) if _POPULATION.search(s)
                         and not _NOT_OWN_POPULATION.search(s)), "")
    if (m := _POPULATION.search(pop_sentence)) is not None:
        num = m.group(1).rstrip(".,")
        if re.search(r"\d", num) and len(num) >= 3:
            sent = pop_sentence
            yield fact("population", num,
                       ("What is the population of {s}?",
                        "Roughly how many people live in {s}?",
                        "How many inhabitants does {s} have?"), sent)
    if (m := _LOCATED.search(first)) is not None:
        where = name_after(first, m.end(), skip=1)
        if where:
            yield fact("located", where,
                       ("Where is {s} located?", "In what place is {s} located?"), first,
                       phrase_ok=False)


def _science_facts(c: _Lead) -> Iterator[Fact]:
    """Atomic number and chemical symbol."""
    lead, fact, article = c.lead, c.fact, c.article
    if (m := _ATOMIC.search(lead)) is not None:
        yield fact("atomic_number", m.group(1),
                   ("What is the atomic number of {s}?", "{s} has which atomic number?",
                    "How many protons does an atom of {s} have?"), lead)
    if (m := _SYMBOL.search(lead)) is not None and "element" in article.text[:400]:
        yield fact("chemical_symbol", m.group(1),
                   ("What is the chemical symbol of {s}?",
                    "Which chemical symbol stands for {s}?"), lead, phrase_ok=False)


def _name_facts(c: _Lead) -> Iterator[Fact]:
    """Namesakes, other names, counts."""
    lead, first, fact = c.lead, c.first, c.fact
    if (m := _NAMED_AFTER.search(lead)) is not None:
        who = name_after(lead, m.end())
        if who:
            yield fact("named_after", who,
                       ("Who or what is {s} named after?", "{s} takes its name from whom?",
                        "After whom or what is {s} named?"), lead, phrase_ok=False)
    if (m := _AKA.search(first)) is not None:
        other = name_after(first, m.end(), skip=1)
        if other:
            yield fact("also_known_as", other,
                       ("What is another name for {s}?", "{s} is also known by what name?"),
                       first, phrase_ok=False)
    if (m := _COUNT.search(lead)) is not None:
        num, noun = m.group(1), m.group(2)
        if noun not in ("years", "times", "others", "ones", "hours", "minutes", "days") and \
                not noun.endswith(("ous", "ss", "is", "us")):
            yield fact("count", num,
                       (f"How many {noun} does {{s}} have?",
                        f"What is the number of {noun} of {{s}}?"), lead, phrase_ok=False)


def lead_facts(article: Article) -> Iterator[Fact]:
    """Every fact the patterns find in ``article``'s description and first sentences."""
    c = _lead_of(article)
    for part in (_people_facts, _work_facts, _place_facts, _population_facts, _science_facts,
                 _name_facts):
        yield from part(c)

__all__ = ["DEMONYMS", "Fact", "contains_answer", "find_span", "lead_facts", "name_after",
           "sentences"]


_ENTITY_KINDS_EXEMPT = frozenset({"nationality"})
_SUPERLATIVE = re.compile(r"\b(largest|most|second|third|oldest|biggest|highest|longest|"
                          r"smallest|best|main|major|former)\b")
_TRUNCATED = re.compile(r"(?:^|[\s.])[A-Z]\.?$|^[A-Z]\.[A-Z]")


# Facts anywhere in the lead, asked in place ("Polynesia is made up of more than how many
# islands?"): a sentence that starts with the subject (its title or a pronoun), cut after the
# clause that holds the answer, the answer replaced by the question phrase.
_PRONOUN_START = re.compile(r"^(?:It|He|She|They|This|These)\s+(?=[a-z])")
_IN_PLACE = (
    ("lead_year", re.compile(r"\b(in|since|until|from|by) (\d{4})\b(?!s|\s*BC|\s*BCE)"),
     lambda m: f"{m.group(1)} what year", 2),
    ("lead_count", re.compile(
        r"\b(\d[\d,.]*(?:\s(?:million|billion|thousand))?|two|three|four|five|six|seven|"
        r"eight|nine|ten|eleven|twelve)\s+((?:[a-z]+\s)?[a-z]{3,}s)\b"),
     lambda m: f"how many {m.group(2)}", 1),
    ("lead_agent", re.compile(r"\bby ((?:[A-Z][\w'’.-]+\s){0,3}[A-Z][\w'’-]+)"),
     lambda m: "by whom", 1),
)
_CLAUSE_END = re.compile(r"[,;:]\s|\s[-–—]\s")
_ASIDE = re.compile(r"\s*\([^()]*\)")  # "(125 km2)": left out of a question
_RANGE_END = re.compile(r"(?:\bto|\band|[-–])\s*$")  # "from 1.17 to 3.4": no single answer
_YEAR = re.compile(r"1\d{3}|20\d{2}")
MAX_IN_PLACE_CHARS = 180


def in_place_facts(article: Article) -> Iterator[Fact]:
    """Questions asked in the lead's own sentences, each fact of a sentence that starts with
    the article's subject (its title or a pronoun), any sentence of the lead: the answer (a
    year after in/since/until/from/by, a count before a plural noun, the agent after "by")
    replaced in place by what asks for it, the subject by ``{s}``."""
    t, cat = article.title, _category(article)
    for sentence in sentences(article.extract):
        if sentence.startswith(t + " "):
            rest = sentence[len(t):]
        elif (m := _PRONOUN_START.match(sentence)) is not None:
            rest = " " + sentence[m.end():]
        else:
            continue
        rest = _ASIDE.sub("", rest)
        for kind, pattern, ask, group in _IN_PLACE:
            m = pattern.search(rest)
            if m is None or _RANGE_END.search(rest, 0, m.start()):
                continue
            if kind == "lead_count" and _YEAR.fullmatch(m.group(1)):
                continue  # "from 2003 to 2014 as ...": a year, not a count
            end = _CLAUSE_END.search(rest, m.end())
            cut = rest[: end.start() if end else len(rest)].rstrip(" .;,")
            question = "{s}" + cut[: m.start()] + ask(m) + cut[m.end():] + "?"
            if len(question) > MAX_IN_PLACE_CHARS or "{" in cut or "}" in cut:
                continue
            yield Fact(t, kind, m.group(group), (question,), sentence, cat)


def article_facts(article: Article) -> list[Fact]:
    """:func:`lead_facts` kept only when usable: the answer occurs verbatim in the article
    text (the span is taken with its casing there), is short, starts with a letter or digit,
    is not the subject itself, and is not a bare demonym (except for nationality); one fact
    per kind."""
    out: dict[str, Fact] = {}
    for f in (*lead_facts(article), *in_place_facts(article)):
        if f.kind in out:
            continue
        span = find_span(article.text, f.answer)
        if span is None or not span[:1].isalnum() or len(span.split()) > MAX_ANSWER_WORDS:
            continue
        if normalize_answer(span) == normalize_answer(article.title):
            continue
        if f.kind not in _ENTITY_KINDS_EXEMPT and (
            span in DEMONYMS or span.split("-")[0] in DEMONYMS
        ):
            continue
        if "<" in span or ">" in span:
            continue
        if f.kind != "chemical_symbol" and _TRUNCATED.search(span):
            continue  # a name cut inside its initials ("C.N" for "C. N. Yang")
        if (f.kind.endswith("_by") or f.kind == "creator") and len(span.split()) == 1 and \
                span.endswith(("ians", "ans", "enes", "ists")):
            continue
        span = " ".join(span.split())
        out[f.kind] = Fact(f.subject, f.kind, span, f.templates, f.evidence, f.category,
                           f.bridge, f.aliases, f.phrase_ok, f.phrase_templates)
    return list(out.values())


# What a visit goal asks for, per kind ("{need} of {subject}").
NEED = {
    "birth_year": "birth year", "death_year": "year of death", "birth_date": "date of birth",
    "birthplace": "birthplace", "nationality": "nationality", "occupation": "profession",
    "written_by": "author", "directed_by": "director", "composed_by": "composer",
    "painted_by": "painter", "designed_by": "designer", "developed_by": "developer",
    "invented_by": "inventor", "discovered_by": "discoverer", "founded_by": "founder",
    "created_by": "creator", "illustrated_by": "illustrator", "produced_by": "producer",
    "sculpted_by": "sculptor", "creator": "creator", "work_year": "year",
    "event_year": "year", "history_year": "year", "capital": "capital",
    "capital_of": "country", "country": "country", "region": "state or region",
    "located_in": "location", "located": "location", "population": "population",
    "atomic_number": "atomic number", "chemical_symbol": "chemical symbol",
    "named_after": "namesake", "also_known_as": "other name", "count": "number",
    "lead_year": "year", "lead_count": "number", "lead_agent": "person",
}

# The question word each kind asks with (for the counts per kind of question).
WH = {
    "birth_year": "when", "death_year": "when", "birth_date": "when", "work_year": "when",
    "event_year": "when", "history_year": "when", "birthplace": "where", "located": "where",
    "located_in": "where", "region": "where", "country": "which", "capital_of": "which",
    "capital": "what", "nationality": "what", "occupation": "what", "chemical_symbol": "what",
    "atomic_number": "how many", "population": "how many", "count": "how many",
    "also_known_as": "what", "named_after": "who", "lead_year": "when", "lead_count": "how many",
    "lead_agent": "who",
}


def wh_of(kind: str) -> str:
    return WH.get(kind, "who" if kind.endswith("_by") or kind == "creator" else "what")
