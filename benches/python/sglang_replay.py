#!/usr/bin/env python3
"""SGLang's replay loop on the Mooncake trace, side by side in one process: SGLang 0.5.23's
own RadixCache, radixkv's RadixKvCache (the same loop, SGLang's own key and value types)
and radixkv's plain Cache with NumPy input; plus the per-call overhead of a 1-token match,
the evict time per call at 2,000,000 tokens, and the match throughput of 2 Python threads
against 1 on one Cache.

    PYTHON benches/python/sglang_replay.py [TRACE] [--runs N]

PYTHON needs sglang 0.5.23, torch, numpy and radixkv installed (scripts/sglang-check makes
such a venv). Tokens are materialized as in docs/contract/CLI.md (block id h
gives tokens h*512 .. h*512+511, cut to input_length); each request's key
(``RadixKey(array('q', tokens))``) and its fresh KV indices (an int64 tensor, one new
index per token, request after request) are made before the timing. The loop (as
benches/compare/sglang/replay.py drives SGLang): per request ``match_prefix``, then
``insert``; at a capacity (2,000,000 tokens) also ``inc_lock_ref`` on the match's node, an
``evict`` of the shortfall when the counting stand-in for SGLang's allocator has fewer free
indices than the request needs (timed per call), and ``dec_lock_ref`` after the insert. One
untimed warm-up run, then N timed runs (3 by default), a fresh cache each; the hit tokens
must be 39,852,661 (unlimited) and 14,225,848 (2M) for every contestant.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import warnings
from array import array

warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import sglang  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

import radixkv  # noqa: E402
from radixkv.sglang import RadixKvCache  # noqa: E402

BLOCK = 512
CAPACITY = 2_000_000
EXPECTED = {None: 39_852_661, CAPACITY: 14_225_848}
# The trace sits beside the checkout (`../shared/traces/`), as the Rust tests and the CLI
# examples expect it.
DEFAULT_TRACE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..", "..", "..", "shared", "traces", "mooncake_synthetic_trace.jsonl",
)


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


class CountingPool:
    """Stands in for SGLang's token-to-KV allocator: counts free indices."""

    device = torch.device("cpu")

    def __init__(self, capacity):
        self.free = capacity

    def free_segment(self, value, start_pos=0):
        self.free += len(value)


def sglang_loop(make, keys, values, cap):
    """The replay loop on a cache made by ``make(pool)``; returns (secs, hits, evict call
    times)."""
    pool = CountingPool(cap or 0)
    cache = make(pool)
    calls = []
    hits = 0
    t0 = time.perf_counter()
    if cap is None:
        for key, value in zip(keys, values):
            hits += cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len
            cache.insert(InsertParams(key=key, value=value))
    else:
        for key, value in zip(keys, values):
            r = cache.match_prefix(MatchPrefixParams(key=key))
            m = r.device_prefix_len
            hits += m
            node = r.last_device_node
            cache.inc_lock_ref(node)
            need = len(value) - m
            if pool.free < need:
                c0 = time.perf_counter()
                cache.evict(EvictParams(num_tokens=need - pool.free))
                calls.append(time.perf_counter() - c0)
            res = cache.insert(InsertParams(key=key, value=value))
            pool.free -= len(value) - res.prefix_len
            cache.dec_lock_ref(node)
    return time.perf_counter() - t0, hits, calls


def plain_loop(tokens, slots, cap):
    """The same loop on a plain ``radixkv.Cache`` (slots the caller's), NumPy uint32 input."""
    cache = radixkv.Cache(page_size=1)
    calls = []
    hits = 0
    free = cap or 0
    t0 = time.perf_counter()
    if cap is None:
        for t, s in zip(tokens, slots):
            hits += cache.match_len(t)
            cache.insert(t, s)
    else:
        for t, s in zip(tokens, slots):
            # As the SGLang loop: match (refreshing the prefix's access order), then pin
            # what matched.
            m = cache.match_len(t)
            hits += m
            lock = cache.match_lock(t[:m])
            need = len(t) - m
            if free < need:
                c0 = time.perf_counter()
                freed = cache.evict(need - free)
                calls.append(time.perf_counter() - c0)
                free += len(freed)
            free -= len(t) - cache.insert(t, s)
            lock.release()
    secs = time.perf_counter() - t0
    cache.close()
    return secs, hits, calls


def timed(fn, runs):
    fn()  # warm-up
    out = [fn() for _ in range(runs)]
    return [o[0] for o in out], out[-1][1], [c for o in out for c in o[2]]


def fmt_s(xs):
    return f"{statistics.median(xs):.3f} s [{min(xs):.3f}-{max(xs):.3f}]"


def us(x):
    return f"{x * 1e6:.1f} µs"


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, -(-p * len(xs) // 100) - 1))] if xs else float("nan")


def per_call(fn, n=200_000):
    """Median of 5 rounds of n calls, per call."""
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n)
    return statistics.median(rounds)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", default=DEFAULT_TRACE)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--thread-rounds", type=int, default=9, help="1- and 2-thread match rounds, interleaved")
    args = ap.parse_args()
    reqs = load(args.trace)
    n_tokens = sum(len(t) for t in reqs)
    keys = [RadixKey(array("q", t)) for t in reqs]
    values, off = [], 0
    for t in reqs:
        values.append(torch.arange(off, off + len(t), dtype=torch.int64))
        off += len(t)
    np_tokens = [np.asarray(t, dtype=np.uint32) for t in reqs]
    np_slots = [v.numpy().astype(np.uint32) for v in values]
    la = os.getloadavg()
    print(
        f"sglang_replay: load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}; {len(reqs):,} requests, {n_tokens:,} tokens; python {sys.version.split()[0]}, "
        f"sglang {sglang.__version__}, torch {torch.__version__}, numpy {np.__version__}, radixkv "
        f"{radixkv.version()}; nproc {os.cpu_count()}; {args.runs} timed runs after a warm-up; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    sg = lambda pool: RadixCache.create_simulated(mock_allocator=pool, page_size=1)  # noqa: E731
    rk = lambda pool: RadixKvCache.create_simulated(mock_allocator=pool, page_size=1)  # noqa: E731
    results = {}
    ok = True
    for cap in (None, CAPACITY):
        label = "unlimited" if cap is None else f"{cap:,} tokens"
        rows = [
            ("SGLang 0.5.23 RadixCache", lambda: sglang_loop(sg, keys, values, cap)),
            ("radixkv RadixKvCache", lambda: sglang_loop(rk, keys, values, cap)),
            ("radixkv Cache, NumPy uint32", lambda: plain_loop(np_tokens, np_slots, cap)),
        ]
        print(f"\nreplay, capacity {label}:")
        base = None
        for name, fn in rows:
            secs, hits, calls = timed(fn, args.runs)
            med = statistics.median(secs)
            base = base or med
            check = "=" if hits == EXPECTED[cap] else "!="
            ok &= hits == EXPECTED[cap]
            ev = ""
            if calls:
                ev = f"; evict {len(calls) // args.runs} calls/run, median {us(pct(calls, 50))}, p99 {us(pct(calls, 99))}"
            print(
                f"  {name:<30} {fmt_s(secs)}  hits {hits:,} {check} {EXPECTED[cap]:,}  "
                f"{base / med:5.1f}x SGLang{ev}"
            )
            results[(cap, name)] = (med, hits, calls)

    # Per-call overhead of a 1-token match.
    print("\nper call, a 1-token match (median of 5 rounds of 200,000 calls):")
    sgc = RadixCache.create_simulated(page_size=1)
    rkc = RadixKvCache.create_simulated(page_size=1)
    plain = radixkv.Cache(page_size=1)
    for key, value in zip(keys[:200], values[:200]):
        sgc.insert(InsertParams(key=key, value=value))
        rkc.insert(InsertParams(key=key, value=value))
    for t, s in zip(np_tokens[:200], np_slots[:200]):
        plain.insert(t, s)
    one = reqs[0][:1]
    k1 = RadixKey(array("q", one))
    p1 = MatchPrefixParams(key=k1)
    n1 = np.asarray(one, dtype=np.uint32)
    a1 = array("I", one)
    l1 = list(one)
    for name, fn in (
        ("SGLang RadixCache.match_prefix", lambda: sgc.match_prefix(p1)),
        ("RadixKvCache.match_prefix", lambda: rkc.match_prefix(p1)),
        ("Cache.match_len, NumPy uint32", lambda: plain.match_len(n1)),
        ("Cache.match_len, array('I')", lambda: plain.match_len(a1)),
        ("Cache.match_len, list", lambda: plain.match_len(l1)),
        ("Cache.match (slots out), NumPy", lambda: plain.match(n1)),
    ):
        print(f"  {name:<34} {us(per_call(fn))}")

    # Match throughput: 1 thread against 2 on one Cache (the full tree).
    full = radixkv.Cache(page_size=1)
    for t, s in zip(np_tokens, np_slots):
        full.insert(t, s)

    def threads(fn, k, batched=False):
        parts = [np_tokens[i::k] for i in range(k)]
        if batched:
            parts = [batches(p) for p in parts]
        out = [0] * k

        def run(i):
            h = 0
            for t in parts[i]:
                h += fn(t)
            out[i] = h

        ts = [threading.Thread(target=run, args=(i,)) for i in range(k)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return time.perf_counter() - t0, sum(out)

    print("\nmatch only over the full tree (every request, NumPy uint32 tokens), 1 Python thread against 2 on one Cache:")
    batches = lambda part: [part[i : i + 64] for i in range(0, len(part), 64)]  # noqa: E731
    for name, fn, batched in (
        ("Cache.match (slots out)", lambda t: len(full.match(t)), False),
        ("Cache.match_len", full.match_len, False),
        ("match_len_many, 64 a call", lambda b: sum(full.match_len_many(b)), True),
    ):
        one_t, two_t = [], []
        for _ in range(args.thread_rounds + 1):  # interleaved, so both see the same load
            one_t.append(threads(fn, 1, batched))
            two_t.append(threads(fn, 2, batched))
        assert all(x[1] == n_tokens for x in one_t + two_t), "every token of every request hits"
        one_s = [x[0] for x in one_t[1:]]
        two_s = [x[0] for x in two_t[1:]]
        m1, m2 = statistics.median(one_s), statistics.median(two_s)
        b1, b2 = min(one_s), min(two_s)
        print(
            f"  {name:<24} 1 thread {fmt_s(one_s)} ({n_tokens / m1 / 1e9:.2f} G tokens/s), "
            f"2 threads {fmt_s(two_s)} ({n_tokens / m2 / 1e9:.2f} G tokens/s): "
            f"{m1 / m2:.2f}x by medians, {b1 / b2:.2f}x by the best runs"
        )
    la = os.getloadavg()
    print(f"\nload average at the end: {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")
    print("\nsglang_replay: " + ("ok" if ok else "HIT COUNTS DIFFER"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
