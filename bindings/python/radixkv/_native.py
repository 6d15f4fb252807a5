"""Loading libradixkv and declaring the C ABI (include/radixkv.h) for ctypes.

The library is looked up, in order:

1. the environment variable ``RADIXKV_LIB`` (a file, or a directory holding it);
2. next to this package (``pip install bindings/python`` copies it there when it was
   built before the install);
3. ``target/release/`` of the source checkout this package lives in
   (``bindings/python/radixkv/../../../target/release``).

Calls go through :class:`ctypes.CDLL`, which releases the GIL for the duration of each
foreign call, so Python threads using one cache run in parallel inside the library.
"""

from __future__ import annotations

import ctypes
import os
import sys
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char_p,
    c_double,
    c_int,
    c_int64,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path

ABI_VERSION = 1

if sys.platform == "darwin":
    LIB_NAME = "libradixkv.dylib"
elif sys.platform == "win32":
    LIB_NAME = "radixkv.dll"
else:
    LIB_NAME = "libradixkv.so"


class rkv_options(Structure):
    _fields_ = [
        ("page_size", c_uint32),
        ("eviction_policy", c_uint32),
        ("pool_slots", c_uint64),
    ]


STATS_FIELDS = (
    "cached_tokens",
    "evictable_tokens",
    "protected_tokens",
    "nodes",
    "pool_slots",
    "free_slots",
    "match_calls",
    "match_query_tokens",
    "match_hit_tokens",
    "inserted_tokens",
    "evicted_tokens",
)


class rkv_stats(Structure):
    _fields_ = [(name, c_uint64) for name in STATS_FIELDS]


NAMESPACE_STATS_FIELDS = ("cached_tokens", "evictable_tokens", "protected_tokens", "nodes")


class rkv_namespace_stats(Structure):
    _fields_ = [(name, c_uint64) for name in NAMESPACE_STATS_FIELDS]


FREE_FN = CFUNCTYPE(None, c_void_p, POINTER(c_uint32), c_size_t)


class rkv_slot_run(Structure):
    _fields_ = [("start", c_uint32), ("len", c_uint32)]


FREE_RUNS_FN = CFUNCTYPE(None, c_void_p, POINTER(rkv_slot_run), c_size_t)

# ---- KV events (rkv_events_*, rkv_publisher_*; additions within ABI version 1) ----------


class rkv_events_options(Structure):
    _fields_ = [("hash_mode", c_uint32), ("medium", c_uint32), ("max_drain_batches", c_uint64)]


class rkv_event(Structure):
    _fields_ = [
        ("seq", c_uint64),
        ("ts", c_double),
        ("kind", c_uint32),
        ("medium", c_uint32),
        ("block_size", c_uint32),
        ("has_parent", c_uint32),
        ("parent_block_hash", c_uint64),
        ("block_hashes", POINTER(c_uint64)),
        ("n_block_hashes", c_size_t),
        ("token_ids", POINTER(c_uint32)),
        ("n_token_ids", c_size_t),
        ("lora_name", c_char_p),
        ("cache_salt", c_char_p),
    ]


DRAIN_INFO_FIELDS = ("n_batches", "n_events", "n_hashes", "n_tokens", "n_string_bytes", "batches_left")


class rkv_events_drain_info(Structure):
    _fields_ = [(name, c_size_t) for name in DRAIN_INFO_FIELDS]


EVENTS_STATS_FIELDS = ("batches", "events", "dropped")


class rkv_events_stats(Structure):
    _fields_ = [(name, c_uint64) for name in EVENTS_STATS_FIELDS]


class rkv_publisher_options(Structure):
    _fields_ = [
        ("endpoint", c_char_p),
        ("replay_endpoint", c_char_p),
        ("topic", c_char_p),
        ("encoding", c_uint32),
        ("buffer_steps", c_uint64),
        ("max_queue", c_uint64),
        ("auto_flush_ms", c_uint64),
        ("linger_ms", c_uint64),
        ("data_parallel_rank", c_int64),
    ]


PUBLISHER_STATS_FIELDS = ("published", "dropped", "replayed", "replay_requests")


class rkv_publisher_stats(Structure):
    _fields_ = [(name, c_uint64) for name in PUBLISHER_STATS_FIELDS]


#: ``RKV_EVENTS_NO_SEQ``: what ``rkv_events_flush`` writes when there was nothing to close.
EVENTS_NO_SEQ = (1 << 64) - 1

rkv_lock = c_uint64
_status = c_int  # rkv_status: a C enum, int-sized

#: The KV-event functions, which a library built before them lacks.
EVENT_FUNCTIONS = frozenset(
    {
        "rkv_events_options_default",
        "rkv_events_enable",
        "rkv_events_set_namespace",
        "rkv_events_flush",
        "rkv_events_counters",
        "rkv_events_drain",
        "rkv_publisher_options_default",
        "rkv_events_publish",
        "rkv_publisher_endpoint",
        "rkv_publisher_counters",
        "rkv_publisher_stop",
        "rkv_publisher_free",
    }
)


def candidates() -> list[Path]:
    """Where the library is looked for, in order."""
    env = os.environ.get("RADIXKV_LIB")
    if env:
        p = Path(env)
        return [p / LIB_NAME if p.is_dir() else p]
    here = Path(__file__).resolve().parent
    return [here / LIB_NAME, here.parents[2] / "target" / "release" / LIB_NAME]


#: Additions within ABI version 1 that a library built before them lacks.
OPTIONAL = frozenset(
    {"rkv_last_error_message", "rkv_drop_namespace", "rkv_cache_namespace_stats", "rkv_namespace_count"}
) | EVENT_FUNCTIONS


def _declare(lib: ctypes.CDLL) -> None:
    sigs = {
        "rkv_version": (c_char_p, []),
        "rkv_abi_version": (c_uint32, []),
        "rkv_status_str": (c_char_p, [c_int]),
        "rkv_last_error_message": (c_char_p, []),
        "rkv_options_default": (rkv_options, []),
        "rkv_cache_new": (_status, [POINTER(rkv_options), POINTER(c_void_p)]),
        "rkv_cache_free": (None, [c_void_p]),
        "rkv_match": (
            _status,
            [c_void_p, c_uint64, c_void_p, c_size_t, c_void_p, c_size_t, POINTER(c_size_t)],
        ),
        "rkv_match_runs": (
            _status,
            [
                c_void_p,
                c_uint64,
                c_void_p,
                c_size_t,
                c_void_p,
                c_size_t,
                POINTER(c_size_t),
                POINTER(c_size_t),
            ],
        ),
        "rkv_match_lock": (
            _status,
            [
                c_void_p,
                c_uint64,
                c_void_p,
                c_size_t,
                c_void_p,
                c_size_t,
                POINTER(c_size_t),
                POINTER(rkv_lock),
            ],
        ),
        "rkv_match_lock_runs": (
            _status,
            [
                c_void_p,
                c_uint64,
                c_void_p,
                c_size_t,
                c_void_p,
                c_size_t,
                POINTER(c_size_t),
                POINTER(c_size_t),
                POINTER(rkv_lock),
            ],
        ),
        "rkv_insert": (
            _status,
            [c_void_p, c_uint64, c_void_p, c_void_p, c_size_t, POINTER(c_size_t)],
        ),
        "rkv_insert_lock": (
            _status,
            [
                c_void_p,
                c_uint64,
                c_void_p,
                c_void_p,
                c_size_t,
                POINTER(c_size_t),
                POINTER(rkv_lock),
            ],
        ),
        "rkv_insert_runs": (
            _status,
            [c_void_p, c_uint64, c_void_p, c_size_t, c_void_p, c_size_t, POINTER(c_size_t)],
        ),
        "rkv_insert_lock_runs": (
            _status,
            [
                c_void_p,
                c_uint64,
                c_void_p,
                c_size_t,
                c_void_p,
                c_size_t,
                POINTER(c_size_t),
                POINTER(rkv_lock),
            ],
        ),
        "rkv_lock_len": (_status, [c_void_p, rkv_lock, POINTER(c_size_t)]),
        "rkv_release": (_status, [c_void_p, rkv_lock]),
        "rkv_evict": (_status, [c_void_p, c_size_t, FREE_FN, c_void_p, POINTER(c_size_t)]),
        "rkv_evict_runs": (_status, [c_void_p, c_size_t, FREE_RUNS_FN, c_void_p, POINTER(c_size_t)]),
        "rkv_alloc": (_status, [c_void_p, c_size_t, c_void_p]),
        "rkv_free": (_status, [c_void_p, c_void_p, c_size_t]),
        "rkv_alloc_runs": (_status, [c_void_p, c_size_t, c_void_p, c_size_t, POINTER(c_size_t)]),
        "rkv_free_runs": (_status, [c_void_p, c_void_p, c_size_t]),
        "rkv_cache_stats": (_status, [c_void_p, POINTER(rkv_stats)]),
        "rkv_cache_reset": (_status, [c_void_p]),
        "rkv_reclaim": (_status, [c_void_p]),
        "rkv_drop_namespace": (_status, [c_void_p, c_uint64, FREE_FN, c_void_p, POINTER(c_size_t)]),
        "rkv_cache_namespace_stats": (_status, [c_void_p, c_uint64, POINTER(rkv_namespace_stats)]),
        "rkv_namespace_count": (_status, [c_void_p, POINTER(c_uint64)]),
        "rkv_events_options_default": (rkv_events_options, []),
        "rkv_events_enable": (_status, [c_void_p, POINTER(rkv_events_options)]),
        "rkv_events_set_namespace": (_status, [c_void_p, c_uint64, c_char_p, c_char_p]),
        "rkv_events_flush": (_status, [c_void_p, POINTER(c_uint64)]),
        "rkv_events_counters": (_status, [c_void_p, POINTER(rkv_events_stats)]),
        "rkv_events_drain": (
            _status,
            [
                c_void_p,
                c_void_p,
                c_size_t,
                c_void_p,
                c_size_t,
                c_void_p,
                c_size_t,
                c_void_p,
                c_size_t,
                POINTER(rkv_events_drain_info),
            ],
        ),
        "rkv_publisher_options_default": (rkv_publisher_options, []),
        "rkv_events_publish": (_status, [c_void_p, POINTER(rkv_publisher_options), POINTER(c_void_p)]),
        "rkv_publisher_endpoint": (_status, [c_void_p, POINTER(c_char_p), POINTER(c_char_p)]),
        "rkv_publisher_counters": (_status, [c_void_p, POINTER(rkv_publisher_stats)]),
        "rkv_publisher_stop": (_status, [c_void_p]),
        "rkv_publisher_free": (None, [c_void_p]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name, None)
        if fn is None and name in OPTIONAL:
            continue  # an older library of the same ABI version
        if fn is None:
            fn = getattr(lib, name)  # raises AttributeError naming it
        fn.restype = restype
        fn.argtypes = argtypes


def load() -> tuple[ctypes.CDLL, Path]:
    """Loads the library and checks its ABI version."""
    tried = []
    for path in candidates():
        tried.append(str(path))
        if not path.is_file():
            continue
        lib = ctypes.CDLL(str(path))
        _declare(lib)
        abi = lib.rkv_abi_version()
        if abi != ABI_VERSION:
            raise ImportError(f"{path} has C ABI version {abi}; this package needs {ABI_VERSION}")
        return lib, path
    raise ImportError(
        "radixkv: cannot find the radixkv shared library; tried "
        + ", ".join(tried)
        + ". Build it with `cargo build --release` or set RADIXKV_LIB to its path."
    )


lib, lib_path = load()
