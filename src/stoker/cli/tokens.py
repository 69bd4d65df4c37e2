"""``stoker build-tokens``, ``stoker convert``, ``stoker inspect`` and ``stoker verify``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from stoker.errors import InputError


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def _storage_options(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InputError(f"--storage-options is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise InputError("--storage-options must be a JSON object")
    return value


def cmd_build_tokens(args: argparse.Namespace) -> int:
    from stoker.extras import require
    from stoker.formats.token_writer import WriteOptions
    from stoker.ingest import SourceOptions
    from stoker.tokenizing import BuildStats, build_tokens

    tqdm = require("tqdm", "build", "build-tokens", InputError).tqdm
    bars: list[Any] = []  # made at the first report: the sources are checked, their bytes known

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
            on_error=args.on_error,
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
    print_skipped(stats.skipped, stats.skipped_reasons, "unreadable document(s) or empty file(s)")
    return 0


def print_skipped(skipped: int, named: list[str], what: str) -> None:
    """What a build left out: how many, the first of them by name."""
    if not skipped:
        return
    print(f"left out {skipped:,} {what}:")
    for why in named:
        print(f"  {why}")
    if skipped > len(named):
        print(f"  ... and {skipped - len(named):,} more")


def cmd_inspect(args: argparse.Namespace) -> int:
    from stoker.formats.kinds import kind_of
    from stoker.formats.tokens import TokenSource

    if kind_of(args.url, _storage_options(args.storage_options)) == "records":
        from stoker.cli.records import inspect_records

        return inspect_records(args)
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


def cmd_verify(args: argparse.Namespace) -> int:
    from stoker.formats.kinds import open_source
    from stoker.formats.verify import verify

    try:
        from tqdm import tqdm
    except ImportError:  # the bar is optional (stoker[build] brings tqdm)
        tqdm = None
    total = open_source(args.url, _storage_options(args.storage_options)).manifest.num_blocks
    bar = (
        tqdm(total=total, unit="block", dynamic_ncols=True)
        if tqdm is not None and not args.quiet
        else None
    )

    def progress(blocks: int, nbytes: int) -> None:
        if bar is not None:
            bar.set_postfix_str(_size(nbytes), refresh=False)
            bar.update(blocks - bar.n)

    try:
        report = verify(
            args.url,
            _storage_options(args.storage_options),
            decode=args.decode,
            workers=args.workers,
            progress=progress,
        )
    finally:
        if bar is not None:
            bar.close()
    what = "checksums and decoded contents" if report.decoded else "checksums"
    for bad in report.bad:
        print(f"bad: {bad}")
    if report.ok:
        print(
            f"verified {report.url}: all {report.blocks:,} blocks good ({what}; "
            f"{_size(report.bytes)} in {report.seconds:.1f} s)"
        )
        return 0
    print(
        f"{report.url}: {len(report.bad):,} of {report.blocks:,} blocks bad ({what} checked; "
        f"{_size(report.bytes)} read in {report.seconds:.1f} s)"
    )
    return 1


def cmd_convert(args: argparse.Namespace) -> int:
    from stoker.converters import ConvertStats, convert
    from stoker.formats.token_writer import WriteOptions

    try:
        from tqdm import tqdm
    except ImportError:  # the bar is optional (stoker[build] brings tqdm)
        tqdm = None
    bars: list[Any] = []

    def progress(stats: ConvertStats) -> None:
        if tqdm is None or args.quiet:
            return
        if not bars:
            bars.append(tqdm(total=stats.total_documents, unit="doc", unit_scale=True,
                             dynamic_ncols=True))  # fmt: skip
        bars[0].set_postfix_str(f"{stats.tokens:,} tokens", refresh=False)
        bars[0].update(stats.documents - bars[0].n)

    try:
        manifest, stats = convert(
            args.src,
            args.out,
            source_format=args.source_format,
            column=args.column,
            offsets=args.offsets,
            dtype=args.dtype,
            vocab_size=args.vocab_size,
            eos_id=args.eos_id,
            write_options=WriteOptions(block_tokens=args.block_tokens, level=args.level),
            storage_options=_storage_options(args.storage_options),
            overwrite=args.overwrite,
            progress=progress,
        )
    finally:
        for bar in bars:
            bar.close()
    print(
        f"wrote {args.out}: {manifest.num_documents:,} documents, {manifest.num_tokens:,} "
        f"tokens, {manifest.num_blocks:,} blocks, {_size(manifest.compressed_bytes)} "
        f"(vocab {manifest.vocab_size:,}) from {stats.documents:,} documents in "
        f"{stats.seconds:.1f} s ({stats.input_bytes / max(stats.seconds, 1e-9) / 1e6:.1f} MB/s "
        "of input)" + (f"; {stats.empty:,} empty documents hold no token" if stats.empty else "")
    )
    return 0
