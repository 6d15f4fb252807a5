//! `radixkv indexer`: the flags of the standalone KV indexer service (radixkv-indexer).

use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// The service's flags (`docs/indexer.md`).
#[derive(Args, Debug, Clone)]
pub(crate) struct IndexerArgs {
    /// HOST:PORT to serve HTTP on; port 0 takes any free port (the line printed at start
    /// names the one bound).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8090")]
    listen: String,
    /// Snapshot file: loaded at start (registrations, cursors, blocks; each stream then
    /// resumes from its cursor through replay), written atomically at shutdown and every
    /// --snapshot-interval.
    #[arg(long, value_name = "PATH")]
    snapshot: Option<PathBuf>,
    /// Seconds between snapshots while running (only at shutdown without it).
    #[arg(long, value_name = "SECS", requires = "snapshot")]
    snapshot_interval: Option<f64>,
    /// Another replica's base URL (http://host:port): start from its GET /dump (falls back
    /// to --snapshot if the peer cannot be had).
    #[arg(long, value_name = "URL")]
    peer: Option<String>,
    /// Largest request body accepted; larger requests get 413.
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20)]
    max_body: usize,
    /// Messages each stream's SUB socket queues (libzmq's receive high-water mark); past
    /// it they are dropped, seen as a sequence gap and repaired through replay.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    queue_limit: usize,
    /// Registered (instance, dp_rank) streams at most; further registers get 429.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    max_workers: u32,
    /// Refuse registers (507) once the indexes hold this many heap bytes (the workers
    /// registered go on); no cap without it.
    #[arg(long, value_name = "BYTES")]
    max_bytes: Option<u64>,
    /// Seconds a replay answer may stay silent before the request is given up (and
    /// retried later, backing off).
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    replay_timeout: f64,
    /// Threads serving HTTP.
    #[arg(long, value_name = "N", default_value_t = 2)]
    http_threads: usize,
    /// Seconds one HTTP request may take, its body's arrival included; a slower one gets
    /// 408 (a client trickling its body holds nothing longer).
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    request_timeout: f64,
    /// No log lines on stderr (they are logfmt: level=..., msg=...).
    #[arg(long)]
    quiet: bool,
}

fn seconds(flag: &str, s: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("--{flag} must be a positive number of seconds, not {s}"))
}

/// Runs the service until SIGTERM or SIGINT.
pub(crate) fn run_indexer(a: &IndexerArgs) -> Result<(), String> {
    let cfg = radixkv_indexer::Config {
        listen: a.listen.clone(),
        snapshot: a.snapshot.clone(),
        snapshot_interval: a
            .snapshot_interval
            .map(|s| seconds("snapshot-interval", s))
            .transpose()?,
        peer: a.peer.clone(),
        max_body: a.max_body,
        queue_limit: a.queue_limit,
        max_workers: a.max_workers,
        max_bytes: a.max_bytes,
        replay_timeout: seconds("replay-timeout", a.replay_timeout)?,
        http_threads: a.http_threads,
        request_timeout: seconds("request-timeout", a.request_timeout)?,
        log: !a.quiet,
    };
    radixkv_indexer::run(cfg).map_err(|e| e.to_string())
}
