"""JPEG decode on the GPU against stoker's CPU decode: images/s, GPU utilisation, CPU
cores used, with the same RandomResizedCrop(224) + flip (stoker's, a function of seed,
epoch and sample id) on both sides.

    python benchmarks/gpu_decode.py [--quick] [--images 8192] [--workers 4]

What runs, each side over the same records dataset, uint8 batches of 64:

1. **CPU**: ``RecordDataset`` (OpenCV decode at a reduced size where the crop allows,
   crop and resize on the CPU) through stoker's loader at ``--workers`` workers.
2. **GPU (nvJPEG)**: ``RecordDataset(decode=False)`` through the same loader hands the
   stored JPEG bytes; ``torchvision.io.decode_jpeg(..., device="cuda")`` decodes each
   batch on the GPU, and each image's crop box (stoker's ``augment.crop_box`` on its
   decoded size) is cut and resized there (bilinear, ``F.interpolate``), flipped
   where stoker flips it.

For each: images/s (medians of ``--rounds``), the GPU's utilisation (NVML, sampled
every 50 ms) and the CPU cores used (the process's and its workers' CPU seconds over
the wall time). The GPU side's crops are compared with the CPU side's for the first
batch (mean absolute difference: different resamplers, the same picture).

The images: benchmarks/image_corpus.py's records dataset where it exists
(``benchmarks/.work/images/records``), else ``--make N`` photo-like JPEGs (smooth
gradients, edges and noise, 300-500 pixels a side, quality 75-95) written as a records
dataset under ``benchmarks/.work/gpu_decode`` (the device machine has no Debian photos).

3. **DALI** (``RecordDataset(decode="dali")``, where NVIDIA DALI imports): the same
   loader hands the bytes with each image's crop box and flip, and DALI's pipeline
   decodes only the box (``decoders.image_slice``), resizes and flips, on the GPU
   (``device="mixed"``, nvJPEG) where CUDA is, and on the CPU (DALI's CPU backend) with
   ``--dali-cpu`` (or where there is no GPU): stoker's plan, state and metrics, DALI's
   decode. The lent machine's image has no DALI, and its wheel (some hundreds of MB) is
   over what a device call may carry (64 MiB): there the DALI side is skipped unless
   the image gains it.

Without CUDA or torchvision it measures the CPU side alone (``--quick``: a smoke test of
that) and says so. On this project's H200 lease (python3 with torch and torchvision,
not zstandard): carry a zstandard wheel for CPython 3.12 in ``.whl`` (see the device
README) and run ``python3 -m pip install -q --no-index --no-deps --target /tmp/site
.whl/*.whl && PYTHONPATH=/tmp/site:src python3 benchmarks/gpu_decode.py``. Results go to
``benchmarks/.work/gpu_decode/result.json`` (and ``$OUT`` when set) and, not with
``--quick``, to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work" / "gpu_decode"
HEADING = "## JPEG decode on the GPU (nvJPEG) against the CPU"
SIZE, BATCH = 224, 64
sys.path.insert(0, str(BENCH))


def photo(rng: np.random.Generator) -> bytes:
    """A photo-like JPEG: gradients, a few edges and noise (not pure noise)."""
    from PIL import Image

    h, w = (int(x) for x in rng.integers(300, 501, size=2))
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h)], axis=-1).astype(float)
    for _ in range(4):  # edges: a few flat discs
        cy, cx, r = rng.integers(0, h), rng.integers(0, w), rng.integers(20, 120)
        a[(y - cy) ** 2 + (x - cx) ** 2 < r * r] = rng.integers(0, 256, size=3)
    a = np.clip(a + rng.normal(0, 10, size=a.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(a).save(out, format="JPEG", quality=int(rng.integers(75, 96)))
    return out.getvalue()


def dataset(make: int) -> Path:
    """The records dataset to read (the corpus's, else ``make`` images written here)."""
    corpus = BENCH / ".work" / "images" / "records"
    if (corpus / "manifest.json").exists():
        return corpus
    out = WORK / f"made-{make}"
    if not (out / "manifest.json").exists():
        import stoker

        rng = np.random.default_rng(0)
        rows = ({"image": photo(rng), "label": i % 10} for i in range(make))
        stoker.write_records(rows, str(out), schema={"image": "binary", "label": "int64"})
    return out


class Utilisation:
    """The GPU's utilisation, sampled every 50 ms by NVML while inside."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Utilisation:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            return self

        def run() -> None:
            while not self._stop.wait(0.05):
                self.samples.append(int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None


def _cpu_seconds() -> float:
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def gpu_crops(batch: dict[str, Any], seed: int, epoch: int, device: Any) -> Any:
    """A batch of stored JPEG bytes decoded by nvJPEG and cropped as stoker crops."""
    import torch
    import torch.nn.functional as F
    from torchvision.io import ImageReadMode, decode_jpeg

    from stoker.records import augment

    data, length = batch["data"], batch["length"].tolist()
    jpegs = [data[i, :n] for i, n in enumerate(length)]
    images = decode_jpeg(jpegs, mode=ImageReadMode.RGB, device=device)
    ids = batch["sample_id"].numpy()
    u = augment.uniforms(augment.sample_keys(seed, epoch, ids))
    out = torch.empty((len(images), 3, SIZE, SIZE), dtype=torch.uint8, device=device)
    for i, img in enumerate(images):
        _, h, w = img.shape
        left, top, bw, bh = augment.crop_box(u[i], w, h)
        crop = img[:, top : top + bh, left : left + bw].unsqueeze(0).float()
        r = F.interpolate(crop, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
        r = r.round_().clamp_(0, 255).to(torch.uint8)[0]
        out[i] = r.flip(-1) if augment.flipped(u[i]) else r
    return out


def measure(url: str, images: int, workers: int, side: str, seed: int = 0) -> dict[str, Any]:
    """``images`` images of one pass of epoch 0 (at most the dataset's), decoded by
    ``side``: ``cpu`` (stoker's), ``gpu`` (nvJPEG via torchvision), ``dali-gpu`` or
    ``dali-cpu``."""
    import torch

    import stoker

    kw: dict[str, Any] = {"image_size": SIZE, "batch_size": BATCH, "seed": seed}
    if side == "gpu":
        kw |= {"decode": False, "max_bytes": 1 << 20}
    elif side.startswith("dali"):
        kw |= {"decode": "dali", "dali_device": side[5:], "max_bytes": 1 << 20}
    ds = stoker.RecordDataset(url, **kw)
    loader = stoker.TokenLoader(ds, workers)
    device = torch.device("cuda") if side == "gpu" else None
    n, first = 0, None
    with Utilisation() as util:
        cpu0, t0 = _cpu_seconds(), time.perf_counter()
        for batch in loader:  # (one pass of epoch 0: at most the dataset's images)
            got = gpu_crops(batch, seed, 0, device) if side == "gpu" else batch["image"]
            if first is None:
                first = (batch, got.cpu())
            n += len(batch["sample_id"])
            if n >= images:
                break
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        dt, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
    loader.close()
    return {
        "images": n,
        "seconds": dt,
        "images_s": n / dt,
        "cpu_cores": cpu / dt,
        "gpu_util": util.mean,
        "_first": first,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small set, one round; docs untouched")
    ap.add_argument("--images", type=int, help="images a pass reads (default 8192)")
    ap.add_argument("--rounds", type=int, help="default 3")
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--make", type=int, default=4096, help="images made without the corpus")
    ap.add_argument(
        "--dali-cpu", action="store_true", help="also DALI's CPU backend (where there is a GPU)"
    )
    args = ap.parse_args()
    images = args.images or (256 if args.quick else 8192)
    rounds = args.rounds or (1 if args.quick else 3)
    import torch

    try:
        import torchvision.io  # noqa: F401

        gpu = torch.cuda.is_available()
        why = "" if gpu else "no CUDA device"
    except Exception as exc:  # (PyPI's torchvision does not import beside a CPU torch build)
        gpu, why = False, f"torchvision does not import ({type(exc).__name__})"
    try:
        import nvidia.dali  # noqa: F401

        dali = ["dali-gpu"] if torch.cuda.is_available() else []
        dali += ["dali-cpu"] if args.dali_cpu or not torch.cuda.is_available() else []
    except ImportError:
        dali = []
    url = str(dataset(min(args.make, 512) if args.quick else args.make))
    sides = ["cpu"] + (["gpu"] if gpu else []) + dali
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side in sides:
            runs[side].append(measure(url, images, args.workers, side))
    diffs = {}
    for side in sides[1:]:  # the first batch's crops against the CPU's
        (_, cpu_img), (_, img) = runs["cpu"][0]["_first"], runs[side][0]["_first"]
        diffs[side] = float((cpu_img.int() - img.int()).abs().float().mean())
    diff = diffs.get("gpu")
    for rs in runs.values():
        for r in rs:
            r.pop("_first", None)

    def med(side: str, key: str) -> float | None:
        vals = [r[key] for r in runs.get(side, []) if r[key] is not None]
        return statistics.median(vals) if vals else None

    out = {
        "images": images,
        "rounds": rounds,
        "workers": args.workers,
        "dataset": url,
        "gpu": torch.cuda.get_device_name(0) if gpu else None,
        "skipped_gpu": why or None,
        "cpu_images_s": med("cpu", "images_s"),
        "cpu_cores": med("cpu", "cpu_cores"),
        "gpu_images_s": med("gpu", "images_s") if gpu else None,
        "gpu_cpu_cores": med("gpu", "cpu_cores") if gpu else None,
        "gpu_util": med("gpu", "gpu_util") if gpu else None,
        "mean_abs_diff_first_batch": diff,
        "dali": {
            side: {
                "images_s": med(side, "images_s"),
                "cpu_cores": med(side, "cpu_cores"),
                "gpu_util": med(side, "gpu_util"),
                "mean_abs_diff_first_batch": diffs[side],
            }
            for side in dali
        },
        "runs": runs,
    }
    WORK.mkdir(parents=True, exist_ok=True)
    text = json.dumps(out, indent=1)
    (WORK / "result.json").write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_decode.json").write_text(text)
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))
    if not gpu:
        print(f"GPU side not measured: {why}")
    if gpu and not args.quick:
        from docsection import replace_section

        replace_section(ROOT / "docs" / "benchmarks.md", HEADING, render(out))
    return 0


def render(out: dict[str, Any]) -> str:
    c, g = out["cpu_images_s"], out["gpu_images_s"]
    return "\n".join(
        [
            HEADING,
            "",
            f"Device: {out['gpu']}. Command: `python benchmarks/gpu_decode.py --images "
            f"{out['images']} --rounds {out['rounds']} --workers {out['workers']}`; dataset "
            f"{out['dataset']}. RandomResizedCrop(224) + flip as stoker draws it, batches of 64, "
            "medians of the rounds.",
            "",
            "| decode | images/s | CPU cores used | GPU utilisation |",
            "|---|---:|---:|---:|",
            f"| CPU (OpenCV, stoker's reader) | {c:,.0f} | {out['cpu_cores']:.1f} | - |",
            f"| GPU (nvJPEG via torchvision, bytes from stoker's reader) | {g:,.0f} | "
            f"{out['gpu_cpu_cores']:.1f} | {out['gpu_util'] or 0:.0f}% |",
            "",
            *[
                f"| DALI {side[5:].upper()} (stoker's decode='dali', dali_device="
                f"'{side[5:]}') | {d['images_s']:,.0f} | {d['cpu_cores']:.1f} | "
                f"{d['gpu_util'] or 0:.0f}% |"
                for side, d in out["dali"].items()
            ],
            "",
            f"GPU / CPU: {g / c:.2f}x. First batch's crops, GPU against CPU: mean absolute "
            f"difference {out['mean_abs_diff_first_batch']:.1f} levels (different resamplers)"
            + "".join(
                f"; DALI {side[5:].upper()} against CPU {d['mean_abs_diff_first_batch']:.1f}"
                for side, d in out["dali"].items()
            )
            + ".",
            "",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
