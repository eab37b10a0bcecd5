"""Time to tokenise the shared DR-Venus trajectories with assistant masks: ours versus the
common approach of re-tokenising every prefix (tokenise ``messages[:i]`` with the generation
prompt and ``messages[:i+1]`` for every assistant turn, as many SFT scripts derive masks).

Both use the embedded SmolLM2 tokenizer (from its GGUF) at full length; both must produce the
same masks. Then the share of real (non-padding) tokens at a few max lengths, one row per
sequence versus packed. Usage: ``python benchmarks/bench_sft_tokenize.py [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from transformers import AutoTokenizer

from drvenus.llm.embedded import embedded_model_path
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pack-lengths", type=int, nargs="*", default=[32768, 65536, 131072])
    args = parser.parse_args()
    gguf = embedded_model_path(Path(tempfile.gettempdir()) / "drvenus-test-models")
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    rows = [json.loads(p.read_text())["messages"] for p in sorted(SHARED.glob("*.json"))]
    times: dict[str, float] = {}
    for name, fn in (
        ("ours", lambda m: tokenize_conversation(m, tok)),
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
        else:
            same = all(
                o.input_ids == ids and o.loss_mask == mask
                for o, (ids, mask) in zip(ours, out, strict=True)
            )
    tokens = sum(len(o) for o in ours)
    turns = sum(1 for m in rows for x in m if x["role"] == "assistant")
    base = times["re-tokenise every prefix"]
    print(f"{len(rows)} trajectories, {tokens:,} tokens, {turns} assistant turns; same: {same}")
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
