//! Many threads running whole request cycles (admit, extend, checkpoint, finish or abort,
//! plus explicit evictions) on one pooled cache small enough to evict all the time.
//! Checks that no slot is ever held by two requests at once, that every request sees the
//! slots of its cached prefix unchanged while it runs, and at quiescence that
//! `free + cached == N` (nothing held) with the tree's counters equal to a walk of it. A
//! third of the cycles pass slots as runs end to end (`match_and_lock_runs`, `alloc_runs`,
//! `insert_runs`, `free_runs`) instead of the `Request` API.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use radixkv::tree::InsertOptions;
use radixkv::{Cache, CacheOptions, Error, EvictionPolicy, Request, SlotRun};

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

/// The slots a request holds (not cached by the tree for it).
fn held<'a>(r: &'a Request<'_>) -> &'a [u32] {
    &r.slots()[r.locked_len()..]
}

use crate::rng;
use rng::Rng;

fn run(page: usize, pool: usize, threads: usize, cycles: usize, policy: EvictionPolicy) {
    let cache = Arc::new(
        Cache::new(CacheOptions {
            page_size: page,
            policy,
            pool_slots: pool,
            ..Default::default()
        })
        .unwrap(),
    );
    let owners = Arc::new(Owners((0..pool).map(|_| AtomicU32::new(0)).collect()));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let cache = cache.clone();
            let owners = owners.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9 + t as u64 * 31);
                let mut out: Vec<u32> = Vec::new();
                for c in 0..cycles {
                    let who = (t * cycles + c + 1) as u32;
                    let ns = rng.below(3);
                    let fam = rng.below(5) as u32;
                    let len = 1 + rng.below(96) as usize;
                    let fork = rng.below(len as u64) as usize;
                    let prompt: Vec<u32> = (0..len as u32)
                        .map(|i| {
                            if (i as usize) < fork {
                                fam * 10_000 + i
                            } else {
                                fam * 10_000 + 5_000 + t as u32 * 97 + i
                            }
                        })
                        .collect();
                    // Priorities from -2 to 2 (the `priority` policy reads them).
                    let priority = rng.below(5) as i32 - 2;
                    if rng.below(3) == 0 {
                        let finish = rng.below(8) != 0;
                        runs_cycle(&cache, &owners, who, ns, &prompt, finish, page, priority);
                        continue;
                    }
                    let mut r = match cache.admit_with_priority(ns, &prompt, priority) {
                        Ok(r) => r,
                        Err(Error::OutOfSlots { .. }) => continue, // everything pinned by others
                        Err(e) => panic!("admit: {e}"),
                    };
                    owners.claim(who, held(&r));
                    // The cached prefix it got is really cached with those slots.
                    let prefix = r.slots()[..r.cached_len()].to_vec();
                    let m = cache.match_prefix(ns, &prompt, &mut out);
                    assert!(m >= prefix.len(), "a pinned prefix went away");
                    assert_eq!(out[..prefix.len()], prefix[..]);
                    // Decode a few tokens, sometimes checkpointing.
                    let steps = rng.below(3);
                    let mut ok = true;
                    for step in 0..steps {
                        owners.unclaim(who, held(&r));
                        let before = r.len();
                        let res =
                            r.extend(&[900_000 + t as u32 * 1000 + c as u32 % 1000, step as u32]);
                        owners.claim(who, held(&r));
                        match res {
                            Ok(()) => assert_eq!(r.len(), before + 2),
                            Err(Error::OutOfSlots { .. }) => {
                                ok = false;
                                break;
                            }
                            Err(e) => panic!("extend: {e}"),
                        }
                        if rng.below(2) == 0 {
                            owners.unclaim(who, held(&r));
                            r.checkpoint().unwrap();
                            owners.claim(who, held(&r));
                        }
                    }
                    owners.unclaim(who, held(&r));
                    if ok && rng.below(8) != 0 {
                        r.finish().unwrap();
                    } else {
                        r.abort();
                    }
                    if rng.below(10) == 0 {
                        cache.evict(1 + rng.below(64) as usize, None).unwrap();
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let s = cache.stats();
    let census = cache.tree().check_invariants().unwrap();
    assert_eq!(s.tree.protected_tokens, 0);
    assert_eq!(census.cached_tokens, s.tree.cached_tokens);
    assert_eq!(s.free_slots + s.tree.cached_tokens, pool as u64, "slots lost: {s:?}");
    assert!(s.tree.evicted_tokens > 0, "the pool was meant to force eviction");
    cache.reset(None).unwrap();
    let s = cache.stats();
    assert_eq!((s.free_slots, s.tree.cached_tokens), (pool as u64, 0));
    // Every page is whole again: the whole pool can be allocated at once.
    let mut all = Vec::new();
    cache.alloc(pool, &mut all).unwrap();
    all.sort();
    assert_eq!(all, (0..pool as u32).collect::<Vec<_>>());
}

/// One request with slots as runs end to end: pin the cached prefix, allocate the rest as
/// runs, then insert the prompt (`finish`) or give the slots back.
#[allow(clippy::too_many_arguments)]
fn runs_cycle(
    cache: &Cache,
    owners: &Owners,
    who: u32,
    ns: u64,
    prompt: &[u32],
    finish: bool,
    page: usize,
    priority: i32,
) {
    let mut runs = Vec::new();
    let lock = cache.match_and_lock(ns, prompt, &mut runs);
    let m = lock.len();
    let need = (prompt.len() - m).div_ceil(page) * page;
    match cache.alloc_runs(need, &mut runs) {
        Ok(()) => {}
        Err(Error::OutOfSlots { .. }) => return, // everything pinned by others
        Err(e) => panic!("alloc_runs: {e}"),
    }
    let all: Vec<u32> = runs.iter().flat_map(|r| r.slots()).collect();
    assert_eq!(all.len(), m + need);
    owners.claim(who, &all[m..]);
    // The pinned prefix is still cached with the slots the match returned.
    let mut out: Vec<u32> = Vec::new();
    assert!(cache.match_prefix(ns, prompt, &mut out) >= m, "a pinned prefix went away");
    assert_eq!(out[..m], all[..m]);
    owners.unclaim(who, &all[m..]);
    let runs_of = |s: &[u32]| {
        let mut r = Vec::new();
        SlotRun::push_runs_of(s, &mut r);
        r
    };
    if finish {
        // The insert adopts or frees the prompt's slots; the page-rounding spare is ours.
        let opts = InsertOptions::with_priority(priority);
        cache.insert_with(ns, prompt, &runs_of(&all[..prompt.len()]), opts).unwrap();
        if all.len() > prompt.len() {
            cache.free_runs(&runs_of(&all[prompt.len()..])).unwrap();
        }
    } else {
        cache.free_runs(&runs_of(&all[m..])).unwrap();
    }
    drop(lock);
}

fn threads() -> usize {
    (2 * std::thread::available_parallelism().map_or(2, |n| n.get())).max(4)
}

fn cycles() -> usize {
    if cfg!(debug_assertions) { 400 } else { 30_000 }
}

#[test]
fn request_cycles_page_1() {
    run(1, 2_048, threads(), cycles(), EvictionPolicy::Lru);
}

#[test]
fn request_cycles_page_4() {
    run(4, 4_096, threads(), cycles(), EvictionPolicy::Lru);
}

// Every other policy, at one page size each (the same checks: no slot held twice, pinned
// prefixes keep their slots, and at quiescence free + cached == N, cached == evictable +
// protected, every unpinned leaf queued).

#[test]
fn request_cycles_page_1_lfu() {
    run(1, 2_048, threads(), cycles(), EvictionPolicy::Lfu);
}

#[test]
fn request_cycles_page_4_fifo() {
    run(4, 4_096, threads(), cycles(), EvictionPolicy::Fifo);
}

#[test]
fn request_cycles_page_1_mru() {
    run(1, 2_048, threads(), cycles(), EvictionPolicy::Mru);
}

#[test]
fn request_cycles_page_4_mru() {
    run(4, 4_096, threads(), cycles(), EvictionPolicy::Mru);
}

#[test]
fn request_cycles_page_1_filo() {
    run(1, 2_048, threads(), cycles(), EvictionPolicy::Filo);
}

#[test]
fn request_cycles_page_4_priority() {
    run(4, 4_096, threads(), cycles(), EvictionPolicy::Priority);
}

#[test]
fn request_cycles_page_1_slru() {
    run(1, 2_048, threads(), cycles(), EvictionPolicy::Slru);
}

#[test]
fn request_cycles_page_16() {
    run(16, 8_192, threads(), cycles(), EvictionPolicy::Lru);
}
