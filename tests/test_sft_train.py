"""``drvenus sft`` on CPU: a tiny random Llama with the embedded model's vocabulary, trained on the
10 shared trajectories cut to a few turns and 128 tokens.

The loss drops; the checkpoint reloads with its chat template; a run stopped at step 6 and
resumed gives the uninterrupted run's losses; a packed sequence gives each row the logits it
gets alone; ``--dry-run`` prints the launch plan; bad input is one line and exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", reason="needs the train extra")
torch = pytest.importorskip("torch", reason="needs the train extra")

from typer.testing import CliRunner  # noqa: E402

from drvenus.cli import app  # noqa: E402
from drvenus.train.sft import SFTCollator, SFTConfig, read_conversations, train  # noqa: E402
from drvenus.train.sft.data import Example, tokenize_dataset  # noqa: E402
from drvenus.train.sft.tokenize import IGNORE_INDEX  # noqa: E402

runner = CliRunner()
STEPS, STOP_AT = 16, 6


@pytest.fixture(scope="session")
def tiny_model(tiny_policy) -> Path:
    """A 2-layer, 64-wide random Llama with SmolLM2's tokenizer and chat template (conftest)."""
    return tiny_policy


@pytest.fixture(scope="session")
def short_trajectories(shared_data, tmp_path_factory) -> Path:
    """The shared trajectories without their (long) system prompt: the first 4 messages, each
    cut to 300 characters, as JSONL (so every row has assistant tokens within 128 tokens)."""
    rows = read_conversations(shared_data / "trajectories" / "dr-venus-sft")
    path = tmp_path_factory.mktemp("sft-data") / "train.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for messages in rows:
            short = [{**m, "content": m["content"][:300]} for m in messages
                     if m["role"] != "system"][:4]
            fh.write(json.dumps({"messages": short}) + "\n")
    return path


def _config(model: Path, data: Path, output: Path, **kw) -> SFTConfig:
    base = dict(train=str(data), model=str(model), output=str(output), max_length=128,
                global_batch_size=2, learning_rate=3e-3, lr_scheduler="constant",
                warmup_ratio=0.0, max_steps=STEPS, save_steps=STOP_AT, logging_steps=1,
                val_fraction=0.2, eval_steps=STOP_AT)
    return SFTConfig(**{**base, **kw})


class _StopAt(transformers.TrainerCallback):
    """Ends training after step ``k`` (after its checkpoint is written), like a crash."""

    def __init__(self, k: int) -> None:
        self.k = k

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.k:
            control.should_training_stop = True
        return control


@pytest.fixture(scope="module")
def full_run(tiny_model, short_trajectories, tmp_path_factory):
    return train(_config(tiny_model, short_trajectories, tmp_path_factory.mktemp("full")))


def test_training_loss_drops(full_run):
    losses = [full_run.losses()[s] for s in sorted(full_run.losses())]
    assert len(losses) == STEPS and full_run.global_step == STEPS
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.8 * first, (first, last)
    logged = [e for e in full_run.log_history if "loss" in e]
    assert all({"grad_norm", "learning_rate", "tokens_per_s"} <= set(e) for e in logged)
    assert full_run.data_stats["train"]["kept"] == 8 and full_run.data_stats["val"]["kept"] == 2
    assert full_run.data_stats["train"]["truncated"] > 0
    evals = {e["step"]: e["eval_loss"] for e in full_run.log_history if "eval_loss" in e}
    assert {STOP_AT, 2 * STOP_AT, STEPS} == set(evals)  # every eval_steps, and at the end
    assert evals[STEPS] < evals[STOP_AT]
    history = (full_run.output_dir / "history.jsonl").read_text().splitlines()
    written = [json.loads(x) for x in history]
    assert written == json.loads(json.dumps(full_run.log_history))  # the curves, on disk


def test_lora_run_saves_an_adapter(tiny_model, short_trajectories, tmp_path):
    config = _config(tiny_model, short_trajectories, tmp_path, lora=True, lora_r=4, max_steps=2,
                     val_fraction=0.0, lora_target_modules="q_proj,v_proj")
    result = train(config)
    assert result.global_step == 2
    assert (result.final_dir / "adapter_model.safetensors").is_file()
    assert (result.final_dir / "adapter_config.json").is_file()


def test_an_adapter_folder_is_trained_further(tiny_model, short_trajectories, tmp_path):
    """``--model ADAPTER_DIR`` continues that adapter (its rank and targets) on the base its
    adapter_config.json names: it starts from the saved weights, not from a fresh LoRA."""
    from peft import PeftModel
    from safetensors.torch import load_file

    from drvenus.train.sft.config import SFTConfigError

    first = train(_config(tiny_model, short_trajectories, tmp_path / "a", lora=True, lora_r=4,
                          max_steps=2, val_fraction=0.0, lora_target_modules="q_proj,v_proj"))
    saved = load_file(first.final_dir / "adapter_model.safetensors")
    config = _config(str(first.final_dir), short_trajectories, tmp_path / "b", lora=True,
                     lora_r=8, max_steps=1, val_fraction=0.0, learning_rate=1e-6)
    second = train(config)
    again = load_file(second.final_dir / "adapter_model.safetensors")
    assert again.keys() == saved.keys()  # rank 4 on q and v, as saved (not the r=8 asked)
    moved = [k for k in saved if "lora_B" in k and saved[k].abs().max() > 1e-3]
    assert moved  # the first run trained B away from its zero start
    # one step at lr 1e-6 moves a weight by about 1e-6: it started from the saved weights
    assert all(torch.allclose(again[k], saved[k], atol=1e-4) for k in saved)
    model = PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(tiny_model), second.final_dir)
    assert model.peft_config["default"].r == 4
    with pytest.raises(SFTConfigError, match="is a LoRA adapter"):
        train(_config(str(first.final_dir), short_trajectories, tmp_path / "c", lora=False,
                      max_steps=1, val_fraction=0.0))


def test_checkpoint_reloads_with_chat_template(full_run):
    checkpoint = full_run.output_dir / f"checkpoint-{STOP_AT}"
    for folder in (checkpoint, full_run.final_dir):
        assert (folder / "model.safetensors").is_file()
        model = transformers.AutoModelForCausalLM.from_pretrained(folder)
        tok = transformers.AutoTokenizer.from_pretrained(folder)
        assert tok.chat_template and "<|im_start|>" in tok.chat_template
        ids = tok.apply_chat_template([{"role": "user", "content": "hi"}],
                                      add_generation_prompt=True, return_tensors="pt")
        ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
        assert model(input_ids=ids).logits.shape[-1] == len(tok)
    assert {"optimizer.pt", "scheduler.pt", "trainer_state.json"} <= {
        p.name for p in checkpoint.iterdir()}


def test_resume_after_interruption_matches_uninterrupted_run(
    full_run, tiny_model, short_trajectories, tmp_path
):
    config = _config(tiny_model, short_trajectories, tmp_path)
    stopped = train(config, callbacks=[_StopAt(STOP_AT)])
    assert stopped.global_step == STOP_AT
    config.resume = True
    resumed = train(config)
    assert resumed.resumed_from.endswith(f"checkpoint-{STOP_AT}")
    expected = full_run.losses()
    assert sorted(stopped.losses()) == list(range(1, STOP_AT + 1))
    got = resumed.losses()  # the checkpoint's history, then the resumed steps
    assert sorted(got) == list(range(1, STEPS + 1)) and resumed.global_step == STEPS
    for step in range(1, STEPS + 1):
        assert got[step] == pytest.approx(expected[step], rel=1e-4, abs=1e-5), step


def test_existing_checkpoints_need_resume(full_run, tiny_model, short_trajectories):
    config = _config(tiny_model, short_trajectories, full_run.output_dir)
    with pytest.raises(ValueError, match="--resume"):
        train(config)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_rows_get_the_logits_they_get_alone(tiny_model, short_trajectories, attn):
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=attn)
    rows = read_conversations(short_trajectories)[:3]
    alone = tokenize_dataset(rows, tok, 1200)
    packed = tokenize_dataset(rows, tok, 1200, packing=True)
    assert len(packed) == 1 and packed[0].seq_lens == [len(e) for e in alone.examples]
    batch = SFTCollator(tok.pad_token_id)([packed[0]])
    assert batch.pop("real_tokens") == len(packed[0])
    start = 0
    for e in alone.examples:
        assert batch["labels"][0, start] == IGNORE_INDEX  # no target across a row boundary
        start += len(e)
    with torch.no_grad():
        # use_cache=False as in training: with a cache transformers ignores row boundaries
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                       use_cache=False).logits[0]
        start = 0
        for e in alone.examples:
            single = model(input_ids=torch.tensor([e.input_ids])).logits[0]
            torch.testing.assert_close(logits[start:start + len(e)], single, atol=1e-4, rtol=1e-4)
            start += len(e)


def test_padded_batch_matches_single_rows(tiny_model):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    a, b = Example([5, 6, 7, 8, 9], [0, 0, 1, 1, 1], [5]), Example([10, 11, 12], [0, 1, 1], [3])
    batch = SFTCollator(pad_token_id=2)([a, b])
    assert batch["position_ids"][1].tolist() == [0, 1, 2, 0, 1]
    assert batch["labels"][1].tolist() == [IGNORE_INDEX, 11, 12, IGNORE_INDEX, IGNORE_INDEX]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                       use_cache=False).logits
        single = model(input_ids=torch.tensor([b.input_ids])).logits
    torch.testing.assert_close(logits[1, :3], single[0], atol=1e-4, rtol=1e-4)


def test_dry_run_prints_launch_plan_without_loading(tmp_path, short_trajectories):
    result = runner.invoke(app, [
        "sft", "--train", str(short_trajectories), "--model", "Qwen/Qwen3-4B-Thinking-2507",
        "--output", str(tmp_path / "out"), "--num-processes", "16", "--num-machines", "2",
        "--main-process-ip", "10.0.0.1", "--dry-run"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "accelerate launch --config_file" in text
    assert "--num_processes 16 --num_machines 2 --machine_rank 0" in text
    assert "--main_process_ip 10.0.0.1" in text and "-m drvenus sft --config" in text
    assert "distributed_type: FSDP" in text and "learning_rate: 1e-05" in text
    assert "gradient accumulation: 2 with 16" in text  # 32 / (1 x 16)
    launch = tmp_path / "out" / "launch"
    assert (launch / "accelerate_fsdp.yaml").is_file()
    from drvenus.train.sft.config import load_config

    written = load_config(launch / "sft_config.yaml")
    assert written.num_processes == 16 and written.max_length == 200_000


def test_config_file_with_flag_override(tmp_path, short_trajectories):
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(f"train: {short_trajectories}\nmodel: some/model\noutput: {tmp_path}/o\n"
                   "learning_rate: 2.0e-5\ndistributed: deepspeed\nnum_processes: 8\n")
    result = runner.invoke(app, ["sft", "--config", str(cfg), "--learning-rate", "3e-5",
                                 "--packing", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "learning_rate: 3e-05" in result.output and "packing: True" in result.output
    assert "zero_stage: 3" in result.output and "gradient_accumulation_steps: 4" in result.output


@pytest.mark.parametrize("case", ["missing", "no_messages", "bad_key", "bad_batch"])
def test_bad_input_is_one_line_exit_2(tmp_path, tiny_model, short_trajectories, case):
    data, extra = short_trajectories, []
    if case == "missing":
        data = tmp_path / "nope.parquet"
    elif case == "no_messages":
        data = tmp_path / "rows.jsonl"
        data.write_text('{"question": "q", "answer": "a"}\n')
    elif case == "bad_key":
        cfg = tmp_path / "c.yaml"
        cfg.write_text("learning_rat: 1\n")
        extra = ["--config", str(cfg)]
    else:
        extra = ["--global-batch-size", "3", "--micro-batch-size", "2"]
    result = runner.invoke(app, ["sft", "--train", str(data), "--model", str(tiny_model),
                                 "--output", str(tmp_path / "o"), *extra])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    expected = {"missing": "no such file", "no_messages": "no messages", "bad_key": "learning_rat",
                "bad_batch": "multiple"}[case]
    assert expected in lines[0]


@pytest.mark.slow
def test_two_process_data_parallel_on_cpu(tiny_model, short_trajectories, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", "29631", "-m", "drvenus", "sft", "--train", str(short_trajectories),
           "--model", str(tiny_model), "--output", str(tmp_path / "ddp"), "--max-length", "128",
           "--global-batch-size", "4", "--max-steps", "10", "--save-steps", "10",
           "--learning-rate", "1e-3"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((tmp_path / "ddp" / "checkpoint-10" / "trainer_state.json").read_text())
    assert state["global_step"] == 10
    assert (tmp_path / "ddp" / "final" / "model.safetensors").is_file()


def test_the_trained_checkpoint_runs_in_drvenus_ask(full_run, tmp_path):
    from helpers.cli import drvenus

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "title": "Dracula", "url": "https://x.org/Dracula",
                                  "text": "Dracula is an 1897 novel by Bram Stoker."}) + "\n")
    env = {"DRVENUS_N_CTX": "640", "OMP_NUM_THREADS": "1"}  # a tiny window: short junk turns
    r = drvenus("ask", "Who wrote Dracula?", "--model", str(full_run.final_dir), "--corpus",
                str(corpus), "--max-steps", "1", "--time-limit", "10", "--no-constrained",
                "--json", env=env, timeout=240)
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
    record = json.loads(r.stdout)
    assert record["termination"] and record["messages"][0]["role"] == "system"
