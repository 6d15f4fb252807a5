//! The tree alone reproduces the exact hit count of the Mooncake synthetic trace
//! (`docs/contract/CLI.md`): match, then insert, per request, in file order, unlimited capacity.

use radixkv::InsertOptions;
use radixkv::{EvictionPolicy, RadixTree, TreeConfig};
use radixkv_trace::{Trace, TraceOptions};

fn load_trace() -> Option<Vec<Vec<u32>>> {
    let path =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/traces/mooncake_synthetic_trace.jsonl");
    let trace = Trace::load(path, TraceOptions::default()).ok()?;
    Some(trace.iter().map(|r| r.tokens).collect())
}

fn replay(reqs: &[Vec<u32>], page: usize, lock: bool) -> (u64, u64) {
    let t = RadixTree::new(TreeConfig {
        page_size: page,
        policy: EvictionPolicy::Lru,
        ..Default::default()
    })
    .unwrap();
    let (mut hit, mut total) = (0u64, 0u64);
    let mut out: Vec<u32> = Vec::new();
    let mut next_slot = 0u32;
    for r in reqs {
        total += r.len() as u64;
        let slots: Vec<u32> = (next_slot..next_slot + r.len() as u32).collect();
        next_slot += r.len() as u32;
        if lock {
            let g = t.match_and_lock(0, r, &mut out);
            hit += out.len() as u64;
            let (_, g2) = t.insert_and_lock(0, r, &slots, InsertOptions::default()).unwrap();
            drop(g);
            drop(g2);
        } else {
            hit += t.match_prefix(0, r, &mut out) as u64;
            t.insert(0, r, &slots).unwrap();
        }
    }
    let census = t.check_invariants().unwrap();
    assert_eq!(census.pinned_tokens, 0);
    (hit, total)
}

#[test]
fn mooncake_trace_hits_exactly() {
    let Some(reqs) = load_trace() else {
        panic!("shared/traces/mooncake_synthetic_trace.jsonl is missing");
    };
    assert_eq!(reqs.len(), 3993);
    assert_eq!(replay(&reqs, 1, false), (39_852_661, 61_194_628));
    assert_eq!(replay(&reqs, 1, true), (39_852_661, 61_194_628));
    assert_eq!(replay(&reqs, 16, false).0, 39_850_976);
}

/// The trace replayed by several threads at once (each takes every k-th request), then
/// checked: the tree holds exactly the union of all requests, whatever the interleaving.
#[test]
fn mooncake_trace_concurrent_replay() {
    let reqs = load_trace().expect("trace");
    let single = RadixTree::new(TreeConfig::default()).unwrap();
    for (i, r) in reqs.iter().enumerate() {
        single.insert(0, r, &vec![i as u32; r.len()]).unwrap();
    }
    let want = single.check_invariants().unwrap().cached_tokens;
    for threads in [2usize, 4] {
        for round in 0..3 {
            let t = RadixTree::new(TreeConfig::default()).unwrap();
            std::thread::scope(|s| {
                for k in 0..threads {
                    let (t, reqs) = (&t, &reqs);
                    s.spawn(move || {
                        let mut out: Vec<u32> = Vec::new();
                        for (i, r) in
                            reqs.iter().enumerate().skip((k + round) % threads).step_by(threads)
                        {
                            t.match_prefix(0, r, &mut out);
                            t.insert(0, r, &vec![i as u32; r.len()]).unwrap();
                        }
                    });
                }
            });
            let c = t.check_invariants().unwrap();
            assert_eq!(c.cached_tokens, want, "{threads} threads");
        }
    }
}
