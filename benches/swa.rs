//! The sliding-window (SWA) component side by side, in one run: the lock-free `RadixTree`
//! with `swa_window` (`src/tree/swa.rs`) against the sequential `HybridTree` with `[FULL,
//! SWA]` (SGLang's `UnifiedRadixCache` tree, what `rkv_hybrid` and the SGLang tree core run),
//! each serving the Mooncake trace through the scheduler's loop: match and lock, allocate the
//! rest from a full-KV pool of `CAP` slots (evicting full KV when short), insert, keep the
//! SWA KV within `SWA_CAP` tokens (evicting SWA KV when over), unlock. One thread, then two
//! threads on one shared tree (the hybrid tree behind a mutex, as its fronts hold it; the
//! pool a mutex-held free list for both).
//!
//! `cargo bench --bench swa` (env: `RADIXKV_BENCH_RUNS`, default 5 rounds, medians;
//! `RADIXKV_SWA_WINDOW`, default 4096; `RADIXKV_SWA_CAP`, default 2,000,000 full slots and
//! 1,600,000 SWA tokens). The two trees' hits differ by design (`docs/spec.md`, "A sliding
//! window in the lock-free tree": no revival of a tombstone on insert); both are printed.

use std::sync::Mutex;
use std::time::Instant;

use radixkv::hybrid::{CacheAction, Component, HybridOptions, HybridTree};
use radixkv::{EvictTarget, EvictionPolicy, RadixTree, TreeConfig};
use radixkv_trace::{Trace, TraceOptions};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn requests() -> Vec<Vec<u32>> {
    let path =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/traces/mooncake_synthetic_trace.jsonl");
    let trace = Trace::load(path, TraceOptions::default()).expect("the Mooncake trace");
    trace.iter().map(|r| r.tokens).collect()
}

/// The full-KV pool: free slots.
struct Pool(Mutex<Vec<u32>>);

impl Pool {
    fn new(cap: usize) -> Pool {
        Pool(Mutex::new((0..cap as u32).rev().collect()))
    }
    fn take(&self, n: usize) -> Option<Vec<u32>> {
        let mut f = self.0.lock().unwrap();
        let len = f.len();
        (len >= n).then(|| f.split_off(len - n))
    }
    fn give(&self, s: impl IntoIterator<Item = u32>) {
        self.0.lock().unwrap().extend(s);
    }
    fn free(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

struct Limits {
    window: usize,
    cap: usize,
    swa_cap: usize,
}

/// The loop on the lock-free tree over `reqs`; returns the tokens hit and the SWA tokens
/// evicted.
fn lockfree_run(t: &RadixTree, pool: &Pool, lim: &Limits, reqs: &[&Vec<u32>]) -> (u64, u64) {
    let (mut hits, mut swa_out) = (0u64, 0u64);
    let mut out: Vec<u32> = Vec::new();
    let mut give = |f: radixkv::Freed, s: &[u32]| {
        if f.full {
            pool.give(s.iter().copied())
        }
    };
    for r in reqs {
        let l = t.match_and_lock(0, &r[..], &mut out).into_raw();
        let m = l.len();
        hits += m as u64;
        let need = r.len() - m;
        let fresh = loop {
            if let Some(f) = pool.take(need) {
                break f;
            }
            let short = need - pool.free().min(need);
            if t.evict_kv(EvictTarget::Full, short.max(1), &mut give) == 0 && pool.free() < need {
                break Vec::new(); // nothing more to evict: skip this request
            }
        };
        if fresh.len() == need {
            let mut slots = out.clone();
            slots.extend_from_slice(&fresh);
            let e = t.insert(0, &r[..], &slots).unwrap();
            // Not adopted: the duplicates past the valid match.
            pool.give(slots[m..e.max(m)].iter().copied());
            let over = t.stats().swa_cached_tokens.saturating_sub(lim.swa_cap as u64);
            if over > 0 {
                swa_out += t.evict_kv(EvictTarget::Swa, over as usize, &mut give) as u64;
            }
        }
        t.release(l).unwrap();
    }
    (hits, swa_out)
}

/// The loop on the hybrid tree over `reqs`; returns the tokens hit and the SWA tokens
/// evicted.
fn hybrid_run(t: &Mutex<HybridTree>, pool: &Pool, lim: &Limits, reqs: &[&Vec<u32>]) -> (u64, u64) {
    let (mut hits, mut swa_out) = (0u64, 0u64);
    let mut freed = Vec::new();
    let give_back = |freed: &mut Vec<radixkv::hybrid::Freed>| {
        for f in freed.drain(..) {
            if f.component == Component::Full {
                pool.give(f.indices.iter().map(|&i| i as u32));
            }
        }
    };
    for r in reqs {
        let key: Vec<i64> = r.iter().map(|&x| x as i64).collect();
        let (m, node, prefix) = {
            let mut g = t.lock().unwrap();
            let mm = g.match_prefix(0, &key);
            g.inc_lock_ref(mm.last_device_node).unwrap();
            let prefix: Vec<i64> = g
                .collect_indices(mm.last_device_node, g.root())
                .unwrap()
                .iter()
                .flat_map(|s| s.iter().copied())
                .collect();
            (mm.device_prefix_len, mm.last_device_node, prefix)
        };
        hits += m as u64;
        let need = r.len() - m;
        let fresh = loop {
            if let Some(f) = pool.take(need) {
                break f;
            }
            let short = need - pool.free().min(need);
            let n = t.lock().unwrap().evict(Component::Full, short.max(1) as u64, &mut freed);
            give_back(&mut freed);
            if n.unwrap() == 0 && pool.free() < need {
                break Vec::new();
            }
        };
        let mut g = t.lock().unwrap();
        if fresh.len() == need {
            let mut values = prefix;
            values.extend(fresh.iter().map(|&s| s as i64));
            let ins = g.insert_swa(0, &key, Some(&values), m, 0).unwrap();
            for a in &ins.actions {
                match a {
                    CacheAction::SwaRebuild { node, full } => {
                        g.swa_set_value(*node, full.clone()).unwrap()
                    }
                    CacheAction::FreeDeviceKv(v) | CacheAction::FreeDeviceKvFullOnly(v) => {
                        pool.give(v.iter().map(|&i| i as u32))
                    }
                    CacheAction::RecoverSwaWithLockedFull { incoming, .. } => {
                        pool.give(incoming.iter().map(|&i| i as u32))
                    }
                }
            }
            if !ins.refreshed {
                g.swa_refresh(ins.node).unwrap();
            }
            let s = g.swa_sizes();
            let over = (s.evictable + s.protected).saturating_sub(lim.swa_cap as u64);
            if over > 0 {
                swa_out += g.evict(Component::Swa, over, &mut freed).unwrap();
                give_back(&mut freed);
            }
        }
        g.dec_lock_ref(node).unwrap();
    }
    (hits, swa_out)
}

/// Splits `reqs` into `threads` interleaved shares and runs `f` on each, in parallel.
fn split<'a, F: Fn(&[&'a Vec<u32>]) -> (u64, u64) + Sync>(
    reqs: &'a [Vec<u32>],
    threads: usize,
    f: F,
) -> (u64, u64) {
    let shares: Vec<Vec<&Vec<u32>>> =
        (0..threads).map(|i| reqs.iter().skip(i).step_by(threads).collect()).collect();
    std::thread::scope(|s| {
        let hs: Vec<_> = shares.iter().map(|sh| s.spawn(|| f(sh))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let runs = env("RADIXKV_BENCH_RUNS", 5);
    let lim = Limits {
        window: env("RADIXKV_SWA_WINDOW", 4096),
        cap: env("RADIXKV_SWA_CAP", 2_000_000),
        swa_cap: env("RADIXKV_SWA_CAP", 2_000_000) * 4 / 5,
    };
    let reqs = requests();
    println!(
        "SWA replay: {} requests, window {}, full pool {}, SWA cap {}, {runs} rounds (medians)",
        reqs.len(),
        lim.window,
        lim.cap,
        lim.swa_cap
    );
    for threads in [1usize, 2] {
        let (mut lf, mut hy) = (Vec::new(), Vec::new());
        let (mut lf_hits, mut hy_hits) = ((0, 0), (0, 0));
        for round in 0..=runs {
            let t = RadixTree::new(TreeConfig {
                page_size: 1,
                policy: EvictionPolicy::Lru,
                swa_window: lim.window,
                ..Default::default()
            })
            .unwrap();
            let pool = Pool::new(lim.cap);
            let t0 = Instant::now();
            lf_hits = split(&reqs, threads, |sh| lockfree_run(&t, &pool, &lim, sh));
            let a = t0.elapsed().as_secs_f64();
            t.check_invariants().unwrap();
            drop(t);
            let h = Mutex::new(
                HybridTree::new(HybridOptions { swa_window: lim.window, ..Default::default() })
                    .unwrap(),
            );
            let pool = Pool::new(lim.cap);
            let t0 = Instant::now();
            hy_hits = split(&reqs, threads, |sh| hybrid_run(&h, &pool, &lim, sh));
            let b = t0.elapsed().as_secs_f64();
            assert_eq!(h.lock().unwrap().check(), None);
            if round > 0 {
                lf.push(a);
                hy.push(b); // round 0 warms up
            }
        }
        let (a, b) = (median(lf), median(hy));
        println!(
            "{threads} thread(s): lock-free tree {a:.3} s ({} tokens hit, {} SWA tokens \
             evicted), hybrid tree behind a mutex {b:.3} s ({} hit, {} SWA evicted): {:.2}x",
            lf_hits.0,
            lf_hits.1,
            hy_hits.0,
            hy_hits.1,
            b / a
        );
    }
}
