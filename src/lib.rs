#![doc = include_str!("../README.md")]
#![deny(unsafe_op_in_unsafe_fn, missing_docs, clippy::undocumented_unsafe_blocks)]

pub(crate) mod sync;

pub mod cache;
pub mod error;
pub mod events;
pub mod hybrid;
pub mod kv;
pub mod pool;
pub mod slot_run;
pub mod tier;
pub mod tree;

pub use cache::{
    Cache, CacheOptions, CacheStats, DetachedRequest, EventOptions, FreeFn, FreeRunsFn,
    PrefixMatch, Request,
};
pub use error::{Error, Result, SlotProblem};
pub use slot_run::SlotRun;
pub use tree::{
    DEFAULT_SLRU_THRESHOLD, EvictTarget, EvictionPolicy, Freed, InsertOptions, Key, LockGuard,
    NamespaceStats, PrefixLock, RadixTree, TreeConfig, TreeStats, checked_priority,
};
