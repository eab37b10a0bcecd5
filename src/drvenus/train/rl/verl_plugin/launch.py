"""The verl launch of a drvenus RL config: Hydra overrides, the agent-loop config, a script.

:func:`plan` maps :class:`~drvenus.train.rl.config.RLConfig` onto verl 0.6.1's PPO trainer keys
(``verl/trainer/config/ppo_trainer.yaml``) with DR-Venus's settings (``RL/train_igpo.sh``): async
agent-loop rollouts with vLLM or SGLang, our agent loop, reward manager and estimator, KL loss
0.001 (low-var), token-mean loss, FSDP with parameter and optimizer offload, Ulysses sequence
parallel, dynamic batch sizes. No verl import: ``drvenus rl --trainer verl --dry-run`` works
anywhere. Multi-node: start Ray on every machine first (``ray start --head`` on the first,
``ray start --address=<head>:6379`` on the others), then run the script on the head.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from drvenus.train.launch import VERL_VERSION, LaunchPlan, hydra_value
from drvenus.train.rl.config import RLConfig
from drvenus.train.rl.verl_plugin import ENTRY_MODULE

SCRIPT_FILE = "run_verl_rl.sh"
AGENT_LOOP_FILE = "agent_loop.yaml"
AGENT_LOOP_TARGET = "drvenus.train.rl.verl_plugin.agent_loop.DrVenusAgentLoop"


def _reference_dir() -> str | None:
    """``DRVENUS_REFERENCE_DIR`` of this machine, for the workers (they may not inherit it)."""
    from drvenus.config import load_settings

    folder = getattr(load_settings(), "reference_dir", None)
    return str(Path(folder).expanduser().absolute()) if folder else None


def agent_loop_yaml(config: RLConfig) -> str:
    """The agent-loop config entry: the rollout settings of :data:`~.convert.AGENT_LOOP_KEYS`
    (protocol, turn limit and jitter, mode, per-turn cap, tool timeout, cut-off, context
    strategy, system prompt file, trace interval), the tools, and where DR-Venus's pinned files
    are."""
    lines = ["- name: drvenus_agent", f"  _target_: {AGENT_LOOP_TARGET}",
             f"  protocol: {config.protocol_name()}",
             f"  max_turns: {config.max_turns}", f"  max_turns_jitter: {config.max_turns_jitter}",
             f"  mode: {config.rollout_mode}",
             f"  robust_max_retries: {config.robust_max_retries}",
             f"  max_response_len: {config.max_response_len}",
             f"  tool_timeout: {config.tool_timeout}",
             f"  completion_cutoff: {config.completion_cutoff}",
             f"  context_strategy: {config.context_strategy}",
             f"  keep_last: {config.keep_last}",
             f"  trace_save_interval: {config.trace_save_interval}"]
    values = {"tools_url": config.tools_url, "corpus": config.corpus,
              "current_date": config.current_date,
              "system_prompt_file": str(Path(config.system_prompt_file).absolute())
              if config.system_prompt_file else None, "reference_dir": _reference_dir()}
    for key, value in values.items():
        if value:
            lines.append(f"  {key}: {value!r}")
    return "\n".join(lines) + "\n"


def _reward_overrides(config: RLConfig) -> list[str]:
    kw: dict[str, Any] = {"protocol": config.protocol_name(), "reward_type": config.reward_type,
          "judge_concurrency": config.judge_concurrency,
          "use_info_gain": config.use_info_gain,
          "info_gain_type": config.info_gain_type, "ig_tool_filter": f"'{config.ig_tool_filter}'",
          "ig_compute_freq": config.ig_compute_freq,
          "use_format_penalty": config.use_format_penalty,
          "format_penalty_scale": config.format_penalty_scale}
    if config.judge_url:
        kw["judge_url"] = config.judge_url
    if config.judge_model:
        kw["judge_model"] = config.judge_model
    folder = _reference_dir()
    if folder:
        kw["reference_dir"] = folder
    return ["reward_model.reward_manager=drvenus_igpo"] + \
        [f"+reward_model.reward_kwargs.{k}={hydra_value(v)}" for k, v in kw.items()]


def _actor_overrides(config: RLConfig) -> list[str]:
    sp = config.sequence_parallel
    max_seq = config.prompt_pad + config.max_model_len
    a = "actor_rollout_ref.actor"
    return [
        f"{a}.optim.lr={config.learning_rate}", f"{a}.optim.weight_decay={config.weight_decay}",
        f"{a}.ppo_mini_batch_size={config.batch_size // config.ppo_mini_batches}",
        f"{a}.ppo_epochs={config.ppo_epochs}", f"{a}.ppo_micro_batch_size_per_gpu=1",
        f"{a}.use_dynamic_bsz=true",
        f"{a}.ppo_max_token_len_per_gpu={math.ceil(max_seq / sp) + 1000}",
        f"{a}.ulysses_sequence_parallel_size={sp}",
        f"{a}.use_kl_loss={hydra_value(config.kl_coef > 0)}", f"{a}.kl_loss_coef={config.kl_coef}",
        f"{a}.kl_loss_type={config.kl_type}", f"{a}.clip_ratio={config.clip_ratio}",
        f"{a}.clip_ratio_c={config.clip_ratio_c}", f"{a}.entropy_coeff={config.entropy_coef}",
        f"{a}.grad_clip={config.max_grad_norm}", f"{a}.loss_agg_mode=token-mean",
        f"{a}.fsdp_config.param_offload=true", f"{a}.fsdp_config.optimizer_offload=true",
        "actor_rollout_ref.ref.fsdp_config.param_offload=true",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.model.use_remove_padding=true",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={hydra_value(True)}",
        "actor_rollout_ref.model.enable_activation_offload=true",
    ]


def _rollout_overrides(config: RLConfig, agent_loop: Path) -> list[str]:
    r = "actor_rollout_ref.rollout"
    return [
        f"{r}.name={config.engine}", f"{r}.mode=async", f"{r}.n={config.n_rollouts}",
        f"{r}.temperature={config.temperature}", f"{r}.top_p={config.top_p}",
        f"{r}.top_k={config.top_k}",
        f"{r}.tensor_model_parallel_size={config.rollout_tensor_parallel}",
        f"{r}.gpu_memory_utilization=0.9", f"{r}.max_model_len={config.max_model_len}",
        f"{r}.max_num_batched_tokens=8192", f"{r}.prompt_length={config.prompt_pad}",
        f"{r}.response_length={config.max_model_len}",
        f"{r}.log_prob_micro_batch_size_per_gpu=1", f"{r}.log_prob_use_dynamic_bsz=true",
        f"{r}.agent.num_workers=8", f"{r}.agent.default_agent_loop=drvenus_agent",
        f"{r}.agent.agent_loop_config_path={agent_loop}",
    ]


def overrides(config: RLConfig, agent_loop: Path) -> list[str]:
    """verl Hydra overrides for ``config`` (see the module doc)."""
    out = Path(config.output)
    trainer = [
        f"trainer.logger={hydra_value(config.loggers() or ['console'])}",
        "trainer.project_name=drvenus-rl", f"trainer.experiment_name={out.name or 'igpo'}",
        f"trainer.n_gpus_per_node={config.gpus_per_node}", f"trainer.nnodes={config.nodes}",
        f"trainer.save_freq={config.save_freq}", "trainer.test_freq=-1",
        "trainer.val_before_train=false", f"trainer.total_epochs={config.epochs}",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        f"trainer.rollout_data_dir={out / 'traces'}",
        f"trainer.resume_mode={'auto' if config.resume else 'disable'}",
    ]
    if config.total_steps > 0:
        trainer.append(f"trainer.total_training_steps={config.total_steps}")
    return [
        "algorithm.adv_estimator=grpo_info_gain", f"algorithm.gamma={config.gamma}",
        f"algorithm.norm_adv_by_std_in_grpo={hydra_value(config.norm_by_std)}",
        "algorithm.use_kl_in_reward=false",
        f"+algorithm.igpo_norm_mode={config.norm_mode}",
        f"+algorithm.igpo_ig_weight={config.ig_weight}",
        f"data.train_files={config.train}", f"data.val_files={config.val or config.train}",
        f"data.train_batch_size={config.batch_size}", "data.max_prompt_length=1024",
        f"data.max_response_length={config.max_response_len}", "data.return_raw_chat=true",
        "data.filter_overlong_prompts=true", f"data.seed={config.seed}",
        *_actor_overrides(config), *_rollout_overrides(config, agent_loop),
        *_reward_overrides(config), *trainer,
    ]


def as_parquet(path: str, folder: Path, name: str) -> str:
    """verl reads parquet: other inputs are written as RL-format rows to ``folder/name``."""
    if path.endswith(".parquet"):
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    from drvenus.train.rl.questions import question_rows  # no torch: the dry run needs none

    rows = [{"data_source": "drvenus", "prompt": [{"role": "user", "content": q}],
             "ability": "deep-research", "reward_model": {"ground_truth": gt, "style": "rule"},
             "extra_info": {"index": i, "split": name}}
            for i, (q, gt) in enumerate(question_rows(path))]
    out = folder / f"{name}.parquet"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out)
    return str(out)


def plan(config: RLConfig, *, write: bool = True) -> LaunchPlan:
    """The launch command; with ``write``, the agent-loop config, the script and (for non-parquet
    data) the parquet files are written to ``<output>/launch/``."""
    folder = Path(config.output) / "launch"
    if write:
        from dataclasses import replace

        config = replace(config, train=as_parquet(config.train, folder, "train"),
                         val=as_parquet(config.val, folder, "val") if config.val else None)
    agent_loop = folder / AGENT_LOOP_FILE
    command = ["python3", "-m", ENTRY_MODULE, *overrides(config, agent_loop)]
    result = LaunchPlan(command, engine="verl", folder=folder, wrap=True)
    if write:
        folder.mkdir(parents=True, exist_ok=True)
        agent_loop.write_text(agent_loop_yaml(config), encoding="utf-8")
        script = folder / SCRIPT_FILE
        head = ["#!/usr/bin/env bash", f"# drvenus rl on verl=={VERL_VERSION}: "
                f"{config.nodes} node(s) x {config.gpus_per_node} GPU(s)", "set -euo pipefail"]
        if config.nodes > 1:
            head += ["# Start Ray on every node first, then run this script on the head node:",
                     "#   head node:   ray start --head --port=6379",
                     "#   other nodes: ray start --address=<head-node-ip>:6379"]
        script.write_text("\n".join(head) + "\n" + result.shell() + "\n", encoding="utf-8")
        script.chmod(0o755)
        result.files = [agent_loop, script]
    return result


__all__ = ["AGENT_LOOP_FILE", "SCRIPT_FILE", "agent_loop_yaml", "overrides", "plan"]
