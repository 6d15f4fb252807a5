//! The one place atomics, locks and epoch reclamation come from.
//!
//! Normally this is `std` and `crossbeam-epoch`; under `RUSTFLAGS="--cfg loom"` it is
//! `loom` and crossbeam-epoch built with its loom feature, so every model in
//! `tests/loom.rs` sees each atomic access the tree makes (the pattern of tokio's
//! `src/loom/`). Code outside this module never names `std::sync::atomic` directly.

#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence},
};

// Gives up the rest of the time slice (under loom: lets the model schedule another thread,
// which every spin-wait must do).
#[cfg(not(loom))]
pub(crate) use std::thread::yield_now;

#[cfg(loom)]
pub(crate) use loom::thread::yield_now;

#[cfg(loom)]
#[allow(unused_imports)]
pub(crate) use loom::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence},
};

/// Epoch-based reclamation (crossbeam-epoch).
pub(crate) mod epoch {
    pub(crate) use crossbeam_epoch::{Atomic, Guard, Owned, Shared, unprotected};

    /// Where a tree's guards come from.
    ///
    /// Outside loom every tree uses crossbeam's process-wide default collector, whose
    /// thread-local handle makes pinning a few instructions. Under loom there is no default
    /// collector: each tree owns one, so nothing leaks from one model execution to the next.
    pub(crate) struct Domain {
        #[cfg(loom)]
        collector: crossbeam_epoch::Collector,
    }

    impl Domain {
        /// A domain for one tree.
        pub(crate) fn new() -> Domain {
            Domain {
                #[cfg(loom)]
                collector: crossbeam_epoch::Collector::new(),
            }
        }

        /// Runs the garbage that is safe to free now (a bounded batch: crossbeam collects
        /// up to 8 bags of up to 64 deferred frees per call), after handing this thread's
        /// own pending garbage to the collector.
        pub(crate) fn reclaim(&self) {
            self.pin().flush();
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

/// The clock of access stamps (LRU order and FIFO creation order): each read is later
/// than every earlier read of the same thread (strictly), and than every read of another
/// thread that happens before it as far as a monotonic OS clock orders them (reads more than
/// its resolution apart: 1 ns for Linux's `CLOCK_MONOTONIC`). Reading it writes no shared
/// memory (a vDSO clock read and a thread-local): matches stay read-only for shared state.
///
/// Values are nanoseconds since a process-wide origin, so the stamps of all trees share one
/// scale (the thread-local keeps a thread's stamps strictly increasing across trees too).
/// Under loom it is a logical counter instead (deterministic for a given schedule, which
/// loom needs; not part of any modelled protocol).
pub(crate) mod clock {
    #[cfg(not(loom))]
    thread_local! {
        static LAST: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    /// The current stamp (see the module docs).
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn now() -> u64 {
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let origin = *ORIGIN.get_or_init(std::time::Instant::now);
        // +1: stamp 0 stays older than any access (nodes are built with stamps from here).
        let t = origin.elapsed().as_nanos() as u64 + 1;
        LAST.with(|last| {
            let s = t.max(last.get() + 1);
            last.set(s);
            s
        })
    }

    /// The current stamp (loom: a logical counter).
    #[cfg(loom)]
    pub(crate) fn now() -> u64 {
        static TICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        TICKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}

/// A process-wide unique id (for telling one tree's locks from another's). Not part of any
/// concurrent protocol, so it uses `std` directly even under loom.
pub(crate) fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
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
