"""``drvenus index``: build and inspect local search indexes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from drvenus.cli.common import CheckedGroup, fail, known_errors, out

index_app = typer.Typer(cls=CheckedGroup, help="Build and inspect local search indexes.",
                        no_args_is_help=True)


@index_app.command("build")
def index_build(
    corpus: Annotated[
        Path | None,
        typer.Argument(help="JSONL or parquet corpus (id,title,url,text). Omit: built-in corpus."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if cached.")] = False,
    text_field: Annotated[str, typer.Option(help="Column holding the page text.")] = "text",
    title_field: Annotated[str, typer.Option(help="Column holding the title.")] = "title",
    url_field: Annotated[str, typer.Option(help="Column holding the URL.")] = "url",
    id_field: Annotated[str, typer.Option(help="Column holding the id.")] = "id",
    retrieval: Annotated[str | None, typer.Option(
        help="bm25, or hybrid: also build the article vectors of hybrid search (pip install "
             "'drvenus[dense]'). Default: hybrid for the built-in corpus when installed.")] = None,
) -> None:
    """Build (or reuse) the search index of a corpus and say where it is."""
    from drvenus.corpus import CorpusIndex, build_index
    from drvenus.corpus.dense import use_hybrid

    if retrieval not in (None, "bm25", "hybrid"):
        raise fail(f"--retrieval must be bm25 or hybrid, not {retrieval!r}")
    dense = use_hybrid(retrieval, corpus)
    field_map = {"text": text_field, "title": title_field, "url": url_field, "id": id_field}
    field_map = {k: v for k, v in field_map.items() if k != v}
    try:
        info = build_index(corpus, field_map=field_map or None, force=force, progress=True)
    except known_errors() as exc:
        raise fail(exc) from None
    state = "reused cached index" if info.cache_hit else "built index"
    out.print(
        f"[green]{state}[/]: {info.doc_count} documents · {info.path} "
        f"[dim]({info.build_seconds:.1f}s)[/]"
    )
    if dense:
        try:
            CorpusIndex(info.path, dense=True)
        except known_errors() as exc:
            raise fail(exc) from None
        out.print(f"[green]hybrid search ready[/]: article vectors in {info.path / 'dense'}")


__all__ = ["index_app"]
