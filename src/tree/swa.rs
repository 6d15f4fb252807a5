//! The sliding-window (SWA) component: for hybrid models whose attention layers look back
//! only `window` tokens (Gemma 3, gpt-oss, Llama 4), a cached token has two KV entries, its
//! full-attention KV and its SWA KV, and the SWA KV may be evicted on its own (SGLang's
//! `SWARadixCache` and the SWA component of its `UnifiedRadixCache`). Enabled by
//! [`TreeConfig::swa_window`] > 0; with 0 nothing here runs and nothing changes.
//!
//! # The model
//!
//! Every node (edge) holds its tokens' full KV (its slots; the engine names a token's SWA
//! KV by the token's full slot, as SGLang's full-to-SWA mapping does). A node whose SWA KV
//! was evicted while its full KV stays is an **SWA tombstone** (`SWA_GONE` on its state
//! word). A match is **valid** only where the run of non-tombstone tokens back from its end
//! covers the window, or reaches the root (SGLang's `create_match_validator`): walking from
//! the root, a tombstone resets the run to 0, every other node adds its length, and the
//! match ends at the deepest node end where the run is at least `window` (a run that never
//! met a tombstone counts as infinite). `match_prefix` and `match_and_lock` return that
//! valid prefix; the full KV past it is not a hit.
//!
//! A **window lock** is part of a path lock (`match_and_lock`, `insert_and_lock`): besides
//! the pin on every node of the path, it holds an **SWA pin** on every node of the segment
//! that covers the last `window` tokens (whole nodes, back from the lock's end; the whole
//! path if it is shorter). [`PrefixLock`] records where the segment starts (a node
//! boundary; boundaries never go away while the path is pinned, as nodes are never merged).
//! A node with an SWA pin keeps its SWA KV; a node's SWA pins never exceed its pins.
//!
//! **SWA eviction** ([`RadixTree::evict_kv`] with [`EvictTarget::Swa`]) takes nodes with
//! live SWA KV and no SWA pin, least recently used first by their SWA stamp
//! (`Node::swa_stamp`): set when the node is created, and raised only by SGLang's
//! window-bounded refresh, on the nodes within `window + page_size` tokens back from the end
//! of a match's valid prefix or of an insert's key, and on the nodes a window lock pins; so
//! a long prefix's SWA KV ages while its tail's stays fresh (the full stamp, which full
//! eviction reads, is refreshed along the whole path as before). Ties go to the shallower
//! node (its start offset). An unpinned leaf goes whole (its full and SWA KV), any other
//! becomes a tombstone (its SWA KV only); a tombstone left an unpinned leaf by that goes too
//! (its full KV: SGLang's `_iteratively_delete_tombstone_leaf`). Full eviction
//! ([`EvictTarget::Full`], and `evict`) takes leaves as without SWA and says for each whether
//! it still had SWA KV.
//!
//! # Protocols
//!
//! **The SWA pin/tombstone pair** (crossbeam-skiplist's "up only from a live state"): an
//! SWA pin is a CAS `s -> s + SWA_PIN` that succeeds only from a state with none of `DEAD`,
//! `REPLACED`, `SWA_GONE`; a tombstone is a CAS `s -> s | SWA_GONE` that succeeds only from a
//! state with no SWA pin and none of those bits. Both are RMWs on one word, so one of two
//! racing ones lands first and the other fails: a window lock never covers SWA KV being
//! freed, and SWA KV is freed exactly once (a whole-leaf eviction's `DEAD` CAS and a
//! tombstone's CAS exclude each other the same way, and the eviction reports the leaf's SWA
//! KV as freed only if `SWA_GONE` was clear in the word its CAS replaced). `SWA_GONE` is
//! never cleared, and a split copies the whole word into both halves (its `REPLACED` CAS
//! retries on any change, a tombstone's included), so a tombstone stays one for its tokens'
//! life in the tree.
//!
//! **A locking match** pins the path as without SWA (`pin_descend`), computing validity
//! from the `SWA_GONE` bits of the nodes it pins; unpins the nodes past the valid end; then
//! SWA-pins the window segment in a second walk from the root by the tokens (following
//! splits as release does). If an SWA pin meets a tombstone (an SWA eviction landed after
//! the first walk read the bit), it undoes its SWA pins and its pins and starts over: the
//! answer is then one the tree held after that tombstone. Each retry is caused by a
//! tombstone that some other call completed (lock-free, not wait-free).
//! `insert_and_lock` SWA-pins its segment's nodes that are not tombstones (its own new
//! tokens never are) and skips the others, as SGLang's insert does not revive them.
//!
//! **Release** unpins the path as without SWA and, on the nodes at or past the segment's
//! start, takes one SWA pin off in the same CAS, except on tombstones: a node that held an
//! SWA pin could not become a tombstone, and a tombstone stays one, so a tombstone in the
//! segment is exactly a node the lock could not SWA-pin.
//!
//! **The SWA index** is a lazy queue keyed by the access stamp ([`Queue`], the one the
//! eviction index uses for `lru`: keys only grow, an entry's key is a lower bound, `pop`
//! re-queues an entry whose node's stamp grew), behind its own mutex, with a ticket per
//! queued node (`Node::swa_evq`, written only under that mutex). A node enters when it is
//! created (a new leaf, or a half of a split whose word had no SWA pin and no `SWA_GONE`)
//! and when its SWA pins go to 0 (not a tombstone); `pop` drops entries whose node is no
//! longer a candidate. A node is cut from the SWA index, under its mutex, before it is
//! retired: an evicted leaf right after its unlink (`evict_leaf`), a split node before the
//! eviction index retires it. So a ticket names a node that is not retired, as in the
//! eviction index. Lock order: node locks, then this mutex; it is never held with the
//! eviction index's mutex.

use super::evict::Pass;
use super::evict_index::{Entry, Queue, STALE_PER_HOLD, Ticket};
use super::node::{SWA_GONE, SWA_PIN, SWA_PIN_MASK};
use super::*;
use crate::sync::{Mutex, yield_now};

/// What an eviction freed of one node's KV (see [`RadixTree::evict_kv`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Freed {
    /// The node's full KV (its slots): the node left the tree.
    pub full: bool,
    /// Its SWA KV (named by the same slots); always false without a sliding window.
    pub swa: bool,
}

/// Which KV an eviction call frees to reach its target (see [`RadixTree::evict_kv`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictTarget {
    /// Full KV: unpinned leaves in policy order, as [`RadixTree::evict`].
    Full,
    /// SWA KV (trees with a sliding window): nodes without an SWA pin, least recently used
    /// first; see the module docs.
    Swa,
}

/// The result of trying to SWA-pin one node.
pub(super) enum SwaPin {
    Pinned,
    Gone,
    Dead,
    Replaced,
}

/// A locking match's view of SWA validity as it pins (see `pin_descend`).
pub(super) struct SwaTrack {
    window: usize,
    /// Tokens since the last tombstone (`usize::MAX`: none met since the root).
    run: usize,
    /// The deepest valid end so far, and the output's mark there.
    pub(super) best: usize,
    pub(super) best_mark: Mark,
    /// The end position of every node pinned, in order.
    ends: Vec<usize>,
}

impl SwaTrack {
    pub(super) fn new(window: usize, start: Mark) -> SwaTrack {
        SwaTrack { window, run: usize::MAX, best: 0, best_mark: start, ends: Vec::new() }
    }

    /// A node of `len` tokens pinned, ending at `end`, its state word `s`.
    #[inline]
    pub(super) fn step<S: SlotSink>(&mut self, s: u64, len: usize, end: usize, out: &S) {
        self.ends.push(end);
        if s & SWA_GONE != 0 {
            self.run = 0;
        } else {
            self.run = self.run.saturating_add(len);
            if self.run >= self.window {
                self.best = end;
                self.best_mark = out.mark();
            }
        }
    }

    /// Where the window segment of a lock ending at `self.best` starts: the start of the
    /// node whose tokens, with those of the nodes after it up to `best`, first cover the
    /// window (0 if the path is shorter).
    pub(super) fn segment_start(&self) -> usize {
        segment_of(&self.ends, self.best, self.window)
    }
}

/// [`SwaTrack::segment_start`] for node ends `ends` (in order) and a lock ending at `end`.
fn segment_of(ends: &[usize], end: usize, window: usize) -> usize {
    let Some(j) = ends.iter().position(|&e| e == end) else { return 0 };
    for i in (0..=j).rev() {
        let start = if i == 0 { 0 } else { ends[i - 1] };
        if end - start >= window {
            return start;
        }
    }
    0
}

/// The SWA index (module docs).
pub(crate) struct SwaIndex {
    queue: Mutex<Queue<u128>>,
}

/// A node's key in the SWA index: its stamp, ties broken by its start offset, shallower
/// first (a descent stamps a whole path with one `now`; SGLang's SWA LRU puts a path's
/// ancestors behind its deepest node, so a prefix's SWA KV goes before its tail's, and an
/// inner node becomes a tombstone before its leaf goes whole). Only grows, as the stamp.
#[inline]
fn swa_key(n: &Node) -> u128 {
    // Relaxed: an eviction-order hint; the SWA stamp only grows (`RadixTree::touch_swa`).
    ((n.swa_stamp.load(Ordering::Relaxed) as u128) << 32) | n.start as u128
}

/// With the SWA index's lock held, for a node named by a ticket popped under the guard:
/// whether it is an SWA eviction candidate (live SWA KV, no SWA pin, live, not a root).
/// The state is read first: only then may anything but the node's own fields be read.
#[inline]
fn is_swa_candidate(n: &Node) -> bool {
    // Acquire: pairs with the Release of the CASes that set DEAD, REPLACED or SWA_GONE
    // and of the SWA unpins.
    let s = n.state.load(Ordering::Acquire);
    s & (DEAD | REPLACED | SWA_GONE | SWA_PIN_MASK) == 0
}

impl SwaIndex {
    pub(crate) fn new() -> SwaIndex {
        SwaIndex { queue: Mutex::new(Queue::default()) }
    }

    /// Queues `node` unless it is queued already or cannot be a candidate. `node` must be
    /// valid for the caller's guard and not retired (as for `EvictIndex::push`).
    pub(crate) fn push(&self, node: &Node) {
        let mut q = lock(&self.queue);
        // Relaxed: a filter (`pop` re-checks with Acquire). A node retired before this lock
        // was taken was cut under it after its DEAD or REPLACED was set, so the lock makes
        // the bit visible here; one retired later is cut after us.
        if node.state.load(Ordering::Relaxed) & (DEAD | REPLACED | SWA_GONE) != 0 || node.len() == 0
        {
            return;
        }
        // Relaxed (`swa_evq`, here and below): written only under this lock.
        if !node.swa_evq.load(Ordering::Relaxed).is_null() {
            return;
        }
        let t = Box::into_raw(Box::new(Ticket { node: node as *const Node as *mut Node }));
        node.swa_evq.store(t, Ordering::Relaxed);
        // A lower bound of the node's key, which only grows.
        q.push(swa_key(node), t);
    }

    /// Cuts `node`'s entry (if any) loose from it: called before the node is retired.
    pub(crate) fn cut(&self, node: &Node) {
        let _q = lock(&self.queue);
        // Relaxed: written only under this lock.
        let t = node.swa_evq.swap(std::ptr::null_mut(), Ordering::Relaxed);
        if !t.is_null() {
            // SAFETY: the node's ticket is owned by its queue entry and freed only by `pop`
            // (or Drop) under the lock held here, after reading it.
            unsafe { (*t).node = std::ptr::null_mut() };
        }
    }

    /// Pops the least recently used candidate; `None` when none is left. The node is valid
    /// for `guard` (a ticket names a node not retired yet, and retiring comes after the cut,
    /// so after this lock is released the guard keeps it).
    pub(crate) fn pop<'g>(&self, guard: &'g Guard) -> Option<&'g Node> {
        let mut q = lock(&self.queue);
        loop {
            for _ in 0..STALE_PER_HOLD {
                let Some((key, _, addr)): Option<Entry<u128>> = q.pop() else {
                    q.shrink_when_empty();
                    return None;
                };
                let t = addr as *mut Ticket;
                // SAFETY: tickets are freed only here (or in Drop), under the lock.
                let ptr = unsafe { (*t).node };
                if ptr.is_null() {
                    // SAFETY: the entry just popped was the ticket's only owner.
                    drop(unsafe { Box::from_raw(t) });
                    continue;
                }
                // SAFETY: a node named by a ticket is not retired (the cut comes first, under
                // this lock), so it is valid now, and `guard` (pinned before this call) keeps
                // it after: its retire, if any, comes after this lock is released.
                let n = unsafe { node_ref(ptr, guard) }.expect("checked non-null");
                if !is_swa_candidate(n) {
                    // Relaxed: written only under this lock.
                    n.swa_evq.store(std::ptr::null_mut(), Ordering::Relaxed);
                    // SAFETY: as above; the node no longer names it.
                    drop(unsafe { Box::from_raw(t) });
                    continue;
                }
                let now = swa_key(n);
                if now > key {
                    q.push(now, t); // the same ticket, the key it has grown to
                    continue;
                }
                // Relaxed: written only under this lock.
                n.swa_evq.store(std::ptr::null_mut(), Ordering::Relaxed);
                // SAFETY: as above.
                drop(unsafe { Box::from_raw(t) });
                return Some(n);
            }
            // Bound the time a waiting push or cut spends on this lock.
            drop(q);
            yield_now();
            q = lock(&self.queue);
        }
    }

    /// Entries queued (some may be stale).
    pub(crate) fn len(&self) -> usize {
        lock(&self.queue).len()
    }

    /// For `check_invariants` (quiescent): `Err` if an entry names a retired-looking node or
    /// carries a key above its node's stamp.
    pub(crate) fn check_entries(&self, g: &Guard) -> std::result::Result<(), String> {
        let q = lock(&self.queue);
        for &(key, _, addr) in q.entries() {
            // SAFETY: a queued entry owns its ticket (freed only under the lock, held).
            let ptr = unsafe { (*(addr as *const Ticket)).node };
            // SAFETY: a non-null ticket names a node not retired (cut before retire).
            let Some(n) = (unsafe { node_ref(ptr, g) }) else { continue };
            // Relaxed: quiescent.
            let s = n.state.load(Ordering::Relaxed);
            if s & (DEAD | REPLACED) != 0 {
                return Err(format!("an SWA entry names a node in state {s:#x} (not cut)"));
            }
            if key > swa_key(n) {
                return Err("an SWA entry's key is above its node's key".into());
            }
        }
        Ok(())
    }

    /// For `check_invariants` (quiescent): `Err` unless candidate `n` is queued.
    pub(crate) fn check_queued(&self, n: &Node) -> std::result::Result<(), String> {
        let _q = lock(&self.queue);
        // Relaxed: under the lock.
        if n.swa_evq.load(Ordering::Relaxed).is_null() {
            return Err("a node with live, unpinned SWA KV is not in the SWA index".into());
        }
        Ok(())
    }
}

impl Drop for SwaIndex {
    fn drop(&mut self) {
        std::mem::take(&mut *lock(&self.queue)).free_tickets();
    }
}

impl RadixTree {
    /// The sliding window in tokens (0: none).
    #[inline]
    pub fn swa_window(&self) -> usize {
        self.cfg.swa_window
    }

    /// Records an access of `n`'s SWA KV at `now` (SGLang's window-bounded refresh): its SWA
    /// stamp, the SWA index's key, only grows (`fetch_max`, as `RadixTree::touch` does for
    /// the lazy queue's lower bound), behind a load that skips the RMW when it is new
    /// enough.
    #[inline]
    pub(super) fn touch_swa(&self, n: &Node, now: u64) {
        // Relaxed (both): an eviction-order hint; the lower bound rests on the word's own
        // modification order.
        if n.swa_stamp.load(Ordering::Relaxed) < now {
            n.swa_stamp.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// The window-bounded refresh (SGLang's `swa_refresh`): given the nodes of a path back
    /// from its end (each with the tokens it holds of the path), touches the SWA KV of those
    /// within `window + page_size` tokens of the end.
    pub(super) fn refresh_window<'a>(
        &self,
        back: impl Iterator<Item = (&'a Node, usize)>,
        mut acc: usize,
        now: u64,
    ) {
        let limit = self.cfg.swa_window + self.cfg.page_size;
        for (n, len) in back {
            if acc >= limit {
                break;
            }
            self.touch_swa(n, now);
            acc += len;
        }
    }

    /// Adds one SWA pin to `n` if it is live and not a tombstone (the pair of the module
    /// docs).
    #[inline]
    pub(super) fn try_swa_pin(&self, n: &Node) -> SwaPin {
        // Relaxed: only the CAS's expected value.
        let mut s = n.state.load(Ordering::Relaxed);
        loop {
            if s & DEAD != 0 {
                return SwaPin::Dead;
            }
            if s & REPLACED != 0 {
                return SwaPin::Replaced;
            }
            if s & SWA_GONE != 0 {
                return SwaPin::Gone;
            }
            assert!(s & SWA_PIN_MASK < SWA_PIN_MASK, "SWA pin count overflow");
            // AcqRel on success: Acquire so the node's content is seen as of the last
            // writer; Release pairs with a tombstone's Acquire CAS (a pin it sees keeps the
            // SWA KV). Acquire on failure: a REPLACED read is then followed (`resolve`).
            match n.state.compare_exchange_weak(s, s + SWA_PIN, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if s & SWA_PIN_MASK == 0 {
                        // Relaxed: statistics, exact at quiescence.
                        self.swa_protected.fetch_add(n.len() as u64, Ordering::Relaxed);
                    }
                    return SwaPin::Pinned;
                }
                Err(x) => s = x,
            }
        }
    }

    /// Makes `n` an SWA tombstone if it is live with live SWA KV and no SWA pin; `true` if
    /// this call did (its SWA KV is the caller's to free).
    pub(super) fn try_tombstone(&self, n: &Node) -> bool {
        // Relaxed: only the CAS's expected value.
        let mut s = n.state.load(Ordering::Relaxed);
        loop {
            if s & (DEAD | REPLACED | SWA_GONE | SWA_PIN_MASK) != 0 {
                return false;
            }
            // AcqRel: Acquire reads from the last SWA unpin's Release (what the window
            // lock's holder did with the SWA KV happens before it is handed back); Release
            // for an SWA pin that then fails on SWA_GONE. Relaxed on failure: re-read.
            match n.state.compare_exchange_weak(
                s,
                s | SWA_GONE,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    // Relaxed: statistics.
                    self.swa_cached.fetch_sub(n.len() as u64, Ordering::Relaxed);
                    return true;
                }
                Err(x) => s = x,
            }
        }
    }

    /// Whether the non-locking match's run makes the end at `end` valid: called per node
    /// matched with its state `s` and the tokens taken `k` (see the module docs).
    #[inline]
    pub(super) fn swa_run(&self, run: &mut usize, s: u64, k: usize) -> bool {
        if s & SWA_GONE != 0 {
            *run = 0;
            false
        } else {
            *run = run.saturating_add(k);
            *run >= self.cfg.swa_window
        }
    }

    /// Where the window segment of a lock on `key` (a cached, pinned path of namespace
    /// root `root`, ending on a node boundary) starts, by the nodes as they are now.
    pub(super) fn swa_segment_of(&self, root: &Node, key: &[u32], g: &Guard) -> usize {
        let p = self.cfg.page_size;
        let (mut cur, mut pos, mut ends) = (root, 0, Vec::new());
        while pos < key.len() {
            let x = self.next(cur, &key[pos..pos + p], g).expect("pinned pages stay cached");
            pos += x.len();
            ends.push(pos);
            cur = x;
        }
        segment_of(&ends, key.len(), self.cfg.swa_window)
    }

    /// SWA-pins every node of the pinned path `key` below `root` that starts at or past
    /// `from`. With `strict`, a tombstone stops it: `Err(pos)`, the tombstone's start (the
    /// pins on `[from, pos)` are taken); else tombstones are skipped.
    pub(super) fn swa_pin_walk(
        &self,
        root: &Node,
        key: &[u32],
        from: usize,
        strict: bool,
        g: &Guard,
    ) -> std::result::Result<(), usize> {
        let p = self.cfg.page_size;
        let now = self.now();
        let (mut cur, mut pos) = (root, 0);
        while pos < key.len() {
            let mut x = self.next(cur, &key[pos..pos + p], g).expect("pinned pages stay cached");
            if pos >= from {
                loop {
                    match self.try_swa_pin(x) {
                        SwaPin::Pinned => {
                            // The window's SWA KV is in use: refreshed (as SGLang's lock
                            // follows its match's refresh).
                            self.touch_swa(x, now);
                            break;
                        }
                        SwaPin::Replaced => x = self.resolve(x, g),
                        SwaPin::Gone if strict => return Err(pos),
                        SwaPin::Gone => break,
                        SwaPin::Dead => unreachable!("a pinned node is never evicted"),
                    }
                }
            }
            pos += x.len();
            cur = x;
        }
        Ok(())
    }

    /// The locking match with a sliding window (see the module docs): the valid prefix of
    /// `key`, pinned, its window segment SWA-pinned; returns (length, segment start).
    pub(super) fn swa_lock_descend<S: SlotSink>(
        &self,
        root: &Node,
        key: &[u32],
        out: &mut S,
        g: &Guard,
    ) -> (usize, usize) {
        loop {
            out.clear();
            let mut track = SwaTrack::new(self.cfg.swa_window, out.mark());
            let m = self.pin_descend(root, key, out, g, Some(&mut track));
            let b = track.best;
            if b < m {
                out.rewind(track.best_mark);
                self.unpin_walk(root, &key[..m], b, usize::MAX, g);
            }
            if b == 0 {
                return (0, 0);
            }
            let seg = track.segment_start();
            match self.swa_pin_walk(root, &key[..b], seg, true, g) {
                Ok(()) => return (b, seg),
                Err(q) => {
                    // A tombstone landed in the window after the pins read its bit: undo
                    // and look again.
                    self.unpin_walk(root, &key[..q], usize::MAX, seg, g);
                    self.unpin_walk(root, &key[..b], 0, usize::MAX, g);
                }
            }
        }
    }

    /// Queues `n` in the SWA index (trees with a window).
    #[inline]
    pub(super) fn swa_push(&self, n: &Node) {
        if let Some(sw) = &self.swa {
            sw.push(n);
        }
    }

    /// Cuts `n` from the SWA index before it is retired (trees with a window).
    #[inline]
    pub(super) fn swa_cut(&self, n: &Node) {
        if let Some(sw) = &self.swa {
            sw.cut(n);
        }
    }

    /// Frees at least `k` tokens' KV of the kind `target` names (fewer only if nothing more
    /// can go), handing each node's slots to `free` once, with what was freed of it
    /// ([`Freed`]); returns the tokens freed of that kind. `free` is called with no tree
    /// lock held and must not call back into the tree. `Swa` on a tree without a window
    /// frees nothing.
    ///
    /// `Full` is [`RadixTree::evict`] telling, per leaf, whether its SWA KV went with it
    /// (it had not been evicted before). `Swa`: see the module docs. Linearizable per node,
    /// as `evict` is per leaf; unwind-safe as `evict` is.
    pub fn evict_kv(
        &self,
        target: EvictTarget,
        k: usize,
        free: &mut dyn FnMut(Freed, &[u32]),
    ) -> usize {
        let mut scratch = Vec::new();
        let swa = self.cfg.swa_window > 0;
        match target {
            EvictTarget::Full => self.evict_with(k, &mut |x| {
                // Relaxed: DEAD is set (by this pass); SWA_GONE was set, if ever, before it.
                let had = swa && x.state.load(Ordering::Relaxed) & SWA_GONE == 0;
                x.edge.with_slots(&mut scratch, |s| free(Freed { full: true, swa: had }, s))
            }),
            EvictTarget::Swa if !swa => 0,
            EvictTarget::Swa => {
                self.evict_swa_with(k, &mut |x, f| x.edge.with_slots(&mut scratch, |s| free(f, s)))
            }
        }
    }

    /// [`RadixTree::drop_namespace`] saying per leaf what it freed, as
    /// [`RadixTree::evict_kv`] does with [`EvictTarget::Full`]: `swa` is whether the leaf
    /// still had its SWA KV (always false without a window). The per-node `reset` is
    /// `evict_kv(EvictTarget::Full, usize::MAX, free)`.
    pub fn drop_namespace_kv(&self, ns: u64, free: &mut dyn FnMut(Freed, &[u32])) -> usize {
        let mut scratch = Vec::new();
        let swa = self.cfg.swa_window > 0;
        self.drop_namespace_with(ns, &mut |x| {
            // Relaxed: DEAD is set (by this pass); SWA_GONE was set, if ever, before it.
            let had = swa && x.state.load(Ordering::Relaxed) & SWA_GONE == 0;
            x.edge.with_slots(&mut scratch, |s| free(Freed { full: true, swa: had }, s))
        })
    }

    /// The SWA eviction pass behind [`RadixTree::evict_kv`]; `hand` gets each node.
    fn evict_swa_with(&self, k: usize, hand: &mut dyn FnMut(&Node, Freed)) -> usize {
        let sw = self.swa.as_ref().expect("a tree with a window has an SWA index");
        let mut pass = self.pass();
        let mut swa_freed = 0;
        let mut since_repin = 0;
        while swa_freed < k {
            // Retire the leaf evicted last and queue its parent (one index step).
            if pass.done.is_some() {
                self.index.pop_after(pass.done.take(), false, &pass.guard);
            }
            since_repin += 1;
            if since_repin == 64 {
                since_repin = 0;
                pass.guard.repin();
            }
            let Some(x) = sw.pop(&pass.guard) else { break };
            if x.is_leaf(&pass.guard)
                && let Some((len, parent)) = self.evict_leaf(x, &pass.guard)
            {
                {
                    pass.freed += len;
                    pass.leaves += 1;
                    pass.done = Some(Evicted { node: x as *const Node as *mut Node, parent });
                    // Relaxed: DEAD is set by this pass; SWA_GONE, if ever, before it.
                    let had = x.state.load(Ordering::Relaxed) & SWA_GONE == 0;
                    if had {
                        swa_freed += len;
                    }
                    hand(x, Freed { full: true, swa: had });
                    self.drop_tombstone_leaves(&mut pass, parent, hand);
                    continue;
                }
            }
            if self.try_tombstone(x) {
                swa_freed += x.len();
                hand(x, Freed { full: false, swa: true });
            }
        }
        swa_freed
    }

    /// After an SWA pass evicted a leaf whose parent `parent` (non-null: left an unpinned
    /// leaf) is a tombstone: evicts it, and so on up.
    fn drop_tombstone_leaves(
        &self,
        pass: &mut Pass<'_>,
        mut parent: *const Node,
        hand: &mut dyn FnMut(&Node, Freed),
    ) {
        // SAFETY: read from an evicted node's parent field under the pass's guard, under
        // the parent's lock, while the node was linked below it: linked then, after the
        // guard was pinned, so the epoch keeps it for the guard (as in `pop_after`).
        while let Some(p) = unsafe { node_ref(parent.cast_mut(), &pass.guard) } {
            // Acquire: as in `is_swa_candidate`.
            if p.state.load(Ordering::Acquire) & SWA_GONE == 0 {
                return;
            }
            self.index.pop_after(pass.done.take(), false, &pass.guard);
            let Some((len, pp)) = self.evict_leaf(p, &pass.guard) else { return };
            pass.freed += len;
            pass.leaves += 1;
            pass.done = Some(Evicted { node: p as *const Node as *mut Node, parent: pp });
            hand(p, Freed { full: true, swa: false });
            parent = pp;
        }
    }
}
