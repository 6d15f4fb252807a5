"""``RadixKvHiCache``: SGLang HiCache's host tier where it maps onto radixkv's
:class:`radixkv.Cache` with a host tier (SGLang's own types in and out). Imported only when SGLang
and torch are installed (``radixkv.sglang.RadixKvHiCache`` loads it on first use).

What maps: the two-level index (``match_prefix`` returning ``MatchResult`` with
``host_hit_length``), the write policies (``hicache_write_policy`` names, the
``write_through_threshold``), device eviction leaving host copies (``write_back`` copying
first), host eviction of host-only leaves, ``init_load_back`` (host -> device, the loaded
indices a torch tensor on the returned node, ``None`` when the device cannot hold them,
``load_back_threshold`` as the minimum), lock refs. The index, the slot pools and the copy
bookkeeping are radixkv's; bytes move through the copier (``"host"``: radixkv's memcpy
between two host stores; ``"none"``: no bytes).

What does not: SGLang's ``HiCacheController`` (its CUDA streams, layer-wise load overlap,
``MemoryPoolHost`` and its layouts), L3 storage backends and prefetch, SWA/Mamba
components, and SGLang's own device allocator: the device indices here come from
radixkv's pool (:meth:`alloc`), not ``token_to_kv_pool_allocator``, so this is not a
drop-in scheduler backend (``RadixKvCache`` is, without a host tier).
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    InitLoadBackParams,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
)

from ._cache import Cache, InvalidLockError, Lock, OutOfSlotsError, Status
from ._host import HostOptions, KvLayout

_MATCH_TAIL = tuple(MatchResult._field_defaults[f] for f in MatchResult._fields[5:])


class HiNode:
    """A matched prefix: ``tokens`` (a tuple of the key's whole-page tokens up to where the
    match reached, device and host), ``device_len`` of them on the device (``device_indices``),
    ``host_len`` more on the host, in namespace ``ns``."""

    __slots__ = ("ns", "tokens", "device_len", "host_len", "device_indices", "_locks", "_loaded")

    def __init__(self, ns: Any, tokens: Tuple[int, ...], device_len: int, host_len: int, indices: torch.Tensor):
        self.ns = ns
        self.tokens = tokens
        self.device_len = device_len
        self.host_len = host_len
        self.device_indices = indices
        self._locks: List[Lock] = []
        self._loaded: List[Lock] = []

    @property
    def lock_ref(self) -> int:
        return len(self._locks)

    @property
    def evicted(self) -> bool:
        return self.device_len == 0

    @property
    def backuped(self) -> bool:
        return self.host_len > 0

    def __len__(self) -> int:
        return self.device_len

    def __repr__(self) -> str:
        return f"<HiNode ns={self.ns} device_len={self.device_len} host_len={self.host_len}>"


def _indices(slots: Any) -> torch.Tensor:
    return torch.tensor(list(slots), dtype=torch.int64)


class RadixKvHiCache:
    """A HiCache-flavoured prefix cache on :class:`radixkv.Cache` with a host tier.

    SGLang-style arguments: ``page_size``, ``device_slots`` (the device pool, tokens),
    ``hicache_ratio`` (host = ratio x device, SGLang's default 2.0) or ``hicache_size_tokens``
    (host tokens, overriding the ratio; SGLang's ``--hicache-size`` is in GB, convert with
    your model's bytes per token), ``hicache_write_policy``, ``write_through_threshold``
    (``write_through_selective``'s hit count; SGLang's 2), ``load_back_threshold``
    (SGLang's 10: shorter host hits are recomputed), ``eviction_policy``; ``copier`` and
    ``kv_layout`` as :class:`radixkv.Cache` with a host tier's.
    """

    def __init__(
        self,
        page_size: int = 1,
        device_slots: int = 0,
        hicache_ratio: float = 2.0,
        hicache_size_tokens: Optional[int] = None,
        hicache_write_policy: str = "write_through_selective",
        write_through_threshold: int = 2,
        load_back_threshold: int = 10,
        eviction_policy: str = "lru",
        copier: str = "none",
        kv_layout: Optional[KvLayout] = None,
    ):
        if hicache_size_tokens is None:
            host = int(device_slots * hicache_ratio) // page_size * page_size
        else:
            host = int(hicache_size_tokens) // page_size * page_size
        self.page_size = page_size
        self.write_policy = hicache_write_policy
        self.load_back_threshold = load_back_threshold
        self.cache = Cache(
            page_size=page_size,
            pool_slots=device_slots,
            policy=eviction_policy,
            host=HostOptions(
                host_slots=host,
                write_policy=hicache_write_policy,
                write_threshold=write_through_threshold,
                load_back_min=load_back_threshold,
                copier=copier,
                kv_layout=kv_layout,
            ),
        )
        self.root_node = HiNode(0, (), 0, 0, torch.empty((0,), dtype=torch.int64))

    # -- keys --

    def _key(self, key: Any) -> Tuple[Any, Tuple[int, ...]]:
        """``(namespace, tokens)``: the ``(extra_key, cache_salt)`` pair names an exact
        namespace (interned by the cache), the tokens cut to ``limit`` and whole pages."""
        ns: Any = 0
        extra = (getattr(key, "extra_key", None), getattr(key, "cache_salt", None))
        if extra != (None, None):
            ns = repr(extra)
        t = getattr(key, "token_ids", key)
        n = len(t)
        limit = getattr(key, "limit", None)
        if limit is not None and limit < n:
            n = limit
        n = n // self.page_size * self.page_size
        return ns, tuple(int(x) for x in t[:n])

    # -- the device pool (radixkv's, not SGLang's allocator) --

    def alloc(self, n: int) -> torch.Tensor:
        """``n`` device indices (evicting through the host tier when short)."""
        return _indices(self.cache.alloc(n))

    def free(self, indices: torch.Tensor) -> None:
        self.cache.free(indices.to(torch.int64).tolist())

    # -- BasePrefixCache's calls --

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """The device prefix of ``params.key`` and ``host_hit_length``: SGLang's
        ``MatchResult`` (``last_device_node`` / ``best_match_node`` carry the indices as
        ``device_indices``; ``last_host_node`` is the same node, which knows ``host_len``)."""
        ns, toks = self._key(params.key)
        m = self.cache.lookup(toks, ns=ns)
        node = HiNode(ns, toks[: m.device_len + m.host_len], m.device_len, m.host_len, _indices(m.slots))
        return tuple.__new__(MatchResult, (m.device_len, node, node, node, m.host_len) + _MATCH_TAIL)

    def init_load_back(self, params: InitLoadBackParams) -> Optional[Tuple[int, HiNode]]:
        """Loads back the host tokens after ``params.best_match_node`` (at most
        ``params.host_hit_length``, and ``mem_quota`` when given): ``(loaded tokens, new
        node)`` whose ``device_indices`` cover the whole prefix, the loaded part pinned
        until the caller's first ``inc_lock_ref`` on it takes over (or
        :meth:`release_load`). ``None`` when the device cannot hold them (retry admission,
        as SGLang's); ``(0, node)`` when the hit is below ``load_back_threshold``."""
        node = params.best_match_node
        want = params.host_hit_length
        if params.mem_quota is not None:
            want = min(want, params.mem_quota)
        if want <= 0 or node.host_len == 0:
            return 0, node
        try:
            t = self.cache.load_back(node.tokens, ns=node.ns, max_tokens=want)
        except OutOfSlotsError:
            return None
        done = self.cache.wait_load(t)
        if done.outcome != "loaded":
            done.lock.release()
            return 0, node
        n = done.lock.length
        new = HiNode(node.ns, node.tokens[:n], n, node.host_len - done.loaded, _indices(done.slots))
        new._loaded.append(done.lock)
        return done.loaded, new

    def release_load(self, node: HiNode) -> None:
        """Unpins what ``init_load_back`` left pinned on ``node``."""
        while node._loaded:
            node._loaded.pop().release()

    def insert(self, params: InsertParams) -> InsertResult:
        """Caches ``params.key`` with ``params.value`` (device indices from :meth:`alloc`),
        backing pages up as the write policy says. ``prefix_len``: tokens cached already
        (their given indices go back to radixkv's pool)."""
        ns, toks = self._key(params.key)
        value = params.value.to(torch.int64).tolist()[: len(toks)]
        prefix = self.cache.insert(toks, value, ns=ns, priority=params.priority or 0)
        return InsertResult(prefix_len=prefix, total_len=len(toks))

    def evict(self, params: EvictParams) -> EvictResult:
        """Evicts device tokens (their host copies stay; ``write_back`` copies first)."""
        return EvictResult(num_tokens_evicted=len(self.cache.evict(params.num_tokens)))

    def evict_host(self, num_tokens: int) -> int:
        """Evicts host tokens (host-only leaves)."""
        return self.cache.evict_host(num_tokens)

    def inc_lock_ref(self, node: HiNode) -> IncLockRefResult:
        if node.device_len == 0:
            return IncLockRefResult(delta=0)
        before = self.evictable_size()
        lock = self.cache.lookup_lock(node.tokens[: node.device_len], ns=node.ns)
        node._locks.append(lock)
        self.release_load(node)
        return IncLockRefResult(delta=self.evictable_size() - before)

    def dec_lock_ref(self, node: HiNode, params: Any = None) -> DecLockRefResult:
        if node.device_len == 0:
            return DecLockRefResult(delta=0)
        if not node._locks:
            raise InvalidLockError("dec_lock_ref: the node is not locked", Status.INVALID_LOCK)
        before = self.evictable_size()
        node._locks.pop().release()
        return DecLockRefResult(delta=self.evictable_size() - before)

    def check_hicache_events(self) -> int:
        """Finishes the copies that are done (SGLang's per-step hook)."""
        return self.cache.poll()

    def evictable_size(self) -> int:
        return self.cache.stats().evictable_tokens

    def protected_size(self) -> int:
        return self.cache.stats().protected_tokens

    def total_size(self) -> int:
        return self.cache.stats().cached_tokens

    def host_size(self) -> int:
        """Host tokens holding a copy."""
        return self.cache.tier_stats().host_backed_slots

    def sanity_check(self) -> None:
        self.cache.wait_all()
        self.cache.check_tier()
