//! The detached prefix locks of a cache, by handle.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use radixkv::PrefixLock;

/// The detached locks of one cache, by handle (sharded, so threads taking and releasing
/// locks rarely meet on one mutex).
pub(crate) struct LockTable {
    shards: Vec<Mutex<HashMap<u64, PrefixLock>>>,
    next: AtomicU64,
}

const SHARDS: u64 = 16;

impl LockTable {
    pub(crate) fn new() -> Self {
        LockTable {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            next: AtomicU64::new(1),
        }
    }

    pub(crate) fn shard(&self, h: u64) -> std::sync::MutexGuard<'_, HashMap<u64, PrefixLock>> {
        self.shards[(h % SHARDS) as usize].lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn insert(&self, l: PrefixLock) -> u64 {
        let h = self.next.fetch_add(1, Ordering::Relaxed);
        self.shard(h).insert(h, l);
        h
    }

    pub(crate) fn remove(&self, h: u64) -> Option<PrefixLock> {
        self.shard(h).remove(&h)
    }

    pub(crate) fn explain(&self, h: u64) -> &'static str {
        if h == 0 {
            "is not a lock (0 is never a handle)"
        } else if h < self.next.load(Ordering::Relaxed) {
            "was released already (a lock is released exactly once)"
        } else {
            "is not a lock of this cache"
        }
    }

    pub(crate) fn drain(&self) -> Vec<PrefixLock> {
        let mut out = Vec::new();
        for s in &self.shards {
            out.extend(s.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, l)| l));
        }
        out
    }
}
