//! Insert: descend, check before any change of shape, then hang a new leaf (or finish on a
//! cached path).

use super::*;

impl RadixTree {
    /// Caches `tokens[..n]` (n = `tokens.len()` cut to a page multiple) with `slots`
    /// (same length as `tokens`) and returns `existing`, the match length at the moment
    /// of insertion: the slots `slots[..existing]` are not adopted (the tree keeps its
    /// own), nor are `slots[n..]`; the caller owns every slot not adopted.
    pub fn insert(&self, ns: u64, tokens: &[u32], slots: &[u32]) -> Result<usize> {
        self.insert_plain(ns, tokens, SlotSource::List(slots), false).map(|(e, _)| e)
    }

    /// [`RadixTree::insert`] with the slots given as runs of consecutive slots, in token
    /// order (their lengths must add up to `tokens.len()`; `InvalidArgument` otherwise, or
    /// for an empty run or one past slot id `u32::MAX`): the new leaf stores the runs as
    /// they are, O(runs) instead of scanning every slot. The runs `slots[..existing]` and
    /// past `n` cover are not adopted, as in `insert`.
    pub fn insert_runs(&self, ns: u64, tokens: &[u32], runs: &[SlotRun]) -> Result<usize> {
        let src = SlotSource::runs(runs, tokens.len())?;
        self.insert_plain(ns, tokens, src, false).map(|(e, _)| e)
    }

    /// [`RadixTree::insert_and_lock_raw`] with the slots given as runs (as in
    /// [`RadixTree::insert_runs`]).
    pub fn insert_and_lock_runs_raw(
        &self,
        ns: u64,
        tokens: &[u32],
        runs: &[SlotRun],
    ) -> Result<(usize, PrefixLock)> {
        let src = SlotSource::runs(runs, tokens.len())?;
        let (e, l) = self.insert_plain(ns, tokens, src, true)?;
        Ok((e, l.expect("a pinning insert returns a lock")))
    }

    /// An insert with nothing to collect or prepare.
    pub(super) fn insert_plain(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: SlotSource<'_>,
        pin: bool,
    ) -> Result<(usize, Option<PrefixLock>)> {
        self.insert_with::<Vec<u32>>(ns, tokens, slots, pin, None, &mut |_, _, _| Ok(()))
    }

    /// Insert and pin `tokens[..n]` atomically (chunked prefill, or a request that keeps
    /// running: release its old lock afterwards).
    pub fn insert_and_lock(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: &[u32],
    ) -> Result<(usize, LockGuard<'_>)> {
        let (e, l) = self.insert_and_lock_raw(ns, tokens, slots)?;
        Ok((e, self.guard(l)))
    }

    /// [`RadixTree::insert_and_lock`] returning a detached [`PrefixLock`].
    pub fn insert_and_lock_raw(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: &[u32],
    ) -> Result<(usize, PrefixLock)> {
        let (e, l) = self.insert_plain(ns, tokens, SlotSource::List(slots), true)?;
        Ok((e, l.expect("a pinning insert returns a lock")))
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
    pub(crate) fn insert_with<S: SlotSink + Default>(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: SlotSource<'_>,
        pin: bool,
        mut collect: Option<&mut S>,
        prepare: &mut dyn FnMut(usize, &S, Stage) -> Result<()>,
    ) -> Result<(usize, Option<PrefixLock>)> {
        if tokens.len() != slots.len() {
            return Err(invalid(format!(
                "{} tokens but {} slots (one slot per token)",
                tokens.len(),
                slots.len()
            )));
        }
        let p = self.cfg.page_size;
        let n = self.aligned(tokens.len());
        let key = &tokens[..n];
        let g = self.domain.pin();
        let root = match self.root(ns, &g) {
            Some(r) => r,
            None => {
                // A new namespace: nothing of the key is cached.
                prepare(0, &S::default(), Stage::Check)?;
                self.root_or_create(ns, &g)
            }
        };
        let now = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        let want = collect.is_some();
        let mut scratch = S::default();
        let cached: &mut S = match collect.as_mut() {
            Some(v) => v,
            None => &mut scratch,
        };
        cached.clear();
        let mut cur = root;
        let mut pos = 0;
        // The nodes whose access stamps the insert refreshes, once it has succeeded.
        let mut path: Vec<&Node> = Vec::new();
        // Whether `prepare` has checked the outcome before a change to the tree's shape.
        let mut checked = false;
        let fail = |e: Error, pos: usize| {
            if pin {
                self.unpin_path(root, &key[..pos], &g);
            }
            Err(e)
        };
        let done = |path: &[&Node]| {
            for n in path {
                self.touch(n, now);
            }
        };
        'step: loop {
            if pin {
                cur = self.last_of(cur, &g);
            }
            if pos == n {
                // Everything is cached already and the path ends on a node boundary.
                if let Err(e) = prepare(n, cached, Stage::Commit) {
                    return fail(e, pos);
                }
                done(&path);
                return Ok((n, pin.then(|| self.lock_of(ns, key))));
            }
            let page = &key[pos..pos + p];
            if let Some(c) = cur.child(page, &g) {
                let c = self.resolve(c, &g);
                if c.state.load(Ordering::SeqCst) & DEAD == 0 {
                    let k = common_prefix(c.key(), &key[pos..]) / p * p;
                    if k == c.len() {
                        if pin {
                            match self.try_pin(c) {
                                Pin::Pinned => {}
                                Pin::Dead | Pin::Replaced => continue 'step,
                            }
                        }
                        if want {
                            cached.take(c, c.len());
                        }
                        path.push(c);
                        pos += k;
                        cur = c;
                        continue 'step;
                    }
                    if want && (pin || pos + k < n) && !checked {
                        // A split comes next: check the outcome first (`existing = pos + k`).
                        // Only a caller that collects the cached slots can check anything
                        // (the pool's inserts); the others would only pay for the copy.
                        checked = true;
                        let mark = cached.mark();
                        cached.take(c, k);
                        let r = prepare(pos + k, cached, Stage::Check);
                        cached.rewind(mark);
                        if let Err(e) = r {
                            return fail(e, pos);
                        }
                    }
                    if pos + k == n {
                        // Ends inside this edge: all of it is cached.
                        if pin {
                            let Some(u) = self.split(c, k, true, &g) else {
                                continue 'step;
                            };
                            if want {
                                cached.take(u, u.len());
                            }
                            path.push(u);
                            pos = n;
                            cur = u;
                            continue 'step;
                        }
                        if want {
                            cached.take(c, k);
                        }
                        if let Err(e) = prepare(n, cached, Stage::Commit) {
                            return fail(e, pos);
                        }
                        path.push(c);
                        done(&path);
                        return Ok((n, None));
                    }
                    // Diverges inside the edge: split it, then look again.
                    self.split(c, k, false, &g);
                    continue 'step;
                }
            }
            // No live child for this page: hang a new leaf under `cur`. The leaf is built
            // (its tokens and slots copied) before the lock, so the parent's lock is held
            // only to check, settle and publish; if the check fails the leaf is dropped.
            let built = Box::new(slots.leaf(&key[pos..], pos, pin as u64, now, p));
            let guard = lock(&cur.lock);
            let s = cur.state.load(Ordering::SeqCst);
            if s & (DEAD | REPLACED) != 0 {
                drop(guard);
                if !pin {
                    // `cur` was evicted or split under us: start over.
                    cur = root;
                    pos = 0;
                    cached.clear();
                    path.clear();
                }
                continue 'step;
            }
            if cur.child(page, &g).is_some() {
                continue 'step; // someone else added it (live: the parent is locked)
            }
            if let Err(e) = prepare(pos, cached, Stage::Commit) {
                drop(guard);
                return fail(e, pos);
            }
            let len = n - pos;
            let leaf = Box::into_raw(built);
            // SAFETY: just allocated, not shared yet.
            let ln = unsafe { &*leaf };
            ln.parent.store(cur as *const Node as *mut Node, Ordering::SeqCst);
            if pin {
                self.protected.fetch_add(len as u64, Ordering::Relaxed);
            } else {
                self.evictable.fetch_add(len as u64, Ordering::Relaxed);
            }
            self.cached.fetch_add(len as u64, Ordering::Relaxed);
            self.nodes.fetch_add(1, Ordering::Relaxed);
            self.inserted.fetch_add(len as u64, Ordering::Relaxed);
            let old = cur.children.load(Ordering::SeqCst, &g);
            // SAFETY: `cur` is locked, so `old` is its current table and not retired.
            let table = match unsafe { old.as_ref() } {
                Some(t) => t.with_added(page[0], leaf),
                None => ChildTable::single(page[0], leaf),
            };
            cur.children.store(Owned::new(table), Ordering::SeqCst);
            if !old.is_null() {
                // SAFETY: swapped out under `cur`'s lock; readers hold guards.
                unsafe { g.defer_destroy(old) };
            }
            drop(guard);
            if !pin {
                self.index.push(ln);
            }
            done(&path);
            return Ok((pos, pin.then(|| self.lock_of(ns, key))));
        }
    }
}
