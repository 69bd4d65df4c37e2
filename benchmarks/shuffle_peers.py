"""Peers' epoch orders for ``benchmarks/shuffle_quality.py`` (runs in ``.venv-peers``).

Usage (launched by ``shuffle_quality.py``; not meant to be run by hand)::

    .venv-peers/bin/python benchmarks/shuffle_peers.py SPEC.json OUT_DIR

``SPEC.json`` holds ``num_samples``, ``seed``, ``budgets`` (samples held),
``peer_shard`` (samples per WebDataset/MDS shard) and ``small_shard`` (a second,
small MDS shard size). For every peer configuration this
writes ``OUT_DIR/<name>.npy`` (int64: the sample ids in the order the library emits
them in epoch 0, single process, one rank) and, at the end, ``OUT_DIR/peers.json``
(versions, and per configuration the label, memory held, storage unit, notes and
seconds taken). Each dataset holds ``num_samples`` tiny samples whose payload is the
sample's id, so the emitted items are the ids themselves.

* WebDataset: real tar shards written with ``wds.ShardWriter``, read with
  ``wds.WebDataset(urls, shardshuffle=<all shards>, seed).shuffle(bufsize, seed)``.
* MosaicML Streaming: the order ``StreamingDataset`` uses for one node, rank and
  worker with ``batch_size=1`` and ``num_canonical_nodes=1``, computed with the
  library's own ``get_partitions`` and ``get_shuffle`` (exactly the two calls of
  ``streaming.base.batching.random.generate_work_random_batching`` for a single
  stream), without instantiating ``StreamingDataset``: that needs named shared memory,
  and another benchmark on this machine runs Streaming loaders that call
  ``clean_stale_shared_memory()`` (it unlinks every Streaming segment, live or not).
* LitData: real chunks written with ``litdata.optimize`` (``chunk_size`` = budget) and
  iterated with ``litdata.StreamingDataset(shuffle=True, seed)``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # no PyPI look-up

import litdata
import numpy as np
import streaming
import webdataset as wds
from streaming.base.partition import get_partitions
from streaming.base.shuffle import get_shuffle


def versions() -> dict[str, str]:
    import torch

    return {
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "torch": torch.__version__,
        "webdataset": wds.__version__,
        "mosaicml-streaming": streaming.__version__,
        "litdata": litdata.__version__,
    }


def shard_sizes(n: int, per: int) -> np.ndarray:
    sizes = np.full(n // per, per, dtype=np.int64)
    return np.append(sizes, n % per) if n % per else sizes


# --- WebDataset ----------------------------------------------------------------------


def wds_write(n: int, per: int, out: Path) -> list[str]:
    out.mkdir(parents=True)
    with wds.ShardWriter(str(out / "shard-%05d.tar"), maxcount=per, verbose=0) as sink:
        for i in range(n):
            sink.write({"__key__": f"{i:09d}", "id": i.to_bytes(8, "little")})
    return [str(p) for p in sorted(out.glob("*.tar"))]


def wds_order(urls: list[str], bufsize: int, seed: int) -> np.ndarray:
    ds = wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False).shuffle(
        bufsize, seed=seed
    )
    return np.fromiter((int.from_bytes(s["id"], "little") for s in ds), dtype=np.int64)


# --- MosaicML Streaming ---------------------------------------------------------------


def resident_units(ids: np.ndarray, per: int) -> int:
    """Most samples in units of ``per`` consecutive ids live at once (first to last use)."""
    n = len(ids)
    nu = -(-n // per)
    unit = ids // per
    pos = np.arange(n)
    first = np.full(nu, n, dtype=np.int64)
    last = np.full(nu, -1, dtype=np.int64)
    np.minimum.at(first, unit, pos)
    np.maximum.at(last, unit, pos)
    weight = np.full(nu, per, dtype=np.int64)
    weight[-1] = n - (nu - 1) * per
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, first, weight)
    np.add.at(delta, last + 1, -weight)
    return int(np.cumsum(delta).max())


def mds_order(sizes: np.ndarray, algo: str, block: int, seed: int) -> np.ndarray:
    n = int(sizes.sum())
    # StreamingDataset defaults: partition_algo="relaxed", batching "random"; epoch 0.
    big = get_partitions("relaxed", n, 1, 1, 1, 1, 1, 0, None).reshape(-1)
    shuffle = get_shuffle(algo, sizes, 1, seed, 0, block)
    ids = np.where(big != -1, shuffle[big], -1)
    return ids[ids != -1].astype(np.int64)


def mds_fit(sizes: np.ndarray, algo: str, budget: int, seed: int) -> tuple[int, np.ndarray]:
    """Largest ``shuffle_block_size`` (steps of budget/64) whose resident shards fit ``budget``."""
    per = int(sizes[0])
    step = max(1, budget // 64)
    for block in range(budget, step - 1, -step):
        with warnings.catch_warnings():  # py1e warns when the block is below a shard
            warnings.simplefilter("ignore")
            order = mds_order(sizes, algo, block, seed)
        if block == step or resident_units(order, per) <= budget:
            break
    return block, order


# --- LitData --------------------------------------------------------------------------


def _lit_items(span: tuple[int, int]):  # type: ignore[no-untyped-def]
    yield from range(*span)


def lit_write(n: int, chunk: int, out: Path) -> None:
    from litdata import optimize

    step = 8192
    optimize(
        fn=_lit_items,
        inputs=[(a, min(a + step, n)) for a in range(0, n, step)],
        output_dir=str(out),
        chunk_size=chunk,
        num_workers=1,
        reorder_files=False,
        start_method="fork",
        verbose=False,
    )


def lit_order(data: Path, cache: Path, seed: int, item_window: Any) -> np.ndarray:
    from litdata import StreamingDataset

    ds = StreamingDataset(
        input_dir=str(data),
        cache_dir=str(cache),
        shuffle=True,
        seed=seed,
        item_shuffle_window=item_window,
    )
    return np.fromiter((int(x) for x in ds), dtype=np.int64)


# --- driver ---------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    n, seed, per = int(spec["num_samples"]), int(spec["seed"]), int(spec["peer_shard"])
    budgets = [int(b) for b in spec["budgets"]]
    runs: list[dict[str, Any]] = []

    def save(name: str, order: np.ndarray, t0: float, **meta: Any) -> None:
        np.save(out / f"{name}.npy", order)
        runs.append({"name": name, "seconds": round(time.perf_counter() - t0, 2), **meta})
        print(f"  {name}: {len(order)} ids, {time.perf_counter() - t0:.1f} s", flush=True)

    with tempfile.TemporaryDirectory(prefix="shuffle_peers_") as tmp:
        tmpdir = Path(tmp)

        # WebDataset
        t0 = time.perf_counter()
        urls = wds_write(n, per, tmpdir / "wds")
        print(f"  webdataset: wrote {len(urls)} shards in {time.perf_counter() - t0:.1f} s")
        for b in budgets:
            t0 = time.perf_counter()
            save(
                f"wds_b{b}",
                wds_order(urls, b, seed),
                t0,
                system="WebDataset",
                tag="fit",
                config=f"{per}-sample tar shards, shardshuffle={len(urls)} (all), "
                f".shuffle({b}) (initial=100)",
                short=f"buffer {b:,}",
                memory=b,
                unit=None,
                budget=b,
            )

        # MosaicML Streaming: the shard size of the other peers, and small shards
        small = int(spec["small_shard"])
        for b in budgets:
            for sh, algo in ((per, "py1e"), (per, "py1br"), (small, "py1e")):
                sizes = shard_sizes(n, sh)
                dflt = " (default)" if algo == "py1e" else ""
                label = f"{algo}{dflt}, {sh}-sample shards ({sh * 4:,} KiB)"
                t0 = time.perf_counter()
                block, order = mds_fit(sizes, algo, b, seed)
                save(
                    f"mds_{algo}_s{sh}_b{b}_fit",
                    order,
                    t0,
                    system="MosaicML Streaming",
                    config=f"{label}, shuffle_block_size={block:,}",
                    short=f"{algo}, {sh}-sample shards, shuffle_block_size={block:,}",
                    tag="fit",
                    memory=block,
                    unit=sh,
                    budget=b,
                )
                if block != b and sh == per:
                    t0 = time.perf_counter()
                    save(
                        f"mds_{algo}_s{sh}_b{b}",
                        mds_order(sizes, algo, b, seed),
                        t0,
                        system="MosaicML Streaming",
                        config=f"{label}, shuffle_block_size={b:,}",
                        tag="nominal",
                        memory=b,
                        unit=sh,
                        budget=b,
                    )
        sizes = shard_sizes(n, per)
        for algo in ("py1s", "py2s"):
            t0 = time.perf_counter()
            save(
                f"mds_{algo}",
                mds_order(sizes, algo, 1 << 18, seed),
                t0,
                system="MosaicML Streaming",
                config=f"{algo}, {per}-sample shards (block size unused)",
                memory=per,
                unit=per,
                budget=None,
            )
        t0 = time.perf_counter()
        save(
            "mds_naive",
            mds_order(sizes, "naive", 1 << 18, seed),
            t0,
            system="MosaicML Streaming",
            config=f"naive (global permutation), {per}-sample shards",
            memory=n,
            unit=per,
            budget=None,
        )

        # LitData
        for b in budgets:
            t0 = time.perf_counter()
            data = tmpdir / f"lit_{b}"
            lit_write(n, b, data)
            print(f"  litdata: optimize(chunk_size={b}) in {time.perf_counter() - t0:.1f} s")
            for kind, window in (("w256", None), ("full", "full")):
                t0 = time.perf_counter()
                save(
                    f"lit_{kind}_b{b}",
                    lit_order(data, tmpdir / f"lit_cache_{b}_{kind}", seed, window),
                    t0,
                    system="LitData",
                    tag="fit",
                    config=f"chunk_size={b:,}, item_shuffle_window="
                    + ("256 (default)" if window is None else "full"),
                    short=f"chunk_size={b:,}, item_shuffle_window="
                    + ("256" if window is None else "full"),
                    memory=b,
                    unit=b,
                    budget=b,
                )

    (out / "peers.json").write_text(json.dumps({"versions": versions(), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
