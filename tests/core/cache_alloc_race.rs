//! Regression test: `alloc` never fails with `OutOfSlots` while free slots, evictable
//! slots and slots that other threads' evictions are handing back to the pool could cover
//! it.
//!
//! Each thread runs request cycles on one small pooled cache: pin the cached prefix of a
//! prompt of exactly `PAGES` pages (`match_and_lock`), allocate slots for the rest, insert
//! the prompt (which adopts or frees every slot it was given), unpin. A thread never pins
//! or holds more than `PAGES` pages at once, and the pool has `threads * PAGES` pages, so
//! in every sequential order of the same calls every allocation succeeds: the other threads
//! pin or hold at most `(threads - 1) * PAGES` pages, and the rest of the pool is free or
//! cached and unpinned. Pages are drawn from a five-page alphabet, so the threads share
//! prefixes now and then while the pool is full all the time: nearly every allocation
//! evicts, several threads evict at once, and a thread often finds the eviction index empty
//! because another has just popped the last leaves and not yet returned their slots to the
//! pool (the race this test was written for). Before the fix every run of either test
//! failed, with about a thousand to tens of thousands of its 600,000 allocations failing
//! (on 2 cores; prompts of every length up to `PAGES`, or twice the threads on twice the
//! pool, leave more slack and failed far less often).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use radixkv::{Cache, CacheOptions, Error, EvictionPolicy, SlotRun};

/// Pages of every prompt: the most one thread pins or holds at once.
const PAGES: usize = 4;

/// Distinct pages a prompt is made of.
const ALPHABET: u64 = 5;

use crate::rng;
use rng::Rng;

/// The first `OutOfSlots` a run saw, and how many there were.
#[derive(Default)]
struct Failures {
    /// `OutOfSlots` errors so far.
    count: AtomicUsize,
    /// The first one's message.
    first: std::sync::Mutex<Option<String>>,
}

impl Failures {
    /// Counts one failure of `what`, keeping the first one's message.
    fn record(&self, what: &str, e: Error) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap();
        first.get_or_insert_with(|| format!("{what}: {e}"));
    }
}

/// One request cycle with slots as a list: pin, `alloc` the rest, insert, unpin.
fn list_cycle(cache: &Cache, prompt: &[u32], failures: &Failures) {
    let mut slots = Vec::new();
    let lock = cache.match_and_lock(0, prompt, &mut slots);
    let m = slots.len();
    assert_eq!(m, lock.len());
    match cache.alloc(prompt.len() - m, &mut slots) {
        Ok(()) => {}
        Err(e @ Error::OutOfSlots { .. }) => return failures.record("alloc", e),
        Err(e) => panic!("alloc: {e}"),
    }
    // Adopts slots[m..] past what is cached by then and frees the rest.
    let existing = cache.insert(0, prompt, &slots).unwrap();
    assert!(existing >= m, "the pinned prefix stays cached");
    drop(lock);
}

/// The same cycle with slots as runs: `match_and_lock_runs`, `alloc_runs`, `insert_runs`.
fn runs_cycle(cache: &Cache, prompt: &[u32], failures: &Failures) {
    let mut runs: Vec<SlotRun> = Vec::new();
    let lock = cache.match_and_lock(0, prompt, &mut runs);
    let m = lock.len();
    match cache.alloc_runs(prompt.len() - m, &mut runs) {
        Ok(()) => {}
        Err(e @ Error::OutOfSlots { .. }) => return failures.record("alloc_runs", e),
        Err(e) => panic!("alloc_runs: {e}"),
    }
    let existing = cache.insert(0, prompt, &runs).unwrap();
    assert!(existing >= m, "the pinned prefix stays cached");
    drop(lock);
}

/// `threads` threads, `cycles` request cycles each, with pages of `page` tokens on a pool
/// of `threads * PAGES` pages: asserts that no allocation failed and that no slot was lost.
fn run(threads: usize, page: usize, cycles: usize, policy: EvictionPolicy) {
    let pool = threads * PAGES * page;
    let opts = CacheOptions { page_size: page, policy, pool_slots: pool, ..Default::default() };
    let cache = Arc::new(Cache::new(opts).unwrap());
    let failures = Arc::new(Failures::default());
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (cache, failures) = (cache.clone(), failures.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x2545_f491));
                let mut prompt = Vec::with_capacity(PAGES * page);
                for c in 0..cycles {
                    prompt.clear();
                    for _ in 0..PAGES {
                        // Page `x` is `page` tokens `x`, so pages repeat across prompts.
                        let x = 1 + rng.below(ALPHABET) as u32;
                        prompt.extend(std::iter::repeat_n(x, page));
                    }
                    if c % 2 == 0 {
                        list_cycle(&cache, &prompt, &failures);
                    } else {
                        runs_cycle(&cache, &prompt, &failures);
                    }
                    if c % 64 == 0 {
                        cache.reclaim();
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let s = cache.stats();
    let census = cache.tree().check_invariants().unwrap();
    assert_eq!(census.cached_tokens, s.tree.cached_tokens);
    assert_eq!(s.tree.protected_tokens, 0);
    assert_eq!(s.free_slots + s.tree.cached_tokens, pool as u64, "slots lost: {s:?}");
    assert!(s.tree.evicted_tokens > 0, "the pool was meant to force eviction");
    let n = failures.count.load(Ordering::Relaxed);
    let first = failures.first.lock().unwrap().take();
    assert_eq!(
        n,
        0,
        "{n} of {} allocations failed although every sequential order succeeds; first: {}",
        threads * cycles,
        first.unwrap_or_default()
    );
    // Nothing is pinned or held: the whole pool can be allocated at once.
    cache.reset(None).unwrap();
    let mut all = Vec::new();
    cache.alloc(pool, &mut all).unwrap();
    all.sort();
    assert_eq!(all, (0..pool as u32).collect::<Vec<_>>());
}

/// Request cycles per thread (fewer in a debug build).
fn cycles() -> usize {
    if cfg!(debug_assertions) { 5_000 } else { 100_000 }
}

/// 6 threads on 24 slots (page size 1), as in the report of the bug.
#[test]
fn alloc_never_fails_while_others_evict() {
    run(6, 1, cycles(), EvictionPolicy::Lru);
}

/// The same under the policies with their own index paths: `mru` (an ordered map re-keyed
/// on every access) and `lfu` (pairs in the lazy queue).
#[test]
fn alloc_never_fails_while_others_evict_mru_and_lfu() {
    run(6, 1, cycles() / 2, EvictionPolicy::Mru);
    run(6, 1, cycles() / 2, EvictionPolicy::Lfu);
}

/// The same with pages of 4 tokens (96 slots): whole pages are allocated and evicted.
#[test]
fn alloc_never_fails_while_others_evict_page_4() {
    run(6, 4, cycles(), EvictionPolicy::Lru);
}
