//! `radixkv replay --host-capacity` and `radixkv sweep --host-capacity`: the host tier's
//! report fields present and consistent with each other and with the device-only replay,
//! bad flags refused. Behaviour only, no timing.

use crate::common::*;
use serde_json::Value;

const POLICIES: [&str; 3] = ["write_through", "write_through_selective", "write_back"];

/// The first `n` requests of the Mooncake trace, as a file of their own.
fn mooncake_slice(n: usize) -> std::path::PathBuf {
    let text = std::fs::read_to_string(MOONCAKE).expect("trace readable");
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).take(n).collect();
    temp_file("mooncake-slice.jsonl", &(lines.join("\n") + "\n"))
}

fn tier(v: &Value) -> &Value {
    assert!(v["tier"].is_object(), "no tier section in {v}");
    &v["tier"]
}

/// What holds between a tiered run's fields, and against the device-only run `plain` of
/// the same trace and device capacity.
fn check_consistent(v: &Value, plain: &Value, policy: &str) {
    let t = tier(v);
    let input = u(v, "input_tokens");
    assert_eq!(input, u(plain, "input_tokens"));
    assert_eq!(t["write_policy"], policy);
    // The report's hits are the device's.
    assert_eq!(u(t, "device_hit_tokens"), u(v, "hit_tokens"));
    assert_eq!(f(t, "device_hit_ratio"), f(v, "hit_ratio"));
    // Host hits are the tokens loaded back, and add to the device's.
    assert_eq!(u(t, "host_hit_tokens"), u(t, "tokens_to_device"));
    assert!(u(t, "host_hit_tokens") <= u(t, "host_match_tokens"), "{t}");
    assert_eq!(u(t, "combined_hit_tokens"), u(t, "device_hit_tokens") + u(t, "host_hit_tokens"));
    let ratio = u(t, "combined_hit_tokens") as f64 / input as f64;
    assert!((f(t, "combined_hit_ratio") - ratio).abs() < 1e-12, "{t}");
    assert!((f(t, "host_hit_ratio") - u(t, "host_hit_tokens") as f64 / input as f64).abs() < 1e-12);
    // A host tier never loses hits against the device alone at the same device capacity.
    assert!(
        f(t, "combined_hit_ratio") >= f(plain, "hit_ratio"),
        "{policy}: device+host {} < device-only {}",
        f(t, "combined_hit_ratio"),
        f(plain, "hit_ratio")
    );
    // Copies: counts per request, tokens per copy.
    let copies = u(t, "copies_to_host") + u(t, "copies_to_device");
    let per_req = copies as f64 / u(v, "requests") as f64;
    assert!((f(t, "copies_per_request") - per_req).abs() < 1e-12, "{t}");
    if copies > 0 {
        let per_copy = (u(t, "tokens_to_host") + u(t, "tokens_to_device")) as f64 / copies as f64;
        assert!((f(t, "tokens_per_copy") - per_copy).abs() < 1e-9, "{t}");
    }
    assert_eq!(u(t, "copies_to_device"), u(t, "load_backs"), "one copy per load-back: {t}");
    assert!(u(t, "tokens_to_host") > 0, "{policy}: nothing backed up: {t}");
    // write_back copies only at device eviction; the others never write back.
    if policy == "write_back" {
        assert_eq!(u(t, "tokens_written_back"), u(t, "tokens_to_host"), "{t}");
    } else {
        assert_eq!(u(t, "tokens_written_back"), 0, "{t}");
    }
    assert_eq!(u(t, "copy_failures"), 0);
    assert!(u(t, "host_cached_tokens") <= u(t, "host_capacity"));
    assert_eq!(u(t, "host_evicted_tokens"), u(t, "host_evicted_pages") * u(v, "page_size"));
    // The device side is the plain report's: never more cached than the pool.
    assert!(u(v, "cached_tokens") <= u(v, "capacity"));
}

fn replay_tier(trace: Option<&str>, cap: &str, host: &str, policy: &str, extra: &[&str]) -> Value {
    let mut args = vec!["replay", "--page-size", "16", "--capacity", cap, "--json"];
    if let Some(t) = trace {
        args.extend(["--trace", t]);
    }
    args.extend(["--host-capacity", host, "--write-policy", policy]);
    args.extend(extra);
    run_json(&args)
}

fn replay_plain(trace: Option<&str>, cap: &str) -> Value {
    let mut args = vec!["replay", "--page-size", "16", "--capacity", cap, "--json"];
    if let Some(t) = trace {
        args.extend(["--trace", t]);
    }
    run_json(&args)
}

#[test]
fn builtin_workload_each_write_policy() {
    let plain = replay_plain(None, "100k");
    assert!(plain["tier"].is_null(), "no host tier, no tier section: {plain}");
    let mut to_host = Vec::new();
    for p in POLICIES {
        let v = replay_tier(None, "100k", "2M", p, &[]);
        check_consistent(&v, &plain, p);
        let t = tier(&v);
        assert_eq!(u(t, "host_capacity"), 2_000_000);
        // The device evicts at 100k tokens, and the host gives some of it back.
        assert!(u(t, "host_hit_tokens") > 0, "{p}: no host hits: {t}");
        assert!(f(t, "combined_hit_ratio") > f(&plain, "hit_ratio"), "{p}: {t}");
        // No KV size: no bytes, no times.
        assert!(t["bytes_to_host"].is_null() && t["copy_time_to_device_s"].is_null());
        to_host.push(u(t, "tokens_to_host"));
    }
    // Backing up every insert copies more than backing up only the pages hit twice.
    assert!(to_host[0] > to_host[1], "write_through vs selective: {to_host:?}");
}

#[test]
fn mooncake_slice_each_write_policy() {
    let slice = mooncake_slice(400);
    let s = slice.to_str().unwrap();
    let plain = replay_plain(Some(s), "300k");
    assert_eq!(u(&plain, "requests"), 400);
    for p in POLICIES {
        let v = replay_tier(Some(s), "300k", "3M", p, &["--kv-bytes-per-token", "128KiB"]);
        check_consistent(&v, &plain, p);
        let t = tier(&v);
        assert!(u(t, "host_hit_tokens") > 0, "{p}: no host hits on the slice: {t}");
        // Bytes are tokens x bytes per token, the times bytes over the assumed 50 GB/s.
        assert_eq!(u(t, "bytes_to_host"), u(t, "tokens_to_host") * 131_072);
        assert_eq!(u(t, "bytes_to_device"), u(t, "tokens_to_device") * 131_072);
        let secs = u(t, "bytes_to_device") as f64 / 50e9;
        assert!((f(t, "copy_time_to_device_s") - secs).abs() < 1e-9, "{t}");
        assert_eq!(f(t, "host_link_gbps"), 50.0);
    }
    // Another bandwidth scales the time.
    let v = replay_tier(
        Some(s),
        "300k",
        "3M",
        "write_through",
        &["--kv-bytes-per-token", "128KiB", "--host-link-gbps", "25"],
    );
    let t = tier(&v);
    let secs = u(t, "bytes_to_host") as f64 / 25e9;
    assert!((f(t, "copy_time_to_host_s") - secs).abs() < 1e-9, "{t}");
    let _ = std::fs::remove_file(slice);
}

#[test]
fn threshold_and_load_back_min_change_what_is_copied() {
    // Threshold 1: selective backs up on the first insert, as write_through does.
    let wt = replay_tier(None, "100k", "2M", "write_through", &[]);
    let sel1 =
        replay_tier(None, "100k", "2M", "write_through_selective", &["--write-threshold", "1"]);
    assert_eq!(u(tier(&sel1), "write_threshold"), 1);
    assert_eq!(u(tier(&sel1), "tokens_to_host"), u(tier(&wt), "tokens_to_host"));
    // A threshold no page reaches copies nothing, and nothing comes back.
    let never = replay_tier(
        None,
        "100k",
        "2M",
        "write_through_selective",
        &["--write-threshold", "1000000"],
    );
    let t = tier(&never);
    assert_eq!((u(t, "tokens_to_host"), u(t, "host_hit_tokens")), (0, 0), "{t}");
    assert_eq!(u(t, "combined_hit_tokens"), u(&never, "hit_tokens"));
    // Load-backs shorter than the minimum are skipped: host matches, nothing loaded.
    let v = replay_tier(None, "100k", "2M", "write_through", &["--load-back-min", "100000000"]);
    let t = tier(&v);
    assert!(u(t, "host_match_tokens") > 0, "{t}");
    assert_eq!((u(t, "host_hit_tokens"), u(t, "load_backs")), (0, 0), "{t}");
    assert!(u(t, "load_backs_skipped") > 0, "{t}");
}

#[test]
fn outputs_and_threads_with_a_host_tier() {
    let plain = replay_plain(None, "100k");
    let v = replay_tier(None, "100k", "2M", "write_back", &["--threads", "2"]);
    check_consistent(&v, &plain, "write_back");
    assert_eq!(u(&v, "threads"), 2);
    let v = replay_tier(None, "100k", "2M", "write_through", &["--with-output"]);
    assert!(u(&v, "output_tokens") > 0);
    let t = tier(&v);
    assert_eq!(u(t, "host_hit_tokens"), u(t, "tokens_to_device"));
    // The human report has the tier's lines.
    let out = run(&[
        "replay",
        "--page-size",
        "16",
        "--capacity",
        "100k",
        "--host-capacity",
        "2M",
        "--kv-bytes-per-token",
        "128KiB",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "host      2,000,000 tokens",
        "tier hits",
        "device + host",
        "copies    ",
        "assumed 50 GB/s",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

#[test]
fn bad_host_flags_are_usage_errors() {
    for (args, says) in [
        (&["--host-capacity", "1M"][..], "needs a device capacity"),
        (&["--capacity", "inf", "--host-capacity", "1M"], "needs a device capacity"),
        (&["--capacity", "1M", "--host-capacity", "inf"], "finite size"),
        (&["--capacity", "1M", "--host-capacity", "0"], "at least 1 token"),
        (&["--capacity", "1M", "--host-capacity", "lots"], "not a capacity"),
        (
            &["--capacity", "1M", "--host-capacity", "1M", "--write-policy", "write_around"],
            "unknown write policy",
        ),
        (
            &["--capacity", "1M", "--host-capacity", "1M", "--write-threshold", "0"],
            "--write-threshold",
        ),
        (&["--capacity", "1M", "--host-capacity", "1M", "--load-back-min", "0"], "at least 1"),
        (&["--capacity", "1M", "--host-capacity", "1M", "--host-link-gbps", "0"], "positive"),
        (
            &["--capacity", "1M", "--host-capacity", "1M", "--host-link-gbps", "x"],
            "--host-link-gbps",
        ),
        // Tier flags without a tier.
        (&["--capacity", "1M", "--write-policy", "write_back"], "--host-capacity"),
        (&["--capacity", "1M", "--write-threshold", "3"], "--host-capacity"),
        (&["--capacity", "1M", "--host-link-gbps", "10"], "--host-capacity"),
        // What the tiered replay does not do.
        (&["--capacity", "1M", "--host-capacity", "1M", "--kv-events", "tcp://*:0"], "--kv-events"),
        (
            &["--capacity", "1M", "--host-capacity", "1M", "--compare-policies"],
            "--compare-policies",
        ),
    ] {
        let mut full = vec!["replay"];
        full.extend(args);
        let out = run(&full);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{full:?}: {err}");
        assert!(err.contains(says) && !err.contains("panicked"), "{full:?}: {err}");
    }
    // Found once the values are combined (as the device capacity's): status 1.
    let err = run_fail(&["replay", "--capacity", "1M", "--host-capacity", "40GiB"]);
    assert!(err.contains("host capacity") && err.contains("--kv-bytes-per-token"), "{err}");
    let err =
        run_fail(&["replay", "--page-size", "16", "--capacity", "1M", "--host-capacity", "8"]);
    assert!(err.contains("smaller than one page"), "{err}");
}

#[test]
fn sweep_with_a_host_tier_writes_both_columns() {
    let dir = temp_path("sweep-host");
    let out = run(&[
        "sweep",
        "--page-size",
        "16",
        "--capacities",
        "50k,100k,400k",
        "--host-capacity",
        "2M",
        "--write-policy",
        "write_through",
        "--jobs",
        "1",
        "--out-dir",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("+host ratio") && table.contains("host tier 2,000,000 tokens"),
        "{table}"
    );
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| {
        head.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no {name} column: {head:?}"))
    };
    let (cap, hit, comb, pol) =
        (col("capacity"), col("hit_ratio"), col("combined_hit_ratio"), col("write_policy"));
    assert_eq!(head.last(), Some(&"policy"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 4, "{csv}");
    for r in &rows[..3] {
        assert_eq!(r.len(), head.len());
        let (h, c): (f64, f64) = (r[hit].parse().unwrap(), r[comb].parse().unwrap());
        assert!(c >= h, "device+host {c} < device-only {h} at {}", r[cap]);
        assert_eq!(r[pol], "write_through");
    }
    // The smallest capacity evicts, and the host gives hits back.
    let (h, c): (f64, f64) = (rows[0][hit].parse().unwrap(), rows[0][comb].parse().unwrap());
    assert!(c > h, "{csv}");
    // The unlimited row has no host run.
    assert_eq!(rows[3][cap], "inf");
    assert_eq!(rows[3][comb], "");
    let svg = std::fs::read_to_string(dir.join("sweep.svg")).unwrap();
    assert!(svg.contains("device + 2M host tokens"), "no host curve in the plot");
    // Without --host-capacity, no host columns.
    let out = run(&[
        "sweep",
        "--page-size",
        "16",
        "--capacities",
        "100k",
        "--jobs",
        "1",
        "--out-dir",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
    assert!(!csv.contains("combined_hit_ratio"), "{csv}");
    let _ = std::fs::remove_dir_all(dir);
}
