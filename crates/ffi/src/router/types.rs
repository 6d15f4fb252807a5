//! The router index's C types: options, workers, scores, stats, the gap policy and the
//! opaque index (the header's typedefs; no functions).

use radixkv_router::RouterIndex;

/// What a sequence gap does (the `gap_policy` field of `rkv_router_options`, a `uint32_t`:
/// other values are `RKV_INVALID_ARGUMENT`). A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_gap_policy {
    /// A batch whose `seq` skips ahead of its worker's cursor clears the worker (it is
    /// re-learned from its later events), counts the gap, then applies (the default).
    RKV_GAP_CLEAR = 0,
    /// Nothing of such a batch applies: `rkv_router_apply_batch` returns `RKV_SEQUENCE_GAP`
    /// and the caller replays the worker's stream from `rkv_router_next_seq`, then retries.
    RKV_GAP_REFUSE = 1,
}

/// Options of a new router index. Get the defaults from `rkv_router_options_default()` and
/// change fields. A plain value: the caller owns it, and the functions taking it only read
/// it during the call.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct rkv_router_options {
    /// Tokens per block, >= 1 (every worker's `block_size`; default 16).
    pub block_size: u32,
    /// Distinct live `(worker_id, dp_rank)` pairs at most, 1 to 2^29 (default 4096).
    pub max_workers: u32,
    /// An `rkv_gap_policy` value (default `RKV_GAP_CLEAR`).
    pub gap_policy: u32,
    /// Must be 0 (reserved for a later version; else `RKV_INVALID_ARGUMENT`).
    pub reserved: u32,
}

/// An engine worker: its id and data-parallel rank. A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct rkv_worker {
    /// The worker (instance) id.
    pub worker_id: u64,
    /// Its data-parallel rank (0 without data parallelism).
    pub dp_rank: u32,
    /// Must be 0 (else `RKV_INVALID_ARGUMENT`).
    pub reserved: u32,
}

/// One worker's answer to `rkv_router_find`. A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct rkv_router_score {
    /// The worker (`reserved` is 0).
    pub worker: rkv_worker,
    /// Leading blocks of the request it holds on the device (GPU); 0 for a worker holding
    /// only host copies.
    pub device_blocks: u32,
    /// Leading blocks it holds in any medium (GPU or a host copy); at least 1.
    pub any_blocks: u32,
}

/// A router index's counts and counters (`rkv_router_stats_get`). A plain value owned by the
/// caller. Each field is read atomically, but the fields are not one snapshot under
/// concurrent writers.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct rkv_router_stats {
    /// Live `(worker_id, dp_rank)` pairs; `max_workers` caps this count.
    pub workers: u64,
    /// Distinct (namespace, chain position, content) blocks held by anyone.
    pub blocks: u64,
    /// (block, worker, medium) holdings.
    pub memberships: u64,
    /// The index's own heap bytes (memory retired but not yet reclaimed excluded).
    pub bytes: u64,
    /// Events applied or refused (typed calls and the events of batches).
    pub events: u64,
    /// Batches given to `rkv_router_apply_batch` (refused ones included).
    pub batches: u64,
    /// Sequence gaps seen.
    pub gaps: u64,
    /// Restarts seen (a batch `seq` below its worker's cursor).
    pub restarts: u64,
    /// Refusals of every reason: malformed payloads, unknown parents, unknown removed
    /// hashes (one per hash), unaligned or empty stores, workers beyond `max_workers`,
    /// batches refused for a gap.
    pub refused: u64,
}

/// A router index's counts and counters, versioned by `size` so that it can grow
/// (`rkv_router_stats_get_ex`; an extension of version 1): every field of
/// `rkv_router_stats`, then the counters added since. A plain value owned by the caller,
/// which sets `size` before the call; read as `rkv_router_stats`'s fields (each atomically,
/// not one snapshot under concurrent writers).
///
/// Versioned by `size`, as `rkv_kv_group`, but written rather than read: the caller sets
/// `size = sizeof(rkv_router_stats_ex)` of its header (88 in this one). A size below 88
/// (the first version's) is `RKV_INVALID_ARGUMENT`, nothing written; any larger one (a
/// caller built against a later header) gets this library's fields, and `size` set to 88,
/// the bytes written (the rest of the caller's struct is left as it was). A later library
/// that appends fields will still fill a struct of this size, without them.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct rkv_router_stats_ex {
    /// Set by the caller to `sizeof(rkv_router_stats_ex)`; set by the call to the bytes it
    /// wrote (88).
    pub size: u32,
    /// Written as 0 (reserved for a later version).
    pub reserved: u32,
    /// As `rkv_router_stats.workers`.
    pub workers: u64,
    /// As `rkv_router_stats.blocks`.
    pub blocks: u64,
    /// As `rkv_router_stats.memberships`.
    pub memberships: u64,
    /// As `rkv_router_stats.bytes`.
    pub bytes: u64,
    /// As `rkv_router_stats.events` (skipped events of other groups included).
    pub events: u64,
    /// As `rkv_router_stats.batches`.
    pub batches: u64,
    /// As `rkv_router_stats.gaps`.
    pub gaps: u64,
    /// As `rkv_router_stats.restarts`.
    pub restarts: u64,
    /// As `rkv_router_stats.refused`.
    pub refused: u64,
    /// Events of `rkv_router_apply_batch` skipped for their KV cache group, not refused: a
    /// store of a kind other than main attention (sliding window, Mamba, an unknown kind),
    /// a removal of a group a worker's stores taught is of such a kind, or of a group other
    /// than 0 none of its stores named (Dynamo's rule; they change nothing).
    pub other_groups: u64,
}

// The layouts the header promises: no padding, so every byte a caller passes is a field.
const _: () = assert!(
    size_of::<rkv_router_options>() == 16
        && size_of::<rkv_worker>() == 16
        && size_of::<rkv_router_score>() == 24
        && std::mem::offset_of!(rkv_router_score, device_blocks) == 16
        && size_of::<rkv_router_stats>() == 72
        && size_of::<rkv_router_stats_ex>() == 88
        && std::mem::offset_of!(rkv_router_stats_ex, workers) == 8
        && std::mem::offset_of!(rkv_router_stats_ex, other_groups) == 80
);

/// A router index: an opaque object created by `rkv_router_new` (or `rkv_router_restore`)
/// and destroyed by `rkv_router_free`. Every function taking `const rkv_router *` is safe
/// to call from many threads at once (events of different workers apply in parallel, finds
/// take no lock); `rkv_router_free` must not run concurrently with any other call on it.
pub struct rkv_router {
    pub(crate) index: RouterIndex,
}
