//! Namespaces at the scale of real tenancy: what n distinct namespaces cost.
//!
//! `cargo run --release --example namespaces [N...]` (default 10000 100000 1000000). For
//! each N, through the Rust API on one thread:
//!
//! - **replay**: N requests, each in a namespace of its own, 8 tokens each, the way the
//!   replay engine runs a request (`match_and_lock`, `insert` of the uncached rest,
//!   release), on a cache without a pool; the total time, and per request;
//! - **insert latency**: the same N inserts into a fresh tree, each timed on its own
//!   (p50 / p99 / p99.9 / max): the cost of creating the n-th namespace;
//! - **memory**: live heap bytes (a counting allocator) per live namespace, and what is left
//!   over the empty tree once every namespace is evicted and the epoch has freed what it
//!   held.
//!
//! Numbers go to BENCHMARKS.md ("Namespaces").

use std::time::Instant;

use radixkv::{Cache, CacheOptions, RadixTree, TreeConfig};

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{Counting, live};

#[global_allocator]
static A: Counting = Counting;

/// Runs `reclaim` until the live bytes stop going down (the epoch frees bounded batches;
/// its own bookkeeping allocates a little as it goes, so "no change" may never come).
fn settle(t: &RadixTree) {
    let mut low = live();
    for _ in 0..100_000 {
        for _ in 0..256 {
            t.reclaim();
        }
        let now = live();
        if now >= low {
            return;
        }
        low = now;
    }
}

fn replay(n: u64) -> f64 {
    let cache = Cache::new(CacheOptions::default()).unwrap();
    let toks: Vec<u32> = (0..8).collect();
    let mut out: Vec<u32> = Vec::new();
    let mut next = 0u32;
    let t0 = Instant::now();
    for ns in 0..n {
        let lock = cache.match_and_lock(ns, &toks, &mut out);
        let hit = lock.len();
        let slots: Vec<u32> = (next..next + 8).collect();
        next += 8;
        cache.insert(ns, &toks[..], &slots).unwrap();
        assert_eq!(hit, 0);
        drop(lock);
    }
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(cache.stats().tree.namespaces, n);
    secs
}

fn main() {
    let sizes: Vec<u64> = {
        let a: Vec<u64> = std::env::args().skip(1).map(|s| s.parse().expect("a count")).collect();
        if a.is_empty() { vec![10_000, 100_000, 1_000_000] } else { a }
    };
    println!("namespaces: one thread, 8 tokens per namespace, page size 1");
    let mut base: Option<(u64, f64)> = None;
    for &n in &sizes {
        let secs = replay(n);
        let (n0, s0) = *base.get_or_insert((n, secs));
        println!(
            "replay {n:>9} requests in distinct namespaces: {secs:8.3} s ({:6.0} ns/request; {:.2}x linear from {n0})",
            secs * 1e9 / n as f64,
            (secs / s0) / (n as f64 / n0 as f64)
        );
    }
    for &n in &sizes {
        // Room for the latencies first, so the memory figures count the tree alone.
        let mut lat = Vec::with_capacity(n as usize);
        let toks: Vec<u32> = (0..8).collect();
        let scratch = RadixTree::new(TreeConfig::default()).unwrap();
        settle(&scratch); // what earlier rounds left to the epoch
        drop(scratch);
        let before = live();
        let t = RadixTree::new(TreeConfig::default()).unwrap();
        settle(&t);
        let empty = live();
        for ns in 0..n {
            let slots: Vec<u32> = (0..8).map(|i| (ns as u32).wrapping_mul(8) + i).collect();
            let t0 = Instant::now();
            t.insert(ns, &toks, &slots).unwrap();
            lat.push(t0.elapsed().as_nanos() as u64);
        }
        lat.sort_unstable();
        let q = |f: f64| lat[((lat.len() as f64 * f) as usize).min(lat.len() - 1)];
        settle(&t);
        let full = live() - empty;
        assert_eq!(t.evict(usize::MAX, &mut |_| {}), 8 * n as usize);
        settle(&t);
        let left = live() - empty;
        assert_eq!(t.stats().namespaces, 0);
        println!(
            "insert into the n-th new namespace, n <= {n:>9}: p50 {} ns, p99 {} ns, p99.9 {} ns, max {} ns",
            q(0.50),
            q(0.99),
            q(0.999),
            lat[lat.len() - 1]
        );
        println!(
            "  memory: empty tree {} B, {n} live namespaces {} B ({} B each), all evicted {} B over the empty tree",
            empty - before,
            full,
            full / n as isize,
            left
        );
    }
}
