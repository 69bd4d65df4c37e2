"""RANK / WORLD_SIZE / LOCAL_RANK are checked: a half-set or malformed environment is an error."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import stoker
from stoker.errors import ConfigError
from stoker.loader.distributed import detect

from ._datasets import SmallDataset

VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    for name in VARS:
        monkeypatch.delenv(name, raising=False)

    def set_env(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_env


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "1"}, "WORLD_SIZE"),
        ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE"),
        ({"RANK": "", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "gpu0"}, "LOCAL_RANK"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-3"}, "LOCAL_RANK"),
        ({"LOCAL_RANK": "1.5"}, "LOCAL_RANK"),
    ],
)
def test_bad_environment_is_a_config_error_naming_the_variable(
    env: Callable[..., None], values: dict[str, str], named: str
) -> None:
    env(**values)
    with pytest.raises(ConfigError, match=named):
        detect()


def test_a_good_environment_places_the_process(env: Callable[..., None]) -> None:
    env(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1")
    pl = detect()
    assert (pl.rank, pl.world, pl.local_rank) == (3, 4, 1)


def test_no_environment_is_a_single_process(env: Callable[..., None]) -> None:
    pl = detect()
    assert (pl.rank, pl.world, pl.local_rank) == (0, 1, 0)


def test_explicit_arguments_take_precedence_over_the_environment(
    env: Callable[..., None],
) -> None:
    env(RANK="not-a-number", WORLD_SIZE="also-not")
    # both given: the environment is not read at all
    assert (detect(1, 2).rank, detect(1, 2).world) == (1, 2)
    env(WORLD_SIZE="4")
    # the missing half comes from the argument, the other from the environment
    pl = detect(rank=2)
    assert (pl.rank, pl.world) == (2, 4)


def test_dataset_iteration_raises_for_a_half_set_environment(
    env: Callable[..., None], write_small: Callable[..., SmallDataset]
) -> None:
    ds_small = write_small("ds", num_docs=40, max_len=30)
    env(WORLD_SIZE="2")
    ds = stoker.TokenDataset(ds_small.url, seq_len=8, agent=False)
    with pytest.raises(ConfigError, match="RANK"):
        next(iter(ds))


def test_torch_distributed_takes_precedence_over_the_environment(
    env: Callable[..., None], tmp_path
) -> None:
    import torch.distributed as dist

    env(WORLD_SIZE="2")  # half set: an error if it were read
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        pl = detect()
    finally:
        dist.destroy_process_group()
    assert (pl.rank, pl.world) == (0, 1)
