//! Loom model of the cache's allocation wait (`Cache::alloc_with`): an allocation that finds
//! nothing left to evict, because another thread's eviction already took the leaves, waits
//! for that eviction's slots to land in the pool instead of failing. Run with the pool's
//! models: `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2
//! CARGO_TARGET_DIR=target/loom cargo test --release --lib -- cache::loom_tests`.

use loom::sync::Arc;
use loom::thread;

use super::*;

/// A 2-slot pool whose two slots a cached, unpinned leaf holds; one thread evicts it while
/// another allocates both slots. In every interleaving the allocation succeeds: either its
/// own eviction takes the leaf, or it waits for the other thread's to return the slots
/// (`running` / `landed`). Fails if the wait is removed (the allocation's only eviction
/// attempt finds the index empty and it reports `OutOfSlots` although the slots are on
/// their way back).
#[test]
fn alloc_waits_for_a_racing_eviction_to_land() {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b.check(|| {
        let c = Arc::new(Cache::new(CacheOptions { pool_slots: 2, ..Default::default() }).unwrap());
        let mut s = Vec::new();
        c.alloc(2, &mut s).unwrap();
        assert_eq!(c.insert(0, &[1, 2], &s).unwrap(), 0);
        let c2 = c.clone();
        let evictor = thread::spawn(move || c2.evict(2, None).unwrap());
        let mut got = Vec::new();
        c.alloc(2, &mut got).expect("the evicted slots are on their way back to the pool");
        got.sort();
        assert_eq!(got, vec![0, 1]);
        let freed = evictor.join().unwrap();
        assert!(freed == 0 || freed == 2, "freed {freed}");
        assert_eq!(c.stats().free_slots, 0);
        c.free(&got).unwrap();
        assert_eq!(c.stats().free_slots, 2);
    });
}
