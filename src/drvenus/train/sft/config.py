"""``SFTConfig``: every setting of an SFT run, one field per command-line option.

YAML config keys are the field names; ``drvenus sft`` derives its options from the fields (flag
``--<field-name>`` with ``_`` as ``-``) and command-line flags override the file. Defaults follow
DR-Venus (1 epoch, global batch 32, micro batch 1, lr 1e-5, 200K tokens per sequence, loss on
assistant tokens only) and the verl SFT trainer it ran on (``SFT/train_sft.sh`` and
``SFT/verl/trainer/fsdp_sft_trainer.py`` of inclusionAI/DR-Venus): warmup ratio 0.1, weight
decay 0.01, clipping 1.0, AdamW betas (0.9, 0.95), the loss averaged per row then over the rows
(``loss_aggregation``), the newline after each assistant end-of-turn token trained
(``train_after_end_of_turn``), gradient checkpointing on for long sequences (see
:meth:`SFTConfig.gradient_checkpointing_on`). docs/SFT.md lists what still differs.

``engine`` names the training backend: ``accelerate`` (transformers' Trainer, which runs on
accelerate: DDP, FSDP, DeepSpeed) or ``verl`` (verl's multi-turn FSDP SFT trainer, launched
with ``torchrun``, see :mod:`drvenus.train.sft.verl_engine`); both read the same fields.
``sequence_parallel`` splits every sequence over that many GPUs (DeepSpeed Ulysses through
accelerate's ``ParallelismConfig`` with ``accelerate``, verl's Ulysses with ``verl``); the data
parallel size is then processes / sequence_parallel, and the global batch counts sequences.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from drvenus.train import options
from drvenus.train.options import ConfigError, flag, one_line_reason

ENGINES = ("accelerate", "verl")
# attention kernels DeepSpeed Ulysses accepts through accelerate (DeepSpeedSequenceParallelConfig)
SP_ATTENTION = ("sdpa", "flash_attention_2", "flash_attention_3")
Distributed = Literal["auto", "none", "ddp", "fsdp", "deepspeed"]
LossAggregation = Literal["row-mean", "token-mean"]
# gradient checkpointing left unset turns on above this many tokens per forward pass
# (micro batch x max length)
CHECKPOINTING_ABOVE_TOKENS = 4096
# trained tokens whose logits the loss computes at a time (drvenus.train.sft.loss,
# chunked_token_losses): about 14 bytes x chunk x vocabulary at the peak of a chunk's backward,
# 4.4 GB with Qwen3's 151,936 tokens, where the full logits take 20 GB at 32K tokens a row
LOSS_CHUNK_TOKENS = 2048


class SFTConfigError(ConfigError):
    """An invalid setting; the message is one line naming the option."""


_opt = options.opt


@dataclass
class SFTConfig:
    """Settings of one ``drvenus sft`` run (see the module doc)."""

    # data
    train: str = _opt("Training data: parquet / JSONL / JSON file or folder (messages).", "")
    model: str = _opt("Base model: a Hugging Face model folder (or a .gguf file).", "")
    output: str = _opt("Output folder: checkpoints, final model, logs.", "")
    val: str | None = _opt("Validation data (same formats as --train).")
    val_fraction: float = _opt("Hold out this fraction of --train for validation.", 0.0)
    max_length: int = _opt("Max tokens per sequence (a row or a packed sequence).", 200_000)
    over_length: Literal["truncate", "drop"] = _opt("Rows over --max-length: truncate|drop.",
                                                    "truncate")
    packing: bool = _opt("Pack short rows into --max-length sequences (no cross-row attention).",
                         False)
    train_after_end_of_turn: bool = _opt(
        "Also train what the template writes after an assistant turn's end-of-turn token "
        "(ChatML: the newline after <|im_end|>), as verl does.", True)
    shuffle: bool = _opt("Shuffle the training rows each epoch (seeded); off: file order.", True)
    # schedule
    epochs: float = _opt("Training epochs.", 1.0, gt=0)
    max_steps: int = _opt("Stop after this many optimizer steps (-1: the epochs decide).", -1)
    global_batch_size: int = _opt("Sequences per optimizer step, all processes together.", 32)
    micro_batch_size: int = _opt("Sequences per process per forward pass.", 1)
    learning_rate: float = _opt("Peak learning rate.", 1e-5, gt=0)
    lr_scheduler: Literal["cosine", "constant"] = _opt("cosine|constant (after warmup).", "cosine")
    warmup_ratio: float = _opt("Fraction of steps with linear warmup.", 0.1)
    weight_decay: float = _opt("AdamW weight decay (on every trained parameter, as verl).", 0.01,
                         ge=0)
    adam_beta1: float = _opt("AdamW beta1.", 0.9)
    adam_beta2: float = _opt("AdamW beta2.", 0.95)
    loss_aggregation: LossAggregation = _opt(
        "row-mean: each row's mean token loss, averaged over the rows of the global batch "
        "(verl); token-mean: every trained token of the global batch weighs the same.",
        "row-mean")
    max_grad_norm: float = _opt("Gradient clipping norm (0: no clipping).", 1.0, ge=0)
    seed: int = _opt("Random seed (data order, init of LoRA weights).", 42, ge=0,
                     le=2**32 - 1)
    # precision and memory
    precision: Literal["auto", "bf16", "fp32"] = _opt(
        "auto: bf16 on GPU, fp32 on CPU; bf16 on a CPU with native bf16 (AVX512-BF16, AMX) "
        "trains about 4x faster.", "auto")
    gradient_checkpointing: bool | None = _opt(
        "Recompute activations in backward (less memory); unset: on when micro batch x "
        f"max length is over {CHECKPOINTING_ABOVE_TOKENS} tokens.")
    attn_implementation: str = _opt("sdpa|eager|flash_attention_2|... (model default if empty).",
                                    "sdpa")
    loss_chunk_tokens: int | None = _opt(
        "Loss from the final hidden states, the LM head applied to this many trained tokens at "
        "a time and recomputed in the backward: memory holds one chunk's logits, not the whole "
        "sequence's (0: the full logits at once; not under accelerate --sequence-parallel).",
        LOSS_CHUNK_TOKENS, ge=0)
    # LoRA
    lora: bool = _opt("Train LoRA adapters (peft) instead of all weights.", False)
    lora_r: int = _opt("LoRA rank.", 16)
    lora_alpha: int = _opt("LoRA alpha.", 32, ge=1)
    lora_dropout: float = _opt("LoRA dropout.", 0.05)
    lora_target_modules: str = _opt("Comma-separated module names, or all-linear.", "all-linear")
    # evaluation, checkpoints, logs
    eval_steps: int = _opt("Validation loss every N steps.", 100)
    save_steps: int = _opt("Checkpoint every N steps.", 100)
    save_total_limit: int | None = _opt("Keep at most N checkpoints (all if unset).", ge=1)
    logging_steps: int = _opt("Log loss, lr, tokens/s, grad norm every N steps.", 1)
    report_to: str = _opt("Comma-separated: tensorboard, wandb (or none).", "none")
    resume: bool = _opt("Resume from the latest checkpoint in --output if there is one.", False)
    # launch
    engine: str = _opt("Training engine: accelerate|verl.", "accelerate")
    sequence_parallel: int = _opt("GPUs that share one sequence (Ulysses sequence parallel).", 1)
    distributed: Distributed = _opt("auto|none|ddp|fsdp|deepspeed (the launch config written).",
                                    "auto")
    num_processes: int = _opt("Processes (GPUs) in all, over all machines.", 1)
    num_machines: int = _opt("Machines (nodes).", 1)
    machine_rank: int = _opt("Rank of this machine (0..num_machines-1).", 0, ge=0)
    main_process_ip: str | None = _opt("Address of machine 0 (several machines).")
    main_process_port: int = _opt("Port of the rendezvous on machine 0.", 29500, ge=1,
                                  le=65535)

    # ------------------------------------------------------------------ derived values

    def grad_accumulation(self, world_size: int) -> int:
        """Micro batches per optimizer step so that one step sees ``global_batch_size`` rows
        (the processes of one sequence-parallel group share their rows)."""
        per_pass = self.micro_batch_size * self.data_parallel_size(world_size)
        if self.global_batch_size % per_pass:
            raise SFTConfigError(
                f"--global-batch-size {self.global_batch_size} is not a multiple of "
                f"--micro-batch-size x data-parallel processes = {per_pass}"
            )
        return self.global_batch_size // per_pass

    def data_parallel_size(self, world_size: int) -> int:
        """Groups of processes that see different rows: ``world_size / sequence_parallel``."""
        return max(1, world_size // self.sequence_parallel)

    def gradient_checkpointing_on(self) -> bool:
        """``gradient_checkpointing`` as given, or, unset, on when one forward pass may hold
        more than :data:`CHECKPOINTING_ABOVE_TOKENS` tokens (``micro_batch_size x
        max_length``): activations grow with the tokens of a pass, and DR-Venus's 200K-token
        rows ran with checkpointing on (verl's default, set in its ``train_sft.sh``)."""
        if self.gradient_checkpointing is not None:
            return self.gradient_checkpointing
        return self.micro_batch_size * self.max_length > CHECKPOINTING_ABOVE_TOKENS

    def report_targets(self) -> list[str]:
        names = [n.strip() for n in self.report_to.split(",") if n.strip()]
        return [] if names in ([], ["none"]) else names

    def lora_targets(self) -> str | list[str]:
        names = [n.strip() for n in self.lora_target_modules.split(",") if n.strip()]
        return "all-linear" if names in ([], ["all-linear"]) else names

    def resolved_distributed(self) -> str:
        if self.distributed != "auto":
            return self.distributed
        if self.sequence_parallel > 1:
            return "deepspeed"  # accelerate's Ulysses backend is DeepSpeed's
        return "fsdp" if self.num_processes > 1 else "none"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # ------------------------------------------------------------------ checks

    def validate(self) -> SFTConfig:
        """Raises :class:`SFTConfigError` (one line) for the first invalid setting."""
        options.check_types(self, SFTConfigError)
        for name in ("train", "model", "output"):
            if not getattr(self, name):
                raise SFTConfigError(f"--{name} is required")
        positive = ("max_length", "global_batch_size", "micro_batch_size", "eval_steps",
                    "save_steps", "logging_steps", "lora_r", "num_processes", "num_machines",
                    "sequence_parallel")
        for name in positive:
            if getattr(self, name) < 1:
                raise SFTConfigError(f"{flag(name)} must be at least 1")
        for name in ("val_fraction", "warmup_ratio", "lora_dropout", "adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise SFTConfigError(f"{flag(name)} must be in [0, 1)")
        if self.learning_rate <= 0 or self.epochs <= 0:
            raise SFTConfigError("--learning-rate and --epochs must be positive")
        if self.max_steps != -1 and self.max_steps < 1:
            raise SFTConfigError(f"--max-steps {self.max_steps}: give at least 1 (or -1: the "
                                 "epochs decide)")
        if self.val and self.val_fraction:
            raise SFTConfigError("give --val or --val-fraction, not both")
        if self.engine not in ENGINES:
            raise SFTConfigError(f"--engine {self.engine!r}: choose one of {', '.join(ENGINES)}")
        if not 0 <= self.machine_rank < self.num_machines:
            raise SFTConfigError("--machine-rank must be in [0, num_machines)")
        if self.num_machines > 1 and not self.main_process_ip:
            raise SFTConfigError("--main-process-ip is required with several machines")
        self._validate_parallel()
        self.grad_accumulation(self.num_processes)
        return self

    def _validate_parallel(self) -> None:
        if self.num_processes % self.num_machines:
            raise SFTConfigError(f"--num-processes {self.num_processes} is not a multiple of "
                                 f"--num-machines {self.num_machines}")
        sp = self.sequence_parallel
        if sp == 1:
            return
        if self.num_processes % sp:
            raise SFTConfigError(f"--num-processes {self.num_processes} is not a multiple of "
                                 f"--sequence-parallel {sp}")
        if self.engine != "accelerate":
            return
        if self.loss_aggregation == "token-mean":
            raise SFTConfigError(f"--loss-aggregation token-mean: not available with "
                                 f"--sequence-parallel {sp} (accelerate's Ulysses loss is the "
                                 "token mean of each micro batch); use row-mean")
        if self.resolved_distributed() != "deepspeed":
            raise SFTConfigError(f"--sequence-parallel {sp} needs --distributed deepspeed "
                                 "(accelerate's Ulysses backend is DeepSpeed's)")
        attn = self.attn_implementation
        if attn not in SP_ATTENTION and not ("/" in attn and "flash-attn" in attn):
            raise SFTConfigError(f"--sequence-parallel needs --attn-implementation "
                                 f"{'|'.join(SP_ATTENTION)} (got {attn or 'the model default'!r})")


def field_help() -> dict[str, str]:
    """Help text of each field (for the command line)."""
    return options.field_help(SFTConfig)


def load_config(path: str | Path | None = None, **overrides: Any) -> SFTConfig:
    """An :class:`SFTConfig` from a YAML file (keys = field names) with ``overrides`` on top
    (None values are ignored, so unset command-line options keep the file's value). Validated;
    raises :class:`SFTConfigError` for unknown keys or bad values."""
    values = options.read_values(SFTConfig, path, overrides, SFTConfigError)
    return SFTConfig(**values).validate()


CONFIG_FILE = "sft_config.yaml"  # the resolved config, in the launch folder and the output


def sequence_parallel_settings(config: SFTConfig) -> dict[str, Any] | None:
    """The ``ParallelismConfig`` settings of ``--sequence-parallel`` (None without it)."""
    if config.sequence_parallel == 1 or config.engine != "accelerate":
        return None
    return {"sp_backend": "deepspeed", "sp_size": config.sequence_parallel,
            "sp_handler": {"sp_seq_length": None, "sp_seq_length_is_variable": True,
                           "sp_attn_implementation": config.attn_implementation}}


def dump_config(config: SFTConfig, path: Path) -> Path:
    """Write ``config`` as YAML (keys = field names); returns ``path``."""
    return options.dump(config, path)


__all__ = ["CHECKPOINTING_ABOVE_TOKENS", "CONFIG_FILE", "ENGINES", "LOSS_CHUNK_TOKENS",
           "SP_ATTENTION", "LossAggregation", "SFTConfig", "SFTConfigError", "dump_config",
           "field_help", "flag", "load_config", "one_line_reason", "sequence_parallel_settings"]
