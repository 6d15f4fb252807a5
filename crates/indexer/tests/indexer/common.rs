//! Shared pieces of the indexer's tests: the service in-process on a loopback port, real
//! publishers (radixkv's, and a hand-driven PUB + ROUTER pair for faults), a mock engine
//! making KV events, and the reference index the answers are checked against.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use radixkv::events::wire::{KvGroup, WireOptions, encode_batch};
use radixkv::events::{EventBatch, EventSink, KvEvent, SinkOptions};
use radixkv_indexer::client::{Response, get, post_json};
use radixkv_indexer::{Config, Indexer};
use radixkv_publisher::{Publisher, PublisherOptions};
use radixkv_router::{RouterIndex, RouterOptions, Score};
use serde_json::{Value, json};

pub const BS: u32 = 4;
pub const MODEL: &str = "m";

pub fn config() -> Config {
    Config {
        listen: "127.0.0.1:0".into(),
        log: std::env::var_os("RADIXKV_INDEXER_TEST_LOG").is_some(),
        replay_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

pub fn start(cfg: Config) -> Indexer {
    Indexer::start(cfg).expect("the indexer starts")
}

pub fn url(svc: &Indexer, path: &str) -> String {
    format!("http://{}{}", svc.local_addr(), path)
}

pub fn post(svc: &Indexer, path: &str, body: Value) -> Response {
    post_json(&url(svc, path), &body).expect("an answer")
}

/// Polls `f` until it is true, failing after `secs`.
pub fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A metric's value from `/metrics` (the first sample whose name and labels start with
/// `name`).
pub fn metric(svc: &Indexer, name: &str) -> u64 {
    let text = get(&url(svc, "/metrics")).unwrap().text();
    for l in text.lines() {
        if l.starts_with('#') {
            continue;
        }
        if let Some((k, v)) = l.rsplit_once(' ')
            && k == name
        {
            return v.parse::<f64>().unwrap() as u64;
        }
    }
    panic!("no metric {name} in\n{text}")
}

/// The indexer's cursor for `(instance_id, dp_rank)` from `/workers`.
pub fn cursor(svc: &Indexer, id: u64) -> Option<u64> {
    let w = get(&url(svc, "/workers")).unwrap().json().unwrap();
    w.as_array()?
        .iter()
        .find(|e| e["instance_id"].as_u64() == Some(id))
        .and_then(|e| e["next_seq"]["0"].as_u64())
}

pub fn register(svc: &Indexer, id: u64, endpoint: &str, replay: Option<&str>) {
    let r = post(
        svc,
        "/register",
        json!({"instance_id": id, "endpoint": endpoint, "model_name": MODEL,
               "block_size": BS, "replay_endpoint": replay}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

/// `/query`'s `scores` as {worker_id: matched tokens} (dp rank 0).
pub fn query(svc: &Indexer, tokens: &[u32]) -> BTreeMap<u64, u64> {
    let r = post(svc, "/query", json!({"token_ids": tokens, "model_name": MODEL}));
    assert_eq!(r.status, 200, "{}", r.text());
    scores_of(&r.json().unwrap())
}

pub fn scores_of(v: &Value) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    for (w, ranks) in v["scores"].as_object().expect("scores") {
        for (r, t) in ranks.as_object().unwrap() {
            assert_eq!(r, "0");
            out.insert(w.parse().unwrap(), t.as_u64().unwrap());
        }
    }
    out
}

/// The reference: a router index fed the same batches directly.
pub struct Reference {
    pub index: RouterIndex,
}

impl Reference {
    pub fn new() -> Reference {
        Reference {
            index: RouterIndex::new(RouterOptions { block_size: BS, ..Default::default() })
                .unwrap(),
        }
    }
    pub fn apply(&self, worker: u64, seq: u64, events: &[KvEvent]) {
        let p =
            encode_batch(&EventBatch { ts: 0.0, events: events.to_vec() }, &WireOptions::default());
        self.index.apply_batch(worker, seq, &p).unwrap();
    }
    pub fn scores(&self, tokens: &[u32]) -> BTreeMap<u64, u64> {
        let mut out: Vec<Score> = Vec::new();
        self.index.find(tokens, None, None, &mut out);
        out.iter()
            .filter(|s| s.device_blocks > 0)
            .map(|s| (s.worker.worker_id, u64::from(s.device_blocks * BS)))
            .collect()
    }
}

/// Prompts sharing prefixes: prompt `i` is group `i % 4`'s two blocks, then its own.
pub fn prompts(n: usize, blocks: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            let mut t = Vec::new();
            for b in 0..blocks {
                for k in 0..BS {
                    let v =
                        if b < 2 { (i % 4) * 1000 + b * 10 } else { 100_000 + i * 1000 + b * 10 };
                    t.push((v + k as usize) as u32);
                }
            }
            t
        })
        .collect()
}

/// A mock engine: stores prompt prefixes and evicts blocks, producing the KV events.
pub struct MockEngine {
    rng: u64,
    held: HashSet<u64>,
    /// A salt mixed into the engine hashes (a restarted engine names blocks anew).
    pub salt: u64,
}

fn mix(a: u64, b: u64) -> u64 {
    let mut x = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 29)
}

impl MockEngine {
    pub fn new(seed: u64) -> MockEngine {
        MockEngine { rng: seed.wrapping_mul(2654435761) | 1, held: HashSet::new(), salt: seed }
    }
    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }
    /// The engine hashes of `tokens`' blocks.
    pub fn hashes(&self, tokens: &[u32]) -> Vec<u64> {
        let mut h = self.salt;
        tokens
            .chunks_exact(BS as usize)
            .map(|b| {
                for &t in b {
                    h = mix(h, u64::from(t));
                }
                h
            })
            .collect()
    }
    /// One step's events: a store of a prompt prefix, and sometimes an eviction.
    pub fn step(&mut self, prompts: &[Vec<u32>]) -> Vec<KvEvent> {
        let p = &prompts[(self.next() % prompts.len() as u64) as usize];
        let nb = p.len() / BS as usize;
        let len = 1 + (self.next() % nb as u64) as usize;
        let hs = self.hashes(&p[..len * BS as usize]);
        let mut ev = Vec::new();
        let k = hs.iter().position(|h| !self.held.contains(h)).unwrap_or(len);
        if k < len {
            ev.push(KvEvent::BlockStored {
                block_hashes: hs[k..].to_vec(),
                parent_block_hash: (k > 0).then(|| hs[k - 1]),
                token_ids: p[k * BS as usize..len * BS as usize].to_vec(),
                block_size: BS,
                lora_name: None,
                cache_salt: None,
                medium: Default::default(),
            });
            self.held.extend(&hs[k..]);
        }
        if self.held.len() > 40 && self.next().is_multiple_of(2) {
            let mut v: Vec<u64> = self.held.iter().copied().collect();
            v.sort_unstable();
            let victim = v[(self.next() % v.len() as u64) as usize];
            self.held.remove(&victim);
            ev.push(KvEvent::BlockRemoved {
                block_hashes: vec![victim],
                medium: Default::default(),
            });
        }
        if ev.is_empty() {
            // Something to send all the same (an empty removal).
            ev.push(KvEvent::BlockRemoved { block_hashes: vec![], medium: Default::default() });
        }
        ev
    }
}

/// A worker: radixkv's publisher over an event sink, with a replay socket, driven by a
/// mock engine; every batch also goes to the reference.
pub struct Worker {
    pub id: u64,
    pub sink: Arc<EventSink>,
    pub publisher: Option<Publisher>,
    pub engine: MockEngine,
    pub endpoint: String,
    pub replay: String,
    /// The last seq published.
    pub last: Option<u64>,
}

impl Worker {
    /// Binds on any free ports (or the given ones, for a restart).
    pub fn start(id: u64, seed: u64, ports: Option<(u16, u16)>) -> Worker {
        let sink =
            Arc::new(EventSink::new(SinkOptions { block_size: BS, ..Default::default() }).unwrap());
        // A `*` makes radixkv's publisher bind (vLLM's rule).
        let (ep, rp) = match ports {
            None => ("tcp://127.0.0.1:*".to_string(), "tcp://127.0.0.1:*".to_string()),
            Some((p, q)) => (format!("tcp://*:{p}"), format!("tcp://127.0.0.1:{q}")),
        };
        let mut tries = 0;
        let publisher = loop {
            match Publisher::start(
                &sink,
                PublisherOptions {
                    endpoint: ep.clone(),
                    replay_endpoint: Some(rp.clone()),
                    auto_flush: None,
                    linger: Duration::from_millis(100),
                    topic: format!("kv@test@{id}"),
                    ..Default::default()
                },
            ) {
                Ok(p) => break p,
                // A restart on the same ports: the old sockets may still be closing.
                Err(_) if tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("publisher: {e}"),
            }
        };
        let endpoint = publisher.endpoint().replace("0.0.0.0", "127.0.0.1");
        let replay = publisher.replay_endpoint().unwrap().to_owned();
        Worker {
            id,
            sink,
            publisher: Some(publisher),
            engine: MockEngine::new(seed),
            endpoint,
            replay,
            last: None,
        }
    }

    /// Publishes one batch of the mock engine's events (also applied to `reference`).
    pub fn step(&mut self, prompts: &[Vec<u32>], reference: &Reference) -> u64 {
        let ev = self.engine.step(prompts);
        self.publish(ev, reference)
    }

    pub fn publish(&mut self, ev: Vec<KvEvent>, reference: &Reference) -> u64 {
        for e in &ev {
            self.sink.push(e.clone());
        }
        let seq = self.sink.flush().expect("a batch");
        reference.apply(self.id, seq, &ev);
        self.last = Some(seq);
        seq
    }

    /// The ports bound (PUB, replay).
    pub fn ports(&self) -> (u16, u16) {
        let port = |e: &str| e.rsplit(':').next().unwrap().parse().unwrap();
        (port(&self.endpoint), port(&self.replay))
    }

    pub fn stop(&mut self) {
        if let Some(p) = self.publisher.take() {
            p.stop();
        }
    }

    /// Waits until `svc` has applied everything this worker published.
    pub fn wait_applied(&self, svc: &Indexer) {
        let want = self.last.map(|s| s + 1);
        wait_for(&format!("worker {} to reach {want:?}", self.id), 60, || {
            cursor(svc, self.id) == want
        });
    }
}

/// Every query of `prompts` (each prompt at full length and at half) answers as `reference`.
pub fn check_exact(svc: &Indexer, prompts: &[Vec<u32>], reference: &Reference) {
    for p in prompts {
        for t in [&p[..], &p[..p.len() / 2]] {
            assert_eq!(query(svc, t), reference.scores(t), "query of {} tokens", t.len());
        }
    }
}

/// A hand-driven publisher (a PUB and a ROUTER replay socket on one thread): batches can
/// be kept for replay but not sent live, and raw messages sent, to force faults.
pub struct FakePublisher {
    pub endpoint: String,
    pub replay: String,
    tx: Sender<Cmd>,
    thread: Option<JoinHandle<()>>,
}

enum Cmd {
    Batch { seq: u64, payload: Vec<u8>, live: bool },
    Raw(Vec<Vec<u8>>),
    Stop,
}

impl FakePublisher {
    pub fn start() -> FakePublisher {
        let ctx = zmq::Context::new();
        let pubs = ctx.socket(zmq::PUB).unwrap();
        pubs.set_linger(0).unwrap();
        pubs.bind("tcp://127.0.0.1:*").unwrap();
        let router = ctx.socket(zmq::ROUTER).unwrap();
        router.set_linger(0).unwrap();
        router.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = pubs.get_last_endpoint().unwrap().unwrap();
        let replay = router.get_last_endpoint().unwrap().unwrap();
        let (tx, rx): (Sender<Cmd>, Receiver<Cmd>) = channel();
        let thread = std::thread::spawn(move || {
            let _ctx = ctx;
            let mut ring: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
            loop {
                loop {
                    match rx.try_recv() {
                        Ok(Cmd::Batch { seq, payload, live }) => {
                            if live {
                                pubs.send_multipart(
                                    [&b"topic"[..], &seq.to_be_bytes()[..], &payload[..]],
                                    0,
                                )
                                .unwrap();
                            }
                            ring.push_back((seq, payload));
                        }
                        Ok(Cmd::Raw(m)) => pubs.send_multipart(m, 0).unwrap(),
                        Ok(Cmd::Stop) | Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                            return;
                        }
                        Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    }
                }
                if router.poll(zmq::POLLIN, 5).unwrap_or(0) > 0 {
                    while let Ok(m) = router.recv_multipart(zmq::DONTWAIT) {
                        if m.len() != 3 || m[2].len() != 8 {
                            continue;
                        }
                        let start = u64::from_be_bytes(m[2][..].try_into().unwrap());
                        for (s, p) in ring.iter().filter(|(s, _)| *s >= start) {
                            router
                                .send_multipart(
                                    [&m[0][..], &b""[..], &s.to_be_bytes()[..], &p[..]],
                                    0,
                                )
                                .unwrap();
                        }
                        router
                            .send_multipart(
                                [&m[0][..], &b""[..], &u64::MAX.to_be_bytes()[..], &b""[..]],
                                0,
                            )
                            .unwrap();
                    }
                }
            }
        });
        FakePublisher { endpoint, replay, tx, thread: Some(thread) }
    }

    /// Keeps `events` as batch `seq` for replay and, when `live`, sends it on PUB.
    pub fn batch(&self, seq: u64, events: &[KvEvent], live: bool) {
        self.batch_of(seq, events, live, KvGroup::default());
    }

    /// `batch` as a cache of KV cache group `group` publishes it.
    pub fn batch_of(&self, seq: u64, events: &[KvEvent], live: bool, group: KvGroup) {
        let o = WireOptions { group, ..Default::default() };
        let payload = encode_batch(&EventBatch { ts: 0.0, events: events.to_vec() }, &o);
        self.tx.send(Cmd::Batch { seq, payload, live }).unwrap();
    }

    pub fn raw(&self, frames: Vec<Vec<u8>>) {
        self.tx.send(Cmd::Raw(frames)).unwrap();
    }
}

impl Drop for FakePublisher {
    fn drop(&mut self) {
        let _ = self.tx.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
