//! Memory: nodes replaced by splits (and evicted ones) are freed through the epoch at
//! once, even when the eviction queue never pops their stale entries. Measured with a
//! counting global allocator (this test binary only).

use std::sync::Mutex;

use radixkv::{RadixTree, TreeConfig};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::Counting;

#[global_allocator]
static A: Counting = Counting;

/// The tests count the process's live bytes: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn collect_garbage() {
    for _ in 0..256 {
        crossbeam_epoch::pin().flush();
    }
}

#[test]
fn split_nodes_are_freed_without_eviction() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let n = 1_000_000u32;
    let toks: Vec<u32> = (0..n).collect();
    let mut out: Vec<u32> = Vec::with_capacity(n as usize);
    let t = RadixTree::new(TreeConfig::default()).unwrap();
    collect_garbage();
    let before = counting_alloc::live();
    t.insert(0, &toks, &toks).unwrap();
    // Split the 1M-token leaf 8 times (each split copies what is left into new nodes).
    for cut in [500_000usize, 250_000, 125_000, 62_500, 31_250, 15_625, 7_812, 3_906] {
        let g = t.match_and_lock(0, &toks[..cut], &mut out);
        assert_eq!(g.len(), cut);
    }
    collect_garbage();
    let live = counting_alloc::live() - before;
    let census = t.check_invariants().unwrap();
    assert_eq!(census.nodes, 9);
    // The tree itself holds 8 bytes per token; the replaced nodes (another 8 bytes per
    // token each time) must be gone.
    assert!(
        (live as u64) < census.heap_bytes + census.heap_bytes / 8,
        "{live} bytes live for a tree of {} heap bytes",
        census.heap_bytes
    );
}

#[test]
fn reclaim_frees_what_eviction_unlinked() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = RadixTree::new(TreeConfig::default()).unwrap();
    collect_garbage();
    let before = counting_alloc::live();
    // 2,000 leaves of 1,000 tokens under the root: 8 MB of tokens (the slots are runs).
    for i in 0..2_000u32 {
        let toks: Vec<u32> = (i * 1_000..(i + 1) * 1_000).collect();
        t.insert(0, &toks, &toks).unwrap();
    }
    let full = counting_alloc::live() - before;
    assert!(full > 8_000_000, "{full} bytes for 2M tokens (slots stored as runs)");
    assert_eq!(t.evict(usize::MAX, &mut |_| {}), 2_000_000);
    // Nothing else pins this thread from here: only `reclaim` can free the unlinked nodes
    // and tables (each call runs a bounded batch, so it takes a few).
    let live = || counting_alloc::live() - before;
    let mut calls = 0;
    while live() > full / 32 && calls < 1_000 {
        t.reclaim();
        calls += 1;
    }
    assert!(live() <= full / 32, "{} of {full} bytes still live after {calls} reclaims", live());
    assert!(calls > 0);
    assert_eq!(t.stats().cached_tokens, 0);
}

/// A million namespaces (8 tokens each, one leaf under each root), all evicted: every root,
/// map entry and table comes back (through the epoch), so the tree's memory returns to
/// about what the empty tree had. Counts live bytes, not time: each namespace costs its
/// root, its map entry, one child table and one leaf while it lives.
#[test]
fn a_million_namespaces_are_reclaimed_when_emptied() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let n: u64 = if cfg!(debug_assertions) { 100_000 } else { 1_000_000 };
    collect_garbage();
    let before = counting_alloc::live();
    let t = RadixTree::new(TreeConfig::default()).unwrap();
    collect_garbage();
    let empty = counting_alloc::live();
    let toks: Vec<u32> = (0..8).collect();
    let t0 = std::time::Instant::now();
    for ns in 0..n {
        let slots: Vec<u32> = (0..8).map(|i| (ns as u32).wrapping_mul(8) + i).collect();
        assert_eq!(t.insert(ns, &toks, &slots).unwrap(), 0);
    }
    let s = t.stats();
    assert_eq!((s.namespaces, s.nodes, s.cached_tokens), (n, n, 8 * n));
    collect_garbage();
    let full = counting_alloc::live() - empty;
    let per_ns = full as u64 / n;
    println!(
        "{n} namespaces: {full} bytes live, {per_ns} bytes per namespace ({:?})",
        t0.elapsed()
    );
    let t0 = std::time::Instant::now();
    // A root (a node), a map entry, a one-child table, a leaf with 8 tokens and one base
    // slot, its eviction ticket and queue entry, and map buckets: a few hundred bytes.
    assert!(per_ns < 600, "{per_ns} bytes per live namespace");
    assert_eq!(t.evict(usize::MAX, &mut |_| {}), 8 * n as usize);
    assert_eq!(t.stats().namespaces, 0);
    assert_eq!(t.check_invariants().unwrap().namespaces, 0);
    println!("evicted ({:?})", t0.elapsed());
    let t0 = std::time::Instant::now();
    // Free what the epoch holds (bounded batches per call: loop until the live bytes stop
    // going down; the epoch's own bookkeeping allocates a little as it goes).
    let live = || counting_alloc::live();
    let mut low = live();
    let mut calls = 0;
    loop {
        for _ in 0..256 {
            t.reclaim();
        }
        calls += 256;
        let now = live();
        if now >= low || calls > 1_000_000 {
            break;
        }
        low = now;
    }
    let left = live() - empty;
    println!(
        "after evicting all: {left} bytes more than the empty tree ({calls} reclaims, {:?})",
        t0.elapsed()
    );
    assert!(left < 64 * 1024, "{left} bytes left of {full} once every namespace went");
    drop(t);
    collect_garbage();
    assert!(live() - before < 64 * 1024, "{} bytes left after drop", live() - before);
}
