"""The SFT loss from the final hidden states, a chunk of trained tokens at a time
(``loss_chunk_tokens``, :func:`drvenus.train.sft.loss.chunked_token_losses`), against the loss
from the full logits (``loss_chunk_tokens: 0``, :func:`~drvenus.train.sft.loss.token_losses`).

Equal losses and gradients (the LM head, LoRA adapters, an earlier layer, the hidden states) for
any mask and chunk size (hypothesis), for plain, padded and packed rows, a micro batch with no
trained token, LoRA on the LM head, the models whose forward transforms the logits; the same
first losses from ``drvenus sft``; and memory, counted without timing anything: the chunked
path keeps no ``[T, V]`` tensor for the backward, the full-logits path does.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs the train extra")
transformers = pytest.importorskip("transformers", reason="needs the train extra")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from drvenus.cli import app  # noqa: E402
from drvenus.train.sft import loss as sft_loss  # noqa: E402
from drvenus.train.sft.config import LOSS_CHUNK_TOKENS, SFTConfig, SFTConfigError  # noqa: E402
from drvenus.train.sft.data import Example, SFTCollator  # noqa: E402
from drvenus.train.sft.loss import (  # noqa: E402
    aggregate,
    causal_lm,
    chunked_token_losses,
    count_items,
    forward_hidden,
    token_losses,
)
from drvenus.train.sft.tokenize import IGNORE_INDEX  # noqa: E402
from drvenus.train.sft.trainer import _trainer_class, training_arguments  # noqa: E402

runner = CliRunner()
VOCAB = 211  # odd, so nothing lines up with a chunk by accident


def _llama(tie: bool = True, vocab: int = VOCAB, hidden: int = 32, heads: int = 4) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=tie, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


# --------------------------------------------------------------------------- the function


def _segments(draw_flags: list[bool], pad: int) -> list[int]:
    """Row ids of one sequence: a new row where the flag is set, -1 on ``pad`` last tokens."""
    rows, row = [], -1
    for i, new in enumerate(draw_flags):
        row += 1 if (new or i == 0) else 0
        rows.append(row)
    return rows[:len(rows) - pad] + [-1] * pad if pad else rows


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_chunked_losses_and_gradients_equal_the_full_logits_for_any_mask(data):
    """Hidden states [B, T, H] and an LM head (soft-capped or not), in float64: the chunked
    per-token losses, both aggregations and the gradients (hidden states, head weight) equal
    those of the full logits, for any trained mask, packed rows, padding and chunk size; the
    head only ever sees a chunk of trained positions, once forward and once in the backward."""
    batch, width = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 24))
    chunk = data.draw(st.integers(1, 30))
    trained = data.draw(st.lists(st.booleans(), min_size=batch * width, max_size=batch * width))
    cap = data.draw(st.sampled_from([None, 1.5]))
    mode = data.draw(st.sampled_from(sft_loss.AGGREGATIONS))
    packed = data.draw(st.booleans())
    torch.manual_seed(data.draw(st.integers(0, 2**16)))
    vocab, size = 37, 8
    linear = torch.nn.Linear(size, vocab, bias=False).double()
    calls: list[int] = []

    def head(h):
        calls.append(h.shape[0])
        logits = linear(h)
        return logits if cap is None else torch.tanh(logits / cap) * cap

    labels = torch.randint(0, vocab, (batch, width))
    labels[~torch.tensor(trained).view(batch, width)] = IGNORE_INDEX
    rows = None
    if packed:
        flags = data.draw(st.lists(st.booleans(), min_size=width, max_size=width))
        pad = data.draw(st.integers(0, width - 1))
        offsets = [0]
        seqs = []
        for _ in range(batch):
            ids = _segments(flags, pad)
            seqs.append([r + offsets[-1] if r >= 0 else -1 for r in ids])
            offsets.append(max(seqs[-1]) + 1)
        rows = torch.tensor(seqs)
        labels[rows < 0] = IGNORE_INDEX

    def run(chunked: bool):
        hidden = torch.randn(batch, width, size, dtype=torch.float64,
                             generator=torch.Generator().manual_seed(1), requires_grad=True)
        linear.zero_grad(set_to_none=True)
        calls.clear()
        if chunked:
            losses, mask = chunked_token_losses(hidden, labels, head, chunk)
        else:
            losses, mask = token_losses(head(hidden), labels)
        total, items = aggregate(losses, mask, rows, mode)
        total.backward()
        weight = linear.weight.grad if linear.weight.grad is not None else torch.zeros_like(
            linear.weight)
        return losses.detach(), mask, total.detach(), items, hidden.grad, weight, list(calls)

    full, ours = run(False), run(True)
    torch.testing.assert_close(ours[0], full[0], rtol=1e-12, atol=1e-12)
    assert torch.equal(ours[1], full[1]) and int(ours[3]) == int(full[3])
    torch.testing.assert_close(ours[2], full[2], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours[4], full[4], rtol=1e-10, atol=1e-12)  # the hidden states
    torch.testing.assert_close(ours[5], full[5], rtol=1e-10, atol=1e-12)  # the head's weight
    n = int((labels[:, 1:] != IGNORE_INDEX).sum())
    chunks = -(-n // chunk)
    sizes = [min(chunk, n - i * chunk) for i in range(chunks)]
    assert sorted(ours[6]) == sorted(sizes * 2)  # each chunk once forward, once in the backward


def test_no_graph_under_no_grad_and_bad_chunk():
    linear = torch.nn.Linear(8, 37, bias=False)
    hidden = torch.randn(2, 9, 8)
    labels = torch.randint(0, 37, (2, 9))
    with torch.no_grad():
        ours, _ = chunked_token_losses(hidden, labels, linear, 4)
        full, _ = token_losses(linear(hidden), labels)
    assert not ours.requires_grad
    torch.testing.assert_close(ours, full)
    with pytest.raises(ValueError, match="chunk_tokens 0"):
        chunked_token_losses(hidden, labels, linear, 0)


# --------------------------------------------------------------------------- the Trainer's loss


def _example(ids: list[int], mask: list[int], seq_lens: list[int] | None = None) -> Example:
    return Example(ids, mask, seq_lens or [len(ids)])


def _ids(n: int, start: int) -> list[int]:
    return [(start + 7 * i) % (VOCAB - 3) + 3 for i in range(n)]


BATCHES = {
    "plain": [_example(_ids(23, 5), [0] * 8 + [1] * 15)],
    "padded": [_example(_ids(23, 5), [0] * 8 + [1] * 15),
               _example(_ids(11, 40), [0] * 3 + [1] * 5 + [0] * 3)],
    "packed": [_example(_ids(9, 9) + _ids(14, 70) + _ids(6, 3),
                        [0, 0, 1, 1, 1, 0, 1, 1, 1] + [0] * 6 + [1] * 8 + [0, 1, 1, 1, 1, 0],
                        [9, 14, 6]),
               _example(_ids(12, 90), [0] * 6 + [1] * 6)],
    "a row with no assistant token": [_example(_ids(17, 2), [0] * 17),
                                      _example(_ids(10, 30), [0] * 4 + [1] * 6)],
    "no assistant token at all": [_example(_ids(17, 2), [0] * 17)],
}


def _trainer(model, mode: str, chunk: int | None, tmp_path: Path):
    config = SFTConfig(train="t", model="m", output=str(tmp_path / "out"), max_length=64,
                       global_batch_size=2, micro_batch_size=2).validate()
    args = training_arguments(config, 1, "fp32", has_val=False)
    return _trainer_class(mode, chunk_tokens=chunk)(model=model, args=args,
                                                    data_collator=SFTCollator(0))


def _step(model, batch, mode: str, chunk: int | None, tmp_path: Path, train: bool = True):
    """One micro batch's training loss (or evaluation loss) and the gradient of every trained
    parameter (zeros where none arrived)."""
    trainer = _trainer(model, mode, chunk, tmp_path)
    model.train(train)
    model.zero_grad(set_to_none=True)
    items = count_items(batch["labels"], batch["row_index"], mode) + 3  # other micro batches
    if not train:
        with torch.no_grad():
            return trainer.compute_loss(model, batch, num_items_in_batch=items), {}
    loss = trainer.compute_loss(model, batch, num_items_in_batch=items)
    loss.backward()
    assert trainer._chunk_tokens == (chunk or 0)  # no fallback to the full logits
    grads = {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p)
             for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


def _lora(model, targets: list[str]):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                  target_modules=targets, task_type="CAUSAL_LM"))
    torch.manual_seed(1)
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:  # B starts at zero, which would leave A without a gradient
            p.data.normal_(0, 0.2)
    return peft_model


MODELS = {
    "all weights, tied embeddings": lambda: _llama(tie=True),
    "LoRA": lambda: _lora(_llama(tie=False), ["q_proj", "down_proj"]),
    "LoRA on the LM head": lambda: _lora(_llama(tie=False), ["q_proj", "lm_head"]),
}


@pytest.mark.parametrize("mode", ["row-mean", "token-mean"])
@pytest.mark.parametrize("case", list(BATCHES))
@pytest.mark.parametrize("kind", list(MODELS))
def test_the_trainer_loss_and_gradients_equal_the_full_logits_path(tmp_path, kind, case, mode):
    model = MODELS[kind]()
    batch = SFTCollator(0)(BATCHES[case])
    full_loss, full = _step(model, batch, mode, 0, tmp_path)
    for chunk in (3, LOSS_CHUNK_TOKENS):  # several chunks, and one
        loss, ours = _step(model, batch, mode, chunk, tmp_path)
        torch.testing.assert_close(loss, full_loss, rtol=1e-5, atol=1e-7)
        assert ours.keys() == full.keys()
        for name in full:
            torch.testing.assert_close(ours[name], full[name], rtol=1e-4, atol=1e-6, msg=name)
    trained = {n for n, g in full.items() if g.abs().sum() > 0}
    if case == "no assistant token at all":
        assert float(full_loss) == 0.0 and not trained
        return
    early = "layers.0.self_attn.q_proj"
    assert any(early in n for n in trained)  # an earlier layer (its LoRA, or its weight)
    if kind == "LoRA on the LM head":
        assert any("lm_head.lora_A" in n for n in trained)
        assert any("lm_head.lora_B" in n for n in trained)
    else:  # the LM head's weight: tied to the embeddings, or LoRA's frozen base
        assert any("embed_tokens" in n for n in trained) == kind.startswith("all weights")
    eval_full, _ = _step(model, batch, mode, 0, tmp_path, train=False)
    eval_ours, _ = _step(model, batch, mode, 5, tmp_path, train=False)
    torch.testing.assert_close(eval_ours, eval_full, rtol=1e-5, atol=1e-7)


def test_the_chunks_run_under_the_forward_s_autocast_and_with_checkpointed_layers(tmp_path):
    """As accelerate wraps the forward in bf16 autocast: the hidden states are caught with that
    state and the LM head runs under it in the chunks (bf16 logits, as inside the forward);
    with gradient checkpointing on the layers the two paths still agree."""
    model = _lora(_llama(tie=False), ["q_proj", "lm_head"])
    model.enable_input_require_grads()
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # later 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # 4.x and early 5.x (5.17)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    batch = SFTCollator(0)(BATCHES["packed"])
    full_loss, full = _step(model, batch, "row-mean", 0, tmp_path)
    loss, ours = _step(model, batch, "row-mean", 3, tmp_path)
    torch.testing.assert_close(loss, full_loss, rtol=1e-5, atol=1e-7)
    for name in full:
        torch.testing.assert_close(ours[name], full[name], rtol=1e-4, atol=1e-6, msg=name)
    forward = model.forward
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(forward)
    inputs = {k: batch[k] for k in ("input_ids", "position_ids")}
    got = forward_hidden(model, inputs, causal_lm(model), check=True)
    assert not isinstance(got, str), got
    assert got[3] == ("cpu", torch.bfloat16, True) and got[0].logits.dtype == torch.bfloat16
    seen = []
    lm_head = causal_lm(model).get_output_embeddings()
    hook = lm_head.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    chunked_token_losses(got[1], batch["labels"], got[2], 4, got[3])[0].sum().backward()
    hook.remove()
    assert seen and set(seen) == {torch.bfloat16}  # forward and recomputation alike
    full_loss, _ = _step(model, batch, "row-mean", 0, tmp_path)
    loss, _ = _step(model, batch, "row-mean", 3, tmp_path)
    torch.testing.assert_close(loss, full_loss, rtol=1e-2, atol=1e-3)


def _tiny(kind: str, **kw) -> torch.nn.Module:
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config = getattr(transformers, f"{kind}Config")(**common, **kw)
    torch.manual_seed(0)
    return getattr(transformers, f"{kind}ForCausalLM")(config)


TRANSFORMS = {  # what these models' forwards do after the LM head, made large enough to matter
    "Gemma2": {"final_logit_softcapping": 0.05, "head_dim": 8},
    "Granite": {"logits_scaling": 0.125},
    "Cohere": {"logit_scale": 7.0},
}


@pytest.mark.parametrize("kind", list(TRANSFORMS))
def test_models_that_transform_their_logits(tmp_path, kind):
    model = _tiny(kind, **TRANSFORMS[kind])
    batch = SFTCollator(0)(BATCHES["packed"])
    inputs = {k: batch[k] for k in ("input_ids", "position_ids")}
    got = forward_hidden(model, inputs, causal_lm(model), check=True)
    assert not isinstance(got, str), got
    logits = model(**inputs).logits
    torch.testing.assert_close(got[2](got[1]), logits, rtol=1e-5, atol=1e-6)
    full_loss, full = _step(model, batch, "row-mean", 0, tmp_path)
    loss, ours = _step(model, batch, "row-mean", 4, tmp_path)
    torch.testing.assert_close(loss, full_loss, rtol=1e-5, atol=1e-7)
    for name in full:
        torch.testing.assert_close(ours[name], full[name], rtol=1e-4, atol=1e-6, msg=name)


def test_an_unknown_logit_transform_falls_back_to_the_full_logits(tmp_path, monkeypatch,
                                                                   caplog):
    """A model whose forward scales its logits in a way the table does not list: the first
    batch's check notices, the trainer warns once and computes the loss from the full logits."""
    model = _tiny("Granite", logits_scaling=0.125)
    batch = SFTCollator(0)(BATCHES["padded"])
    full_loss, full = _step(model, batch, "token-mean", 0, tmp_path)
    monkeypatch.setattr(sft_loss, "_LOGIT_SCALES", ())
    trainer = _trainer(model, "token-mean", 4, tmp_path)
    items = count_items(batch["labels"], batch["row_index"], "token-mean") + 3
    model.zero_grad(set_to_none=True)
    with caplog.at_level(logging.WARNING, logger="drvenus.train.sft.trainer"):
        loss = trainer.compute_loss(model, batch, num_items_in_batch=items)
        loss.backward()
        trainer.compute_loss(model, batch, num_items_in_batch=items)
    assert trainer._chunk_tokens == 0
    warned = [r.getMessage() for r in caplog.records if "full logits" in r.getMessage()]
    assert len(warned) == 1 and "differs from the model's logits" in warned[0]
    torch.testing.assert_close(loss.detach(), full_loss)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, full[name], msg=name)


# --------------------------------------------------------------------------- memory


def _saved_for_backward(model, batch, chunk: int | None, tmp_path: Path) -> list[tuple]:
    """(shape, bytes) of every tensor the forward and loss keep for the backward that is not a
    parameter (saved_tensors_hooks; inside a chunk, torch.utils.checkpoint keeps nothing)."""
    params = {p.data_ptr() for p in model.parameters()}
    saved: list[tuple] = []

    def pack(t):
        if t.data_ptr() not in params:
            saved.append((tuple(t.shape), t.numel() * t.element_size()))
        return t

    trainer = _trainer(model, "token-mean", chunk, tmp_path)
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = trainer.compute_loss(model, batch, num_items_in_batch=torch.tensor(1))
    loss.backward()
    assert trainer._chunk_tokens == (chunk or 0)
    return saved


def test_the_chunked_loss_keeps_no_logits_for_the_backward(tmp_path):
    """A 512-token row, vocabulary 4099 (so the logits [T, V] are 8x the next largest saved
    tensor): the full-logits path keeps [T, V] tensors (its fp32 log-probabilities) until the
    backward; the chunked path keeps none with the vocabulary as a dimension, whatever the
    chunk (its largest is the hidden states)."""
    vocab, width = 4099, 512
    model = _llama(tie=True, vocab=vocab, hidden=16, heads=2)
    ids = [(13 * i) % (vocab - 3) + 3 for i in range(width)]
    batch = SFTCollator(0)([_example(ids, [0] * 64 + [1] * (width - 64))])
    full = _saved_for_backward(model, batch, 0, tmp_path)
    logits_like = [s for s, _ in full if s and s[-1] == vocab]
    assert max(torch.Size(s).numel() for s in logits_like) >= (width - 1) * vocab
    for chunk in (64, 1000, LOSS_CHUNK_TOKENS):
        ours = _saved_for_backward(model, batch, chunk, tmp_path)
        assert [s for s, _ in ours if s and s[-1] == vocab] == []
        assert max(b for _, b in ours) < (width - 1) * vocab * 4 / 8
        assert sum(b for _, b in ours) < sum(b for _, b in full) / 4


# --------------------------------------------------------------------------- config and command


def test_the_option_and_its_default(tmp_path):
    base = dict(train="t", model="m", output=str(tmp_path))
    assert SFTConfig(**base).validate().loss_chunk_tokens == LOSS_CHUNK_TOKENS > 0
    assert SFTConfig(**base, loss_chunk_tokens=None).validate().loss_chunk_tokens is None
    with pytest.raises(SFTConfigError, match="--loss-chunk-tokens"):
        SFTConfig(**base, loss_chunk_tokens=-1).validate()


def _conversations(path: Path) -> Path:
    answers = ["Paris.", "It is Paris, the capital and largest city of France, on the Seine.",
               "Paris", "The answer is Paris; " * 6, "Lyon is not it; Paris is.", "Paris!"]
    with path.open("w", encoding="utf-8") as fh:
        for i, answer in enumerate(answers):
            messages = [{"role": "user", "content": f"Question {i}: the capital of France?"},
                        {"role": "assistant", "content": answer}]
            fh.write(json.dumps({"messages": messages}) + "\n")
    return path


@pytest.mark.parametrize(("extra", "rel"), [
    (["--precision", "fp32"], 1e-5),
    (["--precision", "fp32", "--packing", "--micro-batch-size", "2", "--loss-aggregation",
      "token-mean", "--lora"], 1e-5),
    # bf16 autocast (accelerate's, over the fp32 weights): the chunks run under it as well
    (["--precision", "bf16", "--gradient-checkpointing"], 1e-2),
], ids=["rows", "packed-lora", "bf16-checkpointing"])
def test_drvenus_sft_logs_the_same_losses_as_the_full_logits(tiny_policy, tmp_path, extra, rel,
                                                             caplog):
    data = _conversations(tmp_path / "train.jsonl")
    history = {}
    caplog.set_level(logging.INFO, logger="drvenus.train.sft.trainer")
    for chunk in ("0", "5", str(LOSS_CHUNK_TOKENS)):
        out = tmp_path / f"chunk-{chunk}"
        caplog.clear()
        result = runner.invoke(app, [
            "sft", "--train", str(data), "--model", str(tiny_policy), "--output", str(out),
            "--max-length", "128", "--global-batch-size", "2", "--max-steps", "3",
            "--save-steps", "100", "--no-shuffle", "--learning-rate", "1e-3",
            "--loss-chunk-tokens", chunk, *extra])
        assert result.exit_code == 0, result.output
        said = " ".join(r.getMessage() for r in caplog.records)
        how = "from the full logits" if chunk == "0" else f"{chunk} trained tokens at a time"
        assert how in said and "loss_chunk_tokens ignored" not in said
        lines = (out / "history.jsonl").read_text().splitlines()
        history[chunk] = [e for e in map(json.loads, lines) if "loss" in e]
    full = history.pop("0")
    assert len(full) == 3
    for chunk, logged in history.items():
        for a, b in zip(logged, full, strict=True):
            assert a["loss"] == pytest.approx(b["loss"], rel=rel), chunk
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=10 * rel), chunk
