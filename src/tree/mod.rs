//! The concurrent radix tree (STUB: API only; being implemented).

use crate::error::{Error, Result};

/// How eviction orders evictable leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvictionPolicy {
    /// Least recently accessed leaf first (`RKV_EVICT_LRU = 0`).
    #[default]
    Lru,
    /// Oldest inserted leaf first, ignoring later accesses (`RKV_EVICT_FIFO = 1`).
    Fifo,
}

/// Settings fixed for a tree's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeConfig {
    /// Page size `P >= 1`.
    pub page_size: usize,
    /// Eviction order.
    pub policy: EvictionPolicy,
}

impl Default for TreeConfig {
    fn default() -> Self {
        TreeConfig { page_size: 1, policy: EvictionPolicy::Lru }
    }
}

/// Counts and counters of a tree.
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
    /// match / match_and_lock calls.
    pub match_calls: u64,
    /// Tokens asked for by those calls.
    pub match_query_tokens: u64,
    /// Tokens they found.
    pub match_hit_tokens: u64,
    /// Tokens newly cached by inserts.
    pub inserted_tokens: u64,
    /// Tokens removed by eviction.
    pub evicted_tokens: u64,
}

/// A pin on a matched prefix, detached from any borrow. Must be handed back to
/// [`RadixTree::release`].
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
}

/// RAII pin: releases on drop.
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
    /// Detaches the pin from the guard; it must then be released by hand.
    pub fn into_raw(mut self) -> PrefixLock {
        self.lock.take().expect("guard holds a lock")
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if let Some(l) = self.lock.take() {
            let _ = self.tree.release(l);
        }
    }
}

/// The concurrent radix tree.
pub struct RadixTree {
    cfg: TreeConfig,
}

impl RadixTree {
    /// A new, empty tree.
    pub fn new(cfg: TreeConfig) -> Result<Self> {
        if cfg.page_size == 0 {
            return Err(Error::InvalidArgument("page_size must be >= 1".into()));
        }
        Ok(RadixTree { cfg })
    }
    /// Page size.
    pub fn page_size(&self) -> usize {
        self.cfg.page_size
    }
    /// Longest cached prefix: clears `out`, writes its slots, returns its length.
    pub fn match_prefix(&self, _ns: u64, _tokens: &[u32], _out: &mut Vec<u32>) -> usize {
        todo!()
    }
    /// Match and pin atomically.
    pub fn match_and_lock(&self, _ns: u64, _tokens: &[u32], _out: &mut Vec<u32>) -> LockGuard<'_> {
        todo!()
    }
    /// Insert; returns the count of leading tokens already cached.
    pub fn insert(&self, _ns: u64, _tokens: &[u32], _slots: &[u32]) -> Result<usize> {
        todo!()
    }
    /// Insert and pin atomically.
    pub fn insert_and_lock(&self, _ns: u64, _tokens: &[u32], _slots: &[u32]) -> Result<(usize, LockGuard<'_>)> {
        todo!()
    }
    /// Unpin.
    pub fn release(&self, _lock: PrefixLock) -> Result<()> {
        todo!()
    }
    /// Evict at least `k` tokens; returns tokens freed.
    pub fn evict(&self, _k: usize, _free: &mut dyn FnMut(&[u32])) -> usize {
        todo!()
    }
    /// Stats.
    pub fn stats(&self) -> TreeStats {
        todo!()
    }
    /// Drop every unpinned page.
    pub fn reset(&self, _free: &mut dyn FnMut(&[u32])) -> usize {
        todo!()
    }
}
