"""device="cuda" on a machine without CUDA: one warning (batches stay on the CPU), or an error
when asked for strictly. Runs for real on a machine without a GPU."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import stoker
from stoker import device as device_tier
from stoker.device import placement
from stoker.errors import ConfigError

from ._datasets import SmallDataset

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "_warned_devices", set())
    monkeypatch.delenv(device_tier.STRICT_ENV, raising=False)


@pytest.fixture(scope="module")
def data(write_small_module: Callable[..., SmallDataset]) -> SmallDataset:
    return write_small_module("nocuda", num_docs=30, max_len=100, vocab_size=500)


def loader(data: SmallDataset, **kw: Any) -> stoker.TokenLoader:
    ds = stoker.TokenDataset(data.url, 16, batch_size=4, agent=False, seed=1)
    return stoker.TokenLoader(ds, 0, **kw)


def cuda_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [
        str(w.message)
        for w in caught
        if issubclass(w.category, RuntimeWarning) and "CUDA is not available" in str(w.message)
    ]


def test_the_prefetcher_warns_once_and_keeps_batches_on_the_cpu(data: SmallDataset) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = device_tier.DevicePrefetcher(loader(data), "cuda")
        second = device_tier.DevicePrefetcher(loader(data), "cuda")
        batches = list(first)
        second.close()
    messages = cuda_warnings(caught)
    assert len(messages) == 1, messages
    assert "'cuda'" in messages[0] and "stay on the CPU" in messages[0]
    assert first.device == torch.device("cpu")
    assert batches and all(b["tokens"].device.type == "cpu" for b in batches)


def test_the_loaders_device_option_warns_once_over_epochs(data: SmallDataset) -> None:
    ld = loader(data, device="cuda:1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        epochs = [list(ld), list(ld)]
    messages = cuda_warnings(caught)
    assert len(messages) == 1, messages
    assert "'cuda:1'" in messages[0]
    assert all(len(e) > 0 for e in epochs)
    assert all(b["tokens"].device.type == "cpu" for e in epochs for b in e)


def test_strict_makes_it_an_error(data: SmallDataset) -> None:
    with pytest.raises(ConfigError, match="'cuda' was asked for but CUDA is not available"):
        device_tier.DevicePrefetcher(loader(data), "cuda", strict=True)


def test_the_environment_variable_makes_it_an_error_for_the_loader(
    data: SmallDataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(device_tier.STRICT_ENV, "1")
    ld = loader(data, device="cuda")
    with pytest.raises(ConfigError, match="CUDA is not available"):
        next(iter(ld))


def test_a_malformed_strict_variable_is_named(
    data: SmallDataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(device_tier.STRICT_ENV, "sometimes")
    with pytest.raises(ConfigError, match=device_tier.STRICT_ENV):
        device_tier.DevicePrefetcher(loader(data), "cuda")


def test_no_device_asked_for_is_the_cpu_without_a_word(data: SmallDataset) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pf = device_tier.DevicePrefetcher(loader(data))
        pf.close()
    assert cuda_warnings(caught) == []
    assert pf.device == torch.device("cpu")
