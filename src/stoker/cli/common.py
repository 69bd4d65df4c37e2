"""What the verbs share: sizes as text, ``--storage-options``, a progress bar made at its
first report, and the list of what a build left out."""

from __future__ import annotations

import json
from typing import Any

from stoker.errors import InputError


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def storage_options(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InputError(f"--storage-options is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise InputError("--storage-options must be a JSON object")
    return value


class Bar:
    """A progress bar (tqdm), made at its first report, when the total is known; none with
    ``quiet`` or without tqdm (optional: ``stoker[build]`` brings it). ``options`` are
    tqdm's (``unit``, ``unit_scale``, ...). Use it as a context: it closes the bar."""

    def __init__(self, quiet: bool, **options: Any) -> None:
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        self._tqdm = None if quiet else tqdm
        self._options = options
        self._bar: Any = None

    def __call__(self, done: int, total: int | None, postfix: str | None = None) -> None:
        if self._tqdm is None:
            return
        if self._bar is None:
            self._bar = self._tqdm(total=total, dynamic_ncols=True, **self._options)
        if postfix is not None:
            self._bar.set_postfix_str(postfix, refresh=False)
        self._bar.update(done - self._bar.n)

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *_: object) -> None:
        if self._bar is not None:
            self._bar.close()


def print_skipped(skipped: int, named: list[str], what: str) -> None:
    """What a build left out: how many, the first of them by name."""
    if not skipped:
        return
    print(f"left out {skipped:,} {what}:")
    for why in named:
        print(f"  {why}")
    if skipped > len(named):
        print(f"  ... and {skipped - len(named):,} more")


def shared_token(token_file: str | None, variable: str) -> str | None:
    """A service's shared token: ``--token-file``'s (which must hold one), else the
    environment variable ``variable``'s; None when neither gives one."""
    from pathlib import Path

    from stoker import env
    from stoker.errors import ConfigError

    if not token_file:
        return env.get(variable) or None
    try:
        token = Path(token_file).read_text().strip() or None
    except OSError as exc:
        raise ConfigError(f"--token-file {token_file}: {exc}") from None
    if token is None:
        raise ConfigError(f"--token-file {token_file} is empty")
    return token
