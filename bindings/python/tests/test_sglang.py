"""The SGLang-style adapter: match_prefix / inc_lock_ref / insert / dec_lock_ref / evict."""

from collections import namedtuple

import pytest

import radixkv
from radixkv import RadixCache

RadixKey = namedtuple("RadixKey", ["token_ids", "extra_key"])


def test_scheduler_flow_caller_managed():
    freed = []
    cache = RadixCache(page_size=1, free_slots=freed.extend)
    assert cache.total_size() == 0 and cache.evictable_size() == 0 and cache.protected_size() == 0

    # First request: nothing cached.
    res = cache.match_prefix(RadixKey([1, 2, 3, 4], None))
    assert len(res.device_indices) == 0 and res.last_device_node is cache.root_node
    assert cache.inc_lock_ref(res.last_device_node) == 0
    assert cache.insert(RadixKey([1, 2, 3, 4], None), [10, 11, 12, 13]) == 0
    assert cache.dec_lock_ref(res.last_device_node) == 0
    assert cache.total_size() == 4 and cache.evictable_size() == 4

    # Second request shares a prefix.
    indices, node = cache.match_prefix([1, 2, 3, 9])[:2]
    assert list(indices) == [10, 11, 12] and len(node) == 3
    assert cache.inc_lock_ref(node) == -3
    assert node.lock_ref == 1
    assert cache.protected_size() == 3 and cache.evictable_size() == 1
    assert cache.evict(100) == 1 and freed == [13]  # only the unpinned leaf goes
    assert cache.insert([1, 2, 3, 9], [10, 11, 12, 19]) == 3
    assert cache.dec_lock_ref(node) == 3
    assert node.lock_ref == 0
    with pytest.raises(radixkv.InvalidLockError):
        cache.dec_lock_ref(node)
    assert cache.evict(100) == 4
    assert sorted(freed) == [10, 11, 12, 13, 19]
    assert cache.total_size() == 0


def test_extra_key_is_a_namespace():
    cache = RadixCache()
    cache.insert(RadixKey([1, 2], "lora-1"), [5, 6])
    assert list(cache.match_prefix(RadixKey([1, 2], "lora-1")).device_indices) == [5, 6]
    assert len(cache.match_prefix(RadixKey([1, 2], "lora-2")).device_indices) == 0
    assert len(cache.match_prefix([1, 2]).device_indices) == 0
    assert list(cache.match_prefix([1, 2], extra_key="lora-1").device_indices) == [5, 6]


def test_value_defaults_to_tokens_and_reset():
    cache = RadixCache(page_size=2)
    assert cache.insert([7, 8, 9]) == 0  # value None: the token ids themselves
    assert list(cache.match_prefix([7, 8, 9]).device_indices) == [7, 8]
    cache.reset()
    assert cache.total_size() == 0


def test_stale_node_is_refused():
    freed = []
    cache = RadixCache(free_slots=freed.extend)
    cache.insert([1, 2, 3], [1, 2, 3])
    res = cache.match_prefix([1, 2, 3])
    cache.evict(100)  # the prefix goes before it is pinned
    with pytest.raises(radixkv.StaleNodeError):
        cache.inc_lock_ref(res.last_device_node)
    assert cache.protected_size() == 0


def test_pool_mode_and_disable():
    cache = RadixCache(pool_slots=32, to_indices=list)
    slots = cache.cache.alloc(4)
    assert cache.insert([1, 2, 3, 4], slots) == 0
    assert cache.match_prefix([1, 2, 3, 4]).device_indices == list(slots)
    assert cache.evict(4) == 4
    assert cache.cache.stats().free_slots == 32
    off = RadixCache(disable=True)
    assert off.insert([1, 2], [1, 2]) == 0
    assert len(off.match_prefix([1, 2]).device_indices) == 0
    assert off.evict(10) == 0


def test_evict_needs_somewhere_for_caller_managed_slots():
    # Found by an audit: with the slots the caller's (pool_slots=0) and no free_slots, evict
    # used to drop the freed slots silently.
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], [100, 101, 102, 103])
    with pytest.raises(ValueError, match="free_slots"):
        cache.evict(4)
    assert cache.total_size() == 4, "refused before evicting"
    pooled = RadixCache(pool_slots=16)
    slots = pooled.cache.alloc(4)
    pooled.insert([1, 2, 3, 4], slots)
    assert pooled.evict(4) == 4  # the pool takes them back


class FullKey:
    """SGLang 0.5.x's RadixKey fields (token_ids, extra_key, cache_salt, limit, is_bigram)."""

    def __init__(self, token_ids, extra_key=None, is_bigram=False, limit=None, cache_salt=None):
        self.token_ids = token_ids
        self.extra_key = extra_key
        self.is_bigram = is_bigram
        self.limit = limit
        self.cache_salt = cache_salt or None


def test_the_cache_salt_is_part_of_the_namespace():
    # Found by the SGLang check: tenant B matched tenant A's tokens under the same extra_key.
    cache = RadixCache()
    cache.insert(FullKey([1, 2, 3], "lora", cache_salt="tenant-a"), [10, 11, 12])
    assert len(cache.match_prefix(FullKey([1, 2, 3], "lora", cache_salt="tenant-b")).device_indices) == 0
    assert len(cache.match_prefix(FullKey([1, 2, 3], "lora")).device_indices) == 0
    assert list(cache.match_prefix(FullKey([1, 2, 3], "lora", cache_salt="tenant-a")).device_indices) == [10, 11, 12]


def test_limit_and_bigram_keys():
    cache = RadixCache()
    cache.insert(FullKey([1, 2, 3, 4, 5, 6]), [10, 11, 12, 13, 14, 15])
    assert len(cache.match_prefix(FullKey([1, 2, 3, 4, 5, 6], limit=4)).device_indices) == 4
    bigrams = RadixCache()
    assert bigrams.insert(FullKey([5, 6, 7, 8], is_bigram=True)) == 0
    assert bigrams.total_size() == 3  # 4 raw tokens are 3 bigrams
    assert len(bigrams.match_prefix(FullKey([5, 6, 7, 9], is_bigram=True)).device_indices) == 2
    assert len(bigrams.match_prefix(FullKey([4, 6, 7, 8], is_bigram=True)).device_indices) == 0
