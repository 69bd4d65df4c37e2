"""``stoker demo``: build a small token dataset and train a tiny model on it.

Everything runs on the CPU with nothing started by hand: the text comes from
the docstrings of Python's own standard library (present wherever Python is),
a small BPE tokenizer is trained on it, ``build-tokens`` writes the dataset,
and ``world`` ranks train a tiny causal transformer with DDP over gloo, fed by
:class:`stoker.TokenLoader`, each rank serving its metrics on
``metrics_port + rank`` (a taken port is a warning and moves to a free one; ``0``: any
free port; ``stoker top`` and ``stoker doctor`` find them in the runtime directory). Then
an exact-resume check: a fresh loader restored from the state saved halfway
must yield the very samples the uninterrupted run saw after that point.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import socket
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

DEMO_TEXT_BYTES = 4 << 20
VOCAB = 4096


_DOCSTRING = re.compile(r'"""(.{80,}?)"""', re.DOTALL)


def train_tokenizer(path: Path, texts: list[str], vocab_size: int) -> Path:
    """Train a byte-level BPE tokenizer (end of document ``<|endoftext|>``) on ``texts``
    and save it at ``path`` (needs ``stoker[build]``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return path


def stdlib_docstrings(limit_bytes: int = DEMO_TEXT_BYTES) -> list[str]:
    """Triple-quoted strings (docstrings, mostly) of the standard library, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs: list[str] = []
    total = 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(p in ("test", "tests", "idlelib", "site-packages", "lib2to3") for p in rel):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for match in _DOCSTRING.finditer(text):
            doc = inspect.cleandoc(match.group(1))
            docs.append(doc)
            total += len(doc)
        if total >= limit_bytes:
            break
    return docs


def prepare(workdir: Path) -> Path:
    """Corpus, tokenizer and dataset under ``workdir``; returns the dataset path."""

    from stoker.cli import main as cli_main

    workdir.mkdir(parents=True, exist_ok=True)
    corpus = workdir / "corpus.jsonl"
    texts = stdlib_docstrings()
    with corpus.open("w", encoding="utf-8") as fh:
        for text in texts:
            fh.write(json.dumps({"text": text}) + "\n")
    tok_path = train_tokenizer(workdir / "tokenizer.json", texts, VOCAB)
    out = workdir / "dataset"
    print(
        f"[demo] corpus: {len(texts):,} docstrings of the Python standard library "
        f"({sum(map(len, texts)) / 1e6:.1f} MB); tokenizer: BPE, {VOCAB} tokens"
    )
    code = cli_main(
        [
            "build-tokens",
            str(corpus),
            "--out",
            str(out),
            "--tokenizer",
            str(tok_path),
            "--overwrite",
            "--workers",
            "2",
            "--block-tokens",
            str(1 << 16),
        ]
    )
    if code:
        raise SystemExit(code)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _batches(loader: Any, dataset: Any) -> Any:
    """Batches across epoch boundaries (in-process iteration advances the epoch)."""
    while True:
        yield from loader


def _rank_main(rank: int, world: int, port: int, cfg: dict[str, Any], results: Any) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from tqdm import tqdm

    from stoker import TokenDataset, TokenLoader

    os.environ["LOCAL_RANK"] = str(rank)  # one machine: the metrics port is per rank
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    torch.manual_seed(0)
    L, B = cfg["seq_len"], cfg["batch_size"]

    def make_loader(metrics: int | None = None) -> tuple[Any, Any]:
        ds = TokenDataset(cfg["dataset"], seq_len=L, batch_size=B, seed=1234)
        return ds, TokenLoader(ds, cfg["num_workers"], metrics_port=metrics)

    ds, loader = make_loader(cfg["metrics_port"])

    model = _TinyLM(ds.manifest.vocab_size, L)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    steps, half = cfg["steps"], cfg["steps"] // 2
    seen: list[list[int]] = []
    state = None
    wait = busy = 0.0
    bar = tqdm(total=steps, desc="[demo] training", disable=rank != 0, dynamic_ncols=True)
    it = _batches(loader, ds)
    loss_value = float("nan")
    t_start = time.perf_counter()
    for step in range(steps):
        if step == half:
            state = loader.state_dict()
        t0 = time.perf_counter()
        batch = next(it)
        t1 = time.perf_counter()
        tokens = batch["tokens"]
        logits = ddp(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_value = float(loss.detach())
        t2 = time.perf_counter()
        wait += t1 - t0
        busy += t2 - t1
        seen.append(batch["sample_id"].tolist())
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.3f}", refresh=False)
    bar.close()
    elapsed = time.perf_counter() - t_start

    # exact resume: a new dataset restored from the halfway state
    ds2, loader2 = make_loader()
    loader2.load_state_dict(state)
    it2 = _batches(loader2, ds2)
    resumed = [next(it2)["sample_id"].tolist() for _ in range(steps - half)]
    mismatches = sum(a != b for a, b in zip(resumed, seen[half:]))
    it.close()  # (the passes' workers and threads stop now, not at the interpreter's exit)
    it2.close()
    stats = torch.tensor(
        [wait, busy, elapsed, float(mismatches), float(steps * B * L)], dtype=torch.float64
    )
    gathered = [torch.zeros_like(stats) for _ in range(world)]
    dist.all_gather(gathered, stats)
    ids = [sid for batch_ids in seen for sid in batch_ids]
    all_ids: list[Any] = [None] * world
    dist.all_gather_object(all_ids, ids)
    if rank == 0:
        results.put(
            {
                "ranks": [g.tolist() for g in gathered],
                "loss": loss_value,
                "state_bytes": len(json.dumps(state)),
                "overlap": len(set(all_ids[0]) & set(all_ids[1])) if world > 1 else 0,
                "per_rank": [len(x) for x in all_ids],
            }
        )  # (a SimpleQueue: written to the pipe before put returns)
    dist.destroy_process_group()
    # Its work done and sent, the rank ends here, as the image demo's do: a rank process
    # sometimes aborted in the interpreter's teardown ("terminate called without an
    # active exception", after destroy_process_group; seen in CI once in four runs of
    # this demo's test), not yet understood.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _TinyLM(vocab: int, seq_len: int) -> Any:
    import torch
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = 64
            self.embed = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.zeros(seq_len, d))
            layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
            self.body = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
            self.head = nn.Linear(d, vocab)
            self.mask: torch.Tensor
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.embed(x) + self.pos[: x.shape[1]]
            h = self.body(h, mask=self.mask[: x.shape[1], : x.shape[1]], is_causal=True)
            return self.head(h)

    return TinyLM()


def run_demo(
    steps: int = 60,
    world: int = 2,
    seq_len: int = 128,
    batch_size: int = 8,
    workdir: str | None = None,
    num_workers: int = 0,
    metrics_port: int | None = 9400,
) -> int:
    import torch.multiprocessing as tmp

    with tempfile.TemporaryDirectory(prefix="stoker-demo-") as tmpdir:
        base = Path(workdir) if workdir else Path(tmpdir)
        dataset = prepare(base)
        cfg: dict[str, Any] = {
            "dataset": str(dataset),
            "seq_len": seq_len,
            "batch_size": batch_size,
            "steps": max(2, steps),
            "num_workers": num_workers,
            "metrics_port": metrics_port,
        }
        ctx = tmp.get_context("spawn")
        results = ctx.SimpleQueue()
        port = _free_port()
        print(
            f"[demo] training a tiny transformer on {world} CPU ranks (gloo), "
            f"{cfg['steps']} steps of {batch_size} x {seq_len + 1} tokens per rank"
        )
        if metrics_port is not None:
            where = (
                "a free port each"
                if metrics_port == 0
                else ", ".join(f"127.0.0.1:{metrics_port + r}" for r in range(world))
            )
            print(
                f"[demo] rank metrics on {where} (a taken port moves to a free one); "
                "`stoker top` and `stoker doctor` find them without --endpoint"
            )
        procs = [
            ctx.Process(target=_rank_main, args=(r, world, port, cfg, results))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode != 0 for p in procs):
            print(
                f"[demo] a rank failed (exit codes {[p.exitcode for p in procs]})", file=sys.stderr
            )
            return 1
        res = results.get()
    ranks = res["ranks"]
    wait = sum(r[0] for r in ranks)
    busy = sum(r[1] for r in ranks)
    elapsed = max(r[2] for r in ranks)
    tokens = sum(r[4] for r in ranks)
    mismatches = int(sum(r[3] for r in ranks))
    print(
        f"[demo] throughput: {tokens / elapsed:,.0f} tokens/s over {world} ranks "
        f"(final loss {res['loss']:.3f})"
    )
    print(f"[demo] data wait: {100 * wait / (wait + busy):.1f}% of step time")
    print(
        f"[demo] samples per rank: {res['per_rank']}; samples seen by two ranks: {res['overlap']}"
    )
    verdict = "OK" if mismatches == 0 else f"FAILED ({mismatches} batches differ)"
    print(
        f"[demo] exact resume (state of {res['state_bytes']} bytes saved at step "
        f"{cfg['steps'] // 2}, restored into a new dataset): {verdict}"
    )
    return 0 if mismatches == 0 and res["overlap"] == 0 else 1
