"""radixkv.sglang.RadixKvHiCache: SGLang HiCache's host tier where it maps (SGLang's own
MatchResult / InitLoadBackParams / InsertParams / EvictParams). Needs SGLang 0.5.x and
torch (skipped without them)."""

import struct
import unittest
from array import array

try:
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import (
        EvictParams,
        InitLoadBackParams,
        InsertParams,
        MatchPrefixParams,
        MatchResult,
    )
    from sglang.srt.mem_cache.radix_cache import RadixKey

    from radixkv import KvLayout
    from radixkv.sglang import RadixKvHiCache

    HAVE_SGLANG = True
except ImportError:  # SGLang is optional
    HAVE_SGLANG = False

P = 4


def pattern(t, layer, v):
    return struct.pack("<I", (t * 2654435761 + layer * 7 + v) & 0xFFFFFFFF) * 2


@unittest.skipUnless(HAVE_SGLANG, "needs SGLang and torch")
class HiCacheMapping(unittest.TestCase):
    def make(self, policy, **kw):
        return RadixKvHiCache(
            page_size=P,
            device_slots=32,
            hicache_ratio=2.0,
            hicache_write_policy=policy,
            load_back_threshold=4,
            copier="host",
            kv_layout=KvLayout(2, 1, 2, 4),
            **kw,
        )

    def request(self, c, toks, extra_key=None):
        key = RadixKey(array("q", toks), extra_key)
        m = c.match_prefix(MatchPrefixParams(key=key))
        self.assertIsInstance(m, MatchResult)
        node = m.last_device_node
        c.inc_lock_ref(node)
        fresh = c.alloc(len(toks) - m.device_prefix_len)
        for i, s in enumerate(fresh.tolist() if c.cache.host.kv_layout else []):
            t = toks[m.device_prefix_len + i]
            for layer in range(2):
                c.cache.write_slot(s, layer, pattern(t, layer, 0), pattern(t, layer, 1))
        value = torch.cat([node.device_indices, fresh])
        r = c.insert(InsertParams(key=key, value=value))
        c.dec_lock_ref(node)
        return r.prefix_len

    def test_host_hit_length_and_init_load_back_under_each_policy(self):
        for policy in ("write_through", "write_through_selective", "write_back"):
            with self.subTest(policy=policy):
                c = self.make(policy)
                toks = list(range(100, 116))
                self.request(c, toks)
                if policy == "write_through_selective":
                    self.assertEqual(self.request(c, toks), 16)
                c.check_hicache_events()
                c.evict(EvictParams(num_tokens=1 << 30))
                self.assertEqual(c.total_size(), 0)
                self.assertEqual(c.host_size(), 16)
                key = RadixKey(array("q", toks + [7]), None)
                m = c.match_prefix(MatchPrefixParams(key=key))
                self.assertEqual((m.device_prefix_len, m.host_hit_length), (0, 16))
                r = c.init_load_back(
                    InitLoadBackParams(best_match_node=m.best_match_node, host_hit_length=m.host_hit_length)
                )
                self.assertIsNotNone(r)
                loaded, node = r
                self.assertEqual(loaded, 16)
                self.assertEqual(node.device_indices.dtype, torch.int64)
                self.assertEqual(len(node.device_indices), 16)
                for s, t in zip(node.device_indices.tolist(), toks):
                    self.assertEqual(c.cache.read_slot(s, 1), (pattern(t, 1, 0), pattern(t, 1, 1)))
                self.assertEqual(c.protected_size(), 16)  # pinned until inc_lock_ref takes over
                c.inc_lock_ref(node)
                c.dec_lock_ref(node)
                self.assertEqual(c.protected_size(), 0)
                m = c.match_prefix(MatchPrefixParams(key=key))
                self.assertEqual((m.device_prefix_len, m.host_hit_length), (16, 0))
                c.sanity_check()

    def test_short_hit_is_not_loaded_and_a_full_device_returns_none(self):
        c = RadixKvHiCache(page_size=P, device_slots=16, hicache_size_tokens=32,
                           hicache_write_policy="write_through", load_back_threshold=8)
        toks = list(range(16))
        self.request(c, toks)
        c.evict(EvictParams(num_tokens=1 << 30))
        self.request(c, toks[:12])  # 12 of 16 back on the device
        m = c.match_prefix(MatchPrefixParams(key=RadixKey(array("q", toks), None)))
        self.assertEqual((m.device_prefix_len, m.host_hit_length), (12, 4))
        r = c.init_load_back(InitLoadBackParams(best_match_node=m.best_match_node, host_hit_length=4))
        self.assertEqual(r[0], 0)  # below load_back_threshold
        self.assertIs(r[1], m.best_match_node)
        c2 = RadixKvHiCache(page_size=P, device_slots=16, hicache_size_tokens=32,
                            hicache_write_policy="write_through", load_back_threshold=1)
        self.request(c2, toks)
        c2.evict(EvictParams(num_tokens=1 << 30))
        self.request(c2, toks[:8])
        m = c2.match_prefix(MatchPrefixParams(key=RadixKey(array("q", toks), None)))
        c2.inc_lock_ref(m.last_device_node)
        held = c2.alloc(8)
        r = c2.init_load_back(InitLoadBackParams(best_match_node=m.best_match_node, host_hit_length=8))
        self.assertIsNone(r)  # retry admission
        c2.free(held)
        c2.dec_lock_ref(m.last_device_node)
        c2.sanity_check()

    def test_extra_key_is_a_namespace(self):
        c = self.make("write_through")
        toks = list(range(8))
        self.request(c, toks, extra_key="lora-a")
        m = c.match_prefix(MatchPrefixParams(key=RadixKey(array("q", toks), None)))
        self.assertEqual(m.device_prefix_len, 0)
        m = c.match_prefix(MatchPrefixParams(key=RadixKey(array("q", toks), "lora-a")))
        self.assertEqual(m.device_prefix_len, 8)

    def test_bad_write_policy_is_refused(self):
        import radixkv

        with self.assertRaises(radixkv.InvalidArgumentError):
            RadixKvHiCache(page_size=1, device_slots=8, hicache_write_policy="write_around")
