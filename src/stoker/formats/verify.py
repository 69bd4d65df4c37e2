"""Checking a dataset end to end before a long run (``stoker verify``).

Every block's record is read from storage as a reader would read it and checked
against the checksum in the block index; by default it is also decoded and held to
what the manifest says of it, as every reader does: a token block's length, the
vocabulary, its document starts, its first token
(:meth:`~stoker.formats.tokens.TokenSource.decode`); a records block's schema and rows
(:meth:`~stoker.formats.records.RecordSource.decode`). Unlike a reader, a bad block does not stop the check: every one is
reported, with its file and byte range, so that a damaged copy can be repaired in
one pass. The manifest, the block index and a dictionary are checked on opening
(a bad one raises the same typed error a reader would get).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stoker.errors import DatasetError, StorageError
from stoker.formats.codec import checksum
from stoker.formats.kinds import open_source

if TYPE_CHECKING:
    from stoker.formats.records import RecordSource
    from stoker.formats.tokens import TokenSource


@dataclass(frozen=True)
class BadBlock:
    """A block that failed the check: where it is and why."""

    block: int
    file: str  # the URL of the block's file
    byte_range: tuple[int, int]  # [start, stop) of its record in that file
    reason: str

    def __str__(self) -> str:
        start, stop = self.byte_range
        return f"{self.file}: block {self.block} (bytes [{start}, {stop})): {self.reason}"


@dataclass
class VerifyReport:
    """What :func:`verify` found."""

    url: str
    blocks: int  # blocks checked
    bytes: int  # bytes of records read
    seconds: float
    decoded: bool  # the records were decoded and held to the manifest too
    bad: list[BadBlock] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.bad


#: Called after each block with (blocks checked, bytes read) so far.
Progress = Callable[[int, int], None]


def verify(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    decode: bool = True,
    workers: int = 4,
    progress: Progress | None = None,
    source: TokenSource | RecordSource | None = None,
) -> VerifyReport:
    """Check every block of the dataset (tokens or records) at ``url`` (see the module's
    docstring).

    ``workers`` blocks are read (and decoded) at a time; ``source``: the dataset at ``url``
    already opened (else it is opened here). Raises what opening the
    dataset raises (:class:`~stoker.errors.ManifestError`,
    :class:`~stoker.errors.ChecksumError` for a dictionary, storage errors); a bad
    block is reported in the result, not raised.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    t0 = time.perf_counter()
    src = source if source is not None else open_source(url, storage_options)
    m = src.manifest
    report = VerifyReport(src.url, 0, 0, 0.0, decode)

    def check(block: int) -> tuple[int, BadBlock | None]:
        entry = src.index[block]
        ref = m.block_file(block)
        start = int(entry["offset"])
        if "nbytes" in entry.dtype.names:  # a records block: one Arrow IPC stream
            stop = start + int(entry["nbytes"])
        else:  # a token block: its tokens and document-starts frames
            stop = start + int(entry["token_bytes"]) + int(entry["bounds_bytes"])
        where = (block, src.storage.url_of(ref.path), (start, stop))
        try:
            data = src.storage.read_range(ref.path, start, stop)
        except StorageError as exc:
            return 0, BadBlock(*where, f"unreadable ({exc})")
        if len(data) != stop - start:
            return len(data), BadBlock(*where, f"{len(data)} bytes read, {stop - start} expected")
        got, want = checksum(data), int(entry["xxh64"])
        if got != want:
            return len(data), BadBlock(
                *where, f"checksum mismatch (xxh64 {got:016x}, the index says {want:016x})"
            )
        if decode:
            try:
                src.decode(block, data)
            except DatasetError as exc:
                return len(data), BadBlock(*where, str(exc))
        return len(data), None

    pending: deque[Future[tuple[int, BadBlock | None]]] = deque()
    with ThreadPoolExecutor(workers, thread_name_prefix="stoker-verify") as pool:
        blocks = iter(range(m.num_blocks))
        while True:
            while len(pending) < 2 * workers:  # a bounded window, in block order
                block = next(blocks, None)
                if block is None:
                    break
                pending.append(pool.submit(check, block))
            if not pending:
                break
            nbytes, bad = pending.popleft().result()
            report.blocks += 1
            report.bytes += nbytes
            if bad is not None:
                report.bad.append(bad)
            if progress is not None:
                progress(report.blocks, report.bytes)
    report.seconds = time.perf_counter() - t0
    return report
