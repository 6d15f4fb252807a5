//! The indexer service over real loopback sockets: radixkv's publishers and a hand-driven
//! one, HTTP through the service's own client. No timing asserts: conditions are polled
//! with a deadline.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use radixkv_indexer::client::{get, request};
use radixkv_router::{Worker as RWorker, content_hashes};
use serde_json::json;

/// Prompts with other tokens (a restarted engine's new content).
fn shifted(ps: &[Vec<u32>], by: u32) -> Vec<Vec<u32>> {
    ps.iter().map(|p| p.iter().map(|t| t + by).collect()).collect()
}

#[test]
fn end_to_end_with_radixkv_publishers() {
    let svc = start(config());
    let reference = Reference::new();
    let ps = prompts(24, 8);
    let mut ws: Vec<Worker> = (1..=3).map(|i| Worker::start(i, i, None)).collect();
    // Published before registration: learned through replay.
    for w in &mut ws {
        for _ in 0..20 {
            w.step(&ps, &reference);
        }
    }
    for w in &ws {
        register(&svc, w.id, &w.endpoint, Some(&w.replay));
    }
    for _ in 0..150 {
        for w in &mut ws {
            w.step(&ps, &reference);
        }
    }
    for w in &ws {
        w.wait_applied(&svc);
    }
    check_exact(&svc, &ps, &reference);
    // /query_by_hash with the content hashes of the same requests.
    for p in &ps {
        let mut hs = Vec::new();
        content_hashes(p, BS, None, None, &mut hs);
        let hs: Vec<i64> = hs.iter().map(|&h| h as i64).collect();
        let r = post(&svc, "/query_by_hash", json!({"block_hashes": hs, "model_name": MODEL}));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json().unwrap();
        assert_eq!(scores_of(&v), reference.scores(p));
        let freq = v["frequencies"].as_array().unwrap();
        let best = reference.scores(p).values().copied().max().unwrap_or(0) / u64::from(BS);
        assert_eq!(freq.len() as u64, best);
        assert!(v["tree_sizes"].is_object());
    }
    // /workers in Dynamo's shape.
    let wl = get(&url(&svc, "/workers")).unwrap().json().unwrap();
    assert_eq!(wl.as_array().unwrap().len(), 3);
    assert_eq!(wl[0]["instance_id"], 1);
    assert_eq!(wl[0]["endpoints"]["0"], json!(ws[0].endpoint));
    assert!(metric(&svc, "radixkv_indexer_batches_total") >= 3 * 170);
    assert_eq!(metric(&svc, "radixkv_indexer_gap_clears_total"), 0);
    assert_eq!(metric(&svc, "radixkv_indexer_restarts_total"), 0);
    assert!(metric(&svc, "radixkv_indexer_blocks") > 0);
    assert!(metric(&svc, "radixkv_indexer_query_duration_seconds_count") >= 24 * 3);
    // Unregister: the worker's blocks leave at once.
    let r = post(&svc, "/unregister", json!({"instance_id": 2, "model_name": MODEL}));
    assert_eq!(r.status, 200, "{}", r.text());
    reference.index.remove_worker(RWorker::new(2, 0));
    check_exact(&svc, &ps, &reference);
    assert_eq!(metric(&svc, "radixkv_indexer_registered_workers"), 2);
    svc.shutdown().unwrap();
}

/// Publishes live batches on `fp` until the service's SUB socket has received one (a SUB
/// socket misses what a PUB sends before it joins); returns the next seq.
fn join(
    svc: &radixkv_indexer::Indexer,
    fp: &FakePublisher,
    id: u64,
    engine: &mut MockEngine,
    ps: &[Vec<u32>],
    reference: &Reference,
) -> u64 {
    let base = metric(svc, "radixkv_indexer_frames_total");
    let mut seq = 0;
    wait_for("the SUB socket to join", 30, || {
        let ev = engine.step(ps);
        fp.batch(seq, &ev, true);
        reference.apply(id, seq, &ev);
        seq += 1;
        std::thread::sleep(Duration::from_millis(30));
        metric(svc, "radixkv_indexer_frames_total") > base
    });
    seq
}

#[test]
fn gap_on_pub_is_repaired_by_replay() {
    let svc = start(config());
    let reference = Reference::new();
    let ps = prompts(16, 6);
    let fp = FakePublisher::start();
    let id = 7;
    register(&svc, id, &fp.endpoint, Some(&fp.replay));
    let mut engine = MockEngine::new(7);
    let mut seq = join(&svc, &fp, id, &mut engine, &ps, &reference);
    wait_for("the joined stream", 30, || cursor(&svc, id) == Some(seq));
    let gaps0 = metric(&svc, "radixkv_indexer_gaps_total");
    // Three batches kept for replay but never sent live, then live ones.
    for k in 0..40 {
        let ev = engine.step(&ps);
        fp.batch(seq, &ev, !(5..8).contains(&k));
        reference.apply(id, seq, &ev);
        seq += 1;
    }
    wait_for("the repaired stream", 30, || cursor(&svc, id) == Some(seq));
    check_exact(&svc, &ps, &reference);
    assert!(metric(&svc, "radixkv_indexer_gaps_total") > gaps0);
    assert!(metric(&svc, "radixkv_indexer_replays_total") >= 2);
    assert!(metric(&svc, "radixkv_indexer_replayed_batches_total") >= 3);
    assert_eq!(metric(&svc, "radixkv_indexer_gap_clears_total"), 0);

    // A gap replay cannot cover (the batch is in no ring): the worker is cleared and
    // re-learned, as the reference's GapPolicy::Clear does.
    seq += 1;
    for _ in 0..10 {
        let ev = engine.step(&ps);
        fp.batch(seq, &ev, true);
        reference.apply(id, seq, &ev);
        seq += 1;
    }
    wait_for("the cleared stream", 30, || cursor(&svc, id) == Some(seq));
    check_exact(&svc, &ps, &reference);
    assert_eq!(metric(&svc, "radixkv_indexer_gap_clears_total"), 1);
    svc.shutdown().unwrap();
}

/// A hybrid model's stream: the full-attention group's batches index as ever; a
/// sliding-window group's (a store under the same engine hashes, then removals of every
/// page the full group stored) are skipped and counted, and take nothing away.
#[test]
fn a_sliding_window_groups_events_are_skipped() {
    use radixkv::events::wire::{KvCacheSpecKind, KvGroup};
    use radixkv::events::{KvEvent, Medium};
    let svc = start(config());
    let reference = Reference::new();
    let ps = prompts(16, 6);
    let fp = FakePublisher::start();
    let id = 8;
    register(&svc, id, &fp.endpoint, Some(&fp.replay));
    let mut engine = MockEngine::new(8);
    let mut seq = join(&svc, &fp, id, &mut engine, &ps, &reference);
    let sliding = KvGroup::new(1, KvCacheSpecKind::SlidingWindow, Some(8)).unwrap();
    let mut skipped = 0;
    for _ in 0..40 {
        let ev = engine.step(&ps);
        fp.batch(seq, &ev, true);
        reference.apply(id, seq, &ev);
        seq += 1;
        let mut window: Vec<KvEvent> =
            ev.iter().filter(|e| matches!(e, KvEvent::BlockStored { .. })).cloned().collect();
        window.extend(ev.iter().filter_map(|e| match e {
            KvEvent::BlockStored { block_hashes, .. } => Some(KvEvent::BlockRemoved {
                block_hashes: block_hashes.clone(),
                medium: Medium::Gpu,
            }),
            _ => None,
        }));
        skipped += window.len() as u64;
        fp.batch_of(seq, &window, true, sliding);
        reference.apply(id, seq, &[]); // the cursor moves; nothing else
        seq += 1;
    }
    wait_for("the stream", 30, || cursor(&svc, id) == Some(seq));
    check_exact(&svc, &ps, &reference);
    assert!(skipped > 0);
    assert_eq!(metric(&svc, "radixkv_indexer_other_group_events_total"), skipped);
    assert_eq!(metric(&svc, "radixkv_indexer_gap_clears_total"), 0);
    svc.shutdown().unwrap();
}

#[test]
fn restarted_publisher_is_never_credited_its_old_blocks() {
    let svc = start(config());
    let reference = Reference::new();
    let ps = prompts(16, 6);
    let mut w = Worker::start(5, 5, None);
    register(&svc, 5, &w.endpoint, Some(&w.replay));
    for _ in 0..300 {
        w.step(&ps, &reference);
    }
    w.wait_applied(&svc);
    check_exact(&svc, &ps, &reference);
    let ports = w.ports();
    w.stop();
    // The engine comes back on the same ports with nothing cached and a new stream.
    reference.index.remove_worker(RWorker::new(5, 0));
    let ps2 = shifted(&ps, 7);
    let mut w2 = Worker::start(5, 55, Some(ports));
    for _ in 0..10 {
        w2.step(&ps2, &reference);
    }
    // Until the service has the new stream (its SUB socket reconnects on its own).
    wait_for("the new stream", 60, || {
        if cursor(&svc, 5) == w2.last.map(|s| s + 1) {
            return true;
        }
        w2.step(&ps2, &reference);
        std::thread::sleep(Duration::from_millis(50));
        false
    });
    assert!(w2.last.unwrap() < 299, "the new stream stayed below the old cursor");
    assert!(metric(&svc, "radixkv_indexer_restarts_total") >= 1);
    check_exact(&svc, &ps, &reference);
    check_exact(&svc, &ps2, &reference);
    for p in &ps {
        assert!(!query(&svc, p).contains_key(&5), "an old block credited");
    }
    svc.shutdown().unwrap();
}

fn temp(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("radixkv-indexer-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn restart_from_snapshot_while_publishers_keep_publishing() {
    let path = temp("snapshot.json");
    let cfg = radixkv_indexer::Config {
        snapshot: Some(path.clone()),
        snapshot_interval: Some(Duration::from_millis(300)),
        ..config()
    };
    let svc = start(cfg.clone());
    let reference = Reference::new();
    let ps = prompts(16, 6);
    let mut ws: Vec<Worker> = (11..=12).map(|i| Worker::start(i, i, None)).collect();
    for w in &ws {
        register(&svc, w.id, &w.endpoint, Some(&w.replay));
    }
    for _ in 0..60 {
        for w in &mut ws {
            w.step(&ps, &reference);
        }
    }
    for w in &ws {
        w.wait_applied(&svc);
    }
    // The interval writes it while running.
    wait_for("an interval snapshot", 30, || metric(&svc, "radixkv_indexer_snapshots_total") > 0);
    svc.shutdown().unwrap();
    assert!(path.exists());
    // Down: the publishers go on (stores and evictions).
    for _ in 0..40 {
        for w in &mut ws {
            w.step(&ps, &reference);
        }
    }
    let svc = start(cfg);
    let wl = get(&url(&svc, "/workers")).unwrap().json().unwrap();
    assert_eq!(wl.as_array().unwrap().len(), 2, "registrations restored");
    for w in &ws {
        w.wait_applied(&svc);
    }
    check_exact(&svc, &ps, &reference);
    assert_eq!(metric(&svc, "radixkv_indexer_gap_clears_total"), 0, "replay covered the downtime");
    assert_eq!(metric(&svc, "radixkv_indexer_restarts_total"), 0);
    for _ in 0..20 {
        for w in &mut ws {
            w.step(&ps, &reference);
        }
    }
    for w in &ws {
        w.wait_applied(&svc);
    }
    check_exact(&svc, &ps, &reference);
    svc.shutdown().unwrap();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn peer_bootstrap_from_a_running_replica() {
    let a = start(config());
    let reference = Reference::new();
    let ps = prompts(16, 6);
    let mut ws: Vec<Worker> = (21..=22).map(|i| Worker::start(i, i, None)).collect();
    for w in &ws {
        register(&a, w.id, &w.endpoint, Some(&w.replay));
    }
    for _ in 0..50 {
        for w in &mut ws {
            w.step(&ps, &reference);
        }
    }
    for w in &ws {
        w.wait_applied(&a);
    }
    let dump = get(&url(&a, "/dump")).unwrap().json().unwrap();
    assert_eq!(dump["registrations"].as_array().unwrap().len(), 2);
    let b = start(radixkv_indexer::Config {
        peer: Some(format!("http://{}", a.local_addr())),
        ..config()
    });
    for w in &ws {
        w.wait_applied(&b);
    }
    check_exact(&b, &ps, &reference);
    // Both replicas follow the same publishers (PUB fan-out).
    for _ in 0..30 {
        for w in &mut ws {
            w.step(&ps, &reference);
        }
    }
    for svc in [&a, &b] {
        for w in &ws {
            w.wait_applied(svc);
        }
        check_exact(svc, &ps, &reference);
    }
    b.shutdown().unwrap();
    a.shutdown().unwrap();
}

#[test]
fn bad_input_is_refused_and_the_service_keeps_answering() {
    let svc = start(radixkv_indexer::Config { max_body: 1 << 20, ..config() });
    let reference = Reference::new();
    let ps = prompts(8, 4);
    let check = |r: radixkv_indexer::client::Response, status: u16, what: &str| {
        assert_eq!(r.status, status, "{what}: {}", r.text());
        if status != 413 {
            let v = r.json().unwrap();
            assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{what}: a message");
        } else {
            assert!(!r.body.is_empty(), "413 with a message");
        }
    };
    let garbage = |path: &str| {
        request("POST", &url(&svc, path), Some(b"{not json"), Duration::from_secs(10)).unwrap()
    };
    check(garbage("/register"), 400, "garbage JSON");
    check(garbage("/query"), 400, "garbage JSON");
    check(
        post(&svc, "/register", json!({"instance_id": 1, "endpoint": "tcp://127.0.0.1:9"})),
        400,
        "missing fields",
    );
    check(
        post(&svc, "/query", json!({"token_ids": [1, 2, 3, 4], "model_name": "nope"})),
        404,
        "unknown model",
    );
    check(
        post(&svc, "/query_by_hash", json!({"block_hashes": [1], "model_name": "nope"})),
        404,
        "unknown model",
    );
    let huge = vec![b'1'; 2 << 20];
    check(
        request("POST", &url(&svc, "/query"), Some(&huge), Duration::from_secs(10)).unwrap(),
        413,
        "huge body",
    );
    check(
        post(
            &svc,
            "/register",
            json!({"instance_id": 1, "endpoint": "tcp://*:5557", "model_name": MODEL, "block_size": BS}),
        ),
        400,
        "an endpoint to bind",
    );
    let fp = FakePublisher::start();
    let id = 3;
    register(&svc, id, &fp.endpoint, Some(&fp.replay));
    check(
        post(
            &svc,
            "/register",
            json!({"instance_id": 4, "endpoint": fp.endpoint, "model_name": MODEL, "block_size": BS * 2}),
        ),
        409,
        "another block size",
    );
    check(
        post(
            &svc,
            "/register",
            json!({"instance_id": id, "endpoint": fp.endpoint, "model_name": MODEL, "block_size": BS}),
        ),
        409,
        "registered twice",
    );
    check(
        post(&svc, "/unregister", json!({"instance_id": 99, "model_name": MODEL})),
        404,
        "not registered",
    );
    check(
        post(
            &svc,
            "/register",
            json!({"instance_id": 5, "endpoint": fp.endpoint, "model_name": MODEL, "block_size": 0}),
        ),
        400,
        "block_size 0",
    );

    // Malformed messages and payloads on the stream: counted and skipped, no clear.
    let mut engine = MockEngine::new(3);
    let mut seq = join(&svc, &fp, id, &mut engine, &ps, &reference);
    wait_for("the joined stream", 30, || cursor(&svc, id) == Some(seq));
    fp.raw(vec![b"t".to_vec(), b"x".to_vec()]);
    fp.raw(vec![b"t".to_vec(), vec![0; 4], b"x".to_vec()]);
    fp.raw(vec![b"t".to_vec(), seq.to_be_bytes().to_vec(), b"\xc1garbage".to_vec()]);
    reference.apply(id, seq, &[]);
    seq += 1;
    for _ in 0..10 {
        let ev = engine.step(&ps);
        fp.batch(seq, &ev, true);
        reference.apply(id, seq, &ev);
        seq += 1;
    }
    wait_for("the stream past the garbage", 30, || cursor(&svc, id) == Some(seq));
    assert_eq!(metric(&svc, "radixkv_indexer_bad_frames_total"), 2);
    assert!(metric(&svc, "radixkv_indexer_malformed_batches_total") >= 1);
    assert_eq!(metric(&svc, "radixkv_indexer_gap_clears_total"), 0);
    check_exact(&svc, &ps, &reference);
    assert!(metric(&svc, "radixkv_indexer_http_client_errors_total") >= 10);
    let h = get(&url(&svc, "/healthz")).unwrap();
    assert_eq!((h.status, h.text().as_str()), (200, "ok"));
    svc.shutdown().unwrap();
}

#[test]
fn a_publisher_killed_for_good_stalls_nobody() {
    let svc =
        start(radixkv_indexer::Config { replay_timeout: Duration::from_millis(300), ..config() });
    let reference = Reference::new();
    let ps = prompts(16, 6);
    let mut dead = Worker::start(41, 41, None);
    let mut live = Worker::start(42, 42, None);
    for w in [&dead, &live] {
        register(&svc, w.id, &w.endpoint, Some(&w.replay));
    }
    for _ in 0..30 {
        dead.step(&ps, &reference);
        live.step(&ps, &reference);
    }
    dead.wait_applied(&svc);
    live.wait_applied(&svc);
    // Killed for good: its SUB reconnects and its replays fail (backing off) for ever.
    dead.stop();
    for _ in 0..100 {
        live.step(&ps, &reference);
    }
    live.wait_applied(&svc);
    // What it held stays until it is unregistered (an engine gone silent is not known to
    // be gone): the answers are still exact.
    check_exact(&svc, &ps, &reference);
    wait_for("a failed replay of the dead worker", 30, || {
        metric(&svc, "radixkv_indexer_replay_failures_total") > 0
    });
    let r = post(&svc, "/unregister", json!({"instance_id": 41, "model_name": MODEL}));
    assert_eq!(r.status, 200, "{}", r.text());
    reference.index.remove_worker(RWorker::new(41, 0));
    check_exact(&svc, &ps, &reference);
    for _ in 0..20 {
        live.step(&ps, &reference);
    }
    live.wait_applied(&svc);
    check_exact(&svc, &ps, &reference);
    svc.shutdown().unwrap();
}

#[test]
fn registers_past_the_memory_cap_are_refused() {
    let svc = start(radixkv_indexer::Config { max_bytes: Some(1), ..config() });
    let fp = FakePublisher::start();
    // The first makes the index (whose empty size is already past 1 byte).
    register(&svc, 1, &fp.endpoint, None);
    let r = post(
        &svc,
        "/register",
        json!({"instance_id": 2, "endpoint": fp.endpoint, "model_name": MODEL, "block_size": BS}),
    );
    assert_eq!(r.status, 507, "{}", r.text());
    assert!(r.json().unwrap()["error"].as_str().unwrap().contains("memory cap"));
    assert_eq!(metric(&svc, "radixkv_indexer_max_bytes"), 1);
    assert_eq!(metric(&svc, "radixkv_indexer_registered_workers"), 1);
    svc.shutdown().unwrap();
}

/// The engine restarts while the indexer is down and its new stream passes the old cursor
/// (a seq above it, not below): the batch at the snapshot's last seq, replayed, has other
/// bytes, so the restart is seen and the old blocks are dropped.
#[test]
fn a_restart_during_the_indexers_downtime_past_the_old_cursor() {
    let path = temp("restart-snapshot.json");
    let cfg = radixkv_indexer::Config { snapshot: Some(path.clone()), ..config() };
    let svc = start(cfg.clone());
    let reference = Reference::new();
    let ps = prompts(16, 6);
    let mut w = Worker::start(51, 51, None);
    register(&svc, 51, &w.endpoint, Some(&w.replay));
    for _ in 0..30 {
        w.step(&ps, &reference);
    }
    w.wait_applied(&svc);
    svc.shutdown().unwrap();
    let ports = w.ports();
    w.stop();
    reference.index.remove_worker(RWorker::new(51, 0));
    let ps2 = shifted(&ps, 7);
    let mut w2 = Worker::start(51, 77, Some(ports));
    for _ in 0..80 {
        w2.step(&ps2, &reference);
    }
    let svc = start(cfg);
    w2.wait_applied(&svc);
    assert!(metric(&svc, "radixkv_indexer_restarts_total") >= 1);
    check_exact(&svc, &ps, &reference);
    check_exact(&svc, &ps2, &reference);
    for p in &ps {
        assert!(!query(&svc, p).contains_key(&51), "an old block credited");
    }
    // And live from there on.
    for _ in 0..20 {
        w2.step(&ps2, &reference);
    }
    w2.wait_applied(&svc);
    check_exact(&svc, &ps2, &reference);
    svc.shutdown().unwrap();
    let _ = std::fs::remove_file(&path);
}

/// A client that sends its headers and part of its body, then nothing: its request gets 408
/// once `request_timeout` has passed, while other clients are answered meanwhile (no
/// timing is asserted: the 408 is waited for, the other queries only have to succeed).
#[test]
fn a_body_sent_too_slowly_gets_408_and_stalls_nobody() {
    use std::io::{Read, Write};
    let svc =
        start(radixkv_indexer::Config { request_timeout: Duration::from_millis(500), ..config() });
    let mut slow = std::net::TcpStream::connect(svc.local_addr()).unwrap();
    write!(
        slow,
        "POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"token_ids\": ["
    )
    .unwrap();
    slow.flush().unwrap();
    // Others are served while that body is outstanding.
    for _ in 0..3 {
        let r = post(&svc, "/query", json!({"token_ids": [1, 2, 3, 4], "model_name": "nope"}));
        assert_eq!(r.status, 404, "{}", r.text());
    }
    // The stalled request is answered 408 (read with a deadline, so a hang fails the test).
    slow.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = slow.read(&mut buf).expect("an answer before the deadline");
        assert!(
            n > 0,
            "the connection closed without an answer: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&got);
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    let m = get(&url(&svc, "/healthz")).unwrap();
    assert_eq!(m.status, 200);
}

/// A store published with a cache salt is found by `/query` with that salt only (the salt
/// is mixed into the hashes, as engines and Dynamo mix it), and `/query_by_hash` refuses a
/// `cache_salt` (400: its hashes carry their namespace already).
#[test]
fn cache_salt_separates_tenants_in_one_index() {
    use std::sync::Arc as A;
    let svc = start(config());
    let reference = Reference::new();
    let mut w = Worker::start(71, 71, None);
    register(&svc, 71, &w.endpoint.clone(), Some(&w.replay.clone()));
    let tokens: Vec<u32> = (0..(2 * BS)).map(|t| 9_000 + t).collect();
    let ev = radixkv::events::KvEvent::BlockStored {
        block_hashes: vec![0x5a17_0001, 0x5a17_0002],
        parent_block_hash: None,
        token_ids: tokens.clone(),
        block_size: BS,
        lora_name: None,
        cache_salt: Some(A::from("tenant-a")),
        medium: radixkv::events::Medium::Gpu,
    };
    w.publish(vec![ev], &reference);
    w.wait_applied(&svc);
    let ask = |salt: Option<&str>| {
        let r = post(
            &svc,
            "/query",
            json!({"token_ids": tokens, "model_name": MODEL, "cache_salt": salt}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        scores_of(&r.json().unwrap())
    };
    assert_eq!(ask(Some("tenant-a")), [(71, 2 * BS as u64)].into());
    assert_eq!(ask(None), BTreeMap::new(), "unsalted: another namespace");
    assert_eq!(ask(Some("tenant-b")), BTreeMap::new(), "another salt");
    let r = post(
        &svc,
        "/query_by_hash",
        json!({"block_hashes": [1, 2], "model_name": MODEL, "cache_salt": "tenant-a"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    w.stop();
}
