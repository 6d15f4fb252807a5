//! The cache: the radix tree plus an optional built-in slot pool, and the engine-facing
//! request cycle ([`Request`]).
//!
//! Without a pool ("caller-managed"), slots are the caller's: the cache only indexes them,
//! and hands evicted slots back through a callback. With a pool of `N` slots, the cache owns
//! them: [`Cache::alloc`] hands out free slots (evicting leaves in policy order when short), inserts adopt
//! slots and free the ones they did not adopt, and eviction returns slots to the pool.
//!
//! # Consistency
//!
//! Every tree operation keeps the promises of [`crate::tree`]. In pool mode each slot has
//! exactly one owner at any time (free, held by a caller, or cached by the tree): an insert
//! validates and moves all of its slots in one all-or-nothing pool step taken at the moment
//! the insertion takes effect (under the parent node's lock), so a refused insert changes
//! nothing and an accepted one never leaves a slot with two owners. At quiescence
//! `free + cached + held_by_callers == N`. Eviction into the pool is exception-safe: a
//! `free` callback that panics still leaves every slot the tree handed over back in the
//! pool. [`Cache::drop_namespace`] is an eviction of one namespace's unpinned pages and
//! returns their slots the same way (an allocation waits for it as for any eviction).
//!
//! [`Cache::alloc`] fails with `OutOfSlots` only when, at one moment, the free slots, the
//! evictable ones and those that other threads' evictions are handing back to the pool
//! cannot cover the request: an eviction call takes leaves out of the tree first and
//! returns their slots to the pool when it ends, and an allocation that finds nothing left
//! to evict waits for the eviction calls in progress to land before it gives up (see
//! [`Cache::alloc`]).

mod request;

mod events;
mod host;
pub use events::EventOptions;
pub use host::PrefixMatch;
pub use request::{DetachedRequest, Request};

use crossbeam_utils::CachePadded;

use crate::error::{Error, Result, invalid};
use crate::pool::SlotPool;
use crate::slot_run::{SlotRun, Slots, run_len};
use crate::sync::{AtomicU64, AtomicUsize, Ordering, yield_now};
use crate::tree::{
    DEFAULT_SLRU_THRESHOLD, EvictTarget, EvictionPolicy, Freed, InsertOptions, Key, LockGuard,
    NamespaceStats, PrefixLock, RadixTree, SlotSink, SlotSource, Stage, TreeConfig, TreeStats,
    cut_runs, push_differing,
};

/// How many times [`Cache::alloc`] tries again, at most, when it found nothing to evict
/// although no eviction was running and the tree counted enough evictable tokens (see
/// `alloc_with` and [`back_off`]).
const RECHECKS: u32 = 20;

/// Rechecks that only yield before [`back_off`] starts sleeping.
const RECHECK_YIELDS: u32 = 8;

/// Waits before the `round`-th recheck of an allocation (from 0): yields at first, then
/// sleeps 1, 2, 4, ... µs (at most about 1 ms a round, about 3 ms over all [`RECHECKS`]),
/// so that a thread that counted a leaf evictable and has not queued it yet gets to run
/// even when it was preempted or is waiting for the eviction index's lock. Under loom it
/// only yields (the model schedules the other threads).
fn back_off(round: u32) {
    if cfg!(loom) || round < RECHECK_YIELDS {
        yield_now();
    } else {
        let us = 1u64 << (round - RECHECK_YIELDS).min(10);
        std::thread::sleep(std::time::Duration::from_micros(us));
    }
}

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
    /// [`EvictionPolicy::Slru`]'s threshold (see [`TreeConfig::slru_threshold`]; default
    /// [`DEFAULT_SLRU_THRESHOLD`]).
    pub slru_threshold: u32,
    /// The sliding window of a hybrid model's SWA layers in tokens (0, the default: none;
    /// see [`TreeConfig::swa_window`]). With one, matches are SWA-valid prefixes, locks hold
    /// their window's SWA KV, and eviction goes through [`Cache::evict_kv`], which says per
    /// node what was freed: a pool-mode cache then needs a callback to evict, and its
    /// `alloc` does not evict on its own (the engine must hear of every SWA KV freed). A
    /// host tier is not combined with a window (`InvalidArgument`).
    pub swa_window: usize,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            page_size: 1,
            policy: EvictionPolicy::Lru,
            pool_slots: 0,
            slru_threshold: DEFAULT_SLRU_THRESHOLD,
            swa_window: 0,
        }
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

/// What the host tier ([`crate::tier`]) sees of a pool-mode eviction: every leaf's slots, as
/// runs, once they are out of the tree and before they go back to the pool (so their bytes
/// can still be read). Called with no tree lock held; it must not call into this cache.
pub(crate) type EvictHook = std::sync::Arc<dyn Fn(&[SlotRun]) + Send + Sync>;

/// A radix prefix cache, optionally owning its slots. `Send + Sync`.
pub struct Cache {
    tree: RadixTree,
    pool: Option<SlotPool>,
    opts: CacheOptions,
    /// Eviction calls into the pool in progress (pool mode), for [`Cache::alloc`].
    evictions: CachePadded<Evictions>,
    /// The host tier's view of evictions (pool mode, with a host tier only).
    evict_hook: Option<EvictHook>,
    /// The host tier, if the cache was built with host options ([`Cache::with_host`]).
    tier: Option<Box<crate::tier::Tier>>,
}

/// The eviction calls into the pool (see [`PoolEviction`]): what an allocation that found
/// nothing to evict waits for before it fails.
///
/// Every access is `SeqCst`, a few per eviction call and per failing allocation attempt
/// (never per leaf). What they must give: an allocation that reads `running` after its own
/// pop found the index empty sees every call whose pops came first (the index lock orders
/// the pops, and the increment precedes them); one that reads `running == 0`, or a changed
/// `landed`, after a call's release, then sees that call's slots in the pool (the release
/// precedes both writes).
struct Evictions {
    /// Calls in progress: from before the tree pops a call's first leaf until every slot it
    /// handed over is back in the pool.
    running: AtomicUsize,
    /// Calls that returned slots to the pool, counted once they did (before they leave
    /// `running`): a change tells a waiting allocation that slots have landed.
    landed: AtomicU64,
}

/// What a pool-mode eviction collects: slots one by one ([`Cache::evict`]) or runs of them
/// ([`Cache::evict_runs`]), and how they go back to the pool.
trait EvictedSlots: Copy {
    /// Returns `items` (slots the tree evicted, so Cached in the pool) to the pool.
    fn release(pool: &SlotPool, items: &[Self]) -> Result<()>;
}

impl EvictedSlots for u32 {
    fn release(pool: &SlotPool, items: &[u32]) -> Result<()> {
        pool.release_cached(items)
    }
}

impl EvictedSlots for SlotRun {
    fn release(pool: &SlotPool, items: &[SlotRun]) -> Result<()> {
        pool.release_cached_runs(items)
    }
}

/// One eviction call into the pool, counted in [`Evictions::running`] while it lasts.
/// `pending` gathers the slots the tree hands over (each leaf's before the caller's `free`
/// callback sees them); dropping the guard, when the call ends or while a panicking
/// callback unwinds it, returns them all to the pool in one pass, counts the call as
/// landed if it returned any, and only then leaves `running`. So every slot the tree hands
/// over ends in the pool, and an allocation that sees no call running has seen every
/// evicted slot land.
struct PoolEviction<'a, T: EvictedSlots> {
    /// The cache's count of calls in progress.
    evictions: &'a Evictions,
    /// Where the slots go back.
    pool: &'a SlotPool,
    /// Slots (or runs) the tree handed over and the pool has not got back yet.
    pending: Vec<T>,
}

impl<'a, T: EvictedSlots> PoolEviction<'a, T> {
    /// Enters `running`; call it before the tree evicts anything.
    fn begin(evictions: &'a Evictions, pool: &'a SlotPool) -> Self {
        evictions.running.fetch_add(1, Ordering::SeqCst);
        PoolEviction { evictions, pool, pending: Vec::new() }
    }
}

impl<T: EvictedSlots> Drop for PoolEviction<'_, T> {
    fn drop(&mut self) {
        let released = if self.pending.is_empty() {
            Ok(())
        } else {
            let r = T::release(self.pool, &self.pending);
            self.evictions.landed.fetch_add(1, Ordering::SeqCst);
            r
        };
        self.evictions.running.fetch_sub(1, Ordering::SeqCst);
        // Cannot fail: the tree holds only slots the pool marked Cached when adopting, and
        // hands each evicted slot out once. Not asserted while a panic unwinds (a second
        // panic would abort the process).
        if let Err(e) = released
            && !std::thread::panicking()
        {
            panic!("evicted slots are cached in the pool: {e}");
        }
    }
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
        let tree = RadixTree::new(TreeConfig {
            page_size: opts.page_size,
            policy: opts.policy,
            slru_threshold: opts.slru_threshold,
            swa_window: opts.swa_window,
        })?;
        let pool = match opts.pool_slots {
            0 => None,
            n => Some(SlotPool::new(n, opts.page_size)?),
        };
        let evictions = Evictions { running: AtomicUsize::new(0), landed: AtomicU64::new(0) };
        let evictions = CachePadded::new(evictions);
        Ok(Cache { tree, pool, opts, evictions, evict_hook: None, tier: None })
    }

    /// Shows one evicted leaf's slots to the eviction hook, if any (`scratch` for lists).
    #[inline]
    fn hook_slots(&self, slots: &[u32], scratch: &mut Vec<SlotRun>) {
        if let Some(h) = &self.evict_hook {
            scratch.clear();
            SlotRun::push_runs_of(slots, scratch);
            h(scratch);
        }
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

    /// Page size (the tree's: stored once).
    pub fn page_size(&self) -> usize {
        self.tree.page_size()
    }

    /// Whether it owns a pool.
    pub fn has_pool(&self) -> bool {
        self.pool.is_some()
    }

    /// Longest cached prefix of `tokens` (an estimate under concurrency): clears `out`,
    /// writes the matched slots into it and returns the match length (a page multiple). `out`
    /// is any [`SlotSink`]: a `Vec<u32>` (one slot per token), a `Vec<SlotRun>` (runs of
    /// consecutive slots: O(runs) to write when slots come in runs, as the pool hands them
    /// out) or an [`OutBuf`](crate::tree::OutBuf) (a caller's buffer). See
    /// [`RadixTree::match_prefix`]. With a host tier, [`Cache::lookup`]'s `device_len` (it
    /// finishes the copies that are done first, and counts the hits).
    #[inline]
    pub fn match_prefix<S: SlotSink>(&self, ns: u64, tokens: &[u32], out: &mut S) -> usize {
        match self.tiered() {
            None => self.tree.match_prefix(ns, tokens, out),
            Some(t) => t.match_prefix(ns, tokens, out).device_len,
        }
    }

    /// Match and pin atomically (how an engine admits a request): as
    /// [`Cache::match_prefix`], and the guard pins the matched pages until it is dropped;
    /// [`LockGuard::into_raw`] detaches it as a [`PrefixLock`] value to release with
    /// [`Cache::release`]. See [`RadixTree::match_and_lock`]. With a host tier, as
    /// [`Cache::lookup_and_lock`].
    #[inline]
    pub fn match_and_lock<'k, S: SlotSink>(
        &self,
        ns: u64,
        tokens: impl Into<Key<'k>>,
        out: &mut S,
    ) -> LockGuard<'_> {
        let key = tokens.into();
        match self.tiered() {
            None => self.tree.match_and_lock(ns, key, out),
            Some(t) => t.match_and_lock(ns, key.tokens(), out).0,
        }
    }

    /// Caches `tokens[..n]` (n cut to a page multiple) with `slots` (a list or runs: see
    /// [`Slots`]) and returns `existing` (see [`RadixTree::insert`]).
    ///
    /// In pool mode the call itself frees every slot it did not adopt (`slots[..existing]`
    /// where they differ from the cached slot at that position, and `slots[n..]`), and
    /// refuses whole, changing nothing, a slot outside the pool, a free slot, a slot listed
    /// twice, or one the tree caches at another position ([`Error::Slot`], naming the slot and
    /// its [`crate::SlotProblem`]).
    ///
    /// Cost: runs ([`Slots::Runs`], as [`Cache::alloc_runs`] hands them out) take O(runs) in
    /// the pool step and the new leaf; a list whose slots come in runs (as [`Cache::alloc`]
    /// hands them out) is read once and then handled as runs; scattered slots (runs under 4
    /// slots on average) are checked and stored one by one.
    pub fn insert<'s>(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: impl Into<Slots<'s>>,
    ) -> Result<usize> {
        self.insert_with(ns, tokens, slots, InsertOptions::default())
    }

    /// [`Cache::insert`] with [`InsertOptions`] (the eviction priority, and what the request
    /// inserted before, for hit counting).
    pub fn insert_with<'s>(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: impl Into<Slots<'s>>,
        opts: InsertOptions,
    ) -> Result<usize> {
        self.insert_slots(ns, tokens, slots.into(), false, opts).map(|(e, _)| e)
    }

    /// [`Cache::insert_with`] that also pins `tokens[..n]` atomically with the insert
    /// (chunked prefill; a request that keeps running: release its old lock afterwards).
    /// The guard unpins when dropped; [`LockGuard::into_raw`] detaches it. `tokens`: a
    /// slice, or a shared buffer ([`crate::tree::Key`]) the lock then references instead of
    /// copying.
    pub fn insert_and_lock<'s, 'k>(
        &self,
        ns: u64,
        tokens: impl Into<Key<'k>>,
        slots: impl Into<Slots<'s>>,
        opts: InsertOptions,
    ) -> Result<(usize, LockGuard<'_>)> {
        let (e, l) = self.insert_slots(ns, tokens, slots.into(), true, opts)?;
        Ok((e, self.tree.guard(l.expect("a pinning insert returns a lock"))))
    }

    /// The insert behind [`Cache::insert_with`] and [`Cache::insert_and_lock`].
    pub(crate) fn insert_slots<'k>(
        &self,
        ns: u64,
        tokens: impl Into<Key<'k>>,
        slots: Slots<'_>,
        pin: bool,
        opts: InsertOptions,
    ) -> Result<(usize, Option<PrefixLock>)> {
        let key = tokens.into();
        if let Some(t) = self.tiered() {
            return t.insert_slots(ns, key.tokens(), slots, pin, opts);
        }
        match slots {
            Slots::List(s) => self.insert_impl(ns, key, s, pin, opts, None),
            Slots::Runs(r) => self.insert_runs_impl(ns, key, r, pin, opts, None),
        }
    }

    /// The insert behind the public variants; `cached` (if given) receives the cached slots
    /// of `tokens[..existing]`.
    pub(crate) fn insert_impl<'k>(
        &self,
        ns: u64,
        tokens: impl Into<Key<'k>>,
        slots: &[u32],
        pin: bool,
        opts: InsertOptions,
        cached: Option<&mut Vec<u32>>,
    ) -> Result<(usize, Option<PrefixLock>)> {
        let key = tokens.into();
        let tokens = key.tokens();
        let Some(pool) = &self.pool else {
            let src = SlotSource::List(slots);
            let ok = &mut |_: usize, _: &Vec<u32>, _| Ok(());
            return self.tree.insert_core(ns, key, src, pin, opts, cached, ok);
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
            // the pool step and the new leaf then take O(runs) (`Slots::Runs`) instead of each
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
                return self.insert_runs_impl(ns, key, &runs, pin, opts, None);
            }
        }
        self.insert_list(ns, key, slots, pin, opts, cached, pool)
    }

    /// The pool-mode insert of a slot list, slot by slot.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn insert_list<'k>(
        &self,
        ns: u64,
        tokens: impl Into<Key<'k>>,
        slots: &[u32],
        pin: bool,
        opts: InsertOptions,
        cached: Option<&mut Vec<u32>>,
        pool: &SlotPool,
    ) -> Result<(usize, Option<PrefixLock>)> {
        let key = tokens.into();
        let n = self.tree.aligned(key.tokens().len());
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
        let src = SlotSource::List(slots);
        self.tree.insert_core(ns, key, src, pin, opts, Some(cached), &mut prepare)
    }

    /// The insert of slot runs; `cached_out` (if given) receives the runs of the cached
    /// slots of `tokens[..existing]`.
    pub(crate) fn insert_runs_impl<'k>(
        &self,
        ns: u64,
        tokens: impl Into<Key<'k>>,
        runs: &[SlotRun],
        pin: bool,
        opts: InsertOptions,
        cached_out: Option<&mut Vec<SlotRun>>,
    ) -> Result<(usize, Option<PrefixLock>)> {
        let key = tokens.into();
        let tokens = key.tokens();
        let src = SlotSource::runs(runs, tokens.len())?;
        let Some(pool) = &self.pool else {
            return self.tree.insert_core::<Vec<u32>>(
                ns,
                key,
                src,
                pin,
                opts,
                None,
                &mut |_, _, _| Ok(()),
            );
        };
        let n = self.tree.aligned(tokens.len());
        let mut own: Vec<SlotRun> = Vec::new();
        let cached = cached_out.unwrap_or(&mut own);
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
        self.tree.insert_core(ns, key, src, pin, opts, Some(cached), &mut prepare)
    }

    /// Unpins a detached lock. `InvalidLock` for another cache's lock.
    pub fn release(&self, lock: PrefixLock) -> Result<()> {
        self.tree.release(lock)
    }

    /// Evicts at least `k` tokens (fewer only if nothing more is evictable); returns the
    /// tokens freed. `free` gets every freed slot exactly once (it must not call back into
    /// this cache). Without a pool `free` is required (`InvalidArgument` otherwise); with a
    /// pool the slots go back to the pool (after `free`, if given, has seen them), all of
    /// them also when `free` panics: the panic propagates, and the slots of every leaf
    /// evicted until then, including the one `free` panicked on, are free in the pool.
    pub fn evict(&self, k: usize, free: Option<FreeFn<'_>>) -> Result<usize> {
        self.no_silent_swa_frees(free.is_some())?;
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
    /// go back to the pool (after `free`, if given, has seen them; also when `free` panics,
    /// as in [`Cache::evict`]).
    pub fn evict_runs(&self, k: usize, free: Option<FreeRunsFn<'_>>) -> Result<usize> {
        self.no_silent_swa_frees(free.is_some())?;
        match (&self.pool, free) {
            (None, None) => Err(invalid("evict without a pool needs a free callback")),
            (None, Some(f)) => Ok(self.tree.evict_runs(k, f)),
            (Some(pool), f) => Ok(self.evict_runs_to_pool(pool, k, f)),
        }
    }

    /// With a sliding window, an eviction must tell the engine what it freed: refused
    /// without a callback (with a pool the full KV would go back to the pool unseen, and
    /// with it the SWA KV the engine keeps by those slots).
    fn no_silent_swa_frees(&self, has_callback: bool) -> Result<()> {
        if self.opts.swa_window > 0 && !has_callback {
            return Err(invalid(
                "a cache with a sliding window evicts only with a free callback (the engine \
                 must hear of the SWA KV it frees; evict_kv says which); nothing was evicted",
            ));
        }
        Ok(())
    }

    /// With a sliding window: frees at least `k` tokens' KV of the kind `target` names
    /// ([`EvictTarget::Full`]: whole unpinned leaves in policy order; [`EvictTarget::Swa`]:
    /// SWA KV without a window lock, least recently used first, a leaf whole and any other
    /// node as a tombstone), fewer only if nothing more of that kind can go; `free` gets
    /// each node's slots once with what was freed of it ([`Freed`]), with no tree lock
    /// held (it must not call back into this cache). With a pool, every slot whose full KV
    /// was freed goes back to the pool (after `free` has seen it; also when `free`
    /// panics, as in [`Cache::evict`]). Returns the tokens freed of that kind. Without a
    /// window, `Full` is [`Cache::evict`] and `Swa` frees nothing.
    pub fn evict_kv(
        &self,
        target: EvictTarget,
        k: usize,
        free: &mut dyn FnMut(Freed, &[u32]),
    ) -> Result<usize> {
        let Some(pool) = &self.pool else {
            return Ok(self.tree.evict_kv(target, k, free));
        };
        let mut ev = PoolEviction::begin(&self.evictions, pool);
        let mut scratch = Vec::new();
        let n = self.tree.evict_kv(target, k, &mut |f, slots| {
            if f.full {
                // Pending before `free` runs, so they go back to the pool even if it panics.
                ev.pending.extend_from_slice(slots);
                self.hook_slots(slots, &mut scratch);
            }
            free(f, slots);
        });
        drop(ev); // returns the slots to the pool
        Ok(n)
    }

    /// [`Cache::drop_namespace`] saying per leaf what it freed ([`Freed`], as
    /// [`Cache::evict_kv`]): for a cache with a sliding window, whose engine must free the
    /// SWA KV of the leaves that still had it. With a pool the full KV goes back to the
    /// pool after `free` has seen it. Returns the tokens freed.
    pub fn drop_namespace_kv(&self, ns: u64, free: &mut dyn FnMut(Freed, &[u32])) -> Result<usize> {
        let Some(pool) = &self.pool else {
            return Ok(self.tree.drop_namespace_kv(ns, free));
        };
        let mut ev = PoolEviction::begin(&self.evictions, pool);
        let mut scratch = Vec::new();
        let n = self.tree.drop_namespace_kv(ns, &mut |f, slots| {
            // Pending before `free` runs, so they go back to the pool even if it panics.
            ev.pending.extend_from_slice(slots);
            self.hook_slots(slots, &mut scratch);
            free(f, slots);
        });
        drop(ev); // returns the slots to the pool
        Ok(n)
    }

    /// Evicts into the pool by runs, one pool pass for the whole call (when it ends, or
    /// when `user` panics: see [`PoolEviction`]); `user` sees each leaf's runs first.
    fn evict_runs_to_pool(
        &self,
        pool: &SlotPool,
        k: usize,
        mut user: Option<FreeRunsFn<'_>>,
    ) -> usize {
        let mut ev = PoolEviction::begin(&self.evictions, pool);
        let n = self.tree.evict_runs(k, &mut |runs| {
            // Pending before `user` runs, so they go back to the pool even if it panics.
            ev.pending.extend_from_slice(runs);
            if let Some(h) = &self.evict_hook {
                h(runs);
            }
            if let Some(f) = user.as_mut() {
                f(runs);
            }
        });
        drop(ev); // returns the slots to the pool
        n
    }

    /// Evicts into the pool, one pool pass for the whole call rather than one per evicted
    /// leaf (as [`Cache::evict_runs_to_pool`]); `user` sees each leaf's slots first.
    fn evict_to_pool(&self, pool: &SlotPool, k: usize, mut user: Option<FreeFn<'_>>) -> usize {
        if user.is_none() {
            // Nobody needs the slots listed: hand them over as runs, O(runs) to collect.
            return self.evict_runs_to_pool(pool, k, None);
        }
        let mut ev = PoolEviction::begin(&self.evictions, pool);
        let mut scratch = Vec::new();
        let n = self.tree.evict(k, &mut |slots| {
            // Pending before `user` runs, so they go back to the pool even if it panics.
            ev.pending.extend_from_slice(slots);
            self.hook_slots(slots, &mut scratch);
            if let Some(f) = user.as_mut() {
                f(slots);
            }
        });
        drop(ev); // returns the slots to the pool
        n
    }

    /// Allocates `n` slots from the pool (pool mode), appended to `out`: all or nothing, in
    /// whole pages. When free slots are short it evicts LRU leaves and retries. `n` must be
    /// a multiple of the page size (`InvalidArgument`). `NoPool` without a pool.
    ///
    /// `OutOfSlots` only when, at one moment, the free slots, the evictable ones and those
    /// that eviction calls in progress are handing back to the pool cannot cover `n`. An
    /// eviction call (this cache's [`Cache::evict`], or another allocation's) takes its
    /// leaves out of the tree first and returns their slots to the pool when it ends, so
    /// another thread may find nothing left to evict while those slots are on their way
    /// back. An allocation that finds too few free pages and nothing to evict (its own
    /// eviction freed nothing, or free plus evictable slots, as counted, fall short)
    /// therefore waits, yielding, while eviction calls are in progress, and tries again as
    /// soon as one of them has returned slots. It fails only when no eviction call is in
    /// progress, none has returned slots since its last attempt began, and a last try finds
    /// too few free pages. (If the tree then still counts enough evictable tokens, another
    /// call is between counting a leaf and queueing it for eviction: it backs off and tries
    /// again, a bounded number of times, yielding and then sleeping about 3 ms in all.) A
    /// request larger than the pool fails at once, and one larger than free plus evictable
    /// slots while no eviction is in progress fails without evicting anything. The error's
    /// `available` is free plus evictable slots as counted when it fails (exact at
    /// quiescence; under concurrency what the counters said then).
    pub fn alloc(&self, n: usize, out: &mut Vec<u32>) -> Result<()> {
        self.alloc_with(n, &mut |pool| pool.try_alloc(n, out))
    }

    /// [`Cache::alloc`] appending the slots to `out` as runs of consecutive slots (joined to
    /// `out`'s last run where they continue it): O(runs) instead of O(slots); pass them to
    /// [`Cache::insert`] (as [`Slots::Runs`]) or [`Cache::free_runs`].
    pub fn alloc_runs(&self, n: usize, out: &mut Vec<SlotRun>) -> Result<()> {
        self.alloc_with(n, &mut |pool| pool.try_alloc_runs(n, out))
    }

    /// The allocation loop: `try_alloc` (all or nothing) until it succeeds, evicting what is
    /// short in between, and waiting for other threads' evictions to land before giving up
    /// (the contract is [`Cache::alloc`]'s).
    fn alloc_with(
        &self,
        n: usize,
        try_alloc: &mut dyn FnMut(&SlotPool) -> Result<bool>,
    ) -> Result<()> {
        let pool = self.pool.as_ref().ok_or(Error::NoPool)?;
        // Whether evicting could cover `n` by the counters (free pages, free slots of pages
        // that are not whole, evictable tokens), and the pages' worth still short of it.
        let counted = || {
            let short = n.saturating_sub(pool.allocatable()).max(self.opts.page_size);
            let evictable = self.tree.stats().evictable_tokens as usize;
            let loose = pool.available().saturating_sub(pool.allocatable());
            let hopeful = n <= pool.capacity() && short <= evictable + loose;
            (hopeful, short, evictable)
        };
        let mut rechecks = 0;
        loop {
            // Read before the try: an eviction that lands after this may bring slots the
            // try did not see; one that landed before has its slots in the pool already.
            let landed = self.evictions.landed.load(Ordering::SeqCst);
            if try_alloc(pool)? {
                return Ok(());
            }
            // Hopeless requests (by the counters) evict nothing. The counters miss what
            // eviction calls in progress are handing back (the tree counts their leaves out
            // when its part of the call ends, the pool counts their slots in when they
            // land): the wait below covers those.
            let (hopeful, short, _) = counted();
            // With a sliding window the engine evicts (`evict_kv`): it must hear of the SWA
            // KV freed, which an eviction here could not tell it.
            let evicts = self.opts.swa_window == 0;
            if evicts && hopeful && self.evict_to_pool(pool, short, None) > 0 {
                continue;
            }
            if n <= pool.capacity() && self.wait_for_evictions(landed) {
                continue; // slots came back since the try
            }
            // No eviction in progress and none landed since the try. A last try in case a
            // concurrent free landed.
            if try_alloc(pool)? {
                return Ok(());
            }
            // With no eviction running, the tree counting more evictable tokens than its
            // eviction index could pop means another call is between the two steps (an
            // insert that adopted its slots, a split or an unpin, that has not queued its
            // leaf yet), or that leaves came since: wait a little and try again. At
            // quiescence the count never exceeds what eviction can free; the bound keeps
            // a miscount from making this spin forever.
            let (hopeful, _, evictable) = counted();
            if evicts && hopeful && evictable > 0 && rechecks < RECHECKS {
                back_off(rechecks);
                rechecks += 1;
                continue;
            }
            let available = pool.available() + evictable;
            return Err(Error::OutOfSlots { requested: n, available });
        }
    }

    /// Waits, yielding, while eviction calls into the pool are in progress; `true` as soon
    /// as one lands (returns slots to the pool) after `landed` was read, `false` once none
    /// is in progress and none landed since. Eviction calls never wait for an allocation,
    /// and a waiting allocation starts none, so allocations that find nothing to evict
    /// never keep each other waiting.
    fn wait_for_evictions(&self, landed: u64) -> bool {
        let ev = &*self.evictions;
        loop {
            if ev.landed.load(Ordering::SeqCst) != landed {
                return true;
            }
            if ev.running.load(Ordering::SeqCst) == 0 {
                return false;
            }
            yield_now();
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

    /// Evicts every unpinned page of namespace `ns` (a tenant offboarded, a LoRA adapter
    /// unloaded) and returns the tokens freed; see [`RadixTree::drop_namespace`]. Pinned
    /// pages stay until released. Slots as in [`Cache::evict`]: without a pool `free` is
    /// required (`InvalidArgument` otherwise); with a pool they go back to the pool (after
    /// `free`, if given, has seen them; also when `free` panics). An unknown namespace, or
    /// one with nothing cached, frees nothing and returns 0 (not an error).
    pub fn drop_namespace(&self, ns: u64, free: Option<FreeFn<'_>>) -> Result<usize> {
        self.no_silent_swa_frees(free.is_some())?;
        match (&self.pool, free) {
            (None, None) => Err(invalid("drop_namespace without a pool needs a free callback")),
            (None, Some(f)) => Ok(self.tree.drop_namespace(ns, f)),
            (Some(pool), None) => {
                // As `evict_runs_to_pool`: one pool pass for the whole call, counted as an
                // eviction in progress, so an allocation that finds nothing to evict waits
                // for these slots.
                let mut ev = PoolEviction::begin(&self.evictions, pool);
                let n = self.tree.drop_namespace_runs(ns, &mut |runs| {
                    ev.pending.extend_from_slice(runs);
                    if let Some(h) = &self.evict_hook {
                        h(runs);
                    }
                });
                drop(ev); // returns the slots to the pool
                Ok(n)
            }
            (Some(pool), Some(user)) => {
                // As `evict_to_pool`.
                let mut ev = PoolEviction::begin(&self.evictions, pool);
                let mut scratch = Vec::new();
                let n = self.tree.drop_namespace(ns, &mut |slots| {
                    // Pending before `user` runs, so they go back even if it panics.
                    ev.pending.extend_from_slice(slots);
                    self.hook_slots(slots, &mut scratch);
                    user(slots);
                });
                drop(ev); // returns the slots to the pool
                Ok(n)
            }
        }
    }

    /// Counts of one namespace; see [`RadixTree::namespace_stats`].
    pub fn namespace_stats(&self, ns: u64) -> NamespaceStats {
        self.tree.namespace_stats(ns)
    }
}

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;
