//! Pins (path pins, SGLang's `lock_ref`): the pin and unpin steps, the locking match, and
//! release.

use super::*;

/// The result of trying to pin one node.
pub(super) enum Pin {
    Pinned,
    Dead,
    Replaced,
}

impl RadixTree {
    pub(super) fn on_pinned(&self, len: usize) {
        self.evictable.fetch_sub(len as u64, Ordering::Relaxed);
        self.protected.fetch_add(len as u64, Ordering::Relaxed);
    }

    pub(super) fn on_unpinned(&self, len: usize) {
        self.protected.fetch_sub(len as u64, Ordering::Relaxed);
        self.evictable.fetch_add(len as u64, Ordering::Relaxed);
    }

    /// Adds one pin to `n` if it is live (crossbeam-skiplist's `try_increment`).
    #[inline]
    pub(super) fn try_pin(&self, n: &Node) -> Pin {
        let mut s = n.state.load(Ordering::SeqCst);
        loop {
            if s & DEAD != 0 {
                return Pin::Dead;
            }
            if s & REPLACED != 0 {
                return Pin::Replaced;
            }
            assert!(s & PIN_MASK < PIN_MASK, "pin count overflow");
            match n.state.compare_exchange_weak(s, s + 1, Ordering::SeqCst, Ordering::SeqCst) {
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
    #[inline]
    pub(super) fn try_unpin(&self, n: &Node, g: &Guard) -> bool {
        let mut s = n.state.load(Ordering::SeqCst);
        loop {
            if s & REPLACED != 0 {
                return false;
            }
            assert!(s & PIN_MASK > 0 && s & DEAD == 0, "unpin of a node this lock did not pin");
            match n.state.compare_exchange_weak(s, s - 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {
                    if s & PIN_MASK == 1 {
                        self.on_unpinned(n.len());
                        if n.is_leaf(g) {
                            self.index.push(n);
                        }
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
        let p = self.cfg.page_size;
        let mut cur = root;
        let mut pos = 0;
        while pos < key.len() {
            let c = cur.child(&key[pos..pos + p], g).expect("pinned pages stay cached");
            let mut x = self.resolve(c, g);
            while !self.try_unpin(x, g) {
                x = self.resolve(x, g);
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
    pub fn match_and_lock(&self, ns: u64, tokens: &[u32], out: &mut Vec<u32>) -> LockGuard<'_> {
        let lock = self.match_and_lock_raw(ns, tokens, out);
        self.guard(lock)
    }

    /// [`RadixTree::match_and_lock`] returning a detached [`PrefixLock`].
    pub fn match_and_lock_raw(&self, ns: u64, tokens: &[u32], out: &mut Vec<u32>) -> PrefixLock {
        self.lock_into(ns, tokens, out)
    }

    /// [`RadixTree::match_and_lock`] writing the matched slots as runs, as
    /// [`RadixTree::match_prefix_runs`] does.
    pub fn match_and_lock_runs(
        &self,
        ns: u64,
        tokens: &[u32],
        out: &mut Vec<SlotRun>,
    ) -> LockGuard<'_> {
        let lock = self.lock_into(ns, tokens, out);
        self.guard(lock)
    }

    /// [`RadixTree::match_and_lock_runs`] returning a detached [`PrefixLock`].
    pub fn match_and_lock_runs_raw(
        &self,
        ns: u64,
        tokens: &[u32],
        out: &mut Vec<SlotRun>,
    ) -> PrefixLock {
        self.lock_into(ns, tokens, out)
    }

    pub(super) fn lock_into<S: SlotSink>(
        &self,
        ns: u64,
        tokens: &[u32],
        out: &mut S,
    ) -> PrefixLock {
        out.clear();
        let n = self.aligned(tokens.len());
        let g = self.domain.pin();
        let m = match self.root(ns, &g) {
            None => 0,
            Some(root) => self.pin_descend(root, &tokens[..n], out, &g),
        };
        self.matches.record(tokens.len(), m);
        PrefixLock { tree_id: self.id, ns, tokens: tokens[..m].into() }
    }

    /// Pins the longest cached prefix of `key`, splitting at its end; returns its length.
    pub(super) fn pin_descend<S: SlotSink>(
        &self,
        root: &Node,
        key: &[u32],
        out: &mut S,
        g: &Guard,
    ) -> usize {
        let p = self.cfg.page_size;
        let now = self.now();
        let mut cur = root;
        let mut pos = 0;
        'step: while pos < key.len() {
            cur = self.last_of(cur, g);
            let Some(c) = cur.child_candidate(&key[pos..pos + p], g) else {
                break;
            };
            let mut c = self.resolve(c, g);
            loop {
                let k = common_prefix(c.key(), &key[pos..]) / p * p;
                if k == 0 {
                    break 'step; // the candidate differs within the first page
                }
                if k < c.len() {
                    match self.split(c, k, true, g) {
                        Some(u) => {
                            out.take(u, u.len());
                            self.touch(u, now);
                            pos += k;
                            break 'step;
                        }
                        None => continue 'step,
                    }
                }
                match self.try_pin(c) {
                    Pin::Pinned => {
                        out.take(c, c.len());
                        self.touch(c, now);
                        pos += k;
                        cur = c;
                        continue 'step;
                    }
                    Pin::Dead => break 'step,
                    Pin::Replaced => c = self.resolve(c, g),
                }
            }
        }
        pos
    }

    /// Wraps a detached lock of this tree in a guard.
    pub(crate) fn guard(&self, lock: PrefixLock) -> LockGuard<'_> {
        LockGuard { tree: self, lock: Some(lock) }
    }

    /// A lock on `key` of `ns`.
    pub(super) fn lock_of(&self, ns: u64, key: &[u32]) -> PrefixLock {
        PrefixLock { tree_id: self.id, ns, tokens: key.into() }
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
        self.unpin_path(root, &lock.tokens, &g);
        Ok(())
    }
}
