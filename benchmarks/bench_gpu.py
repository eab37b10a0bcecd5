"""drvenus's training stack on a GPU, in one command (issue 45): every check prints a row as it
finishes and rewrites ``--out DIR/gpu.json`` and ``DIR/gpu.md``, so a run cut short keeps what it
measured. Checks, in priority order, within ``--budget-s`` seconds (a check or part of one that
would not fit is recorded as skipped):

1. **SFT at DR-Venus's shape.** ``drvenus.train.sft.train`` itself (chat-template assistant
   masks, rows that restart their positions, bf16, gradient checkpointing, transformers' Trainer
   on accelerate) on a model of Qwen3-4B-Thinking-2507's architecture with random weights (the
   config below; drvenus's model loader is replaced by one that builds it on the GPU: 4B
   weights do not travel), LoRA (drvenus's defaults; what docs/SFT.md gives one GPU), at 8K, 32K,
   64K and 128K tokens a row; then all weights at the shortest length, and short rows packed
   into the shortest length. Tokens/s (steps after the first), peak GPU memory, MFU against a
   bf16 matrix product timed in the same run. Side by side the baseline a user would write: a
   plain transformers ``Trainer`` on the same model, rows and assistant-only labels (-100
   elsewhere), its ratio and both first-step losses. Ours computes the loss from the final
   hidden states, ``loss_chunk_tokens`` trained tokens' logits at a time (recomputed in the
   backward); the baseline from the full logits in fp32 (T x 151,936 x 4 bytes: 20 GB at 32K,
   40 GB at 64K, plus the log-softmax kept for the backward), so on an 80 GB GPU the baseline
   may run out of memory at lengths ours still runs. An out-of-memory is recorded, not fatal;
   once ours has run out of memory the longer lengths are skipped, once the baseline has, its
   longer runs are (ours still runs them).
2. **CPU and GPU agree.** ``drvenus sft`` (the command) on a tiny seeded Llama and seeded rows:
   the first 5 losses on this machine's CPU (a process that sees no GPU, started at once so it
   runs while check 1 uses the GPU; ``--cpu-reference FILE``, made elsewhere with
   ``--write-cpu-reference FILE``, adds that machine's) against the GPU in fp32 and in bf16;
   then ``drvenus ask --model <the GPU fp32 run's final/>`` (the transformers backend) runs.
3. **The embedded recipe on the GPU.** ``drvenus sft --config recipes/embedded/sft.yaml`` on a
   SmolLM2-135M-shaped model (random weights: the base GGUF is 98 MB, over what travels) on
   recipe-like trajectories (or the recipe's real data: ``--recipe-data DIR``, the output of
   ``recipes/embedded/build_data.py``), then IGPO steps with ``recipes/embedded/rl.yaml`` and the
   transformers rollout engine: seconds a step, and the recipe's SFT and RL extrapolated.
4. **IG scoring at 4B shape**, a 32K-token trajectory: ours (``boundary_scores``, KV cache) and
   the vLLM-style baseline of benchmarks/bench_ig.py against the last-token-only forward.

``--smoke`` runs the same code on the CPU with tiny shapes (tests/test_bench_gpu.py).

Usage: ``python benchmarks/bench_gpu.py --out DIR`` on a CUDA machine (docs/SFT.md, "Running on a
GPU", gives the device command; benchmarks/gpu_prepare.sh what travels with it); ``--only 2,4``
reruns some checks, ``--lengths 8192,32768`` some lengths. Smallest: ``python
benchmarks/bench_gpu.py --smoke --out DIR`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import hashlib
import json
import logging
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

# Before torch starts CUDA: fewer out-of-memory errors from fragmentation at long rows (both
# ours and the baseline run under it; gpu.json's meta records it).
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model and tokenizer here is local

import torch  # noqa: E402
import transformers  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
if str(SRC) not in sys.path:  # the device runs drvenus from the checkout, not installed
    sys.path.insert(0, str(SRC))

from drvenus.train.sft import trainer as sft_trainer  # noqa: E402
from drvenus.train.sft.config import LOSS_CHUNK_TOKENS, SFTConfig  # noqa: E402
from drvenus.train.sft.config import load_config as load_sft_config  # noqa: E402
from drvenus.train.sft.data import Example, tokenize_dataset  # noqa: E402

log = logging.getLogger("bench_gpu")

# Where a prepared run keeps what travels beside the checkout (benchmarks/gpu_prepare.sh).
PREPARED = ROOT / ".gpu"

# Qwen3-4B-Thinking-2507's config.json (DR-Venus's base model; the same architecture as
# Qwen3-4B, whose first release had rope_theta 1e6 and 40,960 positions).
QWEN3_4B: dict[str, Any] = {
    "model_type": "qwen3", "hidden_size": 2560, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 9728, "vocab_size": 151936, "rope_theta": 5_000_000.0,
    "max_position_embeddings": 262_144, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
    "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645,
}
# SmolLM2-135M-Instruct (the embedded model; read from its GGUF's metadata): a Llama.
SMOLLM2_135M: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
    "vocab_size": 49152, "rope_theta": 100_000.0, "max_position_embeddings": 8192,
    "tie_word_embeddings": True, "rms_norm_eps": 1e-5, "hidden_act": "silu",
}
# The smoke run's stand-ins: the same architectures, tiny (Qwen3's vocabulary kept).
TINY_QWEN3 = {**QWEN3_4B, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
              "max_position_embeddings": 4096}
TINY_LLAMA = {**SMOLLM2_135M, "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
              "max_position_embeddings": 4096}

# CPU numbers of the same work, from docs/BENCHMARKS.md (2 shared cores).
CPU_RECIPE_SFT_S_PER_STEP = 21.0  # the recipe's SFT in bf16 ("The recipe's stages")
CPU_RECIPE_RL_S_PER_STEP = 350.0  # IGPO, 12 steps in about 70 minutes
RECIPE_SFT_TOKENS = 1_200_000  # the recipe's SFT data: 883 trajectories, 1.2M tokens
RECIPE_RL_STEPS = 12

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")

CHECKS = {1: "SFT at DR-Venus's shape", 2: "CPU and GPU agree",
          3: "The embedded recipe on the GPU", 4: "IG scoring at 4B shape"}
# the least time a check needs (full mode): later checks keep it while earlier ones spend
RESERVE_S = {1: 60.0, 2: 75.0, 3: 90.0, 4: 40.0}
SMOKE_RESERVE_S = {1: 5.0, 2: 10.0, 3: 10.0, 4: 5.0}


# --------------------------------------------------------------------------- results


def _error(exc: BaseException) -> dict[str, str]:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = "".join(lines).strip().splitlines()[-12:]
    return {"type": type(exc).__name__, "message": str(exc)[:1500], "traceback": "\n".join(tail)}


def is_oom(exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(exc, oom) or "out of memory" in str(exc).lower()


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        if abs(value) >= 0.01:
            return f"{value:.3f}"
        return f"{value:.2e}"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value).replace("|", "/").replace("\n", " ")


@dataclasses.dataclass
class Row:
    """One line of the results: ``values`` are the table's columns (in order), ``details``
    what else the JSON keeps."""

    check: int
    name: str
    status: str = "running"  # ok | oom | error | skipped | running
    seconds: float = 0.0
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: dict[str, str] | None = None
    note: str = ""


class Report:
    """The rows so far, written to ``gpu.json`` and ``gpu.md`` (atomically) after each change."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out, self.meta, self.rows = out, meta, []
        out.mkdir(parents=True, exist_ok=True)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def done(self, row: Row, echo: bool = True) -> None:
        """Write the files; print the row unless ``echo`` is false."""
        self.write()
        if echo:
            values = "; ".join(f"{k} {_fmt(v)}" for k, v in row.values.items())
            extra = f" [{row.error['type']}: {row.error['message'][:300]}]" if row.error else ""
            note = f" ({row.note})" if row.note else ""
            print(f"[check {row.check}] {row.name}: {row.status}, {row.seconds:.1f} s | "
                  f"{values}{note}{extra}", flush=True)

    def write(self) -> None:
        data = {"meta": self.meta, "rows": [dataclasses.asdict(r) for r in self.rows]}
        _atomic_write(self.out / "gpu.json", json.dumps(data, indent=2, default=str) + "\n")
        _atomic_write(self.out / "gpu.md", self.markdown())

    def markdown(self) -> str:
        m = self.meta
        lines = ["# drvenus on a GPU (benchmarks/bench_gpu.py)", "",
                 f"Device: {m.get('device')}; torch {m.get('torch')}, transformers "
                 f"{m.get('transformers')}, accelerate {m.get('accelerate')}, peft "
                 f"{m.get('peft')}, Python {m.get('python')}; mode {m.get('mode')}; "
                 f"bf16 matmul {_fmt(m.get('matmul_tflops'))} TFLOP/s "
                 f"({m.get('matmul_what')}); tokenizer {m.get('tokenizer')}; budget "
                 f"{m.get('budget_s')} s, spent {_fmt(m.get('spent_s'))} s"
                 f"{'' if m.get('complete') else ' (run not finished)'}.", ""]
        for check, title in CHECKS.items():
            rows = [r for r in self.rows if r.check == check]
            if not rows:
                continue
            columns: list[str] = []
            for r in rows:
                columns += [c for c in r.values if c not in columns]
            lines += [f"## {check}. {title}", "",
                      "| case | status | s | " + " | ".join(columns) + " | note |",
                      "|---|---|---|" + "---|" * len(columns) + "---|"]
            for r in rows:
                note = r.note
                if r.error:
                    note = f"{note} {r.error['type']}: {r.error['message'][:200]}".strip()
                cells = " | ".join(_fmt(r.values.get(c)) for c in columns)
                lines.append(f"| {r.name} | {r.status} | {r.seconds:.1f} | {cells} | "
                             f"{_fmt(note) if note else ''} |")
            lines.append("")
        return "\n".join(lines)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class Budget:
    """Seconds left of ``total``; a part runs only when what it needs fits beside what the
    later checks keep (``reserve``)."""

    def __init__(self, total: float) -> None:
        self.total, self.start = total, time.perf_counter()

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.total - self.spent()

    def fits(self, need: float, reserve: float = 0.0) -> bool:
        return self.left() - reserve >= need


# --------------------------------------------------------------------------- context


@dataclasses.dataclass
class Context:
    args: argparse.Namespace
    smoke: bool
    device: str
    precision: str  # bf16 on the GPU, fp32 in the smoke run
    tokenizer_dir: Path
    tmp: Path
    report: Report
    budget: Budget
    checks: list[int]
    matmul_tflops: float = 0.0
    background: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        if not self.cuda:
            return None
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**30

    def reserve_after(self, check: int) -> float:
        """What the selected checks after ``check`` keep of the budget."""
        table = SMOKE_RESERVE_S if self.smoke else RESERVE_S
        return sum(table[c] for c in self.checks if c > check)

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a ``python -m drvenus`` child: drvenus from this checkout, offline."""
    env = dict(os.environ)
    paths = [str(SRC)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update({"PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"})
    env.update(extra)
    return env


def run_part(ctx: Context, row: Row, part: Callable[[Row], None], *, echo: bool = True) -> Row:
    """Run ``part(row)``: an exception becomes the row's error (an out-of-memory its ``oom``
    status), then the row is written and printed and the memory freed."""
    start = time.perf_counter()
    try:
        part(row)
        if row.status == "running":
            row.status = "ok"
    except Exception as exc:  # noqa: BLE001 - recorded; the next check runs
        row.status = "oom" if is_oom(exc) else "error"
        row.error = _error(exc)
        del exc
    row.seconds = round(time.perf_counter() - start, 2)
    ctx.free()
    ctx.report.done(row, echo)
    return row


def skip(ctx: Context, check: int, name: str, why: str) -> Row:
    row = ctx.report.add(Row(check, name, status="skipped", note=why))
    ctx.report.done(row)
    return row


# --------------------------------------------------------------------------- tokenizer, text


def find_tokenizer(args: argparse.Namespace, tmp: Path) -> tuple[Path, str]:
    """A tokenizer folder with a chat template: ``--tokenizer``, the prepared ``.gpu/tokenizer``,
    the embedded SmolLM2's (when its GGUF is already here: never pulled), else a byte-level
    ChatML tokenizer built here (the token counts then are bytes)."""
    if args.tokenizer and args.tokenizer != "byte":
        return Path(args.tokenizer), f"given ({args.tokenizer})"
    if args.tokenizer != "byte":
        if (PREPARED / "tokenizer" / "tokenizer_config.json").is_file():
            return PREPARED / "tokenizer", "SmolLM2 (.gpu/tokenizer)"
        with contextlib.suppress(Exception):
            from _embedded_tokenizer import TEST_MODELS, embedded_tokenizer_dir
            from drvenus.llm.embedded import local_model_path

            if local_model_path(TEST_MODELS) is not None:
                return embedded_tokenizer_dir(), "SmolLM2 (the embedded GGUF's)"
    return byte_tokenizer(tmp / "byte-tokenizer"), "byte-level ChatML (built here)"


def byte_tokenizer(folder: Path) -> Path:
    """A ChatML tokenizer whose tokens are the 256 bytes (no merges) plus three specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(specials)}
    vocab.update({ch: i + len(specials) for i, ch in enumerate(alphabet)})
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.chat_template = CHATML
    tok.save_pretrained(folder)
    return folder


WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at "
         "which but have an they you were her she there been one all we their has would when who "
         "will more no if out so said what up its about into than them can only other new some "
         "could time these two may then do first any my now such like our over man me even most "
         "made after also did many before must through years where much your way well down "
         "should because each just those people how too little state good very make world still "
         "own see men work long get here between both life being under never day same another "
         "know while last might us great old year off come since against go came right used "
         "take three river novel city war born capital album film author population").split()


class Text:
    """Seeded pseudo-English; ``tokens_per_word`` is measured on the tokenizer in use."""

    def __init__(self, seed: int, tokenizer: Any) -> None:
        self.rng = random.Random(seed)
        sample = self.words(2000)
        n = len(tokenizer(sample, add_special_tokens=False)["input_ids"])
        self.tokens_per_word = n / 2000
        self.rng = random.Random(seed)

    def words(self, n: int) -> str:
        out = []
        for i in range(max(1, n)):
            w = self.rng.choice(WORDS)
            if i % 17 == 5:
                w = str(self.rng.randint(1, 2025))
            out.append(w)
        return " ".join(out)

    def n_words(self, tokens: float) -> int:
        return max(1, int(tokens / self.tokens_per_word))


def trajectory(text: Text, tokens: int, tool_tokens: int = 1500) -> list[dict[str, str]]:
    """An agent trajectory of about ``tokens`` tokens: system prompt, question, then turns of
    reasoning + a search call and a tool response, and a final answer (about a tenth of the
    tokens are the assistant's)."""
    rng = text.rng
    system, question = min(300, max(4, tokens // 8)), min(24, max(3, tokens // 16))
    final = min(40, max(3, tokens // 16))
    msgs = [{"role": "system", "content": "You are a deep research assistant. "
             + text.words(text.n_words(system))},
            {"role": "user", "content": "Question: " + text.words(text.n_words(question)) + "?"}]
    used = system + question + 20
    tool = min(tool_tokens, max(8, tokens // 6))
    while used < tokens - final - 20:
        think = rng.randint(tool // 12 + 2, tool // 6 + 4)
        query = text.words(text.n_words(min(8, think)))
        msgs.append({"role": "assistant", "content": f"<think>\n{text.words(text.n_words(think))}"
                     f"\n</think>\n<tool_call>\n{{\"name\": \"search\", \"arguments\": "
                     f"{{\"query\": \"{query}\"}}}}\n</tool_call>"})
        size = rng.randint(tool // 2, tool)
        msgs.append({"role": "user", "content": "<tool_response>\n"
                     f"{text.words(text.n_words(size))}\n</tool_response>"})
        used += think + size + 40
    msgs.append({"role": "assistant", "content": "<think>\n" + text.words(text.n_words(final))
                 + "\n</think>\n<answer>\n" + text.words(3) + "\n</answer>"})
    return msgs


def fitting_trajectory(text: Text, tok: Any, limit: int) -> list[dict[str, str]]:
    """A :func:`trajectory` whose rendering is at most ``limit`` tokens (rows to pack), or
    the shortest tried (cut at the sequence length, it packs alone)."""
    target = limit * 0.9
    for _ in range(8):
        msgs = trajectory(text, int(target), tool_tokens=max(8, limit // 4))
        rendered = tok.apply_chat_template(msgs, tokenize=False)
        if len(tok(rendered, add_special_tokens=False)["input_ids"]) <= limit:
            break
        target *= 0.8
    return msgs


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def corpus_rows() -> list[dict[str, str]]:
    """A small local corpus for the agent's tools (``drvenus ask``, the RL rollouts)."""
    pages = [
        ("Frankenstein", "Frankenstein is an 1818 novel written by the English author Mary "
         "Shelley. It tells of Victor Frankenstein, a young scientist who creates a creature."),
        ("Dune (novel)", "Dune is a 1965 science fiction novel by the American author Frank "
         "Herbert. It is set on the desert planet Arrakis."),
        ("Lisbon", "Lisbon is the capital and largest city of Portugal, on the Tagus river."),
        ("Ada Lovelace", "Ada Lovelace (1815-1852) was an English mathematician known for her "
         "work on Charles Babbage's Analytical Engine."),
        ("Mount Kilimanjaro", "Mount Kilimanjaro is a dormant volcano in Tanzania, the highest "
         "mountain in Africa at 5,895 metres."),
    ]
    wiki = "https://en.wikipedia.org/wiki/"
    return [{"id": str(i), "title": t, "url": wiki + t.replace(" ", "_"), "text": body}
            for i, (t, body) in enumerate(pages, 1)]


QUESTIONS = [("Who wrote Frankenstein?", "Mary Shelley"),
             ("Who wrote the novel Dune?", "Frank Herbert"),
             ("What is the capital of Portugal?", "Lisbon"),
             ("In which country is Mount Kilimanjaro?", "Tanzania")]


# --------------------------------------------------------------------------- models


def model_config(shape: dict[str, Any]) -> Any:
    values = dict(shape)
    return transformers.AutoConfig.for_model(values.pop("model_type"), **values)


def model_folder(folder: Path, shape: dict[str, Any], tokenizer_dir: Path) -> Path:
    """A model folder with ``config.json`` and the tokenizer, no weights (check 1 and 4 build
    them on the device)."""
    folder.mkdir(parents=True, exist_ok=True)
    model_config(shape).save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return folder


def build_random(path: str | Path, device: str, dtype: torch.dtype,
                 attn_implementation: str | None = "sdpa", seed: int = 0) -> Any:
    """The model of the folder's config with seeded random weights, built on ``device``."""
    config = transformers.AutoConfig.from_pretrained(path)
    kw: dict[str, Any] = {"dtype": dtype}
    if attn_implementation:
        kw["attn_implementation"] = attn_implementation
    torch.manual_seed(seed)
    with torch.device(device):  # the weights are made where they are used
        model = transformers.AutoModelForCausalLM.from_config(config, **kw)
    return model.to(device)  # (a no-op unless some version initialised elsewhere)


def seeded_weights(model: Any, seed: int) -> None:
    """Every weight drawn from one seeded CPU generator in name order (norms 1): the same
    weights whatever transformers' own initialisation does (CPU reference files)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(tuple(p.shape), generator=gen) * 0.02)


def saved_model(folder: Path, shape: dict[str, Any], tokenizer_dir: Path, seed: int
                ) -> tuple[Path, str]:
    """A saved fp32 model of ``shape`` with :func:`seeded_weights` and the tokenizer, and a
    digest of its weights (the same whatever version of transformers saved them)."""
    config = model_config(shape)
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    config.pad_token_id = tok.pad_token_id
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    seeded_weights(model, seed)
    digest = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        digest.update(name.encode() + p.detach().contiguous().numpy().tobytes())
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, digest.hexdigest()


@contextlib.contextmanager
def random_weights(device: str) -> Iterator[None]:
    """drvenus's SFT loads the model through ``_from_pretrained``; here it builds the folder's
    config with random weights on ``device`` instead (the rest of ``train`` is unchanged)."""
    original = sft_trainer._from_pretrained

    def build(cls: Any, path: str, **kw: Any) -> Any:
        if cls is transformers.AutoModelForCausalLM:
            return build_random(path, device, kw.get("dtype", torch.float32),
                                kw.get("attn_implementation"))
        return original(cls, path, **kw)

    sft_trainer._from_pretrained = build
    try:
        yield
    finally:
        sft_trainer._from_pretrained = original


def checkpointing_args() -> dict[str, Any]:
    """Gradient checkpointing under this transformers' TrainingArguments names."""
    helper = getattr(sft_trainer, "checkpointing_arguments", None)
    if helper is not None:
        return helper(True)
    names = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    prefix = "activation" if "activation_checkpointing" in names else "gradient"
    return {f"{prefix}_checkpointing": True,
            f"{prefix}_checkpointing_kwargs": {"use_reentrant": False}}


def matmul_tflops(device: str, smoke: bool) -> tuple[float, str]:
    """The card's own bf16 matrix-product rate (random data), the MFU denominator."""
    n = 512 if smoke else 8192
    dtype = torch.float32 if smoke else torch.bfloat16
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    reps = 3 if smoke else 20
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / reps
    return 2 * n**3 / seconds / 1e12, f"{n}x{n}x{n} {str(dtype).removeprefix('torch.')}, " \
        f"mean of {reps}"


def matmul_params(shape: dict[str, Any]) -> int:
    """Weights that take part in a matrix product per token: the layers' projections and the
    output head (the embedding lookup is none)."""
    h, inter = shape["hidden_size"], shape["intermediate_size"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    hd = shape.get("head_dim") or h // heads
    layer = h * heads * hd * 2 + 2 * h * kv * hd + 3 * h * inter
    return shape["num_hidden_layers"] * layer + shape["vocab_size"] * h


def train_flops(shape: dict[str, Any], seq_lens: Sequence[int], lora: bool) -> float:
    """Model FLOPs of one training step over sequences of ``seq_lens`` (each row attends to
    itself, causally): matrix products 6 N T (LoRA: 4 N T, no weight gradients of the frozen
    base), attention 6 T^2 d per layer (forward 2 T^2 d causal, backward twice that).
    Recomputation by gradient checkpointing is not counted (the MFU convention)."""
    heads = shape["num_attention_heads"]
    d = heads * (shape.get("head_dim") or shape["hidden_size"] // heads)
    tokens = sum(seq_lens)
    attn = sum(6 * t * t * d * shape["num_hidden_layers"] for t in seq_lens)
    return (4 if lora else 6) * matmul_params(shape) * tokens + attn


# --------------------------------------------------------------------------- trainer timing


class _EndOfTraining(Exception):
    """Raised when training ends, before drvenus saves the final model (check 1 keeps none)."""


class StepTimer(transformers.TrainerCallback):
    """Seconds of each optimizer step (device synchronised), the logged losses, and (``stop``)
    an end before the final save."""

    def __init__(self, sync: Callable[[], None], stop: bool = False) -> None:
        self.sync, self.stop = sync, stop
        self.times: list[float] = []
        self.losses: list[float] = []
        self._t0 = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.sync()
        self._t0 = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.sync()
        self.times.append(time.perf_counter() - self._t0)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None,
               **kw: Any) -> None:
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.stop:
            raise _EndOfTraining

    def timed(self) -> list[float]:
        """The steps after the first (compilation, allocator and autotuning warm-up)."""
        return self.times[1:] or self.times


def sft_ours(ctx: Context, model_dir: Path, data: Path, out: Path, length: int, steps: int,
             lora: bool, packing: bool) -> StepTimer:
    """``drvenus.train.sft.train`` as ``drvenus sft`` runs it, stopped before the final save."""
    config = SFTConfig(train=str(data), model=str(model_dir), output=str(out), max_length=length,
                       packing=packing, shuffle=False, global_batch_size=1, micro_batch_size=1,
                       max_steps=steps, lora=lora, precision=ctx.precision,
                       gradient_checkpointing=True, save_steps=10**6, logging_steps=1,
                       report_to="none")
    timer = StepTimer(ctx.sync, stop=True)
    with random_weights(ctx.device), contextlib.suppress(_EndOfTraining):
        sft_trainer.train(config, callbacks=[timer])
    return timer


class _Rows(torch.utils.data.Dataset):
    def __init__(self, rows: list[dict[str, list[int]]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self.rows[i]


def _labels(e: Example) -> list[int]:
    labels = [t if m else -100 for t, m in zip(e.input_ids, e.loss_mask, strict=True)]
    labels[0] = -100
    return labels


def sft_baseline(ctx: Context, model_dir: Path, examples: Sequence[Example], out: Path,
                 steps: int, lora: bool) -> StepTimer:
    """The plain transformers Trainer a user would write: the same model (same seed), the same
    rows with assistant-only labels, bf16, gradient checkpointing, LoRA as drvenus's."""
    bf16 = ctx.precision == "bf16"
    model = build_random(model_dir, ctx.device, torch.bfloat16 if lora and bf16 else torch.float32)
    model.config.use_cache = False
    if lora:
        from peft import LoraConfig, get_peft_model

        model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
                                                 target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    rows = [{"input_ids": e.input_ids, "attention_mask": [1] * len(e), "labels": _labels(e)}
            for e in examples]
    kw: dict[str, Any] = {}
    names = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    if "train_sampling_strategy" in names:
        kw["train_sampling_strategy"] = "sequential"  # step i trains row i, as ours
    args = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=1, gradient_accumulation_steps=1,
        max_steps=steps, learning_rate=1e-5, bf16=bf16, use_cpu=not ctx.cuda,
        logging_steps=1, save_strategy="no", report_to="none", remove_unused_columns=False,
        dataloader_num_workers=0, disable_tqdm=True, seed=42, **checkpointing_args(), **kw)
    timer = StepTimer(ctx.sync)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Rows(rows),
                                   data_collator=transformers.default_data_collator,
                                   callbacks=[timer])
    trainer.train()
    return timer


# --------------------------------------------------------------------------- check 1


def check_sft_shape(ctx: Context) -> None:
    shape = TINY_QWEN3 if ctx.smoke else QWEN3_4B
    model_dir = model_folder(ctx.tmp / "qwen3-4b", shape, ctx.tokenizer_dir)
    tok = transformers.AutoTokenizer.from_pretrained(ctx.tokenizer_dir)
    lengths = sorted(int(x) for x in ctx.args.lengths.split(","))
    jobs: list[tuple[int, bool, bool]] = [(n, True, False) for n in lengths]  # length, lora, packed
    packed_at = max([n for n in lengths if n <= 8192] or lengths[:1])
    jobs += [(lengths[0], False, False), (packed_at, True, True)]
    last: tuple[float, float] | None = None  # (flops, seconds) of one of our steps, measured
    oom_at: int | None = None
    baseline_oom_at: int | None = None  # the full logits outgrow the GPU before ours does
    for i, (length, lora, packed) in enumerate(jobs):
        name = _tokens(length) + (", LoRA" if lora else ", all weights")
        name += ", packed rows" if packed else ""
        steps = ctx.args.steps if length < 65536 else max(2, ctx.args.steps - 1)
        seq = [length // 4] * 4 if packed else [length]
        need = 20.0 if ctx.smoke else 45.0
        if last is not None:
            need += 2.2 * steps * last[1] * train_flops(shape, seq, lora) / last[0]
        reserve = ctx.reserve_after(1)
        if lora and not packed and oom_at is not None and length > oom_at:
            skip(ctx, 1, name, f"{_tokens(oom_at)} already ran out of memory")
            continue
        if i and not ctx.budget.fits(need, reserve):
            skip(ctx, 1, name, f"budget: {ctx.budget.left():.0f} s left, needs ~{need:.0f} s "
                 f"(+{reserve:.0f} s kept for later checks)")
            continue
        row = ctx.report.add(Row(1, name))
        try:
            text = Text(1000 + length, tok)
            if packed:  # four rows a sequence
                convs = [fitting_trajectory(text, tok, length // 4) for _ in range(4 * steps)]
            else:  # one row a sequence, cut at the length
                convs = [trajectory(text, int(length * 1.1)) for _ in range(steps)]
            data = write_jsonl(ctx.tmp / f"sft-{length}-{int(lora)}{int(packed)}.jsonl",
                               [{"messages": c} for c in convs])
            baseline_oom = (baseline_oom_at if lora and baseline_oom_at is not None
                            and length > baseline_oom_at else None)
            measured, ours_status, base_status = sft_pair(ctx, row, shape, model_dir, data, tok,
                                                          length, steps, lora, packed,
                                                          baseline_oom)
        except Exception as exc:  # noqa: BLE001 - this row's data; the next row runs
            row.status, row.error = ("oom" if is_oom(exc) else "error"), _error(exc)
            ctx.report.done(row)
            continue
        if measured is not None:
            last = measured
        if ours_status == "oom" and lora and not packed:
            oom_at = length if oom_at is None else min(oom_at, length)
        if base_status == "oom" and lora and not packed:
            baseline_oom_at = length if baseline_oom_at is None else min(baseline_oom_at, length)


def _tokens(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def sft_pair(ctx: Context, row: Row, shape: dict[str, Any], model_dir: Path, data: Path,
             tok: Any, length: int, steps: int, lora: bool, packed: bool,
             baseline_oom_at: int | None = None
             ) -> tuple[tuple[float, float] | None, str, str | None]:
    """Ours, then (rows not packed, and the baseline not already out of memory at the shorter
    ``baseline_oom_at``) the baseline, into ``row``; returns (flops, seconds) of one of our
    steps (None if ours failed), our status and the baseline's (None if it did not run)."""
    kw: dict[str, Any] = {"over_length": "truncate", "packing": packed,
                          "train_after_end_of_turn": True}
    rows = [json.loads(line)["messages"] for line in data.read_text().splitlines()]
    sft = tokenize_dataset(rows, tok, length, **kw)  # what drvenus's run will train on
    seqs = [len(e) for e in sft.examples]
    seq_lens = [e.seq_lens for e in sft.examples]
    flops = statistics.mean(train_flops(shape, s, lora) for s in seq_lens)
    row.details.update({"sequences": seqs, "rows_per_sequence": [len(s) for s in seq_lens],
                        "trained_tokens": sft.stats.trained_tokens, "tokens": sft.stats.tokens,
                        "flops_per_step": flops, "steps": steps, "lora": lora, "packed": packed,
                        "loss_chunk_tokens": LOSS_CHUNK_TOKENS,
                        "shape": {k: v for k, v in shape.items() if k != "model_type"}})
    result: dict[str, Any] = {}

    def measure(which: str) -> Callable[[Row], None]:
        def part(r: Row) -> None:
            ctx.reset_peak()
            try:
                if which == "ours":
                    out = ctx.tmp / f"out-{len(ctx.report.rows)}-ours"
                    timer = sft_ours(ctx, model_dir, data, out, length, steps, lora, packed)
                else:
                    out = ctx.tmp / f"out-{len(ctx.report.rows)}-baseline"
                    timer = sft_baseline(ctx, model_dir, sft.examples, out, steps, lora)
            finally:
                result[f"{which}_peak_gib"] = ctx.peak_gib()
            timed = timer.timed()
            first = len(timer.times) - len(timed)
            tokens = statistics.mean(seqs[first:len(timer.times)] or seqs)
            step_s = statistics.mean(timed)
            result[which] = {"step_s": step_s, "tokens_s": tokens / step_s,
                             "mfu": flops / step_s / (ctx.matmul_tflops * 1e12),
                             "first_loss": timer.losses[0] if timer.losses else None,
                             "losses": timer.losses, "step_times": timer.times}
        return part

    def fill() -> None:
        ours, base = result.get("ours"), result.get("baseline")
        row.values = {
            "tokens/seq": round(statistics.mean(seqs)),
            "ours tok/s": ours and ours["tokens_s"],
            "baseline tok/s": base and base["tokens_s"],
            "ours / baseline": ours and base and ours["tokens_s"] / base["tokens_s"],
            "ours peak GiB": result.get("ours_peak_gib"),
            "baseline peak GiB": result.get("baseline_peak_gib"),
            "ours MFU": ours and ours["mfu"], "baseline MFU": base and base["mfu"],
            "ours 1st loss": ours and ours["first_loss"],
            "baseline 1st loss": base and base["first_loss"],
        }
        row.details.update({k: v for k, v in result.items()})

    ours_row = run_part(ctx, Row(1, f"{row.name}, ours"), measure("ours"), echo=False)
    fill()
    ctx.report.write()  # ours is on disk before the baseline starts
    base_row: Row | None = None
    if not packed and baseline_oom_at is None and ctx.budget.fits(20.0, ctx.reserve_after(1)):
        base_row = run_part(ctx, Row(1, f"{row.name}, baseline"), measure("baseline"),
                            echo=False)
    fill()
    notes: list[str] = []
    row.status, row.error = ours_row.status, ours_row.error
    if ours_row.error:
        row.details["ours_error"] = ours_row.error
        notes.append(f"ours: {ours_row.status}")
    if packed:
        notes.append("ours only (the plain Trainer has no packing)")
    elif base_row is None and baseline_oom_at is not None:
        notes.append(f"baseline skipped ({_tokens(baseline_oom_at)} already ran out of memory: "
                     "the full logits)")
    elif base_row is None:
        notes.append("baseline skipped (budget)")
    else:
        if base_row.status != "oom":  # the baseline alone out of memory: its full logits' limit
            row.status = _worse(ours_row.status, base_row.status)
            row.error = row.error or base_row.error
        if base_row.error:
            row.details["baseline_error"] = base_row.error
            notes.append(f"baseline: {base_row.status}")
        ours, base = result.get("ours"), result.get("baseline")
        if ours and base and ours["first_loss"] is not None and base["first_loss"] is not None:
            diff = abs(ours["first_loss"] - base["first_loss"])
            tol = 0.05 if ctx.precision == "bf16" else 1e-3
            row.details["first_loss_abs_diff"] = diff
            notes.append(f"1st losses {'agree' if diff <= tol else 'DIFFER'} (abs diff "
                         f"{diff:.2g}, tolerance {tol})")
    row.note = "; ".join(notes)
    row.seconds = round(ours_row.seconds + (base_row.seconds if base_row else 0.0), 2)
    ctx.report.done(row)
    measured = (flops, result["ours"]["step_s"]) if "ours" in result else None
    return measured, ours_row.status, base_row.status if base_row else None


def _worse(a: str, b: str) -> str:
    order = ["ok", "skipped", "oom", "error"]
    return max(a, b, key=lambda s: order.index(s) if s in order else 0)


# --------------------------------------------------------------------------- check 2


def tiny_inputs(ctx: Context) -> tuple[Path, Path, Path, str]:
    """The tiny model, its rows and the corpus of check 2, and a fingerprint of what decides
    the losses (weights, rows, tokenizer)."""
    folder = ctx.tmp / "check2"
    model, weights = saved_model(folder / "tiny", TINY_LLAMA, ctx.tokenizer_dir, seed=7)
    tok = transformers.AutoTokenizer.from_pretrained(ctx.tokenizer_dir)
    text = Text(7, tok)
    rows = write_jsonl(folder / "rows.jsonl",
                       [{"messages": trajectory(text, 200, tool_tokens=80)} for _ in range(12)])
    corpus = write_jsonl(folder / "corpus.jsonl", corpus_rows())
    digest = hashlib.sha256(weights.encode() + rows.read_bytes())
    for name in ("tokenizer.json", "chat_template.jinja"):
        if (ctx.tokenizer_dir / name).is_file():
            digest.update((ctx.tokenizer_dir / name).read_bytes())
    return model, rows, corpus, digest.hexdigest()[:16]


def sft_command(model: Path, rows: Path, out: Path, precision: str) -> list[str]:
    return [sys.executable, "-m", "drvenus", "sft", "--train", str(rows), "--model", str(model),
            "--output", str(out), "--max-length", "512", "--global-batch-size", "2",
            "--max-steps", "5", "--learning-rate", "0.001", "--warmup-ratio", "0",
            "--lr-scheduler", "constant", "--logging-steps", "1", "--save-steps", "1000",
            "--seed", "7", "--precision", precision, "--report-to", "none"]


def history_losses(out: Path) -> list[float]:
    rows = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    return [float(r["loss"]) for r in rows if "loss" in r][:5]


def start_cpu_reference(ctx: Context, model: Path, rows: Path) -> None:
    """``drvenus sft`` in a process that sees no GPU, started now (it runs on the CPU while the
    GPU works on check 1)."""
    out = ctx.tmp / "check2" / "cpu"
    threads = str(max(1, min(8, (os.cpu_count() or 2) // 2)))
    ctx.background["cpu_reference"] = launch(sft_command(model, rows, out, "fp32"),
                                             ctx.tmp / "check2" / "cpu.log", ctx.tmp,
                                             CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=threads)


def cpu_reference(ctx: Context, fingerprint: str) -> dict[str, Any]:
    """The CPU losses of the run :func:`start_cpu_reference` started (waited for)."""
    run = ctx.background.pop("cpu_reference", None)
    if run is None:
        raise RuntimeError("the CPU run did not start (see the log above)")
    code, output, seconds = run.finish(max(30.0, ctx.budget.left() - 20))
    if code != 0:
        raise RuntimeError(f"drvenus sft on the CPU exited {code}: {output[-2000:]}")
    return {"losses": history_losses(ctx.tmp / "check2" / "cpu"), "fingerprint": fingerprint,
            "seconds": seconds, "where": "this machine's CPU", "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}


def file_reference(ctx: Context, fingerprint: str) -> dict[str, Any]:
    """``--cpu-reference FILE`` (made with ``--write-cpu-reference``), checked to come from the
    same weights, rows and tokenizer."""
    ref = json.loads(Path(ctx.args.cpu_reference).read_text())
    if ref.get("fingerprint") != fingerprint:
        raise RuntimeError(f"{ctx.args.cpu_reference} was made from other inputs (fingerprint "
                           f"{ref.get('fingerprint')}, here {fingerprint}): another tokenizer?")
    return ref


@dataclasses.dataclass
class Launched:
    """A ``python -m drvenus ...`` child running, its output in ``log``."""

    proc: subprocess.Popen
    log: Path
    started: float

    def finish(self, timeout: float) -> tuple[int, str, float]:
        """Exit code, output and seconds (killed at ``timeout``)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
            code = -9
        return code, self.log.read_text(errors="replace"), time.perf_counter() - self.started


def launch(cmd: list[str], log_file: Path, cwd: Path, **env: str) -> Launched:
    with log_file.open("w") as fh:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, env=subprocess_env(**env), stdout=fh,
                                stderr=subprocess.STDOUT, cwd=cwd)
    return Launched(proc, log_file, time.perf_counter())


def check_cpu_gpu(ctx: Context, inputs: tuple[Path, Path, Path, str]) -> None:
    model, rows, corpus, fingerprint = inputs
    folder = ctx.tmp / "check2"
    ref: dict[str, Any] = {}
    runs: dict[str, Launched] = {}
    tolerance = {"fp32": 1e-3, "bf16": 2e-2}
    for precision in tolerance:  # both at once: the GPU has room for two tiny runs
        if ctx.budget.fits(20.0 if ctx.smoke else 35.0, ctx.reserve_after(2)):
            runs[precision] = launch(sft_command(model, rows, folder / precision, precision),
                                     folder / f"{precision}.log", ctx.tmp)

    def get_ref(r: Row) -> None:
        ref.update(cpu_reference(ctx, fingerprint))
        r.values = {"losses": ref["losses"]}
        r.details = {k: v for k, v in ref.items() if k != "losses"}
        r.note = f"drvenus sft on {ref['where']}, a process that sees no GPU"

    def get_file(r: Row) -> None:
        other = file_reference(ctx, fingerprint)
        r.values = {"losses": other["losses"]}
        r.details = {k: v for k, v in other.items() if k != "losses"}
        r.note = (f"{ctx.args.cpu_reference}: torch {other.get('torch')}, transformers "
                  f"{other.get('transformers')}")
        if ref.get("losses"):
            diffs = [abs(a - b) / max(abs(b), 1e-9)
                     for a, b in zip(other["losses"], ref["losses"], strict=False)]
            r.values["max rel diff vs this CPU"] = max(diffs, default=math.inf)
        else:  # no CPU run here: the file is the reference
            ref.update(other)

    def compare(precision: str) -> Callable[[Row], None]:
        def part(r: Row) -> None:
            code, output, seconds = runs[precision].finish(max(60.0, ctx.budget.left()))
            r.details["command_s"] = seconds
            if code != 0:
                raise RuntimeError(f"drvenus sft --precision {precision} exited {code}: "
                                   f"{output[-2000:]}")
            losses = history_losses(folder / precision)
            r.values = {"losses": losses}
            if not ref.get("losses"):
                r.note = "no CPU reference to compare with"
                return
            cpu, tol = ref["losses"], tolerance[precision]
            diffs = [abs(a - b) / max(abs(b), 1e-9) for a, b in zip(losses, cpu, strict=False)]
            worst = max(diffs) if diffs else math.inf
            agree = len(losses) == len(cpu) == 5 and worst <= tol
            r.values |= {"max rel diff vs CPU": worst, "agree": agree}
            r.note = f"tolerance {tol} relative"
            if not agree:
                r.status = "error"
                r.error = {"type": "Mismatch", "message": f"losses {losses} vs CPU {cpu}",
                           "traceback": ""}
        return part

    run_part(ctx, ctx.report.add(Row(2, "CPU reference, fp32")), get_ref)
    if ctx.args.cpu_reference:
        run_part(ctx, ctx.report.add(Row(2, "CPU reference from a file")), get_file)
    asking: Launched | None = None
    final = folder / "fp32" / "final"
    for precision in tolerance:
        name = f"{ctx.device.upper()} {precision} vs CPU"
        if precision not in runs:
            skip(ctx, 2, name, f"budget: {ctx.budget.left():.0f} s left")
            continue
        run_part(ctx, ctx.report.add(Row(2, name)), compare(precision))
        if precision == "fp32" and final.is_dir():  # asks while the bf16 run finishes
            cmd = [sys.executable, "-m", "drvenus", "ask", "Who wrote Frankenstein?", "--model",
                   str(final), "--corpus", str(corpus), "--max-steps", "1", "--time-limit", "60",
                   "--no-constrained", "--json"]
            asking = launch(cmd, folder / "ask.log", ctx.tmp, DRVENUS_N_CTX="640",
                            OMP_NUM_THREADS="1", DRVENUS_CACHE_DIR=str(ctx.tmp / "cache"))
    if asking is None:
        skip(ctx, 2, "drvenus ask --model final/", "no checkpoint (the fp32 run did not finish)")
        return

    def ask(r: Row) -> None:
        code, output, seconds = asking.finish(max(90.0, min(240.0, ctx.budget.left())))
        record: dict[str, Any] = {}
        for line in reversed(output.splitlines()):  # the record is the one JSON line
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    break
        r.values = {"exit": code, "termination": record.get("termination"),
                    "answer": str(record.get("prediction") or "")[:40] or None,
                    "completion tokens": (record.get("usage") or {}).get("completion_tokens"),
                    "command s": seconds}
        r.details = {"output_tail": output[-1500:], "record_keys": sorted(record)}
        if code not in (0, 1) or not record or "Traceback" in output:
            raise RuntimeError(f"drvenus ask exited {code}: {output[-1500:]}")
        r.note = "random tiny model: the answer is noise; the check is that it loads and runs"

    run_part(ctx, ctx.report.add(Row(2, "drvenus ask --model final/")), ask)


def write_cpu_reference(args: argparse.Namespace) -> int:
    """``--write-cpu-reference FILE``: check 2's CPU losses, computed here, for a GPU run's
    ``--cpu-reference FILE`` (with the same tokenizer)."""
    with tempfile.TemporaryDirectory(prefix="bench-gpu-ref-") as tmp_name:
        tmp = Path(tmp_name)
        tok_dir, tok_name = find_tokenizer(args, tmp)
        ctx = Context(args, True, "cpu", "fp32", tok_dir, tmp, Report(tmp / "report", {}),
                      Budget(args.budget_s), [2])
        model, rows, _, fingerprint = tiny_inputs(ctx)
        start_cpu_reference(ctx, model, rows)
        ref = cpu_reference(ctx, fingerprint) | {"tokenizer": tok_name,
                                                 "where": f"the CPU of {platform.node()}"}
        Path(args.write_cpu_reference).write_text(json.dumps(ref, indent=2) + "\n")
        print(f"CPU reference losses {ref['losses']} (fingerprint {fingerprint}) -> "
              f"{args.write_cpu_reference}")
    return 0


# --------------------------------------------------------------------------- check 3


def recipe_data(ctx: Context) -> tuple[Path, Path, str]:
    """SFT rows and RL questions: the recipe's own (``--recipe-data``), else recipe-like."""
    given = ctx.args.recipe_data or (PREPARED / "recipe" if (PREPARED / "recipe").is_dir()
                                     else None)
    if given:
        base = Path(given)
        sft = next((p for p in (base / "clean" / "cleaned_resampled.parquet",
                                base / "clean" / "cleaned_resampled.jsonl") if p.is_file()), None)
        rl = base / "rl" / "train-rl.jsonl"
        if sft is not None and rl.is_file():
            return sft, rl, f"the recipe's data ({base})"
        log.warning("%s has no clean/cleaned_resampled.* and rl/train-rl.jsonl: recipe-like "
                    "rows instead", base)
    tok = transformers.AutoTokenizer.from_pretrained(ctx.tokenizer_dir)
    text = Text(17, tok)
    n = 4 * ctx.args.recipe_sft_steps + 4
    size = 200 if ctx.smoke else 1360  # the recipe's trajectories average ~1,360 tokens
    sft = write_jsonl(ctx.tmp / "recipe" / "sft.jsonl",
                      [{"messages": trajectory(text, size, tool_tokens=size // 3)}
                       for _ in range(n)])
    rl = write_jsonl(ctx.tmp / "recipe" / "rl.jsonl",
                     [{"id": str(i), "question": q, "answer": a}
                      for i, (q, a) in enumerate(QUESTIONS)])
    return sft, rl, f"recipe-like: {n} synthetic trajectories of ~{size} tokens, 4 questions"


def check_recipe(ctx: Context) -> None:
    shape = TINY_LLAMA if ctx.smoke else SMOLLM2_135M
    folder = ctx.tmp / "recipe"
    base, _ = saved_model(folder / "smollm2-135m", shape, ctx.tokenizer_dir, seed=17)
    sft_file, rl_file, what = recipe_data(ctx)
    corpus = write_jsonl(folder / "corpus.jsonl", corpus_rows())
    sft_out = folder / "sft"
    sft_result: dict[str, Any] = {}

    def sft(r: Row) -> None:
        overrides: dict[str, Any] = {"train": str(sft_file), "model": str(base),
                                     "output": str(sft_out),
                                     "max_steps": ctx.args.recipe_sft_steps, "report_to": "none",
                                     "logging_steps": 1}
        if ctx.smoke:  # bf16 autocast is slow on a CPU without native bf16
            overrides |= {"max_length": 512, "precision": "fp32"}
        config = load_sft_config(ROOT / "recipes" / "embedded" / "sft.yaml", **overrides)
        timer = StepTimer(ctx.sync)
        start = time.perf_counter()
        result = sft_trainer.train(config, callbacks=[timer])
        wall = time.perf_counter() - start
        stats = result.data_stats["train"]
        rows_per_step = config.global_batch_size
        tokens_per_row = stats["tokens"] / max(1, stats["kept"])
        step_s = statistics.mean(timer.timed())
        tokens_s = rows_per_step * tokens_per_row / step_s
        sft_result.update(step_s=step_s, tokens_s=tokens_s)
        r.values = {"s/step": step_s, "CPU s/step (docs)": CPU_RECIPE_SFT_S_PER_STEP,
                    "x CPU": CPU_RECIPE_SFT_S_PER_STEP / step_s, "tokens/s": tokens_s,
                    "recipe SFT est. s": RECIPE_SFT_TOKENS / tokens_s,
                    "losses": timer.losses[:3] + timer.losses[-1:]}
        r.details = {"steps": result.global_step, "wall_s": wall, "step_times": timer.times,
                     "data": what, "data_stats": stats, "peak_gib": ctx.peak_gib(),
                     "shape": {k: v for k, v in shape.items() if k != "model_type"}}
        r.note = (f"recipes/embedded/sft.yaml (LoRA r16, {config.precision}, "
                  f"{config.global_batch_size} x <={config.max_length} tokens a step; step "
                  f"times leave out checkpoints and validation), random weights; {what}")

    ctx.reset_peak()
    run_part(ctx, ctx.report.add(Row(3, "SFT, recipes/embedded/sft.yaml")), sft)
    final = sft_out / "final"
    if not final.is_dir():
        skip(ctx, 3, "IGPO, recipes/embedded/rl.yaml", "no SFT adapter (the SFT part failed)")
        return
    if not ctx.budget.fits(30.0 if ctx.smoke else 60.0, ctx.reserve_after(3)):
        skip(ctx, 3, "IGPO, recipes/embedded/rl.yaml", f"budget: {ctx.budget.left():.0f} s left")
        return

    def rl(r: Row) -> None:
        from drvenus.train.rl.config import load_config as load_rl_config
        from drvenus.train.rl.trainer import train as rl_train

        out = folder / "rl"
        overrides: dict[str, Any] = {
            "train": str(rl_file), "model": str(final), "output": str(out),
            "corpus": str(corpus), "total_steps": ctx.args.rl_steps, "save_freq": 1000,
            "trace_save_interval": 0, "logger": "none", "current_date": "2026-12-01",
            "rollout_time_limit": 30.0 if ctx.smoke else 90.0}  # a step's time stays bounded
        if ctx.smoke:
            overrides |= {"n_rollouts": 2, "batch_size": 1, "max_turns": 2,
                          "max_response_len": 16, "max_model_len": 2048,
                          "rollout_concurrency": 2}
        config = load_rl_config(ROOT / "recipes" / "embedded" / "rl.yaml", **overrides)
        started: list[float] = []

        def on_step(step: int, trajectories: int) -> None:
            now = time.perf_counter()
            if started:  # stop when the next step would not fit
                per = (now - started[0]) / (step - 1)
                if not ctx.budget.fits(1.3 * per, ctx.reserve_after(3)):
                    raise _EndOfTraining(f"budget: stopped before step {step}")
            else:
                started.append(now)
            return None

        ctx.reset_peak()
        stopped = ""
        try:
            rl_train(config, on_step=on_step)
        except _EndOfTraining as exc:
            stopped = str(exc)
        metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        if not metrics:
            raise RuntimeError(f"no IGPO step finished ({stopped or 'no metrics'})")
        step_s = [m["time/step_s"] for m in metrics]
        per = statistics.mean(step_s[1:] or step_s)
        r.values = {"steps": len(metrics), "s/step": per,
                    "CPU s/step (docs)": CPU_RECIPE_RL_S_PER_STEP,
                    "x CPU": CPU_RECIPE_RL_S_PER_STEP / per,
                    "rollout s": statistics.mean(m.get("time/rollout_s", 0.0) for m in metrics),
                    "recipe RL est. s": RECIPE_RL_STEPS * per}
        if sft_result:
            est = RECIPE_SFT_TOKENS / sft_result["tokens_s"] + RECIPE_RL_STEPS * per
            r.values["SFT + RL est. min"] = est / 60
        r.details = {"metrics": metrics, "peak_gib": ctx.peak_gib(), "stopped": stopped,
                     "config": {k: overrides[k] for k in sorted(overrides)}}
        r.note = (f"{config.batch_size} questions x {config.n_rollouts} rollouts, transformers "
                  f"engine, random-weight policy (its turns are noise: rollouts run to their "
                  f"limits); the estimate leaves out the data build and the evaluation"
                  + (f"; {stopped}" if stopped else ""))

    run_part(ctx, ctx.report.add(Row(3, "IGPO, recipes/embedded/rl.yaml")), rl)


# --------------------------------------------------------------------------- check 4


def ig_trajectory(tok: Any, tokens: int, turns: int, seed: int) -> tuple[list[int], list[int]]:
    """Token ids of a ChatML trajectory of about ``tokens`` tokens and the offset before each
    of its ``turns`` assistant turns (generation header included)."""
    text = Text(seed, tok)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids = enc("<|im_start|>system\n" + text.words(text.n_words(200)) + "<|im_end|>\n"
              "<|im_start|>user\n" + text.words(text.n_words(20)) + "?<|im_end|>\n")
    per_turn = max(8, (tokens - len(ids)) // turns)
    bounds: list[int] = []
    for _ in range(turns):
        ids += enc("<|im_start|>assistant\n")
        bounds.append(len(ids))
        ids += enc(text.words(text.n_words(per_turn // 6)) + "<|im_end|>\n")
        ids += enc("<|im_start|>user\n<tool_response>\n"
                   + text.words(text.n_words(per_turn * 5 // 6)) + "\n</tool_response><|im_end|>\n")
    return ids[:tokens], [b for b in bounds if b < tokens]


def check_ig(ctx: Context) -> None:
    from drvenus.train.rl.ig import boundary_scores, pseudo_answer

    shape = TINY_QWEN3 if ctx.smoke else QWEN3_4B
    tokens = 512 if ctx.smoke else 32768
    model_dir = model_folder(ctx.tmp / "ig-model", shape, ctx.tokenizer_dir)
    tok = transformers.AutoTokenizer.from_pretrained(ctx.tokenizer_dir)
    ids, bounds = ig_trajectory(tok, tokens, 5 if ctx.smoke else 30, seed=4)
    pseudo, span = pseudo_answer(tok, "Mary Shelley")
    dtype = torch.bfloat16 if ctx.precision == "bf16" else torch.float32
    holder: dict[str, Any] = {}
    results: dict[str, dict[str, Any]] = {}

    def load(r: Row) -> None:
        holder["model"] = build_random(model_dir, ctx.device, dtype).eval()
        holder["x"] = torch.tensor([ids], device=ctx.device)
        with torch.no_grad():  # warm-up: kernels chosen, allocator primed
            holder["model"](input_ids=holder["x"][:, :256], use_cache=False, logits_to_keep=1)
        ctx.sync()
        r.values = {"tokens": len(ids), "boundaries": len(bounds)}
        r.details = {"weights_gib": sum(p.numel() * p.element_size()
                                        for p in holder["model"].parameters()) / 2**30}

    run_part(ctx, ctx.report.add(Row(4, "model and trajectory")), load)
    if "model" not in holder:
        return
    model, x = holder["model"], holder["x"]

    def measure(mode: str) -> Callable[[Row], None]:
        def part(r: Row) -> None:
            ctx.reset_peak()
            base = torch.cuda.memory_allocated() if ctx.cuda else 0
            scores: dict[int, float | None] = {}
            start = time.perf_counter()
            with torch.no_grad():
                if mode == "prefill":
                    model(input_ids=x, use_cache=False, logits_to_keep=1)
                elif mode == "forward":
                    model(input_ids=x, use_cache=False)
                elif mode in ("kv", "kv-one-chunk"):
                    chunk = len(ids) if mode == "kv-one-chunk" else None
                    scores = boundary_scores(model, ids, bounds, pseudo, span, chunk_size=chunk)
                else:
                    import bench_ig

                    scores, _ = bench_ig.vllm_scores(model, ids, bounds, pseudo, span,
                                                     prefix_caching=True)
            ctx.sync()
            seconds = time.perf_counter() - start
            peak = ctx.peak_gib()
            extra = None if peak is None else peak - base / 2**30
            results[mode] = {"seconds": seconds, "scores": scores}
            floor = results.get("prefill", {}).get("seconds")
            r.values = {"seconds": seconds, "x last-token forward": floor and seconds / floor,
                        "peak GiB over weights": extra}
            ref = results.get("kv", {}).get("scores")
            if scores and ref and mode != "kv":
                common = [k for k in ref if ref[k] is not None and scores.get(k) is not None]
                r.values["max abs score diff vs ours"] = max(
                    (abs(ref[k] - scores[k]) for k in common), default=None)
            if mode == "kv":
                r.values["scored"] = sum(v is not None for v in scores.values())
        return part

    labels = {"prefill": "one forward, last-token logits only (the floor)",
              "forward": "one forward, full logits",
              "kv": "ours: KV cache in chunks of 8,192, pseudo answer per boundary",
              "kv-one-chunk": "ours, the cache built in one forward",
              "vllm-apc": "baseline: vLLM-style prompt_logprobs per boundary, prefix cache"}
    for mode, label in labels.items():
        if mode != "prefill" and not ctx.budget.fits(5.0 if ctx.smoke else 15.0):
            skip(ctx, 4, label, f"budget: {ctx.budget.left():.0f} s left")
            continue
        run_part(ctx, ctx.report.add(Row(4, label)), measure(mode))
    holder.clear()


# --------------------------------------------------------------------------- main


def versions() -> dict[str, str]:
    out = {"torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version()}
    for name in ("accelerate", "peft"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - shown as missing
            out[name] = "missing"
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="folder for gpu.json and gpu.md")
    p.add_argument("--smoke", action="store_true",
                   help="the same code on the CPU with tiny shapes (seconds)")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="seconds for all checks; parts that would not fit are skipped")
    p.add_argument("--only", default="1,2,3,4", help="checks to run, e.g. 2,4")
    p.add_argument("--lengths", default=None,
                   help="check 1's tokens a row (default 8192,32768,65536,131072; smoke 128,256)")
    p.add_argument("--steps", type=int, default=None,
                   help="check 1's optimizer steps a run, the first not timed (default 3)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer folder (default: .gpu/tokenizer, the embedded GGUF's when "
                   "present, else a byte-level one; 'byte' forces that)")
    p.add_argument("--cpu-reference", default=None,
                   help="check 2's CPU losses from this JSON (--write-cpu-reference) instead of "
                   "a CPU run on this machine")
    p.add_argument("--write-cpu-reference", default=None,
                   help="only compute check 2's CPU losses and write them to this JSON")
    p.add_argument("--recipe-data", default=None,
                   help="check 3: a recipes/embedded/build_data.py output folder (default: "
                   ".gpu/recipe if present, else recipe-like rows)")
    p.add_argument("--recipe-sft-steps", type=int, default=None,
                   help="check 3's SFT steps (default 50; smoke 2)")
    p.add_argument("--rl-steps", type=int, default=None,
                   help="check 3's IGPO steps (default 3; smoke 1)")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="checks 1 and 4 (auto: bf16 on a GPU, fp32 on the CPU)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="run the full shapes without a GPU (hours; for debugging)")
    args = p.parse_args(argv)
    if not args.out and not args.write_cpu_reference:
        p.error("--out is required")
    args.lengths = args.lengths or ("128,256" if args.smoke else "8192,32768,65536,131072")
    args.steps = args.steps or (2 if args.smoke else 3)
    args.recipe_sft_steps = args.recipe_sft_steps or (2 if args.smoke else 50)
    args.rl_steps = args.rl_steps or (1 if args.smoke else 3)
    return args


def _quiet() -> None:
    """No per-step log dicts, progress bars or deprecation notices from the libraries: the
    table stays readable in the tail of a device run's output (the losses are in gpu.json)."""
    import warnings

    os.environ.setdefault("TQDM_DISABLE", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with contextlib.suppress(Exception):
        import huggingface_hub

        huggingface_hub.utils.disable_progress_bars()
    from transformers import trainer_callback

    for name in ("PrinterCallback", "ProgressCallback"):
        cls = getattr(trainer_callback, name, None)
        if cls is not None:
            cls.on_log = lambda self, *a, **k: None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _quiet()
    if args.write_cpu_reference:
        return write_cpu_reference(args)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke and not args.allow_cpu:
        print("no CUDA device: run with --smoke (tiny shapes on the CPU) or on a GPU machine",
              file=sys.stderr)
        return 2
    checks = sorted({int(c) for c in args.only.split(",") if c.strip()} & set(CHECKS))
    budget = Budget(args.budget_s)
    device = "cuda" if cuda and not args.smoke else "cpu"
    meta: dict[str, Any] = {
        "mode": "smoke" if args.smoke else "full", "budget_s": args.budget_s, "checks": checks,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else
        f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)",
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv[1:],
        "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "complete": False, **versions()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        meta |= {"gpu_memory_gib": props.total_memory / 2**30,
                 "capability": f"{props.major}.{props.minor}",
                 "multiprocessors": props.multi_processor_count}
    report = Report(args.out, meta)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp_name:
        tmp = Path(tmp_name)
        tok_dir, tok_name = find_tokenizer(args, tmp)
        meta["tokenizer"] = tok_name
        precision = args.precision if args.precision != "auto" else (
            "bf16" if device == "cuda" else "fp32")
        meta["precision"] = precision
        ctx = Context(args, args.smoke, device, precision, tok_dir, tmp, report, budget, checks)
        ctx.matmul_tflops, meta["matmul_what"] = matmul_tflops(device, args.smoke)
        meta["matmul_tflops"] = ctx.matmul_tflops
        print(f"bench_gpu: {meta['device']}; torch {meta['torch']}, transformers "
              f"{meta['transformers']}; matmul {_fmt(ctx.matmul_tflops)} TFLOP/s; tokenizer "
              f"{tok_name}; checks {checks}; budget {args.budget_s:.0f} s", flush=True)
        report.write()
        inputs = None
        if 2 in checks:
            with contextlib.suppress(Exception):  # a failure shows in check 2's own row
                inputs = tiny_inputs(ctx)
                start_cpu_reference(ctx, inputs[0], inputs[1])
        try:
            for check in checks:
                if budget.left() <= 5:
                    skip(ctx, check, CHECKS[check], "budget spent")
                    continue
                print(f"== check {check}: {CHECKS[check]} ({budget.left():.0f} s left)",
                      flush=True)
                whole = Row(check, CHECKS[check])
                if check == 1:
                    run_part(ctx, whole, lambda r: check_sft_shape(ctx), echo=False)
                elif check == 2:
                    def two(r: Row, inputs: Any = inputs) -> None:
                        check_cpu_gpu(ctx, inputs or tiny_inputs(ctx))
                    run_part(ctx, whole, two, echo=False)
                elif check == 3:
                    run_part(ctx, whole, lambda r: check_recipe(ctx), echo=False)
                else:
                    run_part(ctx, whole, lambda r: check_ig(ctx), echo=False)
                if whole.status != "ok":  # the check itself broke (its parts record their own)
                    report.add(whole)
                    report.done(whole)
        finally:
            for run in ctx.background.values():  # a check that did not wait for its child
                with contextlib.suppress(Exception):
                    run.proc.kill()
                    run.proc.wait(timeout=10)
            meta["spent_s"] = budget.spent()
            meta["complete"] = True
            report.write()
    print()
    print(report.markdown(), flush=True)
    bad = [r for r in report.rows if r.status == "error"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
