//! The body of `NativeCache.__new__` (the cache's options, checked, and its host tier and
//! events), and the SWA eviction's collection: kept out of `cache.rs` for its size.

use std::sync::{Arc, Mutex};

use radixkv::events::Medium;
use radixkv::events::hash::HashMode;
use radixkv::tier::HostCopier;
use radixkv::tree::{DEFAULT_SLRU_THRESHOLD, EvictTarget, Freed};
use radixkv::{Cache, CacheOptions, EventOptions, EvictionPolicy};

use crate::errors::*;
use crate::slots::mark;

/// A new cache and its host copier's stores (if it has a host tier with copier "host").
pub(crate) fn build(
    page_size: u64,
    pool_slots: u64,
    policy: &str,
    events: Option<(u32, u32, u64)>,
    slru_threshold: Option<u32>,
    swa_window: u64,
    host: Option<crate::tier::HostArgs>,
) -> Result<(Cache, Option<Arc<HostCopier>>), Fail> {
    let bad = |m: String| Err(fail(INVALID_ARGUMENT, m));
    let policy: EvictionPolicy = match policy.parse() {
        Ok(p) => p,
        Err(e) => return bad(format!("policy: {e}")),
    };
    if page_size == 0 {
        return bad("page_size = 0: the page size must be at least 1".into());
    }
    if page_size >= 1 << 32 {
        return bad(format!("page_size = {page_size} is above 2^32 - 1"));
    }
    if pool_slots > 1 << 32 {
        return bad(format!(
            "pool_slots = {pool_slots} is above 2^32 = 4294967296 (slot ids are \
             uint32)"
        ));
    }
    if !pool_slots.is_multiple_of(page_size) {
        return bad(format!(
            "pool_slots = {pool_slots} is not a multiple of page_size = \
             {page_size} (the pool holds whole pages)"
        ));
    }
    let opts = CacheOptions {
        page_size: page_size as usize,
        policy,
        pool_slots: pool_slots as usize,
        slru_threshold: slru_threshold.unwrap_or(DEFAULT_SLRU_THRESHOLD),
        swa_window: usize::try_from(swa_window).unwrap_or(usize::MAX),
    };
    let (cache, host_copier) = match host {
        None => (Cache::new(opts), None),
        Some(h) => {
            let (tier, copier, host_copier) = crate::tier::host_parts(pool_slots, h)?;
            (Cache::with_host(opts, tier, copier), host_copier)
        }
    };
    let mut cache = cache.map_err(|e| fail(status_of(&e), format!("opts: {e}")))?;
    if let Some((hash_mode, medium, max_drain_batches)) = events {
        let hash_mode = match hash_mode {
            0 => HashMode::Xxh3,
            1 => HashMode::SglangSha256,
            h => return bad(format!("events.hash_mode = {h} is not a hash mode")),
        };
        let medium = match medium {
            0 => Medium::Gpu,
            1 => Medium::CpuPinned,
            m => return bad(format!("events.medium = {m} is not a medium")),
        };
        let max_drain_batches = usize::try_from(max_drain_batches).unwrap_or(usize::MAX);
        cache.enable_events(EventOptions { hash_mode, medium, max_drain_batches }).map_err(st)?;
    }
    Ok((cache, host_copier))
}

/// One node an `evict_kv` freed: what of it, and its slots.
pub(crate) type FreedNode = (Freed, Vec<u32>);

/// `Cache::evict_kv` on `c` for the target named `target`, collecting each node's slots
/// (and, in tracked mode, clearing the full KV freed from the bitmap).
pub(crate) fn evict_kv(
    c: &Cache,
    target: &str,
    n: usize,
    tracked: Option<&Mutex<Vec<u64>>>,
) -> Result<(usize, Vec<FreedNode>), Fail> {
    let target = match target {
        "full" => EvictTarget::Full,
        "swa" => EvictTarget::Swa,
        t => {
            return Err(fail(
                INVALID_ARGUMENT,
                format!("target = {t:?} is not 'full' or 'swa'; nothing was evicted"),
            ));
        }
    };
    let mut nodes = Vec::new();
    let count =
        c.evict_kv(target, n, &mut |f, slots| nodes.push((f, slots.to_vec()))).map_err(st)?;
    if let Some(t) = tracked {
        for (f, slots) in &nodes {
            if f.full {
                mark(t, slots.iter().copied(), false);
            }
        }
    }
    Ok((count, nodes))
}
