//! What a replay measured, and how it is shown.

use super::kv::{KvSize, bytes_label, gib};
use serde::Serialize;
use std::fmt::Write as _;
use std::time::Duration;

/// Latency samples of one operation, in nanoseconds.
#[derive(Default, Debug, Clone)]
pub struct Samples(Vec<u64>);

impl Samples {
    /// Records one sample.
    pub fn push(&mut self, d: Duration) {
        self.0.push(d.as_nanos().min(u64::MAX as u128) as u64);
    }
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Nearest-rank percentile `p` (0..=100) in microseconds; 0 without samples.
    pub fn percentile_us(&mut self, p: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.sort_unstable();
        let rank = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        self.0[rank.clamp(1, self.0.len()) - 1] as f64 / 1000.0
    }
}

/// Per-operation latencies of one thread (merged at the end).
#[derive(Default, Debug, Clone)]
pub struct Latencies {
    /// `match_and_lock`.
    pub matching: Samples,
    /// `insert` / `insert_and_lock`.
    pub insert: Samples,
    /// Evictions before an allocation.
    pub evict: Samples,
}

impl Latencies {
    /// Appends another thread's samples.
    pub fn merge(&mut self, o: Latencies) {
        self.matching.0.extend(o.matching.0);
        self.insert.0.extend(o.insert.0);
        self.evict.0.extend(o.evict.0);
    }
}

/// Peak resident set size of this process (`VmHWM`), 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else { return 0 };
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The result of one replay (the `--json` object).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Trace name.
    pub trace: String,
    /// Requests replayed (skipped ones included).
    pub requests: u64,
    /// Their input tokens.
    pub input_tokens: u64,
    /// Input tokens found cached by `match_and_lock`.
    pub hit_tokens: u64,
    /// `hit_tokens / input_tokens`.
    pub hit_ratio: f64,
    /// Tokens evicted.
    pub evicted_tokens: u64,
    /// Tokens cached at the end.
    pub cached_tokens: u64,
    /// Tokens newly cached by inserts.
    pub inserted_tokens: u64,
    /// Tree nodes at the end.
    pub nodes: u64,
    /// Live namespaces at the end (those with a cached page: an emptied one is reclaimed).
    pub namespaces: u64,
    /// Generated tokens cached (`--with-output`).
    pub output_tokens: u64,
    /// Requests longer than the capacity (counted as misses).
    pub skipped_requests: u64,
    /// Their tokens.
    pub skipped_tokens: u64,
    /// Outputs not cached because prompt + output exceeds the capacity.
    pub skipped_outputs: u64,
    /// Requests given up on because every slot stayed pinned by other threads.
    pub out_of_slots: u64,
    /// Deferrals by in-batch prefix sharing.
    pub deferred: u64,
    /// Scheduling rounds.
    pub rounds: u64,
    /// Replay time (loading excluded).
    pub wall_s: f64,
    /// Requests per second.
    pub requests_per_s: f64,
    /// Input tokens per second.
    pub tokens_per_s: f64,
    /// `match_and_lock` median, µs.
    pub match_p50_us: f64,
    /// `match_and_lock` 99th percentile, µs.
    pub match_p99_us: f64,
    /// `insert` median, µs.
    pub insert_p50_us: f64,
    /// `insert` 99th percentile, µs.
    pub insert_p99_us: f64,
    /// Eviction median, µs (0 without evictions).
    pub evict_p50_us: f64,
    /// Eviction 99th percentile, µs (0 without evictions).
    pub evict_p99_us: f64,
    /// Eviction calls.
    pub evictions: u64,
    /// Peak RSS of the whole process (VmHWM): the trace, the index, the slot pool, the
    /// latency samples, and in a sweep every capacity replayed so far.
    pub peak_rss_bytes: u64,
    /// Heap bytes the index itself holds at the end of the replay
    /// (`RadixTree::memory_bytes`: nodes with their edges' tokens and slots, child tables,
    /// the namespace table, the eviction index), from a walk of the tree once the workers
    /// are done.
    pub index_bytes: u64,
    /// `index_bytes / cached_tokens`; `null` when nothing is cached.
    pub index_bytes_per_token: Option<f64>,
    /// KV bytes one token takes (`--kv-bytes-per-token` or the model shape); `null` when
    /// not given, and so are all the `*_kv_*` fields.
    pub kv_bytes_per_token: Option<u64>,
    /// The model shape the KV size came from, when one was given.
    pub kv_model: Option<String>,
    /// `capacity x kv_bytes_per_token` (`null` for unlimited).
    pub capacity_kv_bytes: Option<u64>,
    /// The same in GiB (2^30 bytes).
    pub capacity_kv_gib: Option<f64>,
    /// KV bytes of the tokens cached at the end.
    pub cached_kv_bytes: Option<u64>,
    /// The same in GiB.
    pub cached_kv_gib: Option<f64>,
    /// KV bytes of the hit tokens (reused instead of recomputed), over the whole replay.
    pub hit_kv_bytes: Option<u64>,
    /// The same in GiB.
    pub hit_kv_gib: Option<f64>,
    /// `index_bytes / cached_kv_bytes`: what the index costs beside the KV it indexes.
    pub index_kv_ratio: Option<f64>,
    /// Worker threads.
    pub threads: u64,
    /// Page size.
    pub page_size: u64,
    /// Capacity in tokens (pool slots), `null` for unlimited.
    pub capacity: Option<u64>,
    /// Eviction policy.
    pub policy: String,
    /// Schedule.
    pub schedule: String,
    /// Window size.
    pub window: u64,
    /// Whether outputs were cached.
    pub with_output: bool,
    /// The KV events published (`--kv-events`); `null` with events off.
    pub events: Option<EventsReport>,
    /// The host tier (`--host-capacity`); `null` without one. With a host tier,
    /// `hit_tokens` and `hit_ratio` are the device hits alone.
    pub tier: Option<TierReport>,
    /// A sweep's replay of the same capacity with the host tier (`sweep --host-capacity`),
    /// beside this device-only one; not in the JSON.
    #[serde(skip)]
    pub with_host: Option<Box<Report>>,
}

/// What the host tier did (`--host-capacity`): hits on each level and the copies between
/// them. The copier is the index-only one: copies are counted, no KV byte moves, and the
/// copy times are the bytes over the assumed `host_link_gbps`, not measurements.
#[derive(Debug, Clone, Serialize)]
pub struct TierReport {
    /// Host slots (tokens; `--host-capacity` rounded down to whole pages).
    pub host_capacity: u64,
    /// `write_through`, `write_through_selective` or `write_back`.
    pub write_policy: String,
    /// `write_through_selective`'s hit threshold (`--write-threshold`).
    pub write_threshold: u32,
    /// Shortest load-back done, tokens (`--load-back-min`).
    pub load_back_min: u64,
    /// The copier the replay used.
    pub copier: String,
    /// Prompt tokens matched on the device (the report's `hit_tokens`).
    pub device_hit_tokens: u64,
    /// `device_hit_tokens / input_tokens` (the report's `hit_ratio`).
    pub device_hit_ratio: f64,
    /// Tokens the host extended device matches by, as each match found them (SGLang's
    /// `host_hit_length`, summed); the load-backs took these or fewer.
    pub host_match_tokens: u64,
    /// Host hits: prompt tokens loaded back host → device (equal to `tokens_to_device`).
    pub host_hit_tokens: u64,
    /// `host_hit_tokens / input_tokens`.
    pub host_hit_ratio: f64,
    /// `device_hit_tokens + host_hit_tokens`: prompt tokens not recomputed.
    pub combined_hit_tokens: u64,
    /// `combined_hit_tokens / input_tokens`.
    pub combined_hit_ratio: f64,
    /// Tokens copied device → host (backups and write-backs).
    pub tokens_to_host: u64,
    /// Tokens copied host → device (load-backs).
    pub tokens_to_device: u64,
    /// Of `tokens_to_host`, those written back by a device eviction (`write_back`).
    pub tokens_written_back: u64,
    /// Copies device → host.
    pub copies_to_host: u64,
    /// Copies host → device.
    pub copies_to_device: u64,
    /// `(copies_to_host + copies_to_device) / requests`.
    pub copies_per_request: f64,
    /// Tokens per copy, both directions; `null` without copies.
    pub tokens_per_copy: Option<f64>,
    /// Load-backs that loaded pages.
    pub load_backs: u64,
    /// Load-backs not done (shorter than `load_back_min`, or nothing left on the host).
    pub load_backs_skipped: u64,
    /// Load-backs refused because the device could not hold the pages (every slot pinned).
    pub load_back_out_of_slots: u64,
    /// Copies that failed (none with the index-only copier).
    pub copy_failures: u64,
    /// Host pages evicted.
    pub host_evicted_pages: u64,
    /// The same in tokens.
    pub host_evicted_tokens: u64,
    /// Host slots holding a copy at the end.
    pub host_cached_tokens: u64,
    /// Of those pages, the ones also on the device at the end.
    pub host_resident_pages: u64,
    /// Host ↔ device bandwidth assumed for the copy times, GB/s (`--host-link-gbps`).
    pub host_link_gbps: f64,
    /// KV bytes copied device → host (with a KV size; `null` without).
    pub bytes_to_host: Option<u64>,
    /// KV bytes copied host → device.
    pub bytes_to_device: Option<u64>,
    /// `bytes_to_host / host_link_gbps`, seconds: an estimate, not a measurement.
    pub copy_time_to_host_s: Option<f64>,
    /// `bytes_to_device / host_link_gbps`, seconds: an estimate, not a measurement.
    pub copy_time_to_device_s: Option<f64>,
}

/// What a replay published (`--kv-events`), counted once the publisher's thread has taken
/// every batch (before the linger).
#[derive(Debug, Clone, Serialize)]
pub struct EventsReport {
    /// The PUB endpoint, as bound (a `*` port resolved) or as connected to.
    pub endpoint: String,
    /// The replay (ROUTER) endpoint as bound, if any.
    pub replay_endpoint: Option<String>,
    /// `vllm-array` or `vllm-map`.
    pub format: String,
    /// `xxh3` or `sglang`.
    pub hash: String,
    /// The topic frame.
    pub topic: String,
    /// Batches closed (sequence numbers 0 to `batches - 1`): one per request that changed
    /// the cached pages.
    pub batches: u64,
    /// Events pushed by the cache (adjacent removals travel merged into one on the wire).
    pub events: u64,
    /// Batches sent on the PUB socket (to every subscriber connected then).
    pub published: u64,
    /// Batches dropped whole because the publisher's queue was full (a gap in `seq`).
    pub dropped: u64,
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// A token count in short form: `2.5M`, `120k`, `512`.
pub fn short(n: f64) -> String {
    let (v, unit) = if n >= 1e9 {
        (n / 1e9, "G")
    } else if n >= 1e6 {
        (n / 1e6, "M")
    } else if n >= 1e3 {
        (n / 1e3, "k")
    } else {
        (n, "")
    };
    let s = if v >= 100.0 || v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v:.3}") };
    let s =
        if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    format!("{s}{unit}")
}

/// A capacity for people: `unlimited`, `2,000,000 tokens`, or with a KV size
/// `2,000,000 tokens (244.14 GiB)`.
pub fn capacity_label(c: Option<u64>, kv: Option<&KvSize>) -> String {
    match (c, kv) {
        (None, _) => "unlimited".to_string(),
        (Some(c), None) => format!("{} tokens", thousands(c)),
        (Some(c), Some(kv)) => format!(
            "{} tokens ({})",
            thousands(c),
            bytes_label(c.saturating_mul(kv.bytes_per_token))
        ),
    }
}

impl Report {
    /// Fills the `*_kv_*` fields from `kv` (clears them without one).
    pub fn set_kv(&mut self, kv: Option<&KvSize>) {
        let b = kv.map(|k| k.bytes_per_token);
        let bytes = |tokens: u64| b.map(|b| tokens.saturating_mul(b));
        self.kv_bytes_per_token = b;
        self.kv_model = kv.and_then(|k| k.model.clone());
        self.capacity_kv_bytes = self.capacity.and_then(bytes);
        self.capacity_kv_gib = self.capacity_kv_bytes.map(gib);
        self.cached_kv_bytes = bytes(self.cached_tokens);
        self.cached_kv_gib = self.cached_kv_bytes.map(gib);
        self.hit_kv_bytes = bytes(self.hit_tokens);
        self.hit_kv_gib = self.hit_kv_bytes.map(gib);
        self.index_kv_ratio =
            self.cached_kv_bytes.filter(|&c| c > 0).map(|c| self.index_bytes as f64 / c as f64);
    }

    /// The KV size the report was made with.
    pub fn kv(&self) -> Option<KvSize> {
        self.kv_bytes_per_token.map(|b| KvSize { bytes_per_token: b, model: self.kv_model.clone() })
    }
}

impl Report {
    /// The short human-readable report.
    pub fn human(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "radixkv replay: {} ({} requests, {} input tokens)",
            self.trace,
            thousands(self.requests),
            thousands(self.input_tokens)
        );
        let _ = writeln!(
            s,
            "  cache     capacity {}, page size {}, {} eviction; {} thread{}, schedule {} (window {}){}",
            capacity_label(self.capacity, self.kv().as_ref()),
            self.page_size,
            self.policy,
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            self.schedule,
            self.window,
            if self.with_output { ", outputs cached" } else { "" }
        );
        let _ = writeln!(
            s,
            "  hits      {} of {} tokens = {:.6} ({:.2}%)",
            thousands(self.hit_tokens),
            thousands(self.input_tokens),
            self.hit_ratio,
            100.0 * self.hit_ratio
        );
        let _ = writeln!(
            s,
            "  cache     {} tokens cached in {} nodes and {} namespaces at the end, {} inserted, {} evicted ({} evictions)",
            thousands(self.cached_tokens),
            thousands(self.nodes),
            thousands(self.namespaces),
            thousands(self.inserted_tokens),
            thousands(self.evicted_tokens),
            thousands(self.evictions)
        );
        if self.with_output {
            let _ = writeln!(
                s,
                "  outputs   {} generated tokens cached",
                thousands(self.output_tokens)
            );
        }
        if self.skipped_requests + self.skipped_outputs + self.out_of_slots > 0 {
            let _ = writeln!(
                s,
                "  skipped   {} requests longer than the capacity ({} tokens, counted as misses), {} outputs, {} out of slots",
                thousands(self.skipped_requests),
                thousands(self.skipped_tokens),
                thousands(self.skipped_outputs),
                thousands(self.out_of_slots)
            );
        }
        if self.deferred > 0 {
            let _ = writeln!(
                s,
                "  schedule  {} deferrals (in-batch prefix sharing) over {} rounds",
                thousands(self.deferred),
                thousands(self.rounds)
            );
        }
        let _ = writeln!(
            s,
            "  speed     {:.3} s: {:.0} requests/s, {} tokens/s",
            self.wall_s,
            self.requests_per_s,
            short(self.tokens_per_s)
        );
        let evict = if self.evictions == 0 {
            "no evictions".to_string()
        } else {
            format!("evict p50 {:.1} µs p99 {:.1} µs", self.evict_p50_us, self.evict_p99_us)
        };
        let _ = writeln!(
            s,
            "  latency   match p50 {:.1} µs p99 {:.1} µs; insert p50 {:.1} µs p99 {:.1} µs; {evict}",
            self.match_p50_us, self.match_p99_us, self.insert_p50_us, self.insert_p99_us
        );
        let per_token = self
            .index_bytes_per_token
            .map_or("nothing cached".to_string(), |b| format!("{b:.2} bytes per cached token"));
        let _ = writeln!(
            s,
            "  index     {} = {per_token} (the tree's own heap at the end: nodes, edge tokens and slots, child tables, eviction index)",
            bytes_label(self.index_bytes)
        );
        if let (Some(b), Some(cached), Some(hit)) =
            (self.kv_bytes_per_token, self.cached_kv_bytes, self.hit_kv_bytes)
        {
            let model = self.kv_model.as_ref().map_or(String::new(), |m| format!(" ({m})"));
            let ratio = self.index_kv_ratio.map_or(String::new(), |r| {
                format!("; the index is {:.4}% of the cached KV", 100.0 * r)
            });
            let _ = writeln!(
                s,
                "  kv        {} bytes per token{model}: {} cached at the end, {} of KV reused by hits{ratio}",
                thousands(b),
                bytes_label(cached),
                bytes_label(hit)
            );
        }
        if let Some(t) = &self.tier {
            t.human(&mut s);
        }
        if let Some(e) = &self.events {
            let replay =
                e.replay_endpoint.as_ref().map_or(String::new(), |r| format!(", replay on {r}"));
            let _ = writeln!(
                s,
                "  events    {} batches, {} events on {} ({}, {} hashes{replay}): {} published, {} dropped",
                thousands(e.batches),
                thousands(e.events),
                e.endpoint,
                e.format,
                e.hash,
                thousands(e.published),
                thousands(e.dropped)
            );
        }
        let _ = writeln!(
            s,
            "  memory    peak RSS of the process {} (trace, index, slot pool, latency samples)",
            bytes_label(self.peak_rss_bytes)
        );
        s
    }
}

impl TierReport {
    /// The report's host-tier lines.
    fn human(&self, s: &mut String) {
        let threshold = if self.write_policy == "write_through_selective" {
            format!(" (threshold {})", self.write_threshold)
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "  host      {} tokens, {}{threshold}, load-back min {}; copier {}",
            thousands(self.host_capacity),
            self.write_policy,
            thousands(self.load_back_min),
            self.copier
        );
        let _ = writeln!(
            s,
            "  tier hits device {} = {:.6}, host {} = {:.6} (loaded back), device + host {} = {:.6} ({:.2}%)",
            thousands(self.device_hit_tokens),
            self.device_hit_ratio,
            thousands(self.host_hit_tokens),
            self.host_hit_ratio,
            thousands(self.combined_hit_tokens),
            self.combined_hit_ratio,
            100.0 * self.combined_hit_ratio
        );
        let per_copy = self.tokens_per_copy.map_or("-".to_string(), |t| format!("{t:.1}"));
        let _ = writeln!(
            s,
            "  copies    device -> host {} tokens in {} copies ({} written back), host -> device {} tokens in {} copies; {:.3} copies per request, {per_copy} tokens per copy",
            thousands(self.tokens_to_host),
            thousands(self.copies_to_host),
            thousands(self.tokens_written_back),
            thousands(self.tokens_to_device),
            thousands(self.copies_to_device),
            self.copies_per_request
        );
        let _ = writeln!(
            s,
            "  host end  {} tokens held, {} pages also on the device; {} pages evicted ({} tokens); {} load-backs, {} skipped, {} out of slots",
            thousands(self.host_cached_tokens),
            thousands(self.host_resident_pages),
            thousands(self.host_evicted_pages),
            thousands(self.host_evicted_tokens),
            thousands(self.load_backs),
            thousands(self.load_backs_skipped),
            thousands(self.load_back_out_of_slots)
        );
        if let (Some(h), Some(d), Some(th), Some(td)) = (
            self.bytes_to_host,
            self.bytes_to_device,
            self.copy_time_to_host_s,
            self.copy_time_to_device_s,
        ) {
            let _ = writeln!(
                s,
                "  link      {} device -> host, {} host -> device: {th:.3} s + {td:.3} s at an assumed {} GB/s (an estimate, not measured)",
                bytes_label(h),
                bytes_label(d),
                self.host_link_gbps
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let mut s = Samples::default();
        assert_eq!(s.percentile_us(99.0), 0.0);
        for i in 1..=100u64 {
            s.push(Duration::from_nanos(i * 1000));
        }
        assert_eq!(s.percentile_us(50.0), 50.0);
        assert_eq!(s.percentile_us(99.0), 99.0);
        assert_eq!(s.percentile_us(100.0), 100.0);
        assert_eq!(s.percentile_us(0.0), 1.0);
        assert_eq!(s.len(), 100);
    }

    #[test]
    fn number_formats() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(61194628), "61,194,628");
        assert_eq!(short(2_000_000.0), "2M");
        assert_eq!(short(1_500.0), "1.5k");
        assert_eq!(short(61_194_628.0), "61.195M");
        assert_eq!(short(512.0), "512");
        assert_eq!(capacity_label(None, None), "unlimited");
        assert_eq!(capacity_label(Some(2_000_000), None), "2,000,000 tokens");
        let kv = KvSize { bytes_per_token: 131_072, model: None };
        assert_eq!(capacity_label(Some(2_000_000), Some(&kv)), "2,000,000 tokens (244.14 GiB)");
    }

    #[test]
    fn rss_is_read() {
        if std::path::Path::new("/proc/self/status").exists() {
            assert!(peak_rss_bytes() > 0);
        }
    }
}
