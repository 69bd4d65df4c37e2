"""``stoker ...``: the command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from stoker.errors import StokerError


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def _storage_options(text: str | None) -> dict | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise StokerError(f"--storage-options is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise StokerError("--storage-options must be a JSON object")
    return value


def cmd_build_tokens(args: argparse.Namespace) -> int:
    from stoker.errors import InputError
    from stoker.extras import require
    from stoker.formats.token_writer import WriteOptions
    from stoker.ingest import SourceOptions
    from stoker.tokenizing import BuildStats, build_tokens

    tqdm = require("tqdm", "build", "build-tokens", InputError).tqdm
    bars: list = []  # made at the first report: the sources are checked, their bytes known

    def progress(stats: BuildStats) -> None:
        if not bars:
            bars.append(
                tqdm(
                    total=stats.total_bytes,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    dynamic_ncols=True,
                    disable=args.quiet,
                )
            )
        bar = bars[0]
        bar.set_postfix_str(f"{stats.documents:,} docs, {stats.tokens:,} tokens", refresh=False)
        bar.update(stats.source_bytes - bar.n)

    opts = WriteOptions(
        block_tokens=args.block_tokens,
        level=args.level,
        shuffle=args.byte_shuffle,
        dictionary=args.dictionary,
        min_match=args.min_match or None,
    )
    try:
        manifest, stats = build_tokens(
            args.sources,
            args.out,
            args.tokenizer,
            eos_token=args.eos_token,
            source_options=SourceOptions(args.text_field, args.text_column, args.txt_split),
            write_options=opts,
            workers=args.workers,
            storage_options=_storage_options(args.storage_options),
            overwrite=args.overwrite,
            progress=progress,
        )
    finally:
        for bar in bars:
            bar.close()
    print(
        f"wrote {args.out}: {manifest.num_documents:,} documents, {manifest.num_tokens:,} tokens, "
        f"{manifest.num_blocks:,} blocks, {_size(manifest.compressed_bytes)} "
        f"({manifest.compressed_bytes / manifest.raw_bytes:.3f} of raw {manifest.dtype}) "
        f"in {stats.seconds:.1f} s ({stats.text_bytes / max(stats.seconds, 1e-9) / 1e6:.1f} MB/s of text)"
    )
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from stoker.formats.tokens import TokenSource

    src = TokenSource(args.url, _storage_options(args.storage_options))
    m = src.manifest
    comp = m.compression
    rows = [
        ("dataset", src.url),
        ("id", m.dataset_id),
        (
            "format",
            f"{m.format} v{m.format_version} (written by {m.writer or '?'}, {m.created or '?'})",
        ),
        ("tokens", f"{m.num_tokens:,}"),
        ("documents", f"{m.num_documents:,}"),
        ("dtype / vocab", f"{m.dtype} / {m.vocab_size:,} (eos id {m.eos_id})"),
        ("blocks", f"{m.num_blocks:,} of {m.block_tokens:,} tokens in {len(m.files)} file(s)"),
        ("bytes", f"{_size(m.compressed_bytes)} stored, {_size(m.raw_bytes)} raw"),
        (
            "compression",
            f"{m.compressed_bytes / m.raw_bytes:.3f} of raw ({m.raw_bytes / max(m.compressed_bytes, 1):.2f}x); "
            f"zstd level {comp.level}, dictionary {'yes' if comp.dictionary else 'no'}, byte shuffle {'yes' if comp.shuffle else 'no'}",
        ),
        (
            "tokenizer",
            f"{m.tokenizer.name} sha256 {m.tokenizer.sha256[:16]}" if m.tokenizer else "unknown",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    start = max(0, min(args.offset, m.num_tokens - 1))
    tokens = src.tokens(start, min(m.num_tokens, start + args.sample_tokens))
    try:
        from tokenizers import Tokenizer
    except ImportError:  # decoding is optional: stoker[build]
        Tokenizer = None  # type: ignore[assignment,misc]
    if m.tokenizer is not None and m.tokenizer.path is not None and Tokenizer is not None:
        tok = Tokenizer.from_str(src.storage.read(m.tokenizer.path).decode())
        text = tok.decode(tokens.tolist(), skip_special_tokens=False)
        print(f"\nsample (tokens {start:,}..{start + len(tokens):,}, decoded):\n{text}")
    else:
        print(f"\nsample (tokens {start:,}..{start + len(tokens):,}): {tokens.tolist()}")
        if m.tokenizer is not None and m.tokenizer.path is not None:
            print("(to see it decoded: pip install 'stoker[build]')")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from stoker.extras import require

    for module in ("tokenizers", "tqdm"):  # it trains a tokenizer and shows a progress bar
        require(module, "build", "stoker demo")
    from stoker.demo import run_demo

    return run_demo(
        steps=args.steps,
        world=args.world,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        workdir=args.workdir,
        num_workers=args.num_workers,
        metrics_port=None if args.no_metrics else args.metrics_port,
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    import time

    from stoker import doctor

    if args.prometheus:
        now = time.time()
        before = doctor.scrape_prometheus(args.prometheus, now - args.window)
        after = doctor.scrape_prometheus(args.prometheus, now)
        seconds = args.window
    else:
        endpoints = doctor.endpoints_or_discover(args.endpoint)
        before, t0 = doctor.scrape(endpoints), time.monotonic()
        time.sleep(args.window)  # the measurement window
        after = doctor.scrape(endpoints)
        seconds = time.monotonic() - t0
    bandwidth = args.storage_bandwidth * 1e6 if args.storage_bandwidth else None
    d = doctor.diagnose(doctor.evidence(before, after, seconds), bandwidth)
    print(json.dumps(d.to_dict(), indent=1) if args.json else doctor.render(d))
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    from stoker import top

    return top.run(args.endpoint, args.interval, args.iterations)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stoker", description="Keeps the GPUs of a training job fed.")
    from stoker import __version__

    p.add_argument("--version", action="version", version=f"stoker {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build-tokens", help="tokenize text files into a token dataset")
    b.add_argument("sources", nargs="+", help=".txt, .jsonl or .parquet files (any fsspec URL)")
    b.add_argument("--out", required=True, help="dataset URL (path, s3://..., ...)")
    b.add_argument(
        "--tokenizer",
        required=True,
        help="Hugging Face tokenizers JSON file (a tokenizer.json; README: how to train one)",
    )
    b.add_argument("--eos-token", help="end-of-document token (default: the tokenizer's)")
    b.add_argument("--text-field", default="text", help="JSON field of .jsonl inputs")
    b.add_argument("--text-column", default="text", help="column of .parquet inputs")
    b.add_argument(
        "--txt-split",
        choices=("file", "line", "blank"),
        default="file",
        help="a .txt document is a whole file, a line, or a blank-line paragraph",
    )
    from stoker.formats.token_writer import (
        DEFAULT_BLOCK_TOKENS,
        DEFAULT_LEVEL,
        DEFAULT_MIN_MATCH,
        DEFAULT_SHUFFLE,
    )

    b.add_argument("--block-tokens", type=int, default=DEFAULT_BLOCK_TOKENS)
    b.add_argument("--level", type=int, default=DEFAULT_LEVEL, help="zstd level")
    b.add_argument("--dictionary", action="store_true", help="train a zstd dictionary")
    b.add_argument(
        "--min-match",
        type=int,
        default=DEFAULT_MIN_MATCH,
        help="zstd minimum match length in bytes (0: the level's own)",
    )
    b.add_argument("--byte-shuffle", action=argparse.BooleanOptionalAction, default=DEFAULT_SHUFFLE)
    b.add_argument("--workers", type=int, help="tokenizer processes (default: CPU count)")
    b.add_argument("--storage-options", help="JSON object of fsspec options for --out")
    b.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(func=cmd_build_tokens)

    i = sub.add_parser("inspect", help="describe a token dataset")
    i.add_argument("url")
    i.add_argument("--storage-options", help="JSON object of fsspec options")
    i.add_argument("--offset", type=int, default=0, help="first token of the sample shown")
    i.add_argument("--sample-tokens", type=int, default=64)
    i.set_defaults(func=cmd_inspect)

    d = sub.add_parser("demo", help="build a small dataset and train a tiny model on 2 CPU ranks")
    d.add_argument("--steps", type=int, default=60)
    d.add_argument("--world", type=int, default=2)
    d.add_argument("--seq-len", type=int, default=128)
    d.add_argument("--batch-size", type=int, default=8)
    d.add_argument("--num-workers", type=int, default=0)
    d.add_argument("--workdir", help="keep the dataset here (default: a temporary directory)")
    d.add_argument(
        "--metrics-port",
        type=int,
        default=9400,
        help="rank r serves Prometheus metrics on 127.0.0.1:PORT+r (default 9400; 0: any free "
        "port; a taken port moves to a free one)",
    )
    d.add_argument("--no-metrics", action="store_true", help="serve no metrics")
    d.set_defaults(func=cmd_demo)

    from stoker.cache import agent

    a = sub.add_parser(
        "agent",
        help="run the node agent (the per-machine cache) in the foreground",
        description="Run the node agent that owns --cache-dir. Readers start one "
        "automatically when none runs; run it by hand to choose its limits or to keep it up.",
    )
    agent.add_arguments(a)
    a.set_defaults(func=agent.run)

    from stoker.coordinator import cli as coordinator_cli

    c = sub.add_parser(
        "coordinator",
        help="run the coordinator (leases, work stealing, exactly-once) standalone",
        description="Run the coordinator of one job: leases of epoch positions to its "
        "consumers, journaled to --state so that a restarted coordinator resumes.",
    )
    coordinator_cli.add_arguments(c)
    c.set_defaults(func=coordinator_cli.run)

    doc = sub.add_parser(
        "doctor",
        help="say where a running job's data path is stuck, from its metrics",
        description="Scrape the job's metrics endpoints (ranks, node agents, coordinator) twice, "
        "--window seconds apart (or ask a Prometheus server), and name the bottleneck: storage "
        "bandwidth, cache misses, decode/preprocessing CPU, a straggling rank, prefetch, or "
        "none (the GPU), with the numbers against their thresholds and what to change.",
    )
    src = doc.add_mutually_exclusive_group()
    src.add_argument(
        "--endpoint",
        action="extend",
        nargs="+",
        help="HOST:PORT of /metrics endpoints (several, or repeat the flag); default: the "
        "endpoints this machine's stoker processes recorded in the runtime directory",
    )
    src.add_argument("--prometheus", help="URL of a Prometheus server that scrapes the job")
    doc.add_argument("--window", type=float, default=10.0, help="seconds between the two looks")
    doc.add_argument(
        "--storage-bandwidth", type=float, help="MB/s the storage gives the job (for utilisation)"
    )
    doc.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    doc.set_defaults(func=cmd_doctor)

    top = sub.add_parser("top", help="a live view of a running job from its metrics endpoints")
    top.add_argument(
        "--endpoint",
        action="extend",
        nargs="+",
        help="HOST:PORT (several, or repeat the flag); default: the endpoints this machine's "
        "stoker processes recorded in the runtime directory",
    )
    top.add_argument("--interval", type=float, default=2.0)
    top.add_argument("--iterations", type=int, help="stop after this many screens")
    top.set_defaults(func=cmd_top)

    r = sub.add_parser(
        "replay",
        help="print a coordinated run's batches, rank by rank, from the coordinator's journal",
        description="Every rank's batches of a coordinated run in the order training got "
        "them, as JSON lines: epoch, rank, step, sample_ids (and positions with --positions).",
    )
    r.add_argument("--state", required=True, help="the coordinator's state URL")
    r.add_argument("--job", default="job")
    r.add_argument("--epoch", type=int, help="only this epoch")
    r.add_argument("--rank", type=int, help="only this rank")
    r.add_argument("--positions", action="store_true", help="also print stream positions")
    r.set_defaults(func=coordinator_cli.replay)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except StokerError as exc:
        print(f"stoker: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
