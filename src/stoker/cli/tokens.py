"""``stoker build-tokens``, ``stoker convert``, ``stoker inspect`` and ``stoker verify``."""

from __future__ import annotations

import argparse

from stoker.cli.common import Bar, print_skipped, size, storage_options
from stoker.errors import InputError


def cmd_build_tokens(args: argparse.Namespace) -> int:
    from stoker.extras import require
    from stoker.formats.token_writer import WriteOptions
    from stoker.ingest import SourceOptions
    from stoker.tokenizing import BuildStats, build_tokens

    require("tqdm", "build", "build-tokens", InputError)  # (its progress bar)
    bar = Bar(args.quiet, unit="B", unit_scale=True, unit_divisor=1024)

    def progress(stats: BuildStats) -> None:  # (the sources checked: their bytes known)
        docs = f"{stats.documents:,} docs, {stats.tokens:,} tokens"
        bar(stats.source_bytes, stats.total_bytes, docs)

    opts = WriteOptions(
        block_tokens=args.block_tokens,
        level=args.level,
        shuffle=args.byte_shuffle,
        dictionary=args.dictionary,
        min_match=args.min_match or None,
    )
    with bar:
        manifest, stats = build_tokens(
            args.sources,
            args.out,
            args.tokenizer,
            eos_token=args.eos_token,
            source_options=SourceOptions(args.text_field, args.text_column, args.txt_split),
            write_options=opts,
            workers=args.workers,
            storage_options=storage_options(args.storage_options),
            overwrite=args.overwrite,
            progress=progress,
            on_error=args.on_error,
        )
    print(
        f"wrote {args.out}: {manifest.num_documents:,} documents, {manifest.num_tokens:,} tokens, "
        f"{manifest.num_blocks:,} blocks, {size(manifest.compressed_bytes)} "
        f"({manifest.compressed_bytes / manifest.raw_bytes:.3f} of raw {manifest.dtype}) "
        f"in {stats.seconds:.1f} s ({stats.text_bytes / max(stats.seconds, 1e-9) / 1e6:.1f} MB/s of text)"
    )
    print_skipped(stats.skipped, stats.skipped_reasons, "unreadable document(s) or empty file(s)")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from stoker.formats.kinds import kind_of
    from stoker.formats.tokens import TokenSource

    if kind_of(args.url, storage_options(args.storage_options)) == "records":
        from stoker.cli.records import inspect_records

        return inspect_records(args)
    src = TokenSource(args.url, storage_options(args.storage_options))
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
        ("bytes", f"{size(m.compressed_bytes)} stored, {size(m.raw_bytes)} raw"),
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

    source = open_source(args.url, storage_options(args.storage_options))
    total = source.manifest.num_blocks
    bar = Bar(args.quiet, unit="block")
    with bar:
        report = verify(
            args.url,
            decode=args.decode,
            workers=args.workers,
            progress=lambda blocks, nbytes: bar(blocks, total, size(nbytes)),
            source=source,
        )
    what = "checksums and decoded contents" if report.decoded else "checksums"
    for bad in report.bad:
        print(f"bad: {bad}")
    if report.ok:
        print(
            f"verified {report.url}: all {report.blocks:,} blocks good ({what}; "
            f"{size(report.bytes)} in {report.seconds:.1f} s)"
        )
        return 0
    print(
        f"{report.url}: {len(report.bad):,} of {report.blocks:,} blocks bad ({what} checked; "
        f"{size(report.bytes)} read in {report.seconds:.1f} s)"
    )
    return 1


def cmd_convert(args: argparse.Namespace) -> int:
    from stoker.converters import ConvertStats, convert
    from stoker.formats.token_writer import WriteOptions

    bar = Bar(args.quiet, unit="doc", unit_scale=True)

    def progress(stats: ConvertStats) -> None:
        bar(stats.documents, stats.total_documents, f"{stats.tokens:,} tokens")

    with bar:
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
            storage_options=storage_options(args.storage_options),
            overwrite=args.overwrite,
            progress=progress,
        )
    print(
        f"wrote {args.out}: {manifest.num_documents:,} documents, {manifest.num_tokens:,} "
        f"tokens, {manifest.num_blocks:,} blocks, {size(manifest.compressed_bytes)} "
        f"(vocab {manifest.vocab_size:,}) from {stats.documents:,} documents in "
        f"{stats.seconds:.1f} s ({stats.input_bytes / max(stats.seconds, 1e-9) / 1e6:.1f} MB/s "
        "of input)" + (f"; {stats.empty:,} empty documents hold no token" if stats.empty else "")
    )
    return 0
