"""What every adapter shares: the corpus handle, the run context, hashing, RSS."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

SEQ_LEN = 2048
WINDOW = SEQ_LEN + 1
BATCH = 8
SEED = 0


@dataclass(frozen=True)
class Corpus:
    """A snapshot of the token stream: raw little-endian uint16, EOS after each document."""

    dir: str  # holds tokens.u16 and doc_lens.npy
    num_tokens: int
    num_docs: int
    vocab_size: int
    eos_id: int

    @property
    def tokens_path(self) -> Path:
        return Path(self.dir) / "tokens.u16"

    @property
    def num_samples(self) -> int:
        """Windows of WINDOW tokens at stride SEQ_LEN (stoker's and the floor's definition)."""
        return (self.num_tokens - 1) // SEQ_LEN

    def tokens(self) -> np.ndarray:
        return np.memmap(self.tokens_path, dtype="<u2", mode="r", shape=(self.num_tokens,))

    def doc_lens(self) -> np.ndarray:
        return np.load(Path(self.dir) / "doc_lens.npy")

    def documents(self):  # type: ignore[no-untyped-def]
        """Documents as uint16 arrays (EOS included), in corpus order."""
        toks = self.tokens()
        start = 0
        for n in self.doc_lens().tolist():
            yield np.asarray(toks[start : start + n])
            start += n

    def windows(self, stride: int = SEQ_LEN, size: int = WINDOW):  # type: ignore[no-untyped-def]
        """Consecutive windows ``tokens[i*stride : i*stride+size]`` as uint16 arrays."""
        toks = self.tokens()
        n = (self.num_tokens - size) // stride + 1
        for i in range(n):
            yield np.asarray(toks[i * stride : i * stride + size])

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Corpus:
        return cls(**json.loads(text))


@dataclass
class Ctx:
    """Where and how one measurement reads."""

    data: str  # the system's dataset directory on local disk
    corpus: Corpus
    num_workers: int = 0
    seed: int = SEED
    remote: str | None = None  # http:// URL of the same dataset (cold runs)
    cache: str | None = None  # an empty local cache directory (cold runs)
    scratch: str | None = None  # a private scratch directory for this process


def batch_hash(batch: Any) -> str:
    arr = batch.numpy() if hasattr(batch, "numpy") else np.asarray(batch)
    return hashlib.blake2b(np.ascontiguousarray(arr).tobytes(), digest_size=8).hexdigest()


def check_batch(batch: Any) -> None:
    import torch

    if not isinstance(batch, torch.Tensor):
        raise TypeError(f"batch is {type(batch).__name__}, not a torch.Tensor")
    if tuple(batch.shape) != (BATCH, WINDOW) or batch.dtype != torch.int64:
        raise ValueError(f"batch has shape {tuple(batch.shape)} dtype {batch.dtype}")


def dir_bytes(path: str | Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def maxrss_bytes() -> tuple[int, int]:
    """The peak RSS of this process (VmHWM: its own memory's high-water mark, not
    ru_maxrss, which Linux carries over from the process that forked and exec'd it, so
    a large parent shows in every child) and ru_maxrss of its largest reaped child
    (bytes)."""
    me = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                me = int(line.split()[1]) * 1024
    if not me:  # no /proc: ru_maxrss, with the caveat above
        me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return me, kids


def _rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def tree_rss(pid: int | None = None) -> int:
    """Current RSS of ``pid`` and all its descendants, summed (bytes)."""
    pid = os.getpid() if pid is None else pid
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _rss_of(p)
        todo += _children(p)
    return total


class RssSampler:
    """Samples :func:`tree_rss` every ``interval`` seconds on a daemon thread."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak = tree_rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, tree_rss())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss())
