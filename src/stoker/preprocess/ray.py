"""Preprocessing workers as Ray actors, placed on a Ray cluster's CPU nodes.

    import ray, stoker
    from stoker.preprocess.ray import start_workers

    ray.init()  # (or let start_workers join the cluster at RAY_ADDRESS)
    with start_workers(16, coordinator="trainer-0:7777", token_file="/secrets/pool") as pool:
        ...  # trainers: RecordDataset(url, preprocess="coordinator://trainer-0:7777")

Each actor runs one :func:`~stoker.preprocess.worker.serve_worker` (an Arrow Flight
server) bound to its node's address, any free port, and offers itself to the job's
coordinator, so trainers find the workers as they come and go; without a coordinator,
:attr:`RayWorkers.url` names them for ``preprocess=``. The actors live as long as the
process that started them (the ``python -m stoker.preprocess.ray`` launcher, or the
user's driver).

What travels through Ray: this module's actor class by reference (each node imports
the stoker installed there) and the actors' arguments, all strings and numbers. The
rows never do: trainers read them over Arrow Flight, as from any worker, and what a
worker may run is what :mod:`stoker.preprocess.worker` allows.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stoker.errors import ConfigError

#: Seconds :func:`start_workers` waits for its actors to serve.
START_SECONDS = 120.0


@dataclass(frozen=True)
class Node:
    """A node of the Ray cluster, as :func:`place` sees it."""

    node_id: str
    address: str
    cpus: float
    gpus: float


def nodes_of(listing: Iterable[dict[str, Any]]) -> list[Node]:
    """The live nodes in ``ray.nodes()``'s listing."""
    out = []
    for n in listing:
        if not n.get("Alive", n.get("alive", False)):
            continue
        res = n.get("Resources", {})
        out.append(
            Node(n["NodeID"], n["NodeManagerAddress"], res.get("CPU", 0.0), res.get("GPU", 0.0))
        )
    return out


def place(nodes: list[Node], count: int, placement: str, cpus: float) -> list[Node]:
    """The node of each of ``count`` workers of ``cpus`` CPUs each: spread over the
    nodes without GPUs (``placement="cpu"``) or over all (``"any"``), each node given
    workers in turn, as many as its CPUs hold (a :class:`ConfigError` beyond them)."""
    if placement not in ("cpu", "any"):
        raise ConfigError(f"placement={placement!r}: 'cpu' (nodes without GPUs) or 'any'")
    if cpus <= 0:
        raise ConfigError(f"num_cpus={cpus}: a worker needs a share of a CPU (> 0)")
    chosen = [n for n in nodes if placement == "any" or n.gpus == 0]
    if count > 0 and not chosen:
        raise ConfigError(
            "no node of the Ray cluster is without GPUs (placement='cpu'): add CPU nodes, "
            "or say placement='any' to run the workers beside the trainers"
        )
    room = {n.node_id: int(n.cpus // cpus + 1e-9) for n in chosen}
    if count > sum(room.values()):
        raise ConfigError(
            f"{count} workers of {cpus} CPUs do not fit the Ray cluster's "
            f"{'CPU ' if placement == 'cpu' else ''}nodes ({sum(room.values())} fit: "
            + ", ".join(f"{n.address} {n.cpus:g} CPUs" for n in chosen)
            + ")"
        )
    out: list[Node] = []
    while len(out) < count:
        for n in chosen:
            if room[n.node_id] > 0 and len(out) < count:
                room[n.node_id] -= 1
                out.append(n)
    return out


class WorkerActor:
    """One preprocessing worker in a Ray actor's process (see :func:`start_workers`)."""

    def __init__(self, host: str, token: str | None, options: dict[str, Any]) -> None:
        from stoker.preprocess.worker import serve_worker

        cache_dir = options.get("cache_dir")
        self.served = serve_worker(
            f"{host}:0",
            token,
            local={"cache_dir": cache_dir} if cache_dir else {"agent": False},
            datasets=options.get("datasets"),
            transforms=options.get("transforms"),
            coordinator=options.get("coordinator"),
            metrics_port=options.get("metrics_port", -1),
        )

    def address(self) -> str:
        return self.served.address

    def figures(self) -> dict[str, float]:
        return self.served.worker.figures()

    def metrics_port(self) -> int | None:
        return self.served.metrics_port

    def stop(self) -> None:
        self.served.stop()


class RayWorkers:
    """Preprocessing workers running as Ray actors (:func:`start_workers`)."""

    def __init__(self, token: str | None, options: dict[str, Any], placement: str, cpus: float,
                 resources: dict[str, float], max_restarts: int) -> None:  # fmt: skip
        self.token = token  # (None: each worker drew its own, in the runtime directory)
        self._options, self._placement, self._cpus = options, placement, cpus
        self._resources, self._restarts = resources, max_restarts
        self._actors: list[tuple[Any, Node]] = []
        self._lock = threading.Lock()

    @property
    def addresses(self) -> list[str]:
        """Where each worker serves now, in the order they were started (a restarted
        actor serves on a fresh port; one being restarted, or dead, is left out)."""
        import ray

        out = []
        for ref in [a.address.remote() for a, _ in self._actors]:
            try:
                out.append(ray.get(ref, timeout=30))
            except ray.exceptions.RayError:
                pass
        return out

    @property
    def url(self) -> str:
        """``preprocess=`` for a trainer that names the workers (without a coordinator)."""
        return "grpc://" + ",".join(self.addresses)

    @property
    def nodes(self) -> list[str]:
        """The node each worker was placed on (its address in the Ray cluster)."""
        return [n.address for _, n in self._actors]

    def figures(self) -> list[dict[str, float]]:
        """What each worker made so far (its :meth:`PreprocessWorker.figures`)."""
        import ray

        return list(ray.get([a.figures.remote() for a, _ in self._actors]))

    def scale(self, count: int) -> None:
        """Run ``count`` workers: start more (on the nodes with room) or stop the last
        ones started (each says it is leaving to the coordinator first)."""

        with self._lock:
            if count < len(self._actors):
                going = self._actors[count:]
                del self._actors[count:]
                _stop([a for a, _ in going])
                return
            if count == len(self._actors):
                return
            taken: dict[str, int] = {}
            for _, n in self._actors:
                taken[n.node_id] = taken.get(n.node_id, 0) + 1
            free = [
                Node(n.node_id, n.address, n.cpus - taken.get(n.node_id, 0) * self._cpus, n.gpus)
                for n in nodes_of(_listing())
            ]
            where = place(free, count - len(self._actors), self._placement, self._cpus)
            self._actors.extend(self._start(where))

    def _start(self, where: list[Node]) -> list[tuple[Any, Node]]:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        cls: Any = ray.remote(WorkerActor)
        actors: list[Any] = [
            cls.options(
                num_cpus=self._cpus,
                resources=self._resources or None,
                max_restarts=self._restarts,
                scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False),
            ).remote(n.address, self.token, self._options)
            for n in where
        ]
        try:
            ray.get([a.address.remote() for a in actors], timeout=START_SECONDS)
        except Exception as exc:  # (Ray's own kinds: an actor that died, a timeout)
            _stop(actors)
            raise ConfigError(f"the preprocessing workers did not start on Ray: {exc}") from None
        return list(zip(actors, where, strict=True))

    def shutdown(self) -> None:
        """Stop every worker (each leaves the coordinator's pool) and end its actor."""
        self.scale(0)

    def __enter__(self) -> RayWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _listing() -> list[dict[str, Any]]:
    import ray

    return list(ray.nodes())  # type: ignore[no-untyped-call]


def _stop(actors: list[Any]) -> None:
    import ray

    try:
        ray.get([a.stop.remote() for a in actors], timeout=30)
    except Exception:
        pass  # (one that died already stops nothing; it is killed below either way)
    for a in actors:
        ray.kill(a, no_restart=True)


def start_workers(
    count: int,
    *,
    coordinator: str | None = None,
    token: str | None = None,
    token_file: str | None = None,
    num_cpus: float = 1.0,
    placement: str = "cpu",
    resources: dict[str, float] | None = None,
    cache_dir: str | None = None,
    datasets: list[str] | None = None,
    transforms: list[str] | None = None,
    metrics_port: int = -1,
    max_restarts: int | None = None,
    ray_address: str | None = None,
) -> RayWorkers:
    """Start ``count`` preprocessing workers as Ray actors of ``num_cpus`` CPUs each, on
    the nodes without GPUs (``placement="any"``: on any node; ``resources``: custom Ray
    resources each actor also takes), each bound to its node's address.

    ``coordinator``: each offers itself there, where ``coordinator://`` trainers find it
    (a worker that Ray restarts, up to ``max_restarts`` times, default 3, offers itself
    anew). ``token`` / ``token_file`` / ``$STOKER_PREPROCESS_TOKEN``: the shared token
    the trainers give (``preprocess_token=``), required off loopback; on a local Ray
    instance without one, each worker draws its own and keeps it in this user's runtime
    directory, where this user's trainers find it (as ``stoker preprocess-worker``). ``cache_dir``: read through each node's agent on that
    directory; ``datasets`` / ``transforms``: the allow-lists of
    ``stoker preprocess-worker``; ``metrics_port``: each worker's metrics on that node's
    loopback (0: any free port; -1: none). Joins the Ray cluster at ``ray_address`` (or
    ``$RAY_ADDRESS``) unless this process already did."""
    from stoker.cli.common import shared_token
    from stoker.coordinator.server import is_loopback
    from stoker.extras import require

    require("ray", "ray", "stoker.preprocess.ray")
    require("pyarrow", "records", "stoker.preprocess.ray")
    import ray

    if count < 0:
        raise ConfigError(f"count={count}: a number of workers (>= 0)")
    if not ray.is_initialized():
        ray.init(address=ray_address)
    token = token or shared_token(token_file, "STOKER_PREPROCESS_TOKEN")
    if token is None:
        off = [n.address for n in nodes_of(_listing()) if not is_loopback(f"{n.address}:0")]
        if off:
            raise ConfigError(
                f"the Ray cluster's nodes ({', '.join(off)}) are not loopback: give the "
                "workers a shared token (token=, token_file= or STOKER_PREPROCESS_TOKEN)"
            )
    if max_restarts is None:
        max_restarts = 3 if coordinator else 0
    options = {
        "coordinator": coordinator,
        "cache_dir": cache_dir,
        "datasets": datasets,
        "transforms": transforms,
        "metrics_port": metrics_port,
    }
    workers = RayWorkers(token, options, placement, num_cpus, dict(resources or {}), max_restarts)
    workers.scale(count)
    return workers


def main(argv: list[str] | None = None) -> int:
    """``python -m stoker.preprocess.ray``: start the workers and keep them until
    SIGTERM or Ctrl-C."""
    ap = argparse.ArgumentParser(
        prog="python -m stoker.preprocess.ray", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--workers", type=int, required=True, help="how many workers to run")
    ap.add_argument("--coordinator", metavar="HOST:PORT", help="the job's coordinator (their pool)")
    ap.add_argument(
        "--token-file", help="file holding the shared token (else $STOKER_PREPROCESS_TOKEN)"
    )
    ap.add_argument("--num-cpus", type=float, default=1.0, help="CPUs of each worker (default 1)")
    ap.add_argument("--placement", choices=("cpu", "any"), default="cpu",
                    help="nodes without GPUs only (default), or any node")  # fmt: skip
    ap.add_argument("--cache-dir", help="read through each node's agent on DIR")
    ap.add_argument("--dataset", action="append", metavar="URL_PREFIX", help="serve only these")
    ap.add_argument("--transform", action="append", metavar="MODULE", help="run only these")
    ap.add_argument("--metrics-port", type=int, default=-1, help="each worker's (0: any free)")
    ap.add_argument("--ray-address", help="the Ray cluster (default: $RAY_ADDRESS, or a local one)")
    args = ap.parse_args(argv)
    done = threading.Event()
    with start_workers(
        args.workers,
        coordinator=args.coordinator,
        token_file=args.token_file,
        num_cpus=args.num_cpus,
        placement=args.placement,
        cache_dir=args.cache_dir,
        datasets=args.dataset,
        transforms=args.transform,
        metrics_port=args.metrics_port,
        ray_address=args.ray_address,
    ) as pool:
        signal.signal(signal.SIGTERM, lambda *_: done.set())  # (after Ray's own handler)
        for address in pool.addresses:
            print(f"stoker.preprocess.ray: worker serving {address}", flush=True)
        try:
            done.wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    # (through the module's own name: the actors' class must be stoker's, importable on
    # every node, not this __main__'s)
    from stoker.preprocess.ray import main as _main

    raise SystemExit(_main())
