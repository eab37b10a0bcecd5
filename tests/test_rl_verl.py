"""IGPO on verl: the launch plan (1 node x 8 GPUs, 2 nodes) as a dry run, the data conversion
and IG hook math (no verl needed), and, when verl 0.6.1 is importable, the registrations, the
Hydra composition of the launch overrides, the reward manager on a verl batch with an actor
stand-in, the advantage hook and the agent loop on a stand-in server manager."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from drvenus.cli import app  # noqa: E402
from drvenus.train.rl.collect import RolloutConfig  # noqa: E402
from drvenus.train.rl.config import RLConfig  # noqa: E402
from drvenus.train.rl.ig import IGConfig, pseudo_answer, score_trajectory  # noqa: E402
from drvenus.train.rl.verl_plugin import VERL_VERSION  # noqa: E402
from drvenus.train.rl.verl_plugin.convert import (  # noqa: E402
    REWARD_KWARGS,
    TURN_CAP,
    advantage_knobs,
    agent_loop_fields,
    agent_rollout,
    boundaries_from_extra,
    ig_rows,
    ig_scores,
    reward_config,
    sample_gains,
    traces_step,
)
from drvenus.train.rl.verl_plugin.launch import plan  # noqa: E402
from scripted import ScriptedTools, answer, call  # noqa: E402

runner = CliRunner()
HAS_VERL = importlib.util.find_spec("verl") is not None
# .ci/run sets DRVENUS_REQUIRE_VERL in its verl venv: there a missing verl fails, not skips
needs_verl = pytest.mark.skipif(
    not HAS_VERL and not os.environ.get("DRVENUS_REQUIRE_VERL"), reason=f"verl is not installed (pip install verl=={VERL_VERSION}; docs/RL.md)")


@pytest.fixture(scope="module")
def tok(tiny_policy):
    return transformers.AutoTokenizer.from_pretrained(tiny_policy)


@pytest.fixture(scope="module")
def model(tiny_policy):
    m = transformers.AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(30.0)  # spread the logits so boundaries score differently
    return m


class Engine:
    """Scripted turns as token ids (stand-in for a policy server)."""

    name = "fake"

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script = tokenizer, list(script)
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate_tokens(self, prompt_ids, params, *, timeout=None):
        from drvenus.train.rl.engine import TokenGeneration

        text = self.script.pop(0)
        return TokenGeneration(self.tokenizer.encode(text, add_special_tokens=False) + [self.eos],
                               text, "stop", len(prompt_ids))

    async def context_window(self):
        return 4096

    async def aclose(self):
        pass


SCRIPT = [call("search", query=["dune"]), call("visit", url=["https://a.org"], goal="author"),
          call("visit", url=["https://b.org"], goal="author"), answer("Frank Herbert")]


@pytest.fixture(scope="module")
def record(tok):
    from drvenus.agent import AgentConfig, ResearchAgent
    from drvenus.train.rl.recorder import TokenRecorder

    recorder = TokenRecorder(Engine(tok, SCRIPT))
    agent = ResearchAgent(recorder, ScriptedTools("Frank Herbert wrote Dune in 1965."),
                          AgentConfig(max_attempts=1, current_date="2026-11-30"))
    result = asyncio.run(agent.run("Who wrote Dune?"))
    return recorder.record(result.messages)


# ------------------------------------------------------------------ no verl needed


def _verl_dry_run(tmp_path: Path, data: Path, *extra: str) -> dict[str, str]:
    out = tmp_path / "run"
    result = runner.invoke(app, ["rl", "--train", str(data), "--model", str(tmp_path), "--output", str(out),
                                 "--trainer", "verl", "--engine", "vllm", "--dry-run", *extra])
    assert result.exit_code == 0, result.output
    script = (out / "launch" / "run_verl_rl.sh").read_text()
    assert f"verl=={VERL_VERSION}" in script and "drvenus.train.rl.verl_plugin.main" in script
    cfg = RLConfig(train=str(data), model="m", output=str(out), trainer="verl", engine="vllm")
    return plan(cfg, write=False).overrides() | {"_script": script}


def test_verl_launch_one_node_eight_gpus_has_dr_venus_settings(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text('{"question": "Who wrote Dune?", "answer": "Frank Herbert"}\n')
    o = _verl_dry_run(tmp_path, data)
    assert o["algorithm.adv_estimator"] == "grpo_info_gain" and o["algorithm.gamma"] == "0.95"
    assert o["algorithm.igpo_norm_mode"] == "scaled_separate"
    assert o["actor_rollout_ref.rollout.n"] == "8" and o["data.train_batch_size"] == "16"
    assert o["actor_rollout_ref.actor.optim.lr"] == "1e-06"
    assert o["actor_rollout_ref.actor.kl_loss_coef"] == "0.001"
    assert o["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl"
    assert o["actor_rollout_ref.actor.ulysses_sequence_parallel_size"] == "8"
    assert o["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "4"
    assert o["actor_rollout_ref.rollout.agent.default_agent_loop"] == "drvenus_agent"
    assert o["reward_model.reward_manager"] == "drvenus_igpo"
    assert o["reward_model.reward_kwargs.ig_tool_filter"] == "'visit'"
    assert o["trainer.n_gpus_per_node"] == "8" and o["trainer.nnodes"] == "1"
    converted = tmp_path / "run" / "launch" / "train.parquet"  # JSONL became verl's parquet
    assert f"data.train_files={converted}" in o["_script"]
    loop = (tmp_path / "run" / "launch" / "agent_loop.yaml").read_text()
    assert "DrVenusAgentLoop" in loop and "max_turns: 200" in loop
    # the trace interval reaches the agent loops, the events go to OUTPUT/traces
    assert "trace_save_interval: 10" in loop
    assert o["trainer.rollout_data_dir"] == str(tmp_path / "run" / "traces")


def test_verl_launch_two_nodes(tmp_path):
    data = tmp_path / "q.parquet"
    data.write_bytes(b"")
    result = runner.invoke(app, ["rl", "--train", str(data), "--model", str(tmp_path), "--output",
                                 str(tmp_path / "r"), "--trainer", "verl", "--engine", "sglang",
                                 "--nodes", "2", "--dry-run"])
    assert result.exit_code == 0, result.output
    script = (tmp_path / "r" / "launch" / "run_verl_rl.sh").read_text()
    assert "trainer.nnodes=2" in script and "ray start" in script
    assert "actor_rollout_ref.rollout.name=sglang" in script
    bad = runner.invoke(app, ["rl", "--train", str(data), "--model", str(tmp_path), "--output", "o",
                              "--trainer", "verl", "--dry-run"])
    assert bad.exit_code == 2  # verl rolls out with vllm or sglang, not transformers


def test_verl_dry_run_of_a_jsonl_file_imports_no_torch(tmp_path):
    """The dry run (JSONL converted to verl's parquet included) works where torch is not
    installed: torch, transformers and peft are blocked in a fresh interpreter."""
    import subprocess
    import sys

    data = tmp_path / "q.jsonl"
    data.write_text('{"question": "Who wrote Dune?", "answer": "Frank Herbert"}\n')
    out = tmp_path / "run"
    argv = ["drvenus", "rl", "--train", str(data), "--model", str(tmp_path), "--output", str(out),
            "--trainer", "verl", "--engine", "vllm", "--dry-run"]
    code = ("import sys\n"
            "for m in ('torch', 'transformers', 'peft'):\n    sys.modules[m] = None\n"
            f"from drvenus.cli import main\nsys.argv = {argv!r}\nmain()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "launch" / "train.parquet").is_file()
    assert f"data.train_files={out / 'launch' / 'train.parquet'}" in \
        (out / "launch" / "run_verl_rl.sh").read_text()


def test_verl_plugin_defaults_are_rl_configs():
    """What verl does not pass, the reward manager, the estimator, the agent loop and IG take
    from RLConfig: no defaults of their own."""
    d = RLConfig()
    got = reward_config({})  # the reward manager with no reward_kwargs
    assert {k: getattr(got, k) for k in REWARD_KWARGS} == {k: getattr(d, k) for k in REWARD_KWARGS}
    assert got.reward_type == "llm"
    assert IGConfig.from_rl(got) == IGConfig.from_rl(d) == IGConfig.from_rl()
    ig = IGConfig.from_rl()
    assert (ig.info_gain_type, ig.ig_tool_filter, ig.ig_compute_freq, ig.temperature,
            ig.chunk_size) == (d.info_gain_type, d.ig_tool_filter, d.ig_compute_freq,
                               d.temperature, d.ig_chunk_size)
    given = reward_config({"reward_type": "f1", "ig_compute_freq": "2", "judge_url": None})
    assert (given.reward_type, given.ig_compute_freq, given.judge_url) == ("f1", 2, None)
    assert advantage_knobs(None) == {"norm_mode": d.norm_mode, "gamma": d.gamma,
                                     "ig_weight": d.ig_weight, "norm_by_std": d.norm_by_std}
    assert advantage_knobs({"gamma": 1.0, "igpo_norm_mode": "joint"})["gamma"] == 1.0
    r = agent_rollout({}, max_model_len=d.max_model_len, temperature=d.temperature,
                      top_p=d.top_p)
    assert r == RolloutConfig.from_rl(d, n=1, seed=None)  # each trajectory draws its limit
    r = agent_rollout({"max_turns": 7, "mode": "robust", "current_date": "2026-11-30"},
                      max_model_len=4096, temperature=0.6, top_p=0.9, top_k=20)
    assert (r.max_turns, r.mode, r.current_date, r.top_k, r.temperature) == \
        (7, "robust", "2026-11-30", 20, 0.6)
    assert r.robust_max_retries == d.robust_max_retries and r.time_limit == d.rollout_time_limit
    every = d.trace_save_interval  # the agent loop traces the trainer's steps as trace_save_interval says
    assert [traces_step({}, s) for s in (every - 1, every, None)] == [False, True, False]
    assert not traces_step({"trace_save_interval": 0}, every)
    assert traces_step({"trace_save_interval": "3"}, 6)


def test_agent_loop_fields_are_the_record(record):
    f = agent_loop_fields(record)
    assert f["prompt_ids"] + f["response_ids"] == record.input_ids
    assert f["response_mask"] == record.loss_mask[record.prompt_len:]
    back = boundaries_from_extra(f["extra_fields"], len(f["prompt_ids"]))
    assert back == record.boundaries
    assert f["extra_fields"]["igpo_turns"] == record.turns


def test_ig_rows_through_an_actor_equal_the_kv_cache_scores(record, tok, model):
    """The verl IG hook (one prefix + pseudo answer per kept boundary, scored like the actor
    does) gives the IG of the one-machine KV-cache path."""
    cfg = IGConfig.from_rl()  # visit filter: boundaries after the two visit calls
    pseudo, span = pseudo_answer(tok, "Frank Herbert")
    rows = ig_rows(0, record.input_ids, record.boundaries, pseudo, span, cfg)
    assert [r.turn for r in rows] == [0, 2, 3]
    tails = []
    with torch.no_grad():
        for r in rows:  # what compute_log_prob returns for the "response" = the tail
            ids = torch.tensor([r.prefix + r.tail])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
            n = len(r.prefix)
            tails.append([float(logp[n - 1 + j, t]) for j, t in enumerate(r.tail)])
    gains = sample_gains(ig_scores(rows, tails)[0], len(record.turns), cfg.info_gain_type)
    kv = score_trajectory(model, tok, record.input_ids, record.boundaries, "Frank Herbert", cfg)
    assert len(gains) == 3 and gains[0] is None
    for a, b in zip(gains, kv.info_gains, strict=True):
        assert (a is None and b is None) or abs(a - b) <= 1e-4


# ------------------------------------------------------------------ with verl


@needs_verl
def test_verl_registrations_and_hydra_composition(tmp_path):
    from hydra import compose, initialize_config_module
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo import core_algos, ray_trainer
    from verl.workers.reward_manager import get_reward_manager_cls

    from drvenus.train.rl.verl_plugin import main

    main.install()
    assert core_algos.get_adv_estimator_fn("grpo_info_gain").__name__ == "grpo_info_gain"
    assert get_reward_manager_cls("drvenus_igpo").__name__ == "IGPORewardManager"
    assert "drvenus_agent" in _agent_loop_registry
    assert ray_trainer.compute_advantage.__module__.endswith("verl_plugin.advantage")
    assert main.main_ppo.RayPPOTrainer is main.IGPOTrainer
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    loaders = RolloutReplicaRegistry._registry  # wrapped: their servers cap each turn
    assert all(getattr(loaders[n], "drvenus_turn_cap", False) for n in ("vllm", "sglang"))
    before = loaders["vllm"]
    main.install()  # idempotent: wrapped once
    assert loaders["vllm"] is before
    cfg = RLConfig(train="t.parquet", model="m", output=str(tmp_path), trainer="verl",
                   engine="vllm", nodes=2).validate()
    command = plan(cfg, write=False).command
    with initialize_config_module("verl.trainer.config", version_base=None):
        composed = compose("ppo_trainer", overrides=command[3:])  # every key exists in verl
    assert composed.trainer.nnodes == 2 and composed.algorithm.igpo_ig_weight == 1.0


@needs_verl
def test_reward_manager_and_advantages_on_a_verl_batch(record, tok, model):
    import numpy as np
    from verl.protocol import DataProto

    from drvenus.train.rl.advantage import igpo_advantages
    from drvenus.train.rl.batch import build_sample
    from drvenus.train.rl.collect import Rollout
    from drvenus.train.rl.verl_plugin.advantage import compute_advantage
    from drvenus.train.rl.verl_plugin.reward import IGPORewardManager

    class Actor:
        """compute_log_prob as verl's actor returns it (tail log-probs at temperature 1)."""
        world_size = 2

        def compute_log_prob(self, data):
            ids, resp = data.batch["input_ids"], data.batch["responses"]
            mask, pos = data.batch["attention_mask"], data.batch["position_ids"]
            with torch.no_grad():
                logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            logp = torch.log_softmax(logits.float(), -1)
            r = resp.shape[1]
            picked = logp[:, -r - 1:-1].gather(-1, resp.unsqueeze(-1)).squeeze(-1)
            return DataProto.from_dict(tensors={"old_log_probs": picked})

    f = agent_loop_fields(record)
    plen, rlen = len(f["prompt_ids"]) + 3, len(f["response_ids"]) + 5  # padded like verl
    prompts = torch.zeros((2, plen), dtype=torch.long)
    responses = torch.zeros((2, rlen), dtype=torch.long)
    attn = torch.zeros((2, plen + rlen), dtype=torch.long)
    for i in range(2):
        prompts[i, plen - len(f["prompt_ids"]):] = torch.tensor(f["prompt_ids"])
        responses[i, : len(f["response_ids"])] = torch.tensor(f["response_ids"])
        attn[i, plen - len(f["prompt_ids"]): plen + len(f["response_ids"])] = 1
    def column(value):  # as verl's agent loop stores extra fields
        arr = np.empty(2, dtype=object)
        arr[:] = [value, value]
        return arr

    extra = {k: column(v) for k, v in f["extra_fields"].items()}
    gt = {"ground_truth": "Frank Herbert", "style": "rule"}
    data = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": attn,
                 "response_mask": torch.cat([torch.tensor(f["response_mask"]),
                                             torch.zeros(5, dtype=torch.long)]).repeat(2, 1)},
        non_tensors={**extra, "reward_model": column(gt),
                     "uid": np.array(["q0", "q0"], dtype=object)})
    manager = IGPORewardManager(tok, reward_type="f1")
    manager.attach_actor(Actor())
    out = manager(data, return_dict=True)
    rollout = Rollout(0, 0, "q", "Frank Herbert", None, record)  # type: ignore[arg-type]
    expected = build_sample(rollout, 1.0, tok, model, IGConfig.from_rl(), format_penalty=1.0).rewards
    got = out["reward_tensor"][0, : len(expected)].tolist()
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= 1e-4
    assert out["reward_extra_info"]["outcome"] == [1.0, 1.0]
    assert sum(1 for v in got if v) == 3  # two visit-turn IGs + the outcome
    data.batch["token_level_rewards"] = out["reward_tensor"]
    compute_advantage(data, adv_estimator="grpo_info_gain", config={"gamma": 0.95})
    ref, _ = igpo_advantages(out["reward_tensor"], attn[:, plen:].float(), ["q0", "q0"])
    assert torch.allclose(data.batch["advantages"], ref)


@needs_verl
def test_verl_agent_loop_runs_our_protocol_on_token_ids(tok, record):
    from omegaconf import OmegaConf
    from verl.workers.rollout.replica import TokenOutput

    from drvenus.train.rl.verl_plugin.agent_loop import DrVenusAgentLoop

    script = list(SCRIPT)
    eos = tok.convert_tokens_to_ids("<|im_end|>")

    class Servers:
        async def generate(self, request_id, *, prompt_ids, sampling_params):
            assert "max_tokens" not in sampling_params  # verl's vLLM server sets it itself
            # our servers cap each turn with it: 8,192, at most a quarter of the 4,096 window
            assert sampling_params[TURN_CAP] == min(8192, 4096 // 4)
            return TokenOutput(token_ids=tok.encode(script.pop(0), add_special_tokens=False)
                               + [eos])

    DrVenusAgentLoop._class_initialized = True  # tools set below, not from the config
    DrVenusAgentLoop.tools = ScriptedTools("Frank Herbert wrote Dune in 1965.")
    DrVenusAgentLoop.settings = {"max_turns": 200, "current_date": "2026-11-30"}
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "temperature": 1.0, "top_p": 0.95, "top_k": -1, "max_model_len": 4096}}})

    async def go():
        loop = DrVenusAgentLoop(type("C", (), {"config": config})(), Servers(), tok, None)
        return await loop.run({"temperature": 1.0, "top_p": 0.95},
                              raw_prompt=[{"role": "user", "content": "Who wrote Dune?"}])

    out = asyncio.run(go())
    assert out.prompt_ids + out.response_ids == record.input_ids
    assert out.response_mask == record.loss_mask[record.prompt_len:]
    assert out.extra_fields["drvenus_termination"] == "answered"


@needs_verl
def test_verl_agent_loop_in_dr_venus_environment(tok, tmp_path, monkeypatch):
    """``protocol: dr-venus`` in the agent-loop config: DR-Venus's RL system prompt and loop (the
    forced turn inside max_turns, its plain-user step notice), the per-turn cap, the cut-off;
    on a traced step its trace events (the notice included) rebuild the conversation."""
    from omegaconf import OmegaConf
    from verl.workers.rollout.replica import TokenOutput

    from drvenus.agent import replay_messages
    from drvenus.reference import dr_venus_rl
    from drvenus.train.rl.verl_plugin.agent_loop import DrVenusAgentLoop
    from helpers.rl import STEPS, SYSTEM, fixture_store

    texts = dr_venus_rl.load_rl_texts(fixture_store(tmp_path))
    monkeypatch.setattr(dr_venus_rl, "rl_texts", lambda store=None: texts)
    script = [call("search", query=["dune"]), call("search", query=["herbert"]),
              answer("Frank Herbert")]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    prompts = []

    class Servers:
        async def generate(self, request_id, *, prompt_ids, sampling_params):
            assert sampling_params[TURN_CAP] == 8192
            prompts.append(tok.decode(prompt_ids, skip_special_tokens=False))
            return TokenOutput(token_ids=tok.encode(script.pop(0), add_special_tokens=False)
                               + [eos])

    DrVenusAgentLoop._class_initialized = True
    DrVenusAgentLoop.tools = ScriptedTools("Frank Herbert wrote Dune in 1965.")
    DrVenusAgentLoop.cutoff = None
    DrVenusAgentLoop.settings = {"protocol": "dr-venus", "max_turns": 3, "max_turns_jitter": 0,
                                 "trace_save_interval": 1}
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "temperature": 1.0, "top_p": 0.95, "top_k": -1, "max_model_len": 16384}}})

    async def go():
        loop = DrVenusAgentLoop(type("C", (), {"config": config})(), Servers(), tok, None)
        return await loop.run({"temperature": 1.0, "top_p": 0.95},
                              raw_prompt=[{"role": "user", "content": "Who wrote Dune?"}],
                              drvenus_step=1)

    out = asyncio.run(go())
    assert len(prompts) == 3 and SYSTEM in prompts[0]
    assert f"<|im_start|>user\n{STEPS}<|im_end|>" in prompts[-1]
    assert out.extra_fields["drvenus_termination"] == "answered_max_steps"
    assert out.extra_fields["drvenus_cutoff"] is False
    assert DrVenusAgentLoop.cutoff is not None and DrVenusAgentLoop.cutoff.running == 0
    events = out.extra_fields["drvenus_events"]
    assert replay_messages(events) == events[-1]["data"]["record"]["messages"]
    assert [e["data"]["message"]["content"] for e in events if e["type"] == "limit_notice"] == \
        [STEPS]
    DrVenusAgentLoop.cutoff = None
    DrVenusAgentLoop.settings = {}


@needs_verl
def test_verl_rollouts_write_trace_events_that_serve_replays(tiny_policy, tmp_path):
    """verl's own agent-loop worker (its row dispatch and batch assembly) on a stand-in server
    manager, behind our trainer's ``generate_sequences``: a traced step writes
    ``step-NNNNNN.events.jsonl`` (one run per row, in row order) that rebuilds each conversation
    and that the replay endpoint's reader accepts; other steps and validation write none."""
    from collections import defaultdict

    import numpy as np
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorkerBase
    from verl.protocol import DataProto
    from verl.workers.rollout.replica import TokenOutput

    from drvenus.agent.events import read_trace, replay_messages
    from drvenus.serve.view import load_saved  # what /api/replay reads a file with
    from drvenus.train.rl.verl_plugin.agent_loop import DrVenusAgentLoop
    from drvenus.train.rl.verl_plugin.convert import EXTRA_EVENTS
    from drvenus.train.rl.verl_plugin.main import traced_generation

    tok = transformers.AutoTokenizer.from_pretrained(tiny_policy)
    tok.pad_token = tok.pad_token or tok.eos_token  # as verl's hf_tokenizer sets it
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    scripts: dict[str, list[str]] = defaultdict(lambda: list(SCRIPT))  # per trajectory

    class Servers:
        async def generate(self, request_id, *, prompt_ids, sampling_params):
            text = scripts[request_id].pop(0)
            return TokenOutput(token_ids=tok.encode(text, add_special_tokens=False) + [eos])

    DrVenusAgentLoop._class_initialized = True
    DrVenusAgentLoop.tools = ScriptedTools("Frank Herbert wrote Dune in 1965.")
    DrVenusAgentLoop.settings = {"max_turns": 200, "current_date": "2026-11-30",
                                 "trace_save_interval": 2}
    worker = object.__new__(AgentLoopWorkerBase)  # verl's worker, minus its Ray set-up
    worker.config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {
            "temperature": 1.0, "top_p": 0.95, "top_k": -1, "max_model_len": 4096,
            "calculate_log_probs": False, "prompt_length": 4096, "response_length": 4096,
            "val_kwargs": {"temperature": 0.0, "top_p": 1.0},
            "agent": {"default_agent_loop": "drvenus_agent"}}},
        "reward_model": {"enable": True}})
    worker.server_manager, worker.tokenizer, worker.processor = Servers(), tok, None
    worker.reward_router_address = None
    generate = traced_generation(lambda batch: asyncio.run(worker.generate_sequences(batch)),
                                 str(tmp_path / "traces"))
    questions = ["Who wrote Dune?", "Who wrote Dune Messiah?"]

    def batch(step, validate=False):
        prompts = np.empty(2, dtype=object)
        prompts[:] = [[{"role": "user", "content": q}] for q in questions]
        return DataProto.from_dict(non_tensors={"raw_prompt": prompts},
                                   meta_info={"global_steps": step, "validate": validate})

    try:
        out = generate(batch(2))
        untraced = [generate(batch(3)), generate(batch(4, validate=True))]
    finally:
        DrVenusAgentLoop.settings = {}
    assert EXTRA_EVENTS not in out.non_tensor_batch  # the events leave the batch
    assert list(out.non_tensor_batch["drvenus_termination"]) == ["answered", "answered"]
    assert all(EXTRA_EVENTS not in o.non_tensor_batch for o in untraced)
    assert [p.name for p in (tmp_path / "traces").iterdir()] == ["step-000002.events.jsonl"]
    path = tmp_path / "traces" / "step-000002.events.jsonl"
    runs = read_trace(path)
    assert len(runs) == 2
    for run, question in zip(runs, questions, strict=True):
        messages = replay_messages(run)
        assert run[0]["type"] == "started" and run[-1]["type"] == "finished"
        assert messages == run[-1]["data"]["record"]["messages"]  # the events tell it all
        assert messages[1]["content"] == question and "Frank Herbert" in messages[-1]["content"]
        assert [e["data"]["name"] for e in run if e["type"] == "tool_result"] == \
            ["search", "visit", "visit"]
    replayed = load_saved(path.read_text())
    assert [r["question"] for r in replayed] == questions
