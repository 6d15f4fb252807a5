//! KV-cache events: what cluster routers see of a cache (`docs/contract/KV_EVENTS.md`).
//!
//! This module is the standalone layer the cache's hooks feed: typed events, their page
//! hashes ([`hash`]), the KV cache group a cache publishes as ([`group`]) and vLLM's
//! msgpack wire ([`wire`]); the ZMQ publisher is the crate
//! `radixkv-publisher`, attached to a sink as a [`BatchOutlet`]. The hooks that push into
//! it are in the tree (`Insert::hang`,
//! `RadixTree::evict_leaf`; enabled with `Cache::enable_events`); where they push relative
//! to the publish of a leaf and the unlink of an evicted one, and why, is in
//! `docs/kv-events.md`, "sequencing with the tree", and next to the pushes.
//!
//! # The sink
//!
//! An [`EventSink`] gathers the events of one cache. The cache pushes events into it
//! ([`EventSink::push`], or the helpers [`EventSink::stored`], [`EventSink::removed`],
//! [`EventSink::cleared`] that fill in the namespace's identity, page size and medium);
//! [`EventSink::flush`] closes the events pushed so far into one batch with the next
//! sequence number. The batches go either to an in-process queue that
//! [`EventSink::drain`] empties, or, once an outlet is attached ([`EventSink::attach`]:
//! the publisher's), to it.
//!
//! Contract:
//! - **Thread-safety.** Every method takes `&self` and may be called from any thread at
//!   once; the sink is `Send + Sync`.
//! - **Order.** Events keep the order of their `push` calls (one short lock orders
//!   them), and a batch holds exactly the events pushed after the previous batch closed
//!   and before it did. Batches are numbered 0, 1, 2, ... in the order they close, without
//!   gaps, and reach the drain queue or the publisher in that order. The sink adds no
//!   causality of its own: a caller that must have event A before event B (a page's
//!   `BlockStored` before its child's) pushes A before B begins, which is what the tree's
//!   hooks guarantee.
//! - **Cost.** `push` takes one uncontended-in-practice mutex and appends to a `Vec`; it
//!   never blocks on I/O, never encodes, never waits for a consumer. `flush` moves the
//!   events out under the same lock and hands the batch over without blocking: a full
//!   queue (drain or publisher) drops the whole batch and counts it ([`SinkStats`]),
//!   never part of one.
//! - **Hashing off the inserting thread.** The tree's own events name pages by id and
//!   share the new tokens with the leaf; their hashes are computed when the batch is taken
//!   out ([`ClosedBatch::into_batch`], [`EventSink::drain`]), on the taker's thread (the
//!   publisher's), in sequence order whoever takes what, dropped batches included
//!   (`src/events/resolve.rs`). What a consumer receives is unchanged. A flush hashes one
//!   batch itself only when more than 131,072 closed batches wait (nobody takes them out).
//! - **Namespaces.** A namespace's wire identity (LoRA name, cache salt) is fixed by
//!   [`EventSink::set_namespace`] before its first page is hashed; a namespace given
//!   neither is published with `cache_salt = "<decimal id>"`, except namespace 0, the base
//!   model, which has neither. Its page hashes come from [`EventSink::namespace`]'s hasher.

pub mod group;
pub mod hash;
pub(crate) mod resolve;
pub mod wire;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Result, invalid};
// The sink's lock comes from `crate::sync`, so a loom model of the tree's hooks sees it.
use crate::sync::{Mutex, MutexGuard};
use hash::{HashMode, PageHasher};
pub use resolve::ClosedBatch;
pub(crate) use resolve::Pending;
use resolve::{BACKLOG, Resolution};

/// Where the pages of an event live (vLLM's `medium`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Medium {
    /// The device pool: `"GPU"`.
    #[default]
    Gpu,
    /// A host tier in pinned memory: `"CPU_PINNED"`.
    CpuPinned,
}

impl Medium {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::CpuPinned => "CPU_PINNED",
        }
    }

    /// The medium a wire string names, if radixkv knows it.
    pub fn from_wire(s: &str) -> Option<Medium> {
        match s {
            "GPU" => Some(Medium::Gpu),
            "CPU_PINNED" => Some(Medium::CpuPinned),
            _ => None,
        }
    }
}

/// A change to the set of cached pages.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// Pages became cached (one insert that added pages), in token order.
    BlockStored {
        /// One hash per new page (see [`hash`]).
        block_hashes: Vec<u64>,
        /// The hash of the page just before the first new one; `None` when the first new
        /// page is its namespace's first.
        parent_block_hash: Option<u64>,
        /// The new pages' tokens, concatenated (`block_size` per page).
        token_ids: Vec<u32>,
        /// The cache's page size.
        block_size: u32,
        /// The namespace's LoRA name, if any (shared with the namespace's record: a store
        /// allocates no string).
        lora_name: Option<Arc<str>>,
        /// The namespace's cache salt, if any (on the wire: a tagged extra key of the
        /// first page, the way Dynamo's decoder reads it).
        cache_salt: Option<Arc<str>>,
        /// Where the pages live.
        medium: Medium,
    },
    /// Pages stopped being cached (eviction, reset, a namespace dropped).
    BlockRemoved {
        /// Their hashes.
        block_hashes: Vec<u64>,
        /// Where they lived.
        medium: Medium,
    },
    /// Every page of the cache is gone.
    AllBlocksCleared,
}

/// The events of one [`EventSink::flush`].
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// When the batch closed: seconds since the Unix epoch.
    pub ts: f64,
    /// The events, in push order.
    pub events: Vec<KvEvent>,
}

/// How a namespace is named on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceMeta {
    /// The LoRA adapter's name (`lora_name`), if the namespace is one.
    pub lora_name: Option<String>,
    /// The cache salt (tenant isolation), if any.
    pub cache_salt: Option<String>,
}

/// An [`EventSink`]'s settings.
#[derive(Debug, Clone)]
pub struct SinkOptions {
    /// The cache's page size (`block_size` of every `BlockStored`).
    pub block_size: u32,
    /// The page hash.
    pub hash_mode: HashMode,
    /// The medium of the cache's pages.
    pub medium: Medium,
    /// The most closed batches the drain queue holds before it drops new ones (counted).
    pub max_drain_batches: usize,
}

impl Default for SinkOptions {
    fn default() -> Self {
        SinkOptions {
            block_size: 16,
            hash_mode: HashMode::Xxh3,
            medium: Medium::Gpu,
            max_drain_batches: 1 << 16,
        }
    }
}

/// A sink's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SinkStats {
    /// Batches closed (sequence numbers handed out).
    pub batches: u64,
    /// Events pushed.
    pub events: u64,
    /// Batches dropped because the drain queue was full (the publisher counts its own).
    pub dropped: u64,
    /// Tree events left out at resolution because they named a page id the sink did not
    /// know (see `resolve`): 0 unless the hooks' order is broken.
    pub unresolved: u64,
}

/// A namespace's resolved identity and hasher.
#[derive(Debug)]
pub struct NamespaceInfo {
    /// The LoRA name published.
    pub lora_name: Option<Arc<str>>,
    /// The cache salt published (the decimal id for a namespace given neither).
    pub cache_salt: Option<Arc<str>>,
    /// Its page hasher.
    pub hasher: PageHasher,
}

/// Where a sink's closed batches go once attached ([`EventSink::attach`]): the publisher's
/// queue. `submit` is called under the sink's lock, once per batch, in sequence order; it
/// must not block and must not call into the sink (it may drop a batch and count it: a gap
/// the consumer sees in `seq`). The batch's tree events are hashed when the consumer takes
/// it ([`ClosedBatch::into_batch`], on the consumer's thread): not in `submit`, which runs
/// on the flushing thread.
pub trait BatchOutlet: Send {
    /// Takes batch `seq`.
    fn submit(&mut self, seq: u64, batch: ClosedBatch);
}

/// Where closed batches go.
enum Output {
    /// The drain queue: batches already resolved (by a `drain_front` that left them), then
    /// those not yet.
    Drain {
        ready: VecDeque<(u64, EventBatch)>,
        closed: VecDeque<ClosedBatch>,
    },
    Publish(Box<dyn BatchOutlet>),
}

impl Output {
    fn drain() -> Output {
        Output::Drain { ready: VecDeque::new(), closed: VecDeque::new() }
    }
}

struct State {
    pending: Vec<Pending>,
    next_seq: u64,
    out: Output,
    stats: SinkStats,
}

/// The event sink of one cache (see the module docs for its contract).
pub struct EventSink {
    opts: SinkOptions,
    state: Mutex<State>,
    /// The tree events' deferred hashing (`resolve`).
    res: Arc<Resolution>,
    /// Identities set by `set_namespace`, and those resolved (set or default) once used.
    meta: RwLock<HashMap<u64, NamespaceMeta>>,
    used: RwLock<HashMap<u64, Arc<NamespaceInfo>>>,
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSink").field("opts", &self.opts).field("stats", &self.stats()).finish()
    }
}

/// Seconds since the Unix epoch, as vLLM's `time.time()`.
pub(crate) fn now_ts() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

impl EventSink {
    /// A sink delivering to its drain queue. `InvalidArgument` for page size 0.
    pub fn new(opts: SinkOptions) -> Result<Self> {
        if opts.block_size == 0 {
            return Err(invalid("events: block_size (the page size) must be at least 1"));
        }
        Ok(EventSink {
            opts: opts.clone(),
            state: Mutex::new(State {
                pending: Vec::new(),
                next_seq: 0,
                out: Output::drain(),
                stats: SinkStats::default(),
            }),
            res: Arc::new(Resolution::new(opts.block_size, opts.medium)),
            meta: RwLock::new(HashMap::new()),
            used: RwLock::new(HashMap::new()),
        })
    }

    /// The settings.
    pub fn options(&self) -> &SinkOptions {
        &self.opts
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock is held leaves the state consistent (every step is one
        // push or one move), so a poisoned lock is taken over.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Names namespace `ns` on the wire. Must come before its first page is hashed
    /// ([`EventSink::namespace`]): `InvalidArgument` after that (its pages' hashes depend on
    /// it), or for a LoRA name or salt that is empty.
    pub fn set_namespace(&self, ns: u64, meta: NamespaceMeta) -> Result<()> {
        if meta.lora_name.as_deref() == Some("") || meta.cache_salt.as_deref() == Some("") {
            return Err(invalid("events: a namespace's lora_name or cache_salt may not be empty"));
        }
        let mut m = self.meta.write().unwrap_or_else(|p| p.into_inner());
        if self.used.read().unwrap_or_else(|p| p.into_inner()).contains_key(&ns) {
            return Err(invalid(format!(
                "events: namespace {ns} already has hashed pages; name it before its first insert"
            )));
        }
        m.insert(ns, meta);
        Ok(())
    }

    /// Namespace `ns`'s identity and page hasher (fixing its identity from now on).
    pub fn namespace(&self, ns: u64) -> Arc<NamespaceInfo> {
        if let Some(i) = self.used.read().unwrap_or_else(|p| p.into_inner()).get(&ns) {
            return i.clone();
        }
        let m = self.meta.read().unwrap_or_else(|p| p.into_inner());
        let mut used = self.used.write().unwrap_or_else(|p| p.into_inner());
        used.entry(ns)
            .or_insert_with(|| {
                let meta = m.get(&ns).cloned().unwrap_or_default();
                let (lora_name, cache_salt) = resolve(ns, meta);
                let hasher = PageHasher::new(
                    self.opts.hash_mode,
                    lora_name.as_deref(),
                    cache_salt.as_deref(),
                );
                Arc::new(NamespaceInfo { lora_name, cache_salt, hasher })
            })
            .clone()
    }

    /// Appends one event to the open batch. A `BlockRemoved` right after another of the
    /// same medium is merged into it (one event listing both's pages, in order), as SGLang's
    /// recorder does: an eviction pass removes many leaves one after the other (the merge
    /// is made when the batch is resolved, the same for the tree's removals and these).
    pub fn push(&self, ev: KvEvent) {
        self.push_pending(Pending::Ready(ev));
    }

    /// Appends one event, ready or the tree's (hashed when its batch is resolved).
    pub(crate) fn push_pending(&self, ev: Pending) {
        let mut s = self.lock();
        s.stats.events += 1;
        s.pending.push(ev);
    }

    /// Pushes a `BlockStored` of namespace `ns`'s new pages, with its identity, the page
    /// size and the medium filled in. `token_ids` must hold `block_size` tokens per hash.
    pub fn stored(
        &self,
        ns: u64,
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
    ) {
        let info = self.namespace(ns);
        self.push(self.stored_event(&info, block_hashes, parent_block_hash, token_ids));
    }

    /// The `BlockStored` [`EventSink::stored`] pushes, built without pushing it: a hook
    /// builds it (and hashes, and copies the tokens) before it takes a node lock, and only
    /// [`EventSink::push`]es it under the lock.
    pub fn stored_event(
        &self,
        ns: &NamespaceInfo,
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
    ) -> KvEvent {
        debug_assert_eq!(token_ids.len(), block_hashes.len() * self.opts.block_size as usize);
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size: self.opts.block_size,
            lora_name: ns.lora_name.clone(),
            cache_salt: ns.cache_salt.clone(),
            medium: self.opts.medium,
        }
    }

    /// Pushes a `BlockRemoved` of these pages.
    pub fn removed(&self, block_hashes: Vec<u64>) {
        self.push(KvEvent::BlockRemoved { block_hashes, medium: self.opts.medium });
    }

    /// Pushes an `AllBlocksCleared`.
    pub fn cleared(&self) {
        self.push(KvEvent::AllBlocksCleared);
    }

    /// Closes the open batch: the events pushed since the last flush get the next sequence
    /// number and go to the drain queue or the publisher. Returns that number, or `None`
    /// when there was nothing to close (no batch, no number used). Never blocks.
    pub fn flush(&self) -> Option<u64> {
        let mut s = self.lock();
        if s.pending.is_empty() {
            return None;
        }
        let seq = s.next_seq;
        s.next_seq += 1;
        s.stats.batches += 1;
        // Queued for resolution under the sink's lock: the queue is in sequence order.
        let (batch, waiting) = self.res.close(seq, now_ts(), std::mem::take(&mut s.pending));
        let max = self.opts.max_drain_batches;
        let st = &mut *s;
        match &mut st.out {
            Output::Drain { ready, closed } => {
                if ready.len() + closed.len() < max {
                    closed.push_back(batch);
                } else {
                    // Dropped whole; still resolved in order (its pages stay known).
                    st.stats.dropped += 1;
                }
            }
            // Under the lock, so the publisher gets batches in sequence order.
            Output::Publish(feed) => feed.submit(seq, batch),
        }
        drop(s);
        if waiting > BACKLOG {
            // Nobody takes batches out as fast as they close: resolve one here (after the
            // sink's lock), so that what waits stays bounded (`resolve`, "Lock order").
            self.res.help(BACKLOG);
        }
        Some(seq)
    }

    /// Locks the resolver and the sink, and resolves every closed batch of the drain queue
    /// into its `ready` part (lock order: resolver, then sink).
    fn settled_drain<R>(&self, f: impl FnOnce(&mut VecDeque<(u64, EventBatch)>) -> R) -> Option<R> {
        if matches!(self.lock().out, Output::Publish(_)) {
            // The publisher's batches are its thread's to hash, not this caller's.
            return None;
        }
        let mut view = self.res.settle();
        let mut s = self.lock();
        let Output::Drain { ready, closed } = &mut s.out else { return None };
        if !closed.is_empty() {
            // Closed after `settle` resolved the queue: resolve them too (no more come
            // while the sink's lock is held).
            view.settle_queued();
        }
        ready.extend(closed.drain(..).map(|c| (c.seq(), c.take_resolved())));
        drop(view);
        Some(f(ready))
    }

    /// Takes every closed batch from the drain queue, in sequence order, with its number.
    /// Empty while a publisher is attached (its batches go there). Hashes the tree's
    /// events of the batches taken on the calling thread.
    pub fn drain(&self) -> Vec<(u64, EventBatch)> {
        self.settled_drain(|q| q.drain(..).collect()).unwrap_or_default()
    }

    /// Takes the first `n` closed batches from the drain queue, in sequence order, where
    /// `n = count(queued)` and `count` sees every queued batch (in order) before anything is
    /// taken, under the sink's lock: a caller with bounded buffers takes as many whole
    /// batches as fit and leaves the rest queued, never putting one back (the C ABI's
    /// `rkv_events_drain`). `count` runs under the lock every push takes, so it should only
    /// measure (it must not call into the sink). Empty while a publisher is attached.
    pub fn drain_front(
        &self,
        count: impl FnOnce(&mut dyn Iterator<Item = &(u64, EventBatch)>) -> usize,
    ) -> Vec<(u64, EventBatch)> {
        self.settled_drain(|q| {
            let n = count(&mut q.iter()).min(q.len());
            q.drain(..n).collect()
        })
        .unwrap_or_default()
    }

    /// The counters.
    pub fn stats(&self) -> SinkStats {
        let mut st = self.lock().stats;
        // Relaxed: a counter.
        st.unresolved = self.res.unresolved.load(crate::sync::Ordering::Relaxed);
        st
    }

    /// The published hashes of the pages named by `ids` (the tree's cached pages, at
    /// quiescence): resolves every closed batch and, in place, the open one's events.
    /// Panics on an id the sink never resolved a store for.
    pub(crate) fn hashes_of(&self, ids: impl IntoIterator<Item = u64>) -> Vec<u64> {
        let mut view = self.res.settle();
        let mut s = self.lock();
        view.settle_open(&mut s.pending);
        drop(s);
        ids.into_iter()
            .map(|id| {
                view.hash_of(id).unwrap_or_else(|| {
                    panic!("events: cached page id {id} has no hash (its store was not resolved)")
                })
            })
            .collect()
    }

    /// Sends closed batches to `feed` from now on (what was in the drain queue first, in
    /// order). `InvalidArgument` if an outlet is attached already.
    pub fn attach(&self, mut feed: Box<dyn BatchOutlet>) -> Result<()> {
        let mut s = self.lock();
        match &mut s.out {
            Output::Publish(_) => {
                Err(invalid("events: a publisher is attached to this sink already"))
            }
            Output::Drain { ready, closed } => {
                for (seq, b) in ready.drain(..) {
                    feed.submit(seq, self.res.resolved(seq, b));
                }
                for c in closed.drain(..) {
                    feed.submit(c.seq(), c);
                }
                s.out = Output::Publish(feed);
                Ok(())
            }
        }
    }

    /// Detaches the outlet: later batches go to the drain queue again.
    pub fn detach(&self) {
        self.lock().out = Output::drain();
    }
}

/// A namespace's published identity: as set, else none for namespace 0 and the decimal id
/// as the salt for any other.
fn resolve(ns: u64, meta: NamespaceMeta) -> (Option<Arc<str>>, Option<Arc<str>>) {
    match meta {
        NamespaceMeta { lora_name: None, cache_salt: None } if ns != 0 => {
            (None, Some(ns.to_string().into()))
        }
        NamespaceMeta { lora_name, cache_salt } => {
            (lora_name.map(Into::into), cache_salt.map(Into::into))
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn sink() -> EventSink {
        EventSink::new(SinkOptions { block_size: 2, ..Default::default() }).unwrap()
    }

    #[test]
    fn batches_are_numbered_in_flush_order_and_keep_push_order() {
        let s = sink();
        assert_eq!(s.flush(), None, "nothing pushed: no batch, no number");
        s.stored(0, vec![1], None, vec![5, 6]);
        s.removed(vec![1]);
        assert_eq!(s.flush(), Some(0));
        s.cleared();
        assert_eq!(s.flush(), Some(1));
        let d = s.drain();
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].0, d[1].0), (0, 1));
        assert!(matches!(d[0].1.events[0], KvEvent::BlockStored { .. }));
        assert!(matches!(d[0].1.events[1], KvEvent::BlockRemoved { .. }));
        assert_eq!(d[1].1.events, vec![KvEvent::AllBlocksCleared]);
        assert!(s.drain().is_empty());
        assert_eq!(s.stats(), SinkStats { batches: 2, events: 3, dropped: 0, unresolved: 0 });
    }

    #[test]
    fn namespace_identity_defaults_and_freezes() {
        let s = sink();
        let base = s.namespace(0);
        assert_eq!((base.lora_name.as_deref(), base.cache_salt.as_deref()), (None, None));
        let seven = s.namespace(7);
        assert_eq!(seven.cache_salt.as_deref(), Some("7"));
        s.set_namespace(3, NamespaceMeta { lora_name: Some("a".into()), cache_salt: None })
            .unwrap();
        let three = s.namespace(3);
        assert_eq!((three.lora_name.as_deref(), three.cache_salt.as_deref()), (Some("a"), None));
        assert!(s.set_namespace(3, NamespaceMeta::default()).is_err(), "hashed already");
        assert!(
            s.set_namespace(4, NamespaceMeta { lora_name: Some(String::new()), cache_salt: None })
                .is_err()
        );
        s.stored(7, vec![9], None, vec![1, 2]);
        s.flush();
        match &s.drain()[0].1.events[0] {
            KvEvent::BlockStored { cache_salt, block_size, .. } => {
                assert_eq!((cache_salt.as_deref(), *block_size), (Some("7"), 2));
            }
            e => panic!("{e:?}"),
        }
    }

    /// What a router merges and what it keeps apart: two namespaces given the same LoRA
    /// name and no salt share the adapter's cache identity (equal tokens hash alike: the
    /// engine chose to share); namespaces given nothing, or different salts, never do.
    #[test]
    fn namespaces_hash_alike_only_when_given_the_same_identity() {
        let s = sink();
        let lora = |n: &str| NamespaceMeta { lora_name: Some(n.into()), cache_salt: None };
        let salt = |n: &str| NamespaceMeta { lora_name: None, cache_salt: Some(n.into()) };
        s.set_namespace(3, lora("a")).unwrap();
        s.set_namespace(5, lora("a")).unwrap();
        s.set_namespace(6, lora("b")).unwrap();
        s.set_namespace(8, salt("t1")).unwrap();
        s.set_namespace(9, salt("t2")).unwrap();
        let tokens: Vec<u32> = (1..=8).collect();
        let h = |ns: u64| s.namespace(ns).hasher.block_hashes(&tokens, 2);
        assert_eq!(h(3), h(5), "same LoRA name, no salt: one cache identity");
        for (a, b) in [(3, 6), (3, 0), (1, 2), (1, 0), (8, 9), (8, 0), (3, 8)] {
            assert!(
                h(a).iter().zip(h(b)).all(|(x, y)| *x != y),
                "namespaces {a} and {b} must never share a page hash"
            );
        }
    }

    #[test]
    fn a_full_drain_queue_drops_whole_batches() {
        let s = EventSink::new(SinkOptions {
            block_size: 1,
            max_drain_batches: 2,
            ..Default::default()
        })
        .unwrap();
        for i in 0..5 {
            s.removed(vec![i, i + 100]);
            s.flush();
        }
        let d = s.drain();
        assert_eq!(d.iter().map(|b| b.0).collect::<Vec<_>>(), vec![0, 1]);
        assert!(d.iter().all(|b| b.1.events.len() == 1));
        assert_eq!(s.stats().dropped, 3);
        assert_eq!(s.stats().batches, 5);
    }

    #[test]
    fn drain_front_takes_what_count_says_and_leaves_the_rest() {
        let s = sink();
        for i in 0..4 {
            s.removed(vec![i]);
            s.flush();
        }
        let mut seen = Vec::new();
        let got = s.drain_front(|q| {
            seen.extend(q.map(|b| b.0));
            2
        });
        assert_eq!(seen, vec![0, 1, 2, 3], "count sees every queued batch");
        assert_eq!(got.iter().map(|b| b.0).collect::<Vec<_>>(), vec![0, 1]);
        assert!(s.drain_front(|_| 0).is_empty(), "0: nothing taken");
        assert_eq!(s.drain_front(|_| 99).iter().map(|b| b.0).collect::<Vec<_>>(), vec![2, 3]);
        assert!(s.drain().is_empty());
    }

    #[test]
    fn adjacent_removals_merge() {
        let s = sink();
        s.removed(vec![1, 2]);
        s.removed(vec![3]);
        s.push(KvEvent::BlockRemoved { block_hashes: vec![4], medium: Medium::CpuPinned });
        s.cleared();
        s.removed(vec![5]);
        s.flush();
        let d = s.drain();
        assert_eq!(
            d[0].1.events,
            vec![
                KvEvent::BlockRemoved { block_hashes: vec![1, 2, 3], medium: Medium::Gpu },
                KvEvent::BlockRemoved { block_hashes: vec![4], medium: Medium::CpuPinned },
                KvEvent::AllBlocksCleared,
                KvEvent::BlockRemoved { block_hashes: vec![5], medium: Medium::Gpu },
            ]
        );
    }

    #[test]
    fn sink_is_send_and_sync() {
        fn ok<T: Send + Sync>() {}
        ok::<EventSink>();
    }

    #[test]
    fn page_size_zero_is_refused() {
        assert!(EventSink::new(SinkOptions { block_size: 0, ..Default::default() }).is_err());
    }
}
