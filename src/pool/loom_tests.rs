//! Loom models of the pool's races (every interleaving of two threads). Run with
//! `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2
//! CARGO_TARGET_DIR=target/loom cargo test --release --lib pool::loom_tests` (a separate
//! target directory, so as not to rebuild everyone else's).
//!
//! The protocols modelled: stripe locks taken in ascending order, waiting (two calls whose
//! runs share stripes, one stripe per slot or one for all); slot states in bit-plane words,
//! so that calls under different stripe locks and allocations (no lock) write bits of one
//! word at once; per-page counts under a stripe lock; the reservation counter; a refused call's
//! undo of what its one-pass check-and-change already changed.

use std::sync::Arc;

use loom::thread;

use super::*;

/// A pool of `slots` slots in pages of `p`, `shards` shards, stripes of `stripe` slots.
fn pool(slots: usize, p: usize, shards: usize, stripe: usize) -> Arc<SlotPool> {
    let pool = SlotPool::with_layout(slots, p, shards, stripe).unwrap();
    assert_eq!(pool.stripe_slots, stripe);
    Arc::new(pool)
}

fn alloc(pool: &SlotPool, n: usize) -> Vec<u32> {
    let mut v = Vec::new();
    assert_eq!(pool.try_alloc(n, &mut v), Ok(true));
    v
}

/// Two frees of the same slots in opposite orders: exactly one wins, whatever the
/// interleaving (both lock the stripes in ascending order, whatever the list's order).
#[test]
fn opposite_frees_have_one_winner() {
    for stripe in [1, 2] {
        opposite_frees(stripe);
    }
}

fn opposite_frees(stripe: usize) {
    loom::model(move || {
        let pool = pool(2, 1, 1, stripe);
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

/// A free and an adopt of the same slots race (one stripe per slot): one wins and the
/// states show which.
#[test]
fn free_and_adopt_have_one_winner() {
    loom::model(|| {
        let pool = pool(2, 1, 1, 1);
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

/// A reader never sees a free half done: once one of its slots reads Free, so do the others
/// (the slots on two stripes: the reader locks one at a time).
#[test]
fn state_never_sees_a_half_done_free() {
    loom::model(|| {
        let pool = pool(2, 1, 1, 1);
        let v = alloc(&pool, 2);
        let (a, b) = (v[0], v[1]);
        let p2 = pool.clone();
        let t = thread::spawn(move || (p2.state(a), p2.state(b)));
        pool.free(&[a, b]).unwrap();
        let seen = t.join().unwrap();
        assert_ne!(seen, (Some(SlotState::Free), Some(SlotState::Held)));
    });
}

/// An insert's settle (adopt one slot, free the other) races a free of both, listed the
/// other way round, on two stripes: one wins whole, the other changes nothing.
#[test]
fn settle_and_free_have_one_winner() {
    loom::model(|| {
        let pool = pool(2, 1, 1, 1);
        let v = alloc(&pool, 2);
        let p2 = pool.clone();
        let w = vec![v[1], v[0]];
        let t = thread::spawn(move || p2.free(&w));
        let settled = pool.settle(&v[..1], &v[1..]);
        let freed = t.join().unwrap();
        assert!(settled.is_ok() != freed.is_ok(), "{settled:?} {freed:?}");
        if settled.is_ok() {
            assert_eq!(pool.state(v[0]), Some(SlotState::Cached));
            assert_eq!((pool.available(), pool.allocatable()), (1, 1));
        } else {
            assert_eq!((pool.available(), pool.allocatable()), (2, 2));
        }
        assert_eq!(pool.state(v[1]), Some(SlotState::Free));
    });
}

/// Slots of one plane word, on different stripes, change at once: an adopt of one (clears
/// its Held bit, sets its Cached bit) and a release of another (clears its Cached bit) and
/// an allocation of a third (sets its Held bit, no lock), each a `fetch_and` / `fetch_or` of
/// its own bits: no change is lost.
#[test]
fn one_word_many_writers() {
    loom::model(|| {
        let pool = pool(3, 1, 1, 1);
        let v = alloc(&pool, 2);
        pool.adopt(&v[1..]).unwrap();
        let p2 = pool.clone();
        let held = v[0];
        let t = thread::spawn(move || p2.adopt(&[held]));
        pool.release_cached(&v[1..]).unwrap();
        let mut third = Vec::new();
        // Two free slots (v[1] once released, and the third); either may come first.
        assert_eq!(pool.try_alloc(1, &mut third), Ok(true));
        t.join().unwrap().unwrap();
        assert_eq!(pool.state(v[0]), Some(SlotState::Cached));
        assert_eq!(pool.state(third[0]), Some(SlotState::Held));
        let other = if third[0] == v[1] { 2 } else { v[1] };
        assert_eq!(pool.state(other), Some(SlotState::Free));
        assert_eq!((pool.available(), pool.allocatable()), (1, 1));
    });
}

/// Two pages share one stripe; halves of both are freed at once, after their other halves:
/// the counts, kept under the shared stripe lock, return each page exactly once.
#[test]
fn pages_sharing_a_stripe_return_once() {
    loom::model(|| {
        let pool = pool(4, 2, 1, 4);
        let v = alloc(&pool, 4);
        pool.free(&[v[0], v[3]]).unwrap();
        let p2 = pool.clone();
        let second = v[1];
        let t = thread::spawn(move || p2.free(&[second]));
        pool.free(&[v[2]]).unwrap();
        t.join().unwrap().unwrap();
        assert_eq!((pool.available(), pool.allocatable()), (4, 4));
        let mut all = alloc(&pool, 4);
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2, 3]);
    });
}

/// A refused call changes a slot before it meets the refusing one, then undoes the change
/// before it unlocks: a reader taking the slot's stripe lock never sees the change, and a
/// neighbour's change to another slot of the same state word (another stripe) survives the
/// undo's `fetch_and` / `fetch_or`.
#[test]
fn a_refused_call_undoes_invisibly() {
    loom::model(|| {
        let pool = pool(3, 1, 1, 1);
        let v = alloc(&pool, 3);
        let (a, b, c) = (v[0], v[1], v[2]);
        pool.adopt(&[c]).unwrap();
        let p2 = pool.clone();
        // `a` is Held and changes first; `c` is Cached, so the free is refused and undone.
        let t = thread::spawn(move || p2.free(&[a, c]));
        let seen = pool.state(a);
        pool.adopt(&[b]).unwrap();
        assert!(matches!(t.join().unwrap(), Err(Error::DoubleFree { slot }) if slot == c));
        assert_eq!(seen, Some(SlotState::Held));
        assert_eq!(pool.state(a), Some(SlotState::Held));
        assert_eq!(pool.state(b), Some(SlotState::Cached));
        assert_eq!(pool.state(c), Some(SlotState::Cached));
        assert_eq!((pool.available(), pool.allocatable()), (0, 0));
    });
}
