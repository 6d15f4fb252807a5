//! The host tier as an optional part of a [`Cache`] (as the pool is): a cache built with
//! [`Cache::with_host`] has one, and its plain calls go through it. [`Cache::lookup`] says
//! how far host copies extend a match, inserts back pages up by the write policy, device
//! evictions write back, and [`Cache::load_back`] brings host pages back to the device (the
//! protocols: [`crate::tier`]'s module docs). Without a tier each of the tier's hot paths
//! costs one `Option` test, and the tier-only calls refuse with [`Error::NoTier`] (or
//! answer `None`, for statistics and the check).

use std::sync::Arc;

use super::*;
use crate::tier::{LoadTicket, Loaded, Tier, TierCopier, TierOptions, TierStats, Tiered};

/// What a match found: the device prefix and how far host copies extend it (the one
/// match result of [`Cache::lookup`] and [`Cache::lookup_and_lock`]; the tier calls it
/// [`crate::tier::TierMatch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixMatch {
    /// Tokens cached on the device (what [`Cache::match_prefix`] returns).
    pub device_len: usize,
    /// Tokens on the host right after them (SGLang's `host_hit_length`); 0 without a tier.
    pub host_len: usize,
}

impl Cache {
    /// A cache of `opts` (pool mode: `pool_slots > 0`) with a host tier of
    /// `host.host_slots` slots, copying through `copier` ([`crate::tier::HostCopier`],
    /// [`crate::tier::NullCopier`] for an index-only replay, or the CUDA copier).
    /// `InvalidArgument` as [`Cache::new`], and for a cache without a pool, a host size that
    /// is not a positive multiple of the page size, or a zero `write_threshold`.
    pub fn with_host(
        opts: CacheOptions,
        host: TierOptions,
        copier: Arc<dyn TierCopier>,
    ) -> Result<Self> {
        if opts.swa_window > 0 {
            return Err(crate::error::invalid(
                "a host tier is not combined with a sliding window (swa_window > 0)",
            ));
        }
        let (tier, hook) = Tier::new(opts, host, copier)?;
        let mut c = Cache::new(opts)?;
        c.evict_hook = Some(hook);
        c.tier = Some(Box::new(tier));
        Ok(c)
    }

    /// The cache and its tier, if it has one.
    #[inline]
    pub(crate) fn tiered(&self) -> Option<Tiered<'_>> {
        self.tier.as_deref().map(|t| Tiered::new(self, t))
    }

    /// Whether it has a host tier ([`Cache::with_host`]).
    pub fn has_tier(&self) -> bool {
        self.tier.is_some()
    }

    /// The host tier's options; `None` without a tier.
    pub fn tier_options(&self) -> Option<TierOptions> {
        self.tier.as_ref().map(|t| t.options())
    }

    /// The host tier's copier; `None` without a tier.
    pub fn tier_copier(&self) -> Option<&Arc<dyn TierCopier>> {
        self.tier.as_deref().map(|t| t.copier())
    }

    /// [`Cache::match_prefix`], also saying how far host copies extend the device prefix
    /// ([`PrefixMatch::host_len`]; 0 without a tier). With a tier it first finishes the
    /// copies that are done ([`Cache::poll`]) and counts the hits in [`Cache::tier_stats`].
    pub fn lookup<S: SlotSink>(&self, ns: u64, tokens: &[u32], out: &mut S) -> PrefixMatch {
        match self.tiered() {
            None => {
                PrefixMatch { device_len: self.tree.match_prefix(ns, tokens, out), host_len: 0 }
            }
            Some(t) => t.match_prefix(ns, tokens, out),
        }
    }

    /// [`Cache::match_and_lock`], also saying how far host copies extend the pinned device
    /// prefix (as [`Cache::lookup`]).
    pub fn lookup_and_lock<S: SlotSink>(
        &self,
        ns: u64,
        tokens: &[u32],
        out: &mut S,
    ) -> (LockGuard<'_>, PrefixMatch) {
        match self.tiered() {
            None => {
                let g = self.tree.match_and_lock(ns, tokens, out);
                let m = PrefixMatch { device_len: g.len(), host_len: 0 };
                (g, m)
            }
            Some(t) => t.match_and_lock(ns, tokens, out),
        }
    }

    /// Starts loading back the host pages that extend the device match of `tokens`, at
    /// most `max_tokens` of them: allocates device slots (evicting as [`Cache::alloc`]),
    /// pins the host copies and starts the copy. Take the result with
    /// [`Cache::wait_load`] or [`Cache::try_load`]: a [`Loaded`] holding a lock over the
    /// device prefix with the loaded pages (when nothing is worth loading, over the device
    /// prefix alone, [`crate::tier::LoadOutcome`] saying why). `OutOfSlots` (nothing
    /// changed) when the device cannot hold the pages; a failed copy is `Device` from
    /// `wait_load`, with everything rolled back. `NoTier` without a tier.
    pub fn load_back(&self, ns: u64, tokens: &[u32], max_tokens: usize) -> Result<LoadTicket> {
        self.tiered().ok_or(Error::NoTier)?.load_back(ns, tokens, max_tokens)
    }

    /// The result of a load-back if it is done (taking it), `None` while its copy runs;
    /// `Some(Err(NoTier))` without a tier.
    pub fn try_load(&self, t: LoadTicket) -> Option<Result<Loaded>> {
        match self.tiered() {
            None => Some(Err(Error::NoTier)),
            Some(tier) => tier.try_load(t),
        }
    }

    /// Waits for a load-back and takes its result. `InvalidArgument` for a ticket that is
    /// unknown or already taken, `NoTier` without a tier. If the copier panics, the
    /// load-back is rolled back (its result, taken next, is `Device`) and the panic goes on.
    pub fn wait_load(&self, t: LoadTicket) -> Result<Loaded> {
        self.tiered().ok_or(Error::NoTier)?.wait_load(t)
    }

    /// Finishes the host tier's copies that are done (backups commit their host copies and
    /// unpin the device pages; load-backs insert their pages) and returns how many
    /// finished; every match, insert and load-back calls it first, and an engine calls it
    /// once per step. 0 without a tier (nothing is ever in flight). If the copier panics,
    /// the copy it was polling is rolled back as failed, the others stay in flight, and the
    /// panic goes on.
    pub fn poll(&self) -> usize {
        self.tiered().map_or(0, |t| t.poll())
    }

    /// Waits for every copy of the host tier in flight and finishes it (nothing to do
    /// without a tier). If the copier panics, the copy it was waiting on is rolled back as
    /// failed, the rest stay in flight, and the panic goes on.
    pub fn wait_all(&self) {
        if let Some(t) = self.tiered() {
            t.wait_all();
        }
    }

    /// Evicts at least `k` host tokens (host-only leaves, by the host policy); returns the
    /// host tokens freed. `NoTier` without a tier.
    pub fn evict_host(&self, k: usize) -> Result<usize> {
        Ok(self.tiered().ok_or(Error::NoTier)?.evict_host(k))
    }

    /// The host tier's counts and counters, the device's included; exact at quiescence.
    /// `None` without a tier.
    pub fn tier_stats(&self) -> Option<TierStats> {
        self.tiered().map(|t| t.stats())
    }

    /// Checks the host tier's invariants that hold at quiescence (no copy in flight, no
    /// other thread using the cache: see [`crate::tier`]); the first violation found.
    /// `None` without a tier.
    pub fn check_tier(&self) -> Option<std::result::Result<(), String>> {
        self.tiered().map(|t| t.check())
    }

    /// [`Cache::insert_and_lock`] writing the cached slots of `tokens[..existing]` into
    /// `cached` (the [`Request`] cycle's checkpoint), through the tier if there is one.
    pub(crate) fn insert_lock_cached(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: &[u32],
        opts: InsertOptions,
        cached: &mut Vec<u32>,
    ) -> Result<(usize, Option<PrefixLock>)> {
        match self.tiered() {
            None => self.insert_impl(ns, tokens, slots, true, opts, Some(cached)),
            Some(t) => t.insert_inner(ns, tokens, Slots::List(slots), opts, true, Some(cached)),
        }
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        // Copies in flight read or write memory the caller may free next: finish them.
        if let Some(t) = self.tiered() {
            t.finish_on_drop();
        }
    }
}
