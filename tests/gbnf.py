"""A small GBNF recognizer: a test oracle for the grammars of ``drvenus.protocol.grammar``.

``Grammar(text).accepts(s)`` decides whether the whole string ``s`` is in the language of the
grammar's ``root`` rule, character (code point) by character, as llama.cpp's grammar sampler
does. Matching is a memoised search: for each (element, position) the set of positions where
that element can end, so ambiguity and backtracking cost nothing special.

Supported: rules ``name ::= alternatives`` (one per line; a newline inside parentheses or after
``|`` continues the rule), ``#`` comments, string literals and character classes ``[...]`` /
``[^...]`` with ranges and the escapes ``\\n \\r \\t \\\\ \\" \\[ \\] \\- \\^ \\xHH \\uHHHH
\\UHHHHHHHH``, ``.`` (any character), rule references, parentheses, and the postfix operators
``*``, ``+``, ``?``, ``{n}``, ``{m,}``, ``{m,n}``.

Limits: left recursion is detected (RecursionError), not handled; no token-level constructs
(``<[...]>``, ``!``); repetition counts are expanded breadth-first, so huge bounds on long
texts are slow. The parser is more lenient than llama.cpp's: it takes ``\\^`` (which
llama.cpp rejects as an unknown escape) and looser whitespace, so whether llama.cpp parses a
grammar is checked with llama.cpp itself.
"""

from __future__ import annotations

import re

_ESCAPES = dict(zip("nrt", "\n\r\t", strict=True)) | {c: c for c in '\\"[]-^'}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_BOUNDS = re.compile(r"\s*(\d+)\s*(,\s*(\d*)\s*)?}")

# Elements are tuples: ("lit", str) ("cls", negated, ((lo, hi), ...)) ("any",) ("ref", name)
# ("seq", (element, ...)) ("alt", (element, ...)) ("rep", element, min, max-or-None)


class Grammar:
    def __init__(self, text: str) -> None:
        self.src, self.i = text, 0
        self.rules: dict[str, tuple] = {}
        while self._space(newlines=True) < len(text):
            name = self._name()
            self._space(newlines=False)
            self._expect("::=")
            self._space(newlines=True)
            self.rules[name] = self._alternates(nested=False)
            if self._space(newlines=False) < len(text) and text[self.i] != "\n":
                raise ValueError(f"unexpected {text[self.i]!r} at offset {self.i}")
        missing = {r for body in self.rules.values() for r in _refs(body)} - set(self.rules)
        if missing or "root" not in self.rules:
            raise ValueError(f"undefined rules: {sorted(missing or {'root'})}")

    # -- parsing ---------------------------------------------------------------------------

    def _space(self, newlines: bool) -> int:
        s = self.src
        while self.i < len(s):
            if s[self.i] == "#":
                while self.i < len(s) and s[self.i] != "\n":
                    self.i += 1
            elif s[self.i] in " \t" or (newlines and s[self.i] in "\r\n"):
                self.i += 1
            else:
                break
        return self.i

    def _expect(self, token: str) -> None:
        if not self.src.startswith(token, self.i):
            raise ValueError(f"expected {token!r} at offset {self.i}")
        self.i += len(token)

    def _name(self) -> str:
        m = _NAME.match(self.src, self.i)
        if not m:
            raise ValueError(f"expected a rule name at offset {self.i}")
        self.i = m.end()
        return m.group()

    def _char(self) -> str:
        s, i = self.src, self.i
        if i >= len(s):
            raise ValueError("unexpected end of grammar")
        if s[i] != "\\":
            self.i += 1
            return s[i]
        c = s[i + 1 : i + 2]
        if c in _HEX_DIGITS:
            digits = s[i + 2 : i + 2 + _HEX_DIGITS[c]]
            self.i += 2 + len(digits)
            return chr(int(digits, 16))
        if c not in _ESCAPES:
            raise ValueError(f"unknown escape \\{c} at offset {i}")
        self.i += 2
        return _ESCAPES[c]

    def _alternates(self, nested: bool) -> tuple:
        alts = [self._sequence(nested)]
        while self.src.startswith("|", self.i):
            self.i += 1
            self._space(newlines=True)
            alts.append(self._sequence(nested))
        return alts[0] if len(alts) == 1 else ("alt", tuple(alts))

    def _sequence(self, nested: bool) -> tuple:
        items: list[tuple] = []
        s = self.src
        while self._space(nested) < len(s):
            c = s[self.i]
            if c == '"':
                self.i += 1
                chars = []
                while not s.startswith('"', self.i):
                    chars.append(self._char())
                self.i += 1
                items.append(("lit", "".join(chars)))
            elif c == "[":
                self.i += 1
                negated = s.startswith("^", self.i)
                self.i += negated
                ranges = []
                while not s.startswith("]", self.i):
                    lo = self._char()
                    if s[self.i] == "-" and s[self.i + 1] != "]":
                        self.i += 1
                        ranges.append((lo, self._char()))
                    else:
                        ranges.append((lo, lo))
                self.i += 1
                items.append(("cls", negated, tuple(ranges)))
            elif c == ".":
                self.i += 1
                items.append(("any",))
            elif c == "(":
                self.i += 1
                self._space(newlines=True)
                items.append(self._alternates(nested=True))
                self._space(newlines=True)
                self._expect(")")
            elif _NAME.match(c):
                items.append(("ref", self._name()))
            elif c in "*+?{" and items:
                items[-1] = ("rep", items[-1], *self._bounds())
            else:
                break
        return items[0] if len(items) == 1 else ("seq", tuple(items))

    def _bounds(self) -> tuple[int, int | None]:
        c = self.src[self.i]
        self.i += 1
        if c in "*+?":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        m = _BOUNDS.match(self.src, self.i)
        if not m:
            raise ValueError(f"bad repetition bounds at offset {self.i}")
        self.i = m.end()
        lo = int(m.group(1))
        return lo, (lo if m.group(2) is None else int(m.group(3)) if m.group(3) else None)

    # -- matching ----------------------------------------------------------------------------

    def accepts(self, text: str, start: str = "root") -> bool:
        """Whether the whole of ``text`` derives from rule ``start``."""
        memo: dict[tuple[int, int], frozenset[int]] = {}
        busy = object()

        def ends(el: tuple, pos: int) -> frozenset[int]:
            key = (id(el), pos)
            if key in memo:
                if memo[key] is busy:
                    raise RecursionError(f"left recursion through {el!r} at {pos}")
                return memo[key]
            memo[key] = busy  # type: ignore[assignment]
            kind = el[0]
            if kind == "lit":
                out = {pos + len(el[1])} if text.startswith(el[1], pos) else set()
            elif kind in ("cls", "any"):
                ok = pos < len(text) and (
                    kind == "any" or el[1] != any(lo <= text[pos] <= hi for lo, hi in el[2])
                )
                out = {pos + 1} if ok else set()
            elif kind == "ref":
                out = ends(self.rules[el[1]], pos)
            elif kind == "alt":
                out = {e for alt in el[1] for e in ends(alt, pos)}
            elif kind == "seq":
                out = {pos}
                for item in el[1]:
                    out = {e for p in out for e in ends(item, p)}
            else:  # rep: breadth-first over the repetition count
                _, item, lo, hi = el
                out, frontier, count = set(), {pos}, 0
                while frontier:
                    if count >= lo:
                        out |= frontier
                    if count == hi:
                        break
                    frontier = {e for p in frontier for e in ends(item, p)}
                    count += 1
                    if count >= lo:  # a position reached with fewer repeats dominates
                        frontier -= out
            memo[key] = frozenset(out)
            return memo[key]

        return len(text) in ends(self.rules[start], 0)


    def sentences(self, start: str = "root", limit: int = 100_000) -> set[str]:
        """Every string of a finite language (literals, sequences, alternatives, rule
        references and bounded repetitions only): the exhaustive oracle of a closed grammar.
        Raises ValueError past ``limit`` strings or on a class, ``.`` or an unbounded
        repetition."""

        def strings(el: tuple) -> set[str]:
            kind = el[0]
            if kind == "lit":
                out = {el[1]}
            elif kind == "ref":
                out = strings(self.rules[el[1]])
            elif kind == "alt":
                out = {s for alt in el[1] for s in strings(alt)}
            elif kind == "seq":
                out = {""}
                for item in el[1]:
                    tails = strings(item)
                    out = {a + b for a in out for b in tails}
                    if len(out) > limit:
                        raise ValueError(f"more than {limit} sentences")
            elif kind == "rep" and el[3] is not None:
                item = strings(el[1])
                out, layer = set(), {""}
                for count in range(el[3] + 1):
                    if count >= el[2]:
                        out |= layer
                    layer = {a + b for a in layer for b in item}
            else:
                raise ValueError(f"not a finite literal language: {el!r}")
            if len(out) > limit:
                raise ValueError(f"more than {limit} sentences")
            return out

        return strings(self.rules[start])


def _refs(el: tuple) -> set[str]:
    if el[0] == "ref":
        return {el[1]}
    if el[0] in ("seq", "alt"):
        return {r for sub in el[1] for r in _refs(sub)}
    return _refs(el[1]) if el[0] == "rep" else set()
