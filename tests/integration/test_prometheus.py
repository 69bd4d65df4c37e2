"""A real Prometheus server (the Debian package) scrapes a running `stoker demo`; its query
API returns the series stoker exports, per rank."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers import free_port

from .helpers import reap


def prometheus_bin() -> str:
    path = shutil.which("prometheus")
    if path is None:
        reason = "prometheus not installed (apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {reason}", pytrace=False)
        pytest.skip(reason)
    return path


def query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.mark.timeout(600)
def test_prometheus_scrapes_the_demo_ranks(tmp_path: Path) -> None:
    binary = prometheus_bin()
    metrics = free_port()
    while free_port() == metrics + 1:  # rank 1 serves on metrics + 1
        metrics = free_port()
    web = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 200ms\n  scrape_timeout: 150ms\n"
        "scrape_configs:\n  - job_name: stoker\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{metrics}', '127.0.0.1:{metrics + 1}']\n"
    )
    prom = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{web}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    demo = subprocess.Popen(
        [sys.executable, "-m", "stoker.cli", "demo", "--steps", "80", "--metrics-port",
         str(metrics), "--workdir", str(tmp_path / "demo")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # wait (with a deadline) until Prometheus holds both ranks' batch counters
        seen: list[dict] = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and demo.poll() is None:
            try:
                seen = query(web, "stoker_loader_batches_total > 0")
            except OSError:
                seen = []  # Prometheus still starting
            if len(seen) == 2:
                break
            time.sleep(0.2)
        # the doctor reads the same series through Prometheus' query API while the job runs
        doc = subprocess.run(
            [sys.executable, "-m", "stoker.cli", "doctor", "--prometheus",
             f"http://127.0.0.1:{web}", "--window", "1", "--json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert doc.returncode == 0, doc.stderr
        diagnosis = json.loads(doc.stdout)
        out, _ = demo.communicate(timeout=300)
        assert demo.returncode == 0, out
        assert sorted(s["metric"]["rank"] for s in seen) == ["0", "1"], (seen, out)
        # both ranks' stall figures came through (a verdict needs batches in the window)
        assert diagnosis["bottleneck"] != "no-data", diagnosis
        assert "0: " in diagnosis["evidence"][0] and "1: " in diagnosis["evidence"][0]
        # the series stay queryable after the job ended: what the scrapes saw last
        last = {
            s["metric"]["rank"]: float(s["value"][1])
            for s in query(web, "last_over_time(stoker_loader_batches_total[10m])")
        }
        assert set(last) == {"0", "1"} and all(v >= 1 for v in last.values())
        for name in ("stoker_loader_wait_seconds_count", "stoker_loader_tokens_total"):
            got = query(web, f"last_over_time({name}[10m])")
            assert {s["metric"]["rank"] for s in got} == {"0", "1"}, name
        storage = query(web, "last_over_time(stoker_storage_read_bytes_total[10m])")
        assert len(storage) == 2 and all(float(s["value"][1]) > 0 for s in storage)
        up = query(web, "up")
        assert {s["metric"]["instance"] for s in up} == {
            f"127.0.0.1:{metrics}",
            f"127.0.0.1:{metrics + 1}",
        }
    finally:
        reap(demo)  # and its pipe
        prom.terminate()
        prom.wait(timeout=30)
