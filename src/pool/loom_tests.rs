//! Loom models of the pool's races (every interleaving of two threads). Run with
//! `RUSTFLAGS="--cfg loom" cargo test --lib pool::loom_tests --release` (in a separate
//! target directory, so as not to rebuild everyone else's).

use std::sync::Arc;

use loom::thread;

use super::*;

fn alloc(pool: &SlotPool, n: usize) -> Vec<u32> {
    let mut v = Vec::new();
    assert_eq!(pool.try_alloc(n, &mut v), Ok(true));
    v
}

/// Two frees of the same slots in opposite orders: exactly one wins, whatever the
/// interleaving (the busy state and the ordered second path see to it).
#[test]
fn opposite_frees_have_one_winner() {
    loom::model(|| {
        let pool = Arc::new(SlotPool::with_shards(2, 1, 1).unwrap());
        let v = alloc(&pool, 2);
        let (a, b) = (v[0], v[1]);
        let p2 = pool.clone();
        let t = thread::spawn(move || p2.free(&[b, a]));
        let r1 = pool.free(&[a, b]);
        let r2 = t.join().unwrap();
        assert!(r1.is_ok() != r2.is_ok(), "{r1:?} {r2:?}");
        assert!(matches!(r1.and(r2), Err(Error::DoubleFree { .. })));
        assert_eq!((pool.available(), pool.allocatable()), (2, 2));
    });
}

/// A free and an adopt of the same slots race: one wins and the states show which.
#[test]
fn free_and_adopt_have_one_winner() {
    loom::model(|| {
        let pool = Arc::new(SlotPool::with_shards(2, 1, 1).unwrap());
        let v = alloc(&pool, 2);
        let p2 = pool.clone();
        let w = vec![v[1], v[0]];
        let t = thread::spawn(move || p2.adopt(&w));
        let freed = pool.free(&v);
        let adopted = t.join().unwrap();
        assert!(freed.is_ok() != adopted.is_ok(), "{freed:?} {adopted:?}");
        let want = if freed.is_ok() { SlotState::Free } else { SlotState::Cached };
        assert!(v.iter().all(|&s| pool.state(s) == Some(want)));
    });
}

/// Two halves of one page freed at once: the page goes back to the free list exactly once.
#[test]
fn split_page_returns_once() {
    loom::model(|| {
        let pool = Arc::new(SlotPool::with_shards(2, 2, 2).unwrap());
        let v = alloc(&pool, 2);
        let p2 = pool.clone();
        let second = v[1];
        let t = thread::spawn(move || p2.free(&[second]));
        pool.free(&[v[0]]).unwrap();
        t.join().unwrap().unwrap();
        assert_eq!((pool.available(), pool.allocatable()), (2, 2));
        assert_eq!(alloc(&pool, 2), vec![0, 1]);
        let mut out = Vec::new();
        assert_eq!(pool.try_alloc(2, &mut out), Ok(false));
    });
}

/// An allocation racing a free: a page that stays free is always found (no false failure,
/// even on another shard), a page being freed is found only once it is whole, and no slot
/// ends up with two owners.
#[test]
fn alloc_racing_free() {
    loom::model(|| {
        let pool = Arc::new(SlotPool::with_shards(2, 1, 2).unwrap());
        let held = alloc(&pool, 1);
        let p2 = pool.clone();
        let t = thread::spawn(move || p2.free(&held));
        let mut one = Vec::new();
        assert_eq!(pool.try_alloc(1, &mut one), Ok(true), "a page was free all along");
        t.join().unwrap().unwrap();
        let mut rest = Vec::new();
        assert_eq!(pool.try_alloc(1, &mut rest), Ok(true));
        assert_ne!(one, rest);
        assert_eq!(pool.available(), 0);
    });
}

/// Two allocations race for the last page while a free returns another: the counts stay
/// exact and no page is handed out twice.
#[test]
fn allocs_race_for_pages() {
    loom::model(|| {
        let pool = Arc::new(SlotPool::with_shards(2, 1, 2).unwrap());
        let held = alloc(&pool, 1);
        let p2 = pool.clone();
        let t = thread::spawn(move || {
            let mut v = Vec::new();
            let ok = p2.try_alloc(1, &mut v).unwrap();
            (ok, v)
        });
        pool.free(&held).unwrap();
        let mut mine = Vec::new();
        let ok = pool.try_alloc(1, &mut mine).unwrap();
        let (ok2, theirs) = t.join().unwrap();
        // After the free two pages were free: both allocations succeed, with different pages.
        assert!(ok && ok2);
        assert_ne!(mine, theirs);
        assert_eq!(pool.available(), 0);
    });
}

/// A reader never sees a free half done: once one of its slots reads Free, so do the others.
#[test]
fn state_never_sees_a_half_done_free() {
    loom::model(|| {
        let pool = Arc::new(SlotPool::with_shards(2, 1, 1).unwrap());
        let v = alloc(&pool, 2);
        let (a, b) = (v[0], v[1]);
        let p2 = pool.clone();
        let t = thread::spawn(move || (p2.state(a), p2.state(b)));
        pool.free(&[a, b]).unwrap();
        let seen = t.join().unwrap();
        assert_ne!(seen, (Some(SlotState::Free), Some(SlotState::Held)));
    });
}
