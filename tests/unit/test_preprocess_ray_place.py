"""Where :mod:`stoker.preprocess.ray` places its workers: pure, no Ray needed."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stoker.errors import ConfigError
from stoker.preprocess.ray import Node, nodes_of, place

CPU_A = Node("a", "10.0.0.1", 16, 0)
CPU_B = Node("b", "10.0.0.2", 4, 0)
GPU = Node("g", "10.0.0.9", 96, 8)


def test_workers_spread_over_the_cpu_nodes_in_turn_and_none_on_a_gpu_node() -> None:
    got = place([GPU, CPU_A, CPU_B], 6, "cpu", 1.0)
    assert [n.node_id for n in got] == ["a", "b", "a", "b", "a", "b"]


def test_a_full_node_is_passed_over() -> None:
    got = [n.node_id for n in place([CPU_A, CPU_B], 10, "cpu", 2.0)]  # room: 8 and 2
    assert got == ["a", "b", "a", "b"] + ["a"] * 6


def test_more_workers_than_fit_name_the_nodes() -> None:
    want = r"6 workers of 4.0 CPUs .*\(5 fit: 10.0.0.1 16 CPUs, 10.0.0.2 4 CPUs\)"
    with pytest.raises(ConfigError, match=want):
        place([CPU_A, CPU_B, GPU], 6, "cpu", 4.0)


def test_only_gpu_nodes_is_an_error_unless_any_node_will_do() -> None:
    with pytest.raises(ConfigError, match="no node of the Ray cluster is without GPUs"):
        place([GPU], 1, "cpu", 1.0)
    assert [n.node_id for n in place([GPU], 3, "any", 1.0)] == ["g"] * 3


def test_a_bad_placement_or_share_is_refused() -> None:
    with pytest.raises(ConfigError, match="placement='gpu'"):
        place([CPU_A], 1, "gpu", 1.0)
    with pytest.raises(ConfigError, match="num_cpus=0"):
        place([CPU_A], 1, "cpu", 0)


def test_nodes_of_keeps_the_live_ones_with_their_cpus_and_gpus() -> None:
    listing = [
        {"NodeID": "a", "Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 8.0}},
        {"NodeID": "d", "Alive": False, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 8.0}},
        {"NodeID": "g", "Alive": True, "NodeManagerAddress": "10.0.0.9",
         "Resources": {"CPU": 32.0, "GPU": 4.0}},
    ]  # fmt: skip
    assert nodes_of(listing) == [Node("a", "10.0.0.1", 8.0, 0.0), Node("g", "10.0.0.9", 32.0, 4.0)]


@given(
    cpus=st.lists(st.integers(0, 12), min_size=1, max_size=5),
    share=st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    count=st.integers(0, 40),
)
def test_no_node_gets_more_than_its_cpus_hold_and_the_spread_is_even(
    cpus: list[int], share: float, count: int
) -> None:
    nodes = [Node(str(i), f"10.0.0.{i}", c, 0) for i, c in enumerate(cpus)]
    room = {n.node_id: int(n.cpus // share) for n in nodes}
    if count > sum(room.values()):
        with pytest.raises(ConfigError):
            place(nodes, count, "cpu", share)
        return
    got = Counter(n.node_id for n in place(nodes, count, "cpu", share))
    assert sum(got.values()) == count
    assert all(got[k] <= room[k] for k in got)
    # in turn: a node has fewer than another only when it is full
    for k in room:
        for j in room:
            if got[k] + 1 < got[j]:
                assert got[k] == room[k]
