"""Converters: input MB/s of `stoker convert`, against a full read of the same input by
its own reader.

For each format, one synthetic corpus (Zipf-like token ids of a 50,000 vocabulary,
documents of 1-2,000 tokens, int32 as Megatron and Hugging Face store them) is
written by the format's own writer: Megatron's ``IndexedDatasetBuilder``, the
``datasets`` library's ``save_to_disk``, pyarrow's parquet writer, numpy, MosaicML
Streaming's ``MDSWriter`` (an ``ndarray:int32`` column, no compression) and LitData's
``optimize`` (``TokensLoader`` chunks, no compression). Then, in interleaved rounds,
each is read whole by its own reader (every document as a numpy array:
``IndexedDataset[i]``; ``Dataset.with_format("numpy")`` rows; a pyarrow column's rows;
memmap slices; Streaming's ``StreamingDataset[i]``; for LitData, every 2,048-token
block of its ``StreamingDataset`` in order, which leaves each chunk's last partial
block) and converted by ``stoker.convert`` (default block size and zstd level). MDS and
LitData are written and read in their own virtualenv, ``.venv-peers``
(benchmarks/requirements-peers.txt), by benchmarks/convert_peers.py, which times its
read after its imports. Reported: MB/s of the input tokens each side saw, as stored
(medians of the rounds), and stoker's time per the reader's, the per-round ratios
listed. A conversion reads, compresses and writes; the reader only reads, so the ratio
is what converting costs over a pass of the reader.

    python benchmarks/convert_bench.py [--tokens N] [--rounds R] [--quick]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work" / "convert_bench"
HEADING = "## Converters: stoker convert against each input's own reader"
FORMATS = ("megatron", "hf", "parquet", "flat", "mds", "litdata")
PEERS = ("mds", "litdata")  # written and read in .venv-peers, by PEERS_SCRIPT
PY_PEERS = ROOT / ".venv-peers" / "bin" / "python"
PEERS_SCRIPT = BENCH / "convert_peers.py"


def corpus(tokens: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    docs, n = [], 0
    while n < tokens:
        d = np.minimum(rng.zipf(1.3, size=int(rng.integers(1, 2000))), 49_999).astype(np.int32)
        docs.append(d)
        n += len(d)
    return docs


_MEGATRON = """
import sys, warnings, numpy as np
warnings.simplefilter("ignore")
import torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
z = np.load(sys.argv[1])
b = IndexedDatasetBuilder(sys.argv[2] + ".bin", dtype=np.int32)
for k in z.files:
    d = z[k]
    b.add_document(torch.from_numpy(d), [len(d)])
b.finalize(sys.argv[2] + ".idx")
"""


def peer(*args: str, scratch: Path | None = None) -> dict[str, Any]:
    """One command of PEERS_SCRIPT in .venv-peers: the JSON of its last line."""
    env = dict(os.environ, LITDATA_DISABLE_VERSION_CHECK="1")  # no PyPI look-up
    if scratch is not None:  # optimize's cache folders, in place of /tmp/chunks and /tmp/data
        env["DATA_OPTIMIZER_CACHE_FOLDER"] = str(scratch / "chunks")
        env["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] = str(scratch / "data")
    env.pop("VIRTUAL_ENV", None)
    got = subprocess.run(
        [str(PY_PEERS), str(PEERS_SCRIPT), *args], capture_output=True, text=True, env=env
    )
    if got.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])}: " + (got.stderr.strip() or "failed")[-2000:])
    return json.loads(got.stdout.strip().splitlines()[-1])


def peer_versions() -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Each peer's library versions where it imports in .venv-peers; why not where not."""
    versions, skipped = {}, {}
    for fmt in PEERS:
        if not PY_PEERS.exists():
            skipped[fmt] = (
                f"no {PY_PEERS.relative_to(ROOT)} (see benchmarks/requirements-peers.txt)"
            )
            continue
        try:
            versions[fmt] = peer("version", fmt)
        except RuntimeError as exc:
            skipped[fmt] = f"not usable in .venv-peers: {str(exc).splitlines()[-1]}"
    return versions, skipped


def litdata_blocks(path: str) -> tuple[int, int]:
    """The tokens of a LitData directory, and those in whole reader blocks (a block does
    not cross a chunk's end), from its index."""
    dims = [c["dim"] for c in json.loads((Path(path) / "index.json").read_text())["chunks"]]
    block = 2048  # convert_peers.BLOCK
    return sum(dims), sum(d // block * block for d in dims)


def write_inputs(docs: list[np.ndarray], root: Path, peers: tuple[str, ...]) -> dict[str, str]:
    """Each format's input, written by its own writer; the path to convert."""
    root.mkdir(parents=True, exist_ok=True)
    npz = root / "docs.npz"
    np.savez(npz, *docs)
    out = {}
    for fmt in peers:
        peer("write", fmt, str(npz), str(root / fmt), scratch=root / "scratch")
        out[fmt] = str(root / fmt)
    subprocess.run([sys.executable, "-c", _MEGATRON, str(npz), str(root / "mg")], check=True)
    out["megatron"] = str(root / "mg")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import datasets

        datasets.disable_progress_bars()
        datasets.Dataset.from_dict({"input_ids": [d.tolist() for d in docs]}).save_to_disk(
            str(root / "hf")
        )
    out["hf"] = str(root / "hf")
    import pyarrow as pa
    import pyarrow.parquet as pq

    col = pa.ListArray.from_arrays(
        pa.array(np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int32)),
        pa.array(np.concatenate(docs)),
    )
    pq.write_table(pa.table({"input_ids": col}), root / "t.parquet")
    out["parquet"] = str(root / "t.parquet")
    np.save(root / "tokens.npy", np.concatenate(docs))
    np.save(root / "offsets.npy", np.concatenate([[0], np.cumsum([len(d) for d in docs])[:-1]]))
    out["flat"] = str(root / "tokens.npy")
    return out


def own_read(fmt: str, path: str) -> tuple[int, float]:
    """Read every document with the format's own reader: the tokens seen, and seconds."""
    if fmt in PEERS:
        got = peer("read", fmt, path)
        return int(got["tokens"]), float(got["seconds"])
    t, n = time.perf_counter(), 0
    if fmt == "megatron":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.datasets.indexed_dataset import IndexedDataset
        ds = IndexedDataset(path)
        for i in range(len(ds)):
            n += len(ds[i])
    elif fmt == "hf":
        import datasets

        ds = datasets.load_from_disk(path).with_format("numpy")
        for row in ds:
            n += len(row["input_ids"])
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        for batch in pf.iter_batches(columns=["input_ids"]):
            col = batch.column(0)
            offsets, values = np.asarray(col.offsets), col.values.to_numpy()
            for i in range(len(col)):
                n += len(values[offsets[i] : offsets[i + 1]])
    else:
        tokens = np.load(path, mmap_mode="r")
        offs = np.load(Path(path).with_name("offsets.npy"))
        bounds = np.append(offs, len(tokens))
        for i in range(len(offs)):
            n += len(np.asarray(tokens[bounds[i] : bounds[i + 1]]))
    return n, time.perf_counter() - t


def stoker_convert(fmt: str, path: str, out: Path) -> int:
    import stoker

    shutil.rmtree(out, ignore_errors=True)
    opts: dict[str, Any] = {"vocab_size": 50_000}
    if fmt == "flat":
        opts["offsets"] = str(Path(path).with_name("offsets.npy"))
    manifest, _ = stoker.convert(path, str(out), **opts)
    return int(manifest.num_tokens)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=20_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="200k tokens, one round, docs untouched")
    a = ap.parse_args()
    tokens, rounds = (200_000, 1) if a.quick else (a.tokens, a.rounds)
    sys.path.insert(0, str(BENCH))
    from docsection import replace_section
    from machine import git_info, platform_info

    t0 = time.perf_counter()
    versions, skipped = peer_versions()
    for fmt, why in skipped.items():
        print(f"{fmt}: skipped, {why}", flush=True)
    formats = tuple(f for f in FORMATS if f not in skipped)
    tmp = Path(tempfile.mkdtemp(prefix="convert-bench-"))
    try:
        docs = corpus(tokens)
        total = sum(len(d) for d in docs)
        inputs = write_inputs(docs, tmp / "in", tuple(f for f in PEERS if f in formats))
        want = {(f, side): total for f in formats for side in ("own", "stoker")}
        if "litdata" in formats:
            stored, want["litdata", "own"] = litdata_blocks(inputs["litdata"])
            assert stored == total, ("litdata", "written", stored, total)
        with warnings.catch_warnings():  # the readers' imports, outside the clock
            warnings.simplefilter("ignore")
            import datasets  # noqa: F401
            from megatron.core.datasets import indexed_dataset  # noqa: F401

            import stoker  # noqa: F401
        runs: list[dict[str, Any]] = []
        for r in range(rounds):
            for fmt in formats:
                order = ("own", "stoker") if r % 2 == 0 else ("stoker", "own")
                for side in order:
                    if side == "own":
                        n, s = own_read(fmt, inputs[fmt])
                    else:
                        t = time.perf_counter()
                        n = stoker_convert(fmt, inputs[fmt], tmp / f"out-{fmt}")
                        s = time.perf_counter() - t
                    assert n == want[fmt, side], (fmt, side, n, want[fmt, side])
                    runs.append({"round": r, "format": fmt, "side": side, "seconds": s,
                                 "tokens": n})  # fmt: skip
                    print(f"round {r + 1}/{rounds} {fmt:8} {side:6} {4 * n / s / 1e6:8.1f} MB/s",
                          flush=True)  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for fmt in formats:
        own = [x["seconds"] for x in runs if x["format"] == fmt and x["side"] == "own"]
        st = [x["seconds"] for x in runs if x["format"] == fmt and x["side"] == "stoker"]
        ratios = [b / o for o, b in zip(own, st, strict=True)]
        rows.append((fmt, 4 * want[fmt, "own"] / statistics.median(own) / 1e6,
                     4 * total / statistics.median(st) / 1e6, statistics.median(ratios), ratios))  # fmt: skip
    res = {
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tokens": total, "documents": len(docs), "rounds": rounds, "runs": runs,
        "machine": platform_info(), "commit": git_info(), "took": time.perf_counter() - t0,
        "peers": versions, "skipped": skipped,
    }  # fmt: skip
    label = {"megatron": "Megatron .bin + .idx (megatron-core's IndexedDataset)",
             "hf": "Hugging Face save_to_disk (datasets, numpy format)",
             "parquet": "parquet, a list<int32> column (pyarrow)",
             "flat": ".npy + offsets (numpy memmap)",
             "mds": "MosaicML MDS shards, an ndarray:int32 column (streaming's StreamingDataset)",
             "litdata": "LitData TokensLoader chunks (litdata's StreamingDataset, 2,048-token "
                        "blocks)"}  # fmt: skip
    libs = {k: v for d in versions.values() for k, v in d.items()}  # torch once, not twice
    peers = ", ".join(f"{k} {v}" for k, v in sorted(libs.items()))
    m = res["machine"]
    lines = [
        HEADING, "",
        f"Command: `python benchmarks/convert_bench.py{' --quick' if a.quick else ''}` (with "
        f"`.venv/bin/python`). Run {res['when']}, took {res['took']:.0f} s; raw results in "
        "`benchmarks/.work/convert_bench/results.json`.", "",
        f"Machine: {m.get('Model name', '?')} ({m.get('Architecture', '?')}), {m['cpus']} cores, "
        f"Python {m['python']}, numpy {m['numpy']}; stoker at {res['commit']}"
        + (f"; .venv-peers: {peers}" if peers else "")
        + ". A shared 2-core sandbox: read the per-round ratios.", "",
        " ".join(__doc__.split("\n\n")[1].split()).replace("``", "`"), "",
        f"Input: {total:,} tokens in {len(docs):,} documents, int32 ({4 * total / 1e6:.0f} MB).", "",
        f"| input (its own reader) | own reader MB/s (median of {rounds}) | stoker convert MB/s | "
        "stoker time / reader time (median) | per round |",
        "|---|---:|---:|---:|---|",
    ]  # fmt: skip
    for fmt, own_mb, st_mb, ratio, ratios in rows:
        lines.append(f"| {label[fmt]} | {own_mb:.1f} | {st_mb:.1f} | {ratio:.2f}x | "
                     + " ".join(f"{x:.2f}" for x in ratios) + " |")  # fmt: skip
    if skipped:
        lines += ["", "Not measured: " + "; ".join(f"{k}, {v}" for k, v in skipped.items()) + "."]
    text = "\n".join(lines) + "\n"
    print(text)
    if not a.quick:
        WORK.mkdir(parents=True, exist_ok=True)
        (WORK / "results.json").write_text(json.dumps(res, indent=1))
        replace_section(ROOT / "docs" / "benchmarks.md", HEADING, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
