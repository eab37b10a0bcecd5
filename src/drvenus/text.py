"""Small text helpers shared across the package: one token estimate, one-line messages, a
Markdown answer's headline, counts in words, one rule for where a sentence ends."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

# Without a tokenizer, a token is taken to be about four UTF-8 bytes (English prose with BPE
# vocabularies; CJK text runs closer to one character per token, which bytes account for).
BYTES_PER_TOKEN = 4.0
#: tokens a chat template adds around each message (ChatML: ``<|im_start|>role\n`` ...
#: ``<|im_end|>\n``), where a prompt cannot be counted exactly
MESSAGE_OVERHEAD_TOKENS = 5


#: words naming a people or a nationality ("Irish", "Ottoman"): an adjective, never a
#: person's or a place's name
DEMONYMS = frozenset(
    """Afghan Albanian Algerian American Andorran Angolan Argentine Argentinian Armenian
    Australian Austrian Azerbaijani Bahamian Bahraini Bangladeshi Barbadian Belarusian Belgian
    Belizean Beninese Bhutanese Bolivian Bosnian Brazilian British Bulgarian Burmese Burundian
    Cambodian Cameroonian Canadian Chadian Chilean Chinese Colombian Congolese Croatian Cuban
    Cypriot Czech Czechoslovak Danish Dominican Dutch Ecuadorian Egyptian English Eritrean
    Estonian Ethiopian Fijian Filipino Finnish French Gabonese Gambian Georgian German Ghanaian
    Greek Guatemalan Guinean Haitian Honduran Hungarian Icelandic Indian Indonesian Iranian
    Iraqi Irish Israeli Italian Ivorian Jamaican Japanese Jordanian Kazakh Kenyan Korean
    Kuwaiti Kyrgyz Laotian Latvian Lebanese Liberian Libyan Lithuanian Luxembourgish
    Macedonian Malagasy Malawian Malaysian Maldivian Malian Maltese Mauritanian Mexican
    Moldovan Mongolian Montenegrin Moroccan Mozambican Namibian Nepalese Nepali Nicaraguan
    Nigerian Nigerien Norwegian Omani Pakistani Palestinian Panamanian Paraguayan Persian
    Peruvian Polish Portuguese Prussian Qatari Roman Romanian Russian Rwandan Salvadoran Saudi
    Scottish Senegalese Serbian Singaporean Slovak Slovenian Somali Soviet Spanish Sudanese
    Swedish Swiss Syrian Taiwanese Tajik Tanzanian Thai Tibetan Togolese Tunisian Turkish
    Turkmen Ugandan Ukrainian Uruguayan Uzbek Venezuelan Vietnamese Welsh Yemeni Yugoslav
    Zambian Zimbabwean Ancient Byzantine Flemish Venetian Florentine Athenian Babylonian
    Assyrian Macedonian Mughal Ottoman""".split()
)


def estimate_tokens(text: str) -> int:
    """A tokenizer-free token count: about four UTF-8 bytes per token."""
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)


def one_line(text: object, limit: int = 200) -> str:
    """``text`` on one line (white space folded), cut to ``limit`` characters with ``...``."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


MAX_HEADLINE = 100
_LINK = re.compile(r"!?\[([^\]]*)\]\((?:[^()\s]|\([^()\s]*\))*\)")
_LINE_MARKS = re.compile(r"^\s*(?:#+|>+|[-*+]|\d+[.)])\s+|^[\s|:-]*-{3,}[\s|:-]*$", re.M)
_INLINE_MARKS = re.compile(r"\*\*|__|~~|`+|(?<!\w)[*_]|[*_](?!\w)")
_NOT_PROSE = re.compile(r"^\s*(?:#{1,6}\s|\||```|~~~)|^[\s|:-]*-{3,}[\s|:-]*$")  # heading, table


def headline(markdown: str, limit: int = MAX_HEADLINE) -> str:
    """A Markdown answer as one short plain line (a Heavy run's header, on the page and in the
    terminal): its first paragraph past any heading, table or code fence (the whole answer when
    it has nothing else), links as their text, no emphasis, heading, list or table marks
    (``snake_case`` and ``2*3`` stay)."""
    text = _LINK.sub(r"\1", markdown or "")
    prose = "\n".join("" if _NOT_PROSE.match(line) else line for line in text.splitlines())
    first = next((p for p in re.split(r"\n\s*\n", prose) if p.strip()), text)
    return one_line(_INLINE_MARKS.sub("", _LINE_MARKS.sub("", first)).replace("|", " "), limit)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 tool call``, ``2 tool calls``: the number with the noun in the right number."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


__all__ = ["BYTES_PER_TOKEN", "DEMONYMS", "counted", "estimate_tokens", "headline", "one_line"]


# where a sentence ends: . ! ? (and closing quotes or brackets), blanks, then a capital, a digit
# or an opening quote; not after an initial ("John A. Macdonald") or a common abbreviation
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr vs etc inc ltd co corp no vol fig approx ca gen col lt sgt rev "
    "jan feb mar apr jun jul aug sep sept oct nov dec e.g i.e u.s u.k".split()
)
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]\u201d]*\s+(?=[\"'(\[\u201c]?[A-Z0-9])")


def sentence_starts(text: str, stop: int | None = None) -> Iterator[int]:
    """Where each sentence of ``text`` after the first starts (up to ``stop``)."""
    for match in _SENTENCE_END.finditer(text, 0, len(text) if stop is None else stop):
        before = text[: match.start()].rstrip()
        last = before.rsplit(None, 1)[-1] if before.split() else ""
        word = last.rstrip(".!?\"')]\u201d").lower()
        if (len(word) == 1 and word.isalpha()) or word in _ABBREVIATIONS:
            continue
        yield match.end()


def split_sentences(paragraph: str) -> list[str]:
    """The sentences of a paragraph (see :func:`sentence_starts`), stripped, none empty."""
    bounds = [0, *sentence_starts(paragraph), len(paragraph)]
    pieces = (paragraph[a:b].strip() for a, b in zip(bounds, bounds[1:], strict=False))
    return [p for p in pieces if p]
