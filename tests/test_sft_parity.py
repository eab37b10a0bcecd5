"""``drvenus sft`` follows DR-Venus's verl recipe: the loss averaged per row then over rows (or
per token, as an option), AdamW betas (0.9, 0.95) with weight decay on every trained parameter,
gradient checkpointing on for long passes; the embedded recipe keeps what it ran with.

The loss is checked twice: the aggregation functions against numbers worked out by hand, and
the Trainer's accumulated step (micro batches of one row, rows of different lengths) against
the same formula evaluated on the tiny random Llama's own logits, loss and gradients.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs the train extra")
transformers = pytest.importorskip("transformers", reason="needs the train extra")

from drvenus.train.sft import verl_engine  # noqa: E402
from drvenus.train.sft.config import (  # noqa: E402
    CHECKPOINTING_ABOVE_TOKENS,
    SFTConfig,
    SFTConfigError,
    load_config,
)
from drvenus.train.sft.data import (  # noqa: E402
    Example,
    SFTCollator,
    read_conversations,
    tokenize_dataset,
)
from drvenus.train.sft.loss import aggregate, count_items, step_loss  # noqa: E402
from drvenus.train.sft.trainer import _trainer_class, training_arguments  # noqa: E402

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "embedded" / "sft.yaml"
IGNORE = -100


def _config(tmp_path: Path, **kw) -> SFTConfig:
    base = dict(train="t", model="m", output=str(tmp_path / "out"), max_length=64)
    return SFTConfig(**{**base, **kw}).validate()


# --------------------------------------------------------------------------- by hand


def _hand_batch():
    """Two sequences of 7 tokens: sequence 0 packs row A (tokens 0-3) and row B (4-6), sequence
    1 is row C (0-4) and 2 padding tokens. Per-target losses (target t+1 given token t):
    A: 1 and 3 trained; B: 4 trained (its first token never is); C: 1, 2, 3, 6 trained."""
    row_index = torch.tensor([[0, 0, 0, 0, 1, 1, 1],
                              [2, 2, 2, 2, 2, -1, -1]])
    losses = torch.tensor([[9.0, 1.0, 3.0, 9.0, 9.0, 4.0],
                           [1.0, 2.0, 3.0, 6.0, 9.0, 9.0]])
    mask = torch.tensor([[False, True, True, False, False, True],
                         [True, True, True, True, False, False]])
    labels = torch.full((2, 7), IGNORE)
    labels[:, 1:][mask] = 5
    return losses, mask, row_index, labels


def test_row_and_token_mean_match_a_hand_computation():
    losses, mask, rows, labels = _hand_batch()
    # row-mean: A = (1 + 3) / 2 = 2, B = 4, C = (1 + 2 + 3 + 6) / 4 = 3 -> (2 + 4 + 3) / 3 = 3
    total, items = aggregate(losses, mask, rows, "row-mean")
    assert total.item() == pytest.approx(9.0) and items.item() == 3
    assert count_items(labels, rows, "row-mean").item() == 3
    # token-mean: (1 + 3 + 4 + 1 + 2 + 3 + 6) / 7 = 20 / 7
    total, items = aggregate(losses, mask, rows, "token-mean")
    assert total.item() == pytest.approx(20.0) and items.item() == 7
    assert count_items(labels, rows, "token-mean").item() == 7
    # without row_index each sequence is one row: (8/3 + 12/4) / 2
    total, items = aggregate(losses, mask, None, "row-mean")
    assert (total / items).item() == pytest.approx((8 / 3 + 3) / 2)


def test_a_step_of_two_micro_batches_on_two_processes_divides_by_the_global_count():
    """Micro batch 1 = the hand batch, micro batch 2 = row D with losses 5 and 7; another
    process has 4 more rows. Each micro batch's share is its sum over the step's count times
    the processes (whose gradients are averaged)."""
    losses, mask, rows, _ = _hand_batch()
    d_losses, d_mask = torch.tensor([[5.0, 7.0, 9.0]]), torch.tensor([[True, True, False]])
    d_rows = torch.tensor([[0, 0, 0, 0]])
    global_rows = 3 + 1 + 4
    shares = [step_loss(aggregate(lo, ma, ro, "row-mean")[0], torch.tensor(global_rows), 2)
              for lo, ma, ro in ((losses, mask, rows), (d_losses, d_mask, d_rows))]
    # this process's rows: A 2, B 4, C 3, D 6 -> (15 / 8) x 2
    assert sum(s.item() for s in shares) == pytest.approx(15 / 8 * 2)


# --------------------------------------------------------------------------- the Trainer


ROWS = [  # one row per micro batch, of very different lengths (trained tokens 2, 9, 4)
    Example([5, 6, 7, 8], [0, 0, 1, 1], [4]),
    Example(list(range(20, 34)), [0] * 5 + [1] * 9, [14]),
    Example(list(range(40, 47)), [0, 0, 0, 1, 1, 1, 1], [7]),
]


def _row_losses(model, examples) -> list[torch.Tensor]:
    """Each row's per-token losses, computed here from the model's logits."""
    out = []
    for e in examples:
        ids = torch.tensor([e.input_ids])
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        targets = torch.tensor(e.input_ids[1:])
        trained = torch.tensor(e.loss_mask[1:], dtype=torch.bool)
        nll = -torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]
        out.append(nll[trained])
    return out


def _expected(per_row: list[torch.Tensor], mode: str) -> torch.Tensor:
    if mode == "row-mean":
        return torch.stack([r.mean() for r in per_row]).mean()
    return torch.cat(per_row).sum() / sum(len(r) for r in per_row)


@pytest.mark.parametrize("mode", ["row-mean", "token-mean"])
def test_the_trainer_step_loss_and_gradients_match_the_hand_formula(tiny_policy, tmp_path, mode):
    config = _config(tmp_path, global_batch_size=3, loss_aggregation=mode, precision="fp32")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_policy)
    model.config.use_cache = False
    args = training_arguments(config, 1, "fp32", has_val=False)
    assert args.gradient_accumulation_steps == 3
    trainer = _trainer_class(mode)(model=model, args=args, data_collator=SFTCollator(0))
    model.train()
    batches = [SFTCollator(0)([e]) for e in ROWS]
    batches, items = trainer.get_batch_samples(iter(batches), 3, torch.device("cpu"))
    assert int(items) == (3 if mode == "row-mean" else 2 + 9 + 4)
    model.zero_grad()
    got = sum(trainer.training_step(model, b, items) for b in batches)  # backward included
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad()
    per_row = _row_losses(model, ROWS)
    expected = _expected(per_row, mode)
    expected.backward()
    assert float(got) == pytest.approx(expected.item(), rel=1e-5)
    for name, p in model.named_parameters():
        # float32 sums in another order (the embedding's gradient gathers every row's tokens):
        # an error of a few 1e-6 where the gradients reach 0.5; a wrong weighting is far more
        atol = 1e-5 * max(1.0, float(p.grad.abs().max()))
        torch.testing.assert_close(ours[name], p.grad, rtol=1e-4, atol=atol, msg=name)
    other = _expected(per_row, "token-mean" if mode == "row-mean" else "row-mean")
    assert abs(other.item() - expected.item()) > 1e-3  # the two modes differ on this batch


def test_evaluation_loss_is_each_batch_on_its_own(tiny_policy, tmp_path):
    config = _config(tmp_path, global_batch_size=2, micro_batch_size=2)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_policy).eval()
    trainer = _trainer_class("row-mean")(model=model, args=training_arguments(
        config, 1, "fp32", has_val=False), data_collator=SFTCollator(0))
    batch = SFTCollator(0)(ROWS[:2])
    with torch.no_grad():
        loss = trainer.compute_loss(model, batch, num_items_in_batch=torch.tensor(999))
        expected = _expected(_row_losses(model, ROWS[:2]), "row-mean")
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert "labels" in batch  # the caller's batch is left as it was


# --------------------------------------------------------------------------- optimizer


@pytest.mark.parametrize(("beta2", "expected"), [(None, (0.9, 0.95)), (0.999, (0.9, 0.999))])
def test_betas_and_weight_decay_reach_the_optimizer(tiny_policy, tmp_path, beta2, expected):
    kw = {} if beta2 is None else {"adam_beta2": beta2}
    config = _config(tmp_path, global_batch_size=1, **kw)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_policy)
    args = training_arguments(config, 1, "fp32", has_val=False)
    assert (args.adam_beta1, args.adam_beta2) == expected
    trainer = _trainer_class()(model=model, args=args, data_collator=SFTCollator(0))
    optimizer = trainer.create_optimizer()
    groups = [g for g in optimizer.param_groups if g["params"]]
    assert all(tuple(g["betas"]) == expected for g in groups)
    decayed = {id(p) for g in groups if g["weight_decay"] == 0.01 for p in g["params"]}
    assert decayed == {id(p) for p in model.parameters()}  # norms too, as verl's AdamW
    assert any("norm" in n for n, _ in model.named_parameters())


def test_shuffle_off_reads_the_rows_in_file_order(tmp_path):
    assert training_arguments(_config(tmp_path), 1, "fp32", False).train_sampling_strategy \
        == "random"
    off = _config(tmp_path, shuffle=False)
    assert training_arguments(off, 1, "fp32", False).train_sampling_strategy == "sequential"


# --------------------------------------------------------------------------- checkpointing


@pytest.mark.parametrize(("kw", "on"), [
    ({"max_length": 200_000}, True),  # DR-Venus
    ({"max_length": CHECKPOINTING_ABOVE_TOKENS}, False),
    ({"max_length": CHECKPOINTING_ABOVE_TOKENS + 1}, True),
    ({"max_length": 2048, "micro_batch_size": 4, "global_batch_size": 4}, True),
    ({"max_length": 2048}, False),  # the embedded recipe
    ({"max_length": 200_000, "gradient_checkpointing": False}, False),
    ({"max_length": 128, "gradient_checkpointing": True}, True),
])
def test_gradient_checkpointing_turns_on_for_long_passes(tmp_path, kw, on):
    config = _config(tmp_path, **kw)
    assert config.gradient_checkpointing_on() is on
    assert training_arguments(config, 1, "fp32", False).activation_checkpointing is on
    verl = SFTConfig(**{**config.as_dict(), "engine": "verl"}).validate()
    overrides = verl_engine.verl_overrides(verl, "train.parquet", "train.parquet")
    assert overrides["model.enable_gradient_checkpointing"] is on


def test_sft_defaults_are_dr_venus_and_verl():
    config = SFTConfig()
    assert (config.adam_beta1, config.adam_beta2) == (0.9, 0.95)
    assert config.loss_aggregation == "row-mean" and config.train_after_end_of_turn
    assert config.gradient_checkpointing is None and config.gradient_checkpointing_on()
    assert (config.weight_decay, config.warmup_ratio, config.max_grad_norm) == (0.01, 0.1, 1.0)
    assert config.shuffle


# --------------------------------------------------------------------------- configs


def test_the_embedded_recipe_keeps_what_it_ran_with():
    config = load_config(RECIPE, train="t.parquet", model="m.gguf", output="o")
    assert (config.adam_beta1, config.adam_beta2) == (0.9, 0.999)
    assert config.loss_aggregation == "token-mean"
    assert config.train_after_end_of_turn is False and config.gradient_checkpointing is False
    assert config.lora and config.max_length == 2048


def test_new_options_as_yaml_keys_and_verl_overrides(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text("adam_beta2: 0.98\nloss_aggregation: token-mean\n"
                    "gradient_checkpointing: null\n", encoding="utf-8")
    config = load_config(path, train="t", model="m", output="o")
    assert config.adam_beta2 == 0.98 and config.loss_aggregation == "token-mean"
    assert config.gradient_checkpointing is None
    verl = _config(tmp_path, engine="verl", adam_beta2=0.98)
    overrides = verl_engine.verl_overrides(verl, "a.parquet", "a.parquet")
    assert overrides["optim.betas"] == "[0.9,0.98]"  # numbers for Hydra, not quoted strings
    with pytest.raises(SFTConfigError, match="--loss-aggregation"):
        _config(tmp_path, loss_aggregation="sum")
    with pytest.raises(SFTConfigError, match="--adam-beta2"):
        _config(tmp_path, adam_beta2=1.0)


@pytest.mark.parametrize(("kw", "expected"), [
    ({"loss_aggregation": "token-mean"}, "--loss-aggregation token-mean"),
    ({"train_after_end_of_turn": False}, "--no-train-after-end-of-turn"),
    ({"shuffle": False}, "--no-shuffle"),
])
def test_verl_refuses_what_it_cannot_do(tmp_path, kw, expected):
    config = _config(tmp_path, engine="verl", **kw)
    with pytest.raises(SFTConfigError, match=expected):
        verl_engine.check_verl_config(config)


def test_token_mean_under_accelerate_sequence_parallel_is_refused(tmp_path):
    with pytest.raises(SFTConfigError, match="--loss-aggregation token-mean"):
        _config(tmp_path, num_processes=8, sequence_parallel=8, loss_aggregation="token-mean",
                global_batch_size=32)


# --------------------------------------------------------------------------- two processes


def _conversations(path: Path) -> Path:
    """Four rows whose answers differ in length (1 to about 40 tokens)."""
    import json

    answers = ["Paris.", "It is Paris, the capital and largest city of France, on the Seine.",
               "Paris", "The answer is Paris; " * 6]
    with path.open("w", encoding="utf-8") as fh:
        for i, answer in enumerate(answers):
            messages = [{"role": "user", "content": f"Question {i}: the capital of France?"},
                        {"role": "assistant", "content": answer}]
            fh.write(json.dumps({"messages": messages}) + "\n")
    return path


@pytest.mark.slow
def test_two_processes_give_the_one_process_step_loss_and_gradient(tiny_policy, tmp_path):
    """The first step (initial weights) over the same 4 rows: 2 processes x 2 accumulated
    micro batches give the loss and gradient norm of 1 process x 4 (the global row count is
    summed over the processes, each share scaled by the 2 processes whose gradients DDP
    averages), and that loss is the hand formula on the model's own logits."""
    import json
    import os
    import socket
    import subprocess
    import sys

    from drvenus.train.sft import train

    data = _conversations(tmp_path / "train.jsonl")
    common = ["--train", str(data), "--model", str(tiny_policy), "--max-length", "128",
              "--global-batch-size", "4", "--max-steps", "1", "--save-steps", "1",
              "--no-shuffle", "--precision", "fp32"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with socket.socket() as probe:  # a free port: a fixed one clashes with a suite beside it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(port), "-m", "drvenus", "sft", *common,
           "--output", str(tmp_path / "ddp")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    history = (tmp_path / "ddp" / "history.jsonl").read_text().splitlines()
    ddp = next(e for e in map(json.loads, history) if "loss" in e)

    def one_process(mode: str) -> dict:
        config = SFTConfig(train=str(data), model=str(tiny_policy), max_length=128,
                           output=str(tmp_path / mode), global_batch_size=4, max_steps=1,
                           save_steps=1, shuffle=False, precision="fp32", loss_aggregation=mode)
        return next(e for e in train(config).log_history if "loss" in e)

    single, tokens = one_process("row-mean"), one_process("token-mean")
    assert ddp["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert ddp["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)
    # and the whole train() path logs the formula of the initial model on these rows
    tok = transformers.AutoTokenizer.from_pretrained(tiny_policy)
    rows = tokenize_dataset(read_conversations(data), tok, 128, train_after_end_of_turn=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_policy)
    with torch.no_grad():
        per_row = _row_losses(model, rows.examples)
    assert single["loss"] == pytest.approx(_expected(per_row, "row-mean").item(), rel=1e-5)
    assert tokens["loss"] == pytest.approx(_expected(per_row, "token-mean").item(), rel=1e-5)
    assert abs(tokens["loss"] - single["loss"]) > 1e-3
