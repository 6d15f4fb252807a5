//! The parent side: runs each measurement through `run` (a child process per contestant),
//! then builds the tables, the ratios against radixkv and the target checks.

use serde_json::Value;

use crate::report::Table;
use crate::trace::Branching;
use crate::util::*;
use crate::work::{EVICT_OP_TOKENS, Who};

pub type Run<'a> = &'a dyn Fn(&[&str]) -> Result<Value, String>;

/// Medians the targets are checked on, gathered while the tables are built.
#[derive(Default)]
pub struct Targets {
    /// Workload 1 medians, (radixkv, kv-index), by page (1, 16).
    pub replay: [(Option<f64>, Option<f64>); 2],
    /// Workload 2 medians at 1 and N threads, (radixkv, kv-index), by page.
    pub match1: [(Option<f64>, Option<f64>); 2],
    pub matchn: [(Option<f64>, Option<f64>); 2],
    /// The same medians for radixkv returning the slots as runs (`match_prefix_runs`):
    /// replay, match at 1 and at N threads, by page.
    pub replay_runs: [Option<f64>; 2],
    pub match1_runs: [Option<f64>; 2],
    pub matchn_runs: [Option<f64>; 2],
    pub spin_speedup: Option<f64>,
    /// Workload 2's memory floor (one read of every query token) at 1 and N threads.
    pub floor: Option<(f64, f64)>,
    /// Workload 1's floor: one read of every query token and one copy of every new token.
    pub replay_floor: Option<f64>,
    pub threads: usize,
    /// Workload 4a p99 per evict call: Cache, bare tree.
    pub p99_cache: Option<f64>,
    pub p99_cache_inline: Option<f64>,
    pub p99_cache_runs: Option<f64>,
    pub p99_tree: Option<f64>,
    /// Workload 4b: per-node cost at the largest size / at the smallest, and the sizes.
    pub leaf_growth: Option<(f64, usize, usize)>,
    /// Workload 6, radixkv: (live heap, own count) B/token by page.
    pub mem: [Option<(f64, f64)>; 2],
    /// Workload 1, SGLang's Python RadixCache measured in this run: (median, its version).
    pub sglang_replay: Option<(f64, String)>,
}

/// SGLang's row name: its version and torch's, from the Python side's result.
fn sglang_name(v: &Value) -> String {
    format!(
        "SGLang {} RadixCache (Python, torch {})",
        v["version"].as_str().unwrap_or("?"),
        v["torch"].as_str().unwrap_or("?")
    )
}

fn slot(page: usize) -> Option<usize> {
    match page {
        1 => Some(0),
        16 => Some(1),
        _ => None,
    }
}

impl Targets {
    /// "; target T = k× the memory floor F": how close a target time is to the least any
    /// exact index can take: workload 2's floor at 1 thread (`which` = 0) or N threads (1),
    /// or workload 1's replay floor (2).
    fn floor_note(&self, target: f64, which: usize) -> String {
        let (f, what) = match (which, self.floor, self.replay_floor) {
            (0, Some(f), _) => (f.0, "one read of every query token"),
            (1, Some(f), _) => (f.1, "one read of every query token"),
            (2, _, Some(f)) => (f, "one read of every query token, one copy of every new token"),
            _ => return String::new(),
        };
        format!(
            "; the target time {} is {:.2}× the memory floor {} ({what})",
            secs(target),
            target / f,
            secs(f)
        )
    }

    /// A target row "kv-index's time / `who`'s ≥ `times`", with the memory floor's note
    /// (`f`: 0 for one thread, 1 for N).
    fn vs_kv_index(
        &self,
        target: &str,
        who: &str,
        k: f64,
        r: f64,
        times: f64,
        f: usize,
    ) -> Vec<String> {
        let suffix = if who == "radixkv" { String::new() } else { format!(", {who}") };
        vec![
            format!("{target}{suffix}"),
            format!(
                "kv-index {} / {who} {} = {:.2}×{}",
                secs(k),
                secs(r),
                k / r,
                self.floor_note(k / times, f)
            ),
            verdict(k / r, times),
        ]
    }

    pub fn table(&self) -> Table {
        let mut t = Table::new(
            "Targets of the issue, checked on the medians above",
            &["target", "measured", "verdict"],
        );
        let x = |a: f64| format!("{a:.2}×");
        for (i, page) in [1, 16].into_iter().enumerate() {
            let (r, k) = self.replay[i];
            let target = format!("replay ≥ 3× faster than kv-index TokenTree (page {page})");
            for (who, r) in [("radixkv", r), ("radixkv (slots as runs)", self.replay_runs[i])] {
                if let (Some(r), Some(k)) = (r, k) {
                    t.row(self.vs_kv_index(&target, who, k, r, 3.0, 2));
                }
            }
        }
        // SGLang's Python RadixCache, measured in this run when `--sglang-python` is given;
        // otherwise compared with the reference figure, said to be from another run.
        const SGLANG_REPLAY: f64 = 0.66;
        match (self.replay[0].0, &self.sglang_replay) {
            (Some(r), Some((sg, version))) => t.row(vec![
                "replay ≥ 10× faster than SGLang's Python radix cache (page 1)".into(),
                format!(
                    "SGLang {version} {} (this run) / radixkv {} = {}",
                    secs(*sg),
                    secs(r),
                    x(sg / r)
                ),
                verdict(sg / r, 10.0),
            ]),
            (Some(r), None) => t.row(vec![
                "replay ≥ 10× faster than SGLang's Python radix cache (page 1)".into(),
                format!(
                    "SGLang 0.66 s (the issue's reference figure for this machine's kind, not \
                     this run: run with --sglang-python to measure it) / radixkv {} = {}",
                    secs(r),
                    x(SGLANG_REPLAY / r)
                ),
                format!("{} (against a reference figure)", verdict(SGLANG_REPLAY / r, 10.0)),
            ]),
            (None, _) => t.row(vec![
                "replay ≥ 10× faster than SGLang's Python radix cache".into(),
                "not run: radixkv's page-1 replay was not measured".into(),
                "not measured".into(),
            ]),
        }
        for (i, page) in [1, 16].into_iter().enumerate() {
            for (f, label, m, runs) in [
                (0, "1 thread", &self.match1[i], self.match1_runs[i]),
                (1, &*format!("{} threads", self.threads), &self.matchn[i], self.matchn_runs[i]),
            ] {
                let target = format!("match-only ≥ 2× kv-index (page {page}, {label})");
                for (who, r) in [("radixkv", m.0), ("radixkv (slots as runs)", runs)] {
                    if let (Some(r), Some(k)) = (r, m.1) {
                        t.row(self.vs_kv_index(&target, who, k, r, 2.0, f));
                    }
                }
            }
        }
        if let (Some(s), Some(r1), Some(rn)) =
            (self.spin_speedup, self.match1[0].0, self.matchn[0].0)
        {
            let n = self.threads as f64;
            let sp = r1 / rn;
            let floor = self.floor.map(|(a, b)| a / b);
            t.row(vec![
                format!("match scaling ≥ 0.9 × {} × one thread, where the spin loop scales", self.threads),
                format!(
                    "radixkv {sp:.2}× at {} threads (page 1); spin loop {s:.2}×{}",
                    self.threads,
                    floor.map_or(String::new(), |f| format!(
                        "; memory floor (one read of every query token) {f:.2}×"
                    ))
                ),
                if s >= 0.9 * n {
                    match floor {
                        // The cores scale but memory bandwidth does not: say so next to
                        // the verdict.
                        Some(f) if f < 0.9 * n => format!(
                            "{}; the machine's memory bandwidth does not scale to {n:.0} threads \
                             (the floor reached {f:.2}×), radixkv {:.0}% of the ideal {n:.0}×",
                            verdict(sp, 0.9 * n),
                            100.0 * sp / n
                        ),
                        _ => verdict(sp, 0.9 * n),
                    }
                } else {
                    format!(
                        "not assessable: the spin loop itself reached {s:.2}× of {n:.0}× (the vCPUs do not scale); \
                         radixkv reached {:.0}% of the spin loop's speedup",
                        100.0 * sp / s
                    )
                },
            ]);
        }
        if let Some(p) = self.p99_cache {
            t.row(vec![
                "evict p99 < 10 µs per call (Cache with a 2,000,000-slot pool, reclaim() between requests)".into(),
                secs(p),
                verdict(10e-6 / p, 1.0),
            ]);
        }
        if let Some(p) = self.p99_cache_runs {
            t.row(vec![
                "same, slots as runs end to end (match_and_lock_runs, alloc_runs, insert_runs)"
                    .into(),
                secs(p),
                verdict(10e-6 / p, 1.0),
            ]);
        }
        if let Some(p) = self.p99_cache_inline {
            t.row(vec![
                "same, without reclaim() (deferred frees run inside whichever call pins)".into(),
                secs(p),
                verdict(10e-6 / p, 1.0),
            ]);
        }
        if let Some(p) = self.p99_tree {
            t.row(vec![
                "evict p99 < 10 µs per call (bare tree, caller's slots, reclaim() between requests)".into(),
                secs(p),
                verdict(10e-6 / p, 1.0),
            ]);
        }
        if let Some((g, lo, hi)) = self.leaf_growth {
            t.row(vec![
                format!(
                    "per-leaf evict cost at {} leaves within 3× of {}",
                    commas(hi as u64),
                    commas(lo as u64)
                ),
                format!(
                    "{g:.2}× (log n alone would give {:.2}×)",
                    (hi as f64).ln() / (lo as f64).ln()
                ),
                verdict(3.0 / g, 1.0),
            ]);
        }
        for (i, (page, goal)) in [(1, 9.0), (16, 5.0)].into_iter().enumerate() {
            if let Some((heap, own)) = self.mem[i] {
                t.row(vec![
                    format!("memory ≤ {goal} B per cached token, slot included (page {page})"),
                    format!(
                        "{heap:.2} B live heap; {own:.2} B by radixkv's own count (reachable nodes)"
                    ),
                    format!(
                        "{} on the live heap; {} on the own count",
                        verdict(goal / heap, 1.0),
                        verdict(goal / own, 1.0)
                    ),
                ]);
            }
        }
        t.note(
            "\"missed by k×\": the figure must improve k-fold to meet the target; \"margin k×\": it could get k-fold \
             worse and still meet it.",
        );
        t
    }
}

fn verdict(factor: f64, need: f64) -> String {
    let f = factor / need;
    if f >= 1.0 { format!("met (margin {f:.2}×)") } else { format!("missed by {:.2}×", 1.0 / f) }
}

pub const MOONCAKE_REQUESTS: usize = 3993;
pub const MOONCAKE_TOKENS: u64 = 61_194_628;
pub const MOONCAKE_HITS_P1: u64 = 39_852_661;
pub const MOONCAKE_HITS_P16: u64 = 39_850_976;

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array().map(|a| a.iter().filter_map(|x| x.as_f64()).collect()).unwrap_or_default()
}

fn ratio(x: f64, reference: Option<f64>) -> String {
    match reference {
        Some(r) if r > 0.0 && x.is_finite() => format!("{:.2}×", x / r),
        _ => "-".into(),
    }
}

fn failed(t: &mut Table, name: String, gran: String, e: String) {
    let cols = t.header.len();
    let mut row =
        vec![name, gran, format!("failed: {}", e.lines().last().unwrap_or("").replace('|', "/"))];
    row.resize(cols, "-".into());
    t.row(row);
}

// ============================================================================ 1. replay

pub fn w1(
    run: Run,
    who: &[(Who, usize)],
    runs: usize,
    sglang: Option<&Result<Value, String>>,
    tg: &mut Targets,
) -> Table {
    let mut t = Table::new(
        "1. Mooncake replay, unlimited capacity: per request lookup, then store (1 thread)",
        &[
            "contestant",
            "granularity",
            "time, median [range]",
            "tokens/s",
            "hit tokens",
            "expected",
            "time × radixkv",
        ],
    );
    let mut reference: Vec<(usize, f64)> = Vec::new();
    // radixkv's hit tokens by page, which the C ABI contestant must equal.
    let mut rkv_hits: Vec<(usize, u64)> = Vec::new();
    for &(w, page) in who {
        let v = match run(&["w1", w.key(), &page.to_string()]) {
            Ok(v) => v,
            Err(e) => {
                failed(&mut t, w.name().into(), w.granularity(page), e);
                continue;
            }
        };
        let sm = summarize(&f64s(&v["times"]));
        let hits: Vec<u64> =
            v["hits"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        let h = hits[0];
        let same = hits.iter().all(|&x| x == h);
        if w == Who::Rkv {
            reference.push((page, sm.median));
            rkv_hits.push((page, h));
        }
        if let Some(i) = slot(page) {
            match w {
                Who::Rkv => tg.replay[i].0 = Some(sm.median),
                Who::RkvRuns => tg.replay_runs[i] = Some(sm.median),
                Who::KvIndex => tg.replay[i].1 = Some(sm.median),
                _ => {}
            }
        }
        let r = reference.iter().find(|(p, _)| *p == page).map(|x| x.1);
        let mut expect = match page {
            1 if h == MOONCAKE_HITS_P1 => "= 39,852,661 ✓".to_string(),
            1 => "≠ 39,852,661 ✗".into(),
            16 if h == MOONCAKE_HITS_P16 => "= 39,850,976 ✓".into(),
            16 => "≠ 39,850,976 ✗".into(),
            _ => "-".into(),
        };
        if w == Who::RkvC {
            // Through the C ABI the tree must find exactly what the Rust calls find.
            match rkv_hits.iter().find(|(p, _)| *p == page) {
                Some(&(_, rh)) if rh == h => expect.push_str("; = rkv's ✓"),
                Some(&(_, rh)) => expect.push_str(&format!("; ≠ rkv's {} ✗", commas(rh))),
                None => {}
            }
        }
        t.row(vec![
            w.name().into(),
            w.granularity(page),
            secs_range(&sm),
            rate(MOONCAKE_TOKENS as f64 / sm.median),
            format!("{}{}", commas(h), if same { "" } else { " (differs between runs!)" }),
            expect,
            ratio(sm.median, r),
        ]);
        eprintln!("  w1 {} p{page}: {}", w.key(), secs_range(&sm));
    }
    if who.iter().any(|&(_, p)| p == 1) {
        match run(&["w1-floor"]) {
            Ok(v) => {
                let sm = summarize(&f64s(&v["times"]));
                tg.replay_floor = Some(sm.median);
                let r = reference.iter().find(|(p, _)| *p == 1).map(|x| x.1);
                t.row(vec![
                    "memory floor: one read of every query token, one copy of every new token (no index)".into(),
                    "-".into(),
                    secs_range(&sm),
                    rate(MOONCAKE_TOKENS as f64 / sm.median),
                    "-".into(),
                    "-".into(),
                    ratio(sm.median, r),
                ]);
                eprintln!("  w1 floor: {}", secs_range(&sm));
            }
            Err(e) => failed(&mut t, "memory floor".into(), "-".into(), e),
        }
    }
    match sglang {
        Some(Ok(v)) => {
            let sm = summarize(&f64s(&v["replay"]));
            let hits: Vec<u64> =
                v["hits"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
            let h = hits[0];
            let r = reference.iter().find(|(p, _)| *p == 1).map(|x| x.1);
            tg.sglang_replay = Some((sm.median, v["version"].as_str().unwrap_or("?").into()));
            t.row(vec![
                sglang_name(v),
                "token (exact)".into(),
                secs_range(&sm),
                rate(MOONCAKE_TOKENS as f64 / sm.median),
                format!(
                    "{}{}",
                    commas(h),
                    if hits.iter().all(|&x| x == h) { "" } else { " (differs between runs!)" }
                ),
                if h == MOONCAKE_HITS_P1 {
                    "= 39,852,661 ✓".into()
                } else {
                    "≠ 39,852,661 ✗".into()
                },
                ratio(sm.median, r),
            ]);
            eprintln!("  w1 sglang: {}", secs_range(&sm));
        }
        Some(Err(e)) => {
            failed(&mut t, "SGLang RadixCache (Python)".into(), "token (exact)".into(), e.clone())
        }
        None => {}
    }
    t.note(format!(
        "{} requests, {} input tokens; {runs} timed runs each after one untimed warm-up, a fresh index \
         per run. `time × radixkv` = this row's median / radixkv's at the same granularity (above 1: radixkv is \
         faster). radixkv's rows pass one fresh slot per token (made before the timing); its lookup returns the \
         slots (copied out; through the C ABI, `rkv_match` writes them into the caller's buffer of `n_tokens` \
         slots and the store is `rkv_insert`, on a cache without a pool, with the hits checked equal to rkv's), \
         kv-index's and dynamo's return a count, the vLLM-style map returns the slots. \
         SGLang's RadixCache (`--sglang-python`; `sglang/replay.py`, built with `create_simulated(page_size=1)`) \
         runs `match_prefix` then `insert` with the request's fresh slots as an int64 tensor, made before the \
         timing; its match returns the matched length and the last node.",
        commas(MOONCAKE_REQUESTS as u64),
        commas(MOONCAKE_TOKENS)
    ));
    t.note("The memory floor row is the least any index that keeps the tokens it caches can take: read every \
            query token once and copy every token not cached yet (page 1: past the request's cached prefix in file \
            order) into memory kept to the end, with no lookup and no structure. The targets table measures the \
            replay targets against it (page 16 caches 1,685 tokens fewer than page 1, a negligible difference).");
    t.note("dynamo's trees hash the request into blocks (their `compute_block_hash_for_seq`, XXH3) on each lookup; \
            a store is the engine's stored event (parent = the last cached block's sequence hash, then the new \
            blocks). The concurrent tree applies events only on its own worker thread (`SyncIndexer::worker` over a \
            flume channel: its `apply_event` is private), so each store waits for the event's acknowledgement \
            before the next lookup.");
    t
}

// ============================================================================ 2. match-only

pub fn w2(
    run: Run,
    who: &[(Who, usize)],
    runs: usize,
    threads: usize,
    sglang: Option<&Result<Value, String>>,
    tg: &mut Targets,
) -> Table {
    tg.threads = threads;
    let mut t = Table::new(
        format!(
            "2. Match only over the full tree (Mooncake, every request cached): 1 thread and {threads} threads"
        ),
        &[
            "contestant",
            "granularity",
            "1 thread, median [range]",
            &format!("{threads} threads, median [range]"),
            "speedup",
            &format!("tokens/s at {threads}"),
            "× radixkv (1 thr)",
            &format!("× radixkv ({threads} thr)"),
        ],
    );
    let iters = 200_000_000u64;
    match run(&["w2-spin", &iters.to_string()]) {
        Ok(v) => {
            let (a, b) = (summarize(&f64s(&v["t1"])), summarize(&f64s(&v["tn"])));
            tg.spin_speedup = Some(threads as f64 * a.median / b.median);
            t.row(vec![
                "plain CPU spin loop (xorshift on a register)".into(),
                "-".into(),
                secs_range(&a),
                format!("{} ({threads}× the work)", secs_range(&b)),
                format!("{:.2}×", threads as f64 * a.median / b.median),
                "-".into(),
                "-".into(),
                "-".into(),
            ]);
        }
        Err(e) => failed(&mut t, "spin loop".into(), "-".into(), e),
    }
    match run(&["w2-floor"]) {
        Ok(v) => {
            let (a, b) = (summarize(&f64s(&v["t1"])), summarize(&f64s(&v["tn"])));
            tg.floor = Some((a.median, b.median));
            t.row(vec![
                "memory floor: one read of every query token (no index)".into(),
                "-".into(),
                secs_range(&a),
                secs_range(&b),
                format!("{:.2}×", a.median / b.median),
                rate(MOONCAKE_TOKENS as f64 / b.median),
                "-".into(),
                "-".into(),
            ]);
        }
        Err(e) => failed(&mut t, "memory floor".into(), "-".into(), e),
    }
    let mut reference: Vec<(usize, f64, f64)> = Vec::new();
    for &(w, page) in who {
        let v = match run(&["w2", w.key(), &page.to_string()]) {
            Ok(v) => v,
            Err(e) => {
                failed(&mut t, w.name().into(), w.granularity(page), e);
                continue;
            }
        };
        let a = summarize(&f64s(&v["t1"]));
        let local = v["tn"].is_null();
        let bn = summarize(&f64s(&v["tn"]));
        if w == Who::Rkv {
            reference.push((page, a.median, bn.median));
        }
        if let Some(i) = slot(page) {
            match w {
                Who::Rkv => (tg.match1[i].0, tg.matchn[i].0) = (Some(a.median), Some(bn.median)),
                Who::RkvRuns => {
                    (tg.match1_runs[i], tg.matchn_runs[i]) = (Some(a.median), Some(bn.median))
                }
                Who::KvIndex => {
                    (tg.match1[i].1, tg.matchn[i].1) = (Some(a.median), Some(bn.median))
                }
                _ => {}
            }
        }
        let r = reference.iter().find(|(p, _, _)| *p == page);
        t.row(vec![
            w.name().into(),
            w.granularity(page),
            secs_range(&a),
            if local { "not thread-safe (Rc<RefCell>)".into() } else { secs_range(&bn) },
            if local { "-".into() } else { format!("{:.2}×", a.median / bn.median) },
            if local { "-".into() } else { rate(MOONCAKE_TOKENS as f64 / bn.median) },
            ratio(a.median, r.map(|x| x.1)),
            if local { "-".into() } else { ratio(bn.median, r.map(|x| x.2)) },
        ]);
        eprintln!("  w2 {} p{page}: {} / {}", w.key(), secs_range(&a), secs_range(&bn));
    }
    match sglang {
        Some(Ok(v)) => {
            let a = summarize(&f64s(&v["match"]));
            let all_hit = v["match_hits"]
                .as_array()
                .unwrap()
                .iter()
                .all(|x| x.as_u64() == Some(MOONCAKE_TOKENS));
            let r = reference.iter().find(|(p, _, _)| *p == 1);
            t.row(vec![
                sglang_name(v),
                "token (exact)".into(),
                format!(
                    "{}{}",
                    secs_range(&a),
                    if all_hit { "" } else { " (not every token hit!)" }
                ),
                "one Python thread (GIL)".into(),
                "-".into(),
                "-".into(),
                ratio(a.median, r.map(|x| x.1)),
                "-".into(),
            ]);
            eprintln!("  w2 sglang: {}", secs_range(&a));
        }
        Some(Err(e)) => {
            failed(&mut t, "SGLang RadixCache (Python)".into(), "token (exact)".into(), e.clone())
        }
        None => {}
    }
    t.note(format!(
        "{runs} timed runs after one warm-up pass. The index is built by the replay of workload 1 first (untimed). \
         Requests are split across threads (request i to thread i mod {threads}) sharing one index by reference; \
         every run checks that every page of every request hits ({} tokens). The spin loop runs {iters} xorshift \
         rounds per thread; its speedup is {threads} × t1 / t{threads} (each thread does the full work), the \
         others' t1 / t{threads} (the same requests split). The memory floor sums every query token once (the \
         same split): no exact index can look the requests up in less, since it must read each query token \
         at least once.",
        commas(MOONCAKE_TOKENS)
    ));
    t
}

// ============================================================================ 3. branching

pub fn w3(run: Run, who: &[(Who, usize)], runs: usize, b: Branching) -> Table {
    let mut t = Table::new(
        "3. Branching (agent-style) workload: insert all, then match all (1 thread)",
        &[
            "contestant",
            "granularity",
            "insert, median [range]",
            "match, median [range]",
            "nodes",
            "RSS B/token",
            "live heap B/token",
            "insert × radixkv",
            "match × radixkv",
        ],
    );
    let mut reference: Vec<(usize, f64, f64)> = Vec::new();
    let mut facts = None;
    for &(w, page) in who {
        let v = match run(&["w3", w.key(), &page.to_string()]) {
            Ok(v) => v,
            Err(e) => {
                failed(&mut t, w.name().into(), w.granularity(page), e);
                continue;
            }
        };
        if w == Who::Rkv && page == 1 {
            facts = Some((
                v["requests"].as_u64().unwrap_or(0),
                v["tokens"].as_u64().unwrap_or(0),
                v["distinct"].as_u64(),
            ));
        }
        let m = run(&["mem", "branching", w.key(), &page.to_string()]).ok();
        let per = |k: &str| -> Option<f64> {
            let m = m.as_ref()?;
            Some(m[k].as_f64()? / m["cached"].as_f64()?)
        };
        let (a, bm) = (summarize(&f64s(&v["insert"])), summarize(&f64s(&v["match"])));
        if w == Who::Rkv {
            reference.push((page, a.median, bm.median));
        }
        let r = reference.iter().find(|(p, _, _)| *p == page);
        let heap = match (per("heap"), per("own_heap")) {
            (Some(h), Some(o)) => format!("{h:.2} (own count {o:.2})"),
            (Some(h), None) => format!("{h:.2}"),
            _ => "-".into(),
        };
        t.row(vec![
            w.name().into(),
            w.granularity(page),
            secs_range(&a),
            secs_range(&bm),
            m.as_ref().and_then(|m| m["nodes"].as_u64()).map(commas).unwrap_or_else(|| "-".into()),
            per("rss").map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into()),
            heap,
            ratio(a.median, r.map(|x| x.1)),
            ratio(bm.median, r.map(|x| x.2)),
        ]);
        eprintln!("  w3 {} p{page}: insert {} match {}", w.key(), secs_range(&a), secs_range(&bm));
    }
    if let Some((n, tokens, distinct)) = facts {
        t.note(format!(
            "{} requests, {} tokens matched per pass, {} distinct tokens cached.",
            commas(n),
            commas(tokens),
            distinct.map(commas).unwrap_or_else(|| "?".into())
        ));
    }
    t.note(format!(
        "Generator: {} tenants (one namespace each, its own {}-token system prompt) × {} requests, interleaved; each \
         request keeps a random number of {}-token steps of one of its tenant's 16 latest requests (or only the \
         system prompt, 1 in 8) and appends 1–4 new steps of fresh tokens, so forks fall every few dozen tokens. \
         Token ids are never shared across tenants, so the peers without namespaces see disjoint trees too.",
        b.tenants, b.system, b.per_tenant, b.step
    ));
    t.note(format!(
        "{runs} timed runs after one warm-up, a fresh index per run. Stores name their fork point (what an engine \
         knows), so dynamo's stored events carry the right parent; its concurrent tree's events are sent without \
         waiting for each, and the final flush is timed. Bytes per cached token come from a separate child process \
         (RSS delta over the build; live heap counted by a global allocator; radixkv's own `check_invariants().\
         heap_bytes`); radixkv and the vLLM-style map store a slot per token, the others none."
    ));
    t
}

// ============================================================================ 4. eviction

pub fn w4a(
    run: Run,
    runs: usize,
    sglang: Option<&Result<Value, String>>,
    tg: &mut Targets,
) -> Table {
    let mut t = Table::new(
        "4a. Eviction under a 2,000,000-token capacity (Mooncake, page 1): time per evict call",
        &[
            "contestant",
            "replay, median [range]",
            "hit tokens",
            "evicted tokens",
            "evict calls",
            "p50 per call [range]",
            "p99 per call [range]",
            "max (median)",
            "per evicted node",
            "per evicted token",
            "tokens asked per call, p50 / p99",
            "tokens freed per call, p50 / p99",
        ],
    );
    let contestants = [
        ("cache", "radixkv Cache (its slot pool), reclaim() between requests"),
        ("cache-inline", "radixkv Cache (its slot pool), no reclaim()"),
        (
            "cache-runs",
            "radixkv Cache (its slot pool), slots as runs end to end, reclaim() between requests",
        ),
        (
            "cache-c",
            "radixkv Cache through the C ABI (libradixkv.so: rkv_match_lock, rkv_evict, rkv_alloc, \
             rkv_insert, rkv_release, rkv_reclaim)",
        ),
        ("tree", "radixkv RadixTree (caller's free list of slot runs), reclaim() between requests"),
        ("tree-inline", "radixkv RadixTree (caller's free list of slot runs), no reclaim()"),
        ("kvi", "kv-index 2.0.0 TokenTree (evict_tenant_by_size)"),
    ];
    // SGLang's RadixCache (`--sglang-python`) comes last, its result already measured.
    let sglang_key = sglang.map(|r| match r {
        Ok(v) => ("sglang", sglang_name(v)),
        Err(_) => ("sglang", "SGLang RadixCache (Python)".to_string()),
    });
    let all = contestants.iter().map(|&(k, n)| (k, n.to_string())).chain(sglang_key);
    // The Cache's (hit, evicted) tokens, which its C ABI twin must equal.
    let mut cache_counts = None;
    for (key, name) in all {
        let got = match (key, sglang) {
            ("sglang", Some(r)) => r.clone(),
            _ => run(&["w4a", key]),
        };
        let v = match got {
            Ok(v) => v,
            Err(e) => {
                failed(&mut t, name, "-".into(), e);
                continue;
            }
        };
        let rs = v["runs"].as_array().unwrap();
        let col = |k: &str| summarize(&rs.iter().filter_map(|r| r[k].as_f64()).collect::<Vec<_>>());
        let first = &rs[0];
        let pn = col("per_node");
        match key {
            "cache" => tg.p99_cache = Some(col("p99").median),
            "cache-inline" => tg.p99_cache_inline = Some(col("p99").median),
            "cache-runs" => tg.p99_cache_runs = Some(col("p99").median),
            "tree" => tg.p99_tree = Some(col("p99").median),
            _ => {}
        }
        let (hits, evicted) =
            (first["hits"].as_u64().unwrap_or(0), first["evicted"].as_u64().unwrap_or(0));
        if key == "cache" {
            cache_counts = Some((hits, evicted));
        }
        let twin = match (key, cache_counts) {
            ("cache-c", Some(c)) if c == (hits, evicted) => " (= cache's ✓)",
            ("cache-c", Some(_)) => " (≠ cache's ✗)",
            _ => "",
        };
        t.row(vec![
            name,
            secs_range(&col("secs")),
            format!("{}{twin}", commas(hits)),
            commas(evicted),
            commas(first["calls"].as_u64().unwrap_or(0)),
            secs_range(&col("p50")),
            secs_range(&col("p99")),
            secs(col("max").median),
            if pn.n > 0 { secs_range(&pn) } else { "-".into() },
            secs_range(&col("per_token")),
            format!(
                "{} / {}",
                commas(col("asked50").median as u64),
                commas(col("asked99").median as u64)
            ),
            format!(
                "{} / {}",
                commas(col("freed50").median as u64),
                commas(col("freed99").median as u64)
            ),
        ]);
        eprintln!("  w4a {key}: p99 {}", secs_range(&col("p99")));
    }
    t.note(format!(
        "{runs} timed runs after one warm-up. radixkv Cache: per request match_and_lock, then `evict(short)` when \
         the pool has fewer free slots than the request needs (that call is timed; it returns every evicted slot to \
         the pool), alloc, insert, release. radixkv RadixTree: the same cycle on the bare tree, slots from the caller's \
         free list of slot runs, which `evict_runs` refills (one run per evicted run of slots). Slots as runs end \
         to end: `match_and_lock_runs`, `alloc_runs`, `insert_runs` instead of the slot-list calls. Through the C ABI \
         (`libradixkv.so` loaded at run time): the Cache's slot-list cycle call for call, `rkv_match_lock` into the \
         request's buffer, `rkv_evict(short, NULL)` (timed), `rkv_alloc` into the same buffer after the matched \
         slots, `rkv_insert`, `rkv_release`, `rkv_reclaim`; the pool's free slots and the node count come from \
         `rkv_cache_stats` (the ABI's only way to read them). kv-index: per request match, then `evict_tenant_by_size(cap - \
         new)` when the tree would exceed the capacity (timed), insert. Tokens asked: the call's `k` (the request's \
         shortfall; for kv-index, by how much the tree would exceed the capacity); freed: what the call removed \
         (radixkv frees whole leaves, so at least `k`). Percentiles are per run (nearest rank), then \
         median [range] across runs. `reclaim()` between requests (outside the timed evict calls, inside \
         the replay's time): the epoch's deferred frees of unlinked nodes and tables run there; without it they run \
         inside whichever call next pins the thread (every 128th), now and then an evict call. SGLang's RadixCache (`--sglang-python`, `sglang/replay.py evict`): per \
         request match_prefix, inc_lock_ref on its last node, `evict(short)` when a counting stand-in for its \
         token allocator has fewer free slots than the request needs (timed), insert, dec_lock_ref."
    ));
    t
}

pub fn w4b(run: Run, runs: usize, sizes: &[usize], kvi_max: usize, tg: &mut Targets) -> Table {
    let mut t = Table::new(
        "4b. Per-leaf eviction cost by tree size (page 1, 16-way branching, 8-token leaves): one call evicts half the leaves",
        &[
            "leaves",
            "contestant",
            "build (median)",
            "evict call, median [range]",
            "nodes evicted",
            "per evicted node, median [range]",
            "× the smallest tree",
            "log n ratio",
        ],
    );
    for (key, name, max) in
        [("rkv", "radixkv RadixTree", usize::MAX), ("kvi", "kv-index TokenTree", kvi_max)]
    {
        let mut base = None;
        for &n in sizes.iter().filter(|&&n| n <= max) {
            let v = match run(&["w4b", key, &n.to_string()]) {
                Ok(v) => v,
                Err(e) => {
                    failed(&mut t, commas(n as u64), name.into(), e);
                    continue;
                }
            };
            let p = summarize(&f64s(&v["per"]));
            if base.is_none() {
                base = Some((p.median, n));
            }
            let (b0, n0) = base.unwrap();
            if key == "rkv" && n > n0 {
                tg.leaf_growth = Some((p.median / b0, n0, n));
            }
            let nodes = v["nodes"].as_u64().unwrap_or(0);
            t.row(vec![
                commas(n as u64),
                name.into(),
                secs(summarize(&f64s(&v["build"])).median),
                secs_range(&summarize(&f64s(&v["calls"]))),
                if key == "kvi" { format!("~{}", commas(nodes)) } else { commas(nodes) },
                secs_range(&p),
                format!("{:.2}×", p.median / b0),
                format!("{:.2}", (n as f64).ln() / (n0 as f64).ln()),
            ]);
            eprintln!("  w4b {key} {n}: {}", secs_range(&p));
        }
    }
    t.note(format!(
        "{runs} timed runs per size after one warm-up, a fresh tree per run. One call evicts n/2 × 8 tokens (LRU: the \
         oldest half of the leaves, and parents left childless on the way). radixkv: per evicted node = call time / \
         nodes removed (counted); kv-index: call time / (n/2) (it cannot count nodes)."
    ));
    t
}

/// Workload 4c: 4a's radixkv Cache and bare-tree cycles under each eviction policy.
pub fn w4c(run: Run, runs: usize, policies: &[String]) -> Table {
    let mut t = Table::new(
        "4c. Eviction per policy under a 2,000,000-token capacity (Mooncake, page 1): time per evict call",
        &[
            "policy",
            "contestant",
            "hit tokens",
            "evicted tokens",
            "evict calls",
            "p50 per call [range]",
            "p99 per call [range]",
            "max (median)",
            "per evicted node",
        ],
    );
    for policy in policies {
        for (key, name) in [
            ("cache", "radixkv Cache (its slot pool), reclaim() between requests"),
            (
                "tree",
                "radixkv RadixTree (caller's free list of slot runs), reclaim() between requests",
            ),
        ] {
            let v = match run(&["w4a", key, policy]) {
                Ok(v) => v,
                Err(e) => {
                    failed(&mut t, policy.clone(), name.into(), e);
                    continue;
                }
            };
            let rs = v["runs"].as_array().unwrap();
            let col =
                |k: &str| summarize(&rs.iter().filter_map(|r| r[k].as_f64()).collect::<Vec<_>>());
            let first = &rs[0];
            t.row(vec![
                policy.clone(),
                name.into(),
                commas(first["hits"].as_u64().unwrap_or(0)),
                commas(first["evicted"].as_u64().unwrap_or(0)),
                commas(first["calls"].as_u64().unwrap_or(0)),
                secs_range(&col("p50")),
                secs_range(&col("p99")),
                secs(col("max").median),
                secs_range(&col("per_node")),
            ]);
            eprintln!(
                "  w4c {policy} {key}: p50 {} p99 {}",
                secs_range(&col("p50")),
                secs_range(&col("p99"))
            );
        }
    }
    t.note(format!(
        "{runs} timed runs after one warm-up; the cycles of 4a's `cache` and `tree` rows, each request \
         inserted with priority hash(index) mod 4 (only `priority` reads it; the trace has none). Keys: lru \
         last access, fifo creation, mru minus last access, filo minus creation, lfu (hits, last access), \
         slru (hits >= 2, last access), priority (priority, last access); see docs/eviction.md."
    ));
    t
}

/// Workload 4d: 4b's per-leaf cost under each eviction policy, with 4b's build (keys in
/// insertion order) and a mixed one (priorities, a quarter of the leaves inserted again).
pub fn w4d(run: Run, runs: usize, sizes: &[usize], policies: &[String]) -> Table {
    let mut t = Table::new(
        "4d. Per-leaf eviction cost per policy (page 1, 16-way branching, 8-token leaves): one call evicts half the leaves",
        &[
            "policy",
            "build",
            "leaves",
            "evict call, median [range]",
            "nodes evicted",
            "per evicted node, median [range]",
            "× the smallest tree",
        ],
    );
    for policy in policies {
        for build in ["ordered", "mixed"] {
            let mut base = None;
            for &n in sizes {
                let v = match run(&["w4b", "rkv", &n.to_string(), policy, build]) {
                    Ok(v) => v,
                    Err(e) => {
                        failed(&mut t, policy.clone(), build.into(), e);
                        continue;
                    }
                };
                let p = summarize(&f64s(&v["per"]));
                let b0 = *base.get_or_insert(p.median);
                t.row(vec![
                    policy.clone(),
                    build.into(),
                    commas(n as u64),
                    secs_range(&summarize(&f64s(&v["calls"]))),
                    commas(v["nodes"].as_u64().unwrap_or(0)),
                    secs_range(&p),
                    format!("{:.2}×", p.median / b0),
                ]);
                eprintln!("  w4d {policy} {build} {n}: {}", secs_range(&p));
            }
        }
    }
    t.note(format!(
        "{runs} timed runs per size after one warm-up, a fresh tree per run, as 4b. ordered: 4b's build \
         (leaves inserted once, in order: their keys come in order under every policy). mixed: each leaf \
         inserted with priority hash(i) mod 4, then a quarter of them inserted again (one more hit, a later \
         access), so that under priority, lfu and slru the keys are far from insertion order (the lazy \
         queue's heap, not its sorted run), and under lru and mru a quarter of the keys move."
    ));
    t
}

// ============================================================================ 5. mixed concurrent

pub fn w5(run: Run, runs: usize, threads: &[usize]) -> Table {
    let mut t = Table::new(
        "5. Mixed concurrent load: engine cycles (match_and_lock, alloc, insert, release) and 10% evict ops, 2,000,000 slots, page 1",
        &[
            "contestant",
            "threads",
            "time, median [range]",
            "requests/s",
            "tokens/s",
            "speedup vs 1 thread",
            "hit ratio, median [range]",
            "time × radixkv Cache",
        ],
    );
    let contestants = [
        ("cache", "radixkv Cache (lock-free tree + sharded pool)"),
        ("cache-runs", "radixkv Cache, slots as runs end to end"),
        ("cache-mutex", "Mutex<radixkv Cache>"),
        ("tree", "radixkv RadixTree + Mutex'd free list of slot runs"),
        ("kvi", "kv-index 2.0.0 TokenTree (no slots, no pins)"),
    ];
    let mut reference: Vec<(usize, f64)> = Vec::new();
    let mut requests = 0;
    for (key, name) in contestants {
        let mut one = None;
        for &n in threads {
            let v = match run(&["w5", key, &n.to_string()]) {
                Ok(v) => v,
                Err(e) => {
                    failed(&mut t, name.into(), n.to_string(), e);
                    continue;
                }
            };
            let rs = v["runs"].as_array().unwrap();
            let s = summarize(&rs.iter().filter_map(|r| r["secs"].as_f64()).collect::<Vec<_>>());
            let hr = summarize(
                &rs.iter()
                    .map(|r| {
                        r["hits"].as_f64().unwrap_or(0.0) / r["tokens"].as_f64().unwrap_or(1.0)
                    })
                    .collect::<Vec<_>>(),
            );
            let cycles = rs[0]["cycles"].as_f64().unwrap_or(0.0);
            let tokens = rs[0]["tokens"].as_f64().unwrap_or(0.0);
            requests = cycles as u64;
            if n == 1 {
                one = Some(s.median);
            }
            if key == "cache" {
                reference.push((n, s.median));
            }
            let r = reference.iter().find(|(k, _)| *k == n).map(|x| x.1);
            t.row(vec![
                name.into(),
                n.to_string(),
                secs_range(&s),
                rate(cycles / s.median),
                rate(tokens / s.median),
                one.map(|o| format!("{:.2}×", o / s.median)).unwrap_or_else(|| "-".into()),
                format!("{:.3} [{:.3}–{:.3}]", hr.median, hr.min, hr.max),
                ratio(s.median, r),
            ]);
            eprintln!("  w5 {key} x{n}: {}", secs_range(&s));
        }
    }
    t.note(format!(
        "{runs} timed runs per point after one warm-up. {} Mooncake requests, taken in trace order from one shared \
         counter by all threads; op j of one shared op counter is an explicit `evict({EVICT_OP_TOKENS})` when j mod \
         10 = 9, else the next request's cycle; the allocator also evicts when the pool is short. radixkv Cache: \
         match_and_lock_raw, alloc, insert, release; slots as runs end to end: match_and_lock_runs_raw, alloc_runs, \
         insert_runs, release. Mutex<Cache>: the same under one lock taken twice per request \
         (admit = match_and_lock + alloc; finish = insert + release). Bare tree: the same cycle with a Mutex'd \
         free list of slot runs that `evict_runs` refills (no per-slot state). kv-index: match, `evict_tenant_by_size` when over capacity, \
         insert (no slots, no pins). Hit ratios vary with the interleaving.",
        commas(requests)
    ));
    t
}

// ============================================================================ 6. memory

pub fn w6(run: Run, who: &[(Who, usize)], tg: &mut Targets) -> Table {
    let mut t = Table::new(
        "6. Memory per cached token after the Mooncake replay (unlimited capacity)",
        &[
            "contestant",
            "granularity",
            "holds per token",
            "cached tokens",
            "RSS delta, B/token",
            "live heap, B/token",
            "radixkv heap_bytes, B/token",
            "target (live heap / own count)",
        ],
    );
    for &(w, page) in who {
        let m = match run(&["mem", "mooncake", w.key(), &page.to_string()]) {
            Ok(v) => v,
            Err(e) => {
                failed(&mut t, w.name().into(), w.granularity(page), e);
                continue;
            }
        };
        let cached = m["cached"].as_f64().unwrap_or(f64::NAN);
        let per = |k: &str| m[k].as_f64().map(|x| x / cached);
        let heap = per("heap").unwrap_or(f64::NAN);
        let own = per("own_heap");
        let target = match (w, page, own) {
            (Who::Rkv, 1, Some(o)) => format!(
                "≤ 9: {} ({heap:.2}) / {} ({o:.2})",
                if heap <= 9.0 { "met" } else { "missed" },
                if o <= 9.0 { "met" } else { "missed" }
            ),
            (Who::Rkv, 16, Some(o)) => format!(
                "≤ 5: {} ({heap:.2}) / {} ({o:.2})",
                if heap <= 5.0 { "met" } else { "missed" },
                if o <= 5.0 { "met" } else { "missed" }
            ),
            _ => "-".into(),
        };
        let before = per("heap_before_flush").unwrap_or(f64::NAN);
        if let (Who::Rkv, Some(i), Some(o)) = (w, slot(page), own) {
            tg.mem[i] = Some((heap, o));
        }
        t.row(vec![
            w.name().into(),
            w.granularity(page),
            m["holds"].as_str().unwrap_or("?").into(),
            commas(cached as u64),
            per("rss").map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into()),
            if (before - heap).abs() > 0.005 {
                format!("{heap:.2} ({before:.2} before the epoch flush)")
            } else {
                format!("{heap:.2}")
            },
            own.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into()),
            target,
        ]);
        eprintln!("  w6 {} p{page}: heap {heap:.2} B/token", w.key());
    }
    t.note(
        "One child process per row: it loads the trace, then measures its resident set (/proc/self/statm) and its \
         live heap (a counting global allocator, requested bytes) before and after the replay that builds the index, \
         after flushing crossbeam-epoch's garbage. The slot (4 bytes per token) is part of radixkv's and the \
         vLLM-style map's figures; kv-index and dynamo store no slot (a router's index: a tenant set or block \
         hashes). `radixkv heap_bytes` is radixkv's own `check_invariants().heap_bytes` (reachable nodes, tables \
         and the eviction index).",
    );
    t
}
