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
//! Every operation is linearizable with respect to the sequential model of `SEMANTICS.md`
//! (a prefix-closed map from pages to slots with pin counts):
//!
//! - [`RadixTree::match_prefix`] is lock-free and writes no structure (only access stamps,
//!   and only when the clock moved). It linearizes at the moment it observed the end of the
//!   match (a missing child); before returning it re-checks that the last node it used is
//!   still live, so it never returns a slot that was evicted before that moment, and it
//!   retries (rarely) when that check fails.
//! - [`RadixTree::match_and_lock`] pins each node as it descends (a CAS that succeeds only
//!   from a live state). Where its match ends inside an edge it splits the edge, holding
//!   only that edge's and its parent's locks, and pins the upper half as part of the split.
//!   Pinned pages stay cached with the same slots until the lock is released.
//! - [`RadixTree::insert`] linearizes when its new leaf is published (one atomic store of
//!   the parent's new child table, under the parent's lock); `existing` is the match length
//!   at that moment. [`RadixTree::insert_and_lock`] pins as it descends, like
//!   `match_and_lock`, and creates its leaf already pinned, so the pin is atomic with the
//!   insertion.
//! - [`RadixTree::evict`] removes only unpinned leaves, LRU first. A node is marked `DEAD`
//!   with a CAS from exactly "0 pins, live" before it is unlinked, so a racing pin either
//!   lands first (and the eviction skips the node) or fails and treats the node as absent.
//! - `stats()` counts are exact at quiescence (`cached == evictable + protected`); under
//!   concurrency they are sums of counters updated at slightly different moments. Access
//!   stamps are approximate under concurrency (LRU order between racing accesses is not
//!   promised).
//!
//! # Protocols
//!
//! **Copy-on-split** (edge A at offset k, holding A's parent's lock and A's lock; see
//! `RadixTree::split`): (1) build U = A's first k tokens and L = the rest, L taking A's
//! child table; neither is reachable yet. (2) store `A.forward = U`; read A's pin count v,
//! store it into U and L, and CAS A's state from `v` to `v | REPLACED`, retrying with the
//! new count if a pin or unpin landed meanwhile: from that CAS on, A's count is frozen and
//! every holder of a pin on A holds one on U and on L. (3) publish U in the parent's table
//! with one atomic store: readers see A or U->L, never a half-split edge (A's content is
//! immutable, so a reader still on A reads valid data and, meeting `REPLACED`, moves to U).
//! (4) point A's children's parent pointers at L, queue L for eviction if A was an
//! unpinned leaf, and retire A through the epoch (the old parent table too). L is locked
//! from before (3) until after (4) (it is new, so the lock is uncontended): a writer that
//! reaches L through U and wants to change L's table or split L waits until every child of
//! L names L as its parent, so no child is ever left naming a node that was replaced.
//! Nothing a reader may hold is freed before every guard that could see it is gone.
//!
//! **Pins** are path pins, like SGLang's `lock_ref`: a lock on `t[0..m]` adds one to every
//! node on that path. The count goes up only from a live state (no `DEAD`, no `REPLACED`
//! bit); a CAS that meets `REPLACED` moves to `forward`. Release re-walks the locked prefix
//! from the root by its tokens (the lock keeps them), so a handle never names a node that
//! could be freed; the walk decrements every node on the current path, which, because U
//! and L inherited A's frozen count, is exactly the set of nodes the lock pinned. The
//! `evictable`/`protected` counters move on 0->1 and 1->0 transitions, by the edge length;
//! a split moves nothing.
//!
//! **Eviction** keeps evictable leaves in a lazy priority queue (`evict_index`), O(log n)
//! per leaf, O(1) for leaves queued in stamp order (most of them). To evict, it locks the
//! parent, then the leaf, re-checks it is an unpinned leaf, CASes its state `0 -> DEAD`,
//! swaps the parent's table for one without it, frees its slots and retires it. A parent
//! that became an unpinned leaf is queued.
//!
//! **Memory reclamation.** Unlinked nodes and replaced child tables go to crossbeam-epoch,
//! which frees them once no guard that could see them is left. That work runs inside
//! whichever call pins a thread after every 128 pins, unless the caller runs it first with
//! [`RadixTree::reclaim`] at a moment of its choosing.
//!
//! Locks are always taken parent before child, and node locks before the eviction index's
//! lock, so writers cannot deadlock. Inserts into different subtrees lock different nodes.

mod evict_index;
mod node;
mod slot_sink;
mod slot_source;
mod stripes;

use std::fmt;

use evict_index::{EvictIndex, Evicted};
use node::{ChildTable, DEAD, Node, PIN_MASK, REPLACED, node_ref};
pub(crate) use slot_sink::SlotSink;
pub(crate) use slot_source::{SlotSource, cut_runs, push_differing};
use stripes::MatchCounters;

use crate::error::{Error, Result, invalid};
use crate::slot_run::SlotRun;
use crate::sync::epoch::{Atomic, Domain, Guard, Owned};
use crate::sync::{AtomicU64, Mutex, Ordering, lock, next_id};

/// How eviction orders evictable leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvictionPolicy {
    /// Least recently accessed leaf first (`RKV_EVICT_LRU = 0`).
    #[default]
    Lru,
    /// Oldest inserted leaf first, ignoring later accesses (`RKV_EVICT_FIFO = 1`).
    Fifo,
}

impl std::str::FromStr for EvictionPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "lru" => Ok(EvictionPolicy::Lru),
            "fifo" => Ok(EvictionPolicy::Fifo),
            _ => Err(invalid(format!("unknown eviction policy {s:?} (expected lru or fifo)"))),
        }
    }
}

impl fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Fifo => "fifo",
        })
    }
}

/// Settings fixed for a tree's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeConfig {
    /// Page size `P >= 1`: keys are cut to a multiple of it, and it is the unit cached.
    pub page_size: usize,
    /// Eviction order.
    pub policy: EvictionPolicy,
}

impl Default for TreeConfig {
    fn default() -> Self {
        TreeConfig { page_size: 1, policy: EvictionPolicy::Lru }
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
    /// Tokens removed by eviction.
    pub evicted_tokens: u64,
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
    pub(crate) tokens: Box<[u32]>,
}

impl PrefixLock {
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

/// Namespace -> root, an immutable sorted table replaced whole when a namespace appears.
struct NsTable {
    ids: Box<[u64]>,
    roots: Box<[*mut Node]>,
}

// SAFETY: immutable once published; roots are nodes, which are Send + Sync.
unsafe impl Send for NsTable {}
// SAFETY: as above.
unsafe impl Sync for NsTable {}

/// The result of trying to pin one node.
enum Pin {
    Pinned,
    Dead,
    Replaced,
}

/// What a quiescent walk of the tree found (see [`RadixTree::check_invariants`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeCensus {
    /// Tokens in reachable nodes.
    pub cached_tokens: u64,
    /// Tokens in reachable nodes with a pin count above zero.
    pub pinned_tokens: u64,
    /// Reachable nodes, roots excluded.
    pub nodes: u64,
    /// Reachable leaves, roots excluded.
    pub leaves: u64,
    /// Heap bytes of nodes, child tables and the eviction index.
    pub heap_bytes: u64,
}

/// The concurrent radix tree. `Send + Sync`: share it by reference or `Arc`.
///
/// See the module docs for the consistency promises and the protocols.
pub struct RadixTree {
    cfg: TreeConfig,
    id: u64,
    domain: Domain,
    roots: Atomic<NsTable>,
    roots_lock: Mutex<()>,
    /// Logical clock for access stamps: bumped by inserts, read by matches.
    clock: AtomicU64,
    index: EvictIndex,
    cached: AtomicU64,
    evictable: AtomicU64,
    protected: AtomicU64,
    nodes: AtomicU64,
    inserted: AtomicU64,
    evicted: AtomicU64,
    matches: MatchCounters,
}

/// What an insert asks of its `prepare` step (see `RadixTree::insert_with`).
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
        Ok(RadixTree {
            cfg,
            id: next_id(),
            domain: Domain::new(),
            roots: Atomic::null(),
            roots_lock: Mutex::new(()),
            clock: AtomicU64::new(1),
            index: EvictIndex::new(),
            cached: AtomicU64::new(0),
            evictable: AtomicU64::new(0),
            protected: AtomicU64::new(0),
            nodes: AtomicU64::new(0),
            inserted: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            matches: MatchCounters::new(),
        })
    }

    /// Page size.
    pub fn page_size(&self) -> usize {
        self.cfg.page_size
    }

    /// The configuration.
    pub fn config(&self) -> TreeConfig {
        self.cfg
    }

    #[inline]
    fn aligned(&self, len: usize) -> usize {
        len / self.cfg.page_size * self.cfg.page_size
    }

    // ---------------------------------------------------------------- namespaces

    fn root<'g>(&self, ns: u64, g: &'g Guard) -> Option<&'g Node> {
        let t = self.roots.load(Ordering::SeqCst, g);
        // SAFETY: namespace tables are retired through the epoch only after being swapped
        // out, so one loaded under `g` is valid for 'g.
        let t = unsafe { t.as_ref() }?;
        let i = t.ids.binary_search(&ns).ok()?;
        // SAFETY: roots live as long as the tree.
        unsafe { node_ref(t.roots[i], g) }
    }

    fn root_or_create<'g>(&self, ns: u64, g: &'g Guard) -> &'g Node {
        if let Some(r) = self.root(ns, g) {
            return r;
        }
        let _l = lock(&self.roots_lock);
        if let Some(r) = self.root(ns, g) {
            return r;
        }
        let root = Box::into_raw(Box::new(Node::new(&[], &[], 0, 0, 1)));
        let old = self.roots.load(Ordering::SeqCst, g);
        // SAFETY: as in `root`.
        let (mut ids, mut roots) = match unsafe { old.as_ref() } {
            Some(t) => (t.ids.to_vec(), t.roots.to_vec()),
            None => (Vec::new(), Vec::new()),
        };
        let i = ids.partition_point(|&x| x < ns);
        ids.insert(i, ns);
        roots.insert(i, root);
        let new = Owned::new(NsTable { ids: ids.into(), roots: roots.into() });
        self.roots.store(new, Ordering::SeqCst);
        if !old.is_null() {
            // SAFETY: `old` was just swapped out under the roots lock; no new reader can
            // load it, and current readers hold guards the epoch waits for.
            unsafe { g.defer_destroy(old) };
        }
        // SAFETY: roots live as long as the tree.
        unsafe { node_ref(root, g) }.expect("fresh root")
    }

    // ---------------------------------------------------------------- small steps

    #[inline]
    fn now(&self) -> u64 {
        self.clock.load(Ordering::Relaxed)
    }

    /// Refreshes `n`'s access stamp (LRU only), writing only when the clock moved.
    #[inline]
    fn touch(&self, n: &Node, now: u64) {
        if self.cfg.policy == EvictionPolicy::Lru && n.stamp.load(Ordering::Relaxed) < now {
            n.stamp.store(now, Ordering::Relaxed);
        }
    }

    /// The node that replaced `n`'s beginning, following `forward` while `REPLACED`.
    #[inline]
    fn resolve<'g>(&self, mut n: &'g Node, g: &'g Guard) -> &'g Node {
        while n.state.load(Ordering::SeqCst) & REPLACED != 0 {
            let f = n.forward.load(Ordering::SeqCst);
            // SAFETY: `forward` is stored before REPLACED is set, and U is retired no
            // earlier than A (its own split or eviction comes after A's retirement), so
            // U is valid for any guard under which A is.
            n = unsafe { node_ref(f, g) }.expect("REPLACED implies forward");
        }
        n
    }

    /// For a node this thread has pinned (so its pages stay cached): the current node that
    /// ends where `n` ends (after splits of `n`, the last of its replacements).
    fn last_of<'g>(&self, n: &'g Node, g: &'g Guard) -> &'g Node {
        if n.state.load(Ordering::SeqCst) & REPLACED == 0 {
            return n;
        }
        let key = n.key();
        let p = self.cfg.page_size;
        let mut x = self.resolve(n, g);
        let mut off = x.len();
        while off < key.len() {
            let c = x.child(&key[off..off + p], g).expect("pinned pages stay cached");
            x = self.resolve(c, g);
            off += x.len();
        }
        debug_assert_eq!(off, key.len());
        x
    }

    /// Whether the first `k` tokens of `n` (measured from `n`'s start) are still cached.
    fn is_live(&self, n: &Node, k: usize, g: &Guard) -> bool {
        let p = self.cfg.page_size;
        let key = &n.key()[..k];
        let mut off = 0;
        let mut x = n;
        loop {
            x = self.resolve(x, g);
            if x.state.load(Ordering::SeqCst) & DEAD != 0 {
                return false;
            }
            off += x.len();
            if off >= key.len() {
                return true;
            }
            match x.child(&key[off..off + p], g) {
                Some(c) => x = c,
                None => return false,
            }
        }
    }

    fn on_pinned(&self, len: usize) {
        self.evictable.fetch_sub(len as u64, Ordering::Relaxed);
        self.protected.fetch_add(len as u64, Ordering::Relaxed);
    }

    fn on_unpinned(&self, len: usize) {
        self.protected.fetch_sub(len as u64, Ordering::Relaxed);
        self.evictable.fetch_add(len as u64, Ordering::Relaxed);
    }

    /// Adds one pin to `n` if it is live (crossbeam-skiplist's `try_increment`).
    #[inline]
    fn try_pin(&self, n: &Node) -> Pin {
        let mut s = n.state.load(Ordering::SeqCst);
        loop {
            if s & DEAD != 0 {
                return Pin::Dead;
            }
            if s & REPLACED != 0 {
                return Pin::Replaced;
            }
            assert!(s & PIN_MASK < PIN_MASK, "pin count overflow");
            match n.state.compare_exchange_weak(s, s + 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {
                    if s & PIN_MASK == 0 {
                        self.on_pinned(n.len());
                    }
                    return Pin::Pinned;
                }
                Err(x) => s = x,
            }
        }
    }

    /// Removes one pin from `n`; `false` if `n` was replaced (the pin lives on in its
    /// replacements). Queues `n` for eviction when it becomes an unpinned leaf.
    #[inline]
    fn try_unpin(&self, n: &Node, g: &Guard) -> bool {
        let mut s = n.state.load(Ordering::SeqCst);
        loop {
            if s & REPLACED != 0 {
                return false;
            }
            assert!(s & PIN_MASK > 0 && s & DEAD == 0, "unpin of a node this lock did not pin");
            match n.state.compare_exchange_weak(s, s - 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {
                    if s & PIN_MASK == 1 {
                        self.on_unpinned(n.len());
                        if n.is_leaf(g) {
                            self.index.push(n);
                        }
                    }
                    return true;
                }
                Err(x) => s = x,
            }
        }
    }

    /// Removes one pin from every node on the path `key` below `root` (a prefix this
    /// thread pinned).
    fn unpin_path(&self, root: &Node, key: &[u32], g: &Guard) {
        let p = self.cfg.page_size;
        let mut cur = root;
        let mut pos = 0;
        while pos < key.len() {
            let c = cur.child(&key[pos..pos + p], g).expect("pinned pages stay cached");
            let mut x = self.resolve(c, g);
            while !self.try_unpin(x, g) {
                x = self.resolve(x, g);
            }
            debug_assert!(pos + x.len() <= key.len(), "a lock ends on a node boundary");
            pos += x.len();
            cur = x;
        }
    }

    // ---------------------------------------------------------------- split

    /// Splits `a` after its first `k` tokens (copy-on-split, see the module docs) and
    /// returns the upper half U, pinned once more than A was when `pin_u`. `None` if `a`
    /// was replaced or evicted meanwhile (the caller looks again).
    fn split<'g>(&self, a: &'g Node, k: usize, pin_u: bool, g: &'g Guard) -> Option<&'g Node> {
        debug_assert!(k > 0 && k < a.len() && k % self.cfg.page_size == 0);
        let a_ptr = a as *const Node as *mut Node;
        loop {
            let pp = a.parent.load(Ordering::SeqCst);
            // SAFETY: `a` was reachable under `g`, so its parent then was too, and parents
            // are retired only after their children's parent pointers moved on.
            let parent = unsafe { node_ref(pp, g) }.expect("non-root nodes have a parent");
            let _pl = lock(&parent.lock);
            let _al = lock(&a.lock);
            let s0 = a.state.load(Ordering::SeqCst);
            if s0 & (DEAD | REPLACED) != 0 {
                return None;
            }
            if a.parent.load(Ordering::SeqCst) != pp {
                continue; // the parent was split; A now hangs under its L
            }
            debug_assert_eq!(parent.state.load(Ordering::SeqCst) & (DEAD | REPLACED), 0);
            // (1) Build U and L off to the side.
            let stamp = a.stamp.load(Ordering::Relaxed);
            let u = Box::into_raw(Box::new(Node::part_of(a, 0, k, 0, stamp)));
            let l = Box::into_raw(Box::new(Node::part_of(a, k, a.len(), 0, stamp)));
            // SAFETY: both were just allocated and are not shared yet.
            let (un, ln) = unsafe { (&*u, &*l) };
            // L stays locked until its children point at it: from the moment U is published
            // a thread may reach L and want to change L's table or split L, and it must not
            // do so while a child of L still names A (or a child names L while L is being
            // replaced). Uncontended: nobody else can see L yet.
            let _ll = lock(&ln.lock);
            un.parent.store(pp, Ordering::SeqCst);
            ln.parent.store(u, Ordering::SeqCst);
            // A is locked, so its table cannot change: L takes it over as is.
            ln.children.store(a.children.load(Ordering::SeqCst, g), Ordering::SeqCst);
            un.children.store(Owned::new(ChildTable::single(ln.key()[0], l)), Ordering::SeqCst);
            // (2) Freeze A's pin count into U and L.
            a.forward.store(u, Ordering::SeqCst);
            let mut v = s0;
            loop {
                un.state.store(v + pin_u as u64, Ordering::SeqCst);
                ln.state.store(v, Ordering::SeqCst);
                match a.state.compare_exchange(v, v | REPLACED, Ordering::SeqCst, Ordering::SeqCst)
                {
                    Ok(_) => break,
                    Err(x) => {
                        debug_assert_eq!(x & (DEAD | REPLACED), 0, "A is locked");
                        v = x;
                    }
                }
            }
            if pin_u && v & PIN_MASK == 0 {
                self.on_pinned(k);
            }
            // (3) Publish U in place of A: one atomic store.
            let old = parent.children.load(Ordering::SeqCst, g);
            // SAFETY: the parent is locked, so its table is the current one and not retired.
            let table = unsafe { old.deref() }.with_replaced(a_ptr, u);
            parent.children.store(Owned::new(table), Ordering::SeqCst);
            // SAFETY: swapped out under the parent's lock; readers hold guards.
            unsafe { g.defer_destroy(old) };
            // (4) Re-parent A's children (under A's and L's locks, so their tables and
            // these pointers cannot change meanwhile), queue L, retire A.
            if let Some(t) = ln.table(g) {
                for c in t.nodes() {
                    // SAFETY: children of the locked L (A's table) are live nodes.
                    let c = unsafe { node_ref(c, g) }.expect("tables hold no null");
                    c.parent.store(l, Ordering::SeqCst);
                }
            }
            self.nodes.fetch_add(1, Ordering::Relaxed);
            if v & PIN_MASK == 0 && ln.is_leaf(g) {
                self.index.push(ln);
            }
            drop(_ll);
            drop(_al);
            drop(_pl);
            self.index.retire(a_ptr, g);
            return Some(un);
        }
    }

    // ---------------------------------------------------------------- match

    /// Longest cached prefix of `tokens` (cut to a page multiple) in namespace `ns`: clears
    /// `out`, writes the matched slots, returns the match length (a multiple of the page
    /// size). Lock-free; changes no structure; refreshes access stamps.
    ///
    /// In a concurrent cache this is an estimate: the prefix may be evicted the moment it
    /// returns. Admit requests with [`RadixTree::match_and_lock`].
    pub fn match_prefix(&self, ns: u64, tokens: &[u32], out: &mut Vec<u32>) -> usize {
        self.match_into(ns, tokens, out)
    }

    /// [`RadixTree::match_prefix`] writing the matched slots to `out` (cleared first) as
    /// runs of consecutive slots ([`SlotRun`], in token order; neighbours that continue one
    /// another are joined): O(runs) to write instead of O(tokens) when slots come in runs,
    /// as a pool hands them out. The runs' lengths add up to the match length returned.
    pub fn match_prefix_runs(&self, ns: u64, tokens: &[u32], out: &mut Vec<SlotRun>) -> usize {
        self.match_into(ns, tokens, out)
    }

    fn match_into<S: SlotSink>(&self, ns: u64, tokens: &[u32], out: &mut S) -> usize {
        let m = self.match_unrecorded(ns, tokens, out);
        self.matches.record(tokens.len(), m);
        m
    }

    /// A match that the statistics do not count (the C ABI's size check before a locking
    /// match, which counts itself): otherwise [`RadixTree::match_prefix`] /
    /// [`RadixTree::match_prefix_runs`], access stamps included.
    pub(crate) fn match_unrecorded<S: SlotSink>(
        &self,
        ns: u64,
        tokens: &[u32],
        out: &mut S,
    ) -> usize {
        out.clear();
        let n = self.aligned(tokens.len());
        let g = self.domain.pin();
        match self.root(ns, &g) {
            None => 0,
            Some(root) => loop {
                if let Some(m) = self.try_match(root, &tokens[..n], out, &g) {
                    break m;
                }
                out.clear();
            },
        }
    }

    /// One optimistic descent; `None` if a racing split or eviction invalidated it.
    fn try_match<S: SlotSink>(
        &self,
        root: &Node,
        key: &[u32],
        out: &mut S,
        g: &Guard,
    ) -> Option<usize> {
        let p = self.cfg.page_size;
        let now = self.now();
        let mut cur = root;
        let mut pos = 0;
        let mut last: Option<(&Node, usize)> = None;
        while pos < key.len() {
            if cur.state.load(Ordering::SeqCst) & REPLACED != 0 {
                return None; // cur's table is frozen: start over on the current tree
            }
            let Some(c) = cur.child_candidate(&key[pos..pos + p], g) else {
                break;
            };
            let c = self.resolve(c, g);
            if c.state.load(Ordering::SeqCst) & DEAD != 0 {
                break; // being evicted: absent
            }
            let k = common_prefix(c.key(), &key[pos..]) / p * p;
            if k == 0 {
                break; // the candidate differs within the first page: no child matches
            }
            out.take(c, k);
            self.touch(c, now);
            pos += k;
            last = Some((c, k));
            if k < c.len() {
                break;
            }
            cur = c;
        }
        match last {
            Some((n, k)) if !self.is_live(n, k, g) => None,
            _ => Some(pos),
        }
    }

    /// Match and pin atomically: like [`RadixTree::match_prefix`], and the returned guard
    /// pins the matched pages (they stay cached with the same slots) until it is dropped.
    /// Where the match ends inside an edge, the edge is split so the lock ends on a node
    /// boundary. A lock on an empty match is valid too.
    pub fn match_and_lock(&self, ns: u64, tokens: &[u32], out: &mut Vec<u32>) -> LockGuard<'_> {
        let lock = self.match_and_lock_raw(ns, tokens, out);
        self.guard(lock)
    }

    /// [`RadixTree::match_and_lock`] returning a detached [`PrefixLock`].
    pub fn match_and_lock_raw(&self, ns: u64, tokens: &[u32], out: &mut Vec<u32>) -> PrefixLock {
        self.lock_into(ns, tokens, out)
    }

    /// [`RadixTree::match_and_lock`] writing the matched slots as runs, as
    /// [`RadixTree::match_prefix_runs`] does.
    pub fn match_and_lock_runs(
        &self,
        ns: u64,
        tokens: &[u32],
        out: &mut Vec<SlotRun>,
    ) -> LockGuard<'_> {
        let lock = self.lock_into(ns, tokens, out);
        self.guard(lock)
    }

    /// [`RadixTree::match_and_lock_runs`] returning a detached [`PrefixLock`].
    pub fn match_and_lock_runs_raw(
        &self,
        ns: u64,
        tokens: &[u32],
        out: &mut Vec<SlotRun>,
    ) -> PrefixLock {
        self.lock_into(ns, tokens, out)
    }

    fn lock_into<S: SlotSink>(&self, ns: u64, tokens: &[u32], out: &mut S) -> PrefixLock {
        out.clear();
        let n = self.aligned(tokens.len());
        let g = self.domain.pin();
        let m = match self.root(ns, &g) {
            None => 0,
            Some(root) => self.pin_descend(root, &tokens[..n], out, &g),
        };
        self.matches.record(tokens.len(), m);
        PrefixLock { tree_id: self.id, ns, tokens: tokens[..m].into() }
    }

    /// Pins the longest cached prefix of `key`, splitting at its end; returns its length.
    fn pin_descend<S: SlotSink>(&self, root: &Node, key: &[u32], out: &mut S, g: &Guard) -> usize {
        let p = self.cfg.page_size;
        let now = self.now();
        let mut cur = root;
        let mut pos = 0;
        'step: while pos < key.len() {
            cur = self.last_of(cur, g);
            let Some(c) = cur.child_candidate(&key[pos..pos + p], g) else {
                break;
            };
            let mut c = self.resolve(c, g);
            loop {
                let k = common_prefix(c.key(), &key[pos..]) / p * p;
                if k == 0 {
                    break 'step; // the candidate differs within the first page
                }
                if k < c.len() {
                    match self.split(c, k, true, g) {
                        Some(u) => {
                            out.take(u, u.len());
                            self.touch(u, now);
                            pos += k;
                            break 'step;
                        }
                        None => continue 'step,
                    }
                }
                match self.try_pin(c) {
                    Pin::Pinned => {
                        out.take(c, c.len());
                        self.touch(c, now);
                        pos += k;
                        cur = c;
                        continue 'step;
                    }
                    Pin::Dead => break 'step,
                    Pin::Replaced => c = self.resolve(c, g),
                }
            }
        }
        pos
    }

    // ---------------------------------------------------------------- insert

    /// Caches `tokens[..n]` (n = `tokens.len()` cut to a page multiple) with `slots`
    /// (same length as `tokens`) and returns `existing`, the match length at the moment
    /// of insertion: the slots `slots[..existing]` are not adopted (the tree keeps its
    /// own), nor are `slots[n..]`; the caller owns every slot not adopted.
    pub fn insert(&self, ns: u64, tokens: &[u32], slots: &[u32]) -> Result<usize> {
        self.insert_plain(ns, tokens, SlotSource::List(slots), false).map(|(e, _)| e)
    }

    /// [`RadixTree::insert`] with the slots given as runs of consecutive slots, in token
    /// order (their lengths must add up to `tokens.len()`; `InvalidArgument` otherwise, or
    /// for an empty run or one past slot id `u32::MAX`): the new leaf stores the runs as
    /// they are, O(runs) instead of scanning every slot. The runs `slots[..existing]` and
    /// past `n` cover are not adopted, as in `insert`.
    pub fn insert_runs(&self, ns: u64, tokens: &[u32], runs: &[SlotRun]) -> Result<usize> {
        let src = SlotSource::runs(runs, tokens.len())?;
        self.insert_plain(ns, tokens, src, false).map(|(e, _)| e)
    }

    /// [`RadixTree::insert_and_lock_raw`] with the slots given as runs (as in
    /// [`RadixTree::insert_runs`]).
    pub fn insert_and_lock_runs_raw(
        &self,
        ns: u64,
        tokens: &[u32],
        runs: &[SlotRun],
    ) -> Result<(usize, PrefixLock)> {
        let src = SlotSource::runs(runs, tokens.len())?;
        let (e, l) = self.insert_plain(ns, tokens, src, true)?;
        Ok((e, l.expect("a pinning insert returns a lock")))
    }

    /// An insert with nothing to collect or prepare.
    fn insert_plain(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: SlotSource<'_>,
        pin: bool,
    ) -> Result<(usize, Option<PrefixLock>)> {
        self.insert_with::<Vec<u32>>(ns, tokens, slots, pin, None, &mut |_, _, _| Ok(()))
    }

    /// Insert and pin `tokens[..n]` atomically (chunked prefill, or a request that keeps
    /// running: release its old lock afterwards).
    pub fn insert_and_lock(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: &[u32],
    ) -> Result<(usize, LockGuard<'_>)> {
        let (e, l) = self.insert_and_lock_raw(ns, tokens, slots)?;
        Ok((e, self.guard(l)))
    }

    /// [`RadixTree::insert_and_lock`] returning a detached [`PrefixLock`].
    pub fn insert_and_lock_raw(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: &[u32],
    ) -> Result<(usize, PrefixLock)> {
        let (e, l) = self.insert_plain(ns, tokens, SlotSource::List(slots), true)?;
        Ok((e, l.expect("a pinning insert returns a lock")))
    }

    /// Wraps a detached lock of this tree in a guard.
    pub(crate) fn guard(&self, lock: PrefixLock) -> LockGuard<'_> {
        LockGuard { tree: self, lock: Some(lock) }
    }

    /// A lock on `key` of `ns`.
    fn lock_of(&self, ns: u64, key: &[u32]) -> PrefixLock {
        PrefixLock { tree_id: self.id, ns, tokens: key.into() }
    }

    /// The insert behind every public variant. `prepare(existing, cached, Stage::Commit)`
    /// runs once, at the moment the outcome is fixed and before anything changes (for a new
    /// leaf: under its parent's lock, so the cached path cannot change); `cached` holds the
    /// slots of `tokens[..existing]` when `collect` is given (one per token or as runs, by
    /// `S`). If it fails, nothing changes (a pin taken on the way is undone) and its error
    /// is returned. With `pin`, the second value is the lock on `tokens[..n]`.
    ///
    /// Some inserts change the tree's shape before that moment: a new namespace gets its
    /// root, and an edge where the key diverges (or, with `pin`, where it ends) is split.
    /// Before the first such change, `prepare(existing, cached, Stage::Check)` is asked,
    /// once, with the outcome as it stands then (before a split only when `collect` is
    /// given: without the cached slots there is nothing to check; before a new root always,
    /// as nothing is cached there); it must change nothing, and if it fails the insert
    /// returns its error with the tree untouched. So an insert that would be refused
    /// (a pool-mode insert with a bad slot) leaves no split behind and moves no access stamp
    /// (the path's stamps are refreshed only once the insert has succeeded). Only a race
    /// that changes the outcome between the check and the commit can still leave a split
    /// behind a refusal; a split changes no cached token or slot.
    pub(crate) fn insert_with<S: SlotSink + Default>(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: SlotSource<'_>,
        pin: bool,
        mut collect: Option<&mut S>,
        prepare: &mut dyn FnMut(usize, &S, Stage) -> Result<()>,
    ) -> Result<(usize, Option<PrefixLock>)> {
        if tokens.len() != slots.len() {
            return Err(invalid(format!(
                "{} tokens but {} slots (one slot per token)",
                tokens.len(),
                slots.len()
            )));
        }
        let p = self.cfg.page_size;
        let n = self.aligned(tokens.len());
        let key = &tokens[..n];
        let g = self.domain.pin();
        let root = match self.root(ns, &g) {
            Some(r) => r,
            None => {
                // A new namespace: nothing of the key is cached.
                prepare(0, &S::default(), Stage::Check)?;
                self.root_or_create(ns, &g)
            }
        };
        let now = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        let want = collect.is_some();
        let mut scratch = S::default();
        let cached: &mut S = match collect.as_mut() {
            Some(v) => v,
            None => &mut scratch,
        };
        cached.clear();
        let mut cur = root;
        let mut pos = 0;
        // The nodes whose access stamps the insert refreshes, once it has succeeded.
        let mut path: Vec<&Node> = Vec::new();
        // Whether `prepare` has checked the outcome before a change to the tree's shape.
        let mut checked = false;
        let fail = |e: Error, pos: usize| {
            if pin {
                self.unpin_path(root, &key[..pos], &g);
            }
            Err(e)
        };
        let done = |path: &[&Node]| {
            for n in path {
                self.touch(n, now);
            }
        };
        'step: loop {
            if pin {
                cur = self.last_of(cur, &g);
            }
            if pos == n {
                // Everything is cached already and the path ends on a node boundary.
                if let Err(e) = prepare(n, cached, Stage::Commit) {
                    return fail(e, pos);
                }
                done(&path);
                return Ok((n, pin.then(|| self.lock_of(ns, key))));
            }
            let page = &key[pos..pos + p];
            if let Some(c) = cur.child(page, &g) {
                let c = self.resolve(c, &g);
                if c.state.load(Ordering::SeqCst) & DEAD == 0 {
                    let k = common_prefix(c.key(), &key[pos..]) / p * p;
                    if k == c.len() {
                        if pin {
                            match self.try_pin(c) {
                                Pin::Pinned => {}
                                Pin::Dead | Pin::Replaced => continue 'step,
                            }
                        }
                        if want {
                            cached.take(c, c.len());
                        }
                        path.push(c);
                        pos += k;
                        cur = c;
                        continue 'step;
                    }
                    if want && (pin || pos + k < n) && !checked {
                        // A split comes next: check the outcome first (`existing = pos + k`).
                        // Only a caller that collects the cached slots can check anything
                        // (the pool's inserts); the others would only pay for the copy.
                        checked = true;
                        let mark = cached.mark();
                        cached.take(c, k);
                        let r = prepare(pos + k, cached, Stage::Check);
                        cached.rewind(mark);
                        if let Err(e) = r {
                            return fail(e, pos);
                        }
                    }
                    if pos + k == n {
                        // Ends inside this edge: all of it is cached.
                        if pin {
                            let Some(u) = self.split(c, k, true, &g) else {
                                continue 'step;
                            };
                            if want {
                                cached.take(u, u.len());
                            }
                            path.push(u);
                            pos = n;
                            cur = u;
                            continue 'step;
                        }
                        if want {
                            cached.take(c, k);
                        }
                        if let Err(e) = prepare(n, cached, Stage::Commit) {
                            return fail(e, pos);
                        }
                        path.push(c);
                        done(&path);
                        return Ok((n, None));
                    }
                    // Diverges inside the edge: split it, then look again.
                    self.split(c, k, false, &g);
                    continue 'step;
                }
            }
            // No live child for this page: hang a new leaf under `cur`. The leaf is built
            // (its tokens and slots copied) before the lock, so the parent's lock is held
            // only to check, settle and publish; if the check fails the leaf is dropped.
            let built = Box::new(slots.leaf(&key[pos..], pos, pin as u64, now, p));
            let guard = lock(&cur.lock);
            let s = cur.state.load(Ordering::SeqCst);
            if s & (DEAD | REPLACED) != 0 {
                drop(guard);
                if !pin {
                    // `cur` was evicted or split under us: start over.
                    cur = root;
                    pos = 0;
                    cached.clear();
                    path.clear();
                }
                continue 'step;
            }
            if cur.child(page, &g).is_some() {
                continue 'step; // someone else added it (live: the parent is locked)
            }
            if let Err(e) = prepare(pos, cached, Stage::Commit) {
                drop(guard);
                return fail(e, pos);
            }
            let len = n - pos;
            let leaf = Box::into_raw(built);
            // SAFETY: just allocated, not shared yet.
            let ln = unsafe { &*leaf };
            ln.parent.store(cur as *const Node as *mut Node, Ordering::SeqCst);
            if pin {
                self.protected.fetch_add(len as u64, Ordering::Relaxed);
            } else {
                self.evictable.fetch_add(len as u64, Ordering::Relaxed);
            }
            self.cached.fetch_add(len as u64, Ordering::Relaxed);
            self.nodes.fetch_add(1, Ordering::Relaxed);
            self.inserted.fetch_add(len as u64, Ordering::Relaxed);
            let old = cur.children.load(Ordering::SeqCst, &g);
            // SAFETY: `cur` is locked, so `old` is its current table and not retired.
            let table = match unsafe { old.as_ref() } {
                Some(t) => t.with_added(page[0], leaf),
                None => ChildTable::single(page[0], leaf),
            };
            cur.children.store(Owned::new(table), Ordering::SeqCst);
            if !old.is_null() {
                // SAFETY: swapped out under `cur`'s lock; readers hold guards.
                unsafe { g.defer_destroy(old) };
            }
            drop(guard);
            if !pin {
                self.index.push(ln);
            }
            done(&path);
            return Ok((pos, pin.then(|| self.lock_of(ns, key))));
        }
    }

    // ---------------------------------------------------------------- release

    /// Unpins what `lock` pinned. `InvalidLock` for a lock of another tree.
    pub fn release(&self, lock: PrefixLock) -> Result<()> {
        if lock.tree_id != self.id {
            return Err(Error::InvalidLock);
        }
        if lock.tokens.is_empty() {
            return Ok(());
        }
        let g = self.domain.pin();
        let root = self.root(lock.ns, &g).ok_or(Error::InvalidLock)?;
        self.unpin_path(root, &lock.tokens, &g);
        Ok(())
    }

    // ---------------------------------------------------------------- evict

    /// Frees at least `k` tokens (fewer only if nothing more is evictable), taking
    /// unpinned leaves in policy order (LRU: least recently accessed first). A whole leaf
    /// edge goes at once, so it may free more than `k`. Every freed slot is handed to
    /// `free` exactly once (called with no tree lock held; it must not call back into the
    /// tree). Returns the tokens freed. O(log n) per evicted leaf, plus O(tokens) to list
    /// the slots ([`RadixTree::evict_runs`] hands them over as runs instead).
    pub fn evict(&self, k: usize, free: &mut dyn FnMut(&[u32])) -> usize {
        // Expanded slots of compactly stored leaves, reused across the call's leaves.
        let mut scratch = Vec::new();
        self.evict_with(k, &mut |x| x.with_slots(&mut scratch, |slots| free(slots)))
    }

    /// [`RadixTree::evict`], handing each evicted leaf's slots to `free` as runs of
    /// consecutive slots ([`SlotRun`]; one run for a leaf whose slots run consecutively,
    /// as a pool hands them out) rather than one by one: the cost per leaf no longer grows
    /// with its length when its slots come in runs. Runs of one call are not merged across
    /// leaves; together they name every freed slot exactly once.
    pub fn evict_runs(&self, k: usize, free: &mut dyn FnMut(&[SlotRun])) -> usize {
        let mut runs = Vec::new();
        self.evict_with(k, &mut |x| {
            runs.clear();
            x.push_runs(&mut runs, x.len());
            free(&runs)
        })
    }

    /// The eviction loop: `hand` gets each evicted leaf, unlinked and not yet retired, to
    /// hand its slots over.
    ///
    /// Per leaf it takes the index lock once ([`EvictIndex::pop_after`] retires the leaf
    /// evicted before, queues its parent if that became a leaf, and pops the next), and the
    /// shared counters move once per call, not per leaf: locked instructions are most of
    /// what a leaf costs.
    fn evict_with(&self, k: usize, hand: &mut dyn FnMut(&Node)) -> usize {
        let lru = self.cfg.policy == EvictionPolicy::Lru;
        // Moves the counters when the call ends, also if `hand` unwinds: every leaf unlinked
        // by then is counted out.
        let mut tally = Tally { tree: self, freed: 0, leaves: 0 };
        let mut g = self.domain.pin();
        let mut since_repin = 0;
        let mut done = None;
        loop {
            let next = tally.freed < k;
            let popped = self.index.pop_after(done.take(), next, lru, &g);
            let Some(x) = popped else {
                break;
            };
            if let Some((len, parent)) = self.evict_leaf(x, &g) {
                tally.freed += len;
                tally.leaves += 1;
                hand(x);
                done = Some(Evicted { node: x as *const Node as *mut Node, parent });
            }
            since_repin += 1;
            if since_repin == 64 {
                since_repin = 0;
                // Nothing may stay pending across the repin (`done` names nodes by the guard).
                self.index.pop_after(done.take(), false, lru, &g);
                g.repin();
            }
        }
        tally.freed
    }

    /// Unlinks `x` if it is still an unpinned leaf; returns its length and the parent to
    /// queue (null if none: still has children, is the root, or is pinned). The caller hands
    /// its slots over (no lock held), retires it and queues the parent
    /// ([`EvictIndex::pop_after`]), and moves the counters.
    fn evict_leaf(&self, x: &Node, g: &Guard) -> Option<(usize, *const Node)> {
        let x_ptr = x as *const Node as *mut Node;
        loop {
            let pp = x.parent.load(Ordering::SeqCst);
            // SAFETY: `x` was live after `g` was pinned (checked by `pop`), so the parent
            // it names was linked then and is retired only through the epoch.
            let parent = unsafe { node_ref(pp, g) }.expect("non-root nodes have a parent");
            let pl = lock(&parent.lock);
            if x.parent.load(Ordering::SeqCst) != pp {
                continue;
            }
            let xl = lock(&x.lock);
            if !x.is_leaf(g) {
                return None;
            }
            if x.state.compare_exchange(0, DEAD, Ordering::SeqCst, Ordering::SeqCst).is_err() {
                return None; // pinned, replaced or dead
            }
            let old = parent.children.load(Ordering::SeqCst, g);
            // SAFETY: the parent is locked: `old` is its current table.
            let rest = unsafe { old.deref() }.without(x.key()[0], x_ptr);
            let parent_now_leaf = rest.is_none();
            match rest {
                Some(t) => parent.children.store(Owned::new(t), Ordering::SeqCst),
                None => parent.children.store(crate::sync::epoch::Shared::null(), Ordering::SeqCst),
            }
            // SAFETY: swapped out under the parent's lock; readers hold guards.
            unsafe { g.defer_destroy(old) };
            let is_root = parent.len() == 0;
            drop(xl);
            drop(pl);
            let queue_parent = parent_now_leaf
                && !is_root
                && parent.state.load(Ordering::SeqCst) & (PIN_MASK | DEAD | REPLACED) == 0;
            let parent = if queue_parent { parent as *const Node } else { std::ptr::null() };
            return Some((x.len(), parent));
        }
    }

    /// Drops every unpinned page (everything when nothing is pinned); each freed slot goes
    /// to `free` once. Returns the tokens freed. Counters are cumulative and not cleared.
    pub fn reset(&self, free: &mut dyn FnMut(&[u32])) -> usize {
        self.evict(usize::MAX, free)
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
        let get = |a: &AtomicU64| (a.load(Ordering::Relaxed) as i64).max(0) as u64;
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
        }
    }

    /// Walks the whole tree and checks its structure: no dead or replaced node reachable,
    /// edges non-empty page multiples, children keyed by distinct first pages in sorted
    /// order, parent pointers right, and the counters equal to what the walk finds
    /// (`cached == evictable + protected`). Meant for tests at quiescence; concurrent
    /// writers make it report spurious differences.
    pub fn check_invariants(&self) -> std::result::Result<TreeCensus, String> {
        let g = self.domain.pin();
        let p = self.cfg.page_size;
        let mut census = TreeCensus::default();
        let t = self.roots.load(Ordering::SeqCst, &g);
        // SAFETY: as in `root`.
        if let Some(t) = unsafe { t.as_ref() } {
            for &r in t.roots.iter() {
                // SAFETY: roots live as long as the tree.
                let root = unsafe { node_ref(r, &g) }.expect("roots are not null");
                census.heap_bytes += root.heap_bytes() as u64;
                let mut stack = vec![root];
                while let Some(n) = stack.pop() {
                    let Some(table) = n.table(&g) else { continue };
                    census.heap_bytes += table.heap_bytes() as u64;
                    let mut prev: Option<&[u32]> = None;
                    for c in table.nodes() {
                        // SAFETY: reachable under `g`.
                        let c = unsafe { node_ref(c, &g) }.expect("tables hold no null");
                        let s = c.state.load(Ordering::SeqCst);
                        if s & (DEAD | REPLACED) != 0 {
                            return Err(format!("reachable node in state {s:#x}"));
                        }
                        if c.len() == 0 || c.len() % p != 0 {
                            return Err(format!("edge of length {} with page size {p}", c.len()));
                        }
                        if !std::ptr::eq(c.parent.load(Ordering::SeqCst), n) {
                            return Err("wrong parent pointer".into());
                        }
                        let first = &c.key()[..p];
                        if let Some(pf) = prev {
                            if pf[0] > first[0] || pf == first {
                                return Err("child table not sorted or first pages repeat".into());
                            }
                        }
                        prev = Some(first);
                        census.nodes += 1;
                        census.cached_tokens += c.len() as u64;
                        if s & PIN_MASK != 0 {
                            census.pinned_tokens += c.len() as u64;
                        }
                        if c.is_leaf(&g) {
                            census.leaves += 1;
                        }
                        census.heap_bytes += c.heap_bytes() as u64;
                        stack.push(c);
                    }
                }
            }
        }
        census.heap_bytes += self.index.heap_bytes() as u64;
        let st = self.stats();
        if st.cached_tokens != census.cached_tokens
            || st.protected_tokens != census.pinned_tokens
            || st.evictable_tokens != census.cached_tokens - census.pinned_tokens
            || st.nodes != census.nodes
        {
            return Err(format!("counters {st:?} disagree with the tree {census:?}"));
        }
        if st.cached_tokens != st.evictable_tokens + st.protected_tokens {
            return Err(format!("cached != evictable + protected: {st:?}"));
        }
        Ok(census)
    }

    /// Entries in the eviction index (some may be stale); for tests and benches.
    pub fn eviction_queue_len(&self) -> usize {
        self.index.len()
    }
}

/// The counters an eviction call moves, applied once when it ends (see `evict_with`).
struct Tally<'a> {
    tree: &'a RadixTree,
    freed: usize,
    leaves: u64,
}

impl Drop for Tally<'_> {
    fn drop(&mut self) {
        let (t, f) = (self.tree, self.freed as u64);
        t.evictable.fetch_sub(f, Ordering::Relaxed);
        t.cached.fetch_sub(f, Ordering::Relaxed);
        t.nodes.fetch_sub(self.leaves, Ordering::Relaxed);
        t.evicted.fetch_add(f, Ordering::Relaxed);
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
        // Exclusive access: free every reachable node and table. Retired nodes and tables
        // were handed to the epoch, which frees them; the eviction index frees its tickets.
        let t = self.roots.load(Ordering::SeqCst, &g);
        if !t.is_null() {
            // SAFETY: exclusive access (`&mut self`): nothing else can reach these.
            let t = unsafe { t.into_owned() };
            for &r in t.roots.iter() {
                let mut stack = vec![r];
                while let Some(n) = stack.pop() {
                    // SAFETY: each reachable node is owned by the tree and visited once.
                    let node = unsafe { Box::from_raw(n) };
                    let table = node.children.load(Ordering::SeqCst, &g);
                    if !table.is_null() {
                        // SAFETY: a reachable table is owned by its node alone.
                        let table = unsafe { table.into_owned() };
                        stack.extend(table.nodes());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
