"""``TieredCache``: a device cache with its slot pool and a host memory tier behind it
(SGLang HiCache's semantics), over radixkv's ``radixkv::tier::TieredCache``."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from ._cache import (
    SIZE_MAX,
    U64_MAX,
    Cache,
    EventOptions,
    InvalidArgumentError,
    KvEvent,
    Lock,
    Namespace,
    SlotBuffer,
    Stats,
    Status,
    U32Array,
    _HASH_MODES,
    _MEDIA,
    _Unique,
    _c_size,
    _choice,
    _event,
    _size,
)
from . import _native

_ext = _native.ext

#: SGLang's ``--hicache-write-policy`` names.
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")


@dataclass(frozen=True)
class KvLayout:
    """The shape of the KV bytes a ``copier="host"`` cache keeps (per layer one K and one V
    buffer of ``[slots, num_kv_heads, head_dim]`` elements of ``elem_bytes`` bytes), on
    the device side (``pool_slots`` slots) and on the host side (``host_slots``)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    elem_bytes: int

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot in one buffer (one layer, K or V)."""
        return self.num_kv_heads * self.head_dim * self.elem_bytes


@dataclass(frozen=True)
class TierStats:
    """A snapshot of a :class:`TieredCache`'s counts and counters (exact when no copy is
    in flight): the device cache's :class:`Stats`, then the host tier's."""

    device: Stats
    host_slots: int
    host_free_slots: int
    host_backed_slots: int
    host_resident_pages: int
    host_pinned_pages: int
    host_evictable_pages: int
    device_hit_tokens: int
    host_hit_tokens: int
    tokens_to_host: int
    tokens_written_back: int
    tokens_to_device: int
    copies_to_host: int
    copies_to_device: int
    copy_failures: int
    load_backs: int
    load_backs_skipped: int
    host_evicted_pages: int
    in_flight: int

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TierMatch:
    """A match on both levels: ``device_len`` tokens cached on the device (``slots``, not
    pinned) and ``host_len`` more on the host right after them (SGLang's
    ``host_hit_length``)."""

    device_len: int
    host_len: int
    slots: SlotBuffer


class TierLock(Lock):
    """A :class:`Lock` on a device prefix (``length == device_len``), with ``host_len``:
    how far host copies extend it."""

    __slots__ = ("host_len",)

    def __init__(self, cache: Any, handle: int, length: int, slots: Any, host_len: int):
        super().__init__(cache, handle, length, slots)
        self.host_len = host_len

    @property
    def device_len(self) -> int:
        return self.length

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return (
            f"<radixkv.TierLock {self.handle:#x} device_len={self.length} "
            f"host_len={self.host_len} {state}>"
        )


class LoadTicket:
    """A load-back started by :meth:`TieredCache.load_back`; take its result once, with
    :meth:`TieredCache.wait_load` or :meth:`TieredCache.try_load`."""

    __slots__ = ("id",)

    def __init__(self, id: int):
        self.id = id

    def __repr__(self) -> str:
        return f"<radixkv.LoadTicket {self.id}>"


#: What a load-back did: ``"loaded"`` (host pages were copied to the device and
#: inserted), ``"nothing_on_host"`` or ``"too_short"`` (fewer than ``load_back_min``).
LOAD_OUTCOMES = ("loaded", "nothing_on_host", "too_short")


@dataclass(frozen=True)
class Loaded:
    """A finished load-back: ``lock`` pins the device prefix with the loaded pages
    (``lock.length == device_len + loaded``; release it), ``slots`` are their device
    slots, ``device_len`` the tokens that were on the device before, ``loaded`` those
    copied from the host, ``outcome`` one of :data:`LOAD_OUTCOMES`."""

    lock: Lock
    slots: SlotBuffer
    device_len: int
    loaded: int
    outcome: str


class TieredCache(_Unique):
    """A two-level prefix cache: a device cache with its slot pool (``pool_slots``) and a
    host tier of ``host_slots`` slots (SGLang HiCache's semantics).

    Device options are :class:`Cache`'s (``page_size``, ``pool_slots`` > 0, ``policy``,
    ``slru_threshold``, ``events``). Tier options: ``write_policy`` (SGLang's names,
    :data:`WRITE_POLICIES`: ``"write_through"`` backs a page up on its first insert,
    ``"write_through_selective"`` once ``write_threshold`` inserts reached it,
    ``"write_back"`` only when the device evicts it), ``load_back_min`` (load-backs of
    fewer tokens are not done: ``"too_short"``), ``host_policy`` (the host's eviction
    order; None: the device's).

    ``copier``: ``"none"`` (the index alone: copies are bookkeeping, no bytes move) or
    ``"host"`` (two host KV stores of ``kv_layout``, the device side and the host side;
    copies are memcpy, read and write them with :meth:`read_slot` / :meth:`write_slot`, or
    at :meth:`kv_pointers`).

    The request cycle: :meth:`match_and_lock` (device prefix pinned, ``host_len`` known),
    :meth:`load_back` + :meth:`wait_load` when the host extends it, :meth:`alloc` the rest,
    write its KV, :meth:`insert`, release the locks. Copies finish in the background;
    every call polls them, :meth:`poll` and :meth:`wait_all` do it explicitly. Thread-safe;
    the GIL is released inside the library.
    """

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
        self._names: Dict[Tuple[type, Any], int] = {}
        self._names_lock = threading.Lock()
        for what, v in (("policy", policy), ("write_policy", write_policy), ("copier", copier)):
            if not isinstance(v, str):
                raise InvalidArgumentError(f"{what} must be a str, got {v!r}", Status.INVALID_ARGUMENT)
        if host_policy is not None and not isinstance(host_policy, str):
            raise InvalidArgumentError(
                f"host_policy must be a str or None, got {host_policy!r}", Status.INVALID_ARGUMENT
            )
        page_size = _size(page_size, "page_size")
        pool_slots = _size(pool_slots, "pool_slots")
        host_slots = _size(host_slots, "host_slots")
        write_threshold = _size(write_threshold, "write_threshold")
        load_back_min = _size(load_back_min, "load_back_min")
        if not page_size < 1 << 32 or pool_slots > U64_MAX or host_slots > U64_MAX:
            raise InvalidArgumentError("page_size, pool_slots or host_slots out of range", Status.INVALID_ARGUMENT)
        if write_threshold >= 1 << 32:
            raise InvalidArgumentError("write_threshold must be below 2**32", Status.INVALID_ARGUMENT)
        kv = None
        if kv_layout is not None:
            if not isinstance(kv_layout, KvLayout):
                kv_layout = KvLayout(*kv_layout)
            kv = tuple(_size(x, f"kv_layout.{f}") for f, x in asdict(kv_layout).items())
        if events is True:
            events = EventOptions()
        elif events is False:
            events = None
        elif events is not None and not isinstance(events, EventOptions):
            raise TypeError(f"events must be a bool or an EventOptions, not {type(events).__name__}")
        ev = None
        if events is not None:
            ev = (
                _choice(events.hash_mode, _HASH_MODES, "events.hash_mode"),
                _choice(events.medium, _MEDIA, "events.medium"),
                min(_size(events.max_drain_batches, "events.max_drain_batches"), U64_MAX),
            )
        if slru_threshold is not None:
            slru_threshold = _size(slru_threshold, "slru_threshold")
            if slru_threshold >= 1 << 32:
                raise InvalidArgumentError("slru_threshold must be below 2**32", Status.INVALID_ARGUMENT)
        self._n = _ext.NativeTieredCache(
            page_size,
            pool_slots,
            policy,
            host_slots,
            write_policy,
            write_threshold,
            min(load_back_min, U64_MAX),
            host_policy,
            copier,
            kv,
            ev,
            slru_threshold,
        )
        self.page_size = int(page_size)
        self.pool_slots = int(pool_slots)
        self.host_slots = int(host_slots)
        self.policy = policy.lower()
        self.write_policy: str = self._n.write_policy
        self.copier = copier
        #: The KV layout (copier ``"host"``), else None.
        self.kv_layout: Optional[KvLayout] = kv_layout
        #: The event options the cache was made with (None: events off).
        self.events_options: Optional[EventOptions] = events

    # -- lifetime --

    def close(self) -> None:
        """Waits for the copies in flight, releases the outstanding locks and frees the
        cache. Further calls raise :class:`CacheClosedError`. Idempotent."""
        n = getattr(self, "_n", None)
        if n is not None:
            n.close()

    @property
    def closed(self) -> bool:
        return self._n.closed

    def __enter__(self) -> "TieredCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    namespace_id = Cache.namespace_id

    # -- matching --

    def match_prefix(self, tokens: U32Array, ns: Namespace = 0) -> TierMatch:
        """The device prefix of ``tokens`` (not pinned) and how far the host extends it."""
        d, h, slots = self._n.match_prefix(self.namespace_id(ns), tokens)
        return TierMatch(d, h, slots)

    def match_and_lock(self, tokens: U32Array, ns: Namespace = 0) -> TierLock:
        """:meth:`match_prefix`, pinning the device prefix: a :class:`TierLock`."""
        h, d, host, slots = self._n.match_lock(self.namespace_id(ns), tokens)
        return TierLock(self, h, d, slots, host)

    def release(self, lock: Lock) -> None:
        """Releases ``lock`` (as ``lock.release()``)."""
        lock.release()

    # -- the device pool --

    def alloc(self, n: int) -> SlotBuffer:
        """``n`` device slots, all or nothing, evicting (through the host tier) when short;
        :class:`OutOfSlotsError` when even that cannot free enough."""
        return self._n.alloc(_c_size(_size(n, "n")))

    def free(self, slots: U32Array) -> None:
        """Gives allocated, never inserted device slots back (refused whole)."""
        self._n.free(slots)

    # -- inserting --

    def insert(self, tokens: U32Array, slots: U32Array, ns: Namespace = 0, *, priority: int = 0) -> int:
        """Caches ``tokens`` with their device ``slots`` (from :meth:`alloc`, each page one
        whole pool page; cut down to whole pages) and backs the pages up as the write policy
        says. Returns how many leading tokens were cached already (their slots go back to
        the pool). ``priority`` as :meth:`Cache.insert`'s."""
        return self._n.insert(self.namespace_id(ns), tokens, slots, priority)

    def insert_lock(
        self, tokens: U32Array, slots: U32Array, ns: Namespace = 0, *, priority: int = 0
    ) -> Tuple[int, Lock]:
        """:meth:`insert` that also pins the inserted prefix: ``(existing, lock)``."""
        e, h, n = self._n.insert_lock(self.namespace_id(ns), tokens, slots, priority)
        return e, Lock(self, h, n, SlotBuffer("I"))

    # -- eviction --

    def evict(self, n_tokens: int) -> int:
        """Evicts at least ``n_tokens`` device tokens: their host copies stay (host-only);
        under ``write_back`` pages without one are copied first. Returns the tokens freed."""
        return self._n.evict(_c_size(_size(n_tokens, "n_tokens")))

    def evict_host(self, n_tokens: int) -> int:
        """Evicts at least ``n_tokens`` host tokens (host-only leaves, by the host policy;
        never a page being copied or pinned): the host tokens freed."""
        return self._n.evict_host(_c_size(_size(n_tokens, "n_tokens")))

    # -- load-back --

    def load_back(self, tokens: U32Array, ns: Namespace = 0, max_tokens: Optional[int] = None) -> LoadTicket:
        """Starts loading back the host pages that extend the device match of ``tokens``
        (at most ``max_tokens``): allocates device slots (evicting when short;
        :class:`OutOfSlotsError` with nothing changed when the pool cannot hold them) and
        starts the copy. Take the result with :meth:`wait_load` or :meth:`try_load`."""
        m = SIZE_MAX if max_tokens is None else _c_size(_size(max_tokens, "max_tokens"))
        return LoadTicket(self._n.load_back(self.namespace_id(ns), tokens, m))

    def _loaded(self, row: Tuple[Any, ...]) -> Loaded:
        h, n, slots, d, loaded, outcome = row
        return Loaded(Lock(self, h, n, slots), slots, d, loaded, outcome)

    def wait_load(self, ticket: LoadTicket) -> Loaded:
        """Waits for a load-back and takes its result (a failed copy is a
        :class:`DeviceError`, everything rolled back; a ticket already taken is an
        :class:`InvalidArgumentError`)."""
        return self._loaded(self._n.wait_load(_ticket(ticket)))

    def try_load(self, ticket: LoadTicket) -> Optional[Loaded]:
        """The load-back's result if it is done (taking it), else None."""
        row = self._n.try_load(_ticket(ticket))
        return None if row is None else self._loaded(row)

    def poll(self) -> int:
        """Finishes the copies that are done: how many (an engine calls it once a step)."""
        return self._n.poll()

    def wait_all(self) -> None:
        """Waits for every copy in flight and finishes it."""
        self._n.wait_all()

    # -- stats --

    def stats(self) -> TierStats:
        d = self._n.stats()
        dev = Stats(*d.pop("device"))
        return TierStats(device=dev, **d)

    def check(self) -> None:
        """Checks the invariants that hold at quiescence (no copy in flight, no other
        thread using the cache); raises ``AssertionError`` naming the first violation."""
        err = self._n.check()
        if err is not None:
            raise AssertionError(err)

    # -- KV events --

    def flush_events(self) -> Optional[int]:
        """Closes the events recorded so far into one batch: its sequence number, or None."""
        return self._n.flush_events()

    def events(self) -> Iterator[KvEvent]:
        """Takes every closed batch (as :meth:`Cache.events`): device pages with the
        events' medium, host copies as ``"CPU_PINNED"``."""
        return iter([_event(r) for r in self._n.drain_events()])

    # -- KV bytes (copier "host") --

    def read_slot(self, slot: int, layer: int, side: str = "device") -> Tuple[bytes, bytes]:
        """Slot ``slot``'s K and V bytes at ``layer`` of the ``side`` store
        (``"device"`` or ``"host"``)."""
        return self._n.read_slot(side, _size(layer, "layer"), _size(slot, "slot"))

    def write_slot(self, slot: int, layer: int, k: bytes, v: bytes, side: str = "device") -> None:
        """Writes slot ``slot``'s K and V bytes (``kv_layout.slot_bytes`` each) at
        ``layer`` of the ``side`` store."""
        self._n.write_slot(side, _size(layer, "layer"), _size(slot, "slot"), bytes(k), bytes(v))

    def kv_pointers(self, side: str = "device") -> List[Tuple[int, int]]:
        """The ``(K, V)`` buffer addresses of each layer of the ``side`` store (host
        memory; each buffer ``[slots, num_kv_heads, head_dim]`` elements)."""
        return self._n.kv_ptrs(side)

    def __repr__(self) -> str:
        if self._n.closed:
            return "<radixkv.TieredCache closed>"
        return (
            f"<radixkv.TieredCache page_size={self.page_size} pool_slots={self.pool_slots} "
            f"host_slots={self.host_slots} write_policy={self.write_policy} copier={self.copier}>"
        )


def _ticket(t: Any) -> int:
    if isinstance(t, LoadTicket):
        return t.id
    raise TypeError(f"expected a LoadTicket, not {type(t).__name__}")
