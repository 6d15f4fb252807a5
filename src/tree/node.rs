//! A tree node (one edge) and its immutable child table.

use super::evict_index::Ticket;
use super::slots::Edge;
use crate::sync::epoch::{Atomic, Guard};
use crate::sync::{AtomicPtr, AtomicU64, Mutex, Ordering};

/// The node's state word.
///
/// Bit layout: `[63] DEAD | [62] REPLACED | [61] SWA_GONE | [60..32] SWA pin count |
/// [31..0] pin count`.
pub(crate) type StateWord = u64;
/// Low 32 bits: how many locks pin this node.
pub(crate) const PIN_MASK: StateWord = 0xFFFF_FFFF;
/// One SWA (sliding-window) pin: a lock whose window covers this node (see `swa.rs`).
/// A node's SWA pins never exceed its pins: every window lock is part of a path lock.
pub(crate) const SWA_PIN: StateWord = 1 << 32;
/// Bits 60..32: how many window locks pin this node's SWA KV.
pub(crate) const SWA_PIN_MASK: StateWord = ((1 << 29) - 1) << 32;
/// The node's SWA KV was evicted (an SWA tombstone; its full KV stays). Set once, with a
/// CAS from "no SWA pin, live", and never cleared: a split copies it into both halves.
pub(crate) const SWA_GONE: StateWord = 1 << 61;
/// Superseded by a split: the node's content lives on in `forward` (U) and U's child L.
/// Its pin count is frozen from the moment this bit is set.
pub(crate) const REPLACED: StateWord = 1 << 62;
/// Being (or been) evicted: never pinned again, never reachable again once its parent's
/// table is swapped.
pub(crate) const DEAD: StateWord = 1 << 63;

const _: () = assert!(std::mem::size_of::<StateWord>() == 8);
const _: () = assert!(PIN_MASK & (REPLACED | DEAD) == 0);
const _: () = assert!(SWA_PIN_MASK & (PIN_MASK | SWA_GONE | REPLACED | DEAD) == 0);
const _: () = assert!(SWA_GONE & (PIN_MASK | REPLACED | DEAD) == 0);
const _: () = assert!(SWA_PIN_MASK >> 32 == (1 << 29) - 1);

/// One edge of the radix tree: a run of tokens with their slots ([`Edge`]), and the
/// shared state the protocols work on.
///
/// The tokens and slots never change after the node is built (a split builds new nodes);
/// the child table is replaced whole, under `lock`, and published with one atomic store.
pub(crate) struct Node {
    /// The tokens and their slots.
    pub(crate) edge: Edge,
    /// Immutable child table; null means no children.
    pub(crate) children: Atomic<ChildTable>,
    /// The parent (writers only; readers never follow it). Updated under the old parent's
    /// lock when the parent is split.
    pub(crate) parent: AtomicPtr<Node>,
    /// After a split: the upper node U that replaced this one (U's only child at the time
    /// was L, holding the rest). Stored before `REPLACED` is set.
    pub(crate) forward: AtomicPtr<Node>,
    /// See [`StateWord`].
    pub(crate) state: AtomicU64,
    /// Last access tick, or creation tick under the policies that ignore accesses (`fifo`,
    /// `filo`). Only grows once the node is published (see `RadixTree::touch`).
    pub(crate) stamp: AtomicU64,
    /// With a sliding window: the last access that refreshed the node's SWA KV (a match,
    /// insert or lock whose window covers the node: SGLang's window-bounded refresh), the
    /// SWA index's key (`swa.rs`). Only grows once the node is published, as `stamp`.
    pub(crate) swa_stamp: AtomicU64,
    /// Priority and hit count, under the policies that read them (see
    /// [`policy::MetaWord`](super::policy::MetaWord) for the bit layout; a split freezes
    /// the replaced node's word and hands what it held to the halves).
    pub(crate) meta: AtomicU64,
    /// Writer lock: held to change `children`, to split this node, or to evict it.
    pub(crate) lock: Mutex<()>,
    /// Its entry in the eviction index (null: not queued). Written only under the index's
    /// lock; read under it, and (under `mru` only) outside it as a hint by a touch (the
    /// touch/queue pair, see `evict_index.rs`).
    pub(crate) evq: AtomicPtr<Ticket>,
    /// Its entry in the SWA eviction index (trees with a sliding window only; null: not
    /// queued). Written only under that index's lock (see `swa.rs`).
    pub(crate) swa_evq: AtomicPtr<Ticket>,
    /// With KV events on, the id of the edge's first page (its page `i` is `page_id + i`;
    /// see `crate::events::resolve`); [`NO_PAGE_ID`] for a root or with events off.
    /// Immutable once the node is published, like `edge`.
    pub(crate) page_id: u64,
    /// The token offset of the edge's first token in its namespace's key (0 for a root;
    /// a split's lower half starts where the upper half ends). Immutable once published.
    /// The SWA index breaks ties between equal stamps by it, shallower first (`swa.rs`).
    pub(crate) start: u32,
    /// Under loom only: [`ALIVE`] until the node is dropped, then [`POISON`], so a model in
    /// which a node is used after it was freed fails (the loom test binary's allocator
    /// keeps freed memory unused for a while, so the poison stays readable). Plain std
    /// atomic: not part of any protocol, and invisible to the model.
    #[cfg(loom)]
    canary: std::sync::atomic::AtomicU64,
}

// 120 bytes on 64-bit Linux (96 before the SWA component's ticket, stamp and start offset,
// 88 before the metadata word of the eviction policies): the memory tests bound bytes per
// token, and docs/eviction.md gives the size.
#[cfg(all(target_os = "linux", target_pointer_width = "64", not(loom)))]
const _: () = assert!(std::mem::size_of::<Node>() == 120);

/// [`Node::page_id`] of a node without event pages.
pub(crate) const NO_PAGE_ID: u64 = u64::MAX;

/// A live node's canary (loom only).
#[cfg(loom)]
const ALIVE: u64 = 0xA11E_A11E_A11E_A11E;
/// A dropped node's canary (loom only).
#[cfg(loom)]
const POISON: u64 = 0xDEAD_DEAD_DEAD_DEAD;

#[cfg(loom)]
impl Drop for Node {
    fn drop(&mut self) {
        // Relaxed: a test aid outside every protocol (see `canary`).
        self.canary.store(POISON, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Node {
    /// A node holding `edge`, pinned `pins` times, with access stamp `stamp` and metadata
    /// word `meta` (a [`policy::MetaWord`](super::policy::MetaWord)).
    pub(crate) fn new(edge: Edge, pins: u64, stamp: u64, meta: u64) -> Node {
        Node {
            edge,
            children: Atomic::null(),
            parent: AtomicPtr::new(std::ptr::null_mut()),
            forward: AtomicPtr::new(std::ptr::null_mut()),
            state: AtomicU64::new(pins),
            stamp: AtomicU64::new(stamp),
            swa_stamp: AtomicU64::new(stamp),
            meta: AtomicU64::new(meta),
            lock: Mutex::new(()),
            evq: AtomicPtr::new(std::ptr::null_mut()),
            swa_evq: AtomicPtr::new(std::ptr::null_mut()),
            page_id: NO_PAGE_ID,
            start: 0,
            #[cfg(loom)]
            canary: std::sync::atomic::AtomicU64::new(ALIVE),
        }
    }

    /// Under loom: panics if this node was freed (see `canary`).
    #[cfg(loom)]
    #[inline]
    pub(crate) fn check_alive(&self) {
        // Relaxed: as in `drop`.
        let c = self.canary.load(std::sync::atomic::Ordering::Relaxed);
        assert!(c == ALIVE, "use of a freed node (canary {c:#x}): reclaimed too early");
    }

    /// Edge length in tokens.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        #[cfg(loom)]
        self.check_alive();
        self.edge.len()
    }

    /// The edge's tokens.
    #[inline]
    pub(crate) fn key(&self) -> &[u32] {
        #[cfg(loom)]
        self.check_alive();
        self.edge.key()
    }

    /// Heap bytes owned by this node (not counting its child table).
    pub(crate) fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Node>() + self.edge.heap_bytes()
    }

    /// The child table, or `None` for a node without children.
    #[inline]
    pub(crate) fn table<'g>(&self, guard: &'g Guard) -> Option<&'g ChildTable> {
        #[cfg(loom)]
        self.check_alive();
        // Acquire: pairs with the Release store that published the table, so its entries
        // and the nodes they name are seen as built.
        let t = self.children.load(Ordering::Acquire, guard);
        // SAFETY: tables are only freed through the epoch after being unlinked (swapped
        // out), and `guard` pins the epoch, so a table loaded under it stays valid for 'g.
        unsafe { t.as_ref() }
    }

    /// True if the node has no children right now.
    #[inline]
    pub(crate) fn is_leaf(&self, guard: &Guard) -> bool {
        self.table(guard).is_none_or(|t| t.is_empty())
    }

    /// The only child that can hold `page` (see [`ChildTable::candidate`]).
    #[inline]
    pub(crate) fn child_candidate<'g>(&self, page: &[u32], guard: &'g Guard) -> Option<&'g Node> {
        self.table(guard)?.candidate(page, guard)
    }

    /// The child whose first page is `page`, if any.
    #[inline]
    pub(crate) fn child<'g>(&self, page: &[u32], guard: &'g Guard) -> Option<&'g Node> {
        self.table(guard)?.find(page, guard)
    }
}

/// Turns a node pointer read from the tree into a reference bounded by the guard.
///
/// # Safety
/// `p` must be null or a pointer read under `guard` from a place that keeps the node from
/// being retired while the pointer can still be read there:
/// * a child table loaded under `guard`, a node's `parent` field, or the namespace map: a
///   node is retired only after every store that removes it from those places (its
///   parent's table swapped, its children re-parented or, for a root, evicted, and its
///   entry removed from the map: see the `namespace` module), so a pointer read from them after
///   `guard` was pinned names a node that was reachable then, which the epoch keeps;
/// * an eviction ticket, read under the index lock: a ticket is cut (under that lock)
///   before its node is retired;
/// * the `forward` field of a node that was itself reachable through tables at a moment
///   after `guard` was pinned (see the `descent` module: `forward` is never cleared, so
///   this does not hold for a node known only from a ticket, which may have been unlinked
///   before `guard` was pinned).
#[inline]
pub(crate) unsafe fn node_ref(p: *mut Node, _guard: &Guard) -> Option<&Node> {
    // SAFETY: the caller guarantees `p` is null or valid for the guard's lifetime.
    let n = unsafe { p.cast_const().as_ref() };
    #[cfg(loom)]
    if let Some(n) = n {
        n.check_alive();
    }
    n
}

/// An immutable, sorted table of a node's children keyed by their first page.
///
/// Entries are sorted by first token; with page size > 1 several children may share a
/// first token and differ later in the page, so lookups compare the whole page. One
/// allocation holds every entry (a table is rebuilt on every change, so fewer allocations
/// make inserts, splits and evictions cheaper).
pub(crate) struct ChildTable {
    entries: Box<[Child]>,
}

/// One child: its first token and the node.
#[derive(Clone, Copy)]
struct Child {
    first: u32,
    node: *mut Node,
}

const _: () = assert!(std::mem::size_of::<Child>() == 16);

// SAFETY: a ChildTable is immutable once built; the raw pointers it holds are to nodes,
// which are Send + Sync (all their mutable state is atomic or behind a Mutex).
unsafe impl Send for ChildTable {}
// SAFETY: as above; shared access only reads the immutable array.
unsafe impl Sync for ChildTable {}

impl ChildTable {
    /// A table with one child.
    pub(crate) fn single(first: u32, node: *mut Node) -> ChildTable {
        ChildTable { entries: Box::new([Child { first, node }]) }
    }

    /// Number of children.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when empty (never published: an empty table is stored as null).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The child pointers.
    pub(crate) fn nodes(&self) -> impl Iterator<Item = *mut Node> + '_ {
        self.entries.iter().map(|c| c.node)
    }

    /// Index of the first entry whose first token is not below `first`.
    #[inline]
    fn lower_bound(&self, first: u32) -> usize {
        self.entries.partition_point(|c| c.first < first)
    }

    /// Index of the child whose first page equals `page`.
    #[inline]
    fn position(&self, page: &[u32], guard: &Guard) -> Option<usize> {
        let first = page[0];
        let mut i = self.lower_bound(first);
        while i < self.entries.len() && self.entries[i].first == first {
            if page.len() == 1 {
                return Some(i);
            }
            // SAFETY: the table was loaded under `guard` and every node it names was
            // reachable through it then, so the node is valid for the guard (node_ref).
            let n = unsafe { node_ref(self.entries[i].node, guard) }.expect("tables hold no null");
            if n.key().get(..page.len()) == Some(page) {
                return Some(i);
            }
            i += 1;
        }
        None
    }

    /// The only child that can hold `page`, for readers that compare the edge anyway:
    /// when one child alone starts with `page[0]` it is returned without comparing the rest
    /// of the page (saving a cache miss per step); the caller must treat a match shorter
    /// than a page as no match.
    #[inline]
    pub(crate) fn candidate<'g>(&self, page: &[u32], guard: &'g Guard) -> Option<&'g Node> {
        let first = page[0];
        let i = self.lower_bound(first);
        if self.entries.get(i)?.first != first {
            return None;
        }
        let i = if self.entries.get(i + 1).is_none_or(|c| c.first != first) {
            i
        } else {
            self.position(page, guard)?
        };
        // SAFETY: as in `position`.
        unsafe { node_ref(self.entries[i].node, guard) }
    }

    /// The child whose first page equals `page`.
    #[inline]
    pub(crate) fn find<'g>(&self, page: &[u32], guard: &'g Guard) -> Option<&'g Node> {
        let i = self.position(page, guard)?;
        // SAFETY: as in `position`.
        unsafe { node_ref(self.entries[i].node, guard) }
    }

    /// A copy with `node` added (its first page must not be present).
    pub(crate) fn with_added(&self, first: u32, node: *mut Node) -> ChildTable {
        let i = self.entries.partition_point(|c| c.first <= first);
        let mut entries = Vec::with_capacity(self.len() + 1);
        entries.extend_from_slice(&self.entries[..i]);
        entries.push(Child { first, node });
        entries.extend_from_slice(&self.entries[i..]);
        ChildTable { entries: entries.into_boxed_slice() }
    }

    /// A copy with `old` replaced by `new` (same first page).
    pub(crate) fn with_replaced(&self, old: *mut Node, new: *mut Node) -> ChildTable {
        let entries = self
            .entries
            .iter()
            .map(|&c| if c.node == old { Child { first: c.first, node: new } } else { c })
            .collect();
        ChildTable { entries }
    }

    /// The table without `old`, whose first token is `first`: [`Without::Rest`] with a copy
    /// of the other entries, [`Without::Empty`] if `old` was the only one, `None` if `old` is
    /// not in the table. Finds it among the entries for `first` (a binary search, then the
    /// few that share that first token), not by scanning the table.
    pub(crate) fn without(&self, first: u32, old: *mut Node) -> Option<Without> {
        let from = self.lower_bound(first);
        let i = from + self.entries[from..].iter().position(|c| c.node == old)?;
        debug_assert_eq!(self.entries[i].first, first);
        if self.len() == 1 {
            return Some(Without::Empty);
        }
        let mut entries = Vec::with_capacity(self.len() - 1);
        entries.extend_from_slice(&self.entries[..i]);
        entries.extend_from_slice(&self.entries[i + 1..]);
        Some(Without::Rest(ChildTable { entries: entries.into_boxed_slice() }))
    }

    /// Heap bytes of this table.
    pub(crate) fn heap_bytes(&self) -> usize {
        std::mem::size_of::<ChildTable>() + self.len() * std::mem::size_of::<Child>()
    }
}

/// What is left of a table once a child is taken out ([`ChildTable::without`]).
pub(crate) enum Without {
    /// The other children.
    Rest(ChildTable),
    /// None: the table had only that child (an empty table is stored as null).
    Empty,
}
