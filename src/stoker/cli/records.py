"""``stoker inspect`` of a records dataset."""

from __future__ import annotations

import argparse
import io
from typing import Any

from stoker.cli.common import Bar, print_skipped, size, storage_options


def describe_value(value: Any) -> str:
    """A column value as ``inspect`` shows it: bytes that are an image by their size and
    mode (decoded, with Pillow when it is installed), other bytes by their length, the
    rest as they print (shortened)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        try:
            from PIL import Image
        except ImportError:
            return f"{size(len(data))} of bytes (pip install pillow to see an image decoded)"
        try:
            with Image.open(io.BytesIO(data)) as img:
                img.load()
                return (
                    f"{img.format} image, {img.width} x {img.height} {img.mode}, "
                    f"{size(len(data))} (decoded)"
                )
        except Exception:  # not an image Pillow reads: bytes, then
            return f"{size(len(data))} of bytes"
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def inspect_records(args: argparse.Namespace) -> int:
    from stoker.formats.records import RecordSource

    src = RecordSource(args.url, storage_options(args.storage_options))
    m = src.manifest
    rows = [
        ("dataset", src.url),
        ("id", m.dataset_id),
        (
            "format",
            f"{m.format} v{m.format_version} (written by {m.writer or '?'}, {m.created or '?'})",
        ),
        ("rows", f"{m.num_rows:,}"),
        (
            "blocks",
            f"{m.num_blocks:,} (about {size(m.block_bytes)} each) in {len(m.files)} file(s)",
        ),
        ("bytes", f"{size(m.data_bytes)} stored, Arrow buffer compression {m.compression}"),
    ]
    classes = m.metadata.get("classes")
    if isinstance(classes, list) and classes:
        shown = ", ".join(f"{i} {c}" for i, c in enumerate(classes[:8]))
        more = f", ... ({len(classes)} in all)" if len(classes) > 8 else ""
        rows.append(("classes", shown + more))
    for c in m.columns:
        stats = m.statistics.get(c.name, {})
        parts = [c.type + ("" if c.nullable else ", not null")]
        if "min" in stats:
            parts.append(f"{stats['min']}..{stats['max']}")
        if "bytes" in stats:
            parts.append(f"{size(stats['bytes'])} in all")
        if stats.get("nulls"):
            parts.append(f"{stats['nulls']:,} null")
        rows.append((f"column {c.name}", "; ".join(parts)))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    row = max(0, min(args.offset, m.num_rows - 1))
    sample = src.rows([row]).to_pylist()[0]
    print(f"\nsample (row {row:,}):")
    for name in src.schema.names:
        print(f"  {name}: {describe_value(sample[name])}")
    return 0


def cmd_build_records(args: argparse.Namespace) -> int:
    from stoker.records.build import build_records

    bar = Bar(args.quiet, unit="B", unit_scale=True, unit_divisor=1024)  # (sources' bytes)

    with bar:
        stats = build_records(
            args.sources,
            args.out,
            source_format=args.source_format,
            image_column=args.image_column,
            path_column=args.path_column,
            label_column=args.label_column,
            on_error=args.on_error,
            check_images=args.check_images,
            block_bytes=args.block_bytes,
            compression=args.compression,
            storage_options=storage_options(args.storage_options),
            overwrite=args.overwrite,
            progress=bar,
        )
    m = stats.manifest
    assert m is not None
    print(
        f"wrote {args.out}: {m.num_rows:,} images in {m.num_blocks:,} blocks, "
        f"{size(m.data_bytes)} in {stats.seconds:.1f} s "
        f"({stats.source_bytes / max(stats.seconds, 1e-9) / 1e6:.1f} MB/s of sources)"
    )
    print_skipped(stats.skipped, stats.errors, "item(s)")
    return 0
