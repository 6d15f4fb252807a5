//! The one place atomics, locks and epoch reclamation come from.
//!
//! Normally this is `std` and `crossbeam-epoch`; under `RUSTFLAGS="--cfg loom"` it is
//! `loom` and crossbeam-epoch built with its loom feature, so every model in
//! `tests/loom.rs` sees each atomic access the tree makes (the pattern of tokio's
//! `src/loom/`). Code outside this module never names `std::sync::atomic` directly.

#[cfg(not(loom))]
pub(crate) use std::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering, fence},
};

#[cfg(loom)]
pub(crate) use loom::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering, fence},
};

/// Epoch-based reclamation (crossbeam-epoch), with one collector per tree.
pub(crate) mod epoch {
    pub(crate) use crossbeam_epoch::{Atomic, Collector, Guard, Owned, Shared};

    /// Pins the current thread in `collector`'s epoch.
    ///
    /// Outside loom every tree uses crossbeam's process-wide default collector (its
    /// thread-local handle makes pinning a few instructions); `_collector` is unused.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn pin(_collector: &Collector) -> Guard {
        crossbeam_epoch::pin()
    }

    /// Pins the current thread in `collector`'s epoch.
    ///
    /// Under loom there is no default collector: each model builds its own tree, and each
    /// tree its own collector, so registrations never leak from one execution to the next.
    #[cfg(loom)]
    #[inline]
    pub(crate) fn pin(collector: &Collector) -> Guard {
        collector.register().pin()
    }

    /// A new collector for one tree (used only under loom; see [`pin`]).
    pub(crate) fn new_collector() -> Collector {
        Collector::new()
    }
}

/// Locks a mutex, ignoring poisoning: every critical section in this crate leaves its data
/// consistent before anything that can panic, so a poisoned lock still guards valid state.
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
