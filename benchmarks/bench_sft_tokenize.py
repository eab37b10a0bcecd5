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
(non-padding) tokens at a few max lengths, one row per sequence versus packed. Usage:
``python benchmarks/bench_sft_tokenize.py [--repeat 3]`` (smallest: ``--repeat 1 --rows 1
--messages 12 --pack-lengths 4096``).
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
    args = parser.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"shared trajectories not found: {SHARED}")
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    rows = [json.loads(p.read_text())["messages"][: args.messages]
            for p in sorted(SHARED.glob("*.json"))[: args.rows]]
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
