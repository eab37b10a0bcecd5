"""Official texts, loaded at run time from pinned sources and never copied into drvenus.

Exact reproduction needs other projects' words: DR-Venus's system prompt and notices, the
benchmarks' grader templates. drvenus holds none of them. :mod:`.sources` pins each official
repository to one commit and each file it reads to a SHA-256; :mod:`.store` finds the file (a
local checkout under ``DRVENUS_REFERENCE_DIR``, else the cache, else a download over HTTPS into
the cache) and refuses any file whose hash differs; :mod:`.extract` takes the strings out of the
Python source by parsing it (:mod:`ast`), never by running it.
"""

from drvenus.reference.sources import SOURCES, Source, source
from drvenus.reference.store import (
    ReferenceError,
    ReferenceStore,
    ReferenceUnreachable,
    reference_store,
)

__all__ = ["SOURCES", "ReferenceError", "ReferenceStore", "ReferenceUnreachable", "Source",
           "reference_store", "source"]
