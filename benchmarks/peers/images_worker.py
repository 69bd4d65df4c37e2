"""One image measurement in a fresh process: ``python -m peers.images_worker --system KEY ...``.

Run by ``benchmarks/images_bench.py`` with ``.venv-peers``'s interpreter and
``PYTHONPATH=benchmarks``; writes one JSON object to ``--out``. ``--cfg`` is a JSON
object with ``folder`` (the ImageFolder tree), ``data`` (the system's dataset
directory), ``num_workers`` and ``images``.

Modes
-----
versions  package versions
prepare   write the dataset under ``data`` from the tree once: reused when its marker
          (``written.json``, written last) is there, rewritten from scratch when not
read      images/s over a read of ``images`` images, as images_bench.py's stoker child
          times it: ``first_batch_s`` from before the dataset is made to the first
          batch, ``images_s`` from just before iterating (the loader made) to the
          last image
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

MARKER = "written.json"


def _bytes_under(path: Path) -> int:
    return sum(
        os.path.getsize(os.path.join(r, f))
        for r, _d, fs in os.walk(path)
        for f in fs
        if f != MARKER and not os.path.islink(os.path.join(r, f))
    )


def prepare(mod: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    if mod.prepare is None:  # reads the ImageFolder tree itself
        return {"reads": "the ImageFolder tree"}
    out = Path(cfg["data"])
    marker = out / MARKER
    if marker.exists():
        return {**json.loads(marker.read_text()), "reused": True}
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    notes = mod.prepare(Path(cfg["folder"]), out)
    res = {"write_s": time.perf_counter() - t, "bytes": _bytes_under(out), "notes": notes}
    marker.write_text(json.dumps(res))  # last: a dataset without it is rewritten
    return {**res, "reused": False}


def read(mod: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    from peers.clock import PassClock
    from peers.images_common import check_batch

    data = cfg["folder"] if mod.prepare is None else cfg["data"]
    clock = PassClock()
    loader = mod.open_loader(data, cfg["num_workers"])
    clock.begin()
    while clock.n < cfg["images"]:
        for images, labels in loader:
            clock.batch(len(labels))
            if clock.n == clock.n_first:  # the first batch
                check_batch(images, labels)
            if clock.n >= cfg["images"]:
                break
    return clock.result()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", required=True)
    ap.add_argument("--mode", required=True, choices=("versions", "prepare", "read"))
    ap.add_argument("--cfg", default="{}")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"system": args.system, "mode": args.mode}
    try:
        mod = importlib.import_module(f"peers.{args.system}")
        cfg = json.loads(args.cfg)
        if args.mode == "versions":
            out["versions"] = mod.versions()
        elif args.mode == "prepare":
            out.update(prepare(mod, cfg))
        else:
            out.update(read(mod, cfg))
        out["ok"] = True
    except BaseException as exc:  # report, never hang the harness
        out["ok"] = False
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-4000:]
    Path(args.out).write_text(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
