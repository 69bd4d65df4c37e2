"""`stoker preprocess-worker`: a preprocessing worker (:mod:`stoker.preprocess.worker`)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from stoker.cli.common import shared_token


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
    from stoker.extras import require

    require("pyarrow", "records", "stoker preprocess-worker")
    from stoker.preprocess.worker import serve_worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s stoker-preprocess %(message)s")
    token = shared_token(args.token_file, "STOKER_PREPROCESS_TOKEN")
    local = {"cache_dir": args.cache_dir} if args.cache_dir else {"agent": False}
    served = serve_worker(
        args.bind,
        token,
        local=local,
        datasets=args.dataset,
        transforms=args.transform,
        coordinator=args.coordinator,
        advertise=args.advertise,
        metrics_port=args.metrics_port,
    )
    if served.token_file is not None:
        print(
            f"stoker preprocess-worker: token in {served.token_file} (readable by this user only)"
        )
    metrics = ""
    if served.metrics_port is not None:
        metrics = f" (metrics on 127.0.0.1:{served.metrics_port})"
    print(f"stoker preprocess-worker: serving {served.worker.address}{metrics}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    served.stop()
    return 0
