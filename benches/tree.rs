//! Micro-benchmarks of the tree on the Mooncake synthetic trace: match and replay (match +
//! insert), on 1 thread and on all cores, against a `Mutex`-wrapped tree used sequentially
//! (the way engines share their prefix index today), in the same run.
//!
//! `cargo bench --bench tree`

use std::sync::Mutex;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use radixkv::{EvictionPolicy, RadixTree, TreeConfig};
use radixkv_trace::{Trace, TraceOptions};

/// The trace's requests as tokens (docs/contract/CLI.md's materialization, block size 512).
fn requests() -> Vec<Vec<u32>> {
    let path =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/traces/mooncake_synthetic_trace.jsonl");
    let trace = Trace::load(path, TraceOptions::default()).expect("the Mooncake trace");
    trace.iter().map(|r| r.tokens).collect()
}

fn new_tree() -> RadixTree {
    RadixTree::new(TreeConfig { page_size: 1, policy: EvictionPolicy::Lru, ..Default::default() })
        .unwrap()
}

fn filled(reqs: &[Vec<u32>]) -> RadixTree {
    let t = new_tree();
    let mut next = 0u32;
    for r in reqs {
        let slots: Vec<u32> = (next..next + r.len() as u32).collect();
        next += r.len() as u32;
        t.insert(0, r, &slots).unwrap();
    }
    t
}

/// Runs `f` over the requests split into `threads` contiguous shares, one thread each.
fn split<F: Fn(&[Vec<u32>]) + Sync>(reqs: &[Vec<u32>], threads: usize, f: F) {
    let chunk = reqs.len().div_ceil(threads);
    std::thread::scope(|s| {
        for part in reqs.chunks(chunk) {
            let f = &f;
            s.spawn(move || f(part));
        }
    });
}

fn bench(c: &mut Criterion) {
    let reqs = requests();
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let tree = filled(&reqs);
    let locked = Mutex::new(filled(&reqs));

    let mut g = c.benchmark_group("match_trace");
    g.sample_size(10);
    for threads in [1, n] {
        g.bench_function(format!("radixkv/{threads}t"), |b| {
            b.iter(|| {
                split(&reqs, threads, |part| {
                    let mut out: Vec<u32> = Vec::new();
                    for r in part {
                        tree.match_prefix(0, r, &mut out);
                    }
                })
            })
        });
        g.bench_function(format!("mutex_tree/{threads}t"), |b| {
            b.iter(|| {
                split(&reqs, threads, |part| {
                    let mut out: Vec<u32> = Vec::new();
                    for r in part {
                        locked.lock().unwrap().match_prefix(0, r, &mut out);
                    }
                })
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("replay_trace");
    g.sample_size(10);
    for threads in [1, n] {
        g.bench_function(format!("radixkv/{threads}t"), |b| {
            b.iter_batched(
                new_tree,
                |t| {
                    split(&reqs, threads, |part| {
                        let mut out: Vec<u32> = Vec::new();
                        for (i, r) in part.iter().enumerate() {
                            t.match_prefix(0, r, &mut out);
                            let slots = vec![i as u32; r.len()];
                            t.insert(0, r, &slots).unwrap();
                        }
                    });
                    t
                },
                BatchSize::PerIteration,
            )
        });
        g.bench_function(format!("mutex_tree/{threads}t"), |b| {
            b.iter_batched(
                || Mutex::new(new_tree()),
                |t| {
                    split(&reqs, threads, |part| {
                        let mut out: Vec<u32> = Vec::new();
                        for (i, r) in part.iter().enumerate() {
                            let guard = t.lock().unwrap();
                            guard.match_prefix(0, r, &mut out);
                            let slots = vec![i as u32; r.len()];
                            guard.insert(0, r, &slots).unwrap();
                        }
                    });
                    t
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
