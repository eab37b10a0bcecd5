"""Reports: ``report.json`` (every metric and per-item outcome), ``report.md`` and PNG plots of
an evaluation folder, and the side-by-side comparison of two folders.

Reports name items by id only (never question or answer text), so they are safe for encrypted
benchmarks too.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from drvenus.eval.metrics import RunResult, summarize

log = logging.getLogger(__name__)

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
PLOTS = "plots"
DETERMINISTIC = {
    "qa": "exact match (token F1 reported)",
    "gaia": "GAIA normalised-match scorer",
    "browsecomp": "exact match (token F1 reported)",
    "hle": "exact match (token F1 reported)",
    "xbench": "normalised exact match",
    "deepsearchqa": "set-item matching (Set) / exact match (Single)",
    "hotpotqa": "HotpotQA's official exact match (its token F1 reported)",
}


def official_scoring(official: dict[str, Any], judge_model: str | None) -> str:
    """The one line naming an official grader: its title, source files and judge."""
    files = "; ".join(f"{f['repo']} @{f['commit'][:7]} {f['path']} sha256 {f['sha256'][:12]}"
                      for f in official.get("files") or [])
    where = files or official.get("source") or ""
    line = f"official grader: {official['title']}" + (f" ({where})" if where else "")
    if judge_model:
        line += f", judge {judge_model}"
        if official.get("official_judge_model"):
            line += f" (the official code uses {official['official_judge_model']})"
    return line


def build_report(
    manifest: dict[str, Any], results: Sequence[RunResult], grader: str, judge_model: str | None,
    official: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything a report shows, JSON-ready. ``official``: the official grader's description
    (``--grader official``: title, pinned files with commit and sha256, judge request, what
    differs), else the default grader (ours) graded."""
    expected = int(manifest.get("items", 0)) * int(manifest.get("runs", 0))
    if official is not None:
        scoring = official_scoring(official, judge_model)
    else:
        scoring = f"LLM judge ({judge_model})" if judge_model else (
            "no judge: deterministic " + DETERMINISTIC.get(grader, "exact match"))
    per_item: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(results, key=lambda r: (r.item_id, r.run)):
        per_item[r.item_id].append({
            "run": r.run, "correct": r.correct, "termination": r.termination, "turns": r.turns,
            "search_calls": r.search_calls, "visit_calls": r.visit_calls, "tokens": r.tokens,
            "seconds": round(r.elapsed, 3), "score": r.score, "method": r.grade.get("method"),
        })
    return {
        "benchmark": manifest.get("benchmark"),
        "model": manifest.get("model"),
        "agent": manifest.get("agent"),  # the settings the numbers depend on (eval.json's)
        "grader": grader,
        "grading": official or {"grader": "ours"},
        "scoring": scoring,
        "judge_model": judge_model,
        "complete": {"rows": len(results), "expected": expected},
        "metrics": summarize(results),
        "items": dict(per_item),
    }


def write_report(out: Path, report: dict[str, Any]) -> list[Path]:
    """Write report.json, report.md and the plots into ``out``; returns the paths written."""
    written = [out / REPORT_JSON]
    written[0].write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
    plots = write_plots(out / PLOTS, report)
    md = out / REPORT_MD
    md.write_text(render_markdown(report, [p.relative_to(out) for p in plots]), encoding="utf-8")
    return [*written, md, *plots]


def load_report(folder: Path) -> dict[str, Any]:
    path = folder / REPORT_JSON
    if not path.is_file():
        raise FileNotFoundError(f"no {REPORT_JSON} in {folder} (run drvenus eval there first)")
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------- markdown
def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _interval(ci: Sequence[float] | None) -> str:
    return "–" if not ci else f"{_pct(ci[0])} – {_pct(ci[1])}"


def _num_interval(ci: Sequence[float] | None) -> str:
    return "–" if not ci else f"{_num(ci[0], 3)} – {_num(ci[1], 3)}"


def _headline(m: dict[str, Any]) -> list[str]:
    pass_k = m["pass_at_k"]
    k = max(pass_k, key=int) if pass_k else None
    rows = [
        ("Avg@k (mean Pass@1 over runs)", f"{_pct(m['avg_at_k'])} ± {_pct(m['std_at_k'])}"),
        ("95% interval over items (Wilson)", _interval(m.get("ci95_items"))),
        ("Best Pass@1", _pct(m["best_pass_at_1"])),
        (f"Pass@{k}" if k else "Pass@k", _pct(pass_k[k]) if k else "–"),
        ("Majority vote", _pct(m["majority_vote"])),
        ("Mean score (F1)", _num(m["mean_score"], 3)),
        ("Judge errors (counted as wrong)", str(m["judge_errors"])),
    ]
    if m.get("failed_runs"):
        rows.append(("Failed runs (llm_error / tool_error / exception; counted as wrong)",
                     str(m["failed_runs"])))
    if m.get("no_verdict"):
        rows.append(("Replies without a verdict (wrong, as officially)", str(m["no_verdict"])))
    if m["calibration_error"] is not None:
        rows.append(("Calibration error (RMS, bins of 100)", _pct(m["calibration_error"])))
    if m["deepsearchqa"]:
        ds = m["deepsearchqa"]
        rows.append(("Set answers fully correct", _pct(ds["fully_correct"])))
        rows.append(("Set answers item F1", _num(ds["item_f1"], 3)))
    if m.get("deepsearchqa_official"):
        ds = m["deepsearchqa_official"]
        rows += [("Fully correct (starter)", _pct(ds["fully_correct"])),
                 ("Correct with excessive answers", _pct(ds["correct_with_excessive"])),
                 ("Fully incorrect", _pct(ds["fully_incorrect"])),
                 ("Precision / recall / F1", f"{_num(ds['precision'], 3)} / "
                  f"{_num(ds['recall'], 3)} / {_num(ds['f1'], 3)}")]
        rows += [(f"Fully correct, {kind} answers", _pct(v))
                 for kind, v in ds["fully_correct_by_type"].items()]
    if m.get("exact_f1"):
        ef = m["exact_f1"]
        rows += [("Exact match (EM), 95% interval",
                  f"{_pct(ef['em'])} ({_interval(ef['em_ci95'])})"),
                 ("F1, 95% interval",
                  f"{_num(ef['f1'], 3)} ({_num_interval(ef['f1_ci95'])})")]
    recall = m["recall"]
    if recall["visited"] is not None:
        rows.append(("Gold paragraph recall, visited", _pct(recall["visited"])))
        rows.append(("Gold paragraph recall, retrieved or visited", _pct(recall["retrieved"])))
    return ["| metric | value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]


def _cost_table(m: dict[str, Any]) -> list[str]:
    lines = ["| per question | all | correct only |", "|---|---|---|"]
    names = [("search_calls", "search calls"), ("visit_calls", "visit calls"),
             ("turns", "turns"), ("prompt_tokens", "prompt tokens"),
             ("completion_tokens", "completion tokens"), ("seconds", "seconds")]
    for key, label in names:
        lines.append(f"| {label} | {_num(m['cost_all'][key])} | {_num(m['cost_correct'][key])} |")
    return lines


def _grading_lines(grading: dict[str, Any]) -> list[str]:
    if grading.get("grader") != "official":
        return []
    lines = [f"- grader source: {f['repo']} @{f['commit']} `{f['path']}` sha256 `{f['sha256']}`"
             for f in grading.get("files") or []]
    if grading.get("source"):
        lines.append(f"- grader source: {grading['source']}")
    if grading.get("judge_request") is not None:
        request = ", ".join(f"{k}={v}" for k, v in grading["judge_request"].items())
        system = "; a system message" if grading.get("system_message") else ""
        lines.append(f"- judge request: {request or 'the model and messages only'}{system}")
    lines += [f"- differs from the official code: {d}" for d in grading.get("differs") or []]
    return lines


def _settings(agent: dict[str, Any]) -> str:
    """The agent settings of a report on one line: ``heavy 4 (vote) · context keep-last-k``."""
    parts = [f"{agent.get('max_steps')} steps", f"budget {agent.get('max_context_tokens')}",
             f"context {agent.get('context_strategy')}"]
    if agent.get("context_strategy") == "keep-last-k":
        parts[-1] += f" (keep {agent.get('keep_last')})"
    if (agent.get("heavy") or 1) > 1:
        parts.append(f"heavy {agent.get('heavy')} ({agent.get('heavy_mode')})")
    parts.append(f"KV cache {agent.get('kv_cache')}")
    return " · ".join(parts)


def render_markdown(report: dict[str, Any], plots: Sequence[Path] = ()) -> str:
    m = report["metrics"]
    done = report["complete"]
    lines = [
        f"# Evaluation: {report['benchmark']}",
        "",
        f"- model: {report.get('model') or 'unknown'}",
        *([f"- agent: {_settings(report['agent'])}"] if report.get("agent") else []),
        f"- scoring: {report['scoring']}",
        *_grading_lines(report.get("grading") or {}),
        f"- {m['items']} items × {m['runs']} runs; {done['rows']} of {done['expected']} "
        "(item, run) pairs done",
        "",
        *_headline(m),
        "",
        "## Per run",
        "",
        "| run | Pass@1 |",
        "|---|---|",
        *(f"| {run} | {_pct(v)} |" for run, v in m["per_run"].items()),
    ]
    if m["per_level"]:
        lines += ["", "## Per level", "", "| level | items | Avg@k | 95% interval |",
                  "|---|---|---|---|"]
        lines += [f"| {lv} | {v['n']} | {_pct(v['avg_at_k'])} | {_interval(v.get('ci95_items'))} |"
                  for lv, v in m["per_level"].items()]
    lines += ["", "## Cost", "", *_cost_table(m), "",
              f"Wall time: {_num(m['wall_seconds']['total'])} s of agent time in all, "
              f"median {_num(m['wall_seconds']['median'])} s per question.", "",
              "## Terminations", "", "| termination | rows |", "|---|---|"]
    lines += [f"| {t} | {n} |" for t, n in m["terminations"].items()]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.as_posix()})" for p in plots]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- plots
def write_plots(folder: Path, report: dict[str, Any]) -> list[Path]:
    """PNG plots: accuracy per run, the Pass@k curve, turn and tool-call histograms,
    terminations. Empty (with a warning) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'drvenus[plot]'): no plots")
        return []
    folder.mkdir(parents=True, exist_ok=True)
    m = report["metrics"]
    rows = [r for runs in report["items"].values() for r in runs]
    written = []
    for name, draw in (("accuracy_per_run", _plot_runs), ("pass_at_k", _plot_pass_at_k),
                       ("turns", _plot_turns), ("tool_calls", _plot_tools),
                       ("terminations", _plot_terminations)):
        fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
        draw(ax, m, rows)
        fig.tight_layout()
        path = folder / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def _plot_runs(ax: Any, m: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    runs = list(m["per_run"])
    values = [100 * (m["per_run"][r] or 0.0) for r in runs]
    ax.bar(runs, values, color="#4C72B0")
    if m["avg_at_k"] is not None:
        mean, std = 100 * m["avg_at_k"], 100 * m["std_at_k"]
        ax.axhline(mean, color="black", lw=1, label=f"Avg@k {mean:.1f}%")
        ax.axhspan(mean - std, mean + std, color="grey", alpha=0.2, label="± 1 std")
        ax.legend(loc="lower right")
    ax.set(title="Pass@1 per run", xlabel="run", ylabel="accuracy (%)", ylim=(0, 100))


def _plot_pass_at_k(ax: Any, m: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    ks = sorted(m["pass_at_k"], key=int)
    ax.plot([int(k) for k in ks], [100 * m["pass_at_k"][k] for k in ks], marker="o")
    ax.set(title="Pass@k (unbiased)", xlabel="k", ylabel="Pass@k (%)", ylim=(0, 100))
    ax.set_xticks([int(k) for k in ks] or [1])


def _hist(ax: Any, values: list[int], title: str, xlabel: str) -> None:
    top = max(values, default=0)
    ax.hist(values, bins=range(0, top + 2), color="#55A868", align="left", rwidth=0.8)
    ax.set(title=title, xlabel=xlabel, ylabel="(item, run) pairs")


def _plot_turns(ax: Any, m: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    _hist(ax, [r["turns"] for r in rows], "Turns per question", "assistant turns")


def _plot_tools(ax: Any, m: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    _hist(ax, [r["search_calls"] + r["visit_calls"] for r in rows], "Tool calls per question",
          "search + visit calls")


def _plot_terminations(ax: Any, m: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    names = list(m["terminations"])
    ax.barh(names, [m["terminations"][n] for n in names], color="#C44E52")
    ax.invert_yaxis()
    ax.set(title="Termination reasons", xlabel="(item, run) pairs")


# ---------------------------------------------------------------------------- compare
COMPARED = (
    ("Avg@k", "avg_at_k", True), ("Best Pass@1", "best_pass_at_1", True),
    ("Majority vote", "majority_vote", True), ("Mean score (F1)", "mean_score", False),
    ("Judge errors", "judge_errors", False),
)


def _item_rate(report: dict[str, Any]) -> dict[str, float]:
    rates = {}
    for item, runs in report["items"].items():
        graded = [r["correct"] for r in runs if r["correct"] is not None]
        if graded:
            rates[item] = sum(graded) / len(graded)
    return rates


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two reports side by side: their headline metrics and the items whose share of correct
    runs differs (``a_better`` / ``b_better``, with both shares)."""
    ma, mb = a["metrics"], b["metrics"]
    metrics = {key: {"a": ma.get(key), "b": mb.get(key)} for _, key, _ in COMPARED}
    for key in ("tool_calls", "tokens", "seconds"):
        metrics[key] = {"a": ma["cost_all"][key], "b": mb["cost_all"][key]}
    ra, rb = _item_rate(a), _item_rate(b)
    shared = sorted(set(ra) & set(rb))
    return {
        "a": {"benchmark": a["benchmark"], "model": a.get("model"), "scoring": a["scoring"]},
        "b": {"benchmark": b["benchmark"], "model": b.get("model"), "scoring": b["scoring"]},
        "metrics": metrics,
        "shared_items": len(shared),
        "a_better": {i: [ra[i], rb[i]] for i in shared if ra[i] > rb[i]},
        "b_better": {i: [ra[i], rb[i]] for i in shared if rb[i] > ra[i]},
        "only_a": sorted(set(ra) - set(rb)),
        "only_b": sorted(set(rb) - set(ra)),
    }


def render_comparison(diff: dict[str, Any], name_a: str = "A", name_b: str = "B") -> str:
    lines = [f"# {name_a} vs {name_b}", "",
             f"- A: {diff['a']['benchmark']} · {diff['a']['model']} · {diff['a']['scoring']}",
             f"- B: {diff['b']['benchmark']} · {diff['b']['model']} · {diff['b']['scoring']}",
             "", "| metric | A | B |", "|---|---|---|"]
    percent = {key for _, key, pct in COMPARED if pct}
    for key, pair in diff["metrics"].items():
        fmt = _pct if key in percent else _num
        lines.append(f"| {key} | {fmt(pair['a'])} | {fmt(pair['b'])} |")
    lines += ["", f"{diff['shared_items']} shared items; {len(diff['a_better'])} better in A, "
              f"{len(diff['b_better'])} better in B (share of correct runs).", ""]
    for label, key in (("Better in A", "a_better"), ("Better in B", "b_better")):
        if diff[key]:
            lines += [f"## {label}", "", "| item | A | B |", "|---|---|---|"]
            lines += [f"| {i} | {_pct(x)} | {_pct(y)} |" for i, (x, y) in diff[key].items()]
            lines.append("")
    return "\n".join(lines) + "\n"


__all__ = [
    "REPORT_JSON",
    "REPORT_MD",
    "build_report",
    "compare",
    "load_report",
    "render_comparison",
    "render_markdown",
    "write_plots",
    "write_report",
]
