//! Pins (path pins, SGLang's `lock_ref`): the pin and unpin steps, the locking match, and
//! release.

use super::node::{SWA_GONE, SWA_PIN, SWA_PIN_MASK};
use super::swa::SwaTrack;
use super::*;

/// The result of trying to pin one node.
pub(super) enum Pin {
    Pinned,
    Dead,
    Replaced,
}

impl RadixTree {
    /// Moves `len` tokens from evictable to protected (a node's 0 -> 1).
    pub(super) fn on_pinned(&self, len: usize) {
        // Relaxed: statistics, exact at quiescence (joining the threads orders them).
        self.evictable.fetch_sub(len as u64, Ordering::Relaxed);
        self.protected.fetch_add(len as u64, Ordering::Relaxed);
    }

    /// Moves `len` tokens from protected to evictable (a node's 1 -> 0).
    pub(super) fn on_unpinned(&self, len: usize) {
        // Relaxed: as in `on_pinned`.
        self.protected.fetch_sub(len as u64, Ordering::Relaxed);
        self.evictable.fetch_add(len as u64, Ordering::Relaxed);
    }

    /// Adds one pin to `n` if it is live (crossbeam-skiplist's `try_increment`): the count
    /// goes up only from a state with neither `DEAD` nor `REPLACED`, so a pin racing an
    /// eviction (CAS `0 -> DEAD`) or a split (CAS `v -> v | REPLACED`) either lands first
    /// or fails cleanly.
    #[inline]
    pub(super) fn try_pin(&self, n: &Node) -> Pin {
        // Relaxed: only the CAS's expected value; the CAS re-reads the word.
        let mut s = n.state.load(Ordering::Relaxed);
        loop {
            if s & DEAD != 0 {
                return Pin::Dead;
            }
            if s & REPLACED != 0 {
                return Pin::Replaced;
            }
            assert!(s & PIN_MASK < PIN_MASK, "pin count overflow");
            // AcqRel on success: Acquire so the pinned node's content and table are seen as
            // of the last writer; Release pairs with the evictor's Acquire CAS (a pin it
            // sees keeps the node). Acquire on failure: the value read may carry REPLACED,
            // and the caller then follows `forward` (as in `resolve`).
            match n.state.compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    if s & PIN_MASK == 0 {
                        self.on_pinned(n.len());
                    }
                    return Pin::Pinned;
                }
                Err(x) => s = x,
            }
        }
    }

    /// Removes one pin from `n`; `false` if `n` was replaced (the pin lives on in its
    /// replacements). Queues `n` for eviction when it becomes an unpinned leaf.
    ///
    /// **The unpin/evict pair.** This 1 -> 0 CAS followed by the `is_leaf` load races an
    /// eviction of `n`'s last child, which stores `n`'s table without the child and then
    /// reads `n`'s state (`evict_leaf`). At least one of the two must see the other, or `n`
    /// becomes an unpinned leaf that is never queued (and `evict`/`reset` never free it).
    /// The evictor reads the state with an RMW (`fetch_or(0, AcqRel)`), so the two
    /// accesses to `n.state` are ordered in its modification order: if the evictor's RMW
    /// comes after this CAS it reads the count 0 and queues `n`; if it comes before, this
    /// CAS (Acquire) reads from it (Release), so the evictor's table store happens before
    /// the `is_leaf` load below, which then sees `n` as a leaf and queues it. No SeqCst
    /// total order is relied on (loom checks this pair exactly; it models SeqCst loads
    /// and stores only as Acquire/Release).
    ///
    /// With a sliding window it is generalized: it takes one pin off `n` with `full`, and
    /// one SWA pin with `swa` unless `n` is an SWA tombstone (which a window lock never
    /// pins: see `swa.rs`), both in one CAS; and it queues `n` for SWA eviction when its
    /// SWA pins go to 0.
    #[inline]
    pub(super) fn try_unpin(&self, n: &Node, full: bool, swa: bool, g: &Guard) -> bool {
        // Relaxed: only the CAS's expected value.
        let mut s = n.state.load(Ordering::Relaxed);
        loop {
            if s & REPLACED != 0 {
                return false;
            }
            let swa = swa && s & SWA_GONE == 0;
            let dec = full as u64 + if swa { SWA_PIN } else { 0 };
            assert!(
                (!full || s & PIN_MASK > 0) && (!swa || s & SWA_PIN_MASK > 0) && s & DEAD == 0,
                "unpin of a node this lock did not pin"
            );
            if dec == 0 {
                return true;
            }
            // AcqRel on success: Acquire for the unpin/evict pair above; Release so what the
            // lock's holder did with the slots happens before an eviction that sees the 0
            // (and, for the SWA pin, before a tombstone's CAS that sees it).
            // Acquire on failure: as in `try_pin`.
            match n.state.compare_exchange_weak(s, s - dec, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    if full && s & PIN_MASK == 1 {
                        self.on_unpinned(n.len());
                        if n.is_leaf(g) {
                            self.index.push(n);
                        }
                    }
                    if swa && s & SWA_PIN_MASK == SWA_PIN {
                        // Relaxed: statistics, exact at quiescence.
                        self.swa_protected.fetch_sub(n.len() as u64, Ordering::Relaxed);
                        self.swa_push(n);
                    }
                    return true;
                }
                Err(x) => s = x,
            }
        }
    }

    /// Removes one pin from every node on the path `key` below `root` (a prefix this
    /// thread pinned).
    pub(super) fn unpin_path(&self, root: &Node, key: &[u32], g: &Guard) {
        self.unpin_walk(root, key, 0, usize::MAX, g);
    }

    /// Walks the pinned path `key` below `root` and, on every node starting at or past
    /// `full_from`, takes one pin off, and on every node starting at or past `swa_from`
    /// one SWA pin (see [`RadixTree::try_unpin`]).
    pub(super) fn unpin_walk(
        &self,
        root: &Node,
        key: &[u32],
        full_from: usize,
        swa_from: usize,
        g: &Guard,
    ) {
        let p = self.cfg.page_size;
        let mut cur = root;
        let mut pos = 0;
        while pos < key.len() {
            let mut x = self.next(cur, &key[pos..pos + p], g).expect("pinned pages stay cached");
            let (full, swa) = (pos >= full_from, pos >= swa_from);
            if full || swa {
                while !self.try_unpin(x, full, swa, g) {
                    x = self.resolve(x, g);
                }
            }
            debug_assert!(pos + x.len() <= key.len(), "a lock ends on a node boundary");
            pos += x.len();
            cur = x;
        }
    }

    /// Match and pin atomically: like [`RadixTree::match_prefix`], and the returned guard
    /// pins the matched pages (they stay cached with the same slots) until it is dropped.
    /// Where the match ends inside an edge, the edge is split so the lock ends on a node
    /// boundary. A lock on an empty match is valid too.
    /// `out` is any [`SlotSink`], as in [`RadixTree::match_prefix`];
    /// [`LockGuard::into_raw`] detaches the lock as a [`PrefixLock`] value.
    ///
    /// `tokens`: a slice, or a shared buffer ([`Key`]) the lock then keeps a reference to
    /// instead of a copy of what it pinned.
    pub fn match_and_lock<'k, S: SlotSink>(
        &self,
        ns: u64,
        tokens: impl Into<Key<'k>>,
        out: &mut S,
    ) -> LockGuard<'_> {
        let lock = self.lock_into(ns, tokens.into(), out);
        self.guard(lock)
    }

    /// The match and pin behind [`RadixTree::match_and_lock`], returning the lock as a value.
    pub(crate) fn lock_into<S: SlotSink>(&self, ns: u64, key: Key<'_>, out: &mut S) -> PrefixLock {
        let lock = self.lock_unrecorded(ns, key, out);
        self.matches.record(key.tokens().len(), lock.len());
        lock
    }

    /// A locking match that the match statistics do not count (the host tier's backup pin:
    /// a second lock over pages its own insert has just pinned, no match of the caller's);
    /// otherwise [`RadixTree::lock_into`], access stamps included.
    #[inline]
    pub(crate) fn lock_unrecorded<'k, S: SlotSink>(
        &self,
        ns: u64,
        key: impl Into<Key<'k>>,
        out: &mut S,
    ) -> PrefixLock {
        let key = key.into();
        let tokens = key.tokens();
        out.clear();
        let n = self.aligned(tokens.len());
        let g = self.domain.pin();
        let (m, swa_from) = match self.root(ns, &g) {
            None => (0, if self.cfg.swa_window > 0 { 0 } else { usize::MAX }),
            Some(root) if self.cfg.swa_window > 0 => {
                self.swa_lock_descend(root, &tokens[..n], out, &g)
            }
            Some(root) => (self.pin_descend(root, &tokens[..n], out, &g, None), usize::MAX),
        };
        PrefixLock { tree_id: self.id, ns, tokens: key.lock_tokens(m), swa_from: swa_from as u32 }
    }

    /// Pins the longest cached prefix of `key`, splitting at its end; returns its length.
    /// With `swa`, records each pinned node's SWA state for the window's validity
    /// (`swa.rs`).
    pub(super) fn pin_descend<S: SlotSink>(
        &self,
        root: &Node,
        key: &[u32],
        out: &mut S,
        g: &Guard,
        mut swa: Option<&mut SwaTrack>,
    ) -> usize {
        let now = self.now();
        let mut cur = root;
        let mut pos = 0;
        while pos < key.len() {
            // `cur` is pinned by this descent (or is the root): after a split of it, go on
            // from the node that now ends where it ended.
            cur = self.last_of(cur, g);
            let Some((c, k)) = self.step(cur, &key[pos..], g) else {
                break; // no child holds the next page
            };
            if k < c.len() {
                // Ends inside this edge: split it, pinning the upper half.
                match self.split(c, k, true, g) {
                    Some(u) => {
                        out.take(u, u.len());
                        self.touch(u, now);
                        pos += k;
                        if let Some(t) = swa.as_deref_mut() {
                            // Acquire: as in `is_swa_candidate`.
                            t.step(u.state.load(Ordering::Acquire), k, pos, out);
                        }
                        break;
                    }
                    None => continue, // replaced or evicted meanwhile: look again
                }
            }
            match self.try_pin(c) {
                Pin::Pinned => {
                    out.take(c, c.len());
                    self.touch(c, now);
                    pos += k;
                    if let Some(t) = swa.as_deref_mut() {
                        // Acquire: as in `is_swa_candidate`.
                        t.step(c.state.load(Ordering::Acquire), k, pos, out);
                    }
                    cur = c;
                }
                Pin::Dead => break,        // being evicted: absent
                Pin::Replaced => continue, // split meanwhile: look again
            }
        }
        pos
    }

    /// Wraps a detached lock of this tree in a guard.
    pub(crate) fn guard(&self, lock: PrefixLock) -> LockGuard<'_> {
        LockGuard { tree: self, lock: Some(lock) }
    }

    /// A lock on the first `n` tokens of `key` in `ns`.
    pub(super) fn lock_of(&self, ns: u64, key: Key<'_>, n: usize) -> PrefixLock {
        // With a window: no SWA pin (the segment starts at the lock's end).
        let swa_from = if self.cfg.swa_window > 0 { n as u32 } else { u32::MAX };
        PrefixLock { tree_id: self.id, ns, tokens: key.lock_tokens(n), swa_from }
    }

    /// Unpins what `lock` pinned. `InvalidLock` for a lock of another tree.
    pub fn release(&self, lock: PrefixLock) -> Result<()> {
        if lock.tree_id != self.id {
            return Err(Error::InvalidLock);
        }
        if lock.tokens.is_empty() {
            return Ok(());
        }
        let g = self.domain.pin();
        let root = self.root(lock.ns, &g).ok_or(Error::InvalidLock)?;
        let swa_from = if lock.swa_from == u32::MAX { usize::MAX } else { lock.swa_from as usize };
        self.unpin_walk(root, &lock.tokens, 0, swa_from, &g);
        Ok(())
    }
}
