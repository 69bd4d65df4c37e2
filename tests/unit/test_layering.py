"""Which packages may import which: the generated protobuf modules stay behind the
coordinator's and the node agent's clients (stoker's own value types everywhere else)."""

from __future__ import annotations

import ast
from pathlib import Path

import stoker

SRC = Path(stoker.__file__).parent
WIRE = ("coordinator", "cache", "_proto")  # the packages that speak protobuf


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the module's package
                pkg = list(path.relative_to(SRC.parent).with_suffix("").parts[:-1])
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_only_the_coordinator_and_the_agent_import_the_generated_protobuf_modules() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] in WIRE:
            continue
        if any(name.startswith("stoker._proto") for name in _imports(path)):
            offenders.append(str(rel))
    assert offenders == []


def test_the_scan_sees_an_import_of_the_generated_modules() -> None:
    assert "stoker._proto.coordinator_pb2" in _imports(SRC / "coordinator" / "client.py")


def test_formats_import_neither_the_cache_nor_the_loader() -> None:
    """The block-cache protocol lives with the formats (stoker.formats.cache): the cache
    package depends on the formats, not the other way round."""
    offenders = {}
    for path in sorted((SRC / "formats").rglob("*.py")):
        bad = {n for n in _imports(path) if n.startswith(("stoker.cache", "stoker.loader"))}
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}
