"""Long-context launch paths of ``drvenus sft`` that need GPUs, checked through their dry runs.

accelerate + DeepSpeed Ulysses (``--sequence-parallel``): the accelerate config, the
``ParallelismConfig`` the Trainer gets and the padding of batches to the sequence-parallel size.
``--engine verl``: the ``torchrun`` command on 1 GPU, 8 GPUs and 2 nodes, its hyperparameters
equal to :class:`SFTConfig`'s, the parquet files it reads, the one-line errors (exit 2) and the
error of a real run without verl.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drvenus.cli import app
from drvenus.train.sft import verl_engine
from drvenus.train.sft.config import SFTConfig, SFTConfigError
from drvenus.train.sft.launch import plan_launch

runner = CliRunner()
MODEL = "Qwen/Qwen3-4B-Thinking-2507"
CONVERSATION = [{"role": "system", "content": "You are a researcher."},
                {"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "<think>easy</think>Paris."}]


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    rows = [{"messages": CONVERSATION} for _ in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def parquet(tmp_path: Path) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "cleaned.parquet"
    pq.write_table(pa.table({"messages": [CONVERSATION] * 4, "id": list(range(4))}), path)
    return path


def _sft(*args: str) -> object:
    return runner.invoke(app, ["sft", "--model", MODEL, *args])


def _hub_model_known(monkeypatch) -> None:
    """A real run checks that the hub has MODEL; this test machine has no network, and the
    test is about the launch, not the model."""
    monkeypatch.setattr("drvenus.train.options.check_hub_model", lambda *args, **kw: None)


def _overrides(command: list[str]) -> dict[str, str]:
    start = command.index(verl_engine.VERL_MODULE) + 1
    return dict(arg.split("=", 1) for arg in command[start:])


# --------------------------------------------------------------------------- accelerate + SP


@pytest.mark.parametrize(("gpus", "accumulation"), [(8, 32), (16, 16)])
def test_accelerate_sequence_parallel_dry_run(tmp_path, jsonl, gpus, accumulation):
    out = tmp_path / "out"
    result = _sft("--train", str(jsonl), "--output", str(out), "--num-processes", str(gpus),
                  "--sequence-parallel", "8", "--attn-implementation", "flash_attention_2",
                  "--dry-run")
    assert result.exit_code == 0, result.output
    text = result.output
    assert "distributed_type: DEEPSPEED" in text and "zero_stage: 3" in text
    assert f"gradient_accumulation_steps: {accumulation}" in text
    assert f"data parallel {gpus // 8} x sequence parallel 8" in text
    assert "sp_backend: deepspeed" in text and "sp_size: 8" in text
    assert "sp_attn_implementation: flash_attention_2" in text
    assert "sp_seq_length_is_variable: true" in text
    assert (out / "launch" / "accelerate_deepspeed.yaml").is_file()
    assert "parallelism_config" not in (out / "launch" / "accelerate_deepspeed.yaml").read_text()
    assert f"accelerate launch --config_file {out}/launch/accelerate_deepspeed.yaml" in text


def test_training_arguments_carry_the_parallelism_config(tmp_path):
    pytest.importorskip("transformers")
    from drvenus.train.sft.trainer import training_arguments

    config = SFTConfig(train="t", model="m", output=str(tmp_path), num_processes=16,
                       sequence_parallel=8, attn_implementation="sdpa").validate()
    args = training_arguments(config, 16, "fp32", has_val=False)
    pc = args.parallelism_config
    assert pc.sp_size == 8 and pc.sp_backend == "deepspeed" and pc.sp_enabled
    assert pc.sp_handler.sp_attn_implementation == "sdpa"
    assert pc.sp_handler.sp_seq_length_is_variable is True
    assert args.gradient_accumulation_steps == 16  # 32 / (1 x 16 / 8)
    plain = SFTConfig(train="t", model="m", output=str(tmp_path)).validate()
    assert training_arguments(plain, 1, "fp32", has_val=False).parallelism_config is None


def test_sequence_parallel_batches_are_padded_to_the_sp_size():
    torch = pytest.importorskip("torch")
    from drvenus.train.sft.data import Example
    from drvenus.train.sft.trainer import collator

    config = SFTConfig(train="t", model="m", output="o", num_processes=4, sequence_parallel=4)
    batch = collator(config, pad_token_id=7)([Example([1, 2, 3, 4, 5], [0, 0, 1, 1, 1], [5])])
    assert "real_tokens" not in batch
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 7, 7, 7]]
    assert batch["labels"].tolist() == [[-100, -100, 3, 4, 5, -100, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    assert all(t.dtype == torch.long for t in batch.values())


# --------------------------------------------------------------------------- verl


def _verl_plan(tmp_path: Path, train: Path, **kw) -> tuple[SFTConfig, list[str]]:
    config = SFTConfig(train=str(train), model=MODEL, output=str(tmp_path / "run"),
                       engine="verl", gradient_checkpointing=True, **kw).validate()
    plan = plan_launch(config)
    script = (tmp_path / "run" / "launch" / verl_engine.SCRIPT_FILE).read_text()
    assert plan.shell() in script and f"verl=={verl_engine.VERL_VERSION}" in script
    return config, plan.command


def _assert_same_hyperparameters(config: SFTConfig, o: dict[str, str]) -> None:
    assert float(o["optim.lr"]) == config.learning_rate
    assert int(o["data.train_batch_size"]) == config.global_batch_size
    assert int(o["data.micro_batch_size_per_gpu"]) == config.micro_batch_size
    assert int(o["data.max_length"]) == config.max_length
    assert int(o["trainer.total_epochs"]) == config.epochs
    assert float(o["optim.lr_warmup_steps_ratio"]) == config.warmup_ratio
    assert float(o["optim.weight_decay"]) == config.weight_decay
    assert o["optim.betas"] == f"[{config.adam_beta1},{config.adam_beta2}]" == "[0.9,0.95]"
    assert float(o["optim.clip_grad"]) == config.max_grad_norm
    assert o["optim.lr_scheduler"] == config.lr_scheduler == "cosine"
    assert int(o["trainer.seed"]) == config.seed
    assert int(o["trainer.save_freq"]) == config.save_steps
    assert int(o["ulysses_sequence_parallel_size"]) == config.sequence_parallel
    assert o["model.partial_pretrain"] == config.model
    assert o["trainer.default_local_dir"] == config.output
    assert o["model.enable_gradient_checkpointing"] == "true"
    assert o["data.multiturn.enable"] == "true" and o["data.multiturn.messages_key"] == "messages"
    assert o["use_remove_padding"] == "true" and o["model.strategy"] == "fsdp2"
    assert o["trainer.resume_mode"] == "disable" and o["data.truncation"] == "right"


def test_verl_one_gpu_converts_jsonl_to_parquet(tmp_path, jsonl):
    pq = pytest.importorskip("pyarrow.parquet")
    config, command = _verl_plan(tmp_path, jsonl)
    assert command[:6] == ["torchrun", "--nnodes", "1", "--nproc_per_node", "1", "--standalone"]
    assert command[6:8] == ["-m", "verl.trainer.fsdp_sft_trainer"]
    o = _overrides(command)
    _assert_same_hyperparameters(config, o)
    converted = Path(o["data.train_files"])
    assert converted == tmp_path / "run" / "launch" / "verl_data" / "train.parquet"
    table = pq.read_table(converted)
    assert table.column_names == ["messages"] and table.num_rows == 10
    assert table.to_pylist()[0]["messages"] == CONVERSATION
    # no validation data: verl still evaluates once at the end, on a capped training file
    assert o["data.val_files"] == o["data.train_files"] and o["trainer.test_freq"] == "-1"
    assert o["data.val_max_samples"] == "32"
    assert o["trainer.nnodes"] == "1" and o["trainer.n_gpus_per_node"] == "1"


def test_verl_eight_gpus_dr_venus_settings_pass_parquet_through(tmp_path, parquet):
    config, command = _verl_plan(tmp_path, parquet, num_processes=8, sequence_parallel=8,
                                 report_to="wandb", save_total_limit=2)
    assert command[:6] == ["torchrun", "--nnodes", "1", "--nproc_per_node", "8", "--standalone"]
    o = _overrides(command)
    _assert_same_hyperparameters(config, o)
    assert o["data.train_files"] == str(parquet)  # has `messages`: used as it is
    assert o["ulysses_sequence_parallel_size"] == "8" and o["data.max_length"] == "200000"
    assert o["optim.lr"] == "1e-05" and o["data.train_batch_size"] == "32"
    assert o["trainer.logger"] == "['console','wandb']" and o["trainer.max_ckpt_to_keep"] == "2"
    assert o["trainer.n_gpus_per_node"] == "8"
    assert not (tmp_path / "run" / "launch" / "verl_data").exists()


def test_verl_two_nodes_cli_dry_run(tmp_path, parquet):
    val = tmp_path / "val.jsonl"
    val.write_text(json.dumps({"messages": CONVERSATION}) + "\n", encoding="utf-8")
    result = _sft("--train", str(parquet), "--val", str(val), "--output", str(tmp_path / "run"),
                  "--engine", "verl", "--num-processes", "16", "--num-machines", "2",
                  "--machine-rank", "1", "--main-process-ip", "10.0.0.1",
                  "--sequence-parallel", "8", "--resume", "--dry-run")
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("torchrun "))
    command = shlex.split(line)
    assert command[:12] == ["torchrun", "--nnodes", "2", "--nproc_per_node", "8", "--node_rank",
                            "1", "--master_addr", "10.0.0.1", "--master_port", "29500", "-m"]
    o = _overrides(command)
    assert o["trainer.nnodes"] == "2" and o["trainer.n_gpus_per_node"] == "8"
    assert o["data.val_files"] == str(tmp_path / "run" / "launch" / "verl_data" / "val.parquet")
    assert o["trainer.test_freq"] == "100" and "data.val_max_samples" not in o
    assert o["trainer.resume_mode"] == "auto"
    assert "gradient accumulation: 16 with 16 process(es)" in result.output  # 32 / (16 / 8)
    assert "written:" in result.output and verl_engine.SCRIPT_FILE in result.output


def test_verl_val_fraction_writes_the_seeded_split(tmp_path, jsonl):
    pq = pytest.importorskip("pyarrow.parquet")
    _, command = _verl_plan(tmp_path, jsonl, val_fraction=0.2)
    o = _overrides(command)
    assert pq.read_table(o["data.train_files"]).num_rows == 8
    assert pq.read_table(o["data.val_files"]).num_rows == 2


def test_verl_lora_and_max_steps(tmp_path, parquet):
    _, command = _verl_plan(tmp_path, parquet, lora=True, lora_r=32, max_steps=50,
                            lora_target_modules="q_proj,v_proj")
    o = _overrides(command)
    assert o["model.lora_rank"] == "32" and o["model.lora_alpha"] == "32"
    assert o["model.target_modules"] == "['q_proj','v_proj']"
    assert o["trainer.total_training_steps"] == "50"


def test_verl_real_run_without_verl_is_one_line(tmp_path, parquet, monkeypatch):
    _hub_model_known(monkeypatch)
    monkeypatch.setattr(verl_engine, "verl_available", lambda: False)
    result = _sft("--train", str(parquet), "--output", str(tmp_path / "run"), "--engine", "verl")
    assert result.exit_code == 2, result.output
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert f"pip install verl=={verl_engine.VERL_VERSION}" in lines[0]


def test_verl_real_run_execs_the_planned_command(tmp_path, parquet, monkeypatch):
    _hub_model_known(monkeypatch)
    ran: list[list[str]] = []

    class Done:
        returncode = 0

    monkeypatch.setattr(verl_engine, "verl_available", lambda: True)
    monkeypatch.setattr(verl_engine.subprocess, "run", lambda cmd, check: ran.append(cmd) or Done)
    result = _sft("--train", str(parquet), "--output", str(tmp_path / "run"), "--engine", "verl",
                  "--num-processes", "2")
    assert result.exit_code == 0, result.output
    assert ran and ran[0][:5] == ["torchrun", "--nnodes", "1", "--nproc_per_node", "2"]


# --------------------------------------------------------------------------- one-line errors


@pytest.mark.parametrize(("args", "expected"), [
    (["--num-processes", "8", "--sequence-parallel", "3"], "not a multiple of --sequence-parallel"),
    (["--num-processes", "8", "--sequence-parallel", "8", "--attn-implementation", "eager"],
     "--attn-implementation"),
    (["--num-processes", "8", "--sequence-parallel", "8", "--distributed", "fsdp"],
     "needs --distributed deepspeed"),
    (["--num-processes", "16", "--num-machines", "3", "--main-process-ip", "h"],
     "not a multiple of --num-machines"),
    (["--num-processes", "8", "--global-batch-size", "4"], "data-parallel processes = 8"),
    (["--engine", "verl", "--packing"], "--packing"),
    (["--engine", "verl", "--lr-scheduler", "constant"], "--lr-scheduler constant"),
    (["--engine", "verl", "--over-length", "drop"], "--over-length drop"),
    (["--engine", "verl", "--epochs", "1.5"], "--epochs 1.5"),
    (["--engine", "megatron"], "choose one of accelerate, verl"),
])
def test_invalid_launch_settings_are_one_line_exit_2(tmp_path, jsonl, args, expected):
    result = _sft("--train", str(jsonl), "--output", str(tmp_path / "o"), *args, "--dry-run")
    assert result.exit_code == 2, result.output
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert expected in lines[0]


def test_sequence_parallel_relaxes_the_batch_check():
    config = SFTConfig(train="t", model="m", output="o", num_processes=8, global_batch_size=4,
                       sequence_parallel=2)
    assert config.validate().grad_accumulation(8) == 1  # 4 / (1 x 8 / 2)
    with pytest.raises(SFTConfigError, match="sequence-parallel"):
        SFTConfig(train="t", model="m", output="o", sequence_parallel=2).validate()


def _one_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    return lines[0]


def test_settings_that_would_fail_late_are_refused_before_loading(tmp_path, jsonl, monkeypatch):
    """A local-looking model path that is missing (not a hub id), an output that cannot be
    written, a negative step limit: one line before any model is loaded (the dry run too)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    out = str(tmp_path / "o")
    for model in ("runs/missing", "./missing", "missing/model.gguf", str(tmp_path / "nope")):
        line = _one_error(runner.invoke(app, ["sft", "--model", model, "--train", str(jsonl),
                                              "--output", out, "--dry-run"]))
        assert model in line and "no such file or folder" in line
    line = _one_error(_sft("--train", str(jsonl), "--output", str(blocker / "o"), "--dry-run"))
    assert "--output" in line and "cannot write there" in line
    config = tmp_path / "sft.yaml"
    config.write_text("max_steps: -5\n", encoding="utf-8")
    line = _one_error(_sft("--config", str(config), "--train", str(jsonl), "--output", out,
                           "--dry-run"))
    assert "--max-steps -5" in line
    assert _sft("--train", str(jsonl), "--output", out, "--dry-run").exit_code == 0  # hub id
    assert not (tmp_path / "o").exists() or (tmp_path / "o").is_dir()


def test_rl_without_a_judge_for_its_llm_reward_fails_in_the_dry_run(tmp_path, jsonl, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for var in ("DRVENUS_JUDGE_BASE_URL", "DRVENUS_JUDGE_MODEL"):
        monkeypatch.delenv(var, raising=False)
    model = tmp_path / "model"
    model.mkdir()
    args = ["rl", "--train", str(jsonl), "--model", str(model), "--output", str(tmp_path / "o")]
    line = _one_error(runner.invoke(app, [*args, "--reward-type", "llm", "--dry-run"]))
    assert "--reward-type llm needs a judge" in line
    assert runner.invoke(app, [*args, "--reward-type", "f1", "--dry-run"]).exit_code == 0
    line = _one_error(runner.invoke(app, [*args, "--reward-type", "f1", "--total-steps", "-3",
                                          "--dry-run"]))
    assert "--total-steps -3" in line
