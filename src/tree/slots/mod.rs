//! Slot storage: an edge's immutable tokens and their slots in the most compact of three
//! encodings ([`Edge`]), what an insert hands the tree ([`SlotSource`]) and where a match
//! writes what it finds ([`SlotSink`]). Nothing here is shared mutable state: an [`Edge`]
//! never changes after it is built (a split builds two new ones from it).

mod sink;
mod source;

pub use sink::{Mark, OutBuf, SlotSink};
pub(crate) use source::{SlotSource, cut_runs, push_differing};

use crate::slot_run::{SlotRun, run_len};

/// `0, 1, 2, ...`: the offsets of a page's slots from its base (pages up to 256 tokens
/// expand from it with one vectorizable add).
static RAMP: [u32; 256] = {
    let mut r = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        r[i] = i as u32;
        i += 1;
    }
    r
};

/// True if `s` runs consecutively: `s[i] == s[0] + i` (wrapping, as the expansion adds).
/// Branch-free within blocks of 64 (so it vectorizes), and stops at the first bad block.
#[inline]
fn is_run(s: &[u32]) -> bool {
    let base = s[0];
    s.chunks(64).zip((0u32..).step_by(64)).all(|(c, at)| {
        let b = base.wrapping_add(at);
        c.iter().zip(0u32..).fold(0, |bad, (&x, i)| bad | (x.wrapping_sub(b) ^ i)) == 0
    })
}

/// How many maximal runs `s` (non-empty) is (as [`run_len`] cuts them: ids going up by
/// one, never wrapping past `u32::MAX`), or `None` as soon as that passes `max`. Counts the
/// breaks between neighbours in blocks of 256, branch-free within a block (it vectorizes).
fn runs_at_most(s: &[u32], max: usize) -> Option<usize> {
    let mut k = 1;
    let mut i = 0;
    while i + 1 < s.len() {
        let e = (i + 256).min(s.len() - 1);
        let breaks: u32 = s[i..e]
            .iter()
            .zip(&s[i + 1..=e])
            .map(|(&a, &b)| ((b.wrapping_sub(a) != 1) | (a == u32::MAX)) as u32)
            .sum();
        k += breaks as usize;
        if k > max {
            return None;
        }
        i = e;
    }
    (k <= max).then_some(k)
}

/// Appends `base, base + 1, .., base + n - 1` (wrapping) to `out`, in ramps of up to 256:
/// one vectorized add each.
#[inline]
fn ramp(out: &mut Vec<u32>, mut base: u32, mut n: usize) {
    while n > 0 {
        let m = n.min(RAMP.len());
        out.extend(RAMP[..m].iter().map(|&j| base.wrapping_add(j)));
        base = base.wrapping_add(m as u32);
        n -= m;
    }
}

/// Where [`Edge::extend_slots`] appends: a `Vec` or a caller's buffer ([`OutBuf`]).
pub(crate) trait SlotOut {
    fn reserve_slots(&mut self, n: usize);
    fn put_slice(&mut self, s: &[u32]);
    fn put_ramp(&mut self, base: u32, n: usize);
}

impl SlotOut for Vec<u32> {
    #[inline]
    fn reserve_slots(&mut self, n: usize) {
        self.reserve(n);
    }
    #[inline]
    fn put_slice(&mut self, s: &[u32]) {
        self.extend_from_slice(s);
    }
    #[inline]
    fn put_ramp(&mut self, base: u32, n: usize) {
        ramp(self, base, n);
    }
}

impl SlotOut for OutBuf {
    #[inline]
    fn reserve_slots(&mut self, _n: usize) {}
    #[inline]
    fn put_slice(&mut self, s: &[u32]) {
        if let Some(d) = self.next(s.len()) {
            d.copy_from_slice(s);
        }
    }
    #[inline]
    fn put_ramp(&mut self, mut base: u32, n: usize) {
        let Some(d) = self.next(n) else { return };
        for c in d.chunks_mut(RAMP.len()) {
            for (x, &j) in c.iter_mut().zip(&RAMP[..]) {
                *x = base.wrapping_add(j);
            }
            base = base.wrapping_add(c.len() as u32);
        }
    }
}

/// The words of an edge being built: a fixed number, written once each, straight into the
/// shared allocation the edge keeps (so an event can share the tokens without a copy:
/// [`Edge::shared`]). The subset of `Vec`'s API the constructors use, sized once at
/// creation; writing past that count, or finishing short of it, panics.
struct Words {
    arc: std::sync::Arc<[std::mem::MaybeUninit<u32>]>,
    /// The allocation's first word (the allocation is this builder's alone until
    /// `finish`, which `Arc::get_mut` checked when it was made).
    base: *mut std::mem::MaybeUninit<u32>,
    at: usize,
}

impl Words {
    fn with_capacity(n: usize) -> Words {
        let mut arc = std::sync::Arc::<[u32]>::new_uninit_slice(n);
        let base = std::sync::Arc::get_mut(&mut arc).expect("just made").as_mut_ptr();
        Words { arc, base, at: 0 }
    }

    #[inline]
    fn push(&mut self, x: u32) {
        assert!(self.at < self.arc.len(), "an edge's words past their count");
        // SAFETY: `at` is in bounds (checked), and `base` points at the allocation of
        // `arc`, which nothing else references until `finish` (see `base`).
        unsafe { (*self.base.add(self.at)).write(x) };
        self.at += 1;
    }

    #[inline]
    fn extend_from_slice(&mut self, s: &[u32]) {
        assert!(s.len() <= self.arc.len() - self.at, "an edge's words past their count");
        // SAFETY: the `s.len()` words from `at` are in bounds (checked) of the allocation
        // only this builder references (see `base`); `s` is another allocation (a `&[u32]`
        // cannot point into this uninitialized one), and `MaybeUninit<u32>` has `u32`'s
        // layout.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), self.base.add(self.at).cast::<u32>(), s.len())
        };
        self.at += s.len();
    }

    fn extend(&mut self, it: impl IntoIterator<Item = u32>) {
        for x in it {
            self.push(x);
        }
    }

    fn finish(self) -> std::sync::Arc<[u32]> {
        assert_eq!(self.at, self.arc.len(), "an edge's words short of their count");
        // SAFETY: every one of the `arc.len()` words was written (`at` counts them, and each
        // write advanced it by what it wrote).
        unsafe { self.arc.assume_init() }
    }
}

/// An edge's tokens and their slots, immutable once built.
pub(crate) struct Edge {
    /// `len` tokens, then their slots in one of three encodings (see [`Edge::new`]): with
    /// `runs == 0`, `len` slots, or one base slot per page; with `runs == k >= 1`, the
    /// `k - 1` token offsets where runs 2..k begin, then the `k` runs' first slots. Shared
    /// (an `Arc`, the size of a `Box`) so that a KV event can keep the tokens without
    /// copying them ([`Edge::shared`]); never written after it is built.
    data: std::sync::Arc<[u32]>,
    /// Edge length in tokens.
    len: u32,
    /// How many runs of consecutive slots the edge's slots are stored as; 0 when they are
    /// stored one per token or one per page.
    runs: u32,
}

impl Edge {
    /// The edge for `tokens` with `slots` (same length).
    ///
    /// Slots are stored in the most compact of three encodings:
    /// * as `k` runs of consecutive slots (`s, s+1, s+2, ...`: what a pool hands out, one
    ///   run per bulk free it took them from): the `k - 1` offsets where runs 2..k begin,
    ///   then each run's first slot, `2k - 1` words in all; one word for an edge whose
    ///   slots are one run (a wrapping run, `.., u32::MAX, 0, ..`, counts as one);
    /// * with page size `page > 1`, one base per page when every page's `P` slots run
    ///   consecutively (what a paged pool always hands out) and that is smaller;
    /// * otherwise one slot per token.
    pub(crate) fn new(tokens: &[u32], slots: &[u32], page: usize) -> Edge {
        debug_assert_eq!(tokens.len(), slots.len());
        assert!(tokens.len() <= u32::MAX as usize, "edge longer than 2^32 tokens");
        let len = slots.len();
        if len > 1 && is_run(slots) {
            let mut data = Words::with_capacity(len + 1);
            data.extend_from_slice(tokens);
            data.push(slots[0]);
            return Edge::from_data(data, len, 1);
        }
        // Runs pay when their 2k - 1 words beat one per token, and one per page where pages
        // run: k <= limit / 2. The runs of the first 256 neighbours are counted first,
        // branch-free (it vectorizes): that decides a short edge outright, and a long one
        // whose head is scattered (runs under 2 slots, or no longer than a page, on average)
        // is taken as scattered (runs later in it are missed: only compactness is lost).
        // Otherwise the runs are found one by one (each one's length in vectorized chunks),
        // and counted branch-free again if they turn out short.
        let paged = page > 1 && len > 0 && len.is_multiple_of(page);
        let limit = if paged { len / page } else { len };
        let mut starts: Vec<u32> = Vec::new();
        let mut i = 0;
        const PROBE: usize = 257;
        let worth_walking = len > 0
            && if len <= PROBE {
                runs_at_most(slots, limit / 2).is_some()
            } else {
                let k0 = runs_at_most(&slots[..PROBE], PROBE).unwrap_or(PROBE);
                2 * k0 <= PROBE && !(paged && k0 * page >= PROBE)
            };
        let mut counted = len <= PROBE;
        while worth_walking && i < len && 2 * (starts.len() + 1) <= limit {
            starts.push(i as u32);
            i += run_len(&slots[i..]);
            // Short runs (under 8 pages or slots on average): count the rest first.
            if !counted && i < len && starts.len() >= 8 && i * limit < 8 * len * starts.len() {
                counted = true;
                if runs_at_most(&slots[i..], limit / 2 - starts.len()).is_none() {
                    break;
                }
            }
        }
        if len > 0 && i == len {
            let k = starts.len();
            let mut data = Words::with_capacity(len + 2 * k - 1);
            data.extend_from_slice(tokens);
            data.extend_from_slice(&starts[1..]);
            data.extend(starts.iter().map(|&at| slots[at as usize]));
            return Edge::from_data(data, len, k as u32);
        }
        let data = if paged && slots.chunks_exact(page).all(is_run) {
            let mut data = Words::with_capacity(len + len / page);
            data.extend_from_slice(tokens);
            data.extend(slots.chunks_exact(page).map(|c| c[0]));
            data
        } else {
            let mut data = Words::with_capacity(2 * len);
            data.extend_from_slice(tokens);
            data.extend_from_slice(slots);
            data
        };
        Edge::from_data(data, len, 0)
    }

    /// [`Edge::new`] for slots given as runs (non-empty, none wrapping, their lengths adding
    /// up to `tokens.len()`): stored as those runs when that is as compact as [`Edge::new`]
    /// would store them (one run; or `k` runs in `2k - 1` words where one per page or per
    /// token would take at least `2k`), without looking at each slot; otherwise expanded and
    /// stored as [`Edge::new`] decides. The runs need not be maximal.
    pub(crate) fn from_runs(tokens: &[u32], runs: &[SlotRun], page: usize) -> Edge {
        let len = tokens.len();
        let k = runs.len();
        debug_assert_eq!(runs.iter().map(|r| r.len as usize).sum::<usize>(), len);
        let paged = page > 1 && len > 0 && len.is_multiple_of(page);
        let limit = if paged { len / page } else { len };
        if k > 0 && ((k == 1 && len > 1) || 2 * k <= limit) {
            let mut data = Words::with_capacity(len + 2 * k - 1);
            data.extend_from_slice(tokens);
            let mut at = 0u32;
            for r in &runs[..k - 1] {
                at += r.len;
                data.push(at);
            }
            data.extend(runs.iter().map(|r| r.start));
            return Edge::from_data(data, len, k as u32);
        }
        let slots: Vec<u32> = runs.iter().flat_map(|r| r.slots()).collect();
        Edge::new(tokens, &slots, page)
    }

    /// The edge for tokens `start..end` of `a`, with their slots kept in `a`'s encoding, as
    /// a split builds its two halves: nothing is checked or expanded again. `start` and
    /// `end` must fall on page boundaries.
    pub(crate) fn part_of(a: &Edge, start: usize, end: usize) -> Edge {
        let len = a.len();
        debug_assert!(start < end && end <= len);
        let stored = &a.data[len..];
        if a.runs > 0 {
            // The runs that overlap start..end, the first one cut to begin at `start`.
            let (offs, bases) = a.run_table();
            let first = offs.partition_point(|&o| o as usize <= start);
            let last = offs.partition_point(|&o| (o as usize) < end);
            let mut data = Words::with_capacity(end - start + 2 * (last - first) + 1);
            data.extend_from_slice(&a.data[start..end]);
            data.extend(offs[first..last].iter().map(|&o| o - start as u32));
            let head = start - if first == 0 { 0 } else { offs[first - 1] as usize };
            data.push(bases[first].wrapping_add(head as u32));
            data.extend_from_slice(&bases[first + 1..=last]);
            return Edge::from_data(data, end - start, (last - first + 1) as u32);
        }
        let per_token = stored.len() == len;
        let stored_part =
            if per_token { end - start } else { (end - start) / (len / stored.len()) };
        let mut data = Words::with_capacity(end - start + stored_part);
        data.extend_from_slice(&a.data[start..end]);
        if per_token {
            data.extend_from_slice(&stored[start..end]);
        } else {
            // One base per page of `p` slots; the part is whole pages.
            let p = len / stored.len();
            debug_assert!(start.is_multiple_of(p) && end.is_multiple_of(p));
            data.extend_from_slice(&stored[start / p..end / p]);
        }
        Edge::from_data(data, end - start, 0)
    }

    /// An edge around `data` (`len` tokens, then the slots in one of [`Edge::new`]'s
    /// encodings, as `runs` runs or, with `runs == 0`, by count).
    fn from_data(data: Words, len: usize, runs: u32) -> Edge {
        Edge { data: data.finish(), len: len as u32, runs }
    }

    /// The edge's words, shared, and its length: its tokens are `words[..len]` (a KV
    /// event's, kept until the consumer hashes and encodes them).
    pub(crate) fn shared(&self) -> (std::sync::Arc<[u32]>, usize) {
        (self.data.clone(), self.len())
    }

    /// For an edge stored as runs: the offsets where runs 2..k begin, and the runs' first
    /// slots.
    #[inline]
    fn run_table(&self) -> (&[u32], &[u32]) {
        let k = self.runs as usize;
        debug_assert!(k > 0);
        self.data[self.len()..].split_at(k - 1)
    }

    /// Edge length in tokens.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }

    /// The edge's tokens.
    #[inline]
    pub(crate) fn key(&self) -> &[u32] {
        &self.data[..self.len()]
    }

    /// Appends the slots of tokens `start..end` of the edge to `out`.
    #[inline]
    pub(crate) fn extend_slots<O: SlotOut>(&self, out: &mut O, start: usize, end: usize) {
        let len = self.len();
        if self.runs > 0 {
            out.reserve_slots(end - start);
            let (offs, bases) = self.run_table();
            let mut r = offs.partition_point(|&o| o as usize <= start);
            let mut i = start;
            while i < end {
                let run_start = if r == 0 { 0 } else { offs[r - 1] as usize };
                let run_end = offs.get(r).map_or(len, |&o| o as usize).min(end);
                out.put_ramp(bases[r].wrapping_add((i - run_start) as u32), run_end - i);
                i = run_end;
                r += 1;
            }
            return;
        }
        let stored = &self.data[len..];
        if stored.len() == len {
            out.put_slice(&stored[start..end]);
            return;
        }
        // One base per page of `p` consecutive slots.
        let p = len / stored.len();
        out.reserve_slots(end - start);
        // One division for the first page; then whole pages until the last.
        let (mut page, mut off) = (start / p, start % p);
        let mut i = start;
        while i < end {
            let run = (p - off).min(end - i);
            out.put_ramp(stored[page].wrapping_add(off as u32), run);
            i += run;
            page += 1;
            off = 0;
        }
    }

    /// Appends the slots of the edge's first `end` tokens to `out` as runs of consecutive
    /// slots, joining runs that continue one another (also across calls, with the run `out`
    /// ends with): one run for an edge stored as one base, at most one per page for one
    /// stored per page, and the maximal runs of the list for one stored per token.
    pub(crate) fn push_runs(&self, out: &mut Vec<SlotRun>, end: usize) {
        let len = self.len();
        debug_assert!(end <= len);
        if self.runs > 0 {
            let (offs, bases) = self.run_table();
            let mut at = 0;
            for (r, &base) in bases.iter().enumerate() {
                if at >= end {
                    break;
                }
                let stop = offs.get(r).map_or(len, |&o| o as usize).min(end);
                SlotRun::push_joined(out, base, (stop - at) as u32);
                at = stop;
            }
            return;
        }
        let stored = &self.data[len..];
        if stored.len() == len {
            let mut i = 0;
            while i < end {
                let n = run_len(&stored[i..end]);
                SlotRun::push_joined(out, stored[i], n as u32);
                i += n;
            }
            return;
        }
        let p = len / stored.len();
        for (i, &base) in stored.iter().enumerate() {
            let at = i * p;
            if at >= end {
                break;
            }
            SlotRun::push_joined(out, base, p.min(end - at) as u32);
        }
    }

    /// Where the stored slots begin (for prefetch hints).
    #[inline]
    pub(crate) fn slots_ptr(&self) -> *const u32 {
        self.data[self.len()..].as_ptr()
    }

    /// Calls `f` with the edge's slots: borrowed when stored one per token, else expanded
    /// into `scratch` (cleared first).
    pub(crate) fn with_slots<R>(&self, scratch: &mut Vec<u32>, f: impl FnOnce(&[u32]) -> R) -> R {
        let len = self.len();
        if self.runs == 0 && self.data.len() == 2 * len {
            f(&self.data[len..])
        } else {
            scratch.clear();
            self.extend_slots(scratch, 0, len);
            f(scratch)
        }
    }

    /// Heap bytes of the encoded tokens and slots (and the `Arc`'s two counts).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.data.len() * 4 + 2 * std::mem::size_of::<usize>()
    }
}
