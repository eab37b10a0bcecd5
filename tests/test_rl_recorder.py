"""Token-exact rollouts: the recorder keeps the ids the policy saw and sampled through the real
agent loop (retries, limit notices, context overflow), the server engines speak vLLM's and
SGLang's token-in/token-out APIs, and a real run on the embedded SmolLM2 decodes back to its
turns."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from drvenus.agent import AgentConfig, ResearchAgent
from drvenus.llm.base import LLMError, SamplingParams
from drvenus.protocol import STEP_LIMIT_MESSAGE, STOP_STRINGS
from scripted import ScriptedTools, answer, call

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from drvenus.train.rl.collect import RolloutConfig, run_rollouts  # noqa: E402
from drvenus.train.rl.engine import ServerEngine, TokenGeneration, trim_to_text  # noqa: E402
from drvenus.train.rl.recorder import ChatTemplateParts, TokenRecorder  # noqa: E402
from drvenus.train.rl.rollout import rollout_record  # noqa: E402


@pytest.fixture(scope="module")
def tok(embedded_tokenizer_dir):
    return transformers.AutoTokenizer.from_pretrained(embedded_tokenizer_dir)


class FakeEngine:
    """Scripted turns; each is sampled as ``ids`` (default: the text's own tokenisation) plus
    the end-of-turn token. Records every prompt it was given."""

    name = "fake"

    def __init__(self, tokenizer, script):
        self.tokenizer = tokenizer
        self.script = list(script)
        self.prompts: list[list[int]] = []
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate_tokens(self, prompt_ids, params, *, timeout=None):
        self.prompts.append(list(prompt_ids))
        item = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(item, Exception):
            raise item
        text, ids = item if isinstance(item, tuple) else (item, None)
        ids = list(ids) if ids is not None else self.tokenizer.encode(text, add_special_tokens=False)
        return TokenGeneration(ids + [self.eos], text, "stop", len(prompt_ids))

    async def context_window(self):
        return 8192

    async def aclose(self):
        pass


def run_agent(engine, tools=None, **cfg):
    config = AgentConfig(max_steps=cfg.pop("max_steps", 4), max_attempts=cfg.pop("attempts", 1),
                         backoff_base=0.0, current_date="2026-11-30",
                         sampling=SamplingParams(max_tokens=64), **cfg)
    recorder = TokenRecorder(engine)
    agent = ResearchAgent(recorder, tools or ScriptedTools("Dune is by Frank Herbert."), config)
    result = asyncio.run(agent.run("Who wrote Dune?"))
    return result, recorder.record(result.messages)


def sampled(rec, k):
    b, e = rec.boundaries[k].token_len, rec.generated_ends[k]
    return rec.input_ids[b:e]


def test_canonical_turns_equal_the_template_rendering(tok):
    script = [call("search", query=["Dune author"]), call("visit", url=["https://a.org"], goal="g"),
              answer("Frank Herbert")]
    result, rec = run_agent(FakeEngine(tok, script))
    assert result.termination == "answered"
    # ids sampled like their own tokenisation: identical to rendering the final conversation
    full = rollout_record(result.messages, tok).input_ids
    n = len(rec.input_ids)
    assert full[:n] == rec.input_ids and tok.decode(full[n:]) == "\n"  # the template's tail
    assert [b.tool_name for b in rec.boundaries] == ["search", "visit", None]
    assert rec.message_indices == [2, 4, 6]
    for k, text in enumerate(script):
        assert tok.decode(sampled(rec, k), skip_special_tokens=False) == text + "<|im_end|>"
    # the loss mask covers exactly the sampled ids
    assert sum(rec.loss_mask) == sum(len(sampled(rec, k)) for k in range(3))


def test_sampled_ids_are_kept_even_when_they_are_not_the_texts_tokenisation(tok):
    text = answer("Paris")
    odd = [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]  # char by char
    assert odd != tok.encode(text, add_special_tokens=False)
    engine = FakeEngine(tok, [call("search", query=["x"]), (text, odd)])
    result, rec = run_agent(engine)
    assert sampled(rec, 1)[:-1] == odd  # exactly what was sampled, not a re-tokenisation
    full = rollout_record(result.messages, tok).input_ids
    assert rec.input_ids != full[: len(rec.input_ids)]
    # and the next prompt the policy saw is a prefix of the record
    assert rec.input_ids[: len(engine.prompts[1])] == engine.prompts[1]


def test_every_prompt_extends_the_previous_sequence(tok):
    engine = FakeEngine(tok, [call("search", query=["a"]), call("search", query=["b"]),
                              answer("x")])
    _, rec = run_agent(engine)
    for k, prompt in enumerate(engine.prompts):
        assert rec.input_ids[: len(prompt)] == prompt
        assert rec.boundaries[k].token_len == len(prompt)


def test_robust_retry_keeps_only_the_accepted_sample(tok):
    bad = "<think>\nhmm\n</think>\nno tool and no answer"
    engine = FakeEngine(tok, [bad, call("search", query=["a"]), answer("x")])
    result, rec = run_agent(engine, attempts=3)
    assert result.termination == "answered"
    assert len(rec.turns) == 2  # the malformed sample was discarded by the retry
    assert engine.prompts[0] == engine.prompts[1]  # the retry saw the same prompt
    assert "no tool and no answer" not in tok.decode(rec.input_ids)


def test_deterministic_mode_trains_on_the_malformed_turn(tok):
    bad = "<think>\nhmm\n</think>\nno tool and no answer"
    engine = FakeEngine(tok, [bad, answer("x")])
    result, rec = run_agent(engine, attempts=1)
    assert len(rec.turns) == 2 and rec.turns[0] == bad
    assert result.parse_error_count == 1


def test_step_limit_notice_replaces_the_tool_response_in_the_record(tok):
    engine = FakeEngine(tok, [call("search", query=["a"]), answer("x")])
    result, rec = run_agent(engine, tools=ScriptedTools("TOOL-BODY-XYZ"), max_steps=1)
    assert result.termination == "answered_max_steps"
    text = tok.decode(rec.input_ids)
    assert STEP_LIMIT_MESSAGE in text and "TOOL-BODY-XYZ" not in text


def test_context_overflow_then_forced_answer_stays_exact(tok):
    overflow = LLMError("too long", context_overflow=True)
    engine = FakeEngine(tok, [call("search", query=["a"]), overflow, answer("x")])
    result, rec = run_agent(engine, tools=ScriptedTools("BODY-123"))
    assert result.termination == "answered_token_limit"
    assert len(rec.turns) == 2
    text = tok.decode(rec.input_ids)
    assert "BODY-123" not in text  # replaced by the context-limit notice
    assert rec.input_ids[: len(engine.prompts[-1])] == engine.prompts[-1]


def test_a_rewritten_history_is_refused(tok):
    engine = FakeEngine(tok, [call("search", query=["a"])])
    recorder = TokenRecorder(engine)
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    asyncio.run(recorder.generate(list(msgs), SamplingParams()))
    changed = [{"role": "system", "content": "OTHER"}, msgs[1],
               {"role": "assistant", "content": "t"}, {"role": "user", "content": "r"}]
    with pytest.raises(LLMError, match="rewrote"):
        asyncio.run(recorder.generate(changed, SamplingParams()))


def test_trim_to_text_drops_stop_string_tokens(tok):
    text = call("search", query=["a"])
    ids = tok.encode(text + "\n<tool_response>\nfake", add_special_tokens=False)
    trimmed = trim_to_text(ids, text, tok, frozenset())
    assert tok.decode(trimmed) == text
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert trim_to_text([*ids[:3], eos], "whatever", tok, frozenset({eos}))[-1] == eos


def test_template_parts_close_a_turn_with_the_templates_text(tok):
    parts = ChatTemplateParts(tok)
    assert parts.turn_close == "<|im_end|>\n"
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.decode(parts.closing([5, eos])) == "\n"
    assert tok.decode(parts.closing([5])) == "<|im_end|>\n"
    cont = tok.decode(parts.continuation([{"role": "user", "content": "hi"}]))
    assert cont == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_rollouts_group_and_seed_each_trajectory(tok):
    engine = FakeEngine(tok, [call("search", query=["a"]), answer("x")])
    seeds = []
    orig = engine.generate_tokens

    async def spy(prompt_ids, params, *, timeout=None):
        seeds.append(params.seed)
        return await orig(prompt_ids, params, timeout=timeout)

    engine.generate_tokens = spy
    cfg = RolloutConfig.from_rl(None, n=3, max_turns=3, max_turns_jitter=0, concurrency=2,
                        current_date="2026-11-30")
    out = asyncio.run(run_rollouts([("q1", "a1"), ("q2", "a2")], engine, ScriptedTools("b"), cfg))
    assert [(r.group, r.index) for r in out] == [(g, i) for g in range(2) for i in range(3)]
    assert all(r.tokens is not None and r.ground_truth == f"a{r.group + 1}" for r in out)
    assert len(set(seeds)) > 3  # every trajectory samples with its own seed
    assert RolloutConfig.from_rl(None, mode="robust").agent_config(5).max_attempts == 4
    assert RolloutConfig.from_rl().agent_config(5).max_attempts == 1
    limits = {RolloutConfig.from_rl(None, max_turns=200).turn_limit(s) for s in range(40)}
    assert min(limits) >= 195 and max(limits) <= 204 and len(limits) > 1


# ---------------------------------------------------------------- server engines over HTTP


class _TokenServer:
    """A local server speaking vLLM's /v1/completions and SGLang's /generate with token ids."""

    def __init__(self, tokenizer, reply_text: str, logprobs=None):
        self.requests: list[tuple[str, dict]] = []
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        ids = tokenizer.encode(reply_text, add_special_tokens=False) + [eos]
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, body):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send({"data": [{"id": "policy"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                if self.path == "/v1/completions" and "prompt_logprobs" in body:
                    lps = logprobs(body["prompt"])
                    rows = [None] + [{str(t): {"logprob": lp, "rank": 1}}
                                     for t, lp in zip(body["prompt"][1:], lps[1:], strict=True)]
                    self._send({"choices": [{"text": "", "prompt_logprobs": rows}]})
                elif self.path == "/generate" and body.get("return_logprob"):
                    lps = logprobs(body["input_ids"])
                    rows = [[lp, t, None] for t, lp in zip(body["input_ids"], lps, strict=True)]
                    self._send({"text": "", "meta_info": {"input_token_logprobs": rows}})
                elif self.path == "/v1/completions":
                    self._send({"choices": [{"text": reply_text, "token_ids": ids,
                                             "finish_reason": "stop"}],
                                "usage": {"prompt_tokens": len(body["prompt"])}})
                elif self.path == "/generate":
                    self._send({"text": reply_text, "output_ids": ids,
                                "meta_info": {"finish_reason": {"type": "stop"}}})
                else:
                    self._send({"success": True})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_server_engine_sends_token_ids_and_returns_sampled_ids(tok, flavor):
    text = answer("Frank Herbert")
    server = _TokenServer(tok, text)
    try:
        engine = ServerEngine(server.url + "/v1", tok, flavor=flavor)
        result, rec = run_agent(engine)
        assert result.termination == "answered" and result.prediction == "Frank Herbert"
        path, body = server.requests[-1]
        if flavor == "vllm":
            assert path == "/v1/completions" and body["model"] == "policy"
            assert body["prompt"] == rec.input_ids[: rec.prompt_len]
            assert body["return_token_ids"] is True
        else:
            assert path == "/generate"
            assert body["input_ids"] == rec.input_ids[: rec.prompt_len]
            assert body["sampling_params"]["max_new_tokens"] == 64
        assert tok.decode(sampled(rec, 0)) == text + "<|im_end|>"
        if flavor == "sglang":
            asyncio.run(engine.reload_weights("/ckpt"))
            assert server.requests[-1] == ("/update_weights_from_disk", {"model_path": "/ckpt"})
        else:
            with pytest.raises(LLMError, match="SGLang"):
                asyncio.run(engine.reload_weights("/ckpt"))
        asyncio.run(engine.aclose())
    finally:
        server.close()


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_ig_from_the_servers_prompt_logprobs_equals_the_trainers(tok, tiny_policy, flavor):
    """--ig-source engine: IG from a server's prompt log-probs (vLLM and SGLang formats) equals
    the trainer's KV-cache IG on the same trajectory."""
    from drvenus.train.rl.ig import IGConfig, score_trajectory, score_trajectory_remote

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_policy).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)

    def logprobs(ids):
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        return [None] + [float(logp[i - 1, t]) for i, t in enumerate(ids) if i > 0]

    script = [call("search", query=["dune"]), call("visit", url=["https://a.org"], goal="g"),
              call("visit", url=["https://b.org"], goal="g"), answer("Frank Herbert")]
    _, rec = run_agent(FakeEngine(tok, script))
    server = _TokenServer(tok, "", logprobs)
    try:
        engine = ServerEngine(server.url, tok, flavor=flavor, model="policy")
        cfg = IGConfig.from_rl(ig_tool_filter="")
        remote = asyncio.run(score_trajectory_remote(engine.prompt_logprobs, tok, rec.input_ids,
                                                     rec.boundaries, "Frank Herbert", cfg))
        asyncio.run(engine.aclose())
    finally:
        server.close()
    local = score_trajectory(model, tok, rec.input_ids, rec.boundaries, "Frank Herbert", cfg)
    assert len(remote.info_gains) == 3 and all(g is not None for g in remote.info_gains)
    for a, b in zip(remote.info_gains, local.info_gains, strict=True):
        assert abs(a - b) <= 1e-4
    with pytest.raises(ValueError, match="temperature"):
        asyncio.run(score_trajectory_remote(engine.prompt_logprobs, tok, rec.input_ids,
                                            rec.boundaries, "x", IGConfig.from_rl(temperature=0.7)))


# ---------------------------------------------------------------- the real embedded model


@pytest.mark.slow
def test_embedded_smollm2_rollout_is_token_exact(embedded_gguf, tok):
    """SmolLM2-135M loaded through transformers samples a real trajectory with the built-in
    tools: every turn's recorded ids decode to its text, and every prompt the model was given
    is a prefix of the record."""
    from drvenus.tools.toolbox import offline_toolbox
    from drvenus.train.rl.engine import HFEngine
    from drvenus.train.rl.trainer import load_policy

    model, tokenizer = load_policy(embedded_gguf, "cpu")
    engine = HFEngine.from_policy(model, tokenizer, slots=2)
    prompts: list[list[int]] = []
    orig = engine.generate_tokens

    async def spy(prompt_ids, params, *, timeout=None):
        prompts.append(list(prompt_ids))
        return await orig(prompt_ids, params, timeout=timeout)

    engine.generate_tokens = spy
    cfg = RolloutConfig.from_rl(None, n=2, max_turns=2, max_turns_jitter=0, max_new_tokens=40, concurrency=2,
                        current_date="2026-11-30", seed=7)
    out = asyncio.run(run_rollouts([("Who wrote the novel Dune?", "Frank Herbert")], engine,
                                   offline_toolbox(top_k=3), cfg))
    assert len(out) == 2 and len(prompts) >= 3
    assert max(len(r.tokens.turns) for r in out if r.tokens) >= 2
    for r in out:
        rec = r.tokens
        assert rec is not None
        for k, text in enumerate(rec.turns):
            got = tokenizer.decode(sampled(rec, k), skip_special_tokens=False)
            assert got.removesuffix("<|im_end|>") == text
        assert any(rec.input_ids[: len(p)] == p for p in prompts)
    assert STOP_STRINGS  # the agent asked for the protocol's stop strings
