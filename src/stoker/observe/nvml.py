"""GPU utilisation through NVML, when this machine has an NVIDIA GPU and the NVML bindings.

``pip install nvidia-ml-py`` provides them; without them, or without a GPU,
there is nothing to report and the metrics are simply absent.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

#: The families :func:`collect` yields (gauges, one sample per device).
FAMILIES = (
    "stoker_gpu_sm_active_ratio",
    "stoker_gpu_memory_used_bytes",
    "stoker_gpu_memory_total_bytes",
)

_lock = threading.Lock()
_state: dict[str, Any] = {}


def _nvml() -> Any | None:
    """The initialised ``pynvml`` module, or None (tried once per process)."""
    with _lock:
        if "nvml" not in _state:
            try:
                import pynvml

                pynvml.nvmlInit()
                _state["nvml"] = pynvml if pynvml.nvmlDeviceGetCount() > 0 else None
            except Exception:
                _state["nvml"] = None
        return _state["nvml"]


def collect() -> Iterator[Any]:
    """``stoker_gpu_*`` families, one sample per device; nothing without NVML."""
    nvml = _nvml()
    if nvml is None:
        return
    from prometheus_client.core import GaugeMetricFamily

    util = GaugeMetricFamily(
        FAMILIES[0],
        "Share of the last sample period in which a kernel ran (NVML utilisation.gpu / 100)",
        labels=["gpu"],
    )
    used = GaugeMetricFamily(FAMILIES[1], "GPU memory in use", labels=["gpu"])
    total = GaugeMetricFamily(FAMILIES[2], "GPU memory", labels=["gpu"])
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        rates = nvml.nvmlDeviceGetUtilizationRates(h)
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        util.add_metric([str(i)], rates.gpu / 100.0)
        used.add_metric([str(i)], float(mem.used))
        total.add_metric([str(i)], float(mem.total))
    yield from (util, used, total)
