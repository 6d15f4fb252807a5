//! Helpers shared by the command-line tests: run the binary, make temporary traces.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// The Mooncake trace of the spec (in `shared/` beside the checkout, where `.ci/run` and a
/// session find it).
pub const MOONCAKE: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces/mooncake_synthetic_trace.jsonl");

/// Runs `radixkv` with `args`.
pub fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_radixkv")).args(args).output().expect("radixkv runs")
}

/// Runs `radixkv` and parses its stdout as JSON; fails the test if it does not succeed.
pub fn run_json(args: &[&str]) -> serde_json::Value {
    let out = run(args);
    assert!(
        out.status.success(),
        "radixkv {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// Runs `radixkv`, expecting it to fail cleanly; returns its stderr.
pub fn run_fail(args: &[&str]) -> String {
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "radixkv {args:?} should fail; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(1), "a clean error exits with 1: {err}");
    assert!(!err.contains("panicked"), "radixkv panicked: {err}");
    err
}

/// A fresh path in the temp dir (nothing is created).
pub fn temp_path(name: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("radixkv-cli-test-{}-{n}-{name}", std::process::id()))
}

/// Writes `text` to a fresh temp file.
pub fn temp_file(name: &str, text: &str) -> PathBuf {
    let p = temp_path(name);
    std::fs::write(&p, text).expect("temp file written");
    p
}

/// A tokens-format line.
pub fn tokens_line(ns: u64, tokens: &[u32], output_length: usize) -> String {
    serde_json::json!({"tokens": tokens, "namespace": ns, "output_length": output_length})
        .to_string()
}

/// An unsigned field of a JSON report.
pub fn u(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("field {key} missing or not an unsigned integer in {v}"))
}

/// Runs `radixkv` with `args` and `input` on its standard input.
pub fn run_stdin(args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_radixkv"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("radixkv runs");
    let mut stdin = child.stdin.take().expect("stdin piped");
    let input = input.to_vec();
    // Written from another thread, so a full stdout pipe cannot deadlock the two.
    let writer = std::thread::spawn(move || {
        // A program that stops reading early (an error) closes the pipe: not a failure here.
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().expect("radixkv ends");
    writer.join().expect("stdin writer");
    out
}

/// A float field of a JSON report.
pub fn f(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("field {key} missing or not a number in {v}"))
}
