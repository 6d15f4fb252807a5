//! Multi-threaded stress: random mixes of match / match_and_lock / insert / insert_and_lock
//! / release / evict / reclaim across a few namespaces, with 2x the cores in threads (at
//! least 4), bounded by operation count. Checks, during the run, that every match returns slots that
//! were inserted for exactly those token positions (same namespace, same preceding tokens)
//! and that pinned prefixes keep their slots; and at the end that every slot is accounted
//! for exactly once and the counters equal a walk of the tree.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use radixkv::tree::InsertOptions;
use radixkv::{EvictionPolicy, PrefixLock, RadixTree, TreeConfig};

const MAX_SLOTS: usize = 40_000_000;
const NS: u64 = 3;

/// What each slot was created for: a hash of (namespace, tokens up to and including its
/// position); 0 = unused.
struct Ledger {
    context: Vec<AtomicU64>,
    /// 0 unused, 1 held by a caller, 2 adopted by the tree, 3 freed.
    state: Vec<AtomicU8>,
    next: AtomicU32,
}

const HELD: u8 = 1;
const ADOPTED: u8 = 2;
const FREED: u8 = 3;

fn context_hashes(ns: u64, tokens: &[u32]) -> Vec<u64> {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ ns.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    tokens
        .iter()
        .map(|&t| {
            h = (h ^ t as u64).wrapping_mul(0x1000_0000_01b3).rotate_left(17) | 1;
            h
        })
        .collect()
}

impl Ledger {
    fn new() -> Self {
        Ledger {
            context: (0..MAX_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            state: (0..MAX_SLOTS).map(|_| AtomicU8::new(0)).collect(),
            next: AtomicU32::new(0),
        }
    }

    fn fresh(&self, ns: u64, tokens: &[u32]) -> Vec<u32> {
        let start = self.next.fetch_add(tokens.len() as u32, Ordering::Relaxed);
        assert!((start as usize + tokens.len()) < MAX_SLOTS, "raise MAX_SLOTS");
        let hs = context_hashes(ns, tokens);
        // A third of the requests get their slots in descending order and a third as runs of
        // 4 in descending order, so edges stored one slot per token and as several runs are
        // split, matched and evicted concurrently too, not only one-run edges.
        let layout = start % 3;
        let n = tokens.len() as u32;
        (0..n)
            .map(|i| {
                let s = match layout {
                    0 => start + i,
                    1 => start + (n - 1 - i),
                    _ if i / 4 * 4 + 4 <= n => start + (n - 4 - i / 4 * 4) + i % 4,
                    _ => start + i % 4, // the last, partial run of 4 comes first in slot order
                };
                self.context[s as usize].store(hs[i as usize], Ordering::Relaxed);
                self.state[s as usize].store(HELD, Ordering::Release);
                s
            })
            .collect()
    }

    /// `locked`: the slots are pinned by the caller, so they cannot have been freed.
    fn check_match(&self, ns: u64, query: &[u32], slots: &[u32], locked: bool) {
        let hs = context_hashes(ns, &query[..slots.len()]);
        for (i, &s) in slots.iter().enumerate() {
            assert_eq!(
                self.context[s as usize].load(Ordering::Relaxed),
                hs[i],
                "slot {s} at position {i} of ns {ns} was inserted for another context"
            );
            if locked {
                assert_ne!(
                    self.state[s as usize].load(Ordering::Acquire),
                    FREED,
                    "a pinned slot was freed"
                );
            }
        }
    }

    fn free(&self, s: u32, from_tree: bool) {
        let st = &self.state[s as usize];
        let mut cur = st.load(Ordering::Acquire);
        loop {
            assert!(
                cur == HELD || cur == ADOPTED,
                "slot {s} freed twice (state {cur}, tree {from_tree})"
            );
            match st.compare_exchange(cur, FREED, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(x) => cur = x,
            }
        }
    }

    /// After an insert: `slots[..existing]` and `slots[n..]` go back to the caller (freed),
    /// `slots[existing..n]` belong to the tree (unless already evicted and freed).
    fn settle(&self, slots: &[u32], existing: usize, n: usize) {
        for &s in slots[..existing].iter().chain(&slots[n..]) {
            self.free(s, false);
        }
        for &s in &slots[existing..n] {
            let _ = self.state[s as usize].compare_exchange(
                HELD,
                ADOPTED,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A token sequence from a small family, so requests share prefixes and fork at many
/// depths (splits everywhere).
fn request(rng: &mut Rng) -> Vec<u32> {
    let family = rng.below(6) as u32;
    let len = 1 + rng.below(48) as usize;
    let fork = rng.below(len as u64 + 1) as usize;
    let variant = rng.below(4) as u32;
    (0..len as u32)
        .map(|i| {
            if (i as usize) < fork {
                family * 1000 + i
            } else {
                family * 1000 + 500 + variant * 37 + i
            }
        })
        .collect()
}

fn run(page: usize, threads: usize, ops: usize, policy: EvictionPolicy) {
    let tree = Arc::new(
        RadixTree::new(TreeConfig { page_size: page, policy, ..Default::default() }).unwrap(),
    );
    let ledger = Arc::new(Ledger::new());
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let tree = tree.clone();
            let ledger = ledger.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(0x5eed + t as u64 * 7919);
                let mut locks: Vec<(PrefixLock, Vec<u32>, Vec<u32>)> = Vec::new();
                let mut out = Vec::new();
                let start = std::time::Instant::now();
                for _ in 0..ops {
                    // Bounded in time as well as in count (never a timing assert).
                    if start.elapsed().as_secs() >= 20 {
                        break;
                    }
                    let ns = rng.below(NS);
                    let q = request(&mut rng);
                    match rng.below(10) {
                        0 | 1 => {
                            let m = tree.match_prefix(ns, &q, &mut out);
                            assert_eq!(m % page, 0);
                            ledger.check_match(ns, &q, &out, false);
                        }
                        2 | 3 => {
                            let l = tree.match_and_lock(ns, &q, &mut out).into_raw();
                            assert_eq!(l.len(), out.len());
                            ledger.check_match(ns, &q, &out, true);
                            locks.push((l, q.clone(), out.clone()));
                        }
                        4..=6 => {
                            let slots = ledger.fresh(ns, &q);
                            let n = q.len() / page * page;
                            // Priorities and `inserted_len` move keys (and, under some
                            // policies, make the insert split where its key ends).
                            let opts = InsertOptions {
                                priority: rng.below(5) as i32 - 2,
                                inserted_len: if rng.below(4) == 0 { n / 2 } else { 0 },
                            };
                            if rng.below(3) == 0 {
                                let (e, l) = tree
                                    .insert_and_lock(ns, &q, &slots, opts)
                                    .map(|(e, l)| (e, l.into_raw()))
                                    .unwrap();
                                assert_eq!(l.len(), n);
                                ledger.settle(&slots, e, n);
                                let m = tree.match_prefix(ns, &q, &mut out);
                                assert!(m >= n, "an insert_and_lock'ed prefix is cached");
                                ledger.check_match(ns, &q, &out[..n], true);
                                locks.push((l, q.clone(), out[..n].to_vec()));
                            } else {
                                let e = tree.insert_with(ns, &q, &slots, opts).unwrap();
                                assert!(e <= n && e.is_multiple_of(page));
                                ledger.settle(&slots, e, n);
                            }
                        }
                        7 | 8 => {
                            if !locks.is_empty() {
                                let i = rng.below(locks.len() as u64) as usize;
                                let (l, q, slots) = locks.swap_remove(i);
                                // Still pinned: the same slots are still there.
                                let ns = l.namespace();
                                let m = tree.match_prefix(ns, &q, &mut out);
                                assert!(m >= slots.len(), "a pinned prefix was evicted");
                                assert_eq!(
                                    out[..slots.len()],
                                    slots[..],
                                    "a pinned prefix changed slots"
                                );
                                tree.release(l).unwrap();
                            }
                        }
                        _ => {
                            let k = 1 + rng.below(64) as usize;
                            // Odd k: the slots come back as runs (`evict_runs`).
                            if k % 2 == 1 {
                                tree.evict_runs(k, &mut |runs| {
                                    for x in runs.iter().flat_map(|r| r.slots()) {
                                        ledger.free(x, true);
                                    }
                                });
                            } else {
                                tree.evict(k, &mut |s| {
                                    for &x in s {
                                        ledger.free(x, true);
                                    }
                                });
                            }
                            // Now and then the deferred frees run here, racing the others'
                            // matches, splits and evictions.
                            if k.is_multiple_of(4) {
                                tree.reclaim();
                            }
                        }
                    }
                }
                for (l, _, _) in locks {
                    tree.release(l).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // Quiescent: the counters equal a walk of the tree, and nothing is pinned.
    let census = tree.check_invariants().unwrap();
    let st = tree.stats();
    assert_eq!(st.protected_tokens, 0);
    assert_eq!(st.cached_tokens, st.evictable_tokens + st.protected_tokens);
    // Every slot ever created is freed exactly once or still in the tree.
    let created = ledger.next.load(Ordering::Relaxed) as usize;
    let mut adopted = 0u64;
    for s in 0..created {
        match ledger.state[s].load(Ordering::Relaxed) {
            ADOPTED => adopted += 1,
            FREED => {}
            x => panic!("slot {s} in state {x} at the end"),
        }
    }
    assert_eq!(adopted, census.cached_tokens, "slots still adopted == tokens cached");
    let mut freed = 0u64;
    tree.reset(&mut |s| {
        for &x in s {
            ledger.free(x, true);
            freed += 1;
        }
    });
    assert_eq!(freed, adopted);
    assert_eq!(tree.stats().cached_tokens, 0);
    assert_eq!(tree.check_invariants().unwrap().nodes, 0);
}

fn threads() -> usize {
    (2 * std::thread::available_parallelism().map_or(2, |n| n.get())).max(4)
}

fn ops() -> usize {
    if cfg!(debug_assertions) { 5_000 } else { 150_000 }
}

#[test]
fn stress_page_1_lru() {
    run(1, threads(), ops(), EvictionPolicy::Lru);
}

#[test]
fn stress_page_4_lru() {
    run(4, threads(), ops(), EvictionPolicy::Lru);
}

#[test]
fn stress_page_2_fifo() {
    run(2, threads(), ops(), EvictionPolicy::Fifo);
}

// Every other policy, each at a page size of its own: the same checks (every match's slots
// belong to its context, pinned prefixes keep theirs, every slot freed once or cached, the
// counters equal the walk, and every unpinned leaf queued, under `mru` with its current key).

#[test]
fn stress_page_1_lfu() {
    run(1, threads(), ops(), EvictionPolicy::Lfu);
}

#[test]
fn stress_page_2_mru() {
    run(2, threads(), ops(), EvictionPolicy::Mru);
}

#[test]
fn stress_page_1_mru() {
    run(1, threads(), ops(), EvictionPolicy::Mru);
}

#[test]
fn stress_page_4_filo() {
    run(4, threads(), ops(), EvictionPolicy::Filo);
}

#[test]
fn stress_page_1_priority() {
    run(1, threads(), ops(), EvictionPolicy::Priority);
}

#[test]
fn stress_page_2_slru() {
    run(2, threads(), ops(), EvictionPolicy::Slru);
}
