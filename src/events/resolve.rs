//! Deferred page hashes: the tree's events are pushed naming pages by id, and hashed
//! (resolved) off the inserting thread, by whoever takes the batch out of the sink (the
//! publisher's thread, or the caller of `drain`), in sequence order.
//!
//! # Why
//!
//! Hashing a new page (two XXH3-64, or a SHA-256 in the SGLang mode) was most of what KV
//! events cost the inserting thread. A page's hash is a chain: it needs its parent page's
//! hash, so it cannot be computed just anywhere, but it can be computed by a consumer that
//! applies the stream in order, because the stream's order already puts every page's store
//! before anything naming it (`docs/kv-events.md`, "Sequencing with the tree").
//!
//! # The protocol
//!
//! - **Ids.** Every page a tree with events on caches gets a page id, unique for the
//!   tree's life: a leaf of `n` pages takes `n` consecutive ids from the tree's counter when
//!   it is built (before any lock), and keeps the first on its node (`Node::page_id`); a
//!   split's halves keep theirs (the upper half the first id, the lower half the first id
//!   plus the upper half's pages). So every page of a node is named by `page_id + i`.
//! - **Push (the inserting or evicting thread).** A store is pushed as
//!   [`Pending::Stored`]: the namespace, the id of the parent page (the last page of the
//!   node it hangs under; none at a root), the leaf's first id and its tokens. A removal as
//!   [`Pending::Removed`]: the leaf's first id and page count. They are pushed exactly where
//!   the hashed events were (same lock, same point), so the stream's order is unchanged.
//! - **Close (`flush`, under the sink's lock).** A batch closes with its pending events,
//!   raw, and is appended to the resolution queue ([`Resolution::queue`]) while the sink's
//!   lock is still held: the queue is in sequence order.
//! - **Resolve (whoever takes a batch out: [`ClosedBatch::into_batch`]).** Under the
//!   resolver's lock: pop the queue's front batch, hash its stores in push order (each from
//!   its parent id's chain state, found in the resolver's map of live pages; the new pages
//!   then enter the map), and turn each removal's ids into the hashes they were stored
//!   with (leaving the map); then mark the batch resolved; repeat until the wanted batch is
//!   resolved. Popping and resolving under the one lock makes resolution run in sequence
//!   order whoever does it (the publisher's thread, a replay, a drain, a flush that helps):
//!   the map then sees every page's store before any event naming it, which is the
//!   stream's order property. A batch nobody will deliver (dropped at a full queue) stays in
//!   the queue and is resolved all the same, so the pages it stored are known to later
//!   batches.
//! - **Retire.** A chunk (one stored leaf's hashes) leaves the map when its last page is
//!   removed; an id is never named again after its removal (a page stored again gets new
//!   ids), so a removal never races a later use of its ids. [`Pending::Cleared`] (the
//!   exclusive reset that empties the tree) empties the map.
//! - **Lock order.** Resolver lock → sink lock → queue lock; the sink's lock holders
//!   (push, flush) take at most the queue's lock, which is held only to push or pop, so a
//!   push or flush never waits for hashing. A flush whose queue has over [`BACKLOG`]
//!   batches waiting (nobody takes them out fast enough) resolves the front one itself,
//!   after releasing the sink's lock: memory stays bounded, and hashing is then paid by
//!   the producer.
//! - **Errors.** An id the map does not know (which the order property rules out) is
//!   counted in [`SinkStats::unresolved`](super::SinkStats::unresolved) and its event left
//!   out; the loom models assert the count stays 0.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use super::hash::ChainState;
use super::wire::{EventView, WireOptions, encode_with};
use super::{EventBatch, KvEvent, Medium, NamespaceInfo};
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};

/// The most closed batches that may wait for resolution before a flush resolves one
/// itself (above the publisher's default queue of 100,000 and the drain queue's 65,536).
pub(crate) const BACKLOG: usize = 1 << 17;

/// An event as pushed: ready, or one of the tree's, hashed at resolution.
#[derive(Debug)]
pub(crate) enum Pending {
    /// An event whose hashes are known (the host tier's, `EventSink::push`'s).
    Ready(KvEvent),
    /// A new leaf's pages: ids `first..first + len / block_size`.
    Stored {
        /// The namespace's identity and hasher.
        info: Arc<NamespaceInfo>,
        /// The id of the page just before the first new one (`None`: a namespace's first).
        parent: Option<u64>,
        /// The first new page's id.
        first: u64,
        /// The new pages' tokens are `words[..len]`: the new leaf's edge, shared (no copy
        /// on the inserting thread; copied into the `BlockStored` at resolution).
        words: Arc<[u32]>,
        /// How many tokens.
        len: usize,
    },
    /// A leaf's pages left: ids `first..first + pages`.
    Removed {
        /// The first page's id.
        first: u64,
        /// How many pages.
        pages: u32,
    },
    /// Pages left, by id (the exclusive reset when pinned pages stay).
    RemovedIds(Vec<u64>),
    /// The tree emptied: `AllBlocksCleared`, and the map forgets every page.
    Cleared,
    /// Nothing (an open batch's event resolved in place that named an unknown id).
    Skip,
}

/// A resolved event: a ready one, or a tree store hashed, whose tokens are still the
/// leaf's shared words: copied into a [`KvEvent`] only for a caller that takes the batch
/// ([`ClosedBatch::into_batch`]); [`ClosedBatch::into_payload`] encodes them from the
/// words.
#[derive(Debug)]
pub(crate) enum Resolved {
    /// An event as it is delivered.
    Event(KvEvent),
    /// A `BlockStored` of the tree's (its page size and medium are the sink's).
    Stored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        info: Arc<NamespaceInfo>,
        /// The tokens are `words[..len]`.
        words: Arc<[u32]>,
        len: usize,
    },
}

impl Resolved {
    /// The event borrowed for encoding.
    fn view(&self, block_size: u32, medium: Medium) -> EventView<'_> {
        match self {
            Resolved::Event(e) => e.view(),
            Resolved::Stored { block_hashes, parent_block_hash, info, words, len } => {
                EventView::Stored {
                    block_hashes,
                    parent_block_hash: *parent_block_hash,
                    token_ids: &words[..*len],
                    block_size,
                    lora_name: info.lora_name.as_deref(),
                    cache_salt: info.cache_salt.as_deref(),
                    medium,
                }
            }
        }
    }

    /// The event as delivered (a store's tokens copied out of the leaf's words).
    fn into_event(self, block_size: u32, medium: Medium) -> KvEvent {
        match self {
            Resolved::Event(e) => e,
            Resolved::Stored { block_hashes, parent_block_hash, info, words, len } => {
                KvEvent::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids: words[..len].to_vec(),
                    block_size,
                    lora_name: info.lora_name.clone(),
                    cache_salt: info.cache_salt.clone(),
                    medium,
                }
            }
        }
    }
}

/// A closed batch resolved: its timestamp and events.
struct ResolvedBatch {
    ts: f64,
    events: Vec<Resolved>,
}

/// What a closed batch holds.
enum Slot {
    Raw(Vec<Pending>),
    Ready(ResolvedBatch),
    Taken,
}

/// One closed batch, shared by the resolution queue (until resolved) and its handle.
struct Closed {
    seq: u64,
    ts: f64,
    slot: Mutex<Slot>,
}

/// The hashes of one stored leaf's pages.
struct Chunk {
    /// The published hash of each page.
    hashes: Box<[u64]>,
    /// The SGLang chain digest of each page; empty in the XXH3 mode, where a page's chain
    /// state is its published hash.
    digests: Box<[[u8; 32]]>,
    /// Pages not removed yet.
    live: usize,
}

impl Chunk {
    fn state(&self, i: usize) -> ChainState {
        match self.digests.get(i) {
            Some(d) => ChainState::Sha256(*d),
            None => ChainState::Xxh3(self.hashes[i]),
        }
    }
}

/// The resolver's map: live pages by id, as chunks keyed by their first id.
#[derive(Default)]
struct Resolver {
    chunks: BTreeMap<u64, Chunk>,
}

impl Resolver {
    /// The chunk holding page `id`, and `id`'s index in it.
    fn find(&mut self, id: u64) -> Option<(u64, usize)> {
        let (&first, c) = self.chunks.range(..=id).next_back()?;
        let i = (id - first) as usize;
        (i < c.hashes.len()).then_some((first, i))
    }

    fn state_of(&mut self, id: u64) -> Option<ChainState> {
        let (first, i) = self.find(id)?;
        Some(self.chunks[&first].state(i))
    }

    /// The hashes of pages `first..first + pages` (one chunk's), which leave the map.
    fn remove(&mut self, first: u64, pages: usize, out: &mut Vec<u64>) -> bool {
        let Some((base, i)) = self.find(first) else { return false };
        let c = self.chunks.get_mut(&base).expect("found");
        if i + pages > c.hashes.len() || c.live < pages {
            return false;
        }
        out.extend_from_slice(&c.hashes[i..i + pages]);
        c.live -= pages;
        if c.live == 0 {
            self.chunks.remove(&base);
        }
        true
    }

    /// Resolves one batch's events, in order.
    fn resolve(
        &mut self,
        raw: Vec<Pending>,
        block_size: u32,
        medium: Medium,
        unresolved: &AtomicU64,
    ) -> Vec<Resolved> {
        let mut out: Vec<Resolved> = Vec::with_capacity(raw.len());
        for p in raw {
            if matches!(p, Pending::Skip) {
                continue;
            }
            match self.resolve_one(p, block_size, medium) {
                Some(ev) => push_merged(&mut out, ev),
                // Relaxed: a counter.
                None => {
                    unresolved.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        out
    }

    /// One event, resolved (`None`: it names an id the map does not hold).
    fn resolve_one(&mut self, p: Pending, block_size: u32, medium: Medium) -> Option<Resolved> {
        Some(match p {
            Pending::Ready(ev) => Resolved::Event(ev),
            Pending::Stored { info, parent, first, words, len } => {
                let tokens = &words[..len];
                let parent = match parent {
                    None => None,
                    Some(id) => Some(self.state_of(id)?),
                };
                let (mut digests, mut hashes) = (Vec::new(), Vec::new());
                let h = &info.hasher;
                let bs = block_size as usize;
                h.hash_pages_compact(parent.as_ref(), tokens, bs, &mut digests, &mut hashes);
                let digests = digests.into_boxed_slice();
                let live = hashes.len();
                if live > 0 {
                    let chunk = Chunk { hashes: hashes.as_slice().into(), digests, live };
                    self.chunks.insert(first, chunk);
                }
                let parent_block_hash = parent.map(|s| h.block_hash(&s));
                Resolved::Stored { block_hashes: hashes, parent_block_hash, info, words, len }
            }
            Pending::Removed { first, pages } => {
                let mut hashes = Vec::with_capacity(pages as usize);
                if !self.remove(first, pages as usize, &mut hashes) {
                    return None;
                }
                Resolved::Event(KvEvent::BlockRemoved { block_hashes: hashes, medium })
            }
            Pending::RemovedIds(ids) => {
                let mut hashes = Vec::with_capacity(ids.len());
                for id in ids {
                    if !self.remove(id, 1, &mut hashes) {
                        return None;
                    }
                }
                Resolved::Event(KvEvent::BlockRemoved { block_hashes: hashes, medium })
            }
            Pending::Cleared => {
                self.chunks.clear();
                Resolved::Event(KvEvent::AllBlocksCleared)
            }
            Pending::Skip => return None,
        })
    }
}

/// Appends `ev`, merging a `BlockRemoved` into a `BlockRemoved` of the same medium just
/// before it (one event listing both's pages, in order), as SGLang's recorder does: an
/// eviction pass removes many leaves one after the other.
fn push_merged(out: &mut Vec<Resolved>, ev: Resolved) {
    if let Resolved::Event(KvEvent::BlockRemoved { block_hashes: more, medium: m }) = &ev
        && let Some(Resolved::Event(KvEvent::BlockRemoved { block_hashes, medium })) =
            out.last_mut()
        && m == medium
    {
        block_hashes.extend_from_slice(more);
        return;
    }
    out.push(ev);
}

/// A sink's resolution state (see the module docs), shared with its closed batches.
pub(crate) struct Resolution {
    /// Closed batches not resolved yet, in sequence order (appended under the sink's lock).
    queue: Mutex<VecDeque<Arc<Closed>>>,
    /// The live pages' hashes; held while a batch is resolved.
    map: Mutex<Resolver>,
    block_size: u32,
    medium: Medium,
    /// Events left out for naming an unknown id (see the module docs).
    /// Bit layout: all 64 bits one count (Relaxed: a statistic, read by `stats`).
    pub(crate) unresolved: AtomicU64,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every step under these locks is one push, pop or map update: a panic leaves them
    // consistent, so a poisoned lock is taken over.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Resolution {
    pub(crate) fn new(block_size: u32, medium: Medium) -> Resolution {
        Resolution {
            queue: Mutex::new(VecDeque::new()),
            map: Mutex::new(Resolver::default()),
            block_size,
            medium,
            unresolved: AtomicU64::new(0),
        }
    }

    /// Closes batch `seq`: queues it for resolution. Called under the sink's lock, in
    /// sequence order. Returns its handle and how many batches wait now.
    pub(crate) fn close(
        self: &Arc<Self>,
        seq: u64,
        ts: f64,
        events: Vec<Pending>,
    ) -> (ClosedBatch, usize) {
        let cell = Arc::new(Closed { seq, ts, slot: Mutex::new(Slot::Raw(events)) });
        let mut q = locked(&self.queue);
        q.push_back(cell.clone());
        let waiting = q.len();
        drop(q);
        (ClosedBatch { cell, res: self.clone() }, waiting)
    }

    /// A handle on a batch resolved already (the drain queue's, handed to an outlet).
    pub(crate) fn resolved(self: &Arc<Self>, seq: u64, batch: EventBatch) -> ClosedBatch {
        let events = batch.events.into_iter().map(Resolved::Event).collect();
        let ready = Slot::Ready(ResolvedBatch { ts: batch.ts, events });
        let cell = Arc::new(Closed { seq, ts: batch.ts, slot: Mutex::new(ready) });
        ClosedBatch { cell, res: self.clone() }
    }

    /// Pops the queue's front batch, if its number is at most `upto`. Only under the
    /// resolver's lock (see `resolve_through`).
    fn pop_front(&self, upto: u64) -> Option<Arc<Closed>> {
        let mut q = locked(&self.queue);
        match q.front() {
            Some(c) if c.seq <= upto => q.pop_front(),
            _ => None,
        }
    }

    /// Resolves `c`, just popped under the resolver's lock `map`, still held.
    fn resolve_popped(&self, map: &mut Resolver, c: Arc<Closed>) {
        let raw = match std::mem::replace(&mut *locked(&c.slot), Slot::Taken) {
            Slot::Raw(v) => v,
            _ => unreachable!("a queued batch is raw until it is popped"),
        };
        let events = map.resolve(raw, self.block_size, self.medium, &self.unresolved);
        *locked(&c.slot) = Slot::Ready(ResolvedBatch { ts: c.ts, events });
    }

    /// Resolves the queue's front batch, if its number is at most `upto`; false if there
    /// was none. `map` is the resolver's lock, held.
    fn resolve_front(&self, map: &mut Resolver, upto: u64) -> bool {
        let Some(c) = self.pop_front(upto) else { return false };
        self.resolve_popped(map, c);
        true
    }

    /// Resolves every queued batch up to `seq` (in order; others may be doing it too).
    ///
    /// Order: lock the resolver, pop the front batch, resolve it, mark it resolved, unlock;
    /// repeat while the front is at most `seq`. The pop is under the resolver's lock so
    /// that batches are resolved in the order they are popped, which is sequence order: a
    /// batch popped outside the lock could be resolved before an earlier one another
    /// thread popped first (its stores' parents then unknown), and a caller could return
    /// while the batch it waits for is still being resolved. The lock is taken per batch,
    /// so a flush that helps waits for one batch's hashing at most.
    pub(crate) fn resolve_through(&self, seq: u64) {
        loop {
            let mut map = locked(&self.map);
            let Some(c) = self.pop_front(seq) else { return };
            self.resolve_popped(&mut map, c);
        }
    }

    /// Resolves the front batch if more than `backlog` wait (a flush's help).
    pub(crate) fn help(&self, backlog: usize) {
        let mut map = locked(&self.map);
        if locked(&self.queue).len() > backlog {
            self.resolve_front(&mut map, u64::MAX);
        }
    }

    /// Takes the resolver's lock and resolves every queued batch: what the caller does
    /// while holding the returned guard sees every closed batch's pages.
    pub(crate) fn settle(&self) -> ResolvedView<'_> {
        let mut map = locked(&self.map);
        while self.resolve_front(&mut map, u64::MAX) {}
        ResolvedView { res: self, map }
    }
}

/// The resolver's map, locked, with every queued batch resolved (see
/// [`Resolution::settle`]).
pub(crate) struct ResolvedView<'a> {
    res: &'a Resolution,
    map: MutexGuard<'a, Resolver>,
}

impl ResolvedView<'_> {
    /// Resolves the batches queued since [`Resolution::settle`] (the caller holds the
    /// sink's lock, so no more come).
    pub(crate) fn settle_queued(&mut self) {
        while self.res.resolve_front(&mut self.map, u64::MAX) {}
    }

    /// Resolves the batches queued since (the caller holds the sink's lock, so no more
    /// come), then the open batch's events in place, so that their pages are in the map.
    pub(crate) fn settle_open(&mut self, open: &mut [Pending]) {
        self.settle_queued();
        for p in open.iter_mut() {
            if matches!(p, Pending::Ready(_)) {
                continue;
            }
            let raw = std::mem::replace(p, Pending::Skip);
            let (bs, medium) = (self.res.block_size, self.res.medium);
            // An event left out (an unknown id, counted) stays `Skip`.
            if let Some(ev) = self.map.resolve(vec![raw], bs, medium, &self.res.unresolved).pop() {
                *p = Pending::Ready(ev.into_event(bs, medium));
            }
        }
    }

    /// The published hash of page `id`, if the map holds it.
    pub(crate) fn hash_of(&mut self, id: u64) -> Option<u64> {
        let (first, i) = self.map.find(id)?;
        Some(self.map.chunks[&first].hashes[i])
    }
}

/// A closed batch on its way to a consumer (the drain queue, or a [`BatchOutlet`]'s
/// queue): its events, hashed when it is taken ([`ClosedBatch::into_batch`]), in
/// sequence order with every other batch of its sink. Dropping it without taking it is
/// fine: it is still resolved, in order, when a later batch is.
///
/// [`BatchOutlet`]: super::BatchOutlet
pub struct ClosedBatch {
    cell: Arc<Closed>,
    res: Arc<Resolution>,
}

impl std::fmt::Debug for ClosedBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClosedBatch").field("seq", &self.cell.seq).finish()
    }
}

impl ClosedBatch {
    /// Its sequence number.
    pub fn seq(&self) -> u64 {
        self.cell.seq
    }

    /// The batch, its pages hashed: resolves it (and every batch before it not resolved
    /// yet) on the calling thread, unless another thread did already. This is where the
    /// cost of hashing lands: a publisher calls it on its own thread.
    pub fn into_batch(self) -> EventBatch {
        self.res.resolve_through(self.cell.seq);
        self.take_resolved()
    }

    /// The batch encoded as a payload: the bytes of
    /// [`encode_batch`](super::wire::encode_batch)`(&self.into_batch(), opts)`, resolved as
    /// `into_batch` does, but written without building the batch: a tree store's tokens
    /// are encoded straight from the leaf's shared words, never copied into a `Vec`. What
    /// a publisher sends.
    pub fn into_payload(self, opts: &WireOptions) -> Vec<u8> {
        self.res.resolve_through(self.cell.seq);
        let b = self.take_ready();
        let (bs, medium) = (self.res.block_size, self.res.medium);
        encode_with(b.ts, &b.events, |e| e.view(bs, medium), opts)
    }

    /// The resolved batch, which must be resolved already.
    fn take_ready(&self) -> ResolvedBatch {
        match std::mem::replace(&mut *locked(&self.cell.slot), Slot::Taken) {
            Slot::Ready(b) => b,
            _ => unreachable!("resolved through its own number, and taken once"),
        }
    }

    /// The batch, which must be resolved already.
    pub(crate) fn take_resolved(self) -> EventBatch {
        let b = self.take_ready();
        let (bs, medium) = (self.res.block_size, self.res.medium);
        EventBatch {
            ts: b.ts,
            events: b.events.into_iter().map(|e| e.into_event(bs, medium)).collect(),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::{EventSink, SinkOptions};
    use super::*;

    /// Nobody takes the batches out (a drain queue that is full, so every later batch is
    /// dropped): the flushes resolve the oldest themselves, and what waits for resolution
    /// stays at most `BACKLOG`.
    #[test]
    fn what_waits_for_resolution_stays_bounded() {
        let s = EventSink::new(SinkOptions {
            block_size: 1,
            max_drain_batches: 1,
            ..Default::default()
        })
        .unwrap();
        let info = s.namespace(0);
        for i in 0..(BACKLOG as u64 + 100) {
            let words: Arc<[u32]> = vec![i as u32].into();
            let info = info.clone();
            s.push_pending(Pending::Stored { info, parent: None, first: i, words, len: 1 });
            s.flush();
        }
        assert!(locked(&s.res.queue).len() <= BACKLOG, "{}", locked(&s.res.queue).len());
        assert_eq!(s.stats().unresolved, 0);
        // And the first batch, kept, comes out hashed.
        let d = s.drain();
        assert_eq!(d.len(), 1);
        let want = s.namespace(0).hasher.block_hashes(&[0], 1);
        assert!(
            matches!(&d[0].1.events[0], KvEvent::BlockStored { block_hashes, .. } if *block_hashes == want)
        );
    }

    /// Collects a sink's closed batches, as a publisher's queue would.
    struct Collect(Arc<std::sync::Mutex<Vec<ClosedBatch>>>);

    impl super::super::BatchOutlet for Collect {
        fn submit(&mut self, _seq: u64, batch: ClosedBatch) {
            self.0.lock().unwrap().push(batch);
        }
    }

    /// The same random stream of the tree's events (stores below live pages, in several
    /// namespaces, the tokens a prefix of longer shared words; removals by range and by
    /// id; clears) and ready ones, fed to two sinks, batched at random: every batch's
    /// [`ClosedBatch::into_payload`] is byte for byte the `encode_batch` of its
    /// [`ClosedBatch::into_batch`], in both encodings and hash modes, signed and not.
    #[test]
    fn a_payload_encoded_from_the_shared_words_is_the_batchs_encoding() {
        use super::super::NamespaceMeta;
        use super::super::hash::HashMode;
        use super::super::wire::{Encoding, decode_batch, encode_batch};
        let mut x = 0x853c_49e6_748f_ea9bu64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..24 {
            let hash_mode = if round % 2 == 0 { HashMode::Xxh3 } else { HashMode::SglangSha256 };
            let block_size = [1, 2, 16][round % 3];
            let medium = if round % 4 == 3 { Medium::CpuPinned } else { Medium::Gpu };
            let wire = WireOptions {
                encoding: if round % 5 < 3 { Encoding::VllmArray } else { Encoding::VllmMap },
                signed_hashes: round % 7 < 3,
                data_parallel_rank: round as i64 - 3,
                ..Default::default()
            };
            let opts = SinkOptions { block_size, hash_mode, medium, ..Default::default() };
            let sinks = [EventSink::new(opts.clone()).unwrap(), EventSink::new(opts).unwrap()];
            let got: [Arc<std::sync::Mutex<Vec<ClosedBatch>>>; 2] = Default::default();
            for (s, g) in sinks.iter().zip(&got) {
                let meta = |l: Option<&str>, c: Option<&str>| NamespaceMeta {
                    lora_name: l.map(Into::into),
                    cache_salt: c.map(Into::into),
                };
                s.set_namespace(1, meta(Some("lora"), None)).unwrap();
                s.set_namespace(2, meta(None, Some("salt"))).unwrap();
                s.set_namespace(3, meta(Some("l"), Some("s"))).unwrap();
                s.attach(Box::new(Collect(g.clone()))).unwrap();
            }
            // Live chunks: (namespace, first id, pages).
            let (mut live, mut next_id) = (Vec::<(u64, u64, u32)>::new(), 0u64);
            for _ in 0..300 {
                let r = rnd();
                let make: Box<dyn Fn(&EventSink) -> Pending> = match r % 10 {
                    0..=5 => {
                        let ns = (r >> 8) % 5;
                        let parent = live
                            .iter()
                            .filter(|c| c.0 == ns)
                            .nth((r >> 16) as usize % 4)
                            .map(|c| c.1 + (r >> 24) % u64::from(c.2));
                        let pages = 1 + (r >> 32) as usize % 40;
                        let len = pages * block_size as usize;
                        let spare = (r >> 40) as usize % 5;
                        let words: Arc<[u32]> =
                            (0..len + spare).map(|_| (rnd() >> (rnd() % 64)) as u32).collect();
                        let first = next_id;
                        next_id += pages as u64;
                        live.push((ns, first, pages as u32));
                        Box::new(move |s| Pending::Stored {
                            info: s.namespace(ns),
                            parent,
                            first,
                            words: words.clone(),
                            len,
                        })
                    }
                    6 | 7 if !live.is_empty() => {
                        let (_, first, pages) = live.swap_remove((r >> 8) as usize % live.len());
                        if r % 10 == 6 {
                            Box::new(move |_| Pending::Removed { first, pages })
                        } else {
                            let ids: Vec<u64> = (first..first + u64::from(pages)).collect();
                            Box::new(move |_| Pending::RemovedIds(ids.clone()))
                        }
                    }
                    8 => {
                        let h = vec![rnd(), rnd() >> 40];
                        Box::new(move |_| {
                            Pending::Ready(KvEvent::BlockRemoved {
                                block_hashes: h.clone(),
                                medium,
                            })
                        })
                    }
                    _ if r % 97 == 0 => {
                        live.clear();
                        Box::new(|_| Pending::Cleared)
                    }
                    _ => {
                        let (h, t) = (vec![rnd()], vec![7; block_size as usize]);
                        Box::new(move |s| {
                            Pending::Ready(s.stored_event(
                                &s.namespace(4),
                                h.clone(),
                                None,
                                t.clone(),
                            ))
                        })
                    }
                };
                for s in &sinks {
                    s.push_pending(make(s));
                }
                if r % 3 == 0 {
                    sinks.iter().for_each(|s| {
                        s.flush();
                    });
                }
            }
            sinks.iter().for_each(|s| {
                s.flush();
            });
            let a = std::mem::take(&mut *got[0].lock().unwrap());
            let b = std::mem::take(&mut *got[1].lock().unwrap());
            assert_eq!(a.len(), b.len());
            assert!(a.len() > 50, "{}", a.len());
            for (a, b) in a.into_iter().zip(b) {
                assert_eq!(a.seq(), b.seq());
                let (mut batch, payload) = (a.into_batch(), b.into_payload(&wire));
                // The two sinks closed the batch at different times: compare with its ts.
                batch.ts = decode_batch(&payload).unwrap().batch.ts;
                assert_eq!(payload, encode_batch(&batch, &wire), "{batch:?}");
            }
            assert_eq!(sinks[0].stats().unresolved, 0);
            assert_eq!(sinks[1].stats().unresolved, 0);
        }
    }
}
