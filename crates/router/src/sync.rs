//! The one place atomics, locks and epoch reclamation come from (the core's `src/sync.rs`
//! pattern): `std` and `crossbeam-epoch` normally; under `RUSTFLAGS="--cfg loom"`, `loom`
//! and crossbeam-epoch built with its loom feature, so the models in `tests/loom.rs` see
//! every atomic access and lock the index makes. Code outside this module never names
//! `std::sync::atomic` directly.

#[cfg(not(loom))]
pub(crate) use std::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering},
};

#[cfg(loom)]
pub(crate) use loom::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering},
};

/// Epoch-based reclamation (crossbeam-epoch).
pub(crate) mod epoch {
    pub(crate) use crossbeam_epoch::{Atomic, Guard, Owned, Shared};

    /// Where an index's guards come from: crossbeam's process-wide default collector
    /// outside loom (pinning is a few instructions); under loom one collector per index,
    /// so nothing leaks from one model execution into the next.
    pub(crate) struct Domain {
        #[cfg(loom)]
        collector: crossbeam_epoch::Collector,
    }

    impl Domain {
        /// A domain for one index.
        pub(crate) fn new() -> Domain {
            Domain {
                #[cfg(loom)]
                collector: crossbeam_epoch::Collector::new(),
            }
        }

        /// Pins the current thread.
        #[inline]
        pub(crate) fn pin(&self) -> Guard {
            #[cfg(not(loom))]
            {
                crossbeam_epoch::pin()
            }
            #[cfg(loom)]
            {
                self.collector.register().pin()
            }
        }
    }
}

/// Locks a mutex, ignoring poisoning: every critical section of the index leaves its data
/// consistent before anything that can panic.
#[inline]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(not(loom))]
    {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(loom)]
    {
        m.lock().unwrap()
    }
}
