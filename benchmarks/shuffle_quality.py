"""Shuffle quality at equal memory: stoker vs WebDataset, MosaicML Streaming, LitData.

Usage::

    .venv/bin/python benchmarks/shuffle_quality.py             # full run, writes docs/benchmarks.md
    .venv/bin/python benchmarks/shuffle_quality.py --no-doc    # print the section only

Every system shuffles the same ``--num-samples`` samples (ids ``0..N-1`` in source
order) for one epoch, in one process and one rank. stoker's order comes from
``stoker.plan.EpochOrder``; the peers' orders come from their own code, run in
``.venv-peers`` by ``benchmarks/shuffle_peers.py`` (orders come back as ``.npy``). All
orders are scored here by one implementation of the measures (mixing at horizon K,
neighbour pairs, resident set and reads per unit), defined in the section this writes,
``## Shuffle quality`` of ``docs/benchmarks.md``; the rest of that file is left alone.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np
from docsection import replace_section

import stoker
from stoker.formats.token_writer import DEFAULT_BLOCK_TOKENS
from stoker.plan import EpochOrder, ShuffleConfig, SpreadOrder, spread_profile

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Shuffle quality"
PY_PEERS = ROOT / ".venv-peers" / "bin" / "python"
PEERS_SCRIPT = BENCH / "shuffle_peers.py"

BUCKETS = 100
HORIZONS = (256, 1024)
NEAR = 8
SEQ_LEN = 2048  # stoker samples = windows of SEQ_LEN + 1 tokens, as in tokens_bench.py
BLOCK_TOKENS = DEFAULT_BLOCK_TOKENS
SMALL_BLOCK_TOKENS = 1 << 15  # 64 KiB blocks: a write-time option (block_tokens)
# (shard_size, block_tokens) of the stoker rows
STOKER_CONFIGS = ((64, BLOCK_TOKENS), (512, BLOCK_TOKENS), (64, SMALL_BLOCK_TOKENS))
# (unit, block_tokens) of the spread order's rows: its default unit, one block's samples,
# and, with small blocks, also a unit of four blocks (a unit spreads over at most its size)
SPREAD_CONFIGS = (
    (BLOCK_TOKENS // SEQ_LEN, BLOCK_TOKENS),
    (SMALL_BLOCK_TOKENS // SEQ_LEN, SMALL_BLOCK_TOKENS),
    (4 * SMALL_BLOCK_TOKENS // SEQ_LEN, SMALL_BLOCK_TOKENS),
)
SMALL_PEER_SHARD = 64  # a second MDS shard size (256 KiB), for stoker's small-unit rows


# --- measures ---------------------------------------------------------------------------


def mixing(ids: np.ndarray, n: int, k: int, m: int = BUCKETS) -> float:
    """Mean distinct buckets over all runs of ``k`` consecutive ids, / the uniform expectation."""
    b = ids.astype(np.int64) * m // n
    length = len(b)
    pos = np.argsort(b, kind="stable")
    prev = np.full(length, -1, dtype=np.int64)
    same = b[pos[1:]] == b[pos[:-1]]
    prev[pos[1:][same]] = pos[:-1][same]
    j = np.arange(length, dtype=np.int64)
    # run s = [s, s+k) counts position j iff j is the first of its bucket in the run,
    # i.e. prev[j] < s <= j; sum over j of the number of such runs s in [0, length - k]
    lo = np.maximum(prev + 1, j - k + 1)
    hi = np.minimum(j, length - k)
    total = np.clip(hi - lo + 1, 0, None).sum()
    observed = total / (length - k + 1)
    return float(observed / (m * (1 - (1 - 1 / m) ** k)))


def neighbour_pairs(ids: np.ndarray, near: int = NEAR) -> float:
    return float(np.mean(np.abs(np.diff(ids.astype(np.int64))) <= near))


def resident(units: list[np.ndarray], positions: list[np.ndarray], weight: np.ndarray) -> int:
    """Max over time of the total weight of units live from first to last use."""
    u = np.concatenate(units)
    p = np.concatenate(positions)
    nu = len(weight)
    first = np.full(nu, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(nu, -1, dtype=np.int64)
    np.minimum.at(first, u, p)
    np.maximum.at(last, u, p)
    used = last >= 0
    span = int(p.max()) + 2
    delta = np.zeros(span, dtype=np.int64)
    np.add.at(delta, first[used], weight[used])
    np.add.at(delta, last[used] + 1, -weight[used])
    return int(np.cumsum(delta).max())


def resident_units(ids: np.ndarray, per: int, n: int) -> int:
    """Resident samples when ids are stored in units of ``per`` consecutive samples."""
    nu = -(-n // per)
    weight = np.full(nu, per, dtype=np.int64)
    weight[-1] = n - (nu - 1) * per
    return resident([ids // per], [np.arange(len(ids))], weight)


def block_span(ids: np.ndarray, block_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """First and last block a sample touches (a sample is ``SEQ_LEN + 1`` tokens)."""
    ids = ids.astype(np.int64)
    return ids * SEQ_LEN // block_tokens, (ids * SEQ_LEN + SEQ_LEN) // block_tokens


# --- stoker -----------------------------------------------------------------------------


def fmt_bytes(tokens: int) -> str:
    """uint16 tokens as KiB/MiB."""
    kib = tokens * 2 // 1024
    return f"{kib // 1024} MiB" if kib % 1024 == 0 else f"{kib} KiB"


def stoker_run(n: int, seed: int, shard: int, ws: int, block_tokens: int) -> dict[str, Any]:
    """stoker's order, and the decoded blocks its windows need (max and total over the epoch)."""
    cfg = ShuffleConfig(seed=seed, shard_size=shard, window_shards=ws, order="window")
    eo = EpochOrder(n, cfg, 0)
    order = eo.samples(np.arange(n, dtype=np.int64))
    starts = eo.window_start(np.arange(eo.num_windows + 1))
    first, last = block_span(order, block_tokens)
    per_window = [
        len(np.union1d(first[a:b], last[a:b])) for a, b in itertools.pairwise(starts.tolist())
    ]
    num_blocks = -(-(n * SEQ_LEN + 1) // block_tokens)
    return {
        "order": order,
        "resident": max(per_window) * block_tokens // SEQ_LEN,
        "reads": sum(per_window) / num_blocks,
    }


def spread_run(n: int, seed: int, unit: int, mean: int) -> dict[str, Any]:
    """stoker's spread order, and the samples its reader holds: each from the first slot of
    its unit (when the unit's block is decoded) to its own."""
    cfg = ShuffleConfig(seed=seed, shard_size=unit, order="spread", spread=mean)
    order = SpreadOrder(n, cfg, 0).samples(np.arange(n, dtype=np.int64))
    slot = np.empty(n, dtype=np.int64)
    slot[order] = np.arange(n)
    unit_of = np.arange(n) // unit
    first = np.full(-(-n // unit), n, dtype=np.int64)
    np.minimum.at(first, unit_of, slot)
    held = np.zeros(n + 1, dtype=np.int64)
    np.add.at(held, first[unit_of], 1)
    np.add.at(held, slot + 1, -1)
    return {"order": order, "resident": int(np.cumsum(held).max()), "reads": 1.0}


def spread_fit(n: int, seed: int, unit: int, budget: int) -> tuple[int, dict[str, Any]]:
    """Largest ``spread`` whose held samples fit ``budget`` (1 if none does), or the first
    at which a unit's counts stop changing (a unit of u samples spreads over u turns at
    most)."""
    best = (1, spread_run(n, seed, unit, 1))
    for mean in range(2, 1025):
        if spread_profile(unit, mean) == spread_profile(unit, mean - 1):
            break
        run = spread_run(n, seed, unit, mean)
        if run["resident"] > budget:
            break
        best = (mean, run)
    return best


def stoker_fit(n: int, seed: int, shard: int, budget: int, block_tokens: int) -> tuple[int, Any]:
    """Largest window_shards whose decoded blocks fit ``budget`` samples (1 if none does)."""
    lo, hi = 1, max(1, budget // shard)
    cache: dict[int, dict[str, Any]] = {}

    def get(ws: int) -> dict[str, Any]:
        if ws not in cache:
            cache[ws] = stoker_run(n, seed, shard, ws, block_tokens)
        return cache[ws]

    while lo < hi:  # blocks per window grow with window_shards
        mid = (lo + hi + 1) // 2
        if get(mid)["resident"] <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo, get(lo)


# --- peers ------------------------------------------------------------------------------


def run_peers(spec: dict[str, Any], out: Path) -> dict[str, Any]:
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, LITDATA_DISABLE_VERSION_CHECK="1")
    subprocess.run(
        [str(PY_PEERS), str(PEERS_SCRIPT), str(spec_path), str(out)], check=True, env=env
    )
    return json.loads((out / "peers.json").read_text())


# --- report -----------------------------------------------------------------------------


def machine_info() -> str:
    model, cpus = platform.processor() or "?", str(os.cpu_count())
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "Model name":
                model = val.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return f"{model}, {cpus} CPU(s); Linux {platform.release()}"


def score(row: dict[str, Any], ids: np.ndarray, n: int) -> dict[str, Any]:
    assert np.array_equal(np.sort(ids), np.arange(n)), f"{row['system']}: not a permutation"
    for k in HORIZONS:
        row[f"mix{k}"] = mixing(ids, n, k)
    row["near"] = neighbour_pairs(ids)
    near = np.abs(np.diff(ids.astype(np.int64))) <= NEAR
    row["near_tail"] = float(near[-(n // 16) :].sum() / max(1, near.sum()))
    return row


def fmt_row(r: dict[str, Any]) -> str:
    res = r["resident"]
    res_s = f"{res:,}" if isinstance(res, int) else res
    reads = "" if r.get("reads") is None else f"{r['reads']:.2f}"
    mixes = " | ".join(f"{r[f'mix{k}']:.3f}" for k in HORIZONS)
    return (
        f"| {r['system']} | {r['config']} | {r.get('tag', '')} | {res_s} | {reads} | {mixes} | "
        f"{100 * r['near']:.3f} |"
    )


def render(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    n, budgets, per = meta["num_samples"], meta["budgets"], meta["peer_shard"]
    pv = meta["peer_versions"]
    spb = BLOCK_TOKENS // SEQ_LEN
    e = {k: BUCKETS * (1 - (1 - 1 / BUCKETS) ** k) for k in HORIZONS}
    lines = [
        SECTION,
        "",
        "How well one epoch is mixed, at the same memory, by stoker and by its peers' own",
        'shuffles. stoker has two orders (`stoker.plan`). `order="spread"`',
        "(`SpreadOrder`, the default): units of `shard_size` samples (one stored block's worth by default)",
        "arrive one per turn in a permuted order, and each unit's samples, permuted, are dealt",
        "out over its turn and the following ones by a geometric profile of mean `spread`",
        'turns; a turn emits what it was dealt, permuted. `order="window"` (`EpochOrder`,',
        "the default before there were two): virtual shards of `shard_size` consecutive samples are",
        "permuted, `window_shards` consecutive permuted shards form a shuffle window, and the",
        "samples of each window are permuted.",
        "",
        f"* **Command:** `.venv/bin/python benchmarks/shuffle_quality.py` (it runs the peers' "
        f"part as `.venv-peers/bin/python benchmarks/shuffle_peers.py`, orders passed back "
        f"as `.npy`). {meta['seconds']:.0f} s under `nice -n 19` on a shared VM. Nothing is "
        f"timed: every number is a deterministic function of the orders (seed {meta['seed']}).",
        f"* **Machine:** {meta['machine']}. stoker {stoker.__version__} (Python "
        f"{platform.python_version()}, numpy {np.__version__}); peers: webdataset "
        f"{pv['webdataset']}, mosaicml-streaming {pv['mosaicml-streaming']}, litdata "
        f"{pv['litdata']} (Python {pv['python']}, numpy {pv['numpy']}, torch {pv['torch']}).",
        f"* **Data:** N = {n:,} samples with ids `0..N-1` in source order; each sample's "
        "payload is its id, so what a loader emits is its order. One epoch (the first), "
        "one process, one rank, no DataLoader workers. Sizes are in samples of `seq_len` "
        "2048 (4 KiB of uint16 tokens): 4,096 samples = 16 MiB.",
        "",
        "**Measures**, over the sequence of sample ids emitted in the epoch:",
        "",
        f"* **mixing@K** (bucket coverage): cut the source into M = {BUCKETS} equal buckets "
        "of consecutive ids; for every run of K consecutive emitted samples count the "
        "distinct buckets it draws from; report the mean divided by "
        "`E = M * (1 - (1 - 1/M)^K)`, the expectation for a uniform random permutation ("
        + ", ".join(f"E = {e[k]:.1f} at K = {k}" for k in HORIZONS)
        + "). 1.000 = as mixed as a full shuffle; "
        + " / ".join(f"{1 / e[k]:.3f}" for k in HORIZONS)
        + " = every run comes from a single bucket. K = 256 is about a global batch of "
        "2k-token sequences; K = 1024 a few of them.",
        f"* **neighbour pairs**: the share of consecutive emitted pairs `(a, b)` with "
        f"`|a - b| <= {NEAR}` (source neighbours, such as pieces of one document, emitted "
        f"next to each other). A uniform shuffle gives about `{2 * NEAR}/N` = "
        f"{100 * 2 * NEAR / n:.3f}%.",
        "* **resident** (memory): the most samples held at once to emit the order, counted "
        "in the unit each system holds, measured from the order:",
        "  * stoker, spread order: the samples its reader holds (`stoker.loader.samples`), "
        "each from the first slot of its unit (when the unit's block is decoded and its "
        "samples copied out) to its own slot; every block is decoded once (**reads per "
        "unit** 1.00; a sample whose last token lies in the next block also needs that "
        "block's head, a partial decode, not counted);",
        f"  * stoker, window order: the decoded blocks of one shuffle window (the most over the windows). "
        f"A block is {BLOCK_TOKENS:,} tokens by default (1 MiB of uint16 = {spb} samples), "
        "a write-time option; a sample is `seq_len + 1` tokens, so a shard also touches "
        "the block its last token falls in. A block shared by shards of different windows "
        "is decoded again; **reads per unit** = blocks decoded per epoch / blocks (an upper "
        "bound: nothing is assumed kept from one window to the next);",
        "  * MosaicML Streaming: its shards, each live from the first to the last emitted "
        "sample it holds (the smallest `cache_limit` that downloads each shard once per "
        "epoch);",
        "  * LitData: its chunks; it consumes one chunk at a time, so one chunk;",
        "  * WebDataset: its shuffle buffer (decoded samples; the tar shards are streamed).",
        "",
        "  Read-ahead (stoker's next window, Streaming's predownload, LitData's "
        "`max_pre_download` = 2 chunks) comes on top for every system and is not counted. "
        "stoker's and WebDataset's resident sets are RAM; Streaming's and LitData's are "
        "local disk (their cache), read per sample.",
        "",
        "**How each order is obtained** (the libraries' own code, nothing re-implemented):",
        "",
        "* stoker: `EpochOrder(N, ShuffleConfig(seed, shard_size, window_shards), 0)"
        ".samples(arange(N))`, the plan `TokenDataset` reads.",
        f"* WebDataset: N samples written with `wds.ShardWriter` into tar shards of {per:,} "
        "samples, read with `wds.WebDataset(urls, shardshuffle=<number of shards>, seed=0)"
        ".shuffle(bufsize, seed=0)`: a full shard permutation, then the sample buffer "
        "(default `initial=100`, so the first ~bufsize/2 samples are drawn from a smaller, "
        "growing buffer).",
        "* MosaicML Streaming: the order `StreamingDataset(shuffle=True, shuffle_seed=0, "
        "shuffle_algo, shuffle_block_size, num_canonical_nodes=1, batch_size=1)` gives one "
        "node, rank and worker, computed with the two library calls it makes for a single "
        "stream (`streaming.base.partition.get_partitions('relaxed', ...)`, then "
        "`streaming.base.shuffle.get_shuffle(algo, shard_sizes, 1, seed, epoch=0, "
        f"block_size)`), over shards of {per:,} samples (~4 MiB) and, for `py1e`, also of "
        f"{SMALL_PEER_SHARD} samples (256 KiB, as fine-grained as stoker's small blocks, "
        "but then a dataset is many small objects). `StreamingDataset` itself is not "
        "instantiated: it needs named shared memory, and the loading benchmark sharing "
        "this machine calls `clean_stale_shared_memory()`, which unlinks every Streaming "
        "segment, live or not.",
        "* LitData: N ids written with `litdata.optimize(chunk_size=C, num_workers=1)` and "
        "read with `litdata.StreamingDataset(dir, shuffle=True, seed=0)`: its `FullShuffle` "
        "(local disk and object stores) permutes the chunks, then a chunk's items in "
        "aligned blocks of `item_shuffle_window` (256 by default; `full` = the whole "
        "chunk), the blocks and the items in each permuted.",
        "",
        "**Equal memory.** For each budget every system gets the largest setting whose "
        "measured resident set fits (`fit`): stoker's `window_shards` and Streaming's "
        "`shuffle_block_size` (in steps of budget/64) are searched; WebDataset's buffer "
        "and LitData's `chunk_size` are the budget. The settings whose nominal size is the "
        "budget (stoker window = `shard_size * window_shards`, `shuffle_block_size`) are "
        "listed too (`nominal`) where they hold more.",
        "",
    ]
    head = (
        "| system | configuration | | resident (samples) | reads per unit | "
        + " | ".join(f"mixing@{k}" for k in HORIZONS)
        + " | neighbour pairs (%) |"
    )
    sep = "|---|---|---|---:|---:|" + "---:|" * len(HORIZONS) + "---:|"
    for b in budgets:
        lines += [f"**Budget {b:,} samples ({b * 4 // 1024} MiB):**", "", head, sep]
        lines += [fmt_row(r) for r in rows if r.get("budget") == b]
        lines.append("")
    lines += ["**Defaults and references** (other memory):", "", head, sep]
    lines += [fmt_row(r) for r in rows if r.get("budget") is None]
    lines.append("")
    lines += findings(rows, budgets)
    return "\n".join(lines).rstrip("\n") + "\n"


def stoker_family(order: str, block: int) -> Any:
    """Whether a row is stoker's, in ``order``, with blocks of ``block`` tokens."""

    def member(row: dict[str, Any]) -> bool:
        spread = 'order="spread"' in row["config"]
        return (
            row["system"] == "stoker"
            and row.get("block") == block
            and (spread == (order == "spread"))
        )

    return member


def findings(rows: list[dict[str, Any]], budgets: list[int]) -> list[str]:
    """The per-budget comparison in words, from the rows (best `fit` row of each family)."""
    out = ["**Reading the table.**", ""]
    for b in budgets:
        fit = [r for r in rows if r.get("budget") == b and r.get("tag") == "fit"]
        fams: list[tuple[str, dict[str, Any]]] = []
        for name, pred in (
            (
                f"stoker spread, {fmt_bytes(BLOCK_TOKENS)} blocks",
                stoker_family("spread", BLOCK_TOKENS),
            ),
            (
                f"stoker spread, {fmt_bytes(SMALL_BLOCK_TOKENS)} blocks",
                stoker_family("spread", SMALL_BLOCK_TOKENS),
            ),
            (
                f"stoker window, {fmt_bytes(BLOCK_TOKENS)} blocks",
                stoker_family("window", BLOCK_TOKENS),
            ),
            (
                f"stoker window, {fmt_bytes(SMALL_BLOCK_TOKENS)} blocks",
                stoker_family("window", SMALL_BLOCK_TOKENS),
            ),
            ("WebDataset", lambda r: r["system"] == "WebDataset"),
            ("Streaming", lambda r: r["system"] == "MosaicML Streaming"),
            ("LitData", lambda r: r["system"] == "LitData"),
        ):
            cands = [r for r in fit if pred(r)]
            if cands:
                fams.append((name, max(cands, key=lambda r: r["mix256"])))
        peers = {name: r for name, r in fams if r["system"] != "stoker"}
        ratios = "; ".join(
            f"{name.removeprefix('stoker ')}: "
            + ", ".join(f"{r['mix256'] / p['mix256']:.2f}x {pname}" for pname, p in peers.items())
            for name, r in fams
            if r["system"] == "stoker"
        )
        out.append(
            f"* **{b:,} samples**, best mixing@256 of each at equal measured memory: "
            + "; ".join(f"{name} {r['mix256']:.2f} ({r['short']})" for name, r in fams)
            + f". stoker's best relative to each peer's best, {ratios}."
        )
    big = [
        r["resident"] / r["window"]
        for r in rows
        if r.get("block") == BLOCK_TOKENS
        and r.get("shard") == 64
        and r.get("budget")
        and r.get("window")
    ]
    default = next((r for r in rows if r.get("tag") == "spread default"), None)
    before = next((r for r in rows if r.get("tag") == "default"), None)
    if before is not None and default is not None:
        out.append(
            f"* **Defaults**: the spread order's, {default['resident']:,} samples held "
            f"({fmt_bytes(default['resident'] * SEQ_LEN)} of tokens), mixing@256 "
            f"{default['mix256']:.3f}; the window order's (the default before), one window of "
            f"{before['resident']:,} samples of decoded blocks (a reader holds two), "
            f"{before['mix256']:.3f}: as well mixed with "
            f"{before['resident'] / default['resident']:.1f}x less memory counted by window "
            f"({2 * before['resident'] / default['resident']:.0f}x as a reader holds them). "
            f"Neighbour pairs are higher ({100 * default['near']:.2f}% against "
            f"{100 * before['near']:.2f}%): a turn draws most from its newest unit."
        )
    out += [
        "* The spread order holds samples, not blocks: a block is decoded once, when its "
        "unit arrives, its samples are copied out and the block let go, so its memory is "
        "about `spread + 1` units of samples whatever the block size, while every run of "
        "a turn's length draws from the units of the last `D` turns. At a given memory it "
        "therefore mixes about as well with 1 MiB blocks as with 64 KiB ones. A unit of `u` "
        "samples spreads over `u` turns at most (its counts are whole samples), which is "
        "where the rows of small units stop growing with the budget.",
        "* With the window order and 1 MiB blocks, a window's memory is set by blocks, not "
        "samples: a 64-sample shard fills a quarter of a block and its last token may "
        "need the next block too, so a window holds "
        + (f"{min(big):.1f}-{max(big):.1f}x" if big else "several times")
        + " the samples it mixes (and decodes each block several times per epoch, `reads "
        "per unit`), while a 512-sample shard needs 3 blocks (2 + the one its last token "
        "falls in), and few shards fit. Smaller blocks (`block_tokens`, a write-time "
        "option; 64 KiB blocks compress somewhat worse, see the compression section "
        "above) remove most of that overhead; what remains is the last token's block: a "
        "64-sample shard needs 5 blocks of 16 samples, not 4, which is why Streaming's "
        "64-sample shards, held exactly, mix a little better at the same memory.",
        "* WebDataset's buffer mixes single samples and each waits in it for a "
        "geometrically distributed time (mean = bufsize), so the buffer holds a long "
        "tail of samples from shards read long ago: it mixes far more source regions "
        "than its size in shards suggests. Its order is not uniform within any window "
        "(recent shards dominate), and the epoch starts from a small, growing buffer.",
        "* The unit a system holds decides most of it: with units of 64 samples or fewer "
        "(stoker's 64 KiB blocks, Streaming's 256 KiB shards) far more distinct source "
        "regions fit in the same memory than with 1 MiB blocks or 4 MiB shards.",
        "* Streaming's `py1e`/`py1br` at a given `shuffle_block_size` hold more shards "
        "than the block (shards straddle block edges; `py1e` spreads each shard over "
        "0.75-1.25 blocks), so at equal memory their block is smaller than the budget. "
        "LitData's default in-chunk shuffle keeps aligned runs of 256 consecutive items "
        "together, so every run of 256 samples comes from about one bucket.",
    ]
    tails = [
        r
        for r in rows
        if "py1br" in r["config"] and r["near"] > 0.01 and r.get("near_tail", 0) > 0.5
    ]
    if tails:
        out.append(
            "* `py1br` can leave the end of an epoch unshuffled inside each shard: its block "
            "loop advances by a whole block while the blocks it shuffles start `stagger` "
            "samples earlier, so it may stop up to `stagger` (< 0.75 block) samples short of "
            "the end. That is where its high neighbour-pair shares come from: "
            + "; ".join(
                f"{r['config'].split(', ', 1)[1]}: {100 * r['near']:.2f}%, "
                f"{100 * r['near_tail']:.0f}% of them in the last 1/16 of the epoch"
                for r in tails
            )
            + "."
        )
    out += [
        "* Absolute values depend on N (a window of W samples covers W/N of the source, "
        "and a bucket is N/100 samples); compare rows at the same N.",
        "",
    ]
    return out


def write_doc(section: str) -> None:
    replace_section(DOC, SECTION, section)


# --- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-samples", type=int, default=1 << 17)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budgets", default="1024,4096,16384", help="samples held, comma-separated")
    ap.add_argument("--peer-shard", type=int, default=1000, help="samples per tar/MDS shard")
    ap.add_argument("--no-doc", action="store_true", help="print the section, do not write it")
    ap.add_argument("--json", type=Path, help="also dump the rows here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    n, seed, per = args.num_samples, args.seed, args.peer_shard
    budgets = [int(x) for x in args.budgets.split(",")]
    rows: list[dict[str, Any]] = []

    # stoker
    def stoker_row(
        ss: int, ws: int, bt: int, run: dict[str, Any], budget: int | None, tag: str
    ) -> dict[str, Any]:
        cfg = (
            f'order="window", shard_size={ss}, window_shards={ws} (window {ss * ws:,}), '
            f"{fmt_bytes(bt)} blocks"
        )
        if tag == "default":
            cfg = f"default at seq_len {SEQ_LEN}: {cfg}"
        row = {"system": "stoker", "config": cfg, "tag": tag, "budget": budget, "block": bt}
        row.update(shard=ss, window=ss * ws)
        row.update(resident=run["resident"], reads=run["reads"])
        row["short"] = f"shard_size={ss}, window_shards={ws}"
        return score(row, run["order"], n)

    def spread_row(
        unit: int, mean: int, bt: int, run: dict[str, Any], budget: int | None, tag: str
    ) -> dict[str, Any]:
        cfg = f'order="spread", shard_size={unit}, spread={mean}, {fmt_bytes(bt)} blocks'
        if tag == "spread default":
            cfg = f"the spread order's defaults at seq_len {SEQ_LEN}: {cfg}"
        row = {"system": "stoker", "config": cfg, "tag": tag, "budget": budget, "block": bt}
        row.update(shard=unit, window=None, resident=run["resident"], reads=run["reads"])
        row["short"] = f'order="spread", spread={mean}'
        return score(row, run["order"], n)

    for b in budgets:
        for unit, bt in SPREAD_CONFIGS:
            mean, run = spread_fit(n, seed, unit, b)
            tag = "fit" if run["resident"] <= b else "smallest (over budget)"
            rows.append(spread_row(unit, mean, bt, run, b, tag))
            print(f"stoker spread, block {bt} budget {b}: spread={mean}", flush=True)
        for ss, bt in STOKER_CONFIGS:
            ws, run = stoker_fit(n, seed, ss, b, bt)
            tag = "fit" if run["resident"] <= b else "smallest (over budget)"
            rows.append(stoker_row(ss, ws, bt, run, b, tag))
            if ws != b // ss:
                run = stoker_run(n, seed, ss, b // ss, bt)
                rows.append(stoker_row(ss, b // ss, bt, run, b, "nominal"))
            print(f"stoker shard {ss} block {bt} budget {b}: window_shards={ws}", flush=True)
    window = ShuffleConfig(order="window").resolve(SEQ_LEN, BLOCK_TOKENS)
    assert window.shard_size is not None and window.order == "window"
    run = stoker_run(n, seed, window.shard_size, window.window_shards, BLOCK_TOKENS)
    rows.append(
        stoker_row(window.shard_size, window.window_shards, BLOCK_TOKENS, run, None, "default")
    )
    spread = ShuffleConfig(order="spread").resolve(SEQ_LEN, BLOCK_TOKENS)
    assert spread.shard_size is not None
    run = spread_run(n, seed, spread.shard_size, spread.spread)
    rows.append(
        spread_row(spread.shard_size, spread.spread, BLOCK_TOKENS, run, None, "spread default")
    )

    # peers
    spec = {
        "num_samples": n,
        "seed": seed,
        "budgets": budgets,
        "peer_shard": per,
        "small_shard": SMALL_PEER_SHARD,
    }
    with tempfile.TemporaryDirectory(prefix="shuffle_quality_") as tmp:
        peers = run_peers(spec, Path(tmp))
        for run in peers["runs"]:
            ids = np.load(Path(tmp) / f"{run['name']}.npy")
            unit = run.pop("unit")
            if unit is None:
                run["resident"] = f"{run['memory']:,} (buffer)"
            else:
                run["resident"] = resident_units(ids, unit, n)
            over = isinstance(run["resident"], int) and run["resident"] > (run["budget"] or n)
            if run.get("tag") == "fit" and over:
                run["tag"] = "smallest (over budget)"
            run["reads"] = 1.0
            rows.append(score(run, ids, n))

    # references
    rng = np.random.default_rng(seed)
    for cfg, ids in (
        ("uniform random permutation (numpy)", rng.permutation(n)),
        ("no shuffle (source order)", np.arange(n)),
    ):
        rows.append(
            score(
                {
                    "system": "reference",
                    "config": cfg,
                    "budget": None,
                    "resident": "-",
                    "reads": None,
                },
                ids,
                n,
            )
        )

    meta = {
        "num_samples": n,
        "seed": seed,
        "budgets": budgets,
        "peer_shard": per,
        "peer_versions": peers["versions"],
        "machine": machine_info(),
        "seconds": time.perf_counter() - t0,
    }
    section = render(rows, meta)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    if args.no_doc:
        print(section)
    else:
        write_doc(section)
        print(section)
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
