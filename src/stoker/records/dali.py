"""Decoding by NVIDIA DALI: a records dataset's stored bytes, read by stoker's own reader
(its plan, state, leases and metrics), decoded and cropped by a DALI pipeline fed
through its external source, on the GPU (``device="mixed"``: nvJPEG) or on the CPU.

::

    worker processes (stoker's reader): the bytes of each sample, its crop box (from
        its header and the augmentation's draws: a pure function of seed, epoch and
        sample id) and its flip -- shared-memory slots -->
    the loader's process: DALI external source -> decoders.image_slice (only the box
        is decoded) -> resize to image_size x image_size -> flip -> CHW uint8 (on the GPU)

A sample gets the same box and flip as with stoker's own decoder; the pixels differ
only by the decoder's and the resize's rounding. A batch the pipeline fails on (an
image DALI does not decode) is decoded on the CPU by stoker's decoder, which names
the image at fault (or skips it, with ``on_error="skip"``); so is a JPEG cut short
(without its end marker: DALI would hand it over half grey). Each call to the
pipeline is one batch fed and run to its end before the next: the loader's state
after a batch is the state as of that batch, so resume is exact.
"""

from __future__ import annotations

import importlib
import os
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from stoker.observe.registry import registry

Batch = dict[str, Any]
#: The fields a reader hands over for DALI to decode (with ``label``, ``skipped``).
RAW = ("data", "length", "box", "flip")
DEVICES = ("gpu", "cpu")

#: The pipelines built in this process; in a process forked from it (a loader worker),
#: kept there for good: a pipeline collected in the child (its destructor joining
#: threads the fork did not copy) killed the worker with SIGSEGV.
_built: weakref.WeakSet[Any] = weakref.WeakSet()
_kept_in_child: list[Any] = []
_hooked = False  # (installed by the first build, not by importing stoker)


def _keep_in_child() -> None:
    _kept_in_child.extend(_built)


def unavailable(device: str) -> str | None:
    """Why DALI cannot decode on ``device`` here (None: it can)."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return "NVIDIA DALI is not installed (pip install nvidia-dali-cuda120)"
    if device == "gpu" and not torch.cuda.is_available():
        return "no CUDA device is available"
    return None


def _cut_jpeg(data: np.ndarray) -> bool:
    """A JPEG without its end-of-image marker (cut short)."""
    n = len(data)
    return (
        n >= 4
        and data[0] == 0xFF
        and data[1] == 0xD8
        and not (data[n - 2] == 0xFF and data[n - 1] == 0xD9)
    )


class DaliDecode:
    """Decodes batches of stored bytes (:data:`RAW` fields) into ``image`` batches.

    ``rescue(data, box, flip, sample_id)`` decodes one image on the CPU the same way (it
    raises :class:`~stoker.errors.ImageError` naming the image, or returns None when
    the sample is to be skipped). The pipeline is built on first use, in the process
    and on the thread that iterates (DALI's threads are its own, ``threads`` of them).
    """

    def __init__(
        self,
        image_size: int,
        batch_size: int,
        device: str,
        rescue: Callable[[bytes, tuple[int, int, int, int], bool, int], np.ndarray | None],
        threads: int = 2,
        device_id: int | None = None,
    ) -> None:
        if device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
        self.size, self.batch_size, self.device = image_size, batch_size, device
        self.rescue, self.threads, self.device_id = rescue, threads, device_id
        self._pipe: Any = None
        self._warned = False
        self.rescued = 0  # batches DALI failed on, decoded on the CPU instead (tests)

    def _build(self) -> Any:
        dali: Any = importlib.import_module("nvidia.dali")  # (untyped for mypy: a plugin)
        fn, types, pipeline_def = dali.fn, dali.types, dali.pipeline_def

        gpu = self.device == "gpu"
        size = self.size

        @pipeline_def(  # type: ignore[untyped-decorator]
            batch_size=self.batch_size,
            num_threads=self.threads,
            device_id=self._device_index() if gpu else None,
            exec_async=False,
            exec_pipelined=False,
            prefetch_queue_depth=1,
        )
        def pipe() -> Any:
            data = fn.external_source(name="data", dtype=types.UINT8, ndim=1)
            anchor = fn.external_source(name="anchor", dtype=types.FLOAT, ndim=1)
            shape = fn.external_source(name="shape", dtype=types.FLOAT, ndim=1)
            flip = fn.external_source(name="flip", dtype=types.INT32, ndim=0)
            img = fn.decoders.image_slice(
                data,
                anchor,
                shape,
                device="mixed" if gpu else "cpu",
                output_type=types.RGB,
                adjust_orientation=False,  # (as stoker's decoder: EXIF orientation ignored)
                normalized_anchor=False,
                normalized_shape=False,
                axis_names="WH",
            )
            img = fn.resize(img, resize_x=size, resize_y=size, antialias=True)
            img = fn.flip(img, horizontal=flip)
            return fn.transpose(img, perm=[2, 0, 1])

        global _hooked
        if not _hooked:
            os.register_at_fork(after_in_child=_keep_in_child)
            _hooked = True
        p = pipe()
        p.build()
        _built.add(p)
        return p

    def __call__(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """Each batch of ``batches`` decoded (a generator: closing it closes theirs)."""
        try:
            for batch in batches:
                yield self.decode(batch)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def decode(self, batch: Batch) -> Batch:
        """``batch`` with ``image`` (uint8, ``(n, 3, size, size)``; on the GPU for
        ``device="gpu"``) in place of its :data:`RAW` fields."""
        data, length = batch["data"].numpy(), batch["length"].numpy()
        box, flip = batch["box"].numpy(), batch["flip"].numpy()
        n, s = len(length), self.size
        skipped = batch["skipped"].numpy().copy() if "skipped" in batch else np.zeros(n, bool)
        rows = [i for i in range(n) if not skipped[i]]
        cpu = [i for i in rows if _cut_jpeg(data[i, : length[i]])]
        dali = sorted(set(rows) - set(cpu))
        dev = torch.device("cuda", self._device_index()) if self.device == "gpu" else None
        image = torch.zeros((n, 3, s, s), dtype=torch.uint8, device=dev)
        if dali:
            try:
                image[dali] = self._run(data, length, box, flip, dali, dev)
                registry().image_event("decoded", len(dali))
            except RuntimeError as exc:  # an image DALI does not decode: the CPU's names it
                self._pipe = None  # (a pipeline that failed is not run again)
                self.rescued += 1
                cpu = rows
                if not self._warned:
                    self._warned = True
                    first = str(exc).strip().splitlines()[-1][:300]
                    warnings.warn(
                        f"DALI failed on a batch ({first}); decoding it on the CPU (further "
                        "failures are not warned about)",
                        RuntimeWarning,
                        stacklevel=2,
                    )
        # (copies: the rest of the batch's fields must not hold its raw slot, bytes a row)
        out: Batch = {k: v.clone() for k, v in batch.items() if k not in RAW}
        ids = out["sample_id"].numpy()
        for i in cpu:  # (a row not decoded above is still zeros)
            got = self.rescue(
                data[i, : length[i]].tobytes(), tuple(box[i].tolist()), bool(flip[i]), int(ids[i])
            )
            if got is not None:
                image[i] = torch.from_numpy(got)
                continue
            skipped[i] = True  # (counted by rescue)
            if "label" in out:
                out["label"][i] = -100
        out["image"] = image
        if "skipped" in batch:
            out["skipped"] = torch.from_numpy(skipped)
        return out

    def _device_index(self) -> int:
        return torch.cuda.current_device() if self.device_id is None else self.device_id

    def _run(
        self,
        data: np.ndarray,
        length: np.ndarray,
        box: np.ndarray,
        flip: np.ndarray,
        rows: list[int],
        dev: torch.device | None,
    ) -> torch.Tensor:
        if self._pipe is None:
            self._pipe = self._build()
        p = self._pipe
        p.feed_input("data", [data[i, : length[i]] for i in rows])
        p.feed_input("anchor", [box[i, :2].astype(np.float32) for i in rows])
        p.feed_input("shape", [box[i, 2:].astype(np.float32) for i in rows])
        p.feed_input("flip", [np.array(int(flip[i]), np.int32) for i in rows])
        (out,) = p.run()
        if dev is None:
            return torch.from_numpy(np.array(out.as_array()))
        feed_ndarray = importlib.import_module("nvidia.dali.plugin.pytorch").feed_ndarray

        t = torch.empty((len(rows), 3, self.size, self.size), dtype=torch.uint8, device=dev)
        feed_ndarray(out.as_tensor(), t, cuda_stream=torch.cuda.current_stream(dev))
        return t
