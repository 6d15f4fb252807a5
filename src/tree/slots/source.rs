//! What an insert gives the tree for its tokens: one slot per token (`&[u32]`) or runs of
//! consecutive slots (`&[SlotRun]`, as a pool hands them out: O(runs) to pass and to store
//! instead of O(tokens) to scan).

use super::Edge;
use crate::error::{Result, invalid};
use crate::slot_run::{SlotRun, Slots};
use crate::tree::node::Node;

/// The slots of an insert's tokens, in token order.
#[derive(Clone, Copy)]
pub(crate) enum SlotSource<'a> {
    /// One slot per token.
    List(&'a [u32]),
    /// Runs whose lengths add up to the token count (checked by [`SlotSource::runs`]), and
    /// that count.
    Runs(&'a [SlotRun], usize),
}

impl<'a> SlotSource<'a> {
    /// A caller's [`Slots`] for `n_tokens` tokens (runs checked as in [`SlotSource::runs`];
    /// a list's length is checked by the insert).
    pub(crate) fn of(slots: Slots<'a>, n_tokens: usize) -> Result<SlotSource<'a>> {
        match slots {
            Slots::List(s) => Ok(SlotSource::List(s)),
            Slots::Runs(r) => SlotSource::runs(r, n_tokens),
        }
    }

    /// `runs` as a source for `n_tokens` tokens: `InvalidArgument` unless every run is
    /// non-empty, stays within `u32` ids (`start + len <= 2^32`), and the lengths add up to
    /// `n_tokens`.
    pub(crate) fn runs(runs: &'a [SlotRun], n_tokens: usize) -> Result<SlotSource<'a>> {
        let mut total = 0usize;
        for r in runs {
            if r.len == 0 {
                return Err(invalid(format!("empty slot run at {}", r.start)));
            }
            if r.start as u64 + r.len as u64 > 1 << 32 {
                return Err(invalid(format!(
                    "slot run {}+{} goes past the largest slot id",
                    r.start, r.len
                )));
            }
            total += r.len as usize;
        }
        if total != n_tokens {
            return Err(invalid(format!(
                "{n_tokens} tokens but {total} slots in runs (one slot per token)"
            )));
        }
        Ok(SlotSource::Runs(runs, total))
    }

    /// Slots given (one per token).
    pub(crate) fn len(&self) -> usize {
        match self {
            SlotSource::List(s) => s.len(),
            SlotSource::Runs(_, total) => *total,
        }
    }

    /// The leaf for `tokens`, which are the insert's tokens `from..from + tokens.len()`,
    /// holding their slots.
    pub(crate) fn leaf(
        &self,
        tokens: &[u32],
        from: usize,
        pins: u64,
        stamp: u64,
        meta: u64,
        page: usize,
    ) -> Node {
        let to = from + tokens.len();
        match self {
            SlotSource::List(s) => {
                Node::new(Edge::new(tokens, &s[from..to], page), pins, stamp, meta)
            }
            SlotSource::Runs(r, _) => {
                let mut part = Vec::new();
                cut_runs(r, from, to, &mut part);
                Node::new(Edge::from_runs(tokens, &part, page), pins, stamp, meta)
            }
        }
    }
}

/// Appends slots `from..to` (token positions) of `runs` to `out` as runs, joining neighbours
/// that continue one another.
pub(crate) fn cut_runs(runs: &[SlotRun], from: usize, to: usize, out: &mut Vec<SlotRun>) {
    if from >= to {
        return;
    }
    let mut at = 0usize;
    for r in runs {
        let (lo, hi) = (at, at + r.len as usize);
        at = hi;
        if hi <= from {
            continue;
        }
        if lo >= to {
            break;
        }
        let (a, b) = (lo.max(from), hi.min(to));
        SlotRun::push_joined(out, r.start + (a - lo) as u32, (b - a) as u32);
    }
}

/// Appends to `out`, as runs, the slots of `ours` at the token positions `0..upto` where
/// they differ from `have`'s (both in token order and covering at least `upto` positions):
/// O(runs of both), since two runs agree at every position they share or at none.
pub(crate) fn push_differing(
    ours: &[SlotRun],
    have: &[SlotRun],
    upto: usize,
    out: &mut Vec<SlotRun>,
) {
    let (mut i, mut j, mut oi, mut oj, mut pos) = (0, 0, 0u32, 0u32, 0usize);
    while pos < upto {
        let (a, b) = (ours[i], have[j]);
        let seg = ((a.len - oi).min(b.len - oj) as usize).min(upto - pos) as u32;
        if a.start + oi != b.start + oj {
            SlotRun::push_joined(out, a.start + oi, seg);
        }
        pos += seg as usize;
        oi += seg;
        oj += seg;
        if oi == a.len {
            (i, oi) = (i + 1, 0);
        }
        if oj == b.len {
            (j, oj) = (j + 1, 0);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn runs(v: &[(u32, u32)]) -> Vec<SlotRun> {
        v.iter().map(|&(start, len)| SlotRun { start, len }).collect()
    }

    #[test]
    fn cut_runs_takes_the_positions_asked_and_joins_continuations() {
        let r = runs(&[(10, 4), (14, 2), (100, 3), (7, 1)]);
        let all: Vec<u32> = r.iter().flat_map(|r| r.slots()).collect();
        for from in 0..all.len() {
            for to in from + 1..=all.len() {
                let mut out = Vec::new();
                cut_runs(&r, from, to, &mut out);
                let got: Vec<u32> = out.iter().flat_map(|r| r.slots()).collect();
                assert_eq!(got, all[from..to], "{from}..{to}");
                assert!(out.windows(2).all(|w| w[0].start + w[0].len != w[1].start), "{out:?}");
            }
        }
    }

    #[test]
    fn push_differing_lists_exactly_the_positions_that_differ() {
        let ours = runs(&[(10, 4), (20, 3), (30, 5)]);
        let cases = [
            runs(&[(10, 12)]),
            runs(&[(10, 4), (20, 3), (30, 5)]),
            runs(&[(10, 2), (99, 5), (21, 8)]),
            runs(&[(0, 12)]),
            runs(&[(11, 4), (20, 1), (21, 7)]),
        ];
        let mine: Vec<u32> = ours.iter().flat_map(|r| r.slots()).collect();
        for have in &cases {
            let theirs: Vec<u32> = have.iter().flat_map(|r| r.slots()).collect();
            for upto in 0..=mine.len().min(theirs.len()) {
                let mut out = Vec::new();
                push_differing(&ours, have, upto, &mut out);
                let got: Vec<u32> = out.iter().flat_map(|r| r.slots()).collect();
                let want: Vec<u32> =
                    (0..upto).filter(|&i| mine[i] != theirs[i]).map(|i| mine[i]).collect();
                assert_eq!(got, want, "{have:?} upto {upto}");
            }
        }
    }

    #[test]
    fn runs_are_checked() {
        assert!(SlotSource::runs(&runs(&[(1, 2), (5, 1)]), 3).is_ok());
        assert!(SlotSource::runs(&runs(&[(1, 2), (5, 1)]), 4).is_err(), "too few");
        assert!(SlotSource::runs(&runs(&[(1, 2), (5, 0)]), 2).is_err(), "empty run");
        assert!(SlotSource::runs(&runs(&[(u32::MAX, 2)]), 2).is_err(), "past u32::MAX");
        assert!(SlotSource::runs(&runs(&[(u32::MAX, 1)]), 1).is_ok());
    }
}
