//! The consumer proof: radixkv's KV-event stream read by a real consumer, Dynamo's KV
//! router (`dynamo-kv-router` 1.6.1), through a real loopback ZMQ socket.
//!
//! - [`PageModel`] is a simple sequential page cache (prefix-closed, LRU over leaves, a
//!   capacity in pages) that pushes the events a cache would into a radixkv
//!   [`EventSink`]: a `BlockStored` for an insert's new pages, a `BlockRemoved` for the
//!   pages each insert's eviction takes. The real cache will feed the same sink later.
//! - [`DynamoConsumer`] subscribes to the publisher, decodes every batch with Dynamo's
//!   `zmq_wire::decode_event_batch`, runs each event through Dynamo's
//!   `ZmqEventNormalizer`, and applies it to Dynamo's `RadixTree` indexer. It repairs gaps
//!   (a batch missed before the subscription landed) through the publisher's replay socket,
//!   as a router does.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dynamo_kv_router::RadixTree;
use dynamo_kv_router::protocols::{BlockHashOptions, WorkerWithDpRank, compute_block_hash_for_seq};
use dynamo_kv_router::zmq_wire::{ZmqEventNormalizer, decode_event_batch};
use radixkv::events::EventSink;
use radixkv::events::publisher::REPLAY_END;

/// One cached page of the model.
struct Page {
    parent: Option<u64>,
    children: u32,
    stamp: u64,
}

/// A sequential page cache that publishes its changes into an [`EventSink`].
pub struct PageModel {
    sink: Arc<EventSink>,
    page: usize,
    capacity: usize,
    pages: HashMap<(u64, u64), Page>,
    /// Leaves by (stamp, namespace, hash): the LRU order.
    leaves: BTreeSet<(u64, u64, u64)>,
    clock: u64,
}

impl PageModel {
    /// A model of `capacity` pages publishing into `sink` (its page size is the model's).
    pub fn new(sink: Arc<EventSink>, capacity: usize) -> Self {
        let page = sink.options().block_size as usize;
        PageModel { sink, page, capacity, pages: HashMap::new(), leaves: BTreeSet::new(), clock: 0 }
    }

    /// Cached pages.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// The hashes of the pages of `tokens` in namespace `ns`.
    fn chain(&self, ns: u64, tokens: &[u32]) -> Vec<u64> {
        self.sink.namespace(ns).hasher.block_hashes(tokens, self.page)
    }

    /// How many leading pages of `tokens` are cached in `ns` (changes nothing).
    pub fn matched(&self, ns: u64, tokens: &[u32]) -> usize {
        let hashes = self.chain(ns, tokens);
        hashes.iter().take_while(|h| self.pages.contains_key(&(ns, **h))).count()
    }

    fn touch(&mut self, ns: u64, h: u64) {
        self.clock += 1;
        let p = self.pages.get_mut(&(ns, h)).expect("cached");
        if p.children == 0 {
            self.leaves.remove(&(p.stamp, ns, h));
            self.leaves.insert((self.clock, ns, h));
        }
        p.stamp = self.clock;
    }

    /// Caches the pages of `tokens` in `ns`, evicts LRU leaves down to the capacity, and
    /// pushes the events (a store of the new pages, then a removal of the evicted ones).
    /// Returns the pages that were cached before.
    pub fn insert(&mut self, ns: u64, tokens: &[u32]) -> usize {
        let hashes = self.chain(ns, tokens);
        let m = hashes.iter().take_while(|h| self.pages.contains_key(&(ns, **h))).count();
        for h in &hashes[..m] {
            self.touch(ns, *h);
        }
        if m < hashes.len() {
            let parent = m.checked_sub(1).map(|i| hashes[i]);
            if let Some(ph) = parent {
                let p = self.pages.get_mut(&(ns, ph)).expect("cached");
                if p.children == 0 {
                    self.leaves.remove(&(p.stamp, ns, ph));
                }
                p.children += 1;
            }
            for i in m..hashes.len() {
                self.clock += 1;
                let leaf = i + 1 == hashes.len();
                self.pages.insert(
                    (ns, hashes[i]),
                    Page {
                        parent: i.checked_sub(1).map(|j| hashes[j]),
                        children: u32::from(!leaf),
                        stamp: self.clock,
                    },
                );
                if leaf {
                    self.leaves.insert((self.clock, ns, hashes[i]));
                }
            }
            let tokens = tokens[m * self.page..hashes.len() * self.page].to_vec();
            self.sink.stored(ns, hashes[m..].to_vec(), parent, tokens);
        }
        let mut removed = Vec::new();
        while self.pages.len() > self.capacity {
            let (_, ns, h) = self.leaves.pop_first().expect("a full cache has a leaf");
            let gone = self.pages.remove(&(ns, h)).expect("a leaf is cached");
            removed.push(h);
            if let Some(ph) = gone.parent {
                let p = self.pages.get_mut(&(ns, ph)).expect("a parent is cached");
                p.children -= 1;
                if p.children == 0 {
                    self.leaves.insert((p.stamp, ns, ph));
                }
            }
        }
        if !removed.is_empty() {
            self.sink.removed(removed);
        }
        m
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
}
