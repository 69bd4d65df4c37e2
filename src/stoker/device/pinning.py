"""Page-locking a loader's lent batch slots (``cudaHostRegister``), so that the device
tier's copies read them where the workers wrote them (:mod:`stoker.pinned` keeps the
books of who may reuse them when)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence

import torch

from stoker.errors import StokerError


def register(tensors: Sequence[torch.Tensor], device: torch.device) -> Callable[[], None]:
    """Page-lock the memory under ``tensors`` (``cudaHostRegister``) so that copies to
    ``device`` read it directly; returns the undo (``cudaHostUnregister``). Raises
    :class:`~stoker.errors.StokerError` with CUDA's error code if it refused (nothing
    stays registered then).

    The calls run on a thread of their own: a refused call leaves its error as the
    CUDA runtime's *last error* of the calling thread, where PyTorch's next check
    after a kernel launch would raise it; there it ends with the thread.
    """
    storages = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors]
    done: list[int] = []
    refused: list[int] = []

    def unregister() -> None:
        # a new thread's current device is 0: select ours, or a context is made on GPU 0
        torch.cuda.set_device(device)
        cudart = torch.cuda.cudart()
        failed = [rc for ptr in done if (rc := int(cudart.cudaHostUnregister(ptr))) != 0]
        done.clear()
        if failed:
            warnings.warn(
                f"cudaHostUnregister failed for {len(failed)} batch slots (cudaError "
                f"{failed[0]}); their memory may stay page-locked",
                RuntimeWarning,
                stacklevel=1,
            )

    def pin() -> None:
        torch.cuda.set_device(device)
        cudart = torch.cuda.cudart()
        for ptr, nbytes in storages:
            rc = int(cudart.cudaHostRegister(ptr, nbytes, 0))
            if rc != 0:
                refused.append(rc)
                unregister()
                return
            done.append(ptr)

    _on_own_thread(pin)
    if refused:
        raise StokerError(f"cudaHostRegister refused the batch slots (cudaError {refused[0]})")
    return lambda: _on_own_thread(unregister)


def _on_own_thread(fn: Callable[[], None]) -> None:
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            failure.append(exc)

    th = threading.Thread(target=run, name="stoker-register", daemon=True)
    th.start()
    th.join()
    if failure:
        raise failure[0]
