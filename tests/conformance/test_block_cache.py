"""The block-cache protocol (:class:`stoker.formats.cache.BlockCache`), one suite for every
implementation: :class:`BlockCacheTests` holds the behaviours, and each subclass
provides a ``cache`` fixture for its implementation and says what that one promises
(``keeps``: a record put comes back; ``persists``: a new instance on the same
directory still has it). A cache may drop any record at any time, so a base test
never demands a record back from a cache that does not keep, and never accepts
wrong bytes from any.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import ClassVar

import pytest

from stoker.cache.disk import DiskCache
from stoker.cache.paths import AgentPaths
from stoker.cache.tiers import DiskTier
from stoker.formats.cache import BlockCache, NullCache
from stoker.observe.agent import Counters

LIMIT = 4096  # bytes each cache under test is built with


def record(seed: int, size: int = 300) -> bytes:
    """Distinct bytes per seed, every byte value included (NUL, 0xff)."""
    return bytes((seed * 31 + i * 7) % 256 for i in range(size))


class BlockCacheTests:
    """Behaviours of every :class:`BlockCache`; subclasses provide the ``cache`` fixture."""

    keeps: ClassVar[bool] = True  # get after put returns the record (room permitting)
    persists: ClassVar[bool] = False  # records survive a new instance on the same directory

    def reopen(self, cache: BlockCache) -> BlockCache:
        """A new instance on the same storage as ``cache`` (only where ``persists``)."""
        raise NotImplementedError

    def held_bytes(self, cache: BlockCache) -> int:
        """Bytes of records the cache holds right now."""
        raise NotImplementedError

    def expect(self, data: bytes) -> bytes | None:
        return data if self.keeps else None

    def check(self, cache: BlockCache, key: str, data: bytes) -> None:
        """``key`` reads back as ``data`` or, only where a cache may drop it, as nothing."""
        got = cache.get(key)
        assert got is None or got == data, f"{key}: {len(got)} wrong bytes"

    # -- the tests -------------------------------------------------------------------
    def test_it_is_a_block_cache(self, cache: BlockCache) -> None:
        assert isinstance(cache, BlockCache)

    def test_a_missing_key_is_none(self, cache: BlockCache) -> None:
        assert cache.get("ds/0") is None
        cache.put("ds/1", record(1))
        assert cache.get("ds/0") is None
        assert cache.get("ds/10") is None
        assert cache.get("other/1") is None

    def test_a_put_record_comes_back_byte_for_byte(self, cache: BlockCache) -> None:
        data = record(2, 1000)
        cache.put("ds/3", data)
        got = cache.get("ds/3")
        assert got == self.expect(data)
        if got is not None:
            assert type(got) is bytes
        assert cache.get("ds/3") == self.expect(data)  # a hit does not consume it

    def test_an_empty_record_comes_back(self, cache: BlockCache) -> None:
        cache.put("ds/4", b"")
        assert cache.get("ds/4") == self.expect(b"")

    def test_discard_forgets_a_record_and_only_that_one(self, cache: BlockCache) -> None:
        cache.put("ds/5", record(5))
        cache.put("ds/6", record(6))
        cache.discard("ds/5")
        assert cache.get("ds/5") is None
        assert cache.get("ds/6") == self.expect(record(6))
        cache.discard("ds/5")  # again: nothing to forget, no error
        cache.discard("never/7")

    def test_a_record_put_again_after_discard_is_the_new_one(self, cache: BlockCache) -> None:
        """A record that failed its checksum is discarded and fetched again."""
        cache.put("ds/8", b"corrupt" * 10)
        cache.discard("ds/8")
        cache.put("ds/8", record(8))
        assert cache.get("ds/8") == self.expect(record(8))

    @pytest.mark.parametrize(
        ("a", "b"),
        [
            ("dsA/0", "dsB/0"),
            ("a/12", "a1/2"),
            ("a_/1", "a/1"),
            ("a__1/2", "a/1"),
            ("x.y/3", "x/3"),
        ],
    )
    def test_keys_of_two_datasets_do_not_collide(self, cache: BlockCache, a: str, b: str) -> None:
        cache.put(a, record(10))
        cache.put(b, record(11))
        assert cache.get(a) == self.expect(record(10))
        assert cache.get(b) == self.expect(record(11))
        cache.discard(a)
        assert cache.get(a) is None
        assert cache.get(b) == self.expect(record(11))

    def test_a_record_bigger_than_the_limit_does_not_raise(self, cache: BlockCache) -> None:
        with warnings.catch_warnings(record=True):  # a warning may say so; it must not raise
            warnings.simplefilter("always")
            cache.put("ds/20", record(20, LIMIT + 1))
        self.check(cache, "ds/20", record(20, LIMIT + 1))
        assert self.held_bytes(cache) <= LIMIT
        cache.put("ds/21", record(21))  # and the cache goes on working
        assert cache.get("ds/21") == self.expect(record(21))

    def test_a_full_cache_does_not_raise_and_stays_within_its_limit(
        self, cache: BlockCache
    ) -> None:
        size = LIMIT // 5
        keys = [f"ds/{i}" for i in range(20)]  # four times the limit
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            for i, key in enumerate(keys):
                cache.put(key, record(i, size))
                if i == 0:  # the count below is of real bytes, not always 0
                    assert self.held_bytes(cache) == (size if self.keeps else 0)
                assert self.held_bytes(cache) <= LIMIT, f"after {i + 1} puts"
        kept = 0
        for i, key in enumerate(keys):
            self.check(cache, key, record(i, size))
            kept += cache.get(key) is not None
        if self.keeps:
            assert kept >= 1  # full means evicting some, not all

    def test_records_survive_a_new_instance(self, cache: BlockCache) -> None:
        if not self.persists:
            pytest.skip(f"{type(cache).__name__} promises nothing across instances")
        cache.put("ds/30", record(30))
        cache.put("other/30", record(31))
        cache.put("ds/31", record(32))
        cache.discard("ds/31")
        again = self.reopen(cache)
        assert again.get("ds/30") == record(30)
        assert again.get("other/30") == record(31)
        assert again.get("ds/31") is None  # a discard is not undone by a restart
        assert again.get("ds/32") is None


class TestNullCache(BlockCacheTests):
    keeps = False

    @pytest.fixture
    def cache(self) -> BlockCache:
        return NullCache()

    def held_bytes(self, cache: BlockCache) -> int:
        return 0

    def test_get_after_put_is_none(self, cache: BlockCache) -> None:
        cache.put("ds/0", record(0))
        assert cache.get("ds/0") is None


class TestDiskCache(BlockCacheTests):
    persists = True  # one file per record, named after its key

    @pytest.fixture
    def cache(self, tmp_path: Path) -> BlockCache:
        return DiskCache(tmp_path / "cache", LIMIT)

    def reopen(self, cache: BlockCache) -> BlockCache:
        assert isinstance(cache, DiskCache)
        return DiskCache(cache.directory, cache.limit_bytes)

    def held_bytes(self, cache: BlockCache) -> int:
        assert isinstance(cache, DiskCache)
        if not cache.directory.is_dir():
            return 0
        return sum(p.stat().st_size for p in cache.directory.glob("*" + DiskCache.SUFFIX))

    def test_the_directory_stays_under_the_limit_while_a_record_is_written(
        self, cache: BlockCache, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A put makes room first: at the moment a record is written aside (before its
        # rename), the directory, that file included, already fits the limit.
        assert isinstance(cache, DiskCache)
        seen: list[int] = []
        rename = os.replace

        def measuring_replace(src: object, dst: object) -> None:
            seen.append(sum(p.stat().st_size for p in cache.directory.iterdir()))
            rename(src, dst)  # type: ignore[arg-type]

        monkeypatch.setattr("stoker.cache.disk.os.replace", measuring_replace)
        for i in range(4 * LIMIT // 300):
            cache.put(f"ds/{i}", record(i))
        assert len(seen) == 4 * LIMIT // 300
        assert max(seen) <= LIMIT, f"{max(seen)} bytes on disk during a write, limit {LIMIT}"
        assert cache.get(f"ds/{4 * LIMIT // 300 - 1}") == record(4 * LIMIT // 300 - 1)


class TestDiskTier(BlockCacheTests):
    persists = True  # DiskTier.scan adopts what an earlier agent left

    @pytest.fixture
    def cache(self, tmp_path: Path) -> BlockCache:
        return DiskTier(AgentPaths(tmp_path / "agent"), LIMIT, Counters())

    def reopen(self, cache: BlockCache) -> BlockCache:
        assert isinstance(cache, DiskTier)
        again = DiskTier(AgentPaths(cache.paths.cache_dir), LIMIT, Counters())
        again.scan()
        return again

    def held_bytes(self, cache: BlockCache) -> int:
        assert isinstance(cache, DiskTier)
        blocks = cache.paths.blocks
        return sum(p.stat().st_size for p in blocks.rglob("*.rec")) if blocks.is_dir() else 0

    def test_a_scan_adopts_the_records_an_earlier_instance_left(self, cache: BlockCache) -> None:
        assert isinstance(cache, DiskTier)
        cache.put("ds/0", record(0))
        cache.put("ds/1", record(1))
        fresh = DiskTier(AgentPaths(cache.paths.cache_dir), LIMIT, Counters())
        assert fresh.scan() == 2
        assert fresh.get("ds/0") == record(0) and fresh.get("ds/1") == record(1)
