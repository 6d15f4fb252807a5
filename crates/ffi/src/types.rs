//! The C ABI's plain types: the status, the option and statistics structs, the opaque cache,
//! lock handles and the callback types (the header's typedefs; no functions).

use std::ffi::{c_int, c_void};

use radixkv_core::cache::Cache;
use radixkv_core::error::status;
use radixkv_core::slot_run::SlotRun;
use radixkv_core::tree::{DEFAULT_SLRU_THRESHOLD, PrefixLock};

use crate::handles::LockTable;

/// ABI version of this header; `rkv_abi_version()` returns the same number of the library
/// actually loaded (compare the two to detect a mismatched library).
pub const RKV_ABI_VERSION: u32 = 1;

/// Status of a call. `RKV_OK` is 0; every other value is an error after which the call has
/// written no output (except `*out_len`, or `rkv_events_drain`'s `*out_info`, on
/// `RKV_BUFFER_TOO_SMALL`) and changed nothing.
/// A plain value: nothing to free, valid on any thread. `rkv_status_str` names a status;
/// `rkv_last_error_message()` says what exactly the last failing call on this thread found
/// wrong (which argument, which value, which limit).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_status {
    /// Success.
    RKV_OK = 0,
    /// A pointer that is required was NULL.
    RKV_NULL_ARGUMENT = 1,
    /// A bad argument: page_size 0, unknown eviction policy, slot outside the pool, a
    /// misaligned pointer, ...
    RKV_INVALID_ARGUMENT = 2,
    /// An unknown, already released, or another cache's lock.
    RKV_INVALID_LOCK = 3,
    /// The output buffer is smaller than the result; the required length is in `*out_len`
    /// (for `rkv_events_drain`, the sizes every buffer needs are in `*out_info`).
    RKV_BUFFER_TOO_SMALL = 4,
    /// The pool is short even after evicting everything evictable.
    RKV_OUT_OF_SLOTS = 5,
    /// A pool call on a cache created with `pool_slots == 0`.
    RKV_NO_POOL = 6,
    /// A slot that is already free or held by the tree.
    RKV_DOUBLE_FREE = 7,
    /// KV storage / CUDA failure: a host tier's copy failed (a copier callback returned
    /// an error, rolled back), or its KV memory could not be had (an extension of version 1:
    /// produced only by `rkv_tier_*` functions; the cache functions do not touch KV storage).
    RKV_DEVICE_ERROR = 8,
    /// A bug: a Rust panic caught at the boundary; or an internal limit, refused before
    /// anything changes: more than 16.7 million live locks on one cache, or more than
    /// 2^20 - 1 live caches in the process.
    RKV_INTERNAL_ERROR = 9,
    /// The environment refused what a valid call needed (an extension of version 1): an
    /// address already in use, a socket, runtime or thread that could not be had. Produced
    /// only by `rkv_events_publish`; the cache is unchanged.
    RKV_IO_ERROR = 10,
    /// A batch's `seq` skips ahead of its worker's cursor and the router index refuses gaps
    /// (`RKV_GAP_REFUSE`; an extension of version 1, produced only by
    /// `rkv_router_apply_batch`): nothing applied; replay the worker's stream from
    /// `rkv_router_next_seq`, then retry.
    RKV_SEQUENCE_GAP = 11,
    /// What the call asks about is not there (an extension of version 1, produced only by
    /// `rkv_router_remove_worker`, for a worker the index does not know, and
    /// `rkv_router_next_seq`, for a worker without a batch cursor); nothing changed.
    RKV_NOT_FOUND = 12,
}

impl rkv_status {
    /// Every status, in number order.
    pub const ALL: [rkv_status; 13] = {
        use rkv_status::*;
        [
            RKV_OK,
            RKV_NULL_ARGUMENT,
            RKV_INVALID_ARGUMENT,
            RKV_INVALID_LOCK,
            RKV_BUFFER_TOO_SMALL,
            RKV_OUT_OF_SLOTS,
            RKV_NO_POOL,
            RKV_DOUBLE_FREE,
            RKV_DEVICE_ERROR,
            RKV_INTERNAL_ERROR,
            RKV_IO_ERROR,
            RKV_SEQUENCE_GAP,
            RKV_NOT_FOUND,
        ]
    };

    /// The status numbered `code` ([`status`]), if one is.
    pub fn from_code(code: i32) -> Option<rkv_status> {
        usize::try_from(code).ok().and_then(|i| Self::ALL.get(i)).copied()
    }
}

// The header's enum (cbindgen needs literal values) is the core's table, value for value and
// name for name: the status codes are defined once, in `radixkv::error::status`.
const _: () = {
    assert!(rkv_status::ALL.len() == status::ALL.len());
    let mut i = 0;
    while i < status::ALL.len() {
        assert!(rkv_status::ALL[i] as i32 == status::ALL[i].code);
        i += 1;
    }
    use rkv_status::*;
    assert!(RKV_OK as i32 == status::OK);
    assert!(RKV_NULL_ARGUMENT as i32 == status::NULL_ARGUMENT);
    assert!(RKV_INVALID_ARGUMENT as i32 == status::INVALID_ARGUMENT);
    assert!(RKV_INVALID_LOCK as i32 == status::INVALID_LOCK);
    assert!(RKV_BUFFER_TOO_SMALL as i32 == status::BUFFER_TOO_SMALL);
    assert!(RKV_OUT_OF_SLOTS as i32 == status::OUT_OF_SLOTS);
    assert!(RKV_NO_POOL as i32 == status::NO_POOL);
    assert!(RKV_DOUBLE_FREE as i32 == status::DOUBLE_FREE);
    assert!(RKV_DEVICE_ERROR as i32 == status::DEVICE_ERROR);
    assert!(RKV_INTERNAL_ERROR as i32 == status::INTERNAL_ERROR);
    assert!(RKV_IO_ERROR as i32 == status::IO_ERROR);
    assert!(RKV_SEQUENCE_GAP as i32 == status::SEQUENCE_GAP);
    assert!(RKV_NOT_FOUND as i32 == status::NOT_FOUND);
};

/// How eviction orders evictable leaves (the `eviction_policy` field of `rkv_options`, a
/// `uint32_t`: values other than these are `RKV_INVALID_ARGUMENT`, with a message listing
/// the valid ones). A plain value. Eviction takes unpinned leaves only, the smallest key
/// first; a parent whose last child went competes next with its own key (the keys are
/// SGLang's, see docs/eviction.md). Every value but `RKV_EVICT_LRU` is an extension of
/// version 1; `rkv_eviction_policy_name` names them as SGLang's `--radix-eviction-policy`
/// does, `rkv_eviction_policy_from_name` reads those names.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_eviction_policy {
    /// `"lru"`: least recently accessed leaf first (the default).
    RKV_EVICT_LRU = 0,
    /// `"fifo"`: oldest inserted leaf first, ignoring later accesses.
    RKV_EVICT_FIFO = 1,
    /// `"lfu"`: fewest hits first, then least recently accessed: key (hit count, last
    /// access). A hit is an insert whose key passes through or ends at the node, each
    /// request counted once (`rkv_insert_options.inserted_len`); matches count none.
    RKV_EVICT_LFU = 2,
    /// `"mru"`: most recently accessed leaf first.
    RKV_EVICT_MRU = 3,
    /// `"filo"`: newest inserted leaf first, ignoring accesses.
    RKV_EVICT_FILO = 4,
    /// `"priority"`: lowest priority first, then least recently accessed: key (priority,
    /// last access). An insert raises every node on its path to at least its priority
    /// (`rkv_insert_options.priority`, default 0).
    RKV_EVICT_PRIORITY = 5,
    /// `"slru"`: segmented LRU: key (1 if hit count >= the threshold else 0, last access),
    /// so the probationary segment goes first, each segment in LRU order. The threshold is
    /// `rkv_policy_options.slru_threshold` (default `RKV_DEFAULT_SLRU_THRESHOLD`).
    RKV_EVICT_SLRU = 6,
}

/// `RKV_EVICT_SLRU`'s default threshold (SGLang's `protected_threshold`): a node with at
/// least this many hits is in the protected segment.
pub const RKV_DEFAULT_SLRU_THRESHOLD: u32 = 2;

// A literal for the header; the core's default it mirrors.
const _: () = assert!(RKV_DEFAULT_SLRU_THRESHOLD == DEFAULT_SLRU_THRESHOLD);

/// The parameters of an eviction policy (an extension of version 1: `rkv_options`, whose
/// size version 1 fixes, cannot grow), for `rkv_cache_new_with`. Get the defaults from
/// `rkv_policy_options_default()` and change fields. A plain value: the caller owns it,
/// and `rkv_cache_new_with` only reads it during the call.
///
/// Versioned by `size`: it must be `sizeof(rkv_policy_options)` of this header (12), which
/// `rkv_policy_options_default()` sets, or 8, the size before `swa_window` was appended (a
/// caller built against that header: `swa_window` is then 0); any other value is
/// `RKV_INVALID_ARGUMENT`. A later library that appends fields will still accept these
/// sizes (and use the defaults of the fields it appended); a caller built against a larger
/// struct gets a clear refusal from this library instead of having its new fields ignored.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct rkv_policy_options {
    /// `sizeof(rkv_policy_options)`: 12 (8 before `swa_window`).
    pub size: u32,
    /// `RKV_EVICT_SLRU`'s threshold: a node with at least this many hits is in the
    /// protected segment (default `RKV_DEFAULT_SLRU_THRESHOLD` = 2; 0 puts every node
    /// there, which is LRU). Any value; ignored by the other policies.
    pub slru_threshold: u32,
    /// The sliding window of a hybrid model's SWA layers, in tokens (default 0: none).
    /// With one, matches return only SWA-valid prefixes (the last `swa_window` tokens'
    /// SWA KV cached), locks hold their window's SWA KV, and eviction goes through
    /// `rkv_evict_kv`, which says per node whether its full KV, its SWA KV or both were
    /// freed: `rkv_evict` and the other evictions then need a callback even with a pool
    /// (`RKV_INVALID_ARGUMENT` otherwise), and `rkv_alloc` does not evict on its own.
    /// Added in the same ABI version.
    pub swa_window: u32,
}

/// Which KV an `rkv_evict_kv` call frees to reach its target (an extension of version 1).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rkv_evict_target {
    /// Full KV: unpinned leaves in the policy's order, as `rkv_evict`.
    RKV_EVICT_TARGET_FULL = 0,
    /// SWA KV (a cache with `swa_window`): nodes whose SWA KV no window lock holds, least
    /// recently used first: an unpinned leaf whole, any other node as an SWA tombstone
    /// (its full KV kept), then a tombstone left an unpinned leaf (its full KV).
    RKV_EVICT_TARGET_SWA = 1,
}

/// `rkv_freed_fn`'s `freed` bit: the node's full KV was freed (it left the cache).
pub const RKV_FREED_FULL: u32 = 1;
/// `rkv_freed_fn`'s `freed` bit: the node's SWA KV was freed (named by the same slots).
pub const RKV_FREED_SWA: u32 = 2;

/// Receives one evicted node's slots (`n` of them, valid during the call) and what was
/// freed of them (`RKV_FREED_FULL` | `RKV_FREED_SWA`) from `rkv_evict_kv`, on the evicting
/// thread, with no cache lock held; it must not call into the same cache and cannot unwind.
pub type rkv_freed_fn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, freed: u32, slots: *const u32, n: usize)>;

/// Per-insert options (an extension of version 1), for `rkv_insert_ex`,
/// `rkv_insert_lock_ex`, `rkv_insert_runs_ex` and `rkv_insert_lock_runs_ex`. Get the
/// defaults from `rkv_insert_options_default()` and change fields; a NULL pointer means the
/// defaults (what `rkv_insert` and the others use). A plain value: the caller owns it, and
/// the call only reads it.
///
/// Versioned by `size`, as `rkv_policy_options`: it must be `sizeof(rkv_insert_options)`
/// of this header (24), which `rkv_insert_options_default()` sets; any other value is
/// `RKV_INVALID_ARGUMENT`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct rkv_insert_options {
    /// `sizeof(rkv_insert_options)`: 24.
    pub size: u32,
    /// Must be 0 (reserved for flags of a later version; else `RKV_INVALID_ARGUMENT`).
    pub reserved: u32,
    /// Eviction priority of the inserted tokens, read by `RKV_EVICT_PRIORITY` (higher stays
    /// longer; default 0): every node on the insert's path takes the larger of its own
    /// priority and this one, a new node starts with it, a split's halves keep theirs.
    /// Must fit an `int32_t` (-2147483648 to 2147483647), else `RKV_INVALID_ARGUMENT`.
    /// Under the other policies it is checked and then not kept.
    pub priority: i64,
    /// Tokens of this key that the same request inserted before (SGLang's
    /// `req.kv.cache_inserted_len`; default 0, a request's first insert), read by
    /// `RKV_EVICT_LFU` and `RKV_EVICT_SLRU`: nodes that end within them count no hit, so a
    /// request inserting its growing prefix several times (chunked prefill, then the
    /// finish) counts each node once. Any value (one past the key counts no hit at all).
    pub inserted_len: u64,
}

// Neither struct has padding, so every byte a caller passes is a field.
const _: () = assert!(
    std::mem::size_of::<rkv_policy_options>() == 12
        && std::mem::size_of::<rkv_insert_options>() == 24
        && std::mem::offset_of!(rkv_insert_options, priority) == 8
        && std::mem::offset_of!(rkv_insert_options, inserted_len) == 16
);

/// `rkv_match_options.flags` bit: pin the matched device prefix and write its lock to
/// `rkv_match_result.lock` (as `rkv_match_lock`). Without it nothing is pinned.
pub const RKV_MATCH_LOCK: u32 = 1;

/// Per-match options (an extension of version 1), for `rkv_match_ex`. Get the defaults
/// from `rkv_match_options_default()` and change fields; a NULL pointer means the defaults
/// (a plain match: nothing pinned). A plain value: the caller owns it, and the call only
/// reads it.
///
/// Versioned by `size`, as `rkv_insert_options`: it must be `sizeof(rkv_match_options)` of
/// this header (8), which `rkv_match_options_default()` sets; any other value is
/// `RKV_INVALID_ARGUMENT`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct rkv_match_options {
    /// `sizeof(rkv_match_options)`: 8.
    pub size: u32,
    /// `RKV_MATCH_LOCK` or 0 (the default); another bit is `RKV_INVALID_ARGUMENT`.
    pub flags: u32,
}

/// What `rkv_match_ex` matched (an extension of version 1): a plain value the caller owns
/// and the call writes. Written whole on `RKV_OK`; on `RKV_BUFFER_TOO_SMALL` only
/// `device_len` (the match length the buffer must hold) is written.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rkv_match_result {
    /// Tokens cached on the device: the match length (`rkv_match`'s `*out_len`); its slots
    /// are `out_slots[0..device_len]`.
    pub device_len: usize,
    /// Tokens on the host tier right after them (SGLang's `host_hit_length`): what
    /// `rkv_cache_load_back` can bring back. 0 for a cache without a host tier.
    pub host_len: usize,
    /// With `RKV_MATCH_LOCK`: the lock pinning the device prefix (never 0, also for a
    /// match of 0 tokens), the caller's to release with `rkv_release` exactly once.
    /// Without it: 0.
    pub lock: rkv_lock,
}

#[cfg(target_pointer_width = "64")]
const _: () = assert!(
    std::mem::size_of::<rkv_match_options>() == 8 && std::mem::size_of::<rkv_match_result>() == 24
);

/// Options of a new cache. Get the defaults from `rkv_options_default()` and change fields.
/// A plain value: the caller owns it, and `rkv_cache_new` only reads it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct rkv_options {
    /// Page size, >= 1 (default 1).
    pub page_size: u32,
    /// An `rkv_eviction_policy` value (default `RKV_EVICT_LRU`).
    pub eviction_policy: u32,
    /// 0: the caller manages slots; N: a built-in pool of N slots, a multiple of page_size
    /// and at most 2^32 (default 0).
    pub pool_slots: u64,
}

/// A snapshot of a cache's counts and counters (`rkv_cache_stats`). A plain value owned by
/// the caller. Under concurrent calls each field is read atomically but the fields are not
/// one atomic snapshot; at quiescence `cached_tokens == evictable_tokens + protected_tokens`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rkv_stats {
    /// Tokens cached.
    pub cached_tokens: u64,
    /// Cached and not pinned by any lock.
    pub evictable_tokens: u64,
    /// Cached and pinned.
    pub protected_tokens: u64,
    /// Tree nodes (edges), roots excluded.
    pub nodes: u64,
    /// Pool size; 0 without a pool.
    pub pool_slots: u64,
    /// Free slots in the pool; 0 without a pool.
    pub free_slots: u64,
    /// Calls of rkv_match and rkv_match_lock.
    pub match_calls: u64,
    /// Tokens asked for by those calls.
    pub match_query_tokens: u64,
    /// Tokens they found.
    pub match_hit_tokens: u64,
    /// Tokens newly cached by inserts.
    pub inserted_tokens: u64,
    /// Tokens removed by eviction.
    pub evicted_tokens: u64,
}

/// A cache: an opaque object created by `rkv_cache_new` and destroyed by `rkv_cache_free`.
/// Every function taking `const rkv_cache *` is safe to call from many threads at once;
/// `rkv_cache_free`, `rkv_cache_clear` and `rkv_events_enable` (which take `rkv_cache *`) must
/// not run concurrently with any other call on the same cache.
pub struct rkv_cache {
    pub(crate) cache: Cache,
    pub(crate) locks: LockTable<PrefixLock>,
    /// Its load-backs (`rkv_cache_load_back`; a cache made by `rkv_cache_new_host`).
    pub(crate) loads: crate::tier::Loads,
    /// Its live requests (`rkv_request_admit`), aborted by `rkv_cache_free`.
    pub(crate) requests: crate::request::Requests,
}

/// A lock handle: pins a matched prefix until `rkv_release`. 0 is never a valid lock. A
/// plain value, valid only with the cache that made it; a handle that is unknown, already
/// released or another cache's is refused with `RKV_INVALID_LOCK`.
pub type rkv_lock = u64;

/// Receives freed slots during `rkv_evict` (and `rkv_drop_namespace`): `slots[0..n_slots]`
/// is valid only during the call (copy what you keep). Called on the thread that called
/// `rkv_evict`, possibly several times per eviction; every freed slot is passed exactly once. It must return normally (no
/// longjmp, no C++ exception) and must not call into the same cache.
pub type rkv_free_fn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, slots: *const u32, n_slots: usize)>;

/// A run of consecutive slots `start, start + 1, .., start + len - 1` (`len >= 1`), as
/// `rkv_evict_runs` hands evicted slots over. A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct rkv_slot_run {
    /// The first slot.
    pub start: u32,
    /// How many slots.
    pub len: u32,
}

// `rkv_slot_run` and `SlotRun` are the same two `u32`s in the same order (both `repr(C)`).
const _: () = assert!(
    std::mem::size_of::<rkv_slot_run>() == std::mem::size_of::<SlotRun>()
        && std::mem::align_of::<rkv_slot_run>() == std::mem::align_of::<SlotRun>()
        && std::mem::offset_of!(rkv_slot_run, start) == std::mem::offset_of!(SlotRun, start)
        && std::mem::offset_of!(rkv_slot_run, len) == std::mem::offset_of!(SlotRun, len)
);

/// Receives freed slots during `rkv_evict_runs`, as runs: `runs[0..n_runs]` is valid only
/// during the call (copy what you keep). Otherwise as `rkv_free_fn`: called on the thread
/// that called `rkv_evict_runs`, possibly several times per eviction (once per evicted
/// leaf); every freed slot is in exactly one run of one call. It must return normally and
/// must not call into the same cache.
pub type rkv_free_runs_fn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, runs: *const rkv_slot_run, n_runs: usize)>;

/// How `rkv_status_str` receives its argument on the Rust side: a C int, so that a value
/// outside the enum is "unknown status" and not undefined behavior. The header spells it
/// `rkv_status` (cbindgen.toml renames it and omits its typedef).
pub type rkv_status_value = c_int;
