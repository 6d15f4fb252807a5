//! The request cycle (an extension of version 1): the core's `Request` (admit, extend,
//! checkpoint, finish, abort) behind an opaque `rkv_request`, kept between calls as a
//! `DetachedRequest` and attached to its cache for the length of each call, as the Python
//! extension's `Cache.admit` does.
//!
//! Each handle's state is shared with its cache's table of live requests: `rkv_cache_free`
//! aborts every request still live (its slots back in the pool, its pin released) and
//! empties its state, so a later call on the handle is refused (`RKV_INVALID_ARGUMENT`)
//! without touching the freed cache, and `rkv_request_abort` just frees the handle.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use radixkv_core::cache::{Cache, DetachedRequest, Request};
use radixkv_core::error::Error;
use radixkv_core::tree::checked_priority;

use crate::args::{cache_ref, check_out, check_out_array, input, write_array};
use crate::boundary::{Res, boundary, fail, no_pool, st};
use crate::types::{rkv_cache, rkv_status};

/// One request's state: `None` once its cache was freed (which aborted it).
type Cell = Arc<Mutex<Option<DetachedRequest>>>;

fn lk<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the state consistent (a take or a put): a panic in one
    // leaves nothing half-done.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The live requests of one cache, by id.
#[derive(Default)]
pub(crate) struct Requests {
    live: Mutex<HashMap<u64, Cell>>,
    next: AtomicU64,
}

impl Requests {
    /// Aborts every request still live (the cache is being freed) and empties their state.
    pub(crate) fn abort_all(&self, c: &Cache) {
        let all: Vec<Cell> = lk(&self.live).drain().map(|(_, s)| s).collect();
        for s in all {
            if let Some(d) = lk(&s).take()
                && let Ok(r) = c.attach(d)
            {
                r.abort();
            }
        }
    }
}

/// A request admitted by `rkv_request_admit`: an opaque object the caller owns until
/// `rkv_request_finish` or `rkv_request_abort` (exactly one of them) consumes and frees it.
/// Its calls are thread-safe (calls on one request run one at a time); like every call on
/// its cache, none but `rkv_request_abort` may run concurrently with `rkv_cache_free` of
/// that cache.
pub struct rkv_request {
    cache: *const rkv_cache,
    id: u64,
    state: Cell,
}

/// What a request holds now (`rkv_request_info_get`): a plain value the caller owns.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rkv_request_info {
    /// Tokens so far (the prompt, then whatever `rkv_request_extend` added); also the
    /// number of slots `rkv_request_slots` writes.
    pub len: usize,
    /// Tokens found cached at admission: their KV need not be computed.
    pub cached_len: usize,
    /// Tokens pinned in the tree for this request: `slots[0..locked_len]` belong to the
    /// tree, the rest to the request until it is finished or aborted.
    pub locked_len: usize,
    /// The namespace it was admitted in.
    pub ns: u64,
}

/// The request behind `p`, checked.
///
/// # Safety
/// `p` is NULL or was returned by `rkv_request_admit` and not consumed yet.
unsafe fn req_ref<'a>(p: *const rkv_request) -> Res<&'a rkv_request> {
    if p.is_null() {
        return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "req is NULL"));
    }
    if !p.is_aligned() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("req = {p:p} is misaligned: not a pointer rkv_request_admit returned"),
        ));
    }
    // SAFETY: non-null and aligned; by the caller's contract a live `rkv_request` made by
    // `rkv_request_admit` (a `Box`), not consumed during 'a.
    Ok(unsafe { &*p })
}

fn freed() -> crate::boundary::Fail {
    fail(
        rkv_status::RKV_INVALID_ARGUMENT,
        "the request's cache was freed (rkv_cache_free aborted the request): only \
         rkv_request_abort (which frees the handle) is left to call",
    )
}

impl rkv_request {
    /// Runs `f` on the request attached to its cache and puts it back (on an error too:
    /// the core's calls change nothing then).
    fn with<T>(&self, f: impl FnOnce(&mut Request<'_>) -> Res<T>) -> Res<T> {
        // Held for the whole call: `rkv_cache_free` takes every live request's state before
        // it frees anything, so it waits for this call, and a call after it finds `None`.
        let mut g = lk(&self.state);
        let d = g.take().ok_or_else(freed)?;
        // SAFETY: the state was `Some`, so its cache has not been freed (`rkv_cache_free`
        // empties it first, and waits for this guard).
        let c = unsafe { &*self.cache };
        let mut r = c.cache.attach(d).map_err(|_| {
            fail(rkv_status::RKV_INTERNAL_ERROR, "a request of another cache (a bug)")
        })?;
        let out = f(&mut r);
        *g = Some(r.detach());
        out
    }

    /// Takes the request out of its cache's table and runs `f` on it attached (it is
    /// consumed). Refused with `freed()` once the cache was freed.
    fn consume<T>(self, f: impl FnOnce(Request<'_>) -> Res<T>) -> Res<T> {
        // Held to the end, as in `with`: an `rkv_cache_free` meanwhile (which takes every
        // request's state before it frees anything) waits for this call.
        let mut g = lk(&self.state);
        let d = g.take().ok_or_else(freed)?;
        // SAFETY: as in `with`: the state was `Some`, so the cache is live.
        let c = unsafe { &*self.cache };
        lk(&c.requests.live).remove(&self.id);
        let r = c.cache.attach(d).map_err(|_| {
            fail(rkv_status::RKV_INTERNAL_ERROR, "a request of another cache (a bug)")
        })?;
        f(r)
    }
}

/// Admits a request (the core's `Cache::admit`): pins the longest cached prefix of
/// `tokens[0..n_tokens]` in namespace `ns` and allocates slots (whole pages, evicting
/// when short) for the rest, and writes the new request to `*out_req` (required). Its
/// inserts carry eviction priority `priority` (read by `RKV_EVICT_PRIORITY`; it must fit
/// in 32 bits). Needs a pool: `RKV_NO_POOL` on a cache with `pool_slots = 0`;
/// `RKV_OUT_OF_SLOTS` when the pool cannot hold the uncached rest (nothing is held then).
/// `tokens` may be NULL when `n_tokens == 0` and stays the caller's. The request is the
/// caller's to end with exactly one of `rkv_request_finish` or `rkv_request_abort`; if the
/// cache is freed first, `rkv_cache_free` aborts it. Thread-safe; an extension of
/// version 1.
///
/// # Safety
/// `cache` is NULL or live; `tokens[0..n_tokens]` readable (or NULL); `out_req` NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_request_admit(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    priority: i64,
    out_req: *mut *mut rkv_request,
) -> rkv_status {
    boundary("rkv_request_admit", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
        let t = unsafe { input(tokens, n_tokens, "tokens", "n_tokens") }?;
        check_out(out_req, "out_req")?;
        let priority = checked_priority(priority).map_err(st)?;
        let r = c.cache.admit_with_priority(ns, t, priority).map_err(|e| match e {
            Error::NoPool => no_pool(),
            e => st(e),
        })?;
        let id = c.requests.next.fetch_add(1, Ordering::Relaxed);
        let state: Cell = Arc::new(Mutex::new(Some(r.detach())));
        lk(&c.requests.live).insert(id, Arc::clone(&state));
        let raw = Box::into_raw(Box::new(rkv_request { cache, id, state }));
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_req.write(raw) };
        Ok(())
    })
}

/// Appends `tokens[0..n_tokens]` (generated tokens, or the next prefill chunk) to the
/// request, allocating slots for them page by page; may evict. On an error
/// (`RKV_OUT_OF_SLOTS` among them) nothing changes. `tokens` may be NULL when
/// `n_tokens == 0` and stays the caller's. Thread-safe.
///
/// # Safety
/// `req` is NULL or a request not yet consumed; `tokens[0..n_tokens]` readable (or NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_request_extend(
    req: *mut rkv_request,
    tokens: *const u32,
    n_tokens: usize,
) -> rkv_status {
    boundary("rkv_request_extend", || {
        // SAFETY: the caller passes NULL or a live request.
        let r = unsafe { req_ref(req) }?;
        // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
        let t = unsafe { input(tokens, n_tokens, "tokens", "n_tokens") }?;
        r.with(|r| r.extend(t).map_err(st))
    })
}

/// Makes the request's page-aligned prefix visible to other requests (chunked prefill,
/// long decodes): inserts and pins it, swapping the request's lock. Where the same tokens
/// were cached first, the request switches to the cached slots (its own go back to the
/// pool). Writes the tokens that were cached already to `*out_cached_len` (required). On
/// an error nothing changes. Thread-safe.
///
/// # Safety
/// `req` is NULL or a request not yet consumed; `out_cached_len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_request_checkpoint(
    req: *mut rkv_request,
    out_cached_len: *mut usize,
) -> rkv_status {
    boundary("rkv_request_checkpoint", || {
        // SAFETY: the caller passes NULL or a live request.
        let r = unsafe { req_ref(req) }?;
        check_out(out_cached_len, "out_cached_len")?;
        let existing = r.with(|r| r.checkpoint().map_err(st))?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_cached_len.write(existing) };
        Ok(())
    })
}

/// Finishes the request and frees its handle: caches its page-aligned tokens (prompt and
/// output), gives back the slots that duplicate cached ones and the spare slots, releases
/// its pin, and writes the tokens that were cached already to `*out_cached_len`. The
/// handle is consumed whenever `req` passes its checks (non-NULL, aligned) and
/// `out_cached_len` is not NULL: also when the insert fails (the request is aborted then)
/// and when its cache was freed (`RKV_INVALID_ARGUMENT`). With `out_cached_len` NULL
/// (`RKV_NULL_ARGUMENT`) nothing happens and the handle stays the caller's. Thread-safe
/// with the other requests; no other call on `req` may run concurrently or follow.
///
/// # Safety
/// `req` is NULL or a request not yet consumed, used by no other call now or later;
/// `out_cached_len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_request_finish(
    req: *mut rkv_request,
    out_cached_len: *mut usize,
) -> rkv_status {
    boundary("rkv_request_finish", || {
        // SAFETY: the caller passes NULL or a live request.
        unsafe { req_ref(req) }?;
        check_out(out_cached_len, "out_cached_len")?;
        // SAFETY: checked above; made by `Box::into_raw` in `rkv_request_admit` and, by the
        // caller's contract, consumed once and used by no other call, so we own it again.
        let owned = unsafe { Box::from_raw(req) };
        let existing = owned.consume(|r| r.finish().map_err(st))?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_cached_len.write(existing) };
        Ok(())
    })
}

/// Aborts the request and frees its handle: gives back every slot it holds, releases its
/// pin, caches nothing new. NULL is a no-op; so is a request whose cache was freed (that
/// aborted it) apart from freeing the handle. Unlike every other call, it may also run
/// concurrently with `rkv_cache_free` of the request's cache (the free then waits for it,
/// or it finds the request aborted): a C++ `rkv::Request` relies on this. No other call on
/// `req` may run concurrently or follow. Leaves `rkv_last_error_message()` as it is.
///
/// # Safety
/// `req` is NULL or a request not yet consumed, used by no other call now or later.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_request_abort(req: *mut rkv_request) {
    if req.is_null() || !req.is_aligned() {
        return;
    }
    // SAFETY: made by `Box::into_raw` in `rkv_request_admit` and, by the caller's contract,
    // consumed once and used by no other call, so we own it again.
    let owned = unsafe { Box::from_raw(req) };
    // A panic here would abort at the boundary; contain it (the handle is freed either way).
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _ = owned.consume(|r| {
            r.abort();
            Ok(())
        });
    }));
}

/// Writes the request's slots, one per token (`slots[0..len]`: where each token's KV entry
/// lives or is to be written), to `out_slots[0..*out_len]`, and their number to `*out_len`
/// (required). `out_slots` may be NULL when `out_cap == 0`: then only `*out_len` is
/// written and the status is `RKV_OK`. If `out_cap > 0` is smaller than the request,
/// returns `RKV_BUFFER_TOO_SMALL` with the length in `*out_len` (nothing else written).
/// The buffer stays the caller's. Thread-safe.
///
/// # Safety
/// `req` is NULL or a request not yet consumed; `out_slots[0..out_cap]` writable (or NULL);
/// `out_len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_request_slots(
    req: *const rkv_request,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
) -> rkv_status {
    boundary("rkv_request_slots", || {
        // SAFETY: the caller passes NULL or a live request.
        let r = unsafe { req_ref(req) }?;
        check_out_array(out_slots, out_cap, "out_slots", "out_cap")?;
        check_out(out_len, "out_len")?;
        r.with(|r| {
            let s = r.slots();
            if out_cap > 0 && s.len() > out_cap {
                // SAFETY: `out_len` passed `check_out`; writable by the caller's contract.
                unsafe { out_len.write(s.len()) };
                return Err(fail(
                    rkv_status::RKV_BUFFER_TOO_SMALL,
                    format!(
                        "out_cap = {out_cap} is too small: the request has {} slots (see \
                         rkv_request_info's len, or pass out_cap = 0 for the length only)",
                        s.len()
                    ),
                ));
            }
            if out_cap > 0 {
                // SAFETY: checked above with cap `out_cap >= s.len()`.
                unsafe { write_array(out_slots, s) };
            }
            // SAFETY: as above.
            unsafe { out_len.write(s.len()) };
            Ok(())
        })
    })
}

/// Writes what the request holds now (its lengths and namespace) to `*out_info`
/// (required, owned by the caller). Thread-safe.
///
/// # Safety
/// `req` is NULL or a request not yet consumed; `out_info` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_request_info_get(
    req: *const rkv_request,
    out_info: *mut rkv_request_info,
) -> rkv_status {
    boundary("rkv_request_info_get", || {
        // SAFETY: the caller passes NULL or a live request.
        let r = unsafe { req_ref(req) }?;
        check_out(out_info, "out_info")?;
        let info = r.with(|r| {
            Ok(rkv_request_info {
                len: r.len(),
                cached_len: r.cached_len(),
                locked_len: r.locked_len(),
                ns: r.namespace(),
            })
        })?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_info.write(info) };
        Ok(())
    })
}
