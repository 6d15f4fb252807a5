//! 10,000 workers registered and unregistered: the worker count and the indexes' memory
//! return to empty.
//!
//! In waves of 1,000 live at once: each stream holds a SUB and a DEALER socket (libzmq: a
//! mailbox descriptor each, plus their TCP connections), and this machine's descriptor
//! limit is 20,000, so 10,000 at once cannot be had here. Every worker of a wave subscribes
//! to the same publisher (PUB fan-out) and learns its batches through replay, so each one
//! holds blocks before it is unregistered.

use std::time::Instant;

use crate::common::*;
use radixkv_indexer::client::Connection;
use serde_json::json;

#[test]
fn ten_thousand_workers_registered_and_unregistered() {
    let total: u64 =
        std::env::var("RADIXKV_INDEXER_MANY").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let wave: u64 = 1_000.min(total);
    let svc = start(radixkv_indexer::Config { max_workers: wave as u32 + 16, ..config() });
    let fp = FakePublisher::start();
    let ps = prompts(8, 4);
    let mut engine = MockEngine::new(1);
    for seq in 0..5 {
        fp.batch(seq, &engine.step(&ps), true);
    }
    let mut http = Connection::open(&format!("http://{}", svc.local_addr())).unwrap();
    let t0 = Instant::now();
    let mut id = 0;
    while id < total {
        let first = id;
        let n = wave.min(total - id);
        for _ in 0..n {
            let r = http
                .post_json(
                    "/register",
                    &json!({"instance_id": id, "endpoint": fp.endpoint, "model_name": MODEL,
                            "block_size": BS, "replay_endpoint": fp.replay}),
                )
                .unwrap();
            assert_eq!(r.status, 201, "{}", r.text());
            id += 1;
        }
        assert_eq!(metric(&svc, "radixkv_indexer_registered_workers"), n);
        // Every worker of the wave learns the publisher's batches.
        wait_for("the wave's workers to hold blocks", 120, || {
            metric(&svc, "radixkv_indexer_index_workers") == n
        });
        assert!(metric(&svc, "radixkv_indexer_memberships") >= n);
        for w in first..id {
            let r = http
                .post_json("/unregister", &json!({"instance_id": w, "model_name": MODEL}))
                .unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
        }
        assert_eq!(metric(&svc, "radixkv_indexer_registered_workers"), 0);
        assert_eq!(metric(&svc, "radixkv_indexer_index_workers"), 0);
        assert_eq!(metric(&svc, "radixkv_indexer_blocks"), 0);
        assert_eq!(metric(&svc, "radixkv_indexer_memberships"), 0);
    }
    wait_for("the index back to its empty size", 60, || {
        metric(&svc, "radixkv_indexer_index_bytes")
            == metric(&svc, "radixkv_indexer_index_empty_bytes")
    });
    let w = radixkv_indexer::client::get(&url(&svc, "/workers")).unwrap().json().unwrap();
    assert_eq!(w.as_array().unwrap().len(), 0);
    eprintln!("{total} workers registered and unregistered in {:?}", t0.elapsed());
    svc.shutdown().unwrap();
}
