//! Argument checks: the cache pointer, input and output arrays, single outputs, the versioned
//! option structs; each refusal names the argument and the value.

use radixkv_core::error::Error;
use radixkv_core::slot_run::SlotRun;
use radixkv_core::tree::{InsertOptions, PrefixLock, checked_priority};

use crate::boundary::{Fail, Res, fail, st};
use crate::handles::{self, Reserved};
use crate::types::{rkv_cache, rkv_insert_options, rkv_lock, rkv_slot_run, rkv_status};

/// The cache behind `p`.
///
/// # Safety
/// `p` is NULL or was returned by `rkv_cache_new` and not yet freed, and no
/// `rkv_cache_free` of it runs during `'a`.
pub(crate) unsafe fn cache_ref<'a>(p: *const rkv_cache) -> Res<&'a rkv_cache> {
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
pub(crate) fn check_array<T>(p: *const T, len: usize, name: &str, len_name: &str) -> Res<()> {
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
pub(crate) unsafe fn input<'a, T>(
    p: *const T,
    len: usize,
    name: &str,
    len_name: &str,
) -> Res<&'a [T]> {
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
pub(crate) unsafe fn input_runs<'a>(
    p: *const rkv_slot_run,
    len: usize,
    name: &str,
    len_name: &str,
) -> Res<&'a [SlotRun]> {
    // SAFETY: `rkv_slot_run` has `SlotRun`'s layout (asserted in `types.rs`); the caller's contract
    // is `input`'s.
    unsafe { input(p.cast::<SlotRun>(), len, name, len_name) }
}

/// Checks an output array `name` of capacity `cap` (its capacity argument `cap_name`):
/// NULL is allowed when `cap == 0`.
pub(crate) fn check_out_array<T>(p: *mut T, cap: usize, name: &str, cap_name: &str) -> Res<()> {
    check_array(p.cast_const(), cap, name, cap_name)
}

/// Checks a required single output `name`.
pub(crate) fn check_out<T>(p: *mut T, name: &str) -> Res<()> {
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
pub(crate) unsafe fn write_array<T: Copy>(dst: *mut T, src: &[T]) {
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
pub(crate) fn reserve_handle(c: &rkv_cache) -> Res<Reserved<'_, PrefixLock>> {
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
pub(crate) fn disjoint(a: *const u32, na: usize, b: *const u32, nb: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    let end = |p: usize, n: usize| p.saturating_add(n.saturating_mul(4));
    end(a, na) <= b || end(b, nb) <= a
}

/// Why `lock` is refused by `c` (`RKV_INVALID_LOCK`).
pub(crate) fn invalid_lock(c: &rkv_cache, lock: rkv_lock) -> Fail {
    let why = c.locks.explain(lock);
    fail(rkv_status::RKV_INVALID_LOCK, format!("lock {lock:#x} {why}"))
}

/// Checks an optional input struct `name`: NULL is allowed; otherwise it must be aligned.
pub(crate) fn check_opt_in<T>(p: *const T, name: &str) -> Res<()> {
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
pub(crate) unsafe fn read_sized<T: Copy>(p: *const T, name: &str, type_name: &str) -> Res<T> {
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
pub(crate) unsafe fn insert_options(p: *const rkv_insert_options) -> Res<InsertOptions> {
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

/// The cache behind `p`, exclusively.
///
/// # Safety
/// `p` is NULL or was returned by `rkv_cache_new` and not yet freed, and no other call on
/// it runs during `'a`.
pub(crate) unsafe fn cache_mut<'a>(p: *mut rkv_cache) -> Res<&'a mut rkv_cache> {
    // SAFETY: the caller's contract includes `cache_ref`'s; that checks NULL and alignment.
    unsafe { cache_ref(p) }?;
    // SAFETY: non-null, aligned, live (checked and promised above), and by the caller's
    // contract nothing else uses the cache during 'a, so this is the only reference.
    Ok(unsafe { &mut *p })
}
