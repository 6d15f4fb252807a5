"""Namespaces as a unit: drop_namespace, namespace_stats, namespace_count, Stats.namespaces."""

import pytest

import radixkv
from radixkv import Cache, NamespaceStats

ZERO = NamespaceStats(0, 0, 0, 0)


def test_drop_namespace_caller_managed_keeps_pinned_pages():
    with Cache() as c:
        assert c.namespace_count() == 0 and c.stats().namespaces == 0
        c.insert([1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15], ns="tenant-a")
        c.insert([1, 2, 3, 4, 5, 6], [20, 21, 22, 23, 24, 25], ns=2)
        assert c.namespace_count() == 2 and c.stats().namespaces == 2
        assert c.namespace_stats("tenant-a") == NamespaceStats(6, 6, 0, 1)
        with pytest.raises(radixkv.NullArgumentError, match="^Cache.drop_namespace: on_free is None"):
            c.drop_namespace("tenant-a")  # no pool: the slots must go somewhere
        assert c.namespace_stats("tenant-a").cached_tokens == 6
        got = []
        with c.match_lock([1, 2, 3], ns="tenant-a") as lock:
            assert lock.length == 3
            assert c.drop_namespace("tenant-a", on_free=got.extend) == 3
            assert sorted(got) == [13, 14, 15]
            assert c.namespace_stats("tenant-a") == NamespaceStats(3, 0, 3, 1)
            assert c.namespace_stats(2).cached_tokens == 6  # untouched
            assert c.drop_namespace("tenant-a", got.extend) == 0  # only pinned pages left
        assert c.drop_namespace("tenant-a", got.extend) == 3
        assert sorted(got) == [10, 11, 12, 13, 14, 15]
        assert c.namespace_stats("tenant-a") == ZERO
        assert c.namespace_count() == 1
        assert c.stats().cached_tokens == 6 and c.stats().evicted_tokens == 6


def test_unknown_namespaces_free_nothing_and_are_not_interned():
    with Cache(pool_slots=16) as c:
        assert c.drop_namespace("never-seen") == 0
        assert c.drop_namespace(b"never-seen") == 0
        assert c.drop_namespace(12345) == 0
        assert c.namespace_stats("never-seen") == ZERO
        assert c.namespace_stats(None) == ZERO
        assert c._names == {}  # looking did not intern the names
    with Cache() as c:
        assert c.drop_namespace("never-seen", on_free=lambda s: None) == 0
        with pytest.raises(radixkv.NullArgumentError):
            c.drop_namespace("never-seen")  # refused as a known name would be
        with pytest.raises(TypeError):
            c.drop_namespace(1.5, on_free=lambda s: None)
        with pytest.raises(ValueError):
            c.namespace_stats(-1)


def test_drop_namespace_with_a_pool():
    with Cache(page_size=4, pool_slots=64) as c:
        a = c.alloc(8)
        c.insert(list(range(8)), a, ns="adapter")
        b = c.alloc(4)
        c.insert(list(range(4)), b, ns="other")
        assert c.namespace_count() == 2 and c.stats().free_slots == 52
        assert c.drop_namespace("adapter") == 8
        assert c.namespace_count() == 1 and c.stats().free_slots == 60
        told = []
        assert c.drop_namespace("other", on_free=told.extend) == 4
        assert sorted(told) == sorted(b) and c.stats().free_slots == 64
        assert c.stats().namespaces == 0


def test_an_exception_from_on_free_comes_out_after_the_drop():
    with Cache() as c:
        c.insert([1, 2, 3], [1, 2, 3], ns=5)
        c.insert([1, 2, 4], [1, 2, 4], ns=5)

        def boom(slots):
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            c.drop_namespace(5, on_free=boom)
        assert c.namespace_stats(5) == ZERO and c.namespace_count() == 0


def test_closed_cache_refuses():
    c = Cache()
    c.close()
    for call in (lambda: c.drop_namespace(0, print), lambda: c.namespace_stats(0), c.namespace_count):
        with pytest.raises(radixkv.CacheClosedError):
            call()
