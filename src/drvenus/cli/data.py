"""``drvenus data``: turn runs into trajectories, clean, export and inspect SFT data.

The options of ``data clean`` are the fields of :class:`~drvenus.data.options.CleanOptions` (and
of its nested :class:`~drvenus.data.resample.ResamplePolicy` and
:class:`~drvenus.grading.judge.JudgeConfig`). Bad input (missing or unreadable files, wrong columns,
invalid option values) is one line on stderr and exit code 2; Ctrl-C during ``data clean``
writes nothing and exits 130.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from drvenus.cli.common import INTERRUPTED, CheckedGroup, err, fail, out, with_options
from drvenus.data.export import EXPORT_FORMATS
from drvenus.data.options import CleanOptions
from drvenus.data.resample import ResamplePolicy
from drvenus.grading.judge import JudgeConfig
from drvenus.signals import stopped_by

data_app = typer.Typer(
    cls=CheckedGroup,
    name="data",
    help="SFT data pipeline: from-runs, clean (DR-Venus compatible), export, stats.",
    no_args_is_help=True,
    add_completion=False,
)


def _clean_options(values: dict[str, Any]) -> CleanOptions:
    """The validated options of one ``data clean`` command line (exit 2 when invalid).
    Unset options (None) take the field defaults; the judge endpoint and model may come from
    the environment."""
    def given(group: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in group.items() if v is not None}

    judge, policy = values.pop("judge"), given(values.pop("policy"))
    try:
        return CleanOptions(
            **given(values),
            policy=ResamplePolicy(**policy),
            judge=JudgeConfig.from_values(judge),
        )
    except ValueError as exc:  # pydantic's ValidationError, named by its flag
        raise fail(exc) from None


def _run_with_progress(opts: CleanOptions) -> dict[str, Any]:
    from drvenus.data.pipeline import run_clean

    with Progress(
        TextColumn("cleaning"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task("clean", total=None)

        def progress(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        return run_clean(opts, progress)


def _print_clean_summary(stats: dict[str, Any]) -> None:
    table = Table(title="drvenus data clean")
    table.add_column("stage")
    table.add_column("rows", justify="right")
    for k, v in stats["rows"].items():
        table.add_row(k, str(v))
    err.print(table)
    if stats["drop_reasons"]:
        err.print("dropped: " + ", ".join(f"{k}={v}" for k, v in stats["drop_reasons"].items()))
    if stats["unexpected_errors"]:
        err.print(f"[yellow]unexpected errors[/yellow] (rows dropped by a bug, see the log): "
                  f"{stats['unexpected_errors']}")
    err.print(f"correctness: {stats['correctness']['mode']}")
    for name, problem in stats["file_errors"].items():
        err.print(f"[yellow]unreadable file[/yellow] {name}: {escape(problem)}")
    err.print(f"wrote {stats['artifacts']['final_parquet']}")


@data_app.command("clean")
@with_options("opts", CleanOptions, into=_clean_options)
def clean(*, opts: CleanOptions) -> None:
    """Normalise, prune, dedup, validate, filter by correctness and resample trajectories."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        stats = _run_with_progress(opts)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (drvenus.signals): workers stopped first
        err.print(f"[yellow]{stopped_by()}[/yellow]: no output written")
        raise typer.Exit(INTERRUPTED) from None
    except (ValueError, OSError) as exc:
        raise fail(exc) from None
    _print_clean_summary(stats)


@data_app.command("from-runs")
def from_runs(
    results: Annotated[list[Path], typer.Argument(
        help="Results of drvenus run / eval (results.jsonl), DR-Venus's inference output, "
             "or trace files (--trace); folders: their .jsonl / .json files.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output folder.")],
    gold: Annotated[Path | None, typer.Option(
        help="A question file with answers (as drvenus run reads), for runs whose rows have "
             "no gold answer; matched by question text or id.")] = None,
    forced: Annotated[bool, typer.Option(
        help="Keep answers forced by the step or context limit too.")] = False,
) -> None:
    """Your own runs as raw SFT trajectories for data clean (rejection sampling)."""
    from drvenus.data.from_runs import TRAJECTORIES
    from drvenus.data.from_runs import from_runs as convert

    try:
        report = convert(results, output, gold=gold, forced=forced)
    except (ValueError, OSError) as exc:
        raise fail(exc) from None
    skipped = ", ".join(f"{k}={v}" for k, v in sorted(report.skipped.items())) or "none"
    err.print(f"{report.runs} runs in {report.files} file(s): wrote {report.written} "
              f"trajectories to {output / TRAJECTORIES}; skipped: {skipped}")
    if report.ignored:
        err.print(f"[yellow]left out {report.ignored} file(s) of earlier from-runs output[/yellow] "
                  "in the input folders (never read back)")
    if not report.written:
        err.print("[yellow]no trajectory written[/yellow]: runs need their own final answer "
                  "and a gold answer (in the row, or --gold)")


@data_app.command()
def export(
    input: Annotated[Path, typer.Option("--input", "-i", help="cleaned_resampled.parquet")],
    format: Annotated[str, typer.Option("--format", "-f", help=" | ".join(EXPORT_FORMATS))],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output file (folder for hf).")],
    name: Annotated[
        str, typer.Option(help="Dataset name (verl data_source, hf card).")
    ] = "drvenus-sft",
) -> None:
    """Export a cleaned parquet for verl, ShareGPT/LLaMA-Factory, ms-swift or HF datasets."""
    from drvenus.data.export import export_dataset

    try:
        n = export_dataset(input, format, output, name=name)
    except (ValueError, OSError) as exc:
        raise fail(exc) from None
    err.print(f"exported {n} rows as {format} to {output}")


@data_app.command()
def stats(
    input: Annotated[Path, typer.Option("--input", "-i", help="A cleaned parquet.")],
    tokenizer: Annotated[
        Path | None, typer.Option(help="tokenizer.json for exact token counts.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG (turns, tools, tokens) here.")
    ] = None,
) -> None:
    """Print turn, tool and token statistics of a cleaned parquet; optionally plot them."""
    from drvenus.data.insight import compute_stats, plot_stats

    try:
        st = compute_stats(input, tokenizer)
    except (ValueError, OSError) as exc:
        raise fail(exc) from None
    s = st.summary()
    table = Table(title=f"{input.name}: {s['rows']} rows")
    table.add_column("metric")
    for col in ("min", "mean", "p50", "p90", "max"):
        table.add_column(col, justify="right")
    for metric in ("turns", "tokens"):
        d = s[metric]
        table.add_row(metric, *(f"{d.get(c, 0):.1f}" for c in ("min", "mean", "p50", "p90", "max")))
    out.print(table)
    tools = Table(title="tool calls")
    tools.add_column("tool")
    tools.add_column("calls", justify="right")
    for k, v in s["tools"].items():
        tools.add_row(k, str(v))
    out.print(tools)
    err.print(f"tokens: {s['token_method']}")
    if plot is not None:
        try:
            err.print(f"plot written to {plot_stats(st, plot)}")
        except ImportError:
            raise fail('plotting needs matplotlib: pip install "drvenus[plot]"') from None
        except (ValueError, OSError) as exc:
            raise fail(exc) from None


__all__ = ["data_app"]
