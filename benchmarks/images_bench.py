"""Images: stoker's RecordDataset against torchvision's ImageFolder with torch's DataLoader
(what users have today), side by side, with the machine's decode limit and the storage
ratio.

The corpus is benchmarks/image_corpus.py's (an ImageFolder tree of photographs' crops
and its records dataset, under ``benchmarks/.work/images``). Every configuration reads
``--images`` images as uint8 batches of 64 with RandomResizedCrop(224) and a
horizontal flip, at ``num_workers`` 0 and 2, each in a fresh process, the
configurations interleaved round by round: stoker from local files and cold from
nginx on 127.0.0.1 (tests/servers.py), torchvision from the same JPEG files (in
``.venv-peers``: torchvision does not import beside stoker's CPU torch; see
benchmarks/requirements-peers.txt). The decode limit is the single-core rate of
decoding and cropping the same images as stoker does (Pillow, libjpeg's reduced-size
decoding where the crop allows it), times the cores.

    python benchmarks/images_bench.py [--quick] [--rounds 3] [--images 4096]

writes docs/benchmarks.md's "Images" section (not with ``--quick``) and
``benchmarks/.work/images/bench[-quick].json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work" / "images"
PEERS = ROOT / ".venv-peers" / "bin" / "python"
HEADING = "## Images: RecordDataset against torchvision's ImageFolder"
SIZE, BATCH = 224, 64
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "tests"))


def corpus(quick: bool) -> tuple[Path, Path]:
    """The ImageFolder tree and its records dataset (made by image_corpus.py)."""
    base = BENCH / ".work" / ("images-quick" if quick else "images")
    folder, records = base / "folder", base / "records"
    if not (records / "manifest.json").exists():
        cmd = [sys.executable, str(BENCH / "image_corpus.py")] + (["--quick"] if quick else [])
        subprocess.run(cmd, check=True)
    return folder, records


def child_stoker(cfg: dict[str, Any]) -> dict[str, Any]:
    import stoker

    t0 = time.perf_counter()
    ds = stoker.RecordDataset(cfg["url"], image_size=SIZE, augment="train", batch_size=BATCH)
    loader = stoker.TokenLoader(ds, cfg["num_workers"])
    n, first = 0, None
    start = time.perf_counter()
    while n < cfg["images"]:
        for batch in loader:
            if first is None:
                first = time.perf_counter() - t0
            n += len(batch["label"])
            if n >= cfg["images"]:
                break
    dt = time.perf_counter() - start
    loader.close()
    return {"images": n, "seconds": dt, "images_s": n / dt, "first_batch_s": first}


_TORCHVISION = r"""
import json, sys, time
import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms
cfg = json.loads(sys.argv[1])
t0 = time.perf_counter()
tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                         transforms.PILToTensor()])
ds = datasets.ImageFolder(cfg["folder"], transform=tf)
dl = DataLoader(ds, batch_size=64, shuffle=True, num_workers=cfg["num_workers"],
                persistent_workers=cfg["num_workers"] > 0)
n, first = 0, None
start = time.perf_counter()
while n < cfg["images"]:
    for x, y in dl:
        if first is None:
            first = time.perf_counter() - t0
        n += len(y)
        if n >= cfg["images"]:
            break
dt = time.perf_counter() - start
print(json.dumps({"images": n, "seconds": dt, "images_s": n / dt, "first_batch_s": first,
                  "torchvision": __import__("torchvision").__version__}))
"""


def run(cmd: list[str]) -> dict[str, Any]:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _crop(u: Any, w: int, h: int) -> tuple[int, int, int, int]:
    from stoker.records import augment

    return augment.crop_box(u, w, h)


def decode_limit(records: Path, n: int = 400) -> float:
    """Images/s of one core decoding and cropping as stoker does, times the cores."""
    import numpy as np

    import stoker
    from stoker.records import augment
    from stoker.records.image import decode_region

    src = stoker.RecordSource(str(records))
    datas = src.rows(range(min(n, src.num_rows))).column("image").to_pylist()
    u = augment.uniforms(augment.sample_keys(0, 0, np.arange(len(datas))))
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        for d, uu in zip(datas, u, strict=True):
            box = functools.partial(_crop, uu)
            decode_region(d, (SIZE, SIZE), box, augment.flipped(uu))
        best = max(best, len(datas) / (time.perf_counter() - t))
    return best * (os.cpu_count() or 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="a small corpus, one round; docs untouched"
    )
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--images", type=int, help="images a measurement reads (default 4096)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child_stoker(json.loads(args.child))))
        return 0
    from docsection import replace_section
    from machine import git_info, platform_info
    from servers import NginxOrigin

    import stoker

    rounds = args.rounds or (1 if args.quick else 3)
    images = args.images or (256 if args.quick else 4096)
    folder, records = corpus(args.quick)
    m = stoker.RecordSource(str(records)).manifest
    jpeg_bytes = m.statistics["image"]["bytes"]
    peers = PEERS.exists()
    results: dict[str, list[dict[str, Any]]] = {}
    t_start = time.perf_counter()
    with NginxOrigin(records.parent, prefix=WORK / "nginx") as origin:
        http = origin.url_for(records.name).rstrip("/")
        for _ in range(rounds):
            for nw in (0, 2):
                for name, url in (("stoker local", str(records)), ("stoker nginx", http)):
                    cfg = {"url": url, "num_workers": nw, "images": images}
                    r = run([sys.executable, __file__, "--child", json.dumps(cfg)])
                    results.setdefault(f"{name} nw{nw}", []).append(r)
                if peers:
                    cfg = {"folder": str(folder), "num_workers": nw, "images": images}
                    r = run([str(PEERS), "-c", _TORCHVISION, json.dumps(cfg)])
                    results.setdefault(f"torchvision nw{nw}", []).append(r)
    limit = decode_limit(records)
    med = {k: statistics.median(r["images_s"] for r in v) for k, v in results.items()}
    out = {
        "machine": platform_info(),
        "commit": git_info(),
        "images": images,
        "rounds": rounds,
        "corpus": {"rows": m.num_rows, "jpeg_bytes": jpeg_bytes, "stored": m.data_bytes},
        "decode_limit": limit,
        "median_images_s": med,
        "runs": results,
        "seconds": time.perf_counter() - t_start,
    }
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / f"bench{'-quick' if args.quick else ''}.json").write_text(json.dumps(out, indent=1))
    for k, v in med.items():
        print(f"{k}: {v:.0f} images/s")
    print(
        f"decode limit: {limit:.0f} images/s; stored / JPEG bytes {m.data_bytes / jpeg_bytes:.4f}"
    )
    if not args.quick:
        replace_section(ROOT / "docs" / "benchmarks.md", HEADING, render(out, peers))
    return 0


def _share(res: dict[str, Any], nw: int) -> float:
    return float(res["median_images_s"][f"stoker local nw{nw}"] / res["decode_limit"])


def render(res: dict[str, Any], peers: bool) -> str:
    mach = res["machine"]
    med = res["median_images_s"]
    tv = {nw: med.get(f"torchvision nw{nw}") for nw in (0, 2)}
    rows = []
    for nw in (0, 2):
        for name in ("stoker local", "stoker nginx", "torchvision"):
            key = f"{name} nw{nw}"
            if key not in med:
                continue
            ratio = f"{med[key] / tv[nw]:.2f}x" if tv[nw] else "-"
            per = ", ".join(f"{r['images_s']:.0f}" for r in res["runs"][key])
            rows.append(f"| {nw} | {name} | {med[key]:.0f} | {ratio} | "
                        f"{med[key] / res['decode_limit']:.2f} | {per} |")  # fmt: skip
    c = res["corpus"]
    return (
        "\n".join(
            [
                HEADING,
                "",
                f"`python benchmarks/images_bench.py` ({res['rounds']} interleaved rounds, each "
                f"measurement a fresh process reading {res['images']:,} images as uint8 batches "
                f"of {BATCH}, RandomResizedCrop({SIZE}) and a flip; commit {res['commit']}; "
                f"{mach.get('Model name', '?')}, {mach['cpus']} CPUs, took "
                f"{res['seconds']:.0f} s). Corpus: benchmarks/image_corpus.py's, {c['rows']:,} "
                f"images, {c['jpeg_bytes'] / 1e6:.0f} MB of JPEG; stored as records "
                f"{c['stored'] / c['jpeg_bytes']:.4f}x the JPEG bytes.",
                "",
                "| num_workers | reader | images/s (median) | / torchvision | / decode limit | per round |",
                "|---|---|---|---|---|---|",
                *rows,
                "",
                f"Decode limit of this machine: {res['decode_limit']:.0f} images/s (one core "
                "decoding and cropping as stoker does, times the cores)."
                + ("" if peers else " torchvision was not measured: .venv-peers is missing."),
                "",
                "Reading: stoker decodes a JPEG with OpenCV (at a reduced size where the crop "
                "allows) and crops and resizes with OpenCV; torchvision decodes the whole "
                "image with Pillow and resizes with Pillow's antialiased BILINEAR (docs/"
                'benchmarks.md, "JPEG decoders": the resize is most of its time). At '
                "num_workers 0 stoker makes a batch on two decode threads in the process, "
                f"torchvision on none. stoker reaches {_share(res, 0):.2f} / "
                f"{_share(res, 2):.2f} of the decode limit at num_workers 0 / 2; the rest "
                "(each sample's header read under one lock, its crop keys, the Python around "
                "the decode, the copy out of the slots with workers) is not profiled yet. The "
                "corpus's JPEGs are smaller than ImageNet's (benchmarks/image_corpus.py), so "
                "decoding is lighter here than there. Not measured yet: WebDataset, LitData, "
                "MosaicML Streaming and DALI's CPU pipeline (epochs through the node agent and "
                "memory across local processes: the next section, benchmarks/images_agent.py).",
            ]
        )
        + "\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
