//! The child side: each measurement runs in a process of its own (`--measure SPEC`), so no
//! contestant inherits another's heap (freed but kept pages, fragmentation, glibc arenas of
//! finished threads) or epoch garbage. It prints one line `RESULT <json>` of raw samples.

use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use crate::trace::{self, Branching, Req};
use crate::util::*;
use crate::work::*;
use radixkv::{InsertOptions, SlotRun};

pub struct Ctx {
    pub runs: usize,
    pub threads: usize,
    pub trace: String,
    pub branching: Branching,
    pub mix_requests: usize,
    /// Shuffle the requests' slots (`--scatter-slots`).
    pub scatter_slots: bool,
}

pub const CAPACITY: usize = 2_000_000;

/// The slots `w4b`'s build gave leaf `i` (the leaves' keys are all as long, their slots
/// handed out in order).
fn slots_of(keys: &[Vec<u32>], i: usize) -> Vec<u32> {
    let len = keys[i].len();
    ((i * len) as u32..((i + 1) * len) as u32).collect()
}

fn mooncake(ctx: &Ctx, page: usize) -> (Vec<Req>, Vec<u32>) {
    let mut reqs = trace::mooncake(&ctx.trace);
    let slots = slot_array(ctx, &mut reqs, page);
    (reqs, slots)
}

/// One fresh slot per token, request after request (runs, as a fresh pool hands them out),
/// or, with `--scatter-slots`, as a pool of `page`-slot pages hands them out after much
/// churn: whole pages in a fixed random order (single slots at page 1).
fn slot_array(ctx: &Ctx, reqs: &mut [Req], page: usize) -> Vec<u32> {
    let mut slots = trace::slot_array(reqs);
    if ctx.scatter_slots {
        assert!(
            trace::SLOT_ALIGN.is_multiple_of(page),
            "page {page} does not divide the alignment"
        );
        // Fisher-Yates over pages with a fixed seed: every run sees the same permutation.
        let mut rng = Rng::new(7);
        let pages = slots.len() / page;
        for i in (1..pages).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            for k in 0..page {
                slots.swap(i * page + k, j * page + k);
            }
        }
    }
    for r in reqs.iter_mut() {
        r.set_runs(&slots);
    }
    slots
}

fn who_page(spec: &[String]) -> (Who, usize) {
    let w = Who::from_key(&spec[1]).unwrap_or_else(|| panic!("unknown contestant {}", spec[1]));
    (w, spec[2].parse().expect("a page size"))
}

pub fn measure(ctx: &Ctx, spec: &[String]) -> Value {
    match spec[0].as_str() {
        "w1" => {
            let (w, page) = who_page(spec);
            let (reqs, slots) = mooncake(ctx, page);
            let mut times = Vec::new();
            let mut hits = Vec::new();
            // One untimed warm-up run first.
            for run in 0..=ctx.runs {
                let b = w.build(page, false);
                let (h, s) = time(|| replay(b.idx(), &reqs, &slots));
                drop(b);
                if run > 0 {
                    times.push(s);
                    hits.push(h);
                }
            }
            json!({ "times": times, "hits": hits })
        }
        "w1-floor" => {
            // The least a replay can take in any index that keeps the tokens it caches (as
            // every exact peer does): read every query token once, and copy every token not
            // cached yet (past the request's cached prefix in file order, found by an untimed
            // radixkv replay) into memory kept until the end. No lookup, no structure.
            let (reqs, slots) = mooncake(ctx, 1);
            let tree = radixkv::RadixTree::new(radixkv::TreeConfig::default()).unwrap();
            let mut out: Vec<u32> = Vec::new();
            let cached: Vec<usize> = reqs
                .iter()
                .map(|r| {
                    let m = tree.match_prefix(r.ns, &r.tokens, &mut out);
                    tree.insert(r.ns, &r.tokens, r.slots(&slots)).unwrap();
                    m
                })
                .collect();
            drop(tree);
            let mut times = Vec::new();
            for run in 0..=ctx.runs {
                let (kept, s) = time(|| {
                    let mut kept: Vec<Vec<u32>> = Vec::with_capacity(reqs.len());
                    let mut sum = 0u32;
                    for (r, &m) in reqs.iter().zip(&cached) {
                        sum = r.tokens.iter().fold(sum, |a, &x| a.wrapping_add(x));
                        kept.push(r.tokens[m..].to_vec());
                    }
                    std::hint::black_box(sum);
                    kept
                });
                drop(kept);
                if run > 0 {
                    times.push(s);
                }
            }
            json!({ "times": times })
        }
        "w2-floor-edges" => {
            // Diagnostic (not in the tables): the least an exact match over the full tree must
            // read, with a perfect cache. Every query token once (the `w2-floor` row), plus
            // every distinct cached token once: the tokens each request adds to the tree (past
            // its cached prefix in file order, found by an untimed radixkv replay), copied
            // into one buffer as an index would store them. Timed: one pass over both, 1
            // thread. A real match reads a shared prefix's edges again whenever they have
            // left the cache, so it can only read more than this.
            let (reqs, slots) = mooncake(ctx, 1);
            let tree = radixkv::RadixTree::new(radixkv::TreeConfig::default()).unwrap();
            let mut out: Vec<u32> = Vec::new();
            let mut stored: Vec<u32> = Vec::new();
            for r in &reqs {
                let m = tree.match_prefix(r.ns, &r.tokens, &mut out);
                tree.insert(r.ns, &r.tokens, r.slots(&slots)).unwrap();
                stored.extend_from_slice(&r.tokens[m..]);
            }
            drop(tree);
            let (mut query, mut both) = (Vec::new(), Vec::new());
            for run in 0..=ctx.runs {
                let (a, s1) = time(|| read_all(&reqs, 1));
                let (b, s2) = time(|| {
                    let q = read_all(&reqs, 1);
                    let e = stored.iter().fold(0u32, |a, &x| a.wrapping_add(x));
                    std::hint::black_box(q.wrapping_add(e))
                });
                std::hint::black_box((a, b));
                if run > 0 {
                    query.push(s1);
                    both.push(s2);
                }
            }
            json!({ "query": query, "query_and_stored": both, "stored_tokens": stored.len() })
        }
        "w2-warm" => {
            // Diagnostic (not in the tables): how much of a match is waiting for memory. Each
            // request is looked up twice in a row on a full radixkv tree (slots as runs): the
            // first time cold, as workload 2 does, the second with its query and edges still in
            // cache; then its query is summed again, warm. Sums over all requests, per run.
            let (reqs, slots) = mooncake(ctx, 1);
            let tree = radixkv::RadixTree::new(radixkv::TreeConfig::default()).unwrap();
            for r in &reqs {
                tree.insert(r.ns, &r.tokens, r.slots(&slots)).unwrap();
            }
            let mut runs: Vec<SlotRun> = Vec::new();
            let (mut cold, mut warm, mut sum_warm) = (Vec::new(), Vec::new(), Vec::new());
            for run in 0..=ctx.runs {
                let mut t = [0.0f64; 3];
                for r in &reqs {
                    let t0 = std::time::Instant::now();
                    std::hint::black_box(tree.match_prefix(r.ns, &r.tokens, &mut runs));
                    let t1 = std::time::Instant::now();
                    std::hint::black_box(tree.match_prefix(r.ns, &r.tokens, &mut runs));
                    let t2 = std::time::Instant::now();
                    std::hint::black_box(r.tokens.iter().fold(0u32, |a, &x| a.wrapping_add(x)));
                    let t3 = std::time::Instant::now();
                    t[0] += (t1 - t0).as_secs_f64();
                    t[1] += (t2 - t1).as_secs_f64();
                    t[2] += (t3 - t2).as_secs_f64();
                }
                if run > 0 {
                    cold.push(t[0]);
                    warm.push(t[1]);
                    sum_warm.push(t[2]);
                }
            }
            json!({ "cold": cold, "warm": warm, "sum_warm_query": sum_warm })
        }
        "w2-spin" => {
            let iters: u64 = spec[1].parse().unwrap();
            let spin_run = |threads: usize| -> f64 {
                time(|| {
                    std::thread::scope(|sc| {
                        let hs: Vec<_> = (0..threads)
                            .map(|t| sc.spawn(move || spin(iters, t as u64 + 1)))
                            .collect();
                        hs.into_iter().map(|h| h.join().unwrap()).fold(0, |a, b| a ^ b)
                    })
                })
                .1
            };
            let mut t1 = Vec::new();
            let mut tn = Vec::new();
            for _ in 0..ctx.runs {
                t1.push(spin_run(1));
                tn.push(spin_run(ctx.threads));
            }
            json!({ "t1": t1, "tn": tn })
        }
        "w2-floor" => {
            // The least any exact index must do: read every query token once.
            let (reqs, _) = mooncake(ctx, 1);
            let mut t1 = Vec::new();
            let mut tn = Vec::new();
            for run in 0..=ctx.runs {
                let (a, s) = time(|| read_all(&reqs, 1));
                let (b, s2) = time(|| read_all(&reqs, ctx.threads));
                assert_eq!(a, b);
                if run > 0 {
                    t1.push(s);
                    tn.push(s2);
                }
            }
            json!({ "t1": t1, "tn": tn })
        }
        "w2" => {
            let (w, page) = who_page(spec);
            let (reqs, slots) = mooncake(ctx, page);
            let b = w.build(page, false);
            replay(b.idx(), &reqs, &slots);
            let expect = aligned_total(&reqs, page);
            let mut t1 = Vec::new();
            let mut tn = Vec::new();
            // One untimed warm-up pass first.
            for run in 0..=ctx.runs {
                match b.shared() {
                    Some(idx) => {
                        let (h, s) = time(|| match_all(idx, &reqs, 1));
                        assert_eq!(h, expect, "{}: a full tree hits every page", w.key());
                        let (h2, s2) = time(|| match_all(idx, &reqs, ctx.threads));
                        assert_eq!(h2, expect, "{}: hits at {} threads", w.key(), ctx.threads);
                        if run > 0 {
                            t1.push(s);
                            tn.push(s2);
                        }
                    }
                    None => {
                        let (h, s) = time(|| match_all_local(b.idx(), &reqs));
                        assert_eq!(h, expect, "{}: a full tree hits every page", w.key());
                        if run > 0 {
                            t1.push(s);
                        }
                    }
                }
            }
            json!({ "t1": t1, "tn": if b.shared().is_some() { json!(tn) } else { Value::Null }, "hits": expect })
        }
        "w3" => {
            let (w, page) = who_page(spec);
            let mut reqs = trace::branching(ctx.branching);
            let slots = slot_array(ctx, &mut reqs, page);
            let expect = aligned_total(&reqs, page);
            let mut ti = Vec::new();
            let mut tm = Vec::new();
            let mut distinct = None;
            for run in 0..=ctx.runs {
                let b = w.build(page, true);
                let (_, si) = time(|| insert_all(b.idx(), &reqs, &slots));
                let (h, sm) = match b.shared() {
                    Some(idx) => time(|| match_all(idx, &reqs, 1)),
                    None => time(|| match_all_local(b.idx(), &reqs)),
                };
                assert_eq!(h, expect, "{}: every request must hit in full", w.key());
                distinct = b.idx().cached_tokens();
                drop(b);
                if run > 0 {
                    ti.push(si);
                    tm.push(sm);
                }
            }
            json!({
                "insert": ti, "match": tm, "distinct": distinct, "requests": reqs.len(),
                "tokens": reqs.iter().map(|r| r.tokens.len() as u64).sum::<u64>(),
            })
        }
        "w4a" => {
            let (reqs, _) = mooncake(ctx, 1);
            // An optional third word: the radixkv contestants' eviction policy (workload 4c).
            let policy: radixkv::EvictionPolicy =
                spec.get(2).map_or(Ok(Default::default()), |p| p.parse()).expect("a policy");
            type Replay = Box<dyn Fn(&[Req], usize) -> EvictRun>;
            let f: Replay = match spec[1].as_str() {
                "cache" => {
                    Box::new(move |r, c| evict_replay_rkv_policy(r, c, CacheCycle::Lists, policy))
                }
                "cache-inline" => Box::new(|r, c| evict_replay_rkv(r, c, CacheCycle::ListsInline)),
                "cache-runs" => Box::new(|r, c| evict_replay_rkv(r, c, CacheCycle::Runs)),
                "cache-c" => Box::new(crate::cabi::evict_replay_c),
                "tree" => Box::new(move |r, c| evict_replay_tree_policy(r, c, true, policy)),
                "tree-inline" => Box::new(|r, c| evict_replay_tree(r, c, false)),
                "kvi" => Box::new(evict_replay_kvi),
                k => panic!("unknown w4a contestant {k}"),
            };
            let _ = f(&reqs, CAPACITY); // warm-up
            let rs: Vec<Value> = (0..ctx.runs)
                .map(|_| {
                    let r = f(&reqs, CAPACITY);
                    json!({
                        "secs": r.secs, "hits": r.hits, "calls": r.calls, "p50": r.p50, "p99": r.p99,
                        "max": r.max, "per_node": if r.per_node.is_finite() { json!(r.per_node) } else { Value::Null },
                        "per_token": r.per_token, "evicted": r.evicted,
                        "asked50": r.asked.0, "asked99": r.asked.1, "freed50": r.freed.0, "freed99": r.freed.1,
                    })
                })
                .collect();
            json!({ "runs": rs })
        }
        "w4b" => {
            let n: usize = spec[2].parse().unwrap();
            // Optional: the eviction policy, and "mixed" for a build whose keys do not come
            // in insertion order (workload 4d).
            let policy: radixkv::EvictionPolicy =
                spec.get(3).map_or(Ok(Default::default()), |p| p.parse()).expect("a policy");
            let mixed = spec.get(4).is_some_and(|b| b == "mixed");
            let keys = leaf_keys(n);
            let k = n / 2 * 8;
            let mut per = Vec::new();
            let mut calls = Vec::new();
            let mut build = Vec::new();
            let mut nodes = 0u64;
            for run in 0..=ctx.runs {
                let (b, s, evicted_nodes) = match spec[1].as_str() {
                    "rkv" => {
                        let cfg = radixkv::TreeConfig { policy, ..Default::default() };
                        let tree = radixkv::RadixTree::new(cfg).unwrap();
                        let (_, b) = time(|| {
                            let mut next = 0u32;
                            let mut slots = Vec::new();
                            for (i, key) in keys.iter().enumerate() {
                                slots.clear();
                                slots.extend(next..next + key.len() as u32);
                                next += key.len() as u32;
                                if mixed {
                                    tree.insert_with(
                                        0,
                                        key,
                                        &slots,
                                        InsertOptions::with_priority(priority_of(i)),
                                    )
                                    .unwrap();
                                } else {
                                    tree.insert(0, key, &slots).unwrap();
                                }
                            }
                            if mixed {
                                // A quarter of the leaves inserted again (a hit, and an
                                // access): with the priorities, keys far from insertion order.
                                for i in (0..keys.len()).filter(|i| priority_of(*i + 7) == 0) {
                                    tree.insert_with(
                                        0,
                                        &keys[i],
                                        &slots_of(&keys, i),
                                        InsertOptions::with_priority(priority_of(i)),
                                    )
                                    .unwrap();
                                }
                            }
                        });
                        let n0 = tree.stats().nodes;
                        let (_, s) = time(|| tree.evict(k, &mut |_| {}));
                        (b, s, n0 - tree.stats().nodes)
                    }
                    "kvi" => {
                        let tree = kv_index::TokenTree::with_config(1, Default::default());
                        let (_, b) = time(|| {
                            for key in &keys {
                                tree.insert_tokens(key, "w0");
                            }
                        });
                        let size = tree.total_token_size();
                        let (_, s) = time(|| tree.evict_tenant_by_size(size - k));
                        (b, s, (n / 2) as u64)
                    }
                    x => panic!("unknown w4b contestant {x}"),
                };
                if run > 0 {
                    build.push(b);
                    calls.push(s);
                    per.push(s / evicted_nodes as f64);
                    nodes = evicted_nodes;
                }
            }
            json!({ "per": per, "calls": calls, "build": build, "nodes": nodes })
        }
        "w5" => {
            let (reqs, _) = mooncake(ctx, 1);
            let n = ctx.mix_requests.min(reqs.len());
            let threads: usize = spec[2].parse().unwrap();
            let f: fn(&[Req], usize, usize) -> MixRun = match spec[1].as_str() {
                "cache" => mix_rkv,
                "cache-runs" => mix_rkv_runs,
                "cache-mutex" => mix_rkv_mutex,
                "tree" => mix_tree,
                "kvi" => mix_kvi,
                k => panic!("unknown w5 contestant {k}"),
            };
            let _ = f(&reqs[..n], threads, CAPACITY); // warm-up
            let rs: Vec<Value> = (0..ctx.runs)
                .map(|_| {
                    let r = f(&reqs[..n], threads, CAPACITY);
                    json!({ "secs": r.secs, "cycles": r.cycles, "tokens": r.tokens, "hits": r.hits })
                })
                .collect();
            json!({ "runs": rs })
        }
        "mem" => mem(ctx, &spec[1], &spec[2..]),
        x => panic!("unknown measurement {x}"),
    }
}

/// Bytes of one contestant's index: resident set and live heap before and after the build.
fn mem(ctx: &Ctx, workload: &str, spec: &[String]) -> Value {
    let w = Who::from_key(&spec[0]).expect("a contestant");
    let page: usize = spec[1].parse().expect("a page size");
    let mut reqs = match workload {
        "mooncake" => trace::mooncake(&ctx.trace),
        "branching" => trace::branching(ctx.branching),
        x => panic!("unknown workload {x}"),
    };
    let slots = slot_array(ctx, &mut reqs, page);
    COUNTING.store(true, Ordering::SeqCst);
    let (rss0, heap0) = (rss_bytes(), heap_live());
    let b = w.build(page, workload == "branching");
    let cached = if workload == "mooncake" {
        let hits = replay(b.idx(), &reqs, &slots);
        aligned_total(&reqs, page) - hits
    } else {
        insert_all(b.idx(), &reqs, &slots);
        reqs.iter().map(|r| (r.tokens.len() / page * page - r.fork / page * page) as u64).sum()
    };
    let (rss1, heap1) = (rss_bytes(), heap_live());
    // radixkv retires split and evicted nodes through crossbeam-epoch; what is retired but
    // not yet collected is still on the heap. Flush it, then read again.
    for _ in 0..256 {
        crossbeam_epoch::pin().flush();
    }
    let heap2 = heap_live();
    let census = b.idx().census();
    json!({
        "rss": rss1.saturating_sub(rss0),
        "heap": heap2 - heap0,
        "heap_before_flush": heap1 - heap0,
        "cached": cached,
        "own_heap": census.map(|c| c.0),
        "nodes": census.map(|c| c.1),
        "holds": b.idx().holds(),
    })
}
