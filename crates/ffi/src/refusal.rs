//! Messages for refused slots, buffers and allocations: the core says which slot and what
//! is wrong with it (`Error::Slot`); these name where it is among the given arguments.

use radixkv_core::error::Error;
use radixkv_core::pool::SlotPool;
use radixkv_core::slot_run::SlotRun;

use crate::boundary::{Fail, fail, st};
use crate::types::{rkv_cache, rkv_status};

// ---------------------------------------------------------------------------------------
// Messages for refused slots: the core names the slot; these name its position.

/// Where a slot value is among the given slots: a position in a list, or a run.
pub(crate) trait SlotPositions {
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

/// A core refusal of given slots (`e`), with the position of the slot it names and what is
/// wrong with it: the pool's [`SlotProblem`] (`Error::Slot`), or for `Error::DoubleFree`
/// the slot's state in the pool (every slot given must be held by the caller). Read from
/// the error's fields, never from its text.
pub(crate) fn slot_refusal(e: Error, given: &dyn SlotPositions, pool: Option<&SlotPool>) -> Fail {
    let status = rkv_status::from(&e);
    let at = e.slot().map(|(slot, _)| given.find(slot)).unwrap_or_default();
    match radixkv_core::error::slot_refusal_message(&e, &at, pool, "rkv_alloc") {
        Some(msg) => fail(status, msg),
        None => st(e),
    }
}

/// Why runs given for `n_tokens` tokens are refused before any slot is looked at, if they
/// are: an empty run, a run past the largest slot id, or lengths that do not add up.
pub(crate) fn runs_shape(runs: &[SlotRun], n_tokens: usize, name: &str) -> Option<Fail> {
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
pub(crate) fn too_small_slots(cap: usize, m: usize, tail: &str) -> Fail {
    fail(
        rkv_status::RKV_BUFFER_TOO_SMALL,
        format!("out_cap = {cap} is smaller than the match of {m} tokens (*out_len = {m}){tail}"),
    )
}

/// `RKV_BUFFER_TOO_SMALL` for a run buffer of `cap` and a match of `m` tokens in `n` runs.
pub(crate) fn too_small_runs(cap: usize, n: usize, m: usize, tail: &str) -> Fail {
    fail(
        rkv_status::RKV_BUFFER_TOO_SMALL,
        format!(
            "out_cap = {cap} is smaller than the {n} runs of the match of {m} tokens \
             (*out_n_runs = {n}, *out_len = {m}){tail}"
        ),
    )
}

/// An insert's refusal of the runs `r` given for `n_tokens` tokens: their shape first, then
/// the slot the core names.
pub(crate) fn runs_refusal(e: Error, c: &rkv_cache, r: &[SlotRun], n_tokens: usize) -> Fail {
    if let Some(f) = runs_shape(r, n_tokens, "runs") {
        return f;
    }
    slot_refusal(e, &("runs", r), c.cache.pool())
}

/// `RKV_OUT_OF_SLOTS` for asking more than the whole pool.
pub(crate) fn more_than_pool(n: usize, pool_slots: usize) -> Fail {
    fail(
        rkv_status::RKV_OUT_OF_SLOTS,
        format!("n_slots = {n} is more than the whole pool of {pool_slots} slots"),
    )
}

/// An allocation's refusal by the pool, naming the numbers.
pub(crate) fn alloc_refusal(e: Error, c: &rkv_cache, n: usize) -> Fail {
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
