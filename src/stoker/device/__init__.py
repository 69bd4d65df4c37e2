"""The device tier: :class:`DevicePrefetcher` puts batches on the GPU before training asks.

::

    loader (CPU batches) -- prefetch thread --> pinned staging buffer (PinnedPool)
        -- side CUDA stream --> GPU, narrow dtype -- widened on the side stream --> ready event
    training: next() --> its stream waits on the event --> the batch, already on the GPU

    TokenLoader(device=..., num_workers>0): worker --> page-locked shared-memory slot,
        tokens already narrow -- side CUDA stream --> GPU (no staging memcpy)
        -- the slot goes back to its worker once the copy's event completed

A thread, not a side stream driven from the training thread: pulling a batch
from the loader and copying it into a pinned buffer are host work (a memcpy,
for ``num_workers=0`` the whole decode), and on the training thread they would
sit between two steps however early the copy was issued. On the thread they
overlap the step; the training thread only makes its stream wait on an event
(a GPU-side wait, no host sync). CUDA streams and events may be used from any
thread.

Host memory (:mod:`stoker.pinned`): a batch from any loader is copied into
buffers of a :class:`~stoker.pinned.PinnedPool`, and a buffer returns to the
pool only once the event recorded after its copy has completed. A
:class:`~stoker.TokenLoader` that feeds its own device tier instead *lends*
its shared-memory batch slots (:class:`~stoker.pinned.Lent` batches): the
slots hold tokens in the transfer dtype and are page-locked, so the copies
read them where the worker wrote them, and each :class:`~stoker.pinned.Loan`
is settled with its copy's event; the loader gives the slot back to its
worker once that event completed. A lent batch is staged like any other when
its slots could not be page-locked or a tensor is not in its transfer dtype.
Device tensors are made on the side stream and ``record_stream``-ed onto the
consumer's stream when handed out, so the caching allocator never reuses
them under a running step.

Narrow payloads: a key can cross the bus in a narrower dtype than the loader
gives (``tokens`` as uint16 when the dataset's vocabulary fits) and is widened
on the GPU to what training receives (``widen``, by default the loader's
dtype). uint8 images cross as uint8 and become float32 there with
``widen={"image": torch.float32}``.

Exact resume: right after pulling batch ``k`` the thread snapshots the
loader's state (before pulling ``k + 1``) and keeps it with batch ``k``;
:meth:`DevicePrefetcher.state_dict` returns the snapshot of the last batch
handed to training, so batches read ahead never count as consumed.
``TokenLoader.state_dict()`` costs about 15 us, once per batch. Fed by a
coordinator its state is a Checkpoint call, so there the snapshot is only
``(epoch, batches)`` and the call (``state_at``) is made when a state is
asked for.

Without CUDA (or with ``device="cpu"``) batches pass through as the loader
gives them (``widen`` applied), still read ahead by the thread, so the
ordering, resume and shutdown logic is the same code on a CPU machine.
``stage=True`` runs the copy path there with host copies (``TokenLoader``'s
``device=`` always does): lent slots, their loans and the staging pool are
then the same code as on a GPU, less the page-locking.

The package, one job a module: :mod:`~stoker.device.contract` (what the tier reads
from a loader: :class:`Prefetchable`, the state after each batch),
:mod:`~stoker.device.placement` (:func:`resolve_device`, :func:`narrow_dtype`),
:mod:`~stoker.device.backends` (a CUDA side stream, or host copies),
:mod:`~stoker.device.staging` (moving one batch: a lent slot, pinned staging buffers,
widening), :mod:`~stoker.device.pinning` (page-locking lent slots) and
:mod:`~stoker.device.prefetcher` (the prefetch thread and :class:`DevicePrefetcher`).
"""

# the names stoker.device had as one module (the private ones for the tests)
from stoker.device.backends import _Cuda as _Cuda
from stoker.device.backends import _Done as _Done
from stoker.device.backends import _Host as _Host
from stoker.device.contract import Batch as Batch
from stoker.device.contract import Prefetchable as Prefetchable
from stoker.device.contract import Snapshot as Snapshot
from stoker.device.contract import _snapshotter as _snapshotter
from stoker.device.placement import STRICT_ENV as STRICT_ENV
from stoker.device.placement import _strict_from_env as _strict_from_env
from stoker.device.placement import narrow_dtype as narrow_dtype
from stoker.device.placement import resolve_device as resolve_device
from stoker.device.prefetcher import JOIN_TIMEOUT as JOIN_TIMEOUT
from stoker.device.prefetcher import DevicePrefetcher as DevicePrefetcher
from stoker.device.prefetcher import _Run as _Run
from stoker.device.staging import Mover as Mover
from stoker.device.staging import _loan as _loan
from stoker.device.staging import _Pass as _Pass
from stoker.device.staging import _Stager as _Stager
