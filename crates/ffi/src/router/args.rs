//! The router functions' helpers: the one mapping of router refusals to statuses, the
//! argument checks (the index pointer, workers, media, options) and the score output.

use std::cell::RefCell;

use radixkv_router::{GapPolicy, Medium, RouterError, RouterIndex, RouterOptions, Score, Worker};

use super::{rkv_router, rkv_router_options, rkv_router_score, rkv_worker};
use crate::args::check_opt_in;
use crate::boundary::{Fail, Res, fail};
use crate::types::rkv_status;

/// The status code ([`radixkv_core::error::status`]) of a router refusal: [`RouterError::status`], the one
/// mapping, which the Python front uses too (`SequenceGap` is `SEQUENCE_GAP`: nothing
/// applied, replay from the cursor; every other refusal is `INVALID_ARGUMENT`).
///
/// (`NOT_FOUND` is no refusal of the index's: the C functions whose answer is "not there",
/// `rkv_router_next_seq` and `rkv_router_remove_worker`, return it themselves.)
pub fn router_status_code(e: &RouterError) -> i32 {
    e.status()
}

/// A router refusal as a [`Fail`]: its status and the router's message, with what the
/// caller does next where there is something to do.
pub(crate) fn router_fail(e: RouterError) -> Fail {
    let status =
        rkv_status::from_code(router_status_code(&e)).unwrap_or(rkv_status::RKV_INTERNAL_ERROR);
    let msg = match &e {
        RouterError::SequenceGap { expected, .. } => format!(
            "{e}; nothing applied (gap_policy RKV_GAP_REFUSE): replay the worker's batches \
             from seq {expected} (rkv_router_next_seq), then retry"
        ),
        RouterError::UnknownRemovals { .. } => {
            format!("{e} (the held ones were removed; the others are counted in refused)")
        }
        RouterError::TooManyWorkers { .. } => {
            format!("{e}: remove a worker, or create the index with a larger max_workers")
        }
        _ => e.to_string(),
    };
    fail(status, msg)
}

/// The index behind `p`.
///
/// # Safety
/// `p` is NULL or was returned by `rkv_router_new` / `rkv_router_restore` and not yet
/// freed, and no `rkv_router_free` of it runs during `'a`.
pub(super) unsafe fn router_ref<'a>(p: *const rkv_router) -> Res<&'a RouterIndex> {
    if p.is_null() {
        return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "r is NULL"));
    }
    if !p.is_aligned() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("r = {p:p} is misaligned: not a pointer rkv_router_new returned"),
        ));
    }
    // SAFETY: non-null and aligned; by the caller's contract it points to a live
    // `rkv_router` made by `rkv_router_new` (a `Box`), which nobody frees during 'a. Only
    // shared references to it are made while it is published.
    Ok(unsafe { &(*p).index })
}

/// The worker `w` names (`reserved` must be 0).
pub(super) fn worker(w: rkv_worker) -> Res<Worker> {
    if w.reserved != 0 {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("w.reserved = {} must be 0 (worker {}/{})", w.reserved, w.worker_id, w.dp_rank),
        ));
    }
    Ok(Worker::new(w.worker_id, w.dp_rank))
}

/// The C value of worker `w`.
pub(super) fn c_worker(w: Worker) -> rkv_worker {
    rkv_worker { worker_id: w.worker_id, dp_rank: w.dp_rank, reserved: 0 }
}

/// The medium numbered `m` (an `rkv_medium`).
pub(super) fn medium_of(m: u32) -> Res<Medium> {
    match m {
        0 => Ok(Medium::Gpu),
        1 => Ok(Medium::CpuPinned),
        _ => Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!(
                "medium = {m} is not an rkv_medium (0 = RKV_MEDIUM_GPU, 1 = RKV_MEDIUM_CPU_PINNED)"
            ),
        )),
    }
}

/// The router's options for `*opts`, checked.
///
/// # Safety
/// `opts` is NULL or points to a readable `rkv_router_options`.
pub(super) unsafe fn router_options(opts: *const rkv_router_options) -> Res<RouterOptions> {
    if opts.is_null() {
        return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "opts is NULL"));
    }
    check_opt_in(opts, "opts")?;
    // SAFETY: non-null and aligned; the caller guarantees a readable `rkv_router_options`
    // (plain integers: every bit pattern is valid).
    let o = unsafe { opts.read() };
    let bad = |m: String| Err(fail(rkv_status::RKV_INVALID_ARGUMENT, m));
    if o.reserved != 0 {
        return bad(format!(
            "opts->reserved = {} must be 0 (reserved for a later version)",
            o.reserved
        ));
    }
    let gap_policy = match o.gap_policy {
        0 => GapPolicy::Clear,
        1 => GapPolicy::Refuse,
        g => {
            return bad(format!(
                "opts->gap_policy = {g} is not an rkv_gap_policy (0 = RKV_GAP_CLEAR, 1 = \
                 RKV_GAP_REFUSE)"
            ));
        }
    };
    if o.block_size == 0 {
        return bad("opts->block_size = 0 must be at least 1 (tokens per block)".into());
    }
    Ok(RouterOptions { block_size: o.block_size, max_workers: o.max_workers, gap_policy })
}

/// A new index with `o` as a boxed handle; an `InvalidOptions` refusal names the field.
pub(super) fn new_index(
    o: RouterOptions,
    make: impl FnOnce() -> Result<RouterIndex, RouterError>,
) -> Res<*mut rkv_router> {
    let index = make().map_err(|e| match e {
        RouterError::InvalidOptions { .. } => fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("opts->max_workers = {} must be 1 to 2^29 (536870912)", o.max_workers),
        ),
        e => router_fail(e),
    })?;
    Ok(Box::into_raw(Box::new(rkv_router { index })))
}

thread_local! {
    /// This thread's find results, reused: a find through the C ABI allocates nothing once
    /// it has grown to the number of workers met.
    static SCORES: RefCell<Vec<Score>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's score buffer (a fresh one if it is in use or gone).
pub(super) fn with_scores<R>(f: impl FnOnce(&mut Vec<Score>) -> R) -> R {
    let mut f = Some(f);
    let r = SCORES.try_with(|s| {
        let mut v = s.try_borrow_mut().ok()?;
        Some((f.take().expect("runs once"))(&mut v))
    });
    match r {
        Ok(Some(r)) => r,
        _ => (f.take().expect("runs once"))(&mut Vec::new()),
    }
}

/// Writes `scores` to `out[0..cap]` and their number to `*out_len`, or refuses with
/// `RKV_BUFFER_TOO_SMALL` having written only `*out_len`.
///
/// # Safety
/// `out` passed `check_out_array(out, cap, ..)` and `out[0..cap]` is writable; `out_len`
/// passed `check_out` and is writable; no Rust reference to that memory is used after.
pub(super) unsafe fn write_scores(
    scores: &[Score],
    out: *mut rkv_router_score,
    cap: usize,
    out_len: *mut usize,
) -> Res<()> {
    let n = scores.len();
    // SAFETY: `out_len` passed `check_out`; writable by the caller's contract.
    unsafe { out_len.write(n) };
    if n > cap {
        return Err(fail(
            rkv_status::RKV_BUFFER_TOO_SMALL,
            format!(
                "cap = {cap} is smaller than the {n} scores (*out_len = {n}); nothing else written"
            ),
        ));
    }
    for (i, s) in scores.iter().enumerate() {
        let c = rkv_router_score {
            worker: c_worker(s.worker),
            device_blocks: s.device_blocks,
            any_blocks: s.any_blocks,
        };
        // SAFETY: `i < n <= cap`: inside the caller's writable, aligned `out[0..cap]`.
        unsafe { out.add(i).write(c) };
    }
    Ok(())
}
