//! The service's counters and the Prometheus text of `GET /metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use radixkv_router::Refusal;

/// Upper bounds (microseconds) of the query latency histogram's buckets.
const BUCKETS_US: [u64; 14] =
    [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 100_000, 1_000_000];

/// A latency histogram (microseconds), Prometheus style (cumulative on output).
pub(crate) struct Histogram {
    counts: [AtomicU64; BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram { counts: std::array::from_fn(|_| AtomicU64::new(0)), sum_us: AtomicU64::new(0) }
    }

    pub(crate) fn observe(&self, us: u64) {
        let i = BUCKETS_US.iter().position(|&b| us <= b).unwrap_or(BUCKETS_US.len());
        // Relaxed: counters.
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cum = 0;
        for (i, b) in BUCKETS_US.iter().enumerate() {
            cum += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cum}", *b as f64 / 1e6);
        }
        cum += self.counts[BUCKETS_US.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cum}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_us.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {cum}");
    }
}

/// The service's own counters (the router indexes' are read from their stats).
pub(crate) struct Metrics {
    /// ZMQ messages received on the SUB sockets.
    pub frames: AtomicU64,
    /// Messages that are not `[topic, seq (8 bytes), payload]`.
    pub bad_frames: AtomicU64,
    /// Batches applied (live or replayed).
    pub batches: AtomicU64,
    /// Events in the batches applied.
    pub events: AtomicU64,
    /// Payloads that did not decode.
    pub malformed: AtomicU64,
    /// Sequence gaps seen on a live stream.
    pub gaps: AtomicU64,
    /// Gaps replay could not cover (the worker was cleared and re-learned).
    pub gap_clears: AtomicU64,
    /// Replay requests sent.
    pub replays: AtomicU64,
    /// Replay requests that failed (timeout, no answer, bad frames).
    pub replay_failures: AtomicU64,
    /// Batches applied from replay answers.
    pub replayed_batches: AtomicU64,
    /// Live batches already applied from a replay answer (skipped).
    pub duplicates: AtomicU64,
    /// Publisher restarts seen (a seq below the cursor that is not a duplicate).
    pub restarts: AtomicU64,
    /// Payload bytes received (live and replayed).
    pub bytes_in: AtomicU64,
    /// HTTP requests answered with a 4xx.
    pub client_errors: AtomicU64,
    /// Queries answered (`/query` and `/query_by_hash`).
    pub queries: AtomicU64,
    /// Snapshots written.
    pub snapshots: AtomicU64,
    /// Query latency.
    pub query_latency: Histogram,
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        Metrics {
            frames: AtomicU64::new(0),
            bad_frames: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            events: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            gaps: AtomicU64::new(0),
            gap_clears: AtomicU64::new(0),
            replays: AtomicU64::new(0),
            replay_failures: AtomicU64::new(0),
            replayed_batches: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            client_errors: AtomicU64::new(0),
            queries: AtomicU64::new(0),
            snapshots: AtomicU64::new(0),
            query_latency: Histogram::new(),
        }
    }
}

/// Adds one counter or gauge to `out`.
pub(crate) fn metric(out: &mut String, name: &str, kind: &str, help: &str, v: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
}

/// The name of a refusal reason as a label value.
pub(crate) fn refusal_label(r: Refusal) -> &'static str {
    match r {
        Refusal::Malformed => "malformed",
        Refusal::UnknownParent => "unknown_parent",
        Refusal::UnknownRemoval => "unknown_removal",
        Refusal::Unaligned => "unaligned",
        Refusal::Empty => "empty",
        Refusal::TooManyWorkers => "too_many_workers",
        Refusal::SequenceGap => "sequence_gap",
    }
}

impl Metrics {
    /// The service's own counters as Prometheus text.
    pub(crate) fn render(&self, out: &mut String) {
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rows: [(&str, &str, &AtomicU64); 16] = [
            (
                "radixkv_indexer_frames_total",
                "ZMQ messages received on the SUB sockets.",
                &self.frames,
            ),
            (
                "radixkv_indexer_bad_frames_total",
                "Messages that are not [topic, seq, payload] (skipped).",
                &self.bad_frames,
            ),
            (
                "radixkv_indexer_batches_total",
                "KV-event batches applied (live and replayed).",
                &self.batches,
            ),
            ("radixkv_indexer_events_total", "Events in the batches applied.", &self.events),
            (
                "radixkv_indexer_malformed_batches_total",
                "Payloads that did not decode (skipped).",
                &self.malformed,
            ),
            (
                "radixkv_indexer_gaps_total",
                "Sequence gaps seen on the streams (drops included).",
                &self.gaps,
            ),
            (
                "radixkv_indexer_gap_clears_total",
                "Gaps replay could not cover: the worker was cleared and re-learned.",
                &self.gap_clears,
            ),
            ("radixkv_indexer_replays_total", "Replay requests sent.", &self.replays),
            (
                "radixkv_indexer_replay_failures_total",
                "Replay requests that got no whole answer.",
                &self.replay_failures,
            ),
            (
                "radixkv_indexer_replayed_batches_total",
                "Batches applied from replay answers.",
                &self.replayed_batches,
            ),
            (
                "radixkv_indexer_duplicates_total",
                "Live batches already applied from a replay answer (skipped).",
                &self.duplicates,
            ),
            (
                "radixkv_indexer_restarts_total",
                "Publisher restarts seen (the worker was cleared first).",
                &self.restarts,
            ),
            (
                "radixkv_indexer_bytes_received_total",
                "KV-event payload bytes received.",
                &self.bytes_in,
            ),
            (
                "radixkv_indexer_http_client_errors_total",
                "HTTP requests answered with a 4xx.",
                &self.client_errors,
            ),
            ("radixkv_indexer_queries_total", "Queries answered.", &self.queries),
            ("radixkv_indexer_snapshots_total", "Snapshots written.", &self.snapshots),
        ];
        for (name, help, v) in rows {
            metric(out, name, "counter", help, c(v));
        }
        self.query_latency.render(
            out,
            "radixkv_indexer_query_duration_seconds",
            "Query latency inside the service (parse to answer).",
        );
    }
}
