"""``RLConfig``: every setting of a ``drvenus rl`` run, one field per command-line option.

YAML keys are the field names; flags override the file. Defaults are DR-Venus's
(``RL/train_igpo.sh``): 16 questions x 8 rollouts per step, up to 200 turns, temperature 1.0 and
top_p 0.95, 8192 new tokens per turn, IG on turns after a ``visit`` call with
``scaled_separate`` normalisation, gamma 0.95, format penalty 1.0, LLM-judge outcome, lr 1e-6,
low-variance KL 0.001, clip 0.2, gradient clip 1.0, one update per batch (on-policy),
tool-response tokens out of the loss, a checkpoint every 5 steps, traces every 10.

Every default of an RL run lives here, once: the settings other parts derive from it (the
rollout's ``RolloutConfig.from_rl``, IG's ``IGConfig.from_rl``, the verl reward manager, advantage
estimator and agent loop, which fill what verl does not pass from :class:`RLConfig`) have none
of their own. The module imports no torch (the CLI loads it at start).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from drvenus.agent.context import DEFAULT_KEEP_LAST
from drvenus.config import CONTEXT_STRATEGIES
from drvenus.protocol.profiles import DEFAULT_PROTOCOL, PROTOCOLS, protocol_names
from drvenus.train import options
from drvenus.train.options import ConfigError, flag

ENGINES = ("transformers", "vllm", "sglang")
# the choices of the IGPO knobs (their modules import these names)
NORM_MODES = ("joint", "separate", "scaled_separate", "raw_ig")
INFO_GAIN_TYPES = ("log_prob_diff", "prob_diff")
ROLLOUT_MODES = ("deterministic", "robust")
_opt = options.opt


class RLConfigError(ConfigError):
    """An invalid RL setting."""


@dataclass
class RLConfig:
    """Settings of one ``drvenus rl`` run (see the module doc)."""

    # data and model
    train: str = _opt("Training questions: parquet / JSONL in the RL format (prompt, "
                      "reward_model.ground_truth).", "")
    model: str = _opt("Policy to start from: a Hugging Face model folder, a .gguf file, or a "
                      "LoRA adapter folder (then the adapter trains).", "")
    output: str = _opt("Output folder: checkpoints, metrics, traces.", "")
    # rollouts
    engine: str = _opt("Rollout engine: transformers (in process) | vllm | sglang (a server).",
                       "transformers")
    engine_url: str | None = _opt("Base URL of the vLLM / SGLang server (engine vllm|sglang).")
    n_rollouts: int = _opt("Trajectories per question (the group size).", 8)
    rollout_mode: str = _opt("deterministic (no retries) | robust (the inference loop's "
                             "retries on repetition, parse errors, duplicate calls).",
                             "deterministic")
    robust_max_retries: int = _opt("Retries per turn in robust mode.", 3, ge=0)
    protocol: str | None = _opt(
        "Whose rollout environment: drvenus (ours: the inference loop and its words) | "
        "dr-venus (DR-Venus's RL environment: its loop, system prompt, notices and outcome "
        "judge, texts read from its pinned files; docs/RL.md). Default: DRVENUS_PROTOCOL, else "
        "drvenus.")
    max_turns: int = _opt("Turns per trajectory, the forced final one included.", 200)
    max_turns_jitter: int = _opt("Random jitter of each trajectory's turn limit (+-N).", 5,
                                 ge=0)
    completion_cutoff: float = _opt(
        "dr-venus: once this fraction of a step's trajectories have finished, the others are "
        "told to answer now (0: off).", 0.9)
    tool_timeout: float = _opt("dr-venus: seconds a tool call may take before DR-Venus's "
                               "timeout message is its result.", 150.0)
    max_model_len: int = _opt("Context window of a trajectory, tokens.", 261_000)
    max_response_len: int = _opt("New tokens per turn.", 8192)
    temperature: float = _opt("Rollout temperature (also the IG and loss temperature).", 1.0)
    top_p: float = _opt("Rollout top-p.", 0.95, gt=0, le=1)
    top_k: int = _opt("Rollout top-k (-1: off).", -1)
    rollout_concurrency: int = _opt("Trajectories in flight at once.", 8)
    rollout_time_limit: float = _opt("Seconds one trajectory may take.", 7200.0, gt=0)
    context_strategy: str = _opt(
        "What a trajectory does near its context budget, as in inference: none (the forced "
        "answer; DR-Venus's) | keep-last-k (older tool results become a one-line stub) | "
        "summarise (a report, then a restart from it).", "none")
    keep_last: int = _opt("With --context-strategy keep-last-k: the tool results kept whole.",
                          DEFAULT_KEEP_LAST, ge=0)
    # tools
    corpus: str | None = _opt("Local corpus for the offline tools (built-in if unset).")
    tools_url: str | None = _opt("A drvenus tool server to use instead (drvenus tools serve).")
    search: str | None = _opt("Search providers, e.g. serper,local (default: local).")
    visit: str | None = _opt("Visit providers, e.g. jina,fetch,local (default: local).")
    # rewards
    reward_type: Literal["llm", "f1"] = _opt("Outcome reward: llm (a judge) | f1.", "llm")
    judge_url: str | None = _opt("OpenAI-compatible base URL of the outcome judge.")
    judge_model: str | None = _opt("Judge model name.")
    judge_concurrency: int = _opt("Judge requests at once.", 8)
    use_format_penalty: bool = _opt("Penalise malformed turns (-scale instead of IG/outcome).",
                                    True)
    format_penalty_scale: float = _opt("Format penalty magnitude.", 1.0, ge=0)
    # information gain
    use_info_gain: bool = _opt("Dense per-turn IG rewards (IGPO); off = GRPO on outcomes.", True)
    info_gain_type: str = _opt("log_prob_diff | prob_diff.", "log_prob_diff")
    ig_tool_filter: str = _opt("Score only turns after these tools (comma list; empty: all).",
                               "visit")
    ig_compute_freq: int = _opt("Score every N-th boundary.", 1)
    ig_chunk_size: int = _opt("Trajectory tokens per forward when building the IG cache.", 8192)
    ig_source: Literal["trainer", "engine"] = _opt(
        "trainer (KV cache on the policy) | engine (the rollout server's prompt log-probs).",
        "trainer")
    ig_crosscheck: int = _opt("With --ig-source engine: also score N trajectories a step on the "
                              "trainer and log the largest difference.", 0, ge=0)
    # advantages
    norm_mode: str = _opt("IG normalisation: joint | separate | scaled_separate | raw_ig.",
                          "scaled_separate")
    gamma: float = _opt("Discount across turns.", 0.95, ge=0, le=1)
    ig_weight: float = _opt("IG multiplier after normalisation.", 1.0, ge=0)
    norm_by_std: bool = _opt("Divide by the group std.", True)
    # policy update
    learning_rate: float = _opt("AdamW learning rate.", 1e-6, gt=0)
    weight_decay: float = _opt("AdamW weight decay.", 0.01, ge=0)
    kl_coef: float = _opt("KL loss weight to the frozen reference (0: no reference).", 0.001,
                         ge=0)
    kl_type: str = _opt("low_var_kl | kl | abs | mse.", "low_var_kl")
    clip_ratio: float = _opt("PPO clip range.", 0.2, gt=0)
    clip_ratio_c: float = _opt("Dual-clip bound for negative advantages.", 3.0, gt=1)
    entropy_coef: float = _opt("Entropy bonus weight.", 0.0, ge=0)
    max_grad_norm: float = _opt("Gradient clipping norm.", 1.0, gt=0)
    ppo_mini_batches: int = _opt("Optimizer updates per batch (1: on-policy, ratio 1).", 1)
    ppo_epochs: int = _opt("Passes over the batch.", 1)
    mask_tool_response: bool = _opt("Leave tool-response tokens out of the loss.", True)
    gradient_checkpointing: bool = _opt("Recompute activations in backward (less memory).", False)
    precision: Literal["auto", "bf16", "fp32"] = _opt(
        "auto: bf16 on GPU, fp32 on CPU (bf16 on a CPU with native bf16 is faster).", "auto")
    # schedule and output
    batch_size: int = _opt("Questions per step.", 16)
    epochs: int = _opt("Passes over the questions.", 1)
    total_steps: int = _opt("Stop after this many steps (-1: the epochs decide).", -1)
    seed: int = _opt("Random seed (question order, rollout sampling).", 0, ge=0,
                     le=2**32 - 1)
    save_freq: int = _opt("Checkpoint every N steps (and at the end).", 5)
    keep_checkpoints: int | None = _opt("Keep at most N checkpoints (all if unset).", ge=1)
    trace_save_interval: int = _opt("Save the step's rollouts every N steps (0: never).", 10,
                                    ge=0)
    logger: str = _opt("Comma list: console, tensorboard (metrics.jsonl is always written).",
                       "console,tensorboard")
    resume: bool = _opt("Resume from the latest checkpoint in --output.", False)
    system_prompt_file: str | None = _opt("System prompt file (default: the protocol's).")
    # scale-out on verl
    trainer: Literal["local", "verl"] = _opt("local (this process) | verl (Ray, FSDP, vLLM / "
                                             "SGLang rollouts; see docs/RL.md).", "local")
    val: str | None = _opt("Validation questions (verl; the training file if unset).")
    nodes: int = _opt("Machines (verl).", 1)
    gpus_per_node: int = _opt("GPUs per machine (verl).", 8)
    rollout_tensor_parallel: int = _opt("Tensor-parallel GPUs per rollout server (verl).", 4,
                                        ge=1)
    sequence_parallel: int = _opt("Ulysses sequence-parallel GPUs per sequence (verl).", 8,
                                  ge=1)
    prompt_pad: int = _opt("Tokens reserved for system prompt + question (verl).", 4096)
    current_date: str | None = _opt("Date in the system prompt (YYYY-MM-DD; default today).")

    # ------------------------------------------------------------------ derived
    # (the rollout and IG settings: ``collect.RolloutConfig.from_rl``, ``ig.IGConfig.from_rl``)

    def protocol_name(self) -> str:
        """``protocol``, else the ``protocol`` setting (DRVENUS_PROTOCOL), else drvenus."""
        if self.protocol:
            return self.protocol
        from pydantic import ValidationError

        from drvenus.config import load_settings

        try:
            return str(getattr(load_settings(), "protocol", None) or DEFAULT_PROTOCOL)
        except ValidationError as exc:  # a bad protocol is refused (as ask and data clean do)
            bad = [e for e in exc.errors() if tuple(e["loc"]) == ("protocol",)]
            if bad:
                raise RLConfigError(f"DRVENUS_PROTOCOL {bad[0].get('input')!r}: choose one of "
                                    f"{', '.join(protocol_names())}") from None
            return DEFAULT_PROTOCOL  # other bad settings: reported where they matter
        except Exception:  # unreadable settings (.env): reported where they matter, too
            return DEFAULT_PROTOCOL

    def loggers(self) -> list[str]:
        return [n.strip() for n in self.logger.split(",") if n.strip() and n.strip() != "none"]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    # ------------------------------------------------------------------ checks

    def validate(self) -> RLConfig:
        options.check_types(self, RLConfigError)
        for name in ("train", "model", "output"):
            if not getattr(self, name):
                raise RLConfigError(f"{flag(name)} is required")
        self.protocol = self.protocol_name()
        choices = {"engine": ENGINES, "rollout_mode": ROLLOUT_MODES, "protocol": protocol_names(),
                   "info_gain_type": INFO_GAIN_TYPES, "norm_mode": NORM_MODES,
                   "context_strategy": CONTEXT_STRATEGIES}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise RLConfigError(f"{flag(name)} {getattr(self, name)!r}: choose one of "
                                    f"{', '.join(allowed)}")
        for name in ("n_rollouts", "max_turns", "max_model_len", "max_response_len",
                     "rollout_concurrency", "ig_compute_freq", "ig_chunk_size", "batch_size",
                     "epochs", "save_freq", "ppo_mini_batches", "ppo_epochs", "judge_concurrency",
                     "nodes", "gpus_per_node", "prompt_pad"):
            if getattr(self, name) < 1:
                raise RLConfigError(f"{flag(name)} must be at least 1")
        if not 0 <= self.completion_cutoff <= 1:
            raise RLConfigError("--completion-cutoff must be between 0 (off) and 1")
        if self.tool_timeout <= 0:
            raise RLConfigError("--tool-timeout must be positive")
        if self.temperature <= 0:
            raise RLConfigError("--temperature must be positive (IG and the loss divide by it)")
        if self.learning_rate <= 0:
            raise RLConfigError("--learning-rate must be positive")
        if self.top_k != -1 and self.top_k < 1:
            raise RLConfigError(f"--top-k {self.top_k}: give at least 1 (or -1: off)")
        if self.total_steps != -1 and self.total_steps < 1:
            raise RLConfigError(f"--total-steps {self.total_steps}: give at least 1 (or -1: the "
                                "epochs decide)")
        if self.trainer == "verl":
            if self.engine == "transformers":
                raise RLConfigError("--trainer verl rolls out with --engine vllm or sglang")
            total = self.nodes * self.gpus_per_node
            for name in ("rollout_tensor_parallel", "sequence_parallel"):
                if getattr(self, name) < 1 or total % getattr(self, name):
                    raise RLConfigError(f"{flag(name)} must divide nodes x gpus-per-node ({total})")
        elif self.engine != "transformers" and not self.engine_url:
            raise RLConfigError(f"--engine {self.engine} needs --engine-url")
        if self.ig_source == "engine" and (self.engine == "transformers"
                                           or self.temperature != 1.0):
            raise RLConfigError("--ig-source engine needs --engine vllm|sglang and temperature "
                                "1.0 (servers report untempered log-probs)")
        if self.batch_size * self.n_rollouts % self.ppo_mini_batches:
            raise RLConfigError("--ppo-mini-batches must divide batch-size x n-rollouts")
        unknown = set(self.loggers()) - {"console", "tensorboard"}
        if unknown:
            raise RLConfigError(f"--logger {', '.join(sorted(unknown))}: use console, tensorboard")
        return self


NO_JUDGE = ("--reward-type llm needs a judge: --judge-url and --judge-model (or "
            "DRVENUS_JUDGE_BASE_URL / DRVENUS_JUDGE_MODEL), or --reward-type f1")


def load_config(path: str | Path | None = None, **overrides: Any) -> RLConfig:
    """An :class:`RLConfig` from YAML with ``overrides`` on top, validated."""
    values = options.read_values(RLConfig, path, overrides, RLConfigError)
    return RLConfig(**values).validate()


__all__ = ["ENGINES", "INFO_GAIN_TYPES", "NORM_MODES", "NO_JUDGE", "PROTOCOLS", "ROLLOUT_MODES",
           "RLConfig", "RLConfigError", "load_config"]
