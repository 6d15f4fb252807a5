"""The Python face of the native extension (``radixkv._radixkv``, over radixkv's Rust
API): Cache, Lock, Stats, the KV-event types and the error classes."""

from __future__ import annotations

import enum
import operator
import threading
from array import array
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from . import _native

_ext = _native.ext

SIZE_MAX = (1 << 64) - 1
U64_MAX = (1 << 64) - 1
U32_MAX = (1 << 32) - 1
#: Integer namespaces are ``0 <= ns < 2**63``; ``str`` and ``bytes`` namespaces are interned
#: to ids from ``2**63`` up, so they never collide with an integer namespace.
INTERNED_BASE = 1 << 63

Namespace = Union[int, str, bytes, None]
U32Array = Any  # list / tuple / array / NumPy array / torch tensor / any buffer or iterable
Runs = Any  # an iterable of (start, length) pairs


#: The status codes (the C ABI's ``rkv_status``), read from the extension: one table in the
#: Rust core (``radixkv::error::status``) that the C header's enum is pinned to, so the
#: numbers are defined once. ``Status.OK == 0``, ``Status.INVALID_ARGUMENT == 2``, ...
Status = enum.IntEnum("Status", list(_ext.STATUS_CODES), module=__name__, qualname="Status")
Status.__doc__ = "The status codes (the C ABI's ``rkv_status``, from the native extension)."


class RadixKvError(Exception):
    """A failed radixkv call; ``status`` is the :class:`Status` (``None`` for errors that
    come from the Python layer itself)."""

    status: Optional[Status] = None

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        if status is not None:
            self.status = Status(status)


class NullArgumentError(RadixKvError, ValueError):
    status = Status.NULL_ARGUMENT


class InvalidArgumentError(RadixKvError, ValueError):
    status = Status.INVALID_ARGUMENT


class InvalidLockError(RadixKvError):
    status = Status.INVALID_LOCK


class BufferTooSmallError(RadixKvError):
    status = Status.BUFFER_TOO_SMALL


class OutOfSlotsError(RadixKvError):
    status = Status.OUT_OF_SLOTS


class NoPoolError(RadixKvError):
    status = Status.NO_POOL


class DoubleFreeError(RadixKvError):
    status = Status.DOUBLE_FREE


class DeviceError(RadixKvError):
    status = Status.DEVICE_ERROR


class InternalError(RadixKvError):
    status = Status.INTERNAL_ERROR


class IoError(RadixKvError, OSError):
    """``IO_ERROR``: the environment refused what a valid call needed (an address already
    in use, a socket or thread that could not be had). Also an :class:`OSError`."""

    status = Status.IO_ERROR


class CacheClosedError(RadixKvError):
    """The cache (or publisher) was closed."""


class NoTierError(InvalidArgumentError):
    """A host tier call (:meth:`Cache.load_back`, :meth:`Cache.evict_host`,
    :meth:`Cache.tier_stats`, ...) on a cache made without ``host=`` (the core's
    ``Error::NoTier``; status ``INVALID_ARGUMENT``, also an :class:`InvalidArgumentError`)."""


_ERRORS = {
    cls.status: cls
    for cls in (
        NullArgumentError,
        InvalidArgumentError,
        InvalidLockError,
        BufferTooSmallError,
        OutOfSlotsError,
        NoPoolError,
        DoubleFreeError,
        DeviceError,
        InternalError,
        IoError,
    )
}


class SlotBuffer(array):
    """Slots handed back by the library: an ``array('I')`` (one buffer, no Python object
    per slot; ``numpy.frombuffer(b, numpy.uint32)`` views it without a copy). It also
    compares equal to a list or tuple of the same ints, so ``cache.evict(n) == []`` reads
    as it did when slots came back as lists."""

    __slots__ = ()

    def __eq__(self, other: Any) -> Any:
        if isinstance(other, (list, tuple)):
            return len(self) == len(other) and self.tolist() == list(other)
        return array.__eq__(self, other)

    def __ne__(self, other: Any) -> Any:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]


_ext._register({**{int(k): v for k, v in _ERRORS.items()}, -1: CacheClosedError}, SlotBuffer)


# ---- arrays ---------------------------------------------------------------------------


def as_u32(obj: U32Array, what: str = "array") -> Any:
    """How the library reads ``obj`` as token or slot ids: an object with ``n`` (the count)
    and ``ptr`` (the address of ``obj``'s memory when a call would read it in place, or None
    when the values are copied or converted). Every buffer (``array``, NumPy, ``memoryview``),
    CPU torch tensor and ``__array_interface__`` object is copied while the GIL is held, so
    another thread writing it cannot change what a call reads (``ptr`` is None); the copy of
    ``uint32`` memory (and of ``int32`` memory, once checked non-negative) is then used as it
    is; other integer types, byte orders and strided memory are converted, with a range check
    naming the position of a value outside ``[0, 2**32)``, as are Python sequences."""
    return _ext.borrow(obj)


def _size(n: int, what: str) -> int:
    """``n`` as a non-negative int: an integer type (``int``, NumPy integers), not a float,
    a string or a bool, which would otherwise be truncated or read as a count."""
    if isinstance(n, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(n).__name__}") from None
    if n < 0:
        raise ValueError(f"{what} must be >= 0")
    return n


def _c_size(n: int) -> int:
    """A count for a native ``u64`` argument: beyond it means as many as there are."""
    return min(n, SIZE_MAX)


# ---- stats ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """A snapshot of the cache's counts and counters."""

    cached_tokens: int
    evictable_tokens: int
    protected_tokens: int
    nodes: int
    pool_slots: int
    free_slots: int
    match_calls: int
    match_query_tokens: int
    match_hit_tokens: int
    inserted_tokens: int
    evicted_tokens: int
    #: Live namespaces (those with a cached page).
    namespaces: int = 0

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class NamespaceStats:
    """The counts of one namespace (all zeros for an unknown one)."""

    cached_tokens: int
    evictable_tokens: int
    protected_tokens: int
    nodes: int

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)


# ---- locks ----------------------------------------------------------------------------


class _Unique:
    """An object that owns a native resource (a cache, a lock): a copy would free or
    release it twice, so copying and pickling raise ``TypeError``; share the object."""

    __slots__ = ()

    def __copy__(self) -> Any:
        name = type(self).__name__
        raise TypeError(f"a radixkv.{name} owns a native resource: share it, do not copy it")

    def __deepcopy__(self, memo: Any) -> Any:
        self.__copy__()

    def __reduce__(self) -> Any:
        name = type(self).__name__
        raise TypeError(f"a radixkv.{name} owns a native resource and cannot be pickled")


class Lock(_Unique):
    """A pin on a matched or inserted prefix. Release it with :meth:`release`, or use it as
    a context manager; a lock that is garbage-collected unreleased is released then.
    ``slots`` are the matched slots (a :class:`SlotBuffer`; empty for
    :meth:`Cache.insert_lock` and :meth:`Cache.match_lock_runs`), ``runs`` the matched slots
    as ``(start, length)`` runs (:meth:`Cache.match_lock_runs` only; else empty), ``length``
    the tokens pinned, ``handle`` its number in the cache (never 0)."""

    __slots__ = ("_cache", "handle", "length", "slots", "runs", "_released")

    def __init__(
        self,
        cache: "Cache",
        handle: int,
        length: int,
        slots: Any,
        runs: Optional[List[Tuple[int, int]]] = None,
    ):
        self._cache = cache
        self.handle = handle
        self.length = length
        self.slots = slots
        self.runs: List[Tuple[int, int]] = runs if runs is not None else []
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Unpins. Raises :class:`InvalidLockError` if this lock was released already
        (closing the cache releases its locks: releasing one afterwards is a no-op)."""
        n = self._cache._n
        if self._released:
            # Ask the library anyway: a released handle is refused there, with its message.
            if not n.closing:
                n.release(self.handle)
            raise InvalidLockError("Lock.release: lock already released", Status.INVALID_LOCK)
        self._released = True
        if n.closing:
            return  # closing the cache releases it
        n.release(self.handle)

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._released:
            self.release()

    def __del__(self) -> None:
        try:
            if not self._released and not self._cache._n.closing:
                self.release()
        except Exception:
            pass

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<radixkv.Lock {self.handle:#x} length={self.length} {state}>"


# ---- KV events ------------------------------------------------------------------------

_HASH_MODES = {"xxh3": 0, "sglang-sha256": 1}
_MEDIA = {"GPU": 0, "CPU_PINNED": 1}
_ENCODINGS = {"vllm-array": 0, "vllm-map": 1}


def _choice(value: Any, choices: Dict[str, int], what: str) -> int:
    try:
        return choices[value]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"{what} must be one of {sorted(choices)}, got {value!r}", Status.INVALID_ARGUMENT
        ) from None


@dataclass(frozen=True)
class EventOptions:
    """How a cache records KV events (``Cache(..., events=EventOptions(...))``; the block
    size is the cache's page size). ``hash_mode``: ``"xxh3"`` (Dynamo's and Mooncake's
    XXH3-64 sequence hash, the default) or ``"sglang-sha256"`` (SGLang's; the hashes are
    the bits of its signed int64 values). ``medium``: ``"GPU"`` or ``"CPU_PINNED"``.
    ``max_drain_batches``: closed batches kept for :meth:`Cache.events` before new ones are
    dropped (whole, counted)."""

    hash_mode: str = "xxh3"
    medium: str = "GPU"
    max_drain_batches: int = 1 << 16


@dataclass(frozen=True)
class KvEvent:
    """A change to the set of cached pages; ``seq`` is its batch's sequence number (0, 1,
    2, ... per cache, gapless) and ``ts`` when the batch closed (seconds since the
    epoch)."""

    seq: int
    ts: float


@dataclass(frozen=True)
class BlockStored(KvEvent):
    """Pages became cached (one insert that added pages), in token order: one hash per
    page, the hash of the page before the first (None at the namespace's start), the new
    pages' tokens, the page size, and the namespace's LoRA name and cache salt as
    published (a namespace other than 0 given neither has its decimal id as the salt)."""

    block_hashes: List[int]
    parent_block_hash: Optional[int]
    token_ids: List[int]
    block_size: int
    lora_name: Optional[str]
    cache_salt: Optional[str]
    medium: str = "GPU"


@dataclass(frozen=True)
class BlockRemoved(KvEvent):
    """Pages stopped being cached (eviction, reset, a namespace dropped)."""

    block_hashes: List[int]
    medium: str = "GPU"


@dataclass(frozen=True)
class AllBlocksCleared(KvEvent):
    """Every page of the cache is gone."""


@dataclass(frozen=True)
class EventStats:
    """A cache's event counters."""

    batches: int
    events: int
    dropped: int

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class PublisherStats:
    """A publisher's counters; once it has stopped,
    ``published + dropped`` is the number of batches the cache closed while it ran."""

    published: int
    dropped: int
    replayed: int
    replay_requests: int

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)


def _event(r: Tuple[Any, ...]) -> KvEvent:
    """One drained event row (``NativeCache.drain_events``) as a :class:`KvEvent`."""
    seq, ts, kind, medium, block_size, parent, hashes, tokens, lora, salt = r
    if kind == 0:
        return BlockStored(
            seq=seq,
            ts=ts,
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=tokens,
            block_size=block_size,
            lora_name=lora,
            cache_salt=salt,
            medium=medium,
        )
    if kind == 1:
        return BlockRemoved(seq=seq, ts=ts, block_hashes=hashes, medium=medium)
    return AllBlocksCleared(seq=seq, ts=ts)


def _opt_str(value: Optional[str], what: str) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str or None, not {type(value).__name__}")
    if "\0" in value:
        raise InvalidArgumentError(f"{what} contains a NUL character", Status.INVALID_ARGUMENT)
    return value


class Publisher(_Unique):
    """A running ZMQ publisher of one cache's KV events (:meth:`Cache.publish`): vLLM's
    stream on ``endpoint`` (as bound: a ``*`` port resolved), replay on
    ``replay_endpoint``. Use it as a context manager, or call :meth:`close` (which stops
    it first); :meth:`stop` alone stops it and keeps its final :meth:`stats`. It owns what
    it runs on, so it may outlive its :class:`Cache`. Its methods may be called from many
    threads at once; the GIL is released while it stops (it lingers)."""

    def __init__(self, native: Any):
        self._p: Optional[Any] = native
        self._lock = threading.Lock()
        #: The PUB endpoint as bound (or connected).
        self.endpoint: str = native.endpoint
        #: The replay endpoint as bound, or None.
        self.replay_endpoint: Optional[str] = native.replay_endpoint

    def _native(self) -> Any:
        p = self._p
        if p is None:
            raise CacheClosedError("the publisher is closed")
        return p

    def stats(self) -> PublisherStats:
        """The counters (final once stopped); never waits."""
        return PublisherStats(*self._native().stats())

    def stop(self) -> PublisherStats:
        """Flushes the cache's events, sends what is queued, lingers, closes the sockets
        (the cache's later batches go to :meth:`Cache.events` again) and returns the final
        counters. Stopping again does nothing."""
        p = self._native()
        p.stop()
        return PublisherStats(*p.stats())

    def close(self) -> None:
        """Stops (if running) and frees the publisher. Idempotent; further calls raise
        :class:`CacheClosedError`."""
        with self._lock:
            p, self._p = self._p, None
        if p is not None:
            p.stop()

    @property
    def closed(self) -> bool:
        return self._p is None

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._p is None else "open"
        return f"<radixkv.Publisher {self.endpoint} replay={self.replay_endpoint} {state}>"


# ---- the cache ------------------------------------------------------------------------


class Cache(_Unique):
    """A radix prefix cache. Every method may be called from many threads at once; the GIL
    is released inside the library.

    ``page_size``: tokens per page (>= 1). ``pool_slots``: 0 for caller-managed slots, or
    the size of a built-in slot pool (then :meth:`alloc` and :meth:`free` work, and
    :meth:`insert` frees what it does not adopt). ``policy``: the eviction order, one of
    SGLang's names (case-insensitive): ``"lru"``, ``"lfu"``, ``"fifo"``, ``"mru"``,
    ``"filo"``, ``"priority"`` (by the inserts' ``priority``) or ``"slru"`` (segmented LRU;
    ``slru_threshold`` hits, 2 by default, make a node protected).

    Token and slot arrays may be lists, tuples, any integer buffer (``array('I'/'i'/'q'/'l')``,
    NumPy arrays), CPU torch tensors, objects with ``__array_interface__``, or any iterable of
    ints: ``uint32`` memory is read in place, ``int32`` too once checked non-negative, other
    integer types are converted with a range check (a value outside ``[0, 2**32)`` is a
    ``ValueError`` naming its position). Slots come back as a :class:`SlotBuffer` (an
    ``array('I')``). Counts (``page_size``, ``n_tokens``, ``n``) must be integers: a float, a
    string or a bool is refused rather than truncated. Namespaces may be ``int`` (``0 <= ns
    < 2**63``), ``str`` or ``bytes``: strings and bytes are interned per cache to distinct ids
    (never hashed), so isolation between namespaces is exact; ``None`` is 0. An interned
    name is kept for the cache's lifetime: for per-request salts, which never repeat, pass
    int ids instead.

    ``host``: a host memory tier behind the device pool (SGLang HiCache's semantics): a
    :class:`HostOptions` (or a ``dict`` of its fields, or the ``host_slots`` int), which
    needs ``pool_slots > 0``. Then :meth:`lookup` and :meth:`lookup_lock` say how far host
    copies extend a match (``host_len``), inserts back pages up by the write policy,
    device evictions keep (or write back) host copies, and :meth:`load_back` brings host
    pages back to the device; :meth:`tier_stats`, :meth:`evict_host`, :meth:`poll`,
    :meth:`wait_all` and the KV bytes of copier ``"host"`` (:meth:`read_slot`,
    :meth:`write_slot`, :meth:`kv_pointers`) come with it. The request cycle with a tier:
    :meth:`lookup_lock` (device prefix pinned, ``host_len`` known), :meth:`load_back` +
    :meth:`wait_load` when the host extends it, :meth:`alloc` the rest, write its KV,
    :meth:`insert`, release the locks. A cache without a tier refuses the tier-only calls
    with :class:`NoTierError`; :meth:`lookup` answers ``host_len == 0`` and :meth:`poll` /
    :meth:`wait_all` have nothing to do there, so one engine loop serves both.

    A cache cannot be copied or pickled (it owns a native cache): share the object.
    :meth:`close` refuses new calls at once and waits for the running ones (and for the
    host tier's copies in flight).
    """

    def __init__(
        self,
        page_size: int = 1,
        pool_slots: int = 0,
        policy: str = "lru",
        events: Union[bool, EventOptions, None] = None,
        slru_threshold: Optional[int] = None,
        host: "_host.HostArg" = None,
        swa_window: int = 0,
    ):
        self._names: Dict[Tuple[type, Any], int] = {}
        self._names_lock = threading.Lock()
        host_opts = _host._host_options(host)
        host_args = None if host_opts is None else _host._host_args(host_opts)
        if not isinstance(policy, str):
            raise InvalidArgumentError(
                f"policy must be a policy name (e.g. 'lru'), got {policy!r}", Status.INVALID_ARGUMENT
            )
        page_size = _size(page_size, "page_size")
        pool_slots = _size(pool_slots, "pool_slots")
        if not page_size < 1 << 32 or not pool_slots <= U64_MAX:
            raise InvalidArgumentError("page_size or pool_slots out of range", Status.INVALID_ARGUMENT)
        if events is True:
            events = EventOptions()
        elif events is False:
            events = None
        elif events is not None and not isinstance(events, EventOptions):
            raise TypeError(f"events must be a bool or an EventOptions, not {type(events).__name__}")
        ev = None
        if events is not None:
            mdb = _size(events.max_drain_batches, "events.max_drain_batches")
            if mdb > U64_MAX:
                raise InvalidArgumentError("events.max_drain_batches must be below 2**64", Status.INVALID_ARGUMENT)
            ev = (
                _choice(events.hash_mode, _HASH_MODES, "events.hash_mode"),
                _choice(events.medium, _MEDIA, "events.medium"),
                mdb,
            )
        try:
            if slru_threshold is not None:
                slru_threshold = _size(slru_threshold, "slru_threshold")
                if slru_threshold >= 1 << 32:
                    raise InvalidArgumentError("slru_threshold must be below 2**32", Status.INVALID_ARGUMENT)
            swa_window = _size(swa_window, "swa_window")
            if swa_window >= 1 << 32:
                raise InvalidArgumentError("swa_window must be below 2**32", Status.INVALID_ARGUMENT)
            self._n = _ext.NativeCache(
                page_size, pool_slots, policy, ev, False, slru_threshold, host_args, swa_window
            )
        except InvalidArgumentError as e:
            if str(e).startswith("Cache: policy:"):
                raise InvalidArgumentError(
                    f"policy must be an eviction policy name, got {policy!r} ({e})",
                    Status.INVALID_ARGUMENT,
                ) from None
            raise
        #: The event options the cache was made with (None: events off).
        self.events_options: Optional[EventOptions] = events
        self.page_size = int(page_size)
        self.pool_slots = int(pool_slots)
        self.policy = policy.lower()
        self._t = _ext.NativeTier(self._n)
        self._q = _ext.NativeRequests(self._n)
        if host_opts is not None:
            # The write policy as the library spells it ("write-through" reads as such).
            host_opts = _host.HostOptions(**{**host_opts.as_dict(), "write_policy": self._t.write_policy})
        #: The host tier's options (None: no tier).
        self.host: Optional[_host.HostOptions] = host_opts

    # -- lifetime --

    @property
    def _ptr(self) -> Any:
        """The native cache (``radixkv._radixkv.NativeCache``) while open, else None."""
        n = getattr(self, "_n", None)
        return None if n is None or n.closed else n

    def close(self) -> None:
        """Frees the cache (waiting for calls running in other threads and for the host
        tier's copies in flight); its outstanding locks are released. Further calls raise
        :class:`CacheClosedError`. Idempotent."""
        n = getattr(self, "_n", None)
        if n is not None:
            n.close()

    @property
    def closed(self) -> bool:
        return self._n.closed

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- namespaces --

    def namespace_id(self, ns: Namespace) -> int:
        """The ``u64`` namespace id of ``ns`` in this cache."""
        if ns is None:
            return 0
        if isinstance(ns, bool):
            raise TypeError("namespace must be int, str or bytes, not bool")
        if isinstance(ns, int):
            if not 0 <= ns < INTERNED_BASE:
                raise ValueError("an int namespace must be in [0, 2**63)")
            return ns
        if isinstance(ns, (str, bytes)):
            key = (type(ns), ns)
            got = self._names.get(key)
            if got is not None:
                return got
            with self._names_lock:
                return self._names.setdefault(key, INTERNED_BASE + len(self._names))
        raise TypeError(f"namespace must be int, str or bytes, not {type(ns).__name__}")

    def _known_id(self, ns: Namespace) -> Optional[int]:
        """:meth:`namespace_id` without interning: None for a str or bytes name this cache
        never interned (so nothing can be cached under it)."""
        if isinstance(ns, (str, bytes)):
            return self._names.get((type(ns), ns))
        return self.namespace_id(ns)

    def _refuse_if_closed(self) -> None:
        if self._n.closing:
            raise CacheClosedError("the cache is closed")

    def drop_namespace(self, ns: Namespace = 0, on_free: Optional[Callable[[Any], Any]] = None) -> int:
        """Evicts every unpinned page of namespace ``ns`` (a tenant offboarded, an adapter
        unloaded) and returns the tokens freed; pinned pages stay until their locks are
        released, other namespaces are untouched. An unknown namespace (also a str or bytes
        name never used with this cache) frees nothing: 0, not an error.

        ``on_free(slots)`` gets the freed slots once, as a :class:`SlotBuffer`, when the
        drop is done (not called when nothing was freed). In pool mode they are back in the
        pool already and ``on_free`` may be omitted; without a pool it is required (the
        slots are the caller's again): :class:`NullArgumentError` otherwise. An exception
        from ``on_free`` comes out of this call; the drop is done by then."""
        nsid = self._known_id(ns)
        self._refuse_if_closed()
        if nsid is None:
            if on_free is None and self.pool_slots == 0:
                # The refusal a known namespace gets: it must not depend on the name.
                raise NullArgumentError(
                    "Cache.drop_namespace: on_free is None, but this cache has no pool "
                    "(pool_slots = 0): pass on_free to get the evicted slots back",
                    Status.NULL_ARGUMENT,
                )
            return 0
        freed, slots = self._n.drop_namespace(nsid, on_free is not None)
        if on_free is not None and len(slots):
            on_free(slots)
        return freed

    def namespace_stats(self, ns: Namespace = 0) -> NamespaceStats:
        """The counts of namespace ``ns``: all zeros for an unknown one (also a str or bytes
        name never used with this cache)."""
        nsid = self._known_id(ns)
        self._refuse_if_closed()
        if nsid is None:
            return NamespaceStats(0, 0, 0, 0)
        return NamespaceStats(*self._n.namespace_stats(nsid))

    def namespace_count(self) -> int:
        """Live namespaces: those with at least one cached page (an empty one is
        reclaimed). Also :attr:`Stats.namespaces`."""
        return self._n.namespace_count()

    # -- matching --

    def match(self, tokens: U32Array, ns: Namespace = 0) -> SlotBuffer:
        """Slots of the longest cached prefix of ``tokens`` (a :class:`SlotBuffer`; its
        length is the match length). Pins nothing: admit requests with :meth:`match_lock`."""
        return self._n.match(self.namespace_id(ns), tokens)

    def match_len(self, tokens: U32Array, ns: Namespace = 0) -> int:
        """Length of the longest cached prefix of ``tokens``."""
        return self._n.match_len(self.namespace_id(ns), tokens)

    def match_len_many(self, queries: Any, ns: Namespace = 0) -> List[int]:
        """:meth:`match_len` of each token array of ``queries`` (an iterable), in one call:
        the GIL is released once for all of them (a scheduler matching its waiting queue;
        threads that share a cache scale better with a few long calls than many short
        ones)."""
        return self._n.match_len_many(self.namespace_id(ns), queries)

    def match_runs(self, tokens: U32Array, ns: Namespace = 0) -> List[Tuple[int, int]]:
        """:meth:`match` returning the slots as runs of consecutive slots: a list of
        ``(start, length)`` pairs in token order (slots ``start .. start + length - 1``),
        neighbours that continue one another joined; the lengths add up to the match
        length. Cheaper than :meth:`match` when slots come in runs, as a pool hands them
        out. Pins nothing."""
        return self._n.match_runs(self.namespace_id(ns), tokens)

    def match_lock_runs(self, tokens: U32Array, ns: Namespace = 0) -> Lock:
        """:meth:`match_lock` whose :class:`Lock` carries the matched slots as ``runs``
        (``(start, length)`` pairs, as :meth:`match_runs` returns them; ``slots`` stays
        empty)."""
        h, n, runs = self._n.match_lock_runs(self.namespace_id(ns), tokens)
        return Lock(self, h, n, SlotBuffer("I"), runs)

    def match_lock(self, tokens: U32Array, ns: Namespace = 0) -> Lock:
        """Match and pin atomically; the :class:`Lock` has ``slots`` and ``length``."""
        h, n, slots = self._n.match_lock(self.namespace_id(ns), tokens)
        return Lock(self, h, n, slots)

    # -- inserting --

    def insert(self, tokens: U32Array, slots: U32Array, ns: Namespace = 0, *, priority: int = 0) -> int:
        """Caches ``tokens`` with ``slots`` (one per token; the length is cut down to whole
        pages). Returns how many leading tokens were cached already (their slots were not
        adopted; in pool mode the cache frees those itself). ``priority`` (an ``int32``;
        higher stays longer) is what the ``"priority"`` policy evicts by: every node on
        the path is raised to at least it."""
        return self._n.insert(self.namespace_id(ns), tokens, slots, priority)

    def insert_lock(
        self, tokens: U32Array, slots: U32Array, ns: Namespace = 0, *, priority: int = 0
    ) -> Tuple[int, Lock]:
        """:meth:`insert` and pin the inserted prefix atomically: ``(existing, lock)``."""
        e, h, n = self._n.insert_lock(self.namespace_id(ns), tokens, slots, priority)
        return e, Lock(self, h, n, SlotBuffer("I"))

    def insert_runs(self, tokens: U32Array, runs: Runs, ns: Namespace = 0, *, priority: int = 0) -> int:
        """:meth:`insert` with the slots given as runs of consecutive slots: ``(start,
        length)`` pairs in token order, their lengths adding up to the token count (as
        :meth:`alloc_runs` hands them out). The pool step and the new leaf take O(runs)
        instead of O(tokens). Returns how many leading tokens were cached already."""
        return self._n.insert_runs(self.namespace_id(ns), tokens, runs, priority)

    def insert_lock_runs(
        self, tokens: U32Array, runs: Runs, ns: Namespace = 0, *, priority: int = 0
    ) -> Tuple[int, Lock]:
        """:meth:`insert_runs` and pin the inserted prefix atomically: ``(existing, lock)``."""
        e, h, n = self._n.insert_lock_runs(self.namespace_id(ns), tokens, runs, priority)
        return e, Lock(self, h, n, SlotBuffer("I"))

    # -- eviction and the pool --

    def evict(self, n_tokens: int) -> SlotBuffer:
        """Evicts at least ``n_tokens`` tokens (fewer only if nothing more is evictable)
        and returns the freed slots as one :class:`SlotBuffer`. In pool mode they are back
        in the pool already; otherwise they are the caller's again."""
        return self._n.evict(_c_size(_size(n_tokens, "n_tokens")))

    def evict_kv(self, target: str, n_tokens: int) -> Tuple[int, List[Tuple[bool, bool, SlotBuffer]]]:
        """With a sliding window (``Cache(..., swa_window=W)``): frees at least ``n_tokens``
        tokens' KV of ``target``, ``"full"`` (unpinned leaves in the policy's order) or
        ``"swa"`` (SWA KV no window lock holds, least recently used first: a leaf whole,
        any other node as an SWA tombstone, whose full KV stays cached). Returns ``(count,
        nodes)``: the tokens freed of that kind, and per evicted node ``(full, swa, slots)``,
        what was freed of it. In pool mode the slots whose full KV was freed are back in
        the pool already; the SWA KV (named by the same slots) is the engine's to free.
        Without a window, ``"full"`` is :meth:`evict` and ``"swa"`` frees nothing. With a
        window, evict through this method (:meth:`evict` lists the full slots only, not
        which of them still had SWA KV), :meth:`alloc` does not evict on its own, and
        :meth:`reset` / :meth:`clear` of a pool-mode cache are refused (the engine must hear
        of every SWA KV freed)."""
        if target not in ("full", "swa"):
            raise InvalidArgumentError(
                f"target must be 'full' or 'swa', got {target!r}", Status.INVALID_ARGUMENT
            )
        return self._n.evict_kv(target, _c_size(_size(n_tokens, "n_tokens")))

    def evict_runs(self, n_tokens: int) -> List[Tuple[int, int]]:
        """:meth:`evict`, returning the freed slots as runs of consecutive slots: a list of
        ``(start, length)`` pairs (slots ``start .. start + length - 1``), each freed slot in
        exactly one. Cheaper than :meth:`evict` when slots come in runs, as a pool hands
        them out."""
        return self._n.evict_runs(_c_size(_size(n_tokens, "n_tokens")))

    def alloc(self, n: int) -> SlotBuffer:
        """Pool mode: ``n`` slots (a :class:`SlotBuffer`), all or nothing, evicting when
        short."""
        n = _size(n, "n")
        if n > self.pool_slots and self.pool_slots:
            raise OutOfSlotsError(
                f"Cache.alloc: n = {n} is more than the whole pool of {self.pool_slots} slots",
                Status.OUT_OF_SLOTS,
            )
        return self._n.alloc(_c_size(n))

    def alloc_runs(self, n: int) -> List[Tuple[int, int]]:
        """Pool mode: ``n`` slots as runs of consecutive slots (``(start, length)`` pairs),
        all or nothing, evicting when short. Pass them to :meth:`insert_runs` or
        :meth:`free_runs`."""
        n = _size(n, "n")
        if n > self.pool_slots and self.pool_slots:
            raise OutOfSlotsError(
                f"Cache.alloc_runs: n = {n} is more than the whole pool of {self.pool_slots} slots",
                Status.OUT_OF_SLOTS,
            )
        return self._n.alloc_runs(_c_size(n))

    def free_runs(self, runs: Runs) -> None:
        """Pool mode: returns allocated, never adopted slots given as ``(start, length)``
        runs to the pool (refused whole, as :meth:`free`)."""
        self._n.free_runs(runs)

    def free(self, slots: U32Array) -> None:
        """Pool mode: returns allocated, never adopted slots to the pool (refused whole,
        with :class:`DoubleFreeError`, if one is free already or held by the tree)."""
        self._n.free(slots)

    # -- KV events --

    def set_namespace_meta(
        self, ns: Namespace, lora_name: Optional[str] = None, cache_salt: Optional[str] = None
    ) -> None:
        """Names namespace ``ns`` on the wire: its LoRA adapter's name and its cache salt
        (None for none). Before the namespace's first insert: afterwards
        :class:`InvalidArgumentError` (its pages' hashes depend on it), as for an empty
        string or a cache without events."""
        nsid = self.namespace_id(ns)
        lora = _opt_str(lora_name, "lora_name")
        salt = _opt_str(cache_salt, "cache_salt")
        self._n.set_namespace_meta(nsid, lora, salt)

    def flush_events(self) -> Optional[int]:
        """Closes the events recorded so far into one batch (once per scheduler step) and
        returns its sequence number, or None when there were none."""
        return self._n.flush_events()

    def events(self) -> Iterator[KvEvent]:
        """Takes every closed batch now and returns an iterator over their events in
        sequence order: :class:`BlockStored`, :class:`BlockRemoved`,
        :class:`AllBlocksCleared`, each with its batch's ``seq``. Empty while a
        :class:`Publisher` is attached (it takes every batch). Events recorded but not yet
        flushed stay for a later batch: call :meth:`flush_events` first."""
        return iter([_event(r) for r in self._n.drain_events()])

    def events_stats(self) -> EventStats:
        """The event counters: batches closed, events recorded (each removal counts, also
        when adjacent ones are merged into one event), batches dropped at a full drain
        queue."""
        return EventStats(*self._n.events_stats())

    def publish(
        self,
        endpoint: str = "tcp://*:5557",
        *,
        replay_endpoint: Optional[str] = None,
        topic: str = "",
        encoding: str = "vllm-array",
        auto_flush_ms: int = 10,
        linger_ms: int = 1000,
        buffer_steps: int = 10_000,
        max_queue: int = 100_000,
        data_parallel_rank: int = 0,
        group_idx: int = 0,
        kv_cache_spec_kind: str = "full_attention",
        sliding_window: Optional[int] = None,
    ) -> Publisher:
        """Starts a ZMQ publisher of this cache's events: vLLM's stream on ``endpoint``
        (bound when it has a ``*`` or is ``ipc://``, else connected), replay on
        ``replay_endpoint``, ``encoding`` ``"vllm-array"`` or ``"vllm-map"``, an auto-flush
        every ``auto_flush_ms`` (0: only :meth:`flush_events`). A bad endpoint raises
        :class:`InvalidArgumentError`, an address in use :class:`IoError`, and then nothing
        changed. Use the :class:`Publisher` as a context manager (closing stops it).

        ``group_idx``, ``kv_cache_spec_kind`` and ``sliding_window`` name the KV cache group
        this cache holds (a hybrid model keeps one cache per group): every ``BlockStored``
        carries all three, every ``BlockRemoved`` the ``group_idx``. The kinds are vLLM's
        ``KVCacheSpecKind`` strings (``"full_attention"``, ``"mla_attention"``,
        ``"sliding_window"``, ``"sliding_window_mla"``, ``"mamba"``, ...); a window (tokens,
        >= 1) is required with the two sliding kinds and refused with the others
        (:class:`InvalidArgumentError`, nothing started). The defaults publish what the
        cache always did: group 0, ``"full_attention"``, no window."""
        ep = _opt_str(endpoint, "endpoint")
        replay = _opt_str(replay_endpoint, "replay_endpoint")
        top = _opt_str(topic, "topic")
        enc = _choice(encoding, _ENCODINGS, "encoding")
        counts = []
        for what, v in (
            ("buffer_steps", buffer_steps),
            ("max_queue", max_queue),
            ("auto_flush_ms", auto_flush_ms),
            ("linger_ms", linger_ms),
        ):
            n = _size(v, what)
            if n > U64_MAX:
                raise InvalidArgumentError(f"{what} must be below 2**64", Status.INVALID_ARGUMENT)
            counts.append(n)
        if isinstance(data_parallel_rank, bool):
            raise TypeError("data_parallel_rank must be an int, not bool")
        rank = operator.index(data_parallel_rank)
        if not -(1 << 63) <= rank < 1 << 63:
            raise InvalidArgumentError("data_parallel_rank must fit an int64", Status.INVALID_ARGUMENT)
        bs, mq, af, lg = counts
        group = _size(group_idx, "group_idx")
        if group > U32_MAX:
            raise InvalidArgumentError("group_idx must be below 2**32", Status.INVALID_ARGUMENT)
        if not isinstance(kv_cache_spec_kind, str):
            raise TypeError(f"kv_cache_spec_kind must be a str, not {type(kv_cache_spec_kind).__name__}")
        window = None
        if sliding_window is not None:
            window = _size(sliding_window, "sliding_window")
            if window > U32_MAX:
                raise InvalidArgumentError("sliding_window must be below 2**32", Status.INVALID_ARGUMENT)
        return Publisher(
            self._n.publish(ep, replay, top or "", enc, bs, mq, af, lg, rank, group, kv_cache_spec_kind, window)
        )

    # -- the request cycle --

    def admit(self, tokens: U32Array, ns: Namespace = 0, *, priority: int = 0) -> "_request.Request":
        """Admits a request (pool mode): pins the longest cached prefix of ``tokens`` and
        allocates slots (whole pages, evicting when short) for the rest. A
        :class:`Request` (``cached_len``, ``slots``; then ``extend``, ``checkpoint``,
        ``finish`` or ``abort``): the engine's cycle as one object, every insert carrying
        ``priority`` and the length it inserted before, so a request counts one hit per
        node however often it checkpoints. :class:`OutOfSlotsError` with nothing held when
        the pool cannot hold the rest; :class:`NoPoolError` without a pool."""
        h, state = self._q.admit(self.namespace_id(ns), tokens, priority)
        return _request.Request(self, ns, priority, h, state)

    # -- the host tier (host=...) --

    @property
    def has_tier(self) -> bool:
        """Whether the cache was made with a host tier (``host=``)."""
        return self.host is not None

    def _tier(self, method: str) -> Any:
        if self.host is None:
            raise NoTierError(
                f"Cache.{method}: this cache has no host tier (it was made without host=): make "
                f"it with Cache(..., pool_slots=N, host=HostOptions(host_slots=M))",
                Status.INVALID_ARGUMENT,
            )
        return self._t

    def lookup(self, tokens: U32Array, ns: Namespace = 0) -> "_host.TierMatch":
        """The device prefix of ``tokens`` (not pinned) and how far host copies extend it:
        a :class:`TierMatch` (``host_len == 0`` without a tier)."""
        d, h, slots = self._t.lookup(self.namespace_id(ns), tokens)
        return _host.TierMatch(d, h, slots)

    def lookup_lock(self, tokens: U32Array, ns: Namespace = 0) -> "_host.TierLock":
        """:meth:`lookup`, pinning the device prefix: a :class:`TierLock` (``device_len``,
        ``host_len``, ``slots``); release it as any :class:`Lock`."""
        h, d, host, slots = self._t.lookup_lock(self.namespace_id(ns), tokens)
        return _host.TierLock(self, h, d, slots, host)

    def load_back(self, tokens: U32Array, ns: Namespace = 0, max_tokens: Optional[int] = None) -> "_host.LoadTicket":
        """Starts loading back the host pages that extend the device match of ``tokens``
        (at most ``max_tokens``): allocates device slots (evicting when short;
        :class:`OutOfSlotsError` with nothing changed when the pool cannot hold them) and
        starts the copy. Take the result with :meth:`wait_load` or :meth:`try_load`."""
        t = self._tier("load_back")
        m = SIZE_MAX if max_tokens is None else _c_size(_size(max_tokens, "max_tokens"))
        return _host.LoadTicket(t.load_back(self.namespace_id(ns), tokens, m))

    def wait_load(self, ticket: "_host.LoadTicket") -> "_host.Loaded":
        """Waits for a load-back and takes its result, a :class:`Loaded` (a failed copy is
        a :class:`DeviceError`, everything rolled back; a ticket already taken is an
        :class:`InvalidArgumentError`)."""
        t = self._tier("wait_load")
        return _host._loaded(self, t.wait_load(_host._ticket(ticket)))

    def try_load(self, ticket: "_host.LoadTicket") -> Optional["_host.Loaded"]:
        """The load-back's result if it is done (taking it), else None."""
        t = self._tier("try_load")
        row = t.try_load(_host._ticket(ticket))
        return None if row is None else _host._loaded(self, row)

    def poll(self) -> int:
        """Finishes the host tier's copies that are done: how many (an engine calls it
        once a step; every call polls them too). 0 without a tier."""
        return self._t.poll()

    def wait_all(self) -> None:
        """Waits for every host tier copy in flight and finishes it (nothing to do without
        a tier)."""
        self._t.wait_all()

    def evict_host(self, n_tokens: int) -> int:
        """Evicts at least ``n_tokens`` host tokens (host-only leaves, by the host policy;
        never a page being copied or pinned): the host tokens freed."""
        t = self._tier("evict_host")
        return t.evict_host(_c_size(_size(n_tokens, "n_tokens")))

    def tier_stats(self) -> "_host.TierStats":
        """The host tier's counts and counters, the device's :class:`Stats` included."""
        return _host._tier_stats(self._tier("tier_stats").tier_stats())

    def check_tier(self) -> None:
        """Checks the host tier's and the device tree's invariants that hold at quiescence
        (no copy in flight, no other thread using the cache); raises ``AssertionError``
        naming the first violation."""
        err = self._tier("check_tier").check_tier()
        if err is not None:
            raise AssertionError(err)

    def read_slot(self, slot: int, layer: int, side: str = "device") -> Tuple[bytes, bytes]:
        """Copier ``"host"``: slot ``slot``'s K and V bytes at ``layer`` of the ``side``
        store (``"device"`` or ``"host"``)."""
        t = self._tier("read_slot")
        return t.read_slot(side, _size(layer, "layer"), _size(slot, "slot"))

    def write_slot(self, slot: int, layer: int, k: bytes, v: bytes, side: str = "device") -> None:
        """Copier ``"host"``: writes slot ``slot``'s K and V bytes
        (``host.kv_layout.slot_bytes`` each) at ``layer`` of the ``side`` store."""
        t = self._tier("write_slot")
        t.write_slot(side, _size(layer, "layer"), _size(slot, "slot"), bytes(k), bytes(v))

    def kv_pointers(self, side: str = "device") -> List[Tuple[int, int]]:
        """Copier ``"host"``: the ``(K, V)`` buffer addresses of each layer of the ``side``
        store (host memory; each buffer ``[slots, num_kv_heads, head_dim]`` elements)."""
        return self._tier("kv_pointers").kv_ptrs(side)

    # -- the rest --

    def stats(self) -> Stats:
        return Stats(*self._n.stats())

    def reset(self) -> None:
        """Drops every unpinned page (locks stay valid)."""
        self._n.reset()

    def clear(self) -> None:
        """Empties the cache holding it exclusively (the C ABI's ``rkv_cache_clear``): drops every
        unpinned page, as :meth:`reset` does, and with events on publishes one
        ``ALL_BLOCKS_CLEARED`` event when that leaves the cache empty (nothing pinned), or the
        ``BLOCK_REMOVED`` events of the pages it dropped while locks keep others. Locks stay
        valid. Safe to call from any thread: it waits for the calls in flight, and calls
        that start meanwhile wait for it (so no insert lands between the drop and the
        event). Raises :class:`CacheClosedError` on a closed cache."""
        self._n.clear()

    def reclaim(self) -> None:
        """Frees memory the index unlinked earlier (evicted or split nodes), a bounded
        batch per call. Never needed for correctness: otherwise the same work runs inside
        whichever call next pins the thread. Call it where latency does not matter, e.g.
        once per scheduler step."""
        self._n.reclaim()

    def __repr__(self) -> str:
        state = "closed" if self._n.closed else "open"
        host = "" if self.host is None else f" host_slots={self.host.host_slots}"
        return (
            f"<radixkv.Cache page_size={self.page_size} pool_slots={self.pool_slots}{host} "
            f"policy={self.policy!r} {state}>"
        )


def version() -> str:
    """The library's version."""
    return _ext.version()


def library_path() -> str:
    """The path of the loaded native extension module."""
    return str(_native.lib_path)


__all__ = [
    "Cache",
    "Lock",
    "SlotBuffer",
    "Stats",
    "Status",
    "RadixKvError",
    "NullArgumentError",
    "InvalidArgumentError",
    "InvalidLockError",
    "BufferTooSmallError",
    "OutOfSlotsError",
    "NoPoolError",
    "DoubleFreeError",
    "DeviceError",
    "InternalError",
    "CacheClosedError",
    "NoTierError",
    "IoError",
    "EventOptions",
    "KvEvent",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "EventStats",
    "Publisher",
    "PublisherStats",
    "as_u32",
    "version",
    "library_path",
]


# The host tier's types (they build on the ones above; ``_host`` imports this module).
from . import _host  # noqa: E402
from . import _request  # noqa: E402
