//! `radixkv sweep` end to end: table, CSV and SVG.

#[path = "cli_common.rs"]
mod cli_common;

use cli_common::*;

fn csv_rows(dir: &std::path::Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("sweep.csv")).expect("sweep.csv written");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(
            "capacity,requests,input_tokens,hit_tokens,hit_ratio,evicted_tokens,skipped_requests,wall_s,tokens_per_s"
        )
    );
    lines.map(|l| l.split(',').map(str::to_string).collect()).collect()
}

#[test]
fn sweep_writes_csv_and_svg() {
    // Four conversations of growing prompts: a small capacity evicts, a large one does not.
    let mut lines = Vec::new();
    for turn in 1..=5u32 {
        for conv in 0..4u32 {
            let tokens: Vec<u32> = (0..turn * 20).map(|i| conv * 1000 + i).collect();
            lines.push(tokens_line(0, &tokens, 0));
        }
    }
    let f = temp_file("sweep.jsonl", &lines.join("\n"));
    let fs = f.to_str().unwrap();
    let dir = temp_path("sweep-out");
    let ds = dir.to_str().unwrap();
    let out = run(&["sweep", "--trace", fs, "--capacities", "150,2e2,1000,inf", "--out-dir", ds]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("unlimited") && table.contains("sweep.svg"), "{table}");

    let rows = csv_rows(&dir);
    let caps: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(caps, ["150", "200", "1000", "inf"]);
    let unlimited = run_json(&["replay", "--trace", fs, "--json"]);
    // The unlimited row and the 1000-token row (no eviction needed: 400 distinct tokens)
    // equal a plain replay.
    for row in &rows[2..] {
        assert_eq!(row[3].parse::<u64>().unwrap(), u(&unlimited, "hit_tokens"));
        assert_eq!(row[5], "0");
    }
    // Every row replays everything; small capacities evict and hit less.
    assert!(rows.iter().all(|r| r[1] == "20" && r[2] == u(&unlimited, "input_tokens").to_string()));
    let hits: Vec<u64> = rows.iter().map(|r| r[3].parse().unwrap()).collect();
    assert!(hits[0] < hits[3], "{hits:?}");
    assert!(rows[0][5].parse::<u64>().unwrap() > 0);
    // Each capacity equals its own replay.
    let v = run_json(&["replay", "--trace", fs, "--capacity", "150", "--json"]);
    assert_eq!(hits[0], u(&v, "hit_tokens"));

    let svg = std::fs::read_to_string(dir.join("sweep.svg")).expect("sweep.svg written");
    assert!(svg.contains("<svg") && svg.contains("</svg>"), "not an SVG");
    assert!(svg.contains("hit ratio") && svg.contains("unlimited capacity"), "labels missing");
    assert!(svg.contains("hit ratio (LRU eviction)"), "the legend names the policy");
    // The legend follows --policy.
    let out =
        run(&["sweep", "--trace", fs, "--capacities", "150", "--policy", "fifo", "--out-dir", ds]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let svg = std::fs::read_to_string(dir.join("sweep.svg")).expect("sweep.svg written");
    assert!(svg.contains("hit ratio (FIFO eviction)") && !svg.contains("LRU"), "legend");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&f);
}

#[test]
fn sweep_default_capacities_and_page_size() {
    let lines: Vec<String> =
        (0..30u32).map(|i| tokens_line(0, &(0..64 + i * 8).collect::<Vec<u32>>(), 0)).collect();
    let f = temp_file("sweep-default.jsonl", &lines.join("\n"));
    let dir = temp_path("sweep-default-out");
    let out = run(&[
        "sweep",
        "--trace",
        f.to_str().unwrap(),
        "--out-dir",
        dir.to_str().unwrap(),
        "--page-size",
        "4",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows = csv_rows(&dir);
    assert!(rows.len() >= 3, "{rows:?}");
    assert_eq!(rows.last().unwrap()[0], "inf");
    let caps: Vec<u64> = rows[..rows.len() - 1].iter().map(|r| r[0].parse().unwrap()).collect();
    assert!(caps.windows(2).all(|w| w[0] < w[1]) && caps.iter().all(|c| c % 4 == 0), "{caps:?}");
    assert!(dir.join("sweep.svg").exists());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&f);
}

#[test]
fn sweep_bad_input() {
    let err = run_fail(&[
        "sweep",
        "--trace",
        temp_path("nope.jsonl").to_str().unwrap(),
        "--out-dir",
        temp_path("x").to_str().unwrap(),
    ]);
    assert!(err.contains("cannot read"), "{err}");
    let out = run(&["sweep", "--capacities", "1e5,abc"]);
    assert_eq!(out.status.code(), Some(2));
    // An output directory that cannot be created.
    let f = temp_file("sweep-bad.jsonl", &tokens_line(0, &[1, 2, 3], 0));
    let err = run_fail(&[
        "sweep",
        "--trace",
        f.to_str().unwrap(),
        "--capacities",
        "4",
        "--out-dir",
        "/proc/radixkv/none",
    ]);
    assert!(err.contains("/proc/radixkv/none"), "{err}");
    // A capacity below one page is an error, not silently dropped from the sweep.
    let dir = temp_path("sweep-small-cap");
    let (fs, ds) = (f.to_str().unwrap(), dir.to_str().unwrap());
    let err = run_fail(&[
        "sweep",
        "--trace",
        fs,
        "--capacities",
        "2,8",
        "--page-size",
        "4",
        "--out-dir",
        ds,
    ]);
    assert!(err.contains("capacity 2 is smaller than one page (4 tokens)"), "{err}");
    assert!(!dir.exists(), "nothing written");
    let _ = std::fs::remove_file(&f);
}
