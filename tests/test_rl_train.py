"""``drvenus rl`` end to end on CPU: a tiny random Llama with SmolLM2's tokenizer, the built-in
corpus, 2 questions x 4 rollouts, 2 steps; checkpoints, traces, resume; config checks; the judge
outcome path against a local OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from drvenus.agent.record import ResultRecord  # noqa: E402
from drvenus.cli import app  # noqa: E402
from drvenus.train.rl.batch import build_sample, outcomes  # noqa: E402
from drvenus.train.rl.collect import Rollout, RolloutConfig  # noqa: E402
from drvenus.train.rl.config import RLConfig, RLConfigError, load_config  # noqa: E402
from drvenus.train.rl.ig import IGConfig  # noqa: E402
from drvenus.train.rl.questions import question_rows  # noqa: E402
from drvenus.train.rl.rollout import Boundary, RolloutRecord  # noqa: E402
from drvenus.train.rl.trainer import _build_judge, batch_indices  # noqa: E402
from stub_server import StubServer  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def rl_data(tmp_path_factory) -> Path:
    """Two questions in the RL format (verl-style parquet), one with two accepted answers."""
    rows = [
        {"data_source": "test", "prompt": [{"role": "user", "content": "Who wrote Dune?"}],
         "ability": "qa", "reward_model": {"ground_truth": "Frank Herbert", "style": "rule"},
         "extra_info": {"index": 0, "split": "train"}},
        {"data_source": "test", "prompt": [{"role": "user", "content": "Capital of France?"}],
         "ability": "qa",
         "reward_model": {"ground_truth": "Paris<|answer_split|>Paris, France", "style": "rule"},
         "extra_info": {"index": 1, "split": "train"}},
    ]
    path = tmp_path_factory.mktemp("rl-data") / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _config(path: Path, data: Path, model: Path, out: Path, **extra) -> Path:
    values = {
        "train": str(data), "model": str(model), "output": str(out), "batch_size": 2,
        "n_rollouts": 4, "max_turns": 2, "max_turns_jitter": 0, "max_response_len": 24,
        "max_model_len": 4096, "reward_type": "f1", "ig_tool_filter": "",
        "use_format_penalty": False, "save_freq": 1, "trace_save_interval": 1,
        "rollout_concurrency": 4, "current_date": "2026-11-30", "seed": 3, **extra,
    }
    path.write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in values.items()) + "\n")
    return path


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _same(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if not k.startswith("time/")} == \
        {k: v for k, v in b.items() if not k.startswith("time/")}


@pytest.mark.slow
def test_rl_trains_end_to_end_and_resumes_identically(tmp_path, rl_data, tiny_policy):
    full = tmp_path / "full"
    cfg = _config(tmp_path / "a.yaml", rl_data, tiny_policy, full)
    result = runner.invoke(app, ["rl", "--config", str(cfg), "--total-steps", "2"])
    assert result.exit_code == 0, result.output
    rows = _metrics(full)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["actor/loss"]) and math.isfinite(r["actor/pg_loss"])
        assert r["rollout/trajectories"] == 8 and r["igpo/num_groups"] == 2
        assert r["reward/ig_nonzero"] > 0 and r["igpo/ig_total_positions"] > 0
        assert r["actor/grad_norm"] > 0 and r["actor/ratio_mean"] == pytest.approx(1.0)
    for step in (1, 2):
        ckpt = full / "checkpoints" / f"step-{step:06d}"
        assert (ckpt / "model.safetensors").is_file() and (ckpt / "optimizer.pt").is_file()
        assert transformers.AutoTokenizer.from_pretrained(ckpt).chat_template
    trace = [json.loads(x) for x in (full / "traces" / "step-000002.jsonl").read_text().splitlines()]
    assert len(trace) == 8 and all(t["messages"][1]["role"] == "user" for t in trace)
    assert any(g for t in trace for g in t["info_gains"])
    assert (full / "tensorboard").is_dir() and (full / "config.yaml").is_file()
    # the weights moved
    a = transformers.AutoModelForCausalLM.from_pretrained(tiny_policy).state_dict()
    b = transformers.AutoModelForCausalLM.from_pretrained(full / "checkpoints" / "step-000002")
    assert any(not torch.equal(a[k], v) for k, v in b.state_dict().items())

    # stopped after step 1, then resumed: step 2 is the uninterrupted run's step 2
    part = tmp_path / "part"
    cfg2 = _config(tmp_path / "b.yaml", rl_data, tiny_policy, part)
    assert runner.invoke(app, ["rl", "--config", str(cfg2), "--total-steps", "1"]).exit_code == 0
    resumed = runner.invoke(app, ["rl", "--config", str(cfg2), "--total-steps", "2", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    again = _metrics(part)
    assert [r["step"] for r in again] == [1, 2]
    assert _same(again[0], rows[0]) and _same(again[1], rows[1])


def test_format_penalties_and_outcome_land_on_the_right_tokens(embedded_tokenizer_dir):
    tok = transformers.AutoTokenizer.from_pretrained(embedded_tokenizer_dir)
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    ids = enc("<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
              "<|im_start|>assistant\n")
    bounds, turns = [], ["not a valid turn",
                         "<think>\nok\n</think>\n<answer>\nFrank Herbert\n</answer>"]
    prompt_len = len(ids)
    for k, t in enumerate(turns):
        if k:
            ids += enc("<|im_start|>assistant\n")
        bounds.append(Boundary(len(ids), None))
        ids += enc(t + "<|im_end|>\n")
        if k == 0:
            ids += enc("<|im_start|>user\n<tool_response>\nerr\n</tool_response><|im_end|>\n")
    ids = ids[:-1]
    rec = RolloutRecord(ids, prompt_len, [0] * prompt_len + [1] * (len(ids) - prompt_len),
                        [0] * len(ids), bounds, [], [2, 4], turns)
    rollout = Rollout(0, 0, "q", "Frank Herbert",
                      ResultRecord("q", [], "Frank Herbert", "answered"), rec)
    scores, _ = asyncio.run(outcomes([rollout], "f1", None))
    assert scores == [1.0]
    sample = build_sample(rollout, scores[0], tok, None, None, format_penalty=1.0)
    nonzero = {i: v for i, v in enumerate(sample.rewards) if v}
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    # the tool response's <|im_end|>, just before "\n<|im_start|>assistant\n" of turn 2
    end = max(i for i in range(bounds[1].token_len) if ids[i] == im_end) - prompt_len
    assert nonzero == {end: -1.0, len(sample.rewards) - 1: 1.0}


def test_llm_judge_outcomes_through_a_local_server(monkeypatch):
    verdict = "extracted_final_answer: Herbert\nreasoning: same\ncorrect: yes\nconfidence: 90"

    def judge_reply(request) -> str:
        # the two judged answers arrive concurrently: answer by content, not by arrival order
        prompt = json.dumps(request.json["messages"])
        return "correct: no\nconfidence: 10" if "Asimov" in prompt else verdict

    with StubServer([], default=judge_reply) as server:
        cfg = RLConfig(train="x", model="m", output="o", reward_type="llm",
                       judge_url=server.base_url, judge_model="judge")
        judge = _build_judge(cfg)
        finals = ["<think>\nx\n</think>\n<answer>\nHerbert\n</answer>",
                  "<think>\nx\n</think>\n<answer>\nAsimov\n</answer>",
                  "<think>\nx\n</think>\n<answer>\nfrank herbert\n</answer>", "no answer"]
        rollouts = [Rollout(0, i, "Who wrote Dune?", "Frank Herbert",
                            ResultRecord("q", [], "", "answered"),
                            RolloutRecord([1], 0, [1], [1], [Boundary(0)], [1], [2], [f]))
                    for i, f in enumerate(finals)]
        scores, stats = asyncio.run(outcomes(rollouts, "llm", judge))
    assert scores == [1.0, 0.0, 1.0, 0.0]
    assert stats.exact == 1 and stats.judged == 2 and stats.failures == 0
    monkeypatch.delenv("DRVENUS_JUDGE_BASE_URL", raising=False)
    monkeypatch.delenv("DRVENUS_JUDGE_MODEL", raising=False)
    with pytest.raises(RLConfigError, match="judge"):
        _build_judge(RLConfig(train="x", model="m", output="o", reward_type="llm"))


def test_config_defaults_are_dr_venus_and_bad_values_are_one_line(tmp_path):
    c = RLConfig(train="t", model="m", output="o").validate()
    assert (c.n_rollouts, c.batch_size, c.max_turns, c.temperature, c.top_p) == \
        (8, 16, 200, 1.0, 0.95)
    assert (c.norm_mode, c.gamma, c.kl_coef, c.learning_rate, c.clip_ratio) == \
        ("scaled_separate", 0.95, 0.001, 1e-6, 0.2)
    assert IGConfig.from_rl(c) == IGConfig.from_rl(ig_tool_filter="visit", chunk_size=8192)
    rollout = RolloutConfig.from_rl(c)
    assert rollout.max_context_tokens == 251_000 and rollout.mode == "deterministic"
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: t\nmodel: m\noutput: o\nnorm_mode: nope\n")
    with pytest.raises(RLConfigError, match="--norm-mode"):
        load_config(bad)
    bad.write_text("train: t\nmodel: m\noutput: o\nbogus: 1\n")
    with pytest.raises(RLConfigError, match="unknown config key"):
        load_config(bad)
    with pytest.raises(RLConfigError, match="--engine-url"):
        load_config(None, train="t", model="m", output="o", engine="vllm")
    result = runner.invoke(app, ["rl", "--train", "t", "--model", "m", "--output", "o",
                                 "--gamma", "x"])
    assert result.exit_code == 2


def test_dry_run_prints_the_resolved_config(tmp_path, rl_data, tiny_policy):
    cfg = _config(tmp_path / "c.yaml", rl_data, tiny_policy, tmp_path / "o")
    result = runner.invoke(app, ["rl", "--config", str(cfg), "--dry-run", "--gamma", "0.9"])
    assert result.exit_code == 0, result.output
    assert "gamma: 0.9" in result.output and "n_rollouts: 4" in result.output
    assert not (tmp_path / "o").exists()
    missing = runner.invoke(app, ["rl", "--config", str(cfg), "--train", "/nope.parquet",
                                  "--dry-run"])
    assert missing.exit_code == 2


def test_questions_and_batches(rl_data):
    rows = question_rows(rl_data)
    assert rows[1] == ("Capital of France?", "Paris<|answer_split|>Paris, France")
    seen = [tuple(batch_indices(10, 4, s, 0)) for s in range(4)]
    assert len(set(seen[0]) | set(seen[1])) == 8  # two full batches per epoch, no overlap
    assert seen[2] != seen[0]  # a new shuffle each epoch
    assert batch_indices(10, 4, 5, 0) == batch_indices(10, 4, 5, 0)


def test_engine_ig_crosscheck_reports_the_largest_difference(tiny_policy, rl_data):
    from types import SimpleNamespace

    from drvenus.train.rl.batch import trainer_gains
    from drvenus.train.rl.trainer import _crosscheck, load_policy

    model, tok = load_policy(tiny_policy, "cpu")
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    ids = enc("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")
    bounds = [Boundary(len(ids), "visit")]
    ids += enc("a<|im_end|>\n<|im_start|>user\nr<|im_end|>\n<|im_start|>assistant\n")
    bounds.append(Boundary(len(ids), None))
    ids += enc("b<|im_end|>")
    rec = RolloutRecord(ids, bounds[0].token_len, [], [], bounds, [], [2, 4], ["a", "b"])
    rollout = Rollout(0, 0, "q", "Frank Herbert", ResultRecord("q", [], "", "answered"), rec)
    cfg = RLConfig(train="t", model="m", output="o", ig_crosscheck=1)
    run = SimpleNamespace(config=cfg, model=model, tokenizer=tok)
    exact = trainer_gains(model, tok, rollout, IGConfig.from_rl(cfg))
    assert _crosscheck(run, [rollout], [exact])["ig/crosscheck_max_abs_diff"] == 0.0
    off = [exact[0] + 0.5]
    assert _crosscheck(run, [rollout], [off])["ig/crosscheck_max_abs_diff"] == pytest.approx(0.5)
    with pytest.raises(RLConfigError, match="ig-source engine"):
        load_config(None, train="t", model="m", output="o", ig_source="engine")


def test_entropy_coef_adds_minus_coef_times_the_token_mean_entropy(tiny_policy):
    """``entropy_coef`` is an entropy bonus on the local trainer's policy loss: the loss moves by
    exactly -coef x the token-mean entropy over the loss mask (logged as actor/entropy, also
    with the default 0, which leaves the loss as it was)."""
    import copy
    import random

    from drvenus.train.rl.batch import Sample
    from drvenus.train.rl.trainer import Updater, load_policy

    model, tok = load_policy(tiny_policy, "cpu")
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    prompt = enc("<|im_start|>user\nWho wrote Dune?<|im_end|>\n<|im_start|>assistant\n")
    ids = prompt + enc("It was Frank Herbert, in 1965.<|im_end|>")
    n = len(ids) - len(prompt)
    mask = [1] * (n - 3) + [0, 0, 1]  # two tokens out of the loss
    rollout = Rollout(0, 0, "q", "Frank Herbert", ResultRecord("q", [], "", "answered"), None)
    sample = Sample(rollout, ids, len(prompt), mask, [0.0] * n,
                    advantages=torch.linspace(-1.0, 1.0, n))

    def update(coef: float) -> dict[str, float]:
        policy = copy.deepcopy(model)
        cfg = RLConfig(train="t", model="m", output="o", entropy_coef=coef)
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)  # the weights stay put
        return Updater(policy, None, optimizer, cfg).update([sample], random.Random(0))

    base, bonus = update(0.0), update(0.1)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, len(prompt) - 1:-1].float()
        logp = torch.log_softmax(logits / RLConfig().temperature, dim=-1)
        per_token = -(logp.exp() * logp).sum(-1)
        weights = torch.tensor(mask, dtype=torch.float32)
        expected = float((per_token * weights).sum() / weights.sum())
    assert base["actor/entropy"] == pytest.approx(expected, rel=1e-5)
    assert bonus["actor/entropy"] == pytest.approx(expected, rel=1e-5)
    assert bonus["actor/loss"] - base["actor/loss"] == pytest.approx(-0.1 * expected, abs=1e-6)
    assert base["actor/loss"] == pytest.approx(base["actor/pg_loss"], abs=1e-7)  # coef 0: as before
    assert bonus["actor/grad_norm"] != pytest.approx(base["actor/grad_norm"])  # it has a gradient


@pytest.mark.slow
def test_rl_from_a_lora_adapter_trains_the_adapter_only(tmp_path, rl_data, tiny_policy):
    """``--model`` an adapter folder (``drvenus sft --lora``'s output): the adapter trains on
    its frozen base, checkpoints are adapters, and a resumed run loads them."""
    peft = pytest.importorskip("peft")
    from safetensors.torch import load_file

    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_policy)
    lora = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                     init_lora_weights=False))
    adapter = tmp_path / "sft-adapter"
    lora.save_pretrained(adapter)
    before = load_file(adapter / "adapter_model.safetensors")
    out = tmp_path / "out"
    cfg = _config(tmp_path / "a.yaml", rl_data, adapter, out, learning_rate=1e-3, kl_coef=0.01)
    result = runner.invoke(app, ["rl", "--config", str(cfg), "--total-steps", "1"])
    assert result.exit_code == 0, result.output
    ckpt = out / "checkpoints" / "step-000001"
    assert (ckpt / "adapter_config.json").is_file() and not (ckpt / "model.safetensors").exists()
    after = load_file(ckpt / "adapter_model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    row = _metrics(out)[0]
    assert row["actor/grad_norm"] > 0 and math.isfinite(row["actor/kl_loss"])
    resumed = runner.invoke(app, ["rl", "--config", str(cfg), "--total-steps", "2", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert [r["step"] for r in _metrics(out)] == [1, 2]


def test_resume_drops_a_torn_last_metrics_line(tmp_path, caplog):
    """A run killed while writing metrics.jsonl leaves half a line: --resume drops it with a
    warning (and the rows past the checkpoint), instead of crashing on it."""
    from drvenus.train.rl.trainer import MetricSink

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n{"step": 3, "a": 3.0}\n'
                    '{"step": 4, "a"')
    with caplog.at_level("WARNING"):
        sink = MetricSink(tmp_path, [], resume_step=2, echo=None)
    sink.close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    assert "torn last line" in caplog.text

    path.write_text('{"step": 1}\n{"step": 2, oops\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2: invalid JSON"):
        MetricSink(tmp_path, [], resume_step=3, echo=None)
