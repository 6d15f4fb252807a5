"""radixkv as the tree core of SGLang 0.5.23's UnifiedRadixCache (radixkv.sglang's tree core
``radixkv``): registration, selection, the logged fallback to SGLang's Python core, the host
tier refused, and a differential against SGLang's Python core through the whole cache.
Needs SGLang 0.5.23 and torch (skipped without them; scripts/sglang-treecore-check runs
these)."""

import logging
import random
import unittest
from array import array
from unittest import mock

try:
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_cache.tree_core_registry import (
        _TREE_CORE_REGISTRY,
        get_tree_core_factory,
        register_tree_core_backend,  # noqa: F401  (0.5.23's pluggable tree cores)
    )
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

    import radixkv.sglang as rs
    from radixkv._sglang_tree_core import RadixKvTreeCore

    HAVE_SGLANG = True
except ImportError:  # SGLang (0.5.23, with pluggable tree cores) is optional
    HAVE_SGLANG = False

try:  # the unified-cache test kit (fixtures that build real pools and allocators)
    from sglang.test.kits.unified_radix_cache import fixtures as kit
    from sglang.test.kits.unified_radix_cache.config import CacheConfig

    HAVE_KIT = HAVE_SGLANG
except Exception:
    HAVE_KIT = False


def build(page_size=1, components=None, backend="radixkv", kv_size=256, mamba_chunk=None, **kw):
    """A UnifiedRadixCache from SGLang's kit, on the CPU, with ``backend``'s production
    factory (the kit swaps in inspectors only for its own python and rust); ``mamba_chunk``:
    the Mamba cache chunk (the kit's default: 64 tokens, or the page)."""
    cfg = CacheConfig(page_size=page_size, kv_size=kv_size, **kw) if components is None else CacheConfig(
        page_size=page_size, components=components, kv_size=kv_size, **kw
    )
    with mock.patch.object(kit, "get_device", lambda *a, **k: "cpu"), mock.patch.object(
        kit, "UnifiedTreeCoreInspectionInterface", object
    ):
        cache, alloc, _ = kit.build_fixture(cfg, tree_core_backend=backend, mamba_cache_chunk_size=mamba_chunk)
    return cache, alloc


@unittest.skipUnless(HAVE_SGLANG, "needs SGLang 0.5.23 and torch")
class Registration(unittest.TestCase):
    def test_registered_once_and_idempotent(self):
        self.assertIs(get_tree_core_factory("radixkv"), rs.tree_core_factory)
        self.assertFalse(rs.register_tree_core())  # again: no error, no second entry
        import importlib

        importlib.reload(rs)  # a re-import registers nothing twice
        self.assertEqual(list(_TREE_CORE_REGISTRY).count("radixkv"), 1)

    def test_importing_radixkv_imports_no_sglang_and_registers_once_sglang_loads(self):
        import subprocess
        import sys

        code = (
            "import sys, radixkv\n"
            "assert 'torch' not in sys.modules and 'sglang' not in sys.modules, 'imported eagerly'\n"
            "from sglang.srt.mem_cache.unified_cache.tree_core_registry import get_tree_core_factory\n"
            "import radixkv.sglang as rs\n"
            "assert get_tree_core_factory('radixkv') is rs.tree_core_factory\n"
        )
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])

    def test_the_plugin_entry_point_registers_the_tree_core_too(self):
        with mock.patch.dict(_TREE_CORE_REGISTRY, clear=False):
            _TREE_CORE_REGISTRY.pop("radixkv")
            rs.register()
            self.assertIsNotNone(get_tree_core_factory("radixkv"))


@unittest.skipUnless(HAVE_KIT, "needs SGLang 0.5.23's unified-cache test kit")
class Selection(unittest.TestCase):
    def test_tree_core_backend_selects_radixkv(self):
        cache, _ = build()
        self.assertEqual(cache._tree_core_backend, "radixkv")
        self.assertIsInstance(cache.tree_core, RadixKvTreeCore)

    def test_the_environment_variable_selects_radixkv(self):
        from sglang.srt.environ import envs

        # The kit reads its own TREE_CORE_TEST_BACKEND first ("python"): off, so that the
        # environment variable decides, as in a server.
        with envs.SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND.override("radixkv"), mock.patch.object(
            kit, "TREE_CORE_TEST_BACKEND", None
        ):
            cache, _ = build(backend=None)
        self.assertIsInstance(cache.tree_core, RadixKvTreeCore)

    def test_unsupported_configurations_fall_back_with_a_warning(self):
        cases = {
            "policy": dict(eviction_policy="lfu"),
            "MAMBA+policy": dict(components=(ComponentType.FULL, ComponentType.MAMBA), eviction_policy="lfu"),
        }
        for name, kw in cases.items():
            with self.subTest(name), self.assertLogs("radixkv.sglang", logging.WARNING) as logs:
                cache, _ = build(**kw)
            self.assertIsInstance(cache.tree_core, UnifiedTreeCore)
            self.assertIn("using SGLang's Python UnifiedTreeCore instead", logs.output[0])

    def test_swa_configurations_run_natively(self):
        with self.assertNoLogs("radixkv.sglang", logging.WARNING):
            cache, _ = build(components=(ComponentType.FULL, ComponentType.SWA), sliding_window_size=4)
        self.assertIsInstance(cache.tree_core, RadixKvTreeCore)
        self.assertEqual(cache.tree_core.sliding_window_size, 4)

    def test_mamba_configurations_run_natively(self):
        cases = {
            "MAMBA": dict(components=(ComponentType.FULL, ComponentType.MAMBA)),
            "SWA+MAMBA": dict(
                components=(ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA), sliding_window_size=128
            ),
            # SGLang's core keys a Mamba tree by tokens even under EAGLE (no bigram keys).
            "MAMBA+EAGLE": dict(components=(ComponentType.FULL, ComponentType.MAMBA), is_eagle=True),
        }
        for name, kw in cases.items():
            with self.subTest(name), self.assertNoLogs("radixkv.sglang", logging.WARNING):
                cache, _ = build(**kw)
                self.assertIsInstance(cache.tree_core, RadixKvTreeCore)
                py, _ = build(backend="python", **kw)
                self.assertFalse(py.tree_core.is_eagle)

    def test_a_host_tier_switched_on_later_is_refused(self):
        cache, _ = build()
        with self.assertRaises(NotImplementedError):
            cache.tree_core.set_hicache_enabled()
        with self.assertRaises(NotImplementedError):
            cache.tree_core.enable_storage = True
        self.assertFalse(cache.tree_core.enable_storage)


def _workload(seed, n, page_size):
    """Requests sharing prefixes: a few system prompts, branching conversations."""
    rng = random.Random(seed)
    stems = [[rng.randrange(1, 50) for _ in range(rng.randrange(1, 5) * page_size)] for _ in range(4)]
    history = []
    out = []
    for _ in range(n):
        if history and rng.random() < 0.5:
            base = list(rng.choice(history))
            base = base[: rng.randrange(0, len(base) + 1)]
        else:
            base = list(rng.choice(stems))
        toks = base + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 4 * page_size))]
        history.append(toks)
        out.append(toks)
    return out


def _replay(cache, alloc, reqs):
    """The scheduler's loop: match, lock, evict when short, alloc, insert with
    prev_prefix_len, unlock; what every step saw."""
    seen = []
    for toks in reqs:
        key = RadixKey(array("q", toks))
        m = cache.match_prefix(MatchPrefixParams(key=key))
        n = m.device_prefix_len
        lock = cache.lock(m.last_device_node)
        prefix = cache.tree_core.collect_full_device_indices(m.last_device_node, cache.root_node_handle()) if n else None
        need = len(toks) - n
        evicted = 0
        if alloc.available_size() < need:
            evicted = cache.evict(EvictParams(num_tokens=need - alloc.available_size())).num_tokens_evicted
        new = alloc.alloc(need)
        if new is None:  # the pool cannot hold it even after eviction: skip it
            cache.unlock(lock)
            seen.append((n, evicted, None))
            continue
        value = torch.cat([prefix[:n], new]) if n else new
        res = cache.insert(InsertParams(key=RadixKey(array("q", toks)), value=value, prev_prefix_len=n))
        # What the tree did not take (an unaligned tail) goes back to the pool.
        aligned = len(toks) // cache.page_size * cache.page_size
        if aligned < len(toks):
            alloc.free(value[aligned:])
        cache.unlock(lock)
        seen.append((n, evicted, res.prefix_len, cache.evictable_size(), cache.protected_size(), alloc.available_size()))
        cache.tree_core.sanity_check([], [])
    return seen


def _alloc_swa(alloc, need, page_size):
    """The kit's SWA allocation for pages (SWA's alloc asserts page 1): whole pages on both
    pools, the FULL->SWA mapping set; None when either pool is short."""
    if page_size == 1:
        return alloc.alloc(need)
    if need > alloc.full_attn_allocator.available_size() or need > alloc.swa_attn_allocator.available_size():
        return None
    full = alloc.full_attn_allocator.alloc(need)
    swa = alloc.swa_attn_allocator.alloc(need)
    alloc.full_to_swa_index_mapping[full] = swa
    return full


def _replay_swa(cache, alloc, reqs, window):
    """The scheduler's loop for [FULL, SWA]: as _replay, with both pools' shortfalls
    evicted and what every step saw of SWA too (valid match, branching point, SWA sizes,
    both free pools). Requests are cut to whole pages (paged SWA allocation). SWA is put
    under pressure of its own, as in a server: a third of its pool is held elsewhere (so
    SWA runs short before FULL and its walk makes tombstones), and every other request has
    freed its SWA slots behind its window before it is inserted (its evicted seqlen: the
    insert leaves tombstones and frees FULL only there)."""
    ps = cache.page_size
    tc = cache.tree_core
    held = alloc.swa_attn_allocator.alloc(alloc.swa_attn_allocator.available_size() // 3 // ps * ps)
    assert held is not None
    seen = []
    for i, toks in enumerate(reqs):
        toks = toks[: len(toks) // ps * ps]
        if not toks:
            continue
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", toks))))
        n = m.device_prefix_len
        lock = cache.lock(m.last_device_node)
        prefix = tc.collect_full_device_indices(m.last_device_node, cache.root_node_handle()) if n else None
        need = len(toks) - n
        evicted = None
        fa, sa = alloc.full_available_size(), alloc.swa_available_size()
        if fa < need or sa < need:
            r = cache.evict(EvictParams(num_tokens=max(0, need - fa), swa_num_tokens=max(0, need - sa)))
            evicted = (r.num_tokens_evicted, r.swa_num_tokens_evicted)
        new = _alloc_swa(alloc, need, ps) if need else torch.empty((0,), dtype=torch.int64)
        if new is None:
            cache.unlock(lock)
            seen.append((n, evicted, None))
            continue
        value = torch.cat([prefix[:n], new]) if n else new
        params = InsertParams(key=RadixKey(array("q", toks)), value=value, prev_prefix_len=n)
        behind = (len(toks) - window) // ps * ps
        if i % 2 and behind > n:
            alloc.free_swa(value[n:behind])
            params.set_evicted_seqlen(ComponentType.SWA, behind)
        res = cache.insert(params)
        cache.unlock(lock)
        seen.append(
            (
                n,
                m.full_kv_hit_length,
                m.swa_branching_seqlen,
                evicted,
                res.prefix_len,
                tc.evictable_size(),
                tc.protected_size(),
                tc.swa_evictable_size(),
                tc.swa_protected_size(),
                alloc.full_available_size(),
                alloc.swa_available_size(),
            )
        )
        tc.sanity_check([], [])
    return seen


def _swa_configs():
    """The kit's [FULL, SWA] configs (page size, window, pool size)."""
    from sglang.test.kits.unified_radix_cache.config import CONFIGS

    return [
        (c.page_size, c.sliding_window_size, c.kv_size)
        for c in CONFIGS
        if tuple(c.components) == (ComponentType.FULL, ComponentType.SWA)
    ]


@unittest.skipUnless(HAVE_KIT, "needs SGLang 0.5.23's unified-cache test kit")
class SwaAgainstSGLangsPythonCore(unittest.TestCase):
    def test_identical_hits_evictions_and_sizes_at_every_step(self):
        configs = _swa_configs()
        self.assertTrue(configs)
        for ps, window, kv in configs:
            for seed in range(3):
                with self.subTest(page_size=ps, window=window, seed=seed):
                    # A pool of about 24 pages: small enough to evict in every config.
                    pool = min(kv, 24 * ps)
                    reqs = _workload(seed, 150, ps)
                    got = {}
                    for backend in ("python", "radixkv"):
                        cache, alloc = build(
                            page_size=ps,
                            components=(ComponentType.FULL, ComponentType.SWA),
                            sliding_window_size=window,
                            backend=backend,
                            kv_size=pool,
                        )
                        self.assertEqual(isinstance(cache.tree_core, RadixKvTreeCore), backend == "radixkv")
                        got[backend] = _replay_swa(cache, alloc, reqs, window)
                    self.assertEqual(got["python"], got["radixkv"])
                    self.assertTrue(any(s[1] for s in got["python"] if len(s) == 3 or s[3]))  # it evicts
                    # SWA tombstones happen: a FULL hit past the last valid window.
                    self.assertTrue(any(len(s) > 3 and s[2] is not None for s in got["python"]))

    def test_early_window_release_and_locks_are_sglangs(self):
        ps, window = 1, 4
        reqs = _workload(5, 60, ps)
        seen = {}
        for backend in ("python", "radixkv"):
            cache, alloc = build(
                page_size=ps, components=(ComponentType.FULL, ComponentType.SWA), sliding_window_size=window,
                backend=backend, kv_size=4096,
            )
            _replay_swa(cache, alloc, reqs, window)
            tc = cache.tree_core
            steps = []
            for toks in reqs[:15]:
                m = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", toks))))
                lock = cache.lock(m.last_device_node)
                steps.append((m.device_prefix_len, tc.swa_evictable_size(), tc.swa_protected_size(), tc.evictable_size()))
                cache.release_swa(lock)  # the request's window moved past its prefix
                steps.append((tc.swa_evictable_size(), tc.swa_protected_size(), tc.evictable_size(), alloc.swa_available_size()))
                cache.unlock(lock)
                steps.append((tc.swa_evictable_size(), tc.swa_protected_size(), tc.evictable_size(), tc.protected_size()))
                tc.sanity_check([], [])
            seen[backend] = steps
        self.assertEqual(seen["python"], seen["radixkv"])
        self.assertTrue(any(s[1] for s in seen["python"][0::3]))  # windows were locked


    def test_tombstone_ranges_and_window_attach_are_sglangs(self):
        ps, window = 4, 4
        reqs = _workload(2, 120, ps)
        seen = {}
        for backend in ("python", "radixkv"):
            cache, alloc = build(
                page_size=ps, components=(ComponentType.FULL, ComponentType.SWA), sliding_window_size=window,
                backend=backend, kv_size=24 * ps,
            )
            _replay_swa(cache, alloc, reqs, window)
            tc = cache.tree_core
            keys = [RadixKey(array("q", t[: len(t) // ps * ps])) for t in reqs[-40:]]
            ranges = [tc.swa_tombstone_ranges(k, 0, len(k)) for k in keys]
            attached = []
            for k, rs in zip(keys, ranges):
                for lo, hi in tc.swa_tombstone_ranges(k, 0, len(k)):  # afresh: earlier attaches count
                    tc.attach_swa_window(k, lo, hi, torch.arange(1000 + lo, 1000 + hi, dtype=torch.int64))
                    attached.append((lo, hi, tc.swa_evictable_size()))
                    break
            after = [tc.swa_tombstone_ranges(k, 0, len(k)) for k in keys]
            tc.sanity_check([], [])
            seen[backend] = (ranges, attached, after)
        self.assertEqual(seen["python"], seen["radixkv"])
        self.assertTrue(any(seen["python"][0]) and seen["python"][1])  # tombstones were there, and filled


def _replay_mamba(cache, alloc, reqs, free_states, window=None, release_every=0, inflight=3):
    """The scheduler's loop for [FULL, MAMBA] and [FULL, SWA, MAMBA]: as _replay (and
    _replay_swa's SWA pressure when ``window``), each request also holding a Mamba state
    slot of its own, handed to the tree at insert (freed again when the tree kept the state
    it had: ``mamba_exist``). The Mamba pool is starved: all but ``free_states`` slots are
    held elsewhere, so the tree's states are evicted (the Mamba walk: leaves whole, other
    nodes made Mamba tombstones) all the time. Every ``release_every``-th request releases
    its window early (SWA's and Mamba's locks) before it is cached. A request keeps its lock
    until ``inflight`` later requests have been served (a batch in flight: the walks meet
    locked states and paths). What every step saw, Mamba's too (branching point,
    ``mamba_exist``, Mamba sizes and free slots)."""
    ps = cache.page_size
    tc = cache.tree_core
    ma = cache.req_to_token_pool.mamba_allocator
    held_states = ma.alloc(ma.available_size() - free_states)
    assert held_states is not None
    if window is not None:  # half the SWA pool held elsewhere: SWA runs short first
        held = alloc.swa_attn_allocator.alloc(alloc.swa_attn_allocator.available_size() // 2 // ps * ps)
        assert held is not None
    seen = []
    locks = []
    for i, toks in enumerate(reqs):
        toks = toks[: len(toks) // ps * ps]
        if not toks:
            continue
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", toks))))
        n = m.device_prefix_len
        lock = cache.lock(m.last_device_node)
        locks.append(lock)
        if len(locks) > inflight:
            cache.unlock(locks.pop(0))
        prefix = tc.collect_full_device_indices(m.last_device_node, cache.root_node_handle()) if n else None
        need = len(toks) - n
        evicted = None
        if window is None:
            if alloc.available_size() < need:
                r = cache.evict(EvictParams(num_tokens=need - alloc.available_size()))
                evicted = (r.num_tokens_evicted, r.mamba_num_evicted)
            new = alloc.alloc(need) if need else torch.empty((0,), dtype=torch.int64)
        else:
            fa, sa = alloc.full_available_size(), alloc.swa_available_size()
            if fa < need or sa < need:
                r = cache.evict(EvictParams(num_tokens=max(0, need - fa), swa_num_tokens=max(0, need - sa)))
                evicted = (r.num_tokens_evicted, r.swa_num_tokens_evicted, r.mamba_num_evicted)
            new = _alloc_swa(alloc, need, ps) if need else torch.empty((0,), dtype=torch.int64)
        if new is None:
            seen.append((n, evicted, None))
            continue
        state = ma.alloc(1)
        mamba_evicted = None
        if state is None:  # the request's own state slot: evict a cached one for it
            r = cache.evict(EvictParams(mamba_num=1))
            mamba_evicted = (r.num_tokens_evicted, r.mamba_num_evicted)
            state = ma.alloc(1)
        if state is None:
            alloc.free(new)
            seen.append((n, evicted, mamba_evicted, None))
            continue
        value = torch.cat([prefix[:n], new]) if n else new
        params = InsertParams(key=RadixKey(array("q", toks)), value=value, prev_prefix_len=n, mamba_value=state)
        if window is not None:
            behind = (len(toks) - window) // ps * ps
            if i % 2 and behind > n:
                alloc.free_swa(value[n:behind])
                params.set_evicted_seqlen(ComponentType.SWA, behind)
        if release_every and i % release_every == 0:
            cache.release_swa(lock)
        res = cache.insert(params)
        if res.mamba_exist:
            ma.free(state)
        step = [
            n,
            m.full_kv_hit_length,
            m.mamba_branching_seqlen,
            evicted,
            mamba_evicted,
            res.prefix_len,
            res.mamba_exist,
            tc.evictable_size(),
            tc.protected_size(),
            tc.mamba_evictable_size(),
            tc.mamba_protected_size(),
            ma.available_size(),
            tc.total_size(),
        ]
        if window is None:
            step.append(alloc.available_size())
        else:
            step += [
                m.swa_branching_seqlen,
                tc.swa_evictable_size(),
                tc.swa_protected_size(),
                alloc.full_available_size(),
                alloc.swa_available_size(),
            ]
        seen.append(tuple(step))
        tc.sanity_check([], [])
    for lock in locks:
        cache.unlock(lock)
    seen.append((tc.evictable_size(), tc.protected_size(), tc.mamba_evictable_size(), tc.mamba_protected_size()))
    tc.sanity_check([], [])
    seen.append(sorted(tc.all_mamba_values_flatten().tolist()))
    seen.append(sorted(tc.all_values_flatten().tolist()))
    return seen


def _mamba_workload(seed, n, ps):
    """_workload's requests, a fifth of them coming again (the tree keeps its state:
    ``mamba_exist``) and three in ten a conversation's next turn (a whole earlier request,
    extended: chains of nodes each holding a state, for the path cap)."""
    reqs = _workload(seed, n, ps)
    rng = random.Random(seed + 100)
    for i in range(1, len(reqs)):
        r = rng.random()
        if r < 0.2:
            reqs[i] = reqs[rng.randrange(i)]
        elif r < 0.5:
            prev = reqs[rng.randrange(max(0, i - 8), i)]
            reqs[i] = prev[: len(prev) // ps * ps] + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 3) * ps)]
    return reqs


def _mamba_configs():
    """The kit's Mamba configs (components, page size, window, pool size)."""
    from sglang.test.kits.unified_radix_cache.config import CONFIGS

    return [c for c in CONFIGS if ComponentType.MAMBA in tuple(c.components)]


class _Counts:
    """What the radixkv core's walks did in a replay (the same as SGLang's core did, as
    every step is compared): Mamba walk leaves and Mamba tombstones, SWA tombstones that
    took a Mamba state with them, states the path cap evicted."""

    def __init__(self, tc):
        self.mamba_leaves = self.mamba_tombstones = self.swa_cascades = self.capped = 0
        next_node, excess = tc.evict_device_next_node, tc.evict_excess_path_states

        def counted_next(component_type, tracker):
            r = next_node(component_type, tracker)
            if component_type == ComponentType.MAMBA:
                if r.node_id is not None:
                    self.mamba_leaves += 1
                elif r.device_frees.get(ComponentType.MAMBA):
                    self.mamba_tombstones += 1
            elif component_type == ComponentType.SWA and r.node_id is None and r.device_frees.get(ComponentType.MAMBA):
                self.swa_cascades += 1
            return r

        def counted_excess(tail, device_frees, host_frees, cache_actions):
            before = len(device_frees[ComponentType.MAMBA])
            excess(tail, device_frees, host_frees, cache_actions)
            self.capped += len(device_frees[ComponentType.MAMBA]) - before

        tc.evict_device_next_node = counted_next
        tc.evict_excess_path_states = counted_excess


@unittest.skipUnless(HAVE_KIT, "needs SGLang 0.5.23's unified-cache test kit")
class MambaAgainstSGLangsPythonCore(unittest.TestCase):
    def _run(self, cfg, seed, n=150, cap=None, release_every=0, free_states=4):
        ps = cfg.page_size
        window = cfg.sliding_window_size if ComponentType.SWA in cfg.components else None
        reqs = _mamba_workload(seed, n, ps)
        got, counts = {}, None
        for backend in ("python", "radixkv"):
            cache, alloc = build(
                page_size=ps,
                components=tuple(cfg.components),
                sliding_window_size=cfg.sliding_window_size,
                enable_mamba_extra_buffer=cfg.enable_mamba_extra_buffer,
                backend=backend,
                kv_size=min(cfg.kv_size, 24 * ps),
                max_context_len=cfg.max_context_len,
                # A checkpoint grid of two pages: the workload's prefixes reach it.
                mamba_chunk=2 * ps,
            )
            self.assertEqual(isinstance(cache.tree_core, RadixKvTreeCore), backend == "radixkv")
            if cap is not None:
                cache.components[ComponentType.MAMBA].mamba_max_states_per_path = cap
            if backend == "radixkv":
                counts = _Counts(cache.tree_core)
            got[backend] = _replay_mamba(cache, alloc, reqs, free_states, window, release_every)
        return got, counts

    def test_identical_hits_evictions_and_sizes_at_every_step(self):
        configs = _mamba_configs()
        self.assertEqual(len(configs), 6)
        for cfg in configs:
            total = dict(mamba_leaves=0, mamba_tombstones=0, swa_cascades=0, capped=0)
            steps = []
            for seed in range(3):
                with self.subTest(cfg=cfg.label, seed=seed):
                    got, c = self._run(cfg, seed)
                    self.assertEqual(got["python"], got["radixkv"])
                    steps += [s for s in got["python"][:-3] if len(s) > 4]
                    for k in total:
                        total[k] += getattr(c, k)
            with self.subTest(cfg=cfg.label, what="the workload exercises Mamba"):
                # The walks ran: Mamba leaves and tombstones, FULL evictions; matches
                # stopped short of the FULL hit at a Mamba tombstone (a branching point),
                # and requests found their state already cached.
                self.assertTrue(total["mamba_leaves"] and total["mamba_tombstones"], total)
                self.assertTrue(any(s[3] for s in steps), "no FULL eviction")
                self.assertTrue(any(s[2] is not None for s in steps), "no Mamba branching point")
                self.assertTrue(any(s[6] for s in steps), "no mamba_exist")
                if ComponentType.SWA in cfg.components:
                    self.assertTrue(total["swa_cascades"], total)

    def test_the_path_cap_and_early_window_release_are_sglangs(self):
        for cfg in _mamba_configs():
            swa = ComponentType.SWA in cfg.components
            capped = 0
            for seed in range(2):
                with self.subTest(cfg=cfg.label, seed=seed):
                    got, c = self._run(cfg, seed, n=120, cap=2, release_every=3 if swa else 0, free_states=16)
                    self.assertEqual(got["python"], got["radixkv"])
                    capped += c.capped
            with self.subTest(cfg=cfg.label, what="the cap evicts"):
                self.assertTrue(capped)


@unittest.skipUnless(HAVE_KIT, "needs SGLang 0.5.23's unified-cache test kit")
class AgainstSGLangsPythonCore(unittest.TestCase):
    def test_identical_hits_evictions_and_sizes_at_every_step(self):
        for page_size in (1, 4):
            for seed in range(3):
                with self.subTest(page_size=page_size, seed=seed):
                    reqs = _workload(seed, 150, page_size)
                    got = {}
                    for backend in ("python", "radixkv"):
                        cache, alloc = build(page_size=page_size, backend=backend, kv_size=96)
                        got[backend] = _replay(cache, alloc, reqs)
                    self.assertEqual(got["python"], got["radixkv"])
                    # The workload does evict (else this would compare little).
                    self.assertTrue(any(s[1] for s in got["python"]))

    def test_structure_reads_are_sglangs(self):
        # Node ids differ between cores; what they describe must not.
        reqs = _workload(3, 60, 4)
        seen = {}
        for backend in ("python", "radixkv"):
            cache, alloc = build(page_size=4, backend=backend, kv_size=4096)
            _replay(cache, alloc, reqs)
            tc = cache.tree_core
            nodes = [cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", t)))).last_device_node for t in reqs[:20]]
            lock = cache.lock(nodes[3])
            paths = [[(i.path_start, i.path_end, i.full_value_len, i.num_children) for i in p] for p in tc.collect_path_info(nodes)]
            walks = {}
            for unlocked_only in (False, True):
                w = tc.walk_for_kv_canary(unlocked_only, False)
                walks[unlocked_only] = sorted(zip(w.slot_indices.tolist(), w.positions.tolist(), w.prev_slot_indices.tolist()))
            seen[backend] = (
                paths,
                walks,
                sorted(tc.all_values_flatten().tolist()),
                tc.total_size(),
                (tc.evictable_size(), tc.protected_size()),
            )
            cache.unlock(lock)
        self.assertEqual(seen["python"], seen["radixkv"])
        self.assertNotEqual(seen["python"][1][False], seen["python"][1][True])  # the lock shows

    def test_dfs_weight_order_is_sglangs(self):
        # The scheduler's DFS-weight policy orders waiting requests by their match nodes;
        # node ids differ between cores, the order of the requests must not.
        reqs = _workload(7, 80, 1)
        orders = {}
        for backend in ("python", "radixkv"):
            cache, alloc = build(backend=backend, kv_size=4096)
            _replay(cache, alloc, reqs)
            probes = _workload(8, 40, 1)
            nodes = [cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", t)))).last_device_node for t in probes]
            orders[backend] = cache.dfs_weight_order(nodes)
        self.assertEqual(orders["python"], orders["radixkv"])
        self.assertNotEqual(orders["python"], sorted(orders["python"]))  # not trivially in order


if __name__ == "__main__":
    unittest.main()
