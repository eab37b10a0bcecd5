"""``drvenus data``: clean, export and inspect SFT trajectory data (mounted by drvenus.cli)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from drvenus.data.export import EXPORT_FORMATS, export_dataset
from drvenus.data.insight import compute_stats, plot_stats
from drvenus.data.judge import JudgeConfig
from drvenus.data.pipeline import CleanOptions, NothingReadError, run_clean
from drvenus.data.stages import ResamplePolicy

data_app = typer.Typer(
    name="data",
    help="SFT data pipeline: clean (DR-Venus compatible), export, stats.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console(stderr=True)


@data_app.command()
def clean(
    input: Annotated[Path, typer.Option("--input", "-i", help="Parquet/JSONL file or directory.")],
    output_dir: Annotated[Path, typer.Option("--output-dir", "-o", help="Output directory.")],
    file_pattern: Annotated[
        str, typer.Option(help="Glob when --input is a directory.")
    ] = "train-*.parquet",
    system_prompt_mode: Annotated[str, typer.Option(help="template | row")] = "template",
    current_date: Annotated[
        str | None, typer.Option(help="YYYY-MM-DD for the system prompt (default today).")
    ] = None,
    system_prompt_file: Annotated[
        Path | None, typer.Option(help="Use this file verbatim as the system prompt.")
    ] = None,
    allowed_tools: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-tools", help="Tools to keep, repeated or comma-separated (search,visit)."
        ),
    ] = None,
    correctness: Annotated[
        str | None,
        typer.Option(
            help="off | em | f1 | judge (default: judge if a judge is configured, else f1)."
        ),
    ] = None,
    f1_threshold: Annotated[
        float, typer.Option(help="Keep rows with answer F1 >= this (f1 mode).")
    ] = 0.5,
    judge_base_url: Annotated[
        str | None,
        typer.Option(help="OpenAI-compatible base URL (…/v1); env DRVENUS_JUDGE_BASE_URL."),
    ] = None,
    judge_model: Annotated[
        str | None, typer.Option(help="Judge model name; env DRVENUS_JUDGE_MODEL.")
    ] = None,
    judge_concurrency: Annotated[int, typer.Option(help="Concurrent judge requests.")] = 16,
    judge_retries: Annotated[int, typer.Option(help="Retries per judge request.")] = 3,
    judge_timeout: Annotated[float, typer.Option(help="Seconds per judge request.")] = 60.0,
    judge_cache: Annotated[
        Path | None,
        typer.Option(help="SQLite verdict cache (default <output-dir>/judge_cache.sqlite)."),
    ] = None,
    keep_judge_failures: Annotated[
        bool,
        typer.Option(
            help="Keep rows whose judge call failed (default: drop them, counted as judge_failed)."
        ),
    ] = False,
    strict_format: Annotated[
        bool,
        typer.Option(
            help="Also drop rows whose assistant turns fail the protocol's strict format check."
        ),
    ] = False,
    short_max_turns: Annotated[int, typer.Option()] = 50,
    medium_max_turns: Annotated[int, typer.Option()] = 100,
    short_multiplier: Annotated[int, typer.Option()] = 1,
    medium_multiplier: Annotated[int, typer.Option()] = 2,
    long_multiplier: Annotated[int, typer.Option()] = 5,
    shuffle: Annotated[
        bool, typer.Option(help="Shuffle the resampled rows (as DR-Venus).")
    ] = False,
    seed: Annotated[int, typer.Option()] = 42,
    keep_intermediate: Annotated[
        bool, typer.Option(help="Write stage1/stage2 parquet files.")
    ] = False,
    keep_metadata: Annotated[
        bool,
        typer.Option(
            help="Keep _source_file/_source_row/_turns/_resample_multiplier/_sample_copy columns."
        ),
    ] = False,
    write_jsonl: Annotated[bool, typer.Option(help="Also write cleaned_resampled.jsonl.")] = False,
    workers: Annotated[
        int | None, typer.Option(help="Worker processes (default: CPU cores).")
    ] = None,
    chunk_rows: Annotated[int, typer.Option(help="Rows per work chunk.")] = 32,
) -> None:
    """Normalise, prune, dedup, validate, filter by correctness and resample trajectories."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    judge = JudgeConfig.from_options(
        judge_base_url,
        judge_model,
        concurrency=judge_concurrency,
        retries=judge_retries,
        timeout_s=judge_timeout,
        cache_path=judge_cache,
    )
    opts = CleanOptions(
        input=input,
        output_dir=output_dir,
        file_pattern=file_pattern,
        system_prompt_mode=system_prompt_mode,
        current_date=current_date,
        system_prompt_file=system_prompt_file,
        allowed_tools=tuple(
            t.strip() for item in (allowed_tools or ["search,visit"]) for t in item.split(",")
            if t.strip()
        ),
        policy=ResamplePolicy(
            short_max_turns, medium_max_turns, short_multiplier, medium_multiplier, long_multiplier
        ),
        correctness=correctness,
        f1_threshold=f1_threshold,
        judge=judge,
        keep_judge_failures=keep_judge_failures,
        strict_format=strict_format,
        shuffle=shuffle,
        seed=seed,
        keep_intermediate=keep_intermediate,
        keep_metadata=keep_metadata,
        write_jsonl=write_jsonl,
        workers=workers,
        chunk_rows=chunk_rows,
    )
    try:
        with Progress(
            TextColumn("cleaning"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as bar:
            task = bar.add_task("clean", total=None)

            def progress(done: int, total: int | None) -> None:
                bar.update(task, completed=done, total=total)

            stats = run_clean(opts, progress)
    except (NothingReadError, ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    table = Table(title="drvenus data clean")
    table.add_column("stage")
    table.add_column("rows", justify="right")
    for k, v in stats["rows"].items():
        table.add_row(k, str(v))
    console.print(table)
    if stats["drop_reasons"]:
        console.print("dropped: " + ", ".join(f"{k}={v}" for k, v in stats["drop_reasons"].items()))
    console.print(f"correctness: {stats['correctness']['mode']}")
    for name, err in stats["file_errors"].items():
        console.print(f"[yellow]unreadable file[/yellow] {name}: {err}")
    console.print(f"wrote {stats['artifacts']['final_parquet']}")


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
    try:
        n = export_dataset(input, format, output, name=name)
    except (ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    console.print(f"exported {n} rows as {format} to {output}")


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
    try:
        st = compute_stats(input, tokenizer)
    except (ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    s = st.summary()
    table = Table(title=f"{input.name}: {s['rows']} rows")
    table.add_column("metric")
    for col in ("min", "mean", "p50", "p90", "max"):
        table.add_column(col, justify="right")
    for metric in ("turns", "tokens"):
        d = s[metric]
        table.add_row(metric, *(f"{d.get(c, 0):.1f}" for c in ("min", "mean", "p50", "p90", "max")))
    Console().print(table)
    tools = Table(title="tool calls")
    tools.add_column("tool")
    tools.add_column("calls", justify="right")
    for k, v in s["tools"].items():
        tools.add_row(k, str(v))
    Console().print(tools)
    console.print(f"tokens: {s['token_method']}")
    if plot is not None:
        try:
            console.print(f"plot written to {plot_stats(st, plot)}")
        except ImportError:
            console.print('[red]error:[/] plotting needs matplotlib: pip install "drvenus[plot]"')
            raise typer.Exit(2) from None
