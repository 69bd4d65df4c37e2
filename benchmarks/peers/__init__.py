"""Adapters for the token-loading benchmark (``benchmarks/tokens_bench.py``).

One module per system. Each runs inside that system's own interpreter (``.venv``
for stoker and the memmap floor, ``.venv-peers`` for the peers) and exposes:

``KEY``, ``LABEL``, ``VENV`` (``"main"`` or ``"peers"``)
``versions() -> dict``
    versions of the packages that matter (imports the system).
``prepare(corpus: Corpus, out: Path) -> dict``
    write the corpus in the system's format under ``out``; return notes.
``HTTP``
    ``True`` when the system reads from an ``http://`` origin, else a string
    saying why not.
``COLD_LOCAL`` (optional)
    ``True`` when the system can fill an empty cache from a local directory used as
    its remote (the "cold, local copy" column).
``available() -> str | None`` (optional)
    a reason the system cannot be measured yet (e.g. an API still pending).
``RESUME``
    how resuming works (``"state"``: a state dict, ``"skip"``: skip ahead by
    iterating, or a string saying it is not supported).
``open_loader(ctx: Ctx) -> Loader``
    a loader over the dataset with shuffle on; iterating it yields int64
    tensors of shape (8, 2049). ``Loader.state_dict()`` /
    ``Loader.load_state_dict(state)`` exist where ``RESUME == "state"``.

Only :mod:`peers.common` is shared; it needs numpy and torch only.

The image adapters of ``benchmarks/images_bench.py`` (``images_*.py``, run in ``.venv-peers``
by :mod:`peers.images_worker`, sharing :mod:`peers.images_common`) expose:

``KEY``, ``LABEL``, ``versions() -> dict``
    as above.
``prepare(folder: Path, out: Path) -> dict``
    write the ImageFolder tree ``folder`` in the system's format under ``out`` (the JPEG
    bytes as they are); return notes, ``layout`` among them. ``None`` for a system that
    reads the tree itself.
``open_loader(data: str, num_workers: int)``
    a shuffled loader over ``data`` (``out``, or the tree); iterating it yields
    ``(images, labels)``: uint8 tensors (64, 3, 224, 224) RandomResizedCrop(224)-ed and
    flipped, and their labels.
"""

SYSTEMS = (
    "memmap_floor",
    "stoker_dl",
    "stoker_loader",
    "mosaic_streaming",
    "litdata_peer",
    "webdataset_peer",
)
