//! loom models of the host tier's protocols (`radixkv::tier`, its module docs), included
//! from `tests/loom.rs`: a backup in flight against a device eviction, a load-back against
//! a racing match and a racing load-back of the same prefix, host eviction (direct, and a
//! backup's reserve) against a load-back's pin, the eviction hook against a re-insert
//! of the same page, and a failed backup against a re-insert of its page. Page size 1, a device pool of 2 slots, a host pool of 1 or 2, two
//! threads. Copies go through a `DeferredCopier` over a `HostCopier`, so each copy stays in
//! flight until it is waited on (or polled past its delay), and the models check the bytes
//! that land. Each doc comment names the mutation it fails on (`scripts/loom-mutants`,
//! `docs/loom-mutants.md`).

use std::sync::Arc as StdArc;

use loom::sync::Arc;
use loom::thread;
use radixkv::CacheOptions;
use radixkv::kv::{HostKvStorage, KvLayout, KvStorage};
use radixkv::tier::{
    DeferredCopier, FailPlan, HostCopier, LoadOutcome, TierOptions, TieredCache, WritePolicy,
};
use radixkv::tree::InsertOptions;

use super::model_with;

/// [`super::model`] with room for the tier's longer executions (each tier call takes
/// several locks and many atomic steps) and a preemption bound of at most `bound`. Most run
/// with bound 1: the race each checks needs one preemption (a thread stopped between two
/// steps of a tier call while the other runs whole), and two whole tier calls at bound 2
/// take loom a minute to several (a load-back against a match more than 5). The hook model
/// needs bound 2 to find its mutant. `RADIXKV_LOOM_TIER_BOUND` sets the bound for a longer
/// run by hand (still at most `LOOM_MAX_PREEMPTIONS`).
fn model(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.max_branches = 100_000;
    let env = std::env::var("RADIXKV_LOOM_TIER_BOUND").ok().and_then(|v| v.parse().ok());
    let bound = env.unwrap_or(bound).min(b.preemption_bound.unwrap_or(usize::MAX));
    b.preemption_bound = Some(bound);
    model_with(b, f)
}

/// Token A, the page under test.
const A: u32 = 7;
/// Token B, another page.
const B: u32 = 9;
/// What scribbled slots hold.
const JUNK: u32 = 0xDEAD;

fn layout(slots: usize) -> KvLayout {
    KvLayout::new(1, slots, 1, 1, 4) // one 4-byte K and V per slot
}

/// K and V bytes of token `t`.
fn pattern(t: u32) -> ([u8; 4], [u8; 4]) {
    let x = t.wrapping_mul(2654435761);
    (x.to_le_bytes(), (x ^ 0x5555_5555).to_le_bytes())
}

struct Rig {
    cache: TieredCache,
    dev: StdArc<HostKvStorage>,
}

/// A tier of `dev_slots` device and `host_slots` host slots (page size 1); each copy is
/// held for `delay` polls.
fn rig(dev_slots: usize, host_slots: usize, policy: WritePolicy, delay: u32) -> Rig {
    rig_failing(dev_slots, host_slots, policy, delay, FailPlan::Never)
}

/// [`rig`] whose copier fails the copies `fail` names.
fn rig_failing(
    dev_slots: usize,
    host_slots: usize,
    policy: WritePolicy,
    delay: u32,
    fail: FailPlan,
) -> Rig {
    let dev = StdArc::new(HostKvStorage::new(layout(dev_slots)).unwrap());
    let host = StdArc::new(HostKvStorage::new(layout(host_slots)).unwrap());
    let copier = DeferredCopier::new(HostCopier::new(dev.clone(), host), delay, fail);
    let cache = TieredCache::new(
        CacheOptions { page_size: 1, pool_slots: dev_slots, ..Default::default() },
        TierOptions { host_slots, write_policy: policy, ..Default::default() },
        StdArc::new(copier),
    )
    .unwrap();
    Rig { cache, dev }
}

impl Rig {
    fn write(&self, slot: u32, t: u32) {
        let (k, v) = pattern(t);
        self.dev.write_slot(0, slot, &k, &v).unwrap();
    }

    /// Whether device slot `slot` holds token `t`'s bytes.
    fn holds(&self, slot: u32, t: u32) -> bool {
        let (mut k, mut v) = ([0u8; 4], [0u8; 4]);
        self.dev.read_slot(0, slot, &mut k, &mut v).unwrap();
        (k, v) == pattern(t)
    }

    /// Allocates a slot and writes `t` into it.
    fn slot_for(&self, t: u32) -> u32 {
        let mut s = Vec::new();
        self.cache.alloc(1, &mut s).unwrap();
        self.write(s[0], t);
        s[0]
    }

    /// Allocates a slot, writes `t` into it and inserts `[t]` (the tier backs it up as its
    /// policy says).
    fn put(&self, t: u32) {
        let s = self.slot_for(t);
        self.cache.insert(0, &[t], &[s]).unwrap();
    }

    /// Overwrites every free device slot with junk (so a load-back must really copy).
    fn scribble(&self) {
        let mut s = Vec::new();
        let free = self.cache.stats().device.free_slots as usize;
        self.cache.alloc(free, &mut s).unwrap();
        for &x in &s {
            self.write(x, JUNK);
        }
        self.cache.free(&s).unwrap();
    }

    /// `[A]` backed up, then dropped from the device: host-only, the device slots junk.
    fn host_only_a(&self) {
        self.put(A);
        self.cache.wait_all();
        assert_eq!(self.cache.evict(usize::MAX).unwrap(), 1);
        self.scribble();
        let st = self.cache.stats();
        assert_eq!((st.host_backed_slots, st.host_resident_pages), (1, 0));
    }
}

/// Backup in flight vs device eviction: a `write_through` insert of `[A]` starts its
/// backup (held in flight until `wait_all`) while another thread allocates the whole device
/// pool (which evicts whatever it can) and scribbles over what it got. The backup's device
/// lock keeps A's slot from being evicted and reused before the copy has read it: the
/// allocation fails, or succeeds only after the copy; either way the host copy, loaded
/// back, holds A's bytes, and `check()` passes. Fails with the backup holding no device
/// lock (T1: the copy reads the scribble, and the committed entry names an evicted page).
#[test]
fn tier_backup_in_flight_racing_a_device_eviction() {
    model(1, || {
        let r = Arc::new(rig(2, 2, WritePolicy::WriteThrough, 1000));
        let mut s = Vec::new();
        r.cache.alloc(1, &mut s).unwrap();
        r.write(s[0], A);
        let r2 = r.clone();
        let thief = thread::spawn(move || {
            let mut got = Vec::new();
            if r2.cache.alloc(2, &mut got).is_ok() {
                for &x in &got {
                    r2.write(x, JUNK);
                }
                r2.cache.free(&got).unwrap();
            }
        });
        r.cache.insert(0, &[A], &s).unwrap();
        r.cache.wait_all();
        thief.join().unwrap();
        r.cache.check().unwrap();
        assert_eq!(r.cache.stats().host_backed_slots, 1);
        r.cache.evict(usize::MAX).unwrap();
        r.scribble();
        let t = r.cache.load_back(0, &[A], usize::MAX).unwrap();
        let d = r.cache.wait_load(t).unwrap();
        assert_eq!((d.outcome, d.loaded), (LoadOutcome::Loaded, 1));
        assert!(r.holds(d.slots[0], A), "the host copy does not hold A's bytes");
        r.cache.release(d.lock).unwrap();
        r.cache.check().unwrap();
    });
}

/// Load-back vs a racing match: `[A]` is host-only; one thread loads it back (the copy held
/// until `wait_load`) while another matches `[A]` on the device. The match finds nothing,
/// or the page with its bytes in place: the load-back inserts only after its copy. Fails
/// with the pages inserted before the copy completes (T3).
#[test]
fn tier_load_back_racing_a_match() {
    model(1, || {
        let r = Arc::new(rig(2, 2, WritePolicy::WriteThrough, 1000));
        r.host_only_a();
        let r2 = r.clone();
        let reader = thread::spawn(move || {
            // The device cache's own match (no poll, no host lookup): the fewest steps.
            let mut out = Vec::new();
            let lock = r2.cache.device().match_and_lock(0, &[A], &mut out);
            if lock.len() == 1 {
                assert!(r2.holds(out[0], A), "a match saw a loaded page before its bytes");
            }
            drop(lock);
        });
        let t = r.cache.load_back(0, &[A], usize::MAX).unwrap();
        let d = r.cache.wait_load(t).unwrap();
        assert_eq!((d.outcome, d.loaded), (LoadOutcome::Loaded, 1));
        assert!(r.holds(d.slots[0], A));
        r.cache.release(d.lock).unwrap();
        reader.join().unwrap();
        r.cache.check().unwrap();
        let st = r.cache.stats();
        assert_eq!((st.device.tree.cached_tokens, st.host_resident_pages), (1, 1));
    });
}

/// Two load-backs of the same host-only prefix `[A]` (copies held for one poll, so one
/// thread's poll can finish the other's load-back): both end with a lock on A's one cached
/// slot holding A's bytes; when both copied, exactly one adopted its slot and the other's
/// went back to the pool (one slot cached, one free afterwards), the host entry names the
/// cached page, and `check()` passes. Fails with a losing load-back keeping its own slot
/// instead of the cached one (T4: its lock names a freed slot, the entry a page that is
/// not cached).
#[test]
fn tier_two_load_backs_of_the_same_prefix() {
    model(1, || {
        let r = Arc::new(rig(2, 2, WritePolicy::WriteThrough, 1));
        r.host_only_a();
        let load = |r: &Rig| {
            let t = r.cache.load_back(0, &[A], usize::MAX).unwrap();
            let d = r.cache.wait_load(t).unwrap();
            assert_eq!(d.lock.len(), 1);
            assert!(r.holds(d.slots[0], A), "slot {} does not hold A", d.slots[0]);
            (d.slots[0], d.outcome, d.lock)
        };
        let r2 = r.clone();
        let other = thread::spawn(move || {
            let (s, o, l) = load(&r2);
            r2.cache.release(l).unwrap();
            (s, o)
        });
        let (s1, o1, l1) = load(&r);
        let (s2, o2) = other.join().unwrap();
        // Both hold the one cached slot (the second pinned it before the first released).
        let mut out = Vec::new();
        assert_eq!(r.cache.match_prefix(0, &[A], &mut out).device_len, 1);
        assert_eq!((s1, s2), (out[0], out[0]), "{o1:?} {o2:?}");
        assert!(o1 == LoadOutcome::Loaded || o2 == LoadOutcome::Loaded);
        r.cache.release(l1).unwrap();
        r.cache.wait_all();
        r.cache.check().unwrap();
        let st = r.cache.stats();
        assert_eq!((st.device.tree.cached_tokens, st.device.free_slots), (1, 1));
        assert_eq!((st.host_resident_pages, st.host_pinned_pages), (1, 0));
    });
}

/// Host eviction vs a pin: `[A]` is host-only (the host holds one page) and evictable; one
/// thread loads it back while another evicts everything it can from the host. Either the
/// eviction comes first (A is gone: nothing to load) or the load-back's pin does (the
/// eviction frees nothing, and the loaded page holds A's bytes). Fails with host eviction
/// ignoring pins (T2: the pinned entry goes, its unpin finds it gone).
#[test]
fn tier_host_eviction_racing_a_load_back_pin() {
    model(2, || {
        let r = Arc::new(rig(2, 1, WritePolicy::WriteThrough, 1000));
        r.host_only_a();
        let r2 = r.clone();
        let evictor = thread::spawn(move || r2.cache.evict_host(usize::MAX));
        let t = r.cache.load_back(0, &[A], usize::MAX).unwrap();
        let d = r.cache.wait_load(t).unwrap();
        let evicted = evictor.join().unwrap();
        match d.outcome {
            LoadOutcome::Loaded => {
                assert_eq!((evicted, d.loaded), (0, 1));
                assert!(r.holds(d.slots[0], A));
            }
            o => assert_eq!((o, evicted, d.lock.len()), (LoadOutcome::NothingOnHost, 1, 0)),
        }
        r.cache.release(d.lock).unwrap();
        r.cache.check().unwrap();
    });
}

/// Host eviction by a backup's reserve vs a pin: as above, but the other thread inserts
/// `[B]` (`write_through`), whose backup needs the host's one page and evicts A for it if
/// it may. Either B's backup takes the page first (A is no host hit) or the pin does (B is
/// not backed up, and the load-back brings A's bytes, not B's). Fails with host eviction
/// ignoring pins (T2).
#[test]
fn tier_backup_reserve_racing_a_load_back_pin() {
    model(1, || {
        let r = Arc::new(rig(2, 1, WritePolicy::WriteThrough, 1000));
        r.host_only_a();
        let sb = r.slot_for(B);
        let r2 = r.clone();
        let writer = thread::spawn(move || {
            r2.cache.insert(0, &[B], &[sb]).unwrap();
            r2.cache.wait_all();
        });
        let t = r.cache.load_back(0, &[A], usize::MAX).unwrap();
        let d = r.cache.wait_load(t).unwrap();
        writer.join().unwrap();
        let loaded = d.outcome == LoadOutcome::Loaded;
        if loaded {
            assert!(r.holds(d.slots[0], A), "the load-back brought the wrong bytes");
        } else {
            assert_eq!((d.outcome, d.lock.len()), (LoadOutcome::NothingOnHost, 0));
        }
        r.cache.release(d.lock).unwrap();
        r.cache.check().unwrap();
        // The host's one page holds A (the pin came first) or B (B's backup did).
        r.cache.evict(usize::MAX).unwrap();
        let mut out = Vec::new();
        let a = r.cache.match_prefix(0, &[A], &mut out).host_len;
        let b = r.cache.match_prefix(0, &[B], &mut out).host_len;
        assert_eq!((a, b), if loaded { (1, 0) } else { (0, 1) });
    });
}

/// The eviction hook vs a re-insert of the same page: `[A]` is on the device and backed up
/// (its host entry resident); one thread evicts the device while another inserts `[A]`
/// again from a fresh slot and keeps it pinned. The re-insert can land between the
/// eviction unlinking A's old page and the hook telling the host index; the hook then must
/// leave the entry resident on the new page. Afterwards A is on the device (pinned) and its
/// host entry is resident (not evictable); once released and evicted, host-only. Fails with
/// the hook clearing the entry's device page without comparing it with the evicted one (T5;
/// found at bound 2 only: the reinsert's window needs two preemptions).
#[test]
fn tier_eviction_hook_racing_a_reinsert_of_the_page() {
    model(2, || {
        let r = Arc::new(rig(2, 2, WritePolicy::WriteThrough, 0));
        r.put(A);
        r.cache.wait_all();
        let s = r.slot_for(A);
        let r2 = r.clone();
        let evictor = thread::spawn(move || {
            r2.cache.evict(usize::MAX).unwrap();
        });
        let (_, lock) = r.cache.insert_and_lock(0, &[A], &[s], InsertOptions::default()).unwrap();
        evictor.join().unwrap();
        let mut out = Vec::new();
        assert_eq!(r.cache.match_prefix(0, &[A], &mut out).device_len, 1);
        assert!(r.holds(out[0], A));
        let st = r.cache.stats();
        assert_eq!(st.host_backed_slots, 1);
        assert_eq!(
            (st.host_resident_pages, st.host_evictable_pages),
            (1, 0),
            "A is on the device, its host entry not resident"
        );
        r.cache.release(lock).unwrap();
        r.cache.check().unwrap();
        r.cache.evict(usize::MAX).unwrap();
        let st = r.cache.stats();
        assert_eq!((st.host_resident_pages, st.host_evictable_pages), (0, 1));
        r.cache.check().unwrap();
    });
}

/// A failed backup vs a re-insert of its page (issue 30, section 5, item 1): a
/// `write_through` insert of `[A]` starts its backup, which fails (every copy of this rig
/// fails), while another thread caches `[A]` again from a fresh slot and finds the entry
/// still writing (marking it resident, its device page `BACKED`), or finds no entry once
/// the abort removed it (and starts a backup of its own, which fails too). Whatever the
/// order, no device page is left `BACKED` without a host entry naming it (`check()`), and
/// nothing is left backed up. Fails with the abort removing the entry without clearing
/// `BACKED` of the page it named (T6).
#[test]
fn tier_failed_backup_racing_a_reinsert_of_the_page() {
    model(1, || {
        let r = Arc::new(rig_failing(2, 2, WritePolicy::WriteThrough, 1000, FailPlan::Every(1)));
        r.put(A);
        let r2 = r.clone();
        let reinsert = thread::spawn(move || {
            let s = r2.slot_for(A);
            r2.cache.insert(0, &[A], &[s]).unwrap();
        });
        r.cache.wait_all();
        reinsert.join().unwrap();
        r.cache.wait_all();
        r.cache.check().unwrap();
        let st = r.cache.stats();
        assert!(st.copy_failures >= 1, "{st:?}");
        assert_eq!((st.host_backed_slots, st.host_resident_pages), (0, 0), "{st:?}");
        let mut out = Vec::new();
        assert_eq!(r.cache.match_prefix(0, &[A], &mut out).device_len, 1);
    });
}
