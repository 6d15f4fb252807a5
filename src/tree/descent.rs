//! Descent: the shared step every walker takes from a node to the child that holds the
//! next page ([`RadixTree::step`] for walkers that compare the key, [`RadixTree::next`] for
//! walkers that follow a path known to be cached), and the lock-free match built on it.
//!
//! # Following `forward`
//!
//! A node reached through a child table loaded under a guard `g` (or a root) was reachable
//! at a moment after `g` was pinned. If it is `REPLACED`, its `forward` (U) was published
//! in the parent's table by the same store that unlinked it, so U too was reachable at a
//! moment after `g` was pinned, and the epoch keeps it for `g` whatever is retired first:
//! U may be split or evicted, and retired, before the node it replaced is (the split
//! retires A only after dropping its locks). The argument applies again along a chain of
//! `forward` pointers. It does *not* hold for a node known only from an eviction ticket
//! (it may have been unlinked before `g` was pinned): no code follows `forward`, or reads
//! the child table, of such a node before checking that it is neither `DEAD` nor
//! `REPLACED` (see `evict_index::pop_locked`).

use super::*;

/// The nodes a match with a sliding window read (node, tokens taken, end position): a
/// thread's scratch, reused across matches (see `try_match`).
type Seen = Vec<(*const Node, usize, usize)>;

thread_local! {
    static SWA_SCRATCH: std::cell::RefCell<Seen> = const { std::cell::RefCell::new(Vec::new()) };
}

impl RadixTree {
    /// The node that replaced `n`'s beginning, following `forward` while `REPLACED`. `n`
    /// must have been reachable through tables (or be a root, or a `forward` target of such
    /// a node) at a moment after `g` was pinned; so is the result (see the module docs).
    #[inline]
    pub(super) fn resolve<'g>(&self, mut n: &'g Node, g: &'g Guard) -> &'g Node {
        // Acquire: pairs with the split's Release CAS that set REPLACED, so `forward` and
        // the node it names (built before that CAS) are visible.
        while n.state.load(Ordering::Acquire) & REPLACED != 0 {
            // Relaxed: ordered after the store of `forward` by the Acquire load above.
            let f = n.forward.load(Ordering::Relaxed);
            // SAFETY: `n` was reachable at a moment after `g` was pinned (the contract), and
            // U = `forward` was published by the store that unlinked `n`, so U was reachable
            // at a later moment, also after `g` was pinned: U is not freed while `g` lives,
            // whatever is retired first (see the module docs).
            n = unsafe { node_ref(f, g) }.expect("REPLACED implies forward");
        }
        n
    }

    /// The shared descent step on a path known to be cached (pinned pages, or pages re-read
    /// to check they still are): the child of `cur` whose first page is `page`, resolved
    /// through splits; `None` if there is none. `cur` must satisfy [`RadixTree::resolve`]'s
    /// contract.
    #[inline]
    pub(super) fn next<'g>(&self, cur: &'g Node, page: &[u32], g: &'g Guard) -> Option<&'g Node> {
        cur.child(page, g).map(|c| self.resolve(c, g))
    }

    /// The shared descent step of the walkers that compare the key (match, locking match,
    /// insert): the child of `cur` holding `rest`'s first page (`rest` is at least a page),
    /// resolved through splits, and how many of its tokens match `rest`, cut to a page
    /// multiple (at least one page). `None` when no child holds that page. It does not check
    /// `DEAD`: what a node being evicted means is the walker's choice.
    #[inline]
    pub(super) fn step<'g>(
        &self,
        cur: &'g Node,
        rest: &[u32],
        g: &'g Guard,
    ) -> Option<(&'g Node, usize)> {
        let p = self.cfg.page_size;
        // The candidate skips comparing the rest of the first page when one child alone
        // starts with its first token; the comparison below covers it.
        let c = self.resolve(cur.child_candidate(&rest[..p], g)?, g);
        let k = common_prefix(c.key(), rest) / p * p;
        (k > 0).then_some((c, k))
    }

    /// For a node this thread has pinned (so its pages stay cached): the current node that
    /// ends where `n` ends (after splits of `n`, the last of its replacements).
    pub(super) fn last_of<'g>(&self, n: &'g Node, g: &'g Guard) -> &'g Node {
        // Acquire: as in `resolve`.
        if n.state.load(Ordering::Acquire) & REPLACED == 0 {
            return n;
        }
        let key = n.key();
        let p = self.cfg.page_size;
        let mut x = self.resolve(n, g);
        let mut off = x.len();
        while off < key.len() {
            x = self.next(x, &key[off..off + p], g).expect("pinned pages stay cached");
            off += x.len();
        }
        debug_assert_eq!(off, key.len());
        x
    }

    /// Whether the first `k` tokens of `n` (measured from `n`'s start) are still cached.
    pub(super) fn is_live(&self, n: &Node, k: usize, g: &Guard) -> bool {
        let p = self.cfg.page_size;
        let key = &n.key()[..k];
        let mut x = self.resolve(n, g);
        let mut off = 0;
        loop {
            // Acquire: pairs with the evictor's AcqRel CAS that set DEAD, so an eviction
            // that happened before this load is seen.
            if x.state.load(Ordering::Acquire) & DEAD != 0 {
                return false;
            }
            off += x.len();
            if off >= key.len() {
                return true;
            }
            match self.next(x, &key[off..off + p], g) {
                Some(c) => x = c,
                None => return false,
            }
        }
    }

    /// Longest cached prefix of `tokens` (cut to a page multiple) in namespace `ns`: clears
    /// `out`, writes the matched slots, returns the match length (a multiple of the page
    /// size). Lock-free; changes no structure; refreshes access stamps.
    ///
    /// In a concurrent cache this is an estimate: the prefix may be evicted the moment it
    /// returns. Admit requests with [`RadixTree::match_and_lock`].
    ///
    /// `out` is any [`SlotSink`]: a `Vec<u32>` (one slot per token), a `Vec<SlotRun>` (runs
    /// of consecutive slots in token order, neighbours that continue one another joined:
    /// O(runs) to write instead of O(tokens) when slots come in runs, as a pool hands them
    /// out; the runs' lengths add up to the match length), or an [`OutBuf`] (a caller's
    /// buffer).
    pub fn match_prefix<S: SlotSink>(&self, ns: u64, tokens: &[u32], out: &mut S) -> usize {
        let m = self.match_unrecorded(ns, tokens, out);
        self.matches.record(tokens.len(), m);
        m
    }

    /// A match that the statistics do not count (the C ABI's size check before a locking
    /// match, which counts itself): otherwise [`RadixTree::match_prefix`], access stamps
    /// included.
    #[doc(hidden)]
    pub fn match_unrecorded<S: SlotSink>(&self, ns: u64, tokens: &[u32], out: &mut S) -> usize {
        out.clear();
        let n = self.aligned(tokens.len());
        let g = self.domain.pin();
        match self.root(ns, &g) {
            None => 0,
            Some(root) => loop {
                if let Some(m) = self.try_match(root, &tokens[..n], out, &g) {
                    break m;
                }
                out.clear();
            },
        }
    }

    /// One optimistic descent; `None` if a racing split invalidated it, or if the last edge
    /// it used was evicted before it finished (then it starts over).
    ///
    /// The slots it writes are valid memory whatever happens meanwhile (the guard keeps
    /// every node it read), and a match is only an estimate once it returns. The closing
    /// `is_live` re-check is a freshness choice: it makes the answer one the tree held at a
    /// moment after the descent read its last edge (the linearization point), never slots
    /// of an edge whose eviction completed before the match did.
    pub(super) fn try_match<S: SlotSink>(
        &self,
        root: &Node,
        key: &[u32],
        out: &mut S,
        g: &Guard,
    ) -> Option<usize> {
        let now = self.now();
        let mut cur = root;
        let mut pos = 0;
        let mut last: Option<(&Node, usize)> = None;
        // With a sliding window: the run since the last SWA tombstone, and the deepest
        // valid end (the `swa` module); without one every end is valid.
        let swa = self.cfg.swa_window > 0;
        let (mut run, mut best, mut best_mark) = (usize::MAX, 0, out.mark());
        // With a window: the nodes read, with the tokens taken of each, for the refresh of
        // the valid end's window (a thread's scratch: no allocation per match).
        let mut seen = swa.then(|| SWA_SCRATCH.with(|v| std::mem::take(&mut *v.borrow_mut())));
        if let Some(v) = seen.as_mut() {
            v.clear();
        }
        while pos < key.len() {
            // Acquire: as in `resolve`.
            if cur.state.load(Ordering::Acquire) & REPLACED != 0 {
                return None; // cur's table is frozen: start over on the current tree
            }
            let Some((c, k)) = self.step(cur, &key[pos..], g) else {
                break; // no child holds the next page
            };
            // Acquire: as in `is_live` (and, with a window, as in `is_swa_candidate`).
            let s = c.state.load(Ordering::Acquire);
            if s & DEAD != 0 {
                break; // being evicted: absent
            }
            out.take(c, k);
            self.touch(c, now);
            pos += k;
            last = Some((c, k));
            if let Some(v) = seen.as_mut() {
                v.push((c as *const Node, k, pos));
            }
            if swa && self.swa_run(&mut run, s, k) {
                (best, best_mark) = (pos, out.mark());
            }
            if k < c.len() {
                break;
            }
            cur = c;
        }
        if let Some(v) = seen {
            // SAFETY: every pointer was read under `g`, which still pins the epoch, from a
            // child table loaded under it (`node_ref`'s contract).
            let back = v.iter().rev().filter(|e| e.2 <= best).map(|e| (unsafe { &*e.0 }, e.1));
            self.refresh_window(back, 0, now);
            SWA_SCRATCH.with(|s| *s.borrow_mut() = v);
        }
        let pos = if swa && best < pos {
            out.rewind(best_mark);
            best
        } else {
            pos
        };
        match last {
            Some((n, k)) if !self.is_live(n, k, g) => None,
            _ => Some(pos),
        }
    }
}
