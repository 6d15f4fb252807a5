//! The sliding-window (SWA) component of the lock-free tree (`src/tree/swa.rs`): its rules
//! on small trees, a property test against a sequential model (pages with their full KV,
//! SWA KV and both kinds of pins), and a multi-threaded stress test that checks, in the
//! free callbacks, that no pinned KV is ever freed and, at the end, that every slot's full
//! and SWA KV were each freed exactly once.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use proptest::prelude::*;
use radixkv::{EvictTarget, EvictionPolicy, Freed, PrefixLock, RadixTree, TreeConfig};

use crate::rng::Rng;

fn swa_tree(page: usize, window: usize) -> RadixTree {
    RadixTree::new(TreeConfig {
        page_size: page,
        policy: EvictionPolicy::Lru,
        swa_window: window,
        ..Default::default()
    })
    .unwrap()
}

/// Every `(Freed, slots)` an `evict_kv` call handed over.
fn evict(t: &RadixTree, target: EvictTarget, k: usize) -> (usize, Vec<(Freed, Vec<u32>)>) {
    let mut got = Vec::new();
    let n = t.evict_kv(target, k, &mut |f, s| got.push((f, s.to_vec())));
    (n, got)
}

const FULL_SWA: Freed = Freed { full: true, swa: true };
const FULL_ONLY: Freed = Freed { full: true, swa: false };
const SWA_ONLY: Freed = Freed { full: false, swa: true };

/// Three nodes, X = [1..5) under the root with children Y = [5..9) and Z = [20..24); a lock
/// on each leaf's window, so the only SWA candidate is X.
#[test]
fn a_tombstone_makes_matches_that_end_near_it_invalid() {
    let t = swa_tree(1, 4);
    let a: Vec<u32> = (1..9).collect();
    let b: Vec<u32> = [1, 2, 3, 4, 20, 21, 22, 23].to_vec();
    assert_eq!(t.insert(0, &a, &(100..108).collect::<Vec<u32>>()).unwrap(), 0);
    assert_eq!(t.insert(0, &b, &[0, 0, 0, 0, 200, 201, 202, 203]).unwrap(), 4);
    let mut out: Vec<u32> = Vec::new();
    let la = t.match_and_lock(0, &a[..], &mut out).into_raw();
    assert_eq!((la.len(), la.swa_from()), (8, Some(4)), "the window segment is Y alone");
    let lb = t.match_and_lock(0, &b[..], &mut out).into_raw();
    assert_eq!((lb.len(), lb.swa_from()), (8, Some(4)));
    assert_eq!(t.stats().swa_cached_tokens, 12);
    // X is pinned (full) but not in a window: SWA eviction makes it a tombstone.
    let (n, got) = evict(&t, EvictTarget::Swa, 1);
    assert_eq!((n, got), (4, vec![(SWA_ONLY, vec![100, 101, 102, 103])]));
    assert_eq!(t.stats().swa_cached_tokens, 8);
    assert_eq!(t.stats().cached_tokens, 12, "a tombstone keeps its full KV");
    // Nothing else can go: Y and Z are in windows.
    assert_eq!(evict(&t, EvictTarget::Swa, 100).0, 0);
    t.check_invariants().unwrap();
    // A match ending in or right after the tombstone is not valid; one whose last 4 tokens
    // are past it is.
    assert_eq!(t.match_prefix(0, &a[..4], &mut out), 0);
    assert_eq!(t.match_prefix(0, &a[..6], &mut out), 0, "2 tokens past the tombstone");
    assert_eq!(t.match_prefix(0, &a, &mut out), 8);
    assert_eq!(out, (100..108).collect::<Vec<u32>>(), "the full KV of the tombstone is a hit");
    // A locking match too: nothing valid is nothing locked.
    let l0 = t.match_and_lock(0, &a[..6], &mut out).into_raw();
    assert_eq!((l0.len(), out.len()), (0, 0));
    t.release(l0).unwrap();
    t.release(la).unwrap();
    t.release(lb).unwrap();
    t.check_invariants().unwrap();
    // Y was split in two by the locking match of 6 tokens (which split where its match
    // ended before finding it invalid, as SGLang's match does). Its upper half, which no
    // window refreshed since, is the least recent SWA KV: a tombstone. Then the leaves go
    // whole (full and SWA KV), and the tombstones left leaves, their full KV.
    let (n, mut got) = evict(&t, EvictTarget::Swa, 8);
    assert_eq!(n, 8, "SWA tokens freed");
    got.sort();
    assert_eq!(
        got,
        vec![
            (SWA_ONLY, vec![104, 105]),
            (FULL_ONLY, vec![100, 101, 102, 103]),
            (FULL_ONLY, vec![104, 105]),
            (FULL_SWA, vec![106, 107]),
            (FULL_SWA, vec![200, 201, 202, 203]),
        ]
    );
    let st = t.stats();
    assert_eq!((st.cached_tokens, st.swa_cached_tokens, st.namespaces), (0, 0, 0));
    t.check_invariants().unwrap();
}

#[test]
fn a_path_shorter_than_the_window_is_valid_until_a_tombstone() {
    let t = swa_tree(2, 16);
    let a: Vec<u32> = (1..9).collect();
    t.insert(0, &a, &(10..18).collect::<Vec<u32>>()).unwrap();
    t.insert(0, &[1, 2, 3, 4, 7, 7], &[0, 0, 0, 0, 30, 31]).unwrap();
    let mut out: Vec<u32> = Vec::new();
    assert_eq!(t.match_prefix(0, &a, &mut out), 8, "no tombstone: valid from the root");
    let l = t.match_and_lock(0, &a, &mut out).into_raw();
    assert_eq!((l.len(), l.swa_from()), (8, Some(0)), "the whole path is the window");
    // Every node is in the lock's window but the other leaf, which goes whole.
    assert_eq!(evict(&t, EvictTarget::Swa, 100), (2, vec![(FULL_SWA, vec![30, 31])]));
    t.release(l).unwrap();
    // Full eviction says each leaf still had its SWA KV.
    let (n, got) = evict(&t, EvictTarget::Full, 1);
    assert_eq!((n, got), (4, vec![(FULL_SWA, vec![14, 15, 16, 17])]));
    t.check_invariants().unwrap();
}

#[test]
fn window_locks_keep_the_swa_kv_and_insert_and_lock_skips_tombstones() {
    let t = swa_tree(1, 2);
    let a: Vec<u32> = vec![1, 2, 3, 4];
    t.insert(0, &a, &[10, 11, 12, 13]).unwrap();
    let mut out: Vec<u32> = Vec::new();
    let l = t.match_and_lock(0, &a, &mut out).into_raw();
    assert_eq!(evict(&t, EvictTarget::Swa, 100).0, 0, "the window lock holds it");
    assert_eq!(evict(&t, EvictTarget::Full, 100).0, 0);
    // A fork makes [1, 2, 3, 4] an inner node: with the lock gone it can be a tombstone.
    let (e, l2) = t
        .insert_and_lock(0, &[1, 2, 3, 4, 5], &[0, 0, 0, 0, 14], Default::default())
        .map(|(e, g)| (e, g.into_raw()))
        .unwrap();
    assert_eq!((e, l2.swa_from()), (4, Some(0)), "the window: the new leaf and its parent");
    t.release(l).unwrap();
    t.insert(0, &[1, 2, 3, 4, 6], &[0, 0, 0, 0, 15]).unwrap();
    // [1..4] is SWA-pinned by l2 still; [6] goes whole.
    assert_eq!(evict(&t, EvictTarget::Swa, 1), (1, vec![(FULL_SWA, vec![15])]));
    t.release(l2).unwrap();
    // A match stamps [1..4] and [5] alike: the shallower goes first, as a tombstone.
    assert_eq!(t.match_prefix(0, &[1, 2, 3, 4, 5], &mut out), 5);
    assert_eq!(evict(&t, EvictTarget::Swa, 1), (4, vec![(SWA_ONLY, vec![10, 11, 12, 13])]));
    // insert_and_lock through the tombstone: its window's tombstone is skipped, not pinned,
    // and the release knows it.
    let (_, g) =
        t.insert_and_lock(0, &[1, 2, 3, 4, 9], &[0, 0, 0, 0, 16], Default::default()).unwrap();
    let l3 = g.into_raw();
    assert_eq!(l3.swa_from(), Some(0));
    t.check_invariants().unwrap();
    t.release(l3).unwrap();
    t.check_invariants().unwrap();
    let (_, got) = evict(&t, EvictTarget::Full, usize::MAX);
    let mut kinds: Vec<_> = got.iter().map(|(f, s)| (s.clone(), *f)).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        vec![(vec![10, 11, 12, 13], FULL_ONLY), (vec![14], FULL_SWA), (vec![16], FULL_SWA)]
    );
}

#[test]
fn without_a_window_nothing_changes() {
    let t = swa_tree(1, 0);
    t.insert(0, &[1, 2, 3], &[1, 2, 3]).unwrap();
    let mut out: Vec<u32> = Vec::new();
    let l = t.match_and_lock(0, &[1, 2, 3], &mut out).into_raw();
    assert_eq!((l.len(), l.swa_from()), (3, None));
    assert_eq!(evict(&t, EvictTarget::Swa, 10).0, 0);
    t.release(l).unwrap();
    assert_eq!(evict(&t, EvictTarget::Full, 10), (3, vec![(FULL_ONLY, vec![1, 2, 3])]));
    assert_eq!(t.stats().swa_cached_tokens, 0);
    assert!(RadixTree::new(TreeConfig { swa_window: 1 << 40, ..Default::default() }).is_err());
}

// ------------------------------------------------------------------- the property test

#[derive(Debug, Clone)]
enum Op {
    Match(u64, Vec<u32>),
    MatchLock(u64, Vec<u32>),
    Insert(u64, Vec<u32>),
    InsertLock(u64, Vec<u32>),
    Release(usize),
    Evict(bool, usize),
}

fn tokens() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..3, 0..11)
}

fn op() -> impl Strategy<Value = Op> {
    let ns = 0u64..2;
    prop_oneof![
        3 => (ns.clone(), tokens()).prop_map(|(n, t)| Op::Match(n, t)),
        3 => (ns.clone(), tokens()).prop_map(|(n, t)| Op::MatchLock(n, t)),
        4 => (ns.clone(), tokens()).prop_map(|(n, t)| Op::Insert(n, t)),
        1 => (ns, tokens()).prop_map(|(n, t)| Op::InsertLock(n, t)),
        3 => (0usize..8).prop_map(Op::Release),
        3 => (any::<bool>(), 0usize..12).prop_map(|(s, k)| Op::Evict(s, k)),
    ]
}

/// One cached page: its slots, its pins, its SWA pins, whether its SWA KV is cached.
#[derive(Debug)]
struct Page {
    slots: Vec<u32>,
    pins: u32,
    swa_pins: u32,
    swa: bool,
}

/// The sequential model: pages keyed by `(ns, tokens up to the page's end)`.
struct Model {
    p: usize,
    w: usize,
    pages: HashMap<(u64, Vec<u32>), Page>,
    /// slot -> the page holding it.
    owner: HashMap<u32, (u64, Vec<u32>)>,
}

/// A lock the test holds: the tree's, and the pages it pinned (SWA-pinned too, or not).
struct Held {
    lock: PrefixLock,
    pages: Vec<((u64, Vec<u32>), bool)>,
}

impl Model {
    fn page(&self, ns: u64, t: &[u32], j: usize) -> Option<&Page> {
        self.pages.get(&(ns, t[..(j + 1) * self.p].to_vec()))
    }

    /// (full match, valid match) lengths of `t`, by the window rule over pages.
    fn matched(&self, ns: u64, t: &[u32]) -> (usize, usize) {
        let mut j = 0;
        while (j + 1) * self.p <= t.len() && self.page(ns, t, j).is_some() {
            j += 1;
        }
        let live = |i: usize| self.page(ns, t, i).unwrap().swa;
        let valid = (1..=j).rev().find(|&e| {
            let end = e * self.p;
            (0..e).all(live) || (end >= self.w && ((end - self.w) / self.p..e).all(live))
        });
        (j * self.p, valid.unwrap_or(0) * self.p)
    }

    fn slots(&self, ns: u64, t: &[u32], len: usize) -> Vec<u32> {
        (0..len / self.p).flat_map(|j| self.page(ns, t, j).unwrap().slots.clone()).collect()
    }

    /// Pins `t[..len]` and SWA-pins its pages from `swa_from` that have SWA KV (a strict
    /// lock must find them all with it).
    fn lock(
        &mut self,
        ns: u64,
        t: &[u32],
        len: usize,
        swa_from: usize,
        strict: bool,
    ) -> Vec<((u64, Vec<u32>), bool)> {
        let mut pages = Vec::new();
        for j in 0..len / self.p {
            let key = (ns, t[..(j + 1) * self.p].to_vec());
            let pg = self.pages.get_mut(&key).unwrap();
            pg.pins += 1;
            let swa = j * self.p >= swa_from && pg.swa;
            assert!(!strict || j * self.p < swa_from || pg.swa, "a window lock on a tombstone");
            pg.swa_pins += swa as u32;
            pages.push((key, swa));
        }
        pages
    }

    fn tokens(&self) -> (u64, u64) {
        let cached = (self.pages.len() * self.p) as u64;
        let swa = self.pages.values().filter(|pg| pg.swa).count() * self.p;
        (cached, swa as u64)
    }

    /// Applies one freed node: `slots` must be whole cached pages in the state `f` says.
    fn freed(&mut self, f: Freed, slots: &[u32]) -> Result<(), TestCaseError> {
        prop_assert!(!slots.is_empty() && slots.len().is_multiple_of(self.p));
        for page in slots.chunks(self.p) {
            let key = self.owner.get(&page[0]).cloned();
            prop_assert!(key.is_some(), "slot {} freed but not cached", page[0]);
            let key = key.unwrap();
            let pg = self.pages.get_mut(&key).unwrap();
            prop_assert_eq!(&pg.slots[..], page, "a freed node is not whole pages");
            prop_assert_eq!(pg.swa_pins, 0, "SWA KV of a window lock freed, or its node");
            if f.swa {
                prop_assert!(pg.swa, "SWA KV freed twice");
            }
            if f.full {
                prop_assert_eq!(pg.pins, 0, "a pinned page evicted");
                prop_assert_eq!(pg.swa, f.swa, "an eviction misreported the SWA KV it freed");
                self.pages.remove(&key);
                for s in page {
                    self.owner.remove(s);
                }
            } else {
                pg.swa = false;
            }
        }
        // What is left is prefix-closed: only leaves went.
        for (ns, t) in self.pages.keys() {
            if t.len() > self.p {
                prop_assert!(
                    self.pages.contains_key(&(*ns, t[..t.len() - self.p].to_vec())),
                    "a page left without its parent"
                );
            }
        }
        Ok(())
    }
}

fn run(p: usize, w: usize, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let tree = swa_tree(p, w);
    let mut model = Model { p, w, pages: HashMap::new(), owner: HashMap::new() };
    let mut held: Vec<Held> = Vec::new();
    let mut next_slot = 1u32;
    let mut out: Vec<u32> = Vec::new();
    for op in ops {
        let lock_next = matches!(op, Op::InsertLock(..));
        match op {
            Op::Match(ns, t) => {
                let m = tree.match_prefix(ns, &t, &mut out);
                let (_, valid) = model.matched(ns, &t);
                prop_assert_eq!(m, valid);
                prop_assert_eq!(&out, &model.slots(ns, &t, valid));
            }
            Op::MatchLock(ns, t) => {
                let l = tree.match_and_lock(ns, &t, &mut out).into_raw();
                let (_, valid) = model.matched(ns, &t);
                prop_assert_eq!(l.len(), valid);
                prop_assert_eq!(&out, &model.slots(ns, &t, valid));
                let from = l.swa_from().unwrap();
                prop_assert!(from <= valid && from.is_multiple_of(p));
                prop_assert!(valid == 0 || valid - from >= w.min(valid), "the window uncovered");
                let pages = model.lock(ns, &t, valid, from, true);
                held.push(Held { lock: l, pages });
            }
            Op::Insert(ns, t) | Op::InsertLock(ns, t) => {
                let pin = lock_next;
                let slots: Vec<u32> = (next_slot..next_slot + t.len() as u32).collect();
                next_slot += t.len() as u32;
                let (full, _) = model.matched(ns, &t);
                let n = t.len() / p * p;
                let (e, lock) = if pin {
                    let (e, g) = tree.insert_and_lock(ns, &t[..], &slots, Default::default())?;
                    (e, Some(g.into_raw()))
                } else {
                    (tree.insert(ns, &t, &slots)?, None)
                };
                prop_assert_eq!(e, full, "existing is the full match");
                for j in full / p..n / p {
                    let key = (ns, t[..(j + 1) * p].to_vec());
                    let s = slots[j * p..(j + 1) * p].to_vec();
                    for &x in &s {
                        model.owner.insert(x, key.clone());
                    }
                    model.pages.insert(key, Page { slots: s, pins: 0, swa_pins: 0, swa: true });
                }
                if let Some(l) = lock {
                    prop_assert_eq!(l.len(), n);
                    let from = l.swa_from().unwrap();
                    prop_assert!(from <= n && from.is_multiple_of(p));
                    prop_assert!(n == 0 || n - from >= w.min(n), "the window uncovered");
                    let pages = model.lock(ns, &t, n, from, false);
                    held.push(Held { lock: l, pages });
                }
            }
            Op::Release(i) => {
                if !held.is_empty() {
                    let h = held.swap_remove(i % held.len());
                    tree.release(h.lock).unwrap();
                    for (key, swa) in h.pages {
                        let pg = model.pages.get_mut(&key).unwrap();
                        pg.pins -= 1;
                        if swa {
                            prop_assert!(pg.swa, "SWA KV freed under a window lock");
                            pg.swa_pins -= 1;
                        }
                    }
                }
            }
            Op::Evict(swa, k) => {
                let target = if swa { EvictTarget::Swa } else { EvictTarget::Full };
                let (n, got) = evict(&tree, target, k);
                let mut kind_freed = 0;
                for (f, s) in &got {
                    model.freed(*f, s)?;
                    if (swa && f.swa) || (!swa && f.full) {
                        kind_freed += s.len();
                    }
                }
                prop_assert_eq!(n, kind_freed);
                if n < k {
                    // Nothing more of that kind could go.
                    for (key, pg) in &model.pages {
                        if swa {
                            prop_assert!(!pg.swa || pg.swa_pins > 0, "SWA KV left: {:?}", key);
                        } else {
                            let leaf = !model.pages.keys().any(|(ns, t)| {
                                *ns == key.0 && t.len() == key.1.len() + p && t.starts_with(&key.1)
                            });
                            prop_assert!(!leaf || pg.pins > 0, "an unpinned leaf left: {:?}", key);
                        }
                    }
                }
            }
        }
        let st = tree.stats();
        prop_assert_eq!((st.cached_tokens, st.swa_cached_tokens), model.tokens());
        let held = model.pages.values().filter(|pg| pg.swa_pins > 0).count() * p;
        prop_assert_eq!(st.swa_protected_tokens, held as u64);
        let c = tree.check_invariants();
        prop_assert!(c.is_ok(), "{:?}", c);
    }
    // Conservation: with every lock released, everything goes, each slot's full KV once and
    // its SWA KV once (by a tombstone earlier, or now).
    for h in held {
        tree.release(h.lock).unwrap();
        for (key, _) in h.pages {
            let pg = model.pages.get_mut(&key).unwrap();
            pg.pins = 0;
            pg.swa_pins = 0;
        }
    }
    let (_, got) = evict(&tree, EvictTarget::Full, usize::MAX);
    for (f, s) in &got {
        model.freed(*f, s)?;
    }
    prop_assert!(model.pages.is_empty(), "left after releasing every lock: {:?}", model.pages);
    prop_assert_eq!(tree.stats().cached_tokens, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    #[test]
    fn swa_tree_agrees_with_the_model(
        p in 1usize..3,
        w in 1usize..6,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(p, w, ops)?;
    }
}

// ------------------------------------------------------------------- the stress test

/// Threads that admit requests (a locking match, an insert of the rest), release them,
/// and evict full or SWA KV, on a shared tree with a small window. The free callbacks check
/// that no slot is freed while a lock holds it (full: any lock on its path; SWA: a lock
/// whose window holds it) and that none is freed twice; at the end, with every lock
/// released and everything evicted, every slot the tree adopted had its full KV and its SWA
/// KV freed exactly once.
#[test]
fn threads_never_free_pinned_kv_and_free_every_slot_once() {
    const SLOTS: usize = 400_000;
    const THREADS: u64 = 4;
    let t = Arc::new(swa_tree(1, 6));
    let counters = || Arc::new((0..SLOTS).map(|_| AtomicU32::new(0)).collect::<Vec<_>>());
    let (locked, swa_locked) = (counters(), counters());
    let (full_freed, swa_freed, adopted) = (counters(), counters(), counters());
    let next = Arc::new(AtomicU32::new(1));
    let free_check = {
        let (locked, swa_locked) = (locked.clone(), swa_locked.clone());
        let (full_freed, swa_freed) = (full_freed.clone(), swa_freed.clone());
        move |f: Freed, s: &[u32]| {
            for &x in s {
                let x = x as usize;
                if f.full {
                    assert_eq!(locked[x].load(SeqCst), 0, "slot {x}: full KV freed under a lock");
                    assert_eq!(full_freed[x].fetch_add(1, SeqCst), 0, "slot {x}: freed twice");
                }
                if f.swa {
                    assert_eq!(swa_locked[x].load(SeqCst), 0, "slot {x}: SWA KV freed in a window");
                    assert_eq!(swa_freed[x].fetch_add(1, SeqCst), 0, "slot {x}: SWA freed twice");
                }
            }
        }
    };
    let handles: Vec<_> = (0..THREADS)
        .map(|id| {
            let (t, next, free_check) = (t.clone(), next.clone(), free_check.clone());
            let (locked, swa_locked, adopted) =
                (locked.clone(), swa_locked.clone(), adopted.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((id + 1) * 0x2545_F491));
                let mut out: Vec<u32> = Vec::new();
                for _ in 0..3_000 {
                    match rng.below(10) {
                        0 | 1 => {
                            let target = if rng.below(2) == 0 {
                                EvictTarget::Swa
                            } else {
                                EvictTarget::Full
                            };
                            let k = rng.below(64) as usize + 1;
                            t.evict_kv(target, k, &mut |f, s| free_check(f, s));
                        }
                        _ => {
                            // A prompt: one of a few system prompts, a few shared turns, a
                            // random tail.
                            let sys = rng.below(3) as u32 * 100;
                            let mut key: Vec<u32> = (0..8).map(|i| sys + i).collect();
                            for _ in 0..rng.below(4) {
                                key.push(1000 + rng.below(3) as u32);
                            }
                            for _ in 0..rng.below(8) {
                                key.push(rng.below(1_000_000) as u32);
                            }
                            let l = t.match_and_lock(0, &key[..], &mut out).into_raw();
                            let from = l.swa_from().unwrap();
                            for (i, &x) in out.iter().enumerate() {
                                locked[x as usize].fetch_add(1, SeqCst);
                                if i >= from {
                                    swa_locked[x as usize].fetch_add(1, SeqCst);
                                }
                            }
                            let m = l.len();
                            let n = key.len() - m;
                            let base = next.fetch_add(n as u32, SeqCst);
                            assert!((base as usize + n) < SLOTS, "raise SLOTS");
                            let mut slots = out.clone();
                            slots.extend(base..base + n as u32);
                            let e = t.insert(0, &key, &slots).unwrap();
                            for &x in &slots[e.max(m)..] {
                                adopted[x as usize].fetch_add(1, SeqCst);
                            }
                            // Slots of [m, e) were cached meanwhile by another thread: ours
                            // are not adopted (and, never cached, never freed).
                            for (i, &x) in out.iter().enumerate() {
                                if i >= from {
                                    swa_locked[x as usize].fetch_sub(1, SeqCst);
                                }
                                locked[x as usize].fetch_sub(1, SeqCst);
                            }
                            t.release(l).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    t.check_invariants().unwrap();
    t.evict_kv(EvictTarget::Full, usize::MAX, &mut |f, s| free_check(f, s));
    assert_eq!(t.stats().cached_tokens, 0);
    t.check_invariants().unwrap();
    for x in 0..SLOTS {
        let a = adopted[x].load(SeqCst);
        assert!(a <= 1, "slot {x} adopted twice");
        assert_eq!(full_freed[x].load(SeqCst), a, "slot {x}: full KV freed {a} times wrong");
        assert_eq!(swa_freed[x].load(SeqCst), a, "slot {x}: SWA KV not freed exactly once");
    }
}

/// Through `Cache`: a pool-mode cache with a window evicts only through `evict_kv` (or with
/// a callback), its `alloc` does not evict on its own, and full KV freed goes back to the
/// pool; a host tier is refused with a window.
#[test]
fn a_pool_cache_with_a_window_evicts_only_where_the_engine_hears_of_it() {
    use radixkv::{Cache, CacheOptions, Error};
    let opts = CacheOptions { pool_slots: 8, swa_window: 2, ..Default::default() };
    let c = Cache::new(opts).unwrap();
    let mut s = Vec::new();
    c.alloc(8, &mut s).unwrap();
    let key: Vec<u32> = (1..9).collect();
    assert_eq!(c.insert(0, &key, &s[..]).unwrap(), 0);
    let mut more = Vec::new();
    assert!(matches!(c.alloc(1, &mut more), Err(Error::OutOfSlots { .. })), "no silent eviction");
    assert!(matches!(c.evict(1, None), Err(Error::InvalidArgument(_))));
    assert!(matches!(c.reset(None), Err(Error::InvalidArgument(_))));
    assert_eq!(c.stats().tree.cached_tokens, 8, "the refusals changed nothing");
    let mut got = Vec::new();
    assert_eq!(c.evict_kv(EvictTarget::Swa, 1, &mut |f, x| got.push((f, x.to_vec()))).unwrap(), 8);
    assert_eq!(got, vec![(FULL_SWA, s.clone())]);
    assert_eq!(c.stats().free_slots, 8, "the full KV went back to the pool");
    c.alloc(8, &mut more).unwrap();
    assert!(
        Cache::with_host(
            opts,
            radixkv::tier::TierOptions { host_slots: 16, ..Default::default() },
            std::sync::Arc::new(radixkv::tier::NullCopier::default()),
        )
        .is_err()
    );
}

/// SGLang's window-bounded refresh: a match refreshes only the SWA KV within its window
/// (plus a page) back from its end, so the older prefix's SWA KV goes first, as a tombstone,
/// before a leaf goes whole, though the match touched the whole path for full eviction.
#[test]
fn a_match_refreshes_only_its_windows_swa_kv() {
    let t = swa_tree(1, 1);
    let a: Vec<u32> = vec![1, 2, 3, 4, 5, 6];
    t.insert(0, &a, &[10, 11, 12, 13, 14, 15]).unwrap();
    // X = [1..4] (under the split: A's stamps), Y = [5, 6], Z = [9, 9] (new).
    t.insert(0, &[1, 2, 3, 4, 9, 9], &[0, 0, 0, 0, 20, 21]).unwrap();
    let mut out: Vec<u32> = Vec::new();
    assert_eq!(t.match_prefix(0, &a, &mut out), 6);
    // SWA order: X (not refreshed since A's insert), Z, Y (refreshed by the match); the
    // full stamps say the match touched X and Y alike.
    let info = t.inspect(0, &a);
    assert_eq!(info.len(), 2);
    assert_eq!(info[0].stamp, info[1].stamp, "the match stamps the whole path");
    assert!(info[0].swa_stamp < info[1].swa_stamp, "only the window's SWA KV is refreshed");
    assert_eq!(evict(&t, EvictTarget::Swa, 1), (4, vec![(SWA_ONLY, vec![10, 11, 12, 13])]));
    let info = t.inspect(0, &a);
    assert!(info[0].swa_gone && !info[1].swa_gone && info[1].swa_pins == 0);
    assert_eq!(evict(&t, EvictTarget::Swa, 1), (2, vec![(FULL_SWA, vec![20, 21])]));
    // The full order is the match's: Z went already; Y, then X, a tombstone.
    assert_eq!(t.match_prefix(0, &a, &mut out), 6, "valid: the window is Y, after X");
    t.check_invariants().unwrap();
}

/// `drop_namespace_kv` says per leaf whether its SWA KV went with it, on the tree and through
/// a pool-mode `Cache` (whose full KV goes back to the pool); other namespaces stay.
#[test]
fn dropping_a_namespace_says_what_each_leaf_freed() {
    use radixkv::{Cache, CacheOptions};
    let t = swa_tree(1, 1);
    t.insert(1, &[1, 2, 3, 4, 5, 6], &[10, 11, 12, 13, 14, 15]).unwrap();
    t.insert(1, &[1, 2, 3, 4, 9, 9], &[0, 0, 0, 0, 16, 17]).unwrap();
    let mut out: Vec<u32> = Vec::new();
    t.match_prefix(1, &[1, 2, 3, 4, 5, 6], &mut out);
    t.match_prefix(1, &[1, 2, 3, 4, 9, 9], &mut out);
    t.insert(2, &[7, 7], &[30, 31]).unwrap();
    // [1..4] is the least recent SWA KV (the matches refreshed only their windows).
    assert_eq!(evict(&t, EvictTarget::Swa, 1).1, vec![(SWA_ONLY, vec![10, 11, 12, 13])]);
    let mut got = Vec::new();
    assert_eq!(t.drop_namespace_kv(1, &mut |f, s| got.push((f, s.to_vec()))), 8);
    got.sort();
    assert_eq!(
        got,
        vec![(FULL_ONLY, vec![10, 11, 12, 13]), (FULL_SWA, vec![14, 15]), (FULL_SWA, vec![16, 17])]
    );
    assert_eq!(t.stats().cached_tokens, 2, "namespace 2 stays");
    t.check_invariants().unwrap();
    let c =
        Cache::new(CacheOptions { pool_slots: 8, swa_window: 1, ..Default::default() }).unwrap();
    let mut s = Vec::new();
    c.alloc(8, &mut s).unwrap();
    c.insert(5, &[1, 2, 3, 4, 5, 6, 7, 8], &s[..]).unwrap();
    let mut got = Vec::new();
    assert_eq!(c.drop_namespace_kv(5, &mut |f, x| got.push((f, x.len()))).unwrap(), 8);
    assert_eq!((got, c.stats().free_slots), (vec![(FULL_SWA, 8)], 8));
}
