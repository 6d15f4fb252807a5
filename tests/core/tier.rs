//! The host tier ([`radixkv::tier`]): write policies, device eviction to host-only,
//! load-back with the bytes that were backed up, host eviction of host-only leaves, copy
//! failures rolled back, bad input refused.

use std::sync::Arc;

use radixkv::kv::{HostKvStorage, KvLayout, KvStorage};
use radixkv::tier::{
    DeferredCopier, FailPlan, HostCopier, LoadOutcome, TierCopier, TierOptions, TieredCache,
    WritePolicy,
};
use radixkv::{CacheOptions, Error};

const P: usize = 4;

/// A fake KV pattern for token `t` at layer `l` (K and V differ).
fn pattern(t: u32, l: usize, v: bool) -> Vec<u8> {
    let x = t.wrapping_mul(2654435761).wrapping_add(l as u32 * 7 + v as u32);
    x.to_le_bytes().repeat(2)
}

fn layout(slots: usize) -> KvLayout {
    KvLayout::new(2, slots, 1, 2, 4) // 8-byte slots
}

struct Rig {
    cache: TieredCache,
    dev: Arc<HostKvStorage>,
}

fn rig_with(
    dev_slots: usize,
    host_slots: usize,
    policy: WritePolicy,
    wrap: impl FnOnce(HostCopier) -> Arc<dyn TierCopier>,
) -> Rig {
    let dev = Arc::new(HostKvStorage::new(layout(dev_slots)).unwrap());
    let host = Arc::new(HostKvStorage::new(layout(host_slots)).unwrap());
    let copier = wrap(HostCopier::new(dev.clone(), host));
    let cache = TieredCache::new(
        CacheOptions { page_size: P, pool_slots: dev_slots, ..Default::default() },
        TierOptions { host_slots, write_policy: policy, ..Default::default() },
        copier,
    )
    .unwrap();
    Rig { cache, dev }
}

fn rig(dev_slots: usize, host_slots: usize, policy: WritePolicy) -> Rig {
    rig_with(dev_slots, host_slots, policy, |c| Arc::new(c))
}

impl Rig {
    /// The request cycle: match, allocate the rest, write the pattern, insert, release.
    fn request(&self, tokens: &[u32]) -> usize {
        let mut slots = Vec::new();
        let (lock, m) = self.cache.match_and_lock(0, tokens, &mut slots);
        let need = tokens.len() - m.device_len;
        let mut fresh = Vec::new();
        self.cache.alloc(need, &mut fresh).unwrap();
        for (i, &s) in fresh.iter().enumerate() {
            self.write(s, tokens[m.device_len + i]);
        }
        slots.extend_from_slice(&fresh);
        self.cache.insert(0, tokens, &slots).unwrap();
        self.cache.release(lock).unwrap();
        m.device_len
    }

    fn write(&self, slot: u32, t: u32) {
        for l in 0..2 {
            self.dev.write_slot(l, slot, &pattern(t, l, false), &pattern(t, l, true)).unwrap();
        }
    }

    fn assert_bytes(&self, slots: &[u32], tokens: &[u32]) {
        let (mut k, mut v) = (vec![0u8; 8], vec![0u8; 8]);
        for (&s, &t) in slots.iter().zip(tokens) {
            for l in 0..2 {
                self.dev.read_slot(l, s, &mut k, &mut v).unwrap();
                assert_eq!(k, pattern(t, l, false), "slot {s} token {t} layer {l} K");
                assert_eq!(v, pattern(t, l, true), "slot {s} token {t} layer {l} V");
            }
        }
    }
}

fn key(start: u32, n: usize) -> Vec<u32> {
    (start..start + n as u32).collect()
}

#[test]
fn write_through_backs_up_on_insert_and_loads_back_the_same_bytes() {
    let r = rig(32, 64, WritePolicy::WriteThrough);
    let a = key(100, 16);
    r.request(&a);
    r.cache.wait_all();
    let st = r.cache.stats();
    assert_eq!(st.host_backed_slots, 16);
    assert_eq!(st.host_resident_pages, 4);
    assert_eq!(st.tokens_to_host, 16);
    r.cache.check().unwrap();
    // The device lets it go: the host copy stays, host-only.
    assert_eq!(r.cache.evict(usize::MAX).unwrap(), 16);
    let st = r.cache.stats();
    assert_eq!(st.device.tree.cached_tokens, 0);
    assert_eq!(st.host_backed_slots, 16);
    assert_eq!(st.host_resident_pages, 0);
    // Scribble over the freed device slots so a load-back must really copy.
    let mut junk = Vec::new();
    r.cache.alloc(32, &mut junk).unwrap();
    for &s in &junk {
        r.write(s, 0xDEAD);
    }
    r.cache.free(&junk).unwrap();
    let mut out = Vec::new();
    let m = r.cache.match_prefix(0, &a, &mut out);
    assert_eq!((m.device_len, m.host_len), (0, 16));
    let t = r.cache.load_back(0, &a, usize::MAX).unwrap();
    let done = r.cache.wait_load(t).unwrap();
    assert_eq!(done.outcome, LoadOutcome::Loaded);
    assert_eq!((done.device_len, done.loaded, done.lock.len()), (0, 16, 16));
    r.assert_bytes(&done.slots, &a);
    r.cache.release(done.lock).unwrap();
    let m = r.cache.match_prefix(0, &a, &mut out);
    assert_eq!((m.device_len, m.host_len), (16, 0));
    assert_eq!(r.cache.stats().host_resident_pages, 4);
    r.cache.check().unwrap();
}

#[test]
fn selective_backs_up_at_the_second_hit() {
    let r = rig(64, 64, WritePolicy::WriteThroughSelective);
    let a = key(0, 8);
    r.request(&a);
    r.cache.wait_all();
    assert_eq!(r.cache.stats().host_backed_slots, 0);
    let mut b = a.clone();
    b.extend(key(500, 4));
    r.request(&b); // reaches a's two pages a second time
    r.cache.wait_all();
    let st = r.cache.stats();
    assert_eq!(st.host_backed_slots, 8, "{st:?}");
    r.cache.check().unwrap();
}

#[test]
fn write_back_copies_only_at_eviction() {
    let r = rig(32, 64, WritePolicy::WriteBack);
    let a = key(7, 12);
    r.request(&a);
    r.cache.wait_all();
    assert_eq!(r.cache.stats().host_backed_slots, 0);
    r.cache.evict(usize::MAX).unwrap();
    let st = r.cache.stats();
    assert_eq!((st.host_backed_slots, st.tokens_written_back), (12, 12));
    let t = r.cache.load_back(0, &a, usize::MAX).unwrap();
    let done = r.cache.wait_load(t).unwrap();
    assert_eq!(done.loaded, 12);
    r.assert_bytes(&done.slots, &a);
    r.cache.release(done.lock).unwrap();
    r.cache.check().unwrap();
}

#[test]
fn a_backup_in_flight_pins_the_device_pages_until_it_completes() {
    let r = rig_with(16, 64, WritePolicy::WriteThrough, |c| {
        Arc::new(DeferredCopier::new(c, 3, FailPlan::Never))
    });
    let a = key(1, 16);
    r.request(&a);
    let st = r.cache.stats();
    assert_eq!(st.in_flight, 1);
    // Pinned by the backup: nothing to evict, and the entries are no host hit yet.
    assert_eq!(r.cache.evict(usize::MAX).unwrap(), 0);
    let mut out = Vec::new();
    assert_eq!(r.cache.match_prefix(0, &a, &mut out).device_len, 16);
    r.cache.wait_all();
    assert_eq!(r.cache.evict(usize::MAX).unwrap(), 16);
    assert_eq!(r.cache.stats().host_backed_slots, 16);
    r.cache.check().unwrap();
}

#[test]
fn a_failed_backup_rolls_back_and_a_failed_load_back_too() {
    let r = rig_with(16, 64, WritePolicy::WriteThrough, |c| {
        Arc::new(DeferredCopier::new(c, 0, FailPlan::Every(2)))
    });
    let a = key(1, 8);
    r.request(&a); // copy 1 succeeds
    let b = key(50, 8);
    r.request(&b); // copy 2 fails
    r.cache.wait_all();
    let st = r.cache.stats();
    assert_eq!((st.host_backed_slots, st.copy_failures), (8, 1));
    r.cache.check().unwrap();
    r.cache.evict(usize::MAX).unwrap();
    assert_eq!(r.cache.stats().device.free_slots, 16);
    // Load-back of `a`: copy 3 succeeds; evict again; copy 4 fails.
    let t = r.cache.load_back(0, &a, usize::MAX).unwrap();
    let d = r.cache.wait_load(t).unwrap();
    assert_eq!(d.loaded, 8);
    r.cache.release(d.lock).unwrap();
    r.cache.evict(usize::MAX).unwrap();
    let t = r.cache.load_back(0, &a, usize::MAX).unwrap();
    assert!(matches!(r.cache.wait_load(t), Err(Error::Device(_))));
    let st = r.cache.stats();
    assert_eq!(st.device.free_slots, 16, "the load-back's slots went back: {st:?}");
    assert_eq!(st.device.tree.cached_tokens, 0, "nothing was inserted without its bytes");
    assert_eq!(st.host_pinned_pages, 0);
    r.cache.check().unwrap();
}

#[test]
fn host_eviction_takes_host_only_leaves_and_never_a_device_resident_copy() {
    // Host of 8 slots (2 pages); device of 16.
    let r = rig(16, 8, WritePolicy::WriteThrough);
    let a = key(0, 8);
    r.request(&a);
    r.cache.wait_all();
    assert_eq!(r.cache.stats().host_free_slots, 0);
    // b's backup finds the host full of a's resident copies: none may go, so b is skipped.
    let b = key(100, 8);
    r.request(&b);
    r.cache.wait_all();
    let st = r.cache.stats();
    assert_eq!((st.host_backed_slots, st.host_resident_pages), (8, 2));
    assert_eq!(r.cache.evict_host(usize::MAX), 0, "resident copies are not evictable");
    // Device evicts everything: a's copies are host-only now; b had none.
    r.cache.evict(usize::MAX).unwrap();
    assert_eq!(r.cache.stats().host_evictable_pages, 1, "only the leaf page");
    assert_eq!(r.cache.evict_host(4), 4);
    let mut out = Vec::new();
    assert_eq!(r.cache.match_prefix(0, &a, &mut out).host_len, 4, "the parent page stays");
    r.cache.check().unwrap();
}

#[test]
fn too_short_load_backs_are_skipped_and_say_so() {
    let dev = Arc::new(HostKvStorage::new(layout(32)).unwrap());
    let host = Arc::new(HostKvStorage::new(layout(32)).unwrap());
    let cache = TieredCache::new(
        CacheOptions { page_size: P, pool_slots: 32, ..Default::default() },
        TierOptions {
            host_slots: 32,
            write_policy: WritePolicy::WriteThrough,
            load_back_min: 12,
            ..Default::default()
        },
        Arc::new(HostCopier::new(dev, host)),
    )
    .unwrap();
    let a = key(0, 8);
    let mut s = Vec::new();
    cache.alloc(8, &mut s).unwrap();
    cache.insert(0, &a, &s).unwrap();
    cache.wait_all();
    cache.evict(usize::MAX).unwrap();
    let t = cache.load_back(0, &a, usize::MAX).unwrap();
    let d = cache.wait_load(t).unwrap();
    assert_eq!((d.outcome, d.loaded, d.lock.len()), (LoadOutcome::TooShort, 0, 0));
    cache.release(d.lock).unwrap();
    assert_eq!(cache.stats().load_backs_skipped, 1);
    cache.check().unwrap();
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let r = rig(32, 32, WritePolicy::WriteThrough);
    let mut s = Vec::new();
    r.cache.alloc(8, &mut s).unwrap();
    let before = r.cache.stats();
    // Pages not one whole pool page.
    let shifted: Vec<u32> = s.iter().map(|x| x + 1).collect();
    assert!(matches!(r.cache.insert(0, &key(0, 8), &shifted), Err(Error::InvalidArgument(_))));
    let mut swapped = s.clone();
    swapped.swap(0, 1);
    assert!(matches!(r.cache.insert(0, &key(0, 8), &swapped), Err(Error::InvalidArgument(_))));
    assert!(matches!(r.cache.insert(0, &key(0, 7), &s), Err(Error::InvalidArgument(_))));
    assert_eq!(r.cache.stats(), before);
    r.cache.free(&s).unwrap();
    // Bad options.
    let c = || Arc::new(radixkv::tier::NullCopier::default()) as Arc<dyn TierCopier>;
    let dev = CacheOptions { page_size: 4, pool_slots: 16, ..Default::default() };
    for t in [
        TierOptions { host_slots: 0, ..Default::default() },
        TierOptions { host_slots: 6, ..Default::default() },
        TierOptions { host_slots: 8, write_threshold: 0, ..Default::default() },
    ] {
        assert!(matches!(TieredCache::new(dev, t, c()), Err(Error::InvalidArgument(_))), "{t:?}");
    }
    let no_pool = CacheOptions { page_size: 4, pool_slots: 0, ..Default::default() };
    assert!(
        TieredCache::new(no_pool, TierOptions { host_slots: 8, ..Default::default() }, c())
            .is_err()
    );
    // Unknown load ticket.
    assert!(matches!(
        r.cache.wait_load(radixkv::tier::LoadTicket(999)),
        Err(Error::InvalidArgument(_))
    ));
    assert!(WritePolicy::parse("write_sometimes").is_err());
    assert_eq!(WritePolicy::parse("write-back").unwrap(), WritePolicy::WriteBack);
    r.cache.check().unwrap();
}

#[test]
fn events_publish_host_copies_as_cpu_pinned() {
    use radixkv::events::{KvEvent, Medium};
    let dev = Arc::new(HostKvStorage::new(layout(16)).unwrap());
    let host = Arc::new(HostKvStorage::new(layout(16)).unwrap());
    let mut cache = TieredCache::new(
        CacheOptions { page_size: P, pool_slots: 16, ..Default::default() },
        TierOptions {
            host_slots: 16,
            write_policy: WritePolicy::WriteThrough,
            ..Default::default()
        },
        Arc::new(HostCopier::new(dev, host)),
    )
    .unwrap();
    cache.enable_events(Default::default()).unwrap();
    let a = key(1, 8);
    let mut s = Vec::new();
    cache.alloc(8, &mut s).unwrap();
    cache.insert(0, &a, &s).unwrap();
    cache.wait_all();
    cache.evict(usize::MAX).unwrap();
    cache.evict_host(usize::MAX);
    cache.device().flush_events();
    let evs: Vec<KvEvent> =
        cache.device().drain_events().into_iter().flat_map(|(_, b)| b.events).collect();
    let media: Vec<(&str, Medium, usize)> = evs
        .iter()
        .map(|e| match e {
            KvEvent::BlockStored { medium, block_hashes, .. } => {
                ("stored", *medium, block_hashes.len())
            }
            KvEvent::BlockRemoved { medium, block_hashes } => {
                ("removed", *medium, block_hashes.len())
            }
            KvEvent::AllBlocksCleared => ("cleared", Medium::Gpu, 0),
        })
        .collect();
    assert_eq!(
        media,
        vec![
            ("stored", Medium::Gpu, 2),
            ("stored", Medium::CpuPinned, 2),
            ("removed", Medium::Gpu, 2),
            ("removed", Medium::CpuPinned, 2),
        ]
    );
    // Same hashes on both media.
    let hashes = |i: usize| match &evs[i] {
        KvEvent::BlockStored { block_hashes, .. } | KvEvent::BlockRemoved { block_hashes, .. } => {
            let mut h = block_hashes.clone();
            h.sort();
            h
        }
        _ => vec![],
    };
    assert_eq!(hashes(0), hashes(1));
    assert_eq!(hashes(2), hashes(3));
}

#[test]
fn insert_and_lock_keeps_the_callers_pin_whatever_the_backup_does() {
    for delay in [0, 2] {
        let r = rig_with(16, 64, WritePolicy::WriteThrough, |c| {
            Arc::new(DeferredCopier::new(c, delay, FailPlan::Never))
        });
        let a = key(1, 12);
        let mut s = Vec::new();
        r.cache.alloc(12, &mut s).unwrap();
        let (existing, lock) = r.cache.insert_and_lock(0, &a, &s, Default::default()).unwrap();
        assert_eq!((existing, lock.len()), (0, 12));
        r.cache.wait_all();
        // The backup is done and released its pin; the caller's still holds every page.
        assert_eq!(r.cache.evict(usize::MAX).unwrap(), 0, "delay {delay}");
        r.cache.release(lock).unwrap();
        assert_eq!(r.cache.evict(usize::MAX).unwrap(), 12);
        assert_eq!(r.cache.stats().host_backed_slots, 12);
        r.cache.check().unwrap();
    }
}
