"""``drvenus sft`` (fine-tune a model on agent trajectories) and ``drvenus rl`` (IGPO training:
on one machine, or with ``--trainer verl`` on many GPUs, whose ``--dry-run`` writes the launch
script of ``python -m drvenus.train.rl.verl_plugin.main``; docs/RL.md).

One option per field of :class:`~drvenus.train.sft.config.SFTConfig` /
:class:`~drvenus.train.rl.config.RLConfig`; ``--config file.yaml`` gives them as a file and flags
override it. ``--dry-run`` prints the resolved config (and the launch plan) and loads nothing.
Bad input (a missing file, no messages column, an invalid value) is one line on stderr and exit
code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from drvenus.cli.common import INTERRUPTED, err, fail, log_progress, out, with_options
from drvenus.train.options import check_paths
from drvenus.train.rl.config import NO_JUDGE, RLConfig, RLConfigError
from drvenus.train.sft.config import SFTConfig

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", help="YAML file of options (keys = option names with _)."),
]


def _say(text: str, **kwargs: Any) -> None:
    """A line on stdout, never broken (launch commands, paths and values are copied from it)."""
    out.print(text, soft_wrap=True, **kwargs)


def _check_config_file(config_file: Path | None) -> None:
    if config_file is not None and not config_file.is_file():
        raise fail(f"{config_file}: no such config file")


# ---------------------------------------------------------------- sft
def _print_plan(config: SFTConfig) -> None:
    import yaml

    from drvenus.train.sft.launch import plan_launch

    plan = plan_launch(config)
    _say("[bold]resolved config[/bold]")
    for key, value in config.as_dict().items():
        _say(f"  {key}: {value!r}", markup=False)
    world = config.num_processes
    kind = "verl (FSDP2)" if config.engine == "verl" else config.resolved_distributed()
    _say(f"  (gradient accumulation: {config.grad_accumulation(world)} with {world} "
              f"process(es), data parallel {config.data_parallel_size(world)} x sequence "
              f"parallel {config.sequence_parallel}, distributed: {kind})", markup=False)
    _say(f"[bold]config file[/bold]: {plan.config_file}")
    if plan.accelerate_file is not None:
        _say(f"[bold]accelerate config[/bold]: {plan.accelerate_file}")
        _say(plan.accelerate_file.read_text(encoding="utf-8"), markup=False)
    if plan.parallelism is not None:
        _say("[bold]sequence parallelism[/bold] (TrainingArguments.parallelism_config, "
                  "built in the training process):")
        _say(yaml.safe_dump(plan.parallelism, sort_keys=False), markup=False)
    for path in plan.files:
        _say(f"[bold]written[/bold]: {path}")
    where = " (on every machine, with its own --machine_rank)" if config.num_machines > 1 else ""
    _say(f"[bold]launch command{where}[/bold]:")
    _say(plan.shell(), markup=False)


def _print_summary(result: Any) -> None:
    table = Table(title="drvenus sft")
    table.add_column("item")
    table.add_column("value", justify="right")
    train = result.data_stats["train"]
    for key in ("rows", "kept", "truncated", "tokens", "trained_tokens"):
        table.add_row(f"train {key}", str(train[key]))
    for reason, n in train["skipped"].items():
        table.add_row(f"skipped ({reason})", str(n))
    table.add_row("optimizer steps", str(result.global_step))
    if result.train_loss is not None:
        table.add_row("mean train loss", f"{result.train_loss:.4f}")
    err.print(table)
    err.print(f"final model: {result.final_dir}")


@with_options("values", SFTConfig, layered=True, into=dict)
def sft(
    config: ConfigOption = None,
    *,
    values: dict[str, Any],
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the launch command and resolved config; load nothing.")] = False,
) -> None:
    """Fine-tune a causal LM on agent trajectories (loss on assistant tokens only)."""
    from drvenus.train.sft.config import load_config

    _check_config_file(config)
    settings: SFTConfig | None = None
    try:
        settings = load_config(config, **values)
        check_paths(settings, ("train", "val", "model"), hub=("model",), ask_hub=not dry_run)
        if dry_run:
            _print_plan(settings)
            return
        log_progress()
        if settings.engine == "verl":
            from drvenus.train.sft.verl_engine import run_verl

            code = run_verl(settings)
            if code:
                raise typer.Exit(code)
            return
        from drvenus.train.sft.trainer import train

        result = train(settings)
    except (ValueError, OSError) as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM; a checkpoint being written was finished
        _say_stopped(settings.output if settings is not None else None)
        raise typer.Exit(INTERRUPTED) from None
    _print_summary(result)


def _say_stopped(output: Any) -> None:
    """One line: training stopped, and where ``--resume`` picks it up."""
    from drvenus.signals import stopped_by
    from drvenus.train.sft.trainer import latest_checkpoint

    last = latest_checkpoint(output) if output else None
    where = (f"--resume continues from {last}" if last
             else "no complete checkpoint yet (--resume starts from the beginning)")
    err.print(f"[yellow]{stopped_by()}[/yellow]: training stopped; {where}")


# ---------------------------------------------------------------- rl
def _check_rl(config: RLConfig, dry_run: bool) -> None:
    """What ``drvenus rl`` needs before it loads anything (the local trainer's dry run too):
    its files, a writable output, DR-Venus's pinned RL files with ``--protocol dr-venus``, and
    the outcome judge when the reward asks for one (a verl dry run only writes the launch plan:
    the cluster may hold the judge settings and the files)."""
    check_paths(config, ("train", "model", "corpus", "system_prompt_file", "val"))
    if not (dry_run and config.trainer == "verl"):
        from drvenus.reference.profiles import profile

        # the profile's RL texts (DR-Venus's: one line naming a missing or changed file)
        profile(config.protocol_name()).check_rl(judge=config.reward_type == "llm")
    if config.reward_type == "llm" and not (dry_run and config.trainer == "verl"):
        from drvenus.grading.judge import JudgeConfig

        if JudgeConfig.from_options(config.judge_url, config.judge_model) is None:
            raise RLConfigError(NO_JUDGE)


def _rl_summary(result: Any, config: RLConfig) -> None:
    table = Table(title="drvenus rl")
    table.add_column("item")
    table.add_column("value", justify="right")
    table.add_row("steps", str(result.steps))
    last = result.history[-1] if result.history else {}
    for key in ("reward/outcome_mean", "reward/ig_mean", "rollout/turns_mean", "actor/pg_loss",
                "actor/kl_loss"):
        if key in last:
            table.add_row(key, f"{last[key]:.4g}")
    err.print(table)
    err.print(f"checkpoint: {result.checkpoint}")
    err.print(f"metrics: {Path(config.output) / 'metrics.jsonl'}")


def _run_verl(config: RLConfig, dry_run: bool) -> None:
    import importlib.util
    import subprocess

    from drvenus.train.rl.verl_plugin import VERL_VERSION
    from drvenus.train.rl.verl_plugin.launch import plan

    launch = plan(config)
    for path in launch.files:
        _say(f"[bold]written[/bold]: {path}")
    _say("[bold]launch command[/bold]:")
    _say(launch.shell(), markup=False)
    if dry_run:
        return
    if importlib.util.find_spec("verl") is None:
        raise ValueError(f"verl is not installed: pip install verl=={VERL_VERSION} (docs/RL.md); "
                         "--dry-run writes the launch script without it")
    code = subprocess.call(launch.command)
    if code:
        raise typer.Exit(code)


class _RolloutProgress:
    """A rich progress bar of each step's rollouts (on a terminal), the step lines above it."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self.progress = Progress("[bold]{task.description}", BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=err, transient=True,
                                 disable=not err.is_terminal)
        self.task: Any = None

    def __enter__(self) -> _RolloutProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def echo(self, line: str) -> None:
        err.print(line, markup=False)

    def step(self, step: int, trajectories: int) -> Any:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"step {step} rollouts", total=trajectories)
        return lambda _rollout: self.progress.advance(self.task)


@with_options("values", RLConfig, layered=True, into=dict)
def rl(
    config: ConfigOption = None,
    *,
    values: dict[str, Any],
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the resolved config; load nothing.")] = False,
) -> None:
    """Improve a research agent with IGPO (information-gain turn rewards + outcome rewards)."""
    from drvenus.train.rl.config import load_config

    _check_config_file(config)
    try:
        settings = load_config(config, **values)
        _check_rl(settings, dry_run)
        if settings.trainer == "verl":
            _run_verl(settings, dry_run)
            return
        if dry_run:
            _say("[bold]resolved config[/bold]")
            for key, value in settings.as_dict().items():
                _say(f"  {key}: {value!r}", markup=False)
            return
        log_progress()
        from drvenus.train.rl.trainer import train

        with _RolloutProgress() as progress:
            result = train(settings, echo=progress.echo, on_step=progress.step)
    except (ValueError, OSError) as exc:
        raise fail(exc) from None
    _rl_summary(result, settings)


__all__ = ["rl", "sft"]
