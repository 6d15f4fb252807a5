//! The KV-event hooks' state on the tree: the sink (`RadixTree::events`) and the page ids
//! kept on each node (`Node::page_id`; the hashes are computed off the inserting thread,
//! see `crate::events::resolve`). Where the hooks push, and why that order is right, is
//! written next to the pushes (`Insert::hang`, `RadixTree::evict_leaf`) and in
//! `docs/kv-events.md` ("Sequencing with the tree").

use std::sync::Arc;

use super::node::NO_PAGE_ID;
use super::*;
use crate::events::{EventSink, SinkOptions};

impl RadixTree {
    /// Turns KV events on, with this sink (its `block_size` must be the page size). Only on
    /// an empty tree (`InvalidArgument` otherwise, or when events are on already): every
    /// node of a tree with events on carries its page ids.
    pub fn enable_events(&mut self, opts: SinkOptions) -> Result<Arc<EventSink>> {
        if opts.block_size as usize != self.cfg.page_size {
            return Err(invalid(format!(
                "events: block_size {} must equal the page size {}",
                opts.block_size, self.cfg.page_size
            )));
        }
        if self.events.is_some() {
            return Err(invalid("events: already enabled on this tree"));
        }
        // Relaxed: `&mut self`, nothing races.
        if self.nodes.load(Ordering::Relaxed) != 0 || self.namespaces.load(Ordering::Relaxed) != 0 {
            return Err(invalid("events: enable them on an empty tree"));
        }
        let sink = Arc::new(EventSink::new(opts)?);
        self.events = Some(sink.clone());
        Ok(sink)
    }

    /// The event sink, when events are on.
    pub fn events(&self) -> Option<&Arc<EventSink>> {
        self.events.as_ref()
    }

    /// The published hashes of every cached page, sorted (for tests, at quiescence: what
    /// a consumer of the event stream should hold). Empty with events off. Resolves the
    /// sink's pending events (hashes them) on the calling thread.
    pub fn cached_page_hashes(&self) -> Vec<u64> {
        let Some(sink) = &self.events else { return Vec::new() };
        let mut out = sink.hashes_of(self.cached_page_ids());
        out.sort_unstable();
        out
    }

    /// The page ids of every cached page, sorted (`Node::page_id`; empty with events off
    /// or, once `take_events` took the sink out, still those the nodes carry).
    pub(crate) fn cached_page_ids(&self) -> Vec<u64> {
        let g = self.domain.pin();
        let p = self.cfg.page_size;
        let mut out = Vec::new();
        let mut roots = Vec::new();
        self.roots.for_each(&g, &mut |r| roots.push(r));
        for r in roots {
            // SAFETY: a root read from the map under `g` (see the `namespace` module).
            let root = unsafe { r.as_ref() }.map(|r| &r.node).expect("the map holds no null");
            let mut stack = vec![root];
            while let Some(n) = stack.pop() {
                if n.page_id != NO_PAGE_ID {
                    out.extend(n.page_id..n.page_id + (n.len() / p) as u64);
                }
                let Some(t) = n.table(&g) else { continue };
                for c in t.nodes() {
                    // SAFETY: read from a table loaded under `g` (node_ref).
                    stack.push(unsafe { node_ref(c, &g) }.expect("tables hold no null"));
                }
            }
        }
        out.sort_unstable();
        out
    }
}

impl RadixTree {
    /// Takes the sink out (events off until [`RadixTree::restore_events`]); for a caller
    /// holding the tree exclusively that publishes a step's events itself.
    pub(crate) fn take_events(&mut self) -> Option<Arc<EventSink>> {
        self.events.take()
    }

    /// Puts back the sink [`RadixTree::take_events`] took.
    pub(crate) fn restore_events(&mut self, sink: Option<Arc<EventSink>>) {
        self.events = sink;
    }
}
