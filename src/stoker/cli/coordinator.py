"""`stoker coordinator`: run the coordinator standalone."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from stoker import settings
from stoker.cli.common import shared_token
from stoker.coordinator.leases import Config
from stoker.coordinator.limits import HANDSHAKE_TIMEOUT, MAX_CONNECTIONS
from stoker.coordinator.pacing import BUDGET
from stoker.errors import ConfigError


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--bind", default="127.0.0.1:0", help="HOST:PORT (default: loopback, any port)")
    ap.add_argument("--state", required=True, help="state URL for the journal (any fsspec URL)")
    ap.add_argument("--job", default="job", help="job name (journal prefix)")
    ap.add_argument("--world", type=int, required=True, help="number of ranks of the job")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="token dataset URL (with --seq-len)")
    src.add_argument("--num-samples", type=int, help="samples per data epoch, without a dataset")
    ap.add_argument("--seq-len", type=int, help="sequence length of the samples of --dataset")
    ap.add_argument("--drop-remainder", action="store_true")
    ap.add_argument("--lease-size", type=int, default=Config.lease_size, help="positions per lease")
    ap.add_argument("--timeout", type=float, default=Config.timeout, help="heartbeat timeout (s)")
    ap.add_argument(
        "--readahead",
        type=float,
        default=Config.readahead_seconds,
        help="seconds of a consumer's rate it may read ahead of its report (the rest can be stolen)",
    )
    ap.add_argument(
        "--min-readahead",
        type=int,
        default=Config.min_readahead,
        help="positions a consumer may always read ahead",
    )
    ap.add_argument(
        "--config-json",
        metavar="JSON",
        help="every lease setting as one JSON object (the fields of stoker.LeaseConfig); "
        "replaces --lease-size, --timeout, --readahead, --min-readahead and --no-locality",
    )
    ap.add_argument(
        "--metrics-port",
        type=int,
        default=9408,
        help="serve Prometheus metrics on 127.0.0.1:PORT/metrics (default 9408; 0: any free "
        "port; -1: none)",
    )
    ap.add_argument(
        "--no-locality",
        action="store_true",
        help="grant positions in queue order, ignoring what each node's cache holds",
    )
    ap.add_argument(
        "--restore",
        metavar="NAME",
        help="begin from this checkpoint (under --state, checkpoints/<job>/NAME.json) on --world "
        "ranks, discarding the journal's later progress; restart without it to resume the journal",
    )
    ap.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="exit when standard input closes (the process that started it died)",
    )
    ap.add_argument(
        "--token-file",
        help="file holding the shared token (else $STOKER_COORDINATOR_TOKEN); required off "
        "loopback. Without one a loopback coordinator makes its own and writes it to a file "
        "only its user can read (printed), where clients on this machine find it",
    )
    ap.add_argument(
        "--message-budget",
        type=float,
        default=BUDGET,
        help=f"Batch messages a second all node relays together are paced to (default "
        f"{BUDGET:.0f}; 0: no pace). Each relay waits senders / budget seconds between its "
        "messages",
    )
    ap.add_argument(
        "--max-connections",
        type=int,
        default=MAX_CONNECTIONS,
        help=f"connections served at once (default {MAX_CONNECTIONS})",
    )
    ap.add_argument(
        "--handshake-timeout",
        type=float,
        default=HANDSHAKE_TIMEOUT,
        help=f"seconds a new connection has to complete its handshake (default "
        f"{HANDSHAKE_TIMEOUT:.0f})",
    )


def run(args: argparse.Namespace) -> int:
    from stoker.coordinator.server import Server
    from stoker.coordinator.service import Coordinator

    logging.basicConfig(level=logging.INFO, format="%(asctime)s stoker-coordinator %(message)s")
    token = shared_token(args.token_file, "STOKER_COORDINATOR_TOKEN")
    manifest_json = index = b""
    dataset_url = ""
    if args.dataset:
        if not args.seq_len:
            raise ConfigError("--dataset needs --seq-len")
        from stoker.formats.tokens import TokenSource

        source = TokenSource(args.dataset)
        m = source.manifest
        num_samples = (m.num_tokens - 1) // args.seq_len
        manifest_json = source.storage.read("manifest.json")
        index = source.storage.read(m.index.path)
        dataset_url = source.url
    else:
        num_samples = args.num_samples
    if args.config_json:  # every lease setting at once (how coordinator="rank0" starts one)
        config = settings.from_json(Config, args.config_json)
    else:
        config = Config(
            lease_size=args.lease_size,
            timeout=args.timeout,
            readahead_seconds=args.readahead,
            min_readahead=args.min_readahead,
            locality=not args.no_locality,
        )
    coordinator = Coordinator(
        num_samples,
        args.world,
        args.state,
        args.job,
        config=config,
        drop_remainder=args.drop_remainder,
        manifest_json=manifest_json,
        index=index,
        dataset_url=dataset_url,
        restore=args.restore,
        gc_freeze=True,  # this process is the coordinator's own
    )
    if token is None and args.bind.rsplit(":", 1)[-1] not in ("", "0"):
        from stoker import runtime

        token = runtime.read_token(args.bind)  # restarted on its address: the clients' token
        generated_before = token is not None
    else:
        generated_before = False
    coordinator.pacer.budget = max(0.0, args.message_budget)
    server = Server(
        coordinator,
        args.bind,
        token,
        max_connections=args.max_connections,
        handshake_timeout=args.handshake_timeout,
    ).start()
    token_file = None
    if server.generated or generated_before:
        from stoker import runtime

        try:
            token_file = runtime.write_token(server.address, server.token)
        except (OSError, ConfigError) as exc:
            server.stop(grace=0)
            raise ConfigError(
                f"cannot write the coordinator's token ({exc}); give one with --token-file "
                "or STOKER_COORDINATOR_TOKEN"
            ) from None
        print(f"stoker coordinator: token in {token_file} (readable by this user only)", flush=True)
    metrics = ""
    if args.metrics_port >= 0:
        from stoker.coordinator.metrics import CoordinatorCollector
        from stoker.observe.serving import serve

        port = serve(
            args.metrics_port, extra=[CoordinatorCollector(coordinator)], role="coordinator"
        )
        if port is not None:
            metrics = f", metrics on 127.0.0.1:{port}"
    print(
        f"stoker coordinator: serving {server.address} (epoch {coordinator.table.epoch}{metrics})",
        flush=True,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    if args.exit_with_parent:

        def watch() -> None:
            sys.stdin.buffer.read()  # returns at EOF: the parent closed the pipe, or died
            done.set()

        threading.Thread(target=watch, daemon=True, name="stoker-parent").start()
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    server.stop(grace=2)
    if token_file is not None:
        token_file.unlink(missing_ok=True)
    return 0


def replay(args: argparse.Namespace) -> int:
    import json

    from stoker.coordinator.replay import batches

    for b in batches(args.state, args.job):
        if args.epoch is not None and b.epoch != args.epoch:
            continue
        if args.rank is not None and b.rank != args.rank:
            continue
        row: dict[str, object] = {"epoch": b.epoch, "rank": b.rank, "step": b.step}
        if b.sample_ids is not None:
            row["sample_ids"] = b.sample_ids.tolist()
        if args.positions or b.sample_ids is None:
            row["positions"] = b.positions.tolist()
        sys.stdout.write(json.dumps(row, separators=(",", ":")) + "\n")
    return 0
