"""A sliding window in the lock-free cache from Python: ``Cache(..., swa_window=W)``,
SWA-valid matches, window locks, ``evict_kv``'s per-node reports, and the refusals."""

import pytest

import radixkv
from radixkv import Cache


def _window_cache():
    c = Cache(page_size=1, pool_slots=16, swa_window=2)
    s = list(c.alloc(6))
    c.insert([1, 2, 3, 4, 5, 6], s)
    c.match_lock([1, 2, 3, 4]).release()  # splits [1..6] at 4
    return c, s


def test_a_tombstone_and_the_reports():
    c, s = _window_cache()
    held = c.match_lock([1, 2, 3, 4, 5, 6])  # holds [5, 6]'s window
    assert held.length == 6
    count, nodes = c.evict_kv("swa", 1)
    assert count == 4
    assert [(f, w, list(x)) for f, w, x in nodes] == [(False, True, s[:4])]
    # A match ending on the tombstone is not valid; one 2 tokens past it is.
    assert len(c.match([1, 2, 3, 4])) == 0
    assert list(c.match([1, 2, 3, 4, 5, 6])) == s
    assert c.evict_kv("swa", 100)[0] == 0, "the window lock holds [5, 6]"
    held.release()
    count, nodes = c.evict_kv("full", 100)
    assert count == 6
    assert [(f, w, list(x)) for f, w, x in nodes] == [(True, True, s[4:]), (True, False, s[:4])]
    assert len(c.alloc(16)) == 16, "the full KV went back to the pool"
    assert c.stats().cached_tokens == 0


def test_refusals_change_nothing():
    c, _ = _window_cache()
    with pytest.raises(radixkv.InvalidArgumentError):
        c.evict_kv("mamba", 1)
    with pytest.raises(radixkv.InvalidArgumentError):
        c.reset()
    with pytest.raises(radixkv.OutOfSlotsError):
        c.alloc(11)  # 10 free: no eviction on its own with a window
    with pytest.raises(ValueError):
        Cache(swa_window=-1)
    with pytest.raises(radixkv.InvalidArgumentError):
        Cache(swa_window=1 << 32)
    assert c.stats().cached_tokens == 6


def test_without_a_window_swa_eviction_frees_nothing():
    c = Cache(page_size=1, pool_slots=8)
    c.insert([1, 2], list(c.alloc(2)))
    assert c.evict_kv("swa", 10) == (0, [])
    count, nodes = c.evict_kv("full", 10)
    assert count == 2 and [(f, w) for f, w, _ in nodes] == [(True, False)]
