"""A seconds-long smoke run of the token loading benchmark (stoker + memmap floor only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tokens_bench_quick_runs_and_resumes_exactly() -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/tokens_bench.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = json.loads((ROOT / "benchmarks/.work/tokens_bench/results-quick.json").read_text())
    systems = out["systems"]
    for key in ("memmap_floor", "stoker_dl", "stoker_loader"):
        row = systems[key]
        assert row["errors"] == {}, (key, row["errors"])
        assert row["tps_nw0"] > 0 and row["tps_nw2"] > 0
        assert row["resume_exact"] is True, key
    # stoker stores less than the raw uint16 stream
    assert systems["stoker_loader"]["bytes"] < systems["memmap_floor"]["bytes"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_agent_remote_quick_fetches_each_block_once() -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/agent_remote.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = json.loads((ROOT / "benchmarks/.work/agent_remote/results-quick.json").read_text())
    for run in out["runs"]:
        ratio = run["remote_bytes"] / out["stored"]
        if run["agent"]:
            assert ratio == 1.0, run
        assert run["samples"] > 0
    two = next(r for r in out["runs"] if r["procs"] == 2 and not r["agent"])
    assert two["remote_bytes"] > out["stored"]  # without the agent both ranks fetch


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_scale_bench_quick_loses_nothing_through_a_restart() -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/scale_bench.py", "--quick", "--nodes", "8",
         "--seconds", "1"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    r = json.loads((ROOT / "benchmarks/.work/scale-quick.json").read_text())["run"]
    assert [p["paced"] for p in r["phases"]] == [False, True]
    assert all(p["lease_per_s"] > 0 for p in r["phases"])
    # every confirm answered before the SIGKILL is in the restarted coordinator's count
    assert r["confirmed_by_load"] > 0
    assert r["consumed_after_restart"] == r["confirmed_by_load"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_coordinator_bench_quick_runs() -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/coordinator_bench.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = json.loads((ROOT / "benchmarks/.work/coordinator-quick.json").read_text())
    assert all(ld["lease_per_s"] > 0 for ld in out["load"])  # one call and batched
    st = out["straggler"]
    assert max(st["dynamic"]) < min(st["static"])  # stealing beats the static split


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_locality_bench_quick_cuts_later_epochs_remote_bytes() -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/locality_bench.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = json.loads((ROOT / "benchmarks/.work/locality/results-quick.json").read_text())
    runs = {r["locality"]: r for r in out["runs"] if r["window_shards"] == 1}
    for run in runs.values():
        assert run["exactly_once"], run
        assert run["origin_bytes"] == run["remote_bytes"]  # the agents' counters = nginx's log
        assert sum(run["epochs"][0]["remote_bytes"]) >= out["stored"]  # cold caches: all of it
    later = {k: sum(sum(e["remote_bytes"]) for e in r["epochs"][1:]) for k, r in runs.items()}
    # one-shard windows: the nodes' caches hold a third each, and locality grants them that third
    assert later[True] < 0.5 * later[False], later


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dynamic_bench_quick_reads_every_sample_once() -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/dynamic_bench.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = json.loads((ROOT / "benchmarks/.work/dynamic_bench/results-quick.json").read_text())
    runs = {(r["config"], r["num_workers"]): r for r in out["runs"]}
    assert set(runs) == {(c, nw) for c in ("static", "coordinator", "rank0") for nw in (0, 2)}
    for run in runs.values():  # the script itself fails on a duplicate or a missing id
        assert run["samples"] == out["params"]["samples"], run
        assert run["tps"] > 0 and run["first_s"] > 0
    assert out["summary"]["coordinator/nw0"]["ratio"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_convert_bench_quick_converts_every_format_whole() -> None:
    # each side of every round checks it saw every token of the corpus
    result = subprocess.run(
        [sys.executable, "benchmarks/convert_bench.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [ln for ln in result.stdout.splitlines() if ln.startswith("| ") and "MB/s" not in ln]
    # MDS and LitData run where .venv-peers has their libraries; else each says it is skipped
    peers = [name for fmt, name in (("mds", "MosaicML"), ("litdata", "LitData"))
             if f"{fmt}: skipped" not in result.stdout]  # fmt: skip
    assert [r.split("|")[1].split()[0].rstrip(",") for r in rows] == [
        "Megatron",
        "Hugging",
        "parquet",
        ".npy",
        *peers,
    ]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mixture_bench_quick_keeps_the_shares() -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/mixture_bench.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = json.loads((ROOT / "benchmarks/.work/mixture/results-quick.json").read_text())
    assert out["worst_share_deviation_samples"] < 1
    kinds = ("single", "mixture", "mixture-coord")  # (the last fed by rank 0's coordinator)
    assert set(out["median_tok_s"]) == {f"{k} nw{nw}" for k in kinds for nw in (0, 2)}
    assert set(out["ratio_coordinated_to_static_in_pass"]) == {"0", "2"}
    assert all(v > 0 for v in out["median_tok_s"].values())
    # the resumed process was given the state: it read from 40% on, not from the start
    assert out["state_batches"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_image_corpus_quick_is_deterministic_and_builds_records(tmp_path: Path) -> None:
    # the photographs come from .venv-images and unpacked .debs; where neither is on
    # this machine the script exits 3 (--no-download: nothing is fetched here)
    digests = []
    for out in (tmp_path / "a", tmp_path / "b"):
        result = subprocess.run(
            [sys.executable, "benchmarks/image_corpus.py", "--quick", "--no-download",
             "--out", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )  # fmt: skip
        if result.returncode == 3:
            pytest.skip("no source photographs here (.venv-images, benchmarks/.work/images-debs)")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        corpus = json.loads((out / "corpus.json").read_text())
        assert corpus["images"] == 500
        assert len(corpus["classes"]) == len(corpus["recipe"]["sources"]) >= 1
        assert all(s["version"] and s["sha256"] for s in corpus["recipe"]["sources"])
        assert 100 < corpus["width_median"] < 1000 and corpus["bytes_mean"] > 5000
        digests.append(corpus["digest"])
    assert digests[0] == digests[1]  # the same seed makes the same files

    import stoker

    src = stoker.RecordSource(str(tmp_path / "a" / "records"))
    assert src.num_rows == 500
