"""Which positions of an epoch a node's cache already holds (pure).

A shuffle window's positions are a permutation of the samples of its
``window_shards`` shards (``plan.EpochOrder``; with ``order="spread"``, of the units
its turns deal from, ``plan.SpreadOrder``), so a window is the unit a node can be
local to: the coordinator grants a node the windows whose blocks its
cache mostly holds before the others (``Config.locality``). Smaller windows
make more of them local; a window of many shards mixes shards that different
nodes cached.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from stoker import plan


def local_ranges(
    num_samples: int,
    seq_len: int,
    block_tokens: int,
    config: plan.ShuffleConfig,
    epoch: int,
    held: Iterable[int],
    threshold: float = 0.5,
) -> list[tuple[int, int]]:
    """Stream positions of a token dataset's data epoch ``epoch`` in windows of which at
    least ``threshold`` of the blocks are in ``held``, as sorted disjoint ranges."""

    def blocks(a: int, b: int) -> np.ndarray:  # samples [a, b) are tokens [a*L, b*L + 1)
        return np.arange(a * seq_len // block_tokens, b * seq_len // block_tokens + 1)

    return local_windows(num_samples, config, epoch, held, blocks, threshold)


def local_windows(
    num_samples: int,
    config: plan.ShuffleConfig,
    epoch: int,
    held: Iterable[int],
    blocks_of: Callable[[int, int], np.ndarray],
    threshold: float = 0.5,
) -> list[tuple[int, int]]:
    """Stream positions of data epoch ``epoch`` in windows of which at least ``threshold``
    of the blocks are in ``held``, as sorted disjoint ranges, for any kind of data:
    ``blocks_of(a, b)`` is the blocks samples ``[a, b)`` are read from."""
    held_set = np.fromiter(held, dtype=np.int64)
    if held_set.size == 0 or num_samples == 0:
        return []
    held_set.sort()
    order = plan.epoch_order(num_samples, config, epoch)
    base = epoch * num_samples
    out: list[tuple[int, int]] = []
    for w in range(order.num_windows):
        lo, hi = (int(x) for x in order.window_start(np.array([w, w + 1])))
        spans = order.window_spans(w)
        if not spans:
            continue
        blocks = np.unique(np.concatenate([blocks_of(a, b) for a, b in spans]))
        have = np.count_nonzero(np.isin(blocks, held_set, assume_unique=False))
        if blocks.size and have >= threshold * blocks.size:
            if out and out[-1][1] == base + lo:
                out[-1] = (out[-1][0], base + hi)
            else:
                out.append((base + lo, base + hi))
    return out
