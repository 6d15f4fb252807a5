//! The host memory tier's functions of the C ABI (`rkv_tier_*`), additive within version 1:
//! a two-level prefix cache ([`radixkv_core::tier::TieredCache`], SGLang HiCache's semantics)
//! behind an opaque `rkv_tier` handle. Same conventions as the rest of `src/ffi/`: a
//! literal `#[unsafe(no_mangle)] extern "C"` item per function, the panic boundary, a
//! numbered status, outputs only on `RKV_OK` (and the lengths on `RKV_BUFFER_TOO_SMALL`),
//! every pointer checked, a message for every failure.
//!
//! Locks are `rkv_lock` handles in the tier's own handle table (as a cache's), released
//! with `rkv_tier_release`. Load-back tickets are `u64`s the tier tracks itself, so an
//! unknown or already taken ticket is `RKV_INVALID_ARGUMENT`, and a result that did not fit
//! the caller's buffer is kept for the next call instead of being lost.
//!
//! Copies go through a copier chosen in `rkv_tier_options`: none (index only), two host
//! stores the tier allocates (`rkv_tier_kv_ptr` exposes them), or the caller's callbacks
//! (`rkv_copier`), wrapped here as a [`TierCopier`].

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex};

use super::events::{drain_into, event_options};
use super::handles::{LockTable, Reserved};
use super::{
    Res, boundary, cache_options, check_opt_in, check_out, check_out_array, fail, input,
    insert_options, more_than_pool, policy_of, read_sized, rkv_event, rkv_events_drain_info,
    rkv_events_options, rkv_insert_options, rkv_lock, rkv_options, rkv_stats, rkv_status,
    rkv_status_value, slot_refusal, st, to_c_stats, too_small_slots, valid_policies, write_array,
};
use radixkv_core::error::{Error, Result};
use radixkv_core::kv::{HostKvStorage, KvLayout, KvStorage};
use radixkv_core::tier::{
    CopyTicket, HostCopier, LoadOutcome, LoadTicket, Loaded, NullCopier, TierCopier, TierOptions,
    TieredCache, WritePolicy,
};
use radixkv_core::tree::{InsertOptions, PrefixLock};

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
    tier: TieredCache,
    locks: LockTable<PrefixLock>,
    /// The stores of `RKV_COPIER_HOST`.
    host: Option<Arc<HostCopier>>,
    /// Load-back tickets handed out and not yet taken.
    tickets: Mutex<HashSet<u64>>,
    /// Finished load-backs taken from the core whose slots did not fit the caller's buffer.
    parked: Mutex<HashMap<u64, Loaded>>,
}

fn lk<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section is one set or map operation: consistent after a panic.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------
// The callback copier.

/// `RKV_COPIER_CALLBACK`'s copier: calls the caller's functions; a status other than
/// `RKV_OK` is `Error::Device`.
struct CallbackCopier {
    c: rkv_copier,
}

// SAFETY: `rkv_copier`'s contract (in the header) makes the callbacks and `user_data`
// usable from any thread, concurrently, for the tier's lifetime.
unsafe impl Send for CallbackCopier {}
// SAFETY: as above.
unsafe impl Sync for CallbackCopier {}

fn callback_status(what: &str, s: rkv_status_value) -> Result<()> {
    if s == rkv_status::RKV_OK as c_int {
        Ok(())
    } else {
        Err(Error::Device(format!("the copier's {what} callback returned status {s}")))
    }
}

fn same_len(a: &[u32], b: &[u32]) -> Result<()> {
    if a.len() != b.len() {
        return Err(radixkv_core::Error::InvalidArgument(format!(
            "copy: {} source slots but {} destinations",
            a.len(),
            b.len()
        )));
    }
    Ok(())
}

impl TierCopier for CallbackCopier {
    fn to_host(&self, dev: &[u32], host: &[u32]) -> Result<CopyTicket> {
        same_len(dev, host)?;
        let f = self.c.to_host.expect("checked by rkv_tier_new");
        let mut t = 0u64;
        // SAFETY: `f` is the caller's `to_host`, callable with its `user_data` by the
        // contract of `rkv_copier`; the arrays are live for `n` values during the call and
        // `t` is a writable u64.
        let s = unsafe { f(self.c.user_data, dev.as_ptr(), host.as_ptr(), dev.len(), &mut t) };
        callback_status("to_host", s).map(|()| t)
    }

    fn to_device(&self, host: &[u32], dev: &[u32]) -> Result<CopyTicket> {
        same_len(host, dev)?;
        let f = self.c.to_device.expect("checked by rkv_tier_new");
        let mut t = 0u64;
        // SAFETY: as in `to_host`.
        let s = unsafe { f(self.c.user_data, host.as_ptr(), dev.as_ptr(), host.len(), &mut t) };
        callback_status("to_device", s).map(|()| t)
    }

    fn poll(&self, t: CopyTicket) -> Result<bool> {
        let f = self.c.poll.expect("checked by rkv_tier_new");
        let mut done: c_int = 0;
        // SAFETY: the caller's `poll`, by `rkv_copier`'s contract; `done` is writable.
        let s = unsafe { f(self.c.user_data, t, &mut done) };
        callback_status("poll", s).map(|()| done != 0)
    }

    fn wait(&self, t: CopyTicket) -> Result<()> {
        let f = self.c.wait.expect("checked by rkv_tier_new");
        // SAFETY: the caller's `wait`, by `rkv_copier`'s contract.
        let s = unsafe { f(self.c.user_data, t) };
        callback_status("wait", s)
    }
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

/// Reserves a lock handle before anything changes.
fn reserve(t: &rkv_tier) -> Res<Reserved<'_, PrefixLock>> {
    t.locks.reserve().ok_or_else(|| {
        fail(
            rkv_status::RKV_INTERNAL_ERROR,
            format!(
                "no lock handle is free: this tier holds {} live locks, the most it can \
                 (release some)",
                super::handles::MAX_LOCKS
            ),
        )
    })
}

fn bad(m: String) -> super::Fail {
    fail(rkv_status::RKV_INVALID_ARGUMENT, m)
}

fn c_outcome(o: LoadOutcome) -> rkv_load_outcome {
    match o {
        LoadOutcome::Loaded => rkv_load_outcome::RKV_LOAD_LOADED,
        LoadOutcome::NothingOnHost => rkv_load_outcome::RKV_LOAD_NOTHING_ON_HOST,
        LoadOutcome::TooShort => rkv_load_outcome::RKV_LOAD_TOO_SHORT,
    }
}

// ---------------------------------------------------------------------------------------
// Lifecycle.

/// Default tier options: `size = sizeof(rkv_tier_options)`, `RKV_COPIER_NONE`, host_slots 0
/// (set it), `RKV_WRITE_THROUGH_SELECTIVE` with write_threshold 2, load_back_min 1,
/// `RKV_HOST_POLICY_SAME_AS_DEVICE`, the layout fields 0, the callbacks NULL. Returns a plain
/// value. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_tier_options_default() -> rkv_tier_options {
    let d = TierOptions::default();
    rkv_tier_options {
        size: size_of::<rkv_tier_options>() as u32,
        copier: rkv_copier_kind::RKV_COPIER_NONE as u32,
        host_slots: d.host_slots as u64,
        write_policy: rkv_write_policy::RKV_WRITE_THROUGH_SELECTIVE as u32,
        write_threshold: d.write_threshold,
        load_back_min: d.load_back_min as u64,
        host_policy: RKV_HOST_POLICY_SAME_AS_DEVICE,
        num_layers: 0,
        num_kv_heads: 0,
        head_dim: 0,
        elem_bytes: 0,
        reserved: 0,
        callbacks: rkv_copier {
            user_data: std::ptr::null_mut(),
            to_host: None,
            to_device: None,
            poll: None,
            wait: None,
        },
    }
}

/// Creates a host tier (an extension of version 1): a device cache from `*opts` (required;
/// as `rkv_cache_new` reads it, and it must have a pool: `pool_slots > 0`) and a host tier
/// from `*tier_opts` (required); both are read only during the call. Writes it to
/// `*out_tier` (required); the caller owns it and frees it with `rkv_tier_free`.
/// `RKV_INVALID_ARGUMENT` (nothing created) for every option `rkv_cache_new` refuses, no
/// pool, `tier_opts->size` other than `sizeof(rkv_tier_options)`, a host_slots that is not a
/// positive multiple of the page size below 2^32, an unknown write_policy, copier or
/// host_policy, write_threshold 0, reserved not 0, or a bad layout for `RKV_COPIER_HOST`;
/// `RKV_NULL_ARGUMENT` for an `RKV_COPIER_CALLBACK` with a NULL callback;
/// `RKV_DEVICE_ERROR` when `RKV_COPIER_HOST`'s memory cannot be had. Thread-safe.
///
/// # Safety
/// `opts` NULL or a readable `rkv_options`; `tier_opts` NULL or a readable
/// `rkv_tier_options`; `out_tier` NULL or a writable `rkv_tier *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_new(
    opts: *const rkv_options,
    tier_opts: *const rkv_tier_options,
    out_tier: *mut *mut rkv_tier,
) -> rkv_status {
    boundary("rkv_tier_new", || {
        if opts.is_null() {
            return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "opts is NULL"));
        }
        if tier_opts.is_null() {
            return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "tier_opts is NULL"));
        }
        check_out(out_tier, "out_tier")?;
        check_opt_in(tier_opts, "tier_opts")?;
        // SAFETY: the caller passes a readable `rkv_options`; NULL policy is the default.
        let dev = unsafe { cache_options(opts, std::ptr::null()) }?;
        // SAFETY: non-null and aligned (checked above); readable by the caller's contract.
        let o = unsafe { read_sized(tier_opts, "tier_opts", "rkv_tier_options") }?;
        if dev.pool_slots == 0 {
            return Err(bad(
                "opts->pool_slots = 0: a host tier needs the device pool (pool_slots > 0)".into(),
            ));
        }
        if o.reserved != 0 {
            return Err(bad(format!("tier_opts->reserved = {} must be 0", o.reserved)));
        }
        let write_policy = match o.write_policy {
            0 => WritePolicy::WriteThrough,
            1 => WritePolicy::WriteThroughSelective,
            2 => WritePolicy::WriteBack,
            w => {
                return Err(bad(format!(
                    "tier_opts->write_policy = {w} is not an rkv_write_policy (0 = \
                     RKV_WRITE_THROUGH, 1 = RKV_WRITE_THROUGH_SELECTIVE, 2 = RKV_WRITE_BACK)"
                )));
            }
        };
        let host_policy = match o.host_policy {
            RKV_HOST_POLICY_SAME_AS_DEVICE => None,
            n => Some(policy_of(n).ok_or_else(|| {
                bad(format!(
                    "tier_opts->host_policy = {n} is neither RKV_HOST_POLICY_SAME_AS_DEVICE \
                     nor an rkv_eviction_policy ({})",
                    valid_policies()
                ))
            })?),
        };
        let p = dev.page_size as u64;
        if o.host_slots == 0 || o.host_slots % p != 0 || o.host_slots > u64::from(u32::MAX) {
            return Err(bad(format!(
                "tier_opts->host_slots = {} must be a positive multiple of the page size {p}, \
                 below 2^32",
                o.host_slots
            )));
        }
        if o.write_threshold == 0 {
            return Err(bad("tier_opts->write_threshold = 0: it must be at least 1".into()));
        }
        let host_slots = o.host_slots as usize;
        let load_back_min = usize::try_from(o.load_back_min).unwrap_or(usize::MAX);
        let topts = TierOptions {
            host_slots,
            write_policy,
            write_threshold: o.write_threshold,
            load_back_min,
            host_policy,
        };
        let mut host = None;
        let copier: Arc<dyn TierCopier> = match o.copier {
            0 => Arc::new(NullCopier::default()),
            1 => {
                let l = |slots| {
                    KvLayout::new(
                        o.num_layers as usize,
                        slots,
                        o.num_kv_heads as usize,
                        o.head_dim as usize,
                        o.elem_bytes as usize,
                    )
                };
                let (ld, lh) = (l(dev.pool_slots), l(host_slots));
                for x in [ld, lh] {
                    x.validate().map_err(|e| bad(format!("tier_opts (RKV_COPIER_HOST): {e}")))?;
                }
                let d = HostKvStorage::new(ld).map_err(st)?;
                let h = HostKvStorage::new(lh).map_err(st)?;
                let c = Arc::new(HostCopier::new(Arc::new(d), Arc::new(h)));
                host = Some(c.clone());
                c
            }
            2 => {
                let cb = o.callbacks;
                let missing = [
                    ("to_host", cb.to_host.is_none()),
                    ("to_device", cb.to_device.is_none()),
                    ("poll", cb.poll.is_none()),
                    ("wait", cb.wait.is_none()),
                ];
                if let Some((name, _)) = missing.iter().find(|(_, m)| *m) {
                    return Err(fail(
                        rkv_status::RKV_NULL_ARGUMENT,
                        format!(
                            "tier_opts->callbacks.{name} is NULL (RKV_COPIER_CALLBACK needs all \
                             four callbacks)"
                        ),
                    ));
                }
                Arc::new(CallbackCopier { c: cb })
            }
            k => {
                return Err(bad(format!(
                    "tier_opts->copier = {k} is not an rkv_copier_kind (0 = RKV_COPIER_NONE, 1 \
                     = RKV_COPIER_HOST, 2 = RKV_COPIER_CALLBACK)"
                )));
            }
        };
        let tier = TieredCache::new(dev, topts, copier)
            .map_err(|e| fail(rkv_status::from(&e), format!("tier_opts: {e}")))?;
        let locks = LockTable::new().ok_or_else(|| {
            fail(
                rkv_status::RKV_INTERNAL_ERROR,
                "too many live caches and tiers: 2^20 - 1 exist in this process (free some)",
            )
        })?;
        let raw = Box::into_raw(Box::new(rkv_tier {
            tier,
            locks,
            host,
            tickets: Mutex::new(HashSet::new()),
            parked: Mutex::new(HashMap::new()),
        }));
        // SAFETY: `out_tier` passed `check_out` and is writable by the caller's contract.
        unsafe { out_tier.write(raw) };
        Ok(())
    })
}

/// Destroys a tier: waits for every copy in flight (a callback copier is called, so it must
/// still be valid), releases its outstanding locks and the results of load-backs never
/// taken (their handles and tickets become invalid), and frees everything it owns, the
/// `RKV_COPIER_HOST` stores included (pointers from `rkv_tier_kv_ptr` dangle afterwards).
/// NULL is a no-op. Must not run concurrently with any other call on the same tier, and
/// the tier must not be used afterwards. Leaves `rkv_last_error_message()` as it is.
///
/// # Safety
/// `tier` is NULL or was returned by `rkv_tier_new` and not freed yet, and no other call on
/// it runs concurrently or follows.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_free(tier: *mut rkv_tier) {
    if tier.is_null() || !tier.is_aligned() {
        return;
    }
    // SAFETY: `tier` came from `Box::into_raw` in `rkv_tier_new` and, by the caller's
    // contract, is freed once and used by no one else now, so we own it again.
    let mut owned = unsafe { Box::from_raw(tier) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        owned.tier.wait_all();
        let tickets: Vec<u64> = lk(&owned.tickets).drain().collect();
        for t in tickets {
            if let Ok(l) = owned.tier.wait_load(LoadTicket(t)) {
                let _ = owned.tier.release(l.lock);
            }
        }
        for (_, l) in lk(&owned.parked).drain() {
            let _ = owned.tier.release(l.lock);
        }
        for l in owned.locks.drain() {
            let _ = owned.tier.release(l);
        }
        drop(owned);
    }));
}

/// Writes the base addresses of layer `layer`'s K and V buffers of one store of an
/// `RKV_COPIER_HOST` tier to `*out_k` and `*out_v` (both required): `side` is an
/// `rkv_tier_side` (the device-side store, `pool_slots` slots, or the host-side one,
/// `host_slots` slots). Each buffer holds `num_slots * num_kv_heads * head_dim *
/// elem_bytes` bytes, slot `s` at offset `s * num_kv_heads * head_dim * elem_bytes`,
/// 256-byte aligned, zeroed at creation, valid until `rkv_tier_free`. The engine writes a
/// token's KV into its device slot before inserting it and reads loaded slots after a
/// load-back returns; the tier's copies run inside `rkv_tier_*` calls, so the caller orders
/// its own accesses against the calls that copy (inserts that back pages up, evictions under
/// `RKV_WRITE_BACK`, load-backs). `RKV_INVALID_ARGUMENT` for a tier with another copier, an
/// unknown side, or a layer out of range. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_k` and `out_v` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_kv_ptr(
    tier: *const rkv_tier,
    side: u32,
    layer: u32,
    out_k: *mut *mut c_void,
    out_v: *mut *mut c_void,
) -> rkv_status {
    boundary("rkv_tier_kv_ptr", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        check_out(out_k, "out_k")?;
        check_out(out_v, "out_v")?;
        let Some(h) = &t.host else {
            return Err(bad(
                "this tier has no KV stores of its own (only RKV_COPIER_HOST allocates them)"
                    .into(),
            ));
        };
        let store = match side {
            0 => h.device(),
            1 => h.host(),
            s => {
                return Err(bad(format!(
                    "side = {s} is not an rkv_tier_side (0 = RKV_SIDE_DEVICE, 1 = RKV_SIDE_HOST)"
                )));
            }
        };
        let layers = store.layout().num_layers;
        if layer as usize >= layers {
            return Err(bad(format!("layer = {layer} is out of range: the store has {layers}")));
        }
        let k = store.k_ptr(layer as usize).map_err(st)? as usize as *mut c_void;
        let v = store.v_ptr(layer as usize).map_err(st)? as usize as *mut c_void;
        // SAFETY: both passed `check_out`; writable by the caller's contract.
        unsafe {
            out_k.write(k);
            out_v.write(v);
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Match, locks.

/// Longest device prefix of `tokens[0..n_tokens]` in namespace `ns` and how far host
/// copies extend it (SGLang's `host_hit_length`), an extension of version 1: writes the
/// device match length to `*out_len` (required), its slots to `out_slots[0..*out_len]`, and
/// the host tokens right after it to `*out_host_len` (required). With `out_lock` non-NULL the device prefix is pinned
/// (exactly as `rkv_match_lock`) and the lock written there, the caller's to release with
/// `rkv_tier_release` exactly once (also for a match of 0 tokens); with NULL nothing is
/// pinned (an estimate under concurrency). Slots as `rkv_match`: `out_slots` may be NULL
/// when `out_cap == 0` (then only the lengths are produced, and with a lock only when the
/// match is empty); if the match does not fit `out_cap` the call returns
/// `RKV_BUFFER_TOO_SMALL` with only `*out_len` written, nothing pinned, nothing counted.
/// `out_cap = n_tokens` always suffices. Load the host part with `rkv_tier_load_back`.
/// Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `tokens[0..n_tokens]` readable (or NULL when 0);
/// `out_slots[0..out_cap]` writable (or NULL); `out_len`, `out_host_len`, `out_lock` NULL
/// or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_match(
    tier: *const rkv_tier,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
    out_host_len: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary("rkv_tier_match", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
        let tk = unsafe { input(tokens, n_tokens, "tokens", "n_tokens") }?;
        check_out_array(out_slots, out_cap, "out_slots", "out_cap")?;
        check_out(out_len, "out_len")?;
        check_out(out_host_len, "out_host_len")?;
        let pin = !out_lock.is_null();
        if pin {
            check_out(out_lock, "out_lock")?;
        }
        let mut slots = Vec::new();
        let too_small = |m: usize, why: &str| {
            // SAFETY: `out_len` passed `check_out`; writable by the caller's contract.
            unsafe { out_len.write(m) };
            Err(too_small_slots(out_cap, m, why))
        };
        if out_cap < tk.len() {
            // Measure first, so a refusal pins, splits and counts nothing.
            let m = t.tier.device().tree().match_unrecorded(ns, tk, &mut slots);
            if m > out_cap {
                return too_small(m, "; nothing was pinned (pass out_cap = n_tokens)");
            }
        }
        let handle = if pin { Some(reserve(t)?) } else { None };
        let (lock, m) = if pin {
            let (l, m) = t.tier.match_and_lock(ns, tk, &mut slots);
            (Some(l), m)
        } else {
            (None, t.tier.match_prefix(ns, tk, &mut slots))
        };
        if m.device_len > out_cap {
            if let Some(l) = lock {
                let _ = t.tier.release(l);
            }
            let why = "; a concurrent insert grew the match during the call; nothing was pinned";
            return too_small(m.device_len, why);
        }
        // SAFETY: `out_slots` passed `check_out_array` with `out_cap >= m.device_len`;
        // `tk` is not used after this; the single outputs passed `check_out`.
        unsafe {
            write_array(out_slots, &slots);
            out_len.write(m.device_len);
            out_host_len.write(m.host_len);
            if let (Some(h), Some(l)) = (handle, lock) {
                out_lock.write(h.fill(l));
            }
        }
        Ok(())
    })
}

/// Releases a lock of this tier (from `rkv_tier_match`, `rkv_tier_insert_lock_ex` or a
/// load-back's result): its pages are no longer pinned by it and the handle becomes
/// invalid. Twice, 0, unknown or another cache's or tier's handle: `RKV_INVALID_LOCK`,
/// nothing changed. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_release(tier: *const rkv_tier, lock: rkv_lock) -> rkv_status {
    boundary("rkv_tier_release", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        let l = t.locks.remove(lock).ok_or_else(|| {
            fail(rkv_status::RKV_INVALID_LOCK, format!("lock {lock:#x} {}", t.locks.explain(lock)))
        })?;
        t.tier.release(l).map_err(|e| fail(rkv_status::from(&e), format!("lock {lock:#x}: {e}")))
    })
}

/// Writes to `*out_len` (required) the number of tokens a lock of this tier pins.
/// `RKV_INVALID_LOCK` for an unknown, released or foreign handle. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_lock_len(
    tier: *const rkv_tier,
    lock: rkv_lock,
    out_len: *mut usize,
) -> rkv_status {
    boundary("rkv_tier_lock_len", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        check_out(out_len, "out_len")?;
        let n = t.locks.with(lock, |l| l.len()).ok_or_else(|| {
            fail(rkv_status::RKV_INVALID_LOCK, format!("lock {lock:#x} {}", t.locks.explain(lock)))
        })?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_len.write(n) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Slots, inserts, eviction.

/// Allocates `n_slots` device slots into `out_slots[0..n_slots]` (NULL allowed when 0), all
/// or nothing, as `rkv_alloc` (evicting when free slots are short: such evictions go through
/// the host tier, so under `RKV_WRITE_BACK` they copy pages to the host first). `n_slots`
/// must be a multiple of the page size. `RKV_OUT_OF_SLOTS` (nothing changed) when even
/// evicting cannot find them. The caller owns the slots until it inserts them or frees them
/// with `rkv_tier_free_slots`. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_slots` NULL or writable for `n_slots` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_alloc(
    tier: *const rkv_tier,
    n_slots: usize,
    out_slots: *mut u32,
) -> rkv_status {
    boundary("rkv_tier_alloc", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        if n_slots > 0 && out_slots.is_null() {
            return Err(fail(
                rkv_status::RKV_NULL_ARGUMENT,
                format!("out_slots is NULL but n_slots = {n_slots} (NULL is allowed only with 0)"),
            ));
        }
        let pool_slots = t.tier.device().options().pool_slots;
        if n_slots > pool_slots {
            return Err(more_than_pool(n_slots, pool_slots));
        }
        check_out_array(out_slots, n_slots, "out_slots", "n_slots")?;
        let p = t.tier.page_size();
        if !n_slots.is_multiple_of(p) {
            return Err(bad(format!(
                "n_slots = {n_slots} is not a multiple of the page size {p} (slots come in \
                 whole pages)"
            )));
        }
        let mut v = Vec::new();
        t.tier.alloc(n_slots, &mut v).map_err(st)?;
        // SAFETY: passed `check_out_array` with cap `n_slots == v.len()`.
        unsafe { write_array(out_slots, &v) };
        Ok(())
    })
}

/// Returns device slots `slots[0..n_slots]` (allocated with `rkv_tier_alloc`, never
/// inserted) to the pool, as `rkv_free`: a free or cached slot is `RKV_DOUBLE_FREE`, one
/// outside the pool `RKV_INVALID_ARGUMENT`; either refuses the whole call. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `slots` NULL or readable for `n_slots` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_free_slots(
    tier: *const rkv_tier,
    slots: *const u32,
    n_slots: usize,
) -> rkv_status {
    boundary("rkv_tier_free_slots", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        // SAFETY: the caller guarantees slots[0..n_slots] is readable (or NULL).
        let s = unsafe { input(slots, n_slots, "slots", "n_slots") }?;
        t.tier.free(s).map_err(|e| slot_refusal(e, &("slots", s), t.tier.device().pool()))
    })
}

/// The shared body of the inserts.
///
/// # Safety
/// As `rkv_tier_insert_lock_ex`, `out_lock` NULL meaning "no lock".
#[allow(clippy::too_many_arguments)]
unsafe fn insert_body(
    tier: *const rkv_tier,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
    out_lock: Option<*mut rkv_lock>,
) -> Res<()> {
    // SAFETY: the caller passes NULL or a live tier that is not being freed.
    let t = unsafe { tier_ref(tier) }?;
    // SAFETY: the caller guarantees both arrays are readable for n_tokens (or NULL).
    let (tk, sl) = unsafe {
        (
            input(tokens, n_tokens, "tokens", "n_tokens")?,
            input(slots, n_tokens, "slots", "n_tokens")?,
        )
    };
    check_opt_in(opts, "opts")?;
    check_out(out_existing, "out_existing")?;
    if let Some(l) = out_lock {
        check_out(l, "out_lock")?;
    }
    // SAFETY: NULL or aligned (checked); readable by the caller's contract.
    let io: InsertOptions = unsafe { insert_options(opts) }?;
    let refuse = |e| slot_refusal(e, &("slots", sl), t.tier.device().pool());
    match out_lock {
        None => {
            let existing = t.tier.insert_with(ns, tk, sl, io).map_err(refuse)?;
            // SAFETY: passed `check_out`; writable by the caller's contract.
            unsafe { out_existing.write(existing) };
        }
        Some(out) => {
            let h = reserve(t)?;
            let (existing, lock) = t.tier.insert_and_lock(ns, tk, sl, io).map_err(refuse)?;
            // SAFETY: both passed `check_out`; writable by the caller's contract.
            unsafe {
                out_existing.write(existing);
                out.write(h.fill(lock));
            }
        }
    }
    Ok(())
}

/// Inserts `tokens[0..n_tokens]` with their device `slots[0..n_tokens]` in namespace `ns`
/// (cut to whole pages), as `rkv_insert` in pool mode (slots of a page must be one whole
/// pool page, allocated with `rkv_tier_alloc`; the slots not adopted go back to the pool),
/// then backs the pages up as the write policy says: the copy starts now and, until it
/// completes (`rkv_tier_poll`), keeps those pages pinned on the device. Writes the tokens
/// that were cached already to `*out_existing` (required). Refusals as `rkv_insert`
/// (nothing changed). Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `tokens`, `slots` NULL or readable for `n_tokens` values;
/// `out_existing` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_insert(
    tier: *const rkv_tier,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    out_existing: *mut usize,
) -> rkv_status {
    boundary("rkv_tier_insert", || {
        let none = std::ptr::null();
        // SAFETY: the caller's contract is `insert_body`'s, with no options and no lock.
        unsafe { insert_body(tier, ns, tokens, slots, n_tokens, none, out_existing, None) }
    })
}

/// `rkv_tier_insert` with per-insert options (`opts`, NULL for the defaults; as
/// `rkv_insert_ex`). Thread-safe.
///
/// # Safety
/// As `rkv_tier_insert`; `opts` NULL or a readable `rkv_insert_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_insert_ex(
    tier: *const rkv_tier,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
) -> rkv_status {
    boundary("rkv_tier_insert_ex", || {
        // SAFETY: the caller's contract is `insert_body`'s, with no lock.
        unsafe { insert_body(tier, ns, tokens, slots, n_tokens, opts, out_existing, None) }
    })
}

/// `rkv_tier_insert_ex` that also pins the inserted prefix (whole pages) for the caller:
/// the lock goes to `*out_lock` (required), to release with `rkv_tier_release` exactly
/// once. Thread-safe.
///
/// # Safety
/// As `rkv_tier_insert_ex`; `out_lock` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_insert_lock_ex(
    tier: *const rkv_tier,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary("rkv_tier_insert_lock_ex", || {
        if out_lock.is_null() {
            return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "out_lock is NULL"));
        }
        // SAFETY: the caller's contract is `insert_body`'s.
        unsafe {
            insert_body(tier, ns, tokens, slots, n_tokens, opts, out_existing, Some(out_lock))
        }
    })
}

/// Evicts at least `n_tokens` device tokens (unpinned leaves, by the device policy) and
/// writes the count freed to `*out_evicted` (required). The slots go back to the device
/// pool; pages with a host copy stay on the host (host-only), and under `RKV_WRITE_BACK` a
/// page without one is copied to the host first. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_evicted` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_evict(
    tier: *const rkv_tier,
    n_tokens: usize,
    out_evicted: *mut usize,
) -> rkv_status {
    boundary("rkv_tier_evict", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        check_out(out_evicted, "out_evicted")?;
        let n = t.tier.evict(n_tokens).map_err(st)?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_evicted.write(n) };
        Ok(())
    })
}

/// Evicts at least `n_tokens` host tokens (host-only leaves, by the host policy; never a
/// page being copied, pinned by a load-back, or still on the device) and writes the host
/// tokens freed to `*out_evicted` (required; fewer when nothing more is evictable).
/// Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_evicted` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_evict_host(
    tier: *const rkv_tier,
    n_tokens: usize,
    out_evicted: *mut usize,
) -> rkv_status {
    boundary("rkv_tier_evict_host", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        check_out(out_evicted, "out_evicted")?;
        let n = t.tier.evict_host(n_tokens);
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_evicted.write(n) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Load-back.

/// Starts loading back the host pages that extend the device match of
/// `tokens[0..n_tokens]` in `ns`, at most `max_tokens` of them (`SIZE_MAX`: all): allocates
/// device slots (evicting as `rkv_tier_alloc`), pins the host copies and starts the copy.
/// Writes a ticket to `*out_ticket` (required); take the result with `rkv_tier_load_poll`
/// or `rkv_tier_load_wait` (exactly once: the result holds a lock; `rkv_tier_free` releases
/// results never taken). When nothing is worth loading the ticket is done at once and its
/// result says why (`RKV_LOAD_NOTHING_ON_HOST`, `RKV_LOAD_TOO_SHORT`), with a lock over the
/// device match alone. `RKV_OUT_OF_SLOTS` (nothing changed, no ticket) when the device
/// cannot hold the pages; `RKV_DEVICE_ERROR` (everything rolled back, no ticket) when the
/// copier refuses to start the copy. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `tokens` NULL or readable for `n_tokens` values; `out_ticket`
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_load_back(
    tier: *const rkv_tier,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    max_tokens: usize,
    out_ticket: *mut u64,
) -> rkv_status {
    boundary("rkv_tier_load_back", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
        let tk = unsafe { input(tokens, n_tokens, "tokens", "n_tokens") }?;
        check_out(out_ticket, "out_ticket")?;
        let ticket = t.tier.load_back(ns, tk, max_tokens).map_err(st)?;
        lk(&t.tickets).insert(ticket.0);
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_ticket.write(ticket.0) };
        Ok(())
    })
}

/// Hands a finished load-back to the caller: its lock into the table, its slots into the
/// buffer; parks it (for the next call) when the buffer is too small.
///
/// # Safety
/// `out_slots` passed `check_out_array(out_slots, out_cap)`, `out_result` and `out_len`
/// passed `check_out`, all writable.
#[allow(clippy::too_many_arguments)]
unsafe fn hand_over(
    t: &rkv_tier,
    ticket: u64,
    l: Loaded,
    handle: Reserved<'_, PrefixLock>,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
    out_result: *mut rkv_load_result,
) -> Res<()> {
    let n = l.slots.len();
    if n > out_cap {
        lk(&t.parked).insert(ticket, l);
        // SAFETY: `out_len` passed `check_out`; writable by the caller's contract.
        unsafe { out_len.write(n) };
        return Err(too_small_slots(
            out_cap,
            n,
            "; the result is kept: call again with a larger buffer (out_cap = n_tokens of the \
             load-back always suffices)",
        ));
    }
    lk(&t.tickets).remove(&ticket);
    let r = rkv_load_result {
        lock: 0,
        len: l.lock.len(),
        device_len: l.device_len,
        loaded: l.loaded,
        outcome: c_outcome(l.outcome) as u32,
        reserved: 0,
    };
    let slots = l.slots;
    let r = rkv_load_result { lock: handle.fill(l.lock), ..r };
    // SAFETY: the caller's contract; `out_cap >= n`.
    unsafe {
        write_array(out_slots, &slots);
        out_len.write(n);
        out_result.write(r);
    }
    Ok(())
}

/// The ticket's refusal when it is not outstanding.
fn unknown_ticket(ticket: u64) -> super::Fail {
    bad(format!(
        "load-back ticket {ticket} is unknown or its result was taken already (a result is \
         taken once)"
    ))
}

/// The common part of `rkv_tier_load_poll` and `rkv_tier_load_wait`: checks, then the
/// parked result if any, else `take` (the core's `try_load` or `wait_load`).
///
/// # Safety
/// `tier` NULL or live; the outputs NULL or writable (`out_slots` for `out_cap`).
#[allow(clippy::too_many_arguments)]
unsafe fn take_load(
    tier: *const rkv_tier,
    ticket: u64,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
    out_result: *mut rkv_load_result,
    out_done: Option<*mut c_int>,
    take: impl FnOnce(&TieredCache, LoadTicket) -> Option<Result<Loaded>>,
) -> Res<()> {
    // SAFETY: the caller passes NULL or a live tier that is not being freed.
    let t = unsafe { tier_ref(tier) }?;
    check_out_array(out_slots, out_cap, "out_slots", "out_cap")?;
    check_out(out_len, "out_len")?;
    check_out(out_result, "out_result")?;
    if let Some(d) = out_done {
        check_out(d, "out_done")?;
    }
    if !lk(&t.tickets).contains(&ticket) {
        return Err(unknown_ticket(ticket));
    }
    let handle = reserve(t)?;
    let parked = lk(&t.parked).remove(&ticket);
    let got = match parked {
        Some(l) => Some(Ok(l)),
        None => take(&t.tier, LoadTicket(ticket)),
    };
    match got {
        None => {
            if let Some(d) = out_done {
                // SAFETY: passed `check_out`; writable by the caller's contract.
                unsafe { d.write(0) };
            }
            Ok(())
        }
        Some(Err(e)) => {
            lk(&t.tickets).remove(&ticket);
            Err(fail(rkv_status::from(&e), format!("load-back ticket {ticket}: {e}")))
        }
        Some(Ok(l)) => {
            // SAFETY: the outputs passed their checks and are writable by contract.
            unsafe { hand_over(t, ticket, l, handle, out_slots, out_cap, out_len, out_result) }?;
            if let Some(d) = out_done {
                // SAFETY: passed `check_out`; writable by the caller's contract.
                unsafe { d.write(1) };
            }
            Ok(())
        }
    }
}

/// Whether load-back `ticket` is done, without blocking (finishing the copies that are):
/// `RKV_OK` with `*out_done = 0` while its copy runs (nothing else written), or with
/// `*out_done = 1` and the result: `*out_result` (its lock is the caller's), the slots of
/// the locked prefix in `out_slots[0..*out_len]`. If those do not fit `out_cap`,
/// `RKV_BUFFER_TOO_SMALL` with only `*out_len` written and the result kept for the next
/// call (`out_cap = n_tokens` of the load-back always suffices). A failed copy is
/// `RKV_DEVICE_ERROR`, everything rolled back and the ticket spent. An unknown or taken
/// ticket is `RKV_INVALID_ARGUMENT`. All outputs required (`out_slots` may be NULL when
/// `out_cap == 0`). Thread-safe (one caller takes a ticket's result).
///
/// # Safety
/// `tier` is NULL or live; `out_slots[0..out_cap]` writable (or NULL); the other outputs
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_load_poll(
    tier: *const rkv_tier,
    ticket: u64,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
    out_result: *mut rkv_load_result,
    out_done: *mut c_int,
) -> rkv_status {
    boundary("rkv_tier_load_poll", || {
        // SAFETY: the caller's contract is `take_load`'s.
        unsafe {
            take_load(
                tier,
                ticket,
                out_slots,
                out_cap,
                out_len,
                out_result,
                Some(out_done),
                |c, t| c.try_load(t),
            )
        }
    })
}

/// `rkv_tier_load_poll` that blocks until the load-back is done (no `out_done`): `RKV_OK`
/// with the result, `RKV_BUFFER_TOO_SMALL` (result kept), `RKV_DEVICE_ERROR` for a failed
/// copy (rolled back, ticket spent), `RKV_INVALID_ARGUMENT` for an unknown or taken ticket.
/// Thread-safe.
///
/// # Safety
/// As `rkv_tier_load_poll`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_load_wait(
    tier: *const rkv_tier,
    ticket: u64,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
    out_result: *mut rkv_load_result,
) -> rkv_status {
    boundary("rkv_tier_load_wait", || {
        // SAFETY: the caller's contract is `take_load`'s.
        unsafe {
            take_load(tier, ticket, out_slots, out_cap, out_len, out_result, None, |c, t| {
                Some(c.wait_load(t))
            })
        }
    })
}

// ---------------------------------------------------------------------------------------
// Progress, stats, invariants.

/// Finishes the copies that are done (backups commit their host copies and unpin their
/// device pages; load-backs insert their pages) and writes how many finished to
/// `*out_finished` (required). Every `rkv_tier_*` call does this too; an engine calls it
/// once per scheduler step. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_finished` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_poll(
    tier: *const rkv_tier,
    out_finished: *mut usize,
) -> rkv_status {
    boundary("rkv_tier_poll", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        check_out(out_finished, "out_finished")?;
        let n = t.tier.poll();
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_finished.write(n) };
        Ok(())
    })
}

/// Waits for every copy in flight and finishes it (failed copies are rolled back and
/// counted; a failed load-back's ticket then reports `RKV_DEVICE_ERROR`). Thread-safe.
///
/// # Safety
/// `tier` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_wait_all(tier: *const rkv_tier) -> rkv_status {
    boundary("rkv_tier_wait_all", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        t.tier.wait_all();
        Ok(())
    })
}

/// Writes the tier's counts and counters to `*out_stats` (required, owned by the caller).
/// Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_stats` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_get_stats(
    tier: *const rkv_tier,
    out_stats: *mut rkv_tier_stats,
) -> rkv_status {
    boundary("rkv_tier_get_stats", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        check_out(out_stats, "out_stats")?;
        let s = t.tier.stats();
        let c = rkv_tier_stats {
            device: to_c_stats(&s.device),
            host_slots: s.host_slots,
            host_free_slots: s.host_free_slots,
            host_backed_slots: s.host_backed_slots,
            host_resident_pages: s.host_resident_pages,
            host_pinned_pages: s.host_pinned_pages,
            host_evictable_pages: s.host_evictable_pages,
            device_hit_tokens: s.device_hit_tokens,
            host_hit_tokens: s.host_hit_tokens,
            tokens_to_host: s.tokens_to_host,
            tokens_written_back: s.tokens_written_back,
            tokens_to_device: s.tokens_to_device,
            copies_to_host: s.copies_to_host,
            copies_to_device: s.copies_to_device,
            copy_failures: s.copy_failures,
            load_backs: s.load_backs,
            load_backs_skipped: s.load_backs_skipped,
            host_evicted_pages: s.host_evicted_pages,
            in_flight: s.in_flight,
        };
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_stats.write(c) };
        Ok(())
    })
}

/// Checks the tier's invariants at quiescence (device `free + cached + held == pool_slots`,
/// host `free + backed == host_slots`, every host page owned once or free, every resident
/// host entry naming a cached device page of its identity, nothing still writing or
/// pinned): `RKV_OK` when they hold; `RKV_INVALID_ARGUMENT` while copies are in flight (call
/// `rkv_tier_wait_all` first); `RKV_INTERNAL_ERROR` for a violation (a bug). The message
/// (`rkv_last_error_message()`) says which. Call it with no other call on the tier running.
/// For tests and debugging: it walks the whole pool.
///
/// # Safety
/// `tier` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_check(tier: *const rkv_tier) -> rkv_status {
    boundary("rkv_tier_check", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        let in_flight = t.tier.stats().in_flight;
        if in_flight > 0 {
            return Err(bad(format!(
                "{in_flight} copies are in flight: call rkv_tier_wait_all first"
            )));
        }
        t.tier.check().map_err(|m| {
            fail(rkv_status::RKV_INTERNAL_ERROR, format!("invariant violated (a bug): {m}"))
        })
    })
}

// ---------------------------------------------------------------------------------------
// Events.

/// The refusal of a tier without events.
fn no_events() -> super::Fail {
    bad("events are not enabled on this tier (call rkv_tier_events_enable right after \
         rkv_tier_new)"
        .into())
}

/// Turns KV events on for the tier (as `rkv_events_enable` for a cache, `*opts` required):
/// device pages are published with `opts->medium`, host copies with `RKV_MEDIUM_CPU_PINNED`
/// (`BLOCK_STORED` when a copy becomes ready, `BLOCK_REMOVED` when host eviction drops it).
/// Only once, while the tier is empty (right after `rkv_tier_new`): `RKV_INVALID_ARGUMENT`
/// otherwise and for bad options. Take the events with `rkv_tier_events_flush` and
/// `rkv_tier_events_drain`. Not thread-safe: no other call on the tier may run concurrently
/// (hence `rkv_tier *`).
///
/// # Safety
/// `tier` is NULL or live and used by no other call meanwhile; `opts` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_events_enable(
    tier: *mut rkv_tier,
    opts: *const rkv_events_options,
) -> rkv_status {
    boundary("rkv_tier_events_enable", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        unsafe { tier_ref(tier) }?;
        // SAFETY: non-null, aligned, live (checked above) and, by the caller's contract,
        // used by nothing else during the call: the only reference.
        let t = unsafe { &mut *tier };
        // SAFETY: the caller passes NULL or a readable `rkv_events_options`.
        let eo = unsafe { event_options(opts) }?;
        let dev = t.tier.device();
        if dev.events().is_some() {
            return Err(bad("events are enabled on this tier already (enable them once)".into()));
        }
        let s = dev.stats();
        if s.tree.nodes != 0
            || dev.tree().namespace_count() != 0
            || t.tier.stats().host_backed_slots != 0
        {
            return Err(bad(format!(
                "the tier is not empty ({} tokens cached): enable events right after \
                 rkv_tier_new, before the first insert",
                s.tree.cached_tokens
            )));
        }
        t.tier.enable_events(eo).map_err(st)?;
        Ok(())
    })
}

/// Closes the tier's events recorded so far into one batch, as `rkv_events_flush`:
/// `*out_seq` (required) gets its number, or `RKV_EVENTS_NO_SEQ` when there were none.
/// `RKV_INVALID_ARGUMENT` for a tier without events. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_seq` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_events_flush(
    tier: *const rkv_tier,
    out_seq: *mut u64,
) -> rkv_status {
    boundary("rkv_tier_events_flush", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        check_out(out_seq, "out_seq")?;
        let s = t.tier.device().events().ok_or_else(no_events)?;
        let seq = s.flush().unwrap_or(super::RKV_EVENTS_NO_SEQ);
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_seq.write(seq) };
        Ok(())
    })
}

/// Drains the tier's closed event batches into the caller's buffers, exactly as
/// `rkv_events_drain` does for a cache (same buffers, same `*out_info`, same
/// `RKV_BUFFER_TOO_SMALL` protocol); `RKV_INVALID_ARGUMENT` for a tier without events.
/// Thread-safe.
///
/// # Safety
/// As `rkv_events_drain`, with `tier` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_events_drain(
    tier: *const rkv_tier,
    out_events: *mut rkv_event,
    events_cap: usize,
    out_hashes: *mut u64,
    hashes_cap: usize,
    out_tokens: *mut u32,
    tokens_cap: usize,
    out_strings: *mut c_char,
    strings_cap: usize,
    out_info: *mut rkv_events_drain_info,
) -> rkv_status {
    boundary("rkv_tier_events_drain", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        // SAFETY: the caller's contract for the buffers and `out_info` is `drain_into`'s.
        unsafe {
            drain_into(
                || t.tier.device().events().ok_or_else(no_events),
                out_events,
                events_cap,
                out_hashes,
                hashes_cap,
                out_tokens,
                tokens_cap,
                out_strings,
                strings_cap,
                out_info,
            )
        }
    })
}
