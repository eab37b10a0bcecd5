"""RL rollouts run the one agent loop: their trace events replay in ``drvenus serve`` (both
protocols), and the context strategies of inference apply to them (``--context-strategy``)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from typer.testing import CliRunner

pytest.importorskip("torch", reason="needs the train extra")
transformers = pytest.importorskip("transformers", reason="needs the train extra")

from drvenus.agent import ContextPolicy, replay_messages  # noqa: E402
from drvenus.cli import app  # noqa: E402
from drvenus.protocol import elided_tool_response  # noqa: E402
from drvenus.reference.dr_venus_rl import RLTexts, load_rl_texts  # noqa: E402
from drvenus.serve.app import create_app  # noqa: E402
from drvenus.serve.server import ServeThread  # noqa: E402
from drvenus.train.rl.collect import RolloutConfig, run_rollouts  # noqa: E402
from drvenus.train.rl.config import RLConfig  # noqa: E402
from drvenus.train.rl.trainer import save_traces  # noqa: E402
from helpers.rl import STEPS, QuestionEngine, dr_venus_config, fixture_store  # noqa: E402
from helpers.serve import make_registry  # noqa: E402
from scripted import ScriptedTools, answer, call  # noqa: E402

runner = CliRunner()
QUESTION = "Who wrote Dune?"


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> RLTexts:
    return load_rl_texts(fixture_store(tmp_path_factory.mktemp("ref")))


@pytest.fixture(scope="module")
def tok(embedded_tokenizer_dir):
    return transformers.AutoTokenizer.from_pretrained(embedded_tokenizer_dir)


def drvenus_config(**kw) -> RolloutConfig:
    values = {"n": 1, "max_turns": 3, "max_turns_jitter": 0, "seed": 1, "max_new_tokens": 32,
              "current_date": "2026-11-30", **kw}
    return RolloutConfig.from_rl(None, **values)


def three_turns(question: str, turns: int) -> str:
    """A call, a malformed turn, then the answer."""
    return [call("search", query=["dune"]), "no tags at all", answer("Frank Herbert")][
        min(turns, 2)]


def test_rollouts_of_both_protocols_write_traces_that_serve_replays(tok, texts, tmp_path):
    configs = {"dr-venus": dr_venus_config(texts, max_turns=3), "drvenus": drvenus_config()}
    saved = {}
    for name, cfg in configs.items():
        engine = QuestionEngine(tok, three_turns)
        (r,) = asyncio.run(run_rollouts([(QUESTION, "Frank Herbert")], engine,
                                        ScriptedTools("Herbert."), cfg, trace=True))
        kinds = [e["type"] for e in r.events]
        assert kinds[0] == "started" and kinds[-1] == "finished"
        assert {"tool_call", "tool_result", "format_error", "turn"} <= set(kinds)
        assert replay_messages(r.events) == r.result.messages  # the events tell it all
        path = save_traces(tmp_path / name, 1, [], [r])
        saved[name] = path.with_suffix(".events.jsonl").read_text()
        assert json.loads(saved[name].splitlines()[0])["type"] == "started"
    # DR-Venus's notice took the malformed message's place, as its loop does
    dr = [json.loads(x) for x in saved["dr-venus"].splitlines()]
    notice = next(e for e in dr if e["type"] == "limit_notice")
    assert notice["data"]["message"] == {"role": "user", "content": STEPS}
    assert notice["data"]["replace"] is True
    # untraced rollouts keep no events
    (quiet,) = asyncio.run(run_rollouts([(QUESTION, "x")], QuestionEngine(tok, three_turns),
                                        ScriptedTools("r"), drvenus_config()))
    assert quiet.events == []

    app_ = create_app(make_registry(tmp_path / "runs", max_running=1, max_waiting=1))
    with ServeThread(app_) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        for name, text in saved.items():
            reply = client.post("/api/replay", json={"text": text})
            assert reply.status_code == 200, (name, reply.text)
            (run,) = reply.json()["runs"]
            assert run["question"] == QUESTION and len(run["events"]) == len(text.splitlines())


def searcher():
    """A policy that never stops searching (a new query every turn)."""
    n = iter(range(1000))
    return lambda question, turns: call("search", query=[f"dune {next(n)}"])


@pytest.mark.parametrize("strategy", ["keep-last-k", "summarise"])
def test_a_context_strategy_compacts_a_rollout_and_keeps_an_exact_token_record(tok, texts,
                                                                                strategy):
    page = " ".join(f"word{i}" for i in range(60))  # a long tool response (~360 tokens)
    policy = ContextPolicy(strategy, keep_last=1)  # type: ignore[arg-type]
    prompt = "Research the question with search, then answer."
    for cfg in (drvenus_config(max_turns=8, max_context_tokens=900, system_prompt=prompt,
                               context=policy),
                dr_venus_config(texts, max_turns=8, max_model_len=1200, system_prompt=prompt,
                                context=policy)):
        engine = QuestionEngine(tok, searcher())
        (r,) = asyncio.run(run_rollouts([(QUESTION, "x")], engine, ScriptedTools(page), cfg,
                                        trace=True))
        assert r.result.extra["context_strategy"] == strategy, cfg.protocol
        assert r.result.extra["compactions"] >= 1 and r.result.turns == 8
        m = r.result.messages
        if strategy == "keep-last-k":
            stubs = [x for x in m if x["content"] == elided_tool_response()]
            assert stubs or len(m) < 2 + 2 * r.result.turns  # stubbed, or stubbed rounds dropped
        assert replay_messages(r.events) == m
        assert any(e["type"] == "compaction" for e in r.events)
        rec = r.tokens
        assert rec is not None  # the segment since the last compaction, exact
        last_prompt = engine.calls[-1][1]
        assert rec.input_ids[: len(last_prompt)] == last_prompt
        assert rec.boundaries[-1].token_len == len(last_prompt)
    # the same rollout without a strategy: the budget fills and the answer is forced early
    engine = QuestionEngine(tok, searcher())
    (r,) = asyncio.run(run_rollouts([(QUESTION, "x")], engine, ScriptedTools(page),
                                    drvenus_config(max_turns=8, max_context_tokens=900,
                                                   system_prompt=prompt)))
    assert "token_limit" in r.result.termination
    assert r.result.turns < 8 and "compactions" not in r.result.extra


def test_context_strategy_setting_defaults_to_none_and_refuses_bad_values(tmp_path):
    assert RLConfig().context_strategy == "none"
    assert RolloutConfig.from_rl(RLConfig(protocol="dr-venus"),
                                 texts=object()).context == ContextPolicy()
    cfg = RolloutConfig.from_rl(RLConfig(context_strategy="keep-last-k", keep_last=2))
    assert cfg.context == ContextPolicy("keep-last-k", keep_last=2)
    assert cfg.agent_config(5).context == cfg.context
    # verl: the launcher writes the keys, the agent loop reads them back
    from drvenus.train.rl.verl_plugin.convert import agent_rollout
    from drvenus.train.rl.verl_plugin.launch import agent_loop_yaml

    entry = agent_loop_yaml(RLConfig(context_strategy="keep-last-k", keep_last=2))
    assert "  context_strategy: keep-last-k\n" in entry and "  keep_last: 2\n" in entry
    read = agent_rollout({"context_strategy": "keep-last-k", "keep_last": "2"},
                         max_model_len=4096, temperature=1.0, top_p=1.0)
    assert read.context == cfg.context
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    (tmp_path / "model").mkdir()
    base = ["rl", "--train", str(data), "--model", str(tmp_path / "model"), "--output",
            str(tmp_path / "out"), "--reward-type", "f1", "--dry-run"]
    for bad, flag in ((["--context-strategy", "forget"], "--context-strategy"),
                      (["--keep-last", "-1"], "--keep-last")):
        result = runner.invoke(app, [*base, *bad])
        assert result.exit_code == 2, result.output
        assert flag in result.output and len(result.output.strip().splitlines()) == 1, \
            result.output
    ok = runner.invoke(app, [*base, "--context-strategy", "summarise", "--keep-last", "0"])
    assert ok.exit_code == 0, ok.output


def test_a_full_window_ends_a_dr_venus_trajectory_whatever_the_strategy(texts):
    """A model that says the prompt no longer fits ends DR-Venus's trajectory as
    token_limit_no_answer, its notice kept, with or without a context strategy."""
    from drvenus.llm.base import LLMError
    from drvenus.train.rl.environment import run_trajectory
    from helpers.rl import env
    from scripted import ScriptedModel

    full = LLMError("the prompt does not fit", context_overflow=True)
    for policy in (ContextPolicy(), ContextPolicy("keep-last-k", keep_last=0)):
        model = ScriptedModel([call("search", query=["a"]), call("search", query=["b"]), full])
        rec = asyncio.run(run_trajectory(model, ScriptedTools("r"), env(texts, context=policy),
                                         QUESTION, max_turns=3))
        assert rec.termination == "token_limit_no_answer" and rec.turns == 2
        assert rec.messages[-1] == {"role": "user", "content": STEPS} and len(model.calls) == 3
