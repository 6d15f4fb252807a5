//! The C ABI (`include/radixkv.h`, contract in `C_ABI.md`, version 1).
//!
//! Every function here is a literal `#[unsafe(no_mangle)] extern "C"` item so cbindgen sees
//! it, and every body runs inside a panic boundary: a Rust panic comes out as
//! `RKV_INTERNAL_ERROR`, never as an unwind across the boundary. Outputs are written only on
//! `RKV_OK` (and `*out_len` on `RKV_BUFFER_TOO_SMALL`); every pointer is checked.
//!
//! Every error also leaves a message for the calling thread, `rkv_last_error_message()`
//! (see `docs/errors.md`): `boundary` records it from the `Fail` a check returns, and
//! each check builds its message where it refuses, naming the argument and the values.
//!
//! Lock handles (`rkv_lock`) are `u64` values looked up in a per-cache sharded slab (see
//! `handles.rs`), so an unknown, released or foreign handle is `RKV_INVALID_LOCK`, never
//! undefined behavior.
//!
//! After a panic (a bug) the cache stays memory-safe and every call keeps its contract on
//! pointers and handles; whether the tree's content is still exactly the model's is not
//! promised (a panic in the middle of a tree operation may leave it partly done).
#![allow(non_camel_case_types)]

mod events;
pub use events::*;
mod handles;
mod tier;
pub use tier::*;

use std::cell::{Cell, RefCell};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use radixkv_core::cache::{Cache, CacheOptions, CacheStats};
use radixkv_core::error::Error;
use radixkv_core::pool::{SlotPool, SlotState};
use radixkv_core::slot_run::SlotRun;
use radixkv_core::tree::{
    DEFAULT_SLRU_THRESHOLD, EvictionPolicy, InsertOptions, PrefixLock, checked_priority,
};

use handles::{LockTable, Reserved};

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
}

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
/// Versioned by `size`: it must be `sizeof(rkv_policy_options)` of this header (8), which
/// `rkv_policy_options_default()` sets; any other value is `RKV_INVALID_ARGUMENT`. A later
/// library that appends fields will still accept this size (and use the defaults of the
/// fields it appended); a caller built against a larger struct gets a clear refusal from
/// this library instead of having its new fields ignored.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct rkv_policy_options {
    /// `sizeof(rkv_policy_options)`: 8.
    pub size: u32,
    /// `RKV_EVICT_SLRU`'s threshold: a node with at least this many hits is in the
    /// protected segment (default `RKV_DEFAULT_SLRU_THRESHOLD` = 2; 0 puts every node
    /// there, which is LRU). Any value; ignored by the other policies.
    pub slru_threshold: u32,
}

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
    std::mem::size_of::<rkv_policy_options>() == 8
        && std::mem::size_of::<rkv_insert_options>() == 24
        && std::mem::offset_of!(rkv_insert_options, priority) == 8
        && std::mem::offset_of!(rkv_insert_options, inserted_len) == 16
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
/// `rkv_cache_free` must not run concurrently with any other call on the same cache.
pub struct rkv_cache {
    cache: Cache,
    locks: LockTable<PrefixLock>,
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

// ---------------------------------------------------------------------------------------
// Helpers (not exported).

/// A refused call: its status and what exactly was wrong (which argument, which value,
/// which limit), for `rkv_last_error_message`. Built only on the error path.
struct Fail {
    status: rkv_status,
    msg: String,
}

type Res<T> = Result<T, Fail>;

/// A [`Fail`] with `status` and the message `msg`.
fn fail(status: rkv_status, msg: impl Into<String>) -> Fail {
    Fail { status, msg: msg.into() }
}

thread_local! {
    /// This thread's last error message, NUL-terminated; empty when the last call that
    /// returns an `rkv_status` succeeded (or none ran yet).
    static LAST_ERROR: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Whether `LAST_ERROR` holds a message: a success checks only this (a plain
    /// thread-local load, no destructor to register), so clearing costs nothing when there
    /// is nothing to clear.
    static HAS_ERROR: Cell<bool> = const { Cell::new(false) };
}

/// Records `function: msg` as this thread's last error (NUL bytes in `msg` dropped, so the
/// C string is whole). Does nothing while the thread's locals are being destroyed.
fn set_last_error(function: &str, msg: &str) {
    let _ = LAST_ERROR.try_with(|b| {
        if let Ok(mut b) = b.try_borrow_mut() {
            b.clear();
            b.extend_from_slice(function.as_bytes());
            b.extend_from_slice(b": ");
            b.extend(msg.bytes().filter(|&c| c != 0));
            b.push(0);
            HAS_ERROR.set(true);
        }
    });
}

/// Empties this thread's last error (a successful call). Keeps the buffer.
#[inline]
fn clear_last_error() {
    if HAS_ERROR.get() {
        HAS_ERROR.set(false);
        let _ = LAST_ERROR.try_with(|b| {
            if let Ok(mut b) = b.try_borrow_mut() {
                b.clear();
            }
        });
    }
}

/// What a caught panic says, for the message of its `RKV_INTERNAL_ERROR`.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

/// The panic boundary around every body of `function`: `Ok` is `RKV_OK` and clears this
/// thread's last error; an `Err` returns its status and records its message; a panic is
/// `RKV_INTERNAL_ERROR` with a message saying so (the panic itself never crosses).
fn boundary(function: &str, f: impl FnOnce() -> Res<()>) -> rkv_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            clear_last_error();
            rkv_status::RKV_OK
        }
        Ok(Err(e)) => {
            set_last_error(function, &e.msg);
            e.status
        }
        Err(payload) => {
            // Formatting the payload cannot unwind past here: contain a second panic too.
            let msg = catch_unwind(AssertUnwindSafe(|| {
                format!(
                    "internal error: a panic inside radixkv (a bug, please report it): {}; \
                     the cache stays memory-safe, but its content may be partly changed",
                    panic_text(&*payload)
                )
            }));
            let msg = msg.as_deref().unwrap_or("internal error: a panic inside radixkv");
            set_last_error(function, msg);
            rkv_status::RKV_INTERNAL_ERROR
        }
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
            Error::Io(_) => rkv_status::RKV_IO_ERROR,
        }
    }
}

/// A core error as a [`Fail`]: its status and its own message.
fn st(e: Error) -> Fail {
    fail(rkv_status::from(&e), e.to_string())
}

/// The message of a cache without a pool refusing a pool call.
fn no_pool() -> Fail {
    fail(
        rkv_status::RKV_NO_POOL,
        "this cache has no slot pool (it was created with pool_slots = 0: the caller \
         manages slots)",
    )
}

/// The cache behind `p`.
///
/// # Safety
/// `p` is NULL or was returned by `rkv_cache_new` and not yet freed, and no
/// `rkv_cache_free` of it runs during `'a`.
unsafe fn cache_ref<'a>(p: *const rkv_cache) -> Res<&'a rkv_cache> {
    if p.is_null() {
        return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "cache is NULL"));
    }
    if !p.is_aligned() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("cache = {p:p} is misaligned: not a pointer rkv_cache_new returned"),
        ));
    }
    // SAFETY: non-null and aligned; by the caller's contract it points to a live
    // `rkv_cache` made by `rkv_cache_new` (a `Box`), which nobody frees during 'a. Only
    // shared references to it are ever made while it is published.
    Ok(unsafe { &*p })
}

/// Why an array argument `name` of `len` elements (its length argument `len_name`) at `p`
/// is refused, if it is: NULL with a length, misaligned, or longer than memory can be.
fn check_array<T>(p: *const T, len: usize, name: &str, len_name: &str) -> Res<()> {
    if len == 0 {
        return Ok(());
    }
    if p.is_null() {
        return Err(fail(
            rkv_status::RKV_NULL_ARGUMENT,
            format!("{name} is NULL but {len_name} = {len} (NULL is allowed only with 0)"),
        ));
    }
    if !p.is_aligned() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("{name} = {p:p} is not aligned to {} bytes", align_of::<T>()),
        ));
    }
    if len > isize::MAX as usize / size_of::<T>() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!(
                "{len_name} = {len} is too large: {len} values of {} bytes exceed isize::MAX \
                 bytes",
                size_of::<T>()
            ),
        ));
    }
    Ok(())
}

/// An input array `name` of `len` values (its length argument `len_name`); NULL is allowed
/// when `len == 0`.
///
/// # Safety
/// When `len > 0` and `p` is non-NULL, `p[0..len]` is readable and not written during
/// `'a`.
unsafe fn input<'a, T>(p: *const T, len: usize, name: &str, len_name: &str) -> Res<&'a [T]> {
    check_array(p, len, name, len_name)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: `check_array` passed: non-null, aligned, `len * size_of::<T>() <= isize::MAX`,
    // and by the caller's contract `p[0..len]` is initialized memory that nobody writes
    // during 'a.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// An input array of `len` slot runs as `SlotRun`s; NULL is allowed when `len == 0`.
///
/// # Safety
/// As [`input`].
unsafe fn input_runs<'a>(
    p: *const rkv_slot_run,
    len: usize,
    name: &str,
    len_name: &str,
) -> Res<&'a [SlotRun]> {
    // SAFETY: `rkv_slot_run` has `SlotRun`'s layout (asserted above); the caller's contract
    // is `input`'s.
    unsafe { input(p.cast::<SlotRun>(), len, name, len_name) }
}

/// Checks an output array `name` of capacity `cap` (its capacity argument `cap_name`):
/// NULL is allowed when `cap == 0`.
fn check_out_array<T>(p: *mut T, cap: usize, name: &str, cap_name: &str) -> Res<()> {
    check_array(p.cast_const(), cap, name, cap_name)
}

/// Checks a required single output `name`.
fn check_out<T>(p: *mut T, name: &str) -> Res<()> {
    if p.is_null() {
        return Err(fail(rkv_status::RKV_NULL_ARGUMENT, format!("{name} is NULL")));
    }
    if !p.is_aligned() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("{name} = {p:p} is not aligned to {} bytes", align_of::<T>()),
        ));
    }
    Ok(())
}

/// Writes `src` to `dst[0..src.len()]`.
///
/// # Safety
/// `dst` passed `check_out_array(dst, cap, ..)` with `cap >= src.len()`, `dst[0..cap]` is
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
    c.locks.reserve().ok_or_else(|| {
        fail(
            rkv_status::RKV_INTERNAL_ERROR,
            format!(
                "no lock handle is free: this cache holds {} live locks, the most it can \
                 (release some)",
                handles::MAX_LOCKS
            ),
        )
    })
}

/// Whether `a[0..na]` and `b[0..nb]` (u32 arrays) share no byte.
fn disjoint(a: *const u32, na: usize, b: *const u32, nb: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    let end = |p: usize, n: usize| p.saturating_add(n.saturating_mul(4));
    end(a, na) <= b || end(b, nb) <= a
}

/// Why `lock` is refused by `c` (`RKV_INVALID_LOCK`).
fn invalid_lock(c: &rkv_cache, lock: rkv_lock) -> Fail {
    let why = c.locks.explain(lock);
    fail(rkv_status::RKV_INVALID_LOCK, format!("lock {lock:#x} {why}"))
}

// ---------------------------------------------------------------------------------------
// Messages for refused slots: the core names the slot; these name its position.

/// The slot a core error names: `DoubleFree { slot }`, or an `InvalidArgument` from the
/// pool, whose messages begin "slot N " (`SlotPool::refusal`, `SlotPool::out_of_range`).
fn named_slot(e: &Error) -> Option<u32> {
    match e {
        Error::DoubleFree { slot } => Some(*slot),
        Error::InvalidArgument(m) => {
            let rest = m.strip_prefix("slot ")?;
            let digits = rest.split(' ').next()?;
            digits.parse().ok()
        }
        _ => None,
    }
}

/// Where a slot value is among the given slots: a position in a list, or a run.
trait SlotPositions {
    /// The positions naming `slot`, in order, as `slots[3] = 70000` or
    /// `runs[1] = {start 8, len 4}: slot 11` (at most two).
    fn find(&self, slot: u32) -> Vec<String>;
}

impl SlotPositions for (&str, &[u32]) {
    fn find(&self, slot: u32) -> Vec<String> {
        let (name, slots) = *self;
        let at = slots.iter().enumerate().filter(|(_, s)| **s == slot);
        at.take(2).map(|(i, _)| format!("{name}[{i}] = {slot}")).collect()
    }
}

impl SlotPositions for (&str, &[SlotRun]) {
    fn find(&self, slot: u32) -> Vec<String> {
        let (name, runs) = *self;
        let holds = |r: &SlotRun| {
            (r.start as u64..r.start as u64 + r.len as u64).contains(&u64::from(slot))
        };
        let at = runs.iter().enumerate().filter(|(_, r)| holds(r));
        at.take(2)
            .map(|(i, r)| {
                format!("{name}[{i}] = {{start {}, len {}}}: slot {slot}", r.start, r.len)
            })
            .collect()
    }
}

/// A core refusal of given slots (`e`), with the position of the slot it names and, for a
/// pool, what state that slot is in (every slot given must be held by the caller).
fn slot_refusal(e: Error, given: &dyn SlotPositions, pool: Option<&SlotPool>) -> Fail {
    let status = rkv_status::from(&e);
    let Some(slot) = named_slot(&e) else { return st(e) };
    let at = given.find(slot);
    let Some(first) = at.first() else { return st(e) };
    let core_says_twice = matches!(&e, Error::InvalidArgument(m) if m.contains("twice"));
    let state = pool.and_then(|p| p.state(slot));
    let what = match pool {
        Some(p) if slot as usize >= p.capacity() => format!(
            "is out of range: the pool has {} slots (ids 0 to {})",
            p.capacity(),
            p.capacity() - 1
        ),
        _ if at.len() > 1 && (core_says_twice || state == Some(SlotState::Held)) => {
            format!("is given twice (also {})", at[1])
        }
        _ => match state {
            Some(SlotState::Free) => "is free, not held by the caller (never allocated with \
                                      rkv_alloc, or freed or evicted since)"
                .to_string(),
            Some(SlotState::Cached) => "is cached by the tree, not held by the caller (an \
                                        insert adopted it already; the tree owns it until it \
                                        is evicted)"
                .to_string(),
            _ => format!("is refused: {e}"),
        },
    };
    fail(status, format!("{first} {what}"))
}

/// Why runs given for `n_tokens` tokens are refused before any slot is looked at, if they
/// are: an empty run, a run past the largest slot id, or lengths that do not add up.
fn runs_shape(runs: &[SlotRun], n_tokens: usize, name: &str) -> Option<Fail> {
    let bad = |m: String| Some(fail(rkv_status::RKV_INVALID_ARGUMENT, m));
    let mut total = 0u64;
    for (i, r) in runs.iter().enumerate() {
        if r.len == 0 {
            return bad(format!("{name}[{i}] = {{start {}, len 0}} is empty", r.start));
        }
        if u64::from(r.start) + u64::from(r.len) > 1 << 32 {
            return bad(format!(
                "{name}[{i}] = {{start {}, len {}}} goes past the largest slot id 2^32 - 1",
                r.start, r.len
            ));
        }
        total += u64::from(r.len);
    }
    if total != n_tokens as u64 {
        return bad(format!(
            "the {} runs hold {total} slots but n_tokens = {n_tokens} (one slot per token)",
            runs.len()
        ));
    }
    None
}

/// `RKV_BUFFER_TOO_SMALL` for a slot buffer of `cap` and a match of `m` tokens.
fn too_small_slots(cap: usize, m: usize, tail: &str) -> Fail {
    fail(
        rkv_status::RKV_BUFFER_TOO_SMALL,
        format!("out_cap = {cap} is smaller than the match of {m} tokens (*out_len = {m}){tail}"),
    )
}

/// `RKV_BUFFER_TOO_SMALL` for a run buffer of `cap` and a match of `m` tokens in `n` runs.
fn too_small_runs(cap: usize, n: usize, m: usize, tail: &str) -> Fail {
    fail(
        rkv_status::RKV_BUFFER_TOO_SMALL,
        format!(
            "out_cap = {cap} is smaller than the {n} runs of the match of {m} tokens \
             (*out_n_runs = {n}, *out_len = {m}){tail}"
        ),
    )
}

/// The token and slot arrays of `rkv_insert` and `rkv_insert_lock`.
///
/// # Safety
/// As [`input`], for both arrays.
unsafe fn insert_arrays<'a>(
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
) -> Res<(&'a [u32], &'a [u32])> {
    // SAFETY: the caller's contract is `input`'s, for both arrays.
    unsafe {
        Ok((
            input(tokens, n_tokens, "tokens", "n_tokens")?,
            input(slots, n_tokens, "slots", "n_tokens")?,
        ))
    }
}

/// The token and run arrays of `rkv_insert_runs` and `rkv_insert_lock_runs`.
///
/// # Safety
/// As [`input`], for both arrays.
unsafe fn insert_runs_arrays<'a>(
    tokens: *const u32,
    n_tokens: usize,
    runs: *const rkv_slot_run,
    n_runs: usize,
) -> Res<(&'a [u32], &'a [SlotRun])> {
    // SAFETY: the caller's contract is `input`'s, for both arrays.
    unsafe {
        Ok((
            input(tokens, n_tokens, "tokens", "n_tokens")?,
            input_runs(runs, n_runs, "runs", "n_runs")?,
        ))
    }
}

/// An insert's refusal of the runs `r` given for `n_tokens` tokens: their shape first, then
/// the slot the core names.
fn runs_refusal(e: Error, c: &rkv_cache, r: &[SlotRun], n_tokens: usize) -> Fail {
    if let Some(f) = runs_shape(r, n_tokens, "runs") {
        return f;
    }
    slot_refusal(e, &("runs", r), c.cache.pool())
}

/// `RKV_OUT_OF_SLOTS` for asking more than the whole pool.
fn more_than_pool(n: usize, pool_slots: usize) -> Fail {
    fail(
        rkv_status::RKV_OUT_OF_SLOTS,
        format!("n_slots = {n} is more than the whole pool of {pool_slots} slots"),
    )
}

/// An allocation's refusal by the pool, naming the numbers.
fn alloc_refusal(e: Error, c: &rkv_cache, n: usize) -> Fail {
    let p = c.cache.page_size();
    match e {
        Error::OutOfSlots { requested, available } => fail(
            rkv_status::RKV_OUT_OF_SLOTS,
            format!(
                "n_slots = {requested}, but only {available} slots are free or evictable even \
                 after evicting (the other slots are pinned by locks or held by callers)"
            ),
        ),
        Error::InvalidArgument(_) if !n.is_multiple_of(p) => fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!(
                "n_slots = {n} is not a multiple of the page size {p} (slots come in whole pages)"
            ),
        ),
        e => st(e),
    }
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
        10 => c"RKV_IO_ERROR: the environment refused (an address in use, a socket or thread)",
        _ => c"unknown status",
    };
    s.as_ptr()
}

/// This thread's message for the last call that failed: exactly what was wrong, naming
/// the function, the argument and the values, for example
/// `rkv_insert: slots[3] = 70000 is out of range: the pool has 65536 slots (ids 0 to 65535)`.
/// An extension of ABI version 1 (see docs/errors.md).
///
/// - Every function that returns an `rkv_status` sets it when it returns anything but
///   `RKV_OK` (also `RKV_BUFFER_TOO_SMALL`, and `RKV_INTERNAL_ERROR` for a caught panic),
///   and clears it (to "") when it returns `RKV_OK`: the message always describes the
///   last status-returning call on this thread. Functions that return no status
///   (`rkv_version`, `rkv_abi_version`, `rkv_status_str`, `rkv_options_default`,
///   `rkv_cache_free`, this one) leave it as it is.
/// - Per thread: a call on one thread never changes another thread's message, so read it
///   on the thread that made the failing call.
/// - Never NULL: "" when the last call succeeded or none has run on this thread.
/// - Owned by the library: do not free it. Valid until the next call of a status-returning
///   `rkv_*` function on this thread, or the thread's exit; copy it to keep it.
/// - Meant for people (logs, exceptions): the wording may change between versions; branch
///   on the `rkv_status`, not on the text.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_last_error_message() -> *const c_char {
    let none = c"".as_ptr();
    if !HAS_ERROR.get() {
        return none;
    }
    LAST_ERROR
        .try_with(|b| match b.try_borrow() {
            Ok(b) if !b.is_empty() => b.as_ptr().cast::<c_char>(),
            _ => none,
        })
        .unwrap_or(none)
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

/// Default policy parameters (an extension of version 1): `size =
/// sizeof(rkv_policy_options)`, `slru_threshold = RKV_DEFAULT_SLRU_THRESHOLD`. Returns a
/// plain value. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_policy_options_default() -> rkv_policy_options {
    rkv_policy_options {
        size: size_of::<rkv_policy_options>() as u32,
        slru_threshold: RKV_DEFAULT_SLRU_THRESHOLD,
    }
}

/// Default insert options (an extension of version 1): `size =
/// sizeof(rkv_insert_options)`, priority 0, inserted_len 0 (what `rkv_insert` uses).
/// Returns a plain value. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_insert_options_default() -> rkv_insert_options {
    rkv_insert_options {
        size: size_of::<rkv_insert_options>() as u32,
        reserved: 0,
        priority: 0,
        inserted_len: 0,
    }
}

/// The `rkv_eviction_policy` number of a policy.
fn c_policy(p: EvictionPolicy) -> rkv_eviction_policy {
    use rkv_eviction_policy::*;
    match p {
        EvictionPolicy::Lru => RKV_EVICT_LRU,
        EvictionPolicy::Fifo => RKV_EVICT_FIFO,
        EvictionPolicy::Lfu => RKV_EVICT_LFU,
        EvictionPolicy::Mru => RKV_EVICT_MRU,
        EvictionPolicy::Filo => RKV_EVICT_FILO,
        EvictionPolicy::Priority => RKV_EVICT_PRIORITY,
        EvictionPolicy::Slru => RKV_EVICT_SLRU,
    }
}

/// The policy numbered `n`, if one is.
fn policy_of(n: u32) -> Option<EvictionPolicy> {
    EvictionPolicy::ALL.into_iter().find(|&p| c_policy(p) as u32 == n)
}

/// The valid numbers with their names, in number order: "0 = RKV_EVICT_LRU, 1 = ...".
fn valid_policies() -> String {
    let mut all: Vec<rkv_eviction_policy> = EvictionPolicy::ALL.map(c_policy).into();
    all.sort_by_key(|&p| p as u32);
    all.iter().map(|&p| format!("{} = {p:?}", p as u32)).collect::<Vec<_>>().join(", ")
}

/// A policy's name (`EvictionPolicy::name`) as a static C string.
fn policy_cname(p: EvictionPolicy) -> &'static CStr {
    match p {
        EvictionPolicy::Lru => c"lru",
        EvictionPolicy::Fifo => c"fifo",
        EvictionPolicy::Lfu => c"lfu",
        EvictionPolicy::Mru => c"mru",
        EvictionPolicy::Filo => c"filo",
        EvictionPolicy::Priority => c"priority",
        EvictionPolicy::Slru => c"slru",
    }
}

/// The name of eviction policy number `policy` as SGLang's `--radix-eviction-policy`
/// spells it ("lru", "fifo", "lfu", "mru", "filo", "priority", "slru"), a static
/// NUL-terminated string the caller must not free; NULL for a number that is not an
/// `rkv_eviction_policy`. An extension of version 1. Thread-safe; leaves
/// `rkv_last_error_message()` as it is.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_eviction_policy_name(policy: u32) -> *const c_char {
    policy_of(policy).map_or(std::ptr::null(), |p| policy_cname(p).as_ptr())
}

/// Reads an eviction policy's name (`name`, required, NUL-terminated, as
/// `rkv_eviction_policy_name` gives it; ASCII case ignored) and writes its
/// `rkv_eviction_policy` number to `*out_policy` (required), for an engine that takes
/// SGLang's `--radix-eviction-policy`. An unknown name is `RKV_INVALID_ARGUMENT`, with a
/// message listing the valid ones. An extension of version 1. Thread-safe.
///
/// # Safety
/// `name` is NULL or a readable NUL-terminated string; `out_policy` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_eviction_policy_from_name(
    name: *const c_char,
    out_policy: *mut u32,
) -> rkv_status {
    boundary("rkv_eviction_policy_from_name", || {
        if name.is_null() {
            return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "name is NULL"));
        }
        check_out(out_policy, "out_policy")?;
        // SAFETY: non-null; the caller guarantees a readable NUL-terminated string, which
        // is only read during the call.
        let text = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let policy = text.parse::<EvictionPolicy>().map_err(|e| match e {
            Error::InvalidArgument(m) => fail(
                rkv_status::RKV_INVALID_ARGUMENT,
                format!("name: {m}; as numbers: {}", valid_policies()),
            ),
            e => st(e),
        })?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_policy.write(c_policy(policy) as u32) };
        Ok(())
    })
}

/// Checks an optional input struct `name`: NULL is allowed; otherwise it must be aligned.
fn check_opt_in<T>(p: *const T, name: &str) -> Res<()> {
    if !p.is_null() && !p.is_aligned() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("{name} = {p:p} is not aligned to {} bytes", align_of::<T>()),
        ));
    }
    Ok(())
}

/// `*p`, a struct `type_name` versioned by its first field, `uint32_t size`, which must be
/// `size_of::<T>()` (the only version this library knows; `name` is the argument).
///
/// # Safety
/// `p` is non-NULL, aligned, and points to a readable `uint32_t`, followed by the rest of
/// a readable `T` when that `uint32_t` is `size_of::<T>()`.
unsafe fn read_sized<T: Copy>(p: *const T, name: &str, type_name: &str) -> Res<T> {
    // SAFETY: the first field of every versioned struct is a `u32` at offset 0, readable by
    // the caller's contract; `p` is aligned for `T`, whose alignment is at least a u32's.
    let size = unsafe { p.cast::<u32>().read() };
    if size as usize != size_of::<T>() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!(
                "{name}->size = {size} is not the size of an {type_name} this library knows \
                 ({}): start from {type_name}_default(), which sets it",
                size_of::<T>()
            ),
        ));
    }
    // SAFETY: `size` says a whole `T` is there, readable by the caller's contract; `T` is a
    // plain-old-data struct of integers (every bit pattern is valid, no padding).
    Ok(unsafe { p.read() })
}

/// The core's options for insert options `p` (NULL: the defaults).
///
/// # Safety
/// `p` is NULL, or passed `check_opt_in` and points to a readable `rkv_insert_options`.
unsafe fn insert_options(p: *const rkv_insert_options) -> Res<InsertOptions> {
    if p.is_null() {
        return Ok(InsertOptions::default());
    }
    // SAFETY: non-null and aligned; readable by the caller's contract.
    let o = unsafe { read_sized(p, "opts", "rkv_insert_options") }?;
    if o.reserved != 0 {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("opts->reserved = {} must be 0 (reserved for a later version)", o.reserved),
        ));
    }
    let priority = checked_priority(o.priority).map_err(|e| match e {
        Error::InvalidArgument(m) => fail(rkv_status::RKV_INVALID_ARGUMENT, format!("opts->{m}")),
        e => st(e),
    })?;
    // A length past the key counts no hit, whatever it is: saturate where size_t is narrow.
    let inserted_len = usize::try_from(o.inserted_len).unwrap_or(usize::MAX);
    Ok(InsertOptions { priority, inserted_len })
}

/// Creates a cache from `*opts` (required; read only during the call) and writes it to
/// `*out_cache` (required). The caller owns the new cache and frees it with
/// `rkv_cache_free`. `RKV_INVALID_ARGUMENT` for page_size 0, an unknown eviction_policy, or
/// a pool size that is not a multiple of page_size or above 2^32. The policy's parameters
/// are the defaults (`rkv_cache_new_with` sets them). Thread-safe.
///
/// # Safety
/// `opts` is NULL or points to a readable `rkv_options`; `out_cache` is NULL or points to
/// a writable `rkv_cache *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_new(
    opts: *const rkv_options,
    out_cache: *mut *mut rkv_cache,
) -> rkv_status {
    // SAFETY: the caller's contract for `opts` and `out_cache` is `new_cache`'s, and a NULL
    // `policy` is allowed.
    boundary("rkv_cache_new", || unsafe { new_cache(opts, std::ptr::null(), out_cache) })
}

/// `rkv_cache_new` with the eviction policy's parameters (an extension of version 1):
/// `*policy` (read only during the call) sets them, e.g. `RKV_EVICT_SLRU`'s
/// `slru_threshold`; NULL means `rkv_policy_options_default()`, so
/// `rkv_cache_new_with(opts, NULL, out)` is `rkv_cache_new(opts, out)`. The policy itself
/// stays `opts->eviction_policy`. Parameters of a policy other than the cache's are
/// accepted and ignored. `RKV_INVALID_ARGUMENT` also for `policy->size` other than
/// `sizeof(rkv_policy_options)`. Thread-safe.
///
/// # Safety
/// As `rkv_cache_new`; `policy` is NULL or points to a readable `rkv_policy_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_new_with(
    opts: *const rkv_options,
    policy: *const rkv_policy_options,
    out_cache: *mut *mut rkv_cache,
) -> rkv_status {
    // SAFETY: the caller's contract for the three pointers is `new_cache`'s.
    boundary("rkv_cache_new_with", || unsafe { new_cache(opts, policy, out_cache) })
}

/// The core's options for `*opts` and `*policy` (NULL: the defaults), as `rkv_cache_new_with`
/// checks them (`rkv_tier_new` too).
///
/// # Safety
/// `opts` is NULL or readable; `policy` NULL or readable.
unsafe fn cache_options(
    opts: *const rkv_options,
    policy: *const rkv_policy_options,
) -> Res<CacheOptions> {
    if opts.is_null() {
        return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "opts is NULL"));
    }
    if !opts.is_aligned() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("opts = {opts:p} is not aligned to {} bytes", align_of::<rkv_options>()),
        ));
    }
    check_opt_in(policy, "policy")?;
    // SAFETY: non-null and aligned; the caller guarantees it points to a readable
    // `rkv_options` (a plain-old-data struct: every bit pattern is valid).
    let o = unsafe { opts.read() };
    let bad = |m: String| Err(fail(rkv_status::RKV_INVALID_ARGUMENT, m));
    let Some(eviction) = policy_of(o.eviction_policy) else {
        return bad(format!(
            "opts->eviction_policy = {} is not an rkv_eviction_policy ({})",
            o.eviction_policy,
            valid_policies()
        ));
    };
    if o.page_size == 0 {
        return bad("opts->page_size = 0: the page size must be at least 1".into());
    }
    if o.pool_slots > 1 << 32 {
        return bad(format!(
            "opts->pool_slots = {} is above 2^32 = 4294967296 (slot ids are uint32_t)",
            o.pool_slots
        ));
    }
    if o.pool_slots % u64::from(o.page_size) != 0 {
        return bad(format!(
            "opts->pool_slots = {} is not a multiple of opts->page_size = {} (the pool holds \
             whole pages)",
            o.pool_slots, o.page_size
        ));
    }
    let Ok(pool_slots) = usize::try_from(o.pool_slots) else {
        return bad(format!(
            "opts->pool_slots = {} does not fit this platform's size_t",
            o.pool_slots
        ));
    };
    let params = if policy.is_null() {
        rkv_policy_options_default()
    } else {
        // SAFETY: non-null and aligned (`check_opt_in`); readable by the caller's contract.
        unsafe { read_sized(policy, "policy", "rkv_policy_options") }?
    };
    Ok(CacheOptions {
        page_size: o.page_size as usize,
        policy: eviction,
        pool_slots,
        slru_threshold: params.slru_threshold,
    })
}

/// The body of `rkv_cache_new` and `rkv_cache_new_with`, inside their panic boundary.
///
/// # Safety
/// `opts` is NULL or readable; `policy` NULL or readable; `out_cache` NULL or writable.
unsafe fn new_cache(
    opts: *const rkv_options,
    policy: *const rkv_policy_options,
    out_cache: *mut *mut rkv_cache,
) -> Res<()> {
    if opts.is_null() {
        return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "opts is NULL"));
    }
    check_out(out_cache, "out_cache")?;
    // SAFETY: the caller's contract for `opts` and `policy` is `cache_options`'.
    let copts = unsafe { cache_options(opts, policy) }?;
    let cache = Cache::new(copts).map_err(|e| fail(rkv_status::from(&e), format!("opts: {e}")))?;
    // `None` only with 2^20 - 1 caches live at once (see `handles`).
    let locks = LockTable::new().ok_or_else(|| {
        fail(
            rkv_status::RKV_INTERNAL_ERROR,
            "too many live caches: 2^20 - 1 = 1048575 exist in this process, the most there \
             can be (free some)",
        )
    })?;
    let raw = Box::into_raw(Box::new(rkv_cache { cache, locks }));
    // SAFETY: `out_cache` passed `check_out` (non-null, aligned) and the caller guarantees
    // it is writable.
    unsafe { out_cache.write(raw) };
    Ok(())
}

/// Writes the cache's eviction policy (its `rkv_eviction_policy` number) to `*out_policy`
/// and its SLRU threshold to `*out_slru_threshold` (both required; the threshold is
/// written whatever the policy, the default unless `rkv_cache_new_with` set it). An
/// extension of version 1. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_policy` and `out_slru_threshold` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_eviction_policy(
    cache: *const rkv_cache,
    out_policy: *mut u32,
    out_slru_threshold: *mut u32,
) -> rkv_status {
    boundary("rkv_cache_eviction_policy", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_policy, "out_policy")?;
        check_out(out_slru_threshold, "out_slru_threshold")?;
        let o = c.cache.options();
        // SAFETY: both passed `check_out`; writable by the caller's contract.
        unsafe {
            out_policy.write(c_policy(o.policy) as u32);
            out_slru_threshold.write(o.slru_threshold);
        }
        Ok(())
    })
}

/// Destroys a cache: releases its outstanding locks (their handles become invalid) and
/// frees everything it owns. Slots it held are not reported (in caller-managed mode, evict
/// first with a callback if you need them back). NULL is a no-op. Must not run concurrently
/// with any other call on the same cache, and the cache must not be used afterwards: any
/// call with a freed cache, `rkv_release` of one of its locks included, is undefined
/// behavior (it reads freed memory; it may block forever or corrupt the heap). Leaves
/// `rkv_last_error_message()` as it is.
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
/// written). On `RKV_OK`, `out_slots[*out_len..out_cap]` is scratch: a match that retried
/// may have written there. `tokens` may be NULL when `n_tokens == 0`. All arrays stay owned
/// by the caller. Thread-safe; lock-free.
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
    boundary("rkv_match", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
        let t = unsafe { input(tokens, n_tokens, "tokens", "n_tokens") }?;
        check_out_array(out_slots, out_cap, "out_slots", "out_cap")?;
        check_out(out_len, "out_len")?;
        if out_cap >= t.len() && out_cap > 0 && disjoint(out_slots, out_cap, tokens, t.len()) {
            // A buffer that holds any match and does not overlap the query: the match writes
            // the slots straight into it (no vector, no second copy). The call cannot fail
            // from here on, so the buffer is written only on success; past `*out_len` it may
            // hold slots of a retried attempt (the header says `out_slots[m..]` is scratch).
            // SAFETY: `out_slots[0..out_cap]` passed `check_out_array` and is writable by the
            // caller's contract; it does not overlap `tokens`, the only other memory read.
            let mut sink = unsafe { radixkv_core::tree::OutBuf::new(out_slots, out_cap) };
            let m = c.cache.tree().match_prefix(ns, t, &mut sink);
            debug_assert_eq!(m, sink.len());
            // SAFETY: `out_len` passed `check_out`; the caller guarantees it is writable.
            unsafe { out_len.write(m) };
            return Ok(());
        }
        let mut slots = Vec::new();
        let m = c.cache.match_prefix(ns, t, &mut slots);
        debug_assert_eq!(m, slots.len());
        if out_cap > 0 && m > out_cap {
            // SAFETY: `out_len` passed `check_out`; the caller guarantees it is writable.
            unsafe { out_len.write(m) };
            return Err(too_small_slots(
                out_cap,
                m,
                "; pass out_cap >= n_tokens, or 0 for the length only",
            ));
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
    boundary("rkv_match_lock", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
        let t = unsafe { input(tokens, n_tokens, "tokens", "n_tokens") }?;
        check_out_array(out_slots, out_cap, "out_slots", "out_cap")?;
        check_out(out_len, "out_len")?;
        check_out(out_lock, "out_lock")?;
        let mut slots = Vec::new();
        // A buffer that may be too small: measure first with a plain match, so a refusal
        // splits no edge (the locking match splits where the match ends).
        if out_cap < t.len() {
            let m = c.cache.tree().match_unrecorded(ns, t, &mut slots);
            if m > out_cap {
                // SAFETY: `out_len` passed `check_out`; the caller guarantees it is writable.
                unsafe { out_len.write(m) };
                return Err(too_small_slots(
                    out_cap,
                    m,
                    "; nothing was pinned (pass out_cap = n_tokens)",
                ));
            }
        }
        let handle = reserve_handle(c)?;
        if out_cap >= t.len() && out_cap > 0 && disjoint(out_slots, out_cap, tokens, t.len()) {
            // As in `rkv_match`: straight into the caller's buffer, which holds any match, so
            // nothing can fail after the pins.
            // SAFETY: as in `rkv_match`: a writable buffer disjoint from the query.
            let mut sink = unsafe { radixkv_core::tree::OutBuf::new(out_slots, out_cap) };
            let lock = c.cache.tree().match_and_lock(ns, t, &mut sink).into_raw();
            let m = sink.len();
            let handle = handle.fill(lock);
            // SAFETY: `out_len` and `out_lock` passed `check_out`; writable by contract.
            unsafe {
                out_len.write(m);
                out_lock.write(handle);
            }
            return Ok(());
        }
        let guard = c.cache.match_and_lock(ns, t, &mut slots);
        let m = slots.len();
        if m > out_cap {
            // Grown since the check (a racing insert): nothing stays pinned.
            drop(guard);
            // SAFETY: `out_len` passed `check_out`; the caller guarantees it is writable.
            unsafe { out_len.write(m) };
            let why = "; a concurrent insert grew the match during the call; nothing was pinned";
            return Err(too_small_slots(out_cap, m, why));
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
    let t = unsafe { input(tokens, n_tokens, "tokens", "n_tokens") }?;
    check_out_array(out_runs, out_cap, "out_runs", "out_cap")?;
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
    boundary("rkv_match_runs", || {
        // SAFETY: the caller's contract for these arguments is `runs_args`'.
        let (c, t) = unsafe { runs_args(cache, tokens, n_tokens, out_runs, out_cap) }?;
        check_out(out_n_runs, "out_n_runs")?;
        check_out(out_len, "out_len")?;
        let mut runs = Vec::new();
        let m = c.cache.match_prefix(ns, t, &mut runs);
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
        if fits {
            Ok(())
        } else {
            Err(too_small_runs(out_cap, runs.len(), m, "; out_cap = n_tokens always suffices"))
        }
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
    boundary("rkv_match_lock_runs", || {
        // SAFETY: the caller's contract for these arguments is `runs_args`'.
        let (c, t) = unsafe { runs_args(cache, tokens, n_tokens, out_runs, out_cap) }?;
        check_out(out_n_runs, "out_n_runs")?;
        check_out(out_len, "out_len")?;
        check_out(out_lock, "out_lock")?;
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
                return Err(too_small_runs(
                    out_cap,
                    runs.len(),
                    m,
                    "; nothing was pinned (pass out_cap = n_tokens)",
                ));
            }
        }
        let handle = reserve_handle(c)?;
        let guard = c.cache.match_and_lock(ns, t, &mut runs);
        let m = guard.len();
        if runs.len() > out_cap {
            // Grown since the check (a racing insert): nothing stays pinned.
            drop(guard);
            // SAFETY: both passed `check_out`; the caller guarantees they are writable.
            unsafe {
                out_n_runs.write(runs.len());
                out_len.write(m);
            }
            let why = "; a concurrent insert grew the match during the call; nothing was pinned";
            return Err(too_small_runs(out_cap, runs.len(), m, why));
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
/// NULL when `n_tokens == 0`. Priority 0 (`rkv_insert_ex` takes one). Thread-safe.
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
    boundary("rkv_insert", || {
        // SAFETY: the caller's contract is `insert_body`'s, and a NULL `opts` is allowed.
        unsafe { insert_body(cache, ns, tokens, slots, n_tokens, std::ptr::null(), out_existing) }
    })
}

/// `rkv_insert` with per-insert options (an extension of version 1): `*opts` (NULL: the
/// defaults, which make this `rkv_insert`) carries the insert's eviction priority (an
/// `int64_t` that must fit an `int32_t`, else `RKV_INVALID_ARGUMENT` and nothing changes)
/// and what the same request inserted before (`inserted_len`, for the hit counts of
/// `RKV_EVICT_LFU` and `RKV_EVICT_SLRU`); see `rkv_insert_options`. `opts` is only read
/// during the call. Everything else as `rkv_insert`. Thread-safe.
///
/// # Safety
/// As `rkv_insert`; `opts` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert_ex(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
) -> rkv_status {
    boundary("rkv_insert_ex", || {
        // SAFETY: the caller's contract is `insert_body`'s.
        unsafe { insert_body(cache, ns, tokens, slots, n_tokens, opts, out_existing) }
    })
}

/// The body of `rkv_insert` and `rkv_insert_ex`, inside their panic boundary.
///
/// # Safety
/// As `rkv_insert_ex`.
unsafe fn insert_body(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
) -> Res<()> {
    // SAFETY: the caller passes NULL or a live cache that is not being freed.
    let c = unsafe { cache_ref(cache) }?;
    // SAFETY: the caller guarantees both arrays are readable for n_tokens (or NULL).
    let (t, s) = unsafe { insert_arrays(tokens, slots, n_tokens) }?;
    check_opt_in(opts, "opts")?;
    check_out(out_existing, "out_existing")?;
    // SAFETY: NULL or aligned (`check_opt_in`), and readable by the caller's contract.
    let o = unsafe { insert_options(opts) }?;
    let existing = c
        .cache
        .insert_with(ns, t, s, o)
        .map_err(|e| slot_refusal(e, &("slots", s), c.cache.pool()))?;
    // SAFETY: `out_existing` passed `check_out`; writable by the caller's contract.
    unsafe { out_existing.write(existing) };
    Ok(())
}

/// `rkv_insert`, and pin `tokens[0..n]` (n cut down to a multiple of page_size) atomically
/// with it; the lock goes to `*out_lock` (required), owned by the caller, to be released
/// once with `rkv_release`. For chunked prefill: release the previous chunk's lock after
/// this succeeds. Priority 0 (`rkv_insert_lock_ex` takes one). Thread-safe.
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
    boundary("rkv_insert_lock", || {
        let none = std::ptr::null();
        // SAFETY: the caller's contract is `insert_lock_body`'s, and a NULL `opts` is allowed.
        unsafe {
            insert_lock_body(cache, ns, tokens, slots, n_tokens, none, out_existing, out_lock)
        }
    })
}

/// `rkv_insert_lock` with per-insert options, as `rkv_insert_ex` (an extension of version
/// 1): `*opts` (NULL: the defaults) carries the priority and `inserted_len`; a priority
/// outside `int32_t` is `RKV_INVALID_ARGUMENT`, and then nothing is inserted or pinned.
/// The lock goes to `*out_lock` (required), owned by the caller, to be released once with
/// `rkv_release`. Thread-safe.
///
/// # Safety
/// As `rkv_insert_lock`; `opts` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert_lock_ex(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary("rkv_insert_lock_ex", || {
        // SAFETY: the caller's contract is `insert_lock_body`'s.
        unsafe {
            insert_lock_body(cache, ns, tokens, slots, n_tokens, opts, out_existing, out_lock)
        }
    })
}

/// The body of `rkv_insert_lock` and `rkv_insert_lock_ex`, inside their panic boundary.
///
/// # Safety
/// As `rkv_insert_lock_ex`.
#[allow(clippy::too_many_arguments)]
unsafe fn insert_lock_body(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
    out_lock: *mut rkv_lock,
) -> Res<()> {
    // SAFETY: the caller passes NULL or a live cache that is not being freed.
    let c = unsafe { cache_ref(cache) }?;
    // SAFETY: the caller guarantees both arrays are readable for n_tokens (or NULL).
    let (t, s) = unsafe { insert_arrays(tokens, slots, n_tokens) }?;
    check_opt_in(opts, "opts")?;
    check_out(out_existing, "out_existing")?;
    check_out(out_lock, "out_lock")?;
    // SAFETY: NULL or aligned (`check_opt_in`), and readable by the caller's contract.
    let o = unsafe { insert_options(opts) }?;
    let handle = reserve_handle(c)?;
    let (existing, guard) = c
        .cache
        .insert_and_lock(ns, t, s, o)
        .map_err(|e| slot_refusal(e, &("slots", s), c.cache.pool()))?;
    let handle = handle.fill(guard.into_raw());
    // SAFETY: both passed `check_out`; writable by the caller's contract.
    unsafe {
        out_existing.write(existing);
        out_lock.write(handle);
    }
    Ok(())
}

/// `rkv_insert` with the slots given as runs of consecutive slots (an extension of version
/// 1): `runs[0..n_runs]` name the tokens' slots in token order (their lengths must add up to
/// `n_tokens`, and no run may be empty or reach past slot id 2^32 - 1: else
/// `RKV_INVALID_ARGUMENT`, changing nothing). As `rkv_alloc_runs` hands them out, so the
/// pool step and the new leaf take O(runs) instead of O(tokens). Everything else as
/// `rkv_insert`: in pool mode the runs past `*out_existing` (up to n) are adopted and the
/// other given slots go back to the pool, except those equal to the cached slot at their
/// position. Arrays stay owned by the caller; either may be NULL when its count is 0.
/// Priority 0 (`rkv_insert_runs_ex` takes one). Thread-safe.
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
    boundary("rkv_insert_runs", || {
        let none = std::ptr::null();
        // SAFETY: the caller's contract is `insert_runs_body`'s, and a NULL `opts` is allowed.
        unsafe { insert_runs_body(cache, ns, tokens, n_tokens, runs, n_runs, none, out_existing) }
    })
}

/// `rkv_insert_runs` with per-insert options, as `rkv_insert_ex` (an extension of version
/// 1): `*opts` (NULL: the defaults) carries the priority and `inserted_len`; a priority
/// outside `int32_t` is `RKV_INVALID_ARGUMENT`, changing nothing. Thread-safe.
///
/// # Safety
/// As `rkv_insert_runs`; `opts` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert_runs_ex(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    runs: *const rkv_slot_run,
    n_runs: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
) -> rkv_status {
    boundary("rkv_insert_runs_ex", || {
        // SAFETY: the caller's contract is `insert_runs_body`'s.
        unsafe { insert_runs_body(cache, ns, tokens, n_tokens, runs, n_runs, opts, out_existing) }
    })
}

/// The body of `rkv_insert_runs` and `rkv_insert_runs_ex`, inside their panic boundary.
///
/// # Safety
/// As `rkv_insert_runs_ex`.
#[allow(clippy::too_many_arguments)]
unsafe fn insert_runs_body(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    runs: *const rkv_slot_run,
    n_runs: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
) -> Res<()> {
    // SAFETY: the caller passes NULL or a live cache that is not being freed.
    let c = unsafe { cache_ref(cache) }?;
    // SAFETY: the caller guarantees both arrays are readable for their counts (or NULL).
    let (t, r) = unsafe { insert_runs_arrays(tokens, n_tokens, runs, n_runs) }?;
    check_opt_in(opts, "opts")?;
    check_out(out_existing, "out_existing")?;
    // SAFETY: NULL or aligned (`check_opt_in`), and readable by the caller's contract.
    let o = unsafe { insert_options(opts) }?;
    let existing = c.cache.insert_with(ns, t, r, o).map_err(|e| runs_refusal(e, c, r, t.len()))?;
    // SAFETY: `out_existing` passed `check_out`; writable by the caller's contract.
    unsafe { out_existing.write(existing) };
    Ok(())
}

/// `rkv_insert_lock` with the slots given as runs, as in `rkv_insert_runs` (an extension of
/// version 1). The lock goes to `*out_lock` (required), owned by the caller, to be released
/// once with `rkv_release`. Priority 0 (`rkv_insert_lock_runs_ex` takes one). Thread-safe.
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
    boundary("rkv_insert_lock_runs", || {
        let none = std::ptr::null();
        let (out, lock) = (out_existing, out_lock);
        // SAFETY: the caller's contract is `insert_lock_runs_body`'s, and a NULL `opts` is
        // allowed.
        unsafe { insert_lock_runs_body(cache, ns, tokens, n_tokens, runs, n_runs, none, out, lock) }
    })
}

/// `rkv_insert_lock_runs` with per-insert options, as `rkv_insert_ex` (an extension of
/// version 1): `*opts` (NULL: the defaults) carries the priority and `inserted_len`; a
/// priority outside `int32_t` is `RKV_INVALID_ARGUMENT`, and then nothing is inserted or
/// pinned. The lock goes to `*out_lock` (required), owned by the caller, to be released
/// once with `rkv_release`. Thread-safe.
///
/// # Safety
/// As `rkv_insert_lock_runs`; `opts` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert_lock_runs_ex(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    runs: *const rkv_slot_run,
    n_runs: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary("rkv_insert_lock_runs_ex", || {
        let (out, lock) = (out_existing, out_lock);
        // SAFETY: the caller's contract is `insert_lock_runs_body`'s.
        unsafe { insert_lock_runs_body(cache, ns, tokens, n_tokens, runs, n_runs, opts, out, lock) }
    })
}

/// The body of `rkv_insert_lock_runs` and `rkv_insert_lock_runs_ex`, inside their panic
/// boundary.
///
/// # Safety
/// As `rkv_insert_lock_runs_ex`.
#[allow(clippy::too_many_arguments)]
unsafe fn insert_lock_runs_body(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    runs: *const rkv_slot_run,
    n_runs: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
    out_lock: *mut rkv_lock,
) -> Res<()> {
    // SAFETY: the caller passes NULL or a live cache that is not being freed.
    let c = unsafe { cache_ref(cache) }?;
    // SAFETY: the caller guarantees both arrays are readable for their counts (or NULL).
    let (t, r) = unsafe { insert_runs_arrays(tokens, n_tokens, runs, n_runs) }?;
    check_opt_in(opts, "opts")?;
    check_out(out_existing, "out_existing")?;
    check_out(out_lock, "out_lock")?;
    // SAFETY: NULL or aligned (`check_opt_in`), and readable by the caller's contract.
    let o = unsafe { insert_options(opts) }?;
    let handle = reserve_handle(c)?;
    let (existing, lock) = c
        .cache
        .insert_and_lock(ns, t, r, o)
        .map(|(e, l)| (e, l.into_raw()))
        .map_err(|e| runs_refusal(e, c, r, t.len()))?;
    let handle = handle.fill(lock);
    // SAFETY: both passed `check_out`; writable by the caller's contract.
    unsafe {
        out_existing.write(existing);
        out_lock.write(handle);
    }
    Ok(())
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
    boundary("rkv_lock_len", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_len, "out_len")?;
        let n = c.locks.with(lock, |l| l.len()).ok_or_else(|| invalid_lock(c, lock))?;
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
    boundary("rkv_release", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        let l = c.locks.remove(lock).ok_or_else(|| invalid_lock(c, lock))?;
        c.cache.release(l).map_err(|e| fail(rkv_status::from(&e), format!("lock {lock:#x}: {e}")))
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
    unsafe { evict_into("rkv_evict", cache, out_evicted, "out_evicted", free_fn.is_some(), evict) }
}

/// The body `rkv_evict`, `rkv_evict_runs` and `rkv_drop_namespace` share, inside the panic
/// boundary: checks `cache` and `out_evicted` (the argument `out_name`), refuses a missing callback without a pool
/// (`RKV_NULL_ARGUMENT`), runs `evict`, and writes the count freed only on success.
///
/// # Safety
/// `cache` is NULL or live; `out_evicted` NULL or writable.
unsafe fn evict_into(
    function: &str,
    cache: *const rkv_cache,
    out_evicted: *mut usize,
    out_name: &str,
    has_callback: bool,
    evict: impl FnOnce(&Cache) -> radixkv_core::error::Result<usize>,
) -> rkv_status {
    boundary(function, || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_evicted, out_name)?;
        if !has_callback && !c.cache.has_pool() {
            return Err(fail(
                rkv_status::RKV_NULL_ARGUMENT,
                "free_fn is NULL, but this cache has no pool (pool_slots = 0): the evicted \
                 slots go back to the caller, through free_fn",
            ));
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
    unsafe {
        evict_into("rkv_evict_runs", cache, out_evicted, "out_evicted", free_fn.is_some(), evict)
    }
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
    boundary("rkv_alloc", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        if n_slots > 0 && out_slots.is_null() {
            return Err(fail(
                rkv_status::RKV_NULL_ARGUMENT,
                format!("out_slots is NULL but n_slots = {n_slots} (NULL is allowed only with 0)"),
            ));
        }
        if !c.cache.has_pool() {
            return Err(no_pool());
        }
        let pool_slots = c.cache.options().pool_slots;
        if n_slots > pool_slots {
            // More than the whole pool: short whatever is evicted (and no buffer that
            // large can exist), so fail before touching anything.
            return Err(more_than_pool(n_slots, pool_slots));
        }
        check_out_array(out_slots, n_slots, "out_slots", "n_slots")?;
        // The pool hands slots out as runs: take them as runs (a few entries, in a vector
        // this thread keeps) and expand them once into the caller's buffer, instead of
        // growing a vector of `n_slots` and copying it.
        thread_local! {
            static RUNS: Cell<Vec<SlotRun>> = const { Cell::new(Vec::new()) };
        }
        let mut runs = RUNS.take();
        runs.clear();
        let got = c.cache.alloc_runs(n_slots, &mut runs).map_err(|e| alloc_refusal(e, c, n_slots));
        let given: usize = runs.iter().map(|r| r.len as usize).sum();
        let res = match got {
            Err(e) => Err(e),
            Ok(()) if given != n_slots => {
                // Not the contract of `Cache::alloc_runs`: give them back and report the bug.
                let _ = c.cache.free_runs(&runs);
                Err(fail(
                    rkv_status::RKV_INTERNAL_ERROR,
                    format!(
                        "internal error: {given} slots came back for n_slots = {n_slots} (a \
                         bug, please report it); they went back to the pool"
                    ),
                ))
            }
            Ok(()) => {
                let mut at = 0;
                for r in &runs {
                    // SAFETY: `out_slots` passed `check_out_array` with cap `n_slots`, and
                    // the runs add up to `n_slots`, so `at + r.len <= n_slots`.
                    let d = unsafe {
                        std::slice::from_raw_parts_mut(out_slots.add(at), r.len as usize)
                    };
                    for (x, k) in d.iter_mut().zip(0u32..) {
                        *x = r.start + k;
                    }
                    at += r.len as usize;
                }
                Ok(())
            }
        };
        RUNS.set(runs);
        res
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
    boundary("rkv_free", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees slots[0..n_slots] is readable (or NULL).
        let s = unsafe { input(slots, n_slots, "slots", "n_slots") }?;
        let Some(pool) = c.cache.pool() else { return Err(no_pool()) };
        c.cache.free(s).map_err(|e| slot_refusal(e, &("slots", s), Some(pool)))
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
    boundary("rkv_alloc_runs", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out_array(out_runs, out_cap, "out_runs", "out_cap")?;
        check_out(out_n_runs, "out_n_runs")?;
        if !c.cache.has_pool() {
            return Err(no_pool());
        }
        let pool_slots = c.cache.options().pool_slots;
        if n_slots > pool_slots {
            return Err(more_than_pool(n_slots, pool_slots));
        }
        let mut runs = Vec::new();
        c.cache.alloc_runs(n_slots, &mut runs).map_err(|e| alloc_refusal(e, c, n_slots))?;
        let got = runs.iter().map(|r| r.len as usize).sum::<usize>();
        if got != n_slots {
            // Not the contract of `Cache::alloc_runs`: give them back and report the bug.
            let _ = c.cache.free_runs(&runs);
            return Err(fail(
                rkv_status::RKV_INTERNAL_ERROR,
                format!(
                    "internal error: {got} slots came back for n_slots = {n_slots} (a bug, \
                     please report it); they went back to the pool"
                ),
            ));
        }
        if runs.len() > out_cap {
            c.cache.free_runs(&runs).map_err(|e| {
                let m = format!("internal error: giving back an allocation failed: {e} (a bug)");
                fail(rkv_status::RKV_INTERNAL_ERROR, m)
            })?;
            // SAFETY: passed `check_out`; writable by the caller's contract.
            unsafe { out_n_runs.write(runs.len()) };
            return Err(fail(
                rkv_status::RKV_BUFFER_TOO_SMALL,
                format!(
                    "out_cap = {out_cap} is smaller than the {} runs the {n_slots} slots came \
                     in (*out_n_runs = {}); the slots went back to the pool; out_cap = \
                     n_slots / page_size = {} always suffices",
                    runs.len(),
                    runs.len(),
                    n_slots / c.cache.page_size()
                ),
            ));
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
    boundary("rkv_free_runs", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees runs[0..n_runs] is readable (or NULL).
        let r = unsafe { input_runs(runs, n_runs, "runs", "n_runs") }?;
        let Some(pool) = c.cache.pool() else { return Err(no_pool()) };
        c.cache.free_runs(r).map_err(|e| {
            if let Some((i, x)) = r.iter().enumerate().find(|(_, x)| x.len == 0) {
                let m = format!("runs[{i}] = {{start {}, len 0}} is empty", x.start);
                return fail(rkv_status::RKV_INVALID_ARGUMENT, m);
            }
            slot_refusal(e, &("runs", r), Some(pool))
        })
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
    boundary("rkv_cache_stats", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_stats, "out_stats")?;
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
    boundary("rkv_cache_reset", || {
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
    boundary("rkv_reclaim", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        c.cache.reclaim();
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Namespaces (an extension of version 1).

/// Counts of one namespace (`rkv_cache_namespace_stats`), an extension of version 1. A plain
/// value owned by the caller. Under concurrent calls each field is read atomically but the
/// fields are not one atomic snapshot; at quiescence
/// `cached_tokens == evictable_tokens + protected_tokens`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rkv_namespace_stats {
    /// Tokens cached in the namespace.
    pub cached_tokens: u64,
    /// Cached and not pinned by any lock.
    pub evictable_tokens: u64,
    /// Cached and pinned.
    pub protected_tokens: u64,
    /// Tree nodes (edges) of the namespace, its root excluded.
    pub nodes: u64,
}

/// Evicts every unpinned page of namespace `ns` (a tenant offboarded, a LoRA adapter
/// unloaded) and writes the count of tokens freed to `*out_freed` (required); an extension
/// of version 1. Pinned pages stay cached until their locks are released (a later call
/// drops them then). An unknown namespace, or one with nothing evictable, frees nothing:
/// `*out_freed = 0` and `RKV_OK`, not an error. A namespace whose last page goes is
/// reclaimed (`rkv_namespace_count` no longer counts it); inserting into it again later
/// simply recreates it. Slots exactly as `rkv_evict`: `free_fn(ctx, slots, n)` receives
/// every freed slot exactly once, on this thread, before the call returns, and the slots
/// then belong to the caller (caller-managed mode); in pool mode the slots go back to the
/// pool and `free_fn` may be NULL (if given, it is told about them but must not free them
/// again). Without a pool a NULL `free_fn` is `RKV_NULL_ARGUMENT`. `free_fn` must return
/// normally and must not call into the same cache. Other namespaces are not touched.
/// Thread-safe (concurrent inserts into `ns` may leave new pages cached).
///
/// # Safety
/// `cache` is NULL or live; `free_fn` NULL or a function safe to call with `ctx` and a
/// slot array; `out_freed` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_drop_namespace(
    cache: *const rkv_cache,
    ns: u64,
    free_fn: rkv_free_fn,
    ctx: *mut c_void,
    out_freed: *mut usize,
) -> rkv_status {
    let drop_ns = |cache: &Cache| match free_fn {
        None => cache.drop_namespace(ns, None),
        Some(f) => {
            let mut tell = |slots: &[u32]| {
                if !slots.is_empty() {
                    // SAFETY: the caller guarantees `f` may be called with `ctx` and an
                    // array; `slots` is a live slice for the duration of the call.
                    unsafe { f(ctx, slots.as_ptr(), slots.len()) }
                }
            };
            cache.drop_namespace(ns, Some(&mut tell))
        }
    };
    // SAFETY: the caller's contract for `cache` and `out_freed` is `evict_into`'s.
    unsafe {
        evict_into("rkv_drop_namespace", cache, out_freed, "out_freed", free_fn.is_some(), drop_ns)
    }
}

/// Writes the counts of namespace `ns` to `*out_stats` (required, owned by the caller); an
/// extension of version 1. An unknown namespace (never used, or reclaimed after its last
/// page went) is all zeros and `RKV_OK`, not an error. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_stats` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_namespace_stats(
    cache: *const rkv_cache,
    ns: u64,
    out_stats: *mut rkv_namespace_stats,
) -> rkv_status {
    boundary("rkv_cache_namespace_stats", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_stats, "out_stats")?;
        let s = c.cache.namespace_stats(ns);
        let s = rkv_namespace_stats {
            cached_tokens: s.cached_tokens,
            evictable_tokens: s.evictable_tokens,
            protected_tokens: s.protected_tokens,
            nodes: s.nodes,
        };
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_stats.write(s) };
        Ok(())
    })
}

/// Writes the number of live namespaces (those with at least one cached page; an empty
/// namespace is reclaimed) to `*out_count` (required); an extension of version 1 (the count
/// is not a field of `rkv_stats`, whose size version 1 fixes). Exact at quiescence; under
/// concurrent calls a count of that moment. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_count` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_namespace_count(
    cache: *const rkv_cache,
    out_count: *mut u64,
) -> rkv_status {
    boundary("rkv_namespace_count", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_count, "out_count")?;
        let n = c.cache.tree().namespace_count();
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_count.write(n) };
        Ok(())
    })
}

#[cfg(test)]
mod error_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_internal_error() {
        assert_eq!(boundary("f", || panic!("a bug")), rkv_status::RKV_INTERNAL_ERROR);
        assert_eq!(boundary("f", || Ok(())), rkv_status::RKV_OK);
        assert_eq!(boundary("f", || Err(no_pool())), rkv_status::RKV_NO_POOL);
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
            (Error::Io("x".into()), 10),
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
            if (0..=10).contains(&code) {
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
    fn matches_write_in_place_or_through_a_copy_with_the_same_result() {
        let mut o = rkv_options_default();
        o.pool_slots = 64;
        let mut c = std::ptr::null_mut();
        // SAFETY: every pointer below points to a live local of the stated length.
        unsafe {
            assert_eq!(rkv_cache_new(&o, &mut c), rkv_status::RKV_OK);
            let tokens: Vec<u32> = (100..120).collect();
            let mut slots = vec![0u32; 20];
            assert_eq!(rkv_alloc(c, 20, slots.as_mut_ptr()), rkv_status::RKV_OK);
            // The runs the pool handed out, expanded: 20 distinct slots of the pool.
            let mut sorted = slots.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert!(sorted.len() == 20 && sorted[19] < 64, "{slots:?}");
            let mut s = std::mem::zeroed();
            assert_eq!(rkv_cache_stats(c, &mut s), rkv_status::RKV_OK);
            assert_eq!(s.free_slots, 44);
            let mut existing = 9;
            let st = rkv_insert(c, 0, tokens.as_ptr(), slots.as_ptr(), 20, &mut existing);
            assert_eq!((st, existing), (rkv_status::RKV_OK, 0));
            let query: Vec<u32> = (100..110).chain([7, 8, 9]).collect();
            // In place: a buffer that holds any match, apart from the query.
            let mut out = vec![u32::MAX; 13];
            let mut len = 0;
            let st = rkv_match(c, 0, query.as_ptr(), 13, out.as_mut_ptr(), 13, &mut len);
            assert_eq!((st, len), (rkv_status::RKV_OK, 10));
            assert_eq!(&out[..10], &slots[..10]);
            // The query's own array as the output (overlapping): the copying path, same answer.
            let mut both = query.clone();
            let st = rkv_match(c, 0, both.as_ptr(), 13, both.as_mut_ptr(), 13, &mut len);
            assert_eq!((st, len), (rkv_status::RKV_OK, 10));
            assert_eq!(&both[..10], &slots[..10]);
            // The locking match, both ways; each lock pins the 10 tokens.
            let mut out = vec![u32::MAX; 13];
            let mut lock = 0;
            let p = out.as_mut_ptr();
            let st = rkv_match_lock(c, 0, query.as_ptr(), 13, p, 13, &mut len, &mut lock);
            assert_eq!((st, len), (rkv_status::RKV_OK, 10));
            assert_eq!(&out[..10], &slots[..10]);
            let mut both = query.clone();
            let mut lock2 = 0;
            let (q, p) = (both.as_ptr(), both.as_mut_ptr());
            let st = rkv_match_lock(c, 0, q, 13, p, 13, &mut len, &mut lock2);
            assert_eq!((st, len), (rkv_status::RKV_OK, 10));
            assert_eq!(&both[..10], &slots[..10]);
            assert_eq!(rkv_cache_stats(c, &mut s), rkv_status::RKV_OK);
            assert_eq!((s.protected_tokens, s.cached_tokens), (10, 20));
            assert_eq!(rkv_release(c, lock), rkv_status::RKV_OK);
            assert_eq!(rkv_release(c, lock2), rkv_status::RKV_OK);
            assert_eq!(rkv_cache_stats(c, &mut s), rkv_status::RKV_OK);
            assert_eq!(s.protected_tokens, 0);
            rkv_cache_free(c);
        }
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
                rkv_options { eviction_policy: 7, ..ok },
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

    #[test]
    fn every_policy_has_its_number_and_name() {
        let mut numbers: Vec<u32> = EvictionPolicy::ALL.map(|p| c_policy(p) as u32).into();
        numbers.sort_unstable();
        assert_eq!(numbers, (0..7).collect::<Vec<u32>>(), "numbers 0.. without a gap");
        assert_eq!(c_policy(EvictionPolicy::Lru) as u32, 0);
        assert_eq!(c_policy(EvictionPolicy::Fifo) as u32, 1);
        for p in EvictionPolicy::ALL {
            let n = c_policy(p) as u32;
            assert_eq!(policy_of(n), Some(p));
            assert_eq!(policy_cname(p).to_str().unwrap(), p.name());
            // SAFETY: a non-NULL result is a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(rkv_eviction_policy_name(n)) };
            assert_eq!(name.to_str().unwrap(), p.name());
            let mut got = u32::MAX;
            let upper = std::ffi::CString::new(p.name().to_uppercase()).unwrap();
            // SAFETY: a live NUL-terminated string and a live local.
            let st = unsafe { rkv_eviction_policy_from_name(upper.as_ptr(), &mut got) };
            assert_eq!((st, got), (rkv_status::RKV_OK, n));
        }
        assert!(rkv_eviction_policy_name(7).is_null());
        assert!(rkv_eviction_policy_name(u32::MAX).is_null());
        let list = valid_policies();
        assert!(list.starts_with("0 = RKV_EVICT_LRU, 1 = RKV_EVICT_FIFO, 2 = RKV_EVICT_LFU"));
        assert!(list.ends_with("6 = RKV_EVICT_SLRU"), "{list}");
    }

    #[test]
    fn the_versioned_structs_default_to_their_size() {
        let p = rkv_policy_options_default();
        assert_eq!((p.size, p.slru_threshold), (8, 2));
        let i = rkv_insert_options_default();
        assert_eq!((i.size, i.reserved, i.priority, i.inserted_len), (24, 0, 0, 0));
        // SAFETY: `i` is a live local.
        assert_eq!(unsafe { insert_options(&i) }.ok(), Some(InsertOptions::default()));
        // SAFETY: NULL is allowed.
        assert_eq!(
            unsafe { insert_options(std::ptr::null()) }.ok(),
            Some(InsertOptions::default())
        );
        let wide = rkv_insert_options { priority: -5, inserted_len: u64::MAX, ..i };
        // SAFETY: `wide` is a live local.
        let o = unsafe { insert_options(&wide) }.ok().unwrap();
        assert_eq!((o.priority, o.inserted_len), (-5, usize::MAX));
    }

    #[test]
    fn cache_new_with_sets_the_policy_and_its_threshold() {
        let mut c = std::ptr::null_mut();
        let (mut pol, mut thr) = (u32::MAX, u32::MAX);
        // SAFETY: every pointer is NULL or points to a live local.
        unsafe {
            let o = rkv_options {
                eviction_policy: rkv_eviction_policy::RKV_EVICT_SLRU as u32,
                ..rkv_options_default()
            };
            let p = rkv_policy_options { slru_threshold: 5, ..rkv_policy_options_default() };
            assert_eq!(rkv_cache_new_with(&o, &p, &mut c), rkv_status::RKV_OK);
            assert_eq!(rkv_cache_eviction_policy(c, &mut pol, &mut thr), rkv_status::RKV_OK);
            assert_eq!((pol, thr), (6, 5));
            assert_eq!(c.as_ref().unwrap().cache.options().slru_threshold, 5);
            rkv_cache_free(c);
            assert_eq!(rkv_cache_new_with(&o, std::ptr::null(), &mut c), rkv_status::RKV_OK);
            assert_eq!(rkv_cache_eviction_policy(c, &mut pol, &mut thr), rkv_status::RKV_OK);
            assert_eq!((pol, thr), (6, RKV_DEFAULT_SLRU_THRESHOLD));
            rkv_cache_free(c);
        }
    }
}
