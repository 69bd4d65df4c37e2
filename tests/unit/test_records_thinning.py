"""The records reader's choice of where to let go of a block (pure)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.records.reader import thinning


def reference(blocks: list[int], gap: int | None) -> tuple[dict[int, int], list[bool]]:
    """One block at a time: held from its first use while its next use is at most
    ``gap`` away; the uses after that are later ones."""
    let_go: dict[int, int] = {}
    later = [False] * len(blocks)
    for b in set(blocks):
        uses = [i for i, x in enumerate(blocks) if x == b]
        end = len(uses) - 1
        for k in range(len(uses) - 1):
            if gap is not None and uses[k + 1] - uses[k] > gap:
                end = k
                break
        let_go[b] = uses[end]
        for k in uses[end + 1 :]:
            later[k] = True
    return let_go, later


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 5), max_size=60),
    st.one_of(st.none(), st.integers(1, 12)),
)
def test_thinning_matches_a_use_by_use_walk(blocks: list[int], gap: int | None) -> None:
    got, later = thinning(np.array(blocks, dtype=np.int64), gap)
    want, want_later = reference(blocks, gap)
    assert got == want
    assert later.tolist() == want_later


def test_a_block_whose_uses_thin_out_goes_at_the_thinning() -> None:
    # block 7: dense at 0-3, then once at 20 and 40; block 8 in between
    blocks = np.array([7, 7, 7, 7] + [8] * 16 + [7] + [8] * 19 + [7])
    got, later = thinning(blocks, 5)
    assert got == {7: 3, 8: 39}
    assert np.flatnonzero(later).tolist() == [20, 40]
    got, later = thinning(blocks, None)  # without a gap: held to its last use
    assert got == {7: 40, 8: 39} and not later.any()
