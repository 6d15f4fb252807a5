#!/usr/bin/env python3
"""SGLang 0.5.23's scheduler loop on the Mooncake trace, five prefix caches interleaved in
one process: SGLang's ``RadixCache``, its ``UnifiedRadixCache`` (the 0.5.23 default) on the
Rust tree core, on the Python tree core and on radixkv's tree core (``radixkv``, which
``radixkv.sglang`` registers), and radixkv's ``RadixKvCache``; unlimited and at 2,000,000
tokens (``--caps``), page 1 or another (``--page-size``). Optionally (``--core-time``) the
time ``UnifiedRadixCache`` spends inside its tree core, Rust against radixkv, and
(``--extras``) the per-call overhead of a 1-token match and the match throughput of 2 Python
threads against 1 on a plain ``radixkv.Cache``.

    PYTHON benches/python/sglang_replay.py [TRACE] [--runs N] [--page-size P] [--core-time] [--extras]

PYTHON needs sglang 0.5.23, torch, numpy and radixkv installed (scripts/sglang-check makes
such a venv; the Rust tree core needs torch 2.11-2.14, else SGLang falls back to the Python
core and the bench says so). Tokens are materialized as in docs/contract/CLI.md (block id h
gives tokens h*512 .. h*512+511, cut to input_length); every request is prefill-only (its
output tokens are not in the trace).

The loop is what the scheduler calls on the tree per admitted request (one request a round,
page size 1), read off sglang 0.5.23's scheduler, schedule_batch, allocation and common.py:

1. ``match_kv_cache``: ``match_prefix(MatchPrefixParams(key=RadixKey(fill_ids,
   extra_key, limit=len - 1, cache_salt), cow_mamba=False, req=req))`` (``fill_ids`` the
   request's ``array('q')``; the limit keeps one token to compute); ``prefix_len``,
   ``last_node``, ``cache_protected_len`` from the result.
2. ``PrefillAdder``: ``req.lock = tree_cache.lock(req.last_node)``.
3. ``alloc_for_extend``: ``prefix_device_indices(req)`` (``path_device_indices(last_node)``
   cut to ``prefix_len``) when ``prefix_len > 0``; ``alloc_token_slots``, which evicts
   through ``allocator.evict_to_free_tokens`` (``evict_for_alloc`` of the shortfall) when the
   allocator is short; the prefix and the new indices written into the request's
   ``req_to_token`` row (int32, as SGLang's pool).
4. ``release_kv_cache(req, checkpoint=True)``: the cache's own ``checkpoint(req,
   up_to=len)`` (each cache's: an insert of the row's indices, the duplicates freed, the
   row repointed at the tree's indices, the lock moved to the inserted node), then
   ``free_kv_row`` of the row past ``cache_protected_len`` and ``unlock(req.lock)``.

The allocator and the request pool are stand-ins (a counting allocator handing out fresh
index ranges; a one-row int32 ``req_to_token``); their cost is the same for every
contestant; torch runs on one thread (``--torch-threads``). One untimed warm-up round, then N rounds (5 by default), each round running
every contestant once on a fresh cache, in a rotating order; medians. The hit tokens (the
sum of ``prefix_len``) must be equal across contestants. A fifth row runs the loop with no
cache at all (every match a miss): the loop's own cost, which the last line takes off every
contestant's time to compare the caches' own costs.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import sys
import threading
import time
import warnings
from array import array
from types import SimpleNamespace

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import sglang  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

import radixkv  # noqa: E402
from radixkv.sglang import RadixKvCache  # noqa: E402  (registers the tree core "radixkv" too)

try:  # the 0.5.23 default cache
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
except ImportError:  # pragma: no cover - an SGLang without it
    UnifiedRadixCache = None

BLOCK = 512
CAPACITY = 2_000_000
# The trace sits beside the checkout (`../shared/traces/`), as the Rust tests and the CLI
# examples expect it.
DEFAULT_TRACE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..", "..", "..", "shared", "traces", "mooncake_synthetic_trace.jsonl",
)


def load(path):
    """Each request's tokens as an ``array('q')`` (the scheduler's ``fill_ids`` type). No
    list of Python ints stays alive: 61M of them in lists make every full collection of the
    cycle collector walk them (about a second each on this machine), landing on whichever
    contestant runs then."""
    reqs = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            v = json.loads(line)
            toks = array("q")
            for h in v["hash_ids"]:
                toks.extend(range(h * BLOCK, h * BLOCK + BLOCK))
            reqs.append(toks[: v["input_length"]])
    return reqs


# ---- the scheduler's stand-ins ----------------------------------------------------------


class Allocator:
    """SGLang's token-to-KV allocator, counting: ``alloc`` hands out the next indices of
    ``indices`` as a view (as ``TokenToKVPoolAllocator.alloc`` slices its ``free_pages``;
    fresh ones, never reused, so a stale index shows), frees count back;
    ``evict_to_free_tokens`` is ``BaseTokenToKVPoolAllocator``'s (an ``evict_for_alloc`` of
    the shortfall)."""

    device = torch.device("cpu")
    page_size = 1

    def __init__(self, capacity, indices):
        self.free_tokens = capacity
        self.indices = indices
        self.next = 0
        self.evict_calls = 0

    def available_size(self):
        return self.free_tokens

    def alloc(self, n):
        if n > self.free_tokens:
            return None
        self.free_tokens -= n
        out = self.indices[self.next : self.next + n]
        self.next += n
        return out

    def free(self, indices):
        self.free_tokens += len(indices)

    def free_segment(self, indices, start_pos=0):
        self.free_tokens += len(indices)

    def free_full_segment(self, indices, start_pos=0):
        self.free_tokens += len(indices)

    def full_available_size(self):
        return self.free_tokens

    def mamba_full_cache_donor(self):
        return None

    def evict_to_free_tokens(self, tree_cache, num_tokens):
        shortfall = num_tokens - self.available_size()
        if shortfall > 0:
            self.evict_calls += 1
            tree_cache.evict_for_alloc(EvictParams(num_tokens=shortfall))


class ReqToTokenPool:
    """SGLang's ``ReqToTokenPool``: one int32 row per running request (one here)."""

    device = torch.device("cpu")

    def __init__(self, width):
        self.req_to_token = torch.zeros((1, width), dtype=torch.int32)

    def write(self, indices, values):
        self.req_to_token[indices] = values

    def free(self, req):
        pass


def make_req(rid, tokens):
    """The fields of SGLang's ``Req`` the tree caches read in this loop."""
    kv = SimpleNamespace(
        req_pool_idx=0,
        cache_protected_len=0,
        cache_inserted_len=0,
        swa_evict_floor=0,
        kv_allocated_len=0,
        kv_committed_len=0,
        holds_kv=False,
        mamba_pool_idx=None,
        retraction_backup=None,
    )
    return SimpleNamespace(
        rid=rid,
        origin_input_ids=tokens,
        output_ids=array("q"),
        full_untruncated_fill_ids=tokens,
        extra_key=None,
        cache_salt=None,
        priority=None,
        session_id=None,
        session=None,
        kv_rotation_base=None,
        lock=None,
        last_node=None,
        prefix_len=0,
        kv=kv,
        finished=lambda: True,
        finished_reason=None,
        mamba_branching_seqlen=None,
        swa_branching_seqlen=None,
        is_retracted=False,
        skip_radix_cache_insert=False,
    )


def scheduler_loop(make, reqs, cap, width, indices):
    """The scheduler's calls on a cache made by ``make(allocator, pool)``, request by request
    (KV indices handed out from ``indices``); returns (secs, hit tokens, evict_for_alloc
    calls)."""
    alloc = Allocator(cap if cap is not None else 1 << 40, indices)
    alloc.page_size = PAGE_SIZE
    pool = ReqToTokenPool(width)
    cache = make(alloc, pool)
    row = pool.req_to_token[0]
    hits = 0
    # The requests (their token arrays) exist before the timing, as the scheduler's do.
    rs = [make_req(i, t) for i, t in enumerate(reqs)]
    # What earlier runs left for the cycle collector is not this run's to pay (the
    # collector stays on during the run, as in the scheduler).
    gc.collect()
    t0 = time.perf_counter()
    for req in rs:
        ids = req.full_untruncated_fill_ids
        n = len(ids)
        # 1. match_kv_cache
        r = cache.match_prefix(
            MatchPrefixParams(
                key=RadixKey(token_ids=ids, extra_key=req.extra_key, limit=n - 1, cache_salt=req.cache_salt),
                cow_mamba=False,
                req=req,
            )
        )
        m = r.device_prefix_len
        req.prefix_len = m
        req.last_node = r.last_device_node
        req.kv.cache_protected_len = m if r.cache_protected_len is None else r.cache_protected_len
        hits += m
        # 2. PrefillAdder.add_one_req
        req.lock = cache.lock(req.last_node)
        # 3. alloc_for_extend
        prefix = cache.prefix_device_indices(req) if m else None
        need = n - m
        if alloc.available_size() < need:
            alloc.evict_to_free_tokens(cache, need)
        out = alloc.alloc(need)
        assert out is not None, "the allocator is short after eviction"
        if m:
            row[:m] = prefix
        row[m:n] = out
        req.kv.holds_kv = True
        req.kv.kv_allocated_len = req.kv.kv_committed_len = n
        # 4. release_kv_cache(req, tree_cache, checkpoint=True)
        cache.checkpoint(req, up_to=n)
        if n > req.kv.cache_protected_len:  # free_kv_row: what the tree did not take
            alloc.free_segment(row[req.kv.cache_protected_len : n])
        cache.unlock(req.lock)
        req.lock = None
        req.kv.holds_kv = False
    secs = time.perf_counter() - t0
    del cache, rs, r, req
    return secs, hits, alloc.evict_calls


# ---- the earlier loop (benches/python/sglang_policies.py's differential uses it) -------------


class CountingPool:
    """Stands in for SGLang's token-to-KV allocator: counts free indices."""

    device = torch.device("cpu")

    def __init__(self, capacity):
        self.free = capacity

    def free_segment(self, value, start_pos=0):
        self.free += len(value)


def sglang_loop(make, keys, values, cap):
    """The loop this bench ran before it followed the scheduler: per request
    ``match_prefix``, ``insert``; at a capacity also ``inc_lock_ref`` on the match's node, an
    ``evict`` of the shortfall and ``dec_lock_ref`` after the insert. On a cache made by
    ``make(pool)``; returns (secs, hits, evict call times)."""
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


# ---- the contestants ---------------------------------------------------------------------


PAGE_SIZE = 1  # --page-size


def params(alloc, pool, **kw):
    return CacheInitParams(
        disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=PAGE_SIZE, **kw
    )


def make_radix(alloc, pool):
    return RadixCache(params(alloc, pool))


def make_unified(core):
    def make(alloc, pool):
        c = UnifiedRadixCache(params(alloc, pool, tree_components=(ComponentType.FULL,), tree_core_backend=core))
        return c

    return make


def make_radixkv(alloc, pool):
    return RadixKvCache(params(alloc, pool))


class _NoMatch:
    device_prefix_len = 0
    last_device_node = None
    cache_protected_len = None


class NullCache:
    """No tree at all: every match misses, nothing is kept. Its row is the loop's own cost
    (the scheduler's stand-ins, the keys and parameter objects, the row writes), the same
    for every contestant."""

    def __init__(self, alloc, pool):
        pass

    def match_prefix(self, params):
        return _NoMatch

    def lock(self, node):
        return None

    def unlock(self, lock):
        pass

    def prefix_device_indices(self, req):
        return None

    def checkpoint(self, req, *, up_to):
        req.kv.cache_protected_len = 0


def unified_core_of(core):
    """Which tree core ``UnifiedRadixCache`` really runs when ``core`` is asked for."""
    c = make_unified(core)(Allocator(1 << 20, torch.arange(8)), ReqToTokenPool(8))
    return c._tree_core_backend, type(c.tree_core).__name__


# ---- the time inside the tree core (--core-time) ------------------------------------------

#: Every tree-core method UnifiedRadixCache calls in this loop.
CORE_METHODS = (
    "match_prefix", "begin_insert", "resume_insert", "end_insert", "has_ongoing_insert",
    "inc_lock_ref", "dec_lock_ref", "collect_full_device_indices", "evict_device_start",
    "evict_device_next_node", "evict_device_leaf", "evict_device_end", "evictable_size",
    "protected_size", "full_evictable_size", "component_evictable_size", "root_node_handle",
    "is_root", "is_full_device_evicted",
)


def timed_unified(core, acc):
    """``make_unified(core)`` with every tree-core method the loop reaches timed into
    ``acc[0]`` (its adapter's Python included: what the controller waits for)."""
    make = make_unified(core)

    def made(alloc, pool):
        c = make(alloc, pool)
        tc = c.tree_core
        for name in CORE_METHODS:
            f = getattr(tc, name)

            def timed(*a, _f=f, **k):
                t0 = time.perf_counter()
                try:
                    return _f(*a, **k)
                finally:
                    acc[0] += time.perf_counter() - t0

            setattr(tc, name, timed)
        return c

    return made


def core_time(reqs, caps, width, indices, runs):
    """UnifiedRadixCache on SGLang's Rust core and on radixkv's, interleaved, with the time
    spent inside the tree core measured apart from the whole loop's (the wrappers cost both
    the same, about a microsecond a call)."""
    cores = [c for c in ("rust", "radixkv") if unified_core_of(c)[0] == c]
    for cap in caps:
        label = "unlimited" if cap is None else f"{cap:,} tokens"
        loop = {c: [] for c in cores}
        inside = {c: [] for c in cores}
        for rnd in range(runs + 1):
            for core in cores[rnd % len(cores):] + cores[: rnd % len(cores)]:
                acc = [0.0]
                s, _, _ = scheduler_loop(timed_unified(core, acc), reqs, cap, width, indices)
                if rnd:
                    loop[core].append(s)
                    inside[core].append(acc[0])
        print(f"\nUnifiedRadixCache, time inside the tree core, capacity {label} (medians of {runs}, timed wrappers):")
        for core in cores:
            print(f"  {core:<8} whole loop {fmt_s(loop[core])}, inside the tree core {fmt_s(inside[core])}")
        if len(cores) == 2:
            r, k = (statistics.median(inside[c]) for c in cores)
            print(f"  inside the tree core: radixkv {r / k:.2f}x SGLang's Rust core")


# ---- extras (per-call overhead, threads) --------------------------------------------------


def us(x):
    return f"{x * 1e6:.1f} µs"


def fmt_s(xs):
    return f"{statistics.median(xs):.3f} s [{min(xs):.3f}-{max(xs):.3f}]"


def per_call(fn, n=200_000):
    """Median of 5 rounds of n calls, per call."""
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n)
    return statistics.median(rounds)


def extras(reqs, thread_rounds):
    n_tokens = sum(len(t) for t in reqs)
    keys = [RadixKey(array("q", t)) for t in reqs]
    values, off = [], 0
    for t in reqs:
        values.append(torch.arange(off, off + len(t), dtype=torch.int64))
        off += len(t)
    np_tokens = [np.asarray(t, dtype=np.uint32) for t in reqs]
    np_slots = [v.numpy().astype(np.uint32) for v in values]
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
    p1 = MatchPrefixParams(key=RadixKey(one))
    n1 = np.asarray(one, dtype=np.uint32)
    for name, fn in (
        ("SGLang RadixCache.match_prefix", lambda: sgc.match_prefix(p1)),
        ("RadixKvCache.match_prefix", lambda: rkc.match_prefix(p1)),
        ("Cache.match_len, NumPy uint32", lambda: plain.match_len(n1)),
        ("Cache.match (slots out), NumPy", lambda: plain.match(n1)),
    ):
        print(f"  {name:<34} {us(per_call(fn))}")

    full = radixkv.Cache(page_size=1)
    for t, s in zip(np_tokens, np_slots):
        full.insert(t, s)

    def threads(fn, k):
        parts = [np_tokens[i::k] for i in range(k)]
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
    for name, fn in (("Cache.match (slots out)", lambda t: len(full.match(t))), ("Cache.match_len", full.match_len)):
        one_t, two_t = [], []
        for _ in range(thread_rounds + 1):  # interleaved, so both see the same load
            one_t.append(threads(fn, 1))
            two_t.append(threads(fn, 2))
        assert all(x[1] == n_tokens for x in one_t + two_t), "every token of every request hits"
        one_s = [x[0] for x in one_t[1:]]
        two_s = [x[0] for x in two_t[1:]]
        m1, m2 = statistics.median(one_s), statistics.median(two_s)
        print(f"  {name:<24} 1 thread {fmt_s(one_s)}, 2 threads {fmt_s(two_s)}: {m1 / m2:.2f}x by medians")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", default=DEFAULT_TRACE)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated contestant tags (radix, unified-rust, unified-python, unified-radixkv, radixkv, null)",
    )
    ap.add_argument("--page-size", type=int, default=1, help="the caches' page size (1 or 16, say)")
    ap.add_argument("--requests", type=int, default=0, help="only the trace's first N requests (0: all)")
    ap.add_argument("--caps", default="unlimited,2000000", help="comma-separated capacities in tokens ('unlimited' for none)")
    ap.add_argument("--extras", action="store_true", help="also the per-call and thread figures")
    ap.add_argument(
        "--core-time",
        action="store_true",
        help="also UnifiedRadixCache's time inside the tree core, Rust against radixkv",
    )
    ap.add_argument("--thread-rounds", type=int, default=9)
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch's intra-op threads (1: the scheduler's loop is one thread; on a busy "
        "machine torch's pool makes every large tensor copy wait for a descheduled worker)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.torch_threads)
    global PAGE_SIZE
    PAGE_SIZE = args.page_size
    reqs = load(args.trace)
    if args.requests:
        reqs = reqs[: args.requests]
    n_tokens = sum(len(t) for t in reqs)
    width = max(len(t) for t in reqs)
    indices = torch.arange(n_tokens, dtype=torch.int64)  # every request's new KV, at most
    la = os.getloadavg()
    print(
        f"sglang_replay: load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}; {len(reqs):,} requests, {n_tokens:,} tokens; "
        f"python {sys.version.split()[0]}, sglang {sglang.__version__}, torch {torch.__version__}, radixkv "
        f"{radixkv.version()}; nproc {os.cpu_count()}; torch threads {torch.get_num_threads()}; "
        f"{args.runs} rounds after a warm-up; page size {PAGE_SIZE}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    rows = [("radix", "SGLang RadixCache", make_radix)]
    if UnifiedRadixCache is not None:
        for core in ("rust", "python", "radixkv"):
            got, cls = unified_core_of(core)
            note = "" if got == core else f" (asked {core}: FELL BACK to {got})"
            print(f"UnifiedRadixCache, tree_core_backend={core!r}: runs {got!r} ({cls}){note}")
            rows.append((f"unified-{core}", f"SGLang UnifiedRadixCache, {got} core{note and ' (fallback)'}", make_unified(core)))
    rows.append(("radixkv", "radixkv RadixKvCache", make_radixkv))
    rows.append(("null", "no cache (the loop's own cost)", NullCache))
    if args.only:
        keep = set(args.only.split(","))
        rows = [r for r in rows if r[0] in keep]
    ok = True
    caps = [None if c == "unlimited" else int(c) for c in args.caps.split(",")]
    for cap in caps:
        label = "unlimited" if cap is None else f"{cap:,} tokens"
        secs = {tag: [] for tag, _, _ in rows}
        hits = {}
        evicts = {}
        for rnd in range(args.runs + 1):
            k = rnd % len(rows)
            for tag, _, make in rows[k:] + rows[:k]:
                s, h, e = scheduler_loop(make, reqs, cap, width, indices)
                if rnd:
                    secs[tag].append(s)
                if hits.setdefault(tag, h) != h:
                    print(f"  {tag}: hits changed between rounds ({hits[tag]:,} then {h:,})")
                    ok = False
                evicts[tag] = e
        print(f"\nscheduler loop, capacity {label} (medians of {args.runs}):")
        base = statistics.median(secs[rows[0][0]])
        ref = hits[rows[0][0]]
        floor = statistics.median(secs["null"]) if "null" in secs else 0.0
        for tag, name, _ in rows:
            med = statistics.median(secs[tag])
            if tag == "null":
                print(f"  {name:<44} {fmt_s(secs[tag])}")
                continue
            same = "=" if hits[tag] == ref else "!="
            ok &= hits[tag] == ref
            ev = f", evict_for_alloc calls {evicts[tag]:,}" if cap is not None else ""
            print(f"  {name:<44} {fmt_s(secs[tag])}  {base / med:5.2f}x {rows[0][1]}  hits {hits[tag]:,} {same}{ev}")
        urk = statistics.median(secs["unified-radixkv"]) if "unified-radixkv" in secs else None
        if urk:
            others = [t for t in ("unified-rust", "unified-python") if t in secs]
            print(
                "  UnifiedRadixCache on the radixkv tree core against each, whole loop: "
                + ", ".join(f"{statistics.median(secs[t]) / urk:.2f}x {t}" for t in others)
            )
            if floor:
                print(
                    "  the same, the loop's own cost taken off: "
                    + ", ".join(f"{(statistics.median(secs[t]) - floor) / (urk - floor):.2f}x {t}" for t in others)
                )
        rk = statistics.median(secs["radixkv"]) if "radixkv" in secs else None
        if rk:
            others = [t for t, _, _ in rows if t not in ("radixkv", "null")]
            print("  radixkv against each, whole loop: " + ", ".join(f"{statistics.median(secs[t]) / rk:.2f}x {t}" for t in others))
            if floor:
                print(
                    "  radixkv against each, the loop's own cost taken off: "
                    + ", ".join(f"{(statistics.median(secs[t]) - floor) / (rk - floor):.2f}x {t}" for t in others)
                )
    if args.core_time and UnifiedRadixCache is not None:
        core_time(reqs, caps, width, indices, args.runs)
    if args.extras:
        extras(reqs, args.thread_rounds)
    la = os.getloadavg()
    print(f"\nload average at the end: {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")
    print("\nsglang_replay: " + ("ok: equal hits" if ok else "HIT COUNTS DIFFER"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
