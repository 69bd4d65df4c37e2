"""`stoker top`'s screen: rows per node (the endpoints of one host) and per rank."""

from __future__ import annotations

import pytest

from stoker.observe import doctor, top


def rank_samples(rank: str, tokens: float, wait: float, step: float) -> doctor.Samples:
    lab = (("rank", rank),)
    return {
        ("stoker_loader_tokens_total", lab): tokens,
        ("stoker_loader_wait_seconds_sum", lab): wait,
        ("stoker_loader_step_seconds_sum", lab): step,
        ("stoker_storage_read_bytes_total", ()): tokens * 2,
    }


def agent_samples(hits: float, misses: float, remote: float) -> doctor.Samples:
    return {
        ("stoker_agent_memory_requests_total", (("result", "hit"),)): hits,
        ("stoker_agent_memory_requests_total", (("result", "miss"),)): misses,
        ("stoker_agent_remote_read_bytes_total", ()): remote,
    }


def test_a_row_per_node_sums_its_endpoints() -> None:
    before = {
        "10.0.0.1:9400": rank_samples("0", 0, 0, 0),
        "10.0.0.2:9400": rank_samples("1", 0, 0, 0),
        "10.0.0.2:9401": rank_samples("2", 0, 0, 0),
        "http://10.0.0.2:9409/metrics": agent_samples(0, 0, 0),
    }
    after = {
        "10.0.0.1:9400": rank_samples("0", 4e6, 0.2, 1.8),
        "10.0.0.2:9400": rank_samples("1", 1e6, 1.0, 1.0),
        "10.0.0.2:9401": rank_samples("2", 3e6, 0.5, 1.5),
        "http://10.0.0.2:9409/metrics": agent_samples(90, 10, 6e6),
    }
    nodes = top.by_node(before, after, 2.0)
    assert list(nodes) == ["10.0.0.1", "10.0.0.2"]
    second = nodes["10.0.0.2"]
    assert sorted(second.stall) == ["1", "2"]
    assert sum(second.tokens_per_s.values()) == 2e6  # (1e6 + 3e6) tokens over 2 s
    assert second.hit_ratio == 0.9
    assert second.remote_bytes_per_s == (6e6 + 2e6 + 6e6) / 2.0  # agent + both ranks' own reads
    assert nodes["10.0.0.1"].hit_ratio is None

    screen = top.frame(doctor.evidence(before, after, 2.0), after, nodes)
    rows = {line.split()[0]: line.split() for line in screen.splitlines() if line.strip()}
    assert rows["10.0.0.2"][1] == "1,2"
    assert rows["10.0.0.2"][2] == "2,000,000"
    assert rows["10.0.0.2"][3] == "37.5%"  # mean of 50% and 25%
    assert rows["10.0.0.2"][4] == "90.0%"
    assert rows["10.0.0.1"][1:4] == ["0", "2,000,000", "10.0%"]
    assert rows["2"][1:3] == ["1,500,000", "25.0%"]  # the rank rows are still there


def test_host_of_an_endpoint() -> None:
    assert top.host("127.0.0.1:9400") == "127.0.0.1"
    assert top.host("http://node-3.example:9409/metrics") == "node-3.example"
    assert top.host("[::1]:9400") == "::1"


def source_samples(
    rank: str, per: dict[str, tuple[float, float]], reads: dict[str, float] | None = None
) -> doctor.Samples:
    """A mixture's per-source counters and target gauge of one rank: name -> (samples,
    target share); ``reads``: the process's seconds waited on each source's reads (of
    as many samples as were handed out)."""
    out: doctor.Samples = {}
    for name, (n, target) in per.items():
        lab = (("rank", rank), ("source", name))
        out[("stoker_loader_source_samples_total", lab)] = n
        out[("stoker_loader_source_tokens_total", lab)] = n * 2049
        out[("stoker_loader_source_target_share", lab)] = target
        if reads is not None:
            out[("stoker_loader_source_read_seconds_total", (("source", name),))] = reads[name]
            out[("stoker_loader_source_read_samples_total", (("source", name),))] = n
    return out


def test_a_mixture_gets_a_row_per_source_over_every_rank() -> None:
    before = {
        "10.0.0.1:9400": {
            **rank_samples("0", 0, 0, 0),
            **source_samples("0", {"web": (100, 0.7), "code": (50, 0.3)}, {"web": 1, "code": 1}),
        },
        "10.0.0.2:9400": {
            **rank_samples("1", 0, 0, 0),
            **source_samples("1", {"web": (100, 0.7), "code": (50, 0.3)}, {"web": 1, "code": 1}),
        },
    }  # fmt: skip
    after = {
        "10.0.0.1:9400": {**rank_samples("0", 4e6, 0.2, 1.8), **source_samples("0", {"web": (170, 0.5), "code": (80, 0.5)}, {"web": 1.3, "code": 1.1})},
        "10.0.0.2:9400": {**rank_samples("1", 4e6, 0.2, 1.8), **source_samples("1", {"web": (160, 0.5), "code": (90, 0.5)}, {"web": 1.3, "code": 1.3})},
    }  # fmt: skip
    ev = doctor.evidence(before, after, 2.0)
    # in the window: web 70 + 60 samples, code 30 + 40
    assert ev.source_share == {"code": 70 / 200, "web": 130 / 200}
    assert ev.source_tokens_per_s == {"code": 70 * 2049 / 2.0, "web": 130 * 2049 / 2.0}
    assert ev.source_target == {"code": 0.5, "web": 0.5}  # the weights now, not before
    screen = top.frame(ev, after, top.by_node(before, after, 2.0))
    rows = {line.split()[0]: line.split() for line in screen.splitlines() if line.strip()}
    # reads in the window: web 0.3 + 0.3 s, code 0.1 + 0.3 s
    assert ev.source_read_share() == pytest.approx({"web": 0.6, "code": 0.4})
    assert rows["web"][1:] == [f"{130 * 2049 / 2.0:,.0f}", "65.0%", "50.0%", "60.0%"]
    assert rows["code"][1:] == [f"{70 * 2049 / 2.0:,.0f}", "35.0%", "50.0%", "40.0%"]
    assert "source" in rows  # its header; a single-source job has neither


def test_a_single_source_job_has_no_source_rows() -> None:
    before = {"10.0.0.1:9400": rank_samples("0", 0, 0, 0)}
    after = {"10.0.0.1:9400": rank_samples("0", 4e6, 0.2, 1.8)}
    screen = top.frame(doctor.evidence(before, after, 2.0), after)
    assert not any(line.split()[:1] == ["source"] for line in screen.splitlines())
