"""The Python face of the C ABI: Cache, Lock, Stats and the error classes."""

from __future__ import annotations

import ctypes
import enum
import operator
import sys
import threading
from array import array
from ctypes import byref, c_size_t, c_uint32, c_uint64, c_void_p
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from . import _native
from ._native import lib

SIZE_MAX = ctypes.c_size_t(-1).value
U64_MAX = (1 << 64) - 1
#: Integer namespaces are ``0 <= ns < 2**63``; ``str`` and ``bytes`` namespaces are interned
#: to ids from ``2**63`` up, so they never collide with an integer namespace.
INTERNED_BASE = 1 << 63

Namespace = Union[int, str, bytes, None]
U32Array = Any  # list / tuple / array('I') / numpy uint32 array / any buffer or iterable
Runs = Any  # an iterable of (start, length) pairs


class Status(enum.IntEnum):
    """``rkv_status``."""

    OK = 0
    NULL_ARGUMENT = 1
    INVALID_ARGUMENT = 2
    INVALID_LOCK = 3
    BUFFER_TOO_SMALL = 4
    OUT_OF_SLOTS = 5
    NO_POOL = 6
    DOUBLE_FREE = 7
    DEVICE_ERROR = 8
    INTERNAL_ERROR = 9
    IO_ERROR = 10


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
    """``RKV_IO_ERROR``: the environment refused what a valid call needed (an address
    already in use, a socket or thread that could not be had). Also an :class:`OSError`."""

    status = Status.IO_ERROR


class CacheClosedError(RadixKvError):
    """The cache was closed."""


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


_last_error_message = getattr(lib, "rkv_last_error_message", None)
_has_namespace_count = getattr(lib, "rkv_namespace_count", None) is not None


def _check(status: int, function: str) -> None:
    """Raises the error class of ``status`` (unless it is OK) with the library's message
    for the call that just failed on this thread (``rkv_last_error_message``: it names the
    argument, the value and the limit), or the status's description where it has none."""
    if status != 0:
        detail = _last_error_message() if _last_error_message is not None else None
        if detail:
            text = detail.decode("utf-8", "replace")
        else:
            text = f"{function}: {lib.rkv_status_str(status).decode()}"
        cls = _ERRORS.get(status, RadixKvError)
        raise cls(text, status)


# ---- arrays ---------------------------------------------------------------------------

_U32_FORMATS = {"I", "@I", "=I"}
if sys.byteorder == "little":
    _U32_FORMATS.add("<I")
else:
    _U32_FORMATS.add(">I")
if ctypes.sizeof(ctypes.c_ulong) == 4:
    _U32_FORMATS |= {"L", "@L", "=L"}


class _In:
    """A read-only uint32 input for one call: ``ptr`` (an address or None) and ``n``.
    Holds what keeps the memory alive (and, for borrowed buffers, export-locked so that
    it cannot be resized) until it is dropped."""

    __slots__ = ("ptr", "n", "_keep")

    def __init__(self, ptr: Optional[int], n: int, keep: Any):
        self.ptr, self.n, self._keep = ptr, n, keep


def as_u32(obj: U32Array, what: str = "array") -> _In:
    """``obj`` as a uint32 array for the C side, without a copy when ``obj`` is a
    C-contiguous, writable buffer of native uint32 (``array('I')``, a NumPy ``uint32``
    array, ...); other inputs (lists, tuples, other dtypes, read-only buffers) are copied
    once, with range checks."""
    if isinstance(obj, (str, bytes, bytearray)):
        raise TypeError(f"{what}: expected a sequence of uint32, got {type(obj).__name__}")
    try:
        mv = memoryview(obj)
    except TypeError:
        mv = None
    if mv is not None:
        if mv.ndim == 1 and mv.itemsize == 4 and mv.format in _U32_FORMATS and mv.c_contiguous:
            n = mv.shape[0]
            if n == 0:
                return _In(None, 0, None)
            buf = None if mv.readonly else (c_uint32 * n).from_buffer(mv)
            if buf is None or ctypes.addressof(buf) % 4:
                # Read-only, or not 4-byte aligned (a NumPy view at an odd byte offset, say),
                # which the library refuses: copied.
                buf = (c_uint32 * n).from_buffer_copy(mv)
            return _In(ctypes.addressof(buf), n, buf)  # else borrowed: no copy
        mv.release()
        if hasattr(obj, "tolist"):
            obj = obj.tolist()
    elif hasattr(obj, "tolist") and not isinstance(obj, (list, tuple)):  # e.g. torch tensors
        obj = obj.tolist()
    try:
        a = array("I", obj)
    except OverflowError as e:
        raise ValueError(f"{what}: every value must be in [0, 2**32)") from e
    n = len(a)
    if n == 0:
        return _In(None, 0, None)
    return _In(a.buffer_info()[0], n, a)


def _out(n: int) -> array:
    return array("I", bytes(4 * n)) if n else array("I")


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
    """A count for a ``size_t`` argument: beyond ``SIZE_MAX`` means as many as there are."""
    return min(n, SIZE_MAX)


# ---- stats ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """A snapshot of ``rkv_stats``."""

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
    #: Live namespaces (those with a cached page; ``rkv_namespace_count``). 0 with a
    #: library built before that function.
    namespaces: int = 0

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class NamespaceStats:
    """A snapshot of ``rkv_namespace_stats``: the counts of one namespace (all zeros for
    an unknown one)."""

    cached_tokens: int
    evictable_tokens: int
    protected_tokens: int
    nodes: int

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)


# ---- locks ----------------------------------------------------------------------------


class _Unique:
    """An object that owns a native resource (a cache, a lock handle): a copy would free or
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
    """A pin on a matched or inserted prefix (``rkv_lock``). Release it with
    :meth:`release`, or use it as a context manager; a lock that is garbage-collected
    unreleased is released then. ``slots`` are the matched slots (``array('I')``; empty for
    :meth:`Cache.insert_lock` and :meth:`Cache.match_lock_runs`), ``runs`` the matched slots
    as ``(start, length)`` runs (:meth:`Cache.match_lock_runs` only; else empty), ``length``
    the tokens pinned."""

    __slots__ = ("_cache", "handle", "length", "slots", "runs", "_released")

    def __init__(
        self,
        cache: "Cache",
        handle: int,
        length: int,
        slots: array,
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
        cache = self._cache
        if self._released:
            # Ask the library anyway: a released handle is refused there, by contract.
            if cache._ptr is not None and not cache._closing:
                with cache._call() as c:
                    _check(lib.rkv_release(c, self.handle), "rkv_release")
            raise InvalidLockError("rkv_release: lock already released", Status.INVALID_LOCK)
        self._released = True
        if cache._ptr is None or cache._closing:
            return  # closing the cache releases it
        with cache._call() as c:
            _check(lib.rkv_release(c, self.handle), "rkv_release")

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._released:
            self.release()

    def __del__(self) -> None:
        try:
            if not self._released and self._cache._ptr is not None and not self._cache._closing:
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
_MEDIUM_NAMES = {v: k for k, v in _MEDIA.items()}
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
    """A cache's event counters (``rkv_events_counters``)."""

    batches: int
    events: int
    dropped: int

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class PublisherStats:
    """A publisher's counters (``rkv_publisher_counters``); once it has stopped,
    ``published + dropped`` is the number of batches the cache closed while it ran."""

    published: int
    dropped: int
    replayed: int
    replay_requests: int

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)


def _event(e: Any) -> KvEvent:
    """An ``rkv_event`` as a :class:`KvEvent` (copied out of the drain's buffers)."""
    medium = _MEDIUM_NAMES.get(e.medium, str(e.medium))
    hashes = e.block_hashes[: e.n_block_hashes] if e.n_block_hashes else []
    if e.kind == 0:
        return BlockStored(
            seq=e.seq,
            ts=e.ts,
            block_hashes=hashes,
            parent_block_hash=e.parent_block_hash if e.has_parent else None,
            token_ids=e.token_ids[: e.n_token_ids] if e.n_token_ids else [],
            block_size=e.block_size,
            lora_name=e.lora_name.decode("utf-8", "replace") if e.lora_name is not None else None,
            cache_salt=e.cache_salt.decode("utf-8", "replace") if e.cache_salt is not None else None,
            medium=medium,
        )
    if e.kind == 1:
        return BlockRemoved(seq=e.seq, ts=e.ts, block_hashes=hashes, medium=medium)
    return AllBlocksCleared(seq=e.seq, ts=e.ts)


def _c_str(value: Optional[str], what: str) -> Optional[bytes]:
    """``value`` as a NUL-terminated UTF-8 argument (None stays NULL)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str or None, not {type(value).__name__}")
    if "\0" in value:
        raise InvalidArgumentError(f"{what} contains a NUL character", Status.INVALID_ARGUMENT)
    return value.encode("utf-8")


def _need_events() -> None:
    if getattr(lib, "rkv_events_drain", None) is None:
        raise RadixKvError(
            f"{_native.lib_path} predates the KV-event functions (rkv_events_*): rebuild it"
        )


class Publisher(_Unique):
    """A running ZMQ publisher of one cache's KV events (:meth:`Cache.publish`): vLLM's
    stream on ``endpoint`` (as bound: a ``*`` port resolved), replay on
    ``replay_endpoint``. Use it as a context manager, or call :meth:`close` (which stops
    it first); :meth:`stop` alone stops it and keeps its final :meth:`stats`. It owns what
    it runs on, so it may outlive its :class:`Cache`. Its methods may be called from many
    threads at once; the GIL is released while it stops (it lingers)."""

    _closed_message = "the publisher is closed"

    def __init__(self, ptr: int):
        self._ptr: Optional[int] = ptr
        self._cond = threading.Condition(threading.RLock())
        self._inflight = 0
        self._closing = False
        ep = ctypes.c_char_p()
        replay = ctypes.c_char_p()
        _check(lib.rkv_publisher_endpoint(ptr, byref(ep), byref(replay)), "rkv_publisher_endpoint")
        #: The PUB endpoint as bound (or connected).
        self.endpoint: str = (ep.value or b"").decode()
        #: The replay endpoint as bound, or None.
        self.replay_endpoint: Optional[str] = replay.value.decode() if replay.value else None

    def stats(self) -> PublisherStats:
        """The counters (final once stopped); never waits."""
        st = _native.rkv_publisher_stats()
        with _Call(self) as p:
            _check(lib.rkv_publisher_counters(p, byref(st)), "rkv_publisher_counters")
        return PublisherStats(**{f: getattr(st, f) for f in _native.PUBLISHER_STATS_FIELDS})

    def stop(self) -> PublisherStats:
        """Flushes the cache's events, sends what is queued, lingers, closes the sockets
        (the cache's later batches go to :meth:`Cache.events` again) and returns the final
        counters. Stopping again does nothing."""
        with _Call(self) as p:
            _check(lib.rkv_publisher_stop(p), "rkv_publisher_stop")
        return self.stats()

    def close(self) -> None:
        """Stops (if running) and frees the publisher, waiting for calls running in other
        threads. Idempotent; further calls raise :class:`CacheClosedError`."""
        with self._cond:
            if self._ptr is None or self._closing:
                return
            self._closing = True
            while self._inflight:
                self._cond.wait()
            ptr, self._ptr = self._ptr, None
        lib.rkv_publisher_free(ptr)

    @property
    def closed(self) -> bool:
        return self._ptr is None

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
        state = "closed" if self._ptr is None else "open"
        return f"<radixkv.Publisher {self.endpoint} replay={self.replay_endpoint} {state}>"


# ---- the cache ------------------------------------------------------------------------


class _Call:
    """Keeps the cache (or publisher) open while a C call runs (``close`` waits for running
    calls)."""

    __slots__ = ("cache",)

    def __init__(self, cache: Any):
        self.cache = cache

    def __enter__(self) -> int:
        cache = self.cache
        with cache._cond:
            if cache._ptr is None or cache._closing:
                raise CacheClosedError(getattr(cache, "_closed_message", "the cache is closed"))
            cache._inflight += 1
            return cache._ptr

    def __exit__(self, *exc: Any) -> None:
        cache = self.cache
        with cache._cond:
            cache._inflight -= 1
            if cache._inflight == 0:
                cache._cond.notify_all()


_POLICIES = {"lru": 0, "fifo": 1}


class Cache(_Unique):
    """A radix prefix cache (``rkv_cache``). Every method may be called from many threads
    at once; the GIL is released inside the library.

    ``page_size``: tokens per page (>= 1). ``pool_slots``: 0 for caller-managed slots, or
    the size of a built-in slot pool (then :meth:`alloc` and :meth:`free` work, and
    :meth:`insert` frees what it does not adopt). ``policy``: ``"lru"`` or ``"fifo"``.

    Token and slot arrays may be lists, tuples, ``array('I')``, NumPy ``uint32`` arrays
    (borrowed without a copy when C-contiguous, writable and 4-byte aligned; else copied),
    or any iterable of ints. Counts (``page_size``, ``n_tokens``, ``n``) must be integers:
    a float, a string or a bool is refused rather than truncated. Namespaces may be ``int``
    (``0 <= ns < 2**63``), ``str`` or ``bytes``: strings and bytes are interned per cache to
    distinct ids (never hashed), so isolation between namespaces is exact; ``None`` is 0.
    An interned name is kept for the cache's lifetime: for per-request salts, which never
    repeat, pass int ids instead.

    A cache cannot be copied or pickled (it owns a native cache): share the object.
    :meth:`close` refuses new calls at once and waits for the running ones.
    """

    def __init__(
        self,
        page_size: int = 1,
        pool_slots: int = 0,
        policy: str = "lru",
        events: Union[bool, EventOptions, None] = None,
    ):
        self._ptr: Optional[int] = None
        # Re-entrant: a garbage-collected Lock's __del__ may release itself while this
        # thread holds the condition's lock (a collection can run at any allocation).
        self._cond = threading.Condition(threading.RLock())
        self._inflight = 0
        # Set by close(): calls are refused from then on, so close() cannot be starved by
        # threads that keep calling while it waits for the running ones.
        self._closing = False
        self._names: Dict[Tuple[type, Any], int] = {}
        try:
            pol = _POLICIES[policy.lower()]
        except (KeyError, AttributeError):
            raise InvalidArgumentError(
                f"policy must be one of {sorted(_POLICIES)}, got {policy!r}", Status.INVALID_ARGUMENT
            ) from None
        page_size = _size(page_size, "page_size")
        pool_slots = _size(pool_slots, "pool_slots")
        if not page_size < 1 << 32 or not pool_slots <= U64_MAX:
            raise InvalidArgumentError("page_size or pool_slots out of range", Status.INVALID_ARGUMENT)
        opts = lib.rkv_options_default()
        opts.page_size = int(page_size)
        opts.eviction_policy = pol
        opts.pool_slots = int(pool_slots)
        if events is True:
            events = EventOptions()
        elif events is False:
            events = None
        elif events is not None and not isinstance(events, EventOptions):
            raise TypeError(f"events must be a bool or an EventOptions, not {type(events).__name__}")
        if events is not None:
            _need_events()
            ev = lib.rkv_events_options_default()
            ev.hash_mode = _choice(events.hash_mode, _HASH_MODES, "events.hash_mode")
            ev.medium = _choice(events.medium, _MEDIA, "events.medium")
            mdb = _size(events.max_drain_batches, "events.max_drain_batches")
            if mdb > U64_MAX:
                raise InvalidArgumentError("events.max_drain_batches must be below 2**64", Status.INVALID_ARGUMENT)
            ev.max_drain_batches = mdb
        out = c_void_p()
        _check(lib.rkv_cache_new(byref(opts), byref(out)), "rkv_cache_new")
        if events is not None:
            # Enabled before the cache is shared: rkv_events_enable needs it exclusively.
            try:
                _check(lib.rkv_events_enable(out.value, byref(ev)), "rkv_events_enable")
            except BaseException:
                lib.rkv_cache_free(out.value)
                raise
        self._ptr = out.value
        #: The event options the cache was made with (None: events off).
        self.events_options: Optional[EventOptions] = events
        self.page_size = int(page_size)
        self.pool_slots = int(pool_slots)
        self.policy = policy.lower()

    # -- lifetime --

    def _call(self) -> _Call:
        return _Call(self)

    def close(self) -> None:
        """Frees the cache (waiting for calls running in other threads); its outstanding
        locks are released. Further calls raise :class:`CacheClosedError`. Idempotent."""
        with self._cond:
            if self._ptr is None or self._closing:
                return
            self._closing = True
            while self._inflight:
                self._cond.wait()
            ptr, self._ptr = self._ptr, None
        lib.rkv_cache_free(ptr)

    @property
    def closed(self) -> bool:
        return self._ptr is None

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
            with self._cond:
                return self._names.setdefault(key, INTERNED_BASE + len(self._names))
        raise TypeError(f"namespace must be int, str or bytes, not {type(ns).__name__}")

    def _known_id(self, ns: Namespace) -> Optional[int]:
        """:meth:`namespace_id` without interning: None for a str or bytes name this cache
        never interned (so nothing can be cached under it)."""
        if isinstance(ns, (str, bytes)):
            return self._names.get((type(ns), ns))
        return self.namespace_id(ns)

    def drop_namespace(self, ns: Namespace = 0, on_free: Optional[Callable[[List[int]], Any]] = None) -> int:
        """Evicts every unpinned page of namespace ``ns`` (a tenant offboarded, an adapter
        unloaded) and returns the tokens freed; pinned pages stay until their locks are
        released, other namespaces are untouched. An unknown namespace (also a str or bytes
        name never used with this cache) frees nothing: 0, not an error.

        ``on_free(slots)`` gets the freed slots (a list of ints, possibly in several calls),
        each exactly once. In pool mode they are back in the pool already and ``on_free``
        may be omitted; without a pool it is required (the slots are the caller's again):
        :class:`NullArgumentError` otherwise, as the C ABI says. An exception from
        ``on_free`` does not stop the drop; the first one is raised once it is done."""
        nsid = self._known_id(ns)
        freed = c_size_t()
        errors: List[BaseException] = []
        if on_free is None:
            cb = _native.FREE_FN()  # NULL
        else:
            user = on_free

            def tell(_ctx: Any, slots: Any, k: int) -> None:
                try:
                    user(slots[:k])
                except BaseException as e:  # noqa: BLE001 - re-raised after the call
                    if not errors:
                        errors.append(e)

            cb = _native.FREE_FN(tell)
        with self._call() as c:
            if nsid is None:
                if on_free is None and self.pool_slots == 0:
                    # The refusal a known namespace gets: it must not depend on the name.
                    raise NullArgumentError(
                        "rkv_drop_namespace: free_fn is NULL, but this cache has no pool "
                        "(pool_slots = 0): pass on_free to get the slots back",
                        Status.NULL_ARGUMENT,
                    )
                return 0
            status = lib.rkv_drop_namespace(c, nsid, cb, None, byref(freed))
        if errors:
            raise errors[0]
        _check(status, "rkv_drop_namespace")
        return freed.value

    def namespace_stats(self, ns: Namespace = 0) -> NamespaceStats:
        """The counts of namespace ``ns``: all zeros for an unknown one (also a str or bytes
        name never used with this cache)."""
        nsid = self._known_id(ns)
        st = _native.rkv_namespace_stats()
        with self._call() as c:
            if nsid is not None:
                _check(lib.rkv_cache_namespace_stats(c, nsid, byref(st)), "rkv_cache_namespace_stats")
        return NamespaceStats(**{f: getattr(st, f) for f in _native.NAMESPACE_STATS_FIELDS})

    def namespace_count(self) -> int:
        """Live namespaces: those with at least one cached page (an empty one is
        reclaimed). Also :attr:`Stats.namespaces`."""
        n = c_uint64()
        with self._call() as c:
            _check(lib.rkv_namespace_count(c, byref(n)), "rkv_namespace_count")
        return n.value

    # -- matching --

    def match(self, tokens: U32Array, ns: Namespace = 0) -> array:
        """Slots of the longest cached prefix of ``tokens`` (an ``array('I')``; its length
        is the match length). Pins nothing: admit requests with :meth:`match_lock`."""
        nsid = self.namespace_id(ns)
        t = as_u32(tokens, "tokens")
        out = _out(t.n)
        n = c_size_t()
        with self._call() as c:
            _check(lib.rkv_match(c, nsid, t.ptr, t.n, _addr(out), t.n, byref(n)), "rkv_match")
        del out[n.value :]
        return out

    def match_len(self, tokens: U32Array, ns: Namespace = 0) -> int:
        """Length of the longest cached prefix of ``tokens``."""
        nsid = self.namespace_id(ns)
        t = as_u32(tokens, "tokens")
        n = c_size_t()
        with self._call() as c:
            _check(lib.rkv_match(c, nsid, t.ptr, t.n, None, 0, byref(n)), "rkv_match")
        return n.value

    def match_runs(self, tokens: U32Array, ns: Namespace = 0) -> List[Tuple[int, int]]:
        """:meth:`match` returning the slots as runs of consecutive slots: a list of
        ``(start, length)`` pairs in token order (slots ``start .. start + length - 1``),
        neighbours that continue one another joined; the lengths add up to the match
        length. Cheaper than :meth:`match` when slots come in runs, as a pool hands them
        out. Pins nothing."""
        nsid = self.namespace_id(ns)
        t = as_u32(tokens, "tokens")
        out = (_native.rkv_slot_run * max(t.n, 1))()
        n_runs = c_size_t()
        n = c_size_t()
        with self._call() as c:
            _check(
                lib.rkv_match_runs(
                    c, nsid, t.ptr, t.n, ctypes.addressof(out), t.n, byref(n_runs), byref(n)
                ),
                "rkv_match_runs",
            )
        return [(out[i].start, out[i].len) for i in range(n_runs.value)]

    def match_lock_runs(self, tokens: U32Array, ns: Namespace = 0) -> Lock:
        """:meth:`match_lock` whose :class:`Lock` carries the matched slots as ``runs``
        (``(start, length)`` pairs, as :meth:`match_runs` returns them; ``slots`` stays
        empty)."""
        nsid = self.namespace_id(ns)
        t = as_u32(tokens, "tokens")
        out = (_native.rkv_slot_run * max(t.n, 1))()
        n_runs = c_size_t()
        n = c_size_t()
        h = _native.rkv_lock()
        with self._call() as c:
            _check(
                lib.rkv_match_lock_runs(
                    c,
                    nsid,
                    t.ptr,
                    t.n,
                    ctypes.addressof(out),
                    t.n,
                    byref(n_runs),
                    byref(n),
                    byref(h),
                ),
                "rkv_match_lock_runs",
            )
        runs = [(out[i].start, out[i].len) for i in range(n_runs.value)]
        return Lock(self, h.value, n.value, array("I"), runs)

    def match_lock(self, tokens: U32Array, ns: Namespace = 0) -> Lock:
        """Match and pin atomically; the :class:`Lock` has ``slots`` and ``length``."""
        nsid = self.namespace_id(ns)
        t = as_u32(tokens, "tokens")
        out = _out(t.n)
        n = c_size_t()
        h = _native.rkv_lock()
        with self._call() as c:
            _check(
                lib.rkv_match_lock(c, nsid, t.ptr, t.n, _addr(out), t.n, byref(n), byref(h)),
                "rkv_match_lock",
            )
        del out[n.value :]
        return Lock(self, h.value, n.value, out)

    # -- inserting --

    def _pair(self, tokens: U32Array, slots: U32Array) -> Tuple[_In, _In]:
        t = as_u32(tokens, "tokens")
        s = as_u32(slots, "slots")
        if t.n != s.n:
            raise InvalidArgumentError(
                f"tokens and slots differ in length ({t.n} != {s.n})", Status.INVALID_ARGUMENT
            )
        return t, s

    def insert(self, tokens: U32Array, slots: U32Array, ns: Namespace = 0) -> int:
        """Caches ``tokens`` with ``slots`` (one per token; the length is cut down to whole
        pages). Returns how many leading tokens were cached already (their slots were not
        adopted; in pool mode the cache frees those itself)."""
        nsid = self.namespace_id(ns)
        t, s = self._pair(tokens, slots)
        e = c_size_t()
        with self._call() as c:
            _check(lib.rkv_insert(c, nsid, t.ptr, s.ptr, t.n, byref(e)), "rkv_insert")
        return e.value

    def insert_lock(self, tokens: U32Array, slots: U32Array, ns: Namespace = 0) -> Tuple[int, Lock]:
        """:meth:`insert` and pin the inserted prefix atomically: ``(existing, lock)``."""
        nsid = self.namespace_id(ns)
        t, s = self._pair(tokens, slots)
        e = c_size_t()
        h = _native.rkv_lock()
        n = c_size_t()
        with self._call() as c:
            _check(lib.rkv_insert_lock(c, nsid, t.ptr, s.ptr, t.n, byref(e), byref(h)), "rkv_insert_lock")
            _check(lib.rkv_lock_len(c, h.value, byref(n)), "rkv_lock_len")
        return e.value, Lock(self, h.value, n.value, array("I"))

    def insert_runs(self, tokens: U32Array, runs: Runs, ns: Namespace = 0) -> int:
        """:meth:`insert` with the slots given as runs of consecutive slots: ``(start,
        length)`` pairs in token order, their lengths adding up to the token count (as
        :meth:`alloc_runs` hands them out). The pool step and the new leaf take O(runs)
        instead of O(tokens). Returns how many leading tokens were cached already."""
        nsid = self.namespace_id(ns)
        t = as_u32(tokens, "tokens")
        r = _runs_in(runs)
        e = c_size_t()
        with self._call() as c:
            _check(
                lib.rkv_insert_runs(c, nsid, t.ptr, t.n, r.ptr, r.n, byref(e)),
                "rkv_insert_runs",
            )
        return e.value

    def insert_lock_runs(self, tokens: U32Array, runs: Runs, ns: Namespace = 0) -> Tuple[int, Lock]:
        """:meth:`insert_runs` and pin the inserted prefix atomically: ``(existing, lock)``."""
        nsid = self.namespace_id(ns)
        t = as_u32(tokens, "tokens")
        r = _runs_in(runs)
        e = c_size_t()
        h = _native.rkv_lock()
        n = c_size_t()
        with self._call() as c:
            _check(
                lib.rkv_insert_lock_runs(
                    c, nsid, t.ptr, t.n, r.ptr, r.n, byref(e), byref(h)
                ),
                "rkv_insert_lock_runs",
            )
            _check(lib.rkv_lock_len(c, h.value, byref(n)), "rkv_lock_len")
        return e.value, Lock(self, h.value, n.value, array("I"))

    # -- eviction and the pool --

    def evict(self, n_tokens: int) -> List[int]:
        """Evicts at least ``n_tokens`` tokens (fewer only if nothing more is evictable)
        and returns the freed slots. In pool mode they are back in the pool already;
        otherwise they are the caller's again."""
        n = _size(n_tokens, "n_tokens")
        freed: List[int] = []

        def on_free(_ctx: Any, slots: Any, k: int) -> None:
            freed.extend(slots[:k])

        cb = _native.FREE_FN(on_free)
        evicted = c_size_t()
        with self._call() as c:
            _check(lib.rkv_evict(c, _c_size(n), cb, None, byref(evicted)), "rkv_evict")
        return freed

    def evict_runs(self, n_tokens: int) -> List[Tuple[int, int]]:
        """:meth:`evict`, returning the freed slots as runs of consecutive slots: a list of
        ``(start, length)`` pairs (slots ``start .. start + length - 1``), each freed slot in
        exactly one. Cheaper than :meth:`evict` when slots come in runs, as a pool hands
        them out."""
        n = _size(n_tokens, "n_tokens")
        freed: List[Tuple[int, int]] = []

        def on_free(_ctx: Any, runs: Any, k: int) -> None:
            freed.extend((runs[i].start, runs[i].len) for i in range(k))

        cb = _native.FREE_RUNS_FN(on_free)
        evicted = c_size_t()
        with self._call() as c:
            _check(lib.rkv_evict_runs(c, _c_size(n), cb, None, byref(evicted)), "rkv_evict_runs")
        return freed

    def alloc(self, n: int) -> array:
        """Pool mode: ``n`` slots (``array('I')``), all or nothing, evicting when short."""
        n = _size(n, "n")
        if n > self.pool_slots:
            # Cannot succeed; do not allocate a huge output buffer to find out.
            with self._call() as c:
                _check(lib.rkv_alloc(c, 0, None), "rkv_alloc")  # NO_POOL without a pool
            raise OutOfSlotsError(
                f"rkv_alloc: n_slots = {n} is more than the whole pool of {self.pool_slots} slots",
                Status.OUT_OF_SLOTS,
            )
        out = _out(n)
        with self._call() as c:
            _check(lib.rkv_alloc(c, n, _addr(out)), "rkv_alloc")
        return out

    def alloc_runs(self, n: int) -> List[Tuple[int, int]]:
        """Pool mode: ``n`` slots as runs of consecutive slots (``(start, length)`` pairs),
        all or nothing, evicting when short. Pass them to :meth:`insert_runs` or
        :meth:`free_runs`."""
        n = _size(n, "n")
        cap = 8
        while True:
            out = (_native.rkv_slot_run * cap)()
            n_runs = c_size_t()
            with self._call() as c:
                status = lib.rkv_alloc_runs(c, _c_size(n), ctypes.addressof(out), cap, byref(n_runs))
            if status == Status.BUFFER_TOO_SMALL:
                # The slots went back to the pool; retry with room for as many runs.
                cap = max(n_runs.value, 2 * cap)
                continue
            _check(status, "rkv_alloc_runs")
            return [(out[i].start, out[i].len) for i in range(n_runs.value)]

    def free_runs(self, runs: Runs) -> None:
        """Pool mode: returns allocated, never adopted slots given as ``(start, length)``
        runs to the pool (refused whole, as :meth:`free`)."""
        r = _runs_in(runs)
        with self._call() as c:
            _check(lib.rkv_free_runs(c, r.ptr, r.n), "rkv_free_runs")

    def free(self, slots: U32Array) -> None:
        """Pool mode: returns allocated, never adopted slots to the pool (refused whole,
        with :class:`DoubleFreeError`, if one is free already or held by the tree)."""
        s = as_u32(slots, "slots")
        with self._call() as c:
            _check(lib.rkv_free(c, s.ptr, s.n), "rkv_free")

    # -- KV events --

    def set_namespace_meta(
        self, ns: Namespace, lora_name: Optional[str] = None, cache_salt: Optional[str] = None
    ) -> None:
        """Names namespace ``ns`` on the wire (``rkv_events_set_namespace``): its LoRA
        adapter's name and its cache salt (None for none). Before the namespace's first
        insert: afterwards :class:`InvalidArgumentError` (its pages' hashes depend on it),
        as for an empty string or a cache without events."""
        nsid = self.namespace_id(ns)
        lora = _c_str(lora_name, "lora_name")
        salt = _c_str(cache_salt, "cache_salt")
        self._need_events()
        with self._call() as c:
            _check(lib.rkv_events_set_namespace(c, nsid, lora, salt), "rkv_events_set_namespace")

    def flush_events(self) -> Optional[int]:
        """Closes the events recorded so far into one batch (once per scheduler step) and
        returns its sequence number, or None when there were none."""
        self._need_events()
        seq = c_uint64()
        with self._call() as c:
            _check(lib.rkv_events_flush(c, byref(seq)), "rkv_events_flush")
        return None if seq.value == _native.EVENTS_NO_SEQ else seq.value

    def events(self) -> Iterator[KvEvent]:
        """Takes every closed batch now (``rkv_events_drain``) and returns an iterator over
        their events in sequence order: :class:`BlockStored`, :class:`BlockRemoved`,
        :class:`AllBlocksCleared`, each with its batch's ``seq``. Empty while a
        :class:`Publisher` is attached (it takes every batch). Events recorded but not yet
        flushed stay for a later batch: call :meth:`flush_events` first."""
        self._need_events()
        out: List[KvEvent] = []
        caps = [0, 0, 0, 0]
        bufs: List[Any] = [None, None, None, None]
        kinds = (_native.rkv_event, c_uint64, c_uint32, ctypes.c_char)
        while True:
            info = _native.rkv_events_drain_info()
            args = []
            for buf, cap in zip(bufs, caps):
                args += [ctypes.addressof(buf) if buf is not None else None, cap]
            with self._call() as c:
                status = lib.rkv_events_drain(c, *args, byref(info))
            if status == Status.BUFFER_TOO_SMALL:
                need = (info.n_events, info.n_hashes, info.n_tokens, info.n_string_bytes)
                for i, n in enumerate(need):
                    if n > caps[i]:
                        caps[i] = n
                        bufs[i] = (kinds[i] * n)()
                continue
            _check(status, "rkv_events_drain")
            evs = bufs[0]
            out.extend(_event(evs[i]) for i in range(info.n_events))
            if info.batches_left == 0 or info.n_batches == 0:
                return iter(out)

    def events_stats(self) -> EventStats:
        """The event counters: batches closed, events recorded (each removal counts, also
        when adjacent ones are drained merged into one event), batches dropped at a full
        drain queue."""
        self._need_events()
        st = _native.rkv_events_stats()
        with self._call() as c:
            _check(lib.rkv_events_counters(c, byref(st)), "rkv_events_counters")
        return EventStats(**{f: getattr(st, f) for f in _native.EVENTS_STATS_FIELDS})

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
    ) -> Publisher:
        """Starts a ZMQ publisher of this cache's events (``rkv_events_publish``): vLLM's
        stream on ``endpoint`` (bound when it has a ``*`` or is ``ipc://``, else
        connected), replay on ``replay_endpoint``, ``encoding`` ``"vllm-array"`` or
        ``"vllm-map"``, an auto-flush every ``auto_flush_ms`` (0: only
        :meth:`flush_events`). A bad endpoint raises :class:`InvalidArgumentError`, an
        address in use :class:`IoError`, and then nothing changed. Use the
        :class:`Publisher` as a context manager (closing stops it)."""
        self._need_events()
        o = lib.rkv_publisher_options_default()
        ep = _c_str(endpoint, "endpoint")
        replay = _c_str(replay_endpoint, "replay_endpoint")
        top = _c_str(topic, "topic")
        o.endpoint = ep
        o.replay_endpoint = replay
        o.topic = top
        o.encoding = _choice(encoding, _ENCODINGS, "encoding")
        for what, v in (
            ("buffer_steps", buffer_steps),
            ("max_queue", max_queue),
            ("auto_flush_ms", auto_flush_ms),
            ("linger_ms", linger_ms),
        ):
            n = _size(v, what)
            if n > U64_MAX:
                raise InvalidArgumentError(f"{what} must be below 2**64", Status.INVALID_ARGUMENT)
            setattr(o, what, n)
        if isinstance(data_parallel_rank, bool):
            raise TypeError("data_parallel_rank must be an int, not bool")
        rank = operator.index(data_parallel_rank)
        if not -(1 << 63) <= rank < 1 << 63:
            raise InvalidArgumentError("data_parallel_rank must fit an int64", Status.INVALID_ARGUMENT)
        o.data_parallel_rank = rank
        out = c_void_p()
        with self._call() as c:
            # ep, replay and top stay referenced here for the call (the struct holds pointers).
            _check(lib.rkv_events_publish(c, byref(o), byref(out)), "rkv_events_publish")
        try:
            return Publisher(out.value)
        except BaseException:
            lib.rkv_publisher_free(out.value)
            raise

    def _need_events(self) -> None:
        """The library has the event functions (else a clear error before any call)."""
        _need_events()

    # -- the rest --

    def stats(self) -> Stats:
        st = _native.rkv_stats()
        n = c_uint64()
        with self._call() as c:
            _check(lib.rkv_cache_stats(c, byref(st)), "rkv_cache_stats")
            if _has_namespace_count:
                _check(lib.rkv_namespace_count(c, byref(n)), "rkv_namespace_count")
        return Stats(**{f: getattr(st, f) for f in _native.STATS_FIELDS}, namespaces=n.value)

    def reset(self) -> None:
        """Drops every unpinned page (locks stay valid)."""
        with self._call() as c:
            _check(lib.rkv_cache_reset(c), "rkv_cache_reset")

    def reclaim(self) -> None:
        """Frees memory the index unlinked earlier (evicted or split nodes), a bounded
        batch per call. Never needed for correctness: otherwise the same work runs inside
        whichever call next pins the thread. Call it where latency does not matter, e.g.
        once per scheduler step."""
        with self._call() as c:
            _check(lib.rkv_reclaim(c), "rkv_reclaim")

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else "open"
        return (
            f"<radixkv.Cache page_size={self.page_size} pool_slots={self.pool_slots} "
            f"policy={self.policy!r} {state}>"
        )


def _runs_in(runs: Runs) -> _In:
    """``(start, length)`` pairs as a C array of ``rkv_slot_run`` (range-checked)."""
    pairs = list(runs)
    if not pairs:
        return _In(None, 0, None)
    out = (_native.rkv_slot_run * len(pairs))()
    for i, pair in enumerate(pairs):
        start, length = pair
        if not (0 <= start < 2**32 and 0 <= length < 2**32):
            raise ValueError(f"runs[{i}]: start and length must be in [0, 2**32)")
        out[i].start, out[i].len = start, length
    return _In(ctypes.addressof(out), len(pairs), out)


def _addr(a: array) -> Optional[int]:
    return a.buffer_info()[0] if len(a) else None


def version() -> str:
    """The library's version."""
    return lib.rkv_version().decode()


def library_path() -> str:
    """The path of the loaded shared library."""
    return str(_native.lib_path)


__all__ = [
    "Cache",
    "Lock",
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
