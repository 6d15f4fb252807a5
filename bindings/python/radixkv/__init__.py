"""radixkv: a lock-free concurrent radix index for LLM KV-cache prefix reuse.

Python bindings over the C ABI (``include/radixkv.h``) with ctypes: no compiler is needed
at install time, only the shared library (``cargo build --release``). See :class:`Cache`
and, for SGLang-style schedulers, :class:`radixkv.sglang.RadixCache`.

    >>> import radixkv
    >>> cache = radixkv.Cache(page_size=1, pool_slots=1024)
    >>> slots = cache.alloc(4)
    >>> cache.insert([1, 2, 3, 4], slots)
    0
    >>> with cache.match_lock([1, 2, 3, 9]) as lock:
    ...     lock.length
    3
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
    NullArgumentError,
    OutOfSlotsError,
    Publisher,
    PublisherStats,
    RadixKvError,
    Stats,
    Status,
    library_path,
    version,
)
from .sglang import MatchResult, RadixCache, StaleNodeError, TreeNode

__version__ = "0.1.0"

__all__ = [
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
    "StaleNodeError",
    "Stats",
    "Status",
    "TreeNode",
    "library_path",
    "version",
]
