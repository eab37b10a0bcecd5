"""``drvenus rl``: IGPO training on one machine (mounted by drvenus.cli).

One option per :class:`~drvenus.train.rl.config.RLConfig` field; ``--config file.yaml`` gives them
as a file and flags override it. ``--dry-run`` prints the resolved config and loads nothing; the
verl launch for many GPUs is ``python -m drvenus.train.rl.verl launch`` (docs/RL.md).
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from drvenus.train.options import cli_params, flag, usage_exit
from drvenus.train.rl.config import RLConfig, load_config

console = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)


def _fail(exc: BaseException | str) -> typer.Exit:
    return usage_exit(exc, console)


def _check_paths(config: RLConfig) -> None:
    for name in ("train", "model", "corpus", "system_prompt_file"):
        path = getattr(config, name)
        if path and not Path(path).exists():
            raise ValueError(f"{flag(name)} {path}: no such file or folder")


def _summary(result: Any, config: RLConfig) -> None:
    table = Table(title="drvenus rl")
    table.add_column("item")
    table.add_column("value", justify="right")
    table.add_row("steps", str(result.steps))
    last = result.history[-1] if result.history else {}
    for key in ("reward/outcome_mean", "reward/ig_mean", "rollout/turns_mean", "actor/pg_loss",
                "actor/kl_loss"):
        if key in last:
            table.add_row(key, f"{last[key]:.4g}")
    console.print(table)
    console.print(f"checkpoint: {result.checkpoint}")
    console.print(f"metrics: {Path(config.output) / 'metrics.jsonl'}")


def _run_verl(config: RLConfig, dry_run: bool) -> None:
    import importlib.util
    import subprocess

    from drvenus.train.rl.verl_plugin import VERL_VERSION
    from drvenus.train.rl.verl_plugin.launch import plan

    launch = plan(config)
    for path in launch.files:
        out.print(f"[bold]written[/bold]: {path}")
    out.print("[bold]launch command[/bold]:")
    out.print(launch.shell(), markup=False)
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
                                 TimeElapsedColumn(), console=console, transient=True,
                                 disable=not console.is_terminal)
        self.task: Any = None

    def __enter__(self) -> _RolloutProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def echo(self, line: str) -> None:
        console.print(line, markup=False)

    def step(self, step: int, trajectories: int) -> Any:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"step {step} rollouts", total=trajectories)
        return lambda _rollout: self.progress.advance(self.task)


def rl(**values: Any) -> None:
    """Improve a research agent with IGPO (information-gain turn rewards + outcome rewards)."""
    dry_run = values.pop("dry_run")
    config_file = values.pop("config")
    if config_file is not None and not config_file.is_file():
        raise _fail(f"{config_file}: no such config file")
    try:
        config = load_config(config_file, **values)
        _check_paths(config)
        if config.trainer == "verl":
            _run_verl(config, dry_run)
            return
        if dry_run:
            out.print("[bold]resolved config[/bold]")
            for key, value in config.as_dict().items():
                out.print(f"  {key}: {value!r}", markup=False)
            return
        logging.getLogger("drvenus").setLevel(logging.INFO)
        from drvenus.train.rl.trainer import train

        with _RolloutProgress() as progress:
            result = train(config, echo=progress.echo, on_step=progress.step)
    except (ValueError, OSError) as exc:
        raise _fail(exc) from None
    _summary(result, config)


rl.__signature__ = inspect.Signature(cli_params(RLConfig, [inspect.Parameter(  # type: ignore[attr-defined]
    "dry_run", inspect.Parameter.KEYWORD_ONLY, default=False,
    annotation=Annotated[bool, typer.Option(
        "--dry-run", help="Print the resolved config; load nothing.")])]))

__all__ = ["rl"]
