"""Observability without import-time globals: nothing exists before it is used, and
storage reports to the observer it is given."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stoker.storage import Storage

PROBE = """
import atexit, json, os, sys
calls, exits = [], []  # hooks installed by stoker's own modules (other libraries have theirs)
real_fork, real_exit = os.register_at_fork, atexit.register

def caller():
    return sys._getframe(2).f_globals.get("__name__", "")

def at_fork(**kw):
    if caller().startswith("stoker"):
        calls.append(caller())
    return real_fork(**kw)

def at_exit(fn, *a, **k):
    if caller().startswith("stoker"):
        exits.append(caller())
    return real_exit(fn, *a, **k)

os.register_at_fork, atexit.register = at_fork, at_exit
import stoker, stoker.loader.loader, stoker.device, stoker.storage, stoker.observe.doctor
from stoker.observe import export, registry
before = [registry._registry is None, export._exported is None, export._armed is None,
          len(calls), list(exits)]
reg = registry.registry()
assert reg is registry.registry()  # one per process
print(json.dumps({"before": before, "after_forks": len(calls), "same": reg is registry.METRICS}))
"""


def test_importing_stoker_makes_no_registry_and_installs_no_hooks() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    got = json.loads(out.stdout)
    assert got["before"] == [True, True, True, 0, []]  # nothing made, no fork or exit hook
    assert got["after_forks"] == 1  # the first use made it, with its fork hook
    assert got["same"]  # the old name reaches the same registry


class Recorder:
    def __init__(self) -> None:
        self.reads: list[int] = []
        self.events: list[str] = []

    def storage_read(self, nbytes: int, seconds: float) -> None:
        self.reads.append(nbytes)

    def storage_event(self, name: str) -> None:
        self.events.append(name)

    def threads_opened(self, n: int) -> None:
        pass

    def threads_closed(self, n: int) -> None:
        pass

    def thread_busy(self, seconds: float) -> None:
        pass


def test_storage_reports_to_the_observer_it_is_given(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(bytes(range(100)))
    seen = Recorder()
    storage = Storage(str(tmp_path), observer=seen)
    assert storage.read_range("f.bin", 10, 30) == bytes(range(10, 30))
    assert storage.read("f.bin") == bytes(range(100))
    assert seen.reads == [20, 100]
    from stoker.observe.registry import registry

    assert Storage(str(tmp_path)).observer is registry()  # the default


def test_a_decode_pool_collected_under_the_registry_lock_is_counted_closed() -> None:
    """A collection can run a reader's decode pool finalizer in a thread that holds the
    registry's lock (a loader counting a mixture's batch under it): it must not wait
    on that lock forever."""
    import gc
    import threading
    from types import SimpleNamespace

    from stoker.loader.arena import decode_threads
    from stoker.observe.registry import Metrics

    metrics = Metrics()
    source = SimpleNamespace(storage=SimpleNamespace(observer=metrics))
    counted: list[int] = []

    def run() -> None:
        with metrics.lock:
            pool = decode_threads(source, 2)  # type: ignore[arg-type]
            counted.append(metrics.threads.count)
            del pool
            gc.collect()  # its finalizer runs here, in this thread
            counted.append(metrics.threads.count)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the finalizer waited on the lock its own thread holds"
    assert counted == [2, 0]
