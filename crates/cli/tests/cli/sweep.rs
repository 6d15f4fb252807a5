//! `radixkv sweep` end to end: table, CSV and SVG.

use crate::common::*;

/// The CSV's columns: the first nine as they always were, then the index's memory; the KV
/// columns follow when a KV size is given.
const CSV_HEADER: &str = "capacity,requests,input_tokens,hit_tokens,hit_ratio,evicted_tokens,skipped_requests,wall_s,tokens_per_s,cached_tokens,index_bytes,index_bytes_per_token";
const CSV_KV: &str = ",kv_bytes_per_token,capacity_kv_bytes,capacity_kv_gib";

fn csv_rows(dir: &std::path::Path) -> Vec<Vec<String>> {
    csv_rows_with(dir, false)
}

fn csv_rows_with(dir: &std::path::Path, kv: bool) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("sweep.csv")).expect("sweep.csv written");
    let mut lines = text.lines();
    let header = format!("{CSV_HEADER}{},policy", if kv { CSV_KV } else { "" });
    assert_eq!(lines.next(), Some(header.as_str()));
    let rows: Vec<Vec<String>> =
        lines.map(|l| l.split(',').map(str::to_string).collect()).collect();
    assert!(rows.iter().all(|r| r.len() == header.split(',').count()), "{rows:?}");
    rows
}

/// Rows without the columns that measure time (wall_s, tokens_per_s) and the index's bytes
/// (index_bytes, index_bytes_per_token: the eviction queue's buffers grow a little
/// differently from run to run, as the access clock's readings fall); those are compared
/// within 1% instead.
fn timeless(rows: &[Vec<String>]) -> Vec<Vec<String>> {
    rows.iter()
        .map(|r| {
            r.iter()
                .enumerate()
                .filter(|(i, _)| ![7, 8, 10, 11].contains(i))
                .map(|(_, c)| c.clone())
                .collect()
        })
        .collect()
}

/// The index bytes of two sweeps' rows agree within 1%.
fn index_bytes_close(a: &[Vec<String>], b: &[Vec<String>]) {
    for (x, y) in a.iter().zip(b) {
        let (x, y): (f64, f64) = (x[10].parse().unwrap(), y[10].parse().unwrap());
        assert!((x - y).abs() <= 0.01 * x.max(y), "index bytes {x} and {y}");
    }
}

/// Four conversations of growing prompts (20 requests, 400 distinct tokens).
fn conversations_file(name: &str) -> std::path::PathBuf {
    let mut lines = Vec::new();
    for turn in 1..=5u32 {
        for conv in 0..4u32 {
            let tokens: Vec<u32> = (0..turn * 20).map(|i| conv * 1000 + i).collect();
            lines.push(tokens_line(0, &tokens, 0));
        }
    }
    temp_file(name, &lines.join("\n"))
}

/// The table's rows on stdout: the capacity cell and the hit tokens, in printed order.
fn table_rows(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("capacity"))
        .skip(1)
        .take_while(|l| !l.contains("wrote"))
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            (cells[0].to_string(), cells[2].to_string())
        })
        .collect()
}

#[test]
fn sweep_writes_csv_and_svg() {
    // Four conversations of growing prompts: a small capacity evicts, a large one does not.
    let f = conversations_file("sweep.jsonl");
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

/// Rows print as the capacities finish, in capacity order (the unlimited one last), and
/// the same rows come out whatever --jobs is.
#[test]
fn sweep_rows_in_order_and_the_same_across_jobs() {
    let f = small_trace();
    let fs = f.to_str().unwrap();
    let mut tables = Vec::new();
    let mut csvs = Vec::new();
    for jobs in ["1", "2", "3"] {
        let dir = temp_path("sweep-jobs");
        let ds = dir.to_str().unwrap();
        let caps = "3e4,1e3,1e4,3e3,inf";
        let out =
            run(&["sweep", "--trace", fs, "--capacities", caps, "--jobs", jobs, "--out-dir", ds]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(text.starts_with("radixkv sweep:"), "the header first: {text}");
        assert!(text.contains(&format!("{jobs} job")), "{text}");
        assert!(text.trim_end().lines().last().unwrap().contains("wrote"), "{text}");
        // Nothing on stderr: no progress bar where stderr is not a terminal.
        assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
        let rows = table_rows(&text);
        let caps: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(caps, ["1,000", "3,000", "10,000", "30,000", "unlimited"], "{text}");
        tables.push(rows);
        let csv = csv_rows(&dir);
        // The CSV has the table's rows, in the same order.
        let hits: Vec<String> =
            tables.last().unwrap().iter().map(|r| r.1.replace(',', "")).collect();
        assert_eq!(csv.iter().map(|r| r[3].clone()).collect::<Vec<_>>(), hits);
        csvs.push(csv);
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert_eq!(tables[0], tables[1]);
    assert_eq!(tables[0], tables[2]);
    assert_eq!(timeless(&csvs[0]), timeless(&csvs[1]), "--jobs 1 and --jobs 2: the same rows");
    assert_eq!(timeless(&csvs[0]), timeless(&csvs[2]));
    index_bytes_close(&csvs[0], &csvs[1]);
    index_bytes_close(&csvs[0], &csvs[2]);
    let _ = std::fs::remove_file(&f);
}

/// A row is on stdout while later capacities still replay: before the sweep ends and
/// sweep.csv is written. The sweep holds after each row while a file of the test's exists
/// (`RADIXKV_TEST_SWEEP_HOLD`), so "still running, no CSV yet" is looked at while the sweep
/// is certainly between rows, never raced against the clock; a sweep that printed its rows
/// only at the end would show its CSV (or no row) by then.
#[test]
fn sweep_rows_stream() {
    use std::io::{BufRead, Write};
    use std::process::{Command, Stdio};
    let dir = temp_path("sweep-stream");
    std::fs::create_dir_all(&dir).unwrap();
    let hold = dir.join("hold");
    std::fs::write(&hold, b"").unwrap();
    let out_dir = dir.join("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_radixkv"))
        .args(["sweep", "--trace", "-", "--jobs", "1", "--out-dir", out_dir.to_str().unwrap()])
        .args(["--capacities", "2e5,4e5,8e5"])
        .env("RADIXKV_TEST_SWEEP_HOLD", &hold)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("radixkv runs");
    let text = std::fs::read(MOONCAKE).expect("trace readable");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        stdin.write_all(&text).expect("trace piped in");
    });
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let first_row = loop {
        let l = lines.next().expect("a row before the end").expect("stdout readable");
        seen.push(l.clone());
        if l.trim_start().starts_with("200,000") {
            break l;
        }
    };
    // The sweep is holding after that row (until `hold` goes): it cannot have finished.
    let csv_then = out_dir.join("sweep.csv").exists();
    let running_then = child.try_wait().expect("child status").is_none();
    std::fs::remove_file(&hold).unwrap();
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    writer.join().unwrap();
    assert!(child.wait().unwrap().success());
    assert!(running_then, "the sweep ended before its hold was let go: {first_row}");
    assert!(!csv_then, "sweep.csv was written before the first row: {first_row}");
    assert!(seen[0].starts_with("radixkv sweep: <stdin> (3,993 requests"), "{seen:?}");
    assert_eq!(rest.len(), 4, "two more rows, the unlimited one, and 'wrote': {rest:?}");
    assert!(rest[2].trim_start().starts_with("unlimited") && rest[3].contains("wrote"));
    assert!(out_dir.join("sweep.csv").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The default capacities go up to about 1.5x the trace's distinct tokens (what an
/// unlimited cache holds at the end), not its total tokens.
#[test]
fn sweep_default_top_is_one_and_a_half_distinct() {
    let f = conversations_file("sweep-top.jsonl");
    let fs = f.to_str().unwrap();
    let unlimited = run_json(&["replay", "--trace", fs, "--json"]);
    let distinct = u(&unlimited, "cached_tokens");
    assert_eq!(distinct, 400);
    let dir = temp_path("sweep-top-out");
    let out = run(&["sweep", "--trace", fs, "--out-dir", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows = csv_rows(&dir);
    let caps: Vec<u64> = rows[..rows.len() - 1].iter().map(|r| r[0].parse().unwrap()).collect();
    let top = *caps.last().unwrap() as f64;
    assert!((top / distinct as f64 - 1.5).abs() < 0.05, "top {top} for {distinct} distinct");
    assert!(caps.len() >= 3 && caps.windows(2).all(|w| w[0] < w[1]), "{caps:?}");
    // The unlimited row holds the distinct tokens; so does every capacity above them.
    assert_eq!(rows.last().unwrap()[9], distinct.to_string());
    for r in &rows[..rows.len() - 1] {
        if r[0].parse::<u64>().unwrap() >= distinct {
            assert_eq!((r[3].as_str(), r[5].as_str()), (rows.last().unwrap()[3].as_str(), "0"));
        }
    }
    // The Mooncake trace: 21,341,967 distinct tokens, the top 32M (its total is 61M).
    let dir2 = temp_path("sweep-top-mooncake");
    let out = run(&["sweep", "--trace", MOONCAKE, "--out-dir", dir2.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows = csv_rows(&dir2);
    assert_eq!(rows.last().unwrap()[9], "21341967");
    assert_eq!(rows[rows.len() - 2][0], "32000000");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
    let _ = std::fs::remove_file(&f);
}

/// With a KV size, capacities may be bytes; the table, CSV and plot show GiB.
#[test]
fn sweep_in_bytes() {
    let f = conversations_file("sweep-bytes.jsonl");
    let fs = f.to_str().unwrap();
    let dir = temp_path("sweep-bytes-out");
    let ds = dir.to_str().unwrap();
    let out = run(&[
        "sweep",
        "--trace",
        fs,
        "--kv-bytes-per-token",
        "1MiB",
        "--capacities",
        "150MiB,1GiB,200",
        "--out-dir",
        ds,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("KV size 1,048,576 bytes per token") && text.contains("GiB"), "{text}");
    let rows = csv_rows_with(&dir, true);
    let caps: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(caps, ["150", "200", "1024", "inf"]);
    assert_eq!(rows[2][13], (1u64 << 30).to_string());
    assert_eq!(rows[2][14], "1.000000");
    assert_eq!((rows[3][12].as_str(), rows[3][13].as_str()), ("1048576", ""));
    let svg = std::fs::read_to_string(dir.join("sweep.svg")).expect("sweep.svg written");
    assert!(svg.contains("GiB at 1,048,576 bytes per token"), "the top axis in GiB");
    // Bytes without a KV size: an error before any work.
    let err = run_fail(&["sweep", "--trace", fs, "--capacities", "1GiB", "--out-dir", ds]);
    assert!(err.contains("is in bytes") && err.contains("--kv-bytes-per-token"), "{err}");
    let out = run(&["sweep", "--trace", fs, "--capacities", "1e3,0GiB", "--out-dir", ds]);
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&f);
}

/// `--trace -`: the sweep reads its trace from standard input.
#[test]
fn sweep_trace_from_stdin() {
    let f = conversations_file("sweep-stdin.jsonl");
    let (a, b) = (temp_path("sweep-file"), temp_path("sweep-stdin"));
    let args = |t: &str, d: &std::path::Path| {
        ["sweep", "--trace", t, "--capacities", "150,1000", "--out-dir", d.to_str().unwrap()]
            .map(String::from)
    };
    let from_file = run(&args(f.to_str().unwrap(), &a).each_ref().map(|s| s.as_str()));
    assert!(from_file.status.success());
    let text = std::fs::read(&f).unwrap();
    let from_stdin = run_stdin(&args("-", &b).each_ref().map(|s| s.as_str()), &text);
    assert!(from_stdin.status.success(), "{}", String::from_utf8_lossy(&from_stdin.stderr));
    assert!(String::from_utf8_lossy(&from_stdin.stdout).contains("radixkv sweep: <stdin>"));
    assert_eq!(timeless(&csv_rows(&a)), timeless(&csv_rows(&b)));
    index_bytes_close(&csv_rows(&a), &csv_rows(&b));
    let _ = std::fs::remove_dir_all(&a);
    let _ = std::fs::remove_dir_all(&b);
    let _ = std::fs::remove_file(&f);
}

/// The synthetic workload as a tokens file (a few hundred requests, some sharing).
fn small_trace() -> std::path::PathBuf {
    use radixkv_trace::synthetic::{SyntheticConfig, generate};
    let t = generate(&SyntheticConfig {
        seed: 5,
        conversations: 30,
        fewshot_requests: 40,
        agent_contexts: 4,
    });
    let text: Vec<String> =
        t.iter().map(|r| tokens_line(r.namespace, &r.tokens, r.output_length)).collect();
    temp_file("sweep-synthetic.jsonl", &text.join("\n"))
}

/// `--policies`: one sweep per policy at the same capacities, a policy column in the CSV,
/// one curve per policy in the SVG (and the PNG with `--png`); each row is that policy's
/// own replay.
#[test]
fn sweep_policies_draw_one_curve_each() {
    let f = conversations_file("radixkv-sweep-policies.jsonl");
    let fs = f.to_str().unwrap();
    let dir = temp_path("radixkv-sweep-policies");
    let ds = dir.to_str().unwrap();
    let out = run(&[
        "sweep",
        "--trace",
        fs,
        "--capacities",
        "150,300",
        "--policies",
        "lru,mru,priority",
        "--png",
        "--out-dir",
        ds,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for p in ["policy lru", "policy mru", "policy priority", "sweep.png"] {
        assert!(text.contains(p), "{p} missing in:\n{text}");
    }
    let rows = csv_rows(&dir);
    assert_eq!(rows.len(), 9, "3 rows (2 capacities and inf) per policy: {rows:?}");
    let policy_col = rows[0].len() - 1;
    for (i, p) in ["lru", "mru", "priority"].iter().enumerate() {
        let mine: Vec<&Vec<String>> = rows[i * 3..i * 3 + 3].iter().collect();
        assert!(mine.iter().all(|r| r[policy_col] == *p), "{mine:?}");
        assert_eq!(mine.iter().map(|r| r[0].as_str()).collect::<Vec<_>>(), ["150", "300", "inf"]);
        // Each row is that policy's own replay at that capacity.
        let v = run_json(&["replay", "--trace", fs, "--capacity", "150", "--policy", p, "--json"]);
        assert_eq!(mine[0][3], u(&v, "hit_tokens").to_string(), "{p}");
    }
    // The policies differ where eviction runs (mru keeps the old turns, lru the new ones),
    // and agree at unlimited capacity.
    assert_ne!(rows[0][3], rows[3][3], "lru and mru at 150 tokens");
    assert_eq!(rows[2][3], rows[5][3]);
    let svg = std::fs::read_to_string(dir.join("sweep.svg")).expect("sweep.svg written");
    for l in
        ["hit ratio (LRU eviction)", "hit ratio (MRU eviction)", "hit ratio (PRIORITY eviction)"]
    {
        assert!(svg.contains(l), "legend {l} missing");
    }
    let png = std::fs::read(dir.join("sweep.png")).expect("sweep.png written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000, "not a drawn PNG");
    // Bad lists are usage errors that name the choices.
    for (args, want) in [
        (
            vec!["--policies", "lru,nope"],
            "expected one of lru, lfu, fifo, mru, filo, priority, slru",
        ),
        (vec!["--policies", "lru,lru"], "given twice"),
        (vec!["--policies", "lru", "--policy", "fifo"], "cannot be used with"),
    ] {
        let mut full = vec!["sweep", "--trace", fs, "--out-dir", ds];
        full.extend(args);
        let out = run(&full);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{full:?}: {err}");
        assert!(err.contains(want), "{full:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&f);
}
