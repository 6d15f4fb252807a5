//! Striped match counters: each thread bumps its own cache line, `stats()` sums them, so
//! no shared word is written by every match.

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, Ordering};

/// Number of stripes (a power of two; one under loom, where the models are tiny).
#[cfg(not(loom))]
const STRIPES: usize = 32;
#[cfg(loom)]
const STRIPES: usize = 1;

/// One stripe: match calls, queried tokens, hit tokens.
struct Stripe {
    calls: AtomicU64,
    query: AtomicU64,
    hit: AtomicU64,
}

/// See the module docs.
pub(crate) struct MatchCounters {
    stripes: Box<[CachePadded<Stripe>]>,
}

#[cfg(not(loom))]
fn stripe_index() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
    // Not a protocol atomic (only hands out stripe numbers), so it does not go through the
    // loom shim.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|c| {
        let mut i = c.get();
        if i == usize::MAX {
            // Relaxed: only spreads threads over stripes.
            i = NEXT.fetch_add(1, StdOrdering::Relaxed) % STRIPES;
            c.set(i);
        }
        i
    })
}

#[cfg(loom)]
fn stripe_index() -> usize {
    0
}

impl MatchCounters {
    pub(crate) fn new() -> Self {
        MatchCounters {
            stripes: (0..STRIPES)
                .map(|_| {
                    CachePadded::new(Stripe {
                        calls: AtomicU64::new(0),
                        query: AtomicU64::new(0),
                        hit: AtomicU64::new(0),
                    })
                })
                .collect(),
        }
    }

    /// Records one match of `query` tokens that hit `hit`.
    #[inline]
    pub(crate) fn record(&self, query: usize, hit: usize) {
        let s = &self.stripes[stripe_index()];
        // Relaxed: statistics, exact at quiescence.
        s.calls.fetch_add(1, Ordering::Relaxed);
        s.query.fetch_add(query as u64, Ordering::Relaxed);
        s.hit.fetch_add(hit as u64, Ordering::Relaxed);
    }

    /// `(calls, queried tokens, hit tokens)` summed over the stripes.
    pub(crate) fn sum(&self) -> (u64, u64, u64) {
        let mut t = (0, 0, 0);
        for s in self.stripes.iter() {
            // Relaxed: statistics.
            t.0 += s.calls.load(Ordering::Relaxed);
            t.1 += s.query.load(Ordering::Relaxed);
            t.2 += s.hit.load(Ordering::Relaxed);
        }
        t
    }
}
