"""Every environment variable is read in stoker.env, and the README lists each one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stoker import env

ROOT = Path(__file__).resolve().parents[2]
#: Reads of the environment: os.environ.get / os.environ[...] on the right-hand side / getenv.
READ = re.compile(r"os\.environ\.get\(|os\.getenv\(|(?<![\w.])getenv\(|=\s*os\.environ\[")


def test_only_the_env_module_reads_the_environment() -> None:
    offenders = []
    for path in sorted((ROOT / "src" / "stoker").rglob("*.py")):
        if path.name == "env.py" or "_proto" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if READ.search(line) or re.search(r"\bif os\.environ\[", line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == [], "read the environment through stoker.env:\n" + "\n".join(offenders)


def test_the_readme_lists_every_variable() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in env.VARIABLES if f"`{name}`" not in readme]
    assert missing == []


def test_an_undocumented_variable_cannot_be_read() -> None:
    with pytest.raises(KeyError, match="not one of stoker's environment variables"):
        env.get("STOKER_SOMETHING_NEW")


def test_a_variable_is_read_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_CACHE_DIR", "/tmp/elsewhere")
    assert env.get("STOKER_CACHE_DIR") == "/tmp/elsewhere"
    monkeypatch.delenv("STOKER_CACHE_DIR")
    assert env.get("STOKER_CACHE_DIR", "x") == "x"
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert env.ranks() == {"RANK": "1", "WORLD_SIZE": "2"}
