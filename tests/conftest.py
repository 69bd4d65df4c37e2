"""Shared fixtures. Real servers live in tests/servers.py."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faultproxy import fault_proxy  # noqa: F401  (the fault-injecting proxy, for every test)
from servers import DUMMY_AWS_ENV, MotoS3Server, NginxOrigin, find_nginx


@pytest.fixture(scope="session")
def nginx_bin() -> str:
    """Path of the nginx binary; skips without it (fails under CI=...)."""
    path = find_nginx()
    if path is None:
        reason = "nginx not installed (apt-get install nginx-light); needed for HTTP origin tests"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {reason}", pytrace=False)
        pytest.skip(reason)
    return path


@pytest.fixture
def nginx_origin(
    nginx_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., NginxOrigin]]:
    """Factory: ``nginx_origin(root, **kwargs)`` -> a started NginxOrigin.

    kwargs go to NginxOrigin (flaky_every=, slow_rate=). Each origin keeps its
    conf and logs under pytest's tmp dir and is stopped at teardown.
    """
    started: list[NginxOrigin] = []

    def make(root: str | Path, **kwargs: Any) -> NginxOrigin:
        kwargs.setdefault("prefix", tmp_path_factory.mktemp("nginx"))
        origin = NginxOrigin(root, nginx=nginx_bin, **kwargs)
        origin.start()
        started.append(origin)
        return origin

    yield make
    for origin in reversed(started):
        origin.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3Server]:
    """One moto S3 server (separate process) for the whole session.

    Shared state: use a unique bucket name per test.
    """
    with MotoS3Server(log_dir=tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Dummy AWS credentials in this process's environment, for this test only."""
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in DUMMY_AWS_ENV.items():
        monkeypatch.setenv(name, value)
    return dict(DUMMY_AWS_ENV)
