//! Runs of consecutive slots: how eviction can hand slots back without listing each one.
//!
//! The engine cycle with the slots as runs, as the pool hands them out: no call lists the
//! request's slots one by one, so the pool step and the new leaf cost O(runs). `reclaim`
//! between requests runs the epoch's deferred frees there instead of inside a later match,
//! insert or evict.
//!
//! ```
//! use radixkv::{Cache, CacheOptions};
//!
//! let cache = Cache::new(CacheOptions { page_size: 1, pool_slots: 1024, ..Default::default() })?;
//! let prompt: Vec<u32> = (0..300).collect();
//! let mut runs = Vec::new();
//! let lock = cache.match_and_lock(0, &prompt, &mut runs); // cached prefix as runs, pinned
//! cache.alloc_runs(prompt.len() - lock.len(), &mut runs)?; // the rest, as runs
//! assert_eq!(cache.insert(0, &prompt, &runs)?, 0);
//! drop(lock);
//! cache.reclaim();
//! let mut again: Vec<radixkv::SlotRun> = Vec::new();
//! assert_eq!(cache.match_prefix(0, &prompt, &mut again), 300);
//! assert_eq!(again.iter().map(|r| r.len as usize).sum::<usize>(), 300);
//! # Ok::<(), radixkv::Error>(())
//! ```

/// An insert's slots, one per token, in token order: a list, or runs of consecutive slots
/// (as a pool hands them out: O(runs) to pass, check and store instead of O(tokens)).
/// Anything that is one converts: `&[u32]`, `&Vec<u32>`, `&[u32; N]`, `&[SlotRun]`,
/// `&Vec<SlotRun>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slots<'a> {
    /// One slot per token.
    List(&'a [u32]),
    /// Runs whose lengths add up to the token count (checked by the insert).
    Runs(&'a [SlotRun]),
}

impl<'a> From<&'a [u32]> for Slots<'a> {
    fn from(s: &'a [u32]) -> Self {
        Slots::List(s)
    }
}

impl<'a> From<&'a Vec<u32>> for Slots<'a> {
    fn from(s: &'a Vec<u32>) -> Self {
        Slots::List(s)
    }
}

impl<'a> From<&'a mut Vec<u32>> for Slots<'a> {
    fn from(s: &'a mut Vec<u32>) -> Self {
        Slots::List(s)
    }
}

impl<'a> From<&'a mut Vec<SlotRun>> for Slots<'a> {
    fn from(r: &'a mut Vec<SlotRun>) -> Self {
        Slots::Runs(r)
    }
}

impl<'a, const N: usize> From<&'a [u32; N]> for Slots<'a> {
    fn from(s: &'a [u32; N]) -> Self {
        Slots::List(s)
    }
}

impl<'a> From<&'a [SlotRun]> for Slots<'a> {
    fn from(r: &'a [SlotRun]) -> Self {
        Slots::Runs(r)
    }
}

impl<'a> From<&'a Vec<SlotRun>> for Slots<'a> {
    fn from(r: &'a Vec<SlotRun>) -> Self {
        Slots::Runs(r)
    }
}

impl<'a, const N: usize> From<&'a [SlotRun; N]> for Slots<'a> {
    fn from(r: &'a [SlotRun; N]) -> Self {
        Slots::Runs(r)
    }
}

/// The slots `start, start + 1, .., start + len - 1` (`len >= 1`, and `start + len <= 2^32`).
///
/// Pools hand slots out in runs (a fresh pool always does, and a pool hands back what it
/// was given back), so an evicted edge's slots are usually a few runs: handing those over
/// is O(runs) where a list of slots is O(tokens). See [`crate::RadixTree::evict_runs`] and
/// [`crate::pool::SlotPool::release_cached_runs`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotRun {
    /// The first slot.
    pub start: u32,
    /// How many slots (at least 1).
    pub len: u32,
}

impl SlotRun {
    /// The run's slots, in order.
    pub fn slots(self) -> impl Iterator<Item = u32> {
        (0..self.len).map(move |i| self.start.wrapping_add(i))
    }

    /// Appends `slots` to `out` as maximal runs of consecutive ids (`slots[i] + 1 ==
    /// slots[i + 1]`), in the order given. A run never wraps past `u32::MAX`.
    pub fn push_runs_of(slots: &[u32], out: &mut Vec<SlotRun>) {
        let mut i = 0;
        while i < slots.len() {
            let n = run_len(&slots[i..]);
            out.push(SlotRun { start: slots[i], len: n as u32 });
            i += n;
        }
    }

    /// Appends the `len` slots from `start` on (wrapping past `u32::MAX` to 0, as the tree's
    /// compact slot encoding counts) to `out`, joining them to the last run when they
    /// continue it; a run that would wrap is cut in two.
    #[inline]
    pub(crate) fn push_joined(out: &mut Vec<SlotRun>, start: u32, len: u32) {
        let to_top = (1u64 << 32) - start as u64;
        if len as u64 > to_top {
            Self::push_joined(out, start, to_top as u32);
            Self::push_joined(out, 0, (len as u64 - to_top) as u32);
            return;
        }
        if let Some(last) = out.last_mut()
            && last.start as u64 + last.len as u64 == start as u64
            && (last.len as u64 + len as u64) <= u32::MAX as u64
        {
            last.len += len;
            return;
        }
        out.push(SlotRun { start, len });
    }
}

/// How many ids from the start of `ids` (non-empty) go up by one each: `ids[0], ids[0] + 1,
/// ..`, never past `u32::MAX`. Compares whole chunks at a time while they continue the run
/// (which vectorizes), then one id at a time.
pub(crate) fn run_len(ids: &[u32]) -> usize {
    const CHUNK: usize = 16;
    let base = ids[0] as u64;
    let mut n = 1;
    while n + CHUNK <= ids.len() && base + (n + CHUNK) as u64 <= 1 << 32 {
        // No id of the chunk's expected ones overflows (checked just above).
        let next = (base + n as u64) as u32;
        let chunk: &[u32; CHUNK] = ids[n..n + CHUNK].try_into().unwrap();
        if !chunk.iter().zip(0..).fold(true, |ok, (&t, k)| ok & (t == next + k)) {
            break;
        }
        n += CHUNK;
    }
    while n < ids.len() && ids[n] as u64 == base + n as u64 {
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(v: &[(u32, u32)]) -> Vec<SlotRun> {
        v.iter().map(|&(start, len)| SlotRun { start, len }).collect()
    }

    #[test]
    fn runs_of_split_where_ids_stop_going_up_by_one() {
        let mut out = Vec::new();
        let ids: Vec<u32> =
            (5..40).chain([7, 8, 100]).chain(u32::MAX - 1..=u32::MAX).chain([0, 1]).collect();
        SlotRun::push_runs_of(&ids, &mut out);
        assert_eq!(out, runs(&[(5, 35), (7, 2), (100, 1), (u32::MAX - 1, 2), (0, 2)]));
        let back: Vec<u32> = out.iter().flat_map(|r| r.slots()).collect();
        assert_eq!(back, ids);
    }

    #[test]
    fn push_joined_joins_only_continuations() {
        let mut out = Vec::new();
        SlotRun::push_joined(&mut out, 10, 4);
        SlotRun::push_joined(&mut out, 14, 2);
        SlotRun::push_joined(&mut out, 17, 1);
        SlotRun::push_joined(&mut out, 3, 1);
        SlotRun::push_joined(&mut out, u32::MAX - 1, 5);
        assert_eq!(out, runs(&[(10, 6), (17, 1), (3, 1), (u32::MAX - 1, 2), (0, 3)]));
    }
}
