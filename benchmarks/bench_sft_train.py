"""Training throughput (real tokens per second) of ``drvenus sft`` on CPU with a tiny random Llama
(2 layers, width 64, the embedded SmolLM2 vocabulary of 49,152 tokens).

Rows: the shared DR-Venus trajectories without the system prompt, their first 2, 4, 6 or 8
messages with each message cut to 400 characters (40 rows of ~100-700 tokens), max length 1024,
loss on assistant tokens only. Ours one row per sequence (micro batch 1, and micro batch 4
padded to the longest) and packed (micro batch 1); baseline TRL's ``SFTTrainer`` with
``assistant_only_loss`` (same model, rows, batch and lr), when ``trl`` imports (set
PYTHONPATH to where it is installed; it needs ``datasets``). Tokens/s counts non-padding
tokens and excludes tokenisation.

Usage: ``python benchmarks/bench_sft_train.py [--epochs 2]`` (smallest: ``--epochs 1
--trajectories 1 --max-length 128``).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import torch
import transformers

from _embedded_tokenizer import embedded_tokenizer_dir
from drvenus.train.sft import SFTConfig, read_conversations, train

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "trajectories" / "dr-venus-sft"
MAX_LENGTH = 1024

# SmolLM2's ChatML template with TRL's {% generation %} markers around what the model writes.
CHATML_GENERATION = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ m['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build(folder: Path, trajectories: int | None = None) -> tuple[Path, Path, int]:
    """The tiny model folder, a JSONL of rows (four per trajectory; ``trajectories``: the first
    N, default all), and the number of rows."""
    tok = transformers.AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model_dir = folder / "model"
    transformers.LlamaForCausalLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    rows = []
    for messages in read_conversations(SHARED)[:trajectories]:
        body = [{**m, "content": m["content"][:400]} for m in messages if m["role"] != "system"]
        rows += [body[:n] for n in (2, 4, 6, 8)]
    data = folder / "rows.jsonl"
    data.write_text("".join(json.dumps({"messages": r}) + "\n" for r in rows))
    return model_dir, data, len(rows)


def ours(model: Path, data: Path, out: Path, epochs: float, micro: int, packing: bool,
         max_length: int = MAX_LENGTH) -> float:
    config = SFTConfig(train=str(data), model=str(model), output=str(out), max_length=max_length,
                       global_batch_size=4, micro_batch_size=micro, packing=packing,
                       epochs=epochs, learning_rate=1e-3, save_steps=10_000, logging_steps=1000)
    result = train(config)
    runtime = next(e["train_runtime"] for e in result.log_history if "train_runtime" in e)
    return result.data_stats["train"]["tokens"] * epochs / runtime


def trl_baseline(model: Path, data: Path, out: Path, epochs: float, micro: int,
                 max_length: int = MAX_LENGTH) -> float | None:
    try:
        import datasets
        from trl import SFTConfig as TrlConfig
        from trl import SFTTrainer
    except ImportError as exc:
        logging.warning("no TRL baseline: %s", exc)
        return None
    tok = transformers.AutoTokenizer.from_pretrained(model)
    tok.chat_template = CHATML_GENERATION
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    ds = datasets.Dataset.from_list(rows)
    args = TrlConfig(output_dir=str(out), max_length=max_length, assistant_only_loss=True,
                     per_device_train_batch_size=micro, gradient_accumulation_steps=4 // micro,
                     num_train_epochs=epochs, learning_rate=1e-3, save_strategy="no",
                     logging_steps=1000, report_to="none", use_cpu=True, seed=42)
    trainer = SFTTrainer(model=str(model), args=args, train_dataset=ds, processing_class=tok)
    tokens = sum(len(r["input_ids"]) for r in trainer.train_dataset)
    start = time.perf_counter()
    trainer.train()
    return tokens * epochs / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--max-length", type=int, default=MAX_LENGTH,
                        help="tokens per sequence (rows are cut to it)")
    parser.add_argument("--trajectories", type=int, default=None,
                        help="rows from the first N shared trajectories only (4 rows each)")
    args = parser.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"shared trajectories not found: {SHARED}")
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model, data, n = build(folder, args.trajectories)
        length = args.max_length
        results = {
            "ours, one row per sequence, micro 1": ours(model, data, folder / "a", args.epochs,
                                                        1, False, length),
            "ours, padded batches, micro 4": ours(model, data, folder / "b", args.epochs, 4, False,
                                                  length),
            "ours, packed, micro 1": ours(model, data, folder / "c", args.epochs, 1, True, length),
            "TRL SFTTrainer assistant_only_loss, micro 1": trl_baseline(
                model, data, folder / "d", args.epochs, 1, length),
        }
    print(f"{n} rows, max length {args.max_length}, {args.epochs} epochs, "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'run':<48} {'tokens/s':>10}")
    for name, value in results.items():
        print(f"{name:<48} {'n/a' if value is None else f'{value:,.0f}':>10}")


if __name__ == "__main__":
    main()
