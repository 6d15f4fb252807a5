//! The KV-event hooks' state on the tree: the sink (`RadixTree::events`) and the page
//! hashes kept on each node ([`PageHashes`]). Where the hooks push, and why that order is
//! right, is written next to the pushes (`Insert::hang`, `RadixTree::evict_leaf`) and in
//! `docs/kv-events.md` ("Sequencing with the tree").

use std::sync::Arc;

use super::*;
use crate::events::hash::ChainState;
use crate::events::{EventSink, SinkOptions};

/// The page hashes of one edge, computed once when its leaf was built (a split's halves
/// take their share), so neither a child's insert nor a removal rehashes. Only nodes of a
/// tree with events on have one (`Node::ev` is `None` otherwise: 8 bytes per node).
#[derive(Debug)]
pub(crate) struct PageHashes {
    /// The published hash of each page.
    pub(crate) hashes: Box<[u64]>,
    /// The SGLang chain digest of each page; empty in the XXH3 mode, where a page's chain
    /// state is its published hash.
    digests: Box<[[u8; 32]]>,
}

impl PageHashes {
    /// From the hasher's chain states and hashes (one per page).
    pub(crate) fn new(states: &[ChainState], hashes: Vec<u64>) -> PageHashes {
        let digests = states
            .iter()
            .filter_map(|s| match s {
                ChainState::Sha256(d) => Some(*d),
                ChainState::Xxh3(_) => None,
            })
            .collect();
        PageHashes { hashes: hashes.into_boxed_slice(), digests }
    }

    /// The chain state of the edge's last page (what a child continues from).
    pub(crate) fn last_state(&self) -> Option<ChainState> {
        match self.digests.last() {
            Some(d) => Some(ChainState::Sha256(*d)),
            None => self.hashes.last().map(|h| ChainState::Xxh3(*h)),
        }
    }

    /// The share of pages `from..to` (a split's half).
    pub(crate) fn part(&self, from: usize, to: usize) -> PageHashes {
        PageHashes {
            hashes: self.hashes[from..to].into(),
            digests: if self.digests.is_empty() {
                Box::new([])
            } else {
                self.digests[from..to].into()
            },
        }
    }

    /// Heap bytes.
    pub(crate) fn heap_bytes(&self) -> usize {
        std::mem::size_of::<PageHashes>()
            + self.hashes.len() * std::mem::size_of::<u64>()
            + self.digests.len() * 32
    }
}

impl RadixTree {
    /// Turns KV events on, with this sink (its `block_size` must be the page size). Only on
    /// an empty tree (`InvalidArgument` otherwise, or when events are on already): every
    /// node of a tree with events on carries its page hashes.
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
    /// a consumer of the event stream should hold). Empty with events off.
    pub fn cached_page_hashes(&self) -> Vec<u64> {
        let g = self.domain.pin();
        let mut out = Vec::new();
        let mut roots = Vec::new();
        self.roots.for_each(&g, &mut |r| roots.push(r));
        for r in roots {
            // SAFETY: a root read from the map under `g` (see the `namespace` module).
            let root = unsafe { r.as_ref() }.map(|r| &r.node).expect("the map holds no null");
            let mut stack = vec![root];
            while let Some(n) = stack.pop() {
                if let Some(ev) = &n.ev {
                    out.extend_from_slice(&ev.hashes);
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
