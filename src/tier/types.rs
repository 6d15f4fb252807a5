//! The host tier's public value types: options, write policies, statistics, match and
//! load-back results.

use crate::cache::CacheStats;
use crate::error::{Result, invalid};
use crate::tree::{EvictionPolicy, PrefixLock};

/// When a page gets its host copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WritePolicy {
    /// On its first insert.
    WriteThrough,
    /// Once its hit count reaches [`TierOptions::write_threshold`] (SGLang's default).
    #[default]
    WriteThroughSelective,
    /// Only when the device evicts it (the eviction waits for the copy).
    WriteBack,
}

impl WritePolicy {
    /// Every policy.
    pub const ALL: [WritePolicy; 3] =
        [WritePolicy::WriteThrough, WritePolicy::WriteThroughSelective, WritePolicy::WriteBack];

    /// SGLang's name (`write_through`, `write_through_selective`, `write_back`).
    pub fn name(self) -> &'static str {
        match self {
            WritePolicy::WriteThrough => "write_through",
            WritePolicy::WriteThroughSelective => "write_through_selective",
            WritePolicy::WriteBack => "write_back",
        }
    }

    /// Parses SGLang's name (also with `-` for `_`).
    pub fn parse(s: &str) -> Result<WritePolicy> {
        let n = s.replace('-', "_");
        WritePolicy::ALL.into_iter().find(|p| p.name() == n).ok_or_else(|| {
            invalid(format!(
                "unknown write policy {s:?} (write_through, write_through_selective, write_back)"
            ))
        })
    }
}

/// Options of the host tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierOptions {
    /// Host slots (tokens), a multiple of the page size; at least one page.
    pub host_slots: usize,
    /// When pages get their host copy.
    pub write_policy: WritePolicy,
    /// `write_through_selective`: the hit count that triggers a backup (at least 1;
    /// SGLang's 2). `write_through` always uses 1.
    pub write_threshold: u32,
    /// Load-backs shorter than this many tokens are not done ([`LoadOutcome::TooShort`]).
    pub load_back_min: usize,
    /// The host eviction order; `None`: the device's policy.
    pub host_policy: Option<EvictionPolicy>,
}

impl Default for TierOptions {
    fn default() -> Self {
        TierOptions {
            host_slots: 0,
            write_policy: WritePolicy::default(),
            write_threshold: 2,
            load_back_min: 1,
            host_policy: None,
        }
    }
}

/// Counts and counters of a cache's host tier ([`Cache::tier_stats`](crate::Cache::tier_stats)); exact at quiescence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    /// The device cache's.
    pub device: CacheStats,
    /// Host slots in the pool.
    pub host_slots: u64,
    /// Free host slots.
    pub host_free_slots: u64,
    /// Host slots holding a page's copy (or being written).
    pub host_backed_slots: u64,
    /// Host pages whose tokens are also on the device.
    pub host_resident_pages: u64,
    /// Host pages a load-back is copying.
    pub host_pinned_pages: u64,
    /// Host pages that host eviction could take now.
    pub host_evictable_pages: u64,
    /// Tokens matched on the device (every match and load-back).
    pub device_hit_tokens: u64,
    /// Tokens found on the host right after a device match (`host_hit_length`, summed).
    pub host_hit_tokens: u64,
    /// Tokens copied device → host (backups and write-backs).
    pub tokens_to_host: u64,
    /// Of those, tokens written back by a device eviction (`write_back`).
    pub tokens_written_back: u64,
    /// Tokens copied host → device (load-backs).
    pub tokens_to_device: u64,
    /// Copies started device → host.
    pub copies_to_host: u64,
    /// Copies started host → device.
    pub copies_to_device: u64,
    /// Copies that failed (rolled back).
    pub copy_failures: u64,
    /// Load-backs that completed with pages loaded.
    pub load_backs: u64,
    /// Load-backs not done (too short, or nothing on the host).
    pub load_backs_skipped: u64,
    /// Host pages evicted.
    pub host_evicted_pages: u64,
    /// Copies in flight (backups and load-backs).
    pub in_flight: u64,
}

/// A match on both levels: the cache's one match result ([`crate::cache::PrefixMatch`],
/// under its tier name).
pub use crate::cache::PrefixMatch as TierMatch;

/// A load-back in flight, or done ([`Cache::load_back`](crate::Cache::load_back)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoadTicket(pub u64);

/// What a load-back did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadOutcome {
    /// Host pages were copied to the device and inserted.
    Loaded,
    /// Nothing on the host extends the device match.
    NothingOnHost,
    /// The host pages found were fewer than [`TierOptions::load_back_min`] tokens.
    TooShort,
}

/// A finished load-back: a lock over the device prefix, the loaded pages included.
#[derive(Debug)]
pub struct Loaded {
    /// Pins `tokens[..lock.len()]` on the device; release with [`Cache::release`](crate::Cache::release).
    pub lock: PrefixLock,
    /// The slots of those tokens.
    pub slots: Vec<u32>,
    /// Tokens that were on the device before.
    pub device_len: usize,
    /// Tokens loaded from the host (`lock.len() - device_len`).
    pub loaded: usize,
    /// What it did.
    pub outcome: LoadOutcome,
}
