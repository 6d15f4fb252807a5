//! radixkv's indexer service beside Dynamo's standalone `kv_indexer` (issue 28), in one
//! process on loopback: N radixkv publishers (mock engines, as the indexer's tests drive
//! them) registered with both services through the same `/register` JSON; the events
//! applied per second through the sockets, `/query` latency over HTTP (p50/p99, one
//! kept-alive connection) while publishing and quiet, the answers of both compared
//! (`/query` and `/query_by_hash`), and the in-process figures (the router index fed the
//! same payloads) for reference. See README.md.

#[path = "../../../crates/indexer/tests/indexer/common.rs"]
mod common;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use dynamo_kv_router::protocols::{BlockHashOptions, compute_block_hash_for_seq};
use dynamo_kv_router::services::indexer::{IndexerConfig, run_server};
use radixkv::events::wire::{WireOptions, encode_batch};
use radixkv::events::{EventBatch, KvEvent};
use radixkv_indexer::client::{Connection, get};
use radixkv_router::{RouterIndex, RouterOptions};
use serde_json::{Value, json};

struct Args {
    publishers: u64,
    batches: usize,
    queries: usize,
    only: String,
    shared_names: bool,
}

fn args() -> Args {
    let mut a = Args {
        publishers: 8,
        batches: 5_000,
        queries: 5_000,
        only: "both".into(),
        shared_names: false,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < v.len() {
        let next = |i: usize| v.get(i + 1).cloned().unwrap_or_default();
        match v[i].as_str() {
            "--publishers" => a.publishers = next(i).parse().expect("--publishers N"),
            "--batches" => a.batches = next(i).parse().expect("--batches N"),
            "--queries" => a.queries = next(i).parse().expect("--queries N"),
            "--only" => a.only = next(i),
            "--shared-names" => {
                a.shared_names = true;
                i += 1;
                continue;
            }
            "-h" | "--help" => {
                println!(
                    "indexer-vs-dynamo [--publishers N (8)] [--batches PER_PUBLISHER (5000)] \
                     [--queries N (5000)] [--only both|radixkv|dynamo] [--shared-names]"
                );
                std::process::exit(0);
            }
            o => panic!("unknown argument {o}"),
        }
        i += 2;
    }
    assert!(["both", "radixkv", "dynamo"].contains(&a.only.as_str()), "--only both|radixkv|dynamo");
    a
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p) as usize]
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

/// Starts Dynamo's standalone indexer on its own thread and tokio runtime; returns its base
/// URL once `/health` answers.
fn start_dynamo() -> String {
    // A free port (run_server binds 0.0.0.0:port itself).
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let cfg = IndexerConfig {
            block_size: None,
            port,
            threads: 2,
            workers: None,
            model_name: MODEL.into(),
            routing_group: "default".into(),
            peers: None,
            access_log: None,
            trace_id_header: "x-request-id".parse().unwrap(),
            access_log_local_time: false,
        };
        if let Err(e) = rt.block_on(run_server(cfg)) {
            eprintln!("dynamo's run_server failed: {e:#}");
            std::process::exit(1);
        }
    });
    let base = format!("http://127.0.0.1:{port}");
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        if get(&format!("{base}/health")).is_ok_and(|r| r.status == 200) {
            return base;
        }
        assert!(Instant::now() < end, "Dynamo's indexer did not come up on {base}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `scores` as {(worker, dp_rank): tokens}.
fn scores(v: &Value) -> BTreeMap<(u64, u32), u64> {
    let mut out = BTreeMap::new();
    if let Some(o) = v["scores"].as_object() {
        for (w, ranks) in o {
            for (r, t) in ranks.as_object().unwrap() {
                let t = t.as_u64().unwrap();
                if t > 0 {
                    out.insert((w.parse().unwrap(), r.parse().unwrap()), t);
                }
            }
        }
    }
    out
}

fn ask(c: &mut Connection, path: &str, body: &Value) -> BTreeMap<(u64, u32), u64> {
    let r = c.post_json(path, body).unwrap();
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    scores(&r.json().unwrap())
}

/// The probe requests: every prompt at full length and at half.
fn probes(ps: &[Vec<u32>]) -> Vec<Vec<u32>> {
    ps.iter().flat_map(|p| [p.clone(), p[..p.len() / 2].to_vec()]).collect()
}

/// All probe answers of one service (a digest of its state as queries see it).
fn answers(c: &mut Connection, probes: &[Vec<u32>]) -> Answers {
    probes.iter().map(|t| ask(c, "/query", &json!({"token_ids": t, "model_name": MODEL}))).collect()
}

struct Svc {
    name: &'static str,
    base: String,
}

fn main() {
    let a = args();
    let t_start = Instant::now();
    let rkv = start(config());
    let rkv_base = format!("http://{}", rkv.local_addr());
    let dyn_base = start_dynamo();
    println!("radixkv indexer: {rkv_base}   dynamo kv_indexer: {dyn_base}");
    let mut svcs = Vec::new();
    if a.only != "dynamo" {
        svcs.push(Svc { name: "radixkv", base: rkv_base.clone() });
    }
    if a.only != "radixkv" {
        svcs.push(Svc { name: "dynamo", base: dyn_base.clone() });
    }

    let reference = Reference::new();
    let ps = prompts(64, 16);
    let probes = probes(&ps);
    let mut ws: Vec<Worker> = (1..=a.publishers).map(|i| Worker::start(i, i, None)).collect();
    if a.shared_names {
        for w in &mut ws {
            w.engine.salt = 0;
        }
    }

    // The same JSON to both (the drop-in claim), with every field radixkv documents.
    for w in &ws {
        let body = json!({"instance_id": w.id, "endpoint": w.endpoint, "model_name": MODEL,
                          "tenant_id": "default", "block_size": BS, "dp_rank": 0,
                          "lora_name": null, "replay_endpoint": w.replay});
        for s in &svcs {
            let mut c = Connection::open(&s.base).unwrap();
            let r = c.post_json("/register", &body).unwrap();
            assert_eq!(r.status, 201, "{} /register: {}", s.name, r.text());
        }
    }
    // Both SUB sockets connected before the first publish (a late join is repaired by
    // replay in both, but it is not what is measured here).
    std::thread::sleep(Duration::from_millis(500));

    // The batches made first (the reference fed as they are made), so the publishing runs as
    // fast as the sockets take it.
    let mut plan: Vec<Vec<Vec<KvEvent>>> = Vec::new();
    let mut payloads: Vec<(u64, u64, Vec<u8>)> = Vec::new();
    let mut events = 0usize;
    for w in &mut ws {
        let mut b = Vec::new();
        for seq in 0..a.batches as u64 {
            let ev = w.engine.step(&ps);
            events += ev.len();
            reference.apply(w.id, seq, &ev);
            payloads.push((
                w.id,
                seq,
                encode_batch(&EventBatch { ts: 0.0, events: ev.clone() }, &WireOptions::default()),
            ));
            b.push(ev);
        }
        plan.push(b);
    }
    let want = reference_answers(&reference, &probes);

    // Queries all along, one thread and one kept-alive connection per service.
    let stop = Arc::new(AtomicBool::new(false));
    let qthreads: Vec<_> = svcs
        .iter()
        .map(|s| {
            let (stop, ps, base) = (stop.clone(), ps.clone(), s.base.clone());
            std::thread::spawn(move || {
                let mut c = Connection::open(&base).unwrap();
                let mut lat = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let body = json!({"token_ids": ps[i % ps.len()], "model_name": MODEL});
                    let t = Instant::now();
                    let r = c.post_json("/query", &body).unwrap();
                    lat.push(t.elapsed());
                    assert_eq!(r.status, 200);
                    i += 1;
                    // Paced, so the prober and the publishers get the cores too.
                    std::thread::sleep(Duration::from_micros(500));
                }
                lat
            })
        })
        .collect();

    // Per service, a prober: the probe answers every 10 ms; done at the first poll whose
    // answers equal the last ones, once they have stayed the same for 2 s after the
    // publishers finished (Dynamo has no cursor to read; radixkv's /workers next_seq is
    // read as well, as a check of this method).
    let published = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let probers: Vec<_> = svcs
        .iter()
        .map(|s| {
            let (published, probes, base) = (published.clone(), probes.clone(), s.base.clone());
            std::thread::spawn(move || {
                let mut c = Connection::open(&base).unwrap();
                let mut last: Option<(Answers, Duration)> = None;
                loop {
                    let now = t0.elapsed();
                    let ans = answers(&mut c, &probes);
                    match &last {
                        Some((prev, at)) if *prev == ans => {
                            if published.load(Ordering::Relaxed)
                                && now - *at > Duration::from_secs(2)
                            {
                                return (ans, *at);
                            }
                        }
                        _ => last = Some((ans, now)),
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        })
        .collect();
    std::thread::scope(|sc| {
        for (w, batches) in ws.iter_mut().zip(plan) {
            sc.spawn(move || {
                for ev in batches {
                    for e in ev {
                        w.sink.push(e);
                    }
                    w.last = w.sink.flush();
                }
            });
        }
    });
    let publish_took = t0.elapsed();
    published.store(true, Ordering::Relaxed);
    // radixkv's exact cursor, read while the probers run.
    let mut rkv_cursor_done = None;
    if a.only != "dynamo" {
        for w in &ws {
            w.wait_applied(&rkv);
        }
        rkv_cursor_done = Some(t0.elapsed());
    }
    let finals: Vec<_> = probers.into_iter().map(|p| p.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    let busy: Vec<Vec<Duration>> = qthreads.into_iter().map(|q| q.join().unwrap()).collect();
    let total = a.batches * ws.len();
    println!(
        "\nworkload: {} publishers x {} batches = {total} batches, {events} events (block size {BS}, \
         {} probe requests, engines naming blocks {})",
        ws.len(),
        a.batches,
        probes.len(),
        if a.shared_names { "alike" } else { "each its own way" }
    );
    println!("publishers done after {publish_took:?}");
    if let Some(t) = rkv_cursor_done {
        println!(
            "radixkv: every cursor (/workers next_seq) at the end after {t:?}: {:.0} events/s",
            events as f64 / t.as_secs_f64()
        );
    }
    let mut rows = Vec::new();
    for ((s, (ans, at)), mut lat) in svcs.iter().zip(&finals).zip(busy) {
        let exact = ans.iter().zip(&want).filter(|(x, y)| x == y).count();
        println!(
            "{}: answers final after {at:?} (probed): {:.0} events/s; {} queries while publishing: \
             p50 {}, p99 {}; final answers equal to the exact reference: {exact}/{}",
            s.name,
            events as f64 / at.as_secs_f64(),
            lat.len(),
            us(pct(&mut lat, 0.5)),
            us(pct(&mut lat, 0.99)),
            want.len()
        );
        rows.push((
            s.name,
            events as f64 / at.as_secs_f64(),
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99),
        ));
    }

    // Quiet: queries alone, one service at a time.
    let mut quiet_rows = Vec::new();
    for s in &svcs {
        let mut c = Connection::open(&s.base).unwrap();
        let mut lat = Vec::new();
        for i in 0..a.queries {
            let body = json!({"token_ids": ps[i % ps.len()], "model_name": MODEL});
            let t = Instant::now();
            let r = c.post_json("/query", &body).unwrap();
            lat.push(t.elapsed());
            assert_eq!(r.status, 200);
        }
        let mut hlat = Vec::new();
        for i in 0..a.queries {
            let h = dyn_hashes(&ps[i % ps.len()]);
            let body = json!({"block_hashes": h, "model_name": MODEL});
            let t = Instant::now();
            let r = c.post_json("/query_by_hash", &body).unwrap();
            hlat.push(t.elapsed());
            assert_eq!(r.status, 200);
        }
        println!(
            "{} quiet: {} /query of {} tokens: p50 {}, p99 {}; /query_by_hash: p50 {}, p99 {}",
            s.name,
            a.queries,
            ps[0].len(),
            us(pct(&mut lat, 0.5)),
            us(pct(&mut lat, 0.99)),
            us(pct(&mut hlat, 0.5)),
            us(pct(&mut hlat, 0.99))
        );
        quiet_rows.push((
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99),
            pct(&mut hlat, 0.5),
            pct(&mut hlat, 0.99),
        ));
    }

    // The answers compared: /query and /query_by_hash of every probe, both services and the
    // reference.
    if svcs.len() == 2 {
        let mut c =
            [Connection::open(&svcs[0].base).unwrap(), Connection::open(&svcs[1].base).unwrap()];
        let (mut eq, mut ne, mut heq, mut hne, mut qh_self) = (0, 0, 0, 0, 0);
        let (mut over, mut under) = (0, 0);
        let mut shown = 0;
        for (t, w) in probes.iter().zip(&want) {
            let q = json!({"token_ids": t, "model_name": MODEL});
            let hq = json!({"block_hashes": dyn_hashes(t), "model_name": MODEL});
            let r = ask(&mut c[0], "/query", &q);
            let d = ask(&mut c[1], "/query", &q);
            let rh = ask(&mut c[0], "/query_by_hash", &hq);
            let dh = ask(&mut c[1], "/query_by_hash", &hq);
            if r == rh && d == dh {
                qh_self += 1;
            }
            if r == d {
                eq += 1;
            } else {
                ne += 1;
                for (k, v) in w {
                    let dv = d.get(k).copied().unwrap_or(0);
                    if dv > *v {
                        over += 1;
                    } else if dv < *v {
                        under += 1;
                    }
                }
                for (k, dv) in &d {
                    if !w.contains_key(k) && *dv > 0 {
                        over += 1;
                    }
                }
                if shown < 3 {
                    shown += 1;
                    println!(
                        "  differs ({} tokens): radixkv {r:?}\n                     dynamo  {d:?}\n                     exact   {w:?}",
                        t.len()
                    );
                }
            }
            if rh == dh {
                heq += 1;
            } else {
                hne += 1;
            }
        }
        println!(
            "answers compared over {} probes: /query equal {eq}, differing {ne} (Dynamo's (worker, rank) \
             scores above the exact ones: {over}, below: {under}); /query_by_hash equal {heq}, differing {hne}; \
             /query == /query_by_hash within each service: {qh_self}/{}",
            probes.len(),
            probes.len()
        );
    }

    // Request fields the two read differently: the same body to both, the status and the
    // scores (or error) of each.
    let p = &ps[0];
    let cases = [
        ("/query plain", "/query", json!({"token_ids": p, "model_name": MODEL})),
        (
            "/query tenant_id=other",
            "/query",
            json!({"token_ids": p, "model_name": MODEL, "tenant_id": "other"}),
        ),
        (
            "/query routing_group=other",
            "/query",
            json!({"token_ids": p, "model_name": MODEL, "routing_group": "other"}),
        ),
        (
            "/query cache_salt=s",
            "/query",
            json!({"token_ids": p, "model_name": MODEL, "cache_salt": "s"}),
        ),
        (
            "/query lora_name=a",
            "/query",
            json!({"token_ids": p, "model_name": MODEL, "lora_name": "a"}),
        ),
        (
            "/query_by_hash cache_salt=s",
            "/query_by_hash",
            json!({"block_hashes": dyn_hashes(p), "model_name": MODEL, "cache_salt": "s"}),
        ),
        ("/query model_name=nope", "/query", json!({"token_ids": p, "model_name": "nope"})),
        ("/query no model_name", "/query", json!({"token_ids": p})),
    ];
    println!("\nrequest fields, the same body to each service:");
    for (what, path, body) in &cases {
        let mut line = format!("  {what}:");
        for s in &svcs {
            let mut c = Connection::open(&s.base).unwrap();
            let r = c.post_json(path, body).unwrap();
            let shown = match r.json() {
                Ok(v) if r.status == 200 => {
                    let keys: Vec<&String> =
                        v.as_object().map(|o| o.keys().collect()).unwrap_or_default();
                    format!("{} keys {keys:?} scores {:?}", r.status, scores(&v))
                }
                _ => format!("{} {}", r.status, r.text().chars().take(120).collect::<String>()),
            };
            line += &format!("\n      {}: {shown}", s.name);
        }
        println!("{line}");
    }
    for s in &svcs {
        let w = get(&format!("{}/workers", s.base)).unwrap().json().unwrap();
        let first = w.as_array().and_then(|a| a.first()).cloned().unwrap_or(Value::Null);
        println!("{} /workers entry: {first}", s.name);
    }

    // In process: the same payloads applied on one thread, the same finds.
    let ix = RouterIndex::new(RouterOptions { block_size: BS, ..Default::default() }).unwrap();
    let t = Instant::now();
    for (id, seq, p) in &payloads {
        ix.apply_batch(*id, *seq, p).unwrap();
    }
    let took = t.elapsed();
    let mut lat = Vec::new();
    let mut out = Vec::new();
    for i in 0..a.queries {
        let t = Instant::now();
        ix.find(&ps[i % ps.len()], None, None, &mut out);
        lat.push(t.elapsed());
    }
    println!(
        "in process (radixkv RouterIndex, one thread): {events} events applied in {took:?}: {:.0} events/s; find p50 {}, p99 {}",
        events as f64 / took.as_secs_f64(),
        us(pct(&mut lat, 0.5)),
        us(pct(&mut lat, 0.99))
    );

    // Dynamo in process: the same payloads through Dynamo's own decoder and normalizer
    // (what its listener runs) into its indexer (`create_indexer`, 2 threads, as the
    // service's), then its `find_matches` on the same requests. Its answers against the
    // service's tell transport from index semantics.
    let (dyn_eps, dyn_find, dyn_same, dyn_exact) = dynamo_in_process(
        &payloads,
        events,
        &probes,
        &want,
        a.queries,
        &ps,
        svcs.iter().position(|s| s.name == "dynamo").map(|_| dyn_base.clone()),
    );
    println!(
        "in process (Dynamo's indexer, create_indexer(bs, 2), events sent from one task, workers round robin): {events} events applied in {:.0} events/s; find_matches p50 {}, p99 {}; answers equal to the exact reference: {dyn_exact}/{}{}",
        dyn_eps,
        us(dyn_find.0),
        us(dyn_find.1),
        want.len(),
        dyn_same
            .map(|n| format!("; equal to Dynamo's service: {n}/{}", want.len()))
            .unwrap_or_default()
    );

    // /unregister with the same body to both (after every comparison): worker 1 leaves
    // the answers.
    let body = json!({"instance_id": 1, "model_name": MODEL, "tenant_id": "default", "dp_rank": 0});
    for s in &svcs {
        let mut c = Connection::open(&s.base).unwrap();
        let r = c.post_json("/unregister", &body).unwrap();
        let t = Instant::now();
        let mut gone = false;
        while t.elapsed() < Duration::from_secs(5) {
            if probes.iter().all(|p| {
                !ask(&mut c, "/query", &json!({"token_ids": p, "model_name": MODEL}))
                    .contains_key(&(1, 0))
            }) {
                gone = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let again = c.post_json("/unregister", &body).unwrap();
        println!(
            "{} /unregister {body}: {} {}; worker 1 out of every answer: {gone} (after {:?}); again: {} {}",
            s.name,
            r.status,
            r.text(),
            t.elapsed(),
            again.status,
            again.text()
        );
    }

    println!(
        "\n| | events/s through the sockets | /query p50 / p99 while publishing | /query p50 / p99 quiet | /query_by_hash p50 / p99 quiet |"
    );
    println!("|---|---|---|---|---|");
    for ((name, eps, bp50, bp99), (qp50, qp99, hp50, hp99)) in rows.iter().zip(&quiet_rows) {
        println!(
            "| {name} service (HTTP) | {:.0} | {} / {} | {} / {} | {} / {} |",
            eps,
            us(*bp50),
            us(*bp99),
            us(*qp50),
            us(*qp99),
            us(*hp50),
            us(*hp99)
        );
    }
    println!(
        "| radixkv in process (RouterIndex) | {:.0} (apply_batch, one thread) | | find {} / {} | |",
        events as f64 / took.as_secs_f64(),
        us(pct(&mut lat, 0.5)),
        us(pct(&mut lat, 0.99))
    );
    println!(
        "| Dynamo in process (create_indexer, 2 threads) | {:.0} (one task sending) | | find_matches {} / {} | |",
        dyn_eps,
        us(dyn_find.0),
        us(dyn_find.1)
    );
    println!("\ntotal run {:?}", t_start.elapsed());
    for w in &mut ws {
        w.stop();
    }
    rkv.shutdown().unwrap();
    // Dynamo's server thread is left to the process exit.
    std::process::exit(0);
}

fn reference_answers(reference: &Reference, probes: &[Vec<u32>]) -> Answers {
    probes
        .iter()
        .map(|t| reference.scores(t).into_iter().map(|(w, v)| ((w, 0u32), v)).collect())
        .collect()
}

/// Dynamo's local block hashes of `tokens` (no adapter, no salt), as `/query_by_hash` takes
/// them (signed 64-bit).
fn dyn_hashes(tokens: &[u32]) -> Vec<i64> {
    compute_block_hash_for_seq(tokens, BS, BlockHashOptions::default())
        .into_iter()
        .map(|h| h.0 as i64)
        .collect()
}

type Answers = Vec<BTreeMap<(u64, u32), u64>>;

/// Dynamo's indexer in process (see main). Returns (events/s, find p50/p99, probes equal to
/// the service's, probes equal to the exact answers). Applied means: every probe answers
/// as it will at the end (polled, as for the service; the apply calls only enqueue).
fn dynamo_in_process(
    payloads: &[(u64, u64, Vec<u8>)],
    events: usize,
    probes: &[Vec<u32>],
    want: &Answers,
    queries: usize,
    ps: &[Vec<u32>],
    service: Option<String>,
) -> (f64, (Duration, Duration), Option<usize>, usize) {
    use dynamo_kv_router::protocols::WorkerWithDpRank;
    use dynamo_kv_router::services::indexer::backend::create_indexer;
    use dynamo_kv_router::zmq_wire::{ZmqEventNormalizer, decode_event_batch};
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let ix = create_indexer(BS, 2);
        let find = |t: &[u32]| {
            let h = compute_block_hash_for_seq(t, BS, BlockHashOptions::default());
            let ix = &ix;
            async move {
                let s = ix.find_matches(h).await.unwrap();
                s.scores
                    .iter()
                    .filter(|(_, v)| **v > 0)
                    .map(|(k, v)| ((k.worker_id, k.dp_rank), u64::from(*v) * u64::from(BS)))
                    .collect::<BTreeMap<_, _>>()
            }
        };
        let mut norms: BTreeMap<u64, ZmqEventNormalizer> = BTreeMap::new();
        // Round robin over the workers (seq by seq), as the service's streams interleave
        // roughly; the exact order across workers is the sockets' (and CRTC's answers
        // depend on it when engines name blocks differently).
        let mut order: Vec<&(u64, u64, Vec<u8>)> = payloads.iter().collect();
        order.sort_by_key(|(id, seq, _)| (*seq, *id));
        let t = Instant::now();
        for (id, seq, p) in order {
            let n = norms.entry(*id).or_insert_with(|| ZmqEventNormalizer::new(BS));
            let b = decode_event_batch(p).unwrap();
            for raw in b.events {
                if let Some(pe) = n.normalize(raw, *seq, WorkerWithDpRank::new(*id, 0))
                    && let Some(ev) = pe.into_router_event()
                {
                    ix.apply_event_routed(ev).await.unwrap();
                }
            }
        }
        // Applied when the probe answers stop changing (polled back to back; the end is the
        // first poll of the final answers, held for 1 s).
        let mut last: Option<(Answers, Duration)> = None;
        let at = loop {
            let now = t.elapsed();
            let mut ans = Vec::new();
            for p in probes {
                ans.push(find(p).await);
            }
            match &last {
                Some((prev, at)) if *prev == ans => {
                    if now - *at > Duration::from_secs(1) {
                        break *at;
                    }
                }
                _ => last = Some((ans, now)),
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let fin = last.unwrap().0;
        let exact = fin.iter().zip(want).filter(|(x, y)| x == y).count();
        let same = match service {
            Some(base) => {
                let probes = probes.to_vec();
                let svc: Answers = tokio::task::spawn_blocking(move || {
                    let mut c = Connection::open(&base).unwrap();
                    answers(&mut c, &probes)
                })
                .await
                .unwrap();
                Some(svc.iter().zip(&fin).filter(|(x, y)| x == y).count())
            }
            None => None,
        };
        let mut lat = Vec::new();
        for i in 0..queries {
            let t = Instant::now();
            let _ = find(&ps[i % ps.len()]).await;
            lat.push(t.elapsed());
        }
        let f = (pct(&mut lat, 0.5), pct(&mut lat, 0.99));
        (events as f64 / at.as_secs_f64().max(1e-9), f, same, exact)
    })
}
