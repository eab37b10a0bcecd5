"""Dataset statistics for ``drvenus data stats``: turn counts, tool usage, token lengths.

Token lengths use a ``tokenizer.json`` through the ``tokenizers`` package when both are
available; otherwise an estimate of one token per 4 characters (said so in the result).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drvenus.data.reading import DataInputError, open_cleaned_parquet
from drvenus.protocol.legacy import tool_call_objects

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4.0


@dataclass
class DatasetStats:
    rows: int = 0
    turns: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    tools: Counter = field(default_factory=Counter)
    token_method: str = "estimate (chars / 4)"

    def summary(self) -> dict[str, Any]:
        def dist(xs: list[int]) -> dict[str, float]:
            if not xs:
                return {}
            s = sorted(xs)

            def q(p: float) -> float:
                return float(s[min(len(s) - 1, int(p * len(s)))])

            return {"min": float(s[0]), "mean": sum(s) / len(s), "p50": q(0.5), "p90": q(0.9),
                    "max": float(s[-1])}

        return {"rows": self.rows, "turns": dist(self.turns), "tokens": dist(self.tokens),
                "token_method": self.token_method, "tools": dict(self.tools.most_common())}


def _token_counter(tokenizer: Path | None):
    if tokenizer is None:
        return None, "estimate (chars / 4)"
    try:
        from tokenizers import Tokenizer  # type: ignore[import-not-found]
    except ImportError:
        log.warning("the 'tokenizers' package is not installed; estimating tokens as chars / 4")
        return None, "estimate (chars / 4): install 'tokenizers' for exact counts"
    try:
        tok = Tokenizer.from_file(str(tokenizer))
    except Exception as exc:  # tokenizers raises plain Exception
        raise DataInputError(f"{tokenizer}: cannot load the tokenizer ({exc})") from None
    return (lambda text: len(tok.encode(text).ids)), f"tokenizer {tokenizer.name}"


def compute_stats(path: Path, tokenizer: Path | None = None) -> DatasetStats:
    """Stream a cleaned parquet and collect per-row turns, tokens and tool-call counts."""
    pf = open_cleaned_parquet(path)
    count, method = _token_counter(tokenizer)
    st = DatasetStats(token_method=method)
    for batch in pf.iter_batches(batch_size=256, columns=["messages"]):
        for msgs in batch.column(0).to_pylist():
            msgs = msgs or []
            st.rows += 1
            st.turns.append(max(len(msgs) - 1, 0) // 2)
            text = "".join((m.get("content") or "") for m in msgs)
            st.tokens.append(count(text) if count else int(len(text) / CHARS_PER_TOKEN))
            for m in msgs:
                if m.get("role") == "assistant":
                    for c in tool_call_objects(m.get("content")):
                        if isinstance(c.get("name"), str):
                            st.tools[c["name"]] += 1
    return st


def plot_stats(st: DatasetStats, out_png: Path) -> Path:
    """One PNG with three panels: turn histogram, tool usage, token-length histogram."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].hist(st.turns, bins=30, color="#4477aa")
    axes[0].set(title="Turns per trajectory", xlabel="turns", ylabel="rows")
    names = [n for n, _ in st.tools.most_common()]
    axes[1].bar(names, [st.tools[n] for n in names], color="#66ccee")
    axes[1].set(title="Tool calls", ylabel="calls")
    axes[2].hist(st.tokens, bins=30, color="#228833")
    axes[2].set(title=f"Tokens per trajectory ({st.token_method})", xlabel="tokens")
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png
