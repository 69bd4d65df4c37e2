"""One measurement in a fresh process: ``python -m peers.worker --system KEY --mode MODE ...``.

Run by ``benchmarks/tokens_bench.py`` with the system's own interpreter and
``PYTHONPATH=benchmarks``. Writes one JSON object to ``--out``.

Modes
-----
versions    package versions
prepare     write the dataset (``--data``) from the corpus snapshot
throughput  ``--warmup`` batches, then tokens/s over ``--batches``; peak RSS
first       time to the first batch (``--remote``/``--cache`` for a cold read)
resume_ref  an uninterrupted run: state after ``--skip`` batches, hashes of the next ones
resume      load that state (``--state``) and time the first batch; hashes to compare
"""

from __future__ import annotations

import argparse
import importlib
import json
import pickle
import sys
import time
import traceback
from pathlib import Path
from typing import Any

NEXT_HASHES = 3  # batches compared after a resume


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", required=True)
    ap.add_argument("--mode", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--t0", type=float, default=None, help="time.time() when the parent spawned us")
    ap.add_argument("--corpus", default=None, help="Corpus as JSON")
    ap.add_argument("--data", default=None)
    ap.add_argument("--remote", default=None)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--scratch", default=None)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--state", default=None)
    args = ap.parse_args(argv)
    t0 = args.t0 if args.t0 is not None else time.time()
    out: dict[str, Any] = {"system": args.system, "mode": args.mode}
    try:
        t_base = time.time()
        import numpy  # noqa: F401  (common to every system: timed apart)
        import torch
        import torch.utils.data  # noqa: F401

        t_imp = time.time()
        out["base_import_s"] = t_imp - t_base
        out["spawn_to_base_done_s"] = t_imp - t0
        mod = importlib.import_module(f"peers.{args.system}")
        out["import_s"] = time.time() - t_imp
        out["spawn_to_import_done_s"] = time.time() - t0
        out["versions"] = mod.versions()
        pending = mod.available() if hasattr(mod, "available") else None
        if pending:
            out["pending"] = pending
        elif args.mode != "versions":
            out.update(run(mod, args, t0))
        out["ok"] = True
    except BaseException as exc:  # report, never hang the harness
        out["ok"] = False
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-4000:]
    Path(args.out).write_text(json.dumps(out))
    return 0 if out["ok"] else 1


def _ctx(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from peers.common import Corpus, Ctx

    return Ctx(
        data=args.data,
        corpus=Corpus.from_json(args.corpus),
        num_workers=args.num_workers,
        remote=args.remote,
        cache=args.cache,
        scratch=args.scratch,
    )


def run(mod: Any, args: argparse.Namespace, t0: float) -> dict[str, Any]:
    from peers.common import (
        RssSampler,
        batch_hash,
        check_batch,
        dir_bytes,
        maxrss_bytes,
        tree_rss,
    )

    if args.mode == "smoke":  # everything once, in this one process (--quick)

        def sub(mode: str, **kw: Any) -> dict[str, Any]:
            return run(mod, argparse.Namespace(**{**vars(args), "mode": mode, **kw}), time.time())

        res: dict[str, Any] = {}
        for nw in (0, 2):
            res[f"throughput_nw{nw}"] = sub("throughput", num_workers=nw, remote=None, cache=None)
        res["first"] = sub("first", remote=None, cache=None)
        if args.remote is not None:
            res["first_cold"] = sub("first")
        if mod.RESUME in ("state", "skip"):
            res["resume_ref"] = sub("resume_ref", remote=None, cache=None)
            res["resume"] = sub("resume", remote=None, cache=None)
        return res
    if args.mode == "prepare":
        ctx = _ctx(args)
        t = time.perf_counter()
        notes = mod.prepare(ctx.corpus, Path(ctx.data))
        return {
            "write_s": time.perf_counter() - t,
            "notes": notes,
            "bytes": notes.get("bytes", dir_bytes(ctx.data)) if isinstance(notes, dict) else None,
        }
    ctx = _ctx(args)
    if args.mode == "throughput":
        rss_before = tree_rss()
        maxrss_before, _ = maxrss_bytes()
        with RssSampler() as sampler:
            loader = mod.open_loader(ctx)
            it = iter(loader)
            check_batch(next(it))
            for _ in range(args.warmup - 1):
                next(it)
            n = nb = 0
            t = time.perf_counter()
            for b in it:
                n += b.numel()
                nb += 1
                if nb == args.batches:
                    break
            dt = time.perf_counter() - t
        me, kids = maxrss_bytes()
        del it, loader
        return {
            "tokens": n,
            "batches": nb,
            "seconds": dt,
            "tokens_per_s": n / dt,
            "rss_after_import": rss_before,
            "maxrss_after_import": maxrss_before,
            "peak_rss_tree": sampler.peak,
            "maxrss_self": me,
            "maxrss_children": kids,
        }
    if args.mode == "first":
        t = time.perf_counter()
        loader = mod.open_loader(ctx)
        t_open = time.perf_counter() - t
        b = next(iter(loader))
        t_first = time.perf_counter() - t
        check_batch(b)
        return {"open_s": t_open, "first_s": t_first, "from_spawn_s": time.time() - t0}
    if args.mode == "resume_ref":
        loader = mod.open_loader(ctx)
        it = iter(loader)
        for _ in range(args.skip):
            next(it)
        state = loader.state_dict() if mod.RESUME == "state" else {"skip": args.skip}
        hashes = [batch_hash(next(it)) for _ in range(NEXT_HASHES)]
        with open(args.state, "wb") as f:
            pickle.dump(state, f)
        try:
            size = len(json.dumps(state))
        except TypeError:
            size = len(pickle.dumps(state))
        return {"hashes": hashes, "state_bytes": size}
    if args.mode == "resume":
        with open(args.state, "rb") as f:
            state = pickle.load(f)
        t = time.perf_counter()
        loader = mod.open_loader(ctx)
        loader.load_state_dict(state)
        it = iter(loader)
        b = next(it)
        t_first = time.perf_counter() - t
        from_spawn = time.time() - t0
        check_batch(b)
        hashes = [batch_hash(b)] + [batch_hash(next(it)) for _ in range(NEXT_HASHES - 1)]
        return {"first_s": t_first, "from_spawn_s": from_spawn, "hashes": hashes}
    raise SystemExit(f"unknown mode {args.mode}")


if __name__ == "__main__":
    sys.exit(main())
