//! Dynamo's KV router reads radixkv's event stream over a loopback socket and holds the
//! same page set as the cache that published it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use radixkv::events::publisher::{Publisher, PublisherOptions};
use radixkv::events::wire::{Encoding, WireOptions};
use radixkv::events::{EventSink, NamespaceMeta, SinkOptions};
use radixkv::trace::{Trace, TraceOptions};
use radixkv_dynamo_consumer::{DynamoConsumer, PageModel};

const PAGE: u32 = 16;

fn trace_path() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces/mooncake_synthetic_trace.jsonl")
}

fn publisher(encoding: Encoding) -> (Arc<EventSink>, Publisher) {
    let sink =
        Arc::new(EventSink::new(SinkOptions { block_size: PAGE, ..Default::default() }).unwrap());
    let p = Publisher::start(
        &sink,
        PublisherOptions {
            endpoint: "tcp://127.0.0.1:*".into(),
            replay_endpoint: Some("tcp://127.0.0.1:*".into()),
            auto_flush: None,
            wire: WireOptions { encoding, ..Default::default() },
            linger: Duration::from_millis(100),
            ..Default::default()
        },
    )
    .unwrap();
    (sink, p)
}

fn consumer(ctx: &zmq::Context, p: &Publisher) -> DynamoConsumer {
    DynamoConsumer::connect(ctx, p.endpoint(), p.replay_endpoint().unwrap(), PAGE)
}

/// Every request of the Mooncake trace (page 16, `RADIXKV_CONSUMER_REQUESTS` to cut it)
/// goes into a page cache of 200,000 pages that evicts LRU leaves, one batch per request;
/// before each, Dynamo's overlap for the request equals the model's match. The consumer
/// subscribes only after the first batch went out, so it must fetch that one by replay.
#[test]
fn dynamo_overlap_equals_the_model_over_the_mooncake_trace() {
    let trace = Trace::load(trace_path(), TraceOptions::default()).unwrap();
    let n = std::env::var("RADIXKV_CONSUMER_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(trace.len())
        .min(trace.len());
    for encoding in [Encoding::VllmArray, Encoding::VllmMap] {
        let t = Instant::now();
        let (sink, p) = publisher(encoding);
        let mut model = PageModel::new(sink.clone(), 200_000);
        let first = trace.get(0);
        model.insert(0, &first.tokens);
        let mut last = sink.flush();
        while p.stats().published == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let ctx = zmq::Context::new();
        let mut c = consumer(&ctx, &p);
        let mut hits = 0u64;
        for i in 1..n {
            let r = trace.get(i);
            if let Some(l) = last {
                c.catch_up(l);
            }
            let want = model.matched(0, &r.tokens);
            assert_eq!(
                c.overlap(&r.tokens, None, None) as usize,
                want,
                "request {i}, {}",
                encoding.name()
            );
            assert_eq!(model.insert(0, &r.tokens), want);
            hits += want as u64;
            last = sink.flush().or(last);
        }
        if let Some(l) = last {
            c.catch_up(l);
        }
        let st = p.stop();
        eprintln!(
            "{}: {n} requests, {hits} pages hit, {} cached at the end, {:?}; consumer {:?}; publisher {st:?}",
            encoding.name(),
            model.len(),
            t.elapsed(),
            c.counts
        );
        assert_eq!(st.dropped, 0);
        assert!(hits > 0);
        assert!(c.counts.replayed >= 1, "the first batch came by replay");
        assert_eq!(c.counts.batches, st.published, "every batch applied once");
    }
}

/// Namespaces with equal tokens never overlap in Dynamo's index: ns 0 (base), ns 1 (no
/// identity given: salt "1"), ns 2 (a LoRA adapter), ns 3 (a tenant salt), ns 4 (both).
#[test]
fn namespaces_with_equal_tokens_never_overlap_in_dynamo() {
    for encoding in [Encoding::VllmArray, Encoding::VllmMap] {
        let (sink, p) = publisher(encoding);
        let ctx = zmq::Context::new();
        let mut c = consumer(&ctx, &p);
        sink.set_namespace(
            2,
            NamespaceMeta { lora_name: Some("adapter-a".into()), cache_salt: None },
        )
        .unwrap();
        sink.set_namespace(
            3,
            NamespaceMeta { lora_name: None, cache_salt: Some("tenant-a".into()) },
        )
        .unwrap();
        sink.set_namespace(
            4,
            NamespaceMeta {
                lora_name: Some("adapter-a".into()),
                cache_salt: Some("tenant-a".into()),
            },
        )
        .unwrap();
        let ids: [(u64, Option<&str>, Option<&str>); 5] = [
            (0, None, None),
            (1, None, Some("1")),
            (2, Some("adapter-a"), None),
            (3, None, Some("tenant-a")),
            (4, Some("adapter-a"), Some("tenant-a")),
        ];
        let tokens: Vec<u32> = (0..PAGE * 8).collect();
        let mut model = PageModel::new(sink.clone(), 1 << 20);
        for (k, &(ns, _, _)) in ids.iter().enumerate() {
            // Namespace `ns` caches the first 2 + k pages, so each has a different depth.
            model.insert(ns, &tokens[..(PAGE as usize) * (2 + k)]);
            let seq = sink.flush().unwrap();
            c.catch_up(seq);
            for (j, &(other, lora, salt)) in ids.iter().enumerate() {
                let want = if j <= k { 2 + j as u32 } else { 0 };
                assert_eq!(
                    c.overlap(&tokens, lora, salt),
                    want,
                    "{}: after ns {ns} inserted, ns {other} overlaps wrongly",
                    encoding.name()
                );
            }
        }
        // A continuation of ns 3's chain (a store with a parent) stays in ns 3.
        model.insert(3, &tokens);
        let seq = sink.flush().unwrap();
        c.catch_up(seq);
        assert_eq!(c.overlap(&tokens, None, Some("tenant-a")), 8);
        assert_eq!(c.overlap(&tokens, None, None), 2);
        drop(p);
    }
}
