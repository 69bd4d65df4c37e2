"""What the node agent keeps in its memory tier of each kind of dataset: one class per
kind, the seam between the agent's tiers (which only move bytes) and the formats.

Each view has a ``key`` (what the memory tier, the plans and the pins name it by), the
``source`` its stored blocks come from (through the disk tier), the room a block is
given before it loads (:meth:`size`; an estimate where it cannot be known before, and
then :meth:`write` says what it took) and the file of a loaded block.

* :class:`TokenBlocks`: a token block decoded (tokens and document starts,
  :mod:`stoker.cache.layout`).
* :class:`RecordBlocks`: a records block's stored bytes, verified: one fetch per node.
* :class:`HeldImages`: a records block's images decoded (:mod:`stoker.records.held`):
  one decode per node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stoker._proto import agent_pb2 as pb
from stoker.cache.layout import decoded_size, write_decoded, write_parts
from stoker.observe.agent import Counters


class TokenBlocks:
    """A token dataset's blocks, decoded."""

    suffix = ".tok"

    def __init__(self, source: Any) -> None:
        self.source = source
        m = source.manifest
        self.id: str = m.dataset_id
        self.key: str = m.dataset_id
        self.num_blocks = m.num_blocks
        self.itemsize = m.np_dtype.itemsize

    def size(self, block: int) -> int:
        starts = int(self.source.index[block]["doc_starts"])
        return decoded_size(self.source.manifest.block_len(block), self.itemsize, starts)

    def write(self, block: int, record: bytes, path: Path, counters: Counters) -> int:
        toks, starts = self.source.decode(block, record)
        counters.add("decodes")
        write_decoded(path, toks, starts)
        return self.size(block)

    def reply(self, block: int, path: str = "", record: bytes = b"") -> pb.Block:
        n = self.source.manifest.block_len(block)
        return pb.Block(path=path, tokens=n, record=record, pinned=bool(path))


class RecordBlocks:
    """A records dataset's blocks as stored (verified, and checked to read as Arrow)."""

    suffix = ".arrow"

    def __init__(self, source: Any, view: Any) -> None:
        self.source, self.view = source, view
        self.id: str = source.manifest.dataset_id
        self.key: str = view.key(self.id)
        self.num_blocks = source.manifest.num_blocks

    def size(self, block: int) -> int:
        return int(self.source.index[block]["nbytes"])

    def write(self, block: int, record: bytes, path: Path, counters: Counters) -> int:
        self.source.decode(block, record)  # (a block that does not read is named here)
        write_parts(path, [memoryview(record)] if record else [])
        return len(record)

    def reply(self, block: int, path: str = "", record: bytes = b"") -> pb.Block:
        rows = int(self.source.index[block]["rows"])
        return pb.Block(path=path, tokens=rows, record=record, pinned=bool(path))


class HeldImages(RecordBlocks):
    """A records dataset's images decoded as its view says (short side, decoder). A
    block's room is estimated from the bytes per row the blocks loaded so far took (at
    first: a ``short_side`` x 4/3 image a row, or ten times the stored bytes at full
    size), and settled once it is written."""

    def __init__(self, source: Any, view: Any) -> None:
        super().__init__(source, view)
        self._rows = 0
        self._bytes = 0

    def size(self, block: int) -> int:
        e = self.source.index[block]
        rows = int(e["rows"])
        if self._rows:
            return max(1, -(-self._bytes * rows // self._rows))
        s = self.view.short_side
        return rows * (s * s * 4 + 256) if s else 10 * int(e["nbytes"])

    def write(self, block: int, record: bytes, path: Path, counters: Counters) -> int:
        from stoker.records.held import prepare_block, write_batch

        batch = self.source.decode(block, record)
        held, decoded = prepare_block(batch, self.view)
        counters.add("images_decoded", decoded)
        counters.add("image_errors", batch.num_rows - decoded)
        n = write_batch(path, held)
        self._rows += batch.num_rows
        self._bytes += n
        return n
