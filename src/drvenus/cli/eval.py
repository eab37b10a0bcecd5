"""``drvenus eval``: run a benchmark (the default command) and ``drvenus eval compare A B``.

Bad input (an unknown benchmark, a missing file, a locked output) is one line on stderr and exit
code 2; interrupted runs exit 130 and resume when the same command is run again.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markdown import Markdown
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from drvenus.cli.common import (
    CheckedGroup,
    CliError,
    err,
    fail,
    known_errors,
    notice,
    out,
    require_model_server,
    with_options,
)
from drvenus.cli.console import BatchProgress
from drvenus.cli.options import AgentOptions
from drvenus.eval.benchmarks import BENCHMARKS
from drvenus.flags import Cli
from drvenus.grading.judge import JudgeConfig

if TYPE_CHECKING:
    from drvenus.batch import ResultsFile
    from drvenus.config import Settings
    from drvenus.eval.official import OfficialGrader
    from drvenus.eval.runner import EvalSetup

eval_app = typer.Typer(
    cls=CheckedGroup,
    name="eval",
    help="Evaluate the agent on a benchmark (Avg@k, Pass@k, judges, report with plots); "
    "rerun the same command to resume. 'drvenus eval compare A B' compares two runs.",
    invoke_without_command=True,
    add_completion=False,
)
BENCHMARK_HELP = "Benchmark: " + ", ".join(BENCHMARKS) + "."


def _progress(label: str) -> Progress:
    return Progress(
        TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[last]}"), console=err,
    )


@dataclass(frozen=True)
class JudgeOptions:
    """The judge's options: those of ``data clean`` (one definition, :class:`JudgeConfig`)."""

    judge: Annotated[JudgeConfig | None, Cli(expand="judge_")] = None


def _judge_values(values: dict[str, Any]) -> dict[str, Any]:
    return values["judge"]


@eval_app.callback()
@with_options("agent", AgentOptions)
@with_options("judge_options", JudgeOptions, into=_judge_values)
def evaluate(
    ctx: typer.Context,
    benchmark: Annotated[str | None, typer.Option("--benchmark", "-b", help=BENCHMARK_HELP)] = None,
    data: Annotated[Path | None, typer.Option("--data", help="The benchmark's local file.")] = None,
    output: Annotated[
        Path | None, typer.Option("--out", "-o", help="Output folder (results, report).")
    ] = None,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Runs per item (k).")] = 3,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="First N items.")] = None,
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, help="Concurrent runs.")] = 4,
    endpoints: Annotated[
        list[str] | None,
        typer.Option("--endpoint", help="Another server of the same model as --base-url "
                     "(repeatable): questions are spread over all of them, round-robin."),
    ] = None,
    no_judge: Annotated[
        bool, typer.Option("--no-judge", help="Deterministic scorers even if a judge is set.")
    ] = False,
    grader: Annotated[
        str,
        typer.Option("--grader", help="ours (default), or official: the benchmark's official "
                     "grader, its texts read from pinned sources (BrowseComp(-ZH), "
                     "xbench-DeepSearch, HLE, GAIA, DeepSearchQA; see docs/EVAL.md)."),
    ] = "ours",
    *,
    agent: AgentOptions,
    judge_options: dict[str, Any],
) -> None:
    """Run BENCHMARK from --data with the agent, --runs times per item, grade and report."""
    if ctx.invoked_subcommand is not None:
        return
    try:  # every option is checked before anything is written
        if benchmark is None or data is None or output is None:
            raise CliError("--benchmark, --data and --out are required (see --help)")
        from drvenus.eval.benchmarks import get_spec
        from drvenus.eval.runner import judge_config, prepare

        if grader not in ("ours", "official"):
            raise CliError(f"--grader must be ours or official, not {grader!r}")
        settings = agent.settings()
        _check_endpoints(settings, endpoints or [])
        judge = None if no_judge else judge_config(output, JudgeConfig.from_values(judge_options))
        official = _official(get_spec(benchmark).grader, judge) if grader == "official" else None
        setup = prepare(benchmark, data, output, runs=runs, limit=limit)
    except known_errors() as exc:
        raise fail(exc) from None
    code = _run_agent(setup, agent, workers, endpoints or [])
    if code == 130:
        raise typer.Exit(130)
    _grade_and_report(setup, judge, official)
    if code:
        raise typer.Exit(code)


def _check_endpoints(settings: Settings, endpoints: list[str]) -> None:
    """Each ``--endpoint`` checked as ``--base-url`` is (its URL), before any run."""
    from drvenus.llm.openai_compat import normalize_base_url

    if endpoints and settings.base_url is None:
        raise CliError("--endpoint needs --base-url (the first server)")
    for url in endpoints:
        try:
            normalize_base_url(url)
        except ValueError as exc:
            raise CliError(f"--endpoint {url}: {exc}") from None


def _official(grader: str, judge: JudgeConfig | None) -> OfficialGrader:
    """The benchmark's official grader, its pinned files read (and checked) before any agent
    runs; one that needs a judge refuses to go on without one."""
    from drvenus.eval.official import official_grader

    found = official_grader(grader)
    if found.needs_judge and judge is None:
        raise CliError(f"--grader official: the {found.title} needs a judge "
                       "(--judge-base-url and --judge-model, or DRVENUS_JUDGE_*)")
    notice(f"grading with the official grader: {found.title}")
    return found


eval_app.command("run", help="Same as 'drvenus eval' with options.")(evaluate)


def _model_spec(agent: AgentOptions) -> dict[str, str]:
    """What names the model of a run, as given (no server asked; a server's URL may change
    between runs of one model): model name, GGUF file, adapter."""
    settings = agent.settings()
    spec = {
        "model_name": settings.model_name,
        "model_path": str(settings.model_path) if settings.model_path else None,
        "adapter": "none" if settings.no_adapter else
        (str(settings.adapter) if settings.adapter else None),
    }
    return {k: v for k, v in spec.items() if v}


def _show(spec: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in spec.items()) or "the embedded model"


def _run_agent(
    setup: EvalSetup, agent: AgentOptions, workers: int, endpoints: list[str]
) -> int:
    """The agent over every pending (item, run) pair; 0, 1 (some failed) or 130."""
    from drvenus.batch import OutputLockedError, ResultsFile
    from drvenus.eval.runner import pending

    try:
        results = ResultsFile(setup.results_path)
    except (OutputLockedError, OSError) as exc:
        raise fail(exc) from None
    try:
        todo = pending(setup, results)
        spec, before = _model_spec(agent), setup.manifest.get("model_spec")
        if before and before != spec and (todo.done or todo.retry):
            raise fail(CliError(f"{setup.out} holds results of another model ({_show(before)}; "
                                f"now {_show(spec)}): use another --out (or remove it)"))
        if not todo.todo:
            out.print(f"All {len(setup.pairs())} (item, run) pairs are done in {setup.out}.")
            return 0
        if todo.done or todo.retry:
            again = f" ({todo.retry} failed before, retrying)" if todo.retry else ""
            out.print(f"Resuming: {todo.done} done, {len(todo.todo)} to go{again}.")
        return _run_locked(setup, agent, workers, endpoints, results, todo)
    except KeyboardInterrupt:
        from drvenus.signals import stopped_by

        err.print(f"{stopped_by()}; rerun the same command to resume")
        return 130
    finally:
        results.close()


def _run_locked(
    setup: EvalSetup, agent: AgentOptions, workers: int, endpoints: list[str],
    results: ResultsFile, todo,
) -> int:
    from drvenus.agent import ResearchAgent
    from drvenus.eval.runner import run_pairs, save_manifest
    from drvenus.stack import build_model, build_stack, run_settings

    if setup.corpus is not None:
        if agent.tools.corpus is not None:
            err.print(f"[yellow]--corpus ignored: {setup.spec.name} uses its own corpus[/]")
        agent = replace(agent, tools=replace(agent.tools, corpus=setup.corpus))
    try:
        settings = agent.settings()
        stack = build_stack(settings, system_prompt_file=agent.prompt_file,
                            progress=True, parallel=workers, notify=notice)
    except known_errors() as exc:
        raise fail(exc) from None
    agents = [stack.agent]
    for url in endpoints:  # one agent per extra server, sharing the tools and budgets
        try:
            model = build_model(settings.model_copy(update={"base_url": url}), parallel=workers)
        except known_errors() as exc:
            asyncio.run(_close(stack, agents[1:]))
            raise fail(exc) from None
        agents.append(ResearchAgent(model, stack.tools, stack.agent.config))
    before = setup.manifest.get("model")
    if before and before != stack.model.name and (todo.done or todo.retry):
        asyncio.run(_close(stack, agents[1:]))
        raise fail(CliError(f"{setup.out} holds results of the model {before!r}, not "
                            f"{stack.model.name!r}: use another --out (or remove it)"))
    agent_settings, before = run_settings(stack.agent.config, settings), setup.manifest.get("agent")
    if before and before != agent_settings and (todo.done or todo.retry):
        asyncio.run(_close(stack, agents[1:]))
        changed = ", ".join(f"{k} {before.get(k)} -> {v}" for k, v in agent_settings.items()
                            if before.get(k) != v)
        raise fail(CliError(f"{setup.out} holds results of other agent settings ({changed}): "
                            "use another --out (or remove it)"))
    texts = stack.agent.config.texts
    save_manifest(setup, model=stack.model.name, model_spec=_model_spec(agent),
                  endpoints=1 + len(endpoints), protocol=f"{texts.name} ({texts.source})",
                  agent=agent_settings)
    # a benchmark's questions may be encrypted (kept out of files): the lines show ids only
    progress = BatchProgress(err, len(todo.todo), label_of=lambda item: item.id)

    async def go():
        try:
            for extra in agents:
                await require_model_server(extra.model)
            with progress:
                return await run_pairs(setup, agents, todo, results, workers=workers,
                                       on_done=progress.done, on_event=progress.event)
        finally:
            await _close(stack, agents[1:])

    try:
        summary = asyncio.run(go())
    except CliError as exc:
        raise fail(exc) from None
    if summary.failed:
        err.print(f"[bold red]{summary.failed} pair(s) failed[/] (llm_error/tool_error/exception); "
                  "rerun the same command to retry them")
        return 1
    return 0


async def _close(stack, extra_agents) -> None:
    try:
        for extra in extra_agents:
            await extra.model.aclose()
    finally:
        await stack.aclose()


def _grade_and_report(
    setup: EvalSetup, judge: JudgeConfig | None, official: OfficialGrader | None = None
) -> None:
    from drvenus.eval.report import build_report, render_markdown, write_report
    from drvenus.eval.runner import grade_all, latest_rows

    progress = _progress("grading")
    task = progress.add_task("grade", total=len(latest_rows(setup.results_path)), last="")
    try:
        with progress:
            results = asyncio.run(grade_all(
                setup, judge, on_done=lambda: progress.update(task, advance=1),
                official=official))
        report = build_report(setup.manifest, results, setup.spec.grader,
                              judge.model if judge else None,
                              official.describe() if official is not None else None)
        paths = write_report(setup.out, report)
    except known_errors() as exc:
        raise fail(exc) from None
    out.print(Markdown(render_markdown(report).split("\n## Per run")[0]))
    if report["metrics"]["judge_errors"]:
        err.print(f"[yellow]{report['metrics']['judge_errors']} judge error(s)[/]: counted as "
                  "wrong; rerun to ask the judge again")
    out.print(f"Report: {escape(str(paths[1]))} ({len(paths) - 2} plots)")


# ---------------------------------------------------------------- compare
@eval_app.command("compare")
def compare_runs(
    run_a: Annotated[Path, typer.Argument(help="An evaluation folder.")],
    run_b: Annotated[Path, typer.Argument(help="Another evaluation folder.")],
    output: Annotated[
        Path | None, typer.Option("--out", "-o", help="Also write the comparison (markdown).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead.")] = False,
) -> None:
    """Put two evaluations side by side, with the items on which they differ."""
    from drvenus.eval.report import compare, load_report, render_comparison

    try:
        diff = compare(load_report(run_a), load_report(run_b))
        text = render_comparison(diff, str(run_a), str(run_b))
        if output is not None:
            output.write_text(text, encoding="utf-8")
    except known_errors() as exc:
        raise fail(exc) from None
    if as_json:
        sys.stdout.write(json.dumps(diff, ensure_ascii=False) + "\n")
    else:
        out.print(Markdown(text))


__all__ = ["eval_app"]
