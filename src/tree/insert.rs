//! Insert: descend, check before any change of shape, then hang a new leaf (or finish on a
//! cached path).

use super::node::NO_PAGE_ID;
use super::*;
use crate::events::Pending;

impl RadixTree {
    /// Caches `tokens[..n]` (n = `tokens.len()` cut to a page multiple) with `slots` (one
    /// per token: a list, or runs of consecutive slots, see [`Slots`]) and returns
    /// `existing`, the match length at the moment of insertion: the slots `slots[..existing]`
    /// are not adopted (the tree keeps its own), nor are `slots[n..]`; the caller owns every
    /// slot not adopted. Runs must be non-empty, stay within `u32` ids and add up to
    /// `tokens.len()` (`InvalidArgument` otherwise); a new leaf stores them as they are.
    pub fn insert<'s>(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: impl Into<Slots<'s>>,
    ) -> Result<usize> {
        self.insert_with(ns, tokens, slots, InsertOptions::default())
    }

    /// [`RadixTree::insert`] with [`InsertOptions`] (eviction priority, and what the request
    /// inserted before, for hit counting).
    pub fn insert_with<'s>(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: impl Into<Slots<'s>>,
        opts: InsertOptions,
    ) -> Result<usize> {
        let src = SlotSource::of(slots.into(), tokens.len())?;
        self.insert_plain(ns, Key::Borrowed(tokens), src, false, opts).map(|(e, _)| e)
    }

    /// Insert and pin `tokens[..n]` atomically (chunked prefill, or a request that keeps
    /// running: release its old lock afterwards). The guard releases the pin when dropped;
    /// [`LockGuard::into_raw`] detaches it as a [`PrefixLock`] value. `tokens`: a slice, or a
    /// shared buffer ([`Key`]) the lock then references instead of copying.
    pub fn insert_and_lock<'s, 'k>(
        &self,
        ns: u64,
        tokens: impl Into<Key<'k>>,
        slots: impl Into<Slots<'s>>,
        opts: InsertOptions,
    ) -> Result<(usize, LockGuard<'_>)> {
        let key = tokens.into();
        let src = SlotSource::of(slots.into(), key.tokens().len())?;
        let (e, l) = self.insert_plain(ns, key, src, true, opts)?;
        Ok((e, self.guard(l.expect("a pinning insert returns a lock"))))
    }

    /// An insert with nothing to collect or prepare.
    pub(super) fn insert_plain(
        &self,
        ns: u64,
        key: Key<'_>,
        slots: SlotSource<'_>,
        pin: bool,
        opts: InsertOptions,
    ) -> Result<(usize, Option<PrefixLock>)> {
        self.insert_core::<Vec<u32>>(ns, key, slots, pin, opts, None, &mut |_, _, _| Ok(()))
    }

    /// The insert behind every public variant. `prepare(existing, cached, Stage::Commit)`
    /// runs once, at the moment the outcome is fixed and before anything changes (for a new
    /// leaf: under its parent's lock, so the cached path cannot change); `cached` holds the
    /// slots of `tokens[..existing]` when `collect` is given (one per token or as runs, by
    /// `S`). If it fails, nothing changes (a pin taken on the way is undone) and its error
    /// is returned. With `pin`, the second value is the lock on `tokens[..n]`.
    ///
    /// Some inserts change the tree's shape before that moment: a new namespace gets its
    /// root, and an edge where the key diverges (or, with `pin`, where it ends) is split.
    /// Before the first such change, `prepare(existing, cached, Stage::Check)` is asked,
    /// once, with the outcome as it stands then (before a split only when `collect` is
    /// given: without the cached slots there is nothing to check; before a new root always,
    /// as nothing is cached there); it must change nothing, and if it fails the insert
    /// returns its error with the tree untouched. So an insert that would be refused
    /// (a pool-mode insert with a bad slot) leaves no split behind and moves no access stamp
    /// (the path's stamps are refreshed only once the insert has succeeded). Only a race
    /// that changes the outcome between the check and the commit can still leave a split
    /// behind a refusal; a split changes no cached token or slot.
    ///
    /// Where it linearizes: an insert that hangs a new leaf, at the store that publishes it
    /// (under the parent's lock); an insert whose whole key is cached already, at the read
    /// that found its last edge, and its `Commit` step (the pool's settle) then runs under
    /// no node lock; the pool step is all or nothing by itself, and pinned (with `pin`) or
    /// not, what it settles against is what the tree held at that read.
    ///
    /// `opts`: the priority and hit counting (see [`InsertOptions`]); applied to the path
    /// once the insert has succeeded, with the access stamps (`Insert::bump`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn insert_core<S: SlotSink + Default>(
        &self,
        ns: u64,
        whole: Key<'_>,
        slots: SlotSource<'_>,
        pin: bool,
        opts: InsertOptions,
        mut collect: Option<&mut S>,
        prepare: &mut dyn FnMut(usize, &S, Stage) -> Result<()>,
    ) -> Result<(usize, Option<PrefixLock>)> {
        let tokens = whole.tokens();
        if tokens.len() != slots.len() {
            return Err(invalid(format!(
                "{} tokens but {} slots (one slot per token)",
                tokens.len(),
                slots.len()
            )));
        }
        let key = &tokens[..self.aligned(tokens.len())];
        let g = self.domain.pin();
        let mut scratch = S::default();
        let want = collect.is_some();
        let cached: &mut S = match collect.as_mut() {
            Some(v) => v,
            None => &mut scratch,
        };
        cached.clear();
        let root = match self.root(ns, &g) {
            Some(r) => r, // possibly dead: `hang` then looks the namespace up again
            None if key.is_empty() => {
                // Nothing to cache in a namespace that has nothing: no root for it.
                prepare(0, &*cached, Stage::Commit)?;
                return Ok((0, pin.then(|| self.lock_of(ns, whole, 0))));
            }
            None => {
                // A new namespace: nothing of the key is cached.
                prepare(0, &*cached, Stage::Check)?;
                self.root_or_create(ns, &g)
            }
        };
        let mut ins = Insert {
            tree: self,
            ns,
            key,
            whole,
            slots,
            pin,
            opts,
            want,
            now: self.now(),
            g: &g,
            root,
            cached,
            prepare,
            path: Vec::new(),
            checked: false,
        };
        let r = ins.run();
        if r.is_err() && ins.root.is_leaf(&g) {
            // A refused insert may leave the root it created (or found) without children:
            // reclaim it, as the eviction of a namespace's last page does.
            self.try_reclaim_root(ins.root, &g);
        }
        r
    }
}

/// One insert under way (see [`RadixTree::insert_with`]): the descent, the check before a
/// change of shape, the new leaf, and the finish, each a method.
struct Insert<'a, 'g, S> {
    tree: &'a RadixTree,
    ns: u64,
    /// The key, cut to a page multiple.
    key: &'a [u32],
    /// The whole key as given (what a lock keeps a share of, when shared).
    whole: Key<'a>,
    slots: SlotSource<'a>,
    pin: bool,
    opts: InsertOptions,
    /// Whether the caller collects the cached slots (and so can check them).
    want: bool,
    now: u64,
    g: &'g Guard,
    root: &'g Node,
    /// The slots of the cached part of the path so far (when `want`).
    cached: &'a mut S,
    prepare: &'a mut dyn FnMut(usize, &S, Stage) -> Result<()>,
    /// The nodes whose access stamps (and metadata) the insert refreshes once it has
    /// succeeded, each with where it ends in the key.
    path: Vec<(&'g Node, usize)>,
    /// Whether `prepare` has checked the outcome before a change to the tree's shape.
    checked: bool,
}

/// What one step of an insert's descent leads to.
enum Next<'g> {
    /// Go on below this node, at this position.
    Down(&'g Node, usize),
    /// Look at the same node again (a racing change, or after a split).
    Again,
    /// Start over from the root (the node to hang the leaf under was evicted or split).
    Restart,
    /// Start over from the namespace's current root (the one the insert had is dead: the
    /// namespace was reclaimed, and is looked up, or created, again).
    NewRoot,
    /// Finished.
    Done(usize),
}

impl<'g, S: SlotSink> Insert<'_, 'g, S> {
    fn run(&mut self) -> Result<(usize, Option<PrefixLock>)> {
        let n = self.key.len();
        let mut cur = self.root;
        let mut pos = 0;
        loop {
            if self.pin {
                // `cur` is pinned by this insert (or is the root): after a split of it, go
                // on from the node that now ends where it ended.
                cur = self.tree.last_of(cur, self.g);
            }
            let next = if pos == n {
                // Everything is cached already and the path ends on a node boundary.
                self.commit(n, pos)?;
                Next::Done(n)
            } else {
                match self.tree.step(cur, &self.key[pos..], self.g) {
                    // Acquire: as in `is_live`. A child being evicted counts as absent: the
                    // leaf path below waits (under `cur`'s lock) until it is unlinked.
                    Some((c, k)) if c.state.load(Ordering::Acquire) & DEAD == 0 => {
                        self.through(c, k, pos)?
                    }
                    _ => self.hang(cur, pos)?,
                }
            };
            match next {
                Next::Down(c, p) => (cur, pos) = (c, p),
                Next::Again => {}
                Next::Restart => {
                    (cur, pos) = (self.root, 0);
                    self.cached.clear();
                    self.path.clear();
                }
                Next::NewRoot => {
                    // Nothing is pinned yet (`cur` was the root). No second `Check`: the
                    // new root is an empty node no reader can tell from none, and a refused
                    // insert reclaims it (`insert_with`).
                    self.root = self.tree.root_or_create(self.ns, self.g);
                    (cur, pos) = (self.root, 0);
                    self.cached.clear();
                    self.path.clear();
                }
                Next::Done(existing) => {
                    for &(x, end) in &self.path {
                        self.tree.touch(x, self.now);
                        self.bump(x, end);
                    }
                    if self.tree.cfg.swa_window > 0 {
                        // The window back from the key's end: a new leaf (stamped at its
                        // creation) holds its tokens after the last node of the path.
                        let last = self.path.last().map_or(0, |&(_, end)| end);
                        let ends = self.path.iter().rev().map(|&(_, e)| e);
                        let starts = ends.clone().skip(1).chain(std::iter::once(0));
                        let back =
                            self.path.iter().rev().zip(starts).map(|(&(x, e), s)| (x, e - s));
                        self.tree.refresh_window(back, self.key.len() - last, self.now);
                    }
                    let lock = self.pin.then(|| self.lock());
                    return Ok((existing, lock));
                }
            }
        }
    }

    /// The lock of an insert that pins, on the whole key; with a sliding window, with SWA
    /// pins on the window segment's nodes that are not tombstones (`swa.rs`).
    fn lock(&self) -> PrefixLock {
        let tree = self.tree;
        let mut l = tree.lock_of(self.ns, self.whole, self.key.len());
        if tree.cfg.swa_window > 0 && !self.key.is_empty() {
            let seg = tree.swa_segment_of(self.root, self.key, self.g);
            let lenient = tree.swa_pin_walk(self.root, self.key, seg, false, self.g);
            debug_assert!(lenient.is_ok(), "a lenient SWA pin walk skips tombstones");
            l.swa_from = seg as u32;
        }
        l
    }

    /// Undoes the pins taken on `key[..pos]` and returns `e`.
    fn fail(&self, e: Error, pos: usize) -> Error {
        if self.pin {
            self.tree.unpin_path(self.root, &self.key[..pos], self.g);
        }
        e
    }

    /// The outcome is fixed at `existing`: `prepare(Commit)`, undoing the pins on failure.
    fn commit(&mut self, existing: usize, pos: usize) -> Result<()> {
        (self.prepare)(existing, &*self.cached, Stage::Commit).map_err(|e| self.fail(e, pos))
    }

    /// The key's next `k` tokens (at `pos`) match the live edge `c`.
    fn through(&mut self, c: &'g Node, k: usize, pos: usize) -> Result<Next<'g>> {
        let n = self.key.len();
        if k == c.len() {
            // The whole edge is cached: go on below it.
            if self.pin && !matches!(self.tree.try_pin(c), Pin::Pinned) {
                return Ok(Next::Again); // evicted or split meanwhile: look again
            }
            if self.want {
                self.cached.take(c, k);
            }
            self.path.push((c, pos + k));
            return Ok(Next::Down(c, pos + k));
        }
        // Ends inside this edge: split it there anyway when the insert changes metadata the
        // policy reads, so that only the inserted tokens take it (see `InsertOptions`).
        let split_end = pos + k == n && !self.pin && self.splits_at_end(c);
        if self.want && (self.pin || pos + k < n || split_end) && !self.checked {
            // A split comes next: check the outcome first (`existing = pos + k`). Only a
            // caller that collects the cached slots can check anything (the pool's
            // inserts); the others would only pay for the copy.
            self.checked = true;
            let mark = self.cached.mark();
            self.cached.take(c, k);
            let r = (self.prepare)(pos + k, &*self.cached, Stage::Check);
            self.cached.rewind(mark);
            r.map_err(|e| self.fail(e, pos))?;
        }
        if pos + k < n || split_end {
            // Diverges inside the edge (or ends there, see above): split it, then look
            // again.
            self.tree.split(c, k, false, self.g);
            return Ok(Next::Again);
        }
        // Ends inside this edge: all of the key is cached.
        if self.pin {
            let Some(u) = self.tree.split(c, k, true, self.g) else {
                return Ok(Next::Again);
            };
            if self.want {
                self.cached.take(u, u.len());
            }
            self.path.push((u, n));
            return Ok(Next::Down(u, n));
        }
        if self.want {
            self.cached.take(c, k);
        }
        self.commit(n, pos)?;
        self.path.push((c, n));
        Ok(Next::Done(n))
    }

    /// What the insert adds to the metadata of a node ending at `end` in the key: the
    /// priority to raise it to, and the hits to count (see [`InsertOptions`]); `None` when
    /// the policy reads neither or there is nothing to change.
    fn bump_of(&self, end: usize) -> Option<(i32, u32)> {
        let pol = self.tree.cfg.policy;
        let prio = if pol.reads_priority() { self.opts.priority } else { i32::MIN };
        let hits = (pol.reads_hits() && end > self.opts.inserted_len) as u32;
        (prio != i32::MIN || hits > 0).then_some((prio, hits))
    }

    /// The metadata word of a new leaf ending at `end`: the insert's priority, and one hit
    /// if it counts one (under the policies that read them; see [`InsertOptions`]).
    fn leaf_meta(&self, end: usize) -> u64 {
        let pol = self.tree.cfg.policy;
        let prio = if pol.reads_priority() { self.opts.priority } else { 0 };
        policy::meta(prio, (pol.reads_hits() && end > self.opts.inserted_len) as u32)
    }

    /// Whether an insert whose key ends inside the live edge `c` splits it there: when it
    /// would count a hit on it or raise its priority.
    fn splits_at_end(&self, c: &Node) -> bool {
        let Some((prio, hits)) = self.bump_of(self.key.len()) else { return false };
        // Relaxed: an eviction-order hint (a racing raise only makes the split unneeded).
        hits > 0 || prio > policy::meta_priority(c.meta.load(Ordering::Relaxed))
    }

    /// Applies the insert's priority and hit to `x`, a node of its path ending at `end`. If a
    /// split froze `x` meanwhile (`split.rs`, step (2')), the bump goes to the nodes that
    /// hold `x`'s tokens now: a fresh descent along the key bumps every node overlapping
    /// `x`'s range (`x`'s halves, or whatever replaced them since; none if they went).
    fn bump(&self, x: &'g Node, end: usize) {
        let Some((prio, hits)) = self.bump_of(end) else { return };
        if self.tree.try_bump(x, prio, hits) {
            return;
        }
        let start = end - x.len();
        let mut cur = self.root;
        let mut pos = 0;
        while pos < end {
            // `step` resolves replaced nodes: one whose bump failed below is REPLACED (the
            // freeze follows that CAS, and the failed CAS read it with Acquire), so looking
            // again finds what replaced it.
            let Some((c, k)) = self.tree.step(cur, &self.key[pos..], self.g) else { return };
            if pos + c.len() > start && !self.tree.try_bump(c, prio, hits) {
                continue; // split meanwhile: look again
            }
            if k < c.len() {
                return; // the key leaves the tree (or ends) inside `c`
            }
            pos += k;
            cur = c;
        }
    }

    /// No live child of `cur` holds the key's page at `pos`: hang a new leaf with the rest
    /// of the key under `cur`. The leaf is built (its tokens and slots copied) before the
    /// lock, so `cur`'s lock is held only to check, settle and publish; if the check fails
    /// the leaf is dropped.
    ///
    /// Order: lock `cur`, re-check that it is live (an eviction or a split of `cur`, or the
    /// reclaim of a root, sets its bit under this lock, so a live `cur` stays live until
    /// unlocked; see the `namespace` module for the root) and that no
    /// child holds the page (one may have been added, or one being evicted is not unlinked
    /// yet), `prepare(Commit)`, move the counters, publish the new table (Release), unlock,
    /// queue the leaf. With KV events on, the new pages are hashed before the lock and the
    /// `BlockStored` is pushed just before the publish (see the comment there).
    fn hang(&mut self, cur: &'g Node, pos: usize) -> Result<Next<'g>> {
        let (tree, p) = (self.tree, self.tree.cfg.page_size);
        let page = &self.key[pos..pos + p];
        let meta = self.leaf_meta(self.key.len());
        let mut built =
            Box::new(self.slots.leaf(&self.key[pos..], pos, self.pin as u64, self.now, meta, p));
        built.start = pos as u32;
        // KV events (one field read; nothing else with events off): give the new pages their
        // ids and build the store, naming the parent page by id (`cur`'s last page; none at
        // a root), all before the lock. Nothing is hashed here: the batch's consumer hashes
        // the pages from the parent's chain state, in stream order
        // (`crate::events::resolve`), which the push below makes right.
        let stored = tree.events.as_deref().map(|sink| {
            let n = ((self.key.len() - pos) / p) as u64;
            // Relaxed: ids need only be unique; the stream's order is the pushes'.
            let first = tree.page_ids.fetch_add(n, Ordering::Relaxed);
            built.page_id = first;
            let parent =
                (cur.page_id != NO_PAGE_ID).then(|| cur.page_id + (cur.len() / p) as u64 - 1);
            let info = sink.namespace(self.ns);
            // The leaf's edge is exactly the new tokens: the store shares them.
            let (words, len) = built.edge.shared();
            (sink, Pending::Stored { info, parent, first, words, len })
        });
        let guard = lock(&cur.lock);
        // Relaxed: DEAD and REPLACED are set only under `cur`'s lock, which we hold.
        if cur.state.load(Ordering::Relaxed) & (DEAD | REPLACED) != 0 {
            drop(guard);
            if std::ptr::eq(cur, self.root) {
                // The namespace was reclaimed (a root only ever dies): never hang a leaf
                // under an unlinked root; look it up (or create it) again.
                return Ok(Next::NewRoot);
            }
            // Pinned, `cur` cannot be evicted, only split: `last_of` finds its successor.
            // Not pinned, it may be gone: start over.
            return Ok(if self.pin { Next::Again } else { Next::Restart });
        }
        if cur.child(page, self.g).is_some() {
            return Ok(Next::Again); // someone else added it (live: `cur` is locked)
        }
        self.commit(pos, pos)?;
        let len = (self.key.len() - pos) as u64;
        let leaf = Box::into_raw(built);
        // SAFETY: just allocated, not shared yet.
        let ln = unsafe { &*leaf };
        // Relaxed: the leaf is published by the Release store of the table below.
        ln.parent.store(cur as *const Node as *mut Node, Ordering::Relaxed);
        // Relaxed: statistics, exact at quiescence.
        if self.pin {
            tree.protected.fetch_add(len, Ordering::Relaxed);
        } else {
            tree.evictable.fetch_add(len, Ordering::Relaxed);
        }
        tree.cached.fetch_add(len, Ordering::Relaxed);
        tree.nodes.fetch_add(1, Ordering::Relaxed);
        tree.inserted.fetch_add(len, Ordering::Relaxed);
        // Relaxed: `cur` is locked: this is its current table, ordered by the lock.
        let old = cur.children.load(Ordering::Relaxed, self.g);
        // SAFETY: `cur` is locked, so `old` is its current table and not retired.
        let table = match unsafe { old.as_ref() } {
            Some(t) => t.with_added(page[0], leaf),
            None => ChildTable::single(page[0], leaf),
        };
        // KV events: the leaf's `BlockStored` is pushed here, under `cur`'s lock, after the
        // commit (nothing below can fail, so no store is pushed for a leaf not hung) and
        // before the Release store that publishes the leaf. So: an insert below the leaf
        // (which must Acquire-load this table first) pushes its store after this one; an
        // eviction of the leaf (which finds it only through the index push below, or the
        // unpin of a pinned insert) pushes its removal after; and `cur`'s own store was
        // pushed before `cur` was published, which this insert read to get here.
        if let Some((sink, ev)) = stored {
            sink.push_pending(ev);
        }
        // Release: publishes the leaf and the table to readers that Acquire-load it.
        cur.children.store(Owned::new(table), Ordering::Release);
        if !old.is_null() {
            // SAFETY: swapped out under `cur`'s lock, so no thread pinned from now on can
            // load it; the epoch frees it after every guard that could have is gone.
            unsafe { self.g.defer_destroy(old) };
        }
        drop(guard);
        if !self.pin {
            tree.index.push(ln);
        }
        if tree.swa.is_some() {
            // Relaxed: statistics. The new leaf has live SWA KV and, whatever an insert that
            // pins adds later, no SWA pin yet: an SWA candidate (`pop` re-checks).
            tree.swa_cached.fetch_add(len, Ordering::Relaxed);
            tree.swa_push(ln);
        }
        Ok(Next::Done(pos))
    }
}
