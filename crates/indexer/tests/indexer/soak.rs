//! Soak and numbers (in CI, about 3 s; `cargo test --release -p radixkv-indexer --test
//! indexer soak -- --nocapture` shows the numbers): 100,000 batches from 8 radixkv
//! publishers with queries running, the answers exact at the end and the memory back to empty after the workers
//! are unregistered; prints the events applied per second through the sockets and the
//! query latency over HTTP (p50/p99, one keep-alive connection), beside the same in
//! process (the router index fed the same payloads, its `find` on the same requests).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
use radixkv::events::KvEvent;
use radixkv::events::wire::{WireOptions, encode_batch};
use radixkv_indexer::client::Connection;
use radixkv_router::{RouterIndex, RouterOptions};
use serde_json::json;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p) as usize]
}

#[test]
fn soak_100k_batches_from_8_publishers_with_queries() {
    let per: usize = std::env::var("RADIXKV_INDEXER_SOAK_BATCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12_500);
    let svc = start(config());
    let reference = Reference::new();
    let ps = prompts(64, 16);
    let mut ws: Vec<Worker> = (1..=8).map(|i| Worker::start(i, i, None)).collect();
    for w in &ws {
        register(&svc, w.id, &w.endpoint, Some(&w.replay));
    }
    // The batches made first (the reference fed as they are made), so the publishing below
    // runs as fast as the sockets take it.
    let mut plan: Vec<Vec<Vec<KvEvent>>> = Vec::new();
    let mut payloads: Vec<(u64, u64, Vec<u8>)> = Vec::new();
    let mut events = 0usize;
    for w in &mut ws {
        let mut b = Vec::new();
        for seq in 0..per as u64 {
            let ev = w.engine.step(&ps);
            events += ev.len();
            reference.apply(w.id, seq, &ev);
            payloads.push((
                w.id,
                seq,
                encode_batch(
                    &radixkv::events::EventBatch { ts: 0.0, events: ev.clone() },
                    &WireOptions::default(),
                ),
            ));
            b.push(ev);
        }
        plan.push(b);
    }
    // Queries all along, on their own connection.
    let stop = Arc::new(AtomicBool::new(false));
    let base = format!("http://{}", svc.local_addr());
    let q = {
        let (stop, ps, base) = (stop.clone(), ps.clone(), base.clone());
        std::thread::spawn(move || {
            let mut c = Connection::open(&base).unwrap();
            let mut lat = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = c
                    .post_json(
                        "/query",
                        &json!({"token_ids": ps[i % ps.len()], "model_name": MODEL}),
                    )
                    .unwrap();
                lat.push(t.elapsed());
                assert_eq!(r.status, 200);
                i += 1;
            }
            lat
        })
    };
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for (w, batches) in ws.iter_mut().zip(plan) {
            s.spawn(move || {
                for ev in batches {
                    for e in ev {
                        w.sink.push(e);
                    }
                    w.last = w.sink.flush();
                }
            });
        }
    });
    for w in &ws {
        w.wait_applied(&svc);
    }
    let took = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut busy = q.join().unwrap();
    let total = per * ws.len();
    eprintln!(
        "through the sockets: {total} batches, {events} events in {took:?}: {:.0} batches/s, {:.0} events/s (publishers included)",
        total as f64 / took.as_secs_f64(),
        events as f64 / took.as_secs_f64()
    );
    eprintln!(
        "queries over HTTP while publishing: {} queries, p50 {:?}, p99 {:?}",
        busy.len(),
        pct(&mut busy, 0.5),
        pct(&mut busy, 0.99)
    );
    for m in [
        "gaps",
        "replays",
        "replay_failures",
        "replayed_batches",
        "duplicates",
        "gap_clears",
        "restarts",
        "malformed_batches",
    ] {
        eprintln!("{m}: {}", metric(&svc, &format!("radixkv_indexer_{m}_total")));
    }
    check_exact(&svc, &ps, &reference);
    assert_eq!(metric(&svc, "radixkv_indexer_gap_clears_total"), 0);
    // Quiet: queries alone.
    let mut c = Connection::open(&base).unwrap();
    let mut quiet = Vec::new();
    for i in 0..5_000 {
        let t = Instant::now();
        let r = c
            .post_json("/query", &json!({"token_ids": ps[i % ps.len()], "model_name": MODEL}))
            .unwrap();
        quiet.push(t.elapsed());
        assert_eq!(r.status, 200);
    }
    eprintln!(
        "queries over HTTP, quiet: {} queries of {} tokens, p50 {:?}, p99 {:?}",
        quiet.len(),
        ps[0].len(),
        pct(&mut quiet, 0.5),
        pct(&mut quiet, 0.99)
    );
    // In process: the same payloads applied, the same finds.
    let ix = RouterIndex::new(RouterOptions { block_size: BS, ..Default::default() }).unwrap();
    let t = Instant::now();
    for (id, seq, p) in &payloads {
        ix.apply_batch(*id, *seq, p).unwrap();
    }
    let took = t.elapsed();
    eprintln!(
        "in process (one thread): {events} events applied in {took:?}: {:.0} events/s",
        events as f64 / took.as_secs_f64()
    );
    let mut lat = Vec::new();
    let mut out = Vec::new();
    for i in 0..5_000 {
        let t = Instant::now();
        ix.find(&ps[i % ps.len()], None, None, &mut out);
        lat.push(t.elapsed());
    }
    eprintln!("in process find: p50 {:?}, p99 {:?}", pct(&mut lat, 0.5), pct(&mut lat, 0.99));
    // Unregistered: back to empty.
    for w in &ws {
        let r =
            c.post_json("/unregister", &json!({"instance_id": w.id, "model_name": MODEL})).unwrap();
        assert_eq!(r.status, 200);
    }
    assert_eq!(metric(&svc, "radixkv_indexer_index_workers"), 0);
    wait_for("the index back to its empty size", 60, || {
        metric(&svc, "radixkv_indexer_index_bytes")
            == metric(&svc, "radixkv_indexer_index_empty_bytes")
    });
    svc.shutdown().unwrap();
}
