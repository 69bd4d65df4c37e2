"""Replacing one ``## `` section of docs/benchmarks.md, leaving the others as they are."""

from __future__ import annotations

from pathlib import Path


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
