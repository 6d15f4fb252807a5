#!/usr/bin/env python3
"""Per eviction policy, radixkv's hit count against SGLang's own RadixCache on the Mooncake
trace at a 2,000,000-token capacity: the loop sglang_replay.py ran before 2026-12-02 (its
``sglang_loop``: match_prefix, inc_lock_ref, evict the shortfall, insert, dec_lock_ref),
SGLang's own key and value types, one run each (hit counts are deterministic; nothing is timed).

    PYTHON benches/python/sglang_policies.py [TRACE] [--policies lru,lfu,...] [--capacity N]

PYTHON needs sglang 0.5.23, torch and radixkv installed (scripts/sglang-check makes such a
venv). Prints one line per policy: SGLang's hits, radixkv's, and the difference.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from array import array

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

from radixkv.sglang import RadixKvCache  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sglang_replay import DEFAULT_TRACE, CountingPool, load, sglang_loop  # noqa: E402

POLICIES = ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"]


def make(cls, policy):
    def build(pool):
        return cls(
            CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=pool,
                page_size=1,
                eviction_policy=policy,
            )
        )

    return build


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", default=DEFAULT_TRACE)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--capacity", type=int, default=2_000_000)
    a = ap.parse_args()
    reqs = load(a.trace)
    keys = [RadixKey(array("q", t)) for t in reqs]
    values, nxt = [], 0
    for t in reqs:
        values.append(torch.arange(nxt, nxt + len(t), dtype=torch.int64))
        nxt += len(t)
    print(f"{a.trace}: {len(reqs)} requests, capacity {a.capacity:,} tokens, page 1")
    print(f"  {'policy':<9} {'SGLang hits':>14} {'radixkv hits':>14} {'difference':>12}  (s: SGLang, radixkv)")
    for p in a.policies.split(","):
        t0 = time.perf_counter()
        _, sg, _ = sglang_loop(make(RadixCache, p), keys, values, a.capacity)
        t1 = time.perf_counter()
        _, rk, _ = sglang_loop(make(RadixKvCache, p), keys, values, a.capacity)
        t2 = time.perf_counter()
        d = rk - sg
        print(f"  {p:<9} {sg:>14,} {rk:>14,} {d:>+12,}  ({t1 - t0:.1f}, {t2 - t1:.1f})", flush=True)


if __name__ == "__main__":
    main()
