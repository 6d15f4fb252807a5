//! The host memory tier's functions of the C ABI (`rkv_tier_*`), additive within version 1:
//! a two-level prefix cache (a [`radixkv_core::Cache`] built with host options, SGLang HiCache's semantics)
//! behind an opaque `rkv_tier` handle. Same conventions as the rest of `crates/ffi/src/`: a
//! literal `#[unsafe(no_mangle)] extern "C"` item per function, the panic boundary, a
//! numbered status, outputs only on `RKV_OK` (and the lengths on `RKV_BUFFER_TOO_SMALL`),
//! every pointer checked, a message for every failure.
//!
//! Locks are `rkv_lock` handles in the tier's own handle table (as a cache's), released
//! with `rkv_tier_release`. Load-back tickets are `u64`s the tier tracks itself, so an
//! unknown or already taken ticket is `RKV_INVALID_ARGUMENT`, and a result that did not fit
//! the caller's buffer is kept for the next call instead of being lost.
//!
//! An `rkv_cache` made by `rkv_cache_new_host` is the same core cache behind the plain
//! handle: `rkv_match_ex` and `rkv_cache_load_back` / `_load_poll` / `_load_wait` /
//! `rkv_cache_evict_host` run the code of `rkv_tier_match`, `rkv_tier_load_*` and
//! `rkv_tier_evict_host` on it (through a [`Door`]: a cache, its lock table, its load-backs),
//! so the `rkv_tier_*` functions are thin wrappers over one path.
//!
//! Copies go through a copier chosen in `rkv_tier_options`: none (index only), two host
//! stores the tier allocates (`rkv_tier_kv_ptr` exposes them), or the caller's callbacks
//! (`rkv_copier`), wrapped here as a [`TierCopier`].

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex};

use crate::events::{drain_into, event_options};
use crate::handles::{LockTable, Reserved};
use crate::{
    Res, boundary, cache_options, check_opt_in, check_out, check_out_array, fail, input,
    insert_options, more_than_pool, policy_of, read_sized, rkv_event, rkv_events_drain_info,
    rkv_events_options, rkv_insert_options, rkv_lock, rkv_options, rkv_stats, rkv_status,
    rkv_status_value, slot_refusal, st, to_c_stats, too_small_slots, valid_policies, write_array,
};
use radixkv_core::error::{Error, Result};
use radixkv_core::kv::{HostKvStorage, KvLayout, KvStorage};
use radixkv_core::tier::{
    CopyTicket, HostCopier, LoadOutcome, LoadTicket, Loaded, NullCopier, TierCopier, TierOptions,
    TierStats, WritePolicy,
};
use radixkv_core::tree::{InsertOptions, PrefixLock};
use radixkv_core::{Cache, PrefixMatch};

// The tier's functions, by noun (cbindgen reads them in this order).
mod copier;
use copier::CallbackCopier;
mod life;
pub use life::*;
mod lookup;
pub use lookup::*;
mod insert;
pub use insert::*;
mod load;
pub use load::*;
mod stats;
pub use stats::*;
mod events;
pub use events::*;
mod host_cache;
pub use host_cache::*;

/// When a page gets its host copy (the `write_policy` field of `rkv_tier_options`, a
/// `uint32_t`: other values are `RKV_INVALID_ARGUMENT`). A plain value. SGLang's
/// `--hicache-write-policy`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_write_policy {
    /// `write_through`: on its first insert.
    RKV_WRITE_THROUGH = 0,
    /// `write_through_selective` (the default): once inserts reached it
    /// `rkv_tier_options.write_threshold` times.
    RKV_WRITE_THROUGH_SELECTIVE = 1,
    /// `write_back`: only when the device evicts it (the eviction waits for the copy).
    RKV_WRITE_BACK = 2,
}

/// What copies the KV bytes between the device and the host pools (the `copier` field of
/// `rkv_tier_options`, a `uint32_t`: other values are `RKV_INVALID_ARGUMENT`). A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_copier_kind {
    /// No KV bytes at all: the index alone (a replay measuring hit ratios and copy
    /// volumes); every copy is done at once. The default.
    RKV_COPIER_NONE = 0,
    /// Two host-memory stores the tier allocates from the layout in `rkv_tier_options`
    /// (`num_layers`, `num_kv_heads`, `head_dim`, `elem_bytes`): the "device" side with
    /// `rkv_options.pool_slots` slots, the host side with `host_slots`; copies are memcpy,
    /// done when they start. `rkv_tier_kv_ptr` gives their K/V base pointers.
    RKV_COPIER_HOST = 1,
    /// The caller's callbacks (`rkv_tier_options.callbacks`): an engine that owns its GPU
    /// and host KV pools copies itself.
    RKV_COPIER_CALLBACK = 2,
}

/// `rkv_tier_options.host_policy` meaning "the device cache's eviction policy" (the
/// default); any other value must be an `rkv_eviction_policy`.
pub const RKV_HOST_POLICY_SAME_AS_DEVICE: u32 = 0xFFFF_FFFF;

/// Which store `rkv_tier_kv_ptr` names (a `uint32_t`). A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_tier_side {
    /// The device-side store (slots of the device pool, `rkv_options.pool_slots`).
    RKV_SIDE_DEVICE = 0,
    /// The host-side store (`rkv_tier_options.host_slots` slots).
    RKV_SIDE_HOST = 1,
}

/// A caller-supplied copier (`RKV_COPIER_CALLBACK`): four functions and their `user_data`.
/// Slot `i` of either side is token slot `i` of that side's pool; each copy moves
/// `src[i] -> dst[i]` for every `i < n`, in every layer, K and V.
///
/// - `to_host(user_data, dev, host, n, out_ticket)` starts copying device slots `dev[i]` to
///   host slots `host[i]`; `to_device(user_data, host, dev, n, out_ticket)` the other way.
///   Both write a ticket of the caller's choosing to `*out_ticket` and return `RKV_OK`,
///   or return any other status when the copy cannot start. The arrays are valid only
///   during the call (copy what you keep). Until the copy completes, the tier keeps the
///   source slots from being reused and the destination slots from being read.
/// - `poll(user_data, ticket, out_done)`: `RKV_OK` with `*out_done = 1` once the copy is
///   complete, `*out_done = 0` while it runs; another status if it failed. After
///   `*out_done = 1` or a failure the ticket is spent and never passed again.
/// - `wait(user_data, ticket)`: blocks until the copy completes; `RKV_OK`, or another
///   status if it failed. Spends the ticket.
///
/// A status other than `RKV_OK` from any of them is a copy failure: the tier rolls the copy
/// back (nothing is inserted, host copies are dropped, counted in `copy_failures`) and the
/// call that saw it returns `RKV_DEVICE_ERROR` where it reports one (`rkv_tier_load_wait`,
/// `rkv_tier_load_back`). All four are required (non-NULL). They may be called from any
/// thread that calls into the tier, concurrently (so they must be thread-safe), and from
/// `rkv_tier_free` (so they and `user_data` must stay valid until it returns). They must
/// return normally (no longjmp, no C++ exception) and must not call into the same tier.
/// The struct is a plain value, copied by `rkv_tier_new`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rkv_copier {
    /// Passed to every callback as is.
    pub user_data: *mut c_void,
    /// Starts a device → host copy.
    pub to_host: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            dev_slots: *const u32,
            host_slots: *const u32,
            n: usize,
            out_ticket: *mut u64,
        ) -> rkv_status_value,
    >,
    /// Starts a host → device copy.
    pub to_device: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            host_slots: *const u32,
            dev_slots: *const u32,
            n: usize,
            out_ticket: *mut u64,
        ) -> rkv_status_value,
    >,
    /// Whether a copy is complete.
    pub poll: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            ticket: u64,
            out_done: *mut c_int,
        ) -> rkv_status_value,
    >,
    /// Waits for a copy.
    pub wait: Option<unsafe extern "C" fn(user_data: *mut c_void, ticket: u64) -> rkv_status_value>,
}

/// Options of a host tier, for `rkv_tier_new`. Get the defaults from
/// `rkv_tier_options_default()` and change fields (`host_slots` at least: its default 0 is
/// refused). A plain value: the caller owns it, and `rkv_tier_new` only reads it.
///
/// Versioned by `size`, as `rkv_policy_options`: it must be `sizeof(rkv_tier_options)` of
/// this header, which `rkv_tier_options_default()` sets; any other value is
/// `RKV_INVALID_ARGUMENT`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rkv_tier_options {
    /// `sizeof(rkv_tier_options)`.
    pub size: u32,
    /// An `rkv_copier_kind` (default `RKV_COPIER_NONE`).
    pub copier: u32,
    /// Host slots (tokens): a positive multiple of the page size, at most 2^32 - 1
    /// (default 0, which is refused: set it).
    pub host_slots: u64,
    /// An `rkv_write_policy` (default `RKV_WRITE_THROUGH_SELECTIVE`).
    pub write_policy: u32,
    /// `RKV_WRITE_THROUGH_SELECTIVE`: the hit count that triggers a backup, at least 1
    /// (default 2, SGLang's). Checked under every policy; `RKV_WRITE_THROUGH` uses 1.
    pub write_threshold: u32,
    /// Load-backs of fewer tokens than this are not done (`RKV_LOAD_TOO_SHORT`; default 1).
    pub load_back_min: u64,
    /// The host eviction order: an `rkv_eviction_policy`, or
    /// `RKV_HOST_POLICY_SAME_AS_DEVICE` (the default).
    pub host_policy: u32,
    /// `RKV_COPIER_HOST`'s layout: transformer layers (>= 1). Ignored by the other copiers.
    pub num_layers: u32,
    /// `RKV_COPIER_HOST`'s layout: KV heads per token (>= 1).
    pub num_kv_heads: u32,
    /// `RKV_COPIER_HOST`'s layout: elements per head (>= 1).
    pub head_dim: u32,
    /// `RKV_COPIER_HOST`'s layout: bytes per element (>= 1; 2 for fp16/bf16).
    pub elem_bytes: u32,
    /// Must be 0 (reserved; else `RKV_INVALID_ARGUMENT`).
    pub reserved: u32,
    /// `RKV_COPIER_CALLBACK`'s functions (all four required then; ignored otherwise).
    pub callbacks: rkv_copier,
}

// No padding: every byte a caller passes is a field (on 64-bit targets, where pointers are
// 8 bytes; elsewhere `size` still tells the struct apart).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(
    std::mem::size_of::<rkv_tier_options>() == 96
        && std::mem::offset_of!(rkv_tier_options, callbacks) == 56
        && std::mem::size_of::<rkv_copier>() == 40
);

/// Counts and counters of a tier (`rkv_tier_get_stats`), mirroring the core's `TierStats`.
/// A plain value owned by the caller. Exact at quiescence (no copy in flight, no other
/// call running); under concurrent calls each field is read atomically but not all at once.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rkv_tier_stats {
    /// The device cache's, as `rkv_cache_stats` gives them.
    pub device: rkv_stats,
    /// Host slots in the pool.
    pub host_slots: u64,
    /// Free host slots.
    pub host_free_slots: u64,
    /// Host slots holding a page's copy (or being written).
    pub host_backed_slots: u64,
    /// Host pages whose tokens are also on the device.
    pub host_resident_pages: u64,
    /// Host pages a load-back is copying.
    pub host_pinned_pages: u64,
    /// Host pages that host eviction could take now.
    pub host_evictable_pages: u64,
    /// Tokens matched on the device (every match and load-back).
    pub device_hit_tokens: u64,
    /// Tokens found on the host right after a device match (`host_hit_length`, summed).
    pub host_hit_tokens: u64,
    /// Tokens copied device → host (backups and write-backs).
    pub tokens_to_host: u64,
    /// Of those, tokens written back by a device eviction (`RKV_WRITE_BACK`).
    pub tokens_written_back: u64,
    /// Tokens copied host → device (load-backs).
    pub tokens_to_device: u64,
    /// Copies started device → host.
    pub copies_to_host: u64,
    /// Copies started host → device.
    pub copies_to_device: u64,
    /// Copies that failed (rolled back).
    pub copy_failures: u64,
    /// Load-backs that completed with pages loaded.
    pub load_backs: u64,
    /// Load-backs not done (too short, or nothing on the host).
    pub load_backs_skipped: u64,
    /// Host pages evicted.
    pub host_evicted_pages: u64,
    /// Copies in flight (backups and load-backs).
    pub in_flight: u64,
}

/// What a finished load-back did (`rkv_load_result.outcome`, a `uint32_t`). A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_load_outcome {
    /// Host pages were copied to the device and inserted.
    RKV_LOAD_LOADED = 0,
    /// Nothing on the host extends the device match (the lock covers the device match).
    RKV_LOAD_NOTHING_ON_HOST = 1,
    /// The host pages found were fewer than `load_back_min` tokens (not loaded).
    RKV_LOAD_TOO_SHORT = 2,
}

/// A finished load-back (`rkv_tier_load_poll`, `rkv_tier_load_wait`). A plain value; the
/// lock in it is the caller's, to release exactly once with `rkv_tier_release`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rkv_load_result {
    /// Pins the device prefix `tokens[0..len]`, the loaded pages included.
    pub lock: rkv_lock,
    /// Tokens the lock pins (`device_len + loaded`); their slots went to `out_slots`.
    pub len: usize,
    /// Tokens that were on the device before.
    pub device_len: usize,
    /// Tokens loaded from the host.
    pub loaded: usize,
    /// An `rkv_load_outcome`.
    pub outcome: u32,
    /// 0.
    pub reserved: u32,
}

/// A host tier: a device cache with its slot pool (pool mode) and a host slot pool behind
/// it, created by `rkv_tier_new` and destroyed by `rkv_tier_free`. Every function taking
/// `const rkv_tier *` is safe to call from many threads at once; `rkv_tier_free` and
/// `rkv_tier_events_enable` (which take `rkv_tier *`) must not run concurrently with any
/// other call on the same tier.
pub struct rkv_tier {
    /// A cache with a host tier (`Cache::with_host`): every `rkv_tier_*` call is that
    /// cache's own, as `rkv_cache_new_host`'s plain calls are.
    cache: Cache,
    locks: LockTable<PrefixLock>,
    /// The stores of `RKV_COPIER_HOST`.
    host: Option<Arc<HostCopier>>,
    /// The load-backs handed out and not yet taken.
    loads: Loads,
}

/// The load-backs a handle tracks (an `rkv_tier`'s, or a host-tier `rkv_cache`'s): so an
/// unknown or already taken ticket is refused, and a result that did not fit the caller's
/// buffer is kept for the next call.
#[derive(Default)]
pub(crate) struct Loads {
    /// Load-back tickets handed out and not yet taken.
    tickets: Mutex<HashSet<u64>>,
    /// Finished load-backs taken from the core whose slots did not fit the caller's buffer.
    parked: Mutex<HashMap<u64, Loaded>>,
}

impl Loads {
    /// For a handle being freed: waits for the load-backs never taken and releases their
    /// locks, and those of the results parked.
    pub(crate) fn finish(&self, cache: &Cache) {
        let tickets: Vec<u64> = lk(&self.tickets).drain().collect();
        for t in tickets {
            if let Ok(l) = cache.wait_load(LoadTicket(t)) {
                let _ = cache.release(l.lock);
            }
        }
        for (_, l) in lk(&self.parked).drain() {
            let _ = cache.release(l.lock);
        }
    }
}

/// What the tier's calls work on: a cache, its lock table and its load-backs, an
/// `rkv_tier`'s or a (host-tier) `rkv_cache`'s, so `rkv_tier_*` and the `rkv_cache` calls
/// they stand beside (`rkv_match_ex`, `rkv_cache_load_back`, ...) are one code path.
#[derive(Clone, Copy)]
pub(crate) struct Door<'a> {
    pub(crate) cache: &'a Cache,
    pub(crate) locks: &'a LockTable<PrefixLock>,
    loads: &'a Loads,
    /// What the handle is called in a message ("cache", "tier").
    noun: &'static str,
}

impl rkv_tier {
    fn door(&self) -> Door<'_> {
        Door { cache: &self.cache, locks: &self.locks, loads: &self.loads, noun: "tier" }
    }
}

impl crate::rkv_cache {
    pub(crate) fn door(&self) -> Door<'_> {
        Door { cache: &self.cache, locks: &self.locks, loads: &self.loads, noun: "cache" }
    }
}

fn lk<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section is one set or map operation: consistent after a panic.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------
// Helpers (not exported).

/// The tier behind `p`.
///
/// # Safety
/// `p` is NULL or was returned by `rkv_tier_new` and not yet freed, and no
/// `rkv_tier_free` of it runs during `'a`.
unsafe fn tier_ref<'a>(p: *const rkv_tier) -> Res<&'a rkv_tier> {
    if p.is_null() {
        return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "tier is NULL"));
    }
    if !p.is_aligned() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("tier = {p:p} is misaligned: not a pointer rkv_tier_new returned"),
        ));
    }
    // SAFETY: non-null and aligned; by the caller's contract it points to a live `rkv_tier`
    // made by `rkv_tier_new` (a `Box`) that nobody frees during 'a; only shared references
    // are made while it is published.
    Ok(unsafe { &*p })
}

/// Reserves a lock handle of the tier before anything changes.
fn reserve(t: &rkv_tier) -> Res<Reserved<'_, PrefixLock>> {
    reserve_in(t.door())
}

/// Reserves a lock handle of `d`'s table before anything changes.
fn reserve_in(d: Door<'_>) -> Res<Reserved<'_, PrefixLock>> {
    d.locks.reserve().ok_or_else(|| {
        fail(
            rkv_status::RKV_INTERNAL_ERROR,
            format!(
                "no lock handle is free: this {} holds {} live locks, the most it can \
                 (release some)",
                d.noun,
                crate::handles::MAX_LOCKS
            ),
        )
    })
}

/// The tier's statistics of a cache that has one (every `rkv_tier`'s does).
fn tier_stats(c: &Cache) -> TierStats {
    c.tier_stats().expect("an rkv_tier's cache has a tier")
}

/// The tier's invariant check of a cache that has one.
fn tier_check(c: &Cache) -> std::result::Result<(), String> {
    c.check_tier().expect("an rkv_tier's cache has a tier")
}

fn bad(m: String) -> crate::Fail {
    fail(rkv_status::RKV_INVALID_ARGUMENT, m)
}

fn c_outcome(o: LoadOutcome) -> rkv_load_outcome {
    match o {
        LoadOutcome::Loaded => rkv_load_outcome::RKV_LOAD_LOADED,
        LoadOutcome::NothingOnHost => rkv_load_outcome::RKV_LOAD_NOTHING_ON_HOST,
        LoadOutcome::TooShort => rkv_load_outcome::RKV_LOAD_TOO_SHORT,
    }
}
