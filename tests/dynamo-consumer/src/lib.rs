//! The consumer proof: radixkv's KV-event stream read by a real consumer, Dynamo's KV
//! router (`dynamo-kv-router` 1.6.1), through a real loopback ZMQ socket.
//!
//! - [`Engine`] drives a real radixkv [`Cache`] with KV events on, as a serving engine
//!   (and `radixkv replay`) does: match and lock, allocate (evicting from the pool),
//!   insert, release; its tree's hooks push the events.
//! - [`DynamoConsumer`] subscribes to the publisher, decodes every batch with Dynamo's
//!   `zmq_wire::decode_event_batch`, runs each event through Dynamo's
//!   `ZmqEventNormalizer`, and applies it to Dynamo's `RadixTree` indexer. It repairs gaps
//!   (a batch missed before the subscription landed) through the publisher's replay socket,
//!   as a router does.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dynamo_kv_router::RadixTree;
use dynamo_kv_router::protocols::KvCacheEventData;
use dynamo_kv_router::protocols::{BlockHashOptions, WorkerWithDpRank, compute_block_hash_for_seq};
use dynamo_kv_router::zmq_wire::{ZmqEventNormalizer, decode_event_batch};
use radixkv::events::hash::HashMode;
use radixkv::events::{EventSink, NamespaceMeta};
use radixkv::{Cache, CacheOptions, Error, EventOptions, SlotRun};
use radixkv_publisher::{Publisher, PublisherOptions, REPLAY_END};

/// How often an engine retries an allocation that finds every slot pinned by the other
/// threads (they release within a request).
const ALLOC_RETRIES: u32 = 10_000;

/// A serving engine's use of a radixkv [`Cache`] with KV events on: per request,
/// `match_and_lock` the prompt, take slots for the uncached page-aligned rest (evicting
/// the shortfall from the pool, or fresh slot numbers without one), insert, release (what
/// `radixkv replay` does). The caller flushes the events ([`Cache::flush_events`]).
pub struct Engine {
    cache: Cache,
    page: usize,
    pool: usize,
    next_slot: AtomicU64,
}

impl Engine {
    /// A cache of page size `page` with events on (`hash_mode`) and, with `capacity`, a
    /// pool of that many slots (a multiple of the page); namespaces named by `names`
    /// before anything is inserted.
    pub fn new(
        page: usize,
        capacity: Option<usize>,
        hash_mode: HashMode,
        names: &[(u64, NamespaceMeta)],
    ) -> Engine {
        let pool = capacity.unwrap_or(0);
        let mut cache =
            Cache::new(CacheOptions { page_size: page, pool_slots: pool, ..Default::default() })
                .expect("a cache");
        cache.enable_events(EventOptions { hash_mode, ..Default::default() }).expect("events on");
        for (ns, meta) in names {
            cache.set_namespace_meta(*ns, meta.clone()).expect("a namespace named");
        }
        Engine { cache, page, pool, next_slot: AtomicU64::new(0) }
    }

    /// The cache.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The event sink.
    pub fn sink(&self) -> &Arc<EventSink> {
        self.cache.events().expect("events are on")
    }

    /// Attaches a publisher to the cache's sink.
    pub fn publish(&self, opts: PublisherOptions) -> Publisher {
        Publisher::start(self.cache.event_sink().expect("events on"), opts).expect("a publisher")
    }

    /// The last batch closed so far, if any.
    pub fn last_seq(&self) -> Option<u64> {
        self.sink().stats().batches.checked_sub(1)
    }

    /// Cached pages (exact at quiescence).
    pub fn cached_pages(&self) -> u64 {
        self.cache.stats().tree.cached_tokens / self.page as u64
    }

    /// How many leading pages of `tokens` are cached in `ns` now (exact at quiescence).
    pub fn matched(&self, ns: u64, tokens: &[u32]) -> usize {
        let mut runs: Vec<SlotRun> = Vec::new();
        self.cache.match_prefix(ns, tokens, &mut runs) / self.page
    }

    /// Runs one request of `tokens` in `ns`; returns the pages its `match_and_lock` found.
    pub fn run(&self, ns: u64, tokens: &[u32]) -> usize {
        let n = tokens.len() / self.page * self.page;
        if self.pool > 0 && n > self.pool {
            return 0;
        }
        let mut runs = Vec::new();
        let guard = self.cache.match_and_lock(ns, tokens, &mut runs);
        let m = guard.len();
        if n > m {
            self.take_slots(n - m, &mut runs);
            self.cache.insert(ns, &tokens[..n], &runs).expect("insert");
        }
        drop(guard);
        self.cache.reclaim();
        m / self.page
    }

    fn take_slots(&self, k: usize, runs: &mut Vec<SlotRun>) {
        if self.pool == 0 {
            let start = self.next_slot.fetch_add(k as u64, Ordering::Relaxed);
            runs.push(SlotRun { start: start as u32, len: k as u32 });
            return;
        }
        for _ in 0..ALLOC_RETRIES {
            let free = self.cache.stats().free_slots as usize;
            if free < k {
                self.cache.evict(k - free, None).expect("evict");
            }
            match self.cache.alloc_runs(k, runs) {
                Ok(()) => return,
                Err(Error::OutOfSlots { .. }) => std::thread::yield_now(),
                Err(e) => panic!("alloc: {e}"),
            }
        }
        panic!("the pool stayed short of {k} slots");
    }
}

/// Dynamo's side: a SUB socket, a DEALER for replay, and Dynamo's decoder, normalizer and
/// radix-tree indexer.
pub struct DynamoConsumer {
    sub: zmq::Socket,
    replay: zmq::Socket,
    normalizer: ZmqEventNormalizer,
    tree: RadixTree,
    worker: WorkerWithDpRank,
    page: u32,
    next_seq: u64,
    next_event_id: u64,
    /// Batches applied, events applied, and batches that came through replay.
    pub counts: Counts,
}

/// What a [`DynamoConsumer`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Batches applied (each once, in sequence order).
    pub batches: u64,
    /// Events applied to the index.
    pub events: u64,
    /// Batches that arrived through replay.
    pub replayed: u64,
}

impl DynamoConsumer {
    /// Subscribes to `endpoint` (and connects a replay client to `replay_endpoint`) in
    /// `ctx`, for a cache of page size `page`.
    pub fn connect(ctx: &zmq::Context, endpoint: &str, replay_endpoint: &str, page: u32) -> Self {
        let sub = ctx.socket(zmq::SUB).unwrap();
        sub.set_rcvhwm(0).unwrap();
        sub.set_subscribe(b"").unwrap();
        sub.connect(endpoint).unwrap();
        let replay = ctx.socket(zmq::DEALER).unwrap();
        replay.set_rcvtimeo(10_000).unwrap();
        replay.connect(replay_endpoint).unwrap();
        DynamoConsumer {
            sub,
            replay,
            normalizer: ZmqEventNormalizer::new(page),
            tree: RadixTree::new(),
            worker: WorkerWithDpRank { worker_id: 7, dp_rank: 0 },
            page,
            next_seq: 0,
            next_event_id: 0,
            counts: Counts::default(),
        }
    }

    /// Decodes one batch with Dynamo's decoder and applies its events; panics on anything
    /// Dynamo rejects or filters out.
    fn apply(&mut self, seq: u64, payload: &[u8]) {
        assert_eq!(seq, self.next_seq);
        let batch = decode_event_batch(payload)
            .unwrap_or_else(|e| panic!("batch {seq}: Dynamo cannot decode it: {e}"));
        for raw in batch.events {
            let id = self.next_event_id;
            self.next_event_id += 1;
            let placed = self
                .normalizer
                .normalize(raw, id, self.worker)
                .unwrap_or_else(|| panic!("batch {seq}: Dynamo's normalizer dropped an event"));
            let ev = placed.into_router_event().expect("a device-tier event");
            self.tree
                .apply_event(ev)
                .unwrap_or_else(|e| panic!("batch {seq}: Dynamo's index refused an event: {e:?}"));
            self.counts.events += 1;
        }
        self.next_seq += 1;
        self.counts.batches += 1;
    }

    /// Asks the replay socket for every kept batch from `next_seq` on and applies them.
    fn repair(&mut self) {
        self.replay.send_multipart([&b""[..], &self.next_seq.to_be_bytes()], 0).unwrap();
        loop {
            let m = self.replay.recv_multipart(0).expect("a replay answer");
            let seq = u64::from_be_bytes(m[1][..].try_into().unwrap());
            if seq == REPLAY_END {
                return;
            }
            if seq == self.next_seq {
                self.apply(seq, &m[2]);
                self.counts.replayed += 1;
            }
        }
    }

    /// Applies batches until every batch up to `last` has been applied, live or through
    /// replay. Panics after 30 s.
    pub fn catch_up(&mut self, last: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.next_seq <= last {
            assert!(Instant::now() < deadline, "batch {} never came", self.next_seq);
            if self.sub.poll(zmq::POLLIN, 100).unwrap() == 0 {
                self.repair();
                continue;
            }
            let m = self.sub.recv_multipart(0).unwrap();
            let seq = u64::from_be_bytes(m[1][..].try_into().unwrap());
            if seq > self.next_seq {
                self.repair();
            }
            if seq == self.next_seq {
                self.apply(seq, &m[2]);
            }
        }
    }

    /// Dynamo's overlap (in pages) for a request of `tokens` under this LoRA name and salt:
    /// its own request-side hashes, looked up in its index.
    pub fn overlap(
        &self,
        tokens: &[u32],
        lora_name: Option<&str>,
        cache_salt: Option<&str>,
    ) -> u32 {
        let opts =
            BlockHashOptions { lora_name, cache_namespace: cache_salt, ..Default::default() };
        let local = compute_block_hash_for_seq(tokens, self.page, opts);
        self.tree.find_matches(local, false).scores.get(&self.worker).copied().unwrap_or(0)
    }

    /// Blocks Dynamo's index holds for this consumer's worker (its lookup's size).
    pub fn size(&self) -> usize {
        self.tree.current_size()
    }

    /// The sequence hashes of every block Dynamo's index holds, sorted (from its own dump).
    pub fn block_hashes(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for ev in self.tree.dump_tree_as_events() {
            if let KvCacheEventData::Stored(s) = ev.event.data {
                out.extend(s.blocks.iter().map(|b| b.block_hash.0));
            }
        }
        out.sort_unstable();
        out
    }
}
