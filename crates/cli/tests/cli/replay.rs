//! `radixkv replay` end to end: exact hit counts, formats, bad input, threads, JSON.

use crate::common::*;
use radixkv_trace::synthetic::{SyntheticConfig, generate};

/// The key exactness test of docs/contract/CLI.md (about a second even in debug, so never ignored).
#[test]
fn mooncake_trace_exact_hit_count() {
    let v = run_json(&[
        "replay",
        "--trace",
        MOONCAKE,
        "--capacity",
        "inf",
        "--page-size",
        "1",
        "--threads",
        "1",
        "--schedule",
        "fcfs",
        "--json",
    ]);
    assert_eq!(u(&v, "requests"), 3_993);
    assert_eq!(u(&v, "input_tokens"), 61_194_628);
    assert_eq!(u(&v, "hit_tokens"), 39_852_661);
    assert_eq!(format!("{:.6}", v["hit_ratio"].as_f64().unwrap()), "0.651244");
    assert_eq!(u(&v, "evicted_tokens"), 0);
    // Page size 1, unlimited: the cache ends up holding every distinct token prefix.
    assert_eq!(u(&v, "cached_tokens"), 61_194_628 - 39_852_661);
    assert_eq!(u(&v, "skipped_requests"), 0);
}

/// Hits an unlimited cache of page size `page` must find on a Mooncake trace, whatever the
/// order: every aligned token prefix is missed exactly once, so hits = aligned input tokens
/// minus the distinct aligned prefixes, counted here over the trace's block structure.
fn mooncake_expected_hits(path: &str, block: usize, page: usize) -> (u64, u64) {
    let text = std::fs::read_to_string(path).expect("trace readable");
    let mut coverage: std::collections::HashMap<Vec<u64>, usize> = std::collections::HashMap::new();
    let mut aligned_total = 0u64;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let n = v["input_length"].as_u64().unwrap() as usize / page * page;
        let ids: Vec<u64> =
            v["hash_ids"].as_array().unwrap().iter().map(|h| h.as_u64().unwrap()).collect();
        aligned_total += n as u64;
        for k in 0..n.div_ceil(block) {
            let c = coverage.entry(ids[..=k].to_vec()).or_insert(0);
            *c = (*c).max(block.min(n - k * block));
        }
    }
    let distinct: u64 = coverage.values().map(|&c| c as u64).sum();
    (aligned_total - distinct, distinct)
}

/// Page size 16 with a pool large enough never to evict: the order-independent count.
#[test]
fn mooncake_trace_pages_in_pool_mode() {
    let (hits, distinct) = mooncake_expected_hits(MOONCAKE, 512, 1);
    assert_eq!((hits, distinct), (39_852_661, 21_341_967));
    let (hits, distinct) = mooncake_expected_hits(MOONCAKE, 512, 16);
    let v = run_json(&[
        "replay",
        "--trace",
        MOONCAKE,
        "--page-size",
        "16",
        "--capacity",
        "22e6",
        "--json",
    ]);
    assert_eq!(u(&v, "capacity"), 22_000_000);
    assert_eq!(u(&v, "hit_tokens"), hits);
    assert_eq!(u(&v, "cached_tokens"), distinct);
    assert_eq!(u(&v, "evicted_tokens"), 0);
    // Half the distinct tokens: eviction, fewer hits, never more than the pool.
    let v = run_json(&[
        "replay",
        "--trace",
        MOONCAKE,
        "--page-size",
        "16",
        "--capacity",
        "1e7",
        "--json",
    ]);
    assert!(u(&v, "evicted_tokens") > 0);
    assert!(u(&v, "hit_tokens") < hits);
    assert!(u(&v, "cached_tokens") <= 10_000_000);
    assert_eq!(u(&v, "requests"), 3_993);
}

/// Two threads on the Mooncake trace: the same distinct tokens cached, at most the hits of
/// one thread (a racing request can only miss what it would have hit).
#[test]
fn mooncake_trace_two_threads() {
    let v = run_json(&["replay", "--trace", MOONCAKE, "--threads", "2", "--json"]);
    assert_eq!(u(&v, "input_tokens"), 61_194_628);
    assert_eq!(u(&v, "cached_tokens"), 61_194_628 - 39_852_661);
    let hits = u(&v, "hit_tokens");
    assert!(hits <= 39_852_661, "{hits}");
    assert!(hits as f64 >= 0.95 * 39_852_661.0, "{hits}");
    assert_eq!(u(&v, "threads"), 2);
}

#[test]
fn tokens_format_exact() {
    let a: Vec<u32> = (1..=10).collect();
    let b: Vec<u32> = (1..=15).collect();
    let text = [
        tokens_line(0, &a, 0),
        String::new(),
        tokens_line(0, &b, 0),
        tokens_line(2, &a, 0),
        tokens_line(0, &a, 3),
    ]
    .join("\n");
    let f = temp_file("tokens.jsonl", &text);
    let fs = f.to_str().unwrap();
    for format in ["auto", "tokens"] {
        let v = run_json(&["replay", "--trace", fs, "--format", format, "--json"]);
        assert_eq!(u(&v, "requests"), 4);
        assert_eq!(u(&v, "input_tokens"), 45);
        // b hits a's 10; namespace 2 shares nothing; the last a hits all 10.
        assert_eq!(u(&v, "hit_tokens"), 20);
        assert_eq!(u(&v, "cached_tokens"), 25);
    }
    // Page sizes: only whole pages are cached and matched.
    let v = run_json(&["replay", "--trace", fs, "--page-size", "4", "--json"]);
    assert_eq!(
        (u(&v, "hit_tokens"), u(&v, "cached_tokens"), u(&v, "page_size")),
        (8 + 8, 12 + 8, 4)
    );
    let v = run_json(&["replay", "--trace", fs, "--page-size", "3", "--json"]);
    assert_eq!((u(&v, "hit_tokens"), u(&v, "cached_tokens")), (9 + 9, 15 + 9));
    let v = run_json(&["replay", "--trace", fs, "--page-size", "16", "--json"]);
    assert_eq!((u(&v, "hit_tokens"), u(&v, "cached_tokens")), (0, 0));
    // The same with a pool large enough never to evict.
    let v = run_json(&["replay", "--trace", fs, "--page-size", "4", "--capacity", "64", "--json"]);
    assert_eq!((u(&v, "hit_tokens"), u(&v, "cached_tokens"), u(&v, "capacity")), (16, 20, 64));
    let _ = std::fs::remove_file(&f);
}

#[test]
fn mooncake_format_exact() {
    // Block size 4: r0 = 0..8; r1 = 0..10 (blocks 0, 1, 2 cut to 10); r2 = 0..4 then 12, 13.
    let text = r#"{"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [0, 1]}
{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [0, 1, 2]}
{"timestamp": 9, "input_length": 6, "output_length": 1, "hash_ids": [0, 3]}
"#;
    let f = temp_file("mooncake.jsonl", text);
    let fs = f.to_str().unwrap();
    for format in ["auto", "mooncake"] {
        let v =
            run_json(&["replay", "--trace", fs, "--format", format, "--block-size", "4", "--json"]);
        assert_eq!((u(&v, "requests"), u(&v, "input_tokens"), u(&v, "hit_tokens")), (3, 24, 12));
        assert_eq!(u(&v, "cached_tokens"), 12);
    }
    let v = run_json(&["replay", "--trace", fs, "--json"]);
    // Block 0 is 0..512 now: every request starts with 0..k, so r1 hits 8, r2 hits 6.
    assert_eq!(u(&v, "hit_tokens"), 14);
    // Forcing the tokens format on Mooncake lines is a clean error.
    let err = run_fail(&["replay", "--trace", fs, "--format", "tokens"]);
    assert!(err.contains(&format!("{fs}:1: missing 'tokens'")), "{err}");
    let _ = std::fs::remove_file(&f);
}

#[test]
fn mixed_formats_auto_detected() {
    let text = format!(
        "{}\n{}\n",
        tokens_line(0, &[0, 1, 2, 3, 4], 0),
        r#"{"input_length": 6, "hash_ids": [0, 1]}"#
    );
    let f = temp_file("mixed.jsonl", &text);
    let v = run_json(&["replay", "--trace", f.to_str().unwrap(), "--block-size", "4", "--json"]);
    // Second request: 0, 1, 2, 3, 4, 5: hits the first 5.
    assert_eq!((u(&v, "input_tokens"), u(&v, "hit_tokens")), (11, 5));
    let _ = std::fs::remove_file(&f);
}

#[test]
fn bad_inputs_are_clean_errors() {
    let missing = temp_path("missing.jsonl");
    let ms = missing.to_str().unwrap();
    let err = run_fail(&["replay", "--trace", ms]);
    assert!(err.contains(ms) && err.contains("cannot read"), "{err}");

    let cases: [(&str, &str, &str); 9] = [
        ("malformed.jsonl", "{\"tokens\": [1, 2]}\n{\"tokens\": [1, 2\n", ":2: malformed JSON"),
        (
            "bigtoken.jsonl",
            "\n\n{\"tokens\": [1, 4294967296]}\n",
            ":3: token id 4294967296 at position 1 out of range: token ids are integers in [0, 2^32)",
        ),
        (
            "negtoken.jsonl",
            "{\"tokens\": [2.5, -3]}\n",
            ":1: token id 2.5 at position 0 out of range: token ids are integers in [0, 2^32)",
        ),
        (
            "short.jsonl",
            "{\"input_length\": 1025, \"hash_ids\": [1, 2]}\n",
            ":1: input_length 1025 larger than its hash_ids cover",
        ),
        (
            "huge.jsonl",
            "{\"input_length\": 99999999999, \"hash_ids\": [1]}\n",
            ":1: input_length 99999999999 out of range",
        ),
        (
            "toolong.jsonl",
            "{\"input_length\": 1000000000, \"hash_ids\": [0]}\n",
            ":1: input_length 1000000000 out of range (at most 268435456)",
        ),
        (
            "longoutput.jsonl",
            "{\"tokens\": [1], \"output_length\": 300000000}\n",
            ":1: output_length 300000000 out of range (at most 268435456)",
        ),
        // One JSON object a line: serde alone would take an array as the fields in order.
        ("array.jsonl", "[null, 5, 0, [1], null, null]\n", ":1: expected a JSON object"),
        (
            "overflow.jsonl",
            "{\"input_length\": 10, \"hash_ids\": [9000000]}\n",
            ":1: hash id 9000000 (block 0) gives token id",
        ),
    ];
    for (name, text, want) in cases {
        let f = temp_file(name, text);
        let fs = f.to_str().unwrap();
        let err = run_fail(&["replay", "--trace", fs]);
        assert!(err.contains(&format!("{fs}{want}")), "{name}: {err}");
        // The sweep reads traces the same way.
        let err =
            run_fail(&["sweep", "--trace", fs, "--out-dir", temp_path("never").to_str().unwrap()]);
        assert!(err.contains(&format!("{fs}{want}")), "{name}: {err}");
        let _ = std::fs::remove_file(&f);
    }
    // The position inside a line is a column (the line is the trace's).
    let f = temp_file("column.jsonl", "{\"tokens\": [1]}\n{\"tokens\": [1, 2\n");
    let err = run_fail(&["replay", "--trace", f.to_str().unwrap()]);
    assert!(err.contains(":2: malformed JSON at column ") && !err.contains("line 1"), "{err}");
    let _ = std::fs::remove_file(&f);
    // An integer beyond u64 (which serde_json reads as a float) says what the field takes.
    let f = temp_file("bigns.jsonl", "{\"tokens\": [1], \"namespace\": 18446744073709551616}\n");
    let err = run_fail(&["replay", "--trace", f.to_str().unwrap()]);
    assert!(
        err.contains(":1: malformed JSON at column ")
            && err.contains("expected an integer in [0, 2^64)"),
        "{err}"
    );
    let _ = std::fs::remove_file(&f);
    // A UTF-8 byte order mark before the first line is not an error.
    let f = temp_file("bom.jsonl", "\u{feff}{\"tokens\": [1, 2, 3]}\n{\"tokens\": [1, 2, 3]}\n");
    let v = run_json(&["replay", "--trace", f.to_str().unwrap(), "--json"]);
    assert_eq!((u(&v, "requests"), u(&v, "hit_tokens")), (2, 3));
    let _ = std::fs::remove_file(&f);
    // A block size that does not fit makes the token ids overflow, named with the line.
    let f = temp_file("bs.jsonl", "{\"input_length\": 3, \"hash_ids\": [5]}\n");
    let err = run_fail(&["replay", "--trace", f.to_str().unwrap(), "--block-size", "1000000000"]);
    assert!(err.contains(":1: hash id 5 (block 0) gives token id"), "{err}");
    let _ = std::fs::remove_file(&f);
}

#[test]
fn bad_options_are_usage_errors() {
    for args in [
        &["replay", "--capacity", "lots"][..],
        &["replay", "--capacity", "0"],
        &["replay", "--threads", "0"],
        &["replay", "--page-size", "0"],
        &["replay", "--schedule", "sjf"],
        &["replay", "--format", "csv"],
        &["replay", "--block-size", "0"],
        &["replay", "--threads", "5000"],
        &["replay", "--capacity", "-5"],
        &["replay", "--page-size", "-1"],
        &["replay", "--seed", "-1"],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{err}");
        // The value reaches its parser, which says what is wrong with it.
        assert!(err.contains("invalid value"), "{args:?}: {err}");
    }
    let err = String::from_utf8_lossy(&run(&["replay", "--threads", "5000"]).stderr).into_owned();
    assert!(err.contains("at most 1024"), "{err}");
    let err = String::from_utf8_lossy(&run(&["replay", "--capacity", "-5"]).stderr).into_owned();
    assert!(err.contains("must be at least 1 token"), "{err}");
    // A capacity smaller than one page is a clean error too.
    let err = run_fail(&["replay", "--capacity", "8", "--page-size", "16"]);
    assert!(err.contains("smaller than one page"), "{err}");
}

#[test]
fn requests_larger_than_capacity_are_skipped() {
    let long: Vec<u32> = (100..130).collect();
    let short: Vec<u32> = (1..=6).collect();
    let text = [
        tokens_line(0, &short, 0),
        tokens_line(0, &long, 0),
        tokens_line(0, &short, 0),
        tokens_line(0, &long, 0),
    ]
    .join("\n");
    let f = temp_file("capacity.jsonl", &text);
    let fs = f.to_str().unwrap();
    let v = run_json(&["replay", "--trace", fs, "--capacity", "16", "--json"]);
    assert_eq!(u(&v, "requests"), 4);
    assert_eq!(u(&v, "input_tokens"), 72);
    assert_eq!(u(&v, "skipped_requests"), 2);
    assert_eq!(u(&v, "skipped_tokens"), 60);
    assert_eq!(u(&v, "hit_tokens"), 6);
    assert_eq!(u(&v, "capacity"), 16);
    // Page size 8: capacity 16 holds 2 pages; a 30-token request needs 3 (aligned 24): skipped.
    let v = run_json(&["replay", "--trace", fs, "--capacity", "20", "--page-size", "8", "--json"]);
    assert_eq!((u(&v, "skipped_requests"), u(&v, "capacity"), u(&v, "hit_tokens")), (2, 16, 0));
    // Threads do not change that.
    let v = run_json(&["replay", "--trace", fs, "--capacity", "16", "--threads", "3", "--json"]);
    assert_eq!(u(&v, "skipped_requests"), 2);
    // The human report says so.
    let out = run(&["replay", "--trace", fs, "--capacity", "16"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("skipped") && text.contains("2 requests longer than the capacity"),
        "{text}"
    );
    let _ = std::fs::remove_file(&f);
}

fn small_workload_file() -> std::path::PathBuf {
    let t = generate(&SyntheticConfig {
        seed: 77,
        conversations: 40,
        fewshot_requests: 60,
        agent_contexts: 6,
    });
    let text: Vec<String> =
        t.iter().map(|r| tokens_line(r.namespace, &r.tokens, r.output_length)).collect();
    temp_file("synthetic.jsonl", &text.join("\n"))
}

#[test]
fn threads_give_the_same_cache_and_nearly_the_same_hits() {
    let f = small_workload_file();
    let fs = f.to_str().unwrap();
    let one = run_json(&["replay", "--trace", fs, "--json"]);
    assert!(u(&one, "hit_tokens") > 0);
    // Unlimited, page 1: what is cached at the end is every distinct prefix, however run.
    assert_eq!(u(&one, "cached_tokens"), u(&one, "input_tokens") - u(&one, "hit_tokens"));
    for threads in ["2", "4"] {
        let v = run_json(&["replay", "--trace", fs, "--threads", threads, "--json"]);
        assert_eq!(u(&v, "requests"), u(&one, "requests"));
        assert_eq!(u(&v, "input_tokens"), u(&one, "input_tokens"));
        assert_eq!(u(&v, "cached_tokens"), u(&one, "cached_tokens"));
        // Racing allowance: concurrent requests may both miss a prefix neither had cached;
        // they can never hit more than one thread does.
        let (h, h1) = (u(&v, "hit_tokens"), u(&one, "hit_tokens"));
        assert!(h <= h1 && h as f64 >= 0.9 * h1 as f64, "{threads} threads: {h} vs {h1}");
    }
    // With eviction and threads, every request is still accounted for.
    let cap = (u(&one, "cached_tokens") / 4).to_string();
    for threads in ["1", "4"] {
        let v = run_json(&[
            "replay",
            "--trace",
            fs,
            "--capacity",
            &cap,
            "--threads",
            threads,
            "--json",
        ]);
        assert_eq!(u(&v, "requests"), u(&one, "requests"));
        assert!(u(&v, "evicted_tokens") > 0);
        assert!(u(&v, "hit_tokens") < u(&one, "hit_tokens"));
        assert!(u(&v, "cached_tokens") <= u(&v, "capacity"));
        assert_eq!(u(&v, "out_of_slots"), 0);
    }
    let _ = std::fs::remove_file(&f);
}

#[test]
fn every_schedule_and_window_replays_everything() {
    let f = small_workload_file();
    let fs = f.to_str().unwrap();
    let one = run_json(&["replay", "--trace", fs, "--json"]);
    let cap = (u(&one, "cached_tokens") / 4).to_string();
    for schedule in ["fcfs", "lpm", "dfs-weight", "random"] {
        for window in ["1", "32"] {
            // Unlimited capacity, page 1, one thread: the order does not change the hits.
            let v = run_json(&[
                "replay",
                "--trace",
                fs,
                "--schedule",
                schedule,
                "--window",
                window,
                "--json",
            ]);
            assert_eq!(u(&v, "hit_tokens"), u(&one, "hit_tokens"), "{schedule} {window}");
            assert_eq!(v["schedule"], schedule);
            let v = run_json(&[
                "replay",
                "--trace",
                fs,
                "--schedule",
                schedule,
                "--window",
                window,
                "--capacity",
                &cap,
                "--json",
            ]);
            assert_eq!(u(&v, "requests"), u(&one, "requests"));
            assert!(u(&v, "hit_tokens") <= u(&one, "hit_tokens"));
            if window == "1" || schedule == "fcfs" || schedule == "random" {
                assert_eq!(u(&v, "deferred"), 0, "{schedule} {window}");
            }
        }
    }
    // The comparison table has a line per schedule and a column per window.
    let out = run(&["replay", "--trace", fs, "--compare-schedules", "--windows", "1,8"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for s in [
        "fcfs",
        "lpm",
        "dfs-weight",
        "random",
        "window 1",
        "window 8",
        "unlimited capacity",
        "auto",
    ] {
        assert!(text.contains(s), "{s} missing in:\n{text}");
    }
    // Window 1 leaves no choice: every schedule gets the fcfs ratio.
    let v = run_json(&[
        "replay",
        "--trace",
        fs,
        "--compare-schedules",
        "--windows",
        "1",
        "--capacity",
        &cap,
        "--json",
    ]);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    assert!(runs.iter().all(|r| r["hit_tokens"] == runs[0]["hit_tokens"]));
    // The unlimited reference line says how it was run: any order gives the same hits on
    // one thread, not on several.
    for (threads, want) in [("1", "(any schedule, 1 thread)"), ("2", "(fcfs, 2 threads)")] {
        let out = run(&[
            "replay",
            "--trace",
            fs,
            "--compare-schedules",
            "--windows",
            "1",
            "--threads",
            threads,
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("unlimited capacity {want}")), "{text}");
    }
    let _ = std::fs::remove_file(&f);
}

#[test]
fn with_output_caches_generated_tokens() {
    let a: Vec<u32> = (1..=10).collect();
    let text = [tokens_line(0, &a, 5), tokens_line(0, &a, 5), tokens_line(0, &a, 0)].join("\n");
    let f = temp_file("output.jsonl", &text);
    let fs = f.to_str().unwrap();
    let v = run_json(&["replay", "--trace", fs, "--json"]);
    assert_eq!((u(&v, "hit_tokens"), u(&v, "cached_tokens"), u(&v, "output_tokens")), (20, 10, 0));
    // Each output has fresh ids: two 5-token branches after the shared 10.
    let v = run_json(&["replay", "--trace", fs, "--with-output", "--json"]);
    assert_eq!((u(&v, "hit_tokens"), u(&v, "cached_tokens"), u(&v, "output_tokens")), (20, 20, 10));
    assert_eq!(v["with_output"], true);
    // In pool mode the same, and an output that does not fit is skipped, not a crash.
    let v = run_json(&["replay", "--trace", fs, "--with-output", "--capacity", "64", "--json"]);
    assert_eq!((u(&v, "hit_tokens"), u(&v, "cached_tokens")), (20, 20));
    let v = run_json(&["replay", "--trace", fs, "--with-output", "--capacity", "12", "--json"]);
    assert_eq!((u(&v, "hit_tokens"), u(&v, "skipped_outputs")), (20, 2));
    let _ = std::fs::remove_file(&f);
    // Whole pages only: a 4-token prompt and 6 generated tokens at page size 4 cache the
    // prompt and the 4 generated tokens of the second page, not all 6.
    let f = temp_file("output-pages.jsonl", &tokens_line(0, &[1, 2, 3, 4], 6));
    let fs = f.to_str().unwrap();
    let v = run_json(&["replay", "--trace", fs, "--with-output", "--page-size", "4", "--json"]);
    assert_eq!((u(&v, "cached_tokens"), u(&v, "output_tokens")), (8, 4));
    let _ = std::fs::remove_file(&f);
}

#[test]
fn json_has_every_documented_field() {
    let f = small_workload_file();
    let v = run_json(&["replay", "--trace", f.to_str().unwrap(), "--capacity", "2e4", "--json"]);
    for key in [
        "requests",
        "input_tokens",
        "hit_tokens",
        "evicted_tokens",
        "peak_rss_bytes",
        "index_bytes",
        "threads",
        "page_size",
        "capacity",
        "skipped_requests",
        "skipped_tokens",
        "skipped_outputs",
        "out_of_slots",
    ] {
        u(&v, key);
    }
    for key in [
        "hit_ratio",
        "wall_s",
        "requests_per_s",
        "tokens_per_s",
        "match_p50_us",
        "match_p99_us",
        "insert_p50_us",
        "insert_p99_us",
        "evict_p99_us",
        "index_bytes_per_token",
    ] {
        let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {v}"));
        assert!(x.is_finite() && x >= 0.0, "{key} = {x}");
    }
    assert_eq!(u(&v, "capacity"), 20_000);
    assert!(u(&v, "evicted_tokens") > 0 && u(&v, "evictions") > 0);
    assert!(v["match_p50_us"].as_f64().unwrap() <= v["match_p99_us"].as_f64().unwrap());
    assert!(u(&v, "peak_rss_bytes") > 0);
    let r = v["hit_ratio"].as_f64().unwrap();
    assert!((r - u(&v, "hit_tokens") as f64 / u(&v, "input_tokens") as f64).abs() < 1e-12);
    // Unlimited capacity is null.
    let v = run_json(&["replay", "--trace", f.to_str().unwrap(), "--json"]);
    assert!(v["capacity"].is_null());
    let _ = std::fs::remove_file(&f);
}

#[test]
fn builtin_workload_by_default() {
    let out = run(&["replay"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("radixkv replay: builtin"), "{text}");
    assert!(text.contains("hits") && text.contains("latency"), "{text}");
    let v = run_json(&["replay", "--json"]);
    let t = radixkv_trace::synthetic::builtin();
    assert_eq!(u(&v, "requests"), t.len() as u64);
    assert_eq!(u(&v, "input_tokens"), t.input_tokens());
    let ratio = v["hit_ratio"].as_f64().unwrap();
    assert!(ratio > 0.3 && ratio < 1.0, "{ratio}");
}

/// A reader that goes away (`radixkv replay | head -1`) ends the program quietly: status 0,
/// no panic, nothing on stderr (before, writing to the closed pipe panicked: exit 101 with a
/// backtrace). The pipe's read end is closed before the program writes anything.
#[test]
fn a_closed_pipe_ends_the_program_quietly() {
    use std::process::{Command, Stdio};
    for args in [&["replay", "--json"][..], &["replay"][..]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_radixkv"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("radixkv runs");
        drop(child.stdout.take()); // the reader is gone before the replay ends
        let out = child.wait_with_output().expect("radixkv ends");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "radixkv {args:?}: {:?}, stderr: {err}", out.status);
        assert!(!err.contains("panicked"), "radixkv {args:?} panicked: {err}");
    }
}

/// An empty trace (or one of blank lines) is an error that names the file, for replay and
/// sweep alike, not a report of zeros.
#[test]
fn an_empty_trace_is_an_error() {
    for (name, text) in [("empty.jsonl", ""), ("blank.jsonl", "\n\n  \n")] {
        let p = temp_file(name, text);
        let p = p.to_str().unwrap();
        for cmd in [
            &["replay", "--trace", p][..],
            &["sweep", "--trace", p, "--out-dir", "/nonexistent-unused"][..],
        ] {
            let err = run_fail(cmd);
            assert!(err.contains("holds no requests") && err.contains(name), "{cmd:?}: {err}");
        }
    }
}

/// The index's own memory: bytes per cached token from a walk of the tree, beside the
/// process's peak RSS, in the JSON and the text report.
#[test]
fn index_bytes_are_reported() {
    let f = small_workload_file();
    let fs = f.to_str().unwrap();
    for cap in ["inf", "2e4"] {
        let v = run_json(&["replay", "--trace", fs, "--capacity", cap, "--json"]);
        let (bytes, cached) = (u(&v, "index_bytes"), u(&v, "cached_tokens"));
        assert!(cached > 0 && bytes > 0, "{v}");
        let per = self::f(&v, "index_bytes_per_token");
        assert!((per - bytes as f64 / cached as f64).abs() < 1e-9, "{v}");
        // Tokens and slots (4 bytes each, slots often as runs) plus nodes and tables.
        assert!((2.0..64.0).contains(&per), "{per} bytes per token");
        assert!(bytes < u(&v, "peak_rss_bytes"), "{v}");
        // Without a KV size the KV fields are null.
        for key in ["kv_bytes_per_token", "capacity_kv_bytes", "cached_kv_bytes", "hit_kv_bytes"] {
            assert!(v[key].is_null(), "{key}: {v}");
        }
    }
    let out = run(&["replay", "--trace", fs]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("bytes per cached token") && text.contains("tree's own heap"), "{text}");
    assert!(text.contains("peak RSS of the process"), "{text}");
    let _ = std::fs::remove_file(&f);
}

/// A KV size from --kv-bytes-per-token or a model shape: bytes and GiB beside tokens, and
/// capacities in bytes.
#[test]
fn kv_sizes_give_bytes_and_gib() {
    let f = small_workload_file();
    let fs = f.to_str().unwrap();
    // 2 x 32 x 8 x 128 x 2 (bf16, the default) = 131,072 bytes per token.
    let shape = ["--layers", "32", "--kv-heads", "8", "--head-dim", "128"];
    let mut args = vec!["replay", "--trace", fs, "--capacity", "1GiB", "--json"];
    args.extend(shape);
    let v = run_json(&args);
    assert_eq!(u(&v, "kv_bytes_per_token"), 131_072);
    assert_eq!(v["kv_model"], "32 layers x 8 KV heads x head dim 128 x bf16");
    assert_eq!(u(&v, "capacity"), 8_192, "1 GiB / 128 KiB");
    assert_eq!(u(&v, "capacity_kv_bytes"), 1 << 30);
    assert_eq!(self::f(&v, "capacity_kv_gib"), 1.0);
    assert_eq!(u(&v, "cached_kv_bytes"), u(&v, "cached_tokens") * 131_072);
    assert_eq!(u(&v, "hit_kv_bytes"), u(&v, "hit_tokens") * 131_072);
    let gib = self::f(&v, "hit_kv_gib");
    assert!((gib - u(&v, "hit_kv_bytes") as f64 / (1u64 << 30) as f64).abs() < 1e-9);
    let ratio = self::f(&v, "index_kv_ratio");
    assert!((ratio - u(&v, "index_bytes") as f64 / u(&v, "cached_kv_bytes") as f64).abs() < 1e-12);
    // The same capacity in tokens, or the byte count given directly, replays the same.
    let t = run_json(&["replay", "--trace", fs, "--capacity", "8192", "--json"]);
    assert_eq!(u(&t, "hit_tokens"), u(&v, "hit_tokens"));
    let b = run_json(&[
        "replay",
        "--trace",
        fs,
        "--capacity",
        "1GiB",
        "--kv-bytes-per-token",
        "128KiB",
        "--json",
    ]);
    assert_eq!((u(&b, "capacity"), u(&b, "hit_tokens")), (8_192, u(&v, "hit_tokens")));
    assert!(b["kv_model"].is_null());
    // The dtype's size: fp8 halves it, fp32 doubles it.
    for (dtype, bpt) in [("fp8", 65_536u64), ("fp16", 131_072), ("fp32", 262_144)] {
        let mut args = vec!["replay", "--trace", fs, "--json", "--dtype", dtype];
        args.extend(shape);
        assert_eq!(u(&run_json(&args), "kv_bytes_per_token"), bpt, "{dtype}");
    }
    // Decimal units too (500 MB = 500,000,000 bytes, rounded down to whole tokens).
    let m = run_json(&[
        "replay",
        "--trace",
        fs,
        "--capacity",
        "500MB",
        "--kv-bytes-per-token",
        "1000",
        "--json",
    ]);
    assert_eq!(u(&m, "capacity"), 500_000);
    // The text report shows them.
    let mut args = vec!["replay", "--trace", fs, "--capacity", "1GiB"];
    args.extend(shape);
    let out = run(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("capacity 8,192 tokens (1 GiB)"), "{text}");
    assert!(text.contains("131,072 bytes per token (32 layers x 8 KV heads"), "{text}");
    assert!(
        text.contains("GiB of KV reused by hits") && text.contains("of the cached KV"),
        "{text}"
    );
    let _ = std::fs::remove_file(&f);
}

#[test]
fn bad_kv_sizes_are_clear_errors() {
    // Values the parser refuses: usage errors (status 2) saying what is wrong.
    for (args, says) in [
        (&["--kv-bytes-per-token", "0"][..], "at least 1 byte"),
        (&["--kv-bytes-per-token", "-5"], "not a byte count"),
        (&["--kv-bytes-per-token", "abc"], "not a byte count"),
        (&["--kv-bytes-per-token", "1.5"], "not a byte count"),
        (&["--kv-bytes-per-token", "2GiB"], "per token"),
        (&["--layers", "0", "--kv-heads", "8", "--head-dim", "128"], "at least 1"),
        (&["--layers", "x", "--kv-heads", "8", "--head-dim", "128"], "not a positive integer"),
        (&["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--dtype", "int4"], "int4"),
        // Parts of a shape go together, and not with a byte count.
        (&["--layers", "32"], "--kv-heads"),
        (&["--layers", "32", "--kv-heads", "8"], "--head-dim"),
        (&["--dtype", "fp8"], "--layers"),
        (
            &["--kv-bytes-per-token", "8", "--layers", "1", "--kv-heads", "1", "--head-dim", "1"],
            "cannot be used with",
        ),
        (&["--capacity", "0GiB"], "at least 1 byte"),
        (&["--capacity", "xGiB"], "not a byte count"),
    ] {
        for cmd in ["replay", "sweep"] {
            if args.contains(&"--capacity") && cmd == "sweep" {
                continue; // sweep takes --capacities (tested in sweep.rs)
            }
            let mut full = vec![cmd];
            full.extend(args);
            let out = run(&full);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{full:?}: {err}");
            assert!(err.contains(says) && !err.contains("panicked"), "{full:?}: {err}");
        }
    }
    // Errors found once the values are combined: status 1, before any replay.
    let err = run_fail(&["replay", "--capacity", "40GiB"]);
    assert!(err.contains("is in bytes") && err.contains("--kv-bytes-per-token"), "{err}");
    let err = run_fail(&["replay", "--capacity", "100KiB", "--kv-bytes-per-token", "1MiB"]);
    assert!(err.contains("less than one token"), "{err}");
    let err = run_fail(&["replay", "--capacity", "1TiB", "--kv-bytes-per-token", "1"]);
    assert!(err.contains("2^32"), "{err}");
    let err = run_fail(&[
        "replay",
        "--layers",
        "1048576",
        "--kv-heads",
        "1048576",
        "--head-dim",
        "1048576",
    ]);
    assert!(err.contains("bytes per token") && err.contains("1048576 layers"), "{err}");
}

/// `--trace -` reads the trace from standard input: the Mooncake trace piped in replays
/// exactly as the file does.
#[test]
fn trace_from_stdin() {
    let text = std::fs::read(MOONCAKE).expect("trace readable");
    let out = run_stdin(&["replay", "--trace", "-", "--json"], &text);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["trace"], "<stdin>");
    assert_eq!((u(&v, "requests"), u(&v, "hit_tokens")), (3_993, 39_852_661));
    // Errors name the source and the line; an empty input is an error too.
    let out = run_stdin(&["replay", "--trace", "-"], b"{\"tokens\": [1, 2]}\nnot json\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("<stdin>:2:"), "{err}");
    let out = run_stdin(&["replay", "--trace", "-"], b"");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("<stdin>: the trace holds no requests"), "{err}");
}

#[test]
fn the_report_counts_live_namespaces_and_emptied_ones_go() {
    // 200 requests of 8 tokens, each in a namespace of its own, then the same in namespace 0.
    let mut lines = String::new();
    for ns in 1..=200u64 {
        let toks: Vec<String> = (0..8).map(|i| (ns * 100 + i).to_string()).collect();
        lines += &format!("{{\"tokens\": [{}], \"namespace\": {ns}}}\n", toks.join(","));
    }
    let p = temp_file("namespaces.jsonl", &lines);
    let path = p.to_str().unwrap();
    // Unlimited: every namespace keeps its page.
    let j = run_json(&["replay", "--trace", path, "--json"]);
    assert_eq!(j["namespaces"], 200, "{j}");
    assert_eq!(j["cached_tokens"], 1600, "{j}");
    // Room for 10 requests: evicting a namespace's only leaf reclaims the namespace, so only
    // those still cached are counted.
    let j = run_json(&["replay", "--trace", path, "--capacity", "80", "--json"]);
    assert_eq!(j["cached_tokens"], 80, "{j}");
    assert_eq!(j["namespaces"], 10, "{j}");
}

/// `--compare-policies`: one replay per policy at one capacity, side by side; each run is
/// that policy's own replay, and the policies differ where eviction runs.
#[test]
fn compare_policies_replays_every_policy() {
    let v = run_json(&["replay", "--compare-policies", "--capacity", "50000", "--json"]);
    let runs = v["runs"].as_array().unwrap();
    let names: Vec<&str> = runs.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"]);
    for r in runs {
        let p = r["policy"].as_str().unwrap();
        let one = run_json(&["replay", "--capacity", "50000", "--policy", p, "--json"]);
        assert_eq!(u(r, "hit_tokens"), u(&one, "hit_tokens"), "{p}");
        assert_eq!(u(r, "evicted_tokens"), u(&one, "evicted_tokens"), "{p}");
        assert!(u(r, "evictions") > 0, "{p}: the capacity makes eviction run");
    }
    let hits: std::collections::BTreeSet<u64> = runs.iter().map(|r| u(r, "hit_tokens")).collect();
    assert!(hits.len() >= 3, "the policies should not all agree: {hits:?}");
    // A subset, as a table.
    let out =
        run(&["replay", "--compare-policies", "--policies", "lru,slru", "--capacity", "50000"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for s in ["policy comparison", "lru", "slru", "evict p99", "most hits"] {
        assert!(text.contains(s), "{s} missing in:\n{text}");
    }
    assert!(!text.contains("mru"), "only the policies asked for:\n{text}");
    // Without a capacity one is picked so that eviction happens.
    let out = run(&["replay", "--compare-policies", "--policies", "lru"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("auto: 1/8"));
}

/// Unknown policies and out-of-range thresholds are usage errors naming the valid choices.
#[test]
fn bad_policies_are_refused() {
    for (args, want) in [
        (vec!["--policy", "nope"], "expected one of lru, lfu, fifo, mru, filo, priority, slru"),
        (vec!["--policy", "LRU2"], "unknown eviction policy"),
        (vec!["--compare-policies", "--policies", "lru,"], "unknown eviction policy"),
        (vec!["--slru-threshold", "0"], "--slru-threshold"),
        (vec!["--policies", "lru"], "--compare-policies"),
    ] {
        let mut full = vec!["replay"];
        full.extend(args);
        let out = run(&full);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{full:?}: {err}");
        assert!(err.contains(want), "{full:?}: {err}");
    }
}

/// A trace's `priority` reaches the cache: under `--policy priority` the old high-priority
/// prompt survives the eviction that LRU makes of it.
#[test]
fn trace_priorities_steer_the_priority_policy() {
    let line = |t: std::ops::Range<u32>, p: i64| {
        let tokens: Vec<u32> = t.collect();
        format!(r#"{{"tokens": {tokens:?}, "priority": {p}}}"#)
    };
    let text = [line(1..101, 5), line(200..300, 0), line(400..500, 0), line(1..101, 5)].join("\n");
    let f = temp_file("radixkv-priorities.jsonl", &text);
    let fs = f.to_str().unwrap();
    let hits = |policy: &str| {
        let v =
            run_json(&["replay", "--trace", fs, "--capacity", "250", "--policy", policy, "--json"]);
        u(&v, "hit_tokens")
    };
    assert_eq!(hits("priority"), 100, "the priority-5 prompt stays");
    assert_eq!(hits("lru"), 0, "LRU evicts the oldest prompt, the priority-5 one");
    let bad = temp_file("radixkv-priorities-bad.jsonl", &line(1..3, 1 << 40));
    let err = run_fail(&["replay", "--trace", bad.to_str().unwrap()]);
    assert!(err.contains("priority") && err.contains("out of range"), "{err}");
    let _ = std::fs::remove_file(&f);
    let _ = std::fs::remove_file(&bad);
}
