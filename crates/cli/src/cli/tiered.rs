//! The replay engine over a [`TieredCache`] (`--host-capacity`): the device pool of the
//! capacity option with a host tier of `--host-capacity` tokens behind it, copying through
//! the index-only [`NullCopier`] (no KV bytes move; every copy is done when it starts).
//!
//! Per request: `match_and_lock` the prompt (the device hit, and how far host copies extend
//! it); when the host extends it, load those pages back (`load_back`, waited for, the
//! device prefix kept pinned meanwhile), take slots for the rest (evicting the shortfall,
//! then `alloc`; device evictions go through the tier: host copies stay, `write_back`
//! copies the page to the host first), `insert` the page-aligned prompt, release. Unlike the
//! device-only replay, a prompt found whole is inserted too (SGLang's `cache_finished_req`
//! inserts every finished request): that insert is what counts a page's hits for
//! `write_through_selective`. With `with_output`, the prompt is inserted with
//! `insert_and_lock` and the prompt plus its generated tokens after it, as the device-only
//! replay does.

use super::kv::KvSize;
use super::replay::{
    ALLOC_RETRIES, Config, Counts, build_report, cache_err, pool_slots, run_workers,
};
use super::report::{Report, TierReport};
use radixkv::tier::{NullCopier, TierOptions, TieredCache, WritePolicy};
use radixkv::{CacheOptions, Error, InsertOptions};
use radixkv_trace::Trace;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Default `--host-link-gbps`: an assumed host ↔ device bandwidth (about PCIe 5.0 x16 in
/// practice), used only to turn the bytes copied into a time; not a measurement.
pub const DEFAULT_LINK_GBPS: f64 = 50.0;

/// The host tier of a replay.
#[derive(Debug, Clone, Copy)]
pub struct HostTier {
    /// Host slots in tokens (rounded down to whole pages by the replay).
    pub capacity: u64,
    /// When pages get their host copy.
    pub write_policy: WritePolicy,
    /// `write_through_selective`'s hit threshold.
    pub write_threshold: u32,
    /// Load-backs shorter than this many tokens are not done.
    pub load_back_min: usize,
    /// Host ↔ device bandwidth assumed for the copy times, GB/s (10^9 bytes).
    pub link_gbps: f64,
}

/// Counts of the tier's request cycle (all threads; added once per request).
#[derive(Default)]
struct TierCounts {
    /// Tokens the host extended device matches by (`host_len` summed).
    host_match_tokens: AtomicU64,
    /// Tokens loaded back.
    loaded_tokens: AtomicU64,
    /// Requests with a load-back that loaded pages.
    load_backs: AtomicU64,
    /// Load-backs refused for want of device slots (every slot pinned).
    load_back_out_of_slots: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    if n > 0 {
        // Relaxed: statistics, read once the workers are joined.
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// A worker's buffers and counts.
#[derive(Default)]
struct State {
    slots: Vec<u32>,
    fresh: Vec<u32>,
    full: Vec<u32>,
}

struct Engine<'a> {
    tier: &'a TieredCache,
    cfg: &'a Config,
    pool: usize,
    next_out_token: AtomicU64,
    out_token_floor: u64,
    t: TierCounts,
}

impl Engine<'_> {
    /// Appends `n` device slots to `out` (evicting the shortfall first). `Ok(false)`: the
    /// pool stayed short (every slot pinned by other threads).
    fn take_slots(&self, n: usize, out: &mut Vec<u32>, c: &mut Counts) -> Result<bool, String> {
        if n == 0 {
            return Ok(true);
        }
        let mut attempt = 0;
        loop {
            let free = self.tier.device().stats().free_slots as usize;
            if free < n {
                let t = Instant::now();
                self.tier.evict(n - free).map_err(|e| cache_err("evict", e))?;
                c.lat.evict.push(t.elapsed());
            }
            match self.tier.alloc(n, out) {
                Ok(()) => return Ok(true),
                Err(Error::OutOfSlots { .. }) if attempt < ALLOC_RETRIES => {
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

    fn run_request(
        &self,
        ns: u64,
        tokens: &[u32],
        output_length: usize,
        priority: i32,
        st: &mut State,
        c: &mut Counts,
    ) -> Result<(), String> {
        let page = self.cfg.page_size;
        let len = tokens.len();
        let n = len / page * page;
        c.requests += 1;
        c.input_tokens += len as u64;
        if n > self.pool {
            c.skipped_requests += 1;
            c.skipped_tokens += len as u64;
            return Ok(());
        }
        let first = InsertOptions { priority, inserted_len: 0 };
        let t = Instant::now();
        st.slots.clear();
        let (lock0, m) = self.tier.match_and_lock(ns, &tokens[..n], &mut st.slots);
        c.lat.matching.push(t.elapsed());
        c.hit_tokens += m.device_len as u64;
        add(&self.t.host_match_tokens, m.host_len as u64);
        // The device prefix, then the pages loaded back, pinned by `locks`.
        let mut locks = vec![lock0];
        let mut have = m.device_len;
        if m.host_len > 0 {
            match self.tier.load_back(ns, &tokens[..n], n - m.device_len) {
                Ok(ticket) => {
                    let l = self.tier.wait_load(ticket).map_err(|e| cache_err("load_back", e))?;
                    if l.loaded > 0 {
                        add(&self.t.load_backs, 1);
                        add(&self.t.loaded_tokens, l.loaded as u64);
                    }
                    // Its lock covers at least the device prefix (pinned by `lock0` since).
                    have = l.lock.len();
                    st.slots.clear();
                    st.slots.extend_from_slice(&l.slots);
                    locks.push(l.lock);
                }
                Err(Error::OutOfSlots { .. }) => add(&self.t.load_back_out_of_slots, 1),
                Err(e) => return Err(cache_err("load_back", e)),
            }
        }
        let release = |locks: Vec<_>| -> Result<(), String> {
            for l in locks {
                self.tier.release(l).map_err(|e| cache_err("release", e))?;
            }
            Ok(())
        };
        if !self.take_slots(n - have, &mut st.slots, c)? {
            c.out_of_slots += 1;
            return release(locks);
        }
        let with_output = self.cfg.with_output && output_length > 0;
        if n > 0 {
            let t = Instant::now();
            if with_output {
                let (_, l) = self
                    .tier
                    .insert_and_lock(ns, &tokens[..n], &st.slots, first)
                    .map_err(|e| cache_err("insert_and_lock", e))?;
                locks.push(l);
            } else {
                self.tier
                    .insert_with(ns, &tokens[..n], &st.slots, first)
                    .map_err(|e| cache_err("insert", e))?;
            }
            c.lat.insert.push(t.elapsed());
        }
        if with_output {
            let opts = InsertOptions { priority, inserted_len: n };
            self.run_output(ns, tokens, output_length, opts, st, c)?;
        }
        release(locks)?;
        self.tier.device().reclaim();
        Ok(())
    }

    /// Caches prompt + generated tokens; the prompt's `opts.inserted_len` aligned tokens
    /// are pinned (and inserted by this request already).
    fn run_output(
        &self,
        ns: u64,
        tokens: &[u32],
        out_len: usize,
        opts: InsertOptions,
        st: &mut State,
        c: &mut Counts,
    ) -> Result<(), String> {
        let n = opts.inserted_len;
        let page = self.cfg.page_size;
        let nf = (tokens.len() + out_len) / page * page;
        if nf <= n {
            return Ok(());
        }
        if nf > self.pool {
            c.skipped_outputs += 1;
            return Ok(());
        }
        st.full.clear();
        st.full.extend_from_slice(tokens);
        st.full.extend(self.fresh_tokens(out_len)?);
        st.fresh.clear();
        let got = self.tier.device().match_prefix(ns, &tokens[..n], &mut st.fresh);
        if got != n {
            return Err(format!(
                "cache lost a pinned prefix: {got} of {n} pinned tokens still match"
            ));
        }
        if !self.take_slots(nf - n, &mut st.fresh, c)? {
            c.out_of_slots += 1;
            return Ok(());
        }
        let t = Instant::now();
        self.tier
            .insert_with(ns, &st.full[..nf], &st.fresh, opts)
            .map_err(|e| cache_err("insert", e))?;
        c.lat.insert.push(t.elapsed());
        c.output_tokens += (nf - tokens.len()) as u64;
        Ok(())
    }

    /// `n >= 1` token ids never used before in this run.
    fn fresh_tokens(&self, n: usize) -> Result<std::ops::RangeInclusive<u32>, String> {
        let floor = self.out_token_floor;
        let prev = self
            .next_out_token
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
                cur.checked_sub(n as u64).filter(|&lo| lo >= floor)
            })
            .map_err(|_| {
                "out of fresh token ids for generated outputs (every u32 id above the trace's is used)"
                    .to_string()
            })?;
        let lo = prev - n as u64;
        Ok(lo as u32..=(prev - 1) as u32)
    }
}

/// Replays `trace` under `cfg` on a device pool of `cfg.capacity` with the host tier `h`.
pub fn replay(trace: &Trace, cfg: &Config, h: &HostTier) -> Result<Report, String> {
    let page = cfg.page_size;
    let pool = pool_slots(cfg)?;
    if pool == 0 {
        return Err("a host tier needs a device capacity (--capacity), not unlimited".into());
    }
    let host = (h.capacity / page as u64) * page as u64;
    if host == 0 {
        return Err(format!(
            "host capacity {} is smaller than one page ({page} tokens)",
            h.capacity
        ));
    }
    let host = usize::try_from(host)
        .map_err(|_| format!("host capacity {} too large for this machine", h.capacity))?;
    let tier = TieredCache::new(
        CacheOptions {
            page_size: page,
            policy: cfg.policy,
            pool_slots: pool,
            slru_threshold: cfg.slru_threshold,
        },
        TierOptions {
            host_slots: host,
            write_policy: h.write_policy,
            write_threshold: h.write_threshold,
            load_back_min: h.load_back_min,
            host_policy: None,
        },
        Arc::new(NullCopier::default()),
    )
    .map_err(|e| format!("cannot create the tiered cache: {e}"))?;
    let engine = Engine {
        tier: &tier,
        cfg,
        pool,
        next_out_token: AtomicU64::new(u32::MAX as u64 + 1),
        out_token_floor: trace.max_token().map_or(0, |t| t as u64 + 1),
        t: TierCounts::default(),
    };
    let (total, rounds, wall) = run_workers(
        trace,
        cfg,
        tier.device(),
        State::default,
        |r, st, c| engine.run_request(r.namespace, &r.tokens, r.output_length, r.priority, st, c),
        || {},
    )?;
    // NullCopier: nothing is in flight; wait anyway, then check the tier at rest.
    tier.wait_all();
    tier.check().map_err(|e| format!("the tiered cache is inconsistent after the replay: {e}"))?;
    let mut report = build_report(trace, cfg, total, rounds, tier.device(), pool, wall, None);
    report.tier = Some(tier_report(&tier, h, &engine.t, &report, cfg.kv.as_ref()));
    Ok(report)
}

/// The host tier's section of the report, from the tier's counters and the engine's.
fn tier_report(
    tier: &TieredCache,
    h: &HostTier,
    t: &TierCounts,
    r: &Report,
    kv: Option<&KvSize>,
) -> TierReport {
    let s = tier.stats();
    let o = tier.options();
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let loaded = get(&t.loaded_tokens);
    let ratio = |x: u64| if r.input_tokens == 0 { 0.0 } else { x as f64 / r.input_tokens as f64 };
    let copies = s.copies_to_host + s.copies_to_device;
    let tokens = s.tokens_to_host + s.tokens_to_device;
    let bpt = kv.map(|k| k.bytes_per_token);
    let bytes = |n: u64| bpt.map(|b| n.saturating_mul(b));
    let secs = |b: Option<u64>| b.map(|b| b as f64 / (h.link_gbps * 1e9));
    let (to_host, to_device) = (bytes(s.tokens_to_host), bytes(s.tokens_to_device));
    TierReport {
        host_capacity: s.host_slots,
        write_policy: o.write_policy.name().to_string(),
        write_threshold: o.write_threshold,
        load_back_min: o.load_back_min as u64,
        copier: "null (index only: no KV bytes move)".to_string(),
        device_hit_tokens: r.hit_tokens,
        device_hit_ratio: r.hit_ratio,
        host_match_tokens: get(&t.host_match_tokens),
        host_hit_tokens: loaded,
        host_hit_ratio: ratio(loaded),
        combined_hit_tokens: r.hit_tokens + loaded,
        combined_hit_ratio: ratio(r.hit_tokens + loaded),
        tokens_to_host: s.tokens_to_host,
        tokens_to_device: s.tokens_to_device,
        tokens_written_back: s.tokens_written_back,
        copies_to_host: s.copies_to_host,
        copies_to_device: s.copies_to_device,
        copies_per_request: if r.requests == 0 { 0.0 } else { copies as f64 / r.requests as f64 },
        tokens_per_copy: (copies > 0).then(|| tokens as f64 / copies as f64),
        load_backs: get(&t.load_backs),
        load_backs_skipped: s.load_backs_skipped,
        load_back_out_of_slots: get(&t.load_back_out_of_slots),
        copy_failures: s.copy_failures,
        host_evicted_pages: s.host_evicted_pages,
        host_evicted_tokens: s.host_evicted_pages * tier.page_size() as u64,
        host_cached_tokens: s.host_backed_slots,
        host_resident_pages: s.host_resident_pages,
        host_link_gbps: h.link_gbps,
        bytes_to_host: to_host,
        bytes_to_device: to_device,
        copy_time_to_host_s: secs(to_host),
        copy_time_to_device_s: secs(to_device),
    }
}
