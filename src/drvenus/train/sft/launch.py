"""The launch plan of ``drvenus sft``: the command that runs the training on each machine and
the files it reads (the resolved config, the ``accelerate launch`` config; with
``--engine verl`` :func:`drvenus.train.sft.verl_engine.plan_verl`'s ``torchrun`` command), as
``--dry-run`` prints it. No torch: a dry run works anywhere.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from drvenus.train.launch import LaunchPlan
from drvenus.train.sft.config import (
    CONFIG_FILE,
    SFTConfig,
    dump_config,
    sequence_parallel_settings,
)
from drvenus.train.sft.verl_engine import plan_verl


def accelerate_config(config: SFTConfig) -> dict[str, Any] | None:
    """An ``accelerate launch`` config for ``config.resolved_distributed()`` (None for one
    process without a distributed backend)."""
    kind = config.resolved_distributed()
    if kind == "none":
        return None
    bf16 = config.precision != "fp32"
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": {"ddp": "MULTI_GPU", "fsdp": "FSDP", "deepspeed": "DEEPSPEED"}[kind],
        "mixed_precision": "bf16" if bf16 else "no",
        "num_machines": config.num_machines,
        "num_processes": config.num_processes,
        "machine_rank": config.machine_rank,
        "main_process_ip": config.main_process_ip,
        "main_process_port": config.main_process_port,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if kind == "fsdp":
        cfg["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",  # the model's _no_split_modules
            "fsdp_reshard_after_forward": True,
            "fsdp_offload_params": False,
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_state_dict_type": "FULL_STATE_DICT",  # checkpoints in Hugging Face format
            "fsdp_activation_checkpointing": False,  # --gradient-checkpointing does this
        }
    if kind == "deepspeed":
        cfg["deepspeed_config"] = {
            "zero_stage": 3,
            "gradient_accumulation_steps": config.grad_accumulation(config.num_processes),
            "gradient_clipping": config.max_grad_norm,
            "offload_optimizer_device": "none",
            "offload_param_device": "none",
            "zero3_init_flag": True,
            "zero3_save_16bit_model": True,
        }
        if config.num_machines > 1:
            cfg["deepspeed_config"]["deepspeed_multinode_launcher"] = "standard"
    return cfg


def plan_launch(config: SFTConfig, folder: Path | None = None) -> LaunchPlan:
    """Write the resolved config (and the accelerate config) to ``folder`` (default
    ``<output>/launch``) and return the command that runs the training on each machine."""
    import yaml

    folder = folder or Path(config.output) / "launch"
    if config.engine == "verl":
        return plan_verl(config, folder)
    config_file = dump_config(config, folder / CONFIG_FILE)
    sp = sequence_parallel_settings(config)
    run = [sys.executable, "-m", "drvenus", "sft", "--config", str(config_file)]
    acc = accelerate_config(config)
    if acc is None:
        return LaunchPlan(run, config_file, None, None, sp, folder=folder)
    acc_file = folder / f"accelerate_{config.resolved_distributed()}.yaml"
    acc_file.write_text(yaml.safe_dump(acc, sort_keys=False), encoding="utf-8")
    command = ["accelerate", "launch", "--config_file", str(acc_file),
               "--num_processes", str(config.num_processes),
               "--num_machines", str(config.num_machines),
               "--machine_rank", str(config.machine_rank)]
    if config.num_machines > 1:
        command += ["--main_process_ip", str(config.main_process_ip),
                    "--main_process_port", str(config.main_process_port)]
    command += ["-m", "drvenus", "sft", "--config", str(config_file)]
    return LaunchPlan(command, config_file, acc_file, acc, sp, folder=folder)


__all__ = ["accelerate_config", "plan_launch"]
