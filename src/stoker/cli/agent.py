"""``stoker agent``: run the node agent in the foreground (readers start one themselves
when none runs, with ``--config-json``)."""

from __future__ import annotations

import argparse
import logging
import sys

from stoker import settings
from stoker.cache.agent import Agent
from stoker.cache.config import METRICS_PORT, AgentConfig
from stoker.errors import AgentRunningError, ConfigError, StokerError
from stoker.units import parse_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="stoker agent", description="Run the node agent (node cache)."
    )
    add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        return run(args)
    except StokerError as exc:  # as `stoker agent` says it
        print(f"stoker agent: error: {exc}", file=sys.stderr)
        return 2


def add_arguments(ap: argparse.ArgumentParser) -> None:
    d = AgentConfig  # every default is the settings dataclass's
    ap.add_argument("--cache-dir", help="directory of the disk tier (owned by the agent)")
    ap.add_argument("--cache-limit", type=parse_size, help="disk tier size, e.g. 200G")
    ap.add_argument(
        "--shm-limit", type=parse_size, default=d.shm_limit, help="memory tier (/dev/shm) size"
    )
    ap.add_argument(
        "--max-remote", type=int, default=d.max_remote, help="concurrent requests to remote storage"
    )
    ap.add_argument(
        "--max-rate",
        type=float,
        default=d.max_rate,
        help="requests per second to remote (0: no cap)",
    )
    ap.add_argument(
        "--shm-root",
        default=d.shm_root,
        help="where the memory tier lives (default /dev/shm; any tmpfs works)",
    )
    ap.add_argument(
        "--idle-exit",
        type=float,
        default=d.idle_exit,
        help="exit after this many seconds without a connected reader (default: never)",
    )
    ap.add_argument(
        "--max-connections",
        type=int,
        default=d.max_connections,
        help=f"reader connections served at once (default {d.max_connections})",
    )
    ap.add_argument(
        "--frame-timeout",
        type=float,
        default=d.frame_timeout,
        help="seconds a request may take to arrive once begun, and a new connection to say "
        f"hello (default {d.frame_timeout:.0f})",
    )
    ap.add_argument(
        "--metrics-port",
        type=int,
        default=METRICS_PORT,
        help=f"serve /metrics on 127.0.0.1:PORT (default {METRICS_PORT}; 0: any free port; "
        "-1: none)",
    )
    ap.add_argument(
        "--config-json",
        metavar="JSON",
        help="every setting as one JSON object (the fields of stoker.cache.config.AgentConfig; "
        "how a reader that starts the agent passes them); replaces the flags above",
    )


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    """The settings the command line gives (``--config-json``, else the flags)."""
    if args.config_json:
        return settings.from_json(AgentConfig, args.config_json)
    if not args.cache_dir or args.cache_limit is None:
        raise ConfigError("stoker agent needs --cache-dir and --cache-limit (or --config-json)")
    return AgentConfig(
        cache_dir=str(args.cache_dir),
        cache_limit=args.cache_limit,
        shm_limit=args.shm_limit,
        max_remote=args.max_remote,
        max_rate=args.max_rate,
        shm_root=args.shm_root,
        idle_exit=args.idle_exit,
        max_connections=args.max_connections,
        frame_timeout=args.frame_timeout,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s stoker-agent %(levelname)s %(message)s"
    )
    agent = Agent.from_config(config_from_args(args))  # a bad setting: `stoker: error: ...`
    try:
        agent.start()
    except AgentRunningError as exc:
        print(f"stoker agent: {exc}", flush=True)
        return 3
    except StokerError as exc:
        print(f"stoker agent: {exc}", flush=True)
        return 2
    print(f"stoker agent: serving {agent.paths.socket}", flush=True)
    if agent.metrics_address:
        print(
            f"stoker agent: metrics on http://127.0.0.1:{agent.metrics_address[1]}/metrics",
            flush=True,
        )
    import signal

    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    try:
        agent.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        agent.stop()
    return 0
