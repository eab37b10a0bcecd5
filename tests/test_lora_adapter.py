"""LoRA adapters in llama.cpp's GGUF adapter format: the writer (``drvenus models
export-adapter``) on a tiny synthetic adapter, the loader's checks and settings, and (slow) the
proof on the real embedded weights that llama.cpp with the exported adapter computes what
transformers computes with the peft adapter."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch", reason="needs the train extra")
gguf = pytest.importorskip("gguf", reason="needs the train extra")
pytest.importorskip("safetensors")

from drvenus.config import load_settings  # noqa: E402
from drvenus.llm.base import LLMError  # noqa: E402
from drvenus.train import export  # noqa: E402
from drvenus.train.export import ExportError, export_lora_gguf, lora_tensor_name  # noqa: E402

HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 16, 24, 4, 2, 2
KV = HIDDEN // HEADS * KV_HEADS
# HF module -> (in, out) of its weight
SHAPES = {
    "self_attn.q_proj": (HIDDEN, HIDDEN),
    "self_attn.k_proj": (HIDDEN, KV),
    "self_attn.v_proj": (HIDDEN, KV),
    "self_attn.o_proj": (HIDDEN, HIDDEN),
    "mlp.gate_proj": (HIDDEN, FFN),
    "mlp.up_proj": (HIDDEN, FFN),
    "mlp.down_proj": (FFN, HIDDEN),
}


def tiny_base(path: Path, arch: str = "llama", shapes: dict | None = None) -> Path:
    """A GGUF base model header with the tensors a tiny Llama has (zeros)."""
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_embedding_length(HIDDEN)
    for layer in range(LAYERS):
        for module, (n_in, n_out) in (shapes or SHAPES).items():
            name = lora_tensor_name(layer, module)
            writer.add_tensor(name, np.zeros((n_out, n_in), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_adapter(folder: Path, r: int = 4, alpha: float = 8, seed: int = 0, **config) -> dict:
    """A peft-style adapter folder with random A and B on every projection; its tensors."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(LAYERS):
        for module, (n_in, n_out) in SHAPES.items():
            key = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(r, n_in, generator=g)
            tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, r, generator=g)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "base_model_name_or_path": "x",
           "target_modules": ["q_proj"], "use_dora": False, "modules_to_save": None, **config}
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return tensors


def read(path: Path) -> tuple[dict, dict]:
    reader = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return fields, {t.name: t for t in reader.tensors}


def permute(w, heads):
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def test_module_names_map_to_llama_cpp_tensors():
    assert lora_tensor_name(0, "self_attn.q_proj") == "blk.0.attn_q.weight"
    assert lora_tensor_name(7, "self_attn.o_proj") == "blk.7.attn_output.weight"
    assert lora_tensor_name(29, "mlp.down_proj") == "blk.29.ffn_down.weight"
    with pytest.raises(ExportError, match="only self_attn.q_proj"):
        lora_tensor_name(0, "mlp.experts")


def test_adapter_gguf_names_shapes_metadata_and_q_k_permutation(tmp_path):
    base = tiny_base(tmp_path / "base.gguf")
    tensors = tiny_adapter(tmp_path / "adapter")
    out = export_lora_gguf(tmp_path / "adapter", tmp_path / "a.gguf", base_gguf=base)
    fields, written = read(out)
    assert fields["general.architecture"] == "llama"
    assert fields["general.type"] == "adapter"
    assert fields["adapter.type"] == "lora"
    assert fields["adapter.lora.alpha"] == pytest.approx(8.0)
    assert len(written) == 2 * LAYERS * len(SHAPES)
    for layer in range(LAYERS):
        for module, (n_in, n_out) in SHAPES.items():
            name = lora_tensor_name(layer, module)
            a, b = written[f"{name}.lora_a"], written[f"{name}.lora_b"]
            # GGUF shapes (ne): lora_a [in, r], lora_b [r, out], as llama.cpp checks them
            assert list(a.shape) == [n_in, 4] and list(b.shape) == [4, n_out]
            assert a.tensor_type == gguf.GGMLQuantizationType.F16
            key = f"base_model.model.model.layers.{layer}.{module}"
            want_a = tensors[f"{key}.lora_A.weight"].numpy()
            want_b = tensors[f"{key}.lora_B.weight"].numpy()
            if module == "self_attn.q_proj":
                want_b = permute(want_b, HEADS)
            elif module == "self_attn.k_proj":
                want_b = permute(want_b, KV_HEADS)
            np.testing.assert_allclose(np.asarray(a.data, np.float32), want_a, atol=2e-3)
            np.testing.assert_allclose(np.asarray(b.data, np.float32), want_b, atol=2e-3)
    # the adapted q weight is the permuted delta: permute(B) @ A == permute(B @ A)
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    delta = (tensors[f"{key}.lora_B.weight"] @ tensors[f"{key}.lora_A.weight"]).numpy()
    b = np.asarray(written["blk.0.attn_q.weight.lora_b"].data, np.float32)
    a = np.asarray(written["blk.0.attn_q.weight.lora_a"].data, np.float32)
    np.testing.assert_allclose(b @ a, permute(delta, HEADS), atol=5e-2)


def test_f32_rslora_and_alpha_pattern_keep_peft_scaling(tmp_path):
    base = tiny_base(tmp_path / "base.gguf")
    tensors = tiny_adapter(tmp_path / "rs", r=4, alpha=8, use_rslora=True)
    fields, written = read(export_lora_gguf(tmp_path / "rs", tmp_path / "rs.gguf",
                                            base_gguf=base, outtype="f32"))
    # llama.cpp scales by alpha / r; peft's rsLoRA by alpha / sqrt(r)
    assert fields["adapter.lora.alpha"] / 4 == pytest.approx(8 / math.sqrt(4))
    assert written["blk.0.attn_v.weight.lora_a"].tensor_type == gguf.GGMLQuantizationType.F32

    tensors = tiny_adapter(tmp_path / "pat", r=4, alpha=8, alpha_pattern={"v_proj": 2})
    fields, written = read(export_lora_gguf(tmp_path / "pat", tmp_path / "pat.gguf",
                                            base_gguf=base, outtype="f32"))
    alpha = fields["adapter.lora.alpha"]
    b = np.asarray(written["blk.1.attn_v.weight.lora_b"].data)
    want = tensors["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"].numpy()
    np.testing.assert_allclose(b * alpha / 4, want * 2 / 4, rtol=1e-6)  # peft's 2/r
    b = np.asarray(written["blk.1.ffn_up.weight.lora_b"].data)
    want = tensors["base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"].numpy()
    np.testing.assert_allclose(b * alpha / 4, want * 8 / 4, rtol=1e-6)


def test_what_llama_cpp_cannot_hold_is_refused_in_one_line(tmp_path):
    base = tiny_base(tmp_path / "base.gguf")
    tiny_adapter(tmp_path / "dora", use_dora=True)
    with pytest.raises(ExportError, match="DoRA"):
        export_lora_gguf(tmp_path / "dora", tmp_path / "x.gguf", base_gguf=base)

    from safetensors.torch import load_file, save_file

    tiny_adapter(tmp_path / "head")
    weights = tmp_path / "head" / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    tensors["base_model.model.lm_head.lora_A.weight"] = torch.zeros(4, HIDDEN)
    save_file(tensors, str(weights))
    with pytest.raises(ExportError, match="lm_head"):
        export_lora_gguf(tmp_path / "head", tmp_path / "x.gguf", base_gguf=base)

    other = tiny_base(tmp_path / "other.gguf", shapes={**SHAPES, "mlp.up_proj": (HIDDEN, 32)})
    tiny_adapter(tmp_path / "ok")
    with pytest.raises(ExportError, match="another model"):
        export_lora_gguf(tmp_path / "ok", tmp_path / "x.gguf", base_gguf=other)
    qwen = tiny_base(tmp_path / "qwen.gguf", arch="qwen2")
    with pytest.raises(ExportError, match="only llama"):
        export_lora_gguf(tmp_path / "ok", tmp_path / "x.gguf", base_gguf=qwen)
    with pytest.raises(ExportError, match="f16 or f32|one of"):
        export_lora_gguf(tmp_path / "ok", tmp_path / "x.gguf", base_gguf=base, outtype="q8_0")
    with pytest.raises(ExportError, match="not a LoRA adapter folder"):
        export_lora_gguf(tmp_path, tmp_path / "x.gguf", base_gguf=base)
    assert not (tmp_path / "x.gguf").exists()


def test_base_from_a_checkpoint_config(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS}))
    tiny_adapter(tmp_path / "adapter", base_model_name_or_path=str(folder))
    fields, written = read(export_lora_gguf(tmp_path / "adapter", tmp_path / "a.gguf"))
    assert fields["general.type"] == "adapter" and len(written) == 2 * LAYERS * len(SHAPES)


def test_adapter_settings_and_checks(tmp_path, monkeypatch):
    from drvenus.llm import embedded
    from drvenus.llm.factory import make_model
    from drvenus.llm.gguf import read_gguf_info
    from drvenus.llm.llamacpp import check_adapter
    from drvenus.stack import adapter_file

    shipped = adapter_file(load_settings())  # the trained adapter ships, and fits the base
    assert shipped is not None and shipped.parent == embedded.ADAPTERS_DIR
    assert shipped.name == embedded.EMBEDDED_ADAPTER and shipped.stat().st_size < 20_000_000
    meta = read_gguf_info(shipped).metadata
    assert meta["general.type"] == "adapter" and meta["adapter.type"] == "lora"
    monkeypatch.setattr(embedded, "EMBEDDED_ADAPTER", "shipped.gguf")
    monkeypatch.setattr(embedded, "ADAPTERS_DIR", tmp_path)
    with pytest.raises(LLMError, match="--no-adapter"):
        adapter_file(load_settings())  # named but missing: a broken install
    (tmp_path / "shipped.gguf").write_bytes(b"")
    assert adapter_file(load_settings()) == tmp_path / "shipped.gguf"
    assert adapter_file(load_settings(no_adapter=True)) is None
    monkeypatch.setenv("DRVENUS_NO_ADAPTER", "1")
    assert adapter_file(load_settings()) is None
    monkeypatch.delenv("DRVENUS_NO_ADAPTER")
    # the shipped adapter is the embedded model's only; an explicit one goes on any GGUF
    assert adapter_file(load_settings(model_path=tmp_path / "m.gguf")) is None
    monkeypatch.setenv("DRVENUS_ADAPTER", str(tmp_path / "mine.gguf"))
    assert adapter_file(load_settings(model_path=tmp_path / "m.gguf")) == tmp_path / "mine.gguf"
    with pytest.raises(ValueError, match="not both"):
        adapter_file(load_settings(no_adapter=True))
    with pytest.raises(LLMError, match="not to a model server"):
        make_model(base_url="http://127.0.0.1:9/v1", adapter=tmp_path / "mine.gguf")

    base = read_gguf_info(tiny_base(tmp_path / "base.gguf"))
    with pytest.raises(LLMError, match="not a LoRA adapter GGUF"):
        check_adapter(base.path, base)
    with pytest.raises(LLMError, match="adapter: model file not found"):
        check_adapter(tmp_path / "none.gguf", base)
    tiny_adapter(tmp_path / "adapter")
    out = export_lora_gguf(tmp_path / "adapter", tmp_path / "a.gguf", base_gguf=base.path)
    assert check_adapter(out, base) == out
    qwen = read_gguf_info(tiny_base(tmp_path / "qwen.gguf", arch="qwen2"))
    with pytest.raises(LLMError, match="for a llama model"):
        check_adapter(out, qwen)


def test_cli_export_adapter_and_models_info(tmp_path):
    from typer.testing import CliRunner

    from drvenus.cli import app

    base = tiny_base(tmp_path / "base.gguf")
    tiny_adapter(tmp_path / "adapter")
    runner = CliRunner()
    done = runner.invoke(app, ["models", "export-adapter", str(tmp_path / "adapter"), "-o",
                               str(tmp_path / "a.gguf"), "--base", str(base)])
    assert done.exit_code == 0, done.output
    assert "wrote" in done.output and (tmp_path / "a.gguf").is_file()
    done = runner.invoke(app, ["models", "info", "--adapter", str(tmp_path / "a.gguf")])
    assert done.exit_code == 0, done.output
    assert "embedded SmolLM2" in done.output and "alpha 8" in done.output
    done = runner.invoke(app, ["models", "info", "--no-adapter"])
    assert "none (--no-adapter)" in done.output
    done = runner.invoke(app, ["models", "info"])  # the shipped adapter, by default
    assert done.exit_code == 0 and "smollm2-135m-drvenus-igpo.gguf" in done.output
    assert "alpha 32" in done.output and "model card" in done.output
    done = runner.invoke(app, ["models", "export-adapter", str(tmp_path), "-o", "x.gguf"])
    assert done.exit_code != 0 and "no adapter_config.json" in done.output


# ---------------------------------------------------------------- the proof on the real weights
PROMPTS = ("def fibonacci(n):", "Once upon a time, there was a", "The three primary colors are")
NEW_TOKENS, TOP = 6, 40


def _agree(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.fixture(scope="module")
def real_adapter(embedded_gguf, tmp_path_factory):
    """A fresh r=8 LoRA on every projection of the embedded model (loaded by transformers from
    its GGUF), with random non-zero B so that it moves the outputs; saved, and exported with
    and (as a control) without the q/k permutation."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drvenus.llm.hf import from_pretrained

    folder = tmp_path_factory.mktemp("real-lora")
    model = from_pretrained(AutoModelForCausalLM, embedded_gguf, dtype=torch.float32).eval()
    tokenizer = from_pretrained(AutoTokenizer, embedded_gguf)
    config = peft.LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM", target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    torch.manual_seed(0)  # lora_A's init
    lora = peft.get_peft_model(model, config).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.08)
    lora.save_pretrained(folder / "adapter")
    # the adapter names the GGUF it was made on, which the export then checks it against
    config = json.loads((folder / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(embedded_gguf)
    gguf_file = export_lora_gguf(folder / "adapter", folder / "adapter.gguf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(export, "_permute_rows", lambda w, heads: w)
        unpermuted = export_lora_gguf(folder / "adapter", folder / "unpermuted.gguf",
                                      base_gguf=embedded_gguf)
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    return {"ids": ids, "model": lora, "adapter": gguf_file, "unpermuted": unpermuted}


def _llama_cpp(embedded_gguf, ids, adapter):
    """llama.cpp's greedy continuations and first-token top log-probs, through drvenus's own
    in-process runtime with the adapter (raw token prompts: no chat template in between)."""
    from drvenus.llm.llamacpp import LlamaCppServer

    server = LlamaCppServer(embedded_gguf, window=512, n_threads=1, adapter=adapter)
    found = []
    try:
        for prompt in ids:
            done = server._server.handle_completions({
                "prompt": prompt, "n_predict": NEW_TOKENS, "temperature": 0, "n_probs": TOP,
                "cache_prompt": False})
            steps = done["choices"][0]["logprobs"]["content"]
            found.append(([s["id"] for s in steps],
                          {t["id"]: t["logprob"] for t in steps[0]["top_logprobs"]}))
    finally:
        server.close()
    return found


def _transformers(model, prompt: list[int], continuation: list[int]) -> Any:
    """transformers' next-token log-probs after the prompt and each token of a continuation."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + continuation])).logits[0, len(prompt) - 1:]
    return torch.log_softmax(logits.double(), -1).numpy()


@pytest.mark.slow
def test_llama_cpp_with_the_exported_adapter_matches_transformers(embedded_gguf, real_adapter):
    ids, model = real_adapter["ids"], real_adapter["model"]
    base = _llama_cpp(embedded_gguf, ids, None)
    lora = _llama_cpp(embedded_gguf, ids, real_adapter["adapter"])
    unpermuted = _llama_cpp(embedded_gguf, ids, real_adapter["unpermuted"])
    changed = same = 0
    regrets, errors, control_errors = [], [], []
    for j, prompt in enumerate(PROMPTS):
        tokens = lora[j][0]
        changed += tokens != base[j][0]
        hf_lora = _transformers(model, ids[j], tokens)
        with model.disable_adapter():
            hf_base = _transformers(model, ids[j], [])[0]
        # each token llama.cpp picks greedily with the adapter is transformers' best with the
        # LoRA, or within quantisation noise of it (a near tie)
        for step, token in enumerate(tokens):
            same += token == int(hf_lora[step].argmax())
            regrets.append(float(hf_lora[step].max() - hf_lora[step][token]))
        # the adapter's shift of the next-token log-probs (on the tokens in both of llama.cpp's
        # top lists) is transformers' shift, up to quantisation noise
        common = [t for t in base[j][1] if t in lora[j][1]]
        assert len(common) >= 10
        shift_cpp = np.array([lora[j][1][t] - base[j][1][t] for t in common])
        shift_hf = np.array([hf_lora[0][t] - hf_base[t] for t in common])
        corr = np.corrcoef(shift_cpp, shift_hf)[0, 1]
        miss = np.abs(shift_cpp - shift_hf).mean()
        print(f"{prompt!r}: changed by the adapter {tokens != base[j][0]}; shift on "
              f"{len(common)} tokens: corr {corr:.3f}, mean |shift| transformers "
              f"{np.abs(shift_hf).mean():.3f} llama.cpp {np.abs(shift_cpp).mean():.3f}, "
              f"mean |difference| {miss:.3f}")
        assert corr > 0.9, prompt
        assert miss < 0.5 * np.abs(shift_hf).mean(), prompt
        # without the q/k permutation llama.cpp computes something else
        common = [t for t in common if t in unpermuted[j][1]]
        errors.append(np.mean([abs(lora[j][1][t] - hf_lora[0][t]) for t in common]))
        control_errors.append(np.mean([abs(unpermuted[j][1][t] - hf_lora[0][t])
                                       for t in common]))
    total = len(regrets)
    print(f"greedy tokens transformers' best too: {same}/{total}, worst regret "
          f"{max(regrets):.3f} nats; mean |log-prob - transformers'|: permuted "
          f"{np.mean(errors):.3f}, unpermuted {np.mean(control_errors):.3f}")
    assert changed >= 1  # the adapter moved the greedy output somewhere
    assert same >= 0.75 * total and max(regrets) < 0.75, regrets
    assert np.mean(control_errors) > 1.5 * np.mean(errors), (errors, control_errors)


@pytest.mark.slow
def test_the_gguf_base_holds_q_and_k_permuted(embedded_gguf, real_adapter):
    """Why lora_B of q_proj/k_proj is permuted: the base GGUF's attn_q/attn_k are Hugging
    Face's q_proj/k_proj with their rows permuted (transformers un-permutes them on load)."""
    reader = gguf.GGUFReader(embedded_gguf)
    tensors = {t.name: t for t in reader.tensors}
    base = real_adapter["model"].get_base_model()
    attention = base.model.layers[0].self_attn
    heads, kv_heads = base.config.num_attention_heads, base.config.num_key_value_heads
    for name, weight, n in (("attn_q", attention.q_proj, heads),
                            ("attn_k", attention.k_proj, kv_heads)):
        t = tensors[f"blk.0.{name}.weight"]
        stored = gguf.quants.dequantize(t.data, t.tensor_type)
        hf = weight.base_layer.weight.detach().numpy()
        assert np.abs(stored - hf).max() > 1.0  # not the same layout ...
        np.testing.assert_array_equal(stored, permute(hf, n))  # ... but permuted


def test_the_shipped_adapter_is_applied_by_default_and_no_adapter_turns_it_off(
        embedded_gguf, tmp_path, monkeypatch):
    """The runtime path: an adapter for the embedded model (random, made from its GGUF's
    tensor shapes) changes what the embedded model says; shipped as EMBEDDED_ADAPTER it is
    applied by default, and --no-adapter (DRVENUS_NO_ADAPTER) gives the bare model back."""
    import asyncio

    from safetensors.torch import save_file

    from drvenus.llm import SamplingParams
    from drvenus.llm import embedded as emb
    from drvenus.protocol import build_system_prompt, initial_messages
    from drvenus.stack import build_model

    reader = gguf.GGUFReader(embedded_gguf)
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(int(reader.fields["llama.block_count"].contents())):
        for module in ("self_attn.v_proj", "self_attn.o_proj", "mlp.down_proj"):
            n_in, n_out = shapes[lora_tensor_name(layer, module)]
            key = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(8, n_in, generator=g) / n_in ** 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, 8, generator=g) * 0.1
    folder = tmp_path / "adapter"
    folder.mkdir()
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 8, "lora_alpha": 8, "base_model_name_or_path": "x"}))
    export_lora_gguf(folder, tmp_path / "shipped.gguf", base_gguf=embedded_gguf)
    monkeypatch.setattr(emb, "EMBEDDED_ADAPTER", "shipped.gguf")
    monkeypatch.setattr(emb, "ADAPTERS_DIR", tmp_path)
    monkeypatch.setenv("DRVENUS_N_CTX", "1024")
    messages = initial_messages("Who wrote the novel Dracula?", build_system_prompt("2025-01-01"))
    params = SamplingParams(max_tokens=8, seed=1, temperature=0.0)

    def say(**settings) -> str:
        model = build_model(load_settings(**settings))
        try:
            return asyncio.run(model.generate(messages, params)).text
        finally:
            asyncio.run(model.aclose())

    shipped, bare = say(), say(no_adapter=True)
    assert shipped != bare, shipped
    assert say(adapter=tmp_path / "shipped.gguf") == shipped
