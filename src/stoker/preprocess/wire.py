"""Rows of a batch as one Arrow record batch, and a worker's request, as JSON: what goes
over a preprocessing worker's Arrow Flight stream (no pickle either way).

Each field of the batch's layout is one column of fixed-size binary values, a row's
bytes (``image``: ``3 x size x size`` uint8), its dtype and shape in the schema's
metadata; the columns wrap the arrays' memory, and the receiver's arrays wrap the
received buffers (one copy: into the batch's rows).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from stoker import __version__
from stoker.errors import ProtocolError
from stoker.preprocess.spec import WorkSpec

_META = b"stoker.fields"
#: What a worker's error message begins with: the error as JSON follows (its kind,
#: message and fields, :func:`stoker.errors.encode`).
ERROR = "stoker-error:"
#: Rows a request asks for at most (and ids it names ahead).
MOST_ROWS = 4096


def to_batch(arrays: dict[str, np.ndarray]) -> pa.RecordBatch:
    """``arrays`` (each of ``n`` rows) as a record batch of fixed-size binary columns."""
    cols, names, meta = [], [], {}
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        n = len(a)
        width = a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
        buf = pa.py_buffer(a.reshape(-1).view(np.uint8)) if a.size else pa.py_buffer(b"")
        cols.append(pa.Array.from_buffers(pa.binary(width), n, [None, buf]))
        names.append(name)
        meta[name] = {"dtype": a.dtype.str, "shape": list(a.shape[1:])}
    schema = pa.schema([pa.field(n, c.type) for n, c in zip(names, cols, strict=True)])
    return pa.RecordBatch.from_arrays(
        cols, schema=schema.with_metadata({_META: json.dumps(meta).encode()})
    )


def from_batch(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    """The arrays of :func:`to_batch` (views of the batch's buffers, read-only)."""
    raw = (batch.schema.metadata or {}).get(_META)
    if raw is None:
        raise ProtocolError("a preprocessing worker's batch carries no field metadata")
    meta = json.loads(raw)
    out = {}
    for name in batch.schema.names:
        col = batch.column(name)
        m = meta[name]
        dtype = np.dtype(m["dtype"])
        shape = (len(col), *m["shape"])
        data = col.buffers()[1]
        width = col.type.byte_width
        if data is None or len(col) * width == 0:
            out[name] = np.zeros(shape, dtype=dtype)
            continue
        start = col.offset * width
        flat = np.frombuffer(data, dtype=np.uint8, count=len(col) * width, offset=start)
        out[name] = flat.view(dtype).reshape(shape)
    return out


@dataclass(frozen=True)
class Request:
    """Rows ``ids`` of ``epoch`` (or each of its own: ``epochs``), ``ahead`` the ids that
    come after them (the worker reads ahead for them), for the trainer's reader
    ``stream`` (a worker keeps a reader of its own for each)."""

    spec: WorkSpec
    epoch: int
    ids: list[int]
    ahead: list[int]
    stream: str
    epochs: list[int] | None = None
    version: str = __version__  # the trainer's stoker: a worker of another refuses
    # its place among the stream's requests to this worker (1, 2, ...; 0: none), which
    # the worker makes in that order, as the trainer's plan has them
    order: int = 0

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "spec": json.loads(self.spec.to_json()),
                "epoch": self.epoch,
                "ids": self.ids,
                "ahead": self.ahead,
                "stream": self.stream,
                "epochs": self.epochs,
                "version": self.version,
                "order": self.order,
            }
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Request:
        from stoker.errors import ConfigError

        try:
            raw: dict[str, Any] = json.loads(data)
            spec = WorkSpec.from_json(json.dumps(raw["spec"]))
            req = cls(
                spec,
                int(raw["epoch"]),
                [int(i) for i in raw["ids"]],
                [int(i) for i in raw.get("ahead") or []],
                str(raw["stream"]),
                None if raw.get("epochs") is None else [int(e) for e in raw["epochs"]],
                str(raw.get("version", "")),
                int(raw.get("order", 0)),
            )
        except ConfigError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"a malformed preprocessing request: {exc!r}") from None
        if req.order < 0:
            raise ConfigError(f"a preprocessing request's order is {req.order}")
        if req.epochs is not None and len(req.epochs) != len(req.ids):
            raise ConfigError("a preprocessing request's epochs are not one a row")
        if not 0 < len(req.ids) <= MOST_ROWS or len(req.ahead) > MOST_ROWS:
            raise ConfigError(
                f"a preprocessing request asks for {len(req.ids)} rows ({len(req.ahead)} "
                f"ahead): 1 to {MOST_ROWS} of each"
            )
        return req
