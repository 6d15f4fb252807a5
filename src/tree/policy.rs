//! Eviction policies: what each one orders leaves by (the key), and the per-node metadata
//! the keys read (access stamp, priority, hit count).
//!
//! Every policy evicts unpinned leaves, smallest key first; a parent left without children
//! competes next with its own key. The keys (SGLang 0.5.23's `evict_policy.py`, each a tuple
//! compared lexicographically; "access" is the node's access stamp, "creation" the stamp it
//! was built with):
//!
//! | policy | key | key moves when |
//! | --- | --- | --- |
//! | `lru` | last access | accessed: grows |
//! | `fifo` | creation | never |
//! | `mru` | minus last access | accessed: **shrinks** |
//! | `filo` | minus creation | never |
//! | `lfu` | (hit count, last access) | hit or accessed: grows |
//! | `slru` | (1 if hit count >= threshold else 0, last access) | hit or accessed: grows |
//! | `priority` | (priority, last access) | raised or accessed: grows |
//!
//! How the eviction index keeps these in order (a lazy queue for the keys that only grow, an
//! eagerly re-keyed ordered map for `mru`, whose keys shrink) is in `evict_index.rs`; what
//! counts as a hit and how priorities move is on [`InsertOptions`] and in
//! `docs/eviction.md`.

use std::fmt;

use crate::error::{Error, Result, invalid};

/// How eviction orders evictable leaves (see the `tree` module docs and
/// `docs/eviction.md`): each policy's key, smallest evicted first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EvictionPolicy {
    /// Least recently accessed leaf first (`RKV_EVICT_LRU = 0`).
    #[default]
    Lru,
    /// Oldest inserted leaf first, ignoring later accesses (`RKV_EVICT_FIFO = 1`).
    Fifo,
    /// Least frequently used first: key (hit count, last access). See [`InsertOptions`]
    /// for what counts as a hit (`RKV_EVICT_LFU = 2`).
    Lfu,
    /// Most recently accessed leaf first: key minus the last access (`RKV_EVICT_MRU = 3`).
    Mru,
    /// Newest inserted leaf first: key minus the creation stamp, ignoring accesses
    /// (`RKV_EVICT_FILO = 4`).
    Filo,
    /// Lowest priority first, least recently accessed first within a priority: key
    /// (priority, last access). An insert raises every node on its path to at least its
    /// priority ([`InsertOptions::priority`]; `RKV_EVICT_PRIORITY = 5`).
    Priority,
    /// Segmented LRU: key (1 if hit count >= [`TreeConfig::slru_threshold`] else 0, last
    /// access): the probationary segment (fewer hits) goes first, each segment in LRU
    /// order (`RKV_EVICT_SLRU = 6`).
    ///
    /// [`TreeConfig::slru_threshold`]: super::TreeConfig::slru_threshold
    Slru,
}

impl EvictionPolicy {
    /// Every policy, in SGLang's order of its `--radix-eviction-policy` choices.
    pub const ALL: [EvictionPolicy; 7] = [
        EvictionPolicy::Lru,
        EvictionPolicy::Lfu,
        EvictionPolicy::Fifo,
        EvictionPolicy::Mru,
        EvictionPolicy::Filo,
        EvictionPolicy::Priority,
        EvictionPolicy::Slru,
    ];

    /// The policy's name, as SGLang spells it (what [`std::str::FromStr`] reads).
    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Fifo => "fifo",
            EvictionPolicy::Lfu => "lfu",
            EvictionPolicy::Mru => "mru",
            EvictionPolicy::Filo => "filo",
            EvictionPolicy::Priority => "priority",
            EvictionPolicy::Slru => "slru",
        }
    }

    /// Whether the key reads hit counts (`lfu`, `slru`): only then are they counted.
    pub(crate) fn reads_hits(self) -> bool {
        matches!(self, EvictionPolicy::Lfu | EvictionPolicy::Slru)
    }

    /// Whether the key reads priorities (`priority`): only then are they kept.
    pub(crate) fn reads_priority(self) -> bool {
        self == EvictionPolicy::Priority
    }

    /// Whether nodes keep metadata beyond the stamp (a priority or a hit count).
    pub(crate) fn reads_meta(self) -> bool {
        self.reads_hits() || self.reads_priority()
    }
}

impl std::str::FromStr for EvictionPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let l = s.to_ascii_lowercase();
        EvictionPolicy::ALL.into_iter().find(|p| p.name() == l).ok_or_else(|| {
            let names: Vec<&str> = EvictionPolicy::ALL.iter().map(|p| p.name()).collect();
            invalid(format!("unknown eviction policy {s:?} (expected one of {})", names.join(", ")))
        })
    }
}

impl fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The SLRU threshold SGLang uses by default (`SLRUStrategy(protected_threshold=2)`).
pub const DEFAULT_SLRU_THRESHOLD: u32 = 2;

/// Per-insert options (see [`RadixTree::insert_with`]).
///
/// **Priority** (read by [`EvictionPolicy::Priority`]): every node on the insert's path (the
/// nodes holding `tokens[..n]`, the new leaf included) takes the larger of its own priority
/// and this one; a new node starts with it; a split's halves keep the priority of the edge
/// they came from. Where the key ends inside an edge whose priority it would raise, the
/// edge is split there first, so only the inserted tokens are raised (SGLang's insert
/// splits there too).
///
/// **Hits** (read by [`EvictionPolicy::Lfu`] and [`EvictionPolicy::Slru`]), as SGLang's
/// `_insert_helper` counts them: an insert adds one to every node on its path that ends
/// past `inserted_len`, a new leaf starts at one (if it ends past `inserted_len`), and a
/// split's halves keep the count of the edge they came from. Matches count no hit (SGLang's
/// `match_prefix` does not either); under these policies an insert that ends inside an
/// edge splits it there, as SGLang's does, so the count lands on the inserted tokens only.
///
/// Under the policies that do not read them, priorities and hit counts are not kept (they
/// read as 0), and no extra split is made.
///
/// [`RadixTree::insert_with`]: super::RadixTree::insert_with
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InsertOptions {
    /// Eviction priority of the inserted tokens (higher stays longer; default 0). An
    /// interface that takes a wider integer checks it with [`checked_priority`].
    pub priority: i32,
    /// Tokens of this key that the same request inserted before (SGLang's
    /// `req.kv.cache_inserted_len`): the nodes that end within them count no hit, so a
    /// request that inserts its growing prefix several times (chunked prefill, then the
    /// finish) counts each node once. 0 for a request's first insert.
    pub inserted_len: usize,
}

impl InsertOptions {
    /// Options with this priority (and `inserted_len` 0).
    pub fn with_priority(priority: i32) -> InsertOptions {
        InsertOptions { priority, inserted_len: 0 }
    }
}

/// A priority given as a wider integer (a trace's JSON number, a C caller's `int64_t`), as
/// the `i32` the tree keeps: `InvalidArgument` naming the range when it does not fit.
pub fn checked_priority(p: i64) -> Result<i32> {
    i32::try_from(p).map_err(|_| {
        invalid(format!("priority {p} out of range (expected {} to {})", i32::MIN, i32::MAX))
    })
}

/// One node's eviction metadata, as [`RadixTree::inspect`] reads it.
///
/// [`RadixTree::inspect`]: super::RadixTree::inspect
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)] // a test hook: checks, not an engine API (kept public for the tests)
pub struct NodeInfo {
    /// Tokens of the edge.
    pub len: usize,
    /// Pins (locks holding it).
    pub pins: u32,
    /// Priority (0 unless the policy is `priority`).
    pub priority: i32,
    /// Hit count (0 unless the policy is `lfu` or `slru`).
    pub hits: u32,
    /// Access stamp (last access, or creation under `fifo` / `filo`): comparable between
    /// nodes of one process, not a wall-clock time.
    pub stamp: u64,
    /// Whether it is a leaf (and so, unpinned, a candidate for eviction).
    pub leaf: bool,
    /// With a sliding window: window locks holding its SWA KV.
    pub swa_pins: u32,
    /// With a sliding window: whether it is an SWA tombstone (its SWA KV evicted).
    pub swa_gone: bool,
    /// With a sliding window: its SWA stamp (the SWA eviction order's key; see `swa.rs`).
    pub swa_stamp: u64,
}

// ---------------------------------------------------------------- the metadata word

/// A node's metadata word (`Node::meta`), kept only under policies that read it
/// ([`EvictionPolicy::reads_meta`]).
///
/// Bit layout: `[63..32] priority + 2^31 (an order-preserving u32 of the i32) | [31] FROZEN |
/// [30..0] hit count (saturating at 2^31 - 1)`.
pub(crate) type MetaWord = u64;
/// Set once, by the split that replaces the node (after its `REPLACED` CAS): later bumps
/// go to the halves instead (see `split.rs` and `RadixTree::bump`).
pub(crate) const FROZEN: MetaWord = 1 << 31;
/// The hit count's bits.
pub(crate) const HITS_MASK: MetaWord = FROZEN - 1;
/// Bias of the stored priority: `(p as u32) ^ PRIO_BIAS` orders like `p`.
const PRIO_BIAS: u32 = 1 << 31;

const _: () = assert!(std::mem::size_of::<MetaWord>() == 8);
const _: () = assert!(HITS_MASK & FROZEN == 0 && (HITS_MASK | FROZEN) == 0xFFFF_FFFF);

/// The word of a node with priority `p` and `hits` hits.
#[inline]
pub(crate) fn meta(p: i32, hits: u32) -> MetaWord {
    ((((p as u32) ^ PRIO_BIAS) as u64) << 32) | (hits as u64).min(HITS_MASK)
}

/// The priority a word holds.
#[inline]
pub(crate) fn meta_priority(m: MetaWord) -> i32 {
    (((m >> 32) as u32) ^ PRIO_BIAS) as i32
}

/// The hit count a word holds.
#[inline]
pub(crate) fn meta_hits(m: MetaWord) -> u32 {
    (m & HITS_MASK) as u32
}

/// `m` (not frozen) with its priority raised to at least `p` and `hits` more hits
/// (saturating); the frozen bit of `m` is kept.
#[inline]
pub(crate) fn meta_bumped(m: MetaWord, p: i32, hits: u32) -> MetaWord {
    let prio = meta_priority(m).max(p);
    let h = (meta_hits(m) as u64 + hits as u64).min(HITS_MASK) as u32;
    meta(prio, h) | (m & FROZEN)
}

// ---------------------------------------------------------------- keys

/// How a tree's policy turns a node's stamp and metadata into its eviction key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keys {
    pub(crate) policy: EvictionPolicy,
    pub(crate) slru_threshold: u32,
}

impl Keys {
    /// The key of a policy whose key is the stamp alone (`lru`, `fifo`, `mru`, `filo`).
    #[inline]
    pub(crate) fn narrow(&self, stamp: u64) -> u64 {
        match self.policy {
            EvictionPolicy::Mru | EvictionPolicy::Filo => !stamp,
            _ => stamp,
        }
    }

    /// The key of a policy whose key is a pair (`lfu`, `slru`, `priority`): the pair's
    /// first member in the high 64 bits, the stamp in the low ones.
    #[inline]
    pub(crate) fn wide(&self, stamp: u64, m: MetaWord) -> u128 {
        let hi: u64 = match self.policy {
            EvictionPolicy::Lfu => meta_hits(m) as u64,
            EvictionPolicy::Slru => (meta_hits(m) >= self.slru_threshold) as u64,
            // The biased priority: orders like the i32.
            _ => m >> 32,
        };
        ((hi as u128) << 64) | stamp as u128
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_valid_ones() {
        for p in EvictionPolicy::ALL {
            assert_eq!(p.to_string().parse::<EvictionPolicy>().unwrap(), p);
            assert_eq!(p.name().to_uppercase().parse::<EvictionPolicy>().unwrap(), p);
        }
        let e = "tlru".parse::<EvictionPolicy>().unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        let msg = e.to_string();
        for p in EvictionPolicy::ALL {
            assert!(msg.contains(p.name()), "{msg}");
        }
        assert!(msg.contains("\"tlru\""), "{msg}");
    }

    #[test]
    fn the_metadata_word_orders_priorities_and_saturates_hits() {
        for p in [i32::MIN, -7, -1, 0, 1, 42, i32::MAX] {
            for h in [0, 1, 2, 1000, u32::MAX] {
                let m = meta(p, h);
                assert_eq!(meta_priority(m), p);
                assert_eq!(meta_hits(m), h.min(HITS_MASK as u32));
                assert_eq!(m & FROZEN, 0);
            }
        }
        let ps = [i32::MIN, -7, -1, 0, 1, 42, i32::MAX];
        for w in ps.windows(2) {
            assert!(meta(w[0], 5) >> 32 < meta(w[1], 0) >> 32);
        }
        let m = meta_bumped(meta(3, HITS_MASK as u32), 1, 1);
        assert_eq!((meta_priority(m), meta_hits(m)), (3, HITS_MASK as u32));
        let m = meta_bumped(meta(3, 4) | FROZEN, 9, 2);
        assert_eq!((meta_priority(m), meta_hits(m), m & FROZEN), (9, 6, FROZEN));
    }

    #[test]
    fn keys_order_as_the_policies_say() {
        let k = |policy| Keys { policy, slru_threshold: 2 };
        assert!(k(EvictionPolicy::Lru).narrow(1) < k(EvictionPolicy::Lru).narrow(2));
        assert!(k(EvictionPolicy::Mru).narrow(1) > k(EvictionPolicy::Mru).narrow(2));
        assert!(k(EvictionPolicy::Filo).narrow(1) > k(EvictionPolicy::Filo).narrow(2));
        let lfu = k(EvictionPolicy::Lfu);
        assert!(lfu.wide(9, meta(0, 1)) < lfu.wide(1, meta(0, 2)));
        assert!(lfu.wide(1, meta(0, 2)) < lfu.wide(2, meta(0, 2)));
        let slru = k(EvictionPolicy::Slru);
        assert!(slru.wide(9, meta(0, 1)) < slru.wide(1, meta(0, 2)));
        assert!(slru.wide(1, meta(0, 5)) < slru.wide(2, meta(0, 2)));
        let pr = k(EvictionPolicy::Priority);
        assert!(pr.wide(9, meta(-1, 0)) < pr.wide(1, meta(0, 0)));
        assert!(pr.wide(1, meta(3, 0)) < pr.wide(2, meta(3, 0)));
        assert!(pr.wide(u64::MAX, meta(i32::MAX - 1, 0)) < pr.wide(0, meta(i32::MAX, 0)));
    }

    #[test]
    fn wide_priorities_are_refused_with_the_range() {
        assert_eq!(checked_priority(-5).unwrap(), -5);
        assert_eq!(checked_priority(i32::MAX as i64).unwrap(), i32::MAX);
        let e = checked_priority(i32::MAX as i64 + 1).unwrap_err().to_string();
        assert!(e.contains("2147483648") && e.contains("2147483647"), "{e}");
        assert!(checked_priority(i64::MIN).is_err());
    }
}
