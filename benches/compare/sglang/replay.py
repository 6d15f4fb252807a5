#!/usr/bin/env python3
"""SGLang's own Python RadixCache on the Mooncake replay and match-only workloads.

Run by `radixkv-compare --sglang-python PYTHON` (see BENCHMARKS.md) with an interpreter that
has `sglang` and `torch` installed; it can also run alone:

    PYTHON benches/compare/sglang/replay.py TRACE RUNS [evict CAPACITY]

Prints one line `RESULT {json}`: the sglang version, the replay times (per request
match_prefix, then insert of the request's tokens with fresh slots as an int64 tensor), the
match-only times over the full tree, and the hit tokens. Like the Rust harness: tokens are
materialized as in docs/contract/CLI.md and each request's slot tensor is made before the timing; one
untimed warm-up run, then RUNS timed runs, a fresh cache for each replay.

With `evict CAPACITY`: workload 4a instead, the engine's cycle under a pool of CAPACITY slots
(a counting stand-in for SGLang's token allocator): per request match_prefix, inc_lock_ref on
its last node, `evict(short)` when the pool has fewer free slots than the request needs (that
call is timed), insert, dec_lock_ref. The JSON has the Rust harness's workload-4a fields.
"""
import json
import sys
import time
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import sglang  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

BLOCK = 512


def load(path):
    reqs = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            v = json.loads(line)
            toks = []
            for h in v["hash_ids"]:
                toks.extend(range(h * BLOCK, h * BLOCK + BLOCK))
            reqs.append(toks[: v["input_length"]])
    return reqs


def percentile(xs, p):
    """Nearest rank, as the Rust harness's `percentile`."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    rank = -(-p * len(xs) // 100)
    return xs[min(max(int(rank), 1), len(xs)) - 1]


class CountingPool:
    """Stands in for SGLang's token-to-KV allocator: counts free slots."""

    device = torch.device("cpu")

    def __init__(self, capacity):
        self.free = capacity

    def free_segment(self, value, start_pos=0):
        self.free += len(value) - start_pos


def evict_run(reqs, slots, cap):
    pool = CountingPool(cap)
    cache = RadixCache.create_simulated(mock_allocator=pool, page_size=1)
    calls, asked, freed = [], [], []
    hits = 0
    t0 = time.perf_counter()
    for t, s in zip(reqs, slots):
        key = RadixKey(t)
        r = cache.match_prefix(MatchPrefixParams(key=key))
        m = r.device_prefix_len
        hits += m
        node = r.last_device_node
        cache.inc_lock_ref(node)
        need = len(t) - m
        if pool.free < need:
            short = need - pool.free
            c0 = time.perf_counter()
            got = cache.evict(EvictParams(num_tokens=short)).num_tokens_evicted
            calls.append(time.perf_counter() - c0)
            asked.append(short)
            freed.append(got)
        res = cache.insert(InsertParams(key=RadixKey(t), value=s))
        # The slots of tokens cached meanwhile are not adopted: only the new ones leave.
        pool.free -= len(t) - res.prefix_len
        cache.dec_lock_ref(node)
    secs = time.perf_counter() - t0
    evicted = sum(freed)
    return {
        "secs": secs, "hits": hits, "calls": len(calls),
        "p50": percentile(calls, 50), "p99": percentile(calls, 99), "max": max(calls, default=0.0),
        "per_node": None, "per_token": sum(calls) / max(evicted, 1), "evicted": evicted,
        "asked50": percentile(asked, 50), "asked99": percentile(asked, 99),
        "freed50": percentile(freed, 50), "freed99": percentile(freed, 99),
    }


def main():
    path, runs = sys.argv[1], int(sys.argv[2])
    reqs = load(path)
    # One fresh slot per token, request after request (as the Rust harness hands them out).
    slots, off = [], 0
    for t in reqs:
        slots.append(torch.arange(off, off + len(t), dtype=torch.int64))
        off += len(t)
    if len(sys.argv) > 4 and sys.argv[3] == "evict":
        cap = int(sys.argv[4])
        evict_run(reqs, slots, cap)  # warm-up
        rs = [evict_run(reqs, slots, cap) for _ in range(runs)]
        print("RESULT " + json.dumps({
            "version": sglang.__version__, "torch": torch.__version__, "runs": rs,
        }))
        return
    replay, match, hits, match_hits = [], [], [], []
    for run in range(runs + 1):
        cache = RadixCache.create_simulated(page_size=1)
        h = 0
        t0 = time.perf_counter()
        for t, s in zip(reqs, slots):
            h += cache.match_prefix(MatchPrefixParams(key=RadixKey(t))).device_prefix_len
            cache.insert(InsertParams(key=RadixKey(t), value=s))
        dt = time.perf_counter() - t0
        mh = 0
        t1 = time.perf_counter()
        for t in reqs:
            mh += cache.match_prefix(MatchPrefixParams(key=RadixKey(t))).device_prefix_len
        dm = time.perf_counter() - t1
        if run > 0:
            replay.append(dt)
            match.append(dm)
            hits.append(h)
            match_hits.append(mh)
    print("RESULT " + json.dumps({
        "version": sglang.__version__, "torch": torch.__version__,
        "replay": replay, "match": match, "hits": hits, "match_hits": match_hits,
        "requests": len(reqs), "tokens": sum(len(t) for t in reqs),
    }))


if __name__ == "__main__":
    main()
