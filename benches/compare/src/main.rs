//! radixkv side by side with its peers. One command runs it all and prints markdown tables:
//!
//! ```text
//! cargo run --release -p radixkv-compare -- [--runs 5] [--only 1,2,3,4,5,6] [--out FILE]
//! ```
//!
//! Workloads: (1) Mooncake replay, (2) match only at 1 and N threads with a CPU spin loop for
//! the machine's own scaling, (3) a branching agent-style workload with 10^5+ nodes,
//! (4) eviction under a 2,000,000-token capacity and per-leaf eviction cost by tree size (and
//! both again per eviction policy: 4c, 4d),
//! (5) a mixed concurrent engine load, (6) memory per cached token. Every measurement runs in
//! a child process of its own (the same binary, `--measure ...`). See BENCHMARKS.md.

mod cabi;
mod measure;
mod peers;
mod report;
mod tables;
mod trace;
mod util;
mod work;

use std::process::Command;

use report::Report;
use trace::Branching;
use util::*;
use work::Who;

#[global_allocator]
static ALLOC: Counting = Counting;

struct Opts {
    runs: usize,
    only: Vec<u32>,
    threads: usize,
    trace: String,
    out: Option<String>,
    branching: Branching,
    mix_threads: Vec<usize>,
    mix_requests: usize,
    leaf_sizes: Vec<usize>,
    kvi_leaf_max: usize,
    /// Only these contestants (key, or key:page).
    who: Vec<String>,
    /// Leave glibc's trimming on (each run then also pays the kernel's page faults).
    cold_heap: bool,
    /// Hand the requests their slots in a random order (not in runs).
    scatter_slots: bool,
    /// Also run dynamo's trees with 1-token blocks in workloads 1, 2 and 6 (slow, big).
    dynamo_page1: bool,
    /// A Python interpreter with `sglang` and `torch`: SGLang's own RadixCache joins workloads
    /// 1 and 2 (`sglang/replay.py`).
    sglang_python: Option<String>,
    /// `libradixkv.so` for the C ABI contestants (`--lib`; else `$RADIXKV_COMPARE_LIB`, else
    /// next to this binary).
    lib: Option<String>,
    /// The eviction policies of workloads 4c and 4d (`--policies`; default all).
    policies: Vec<String>,
    /// The child side: one measurement.
    measure: Vec<String>,
}

fn default_trace() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces/mooncake_synthetic_trace.jsonl")
        .into()
}

/// The usage text (`--help`).
const USAGE: &str = "\
radixkv-compare: radixkv against kv-index, dynamo-kv-router, locked trees and a vLLM-style map

cargo run --release -p radixkv-compare -- [options]

  --runs N           timed runs per figure, after one warm-up (default 5; medians with ranges)
  --only LIST        workloads to run, e.g. 1,2,6 (default: all of 1..6)
  --threads N        threads for the match-only workload (default: all CPUs, at least 2)
  --trace FILE       Mooncake trace (default: shared/traces/mooncake_synthetic_trace.jsonl)
  --out FILE         also write the tables (markdown) to FILE
  --quick            1 run, smaller workloads (a smoke test, about 30 s)
  --who LIST         only these contestants in workloads 1, 2, 3 and 6: rkv, rkv-runs, rkv-c (1 and 2 only),
                     rkv-mutex, rkv-rwlock, kv-index, dynamo-rt, dynamo-crtc, vllm-map, each optionally :PAGE
                     (e.g. rkv:16)
  --lib PATH         libradixkv.so for rkv-c (radixkv through its C ABI, loaded at run time) and workload
                     4a's cache-c (default: $RADIXKV_COMPARE_LIB, else libradixkv.so next to this binary;
                     build it with `cargo build --release -p radixkv-ffi` at the repository root)
  --no-dynamo-page1  skip dynamo's trees with 1-token blocks (workloads 1, 2, 6; about a minute)
  --cold-heap        keep glibc's heap trimming: every run then also pays fresh page faults
  --scatter-slots    give the requests their slots as whole pages in a random order (single slots at
                     page 1) instead of fresh runs
  --tenants N, --per-tenant N   size of the branching workload (default 1000 x 200)
  --mix-requests N   Mooncake requests in the mixed load (default: all)
  --mix-threads LIST thread counts of the mixed load, e.g. 1,2,4,8,16 (default: 1, 2, 4, ... up to
                     the CPUs, at least 4; then the CPU count itself if it is no power of two)
  --policies LIST    eviction policies of workloads 4c and 4d (4a and 4b per policy), e.g. lru,mru, or
                     none (default: all of lru, lfu, fifo, mru, filo, priority, slru)
  --sglang-python PY also run SGLang's Python RadixCache (sglang/replay.py) in workloads 1, 2 and 4a,
                     with the interpreter PY, which must have sglang and torch installed";

fn usage() -> ! {
    eprintln!("{USAGE}");
    std::process::exit(2)
}

/// The mixed load's default thread counts: powers of two up to the CPU count (at least up
/// to 4, so a 2-CPU machine still shows oversubscription), then the CPU count itself.
fn mix_threads_for(nproc: usize) -> Vec<usize> {
    let top = nproc.max(4);
    let mut v: Vec<usize> =
        std::iter::successors(Some(1usize), |&t| Some(t * 2)).take_while(|&t| t <= top).collect();
    if !v.contains(&top) {
        v.push(top);
    }
    v
}

fn parse() -> Opts {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nproc = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut o = Opts {
        runs: 5,
        only: (1..=6).collect(),
        threads: nproc.max(2),
        trace: default_trace(),
        out: None,
        branching: Branching::default(),
        mix_threads: mix_threads_for(nproc),
        mix_requests: usize::MAX,
        leaf_sizes: vec![1_000, 10_000, 100_000, 1_000_000],
        kvi_leaf_max: 1_000_000,
        who: Vec::new(),
        cold_heap: false,
        scatter_slots: false,
        dynamo_page1: true,
        sglang_python: None,
        lib: None,
        policies: radixkv::EvictionPolicy::ALL.iter().map(|p| p.to_string()).collect(),
        measure: Vec::new(),
    };
    let mut quick = false;
    let mut i = 0;
    let num = |i: &mut usize| -> usize {
        *i += 1;
        args.get(*i).and_then(|s| s.parse().ok()).unwrap_or_else(|| usage())
    };
    while i < args.len() {
        match args[i].as_str() {
            "--runs" => o.runs = num(&mut i),
            "--threads" => o.threads = num(&mut i),
            "--tenants" => o.branching.tenants = num(&mut i),
            "--per-tenant" => o.branching.per_tenant = num(&mut i),
            "--mix-requests" => o.mix_requests = num(&mut i),
            "--only" | "--mix-threads" | "--trace" | "--out" | "--who" | "--sglang-python"
            | "--lib" | "--policies" => {
                let k = args[i].clone();
                i += 1;
                let v = args.get(i).cloned().unwrap_or_else(|| usage());
                match k.as_str() {
                    "--only" => {
                        o.only = v
                            .split(',')
                            .map(|x| x.trim().parse().unwrap_or_else(|_| usage()))
                            .collect()
                    }
                    "--mix-threads" => {
                        o.mix_threads = v
                            .split(',')
                            .map(|x| {
                                x.trim().parse().ok().filter(|&t| t > 0).unwrap_or_else(|| usage())
                            })
                            .collect()
                    }
                    "--trace" => o.trace = v,
                    "--out" => o.out = Some(v),
                    "--sglang-python" => o.sglang_python = Some(v),
                    "--lib" => o.lib = Some(v),
                    "--policies" => {
                        o.policies = if v == "none" {
                            Vec::new()
                        } else {
                            v.split(',')
                                .map(|x| {
                                    let p: radixkv::EvictionPolicy =
                                        x.trim().parse().unwrap_or_else(|e| {
                                            eprintln!("--policies: {e}");
                                            usage()
                                        });
                                    p.to_string()
                                })
                                .collect()
                        }
                    }
                    _ => o.who = v.split(',').map(|x| x.trim().to_string()).collect(),
                }
            }
            "--quick" => quick = true,
            "--cold-heap" => o.cold_heap = true,
            "--scatter-slots" => o.scatter_slots = true,
            "--no-dynamo-page1" => o.dynamo_page1 = false,
            "--measure" => {
                o.measure = args[i + 1..].to_vec();
                break;
            }
            _ => usage(),
        }
        i += 1;
    }
    if quick {
        o.runs = 1;
        o.branching.tenants = 100;
        o.leaf_sizes = vec![1_000, 10_000, 100_000];
        o.kvi_leaf_max = 10_000;
        o.mix_requests = 400;
        o.dynamo_page1 = false;
    }
    o
}

impl Opts {
    fn pick(&self, all: &[(Who, usize)]) -> Vec<(Who, usize)> {
        all.iter()
            .copied()
            .filter(|(w, p)| {
                self.who.is_empty()
                    || self.who.iter().any(|s| s == w.key() || *s == format!("{}:{p}", w.key()))
            })
            .collect()
    }

    /// Runs one measurement in a child process (this binary, `--measure SPEC`).
    fn run(&self, spec: &[&str]) -> Result<serde_json::Value, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(exe);
        cmd.args(["--runs", &self.runs.to_string()])
            .args(["--threads", &self.threads.to_string()])
            .args(["--trace", &self.trace])
            .args(["--tenants", &self.branching.tenants.to_string()])
            .args(["--per-tenant", &self.branching.per_tenant.to_string()]);
        if self.mix_requests != usize::MAX {
            cmd.args(["--mix-requests", &self.mix_requests.to_string()]);
        }
        if self.cold_heap {
            cmd.arg("--cold-heap");
        }
        if self.scatter_slots {
            cmd.arg("--scatter-slots");
        }
        if let Some(lib) = &self.lib {
            cmd.args(["--lib", lib]);
        }
        cmd.arg("--measure").args(spec);
        let out = cmd.output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        match text.lines().find_map(|l| l.strip_prefix("RESULT ")) {
            Some(line) => serde_json::from_str(line).map_err(|e| e.to_string()),
            None => Err(format!(
                "`{}` exited with {}: {}",
                spec.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )),
        }
    }
}

/// Runs `sglang/replay.py` with the interpreter `py`: SGLang's Python RadixCache on the
/// Mooncake replay and match-only workloads (its `RESULT` JSON, or why it failed).
/// `extra` selects another workload (`evict CAPACITY`: workload 4a).
pub fn sglang_run(
    py: &str,
    trace: &str,
    runs: usize,
    extra: &[&str],
) -> Result<serde_json::Value, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sglang/replay.py");
    eprintln!("  sglang: {py} {script} {}", extra.join(" "));
    let out = Command::new(py)
        .args([script, trace, &runs.to_string()])
        .args(extra)
        .output()
        .map_err(|e| format!("cannot run {py}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.lines().find_map(|l| l.strip_prefix("RESULT ")) {
        Some(line) => serde_json::from_str(line).map_err(|e| e.to_string()),
        None => Err(format!(
            "{py} {script} exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("").trim()
        )),
    }
}

unsafe extern "C" {
    fn mallopt(param: i32, value: i32) -> i32;
}

/// Keeps freed heap memory in the process (glibc: no trimming, no mmap below 32 MiB), so a
/// run reuses the pages the previous run freed instead of faulting fresh zeroed ones in: the
/// figures then measure the index's own work, as in a long-running engine.
fn warm_heap() {
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_THRESHOLD: i32 = -3;
    // SAFETY: glibc's mallopt, called once before any other thread exists.
    unsafe {
        mallopt(M_TRIM_THRESHOLD, i32::MAX);
        mallopt(M_MMAP_THRESHOLD, 32 << 20); // glibc's maximum
    }
}

fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let nproc = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem_kb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().next().and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    format!("nproc {nproc}, CPU \"{cpu}\", {:.0} GiB RAM", mem_kb as f64 / 1048576.0)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() {
    let o = parse();
    if let Some(lib) = &o.lib {
        cabi::set_path(lib.clone());
    }
    if !o.cold_heap {
        warm_heap();
    }
    if !o.measure.is_empty() {
        let ctx = measure::Ctx {
            runs: o.runs,
            threads: o.threads,
            trace: o.trace.clone(),
            branching: o.branching,
            mix_requests: o.mix_requests,
            scatter_slots: o.scatter_slots,
        };
        let v = measure::measure(&ctx, &o.measure);
        println!("RESULT {v}");
        return;
    }
    let mut rep = Report::default();
    let git = sh("git", &["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short", "HEAD"]);
    rep.line(format!(
        "radixkv-compare: `cargo run --release -p radixkv-compare -- {}`",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    ));
    rep.line(format!(
        "machine: {}; date {}; commit {}{}; {}",
        machine(),
        sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        if git.is_empty() { "?".into() } else { git },
        if sh(
            "git",
            &["-C", env!("CARGO_MANIFEST_DIR"), "status", "--porcelain", "--", "../../src"]
        )
        .is_empty()
        {
            ""
        } else {
            " (src/ modified)"
        },
        sh("rustc", &["--version"])
    ));
    rep.line(format!("C ABI contestants (rkv-c, cache-c) load {}", cabi::describe()));
    rep.line(format!(
        "{} timed runs per figure after a warm-up, each contestant in a child process of its own; heap: {}; \
         slots: {}; load average at start: {}\n",
        o.runs,
        if o.cold_heap { "glibc defaults (runs fault fresh pages in)" } else { "kept between runs (no trim, no mmap below 32 MiB)" },
        if o.scatter_slots { "scattered (whole pages in a fixed random order, single slots at page 1)" } else { "fresh runs (request after request, as a fresh pool hands them out)" },
        loadavg()
    ));
    let t_all = std::time::Instant::now();
    let mut mooncake: Vec<(Who, usize)> = vec![
        (Who::Rkv, 1),
        (Who::RkvC, 1),
        (Who::RkvRuns, 1),
        (Who::RkvMutex, 1),
        (Who::RkvRw, 1),
        (Who::KvIndex, 1),
        (Who::Rkv, 16),
        (Who::RkvC, 16),
        (Who::RkvRuns, 16),
        (Who::KvIndex, 16),
        (Who::DynRt, 16),
        (Who::DynCrtc, 16),
        (Who::BlockMap, 16),
    ];
    if o.dynamo_page1 {
        mooncake.push((Who::DynRt, 1));
        mooncake.push((Who::DynCrtc, 1));
    }
    let run = |spec: &[&str]| o.run(spec);
    let mut tg = tables::Targets::default();
    // SGLang's RadixCache runs once (replay, then match-only on the tree it built), in a
    // Python process of its own, before the tables that show it.
    let sglang = o
        .sglang_python
        .as_ref()
        .filter(|_| o.only.iter().any(|&w| w == 1 || w == 2))
        .map(|py| sglang_run(py, &o.trace, o.runs, &[]));
    for w in o.only.clone() {
        let t0 = std::time::Instant::now();
        match w {
            1 => rep.table(&tables::w1(&run, &o.pick(&mooncake), o.runs, sglang.as_ref(), &mut tg)),
            2 => rep.table(&tables::w2(
                &run,
                &o.pick(&mooncake),
                o.runs,
                o.threads,
                sglang.as_ref(),
                &mut tg,
            )),
            3 => {
                let who = [
                    (Who::Rkv, 16),
                    (Who::KvIndex, 16),
                    (Who::DynRt, 16),
                    (Who::DynCrtc, 16),
                    (Who::BlockMap, 16),
                    (Who::Rkv, 1),
                    (Who::KvIndex, 1),
                ];
                rep.table(&tables::w3(&run, &o.pick(&who), o.runs, o.branching));
            }
            4 => {
                let sglang = o.sglang_python.as_deref().map(|py| {
                    let cap = measure::CAPACITY.to_string();
                    sglang_run(py, &o.trace, o.runs, &["evict", &cap])
                });
                rep.table(&tables::w4a(&run, o.runs, sglang.as_ref(), &mut tg));
                rep.table(&tables::w4b(&run, o.runs, &o.leaf_sizes, o.kvi_leaf_max, &mut tg));
                if !o.policies.is_empty() {
                    rep.table(&tables::w4c(&run, o.runs, &o.policies));
                    let sizes = [o.leaf_sizes[0], *o.leaf_sizes.last().unwrap()];
                    rep.table(&tables::w4d(&run, o.runs, &sizes, &o.policies));
                }
            }
            5 => rep.table(&tables::w5(&run, o.runs, &o.mix_threads)),
            6 => {
                let mut who = vec![
                    (Who::Rkv, 1),
                    (Who::KvIndex, 1),
                    (Who::Rkv, 16),
                    (Who::KvIndex, 16),
                    (Who::DynRt, 16),
                    (Who::DynCrtc, 16),
                    (Who::BlockMap, 16),
                ];
                if o.dynamo_page1 {
                    who.push((Who::DynRt, 1));
                    who.push((Who::DynCrtc, 1));
                }
                rep.table(&tables::w6(&run, &o.pick(&who), &mut tg));
            }
            _ => usage(),
        }
        rep.line(format!("(workload {w} took {})\n", secs(t0.elapsed().as_secs_f64())));
    }
    rep.table(&tg.table());
    rep.line(format!(
        "total {}; load average at end: {}",
        secs(t_all.elapsed().as_secs_f64()),
        loadavg()
    ));
    if let Some(path) = &o.out {
        std::fs::write(path, &rep.text).expect("write --out");
        eprintln!("wrote {path}");
    }
}
