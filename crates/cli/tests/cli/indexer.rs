//! `radixkv indexer` as a process, fed by `radixkv replay --kv-events` processes (each a
//! worker with a replay socket, one in each vLLM encoding): every request of the replayed
//! trace is then held whole by both workers, the answers say so; SIGTERM writes the
//! snapshot and a second indexer started from it answers the same.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use radixkv_indexer::client::{get, post_json};
use radixkv_trace::{Trace, TraceOptions};
use serde_json::json;

const PAGE: usize = 16;

/// A child process killed (and reaped) on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `radixkv indexer` and returns it with its base URL (from the line it prints).
fn indexer(args: &[&str]) -> (Proc, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_radixkv"))
        .arg("indexer")
        .args(["--listen", "127.0.0.1:0", "--quiet"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("radixkv runs");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("radixkv indexer: listening on ")
        .unwrap_or_else(|| panic!("the listening line: {line:?}"))
        .to_owned();
    (Proc(child), url)
}

/// Starts a lingering `radixkv replay --kv-events` and returns it with its PUB and replay
/// endpoints (from its "KV events on" line).
fn worker(format: &str) -> (Proc, String, String) {
    let mut child = Proc(
        Command::new(env!("CARGO_BIN_EXE_radixkv"))
            .args(["replay", "--trace", MOONCAKE, "--page-size", "16"])
            .args(["--kv-events", "tcp://127.0.0.1:*", "--kv-events-replay", "tcp://127.0.0.1:*"])
            .args(["--kv-events-format", format, "--kv-events-linger-ms", "3600000", "--json"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("radixkv runs"),
    );
    let mut err = BufReader::new(child.0.stderr.take().unwrap()).lines();
    for l in err.by_ref().map_while(Result::ok) {
        if let Some(rest) = l.strip_prefix("radixkv: KV events on ") {
            let pub_ep = rest.split(' ').next().unwrap().to_string();
            let replay = rest.split(", replay on ").nth(1).expect("a replay endpoint").to_string();
            // Keep reading its stderr (a full pipe would stop it).
            std::thread::spawn(move || err.map_while(Result::ok).for_each(drop));
            return (child, pub_ep, replay);
        }
    }
    panic!("no \"KV events on\" line");
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(120);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every 20th request of the trace: both workers hold its aligned prefix whole.
fn check(url: &str, trace: &Trace) {
    for r in trace.iter().step_by(20) {
        let aligned = (r.tokens.len() / PAGE * PAGE) as u64;
        let a = post_json(
            &format!("{url}/query"),
            &json!({"token_ids": r.tokens, "model_name": "mooncake"}),
        )
        .unwrap();
        assert_eq!(a.status, 200, "{}", a.text());
        let v = a.json().unwrap();
        if aligned == 0 {
            continue;
        }
        for w in ["1", "2"] {
            assert_eq!(v["scores"][w]["0"].as_u64(), Some(aligned), "worker {w}: {v}");
        }
    }
}

#[test]
fn indexer_follows_replay_processes_and_restarts_from_its_snapshot() {
    let trace = Trace::load(MOONCAKE, TraceOptions::default()).expect("the Mooncake trace");
    let snap = temp_path("indexer-snapshot.json");
    let snap_s = snap.to_str().unwrap();
    let (mut svc, url) = indexer(&["--snapshot", snap_s]);
    let workers: Vec<_> = ["vllm-array", "vllm-map"].iter().map(|f| worker(f)).collect();
    for (i, (_, ep, replay)) in workers.iter().enumerate() {
        let r = post_json(
            &format!("{url}/register"),
            &json!({"instance_id": i + 1, "endpoint": ep, "model_name": "mooncake",
                    "block_size": PAGE, "replay_endpoint": replay}),
        )
        .unwrap();
        assert_eq!(r.status, 201, "{}", r.text());
    }
    // The replays publish one batch per request that adds pages, then linger: wait until
    // both streams are still (their cursors equal twice, a second apart) and non-empty.
    let cursors = |url: &str| -> Vec<Option<u64>> {
        let w = get(&format!("{url}/workers")).unwrap().json().unwrap();
        w.as_array().unwrap().iter().map(|e| e["next_seq"]["0"].as_u64()).collect()
    };
    let mut last = Vec::new();
    wait_for("the streams to settle", || {
        let now = cursors(&url);
        let done =
            now.len() == 2 && now.iter().all(|c| c.is_some_and(|c| c > 3_000)) && now == last;
        last = now;
        if !done {
            std::thread::sleep(Duration::from_secs(1));
        }
        done
    });
    check(&url, &trace);
    let unseen = post_json(
        &format!("{url}/query"),
        &json!({"token_ids": vec![7u32; 64], "model_name": "mooncake"}),
    )
    .unwrap();
    assert_eq!(unseen.json().unwrap()["scores"], json!({}));
    // SIGTERM: drains, writes the snapshot, exits 0.
    let st = Command::new("kill").args(["-TERM", &svc.0.id().to_string()]).status().unwrap();
    assert!(st.success());
    let code = svc.0.wait().unwrap();
    assert!(code.success(), "{code:?}");
    let text = std::fs::read_to_string(&snap).expect("the snapshot");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["registrations"].as_array().unwrap().len(), 2);
    // A new indexer from the snapshot: the same answers, the same cursors.
    let (svc2, url2) = indexer(&["--snapshot", snap_s]);
    assert_eq!(cursors(&url2), last);
    check(&url2, &trace);
    drop(svc2);
    drop(workers);
    let _ = std::fs::remove_file(&snap);
}
