"""Where time goes: one process's counters (:mod:`~stoker.observe.registry`; their
histogram in :mod:`~stoker.observe.instruments`, their Prometheus view in
:mod:`~stoker.observe.exposition`, a TokenLoader worker's counts on their way to the
main process in :mod:`~stoker.observe.workers`, the ``/metrics`` endpoint in
:mod:`~stoker.observe.serving`), the export of torch DataLoader workers' counts
(:mod:`~stoker.observe.export`), the node agent's counters
(:mod:`~stoker.observe.agent`), timing any loader (:mod:`~stoker.observe.metered`),
the GPU through NVML (:mod:`~stoker.observe.nvml`), and the two readers of it all,
``stoker doctor`` (:mod:`~stoker.observe.doctor`) and ``stoker top``
(:mod:`~stoker.observe.top`).

Nothing here exists before it is used: the registry, its fork hook and the exit
hook that removes the workers' export directory come into being on first use, not
at import.
"""
