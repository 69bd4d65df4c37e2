"""The kill-and-stop matrix behind scripts/faults: real processes, real signals.

    python -m tests.integration._faults [CELL ...]     (from the repository root)

For each of the node agent, the coordinator, a reader (a rank process) and a loader
worker, a job is faulted mid-epoch with SIGKILL and with SIGSTOP, and then treated as a
user would: what was killed is restarted (a killed reader or a job that failed with a
WorkerError is resumed from its last recorded state), what was stopped is continued.
``fedreader`` and ``fedworker`` are a rank and a worker of a job fed by the
coordinator (its state is a checkpoint: the coordinator is restarted with
``--restore`` and the rank loads the state, as a user resumes such a job); the
others read the static split. Each cell prints the samples lost and repeated over the
epoch; the exit status is 1 if any cell lost or repeated a sample or failed to finish
(a WorkerError that does not name the worker's pid, a process left behind). A cell is named
``component-fault`` (``agent-kill``, ``worker-stop``, ...); without arguments all run.

Jobs are ``_fault_job.py`` processes; agents and coordinators are started with the
test suite's helpers (``test_agent.Agents``, ``test_coordinator.Coordinators``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .helpers import Written, write_dataset
from .test_agent import Agents
from .test_coordinator import Coordinators, free_port

JOB = Path(__file__).with_name("_fault_job.py")
FALLBACK = "reads blocks from storage itself"
PAUSE = 40  # the batch at which a job is faulted
FINISH = 240.0  # seconds a faulted job may take to finish: past it the cell hung
HOLD = 1.5  # seconds a stopped process stays stopped before SIGCONT


def tally(runs: Iterable[list[int]], expected: Iterable[int]) -> tuple[int, int]:
    """(lost, repeated): expected samples never handed out, and hand-outs beyond the first
    of a sample (an id outside ``expected`` counts as repeated)."""
    want = set(expected)
    counts = Counter(i for run in runs for i in run)
    lost = len(want - counts.keys())
    repeated = sum(n - 1 for n in counts.values()) + sum(
        n for i, n in counts.items() if i not in want
    )
    return lost, repeated


@dataclass
class Cell:
    lost: int
    repeated: int
    note: str = ""
    problem: str = ""  # something else that went wrong (a process left behind, ...)


class Job:
    """One ``_fault_job.py`` process."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.proc = subprocess.Popen(
            [sys.executable, str(JOB), json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def paused(self) -> list[int]:
        """Wait for the pause; the loader's worker pids."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if line[:1] != ["paused"]:
            raise RuntimeError(f"job never paused: {line}\n{self.stderr()}")
        return [int(p) for p in line[2:]]

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def wait_stderr(self, text: str) -> bool:
        """Read the job's stderr up to a line containing ``text`` (False: it ended first)."""
        assert self.proc.stderr is not None
        return any(text in line for line in self.proc.stderr)  # stops at the first

    def finish(self) -> tuple[int, str]:
        try:
            out, err = self.proc.communicate(timeout=FINISH)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"job did not finish within {FINISH:g} s") from None
        return self.proc.returncode, out + err

    def stderr(self) -> str:
        self.kill()
        return self.proc.stderr.read() if self.proc.stderr else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def records(out: Path) -> list[dict[str, Any]]:
    """Lines a job recorded (a line cut short by SIGKILL was never handed out)."""
    got = []
    if out.exists():
        for line in out.read_text().splitlines():
            try:
                got.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return got


def ids_of(out: Path) -> list[int]:
    return [i for rec in records(out) for i in rec["ids"]]


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


class Matrix:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.data: Written = write_dataset(
            root / "ds", num_docs=160, seed=7, block_tokens=512, blocks_per_file=4
        )
        # an even number of samples: two ranks split the epoch with nothing left over
        self.seq_len = next(s for s in range(32, 64) if self.data.num_samples(s) % 2 == 0)
        self.n = self.data.num_samples(self.seq_len)
        self.count = 0

    def _dir(self) -> Path:
        self.count += 1
        d = self.root / f"cell{self.count}"
        d.mkdir()
        return d

    def _cfg(self, out: Path, **kw: Any) -> dict[str, Any]:
        base = dict(dataset=str(self.data.path), seq_len=self.seq_len, batch_size=4,
                    out=str(out), num_workers=2, pause_at=[PAUSE])  # fmt: skip
        return {**base, **kw}

    def _resume(self, out: Path, cfg: dict[str, Any]) -> tuple[int, str]:
        """Start the job again from its last recorded state, as a user would."""
        last = records(out)[-1]["state"]
        return Job({**cfg, "state": last, "pause_at": []}).finish()

    def _expect_ok(self, rc: int, text: str) -> None:
        if rc != 0:
            raise RuntimeError(f"job failed ({rc}):\n{text[-3000:]}")

    # -- node agent --------------------------------------------------------------------
    def agent(self, fault: str) -> Cell:
        d = self._dir()
        agents = Agents()
        try:
            agent = agents.start(d / "cache")
            out = d / "r.jsonl"
            settings = dict(autostart=True, connect_timeout=2.0, request_timeout=2.0)
            job = Job(self._cfg(out, cache_dir=str(d / "cache"), arena_blocks=3, agent=settings))
            job.paused()
            note = ""
            if fault == "kill":
                agent.send_signal(signal.SIGKILL)
                agent.wait()
                job.go()  # the reader starts a new agent on the same directory
                rc, text = job.finish()
                new = agents.pid_of(d / "cache")
                note = "reader started a new agent" if new != agent.pid else "no new agent"
            else:
                agent.send_signal(signal.SIGSTOP)
                job.go()
                fell_back = job.wait_stderr(FALLBACK)
                agent.send_signal(signal.SIGCONT)
                rc, text = job.finish()
                note = "read storage while stopped" if fell_back else "never fell back"
            self._expect_ok(rc, text)
            return Cell(*tally([ids_of(out)], range(self.n)), note)
        finally:
            agents.close()

    # -- coordinator -------------------------------------------------------------------
    def coordinator(self, fault: str) -> Cell:
        d = self._dir()
        coords = Coordinators()
        jobs: list[Job] = []
        try:
            args = ["--bind", f"127.0.0.1:{free_port()}", "--state", str(d / "state"),
                    "--world", "2", "--dataset", str(self.data.path), "--seq-len",
                    str(self.seq_len), "--lease-size", "40"]  # fmt: skip
            first, address = coords.start(*args)
            token = os.environ.get("STOKER_COORDINATOR_TOKEN")
            outs = [d / f"r{rank}.jsonl" for rank in (0, 1)]
            for rank in (0, 1):
                cfg = self._cfg(outs[rank], rank=rank, world=2, num_workers=1,
                                coordinator=address, token=token,
                                pause_at=[PAUSE] if rank == 0 else [])  # fmt: skip
                jobs.append(Job(cfg))
            jobs[0].paused()
            if fault == "kill":
                first.send_signal(signal.SIGKILL)
                first.wait()
                coords.start(*args)  # same address, same journal
                jobs[0].go()
            else:
                first.send_signal(signal.SIGSTOP)
                jobs[0].go()
                time.sleep(HOLD)  # the fault's duration
                first.send_signal(signal.SIGCONT)
            for job in jobs:
                self._expect_ok(*job.finish())
            return Cell(*tally([ids_of(o) for o in outs], range(self.n)))
        finally:
            for job in jobs:
                job.kill()
            coords.close()

    # -- reader (a rank process) -------------------------------------------------------
    def reader(self, fault: str) -> Cell:
        d = self._dir()
        out = d / "r.jsonl"
        cfg = self._cfg(out)
        job = Job(cfg)
        try:
            workers = job.paused()
            if fault == "kill":
                job.proc.send_signal(signal.SIGKILL)
                job.proc.wait()
                self._expect_ok(*self._resume(out, cfg))
                left = [p for p in workers if not _gone(p)]
                problem = f"workers left behind: {left}" if left else ""
                note = "resumed from its state"
            else:
                job.go()
                job.proc.send_signal(signal.SIGSTOP)
                time.sleep(HOLD)  # the fault's duration
                job.proc.send_signal(signal.SIGCONT)
                self._expect_ok(*job.finish())
                note = problem = ""
            return Cell(*tally([ids_of(out)], range(self.n)), note, problem)
        finally:
            job.kill()

    # -- loader worker -----------------------------------------------------------------
    def worker(self, fault: str) -> Cell:
        d = self._dir()
        out = d / "r.jsonl"
        cfg = self._cfg(out, timeout=3.0)
        job = Job(cfg)
        try:
            victim = job.paused()[-1]
            if fault == "kill":
                os.kill(victim, signal.SIGKILL)
            else:
                os.kill(victim, signal.SIGSTOP)  # past the loader's timeout: a WorkerError
            job.go()
            rc, text = job.finish()
            if rc != 3 or f"(pid {victim})" not in text:
                raise RuntimeError(
                    f"expected a WorkerError naming pid {victim}, got ({rc}):\n{text}"
                )
            left = not _gone(victim)
            if left:
                os.kill(victim, signal.SIGCONT)
            self._expect_ok(*self._resume(out, cfg))  # the user starts the job again
            problem = f"worker {victim} left behind" if left else ""
            return Cell(*tally([ids_of(out)], range(self.n)), "WorkerError, resumed", problem)
        finally:
            job.kill()

    # -- fed by a coordinator: a rank killed, or failed by a worker, resumes from its state
    def _fed_job(self, d: Path, coords: Coordinators, **kw: Any) -> tuple[Job, Any]:
        """A one-rank job fed by a fresh coordinator, saving a checkpoint every batch; the
        job, and a function that resumes it (a coordinator restored from the last
        checkpoint, the rank from the state carrying it), returning its exit and output."""
        args = ["--bind", f"127.0.0.1:{free_port()}", "--state", str(d / "state"),
                "--world", "1", "--dataset", str(self.data.path), "--seq-len",
                str(self.seq_len), "--lease-size", "40"]  # fmt: skip
        first, address = coords.start(*args)
        out = d / "r.jsonl"
        token = os.environ.get("STOKER_COORDINATOR_TOKEN")
        cfg = self._cfg(out, coordinator=address, token=token, checkpoints=True, **kw)

        def resume() -> tuple[int, str]:
            state = records(out)[-1]["state"]
            first.kill()
            first.wait()
            coords.start(*args, "--restore", state["checkpoint"])
            return Job({**cfg, "state": state, "pause_at": []}).finish()

        return Job(cfg), resume

    def fedreader(self, fault: str) -> Cell:
        d = self._dir()
        coords = Coordinators()
        job, resume = self._fed_job(d, coords)
        try:
            job.paused()
            if fault == "kill":
                job.proc.send_signal(signal.SIGKILL)
                job.proc.wait()
                self._expect_ok(*resume())
                note = "resumed from its checkpoint"
            else:
                job.go()
                job.proc.send_signal(signal.SIGSTOP)
                time.sleep(HOLD)  # the fault's duration
                job.proc.send_signal(signal.SIGCONT)
                self._expect_ok(*job.finish())
                note = ""
            return Cell(*tally([ids_of(d / "r.jsonl")], range(self.n)), note)
        finally:
            job.kill()
            coords.close()

    def fedworker(self, fault: str) -> Cell:
        d = self._dir()
        coords = Coordinators()
        job, resume = self._fed_job(d, coords, timeout=3.0)
        try:
            victim = job.paused()[-1]
            os.kill(victim, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            job.go()
            rc, text = job.finish()
            if rc != 3 or f"(pid {victim})" not in text:
                raise RuntimeError(
                    f"expected a WorkerError naming pid {victim}, got ({rc}):\n{text}"
                )
            left = not _gone(victim)
            if left:
                os.kill(victim, signal.SIGCONT)
            self._expect_ok(*resume())
            problem = f"worker {victim} left behind" if left else ""
            return Cell(
                *tally([ids_of(d / "r.jsonl")], range(self.n)), "WorkerError, resumed", problem
            )
        finally:
            job.kill()
            coords.close()


COMPONENTS = ("agent", "coordinator", "reader", "worker", "fedreader", "fedworker")
CELLS = [f"{c}-{f}" for c in COMPONENTS for f in ("kill", "stop")]


def main(argv: list[str]) -> int:
    wanted = argv or CELLS
    unknown = [c for c in wanted if c not in CELLS]
    if unknown:
        print(f"unknown cells {unknown}; choose from {' '.join(CELLS)}", file=sys.stderr)
        return 2
    failed = 0
    with tempfile.TemporaryDirectory(prefix="stoker-faults-") as tmp:
        matrix = Matrix(Path(tmp))
        print(f"{matrix.n} samples an epoch; faults at batch {PAUSE}", flush=True)
        print(f"{'component':<12}{'fault':<6}{'lost':>6}{'repeated':>10}  note", flush=True)
        for name in wanted:
            component, fault = name.split("-")
            run: Callable[[str], Cell] = getattr(matrix, component)
            t = time.monotonic()
            try:
                cell = run(fault)
                bad = bool(cell.lost or cell.repeated or cell.problem)
                lost, rep = str(cell.lost), str(cell.repeated)
                note = f"{cell.note}; FAILED: {cell.problem}" if cell.problem else cell.note
            except Exception as exc:  # the cell could not finish: a failure too
                bad = True
                lost = rep = "-"
                note = f"FAILED: {type(exc).__name__}: {exc}".replace("\n", "\n    ")
            failed += bool(bad)
            print(f"{component:<12}{fault.upper():<6}{lost:>6}{rep:>10}  "
                  f"{note} ({time.monotonic() - t:.0f} s)", flush=True)  # fmt: skip
    print("all cells: nothing lost, nothing repeated" if not failed else f"{failed} cell(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
