//! KV events on a cache: enabling them, naming namespaces, draining, publishing, and the
//! exclusive reset that publishes `AllBlocksCleared`. The hooks are in the tree
//! (`Insert::hang`, `RadixTree::evict_leaf`); see `docs/kv-events.md`.

use std::sync::Arc;

use super::*;
use crate::events::hash::HashMode;
use crate::events::{EventBatch, EventSink, Medium, NamespaceMeta, Pending, SinkOptions};

/// How a cache publishes its KV events ([`Cache::enable_events`]); the block size is the
/// cache's page size.
#[derive(Debug, Clone)]
pub struct EventOptions {
    /// The page hash.
    pub hash_mode: HashMode,
    /// The medium of the cache's pages.
    pub medium: Medium,
    /// The most closed batches the drain queue holds before it drops new ones (counted).
    pub max_drain_batches: usize,
}

impl Default for EventOptions {
    fn default() -> Self {
        let d = SinkOptions::default();
        EventOptions {
            hash_mode: d.hash_mode,
            medium: d.medium,
            max_drain_batches: d.max_drain_batches,
        }
    }
}

impl Cache {
    /// Turns KV events on: from now on every insert that adds pages pushes one
    /// `BlockStored`, every page that leaves (eviction, `drop_namespace`, reset) a
    /// `BlockRemoved`, and [`Cache::clear`] an `AllBlocksCleared` when it empties the
    /// cache. Only on an empty cache, once (`InvalidArgument` otherwise). Returns the sink.
    /// With a host tier, host copies are published too, as `CPU_PINNED` (`BlockStored` when
    /// a copy becomes ready, `BlockRemoved` when host eviction drops it).
    pub fn enable_events(&mut self, opts: EventOptions) -> Result<Arc<EventSink>> {
        let sink = self.tree.enable_events(SinkOptions {
            block_size: self.opts.page_size as u32,
            hash_mode: opts.hash_mode,
            medium: opts.medium,
            max_drain_batches: opts.max_drain_batches,
        })?;
        if let Some(t) = &self.tier {
            t.set_events(sink.clone());
        }
        Ok(sink)
    }

    /// The event sink, when events are on.
    pub fn events(&self) -> Option<&Arc<EventSink>> {
        self.tree.events()
    }

    fn sink(&self) -> Result<&Arc<EventSink>> {
        self.events().ok_or_else(|| invalid("events are not enabled on this cache"))
    }

    /// Names namespace `ns` on the wire (LoRA name, cache salt), before its first insert
    /// ([`EventSink::set_namespace`]). `InvalidArgument` with events off.
    pub fn set_namespace_meta(&self, ns: u64, meta: NamespaceMeta) -> Result<()> {
        self.sink()?.set_namespace(ns, meta)
    }

    /// Closes the events pushed so far into one batch; its sequence number, or `None` if
    /// there were none (or events are off).
    pub fn flush_events(&self) -> Option<u64> {
        self.events().and_then(|s| s.flush())
    }

    /// The closed batches, in sequence order (empty with events off, or while a publisher
    /// is attached).
    pub fn drain_events(&self) -> Vec<(u64, EventBatch)> {
        self.events().map(|s| s.drain()).unwrap_or_default()
    }

    /// The cache's event sink, to attach a publisher to (`radixkv_publisher::Publisher::
    /// start(cache.event_sink()?, ...)`). `InvalidArgument` with events off.
    pub fn event_sink(&self) -> Result<&std::sync::Arc<crate::events::EventSink>> {
        self.sink()
    }

    /// [`Cache::reset`] holding the cache exclusively: with events on, it pushes one
    /// `AllBlocksCleared` when it leaves the cache empty (nothing was pinned), and the
    /// removals of the pages it dropped otherwise. Right because `&mut self` keeps every
    /// insert out between the last removal and the push (`docs/kv-events.md`, "Reset").
    pub fn clear(&mut self, free: Option<FreeFn<'_>>) -> Result<()> {
        let Some(sink) = self.tree.take_events() else {
            return self.reset(free);
        };
        // The pages by id (the nodes keep their ids; the hashes are the sink's, resolved
        // off this thread: `crate::events::resolve`).
        let before = self.tree.cached_page_ids();
        let r = self.reset(free);
        let after = self.tree.cached_page_ids();
        if after.is_empty() {
            if !before.is_empty() {
                // The tree is empty: the sink's resolver forgets every page with it.
                sink.push_pending(Pending::Cleared);
            }
        } else {
            let gone = sorted_difference(&before, &after);
            if !gone.is_empty() {
                sink.push_pending(Pending::RemovedIds(gone));
            }
        }
        self.tree.restore_events(Some(sink));
        r
    }
}

/// The multiset `a - b` of two sorted lists (`b` is a sub-multiset of `a`).
fn sorted_difference(a: &[u64], b: &[u64]) -> Vec<u64> {
    let (mut out, mut j) = (Vec::new(), 0);
    for &x in a {
        if j < b.len() && b[j] == x {
            j += 1;
        } else {
            out.push(x);
        }
    }
    out
}
