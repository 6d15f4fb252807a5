//! The slot pool: alloc + free of 1 page and of 32 pages (page size 16), on one thread and on
//! every thread at once, for the sharded `SlotPool` against one `Mutex` around the same
//! bookkeeping (free page list, per-slot state, per-page counters, whole-call validation).
//!
//! `pool/bulk_4096/*`: the cache's cycle with long runs at page size 1 (a 2^21-slot pool):
//! alloc 4096 slots, `settle` (adopt the first 3072, free the last 1024: an insert), then
//! `release_cached` of the 3072 (an eviction).
//!
//! `cargo bench --bench pool`. Multi-threaded figures: one iteration is one cycle on
//! each of the `T` threads at once (throughput in cycles per second).

use std::hint::black_box;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use radixkv::pool::SlotPool;

const PAGE: usize = 16;
const PAGES: usize = 8192;

/// The baseline: the same contract under one lock.
struct MutexPool {
    inner: Mutex<Inner>,
    page_size: usize,
}

struct Inner {
    free_pages: Vec<u32>,
    /// 0 free, 1 held (2 cached, unused here).
    state: Vec<u8>,
    /// Free slots of pages not yet whole.
    page_free: Vec<u32>,
}

impl MutexPool {
    fn new(num_slots: usize, page_size: usize) -> MutexPool {
        let pages = num_slots / page_size;
        MutexPool {
            inner: Mutex::new(Inner {
                free_pages: (0..pages as u32).rev().collect(),
                state: vec![0; num_slots],
                page_free: vec![0; pages],
            }),
            page_size,
        }
    }

    fn try_alloc(&self, n: usize, out: &mut Vec<u32>) -> bool {
        let p = self.page_size;
        assert_eq!(n % p, 0);
        let k = n / p;
        let mut g = self.inner.lock().unwrap();
        if g.free_pages.len() < k {
            return false;
        }
        for _ in 0..k {
            let page = g.free_pages.pop().unwrap() as usize;
            for s in page * p..page * p + p {
                g.state[s] = 1;
                out.push(s as u32);
            }
        }
        true
    }

    fn free(&self, slots: &[u32]) -> Result<(), u32> {
        self.change(&[(slots, 0)], 1)
    }

    /// Moves every slot of the lists from `from` to the list's target state, or none.
    fn change(&self, lists: &[(&[u32], u8)], from: u8) -> Result<(), u32> {
        let p = self.page_size;
        let mut g = self.inner.lock().unwrap();
        let g = &mut *g;
        // Validate whole: in range, `from`, not twice (marked 3 while checking, then undone).
        let mut bad = None;
        'check: for (slots, _) in lists {
            for &s in *slots {
                if g.state.get(s as usize) != Some(&from) {
                    bad = Some(s);
                    break 'check;
                }
                g.state[s as usize] = 3;
            }
        }
        if let Some(s) = bad {
            for (slots, _) in lists {
                for &t in *slots {
                    if g.state.get(t as usize) == Some(&3) {
                        g.state[t as usize] = from;
                    }
                }
            }
            return Err(s);
        }
        for &(slots, to) in lists {
            for &s in slots {
                g.state[s as usize] = to;
                if to != 0 {
                    continue;
                }
                let page = s as usize / p;
                g.page_free[page] += 1;
                if g.page_free[page] as usize == p {
                    g.page_free[page] = 0;
                    g.free_pages.push(page as u32);
                }
            }
        }
        Ok(())
    }
}

trait Pool: Sync {
    fn cycle(&self, n: usize, out: &mut Vec<u32>);
    /// Alloc `n`, settle (adopt 3/4, free 1/4), release the adopted ones.
    fn bulk_cycle(&self, n: usize, out: &mut Vec<u32>);
}

impl Pool for SlotPool {
    fn cycle(&self, n: usize, out: &mut Vec<u32>) {
        out.clear();
        assert!(self.try_alloc(n, out).unwrap());
        black_box(&out);
        self.free(out).unwrap();
    }

    fn bulk_cycle(&self, n: usize, out: &mut Vec<u32>) {
        out.clear();
        assert!(self.try_alloc(n, out).unwrap());
        let (adopt, free) = black_box(&out).split_at(n / 4 * 3);
        self.settle(adopt, free).unwrap();
        self.release_cached(adopt).unwrap();
    }
}

impl Pool for MutexPool {
    fn cycle(&self, n: usize, out: &mut Vec<u32>) {
        out.clear();
        assert!(self.try_alloc(n, out));
        black_box(&out);
        self.free(out).unwrap();
    }

    fn bulk_cycle(&self, n: usize, out: &mut Vec<u32>) {
        out.clear();
        assert!(self.try_alloc(n, out));
        let (adopt, free) = black_box(&out).split_at(n / 4 * 3);
        self.change(&[(adopt, 2), (free, 0)], 1).unwrap();
        self.change(&[(adopt, 0)], 2).unwrap();
    }
}

/// `iters` alloc + free cycles on each of `threads` threads at once; the wall time.
fn run_threads(
    pool: &dyn Pool,
    threads: usize,
    n: usize,
    iters: u64,
    cycle: fn(&dyn Pool, usize, &mut Vec<u32>),
) -> Duration {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut out = Vec::with_capacity(n);
                    barrier.wait();
                    for _ in 0..iters {
                        cycle(pool, n, &mut out);
                    }
                })
            })
            .collect();
        barrier.wait();
        let t0 = Instant::now();
        for w in workers {
            w.join().unwrap();
        }
        t0.elapsed()
    })
}

fn bench(c: &mut Criterion) {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let sharded = SlotPool::new(PAGES * PAGE, PAGE).unwrap();
    let mutex = MutexPool::new(PAGES * PAGE, PAGE);
    let pools: [(&str, &dyn Pool); 2] = [("sharded", &sharded), ("mutex", &mutex)];
    for pages in [1usize, 32] {
        let n = pages * PAGE;
        for threads in [1, all] {
            let mut g = c.benchmark_group(format!("pool/alloc_free_{pages}p/{threads}t"));
            g.throughput(Throughput::Elements(threads as u64));
            g.sample_size(20);
            g.warm_up_time(Duration::from_millis(500));
            g.measurement_time(Duration::from_secs(2));
            for (name, pool) in pools {
                g.bench_function(name, |b| {
                    if threads == 1 {
                        let mut out = Vec::with_capacity(n);
                        b.iter(|| pool.cycle(n, &mut out));
                    } else {
                        b.iter_custom(|iters| {
                            run_threads(pool, threads, n, iters, |p, n, o| p.cycle(n, o))
                        });
                    }
                });
            }
            g.finish();
        }
    }
    const BULK: usize = 4096;
    let sharded = SlotPool::new(1 << 21, 1).unwrap();
    let mutex = MutexPool::new(1 << 21, 1);
    let pools: [(&str, &dyn Pool); 2] = [("sharded", &sharded), ("mutex", &mutex)];
    for threads in [1, all] {
        let mut g = c.benchmark_group(format!("pool/bulk_{BULK}/{threads}t"));
        g.throughput(Throughput::Elements((threads * BULK) as u64));
        g.sample_size(20);
        g.warm_up_time(Duration::from_millis(500));
        g.measurement_time(Duration::from_secs(2));
        for (name, pool) in pools {
            g.bench_function(name, |b| {
                if threads == 1 {
                    let mut out = Vec::with_capacity(BULK);
                    b.iter(|| pool.bulk_cycle(BULK, &mut out));
                } else {
                    b.iter_custom(|iters| {
                        run_threads(pool, threads, BULK, iters, |p, n, o| p.bulk_cycle(n, o))
                    });
                }
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
