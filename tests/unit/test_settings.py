"""Settings cross process boundaries as one JSON message: exact round trips, and a
clear error for anything that is not a setting of the right type."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from stoker import settings
from stoker.cache.config import AgentConfig
from stoker.cli import agent
from stoker.cli import coordinator as coordinator_cli
from stoker.coordinator.leases import Config
from stoker.errors import ConfigError


def test_round_trips_keep_every_field() -> None:
    lease = Config(lease_size=123, timeout=2.5, min_steal=7, locality=False)
    assert settings.from_json(Config, settings.to_json(lease)) == lease
    cfg = AgentConfig("/tmp/c", cache_limit=5 << 30, idle_exit=None, metrics_port=None)
    assert settings.from_json(AgentConfig, settings.to_json(cfg)) == cfg


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"lease_size": true}', "lease_size"),  # a bool is not an int
        ('{"lease_size": "4096"}', "lease_size"),
        ('{"timeout": null}', "timeout"),
        ('{"lease_sise": 1}', "unknown setting"),
        ("[1, 2]", "JSON object"),
        ("{", "not JSON"),
    ],
)
def test_bad_settings_name_the_field(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        settings.from_json(Config, text)


def test_an_int_is_a_float_and_a_missing_required_field_is_named() -> None:
    assert settings.from_json(Config, '{"timeout": 3}').timeout == 3.0
    with pytest.raises(ConfigError, match="cache_dir"):
        settings.from_json(AgentConfig, '{"cache_limit": 10}')


def _parse(add: object, argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    add(ap)  # type: ignore[operator]
    return ap.parse_args(argv)


def test_the_agent_cli_defaults_are_the_dataclass_defaults() -> None:
    args = _parse(agent.add_arguments, ["--cache-dir", "/tmp/x", "--cache-limit", "1G"])
    got = agent.config_from_args(args)
    want = AgentConfig("/tmp/x", cache_limit=1 << 30)
    assert got == want  # nothing re-typed: the flags' defaults are AgentConfig's
    sent = AgentConfig("/tmp/y", cache_limit=7, max_rate=3.0, idle_exit=12.0)
    args = _parse(agent.add_arguments, ["--config-json", settings.to_json(sent)])
    assert agent.config_from_args(args) == sent
    with pytest.raises(ConfigError, match="--cache-dir"):
        agent.config_from_args(_parse(agent.add_arguments, []))


def test_the_coordinator_cli_defaults_are_the_lease_settings() -> None:
    args = _parse(coordinator_cli.add_arguments, ["--state", "s", "--world", "1",
                                                  "--num-samples", "10"])  # fmt: skip
    defaults = Config()
    assert (args.lease_size, args.timeout, args.readahead, args.min_readahead) == (
        defaults.lease_size, defaults.timeout, defaults.readahead_seconds,
        defaults.min_readahead,
    )  # fmt: skip
    assert {f.name for f in dataclasses.fields(Config)} >= {"min_steal", "locality"}


def test_rank0_hands_its_coordinator_every_lease_setting(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The coordinator a rank starts gets the whole lease configuration in one message
    (min_steal used to be dropped on the way, re-typed flag by flag)."""
    import json

    from stoker.coordinator import embedded
    from stoker.coordinator.client import CoordinatorClient

    config = Config(lease_size=77, min_steal=9, locality=False)
    started = embedded.spawn(100, 1, state_url=str(tmp_path / "state"), config=config)
    try:
        argv = list(started.proc.args)  # type: ignore[arg-type]
        sent = json.loads(argv[argv.index("--config-json") + 1])
        assert settings.from_json(Config, json.dumps(sent)) == config
        assert CoordinatorClient(started.address).status().world == 1  # it serves
    finally:
        started.close()


def test_a_shuffle_config_is_the_shuffle_keywords_as_one_value(write_small) -> None:  # type: ignore[no-untyped-def]
    import stoker

    data = write_small(num_docs=80, max_len=60)
    loose = stoker.TokenDataset(data.url, 8, batch_size=4, seed=5, shard_size=4, window_shards=3)
    value = stoker.TokenDataset(
        data.url, 8, batch_size=4, shuffle=stoker.ShuffleConfig(5, True, 4, 3)
    )
    assert [x["sample_id"] for x in loose] == [x["sample_id"] for x in value]
    assert value.state_dict() == loose.state_dict()  # the same stream, the same state
    off = stoker.TokenDataset(data.url, 8, shuffle=stoker.ShuffleConfig(shuffle=False))
    assert [x["sample_id"] for x in off] == list(range(off.num_samples))
    with pytest.raises(ConfigError, match="ShuffleConfig"):
        stoker.TokenDataset(data.url, 8, seed=1, shuffle=stoker.ShuffleConfig(seed=2))
    with pytest.raises(ConfigError, match="cache_dir"):
        stoker.TokenDataset(data.url, 8, cache=stoker.AgentConfig("/tmp/x"), cache_dir="/tmp/y")
