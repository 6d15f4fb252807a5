//! An engine publisher written from vLLM's wire format in Python (msgspec, pyzmq), not by
//! radixkv's encoder (`tests/indexer/python/vllm_publisher.py`), in both encodings, with a gap on
//! its PUB socket: the service's answers equal the publisher's own bookkeeping.
//!
//! Needs a Python with msgspec and pyzmq: `RADIXKV_INDEXER_PYTHON` (a path; one that cannot
//! import them fails the test) or `python3`;
//! without one the test says so and passes (e.g. `python3 -m venv /tmp/v && /tmp/v/bin/pip
//! install msgspec pyzmq`, then `RADIXKV_INDEXER_PYTHON=/tmp/v/bin/python`).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use crate::common::*;
use serde_json::Value;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/indexer/python/vllm_publisher.py");

fn python() -> Option<String> {
    let py = std::env::var("RADIXKV_INDEXER_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", "import msgspec, zmq"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(py)
}

#[test]
fn a_python_vllm_publisher_in_both_encodings() {
    let Some(py) = python() else {
        // Named explicitly (as .ci/run does), the Python must have them: no silent skip.
        if let Ok(named) = std::env::var("RADIXKV_INDEXER_PYTHON") {
            panic!("RADIXKV_INDEXER_PYTHON={named} cannot import msgspec and zmq");
        }
        eprintln!("SKIPPED: no Python with msgspec and pyzmq (set RADIXKV_INDEXER_PYTHON)");
        return;
    };
    let svc = start(config());
    for (id, encoding) in [(31u64, "array"), (32, "map")] {
        let mut child = Command::new(&py)
            .args([SCRIPT, "--encoding", encoding, "--block-size", &BS.to_string()])
            .args(["--salt", &id.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python runs");
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut line = || -> Value { serde_json::from_str(&out.next().unwrap().unwrap()).unwrap() };
        let eps = line();
        register(&svc, id, eps["endpoint"].as_str().unwrap(), eps["replay"].as_str());
        let frames = metric(&svc, "radixkv_indexer_frames_total");
        wait_for("the SUB socket to join", 60, || {
            metric(&svc, "radixkv_indexer_frames_total") > frames
        });
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "go").unwrap();
        let done = line();
        let last = done["last_seq"].as_u64().unwrap();
        wait_for("the stream applied", 60, || cursor(&svc, id) == Some(last + 1));
        for q in done["queries"].as_array().unwrap() {
            let tokens: Vec<u32> =
                q[0].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
            let want = q[1].as_u64().unwrap();
            let got = query(&svc, &tokens);
            assert_eq!(got.get(&id).copied().unwrap_or(0), want, "{encoding}: {tokens:?}");
            assert_eq!(got.len(), usize::from(want > 0), "only this worker holds them");
        }
        drop(stdin);
        let _ = child.wait();
    }
    assert!(metric(&svc, "radixkv_indexer_gaps_total") >= 2, "the gaps were seen");
    assert_eq!(metric(&svc, "radixkv_indexer_gap_clears_total"), 0, "and repaired");
    assert_eq!(metric(&svc, "radixkv_indexer_malformed_batches_total"), 0);
    svc.shutdown().unwrap();
}
