"""The scratch file of ``drvenus data clean``: the valid rows of stages 1-5 as an Arrow IPC file,
read back by stages 6-8 memory-mapped, without ever holding more than a bounded part of it.

Reading a memory-mapped file copies nothing, but every page touched stays resident (and counts
in the process's RSS) until the mapping goes away: the final write walks the rows in resample
order, so by its end the whole file (7 GB at 100,000 raw rows) would be resident. The mapping
here is a Python :class:`mmap.mmap` wrapped as a pyarrow buffer, so that :meth:`ValidRows.release`
can tell the kernel (``madvise(MADV_DONTNEED)``) to drop the pages touched so far; a later read of
them faults them back in from the page cache, with the same content. Every reader of the file
releases as it goes: a sequential scan every :data:`RELEASE_EVERY_BATCHES` batches, the final
write after each part it writes.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import pyarrow as pa

log = logging.getLogger(__name__)

RELEASE_EVERY_BATCHES = 64
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)


class ValidRows:
    """The valid-row scratch file, memory-mapped (a context manager).

    ``batches`` are the file's record batches (zero-copy views of the mapping); ``num_rows`` is
    their total. :meth:`scan` reads chosen columns in file order, :meth:`table` gives them as one
    zero-copy table, :meth:`release` drops the resident pages.
    """

    def __init__(self, path: Path):
        self.path = path
        self._fh = path.open("rb")
        self._map = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ)
        reader = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(self._map)))
        self.schema: pa.Schema = reader.schema
        self.batches: list[pa.RecordBatch] = [
            b for b in (reader.get_batch(i) for i in range(reader.num_record_batches))
            if b.num_rows
        ]
        self.num_rows = sum(b.num_rows for b in self.batches)
        self.releases = 0

    def __enter__(self) -> ValidRows:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def release(self) -> None:
        """Drop the mapping's resident pages (content unchanged; they are read again on use)."""
        if _DONTNEED is not None and not self._map.closed:
            self._map.madvise(_DONTNEED)
            self.releases += 1

    def scan(self, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        """``columns`` of every batch, in file order, releasing pages as it goes."""
        for k, batch in enumerate(self.batches, 1):
            yield batch.select(list(columns))
            if k % RELEASE_EVERY_BATCHES == 0:
                self.release()
        self.release()

    def table(self, columns: Sequence[str]) -> pa.Table:
        """``columns`` of all rows as one table of zero-copy chunks (only those pages are read
        when it is used; call :meth:`release` once done with it)."""
        cols = list(columns)
        return pa.Table.from_batches([b.select(cols) for b in self.batches],
                                     schema=pa.schema([self.schema.field(c) for c in cols]))

    def close(self) -> None:
        """Unmap (once no pyarrow view of the mapping is left; else when the last one goes)."""
        self.batches = []
        if not self._map.closed:
            try:
                self._map.close()
            except BufferError:  # a view still exported: unmapped when it is collected
                log.debug("scratch mapping still in use; it is unmapped when freed")
        self._fh.close()
