"""Time to tokenise the shared DR-Venus trajectories with assistant masks: ours versus two
baselines users run:

- **verl-style** (the baseline): the way verl's multi-turn SFT dataset, DR-Venus's SFT loader,
  builds a row: each message rendered through the chat template and tokenised on its own, the
  template's default system prompt cut from every message but the first, the assistant's
  generation prompt left out of the loss, then the whole conversation tokenised once to check
  the ids agree. Its mask also trains the newline after each assistant end-of-turn (ours stops
  at the end-of-turn token), so masks are compared up to those newlines;
- re-tokenising every prefix (tokenise ``messages[:i]`` with the generation prompt and
  ``messages[:i+1]`` for every assistant turn, as many SFT scripts derive masks): same masks.

All use the embedded SmolLM2 tokenizer (from its GGUF) at full length. Then the share of real
(non-padding) tokens at a few max lengths, one row per sequence versus packed.

``--long 100000 200000 400000`` measures single long rows instead (DR-Venus trains on rows of
200 turns and 200K+ tokens): the first trajectory's system prompt and question, then the
trajectories' (assistant, tool response) turns in order, repeated until the row holds the
target number of tokens. There the baselines are the per-message method above and verl 0.5's
multi-turn SFT dataset (which DR-Venus's verl vendors): for every message it renders the
conversation up to it, up to the one before it, and (for an assistant message) that one with
the generation prompt, and tokenises the difference; then the whole row once as a check. Ours
is also timed on its exact path (every prefix rendered), which it falls back to only for
templates that cannot be split. Growth is each method's time at a size over its time at the
smallest size. Usage: ``python benchmarks/bench_sft_tokenize.py [--repeat 3]`` (smallest:
``--repeat 1 --rows 1 --messages 12 --pack-lengths 4096``; long rows, smallest:
``--repeat 1 --long 20000 40000``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from transformers import AutoTokenizer

from _embedded_tokenizer import embedded_tokenizer_dir
from drvenus.train.sft import tokenize_conversation
from drvenus.train.sft.pack import pack_rows, padding_efficiency
from drvenus.train.sft.tokenize import _mask, prefix_spans, tokenize_text
from drvenus.train.templates import end_of_turn_ids

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "trajectories" / "dr-venus-sft"


def naive_mask(messages: list[dict], tok) -> tuple[list[int], list[int]]:
    """Token-count boundaries from re-tokenising each prefix (the baseline)."""
    def ids(msgs: list[dict], generation: bool) -> list[int]:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation)
        return tok(text, add_special_tokens=False)["input_ids"]

    full = ids(messages, False)
    mask = [0] * len(full)
    end_ids = end_of_turn_ids(tok)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(ids(messages[:i], True))
        end = len(ids(messages[: i + 1], False))
        last = max(k for k in range(start, end) if full[k] in end_ids)
        for k in range(start, last + 1):
            mask[k] = 1
    return full, mask


def verl_style_mask(messages: list[dict], tok) -> tuple[list[int], list[int]]:
    """verl's method (see the module doc): per-message templates, then one check of the whole."""
    def ids(msgs: list[dict], generation: bool = False) -> list[int]:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation)
        return tok(text, add_special_tokens=False)["input_ids"]

    probe = [{"role": "user", "content": "x"}]
    alone = ids(probe)
    system = alone[: len(alone) - len(tok("<|im_start|>user\nx<|im_end|>\n",
                                           add_special_tokens=False)["input_ids"])]
    generation = ids(probe, True)[len(alone):]
    input_ids: list[int] = []
    mask: list[int] = []
    for i, message in enumerate(messages):
        part = ids([message])
        if i and message["role"] != "system":
            part = part[len(system):]
        input_ids += part
        if message["role"] == "assistant":
            mask += [0] * len(generation) + [1] * (len(part) - len(generation))
        else:
            mask += [0] * len(part)
    if input_ids != ids(messages):  # verl's sanity check: the whole conversation, once
        raise AssertionError("per-message tokens differ from the whole conversation's")
    return input_ids, mask


def verl05_mask(messages: list[dict], tok) -> tuple[list[int], list[int]]:
    """verl 0.5's multi-turn SFT dataset (see the module doc): three renderings per assistant
    message and two per other message, each of the conversation so far."""
    def text(msgs: list[dict], generation: bool = False) -> str:
        return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation)

    def encode(piece: str) -> list[int]:
        return tok.encode(piece, add_special_tokens=False)

    input_ids: list[int] = []
    mask: list[int] = []
    for i, message in enumerate(messages):
        before = text(messages[:i]) if i else ""
        upto = text(messages[: i + 1])
        if message["role"] == "assistant":
            prompted = text(messages[:i], True) if i else ""
            prompt = encode(prompted[len(before):])
            reply = encode(upto[len(prompted):])
            input_ids += prompt + reply
            mask += [0] * len(prompt) + [1] * len(reply)
        else:
            part = encode(upto[len(before):])
            input_ids += part
            mask += [0] * len(part)
    if input_ids != encode(text(messages)):  # its check: the whole conversation, once
        raise AssertionError("per-message tokens differ from the whole conversation's")
    return input_ids, mask


def exact_path(messages: list[dict], tok) -> tuple[list[int], list[int]]:
    """Ours on its exact path (the fallback): every prefix rendered."""
    full, spans = prefix_spans(messages, tok)
    ids, offsets = tokenize_text(tok, full, end_of_turn_ids(tok))
    return ids, _mask(ids, offsets, spans, end_of_turn_ids(tok))[0]


def long_row(rows: list[list[dict]], tok, tokens: int) -> list[dict]:
    """The first row's system prompt and question, then every row's later turns in order, again
    and again, until the row holds ``tokens`` tokens (message contents counted, the template's
    few markers not)."""
    turns = [m for r in rows for m in r[2:]]
    sizes = [len(tok.encode(m["content"], add_special_tokens=False)) for m in turns]
    row, total, k = list(rows[0][:2]), 0, 0
    while total < tokens or row[-1]["role"] != "assistant":
        row.append(turns[k % len(turns)])
        total += sizes[k % len(turns)]
        k += 1
    return row


def _best(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def long_rows(rows: list[list[dict]], tok, sizes: list[int], repeat: int) -> None:
    newline = set(tok("\n", add_special_tokens=False)["input_ids"])
    methods = {
        "ours (windows, pieces)": lambda m: tokenize_conversation(m, tok),
        "ours, exact path (every prefix)": lambda m: exact_path(m, tok),
        "per-message (baseline)": lambda m: verl_style_mask(m, tok),
        "verl 0.5 multi-turn dataset": lambda m: verl05_mask(m, tok),
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    print(f"| row | method | seconds (best of {repeat}) | tokens/s | vs per-message |")
    print("|---|---|---|---|---|")
    for size in sizes:
        row = long_row(rows, tok, size)
        results = {}
        for name, fn in methods.items():
            seconds, results[name] = _best(lambda fn=fn, row=row: fn(row), repeat)
            times[name].append(seconds)
        ours = results["ours (windows, pieces)"]
        exact = results["ours, exact path (every prefix)"]
        same = {"exact": (ours.input_ids, ours.loss_mask) == exact,
                **{name: _same_up_to_newlines(ours, *results[name], newline)
                   for name in ("per-message (baseline)", "verl 0.5 multi-turn dataset")}}
        turns = sum(m["role"] == "assistant" for m in row)
        base = times["per-message (baseline)"][-1]
        label = f"{len(ours):,} tokens, {turns} turns"
        for name in methods:
            t = times[name][-1]
            print(f"| {label} | {name} | {t:.3f} | {len(ours) / t:,.0f} | {base / t:.2f}x |")
        print(f"<!-- same ids and masks as ours: {same} -->")
    print()
    print("| method | " + " | ".join(f"{s // 1000}K / {sizes[0] // 1000}K" for s in sizes[1:])
          + f" | {sizes[-1] // 1000}K / ({sizes[-1] // sizes[0]} x {sizes[0] // 1000}K) |")
    print("|---|" + "---|" * len(sizes))
    for name, ts in times.items():
        growth = " | ".join(f"{t / ts[0]:.2f}x" for t in ts[1:])
        scale = sizes[-1] / sizes[0]
        print(f"| {name} | {growth} | {ts[-1] / (scale * ts[0]):.2f} |")


def _same_up_to_newlines(ours, ids: list[int], mask: list[int], newline: set[int]) -> bool:
    if ours.input_ids != ids:
        return False
    return all(a == b or (b and not a and t in newline)
               for a, b, t in zip(ours.loss_mask, mask, ids, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pack-lengths", type=int, nargs="*", default=[32768, 65536, 131072])
    parser.add_argument("--rows", type=int, default=None,
                        help="only the first N trajectories (default: all)")
    parser.add_argument("--messages", type=int, default=None,
                        help="only the first N messages of each trajectory (default: all)")
    parser.add_argument("--long", type=int, nargs="*", default=None, metavar="TOKENS",
                        help="time single long rows of these sizes instead (e.g. 100000 200000 "
                        "400000)")
    args = parser.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"shared trajectories not found: {SHARED}")
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    rows = [json.loads(p.read_text())["messages"][: args.messages]
            for p in sorted(SHARED.glob("*.json"))[: args.rows]]
    if args.long:
        long_rows(rows, tok, sorted(args.long), args.repeat)
        return
    times: dict[str, float] = {}
    newline = set(tok("\n", add_special_tokens=False)["input_ids"])
    same: dict[str, bool] = {}
    for name, fn in (
        ("ours", lambda m: tokenize_conversation(m, tok)),
        ("verl-style (baseline)", lambda m: verl_style_mask(m, tok)),
        ("re-tokenise every prefix", lambda m: naive_mask(m, tok)),
    ):
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            out = [fn(m) for m in rows]
            best = min(best, time.perf_counter() - start)
        times[name] = best
        if name == "ours":
            ours = out
        elif name.startswith("verl"):
            same[name] = all(_same_up_to_newlines(o, ids, mask, newline)
                             for o, (ids, mask) in zip(ours, out, strict=True))
        else:
            same[name] = all(o.input_ids == ids and o.loss_mask == mask
                             for o, (ids, mask) in zip(ours, out, strict=True))
    tokens = sum(len(o) for o in ours)
    turns = sum(1 for m in rows for x in m if x["role"] == "assistant")
    base = times["verl-style (baseline)"]
    print(f"{len(rows)} trajectories, {tokens:,} tokens, {turns} assistant turns; same ids and "
          f"masks: {same}")
    print(f"| method | seconds (best of {args.repeat}) | tokens/s | vs baseline |")
    print("|---|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {t:.3f} | {tokens / t:,.0f} | {base / t:.1f}x |")
    print()
    print("| max length | rows (truncated) | sequences one row each / packed | real tokens: "
          "one row each / packed |")
    print("|---|---|---|---|")
    for limit in args.pack_lengths:
        cut = [tokenize_conversation(m, tok, limit) for m in rows]
        packed = list(pack_rows(cut, limit))
        single = padding_efficiency([len(r) for r in cut], limit)
        dense = padding_efficiency([len(p) for p in packed], limit)
        truncated = sum(r.truncated for r in cut)
        print(f"| {limit:,} | {len(cut)} ({truncated}) | {len(cut)} / {len(packed)} | "
              f"{single:.1%} / {dense:.1%} |")


if __name__ == "__main__":
    main()
