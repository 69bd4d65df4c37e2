"""Images: stoker's RecordDataset against the loaders users have for images (torchvision's
ImageFolder with torch's DataLoader, WebDataset, LitData, MosaicML Streaming and DALI's
CPU pipeline), side by side, with the machine's decode limit and the storage ratio.

The corpus is benchmarks/image_corpus.py's (an ImageFolder tree of photographs' crops
and its records dataset, under ``benchmarks/.work/images``). Every configuration reads
``--images`` images as uint8 batches of 64 with RandomResizedCrop(224) and a
horizontal flip, at ``num_workers`` 0 and 2, each in a fresh process, the
configurations interleaved round by round: stoker from local files and cold from
nginx on 127.0.0.1 (tests/servers.py); the peers from local files, in ``.venv-peers``
(they do not import beside stoker's CPU torch; see benchmarks/requirements-peers.txt),
one module each in benchmarks/peers/images_*.py run by peers/images_worker.py. A peer
with a format of its own has it written once by its own writer from the tree, the JPEG
bytes unchanged, under ``.../peers/<name>`` (reused while its marker is there). The
decode limit is the single-core rate of decoding and cropping the same images as stoker
does (OpenCV, reduced-size decoding where the crop allows it), times the cores.

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
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work" / "images"
PEERS_PY = ROOT / ".venv-peers" / "bin" / "python"
HEADING = "## Images: RecordDataset against ImageFolder, WebDataset, LitData, MDS and DALI"
FORMER = ("## Images: RecordDataset against torchvision's ImageFolder",)
SIZE, BATCH = 224, 64
# benchmarks/peers/<module>.py: the reader's name in the table
PEERS = {
    "images_torchvision": "torchvision",
    "images_webdataset": "WebDataset",
    "images_litdata": "LitData",
    "images_mds": "MosaicML Streaming",
    "images_dali": "DALI (CPU)",
}
TARGET = 1.5  # stoker local at num_workers 2 / the fastest peer at num_workers 2
SHARE = 0.8  # stoker local at num_workers 2 / the decode limit
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
    from peers.clock import PassClock

    import stoker

    clock = PassClock()
    ds = stoker.RecordDataset(cfg["url"], image_size=SIZE, augment="train", batch_size=BATCH)
    loader = stoker.TokenLoader(ds, cfg["num_workers"])
    clock.begin()
    while clock.n < cfg["images"]:
        for batch in loader:
            clock.batch(len(batch["label"]))
            if clock.n >= cfg["images"]:
                break
    loader.close()
    return clock.result()


def run(cmd: list[str]) -> dict[str, Any]:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run_peer(system: str, mode: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """One peers.images_worker process in .venv-peers; its JSON answer."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [str(PEERS_PY), "-m", "peers.images_worker", "--system", system, "--mode", mode]
        cmd += ["--cfg", json.dumps(cfg), "--out", str(out)]
        env = {**os.environ, "PYTHONPATH": str(BENCH)}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if not out.exists():
            return {"ok": False, "error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
        return dict(json.loads(out.read_text()))


def prepare_peers(folder: Path) -> dict[str, dict[str, Any]]:
    """Each peer's versions, and its dataset written (or found) under .../peers/<name>."""
    info: dict[str, dict[str, Any]] = {}
    for system, label in PEERS.items():
        data = folder.parent / "peers" / system.removeprefix("images_")
        r = run_peer(system, "versions", {})
        if not r["ok"]:  # not installed, or does not run here: reported, not measured
            info[system] = {"label": label, "error": r["error"]}
            continue
        p = run_peer(system, "prepare", {"folder": str(folder), "data": str(data)})
        if not p["ok"]:
            raise RuntimeError(f"{system} prepare: {p['error']}\n{p.get('traceback', '')}")
        info[system] = {"label": label, "data": str(data), "versions": r["versions"], "prepare": p}
        done = "reused" if p.get("reused") else "written"
        print(f"{label}: " + (f"reads {p['reads']}" if "reads" in p else f"{done}, {p['notes']}"))
    return info


def _crop(u: Any, w: int, h: int) -> tuple[int, int, int, int]:
    from stoker.records import augment

    return augment.crop_box(u, w, h)


def decode_limit(records: Path, n: int = 400) -> float:
    """Images/s of one core decoding and cropping as stoker does, times the cores.

    The ``n`` rows are drawn at random from the whole corpus (seeded): the first
    rows of the converted folder are one class's, smaller than the mean, and
    would overstate the limit by about a tenth.
    """
    import numpy as np

    import stoker
    from stoker.records import augment
    from stoker.records.image import decode_region

    src = stoker.RecordSource(str(records))
    ids = np.sort(np.random.default_rng(0).choice(src.num_rows, min(n, src.num_rows), False))
    datas = src.rows(ids.tolist()).column("image").to_pylist()
    u = augment.uniforms(augment.sample_keys(0, 0, ids))
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
    t_start = time.perf_counter()
    peers = prepare_peers(folder) if PEERS_PY.exists() else {}
    measured = {k: v for k, v in peers.items() if "error" not in v}
    results: dict[str, list[dict[str, Any]]] = {}
    with NginxOrigin(records.parent, prefix=WORK / "nginx") as origin:
        http = origin.url_for(records.name).rstrip("/")
        for _ in range(rounds):
            for nw in (0, 2):
                for name, url in (("stoker local", str(records)), ("stoker nginx", http)):
                    cfg = {"url": url, "num_workers": nw, "images": images}
                    r = run([sys.executable, __file__, "--child", json.dumps(cfg)])
                    results.setdefault(f"{name} nw{nw}", []).append(r)
                for system, p in list(measured.items()):
                    cfg = {"folder": str(folder), "data": p["data"], "num_workers": nw}
                    r = run_peer(system, "read", {**cfg, "images": images})
                    if not r["ok"]:  # reported in its place, and not measured further
                        print(f"{p['label']} nw{nw}: {r['error']}\n{r.get('traceback', '')}")
                        p["error"] = f"its read at num_workers {nw} failed ({r['error']})"
                        del measured[system]
                        for n in (0, 2):
                            results.pop(f"{p['label']} nw{n}", None)
                        continue
                    results.setdefault(f"{p['label']} nw{nw}", []).append(r)
    limit = decode_limit(records)
    med = {k: statistics.median(r["images_s"] for r in v) for k, v in results.items()}
    steady = {
        k: statistics.median(r["steady_images_s"] for r in v)
        for k, v in results.items()
        if all(r.get("steady_images_s") for r in v)
    }
    out = {
        "machine": platform_info(),
        "commit": git_info(),
        "images": images,
        "rounds": rounds,
        "corpus": {"rows": m.num_rows, "jpeg_bytes": jpeg_bytes, "stored": m.data_bytes},
        "peers": peers,
        "decode_limit": limit,
        "median_images_s": med,
        "median_steady_images_s": steady,
        "runs": results,
        "seconds": time.perf_counter() - t_start,
    }
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / f"bench{'-quick' if args.quick else ''}.json").write_text(json.dumps(out, indent=1))
    for k, v in med.items():
        print(f"{k}: {v:.0f} images/s, after the first batch {steady.get(k, 0):.0f}")
    print(
        f"decode limit: {limit:.0f} images/s; stored / JPEG bytes {m.data_bytes / jpeg_bytes:.4f}"
    )
    if not args.quick:
        replace_section(ROOT / "docs" / "benchmarks.md", HEADING, render(out), FORMER)
    return 0


def _share(res: dict[str, Any], nw: int, of: str = "median_images_s") -> float:
    return float(res[of][f"stoker local nw{nw}"] / res["decode_limit"])


def _labels(res: dict[str, Any]) -> list[str]:
    """The measured peers' names, in PEERS's order."""
    return [p["label"] for p in res["peers"].values() if "error" not in p]


def fastest(res: dict[str, Any], nw: int, of: str = "median_images_s") -> tuple[str, float] | None:
    """The fastest peer at ``nw`` and its median images/s (``of``: which rate)."""
    med = res[of]
    got = [(name, med[f"{name} nw{nw}"]) for name in _labels(res) if f"{name} nw{nw}" in med]
    return max(got, key=lambda x: x[1]) if got else None


def _peers_line(res: dict[str, Any]) -> str:
    """What each peer read, what it stored, its versions; and what was not measured."""
    jpeg = res["corpus"]["jpeg_bytes"]
    written, tree, missing, torch = [], [], [], set()
    for p in res["peers"].values():
        if "error" in p:
            missing.append(f"{p['label']} was not measured: {p['error'].strip()}.")
            continue
        v = dict(p["versions"])
        torch.add(v.pop("torch", "?"))
        ver = ", ".join(f"{k} {x}" for k, x in v.items())
        prep = p["prepare"]
        if "bytes" in prep:
            layout = prep["notes"]["layout"]
            written.append(
                f"{p['label']}: {ver}, {layout}, {prep['bytes'] / jpeg:.4f}x the JPEG bytes"
            )
        else:
            tree.append(f"{p['label']} ({ver})")
    if not res["peers"]:
        return "No peer was measured: .venv-peers is missing."
    out = [
        f"Peers, in .venv-peers (benchmarks/requirements-peers.txt; torch "
        f"{', '.join(sorted(torch))}), all reading local files (benchmarks/peers/images_*.py "
        "say exactly how each is written and read)."
    ]
    if written:
        out.append(
            "Those with a format of their own had it written once by their own writer from the "
            "ImageFolder tree, the JPEG bytes unchanged, a label being the class folder's index "
            "in sorted order: " + "; ".join(written) + "."
        )
    if tree:
        out.append(_and(tree) + " read the tree's files.")
    if "DALI (CPU)" in _labels(res):
        out.append(
            "DALI runs on the CPU only (`device_id=None`: it runs here without a GPU) and has "
            "no worker processes: its `num_threads` 1 / 2 are the table's num_workers 0 / 2."
        )
    return " ".join(out + missing)


def render(res: dict[str, Any]) -> str:
    mach = res["machine"]
    med, steady = res["median_images_s"], res.get("median_steady_images_s", {})
    best = {nw: fastest(res, nw) for nw in (0, 2)}
    rows = []
    for nw in (0, 2):
        for name in ("stoker local", "stoker nginx", *_labels(res)):
            key = f"{name} nw{nw}"
            if key not in med:
                continue
            b = best[nw]
            ratio = f"{med[key] / b[1]:.2f}x" if b else "-"
            per = ", ".join(f"{r['images_s']:.0f}" for r in res["runs"][key])
            st = f"{steady[key]:.0f}" if key in steady else "-"
            rows.append(f"| {nw} | {name} | {med[key]:.0f} | {ratio} | "
                        f"{med[key] / res['decode_limit']:.2f} | {per} | {st} |")  # fmt: skip
    c = res["corpus"]
    target = "Targets (stoker local at num_workers 2): " + targets(res, "median_images_s")
    if "stoker local nw2" in steady:
        target += "; after the first batch: " + targets(res, "median_steady_images_s")
    target += "."
    return (
        "\n".join(
            [
                HEADING,
                "",
                f"`python benchmarks/images_bench.py` ({res['rounds']} interleaved rounds, each "
                f"measurement a fresh process reading {res['images']:,} images as uint8 batches "
                f"of {BATCH}, RandomResizedCrop({SIZE}) and a flip, shuffled; commit "
                f"{res['commit']}; {mach.get('Model name', '?')}, {mach['cpus']} CPUs, took "
                f"{res['seconds']:.0f} s). Corpus: benchmarks/image_corpus.py's, {c['rows']:,} "
                f"images, {c['jpeg_bytes'] / 1e6:.0f} MB of JPEG; stored as records "
                f"{c['stored'] / c['jpeg_bytes']:.4f}x the JPEG bytes. images/s: from just "
                "before the loader's first batch is asked for to its last, the first batch's "
                "wait included; medians of the rounds. After the first batch: the images after "
                "the first batch over the time from its arrival to the last, the same rule for "
                "every reader (the pass's start left out, as an epoch of a real dataset "
                "amortises it).",
                "",
                "| num_workers | reader | images/s (median) | / fastest peer | / decode limit "
                "| per round | after the first batch (median) |",
                "|---|---|---|---|---|---|---|",
                *rows,
                "",
                f"Decode limit of this machine: {res['decode_limit']:.0f} images/s (one core "
                "decoding and cropping as stoker does, times the cores). " + target,
                "",
                _peers_line(res),
                "",
                reading(res),
            ]
        )
        + "\n"
    )


def targets(res: dict[str, Any], of: str) -> str:
    """The two throughput targets' ratios and verdicts on the rate ``of``."""
    med, out = res[of], []
    b2 = fastest(res, 2, of)
    if b2:
        r2 = med["stoker local nw2"] / b2[1]
        out.append(
            f"{r2:.2f}x the fastest peer ({b2[0]}, {b2[1]:.0f} images/s; target >= {TARGET}x: "
            + ("met" if r2 >= TARGET else "**missed**")
            + ")"
        )
    share = _share(res, 2, of)
    out.append(
        f"{share:.2f} of the decode limit (target >= {SHARE}: "
        + ("met" if share >= SHARE else "**missed**")
        + ")"
    )
    return ", ".join(out)


def _and(names: list[str]) -> str:
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def reading(res: dict[str, Any]) -> str:
    med = res["median_images_s"]
    labels = _labels(res)
    pillow = [n for n in labels if n != "DALI (CPU)"]
    text = [
        "Reading: stoker decodes a JPEG with OpenCV (at a reduced size where the crop allows) "
        "and crops and resizes with OpenCV."
    ]
    if pillow:
        text.append(
            _and(pillow) + " hand every image to the same torchvision transforms: Pillow "
            "decodes the whole image and resizes it with its antialiased BILINEAR (docs/benchmarks"
            '.md, "JPEG decoders": the resize is most of its time), so what sets them apart is '
            "the loader (a file opened per image against samples cut out of shards or chunks, "
            "the shuffle buffer, the collation), not the decode."
        )
    if "DALI (CPU)" in labels:
        text.append(
            "DALI decodes with its own operators on its own threads, only the crop's region "
            "where it can, and resizes with its own antialiased linear filter."
        )
    text.append(
        "At num_workers 0 stoker makes a batch on two decode threads in the process, so on "
        "both cores, the peers on one (the main process; DALI's one thread): those ratios set "
        "two cores against one."
    )
    b2 = fastest(res, 2)
    bp = max(((n, med[f"{n} nw2"]) for n in pillow), key=lambda x: x[1], default=("", 0.0))
    if b2:
        r2 = med["stoker local nw2"] / b2[1]
        text.append(
            f"At num_workers 2 every reader has both cores: stoker local reads "
            f"{med['stoker local nw2']:.0f} images/s, {r2:.2f}x the fastest peer ({b2[0]}, "
            f"{b2[1]:.0f}), so the {TARGET}x target is "
            + ("met" if r2 >= TARGET else "missed")
            + (
                f", and {med['stoker local nw2'] / bp[1]:.2f}x the fastest of the Pillow "
                f"peers ({bp[0]}, {bp[1]:.0f})."
                if bp[0] not in ("", b2[0])
                else "."
            )
        )
    text.append(
        f"stoker reaches {_share(res, 0):.2f} / {_share(res, 2):.2f} of the decode limit at "
        f"num_workers 0 / 2, and its num_workers 2 is "
        f"{med['stoker local nw2'] / med['stoker local nw0']:.2f}x its num_workers 0. "
        "Where a reader's time goes (one decoding thread, as a worker at num_workers 2 has; "
        "cProfile of 2,048 images, 2026-12-04): OpenCV's decode 69%, its resize 13%, "
        "waiting for blocks 4%, the planes' split into the batch row 2%, the rest (the "
        "crop's keys, the JPEG header's walk, Python) about 12%; unprofiled, that thread "
        "made 2,079 images/s, about 0.9 of one core's share of the limit. The limit counts "
        "both cores as decoding; on this shared 2-core machine the main process, the "
        "workers' I/O threads and other tenants take their share (each measurement's "
        "4,096 images also include the pass's start: the column after the first batch "
        "leaves it out)."
    )
    text.append(
        "Not measured: the peers from a remote (their data are local files; stoker's nginx "
        "row reads cold from nginx on 127.0.0.1, and has no peer beside it), DALI's GPU "
        "decoding (no GPU here), LitData's JPEG serializer (it decodes with "
        "torchvision.io.decode_jpeg to a tensor, another decode and resize than the others'), "
        "first-batch latency (in bench.json, not in the table), and ImageNet's files: the "
        "corpus's JPEGs are smaller (benchmarks/image_corpus.py), so decoding is lighter here "
        "than there. Epochs through the node agent and memory across local processes: the "
        "next section, benchmarks/images_agent.py."
    )
    return " ".join(text)


if __name__ == "__main__":
    raise SystemExit(main())
