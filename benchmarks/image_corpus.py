"""A benchmark image set made offline from photographs that Debian and PyPI packages ship:
an ImageFolder tree of ImageNet-like JPEGs and the records dataset built from it.

Random noise decodes unlike a photograph (its DCT blocks are all high frequencies, so
entropy decoding dominates and reduced-size decoding saves little), so the images are
crops of real photographs, downscaled and re-encoded as a photo site's copies are.

Recipe (the defaults; everything is drawn from one ``numpy.random.default_rng(seed)``
in the main process, so the set is the same for a seed, Pillow and libjpeg-turbo):

* Sources, one class each (``NN-name``): the photographs (not the illustrations) of
  Debian's ``lomiri-wallpapers-16.04`` 20.04.0-2 (13 photos, 1365x1074 to
  5312x2988), ``lomiri-wallpapers-20.04`` 20.04.0-2 (1) and ``mate-backgrounds``
  1.26.0-1 (its 12 ``nature`` photos, 1280x1024 to 2560x1920), fetched with
  ``apt-get download`` (pinned versions) into ``benchmarks/.work/images-debs`` and
  unpacked there with ``dpkg-deb -x`` (nothing is installed); and the sample photos
  inside the scikit-image 0.26.0 wheel (astronaut, chelsea, coffee, rocket,
  motorcycle_left) and the scikit-learn 1.9.1 wheel (china, flower), 300-740 pixels
  a side, found in the ``.venv-images`` virtualenv
  (``benchmarks/requirements-images.txt``). 33 classes with everything present.
* Each class gets the same number of images (the first ``n % classes`` one more).
* Output size: aspect ratio w/h log-uniform in [0.75, 1.75] (median 1.15), pixels
  log-normal with median 400 x 350 and sigma 0.3, each side clipped to [160, 1000].
* Crop: the largest region of that aspect the source holds, scaled to a fraction of
  its area drawn uniformly from [0.15, 1], at a uniform position; a region smaller
  than the output (the small PyPI photos) makes the output that region's size (no
  upscaling). The region is resized to the output with Lanczos (Pillow,
  ``reducing_gap=3``): the median image is downscaled 3x (5-95%: 1-7x; 1x for the
  small PyPI photos), which gives it a camera photo's detail per pixel.
* JPEG: quality uniform over the integers 75-95, Pillow's defaults otherwise
  (baseline, 4:2:0 chroma subsampling, standard Huffman tables), as most JPEGs are.

What it comes to (seed 0, 20,000 images, 33 classes; 170-215 s on 2 cores): mean 26.2 KB
(median 22.1 KB, 5-95% 8-58 KB), mean 391 x 340 pixels (median 388 x 336), 1.6 bits a
pixel, quality mean 85. ImageNet's training JPEGs are about 110 KB at a similar size
(at 500 x 375 that is 4.7 bits a pixel): these wallpaper photographs are smoother (sky,
bokeh, soft focus) than ImageNet's snapshots, so at ImageNet's sizes their files are
about a quarter of the bytes, and entropy decoding is a smaller share of a decode than
on ImageNet. A larger share of the source per crop (30 KB), sharpening (32-37 KB) or
quality 95 for all (43 KB) do not close that; images twice the side would (88 KB), but
then not at ImageNet's sizes, which decide what reduced-size decoding can do at 224.

Written to ``benchmarks/.work/images/folder/<class>/<n>.jpg`` (``--quick``:
``benchmarks/.work/images-quick``), then ``stoker build-records`` makes
``.../records``; ``.../corpus.json`` has the figures (count, classes, bytes, sizes), the
recipe, every source with its package, version and sha256, and a digest of the files.
Rendering uses 2 processes (``--procs``)::

    python benchmarks/image_corpus.py [--images N] [--seed S] [--quick] [--no-download]

``--quick`` makes 500 images for a smoke test; ``--no-download`` uses only the sources
already on this machine (unpacked .debs, ``.venv-images``) and exits 3 when there are
none.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import multiprocessing as mp
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORK = BENCH / ".work"
DEBS_DIR = WORK / "images-debs"
IMAGES_VENV = ROOT / ".venv-images"
NO_SOURCES = 3  # exit status when --no-download finds no photograph

# Debian packages: (version, files under usr/share/backgrounds). Only the photographs:
# the packages' illustrations, renders and gradients are left out.
DEBS: dict[str, tuple[str, tuple[str, ...]]] = {
    "lomiri-wallpapers-16.04": ("20.04.0-2", (
        "Bridge_by_Sander_Klootwijk.jpg", "Dragonfly_by_Bolly.jpg",
        "Picture_0B_by_freespace.jpg", "Picture_1A_by_freespace.jpg",
        "Wine_by_Jakkub_Mede.jpg", "aitzgorri_by_Aitzol_Berasategi.jpg",
        "free_by_Peter_Nerlich.jpg", "friends_by_Aitzol_Berasategi.jpg",
        "greentock_by_Peter_Nerlich.jpg", "life_by_Aitzol_Berasategi.jpg",
        "picosdeeuropa_by_Aitzol_Berasategi.jpg", "seeding_by_Clements_Engelhardt.jpg",
        "sunset_by_Aitzol_Berasategi.jpg",
    )),
    "lomiri-wallpapers-20.04": ("20.04.0-2", ("Kleiber_by_Lukas_Baubkus.jpg",)),
    "mate-backgrounds": ("1.26.0-1", tuple(f"mate/nature/{n}.jpg" for n in (
        "Aqua", "Blinds", "Dune", "FreshFlower", "Garden", "GreenMeadow", "LadyBird",
        "RainDrops", "Storm", "TwoWings", "Wood", "YellowFlower",
    ))),
}  # fmt: skip

# PyPI wheels: distribution -> (import name, data folder inside it, photographs).
PYPI: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "scikit-image": ("skimage", "data", (
        "astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png",
    )),
    "scikit-learn": ("sklearn", "datasets/images", ("china.jpg", "flower.jpg")),
}  # fmt: skip

# The recipe's numbers (see the module docstring).
ASPECT = (0.75, 1.75)  # w/h, log-uniform
MEDIAN_PIXELS = 400 * 350
SIGMA_PIXELS = 0.3  # of log(pixels)
SIDE = (160, 1000)
AREA = (0.15, 1.0)  # fraction of the largest region of the drawn aspect
QUALITY = (75, 95)  # inclusive
REDUCING_GAP = 3.0


@dataclass
class Source:
    """One photograph, one class."""

    name: str  # the class folder
    path: str
    package: str
    version: str
    file: str  # inside the package
    width: int = 0
    height: int = 0
    bytes: int = 0
    sha256: str = ""


def slug(file: str) -> str:
    """A class name from a file name: ``Bridge_by_Sander_Klootwijk.jpg`` -> ``bridge``."""
    stem = Path(file).stem.split("_by_")[0]
    return re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")


def fetch_deb(package: str, version: str, download: bool) -> Path | None:
    """The unpacked tree of ``package`` (apt-get download of the pinned version, or any
    version if that one is gone from the archive); None when it is not here and
    ``download`` is off, or apt cannot fetch it."""
    debs = sorted(DEBS_DIR.glob(f"{package}_*.deb"))
    if not debs and download:
        DEBS_DIR.mkdir(parents=True, exist_ok=True)
        for spec in (f"{package}={version}", package):
            r = subprocess.run(["apt-get", "download", "-q", spec], cwd=DEBS_DIR,
                               capture_output=True, text=True)  # fmt: skip
            if r.returncode == 0:
                break
            print(f"apt-get download {spec}: {r.stderr.strip().splitlines()[-1:]}", flush=True)
        debs = sorted(DEBS_DIR.glob(f"{package}_*.deb"))
    if not debs:
        return None
    deb = debs[-1]
    tree = DEBS_DIR / deb.stem
    if not (tree / ".unpacked").exists():
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True)
        (tree / ".unpacked").write_text(deb_version(deb) + "\n")
    return tree


def deb_version(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip


def debian_sources(download: bool) -> list[Source]:
    out = []
    for package, (version, files) in DEBS.items():
        tree = fetch_deb(package, version, download)
        if tree is None:
            print(f"{package}: not here (apt-get download failed or --no-download)", flush=True)
            continue
        got = (tree / ".unpacked").read_text().strip()
        if got != version:  # the archive no longer has the pinned one: the set will differ
            print(f"{package}: {got}, not the recipe's {version}", flush=True)
        for f in files:
            rel = f"usr/share/backgrounds/{f}"
            if (tree / rel).exists():
                out.append(Source(slug(f), str(tree / rel), package, got, rel))
    return out


def pypi_sources(venv: Path) -> list[Source]:
    """The wheels' photographs, located by the virtualenv's own interpreter (the packages
    are found, not imported)."""
    py = venv / "bin" / "python"
    if not py.exists():
        print(f"{venv}: no such virtualenv (benchmarks/requirements-images.txt)", flush=True)
        return []
    code = (
        "import importlib.metadata as m, importlib.util as u, json, sys\n"
        "out = {}\n"
        "for dist, mod in json.loads(sys.argv[1]).items():\n"
        "    s = u.find_spec(mod)\n"
        "    if s is not None:\n"
        "        out[dist] = [m.version(dist), list(s.submodule_search_locations)[0]]\n"
        "print(json.dumps(out))\n"
    )
    mods = json.dumps({d: v[0] for d, v in PYPI.items()})
    r = subprocess.run([str(py), "-c", code, mods], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{py}: {r.stderr.strip()[-300:]}", flush=True)
        return []
    found = json.loads(r.stdout)
    out = []
    for dist, (mod, folder, files) in PYPI.items():
        if dist not in found:
            print(f"{dist}: not installed in {venv}", flush=True)
            continue
        version, where = found[dist]
        for f in files:
            p = Path(where) / folder / f
            if p.exists():
                out.append(Source(slug(f), str(p), dist, version, f"{mod}/{folder}/{f}"))
    return out


def describe(sources: list[Source]) -> list[Source]:
    """Number the classes and record each source's size and checksum."""
    from PIL import Image

    for k, s in enumerate(sources):
        data = Path(s.path).read_bytes()
        with Image.open(s.path) as img:
            s.width, s.height = img.size
        s.name, s.bytes, s.sha256 = f"{k:02d}-{s.name}", len(data), hashlib.sha256(data).hexdigest()
    return sources


def plan(sources: list[Source], n: int, seed: int) -> list[dict[str, Any]]:
    """Every image's crop, output size and quality, drawn in order from one generator."""
    rng = np.random.default_rng(seed)
    per = [n // len(sources) + (k < n % len(sources)) for k in range(len(sources))]
    jobs = []
    for s, count in zip(sources, per):
        for i in range(count):
            r = math.exp(rng.uniform(math.log(ASPECT[0]), math.log(ASPECT[1])))
            px = MEDIAN_PIXELS * math.exp(rng.normal(0.0, SIGMA_PIXELS))
            w = min(max(round(math.sqrt(px * r)), SIDE[0]), SIDE[1])
            h = min(max(round(math.sqrt(px / r)), SIDE[0]), SIDE[1])
            # the largest region of aspect w/h inside the source, then a share of its area
            rw = min(s.width, s.height * w / h)
            rh = min(s.height, rw * h / w)  # min: rounding
            f = math.sqrt(rng.uniform(*AREA))
            rw, rh = rw * f, rh * f
            if rw < w:  # never upscale: the output becomes the region's size
                w, h = max(1, math.floor(rw)), max(1, math.floor(rh))
            left = rng.uniform(0, max(0.0, s.width - rw))
            top = rng.uniform(0, max(0.0, s.height - rh))
            q = int(rng.integers(QUALITY[0], QUALITY[1] + 1))
            jobs.append({"src": s.path, "out": f"{s.name}/{i:05d}.jpg", "size": (w, h),
                         "box": (left, top, left + rw, top + rh), "quality": q})  # fmt: skip
    return jobs


_SOURCE: dict[str, Any] = {}  # a worker's decoded source (jobs come grouped by source)


def _decoded(path: str) -> Any:
    from PIL import Image

    if path not in _SOURCE:
        _SOURCE.clear()  # one at a time: the largest is 20M pixels, 60 MB decoded
        with Image.open(path) as img:
            _SOURCE[path] = img.convert("RGB")
    return _SOURCE[path]


def render(job: dict[str, Any], folder: str) -> tuple[str, int, int, int, str]:
    """Crop, resize and encode one image; (path, bytes, width, height, sha256)."""
    from PIL import Image

    img = _decoded(job["src"])
    out = img.resize(job["size"], Image.Resampling.LANCZOS, box=job["box"],
                     reducing_gap=REDUCING_GAP)  # fmt: skip
    path = os.path.join(folder, job["out"])
    out.save(path, "JPEG", quality=job["quality"])
    data = Path(path).read_bytes()
    return job["out"], len(data), out.width, out.height, hashlib.sha256(data).hexdigest()


def _render(args: tuple[dict[str, Any], str]) -> tuple[str, int, int, int, str]:
    return render(*args)


def write_folder(sources: list[Source], jobs: list[dict[str, Any]], folder: Path, procs: int
                 ) -> list[tuple[str, int, int, int, str]]:  # fmt: skip
    shutil.rmtree(folder, ignore_errors=True)  # no image of an earlier, larger run left over
    for s in sources:
        (folder / s.name).mkdir(parents=True)
    args = [(j, str(folder)) for j in jobs]
    done = []
    # chunks of one source in a row, so that a worker decodes each source about once
    with mp.get_context("fork").Pool(procs) as pool:
        for i, r in enumerate(pool.imap(_render, args, chunksize=32)):
            done.append(r)
            if (i + 1) % 2000 == 0:
                print(f"  {i + 1:,} / {len(jobs):,} images", flush=True)
    return done


def build_records(folder: Path, records: Path) -> float:
    """``stoker build-records`` of the tree; seconds it took."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "stoker", "build-records", str(folder), "--out",
                    str(records), "--overwrite", "--quiet"], check=True)  # fmt: skip
    return time.perf_counter() - t


def figures(done: list[tuple[str, int, int, int, str]], jobs: list[dict[str, Any]]
            ) -> dict[str, Any]:  # fmt: skip
    nbytes = [d[1] for d in done]
    ws, hs = [d[2] for d in done], [d[3] for d in done]
    px = [w * h for w, h in zip(ws, hs)]
    q = [j["quality"] for j in jobs]
    digest = hashlib.sha256("".join(f"{p} {h}\n" for p, *_, h in sorted(done)).encode())

    def pct(xs: list[int], p: float) -> float:
        return float(np.percentile(xs, p))

    return {
        "images": len(done),
        "bytes_total": sum(nbytes),
        "bytes_mean": statistics.fmean(nbytes),
        "bytes_median": statistics.median(nbytes),
        "bytes_p5_p95": [pct(nbytes, 5), pct(nbytes, 95)],
        "width_mean": statistics.fmean(ws), "height_mean": statistics.fmean(hs),
        "width_median": statistics.median(ws), "height_median": statistics.median(hs),
        "pixels_mean": statistics.fmean(px),
        "bits_per_pixel_mean": statistics.fmean(8 * b / p for b, p in zip(nbytes, px)),
        "quality_mean": statistics.fmean(q),
        "digest": digest.hexdigest(),  # sha256 of each file's path and sha256, sorted
    }  # fmt: skip


def recipe(seed: int, sources: list[Source]) -> dict[str, Any]:
    from PIL import Image, features

    return {
        "seed": seed,
        "aspect_wh_log_uniform": ASPECT,
        "pixels_log_normal": {"median": MEDIAN_PIXELS, "sigma": SIGMA_PIXELS},
        "side_clip": SIDE,
        "crop_area_fraction_uniform": AREA,
        "resize": f"Pillow LANCZOS, reducing_gap={REDUCING_GAP}, no upscaling",
        "quality_uniform_int": QUALITY,
        "jpeg": "Pillow defaults: baseline, 4:2:0, standard Huffman tables",
        "encoder": {"pillow": Image.__version__,
                    "libjpeg_turbo": features.version("libjpeg_turbo")},
        "sources": [asdict(s) | {"path": os.path.relpath(s.path, ROOT)} for s in sources],
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="500 images, in images-quick/")
    ap.add_argument("--no-download", action="store_true",
                    help="only sources already here (exit 3 when there are none)")  # fmt: skip
    ap.add_argument("--images-venv", type=Path, default=IMAGES_VENV)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    n = 500 if a.quick else a.images
    out = a.out or WORK / ("images-quick" if a.quick else "images")
    t0 = time.perf_counter()
    sources = debian_sources(not a.no_download) + pypi_sources(a.images_venv)
    if not sources:
        print("no source photographs here (see --help)", flush=True)
        return NO_SOURCES
    sources = describe(sources)
    print(f"{len(sources)} sources: " + ", ".join(sorted({f"{s.package} {s.version}"
          for s in sources})), flush=True)  # fmt: skip
    jobs = plan(sources, n, a.seed)
    t1 = time.perf_counter()
    done = write_folder(sources, jobs, out / "folder", min(a.procs, 2))
    t_folder = time.perf_counter() - t1
    t_records = build_records(out / "folder", out / "records")
    res = {
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python benchmarks/image_corpus.py", *sys.argv[1:]]),
        "classes": [s.name for s in sources],
        **figures(done, jobs),
        "folder": os.path.relpath(out / "folder", ROOT),
        "records": os.path.relpath(out / "records", ROOT),
        "seconds": {"sources": t1 - t0, "folder": t_folder, "records": t_records,
                    "total": time.perf_counter() - t0},
        "procs": min(a.procs, 2),
        "recipe": recipe(a.seed, sources),
    }  # fmt: skip
    (out / "corpus.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"{res['images']:,} images in {len(sources)} classes, {res['bytes_total'] / 1e6:.0f} MB:"
          f" bytes mean {res['bytes_mean'] / 1e3:.1f} KB, median {res['bytes_median'] / 1e3:.1f}"
          f" KB; size mean {res['width_mean']:.0f}x{res['height_mean']:.0f}, median "
          f"{res['width_median']:.0f}x{res['height_median']:.0f}; quality mean "
          f"{res['quality_mean']:.1f}; folder {t_folder:.0f} s, records {t_records:.0f} s; "
          f"{out / 'corpus.json'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
