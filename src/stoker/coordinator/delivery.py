"""The order in which a rank hands batches to training, from its log of confirmed batches.

Pure. A rank's main process confirms each batch its consumers produce before
it hands the batch out (:mod:`stoker.loader.coordinated`), and the coordinator logs
every such confirmation with the rows it accepted. What training then sees
follows from the log alone:

* a batch whose accepted rows fill ``size`` is handed out at once, in log order;
* a shorter one (a consumer's last batch, or one that lost rows to a refused
  confirm) is held back; when the rank's epoch is over, the held rows, in log
  order, are cut into batches of ``size`` (the last may be shorter).

So every rank hands out exactly ``ceil(quota / size)`` batches, and the same
rule serves the checkpoint (the positions of a rank's first ``k`` batches) and
the replay of a run (every rank's exact batch sequence).
"""

from __future__ import annotations

Ranges = list[tuple[int, int]]  # positions, in row order


def rows(batch: Ranges) -> int:
    return sum(b - a for a, b in batch)


def cut(ranges: Ranges, size: int) -> list[Ranges]:
    """``ranges`` (row order) cut into batches of ``size`` rows; the last may be shorter."""
    out: list[Ranges] = []
    cur: Ranges = []
    have = 0
    for a, b in ranges:
        while a < b:
            take = min(b - a, size - have)
            cur.append((a, a + take))
            have += take
            a += take
            if have == size:
                out.append(cur)
                cur, have = [], 0
    if cur:
        out.append(cur)
    return out


def handed_out(log: list[Ranges], size: int, final: bool) -> list[Ranges]:
    """The batches a rank hands out, in order: every full batch of ``log``, then (when the
    rank's epoch is ``final``, i.e. it has confirmed all its positions) the held rows."""
    full = [b for b in log if rows(b) == size]
    if not final:
        return full
    held = [r for b in log if rows(b) < size for r in b]
    return full + cut(held, size)


def first(log: list[Ranges], size: int, k: int, final: bool) -> Ranges | None:
    """The positions of the rank's first ``k`` batches, or None when the log does not
    determine them yet (fewer than ``k`` full batches and the rank's epoch not over)."""
    out = handed_out(log, size, final)
    if len(out) < k:
        return None if not final else [r for b in out for r in b]
    return [r for b in out[:k] for r in b]
