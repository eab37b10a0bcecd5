"""``drvenus sft``: fine-tune a model on agent trajectories (mounted by drvenus.cli).

One option per :class:`~drvenus.train.sft.config.SFTConfig` field (``--config file.yaml`` gives
them as a file; flags override it). Bad input (a missing file, no messages column, an invalid
value) is one line on stderr and exit code 2.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from drvenus.train.options import cli_params, usage_exit
from drvenus.train.sft.config import SFTConfig, flag, load_config

console = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)


def _fail(exc: BaseException | str) -> typer.Exit:
    return usage_exit(exc, console)


def _params() -> list[inspect.Parameter]:
    return cli_params(SFTConfig, [inspect.Parameter(
        "dry_run", inspect.Parameter.KEYWORD_ONLY, default=False,
        annotation=Annotated[bool, typer.Option(
            "--dry-run", help="Print the launch command and resolved config; load nothing.")])])


def _print_plan(config: SFTConfig) -> None:
    import yaml

    from drvenus.train.sft.launch import plan_launch

    plan = plan_launch(config)
    out.print("[bold]resolved config[/bold]")
    for key, value in config.as_dict().items():
        out.print(f"  {key}: {value!r}", markup=False)
    world = config.num_processes
    kind = "verl (FSDP2)" if config.engine == "verl" else config.resolved_distributed()
    out.print(f"  (gradient accumulation: {config.grad_accumulation(world)} with {world} "
              f"process(es), data parallel {config.data_parallel_size(world)} x sequence "
              f"parallel {config.sequence_parallel}, distributed: {kind})", markup=False)
    out.print(f"[bold]config file[/bold]: {plan.config_file}")
    if plan.accelerate_file is not None:
        out.print(f"[bold]accelerate config[/bold]: {plan.accelerate_file}")
        out.print(plan.accelerate_file.read_text(encoding="utf-8"), markup=False)
    if plan.parallelism is not None:
        out.print("[bold]sequence parallelism[/bold] (TrainingArguments.parallelism_config, "
                  "built in the training process):")
        out.print(yaml.safe_dump(plan.parallelism, sort_keys=False), markup=False)
    for path in plan.files:
        out.print(f"[bold]written[/bold]: {path}")
    where = " (on every machine, with its own --machine_rank)" if config.num_machines > 1 else ""
    out.print(f"[bold]launch command{where}[/bold]:")
    out.print(plan.shell(), markup=False)


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
    console.print(table)
    console.print(f"final model: {result.final_dir}")


def sft(**values: Any) -> None:
    """Fine-tune a causal LM on agent trajectories (loss on assistant tokens only)."""
    dry_run = values.pop("dry_run")
    config_file = values.pop("config")
    if config_file is not None and not config_file.is_file():
        raise _fail(f"{config_file}: no such config file")
    try:
        config = load_config(config_file, **values)
        for name in ("train", "val", "model"):
            path = getattr(config, name)
            if path and not Path(path).exists() and not (name == "model" and "/" in path
                                                         and not path.startswith((".", "/"))):
                raise ValueError(f"{flag(name)} {path}: no such file or folder")
        if dry_run:
            _print_plan(config)
            return
        logging.getLogger("drvenus").setLevel(logging.INFO)
        if config.engine == "verl":
            from drvenus.train.sft.verl_engine import run_verl

            code = run_verl(config)
            if code:
                raise typer.Exit(code)
            return
        from drvenus.train.sft.trainer import train

        result = train(config)
    except (ValueError, OSError) as exc:
        raise _fail(exc) from None
    _print_summary(result)


sft.__signature__ = inspect.Signature(_params())  # type: ignore[attr-defined]

__all__ = ["sft"]
