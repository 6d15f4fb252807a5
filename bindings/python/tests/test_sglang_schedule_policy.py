"""The scheduler's seat: SGLang 0.5.23's ``SchedulePolicy`` ordering a waiting queue over
``UnifiedRadixCache`` with the ``radixkv`` tree core, against the same over SGLang's Python
core. Each round the policy matches every waiting request (``match_kv_cache``), runs the
in-batch prefix check and sorts; then the head of the queue is admitted as the scheduler
would (lock its match, insert its tokens with ``prev_prefix_len``, unlock), a batch of three
a round while four arrive, the rest waits.
The order, every request's match (``prefix_len``, ``num_matched_prefix_tokens``, the
deprioritized set) and the cache's sizes (Mamba's too) must be the same for both cores at
every round. With Mamba each admitted request hands the tree a state slot of its own (a
cached state evicted for it when the kit's 20-state pool is dry).
Needs SGLang 0.5.23 and torch (skipped without them; scripts/sglang-treecore-check runs it)."""

import random
import unittest
from array import array
from unittest import mock

try:
    import torch  # noqa: F401
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.test.kits.unified_radix_cache import fixtures as kit
    from sglang.test.kits.unified_radix_cache.config import CacheConfig

    import radixkv.sglang  # noqa: F401  (registers the tree core)

    HAVE_SGLANG = True
except Exception:  # SGLang (0.5.23, with its unified-cache kit) is optional
    HAVE_SGLANG = False


def build(backend, page_size, components, kv_size):
    kw = {"sliding_window_size": 16} if components and ComponentType.SWA in components else {}
    if components is not None:
        kw["components"] = components
    cfg = CacheConfig(page_size=page_size, kv_size=kv_size, **kw)
    with mock.patch.object(kit, "get_device", lambda *a, **k: "cpu"), mock.patch.object(
        kit, "UnifiedTreeCoreInspectionInterface", object
    ):
        cache, alloc, _ = kit.build_fixture(cfg, tree_core_backend=backend)
    return cache, alloc


def make_req(rid, tokens):
    r = Req(
        rid=rid,
        origin_input_text="",
        origin_input_ids=array("q", tokens),
        sampling_params=SamplingParams(temperature=0, max_new_tokens=1),
    )
    r.output_ids = array("q")
    return r


def workload(seed, n, bare=0.0):
    """Prompts over a few shared system prefixes (most above the in-batch check's 32
    tokens), so the queue has long cached matches, short ones and in-batch sharing; a
    ``bare`` share of them the system prefix alone (where a Mamba state can then sit)."""
    rng = random.Random(seed)
    systems = [[rng.randrange(1, 500) for _ in range(rng.choice((24, 48, 80, 128)))] for _ in range(4)]
    out = []
    for i in range(n):
        s = rng.choice(systems)
        cut = len(s) if rng.random() < 0.6 else rng.randrange(0, len(s) + 1)
        tail = [rng.randrange(1, 500) for _ in range(rng.randrange(1, 48))]
        if rng.random() < bare:
            cut, tail = len(s), []
        out.append((f"r{i}", s[:cut] + tail))
    return out


class Side:
    """One core: its cache, allocator, policy and queue."""

    def __init__(self, backend, page_size, components, kv_size, policy):
        self.cache, self.alloc = build(backend, page_size, components, kv_size)
        self.policy = SchedulePolicy(policy, self.cache, False, False, False)
        self.queue = []
        self.page = page_size
        self.deprioritized = set()
        self.evicted = 0
        self.mamba_evicted = 0
        self._capture()

    def round(self):
        """Orders the queue, admits its head; what the scheduler saw."""
        self.deprioritized = set()
        self.policy.calc_priority(self.queue)
        seen = [(r.rid, r.prefix_len, r.num_matched_prefix_tokens) for r in self.queue]
        deprioritized = sorted(self.deprioritized)
        # A prefill batch: the first three in the policy's order.
        for head in self.queue[:3]:
            self.admit(head)
        del self.queue[:3]
        return seen, deprioritized, self.sizes()

    def _capture(self):
        # The in-batch check's verdict (the set the policy sorts with).
        inner = self.policy._compute_prefix_matches

        def compute(queue, policy):
            out = inner(queue, policy)
            self.deprioritized = set(out)
            return out

        self.policy._compute_prefix_matches = compute

    def admit(self, r):
        """The scheduler's admission of ``r`` with the match the policy gave it."""
        tokens = list(r.origin_input_ids)
        n = len(tokens) // self.page * self.page
        if n == 0:
            return
        lock = self.cache.lock(r.last_node)
        prefix = r.prefix_len
        need = n - prefix
        if self.alloc.available_size() < need:
            res = self.cache.evict(EvictParams(num_tokens=need - self.alloc.available_size()))
            self.evicted += res.num_tokens_evicted
        fresh = self.alloc.alloc(need) if need > 0 else None
        if need > 0 and fresh is None:
            self.cache.unlock(lock)
            return
        state = None
        if self.cache.supports_mamba():
            # The request's own Mamba state slot (a cached one evicted for it when the pool
            # is dry), handed to the tree at the insert; freed when the tree kept its own.
            ma = self.cache.req_to_token_pool.mamba_allocator
            state = ma.alloc(1)
            if state is None:
                self.mamba_evicted += self.cache.evict(EvictParams(mamba_num=1)).mamba_num_evicted
                state = ma.alloc(1)
            if state is None:
                if fresh is not None:
                    self.alloc.free(fresh)
                self.cache.unlock(lock)
                return
        tc = self.cache.tree_core
        hit = tc.collect_full_device_indices(r.last_node, self.cache.root_node_handle()) if prefix else None
        value = fresh if not prefix else (torch.cat([hit[:prefix], fresh]) if fresh is not None else hit[:n])
        params = InsertParams(key=RadixKey(array("q", tokens[:n])), value=value, prev_prefix_len=prefix)
        if state is not None:
            params.mamba_value = state
        res = self.cache.insert(params)
        if state is not None and res.mamba_exist:
            self.cache.req_to_token_pool.mamba_allocator.free(state)
        self.cache.unlock(lock)

    def sizes(self):
        out = (self.cache.evictable_size(), self.cache.protected_size(), self.alloc.available_size())
        if self.cache.supports_mamba():
            ma = self.cache.req_to_token_pool.mamba_allocator
            out += (self.cache.mamba_evictable_size(), self.cache.mamba_protected_size(), ma.available_size())
        return out


@unittest.skipUnless(HAVE_SGLANG, "needs SGLang 0.5.23, torch and its unified-cache kit")
class SchedulePolicyOverTheTreeCore(unittest.TestCase):
    def check(self, page_size, components, kv_size, policy, seed, bare=0.0):
        sides = [Side(b, page_size, components, kv_size, policy) for b in ("python", "radixkv")]
        self.assertEqual(type(sides[1].cache.tree_core).__name__, "RadixKvTreeCore")
        reqs = workload(seed, 80, bare)
        long_hits = deprio = 0
        for i, (rid, toks) in enumerate(reqs):
            for s in sides:
                s.queue.append(make_req(rid, toks))
            if i % 4 != 3:
                continue  # the queue builds up: four arrive per batch of three
            got = [s.round() for s in sides]
            self.assertEqual(got[0], got[1], f"round at request {i}: python vs radixkv")
            long_hits += sum(1 for _, p, _ in got[0][0] if p > 32)
            deprio += len(got[0][1])
        while sides[0].queue:
            got = [s.round() for s in sides]
            self.assertEqual(got[0], got[1])
        self.assertEqual(sides[0].evicted, sides[1].evicted)
        self.assertEqual(sides[0].mamba_evicted, sides[1].mamba_evicted)
        self.evicted = sides[0].evicted
        self.mamba_evicted = sides[0].mamba_evicted
        return long_hits, deprio

    def test_lpm_full(self):
        for page in (1, 16):
            for seed in (1, 2):
                with self.subTest(page=page, seed=seed):
                    long_hits, deprio = self.check(page, None, 4096, "lpm", seed)
                    # The workload reaches what the policy decides on.
                    self.assertGreater(long_hits, 0)
                    self.assertGreater(deprio, 0)

    def test_lpm_full_small_pool_evicts(self):
        long_hits, _ = self.check(1, None, 400, "lpm", 3)
        self.assertGreater(long_hits, 0)
        self.assertGreater(self.evicted, 1000)

    def test_dfs_weight_full(self):
        long_hits, _ = self.check(1, None, 4096, "dfs-weight", 4)
        self.assertGreater(long_hits, 0)

    def test_lpm_mamba(self):
        # The kit's Mamba pool (20 states) runs dry: cached states are evicted for new ones.
        long_hits, deprio = self.check(1, (ComponentType.FULL, ComponentType.MAMBA), 4096, "lpm", 6, bare=0.3)
        self.assertGreater(long_hits, 0)
        self.assertGreater(deprio, 0)
        self.assertGreater(self.mamba_evicted, 0)

    def test_lpm_swa(self):
        long_hits, deprio = self.check(1, (ComponentType.FULL, ComponentType.SWA), 4096, "lpm", 5)
        self.assertGreater(long_hits, 0)
        self.assertGreater(deprio, 0)


if __name__ == "__main__":
    unittest.main()
