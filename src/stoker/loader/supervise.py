"""A loader's main process and its worker processes: errors that name a worker, and a
shutdown that leaves no worker behind.

Every way a worker can fail the main process (it raised, it died, it closed its
pipe, it stopped answering) becomes a :class:`~stoker.errors.WorkerError` naming
the worker's number and pid. :func:`stop` asks each worker to stop, then sends
SIGTERM (and SIGCONT, since a stopped process acts on nothing else), then
SIGKILL, a grace period apart, so a stopped or wedged worker is gone when it
returns.
"""

from __future__ import annotations

import os
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

from stoker.errors import WorkerError

#: Seconds a worker gets to stop after being asked, and again after SIGTERM.
GRACE = 5.0


def _exit_text(proc: Any) -> str:
    code = proc.exitcode
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def is_stopped(pid: int | None) -> bool:
    """True when the process is stopped (SIGSTOP, SIGTSTP, a tracer): state T or t."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] in (["T"], ["t"])


def gone(worker: int, proc: Any, cause: BaseException | None = None) -> WorkerError:
    """The worker died or its pipe broke: say how it ended."""
    proc.join(timeout=1.0)  # its pipe closed: it is exiting; collect its exit code
    how = _exit_text(proc)
    if proc.exitcode is None:
        how = f"closed its pipe ({type(cause).__name__}: {cause})" if cause else "closed its pipe"
    return WorkerError(
        f"loader worker {worker} (pid {proc.pid}) {how}", worker=worker, pid=proc.pid
    )


def silent(worker: int, proc: Any, waited: float) -> WorkerError:
    """The worker sent nothing for ``waited`` seconds (the loader's ``timeout``)."""
    state = " (the process is stopped: SIGSTOP?)" if is_stopped(proc.pid) else ""
    return WorkerError(
        f"loader worker {worker} (pid {proc.pid}) is not responding: it sent no batch for "
        f"{waited:g} s (TokenLoader(timeout={waited:g})){state}",
        worker=worker,
        pid=proc.pid,
    )


def stop(conns: list[Connection], procs: list[Any], grace: float = GRACE) -> None:
    """Ask every worker to stop, escalate to SIGTERM and then SIGKILL for one that does
    not, reap them all, close the pipes."""
    for conn in conns:
        try:
            conn.send(None)
        except (OSError, ValueError):  # gone already, or the pipe is closed
            pass
    deadline = time.monotonic() + grace
    for proc in procs:
        if not is_stopped(proc.pid):  # a stopped one reads nothing: no use waiting
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
    late = [p for p in procs if p.is_alive()]
    for proc in late:
        proc.terminate()
        try:
            os.kill(proc.pid, signal.SIGCONT)  # a stopped process acts on SIGTERM once continued
        except OSError:
            pass
    deadline = time.monotonic() + grace
    for proc in late:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in late:
        if proc.is_alive():
            proc.kill()  # SIGKILL: even a process that ignores SIGTERM
            proc.join()
    for conn in conns:
        conn.close()
