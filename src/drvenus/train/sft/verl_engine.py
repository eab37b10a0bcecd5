"""``drvenus sft --engine verl``: verl's multi-turn FSDP SFT trainer on our data, same settings.

The launch is ``torchrun ... -m verl.trainer.fsdp_sft_trainer`` with Hydra overrides derived
from :class:`~drvenus.train.sft.config.SFTConfig`; the key names are those of
``verl/trainer/config/sft_trainer.yaml`` and ``verl/trainer/fsdp_sft_trainer.py`` at verl
``v0.6.1`` (:data:`drvenus.train.launch.VERL_VERSION`, read from the tagged source, not run
here). Sequences are
split over ``ulysses_sequence_parallel_size`` GPUs, which verl allows only with
``use_remove_padding=true`` (always set: it also skips padding).

Data: verl's ``MultiTurnSFTDataset`` reads a parquet file with a ``messages`` column (what
``drvenus data clean`` writes) and masks the loss to assistant turns itself. A parquet file
with ``messages`` is passed as it is; other inputs (JSONL, ShareGPT, folders) and
``--val-fraction`` splits (same seeded split as the accelerate engine) are written to
``<launch folder>/verl_data/{train,val}.parquet``. verl always evaluates at the last step, so
without validation data it gets the training file capped at ``global_batch_size`` rows
(``data.val_max_samples``) and ``trainer.test_freq=-1``.

Settings verl does not have are refused with a one-line error instead of silently changed:
``--packing``, ``--over-length drop``, ``--lr-scheduler constant``, ``--precision fp32``, a
``.gguf`` model, fractional ``--epochs``, ``--loss-aggregation token-mean`` (verl takes the
token mean of each micro batch, then the mean over micro batches: ``row-mean`` at micro batch
1), ``--no-train-after-end-of-turn`` (its dataset trains the template's text through the end of
each assistant turn, newline included) and ``--no-shuffle`` (its sampler always shuffles at
v0.6.1; DR-Venus's own copy of verl did not, see docs/SFT.md). verl always loads the model with
``flash_attention_2`` and logs every step, so ``--attn-implementation`` and ``--logging-steps``
do not apply.
"""

from __future__ import annotations

import importlib.util
import logging
import shlex
import subprocess
from pathlib import Path
from typing import Any

from drvenus.train.launch import VERL_VERSION, LaunchPlan, hydra_override
from drvenus.train.sft.config import CONFIG_FILE, SFTConfig, SFTConfigError, dump_config

log = logging.getLogger(__name__)

VERL_MODULE = "verl.trainer.fsdp_sft_trainer"
SCRIPT_FILE = "run_verl_sft.sh"
DATA_DIR = "verl_data"


def check_verl_config(config: SFTConfig) -> None:
    """Raises :class:`SFTConfigError` (one line) for settings verl's SFT trainer lacks."""
    refused = {
        "packing": (config.packing, "verl has no packing (use_remove_padding already skips "
                                    "padding)"),
        "over_length": (config.over_length == "drop", "verl truncates or fails, it does not "
                                                      "drop rows; use truncate"),
        "lr_scheduler": (config.lr_scheduler == "constant", "verl's SFT trainer has cosine or "
                                                            "wsd; use cosine"),
        "precision": (config.precision == "fp32", "verl trains in bf16 mixed precision"),
        "model": (config.model.lower().endswith(".gguf"), "verl needs a Hugging Face model "
                                                          "folder or hub name"),
        "epochs": (config.max_steps <= 0 and config.epochs != int(config.epochs),
                   "verl counts whole epochs; give an integer or --max-steps"),
        "loss_aggregation": (config.loss_aggregation == "token-mean",
                             "verl averages each micro batch's token mean; use row-mean"),
        "train_after_end_of_turn": (not config.train_after_end_of_turn,
                                    "verl's multi-turn dataset trains the newline after each "
                                    "end-of-turn token"),
        "shuffle": (not config.shuffle, "verl's SFT sampler always shuffles"),
    }
    for name, (bad, why) in refused.items():
        if bad:
            value = getattr(config, name)
            shown = ("--no-" if value is False else "--") + name.replace("_", "-")
            shown += "" if isinstance(value, bool) else f" {value}"
            raise SFTConfigError(f"{shown}: not available with --engine verl ({why})")


def _has_messages_parquet(path: str) -> bool:
    p = Path(path)
    if not p.is_file() or p.suffix.lower() not in (".parquet", ".pq"):
        return False
    import pyarrow.parquet as pq

    return "messages" in pq.ParquetFile(p).schema_arrow.names


def _write_parquet(rows: list[list[dict[str, Any]]], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"messages": rows}), path)
    log.info("wrote %d rows for verl to %s", len(rows), path)
    return path


def verl_data(config: SFTConfig, folder: Path) -> tuple[str, str, list[Path]]:
    """The train and validation parquet files verl reads, and the files written for them."""
    from drvenus.train.sft.data import read_conversations, split_validation

    written: list[Path] = []
    if config.val_fraction:
        rows, held = split_validation(read_conversations(config.train), config.val_fraction,
                                      config.seed)
        written += [_write_parquet(rows, folder / DATA_DIR / "train.parquet"),
                    _write_parquet(held, folder / DATA_DIR / "val.parquet")]
        return str(written[0]), str(written[1]), written
    train = config.train
    if not _has_messages_parquet(train):
        rows = read_conversations(train)
        written.append(_write_parquet(rows, folder / DATA_DIR / "train.parquet"))
        train = str(written[-1])
    val = config.val or train
    if config.val and not _has_messages_parquet(config.val):
        written.append(_write_parquet(read_conversations(config.val),
                                      folder / DATA_DIR / "val.parquet"))
        val = str(written[-1])
    return train, val, written


def verl_overrides(config: SFTConfig, train_file: str, val_file: str) -> dict[str, Any]:
    """Hydra overrides of verl's ``sft_trainer.yaml`` that give it ``config``'s settings."""
    gpus_per_node = config.num_processes // config.num_machines
    has_val = bool(config.val or config.val_fraction)
    out: dict[str, Any] = {
        "data.train_files": train_file,
        "data.val_files": val_file,
        "data.multiturn.enable": True,
        "data.multiturn.messages_key": "messages",
        "data.max_length": config.max_length,
        "data.truncation": "right",  # keep the start, like --over-length truncate
        "data.train_batch_size": config.global_batch_size,
        "data.micro_batch_size_per_gpu": config.micro_batch_size,
        "model.partial_pretrain": config.model,
        "model.strategy": "fsdp2",
        "model.enable_gradient_checkpointing": config.gradient_checkpointing_on(),
        "optim.lr": config.learning_rate,
        "optim.betas": f"[{config.adam_beta1},{config.adam_beta2}]",  # numbers, not strings
        "optim.lr_scheduler": "cosine",
        "optim.lr_warmup_steps_ratio": config.warmup_ratio,
        "optim.weight_decay": config.weight_decay,
        "optim.clip_grad": config.max_grad_norm,
        "ulysses_sequence_parallel_size": config.sequence_parallel,
        "use_remove_padding": True,
        "trainer.default_local_dir": config.output,
        "trainer.project_name": "drvenus-sft",
        "trainer.experiment_name": Path(config.output).name or "sft",
        "trainer.logger": ["console", *config.report_targets()],
        "trainer.total_epochs": int(config.epochs),
        "trainer.total_training_steps": config.max_steps if config.max_steps > 0 else None,
        "trainer.save_freq": config.save_steps,
        "trainer.test_freq": config.eval_steps if has_val else -1,
        "trainer.max_ckpt_to_keep": config.save_total_limit,
        "trainer.resume_mode": "auto" if config.resume else "disable",
        "trainer.seed": config.seed,
        "trainer.nnodes": config.num_machines,
        "trainer.n_gpus_per_node": gpus_per_node,
    }
    if not has_val:
        out["data.val_max_samples"] = config.global_batch_size
    if config.lora:
        out.update({"model.lora_rank": config.lora_r, "model.lora_alpha": config.lora_alpha,
                    "model.target_modules": config.lora_targets()})
    return out


def torchrun_command(config: SFTConfig, overrides: dict[str, Any]) -> list[str]:
    """``torchrun`` on this machine (``--node_rank`` = ``--machine-rank``) running verl."""
    command = ["torchrun", "--nnodes", str(config.num_machines),
               "--nproc_per_node", str(config.num_processes // config.num_machines)]
    if config.num_machines > 1:
        command += ["--node_rank", str(config.machine_rank),
                    "--master_addr", str(config.main_process_ip),
                    "--master_port", str(config.main_process_port)]
    else:
        command.append("--standalone")
    command += ["-m", VERL_MODULE]
    return command + [hydra_override(key, value) for key, value in overrides.items()]


def plan_verl(config: SFTConfig, folder: Path) -> LaunchPlan:
    """Write the resolved config, the data verl reads (when converted) and ``run_verl_sft.sh``;
    return the :class:`~drvenus.train.launch.LaunchPlan`."""
    check_verl_config(config)
    config_file = dump_config(config, folder / CONFIG_FILE)
    train_file, val_file, written = verl_data(config, folder)
    command = torchrun_command(config, verl_overrides(config, train_file, val_file))
    script = folder / SCRIPT_FILE
    script.write_text(f"#!/usr/bin/env bash\n# verl=={VERL_VERSION}; on every node, with its "
                      f"own --node_rank\nset -euo pipefail\n{shlex.join(command)}\n",
                      encoding="utf-8")
    return LaunchPlan(command, config_file, None, None, engine="verl", files=[*written, script],
                      folder=folder)


def verl_available() -> bool:
    try:
        return importlib.util.find_spec("verl") is not None
    except (ImportError, ValueError):
        return False


def run_verl(config: SFTConfig, folder: Path | None = None) -> int:
    """Run verl's SFT trainer on this machine (one ``torchrun``); its exit code. Raises
    :class:`SFTConfigError` when verl is not installed."""
    check_verl_config(config)
    if not verl_available():
        raise SFTConfigError(f"--engine verl: verl is not installed (pip install "
                             f"verl=={VERL_VERSION}); --dry-run prints the command without it")
    plan = plan_verl(config, folder or Path(config.output) / "launch")
    log.info("running %s", plan.shell())
    return subprocess.run(plan.command, check=False).returncode


__all__ = ["VERL_MODULE", "check_verl_config", "plan_verl", "run_verl",
           "torchrun_command", "verl_available", "verl_data", "verl_overrides"]
