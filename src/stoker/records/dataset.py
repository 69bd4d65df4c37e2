"""``RecordDataset``: a torch IterableDataset of a records dataset's images, decoded and
augmented, with their labels."""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from stoker import plan
from stoker.cache.config import AgentConfig
from stoker.cache.disk import DiskCache
from stoker.errors import ConfigError, ImageError
from stoker.formats.records import RecordSource
from stoker.loader.arena import decoding_threads
from stoker.loader.batch import Field, Layout
from stoker.loader.planned import PlannedDataset
from stoker.observe.registry import registry
from stoker.records import augment
from stoker.records.held import HELD, HOLDS, View
from stoker.records.image import (
    DECODERS,
    MAX_PIXELS,
    _cv2,
    decode_region,
    image_size,
    open_image,
    prepare,
    region,
    rgb,
)
from stoker.records.reader import RecordReader
from stoker.storage import RetryPolicy

if TYPE_CHECKING:
    from stoker.cache.client import AgentClient
    from stoker.preprocess.client import Pool, RemoteReader
    from stoker.records.dali import DaliDecode

Batch = dict[str, Any]

AUGMENTS = ("train", "eval", "resize")
#: Rows planned ahead at least (the reader fetches blocks a few ahead of their use).
_HORIZON = 512

#: A user's transform: ``(image, rng) -> image``, the decoded image (Pillow, RGB) and a
#: generator seeded from (seed, epoch, sample id); or ``(image) -> image`` (a torchvision
#: transform, v1 or v2, or any ``torch.nn.Module``), drawing from torch's generator,
#: seeded the same way for the call. It returns an array or tensor of shape ``(3, size,
#: size)`` or ``(size, size, 3)`` of uint8 (or a Pillow image of that size).
Transform = Callable[..., Any]
#: (torch's global generator, seeded for one sample's transform at a time in a process)
_TORCH_RNG = threading.Lock()


class RecordDataset(PlannedDataset):
    """The images of a records dataset at ``url`` (see :func:`stoker.write_records`), as
    uint8 tensors of shape ``(3, image_size, image_size)`` (``image``), with their
    ``label`` (int64) and ``sample_id`` (the row).

    ``augment``: ``"train"`` (the default: RandomResizedCrop to ``image_size``, scale
    0.08-1, aspect 3/4-4/3, and a horizontal flip for half of them), ``"eval"`` (the
    short side resized to ``image_size / 0.875``, then the centre crop) or ``"resize"``
    (the whole image resized to ``image_size`` square). Every random choice is a pure
    function of ``(seed, epoch, sample id)``: the same sample gets the same crop in an
    epoch whatever the ranks, workers and restarts. ``transform(image, rng)`` replaces
    the built-in augmentation (``rng``: a numpy Generator seeded the same way); so does
    a transform of one argument, a torchvision one (``transforms.v2.Compose([...])``) or
    any ``torch.nn.Module``: it is called with torch's generator seeded from the same
    key (and restored after), one such call at a time in a process, so its random
    choices are the sample's too.
    Normalisation belongs on the GPU: uint8 crosses the bus.

    ``decoder``: ``"auto"`` (OpenCV for RGB and grayscale JPEGs when it is installed, as
    ``stoker[records]`` has it: about 2.4 times Pillow's rate; Pillow for the rest),
    ``"opencv"`` or ``"pillow"`` (see :func:`stoker.records.image.decode_region`).

    ``decode=False`` hands out each image's stored bytes instead, undecoded (for a
    decoder of one's own, a GPU's for one, or for samples of varying size such as
    audio): ``data`` (uint8, ``max_bytes`` a row, the bytes first, zeros after) and
    ``length`` (int64: how many of them are the sample's); fixed-size rows, so they
    still cross from worker processes in shared memory. A sample longer than
    ``max_bytes`` is an :class:`~stoker.errors.ImageError` naming it.

    Through the node agent (``cache=stoker.AgentConfig(directory, ...)``, or
    ``cache_dir``, or an ``agent``, as for :class:`~stoker.TokenDataset`) every local
    process reads what one agent holds in shared memory: ``hold="blocks"`` (the default)
    its stored blocks, fetched once per node; ``hold="images"`` its images decoded, once
    per node and kept across epochs while the memory tier has room (the random part of
    the augmentation is then done on the held pixels, each process cropping in place).
    ``short_side`` resizes each image's short side to that many pixels before anything
    else (256 for ImageNet's recipe: a quarter of the memory a full-size photograph
    takes, held). With ``hold="images"`` or a ``short_side``, the samples are the same
    with or without an agent, and whether the agent had room or not: a process without
    the agent's pixels decodes and resizes the same way itself.

    ``on_error="skip"``: a sample whose image does not decode (or whose label is
    missing) does not stop the run: its row of the batch is zeros, its ``label`` -100
    (what ``torch.nn.functional.cross_entropy`` ignores by default) and the batch's
    ``skipped`` field says which rows those are; it is counted
    (``stoker_images_skipped``, ``loader.stats()["images"]``) and the first is named in a
    warning. Every rank still gets the same number of batches of the same size. The
    default raises the error, naming the row, block and file.

    ``decode="dali"``: decoded by NVIDIA DALI in the loader's process, on the GPU
    (``dali_device="gpu"``, the default: nvJPEG; the batch's ``image`` is then on the
    GPU) or on the CPU (``dali_device="cpu"``), fed the stored bytes by this dataset's
    reader, so the plan, the state, the node agent, leases and metrics are stoker's
    (:mod:`stoker.records.dali`). The crop and flip are the same as stoker's decoder
    gives (the pixels differ by rounding); there is no ``transform``. Without DALI, or
    without a GPU for ``dali_device="gpu"``, the images are decoded on the CPU as with
    ``decode=True``, after one warning. ``stoker.TokenLoader`` runs the DALI stage
    itself; a torch ``DataLoader``'s batches go through :meth:`finish_batches`.

    ``image_column`` (default: ``image``, else the only binary column) holds the
    encoded bytes (JPEG, PNG, WebP, anything Pillow reads); ``label_column`` (default:
    ``label`` when there is one; ``False``: none) an integer per row.

    ``preprocess="grpc://HOST:PORT[,HOST:PORT...]"``: the rows are made (read, decoded,
    augmented) by preprocessing workers (``stoker preprocess-worker``) instead of this
    process, the same rows bit for bit (:mod:`stoker.preprocess`); the plan, leases and
    confirms stay this process's, so each batch still reaches training exactly once. A
    worker's token: ``preprocess_token``, else ``$STOKER_PREPROCESS_TOKEN``, else the one a
    loopback worker of this user keeps in the runtime directory. With no worker
    answering, the rows are made here, after one warning. ``preprocess_local=True``:
    this process makes rows too, as one more worker of the pool (asked as often as its
    pace allows; ``"local"`` in the reader's ``made_by``). The transform must then be
    importable by name (a module's top-level function): the workers import it.

    The plan, the state, the DataLoader protocol, ``stoker.TokenLoader`` and the
    coordinator are a token dataset's (:class:`~stoker.loader.planned.PlannedDataset`):
    ``shard_size`` (default: the rows of a block) consecutive rows are a unit of the
    shuffle.
    """

    def __init__(
        self,
        url: str,
        *,
        image_size: int = 224,
        augment: str = "train",
        transform: Transform | None = None,
        image_column: str | None = None,
        label_column: str | bool | None = None,
        batch_size: int = 1,
        seed: int = 0,
        shuffle: bool | plan.ShuffleConfig = True,
        shard_size: int | None = None,
        window_shards: int = 16,
        drop_remainder: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        storage_options: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        max_pixels: int = MAX_PIXELS,
        decode: bool | str = True,
        max_bytes: int = 1 << 20,
        dali_device: str = "gpu",
        decoder: str = "auto",
        cache: AgentConfig | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        agent: AgentClient | bool | None = None,
        hold: str = "blocks",
        short_side: int | None = None,
        on_error: str = "raise",
        preprocess: str | Sequence[str] | None = None,
        preprocess_token: str | None = None,
        preprocess_local: bool = False,
    ) -> None:
        super().__init__()
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.on_error = on_error
        self._warned_skip = False
        if image_size < 1:
            raise ConfigError(f"image_size must be >= 1, got {image_size}")
        if augment not in AUGMENTS:
            raise ConfigError(f"augment must be one of {list(AUGMENTS)}, got {augment!r}")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if hold not in HOLDS:
            raise ConfigError(f"hold must be one of {list(HOLDS)}, got {hold!r}")
        if short_side is not None and short_side < 1:
            raise ConfigError(f"short_side must be >= 1 (or None), got {short_side}")
        if decode not in (True, False, "dali"):
            raise ConfigError(f"decode must be True, False or 'dali', got {decode!r}")
        if decode is not True and (hold == "images" or short_side is not None):
            raise ConfigError(
                f"decode={decode!r} decodes from the stored bytes: it takes neither "
                "hold='images' nor short_side"
            )
        if decode == "dali":
            decode = self._dali(dali_device, transform)
        self.agent: AgentClient | None = _agent(cache, cache_dir, agent)
        disk = (
            DiskCache(cache_dir, AgentConfig.cache_limit) if agent is False and cache_dir else None
        )
        self.source = RecordSource(url, storage_options, retry=retry, cache=disk)
        m = self.source.manifest
        self.image_column = self._image_column(image_column)
        self.label_column = self._label_column(label_column)
        self.image_size, self.augment, self.transform = image_size, augment, transform
        #: the transform takes the image alone and draws from torch's generator
        self._torch_transform = transform is not None and _takes_image_only(transform)
        self.max_pixels = max_pixels
        if decoder not in DECODERS:
            raise ConfigError(f"decoder must be one of {list(DECODERS)}, got {decoder!r}")
        self.decoder = decoder
        if decoder != "pillow" and decode is True:
            # imported here, on the thread that makes the dataset, before any worker is
            # forked from this process: each worker forked for a pass imported it again
            # (0.1 s before its first batch on a 2-core machine); its threads are set
            # where it decodes (:func:`~stoker.records.image._cv2`), not here
            with contextlib.suppress(ImportError):
                importlib.import_module("cv2")
        if max_bytes < 1:
            raise ConfigError(f"max_bytes must be >= 1, got {max_bytes}")
        self.decode, self.max_bytes = decode, max_bytes
        self.dali_device = dali_device
        self._dali_decode: DaliDecode | None = None
        self.hold, self.short_side = hold, short_side
        #: the image decoded whole (and resized) first, then augmented from its pixels
        self.prepared = hold == "images" or short_side is not None
        self.num_samples = m.num_rows
        self.batch_size = batch_size
        rows = self.source.index["rows"]
        unit = max(1, int(np.median(rows))) if len(rows) else 1
        config = plan.shuffle_config(shuffle, seed, shard_size, window_shards)
        # (a unit of the spread order: ``block_tokens // seq_len`` rows, a block's)
        self.shuffle_config = config.resolve(1, unit)
        self.seed = self.shuffle_config.seed
        self.drop_remainder = drop_remainder
        self.rank, self.world_size = rank, world_size
        self.name = self.source.url
        self.preprocess: Pool | None = None
        self.preprocess_token = preprocess_token
        self.preprocess_local = preprocess_local
        if preprocess:
            from stoker.preprocess.client import parse_pool
            from stoker.preprocess.spec import WorkSpec

            self.preprocess = parse_pool(preprocess)
            self._work = WorkSpec.of(self)  # (checked now: a transform a worker can import)
        self._init_epochs()

    def _dali(self, device: str, transform: Transform | None) -> bool | str:
        """``decode="dali"`` as it will be here: "dali", or True (stoker's CPU decode, with
        one warning) where DALI or the GPU asked for is missing."""
        from stoker.records.dali import DEVICES, unavailable

        if device not in DEVICES:
            raise ConfigError(f"dali_device must be one of {list(DEVICES)}, got {device!r}")
        if transform is not None:
            raise ConfigError("decode='dali' crops and flips in DALI: it takes no transform")
        why = unavailable(device)
        if why is None:
            return "dali"
        warnings.warn(
            f"decode='dali': {why}; decoding on the CPU (stoker's decoder) instead",
            RuntimeWarning,
            stacklevel=3,
        )
        return True

    def finish_batches(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """``batches`` as training receives them: with ``decode="dali"``, their images
        decoded by DALI in this process (:mod:`stoker.records.dali`); otherwise as they
        are. ``stoker.TokenLoader`` does it itself; pass a torch ``DataLoader``'s
        batches through it."""
        stage = self.batch_stage()
        return batches if stage is None else stage(batches)

    def batch_stage(self) -> DaliDecode | None:
        """What the loader's process does to each batch before handing it out: with
        ``decode="dali"``, DALI's decode (made on first use, one per process)."""
        if self.decode != "dali":
            return None
        if self._dali_decode is None:
            from stoker.records.dali import DaliDecode

            self._dali_decode = DaliDecode(
                self.image_size, self.batch_size, self.dali_device, self._rescue,
                threads=decoding_threads(),
            )  # fmt: skip
        return self._dali_decode

    def _rescue(
        self, data: bytes, box: tuple[int, int, int, int], flip: bool, sid: int
    ) -> np.ndarray | None:
        """One image DALI did not decode, decoded here on the same box: the error named
        (row, block, file), or None with ``on_error="skip"`` (counted)."""
        s = self.image_size
        try:
            got = decode_region(data, (s, s), lambda w, h: box, flip, self.max_pixels,
                                self.decoder)  # fmt: skip
        except ImageError as exc:
            where = self.source.where(sid)
            if self.on_error != "skip":
                raise ImageError(f"{where}: {exc}") from exc
            self._skipped(where, exc)
            return None
        registry().image_event("decoded")
        return got

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_dali_decode"] = None  # (a DALI pipeline is the loader process's own)
        return state

    def _image_column(self, name: str | None) -> str:
        schema = self.source.schema
        import pyarrow as pa

        binary: list[str] = [
            f.name for f in schema if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)
        ]
        if name is None:
            if "image" in binary:
                return "image"
            if len(binary) != 1:
                raise ConfigError(
                    f"{self.source.url}: name the image column (image_column=...); binary "
                    f"columns: {binary}"
                )
            return binary[0]
        if name not in binary:
            raise ConfigError(
                f"{self.source.url}: image_column {name!r} is not a binary column of "
                f"{schema.names} (binary: {binary})"
            )
        return name

    def _label_column(self, name: str | bool | None) -> str | None:
        schema = self.source.schema
        import pyarrow as pa

        if name is False:
            return None
        if name is None or name is True:
            if "label" not in schema.names:
                if name is True:
                    raise ConfigError(f"{self.source.url}: no column 'label' ({schema.names})")
                return None
            name = "label"
        if name not in schema.names or not pa.types.is_integer(schema.field(name).type):
            raise ConfigError(
                f"{self.source.url}: label_column {name!r} is not an integer column of "
                f"{schema.names}"
            )
        return name

    # -- identity --------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """What a state must match: the rows and the plan (not the augmentation: a state
        is positions, and resumes under another one)."""
        c = self.shuffle_config
        return {
            "kind": "records",
            "dataset_id": self.source.manifest.dataset_id,
            "num_samples": self.num_samples,
            "seed": c.seed,
            "shuffle": c.shuffle,
            "shard_size": c.shard_size,
            "window_shards": c.window_shards,
            "order": c.order,
            "spread": c.spread,
        }

    @property
    def plans_next_epoch(self) -> bool:  # type: ignore[override]
        """Through a node agent, which keeps what it loads across epochs."""
        return self.agent is not None

    def relay(self) -> str | None:
        return None if self.agent is None else str(self.agent.paths.socket)

    def locality(self) -> dict[str, Any]:
        """With a node agent: the node's cache, and what of each epoch it holds (the
        windows whose blocks it mostly holds, in memory or on disk), for the coordinator's
        locality."""
        agent = self.agent
        if agent is None:
            return {}
        from stoker.coordinator.holdings import local_windows

        key = self.view().key(self.source.manifest.dataset_id)
        source = self.source

        def blocks(a: int, b: int) -> np.ndarray:
            first, last = source.block_of(np.array([a, b - 1]))
            return np.arange(int(first), int(last) + 1)

        def local(epoch: int) -> list[tuple[int, int]]:
            held = agent.holdings(key)
            return local_windows(self.num_samples, self.shuffle_config, epoch, held, blocks)

        return {"node": agent.node, "local": local}

    def holds(self) -> Callable[[np.ndarray], np.ndarray] | None:
        agent = self.agent
        if agent is None:
            return None
        key = self.view().key(self.source.manifest.dataset_id)
        have = np.unique(np.asarray(agent.holdings(key), dtype=np.int64))
        source = self.source

        def test(ids: np.ndarray) -> np.ndarray:  # a row is read from one block
            return np.isin(source.block_of(np.asarray(ids, dtype=np.int64)), have)

        return test

    def view(self) -> View:
        """How the node agent holds this dataset."""
        return View(
            hold=self.hold,
            image_column=self.image_column,
            short_side=self.short_side,
            max_pixels=self.max_pixels,
            decoder=self.decoder,
            columns=(self.label_column,) if self.label_column else (),
        )

    @property
    def layout(self) -> Layout:
        s = self.image_size
        fields = (
            {"image": Field(torch.uint8, (3, s, s))}
            if self.decode is True
            else {"data": Field(torch.uint8, (self.max_bytes,)), "length": Field(torch.int64)}
        )
        if self.decode == "dali":  # the crop box (left, top, w, h) and flip DALI applies
            fields.update(box=Field(torch.int32, (4,)), flip=Field(torch.bool))
        if self.label_column is not None:
            fields["label"] = Field(torch.int64)
        if self.on_error == "skip":
            fields["skipped"] = Field(torch.bool)
        return Layout(fields)

    def open_reader(
        self, epoch: int = 0, decoding: int | None = None
    ) -> RecordReader | RemoteReader:
        """The reader of ``epoch``'s rows: this process's, or the preprocessing pool's
        (which makes what no worker can with this process's)."""
        if self.preprocess is None:
            return self._open_local(epoch, decoding)
        from stoker.preprocess.client import RemoteReader

        return RemoteReader(
            self._work,
            epoch,
            self.preprocess,
            self.layout,
            local=lambda: self._open_local(epoch, decoding),
            token=self.preprocess_token,
            here=self.preprocess_local,
            block_of=self.source.block_of,
        )

    def _open_local(self, epoch: int, decoding: int | None) -> RecordReader:
        if self.decoder != "pillow":
            _cv2()  # (imported on the consumer's thread, before its decode threads use it)
        columns = [self.image_column] + ([self.label_column] if self.label_column else [])
        c = self.shuffle_config
        assert c.shard_size is not None  # (resolved)
        horizon, gap = max(_HORIZON, 8 * c.shard_size), None
        if c.shuffle and c.order == "spread" and self.agent is None:
            # planned over a unit's whole spread (its D turns), so a block is let go once
            # its rows thin out (fewer than about 4 a turn), its last ones kept alone: each
            # block fetched once a pass (with 8 turns planned, about 2.4 times). Not through
            # the node agent: a row it maps is a view of its memory, and a block it holds
            # for a reader is pinned (planned that far, held to its last use, a reader
            # would pin about three times the blocks); fetching again is a local map there
            turns = len(plan.spread_profile(c.shard_size, c.spread))
            horizon, gap = max(_HORIZON, (turns + 1) * c.shard_size), max(1, c.shard_size // 4)
        return RecordReader(
            self.source,
            self.layout,
            self.make,
            columns,
            epoch,
            horizon=horizon,
            decoding=decoding_threads() if decoding is None else decoding,
            agent=self.agent,
            view=self.view(),
            draws=self._draws if self.augment == "train" else None,
            gap=gap,
        )

    def _draws(self, ids: np.ndarray, epochs: np.ndarray) -> list[list[float]]:
        """A batch's augmentation uniforms (its crops and flips), one list a sample."""
        drawn: list[list[float]] = augment.batch_uniforms(self.seed, epochs, ids).tolist()
        return drawn

    # -- a sample ---------------------------------------------------------------
    def make(
        self,
        row: dict[str, Any],
        epoch: int,
        sid: int,
        out: dict[str, Any],
        i: int,
        draws: Sequence[float] | None = None,
    ) -> None:
        """Row ``i`` of ``out``: sample ``sid``'s image (decoded, augmented) and label; with
        ``on_error="skip"``, a sample whose image or label is bad is a row of zeros with
        the label -100 and ``skipped`` set, counted (``stoker_images_skipped``).
        ``draws``: the sample's augmentation uniforms when the reader drew them for its
        batch (else drawn here: the same numbers)."""
        if self.on_error != "skip":
            self._make(row, epoch, sid, out, i, draws)
            return
        try:
            self._make(row, epoch, sid, out, i, draws)
        except ImageError as exc:
            for name in ("image", "data", "length", "box", "flip"):
                if name in out:
                    out[name][i] = 0
            if "label" in out:
                out["label"][i] = -100
            out["skipped"][i] = True
            self._skipped(f"{self.source.url}: row {sid}", exc)
            return
        out["skipped"][i] = False

    def _skipped(self, where: str, exc: ImageError) -> None:
        """A sample skipped (``on_error="skip"``): counted, the first one named in a warning."""
        registry().image_event("skipped")
        if not self._warned_skip:
            self._warned_skip = True
            warnings.warn(
                f"{where} skipped ({exc}); further ones are counted in stoker_images_skipped",
                stacklevel=3,
            )

    def _make(
        self,
        row: dict[str, Any],
        epoch: int,
        sid: int,
        out: dict[str, Any],
        i: int,
        draws: Sequence[float] | None,
    ) -> None:
        s = self.image_size
        data = None if self.prepared else row[self.image_column]
        if self.prepared:
            self._make_prepared(row, epoch, sid, out["image"], i, draws)
        elif data is None:
            raise ImageError(f"column {self.image_column!r} is empty (null)")
        elif self.decode is not True:
            n = len(data)
            if n > self.max_bytes:
                raise ImageError(f"{n} bytes, more than max_bytes ({self.max_bytes})")
            if self.decode == "dali":  # its header: the box is in its pixels
                box, flip = self._box(epoch, sid, draws)
                out["box"][i] = box(*image_size(data, self.max_pixels))
                out["flip"][i] = flip
            row_out = out["data"][i]
            row_out[:n] = np.frombuffer(data, dtype=np.uint8)
            row_out[n:] = 0
            out["length"][i] = n
        elif self.transform is not None:
            got = self._transformed(rgb(open_image(data, self.max_pixels)), epoch, sid)
            out["image"][i] = _chw(got, s)
        else:
            box, flip = self._box(epoch, sid, draws)
            decode_region(data, (s, s), box, flip, self.max_pixels, self.decoder, out["image"][i])
            registry().image_event("decoded")
        if self.label_column is not None:
            label = row[self.label_column]
            if label is None:
                raise ImageError(f"column {self.label_column!r} (the label) is missing")
            out["label"][i] = label

    def _box(
        self, epoch: int, sid: int, draws: Sequence[float] | None = None
    ) -> tuple[Callable[[int, int], Any], bool]:
        """Sample ``sid``'s crop (a function of the image's width and height) and flip, from
        its uniforms (``draws``, or drawn here)."""
        s = self.image_size
        if self.augment == "train":
            u = draws
            if u is None:
                u = augment.uniforms(augment.sample_keys(self.seed, epoch, np.array([sid])))[0]
            return (lambda w, h: augment.crop_box(u, w, h)), augment.flipped(u)
        if self.augment == "eval":
            return (lambda w, h: augment.centre_box(w, h, s, round(s / 0.875))), False
        return (lambda w, h: (0, 0, w, h)), False

    def _make_prepared(
        self,
        row: dict[str, Any],
        epoch: int,
        sid: int,
        out: np.ndarray,
        i: int,
        draws: Sequence[float] | None,
    ) -> None:
        """The image from its decoded pixels: the agent's (a held row: its pixels, or the
        error it kept, under :data:`~stoker.records.held.HELD`), else decoded here the
        same way."""
        held = row.get(HELD)
        if held is not None:
            pixels, problem = held
            if problem is not None:
                raise ImageError(problem)
        else:
            data = row[self.image_column]
            if data is None:
                raise ImageError(f"column {self.image_column!r} is empty (null)")
            pixels = prepare(data, self.short_side, self.max_pixels, self.decoder)
            registry().image_event("decoded")
        s = self.image_size
        if self.transform is not None:
            from PIL import Image

            got = self._transformed(Image.fromarray(pixels, "RGB"), epoch, sid)
            out[i] = _chw(got, s)
            return
        box, flip = self._box(epoch, sid, draws)
        region(pixels, (s, s), box, flip, self.decoder, out[i])

    def _transformed(self, image: Any, epoch: int, sid: int) -> Any:
        """The user's transform of sample ``sid``'s image, its draws the sample's."""
        assert self.transform is not None
        if not self._torch_transform:
            return self.transform(image, _generator(self.seed, epoch, sid))
        key = int(augment.sample_keys(self.seed, epoch, np.array([sid]))[0])
        with _TORCH_RNG, torch.random.fork_rng(devices=[]):
            torch.manual_seed(key >> 1)  # (63 bits: what manual_seed takes as it is)
            return self.transform(image)


def _takes_image_only(transform: Transform) -> bool:
    """Whether ``transform`` is called with the image alone: a ``torch.nn.Module`` (as
    torchvision's transforms are), or a callable that takes one positional argument."""
    if isinstance(transform, torch.nn.Module):
        return True
    import inspect

    try:
        params = inspect.signature(transform).parameters.values()
    except (TypeError, ValueError):  # (no signature to read: the documented two arguments)
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return False
    return len(positional) == 1 or (
        len(positional) > 1 and all(p.default is not p.empty for p in positional[1:])
    )


def _generator(seed: int, epoch: int, sid: int) -> np.random.Generator:
    """The generator a user's transform is handed for sample ``sid`` of ``epoch``."""
    key = int(augment.sample_keys(seed, epoch, np.array([sid]))[0])
    return np.random.Generator(np.random.Philox(key=key))


def _agent(
    cache: AgentConfig | None, cache_dir: str | os.PathLike[str] | None, agent: Any
) -> AgentClient | None:
    """The node agent a records dataset reads through, from its keywords (None: none)."""
    if cache is not None:
        if not isinstance(cache, AgentConfig):
            raise ConfigError(f"cache must be a stoker.AgentConfig, got {type(cache).__name__}")
        if cache_dir is not None or agent is not None:
            raise ConfigError(
                "cache=AgentConfig(...) names the agent's directory and limits: give "
                "neither cache_dir nor agent beside it"
            )
        from stoker.cache.client import AgentClient

        return AgentClient(config=cache)
    if agent is None:
        agent = cache_dir is not None
    if agent is True:
        from stoker.cache.client import AgentClient

        return AgentClient(cache_dir)
    return agent or None


def _chw(value: Any, size: int) -> np.ndarray:
    """A transform's output as a ``(3, size, size)`` uint8 array (ImageError otherwise)."""
    a = np.asarray(value)
    if a.shape == (size, size, 3):
        a = a.transpose(2, 0, 1)
    if a.shape != (3, size, size) or a.dtype != np.uint8:
        raise ImageError(
            f"the transform gave {a.dtype} of shape {a.shape}; expected uint8 of shape "
            f"(3, {size}, {size}) or ({size}, {size}, 3)"
        )
    return a
