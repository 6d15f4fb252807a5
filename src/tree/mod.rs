//! The concurrent radix tree.
//!
//! Keys are `(namespace, tokens)`; values are one `u32` slot per token. Each namespace has
//! its own root, so namespaces never share a node. An edge (a `Node`) holds a run of
//! tokens, a multiple of the page size long, with their slots. Slots are stored compactly
//! where they allow it: as a few runs of consecutive slots (what a pool hands out: one base
//! slot for an edge whose slots are one run), one base per page when only each page's slots
//! run (what a paged pool always hands out), else one per token; reads expand them, so this
//! is invisible except in memory and speed, and [`RadixTree::evict_runs`] hands an evicted
//! leaf's slots over as runs without expanding them.
//!
//! # Consistency
//!
//! Every operation is linearizable with respect to the sequential model of `docs/contract/SEMANTICS.md`
//! (a prefix-closed map from pages to slots with pin counts):
//!
//! - [`RadixTree::match_prefix`] is lock-free and writes no structure (only access stamps
//!   of the edges it passes; under `mru`, a match that ends at a queued leaf also re-keys it
//!   in the eviction index, under the index's mutex). It linearizes at the moment it observed the end of the match
//!   (a missing child, or the last edge it read). The slots it writes are valid memory
//!   whatever races it (the epoch keeps every node it read); before returning it re-checks
//!   that the last edge it used is still cached, a freshness choice that keeps its answer
//!   one the tree held after the descent's last read (never slots of an edge whose eviction
//!   completed first), and retries (rarely) when that check fails.
//! - [`RadixTree::match_and_lock`] pins each node as it descends (a CAS that succeeds only
//!   from a live state). Where its match ends inside an edge it splits the edge (see the
//!   locks below) and pins the upper half as part of the split. Pinned pages stay cached
//!   with the same slots until the lock is released.
//! - [`RadixTree::insert`] that adds pages linearizes when its new leaf is published (one
//!   atomic store of the parent's new child table, under the parent's lock); `existing` is
//!   the match length at that moment. One whose whole key is cached already linearizes at
//!   the read that found its last edge, and its pool step (`Cache`'s settle of the given
//!   slots) runs after that read under no node lock. [`RadixTree::insert_and_lock`] pins as
//!   it descends, like `match_and_lock`, and creates its leaf already pinned, so the pin is
//!   atomic with the insertion.
//! - [`RadixTree::evict`] removes only unpinned leaves, in policy order ([`EvictionPolicy`]:
//!   SGLang's seven keys, smallest first; `docs/eviction.md`). A node is marked `DEAD` with a
//!   CAS from exactly "0 pins, live" before it is unlinked, so a racing pin either lands
//!   first (and the eviction skips the node) or fails and treats the node as absent.
//! - Access stamps come from a clock that is strictly increasing in each thread and
//!   monotonic across threads (`sync::clock`; reading it writes no shared
//!   memory), so every policy's order is exact in any sequential history and between
//!   operations ordered by happens-before; between racing accesses it is approximate
//!   (a racing access may land on an edge after an eviction pass compared its key).
//!   Priorities and hit counts (the metadata word, under `priority`, `lfu` and `slru`) are
//!   never lost to a race: bumps are CAS loops, and a split freezes the word it replaces and
//!   hands the halves what landed on it (`split.rs`, step (2')).
//! - With a sliding window (`swa.rs`): matches return the SWA-valid prefix and stay
//!   lock-free; a locking match's window pins and a tombstone exclude each other on the
//!   node's state word (one CAS each); `evict_kv` linearizes per node as `evict` does.
//! - `stats()` counts are exact at quiescence (`cached == evictable + protected`); under
//!   concurrency they are sums of counters updated at slightly different moments.
//!
//! # Namespaces
//!
//! A namespace (tenant, cache salt, LoRA adapter) is its own tree under its own root;
//! roots are found through a striped hash map whose lookups never lock or write
//! (`ns_map.rs`): finding a namespace is O(1) expected, and creating one takes only its
//! shard's lock and copies no other namespace's entry (except, amortized, when a shard's
//! table grows). A namespace lives while it caches something: the eviction of its last page
//! (by [`RadixTree::evict`] or [`RadixTree::drop_namespace`]) unlinks its root from the map
//! and retires it through the epoch, and the next insert creates it afresh. An insert that
//! races that reclaim either lands first (the namespace stays) or sees the dead root and
//! creates the namespace again: it never caches into an unlinked root (the protocol is in
//! `namespace.rs`). A namespace id never seen and one reclaimed are the same to every
//! operation: nothing cached.
//!
//! How this reads `docs/contract/SEMANTICS.md`: its model is a map of pages per namespace and says nothing
//! of a namespace's own lifetime; here a namespace exists exactly while it has a cached page
//! (the model's view: a namespace with no page is indistinguishable from one never used), so
//! `stats().namespaces` counts those. `drop_namespace` is `evict` restricted to one
//! namespace and not bound by the eviction order: every unpinned page of it goes (a pinned
//! page, and every page before it, stays until released, as for `reset`); it is a sequence
//! of linearizable leaf evictions, not one atomic step, so pages inserted into the namespace
//! while it runs may stay. Dropping an unknown namespace frees nothing and returns 0.
//! [`RadixTree::namespace_stats`] walks one namespace (O(its nodes), lock-free): exact at
//! quiescence, like `stats()`.
//!
//! **Locks.** Matches take none (a namespace lookup included), except under `mru`, where a
//! match that ends at a queued leaf takes the eviction index's mutex once to re-key it (the
//! touch/queue pair, `evict_index.rs`), as does any other access of a queued node. A split holds the edge's parent's lock, the edge's lock,
//! and the new lower half's lock (uncontended), and takes the eviction index's mutex twice
//! (to queue the lower half if it is an unpinned leaf, and to retire the old edge). A
//! release takes that mutex when an unpin takes a leaf from 1 pin to 0 (to queue it). An
//! insert that adds a leaf holds the parent's lock and then takes the mutex (to queue the
//! leaf); one that splits holds a split's locks. An eviction pass holds the mutex for one
//! index step per leaf (retire the last leaf, queue its parent, pop the next) and lets it
//! go after at most 32 stale entries (`evict_index::STALE_PER_HOLD`), so a split or a
//! release waits on it for a bounded time; the leaf's own unlink holds the parent's and
//! the leaf's locks, never the mutex. Locks are always taken parent before child, and node
//! locks before the mutex, so writers cannot deadlock. Inserts into different subtrees lock
//! different nodes. Creating a namespace takes its map shard's lock, and so does
//! reclaiming one (after its root's lock is released): the shard lock is never held with
//! any other lock.
//!
//! # Protocols
//!
//! Each protocol is written down next to its code, with the order of its publishes and
//! retires and the reason for each atomic access's ordering:
//!
//! - descent and following `forward` after a split: `descent.rs` (module docs);
//! - copy-on-split: `split.rs` (`RadixTree::split`; summary below);
//! - pins, and the unpin/evict pair: `pins.rs` (`try_pin`, `try_unpin`);
//! - insert: `insert.rs` (`Insert::hang`);
//! - eviction of one leaf and the pass: `evict.rs` (`evict_leaf`, `evict_with`), and the
//!   index (its tickets, the lazy queue for keys that grow, the ordered map for `mru`'s,
//!   which shrink, and the touch/queue pair): `evict_index.rs` (module docs); the policies'
//!   keys and the metadata word: `policy.rs`; the metadata's bumps and the split's freeze:
//!   `RadixTree::try_bump`, `Insert::bump`, `split.rs` (step (2'));
//! - KV events (with them on): the store pushed under the parent's lock before the leaf's
//!   publish (`Insert::hang`), the removal after the `DEAD` CAS under the parent's lock
//!   (`evict_leaf`), the page hashes kept on nodes and split between halves: `events.rs`,
//!   `split.rs`, and `docs/kv-events.md` ("Sequencing with the tree");
//! - the sliding-window (SWA) component, with `TreeConfig::swa_window > 0`: the SWA
//!   pin/tombstone pair on the state word, window locks and their release, valid matches,
//!   the SWA index and the SWA eviction pass: `swa.rs` (module docs);
//! - the namespace map: `ns_map.rs`; a namespace's root, created and reclaimed:
//!   `namespace.rs` (module docs); node and child-table memory: `node.rs`
//!   (`node_ref`'s contract).
//!
//! **Copy-on-split** (edge A at offset k, holding A's parent's lock and A's lock): (1) build
//! U = A's first k tokens and L = the rest, L taking A's child table; neither is reachable
//! yet. (2) store `A.forward = U`; read A's pin count v, store it into U and L, and CAS A's
//! state from `v` to `v | REPLACED` (Release), retrying with the new count if a pin or
//! unpin landed meanwhile: from that CAS on, A's count is frozen and every holder of a pin
//! on A holds one on U and on L. (2') Under the policies that keep a metadata word, freeze
//! A's with an RMW and hand U and L what landed on it since (1) copied it into them; a bump
//! that meets the frozen word goes to the nodes holding A's tokens instead. (3) publish U in the parent's table with one atomic store
//! (Release): readers see A or U->L, never a half-split edge (A's content is immutable, so
//! a reader still on A reads valid data and, meeting `REPLACED`, moves to U). (4) point A's
//! children's parent pointers at L, queue L for eviction if A was an unpinned leaf, drop
//! the locks and retire A through the epoch (the old parent table too). L is locked from
//! before (3) until after (4): a writer that reaches L through U and wants to change L's
//! table or split L waits until every child of L names L as its parent.
//!
//! **Pins** are path pins, like SGLang's `lock_ref`: a lock on `t[0..m]` adds one to every
//! node on that path. The count goes up only from a live state (no `DEAD`, no `REPLACED`
//! bit); a CAS that meets `REPLACED` moves to `forward`. Release re-walks the locked prefix
//! from the root by its tokens (the lock keeps them: a copy, or a share of the caller's
//! immutable buffer when the call was given one, see [`Key`]), so a handle never names a
//! node that could be freed; the walk decrements every node on the current path, which, because U
//! and L inherited A's frozen count, is exactly the set of nodes the lock pinned. The
//! `evictable`/`protected` counters move on 0->1 and 1->0 transitions, by the edge length;
//! a split moves nothing. **The unpin/evict pair** (an unpin to 0 racing the eviction of
//! the node's last child; each must see the other, or the node is never queued) is an RMW
//! on the node's state word on both sides (see `try_unpin`), not a SeqCst store/load pair.
//!
//! **Eviction** keeps evictable leaves in the eviction index (`evict_index`: a lazy priority
//! queue, or under `mru` an ordered map), O(log n) per leaf, O(1) for leaves queued in key
//! order (most of them, in the lazy queue). To evict, it locks the
//! parent, then the leaf, re-checks it is an unpinned leaf, CASes its state `0 -> DEAD`,
//! swaps the parent's table for one without it, hands its slots over and retires it. A
//! parent that became an unpinned leaf is queued; a root left without children is marked
//! `DEAD` under its lock, then unlinked from the namespace map and retired (the namespace
//! is reclaimed: `namespace.rs`). A `free` callback that panics leaves
//! nothing behind: the pending leaf is retired and its parent queued on unwind.
//!
//! **Memory reclamation.** Unlinked nodes and replaced child tables go to crossbeam-epoch,
//! which frees them once no guard that could see them is left. That work runs inside
//! whichever call pins a thread after every 128 pins, unless the caller runs it first with
//! [`RadixTree::reclaim`] at a moment of its choosing.

mod descent;
mod events;
mod evict;
mod evict_index;
pub(crate) use evict_index::prefetch;
mod insert;
mod invariants;
mod key;
mod memory;
mod namespace;
mod node;
mod ns_map;
mod pins;
mod policy;
mod slots;
mod split;
mod stripes;
mod swa;

use std::fmt;

use evict_index::{EvictIndex, Evicted};
pub use invariants::TreeCensus;
pub use key::Key;
pub(crate) use key::LockTokens;
pub use namespace::NamespaceStats;
use namespace::Root;
use node::{ChildTable, DEAD, Node, PIN_MASK, REPLACED, node_ref};
use ns_map::NsMap;
use pins::Pin;
pub use policy::{
    DEFAULT_SLRU_THRESHOLD, EvictionPolicy, InsertOptions, NodeInfo, checked_priority,
};
use policy::{FROZEN, Keys};
pub use slots::{Mark, OutBuf, SlotSink};
pub(crate) use slots::{SlotSource, cut_runs, push_differing};
use stripes::MatchCounters;
pub use swa::{EvictTarget, Freed};

use crate::error::{Error, Result, invalid};
use crate::slot_run::{SlotRun, Slots};
use crate::sync::epoch::{Domain, Guard, Owned};
use crate::sync::{AtomicU64, Ordering, lock, next_id};

/// Settings fixed for a tree's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeConfig {
    /// Page size `P >= 1`: keys are cut to a multiple of it, and it is the unit cached.
    pub page_size: usize,
    /// Eviction order.
    pub policy: EvictionPolicy,
    /// [`EvictionPolicy::Slru`]'s threshold: a node with at least this many hits is in the
    /// protected segment (default [`DEFAULT_SLRU_THRESHOLD`], SGLang's; 0 puts every node
    /// there, which is LRU). Ignored by the other policies.
    pub slru_threshold: u32,
    /// The sliding window of a hybrid model's SWA layers, in tokens (0, the default: no SWA
    /// component). With a window, matches are valid only where the window's SWA KV is
    /// cached, locks hold the window's SWA KV too, and the SWA KV can be evicted on its own
    /// ([`RadixTree::evict_kv`]; the `swa` module).
    pub swa_window: usize,
}

impl Default for TreeConfig {
    fn default() -> Self {
        TreeConfig {
            page_size: 1,
            policy: EvictionPolicy::Lru,
            slru_threshold: DEFAULT_SLRU_THRESHOLD,
            swa_window: 0,
        }
    }
}

/// Counts and counters of a tree (see [`RadixTree::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Tokens cached.
    pub cached_tokens: u64,
    /// Cached and not pinned.
    pub evictable_tokens: u64,
    /// Cached and pinned.
    pub protected_tokens: u64,
    /// Nodes (edges), roots excluded.
    pub nodes: u64,
    /// `match_prefix` / `match_and_lock` calls.
    pub match_calls: u64,
    /// Tokens asked for by those calls.
    pub match_query_tokens: u64,
    /// Tokens they found cached.
    pub match_hit_tokens: u64,
    /// Tokens newly cached by inserts.
    pub inserted_tokens: u64,
    /// Tokens removed by eviction (and by [`RadixTree::drop_namespace`]).
    pub evicted_tokens: u64,
    /// Live namespaces: those with something cached (an empty namespace is reclaimed).
    pub namespaces: u64,
    /// With a sliding window: cached tokens whose SWA KV is cached too (not tombstones).
    pub swa_cached_tokens: u64,
    /// With a sliding window: of those, the tokens whose SWA KV a window lock holds (the
    /// rest, `swa_cached_tokens - swa_protected_tokens`, is what SWA eviction can free).
    pub swa_protected_tokens: u64,
}

/// A pin on a matched prefix, detached from any borrow (for engines that keep locks in
/// their request structs). It must be handed back to [`RadixTree::release`]; dropping it
/// without that leaves its pages pinned for the tree's life.
///
/// It keeps the pinned tokens, so release can re-walk them (see the module docs).
#[must_use = "a PrefixLock pins its prefix until it is released"]
#[derive(Debug)]
pub struct PrefixLock {
    pub(crate) tree_id: u64,
    pub(crate) ns: u64,
    pub(crate) tokens: LockTokens,
    /// With a sliding window: where the window segment (the SWA-pinned nodes) starts, a
    /// node boundary; `u32::MAX` without one (`u32`: keeps the lock, and the request
    /// structs holding one, as small as before).
    pub(crate) swa_from: u32,
}

impl PrefixLock {
    /// With a sliding window: where the lock's SWA pins start (its window segment runs from
    /// there to its end; see the `swa` module). `None` on a tree without a window.
    pub fn swa_from(&self) -> Option<usize> {
        (self.swa_from != u32::MAX).then_some(self.swa_from as usize)
    }
    /// Tokens pinned.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }
    /// True for a lock on an empty match.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
    /// Namespace of the pinned prefix.
    pub fn namespace(&self) -> u64 {
        self.ns
    }
    /// The pinned tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
}

/// A pin that releases itself when dropped. `Send`: a request may finish on another thread.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard<'a> {
    tree: &'a RadixTree,
    lock: Option<PrefixLock>,
}

impl LockGuard<'_> {
    /// Tokens pinned.
    pub fn len(&self) -> usize {
        self.lock.as_ref().map_or(0, |l| l.len())
    }
    /// True for a lock on an empty match.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Detaches the pin from the guard; it must then be released with
    /// [`RadixTree::release`].
    pub fn into_raw(mut self) -> PrefixLock {
        self.lock.take().expect("a live guard holds its lock")
    }
    /// Releases now (same as dropping).
    pub fn release(self) {}
}

impl fmt::Debug for LockGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard").field("lock", &self.lock).finish()
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if let Some(l) = self.lock.take() {
            // Cannot fail: the lock came from this tree and is released once.
            let _ = self.tree.release(l);
        }
    }
}

/// The concurrent radix tree. `Send + Sync`: share it by reference or `Arc`.
///
/// See the module docs for the consistency promises and the protocols.
pub struct RadixTree {
    cfg: TreeConfig,
    id: u64,
    domain: Domain,
    roots: NsMap,
    /// Live namespaces (roots in the map), for [`TreeStats::namespaces`].
    namespaces: AtomicU64,
    index: EvictIndex,
    /// The SWA index (trees with a sliding window only).
    swa: Option<swa::SwaIndex>,
    /// With a window: cached tokens that are not SWA tombstones.
    swa_cached: AtomicU64,
    /// With a window: tokens of nodes with an SWA pin.
    swa_protected: AtomicU64,
    cached: AtomicU64,
    evictable: AtomicU64,
    protected: AtomicU64,
    nodes: AtomicU64,
    inserted: AtomicU64,
    evicted: AtomicU64,
    matches: MatchCounters,
    /// The KV-event sink (`None`: events off). Set only through `&mut self` before the
    /// tree is shared, so the hooks read it as a plain field: no atomic, no shared write.
    events: Option<std::sync::Arc<crate::events::EventSink>>,
    /// With events on: the next page id (`events::resolve`; a leaf of `n` pages takes `n`).
    /// Bit layout: all 64 bits one counter (ids below it are taken); never wraps in practice.
    page_ids: AtomicU64,
}

/// What an insert asks of its `prepare` step (see `RadixTree::insert_core`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Validate the outcome so far, changing nothing: the insert is about to change the
    /// tree's shape (a split or a new namespace root) before its outcome is committed.
    Check,
    /// The outcome is fixed: validate and apply (settle the slots), all or nothing.
    Commit,
}

/// Length of the common prefix of `a` and `b`.
#[inline]
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut i = 0;
    // Long shared runs are the common case (system prompts, earlier turns): compare big
    // blocks with one memcmp each, then narrow down.
    while i + 1024 <= n && a[i..i + 1024] == b[i..i + 1024] {
        i += 1024;
    }
    while i + 16 <= n && a[i..i + 16] == b[i..i + 16] {
        i += 16;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

impl RadixTree {
    /// A new, empty tree. Fails with `InvalidArgument` for page size 0.
    pub fn new(cfg: TreeConfig) -> Result<Self> {
        if cfg.page_size == 0 {
            return Err(invalid("page_size must be >= 1"));
        }
        if cfg.page_size > u32::MAX as usize {
            return Err(invalid("page_size is too large"));
        }
        if cfg.swa_window > u32::MAX as usize {
            return Err(invalid("swa_window is too large"));
        }
        Ok(RadixTree {
            cfg,
            id: next_id(),
            domain: Domain::new(),
            roots: NsMap::new(),
            namespaces: AtomicU64::new(0),
            index: EvictIndex::new(Keys { policy: cfg.policy, slru_threshold: cfg.slru_threshold }),
            swa: (cfg.swa_window > 0).then(swa::SwaIndex::new),
            swa_cached: AtomicU64::new(0),
            swa_protected: AtomicU64::new(0),
            cached: AtomicU64::new(0),
            evictable: AtomicU64::new(0),
            protected: AtomicU64::new(0),
            nodes: AtomicU64::new(0),
            inserted: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            matches: MatchCounters::new(),
            events: None,
            page_ids: AtomicU64::new(0),
        })
    }

    /// This tree's identity (what its locks carry, so another tree's are refused).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Page size.
    pub fn page_size(&self) -> usize {
        self.cfg.page_size
    }

    /// The configuration.
    pub fn config(&self) -> TreeConfig {
        self.cfg
    }

    /// `len` cut down to a whole number of pages (`docs/contract/SEMANTICS.md`: `floor(len / P) * P`): the
    /// one place that rounds a key (the cache, the request cycle and the tier ask here).
    #[inline]
    pub fn aligned(&self, len: usize) -> usize {
        len / self.cfg.page_size * self.cfg.page_size
    }

    // ---------------------------------------------------------------- the clock

    /// The access stamp of an operation starting now (see [`crate::sync::clock`]): later
    /// than every earlier operation's in the same thread, so LRU order is exact in one
    /// thread, and across threads wherever one operation happens before the other.
    #[inline]
    pub(super) fn now(&self) -> u64 {
        crate::sync::clock::now()
    }

    /// Records an access of `n` by an operation that started at `now`, under the policies
    /// whose key reads accesses (not `fifo`, `filo`).
    ///
    /// Under the lazy index (every such policy but `mru`) keys that grow need no index
    /// update (`pop` re-queues), but they must never shrink: a queued entry's key is a lower
    /// bound of its node's stamp (`evict_index.rs`, module docs). So the stamp is raised with
    /// `fetch_max`, behind a plain load that skips it when the stamp is already as new (a
    /// load then a store would not do: two racing touches that both load the old stamp can
    /// store in either order, and if a push read the newer one between the two stores, the
    /// node's final stamp is below its entry's key; loom:
    /// `policy::lru_racing_touches_keep_the_queued_key_a_lower_bound`). Under `mru` a touch
    /// makes the key smaller, so a queued node is re-keyed at once: the touch half of the
    /// touch/queue pair (`evict_index.rs`, module docs): an RMW on the stamp, then the `evq`
    /// load.
    #[inline]
    pub(super) fn touch(&self, n: &Node, now: u64) {
        match self.cfg.policy {
            EvictionPolicy::Fifo | EvictionPolicy::Filo => {}
            EvictionPolicy::Mru => {
                // AcqRel: the touch half of the pair: an RMW, so it is ordered with the
                // push's RMW in the stamp's modification order; Acquire so that, reading
                // from that push, the `evq` load below sees its store.
                // Relaxed (`evq`): a hint; the lock in `rekey` orders the rest.
                if n.stamp.fetch_max(now, Ordering::AcqRel) < now
                    && !n.evq.load(Ordering::Relaxed).is_null()
                {
                    self.index.rekey(n);
                }
            }
            _ => {
                // Relaxed (both): a stamp is an eviction-order hint; no data depends on it.
                // The lower bound rests only on the stamp's own modification order, in which
                // `fetch_max` values never go down (and the index reads it under its lock).
                // The load skips the RMW when a touch by a later operation came first (hot
                // nodes near the root, touched by many threads).
                if n.stamp.load(Ordering::Relaxed) < now {
                    n.stamp.fetch_max(now, Ordering::Relaxed);
                }
            }
        }
    }

    /// Raises `n`'s priority to at least `priority` and adds `hits` to its hit count (the
    /// policy's metadata, see [`InsertOptions`]), unless a split froze its word: then
    /// `false`, and the caller bumps the nodes that replaced it (`Insert::bump`).
    ///
    /// A CAS loop: bumps never get lost between racing inserts, and the split's freeze (an
    /// RMW on the same word, see `split.rs`) is ordered with it: a bump before the freeze
    /// is in what the split hands to the halves, one after it fails here.
    #[inline]
    pub(super) fn try_bump(&self, n: &Node, priority: i32, hits: u32) -> bool {
        // Acquire (this load and the CAS's failure): a FROZEN read here comes from the
        // split's freeze (Release), after its REPLACED CAS, which the caller then follows
        // (`resolve` must see REPLACED, or the caller would find the frozen node again).
        let mut m = n.meta.load(Ordering::Acquire);
        loop {
            if m & FROZEN != 0 {
                return false;
            }
            let b = policy::meta_bumped(m, priority, hits);
            if b == m {
                return true; // nothing to raise, nothing to count
            }
            // Relaxed on success: metadata is an eviction-order hint. Acquire on failure:
            // as the load above.
            match n.meta.compare_exchange_weak(m, b, Ordering::Relaxed, Ordering::Acquire) {
                Ok(_) => return true,
                Err(x) => m = x,
            }
        }
    }

    /// The nodes on the path `tokens` (cut to a page multiple) of namespace `ns` as they
    /// are now, with their eviction metadata: one [`NodeInfo`] per node, root first (the
    /// root excluded), ending with the node that holds the last matched page. Lock-free,
    /// changes nothing (no access is recorded). For tests and diagnostics: under
    /// concurrency each figure is a recent value.
    #[doc(hidden)] // a test hook: checks, not an engine API (kept public for the tests)
    pub fn inspect(&self, ns: u64, tokens: &[u32]) -> Vec<NodeInfo> {
        let g = self.domain.pin();
        let key = &tokens[..self.aligned(tokens.len())];
        let mut out = Vec::new();
        let Some(root) = self.root(ns, &g) else { return out };
        let mut cur = root;
        let mut pos = 0;
        while pos < key.len() {
            let Some((c, k)) = self.step(cur, &key[pos..], &g) else { break };
            // Relaxed (all): diagnostics.
            let s = c.state.load(Ordering::Relaxed);
            let m = c.meta.load(Ordering::Relaxed);
            let (priority, hits) = if self.cfg.policy.reads_meta() {
                (
                    if self.cfg.policy.reads_priority() { policy::meta_priority(m) } else { 0 },
                    if self.cfg.policy.reads_hits() { policy::meta_hits(m) } else { 0 },
                )
            } else {
                (0, 0)
            };
            out.push(NodeInfo {
                len: c.len(),
                pins: (s & PIN_MASK) as u32,
                priority,
                hits,
                stamp: c.stamp.load(Ordering::Relaxed),
                leaf: c.is_leaf(&g),
                swa_pins: ((s & node::SWA_PIN_MASK) >> 32) as u32,
                swa_gone: s & node::SWA_GONE != 0,
                swa_stamp: c.swa_stamp.load(Ordering::Relaxed),
            });
            pos += k;
            if k < c.len() {
                break;
            }
            cur = c;
        }
        out
    }

    // ---------------------------------------------------------------- memory

    /// Frees the memory of nodes and child tables that splits, evictions and inserts (of
    /// this tree or any other) unlinked earlier, once no reader can still hold them: a
    /// bounded batch per call (crossbeam-epoch runs up to 8 bags of 64 deferred frees).
    ///
    /// Never needed for correctness: the same work runs anyway inside whichever call next
    /// pins the thread after every 128 pins, so now and then one `match_prefix`, `insert`
    /// or `evict` pays for freeing hundreds of objects (tens of µs on the Mooncake trace,
    /// most of the evict calls above the 99th percentile there; see BENCHMARKS.md). An
    /// engine that calls `reclaim` where latency does not matter (once per scheduler step,
    /// after launching the batch, or between requests) keeps that work off its
    /// latency-critical calls. Lock-free; thread-safe; cheap when there is nothing to free.
    pub fn reclaim(&self) {
        self.domain.reclaim();
    }

    // ---------------------------------------------------------------- stats

    /// Counts and counters. Exact at quiescence; under concurrency each figure is a recent
    /// value of its own counter.
    pub fn stats(&self) -> TreeStats {
        let (calls, query, hit) = self.matches.sum();
        // Acquire: statistics, each a recent value of its own counter (exact at quiescence);
        // Acquire so that a reader who sees an eviction pass's count also sees what the
        // pass's caller did before it (`Cache`'s count of evictions in progress, which its
        // allocation wait reads next). Free on x86 (a plain load).
        let get = |a: &AtomicU64| (a.load(Ordering::Acquire) as i64).max(0) as u64;
        TreeStats {
            cached_tokens: get(&self.cached),
            evictable_tokens: get(&self.evictable),
            protected_tokens: get(&self.protected),
            nodes: get(&self.nodes),
            match_calls: calls,
            match_query_tokens: query,
            match_hit_tokens: hit,
            inserted_tokens: get(&self.inserted),
            evicted_tokens: get(&self.evicted),
            namespaces: self.namespace_count(),
            swa_cached_tokens: get(&self.swa_cached),
            swa_protected_tokens: get(&self.swa_protected),
        }
    }
}

impl fmt::Debug for RadixTree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RadixTree").field("cfg", &self.cfg).field("stats", &self.stats()).finish()
    }
}

impl Drop for RadixTree {
    fn drop(&mut self) {
        let g = self.domain.pin();
        // Exclusive access: free every reachable node and table. Retired nodes, tables and
        // roots were handed to the epoch, which frees them; the eviction index frees its
        // tickets, the namespace map its entries (after this).
        let mut roots = Vec::new();
        self.roots.for_each(&g, &mut |r| roots.push(r));
        for r in roots {
            // SAFETY: exclusive access (`&mut self`): nothing else can reach these; each root
            // is in the map once, allocated as a `Root`.
            let root = unsafe { Box::from_raw(r) };
            // Relaxed (all loads): exclusive access, ordered by whatever gave us `&mut self`.
            let t = root.node.children.load(Ordering::Relaxed, &g);
            let mut stack = Vec::new();
            if !t.is_null() {
                // SAFETY: a reachable table is owned by its node alone.
                stack.extend(unsafe { t.into_owned() }.nodes());
            }
            while let Some(n) = stack.pop() {
                // SAFETY: each reachable node is owned by the tree and visited once.
                let node = unsafe { Box::from_raw(n) };
                let table = node.children.load(Ordering::Relaxed, &g);
                if !table.is_null() {
                    // SAFETY: a reachable table is owned by its node alone.
                    let table = unsafe { table.into_owned() };
                    stack.extend(table.nodes());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
