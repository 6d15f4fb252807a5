//! [`TieredCache`]: the host tier's former second cache type, kept for one release as a
//! thin compatibility wrapper over a [`Cache`] built with [`Cache::with_host`]. Every
//! method forwards to that cache's own door; new code uses the cache directly.

use std::sync::Arc;

use super::{LoadTicket, Loaded, TierCopier, TierMatch, TierOptions, TierStats};
use crate::cache::{Cache, CacheOptions, EventOptions};
use crate::error::{Error, Result};
use crate::events::EventSink;
use crate::tree::{InsertOptions, PrefixLock};

/// A two-level prefix cache: a [`Cache`] with a host tier (see the [module docs](super)).
/// `Send + Sync`.
///
/// Deprecated: a compatibility wrapper, kept for one release, over
/// [`Cache::with_host`]; every method is the cache's own (a match is [`Cache::lookup`],
/// `insert` is [`Cache::insert`], `load_back` is [`Cache::load_back`], ...). Use the cache.
pub struct TieredCache {
    cache: Cache,
}

impl std::fmt::Debug for TieredCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TieredCache")
            .field("opts", &self.options())
            .field("stats", &self.stats())
            .finish()
    }
}

impl TieredCache {
    /// [`Cache::with_host`].
    pub fn new(
        device: CacheOptions,
        tier: TierOptions,
        copier: Arc<dyn TierCopier>,
    ) -> Result<Self> {
        Ok(TieredCache { cache: Cache::with_host(device, tier, copier)? })
    }

    /// The cache it wraps (a [`Cache`] with a tier).
    pub fn into_cache(self) -> Cache {
        self.cache
    }

    /// Turns KV events on ([`Cache::enable_events`]: host copies are published as
    /// `CPU_PINNED`). Only on an empty cache, once.
    pub fn enable_events(&mut self, opts: EventOptions) -> Result<Arc<EventSink>> {
        self.cache.enable_events(opts)
    }

    /// The cache (with its tier: its matches and inserts go through the tier).
    pub fn device(&self) -> &Cache {
        &self.cache
    }

    /// The tier's options.
    pub fn options(&self) -> TierOptions {
        self.cache.tier_options().expect("a tiered cache has a tier")
    }

    /// The page size.
    pub fn page_size(&self) -> usize {
        self.cache.page_size()
    }

    /// The copier.
    pub fn copier(&self) -> &Arc<dyn TierCopier> {
        self.cache.tier_copier().expect("a tiered cache has a tier")
    }

    /// [`Cache::lookup`].
    pub fn match_prefix(&self, ns: u64, tokens: &[u32], out: &mut Vec<u32>) -> TierMatch {
        self.cache.lookup(ns, tokens, out)
    }

    /// [`Cache::lookup_and_lock`], the lock detached (release it with
    /// [`TieredCache::release`]).
    pub fn match_and_lock(
        &self,
        ns: u64,
        tokens: &[u32],
        out: &mut Vec<u32>,
    ) -> (PrefixLock, TierMatch) {
        let (g, m) = self.cache.lookup_and_lock(ns, tokens, out);
        (g.into_raw(), m)
    }

    /// [`Cache::release`].
    pub fn release(&self, lock: PrefixLock) -> Result<()> {
        self.cache.release(lock)
    }

    /// [`Cache::alloc`] (evictions it makes go through the host tier).
    pub fn alloc(&self, n: usize, out: &mut Vec<u32>) -> Result<()> {
        self.cache.alloc(n, out)
    }

    /// [`Cache::free`].
    pub fn free(&self, slots: &[u32]) -> Result<()> {
        self.cache.free(slots)
    }

    /// [`Cache::evict`] into the pool; host copies stay.
    pub fn evict(&self, k: usize) -> Result<usize> {
        self.cache.evict(k, None)
    }

    /// [`Cache::evict_host`].
    pub fn evict_host(&self, k: usize) -> usize {
        self.cache.evict_host(k).unwrap_or(0)
    }

    /// [`Cache::insert`] (each page's slots one whole pool page; backed up by the write
    /// policy).
    pub fn insert(&self, ns: u64, tokens: &[u32], slots: &[u32]) -> Result<usize> {
        self.cache.insert(ns, tokens, slots)
    }

    /// [`Cache::insert_with`].
    pub fn insert_with(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: &[u32],
        opts: InsertOptions,
    ) -> Result<usize> {
        self.cache.insert_with(ns, tokens, slots, opts)
    }

    /// [`Cache::insert_and_lock`], the lock detached.
    pub fn insert_and_lock(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: &[u32],
        opts: InsertOptions,
    ) -> Result<(usize, PrefixLock)> {
        let (e, g) = self.cache.insert_and_lock(ns, tokens, slots, opts)?;
        Ok((e, g.into_raw()))
    }

    /// [`Cache::load_back`].
    pub fn load_back(&self, ns: u64, tokens: &[u32], max_tokens: usize) -> Result<LoadTicket> {
        self.cache.load_back(ns, tokens, max_tokens)
    }

    /// [`Cache::try_load`].
    pub fn try_load(&self, t: LoadTicket) -> Option<Result<Loaded>> {
        self.cache.try_load(t)
    }

    /// [`Cache::wait_load`].
    pub fn wait_load(&self, t: LoadTicket) -> Result<Loaded> {
        self.cache.wait_load(t)
    }

    /// [`Cache::poll`].
    pub fn poll(&self) -> usize {
        self.cache.poll()
    }

    /// [`Cache::wait_all`].
    pub fn wait_all(&self) {
        self.cache.wait_all()
    }

    /// [`Cache::tier_stats`].
    pub fn stats(&self) -> TierStats {
        self.cache.tier_stats().expect("a tiered cache has a tier")
    }

    /// [`Cache::check_tier`].
    pub fn check(&self) -> std::result::Result<(), String> {
        self.cache.check_tier().unwrap_or_else(|| Err(Error::NoTier.to_string()))
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn f<T: Send + Sync>() {}
    f::<TieredCache>();
}
