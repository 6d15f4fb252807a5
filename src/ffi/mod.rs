//! The C ABI (`include/radixkv.h`, contract in `C_ABI.md`, version 1).
//!
//! Every function here is a literal `#[unsafe(no_mangle)] extern "C"` item so cbindgen sees
//! it, and every body runs inside a panic boundary: a Rust panic comes out as
//! `RKV_INTERNAL_ERROR`, never as an unwind across the boundary. Outputs are written only on
//! `RKV_OK` (and `*out_len` on `RKV_BUFFER_TOO_SMALL`); every pointer is checked.
//!
//! Lock handles (`rkv_lock`) are `u64` values looked up in a per-cache sharded slab (see
//! `handles.rs`), so an unknown, released or foreign handle is `RKV_INVALID_LOCK`, never
//! undefined behavior.
//!
//! After a panic (a bug) the cache stays memory-safe and every call keeps its contract on
//! pointers and handles; whether the tree's content is still exactly the model's is not
//! promised (a panic in the middle of a tree operation may leave it partly done).
#![allow(non_camel_case_types)]

mod handles;

use std::ffi::{CStr, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::cache::{Cache, CacheOptions, CacheStats};
use crate::error::Error;
use crate::slot_run::SlotRun;
use crate::tree::{EvictionPolicy, PrefixLock};

use handles::{LockTable, Reserved};

/// ABI version of this header; `rkv_abi_version()` returns the same number of the library
/// actually loaded (compare the two to detect a mismatched library).
pub const RKV_ABI_VERSION: u32 = 1;

/// Status of a call. `RKV_OK` is 0; every other value is an error after which the call has
/// written no output (except `*out_len` on `RKV_BUFFER_TOO_SMALL`) and changed nothing.
/// A plain value: nothing to free, valid on any thread.
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
    /// The output buffer is smaller than the result; the required length is in `*out_len`.
    RKV_BUFFER_TOO_SMALL = 4,
    /// The pool is short even after evicting everything evictable.
    RKV_OUT_OF_SLOTS = 5,
    /// A pool call on a cache created with `pool_slots == 0`.
    RKV_NO_POOL = 6,
    /// A slot that is already free or held by the tree.
    RKV_DOUBLE_FREE = 7,
    /// KV storage / CUDA failure (not produced by this ABI's functions, which do not touch
    /// KV storage; reserved for the functions that will).
    RKV_DEVICE_ERROR = 8,
    /// A bug: a Rust panic caught at the boundary; or an internal limit, refused before
    /// anything changes: more than 16.7 million live locks on one cache, or more than
    /// 2^20 - 1 live caches in the process.
    RKV_INTERNAL_ERROR = 9,
}

/// How eviction orders evictable leaves (the `eviction_policy` field of `rkv_options`, a
/// `uint32_t`: values other than these are `RKV_INVALID_ARGUMENT`). A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_eviction_policy {
    /// Least recently accessed leaf first (the default).
    RKV_EVICT_LRU = 0,
    /// Oldest inserted leaf first, ignoring later accesses (an extension of version 1).
    RKV_EVICT_FIFO = 1,
}

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
/// `rkv_cache_free` must not run concurrently with any other call on the same cache.
pub struct rkv_cache {
    cache: Cache,
    locks: LockTable<PrefixLock>,
}

/// A lock handle: pins a matched prefix until `rkv_release`. 0 is never a valid lock. A
/// plain value, valid only with the cache that made it; a handle that is unknown, already
/// released or another cache's is refused with `RKV_INVALID_LOCK`.
pub type rkv_lock = u64;

/// Receives freed slots during `rkv_evict`: `slots[0..n_slots]` is valid only during the
/// call (copy what you keep). Called on the thread that called `rkv_evict`, possibly several
/// times per eviction; every freed slot is passed exactly once. It must return normally (no
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

// ---------------------------------------------------------------------------------------
// Helpers (not exported).

type Res<T> = Result<T, rkv_status>;

/// The panic boundary around every body: `Ok` is `RKV_OK`, a panic is `RKV_INTERNAL_ERROR`.
fn boundary(f: impl FnOnce() -> Res<()>) -> rkv_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => rkv_status::RKV_OK,
        Ok(Err(s)) => s,
        Err(_) => rkv_status::RKV_INTERNAL_ERROR,
    }
}

impl From<&Error> for rkv_status {
    fn from(e: &Error) -> Self {
        match e {
            Error::InvalidArgument(_) => rkv_status::RKV_INVALID_ARGUMENT,
            Error::InvalidLock => rkv_status::RKV_INVALID_LOCK,
            Error::OutOfSlots { .. } => rkv_status::RKV_OUT_OF_SLOTS,
            Error::NoPool => rkv_status::RKV_NO_POOL,
            Error::DoubleFree { .. } => rkv_status::RKV_DOUBLE_FREE,
            Error::Device(_) => rkv_status::RKV_DEVICE_ERROR,
        }
    }
}

fn st(e: Error) -> rkv_status {
    rkv_status::from(&e)
}

/// The cache behind `p`.
///
/// # Safety
/// `p` is NULL or was returned by `rkv_cache_new` and not yet freed, and no
/// `rkv_cache_free` of it runs during `'a`.
unsafe fn cache_ref<'a>(p: *const rkv_cache) -> Res<&'a rkv_cache> {
    if p.is_null() {
        return Err(rkv_status::RKV_NULL_ARGUMENT);
    }
    if !p.is_aligned() {
        return Err(rkv_status::RKV_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and aligned; by the caller's contract it points to a live
    // `rkv_cache` made by `rkv_cache_new` (a `Box`), which nobody frees during 'a. Only
    // shared references to it are ever made while it is published.
    Ok(unsafe { &*p })
}

/// An input array of `len` values; NULL is allowed when `len == 0`.
///
/// # Safety
/// When `len > 0` and `p` is non-NULL, `p[0..len]` is readable and not written during
/// `'a`.
unsafe fn input<'a, T>(p: *const T, len: usize) -> Res<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(rkv_status::RKV_NULL_ARGUMENT);
    }
    if !p.is_aligned() || len > isize::MAX as usize / size_of::<T>() {
        return Err(rkv_status::RKV_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, aligned, `len * size_of::<T>() <= isize::MAX`, and by the caller's
    // contract `p[0..len]` is initialized memory that nobody writes during 'a.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// An input array of `len` slot runs as `SlotRun`s; NULL is allowed when `len == 0`.
///
/// # Safety
/// As [`input`].
unsafe fn input_runs<'a>(p: *const rkv_slot_run, len: usize) -> Res<&'a [SlotRun]> {
    // SAFETY: `rkv_slot_run` has `SlotRun`'s layout (asserted above); the caller's contract
    // is `input`'s.
    unsafe { input(p.cast::<SlotRun>(), len) }
}

/// Checks an output array of capacity `cap`: NULL is allowed when `cap == 0`.
fn check_out_array<T>(p: *mut T, cap: usize) -> Res<()> {
    if cap == 0 {
        return Ok(());
    }
    if p.is_null() {
        return Err(rkv_status::RKV_NULL_ARGUMENT);
    }
    if !p.is_aligned() || cap > isize::MAX as usize / size_of::<T>() {
        return Err(rkv_status::RKV_INVALID_ARGUMENT);
    }
    Ok(())
}

/// Checks a required single output.
fn check_out<T>(p: *mut T) -> Res<()> {
    if p.is_null() {
        return Err(rkv_status::RKV_NULL_ARGUMENT);
    }
    if !p.is_aligned() {
        return Err(rkv_status::RKV_INVALID_ARGUMENT);
    }
    Ok(())
}

/// Writes `src` to `dst[0..src.len()]`.
///
/// # Safety
/// `dst` passed `check_out_array(dst, cap)` with `cap >= src.len()`, `dst[0..cap]` is
/// writable, and no Rust reference to that memory is used afterwards.
unsafe fn write_array<T: Copy>(dst: *mut T, src: &[T]) {
    if src.is_empty() {
        return;
    }
    // SAFETY: `src.len() <= cap`, so `dst[0..src.len()]` is in the caller's writable,
    // aligned buffer; `src` is our own Vec, which cannot overlap C's buffer.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
}

/// Sets aside the handle of a lock about to be taken, before anything changes: at the
/// capacity limit (16.7 million live locks per cache) the call fails with
/// `RKV_INTERNAL_ERROR` having changed nothing.
fn reserve_handle(c: &rkv_cache) -> Res<Reserved<'_, PrefixLock>> {
    c.locks.reserve().ok_or(rkv_status::RKV_INTERNAL_ERROR)
}

// ---------------------------------------------------------------------------------------
// Version and status.

static VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(s) => s,
        Err(_) => panic!("version string"),
    };

/// The crate version ("0.1.0"), a static NUL-terminated string the caller must not free.
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_version() -> *const c_char {
    VERSION.as_ptr()
}

/// The ABI version: 1 (same as `RKV_ABI_VERSION`). Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_abi_version() -> u32 {
    RKV_ABI_VERSION
}

/// A static NUL-terminated description of `status` ("RKV_OK: success", ...), never NULL;
/// a value outside the enum gives "unknown status". The caller must not free it.
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_status_str(status: rkv_status_value) -> *const c_char {
    let s: &'static CStr = match status {
        0 => c"RKV_OK: success",
        1 => c"RKV_NULL_ARGUMENT: a required pointer is NULL",
        2 => c"RKV_INVALID_ARGUMENT: invalid argument",
        3 => c"RKV_INVALID_LOCK: unknown, already released, or another cache's lock",
        4 => c"RKV_BUFFER_TOO_SMALL: output buffer too small (required length in *out_len)",
        5 => c"RKV_OUT_OF_SLOTS: pool short even after evicting all that is evictable",
        6 => c"RKV_NO_POOL: this cache has no slot pool",
        7 => c"RKV_DOUBLE_FREE: slot already free or held by the tree",
        8 => c"RKV_DEVICE_ERROR: KV storage / device failure",
        9 => c"RKV_INTERNAL_ERROR: internal error (a bug in radixkv)",
        _ => c"unknown status",
    };
    s.as_ptr()
}

// ---------------------------------------------------------------------------------------
// Lifecycle.

/// Default options: page_size 1, `RKV_EVICT_LRU`, pool_slots 0 (caller-managed slots).
/// Returns a plain value. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_options_default() -> rkv_options {
    rkv_options {
        page_size: 1,
        eviction_policy: rkv_eviction_policy::RKV_EVICT_LRU as u32,
        pool_slots: 0,
    }
}

/// Creates a cache from `*opts` (required; read only during the call) and writes it to
/// `*out_cache` (required). The caller owns the new cache and frees it with
/// `rkv_cache_free`. `RKV_INVALID_ARGUMENT` for page_size 0, an unknown eviction_policy, or
/// a pool size that is not a multiple of page_size or above 2^32. Thread-safe.
///
/// # Safety
/// `opts` is NULL or points to a readable `rkv_options`; `out_cache` is NULL or points to
/// a writable `rkv_cache *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_new(
    opts: *const rkv_options,
    out_cache: *mut *mut rkv_cache,
) -> rkv_status {
    boundary(|| {
        if opts.is_null() {
            return Err(rkv_status::RKV_NULL_ARGUMENT);
        }
        check_out(out_cache)?;
        if !opts.is_aligned() {
            return Err(rkv_status::RKV_INVALID_ARGUMENT);
        }
        // SAFETY: non-null and aligned; the caller guarantees it points to a readable
        // `rkv_options` (a plain-old-data struct: every bit pattern is valid).
        let o = unsafe { opts.read() };
        let policy = match o.eviction_policy {
            0 => EvictionPolicy::Lru,
            1 => EvictionPolicy::Fifo,
            _ => return Err(rkv_status::RKV_INVALID_ARGUMENT),
        };
        if o.page_size == 0 || o.pool_slots > 1 << 32 || o.pool_slots % u64::from(o.page_size) != 0
        {
            return Err(rkv_status::RKV_INVALID_ARGUMENT);
        }
        let pool_slots =
            usize::try_from(o.pool_slots).map_err(|_| rkv_status::RKV_INVALID_ARGUMENT)?;
        let cache =
            Cache::new(CacheOptions { page_size: o.page_size as usize, policy, pool_slots })
                .map_err(st)?;
        // `None` only with 2^20 - 1 caches live at once (see `handles`).
        let locks = LockTable::new().ok_or(rkv_status::RKV_INTERNAL_ERROR)?;
        let raw = Box::into_raw(Box::new(rkv_cache { cache, locks }));
        // SAFETY: `out_cache` passed `check_out` (non-null, aligned) and the caller
        // guarantees it is writable.
        unsafe { out_cache.write(raw) };
        Ok(())
    })
}

/// Destroys a cache: releases its outstanding locks (their handles become invalid) and
/// frees everything it owns. Slots it held are not reported (in caller-managed mode, evict
/// first with a callback if you need them back). NULL is a no-op. Must not run concurrently
/// with any other call on the same cache, and the cache must not be used afterwards.
///
/// # Safety
/// `cache` is NULL or was returned by `rkv_cache_new` and not freed yet, and no other call
/// on it runs concurrently or follows.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_free(cache: *mut rkv_cache) {
    if cache.is_null() || !cache.is_aligned() {
        return;
    }
    // SAFETY: `cache` came from `Box::into_raw` in `rkv_cache_new` and, by the caller's
    // contract, is freed once and used by no one else now, so we own it again.
    let mut owned = unsafe { Box::from_raw(cache) };
    // A panic here would abort at the boundary; contain it. The cache is dropped either way
    // (on a panic, during unwinding).
    let _ = catch_unwind(AssertUnwindSafe(move || {
        for lock in owned.locks.drain() {
            let _ = owned.cache.release(lock);
        }
        drop(owned);
    }));
}

// ---------------------------------------------------------------------------------------
// Match.

/// Longest cached prefix of `tokens[0..n_tokens]` in namespace `ns` (a plain match: it pins
/// nothing, so under concurrency it is only an estimate; admit requests with
/// `rkv_match_lock`). Writes the match length to `*out_len` (required) and its slots to
/// `out_slots[0..*out_len]`. `out_slots` may be NULL when `out_cap == 0`: then only
/// `*out_len` is produced and the status is `RKV_OK`. If `out_cap > 0` is smaller than the
/// match, returns `RKV_BUFFER_TOO_SMALL` with the match length in `*out_len` (nothing else
/// written). `tokens` may be NULL when `n_tokens == 0`. All arrays stay owned by the
/// caller. Thread-safe; lock-free.
///
/// # Safety
/// `cache` is NULL or live; `tokens[0..n_tokens]` readable (or NULL); `out_slots[0..out_cap]`
/// writable (or NULL); `out_len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_match(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
        let t = unsafe { input(tokens, n_tokens) }?;
        check_out_array(out_slots, out_cap)?;
        check_out(out_len)?;
        let mut slots = Vec::new();
        let m = c.cache.match_prefix(ns, t, &mut slots);
        debug_assert_eq!(m, slots.len());
        if out_cap > 0 && m > out_cap {
            // SAFETY: `out_len` passed `check_out`; the caller guarantees it is writable.
            unsafe { out_len.write(m) };
            return Err(rkv_status::RKV_BUFFER_TOO_SMALL);
        }
        if out_cap > 0 {
            // SAFETY: checked above with cap `out_cap >= m`; `t` is not used after this.
            unsafe { write_array(out_slots, &slots[..m]) };
        }
        // SAFETY: as above.
        unsafe { out_len.write(m) };
        Ok(())
    })
}

/// Match and pin atomically: like `rkv_match`, and the pages of the match stay cached with
/// the same slots until the lock written to `*out_lock` (required) is released with
/// `rkv_release` (or the cache is freed). `out_cap` must be >= the match (pass `n_tokens` to
/// be safe); `out_slots` may be NULL only when `out_cap == 0`. On `RKV_BUFFER_TOO_SMALL`
/// nothing is pinned, no edge is split, and only `*out_len` is written. Always yields a lock
/// on `RKV_OK`, also for a match of length 0; the caller owns it and must release it exactly
/// once. Thread-safe.
///
/// # Safety
/// As `rkv_match`; `out_lock` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_match_lock(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
        let t = unsafe { input(tokens, n_tokens) }?;
        check_out_array(out_slots, out_cap)?;
        check_out(out_len)?;
        check_out(out_lock)?;
        let mut slots = Vec::new();
        // A buffer that may be too small: measure first with a plain match, so a refusal
        // splits no edge (the locking match splits where the match ends).
        if out_cap < t.len() {
            let m = c.cache.tree().match_unrecorded(ns, t, &mut slots);
            if m > out_cap {
                // SAFETY: `out_len` passed `check_out`; the caller guarantees it is writable.
                unsafe { out_len.write(m) };
                return Err(rkv_status::RKV_BUFFER_TOO_SMALL);
            }
        }
        let handle = reserve_handle(c)?;
        let guard = c.cache.match_and_lock(ns, t, &mut slots);
        let m = slots.len();
        if m > out_cap {
            // Grown since the check (a racing insert): nothing stays pinned.
            drop(guard);
            // SAFETY: `out_len` passed `check_out`; the caller guarantees it is writable.
            unsafe { out_len.write(m) };
            return Err(rkv_status::RKV_BUFFER_TOO_SMALL);
        }
        let handle = handle.fill(guard.into_raw());
        // SAFETY: `out_slots` passed `check_out_array` with `out_cap >= m`; `t` is not used
        // after this; `out_len`, `out_lock` passed `check_out` and are writable by contract.
        unsafe {
            write_array(out_slots, &slots);
            out_len.write(m);
            out_lock.write(handle);
        }
        Ok(())
    })
}

/// The checked cache, query and run buffer of `rkv_match_runs` and `rkv_match_lock_runs`.
///
/// # Safety
/// `cache` is NULL or live and not freed during `'a`; `tokens[0..n_tokens]` readable (or
/// NULL) and not written during `'a`.
unsafe fn runs_args<'a>(
    cache: *const rkv_cache,
    tokens: *const u32,
    n_tokens: usize,
    out_runs: *mut rkv_slot_run,
    out_cap: usize,
) -> Res<(&'a rkv_cache, &'a [u32])> {
    // SAFETY: the caller passes NULL or a live cache that is not being freed.
    let c = unsafe { cache_ref(cache) }?;
    // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
    let t = unsafe { input(tokens, n_tokens) }?;
    check_out_array(out_runs, out_cap)?;
    Ok((c, t))
}

/// `rkv_match` writing the slots as runs of consecutive slots (an extension of version 1):
/// `out_runs[0..*out_n_runs]` name the match's slots in token order, neighbours that
/// continue one another joined, so their lengths add up to `*out_len`; O(runs) to write
/// instead of O(tokens) when slots come in runs, as pools hand them out. `*out_len` and
/// `*out_n_runs` are required. `out_runs` may be NULL when `out_cap == 0`: then only the
/// two counts are produced and the status is `RKV_OK`. If `out_cap > 0` is smaller than the
/// number of runs, returns `RKV_BUFFER_TOO_SMALL` with both counts written (nothing else).
/// There are never more runs than matched tokens, so `out_cap = n_tokens` always suffices.
/// All arrays stay owned by the caller. Thread-safe; lock-free.
///
/// # Safety
/// As `rkv_match`, with `out_runs[0..out_cap]` writable (or NULL) and `out_n_runs` NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_match_runs(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    out_runs: *mut rkv_slot_run,
    out_cap: usize,
    out_n_runs: *mut usize,
    out_len: *mut usize,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller's contract for these arguments is `runs_args`'.
        let (c, t) = unsafe { runs_args(cache, tokens, n_tokens, out_runs, out_cap) }?;
        check_out(out_n_runs)?;
        check_out(out_len)?;
        let mut runs = Vec::new();
        let m = c.cache.match_prefix_runs(ns, t, &mut runs);
        let fits = out_cap == 0 || runs.len() <= out_cap;
        // SAFETY: `out_runs` passed `check_out_array` and is written only when `out_cap >=
        // runs.len()` (`rkv_slot_run` has `SlotRun`'s layout, asserted above); `t` is not
        // used after this; `out_n_runs` and `out_len` passed `check_out` and are writable.
        unsafe {
            if fits && out_cap > 0 {
                write_array(out_runs.cast::<SlotRun>(), &runs);
            }
            out_n_runs.write(runs.len());
            out_len.write(m);
        }
        if fits { Ok(()) } else { Err(rkv_status::RKV_BUFFER_TOO_SMALL) }
    })
}

/// `rkv_match_lock` writing the slots as runs, as `rkv_match_runs` does (an extension of
/// version 1): `out_cap` must be >= the number of runs (pass `n_tokens` to be safe);
/// `out_runs` may be NULL only when `out_cap == 0`. On `RKV_BUFFER_TOO_SMALL` nothing is
/// pinned, no edge is split, and only `*out_n_runs` and `*out_len` are written. Always
/// yields a lock on `RKV_OK`, also for a match of length 0; the caller owns it and must
/// release it exactly once with `rkv_release`. Thread-safe.
///
/// # Safety
/// As `rkv_match_runs`; `out_lock` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_match_lock_runs(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    out_runs: *mut rkv_slot_run,
    out_cap: usize,
    out_n_runs: *mut usize,
    out_len: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller's contract for these arguments is `runs_args`'.
        let (c, t) = unsafe { runs_args(cache, tokens, n_tokens, out_runs, out_cap) }?;
        check_out(out_n_runs)?;
        check_out(out_len)?;
        check_out(out_lock)?;
        let mut runs = Vec::new();
        // As in `rkv_match_lock`: a buffer that may be too small is checked with a plain
        // match first, so a refusal splits no edge.
        if out_cap < t.len() {
            let m = c.cache.tree().match_unrecorded(ns, t, &mut runs);
            if runs.len() > out_cap {
                // SAFETY: both passed `check_out`; the caller guarantees they are writable.
                unsafe {
                    out_n_runs.write(runs.len());
                    out_len.write(m);
                }
                return Err(rkv_status::RKV_BUFFER_TOO_SMALL);
            }
        }
        let handle = reserve_handle(c)?;
        let guard = c.cache.match_and_lock_runs(ns, t, &mut runs);
        let m = guard.len();
        if runs.len() > out_cap {
            // Grown since the check (a racing insert): nothing stays pinned.
            drop(guard);
            // SAFETY: both passed `check_out`; the caller guarantees they are writable.
            unsafe {
                out_n_runs.write(runs.len());
                out_len.write(m);
            }
            return Err(rkv_status::RKV_BUFFER_TOO_SMALL);
        }
        let handle = handle.fill(guard.into_raw());
        // SAFETY: `out_runs` passed `check_out_array` with `out_cap >= runs.len()` and has
        // `SlotRun`'s layout; `t` is not used after this; the three single outputs passed
        // `check_out` and are writable by contract.
        unsafe {
            write_array(out_runs.cast::<SlotRun>(), &runs);
            out_n_runs.write(runs.len());
            out_len.write(m);
            out_lock.write(handle);
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Insert.

/// Inserts `tokens[0..n_tokens]` with `slots[0..n_tokens]` in namespace `ns` (the length is
/// cut down to a multiple of page_size). Writes to `*out_existing` (required) how many
/// leading tokens were already cached: their given slots were not adopted. In pool mode the
/// call frees the slots it did not adopt itself (except those equal to the cached slot at
/// that position), and refuses whole with `RKV_INVALID_ARGUMENT` a slot outside the pool,
/// a free slot, or one cached at another position. In caller-managed mode the caller keeps
/// owning every slot that was not adopted. Arrays stay owned by the caller; either may be
/// NULL when `n_tokens == 0`. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `tokens` and `slots` NULL or readable for `n_tokens` values;
/// `out_existing` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    out_existing: *mut usize,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees both arrays are readable for n_tokens (or NULL).
        let (t, s) = unsafe { (input(tokens, n_tokens)?, input(slots, n_tokens)?) };
        check_out(out_existing)?;
        let existing = c.cache.insert(ns, t, s).map_err(st)?;
        // SAFETY: `out_existing` passed `check_out`; writable by the caller's contract.
        unsafe { out_existing.write(existing) };
        Ok(())
    })
}

/// `rkv_insert`, and pin `tokens[0..n]` (n cut down to a multiple of page_size) atomically
/// with it; the lock goes to `*out_lock` (required), owned by the caller, to be released
/// once with `rkv_release`. For chunked prefill: release the previous chunk's lock after
/// this succeeds. Thread-safe.
///
/// # Safety
/// As `rkv_insert`; `out_lock` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert_lock(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    out_existing: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees both arrays are readable for n_tokens (or NULL).
        let (t, s) = unsafe { (input(tokens, n_tokens)?, input(slots, n_tokens)?) };
        check_out(out_existing)?;
        check_out(out_lock)?;
        let handle = reserve_handle(c)?;
        let (existing, guard) = c.cache.insert_and_lock(ns, t, s).map_err(st)?;
        let handle = handle.fill(guard.into_raw());
        // SAFETY: both passed `check_out`; writable by the caller's contract.
        unsafe {
            out_existing.write(existing);
            out_lock.write(handle);
        }
        Ok(())
    })
}

/// `rkv_insert` with the slots given as runs of consecutive slots (an extension of version
/// 1): `runs[0..n_runs]` name the tokens' slots in token order (their lengths must add up to
/// `n_tokens`, and no run may be empty or reach past slot id 2^32 - 1: else
/// `RKV_INVALID_ARGUMENT`, changing nothing). As `rkv_alloc_runs` hands them out, so the
/// pool step and the new leaf take O(runs) instead of O(tokens). Everything else as
/// `rkv_insert`: in pool mode the runs past `*out_existing` (up to n) are adopted and the
/// other given slots go back to the pool, except those equal to the cached slot at their
/// position. Arrays stay owned by the caller; either may be NULL when its count is 0.
/// Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `tokens` NULL or readable for `n_tokens` values; `runs` NULL
/// or readable for `n_runs` runs; `out_existing` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert_runs(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    runs: *const rkv_slot_run,
    n_runs: usize,
    out_existing: *mut usize,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees both arrays are readable for their counts (or NULL).
        let (t, r) = unsafe { (input(tokens, n_tokens)?, input_runs(runs, n_runs)?) };
        check_out(out_existing)?;
        let existing = c.cache.insert_runs(ns, t, r).map_err(st)?;
        // SAFETY: `out_existing` passed `check_out`; writable by the caller's contract.
        unsafe { out_existing.write(existing) };
        Ok(())
    })
}

/// `rkv_insert_lock` with the slots given as runs, as in `rkv_insert_runs` (an extension of
/// version 1). The lock goes to `*out_lock` (required), owned by the caller, to be released
/// once with `rkv_release`. Thread-safe.
///
/// # Safety
/// As `rkv_insert_runs`; `out_lock` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert_lock_runs(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    runs: *const rkv_slot_run,
    n_runs: usize,
    out_existing: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees both arrays are readable for their counts (or NULL).
        let (t, r) = unsafe { (input(tokens, n_tokens)?, input_runs(runs, n_runs)?) };
        check_out(out_existing)?;
        check_out(out_lock)?;
        let handle = reserve_handle(c)?;
        let (existing, guard) = c.cache.insert_and_lock_runs(ns, t, r).map_err(st)?;
        let handle = handle.fill(guard.into_raw());
        // SAFETY: both passed `check_out`; writable by the caller's contract.
        unsafe {
            out_existing.write(existing);
            out_lock.write(handle);
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Locks.

/// Writes to `*out_len` (required) the number of tokens `lock` pins. `RKV_INVALID_LOCK` for
/// an unknown, released or foreign handle. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_lock_len(
    cache: *const rkv_cache,
    lock: rkv_lock,
    out_len: *mut usize,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_len)?;
        let n = c.locks.with(lock, |l| l.len()).ok_or(rkv_status::RKV_INVALID_LOCK)?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_len.write(n) };
        Ok(())
    })
}

/// Releases `lock`: its pages are no longer pinned by it, and the handle becomes invalid.
/// Releasing twice, 0, an unknown handle or another cache's lock is `RKV_INVALID_LOCK` and
/// changes nothing. Of two threads releasing one handle at once, exactly one gets `RKV_OK`.
/// Thread-safe.
///
/// # Safety
/// `cache` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_release(cache: *const rkv_cache, lock: rkv_lock) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        let l = c.locks.remove(lock).ok_or(rkv_status::RKV_INVALID_LOCK)?;
        c.cache.release(l).map_err(st)
    })
}

// ---------------------------------------------------------------------------------------
// Eviction and the pool.

/// Evicts at least `n_tokens` tokens (fewer only if nothing more is evictable; pinned pages
/// are never evicted) and writes the count freed to `*out_evicted` (required; it may exceed
/// `n_tokens`, a whole leaf goes at once). `free_fn(ctx, slots, n)` receives every freed
/// slot exactly once, on this thread, before the call returns; the slots then belong to the
/// caller (caller-managed mode). In pool mode the slots go back to the pool and `free_fn`
/// may be NULL (if given, it is told about them but must not free them again). Without a
/// pool a NULL `free_fn` is `RKV_NULL_ARGUMENT`. `free_fn` must not call into the same
/// cache. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `free_fn` NULL or a function safe to call with `ctx` and a
/// slot array; `out_evicted` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_evict(
    cache: *const rkv_cache,
    n_tokens: usize,
    free_fn: rkv_free_fn,
    ctx: *mut c_void,
    out_evicted: *mut usize,
) -> rkv_status {
    let evict = |cache: &Cache| match free_fn {
        None => cache.evict(n_tokens, None),
        Some(f) => {
            let mut tell = |slots: &[u32]| {
                if !slots.is_empty() {
                    // SAFETY: the caller guarantees `f` may be called with `ctx` and an
                    // array; `slots` is a live slice for the duration of the call.
                    unsafe { f(ctx, slots.as_ptr(), slots.len()) }
                }
            };
            cache.evict(n_tokens, Some(&mut tell))
        }
    };
    // SAFETY: the caller's contract for `cache` and `out_evicted` is `evict_into`'s.
    unsafe { evict_into(cache, out_evicted, free_fn.is_some(), evict) }
}

/// The body `rkv_evict` and `rkv_evict_runs` share, inside the panic boundary: checks
/// `cache` and `out_evicted`, refuses a missing callback without a pool
/// (`RKV_NULL_ARGUMENT`), runs `evict`, and writes the count freed only on success.
///
/// # Safety
/// `cache` is NULL or live; `out_evicted` NULL or writable.
unsafe fn evict_into(
    cache: *const rkv_cache,
    out_evicted: *mut usize,
    has_callback: bool,
    evict: impl FnOnce(&Cache) -> crate::error::Result<usize>,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_evicted)?;
        if !has_callback && !c.cache.has_pool() {
            return Err(rkv_status::RKV_NULL_ARGUMENT);
        }
        let evicted = evict(&c.cache).map_err(st)?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_evicted.write(evicted) };
        Ok(())
    })
}

/// `rkv_evict` handing the freed slots over as runs of consecutive slots (an extension of
/// version 1): `free_fn(ctx, runs, n)` gets each evicted leaf's slots as `rkv_slot_run`s,
/// O(runs) per leaf instead of O(tokens) when slots come in runs (as pools hand them out).
/// Everything else as `rkv_evict`: `*out_evicted` (required) gets the count freed; in pool
/// mode the slots go back to the pool and `free_fn` may be NULL; without a pool a NULL
/// `free_fn` is `RKV_NULL_ARGUMENT`. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `free_fn` NULL or a function safe to call with `ctx` and a run
/// array; `out_evicted` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_evict_runs(
    cache: *const rkv_cache,
    n_tokens: usize,
    free_fn: rkv_free_runs_fn,
    ctx: *mut c_void,
    out_evicted: *mut usize,
) -> rkv_status {
    let evict = |cache: &Cache| match free_fn {
        None => cache.evict_runs(n_tokens, None),
        Some(f) => {
            let mut tell = |runs: &[SlotRun]| {
                if !runs.is_empty() {
                    // SAFETY: `rkv_slot_run` has `SlotRun`'s layout (asserted above), and
                    // the caller guarantees `f` may be called with `ctx` and an array;
                    // `runs` is a live slice for the duration of the call.
                    unsafe { f(ctx, runs.as_ptr().cast::<rkv_slot_run>(), runs.len()) }
                }
            };
            cache.evict_runs(n_tokens, Some(&mut tell))
        }
    };
    // SAFETY: the caller's contract for `cache` and `out_evicted` is `evict_into`'s.
    unsafe { evict_into(cache, out_evicted, free_fn.is_some(), evict) }
}

/// Pool mode only (else `RKV_NO_POOL`): allocates `n_slots` slots into
/// `out_slots[0..n_slots]` (NULL allowed when `n_slots == 0`), all or nothing, evicting
/// when free slots are short; `RKV_OUT_OF_SLOTS` when even that cannot find them. With
/// page_size > 1, `n_slots` must be a multiple of page_size and slots come in whole pages.
/// The caller owns the slots until it inserts them (the cache adopts them) or frees them.
/// Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_slots` NULL or writable for `n_slots` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_alloc(
    cache: *const rkv_cache,
    n_slots: usize,
    out_slots: *mut u32,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        if n_slots > 0 && out_slots.is_null() {
            return Err(rkv_status::RKV_NULL_ARGUMENT);
        }
        if !c.cache.has_pool() {
            return Err(rkv_status::RKV_NO_POOL);
        }
        if n_slots > c.cache.options().pool_slots {
            // More than the whole pool: short whatever is evicted (and no buffer that
            // large can exist), so fail before touching anything.
            return Err(rkv_status::RKV_OUT_OF_SLOTS);
        }
        check_out_array(out_slots, n_slots)?;
        let mut slots = Vec::new();
        c.cache.alloc(n_slots, &mut slots).map_err(st)?;
        if slots.len() != n_slots {
            // Not the contract of `Cache::alloc`: give them back and report the bug.
            let _ = c.cache.free(&slots);
            return Err(rkv_status::RKV_INTERNAL_ERROR);
        }
        // SAFETY: `out_slots` passed `check_out_array` with cap `n_slots == slots.len()`.
        unsafe { write_array(out_slots, &slots) };
        Ok(())
    })
}

/// Pool mode only (else `RKV_NO_POOL`): returns `slots[0..n_slots]` (allocated and never
/// adopted) to the pool. A slot that is free already or held by the tree is
/// `RKV_DOUBLE_FREE`, a slot outside the pool `RKV_INVALID_ARGUMENT`; either refuses the
/// whole call and changes nothing. The array stays owned by the caller (NULL allowed when
/// `n_slots == 0`). Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `slots` NULL or readable for `n_slots` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_free(
    cache: *const rkv_cache,
    slots: *const u32,
    n_slots: usize,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees slots[0..n_slots] is readable (or NULL).
        let s = unsafe { input(slots, n_slots) }?;
        c.cache.free(s).map_err(st)
    })
}

/// `rkv_alloc` handing the slots out as runs of consecutive slots (an extension of version
/// 1): `out_runs[0..*out_n_runs]` (`*out_n_runs` required), ascending within each run, their
/// lengths adding up to `n_slots`; O(runs) instead of O(slots). Pass them to
/// `rkv_insert_runs` or `rkv_free_runs`. A pool hands out long runs, so a few runs usually
/// suffice; `out_cap = n_slots / page_size` always does. With a smaller `out_cap` than the
/// allocation's runs, the slots go straight back to the pool, `*out_n_runs` gets the number
/// of runs that allocation came in (another may differ) and the call returns
/// `RKV_BUFFER_TOO_SMALL` (what was evicted to make room stays evicted). `out_runs` may be
/// NULL only when `out_cap == 0`. Pool mode only (`RKV_NO_POOL`); the other refusals as
/// `rkv_alloc`. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_runs` NULL or writable for `out_cap` runs; `out_n_runs`
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_alloc_runs(
    cache: *const rkv_cache,
    n_slots: usize,
    out_runs: *mut rkv_slot_run,
    out_cap: usize,
    out_n_runs: *mut usize,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out_array(out_runs, out_cap)?;
        check_out(out_n_runs)?;
        if !c.cache.has_pool() {
            return Err(rkv_status::RKV_NO_POOL);
        }
        if n_slots > c.cache.options().pool_slots {
            return Err(rkv_status::RKV_OUT_OF_SLOTS);
        }
        let mut runs = Vec::new();
        c.cache.alloc_runs(n_slots, &mut runs).map_err(st)?;
        if runs.iter().map(|r| r.len as usize).sum::<usize>() != n_slots {
            // Not the contract of `Cache::alloc_runs`: give them back and report the bug.
            let _ = c.cache.free_runs(&runs);
            return Err(rkv_status::RKV_INTERNAL_ERROR);
        }
        if runs.len() > out_cap {
            c.cache.free_runs(&runs).map_err(|_| rkv_status::RKV_INTERNAL_ERROR)?;
            // SAFETY: passed `check_out`; writable by the caller's contract.
            unsafe { out_n_runs.write(runs.len()) };
            return Err(rkv_status::RKV_BUFFER_TOO_SMALL);
        }
        // SAFETY: `out_runs` passed `check_out_array` with `out_cap >= runs.len()` and has
        // `SlotRun`'s layout; `out_n_runs` passed `check_out`.
        unsafe {
            write_array(out_runs.cast::<SlotRun>(), &runs);
            out_n_runs.write(runs.len());
        }
        Ok(())
    })
}

/// `rkv_free` for slots given as runs (an extension of version 1): returns the slots of
/// `runs[0..n_runs]` (allocated and never adopted) to the pool, refused whole as `rkv_free`
/// is (an empty run is `RKV_INVALID_ARGUMENT`). The array stays owned by the caller (NULL
/// allowed when `n_runs == 0`). Pool mode only (`RKV_NO_POOL`). Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `runs` NULL or readable for `n_runs` runs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_free_runs(
    cache: *const rkv_cache,
    runs: *const rkv_slot_run,
    n_runs: usize,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees runs[0..n_runs] is readable (or NULL).
        let r = unsafe { input_runs(runs, n_runs) }?;
        c.cache.free_runs(r).map_err(st)
    })
}

// ---------------------------------------------------------------------------------------
// Stats and reset.

fn to_c_stats(s: &CacheStats) -> rkv_stats {
    rkv_stats {
        cached_tokens: s.tree.cached_tokens,
        evictable_tokens: s.tree.evictable_tokens,
        protected_tokens: s.tree.protected_tokens,
        nodes: s.tree.nodes,
        pool_slots: s.pool_slots,
        free_slots: s.free_slots,
        match_calls: s.tree.match_calls,
        match_query_tokens: s.tree.match_query_tokens,
        match_hit_tokens: s.tree.match_hit_tokens,
        inserted_tokens: s.tree.inserted_tokens,
        evicted_tokens: s.tree.evicted_tokens,
    }
}

/// Writes the cache's counts and counters to `*out_stats` (required, owned by the caller).
/// Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_stats` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_stats(
    cache: *const rkv_cache,
    out_stats: *mut rkv_stats,
) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_stats)?;
        let s = to_c_stats(&c.cache.stats());
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_stats.write(s) };
        Ok(())
    })
}

/// Drops every unpinned page (all of them when nothing is pinned); locks stay valid and
/// their pages stay cached. In pool mode the slots go back to the pool. In caller-managed
/// mode the dropped slots are not reported: to get them back, call
/// `rkv_evict(cache, SIZE_MAX, free_fn, ctx, &n)` instead, which drops the same pages.
/// Thread-safe.
///
/// # Safety
/// `cache` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_reset(cache: *const rkv_cache) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        if c.cache.has_pool() {
            c.cache.reset(None).map_err(st)
        } else {
            c.cache.reset(Some(&mut |_: &[u32]| {})).map_err(st)
        }
    })
}

/// Frees memory the index unlinked earlier (split, evicted or replaced nodes and tables)
/// once no reader can hold it, a bounded batch per call. Never needed for correctness: the
/// same work otherwise runs inside whichever call next pins the thread (every 128th), which
/// then takes tens of microseconds longer. Call it where latency does not matter, e.g. once
/// per scheduler step after launching the batch. Thread-safe; an extension of ABI version 1.
///
/// # Safety
/// `cache` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_reclaim(cache: *const rkv_cache) -> rkv_status {
    boundary(|| {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        c.cache.reclaim();
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_internal_error() {
        assert_eq!(boundary(|| panic!("a bug")), rkv_status::RKV_INTERNAL_ERROR);
        assert_eq!(boundary(|| Ok(())), rkv_status::RKV_OK);
        assert_eq!(boundary(|| Err(rkv_status::RKV_NO_POOL)), rkv_status::RKV_NO_POOL);
    }

    #[test]
    fn every_error_maps_to_its_status() {
        let cases = [
            (Error::InvalidArgument("x".into()), 2),
            (Error::InvalidLock, 3),
            (Error::OutOfSlots { requested: 2, available: 1 }, 5),
            (Error::NoPool, 6),
            (Error::DoubleFree { slot: 4 }, 7),
            (Error::Device("x".into()), 8),
        ];
        for (e, code) in cases {
            assert_eq!(rkv_status::from(&e) as i32, code, "{e}");
        }
    }

    #[test]
    fn status_strings_are_static_and_total() {
        for code in -3..12 {
            let p = rkv_status_str(code);
            assert!(!p.is_null());
            // SAFETY: rkv_status_str returns a pointer to a static NUL-terminated string.
            let s = unsafe { CStr::from_ptr(p) }.to_str().unwrap();
            if (0..=9).contains(&code) {
                assert!(s.starts_with("RKV_"), "{code}: {s}");
            } else {
                assert_eq!(s, "unknown status");
            }
        }
        // SAFETY: as above.
        let v = unsafe { CStr::from_ptr(rkv_version()) }.to_str().unwrap();
        assert_eq!(v, env!("CARGO_PKG_VERSION"));
        assert_eq!(rkv_abi_version(), 1);
    }

    #[test]
    fn cache_new_checks_its_arguments_and_writes_only_on_ok() {
        let sentinel = std::ptr::dangling_mut::<rkv_cache>();
        let mut out = sentinel;
        let ok = rkv_options_default();
        // SAFETY: the pointers (in all calls below) are NULL or point to live locals.
        unsafe {
            assert_eq!(rkv_cache_new(std::ptr::null(), &mut out), rkv_status::RKV_NULL_ARGUMENT);
            assert_eq!(rkv_cache_new(&ok, std::ptr::null_mut()), rkv_status::RKV_NULL_ARGUMENT);
            for bad in [
                rkv_options { page_size: 0, ..ok },
                rkv_options { eviction_policy: 2, ..ok },
                rkv_options { pool_slots: (1 << 32) + 1, ..ok },
                rkv_options { page_size: 16, pool_slots: 100, ..ok },
            ] {
                assert_eq!(
                    rkv_cache_new(&bad, &mut out),
                    rkv_status::RKV_INVALID_ARGUMENT,
                    "{bad:?}"
                );
            }
            assert_eq!(out, sentinel);
            let fifo =
                rkv_options { eviction_policy: rkv_eviction_policy::RKV_EVICT_FIFO as u32, ..ok };
            assert_eq!(rkv_cache_new(&fifo, &mut out), rkv_status::RKV_OK);
            assert_ne!(out, sentinel);
            assert_eq!(rkv_release(out, 0), rkv_status::RKV_INVALID_LOCK);
            let mut n = 7usize;
            assert_eq!(rkv_lock_len(out, 12345, &mut n), rkv_status::RKV_INVALID_LOCK);
            assert_eq!(n, 7);
            let mut slot = 0u32;
            assert_eq!(rkv_alloc(out, 1, &mut slot), rkv_status::RKV_NO_POOL);
            assert_eq!(rkv_free(out, &slot, 1), rkv_status::RKV_NO_POOL);
            assert_eq!(
                rkv_evict(out, 1, None, std::ptr::null_mut(), &mut n),
                rkv_status::RKV_NULL_ARGUMENT
            );
            rkv_cache_free(out);
            rkv_cache_free(std::ptr::null_mut());
        }
    }
}
