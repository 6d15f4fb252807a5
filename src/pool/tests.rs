use std::collections::HashSet;

use super::*;

fn is_invalid<T: fmt::Debug>(r: Result<T>) -> bool {
    matches!(r, Err(Error::InvalidArgument(_)))
}

/// Every slot's state, in order.
fn snapshot(pool: &SlotPool) -> Vec<SlotState> {
    (0..pool.capacity() as u32).map(|s| pool.state(s).unwrap()).collect()
}

/// Allocates `n` slots, which must succeed.
fn alloc(pool: &SlotPool, n: usize) -> Vec<u32> {
    let mut v = Vec::new();
    assert_eq!(pool.try_alloc(n, &mut v), Ok(true));
    assert_eq!(v.len(), n);
    v
}

/// Whole pages, each P consecutive slots from a multiple of P, no slot twice.
fn assert_whole_pages(slots: &[u32], p: usize) {
    assert_eq!(slots.len() % p, 0);
    for page in slots.chunks(p) {
        assert_eq!(page[0] as usize % p, 0, "page {page:?} not aligned");
        for (i, &s) in page.iter().enumerate() {
            assert_eq!(s, page[0] + i as u32, "page {page:?} not consecutive");
        }
    }
    let set: HashSet<u32> = slots.iter().copied().collect();
    assert_eq!(set.len(), slots.len(), "a slot handed out twice");
}

#[test]
fn new_rejects_bad_sizes() {
    assert!(is_invalid(SlotPool::new(16, 0)));
    assert!(is_invalid(SlotPool::new(0, 1)));
    assert!(is_invalid(SlotPool::new(0, 16)));
    assert!(is_invalid(SlotPool::new(17, 16)));
    assert!(is_invalid(SlotPool::new(8, 16)));
    // Checked before any memory is taken.
    assert!(is_invalid(SlotPool::new(u32::MAX as usize + 2, 1)));
    assert!(is_invalid(SlotPool::new((u32::MAX as usize + 1) * 2, 2)));
}

#[test]
fn new_pool_is_all_free() {
    for p in [1, 16] {
        let pool = SlotPool::new(64, p).unwrap();
        assert_eq!(pool.capacity(), 64);
        assert_eq!(pool.page_size(), p);
        assert_eq!(pool.available(), 64);
        assert_eq!(pool.allocatable(), 64);
        assert!(pool.num_shards() >= 4 && pool.num_shards().is_power_of_two());
        assert!(snapshot(&pool).iter().all(|&s| s == SlotState::Free));
        assert_eq!(pool.state(64), None);
        assert_eq!(pool.state(u32::MAX), None);
    }
    let one = SlotPool::new(1, 1).unwrap();
    assert_eq!(alloc(&one, 1), vec![0]);
    assert_eq!(SlotPool::with_shards(8, 1, 3).unwrap().num_shards(), 4);
    assert_eq!(SlotPool::with_shards(8, 1, 0).unwrap().num_shards(), 1);
}

#[test]
fn slot_state_values_are_documented_ones() {
    assert_eq!(SlotState::Free as u8, 0);
    assert_eq!(SlotState::Held as u8, 1);
    assert_eq!(SlotState::Cached as u8, 2);
}

#[test]
fn alloc_hands_out_whole_held_pages() {
    for p in [1, 16] {
        let pool = SlotPool::new(16 * 8, p).unwrap();
        let mut out = vec![999];
        assert_eq!(pool.try_alloc(3 * p, &mut out), Ok(true));
        assert_eq!(out[0], 999, "existing content kept");
        let got = &out[1..];
        assert_eq!(got.len(), 3 * p);
        assert_whole_pages(got, p);
        for &s in got {
            assert_eq!(pool.state(s), Some(SlotState::Held));
        }
        assert_eq!(pool.available(), 128 - 3 * p);
        assert_eq!(pool.allocatable(), 128 - 3 * p);
    }
}

#[test]
fn alloc_zero_and_unaligned() {
    let pool = SlotPool::new(64, 16).unwrap();
    let mut out = vec![7];
    assert_eq!(pool.try_alloc(0, &mut out), Ok(true));
    assert_eq!(out, vec![7]);
    for n in [1, 15, 17, 33] {
        assert!(is_invalid(pool.try_alloc(n, &mut out)));
        assert_eq!(out, vec![7]);
    }
    assert_eq!(pool.available(), 64);
}

#[test]
fn alloc_exhaustion_changes_nothing() {
    for p in [1, 16] {
        let pool = SlotPool::new(4 * p, p).unwrap();
        let held = alloc(&pool, 3 * p);
        let before = snapshot(&pool);
        let mut out = vec![5];
        assert_eq!(pool.try_alloc(2 * p, &mut out), Ok(false));
        assert_eq!(pool.try_alloc(5 * p, &mut out), Ok(false), "more than capacity");
        assert_eq!(out, vec![5]);
        assert_eq!(snapshot(&pool), before);
        assert_eq!(pool.available(), p);
        // The last page is still there, and then nothing.
        let last = alloc(&pool, p);
        assert_whole_pages(&[held.clone(), last.clone()].concat(), p);
        assert_eq!(pool.try_alloc(p, &mut out), Ok(false));
        assert_eq!(pool.available(), 0);
        pool.free(&held).unwrap();
        pool.free(&last).unwrap();
        assert_eq!(pool.available(), 4 * p);
        let all = alloc(&pool, 4 * p);
        assert_whole_pages(&all, p);
    }
}

#[test]
fn alloc_steals_from_every_shard() {
    // One thread, many shards: taking the whole pool must visit them all.
    let pool = SlotPool::with_shards(64 * 4, 4, 16).unwrap();
    let all = alloc(&pool, 256);
    assert_whole_pages(&all, 4);
    let mut out = Vec::new();
    assert_eq!(pool.try_alloc(4, &mut out), Ok(false));
    // Freed pages all land on this thread's home shard; they come back all the same.
    pool.free(&all).unwrap();
    assert_eq!(pool.available(), 256);
    let again = alloc(&pool, 256);
    assert_whole_pages(&again, 4);
}

#[test]
fn free_returns_slots() {
    for p in [1, 16] {
        let pool = SlotPool::new(8 * p, p).unwrap();
        let a = alloc(&pool, 2 * p);
        pool.free(&a).unwrap();
        assert!(a.iter().all(|&s| pool.state(s) == Some(SlotState::Free)));
        assert_eq!(pool.available(), 8 * p);
        assert_eq!(pool.allocatable(), 8 * p);
        pool.free(&[]).unwrap();
    }
}

#[test]
fn free_refusals_change_nothing() {
    for p in [1, 16] {
        let pool = SlotPool::new(8 * p, p).unwrap();
        let held = alloc(&pool, 2 * p);
        let cached = alloc(&pool, p);
        pool.adopt(&cached).unwrap();
        let free_slot =
            (0..pool.capacity() as u32).find(|&s| pool.state(s) == Some(SlotState::Free)).unwrap();
        let before = snapshot(&pool);
        let (avail, alloc_before) = (pool.available(), pool.allocatable());
        let h = held[1];

        // Out of range, even after valid slots.
        let r = pool.free(&[held[0], pool.capacity() as u32]);
        assert!(is_invalid(r));
        assert!(is_invalid(pool.free(&[u32::MAX])));
        // A free slot (double free).
        assert_eq!(pool.free(&[held[0], free_slot]), Err(Error::DoubleFree { slot: free_slot }));
        // A cached slot.
        assert_eq!(pool.free(&[h, cached[0]]), Err(Error::DoubleFree { slot: cached[0] }));
        // The same slot twice in one call.
        assert_eq!(pool.free(&[h, held[0], h]), Err(Error::DoubleFree { slot: h }));
        assert_eq!(pool.free(&[h, h]), Err(Error::DoubleFree { slot: h }));
        // A whole page plus one of its slots again.
        let page: Vec<u32> = held[..p].iter().copied().chain([held[0]]).collect();
        assert_eq!(pool.free(&page), Err(Error::DoubleFree { slot: held[0] }));

        assert_eq!(snapshot(&pool), before);
        assert_eq!((pool.available(), pool.allocatable()), (avail, alloc_before));

        // After a real free, freeing again is a double free.
        pool.free(&held).unwrap();
        assert_eq!(pool.free(&held[..1]), Err(Error::DoubleFree { slot: held[0] }));
    }
}

#[test]
fn partly_freed_page_returns_when_whole() {
    let p = 16;
    let pool = SlotPool::new(2 * p, p).unwrap();
    let page = alloc(&pool, p);
    let other = alloc(&pool, p);
    let mut out = Vec::new();
    // Free the page in three calls, out of order.
    let (a, b) = page.split_at(5);
    let mut b = b.to_vec();
    b.reverse();
    pool.free(a).unwrap();
    assert_eq!(pool.available(), 5, "loose free slots count as free");
    assert_eq!(pool.allocatable(), 0, "but cannot be allocated");
    assert_eq!(pool.try_alloc(p, &mut out), Ok(false));
    pool.free(&b[..10]).unwrap();
    assert_eq!((pool.available(), pool.allocatable()), (15, 0));
    pool.free(&b[10..]).unwrap();
    assert_eq!((pool.available(), pool.allocatable()), (p, p));
    // It comes back whole, and its counter starts again from zero.
    assert_eq!(alloc(&pool, p), page);
    pool.free(&page[..1]).unwrap();
    assert_eq!((pool.available(), pool.allocatable()), (1, 0));
    // A call mixing a whole page and loose slots.
    let mixed: Vec<u32> = other.iter().chain(&page[1..]).copied().collect();
    pool.free(&mixed).unwrap();
    assert_eq!((pool.available(), pool.allocatable()), (2 * p, 2 * p));
    assert_whole_pages(&alloc(&pool, 2 * p), p);
}

#[test]
fn partly_cached_page_returns_when_whole() {
    let p = 4;
    let pool = SlotPool::new(p, p).unwrap();
    let page = alloc(&pool, p);
    pool.adopt(&page[..2]).unwrap();
    pool.free(&page[2..]).unwrap();
    assert_eq!((pool.available(), pool.allocatable()), (2, 0));
    pool.release_cached(&page[..2]).unwrap();
    assert_eq!((pool.available(), pool.allocatable()), (p, p));
    assert_eq!(alloc(&pool, p), page);
}

#[test]
fn adopt_and_release_cached() {
    for p in [1, 16] {
        let pool = SlotPool::new(4 * p, p).unwrap();
        let a = alloc(&pool, 2 * p);
        pool.adopt(&a).unwrap();
        assert!(a.iter().all(|&s| pool.state(s) == Some(SlotState::Cached)));
        assert_eq!(pool.available(), 2 * p);
        pool.release_cached(&a).unwrap();
        assert!(a.iter().all(|&s| pool.state(s) == Some(SlotState::Free)));
        assert_eq!(pool.available(), 4 * p);
        assert_whole_pages(&alloc(&pool, 4 * p), p);
        pool.adopt(&[]).unwrap();
        pool.release_cached(&[]).unwrap();
    }
}

#[test]
fn adopt_refusals_change_nothing() {
    let p = 16;
    let pool = SlotPool::new(8 * p, p).unwrap();
    let held = alloc(&pool, p);
    let cached = alloc(&pool, p);
    pool.adopt(&cached).unwrap();
    let free_slot =
        (0..pool.capacity() as u32).find(|&s| pool.state(s) == Some(SlotState::Free)).unwrap();
    let before = snapshot(&pool);
    assert!(is_invalid(pool.adopt(&[held[0], free_slot])), "adopt of Free");
    assert!(is_invalid(pool.adopt(&[held[0], cached[3]])), "adopt of Cached");
    assert!(is_invalid(pool.adopt(&[held[0], 8 * p as u32])), "out of range");
    assert!(is_invalid(pool.adopt(&[held[0], held[1], held[0]])), "listed twice");
    assert_eq!(snapshot(&pool), before);
    assert_eq!(pool.available(), 6 * p);
}

#[test]
fn release_cached_refusals_change_nothing() {
    let p = 16;
    let pool = SlotPool::new(8 * p, p).unwrap();
    let held = alloc(&pool, p);
    let cached = alloc(&pool, p);
    pool.adopt(&cached).unwrap();
    let free_slot =
        (0..pool.capacity() as u32).find(|&s| pool.state(s) == Some(SlotState::Free)).unwrap();
    let before = snapshot(&pool);
    assert!(is_invalid(pool.release_cached(&[cached[0], held[0]])), "release of Held");
    assert!(is_invalid(pool.release_cached(&[cached[0], free_slot])), "release of Free");
    assert!(is_invalid(pool.release_cached(&[cached[0], u32::MAX])), "out of range");
    assert!(is_invalid(pool.release_cached(&[cached[2], cached[2]])), "listed twice");
    assert_eq!(snapshot(&pool), before);
    assert_eq!((pool.available(), pool.allocatable()), (6 * p, 6 * p));
}

#[test]
fn check_held_validates_without_changing() {
    let p = 16;
    let pool = SlotPool::new(8 * p, p).unwrap();
    let held = alloc(&pool, 2 * p);
    let cached = alloc(&pool, p);
    pool.adopt(&cached).unwrap();
    let free_slot =
        (0..pool.capacity() as u32).find(|&s| pool.state(s) == Some(SlotState::Free)).unwrap();
    let before = snapshot(&pool);
    pool.check_held(&held).unwrap();
    pool.check_held(&[]).unwrap();
    assert!(is_invalid(pool.check_held(&[held[0], free_slot])));
    assert!(is_invalid(pool.check_held(&[held[0], cached[0]])));
    assert!(is_invalid(pool.check_held(&[held[0], 8 * p as u32])));
    assert!(is_invalid(pool.check_held(&[held[0], held[1], held[0]])), "short list twice");
    let mut long = held.clone();
    long.push(held[20]);
    assert!(is_invalid(pool.check_held(&long)), "long list twice");
    assert_eq!(snapshot(&pool), before);
}

#[test]
fn whole_pages_are_recognised() {
    assert!(is_whole_page(&[4, 5, 6, 7]));
    assert!(is_whole_page(&[0]));
    assert!(is_whole_page(&[9]));
    assert!(!is_whole_page(&[5, 6, 7, 8]), "not aligned");
    assert!(!is_whole_page(&[4, 5, 7, 6]), "out of order");
    assert!(!is_whole_page(&[4, 4, 4, 4]));
}

/// Slots listed in any order, pages split over calls and mixed with whole pages, take the
/// second (sorted) way; it must keep the counts exact.
#[test]
fn sorted_way_keeps_counts() {
    let p = 4;
    let pool = SlotPool::new(4 * p, p).unwrap();
    let v = alloc(&pool, 4 * p);
    // Page 0 reversed (all of it, out of order), page 1 half, page 2 whole in order.
    let mut first: Vec<u32> = v[..p].iter().rev().copied().collect();
    first.extend_from_slice(&v[p..p + 2]);
    first.extend_from_slice(&v[2 * p..3 * p]);
    pool.free(&first).unwrap();
    assert_eq!((pool.available(), pool.allocatable()), (2 * p + 2, 2 * p));
    pool.adopt(&v[3 * p..]).unwrap();
    pool.release_cached(&[v[3 * p + 3], v[3 * p]]).unwrap();
    assert_eq!((pool.available(), pool.allocatable()), (2 * p + 4, 2 * p));
    pool.free(&[v[p + 3], v[p + 2]]).unwrap();
    pool.release_cached(&[v[3 * p + 2], v[3 * p + 1]]).unwrap();
    assert_eq!((pool.available(), pool.allocatable()), (4 * p, 4 * p));
    let mut all = alloc(&pool, 4 * p);
    all.sort_unstable();
    assert_eq!(all, (0..4 * p as u32).collect::<Vec<_>>());
}

/// Two threads free the same slots at once, in opposite orders, round after round: exactly
/// one must win each round (a scheme that gives up on meeting a claimed slot could make both
/// lose, and does in most rounds here).
#[cfg(not(loom))]
#[test]
fn racing_frees_of_the_same_slots_have_one_winner() {
    use std::sync::Barrier;
    use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
    // Long lists, so that one call lasts longer than the other thread takes to wake up.
    const N: usize = 4096;
    const ROUNDS: usize = 400;
    let pool = SlotPool::new(N, 1).unwrap();
    let start = Barrier::new(3);
    let done = Barrier::new(3);
    // Set when a round left the pool short, so the racers stop instead of waiting forever.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let go = std::sync::atomic::AtomicUsize::new(0);
    let wins = std::thread::scope(|s| {
        let racer = |reverse: bool| {
            let (pool, start, done, stop, go) = (&pool, &start, &done, &stop, &go);
            s.spawn(move || {
                let mut order: Vec<u32> = (0..N as u32).collect();
                if reverse {
                    order.reverse();
                }
                let mut results = Vec::with_capacity(ROUNDS);
                for round in 1..=ROUNDS {
                    start.wait();
                    if stop.load(Relaxed) {
                        break;
                    }
                    // Spin (rather than sleep in the barrier) so both racers start together.
                    while go.load(Acquire) != round {
                        std::hint::spin_loop();
                    }
                    results.push(pool.free(&order));
                    done.wait();
                }
                results
            })
        };
        let (t1, t2) = (racer(false), racer(true));
        for round in 1..=ROUNDS {
            let mut v = Vec::new();
            if pool.try_alloc(N, &mut v) != Ok(true) {
                stop.store(true, Relaxed);
                start.wait();
                break;
            }
            start.wait();
            go.store(round, Release);
            done.wait();
        }
        let (r1, r2) = (t1.join().unwrap(), t2.join().unwrap());
        r1.iter()
            .zip(&r2)
            .map(|(a, b)| match (a, b) {
                (Ok(()), Err(Error::DoubleFree { .. })) => 1,
                (Err(Error::DoubleFree { .. }), Ok(())) => 2,
                other => panic!("not one winner: {other:?}"),
            })
            .collect::<Vec<u8>>()
    });
    assert_eq!(wins.len(), ROUNDS);
    assert_eq!((pool.available(), pool.allocatable()), (N, N));
}

/// A free and an adopt of the same slots race: exactly one wins, and the state matches it.
#[cfg(not(loom))]
#[test]
fn racing_free_and_adopt_have_one_winner() {
    use std::sync::Barrier;
    let pool = SlotPool::new(8, 4).unwrap();
    let barrier = Barrier::new(2);
    for _ in 0..2000 {
        let v = alloc(&pool, 4);
        let rev: Vec<u32> = v.iter().rev().copied().collect();
        let (r1, r2) = std::thread::scope(|s| {
            let t1 = s.spawn(|| {
                barrier.wait();
                pool.free(&v)
            });
            let t2 = s.spawn(|| {
                barrier.wait();
                pool.adopt(&rev)
            });
            (t1.join().unwrap(), t2.join().unwrap())
        });
        match (r1, r2) {
            (Ok(()), Err(Error::InvalidArgument(_))) => {
                assert!(v.iter().all(|&s| pool.state(s) == Some(SlotState::Free)));
            }
            (Err(Error::DoubleFree { .. }), Ok(())) => {
                assert!(v.iter().all(|&s| pool.state(s) == Some(SlotState::Cached)));
                pool.release_cached(&v).unwrap();
            }
            other => panic!("{other:?}"),
        }
        assert_eq!((pool.available(), pool.allocatable()), (8, 8));
    }
}

#[test]
fn debug_shows_figures() {
    let pool = SlotPool::new(32, 16).unwrap();
    let s = format!("{pool:?}");
    assert!(s.contains("capacity: 32") && s.contains("page_size: 16"), "{s}");
}

#[test]
fn pool_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<SlotPool>();
}

#[test]
fn settle_moves_both_lists_or_nothing() {
    let pool = SlotPool::new(32, 4).unwrap();
    let mut a = Vec::new();
    assert!(pool.try_alloc(16, &mut a).unwrap());
    // A slot in both lists, a free slot, one outside the pool: refused, nothing changed.
    assert!(matches!(pool.settle(&a[..4], &a[3..5]), Err(Error::InvalidArgument(_))));
    let free_slot = (0..32u32).find(|s| !a.contains(s)).unwrap();
    assert!(matches!(pool.settle(&a[..4], &[a[4], free_slot]), Err(Error::InvalidArgument(_))));
    assert!(matches!(pool.settle(&a[..4], &[a[4], 99]), Err(Error::InvalidArgument(_))));
    assert!(a.iter().all(|&s| pool.state(s) == Some(SlotState::Held)));
    assert_eq!(pool.available(), 16);
    // Adopt one page, free one and a half pages: the whole page returns at once, the
    // half page waits for its other slots.
    pool.settle(&a[..4], &a[4..10]).unwrap();
    assert!(a[..4].iter().all(|&s| pool.state(s) == Some(SlotState::Cached)));
    assert!(a[4..10].iter().all(|&s| pool.state(s) == Some(SlotState::Free)));
    assert_eq!(pool.available(), 22);
    assert_eq!(pool.allocatable(), 20);
    pool.settle(&[], &a[10..12]).unwrap();
    assert_eq!(pool.allocatable(), 24);
    pool.settle(&a[12..16], &[]).unwrap();
    pool.release_cached(&a[..4]).unwrap();
    pool.release_cached(&a[12..16]).unwrap();
    assert_eq!(pool.available(), 32);
    assert_eq!(pool.allocatable(), 32);
}
