//! The command line (binary only): `radixkv replay` and `radixkv sweep` (see `CLI.md`).

/// `print!` to stdout, except that a closed pipe (`radixkv replay --json | head -1`) ends
/// the program quietly with status 0 instead of panicking (see [`emit`]).
macro_rules! out {
    ($($t:tt)*) => { $crate::cli::emit(format_args!($($t)*)) };
}

/// `println!` through [`emit`], as [`out!`].
macro_rules! outln {
    () => { $crate::cli::emit(format_args!("\n")) };
    ($($t:tt)*) => {{
        $crate::cli::emit(format_args!($($t)*));
        $crate::cli::emit(format_args!("\n"))
    }};
}

mod replay;
mod report;
mod sweep;

use clap::{Args, Parser, Subcommand, ValueEnum};
use radixkv::EvictionPolicy;
use radixkv::sched::{Schedule, default_defer_threshold};
use radixkv::trace::{Format, Trace, TraceOptions, synthetic};
use rayon::prelude::*;
use report::{Report, capacity_label, thousands};
use std::io::IsTerminal;
use std::path::PathBuf;

/// Replays that move at least this many tokens show a progress bar (on a terminal).
const PROGRESS_MIN_TOKENS: u64 = 20_000_000;

#[derive(Parser, Debug)]
#[command(
    name = "radixkv",
    version,
    about = "Replay LLM request traces through the radixkv prefix cache: hit ratio, speed and memory"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Replay a trace (the built-in synthetic workload without --trace) and report hits and costs.
    Replay(ReplayArgs),
    /// Replay a trace at several capacities in parallel; write sweep.csv and sweep.svg.
    Sweep(SweepArgs),
}

/// Where the requests come from.
#[derive(Args, Debug, Clone)]
struct WorkloadArgs {
    /// JSON-lines trace (Mooncake or tokens format); the built-in workload when absent.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Line format: auto (per line), mooncake or tokens.
    #[arg(long, default_value = "auto", value_name = "FORMAT")]
    format: Format,
    /// Mooncake tokens per hash id.
    #[arg(long, default_value_t = 512, allow_hyphen_values = true, value_parser = clap::value_parser!(u32).range(1..))]
    block_size: u32,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
enum PolicyArg {
    Lru,
    Fifo,
}

/// How the engine runs.
#[derive(Args, Debug, Clone)]
struct EngineArgs {
    /// Tokens per page (the cache keeps whole pages only).
    #[arg(long, default_value_t = 1, allow_hyphen_values = true, value_parser = positive)]
    page_size: usize,
    /// Eviction order.
    #[arg(long, value_enum, default_value = "lru")]
    policy: PolicyArg,
    /// Scheduler threads sharing one cache, pulling from one queue.
    #[arg(long, default_value_t = 1, allow_hyphen_values = true, value_parser = thread_count)]
    threads: usize,
    /// Order of each window of waiting requests: fcfs, lpm, dfs-weight or random.
    #[arg(long, default_value = "fcfs", value_name = "SCHEDULE")]
    schedule: Schedule,
    /// Waiting requests ordered together per scheduling round.
    #[arg(long, default_value_t = 64, allow_hyphen_values = true, value_parser = positive)]
    window: usize,
    /// In-batch prefix sharing (lpm, dfs-weight, with --threads above 1): defer a request
    /// sharing at least this many uncached tokens with one running alongside it; 0 turns it
    /// off [default: max(32, 2 pages)].
    #[arg(long, value_name = "TOKENS", allow_hyphen_values = true)]
    defer_threshold: Option<usize>,
    /// Seed of the random schedule.
    #[arg(long, default_value_t = 42, allow_hyphen_values = true)]
    seed: u64,
    /// Also cache each request's output_length generated tokens (fresh token ids).
    #[arg(long)]
    with_output: bool,
}

#[derive(Args, Debug)]
struct ReplayArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    #[command(flatten)]
    engine: EngineArgs,
    /// KV capacity in tokens (2000000, 2e6, 2M) or inf.
    #[arg(long, default_value = "inf", allow_hyphen_values = true, value_parser = parse_capacity, value_name = "TOKENS|inf")]
    capacity: Capacity,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    json: bool,
    /// Run every schedule at each of --windows and print a hit-ratio table (with --capacity
    /// inf, a capacity of 1/8 of the trace's distinct tokens is picked so that eviction happens).
    #[arg(long)]
    compare_schedules: bool,
    /// Windows compared by --compare-schedules.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256", allow_hyphen_values = true, value_parser = positive)]
    windows: Vec<usize>,
}

#[derive(Args, Debug)]
struct SweepArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    #[command(flatten)]
    engine: EngineArgs,
    /// Capacities in tokens, comma-separated (default: 12 log-spaced up to the trace's total).
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true, value_parser = parse_capacity, value_name = "LIST")]
    capacities: Vec<Capacity>,
    /// Where sweep.csv and sweep.svg go.
    #[arg(long, default_value = ".", value_name = "DIR")]
    out_dir: PathBuf,
}

/// A capacity: tokens, or unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Capacity(Option<u64>);

/// Most scheduler threads `--threads` accepts.
const MAX_THREADS: usize = 1024;

fn thread_count(s: &str) -> Result<usize, String> {
    match positive(s)? {
        n if n > MAX_THREADS => Err(format!("at most {MAX_THREADS}")),
        n => Ok(n),
    }
}

fn positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(format!("'{s}': {e}")),
    }
}

/// `2000000`, `2e6`, `2.5M`, `100k`, `inf`.
fn parse_capacity(s: &str) -> Result<Capacity, String> {
    let t = s.trim().to_ascii_lowercase();
    if matches!(t.as_str(), "inf" | "infinite" | "unlimited" | "none") {
        return Ok(Capacity(None));
    }
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1e3),
        Some('m') => (&t[..t.len() - 1], 1e6),
        Some('g') => (&t[..t.len() - 1], 1e9),
        _ => (t.as_str(), 1.0),
    };
    let bad =
        || format!("'{s}' is not a capacity (a token count such as 2000000, 2e6 or 2M, or inf)");
    let v = if mult == 1.0 && num.bytes().all(|b| b.is_ascii_digit()) && !num.is_empty() {
        num.parse::<u64>().map_err(|_| bad())? as f64
    } else {
        num.parse::<f64>().map_err(|_| bad())? * mult
    };
    if !v.is_finite() || v.fract() != 0.0 {
        return Err(bad());
    }
    if v < 1.0 {
        return Err(format!("capacity '{s}' must be at least 1 token"));
    }
    if v > u32::MAX as f64 + 1.0 {
        return Err(format!("capacity '{s}' exceeds 2^32 slots (slot ids are u32)"));
    }
    Ok(Capacity(Some(v as u64)))
}

fn load(w: &WorkloadArgs) -> Result<Trace, String> {
    match &w.trace {
        None => Ok(synthetic::builtin()),
        Some(p) => {
            let t = Trace::load(p, TraceOptions { format: w.format, block_size: w.block_size })
                .map_err(|e| e.to_string())?;
            if t.is_empty() {
                // A report of zeros would read as a result; an empty file is a mistake.
                return Err(format!(
                    "{}: the trace holds no requests (the file is empty or only blank lines)",
                    p.display()
                ));
            }
            Ok(t)
        }
    }
}

fn config(e: &EngineArgs, capacity: Option<u64>, progress: bool) -> replay::Config {
    replay::Config {
        capacity,
        page_size: e.page_size,
        policy: match e.policy {
            PolicyArg::Lru => EvictionPolicy::Lru,
            PolicyArg::Fifo => EvictionPolicy::Fifo,
        },
        threads: e.threads,
        schedule: e.schedule,
        window: e.window,
        defer_threshold: e.defer_threshold.unwrap_or_else(|| default_defer_threshold(e.page_size)),
        seed: e.seed,
        with_output: e.with_output,
        progress,
    }
}

fn json<T: serde::Serialize>(v: &T) -> Result<String, String> {
    serde_json::to_string_pretty(v).map_err(|e| format!("cannot write JSON: {e}"))
}

fn run_replay(a: &ReplayArgs) -> Result<(), String> {
    let trace = load(&a.workload)?;
    if a.compare_schedules {
        return compare_schedules(a, &trace);
    }
    let progress =
        !a.json && std::io::stdout().is_terminal() && trace.input_tokens() >= PROGRESS_MIN_TOKENS;
    let r = replay::replay(&trace, &config(&a.engine, a.capacity.0, progress))?;
    if a.json {
        outln!("{}", json(&r)?);
    } else {
        out!("{}", r.human());
    }
    Ok(())
}

#[derive(serde::Serialize)]
struct Comparison<'a> {
    capacity: Option<u64>,
    capacity_auto: bool,
    unlimited: Option<&'a Report>,
    runs: Vec<&'a Report>,
}

fn compare_schedules(a: &ReplayArgs, trace: &Trace) -> Result<(), String> {
    let mut unlimited = None;
    let (capacity, auto) = match a.capacity.0 {
        Some(c) => (c, false),
        None => {
            // The distinct tokens are what an unlimited cache ends up holding.
            let mut cfg = config(&a.engine, None, false);
            cfg.schedule = Schedule::Fcfs;
            let r = replay::replay(trace, &cfg)?;
            let page = a.engine.page_size as u64;
            let longest = (0..trace.len()).map(|i| trace.input_len(i) as u64).max().unwrap_or(0);
            let c = (r.cached_tokens / 8).max(longest + page).max(page);
            unlimited = Some(r);
            (c, true)
        }
    };
    let jobs: Vec<(Schedule, usize)> =
        Schedule::ALL.iter().flat_map(|&s| a.windows.iter().map(move |&w| (s, w))).collect();
    let runs: Vec<Result<Report, String>> = jobs
        .par_iter()
        .map(|&(s, w)| {
            let mut cfg = config(&a.engine, Some(capacity), false);
            cfg.schedule = s;
            cfg.window = w;
            replay::replay(trace, &cfg)
        })
        .collect();
    let runs: Vec<Report> = runs.into_iter().collect::<Result<_, _>>()?;
    if a.json {
        let c = Comparison {
            capacity: Some(capacity),
            capacity_auto: auto,
            unlimited: unlimited.as_ref(),
            runs: runs.iter().collect(),
        };
        outln!("{}", json(&c)?);
        return Ok(());
    }
    outln!(
        "radixkv schedule comparison: {} ({} requests, {} input tokens)",
        trace.name(),
        thousands(trace.len() as u64),
        thousands(trace.input_tokens())
    );
    outln!(
        "  capacity {}{}, page size {}, {} thread{}",
        capacity_label(Some(capacity)),
        if auto { " (auto: 1/8 of the distinct tokens, so that eviction happens)" } else { "" },
        a.engine.page_size,
        a.engine.threads,
        if a.engine.threads == 1 { "" } else { "s" }
    );
    out!("  {:<12}", "hit ratio");
    for w in &a.windows {
        out!(" {:>12}", format!("window {w}"));
    }
    outln!();
    for (i, s) in Schedule::ALL.iter().enumerate() {
        out!("  {:<12}", s.name());
        for j in 0..a.windows.len() {
            out!(" {:>12.4}", runs[i * a.windows.len() + j].hit_ratio);
        }
        outln!();
    }
    if let Some(u) = &unlimited {
        // One thread: every distinct page misses exactly once, whatever the order. Several
        // threads: requests running side by side can both miss the same pages, so the
        // figure is fcfs's at that thread count.
        let how = if u.threads == 1 {
            "any schedule, 1 thread".to_string()
        } else {
            format!("fcfs, {} threads", u.threads)
        };
        outln!("  unlimited capacity ({how}): {:.4}", u.hit_ratio);
    }
    Ok(())
}

fn run_sweep(a: &SweepArgs) -> Result<(), String> {
    let trace = load(&a.workload)?;
    let page = a.engine.page_size as u64;
    let mut caps: Vec<u64> = if a.capacities.is_empty() {
        sweep::default_capacities(trace.input_tokens(), page)
    } else {
        // `inf` in the list is the unlimited run every sweep has anyway.
        a.capacities.iter().filter_map(|c| c.0).collect()
    };
    if let Some(c) = caps.iter().find(|&&c| c < page) {
        return Err(format!("capacity {c} is smaller than one page ({page} tokens)"));
    }
    caps.sort_unstable();
    caps.dedup();
    if caps.is_empty() {
        return Err(format!("no capacity of at least one page ({page} tokens) to sweep"));
    }
    // The output folder is checked before the replays, which can take minutes.
    std::fs::create_dir_all(&a.out_dir)
        .map_err(|e| format!("{}: cannot create: {e}", a.out_dir.display()))?;
    let mut all: Vec<Option<u64>> = caps.iter().map(|&c| Some(c)).collect();
    all.push(None);
    let reports: Vec<Result<Report, String>> =
        all.par_iter().map(|&c| replay::replay(&trace, &config(&a.engine, c, false))).collect();
    let reports: Vec<Report> = reports.into_iter().collect::<Result<_, _>>()?;
    let (unlimited, points) = reports.split_last().expect("at least the unlimited run");
    let csv = a.out_dir.join("sweep.csv");
    let svg = a.out_dir.join("sweep.svg");
    std::fs::write(&csv, sweep::csv(&reports))
        .map_err(|e| format!("{}: cannot write: {e}", csv.display()))?;
    sweep::plot(&svg, trace.name(), points, unlimited)
        .map_err(|e| format!("{}: cannot draw: {e}", svg.display()))?;
    out!("{}", sweep::table(&trace, &reports));
    outln!("  wrote {} and {}", csv.display(), svg.display());
    Ok(())
}

/// Writes `args` to stdout. A closed pipe (the reader went away, as `head` does) exits the
/// program at once, quietly, with status 0: the reader had all it wanted. Any other write
/// error is reported and exits with status 1.
pub(crate) fn emit(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("radixkv: error: cannot write the output: {e}");
        std::process::exit(1);
    }
}

/// Runs the command line; returns the exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let r = match &cli.command {
        Command::Replay(a) => run_replay(a),
        Command::Sweep(a) => run_sweep(a),
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("radixkv: error: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_parse() {
        assert_eq!(parse_capacity("2000000"), Ok(Capacity(Some(2_000_000))));
        assert_eq!(parse_capacity("2e6"), Ok(Capacity(Some(2_000_000))));
        assert_eq!(parse_capacity("2.5M"), Ok(Capacity(Some(2_500_000))));
        assert_eq!(parse_capacity("100k"), Ok(Capacity(Some(100_000))));
        assert_eq!(parse_capacity("1e5"), Ok(Capacity(Some(100_000))));
        assert_eq!(parse_capacity("inf"), Ok(Capacity(None)));
        assert_eq!(parse_capacity("Unlimited"), Ok(Capacity(None)));
        assert!(parse_capacity("0").is_err());
        assert!(parse_capacity("1.5").is_err());
        assert!(parse_capacity("-5").is_err());
        assert!(parse_capacity("abc").is_err());
        assert!(parse_capacity("").is_err());
        assert!(parse_capacity("1e30").is_err());
        assert!(parse_capacity("nan").is_err());
        assert_eq!(parse_capacity("4294967296"), Ok(Capacity(Some(1 << 32))));
        assert!(parse_capacity("4294967297").is_err());
    }

    #[test]
    fn args_parse() {
        let c = Cli::try_parse_from(["radixkv", "replay"]).unwrap();
        let Command::Replay(a) = c.command else { panic!("replay expected") };
        assert_eq!(a.capacity, Capacity(None));
        assert_eq!(a.engine.schedule, Schedule::Fcfs);
        assert_eq!((a.engine.threads, a.engine.page_size), (1, 1));
        let c = Cli::try_parse_from([
            "radixkv",
            "replay",
            "--capacity",
            "2e6",
            "--schedule",
            "dfs-weight",
            "--window",
            "8",
            "--page-size",
            "16",
            "--policy",
            "fifo",
            "--format",
            "mooncake",
            "--threads",
            "4",
            "--json",
        ])
        .unwrap();
        let Command::Replay(a) = c.command else { panic!("replay expected") };
        assert_eq!(a.capacity, Capacity(Some(2_000_000)));
        assert_eq!(a.engine.schedule, Schedule::DfsWeight);
        assert_eq!((a.engine.window, a.engine.page_size, a.engine.threads), (8, 16, 4));
        assert_eq!(a.workload.format, Format::Mooncake);
        assert!(a.json);
        assert!(Cli::try_parse_from(["radixkv", "replay", "--threads", "0"]).is_err());
        assert!(Cli::try_parse_from(["radixkv", "replay", "--schedule", "sjf"]).is_err());
        assert!(Cli::try_parse_from(["radixkv", "replay", "--format", "csv"]).is_err());
        let c =
            Cli::try_parse_from(["radixkv", "sweep", "--trace", "t", "--capacities", "1e5,2M,inf"])
                .unwrap();
        let Command::Sweep(s) = c.command else { panic!("sweep expected") };
        assert_eq!(
            s.capacities,
            vec![Capacity(Some(100_000)), Capacity(Some(2_000_000)), Capacity(None)]
        );
    }
}
