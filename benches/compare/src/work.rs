//! The workloads' operations (what the timings time).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use kv_index::TokenTree;
use radixkv::tree::InsertOptions;
use radixkv::{Cache, CacheOptions, EvictionPolicy, RadixTree, SlotRun, TreeConfig};

use crate::peers::*;
use crate::trace::Req;
use crate::util::*;

/// Which contestant, by key (also the `--mem-child` argument).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Who {
    Rkv,
    /// radixkv's tree returning the matched slots as runs (`match_prefix_runs`).
    RkvRuns,
    /// radixkv through its C ABI (`libradixkv.so`, loaded at run time): `rkv`'s calls.
    RkvC,
    RkvMutex,
    RkvRw,
    KvIndex,
    DynRt,
    DynCrtc,
    BlockMap,
}

impl Who {
    pub fn key(self) -> &'static str {
        match self {
            Who::Rkv => "rkv",
            Who::RkvRuns => "rkv-runs",
            Who::RkvC => "rkv-c",
            Who::RkvMutex => "rkv-mutex",
            Who::RkvRw => "rkv-rwlock",
            Who::KvIndex => "kv-index",
            Who::DynRt => "dynamo-rt",
            Who::DynCrtc => "dynamo-crtc",
            Who::BlockMap => "vllm-map",
        }
    }
    pub fn from_key(k: &str) -> Option<Who> {
        [
            Who::Rkv,
            Who::RkvRuns,
            Who::RkvC,
            Who::RkvMutex,
            Who::RkvRw,
            Who::KvIndex,
            Who::DynRt,
            Who::DynCrtc,
            Who::BlockMap,
        ]
        .into_iter()
        .find(|w| w.key() == k)
    }
    /// `pipelined`: stores need not be visible to the next lookup at once (dynamo's
    /// concurrent tree then sends its events without waiting for each).
    pub fn build(self, page: usize, pipelined: bool) -> Built {
        match self {
            Who::Rkv => Built::Shared(Box::new(Rkv::new(page))),
            Who::RkvRuns => Built::Shared(Box::new(RkvRuns::new(page))),
            Who::RkvC => Built::Shared(Box::new(crate::cabi::RkvC::new(page))),
            Who::RkvMutex => Built::Shared(Box::new(RkvMutex::new(page))),
            Who::RkvRw => Built::Shared(Box::new(RkvRw::new(page))),
            Who::KvIndex => Built::Shared(Box::new(KvIndex::new(page))),
            Who::DynRt => Built::Local(Box::new(DynRt::new(page))),
            Who::DynCrtc => Built::Shared(Box::new(DynCrtc::new(page, !pipelined))),
            Who::BlockMap => Built::Shared(Box::new(BlockMap::new(page))),
        }
    }
}

pub enum Built {
    Shared(Box<dyn Index + Sync>),
    Local(Box<dyn Index>),
}

impl Built {
    pub fn idx(&self) -> &dyn Index {
        match self {
            Built::Shared(b) => b.as_ref(),
            Built::Local(b) => b.as_ref(),
        }
    }
    pub fn shared(&self) -> Option<&(dyn Index + Sync)> {
        match self {
            Built::Shared(b) => Some(b.as_ref()),
            Built::Local(_) => None,
        }
    }
}

/// Per request: look up, then store. Returns the tokens hit.
pub fn replay(idx: &dyn Index, reqs: &[Req], slots: &[u32]) -> u64 {
    let mut s = Scratch::default();
    let mut hits = 0u64;
    for r in reqs {
        let h = idx.lookup(r, &mut s);
        hits += h as u64;
        idx.store(r, h, r.slots(slots), &mut s);
    }
    idx.sync();
    hits
}

/// Stores every request (its fork point known), no lookups.
pub fn insert_all(idx: &dyn Index, reqs: &[Req], slots: &[u32]) {
    let mut s = Scratch::default();
    for r in reqs {
        idx.store(r, r.fork, r.slots(slots), &mut s);
    }
    idx.sync();
}

/// Looks every request up, split over `threads` threads (request i to thread i % threads)
/// sharing the index by reference. Returns the tokens hit.
pub fn match_all(idx: &(dyn Index + Sync), reqs: &[Req], threads: usize) -> u64 {
    let one = |t: usize| {
        let mut s = Scratch::default();
        let mut hits = 0u64;
        let mut i = t;
        while i < reqs.len() {
            hits += idx.lookup(&reqs[i], &mut s) as u64;
            i += threads;
        }
        hits
    };
    if threads == 1 {
        return one(0);
    }
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads).map(|t| sc.spawn(move || one(t))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

/// Reads every token of every request once (a wrapping sum, split across threads as
/// [`match_all`] splits requests): the memory floor of any exact lookup.
pub fn read_all(reqs: &[Req], threads: usize) -> u32 {
    let one = |t: usize| {
        let mut sum = 0u32;
        let mut i = t;
        while i < reqs.len() {
            sum = reqs[i].tokens.iter().fold(sum, |a, &x| a.wrapping_add(x));
            i += threads;
        }
        std::hint::black_box(sum)
    };
    if threads == 1 {
        return one(0);
    }
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads).map(|t| sc.spawn(move || one(t))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).fold(0, u32::wrapping_add)
    })
}

pub fn match_all_local(idx: &dyn Index, reqs: &[Req]) -> u64 {
    let mut s = Scratch::default();
    reqs.iter().map(|r| idx.lookup(r, &mut s) as u64).sum()
}

/// Σ of the requests' lengths cut to the page.
pub fn aligned_total(reqs: &[Req], page: usize) -> u64 {
    reqs.iter().map(|r| (r.tokens.len() / page * page) as u64).sum()
}

impl Who {
    pub fn name(self) -> &'static str {
        match self {
            Who::Rkv => "radixkv RadixTree (lock-free)",
            Who::RkvRuns => "radixkv RadixTree (lock-free), slots as runs",
            Who::RkvC => "radixkv through the C ABI (libradixkv.so: rkv_match, rkv_insert)",
            Who::RkvMutex => "Mutex<radixkv RadixTree>",
            Who::RkvRw => "RwLock<radixkv RadixTree>",
            Who::KvIndex => "kv-index 2.0.0 TokenTree",
            Who::DynRt => "dynamo-kv-router 1.6.1 RadixTree",
            Who::DynCrtc => "dynamo-kv-router 1.6.1 ConcurrentRadixTreeCompressed",
            Who::BlockMap => "Mutex<HashMap> vLLM-style chained block hashes",
        }
    }
    pub fn granularity(self, page: usize) -> String {
        match (self, page) {
            (Who::DynRt | Who::DynCrtc | Who::BlockMap, p) => format!("{p}-token blocks"),
            (_, 1) => "token (exact)".into(),
            (_, p) => format!("page {p}"),
        }
    }
}

// ============================================================================ eviction

pub struct EvictRun {
    pub secs: f64,
    pub hits: u64,
    pub calls: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub per_node: f64,
    pub per_token: f64,
    pub evicted: u64,
    /// Tokens asked for and tokens freed, per call: (p50, p99).
    pub asked: (f64, f64),
    pub freed: (f64, f64),
}

/// The request cycle on a pooled cache of `cap` slots (page 1), evicting explicitly (and
/// timing each call) when the pool is short: match_and_lock, evict, alloc, insert, release.
/// How the Cache contestant of workload 4a passes slots.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum CacheCycle {
    /// Slot lists, `reclaim()` between requests.
    Lists,
    /// Slot lists, no `reclaim()`: the epoch's frees run inside whichever call pins.
    ListsInline,
    /// Runs end to end (`match_and_lock_runs`, `alloc_runs`, `insert_runs`), `reclaim()`
    /// between requests.
    Runs,
}

/// The eviction priority workload 4's per-policy runs give request `i` (the trace has
/// none): a hash of its index, 0 to 3. Only the `priority` policy reads it.
pub fn priority_of(i: usize) -> i32 {
    ((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 62) as i32
}

pub fn evict_replay_rkv(reqs: &[Req], cap: usize, cycle: CacheCycle) -> EvictRun {
    evict_replay_rkv_policy(reqs, cap, cycle, EvictionPolicy::Lru)
}

/// [`evict_replay_rkv`] under `policy`, each request inserted with [`priority_of`] its
/// index (ignored by every policy but `priority`; under LRU this is workload 4a's cycle).
pub fn evict_replay_rkv_policy(
    reqs: &[Req],
    cap: usize,
    cycle: CacheCycle,
    policy: EvictionPolicy,
) -> EvictRun {
    let cache =
        Cache::new(CacheOptions { page_size: 1, policy, pool_slots: cap, ..Default::default() })
            .unwrap();
    let pool = cache.pool().unwrap();
    let mut slots = Vec::new();
    let mut runs = Vec::new();
    let mut calls = Vec::new();
    let mut sizes = Vec::new();
    let mut nodes_evicted = 0u64;
    let mut hits = 0u64;
    let t0 = std::time::Instant::now();
    for (i, r) in reqs.iter().enumerate() {
        let opts = InsertOptions::with_priority(priority_of(i));
        let lock = if cycle == CacheCycle::Runs {
            cache.tree().match_and_lock(r.ns, &r.tokens, &mut runs).into_raw()
        } else {
            cache.tree().match_and_lock(r.ns, &r.tokens, &mut slots).into_raw()
        };
        let m = lock.len();
        hits += m as u64;
        let need = r.tokens.len() - m;
        let short = need.saturating_sub(pool.allocatable());
        if short > 0 {
            let n0 = cache.tree().stats().nodes;
            let t = std::time::Instant::now();
            let n = cache.evict(short, None).unwrap();
            calls.push(t.elapsed().as_secs_f64());
            sizes.push((short as f64, n as f64));
            nodes_evicted += n0 - cache.tree().stats().nodes;
        }
        if cycle == CacheCycle::Runs {
            cache.alloc_runs(need, &mut runs).expect("the pool holds every request");
            cache.insert_with(r.ns, &r.tokens, &runs, opts).unwrap();
        } else {
            cache.alloc(need, &mut slots).expect("the pool holds every request");
            cache.insert_with(r.ns, &r.tokens, &slots, opts).unwrap();
        }
        cache.release(lock).unwrap();
        if cycle != CacheCycle::ListsInline {
            cache.reclaim(); // between requests, as an engine would once per step
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let evicted = cache.stats().tree.evicted_tokens;
    finish_run(secs, hits, calls, sizes, nodes_evicted as f64, evicted)
}

pub fn finish_run(
    secs: f64,
    hits: u64,
    mut calls: Vec<f64>,
    sizes: Vec<(f64, f64)>,
    nodes: f64,
    evicted: u64,
) -> EvictRun {
    let total: f64 = calls.iter().sum();
    // Diagnostics: RADIXKV_COMPARE_EVICT_CALLS=1 prints every timed call (tokens asked,
    // tokens freed, seconds) to stderr, for analyses such as BENCHMARKS.md's regression.
    if std::env::var_os("RADIXKV_COMPARE_EVICT_CALLS").is_some() {
        for (c, (a, f)) in calls.iter().zip(&sizes) {
            eprintln!("evict-call {a} {f} {c}");
        }
    }
    let (mut asked, mut freed): (Vec<f64>, Vec<f64>) = sizes.into_iter().unzip();
    let n = calls.len();
    let max = calls.iter().copied().fold(0.0, f64::max);
    EvictRun {
        secs,
        hits,
        calls: n,
        p50: percentile(&mut calls, 50.0),
        p99: percentile(&mut calls, 99.0),
        max,
        per_node: total / nodes,
        per_token: total / evicted.max(1) as f64,
        evicted,
        asked: (percentile(&mut asked, 50.0), percentile(&mut asked, 99.0)),
        freed: (percentile(&mut freed, 50.0), percentile(&mut freed, 99.0)),
    }
}

/// A caller's free list of slot runs, as an engine keeps it beside the bare tree: eviction
/// hands runs back (`RadixTree::evict_runs`), allocation takes slots off the last run.
pub struct RunFreeList {
    runs: Vec<SlotRun>,
    len: usize,
}

impl RunFreeList {
    /// Slots `0..cap`, handed out ascending.
    pub fn new(cap: usize) -> RunFreeList {
        RunFreeList { runs: vec![SlotRun { start: 0, len: cap as u32 }], len: cap }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn put(&mut self, runs: &[SlotRun]) {
        self.runs.extend_from_slice(runs);
        self.len += runs.iter().map(|r| r.len as usize).sum::<usize>();
    }
    pub fn put_slots(&mut self, slots: &[u32]) {
        let n = self.runs.len();
        SlotRun::push_runs_of(slots, &mut self.runs);
        self.len += self.runs[n..].iter().map(|r| r.len as usize).sum::<usize>();
    }
    /// Appends `n <= len()` slots to `out`, from the start of the last run.
    pub fn take(&mut self, mut n: usize, out: &mut Vec<u32>) {
        self.len -= n;
        while n > 0 {
            let top = self.runs.last_mut().expect("n <= len()");
            let t = n.min(top.len as usize);
            out.extend(top.start..top.start + t as u32);
            top.start += t as u32;
            top.len -= t as u32;
            if top.len == 0 {
                self.runs.pop();
            }
            n -= t;
        }
    }
}

/// The tree alone with caller-managed slots: a free list of slot runs stands in for the
/// pool (`evict_runs` hands evicted runs to it, allocations take from it).
pub fn evict_replay_tree(reqs: &[Req], cap: usize, reclaim: bool) -> EvictRun {
    evict_replay_tree_policy(reqs, cap, reclaim, EvictionPolicy::Lru)
}

/// [`evict_replay_tree`] under `policy`, with [`priority_of`] each request's index.
pub fn evict_replay_tree_policy(
    reqs: &[Req],
    cap: usize,
    reclaim: bool,
    policy: EvictionPolicy,
) -> EvictRun {
    let tree = RadixTree::new(TreeConfig { page_size: 1, policy, ..Default::default() }).unwrap();
    let mut free = RunFreeList::new(cap);
    let mut slots = Vec::new();
    let mut calls = Vec::new();
    let mut sizes = Vec::new();
    let mut nodes_evicted = 0u64;
    let mut hits = 0u64;
    let t0 = std::time::Instant::now();
    for (i, r) in reqs.iter().enumerate() {
        let lock = tree.match_and_lock(r.ns, &r.tokens, &mut slots).into_raw();
        let m = lock.len();
        hits += m as u64;
        let need = r.tokens.len() - m;
        if need > free.len() {
            let short = need - free.len();
            let n0 = tree.stats().nodes;
            let t = std::time::Instant::now();
            let n = tree.evict_runs(short, &mut |runs| free.put(runs));
            calls.push(t.elapsed().as_secs_f64());
            sizes.push((short as f64, n as f64));
            nodes_evicted += n0 - tree.stats().nodes;
        }
        free.take(need, &mut slots);
        let existing = tree
            .insert_with(r.ns, &r.tokens, &slots, InsertOptions::with_priority(priority_of(i)))
            .unwrap();
        debug_assert_eq!(existing, m);
        tree.release(lock).unwrap();
        if reclaim {
            tree.reclaim();
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let evicted = tree.stats().evicted_tokens;
    finish_run(secs, hits, calls, sizes, nodes_evicted as f64, evicted)
}

/// kv-index's TokenTree on the same cycle: before storing, trim the tree to `cap - new`.
pub fn evict_replay_kvi(reqs: &[Req], cap: usize) -> EvictRun {
    let tree = TokenTree::with_config(1, Default::default());
    let mut calls = Vec::new();
    let mut sizes = Vec::new();
    let mut hits = 0u64;
    let t0 = std::time::Instant::now();
    let mut evicted = 0u64;
    for r in reqs {
        let m = tree.match_prefix_with_counts(&r.tokens).matched_token_count;
        hits += m as u64;
        let need = r.tokens.len() - m;
        let size = tree.total_token_size();
        if size + need > cap {
            let t = std::time::Instant::now();
            tree.evict_tenant_by_size(cap.saturating_sub(need));
            calls.push(t.elapsed().as_secs_f64());
            let n = size - tree.total_token_size();
            sizes.push(((size + need - cap) as f64, n as f64));
            evicted += n as u64;
        }
        tree.insert_tokens(&r.tokens, "w0");
    }
    let secs = t0.elapsed().as_secs_f64();
    finish_run(secs, hits, calls, sizes, f64::NAN, evicted)
}

/// A tree of `leaves` leaves (page 1): paths of base-16 digits, so every internal node
/// branches 16 ways, and leaf edges of 8 tokens.
pub fn leaf_keys(leaves: usize) -> Vec<Vec<u32>> {
    let mut depth = 1;
    while 16usize.pow(depth) < leaves {
        depth += 1;
    }
    (0..leaves)
        .map(|i| {
            let mut k: Vec<u32> = (0..depth).rev().map(|d| ((i >> (4 * d)) & 15) as u32).collect();
            k.extend((0..7).map(|j| 1000 + j));
            k
        })
        .collect()
}

// ============================================================================ mixed concurrent load

pub struct MixRun {
    pub secs: f64,
    pub cycles: u64,
    pub tokens: u64,
    pub hits: u64,
}

/// Ops are numbered by one shared counter: op j is an explicit evict of `ev` tokens when
/// j % 10 == 9, else the next request's engine cycle.
fn mix_driver(
    reqs: &[Req],
    threads: usize,
    op: &(dyn Fn(Option<&Req>, &mut Vec<u32>) -> u64 + Sync),
) -> MixRun {
    let next_op = AtomicUsize::new(0);
    let next_req = AtomicUsize::new(0);
    let hits = AtomicU64::new(0);
    let (_, secs) = time(|| {
        std::thread::scope(|sc| {
            for _ in 0..threads {
                sc.spawn(|| {
                    let mut slots = Vec::new();
                    loop {
                        let j = next_op.fetch_add(1, Ordering::Relaxed);
                        if j % 10 == 9 {
                            if next_req.load(Ordering::Relaxed) >= reqs.len() {
                                break;
                            }
                            op(None, &mut slots);
                            continue;
                        }
                        let i = next_req.fetch_add(1, Ordering::Relaxed);
                        if i >= reqs.len() {
                            break;
                        }
                        hits.fetch_add(op(Some(&reqs[i]), &mut slots), Ordering::Relaxed);
                    }
                });
            }
        })
    });
    MixRun {
        secs,
        cycles: reqs.len() as u64,
        tokens: reqs.iter().map(|r| r.tokens.len() as u64).sum(),
        hits: hits.into_inner(),
    }
}

fn rkv_cycle(cache: &Cache, r: &Req, slots: &mut Vec<u32>) -> u64 {
    let lock = cache.tree().match_and_lock(r.ns, &r.tokens, slots).into_raw();
    let m = lock.len();
    if cache.alloc(r.tokens.len() - m, slots).is_err() {
        cache.release(lock).unwrap();
        return 0;
    }
    cache.insert(r.ns, &r.tokens, slots).unwrap();
    cache.release(lock).unwrap();
    m as u64
}

/// [`rkv_cycle`] with slots as runs end to end.
fn rkv_cycle_runs(cache: &Cache, r: &Req, runs: &mut Vec<SlotRun>) -> u64 {
    let lock = cache.tree().match_and_lock(r.ns, &r.tokens, runs).into_raw();
    let m = lock.len();
    if cache.alloc_runs(r.tokens.len() - m, runs).is_err() {
        cache.release(lock).unwrap();
        return 0;
    }
    cache.insert(r.ns, &r.tokens, runs).unwrap();
    cache.release(lock).unwrap();
    m as u64
}

pub const EVICT_OP_TOKENS: usize = 16_384;

/// The bare tree with caller-managed slots: a `Mutex<RunFreeList>` stands in for the pool
/// (`evict_runs` refills it; allocations take from it). Isolates the tree from the pool.
pub fn mix_tree(reqs: &[Req], threads: usize, cap: usize) -> MixRun {
    let tree = RadixTree::new(TreeConfig {
        page_size: 1,
        policy: EvictionPolicy::Lru,
        ..Default::default()
    })
    .unwrap();
    let free = Mutex::new(RunFreeList::new(cap));
    let refill = |runs: &[SlotRun]| free.lock().unwrap().put(runs);
    mix_driver(reqs, threads, &|r, slots| match r {
        Some(r) => {
            let lock = tree.match_and_lock(r.ns, &r.tokens, slots).into_raw();
            let m = lock.len();
            let need = r.tokens.len() - m;
            loop {
                let short = {
                    let mut f = free.lock().unwrap();
                    if f.len() >= need {
                        f.take(need, slots);
                        break;
                    }
                    need - f.len()
                };
                if tree.evict_runs(short, &mut |runs| refill(runs)) == 0 {
                    tree.release(lock).unwrap();
                    return 0; // nothing evictable: every other page is pinned
                }
            }
            let existing = tree.insert(r.ns, &r.tokens, &*slots).unwrap();
            if existing > m {
                // Cached by a racing insert meanwhile: not adopted.
                free.lock().unwrap().put_slots(&slots[m..existing]);
            }
            tree.release(lock).unwrap();
            m as u64
        }
        None => {
            tree.evict_runs(EVICT_OP_TOKENS, &mut |runs| refill(runs));
            0
        }
    })
}

pub fn mix_rkv(reqs: &[Req], threads: usize, cap: usize) -> MixRun {
    let cache = Cache::new(CacheOptions {
        page_size: 1,
        policy: EvictionPolicy::Lru,
        pool_slots: cap,
        ..Default::default()
    })
    .unwrap();
    mix_driver(reqs, threads, &|r, slots| match r {
        Some(r) => rkv_cycle(&cache, r, slots),
        None => {
            cache.evict(EVICT_OP_TOKENS, None).unwrap();
            0
        }
    })
}

/// [`mix_rkv`] with slots as runs end to end (`match_and_lock_runs`, `alloc_runs`,
/// `insert_runs`).
pub fn mix_rkv_runs(reqs: &[Req], threads: usize, cap: usize) -> MixRun {
    let cache = Cache::new(CacheOptions {
        page_size: 1,
        policy: EvictionPolicy::Lru,
        pool_slots: cap,
        ..Default::default()
    })
    .unwrap();
    thread_local! {
        static RUNS: std::cell::RefCell<Vec<SlotRun>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    mix_driver(reqs, threads, &|r, _| match r {
        Some(r) => RUNS.with_borrow_mut(|runs| rkv_cycle_runs(&cache, r, runs)),
        None => {
            cache.evict(EVICT_OP_TOKENS, None).unwrap();
            0
        }
    })
}

/// The same cycle with the whole cache behind one Mutex, taken twice per request (admit:
/// match_and_lock + alloc; finish: insert + release), as a scheduler would.
pub fn mix_rkv_mutex(reqs: &[Req], threads: usize, cap: usize) -> MixRun {
    let cache = Mutex::new(
        Cache::new(CacheOptions {
            page_size: 1,
            policy: EvictionPolicy::Lru,
            pool_slots: cap,
            ..Default::default()
        })
        .unwrap(),
    );
    mix_driver(reqs, threads, &|r, slots| match r {
        Some(r) => {
            let admitted = {
                let c = cache.lock().unwrap();
                let lock = c.tree().match_and_lock(r.ns, &r.tokens, slots).into_raw();
                let m = lock.len();
                match c.alloc(r.tokens.len() - m, slots) {
                    Ok(()) => Some(lock),
                    Err(_) => {
                        c.release(lock).unwrap();
                        None
                    }
                }
            };
            let Some(lock) = admitted else { return 0 };
            let m = lock.len() as u64;
            let c = cache.lock().unwrap();
            c.insert(r.ns, &r.tokens, slots).unwrap();
            c.release(lock).unwrap();
            m
        }
        None => {
            cache.lock().unwrap().evict(EVICT_OP_TOKENS, None).unwrap();
            0
        }
    })
}

pub fn mix_kvi(reqs: &[Req], threads: usize, cap: usize) -> MixRun {
    let tree = TokenTree::with_config(1, Default::default());
    mix_driver(reqs, threads, &|r, _| match r {
        Some(r) => {
            let m = tree.match_prefix_with_counts(&r.tokens).matched_token_count;
            let need = r.tokens.len() - m;
            if tree.total_token_size() + need > cap {
                tree.evict_tenant_by_size(cap.saturating_sub(need));
            }
            tree.insert_tokens(&r.tokens, "w0");
            m as u64
        }
        None => {
            tree.evict_tenant_by_size(tree.total_token_size().saturating_sub(EVICT_OP_TOKENS));
            0
        }
    })
}
