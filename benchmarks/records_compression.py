"""Records block compression: Arrow IPC buffer compression none / lz4 / zstd, measured.

A records dataset (``stoker.write_records``) stores its rows as Arrow IPC record
batches ("blocks", about 4 MiB), each read whole with one range request and checked
against its xxhash. ``compression=`` is Arrow's IPC buffer compression, which applies
to every buffer of a block: with JPEG bytes in a block, it runs over the JPEGs too.
This measures, for ``compression`` none, lz4 and zstd (Arrow's default levels), on
four datasets written by ``stoker.write_records`` with its default block size:

* **images**: the first ``--image-rows`` rows (default 4,000) of
  ``benchmarks/.work/images/records`` (benchmarks/image_corpus.py's JPEG crops of
  photographs; built by ``python benchmarks/image_corpus.py`` if missing), columns
  ``image`` (JPEG bytes, as stored) and ``label`` (int64);
* **thumbnails**: the same images resized to 64 x 64 and re-encoded (OpenCV, JPEG
  quality 90), as downsampled image sets store them, with their labels;
* **captions**: ``--text-rows`` rows (default 200,000) of a caption column and the
  numbers caption datasets carry beside it (``id`` int64, ``width`` and ``height``
  int32, ``score`` float32). The captions are real text, distinct paragraphs (20 to
  1,000 characters, whitespace collapsed) of the Python standard library's docstrings
  and comments (benchmarks/corpus.py's extraction) and of the text files under
  ``/usr/share/doc``, in a seeded random order (as a shuffled dataset stores them).
  Widths, heights and scores are seeded random draws (common image sizes; a score
  around 0.3 with noise, as CLIP similarities are);
* **images + captions**: the images' rows with a caption each and the same numbers
  (the width and height the JPEG's header says).

For each: the stored bytes (all blocks) over the uncompressed dataset's; the write
speed (``write_records`` of one in-memory Arrow table into a fresh local directory,
blocks cut, checksummed and written, index and manifest included, into the page cache:
after one untimed write, each copy removed before the next); the read speed of whole blocks (``RecordSource.block(i)`` for every block in
order: fetch from a local file, verify the xxhash, decode to an Arrow record batch and
validate it, single thread); the fetch-and-verify part of it alone
(``RecordSource.record``); and the per-row read of the main column (``image`` or
``caption``) the way the loader reads a stored block, each row's value as a Python
object (``column[r].as_py()``) after the block's decode. Speeds are MB/s of
uncompressed (raw) dataset bytes, so rows compare directly, wall clock and thread CPU
time, medians of ``--repeats`` (default 5) passes or more (reads: as many as add up to
half a second, so small datasets get more); reads run with the page cache warm
(the files were just written, and one untimed pass precedes the timed ones). Beside
them: what ``compression="auto"`` (the writer's default) picks for each dataset, the
mean JPEG header size (bytes before the start-of-scan marker), and one core's rate of
decoding the images whole with OpenCV, for scale. It then writes the table and a
decision into ``docs/benchmarks.md`` under ``## Records block compression`` and the
figures into ``benchmarks/.work/records_compression.json``.

Usage::

    python benchmarks/records_compression.py [--image-rows 4000] [--text-rows 200000]
        [--repeats 5] [--no-doc]
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import stoker

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus
from docsection import replace_section
from machine import git_info, lscpu

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work"
IMAGES = WORK / "images" / "records"
DOC = ROOT / "docs" / "benchmarks.md"
HEADING = "## Records block compression"
COMPRESSIONS = ("none", "lz4", "zstd")
SEED = 0
MIN_CAPTION, MAX_CAPTION = 20, 1000
THUMB, THUMB_QUALITY = 64, 90
MIN_TIMED_S = 0.5  # a figure's timed passes add up to this at least
#: Common (width, height) of web images, drawn for the caption rows.
SIZES = ((512, 512), (640, 480), (800, 600), (1024, 768), (1280, 720), (1920, 1080),
         (768, 1024), (1080, 1350), (600, 400), (256, 256))  # fmt: skip


# ---------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------


def _paragraphs(text: str) -> list[str]:
    out = []
    for p in text.replace("\r\n", "\n").split("\n\n"):
        p = " ".join(p.split())
        if MIN_CAPTION <= len(p) <= MAX_CAPTION:
            out.append(p)
    return out


def captions(n: int) -> list[str]:
    """``n`` distinct real-text paragraphs in a seeded random order (fewer if the
    machine has fewer)."""
    found: dict[str, None] = {}
    for _, path in corpus.py_files():
        text = corpus.python_doc_text(path)
        if text:
            found.update(dict.fromkeys(_paragraphs(text)))
    for _, path in corpus.doc_files():
        text = corpus._read_text(path)
        if text:
            found.update(dict.fromkeys(_paragraphs(text)))
    texts = list(found)
    order = np.random.default_rng(SEED).permutation(len(texts))[:n]
    return [texts[i] for i in order]


def numbers(n: int, rng: np.random.Generator) -> dict[str, pa.Array]:
    """The numeric columns of caption rows: id, width, height (common sizes), score."""
    sizes = np.array(SIZES, dtype=np.int32)[rng.integers(0, len(SIZES), n)]
    score = np.clip(rng.normal(0.3, 0.05, n), 0.0, 1.0).astype(np.float32)
    return {
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "width": pa.array(sizes[:, 0]),
        "height": pa.array(sizes[:, 1]),
        "score": pa.array(score),
    }


def image_rows(n: int) -> pa.Table:
    if not (IMAGES / "manifest.json").exists():
        import subprocess

        subprocess.run([sys.executable, str(BENCH / "image_corpus.py")], check=True)
    src = stoker.RecordSource(str(IMAGES))
    n = min(n, src.num_rows)
    return src.rows(range(n)).select(["image", "label"]).combine_chunks()


def datasets(image_n: int, text_n: int) -> dict[str, pa.Table]:
    from PIL import Image

    images = image_rows(image_n)
    texts = captions(text_n + images.num_rows)
    text_n = min(text_n, len(texts) - images.num_rows)
    caps = numbers(text_n, np.random.default_rng(SEED))
    caption_t = pa.table({**caps, "caption": pa.array(texts[:text_n], type=pa.string())})
    sizes = []
    for data in images.column("image").to_pylist():
        with Image.open(io.BytesIO(data)) as img:
            sizes.append(img.size)
    wh = np.array(sizes, dtype=np.int32)
    n = images.num_rows
    extra = numbers(n, np.random.default_rng(SEED + 1))
    both = pa.table(
        {
            "image": images.column("image"),
            "label": images.column("label"),
            "id": extra["id"],
            "width": pa.array(wh[:, 0]),
            "height": pa.array(wh[:, 1]),
            "score": extra["score"],
            "caption": pa.array(texts[text_n : text_n + n], type=pa.string()),
        }
    ).combine_chunks()
    return {
        "images": images,
        "thumbnails": thumbnails(images),
        "captions": caption_t.combine_chunks(),
        "images + captions": both,
    }


def thumbnails(images: pa.Table) -> pa.Table:
    """The images resized to ``THUMB`` x ``THUMB`` (area) and re-encoded (JPEG quality
    ``THUMB_QUALITY``, OpenCV), as downsampled image sets store them."""
    import cv2

    out = []
    for data in images.column("image").to_pylist():
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        small = cv2.resize(img, (THUMB, THUMB), interpolation=cv2.INTER_AREA)
        ok, enc = cv2.imencode(".jpg", small, [cv2.IMWRITE_JPEG_QUALITY, THUMB_QUALITY])
        assert ok
        out.append(enc.tobytes())
    return pa.table({"image": pa.array(out, pa.binary()), "label": images.column("label")})


# ---------------------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median wall and thread-CPU seconds of calls of ``fn``: ``repeats`` calls, or more
    where they are short, until they add up to ``MIN_TIMED_S`` (at most 200 calls)."""
    wall, cpu = [], []
    gc.collect()
    gc.disable()  # (a collection in one pass and not another is noise here)
    try:
        while len(wall) < repeats or (sum(wall) < MIN_TIMED_S and len(wall) < 200):
            w, c = time.perf_counter(), time.thread_time()
            fn()
            cpu.append(time.thread_time() - c)
            wall.append(time.perf_counter() - w)
    finally:
        gc.enable()
    return statistics.median(wall), statistics.median(cpu)


def measure(table: pa.Table, comp: str, main: str, tmp: Path, repeats: int) -> dict[str, Any]:
    w_walls, w_cpus = [], []
    for i in range(repeats + 1):  # the first untimed: a process's first writes fault in memory
        out = tmp / "w"
        # (process CPU time: Arrow compresses a batch's buffers on threads of its own)
        w, c = time.perf_counter(), time.process_time()
        stoker.write_records([table], str(out), schema=table.schema, compression=comp)
        if i:
            w_cpus.append(time.process_time() - c)
            w_walls.append(time.perf_counter() - w)
        # removed before the next write: its dirty pages go without being written back,
        # so the kernel's writeback of earlier copies does not slow the next one
        shutil.rmtree(out)
    w_wall, w_cpu = statistics.median(w_walls), statistics.median(w_cpus)
    url = str(tmp / "ds")
    m = stoker.write_records([table], url, schema=table.schema, compression=comp)
    assert m.compression == comp
    src = stoker.RecordSource(url)
    nb = src.num_blocks

    def read() -> None:
        for b in range(nb):
            src.block(b)

    def fetch() -> None:
        for b in range(nb):
            src.record(b)

    def per_row() -> None:
        for b in range(nb):
            col = src.block(b).column(main)
            for r in range(len(col)):
                col[r].as_py()

    read()  # untimed: warms the page cache and checks every block
    assert src.rows(range(0, table.num_rows, 997)).equals(
        table.take(pa.array(range(0, table.num_rows, 997)))
    )
    r_wall, r_cpu = timed(read, repeats)
    f_wall, f_cpu = timed(fetch, repeats)
    p_wall, p_cpu = timed(per_row, repeats)
    shutil.rmtree(url)
    return {
        "compression": comp,
        "rows": table.num_rows,
        "blocks": nb,
        "stored": m.data_bytes,
        "write_s": w_wall,
        "write_cpu_s": w_cpu,
        "read_s": r_wall,
        "read_cpu_s": r_cpu,
        "fetch_s": f_wall,
        "fetch_cpu_s": f_cpu,
        "per_row_s": p_wall,
        "per_row_cpu_s": p_cpu,
    }


def main_column(table: pa.Table) -> str:
    return "image" if "image" in table.column_names else "caption"


def auto_choice(table: pa.Table, tmp: Path) -> str:
    """What ``compression="auto"`` (the writer's default) picks for ``table``."""
    url = tmp / "auto"
    m = stoker.write_records([table], str(url), schema=table.schema, compression="auto")
    shutil.rmtree(url)
    return m.compression


# ---------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------


def mbs(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6


def table_md(res: dict[str, Any]) -> str:
    lines = [
        "| dataset | compression | blocks | stored / raw | write MB/s (wall) | write MB/s (CPU, all threads) "
        "| read MB/s (wall) | read MB/s (CPU) | fetch + verify MB/s | decode ms / block "
        "| per-row read, rows/s (CPU) |",
        "|:--|:--|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, d in res["datasets"].items():
        raw = d["raw_bytes"]
        for r in d["runs"]:
            dec_ms = max(0.0, r["read_s"] - r["fetch_s"]) / r["blocks"] * 1e3
            lines.append(
                f"| {name} | {r['compression']} | {r['blocks']} | {r['stored'] / raw:.4f} | "
                f"{mbs(raw, r['write_s']):,.0f} | {mbs(raw, r['write_cpu_s']):,.0f} | "
                f"{mbs(raw, r['read_s']):,.0f} | "
                f"{mbs(raw, r['read_cpu_s']):,.0f} | {mbs(raw, r['fetch_s']):,.0f} | "
                f"{dec_ms:.2f} | {r['rows'] / r['per_row_cpu_s']:,.0f} |"
            )
    return "\n".join(lines)


def by_comp(d: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["compression"]: r for r in d["runs"]}


def jpeg_decode_rate(images: pa.Table, n: int = 300, repeats: int = 3) -> float:
    """JPEGs a second one core decodes whole (OpenCV ``imdecode``, as stoker's reader
    decodes), the first ``n`` images, median of ``repeats`` passes."""
    import cv2

    cv2.setNumThreads(0)
    datas = [np.frombuffer(b, np.uint8) for b in images.column("image").to_pylist()[:n]]

    def run() -> None:
        for d in datas:
            cv2.imdecode(d, cv2.IMREAD_COLOR)

    return len(datas) / timed(run, repeats)[0]


def jpeg_header_bytes(table: pa.Table) -> float:
    """Mean bytes of a JPEG before its entropy-coded data (markers, quantisation and
    Huffman tables, up to the start-of-scan marker)."""
    return float(np.mean([d.find(b"\xff\xda") for d in table.column("image").to_pylist()]))


def decide(res: dict[str, Any]) -> str:
    """The decision paragraphs, from the figures."""
    from stoker.formats.records import AUTO_MIN_SAVING

    ds = res["datasets"]
    saving = {n: 1 - by_comp(d)["zstd"]["stored"] / d["raw_bytes"] for n, d in ds.items()}
    saving_lz4 = {n: 1 - by_comp(d)["lz4"]["stored"] / d["raw_bytes"] for n, d in ds.items()}
    img, th, cap, both = (ds[n] for n in ("images", "thumbnails", "captions", "images + captions"))
    ic = by_comp(img)

    def rd(d: dict[str, Any], c: str) -> float:
        return mbs(d["raw_bytes"], by_comp(d)[c]["read_s"])

    def row_rate(d: dict[str, Any], c: str) -> float:  # (CPU time)
        r = by_comp(d)[c]
        return r["rows"] / r["per_row_cpu_s"]

    def wr(d: dict[str, Any], c: str) -> float:  # (CPU time of all threads)
        return mbs(d["raw_bytes"], by_comp(d)[c]["write_cpu_s"])

    def jpeg(d: dict[str, Any]) -> str:
        per = d["main_bytes"] / d["rows"]
        return f"{d['header_bytes']:.0f} B of a {per:,.0f} B file ({d['header_bytes'] / per:.1%})"

    # read time an image's share of a block costs, zstd over none, against its decode
    extra_us = (ic["zstd"]["read_s"] - ic["none"]["read_s"]) / img["rows"] * 1e6
    decode_us = 1e6 / res["jpeg_decode_per_s"]
    thc = by_comp(th)
    th_extra_us = (thc["zstd"]["read_s"] - thc["none"]["read_s"]) / th["rows"] * 1e6
    full = max(saving["images"], saving_lz4["images"], saving["images + captions"])
    parts = [
        f"**Full-size JPEG datasets: no compression.** zstd saves {saving['images']:.1%} of "
        f"the image blocks and lz4 {saving_lz4['images']:.1%}; with captions and numbers "
        f"beside the images, {saving['images + captions']:.1%} (the caption column is "
        f"{both['caption_bytes'] / both['raw_bytes']:.1%} of those bytes). JPEG data is "
        "entropy-coded already; what zstd finds is mostly what every file repeats, its headers "
        f"(markers, quantisation and Huffman tables: {jpeg(img)} here). For that, whole-block "
        f"reads go from {rd(img, 'none'):,.0f} MB/s to {rd(img, 'zstd'):,.0f} (zstd) and "
        f"{rd(img, 'lz4'):,.0f} (lz4) MB/s per core, writes from {wr(img, 'none'):,.0f} to "
        f"{wr(img, 'zstd'):,.0f} (zstd) and {wr(img, 'lz4'):,.0f} (lz4) MB/s of CPU time. The speed "
        f"hardly matters: zstd adds {extra_us:.1f} us of block reading per image where one "
        f"core takes {decode_us:,.0f} us to decode it ({res['jpeg_decode_per_s']:,.0f} "
        "JPEGs/s with OpenCV). What compression gives up is the in-place read: an "
        "uncompressed block's buffers are used where they lie (a block the node agent holds "
        "in shared memory serves every local process without a copy), a compressed one is "
        f"inflated into each reader's own memory. At most {full:.1%} fewer bytes does not "
        "pay for that.",
        f"**Thumbnails: zstd.** At {THUMB} x {THUMB} the same headers are {jpeg(th)}, and "
        f"zstd saves {saving['thumbnails']:.1%} (lz4 {saving_lz4['thumbnails']:.1%}), a "
        "share of the bytes worth having; reads stay at "
        f"{rd(th, 'zstd'):,.0f} MB/s per core ({rd(th, 'none'):,.0f} uncompressed): zstd "
        f"adds {th_extra_us:.2f} us of block reading per image where one core takes "
        f"{1e6 / res['thumb_decode_per_s']:,.0f} us to decode it.",
        f"**Text-heavy datasets: zstd.** On captions with their numbers, zstd stores "
        f"{1 - saving['captions']:.3f} of the raw bytes and lz4 "
        f"{1 - saving_lz4['captions']:.3f}: with zstd {1 - saving['captions']:.0%} of the "
        f"bytes are left to fetch, cache and hold. Its whole-block read, "
        f"{rd(cap, 'zstd'):,.0f} MB/s per core ({rd(cap, 'lz4'):,.0f} with lz4, "
        f"{rd(cap, 'none'):,.0f} uncompressed), is above what a loader takes from a block "
        "row by row, so it costs a share of that, not a multiple: the per-row read of the "
        f"captions (block read included) runs at {row_rate(cap, 'zstd'):,.0f} rows/s with "
        f"zstd ({mbs(cap['raw_bytes'], by_comp(cap)['zstd']['per_row_cpu_s']):,.0f} MB/s), "
        f"{row_rate(cap, 'lz4'):,.0f} with lz4 and {row_rate(cap, 'none'):,.0f} uncompressed "
        f"(zstd {row_rate(cap, 'zstd') / row_rate(cap, 'none'):.2f}x of uncompressed), before "
        "any work the loader does with a caption. zstd over lz4: "
        f"{saving['captions'] - saving_lz4['captions']:.1%} of the raw bytes less for a "
        "block read that is not the bottleneck either way; writing runs at "
        f"{wr(cap, 'zstd'):,.0f} MB/s with zstd, {wr(cap, 'lz4'):,.0f} with lz4 and "
        f"{wr(cap, 'none'):,.0f} without (CPU time, all threads), once per dataset.",
        f'**Implemented as the writer\'s default, `compression="auto"`:** the first block '
        "is serialised both ways and the dataset's blocks are zstd-compressed when zstd saves "
        f"at least {AUTO_MIN_SAVING:.0%} of it, else stored uncompressed (the manifest "
        "records which; readers need nothing new). The threshold sits between the savings "
        "measured here ("
        + ", ".join(f"{n} {s:.1%}" for n, s in saving.items())
        + "); auto picked "
        + ", ".join(f"{res['auto'][n]} for {n}" for n in ds)
        + ". Compression is one setting for all of a block's columns (Arrow's IPC body "
        "compression is per record batch), so a dataset of full-size images with captions is "
        "decided by its images. zstd rather than lz4 for what is compressed: it stores less "
        "in every row here, and its read is fast enough. Explicit "
        '`compression="none"`, `"lz4"` or `"zstd"` (`stoker build-records --compression`) '
        "still sets it.",
    ]
    return "\n\n".join(parts)


def render(res: dict[str, Any]) -> str:
    mach = res["machine"]
    ds = res["datasets"]
    desc = []
    for name, d in ds.items():
        cols = ", ".join(f"{c} {t}" for c, t in d["columns"].items())
        desc.append(
            f"{name}: {d['rows']:,} rows ({cols}), {d['raw_bytes'] / 1e6:.1f} MB uncompressed, "
            f"of which the {d['main']} column {d['main_bytes'] / d['raw_bytes']:.1%}"
        )
    return f"""{HEADING}

What Arrow's IPC buffer compression (none / lz4 / zstd at Arrow's default levels) does to
records datasets written by `stoker.write_records` (default 4 MiB blocks), and what it
costs to write and read them.

* **Command:** `python benchmarks/records_compression.py` (images from
  `benchmarks/.work/images/records`, made by `benchmarks/image_corpus.py`; figures in
  `benchmarks/.work/records_compression.json`). This run took {res["seconds"]:.0f} s, of
  which {res["build_s"]:.0f} s gathering the rows.
* **Machine:** {mach.get("Model name", "?")}, {mach["cpus"]} CPUs; Linux {mach["kernel"]},
  Python {mach["python"]}, pyarrow {mach["pyarrow"]}, OpenCV {mach["opencv"]}; commit
  {res["commit"]}. A shared VM: the 1-minute load average was {res["load"][0]:.2f} at the
  start and {res["load"][1]:.2f} at the end, and speeds vary by 20-30% between runs
  (the ratios are exact and the same every run).
* **Data:** {"; ".join(desc)}. Captions: distinct real-text paragraphs (20-1,000
  characters) of the Python standard library's docstrings and comments and of the text
  files under `/usr/share/doc`, in a seeded random order; widths, heights and scores of
  the caption rows seeded random draws (the images' rows carry their JPEG's own size).
* **Measured:** stored / raw = the blocks' bytes over the uncompressed dataset's. Write:
  `write_records` of one in-memory Arrow table into a fresh local directory (blocks cut,
  statistics, checksums, files, index, manifest; into the page cache: one untimed write
  first, and each copy removed before the next, so no writeback of earlier copies runs
  under it). Read: `RecordSource.block(i)` for every
  block in order (local file read, xxhash64 check, Arrow IPC decode, full validation),
  single thread; fetch + verify = `RecordSource.record(i)` alone; decode = the
  difference. Per-row read: each block decoded, then every row's `image` or `caption` as
  a Python object (`column[r].as_py()`, as the loader reads a stored block). All MB/s are
  of **uncompressed** bytes, so rows compare; medians of {res["repeats"]} writes, and of
  {res["repeats"]} read passes or as many more as add up to {MIN_TIMED_S} s (small
  datasets), wall clock unless marked CPU (the thread's CPU time; for writes the
  process's, all threads: Arrow compresses a batch's buffers on its own threads); page
  cache warm (the files were just written, and an untimed pass precedes
  the timed ones), so reads here measure the CPU side, not storage.

{table_md(res)}

**Decision.**

{decide(res)}
"""


# ---------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image-rows", type=int, default=4000)
    ap.add_argument("--text-rows", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5, help="passes per figure (median)")
    ap.add_argument("--no-doc", action="store_true", help="do not write docs/benchmarks.md")
    args = ap.parse_args(argv)
    import cv2

    load0 = os.getloadavg()[0]
    t_start = time.perf_counter()
    data = datasets(args.image_rows, args.text_rows)
    build_s = time.perf_counter() - t_start
    info = lscpu()
    res: dict[str, Any] = {
        "machine": {
            "Model name": info.get("Model name", "?"),
            "cpus": info.get("CPU(s)", "?"),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "pyarrow": pa.__version__,
            "opencv": cv2.__version__,
        },
        "commit": git_info(),
        "repeats": args.repeats,
        "build_s": build_s,
        "datasets": {},
        "auto": {},
    }
    WORK.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=WORK, prefix="records-compression-") as tmp_dir:
        tmp = Path(tmp_dir)
        for name, table in data.items():
            main = main_column(table)
            d: dict[str, Any] = {
                "rows": table.num_rows,
                "columns": {f.name: str(f.type) for f in table.schema},
                "main": main,
                "main_bytes": int(pc.sum(pc.binary_length(table.column(main))).as_py()),
                "header_bytes": jpeg_header_bytes(table) if main == "image" else 0.0,
                "caption_bytes": (
                    int(pc.sum(pc.binary_length(table.column("caption"))).as_py())
                    if "caption" in table.column_names
                    else 0
                ),
                "runs": [],
            }
            for comp in COMPRESSIONS:
                r = measure(table, comp, main, tmp, args.repeats)
                d["runs"].append(r)
                raw = d["runs"][0]["stored"]
                print(
                    f"{name} {comp}: {r['blocks']} blocks, stored/raw {r['stored'] / raw:.4f}, "
                    f"write {mbs(raw, r['write_s']):,.0f} MB/s, read {mbs(raw, r['read_s']):,.0f} "
                    f"MB/s, per-row {r['rows'] / r['per_row_cpu_s']:,.0f} rows/s (CPU) "
                    f"({time.perf_counter() - t_start:.0f} s)",
                    flush=True,
                )
            d["raw_bytes"] = d["runs"][0]["stored"]
            res["datasets"][name] = d
            res["auto"][name] = auto_choice(table, tmp)
    res["jpeg_decode_per_s"] = jpeg_decode_rate(data["images"])
    res["thumb_decode_per_s"] = jpeg_decode_rate(data["thumbnails"])
    res["seconds"] = time.perf_counter() - t_start
    res["load"] = [load0, os.getloadavg()[0]]
    (WORK / "records_compression.json").write_text(json.dumps(res, indent=1))
    section = render(res)
    print()
    print(section)
    if not args.no_doc:
        replace_section(DOC, HEADING, section)
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
