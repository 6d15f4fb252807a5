//! The replay engine: requests through one cache, the way a serving engine would run them.
//!
//! Per request: `match_and_lock` the prompt (its length is the hit), take slots for the
//! uncached page-aligned rest (pool mode: evict the shortfall, then `alloc`; unlimited
//! capacity: fresh slot numbers from a counter), `insert`, release the lock. With
//! `with_output`, the prompt is inserted with `insert_and_lock` instead, and the prompt plus
//! `output_length` fresh token ids (unique across the run) is inserted after it. Slots are
//! passed as runs end to end (`match_and_lock` into runs, `alloc_runs`, `insert` of `Slots::Runs`), as an
//! engine using the pool would: no call lists them one by one.
//!
//! With a host tier ([`Config::host`], `--host-capacity`) the cache is built with host
//! options ([`Cache::with_host`]) and the same cycle runs through it: the match also says
//! how far host copies extend the device hit, and then those pages are loaded back
//! (`load_back`, waited for, the device prefix kept pinned meanwhile) before slots are
//! taken for the rest; device evictions go through the tier (host copies stay,
//! `write_back` copies the page to the host first). Unlike the device-only replay, a prompt
//! found whole is inserted too (SGLang's `cache_finished_req` inserts every finished
//! request): that insert is what counts a page's hits for `write_through_selective`. The
//! host tier's own parts (its options, counts and report section) are [`super::tiered`].
//!
//! N worker threads share the cache and pull from one [`WindowQueue`].
//!
//! With [`Config::events`] the cache publishes its KV events (`--kv-events`): each worker
//! closes a batch after each of its requests (`Cache::flush_events`), as an engine closes
//! one per scheduler step; with several threads a batch holds whatever the cache pushed
//! since the last flush, whichever thread pushed it.

use super::kv::KvSize;
use super::report::{EventsReport, Latencies, Report, peak_rss_bytes};
use super::tiered::{HostTier, TierCounts, add, tier_options, tier_report};
use crate::sched::{PrefixOracle, Schedule, Scheduler, WindowQueue};
use indicatif::{ProgressBar, ProgressStyle};
use radixkv::events::hash::HashMode;
use radixkv::tier::NullCopier;
use radixkv::{
    Cache, CacheOptions, Error, EventOptions, EvictionPolicy, InsertOptions, PrefixLock, SlotRun,
};
use radixkv_publisher::{Publisher, PublisherOptions, binds};
use radixkv_trace::{Request, Trace};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How to replay.
#[derive(Debug, Clone)]
pub struct Config {
    /// KV capacity in tokens (`None`: unlimited, no pool).
    pub capacity: Option<u64>,
    /// Page size.
    pub page_size: usize,
    /// Eviction policy.
    pub policy: EvictionPolicy,
    /// SLRU's protected threshold (hits), read by the `slru` policy.
    pub slru_threshold: u32,
    /// Worker threads.
    pub threads: usize,
    /// Window ordering.
    pub schedule: Schedule,
    /// Window size.
    pub window: usize,
    /// In-batch sharing threshold (cache-aware schedules; 0: off).
    pub defer_threshold: usize,
    /// Seed of the `random` schedule.
    pub seed: u64,
    /// Also cache generated tokens.
    pub with_output: bool,
    /// The progress bar to advance by one per request (its owner draws and clears it).
    pub progress: Option<ProgressBar>,
    /// KV bytes per token, for the report's byte figures.
    pub kv: Option<KvSize>,
    /// Publish the cache's KV events (`None`: events off).
    pub events: Option<Events>,
    /// A host tier behind the device pool (`None`: the device cache alone).
    pub host: Option<HostTier>,
}

/// How a replay publishes its KV events.
#[derive(Debug, Clone)]
pub struct Events {
    /// The page hash.
    pub hash_mode: HashMode,
    /// The publisher (endpoints, encoding, topic, linger).
    pub publisher: PublisherOptions,
}

/// How long the report waits for the publisher's thread to take every batch (so that
/// `published` is final); it never waits on a subscriber, which the socket drops for.
const DRAIN_WAIT: Duration = Duration::from_secs(30);

/// How often an allocation that finds every slot pinned by other threads is retried.
pub(super) const ALLOC_RETRIES: u32 = 2_000;

/// Counters of one worker thread.
#[derive(Default)]
pub(super) struct Counts {
    pub(super) requests: u64,
    pub(super) input_tokens: u64,
    pub(super) hit_tokens: u64,
    pub(super) skipped_requests: u64,
    pub(super) skipped_tokens: u64,
    pub(super) skipped_outputs: u64,
    pub(super) out_of_slots: u64,
    pub(super) output_tokens: u64,
    pub(super) lat: Latencies,
}

impl Counts {
    pub(super) fn merge(&mut self, o: Counts) {
        self.requests += o.requests;
        self.input_tokens += o.input_tokens;
        self.hit_tokens += o.hit_tokens;
        self.skipped_requests += o.skipped_requests;
        self.skipped_tokens += o.skipped_tokens;
        self.skipped_outputs += o.skipped_outputs;
        self.out_of_slots += o.out_of_slots;
        self.output_tokens += o.output_tokens;
        self.lat.merge(o.lat);
    }
}

/// What the workers share.
struct Shared<'a> {
    cache: &'a Cache,
    cfg: &'a Config,
    /// Pool size (0: unlimited).
    pool: usize,
    /// Next fresh slot (unlimited capacity).
    next_slot: AtomicU64,
    /// Fresh output token ids are taken downwards from here (exclusive).
    next_out_token: AtomicU64,
    /// ... and never at or below this.
    out_token_floor: u64,
    /// The host tier, if the cache has one.
    host: Option<&'a HostTier>,
    /// Counts of the host tier's request cycle.
    t: TierCounts,
}

fn cache_err(what: &str, e: Error) -> String {
    format!("cache {what} failed: {e}")
}

impl Shared<'_> {
    /// Appends `n` slots to `runs`. `Ok(false)`: the pool stayed short (every slot pinned).
    fn take_slots(
        &self,
        n: usize,
        runs: &mut Vec<SlotRun>,
        c: &mut Counts,
    ) -> Result<bool, String> {
        if n == 0 {
            return Ok(true);
        }
        if self.pool == 0 {
            let start = self.next_slot.fetch_add(n as u64, Ordering::Relaxed);
            if start + n as u64 > 1 << 32 || n as u64 > u32::MAX as u64 {
                return Err("more than 2^32 slots handed out: slot ids exhausted".into());
            }
            runs.push(SlotRun { start: start as u32, len: n as u32 });
            return Ok(true);
        }
        let mut attempt = 0;
        loop {
            let free = self.cache.stats().free_slots as usize;
            if free < n {
                let t = Instant::now();
                self.cache.evict(n - free, None).map_err(|e| cache_err("evict", e))?;
                c.lat.evict.push(t.elapsed());
            }
            match self.cache.alloc_runs(n, runs) {
                Ok(()) => return Ok(true),
                Err(Error::OutOfSlots { .. }) if attempt < ALLOC_RETRIES => {
                    // Other threads pin what is left; wait for them to release.
                    attempt += 1;
                    if attempt < 16 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
                Err(Error::OutOfSlots { .. }) => return Ok(false),
                Err(e) => return Err(cache_err("alloc", e)),
            }
        }
    }

    /// `n >= 1` token ids never used before in this run.
    fn fresh_tokens(&self, n: usize) -> Result<std::ops::RangeInclusive<u32>, String> {
        let floor = self.out_token_floor;
        let prev = self
            .next_out_token
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| cur.checked_sub(n as u64).filter(|&lo| lo >= floor))
            .map_err(|_| "out of fresh token ids for generated outputs (every u32 id above the trace's is used)".to_string())?;
        let lo = prev - n as u64;
        Ok(lo as u32..=(prev - 1) as u32)
    }

    fn run_request(
        &self,
        ns: u64,
        tokens: &[u32],
        output_length: usize,
        priority: i32,
        runs: &mut Vec<SlotRun>,
        c: &mut Counts,
    ) -> Result<(), String> {
        let page = self.cfg.page_size;
        let len = tokens.len();
        // The request's first insert: every node on its path counts a hit (SGLang's
        // `cache_inserted_len` is 0 before it).
        let first = InsertOptions { priority, inserted_len: 0 };
        let n = len / page * page;
        c.requests += 1;
        c.input_tokens += len as u64;
        if self.pool > 0 && n > self.pool {
            c.skipped_requests += 1;
            c.skipped_tokens += len as u64;
            return Ok(());
        }
        // With a host tier, the page-aligned prompt (what a load-back and the insert take).
        let query = if self.host.is_some() { &tokens[..n] } else { tokens };
        let t = Instant::now();
        let (guard, found) = self.cache.lookup_and_lock(ns, query, runs);
        c.lat.matching.push(t.elapsed());
        let m = guard.len();
        let got = runs.iter().map(|r| r.len as usize).sum::<usize>();
        if got != m || m > n || !m.is_multiple_of(page) {
            return Err(format!(
                "cache match_and_lock_runs returned {got} slots for a {m}-token lock (aligned query {n})"
            ));
        }
        c.hit_tokens += m as u64;
        add(&self.t.host_match_tokens, found.host_len as u64);
        // The device prefix, then the pages loaded back and the prompt, pinned by `locks`.
        let mut locks = vec![guard.into_raw()];
        let mut have = m;
        if found.host_len > 0 {
            have = self.load_back(ns, &tokens[..n], m, found.host_len, runs, &mut locks)?;
        }
        if !self.take_slots(n - have, runs, c)? {
            c.out_of_slots += 1;
            return self.release(locks);
        }
        let with_output = self.cfg.with_output && output_length > 0;
        // With a host tier a prompt found whole is inserted too (see the module docs).
        if n > m || (self.host.is_some() && n > 0) {
            let t = Instant::now();
            if with_output {
                let (_, l) = self
                    .cache
                    .insert_and_lock(ns, &tokens[..n], &*runs, first)
                    .map_err(|e| cache_err("insert_and_lock_runs", e))?;
                locks.push(l.into_raw());
            } else {
                self.cache
                    .insert_with(ns, &tokens[..n], &*runs, first)
                    .map_err(|e| cache_err("insert_runs", e))?;
            }
            c.lat.insert.push(t.elapsed());
        }
        if with_output {
            let opts = InsertOptions { priority, inserted_len: n };
            self.run_output(ns, tokens, output_length, opts, runs, c)?;
        }
        if self.host.is_none() {
            locks.reverse(); // the device-only replay lets the prompt's lock go first
        }
        self.release(locks)?;
        // Between requests, as an engine would once per step: the epoch's deferred frees run
        // here instead of inside a timed match, insert or evict.
        self.cache.reclaim();
        Ok(())
    }

    /// Loads back the host pages that extend the device prefix of `m` tokens of the aligned
    /// prompt `tokens`, at most `host_len` tokens (what the lookup found: with threads, other
    /// requests may back more up meanwhile, and a request loads what it was admitted with,
    /// so the report's host hits never exceed its host matches), and waits for them; `runs` become the slots of the prefix the
    /// load-back's lock (pushed to `locks`) pins. Returns how many tokens that lock pins
    /// (`m` when the device had no room: counted, not an error).
    fn load_back(
        &self,
        ns: u64,
        tokens: &[u32],
        m: usize,
        host_len: usize,
        runs: &mut Vec<SlotRun>,
        locks: &mut Vec<PrefixLock>,
    ) -> Result<usize, String> {
        match self.cache.load_back(ns, tokens, host_len.min(tokens.len() - m)) {
            Ok(ticket) => {
                let l = self.cache.wait_load(ticket).map_err(|e| cache_err("load_back", e))?;
                if l.loaded > 0 {
                    add(&self.t.load_backs, 1);
                    add(&self.t.loaded_tokens, l.loaded as u64);
                }
                // Its lock covers at least the device prefix (pinned by the match's since).
                let have = l.lock.len();
                runs.clear();
                SlotRun::push_runs_of(&l.slots, runs);
                locks.push(l.lock);
                Ok(have)
            }
            Err(Error::OutOfSlots { .. }) => {
                add(&self.t.load_back_out_of_slots, 1);
                Ok(m)
            }
            Err(e) => Err(cache_err("load_back", e)),
        }
    }

    /// Releases a request's locks, in order.
    fn release(&self, locks: Vec<PrefixLock>) -> Result<(), String> {
        for l in locks {
            self.cache.release(l).map_err(|e| cache_err("release", e))?;
        }
        Ok(())
    }

    /// Caches prompt + generated tokens; the prompt's `opts.inserted_len` aligned tokens are
    /// pinned (and inserted by this request already).
    fn run_output(
        &self,
        ns: u64,
        tokens: &[u32],
        out_len: usize,
        opts: InsertOptions,
        runs: &mut Vec<SlotRun>,
        c: &mut Counts,
    ) -> Result<(), String> {
        let n = opts.inserted_len;
        let page = self.cfg.page_size;
        let nf = (tokens.len() + out_len) / page * page;
        if nf <= n {
            return Ok(());
        }
        if self.pool > 0 && nf > self.pool {
            c.skipped_outputs += 1;
            return Ok(());
        }
        let mut full = Vec::with_capacity(tokens.len() + out_len);
        full.extend_from_slice(tokens);
        full.extend(self.fresh_tokens(out_len)?);
        let got = self.cache.match_prefix(ns, &tokens[..n], runs);
        if got != n {
            return Err(format!(
                "cache lost a pinned prefix: {got} of {n} pinned tokens still match"
            ));
        }
        if !self.take_slots(nf - n, runs, c)? {
            c.out_of_slots += 1;
            return Ok(());
        }
        let t = Instant::now();
        // The prompt's `n` tokens were inserted by this request already (`opts.inserted_len`):
        // only the nodes past them count a hit (SGLang's `cache_inserted_len`).
        self.cache
            .insert_with(ns, &full[..nf], &*runs, opts)
            .map_err(|e| cache_err("insert_runs", e))?;
        c.lat.insert.push(t.elapsed());
        // Whole pages only: the generated tokens cached are those inside the `nf` aligned
        // tokens (`nf > n` means `nf` passes the prompt's end).
        c.output_tokens += (nf - tokens.len()) as u64;
        Ok(())
    }
}

/// The pool's slots: the capacity rounded down to whole pages (0: unlimited).
pub(super) fn pool_slots(cfg: &Config) -> Result<usize, String> {
    let page = cfg.page_size;
    Ok(match cfg.capacity {
        None => 0,
        Some(c) => {
            let p = (c / page as u64) * page as u64;
            if p == 0 {
                return Err(format!("capacity {c} is smaller than one page ({page} tokens)"));
            }
            usize::try_from(p).map_err(|_| format!("capacity {c} too large for this machine"))?
        }
    })
}

/// Replays `trace` under `cfg` (its publisher, if any, stopped before returning).
pub fn replay(trace: &Trace, cfg: &Config) -> Result<Report, String> {
    let (r, publisher) = replay_publishing(trace, cfg)?;
    drop(publisher);
    Ok(r)
}

/// Starts the publisher of `cache` (events enabled on it first) and says on stderr where
/// it publishes.
fn start_events(cache: &mut Cache, ev: &Events) -> Result<Publisher, String> {
    let opts = EventOptions { hash_mode: ev.hash_mode, ..Default::default() };
    cache.enable_events(opts).map_err(|e| format!("cannot enable KV events: {e}"))?;
    let p = cache.event_sink().and_then(|s| Publisher::start(s, ev.publisher.clone())).map_err(
        |e| match e {
            // The refusal's message (its field, not its text parsed back), without the
            // library's "events: ", which says nothing here.
            radixkv::Error::InvalidArgument(m) => {
                format!("cannot publish KV events: {}", m.strip_prefix("events: ").unwrap_or(&m))
            }
            other => format!("cannot publish KV events: {other}"),
        },
    )?;
    let how = if binds(&ev.publisher.endpoint) { "bound" } else { "connecting" };
    let replay = p.replay_endpoint().map_or(String::new(), |r| format!(", replay on {r}"));
    eprintln!("radixkv: KV events on {} ({how}){replay}", p.endpoint());
    Ok(p)
}

/// [`replay`], returning the running publisher (with `cfg.events`) for the caller to stop
/// once the report is out: stopping sends the tail and lingers.
pub fn replay_publishing(
    trace: &Trace,
    cfg: &Config,
) -> Result<(Report, Option<Publisher>), String> {
    let page = cfg.page_size;
    let pool = pool_slots(cfg)?;
    let opts = CacheOptions {
        page_size: page,
        policy: cfg.policy,
        pool_slots: pool,
        slru_threshold: cfg.slru_threshold,
        swa_window: 0,
    };
    let mut cache = match &cfg.host {
        None => Cache::new(opts).map_err(|e| format!("cannot create the cache: {e}"))?,
        // The index-only copier: no KV bytes move, every copy is done when it starts.
        Some(h) => {
            Cache::with_host(opts, tier_options(h, page, pool)?, Arc::new(NullCopier::default()))
                .map_err(|e| format!("cannot create the tiered cache: {e}"))?
        }
    };
    let publisher = match &cfg.events {
        Some(ev) => Some(start_events(&mut cache, ev)?),
        None => None,
    };
    let cache = cache;
    let shared = Shared {
        cache: &cache,
        cfg,
        pool,
        next_slot: AtomicU64::new(0),
        next_out_token: AtomicU64::new(u32::MAX as u64 + 1),
        out_token_floor: trace.max_token().map_or(0, |t| t as u64 + 1),
        host: cfg.host.as_ref(),
        t: TierCounts::default(),
    };
    let (total, rounds, wall) = run_workers(
        trace,
        cfg,
        &cache,
        Vec::new,
        |r, runs, c| {
            shared.run_request(r.namespace, &r.tokens, r.output_length, r.priority, runs, c)
        },
        // One batch per request (none when it changed no page; a no-op with events off).
        || {
            cache.flush_events();
        },
    )?;
    if cache.has_tier() {
        // NullCopier: nothing is in flight; wait anyway, then check the tier at rest.
        cache.wait_all();
        if let Some(Err(e)) = cache.check_tier() {
            return Err(format!("the tiered cache is inconsistent after the replay: {e}"));
        }
    }
    let events = publisher.as_ref().map(|p| events_report(&cache, p, cfg));
    let mut report = build_report(trace, cfg, total, rounds, &cache, pool, wall, events);
    if let Some(h) = &cfg.host {
        report.tier = Some(tier_report(&cache, h, &shared.t, &report, cfg.kv.as_ref()));
    }
    Ok((report, publisher))
}

/// Runs `trace`'s requests on `cfg.threads` worker threads pulling from one
/// [`WindowQueue`] ordered by `oracle`: `request` runs each (with the thread's `state`),
/// `after` follows each. Returns the merged counts, the queue's `(rounds, deferrals)` and
/// the wall time; the first error stops every thread.
pub(super) fn run_workers<S>(
    trace: &Trace,
    cfg: &Config,
    oracle: &(dyn PrefixOracle + Sync),
    state: impl Fn() -> S + Sync,
    request: impl Fn(&Request, &mut S, &mut Counts) -> Result<(), String> + Sync,
    after: impl Fn() + Sync,
) -> Result<(Counts, (u64, u64), Duration), String> {
    let scheduler = Scheduler::new(cfg.schedule, cfg.defer_threshold, cfg.seed)
        .with_concurrency(cfg.threads.max(1));
    let queue = Mutex::new(WindowQueue::new(trace.iter(), scheduler, cfg.window));
    let bar = cfg.progress.clone().unwrap_or_else(ProgressBar::hidden);
    let abort = AtomicBool::new(false);
    let first_error: Mutex<Option<String>> = Mutex::new(None);
    let threads = cfg.threads.max(1);

    let start = Instant::now();
    let results: Vec<Counts> = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let spawned = std::thread::Builder::new().spawn_scoped(s, || {
                let mut c = Counts::default();
                let mut st = state();
                while !abort.load(Ordering::Relaxed) {
                    let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next(oracle);
                    let Some(d) = next else { break };
                    if let Err(e) = request(&d.request, &mut st, &mut c) {
                        abort.store(true, Ordering::Relaxed);
                        first_error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                        break;
                    }
                    after();
                    bar.inc(1);
                }
                c
            });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // The threads already running stop at their next request.
                    abort.store(true, Ordering::Relaxed);
                    first_error
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert(format!("cannot start thread {} of {threads}: {e}", i + 1));
                    break;
                }
            }
        }
        handles.into_iter().map(|h| h.join().unwrap_or_default()).collect()
    });
    let wall = start.elapsed();
    if let Some(e) = first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let mut total = Counts::default();
    for c in results {
        total.merge(c);
    }
    if total.requests != trace.len() as u64 {
        return Err(format!(
            "a worker thread died: {} of {} requests replayed",
            total.requests,
            trace.len()
        ));
    }
    let (rounds, deferred) = {
        let q = queue.lock().unwrap_or_else(|e| e.into_inner());
        (q.rounds(), q.deferrals())
    };
    Ok((total, (rounds, deferred), wall))
}

/// The report of a replay whose workers are joined: their merged counts, the queue's
/// `(rounds, deferrals)`, and the device cache at rest.
#[allow(clippy::too_many_arguments)]
pub(super) fn build_report(
    trace: &Trace,
    cfg: &Config,
    mut total: Counts,
    (rounds, deferred): (u64, u64),
    cache: &Cache,
    pool: usize,
    wall: Duration,
    events: Option<EventsReport>,
) -> Report {
    let page = cfg.page_size;
    let threads = cfg.threads.max(1);
    let st = cache.stats();
    // The workers are joined: the walk sees the tree at rest.
    let index_bytes = cache.tree().memory_bytes() as u64;
    let wall_s = wall.as_secs_f64().max(1e-9);
    let mut report = Report {
        trace: trace.name().to_string(),
        requests: total.requests,
        input_tokens: total.input_tokens,
        hit_tokens: total.hit_tokens,
        hit_ratio: if total.input_tokens == 0 {
            0.0
        } else {
            total.hit_tokens as f64 / total.input_tokens as f64
        },
        evicted_tokens: st.tree.evicted_tokens,
        cached_tokens: st.tree.cached_tokens,
        inserted_tokens: st.tree.inserted_tokens,
        nodes: st.tree.nodes,
        namespaces: st.tree.namespaces,
        output_tokens: total.output_tokens,
        skipped_requests: total.skipped_requests,
        skipped_tokens: total.skipped_tokens,
        skipped_outputs: total.skipped_outputs,
        out_of_slots: total.out_of_slots,
        deferred,
        rounds,
        wall_s,
        requests_per_s: total.requests as f64 / wall_s,
        tokens_per_s: total.input_tokens as f64 / wall_s,
        match_p50_us: total.lat.matching.percentile_us(50.0),
        match_p99_us: total.lat.matching.percentile_us(99.0),
        insert_p50_us: total.lat.insert.percentile_us(50.0),
        insert_p99_us: total.lat.insert.percentile_us(99.0),
        evict_p50_us: total.lat.evict.percentile_us(50.0),
        evict_p99_us: total.lat.evict.percentile_us(99.0),
        evictions: total.lat.evict.len() as u64,
        peak_rss_bytes: peak_rss_bytes(),
        index_bytes,
        index_bytes_per_token: (st.tree.cached_tokens > 0)
            .then(|| index_bytes as f64 / st.tree.cached_tokens as f64),
        kv_bytes_per_token: None,
        kv_model: None,
        capacity_kv_bytes: None,
        capacity_kv_gib: None,
        cached_kv_bytes: None,
        cached_kv_gib: None,
        hit_kv_bytes: None,
        hit_kv_gib: None,
        index_kv_ratio: None,
        threads: threads as u64,
        page_size: page as u64,
        capacity: if pool == 0 { None } else { Some(pool as u64) },
        policy: cfg.policy.to_string(),
        schedule: cfg.schedule.name().to_string(),
        window: cfg.window as u64,
        with_output: cfg.with_output,
        events,
        tier: None,
        with_host: None,
    };
    report.set_kv(cfg.kv.as_ref());
    report
}

/// The events section of the report, once the publisher's thread has taken every batch
/// (or [`DRAIN_WAIT`] has passed).
fn events_report(cache: &Cache, p: &Publisher, cfg: &Config) -> EventsReport {
    let sink = cache.events().expect("events are on with a publisher");
    sink.flush();
    let deadline = Instant::now() + DRAIN_WAIT;
    let batches = sink.stats().batches;
    while p.stats().published + p.stats().dropped < batches && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let (s, ps) = (sink.stats(), p.stats());
    let ev = cfg.events.as_ref().expect("events configured");
    EventsReport {
        endpoint: p.endpoint().to_string(),
        replay_endpoint: p.replay_endpoint().map(str::to_string),
        format: ev.publisher.wire.encoding.name().to_string(),
        hash: match ev.hash_mode {
            HashMode::Xxh3 => "xxh3",
            HashMode::SglangSha256 => "sglang",
        }
        .to_string(),
        topic: ev.publisher.topic.clone(),
        batches: s.batches,
        events: s.events,
        published: ps.published,
        dropped: ps.dropped + s.dropped,
    }
}

/// A progress bar on stderr counting `len` requests of one replay.
pub fn progress_bar(len: u64) -> ProgressBar {
    bar_with(len, "{elapsed_precise} [{bar:40}] {pos}/{len} requests ({per_sec}, eta {eta})")
}

/// A progress bar on stderr counting the requests of a sweep's replays, with a message
/// (the capacities done) cut to the terminal's width.
pub fn sweep_progress_bar() -> ProgressBar {
    bar_with(0, "{elapsed_precise} [{bar:25}] {pos}/{len} requests; {wide_msg}")
}

fn bar_with(len: u64, template: &str) -> ProgressBar {
    let b = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(template) {
        b.set_style(style.progress_chars("=> "));
    }
    b
}
