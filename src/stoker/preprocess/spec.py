"""What a preprocessing worker runs for a records dataset, as JSON (never a pickle).

A :class:`WorkSpec` names everything that decides a row's pixels: the dataset's URL,
how it decodes and augments (the built-in recipes by name, their parameters as JSON
values) and a user transform as an importable path, ``package.module:function``. A
worker builds its own :class:`~stoker.records.dataset.RecordDataset` from it, and since
every random choice is a function of (seed, epoch, sample id), its rows are the ones
the trainer would have made itself, bit for bit.

Trust: a worker imports a user transform only from the modules installed where it
runs (``importlib.import_module``: its ``sys.path``); nothing in a request is code. A
spec names a module, it does not carry one, and a worker is reached only by those who
hold its token (see :mod:`stoker.preprocess.worker`).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stoker.errors import ConfigError
from stoker.records.image import MAX_PIXELS

if TYPE_CHECKING:
    from stoker.records.dataset import RecordDataset


@dataclasses.dataclass(frozen=True)
class WorkSpec:
    """The parameters of a records dataset a worker needs to make its rows."""

    url: str
    image_size: int = 224
    augment: str = "train"
    transform: str | None = None  # "package.module:function", imported by the worker
    image_column: str | None = None
    label_column: str | bool | None = None
    seed: int = 0
    max_pixels: int | None = None
    decode: bool = True
    max_bytes: int = 1 << 20
    decoder: str = "auto"
    hold: str = "blocks"
    short_side: int | None = None
    on_error: str = "raise"
    dataset_id: str | None = None  # the manifest's: a worker reading another refuses

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> WorkSpec:
        """A spec from its JSON, each field checked: a wrong one is named."""
        try:
            raw = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"a work spec is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"a work spec is a JSON object, got {type(raw).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(fields))
        if unknown:
            raise ConfigError(f"a work spec has unknown fields {unknown}")
        if "url" not in raw:
            raise ConfigError("a work spec names no dataset (field 'url')")
        for name, value in raw.items():
            if not _fits(value, _KINDS[name]):
                raise ConfigError(f"work spec field {name!r}: {value!r} is not {_KINDS_SAID[name]}")
            most = _MOST.get(name)
            if most is not None and value is not None and not 1 <= value <= most:
                raise ConfigError(f"work spec field {name!r}: {value} is not in [1, {most}]")
        return cls(**raw)

    def check(self, ds: RecordDataset) -> None:
        """``ds`` (made from this spec here) is the dataset the trainer reads."""
        got = ds.source.manifest.dataset_id
        if self.dataset_id is not None and got != self.dataset_id:
            raise ConfigError(
                f"{self.url} is dataset {got} here, {self.dataset_id} at the trainer: this "
                "worker reads another dataset at that URL"
            )

    @classmethod
    def of(cls, ds: RecordDataset) -> WorkSpec:
        """The spec of a dataset made here: its transform must be importable by name (a
        module's top-level function or class), or the dataset cannot be made elsewhere."""
        if ds.decode not in (True, False):
            raise ConfigError(
                f"decode={ds.decode!r} runs on this machine's GPU: a preprocessing worker "
                "decodes on its CPU (decode=True, or False for the stored bytes)"
            )
        made_here = {f.name for f in dataclasses.fields(cls)} - {"url", "transform", "dataset_id"}
        return cls(
            url=ds.source.url,
            transform=None if ds.transform is None else transform_path(ds.transform),
            dataset_id=ds.source.manifest.dataset_id,
            **{name: getattr(ds, name) for name in made_here},
        )

    def dataset(self, **local: Any) -> RecordDataset:
        """The dataset this spec describes, made here (``local``: this machine's own
        settings: ``storage_options``, ``agent``, ``cache_dir``)."""
        from stoker.records.dataset import RecordDataset

        kw = dataclasses.asdict(self)
        url, transform = kw.pop("url"), kw.pop("transform")
        del kw["dataset_id"]  # (checked once made: :meth:`check`)
        if kw["max_pixels"] is None:
            del kw["max_pixels"]  # (the dataset's default)
        return RecordDataset(
            url,
            transform=None if transform is None else import_transform(transform),
            **kw,
            **local,
        )


_KINDS: dict[str, tuple[type, ...]] = {
    "url": (str,),
    "image_size": (int,),
    "augment": (str,),
    "transform": (str, type(None)),
    "image_column": (str, type(None)),
    "label_column": (str, bool, type(None)),
    "seed": (int,),
    "max_pixels": (int, type(None)),
    "decode": (bool,),
    "max_bytes": (int,),
    "decoder": (str,),
    "hold": (str,),
    "short_side": (int, type(None)),
    "on_error": (str,),
    "dataset_id": (str, type(None)),
}
#: The largest value a request may ask of each size (what a worker would allocate, or
#: let an image's header claim: a request may lower the pixel bound, not raise it).
_MOST = {
    "image_size": 4096,
    "short_side": 8192,
    "max_bytes": 64 << 20,
    "max_pixels": MAX_PIXELS,
}
_KINDS_SAID = {
    k: " or ".join("null" if t is type(None) else t.__name__ for t in v) for k, v in _KINDS.items()
}


def _fits(value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in kinds:
        return False  # (a bool is an int to isinstance)
    return isinstance(value, kinds)


def transform_path(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of ``fn``, checked to import back to the same object."""
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(type(fn), "__qualname__", None)
    if getattr(fn, "__qualname__", None) is None:  # an instance: its class must be made anew
        raise ConfigError(
            f"the transform {fn!r} is an object: a preprocessing worker imports a transform "
            "by name (give a module's top-level function or class)"
        )
    path = f"{module}:{name}"
    if module in (None, "__main__") or "<" in str(name):
        raise ConfigError(
            f"the transform {path} cannot be imported by a worker: give a top-level function "
            "of an installed module (package.module:function)"
        )
    try:
        back = import_transform(path)
    except ConfigError as exc:
        raise ConfigError(f"the transform {path} does not import back: {exc}") from None
    if back is not fn:
        raise ConfigError(f"the transform {path} imports as another object than the one given")
    return path


def import_transform(path: str) -> Callable[..., Any]:
    """The callable ``package.module:function`` names, imported here."""
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise ConfigError(f"a transform is named package.module:function, got {path!r}")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"transform {path}: cannot import {module} here ({exc})") from None
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"transform {path}: {module} has no {name}") from None
    if not callable(obj):
        raise ConfigError(f"transform {path} is not callable")
    return obj  # type: ignore[no-any-return]
