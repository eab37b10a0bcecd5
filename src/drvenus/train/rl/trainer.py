"""``drvenus rl`` on one machine: rollouts, IG, rewards, advantages, the PPO update, checkpoints.

Each step: the step's questions (a seeded shuffle per epoch, incomplete last batch dropped as
verl does), ``n_rollouts`` trajectories each through the agent loop
(:func:`~drvenus.train.rl.collect.run_rollouts`), outcome rewards, IG scored with the policy
itself (no grad, KV cache), format penalties, token rewards, IGPO advantages, then
``ppo_epochs`` x ``ppo_mini_batches`` AdamW updates (token-mean over each mini-batch, low-var KL
to a frozen copy of the starting model, an entropy bonus of ``entropy_coef`` times the
token-mean entropy over the loss mask, off by default but ``actor/entropy`` always logged,
gradient clipping). With one mini-batch and one epoch
the old log-probs are the current ones (ratio 1, on-policy), as in DR-Venus.

Rollouts sample from the policy in memory (``engine: transformers``), or from a vLLM / SGLang
server: SGLang reloads the weights after every update (``/update_weights_from_disk``); a vLLM
server keeps its weights, so such a run is off-policy after step one (use verl to scale out).

Output folder: ``config.yaml``, ``metrics.jsonl`` (one line per step), ``tensorboard/``,
``traces/step-NNNNNN.jsonl`` and ``step-NNNNNN.events.jsonl`` (the trajectories' trace events,
replayable by ``drvenus serve``; every ``trace_save_interval`` steps) and
``checkpoints/step-NNNNNN/`` (Hugging Face model + tokenizer, ``optimizer.pt``,
``trainer_state.json``). ``resume`` continues from the newest checkpoint and reproduces the
run that was not interrupted (seeded rollouts, same data order).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from drvenus.agent.events import write_events
from drvenus.protocol import ANSWER_SPLIT
from drvenus.train import options
from drvenus.train.rl.batch import (
    Sample,
    assign_advantages,
    build_sample,
    engine_gains,
    outcomes,
    trainer_gains,
)
from drvenus.train.rl.collect import (
    Rollout,
    RolloutConfig,
    run_rollouts,
    trace_file,
    traced_step,
)
from drvenus.train.rl.config import NO_JUDGE, RLConfig, RLConfigError
from drvenus.train.rl.ig import IGConfig
from drvenus.train.rl.policy import policy_loss, token_logprobs
from drvenus.train.rl.questions import question_rows

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"


@dataclass
class RLResult:
    """What a run did: steps done, the last checkpoint, per-step metrics."""

    steps: int
    checkpoint: Path | None
    history: list[dict[str, float]] = field(default_factory=list)


# --------------------------------------------------------------------------- data and model


def batch_indices(n_rows: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Rows of ``step``: a seeded shuffle per epoch, full batches only."""
    per_epoch = max(1, n_rows // batch_size)
    epoch, pos = divmod(step, per_epoch)
    order = list(range(n_rows))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    size = min(batch_size, n_rows)
    return order[pos * size:(pos + 1) * size]


def steps_planned(config: RLConfig, n_rows: int) -> int:
    if config.total_steps > 0:
        return config.total_steps
    return max(1, n_rows // config.batch_size) * config.epochs


def load_policy(path: str | Path, device: str) -> tuple[Any, Any]:
    """(model in fp32 on ``device``, tokenizer) from a model folder, a ``.gguf`` file, or a
    LoRA adapter folder (``drvenus sft --lora``'s output): then the adapter is what trains, on
    its frozen base, and checkpoints are adapters too."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drvenus.llm.hf import adapter_base, from_pretrained

    base = adapter_base(path)
    has_tokenizer = (Path(path) / "tokenizer_config.json").is_file()
    tokenizer = from_pretrained(AutoTokenizer, path if base is None or has_tokenizer else base)
    if not getattr(tokenizer, "chat_template", None):
        raise RLConfigError(f"{path}: the tokenizer has no chat template")
    if base is None:
        model = from_pretrained(AutoModelForCausalLM, path, dtype=torch.float32)
    else:
        from peft import PeftModel

        model = PeftModel.from_pretrained(
            from_pretrained(AutoModelForCausalLM, base, dtype=torch.float32), str(path),
            is_trainable=True)
    model = model.to(device)
    model.eval()  # no dropout: rollouts, IG and the loss see the same function
    return model, tokenizer


# --------------------------------------------------------------------------- checkpoints


def checkpoints(output: Path) -> list[Path]:
    folder = output / CHECKPOINTS
    found = [p for p in folder.glob("step-*") if (p / STATE_FILE).is_file()] if folder.is_dir() \
        else []
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def save_checkpoint(output: Path, step: int, model: Any, tokenizer: Any, optimizer: Any,
                    keep: int | None) -> Path:
    """Write ``checkpoints/step-NNNNNN`` atomically (a temp folder renamed at the end)."""
    final = output / CHECKPOINTS / f"step-{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / STATE_FILE).write_text(json.dumps({"step": step}), encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    if keep is not None and keep > 0:
        for old in checkpoints(output)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


# --------------------------------------------------------------------------- the update


def _response_logprobs(model: Any, sample: Sample, temperature: float,
                       autocast: Any) -> torch.Tensor:
    ids = torch.tensor([sample.input_ids], dtype=torch.long, device=next(model.parameters()).device)
    with autocast():
        lp = token_logprobs(model, ids, temperature=temperature)
    return lp[0, sample.prompt_len - 1:].float()


def _response_logprobs_entropy(model: Any, sample: Sample, temperature: float, autocast: Any,
                               entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the response tokens and the entropy of each of their distributions (with
    a graph only when ``entropy_grad``: the bonus is on)."""
    ids = torch.tensor([sample.input_ids], dtype=torch.long, device=next(model.parameters()).device)
    with autocast():
        lp, ent = token_logprobs(model, ids, temperature=temperature, with_entropy=True,
                                 entropy_grad=entropy_grad)
    start = sample.prompt_len - 1
    return lp[0, start:].float(), ent[0, start:].float()


def _loss_mask(sample: Sample, config: RLConfig, device: torch.device) -> torch.Tensor:
    if config.mask_tool_response:
        return torch.tensor(sample.loss_mask, dtype=torch.float32, device=device)
    # everything after the first sampled token (tool responses included), as without masking
    return torch.ones(sample.response_len, dtype=torch.float32, device=device)


class Updater:
    """The PPO update of one batch (see the module doc)."""

    def __init__(self, model: Any, ref: Any | None, optimizer: Any, config: RLConfig) -> None:
        self.model, self.ref, self.optimizer, self.config = model, ref, optimizer, config
        self.device = next(model.parameters()).device
        bf16 = config.precision == "bf16" or (config.precision == "auto"
                                              and self.device.type == "cuda")
        kind = self.device.type  # bf16 on CPU too when asked for: native on AVX512-BF16 / AMX
        self.autocast = (lambda: torch.autocast(kind, dtype=torch.bfloat16)) if bf16 \
            else _null_context

    def _fixed_logprobs(self, model: Any, samples: Sequence[Sample]) -> list[torch.Tensor]:
        with torch.no_grad():
            return [_response_logprobs(model, s, self.config.temperature, self.autocast)
                    for s in samples]

    def update(self, samples: Sequence[Sample], rng: random.Random) -> dict[str, float]:
        cfg = self.config
        live = [s for s in samples if sum(s.loss_mask) > 0]
        if not live:
            return {"actor/skipped_update": 1.0}
        on_policy = cfg.ppo_mini_batches == 1 and cfg.ppo_epochs == 1
        old = None if on_policy else self._fixed_logprobs(self.model, live)
        ref = self._fixed_logprobs(self.ref, live) if self.ref is not None and cfg.kl_coef \
            else None
        totals: Counter[str] = Counter()
        updates = 0
        for _epoch in range(cfg.ppo_epochs):
            order = list(range(len(live)))
            rng.shuffle(order)
            size = math.ceil(len(order) / cfg.ppo_mini_batches)
            for start in range(0, len(order), size):
                chunk = order[start:start + size]
                metrics = self._minibatch(live, chunk, old, ref)
                totals.update(metrics)
                updates += 1
        out = {k: v / updates for k, v in totals.items()}
        out["actor/updates"] = float(updates)
        return out

    def _minibatch(self, samples: Sequence[Sample], chunk: Sequence[int],
                   old: list[torch.Tensor] | None, ref: list[torch.Tensor] | None
                   ) -> dict[str, float]:
        cfg = self.config
        masks = {i: _loss_mask(samples[i], cfg, self.device) for i in chunk}
        total = sum(float(m.sum()) for m in masks.values())
        sums: Counter[str] = Counter()
        self.optimizer.zero_grad(set_to_none=True)
        for i in chunk:
            s, mask = samples[i], masks[i]
            if float(mask.sum()) == 0:
                continue
            lp, entropy = _response_logprobs_entropy(self.model, s, cfg.temperature,
                                                     self.autocast, bool(cfg.entropy_coef))
            adv = s.advantages.to(self.device) if s.advantages is not None else torch.zeros_like(lp)
            loss, metrics = policy_loss(
                lp, lp.detach() if old is None else old[i], None if ref is None else ref[i],
                adv, mask, clip=cfg.clip_ratio, clip_ratio_c=cfg.clip_ratio_c,
                kl_coef=cfg.kl_coef, kl_type=cfg.kl_type, entropy=entropy,
                entropy_coef=cfg.entropy_coef,
            )
            weight = float(mask.sum()) / total
            (loss * weight).backward()
            for k, v in metrics.items():
                sums[k] += v * weight
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            log.warning("non-finite gradient norm: update skipped")
        self.optimizer.zero_grad(set_to_none=True)
        sums["actor/grad_norm"] = float(grad_norm)
        sums["actor/loss_tokens"] = total
        return dict(sums)


class _null_context:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# --------------------------------------------------------------------------- metrics


def rollout_metrics(rollouts: Sequence[Rollout], samples: Sequence[Sample]) -> dict[str, float]:
    m: dict[str, float] = {"rollout/trajectories": float(len(rollouts)),
                           "rollout/unusable": float(len(rollouts) - len(samples))}
    for name, n in Counter(r.result.termination for r in rollouts).items():
        m[f"rollout/termination/{name}"] = n / len(rollouts)
    if any("cutoff" in r.result.extra for r in rollouts):  # DR-Venus's environment
        m["rollout/cutoff"] = sum(bool(r.result.extra.get("cutoff")) for r in rollouts) \
            / len(rollouts)
    if samples:
        n = len(samples)
        m["rollout/turns_mean"] = sum(len(s.formats) for s in samples) / n
        m["rollout/tokens_mean"] = sum(len(s.input_ids) for s in samples) / n
        m["rollout/sampled_tokens"] = float(sum(sum(s.loss_mask) for s in samples))
        m["reward/outcome_mean"] = sum(s.outcome for s in samples) / n
        turns = [f for s in samples for f in s.formats]
        m["reward/malformed_turn_ratio"] = turns.count(False) / max(len(turns), 1)
        gains = [g for s in samples for g in s.info_gains if g is not None]
        m["reward/ig_scored_turns"] = float(len(gains))
        m["reward/ig_nonzero"] = float(sum(1 for g in gains if g != 0.0))
        if gains:
            m["reward/ig_mean"] = sum(gains) / len(gains)
    return m


class MetricSink:
    """metrics.jsonl always; tensorboard and a console line when asked."""

    def __init__(self, output: Path, loggers: Sequence[str], resume_step: int,
                 echo: Callable[[str], None] | None) -> None:
        self.path = output / "metrics.jsonl"
        if self.path.exists():  # drop lines past the checkpoint we resume from
            rows = self._kept_rows(resume_step)
            self.path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        self.echo = echo if "console" in loggers else None
        self.tb = None
        if "tensorboard" in loggers:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(output / "tensorboard"))
            except ImportError:
                log.warning("tensorboard is not installed: metrics go to metrics.jsonl only")

    def _kept_rows(self, resume_step: int) -> list[dict[str, Any]]:
        """The rows up to ``resume_step``; a torn last line (a killed run) is dropped with a
        warning, a damaged line before it is an error naming it."""
        from drvenus.jsonl import read_jsonl

        rows = list(read_jsonl(self.path))
        if rows and not rows[-1].ok:
            log.warning("%s: dropped a torn last line (line %d: %s)", self.path,
                        rows[-1].lineno, rows[-1].error)
            rows.pop()
        bad = next((r for r in rows if not r.ok), None)
        if bad is not None:
            raise ValueError(f"{self.path} line {bad.lineno}: {bad.error}; fix or remove the "
                             "line to resume")
        return [r.value for r in rows if r.value.get("step", 0) <= resume_step]

    def write(self, step: int, metrics: dict[str, float]) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.echo is not None:
            keys = ("reward/outcome_mean", "reward/ig_mean", "rollout/turns_mean",
                    "actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "time/step_s")
            shown = "  ".join(f"{k.split('/')[-1]}={metrics[k]:.4g}" for k in keys if k in metrics)
            self.echo(f"step {step}: {shown}")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def save_traces(output: Path, step: int, samples: Sequence[Sample],
                rollouts: Sequence[Rollout]) -> Path:
    """``traces/step-NNNNNN.jsonl`` (one line per trajectory: scores and messages) and, when
    the rollouts kept their trace events, ``step-NNNNNN.events.jsonl``: every trajectory's
    events, as ``drvenus ask --trace`` writes them (``drvenus serve`` replays them)."""
    path = trace_file(output / "traces", step)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for s in samples:
            fh.write(json.dumps(s.trace(), ensure_ascii=False) + "\n")
        for r in rollouts:
            if r.tokens is None:
                fh.write(json.dumps({"group": r.group, "index": r.index, "unusable": True,
                                     "termination": r.result.termination,
                                     "error": r.error}, ensure_ascii=False) + "\n")
    if any(r.events for r in rollouts):
        write_events(trace_file(output / "traces", step, events=True),
                     (event for r in rollouts for event in r.events))
    return path


# --------------------------------------------------------------------------- the run


@dataclass
class _Run:
    """Everything a run holds open."""

    config: RLConfig
    output: Path
    rows: list[tuple[str, str]]
    model: Any
    tokenizer: Any
    ref: Any | None
    optimizer: Any
    engine: Any
    tools: Any
    judge: Any | None
    start_step: int
    rollout: RolloutConfig  # built once
    on_rollout: Callable[[Rollout], None] | None = None


def _build_engine(config: RLConfig, model: Any, tokenizer: Any) -> Any:
    from drvenus.train.rl.engine import HFEngine, ServerEngine

    if config.engine == "transformers":
        return HFEngine.from_policy(model, tokenizer, slots=config.rollout_concurrency,
                                    window=config.max_model_len)
    if config.engine == "vllm":
        log.warning("a vLLM server keeps its weights: rollouts after step 1 are off-policy "
                    "(use SGLang, the transformers engine, or verl for on-policy training)")
    return ServerEngine(str(config.engine_url), tokenizer, flavor=config.engine,
                        window=config.max_model_len)


def _build_tools(config: RLConfig) -> Any:
    from drvenus.config import load_settings
    from drvenus.stack import build_toolbox

    settings = load_settings(corpus=config.corpus, tools_url=config.tools_url,
                             search=config.search, visit=config.visit)
    return build_toolbox(settings)


def make_judge(judge_url: str | None, judge_model: str | None,
               concurrency: int | None = None) -> Any:
    """The outcome judge: BrowseComp's HLE-style verdict on an OpenAI-compatible model
    (options, else ``DRVENUS_JUDGE_*``); :class:`RLConfigError` when none is configured."""
    from drvenus.eval.benchmarks import EvalItem
    from drvenus.eval.judges import grade_browsecomp
    from drvenus.grading.judge import JudgeClient, JudgeConfig

    concurrency = concurrency or RLConfig().judge_concurrency
    cfg = JudgeConfig.from_options(judge_url, judge_model, concurrency=concurrency)
    if cfg is None:
        raise RLConfigError(NO_JUDGE)
    client = JudgeClient(cfg)

    async def judge(question: str, answer: str, gt: str) -> bool:
        answers = gt.split(ANSWER_SPLIT)
        grade = await grade_browsecomp(EvalItem("rl", question, answers[0], answers), answer,
                                       client)
        if grade.correct is None:
            raise RuntimeError(grade.error or "no verdict")
        return bool(grade.correct)

    return judge


def build_judge(config: RLConfig) -> Any | None:
    """The outcome judge: ours, or with protocol dr-venus DR-Venus's RL judge (its prompt from
    the pinned files, its sampling; :mod:`drvenus.train.rl.judge`)."""
    if config.reward_type != "llm":
        return None
    from drvenus.reference.profiles import profile

    texts = profile(config.protocol_name()).rl_judge_texts()
    if texts is not None:
        from drvenus.train.rl.judge import make_dr_venus_judge

        judge = make_dr_venus_judge(texts, config.judge_url, config.judge_model,
                                    config.judge_concurrency)
        if judge is None:
            raise RLConfigError(NO_JUDGE)
        return judge
    return make_judge(config.judge_url, config.judge_model, config.judge_concurrency)


_build_judge = build_judge


def _open_run(config: RLConfig) -> _Run:
    output = Path(config.output)
    output.mkdir(parents=True, exist_ok=True)
    rows = question_rows(config.train)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_policy(config.model, device)
    ref = None
    if config.kl_coef:
        ref = copy.deepcopy(model).eval()
        ref.requires_grad_(False)
    start = 0
    found = checkpoints(output) if config.resume else []
    if found:
        latest = found[-1]
        model.load_state_dict(load_policy(latest, device)[0].state_dict())
        start = json.loads((latest / STATE_FILE).read_text(encoding="utf-8"))["step"]
        log.info("resuming from %s (step %d)", latest, start)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    trainable = [p for p in model.parameters() if p.requires_grad]  # an adapter's, or all
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate,
                                  weight_decay=config.weight_decay)
    if found:
        optimizer.load_state_dict(torch.load(found[-1] / "optimizer.pt", map_location=device))
    options.dump(config, output / "config.yaml")
    rollout = RolloutConfig.from_rl(config)
    return _Run(config, output, rows, model, tokenizer, ref, optimizer,
                _build_engine(config, model, tokenizer), _build_tools(config),
                build_judge(config), start, rollout)


async def _step_samples(run: _Run, step: int) -> tuple[list[Rollout], list[Sample],
                                                         dict[str, float]]:
    cfg = run.config
    items = [run.rows[i] for i in batch_indices(len(run.rows), cfg.batch_size, step, cfg.seed)]
    t0 = time.perf_counter()
    rollouts = await run_rollouts(items, run.engine, run.tools, run.rollout, step=step,
                                  on_done=run.on_rollout,
                                  trace=traced_step(cfg.trace_save_interval, step + 1))
    t1 = time.perf_counter()
    usable = [r for r in rollouts if r.tokens is not None]
    scores, judge_stats = await outcomes(usable, cfg.reward_type, run.judge,
                                         cfg.judge_concurrency, run.tokenizer)
    penalty = cfg.format_penalty_scale if cfg.use_format_penalty else None
    policy = run.model if cfg.use_info_gain else None
    gains: list[Any] = [None] * len(usable)
    metrics: dict[str, float] = {}
    ig = IGConfig.from_rl(cfg)
    if cfg.use_info_gain and cfg.ig_source == "engine":
        gains = await engine_gains(run.engine, run.tokenizer, usable, ig)
        metrics.update(_crosscheck(run, usable, gains))
    samples = [build_sample(r, o, run.tokenizer, policy, ig, format_penalty=penalty,
                            gains=g) for r, o, g in zip(usable, scores, gains, strict=True)]
    t2 = time.perf_counter()
    metrics |= {"time/rollout_s": t1 - t0, "time/reward_s": t2 - t1,
                "judge/judged": float(judge_stats.judged),
                "judge/exact": float(judge_stats.exact),
                "judge/failures": float(judge_stats.failures)}
    return rollouts, samples, metrics


def _crosscheck(run: _Run, rollouts: Sequence[Rollout], gains: Sequence[Any]
                ) -> dict[str, float]:
    """Score the first ``ig_crosscheck`` multi-turn rollouts on the trainer too and report the
    largest difference to the engine's IG."""
    n, worst = 0, 0.0
    for r, g in zip(rollouts, gains, strict=True):
        if n >= run.config.ig_crosscheck:
            break
        if r.tokens is None or len(r.tokens.turns) < 2:
            continue
        mine = trainer_gains(run.model, run.tokenizer, r, IGConfig.from_rl(run.config))
        for a, b in zip(mine, g, strict=True):
            if (a is None) != (b is None):
                worst = math.inf
            elif a is not None:
                worst = max(worst, abs(a - b))
        n += 1
    if not n:
        return {}
    if worst > 1e-2:
        log.warning("IG cross-check: the engine and the trainer differ by up to %.4g", worst)
    return {"ig/crosscheck_samples": float(n), "ig/crosscheck_max_abs_diff": worst}


def _after_update(run: _Run, loop: asyncio.AbstractEventLoop) -> None:
    """Rollout engines must see the new weights."""
    if hasattr(run.engine, "clear_cache"):
        run.engine.clear_cache()
    if getattr(run.engine, "flavor", None) == "sglang":
        weights = run.output / "rollout-weights"
        run.model.save_pretrained(weights)
        run.tokenizer.save_pretrained(weights)
        loop.run_until_complete(run.engine.reload_weights(str(weights)))


def train(config: RLConfig, *, echo: Callable[[str], None] | None = None,
          on_step: Callable[[int, int], Callable[[Rollout], None] | None] | None = None
          ) -> RLResult:
    """Run ``drvenus rl`` (see the module doc); ``echo`` prints the console lines;
    ``on_step(step, trajectories)`` may return a callback called as each rollout finishes."""
    run = _open_run(config)
    total = steps_planned(config, len(run.rows))
    sink = MetricSink(run.output, config.loggers(), run.start_step, echo)
    updater = Updater(run.model, run.ref, run.optimizer, config)
    history: list[dict[str, float]] = []
    last_ckpt = checkpoints(run.output)[-1] if run.start_step else None
    igpo = {"norm_mode": config.norm_mode, "gamma": config.gamma,
            "ig_weight": config.ig_weight, "norm_by_std": config.norm_by_std}
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        for step in range(run.start_step, total):
            t0 = time.perf_counter()
            if on_step is not None:
                run.on_rollout = on_step(step + 1, config.batch_size * config.n_rollouts)
            rollouts, samples, metrics = loop.run_until_complete(_step_samples(run, step))
            metrics.update(rollout_metrics(rollouts, samples))
            metrics.update(assign_advantages(samples, **igpo))
            metrics.update(updater.update(samples, random.Random(f"{config.seed}:{step}:ppo")))
            _after_update(run, loop)
            done = step + 1
            metrics["time/step_s"] = time.perf_counter() - t0
            sink.write(done, metrics)
            history.append(metrics)
            if traced_step(config.trace_save_interval, done):
                save_traces(run.output, done, samples, rollouts)
            if done % config.save_freq == 0 or done == total:
                last_ckpt = save_checkpoint(run.output, done, run.model, run.tokenizer,
                                            run.optimizer, config.keep_checkpoints)
    finally:
        sink.close()
        loop.run_until_complete(_close(run))
        loop.close()
        asyncio.set_event_loop(None)
    return RLResult(steps=total, checkpoint=last_ckpt, history=history)


async def _close(run: _Run) -> None:
    await run.engine.aclose()
    close = getattr(run.tools, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # closing is best effort
            log.debug("closing the tools failed", exc_info=True)


__all__ = [
    "RLResult", "Updater", "batch_indices", "build_judge", "checkpoints", "load_policy",
    "make_judge",
    "rollout_metrics", "save_checkpoint", "save_traces", "steps_planned", "train",
]
