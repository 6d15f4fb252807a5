//! The Mooncake router benchmark of `ROUTER.md` (not a test): the trace's requests spread
//! over W mock engine workers, each an LRU block cache that turns requests into
//! `BlockStored` / `BlockRemoved` events; each request is first looked up in the index
//! (the router's question), then its engine's events apply. Contestants, in one process on
//! the same precomputed stream: radixkv-router's `RouterIndex`, kv-index 2.0.0's
//! `ChainIndex` and `ShardedChainIndex`, dynamo-kv-router 1.6.1's
//! `ConcurrentRadixTreeCompressed` through its `ThreadPoolIndexer`.
//!
//! ```text
//! cargo bench -p radixkv-router --bench mooncake -- [--workers 16,128,1024] [--threads 1,2]
//!     [--dup 4] [--capacity 4096] [--keepup-steps 5] [--trace PATH]
//! ```
//!
//! Per (W, threads, contestant):
//! - **capacity**: every op of the stream as fast as the threads go (lanes: thread =
//!   worker % threads; a lane does its workers' lookups and events in stream order); block
//!   ops (request blocks looked up + blocks stored + blocks removed) over the wall time, the
//!   drain of Dynamo's event threads included;
//! - **keep-up ceiling**: open loop: ops issued at their trace timestamps scaled into a
//!   window; a rate is kept up when the last op completes within 1.10x the window; the
//!   highest kept-up rate is bracketed by bisection between 0.1x and 1.2x the capacity;
//! - **lookup p50 / p99** (service time of each lookup, measured in the capacity run) and
//!   lookups per second per thread (1 / mean lookup service time);
//! - **bytes per membership**: the counting allocator's growth from before the contestant
//!   was built to the end of the stream (lane-side maps included), over the memberships
//!   held then; for radixkv also its own `bytes` stat against the allocator.
//!
//! Environment: `RADIXKV_BENCH_BEST_OF=N` (N capacity runs, the best kept),
//! `RADIXKV_BENCH_CPU=1` (capacity from the busiest lane's CPU time, not the wall time),
//! `RADIXKV_BENCH_FIND_BY_LEN=1` (quiescent lookup times by request length, to stderr): for
//! A/B runs on a shared machine; the published tables use none of them.
//!
//! Scores are checked equal between contestants at quiescence (every distinct request of
//! the trace looked up after the capacity run); differences are counted, and printed one
//! by one with `RADIXKV_BENCH_SHOW_DIFF=1`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use dynamo_kv_router::ConcurrentRadixTreeCompressed;
use dynamo_kv_router::indexer::{SyncIndexer, ThreadPoolIndexer};
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, RouterEvent, WorkerWithDpRank,
};
use kv_index::{
    ChainBlockMap, ChainIndex, ContentHash, SequenceHash, ShardedChainIndex, StoredBlock,
};
use radixkv::events::Medium;
use radixkv::events::hash::{XXH3_SEED, xxh3_local};
use radixkv_router::{RouterIndex, RouterOptions, Score, Worker};

// ------------------------------------------------------------------ counting allocator

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call forwards to the system allocator with the caller's layout and pointer
// unchanged; the counter is only arithmetic on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as is (the caller upholds `alloc`'s contract).
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from this allocator with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as is (`p` came from this allocator with layout `l`).
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live_bytes() -> isize {
    LIVE.load(Ordering::Relaxed)
}

// ------------------------------------------------------------------ the stream

const BLOCK_TOKENS: u64 = 512;

#[derive(Clone, Copy)]
enum Kind {
    Query,
    Store { parent: Option<u64> },
    Remove,
}

#[derive(Clone, Copy)]
struct Op {
    /// Trace time (ms).
    ts: u64,
    worker: u32,
    kind: Kind,
    /// Into `Stream::hashes` (engine hashes, for stores and removals) and
    /// `Stream::contents` (content hashes, for queries and stores): same positions.
    start: u32,
    len: u32,
}

struct Stream {
    ops: Vec<Op>,
    hashes: Vec<u64>,
    contents: Vec<u64>,
    block_ops: u64,
    queries: u64,
    /// The distinct requests (for the final comparison): (start, len) of their contents.
    distinct: Vec<(u32, u32)>,
}

struct Req {
    ts: u64,
    ids: Vec<u64>,
}

fn load_trace(path: &str, dup: u64) -> Vec<Req> {
    let text = std::fs::read_to_string(path).expect("the trace");
    let mut base = Vec::new();
    let mut max_id = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let ts = v["timestamp"].as_u64().unwrap_or(0);
        let ids: Vec<u64> = v["hash_ids"]
            .as_array()
            .expect("hash_ids")
            .iter()
            .map(|h| h.as_u64().unwrap())
            .collect();
        max_id = max_id.max(ids.iter().copied().max().unwrap_or(0));
        base.push(Req { ts, ids });
    }
    // Copies k = 0..dup of the trace, side by side in time, each with its own block ids
    // (Dynamo's and kv-index's "trace duplication factor").
    let mut out = Vec::new();
    for r in &base {
        for k in 0..dup {
            out.push(Req { ts: r.ts, ids: r.ids.iter().map(|&h| h + k * (max_id + 1)).collect() });
        }
    }
    out
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// An engine's block cache: LRU over engine hashes.
struct Lru {
    cap: usize,
    stamp: u64,
    at: HashMap<u64, u64>,
    order: BTreeMap<u64, u64>,
}

impl Lru {
    fn touch(&mut self, h: u64) {
        self.stamp += 1;
        if let Some(old) = self.at.insert(h, self.stamp) {
            self.order.remove(&old);
        }
        self.order.insert(self.stamp, h);
    }
}

fn build_stream(
    reqs: &[Req],
    workers: u32,
    capacity: usize,
    content: &HashMap<u64, u64>,
) -> Stream {
    let mut s = Stream {
        ops: Vec::new(),
        hashes: Vec::new(),
        contents: Vec::new(),
        block_ops: 0,
        queries: 0,
        distinct: Vec::new(),
    };
    let mut engines: Vec<Lru> = (0..workers)
        .map(|_| Lru { cap: capacity, stamp: 0, at: HashMap::new(), order: BTreeMap::new() })
        .collect();
    let mut seen = std::collections::HashSet::new();
    for (i, r) in reqs.iter().enumerate() {
        let w = (splitmix(i as u64) % workers as u64) as u32;
        let push = |s: &mut Stream, ids: &[u64]| {
            let start = s.hashes.len() as u32;
            for h in ids {
                s.hashes.push(*h + 1);
                s.contents.push(content[h]);
            }
            (start, ids.len() as u32)
        };
        let (start, len) = push(&mut s, &r.ids);
        if seen.insert(r.ids.clone()) {
            s.distinct.push((start, len));
        }
        s.ops.push(Op { ts: r.ts, worker: w, kind: Kind::Query, start, len });
        s.block_ops += len as u64;
        s.queries += 1;
        let e = &mut engines[w as usize];
        let m = r.ids.iter().take_while(|h| e.at.contains_key(&(*h + 1))).count();
        if m < r.ids.len() {
            let parent = (m > 0).then(|| r.ids[m - 1] + 1);
            let (start, len) = push(&mut s, &r.ids[m..]);
            s.ops.push(Op { ts: r.ts, worker: w, kind: Kind::Store { parent }, start, len });
            s.block_ops += len as u64;
        }
        for h in &r.ids {
            e.touch(h + 1);
        }
        let mut evicted = Vec::new();
        while e.at.len() > e.cap {
            let (&st, &h) = e.order.iter().next().unwrap();
            e.order.remove(&st);
            e.at.remove(&h);
            evicted.push(h - 1);
        }
        if !evicted.is_empty() {
            let (start, len) = push(&mut s, &evicted);
            s.ops.push(Op { ts: r.ts, worker: w, kind: Kind::Remove, start, len });
            s.block_ops += len as u64;
        }
    }
    s
}

// ------------------------------------------------------------------ contestants

trait Contestant: Sync {
    type Lane: Send;
    fn lane(&self) -> Self::Lane;
    fn store(
        &self,
        lane: &mut Self::Lane,
        w: u32,
        parent: Option<u64>,
        hashes: &[u64],
        contents: &[u64],
    );
    fn remove(&self, lane: &mut Self::Lane, w: u32, hashes: &[u64]);
    /// Scores of a request: how many workers answered (the timed call).
    fn lookup(&self, lane: &mut Self::Lane, contents: &[u64]) -> usize;
    /// Full answer, (worker, leading blocks), sorted (the check).
    fn scores(&self, contents: &[u64]) -> Vec<(u64, u32)>;
    /// Waits until every event sent has applied.
    fn sync(&self) {}
    /// Memberships held (for bytes per membership).
    fn memberships(&self) -> u64;
    /// The contestant's own byte count, if it keeps one.
    fn own_bytes(&self) -> Option<u64> {
        None
    }
}

// radixkv -------------------------------------------------------------

struct Rkv(RouterIndex);

impl Contestant for Rkv {
    type Lane = Vec<Score>;
    fn lane(&self) -> Vec<Score> {
        Vec::new()
    }
    fn store(
        &self,
        _: &mut Vec<Score>,
        w: u32,
        parent: Option<u64>,
        hashes: &[u64],
        contents: &[u64],
    ) {
        self.0
            .stored_hashes(Worker::new(w as u64, 0), parent, hashes, contents, Medium::Gpu)
            .expect("a store");
    }
    fn remove(&self, _: &mut Vec<Score>, w: u32, hashes: &[u64]) {
        self.0.removed(Worker::new(w as u64, 0), hashes, Medium::Gpu).expect("a removal");
    }
    fn lookup(&self, out: &mut Vec<Score>, contents: &[u64]) -> usize {
        self.0.find_hashes(contents, out);
        out.len()
    }
    fn scores(&self, contents: &[u64]) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        self.0.find_hashes(contents, &mut out);
        let mut v: Vec<(u64, u32)> =
            out.iter().map(|s| (s.worker.worker_id, s.device_blocks)).collect();
        v.sort();
        v
    }
    fn memberships(&self) -> u64 {
        self.0.stats().memberships
    }
    fn own_bytes(&self) -> Option<u64> {
        self.0.reclaim();
        Some(self.0.stats().bytes)
    }
}

// kv-index --------------------------------------------------------------

/// `ChainIndex` (shards = None) or `ShardedChainIndex`: workers interned on first use
/// by the lane that owns them; each lane keeps its workers' block maps.
struct Chain {
    one: Option<ChainIndex>,
    sharded: Option<ShardedChainIndex>,
    ids: Mutex<HashMap<u32, u64>>,
}

struct ChainLane {
    maps: HashMap<u32, (u32, ChainBlockMap)>,
    blocks: Vec<StoredBlock>,
    seqs: Vec<SequenceHash>,
    chs: Vec<ContentHash>,
}

impl Chain {
    fn new(shards: Option<usize>, max_workers: usize) -> Chain {
        match shards {
            None => Chain {
                one: Some(ChainIndex::with_max_workers(max_workers)),
                sharded: None,
                ids: Mutex::default(),
            },
            Some(n) => Chain {
                one: None,
                sharded: Some(ShardedChainIndex::new(n, max_workers)),
                ids: Mutex::default(),
            },
        }
    }
}

impl Contestant for Chain {
    type Lane = ChainLane;
    fn lane(&self) -> ChainLane {
        ChainLane { maps: HashMap::new(), blocks: Vec::new(), seqs: Vec::new(), chs: Vec::new() }
    }
    fn store(
        &self,
        lane: &mut ChainLane,
        w: u32,
        parent: Option<u64>,
        hashes: &[u64],
        contents: &[u64],
    ) {
        let (id, map) = lane.maps.entry(w).or_insert_with(|| {
            let name = w.to_string();
            let id = match (&self.one, &self.sharded) {
                (Some(c), _) => c.intern_worker(&name),
                (_, Some(s)) => s.intern_worker(&name),
                _ => unreachable!(),
            }
            .expect("worker slots");
            self.ids.lock().unwrap().insert(id, w as u64);
            (id, ChainBlockMap::default())
        });
        lane.blocks.clear();
        lane.blocks.extend(hashes.iter().zip(contents).map(|(&h, &c)| StoredBlock {
            seq_hash: SequenceHash(h),
            content_hash: ContentHash(c),
        }));
        let parent = parent.map(SequenceHash);
        let r = match (&self.one, &self.sharded) {
            (Some(c), _) => c.apply_stored(*id, &lane.blocks, parent, map),
            (_, Some(s)) => s.apply_stored(*id, &lane.blocks, parent, map),
            _ => unreachable!(),
        };
        r.expect("kv-index accepts the store");
    }
    fn remove(&self, lane: &mut ChainLane, w: u32, hashes: &[u64]) {
        let Some((id, map)) = lane.maps.get_mut(&w) else { return };
        lane.seqs.clear();
        lane.seqs.extend(hashes.iter().map(|&h| SequenceHash(h)));
        match (&self.one, &self.sharded) {
            (Some(c), _) => c.apply_removed(*id, &lane.seqs, map),
            (_, Some(s)) => s.apply_removed(*id, &lane.seqs, map),
            _ => unreachable!(),
        }
    }
    fn lookup(&self, lane: &mut ChainLane, contents: &[u64]) -> usize {
        let mut n = 0;
        lane.chs.clear();
        lane.chs.extend(contents.iter().map(|&c| ContentHash(c)));
        match (&self.one, &self.sharded) {
            (Some(c), _) => c.score_into(&lane.chs, |h| h.0, false, |_, _| n += 1),
            (_, Some(s)) => s.score_into(&lane.chs, |h| h.0, false, |_, _| n += 1),
            _ => unreachable!(),
        };
        n
    }
    fn scores(&self, contents: &[u64]) -> Vec<(u64, u32)> {
        let chs: Vec<ContentHash> = contents.iter().map(|&c| ContentHash(c)).collect();
        let scores = match (&self.one, &self.sharded) {
            (Some(c), _) => c.find_matches(&chs, false),
            (_, Some(s)) => s.find_matches(&chs, false),
            _ => unreachable!(),
        };
        let ids = self.ids.lock().unwrap();
        let mut v: Vec<(u64, u32)> =
            scores.scores.iter().filter(|(_, s)| **s > 0).map(|(id, s)| (ids[id], *s)).collect();
        v.sort();
        v
    }
    fn memberships(&self) -> u64 {
        match (&self.one, &self.sharded) {
            (Some(c), _) => c.current_size() as u64,
            (_, Some(s)) => s.current_size() as u64,
            _ => unreachable!(),
        }
    }
}

// dynamo -------------------------------------------------------------------

struct Dyn {
    pool: ThreadPoolIndexer<ConcurrentRadixTreeCompressed>,
    id: AtomicU64,
    rt: tokio::runtime::Runtime,
}

impl Dyn {
    fn new(threads: usize) -> Dyn {
        Dyn {
            pool: ThreadPoolIndexer::new(
                ConcurrentRadixTreeCompressed::new(),
                threads,
                BLOCK_TOKENS as u32,
            ),
            id: AtomicU64::new(0),
            rt: tokio::runtime::Builder::new_current_thread().build().unwrap(),
        }
    }
    fn send(&self, w: u32, data: KvCacheEventData) {
        let event_id = self.id.fetch_add(1, Ordering::Relaxed);
        let ev = RouterEvent::new(w as u64, KvCacheEvent { event_id, data, dp_rank: 0 });
        self.pool.enqueue_event(ev).expect("dynamo takes the event");
    }
}

impl Contestant for Dyn {
    type Lane = Vec<LocalBlockHash>;
    fn lane(&self) -> Vec<LocalBlockHash> {
        Vec::new()
    }
    fn store(
        &self,
        _: &mut Self::Lane,
        w: u32,
        parent: Option<u64>,
        hashes: &[u64],
        contents: &[u64],
    ) {
        let blocks = hashes
            .iter()
            .zip(contents)
            .map(|(&h, &c)| KvCacheStoredBlockData {
                block_hash: ExternalSequenceBlockHash(h),
                tokens_hash: LocalBlockHash(c),
                mm_extra_info: None,
            })
            .collect();
        self.send(
            w,
            KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: parent.map(ExternalSequenceBlockHash),
                start_position: None,
                blocks,
            }),
        );
    }
    fn remove(&self, _: &mut Self::Lane, w: u32, hashes: &[u64]) {
        self.send(
            w,
            KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: hashes.iter().map(|&h| ExternalSequenceBlockHash(h)).collect(),
            }),
        );
    }
    fn lookup(&self, lane: &mut Self::Lane, contents: &[u64]) -> usize {
        // The owned-hash copy a caller of its `find_matches` makes, charged to it.
        lane.clear();
        lane.extend(contents.iter().map(|&c| LocalBlockHash(c)));
        self.pool.backend().find_matches(lane, false).scores.len()
    }
    fn scores(&self, contents: &[u64]) -> Vec<(u64, u32)> {
        let l: Vec<LocalBlockHash> = contents.iter().map(|&c| LocalBlockHash(c)).collect();
        let o = self.pool.backend().find_matches(&l, false);
        let mut v: Vec<(u64, u32)> = o
            .scores
            .iter()
            .filter(|(_, s)| **s > 0)
            .map(|(w, s): (&WorkerWithDpRank, &u32)| (w.worker_id, *s))
            .collect();
        v.sort();
        v
    }
    fn sync(&self) {
        self.rt.block_on(self.pool.flush_and_wait()).expect("flush");
    }
    fn memberships(&self) -> u64 {
        0 // counted by radixkv's index on the same stream
    }
}

// ------------------------------------------------------------------ runs

struct RunOut {
    wall_s: f64,
    lookup_ns: Vec<u32>,
}

/// Runs the stream on `threads` lanes; with `window_ns`, op i waits for its deadline
/// (its trace time scaled into the window). Returns the lanes too (their maps are part of
/// a contestant's memory).
fn run<C: Contestant>(
    c: &C,
    s: &Stream,
    threads: usize,
    window_ns: Option<f64>,
) -> (RunOut, Vec<C::Lane>) {
    let t0 = s.ops.first().map_or(0, |o| o.ts);
    let span = (s.ops.last().map_or(0, |o| o.ts) - t0).max(1) as f64;
    let per: Vec<Vec<usize>> = (0..threads)
        .map(|t| (0..s.ops.len()).filter(|&i| s.ops[i].worker as usize % threads == t).collect())
        .collect();
    let barrier = Barrier::new(threads);
    let start = Mutex::new(None::<Instant>);
    let cpu_clock = std::env::var_os("RADIXKV_BENCH_CPU").is_some();
    let results: Vec<(Vec<u32>, C::Lane, f64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = per
            .iter()
            .map(|mine| {
                let (barrier, start) = (&barrier, &start);
                sc.spawn(move || {
                    let mut lane = c.lane();
                    let mut lat = Vec::with_capacity(mine.len());
                    barrier.wait();
                    let began = *start.lock().unwrap().get_or_insert_with(Instant::now);
                    let cpu0 = thread_cpu_s();
                    for &i in mine {
                        let op = s.ops[i];
                        if let Some(w) = window_ns {
                            let due = (op.ts - t0) as f64 / span * w;
                            while (began.elapsed().as_nanos() as f64) < due {
                                std::hint::spin_loop();
                            }
                        }
                        let r = op.start as usize..(op.start + op.len) as usize;
                        match op.kind {
                            Kind::Query => {
                                let q = Instant::now();
                                std::hint::black_box(c.lookup(&mut lane, &s.contents[r]));
                                lat.push(q.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                            }
                            Kind::Store { parent } => c.store(
                                &mut lane,
                                op.worker,
                                parent,
                                &s.hashes[r.clone()],
                                &s.contents[r],
                            ),
                            Kind::Remove => c.remove(&mut lane, op.worker, &s.hashes[r]),
                        }
                    }
                    (lat, lane, thread_cpu_s() - cpu0)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    c.sync();
    let end = Instant::now();
    let began = start.into_inner().unwrap().unwrap();
    let mut lookup_ns = Vec::new();
    let mut lanes = Vec::new();
    let mut cpu_s: f64 = 0.0;
    for (l, lane, cpu) in results {
        lookup_ns.extend(l);
        lanes.push(lane);
        cpu_s = cpu_s.max(cpu);
    }
    // `RADIXKV_BENCH_CPU=1` (A/B runs on a shared machine, radixkv alone, no keep-up): the
    // busiest lane's thread CPU time instead of the wall time (preemptions not counted).
    let wall_s = if cpu_clock { cpu_s } else { (end - began).as_secs_f64() };
    (RunOut { wall_s, lookup_ns }, lanes)
}

/// The calling thread's CPU time, in seconds (Linux `CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_s() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `clock_gettime` writes one `struct timespec` (two 64-bit fields on 64-bit
    // Linux) through a valid pointer to a live local; clock 3 is CLOCK_THREAD_CPUTIME_ID.
    unsafe { clock_gettime(3, &mut t) };
    t.sec as f64 + t.nsec as f64 * 1e-9
}

fn flush_epoch() {
    for _ in 0..256 {
        crossbeam_epoch::pin().flush();
    }
}

fn pct(v: &mut [u32], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i] as f64 / 1000.0
}

struct Row {
    name: &'static str,
    capacity: f64,
    keepup: f64,
    p50: f64,
    p99: f64,
    lookups_per_s: f64,
    bytes_per_m: f64,
    own_ratio: Option<f64>,
    mismatches: usize,
}

/// One request's answer: (worker, leading blocks) sorted.
type Answer = Vec<(u64, u32)>;
/// The yardstick's answer for a request.
type RefFn<'a> = &'a dyn Fn(&[u64]) -> Answer;

struct Cfg {
    keepup_steps: usize,
}

fn measure<C: Contestant>(
    name: &'static str,
    make: &dyn Fn() -> C,
    s: &Stream,
    threads: usize,
    cfg: &Cfg,
    memberships: u64,
    reference: Option<RefFn<'_>>,
) -> (Row, Vec<Answer>) {
    // Capacity, latency, memory and the answers. The epoch garbage of earlier runs is
    // freed first, so that none of it is freed (and counted) during this one.
    flush_epoch();
    let base = live_bytes();
    let c = make();
    let (mut out, mut lanes) = run(&c, s, threads, None);
    let capacity = s.block_ops as f64 / out.wall_s;
    flush_epoch();
    let grown = if let Some(own) = c.own_bytes() {
        let g = live_bytes() - base;
        (g, Some(own as f64 / g as f64))
    } else {
        (live_bytes() - base, None)
    };
    let m = if memberships > 0 { memberships } else { c.memberships() };
    let answers: Vec<Vec<(u64, u32)>> = s
        .distinct
        .iter()
        .map(|&(st, len)| c.scores(&s.contents[st as usize..(st + len) as usize]))
        .collect();
    let mismatches = match reference {
        None => 0,
        Some(r) => s
            .distinct
            .iter()
            .zip(&answers)
            .filter(|((st, len), a)| {
                let want = r(&s.contents[*st as usize..(*st + *len) as usize]);
                if want != **a && std::env::var_os("RADIXKV_BENCH_SHOW_DIFF").is_some() {
                    // The differing workers only, (worker, blocks): radixkv's, then this one's.
                    let only = |x: &Answer, y: &Answer| -> Answer {
                        x.iter().filter(|e| !y.contains(e)).copied().collect()
                    };
                    eprintln!(
                        "{name}: request of {len} blocks: radixkv {:?} {name} {:?}",
                        only(&want, a),
                        only(a, &want)
                    );
                }
                want != **a
            })
            .count(),
    };
    let mean =
        out.lookup_ns.iter().map(|&x| x as f64).sum::<f64>() / out.lookup_ns.len().max(1) as f64;
    if std::env::var_os("RADIXKV_BENCH_FIND_BY_LEN").is_some() {
        // Quiescent lookups, every distinct request 15 times, the fastest of each kept;
        // the mean of those per request length (blocks, in buckets of 40).
        let mut best = vec![u64::MAX; s.distinct.len()];
        for _ in 0..15 {
            for (j, &(st, len)) in s.distinct.iter().enumerate() {
                let q = Instant::now();
                std::hint::black_box(
                    c.lookup(&mut lanes[0], &s.contents[st as usize..(st + len) as usize]),
                );
                best[j] = best[j].min(q.elapsed().as_nanos() as u64);
            }
        }
        let mut by: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for (j, &(_, len)) in s.distinct.iter().enumerate() {
            let e = by.entry((len / 40) * 40).or_default();
            e.0 += best[j];
            e.1 += 1;
        }
        let line: Vec<String> =
            by.iter().map(|(k, (t, n))| format!("{k}+: {} ns ({n})", t / n)).collect();
        eprintln!("find by length, {name}, {threads} threads: {}", line.join(", "));
    }
    let mut p50 = pct(&mut out.lookup_ns, 0.50);
    let mut p99 = pct(&mut out.lookup_ns, 0.99);
    drop(lanes);
    drop(c);
    // `RADIXKV_BENCH_BEST_OF=N`: N capacity runs, the best capacity and the lowest p50 / p99
    // of them kept (for A/B runs on a shared machine; the published table uses one run).
    let mut capacity = capacity;
    let best_of: usize =
        std::env::var("RADIXKV_BENCH_BEST_OF").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    for _ in 1..best_of {
        let c = make();
        let (mut o, _l) = run(&c, s, threads, None);
        capacity = capacity.max(s.block_ops as f64 / o.wall_s);
        p50 = p50.min(pct(&mut o.lookup_ns, 0.50));
        p99 = p99.min(pct(&mut o.lookup_ns, 0.99));
    }
    // The keep-up ceiling: bisection on the offered rate.
    let (mut lo, mut hi) = (0.1 * capacity, 1.2 * capacity);
    let mut best = 0.0;
    for _ in 0..cfg.keepup_steps {
        let rate = (lo * hi).sqrt();
        let window = s.block_ops as f64 / rate * 1e9;
        let c = make();
        let (o, _l) = run(&c, s, threads, Some(window));
        if o.wall_s * 1e9 <= 1.10 * window {
            best = rate;
            lo = rate;
        } else {
            hi = rate;
        }
    }
    let row = Row {
        name,
        capacity,
        keepup: best,
        p50,
        p99,
        lookups_per_s: 1e9 / mean.max(1.0),
        bytes_per_m: grown.0 as f64 / m.max(1) as f64,
        own_ratio: grown.1,
        mismatches,
    };
    (row, answers)
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn list(s: &str) -> Vec<usize> {
    s.split(',').map(|x| x.trim().parse().expect("a number")).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let trace = arg(&args, "--trace").unwrap_or_else(|| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/traces/mooncake_synthetic_trace.jsonl"
        )
        .into()
    });
    let workers = list(&arg(&args, "--workers").unwrap_or_else(|| "16,128,1024".into()));
    let threads = list(&arg(&args, "--threads").unwrap_or_else(|| "1,2".into()));
    let dup: u64 = arg(&args, "--dup").map_or(4, |s| s.parse().unwrap());
    let capacity: usize = arg(&args, "--capacity").map_or(4096, |s| s.parse().unwrap());
    let cfg = Cfg { keepup_steps: arg(&args, "--keepup-steps").map_or(5, |s| s.parse().unwrap()) };
    let only: Option<Vec<String>> =
        arg(&args, "--only").map(|s| s.split(',').map(String::from).collect());
    let want = |n: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == n));

    let reqs = load_trace(&trace, dup);
    let mut content = HashMap::new();
    let mut toks = vec![0u32; BLOCK_TOKENS as usize];
    for r in &reqs {
        for &h in &r.ids {
            content.entry(h).or_insert_with(|| {
                for (i, t) in toks.iter_mut().enumerate() {
                    *t = (h * BLOCK_TOKENS + i as u64) as u32;
                }
                xxh3_local(&toks, XXH3_SEED)
            });
        }
    }
    println!(
        "trace {trace}: {} requests (x{dup}), {} distinct blocks of {BLOCK_TOKENS} tokens; engine LRU capacity {capacity} blocks",
        reqs.len(),
        content.len()
    );
    println!(
        "| W | threads | contestant | block ops | capacity (Mops/s) | keep-up ceiling (Mops/s) | lookup p50 (us) | lookup p99 (us) | lookups/s per thread | bytes/membership | own bytes / allocator | answers != radixkv |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &w in &workers {
        let s = build_stream(&reqs, w as u32, capacity, &content);
        for &t in &threads {
            let opts = RouterOptions {
                block_size: BLOCK_TOKENS as u32,
                max_workers: 4096,
                ..Default::default()
            };
            // radixkv first: its answers and memberships are the others' yardstick.
            let (row, answers) = measure(
                "radixkv-router",
                &|| Rkv(RouterIndex::new(opts).unwrap()),
                &s,
                t,
                &cfg,
                0,
                None,
            );
            // The memberships of the end state (every contestant holds the same stream).
            let rk = Rkv(RouterIndex::new(opts).unwrap());
            let _ = run(&rk, &s, 1, None);
            let memberships = rk.0.stats().memberships;
            drop(rk);
            let table: HashMap<Vec<u64>, Vec<(u64, u32)>> = s
                .distinct
                .iter()
                .zip(answers)
                .map(|(&(st, len), a)| (s.contents[st as usize..(st + len) as usize].to_vec(), a))
                .collect();
            let reference = |c: &[u64]| table[c].clone();
            let mut rows = vec![row];
            if want("chain") {
                rows.push(
                    measure(
                        "kv-index ChainIndex",
                        &|| Chain::new(None, 1024),
                        &s,
                        t,
                        &cfg,
                        memberships,
                        Some(&reference),
                    )
                    .0,
                );
            }
            if want("sharded") {
                rows.push(
                    measure(
                        "kv-index ShardedChainIndex",
                        &|| Chain::new(Some(t.max(2)), 1024),
                        &s,
                        t,
                        &cfg,
                        memberships,
                        Some(&reference),
                    )
                    .0,
                );
            }
            if want("dynamo") {
                rows.push(
                    measure(
                        "dynamo CRTC (ThreadPoolIndexer)",
                        &|| Dyn::new(t),
                        &s,
                        t,
                        &cfg,
                        memberships,
                        Some(&reference),
                    )
                    .0,
                );
            }
            for r in rows {
                println!(
                    "| {w} | {t} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.1} | {} | {} |",
                    r.name,
                    s.block_ops,
                    r.capacity / 1e6,
                    r.keepup / 1e6,
                    r.p50,
                    r.p99,
                    r.lookups_per_s,
                    r.bytes_per_m,
                    r.own_ratio.map_or("-".into(), |x| format!("{x:.3}")),
                    r.mismatches
                );
            }
            println!("<!-- W {w}: {} lookups, {memberships} memberships at the end -->", s.queries);
        }
    }
}
