//! The command line (binary only): `radixkv replay` and `radixkv sweep` (see `docs/contract/CLI.md`).

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

mod indexer;
mod kv;
mod replay;
mod report;
mod sweep;
mod tiered;

use crate::sched::{Schedule, default_defer_threshold};
use clap::{Args, Parser, Subcommand, ValueEnum};
use kv::{Capacity, KvArgs, KvSize, parse_capacity};
use radixkv::EvictionPolicy;
use radixkv::events::hash::HashMode;
use radixkv::events::wire::{Encoding, KvCacheSpecKind, KvGroup, WireOptions};
use radixkv::tier::WritePolicy;
use radixkv_publisher::PublisherOptions;
use radixkv_trace::{Format, Trace, TraceOptions, synthetic};
use rayon::prelude::*;
use report::{Report, capacity_label, thousands};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

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
    ///
    /// The report's "index" line is the index's own memory: the heap bytes the tree holds
    /// at the end (nodes, edge tokens and slots, child tables, eviction index), from a walk
    /// of the tree after the replay, per cached token. The "memory" line is the whole
    /// process's peak RSS. With a KV size (--kv-bytes-per-token or the model shape) the
    /// report also shows the KV bytes and GiB. Fields: docs/cli.md in the repository.
    Replay(ReplayArgs),
    /// Replay a trace at several capacities (--jobs at a time); print each row as it is
    /// ready and write sweep.csv and sweep.svg.
    ///
    /// The header prints at once; the rows print in capacity order, each as soon as its
    /// replay and those of all smaller capacities are done, the unlimited row last. A
    /// progress bar counts the requests replayed on stderr when stderr is a terminal.
    Sweep(SweepArgs),
    /// Serve the standalone KV indexer: workers' vLLM KV events over ZMQ in, Dynamo's
    /// kv_indexer HTTP API out (/register, /unregister, /workers, /query, /query_by_hash,
    /// /dump, plus /metrics and /healthz). Runs until SIGTERM or SIGINT, then drains and
    /// writes the snapshot. docs/indexer.md in the repository.
    Indexer(indexer::IndexerArgs),
}

/// Where the requests come from.
#[derive(Args, Debug, Clone)]
struct WorkloadArgs {
    /// JSON-lines trace (Mooncake or tokens format), or - to read it from standard input;
    /// the built-in workload when absent.
    #[arg(long, value_name = "FILE|-")]
    trace: Option<PathBuf>,
    /// Line format: auto (per line), mooncake or tokens.
    #[arg(long, default_value = "auto", value_name = "FORMAT")]
    format: Format,
    /// Mooncake tokens per hash id.
    #[arg(long, default_value_t = 512, allow_hyphen_values = true, value_parser = clap::value_parser!(u32).range(1..))]
    block_size: u32,
}

/// `--policy`: any of [`EvictionPolicy::ALL`], by SGLang's names (an unknown name is an
/// error listing them).
fn parse_policy(s: &str) -> Result<EvictionPolicy, String> {
    s.trim().parse::<EvictionPolicy>().map_err(|e| e.to_string())
}

/// A list of policies (`--policies`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct PolicyList(Vec<EvictionPolicy>);

/// `--policies`: a comma-separated list of policies (`all` for every one), no repeats.
fn parse_policies(s: &str) -> Result<PolicyList, String> {
    if s.trim() == "all" {
        return Ok(PolicyList(EvictionPolicy::ALL.to_vec()));
    }
    let mut out: Vec<EvictionPolicy> = Vec::new();
    for part in s.split(',') {
        let p = parse_policy(part)?;
        if out.contains(&p) {
            return Err(format!("policy {p} given twice"));
        }
        out.push(p);
    }
    Ok(PolicyList(out))
}

/// How the engine runs.
#[derive(Args, Debug, Clone)]
struct EngineArgs {
    /// Tokens per page (the cache keeps whole pages only).
    #[arg(long, default_value_t = 1, allow_hyphen_values = true, value_parser = positive)]
    page_size: usize,
    /// Eviction order: lru, lfu, fifo, mru, filo, priority or slru (SGLang's policies;
    /// docs/eviction.md). Requests' priorities come from the trace's "priority" field.
    #[arg(long, default_value = "lru", value_parser = parse_policy, value_name = "POLICY")]
    policy: EvictionPolicy,
    /// SLRU's protected threshold: a leaf with at least this many hits is evicted after
    /// every leaf with fewer (read by --policy slru).
    #[arg(long, default_value_t = radixkv::DEFAULT_SLRU_THRESHOLD, value_parser = clap::value_parser!(u32).range(1..), value_name = "HITS")]
    slru_threshold: u32,
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
    #[command(flatten)]
    kv: KvArgs,
    /// KV capacity in tokens (2000000, 2e6, 2M), in bytes with a KV size (40GiB, 500MB;
    /// rounded down to whole tokens), or inf.
    #[arg(long, default_value = "inf", allow_hyphen_values = true, value_parser = parse_capacity, value_name = "TOKENS|BYTES|inf")]
    capacity: Capacity,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    json: bool,
    /// Run every schedule at each of --windows and print a hit-ratio table (with --capacity
    /// inf, a capacity of 1/8 of the trace's distinct tokens is picked so that eviction happens).
    #[arg(long)]
    compare_schedules: bool,
    /// Replay the trace once per policy of --policies at --capacity and print hit ratio,
    /// evictions and evict latency side by side (with --capacity inf, a capacity of 1/8 of
    /// the trace's distinct tokens is picked so that eviction happens).
    #[arg(long, conflicts_with = "compare_schedules")]
    compare_policies: bool,
    /// Policies compared by --compare-policies (comma-separated, or all).
    #[arg(long, default_value = "all", value_parser = parse_policies, value_name = "LIST", requires = "compare_policies")]
    policies: PolicyList,
    /// Windows compared by --compare-schedules.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256", allow_hyphen_values = true, value_parser = positive)]
    windows: Vec<usize>,
    #[command(flatten)]
    events: EventArgs,
    #[command(flatten)]
    host: HostArgs,
}

/// The replay's KV events (vLLM's ZMQ stream, as an engine publishes it).
#[derive(Args, Debug, Clone)]
struct EventArgs {
    /// Publish the replay's KV events on this ZMQ endpoint, one batch per request (vLLM's
    /// stream, what Dynamo, llm-d, the SGLang gateway and Mooncake consume).
    ///
    /// vLLM's rule: the PUB socket binds when the endpoint has a `*` or is ipc://
    /// (tcp://*:5557, tcp://127.0.0.1:*), and connects otherwise (tcp://host:port, to a
    /// subscriber that binds). The endpoints in use are printed on stderr before the replay.
    #[arg(long, value_name = "ENDPOINT", conflicts_with_all = ["compare_schedules", "compare_policies"])]
    kv_events: Option<String>,
    /// Also answer replay requests (vLLM's ROUTER socket, always bound) on this endpoint:
    /// the last 10,000 batches.
    #[arg(long, value_name = "ENDPOINT", requires = "kv_events")]
    kv_events_replay: Option<String>,
    /// How events are encoded: vllm-array (tagged arrays) or vllm-map (tagged maps).
    #[arg(
        long,
        value_enum,
        default_value = "vllm-array",
        value_name = "FORMAT",
        requires = "kv_events"
    )]
    kv_events_format: EventFormatArg,
    /// The topic frame of every message (llm-d expects kv@<pod-ip>:<port>@<model>).
    #[arg(
        long,
        default_value = "",
        value_name = "TOPIC",
        hide_default_value = true,
        requires = "kv_events"
    )]
    kv_events_topic: String,
    /// Page hashes: xxh3 (Dynamo's and Mooncake's) or sglang (SGLang's SHA-256 chain,
    /// sent signed).
    #[arg(long, value_enum, default_value = "xxh3", value_name = "HASH", requires = "kv_events")]
    kv_events_hash: EventHashArg,
    /// After the report, keep the sockets open this long (still answering replay) so
    /// subscribers get the tail.
    #[arg(
        long,
        default_value_t = 1000,
        value_name = "MS",
        allow_hyphen_values = true,
        requires = "kv_events"
    )]
    kv_events_linger_ms: u64,
    /// The KV cache group the replay's cache publishes as, vLLM's group_idx (a hybrid
    /// model keeps one cache per group; sent in every store and removal).
    #[arg(long, default_value_t = 0, value_name = "N", requires = "kv_events")]
    kv_events_group_idx: u32,
    /// The group's kind, vLLM's kv_cache_spec_kind: full_attention, mla_attention,
    /// sliding_window, sliding_window_mla, mamba, chunked_local_attention,
    /// sink_full_attention, encoder_only_attention, cross_attention or unknown.
    #[arg(
        long,
        default_value = "full_attention",
        value_name = "KIND",
        value_parser = parse_spec_kind,
        requires = "kv_events"
    )]
    kv_events_spec_kind: KvCacheSpecKind,
    /// The group's sliding window in tokens (kv_cache_spec_sliding_window): required with
    /// sliding_window and sliding_window_mla, refused with the other kinds.
    #[arg(long, value_name = "TOKENS", requires = "kv_events")]
    kv_events_sliding_window: Option<u32>,
}

fn parse_spec_kind(s: &str) -> Result<KvCacheSpecKind, String> {
    KvCacheSpecKind::from_name(s).map_err(|e| e.to_string().replace("invalid argument: ", ""))
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum EventFormatArg {
    VllmArray,
    VllmMap,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum EventHashArg {
    Xxh3,
    Sglang,
}

impl EventArgs {
    /// The KV cache group of `--kv-events-group-idx`, `--kv-events-spec-kind` and
    /// `--kv-events-sliding-window`, or why they do not go together.
    fn group(&self) -> Result<KvGroup, String> {
        let (idx, kind, window) =
            (self.kv_events_group_idx, self.kv_events_spec_kind, self.kv_events_sliding_window);
        KvGroup::new(idx, kind, window).map_err(|_| match (kind.has_window(), window) {
            (true, None) => {
                format!("--kv-events-spec-kind {kind} needs --kv-events-sliding-window")
            }
            (true, _) => "--kv-events-sliding-window 0: a window is at least 1 token".into(),
            (false, _) => format!(
                "--kv-events-sliding-window goes with --kv-events-spec-kind sliding_window or \
                 sliding_window_mla, not {kind}"
            ),
        })
    }

    /// The replay's event settings, `None` without `--kv-events`.
    fn events(&self) -> Option<replay::Events> {
        let endpoint = self.kv_events.clone()?;
        let hash_mode = match self.kv_events_hash {
            EventHashArg::Xxh3 => HashMode::Xxh3,
            EventHashArg::Sglang => HashMode::SglangSha256,
        };
        let encoding = match self.kv_events_format {
            EventFormatArg::VllmArray => Encoding::VllmArray,
            EventFormatArg::VllmMap => Encoding::VllmMap,
        };
        Some(replay::Events {
            hash_mode,
            publisher: PublisherOptions {
                endpoint,
                replay_endpoint: self.kv_events_replay.clone(),
                topic: self.kv_events_topic.clone(),
                wire: WireOptions {
                    encoding,
                    signed_hashes: hash_mode.signed_on_wire(),
                    // Checked in `main`.
                    group: self.group().unwrap_or_default(),
                    ..Default::default()
                },
                // One batch per request, closed by the replay itself, as an engine's
                // scheduler step closes one.
                auto_flush: None,
                linger: Duration::from_millis(self.kv_events_linger_ms),
                ..Default::default()
            },
        })
    }
}

#[derive(Args, Debug)]
struct SweepArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    kv: KvArgs,
    /// Capacities, comma-separated: tokens (1e5,2M), or bytes with a KV size (10GiB,40GiB)
    /// [default: 12 log-spaced up to 1.5 x the trace's distinct tokens].
    ///
    /// The default list: 12 capacities log-spaced from 1/1000 of the top up to the top,
    /// 1.5 x the trace's distinct tokens, rounded to two significant digits and down to
    /// whole pages. The distinct tokens are the tokens a cache of unlimited capacity holds
    /// at the end of the replay: the size of the trie of every request's page-aligned
    /// prompt (with --with-output, their cached outputs too). The sweep replays the trace
    /// at unlimited capacity first to find them. `inf` in the list is ignored: every sweep
    /// has the unlimited row.
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true, value_parser = parse_capacity, value_name = "LIST")]
    capacities: Vec<Capacity>,
    /// Capacities replayed at once, each with its own cache and --threads threads
    /// [default: available cores / --threads, at least 1].
    ///
    /// The rows do not depend on it (with --threads 1 each replay is deterministic), only
    /// the time does.
    #[arg(long, allow_hyphen_values = true, value_parser = thread_count, value_name = "N")]
    jobs: Option<usize>,
    /// Where sweep.csv and sweep.svg go.
    #[arg(long, default_value = ".", value_name = "DIR")]
    out_dir: PathBuf,
    /// Sweep each of these policies (comma-separated, or all) at the same capacities: one
    /// curve per policy in sweep.svg, a policy column in sweep.csv [default: --policy].
    #[arg(long, value_parser = parse_policies, value_name = "LIST", conflicts_with = "policy")]
    policies: Option<PolicyList>,
    /// Also write sweep.png (the plot rasterized; needs a system font for its text).
    #[arg(long)]
    png: bool,
    /// With --host-capacity, each capacity is replayed twice: device only, and with the
    /// host tier behind it (hit ratios side by side; both curves in the plot).
    #[command(flatten)]
    host: HostArgs,
}

/// The host memory tier behind the device pool (SGLang's HiCache), replayed with the
/// index-only copier: hits and copy volumes, no KV bytes moved.
#[derive(Args, Debug, Clone)]
struct HostArgs {
    /// Host tier size: tokens (20M, 2e7) or bytes with a KV size (200GiB); needs a device
    /// --capacity (the tier sits behind the device pool).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_host_capacity, value_name = "TOKENS|BYTES", help_heading = "Host tier")]
    host_capacity: Option<Capacity>,
    /// When a page gets its host copy: write_through (first insert),
    /// write_through_selective (once --write-threshold inserts reached it) or write_back
    /// (when the device evicts it).
    #[arg(long, default_value = "write_through_selective", value_parser = parse_write_policy, value_name = "POLICY", requires = "host_capacity", help_heading = "Host tier")]
    write_policy: WritePolicy,
    /// write_through_selective's hit count that triggers a backup (SGLang's 2).
    #[arg(long, default_value_t = 2, allow_hyphen_values = true, value_parser = clap::value_parser!(u32).range(1..), value_name = "HITS", requires = "host_capacity", help_heading = "Host tier")]
    write_threshold: u32,
    /// Load-backs of fewer host tokens than this are not done (the tokens are recomputed).
    #[arg(long, default_value_t = 1, allow_hyphen_values = true, value_parser = positive, value_name = "TOKENS", requires = "host_capacity", help_heading = "Host tier")]
    load_back_min: usize,
    /// Host <-> device bandwidth in GB/s (10^9 bytes/s) for the report's copy times: an
    /// assumption (about PCIe 5.0 x16), not a measurement; needs a KV size to show.
    #[arg(long, default_value_t = tiered::DEFAULT_LINK_GBPS, allow_hyphen_values = true, value_parser = parse_gbps, value_name = "GBPS", requires = "host_capacity", help_heading = "Host tier")]
    host_link_gbps: f64,
}

impl HostArgs {
    /// The host tier, `None` without --host-capacity.
    fn tier(&self, kv: Option<&KvSize>) -> Result<Option<tiered::HostTier>, String> {
        let Some(c) = self.host_capacity else { return Ok(None) };
        let capacity = c
            .tokens(kv)
            .map_err(|e| format!("host {e}"))?
            .ok_or("the host capacity must be finite")?;
        Ok(Some(tiered::HostTier {
            capacity,
            write_policy: self.write_policy,
            write_threshold: self.write_threshold,
            load_back_min: self.load_back_min,
            link_gbps: self.host_link_gbps,
        }))
    }
}

/// `--host-capacity`: a capacity, not `inf` (a host tier of unlimited size is not one).
fn parse_host_capacity(s: &str) -> Result<Capacity, String> {
    match parse_capacity(s)? {
        Capacity::Unlimited => Err("the host tier needs a finite size (tokens or bytes)".into()),
        c => Ok(c),
    }
}

/// `--write-policy`: SGLang's names (`-` for `_` too).
fn parse_write_policy(s: &str) -> Result<WritePolicy, String> {
    WritePolicy::parse(s.trim()).map_err(|e| match e {
        radixkv::Error::InvalidArgument(m) => m, // its message, not its text parsed back
        other => other.to_string(),
    })
}

/// `--host-link-gbps`: a positive, finite number.
fn parse_gbps(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        Ok(_) => Err("must be a positive number of GB/s".into()),
        Err(e) => Err(format!("'{s}': {e}")),
    }
}

/// A usage error (status 2, as clap's own) for flags that do not go together.
fn usage_error(msg: &str) -> ! {
    use clap::CommandFactory;
    Cli::command().error(clap::error::ErrorKind::ArgumentConflict, msg).exit()
}

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

/// The name a trace read from standard input goes by (in reports and errors).
const STDIN_NAME: &str = "<stdin>";

fn load(w: &WorkloadArgs) -> Result<Trace, String> {
    let Some(p) = &w.trace else { return Ok(synthetic::builtin()) };
    let opts = TraceOptions { format: w.format, block_size: w.block_size };
    let (t, name) = if p == Path::new("-") {
        let t = Trace::from_reader(STDIN_NAME, std::io::stdin().lock(), opts);
        (t, STDIN_NAME.to_string())
    } else {
        (Trace::load(p, opts), p.display().to_string())
    };
    let t = t.map_err(|e| e.to_string())?;
    if t.is_empty() {
        // A report of zeros would read as a result; an empty file is a mistake.
        return Err(format!(
            "{name}: the trace holds no requests (the file is empty or only blank lines)"
        ));
    }
    Ok(t)
}

fn config(
    e: &EngineArgs,
    capacity: Option<u64>,
    kv: Option<&KvSize>,
    progress: Option<&indicatif::ProgressBar>,
) -> replay::Config {
    replay::Config {
        capacity,
        page_size: e.page_size,
        policy: e.policy,
        slru_threshold: e.slru_threshold,
        threads: e.threads,
        schedule: e.schedule,
        window: e.window,
        defer_threshold: e.defer_threshold.unwrap_or_else(|| default_defer_threshold(e.page_size)),
        seed: e.seed,
        with_output: e.with_output,
        progress: progress.cloned(),
        kv: kv.cloned(),
        events: None,
        host: None,
    }
}

fn json<T: serde::Serialize>(v: &T) -> Result<String, String> {
    serde_json::to_string_pretty(v).map_err(|e| format!("cannot write JSON: {e}"))
}

fn run_replay(a: &ReplayArgs) -> Result<(), String> {
    let kv = a.kv.kv_size()?;
    let capacity = a.capacity.tokens(kv.as_ref())?;
    let host = a.host.tier(kv.as_ref())?;
    let trace = load(&a.workload)?;
    if a.compare_schedules {
        return compare_schedules(a, &trace, capacity, kv.as_ref());
    }
    if a.compare_policies {
        return compare_policies(a, &a.policies.0, &trace, capacity, kv.as_ref());
    }
    let progress =
        (!a.json && std::io::stdout().is_terminal() && trace.input_tokens() >= PROGRESS_MIN_TOKENS)
            .then(|| replay::progress_bar(trace.len() as u64));
    let mut cfg = config(&a.engine, capacity, kv.as_ref(), progress.as_ref());
    cfg.events = a.events.events();
    cfg.host = host;
    let r = replay::replay_publishing(&trace, &cfg);
    if let Some(b) = &progress {
        b.finish_and_clear();
    }
    let (r, publisher) = r?;
    if a.json {
        outln!("{}", json(&r)?);
    } else {
        out!("{}", r.human());
    }
    // After the report: the publisher sends what is left and keeps its sockets open for
    // the linger, so subscribers get the tail.
    if let Some(p) = publisher {
        p.stop();
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

fn compare_schedules(
    a: &ReplayArgs,
    trace: &Trace,
    capacity: Option<u64>,
    kv: Option<&KvSize>,
) -> Result<(), String> {
    let (capacity, unlimited) = comparison_capacity(&a.engine, trace, capacity, kv)?;
    let auto = unlimited.is_some();
    let jobs: Vec<(Schedule, usize)> =
        Schedule::ALL.iter().flat_map(|&s| a.windows.iter().map(move |&w| (s, w))).collect();
    let runs: Vec<Result<Report, String>> = jobs
        .par_iter()
        .map(|&(s, w)| {
            let mut cfg = config(&a.engine, Some(capacity), kv, None);
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
        capacity_label(Some(capacity), kv),
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

/// A capacity for a comparison: the one given, or 1/8 of the trace's distinct tokens (found
/// by an unlimited replay, returned too) so that eviction happens.
fn comparison_capacity(
    engine: &EngineArgs,
    trace: &Trace,
    capacity: Option<u64>,
    kv: Option<&KvSize>,
) -> Result<(u64, Option<Report>), String> {
    if let Some(c) = capacity {
        return Ok((c, None));
    }
    // The distinct tokens are what an unlimited cache ends up holding.
    let mut cfg = config(engine, None, kv, None);
    cfg.schedule = Schedule::Fcfs;
    let r = replay::replay(trace, &cfg)?;
    let page = engine.page_size as u64;
    let longest = (0..trace.len()).map(|i| trace.input_len(i) as u64).max().unwrap_or(0);
    let c = (r.cached_tokens / 8).max(longest + page).max(page);
    Ok((c, Some(r)))
}

fn compare_policies(
    a: &ReplayArgs,
    policies: &[EvictionPolicy],
    trace: &Trace,
    capacity: Option<u64>,
    kv: Option<&KvSize>,
) -> Result<(), String> {
    let (capacity, unlimited) = comparison_capacity(&a.engine, trace, capacity, kv)?;
    let auto = unlimited.is_some();
    // One replay per policy, side by side (rayon: up to the cores); each is deterministic
    // with one thread, so running them together changes only the times.
    let runs: Vec<Result<Report, String>> = policies
        .par_iter()
        .map(|&p| {
            let mut cfg = config(&a.engine, Some(capacity), kv, None);
            cfg.policy = p;
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
        "radixkv policy comparison: {} ({} requests, {} input tokens)",
        trace.name(),
        thousands(trace.len() as u64),
        thousands(trace.input_tokens())
    );
    outln!(
        "  capacity {}{}, page size {}, {} thread{}, schedule {} (window {})",
        capacity_label(Some(capacity), kv),
        if auto { " (auto: 1/8 of the distinct tokens, so that eviction happens)" } else { "" },
        a.engine.page_size,
        a.engine.threads,
        if a.engine.threads == 1 { "" } else { "s" },
        a.engine.schedule.name(),
        a.engine.window
    );
    outln!(
        "  {:<9} {:>10} {:>14} {:>14} {:>10} {:>11} {:>11} {:>9} {:>8}",
        "policy",
        "hit ratio",
        "hit tokens",
        "evicted",
        "evictions",
        "evict p50",
        "evict p99",
        "wall s",
        "vs lru"
    );
    let lru_hits = runs.iter().find(|r| r.policy == "lru").map(|r| r.hit_tokens);
    for r in &runs {
        let vs = match lru_hits {
            Some(l) if l > 0 => format!("{:+.1}%", (r.hit_tokens as f64 / l as f64 - 1.0) * 100.0),
            _ => "-".to_string(),
        };
        outln!(
            "  {:<9} {:>10.4} {:>14} {:>14} {:>10} {:>8.1} µs {:>8.1} µs {:>9.3} {:>8}",
            r.policy,
            r.hit_ratio,
            thousands(r.hit_tokens),
            thousands(r.evicted_tokens),
            thousands(r.evictions),
            r.evict_p50_us,
            r.evict_p99_us,
            r.wall_s,
            vs
        );
    }
    // The first of the best, in the order listed (ties go to the earlier policy).
    let best = runs.iter().fold(None::<&Report>, |b, r| match b {
        Some(b) if b.hit_tokens >= r.hit_tokens => Some(b),
        _ => Some(r),
    });
    if let Some(best) = best {
        let tied: Vec<&str> = runs
            .iter()
            .filter(|r| r.hit_tokens == best.hit_tokens && r.policy != best.policy)
            .map(|r| r.policy.as_str())
            .collect();
        let tie = if tied.is_empty() {
            String::new()
        } else {
            format!(", tied with {}", tied.join(", "))
        };
        outln!("  most hits: {} ({:.4}{tie})", best.policy, best.hit_ratio);
    }
    if let Some(u) = &unlimited {
        outln!("  unlimited capacity (no eviction, any policy): {:.4}", u.hit_ratio);
    }
    Ok(())
}

/// Default `--jobs`: the available cores shared among replays of `threads` threads each.
fn default_jobs(threads: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / threads.max(1)).max(1)
}

fn run_sweep(a: &SweepArgs) -> Result<(), String> {
    let kv = a.kv.kv_size()?;
    let kv = kv.as_ref();
    // Capacities in bytes need the KV size: checked before the trace is read.
    let mut given = Vec::with_capacity(a.capacities.len());
    for c in &a.capacities {
        // `inf` in the list is the unlimited run every sweep has anyway.
        given.extend(c.tokens(kv)?);
    }
    let host = a.host.tier(kv)?;
    let trace = load(&a.workload)?;
    let page = a.engine.page_size as u64;
    if let Some(c) = given.iter().find(|&&c| c < page) {
        return Err(format!("capacity {c} is smaller than one page ({page} tokens)"));
    }
    given.sort_unstable();
    given.dedup();
    if given.is_empty() && !a.capacities.is_empty() {
        return Err(format!("no capacity of at least one page ({page} tokens) to sweep"));
    }
    // The output folder is checked before the replays, which can take minutes.
    std::fs::create_dir_all(&a.out_dir)
        .map_err(|e| format!("{}: cannot create: {e}", a.out_dir.display()))?;
    let jobs = a.jobs.unwrap_or_else(|| default_jobs(a.engine.threads));
    let policies = match &a.policies {
        Some(l) => l.0.clone(),
        None => vec![a.engine.policy],
    };
    out!("{}", sweep::table_header(&trace, kv, jobs, host.map(|h| h.capacity)));
    let bar = if std::io::stderr().is_terminal() {
        replay::sweep_progress_bar()
    } else {
        indicatif::ProgressBar::hidden()
    };
    // One sweep per policy, at the same capacities (the first one's, when they are the
    // default ones: they follow from the distinct tokens, which no policy changes).
    let mut curves: Vec<Vec<Report>> = Vec::with_capacity(policies.len());
    for &policy in &policies {
        let mut engine = a.engine.clone();
        engine.policy = policy;
        if policies.len() > 1 {
            bar.suspend(|| outln!("  policy {policy}"));
        }
        let caps = match curves.first() {
            Some(first) => first.iter().filter_map(|r| r.capacity).collect(),
            None => given.clone(),
        };
        let r = sweep_one(&trace, &engine, kv, host.as_ref(), &caps, jobs, &bar);
        curves.push(r.inspect_err(|_| bar.finish_and_clear())?);
    }
    bar.finish_and_clear();
    let reports: Vec<Report> = curves.iter().flatten().cloned().collect();
    let csv = a.out_dir.join("sweep.csv");
    let svg = a.out_dir.join("sweep.svg");
    std::fs::write(&csv, sweep::csv(&reports, kv.is_some(), host.is_some()))
        .map_err(|e| format!("{}: cannot write: {e}", csv.display()))?;
    let split: Vec<(&[Report], &Report)> = curves
        .iter()
        .map(|c| {
            let (u, points) = c.split_last().expect("at least the unlimited run");
            (points, u)
        })
        .collect();
    sweep::plot(&svg, trace.name(), &split)
        .map_err(|e| format!("{}: cannot draw: {e}", svg.display()))?;
    if a.png {
        let png = a.out_dir.join("sweep.png");
        sweep::png(&svg, &png).map_err(|e| format!("{}: cannot draw: {e}", png.display()))?;
        outln!("  wrote {}, {} and {}", csv.display(), svg.display(), png.display());
    } else {
        outln!("  wrote {} and {}", csv.display(), svg.display());
    }
    Ok(())
}

/// One policy's sweep (the policy in `engine`): every capacity of `given` (the default
/// ones when empty) and the unlimited run, its rows printed as they are ready; the reports
/// in capacity order, the unlimited one last.
fn sweep_one(
    trace: &Trace,
    engine: &EngineArgs,
    kv: Option<&KvSize>,
    host: Option<&tiered::HostTier>,
    given: &[u64],
    jobs: usize,
    bar: &indicatif::ProgressBar,
) -> Result<Vec<Report>, String> {
    let requests = trace.len() as u64;
    let page = engine.page_size as u64;
    let mut rows = Rows { bar, host: host.is_some(), done: Vec::new(), printed: 0 };
    let mut unlimited = None;
    let caps = if given.is_empty() {
        // The default capacities follow from the distinct tokens, which the unlimited
        // replay finds: it runs first, alone.
        bar.inc_length(requests);
        bar.set_message("unlimited first (for the distinct tokens)");
        let u = replay::replay(trace, &config(engine, None, kv, Some(bar)))?;
        let caps = sweep::default_capacities(u.cached_tokens, page);
        unlimited = Some(u);
        caps
    } else {
        given.to_vec()
    };
    // Rows print in capacity order, each as soon as it and every smaller capacity are done
    // (the unlimited row last); the capacities start in that order too.
    let mut order: Vec<Option<u64>> = caps.iter().map(|&c| Some(c)).collect();
    order.push(None);
    let mut todo: Vec<Option<u64>> = caps.iter().map(|&c| Some(c)).collect();
    if unlimited.is_none() {
        // Its row prints last. One job at a time: it runs last, so the other rows come out
        // without waiting for it. Several: it starts first, beside the smallest
        // capacities, instead of running on its own at the end.
        if jobs > 1 {
            todo.insert(0, None);
        } else {
            todo.push(None);
        }
    }
    rows.done = vec![None; order.len()];
    if let Some(u) = unlimited.take() {
        rows.done[order.len() - 1] = Some(u);
    }
    let total = todo.len();
    // With a host tier every finite capacity is replayed twice.
    let host_runs = if host.is_some() { caps.len() as u64 } else { 0 };
    bar.inc_length(requests * (total as u64 + host_runs));
    bar.set_message(format!("0/{total} capacities done"));
    let mut finished = 0;
    let mut first_error = None;
    replay_all(trace, engine, kv, host, &todo, jobs, bar, |cap, r| match r {
        Ok(r) => {
            finished += 1;
            bar.set_message(format!("{finished}/{total} capacities done"));
            let at = order.iter().position(|&c| c == cap).expect("a capacity of the sweep");
            rows.done[at] = Some(r);
            rows.print_ready();
        }
        Err(e) => {
            first_error.get_or_insert(e);
        }
    });
    if let Some(e) = first_error {
        return Err(e);
    }
    Ok(rows.done.into_iter().map(|r| r.expect("every capacity replayed")).collect())
}

/// The sweep's rows in display order: those done, and how many are printed.
struct Rows<'a> {
    bar: &'a indicatif::ProgressBar,
    /// The sweep has a host tier (the table's host column).
    host: bool,
    done: Vec<Option<Report>>,
    printed: usize,
}

impl Rows<'_> {
    /// Prints every row whose turn has come (its own and every earlier row are done).
    fn print_ready(&mut self) {
        while let Some(Some(r)) = self.done.get(self.printed) {
            let row = sweep::table_row(r, self.host);
            // Off the bar's line while printing, should stdout share its terminal.
            self.bar.suspend(|| out!("{row}"));
            self.printed += 1;
            hold_while_test_file();
        }
    }
}

/// A test hook (`tests/cli/sweep.rs`, `sweep_rows_stream`): with `RADIXKV_TEST_SWEEP_HOLD`
/// naming a file, the sweep waits after printing each row for as long as that file exists
/// (at most ten minutes), so a test can look at the running sweep between two rows without
/// racing the clock. Unset, it costs one environment lookup per row.
fn hold_while_test_file() {
    let Some(path) = std::env::var_os("RADIXKV_TEST_SWEEP_HOLD") else {
        return;
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(600);
    while std::path::Path::new(&path).exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Replays `trace` at each of `caps` (in that order), `jobs` at a time, each with its own
/// cache; calls `done` on this thread with each result as it comes. With `host`, each
/// finite capacity is replayed with the host tier too, that report in the device-only
/// one's `with_host`. After an error no further capacity starts.
#[allow(clippy::too_many_arguments)]
fn replay_all(
    trace: &Trace,
    engine: &EngineArgs,
    kv: Option<&KvSize>,
    host: Option<&tiered::HostTier>,
    caps: &[Option<u64>],
    jobs: usize,
    bar: &indicatif::ProgressBar,
    mut done: impl FnMut(Option<u64>, Result<Report, String>),
) {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, caps.len().max(1)) {
            let tx = tx.clone();
            let (next, stop) = (&next, &stop);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Some(&cap) = caps.get(next.fetch_add(1, Ordering::Relaxed)) else {
                        break;
                    };
                    let mut cfg = config(engine, cap, kv, Some(bar));
                    let mut r = replay::replay(trace, &cfg);
                    if let (Ok(plain), Some(h), Some(_)) = (&mut r, host, cap) {
                        cfg.host = Some(*h);
                        match replay::replay(trace, &cfg) {
                            Ok(t) => plain.with_host = Some(Box::new(t)),
                            Err(e) => r = Err(e),
                        }
                    }
                    if r.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    if tx.send((cap, r)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        for (cap, r) in rx {
            done(cap, r);
        }
    });
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
    if let Command::Replay(a) = &cli.command
        && a.host.host_capacity.is_some()
    {
        if a.capacity == Capacity::Unlimited {
            usage_error(
                "--host-capacity needs a device capacity: the host tier sits behind the device pool (give --capacity TOKENS|BYTES)",
            );
        }
        if a.events.kv_events.is_some() || a.compare_schedules || a.compare_policies {
            usage_error(
                "--host-capacity does not go with --kv-events, --compare-schedules or --compare-policies",
            );
        }
    }
    if let Command::Replay(a) = &cli.command
        && let Err(e) = a.events.group()
    {
        usage_error(&e);
    }
    let r = match &cli.command {
        Command::Replay(a) => run_replay(a),
        Command::Sweep(a) => run_sweep(a),
        Command::Indexer(a) => indexer::run_indexer(a),
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
    fn args_parse() {
        let c = Cli::try_parse_from(["radixkv", "replay"]).unwrap();
        let Command::Replay(a) = c.command else { panic!("replay expected") };
        assert_eq!(a.capacity, Capacity::Unlimited);
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
        assert_eq!(a.capacity, Capacity::Tokens(2_000_000));
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
            vec![Capacity::Tokens(100_000), Capacity::Tokens(2_000_000), Capacity::Unlimited]
        );
        assert_eq!(s.jobs, None);
        let c = Cli::try_parse_from([
            "radixkv",
            "sweep",
            "--jobs",
            "3",
            "--layers",
            "32",
            "--kv-heads",
            "8",
            "--head-dim",
            "128",
            "--dtype",
            "fp8",
            "--capacities",
            "10GiB,inf",
        ])
        .unwrap();
        let Command::Sweep(s) = c.command else { panic!("sweep expected") };
        assert_eq!(s.jobs, Some(3));
        assert_eq!(s.kv.kv_size().unwrap().unwrap().bytes_per_token, 65_536);
        assert_eq!(s.capacities, vec![Capacity::Bytes(10 << 30), Capacity::Unlimited]);
        // The shape goes together, and not with a given byte count.
        for bad in [
            &["radixkv", "replay", "--layers", "32"][..],
            &["radixkv", "replay", "--layers", "32", "--kv-heads", "8"],
            &["radixkv", "replay", "--dtype", "fp8"],
            &[
                "radixkv",
                "replay",
                "--kv-bytes-per-token",
                "8",
                "--layers",
                "1",
                "--kv-heads",
                "1",
                "--head-dim",
                "1",
            ],
            &["radixkv", "replay", "--kv-bytes-per-token", "0"],
            &[
                "radixkv",
                "replay",
                "--dtype",
                "int4",
                "--layers",
                "1",
                "--kv-heads",
                "1",
                "--head-dim",
                "1",
            ],
            &["radixkv", "sweep", "--jobs", "0"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }
}
