"""radixkv.sglang.RadixKvCache against SGLang's own types and its own RadixCache. Needs
SGLang 0.5.x and torch (skipped without them; scripts/sglang-check runs these too, with
SGLang's own unit tests)."""

import unittest
from array import array
from types import SimpleNamespace

try:
    import torch
    from sglang.srt.disaggregation.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    from radixkv.sglang import RadixKvCache

    HAVE_SGLANG = True
except ImportError:  # SGLang is optional
    HAVE_SGLANG = False


def key(tokens, extra_key=None, **kw):
    return RadixKey(array("q", tokens), extra_key, **kw)


def ins(cache, k, value=None):
    if value is not None:
        value = torch.tensor(value, dtype=torch.int64)
    return cache.insert(InsertParams(key=k, value=value))


def match(cache, k):
    return cache.match_prefix(MatchPrefixParams(key=k))


class Allocator:
    """A stand-in for SGLang's token-to-KV allocator: records what is freed."""

    device = torch.device("cpu") if HAVE_SGLANG else None

    def __init__(self):
        self.freed = []

    def free_segment(self, free_index, *, start_pos):
        self.freed.extend(free_index.tolist())

    def available_size(self):
        return 100


@unittest.skipUnless(HAVE_SGLANG, "SGLang and torch are not installed")
class TestRadixKvCache(unittest.TestCase):
    def test_the_whole_radix_key_is_the_namespace(self):
        c = RadixKvCache.create_simulated()
        ins(c, key([1, 2, 3], "lora", cache_salt="tenant-a"), [10, 11, 12])
        # The isolation bug of the old adapter: the salt used to be ignored.
        self.assertEqual(match(c, key([1, 2, 3], "lora", cache_salt="tenant-b")).device_prefix_len, 0)
        self.assertEqual(match(c, key([1, 2, 3], "lora")).device_prefix_len, 0)
        self.assertEqual(match(c, key([1, 2, 3], cache_salt="tenant-a")).device_prefix_len, 0)
        self.assertEqual(match(c, key([1, 2, 3], "")).device_prefix_len, 0)
        r = match(c, key([1, 2, 3, 4], "lora", cache_salt="tenant-a"))
        self.assertEqual(r.device_prefix_len, 3)
        self.assertEqual(c.path_device_indices(r.last_device_node).tolist(), [10, 11, 12])
        self.assertEqual(c.path_device_indices(r.last_device_node).dtype, torch.int64)

    def test_limit_bigram_and_pages_as_sglang(self):
        for page in (1, 2):
            sg, rk = RadixCache.create_simulated(page_size=page), RadixKvCache.create_simulated(page_size=page)
            for c in (sg, rk):
                ins(c, key(list(range(10))), list(range(100, 110)))
            for k in (key(list(range(10)), limit=4), key(list(range(7))), key([0, 1, 2, 9])):
                self.assertEqual(match(rk, k).device_prefix_len, match(sg, k).device_prefix_len, (page, k))
            # EAGLE's bigram keys: 4 raw tokens are 3 bigrams.
            sg, rk = RadixCache.create_simulated(page_size=page), RadixKvCache.create_simulated(page_size=page)
            for c in (sg, rk):
                ins(c, key([5, 6, 7, 8], is_bigram=True))
            self.assertEqual(rk.total_size(), sg.total_size())
            for k in ([5, 6, 7, 8], [5, 6, 7, 9], [4, 6, 7, 8], [5, 6]):
                kb = lambda: key(k, is_bigram=True)  # noqa: E731
                self.assertEqual(match(rk, kb()).device_prefix_len, match(sg, kb()).device_prefix_len, (page, k))

    def test_locks_sizes_and_eviction(self):
        alloc = Allocator()
        c = RadixKvCache.create_simulated(mock_allocator=alloc)
        ins(c, key([1, 2, 3, 4]), [10, 11, 12, 13])
        r = match(c, key([1, 2, 9]))
        node = r.last_device_node
        self.assertEqual(c.inc_lock_ref(node).delta, -2)
        self.assertEqual((c.protected_size(), c.evictable_size(), c.total_size()), (2, 2, 4))
        self.assertEqual(c.evict(EvictParams(num_tokens=10)).num_tokens_evicted, 2)
        self.assertEqual(sorted(alloc.freed), [12, 13])
        self.assertEqual(c.dec_lock_ref(node).delta, 2)
        lock = c.lock(node)
        c.unlock(lock)
        self.assertEqual(c.evict(EvictParams(num_tokens=10)).num_tokens_evicted, 2)
        self.assertEqual(sorted(alloc.freed), [10, 11, 12, 13])
        self.assertEqual(c.total_size(), 0)
        c.sanity_check()
        root = match(c, key([1])).last_device_node
        self.assertIs(root, c.root_node)
        self.assertEqual(c.inc_lock_ref(root).delta, 0)

    def test_insert_returns_what_was_cached(self):
        c = RadixKvCache.create_simulated()
        self.assertEqual(ins(c, key([1, 2, 3]), [10, 11, 12]).prefix_len, 0)
        r = ins(c, key([1, 2, 3, 4, 5]), [20, 21, 22, 23, 24])
        self.assertEqual(r.prefix_len, 3)
        self.assertEqual(c.path_device_indices(r.last_device_node).tolist(), [10, 11, 12, 23, 24])
        self.assertEqual(sorted(c.all_values_flatten().tolist()), [10, 11, 12, 23, 24])
        with self.assertRaisesRegex(ValueError, r"value\[1\] = -4 is out of range"):
            ins(c, key([7, 8]), [3, -4])

    def test_reset_is_a_fresh_tree(self):
        c = RadixKvCache.create_simulated()
        ins(c, key([1, 2, 3]), [10, 11, 12])
        node = match(c, key([1, 2, 3])).last_device_node
        c.inc_lock_ref(node)
        c.reset()
        self.assertEqual((c.total_size(), c.protected_size(), c.evictable_size()), (0, 0, 0))
        self.assertEqual(c.dec_lock_ref(node).delta, 0)  # a lock of the old tree: void
        self.assertEqual(match(c, key([1, 2, 3])).device_prefix_len, 0)

    def test_checkpoint_repoints_the_row_and_moves_the_lock(self):
        alloc = Allocator()
        c = RadixKvCache.create_simulated(mock_allocator=alloc, page_size=2)
        ins(c, key([1, 2, 3, 4]), [50, 51, 52, 53])
        row = torch.tensor([[60, 61, 62, 63, 64, 65, 66]], dtype=torch.int64)

        class Pool:
            req_to_token = row

            def write(self, idx, values):
                self.req_to_token[idx] = values

        c.req_to_token_pool = Pool()
        req = SimpleNamespace(
            full_untruncated_fill_ids=[1, 2, 3, 4, 5, 6, 7],
            kv=SimpleNamespace(req_pool_idx=0, cache_protected_len=0, cache_inserted_len=0, swa_evict_floor=0),
            extra_key=None,
            cache_salt=None,
            priority=None,
            lock=None,
            last_node=None,
        )
        c.checkpoint(req, up_to=7)
        # The tree had 1..4; the request's own indices of those are freed, its row points
        # at the tree's, 5..6 are the tree's now, and the partial page (7) stays the row's.
        self.assertEqual(sorted(alloc.freed), [60, 61, 62, 63])
        self.assertEqual(row[0].tolist(), [50, 51, 52, 53, 64, 65, 66])
        self.assertEqual(req.kv.cache_protected_len, 6)
        self.assertEqual(c.protected_size(), 6)
        self.assertEqual(len(req.last_node), 6)
        c.unlock(req.lock)
        self.assertEqual(c.protected_size(), 0)

    def test_the_schedulers_calls_as_sglangs_radix_cache(self):
        """The calls SGLang 0.5.23's scheduler makes per request (match with the key's
        limit, lock, the prefix's indices, the row written, checkpoint, unlock), on
        RadixKvCache and on SGLang's RadixCache side by side: the same prefix lengths, the
        same rows after each checkpoint, the same sizes."""
        import random

        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.radix_cache import RadixCache as SgRadixCache

        class Alloc(Allocator):
            def available_size(self):
                return 1 << 30

        class Pool:
            def __init__(self):
                self.req_to_token = torch.zeros((1, 64), dtype=torch.int32)

            def write(self, idx, values):
                self.req_to_token[idx] = values

        for page_size in (1, 2):
            rng = random.Random(page_size)
            caches = []
            for cls in (SgRadixCache, RadixKvCache):
                alloc, pool = Alloc(), Pool()
                params = CacheInitParams(
                    disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=page_size
                )
                caches.append((cls(params), alloc, pool))
            stems = [[rng.randrange(5) for _ in range(rng.randrange(1, 12))] for _ in range(4)]
            next_index = 1000
            for i in range(60):
                tokens = array("q", rng.choice(stems)[: rng.randrange(1, 13)] + [rng.randrange(5) for _ in range(rng.randrange(0, 6))])
                n = len(tokens)
                fresh = list(range(next_index, next_index + n))
                next_index += n
                seen = []
                for cache, alloc, pool in caches:
                    req = SimpleNamespace(
                        full_untruncated_fill_ids=tokens,
                        origin_input_ids=tokens,
                        kv=SimpleNamespace(req_pool_idx=0, cache_protected_len=0, cache_inserted_len=0, swa_evict_floor=0),
                        extra_key=None, cache_salt=None, priority=None, lock=None, last_node=None,
                    )
                    r = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens, None, limit=n - 1), req=req))
                    m = r.device_prefix_len
                    req.last_node = r.last_device_node
                    req.prefix_len = req.kv.cache_protected_len = m
                    req.lock = cache.lock(req.last_node)
                    row = pool.req_to_token[0]
                    row.zero_()
                    if m:
                        row[:m] = cache.prefix_device_indices(req)
                    row[m:n] = torch.tensor(fresh[m:], dtype=torch.int32)
                    locked = (cache.protected_size(), cache.evictable_size())
                    cache.checkpoint(req, up_to=n)
                    after = (row.tolist(), req.kv.cache_protected_len, cache.protected_size(), cache.evictable_size())
                    cache.unlock(req.lock)
                    seen.append((m, locked, after, cache.protected_size(), cache.total_size(), sorted(alloc.freed)))
                self.assertEqual(seen[0], seen[1], f"page {page_size}, request {i}: {tokens.tolist()}")
            caches[1][0].sanity_check()

    def test_chunked_and_copied_checkpoints_as_sglangs_radix_cache(self):
        """The checkpoint takes the key its match converted only for the same token array
        from the same start: two checkpoints of one request (half, then all of it: the
        second takes the first's), and a checkpoint that sees a copy of the array (the
        match's conversion not used) keep RadixKvCache's rows and sizes equal to SGLang's
        RadixCache's."""
        import random

        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.radix_cache import RadixCache as SgRadixCache

        class Alloc(Allocator):
            def available_size(self):
                return 1 << 30

        class Pool:
            def __init__(self):
                self.req_to_token = torch.zeros((1, 64), dtype=torch.int32)

            def write(self, idx, values):
                self.req_to_token[idx] = values

        for mode in ("chunked", "copied"):
            for page_size in (1, 2):
                rng = random.Random(page_size * 7 + len(mode))
                caches = []
                for cls in (SgRadixCache, RadixKvCache):
                    alloc, pool = Alloc(), Pool()
                    params = CacheInitParams(
                        disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=page_size
                    )
                    caches.append((cls(params), alloc, pool))
                stems = [[rng.randrange(5) for _ in range(rng.randrange(1, 12))] for _ in range(4)]
                next_index = 1000
                for i in range(60):
                    tokens = array("q", rng.choice(stems)[: rng.randrange(1, 13)] + [rng.randrange(5) for _ in range(rng.randrange(0, 6))])
                    n = len(tokens)
                    fresh = list(range(next_index, next_index + n))
                    next_index += n
                    seen = []
                    for cache, alloc, pool in caches:
                        req = SimpleNamespace(
                            full_untruncated_fill_ids=tokens,
                            origin_input_ids=tokens,
                            kv=SimpleNamespace(req_pool_idx=0, cache_protected_len=0, cache_inserted_len=0, swa_evict_floor=0),
                            extra_key=None, cache_salt=None, priority=None, lock=None, last_node=None,
                        )
                        r = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens, None, limit=n - 1), req=req))
                        m = r.device_prefix_len
                        req.last_node = r.last_device_node
                        req.prefix_len = req.kv.cache_protected_len = m
                        req.lock = cache.lock(req.last_node)
                        row = pool.req_to_token[0]
                        row.zero_()
                        if m:
                            row[:m] = cache.prefix_device_indices(req)
                        row[m:n] = torch.tensor(fresh[m:], dtype=torch.int32)
                        steps = []
                        if mode == "chunked":
                            cache.checkpoint(req, up_to=(m + n + 1) // 2)
                            steps.append((row.tolist(), req.kv.cache_protected_len, cache.protected_size()))
                        else:
                            req.full_untruncated_fill_ids = array("q", tokens)
                        cache.checkpoint(req, up_to=n)
                        steps.append((row.tolist(), req.kv.cache_protected_len, cache.protected_size()))
                        cache.unlock(req.lock)
                        seen.append((m, steps, cache.protected_size(), cache.total_size(), sorted(alloc.freed)))
                    self.assertEqual(seen[0], seen[1], f"{mode}, page {page_size}, request {i}: {tokens.tolist()}")
                caches[1][0].sanity_check()

    def test_a_missed_match_hands_its_key_to_the_requests_checkpoint_only(self):
        """A miss keeps the converted key on the request for its checkpoint (there is no node
        to keep it); the checkpoint takes it only for the same token array, and drops it."""
        alloc = Allocator()
        c = RadixKvCache.create_simulated(mock_allocator=alloc)

        class Pool:
            req_to_token = torch.tensor([[70, 71, 72, 73]], dtype=torch.int32)

        c.req_to_token_pool = Pool()
        for replaced in (False, True):
            c.reset()
            a = array("q", [1, 2, 3, 4])
            req = SimpleNamespace(
                full_untruncated_fill_ids=a,
                kv=SimpleNamespace(req_pool_idx=0, cache_protected_len=0, cache_inserted_len=0, swa_evict_floor=0),
                extra_key=None, cache_salt=None, priority=None, lock=None, last_node=None,
            )
            r = c.match_prefix(MatchPrefixParams(key=RadixKey(a, None, limit=3), req=req))
            self.assertEqual(r.device_prefix_len, 0)
            self.assertIs(r.last_device_node, c.root_node)
            self.assertIsNotNone(req._radixkv_kept)
            req.lock = c.lock(r.last_device_node)
            if replaced:  # another array, other tokens: the miss's conversion is not theirs
                req.full_untruncated_fill_ids = array("q", [9, 8, 7, 6])
            c.checkpoint(req, up_to=4)
            self.assertIsNone(req._radixkv_kept)
            cached = [9, 8, 7, 6] if replaced else [1, 2, 3, 4]
            other = [1, 2, 3, 4] if replaced else [9, 8, 7, 6]
            self.assertEqual(match(c, key(cached)).device_prefix_len, 4)
            self.assertEqual(match(c, key(other)).device_prefix_len, 0)
            c.unlock(req.lock)
        # A miss, then a hit (its node keeps the key): the checkpoint takes the node's and
        # drops the request's stale one too.
        b = array("q", [1, 2, 3, 4, 5, 6])
        req = SimpleNamespace(
            full_untruncated_fill_ids=b,
            kv=SimpleNamespace(req_pool_idx=0, cache_protected_len=0, cache_inserted_len=0, swa_evict_floor=0),
            extra_key=None, cache_salt=None, priority=None, lock=None, last_node=None,
        )
        c.reset()
        c.match_prefix(MatchPrefixParams(key=RadixKey(b, None, limit=5), req=req))
        self.assertIsNotNone(req._radixkv_kept)
        ins(c, key([1, 2, 3, 4]), [50, 51, 52, 53])
        r = c.match_prefix(MatchPrefixParams(key=RadixKey(b, None, limit=5), req=req))
        self.assertEqual(r.device_prefix_len, 4)
        req.lock = c.lock(r.last_device_node)
        req.kv.cache_protected_len = 4
        c.checkpoint(req, up_to=4)
        self.assertIsNone(req._radixkv_kept)
        c.unlock(req.lock)
        # A request that takes no new attributes still works (nothing kept on it).
        class Slotted:
            __slots__ = ("full_untruncated_fill_ids",)

        s = Slotted()
        s.full_untruncated_fill_ids = array("q", [5, 5, 5])
        r = c.match_prefix(MatchPrefixParams(key=RadixKey(s.full_untruncated_fill_ids, None), req=s))
        self.assertEqual(r.device_prefix_len, 0)

    def test_a_span_names_an_out_of_range_id_by_its_index_in_the_key(self):
        c = RadixKvCache.create_simulated()
        ins(c, key([1, 2, 3]), [10, 11, 12])
        for tokens in (array("q", [1, 2, 1 << 33, 4]), [1, 2, 1 << 33, 4], torch.tensor([1, 2, -5, 4])):
            with self.subTest(kind=type(tokens).__name__):
                with self.assertRaisesRegex(ValueError, r"tokens\[2\] = (8589934592|-5) is out of range"):
                    match(c, RadixKey(tokens))
        # Within the key's limit, the id past it is not read.
        r = match(c, RadixKey(array("q", [1, 2, 1 << 33]), limit=2))
        self.assertEqual(r.device_prefix_len, 2)
        self.assertEqual(c.path_device_indices(r.last_device_node).tolist(), [10, 11])

    def test_a_refused_checkpoint_leaves_the_request_its_lock(self):
        alloc = Allocator()
        c = RadixKvCache.create_simulated(mock_allocator=alloc)
        ins(c, key([1, 2, 3]), [50, 51, 52])

        class Pool:
            req_to_token = torch.tensor([[50, 51, 52, -1]], dtype=torch.int32)

        c.req_to_token_pool = Pool()
        req = SimpleNamespace(
            full_untruncated_fill_ids=array("q", [1, 2, 3, 4]),
            kv=SimpleNamespace(req_pool_idx=0, cache_protected_len=3, cache_inserted_len=0, swa_evict_floor=0),
            extra_key=None, cache_salt=None, priority=None, lock=None, last_node=None,
        )
        req.last_node = match(c, key([1, 2, 3, 4])).last_device_node
        req.lock = c.lock(req.last_node)
        self.assertEqual(c.protected_size(), 3)
        with self.assertRaisesRegex(ValueError, r"value\[3\] = -1 is out of range"):
            c.checkpoint(req, up_to=4)
        self.assertEqual((c.protected_size(), c.total_size()), (3, 3))
        c.unlock(req.lock)
        self.assertEqual(c.protected_size(), 0)
        c.sanity_check()

    def test_events_are_sglangs_objects_with_sglangs_hashes(self):
        for page in (1, 2, 4):
            alloc = Allocator()
            sg = RadixCache.create_simulated(mock_allocator=alloc, page_size=page, enable_kv_cache_events=True)
            rk = RadixKvCache.create_simulated(mock_allocator=Allocator(), page_size=page, enable_kv_cache_events=True)
            for c in (sg, rk):
                ins(c, key([1, 2, 3, 4, 5, 6, 7, 8]))
                ins(c, key([1, 2, 3, 4, 9, 10, 11, 12]))
            a, b = sg.take_events(), rk.take_events()
            self.assertEqual([type(e) for e in b], [type(e) for e in a], page)
            stored = lambda evs: [(e.block_hashes, e.parent_block_hash, list(e.token_ids)) for e in evs if isinstance(e, BlockStored)]  # noqa: E731
            self.assertEqual(stored(b), stored(a), page)
            for c in (sg, rk):
                c.evict(EvictParams(num_tokens=100))
            removed = lambda evs: sorted(h for e in evs if isinstance(e, BlockRemoved) for h in e.block_hashes)  # noqa: E731
            self.assertEqual(removed(rk.take_events()), removed(sg.take_events()), page)
        rk.reset()
        self.assertIsInstance(rk.take_events()[-1], AllBlocksCleared)
        self.assertEqual(RadixKvCache.create_simulated().take_events(), [])

    def test_priority_from_insert_params(self):
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams

        alloc = Allocator()
        c = RadixKvCache(CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=alloc,
                                         page_size=1, eviction_policy="priority"))
        for tokens, values, prio in (([1, 2], [10, 11], 9), ([5, 6], [20, 21], 1), ([8, 9], [30, 31], 5)):
            c.insert(InsertParams(key=key(tokens), value=torch.tensor(values), priority=prio))
        c.evict(EvictParams(num_tokens=1))
        self.assertEqual(sorted(alloc.freed), [20, 21])
        c.evict(EvictParams(num_tokens=1))
        self.assertEqual(sorted(alloc.freed), [20, 21, 30, 31])

    def test_eviction_policy_and_registration(self):
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.registry import get_radix_cache_factory

        import radixkv.sglang

        params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=None,
                                 page_size=1, eviction_policy="FIFO")
        self.assertEqual(RadixKvCache(params)._policy, "fifo")
        with self.assertRaisesRegex(ValueError, "Unknown eviction policy"):
            RadixKvCache(CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=None,
                                         page_size=1, eviction_policy="random"))
        with self.assertRaisesRegex(ValueError, "no 'tlru' eviction policy"):
            RadixKvCache(CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=None,
                                         page_size=1, eviction_policy="tlru"))
        for policy in ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru"):
            p = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=None,
                                page_size=1, eviction_policy=policy)
            self.assertEqual(RadixKvCache(p)._policy, policy)
        radixkv.sglang.register()
        factory = get_radix_cache_factory("radixkv")
        self.assertIsNotNone(factory)
        self.assertIsInstance(factory(SimpleNamespace(params=params)), RadixKvCache)
        self.assertFalse(radixkv.sglang.register())  # once


if __name__ == "__main__":
    unittest.main()
