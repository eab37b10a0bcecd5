"""The embedded agent's turn grammars on the natural dev questions do not change by accident.

For every question of ``recipes/embedded/natural/dev.jsonl`` this builds the grammars the
embedded backend decodes with: the first turn (a search, ``min_searches``), and, after that
search has run on the real built-in corpus through the real toolbox, the next turn (any kind)
and a forced answer. Their SHA-256s were recorded in ``fixtures/natural_dev_grammars.json``
before the answering policy moved out of ``protocol/`` (issue 41); the move must leave every
one of them as it was. A fresh index of the built-in corpus is not bit-stable from one process
to the next (a few results of a few questions change places: 10 of 270 in three runs), so a
question's grammars are compared where its search response is the recorded one (its SHA-256 is
in the fixture too), and nearly all of them must be. Rewrite the fixture, after a change that
means to alter the grammars, with ``python tests/test_natural_dev_grammars.py --write``.
Rewritten twice since the move: the first search's grammar admits no thought (its query is the
question's words, so the grammar fixes the turn and it is written without the model); and the
``choice_compare`` lever, for comparison questions only: the answer is the choice the years or
amounts read make, or the next turn searches for the choice none was read for.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from pathlib import Path

from drvenus import protocol
from drvenus.config import load_settings
from drvenus.protocol.state import TurnState
from drvenus.small.grammar import turn_grammar
from drvenus.small.levers import EMBEDDED_LEVERS
from drvenus.small.spans import question_query
from drvenus.stack import build_toolbox

# the embedded preset's levers with the linear reader: these tests read the spans a grammar
# admits, which the linear reader's language lists (the neural one admits its best spans only)
LINEAR_LEVERS = EMBEDDED_LEVERS.but(span_reader="linear", span_rerank=0)

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT / "recipes" / "embedded" / "natural" / "dev.jsonl"
FIXTURE = Path(__file__).with_name("fixtures") / "natural_dev_grammars.json"
SYSTEM = protocol.build_system_prompt("2025-01-01")


def _digest(grammar: str) -> str:
    return hashlib.sha256(grammar.encode("utf-8")).hexdigest()[:16]


def _grammar(kind: str, messages: list[dict[str, str]]) -> str:
    return turn_grammar(kind, TurnState.of(messages), LINEAR_LEVERS)


async def _digests() -> dict[str, dict[str, str]]:
    tools = build_toolbox(load_settings(search="local", visit="local"))
    out: dict[str, dict[str, str]] = {}
    try:
        for line in DEV.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            messages = protocol.initial_messages(row["question"], SYSTEM)
            first = _grammar("search", messages)
            call = protocol.ToolCall(protocol.SEARCH, {"query": [question_query(row["question"])]})
            turn = ("<think>\n\n</think>\n<tool_call>\n"
                    + json.dumps({"name": call.name, "arguments": call.arguments},
                                 ensure_ascii=False) + "\n</tool_call>")
            body = await tools.call(call)
            later = [*messages, {"role": "assistant", "content": turn},
                     {"role": "user", "content": protocol.wrap_tool_response(body)}]
            out[row["id"]] = {"search": _digest(first), "read": _digest(body),
                              "any": _digest(_grammar("any", later)),
                              "answer": _digest(_grammar("answer", later))}
    finally:
        await tools.aclose()
    return out


def test_natural_dev_grammars_are_unchanged():
    expected = json.loads(FIXTURE.read_text(encoding="utf-8"))
    got = asyncio.run(_digests())
    assert set(got) == set(expected)
    assert all(got[k]["search"] == expected[k]["search"] for k in expected)
    same = [k for k in expected if got[k]["read"] == expected[k]["read"]]
    assert len(same) >= 0.9 * len(expected), f"{len(expected) - len(same)} searches changed"
    changed = sorted(k for k in same if got[k] != expected[k])
    assert not changed, changed[:10]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    FIXTURE.write_text(json.dumps(asyncio.run(_digests()), indent=0, sort_keys=True) + "\n",
                       encoding="utf-8")
