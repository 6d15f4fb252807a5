//! The cache: the tree plus an optional built-in slot pool (STUB: API only).

use crate::error::{Error, Result};
use crate::tree::{EvictionPolicy, LockGuard, PrefixLock, RadixTree, TreeConfig, TreeStats};

/// Options of a new cache (mirrors `rkv_options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheOptions {
    /// Page size `P >= 1`.
    pub page_size: usize,
    /// Eviction order.
    pub policy: EvictionPolicy,
    /// 0: the caller manages slots; N: a built-in pool of N slots (a multiple of `page_size`).
    pub pool_slots: usize,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions { page_size: 1, policy: EvictionPolicy::Lru, pool_slots: 0 }
    }
}

/// Tree stats plus pool figures (mirrors `rkv_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// The tree's counts and counters.
    pub tree: TreeStats,
    /// Pool size (0 without a pool).
    pub pool_slots: u64,
    /// Free slots in the pool (0 without a pool).
    pub free_slots: u64,
}

/// A radix prefix cache, optionally owning its slots.
pub struct Cache {
    tree: RadixTree,
    opts: CacheOptions,
}

impl Cache {
    /// A new cache.
    pub fn new(opts: CacheOptions) -> Result<Self> {
        let tree = RadixTree::new(TreeConfig { page_size: opts.page_size, policy: opts.policy })?;
        Ok(Cache { tree, opts })
    }
    /// The tree.
    pub fn tree(&self) -> &RadixTree {
        &self.tree
    }
    /// Options it was built with.
    pub fn options(&self) -> CacheOptions {
        self.opts
    }
    /// Page size.
    pub fn page_size(&self) -> usize {
        self.opts.page_size
    }
    /// Whether it owns a pool.
    pub fn has_pool(&self) -> bool {
        self.opts.pool_slots > 0
    }
    /// See [`RadixTree::match_prefix`].
    pub fn match_prefix(&self, ns: u64, tokens: &[u32], out: &mut Vec<u32>) -> usize {
        self.tree.match_prefix(ns, tokens, out)
    }
    /// See [`RadixTree::match_and_lock`].
    pub fn match_and_lock(&self, ns: u64, tokens: &[u32], out: &mut Vec<u32>) -> LockGuard<'_> {
        self.tree.match_and_lock(ns, tokens, out)
    }
    /// Insert; in pool mode frees the slots it did not adopt.
    pub fn insert(&self, _ns: u64, _tokens: &[u32], _slots: &[u32]) -> Result<usize> {
        todo!()
    }
    /// Insert and pin.
    pub fn insert_and_lock(&self, _ns: u64, _tokens: &[u32], _slots: &[u32]) -> Result<(usize, LockGuard<'_>)> {
        todo!()
    }
    /// Unpin a detached lock.
    pub fn release(&self, lock: PrefixLock) -> Result<()> {
        self.tree.release(lock)
    }
    /// Evict at least `k` tokens. `free` gets every freed slot once; it is required without
    /// a pool (else `InvalidArgument`); with a pool the slots also go back to the pool.
    pub fn evict(&self, _k: usize, _free: Option<&mut dyn FnMut(&[u32])>) -> Result<usize> {
        todo!()
    }
    /// Allocate `n` slots (pool mode), appended to `out`; all or nothing.
    pub fn alloc(&self, _n: usize, _out: &mut Vec<u32>) -> Result<()> {
        Err(Error::NoPool)
    }
    /// Return allocated, never adopted slots to the pool.
    pub fn free(&self, _slots: &[u32]) -> Result<()> {
        Err(Error::NoPool)
    }
    /// Stats.
    pub fn stats(&self) -> CacheStats {
        todo!()
    }
    /// Drop every unpinned page (`free` as in [`Cache::evict`]).
    pub fn reset(&self, _free: Option<&mut dyn FnMut(&[u32])>) -> Result<()> {
        todo!()
    }
}
