//! Dynamo's KV router reads a real radixkv cache's event stream over a loopback socket and
//! holds the same pages as the cache: per request its overlap equals the cache's match.

use std::time::{Duration, Instant};

use radixkv::events::NamespaceMeta;
use radixkv::events::hash::HashMode;
use radixkv::events::wire::{Encoding, WireOptions};
use radixkv_dynamo_consumer::{DynamoConsumer, Engine};
use radixkv_publisher::{Publisher, PublisherOptions};
use radixkv_trace::{Request, Trace, TraceOptions};

const PAGE: usize = 16;

/// The pool of the eviction runs: 2,000,000 tokens, a tenth of the trace's distinct ones.
const POOL: usize = 2_000_000;

/// Requests run side by side per round with two threads (each thread takes every other).
const ROUND: usize = 4;

fn trace_path() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces/mooncake_synthetic_trace.jsonl")
}

fn publish(engine: &Engine, encoding: Encoding) -> Publisher {
    engine.publish(PublisherOptions {
        endpoint: "tcp://127.0.0.1:*".into(),
        replay_endpoint: Some("tcp://127.0.0.1:*".into()),
        auto_flush: None,
        wire: WireOptions { encoding, ..Default::default() },
        linger: Duration::from_millis(100),
        ..Default::default()
    })
}

fn consumer(ctx: &zmq::Context, p: &Publisher) -> DynamoConsumer {
    DynamoConsumer::connect(ctx, p.endpoint(), p.replay_endpoint().unwrap(), PAGE as u32)
}

/// The trace's first `RADIXKV_CONSUMER_REQUESTS` requests (all by default).
fn requests() -> Vec<Request> {
    let trace = Trace::load(trace_path(), TraceOptions::default()).unwrap();
    let n = std::env::var("RADIXKV_CONSUMER_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(trace.len())
        .min(trace.len());
    (0..n).map(|i| trace.get(i)).collect()
}

/// What one run checked.
#[derive(Debug, Default)]
struct Checked {
    /// Per-request overlap comparisons made.
    requests: u64,
    /// Pages the cache's matches found at the checked points, summed.
    pages_hit: u64,
}

/// At a quiescent point (nothing running, every batch closed so far delivered to Dynamo):
/// Dynamo's block count is the cache's page count, and for each of `next`, Dynamo's
/// overlap equals the cache's match now.
fn check_quiescent(
    e: &Engine,
    c: &mut DynamoConsumer,
    next: &[Request],
    what: &str,
    at: usize,
    ck: &mut Checked,
) {
    if let Some(l) = e.last_seq() {
        c.catch_up(l);
    }
    assert_eq!(c.size() as u64, e.cached_pages(), "{what}: pages held before request {at}");
    for (k, r) in next.iter().enumerate() {
        let want = e.matched(0, &r.tokens);
        assert_eq!(
            c.overlap(&r.tokens, None, None) as usize,
            want,
            "{what}: Dynamo's overlap for request {} (checked before request {at})",
            at + k
        );
        ck.requests += 1;
        ck.pages_hit += want as u64;
    }
}

/// Replays `reqs` through a real cache (unlimited, or a pool of `capacity` tokens) on
/// `threads` threads, its publisher's batches applied by Dynamo's decoder, normalizer and
/// index, checking at every quiescent point (see [`check_quiescent`]), and at the end
/// that Dynamo holds exactly the cache's page hashes.
///
/// One thread: a quiescent point before every request (the events up to the previous
/// request delivered), and each request's overlap equals its own `match_and_lock`.
/// Two threads: rounds of [`ROUND`] requests, the two threads running them side by side
/// (real concurrent inserts and evictions, one flush after each request); before each
/// round, the overlap of every request of the round equals the cache's match then.
fn run(reqs: &[Request], threads: usize, capacity: Option<usize>, encoding: Encoding) {
    let what = format!(
        "{}, {threads} thread(s), capacity {}",
        encoding.name(),
        capacity.map_or("unlimited".to_string(), |c| c.to_string())
    );
    let t = Instant::now();
    let e = Engine::new(PAGE, capacity, HashMode::Xxh3, &[]);
    let p = publish(&e, encoding);
    // The consumer subscribes after the first batch went out: it gets it by replay.
    e.run(0, &reqs[0].tokens);
    e.cache().flush_events();
    while p.stats().published == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let ctx = zmq::Context::new();
    let mut c = consumer(&ctx, &p);
    let mut ck = Checked::default();
    if threads == 1 {
        for (i, r) in reqs.iter().enumerate().skip(1) {
            check_quiescent(&e, &mut c, std::slice::from_ref(r), &what, i, &mut ck);
            let want = e.matched(0, &r.tokens);
            assert_eq!(e.run(0, &r.tokens), want, "{what}: nothing ran in between");
            e.cache().flush_events();
        }
    } else {
        let mut i = 1;
        while i < reqs.len() {
            let round = &reqs[i..(i + ROUND).min(reqs.len())];
            check_quiescent(&e, &mut c, round, &what, i, &mut ck);
            std::thread::scope(|s| {
                for t in 0..threads {
                    let e = &e;
                    s.spawn(move || {
                        for r in round.iter().skip(t).step_by(threads) {
                            e.run(0, &r.tokens);
                            e.cache().flush_events();
                        }
                    });
                }
            });
            i += round.len();
        }
    }
    check_quiescent(&e, &mut c, &[], &what, reqs.len(), &mut ck);
    let cached = e.cache().tree().cached_page_hashes();
    assert_eq!(c.block_hashes(), cached, "{what}: Dynamo holds exactly the cache's pages");
    let st = e.cache().stats();
    let sink = e.sink().stats();
    let ps = p.stop();
    eprintln!(
        "{what}: {} requests, {} checked, {} pages hit, {} cached and {} evicted pages at the end, \
         {:.1?}; sink {sink:?}; consumer {:?}; publisher {ps:?}",
        reqs.len(),
        ck.requests,
        ck.pages_hit,
        cached.len(),
        st.tree.evicted_tokens / PAGE as u64,
        t.elapsed(),
        c.counts
    );
    assert_eq!(ps.dropped, 0, "{what}");
    assert!(ck.pages_hit > 0, "{what}");
    if capacity.is_some() && reqs.len() > 1000 {
        assert!(st.tree.evicted_tokens > 0, "{what}: eviction ran");
    }
    assert!(c.counts.replayed >= 1, "{what}: the first batch came by replay");
    assert_eq!(c.counts.batches, sink.batches, "{what}: every batch applied once");
}

/// One thread, unlimited capacity: no eviction, every page stored once.
#[test]
fn one_thread_unlimited() {
    let reqs = requests();
    for encoding in [Encoding::VllmArray, Encoding::VllmMap] {
        run(&reqs, 1, None, encoding);
    }
}

/// One thread, a 2,000,000-token pool: the cache evicts (LRU leaves), and Dynamo applies
/// every `BlockRemoved`.
#[test]
fn one_thread_with_eviction() {
    let reqs = requests();
    for encoding in [Encoding::VllmArray, Encoding::VllmMap] {
        run(&reqs, 1, Some(POOL), encoding);
    }
}

/// Two threads, unlimited: concurrent inserts of shared prefixes.
#[test]
fn two_threads_unlimited() {
    let reqs = requests();
    for encoding in [Encoding::VllmArray, Encoding::VllmMap] {
        run(&reqs, 2, None, encoding);
    }
}

/// Two threads and a 2,000,000-token pool: concurrent inserts and evictions.
#[test]
fn two_threads_with_eviction() {
    let reqs = requests();
    for encoding in [Encoding::VllmArray, Encoding::VllmMap] {
        run(&reqs, 2, Some(POOL), encoding);
    }
}

/// Namespaces with equal tokens never overlap in Dynamo's index: ns 0 (base), ns 1 (no
/// identity given: salt "1"), ns 2 (a LoRA adapter), ns 3 (a tenant salt), ns 4 (both),
/// each named on the real cache before its first insert.
#[test]
fn namespaces_with_equal_tokens_never_overlap_in_dynamo() {
    let adapter = || NamespaceMeta { lora_name: Some("adapter-a".into()), cache_salt: None };
    let tenant = || NamespaceMeta { lora_name: None, cache_salt: Some("tenant-a".into()) };
    let both = || NamespaceMeta {
        lora_name: Some("adapter-a".into()),
        cache_salt: Some("tenant-a".into()),
    };
    for encoding in [Encoding::VllmArray, Encoding::VllmMap] {
        let e =
            Engine::new(PAGE, None, HashMode::Xxh3, &[(2, adapter()), (3, tenant()), (4, both())]);
        let p = publish(&e, encoding);
        let ctx = zmq::Context::new();
        let mut c = consumer(&ctx, &p);
        let ids: [(u64, Option<&str>, Option<&str>); 5] = [
            (0, None, None),
            (1, None, Some("1")),
            (2, Some("adapter-a"), None),
            (3, None, Some("tenant-a")),
            (4, Some("adapter-a"), Some("tenant-a")),
        ];
        let tokens: Vec<u32> = (0..PAGE as u32 * 8).collect();
        for (k, &(ns, _, _)) in ids.iter().enumerate() {
            // Namespace `ns` caches the first 2 + k pages, so each has a different depth.
            assert_eq!(e.run(ns, &tokens[..PAGE * (2 + k)]), 0);
            let seq = e.cache().flush_events().unwrap();
            c.catch_up(seq);
            for (j, &(other, lora, salt)) in ids.iter().enumerate() {
                let want = if j <= k { 2 + j as u32 } else { 0 };
                assert_eq!(e.matched(other, &tokens) as u32, want);
                assert_eq!(
                    c.overlap(&tokens, lora, salt),
                    want,
                    "{}: after ns {ns} inserted, ns {other} overlaps wrongly",
                    encoding.name()
                );
            }
        }
        // A continuation of ns 3's chain (a store with a parent) stays in ns 3.
        assert_eq!(e.run(3, &tokens), 5);
        let seq = e.cache().flush_events().unwrap();
        c.catch_up(seq);
        assert_eq!(c.overlap(&tokens, None, Some("tenant-a")), 8);
        assert_eq!(c.overlap(&tokens, None, None), 2);
        // Dropping a namespace removes its pages from Dynamo's index, and only its.
        e.cache().drop_namespace(2, Some(&mut |_| {})).unwrap();
        let seq = e.cache().flush_events().unwrap();
        c.catch_up(seq);
        assert_eq!(c.overlap(&tokens, Some("adapter-a"), None), 0);
        assert_eq!(c.overlap(&tokens, Some("adapter-a"), Some("tenant-a")), 6);
        assert_eq!(c.block_hashes(), e.cache().tree().cached_page_hashes());
        drop(p);
    }
}
