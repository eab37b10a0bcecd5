"""``drvenus rl --protocol dr-venus``: DR-Venus's RL environment texts read from its pinned files
(fixtures of our own wording laid out like the real ones: same paths, names and structure), the
rollouts sending them byte for byte (plain-user notices, the malformed message, the tool
timeout), the loop's behaviours (the forced turn inside ``max_turns``, a turn limit per
trajectory, empty turns answered, the 90% completion cut-off, the per-turn cap, the re-rendered
last turn under a Qwen3 thinking template) and DR-Venus's outcome judge against a local server."""

from __future__ import annotations

import asyncio
import json
import re
import shutil

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch", reason="needs the train extra")
transformers = pytest.importorskip("transformers", reason="needs the train extra")

from drvenus.cli import app  # noqa: E402
from drvenus.llm.base import SamplingParams  # noqa: E402
from drvenus.protocol import wrap_tool_response  # noqa: E402
from drvenus.reference.dr_venus_rl import (  # noqa: E402
    RL_FILES,
    RLJudgeTexts,
    RLTexts,
    load_rl_judge,
    load_rl_texts,
)
from drvenus.reference.extract import ExtractError  # noqa: E402
from drvenus.reference.store import ReferenceError  # noqa: E402
from drvenus.train.rl.collect import RolloutConfig, run_rollouts  # noqa: E402
from drvenus.train.rl.config import RLConfig  # noqa: E402
from drvenus.train.rl.environment import (  # noqa: E402
    CompletionCutoff,
    classify_turn,
    fix_tags,
    run_trajectory,
    turn_limit,
)
from drvenus.train.rl.verl_plugin.convert import TURN_CAP, server_sampling  # noqa: E402
from drvenus.train.rl.verl_plugin.launch import plan  # noqa: E402
from drvenus.train.rl.verl_plugin.servers import capped, capped_generate  # noqa: E402
from helpers.rl import (  # noqa: E402
    CONTEXT,
    CUTOFF,
    FIXTURES,
    JUDGE,
    MALFORMED,
    STEPS,
    SYSTEM,
    QuestionEngine,
    dr_venus_config,
    env,
    fixture_store,
)
from helpers.templates import QWEN3_STYLE_TEMPLATE  # noqa: E402
from scripted import ScriptedModel, ScriptedTools, answer, call  # noqa: E402

runner = CliRunner()
@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> RLTexts:
    return load_rl_texts(fixture_store(tmp_path_factory.mktemp("ref")))


@pytest.fixture(scope="module")
def judge_texts(tmp_path_factory) -> RLJudgeTexts:
    return load_rl_judge(fixture_store(tmp_path_factory.mktemp("ref")))


def run(model, tools, cfg, *, max_turns: int, cutoff=None, question="Who wrote Dune?"):
    return asyncio.run(run_trajectory(model, tools, cfg, question, max_turns=max_turns,
                                      cutoff=cutoff))


# ---------------------------------------------------------------- the texts


def test_rl_texts_are_taken_from_the_pinned_files_by_structure(texts, judge_texts):
    assert (texts.system_prompt, texts.malformed, texts.context_limit, texts.step_limit,
            texts.cutoff) == (SYSTEM, MALFORMED, CONTEXT, STEPS, CUTOFF)
    assert texts.timeout_text(7) == "Fixture tool gave up after 7.0 s."  # the file's format spec
    assert texts.error_text(RuntimeError("x")) == "Fixture tool broke: RuntimeError('x')"
    assert set(texts.files) == set(RL_FILES) - {RL_FILES[2]} and texts.source.startswith("DR-Venus @")
    # the tool server's own texts: an unrouted tool, a call without its fields
    assert texts.unknown_tool_text("browse") == "Fixture: there is no tool called browse."
    assert texts.bad_arguments == {"search": "Fixture search: give a query.",
                                   "visit": "Fixture visit: give a url and a goal."}
    assert judge_texts.prompt == JUDGE and judge_texts.zero_answers == ("", "placeholder answer")
    assert re.search(judge_texts.verdict, "Verdict = YES", judge_texts.flags)
    assert set(judge_texts.files) == {RL_FILES[2]}


def test_a_changed_or_missing_file_is_refused_with_one_line(tmp_path, texts):
    root = tmp_path / "ref"
    shutil.copytree(FIXTURES, root)
    store = fixture_store(tmp_path, root)
    loop = root / "DR-Venus" / RL_FILES[0]
    loop.write_text(loop.read_text().replace("at once", "right now"))
    with pytest.raises(ReferenceError) as err:
        load_rl_texts(store)
    assert "DR-Venus/RL/scrl/llm_agent/dr_agent_loop.py" in str(err.value)
    assert "\n" not in str(err.value)
    # the structure, not the words: a file without the malformed message is refused
    shutil.copytree(FIXTURES, tmp_path / "ref2")
    loop2 = tmp_path / "ref2" / "DR-Venus" / RL_FILES[0]
    loop2.write_text(loop2.read_text().replace("error_msg", "other_msg"))
    with pytest.raises(ExtractError, match="error_msg"):
        load_rl_texts(fixture_store(tmp_path, tmp_path / "ref2"))
    shutil.copytree(FIXTURES, tmp_path / "ref3")
    (tmp_path / "ref3" / "DR-Venus" / RL_FILES[2]).unlink()
    store = fixture_store(tmp_path, tmp_path / "ref3", pinned=FIXTURES)
    with pytest.raises(ReferenceError, match="llm_judge.py: not found"):
        load_rl_judge(store)
    assert load_rl_texts(store) == texts  # the environment needs no judge file


# ---------------------------------------------------------------- the loop


def test_system_prompt_and_the_forced_turn_counts_inside_max_turns(texts):
    model = ScriptedModel([call("search", query=["dune"])])
    result = run(model, ScriptedTools("Dune is by Frank Herbert."), env(texts), max_turns=3)
    m = result.messages
    assert m[0] == {"role": "system", "content": SYSTEM}
    assert [x["role"] for x in m] == ["system", "user", "assistant", "user", "assistant",
                                      "user", "assistant"]
    assert len(model.calls) == 3 and result.turns == 3  # turn max_turns - 1 is the forced one
    assert m[3]["content"] == wrap_tool_response("Dune is by Frank Herbert.")
    assert m[5] == {"role": "user", "content": STEPS}  # in place of the tool response, unframed
    assert result.termination == "max_steps" and result.tool_call_count == 2
    # answered after the notice; one turn allowed: no notice at all
    model = ScriptedModel([call("search", query=["dune"]), answer("Frank Herbert")])
    result = run(model, ScriptedTools("x"), env(texts), max_turns=2)
    assert result.termination == "answered_max_steps" and result.messages[3]["content"] == STEPS
    result = run(ScriptedModel([call("search", query=["a"])]), ScriptedTools("x"), env(texts),
                 max_turns=1)
    assert [x["role"] for x in result.messages] == ["system", "user", "assistant"]
    assert result.messages[1]["content"] == "Who wrote Dune?"
    # a given date replaces the prompt's own
    cfg = env(texts, current_date="2026-11-30")
    assert cfg.system_prompt == SYSTEM.replace("2025-01-02", "2026-11-30")


def test_a_row_keeps_its_own_system_message_and_extra_messages(texts):
    """verl rows: DR-Venus keeps the row's messages and adds its prompt only when none is there."""
    own = [{"role": "system", "content": "Row system."}, {"role": "user", "content": "Context."},
           {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Q?"}]
    rec = asyncio.run(run_trajectory(ScriptedModel([answer("A")]), ScriptedTools("x"),
                                     env(texts), "Q?", max_turns=3, prompt=own))
    assert rec.messages[:4] == own and rec.messages[4]["role"] == "assistant"
    rec = asyncio.run(run_trajectory(ScriptedModel([answer("A")]), ScriptedTools("x"),
                                     env(texts), "Q?", max_turns=3, prompt=own[1:]))
    assert rec.messages[0] == {"role": "system", "content": SYSTEM}
    assert rec.messages[1:4] == own[1:]


def test_an_empty_or_malformed_turn_gets_the_malformed_message_and_the_rollout_goes_on(texts):
    model = ScriptedModel(["", "no tags at all", answer("Frank Herbert")])
    result = run(model, ScriptedTools("x"), env(texts), max_turns=10)
    m = result.messages
    assert result.termination == "answered" and result.turns == 3
    assert m[3] == {"role": "user", "content": MALFORMED}
    assert m[5] == {"role": "user", "content": MALFORMED}
    assert result.parse_error_count == 2 and result.prediction == "Frank Herbert"
    # robust mode samples the malformed turn again instead
    model = ScriptedModel(["no tags", answer("Frank Herbert")])
    result = run(model, ScriptedTools("x"), env(texts, attempts=2), max_turns=10)
    assert result.turns == 1 and result.extra["robust_retries"]["parse"] == 1


def test_tool_timeout_and_tool_errors_are_dr_venus_texts(texts):
    class Slow:
        async def call(self, tool_call):
            await asyncio.sleep(5)
            return "late"

    model = ScriptedModel([call("search", query=["a"]), answer("x")])
    result = run(model, Slow(), env(texts, tool_timeout=0.2), max_turns=5)
    assert result.messages[3]["content"] == wrap_tool_response("Fixture tool gave up after 0.2 s.")
    model = ScriptedModel([call("search", query=["a"]), answer("x")])
    result = run(model, ScriptedTools(fail=True), env(texts), max_turns=5)
    assert result.messages[3]["content"] == \
        wrap_tool_response("Fixture tool broke: RuntimeError('tool exploded')")


def test_context_limit_notice_replaces_the_last_message(texts):
    model = ScriptedModel([call("search", query=["a"]), answer("Frank Herbert")])
    cfg = env(texts, max_model_len=200, max_new_tokens=50)  # 150 prompt tokens at most
    result = run(model, ScriptedTools("y" * 800), cfg, max_turns=10)
    assert result.messages[3] == {"role": "user", "content": CONTEXT}
    assert result.termination == "answered_token_limit" and result.turns == 2


def test_cutoff_notice_joins_the_question_on_the_first_turn_else_replaces_the_last(texts):
    cutoff = CompletionCutoff(0.5, total=2)
    cutoff.finish()
    assert cutoff.triggered
    result = run(ScriptedModel([answer("x")]), ScriptedTools("x"), env(texts), max_turns=10,
                 cutoff=cutoff)
    assert result.messages[1] == {"role": "user", "content": "Who wrote Dune?\n\n" + CUTOFF}
    assert result.turns == 1 and result.extra["cutoff"] is True
    later = CompletionCutoff(0.5, total=2)

    def body(tool_call):
        later.finish()  # the others finish while this one reads
        return "result"

    model = ScriptedModel([call("search", query=["a"]), call("search", query=["b"])])
    result = run(model, ScriptedTools(body), env(texts), max_turns=10, cutoff=later)
    assert result.messages[3] == {"role": "user", "content": CUTOFF}
    assert result.turns == 2 and result.termination == "max_steps" and result.extra["cutoff"]


def test_completion_cutoff_counts_a_step_or_a_wave():
    c = CompletionCutoff(0.9, total=10)
    for _ in range(8):
        c.finish()
    assert not c.triggered
    c.finish()
    assert c.triggered  # 9 of 10: 90%
    w = CompletionCutoff(0.9)  # verl's worker: a wave of trajectories started together
    for _ in range(10):
        w.start()
    for _ in range(9):
        w.finish()
    assert w.triggered
    w.finish()
    w.start()  # the next step's wave
    assert not w.triggered and w.started == 1
    off = CompletionCutoff(0.0, total=1)
    off.finish()
    assert not off.triggered


def test_turn_reading_and_tag_fixing_follow_dr_venus():
    assert fix_tags("", True) == "<think>\n</think>"  # DR-Venus: "<think>" + sample, no newline
    assert fix_tags("x</think>", True) == "<think>x</think>"
    assert fix_tags("thought</think><answer>a</answer>", False).startswith("<think>\n")
    assert fix_tags("<think>x<tool_response>y", False) == "<think>x\n</think>"
    assert classify_turn("<think>x</think><answer></answer>").kind == "answer"  # empty answers
    assert classify_turn("<think>x <answer>a</answer></think><tool_call>{}</tool_call>").kind \
        == "malformed"
    t = classify_turn('<think>x</think><tool_call>{"name": "browse", "arguments": {}}</tool_call>')
    assert t.kind == "tool_call" and t.call is None and "browse" in str(t.call_error)
    t = classify_turn("<think>x</think><tool_call>{name: 'search', arguments: {query: ['a']}}"
                      "</tool_call>")  # JSON5
    assert t.kind == "tool_call" and t.call is not None and t.call.arguments == {"query": ["a"]}


def test_turn_limits_are_drawn_per_trajectory():
    import random

    rng = random.Random(0)
    draws = [turn_limit(200, 5, rng) for _ in range(2000)]
    assert min(draws) >= 195 and max(draws) <= 204 and len(set(draws)) == 9  # int(u*10-5)
    assert draws.count(200) > 1.5 * draws.count(201)  # int() truncates: 0 twice as likely


# ---------------------------------------------------------------- config, CLI, verl launch


def test_protocol_setting_cli_and_verl_launch(tmp_path, monkeypatch):
    monkeypatch.setenv("DRVENUS_PROTOCOL", "dr-venus")
    assert RLConfig().protocol_name() == "dr-venus"
    monkeypatch.delenv("DRVENUS_PROTOCOL")
    assert RLConfig().protocol_name() == "drvenus"
    assert RLConfig(protocol="dr-venus").protocol_name() == "dr-venus"
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    (tmp_path / "model").mkdir()
    base = ["rl", "--train", str(data), "--model", str(tmp_path / "model"), "--output",
            str(tmp_path / "out"), "--protocol", "dr-venus", "--reward-type", "f1"]
    monkeypatch.setenv("DRVENUS_REFERENCE_DIR", str(tmp_path / "no-checkout"))
    result = runner.invoke(app, [*base, "--dry-run"])
    assert result.exit_code == 2
    assert "DR-Venus/RL/" in result.output and "DRVENUS_REFERENCE_DIR" in result.output
    bad = runner.invoke(app, [*base[:-4], "--protocol", "other", "--dry-run"])
    assert bad.exit_code == 2 and "--protocol" in bad.output
    # a verl dry run writes the plan without the files (the cluster may hold them)
    result = runner.invoke(app, [*base, "--trainer", "verl", "--engine", "vllm", "--dry-run"])
    assert result.exit_code == 0, result.output
    loop = (tmp_path / "out" / "launch" / "agent_loop.yaml").read_text()
    for line in ("protocol: dr-venus", "max_turns: 200", "max_turns_jitter: 5",
                 "max_response_len: 8192", "completion_cutoff: 0.9", "tool_timeout: 150.0",
                 f"reference_dir: '{tmp_path / 'no-checkout'}'"):
        assert line in loop
    script = (tmp_path / "out" / "launch" / "run_verl_rl.sh").read_text()
    assert "+reward_model.reward_kwargs.protocol=dr-venus" in script
    cfg = RLConfig(train=str(data), model="m", output=str(tmp_path / "o2"), trainer="verl",
                   engine="vllm")
    assert any(o.endswith("protocol=drvenus") for o in plan(cfg, write=False).command)


def test_the_verl_agent_loop_sends_the_per_turn_cap():
    sampling = server_sampling(SamplingParams(temperature=1.0, top_p=0.95, max_tokens=8192))
    assert sampling[TURN_CAP] == 8192 and "max_tokens" not in sampling  # verl's servers set it
    assert TURN_CAP not in server_sampling(SamplingParams(max_tokens=None))
    assert capped(250_000, 8192) == 8192 and capped(100, 8192) == 100
    assert capped(100, None) == 100 and capped(None, 8) is None


def test_the_capped_servers_generate_under_the_requests_cap():
    """Our server classes' ``generate``: the cap leaves the sampling parameters (the engine
    never sees it), is set while the engine's own ``generate`` runs, and is reset after."""
    import asyncio
    from contextvars import ContextVar

    cap: ContextVar[int | None] = ContextVar("test_cap", default=None)
    seen = []

    class Engine:
        async def generate(self, prompt_ids, sampling_params, request_id, image_data=None):
            seen.append((cap.get(), dict(sampling_params), request_id, image_data))
            if request_id == "boom":
                raise RuntimeError("engine failed")
            return [t + 1 for t in prompt_ids]

    class Capped(Engine):
        generate = capped_generate(Engine, cap)

    server = Capped()
    got = asyncio.run(server.generate([1, 2], {"temperature": 1.0, TURN_CAP: 8192}, "a"))
    assert got == [2, 3] and seen[-1] == (8192, {"temperature": 1.0}, "a", None)
    assert cap.get() is None
    asyncio.run(server.generate([1], {"max_tokens": 5}, "b", image_data="img"))
    assert seen[-1] == (None, {"max_tokens": 5}, "b", "img")
    with pytest.raises(RuntimeError):
        asyncio.run(server.generate([1], {TURN_CAP: 3}, "boom"))
    assert seen[-1][0] == 3 and cap.get() is None


# ---------------------------------------------------------------- token rollouts

@pytest.fixture(scope="module")
def tok(embedded_tokenizer_dir):
    return transformers.AutoTokenizer.from_pretrained(embedded_tokenizer_dir)


@pytest.fixture(scope="module")
def qwen3(embedded_tokenizer_dir):
    t = transformers.AutoTokenizer.from_pretrained(embedded_tokenizer_dir)
    t.chat_template = QWEN3_STYLE_TEMPLATE
    return t


def test_each_trajectory_draws_its_own_turn_limit(tok, texts):
    engine = QuestionEngine(tok, lambda q, k: call("search", query=[f"{q} {k}"]))
    cfg = dr_venus_config(texts, n=4, max_turns=6, max_turns_jitter=3)
    out = asyncio.run(run_rollouts([("q0", "a"), ("q1", "b")], engine, ScriptedTools("r"), cfg))
    limits = [cfg.turn_limit(0, r.group, r.index) for r in out]
    assert [r.result.turns for r in out] == limits and len(set(limits)) > 1
    for r in out:
        assert r.result.messages[-2] == {"role": "user", "content": STEPS}
        assert r.result.messages[0]["content"] == SYSTEM and r.tokens is not None
    assert {p.max_tokens for _, _, p in engine.calls} == {32}  # the per-turn cap
    assert cfg.turn_limit(0, 0, 0) == cfg.turn_limit(0, 0, 0)  # seeded: reproducible


def test_completion_cutoff_at_90_percent_of_the_step(tok, texts):
    class SlowTools:
        async def call(self, tool_call):
            await asyncio.sleep(0.05)
            return "still reading"

    def script(question, turns):
        if question.startswith("q0") and CUTOFF not in question:
            return call("search", query=[f"more {turns}"])
        return answer("x")

    items = [(f"q{i}", "x") for i in range(10)]
    engine = QuestionEngine(tok, script)
    out = asyncio.run(run_rollouts(items, engine, SlowTools(), dr_venus_config(texts,
                                                                               max_turns=50)))
    slow, rest = out[0], out[1:]
    assert all(not r.result.extra["cutoff"] and r.result.turns == 1 for r in rest)
    assert slow.result.extra["cutoff"] and slow.result.turns < 50
    assert slow.result.messages[-2] == {"role": "user", "content": CUTOFF}
    # off: the straggler runs to its limit
    engine = QuestionEngine(tok, script)
    out = asyncio.run(run_rollouts(items[:2], engine, ScriptedTools("r"),
                                   dr_venus_config(texts, max_turns=5, cutoff=0.0)))
    assert out[0].result.turns == 5 and not out[0].result.extra["cutoff"]


def test_a_plain_user_notice_rerenders_the_last_prompt_under_qwen3(qwen3, texts):
    def script(question, turns):
        return call("search", query=[f"dune {turns}"]) if turns < 2 else answer("Frank Herbert")

    engine = QuestionEngine(qwen3, script)
    cfg = dr_venus_config(texts, max_turns=3)
    (r,) = asyncio.run(run_rollouts([("Who wrote Dune?", "Frank Herbert")], engine,
                                    ScriptedTools("Herbert."), cfg))
    prompts = [qwen3.decode(p, skip_special_tokens=False) for _, p, _ in engine.calls]
    assert "I should use search." in prompts[1]  # the history the policy produced
    last = prompts[-1]
    assert "I should use search." not in last  # a new query: earlier reasoning dropped
    assert f"<|im_start|>user\n{STEPS}<|im_end|>\n<|im_start|>assistant\n<think>\n" in last
    # recorded on the last prompt: what the last turn saw, then what it sampled; the earlier
    # turns trained where that prompt rendered them (their reasoning gone, as in DR-Venus)
    rec = r.tokens
    assert rec is not None and rec.input_ids[: len(engine.calls[-1][1])] == engine.calls[-1][1]
    assert rec.boundaries[-1].token_len == len(engine.calls[-1][1])
    assert rec.message_indices == [2, 4, 6] and rec.tool_names == ["search", "search", None]
    for k in range(2):
        trained = qwen3.decode(rec.input_ids[rec.boundaries[k].token_len:rec.generated_ends[k]],
                               skip_special_tokens=False)
        assert trained.startswith("<tool_call>") and trained.endswith("</tool_call><|im_end|>")
        assert sum(rec.loss_mask[rec.boundaries[k].token_len:rec.generated_ends[k]]) == \
            rec.generated_ends[k] - rec.boundaries[k].token_len
    assert "Herbert." not in qwen3.decode([t for t, m in zip(rec.input_ids, rec.loss_mask,
                                                              strict=True) if m])
    assert rec.turns[-1] == r.result.messages[-1]["content"]
    # kept as DR-Venus's loop keeps a sample after the template's "<think>\n": "<think>" + it
    assert r.result.messages[2]["content"].startswith("<think>I should use search.")
    # our default protocol frames every notice: the history keeps its reasoning, ids exact
    engine = QuestionEngine(qwen3, script)
    base = RolloutConfig.from_rl(None, n=1, max_turns=3, max_turns_jitter=0, seed=1,
                                 max_new_tokens=32, current_date="2026-11-30")
    (d,) = asyncio.run(run_rollouts([("Who wrote Dune?", "Frank Herbert")], engine,
                                    ScriptedTools("Herbert."), base))
    last = qwen3.decode(engine.calls[-1][1], skip_special_tokens=False)
    assert last.count("I should use search.") == 2 and d.tokens is not None


# ---------------------------------------------------------------- the outcome judge


def test_dr_venus_judge_prompt_sampling_and_short_cuts(texts, judge_texts, tok):
    from drvenus.train.rl.batch import outcomes
    from drvenus.train.rl.judge import DrVenusJudge
    from stub_server import StubServer

    asked: dict[str, int] = {}

    def reply(request):
        prompt = request.json["messages"][0]["content"]
        given = prompt.split("\nA: ")[1].split("\n")[0]
        asked[given] = asked.get(given, 0) + 1
        if given == "Empty" and asked[given] < 3:
            return ""  # an empty reply is asked again, 3 attempts in all
        return {"Herbert": "reason... Verdict = YES", "Asimov": "verdict=no",
                "Empty": "verdict=yes", "Paris": "verdict=yes"}.get(given, "cannot tell")

    prompt = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nWho wrote Dune?<|im_end|>\n" \
        "<|im_start|>assistant\n"

    def final(a: str | None) -> str:
        body = f"<answer>\n{a}\n</answer>" if a is not None else "none"
        return f"<think>\nx\n</think>\n{body}<|im_end|>"

    cases = [("Frank Herbert", "Frank Herbert"), ("placeholder answer", "Frank Herbert"),
             (None, "Frank Herbert"), ("Herbert", "Frank Herbert"), ("Asimov", "Frank Herbert"),
             ("Tolkien", "Frank Herbert"), ("Empty", "Frank Herbert"),
             ("Paris", "Paris<|answer_split|>Paris, France")]
    items = [(prompt, "<think>\nold\n</think>\n<answer>\nwrong\n</answer><|im_end|>\n"
              "<|im_start|>assistant\n" + final(a), gt, "Who wrote Dune?") for a, gt in cases]
    with StubServer([], default=reply) as server:
        judge = DrVenusJudge(judge_texts, server.base_url, "judge", concurrency=4)
        scores, stats = asyncio.run(judge.score(items))
        requests = list(server.requests)
    assert scores == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert (stats.exact, stats.judged, stats.failures) == (1, 4, 1)
    assert set(asked) == {"Herbert", "Asimov", "Tolkien", "Empty", "Paris"}  # short-cuts unasked
    assert asked["Empty"] == 3
    body = next(r.json for r in requests
                if "\nA: Herbert\n" in r.json["messages"][0]["content"])
    assert body["messages"] == [{"role": "user", "content": JUDGE.format(
        question="Who wrote Dune?<|im_end|>\n<|im_start|>", response="Herbert",
        correct_answer="Frank Herbert")}]  # the question as DR-Venus reads the prompt
    assert {k: v for k, v in body.items() if k != "messages"} == {
        "model": "judge", "temperature": 0.1, "top_p": 0.95, "n": 1,
        "chat_template_kwargs": {"enable_thinking": True}}  # no token cap
    paris = next(r.json for r in requests if "\nA: Paris\n" in r.json["messages"][0]["content"])
    assert "Gold: Paris<|answer_split|>Paris, France\n" in paris["messages"][0]["content"]
    assert all(r.path.endswith("/chat/completions") for r in requests)

    # the local trainer's outcomes: DR-Venus's judge reads the decoded trajectory
    engine = QuestionEngine(tok, lambda q, k: answer("Herbert"))
    out = asyncio.run(run_rollouts([("Who wrote Dune?", "Frank Herbert")], engine,
                                   ScriptedTools("r"), dr_venus_config(texts)))
    with StubServer([], default=reply) as server:
        judge = DrVenusJudge(judge_texts, server.base_url, "judge")
        scores, _ = asyncio.run(outcomes(out, "llm", judge, 2, tok))
        sent = server.requests[0].json["messages"][0]["content"]
    assert scores == [1.0]
    assert sent.startswith("Fixture judge.\nQ: Who wrote Dune?<|im_end|>\n<|im_start|>\nA: Herbert")


def test_a_model_failing_after_the_notice_keeps_the_exact_record(tok, texts):
    from drvenus.llm.base import LLMError

    def script(question, turns):
        if turns < 1:
            return call("search", query=["dune"])
        raise LLMError("the policy server went away")

    engine = QuestionEngine(tok, script)
    (r,) = asyncio.run(run_rollouts([("Who wrote Dune?", "x")], engine, ScriptedTools("r"),
                                    dr_venus_config(texts, max_turns=2)))
    assert r.result.termination == "llm_error" and r.result.messages[-1]["content"] == STEPS
    assert r.tokens is not None and len(r.tokens.turns) == 1  # the turn it sampled, exact
    assert r.tokens.input_ids == engine.calls[0][1] + tok.encode(
        call("search", query=["dune"]), add_special_tokens=False) + [engine.eot]


@pytest.mark.slow
def test_rl_trains_a_step_in_dr_venus_environment(tmp_path, tiny_policy, texts, monkeypatch):
    """``drvenus rl --protocol dr-venus`` end to end on CPU (the fixture texts in place of the
    pinned files): rollouts in DR-Venus's environment, IG, the update, a checkpoint."""
    from drvenus.reference import dr_venus_rl

    monkeypatch.setattr(dr_venus_rl, "rl_texts", lambda store=None: texts)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n"
                            for q, a in (("Who wrote Dune?", "Frank Herbert"),
                                         ("Capital of France?", "Paris"))))
    out = tmp_path / "run"
    result = runner.invoke(app, [
        "rl", "--train", str(data), "--model", str(tiny_policy), "--output", str(out),
        "--protocol", "dr-venus", "--reward-type", "f1", "--batch-size", "2", "--n-rollouts",
        "2", "--max-turns", "2", "--max-turns-jitter", "0", "--max-response-len", "16",
        "--max-model-len", "4096", "--ig-tool-filter", "", "--total-steps", "1",
        "--rollout-concurrency", "4", "--trace-save-interval", "1", "--logger", "none"])
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["rollout/trajectories"] == 4 and "rollout/cutoff" in metrics
    trace = [json.loads(x) for x in (out / "traces" / "step-000001.jsonl").read_text().splitlines()]
    for t in trace:
        assert t["messages"][0]["content"] == SYSTEM and "cutoff" in t
        assert len([m for m in t["messages"] if m["role"] == "assistant"]) <= 2
    assert (out / "checkpoints" / "step-000001" / "trainer_state.json").is_file()
    from drvenus.agent.events import read_trace  # the rollouts' trace events, one run each

    runs = read_trace(out / "traces" / "step-000001.events.jsonl")
    assert len(runs) == 4 and all(r[-1]["type"] == "finished" for r in runs)
