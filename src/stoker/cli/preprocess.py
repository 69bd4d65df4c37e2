"""`stoker preprocess-worker`: a preprocessing worker (:mod:`stoker.preprocess.worker`)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from stoker.cli.common import shared_token
from stoker.errors import ConfigError


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--bind", default="127.0.0.1:0", help="HOST:PORT (default: loopback, any port)")
    ap.add_argument(
        "--token-file",
        help="file holding the shared token (else $STOKER_PREPROCESS_TOKEN); required off "
        "loopback. On loopback without one, a token is drawn and kept in the runtime "
        "directory, where this user's trainers find it",
    )
    ap.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="offer this worker to the job's coordinator every few seconds: trainers whose "
        "dataset says preprocess='coordinator://HOST:PORT' find it there (its token: "
        "$STOKER_COORDINATOR_TOKEN, $STOKER_COORDINATOR_TOKEN_FILE or this user's file)",
    )
    ap.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="the address trainers reach this worker at, offered to the coordinator "
        "(default: the bound one; needed when binding 0.0.0.0)",
    )
    ap.add_argument(
        "--dataset",
        action="append",
        metavar="URL_PREFIX",
        help="serve only datasets under this URL prefix (repeat for several; default: any "
        "dataset this worker's credentials reach)",
    )
    ap.add_argument(
        "--transform",
        action="append",
        metavar="MODULE",
        help="run only user transforms from this package or module (repeat for several; "
        "default: any installed here)",
    )
    ap.add_argument(
        "--metrics-port",
        type=int,
        default=9410,
        help="serve Prometheus metrics on 127.0.0.1:PORT/metrics (default 9410; 0: any free "
        "port; -1: none)",
    )
    ap.add_argument(
        "--cache-dir",
        help="read the datasets through this machine's node agent on DIR (default: no agent, "
        "each block read from storage)",
    )


def run(args: argparse.Namespace) -> int:
    from stoker import runtime
    from stoker.extras import require

    require("pyarrow", "records", "stoker preprocess-worker")
    from stoker.preprocess.worker import PreprocessWorker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s stoker-preprocess %(message)s")
    token = shared_token(args.token_file, "STOKER_PREPROCESS_TOKEN")
    if args.coordinator and not args.advertise and _everywhere(args.bind):
        raise ConfigError(
            f"bound to {args.bind}: say which address trainers reach this worker at "
            "(--advertise HOST:PORT)"
        )
    from stoker.coordinator.server import is_loopback

    offered = args.advertise or args.bind
    if args.coordinator and is_loopback(offered) and not is_loopback(args.coordinator):
        raise ConfigError(
            f"the coordinator {args.coordinator} is on another machine, whose trainers "
            f"cannot reach this worker at {offered}: bind (or --advertise) an address "
            "they reach"
        )
    local = {"cache_dir": args.cache_dir} if args.cache_dir else {"agent": False}
    worker = PreprocessWorker(args.bind, token, local, args.dataset, args.transform)
    token_file = None
    if worker.generated:
        try:
            token_file = runtime.write_token(worker.address, worker.token, "preprocess")
        except (OSError, ConfigError) as exc:
            worker.shutdown()
            raise ConfigError(
                f"cannot write the worker's token ({exc}); give one with --token-file or "
                "STOKER_PREPROCESS_TOKEN"
            ) from None
        print(f"stoker preprocess-worker: token in {token_file} (readable by this user only)")
    offers = None
    if args.coordinator:
        from stoker.preprocess.worker import Offers

        offers = Offers(worker, args.coordinator, args.advertise or worker.address)
        offers.start()
    metrics = ""
    if args.metrics_port >= 0:
        from stoker.observe.serving import serve
        from stoker.preprocess.worker import WorkerCollector

        port = serve(args.metrics_port, extra=[WorkerCollector(worker)], role="preprocess")
        if port is not None:
            metrics = f" (metrics on 127.0.0.1:{port})"
    print(f"stoker preprocess-worker: serving {worker.address}{metrics}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    if offers is not None:
        offers.stop()
    worker.shutdown()
    if token_file is not None:
        token_file.unlink(missing_ok=True)
    return 0


def _everywhere(bind: str) -> bool:
    """Whether ``bind`` is every address (what a trainer cannot reach the worker at)."""
    return bind.rsplit(":", 1)[0].strip("[]") in ("0.0.0.0", "::", "")
