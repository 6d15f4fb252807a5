//! `radixkv replay --kv-events`: a real loopback subscriber (libzmq) receives the replay's
//! batches from the child process, and the pages they leave it holding are the cache's;
//! bad endpoints, an address in use and a bad format are clean errors.

use crate::stream;

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use crate::common::*;
use radixkv::events::hash::{HashMode, PageHasher};
use radixkv::events::wire::decode_batch;
use radixkv::events::{EventBatch, KvEvent};
use radixkv_publisher::REPLAY_END;
use radixkv_trace::synthetic;
use radixkv_trace::{Trace, TraceOptions};

const PAGE: usize = 16;

/// `--kv-events-linger-ms` of the children a test reads replay from: an hour, far longer
/// than any test runs. The test ends the child itself ([`Replay::finish`], or [`Replay`]'s
/// drop when the test fails first), so the publisher still answers replay however slowly
/// the test ran: whether the child is still there never depends on the clock. (A linger of
/// 10 s, as before, ran out on a loaded machine before the test was done.)
const LINGER_MS: &str = "3600000";

/// A `radixkv replay` child with `--json`, its stderr and stdout read on threads of their
/// own: the stderr lines as they come, the JSON report as soon as it is complete (it is
/// printed before the linger, while the publisher still answers replay).
struct Replay {
    child: Child,
    stderr: Receiver<String>,
    report: Receiver<serde_json::Value>,
    stderr_seen: Vec<String>,
}

impl Replay {
    fn spawn(args: &[&str]) -> Replay {
        let mut child = Command::new(env!("CARGO_BIN_EXE_radixkv"))
            .arg("replay")
            .args(args)
            .arg("--json")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("radixkv runs");
        let (etx, stderr) = channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = etx.send(l);
            }
        });
        let (rtx, report) = channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut text = String::new();
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                text.push_str(&l);
                text.push('\n');
                // The pretty-printed object ends with a `}` alone on its line.
                if l == "}" {
                    let v = serde_json::from_str(&text).expect("the report is JSON");
                    let _ = rtx.send(v);
                    text.clear();
                }
            }
        });
        Replay { child, stderr, report, stderr_seen: Vec::new() }
    }

    /// The endpoints of the "KV events on ..." line: the PUB one and the replay one.
    fn endpoints(&mut self) -> (String, Option<String>) {
        loop {
            let l = self.stderr.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| {
                panic!("no \"KV events on\" line on stderr: {:?}", self.stderr_seen)
            });
            self.stderr_seen.push(l.clone());
            if let Some(rest) = l.strip_prefix("radixkv: KV events on ") {
                let pub_ep = rest.split(' ').next().unwrap().to_string();
                let replay = rest.split(", replay on ").nth(1).map(str::to_string);
                return (pub_ep, replay);
            }
        }
    }

    /// Ends the child, which must still be lingering after its report: its linger
    /// ([`LINGER_MS`]) outlasts any test, so a child gone by now exited on its own (a
    /// crash, or a linger not honoured), never because the test was slow.
    fn finish(mut self) {
        let st = self.child.try_wait().expect("try_wait");
        let rest: Vec<String> = self.stderr.try_iter().collect();
        assert!(
            st.is_none(),
            "radixkv should linger: {st:?}; stderr {:?} {rest:?}",
            self.stderr_seen
        );
        // The drop kills it.
    }
}

impl Drop for Replay {
    /// Kills the child (lingering for an hour otherwise) and reaps it, also when the test
    /// failed before [`Replay::finish`].
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A libzmq subscriber: a SUB socket (bound for a connecting publisher, or connected to a
/// bound one) and a DEALER for replay.
struct Subscriber {
    _ctx: zmq::Context,
    sub: zmq::Socket,
    replay: Option<zmq::Socket>,
    /// Batches received, by sequence number.
    got: BTreeMap<u64, Vec<u8>>,
    live: u64,
    replayed: u64,
}

impl Subscriber {
    fn new() -> Subscriber {
        let ctx = zmq::Context::new();
        let sub = ctx.socket(zmq::SUB).unwrap();
        sub.set_rcvhwm(0).unwrap();
        sub.set_subscribe(b"").unwrap();
        Subscriber { _ctx: ctx, sub, replay: None, got: BTreeMap::new(), live: 0, replayed: 0 }
    }

    /// Binds the SUB socket on a free loopback port; returns the endpoint.
    fn bind(&self) -> String {
        self.sub.bind("tcp://127.0.0.1:*").unwrap();
        self.sub.get_last_endpoint().unwrap().unwrap()
    }

    fn connect_replay(&mut self, ep: &str) {
        let r = self._ctx.socket(zmq::DEALER).unwrap();
        r.set_rcvtimeo(10_000).unwrap();
        r.connect(ep).unwrap();
        self.replay = Some(r);
    }

    /// Takes what the SUB socket has, waiting up to `ms` for the first message.
    fn poll(&mut self, ms: i64) {
        let mut wait = ms;
        while self.sub.poll(zmq::POLLIN, wait).unwrap() > 0 {
            let m = self.sub.recv_multipart(0).unwrap();
            assert_eq!(m.len(), 3, "three frames: topic, seq, payload");
            let seq = u64::from_be_bytes(m[1][..].try_into().unwrap());
            if self.got.insert(seq, m[2].clone()).is_none() {
                self.live += 1;
            }
            wait = 0;
        }
    }

    /// Fetches every batch below `total` not received yet through replay.
    fn repair(&mut self, total: u64) {
        let Some(start) = (0..total).find(|s| !self.got.contains_key(s)) else { return };
        let r = self.replay.as_ref().expect("a replay endpoint");
        r.send_multipart([&b""[..], &start.to_be_bytes()], 0).unwrap();
        loop {
            let m = r.recv_multipart(0).expect("a replay answer");
            assert_eq!(m.len(), 3, "[b\"\", seq, payload]");
            let seq = u64::from_be_bytes(m[1][..].try_into().unwrap());
            if seq == REPLAY_END {
                break;
            }
            if self.got.insert(seq, m[2].clone()).is_none() {
                self.replayed += 1;
            }
        }
    }

    /// Receives until the report is out and every batch it counts is here (live or by
    /// replay); returns the report and the decoded batches in sequence order.
    fn collect(&mut self, r: &mut Replay) -> (serde_json::Value, Vec<(u64, EventBatch)>) {
        let deadline = Instant::now() + Duration::from_secs(120);
        let report = loop {
            assert!(Instant::now() < deadline, "no report");
            self.poll(20);
            if let Ok(v) = r.report.try_recv() {
                break v;
            }
        };
        let total = u(&report["events"], "batches");
        self.poll(20);
        if self.got.len() as u64 != total {
            self.repair(total);
        }
        assert_eq!(
            self.got.keys().copied().collect::<Vec<_>>(),
            (0..total).collect::<Vec<_>>(),
            "every batch, numbered 0.. without gaps"
        );
        let batches = self
            .got
            .iter()
            .map(|(&s, p)| (s, decode_batch(p).expect("radixkv decodes its own batch").batch))
            .collect();
        (report, batches)
    }
}

/// The pages an unlimited cache of page size 16 holds after `trace`, whatever the order or
/// the threads: every aligned page of every request, hashed in its namespace (the decimal
/// id as the salt for any namespace but 0, as the CLI names none).
fn every_page(trace: &Trace, mode: HashMode) -> HashSet<u64> {
    let mut hashers = std::collections::HashMap::new();
    let mut all = HashSet::new();
    for r in trace.iter() {
        let h = hashers.entry(r.namespace).or_insert_with(|| {
            let salt = (r.namespace != 0).then(|| r.namespace.to_string());
            PageHasher::new(mode, None, salt.as_deref())
        });
        let n = r.tokens.len() / PAGE * PAGE;
        all.extend(h.block_hashes(&r.tokens[..n], PAGE));
    }
    all
}

fn mooncake() -> Trace {
    Trace::load(MOONCAKE, TraceOptions::default()).expect("the Mooncake trace")
}

/// The page counts the stream stored and removed, in pages.
fn stored_and_removed(batches: &[(u64, EventBatch)]) -> (u64, u64) {
    let (mut s, mut r) = (0, 0);
    for (_, b) in batches {
        for e in &b.events {
            match e {
                KvEvent::BlockStored { block_hashes, block_size, .. } => {
                    assert_eq!(*block_size as usize, PAGE);
                    s += block_hashes.len() as u64;
                }
                KvEvent::BlockRemoved { block_hashes, .. } => r += block_hashes.len() as u64,
                KvEvent::AllBlocksCleared => panic!("a replay never clears"),
            }
        }
    }
    (s, r)
}

/// The spec's form: `--kv-events tcp://127.0.0.1:PORT` connects to a subscriber that binds
/// (vLLM's rule), which gets the batches live (those sent before the connection landed by
/// replay). The pages held at the end are exactly every page of the trace.
#[test]
fn a_subscriber_holds_every_page_of_the_mooncake_replay() {
    let mut s = Subscriber::new();
    let ep = s.bind();
    let mut r = Replay::spawn(&[
        "--trace",
        MOONCAKE,
        "--page-size",
        "16",
        "--kv-events",
        &ep,
        "--kv-events-replay",
        "tcp://127.0.0.1:*",
        "--kv-events-topic",
        "kv@127.0.0.1:0@test",
        "--kv-events-linger-ms",
        LINGER_MS,
    ]);
    let (pub_ep, replay_ep) = r.endpoints();
    assert_eq!(pub_ep, ep, "connects to the given endpoint");
    s.connect_replay(&replay_ep.expect("the replay endpoint is printed"));
    let (report, batches) = s.collect(&mut r);
    let ev = &report["events"];
    assert_eq!(ev["endpoint"], ep.as_str());
    assert_eq!(ev["format"], "vllm-array");
    assert_eq!(ev["hash"], "xxh3");
    assert_eq!(ev["topic"], "kv@127.0.0.1:0@test");
    assert_eq!(u(ev, "dropped"), 0);
    assert_eq!(u(ev, "published"), u(ev, "batches"));
    // One batch per request that added pages: all but those whose pages were all cached.
    assert!(u(ev, "batches") <= 3_993 && u(ev, "batches") > 3_000, "{ev}");
    assert!(s.live > 0, "the PUB socket delivered ({} live, {} by replay)", s.live, s.replayed);
    eprintln!("{} batches live, {} by replay", s.live, s.replayed);
    let held = stream::replay(&batches);
    let want = every_page(&mooncake(), HashMode::Xxh3);
    assert_eq!(held.len(), want.len());
    assert!(held.iter().all(|h| want.contains(h)), "the held pages are the trace's");
    assert_eq!(held.len() as u64 * PAGE as u64, u(&report, "cached_tokens"));
    assert_eq!(stored_and_removed(&batches), (held.len() as u64, 0));
    r.finish();
}

/// Two threads, a 2,000,000-token pool (eviction: removals on the wire), the map encoding,
/// and a bound wildcard endpoint the subscriber reads from stderr; it subscribes late and
/// gets what it missed by replay. The pages held are what the cache holds.
#[test]
fn two_threads_with_eviction_through_a_bound_endpoint() {
    let mut r = Replay::spawn(&[
        "--trace",
        MOONCAKE,
        "--page-size",
        "16",
        "--capacity",
        "2e6",
        "--threads",
        "2",
        "--kv-events",
        "tcp://127.0.0.1:*",
        "--kv-events-replay",
        "tcp://127.0.0.1:*",
        "--kv-events-format",
        "vllm-map",
        "--kv-events-linger-ms",
        LINGER_MS,
    ]);
    let (pub_ep, replay_ep) = r.endpoints();
    assert!(!pub_ep.ends_with(":*"), "the bound port is printed: {pub_ep}");
    let mut s = Subscriber::new();
    s.sub.connect(&pub_ep).unwrap();
    s.connect_replay(&replay_ep.unwrap());
    let (report, batches) = s.collect(&mut r);
    let ev = &report["events"];
    assert_eq!(ev["format"], "vllm-map");
    assert_eq!(u(ev, "dropped"), 0);
    assert_eq!(u(&report, "threads"), 2);
    let held = stream::replay(&batches);
    assert_eq!(held.len() as u64 * PAGE as u64, u(&report, "cached_tokens"));
    let (stored, removed) = stored_and_removed(&batches);
    assert!(removed > 0, "eviction ran");
    assert_eq!(removed * PAGE as u64, u(&report, "evicted_tokens"));
    assert_eq!(stored * PAGE as u64, u(&report, "inserted_tokens"));
    let want = every_page(&mooncake(), HashMode::Xxh3);
    assert!(held.iter().all(|h| want.contains(h)));
    r.finish();
}

/// SGLang's hashes, signed on the wire, over the built-in workload's six namespaces (each
/// but 0 salted with its id): the pages held are every page of the workload, so
/// namespaces with equal tokens stay apart.
#[test]
fn sglang_hashes_and_namespaces() {
    let mut s = Subscriber::new();
    let ep = s.bind();
    let mut r = Replay::spawn(&[
        "--page-size",
        "16",
        "--kv-events",
        &ep,
        "--kv-events-replay",
        "tcp://127.0.0.1:*",
        "--kv-events-hash",
        "sglang",
        "--kv-events-linger-ms",
        LINGER_MS,
    ]);
    let (_, replay_ep) = r.endpoints();
    s.connect_replay(&replay_ep.unwrap());
    let (report, batches) = s.collect(&mut r);
    assert_eq!(report["events"]["hash"], "sglang");
    let held = stream::replay(&batches);
    let want = every_page(&synthetic::builtin(), HashMode::SglangSha256);
    assert_eq!(held.len(), want.len());
    assert!(held.iter().all(|h| want.contains(h)));
    assert_eq!(held.len() as u64 * PAGE as u64, u(&report, "cached_tokens"));
    r.finish();
}

/// `--kv-events-group-idx`, `--kv-events-spec-kind` and `--kv-events-sliding-window`: every
/// store and removal of the stream carries the group (read back through replay).
#[test]
fn the_kv_group_flags_reach_every_store_and_removal() {
    use radixkv::events::wire::{EventGroup, KvCacheSpecKind};
    let mut s = Subscriber::new();
    let ep = s.bind();
    let mut r = Replay::spawn(&[
        "--page-size",
        "16",
        "--capacity",
        "20000",
        "--kv-events",
        &ep,
        "--kv-events-replay",
        "tcp://127.0.0.1:*",
        "--kv-events-format",
        "vllm-map",
        "--kv-events-group-idx",
        "2",
        "--kv-events-spec-kind",
        "sliding_window",
        "--kv-events-sliding-window",
        "4096",
        "--kv-events-linger-ms",
        LINGER_MS,
    ]);
    let (_, replay_ep) = r.endpoints();
    s.connect_replay(&replay_ep.unwrap());
    let _ = s.collect(&mut r);
    let stored = EventGroup {
        group_idx: Some(2),
        kind: Some(KvCacheSpecKind::SlidingWindow),
        sliding_window: Some(4096),
    };
    let removed = EventGroup { group_idx: Some(2), kind: None, sliding_window: None };
    let (mut n_stored, mut n_removed) = (0, 0);
    for p in s.got.values() {
        let d = decode_batch(p).unwrap();
        for (e, g) in d.batch.events.iter().zip(&d.groups) {
            let want = match e {
                KvEvent::BlockStored { .. } => {
                    n_stored += 1;
                    stored
                }
                KvEvent::BlockRemoved { .. } => {
                    n_removed += 1;
                    removed
                }
                KvEvent::AllBlocksCleared => EventGroup::default(),
            };
            assert_eq!(*g, want);
        }
    }
    assert!(n_stored > 0 && n_removed > 0, "{n_stored} stores, {n_removed} removals");
    r.finish();
}

/// The text report has the events line; with no subscriber, nothing waits for one.
#[test]
fn the_text_report_has_an_events_line() {
    let out = run(&[
        "replay",
        "--page-size",
        "16",
        "--kv-events",
        "tcp://127.0.0.1:*",
        "--kv-events-linger-ms",
        "0",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.trim_start().starts_with("events")).expect("events line");
    assert!(line.contains("batches") && line.contains("0 dropped"), "{line}");
    assert!(line.contains("vllm-array, xxh3 hashes"), "{line}");
    // Events off: no line, and `events` is null in the JSON.
    let out = run(&["replay", "--page-size", "16"]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("  events "));
    let v = run_json(&["replay", "--page-size", "16", "--json"]);
    assert!(v["events"].is_null());
}

/// An address in use (the PUB endpoint bound, or the replay one) is a clean runtime error
/// naming the endpoint, exit status 1, before any replay output.
#[test]
fn an_address_in_use_is_a_clean_error() {
    let held = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let ep = format!("tcp://*:{port}");
    let err = run_fail(&["replay", "--kv-events", &ep]);
    assert!(err.contains("cannot publish KV events"), "{err}");
    assert!(err.contains(&ep) && err.contains("in use"), "{err}");
    let rep = format!("tcp://0.0.0.0:{port}");
    let err = run_fail(&["replay", "--kv-events", "tcp://127.0.0.1:*", "--kv-events-replay", &rep]);
    assert!(err.contains(&rep) && err.contains("in use"), "{err}");
    drop(held);
}

/// Endpoints that are not endpoints: runtime errors (status 1) naming them.
#[test]
fn bad_endpoints_are_clean_errors() {
    for ep in ["nonsense", "tcp://*:notaport", "foo://*:1", "tcp://nohostport", "inproc://x"] {
        let err = run_fail(&["replay", "--kv-events", ep]);
        assert!(err.contains("cannot publish KV events"), "{ep}: {err}");
        assert!(err.contains(ep), "{ep}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
}

/// A format or hash typo, an event flag without --kv-events, or --kv-events with
/// --compare-schedules: usage errors (status 2) from the parser, which names the flag.
#[test]
fn bad_event_flags_are_usage_errors() {
    for (args, says) in [
        (&["replay", "--kv-events", "tcp://*:0", "--kv-events-format", "vllm-mop"][..], "vllm-map"),
        (&["replay", "--kv-events", "tcp://*:0", "--kv-events-format", "msgpack"], "vllm-array"),
        (&["replay", "--kv-events", "tcp://*:0", "--kv-events-hash", "md5"], "--kv-events-hash"),
        (&["replay", "--kv-events", "tcp://*:0", "--kv-events-linger-ms", "-1"], "linger"),
        (&["replay", "--kv-events-format", "vllm-map"], "--kv-events <ENDPOINT>"),
        (&["replay", "--kv-events-replay", "tcp://*:0"], "--kv-events <ENDPOINT>"),
        (&["replay", "--kv-events-topic", "t"], "--kv-events <ENDPOINT>"),
        (&["replay", "--kv-events", "tcp://*:0", "--compare-schedules"], "cannot be used"),
        (&["replay", "--kv-events", "tcp://*:0", "--kv-events-spec-kind", "swa"], "mamba"),
        (
            &["replay", "--kv-events", "tcp://*:0", "--kv-events-spec-kind", "sliding_window"],
            "--kv-events-spec-kind sliding_window needs --kv-events-sliding-window",
        ),
        (
            &["replay", "--kv-events", "tcp://*:0", "--kv-events-sliding-window", "128"],
            "--kv-events-sliding-window goes with --kv-events-spec-kind sliding_window",
        ),
        (
            &[
                "replay",
                "--kv-events",
                "tcp://*:0",
                "--kv-events-spec-kind",
                "sliding_window_mla",
                "--kv-events-sliding-window",
                "0",
            ],
            "at least 1 token",
        ),
        (&["replay", "--kv-events-group-idx", "1"], "--kv-events <ENDPOINT>"),
        (&["replay", "--kv-events", "tcp://*:0", "--kv-events-group-idx", "x"], "group-idx"),
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
