//! The ZMQ publisher over real loopback sockets: PUB/SUB decoded by radixkv's decoder and
//! Dynamo's, replay through a real ROUTER socket, bad endpoints, drop counting, and a soak.

use std::sync::Arc;
use std::time::Duration;

use radixkv::Error;
use radixkv::events::wire::{
    Encoding, EventGroup, KvCacheSpecKind, KvGroup, WireOptions, decode_batch,
};
use radixkv::events::{EventSink, KvEvent, NamespaceMeta, SinkOptions};
use radixkv_publisher::{Publisher, PublisherOptions, REPLAY_END};

fn sink(page: u32) -> Arc<EventSink> {
    Arc::new(EventSink::new(SinkOptions { block_size: page, ..Default::default() }).unwrap())
}

fn opts(encoding: Encoding) -> PublisherOptions {
    PublisherOptions {
        endpoint: "tcp://127.0.0.1:*".into(),
        auto_flush: None,
        linger: Duration::from_millis(200),
        wire: WireOptions { encoding, ..Default::default() },
        topic: "kv@127.0.0.1:0@test".into(),
        ..Default::default()
    }
}

fn subscriber(ctx: &zmq::Context, endpoint: &str) -> zmq::Socket {
    let s = ctx.socket(zmq::SUB).unwrap();
    s.set_rcvtimeo(5000).unwrap();
    s.set_subscribe(b"").unwrap();
    s.connect(endpoint).unwrap();
    s
}

/// Publishes probe batches until the subscriber gets one (a SUB socket misses what a PUB
/// sends before its subscription arrives) and returns the next sequence number expected.
fn join(sink: &EventSink, sub: &zmq::Socket) -> u64 {
    sub.set_rcvtimeo(20).unwrap();
    let mut last = None;
    for _ in 0..500 {
        sink.removed(vec![]);
        sink.flush();
        if let Ok(m) = sub.recv_multipart(0) {
            last = Some(u64::from_be_bytes(m[1][..].try_into().unwrap()));
            break;
        }
    }
    let mut last = last.expect("the subscriber never joined");
    // Drain the probes still in flight.
    while let Ok(m) = sub.recv_multipart(0) {
        last = u64::from_be_bytes(m[1][..].try_into().unwrap());
    }
    sub.set_rcvtimeo(5000).unwrap();
    last + 1
}

/// The events of test batch `i` (page size 2).
fn batch_events(i: u64) -> Vec<KvEvent> {
    let h = 1000 + 2 * i;
    let mut v = vec![KvEvent::BlockStored {
        block_hashes: vec![h, h + 1],
        parent_block_hash: (i > 0).then_some(h - 1),
        token_ids: vec![i as u32, 1, 2, 3],
        block_size: 2,
        lora_name: None,
        cache_salt: Some("tenant".into()),
        medium: Default::default(),
    }];
    if i % 3 == 2 {
        v.push(KvEvent::BlockRemoved { block_hashes: vec![h + 1], medium: Default::default() });
    }
    v
}

#[test]
fn pub_sub_over_loopback_decodes_with_radixkv_and_dynamo() {
    use dynamo_kv_router::protocols::WorkerWithDpRank;
    use dynamo_kv_router::zmq_wire::{RawKvEvent, ZmqEventNormalizer, decode_event_batch};
    for encoding in [Encoding::VllmArray, Encoding::VllmMap] {
        let s = sink(2);
        let p = Publisher::start(&s, opts(encoding)).unwrap();
        let ctx = zmq::Context::new();
        let sub = subscriber(&ctx, p.endpoint());
        let first = join(&s, &sub);
        let n = 60;
        for i in 0..n {
            for e in batch_events(i) {
                s.push(e);
            }
            assert_eq!(s.flush(), Some(first + i));
        }
        let mut norm = ZmqEventNormalizer::new(2);
        let worker = WorkerWithDpRank { worker_id: 1, dp_rank: 0 };
        for i in 0..n {
            let m = sub.recv_multipart(0).expect("a batch");
            assert_eq!(m.len(), 3, "three frames");
            assert_eq!(m[0], b"kv@127.0.0.1:0@test");
            assert_eq!(
                u64::from_be_bytes(m[1][..].try_into().unwrap()),
                first + i,
                "gapless, in order"
            );
            let ours = decode_batch(&m[2]).unwrap();
            assert_eq!(ours.batch.events, batch_events(i), "{}", encoding.name());
            assert_eq!(ours.data_parallel_rank, Some(0));
            let theirs = decode_event_batch(&m[2]).unwrap();
            assert_eq!(theirs.events.len(), batch_events(i).len());
            for (j, raw) in theirs.events.into_iter().enumerate() {
                if let RawKvEvent::BlockStored { block_hashes, cache_namespace, .. } = &raw {
                    assert_eq!(block_hashes[0].into_u64(), 1000 + 2 * i);
                    assert_eq!(cache_namespace.as_deref(), Some("tenant"));
                }
                assert!(
                    norm.normalize(raw, first + i + j as u64, worker).is_some(),
                    "Dynamo's normalizer keeps every event ({})",
                    encoding.name()
                );
            }
        }
        let st = p.stop();
        assert_eq!(st.dropped, 0);
        assert_eq!(st.published, first + n);
    }
}

#[test]
fn replay_through_a_router_socket() {
    let s = sink(1);
    let mut o = opts(Encoding::VllmArray);
    o.replay_endpoint = Some("tcp://127.0.0.1:*".into());
    o.buffer_steps = 5;
    let p = Publisher::start(&s, o).unwrap();
    let ctx = zmq::Context::new();
    for i in 0..10u64 {
        s.removed(vec![i]);
        s.flush();
    }
    for _ in 0..1000 {
        if p.stats().published == 10 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(p.stats().published, 10);
    let client = ctx.socket(zmq::DEALER).unwrap();
    client.set_rcvtimeo(5000).unwrap();
    client.connect(p.replay_endpoint().unwrap()).unwrap();
    let ask = |start: u64| -> Vec<u64> {
        client.send_multipart([&b""[..], &start.to_be_bytes()], 0).unwrap();
        let mut got = Vec::new();
        loop {
            let m = client.recv_multipart(0).expect("a replay answer");
            assert_eq!(m.len(), 3);
            assert!(m[0].is_empty());
            let seq = u64::from_be_bytes(m[1][..].try_into().unwrap());
            if seq == REPLAY_END {
                assert!(m[2].is_empty());
                return got;
            }
            let d = decode_batch(&m[2]).unwrap();
            assert_eq!(
                d.batch.events,
                vec![KvEvent::BlockRemoved { block_hashes: vec![seq], medium: Default::default() }]
            );
            got.push(seq);
        }
    };
    assert_eq!(ask(7), vec![7, 8, 9]);
    assert_eq!(ask(0), vec![5, 6, 7, 8, 9], "only the last buffer_steps are kept");
    assert_eq!(ask(10), Vec::<u64>::new());
    let st = p.stop();
    assert_eq!((st.replayed, st.replay_requests), (8, 3));
}

/// A publisher of a hybrid model's group (one cache per KV group) sends its group in every
/// `BlockStored` and `BlockRemoved`, in both encodings (read back through replay).
#[test]
fn a_caches_kv_group_rides_on_every_store_and_removal() {
    for (encoding, group) in [
        (Encoding::VllmArray, KvGroup::new(2, KvCacheSpecKind::SlidingWindow, Some(512)).unwrap()),
        (Encoding::VllmMap, KvGroup::new(1, KvCacheSpecKind::Mamba, None).unwrap()),
    ] {
        let s = sink(2);
        let mut o = opts(encoding);
        o.replay_endpoint = Some("tcp://127.0.0.1:*".into());
        o.wire.group = group;
        let p = Publisher::start(&s, o).unwrap();
        s.stored(0, vec![11], None, vec![1, 2]);
        s.removed(vec![11]);
        s.flush();
        for _ in 0..1000 {
            if p.stats().published == 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(p.stats().published, 1);
        let ctx = zmq::Context::new();
        let client = ctx.socket(zmq::DEALER).unwrap();
        client.set_rcvtimeo(5000).unwrap();
        client.connect(p.replay_endpoint().unwrap()).unwrap();
        client.send_multipart([&b""[..], &0u64.to_be_bytes()], 0).unwrap();
        let m = client.recv_multipart(0).expect("a replay answer");
        let d = decode_batch(&m[2]).unwrap();
        let stored = EventGroup {
            group_idx: Some(group.idx()),
            kind: Some(group.kind()),
            sliding_window: group.sliding_window(),
        };
        let removed = EventGroup { group_idx: Some(group.idx()), kind: None, sliding_window: None };
        assert_eq!(d.groups, vec![stored, removed], "{encoding:?}");
        let end = client.recv_multipart(0).expect("the end marker");
        assert_eq!(u64::from_be_bytes(end[1][..].try_into().unwrap()), REPLAY_END);
        p.stop();
    }
}

#[test]
fn batches_closed_before_the_publisher_go_first_and_the_sink_drains_again_after_it() {
    let s = sink(1);
    s.removed(vec![10]);
    assert_eq!(s.flush(), Some(0));
    let mut o = opts(Encoding::VllmMap);
    o.replay_endpoint = Some("tcp://127.0.0.1:*".into());
    let p = Publisher::start(&s, o).unwrap();
    let ctx = zmq::Context::new();
    assert!(s.drain().is_empty(), "handed to the publisher");
    s.removed(vec![11]);
    assert_eq!(s.flush(), Some(1));
    for _ in 0..1000 {
        if p.stats().published == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let client = ctx.socket(zmq::DEALER).unwrap();
    client.set_rcvtimeo(5000).unwrap();
    client.connect(p.replay_endpoint().unwrap()).unwrap();
    client.send_multipart([&b""[..], &0u64.to_be_bytes()], 0).unwrap();
    for want in [10u64, 11] {
        let m = client.recv_multipart(0).unwrap();
        assert_eq!(u64::from_be_bytes(m[1][..].try_into().unwrap()), want - 10);
        let d = decode_batch(&m[2]).unwrap();
        assert_eq!(
            d.batch.events,
            vec![KvEvent::BlockRemoved { block_hashes: vec![want], medium: Default::default() }]
        );
    }
    assert_eq!(
        u64::from_be_bytes(client.recv_multipart(0).unwrap()[1][..].try_into().unwrap()),
        REPLAY_END
    );
    s.removed(vec![12]);
    let st = p.stop();
    assert_eq!((st.published, st.dropped), (3, 0), "stop flushed the open batch and sent it");
    s.removed(vec![13]);
    assert_eq!(s.flush(), Some(3), "the numbering goes on");
    assert_eq!(s.drain().len(), 1, "the sink drains again");
}

/// A PUB endpoint without `*` connects, in the background and retrying: here it starts
/// before the subscriber binds, and reaches it once it does.
#[test]
fn a_connecting_publisher_reaches_a_subscriber_that_binds_later() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let s = sink(1);
    let o = PublisherOptions {
        endpoint: format!("tcp://127.0.0.1:{port}"),
        ..opts(Encoding::VllmArray)
    };
    let p = Publisher::start(&s, o).unwrap();
    assert_eq!(p.endpoint(), format!("tcp://127.0.0.1:{port}"));
    // Batches before anyone listens go nowhere, and are counted as sent.
    s.removed(vec![1]);
    s.flush();
    std::thread::sleep(Duration::from_millis(50));
    let ctx = zmq::Context::new();
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.bind(&format!("tcp://127.0.0.1:{port}")).unwrap();
    let next = join(&s, &sub);
    s.removed(vec![42]);
    assert_eq!(s.flush(), Some(next));
    let m = sub.recv_multipart(0).expect("a batch over the connection the publisher made");
    assert_eq!(u64::from_be_bytes(m[1][..].try_into().unwrap()), next);
    assert_eq!(
        decode_batch(&m[2]).unwrap().batch.events,
        vec![KvEvent::BlockRemoved { block_hashes: vec![42], medium: Default::default() }]
    );
    let st = p.stop();
    assert_eq!(st.published + st.dropped, next + 1);
}

fn start_err(s: &Arc<EventSink>, o: PublisherOptions) -> String {
    match Publisher::start(s, o) {
        Err(Error::InvalidArgument(m)) => m,
        Err(e) => panic!("wrong error {e:?}"),
        Ok(_) => panic!("started"),
    }
}

/// The refusal of an address in use: the environment's (`Error::Io`), not a bad argument.
fn start_io_err(s: &Arc<EventSink>, o: PublisherOptions) -> String {
    match Publisher::start(s, o) {
        Err(Error::Io(m)) => m,
        Err(e) => panic!("wrong error {e:?}"),
        Ok(_) => panic!("started"),
    }
}

#[test]
fn bad_endpoints_and_ports_in_use_are_clear_errors() {
    let s = sink(1);
    for ep in ["nonsense", "tcp://*:notaport", "foo://*:1", "tcp://nohostport", "inproc://x"] {
        let m =
            start_err(&s, PublisherOptions { endpoint: ep.into(), ..opts(Encoding::VllmArray) });
        assert!(m.contains(ep), "{m}");
    }
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let taken = format!("tcp://127.0.0.1:{port}");
    let m = start_io_err(
        &s,
        PublisherOptions { replay_endpoint: Some(taken.clone()), ..opts(Encoding::VllmArray) },
    );
    assert!(m.contains(&taken) && m.to_lowercase().contains("in use"), "{m}");
    let m = start_io_err(
        &s,
        PublisherOptions { endpoint: format!("tcp://*:{port}"), ..opts(Encoding::VllmArray) },
    );
    assert!(m.to_lowercase().contains("in use"), "{m}");
    // None of the failures attached the sink: a publisher starts on it now, and a second
    // one is refused.
    let p = Publisher::start(&s, opts(Encoding::VllmArray)).unwrap();
    let m = start_err(&s, opts(Encoding::VllmArray));
    assert!(m.contains("attached"), "{m}");
    drop(p);
    let _ = s.set_namespace(1, NamespaceMeta::default());
}

/// `hwm` is libzmq's `int`: past `i32::MAX` it is refused, and nothing is attached.
#[test]
fn an_hwm_past_i32_max_is_refused() {
    let s = sink(1);
    let m =
        start_err(&s, PublisherOptions { hwm: i32::MAX as usize + 1, ..opts(Encoding::VllmArray) });
    assert!(m.contains("hwm"), "{m}");
    let p = Publisher::start(&s, PublisherOptions { hwm: 0, ..opts(Encoding::VllmArray) })
        .expect("0 is no limit, as in libzmq");
    drop(p);
}

#[test]
fn a_full_queue_drops_whole_batches_and_counts_them() {
    let s = sink(1);
    let o = PublisherOptions { max_queue: 4, ..opts(Encoding::VllmArray) };
    let p = Publisher::start(&s, o).unwrap();
    let ctx = zmq::Context::new();
    // Subscribed, never read: the PUB side drops past its high-water mark without blocking,
    // and the pushes outrun the thread's small queue.
    let sub = subscriber(&ctx, p.endpoint());
    let pushed = 20_000u64;
    for i in 0..pushed {
        s.removed(vec![i, i + 1, i + 2]);
        s.flush();
    }
    assert_eq!(s.stats().batches, pushed, "every flush closed a batch and took a number");
    let st = p.stop();
    eprintln!("drops: {pushed} batches pushed; {st:?}");
    assert_eq!(st.published + st.dropped, pushed, "{st:?}");
    // What did arrive is whole batches, in order.
    sub.set_rcvtimeo(100).unwrap();
    let mut prev = None;
    while let Ok(m) = sub.recv_multipart(0) {
        let seq = u64::from_be_bytes(m[1][..].try_into().unwrap());
        assert!(prev.is_none_or(|p| seq > p));
        let d = decode_batch(&m[2]).unwrap();
        assert_eq!(
            d.batch.events,
            vec![KvEvent::BlockRemoved {
                block_hashes: vec![seq, seq + 1, seq + 2],
                medium: Default::default()
            }]
        );
        prev = Some(seq);
    }
}

/// 100,000 batches (`RADIXKV_SOAK_BATCHES` to change it) to a subscriber reading on its own
/// thread at the default high-water mark and queue size: nothing is lost. Past what the
/// high-water mark and the queue can hold while the reader falls behind, libzmq drops (the
/// gaps replay repairs); the test then reports the loss instead of asserting none.
#[test]
fn soak_nothing_lost_at_the_default_high_water_mark() {
    let n: u64 =
        std::env::var("RADIXKV_SOAK_BATCHES").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let s = sink(16);
    let o = PublisherOptions { topic: String::new(), ..opts(Encoding::VllmArray) };
    // The PUB socket's high-water mark (`hwm`, vLLM's 100,000) and the queue's, defaults.
    let (hwm, max_queue) = (o.hwm as u64, o.max_queue as u64);
    let p = Publisher::start(&s, o).unwrap();
    let ctx = zmq::Context::new();
    let sub = subscriber(&ctx, p.endpoint());
    let first = join(&s, &sub);
    let last = first + n - 1;
    let reader = std::thread::spawn(move || {
        let (mut got, mut prev) = (0u64, first - 1);
        while prev < last {
            let Ok(m) = sub.recv_multipart(0) else { break };
            let seq = u64::from_be_bytes(m[1][..].try_into().unwrap());
            assert!(seq > prev, "a reorder");
            let d = decode_batch(&m[2]).unwrap();
            assert_eq!(d.batch.events.len(), 1);
            prev = seq;
            got += 1;
        }
        got
    });
    let t = std::time::Instant::now();
    for i in 0..n {
        let tokens: Vec<u32> =
            (0..16).map(|k| (i as u32).wrapping_mul(31).wrapping_add(k)).collect();
        s.stored(0, vec![i], i.checked_sub(1), tokens);
        s.flush();
    }
    let pushed_in = t.elapsed();
    let got = reader.join().unwrap();
    let st = p.stop();
    eprintln!(
        "soak: {n} batches pushed in {pushed_in:?}, received {got} ({} lost) in {:?}; {st:?}",
        n - got,
        t.elapsed()
    );
    if n <= hwm.min(max_queue) {
        assert_eq!(got, n, "the subscriber got every batch");
        assert_eq!(st.dropped, 0);
    }
}
