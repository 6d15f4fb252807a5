"""``TieredCache``: deprecated. A :class:`radixkv.Cache` made with ``host=`` is the cache
with a host tier; ``TieredCache`` is a thin wrapper over one, kept so code written for it
works (each method forwards to the :class:`Cache` method named in its docstring)."""

from __future__ import annotations

import warnings
from typing import Any, Iterator, List, Optional, Tuple, Union

from ._cache import Cache, EventOptions, KvEvent, Lock, Namespace, SlotBuffer, U32Array, _Unique, _size
from ._host import (
    LOAD_OUTCOMES,
    WRITE_POLICIES,
    HostOptions,
    KvLayout,
    Loaded,
    LoadTicket,
    TierLock,
    TierMatch,
    TierStats,
)

__all__ = [
    "LOAD_OUTCOMES",
    "WRITE_POLICIES",
    "KvLayout",
    "Loaded",
    "LoadTicket",
    "TieredCache",
    "TierLock",
    "TierMatch",
    "TierStats",
]


class TieredCache(_Unique):
    """Deprecated: use ``radixkv.Cache(page_size, pool_slots, host=HostOptions(host_slots,
    ...))``, which has every method of this class (``match_prefix`` is
    :meth:`Cache.lookup`, ``match_and_lock`` :meth:`Cache.lookup_lock`, ``stats``
    :meth:`Cache.tier_stats`, ``check`` :meth:`Cache.check_tier`) and all of
    :class:`Cache`'s. Constructing one warns with a ``DeprecationWarning``.

    The arguments are :class:`Cache`'s (``page_size``, ``pool_slots``, ``policy``,
    ``events``, ``slru_threshold``) and :class:`HostOptions`'s (``host_slots``,
    ``write_policy``, ``write_threshold``, ``load_back_min``, ``host_policy``,
    ``copier``, ``kv_layout``). ``cache`` is the :class:`Cache` it wraps."""

    def __init__(
        self,
        page_size: int = 1,
        pool_slots: int = 0,
        host_slots: int = 0,
        policy: str = "lru",
        write_policy: str = "write_through_selective",
        write_threshold: int = 2,
        load_back_min: int = 1,
        host_policy: Optional[str] = None,
        copier: str = "none",
        kv_layout: Union[KvLayout, Tuple[int, int, int, int], None] = None,
        events: Union[bool, EventOptions, None] = None,
        slru_threshold: Optional[int] = None,
    ):
        warnings.warn(
            "radixkv.TieredCache is deprecated: use radixkv.Cache(page_size, pool_slots, "
            "host=radixkv.HostOptions(host_slots, ...)), which has the same methods",
            DeprecationWarning,
            stacklevel=2,
        )
        host = HostOptions(
            host_slots=host_slots,
            write_policy=write_policy,
            write_threshold=write_threshold,
            load_back_min=load_back_min,
            host_policy=host_policy,
            copier=copier,
            kv_layout=kv_layout,
        )
        #: The :class:`Cache` (with its host tier) this wraps.
        self.cache = Cache(page_size, pool_slots, policy, events=events, slru_threshold=slru_threshold, host=host)
        h = self.cache.host
        assert h is not None
        self.page_size = self.cache.page_size
        self.pool_slots = self.cache.pool_slots
        self.host_slots = int(_size(host_slots, "host_slots"))
        self.policy = self.cache.policy
        self.write_policy: str = h.write_policy
        self.copier = copier
        #: The KV layout (copier ``"host"``), else None.
        self.kv_layout: Optional[KvLayout] = h.kv_layout  # type: ignore[assignment]
        #: The event options the cache was made with (None: events off).
        self.events_options: Optional[EventOptions] = self.cache.events_options

    @property
    def _n(self) -> Any:
        return self.cache._n

    # -- lifetime --

    def close(self) -> None:
        """:meth:`Cache.close`."""
        c = getattr(self, "cache", None)
        if c is not None:
            c.close()

    @property
    def closed(self) -> bool:
        return self.cache.closed

    def __enter__(self) -> "TieredCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def namespace_id(self, ns: Namespace) -> int:
        """:meth:`Cache.namespace_id`."""
        return self.cache.namespace_id(ns)

    # -- matching --

    def match_prefix(self, tokens: U32Array, ns: Namespace = 0) -> TierMatch:
        """:meth:`Cache.lookup`."""
        return self.cache.lookup(tokens, ns)

    def match_and_lock(self, tokens: U32Array, ns: Namespace = 0) -> TierLock:
        """:meth:`Cache.lookup_lock`."""
        return self.cache.lookup_lock(tokens, ns)

    def release(self, lock: Lock) -> None:
        """Releases ``lock`` (as ``lock.release()``)."""
        lock.release()

    # -- the device pool --

    def alloc(self, n: int) -> SlotBuffer:
        """:meth:`Cache.alloc`."""
        return self.cache.alloc(n)

    def free(self, slots: U32Array) -> None:
        """:meth:`Cache.free`."""
        self.cache.free(slots)

    # -- inserting --

    def insert(self, tokens: U32Array, slots: U32Array, ns: Namespace = 0, *, priority: int = 0) -> int:
        """:meth:`Cache.insert`."""
        return self.cache.insert(tokens, slots, ns, priority=priority)

    def insert_lock(
        self, tokens: U32Array, slots: U32Array, ns: Namespace = 0, *, priority: int = 0
    ) -> Tuple[int, Lock]:
        """:meth:`Cache.insert_lock`."""
        return self.cache.insert_lock(tokens, slots, ns, priority=priority)

    # -- eviction --

    def evict(self, n_tokens: int) -> int:
        """:meth:`Cache.evict`, returning the device tokens freed (their host copies
        stay; under ``write_back`` pages without one are copied first)."""
        return len(self.cache.evict(n_tokens))

    def evict_host(self, n_tokens: int) -> int:
        """:meth:`Cache.evict_host`."""
        return self.cache.evict_host(n_tokens)

    # -- load-back --

    def load_back(self, tokens: U32Array, ns: Namespace = 0, max_tokens: Optional[int] = None) -> LoadTicket:
        """:meth:`Cache.load_back`."""
        return self.cache.load_back(tokens, ns, max_tokens)

    def wait_load(self, ticket: LoadTicket) -> Loaded:
        """:meth:`Cache.wait_load`."""
        return self.cache.wait_load(ticket)

    def try_load(self, ticket: LoadTicket) -> Optional[Loaded]:
        """:meth:`Cache.try_load`."""
        return self.cache.try_load(ticket)

    def poll(self) -> int:
        """:meth:`Cache.poll`."""
        return self.cache.poll()

    def wait_all(self) -> None:
        """:meth:`Cache.wait_all`."""
        self.cache.wait_all()

    # -- stats --

    def stats(self) -> TierStats:
        """:meth:`Cache.tier_stats`."""
        return self.cache.tier_stats()

    def check(self) -> None:
        """:meth:`Cache.check_tier`."""
        self.cache.check_tier()

    # -- KV events --

    def flush_events(self) -> Optional[int]:
        """:meth:`Cache.flush_events`."""
        return self.cache.flush_events()

    def events(self) -> Iterator[KvEvent]:
        """:meth:`Cache.events` (host copies as ``"CPU_PINNED"``)."""
        return self.cache.events()

    # -- KV bytes (copier "host") --

    def read_slot(self, slot: int, layer: int, side: str = "device") -> Tuple[bytes, bytes]:
        """:meth:`Cache.read_slot`."""
        return self.cache.read_slot(slot, layer, side)

    def write_slot(self, slot: int, layer: int, k: bytes, v: bytes, side: str = "device") -> None:
        """:meth:`Cache.write_slot`."""
        self.cache.write_slot(slot, layer, k, v, side)

    def kv_pointers(self, side: str = "device") -> List[Tuple[int, int]]:
        """:meth:`Cache.kv_pointers`."""
        return self.cache.kv_pointers(side)

    def __repr__(self) -> str:
        if self.cache.closed:
            return "<radixkv.TieredCache closed>"
        return (
            f"<radixkv.TieredCache page_size={self.page_size} pool_slots={self.pool_slots} "
            f"host_slots={self.host_slots} write_policy={self.write_policy} copier={self.copier}>"
        )
