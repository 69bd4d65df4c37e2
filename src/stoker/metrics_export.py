"""torch ``DataLoader`` workers' counts, in files their parent's ``/metrics`` adds up.

A worker of torch's ``DataLoader`` iterating a :class:`~stoker.TokenDataset` is a
process of its own: what it reads from storage and how busy it is would be lost
with it. Each writes its totals (counted from zero in the worker: what it
inherited at fork is its parent's) to ``<shm>/stoker-metrics-<parent pid>/<pid>.json``
at most every :data:`EXPORT_INTERVAL` seconds, when its iteration ends and when
it exits. The parent's :class:`~stoker.metrics.Collector` reads them on each
scrape; the totals of workers that exited are folded into one record per (rank,
worker) and their files removed, so a job of many epochs keeps a few files.
Directories of parents that no longer exist are removed by the next process
that reads.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing.util
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from stoker.metrics import METRICS, STORAGE, delta

#: Seconds between a DataLoader worker's writes of its totals (and at its end).
EXPORT_INTERVAL = 0.5


def export_dir(parent: int) -> str:
    """Where the DataLoader workers of process ``parent`` leave their totals."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return os.path.join(base, f"stoker-metrics-{parent}")


class WorkerExport:
    """A torch ``DataLoader`` worker's totals, kept in a file its parent's collector reads.

    Counts start at zero in the worker (what it inherited at fork is its parent's),
    and the file is rewritten atomically at most every :data:`EXPORT_INTERVAL`
    seconds, when the iteration ends and when the worker process exits. The
    parent is the worker's parent process (fork and spawn start methods).
    """

    def __init__(self, rank: int, worker: int) -> None:
        self.rank, self.worker = rank, worker
        self.first = METRICS.snapshot()
        self.born = time.monotonic()
        self.busy = 0.0
        self.written = 0.0
        self.dir = export_dir(os.getppid())
        self.path = os.path.join(self.dir, f"{os.getpid()}.json")
        multiprocessing.util.Finalize(self, self.write, exitpriority=10)

    def produced(self, since: float) -> None:
        """The worker worked from ``since`` (a ``perf_counter``) until now; write if due."""
        now = time.perf_counter()
        self.busy += now - since
        if now - self.written >= EXPORT_INTERVAL:
            self.write()
            self.written = now

    def write(self) -> None:
        body = {
            **delta(METRICS.snapshot(), self.first),
            "rank": self.rank,
            "worker": self.worker,
            "busy": self.busy,
            "alive": time.monotonic() - self.born,
        }
        try:
            os.makedirs(self.dir, exist_ok=True)
            tmp = f"{self.path}.tmp"
            with open(tmp, "w") as f:
                json.dump(body, f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # metrics never stop the data


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Exported:
    """This process's DataLoader workers' totals: the live ones' files, plus the
    folded totals of workers that exited (whose files are then removed)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.retired: list[dict[str, Any]] = []
        self.swept = False

    def read(self) -> list[dict[str, Any]]:
        with self.lock:
            if self.pid != os.getpid():  # a forked child: its workers are its own
                self.pid, self.retired, self.swept = os.getpid(), [], False
            if not self.swept:
                self.swept = True
                _sweep()
            d = export_dir(self.pid)
            live = []
            with contextlib.suppress(FileNotFoundError):
                for name in sorted(os.listdir(d)):
                    if not name.endswith(".json"):
                        continue
                    path = os.path.join(d, name)
                    try:
                        with open(path) as f:
                            body = json.load(f)
                    except (OSError, ValueError):
                        continue
                    if _alive(int(name[: -len(".json")])):
                        live.append(body)
                    else:  # it wrote its last; keep the totals, drop the file
                        self.retired.append(body)
                        with contextlib.suppress(OSError):
                            os.unlink(path)
            self.retired = _fold(self.retired)
            return [*self.retired, *live]


def with_exported(
    own: dict[str, Any],
) -> tuple[dict[str, Any], dict[tuple[int, int], list[float]]]:
    """This process's :meth:`~stoker.metrics.Metrics.snapshot` plus its DataLoader
    workers' totals, and the workers' ``[busy, alive]`` seconds by (rank, worker)."""
    total = json.loads(json.dumps(own))
    workers: dict[tuple[int, int], list[float]] = {}
    for body in EXPORTED.read():
        _add(total, body)
        acc = workers.setdefault((body["rank"], body["worker"]), [0.0, 0.0])
        acc[0] += body["busy"]
        acc[1] += body["alive"]
    return total, workers


def _add(acc: dict[str, Any], body: dict[str, Any]) -> None:
    """Add ``body``'s storage and thread counts to ``acc``'s."""
    for k in STORAGE:
        acc["storage"][k] += body["storage"][k]
    counts = acc["storage"]["latency"]["counts"]
    for i, n in enumerate(body["storage"]["latency"]["counts"]):
        counts[i] += n
    acc["storage"]["latency"]["sum"] += body["storage"]["latency"]["sum"]
    for k in ("busy", "alive"):
        acc["threads"][k] += body["threads"][k]


def _fold(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One body per (rank, worker), the counts summed."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for b in bodies:
        key = (b["rank"], b["worker"])
        if key not in out:
            out[key] = json.loads(json.dumps(b))
            continue
        acc = out[key]
        _add(acc, b)
        acc["busy"] += b["busy"]
        acc["alive"] += b["alive"]
    return list(out.values())


def _sweep() -> None:
    """Remove the export directories of processes that no longer exist."""
    base = os.path.dirname(export_dir(0))
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            pid = name[len("stoker-metrics-") :]
            if name.startswith("stoker-metrics-") and pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)


#: This process's DataLoader workers, as its collector reads them.
EXPORTED = Exported()


def _remove_export_dir(pid: int = os.getpid()) -> None:
    if os.getpid() == pid:  # not in a forked child that runs its parent's atexit
        shutil.rmtree(export_dir(pid), ignore_errors=True)


atexit.register(_remove_export_dir)
