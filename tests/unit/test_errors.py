"""The exception tree: every class documented, errors that keep their context, and the
registry of kinds that carries an error from one process to another."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

from stoker import errors
from stoker.storage import RetryPolicy, Storage


def _classes() -> dict[str, type[errors.StokerError]]:
    return {
        cls.__name__: cls  # by the class's own name: an old name kept as an alias is no class
        for cls in vars(errors).values()
        if inspect.isclass(cls)
        and issubclass(cls, errors.StokerError)
        and cls.__module__ == errors.__name__
    }


def _tree() -> dict[str, tuple[int, str]]:
    """Name -> (depth, parent) from the tree drawn in the module docstring."""
    doc = errors.__doc__ or ""
    out: dict[str, tuple[int, str]] = {}
    stack: list[str] = []
    for line in doc.splitlines():
        m = re.match(r"^    ((?:[│ ]   )*(?:├── |└── ))?([A-Z]\w+)", line)
        if not m or (m.group(1) is None and m.group(2) != "StokerError"):
            continue
        depth = len(m.group(1) or "") // 4
        del stack[depth:]
        out[m.group(2)] = (depth, stack[-1] if stack else "")
        stack.append(m.group(2))
    return out


def test_every_error_class_is_in_the_docstring_tree_under_its_parent() -> None:
    tree = _tree()
    classes = _classes()
    assert sorted(tree) == sorted(classes)
    for name, cls in classes.items():
        parent = tree[name][1]
        if name == "StokerError":
            assert parent == ""
        else:
            assert issubclass(cls, classes[parent]), (name, parent)
            stoker_bases = [b for b in cls.__bases__ if issubclass(b, errors.StokerError)]
            assert [b.__name__ for b in stoker_bases] == [parent], name


def _all_subclasses(cls: type) -> set[type]:
    out: set[type] = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _all_subclasses(sub)
    return out


def test_every_public_stoker_error_is_defined_in_errors() -> None:
    import stoker

    for info in pkgutil.walk_packages(stoker.__path__, "stoker."):
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed
            continue
    public = {
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in _all_subclasses(errors.StokerError)
        if not cls.__name__.startswith("_") and cls.__module__.startswith("stoker.")
    }
    public.add("stoker.errors.StokerError")
    assert sorted(public) == sorted(f"stoker.errors.{name}" for name in _classes())


def test_errors_defined_elsewhere_are_the_same_classes() -> None:
    from stoker.cache.wire import ProtocolError
    from stoker.coordinator.client import CoordinatorUnavailable, LeaseRejected
    from stoker.extras import MissingBackendError

    assert ProtocolError is errors.ProtocolError
    assert LeaseRejected is errors.LeaseRejected
    assert CoordinatorUnavailable is errors.CoordinatorUnavailable
    assert MissingBackendError is errors.MissingBackendError


def test_a_range_read_past_the_end_carries_url_path_and_range(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f.bin").write_bytes(b"x" * 100)
    storage = Storage(str(tmp_path))
    with pytest.raises(
        errors.StorageError, match=r"bytes \[90, 120\): the file ends after 10"
    ) as info:
        storage.read_range("data/f.bin", 90, 120)
    err = info.value
    assert (err.url, err.path, err.start, err.stop) == (
        f"{tmp_path}/data/f.bin",
        "data/f.bin",
        90,
        120,
    )


def test_an_unreachable_range_read_carries_its_context() -> None:
    from servers import free_port

    url = f"http://127.0.0.1:{free_port()}/ds"
    storage = Storage(url, retry=RetryPolicy(backoff=0.01, deadline=10.0))
    with pytest.raises(errors.UnreachableError, match="cannot reach the storage") as info:
        storage.read_range("data/f.bin", 0, 8)
    err = info.value
    assert (err.url, err.path, err.start, err.stop) == (f"{url}/data/f.bin", "data/f.bin", 0, 8)
    with pytest.raises(errors.UnreachableError) as whole:
        storage.read("manifest.json")
    assert (whole.value.path, whole.value.start, whole.value.stop) == ("manifest.json", None, None)


def test_the_registry_carries_a_typed_error_with_its_context() -> None:
    exc = errors.ChecksumError("data/x.bin: block 7 failed", file="data/x.bin", block=7)
    kind, message, fields = errors.encode(exc)
    assert (kind, message) == ("ChecksumError", "data/x.bin: block 7 failed")
    back = errors.decode(kind, message, "in loader worker 1", fields)
    assert type(back) is errors.ChecksumError
    assert str(back) == "data/x.bin: block 7 failed (in loader worker 1)"
    assert (back.file, back.block) == ("data/x.bin", 7)

    storage = errors.StorageError("s: short", url="u/p", path="p", start=1, stop=9)
    back = errors.decode(*errors.encode(storage)[:2], "", errors.encode(storage)[2])
    assert type(back) is errors.StorageError and str(back) == "s: short"
    assert (back.url, back.path, back.start, back.stop) == ("u/p", "p", 1, 9)

    rejected = errors.LeaseRejected("FAILED_PRECONDITION", "not held")
    back = errors.decode(*errors.encode(rejected)[:2], "from x", errors.encode(rejected)[2])
    assert type(back) is errors.LeaseRejected and back.code == "FAILED_PRECONDITION"
    assert str(back) == "not held (FAILED_PRECONDITION) (from x)"


def test_a_subclass_outside_errors_travels_as_its_documented_parent() -> None:
    from stoker.storage import _Fatal

    assert errors.encode(_Fatal("x"))[0] == "StorageError"
    assert errors.encode(ValueError("bad")) == ("", "ValueError: bad", {})


@pytest.mark.parametrize(
    "kind", ["", "ValueError", "OSError", "SystemExit", "Path", "os.system", "_Fatal", "encode"]
)
def test_the_registry_refuses_a_kind_that_is_not_a_stoker_error(kind: str) -> None:
    assert errors.decode(kind, "boom", "in loader worker 0") is None


def test_the_registry_ignores_fields_a_class_does_not_have() -> None:
    back = errors.decode(
        "ChecksumError", "m", "", {"file": "f", "block": [1], "__class__": "x", "url": "u"}
    )
    assert type(back) is errors.ChecksumError
    assert (back.file, back.block) == ("f", -1)
    assert not hasattr(back, "url")
