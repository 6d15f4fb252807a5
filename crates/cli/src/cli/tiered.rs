//! The host tier's part of a replay (`--host-capacity`): its options ([`HostTier`], turned
//! into the core's [`TierOptions`]), the counts of its request cycle and its section of the
//! report. The replay itself is [`super::replay`]'s one path: a cache built with host
//! options (a device pool of the capacity option, a host tier of `--host-capacity` tokens
//! behind it, copying through the index-only `NullCopier`: no KV bytes move) goes through
//! the same request cycle as a device-only one, with a load-back step.

use super::kv::KvSize;
use super::report::{Report, TierReport};
use radixkv::Cache;
use radixkv::tier::{TierOptions, WritePolicy};
use std::sync::atomic::{AtomicU64, Ordering};

/// Default `--host-link-gbps`: an assumed host ↔ device bandwidth (about PCIe 5.0 x16 in
/// practice), used only to turn the bytes copied into a time; not a measurement.
pub const DEFAULT_LINK_GBPS: f64 = 50.0;

/// The host tier of a replay.
#[derive(Debug, Clone, Copy)]
pub struct HostTier {
    /// Host slots in tokens (rounded down to whole pages by the replay).
    pub capacity: u64,
    /// When pages get their host copy.
    pub write_policy: WritePolicy,
    /// `write_through_selective`'s hit threshold.
    pub write_threshold: u32,
    /// Load-backs shorter than this many tokens are not done.
    pub load_back_min: usize,
    /// Host ↔ device bandwidth assumed for the copy times, GB/s (10^9 bytes).
    pub link_gbps: f64,
}

/// Counts of the tier's request cycle (all threads; added once per request).
#[derive(Default)]
pub(super) struct TierCounts {
    /// Tokens the host extended device matches by (`host_len` summed).
    pub(super) host_match_tokens: AtomicU64,
    /// Tokens loaded back.
    pub(super) loaded_tokens: AtomicU64,
    /// Requests with a load-back that loaded pages.
    pub(super) load_backs: AtomicU64,
    /// Load-backs refused for want of device slots (every slot pinned).
    pub(super) load_back_out_of_slots: AtomicU64,
}

/// Adds `n` to a count.
pub(super) fn add(c: &AtomicU64, n: u64) {
    if n > 0 {
        // Relaxed: statistics, read once the workers are joined.
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// The core's tier options for `h` over a device pool of `pool` slots (0: unlimited,
/// refused) and page size `page`.
pub(super) fn tier_options(h: &HostTier, page: usize, pool: usize) -> Result<TierOptions, String> {
    if pool == 0 {
        return Err("a host tier needs a device capacity (--capacity), not unlimited".into());
    }
    let host = (h.capacity / page as u64) * page as u64;
    if host == 0 {
        return Err(format!(
            "host capacity {} is smaller than one page ({page} tokens)",
            h.capacity
        ));
    }
    let host = usize::try_from(host)
        .map_err(|_| format!("host capacity {} too large for this machine", h.capacity))?;
    Ok(TierOptions {
        host_slots: host,
        write_policy: h.write_policy,
        write_threshold: h.write_threshold,
        load_back_min: h.load_back_min,
        host_policy: None,
    })
}

/// The host tier's section of the report, from the tier's counters and the engine's.
pub(super) fn tier_report(
    cache: &Cache,
    h: &HostTier,
    t: &TierCounts,
    r: &Report,
    kv: Option<&KvSize>,
) -> TierReport {
    let s = cache.tier_stats().expect("a tiered replay's cache has a tier");
    let o = cache.tier_options().expect("a tiered replay's cache has a tier");
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let loaded = get(&t.loaded_tokens);
    let ratio = |x: u64| if r.input_tokens == 0 { 0.0 } else { x as f64 / r.input_tokens as f64 };
    let copies = s.copies_to_host + s.copies_to_device;
    let tokens = s.tokens_to_host + s.tokens_to_device;
    let bpt = kv.map(|k| k.bytes_per_token);
    let bytes = |n: u64| bpt.map(|b| n.saturating_mul(b));
    let secs = |b: Option<u64>| b.map(|b| b as f64 / (h.link_gbps * 1e9));
    let (to_host, to_device) = (bytes(s.tokens_to_host), bytes(s.tokens_to_device));
    TierReport {
        host_capacity: s.host_slots,
        write_policy: o.write_policy.name().to_string(),
        write_threshold: o.write_threshold,
        load_back_min: o.load_back_min as u64,
        copier: "null (index only: no KV bytes move)".to_string(),
        device_hit_tokens: r.hit_tokens,
        device_hit_ratio: r.hit_ratio,
        host_match_tokens: get(&t.host_match_tokens),
        host_hit_tokens: loaded,
        host_hit_ratio: ratio(loaded),
        combined_hit_tokens: r.hit_tokens + loaded,
        combined_hit_ratio: ratio(r.hit_tokens + loaded),
        tokens_to_host: s.tokens_to_host,
        tokens_to_device: s.tokens_to_device,
        tokens_written_back: s.tokens_written_back,
        copies_to_host: s.copies_to_host,
        copies_to_device: s.copies_to_device,
        copies_per_request: if r.requests == 0 { 0.0 } else { copies as f64 / r.requests as f64 },
        tokens_per_copy: (copies > 0).then(|| tokens as f64 / copies as f64),
        load_backs: get(&t.load_backs),
        load_backs_skipped: s.load_backs_skipped,
        load_back_out_of_slots: get(&t.load_back_out_of_slots),
        copy_failures: s.copy_failures,
        host_evicted_pages: s.host_evicted_pages,
        host_evicted_tokens: s.host_evicted_pages * cache.page_size() as u64,
        host_cached_tokens: s.host_backed_slots,
        host_resident_pages: s.host_resident_pages,
        host_link_gbps: h.link_gbps,
        bytes_to_host: to_host,
        bytes_to_device: to_device,
        copy_time_to_host_s: secs(to_host),
        copy_time_to_device_s: secs(to_device),
    }
}
