"""``train(config)``: supervised fine-tuning with transformers' ``Trainer`` on accelerate.

Trainer already does what a long SFT run needs: gradient accumulation, DDP / FSDP / DeepSpeed
from an ``accelerate launch`` config, gradient checkpointing, checkpoints in Hugging Face format
(safetensors, tokenizer, chat template) and an exact resume (model, optimizer, scheduler, data
position, RNG states). What is ours: the data (assistant-only labels, packing through
``position_ids``, see :mod:`drvenus.train.sft.data`), the loss and its average over the global
batch (per row, as verl, or per token: :mod:`drvenus.train.sft.loss`; the step's count of rows
or tokens replaces the Trainer's ``num_items_in_batch``), computed from the final hidden states
a chunk of trained tokens at a time (``loss_chunk_tokens``; the full logits never exist), the
DR-Venus / verl optimizer (AdamW betas from the config, weight decay on every trained parameter
as verl's ``AdamW(model.parameters())``, where the Trainer would exempt biases and norms),
tokens/s in the logs. The launch plan ``--dry-run`` prints is :mod:`drvenus.train.sft.launch`.

Sequence parallelism (``--sequence-parallel N``) is DeepSpeed Ulysses (ALST) as accelerate
>= 1.12 and transformers' Trainer wire it: ``TrainingArguments(parallelism_config=
ParallelismConfig(sp_backend="deepspeed", sp_size=N, sp_handler=DeepSpeedSequenceParallelConfig(
...)))`` under a DeepSpeed accelerate config. accelerate then registers Ulysses attention with
transformers, shards every batch along the sequence (``UlyssesSPDataLoaderAdapter``) and the
Trainer aggregates the loss over the sequence-parallel group (``deepspeed_sp_compute_loss``).
It is not written into the accelerate YAML: ``accelerate launch`` accepts a
``parallelism_config`` there only with FSDP2 (accelerate 1.15, ``commands/launch.py``).

Heavy libraries (torch, transformers, peft) are imported inside functions, so a dry run and the
command-line help stay fast.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drvenus import signals
from drvenus.train.sft.config import (
    CHECKPOINTING_ABOVE_TOKENS,
    CONFIG_FILE,
    LOSS_CHUNK_TOKENS,
    SFTConfig,
    SFTConfigError,
    dump_config,
    sequence_parallel_settings,
)
from drvenus.train.sft.data import (
    SFTCollator,
    SFTData,
    read_conversations,
    split_validation,
    tokenize_dataset,
)

log = logging.getLogger(__name__)

FINAL_DIR = "final"
HISTORY_FILE = "history.jsonl"
STATS_FILE = "sft_data_stats.json"


@dataclass
class SFTResult:
    """What a run produced: the final model folder, steps, losses and data counts."""

    output_dir: Path
    final_dir: Path
    global_step: int
    train_loss: float | None
    resumed_from: str | None
    log_history: list[dict[str, Any]] = field(default_factory=list)
    data_stats: dict[str, Any] = field(default_factory=dict)

    def losses(self) -> dict[int, float]:
        """Training loss by step (the logged ones)."""
        return {e["step"]: e["loss"] for e in self.log_history if "loss" in e}


# --------------------------------------------------------------------------- model and data


def _precision(config: SFTConfig) -> str:
    import torch

    if config.precision != "auto":
        return config.precision
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"


def _from_pretrained(cls: Any, path: str, **kw: Any) -> Any:
    """``cls.from_pretrained`` for a model folder, a hub name or a ``.gguf`` file."""
    from drvenus.llm.hf import from_pretrained

    return from_pretrained(cls, path, **kw)


def _adapter_base(config: SFTConfig) -> str | None:
    """The base model when ``config.model`` is a LoRA adapter folder (training continues it),
    else None."""
    from drvenus.llm.base import LLMError
    from drvenus.llm.hf import adapter_base

    try:
        base = adapter_base(config.model)
    except LLMError as exc:
        raise SFTConfigError(str(exc)) from None
    if base is not None and not config.lora:
        raise SFTConfigError(f"{config.model} is a LoRA adapter: continue it with --lora, or "
                             "merge it first (drvenus models merge-lora)")
    return base


def load_tokenizer(config: SFTConfig) -> Any:
    from transformers import AutoTokenizer

    base = _adapter_base(config)
    own = base is None or (Path(config.model) / "tokenizer_config.json").is_file()
    tokenizer = _from_pretrained(AutoTokenizer, config.model if own else base)
    if not getattr(tokenizer, "chat_template", None):
        raise SFTConfigError(f"{config.model}: the tokenizer has no chat template")
    return tokenizer


def load_model(config: SFTConfig, precision: str) -> Any:
    """The model to train: full weights in fp32 (bf16 runs use autocast on them), or a frozen
    base (in bf16 for a bf16 run) with fp32 LoRA adapters: new ones, or those of the adapter
    folder ``config.model`` (its base is the one its adapter_config.json names)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if config.lora and precision == "bf16" else torch.float32
    kw: dict[str, Any] = {"dtype": dtype}
    if config.attn_implementation:
        kw["attn_implementation"] = config.attn_implementation
    base = _adapter_base(config)
    model = _from_pretrained(AutoModelForCausalLM, base or config.model, **kw)
    model.config.use_cache = False
    if not config.lora:
        return model
    from peft import LoraConfig, PeftModel, get_peft_model

    if config.gradient_checkpointing_on():
        model.enable_input_require_grads()
    if base is not None:  # an adapter folder: its own rank and targets, trained further
        log.info("continuing the LoRA adapter %s on %s", config.model, base)
        return PeftModel.from_pretrained(model, config.model, is_trainable=True)
    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha,
                      lora_dropout=config.lora_dropout, target_modules=config.lora_targets(),
                      task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def build_data(config: SFTConfig, tokenizer: Any) -> tuple[SFTData, SFTData | None]:
    """Read, split and tokenise the training (and validation) rows."""
    rows = read_conversations(config.train)
    rows, held = split_validation(rows, config.val_fraction, config.seed)
    val_rows = read_conversations(config.val) if config.val else held
    kw = {"over_length": config.over_length, "packing": config.packing,
          "train_after_end_of_turn": config.train_after_end_of_turn}
    train_data = tokenize_dataset(rows, tokenizer, config.max_length, **kw)
    val_data = tokenize_dataset(val_rows, tokenizer, config.max_length, **kw) if val_rows else None
    for name, data in (("train", train_data), ("val", val_data)):
        if data is not None:
            s = data.stats
            log.info("%s: %d rows read, %d kept (%d truncated), skipped %s, %d sequences, "
                     "%d tokens (%d trained)", name, s.rows, s.kept, s.truncated,
                     dict(s.skipped) or "none", len(data), s.tokens, s.trained_tokens)
    return train_data, val_data


# --------------------------------------------------------------------------- trainer


def _trainer_token_losses(self: Any, model: Any, inputs: Any,
                          labels: Any) -> tuple[Any, Any, Any, Any]:
    """Per-target losses and trained mask (:mod:`drvenus.train.sft.loss`), the model's
    outputs, and a zero that ties the outputs into the loss's graph (the chunked path
    does not use its last-position logits; hooks that FSDP puts on the model's outputs
    still run in the backward). The ``_token_losses`` method of :func:`_trainer_class`'s
    Trainer."""
    from drvenus.train.sft import loss as sft_loss

    if self._chunk_tokens:
        lm = sft_loss.causal_lm(self.accelerator.unwrap_model(model))
        got = sft_loss.forward_hidden(model, inputs, lm, check=not self._head_checked)
        if not isinstance(got, str):
            self._head_checked = True
            outputs, hidden, head, autocast = got
            losses, mask = sft_loss.chunked_token_losses(hidden, labels, head,
                                                         self._chunk_tokens, autocast)
            return losses, mask, outputs, outputs.logits.float().sum() * 0
        log.warning("loss from the full logits (loss_chunk_tokens ignored): %s", got)
        self._chunk_tokens = 0
    outputs = model(**inputs)
    losses, mask = sft_loss.token_losses(outputs.logits, labels)
    return losses, mask, outputs, 0


def _trainer_class(aggregation: str = "row-mean", sequence_parallel: bool = False,
                   chunk_tokens: int | None = LOSS_CHUNK_TOKENS) -> type:
    """A ``Trainer`` with our loss (``aggregation``, see :mod:`drvenus.train.sft.loss`), weight
    decay on every trained parameter, and real tokens counted (tokens/s in the logs). Under
    ``sequence_parallel`` the loss is the Trainer's own Ulysses loss (the token mean of each
    micro batch over its shards, averaged over the micro batches: verl's aggregation, equal to
    ``row-mean`` with one unpacked row per micro batch). ``chunk_tokens``: the loss from the
    final hidden states, that many trained tokens' logits at a time
    (:func:`~drvenus.train.sft.loss.chunked_token_losses`); 0 or None: from the full logits (also
    the fallback, with a warning, for a model whose hidden states or LM head cannot be had)."""
    import torch
    from transformers import Trainer

    from drvenus.train.sft import loss as sft_loss

    class SFTTrainer(Trainer):
        _tokens = 0
        _since: float | None = None
        _aggregation = aggregation
        _sequence_parallel = sequence_parallel
        _chunk_tokens = chunk_tokens or 0
        _head_checked = False
        # our training loss is already divided by the step's global count (not per micro batch)
        loss_is_scaled_for_ga = None if sequence_parallel else True

        def get_decay_parameter_names(self, model) -> list[str]:
            return [name for name, _ in model.named_parameters()]  # verl: AdamW(all parameters)

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            batches, counted = super().get_batch_samples(epoch_iterator, num_batches, device)
            if self._sequence_parallel or not batches:
                return batches, counted
            items = sum(sft_loss.count_items(b["labels"], b.get("row_index"), self._aggregation)
                        for b in batches)
            items = torch.as_tensor(items, device=device)
            if self.accelerator.num_processes > 1:
                items = self.accelerator.gather(items).sum()
            return batches, items

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs = dict(inputs)
            tokens = inputs.pop("real_tokens", 0)
            rows = inputs.pop("row_index", None)
            inputs["use_cache"] = False  # with a cache, transformers ignores row boundaries
            if model.training and tokens:  # none under sequence parallelism (see _SPCollator)
                self._tokens += int(tokens)
                self._since = self._since or time.perf_counter()
            if self._sequence_parallel:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            labels = inputs.pop("labels")
            losses, mask, outputs, tie = self._token_losses(model, inputs, labels)
            total, items = sft_loss.aggregate(losses, mask, rows, self._aggregation)
            total = total + tie
            if model.training and num_items_in_batch is not None:
                loss = sft_loss.step_loss(total, num_items_in_batch,
                                          self.accelerator.num_processes)
            else:  # evaluation: each batch on its own
                loss = sft_loss.batch_loss(total, items)
            return (loss, outputs) if return_outputs else loss

        _token_losses = _trainer_token_losses

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            if "loss" in logs and self._since is not None:
                import torch

                tokens = torch.tensor(self._tokens, device=self.args.device)
                if self.accelerator.num_processes > 1:
                    tokens = self.accelerator.reduce(tokens, reduction="sum")
                now = time.perf_counter()
                logs["tokens_per_s"] = round(float(tokens) / max(now - self._since, 1e-9), 1)
                self._tokens, self._since = 0, now
            super().log(logs, start_time)

        def _save_checkpoint(self, model, trial) -> None:
            # Ctrl-C or SIGTERM while a checkpoint is written waits for it: never half of one
            with signals.deferred():
                super()._save_checkpoint(model, trial)

    return SFTTrainer


def parallelism_config(config: SFTConfig) -> Any:
    """accelerate's ``ParallelismConfig`` for ``--sequence-parallel`` (None without it)."""
    settings = sequence_parallel_settings(config)
    if settings is None:
        return None
    from accelerate import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    handler = DeepSpeedSequenceParallelConfig(**settings.pop("sp_handler"))
    return ParallelismConfig(**settings, sp_handler=handler)


@dataclass
class _SPCollator:
    """Under Ulysses: pads every batch to a multiple of the sequence-parallel size (the
    dataloader adapter cuts it in equal shards) and leaves out ``real_tokens``, which is not a
    per-token tensor the adapter could shard, and ``row_index``, which the Trainer's Ulysses
    loss does not use."""

    inner: SFTCollator
    multiple: int

    def __call__(self, batch: Any) -> dict[str, Any]:
        import torch

        out = self.inner(batch)
        out.pop("real_tokens", None)
        out.pop("row_index", None)  # the Trainer's Ulysses loss averages each micro batch
        pad = -out["input_ids"].shape[1] % self.multiple
        if pad:
            rows = out["input_ids"].shape[0]
            fill = {"input_ids": self.inner.pad_token_id, "labels": -100}
            for key in ("input_ids", "labels"):
                extra = torch.full((rows, pad), fill[key], dtype=torch.long)
                out[key] = torch.cat([out[key], extra], dim=1)
            extra = torch.arange(pad, dtype=torch.long).expand(rows, pad)
            out["position_ids"] = torch.cat([out["position_ids"], extra], dim=1)
        return out


def collator(config: SFTConfig, pad_token_id: int) -> Any:
    inner = SFTCollator(pad_token_id)
    if sequence_parallel_settings(config) is None:
        return inner
    return _SPCollator(inner, config.sequence_parallel)


def training_arguments(config: SFTConfig, world_size: int, precision: str, has_val: bool) -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(
        parallelism_config=parallelism_config(config),
        output_dir=config.output,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.micro_batch_size,
        per_device_eval_batch_size=config.micro_batch_size,
        gradient_accumulation_steps=config.grad_accumulation(world_size),
        learning_rate=config.learning_rate,
        lr_scheduler_type="cosine" if config.lr_scheduler == "cosine" else "constant_with_warmup",
        warmup_steps=config.warmup_ratio,  # a float < 1 is a ratio of the total steps
        weight_decay=config.weight_decay,
        adam_beta1=config.adam_beta1,
        adam_beta2=config.adam_beta2,
        train_sampling_strategy="random" if config.shuffle else "sequential",
        max_grad_norm=config.max_grad_norm,
        seed=config.seed,
        bf16=precision == "bf16",
        use_cpu=not _cuda(),
        **checkpointing_arguments(config.gradient_checkpointing_on()),
        eval_strategy="steps" if has_val else "no",
        eval_steps=config.eval_steps,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=config.save_total_limit,
        logging_steps=config.logging_steps,
        report_to=config.report_targets() or "none",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        prediction_loss_only=True,
    )


def checkpointing_arguments(on: bool) -> dict[str, Any]:
    """The ``TrainingArguments`` of gradient checkpointing, under this transformers' names:
    ``activation_checkpointing`` (later 5.x; ``gradient_checkpointing`` is then its deprecated
    alias) or ``gradient_checkpointing`` (4.x and early 5.x, e.g. 5.17, which has no other)."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    prefix = "activation" if "activation_checkpointing" in names else "gradient"
    return {f"{prefix}_checkpointing": on,
            f"{prefix}_checkpointing_kwargs": {"use_reentrant": False}}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _checkpointing_reason(config: SFTConfig) -> str:
    on = "on" if config.gradient_checkpointing_on() else "off"
    if config.gradient_checkpointing is not None:
        return on
    tokens = config.micro_batch_size * config.max_length
    sign = ">" if config.gradient_checkpointing_on() else "<="
    return f"{on} (unset: micro batch x max length = {tokens} {sign} {CHECKPOINTING_ABOVE_TOKENS})"


# The Trainer writes a checkpoint's trainer_state.json last: without it (or with half of it) the
# save was cut short (the process killed while writing it) and the checkpoint cannot resume.
TRAINER_STATE = "trainer_state.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoints(output: str | Path) -> list[tuple[int, Path, bool]]:
    """The ``checkpoint-N`` folders of ``output`` as ``(N, folder, complete)``, oldest first."""
    folder = Path(output)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir()
             if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return [(n, p, _complete(p)) for n, p in sorted(found)]


def _complete(checkpoint: Path) -> bool:
    try:
        state = json.loads((checkpoint / TRAINER_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(state, dict)


def latest_checkpoint(output: str | Path) -> str | None:
    """The newest complete ``checkpoint-N`` folder in ``output``, or None."""
    complete = [p for _, p, ok in checkpoints(output) if ok]
    return str(complete[-1]) if complete else None


def _resume_point(config: SFTConfig) -> str | None:
    found = checkpoints(config.output)
    latest = latest_checkpoint(config.output)
    last_ok = max((n for n, _, ok in found if ok), default=-1)
    newer = [p.name for n, p, ok in found if not ok and n > last_ok]
    cut = (f"{', '.join(newer)} {'is' if len(newer) == 1 else 'are'} incomplete (no complete "
           f"{TRAINER_STATE}: the run was stopped while saving)") if newer else ""
    if config.resume:
        if latest is None:
            log.warning("--resume: no complete checkpoint in %s%s; starting from the beginning",
                        config.output, f" ({cut})" if cut else "")
        elif cut:
            log.warning("--resume: %s; resuming from the last complete one, %s", cut,
                        Path(latest).name)
        else:
            log.info("resuming from %s", latest)
        return latest
    if found:
        raise SFTConfigError(f"{config.output} already has checkpoints{f' ({cut})' if cut else ''}"
                             ": pass --resume to continue the run from the last complete one, "
                             "or choose another --output")
    return None


def train(config: SFTConfig, *, callbacks: list[Any] | None = None) -> SFTResult:
    """Run SFT as ``config`` says (one process, or one of many under ``accelerate launch`` /
    ``torchrun``). ``callbacks``: extra transformers ``TrainerCallback`` s."""
    from accelerate import PartialState
    from transformers import set_seed

    config.validate()
    state = PartialState()
    resume_from = _resume_point(config)
    set_seed(config.seed)
    precision = _precision(config)
    tokenizer = load_tokenizer(config)
    train_data, val_data = build_data(config, tokenizer)
    model = load_model(config, precision)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    args = training_arguments(config, state.num_processes, precision, val_data is not None)
    sequence_parallel = sequence_parallel_settings(config) is not None
    chunks = (f"from the LM head {config.loss_chunk_tokens} trained tokens at a time"
              if config.loss_chunk_tokens and not sequence_parallel else "from the full logits")
    log.info("loss %s %s, AdamW betas (%s, %s), %s row order, gradient checkpointing %s",
             config.loss_aggregation, chunks, config.adam_beta1, config.adam_beta2,
             "shuffled" if config.shuffle else "file", _checkpointing_reason(config))
    trainer = _trainer_class(config.loss_aggregation, sequence_parallel,
                             config.loss_chunk_tokens)(
        model=model, args=args, train_dataset=train_data, eval_dataset=val_data,
        data_collator=collator(config, int(pad or 0)), processing_class=tokenizer,
        callbacks=callbacks,
    )
    stats = {"train": train_data.stats.as_dict(), "train_sequences": len(train_data),
             "val": val_data.stats.as_dict() if val_data else None}
    if state.is_main_process:
        dump_config(config, Path(config.output) / CONFIG_FILE)
        (Path(config.output) / STATS_FILE).write_text(json.dumps(stats, indent=2))
    output = trainer.train(resume_from_checkpoint=resume_from)
    final = Path(config.output) / FINAL_DIR
    trainer.save_model(str(final))
    if state.is_main_process:  # the loss and validation-loss curves, one JSON line a log
        with (Path(config.output) / HISTORY_FILE).open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(e) + "\n" for e in trainer.state.log_history)
    return SFTResult(Path(config.output), final, trainer.state.global_step,
                     output.training_loss, resume_from, list(trainer.state.log_history), stats)


__all__ = ["SFTResult", "build_data", "checkpointing_arguments", "checkpoints", "collator",
           "latest_checkpoint", "load_model", "load_tokenizer", "parallelism_config", "train",
           "training_arguments"]
