"""JPEG decoders on one core: images/s decoding the benchmark image set, with and
without reduced-size (DCT-scaled) decoding, and how far each one's pixels are from
Pillow's.

Decoders (each from its own virtualenv, so that none replaces another's libraries):

* Pillow as stoker's ``.venv`` has it, a full decode and with ``draft`` (libjpeg's
  1/2, 1/4, 1/8 scaling) to the target size, and ``stoker.records.image.decode_region``
  itself (draft, then one ``resize(box=...)``), in ``.venv``;
* PyTurboJPEG (``TurboJPEG.decode``, ``scaling_factor``: libjpeg-turbo's M/8 scales),
  on Debian's ``libturbojpeg0``; simplejpeg (its own libjpeg-turbo; ``min_height`` /
  ``min_width``: the same M/8 scales, or set to the image's sides / 2, 4 or 8 for those
  scales only); OpenCV (``cv2.imdecode``,
  ``IMREAD_REDUCED_COLOR_2/4/8``), in ``.venv-images``
  (``benchmarks/requirements-images.txt``);
* Pillow-SIMD (built from its sdist with ``CC="cc -mavx2"``), full and with ``draft``,
  in ``.venv-images-simd``: it installs as ``PIL``, in place of Pillow.

Images: every ``--every``-th file of ``benchmarks/.work/images/folder`` (made by
``benchmarks/image_corpus.py``), read into memory. Measured per variant: decode only
(the bytes to an RGB uint8 array, height x width x 3, at the reduced size where the
variant reduces) and decode + resize of the whole image to 224 x 224, by Pillow's
BILINEAR (antialiased: the resampling stoker uses) and, for the decoders that hand over
an array, by ``cv2.resize`` (INTER_AREA where a side shrinks 2x or more, INTER_LINEAR
otherwise). A reduced decode is used only where the decoded image is still at least
224 x 224 (stoker's rule). The Pillow, stoker, simplejpeg and OpenCV variants are
measured again on up to 300 of the images at least 448 x 448, where 1/2 scaling
applies. Each environment runs one worker process, pinned to one CPU
(the same for all) with one thread; the main process asks it for one measurement at a
time, in rounds of every variant, the order rotated round to round; images/s are the
medians of the rounds. Agreement: over the first ``--check`` images, the mean absolute
difference (levels of 0-255) of each full decode from Pillow's full decode (stoker's
``.venv``), and of each 224 x 224 output from Pillow's full decode resized to 224 x 224
with BILINEAR.

    python benchmarks/jpeg_decoders.py [--rounds R] [--every K] [--quick]

Run with stoker's ``.venv/bin/python``; a virtualenv or library that is missing skips
its decoders with a note. The results go to ``benchmarks/.work/jpeg_decoders/`` and
(except with ``--quick``) docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work" / "jpeg_decoders"
FOLDER = BENCH / ".work" / "images" / "folder"
CORPUS = BENCH / ".work" / "images" / "corpus.json"
HEADING = "## JPEG decoders: images/s on one core, full and reduced-size decoding"
OUT = 224  # the training resolution: the output side
ENVS = {"stoker": ROOT / ".venv", "images": ROOT / ".venv-images",
        "simd": ROOT / ".venv-images-simd"}  # fmt: skip
# variant -> (environment, decoder label, how it decodes)
VARIANTS: dict[str, tuple[str, str, str]] = {
    "pillow": ("stoker", "Pillow", "full decode"),
    "pillow-draft": ("stoker", "Pillow", "draft (1/2, 1/4, 1/8)"),
    "stoker": ("stoker", "stoker decode_region (Pillow)", "draft, resize(box=...)"),
    "pillow-simd": ("simd", "Pillow-SIMD", "full decode"),
    "pillow-simd-draft": ("simd", "Pillow-SIMD", "draft (1/2, 1/4, 1/8)"),
    "turbojpeg": ("images", "PyTurboJPEG", "full decode"),
    "turbojpeg-scaled": ("images", "PyTurboJPEG", "scaling_factor (M/8)"),
    "simplejpeg": ("images", "simplejpeg", "full decode"),
    "simplejpeg-reduced": ("images", "simplejpeg", "min_width/min_height (M/8)"),
    "simplejpeg-pow2": ("images", "simplejpeg", "min_width/min_height at 1/2, 1/4, 1/8 only"),
    "opencv": ("images", "OpenCV", "full decode"),
    "opencv-reduced": ("images", "OpenCV", "IMREAD_REDUCED_COLOR_2/4/8"),
}


# ---------------------------------------------------------------- worker side


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a JPEG's SOF marker: OpenCV chooses its reduced flag from it
    and reads no header of its own that Python can ask for."""
    i = 2
    while i < len(data):
        marker, length = data[i + 1], int.from_bytes(data[i + 2 : i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h, w = data[i + 5 : i + 7], data[i + 7 : i + 9]
            return int.from_bytes(w, "big"), int.from_bytes(h, "big")
        i += 2 + length
    raise ValueError("no SOF marker")


def pow2_scale(w: int, h: int) -> int:
    """The largest of 1, 2, 4, 8 that keeps both sides at least OUT (draft's choice)."""
    return next(s for s in (8, 4, 2, 1) if (w // s >= OUT and h // s >= OUT) or s == 1)


Fn = Callable[[bytes, str], Any]  # (JPEG bytes, mode) -> uint8 array


def pillow_variants() -> dict[str, Fn]:
    """Pillow's (or Pillow-SIMD's, whichever this environment has) full and draft decodes;
    the resize is Pillow's own, on the decoded image (no array in between)."""
    import numpy as np
    from PIL import Image

    def run(data: bytes, mode: str, draft: bool) -> Any:
        img = Image.open(io.BytesIO(data))
        if draft:
            img.draft("RGB", (OUT, OUT))  # the smallest scale still at least OUT x OUT
        img = img.convert("RGB") if img.mode != "RGB" else img
        if mode == "resize":
            img = img.resize((OUT, OUT), Image.Resampling.BILINEAR)
        return np.asarray(img)

    return {"full": lambda d, m: run(d, m, False), "draft": lambda d, m: run(d, m, True)}


def pil_resize(a: Any) -> Any:
    """The whole array to OUT x OUT with Pillow's BILINEAR (antialiased, as stoker's)."""
    import numpy as np
    from PIL import Image

    return np.asarray(Image.fromarray(a).resize((OUT, OUT), Image.Resampling.BILINEAR))


def cv_resize(a: Any) -> Any:
    """The whole array to OUT x OUT with OpenCV: INTER_AREA where a side shrinks 2x or
    more (INTER_LINEAR would alias there), INTER_LINEAR otherwise (the usual case after a
    reduced decode, and 5x cheaper than INTER_AREA at a fractional factor)."""
    import cv2

    shrink = min(a.shape[0], a.shape[1]) / OUT
    how = cv2.INTER_AREA if shrink >= 2 else cv2.INTER_LINEAR
    return cv2.resize(a, (OUT, OUT), interpolation=how)


def array_variant(decode: Callable[[bytes], Any]) -> Fn:
    """A decoder that returns an array, followed by either resize."""

    def run(data: bytes, mode: str) -> Any:
        a = decode(data)
        if mode == "decode":
            return a
        return pil_resize(a) if mode == "resize" else cv_resize(a)

    return run


def stoker_variant() -> dict[str, Fn]:
    from stoker.records.image import decode_region

    def run(data: bytes, mode: str) -> Any:
        # (3, OUT, OUT), as stoker hands it over; transposed back for the comparison only
        return decode_region(data, (OUT, OUT), lambda w, h: (0, 0, w, h))

    return {"resize": run}


def turbojpeg_variants() -> dict[str, Fn]:
    from turbojpeg import TJPF_RGB, TurboJPEG

    tj = TurboJPEG()
    factors = sorted((f for f in tj.scaling_factors if f[0] <= f[1]), key=lambda f: f[0] / f[1])

    def scaled(data: bytes) -> Any:
        w, h, _, _ = tj.decode_header(data)
        # the smallest M/8 scale whose output is still at least OUT x OUT (else 1/1)
        f = next((f for f in factors if math.ceil(w * f[0] / f[1]) >= OUT
                  and math.ceil(h * f[0] / f[1]) >= OUT), (1, 1))  # fmt: skip
        return tj.decode(data, pixel_format=TJPF_RGB, scaling_factor=f)

    return {"full": array_variant(lambda d: tj.decode(d, pixel_format=TJPF_RGB)),
            "scaled": array_variant(scaled)}  # fmt: skip


def simplejpeg_variants() -> dict[str, Fn]:
    import simplejpeg

    def pow2(data: bytes) -> Any:
        h, w, _, _ = simplejpeg.decode_jpeg_header(data)
        s = pow2_scale(w, h)
        # the smallest scale at least w/s x h/s is 1/s itself: no 5/8-7/8 scale
        return simplejpeg.decode_jpeg(data, "RGB", min_height=-(-h // s), min_width=-(-w // s))

    return {
        "full": array_variant(lambda d: simplejpeg.decode_jpeg(d, "RGB")),
        "reduced": array_variant(
            lambda d: simplejpeg.decode_jpeg(d, "RGB", min_height=OUT, min_width=OUT)
        ),
        "pow2": array_variant(pow2),
    }


def opencv_variants() -> dict[str, Fn]:
    import cv2
    import numpy as np

    cv2.setNumThreads(1)
    # RGB out (OpenCV 4.10+), so that no BGR -> RGB pass is timed; the reduced flags
    # include IMREAD_COLOR_BGR, taken out for RGB
    rgb = cv2.IMREAD_COLOR_RGB
    flag = {1: rgb} | {s: (getattr(cv2, f"IMREAD_REDUCED_COLOR_{s}") & ~cv2.IMREAD_COLOR_BGR)
                       | rgb for s in (2, 4, 8)}  # fmt: skip

    def reduced(data: bytes) -> Any:
        return cv2.imdecode(np.frombuffer(data, np.uint8), flag[pow2_scale(*jpeg_size(data))])

    return {"full": array_variant(lambda d: cv2.imdecode(np.frombuffer(d, np.uint8), rgb)),
            "reduced": array_variant(reduced)}  # fmt: skip


# environment -> [(maker, {variant: the maker's key})]
# measured again on the images where 1/2 scaling applies
LARGE = ("pillow", "pillow-draft", "stoker", "simplejpeg", "simplejpeg-reduced",
         "simplejpeg-pow2", "opencv", "opencv-reduced")  # fmt: skip
MAKERS: dict[str, list[tuple[Callable[[], dict[str, Fn]], dict[str, str]]]] = {
    "stoker": [(pillow_variants, {"pillow": "full", "pillow-draft": "draft"}),
               (stoker_variant, {"stoker": "resize"})],
    "simd": [(pillow_variants, {"pillow-simd": "full", "pillow-simd-draft": "draft"})],
    "images": [(turbojpeg_variants, {"turbojpeg": "full", "turbojpeg-scaled": "scaled"}),
               (simplejpeg_variants, {"simplejpeg": "full", "simplejpeg-reduced": "reduced",
                                     "simplejpeg-pow2": "pow2"}),
               (opencv_variants, {"opencv": "full", "opencv-reduced": "reduced"})],
}  # fmt: skip


def modes_of(variant: str) -> tuple[str, ...]:
    """decode only, + Pillow's resize, + OpenCV's resize (where OpenCV is at hand)."""
    if variant == "stoker":
        return ("resize",)
    return ("decode", "resize", "cv2") if VARIANTS[variant][0] == "images" else ("decode", "resize")


def load_variants(env: str) -> tuple[dict[str, Fn], dict[str, str]]:
    """This environment's variants that import, and why the others do not."""
    fns: dict[str, Fn] = {}
    missing: dict[str, str] = {}
    for make, names in MAKERS[env]:
        try:
            made = make()
        except Exception as exc:  # a library or its shared object that is not here
            for v in names:
                missing[v] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            continue
        for v, key in names.items():
            fns[v] = made[key]
    return fns, missing


def versions(env: str) -> dict[str, str]:
    """The decoders' distributions and the libjpeg-turbo each one runs on."""
    import importlib.metadata as md

    out = {}
    for dist in ("pillow", "pillow-simd", "PyTurboJPEG", "simplejpeg", "opencv-python-headless",
                 "numpy", "stoker"):  # fmt: skip
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    for name, find in (("Pillow", _pil_turbo), ("PyTurboJPEG", _deb_turbo),
                       ("simplejpeg", _simplejpeg_turbo), ("OpenCV", _opencv_turbo)):  # fmt: skip
        try:
            if (got := find()) is not None:
                out[f"libjpeg-turbo ({name})"] = got
        except Exception:  # that library is not in this environment
            pass
    return out


def _pil_turbo() -> str | None:
    from PIL import features

    return features.version("libjpeg_turbo")


def _deb_turbo() -> str | None:
    import turbojpeg  # noqa: F401  (only where PyTurboJPEG is installed)

    r = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "libturbojpeg0"],
                       capture_output=True, text=True)  # fmt: skip
    return f"{r.stdout.strip()} (Debian's libturbojpeg0)" if r.returncode == 0 else None


def _simplejpeg_turbo() -> str | None:
    import re

    import simplejpeg

    # linked in statically; its version string is in the extension module
    for so in Path(simplejpeg.__file__).parent.glob("_jpeg*.so"):
        if hit := re.search(rb"libjpeg-turbo version ([0-9.]+)", so.read_bytes()):
            return hit.group(1).decode()
    return None


def _opencv_turbo() -> str | None:
    import re

    import cv2

    hit = re.search(r"JPEG:\s+build-libjpeg-turbo \(ver ([^)]+)\)", cv2.getBuildInformation())
    return hit.group(1) if hit else None


def worker(env: str, listing: str, cpu: int) -> int:
    """Serve measurements on stdin / stdout (one JSON object a line) until told to quit."""
    os.sched_setaffinity(0, {cpu})
    sets = {
        k: [Path(p).read_bytes() for p in v]
        for k, v in json.loads(Path(listing).read_text()).items()
    }
    data = sets["all"]
    fns, missing = load_variants(env)
    say = sys.stdout
    say.write(json.dumps({"variants": sorted(fns), "missing": missing,
                          "versions": versions(env)}) + "\n")  # fmt: skip
    say.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        fn, mode = fns[cmd["variant"]], cmd["mode"]
        if cmd["op"] == "time":
            timed = sets[cmd.get("set", "all")]
            for d in timed[: cmd.get("warm", 0)]:
                fn(d, mode)
            gc.disable()  # no collection inside the clock (nothing here makes cycles)
            t = time.perf_counter()
            for d in timed:
                fn(d, mode)
            s = time.perf_counter() - t
            gc.enable()
            say.write(json.dumps({"seconds": s, "images": len(timed)}) + "\n")
        elif cmd["op"] == "arrays":  # the first n outputs, for the agreement check
            import numpy as np

            outs = [np.asarray(fn(d, mode)) for d in data[: cmd["n"]]]
            if cmd["variant"] == "stoker":
                outs = [a.transpose(1, 2, 0) for a in outs]
            np.savez(cmd["out"], *outs)
            say.write(json.dumps({"ok": True}) + "\n")
        elif cmd["op"] == "shapes":  # decoded pixels over the source's, for every image
            import numpy as np

            frac = []
            for d in data:
                a = fn(d, "decode")
                w, h = jpeg_size(d)
                frac.append(a.shape[0] * a.shape[1] / (w * h))
            say.write(json.dumps({"pixels": statistics.fmean(frac),
                                  "reduced": sum(f < 1 for f in frac) / len(frac)}) + "\n")  # fmt: skip
        say.flush()
    return 0


# ---------------------------------------------------------------- main side


class Worker:
    """One environment's worker process."""

    def __init__(self, env: str, python: Path, listing: Path, cpu: int) -> None:
        self.env = env
        self.proc = subprocess.Popen(
            [str(python), __file__, "--worker", env, "--list", str(listing), "--cpu", str(cpu)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=os.environ | {"OMP_NUM_THREADS": "1", "OPENCV_FOR_THREADS_NUM": "1"},
        )  # fmt: skip
        self.hello = self.ask(None)

    def ask(self, cmd: dict[str, Any] | None) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if cmd is not None:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.env} worker exited ({self.proc.wait()})")
        return dict(json.loads(line))

    def close(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
        except OSError:  # already gone
            pass
        self.proc.wait(timeout=30)


def cpuinfo_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def sample(every: int) -> list[Path]:
    """Every ``every``-th image of the folder, in its sorted order (all classes)."""
    files = sorted(FOLDER.glob("*/*.jpg"))
    if not files:
        raise SystemExit(f"no images in {FOLDER}: run benchmarks/image_corpus.py first")
    return files[::every]


def large_sample(most: int) -> tuple[list[Path], int]:
    """Up to ``most`` of the images at least 2 x OUT a side (where 1/2 scaling applies),
    spread over the folder's order; and how many there are."""
    from PIL import Image

    big = []
    for p in sorted(FOLDER.glob("*/*.jpg")):
        with Image.open(p) as img:  # the header only
            if min(img.size) >= 2 * OUT:
                big.append(p)
    return big[:: max(1, -(-len(big) // most))], len(big)


def reference(paths: list[Path], n: int) -> tuple[list[Any], list[Any]]:
    """Pillow's full decodes (stoker's .venv) and those resized to OUT x OUT."""
    import numpy as np
    from PIL import Image

    full, small = [], []
    for p in paths[:n]:
        img = Image.open(p).convert("RGB")
        full.append(np.asarray(img))
        small.append(np.asarray(img.resize((OUT, OUT), Image.Resampling.BILINEAR)))
    return full, small


def mad(ref: list[Any], got: list[Any]) -> tuple[float, float] | None:
    """Mean and largest per-image mean absolute difference; None where shapes differ (a
    reduced decode-only output: not the reference's size)."""
    import numpy as np

    per = []
    for a, b in zip(ref, got, strict=True):
        if a.shape != b.shape:
            return None
        per.append(float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean()))
    return statistics.fmean(per), max(per)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--every", type=int, default=20, help="every K-th image of the corpus")
    ap.add_argument("--check", type=int, default=200, help="images in the agreement check")
    ap.add_argument("--quick", action="store_true", help="few images, 2 rounds, docs untouched")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--list", help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker, a.list, a.cpu)
    rounds, every, n_check = (2, 200, 20) if a.quick else (a.rounds, a.every, a.check)
    sys.path.insert(0, str(BENCH))
    from docsection import replace_section
    from machine import git_info

    t0 = time.perf_counter()
    load0 = os.getloadavg()
    paths = sample(every)
    cpu = max(os.sched_getaffinity(0))
    WORK.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="jpeg-decoders-"))
    large, n_large = large_sample(30 if a.quick else 300)
    listing = tmp / "images.json"
    listing.write_text(
        json.dumps({"all": [str(p) for p in paths], "large": [str(p) for p in large]})
    )
    workers: dict[str, Worker] = {}
    skipped: dict[str, str] = {}
    for env, venv in ENVS.items():
        py = venv / "bin" / "python"
        if not py.exists():
            for v, (e, *_) in VARIANTS.items():
                if e == env:
                    skipped[v] = f"no {venv.name} virtualenv"
            continue
        w = Worker(env, py, listing, cpu)
        workers[env] = w
        skipped.update(w.hello["missing"])
    variants = [v for v in VARIANTS if v not in skipped]
    jobs = [(v, m, "all") for v in variants for m in modes_of(v)]
    jobs += [(v, m, "large") for v in LARGE if v in variants for m in modes_of(v)]
    print(f"{len(paths)} images ({len(large)} of the {n_large} at least {2 * OUT} a side), "
          f"{len(jobs)} measurements a round, CPU {cpu}", flush=True)  # fmt: skip
    for v, why in skipped.items():
        print(f"{v}: skipped, {why}", flush=True)
    try:
        # agreement first (also the warm-up: every variant has run before the clock)
        ref_full, ref_small = reference(paths, n_check)
        agree: dict[str, dict[str, Any]] = {}
        for v, m in {(v, m) for v, m, _ in jobs}:
            out = tmp / f"{v}-{m}.npz"
            workers[VARIANTS[v][0]].ask({"op": "arrays", "variant": v, "mode": m, "n": n_check,
                                         "out": str(out)})  # fmt: skip
            with __import__("numpy").load(out) as z:
                got = [z[f"arr_{i}"] for i in range(len(z.files))]
            agree.setdefault(v, {})[m] = mad(ref_full if m == "decode" else ref_small, got)
            out.unlink()
        shapes = {v: workers[VARIANTS[v][0]].ask({"op": "shapes", "variant": v, "mode": "decode"})
                  for v in variants if v != "stoker"}  # fmt: skip
        runs: list[dict[str, Any]] = []
        for r in range(rounds):
            k = r * len(jobs) // max(rounds, 1)
            for v, m, which in jobs[k:] + jobs[:k]:  # rotated: none always first or last
                got = workers[VARIANTS[v][0]].ask({"op": "time", "variant": v, "mode": m,
                                                   "set": which, "warm": 20})  # fmt: skip
                ips = got["images"] / got["seconds"]
                runs.append({"round": r, "variant": v, "mode": m, "set": which,
                             "images_per_s": ips})  # fmt: skip
                print(f"round {r + 1}/{rounds} {which:5} {v:20} {m:7} {ips:8.0f} images/s",
                      flush=True)  # fmt: skip
        vers = {env: w.hello["versions"] for env, w in workers.items()}
    finally:
        for w in workers.values():
            w.close()
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    med = {(v, m, w): statistics.median(x["images_per_s"] for x in runs if x["variant"] == v
                                        and x["mode"] == m and x["set"] == w)
           for v, m, w in jobs}  # fmt: skip
    corpus = json.loads(CORPUS.read_text()) if CORPUS.exists() else {}
    res = {
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "took": time.perf_counter() - t0, "images": len(paths), "every": every,
        "rounds": rounds, "check_images": n_check, "cpu_pinned": cpu,
        "machine": {"cpu": cpuinfo_model(), "cores": os.cpu_count(), "python": sys.version.split()[0],
                    "load_start": load0, "load_end": os.getloadavg()},
        "commit": git_info(), "versions": vers, "skipped": skipped,
        "medians": {f"{v} {m}": x for (v, m, w), x in med.items() if w == "all"},
        "medians_large": {f"{v} {m}": x for (v, m, w), x in med.items() if w == "large"},
        "large_images": len(large), "large_of": n_large,
        "agreement": agree, "decoded_pixels": shapes, "runs": runs,
        "corpus": {k: corpus.get(k) for k in ("images", "bytes_mean", "bytes_median",
                                               "width_mean", "height_mean", "width_median",
                                               "height_median", "digest")},
    }  # fmt: skip
    name = "results-quick.json" if a.quick else "results.json"
    (WORK / name).write_text(json.dumps(res, indent=1) + "\n")
    text = section(res, a.quick)
    print(text)
    if not a.quick:
        replace_section(ROOT / "docs" / "benchmarks.md", HEADING, text)
    return 0


def fmt_mad(x: tuple[float, float] | None) -> str:
    return "—" if x is None else f"{x[0]:.2f} (max {x[1]:.2f})"


def markdown(paragraphs: list[str]) -> list[str]:
    """Docstring paragraphs as markdown lines: a bulleted one keeps its bullets."""
    out = []
    for par in paragraphs:
        text = par.replace("``", "`").strip()
        if text.startswith("* "):
            out += ["- " + " ".join(item.split()) for item in text[2:].split("\n* ")]
        else:
            out.append(" ".join(text.split()))
        out.append("")
    return out


def fmt_px(px: dict[str, float] | None) -> str:
    return "—" if px is None else f"{px['pixels']:.2f} ({100 * px['reduced']:.0f}%)"


def section(res: dict[str, Any], quick: bool) -> str:
    """The docs/benchmarks.md section: machine, command, table, the decode limit."""
    m, c, vers = res["machine"], res["corpus"], res["versions"]
    med = {tuple(k.split(" ")): x for k, x in res["medians"].items()}
    used = "; ".join(f"{ENVS[env].name}: " + ", ".join(f"{k} {v}" for k, v in d.items()
                                                        if k not in ("stoker",))
                     for env, d in vers.items())  # fmt: skip
    lines = [
        HEADING, "",
        f"Command: `python benchmarks/jpeg_decoders.py{' --quick' if quick else ''}` (with "
        f"`.venv/bin/python`; the corpus from `python benchmarks/image_corpus.py`). Run "
        f"{res['when']}, took {res['took']:.0f} s; raw results in "
        "`benchmarks/.work/jpeg_decoders/results.json`.", "",
        f"Machine: {m['cpu']} (/proc/cpuinfo), {m['cores']} cores, Python {m['python']}; stoker "
        f"at {res['commit']}; every measurement pinned to CPU {res['cpu_pinned']}, one thread. "
        f"Load average {m['load_start'][0]:.2f} at the start and {m['load_end'][0]:.2f} at the "
        "end (a shared 2-core sandbox: read the per-round spread in results.json).", "",
        f"Versions: {used}.", "",
        *markdown(__doc__.split("\n\n")[1:4]),
        f"Sample: {res['images']:,} of the corpus's {c.get('images') or 0:,} (every "
        f"{res['every']}th; mean {(c.get('bytes_mean') or 0) / 1e3:.1f} KB, median size "
        f"{c.get('width_median') or 0:.0f} x {c.get('height_median') or 0:.0f}); "
        f"{res['rounds']} rounds; agreement over the first {res['check_images']}.", "",
        "| decoder | decoding | decode only | + resize (Pillow) | + resize (OpenCV) | decoded "
        "pixels / source's (images reduced) | MAD full decode | MAD 224, Pillow resize | MAD "
        "224, OpenCV resize |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip

    def ips(v: str, mode: str) -> str:
        x = med.get((v, mode))
        return "—" if x is None else f"{x:,.0f}"

    for v, (_, label, how) in VARIANTS.items():
        if v in res["skipped"]:
            continue
        px = res["decoded_pixels"].get(v)
        ag = res["agreement"][v]
        lines.append(
            f"| {label} | {how} | {ips(v, 'decode')} | {ips(v, 'resize')} | {ips(v, 'cv2')} | "
            f"{fmt_px(px)} | "
            f"{fmt_mad(ag.get('decode'))} | {fmt_mad(ag.get('resize'))} | "
            f"{fmt_mad(ag.get('cv2'))} |"
        )
    big = {tuple(k.split(" ")): x for k, x in res.get("medians_large", {}).items()}
    if big:
        lines += [
            "", f"The same, decode and resize, on {res['large_images']} of the corpus's "
            f"{res['large_of']:,} images at least {2 * OUT} x {2 * OUT} (where 1/2 scaling "
            "applies; spread over the folder's order):", "",
            "| decoder | decoding | decode only | + resize (Pillow) | + resize (OpenCV) |",
            "|---|---|---:|---:|---:|",
        ]  # fmt: skip
        for v in LARGE:
            if any(k[0] == v for k in big):
                _, label, how = VARIANTS[v]
                row = [big.get((v, mode)) for mode in ("decode", "resize", "cv2")]
                cells = " | ".join("—" if x is None else f"{x:,.0f}" for x in row)
                lines.append(f"| {label} | {how} | {cells} |")
    best = max((x, v, mode) for (v, mode), x in med.items() if mode != "decode")
    best_dec = max((x, v) for (v, mode), x in med.items() if mode == "decode")
    cores = m["cores"]
    rs = "Pillow's resize" if best[2] == "resize" else "OpenCV's resize"
    lines += [
        "",
        "images/s: medians of the rounds; MAD: mean absolute difference in levels of 0-255, "
        "the mean over the images (the largest per image in brackets), of the full decode "
        "from Pillow's (— where the decode is at a reduced size) and of the 224 x 224 output "
        "from Pillow's full decode + resize.",
        "",
        f"Decode limit of this machine at 224 (the fastest decode + resize, x {cores} cores): "
        f"{best[0]:,.0f} x {cores} = {best[0] * cores:,.0f} images/s ({VARIANTS[best[1]][1]}, "
        f"{VARIANTS[best[1]][2]}, {rs}); 0.8x of it is {0.8 * best[0] * cores:,.0f} images/s. "
        f"Decode only: {best_dec[0]:,.0f} x {cores} = {best_dec[0] * cores:,.0f} images/s "
        f"({VARIANTS[best_dec[1]][1]}, {VARIANTS[best_dec[1]][2]}).",
    ]  # fmt: skip
    lines += reading(res, med)
    if res["skipped"]:
        why = "; ".join(f"{k}, {v}" for k, v in res["skipped"].items())
        lines += ["", f"Not measured: {why}."]
    return "\n".join(lines) + "\n"


def reading(res: dict[str, Any], med: dict[tuple[str, ...], float]) -> list[str]:
    """What the table says, with its numbers (nothing where a variant it names is missing)."""
    big = {tuple(k.split(" ")): x for k, x in res.get("medians_large", {}).items()}
    try:
        bf, bp2, bm8 = (big[v, "decode"] for v in ("simplejpeg", "simplejpeg-pow2",
                                                   "simplejpeg-reduced"))  # fmt: skip
        bfc, bp2c = big["simplejpeg", "cv2"], big["simplejpeg-pow2", "cv2"]
        bpf, bpd = big["pillow", "resize"], big["stoker", "resize"]
        px, ag = res["decoded_pixels"], res["agreement"]
        p, pr, st = med["pillow", "decode"], med["pillow", "resize"], med["stoker", "resize"]
        sj, sjr, sjc = (med["simplejpeg", m] for m in ("decode", "resize", "cv2"))
        rd, rdr, rdc = (med["simplejpeg-reduced", m] for m in ("decode", "resize", "cv2"))
        tj, oc = med["turbojpeg", "decode"], med["opencv", "decode"]
        occ, simd = med["opencv-reduced", "cv2"], med["pillow-simd-draft", "resize"]
        pick, simd_dec = med["simplejpeg-pow2", "cv2"], med["pillow-simd-draft", "decode"]
        m8, draft = px["simplejpeg-reduced"], px["pillow-draft"]
        m8_mad, cv_mad = ag["simplejpeg-reduced"]["resize"], ag["simplejpeg"]["cv2"]
    except KeyError:
        return []
    full_same = all(ag[v]["decode"] is not None and ag[v]["decode"][1] == 0
                    for v in ("pillow-simd", "turbojpeg", "simplejpeg", "opencv"))  # fmt: skip
    ms = 1e3 / p
    return ["", (
        "Reading: all of these are libjpeg-turbo underneath, with the same integer IDCT and "
        "upsampling" + (", and every full decode is the same pixels as Pillow's (MAD 0 on "
        "every image checked, libjpeg-turbo 2.1.5 and 3.x alike)" if full_same else "") + "; what "
        "differs is the wrapping and the resize. Decoding only, the array decoders "
        f"(simplejpeg {sj:,.0f}, PyTurboJPEG {tj:,.0f}, OpenCV {oc:,.0f} images/s) are "
        f"{sj / p:.1f}x Pillow ({p:,.0f}): Pillow's open, its feeding of the decoder and "
        "its 4-byte pixels copied out to a 3-channel array cost "
        f"{ms - 1e3 / sj:.2f} ms of its {ms:.2f} ms an image. At these sizes the resize "
        f"costs more than the decode: Pillow's BILINEAR to 224 x 224 adds {1e3 / pr - ms:.2f} "
        f"ms, so Pillow decodes and resizes {pr:,.0f} images/s, stoker's decode_region "
        f"{st:,.0f}, and an array decoder followed by Pillow's resize {sjr / pr:.2f}x that "
        f"({sjr:,.0f}); "
        f"followed by OpenCV's resize, {sjc:,.0f}. Reduced-size decoding barely applies to "
        "ImageNet-sized images at 224: draft's (and OpenCV's) 1/2, 1/4, 1/8 need at least "
        f"448 x 448, {100 * draft['reduced']:.0f}% of these images. libjpeg-turbo's M/8 "
        f"scales reduce {100 * m8['reduced']:.0f}% of them (to {m8['pixels']:.2f} of the "
        f"pixels) but decode more slowly than full size ({rd:,.0f} against {sj:,.0f} "
        "images/s: its 5/8, 6/8 and 7/8 IDCTs have no SIMD code on x86, the full-size one "
        f"has), which pays back before Pillow's slow resize ({rdr:,.0f} against {sjr:,.0f}) "
        f"but not before OpenCV's ({rdc:,.0f} against {sjc:,.0f}), and their 224 x 224 "
        f"output is {m8_mad[0]:.2f} levels from Pillow's (max {m8_mad[1]:.2f}), against "
        f"{cv_mad[0]:.2f} for OpenCV's resize of a full decode. Where the scale comes to 1/2 "
        f"or less (images at least 448 x 448) reduced decoding pays: simplejpeg decodes "
        f"{bp2 / bf:.1f}x faster at 1/2, 1/4, 1/8 only ({bp2:,.0f} against {bf:,.0f}; the M/8 "
        f"scales {bm8:,.0f}, {bm8 / bp2:.2f}x that), {bp2c / bfc:.1f}x with OpenCV's resize, and "
        f"stoker's draft path is {bpd / bpf:.1f}x Pillow's full decode + resize."), "", (
        "To pick: a full-size decode by simplejpeg (a 1 MB wheel with libjpeg-turbo 3.1.2 "
        "inside; PyTurboJPEG is as fast but loads the system's libturbojpeg, and its 2.x "
        "releases need libjpeg-turbo 3, which Debian 12 does not ship, so 1.8.3 here), "
        "reduced only to 1/2, 1/4 or 1/8 where the region is at least twice the output "
        "(stoker's rule now), then OpenCV's resize: "
        f"{pick:,.0f} images/s a core, {pick / st:.1f}x stoker's decode_region. OpenCV "
        f"alone does as well ({occ:,.0f}, one dependency, but some 170 MB installed). "
        f"Pillow-SIMD keeps Pillow's API and gets {simd / st:.1f}x ({simd:,.0f}) from its "
        f"resize (its decode alone is {simd_dec / p:.2f}x Pillow's), but builds from source "
        "against the system's libjpeg and trails Pillow's releases. The decoder alone does not decide stoker's rate; the resize does. "
        "ImageNet's files carry about 4x these bytes at the same sizes, so expect "
        "every decode there to be slower and the wrappers' fixed costs to weigh less."
    )]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
