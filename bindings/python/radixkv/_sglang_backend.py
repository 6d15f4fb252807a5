"""``RadixKvCache``: a radix-cache backend for SGLang 0.5.x on radixkv's tree.

Imported only when SGLang is installed (``radixkv.sglang.RadixKvCache`` loads it on first
use). See ``radixkv/sglang.py`` for the overview.
"""

from __future__ import annotations

import itertools
import time
from array import array
from typing import Any, Dict, List, Optional, Tuple

import torch
from sglang.srt.disaggregation.kv_events import (
    AllBlocksCleared as SgAllBlocksCleared,
    BlockRemoved as SgBlockRemoved,
    BlockStored as SgBlockStored,
)
from sglang.srt.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    DecLockRefParams,
    TreeLock,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.events import KVCacheEventRecorder
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.utils.common import ceil_align

from ._cache import InvalidLockError, Status
from ._native import ext as _ext

#: SGLang 0.5.23's eviction policies. radixkv's tree has all but ``tlru``; one it lacks is
#: refused at construction (``ValueError``) rather than silently replaced.
SGLANG_POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")


def _radixkv_policy(name: str) -> str:
    """The radixkv policy for SGLang's ``eviction_policy`` ``name`` (``ValueError`` for
    one radixkv cannot honour)."""
    policy = (name or "lru").lower()
    if policy not in SGLANG_POLICIES:
        raise ValueError(
            f"Unknown eviction policy: {policy}. Supported policies: "
            f"'{', '.join(SGLANG_POLICIES)}'."
        )
    try:
        _ext.NativeCache(1, 0, policy, None).close()
    except Exception as e:  # radixkv does not have it (yet)
        raise ValueError(
            f"radixkv's tree has no {policy!r} eviction policy (this build: {e}); "
            "choose another --radix-eviction-policy, or SGLang's own radix cache"
        ) from None
    return policy


class RadixKvMatchResult(MatchResult):
    """SGLang's ``MatchResult`` (the same fields, what the 0.5.23 scheduler reads), plus
    the two names callers written against earlier 0.5.x releases read: ``device_indices``
    (the matched KV indices, an int64 tensor, computed when read) and ``prefix_len``
    (``device_prefix_len``)."""

    __slots__ = ()

    @property
    def device_indices(self) -> torch.Tensor:
        node = self.last_device_node
        cache = getattr(node, "cache", None)
        if cache is None:
            return torch.empty((0,), dtype=torch.int64)
        return cache.path_device_indices(node)[: self.device_prefix_len]

    @property
    def prefix_len(self) -> int:
        return self.device_prefix_len


#: The receipt of every lock ``RadixKvCache.lock`` takes: its ``dec_lock_ref`` reads none.
_RECEIPT = DecLockRefParams()

#: ``MatchResult``'s fields after the first four, at their defaults (a match result is built
#: from a tuple: a third of the keyword constructor's cost).
_MATCH_TAIL = tuple(MatchResult._field_defaults[f] for f in MatchResult._fields[4:])


#: The nodes' ids, from 1 up.
_node_ids = itertools.count(1)


class RadixKvNode:
    """What ``match_prefix`` and ``insert`` return as ``last_device_node``: a prefix of a
    key, named by the key's token buffer and the span of it the tree holds (no copy: the
    prefix must not change while the node is used, as SGLang's request token lists only
    grow), in one namespace. ``lock_ref`` counts the locks ``inc_lock_ref`` took on it.
    ``kept`` (when not None) is the native ``Prefix``: the key's tokens from the span's
    start as u32 (the whole rest of the request's key), converted once per request into a
    buffer that the locks of it share, and the slots of its latest match or lock, so that
    locking, checkpointing and reading the node's KV indices read no key again."""

    __slots__ = ("cache", "ns", "tokens", "start", "stop", "_key", "gen", "_locks", "kept", "id", "__weakref__")

    def __init__(
        self, cache: Any, ns: int, tokens: Any, start: int, stop: int, key: Any, gen: int, kept: Any = None
    ):
        self.cache = cache
        self.ns = ns
        self.tokens = tokens
        self.start = start
        self.stop = stop
        self._key = key
        self.gen = gen
        self._locks: List[int] = []
        self.kept = kept
        self.id = next(_node_ids)

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def key(self) -> Any:
        """The ``RadixKey`` the node was made for (built when first read, for a node whose
        maker did not build one: a plain key of ``tokens`` up to ``stop``)."""
        if self._key is None:
            extra_key, cache_salt = self.cache._ns_key.get(self.ns, (None, None))
            self._key = RadixKey(self.tokens, extra_key, limit=self.stop, cache_salt=cache_salt)
        return self._key

    @property
    def lock_ref(self) -> int:
        return len(self._locks)

    @property
    def evicted(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<RadixKvNode ns={self.ns} len={self.stop - self.start} lock_ref={len(self._locks)}>"


class _Root(RadixKvNode):
    __slots__ = ()

    @property
    def lock_ref(self) -> int:
        return 1


class RadixKvCache(BasePrefixCache):
    """SGLang's radix cache (``RadixCache``'s interface, ``BasePrefixCache`` as the 0.5.x
    scheduler calls it) over a radixkv tree with caller-managed slots: the KV indices stay
    SGLang's (``token_to_kv_pool_allocator``), radixkv indexes them.

    Construct it like SGLang's ``RadixCache``: ``RadixKvCache(CacheInitParams)`` or
    ``RadixKvCache.create_simulated(...)``; select it in a server with
    ``--radix-cache-backend radixkv`` (the package registers it through SGLang's plugin
    entry point, or call :func:`radixkv.sglang.register`).
    """

    def __init__(self, params: CacheInitParams):
        self.disable = params.disable
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = params.page_size
        self.is_eagle = params.is_eagle
        self.eviction_policy = params.eviction_policy.lower()
        self.eviction_policy_config = params.eviction_policy_config
        self.enable_kv_cache_events = bool(params.enable_kv_cache_events)
        self.kv_events = KVCacheEventRecorder(
            enabled=params.enable_kv_cache_events and not self.disable,
            page_size=self.page_size,
            dynamo_format=params.dynamo_kv_event_format,
            lora_names=params.kv_event_lora_names,
        )
        if params.enable_metrics:
            self.init_metrics_collector()
        if self.token_to_kv_pool_allocator:
            dev = self.token_to_kv_pool_allocator.device
            self.device = torch.device(dev) if isinstance(dev, (str, torch.device)) else torch.device("cpu")
        else:
            self.device = torch.device("cpu")
        self._on_cpu = self.device.type == "cpu"
        self._policy = "lru" if self.disable else _radixkv_policy(self.eviction_policy)
        self._slru_threshold: Optional[int] = None
        config = (None if self.disable else self.eviction_policy_config) or {}
        if self._policy == "slru" and "protected_threshold" in config:
            self._slru_threshold = int(config["protected_threshold"])
        self._events_on = self.kv_events.enabled
        self._pending_events: List[Any] = []
        self._gen = 0
        self._n: Any = None
        self.reset()

    @classmethod
    def create_simulated(
        cls,
        disable: bool = False,
        mock_allocator: Optional[Any] = None,
        page_size: int = 1,
        enable_kv_cache_events: bool = False,
        dynamo_kv_event_format: bool = False,
        kv_event_lora_names: Optional[Any] = None,
    ) -> "RadixKvCache":
        """A cache without memory pools, for simulation (SGLang's signature)."""
        params = CacheInitParams(
            disable=disable,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=mock_allocator,
            page_size=page_size,
            enable_kv_cache_events=enable_kv_cache_events,
            dynamo_kv_event_format=dynamo_kv_event_format,
            kv_event_lora_names=kv_event_lora_names,
        )
        return cls(params)

    # ---- the tree ---------------------------------------------------------------------

    def reset(self) -> None:
        """A fresh, empty tree (as SGLang's ``reset``: every lock taken before is void)."""
        if self._n is not None:
            if self._events_on:
                self._pending_events.extend(self._drain_events())
            self._n.close()
        self._gen += 1
        events = (1, 0, 1 << 62) if self._events_on else None  # SGLang's SHA-256 page hashes
        self._n = _ext.NativeCache(self.page_size, 0, self._policy, events, True, self._slru_threshold)
        self._ns: Dict[Any, int] = {}
        self._ns_key: Dict[int, Tuple[Any, Any]] = {0: (None, None)}
        self.root_node = _Root(self, 0, array("q"), 0, 0, RadixKey(token_ids=array("q"), extra_key=None), self._gen)
        self._empty_device_indices = torch.empty((0,), dtype=torch.int64, device=self.device)
        self._rows_of: Any = None  # the pool table `_rows` holds views of
        self._rows: Dict[int, torch.Tensor] = {}
        self._empty_match_result = RadixKvMatchResult(
            device_prefix_len=0,
            last_device_node=self.root_node,
            last_host_node=self.root_node,
            best_match_node=self.root_node,
        )
        if self._events_on:
            self._pending_events.append(SgAllBlocksCleared())

    def _namespace(self, extra_key: Any, cache_salt: Any, first: Optional[int] = None) -> int:
        """The exact namespace of ``(extra_key, cache_salt)`` (and, for a bigram key, its
        first raw token): interned to ids from 1 up, never hashed."""
        k = (extra_key, cache_salt) if first is None else (extra_key, cache_salt, first)
        ns = self._ns.get(k)
        if ns is None:
            if k == (None, None):
                return 0
            ns = len(self._ns) + 1
            self._ns[k] = ns
            self._ns_key[ns] = (extra_key, cache_salt)
            if self._events_on:
                lora = extra_key if isinstance(extra_key, str) and extra_key else None
                salt = cache_salt if isinstance(cache_salt, str) and cache_salt else None
                self._n.set_namespace_meta(ns, lora, salt)
        return ns

    def _span(self, key: RadixKey) -> Tuple[int, int, int]:
        """``(namespace, start, stop)``: the tree holds ``key.token_ids[start:stop]``, the
        key cut to ``limit`` and to whole pages. A bigram key of raw tokens ``t[0..n]``
        (``n - 1`` bigrams ``(t[i], t[i + 1])``) is held as ``t[1:n]`` in a namespace of its
        own per first token ``t[0]``: two bigram keys share their first ``m`` bigrams exactly
        when they share ``t[0]`` and ``t[1:m + 1]``."""
        t = key.token_ids
        n = len(t)
        limit = key.limit
        if limit is not None and limit < n:
            n = limit
        ps = self.page_size
        if key.is_bigram:
            units = n - 1 if n > 0 else 0
            units = units // ps * ps if ps > 1 else units
            if units <= 0:
                return 0, 0, 0
            return self._namespace(key.extra_key, key.cache_salt, int(t[0])), 1, 1 + units
        units = n // ps * ps if ps > 1 else n
        if units <= 0:
            return 0, 0, 0
        ec = key.extra_key, key.cache_salt
        ns = 0 if ec == (None, None) else self._namespace(*ec)
        return ns, 0, units

    def _indices(self, buf: Any) -> torch.Tensor:
        if not len(buf):
            return self._empty_device_indices
        t = torch.frombuffer(buf, dtype=torch.int64)
        return t if self._on_cpu else t.to(self.device, non_blocking=True)

    # ---- BasePrefixCache --------------------------------------------------------------

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """The longest cached prefix of ``params.key``: ``device_prefix_len`` and the node
        (``path_device_indices(node)`` gives its KV indices). Refreshes the prefix's access
        order, as SGLang's does."""
        key = params.key
        if self.disable:
            return self._empty_match_result
        t = key.token_ids
        if self.is_eagle or key.is_bigram:
            key, _ = key.maybe_to_bigram_view(self.is_eagle)
            ns, start, stop = self._span(key)
        else:  # `_span` of a plain key, inline (this runs for every waiting request)
            n = len(t)
            limit = key.limit
            if limit is not None and limit < n:
                n = limit
            ps = self.page_size
            start, stop = 0, (n // ps * ps if ps > 1 else n)
            extra_key, cache_salt = key.extra_key, key.cache_salt
            ns = 0 if extra_key is None and cache_salt is None else self._namespace(extra_key, cache_salt)
        if stop <= start:
            return self._empty_match_result
        m, kept = self._n.prefix_match(ns, t, start, stop, len(t))
        if m == 0:
            req = params.req
            if req is not None and kept is not None:
                # A miss: the request's checkpoint takes the converted key from the request
                # (there is no node to keep it), instead of converting the key again.
                try:
                    req._radixkv_kept = (key.token_ids, start, ns, self._gen, kept)
                except AttributeError:  # a request type that takes no new attributes
                    pass
            return self._empty_match_result
        node = RadixKvNode(self, ns, key.token_ids, start, start + m, key, self._gen, kept)
        # device_prefix_len, last_device_node, last_host_node, best_match_node, the rest.
        return tuple.__new__(RadixKvMatchResult, (m, node, node, node) + _MATCH_TAIL)

    def touch_prefix(self, key: RadixKey) -> None:
        key, _ = key.maybe_to_bigram_view(self.is_eagle)
        if self.disable:
            return
        ns, start, stop = self._span(key)
        if stop > start:
            self._n.span_match_len(ns, key.token_ids, start, stop)

    def insert(self, params: InsertParams) -> InsertResult:
        """Caches ``params.key`` with ``params.value`` (its KV indices; the token ids
        themselves when None, as SGLang's debug fallback). ``prefix_len`` is how much was
        cached already: those indices stay the tree's, and freeing the given duplicates is
        the caller's part, as with SGLang's tree. ``params.priority`` is the ``priority``
        policy's key (every node on the path raised to at least it), ``params.inserted_len``
        what the request inserted before (those nodes count no hit for ``lfu``/``slru``)."""
        if self.disable:
            return InsertResult(prefix_len=0)
        key, value = params.key.maybe_to_bigram_view(self.is_eagle, params.value)
        ns, start, stop = self._span(key)
        if stop == start:
            return InsertResult(prefix_len=0, last_device_node=self.root_node)
        if value is None:
            value = key.token_ids  # raw tokens from 0, as torch.tensor(key.token_ids[:len(key)])
        elif isinstance(value, torch.Tensor) and not value.is_cpu:
            value = value.cpu()
        prefix = self._n.span_insert(
            ns, key.token_ids, start, stop, value, 0, params.priority or 0, params.inserted_len or 0
        )
        node = RadixKvNode(self, ns, key.token_ids, start, stop, key, self._gen)
        return InsertResult(prefix_len=prefix, last_device_node=node)

    def evict(self, params: EvictParams) -> EvictResult:
        """Evicts at least ``params.num_tokens`` tokens in policy order; their KV indices go
        back through the allocator's ``free_segment`` in one call."""
        if self.disable:
            return EvictResult()
        start_time = time.perf_counter()
        n, freed = self._n.evict_i64(params.num_tokens)
        if n:
            alloc = self.token_to_kv_pool_allocator
            if alloc is not None:
                alloc.free_segment(self._indices(freed), start_pos=0)
        self.update_eviction_metrics(n, start_time)
        return EvictResult(num_tokens_evicted=n)

    def inc_lock_ref(self, node: Any) -> IncLockRefResult:
        """Pins ``node``'s prefix; ``delta`` is the change of ``evictable_size()`` (<= 0)."""
        if self.disable or node.stop == node.start or node.gen != self._gen:
            return IncLockRefResult(delta=0)
        if node.kept is not None:
            h, n, delta = self._n.prefix_lock(node.kept, node.stop - node.start)
        else:
            h, n, delta = self._n.span_lock(node.ns, node.tokens, node.start, node.stop)
        if n < node.stop - node.start:
            node.stop = node.start + n  # evicted since it was matched: what is left
        node._locks.append(h)
        return IncLockRefResult(delta=delta)

    def dec_lock_ref(self, node: Any, params: Optional[DecLockRefParams] = None) -> DecLockRefResult:
        """Unpins what one ``inc_lock_ref(node)`` pinned; ``delta`` >= 0."""
        if self.disable or node.stop == node.start or node.gen != self._gen:
            return DecLockRefResult(delta=0)
        if not node._locks:
            raise InvalidLockError("dec_lock_ref: the node is not locked", Status.INVALID_LOCK)
        return DecLockRefResult(delta=self._n.span_release(node._locks.pop()))

    def lock(self, node: Any) -> Optional[TreeLock]:
        """SGLang's ``lock``: ``inc_lock_ref(node)`` behind a ``TreeLock`` for ``unlock``
        (the same, without the ``IncLockRefResult`` ``lock`` does not return)."""
        if not (self.disable or node.stop == node.start or node.gen != self._gen):
            if node.kept is not None:
                h, n, _ = self._n.prefix_lock(node.kept, node.stop - node.start)
            else:
                h, n, _ = self._n.span_lock(node.ns, node.tokens, node.start, node.stop)
            if n < node.stop - node.start:
                node.stop = node.start + n  # evicted since it was matched: what is left
            node._locks.append(h)
        return TreeLock(node, _RECEIPT)

    def unlock(self, lock: Optional[TreeLock]) -> None:
        """SGLang's ``unlock``: ``dec_lock_ref`` of the lock's node, the delta not measured
        (``unlock`` returns none)."""
        if lock is None:
            return
        node = lock.node
        if self.disable or node.stop == node.start or node.gen != self._gen:
            return
        if not node._locks:
            raise InvalidLockError("dec_lock_ref: the node is not locked", Status.INVALID_LOCK)
        self._n.release(node._locks.pop())

    def path_device_indices(self, node: Any) -> torch.Tensor:
        """The KV indices of ``node``'s prefix (an int64 tensor on the cache's device): a
        locked node's from the slots its lock pinned (they cannot change while it holds),
        any other's matched again."""
        if node.stop == node.start or node.gen != self._gen:
            return self._empty_device_indices
        kept = node.kept
        if kept is not None:
            return self._indices(self._n.prefix_slots_i64(kept, node.stop - node.start, not node._locks))
        return self._indices(self._n.span_match_i64(node.ns, node.tokens, node.start, node.stop))

    def prefix_device_indices(self, req: Any) -> torch.Tensor:
        """``BasePrefixCache.prefix_device_indices``: the KV indices of the request's
        matched prefix (``req.prefix_len`` of ``req.last_node``'s), read for that length
        only (no longer tensor cut)."""
        node = req.last_node
        m = req.prefix_len
        if node.stop == node.start or node.gen != self._gen or node.kept is None:
            path = self.path_device_indices(node)
            assert len(path) >= m, (req.rid, len(path), m)
            return path[:m]
        assert node.stop - node.start >= m, (req.rid, node.stop - node.start, m)
        return self._indices(self._n.prefix_slots_i64(node.kept, m, not node._locks))

    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        """SGLang's ``RadixCache.checkpoint``: inserts the request's KV up to ``up_to``,
        frees the duplicates the insert exposed, repoints the request's row at the tree's
        indices, and moves the request's lock to the new node. One native call inserts,
        pins the inserted prefix and releases the old lock; only the duplicates' part of the
        row is rewritten (the rest of it already holds what the tree now caches)."""
        if self.disable:
            return
        token_ids = req.full_untruncated_fill_ids
        n_ids = min(up_to, len(token_ids))
        swa_evict_floor = req.kv.swa_evict_floor
        limit = n_ids
        if swa_evict_floor > 0:  # SGLang's key cut to that many (page-aligned) units
            units = ceil_align(swa_evict_floor, self.page_size)
            limit = min(limit, units + 1 if self.is_eagle else units)
        extra_key, cache_salt = req.extra_key, req.cache_salt
        if self.is_eagle:
            key = RadixKey(token_ids, extra_key, is_bigram=True, limit=limit, cache_salt=cache_salt)
            # The key, page-aligned (a bigram key of n raw tokens spans n - 1 bigrams).
            ns, start, stop = self._span(key)
        else:
            # `_span` of RadixKey(token_ids, extra_key, limit=limit, cache_salt=cache_salt),
            # without building the key (the node keeps none: see RadixKvNode.key).
            ps = self.page_size
            start, stop = 0, (limit // ps * ps if ps > 1 else limit)
            if stop <= 0:
                ns = stop = 0
            elif extra_key is None and cache_salt is None:
                ns = 0
            else:
                ns = self._namespace(extra_key, cache_salt)
            key = None
        key_len = stop - start
        kv = req.kv
        protected = kv.cache_protected_len
        # The request's row of the pool (a view, made once per pool row: torch's indexing
        # costs as much as the rest of this method's Python).
        table = self.req_to_token_pool.req_to_token
        if table is not self._rows_of:
            self._rows_of, self._rows = table, {}
        row = self._rows.get(kv.req_pool_idx)
        if row is None:
            row = self._rows[kv.req_pool_idx] = table[kv.req_pool_idx]
        old = req.lock
        old_h = 0
        kept = None
        if old is not None:
            on = old.node
            if on.stop != on.start and on.gen == self._gen:
                if not on._locks:
                    raise InvalidLockError("dec_lock_ref: the node is not locked", Status.INVALID_LOCK)
                old_h = on._locks.pop()
                # The request's key as the match (or the last checkpoint) converted it: the
                # same append-only token array, from the same start, in the same namespace.
                # The checkpoint takes it, so the old node reads its buffer from now on.
                if on.kept is not None and on.tokens is token_ids and on.start == start and on.ns == ns:
                    kept = on.kept
                    on.kept = None
            req.lock = None
        # The key a missed match converted (see match_prefix), on the same terms; taken off
        # the request in any case (a later match may have hit and kept it on its node).
        miss = getattr(req, "_radixkv_kept", None)
        if miss is not None:
            req._radixkv_kept = None
            if kept is None and miss[0] is token_ids and miss[1] == start and miss[2] == ns and miss[3] == self._gen:
                kept = miss[4]
        if key_len == 0:
            if old_h:
                self._n.span_release(old_h)
            req.lock = self.lock(self.root_node)
            req.last_node = self.root_node
            kv.cache_protected_len = 0
            return
        # The row's entry i is the value of key position i (a bigram key's position i is the
        # bigram (t[i], t[i + 1]): the row's entry i too, as SGLang's view of the values).
        # The tree reads host memory, the row's first key_len values in place (a device
        # row: one copy of them, as SGLang's .to()).
        values = row if row.is_cpu else row[:key_len].cpu()
        try:
            prefix, h, n, dup, kept = self._n.span_checkpoint(
                ns, token_ids, start, stop, values, 0, protected, old_h,
                req.priority or 0, kv.cache_inserted_len, kept,
            )
        except BaseException:
            # Refused before the old lock was released (a bad id or value): the request
            # keeps it, as SGLang's checkpoint leaves the lock when its insert raises.
            if old_h:
                old.node._locks.append(old_h)
            req.lock = old
            raise
        kv.cache_inserted_len = max(kv.cache_inserted_len, key_len)
        if prefix > protected:
            alloc = self.token_to_kv_pool_allocator
            alloc.free_segment(row[protected:prefix], start_pos=protected)
            row[protected:prefix] = self._indices(dup).to(row.dtype)
        assert n == key_len, f"{n=}, {key_len=}"
        node = RadixKvNode(self, ns, token_ids, start, stop, key, self._gen, kept)
        node._locks.append(h)
        kv.cache_protected_len = key_len
        req.lock = TreeLock(node, _RECEIPT)
        req.last_node = node

    def dfs_weight_order(self, node_handles: Any) -> List[int]:
        """Request indices in a depth-first order of their matched prefixes (by namespace,
        then token order: requests that share a prefix come together). SGLang's also puts
        heavier subtrees first; radixkv keeps no Python-side tree to weigh."""

        def key(i: int) -> Any:
            n = node_handles[i]
            if n.stop == n.start:
                return (-1, ())
            return (n.ns, tuple(n.tokens[n.start : n.stop]))

        return sorted(range(len(node_handles)), key=key)

    def is_root(self, node: Any) -> bool:
        return node is self.root_node or node.stop == node.start

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    def evictable_size(self) -> int:
        return self._n.sizes()[1]

    def protected_size(self) -> int:
        return self._n.sizes()[2]

    def total_size(self) -> int:
        return self._n.sizes()[0]

    def all_values_flatten(self) -> torch.Tensor:
        """Every cached KV index (an int64 tensor, in index order)."""
        return self._indices(self._n.cached_slots_i64())

    def pretty_print(self) -> None:
        """The tree's size, per namespace (radixkv does not expose its nodes to Python)."""
        cached, evictable, protected = self._n.sizes()
        stats = self._n.stats()
        print(f"radixkv tree: {stats[3]} nodes in {stats[11]} namespaces, protected={protected}, evictable={evictable}")
        for ns, (extra_key, salt) in sorted(self._ns_key.items()):
            c, e, p, nodes = self._n.namespace_stats(ns)
            if c:
                print(f"  namespace {ns} (extra_key={extra_key!r}, cache_salt={salt!r}): {c} tokens, {nodes} nodes, r={p}")
        print(f"#tokens: {cached}")

    def sanity_check(self) -> None:
        """Raises ``AssertionError`` if the tree's invariants (counters, structure) do not
        hold; meant at quiescence, as SGLang calls it."""
        bad = self._n.check_invariants()
        assert bad is None, f"radixkv tree invariants: {bad}"

    def take_events(self) -> List[Any]:
        """The KV events since the last call, as SGLang's ``BlockStored`` /
        ``BlockRemoved`` / ``AllBlocksCleared``, with SGLang's SHA-256 page hashes
        (``namespaced_block_hash`` in a namespace with an ``extra_key`` or salt, as SGLang's
        dynamo format publishes them)."""
        if not self._events_on:
            return []
        out, self._pending_events = self._pending_events, []
        out.extend(self._drain_events())
        return out

    def _drain_events(self) -> List[Any]:
        self._n.flush_events()
        out: List[Any] = []
        resolve = self.kv_events.lora_names.resolve
        for seq, ts, kind, medium, block_size, parent, hashes, tokens, lora, salt in self._n.drain_events(True):
            if kind == 0:
                out.append(
                    SgBlockStored(
                        block_hashes=hashes,
                        parent_block_hash=parent,
                        token_ids=tokens,
                        block_size=block_size,
                        lora_id=None,
                        medium=medium,
                        cache_salt=salt,
                        lora_name=resolve(lora) if lora else None,
                    )
                )
            elif kind == 1:
                out.append(SgBlockRemoved(block_hashes=hashes, medium=medium))
            else:
                out.append(SgAllBlocksCleared())
        return out

    def __repr__(self) -> str:
        return f"<radixkv.sglang.RadixKvCache page_size={self.page_size} policy={self._policy!r}>"


def _factory(ctx: Any) -> RadixKvCache:
    """SGLang's radix-cache factory signature: ``(TreeCacheBuildContext) -> cache``."""
    return RadixKvCache(ctx.params)


def register() -> bool:
    """Registers the backend ``radixkv`` with SGLang (``--radix-cache-backend radixkv``);
    False if it was registered already. SGLang's plugin loader calls this (the package's
    ``sglang.srt.plugins`` entry point)."""
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

    if get_radix_cache_factory("radixkv") is not None:
        return False
    register_radix_cache_backend("radixkv", _factory)
    return True

