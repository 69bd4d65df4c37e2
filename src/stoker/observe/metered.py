"""Any loader's batches, timed: the stall and throughput figures of :class:`~stoker.TokenLoader`
for torch's ``DataLoader`` (or any iterable of batch dicts).

::

    loader = stoker.Metered(DataLoader(TokenDataset(...), batch_size=8, num_workers=4),
                            metrics_port=9400)
    for batch in loader:  # the same batches
        ...
    loader.stats()  # stall_share, tokens_per_second, worker_busy_share, ...

The time spent inside ``next()`` is the data stall, the time until the next
``next()`` the training step; both go to the rank's ``stoker_loader_*`` series,
where :class:`~stoker.TokenLoader` puts its own, so the dashboard, ``stoker
top`` and ``stoker doctor`` read a DataLoader job the same way. The DataLoader's
workers report their busy share and storage reads themselves
(:mod:`stoker.observe.export`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from stoker.observe.registry import timed
from stoker.observe.serving import serve_once


class Metered:
    """``loader``'s batches, each timed into this rank's loader metrics.

    ``rank`` defaults to the torch.distributed rank (or ``RANK``);
    ``metrics_port`` serves ``/metrics`` on that port plus the local rank.
    Samples are counted from ``batch[ids_key]`` (else the first tensor's first
    dimension) and tokens from ``batch[tokens_key]``. Other attributes
    (``state_dict``, ``load_state_dict``, ``set_epoch``, ...) are the loader's.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        *,
        rank: int | None = None,
        metrics_port: int | None = None,
        tokens_key: str = "tokens",
        ids_key: str = "sample_id",
    ) -> None:
        self.loader = loader
        self.rank = rank
        self.metrics_port = metrics_port
        self.tokens_key, self.ids_key = tokens_key, ids_key

    def _rank(self) -> tuple[int, int]:
        from stoker.loader.distributed import detect

        pl = detect()
        return (pl.rank if self.rank is None else self.rank), pl.local_rank

    def __iter__(self) -> Iterator[Any]:
        rank, local = self._rank()
        if self.metrics_port is not None:
            serve_once(self.metrics_port, local)
        yield from timed(iter(self.loader), rank, self._count)

    def _count(self, batch: Any) -> tuple[int, int]:
        if not isinstance(batch, dict):
            return 0, 0
        tokens: Any = batch.get(self.tokens_key)
        ntok = int(tokens.numel()) if hasattr(tokens, "numel") else 0
        ids = batch.get(self.ids_key)
        if ids is None:
            ids = next((v for v in batch.values() if hasattr(v, "shape") and v.shape), None)
        return (len(ids) if ids is not None else 0), ntok

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def stats(self) -> dict[str, Any]:
        """This rank's figures, as :meth:`stoker.TokenLoader.stats` gives them."""
        from stoker.observe.export import rank_stats

        return rank_stats(self._rank()[0])

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.loader, name)
