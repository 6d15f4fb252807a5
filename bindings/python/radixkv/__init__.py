"""radixkv: a lock-free concurrent radix index for LLM KV-cache prefix reuse.

A native extension (PyO3) over radixkv's Rust API, one abi3 wheel for CPython >= 3.9. See
:class:`Cache`, :class:`RouterIndex` (a KV-aware router's index of many engines' caches)
and, for SGLang, :mod:`radixkv.sglang` (``RadixKvCache``, a drop-in radix cache backend, and
the older ``RadixCache`` adapter).

    >>> import radixkv
    >>> cache = radixkv.Cache(page_size=1, pool_slots=1024)
    >>> slots = cache.alloc(4)
    >>> cache.insert([1, 2, 3, 4], slots)
    0
    >>> with cache.match_lock([1, 2, 3, 9]) as lock:
    ...     lock.length
    3

A host memory tier behind the device pool (SGLang HiCache's semantics) is an option of
the same class: ``radixkv.Cache(page_size, pool_slots, host=radixkv.HostOptions(host_slots,
write_policy=...))``; :meth:`Cache.lookup` then reports ``device_len`` and ``host_len``
and :meth:`Cache.load_back` brings host pages back (``TieredCache`` is a deprecated
wrapper over it).
"""

from ._cache import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    BufferTooSmallError,
    Cache,
    CacheClosedError,
    DeviceError,
    DoubleFreeError,
    EventOptions,
    EventStats,
    InternalError,
    InvalidArgumentError,
    InvalidLockError,
    IoError,
    KvEvent,
    Lock,
    NamespaceStats,
    NoPoolError,
    NoTierError,
    NullArgumentError,
    OutOfSlotsError,
    Publisher,
    PublisherStats,
    RadixKvError,
    SlotBuffer,
    Stats,
    Status,
    library_path,
    version,
)
from ._router import (
    GAP_POLICIES,
    BadDumpError,
    BatchReport,
    EmptyStoreError,
    MalformedBatchError,
    RouterError,
    RouterIndex,
    RouterOptionsError,
    Score,
    SequenceGapError,
    TooManyWorkersError,
    UnalignedError,
    UnknownParentError,
    UnknownRemovalsError,
    Worker,
    content_hashes,
)
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
from ._request import Request
from ._tier import TieredCache
from .sglang import MatchResult, RadixCache, StaleNodeError, TreeNode

__version__ = "0.1.0"

__all__ = [
    "GAP_POLICIES",
    "BadDumpError",
    "BatchReport",
    "EmptyStoreError",
    "MalformedBatchError",
    "RouterError",
    "RouterIndex",
    "RouterOptionsError",
    "Score",
    "SequenceGapError",
    "TooManyWorkersError",
    "UnalignedError",
    "UnknownParentError",
    "UnknownRemovalsError",
    "Worker",
    "content_hashes",
    "WRITE_POLICIES",
    "TierStats",
    "TierMatch",
    "TierLock",
    "TieredCache",
    "LoadTicket",
    "Loaded",
    "LOAD_OUTCOMES",
    "KvLayout",
    "HostOptions",
    "NoTierError",
    "Request",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "BufferTooSmallError",
    "Cache",
    "CacheClosedError",
    "DeviceError",
    "DoubleFreeError",
    "EventOptions",
    "EventStats",
    "InternalError",
    "InvalidArgumentError",
    "InvalidLockError",
    "IoError",
    "KvEvent",
    "Lock",
    "MatchResult",
    "NamespaceStats",
    "NoPoolError",
    "NullArgumentError",
    "OutOfSlotsError",
    "Publisher",
    "PublisherStats",
    "RadixCache",
    "RadixKvError",
    "SlotBuffer",
    "StaleNodeError",
    "Stats",
    "Status",
    "TreeNode",
    "library_path",
    "version",
]
