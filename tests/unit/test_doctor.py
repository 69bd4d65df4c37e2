"""The doctor's reading of the evidence, and the evidence from real exposition text."""

from __future__ import annotations

import pytest

from stoker.observe import doctor
from stoker.observe.doctor import Evidence, Thresholds


def ev(**kw) -> Evidence:
    base = {"seconds": 10.0, "stall": {"0": 0.01, "1": 0.01}, "tokens_per_s": {"0": 1e5, "1": 1e5}}
    base.update(kw)
    return Evidence(**base)


@pytest.mark.parametrize(
    ("evidence", "bandwidth", "expected"),
    [
        (ev(), None, "none"),
        (ev(stall={"0": 0.01, "1": 0.40, "2": 0.02}), None, "straggler"),
        (ev(stall={"0": 0.5, "1": 0.5}, hit_ratio=0.4, evictions_per_s=30.0), None, "cache"),
        (ev(stall={"0": 0.5, "1": 0.5}, hit_ratio=0.3, remote_latency=0.3), None, "storage"),
        (ev(stall={"0": 0.5, "1": 0.5}, hit_ratio=0.3, remote_bytes_per_s=95e6), 100e6, "storage"),
        (ev(stall={"0": 0.5, "1": 0.5}, worker_busy=0.97, hit_ratio=0.99), None, "cpu"),
        (ev(stall={"0": 0.5, "1": 0.5}, worker_busy=0.3, hit_ratio=0.99), None, "prefetch"),
        # the rows come from a preprocessing pool that has fewer workers than it needs
        (ev(stall={"0": 0.5, "1": 0.5}, pool_workers=2.0, pool_needed=3.4), None, "pool"),
        (ev(stall={"0": 0.5, "1": 0.5}, pool_workers=4.0, pool_needed=3.4), None, "prefetch"),
        (ev(stall={"0": 0.5, "1": 0.5}, pool_workers=4.0, pool_needed=4.05), None, "prefetch"),
        (ev(stall={}), None, "no-data"),
        # training waits for device batches, the loader under the device tier does not
        (ev(stall={"0": 0.3, "1": 0.3}, host_stall={"0": 0.01, "1": 0.02}), None, "h2d"),
        (
            ev(stall={"0": 0.3, "1": 0.3}, host_stall={"0": 0.4, "1": 0.3}, worker_busy=0.95),
            None,
            "cpu",
        ),
    ],
)
def test_each_bottleneck_is_named(evidence: Evidence, bandwidth, expected: str) -> None:
    d = doctor.diagnose(evidence, bandwidth)
    assert d.bottleneck == expected, doctor.render(d)
    if expected == "straggler":
        assert d.rank == "1" and "rank 1" in d.summary
    if expected == "pool":
        assert "2 more" in d.advice and "needs 3.4" in d.summary
    if expected not in ("none", "no-data"):
        assert d.evidence and "threshold" in d.evidence[0]


def test_thresholds_move_the_verdict() -> None:
    e = ev(stall={"0": 0.08, "1": 0.08})
    assert doctor.diagnose(e).bottleneck == "prefetch"
    assert doctor.diagnose(e, t=Thresholds(stall=0.10)).bottleneck == "none"


def test_evidence_from_two_scrapes() -> None:
    before = doctor.parse(
        'stoker_loader_wait_seconds_sum{rank="0"} 1.0\n'
        'stoker_loader_step_seconds_sum{rank="0"} 9.0\n'
        'stoker_loader_tokens_total{rank="0"} 1000\n'
        'stoker_agent_memory_requests_total{result="hit"} 10\n'
        'stoker_agent_memory_requests_total{result="miss"} 10\n'
        "stoker_agent_memory_evictions_total 0\n"
    )
    after = doctor.parse(
        'stoker_loader_wait_seconds_sum{rank="0"} 4.0\n'
        'stoker_loader_step_seconds_sum{rank="0"} 10.0\n'
        'stoker_loader_tokens_total{rank="0"} 3000\n'
        'stoker_agent_memory_requests_total{result="hit"} 40\n'
        'stoker_agent_memory_requests_total{result="miss"} 20\n'
        "stoker_agent_memory_evictions_total 8\n"
    )
    e = doctor.evidence({"a": before}, {"a": after}, 4.0)
    assert e.stall == {"0": 3.0 / 4.0}
    assert e.tokens_per_s == {"0": 500.0}
    assert e.hit_ratio == 30 / 40 and e.evictions_per_s == 2.0
    assert doctor.diagnose(e).bottleneck == "cache"


def test_a_device_tier_s_wait_is_the_stall_training_sees() -> None:
    text = (
        'stoker_loader_wait_seconds_sum{{rank="0"}} {lw}\n'
        'stoker_loader_step_seconds_sum{{rank="0"}} {ls}\n'
        'stoker_device_wait_seconds_sum{{rank="0"}} {dw}\n'
        'stoker_device_step_seconds_sum{{rank="0"}} {ds}\n'
    )
    before = doctor.parse(text.format(lw=0, ls=0, dw=0, ds=0))
    after = doctor.parse(text.format(lw=0.1, ls=9.9, dw=4.0, ds=6.0))
    e = doctor.evidence({"a": before}, {"a": after}, 10.0)
    assert e.stall == {"0": 0.4} and e.host_stall == {"0": 0.01}
    assert doctor.diagnose(e).bottleneck == "h2d"


def test_a_straggling_worker_is_named() -> None:
    e = ev(
        stall={"0": 0.3, "1": 0.3},
        worker_busy=0.6,
        busy_by_worker={"0/0": 0.4, "0/1": 0.97, "1/0": 0.45, "1/1": 0.42},
    )
    d = doctor.diagnose(e)
    assert (d.bottleneck, d.rank, d.worker) == ("straggler", "0", "1")
    assert "worker 1 of rank 0" in d.summary
    even = ev(stall={"0": 0.3}, worker_busy=0.95, busy_by_worker={"0/0": 0.95, "0/1": 0.94})
    assert doctor.diagnose(even).bottleneck == "cpu"  # all busy alike: the CPU, not a worker


def test_busy_share_per_worker_from_two_scrapes() -> None:
    text = (
        'stoker_loader_worker_busy_seconds_total{{rank="0",worker="{w}"}} {b}\n'
        'stoker_loader_worker_alive_seconds_total{{rank="0",worker="{w}"}} {a}\n'
    )
    before = doctor.parse(text.format(w=0, b=1, a=2) + text.format(w=1, b=1, a=2))
    after = doctor.parse(text.format(w=0, b=2, a=6) + text.format(w=1, b=4.6, a=6))
    e = doctor.evidence({"a": before}, {"a": after}, 4.0)
    assert e.busy_by_worker == pytest.approx({"0/0": 0.25, "0/1": 0.9})


def test_a_source_whose_reads_stall_the_job_is_named() -> None:
    """A mixture whose consumers wait on one source's reads most of the time they wait on
    sources, at several times the others' cost a sample: that source, before the storage
    verdict the same figures would also give."""
    slow_reads = {"web": 0.4, "code": 6.0, "book": 0.2}  # seconds waited in the window
    samples = {"web": 4000.0, "code": 2400.0, "book": 1600.0}
    e = ev(stall={"0": 0.4, "1": 0.4}, hit_ratio=0.3, remote_latency=0.3,
           source_read_seconds=slow_reads, source_read_samples=samples)  # fmt: skip
    d = doctor.diagnose(e)
    assert (d.bottleneck, d.source) == ("source", "code"), doctor.render(d)
    assert "source code" in d.summary and d.to_dict()["source"] == "code"
    assert any("reads by source" in line and "code: 90.9%" in line for line in d.evidence)
    # no stall: nothing to blame, however uneven the reads
    assert doctor.diagnose(ev(source_read_seconds=slow_reads, source_read_samples=samples)).bottleneck == "none"  # fmt: skip
    # the same cost a sample everywhere: the big source takes most of the time, as it should
    even = {"web": 4.0, "code": 2.4, "book": 1.6}
    e = ev(stall={"0": 0.4, "1": 0.4}, hit_ratio=0.3, remote_latency=0.3,
           source_read_seconds=even, source_read_samples=samples)  # fmt: skip
    assert doctor.diagnose(e).bottleneck == "storage"
    # one source only: a mixture of one has nothing to compare
    one = ev(stall={"0": 0.4}, source_read_seconds={"web": 9.0}, source_read_samples={"web": 10.0})
    assert doctor.diagnose(one).source is None


def test_per_source_reads_from_two_scrapes() -> None:
    def scrape(web: float, code: float, n: float) -> doctor.Samples:
        return {
            ("stoker_loader_source_read_seconds_total", (("source", "web"),)): web,
            ("stoker_loader_source_read_seconds_total", (("source", "code"),)): code,
            ("stoker_loader_source_read_samples_total", (("source", "web"),)): n,
            ("stoker_loader_source_read_samples_total", (("source", "code"),)): n / 2,
        }

    before = {"a:1": scrape(1.0, 2.0, 100), "b:1": scrape(0.5, 0.5, 100)}
    after = {"a:1": scrape(1.5, 5.0, 300), "b:1": scrape(1.0, 2.5, 200)}
    e = doctor.evidence(before, after, 2.0)
    assert e.source_read_seconds == pytest.approx({"web": 1.0, "code": 5.0})
    assert e.source_read_samples == pytest.approx({"web": 300.0, "code": 150.0})
    assert e.source_read_share() == pytest.approx({"web": 1 / 6, "code": 5 / 6})


def test_the_pool_s_figures_come_from_the_coordinator_s_endpoint() -> None:
    text = "stoker_preprocess_workers 3.0\nstoker_preprocess_workers_needed 4.5\n"
    e = doctor.evidence({"c": doctor.parse(text)}, {"c": doctor.parse(text)}, 1.0)
    assert (e.pool_workers, e.pool_needed) == (3.0, 4.5)
