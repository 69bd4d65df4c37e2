"""torch ``DataLoader`` workers' counts, in files their parent's ``/metrics`` adds up.

A worker of torch's ``DataLoader`` iterating a :class:`~stoker.TokenDataset` is a
process of its own: what it reads from storage and how busy it is would be lost
with it. Each writes its totals (counted from zero in the worker: what it
inherited at fork is its parent's) to ``<shm>/stoker-metrics-<parent pid>/<pid>.json``
at most every :data:`EXPORT_INTERVAL` seconds, when its iteration ends and when
it exits. The parent's :class:`~stoker.observe.exposition.Collector` reads them on each
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
import weakref
from collections.abc import Iterator
from typing import Any

from stoker.observe.registry import combine, delta, registry
from stoker.runtime import alive

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

    Busy time (:func:`busy_seconds`): the wall time inside the dataset's iterator,
    plus what the worker does between handing a sample over and asking for the
    next: its thread's CPU time (a wrapped transform, collation) and wait for a
    core (the run queue, from ``/proc/thread-self/schedstat``), and the CPU time
    of the result queue's feeder thread meanwhile (it pickles the batch and moves
    its tensors to shared memory there); waiting for the parent's next request
    takes none of these and counts as idle, whatever other threads of the worker
    do meanwhile (stoker's block threads reading ahead count as their own busy
    time, ``stoker_loader_thread_busy_seconds``).
    """

    def __init__(self, rank: int, worker: int) -> None:
        self.rank, self.worker, self.pid = rank, worker, os.getpid()
        self.first = registry().snapshot()
        self.born = time.monotonic()
        self.inside = 0.0  # wall seconds inside the dataset's iterator
        self.outside_cpu = 0.0  # thread CPU seconds between a hand-over and the next ask
        self.outside_others = 0.0  # the queue feeder thread's CPU seconds meanwhile
        self.feeder: _Schedstat | None = None  # found once the queue has started it
        # (thread, feeder) CPU times at the last hand-over
        self.handed: tuple[float, float] | None = None
        self.written = 0.0
        self.sched = _Schedstat()
        self.sched0 = self.sched.read()
        self.dir = export_dir(os.getppid())
        self.path = os.path.join(self.dir, f"{os.getpid()}.json")
        multiprocessing.util.Finalize(self, self.write, exitpriority=10)

    def produced(self, since: float) -> None:
        """The dataset worked from ``since`` (a ``perf_counter``) until now, and hands a
        sample over; write if due."""
        now = time.perf_counter()
        self.inside += now - since
        if now - self.written >= EXPORT_INTERVAL:
            self.write()
            self.written = now
        self.handed = time.thread_time(), self._feeder_cpu()

    def resumed(self) -> None:
        """The worker asks for the next sample."""
        if self.handed is not None:
            self.outside_cpu += time.thread_time() - self.handed[0]
            self.outside_others += self._feeder_cpu() - self.handed[1]

    def _feeder_cpu(self) -> float:
        """CPU seconds of the thread that sends the worker's results to its parent (a
        multiprocessing queue's feeder, started at the queue's first put); 0 before it."""
        if self.feeder is None:
            tid = next(
                (t.native_id for t in threading.enumerate() if t.name == _FEEDER),
                None,
            )
            if tid is None:
                return 0.0
            self.feeder = _Schedstat(f"/proc/self/task/{tid}/schedstat", own=False)
        return self.feeder.read()[0]

    def busy(self, alive: float) -> float:
        cpu, delay = (a - b for a, b in zip(self.sched.read(), self.sched0, strict=True))
        return busy_seconds(self.inside, self.outside_cpu, cpu, delay, alive, self.outside_others)

    def write(self) -> None:
        body: dict[str, Any] = {
            **delta(registry().snapshot(), self.first),
            "rank": self.rank,
            "worker": self.worker,
        }
        alive = time.monotonic() - self.born
        body.update(busy=self.busy(alive), alive=alive)
        try:
            os.makedirs(self.dir, exist_ok=True)
            tmp = f"{self.path}.tmp"
            with open(tmp, "w") as f:
                json.dump(body, f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # metrics never stop the data


def busy_seconds(
    inside: float,
    outside_cpu: float,
    cpu: float,
    delay: float,
    alive: float,
    outside_others: float = 0.0,
) -> float:
    """A worker's busy seconds: ``inside`` (its thread's wall seconds in the dataset's
    iterator), ``outside_cpu`` (the thread's CPU seconds outside it), the thread's total
    ``cpu`` and run-queue ``delay`` seconds, and ``outside_others`` (the CPU seconds of
    the worker's result-queue feeder while the thread was outside the iterator). The delay
    outside the iterator is what ``delay`` leaves after the iterator's own time off the
    CPU (blocked or waiting for a core), so it is never counted twice; at most ``alive``."""
    inside_off_cpu = max(0.0, inside - max(0.0, cpu - outside_cpu))
    outside_delay = max(0.0, delay - inside_off_cpu)
    return min(alive, inside + outside_cpu + outside_delay + outside_others)


def exported(samples: Iterator[Any], export: WorkerExport) -> Iterator[Any]:
    """``samples`` of a DataLoader worker's iteration, its busy time counted into
    ``export`` (the time inside ``samples``, and what the worker does between them)."""
    t = time.perf_counter()
    try:
        for sample in samples:
            export.produced(t)
            yield sample
            export.resumed()
            t = time.perf_counter()
    finally:
        export.write()


_current: WorkerExport | None = None


def worker_export(rank: int, worker: int) -> WorkerExport:
    """This worker process's :class:`WorkerExport` (one per process: a persistent worker
    iterates once per epoch into the same totals), ready for an iteration."""
    global _current
    cur = _current
    if cur is None or (cur.pid, cur.rank, cur.worker) != (os.getpid(), rank, worker):
        cur = _current = WorkerExport(rank, worker)
    cur.handed = None  # the wait between iterations is not work
    return cur


#: The name multiprocessing gives a queue's feeder thread.
_FEEDER = "QueueFeederThread"


class _Schedstat:
    """A thread's CPU time and run-queue wait (seconds), from its ``schedstat`` (by
    default the calling thread's); where there is none, the CPU clock and no wait for
    the calling thread (``own``), nothing for another."""

    def __init__(self, path: str = "/proc/thread-self/schedstat", own: bool = True) -> None:
        self.own = own
        try:
            self.fd: int | None = os.open(path, os.O_RDONLY)
        except OSError:
            self.fd = None
        else:
            weakref.finalize(self, os.close, self.fd)

    def read(self) -> tuple[float, float]:
        if self.fd is not None:
            with contextlib.suppress(OSError, ValueError):
                cpu, delay, _ = os.pread(self.fd, 128, 0).split()
                return int(cpu) / 1e9, int(delay) / 1e9
        return (time.thread_time() if self.own else 0.0), 0.0


class Exported:
    """This process's DataLoader workers' totals: the live ones' files, plus the
    folded totals of workers that exited (whose files are then removed)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.retired: list[dict[str, Any]] = []
        self.swept = False
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        # a forked child's workers are its own; another thread may have held the lock
        self.lock = threading.Lock()
        self.pid, self.retired, self.swept = os.getpid(), [], False

    def read(self) -> list[dict[str, Any]]:
        with self.lock:
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
                    running = alive(int(name[: -len(".json")]))  # before reading: if it is
                    try:  # gone, what the file holds is final
                        with open(path) as f:
                            body = json.load(f)
                    except (OSError, ValueError):
                        continue
                    if running:
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
    """This process's :meth:`~stoker.observe.registry.Metrics.snapshot` plus its DataLoader
    workers' totals, and the workers' ``[busy, alive]`` seconds by (rank, worker)."""
    total = own
    workers: dict[tuple[int, int], list[float]] = {}
    for body in exported_totals().read():
        total = combine(total, body)
        acc = workers.setdefault((body["rank"], body["worker"]), [0.0, 0.0])
        acc[0] += body["busy"]
        acc[1] += body["alive"]
    return total, workers


def rank_stats(rank: int) -> dict[str, Any]:
    """``rank``'s stall and throughput figures (what ``/metrics`` shows, as numbers), this
    process's storage counters, and the workers' busy share, DataLoader workers included."""
    stats = registry().loader(rank)
    out = stats.summary()
    total, workers = with_exported(registry().snapshot())
    out["storage"] = {k: v for k, v in total["storage"].items() if k != "latency"}
    out["images"] = dict(total.get("images", {}))
    with registry().lock:
        busy, alive = sum(stats.busy.values()), sum(stats.alive.values())
    for (r, _), (b, a) in workers.items():
        if r == rank:
            busy, alive = busy + b, alive + a
    out["worker_busy_share"] = busy / alive if alive > 0 else None
    return out


def _fold(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One body per (rank, worker), the counts summed."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for b in bodies:
        key = (b["rank"], b["worker"])
        acc = out.get(key)
        out[key] = (
            b
            if acc is None
            else {
                **b,
                **combine(acc, b),
                "busy": acc["busy"] + b["busy"],
                "alive": acc["alive"] + b["alive"],
            }
        )
    return list(out.values())


def _sweep() -> None:
    """Remove the export directories of processes that no longer exist."""
    base = os.path.dirname(export_dir(0))
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            pid = name[len("stoker-metrics-") :]
            if name.startswith("stoker-metrics-") and pid.isdigit() and not alive(int(pid)):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)


_exported: Exported | None = None


def exported_totals() -> Exported:
    """This process's DataLoader workers, as its collector reads them (made on first use)."""
    global _exported
    if _exported is None:
        _exported = Exported()
    return _exported


_armed: int | None = None  # the process whose export directory is removed at its exit


def arm() -> None:
    """Remove this process's export directory when it exits (once per process). Every
    dataset calls it when made: the DataLoader workers that iterate it write there."""
    global _armed
    pid = os.getpid()
    if _armed != pid:
        _armed = pid
        atexit.register(_remove_export_dir, pid)


def _remove_export_dir(pid: int) -> None:
    if os.getpid() == pid:  # not in a forked child that runs its parent's atexit
        shutil.rmtree(export_dir(pid), ignore_errors=True)


def __getattr__(name: str) -> Any:
    if name == "EXPORTED":  # its name before 0.2, made on first use
        return exported_totals()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
