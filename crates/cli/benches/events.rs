//! KV events: what publishing costs a replay, and what the publisher carries.
//!
//! `cargo bench --bench events` (about a minute; `cargo bench --bench events -- 1 4` for
//! some parts only). Four parts, printed as tables:
//!
//! 1. **Replay A/B.** `radixkv replay --trace <Mooncake> --page-size 16 --json`, the
//!    binary of this build, with events off and with `--kv-events` to a libzmq subscriber
//!    of this process that receives and decodes every batch (radixkv's decoder) on its own
//!    thread; also events on with nobody subscribed (the PUB socket bound, the publisher's
//!    thread still encoding every batch). The figure is the report's `wall_s` (the replay
//!    alone: loading the trace and the linger are outside it). One untimed warm-up round,
//!    then `RADIXKV_BENCH_RUNS` (default 5) rounds, each running every contestant once, in
//!    an order rotated every round (interleaved A/B); medians and [min-max].
//!    `RADIXKV_BENCH_BASELINE=PATH` adds another `radixkv` binary (an older build), events
//!    off and events on with the subscriber reading, as contestants of the same rounds.
//! 2. **Publisher throughput.** The library's sink and publisher on a loopback TCP socket
//!    at the default limits, a libzmq subscriber receiving on its own thread (decoding one
//!    batch in 64):
//!    100,000 batches pushed as fast as the caller can, in two shapes (one `BlockStored`
//!    of one 16-token page per batch; one of 32 pages, a Mooncake block of 512 tokens);
//!    time from the first push to the last batch received.
//! 3. **A stalled subscriber.** One-page batches pushed at a pace the publisher's thread
//!    keeps up with (50,000 and 200,000 a second) to a subscriber in another process (this
//!    program, run again) that reads nothing until the pushes end, then drains what
//!    reaches it: the push + flush times (they never wait), batches dropped whole at the
//!    publisher's queue (counted), received, never seen, and this process's RSS once
//!    everything is published (where a backlog the subscriber does not take waits).
//! 4. **In process.** The replay's cycle through the library (no CLI, no latency samples),
//!    events off, on with the batches drained and dropped on the replaying thread, and on
//!    with a publisher (no subscriber): wall time and the replaying thread's own CPU time
//!    (`/proc/thread-self/schedstat`), which separate what events cost that thread from
//!    what the publisher's thread takes from it on a machine with few cores; and the whole
//!    process's CPU time (every thread's, `/proc/self/task/*/schedstat`, the publisher's
//!    counted until it has sent the last batch): what the events pipeline costs in all.
//!
//! `RADIXKV_BENCH_TRACE=PATH` replays another trace in parts 1 and 4;
//! `RADIXKV_BENCH_BIN=PATH` runs part 1 with another `radixkv` binary than the one cargo
//! built beside the bench (`scripts/device-check` runs it on another machine).

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use radixkv::events::wire::decode_batch;
use radixkv::events::{EventSink, SinkOptions};
use radixkv_publisher::{Publisher, PublisherOptions};

const MOONCAKE: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces/mooncake_synthetic_trace.jsonl");

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// A libzmq SUB socket, bound, read on its own thread: it counts the messages (and the
/// events of those it decodes).
struct Reader {
    endpoint: String,
    msgs: Arc<AtomicU64>,
    events: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reader {
    fn start() -> Reader {
        let ctx = zmq::Context::new();
        let sub = ctx.socket(zmq::SUB).unwrap();
        sub.set_rcvhwm(0).unwrap();
        sub.set_subscribe(b"").unwrap();
        sub.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = sub.get_last_endpoint().unwrap().unwrap();
        let msgs = Arc::new(AtomicU64::new(0));
        let events = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, e, s) = (msgs.clone(), events.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let _ctx = ctx;
            sub.set_rcvtimeo(50).unwrap();
            let mut n = 0u64;
            while !s.load(Ordering::Relaxed) {
                let Ok(msg) = sub.recv_multipart(0) else { continue };
                // Every batch is received; one in 64 is decoded (proof that it is a real
                // stream) so that the consumer's decoding, which a router does on its own
                // machine, does not take this 2-core machine's CPU from the replay.
                if n.is_multiple_of(64) {
                    let d = decode_batch(&msg[2]).expect("a batch");
                    e.fetch_add(d.batch.events.len() as u64, Ordering::Relaxed);
                }
                n += 1;
                m.fetch_add(1, Ordering::Relaxed);
            }
        });
        Reader { endpoint, msgs, events, stop, thread: Some(thread) }
    }

    fn take(&self) -> (u64, u64) {
        (self.msgs.swap(0, Ordering::Relaxed), self.events.swap(0, Ordering::Relaxed))
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One replay: its `wall_s`, and the `events` object of its report.
fn replay(bin: &str, trace: &str, extra: &[&str]) -> (f64, serde_json::Value) {
    let out = Command::new(bin)
        .args(["replay", "--trace", trace, "--page-size", "16", "--json"])
        .args(extra)
        .output()
        .expect("radixkv runs");
    assert!(out.status.success(), "{bin} {extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    (v["wall_s"].as_f64().unwrap(), v["events"].clone())
}

fn part1_replay() {
    // `RADIXKV_BENCH_BIN`: the `radixkv` binary to replay with when not the one cargo built
    // beside this bench (`scripts/device-check` carries both to another machine).
    let bin_path = std::env::var("RADIXKV_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_radixkv").to_string());
    let bin = bin_path.as_str();
    let trace = std::env::var("RADIXKV_BENCH_TRACE").unwrap_or_else(|_| MOONCAKE.to_string());
    let runs: usize =
        std::env::var("RADIXKV_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let baseline = std::env::var("RADIXKV_BENCH_BASELINE").ok();
    let reader = Reader::start();
    let sub_ep = reader.endpoint.clone();
    // (name, binary, extra flags)
    let mut who: Vec<(&str, String, Vec<String>)> = vec![
        ("events off", bin.to_string(), vec![]),
        (
            "events on, subscriber reading",
            bin.to_string(),
            vec![
                "--kv-events".into(),
                sub_ep.clone(),
                "--kv-events-linger-ms".into(),
                "300".into(),
            ],
        ),
        (
            "events on, no subscriber",
            bin.to_string(),
            vec![
                "--kv-events".into(),
                "tcp://127.0.0.1:*".into(),
                "--kv-events-linger-ms".into(),
                "0".into(),
            ],
        ),
    ];
    if let Some(b) = &baseline {
        who.push(("baseline binary, events off", b.clone(), vec![]));
        who.push(("baseline binary, events on, subscriber reading", b.clone(), who[1].2.clone()));
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); who.len()];
    let mut received = Vec::new();
    println!("## 1. Replay, page 16: {trace}");
    println!(
        "binary {bin}{}",
        baseline.as_ref().map_or(String::new(), |b| format!("; baseline {b}"))
    );
    for round in 0..=runs {
        for k in 0..who.len() {
            let i = (k + round) % who.len();
            let (_, b, extra) = &who[i];
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            reader.take();
            let (wall, ev) = replay(b, &trace, &extra);
            if i == 1 || i == 4 {
                // The tail arrives during the linger (the process has ended by now).
                std::thread::sleep(Duration::from_millis(100));
                let (msgs, events) = reader.take();
                received.push((i, msgs, events, ev["batches"].as_u64().unwrap()));
            }
            if round > 0 {
                times[i].push(wall);
            }
        }
    }
    let base = median(&mut times[0].clone());
    println!("| contestant | median wall_s | [min-max] | / events off |");
    println!("| --- | ---: | --- | ---: |");
    for (i, (name, _, _)) in who.iter().enumerate() {
        let t = &mut times[i];
        let m = median(t);
        println!("| {name} | {m:.3} s | [{:.3}-{:.3}] | {:.2}x |", t[0], t[t.len() - 1], m / base);
    }
    let (_, m, e, b) = received.last().copied().unwrap_or_default();
    println!(
        "subscriber, last run: {m} of {b} batches received ({e} events in the 1 in 64 decoded)"
    );
    for (who, i) in [("this build", 1), ("baseline", 4)] {
        let runs: Vec<_> = received.iter().filter(|r| r.0 == i).map(|r| (r.1, r.3)).collect();
        if !runs.is_empty() {
            println!("(received, batches) per run, {who}: {runs:?}");
        }
    }
}

fn one_page(i: u64, pages: usize) -> (Vec<u64>, Vec<u32>) {
    let hashes: Vec<u64> = (0..pages as u64).map(|p| i * 1000 + p).collect();
    let tokens: Vec<u32> = (0..16 * pages as u32).map(|t| t.wrapping_add(i as u32)).collect();
    (hashes, tokens)
}

fn start(sink: &Arc<EventSink>) -> Publisher {
    Publisher::start(
        sink,
        PublisherOptions {
            endpoint: "tcp://127.0.0.1:*".into(),
            auto_flush: None,
            linger: Duration::from_millis(200),
            ..Default::default()
        },
    )
    .unwrap()
}

/// Connects a libzmq subscriber (default receive high-water mark) and flushes probe
/// batches until it gets one; returns it, and the first sequence number after the probes.
fn join(ctx: &zmq::Context, sink: &EventSink, p: &Publisher) -> (zmq::Socket, u64) {
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.connect(p.endpoint()).unwrap();
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
    let mut last = last.expect("the subscriber joined");
    while let Ok(m) = sub.recv_multipart(0) {
        last = u64::from_be_bytes(m[1][..].try_into().unwrap());
    }
    (sub, last + 1)
}

/// What one push-and-read run saw.
struct Run {
    /// Time of the caller's pushes and flushes.
    pushed: Duration,
    /// From the first push to the last batch received.
    received_at: Duration,
    received: u64,
    /// Sequence numbers the subscriber never saw (dropped at the queue or lost at the
    /// socket's high-water mark).
    gaps: u64,
    stats: radixkv_publisher::PublisherStats,
    bytes: u64,
}

/// Pushes `n` batches of one `pages`-page store as fast as possible; a subscriber receives
/// each (decoding one in 64), and stops at the last or after `idle` without a message.
fn push_and_read(n: u64, pages: usize, idle: Duration) -> Run {
    let sink =
        Arc::new(EventSink::new(SinkOptions { block_size: 16, ..Default::default() }).unwrap());
    let p = start(&sink);
    let ctx = zmq::Context::new();
    let (sub, first) = join(&ctx, &sink, &p);
    let last = first + n - 1;
    let t0 = Instant::now();
    let reader = std::thread::spawn(move || {
        sub.set_rcvtimeo(idle.as_millis() as i32).unwrap();
        let (mut got, mut gaps, mut prev, mut bytes) = (0u64, 0u64, first - 1, 0u64);
        let mut at = Instant::now();
        while prev < last {
            let Ok(m) = sub.recv_multipart(0) else { break };
            let seq = u64::from_be_bytes(m[1][..].try_into().unwrap());
            gaps += seq - prev - 1;
            prev = seq;
            bytes += m[2].len() as u64;
            // One in 64 decoded: the figure is the publisher's and the socket's, not the
            // consumer's decoder.
            if got.is_multiple_of(64) {
                std::hint::black_box(decode_batch(&m[2]).unwrap());
            }
            got += 1;
            at = Instant::now();
        }
        gaps += last.saturating_sub(prev);
        (got, gaps, at, bytes)
    });
    for i in 0..n {
        let (h, t) = one_page(i, pages);
        sink.stored(0, h, None, t);
        sink.flush();
    }
    let pushed = t0.elapsed();
    let (received, gaps, at, bytes) = reader.join().unwrap();
    let stats = p.stop();
    Run { pushed, received_at: at.duration_since(t0), received, gaps, stats, bytes }
}

fn part2_throughput() {
    println!();
    println!("## 2. Publisher throughput to a loopback subscriber (default limits)");
    println!(
        "| batch | received | pushed in | all received in | events/s | payload MB/s | dropped, lost |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (pages, label) in
        [(1usize, "1 store of 1 page (16 tokens)"), (32, "1 store of 32 pages (512 tokens)")]
    {
        let n = 100_000;
        let r = push_and_read(n, pages, Duration::from_secs(5));
        let secs = r.received_at.as_secs_f64();
        println!(
            "| {label} | {} of {n} | {:.3} s | {:.3} s | {:.0} | {:.1} | {}, {} |",
            r.received,
            r.pushed.as_secs_f64(),
            secs,
            r.received as f64 / secs,
            r.bytes as f64 / 1e6 / secs,
            r.stats.dropped,
            r.gaps - r.stats.dropped
        );
    }
}

/// The stalled subscriber of part 3, in a process of its own (this program, run again):
/// it subscribes, says `joined` on stdout at its first message, then reads nothing until a
/// line `FIRST LAST` on stdin, and then drains what reaches it: it prints how many of the
/// batches `FIRST..=LAST` it got and how many it never saw.
fn stalled_subscriber(endpoint: &str) {
    use std::io::{BufRead, Write};
    let ctx = zmq::Context::new();
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.connect(endpoint).unwrap();
    sub.recv_multipart(0).unwrap();
    println!("joined");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let mut it = line.split_whitespace().map(|v| v.parse::<u64>().unwrap());
    let (first, last) = (it.next().unwrap(), it.next().unwrap());
    sub.set_rcvtimeo(1000).unwrap();
    let (mut got, mut prev) = (0u64, first - 1);
    let mut gaps = 0;
    while prev < last {
        let Ok(m) = sub.recv_multipart(0) else { break };
        let seq = u64::from_be_bytes(m[1][..].try_into().unwrap());
        if seq < first {
            continue;
        }
        gaps += seq - prev - 1;
        prev = seq;
        got += 1;
    }
    gaps += last.saturating_sub(prev);
    println!("{got} {gaps}");
}

/// One row of part 3: `n` one-page batches at `pace` a second to a stalled subscriber in
/// another process. Returns (push+flush p99.9, max, publisher stats, received, never seen,
/// this process's RSS once every batch is published).
fn stalled_row(
    n: u64,
    pace: u64,
) -> (Duration, Duration, radixkv_publisher::PublisherStats, u64, u64, u64) {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let sink =
        Arc::new(EventSink::new(SinkOptions { block_size: 16, ..Default::default() }).unwrap());
    let p = start(&sink);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("RADIXKV_BENCH_STALLED_SUBSCRIBER", p.endpoint())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the subscriber process");
    let (tx, rx) = std::sync::mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    // Probe batches until the subscription has landed.
    loop {
        sink.removed(vec![]);
        sink.flush();
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(10)) {
            assert_eq!(l, "joined");
            break;
        }
    }
    let first = sink.stats().batches;
    let t0 = Instant::now();
    let mut flushes = Vec::with_capacity(n as usize);
    for i in 0..n {
        let due = t0 + Duration::from_secs_f64(i as f64 / pace as f64);
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let (h, t) = one_page(i, 1);
        let f = Instant::now();
        sink.stored(0, h, None, t);
        sink.flush();
        flushes.push(f.elapsed());
    }
    flushes.sort_unstable();
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.stats().published + p.stats().dropped < first + n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300));
    let rss = rss_mib();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{first} {}", first + n - 1).unwrap();
    let res = rx.recv_timeout(Duration::from_secs(120)).expect("the subscriber's count");
    let _ = child.wait();
    let mut it = res.split_whitespace().map(|v| v.parse::<u64>().unwrap());
    let (got, gaps) = (it.next().unwrap(), it.next().unwrap());
    let stats = p.stop();
    let p999 = flushes[(flushes.len() * 999 / 1000).min(flushes.len() - 1)];
    (p999, flushes[flushes.len() - 1], stats, got, gaps, rss)
}

fn part3_slow() {
    println!();
    println!(
        "## 3. A stalled subscriber (another process; reads nothing until the pushes end), one-page batches"
    );
    println!(
        "| batches | pace | push+flush p99.9 / max | published | dropped at the queue | received | never seen | publisher's RSS then |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (n, pace) in [(50_000u64, 50_000u64), (200_000, 50_000), (1_000_000, 200_000)] {
        let (p999, max, st, got, gaps, rss) = stalled_row(n, pace);
        println!(
            "| {n} | {pace}/s | {:.1} / {:.0} µs | {} | {} | {got} | {gaps} | {rss} MiB |",
            p999.as_secs_f64() * 1e6,
            max.as_secs_f64() * 1e6,
            st.published,
            st.dropped,
        );
    }
}

/// This process's resident set now (`VmRSS`), MiB.
fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            l.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb / 1024)
}

/// Thread CPU time, from `/proc/thread-self/schedstat` (nanoseconds on the CPU).
fn thread_cpu() -> Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    Duration::from_nanos(s.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0))
}

/// Each of this process's threads' CPU time, by thread id (`/proc/self/task/*/schedstat`).
fn tasks_cpu() -> std::collections::HashMap<u64, u64> {
    let mut m = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let tid = e.file_name().to_string_lossy().parse::<u64>().unwrap_or(0);
        let s = std::fs::read_to_string(e.path().join("schedstat")).unwrap_or_default();
        m.insert(tid, s.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0));
    }
    m
}

/// The CPU time this process's live threads took since `before` (threads started since
/// count from zero).
fn process_cpu_since(before: &std::collections::HashMap<u64, u64>) -> Duration {
    let ns = tasks_cpu().into_iter().map(|(t, v)| v - before.get(&t).copied().unwrap_or(0).min(v));
    Duration::from_nanos(ns.sum())
}

/// One in-process replay (the CLI's cycle, without its latency samples): wall, the
/// replaying thread's CPU time, and the whole process's (every thread's: the publisher's
/// and libzmq's too, counted until the publisher has sent the last batch).
fn replay_in_process(reqs: &[Vec<u32>], mode: &str) -> (Duration, Duration, Duration) {
    use radixkv::{Cache, CacheOptions, EventOptions, SlotRun};
    let mut cache = Cache::new(CacheOptions { page_size: 16, ..Default::default() }).unwrap();
    let mut publisher = None;
    if mode != "off" {
        cache.enable_events(EventOptions::default()).unwrap();
        if mode == "published" {
            let opts = PublisherOptions {
                endpoint: "tcp://127.0.0.1:*".into(),
                auto_flush: None,
                linger: Duration::ZERO,
                ..Default::default()
            };
            publisher = Some(Publisher::start(cache.event_sink().unwrap(), opts).unwrap());
        }
    }
    let (mut next, mut runs) = (0u32, Vec::<SlotRun>::new());
    let (t, c, all) = (Instant::now(), thread_cpu(), tasks_cpu());
    for tokens in reqs {
        let n = tokens.len() / 16 * 16;
        runs.clear();
        let g = cache.match_and_lock(0, tokens, &mut runs);
        let m = g.len();
        if n > m {
            runs.push(SlotRun { start: next, len: (n - m) as u32 });
            next += (n - m) as u32;
            cache.insert(0, &tokens[..n], &runs).unwrap();
        }
        drop(g);
        cache.reclaim();
        cache.flush_events();
        if mode == "drained" {
            drop(cache.drain_events());
        }
    }
    let (wall, cpu) = (t.elapsed(), thread_cpu() - c);
    if let Some(p) = &publisher {
        let batches = cache.event_sink().unwrap().stats().batches;
        while p.stats().published + p.stats().dropped < batches {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let total = process_cpu_since(&all);
    drop(publisher);
    (wall, cpu, total)
}

fn part4_breakdown() {
    let trace = std::env::var("RADIXKV_BENCH_TRACE").unwrap_or_else(|_| MOONCAKE.to_string());
    let runs: usize =
        std::env::var("RADIXKV_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let t = radixkv_trace::Trace::load(&trace, Default::default()).expect("the trace");
    let reqs: Vec<Vec<u32>> = t.iter().map(|r| r.tokens).collect();
    println!();
    println!("## 4. In process (the library, page 16): the replaying thread's wall and CPU time");
    let modes = ["off", "drained", "published"];
    let mut res: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); modes.len()];
    for round in 0..=runs {
        for k in 0..modes.len() {
            let i = (k + round) % modes.len();
            let (w, c, p) = replay_in_process(&reqs, modes[i]);
            if round > 0 {
                res[i].push((w.as_secs_f64(), c.as_secs_f64(), p.as_secs_f64()));
            }
        }
    }
    println!(
        "| events | median wall | [min-max] | median thread CPU | median process CPU | / off (wall, thread CPU, process CPU) |"
    );
    println!("| --- | ---: | --- | ---: | ---: | ---: |");
    type Row = (f64, f64, f64);
    let med = |v: &[Row], f: fn(&Row) -> f64| median(&mut v.iter().map(f).collect::<Vec<_>>());
    let (w0, c0, p0) = (med(&res[0], |r| r.0), med(&res[0], |r| r.1), med(&res[0], |r| r.2));
    for (i, m) in modes.iter().enumerate() {
        let mut w: Vec<f64> = res[i].iter().map(|r| r.0).collect();
        let (wm, cm, pm) = (median(&mut w), med(&res[i], |r| r.1), med(&res[i], |r| r.2));
        println!(
            "| {m} | {wm:.3} s | [{:.3}-{:.3}] | {cm:.3} s | {pm:.3} s | {:.2}x, {:.2}x, {:.2}x |",
            w[0],
            w[w.len() - 1],
            wm / w0,
            cm / c0,
            pm / p0
        );
    }
}

fn main() {
    if let Ok(ep) = std::env::var("RADIXKV_BENCH_STALLED_SUBSCRIBER") {
        return stalled_subscriber(&ep);
    }
    // `cargo bench` passes `--bench`; arguments select parts: `1`, `2`, `3`, `4`.
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let want = |p: &str| args.is_empty() || args.iter().any(|a| a == p);
    println!(
        "radixkv KV-event bench: {} cores, {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .map_or(String::new(), |l| format!("load {}", l.trim()))
    );
    if want("1") {
        part1_replay();
    }
    if want("4") {
        part4_breakdown();
    }
    if want("2") {
        part2_throughput();
    }
    if want("3") {
        part3_slow();
    }
}
