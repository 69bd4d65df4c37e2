"""``stoker ...`` (and ``python -m stoker``): the command line, one module per verb.

``tokens`` (build-tokens, inspect, verify, convert), ``records`` (build-records, and
inspect of a records dataset), ``agent`` (the node agent), ``coordinator``
(coordinator, replay), ``preprocess`` (preprocess-worker), ``observe`` (doctor, top);
the demo is :mod:`stoker.demo`. Each verb's module is imported when the parser is built, its heavy imports when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from stoker.errors import StokerError


def cmd_demo(args: argparse.Namespace) -> int:
    from stoker.extras import require

    if args.images:
        for module in ("pyarrow", "PIL"):  # records, and the pictures it draws
            require(module, "records", "stoker demo --images")
        from stoker.demo_images import run_image_demo

        return run_image_demo(
            steps=args.steps,
            world=args.world,
            batch_size=16 if args.batch_size is None else args.batch_size,
            workdir=args.workdir,
            num_workers=args.num_workers,
        )

    for module in ("tokenizers", "tqdm"):  # it trains a tokenizer and shows a progress bar
        require(module, "build", "stoker demo")
    from stoker.demo import run_demo

    return run_demo(
        steps=args.steps,
        world=args.world,
        seq_len=args.seq_len,
        batch_size=8 if args.batch_size is None else args.batch_size,
        workdir=args.workdir,
        num_workers=args.num_workers,
        metrics_port=None if args.no_metrics else args.metrics_port,
    )


def build_parser() -> argparse.ArgumentParser:
    from stoker.cli import observe, records, tokens

    p = argparse.ArgumentParser(prog="stoker", description="Keeps the GPUs of a training job fed.")
    from stoker import __version__

    p.add_argument("--version", action="version", version=f"stoker {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build-tokens", help="tokenize text files into a token dataset")
    b.add_argument(
        "sources",
        nargs="+",
        help=".txt, .jsonl or .parquet files (any fsspec URL), or MDS directories (local)",
    )
    b.add_argument("--out", required=True, help="dataset URL (path, s3://..., ...)")
    b.add_argument(
        "--tokenizer",
        required=True,
        help="Hugging Face tokenizers JSON file (a tokenizer.json; README: how to train one)",
    )
    b.add_argument("--eos-token", help="end-of-document token (default: the tokenizer's)")
    b.add_argument("--text-field", default="text", help="JSON field of .jsonl inputs")
    b.add_argument(
        "--text-column",
        default="text",
        help="column of .parquet inputs and of MDS directories (str)",
    )
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
    b.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="an unreadable document or an empty input file: stop the build (raise) or "
        "leave it out and count it (skip)",
    )
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(func=tokens.cmd_build_tokens)

    br = sub.add_parser(
        "build-records",
        help="images (ImageFolder, WebDataset, parquet, jsonl, a saved Hugging Face dataset) "
        "into a records dataset",
    )
    br.add_argument("sources", nargs="+", help="an ImageFolder directory, WebDataset .tar shards "
                    "(or their directory), .parquet or .jsonl files, or a Hugging Face "
                    "dataset's save_to_disk directory")  # fmt: skip
    br.add_argument("--out", required=True, help="dataset URL (path, s3://..., ...)")
    br.add_argument("--from", dest="source_format",
                    choices=("imagefolder", "webdataset", "parquet", "jsonl", "hf"),
                    help="the sources' format (default: told from what is there)")  # fmt: skip
    br.add_argument("--image-column", help="parquet / jsonl / hf: the column of image bytes")
    br.add_argument("--path-column", help="parquet / jsonl: the column of image paths "
                    "(relative to the file)")  # fmt: skip
    br.add_argument("--label-column", default="label", help="parquet / jsonl: the label column")
    br.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                    help="skip: leave out and count an item that cannot be read, is not an "
                    "image or has no label")  # fmt: skip
    br.add_argument("--check-images", action=argparse.BooleanOptionalAction, default=True,
                    help="open each image (its header) while building (default: yes)")  # fmt: skip
    br.add_argument("--block-bytes", type=int, default=4 << 20)
    br.add_argument("--compression", choices=("auto", "none", "lz4", "zstd"), default="auto",
                    help="Arrow buffer compression of the blocks (default auto: zstd where it "
                         "saves 10%% of the first block; full-size JPEGs stay as they are)")  # fmt: skip
    br.add_argument("--storage-options", help="JSON object of fsspec options for --out")
    br.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    br.add_argument("--quiet", action="store_true", help="no progress bar")
    br.set_defaults(func=records.cmd_build_records)

    i = sub.add_parser("inspect", help="describe a dataset (tokens or records) and show a sample")
    i.add_argument("url")
    i.add_argument("--storage-options", help="JSON object of fsspec options")
    i.add_argument("--offset", type=int, default=0,
                   help="first token of the sample shown (records: the row shown)")  # fmt: skip
    i.add_argument("--sample-tokens", type=int, default=64)
    i.set_defaults(func=tokens.cmd_inspect)

    cv = sub.add_parser(
        "convert", help="convert a dataset in another tool's format into a token dataset"
    )
    cv.add_argument(
        "src",
        help="the source: a Megatron dataset (its prefix, .idx or .bin), a MosaicML "
        "Streaming (MDS) directory, a LitData optimized directory (TokensLoader), a Hugging "
        "Face dataset saved to disk (its directory), "
        "parquet (a file or a directory), .arrow, a flat .npy / .bin token array",
    )
    cv.add_argument("--out", required=True, help="dataset URL (path, s3://..., ...)")
    cv.add_argument("--column", help="the token-id column of Arrow / parquet data "
                    "(default: input_ids, tokens, token_ids or ids)")  # fmt: skip
    cv.add_argument("--offsets", help="a flat token array's document offsets (.npy or int64 .bin)")
    cv.add_argument("--dtype", help="a raw .bin token array's dtype (uint16, int32, ...)")
    cv.add_argument("--from", dest="source_format", choices=("megatron", "mds", "litdata", "hf", "parquet", "arrow", "flat"),
                    help="the source's format (default: told from what is there)")  # fmt: skip
    cv.add_argument("--vocab-size", type=int,
                    help="the vocabulary's size (default: the largest token id + 1)")  # fmt: skip
    cv.add_argument("--eos-id", type=int, help="the end-of-document token, recorded")
    cv.add_argument("--block-tokens", type=int, default=DEFAULT_BLOCK_TOKENS)
    cv.add_argument("--level", type=int, default=DEFAULT_LEVEL, help="zstd level")
    cv.add_argument("--storage-options", help="JSON object of fsspec options for --out")
    cv.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    cv.add_argument("--quiet", action="store_true", help="no progress bar")
    cv.set_defaults(func=tokens.cmd_convert)

    v = sub.add_parser(
        "verify",
        help="check every block of a dataset (checksums, then decoded) before a long run",
    )
    v.add_argument("url")
    v.add_argument("--storage-options", help="JSON object of fsspec options")
    v.add_argument(
        "--decode",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also decode each block and hold it to the manifest (default: yes)",
    )
    v.add_argument("--workers", type=int, default=4, help="blocks checked at a time")
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    v.set_defaults(func=tokens.cmd_verify)

    d = sub.add_parser("demo", help="build a small dataset and train a tiny model on 2 CPU ranks")
    d.add_argument("--steps", type=int, default=60)
    d.add_argument("--world", type=int, default=2)
    d.add_argument("--seq-len", type=int, default=128)
    d.add_argument("--batch-size", type=int, help="per rank (default 8; with --images 16)")
    d.add_argument("--images", action="store_true",
                   help="an image dataset built on the fly and a tiny CNN (records)")  # fmt: skip
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

    from stoker.cli import agent

    a = sub.add_parser(
        "agent",
        help="run the node agent (the per-machine cache) in the foreground",
        description="Run the node agent that owns --cache-dir. Readers start one "
        "automatically when none runs; run it by hand to choose its limits or to keep it up.",
    )
    agent.add_arguments(a)
    a.set_defaults(func=agent.run)

    from stoker.cli import coordinator as coordinator_cli

    c = sub.add_parser(
        "coordinator",
        help="run the coordinator (leases, work stealing, exactly-once) standalone",
        description="Run the coordinator of one job: leases of epoch positions to its "
        "consumers, journaled to --state so that a restarted coordinator resumes.",
    )
    coordinator_cli.add_arguments(c)
    c.set_defaults(func=coordinator_cli.run)

    from stoker.cli import preprocess as preprocess_cli

    pw = sub.add_parser(
        "preprocess-worker",
        help="run a preprocessing worker: makes a records dataset's rows for trainers",
        description="Serve a records dataset's rows (read, decoded, augmented) to trainers "
        "whose dataset names this worker (RecordDataset(..., preprocess='grpc://HOST:PORT')), "
        "over Arrow Flight.",
    )
    preprocess_cli.add_arguments(pw)
    pw.set_defaults(func=preprocess_cli.run)

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
    doc.set_defaults(func=observe.cmd_doctor)

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
    top.set_defaults(func=observe.cmd_top)

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
