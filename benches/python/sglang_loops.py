#!/usr/bin/env python3
"""What separates the loops (BENCHMARKS.md): SGLang's RadixCache against RadixKvCache
(whichever radixkv is importable: put an older build first on PYTHONPATH to compare it) in
three loops on the Mooncake trace, unlimited and at 2,000,000 tokens, interleaved, medians:
the project's earlier bench loop (match_prefix, insert; at 2M also inc_lock_ref, evict,
dec_lock_ref), with and without a collection of garbage before each timed run; the loop of
issue 30's independent replay (match, lock, evict when short, insert with prev_prefix_len,
unlock); and sglang_replay.py's scheduler loop.

    PYTHON benches/python/sglang_loops.py [ROUNDS]
"""
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_replay as s  # noqa: E402
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
import radixkv
from radixkv.sglang import RadixKvCache
print("radixkv from", os.path.dirname(radixkv.__file__))

class Pool:
    device = torch.device("cpu")
    def __init__(self, cap): self.free = cap
    def free_segment(self, v, start_pos=0): self.free += len(v)

def old_loop(make, keys, values, cap, gcc):
    pool = Pool(cap or 0); cache = make(pool); hits = 0
    if gcc: gc.collect()
    t0 = time.perf_counter()
    for key, value in zip(keys, values):
        r = cache.match_prefix(MatchPrefixParams(key=key)); m = r.device_prefix_len; hits += m
        if cap is None:
            cache.insert(InsertParams(key=key, value=value)); continue
        node = r.last_device_node; cache.inc_lock_ref(node)
        need = len(value) - m
        if pool.free < need: cache.evict(EvictParams(num_tokens=need - pool.free))
        res = cache.insert(InsertParams(key=key, value=value)); pool.free -= len(value) - res.prefix_len
        cache.dec_lock_ref(node)
    return time.perf_counter() - t0, hits

def indep_loop(make, keys, values, cap, gcc):
    """match, lock, evict when short, insert with prev_prefix_len, unlock (always)."""
    pool = Pool(cap if cap is not None else 1 << 40); cache = make(pool); hits = 0
    if gcc: gc.collect()
    t0 = time.perf_counter()
    for key, value in zip(keys, values):
        r = cache.match_prefix(MatchPrefixParams(key=key)); m = r.device_prefix_len; hits += m
        node = r.last_device_node; cache.inc_lock_ref(node)
        need = len(value) - m
        if pool.free < need: cache.evict(EvictParams(num_tokens=need - pool.free))
        res = cache.insert(InsertParams(key=key, value=value, prev_prefix_len=m)); pool.free -= len(value) - res.prefix_len
        cache.dec_lock_ref(node)
    return time.perf_counter() - t0, hits

torch.set_num_threads(1)
reqs = s.load(s.DEFAULT_TRACE)
keys = [RadixKey(t) for t in reqs]
values, off = [], 0
for t in reqs:
    values.append(torch.arange(off, off + len(t), dtype=torch.int64)); off += len(t)
width = max(map(len, reqs)); idx = torch.arange(off)
sg = lambda pool: RadixCache.create_simulated(mock_allocator=pool, page_size=1)
rk = lambda pool: RadixKvCache.create_simulated(mock_allocator=pool, page_size=1)
runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
print("load", os.getloadavg())
for cap in (None, s.CAPACITY):
    for name, fn in (
        ("old bench loop, no gc.collect", lambda mk: old_loop(mk, keys, values, cap, False)),
        ("old bench loop, gc.collect before", lambda mk: old_loop(mk, keys, values, cap, True)),
        ("independent loop", lambda mk: indep_loop(mk, keys, values, cap, True)),
        ("scheduler loop", None),
    ):
        t = {"sg": [], "rk": []}; h = {}
        for r in range(runs + 1):
            for tag, mk in ((("sg", sg), ("rk", rk)) if r % 2 == 0 else (("rk", rk), ("sg", sg))):
                if fn is None:
                    m2 = s.make_radix if tag == "sg" else s.make_radixkv
                    sec, hits, _ = s.scheduler_loop(m2, reqs, cap, width, idx)
                else:
                    sec, hits = fn(mk)
                if r: t[tag].append(sec)
                h[tag] = hits
        a, b = statistics.median(t["sg"]), statistics.median(t["rk"])
        print(f"cap {cap}: {name:<36} RadixCache {a:.3f} s  RadixKvCache {b:.3f} s  {a / b:.2f}x  hits {h['sg']:,} {'=' if h['sg'] == h['rk'] else '!='} {h['rk']:,}")
print("load", os.getloadavg())
