//! Many threads (twice the cores) running request cycles on one host tier whose pools are
//! tiny, so the device evicts, the host evicts and copies are in flight all the time:
//! match and pin, load back what the host extends, allocate the rest, write each fresh
//! token's KV, insert, release; mixed with device evictions, host evictions, polls and bare
//! load-backs. Copies go through a `DeferredCopier` (held for a few polls, optionally
//! failing every few) over a `HostCopier`, for each write policy.
//!
//! A token's KV bytes depend on its whole prefix (the hash of every token up to it), so a
//! slot holding another page's bytes, or a page loaded from the wrong host copy, cannot
//! pass. Checked while running: every pinned prefix (a match's, a load-back's) holds its
//! bytes, and no fresh slot is handed to two requests. At the end (`wait_all`): `check()`,
//! nothing held or pinned, every cached device page holds its bytes, and every page loaded
//! back from the host holds the bytes that were backed up.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use radixkv::kv::{HostKvStorage, KvLayout, KvStorage};
use radixkv::tier::{DeferredCopier, FailPlan, HostCopier, LoadOutcome, TierOptions, TieredCache};
use radixkv::tier::{Loaded, WritePolicy};
use radixkv::{CacheOptions, Error, EvictionPolicy};

use crate::rng;
use rng::Rng;

const P: usize = 2;

fn layout(slots: usize) -> KvLayout {
    KvLayout::new(1, slots, 1, 2, 4) // one 8-byte K and V per slot
}

/// The KV bytes of the token at the end of `prefix` (FNV-1a over the whole prefix).
fn pattern(prefix: &[u32]) -> ([u8; 8], [u8; 8]) {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in prefix {
        h = (h ^ t as u64).wrapping_mul(0x100_0000_01b3);
    }
    (h.to_le_bytes(), (h ^ 0x5555_5555_5555_5555).to_le_bytes())
}

/// Which request holds each fresh device slot (0: none).
struct Owners(Vec<AtomicU32>);

impl Owners {
    fn claim(&self, who: u32, slots: &[u32]) {
        for &s in slots {
            let prev = self.0[s as usize].swap(who, Ordering::AcqRel);
            assert_eq!(prev, 0, "slot {s} handed to request {who} while request {prev} holds it");
        }
    }
    fn unclaim(&self, who: u32, slots: &[u32]) {
        for &s in slots {
            let prev = self.0[s as usize].swap(0, Ordering::AcqRel);
            assert_eq!(prev, who, "slot {s} owned by {prev}, not {who}");
        }
    }
}

struct Rig {
    cache: TieredCache,
    dev: Arc<HostKvStorage>,
    owners: Owners,
}

impl Rig {
    fn write(&self, slot: u32, prefix: &[u32]) {
        let (k, v) = pattern(prefix);
        self.dev.write_slot(0, slot, &k, &v).unwrap();
    }

    /// Every slot of `slots` holds the bytes of its token of `key`.
    fn verify(&self, what: &str, key: &[u32], slots: &[u32]) {
        let (mut k, mut v) = ([0u8; 8], [0u8; 8]);
        for (i, &s) in slots.iter().enumerate() {
            self.dev.read_slot(0, s, &mut k, &mut v).unwrap();
            assert_eq!((k, v), pattern(&key[..=i]), "{what}: slot {s}, token {i} of {key:?}");
        }
    }

    /// A load-back's result: the lock and slots it hands over (verified), `None` after a
    /// copy failure (injected). Panics on anything else.
    fn loaded(&self, key: &[u32], r: radixkv::Result<Loaded>) -> Option<Loaded> {
        match r {
            Ok(d) => {
                assert_eq!(d.slots.len(), d.lock.len());
                assert_eq!(d.loaded, d.lock.len() - d.device_len);
                if d.outcome != LoadOutcome::Loaded {
                    assert_eq!(d.loaded, 0);
                }
                self.verify("a load-back", key, &d.slots);
                Some(d)
            }
            Err(Error::Device(_)) => None,
            Err(e) => panic!("load-back of {key:?}: {e}"),
        }
    }

    /// Starts a load-back of `key` and takes its result (waiting, or polling).
    fn load(&self, key: &[u32], rng: &mut Rng) -> Option<Loaded> {
        let t = match self.cache.load_back(0, key, usize::MAX) {
            Ok(t) => t,
            Err(Error::OutOfSlots { .. }) => return None,
            Err(Error::Device(_)) => return None,
            Err(e) => panic!("load-back of {key:?}: {e}"),
        };
        let r = if rng.below(2) == 0 {
            self.cache.wait_load(t)
        } else {
            loop {
                if let Some(r) = self.cache.try_load(t) {
                    break r;
                }
                std::thread::yield_now();
            }
        };
        self.loaded(key, r)
    }

    /// One request: match and pin, maybe load back what the host extends, allocate the
    /// rest, write it, insert, release.
    fn request(&self, who: u32, key: &[u32], rng: &mut Rng) {
        let c = &self.cache;
        let mut slots = Vec::new();
        let (mut lock, m) = c.match_and_lock(0, key, &mut slots);
        self.verify("a pinned match", key, &slots);
        if m.host_len > 0
            && rng.below(3) != 0
            && let Some(d) = self.load(key, rng)
        {
            c.release(lock).unwrap();
            lock = d.lock;
            slots = d.slots;
        }
        let have = slots.len();
        let mut fresh = Vec::new();
        match c.alloc(key.len() - have, &mut fresh) {
            Ok(()) => {}
            Err(Error::OutOfSlots { .. }) => {
                c.release(lock).unwrap();
                return;
            }
            Err(e) => panic!("alloc: {e}"),
        }
        self.owners.claim(who, &fresh);
        for (i, &s) in fresh.iter().enumerate() {
            self.write(s, &key[..=have + i]);
        }
        // Still ours: nobody wrote over them meanwhile.
        let (mut k, mut v) = ([0u8; 8], [0u8; 8]);
        for (i, &s) in fresh.iter().enumerate() {
            self.dev.read_slot(0, s, &mut k, &mut v).unwrap();
            assert_eq!((k, v), pattern(&key[..=have + i]), "fresh slot {s} overwritten");
        }
        self.owners.unclaim(who, &fresh);
        slots.extend_from_slice(&fresh);
        c.insert(0, key, &slots).unwrap();
        c.release(lock).unwrap();
    }
}

/// Keys of whole pages with shared prefixes: 4 families (first token), each key a random
/// earlier key's prefix (or a family's first page) extended by 1 or 2 pages from a
/// 3-token alphabet; at most 4 pages.
fn keys(n: usize, rng: &mut Rng) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = Vec::new();
    while out.len() < n {
        let mut k = if out.is_empty() || rng.below(3) == 0 {
            vec![1000 * (1 + rng.below(4) as u32), 1 + rng.below(3) as u32]
        } else {
            let b = &out[rng.below(out.len() as u64) as usize];
            let pages = 1 + rng.below((b.len() / P) as u64) as usize;
            b[..pages * P].to_vec()
        };
        for _ in 0..1 + rng.below(2) {
            if k.len() < 4 * P {
                k.extend((0..P).map(|_| 1 + rng.below(3) as u32));
            }
        }
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

fn run(policy: WritePolicy, fail: FailPlan, dev_slots: usize, host_slots: usize, cycles: usize) {
    let dev = Arc::new(HostKvStorage::new(layout(dev_slots)).unwrap());
    let host = Arc::new(HostKvStorage::new(layout(host_slots)).unwrap());
    let copier = DeferredCopier::new(HostCopier::new(dev.clone(), host), 2, fail);
    let cache = TieredCache::new(
        CacheOptions {
            page_size: P,
            pool_slots: dev_slots,
            policy: EvictionPolicy::Lru,
            ..Default::default()
        },
        TierOptions { host_slots, write_policy: policy, write_threshold: 2, ..Default::default() },
        Arc::new(copier),
    )
    .unwrap();
    let rig = Arc::new(Rig {
        cache,
        dev,
        owners: Owners((0..dev_slots).map(|_| AtomicU32::new(0)).collect()),
    });
    let keys = Arc::new(keys(24, &mut Rng(0x5eed)));
    let threads = 2 * std::thread::available_parallelism().map_or(2, |n| n.get());
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let rig = rig.clone();
            let keys = keys.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9 + t as u64 * 7919);
                let c = &rig.cache;
                for i in 0..cycles {
                    let key = &keys[rng.below(keys.len() as u64) as usize];
                    match rng.below(100) {
                        0..60 => rig.request((t * cycles + i + 1) as u32, key, &mut rng),
                        60..70 => {
                            c.evict(1 + rng.below(8) as usize).unwrap();
                        }
                        70..78 => {
                            c.evict_host(1 + rng.below(8) as usize);
                        }
                        78..90 => {
                            c.poll();
                        }
                        _ => {
                            if let Some(d) = rig.load(key, &mut rng) {
                                c.release(d.lock).unwrap();
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let c = &rig.cache;
    c.wait_all();
    c.check().unwrap();
    let st = c.stats();
    assert_eq!((st.in_flight, st.host_pinned_pages), (0, 0), "{st:?}");
    assert_eq!(st.device.free_slots + st.device.tree.cached_tokens, dev_slots as u64, "{st:?}");
    assert_eq!(st.device.tree.protected_tokens, 0, "{st:?}");
    eprintln!("{} {fail:?}: {st:?}", policy.name());
    assert!(st.copies_to_host > 0 && st.load_backs > 0, "nothing was exercised: {st:?}");
    if fail != FailPlan::Never {
        assert!(st.copy_failures > 0, "{st:?}");
    }
    // Every cached device page holds its bytes (every cached page is a prefix of a key).
    let mut out = Vec::new();
    for k in keys.iter() {
        c.match_prefix(0, k, &mut out);
        rig.verify("a cached page at the end", k, &out);
    }
    // Every host copy holds the bytes that were backed up: load each key back onto an
    // empty device.
    let mut rng = Rng(1);
    for k in keys.iter() {
        c.evict(usize::MAX).unwrap();
        if let Some(d) = rig.load(k, &mut rng) {
            c.release(d.lock).unwrap();
        }
    }
    c.wait_all();
    c.check().unwrap();
}

const CYCLES: usize = 100_000;

#[test]
fn write_through_under_tiny_pools() {
    run(WritePolicy::WriteThrough, FailPlan::Never, 16, 24, CYCLES);
}

#[test]
fn write_through_selective_under_tiny_pools() {
    run(WritePolicy::WriteThroughSelective, FailPlan::Never, 16, 24, CYCLES);
}

#[test]
fn write_back_under_tiny_pools() {
    run(WritePolicy::WriteBack, FailPlan::Never, 16, 24, CYCLES);
}

#[test]
fn every_policy_with_copy_failures() {
    for p in WritePolicy::ALL {
        run(p, FailPlan::Every(5), 16, 24, CYCLES / 3);
    }
}
