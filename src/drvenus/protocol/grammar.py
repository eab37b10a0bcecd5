"""A GBNF grammar that admits exactly the well-formed DR-Venus assistant turns.

Constrained decoding with this grammar makes every sampled turn pass
:func:`drvenus.protocol.check_turn_format` for its kind and :func:`drvenus.protocol.parse_turn`:

    <think>\\n THINK \\n</think>\\n <tool_call>\\n{"name": "search", ...}\\n</tool_call>
                              or  <tool_call>\\n{"name": "visit", ...}\\n</tool_call>
                              or  <answer>\\n ANSWER \\n</answer>

Free text (THINK, ANSWER, JSON strings) may contain ``<`` and any other tag (``<summary>``,
``a < b``), but never one of the protocol tags (``<think>``, ``</think>``, ``<tool_call>``,
``</tool_call>``, ``<answer>``, ``</answer>``, ``<tool_response>``, ``</tool_response>``):
they are excluded with a small trie of rules (GBNF has no negative lookahead). The tool-call JSON
is the canonical one-line form of the SFT data (``{"name": "search", "arguments": {"query":
["..."]}}``) with valid JSON strings (escapes allowed, control characters not), non-blank
queries/goal, and ``http(s)://`` URLs.

The grammar is plain GBNF as llama.cpp (``LlamaGrammar``, llama-server's ``grammar`` field)
reads it; xgrammar (vLLM structured outputs, SGLang) reads the same syntax.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

# Tags that free text must never contain: the protocol's own, and the stop string.
PROTOCOL_TAGS: tuple[str, ...] = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<answer>",
    "</answer>",
    "<tool_response>",
    "</tool_response>",
)

# Characters str.strip() removes (a field that starts with one could be blank after stripping),
# as a GBNF class body: C0 controls and space, DEL, NEL, NBSP, the Unicode spaces and separators.
_BLANKS = (
    "\\x00-\\x20\\x7F\\x85\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000"
)

# Letters of any script (all of U+00C0 onwards but the blanks) and digits, as a GBNF class.
_WORD_FIRST = (
    "[a-zA-Z0-9\\u00C0-\\u167F\\u1681-\\u1FFF\\u200B-\\u2027"
    "\\u202A-\\u202E\\u2030-\\u205E\\u2060-\\u2FFF\\u3001-\\uFFFF]"
)
# The characters of a plain query after its first.
_WORD_ITEM = "[a-zA-Z0-9 ,.'()\\u00C0-\\uFFFF-]"
# The same with the Latin letters upper case only (scripts without case stay as they are).
_CAPITAL_FIRST = (
    "[A-Z0-9\\u00C0-\\u00D6\\u00D8-\\u00DE\\u0100-\\u024F\\u0370-\\u167F\\u1681-\\u1DFF"
    "\\u200B-\\u2027\\u202A-\\u202E\\u2030-\\u205E\\u2060-\\u2FFF\\u3001-\\uFFFF]"
)

# Defaults: generous for a real checkpoint; the embedded tiny model passes tighter ones.
DEFAULT_MAX_THINK_CHARS: int | None = None
DEFAULT_MAX_ANSWER_CHARS: int | None = None
DEFAULT_MAX_STRING_CHARS = 500
DEFAULT_MAX_LIST_ITEMS = 5

_CLASS_ESCAPES = {
    "\\": "\\\\",
    "]": "\\]",
    "[": "\\[",
    "-": "\\-",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    '"': '\\"',
}


def _class_char(c: str) -> str:
    """A character as it may appear inside a GBNF ``[...]`` class."""
    if c in _CLASS_ESCAPES:
        return _CLASS_ESCAPES[c]
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\x{ord(c):02X}"
    return c


def _literal(text: str) -> str:
    """A GBNF string literal."""
    out = []
    for c in text:
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _repeat(item: str, max_count: int | None, min_count: int = 0) -> str:
    """``item*`` / ``item+`` or a bounded ``item{min,max}``."""
    if max_count is None:
        return f"{item}*" if min_count == 0 else f"{item}+"
    if max_count < min_count:
        raise ValueError(f"bound {max_count} is below the minimum {min_count}")
    return f"{item}{{{min_count},{max_count}}}"


class _Rules:
    """Ordered GBNF rule set."""

    def __init__(self) -> None:
        self._rules: dict[str, str] = {}

    def add(self, name: str, body: str) -> str:
        self._rules[name] = body
        return name

    def render(self) -> str:
        return "\n".join(f"{name} ::= {body}" for name, body in self._rules.items()) + "\n"


def _tag_free_text(
    rules: _Rules,
    prefix: str,
    *,
    excluded: str,
    extra_items: tuple[str, ...] = (),
    tags: tuple[str, ...] = PROTOCOL_TAGS,
) -> str:
    """Add rules for ONE item of text that never spells out any of ``tags``; return its name.

    An item is either a plain character (not ``<``, not in ``excluded``), one of
    ``extra_items`` (e.g. a JSON escape), or ``<`` followed by a walk down the trie of tag
    prefixes that leaves the trie before completing a tag. All tags start with ``<`` and contain
    no other ``<``, so a fresh ``<`` always restarts the walk at the root.
    """
    if any(not t.startswith("<") or "<" in t[1:] for t in tags):
        raise ValueError("every tag must start with '<' and contain no other '<'")
    # Trie over the characters after '<'. A node is a prefix; terminal = a whole tag.
    prefixes = {t[1:i] for t in tags for i in range(1, len(t))}
    whole = {t[1:] for t in tags}
    names: dict[str, str] = {}
    for p in sorted(prefixes, key=lambda s: (len(s), s)):
        names[p] = f"{prefix}-lt{len(names)}"
    for p, name in names.items():
        children = sorted(
            {w[len(p)] for w in prefixes | whole if len(w) > len(p) and w.startswith(p)}
        )
        exit_class = "[^<" + excluded + "".join(_class_char(c) for c in children) + "]"
        alts = [exit_class, *extra_items, f'"<" {names[""]}']
        for c in children:
            nxt = p + c
            if nxt in whole:
                continue  # completing a tag is the one thing not allowed
            alts.append(f"{_literal(c)} {names[nxt]}")
        rules.add(name, " | ".join(alts))
    plain = "[^<" + excluded + "]"
    return rules.add(f"{prefix}-item", " | ".join([plain, *extra_items, f'"<" {names[""]}']))


def _json_string(rules: _Rules, name: str, first: str, item: str, max_chars: int) -> str:
    """A JSON string: ``first`` (a non-blank start) then items, then the closing quote."""
    return rules.add(name, f'"\\"" {first} {_repeat(item, max(max_chars - 1, 0))} "\\""')


def _answer_span_rules(
    rules: _Rules, choices: tuple[str, ...] | None, spans: tuple[tuple[str, ...], ...] | None,
    new_words: frozenset[str] | None,
) -> str | None:
    """The answer body when it is one of ``choices`` (whole), or one span of ``spans`` (each a
    run of words): a trie of words, one rule per node with children, where the answer may end
    after any word, one space between words. The vocabulary is closed, so no answer can glue
    two words together or stop inside one. With ``new_words``, an answer holds at least one of
    them (not the question's words alone). Return the body's expression, or None when nothing
    is left (then the answer is plain text)."""
    if choices:
        return rules.add("answer-span", " | ".join(_literal(o) for o in choices))
    if not spans:
        return None
    trie: dict[str, dict] = {}
    for span in spans:
        node = trie
        for word in span:
            node = node.setdefault(word, {})
    count = 0

    def is_new(word: str) -> bool:
        return new_words is None or word in new_words

    def alternatives(node: dict[str, dict], said: bool) -> str | None:
        nonlocal count
        alts = []
        for word, children in node.items():
            now = said or is_new(word)
            rest = alternatives(children, now) if children else None
            if rest is not None:
                count += 1
                name = rules.add(f"span-{count}", "")
                rules.add(name, f'( " " ( {rest} ) )' + ("?" if now else ""))
                alts.append(f"{_literal(word)} {name}")
            elif now:
                alts.append(_literal(word))
        return " | ".join(alts) if alts else None

    body = alternatives(trie, new_words is None)
    return None if body is None else rules.add("answer-span", body)


@dataclass(frozen=True)
class GrammarOptions:
    """What one assistant turn may be (see :func:`protocol_grammar`).

    ``allow_tool_call`` / ``allow_answer`` restrict the turn kind (e.g. answer-only when the
    agent forces a final answer); ``tools`` the tools a call may name. The ``max_*`` bounds
    count characters (a tag-like ``<...`` run counts as one) and keep a small model from
    rambling forever; ``None`` leaves free text unbounded (then ``max_tokens`` is the only
    limit). ``plain_queries``: search queries are words (letters of any script, digits, spaces,
    light punctuation), never identifiers like ``the_book_2026-11-30``: what a tiny model needs
    to search like a person. ``answer_think_chars``: the think bound of a turn that can only be
    an answer (a forced final answer) in place of ``max_think_chars``, so that a small model
    gets to its answer long before its token cap. ``plain_answer``: the answer is one line of
    plain text (no ``<`` or ``>``, no control characters) that starts with a letter or a digit:
    never markup, a stray tag, a quotation or a second paragraph. ``capital_queries`` (with
    ``plain_queries``): a query starts with a capital letter or a digit, like a title or a
    question, never with a lower-case fragment such as ``druc``. ``answer_choices``: the answer
    is one of these texts, whole. ``answer_spans``: the answer is one of these runs of words or
    a prefix of one (a grounded answer, the spans of what was read: it can never glue words
    together or stop inside a word; with no span, a plain answer); ``answer_new_words``: a span
    answer holds at least one of these words (not only the question's). Which choices and
    spans a turn gets is the answering policy of whoever builds the grammar (the small agent,
    :mod:`drvenus.small`). ``visit_urls``: the URLs a visit may open (the search results read
    so far; None: any ``http(s)://`` URL). ``used_queries`` (with ``plain_queries``): queries
    already searched, which a search may not ask again. ``search_query``: the one query a
    search may ask (the question's own words for the first search). ``plain_think``: the think
    block has no ``<`` at all, so each of its characters is at least one token and its bound is
    a token bound too (a tag-like ``<...`` run counts as one character otherwise).
    """

    allow_tool_call: bool = True
    allow_answer: bool = True
    tools: tuple[str, ...] = ("search", "visit")
    max_think_chars: int | None = DEFAULT_MAX_THINK_CHARS
    max_answer_chars: int | None = DEFAULT_MAX_ANSWER_CHARS
    max_string_chars: int = DEFAULT_MAX_STRING_CHARS
    max_list_items: int = DEFAULT_MAX_LIST_ITEMS
    plain_queries: bool = False
    answer_think_chars: int | None = None
    plain_answer: bool = False
    capital_queries: bool = False
    plain_think: bool = False
    answer_choices: tuple[str, ...] | None = None
    answer_spans: tuple[tuple[str, ...], ...] | None = None
    answer_new_words: frozenset[str] | None = None
    visit_urls: tuple[str, ...] | None = None
    used_queries: tuple[str, ...] = ()
    search_query: str | None = None

    def __post_init__(self) -> None:
        if not (self.allow_tool_call or self.allow_answer):
            raise ValueError("the grammar must allow a tool call, an answer, or both")
        if self.allow_tool_call and (not self.tools or set(self.tools) - {"search", "visit"}):
            raise ValueError("tools must be a non-empty subset of ('search', 'visit')")
        if self.max_list_items < 1 or self.max_string_chars < 1:
            raise ValueError("max_list_items and max_string_chars must be at least 1")
        if any(not span for span in self.answer_spans or ()):
            raise ValueError("an answer span holds at least one word")


_DEFAULT_OPTIONS = GrammarOptions()


def protocol_grammar(prefilled_think: bool = False, options: GrammarOptions | None = None,
                     **changes: Any) -> str:
    """The GBNF grammar of one well-formed assistant turn: ``options`` (default
    :class:`GrammarOptions`'s) with ``changes`` (its field names) on top.

    ``prefilled_think``: the chat template already put ``<think>\\n`` in the generation prompt
    (Qwen3-Thinking), so the sample starts inside the think block. Raises ValueError for
    options that contradict each other, TypeError for a name that is not an option.
    """
    chosen = replace(options or _DEFAULT_OPTIONS, **changes) if changes else \
        (options or _DEFAULT_OPTIONS)
    return _grammar(prefilled_think, chosen)


@lru_cache(maxsize=64)
def _grammar(prefilled_think: bool, o: GrammarOptions) -> str:
    r = _Rules()
    kinds = []
    if o.allow_tool_call:
        kinds.append("tool-call")
    if o.allow_answer:
        kinds.append("answer")
    opening = "" if prefilled_think else _literal("<think>\n") + " "
    r.add(
        "root",
        f"{opening}think {_literal(chr(10) + '</think>' + chr(10))} ( " + " | ".join(kinds) + " )",
    )

    text_item = _tag_free_text(r, "text", excluded="")
    think_bound = o.max_think_chars
    if not o.allow_tool_call and o.answer_think_chars is not None:
        think_bound = o.answer_think_chars
    think_item = r.add("think-item", "[^<]") if o.plain_think else text_item
    r.add("think", _repeat(think_item, think_bound))

    if o.allow_answer:
        spans = _answer_span_rules(r, o.answer_choices, o.answer_spans, o.answer_new_words)
        _answer_rules(r, text_item, o.plain_answer or spans is not None, o.max_answer_chars,
                      spans)
    if o.allow_tool_call:
        _tool_call_rules(
            r, o.tools, o.max_list_items, o.max_string_chars, o.plain_queries,
            o.capital_queries, o.visit_urls, o.used_queries, o.search_query,
        )
    return r.render()


def _answer_rules(
    r: _Rules,
    text_item: str,
    plain: bool,
    max_chars: int | None,
    spans: str | None,
) -> None:
    """The ``answer`` rule: free text, plain text, or a span of what was read (``spans``)."""
    if spans is not None:
        body = spans
    else:
        # A non-blank first character keeps the answer body non-empty after strip().
        r.add("answer-first", _WORD_FIRST if plain else f"[^<{_BLANKS}]")
        item = r.add("answer-item", "[^<>\\x00-\\x1F\\x7F]") if plain else text_item
        more = None if max_chars is None else max_chars - 1
        body = f"answer-first {_repeat(item, more)}"
    r.add("answer", f"{_literal('<answer>' + chr(10))} {body} {_literal(chr(10) + '</answer>')}")


def _class_ranges(cls: str) -> list[tuple[int, int]]:
    """The code point ranges of a plain (not negated) GBNF class written by this module."""
    body, items, i = cls[1:-1], [], 0
    while i < len(body):  # (code point, whether it is a bare "-", i.e. a range operator)
        if body[i] == "\\" and body[i + 1] == "u":
            items.append((int(body[i + 2 : i + 6], 16), False))
            i += 6
        elif body[i] == "\\":
            items.append((ord(body[i + 1]), False))
            i += 2
        else:
            items.append((ord(body[i]), body[i] == "-"))
            i += 1
    ranges, j = [], 0
    while j < len(items):
        if j + 2 < len(items) and items[j + 1][1]:
            ranges.append((items[j][0], items[j + 2][0]))
            j += 3
        else:
            ranges.append((items[j][0], items[j][0]))
            j += 1
    return ranges


def _class_without(cls: str, chars: set[str]) -> str | None:
    """``cls`` less ``chars``, as a class (None when nothing is left)."""
    out: list[tuple[int, int]] = []
    for lo, hi in _class_ranges(cls):
        for cut in sorted(ord(c) for c in chars if lo <= ord(c) <= hi):
            if lo < cut:
                out.append((lo, cut - 1))
            lo = cut + 1
        if lo <= hi:
            out.append((lo, hi))
    if not out:
        return None

    def char(cp: int) -> str:
        return _class_char(chr(cp)) if cp < 0x80 else f"\\u{cp:04X}"

    return "[" + "".join(char(a) if a == b else f"{char(a)}-{char(b)}" for a, b in out) + "]"


def _in_class(cls: str, c: str) -> bool:
    return any(lo <= ord(c) <= hi for lo, hi in _class_ranges(cls))


def _fresh_query(
    r: _Rules, used: tuple[str, ...], first: str, item: str, max_chars: int
) -> None:
    """The ``query`` rule: a plain query (``first`` then ``item`` characters, at most
    ``max_chars``) that is none of ``used``: a walk down the trie of the used queries that
    leaves it, or stops at a node that is not a whole used query."""
    used_set = {u for u in used if u}
    prefixes = {u[:i] for u in used_set for i in range(len(u) + 1)}
    r.add("word-first", first)
    r.add("word-item", item)
    rests: dict[int, str] = {}

    def rest(k: int) -> str:  # k characters written: the rest is free
        if k not in rests:
            rests[k] = r.add(f"query-rest{k}", f'{_repeat("word-item", max_chars - k)} "\\""')
        return rests[k]

    names: dict[str, str | None] = {}

    def node(p: str) -> str | None:
        if p in names:
            return names[p]
        d, cls = len(p), first if not p else item
        children = sorted({u[d] for u in prefixes if len(u) > d and u.startswith(p)})
        children = [c for c in children if _in_class(cls, c)] if d < max_chars else []
        alts = []
        for c in children:
            sub = node(p + c)
            if sub is not None:
                alts.append(f"{_literal(c)} {sub}")
        exit_class = _class_without(cls, set(children)) if d < max_chars else None
        if exit_class is not None:
            alts.append(f"{exit_class} {rest(d + 1)}")
        if p and p not in used_set:
            alts.append('"\\""')
        names[p] = r.add(f"query-n{len(names)}", " | ".join(alts)) if alts else None
        return names[p]

    root = node("")
    if root is None:
        raise ValueError("every query is excluded")
    r.add("query", f'"\\"" {root}')


def _tool_call_rules(
    r: _Rules,
    tools: tuple[str, ...],
    max_list_items: int,
    max_string_chars: int,
    plain_queries: bool,
    capital_queries: bool,
    visit_urls: tuple[str, ...] | None = None,
    used_queries: tuple[str, ...] = (),
    search_query: str | None = None,
) -> None:
    """The ``tool-call`` rule: the canonical one-line JSON of a search or visit call (with
    ``search_query``, a search asks that query and no other)."""
    r.add(
        "tool-call",
        f"{_literal('<tool_call>' + chr(10))} ( "
        + " | ".join(f"{t}-call" for t in tools)
        + f" ) {_literal(chr(10) + '</tool_call>')}",
    )
    more_queries = "" if search_query else _repeat('( ", " query )', max_list_items - 1)
    more_urls = _repeat('( ", " url )', max_list_items - 1)
    r.add(
        "search-call",
        _literal('{"name": "search", "arguments": {"query": [')
        + f" query {more_queries} "
        + _literal("]}}"),
    )
    r.add(
        "visit-call",
        _literal('{"name": "visit", "arguments": {"url": [')
        + f" url {more_urls} "
        + _literal('], "goal": ')
        + " goal "
        + _literal("}}"),
    )
    escape = r.add("json-escape", '"\\\\" ( ["\\\\/bfnrt] | "u" [0-9a-fA-F]{4} )')
    json_item = _tag_free_text(r, "json", excluded='"\\\\\\x00-\\x1F', extra_items=(escape,))
    r.add("json-first", f'[^<"\\\\{_BLANKS}] | "\\\\\\""')
    if search_query:
        r.add("query", _literal(json.dumps(search_query, ensure_ascii=False)))
    elif plain_queries and used_queries:
        first = _CAPITAL_FIRST if capital_queries else _WORD_FIRST
        _fresh_query(r, used_queries, first, _WORD_ITEM, max_string_chars)
    elif plain_queries:
        r.add("word-first", _CAPITAL_FIRST if capital_queries else _WORD_FIRST)
        r.add("word-item", _WORD_ITEM)
        _json_string(r, "query", "word-first", "word-item", max_string_chars)
    else:
        _json_string(r, "query", "json-first", json_item, max_string_chars)
    _json_string(r, "goal", "json-first", json_item, max_string_chars)
    if visit_urls:  # a page of the results read so far, never an invented URL
        pages = " | ".join(_literal(json.dumps(u, ensure_ascii=False)) for u in visit_urls)
        r.add("url", pages)
    else:
        r.add("url-scheme", '"http" "s"? "://"')
        r.add("url", f'"\\"" url-scheme {_repeat(json_item, max_string_chars, 1)} "\\""')


def turn_kinds(kind: str, allow_tool_call: bool = True, allow_answer: bool = True,
               tools: Sequence[str] = ("search", "visit")) -> tuple[bool, bool, tuple[str, ...]]:
    """What a turn of ``kind`` ("any", "tool_call", "search": a search call only, or "answer")
    may be: (a tool call, an answer, the tools a call may name). The flags may narrow the kind
    further (a model built with an answer-free grammar); when they exclude it, the kind wins."""
    if kind not in ("any", "tool_call", "search", "answer"):
        raise ValueError(f"unknown grammar kind {kind!r}")
    allow_call = kind != "answer" and allow_tool_call
    allow = kind in ("any", "answer") and allow_answer
    chosen = tuple(tools)
    if kind == "search":
        chosen = tuple(t for t in chosen if t == "search")
    if not (allow_call or allow):
        allow_call, allow = kind != "answer", kind == "answer"
    return allow_call, allow, chosen


def grammar_for_kind(kind: str, prefilled_think: bool = False, **options: Any) -> str:
    """:func:`protocol_grammar` for a turn kind (see :func:`turn_kinds`), with ``options`` (the
    fields of :class:`GrammarOptions`) on top."""
    allow_call, allow_answer, tools = turn_kinds(
        kind, bool(options.pop("allow_tool_call", True)),
        bool(options.pop("allow_answer", True)), options.pop("tools", ("search", "visit")))
    return protocol_grammar(prefilled_think, allow_tool_call=allow_call,
                            allow_answer=allow_answer, tools=tools or ("search",), **options)


# -- a grammar that admits one text ------------------------------------------------------------

_GBNF_TOKEN = re.compile(
    r'\s*(?:(?P<lit>"(?:[^"\\]|\\.)*")|(?P<cls>\[(?:[^\]\\]|\\.)*\])|(?P<name>[a-zA-Z][\w-]*)'
    r"|(?P<rep>\{\d+(?:,\d*)?\})|(?P<op>[()|?*+]))")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "/": "/", "[": "[",
            "]": "]"}


def _unescape(body: str) -> str | None:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1 : i + 2]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in ("x", "u"):
            width = 2 if nxt == "x" else 4
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width:
                return None
            out.append(chr(int(digits, 16)))
            i += 2 + width
        else:
            return None
    return "".join(out)


def _exact_repeat(rep: str) -> int | None:
    """How many times ``{m,n}`` repeats its item, when ``m == n`` (None: a range)."""
    low, comma, high = rep[1:-1].partition(",")
    return int(low) if not comma or high == low else None


def fixed_text(grammar: str) -> str | None:
    """The one text a GBNF ``grammar`` admits, or None when it admits more than one (or uses
    what this reading does not follow). A turn whose every character the grammar fixes, such as
    a search whose query is given with an empty thought, needs no model to write it. Only the
    rules reachable from ``root`` are read: sequences of literals and rules, groups of one
    alternative, and exact repeats (``x{0,0}``, ``x{2,2}``); an alternative, a character
    class or an open repeat means more than one text."""
    rules: dict[str, str] = {}
    for line in grammar.splitlines():
        name, sep, body = line.partition("::=")
        if sep and name.strip():
            rules[name.strip()] = body
    done: dict[str, str | None] = {}

    def rule(name: str, seen: frozenset[str]) -> str | None:
        if name in done:
            return done[name]
        if name in seen or name not in rules:
            return None
        done[name] = value = sequence(rules[name], seen | {name})
        return value

    def sequence(body: str, seen: frozenset[str]) -> str | None:
        tokens = []
        pos = 0
        while pos < len(body) and body[pos:].strip():
            m = _GBNF_TOKEN.match(body, pos)
            if m is None:
                return None
            tokens.append((m.lastgroup, m.group(m.lastgroup or "")))
            pos = m.end()
        text = [""]  # the text of the sequence, then of each group open in it
        for i, (kind, tok) in enumerate(tokens):
            after = tokens[i + 1] if i + 1 < len(tokens) else (None, "")
            times = _exact_repeat(after[1]) if after[0] == "rep" else 1
            if times is None or (after[0] == "op" and after[1] in "?*+"):
                return None  # an open repeat
            if times == 0 and kind in ("lit", "name", "cls"):
                continue  # x{0,0}: nothing
            if kind == "op" and tok == "(":
                text.append("")
                continue
            if kind == "op" and tok == ")":
                if len(text) == 1:
                    return None
                item: str | None = text.pop()
            elif kind == "lit":
                item = _unescape(tok[1:-1])
            elif kind == "name":
                item = rule(tok, seen)
            elif kind == "rep" and i > 0:
                continue  # read with the item before it
            else:  # "|", a class, "?", "*", "+": more than one text
                return None
            if item is None:
                return None
            text[-1] += item * times
        return text[0] if len(text) == 1 else None

    return rule("root", frozenset())


__all__ = [
    "PROTOCOL_TAGS",
    "fixed_text",
    "GrammarOptions",
    "grammar_for_kind",
    "protocol_grammar",
    "turn_kinds",
]
