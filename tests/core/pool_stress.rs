//! Many threads allocate, free, adopt and release slots of one pool at once. A shared table
//! records each slot's owner: a slot handed to two owners at once fails the test. At the end
//! every slot is accounted for and every page comes back whole.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU8, Ordering};

use radixkv::Error;
use radixkv::pool::{SlotPool, SlotState};

fn threads() -> usize {
    let par = std::thread::available_parallelism().map_or(1, |n| n.get());
    (2 * par).clamp(4, 64)
}

/// xorshift64*: small, seeded, good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Takes up to `max` random entries out of `v` (at least one if `v` is not empty).
    fn take(&mut self, v: &mut Vec<u32>, max: usize) -> Vec<u32> {
        let m = 1 + self.below(max.min(v.len()).max(1));
        (0..m.min(v.len())).map(|_| v.swap_remove(self.below(v.len()))).collect()
    }
}

/// Who owns each slot: 0 the pool, `t + 1` thread `t`.
struct Owners(Vec<AtomicU8>);

impl Owners {
    fn new(n: usize) -> Owners {
        Owners((0..n).map(|_| AtomicU8::new(0)).collect())
    }
    fn acquire(&self, slots: &[u32], me: u8) {
        for &s in slots {
            if let Err(other) =
                self.0[s as usize].compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire)
            {
                panic!("slot {s} handed to thread {} while thread {} owns it", me - 1, other - 1);
            }
        }
    }
    /// Gives the slots up *before* the pool gets them back (after that, others may get them).
    fn release(&self, slots: &[u32], me: u8) {
        for &s in slots {
            let was = self.0[s as usize].swap(0, Ordering::AcqRel);
            assert_eq!(was, me, "slot {s} was not ours");
        }
    }
}

/// Random cycles on one pool; returns what each thread still holds and has cached.
fn run(
    pool: &SlotPool,
    owners: &Owners,
    nthreads: usize,
    iters: usize,
    seed: u64,
) -> Vec<(Vec<u32>, Vec<u32>)> {
    let p = pool.page_size();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..nthreads)
            .map(|t| {
                scope.spawn(move || {
                    let me = (t + 1) as u8;
                    let mut rng = Rng::new(seed ^ (t as u64 + 1) << 32);
                    let mut held: Vec<u32> = Vec::new();
                    let mut cached: Vec<u32> = Vec::new();
                    let mut out = Vec::new();
                    for _ in 0..iters {
                        let heavy = held.len() + cached.len() > 8 * p;
                        match rng.below(10) {
                            // Allocate 1..=4 pages.
                            0..=2 if !heavy => {
                                out.clear();
                                let n = (1 + rng.below(4)) * p;
                                if pool.try_alloc(n, &mut out).unwrap() {
                                    assert_eq!(out.len(), n);
                                    owners.acquire(&out, me);
                                    for page in out.chunks(p) {
                                        assert_eq!(page[0] as usize % p, 0);
                                        for (i, &s) in page.iter().enumerate() {
                                            assert_eq!(s, page[0] + i as u32);
                                            assert_eq!(pool.state(s), Some(SlotState::Held));
                                        }
                                    }
                                    held.extend_from_slice(&out);
                                } else {
                                    assert!(out.is_empty());
                                }
                            }
                            // Free some held slots (whole pages or any subset, any order).
                            0..=4 if !held.is_empty() => {
                                let batch = if rng.below(2) == 0 {
                                    let k = rng.below(held.len() / p + 1).min(held.len() / p);
                                    let start = rng.below(held.len() / p - k + 1) * p;
                                    held.drain(start..start + k * p).collect()
                                } else {
                                    rng.take(&mut held, 2 * p)
                                };
                                owners.release(&batch, me);
                                pool.free(&batch).unwrap();
                            }
                            // Hand some held slots to the "tree".
                            5..=6 if !held.is_empty() => {
                                let batch = rng.take(&mut held, 3 * p);
                                pool.adopt(&batch).unwrap();
                                assert!(
                                    batch.iter().all(|&s| pool.state(s) == Some(SlotState::Cached))
                                );
                                cached.extend(batch);
                            }
                            // Evict some cached slots.
                            7..=8 if !cached.is_empty() => {
                                let batch = rng.take(&mut cached, 3 * p);
                                owners.release(&batch, me);
                                pool.release_cached(&batch).unwrap();
                            }
                            // Misuse of our own slots: refused, nothing changes.
                            _ => {
                                pool.check_held(&held).unwrap();
                                if let Some(&c) = cached.first() {
                                    assert_eq!(pool.free(&[c]), Err(Error::DoubleFree { slot: c }));
                                    assert!(pool.adopt(&[c]).is_err());
                                    assert!(pool.check_held(&[c]).is_err());
                                    assert_eq!(pool.state(c), Some(SlotState::Cached));
                                }
                                if let Some(&h) = held.last() {
                                    assert!(pool.release_cached(&[h]).is_err());
                                    assert_eq!(
                                        pool.free(&[h, h]),
                                        Err(Error::DoubleFree { slot: h })
                                    );
                                    assert!(pool.check_held(&[h, h]).is_err());
                                    if let Some(&c) = cached.first() {
                                        assert_eq!(
                                            pool.free(&[h, c]),
                                            Err(Error::DoubleFree { slot: c })
                                        );
                                    }
                                    assert_eq!(pool.state(h), Some(SlotState::Held));
                                }
                            }
                        }
                    }
                    (held, cached)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Checks the accounts at quiescence, gives everything back, and checks every page is whole.
fn settle(pool: &SlotPool, owners: &Owners, left: Vec<(Vec<u32>, Vec<u32>)>) {
    let held: usize = left.iter().map(|(h, _)| h.len()).sum();
    let cached: usize = left.iter().map(|(_, c)| c.len()).sum();
    assert_eq!(pool.available() + held + cached, pool.capacity());
    for (t, (h, c)) in left.iter().enumerate() {
        for &s in h {
            assert_eq!(owners.0[s as usize].load(Ordering::Relaxed), t as u8 + 1);
            assert_eq!(pool.state(s), Some(SlotState::Held));
        }
        for &s in c {
            assert_eq!(owners.0[s as usize].load(Ordering::Relaxed), t as u8 + 1);
            assert_eq!(pool.state(s), Some(SlotState::Cached));
        }
    }
    for (h, c) in &left {
        pool.free(h).unwrap();
        pool.release_cached(c).unwrap();
    }
    let n = pool.capacity();
    assert_eq!(pool.available(), n);
    assert_eq!(pool.allocatable(), n, "a page did not come back whole");
    let mut all = Vec::new();
    assert!(pool.try_alloc(n, &mut all).unwrap());
    let p = pool.page_size();
    for page in all.chunks(p) {
        assert_eq!(page[0] as usize % p, 0);
        assert!(page.iter().enumerate().all(|(i, &s)| s == page[0] + i as u32));
    }
    assert_eq!(all.iter().copied().collect::<HashSet<u32>>().len(), n);
    pool.free(&all).unwrap();
}

fn stress(page_size: usize, pages_per_thread: usize, iters: usize, seed: u64) {
    let t = threads();
    let pool = SlotPool::new(t * pages_per_thread * page_size, page_size).unwrap();
    let owners = Owners::new(pool.capacity());
    let left = run(&pool, &owners, t, iters, seed);
    settle(&pool, &owners, left);
}

#[test]
fn stress_page_size_1() {
    stress(1, 6, 200_000, 1);
}

#[test]
fn stress_page_size_16() {
    stress(16, 6, 50_000, 2);
}

/// A pool too small for everyone's wishes: allocations fail often, and must stay consistent.
#[test]
fn stress_scarce_pool() {
    stress(4, 2, 100_000, 3);
}

/// With exactly `k` pages per thread and every thread holding at most `k` at a time, every
/// allocation must succeed however the calls interleave: a false "out of slots" (pages that
/// are free but sit on another shard, or are being pushed) fails the test.
#[test]
fn no_false_out_of_slots() {
    let t = threads();
    let (p, k) = (4, 3);
    let pool = SlotPool::new(t * k * p, p).unwrap();
    let owners = Owners::new(pool.capacity());
    std::thread::scope(|scope| {
        for th in 0..t {
            let (pool, owners) = (&pool, &owners);
            scope.spawn(move || {
                let me = th as u8 + 1;
                let mut rng = Rng::new(th as u64 + 100);
                let mut out = Vec::new();
                for i in 0..50_000 {
                    out.clear();
                    assert_eq!(pool.try_alloc(k * p, &mut out), Ok(true), "thread {th}, round {i}");
                    owners.acquire(&out, me);
                    owners.release(&out, me);
                    match rng.below(3) {
                        0 => pool.free(&out).unwrap(),
                        1 => {
                            // Split, so the pages come back through the per-page counters.
                            let cut = 1 + rng.below(out.len() - 1);
                            pool.free(&out[cut..]).unwrap();
                            pool.free(&out[..cut]).unwrap();
                        }
                        _ => {
                            pool.adopt(&out).unwrap();
                            pool.release_cached(&out).unwrap();
                        }
                    }
                }
            });
        }
    });
    assert_eq!((pool.available(), pool.allocatable()), (pool.capacity(), pool.capacity()));
}

/// The cache's pattern with long runs: each thread allocates many pages at once, settles
/// them (adopt a prefix, free the rest, as an insert does), and releases the adopted ones in
/// pieces, in or out of order (as evictions do), sometimes as a list of runs out of order.
/// Runs start and end anywhere in pages, state words and lock stripes, next to other
/// threads' runs.
fn long_runs(page_size: usize, max_pages: usize, iters: usize, seed: u64) {
    let t = threads();
    let p = page_size;
    let pool = SlotPool::new(t * 2 * max_pages * p, p).unwrap();
    let owners = Owners::new(pool.capacity());
    std::thread::scope(|scope| {
        for th in 0..t {
            let (pool, owners) = (&pool, &owners);
            scope.spawn(move || {
                let me = th as u8 + 1;
                let mut rng = Rng::new(seed ^ (th as u64 + 1) << 20);
                let mut out = Vec::new();
                // Adopted slots not yet released, in runs as adopted.
                let mut cached: Vec<Vec<u32>> = Vec::new();
                for _ in 0..iters {
                    out.clear();
                    let n = (1 + rng.below(max_pages)) * p;
                    if pool.try_alloc(n, &mut out).unwrap() {
                        owners.acquire(&out, me);
                        let cut = rng.below(n + 1);
                        let (adopt, free) = out.split_at(cut);
                        owners.release(free, me);
                        pool.settle(adopt, free).unwrap();
                        assert!(adopt.iter().all(|&s| pool.state(s) == Some(SlotState::Cached)));
                        // A settle of slots no longer held is refused whole.
                        if let Some(&a) = adopt.first() {
                            assert!(pool.settle(&[a], &[]).is_err());
                            assert_eq!(pool.state(a), Some(SlotState::Cached));
                        }
                        if !adopt.is_empty() {
                            cached.push(adopt.to_vec());
                        }
                    }
                    // Evict: every cached list once the pool runs short, else some.
                    while cached.len() > 2 || (!cached.is_empty() && rng.below(2) == 0) {
                        let mut v = cached.swap_remove(rng.below(cached.len()));
                        match rng.below(4) {
                            0 => v.reverse(),
                            1 => {
                                // Two runs, the upper one first.
                                let cut = rng.below(v.len());
                                v.rotate_left(cut);
                            }
                            2 => {
                                // A piece now, the rest later.
                                let cut = rng.below(v.len());
                                let rest = v.split_off(cut);
                                if !rest.is_empty() {
                                    cached.push(rest);
                                }
                                if v.is_empty() {
                                    continue;
                                }
                            }
                            _ => {}
                        }
                        owners.release(&v, me);
                        pool.release_cached(&v).unwrap();
                    }
                }
                for v in cached {
                    owners.release(&v, me);
                    pool.release_cached(&v).unwrap();
                }
            });
        }
    });
    let n = pool.capacity();
    assert_eq!((pool.available(), pool.allocatable()), (n, n));
    let mut all = Vec::new();
    assert!(pool.try_alloc(n, &mut all).unwrap());
    all.sort_unstable();
    assert_eq!(all, (0..n as u32).collect::<Vec<_>>());
}

#[test]
fn long_runs_page_size_1() {
    long_runs(1, 700, 3_000, 4);
}

#[test]
fn long_runs_page_size_3() {
    long_runs(3, 100, 3_000, 5);
}

#[test]
fn long_runs_page_size_16() {
    long_runs(16, 40, 3_000, 6);
}
