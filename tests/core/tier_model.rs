//! Property test of the host tier: random operation sequences (request cycles inserting
//! keys with shared prefixes, device evictions, host evictions, load-backs, matches)
//! against a two-level sequential model (the set of pages on the device, the set with a
//! host copy), with the semantics of `radixkv::tier`'s module docs. With pools large
//! enough that nothing is evicted for room, every result is compared with the model's
//! (each match's `device_len` and `host_len`, each load-back's outcome and lengths, the
//! tokens an insert found cached) and so are the counts after each operation (host backed,
//! resident, evictable and free; device cached and free), for every write policy, with
//! copies done at once and with copies deferred (then `wait_all` after each operation).
//! With tiny pools only the invariants are checked (`check()`, the counts adding up, the
//! bytes of every pinned and loaded page) since eviction order then decides what stays.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use proptest::prelude::*;
use radixkv::kv::{HostKvStorage, KvLayout, KvStorage};
use radixkv::tier::{
    DeferredCopier, FailPlan, HostCopier, LoadOutcome, TierCopier, TierOptions, TieredCache,
    WritePolicy,
};
use radixkv::{CacheOptions, Error};

const P: usize = 2;

#[derive(Debug, Clone)]
enum Op {
    /// A request cycle: match and pin, allocate the rest, write, insert, release.
    Request(Vec<u32>),
    Match(Vec<u32>),
    LoadBack(Vec<u32>),
    /// Device eviction of at least this many tokens (`usize::MAX`: all).
    Evict(usize),
    /// Host eviction of at least this many tokens (`usize::MAX`: all it may).
    EvictHost(usize),
}

/// Keys of 1 to 3 pages, each page one of 3: 39 distinct pages, many shared prefixes.
fn key() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..3, 1..=3)
        .prop_map(|ps| ps.iter().flat_map(|&j| [10 + j, 20 + j]).collect())
}

/// Operations whose result the model predicts (device eviction of everything only).
fn exact_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => key().prop_map(Op::Request),
        2 => key().prop_map(Op::Match),
        3 => key().prop_map(Op::LoadBack),
        2 => Just(Op::Evict(usize::MAX)),
        1 => Just(Op::EvictHost(usize::MAX)),
    ]
}

/// Any operation (partial evictions too).
fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => key().prop_map(Op::Request),
        2 => key().prop_map(Op::Match),
        3 => key().prop_map(Op::LoadBack),
        2 => (1usize..8).prop_map(Op::Evict),
        1 => Just(Op::Evict(usize::MAX)),
        2 => (1usize..8).prop_map(Op::EvictHost),
    ]
}

fn any_policy() -> impl Strategy<Value = WritePolicy> {
    prop::sample::select(WritePolicy::ALL.to_vec())
}

fn layout(slots: usize) -> KvLayout {
    KvLayout::new(1, slots, 1, 2, 4)
}

/// The KV bytes of the last token of `prefix` (a hash of the whole prefix).
fn pattern(prefix: &[u32]) -> ([u8; 8], [u8; 8]) {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in prefix {
        h = (h ^ t as u64).wrapping_mul(0x100_0000_01b3);
    }
    (h.to_le_bytes(), (h ^ 0x5555_5555_5555_5555).to_le_bytes())
}

/// The two-level model, by page: a page is the key prefix ending with it.
#[derive(Default)]
struct Model {
    policy: Option<WritePolicy>,
    /// Pages on the device (prefix-closed), with their hit counts (inserts reaching them).
    device: HashMap<Vec<u32>, u64>,
    /// Pages with a host copy.
    host: HashSet<Vec<u32>>,
}

impl Model {
    fn pages(k: &[u32]) -> impl Iterator<Item = Vec<u32>> + '_ {
        (1..=k.len() / P).map(move |i| k[..i * P].to_vec())
    }

    /// Device match, in tokens.
    fn device_len(&self, k: &[u32]) -> usize {
        Self::pages(k).take_while(|p| self.device.contains_key(p)).count() * P
    }

    /// Host pages right after the device match, in tokens.
    fn host_len(&self, k: &[u32]) -> usize {
        let d = self.device_len(k);
        Self::pages(k).skip(d / P).take_while(|p| self.host.contains(p)).count() * P
    }

    /// Inserts `k` (every page reached is a hit); returns the tokens cached before.
    fn insert(&mut self, k: &[u32]) -> usize {
        let existing = self.device_len(k);
        let threshold = match self.policy.unwrap() {
            WritePolicy::WriteThrough => 1,
            WritePolicy::WriteThroughSelective => 2,
            WritePolicy::WriteBack => u64::MAX,
        };
        for p in Self::pages(k) {
            let h = self.device.entry(p.clone()).or_insert(0);
            *h += 1;
            if *h >= threshold {
                self.host.insert(p);
            }
        }
        existing
    }

    fn evict_all(&mut self) {
        if self.policy == Some(WritePolicy::WriteBack) {
            self.host.extend(self.device.keys().cloned());
        }
        self.device.clear();
    }

    /// A host page that host eviction may take: not on the device, no host child.
    fn evictable(&self, p: &Vec<u32>) -> bool {
        !self.device.contains_key(p)
            && !self.host.iter().any(|c| c.len() == p.len() + P && c.starts_with(p))
    }

    fn evict_host_all(&mut self) -> usize {
        let mut n = 0;
        loop {
            let go: Vec<Vec<u32>> =
                self.host.iter().filter(|p| self.evictable(p)).cloned().collect();
            if go.is_empty() {
                return n * P;
            }
            for p in go {
                self.host.remove(&p);
                n += 1;
            }
        }
    }

    /// A load-back: (device_len, loaded) tokens.
    fn load_back(&mut self, k: &[u32]) -> (usize, usize) {
        let d = self.device_len(k);
        let h = self.host_len(k);
        for p in Self::pages(k).skip(d / P).take(h / P) {
            self.device.insert(p, 0);
        }
        (d, h)
    }
}

struct Rig {
    cache: TieredCache,
    dev: Arc<HostKvStorage>,
    dev_slots: usize,
    host_slots: usize,
    deferred: bool,
}

impl Rig {
    fn new(policy: WritePolicy, dev_slots: usize, host_slots: usize, delay: Option<u32>) -> Rig {
        let dev = Arc::new(HostKvStorage::new(layout(dev_slots)).unwrap());
        let host = Arc::new(HostKvStorage::new(layout(host_slots)).unwrap());
        let hc = HostCopier::new(dev.clone(), host);
        let copier: Arc<dyn TierCopier> = match delay {
            Some(d) => Arc::new(DeferredCopier::new(hc, d, FailPlan::Never)),
            None => Arc::new(hc),
        };
        let cache = TieredCache::new(
            CacheOptions { page_size: P, pool_slots: dev_slots, ..Default::default() },
            TierOptions {
                host_slots,
                write_policy: policy,
                write_threshold: 2,
                ..Default::default()
            },
            copier,
        )
        .unwrap();
        Rig { cache, dev, dev_slots, host_slots, deferred: delay.is_some() }
    }

    fn verify(&self, key: &[u32], slots: &[u32]) {
        let (mut k, mut v) = ([0u8; 8], [0u8; 8]);
        for (i, &s) in slots.iter().enumerate() {
            self.dev.read_slot(0, s, &mut k, &mut v).unwrap();
            assert_eq!((k, v), pattern(&key[..=i]), "slot {s}, token {i} of {key:?}");
        }
    }

    /// A request cycle; `Some(tokens cached before)` unless the device had no room.
    fn request(&self, key: &[u32]) -> Option<usize> {
        let c = &self.cache;
        let mut slots = Vec::new();
        let (lock, m) = c.match_and_lock(0, key, &mut slots);
        self.verify(key, &slots);
        let mut fresh = Vec::new();
        match c.alloc(key.len() - m.device_len, &mut fresh) {
            Ok(()) => {}
            Err(Error::OutOfSlots { .. }) => {
                c.release(lock).unwrap();
                return None;
            }
            Err(e) => panic!("alloc: {e}"),
        }
        for (i, &s) in fresh.iter().enumerate() {
            let (k, v) = pattern(&key[..=m.device_len + i]);
            self.dev.write_slot(0, s, &k, &v).unwrap();
        }
        slots.extend_from_slice(&fresh);
        let existing = c.insert(0, key, &slots).unwrap();
        c.release(lock).unwrap();
        Some(existing)
    }

    /// A load-back; `Some((outcome, device_len, loaded))` unless the device had no room.
    fn load_back(&self, key: &[u32]) -> Option<(LoadOutcome, usize, usize)> {
        let c = &self.cache;
        let t = match c.load_back(0, key, usize::MAX) {
            Ok(t) => t,
            Err(Error::OutOfSlots { .. }) => return None,
            Err(e) => panic!("load_back: {e}"),
        };
        let d = c.wait_load(t).unwrap();
        assert_eq!(
            (d.slots.len(), d.lock.len()),
            (d.device_len + d.loaded, d.device_len + d.loaded)
        );
        self.verify(key, &d.slots);
        let r = (d.outcome, d.device_len, d.loaded);
        c.release(d.lock).unwrap();
        Some(r)
    }

    fn quiesce(&self) {
        if self.deferred {
            self.cache.wait_all();
        }
        self.cache.check().unwrap();
        let st = self.cache.stats();
        assert_eq!(st.host_free_slots + st.host_backed_slots, self.host_slots as u64, "{st:?}");
        assert_eq!(
            st.device.free_slots + st.device.tree.cached_tokens,
            self.dev_slots as u64,
            "{st:?}"
        );
        assert_eq!(
            (st.in_flight, st.host_pinned_pages, st.device.tree.protected_tokens),
            (0, 0, 0)
        );
    }
}

fn run_exact(policy: WritePolicy, delay: Option<u32>, ops: &[Op]) {
    // 39 distinct pages of 2 tokens: room for all of them on both levels.
    let r = Rig::new(policy, 96, 96, delay);
    let mut m = Model { policy: Some(policy), ..Default::default() };
    let mut out = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Request(k) => {
                let got = r.request(k).expect("room enough");
                assert_eq!(got, m.insert(k), "op {i} {op:?}: tokens cached before");
            }
            Op::Match(k) => {
                let tm = r.cache.match_prefix(0, k, &mut out);
                assert_eq!(
                    (tm.device_len, tm.host_len),
                    (m.device_len(k), m.host_len(k)),
                    "op {i} {op:?}"
                );
            }
            Op::LoadBack(k) => {
                let h = m.host_len(k);
                let (d, loaded) = m.load_back(k);
                let want = if h > 0 { LoadOutcome::Loaded } else { LoadOutcome::NothingOnHost };
                assert_eq!(
                    r.load_back(k).expect("room enough"),
                    (want, d, loaded),
                    "op {i} {op:?}"
                );
            }
            Op::Evict(_) => {
                let n = r.cache.evict(usize::MAX).unwrap();
                assert_eq!(n, m.device.len() * P, "op {i} {op:?}");
                m.evict_all();
            }
            Op::EvictHost(_) => {
                assert_eq!(r.cache.evict_host(usize::MAX), m.evict_host_all(), "op {i} {op:?}");
            }
        }
        r.quiesce();
        let st = r.cache.stats();
        let resident = m.host.iter().filter(|p| m.device.contains_key(*p)).count();
        let evictable = m.host.iter().filter(|p| m.evictable(p)).count();
        assert_eq!(
            (
                st.host_backed_slots,
                st.host_resident_pages,
                st.host_evictable_pages,
                st.device.tree.cached_tokens
            ),
            (
                (m.host.len() * P) as u64,
                resident as u64,
                evictable as u64,
                (m.device.len() * P) as u64
            ),
            "op {i} {op:?}: {st:?}"
        );
    }
}

fn run_small(policy: WritePolicy, delay: Option<u32>, dev: usize, host: usize, ops: &[Op]) {
    let r = Rig::new(policy, dev, host, delay);
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Request(k) => {
                r.request(k);
            }
            Op::Match(k) => {
                let tm = r.cache.match_prefix(0, k, &mut out);
                assert!(tm.device_len + tm.host_len <= k.len());
            }
            Op::LoadBack(k) => {
                r.load_back(k);
            }
            Op::Evict(n) => {
                r.cache.evict(*n).unwrap();
            }
            Op::EvictHost(n) => {
                r.cache.evict_host(*n);
            }
        }
        r.quiesce();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn tier_matches_the_two_level_model(
        policy in any_policy(),
        delay in prop::option::of(0u32..3),
        ops in prop::collection::vec(exact_op(), 1..60),
    ) {
        run_exact(policy, delay, &ops);
    }

    #[test]
    fn tier_keeps_its_invariants_under_tiny_pools(
        policy in any_policy(),
        delay in prop::option::of(0u32..3),
        dev_pages in 2usize..6,
        host_pages in 1usize..6,
        ops in prop::collection::vec(any_op(), 1..60),
    ) {
        run_small(policy, delay, dev_pages * P, host_pages * P, &ops);
    }
}
