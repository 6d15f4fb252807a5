//! The host tier as a part of [`Cache`] ([`Cache::with_host`]): the plain calls go
//! through it (a match says how far the host extends it, an insert backs pages up by the
//! write policy, an eviction leaves host copies, a load-back brings them back with their
//! bytes), and a cache without a tier refuses the tier's calls ([`Error::NoTier`]).

use std::sync::Arc;

use radixkv::kv::{HostKvStorage, KvLayout, KvStorage};
use radixkv::tier::{HostCopier, LoadOutcome, NullCopier, TierOptions, WritePolicy};
use radixkv::{Cache, CacheOptions, Error, InsertOptions, PrefixMatch, SlotRun};

const P: usize = 4;

fn layout(slots: usize) -> KvLayout {
    KvLayout::new(1, slots, 1, 1, 4)
}

fn bytes(t: u32) -> ([u8; 4], [u8; 4]) {
    let x = t.wrapping_mul(2654435761);
    (x.to_le_bytes(), (x ^ 0x5555_5555).to_le_bytes())
}

/// A cache of 16 device slots with a host tier of 32, copying between two host stores.
fn cache(policy: WritePolicy) -> (Cache, Arc<HostKvStorage>) {
    let dev = Arc::new(HostKvStorage::new(layout(16)).unwrap());
    let host = Arc::new(HostKvStorage::new(layout(32)).unwrap());
    let c = Cache::with_host(
        CacheOptions { page_size: P, pool_slots: 16, ..Default::default() },
        TierOptions { host_slots: 32, write_policy: policy, ..Default::default() },
        Arc::new(HostCopier::new(dev.clone(), host)),
    )
    .unwrap();
    (c, dev)
}

/// Allocates, writes each token's bytes and inserts `tokens` (whole pages).
fn put(c: &Cache, dev: &HostKvStorage, tokens: &[u32]) -> Vec<u32> {
    let mut slots = Vec::new();
    c.alloc(tokens.len(), &mut slots).unwrap();
    for (&s, &t) in slots.iter().zip(tokens) {
        let (k, v) = bytes(t);
        dev.write_slot(0, s, &k, &v).unwrap();
    }
    c.insert(0, tokens, &slots).unwrap();
    slots
}

#[test]
fn a_cache_with_a_tier_backs_up_matches_the_host_and_loads_back() {
    let (c, dev) = cache(WritePolicy::WriteThrough);
    assert!(c.has_tier());
    assert_eq!(c.tier_options().unwrap().write_policy, WritePolicy::WriteThrough);
    let a: Vec<u32> = (1..=8).collect();
    put(&c, &dev, &a);
    c.wait_all();
    let s = c.tier_stats().unwrap();
    assert_eq!(s.tokens_to_host, 8, "write_through backs the insert up");
    // Evict the device copy: the host copy stays, and a match says so.
    assert_eq!(c.evict(usize::MAX, None).unwrap(), 8);
    let mut out: Vec<u32> = Vec::new();
    assert_eq!(c.lookup(0, &a, &mut out), PrefixMatch { device_len: 0, host_len: 8 });
    assert_eq!(c.match_prefix(0, &a, &mut out), 0, "match_prefix is the device length");
    let (g, m) = c.lookup_and_lock(0, &a, &mut out);
    assert_eq!((g.len(), m.host_len), (0, 8));
    drop(g);
    // Load back: the bytes come back, and the pages are on the device again.
    let t = c.load_back(0, &a, usize::MAX).unwrap();
    let l = c.wait_load(t).unwrap();
    assert_eq!((l.outcome, l.loaded, l.lock.len()), (LoadOutcome::Loaded, 8, 8));
    for (&s, &t) in l.slots.iter().zip(&a) {
        let (mut k, mut v) = ([0u8; 4], [0u8; 4]);
        dev.read_slot(0, s, &mut k, &mut v).unwrap();
        assert_eq!((k, v), bytes(t));
    }
    c.release(l.lock).unwrap();
    assert_eq!(c.lookup(0, &a, &mut out), PrefixMatch { device_len: 8, host_len: 0 });
    assert_eq!(c.evict_host(usize::MAX).unwrap(), 0, "the host copies are resident");
    c.check_tier().unwrap().unwrap();
    assert_eq!(c.tier_stats().unwrap().load_backs, 1);
}

#[test]
fn inserts_by_runs_and_the_request_cycle_go_through_the_tier() {
    let (c, dev) = cache(WritePolicy::WriteThrough);
    let mut runs: Vec<SlotRun> = Vec::new();
    c.alloc_runs(8, &mut runs).unwrap();
    let a: Vec<u32> = (100..108).collect();
    let (e, g) = c.insert_and_lock(0, &a, &mut runs, InsertOptions::default()).unwrap();
    assert_eq!((e, g.len()), (0, 8));
    drop(g);
    c.wait_all();
    assert_eq!(c.tier_stats().unwrap().tokens_to_host, 8);
    let b: Vec<u32> = (200..208).collect();
    let mut r = c.admit(0, &b[..4]).unwrap();
    r.extend(&b[4..]).unwrap();
    assert_eq!(r.checkpoint().unwrap(), 0);
    let _ = dev;
    r.finish().unwrap();
    c.wait_all();
    assert_eq!(c.tier_stats().unwrap().tokens_to_host, 16);
    c.check_tier().unwrap().unwrap();
}

#[test]
fn write_back_copies_on_device_eviction() {
    let (c, dev) = cache(WritePolicy::WriteBack);
    let a: Vec<u32> = (1..=8).collect();
    put(&c, &dev, &a);
    c.wait_all();
    assert_eq!(c.tier_stats().unwrap().tokens_to_host, 0);
    c.evict(usize::MAX, None).unwrap();
    let s = c.tier_stats().unwrap();
    assert_eq!((s.tokens_written_back, s.tokens_to_host), (8, 8));
    let mut out: Vec<u32> = Vec::new();
    assert_eq!(c.lookup(0, &a, &mut out).host_len, 8);
    c.check_tier().unwrap().unwrap();
}

#[test]
fn a_cache_without_a_tier_refuses_the_tier_calls() {
    let c =
        Cache::new(CacheOptions { page_size: P, pool_slots: 16, ..Default::default() }).unwrap();
    assert!(!c.has_tier());
    assert!(c.tier_options().is_none() && c.tier_copier().is_none());
    let a: Vec<u32> = (1..=8).collect();
    put(&c, &HostKvStorage::new(layout(16)).unwrap(), &a);
    let mut out: Vec<u32> = Vec::new();
    assert_eq!(c.lookup(0, &a, &mut out), PrefixMatch { device_len: 8, host_len: 0 });
    assert!(matches!(c.load_back(0, &a, 8), Err(Error::NoTier)));
    assert!(matches!(c.wait_load(radixkv::tier::LoadTicket(1)), Err(Error::NoTier)));
    assert!(matches!(c.try_load(radixkv::tier::LoadTicket(1)), Some(Err(Error::NoTier))));
    assert!(matches!(c.evict_host(8), Err(Error::NoTier)));
    assert_eq!(Error::NoTier.status(), radixkv::error::status::INVALID_ARGUMENT);
    assert!(c.tier_stats().is_none() && c.check_tier().is_none());
    assert_eq!(c.poll(), 0);
    c.wait_all();
}

#[test]
fn with_host_refuses_bad_options() {
    let tier = TierOptions { host_slots: 8, ..Default::default() };
    let null = || Arc::new(NullCopier::default());
    let no_pool = CacheOptions { page_size: P, ..Default::default() };
    assert!(matches!(Cache::with_host(no_pool, tier, null()), Err(Error::InvalidArgument(_))));
    let o = CacheOptions { page_size: P, pool_slots: 16, ..Default::default() };
    let odd = TierOptions { host_slots: 6, ..tier };
    assert!(matches!(Cache::with_host(o, odd, null()), Err(Error::InvalidArgument(_))));
}
