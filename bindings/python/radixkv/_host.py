"""The host tier of a :class:`radixkv.Cache` (SGLang HiCache's semantics, radixkv's
``Cache::with_host``): :class:`HostOptions`, what a cache made with ``host=`` answers
(:class:`TierMatch`, :class:`TierLock`, :class:`LoadTicket`, :class:`Loaded`,
:class:`TierStats`) and :class:`KvLayout`, the shape of the KV bytes of copier ``"host"``.

The methods are :class:`radixkv.Cache`'s (``lookup``, ``lookup_lock``, ``load_back``,
``wait_load``, ``try_load``, ``poll``, ``wait_all``, ``evict_host``, ``tier_stats``,
``check_tier``, ``read_slot``, ``write_slot``, ``kv_pointers``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from ._cache import (
    U64_MAX,
    InvalidArgumentError,
    Lock,
    SlotBuffer,
    Stats,
    Status,
    _size,
)

#: SGLang's ``--hicache-write-policy`` names.
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")

#: What a load-back did: ``"loaded"`` (host pages were copied to the device and
#: inserted), ``"nothing_on_host"`` or ``"too_short"`` (fewer than ``load_back_min``).
LOAD_OUTCOMES = ("loaded", "nothing_on_host", "too_short")


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
class HostOptions:
    """The host tier of a cache: ``Cache(page_size, pool_slots, host=HostOptions(...))``
    (a ``dict`` of these fields, or just the ``host_slots`` int, reads the same). The cache
    needs its device pool (``pool_slots > 0``).

    ``host_slots``: the host tier's size in slots (a positive multiple of the page size).
    ``write_policy`` (SGLang's names, :data:`WRITE_POLICIES`; ``-`` reads as ``_``):
    ``"write_through"`` backs a page up on its first insert, ``"write_through_selective"``
    once ``write_threshold`` inserts reached it, ``"write_back"`` only when the device
    evicts it. ``load_back_min``: load-backs of fewer tokens are not done
    (``"too_short"``). ``host_policy``: the host's eviction order (None: the device's).
    ``copier``: ``"none"`` (the index alone: copies are bookkeeping, no bytes move) or
    ``"host"`` (two host KV stores of ``kv_layout``, the device side and the host side;
    copies are memcpy; read and write them with :meth:`Cache.read_slot` /
    :meth:`Cache.write_slot`, or at :meth:`Cache.kv_pointers`)."""

    host_slots: int
    write_policy: str = "write_through_selective"
    write_threshold: int = 2
    load_back_min: int = 1
    host_policy: Optional[str] = None
    copier: str = "none"
    kv_layout: Union[KvLayout, Tuple[int, int, int, int], None] = None

    def as_dict(self) -> Dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


HostArg = Union[HostOptions, Mapping[str, Any], int, None]


def _host_options(host: HostArg) -> Optional[HostOptions]:
    """``host`` as a :class:`HostOptions` (None: no tier), its ``kv_layout`` a
    :class:`KvLayout`."""
    if host is None:
        return None
    if isinstance(host, Mapping):
        try:
            host = HostOptions(**host)
        except TypeError as e:
            raise TypeError(f"host: {e}") from None
    elif not isinstance(host, HostOptions):
        if isinstance(host, bool) or not isinstance(host, int):
            raise TypeError(
                f"host must be a HostOptions, a dict of its fields or the host_slots int, "
                f"not {type(host).__name__}"
            )
        host = HostOptions(host_slots=host)
    kv = host.kv_layout
    if kv is not None and not isinstance(kv, KvLayout):
        kv = KvLayout(*kv)
        host = HostOptions(**{**host.as_dict(), "kv_layout": kv})
    return host


def _host_args(host: HostOptions) -> Tuple[Any, ...]:
    """What ``NativeCache(..., host=)`` takes, each field checked."""
    for what, v in (("write_policy", host.write_policy), ("copier", host.copier)):
        if not isinstance(v, str):
            raise InvalidArgumentError(f"host.{what} must be a str, got {v!r}", Status.INVALID_ARGUMENT)
    if host.host_policy is not None and not isinstance(host.host_policy, str):
        raise InvalidArgumentError(
            f"host.host_policy must be a str or None, got {host.host_policy!r}", Status.INVALID_ARGUMENT
        )
    host_slots = _size(host.host_slots, "host.host_slots")
    write_threshold = _size(host.write_threshold, "host.write_threshold")
    load_back_min = _size(host.load_back_min, "host.load_back_min")
    if host_slots > U64_MAX:
        raise InvalidArgumentError("host.host_slots out of range", Status.INVALID_ARGUMENT)
    if write_threshold >= 1 << 32:
        raise InvalidArgumentError("host.write_threshold must be below 2**32", Status.INVALID_ARGUMENT)
    kv = None
    if host.kv_layout is not None:
        kv = tuple(_size(x, f"host.kv_layout.{f}") for f, x in asdict(host.kv_layout).items())
    return (
        host_slots,
        host.write_policy,
        write_threshold,
        min(load_back_min, U64_MAX),
        host.host_policy,
        host.copier,
        kv,
    )


@dataclass(frozen=True)
class TierStats:
    """A snapshot of a host-tier cache's counts and counters (:meth:`Cache.tier_stats`;
    exact when no copy is in flight): the device cache's :class:`Stats`, then the host
    tier's."""

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
    """A match on both levels (:meth:`Cache.lookup`): ``device_len`` tokens cached on the
    device (``slots``, not pinned) and ``host_len`` more on the host right after them
    (SGLang's ``host_hit_length``; 0 without a tier)."""

    device_len: int
    host_len: int
    slots: SlotBuffer


class TierLock(Lock):
    """A :class:`Lock` on a device prefix (``length == device_len``), with ``host_len``:
    how far host copies extend it (:meth:`Cache.lookup_lock`)."""

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
    """A load-back started by :meth:`Cache.load_back`; take its result once, with
    :meth:`Cache.wait_load` or :meth:`Cache.try_load`."""

    __slots__ = ("id",)

    def __init__(self, id: int):
        self.id = id

    def __repr__(self) -> str:
        return f"<radixkv.LoadTicket {self.id}>"


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


def _ticket(t: Any) -> int:
    if isinstance(t, LoadTicket):
        return t.id
    raise TypeError(f"expected a LoadTicket, not {type(t).__name__}")


def _loaded(cache: Any, row: Tuple[Any, ...]) -> Loaded:
    h, n, slots, d, loaded, outcome = row
    return Loaded(Lock(cache, h, n, slots), slots, d, loaded, outcome)


def _tier_stats(d: Dict[str, Any]) -> TierStats:
    dev = Stats(*d.pop("device"))
    return TierStats(device=dev, **d)
