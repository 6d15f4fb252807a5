#!/usr/bin/env python3
"""SGLang 0.5.23's ``UnifiedRadixCache`` for hybrid models on the Mooncake trace, its tree
core SGLang's ``rust``, its ``python`` or radixkv's ``radixkv`` (``radixkv.sglang``
registers it), interleaved in one process, for the component sets ``[FULL, SWA]``,
``[FULL, MAMBA]`` and ``[FULL, SWA, MAMBA]`` (``--components``), page 1, at a capacity of
2,000,000 tokens (``--cap``).

    RADIXKV_LIB=DIR PYTHONPATH=bindings/python PYTHON benches/python/sglang_hybrid_replay.py \\
        [TRACE] [--components full,swa;full,mamba;full,swa,mamba] [--runs N] [--requests N] \\
        [--cap TOKENS] [--window W] [--swa-ratio R] [--mamba-states S] [--chunk C] [--core-time]

PYTHON as for ``sglang_replay.py`` (sglang 0.5.23, torch 2.11-2.14 on the CPU for the Rust
core; a core that is not there is reported as a fallback, never hidden). Tokens are the
trace's as in ``sglang_replay.py``; every request is prefill-only and finished after its
prefill.

The pools and allocators are SGLang's own, built as the unit-test kit's ``build_fixture``
builds them (``SWAKVPool`` + ``SWATokenToKVPoolAllocator`` for SWA, ``HybridReqToTokenPool``
with its ``MambaPool`` + ``HybridLinearKVPool`` + ``TokenToKVPoolAllocator`` for Mamba; for
all three, the SWA pair with the ``HybridReqToTokenPool``), with real but tiny tensors (2
layers, one full and one SWA/Mamba, 1 head of dim 4; Mamba states of 2 heads x 4 x 4), the
debug cross-checks off. The SWA pool holds ``--swa-ratio`` (0.8, the kind of ratio
SGLang's ``--swa-full-tokens-ratio`` sets) of the full pool, so SWA runs short first and its walk
makes tombstones; the window is ``--window`` (4096) tokens. The Mamba pool holds
``--mamba-states`` (1,024) states. A fresh set of pools and a fresh cache each run.

The loop per admitted request is what SGLang 0.5.23's scheduler calls, as the tree sees it
(``Req.init_next_round_input`` / ``match_kv_cache``, ``PrefillAdder``, ``alloc_for_extend``,
``release_kv_cache(checkpoint=True)``):

1. ``match_prefix(MatchPrefixParams(key=RadixKey(fill_ids, limit=len - 1), cow_mamba=
   supports_mamba(), req=req))``; ``prefix_len``, ``last_node``, ``swa_branching_seqlen``,
   ``mamba_branching_seqlen``, ``cache_protected_len`` onto the request as ``match_kv_cache``
   does (with Mamba, a hit's state is copied on write: the Mamba component takes the
   request a state slot, evicting a cached state when the pool is empty).
2. ``lock(last_node)``.
3. The request's own Mamba slot when it has none (``HybridReqToTokenPool.alloc``; an
   ``evict_for_alloc(mamba_num=1)`` first when the Mamba pool is empty);
   ``prefix_device_indices``; the allocator's ``evict_to_free_tokens`` when it is short
   (for SWA both pools' shortfalls); ``alloc``; the prefix and the new indices written into
   the request's ``req_to_token`` row (SGLang's ``ReqKvInfo`` as the request's record).
   With ``--chunk C`` (chunked prefill, as the scheduler with ``chunked_prefill_size=C``)
   the KV is allocated a chunk at a time, and after every chunk but the last the
   unfinished request is checkpointed as ``checkpoint_kv_cache`` does
   (``checkpoint(req, up_to=extend_end)``, ``req.finished()`` false: with Mamba the
   component forks the request's state into a new slot for the tree; with SWA it frees the
   request's slots behind the window, ``SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS``
   at its default). Without it, Mamba states sit only at request ends, and on the Mooncake
   trace no request extends a whole earlier one: no Mamba hit at all.
4. ``checkpoint(req, up_to=len)`` (the request finished: the Mamba component hands the
   request's slot to the tree as ``mamba_value``, freed when the tree kept a state there
   already), ``free_kv_row`` of the row past ``cache_protected_len``, ``unlock``,
   ``on_release``.

One untimed warm-up round, then N rounds (3 by default), each running every core once in
a rotating order; medians. The hit tokens (sum of ``prefix_len``) must be equal across the
cores; a difference is printed, with each core's figure. ``--core-time`` wraps every
public tree-core method in a timer (outermost calls only; about a microsecond a call, the
same on every core) and prints the time spent inside the tree core beside the whole loop's.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import sys
import time
import warnings
from array import array
from types import SimpleNamespace

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import sglang  # noqa: E402
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.managers.schedule_batch import ReqKvInfo  # noqa: E402
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

import radixkv  # noqa: E402
import radixkv.sglang  # noqa: E402,F401  (registers the tree core "radixkv")
from sglang_replay import DEFAULT_TRACE, fmt_s, load  # noqa: E402

CORES = ("rust", "python", "radixkv")
FULL, SWA, MAMBA = ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA
DTYPE = torch.bfloat16
LAYERS = 2  # layer 0 full attention, layer 1 SWA or Mamba
HEAD_NUM, HEAD_DIM = 1, 4


class Setup:
    """One component set's sizes; ``build(core)`` makes fresh pools, allocator and cache."""

    def __init__(self, components, cap, width, window, swa_ratio, mamba_states):
        self.components = components
        self.cap = cap
        self.width = width
        self.window = window if SWA in components else None
        self.swa_size = int(cap * swa_ratio) if SWA in components else None
        self.mamba_states = mamba_states if MAMBA in components else None
        server_args = ServerArgs(model_path="dummy", page_size=1)
        server_args._mamba_cache_chunk_size = 64
        set_global_server_args_for_scheduler(server_args)

    def build(self, core):
        dev = "cpu"
        if MAMBA in self.components:
            with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
                shape = Mamba2StateShape.create(
                    tp_world_size=1, intermediate_size=8, n_groups=1, num_heads=2, head_dim=4,
                    state_size=4, conv_kernel=4,
                )
                mparams = Mamba2CacheParams(shape=shape, layers=[1])
            pool = HybridReqToTokenPool(
                size=1, mamba_size=self.mamba_states, mamba_spec_state_size=1, max_context_len=self.width,
                device=dev, enable_memory_saver=False, cache_params=mparams, mamba_layer_ids=[1],
                enable_mamba_extra_buffer=False, speculative_num_draft_tokens=3,
            )
        else:
            pool = ReqToTokenPool(size=1, max_context_len=self.width, device=dev, enable_memory_saver=False)
        if SWA in self.components:
            kv = SWAKVPool(
                size=self.cap, size_swa=self.swa_size, page_size=1, dtype=DTYPE, head_num=HEAD_NUM,
                head_dim=HEAD_DIM, swa_attention_layer_ids=[1], full_attention_layer_ids=[0], device=dev,
            )
            alloc = SWATokenToKVPoolAllocator(
                size=self.cap, size_swa=self.swa_size, page_size=1, dtype=DTYPE, device=dev, kvcache=kv,
                need_sort=False,
            )
        else:
            kv = HybridLinearKVPool(
                size=self.cap, dtype=DTYPE, page_size=1, head_num=HEAD_NUM, head_dim=HEAD_DIM,
                full_attention_layer_ids=[0], device=dev, enable_memory_saver=False,
                mamba_pool=pool.mamba_pool,
            )
            alloc = TokenToKVPoolAllocator(size=self.cap, dtype=DTYPE, device=dev, kvcache=kv, need_sort=False)
        params = CacheInitParams(
            req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=1, disable=False,
            sliding_window_size=self.window, tree_components=self.components,
            enable_mamba_extra_buffer=False, tree_core_backend=core,
        )
        cache = UnifiedRadixCache(params=params)
        return cache, alloc, pool


def make_req(rid, tokens):
    """The fields of SGLang's ``Req`` the tree cache reads in this loop; ``kv`` is SGLang's
    own ``ReqKvInfo``."""
    return SimpleNamespace(
        rid=rid, origin_input_ids=tokens, output_ids=array("q"), full_untruncated_fill_ids=tokens,
        extra_key=None, cache_salt=None, priority=None, session_id=None, session=None,
        kv_rotation_base=None, lock=None, last_node=None, prefix_len=0,
        kv=ReqKvInfo(req_pool_idx=0), finished=_finished, extend_end=0, finished_reason=None,
        mamba_branching_seqlen=None, swa_branching_seqlen=None, is_retracted=False,
        skip_radix_cache_insert=False, get_fill_ids=lambda: tokens,
    )


def time_tree_core(cache, acc):
    """Every public method of ``cache.tree_core`` timed into ``acc[0]`` (outermost calls
    only: a core calling its own methods is not counted twice; its adapter's Python is in)."""
    tc = cache.tree_core
    depth = [0]
    for name in dir(type(tc)):
        if name.startswith("_") or isinstance(getattr(type(tc), name, None), property):
            continue
        f = getattr(tc, name, None)
        if not callable(f):
            continue

        def timed(*a, _f=f, **k):
            if depth[0]:
                return _f(*a, **k)
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                acc[0] += time.perf_counter() - t0
                depth[0] -= 1

        try:
            setattr(tc, name, timed)
        except (AttributeError, TypeError):  # a slot-less native object: left untimed
            pass


def _finished():
    return True


def _unfinished():
    return False


def run_once(setup, core, reqs, acc=None, chunk=0):
    """The scheduler's calls on a fresh cache on ``core``; (secs, hits, evict calls, Mamba
    states evicted for a request slot). With ``acc``, the time inside the tree core is
    summed into ``acc[0]``."""
    cache, alloc, pool = setup.build(core)
    if acc is not None:
        time_tree_core(cache, acc)
    mamba = MAMBA in setup.components
    ma = pool.mamba_allocator if mamba else None
    row = pool.req_to_token[0]
    rs = [make_req(i, t) for i, t in enumerate(reqs)]
    hits = evicts = mamba_evicts = chunks = 0
    gc.collect()
    t0 = time.perf_counter()
    for req in rs:
        ids = req.full_untruncated_fill_ids
        n = len(ids)
        kv = req.kv
        # 1. match_kv_cache
        r = cache.match_prefix(
            MatchPrefixParams(
                key=RadixKey(token_ids=ids, extra_key=req.extra_key, limit=n - 1, cache_salt=req.cache_salt),
                cow_mamba=mamba,
                req=req,
            )
        )
        m = r.device_prefix_len
        req.prefix_len = m
        req.last_node = r.last_device_node
        req.swa_branching_seqlen = r.swa_branching_seqlen
        if r.mamba_branching_seqlen is not None:
            req.mamba_branching_seqlen = r.mamba_branching_seqlen
        kv.cache_protected_len = m if r.cache_protected_len is None else r.cache_protected_len
        hits += m
        # 2. PrefillAdder.add_one_req
        req.lock = cache.lock(req.last_node)
        # 3. alloc_for_extend: the request's Mamba slot, then its KV
        if mamba and kv.mamba_pool_idx is None:
            mid = ma.alloc(1)
            if mid is None:
                mamba_evicts += 1
                cache.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=1))
                mid = ma.alloc(1)
                assert mid is not None, "no Mamba slot after eviction"
            kv.mamba_pool_idx = mid[0]
        prefix = cache.prefix_device_indices(req) if m else None
        if m:
            row[:m] = prefix
        pos = m
        while True:  # one extend per chunk (--chunk): chunked prefill
            end = n if not chunk else min(n, pos + chunk)
            need = end - pos
            if alloc.available_size() < need:
                evicts += 1
                alloc.evict_to_free_tokens(cache, need)
            out = alloc.alloc(need)
            assert out is not None, "the allocator is short after eviction"
            row[pos:end] = out
            kv.kv_allocated_len = kv.kv_committed_len = end
            if end == n:
                break
            # checkpoint_kv_cache of the unfinished request (Mamba: a forked state)
            req.finished = _unfinished
            req.extend_end = end
            cache.checkpoint(req, up_to=end)
            req.prefix_len = pos = end
            req.finished = _finished
            chunks += 1
        # 4. release_kv_cache(req, tree_cache, checkpoint=True)
        cache.checkpoint(req, up_to=n)
        cache.free_kv_row(kv, [(kv.cache_protected_len, n)])
        cache.unlock(req.lock)
        req.lock = None
        cache.on_release(req, checkpointed=True)
        kv.kv_allocated_len = 0
    secs = time.perf_counter() - t0
    del cache, rs, r, req
    return secs, hits, evicts, mamba_evicts, chunks


def label(components):
    return "[" + ", ".join(c.name for c in components) + "]"


def parse_components(s):
    names = {"full": FULL, "swa": SWA, "mamba": MAMBA}
    return [tuple(names[x.strip()] for x in part.split(",")) for part in s.split(";") if part.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", default=DEFAULT_TRACE)
    ap.add_argument("--components", default="full,swa;full,mamba", help="';'-separated sets, e.g. 'full,swa;full,mamba;full,swa,mamba'")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=0, help="only the trace's first N requests (0: all)")
    ap.add_argument("--cap", type=int, default=2_000_000, help="full KV pool, tokens")
    ap.add_argument("--window", type=int, default=4096, help="SWA sliding window, tokens")
    ap.add_argument("--swa-ratio", type=float, default=0.8, help="SWA pool / full pool")
    ap.add_argument("--mamba-states", type=int, default=1024, help="Mamba pool, states")
    ap.add_argument("--cores", default=",".join(CORES))
    ap.add_argument(
        "--chunk",
        type=int,
        default=0,
        help="chunked prefill: extend at most this many tokens at a time, the unfinished request "
        "checkpointed after each chunk (0: one extend per request)",
    )
    ap.add_argument(
        "--core-time",
        action="store_true",
        help="time every tree-core call too (timed wrappers, about a microsecond a call on every core)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    reqs = load(args.trace)
    if args.requests:
        reqs = reqs[: args.requests]
    n_tokens = sum(len(t) for t in reqs)
    width = max(len(t) for t in reqs) + 1
    la = os.getloadavg()
    print(
        f"sglang_hybrid_replay: load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}; {len(reqs):,} requests, "
        f"{n_tokens:,} tokens; python {sys.version.split()[0]}, sglang {sglang.__version__}, torch "
        f"{torch.__version__}, radixkv {radixkv.version()}; nproc {os.cpu_count()}; {args.runs} rounds after a "
        f"warm-up; page 1; full pool {args.cap:,} tokens; chunked prefill {args.chunk or 'off'}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    ok = True
    cores = args.cores.split(",")
    for comps in parse_components(args.components):
        setup = Setup(comps, args.cap, width, args.window, args.swa_ratio, args.mamba_states)
        desc = [f"full pool {args.cap:,}"]
        if setup.window:
            desc.append(f"SWA pool {setup.swa_size:,}, window {setup.window:,}")
        if setup.mamba_states:
            desc.append(f"Mamba pool {setup.mamba_states:,} states")
        print(f"\n{label(comps)}: {'; '.join(desc)}")
        present = []
        for core in cores:
            try:
                c, _, _ = setup.build(core)
                got, cls = c._tree_core_backend, type(c.tree_core).__name__
                del c
            except Exception as e:  # noqa: BLE001 - reported, never hidden
                print(f"  tree_core_backend={core!r}: NOT AVAILABLE ({type(e).__name__}: {e})")
                continue
            note = "" if got == core else f" (asked {core}: FELL BACK to {got})"
            print(f"  tree_core_backend={core!r}: runs {got!r} ({cls}){note}")
            if got == core:
                present.append(core)
        secs = {c: [] for c in present}
        inside = {c: [] for c in present}
        hits, evs, mevs, chk = {}, {}, {}, {}
        t_set = time.perf_counter()
        for rnd in range(args.runs + 1):
            k = rnd % len(present)
            for core in present[k:] + present[:k]:
                acc = [0.0] if args.core_time else None
                try:
                    s, h, e, me, nch = run_once(setup, core, reqs, acc, args.chunk)
                except Exception as ex:  # noqa: BLE001
                    print(f"  {core}: FAILED in round {rnd}: {type(ex).__name__}: {ex}")
                    ok = False
                    secs[core].append(float("nan"))
                    continue
                if rnd:
                    secs[core].append(s)
                    if acc is not None:
                        inside[core].append(acc[0])
                if hits.setdefault(core, h) != h:
                    print(f"  {core}: hits changed between rounds ({hits[core]:,} then {h:,})")
                    ok = False
                evs[core], mevs[core], chk[core] = e, me, nch
        la = os.getloadavg()
        print(f"  (set took {time.perf_counter() - t_set:.0f} s; load average now {la[0]:.2f} {la[1]:.2f} {la[2]:.2f})")
        print(f"  scheduler loop, medians of {args.runs}:")
        ref = hits.get("python", next(iter(hits.values()), None))
        for core in present:
            if core not in hits:
                continue
            same = "=" if hits[core] == ref else "!= python's"
            ok &= hits[core] == ref
            extra = f", Mamba slot evictions {mevs[core]:,}" if MAMBA in comps else ""
            if args.chunk:
                extra += f", chunk checkpoints {chk[core]:,}"
            print(f"    {core:<8} {fmt_s(secs[core])}  hits {hits[core]:,} {same}; evict_to_free_tokens calls {evs[core]:,}{extra}")
            if inside[core]:
                print(f"             inside the tree core {fmt_s(inside[core])}")
        if "radixkv" in secs and secs["radixkv"]:
            rk = statistics.median(secs["radixkv"])
            others = [c for c in present if c != "radixkv"]
            print("    radixkv core against each, whole loop: " + ", ".join(f"{statistics.median(secs[c]) / rk:.2f}x {c}" for c in others))
    la = os.getloadavg()
    print(f"\nload average at the end: {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")
    print("sglang_hybrid_replay: " + ("ok: equal hits" if ok else "HIT COUNTS DIFFER (or a run failed)"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
