//! The contestants behind one interface: look up a request's cached prefix, then store it.
//!
//! - radixkv's `RadixTree` (lock-free), and the same tree behind a `Mutex` and an `RwLock`;
//! - kv-index 2.0.0's `TokenTree` (SGLang model gateway: DashMap children, RwLock'd edges,
//!   tenants instead of slots), exact at its page size;
//! - dynamo-kv-router 1.6.1's `RadixTree` (single-threaded, `Rc<RefCell>`) and
//!   `ConcurrentRadixTreeCompressed` over block hashes: a lookup hashes the request's blocks
//!   (their `compute_block_hash_for_seq`, XXH3) and walks; a store is the engine's "stored"
//!   event (parent = sequence hash of the last cached block, then the new blocks). The
//!   concurrent tree is written only through its `SyncIndexer::worker` loop (its
//!   `apply_event` is private), so stores go over a flume channel to that thread;
//! - a vLLM-style prefix map: `HashMap<block hash, slots>` of 16-token blocks, each hash
//!   chained from its parent's (XXH3 of the block's tokens seeded with the parent hash),
//!   behind one `Mutex`.
//!
//! Hashing is charged to the peers that need it: their engines and routers hash each
//! request too.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use dynamo_kv_router::indexer::{SyncIndexer, WorkerTask};
use dynamo_kv_router::protocols::{
    BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, OverlapScores, RouterEvent, WorkerWithDpRank,
    compute_block_hash_for_seq, compute_seq_hash_for_block,
};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, RadixTree as DynamoTree};
use kv_index::TokenTree;
use radixkv::{EvictionPolicy, RadixTree, TreeConfig};
use rustc_hash::FxHashMap;

use crate::trace::Req;

/// Per-thread buffers.
#[derive(Default)]
pub struct Scratch {
    pub out: Vec<u32>,
    /// The matched slots as runs (radixkv's `match_prefix_runs`).
    pub runs: Vec<radixkv::SlotRun>,
    pub local: Vec<LocalBlockHash>,
    pub chain: Vec<u64>,
    /// (address, length) of the tokens `local`/`chain` were computed for.
    hashed: (usize, usize),
}

impl Scratch {
    fn is_hashed(&self, t: &[u32]) -> bool {
        self.hashed == (t.as_ptr() as usize, t.len())
    }
    fn mark_hashed(&mut self, t: &[u32]) {
        self.hashed = (t.as_ptr() as usize, t.len());
    }
}

pub trait Index {
    /// Tokens of `r` found cached (a page multiple).
    fn lookup(&self, r: &Req, s: &mut Scratch) -> usize;
    /// Caches `r`; `cached` tokens of it are known to be cached already (a lookup's result,
    /// or the generator's fork point).
    /// `slots` has one fresh slot per token of `r` (made by the harness, outside the timing).
    fn store(&self, r: &Req, cached: usize, slots: &[u32], s: &mut Scratch);
    /// Waits until every store has taken effect.
    fn sync(&self) {}
    /// Cached tokens, where the index can say.
    fn cached_tokens(&self) -> Option<u64> {
        None
    }
    /// What one cached token holds in this index (for the memory table).
    fn holds(&self) -> &'static str;
    /// radixkv's own count: (heap bytes, nodes) from `check_invariants`.
    fn census(&self) -> Option<(u64, u64)> {
        None
    }
}

fn rkv_tree(page: usize) -> RadixTree {
    RadixTree::new(TreeConfig {
        page_size: page,
        policy: EvictionPolicy::Lru,
        ..Default::default()
    })
    .unwrap()
}

// ------------------------------------------------------------------------ radixkv

pub struct Rkv {
    pub tree: RadixTree,
}

impl Rkv {
    pub fn new(page: usize) -> Self {
        Rkv { tree: rkv_tree(page) }
    }
}

impl Index for Rkv {
    fn lookup(&self, r: &Req, s: &mut Scratch) -> usize {
        self.tree.match_prefix(r.ns, &r.tokens, &mut s.out)
    }
    fn store(&self, r: &Req, _cached: usize, slots: &[u32], _s: &mut Scratch) {
        self.tree.insert(r.ns, &r.tokens, slots).unwrap();
    }
    fn cached_tokens(&self) -> Option<u64> {
        Some(self.tree.stats().cached_tokens)
    }
    fn holds(&self) -> &'static str {
        "token + slot"
    }
    fn census(&self) -> Option<(u64, u64)> {
        let c = self.tree.check_invariants().expect("a sound tree");
        Some((c.heap_bytes, c.nodes))
    }
}

/// radixkv's tree with slots as runs both ways: lookups by `match_prefix_runs` (the matched
/// slots written as runs of consecutive slots instead of one per token), stores by
/// `insert_runs` with the request's slots as runs (made outside the timing, as a pool hands
/// them out), so no slot is scanned one by one.
pub struct RkvRuns(Rkv);

impl RkvRuns {
    pub fn new(page: usize) -> Self {
        RkvRuns(Rkv::new(page))
    }
}

impl Index for RkvRuns {
    fn lookup(&self, r: &Req, s: &mut Scratch) -> usize {
        self.0.tree.match_prefix(r.ns, &r.tokens, &mut s.runs)
    }
    fn store(&self, r: &Req, _cached: usize, _slots: &[u32], _s: &mut Scratch) {
        self.0.tree.insert(r.ns, &r.tokens, &r.runs).unwrap();
    }
    fn cached_tokens(&self) -> Option<u64> {
        self.0.cached_tokens()
    }
    fn holds(&self) -> &'static str {
        self.0.holds()
    }
    fn census(&self) -> Option<(u64, u64)> {
        self.0.census()
    }
}

pub struct RkvMutex {
    tree: Mutex<RadixTree>,
}

impl RkvMutex {
    pub fn new(page: usize) -> Self {
        RkvMutex { tree: Mutex::new(rkv_tree(page)) }
    }
}

impl Index for RkvMutex {
    fn lookup(&self, r: &Req, s: &mut Scratch) -> usize {
        self.tree.lock().unwrap().match_prefix(r.ns, &r.tokens, &mut s.out)
    }
    fn store(&self, r: &Req, _cached: usize, slots: &[u32], _s: &mut Scratch) {
        self.tree.lock().unwrap().insert(r.ns, &r.tokens, slots).unwrap();
    }
    fn cached_tokens(&self) -> Option<u64> {
        Some(self.tree.lock().unwrap().stats().cached_tokens)
    }
    fn holds(&self) -> &'static str {
        "token + slot"
    }
}

pub struct RkvRw {
    tree: RwLock<RadixTree>,
}

impl RkvRw {
    pub fn new(page: usize) -> Self {
        RkvRw { tree: RwLock::new(rkv_tree(page)) }
    }
}

impl Index for RkvRw {
    fn lookup(&self, r: &Req, s: &mut Scratch) -> usize {
        self.tree.read().unwrap().match_prefix(r.ns, &r.tokens, &mut s.out)
    }
    fn store(&self, r: &Req, _cached: usize, slots: &[u32], _s: &mut Scratch) {
        self.tree.write().unwrap().insert(r.ns, &r.tokens, slots).unwrap();
    }
    fn cached_tokens(&self) -> Option<u64> {
        Some(self.tree.read().unwrap().stats().cached_tokens)
    }
    fn holds(&self) -> &'static str {
        "token + slot"
    }
}

// ------------------------------------------------------------------------ kv-index

pub struct KvIndex {
    pub tree: TokenTree,
}

impl KvIndex {
    pub fn new(page: usize) -> Self {
        // Default::default() is LRU (kv-index does not export the policy type).
        KvIndex { tree: TokenTree::with_config(page, Default::default()) }
    }
}

impl Index for KvIndex {
    fn lookup(&self, r: &Req, _s: &mut Scratch) -> usize {
        self.tree.match_prefix_with_counts(&r.tokens).matched_token_count
    }
    fn store(&self, r: &Req, _cached: usize, _slots: &[u32], _s: &mut Scratch) {
        self.tree.insert_tokens(&r.tokens, "w0");
    }
    fn cached_tokens(&self) -> Option<u64> {
        Some(self.tree.total_token_size() as u64)
    }
    fn holds(&self) -> &'static str {
        "token + tenant (no slot)"
    }
}

// ------------------------------------------------------------------------ dynamo

const WORKER: WorkerWithDpRank = WorkerWithDpRank { worker_id: 0, dp_rank: 0 };

fn dyn_hash(t: &[u32], page: usize, s: &mut Scratch) {
    if !s.is_hashed(t) {
        s.local = compute_block_hash_for_seq(t, page as u32, BlockHashOptions::default());
        s.chain.clear();
        s.mark_hashed(t);
    }
}

fn dyn_score(o: &OverlapScores) -> usize {
    o.scores.get(&WORKER).copied().unwrap_or(0) as usize
}

/// The "stored" event an engine emits for `t` when its first `cached` tokens were cached.
fn dyn_store_event(
    t: &[u32],
    cached: usize,
    page: usize,
    id: u64,
    s: &mut Scratch,
) -> Option<RouterEvent> {
    dyn_hash(t, page, s);
    if s.chain.is_empty() && !s.local.is_empty() {
        s.chain = compute_seq_hash_for_block(&s.local);
    }
    let m = cached / page;
    let n = s.local.len();
    if m >= n {
        return None;
    }
    let blocks = (m..n)
        .map(|i| KvCacheStoredBlockData {
            block_hash: ExternalSequenceBlockHash(s.chain[i]),
            tokens_hash: s.local[i],
            mm_extra_info: None,
        })
        .collect();
    let data = KvCacheEventData::Stored(KvCacheStoreData {
        parent_hash: (m > 0).then(|| ExternalSequenceBlockHash(s.chain[m - 1])),
        start_position: None,
        blocks,
    });
    Some(RouterEvent::new(0, KvCacheEvent { event_id: id, data, dp_rank: 0 }))
}

/// Dynamo's single-threaded `RadixTree` (not `Send`: `Rc<RefCell>` nodes).
pub struct DynRt {
    tree: RefCell<DynamoTree>,
    page: usize,
    id: Cell<u64>,
}

impl DynRt {
    pub fn new(page: usize) -> Self {
        DynRt { tree: RefCell::new(DynamoTree::new()), page, id: Cell::new(0) }
    }
}

impl Index for DynRt {
    fn lookup(&self, r: &Req, s: &mut Scratch) -> usize {
        dyn_hash(&r.tokens, self.page, s);
        dyn_score(&self.tree.borrow().find_matches(s.local.clone(), false)) * self.page
    }
    fn store(&self, r: &Req, cached: usize, _slots: &[u32], s: &mut Scratch) {
        let id = self.id.get();
        self.id.set(id + 1);
        if let Some(ev) = dyn_store_event(&r.tokens, cached, self.page, id, s) {
            self.tree.borrow_mut().apply_event(ev).expect("dynamo accepts the store");
        }
    }
    fn cached_tokens(&self) -> Option<u64> {
        Some(self.tree.borrow().current_size() as u64 * self.page as u64)
    }
    fn holds(&self) -> &'static str {
        "2 block hashes per block (no slot)"
    }
}

/// Dynamo's `ConcurrentRadixTreeCompressed`: lookups on the caller's threads, stores through
/// its worker loop on a thread of its own.
pub struct DynCrtc {
    tree: Arc<ConcurrentRadixTreeCompressed>,
    tx: Option<flume::Sender<WorkerTask>>,
    worker: Option<std::thread::JoinHandle<()>>,
    page: usize,
    id: AtomicU64,
    /// Wait for each store to be applied (a replay must see its own stores).
    ack_each: bool,
}

impl DynCrtc {
    pub fn new(page: usize, ack_each: bool) -> Self {
        let tree = Arc::new(ConcurrentRadixTreeCompressed::new());
        let (tx, rx) = flume::unbounded();
        let t = Arc::clone(&tree);
        let worker = std::thread::spawn(move || {
            t.worker(rx, None).expect("dynamo worker loop");
        });
        DynCrtc { tree, tx: Some(tx), worker: Some(worker), page, id: AtomicU64::new(0), ack_each }
    }
}

impl Drop for DynCrtc {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Index for DynCrtc {
    fn lookup(&self, r: &Req, s: &mut Scratch) -> usize {
        dyn_hash(&r.tokens, self.page, s);
        dyn_score(&self.tree.find_matches(&s.local, false)) * self.page
    }
    fn store(&self, r: &Req, cached: usize, _slots: &[u32], s: &mut Scratch) {
        let id = self.id.fetch_add(1, Ordering::Relaxed);
        let Some(event) = dyn_store_event(&r.tokens, cached, self.page, id, s) else {
            return;
        };
        let tx = self.tx.as_ref().unwrap();
        if self.ack_each {
            let (resp, rx) = tokio::sync::oneshot::channel();
            tx.send(WorkerTask::EventWithAck { event, resp }).unwrap();
            assert!(rx.blocking_recv().unwrap(), "dynamo accepts the store");
        } else {
            tx.send(WorkerTask::Event(event)).unwrap();
        }
    }
    fn sync(&self) {
        let (resp, rx) = tokio::sync::oneshot::channel();
        self.tx.as_ref().unwrap().send(WorkerTask::Flush(resp)).unwrap();
        rx.blocking_recv().unwrap();
    }
    fn holds(&self) -> &'static str {
        "2 block hashes per block (no slot)"
    }
}

// ------------------------------------------------------------------------ vLLM-style map

/// vLLM's prefix-caching map: chained block hash -> the block's slots, under one Mutex.
pub struct BlockMap {
    map: Mutex<FxHashMap<u64, Vec<u32>>>,
    page: usize,
}

impl BlockMap {
    pub fn new(page: usize) -> Self {
        BlockMap { map: Mutex::new(FxHashMap::default()), page }
    }
    fn hash(&self, t: &[u32], s: &mut Scratch) {
        if s.is_hashed(t) {
            return;
        }
        s.chain.clear();
        let mut parent = 0x5eed_u64;
        for b in t.chunks_exact(self.page) {
            // SAFETY: a u32 slice viewed as its bytes (alignment 1, same length in bytes).
            let bytes = unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<u8>(), b.len() * 4) };
            parent = xxhash_rust::xxh3::xxh3_64_with_seed(bytes, parent);
            s.chain.push(parent);
        }
        s.mark_hashed(t);
    }
}

impl Index for BlockMap {
    fn lookup(&self, r: &Req, s: &mut Scratch) -> usize {
        self.hash(&r.tokens, s);
        s.out.clear();
        let map = self.map.lock().unwrap();
        let mut m = 0;
        for h in &s.chain {
            match map.get(h) {
                Some(slots) => {
                    s.out.extend_from_slice(slots);
                    m += 1;
                }
                None => break,
            }
        }
        m * self.page
    }
    fn store(&self, r: &Req, cached: usize, slots: &[u32], s: &mut Scratch) {
        self.hash(&r.tokens, s);
        let n = s.chain.len();
        let m = cached / self.page;
        if m >= n {
            return;
        }
        let p = self.page;
        let mut map = self.map.lock().unwrap();
        for (i, &h) in s.chain.iter().enumerate().skip(m) {
            map.entry(h).or_insert_with(|| slots[i * p..(i + 1) * p].to_vec());
        }
    }
    fn cached_tokens(&self) -> Option<u64> {
        Some(self.map.lock().unwrap().len() as u64 * self.page as u64)
    }
    fn holds(&self) -> &'static str {
        "block hash + slot"
    }
}
