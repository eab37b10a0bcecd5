"""Answer spans: the word sequences an answer may copy from what the agent has read.

A grounded answer grammar (:mod:`drvenus.small.grammar`) admits only answers that are
one contiguous span of words of these texts, with one space between words. Its vocabulary is
closed, so no answer can glue two words together ("AldousHuxley") or cut one ("ParkServ"):
every word of an answer is a whole word of a source, and the next word is one that follows it
there.

The sources are the tool responses of the conversation so far (search titles and snippets, not
URLs; visit frames as text), never the agent's own fixed notices, optionally the agent's own
thoughts (so that a forced final answer can still give the answer its thinking already
stated), and the question when there is nothing else.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from drvenus.protocol.state import TurnState
from drvenus.text import DEMONYMS, split_sentences

# Where a clause ends: sentence punctuation before a blank (not after a lone capital, an
# initial such as "J."), a comma/semicolon/colon before a blank, brackets, quotes, dashes
# between blanks, an en or em dash anywhere ("1928–2025": a range, two answers), a hyphen
# between digits, an ellipsis, a line break. A span never crosses a clause boundary.
_CLAUSE_BREAK = re.compile(
    r"(?<![\s.][A-Z])(?<!^[A-Z])[.!?](?=\s|$)|[,;:](?=\s|$)|[()\[\]{}\"\u201c\u201d|]"
    r"|\s[-\u2013\u2014]+\s|[\u2013\u2014]|(?<=\d)-(?=\d)|\.\.\.|\u2026|\n"
)
_STRIP = ".,;:!?'\u2018\u2019*_`"
_INITIALS = re.compile(r"(?:[A-Za-z]\.)+")
MAX_WORD_CHARS = 40


def _ok_word(word: str) -> bool:
    return (
        0 < len(word) <= MAX_WORD_CHARS
        and "<" not in word
        and ">" not in word
        and "://" not in word
        and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in word)
    )


def _echoes(word: str, question: frozenset[str]) -> bool:
    """``word`` (lower case) is a question word or a cut-off one ("dracul" of "dracula")."""
    if word in question:
        return True
    return len(word) >= 4 and any(q.startswith(word) for q in question)


def question_words(question: str) -> frozenset[str]:
    """The words of a question an answer should not repeat: those of three or more letters,
    lower-cased ("Who wrote the novel Dracula?": who, wrote, the, novel, dracula). The answer
    to a question is what the question does not already say."""
    return frozenset(
        w.lower() for clause in clause_words(question) for w in clause if len(w) >= 3
    )


def clean_word(raw: str) -> str:
    """A blank-separated piece of text as a word: outer punctuation stripped, except the stops
    of initials ("J." and "U.S." keep theirs)."""
    if _INITIALS.fullmatch(raw.rstrip(_STRIP.replace(".", ""))):
        return raw.strip(_STRIP.replace(".", ""))
    return raw.strip(_STRIP)


def clause_words(text: str, exclude: frozenset[str] = frozenset()) -> list[list[str]]:
    """``text`` as clauses (see ``_CLAUSE_BREAK``), each a list of words (blank-separated, outer
    punctuation stripped). A word that cannot be part of an answer (a URL, markup, a very long
    token, one of ``exclude`` in any case) ends the clause too."""
    clauses: list[list[str]] = []
    for piece in _CLAUSE_BREAK.split(text):
        words: list[str] = []
        for raw in piece.split():
            word = clean_word(raw)
            if _ok_word(word) and not _echoes(word.lower(), exclude):
                words.append(word)
            elif words:
                clauses.append(words)
                words = []
        if words:
            clauses.append(words)
    return clauses


def span_sources(state: TurnState, *, thinking: bool = False) -> tuple[str, ...]:
    """The texts an answer may quote: what the tool responses gave to read (not the fixed
    notices), and with ``thinking`` the agent's own thoughts; the question when there is
    nothing else."""
    texts = [t for t in state.sources(thoughts=thinking) if t.strip()]
    if not texts and state.question:
        texts = [state.question]
    return tuple(texts)


def weak_word(word: str) -> bool:
    """A short lower-case word (a, an, the, by, of, in, was), not a number ("ten"): no answer
    starts with one, and none is an answer of its own."""
    return len(word) <= 3 and word.islower() and word not in _NUMBER_WORDS


def spans_of(
    texts: Iterable[str], max_words: int, exclude: frozenset[str] = frozenset()
) -> list[tuple[str, ...]]:
    """Every distinct span of at most ``max_words`` words inside one clause of ``texts``, as
    the longest one from each start (their prefixes are spans too), without the words of
    ``exclude`` (see :func:`question_words`) and never starting with a short lower-case word."""
    if max_words < 1:
        raise ValueError("max_words must be at least 1")
    seen: set[tuple[str, ...]] = set()
    out: list[tuple[str, ...]] = []
    for text in texts:
        for words in clause_words(text, exclude):
            for i in range(len(words)):
                if weak_word(words[i]):
                    continue
                span = tuple(words[i : i + max_words])
                if span not in seen:
                    seen.add(span)
                    out.append(span)
    return out


_STEM_CHARS = 5  # words compared by their first letters ("killed" ~ "kills")
_LATEST = 2  # sentences of the latest reading always among the focus (a second hop's page)


def content_stems(text: str) -> set[str]:
    """The stems (first letters, lower case) of the words of three letters or more of
    ``text``: what two texts share when they speak of the same things."""
    return {w.lower()[:_STEM_CHARS] for w in re.findall(r"[^\W_]+", text) if len(w) >= 3}


def focus_sentences(texts: Sequence[str], question: str, k: int) -> tuple[str, ...]:
    """The ``k`` sentences (or title lines) of ``texts`` that share the most with
    ``question``'s content words, each shared word weighted by how few of the sentences hold
    it (a word every result repeats locates nothing); with them, the best two of the last
    text (the latest reading: a second hop's page) and the first two lines of each text (a
    search's top result's title and description: "(1815–1891)" shares no word with "born"),
    in reading order. The latest text's two are ranked on the question's words that the first
    text's top result does not name (the second hop: "bordered to the west" once "the country
    whose capital is Tegucigalpa" is known to be Honduras). The sentences an answer is in, most
    of the time: a small model picks
    its span among these instead of every line of five search results."""
    sentences: list[str] = []
    heads: set[int] = set()  # the first two lines of each text (a result's title, description)
    last = 0  # where the last text (the latest reading) starts
    for text in texts:
        last = len(sentences)
        heads.update((last, last + 1))
        sentences += [sentence for line in text.splitlines()
                      for sentence in split_sentences(line.strip())]
    wanted = content_stems(question_query(question))
    if len(sentences) <= k + len(heads) or not wanted:
        return tuple(sentences)
    stems = [content_stems(sentence) for sentence in sentences]
    held = {w: sum(w in st for st in stems) for w in wanted}
    n = len(sentences)

    def score(i: int, words: set[str]) -> float:
        return math.fsum(math.log(1 + n / held[w]) for w in words & stems[i])

    ranked = sorted(range(n), key=lambda i: (-score(i, wanted), i))
    # a second hop's reading answers what the first did not: the question's words that the
    # first reading's top result (its title and description) already names count for nothing
    rest = wanted - stems[0] - (stems[1] if len(stems) > 1 else set()) if last else wanted
    latest = sorted(range(last, n), key=lambda i: (-score(i, rest or wanted), i))
    best = set(ranked[:k]) | set(latest[:_LATEST])
    return tuple(s for i, s in enumerate(sentences) if i in best or i in heads)


# -- what the question asks for -------------------------------------------------------------

_AUX = ("is", "are", "was", "were", "do", "does", "did", "has", "have", "had", "can", "could",
        "will", "would", "should")
_WH = re.compile(r"\b(how|what|which|who|whom|when|where)\b((?:\s+[\w'-]+){0,4})", re.IGNORECASE)
_HOW_NUMBER = frozenset({"many", "much", "long", "old", "far", "tall", "high", "big", "large",
                         "deep", "wide", "heavy", "fast", "hot", "cold"})
_TIME_NOUNS = frozenset({"year", "years", "date", "century", "centuries", "decade", "decades",
                         "month", "day"})
_AMOUNT_NOUNS = frozenset({"number", "population", "percentage", "amount", "length", "height",
                           "area", "size", "age", "distance", "depth", "weight", "speed"})
_NAMED_NOUNS = frozenset({
    "city", "country", "town", "village", "river", "state", "province", "island", "islands",
    "continent", "mountain", "lake", "sea", "ocean", "region", "county", "nation", "capital",
    "team", "club", "company", "university", "king", "queen", "emperor", "president", "author",
    "writer", "poet", "painter", "composer", "scientist", "artist", "architect", "empire",
    "dynasty", "band", "person", "man", "woman",
})
_NUMBER_WORDS = frozenset(
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety "
    "hundred hundreds thousand thousands million millions billion billions trillion dozen "
    "dozens half once twice".split()
)
_TIME_WORDS = frozenset(
    "january february march april may june july august september october november december "
    "century centuries spring summer autumn winter".split()
)
# a question whose answer may be a nationality, a people or a language
_ASKS_NATIONALITY = re.compile(
    r"\b(?:nationality|nationalities|citizenship|citizen|ethnicity|ethnic|language|"
    r"languages|tongue|demonym|descent)\b", re.IGNORECASE)
_YEAR_WORD = re.compile(r"\d{3,4}s?")  # 1904, 820, 1960s
_BARE_NUMBER = re.compile(r"[\d.,]*\d[\d.,]*s?")  # 2012, 1,500, 3.5, 1960s
_YEAR_LIKE = re.compile(r"(?:1[1-9]|20)\d\d")  # a count written as 1100-2099 reads as a year
# a question that names an amount anywhere may be answered by a bare number
_NAMES_AMOUNT = re.compile(
    r"\b(?:number|numbers|population|percentage|percent|amount|length|height|area|size|age|"
    r"distance|depth|weight|speed|score|total|count|rank|capacity|attendance|tall|long|old|"
    r"many|much|cost|price|seats|sum)\b", re.IGNORECASE)
# lower-case words inside a name ("Leonardo da Vinci", "Gulf of Thailand")
_NAME_LINKS = frozenset("of the de del della da di du dos von van der den la le al bin y".split())
# what a question asks for wherever it says it: a year, or a count
_CUES = re.compile(r"\b(?:(?:what|which) (year)|how (?:many|much))\b", re.IGNORECASE)
# "..., A or B?": the two (or more) things a comparison question names (the question mark
# may be missing; the last thing may hold a comma: "Paramount Pictures, Inc.")
_CHOICES = re.compile(r"[,:]\s*([^,:?]+?(?:,\s*[^,:?]+?)*)\s+or\s+([^,:?]+?"
                      r"(?:,\s*(?:Inc|Ltd|Co|Jr|Sr|USA|UK)\.?)?)\s*\??\s*$")
# where a named thing starts: a capital, a digit or a quote, in any case-insensitive pattern
_THING = r"(?-i:[A-Z0-9\"\u201c])"
# "Which band, A or B, had more members?": the two things set off by commas, each a name
# (capitalised: "Which doctrine, not held in Judaism or Islam, is ...?" names no choice)
_CHOICES_MID = re.compile(
    rf"^(?:which|who|what)\b[^,?]*,\s*({_THING}[^,:?]*?)\s+or\s+"
    rf"({_THING}[^,:?]*?)\s*,\s*[^,?\s]+\s[^,?]+\?\s*$",
    re.IGNORECASE)
# "Which is larger A or B?", "who is younger A or B ?", "Who was born first A or B?",
# "Which genus has more species A or B?": a comparison before the two things, no comma
_CHOICES_AFTER = re.compile(
    r"^(?:which|who)\b(?:\s+\w+){0,2}?\s+(?:is|was|are|were|has|had|have|came|come|did)"
    r"(?:\s+(?:born|formed|founded|released|published|built))?\s+"
    r"(?:(?:more|less|fewer|the\s+most|the\s+least)\s+\w+|\w+er|first|last|earlier|later|"
    r"older|oldest|youngest|largest|biggest|longest|tallest|highest|smallest)\s+"
    rf"({_THING}[^,:?]*?)\s+or\s+({_THING}[^,:?]*?)\s*\??\s*$",
    re.IGNORECASE)
# "Which of A and B was born first?": the two things named before the verb
_CHOICES_OF = re.compile(
    r"^(?:which|who)\s+of\s+([^,:?]+?)\s+and\s+([^,:?]+?)\s+(?:was|is|were|are|did|does|do|"
    r"has|had|came|lived|died)\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class AnswerShape:
    """What kind of answer a question asks for, read from its wording (English): a count or
    amount (``number``: "how many", "how long"), a time (``time``: "when", "in what year"), a
    name (``name``: "who", "where", "which river"; the answer starts with a capital), a yes or
    a no ("Is ...?", "Were both ...?"), or one of the things it names (``choices``: "Which is
    older, the Nile or the Amazon?"). The span grammar keeps the answers of that shape (a
    number or a time starts with one), and keeps them all when none is left (a shape narrows,
    it never empties)."""

    number: bool = False
    time: bool = False
    year: bool = False  # a time that is a year ("in what year": "1904", not "20th century")
    name: bool = False
    yes_no: bool = False
    choices: tuple[str, ...] = ()
    #: the question asks for a nationality, a people or a language ("What nationality was
    #: ...?", "In which language ...?"); otherwise a bare nationality is no answer
    nationality: bool = False
    #: a bare number ("2012", "1,500") may answer; not where a question of no particular
    #: shape names no amount ("Which Eminem album ...?", "... attended which university?")
    bare_number: bool = True

    def trim(self, span: tuple[str, ...]) -> tuple[str, ...]:
        """A name is its run of capitalised words ("University of Tokyo", not "University of
        Tokyo is"); lower-case links ("of", "de", "von") only inside it. Other shapes: whole."""
        if not self.name:
            return span
        end = 1
        for i, word in enumerate(span[1:], 1):
            if word[:1].isupper() or word[:1].isdigit():
                end = i + 1
            elif word not in _NAME_LINKS:
                break
        return span[:end]

    def first(self, word: str) -> bool:
        """``word`` may start an answer of this shape: a number or a time starts with one
        ("25 million", "ten", "1962", "March 1758"), a name with a capital and never a lone
        letter; any word starts an answer of no particular shape."""
        if self.name:
            return word[:1].isupper() and len(word) > 1
        if self.year:
            return _YEAR_WORD.fullmatch(word) is not None
        if not (self.number or self.time) or any(c.isdigit() for c in word):
            return True
        lower = word.lower()
        return (self.number and lower in _NUMBER_WORDS) or (self.time and lower in _TIME_WORDS)

    @property
    def plain(self) -> bool:
        """The wording asks for nothing in particular (a "what" question about anything);
        whether a nationality may answer it aside."""
        return replace(self, nationality=False, bare_number=True) == PLAIN_SHAPE

    def takes(self, span: str) -> bool:
        """``span`` is an answer of this shape: it starts as :meth:`first` wants, it is no
        bare number where none may answer (:attr:`bare_number`), a count is no year ("1994"
        for "how many hits"), and unless a nationality is asked for, it is not one alone or
        before lower-case words ("Irish", "Irish author Bram Stoker"; "Italian Renaissance" is
        a name)."""
        words = span.split()
        if not words or not self.first(words[0]):
            return False
        if not self.bare_number and _BARE_NUMBER.fullmatch(span):
            return False
        if self.number and not self.time and _YEAR_LIKE.fullmatch(span):
            return False
        if not self.nationality and _demonym(words[0]):  # "Irish", "Irish author ..."
            return len(words) > 1 and words[1][:1].isupper() and not _demonym(words[1])
        return True


def _demonym(word: str) -> bool:
    """``word`` names a nationality: "Irish", "Irish-born", "Anglo-Irish"."""
    return word in DEMONYMS or any(part in DEMONYMS for part in word.split("-"))


PLAIN_SHAPE = AnswerShape()


def answer_shape(question: str) -> AnswerShape:
    """The :class:`AnswerShape` of ``question`` (see there); ``PLAIN_SHAPE`` when its wording
    says nothing (a "what" question about anything), without bare numbers unless it names an
    amount."""
    text = " ".join(question.split())
    shape = _shape(text)
    if shape == PLAIN_SHAPE and text and not _NAMES_AMOUNT.search(text):
        shape = replace(shape, bare_number=False)  # "Which Eminem album ...?": not "2012"
    return replace(shape, nationality=True) if _ASKS_NATIONALITY.search(text) else shape


def _shape(text: str) -> AnswerShape:
    cue = _CUES.search(text)  # asked in place: "..., who introduced them in what year?"
    if cue is not None:
        return AnswerShape(time=True, year=True) if cue.group(1) else AnswerShape(number=True)
    choices = (_CHOICES_MID.search(text) or _CHOICES.search(text) or _CHOICES_OF.search(text)
               or _CHOICES_AFTER.search(text))
    if choices:
        names = [c.strip() for c in choices.group(1).split(",")] + [choices.group(2).strip()]
        names = [n for n in names if n and len(n.split()) <= 8]
        if len(names) >= 2:
            return AnswerShape(choices=tuple(dict.fromkeys(names)))
    first = text.split(" ", 1)[0].lower() if text else ""
    if first in _AUX:
        return AnswerShape(yes_no=True)
    wh = _WH.search(text)
    if wh is None:
        return PLAIN_SHAPE
    word, following = wh.group(1).lower(), wh.group(2).lower().split()
    after = following[0] if following else ""
    if word == "how":
        return AnswerShape(number=after in _HOW_NUMBER)
    if word in ("what", "which") and after == "year":
        return AnswerShape(time=True, year=True)
    if word == "when" or (word in ("what", "which") and after in _TIME_NOUNS):
        return AnswerShape(time=True)
    if word in ("who", "whom", "where") or (word in ("what", "which") and after in _NAMED_NOUNS):
        return AnswerShape(name=True)
    # "What is the capital of ...?", "What was the largest city ...?": a named thing too
    if word in ("what", "which") and after in ("is", "was", "are", "were") \
            and following[1:2] in (["the"], ["a"], ["an"]) \
            and _NAMED_NOUNS & set(following[2:4]):
        return AnswerShape(name=True)
    if word in ("what", "which") and _AMOUNT_NOUNS & set(following):
        return AnswerShape(number=True)  # "What is the atomic number of ...?"
    return PLAIN_SHAPE


# -- a person's full name -------------------------------------------------------------------

_ASKS_PERSON = re.compile(r"^\W*(?:who|whom)\b", re.IGNORECASE)
# capitalised words that start a sentence or a title rather than a name ("The", "In", "By")
_NOT_GIVEN_NAMES = frozenset(
    """The A An In On At By Of For From With And Or But As To His Her Its Their This That
    These Those It He She They When Where While After Before During Since Under Over
    Composer Painter Author Writer Poet Novelist Artist Director Sir Saint St""".split())
_NAME_WORD = r"[A-Z\u00C0-\u00DE][\w\u00C0-\u024F'\u2019-]*"
FULL_NAME_WORDS = 4  # words of a full name, at most


def full_name(span: str, texts: Sequence[str], question: str) -> str:
    """For a "who" question, ``span`` as the full name the texts give it: a surname alone
    ("Conrad", "Mozart") becomes the longest name of at most :data:`FULL_NAME_WORDS`
    capitalised words that ends with it and that the texts write most often, a name counted in
    every longer one that ends with it ("Joseph Conrad", "Wolfgang Amadeus Mozart" and not
    "Vienna Wolfgang Amadeus Mozart"); ``span`` unchanged for any other question, for a span that is
    not one or two capitalised words, or when the texts never write it after a given name."""
    words = span.split()
    if not _ASKS_PERSON.match(question) or not 1 <= len(words) <= 2 \
            or not all(w[:1].isupper() and w.isalpha() for w in words) \
            or _demonym(words[0]):
        return span
    # the given names on the same line, blanks between ("Dracula\nBram Stoker ..." is a title
    # line and a sentence, not one name)
    lead = rf"((?:{_NAME_WORD}[ \t]+){{1,{FULL_NAME_WORDS - len(words)}}})"
    pattern = re.compile(rf"(?<![\w\u00C0-\u024F]){lead}{re.escape(span)}(?![\w\u00C0-\u024F])")
    counts: dict[str, int] = {}
    for text in texts:
        for match in pattern.finditer(text):
            given = match.group(1).split()
            while given and given[0] in _NOT_GIVEN_NAMES:
                given = given[1:]
            if given and not any(_demonym(g) or g in _NOT_GIVEN_NAMES or g in words
                                 for g in given):
                for i in range(len(given)):  # "Vienna Wolfgang Amadeus" counts its tails too
                    name = " ".join([*given[i:], *words])
                    counts[name] = counts.get(name, 0) + 1
    if not counts:
        return span
    return max(counts, key=lambda n: (counts[n], len(n.split())))


# -- a measure's unit ------------------------------------------------------------------------

# "how long / far / big ... ?": a measure, whose answer is a number and its unit ("21-25 kg",
# "3.4 million years"); "how many" counts things and "how old" asks for years: neither is here
_ASKS_MEASURE = re.compile(
    r"\bhow (?:much|long|far|tall|high|heavy|deep|big|large|wide|fast|hot|cold|thick)\b",
    re.IGNORECASE)
_NUMBER = r"\d[\d,.]*(?:\s?(?:–|-|to)\s?\d[\d,.]*)?(?: (?:thousand|million|billion|trillion))?"
_NUMBER_SPAN = re.compile(
    rf"(?:(?:about|around|roughly|nearly|almost|over|under|more than|less than|up to) )?"
    rf"{_NUMBER}")
_UNIT_WORDS = (
    "kg|kilograms?|grams?|g|tonnes?|tons?|pounds?|lbs?|ounces?|oz|carats?|"
    "years?|months?|weeks?|days?|hours?|minutes?|seconds?|centuries|century|decades?|"
    "millennia|millennium|km|kilomet(?:re|er)s?|miles?|mi|met(?:re|er)s?|m|cm|mm|"
    "(?:centi|milli)met(?:re|er)s?|feet|foot|ft|inches|yards?|nautical miles|light-years?|"
    "astronomical units|AU|acres?|hectares?|ha|km2|km²|mi2|mi²|m2|m²|sq mi|litres?|liters?|"
    "gallons?|°C|°F|degrees(?: Celsius| Fahrenheit)?|kelvin|K|per ?cent|percent|mph|knots|"
    "km/h|m/s|watts?|W|kW|MW|GW|kilowatts?|megawatts?|volts?|V|calories|kcal|bytes|"
    "kilobytes|megabytes|gigabytes|KB|MB|GB")
_UNIT = re.compile(
    rf"\s?(%|(?:(?:square|cubic) )?(?:{_UNIT_WORDS})(?: per (?:hour|second|minute|day|year))?"
    rf"(?: ago)?)(?![\w\u00C0-\u024F])")


def with_unit(span: str, texts: Sequence[str], question: str) -> str:
    """For a question that asks for a measure ("how long", "how far", "how heavy"...), a bare
    number as the number and the unit the texts write after it most often ("21–25" ->
    "21–25 kg", "3.4 million" -> "3.4 million years", "25" -> "25%"); ``span`` unchanged for
    any other question, for a span that is not a number, or when no unit follows it."""
    if not _ASKS_MEASURE.search(question) or not _NUMBER_SPAN.fullmatch(span.strip()):
        return span
    span = span.strip()
    counts: dict[str, int] = {}
    here = re.compile(rf"(?<![\w.,–-]){re.escape(span)}(?![\d,.–-]\d)")  # not in a range
    for text in texts:
        for match in here.finditer(text):
            unit = _UNIT.match(text, match.end())
            if unit:
                written = text[match.end():unit.end()]
                counts[written] = counts.get(written, 0) + 1
    if not counts:
        return span
    return span + max(counts, key=lambda u: (counts[u], len(u)))


# -- the first search ------------------------------------------------------------------------

# Words that locate nothing in a search index: question words, articles, prepositions, pronouns
_QUERY_STOPWORDS = frozenset(
    """a an the of in on at to for by with from and or is was are were be been who whom whose
    what which when where why how did does do that this these those as its it his her their
    there name named he she him they them we you i me my our your many much have has had
    roughly about approximately""".split()
)
# characters outside the embedded grammar's query alphabet (protocol.grammar's plain queries)
_NOT_QUERY_CHARS = re.compile(r"[^a-zA-Z0-9 ,.'()\u00C0-\uFFFF-]")
QUESTION_QUERY_CHARS = 120


def question_query(question: str, limit: int = QUESTION_QUERY_CHARS) -> str:
    """A search query made of a question's own content words, in order: characters outside
    the plain-query alphabet and stopwords dropped, at most ``limit`` characters (whole words),
    the first letter a capital. What a search engine should be asked first ("Which river flows
    through the capital of Hungary?" -> "River flows through capital Hungary"); empty when the
    question has no content word."""
    words = []
    for raw in _NOT_QUERY_CHARS.sub(" ", question).split():
        word = raw.strip(" ,.'-")
        if word and word.lower() not in _QUERY_STOPWORDS:
            words.append(word)
    text = ""
    for word in words:
        if len(text) + len(word) + (1 if text else 0) > limit:
            break
        text = f"{text} {word}" if text else word
    return text[:1].upper() + text[1:]


def bridge_query(question: str, bridge: str, passage: str, limit: int = 60) -> str:
    """The second search of a two-hop question: the bridge the first search found (the
    reader's best span: "Venezuela" for "the capital of the country that holds most of the
    Orinoco's basin") and the question's content words that neither the bridge nor its
    passage holds ("capital"), at most ``limit`` characters (whole words, the bridge first),
    the first letter a capital, in the plain-query alphabet."""
    have = content_stems(passage) | content_stems(bridge)
    words = [w for w in question_query(question).split() if not content_stems(w) & have]
    text = " ".join(_NOT_QUERY_CHARS.sub(" ", bridge).split())[:limit]
    for word in words:
        if len(text) + 1 + len(word) > limit:
            break
        text = f"{text} {word}" if text else word
    return text[:1].upper() + text[1:]


__all__ = [
    "PLAIN_SHAPE",
    "AnswerShape",
    "answer_shape",
    "bridge_query",
    "clause_words",
    "clean_word",
    "focus_sentences",
    "full_name",
    "QUESTION_QUERY_CHARS",
    "question_query",
    "question_words",
    "span_sources",
    "spans_of",
    "weak_word",
    "with_unit",
]
