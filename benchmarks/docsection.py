"""Replacing one ``## `` section of docs/benchmarks.md, leaving the others as they are."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def replace_section(path: Path, heading: str, section: str, former: tuple[str, ...] = ()) -> None:
    """Replace the section that starts with the line ``heading``, or with one of the
    ``former`` headings (a renamed section is replaced where it stands), or append it."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    names = (heading, *former)
    start = next((i for i, ln in enumerate(lines) if ln.rstrip() in names), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section
    else:
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
        )
        tail = "".join(lines[end:])
        new = "".join(lines[:start]) + section.rstrip("\n") + "\n" + ("\n" + tail if tail else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new.rstrip("\n") + "\n")


def publish(
    res: dict[str, Any], name: str, quick: bool, heading: str, render: Callable[[Any], str]
) -> None:
    """Keep a run's results as benchmarks/.work/NAME[-quick].json, put its section in
    docs/benchmarks.md (not for a quick run) and print it."""
    bench = Path(__file__).resolve().parent
    out = bench / ".work" / f"{name}{'-quick' if quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    if not quick:
        replace_section(bench.parent / "docs" / "benchmarks.md", heading, render(res))
    print(render(res))
