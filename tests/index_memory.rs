//! `RadixTree::memory_bytes` against what the allocator really handed out: a counting
//! global allocator (this test binary only) measures the live bytes a tree adds, and the
//! walk's estimate must agree with them closely (the CLI reports it as the index's cost).

use std::sync::Mutex;

use radixkv::{Cache, CacheOptions, EvictionPolicy, RadixTree, TreeConfig};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{Counting, live};

#[global_allocator]
static A: Counting = Counting;

/// The tests count the process's live bytes: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn collect_garbage(t: &RadixTree) {
    for _ in 0..512 {
        t.reclaim();
        crossbeam_epoch::pin().flush();
    }
}

/// The estimate of `t`, less `base` (what the tree held when `real` started counting),
/// within 1% (and 4 KiB) of `real`, once the eviction index's tickets are counted as asked
/// for (8 bytes; the estimate counts 16, the allocator's rounding).
fn close(t: &RadixTree, base: usize, real: isize, what: &str) {
    let est = t.memory_bytes() - base;
    let asked = est as f64 - 8.0 * t.eviction_queue_len() as f64;
    let r = real as f64;
    assert!(
        (asked - r).abs() <= r * 0.01 + 4096.0,
        "{what}: estimate {est} B ({asked} B asked for), allocator {real} B"
    );
    eprintln!("{what}: estimate {est} B ({asked} B asked for), allocator {real} B");
}

#[test]
fn memory_bytes_matches_the_allocator() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Slots one per token (scattered), runs (consecutive), several namespaces, splits.
    for scattered in [false, true] {
        let t = RadixTree::new(TreeConfig {
            page_size: 1,
            policy: EvictionPolicy::Lru,
            ..Default::default()
        })
        .unwrap();
        t.reclaim();
        let before = live();
        // An empty tree holds the namespace map's shards and their first tables.
        let empty = t.memory_bytes();
        assert!(empty < 64 * 1024, "an empty tree: {empty} bytes");
        let mut out: Vec<u32> = Vec::new();
        for ns in 0..4u64 {
            for conv in 0..300u32 {
                let shared: Vec<u32> = (0..200).collect();
                for turn in 1..=3u32 {
                    let mut toks = shared.clone();
                    toks.extend((0..turn * 50).map(|i| 1_000_000 + conv * 1_000 + i));
                    let slots: Vec<u32> = if scattered {
                        toks.iter().map(|&x| x.wrapping_mul(2_654_435_761)).collect()
                    } else {
                        toks.clone()
                    };
                    t.insert(ns, &toks, &slots).unwrap();
                    // A split inside the conversation's last edge.
                    let g = t.match_and_lock(ns, &toks[..toks.len() - 7], &mut out);
                    drop(g);
                }
            }
        }
        collect_garbage(&t);
        let real = live() - before;
        let est = t.memory_bytes();
        close(&t, empty, real, if scattered { "scattered slots" } else { "slot runs" });
        // Evicting half gives back what the walk no longer counts.
        let cached = t.stats().cached_tokens as usize;
        t.evict(cached / 2, &mut |_| {});
        collect_garbage(&t);
        close(&t, empty, live() - before, "after evicting half");
        assert!(t.memory_bytes() < est);
    }
}

#[test]
fn a_cache_reports_its_tree() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cache::new(CacheOptions {
        page_size: 4,
        policy: EvictionPolicy::Lru,
        pool_slots: 0,
        ..Default::default()
    })
    .unwrap();
    let toks: Vec<u32> = (0..4_096).collect();
    let empty = c.tree().memory_bytes();
    c.insert(0, &toks, &toks).unwrap();
    let b = c.tree().memory_bytes() - empty;
    // Slots in one run: well under the 8 bytes per token of tokens plus slots each.
    assert!(b > 4 * 4_096 && b < 8 * 4_096 + 4_096, "{b}");
}

/// The Mooncake trace (beside the checkout, in `shared/`), cached whole: the walk's
/// estimate against the allocator on a real workload. Slots are handed out from a counter,
/// as the CLI's unlimited replay does.
#[test]
fn memory_bytes_on_the_mooncake_trace() {
    let path =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/traces/mooncake_synthetic_trace.jsonl");
    // The trace sits beside the checkout (as for the CLI tests); a missing one is a failure,
    // not a skip.
    assert!(std::path::Path::new(path).exists(), "{path} not found (the shared traces)");
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let trace = radixkv_trace::Trace::load(path, Default::default()).unwrap();
    let t = RadixTree::new(TreeConfig::default()).unwrap();
    t.reclaim();
    let mut out: Vec<u32> = Vec::new();
    let mut next = 0u32;
    let mut slots = Vec::new();
    let empty = t.memory_bytes();
    let before = live();
    for r in trace.iter() {
        let m = t.match_prefix(r.namespace, &r.tokens, &mut out);
        slots.clear();
        slots.extend(std::iter::repeat_n(0, m));
        slots.extend(next..next + (r.tokens.len() - m) as u32);
        next += (r.tokens.len() - m) as u32;
        t.insert(r.namespace, &r.tokens, &slots).unwrap();
        // The request's tokens and slot buffers are freed here; only the tree stays.
    }
    drop(slots);
    drop(out);
    collect_garbage(&t);
    let real = live() - before;
    assert_eq!(t.stats().cached_tokens, 21_341_967);
    close(&t, empty, real, "Mooncake trace");
}
