//! The router index's C ABI (`ROUTER.md`, "Interfaces"; issue 27), additive within version
//! 1: `rkv_router_*` over [`radixkv_router::RouterIndex`], many engine workers' KV caches in
//! one lock-free index fed by their KV-event streams. Same conventions as the rest of the
//! ABI: a literal `#[unsafe(no_mangle)] extern "C"` item per function, the panic boundary,
//! a numbered status, outputs only on `RKV_OK` (and `*out_len` on `RKV_BUFFER_TOO_SMALL`),
//! every pointer checked, a message for every failure (`rkv_last_error_message`).
//!
//! The router's refusals map to statuses in one place, [`router_status_code`], from the
//! error's variant (never its text).

use std::ffi::c_char;

use radixkv_router::{RouterIndex, RouterOptions, WorkerDump};

use crate::args::{check_opt_in, check_out, check_out_array, input, write_array};
use crate::boundary::{boundary, fail};
use crate::events::opt_str;
use crate::types::rkv_status;

mod types;
pub use types::*;
mod args;
pub use args::router_status_code;
use args::*;
mod dump;
use dump::{decode_dump, encode_dump};

#[cfg(test)]
mod tests;

// ---------------------------------------------------------------------------------------
// Life.

/// Default router options: block_size 16, max_workers 4096, `RKV_GAP_CLEAR`, reserved 0.
/// Returns a plain value. An extension of version 1. Thread-safe; leaves
/// `rkv_last_error_message()` as it is.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_router_options_default() -> rkv_router_options {
    let d = RouterOptions::default();
    rkv_router_options {
        block_size: d.block_size,
        max_workers: d.max_workers,
        gap_policy: rkv_gap_policy::RKV_GAP_CLEAR as u32,
        reserved: 0,
    }
}

/// Creates an empty router index from `*opts` (required; read only during the call) and
/// writes it to `*out` (required). The caller owns the index and frees it with
/// `rkv_router_free`. `RKV_INVALID_ARGUMENT` for block_size 0, max_workers 0 or above 2^29,
/// an unknown gap_policy or reserved != 0. An extension of version 1. Thread-safe.
///
/// # Safety
/// `opts` is NULL or points to a readable `rkv_router_options`; `out` is NULL or points to
/// a writable `rkv_router *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_router_new(
    opts: *const rkv_router_options,
    out: *mut *mut rkv_router,
) -> rkv_status {
    boundary("rkv_router_new", || {
        // SAFETY: the caller guarantees `opts` is NULL or readable.
        let o = unsafe { router_options(opts) }?;
        check_out(out, "out")?;
        let p = new_index(o, || RouterIndex::new(o))?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out.write(p) };
        Ok(())
    })
}

/// Frees a router index made by `rkv_router_new` or `rkv_router_restore`; NULL is a no-op.
/// No other call on it may run concurrently or after. Leaves `rkv_last_error_message()` as
/// it is.
///
/// # Safety
/// `r` is NULL or a live index not used by any other call now or later.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_router_free(r: *mut rkv_router) {
    if r.is_null() || !r.is_aligned() {
        return;
    }
    // Dropping the index runs no callback of the caller's; contain a panic all the same.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: by the caller's contract `r` came from `Box::into_raw` in
        // `rkv_router_new` / `rkv_router_restore`, is live, and nothing else uses it.
        drop(unsafe { Box::from_raw(r) });
    }));
}

// ---------------------------------------------------------------------------------------
// Events.

/// Applies one vLLM KV-event batch as received on the wire: `payload[0..len]` is the
/// msgpack payload frame (either vLLM encoding), `seq` its sequence number from publisher
/// `worker_id`. The worker is `(worker_id, the payload's data_parallel_rank)` (0 when nil);
/// its batch cursor is per worker.
///
/// The worker's first batch sets its cursor (to `seq + 1`); a `seq` below the cursor is a
/// restart: the worker is cleared, then the batch applies; a `seq` above it is a gap, which
/// follows the index's `gap_policy`: `RKV_GAP_CLEAR` clears the worker and applies the
/// batch, `RKV_GAP_REFUSE` applies nothing and returns `RKV_SEQUENCE_GAP` (replay from
/// `rkv_router_next_seq`, then retry). A payload that does not decode (malformed msgpack,
/// wrong types, an unknown event tag or medium, a data_parallel_rank outside `uint32_t`) is
/// refused whole with `RKV_INVALID_ARGUMENT`: nothing of it applied, the refusal counted.
/// Events refused for their content (an unknown parent, unaligned or empty blocks, another
/// block size) are counted in `rkv_router_stats.refused` and skipped; the others apply and
/// the call returns `RKV_OK`. `payload` may be NULL when `len == 0` (an empty payload is
/// malformed). The caller keeps the payload. Thread-safe; batches of one worker must be
/// given in order (one thread at a time per worker).
///
/// # Safety
/// `r` is NULL or live; `payload[0..len]` is readable (or NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_router_apply_batch(
    r: *const rkv_router,
    worker_id: u64,
    seq: u64,
    payload: *const u8,
    len: usize,
) -> rkv_status {
    boundary("rkv_router_apply_batch", || {
        // SAFETY: the caller passes NULL or a live index that is not being freed.
        let idx = unsafe { router_ref(r) }?;
        // SAFETY: the caller guarantees payload[0..len] is readable (or NULL).
        let p = unsafe { input(payload, len, "payload", "len") }?;
        idx.apply_batch(worker_id, seq, p).map(|_| ()).map_err(router_fail)
    })
}

/// `BlockStored`: worker `w` stores the `n` blocks `block_hashes[0..n]` (its engine hashes,
/// opaque) with tokens `token_ids[0..n * block_size]` (the index's block size) below its
/// block `*parent` (NULL: the first block of its namespace), in `medium` (an `rkv_medium`:
/// 0 GPU, 1 CPU_PINNED) and namespace (`lora_name`, `cache_salt`: NUL-terminated UTF-8 or
/// NULL). The router computes the blocks' content hashes from the tokens. A new worker is
/// registered. Refusals apply nothing; each is `RKV_INVALID_ARGUMENT`: `n == 0`,
/// `n * block_size` beyond memory, an unknown medium, a string that is not UTF-8,
/// `w.reserved != 0`, a new worker beyond `max_workers`, or a parent the worker does not
/// hold (a worker met for the first time is registered all the same, holding nothing). The
/// index's own refusals (no blocks, too many workers, unknown parent) are counted in
/// `rkv_router_stats.refused`. Storing a held hash again only adds the medium. The
/// caller keeps every array. Thread-safe.
///
/// # Safety
/// `r` is NULL or live; `lora_name`, `cache_salt` NULL or readable NUL-terminated strings;
/// `parent` NULL or a readable `uint64_t`; `block_hashes[0..n]` and
/// `token_ids[0..n * block_size]` readable (or NULL with `n == 0`).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn rkv_router_stored(
    r: *const rkv_router,
    w: rkv_worker,
    lora_name: *const c_char,
    cache_salt: *const c_char,
    parent: *const u64,
    block_hashes: *const u64,
    n: usize,
    token_ids: *const u32,
    medium: u32,
) -> rkv_status {
    boundary("rkv_router_stored", || {
        // SAFETY: the caller passes NULL or a live index that is not being freed.
        let idx = unsafe { router_ref(r) }?;
        let w = worker(w)?;
        let m = medium_of(medium)?;
        // SAFETY: the caller guarantees NULL or readable NUL-terminated strings.
        let lora = unsafe { opt_str(lora_name, "lora_name") }?;
        // SAFETY: as above.
        let salt = unsafe { opt_str(cache_salt, "cache_salt") }?;
        check_opt_in(parent, "parent")?;
        // SAFETY: non-null (checked) and aligned; readable by the caller's contract.
        let parent = (!parent.is_null()).then(|| unsafe { parent.read() });
        // SAFETY: the caller guarantees block_hashes[0..n] is readable (or NULL).
        let hashes = unsafe { input(block_hashes, n, "block_hashes", "n") }?;
        let bs = idx.options().block_size as usize;
        let n_tokens = n.checked_mul(bs).ok_or_else(|| {
            fail(
                rkv_status::RKV_INVALID_ARGUMENT,
                format!("n = {n} blocks of {bs} tokens overflow size_t"),
            )
        })?;
        // SAFETY: the caller guarantees token_ids[0..n * block_size] is readable (or NULL).
        let tokens = unsafe { input(token_ids, n_tokens, "token_ids", "n * block_size") }?;
        idx.stored(w, lora, salt, parent, hashes, tokens, m).map_err(router_fail)
    })
}

/// `BlockRemoved`: worker `w` dropped its `medium` copy (an `rkv_medium`) of the blocks
/// `block_hashes[0..n]`. A block keeps its other medium's copy. If some hashes are not held
/// in that medium (or the worker is unknown), the held ones are removed, the others
/// counted, and the call returns `RKV_INVALID_ARGUMENT` (the one refusal after which
/// something changed, as in the Rust API); for an unknown medium or `w.reserved != 0` it
/// returns `RKV_INVALID_ARGUMENT` having changed nothing. `n == 0` does nothing.
/// Thread-safe.
///
/// # Safety
/// `r` is NULL or live; `block_hashes[0..n]` readable (or NULL with `n == 0`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_router_removed(
    r: *const rkv_router,
    w: rkv_worker,
    block_hashes: *const u64,
    n: usize,
    medium: u32,
) -> rkv_status {
    boundary("rkv_router_removed", || {
        // SAFETY: the caller passes NULL or a live index that is not being freed.
        let idx = unsafe { router_ref(r) }?;
        let w = worker(w)?;
        let m = medium_of(medium)?;
        // SAFETY: the caller guarantees block_hashes[0..n] is readable (or NULL).
        let hashes = unsafe { input(block_hashes, n, "block_hashes", "n") }?;
        idx.removed(w, hashes, m).map_err(router_fail)
    })
}

/// `AllBlocksCleared`: worker `w` holds nothing any more, atomically to a concurrent find.
/// Its batch cursor is kept. An unknown worker holds nothing already: `RKV_OK`, nothing
/// changed. `RKV_INVALID_ARGUMENT` for `w.reserved != 0`. Thread-safe.
///
/// # Safety
/// `r` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_router_cleared(r: *const rkv_router, w: rkv_worker) -> rkv_status {
    boundary("rkv_router_cleared", || {
        // SAFETY: the caller passes NULL or a live index that is not being freed.
        let idx = unsafe { router_ref(r) }?;
        idx.cleared(worker(w)?);
        Ok(())
    })
}

/// Forgets worker `w`, atomically to a concurrent find: its blocks and its batch cursor
/// (its next batch sets a new one). `RKV_NOT_FOUND` for a worker the index does not know
/// (never seen, or removed already; nothing changed); `RKV_INVALID_ARGUMENT` for
/// `w.reserved != 0`. Thread-safe.
///
/// # Safety
/// `r` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_router_remove_worker(
    r: *const rkv_router,
    w: rkv_worker,
) -> rkv_status {
    boundary("rkv_router_remove_worker", || {
        // SAFETY: the caller passes NULL or a live index that is not being freed.
        let idx = unsafe { router_ref(r) }?;
        let w = worker(w)?;
        if idx.remove_worker(w) {
            Ok(())
        } else {
            Err(fail(
                rkv_status::RKV_NOT_FOUND,
                format!(
                    "worker {}/{} is not known to the index (never seen, or removed already)",
                    w.worker_id, w.dp_rank
                ),
            ))
        }
    })
}

// ---------------------------------------------------------------------------------------
// Queries.

/// Scores of `tokens[0..n_tokens]` in namespace (`lora_name`, `cache_salt`: NUL-terminated
/// UTF-8 or NULL): the request is cut into blocks of the index's block size (a partial last
/// block is ignored) and every worker holding its first block is listed once, with the
/// leading blocks it holds on the device and in any medium. Writes the scores to
/// `out[0..*out_len]` (in no particular order) and their number to `*out_len` (required).
/// If `cap` is smaller than the number of scores, returns `RKV_BUFFER_TOO_SMALL` with the
/// number in `*out_len` and nothing written to `out` (the number may change by the next
/// call under concurrent writers). `out` may be NULL when `cap == 0`, `tokens` when
/// `n_tokens == 0`. `RKV_INVALID_ARGUMENT` for a string that is not UTF-8. The caller owns
/// every array. Thread-safe and lock-free: it never waits for a writer and allocates
/// nothing once this thread's buffers have grown.
///
/// # Safety
/// `r` is NULL or live; `tokens[0..n_tokens]` readable (or NULL); `lora_name`, `cache_salt`
/// NULL or readable NUL-terminated strings; `out[0..cap]` writable (or NULL); `out_len`
/// NULL or writable.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn rkv_router_find(
    r: *const rkv_router,
    tokens: *const u32,
    n_tokens: usize,
    lora_name: *const c_char,
    cache_salt: *const c_char,
    out: *mut rkv_router_score,
    cap: usize,
    out_len: *mut usize,
) -> rkv_status {
    boundary("rkv_router_find", || {
        // SAFETY: the caller passes NULL or a live index that is not being freed.
        let idx = unsafe { router_ref(r) }?;
        // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
        let t = unsafe { input(tokens, n_tokens, "tokens", "n_tokens") }?;
        // SAFETY: the caller guarantees NULL or readable NUL-terminated strings.
        let lora = unsafe { opt_str(lora_name, "lora_name") }?;
        // SAFETY: as above.
        let salt = unsafe { opt_str(cache_salt, "cache_salt") }?;
        check_out_array(out, cap, "out", "cap")?;
        check_out(out_len, "out_len")?;
        with_scores(|s| {
            idx.find(t, lora, salt, s);
            // SAFETY: `out` and `out_len` passed their checks and are writable by the
            // caller's contract; the inputs are not read after this.
            unsafe { write_scores(s, out, cap, out_len) }
        })
    })
}

/// `rkv_router_find` for precomputed content hashes, `content_hashes[0..n]`, one per block
/// with the namespace already mixed in (the router-side standard of `KV_EVENTS.md`: XXH3-64
/// of the block's tokens as little-endian `uint32_t`, seeded from the namespace; position
/// comes from the chain). Outputs as `rkv_router_find`. Thread-safe and lock-free.
///
/// # Safety
/// `r` is NULL or live; `content_hashes[0..n]` readable (or NULL); `out[0..cap]` writable
/// (or NULL); `out_len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_router_find_hashes(
    r: *const rkv_router,
    content_hashes: *const u64,
    n: usize,
    out: *mut rkv_router_score,
    cap: usize,
    out_len: *mut usize,
) -> rkv_status {
    boundary("rkv_router_find_hashes", || {
        // SAFETY: the caller passes NULL or a live index that is not being freed.
        let idx = unsafe { router_ref(r) }?;
        // SAFETY: the caller guarantees content_hashes[0..n] is readable (or NULL).
        let h = unsafe { input(content_hashes, n, "content_hashes", "n") }?;
        check_out_array(out, cap, "out", "cap")?;
        check_out(out_len, "out_len")?;
        with_scores(|s| {
            idx.find_hashes(h, s);
            // SAFETY: as in `rkv_router_find`.
            unsafe { write_scores(s, out, cap, out_len) }
        })
    })
}

/// Writes the index's counts and counters to `*out` (required). Thread-safe.
///
/// # Safety
/// `r` is NULL or live; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_router_stats_get(
    r: *const rkv_router,
    out: *mut rkv_router_stats,
) -> rkv_status {
    boundary("rkv_router_stats_get", || {
        // SAFETY: the caller passes NULL or a live index that is not being freed.
        let idx = unsafe { router_ref(r) }?;
        check_out(out, "out")?;
        let s = idx.stats();
        let c = rkv_router_stats {
            workers: s.workers,
            blocks: s.blocks,
            memberships: s.memberships,
            bytes: s.bytes,
            events: s.events,
            batches: s.batches,
            gaps: s.gaps,
            restarts: s.restarts,
            refused: s.refused_total(),
        };
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out.write(c) };
        Ok(())
    })
}

/// `rkv_router_stats_get` with the counters added since (`rkv_router_stats_ex`: today
/// `other_groups`, the events skipped for their KV cache group), an extension of ABI
/// version 1. The caller sets `out->size = sizeof(rkv_router_stats_ex)` (required; the
/// call reads it): a size below the first version's (88) is `RKV_INVALID_ARGUMENT`, `out`
/// NULL is `RKV_NULL_ARGUMENT`, and nothing is written then. On `RKV_OK` the call writes
/// the struct this library knows (88 bytes, `size` = 88) and nothing past it. The caller
/// owns `*out`; the call keeps no pointer to it. Thread-safe.
///
/// # Safety
/// `r` is NULL or live; `out` NULL, or pointing to a readable and writable
/// `rkv_router_stats_ex` of `out->size` bytes (at least its `size` field readable).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_router_stats_get_ex(
    r: *const rkv_router,
    out: *mut rkv_router_stats_ex,
) -> rkv_status {
    boundary("rkv_router_stats_get_ex", || {
        // SAFETY: the caller passes NULL or a live index that is not being freed.
        let idx = unsafe { router_ref(r) }?;
        check_out(out, "out")?;
        const SIZE: usize = size_of::<rkv_router_stats_ex>();
        // SAFETY: passed `check_out` (non-NULL, aligned); the first field, a `u32` at offset
        // 0, is readable by the caller's contract.
        let size = unsafe { out.cast::<u32>().read() };
        if (size as usize) < SIZE {
            return Err(fail(
                rkv_status::RKV_INVALID_ARGUMENT,
                format!(
                    "out->size = {size} is smaller than an rkv_router_stats_ex ({SIZE}): set \
                     it to sizeof(rkv_router_stats_ex)"
                ),
            ));
        }
        let s = idx.stats();
        let c = rkv_router_stats_ex {
            size: SIZE as u32,
            reserved: 0,
            workers: s.workers,
            blocks: s.blocks,
            memberships: s.memberships,
            bytes: s.bytes,
            events: s.events,
            batches: s.batches,
            gaps: s.gaps,
            restarts: s.restarts,
            refused: s.refused_total(),
            other_groups: s.other_groups,
        };
        // SAFETY: passed `check_out`; `out->size >= SIZE`, so a whole `rkv_router_stats_ex`
        // is there, writable by the caller's contract.
        unsafe { out.write(c) };
        Ok(())
    })
}

/// Writes to `*out_next` (required) the `seq` worker `w`'s batch cursor expects next (after
/// `RKV_SEQUENCE_GAP`: replay from there). `RKV_NOT_FOUND` when the worker has no cursor:
/// it is unknown, or no batch of it applied yet (typed events set no cursor), so its next
/// batch sets one whatever its `seq`. `RKV_INVALID_ARGUMENT` for `w.reserved != 0`.
/// Thread-safe.
///
/// # Safety
/// `r` is NULL or live; `out_next` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_router_next_seq(
    r: *const rkv_router,
    w: rkv_worker,
    out_next: *mut u64,
) -> rkv_status {
    boundary("rkv_router_next_seq", || {
        // SAFETY: the caller passes NULL or a live index that is not being freed.
        let idx = unsafe { router_ref(r) }?;
        let w = worker(w)?;
        check_out(out_next, "out_next")?;
        let Some(next) = idx.next_seq(w) else {
            return Err(fail(
                rkv_status::RKV_NOT_FOUND,
                format!(
                    "worker {}/{} has no batch cursor: it is unknown, or no batch of it applied \
                     yet (its next batch sets the cursor, whatever its seq)",
                    w.worker_id, w.dp_rank
                ),
            ));
        };
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_next.write(next) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Dump and restore.

/// Serializes the whole index into `out[0..cap]`: every worker's held blocks (engine hash,
/// chain key, media), batch cursor and the KV cache group kinds its stores taught, as one
/// byte string that `rkv_router_restore` turns back into an equal index (the same finds,
/// cursors, block counts, and the same removals of other groups taken or skipped). Writes its length
/// to `*out_len` (required). If `cap` is smaller, returns `RKV_BUFFER_TOO_SMALL` with the
/// length in `*out_len` and nothing written to `out`: call again with a buffer that large
/// (under concurrent writers it may have grown by then: loop). `out` may be NULL when
/// `cap == 0`. Each worker's part is taken under that worker's lock: consistent per worker,
/// not across workers. The caller owns the buffer. Thread-safe.
///
/// The bytes, little-endian, no padding (format version 2; a later library reads it or
/// refuses it by its version):
/// - header: `"RKVRDUMP"` (8 bytes), `u32` format version (2), `u32` block_size,
///   `u64` number of workers;
/// - per worker: `u64` worker_id, `u32` dp_rank, `u32` flags (bit 0: it has a cursor),
///   `u64` next_seq (0 without a cursor), `u64` number of blocks, `u64` number of groups,
///   then its groups, then its blocks;
/// - per group (a KV cache group whose kind the worker's stores taught, where it differs
///   from an unnamed group's: group 0 indexed, the others skipped), sorted by `group_idx`:
///   `u32` group_idx, `u32` kind (1 main attention: its removals apply; 0 another kind:
///   they are skipped);
/// - per block: `u64` engine hash, `u64` chain key (the router's sequence hash of the
///   prefix ending with the block), `u32` media (1 device, 2 host copy, 3 both), `u32` 0.
///
/// Version 1 (no number of groups, no groups: a library before groups were saved wrote
/// it) is still restored, as workers with no group kinds learned.
///
/// # Safety
/// `r` is NULL or live; `out[0..cap]` writable (or NULL); `out_len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_router_dump(
    r: *const rkv_router,
    out: *mut u8,
    cap: usize,
    out_len: *mut usize,
) -> rkv_status {
    boundary("rkv_router_dump", || {
        // SAFETY: the caller passes NULL or a live index that is not being freed.
        let idx = unsafe { router_ref(r) }?;
        check_out_array(out, cap, "out", "cap")?;
        check_out(out_len, "out_len")?;
        let bytes = encode_dump(idx.options().block_size, &idx.dump());
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_len.write(bytes.len()) };
        if bytes.len() > cap {
            return Err(fail(
                rkv_status::RKV_BUFFER_TOO_SMALL,
                format!(
                    "cap = {cap} is smaller than the dump of {} bytes (*out_len = {})",
                    bytes.len(),
                    bytes.len()
                ),
            ));
        }
        // SAFETY: `out[0..cap]` passed `check_out_array`, `cap >= bytes.len()`, writable by
        // the caller's contract; `bytes` is our own Vec.
        unsafe { write_array(out, &bytes) };
        Ok(())
    })
}

/// Creates an index from `*opts` (required) holding exactly what the dump
/// `bytes[0..len]` (from `rkv_router_dump`) records, and writes it to `*out` (required):
/// the caller owns it and frees it with `rkv_router_free`. The options are checked as by
/// `rkv_router_new`; their `block_size` must be the dumped index's. `RKV_INVALID_ARGUMENT`
/// for bad options, bytes that are not such a dump (wrong magic or version, truncated,
/// trailing bytes, a bad field), another block size, or more workers than `max_workers`;
/// nothing is created then. Thread-safe.
///
/// # Safety
/// `opts` is NULL or readable; `bytes[0..len]` readable (or NULL with `len == 0`); `out`
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_router_restore(
    opts: *const rkv_router_options,
    bytes: *const u8,
    len: usize,
    out: *mut *mut rkv_router,
) -> rkv_status {
    boundary("rkv_router_restore", || {
        // SAFETY: the caller guarantees `opts` is NULL or readable.
        let o = unsafe { router_options(opts) }?;
        // SAFETY: the caller guarantees bytes[0..len] is readable (or NULL).
        let b = unsafe { input(bytes, len, "bytes", "len") }?;
        check_out(out, "out")?;
        let d: Vec<WorkerDump> = decode_dump(o.block_size, b)?;
        let p = new_index(o, || RouterIndex::restore(o, &d))?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out.write(p) };
        Ok(())
    })
}
