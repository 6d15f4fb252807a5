//! The cache: the radix tree plus an optional built-in slot pool, and the engine-facing
//! request cycle ([`Request`]).
//!
//! Without a pool ("caller-managed"), slots are the caller's: the cache only indexes them,
//! and hands evicted slots back through a callback. With a pool of `N` slots, the cache owns
//! them: [`Cache::alloc`] hands out free slots (evicting LRU leaves when short), inserts adopt
//! slots and free the ones they did not adopt, and eviction returns slots to the pool.
//!
//! # Consistency
//!
//! Every tree operation keeps the promises of [`crate::tree`]. In pool mode each slot has
//! exactly one owner at any time (free, held by a caller, or cached by the tree): an insert
//! validates and moves all of its slots in one all-or-nothing pool step taken at the moment
//! the insertion takes effect (under the parent node's lock), so a refused insert changes
//! nothing and an accepted one never leaves a slot with two owners. At quiescence
//! `free + cached + held_by_callers == N`.

mod request;

pub use request::Request;

use crate::error::{Error, Result, invalid};
use crate::pool::SlotPool;
use crate::slot_run::{SlotRun, run_len};
use crate::tree::{
    EvictionPolicy, LockGuard, PrefixLock, RadixTree, SlotSource, Stage, TreeConfig, TreeStats,
    cut_runs, push_differing,
};

/// A callback receiving slots the cache lets go of (evicted slots).
pub type FreeFn<'a> = &'a mut dyn FnMut(&[u32]);

/// A callback receiving evicted slots as runs of consecutive slots ([`Cache::evict_runs`]).
pub type FreeRunsFn<'a> = &'a mut dyn FnMut(&[SlotRun]);

/// Options of a new cache (mirrors `rkv_options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheOptions {
    /// Page size `P >= 1`.
    pub page_size: usize,
    /// Eviction order.
    pub policy: EvictionPolicy,
    /// 0: the caller manages slots; N: a built-in pool of N slots (a multiple of
    /// `page_size`).
    pub pool_slots: usize,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions { page_size: 1, policy: EvictionPolicy::Lru, pool_slots: 0 }
    }
}

/// Tree stats plus pool figures (mirrors `rkv_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// The tree's counts and counters.
    pub tree: TreeStats,
    /// Pool size (0 without a pool).
    pub pool_slots: u64,
    /// Free slots in the pool (0 without a pool).
    pub free_slots: u64,
}

/// A radix prefix cache, optionally owning its slots. `Send + Sync`.
pub struct Cache {
    tree: RadixTree,
    pool: Option<SlotPool>,
    opts: CacheOptions,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").field("opts", &self.opts).field("stats", &self.stats()).finish()
    }
}

impl Cache {
    /// A new cache. `InvalidArgument` for page size 0 or a pool size that is not a
    /// multiple of the page size.
    pub fn new(opts: CacheOptions) -> Result<Self> {
        let tree = RadixTree::new(TreeConfig { page_size: opts.page_size, policy: opts.policy })?;
        let pool = match opts.pool_slots {
            0 => None,
            n => Some(SlotPool::new(n, opts.page_size)?),
        };
        Ok(Cache { tree, pool, opts })
    }

    /// The tree.
    pub fn tree(&self) -> &RadixTree {
        &self.tree
    }

    /// The pool, if the cache has one.
    pub fn pool(&self) -> Option<&SlotPool> {
        self.pool.as_ref()
    }

    /// Options it was built with.
    pub fn options(&self) -> CacheOptions {
        self.opts
    }

    /// Page size.
    pub fn page_size(&self) -> usize {
        self.opts.page_size
    }

    /// Whether it owns a pool.
    pub fn has_pool(&self) -> bool {
        self.pool.is_some()
    }

    /// Longest cached prefix (an estimate under concurrency); see
    /// [`RadixTree::match_prefix`].
    pub fn match_prefix(&self, ns: u64, tokens: &[u32], out: &mut Vec<u32>) -> usize {
        self.tree.match_prefix(ns, tokens, out)
    }

    /// Match and pin atomically; see [`RadixTree::match_and_lock`].
    pub fn match_and_lock(&self, ns: u64, tokens: &[u32], out: &mut Vec<u32>) -> LockGuard<'_> {
        self.tree.match_and_lock(ns, tokens, out)
    }

    /// [`Cache::match_prefix`] writing the slots as runs of consecutive slots; see
    /// [`RadixTree::match_prefix_runs`].
    pub fn match_prefix_runs(&self, ns: u64, tokens: &[u32], out: &mut Vec<SlotRun>) -> usize {
        self.tree.match_prefix_runs(ns, tokens, out)
    }

    /// [`Cache::match_and_lock`] writing the slots as runs of consecutive slots; see
    /// [`RadixTree::match_and_lock_runs`].
    pub fn match_and_lock_runs(
        &self,
        ns: u64,
        tokens: &[u32],
        out: &mut Vec<SlotRun>,
    ) -> LockGuard<'_> {
        self.tree.match_and_lock_runs(ns, tokens, out)
    }

    /// Caches `tokens[..n]` (n cut to a page multiple) with `slots` and returns `existing`
    /// (see [`RadixTree::insert`]).
    ///
    /// In pool mode the call itself frees every slot it did not adopt (`slots[..existing]`
    /// where they differ from the cached slot at that position, and `slots[n..]`), and
    /// refuses whole, changing nothing, a slot outside the pool, a free slot, a slot listed
    /// twice, or one the tree caches at another position (`InvalidArgument`).
    ///
    /// Cost: slots that come in runs (as [`Cache::alloc`] hands them out) are read once and
    /// then handled as runs, as [`Cache::insert_runs`] does; scattered slots (runs under 4
    /// slots on average) are checked and stored one by one.
    pub fn insert(&self, ns: u64, tokens: &[u32], slots: &[u32]) -> Result<usize> {
        self.insert_impl(ns, tokens, slots, false, None).map(|(e, _)| e)
    }

    /// Insert and pin `tokens[..n]` atomically (chunked prefill; a request that keeps
    /// running). Pool behaviour as in [`Cache::insert`].
    pub fn insert_and_lock(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: &[u32],
    ) -> Result<(usize, LockGuard<'_>)> {
        let (e, l) = self.insert_impl(ns, tokens, slots, true, None)?;
        let l = l.expect("a pinning insert returns a lock");
        Ok((e, self.tree.guard(l)))
    }

    /// [`Cache::insert_and_lock`] returning a detached lock.
    pub fn insert_and_lock_raw(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: &[u32],
    ) -> Result<(usize, PrefixLock)> {
        let (e, l) = self.insert_impl(ns, tokens, slots, true, None)?;
        Ok((e, l.expect("a pinning insert returns a lock")))
    }

    /// The insert behind the public variants; `cached` (if given) receives the cached slots
    /// of `tokens[..existing]`.
    pub(crate) fn insert_impl(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: &[u32],
        pin: bool,
        cached: Option<&mut Vec<u32>>,
    ) -> Result<(usize, Option<PrefixLock>)> {
        let Some(pool) = &self.pool else {
            let src = SlotSource::List(slots);
            return self.tree.insert_with(ns, tokens, src, pin, cached, &mut |_, _, _| Ok(()));
        };
        if tokens.len() != slots.len() {
            return Err(invalid(format!(
                "{} tokens but {} slots (one slot per token)",
                tokens.len(),
                slots.len()
            )));
        }
        if cached.is_none() {
            // Slots from a pool mostly come in long runs: one pass turns them into runs, and
            // the pool step and the new leaf then take O(runs) (`insert_runs`) instead of each
            // scanning every slot again. Scattered slots (runs under 4 slots on average) keep
            // the list path; the pass stops as soon as it knows.
            let limit = slots.len() / 4;
            let mut runs = Vec::new();
            let mut i = 0;
            while i < slots.len() && runs.len() < limit {
                let len = run_len(&slots[i..]);
                runs.push(SlotRun { start: slots[i], len: len as u32 });
                i += len;
            }
            if i == slots.len() {
                return self.insert_runs_impl(ns, tokens, &runs, pin);
            }
        }
        self.insert_list(ns, tokens, slots, pin, cached, pool)
    }

    /// The pool-mode insert of a slot list, slot by slot.
    pub(crate) fn insert_list(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: &[u32],
        pin: bool,
        cached: Option<&mut Vec<u32>>,
        pool: &SlotPool,
    ) -> Result<(usize, Option<PrefixLock>)> {
        let n = tokens.len() / self.opts.page_size * self.opts.page_size;
        let mut scratch = Vec::new();
        let cached = cached.unwrap_or(&mut scratch);
        let mut release = Vec::new();
        let mut prepare = |existing: usize, have: &Vec<u32>, stage: Stage| -> Result<()> {
            // Adopted: slots[existing..n], passed as is. Freed: the given slots that differ
            // from the cached ones, and the unaligned tail.
            let dup = &slots[..existing];
            let release: &[u32] = if dup == have {
                &slots[n..]
            } else {
                release.clear();
                release.extend(dup.iter().zip(have).filter(|(s, h)| s != h).map(|(s, _)| *s));
                release.extend_from_slice(&slots[n..]);
                &release
            };
            match stage {
                Stage::Check => pool.check_settle(&slots[existing..n], release),
                Stage::Commit => pool.settle(&slots[existing..n], release),
            }
        };
        self.tree.insert_with(ns, tokens, SlotSource::List(slots), pin, Some(cached), &mut prepare)
    }

    /// [`Cache::insert`] with the slots given as runs of consecutive slots ([`SlotRun`], in
    /// token order, their lengths adding up to `tokens.len()`; `InvalidArgument` otherwise,
    /// or for an empty run), as [`Cache::alloc_runs`] hands them out: the pool step and the
    /// new leaf take O(runs) instead of O(tokens). The same rules otherwise: with a pool, the
    /// runs past `existing` (up to `n`) are adopted, and the given slots of the cached prefix
    /// that differ from the cached ones, and those past `n`, go back to the pool.
    pub fn insert_runs(&self, ns: u64, tokens: &[u32], runs: &[SlotRun]) -> Result<usize> {
        self.insert_runs_impl(ns, tokens, runs, false).map(|(e, _)| e)
    }

    /// [`Cache::insert_and_lock`] with the slots given as runs (see [`Cache::insert_runs`]).
    pub fn insert_and_lock_runs(
        &self,
        ns: u64,
        tokens: &[u32],
        runs: &[SlotRun],
    ) -> Result<(usize, LockGuard<'_>)> {
        let (e, l) = self.insert_and_lock_runs_raw(ns, tokens, runs)?;
        Ok((e, self.tree.guard(l)))
    }

    /// [`Cache::insert_and_lock_runs`] returning a detached lock.
    pub fn insert_and_lock_runs_raw(
        &self,
        ns: u64,
        tokens: &[u32],
        runs: &[SlotRun],
    ) -> Result<(usize, PrefixLock)> {
        let (e, l) = self.insert_runs_impl(ns, tokens, runs, true)?;
        Ok((e, l.expect("a pinning insert returns a lock")))
    }

    fn insert_runs_impl(
        &self,
        ns: u64,
        tokens: &[u32],
        runs: &[SlotRun],
        pin: bool,
    ) -> Result<(usize, Option<PrefixLock>)> {
        let src = SlotSource::runs(runs, tokens.len())?;
        let Some(pool) = &self.pool else {
            return self.tree.insert_with::<Vec<u32>>(
                ns,
                tokens,
                src,
                pin,
                None,
                &mut |_, _, _| Ok(()),
            );
        };
        let n = tokens.len() / self.opts.page_size * self.opts.page_size;
        let mut cached: Vec<SlotRun> = Vec::new();
        let (mut adopt, mut release) = (Vec::new(), Vec::new());
        let mut prepare = |existing: usize, have: &Vec<SlotRun>, stage: Stage| -> Result<()> {
            adopt.clear();
            release.clear();
            cut_runs(runs, existing, n, &mut adopt);
            push_differing(runs, have, existing, &mut release);
            cut_runs(runs, n, tokens.len(), &mut release);
            match stage {
                Stage::Check => pool.check_settle_runs(&adopt, &release),
                Stage::Commit => pool.settle_runs(&adopt, &release),
            }
        };
        self.tree.insert_with(ns, tokens, src, pin, Some(&mut cached), &mut prepare)
    }

    /// Unpins a detached lock. `InvalidLock` for another cache's lock.
    pub fn release(&self, lock: PrefixLock) -> Result<()> {
        self.tree.release(lock)
    }

    /// Evicts at least `k` tokens (fewer only if nothing more is evictable); returns the
    /// tokens freed. `free` gets every freed slot exactly once (it must not call back into
    /// this cache). Without a pool `free` is required (`InvalidArgument` otherwise); with a
    /// pool the slots go back to the pool (after `free`, if given, has seen them).
    pub fn evict(&self, k: usize, free: Option<FreeFn<'_>>) -> Result<usize> {
        match (&self.pool, free) {
            (None, None) => Err(invalid("evict without a pool needs a free callback")),
            (None, Some(f)) => Ok(self.tree.evict(k, f)),
            (Some(pool), f) => Ok(self.evict_to_pool(pool, k, f)),
        }
    }

    /// [`Cache::evict`], handing the freed slots to `free` as runs of consecutive slots
    /// ([`SlotRun`], as [`RadixTree::evict_runs`] does): O(runs) per evicted leaf instead of
    /// O(tokens) when slots come in runs, as a pool hands them out. Same rules otherwise:
    /// without a pool `free` is required (`InvalidArgument` otherwise); with a pool the slots
    /// go back to the pool (after `free`, if given, has seen them).
    pub fn evict_runs(&self, k: usize, free: Option<FreeRunsFn<'_>>) -> Result<usize> {
        match (&self.pool, free) {
            (None, None) => Err(invalid("evict without a pool needs a free callback")),
            (None, Some(f)) => Ok(self.tree.evict_runs(k, f)),
            (Some(pool), f) => Ok(self.evict_runs_to_pool(pool, k, f)),
        }
    }

    /// Evicts into the pool by runs, one pool pass for the whole call; `user` sees each
    /// leaf's runs first.
    fn evict_runs_to_pool(
        &self,
        pool: &SlotPool,
        k: usize,
        mut user: Option<FreeRunsFn<'_>>,
    ) -> usize {
        let mut freed = Vec::new();
        let n = self.tree.evict_runs(k, &mut |runs| {
            if let Some(f) = user.as_mut() {
                f(runs);
            }
            freed.extend_from_slice(runs);
        });
        // Cannot fail: the tree holds only slots the pool marked Cached when adopting, and
        // hands each evicted slot out once.
        pool.release_cached_runs(&freed).expect("evicted slots are cached in the pool");
        n
    }

    fn evict_to_pool(&self, pool: &SlotPool, k: usize, mut user: Option<FreeFn<'_>>) -> usize {
        // One pool pass for the whole call rather than one per evicted leaf.
        if user.is_none() {
            // Nobody needs the slots listed: hand them over as runs, O(runs) to collect.
            return self.evict_runs_to_pool(pool, k, None);
        }
        let mut freed = Vec::new();
        let n = self.tree.evict(k, &mut |slots| {
            if let Some(f) = user.as_mut() {
                f(slots);
            }
            freed.extend_from_slice(slots);
        });
        // Cannot fail: the tree holds only slots the pool marked Cached when adopting, and
        // hands each evicted slot out once.
        pool.release_cached(&freed).expect("evicted slots are cached in the pool");
        n
    }

    /// Allocates `n` slots from the pool (pool mode), appended to `out`: all or nothing, in
    /// whole pages. When free slots are short it evicts LRU leaves and retries;
    /// `OutOfSlots` only when even that cannot find `n` (a request larger than free plus
    /// evictable slots fails at once, evicting nothing). `n` must be a multiple of the page
    /// size (`InvalidArgument`). `NoPool` without a pool.
    pub fn alloc(&self, n: usize, out: &mut Vec<u32>) -> Result<()> {
        self.alloc_with(n, &mut |pool| pool.try_alloc(n, out))
    }

    /// [`Cache::alloc`] appending the slots to `out` as runs of consecutive slots (joined to
    /// `out`'s last run where they continue it): O(runs) instead of O(slots); pass them to
    /// [`Cache::insert_runs`] or [`Cache::free_runs`].
    pub fn alloc_runs(&self, n: usize, out: &mut Vec<SlotRun>) -> Result<()> {
        self.alloc_with(n, &mut |pool| pool.try_alloc_runs(n, out))
    }

    /// The allocation loop: `try_alloc` (all or nothing) until it succeeds, evicting what is
    /// short in between.
    fn alloc_with(
        &self,
        n: usize,
        try_alloc: &mut dyn FnMut(&SlotPool) -> Result<bool>,
    ) -> Result<()> {
        let pool = self.pool.as_ref().ok_or(Error::NoPool)?;
        loop {
            if try_alloc(pool)? {
                return Ok(());
            }
            let short = n.saturating_sub(pool.allocatable()).max(self.opts.page_size);
            let evictable = self.tree.stats().evictable_tokens as usize;
            // Hopeless requests fail without emptying the cache first.
            if short > evictable + pool.available().saturating_sub(pool.allocatable())
                || self.evict_to_pool(pool, short, None) == 0
            {
                // Nothing left to evict; a last try in case a concurrent free landed.
                if try_alloc(pool)? {
                    return Ok(());
                }
                return Err(Error::OutOfSlots {
                    requested: n,
                    available: pool.available() + self.tree.stats().evictable_tokens as usize,
                });
            }
        }
    }

    /// [`Cache::free`] for slots given as runs (an empty run is `InvalidArgument`).
    pub fn free_runs(&self, runs: &[SlotRun]) -> Result<()> {
        self.pool.as_ref().ok_or(Error::NoPool)?.free_runs(runs)
    }

    /// Returns allocated, never adopted slots to the pool: refused whole, changing nothing,
    /// with `DoubleFree` for a slot that is free or cached by the tree (or listed twice),
    /// `InvalidArgument` for one outside the pool. `NoPool` without a pool.
    pub fn free(&self, slots: &[u32]) -> Result<()> {
        self.pool.as_ref().ok_or(Error::NoPool)?.free(slots)
    }

    /// Frees memory the index unlinked earlier, off the latency-critical calls: see
    /// [`RadixTree::reclaim`]. Call it once per scheduler step or between requests.
    pub fn reclaim(&self) {
        self.tree.reclaim();
    }

    /// Counts and counters; exact at quiescence.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            tree: self.tree.stats(),
            pool_slots: self.pool.as_ref().map_or(0, |p| p.capacity() as u64),
            free_slots: self.pool.as_ref().map_or(0, |p| p.available() as u64),
        }
    }

    /// Drops every unpinned page; slots as in [`Cache::evict`].
    pub fn reset(&self, free: Option<FreeFn<'_>>) -> Result<()> {
        self.evict(usize::MAX, free).map(|_| ())
    }
}

#[cfg(test)]
mod tests;
