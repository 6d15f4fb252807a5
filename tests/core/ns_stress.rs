//! Thousands of short-lived namespaces under 2x-cores threads: each cycle picks an id (a
//! few hot ids shared by every thread, and fresh ones), fills it, and empties it again by
//! eviction or `drop_namespace`, so namespaces are created, reclaimed and re-created under
//! racing inserts, matches and locks all the time. Checks while running that a match never
//! returns another namespace's slots (isolation: every slot is tagged with the namespace
//! that allocated it, and a pinned slot keeps its tag) and that a locked prefix keeps its
//! slots; at quiescence that every slot is back (`free + cached == N`, and in caller-managed
//! mode adopted == freed), that nothing is left once everything is dropped, and that no
//! namespace outlives its pages (`stats().namespaces == 0`, `check_invariants`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use radixkv::{Cache, CacheOptions, Error, EvictionPolicy, InsertOptions, RadixTree, TreeConfig};

use crate::rng;
use rng::Rng;

fn threads() -> usize {
    2 * std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// A namespace's tokens: they encode the id, so a query with one namespace's tokens in
/// another finds nothing unless the tree mixed them up.
fn tokens(ns: u64, fam: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (ns as u32 % 50_000) * 40_000 + fam * 1_000 + i).collect()
}

/// Pool mode: slots allocated, inserted into short-lived namespaces, pinned, evicted and
/// dropped back into the pool.
#[test]
fn short_lived_namespaces_in_a_pooled_cache() {
    for policy in [EvictionPolicy::Lru, EvictionPolicy::Mru, EvictionPolicy::Slru] {
        namespaces_in_a_pooled_cache(policy);
    }
}

fn namespaces_in_a_pooled_cache(policy: EvictionPolicy) {
    let page = 2;
    let pool = 4_096;
    let cycles = if cfg!(debug_assertions) { 2_000 } else { 20_000 };
    let cache = Arc::new(
        Cache::new(CacheOptions {
            page_size: page,
            policy,
            pool_slots: pool,
            ..Default::default()
        })
        .unwrap(),
    );
    // The namespace each slot was allocated for (written by the allocating thread before
    // its insert, so a match that finds the slot cached sees the tag).
    let tags: Arc<Vec<AtomicU64>> = Arc::new((0..pool).map(|_| AtomicU64::new(u64::MAX)).collect());
    let n = threads();
    let hs: Vec<_> = (0..n)
        .map(|t| {
            let (cache, tags) = (cache.clone(), tags.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x51ed_2701 + t as u64 * 7919);
                let mut out: Vec<u32> = Vec::new();
                let mut slots = Vec::new();
                for c in 0..cycles {
                    // Half the cycles on 16 hot ids every thread races on, half on fresh ids.
                    let ns = if rng.below(2) == 0 {
                        rng.below(16)
                    } else {
                        1_000 + (t * cycles + c) as u64
                    };
                    let fam = rng.below(4) as u32;
                    let len = page * (1 + rng.below(8) as usize);
                    let toks = tokens(ns, fam, len);
                    slots.clear();
                    match cache.alloc(len, &mut slots) {
                        Ok(()) => {}
                        Err(Error::OutOfSlots { .. }) => continue, // all pinned by others
                        Err(e) => panic!("alloc: {e}"),
                    }
                    for &s in &slots {
                        tags[s as usize].store(ns, Ordering::Relaxed);
                    }
                    let (_, lock) =
                        cache.insert_and_lock(ns, &toks, &slots, InsertOptions::default()).unwrap();
                    // Pinned: the match sees the whole key, with slots of this namespace.
                    assert_eq!(cache.match_prefix(ns, &toks, &mut out), len);
                    for &s in &out {
                        let tag = tags[s as usize].load(Ordering::Relaxed);
                        assert_eq!(tag, ns, "slot {s} of namespace {tag} matched in {ns}");
                    }
                    let pinned = out.clone();
                    // Another namespace's tokens find nothing here, and this one's nothing
                    // there.
                    let other = ns ^ 1;
                    assert_eq!(cache.match_prefix(ns, &tokens(other, fam, len), &mut out), 0);
                    assert_eq!(cache.match_prefix(other, &toks, &mut out), 0);
                    match rng.below(4) {
                        // Dropped while pinned: the pinned pages stay, with their slots.
                        0 => {
                            cache.drop_namespace(ns, None).unwrap();
                            assert_eq!(cache.match_prefix(ns, &toks, &mut out), len);
                            assert_eq!(out, pinned, "a pinned page changed its slots");
                        }
                        1 => {
                            cache.evict(len, None).unwrap();
                        }
                        _ => {}
                    }
                    drop(lock);
                    if rng.below(3) == 0 {
                        cache.drop_namespace(ns, None).unwrap();
                    }
                    if c % 64 == 0 {
                        cache.reclaim();
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let s = cache.stats();
    cache.tree().check_invariants().unwrap();
    assert_eq!(s.free_slots + s.tree.cached_tokens, s.pool_slots, "{s:?}");
    assert_eq!(s.tree.protected_tokens, 0);
    // Drop every namespace there was: nothing may be left.
    let mut dropped = 0;
    for ns in (0..16).chain(1_000..1_000 + (n * cycles) as u64) {
        dropped += cache.drop_namespace(ns, None).unwrap();
    }
    assert_eq!(dropped as u64, s.tree.cached_tokens);
    let s = cache.stats();
    assert_eq!((s.tree.cached_tokens, s.tree.nodes, s.tree.namespaces), (0, 0, 0), "{s:?}");
    assert_eq!(s.free_slots, s.pool_slots);
    assert_eq!(cache.tree().check_invariants().unwrap().namespaces, 0);
}

/// Caller-managed mode: each thread's slots are its own range; every slot the tree adopts
/// is handed back exactly once, by an eviction or a drop, to whichever thread frees it.
#[test]
fn short_lived_namespaces_in_a_tree() {
    let cycles = if cfg!(debug_assertions) { 3_000 } else { 30_000 };
    let tree = Arc::new(RadixTree::new(TreeConfig { page_size: 1, ..Default::default() }).unwrap());
    let n = threads();
    // How often each slot was adopted minus how often it was freed: 0 or 1 at quiescence.
    let balance: Arc<Vec<AtomicU64>> =
        Arc::new((0..n * cycles * 8).map(|_| AtomicU64::new(0)).collect());
    let adopted = Arc::new(AtomicU64::new(0));
    let freed = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..n)
        .map(|t| {
            let (tree, balance) = (tree.clone(), balance.clone());
            let (adopted, freed) = (adopted.clone(), freed.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x2545_f491 + t as u64 * 131);
                let mut out: Vec<u32> = Vec::new();
                let mut free = |s: &[u32]| {
                    for &x in s {
                        let b = balance[x as usize].fetch_sub(1, Ordering::Relaxed);
                        assert_eq!(b, 1, "slot {x} freed twice or never adopted");
                    }
                    freed.fetch_add(s.len() as u64, Ordering::Relaxed);
                };
                for c in 0..cycles {
                    let ns = rng.below(8 + (c as u64 % 512));
                    let len = 1 + rng.below(8) as usize;
                    let toks = tokens(ns, rng.below(3) as u32, len);
                    // Fresh slots for this cycle: this thread's range, never reused.
                    let base = ((t * cycles + c) * 8) as u32;
                    let slots: Vec<u32> = (base..base + len as u32).collect();
                    // Counted as adopted before the insert (an eviction may free them the
                    // moment it lands); those it did not adopt are taken back after.
                    for &s in &slots {
                        balance[s as usize].fetch_add(1, Ordering::Relaxed);
                    }
                    let e = if rng.below(2) == 0 {
                        tree.insert(ns, &toks, &slots).unwrap()
                    } else {
                        let (e, g) = tree
                            .insert_and_lock(ns, &toks, &slots, InsertOptions::default())
                            .unwrap();
                        assert_eq!(tree.match_prefix(ns, &toks, &mut out), len);
                        if rng.below(2) == 0 {
                            tree.drop_namespace(ns, &mut free);
                            assert_eq!(tree.match_prefix(ns, &toks, &mut out), len);
                        }
                        drop(g);
                        e
                    };
                    for &s in &slots[..e] {
                        balance[s as usize].fetch_sub(1, Ordering::Relaxed);
                    }
                    adopted.fetch_add((len - e) as u64, Ordering::Relaxed);
                    match rng.below(3) {
                        0 => {
                            tree.drop_namespace(ns, &mut free);
                        }
                        1 => {
                            tree.evict(1 + rng.below(8) as usize, &mut free);
                        }
                        _ => {}
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    tree.check_invariants().unwrap();
    let cached = tree.stats().cached_tokens;
    assert_eq!(adopted.load(Ordering::Relaxed), freed.load(Ordering::Relaxed) + cached);
    let mut rest = 0u64;
    tree.evict(usize::MAX, &mut |s| {
        for &x in s {
            assert_eq!(balance[x as usize].fetch_sub(1, Ordering::Relaxed), 1);
        }
        rest += s.len() as u64;
    });
    assert_eq!(rest, cached);
    assert!(balance.iter().all(|b| b.load(Ordering::Relaxed) == 0), "a slot was never freed");
    let s = tree.stats();
    assert_eq!((s.cached_tokens, s.nodes, s.namespaces), (0, 0, 0), "{s:?}");
    assert_eq!(tree.check_invariants().unwrap().namespaces, 0);
}
