use std::collections::HashSet;

use super::*;

/// Refused with status `INVALID_ARGUMENT`: a bad argument, or a bad slot (`Error::Slot`).
fn is_invalid<T: fmt::Debug>(r: Result<T>) -> bool {
    matches!(r, Err(Error::InvalidArgument(_) | Error::Slot { .. }))
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
fn release_cached_runs_frees_runs_in_any_order_and_refuses_whole() {
    for p in [1, 4] {
        let pool = SlotPool::with_shards(64 * p, p, 1).unwrap();
        let all = alloc(&pool, 64 * p);
        pool.adopt(&all[..48 * p]).unwrap();
        let run = |a: usize, e: usize| SlotRun { start: (a * p) as u32, len: ((e - a) * p) as u32 };
        let before = snapshot(&pool);
        let refused = [
            (vec![run(0, 4), run(3, 6)], "a slot in two runs"),
            (vec![run(40, 50)], "runs into Held slots"),
            (vec![run(0, 20), run(30, 50)], "a later run into Held slots (the first is undone)"),
            (vec![run(1, 47), run(47, 49)], "the last slot Held (both runs undone)"),
            (vec![run(0, 2), SlotRun { start: (64 * p - 1) as u32, len: 2 }], "out of range"),
            (vec![run(0, 2), SlotRun { start: u32::MAX, len: 1 }], "out of range"),
            (vec![run(0, 2), SlotRun { start: 5, len: 0 }], "empty run"),
        ];
        for (runs, why) in refused {
            assert!(is_invalid(pool.release_cached_runs(&runs)), "p {p}: {why}");
            assert_eq!(snapshot(&pool), before, "p {p}: {why} changed something");
            assert_eq!(pool.available(), 0);
        }
        // Descending, then a run straddling two earlier ones' gap: all freed, pages made
        // whole go back, and the slots come out again ascending as one run.
        pool.release_cached_runs(&[run(30, 48), run(10, 20), run(0, 10)]).unwrap();
        pool.release_cached_runs(&[run(20, 30)]).unwrap();
        assert_eq!(pool.available(), 48 * p);
        assert!(is_invalid(pool.release_cached_runs(&[run(5, 6)])), "already free");
        let again = alloc(&pool, 48 * p);
        // The shard is a stack of runs: [20, 30) freed last is on top, then [0, 20) and
        // [30, 48) from the first call (pushed highest first).
        let want: Vec<u32> = [(20, 30), (0, 20), (30, 48)]
            .iter()
            .flat_map(|&(a, e)| (a * p) as u32..(e * p) as u32)
            .collect();
        assert_eq!(again, want, "p {p}");
        pool.free(&again).unwrap();
        pool.free(&all[48 * p..]).unwrap();
        assert_eq!(pool.available(), 64 * p);
    }
}

#[test]
fn alloc_runs_hands_out_what_alloc_would_as_runs() {
    for p in [1, 4] {
        // Two pools taking the same calls: one lists slots, the other hands out runs.
        let a = SlotPool::with_shards(64 * p, p, 2).unwrap();
        let b = SlotPool::with_shards(64 * p, p, 2).unwrap();
        if p > 1 {
            assert!(is_invalid(b.try_alloc_runs(p + 1, &mut Vec::new())), "not whole pages");
        }
        let mut runs = vec![SlotRun { start: 9999, len: 1 }];
        assert_eq!(b.try_alloc_runs(0, &mut runs), Ok(true));
        assert_eq!(runs.len(), 1, "n = 0 appends nothing");
        runs.clear();
        let mut want = Vec::new();
        for n in [3 * p, 40 * p, 21 * p] {
            assert_eq!(a.try_alloc(n, &mut want), Ok(true));
            // Appended, and joined to the run before where they continue it.
            assert_eq!(b.try_alloc_runs(n, &mut runs), Ok(true));
            let got: Vec<u32> = runs.iter().flat_map(|r| r.slots()).collect();
            assert_eq!(got, want, "p {p} n {n}");
            assert!(runs.windows(2).all(|w| w[0].start + w[0].len != w[1].start), "{runs:?}");
            assert_eq!(snapshot(&a), snapshot(&b));
        }
        // Exhausted: nothing appended, nothing changed.
        let before = snapshot(&b);
        let len = runs.len();
        assert_eq!(b.try_alloc_runs(p, &mut runs), Ok(false));
        assert_eq!((runs.len(), snapshot(&b)), (len, before));
        b.free_runs(&runs).unwrap();
        assert_eq!(b.available(), 64 * p);
    }
}

#[test]
fn free_runs_and_settle_runs_refuse_whole() {
    let p = 2;
    let pool = SlotPool::with_shards(32, p, 1).unwrap();
    let mut runs = Vec::new();
    assert_eq!(pool.try_alloc_runs(16, &mut runs), Ok(true));
    assert_eq!(runs, [SlotRun { start: 0, len: 16 }]);
    let r = |start: u32, len: u32| SlotRun { start, len };
    let before = snapshot(&pool);
    let bad_free: [(Vec<SlotRun>, &str); 5] = [
        (vec![r(0, 4), r(2, 4)], "a slot in two runs"),
        (vec![r(14, 4)], "runs into Free slots"),
        (vec![r(0, 2), r(40, 1)], "out of range"),
        (vec![r(0, 2), r(4, 0)], "empty run"),
        (vec![r(u32::MAX, 1)], "out of range, at the top"),
    ];
    for (runs, why) in &bad_free {
        assert!(pool.free_runs(runs).is_err(), "{why}");
        assert_eq!(snapshot(&pool), before, "{why} changed something");
    }
    assert_eq!(pool.free_runs(&[r(14, 4)]), Err(Error::DoubleFree { slot: 16 }));
    // settle: adopt and free in one step, or nothing.
    assert!(is_invalid(pool.settle_runs(&[r(0, 4)], &[r(2, 2)])), "a slot in both lists");
    assert!(is_invalid(pool.settle_runs(&[r(0, 4)], &[r(16, 2)])), "freeing a Free slot");
    assert!(is_invalid(pool.settle_runs(&[r(0, 4)], &[r(8, 0)])), "empty run");
    assert_eq!(snapshot(&pool), before);
    pool.settle_runs(&[r(8, 4), r(0, 4)], &[r(12, 4), r(4, 2)]).unwrap();
    let st = snapshot(&pool);
    for (i, s) in st.iter().enumerate() {
        let want = match i {
            0..4 | 8..12 => SlotState::Cached,
            6..8 => SlotState::Held,
            _ => SlotState::Free,
        };
        assert_eq!(*s, want, "slot {i}");
    }
    assert!(is_invalid(pool.settle_runs(&[r(0, 2)], &[])), "adopting a Cached slot");
    pool.free_runs(&[r(6, 2)]).unwrap();
    pool.release_cached_runs(&[r(0, 4), r(8, 4)]).unwrap();
    assert_eq!(pool.available(), 32);
}

#[test]
fn free_pages_are_kept_as_runs_and_popped_ascending() {
    let pool = SlotPool::with_shards(256, 1, 1).unwrap();
    let all = alloc(&pool, 256);
    // Freed in three calls, out of order: the shard holds runs, and each allocation takes
    // from the run freed last, lowest slot first.
    pool.free(&all[200..256]).unwrap();
    pool.free(&all[0..100]).unwrap();
    pool.free(&all[100..200]).unwrap();
    assert_eq!(lock(&pool.shards[0]).len(), 3);
    assert_eq!(alloc(&pool, 150), (100..200).chain(0..50).collect::<Vec<u32>>());
    assert_eq!(alloc(&pool, 106), (50..100).chain(200..256).collect::<Vec<u32>>());
    assert!(lock(&pool.shards[0]).is_empty());
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
fn check_settle_agrees_with_settle_and_changes_nothing() {
    // The read-only checks an insert asks before it splits an edge: for every case they
    // must refuse exactly what settle refuses (or accept what it accepts), changing nothing.
    let p = 1;
    let pool = SlotPool::new(256, p).unwrap();
    let held = alloc(&pool, 140); // spans three words of a plane
    let cached = alloc(&pool, 8);
    pool.adopt(&cached).unwrap();
    let free_slot =
        (0..pool.capacity() as u32).find(|&s| pool.state(s) == Some(SlotState::Free)).unwrap();
    let r = |start: u32, len: u32| SlotRun { start, len };
    // The longest stretch of consecutive held slots (the pool hands out from its top and
    // wraps): at least 70 of the 140, spanning a word of the planes.
    let mut sorted = held.clone();
    sorted.sort_unstable();
    let starts = (0..sorted.len()).filter(|&i| i == 0 || sorted[i - 1] + 1 != sorted[i]);
    let (h0, n) = starts
        .map(|i| (sorted[i], sorted[i..].windows(2).take_while(|w| w[0] + 1 == w[1]).count() + 1))
        .max_by_key(|&(_, n)| n)
        .unwrap();
    assert!(n >= 70, "{sorted:?}");
    // (adopt, free, valid)
    let run_cases: Vec<(Vec<SlotRun>, Vec<SlotRun>, bool)> = vec![
        (vec![r(h0, 70)], vec![], true),
        (vec![r(h0 + 35, 35)], vec![r(h0, 35)], true),
        (vec![r(h0 + 2, 68)], vec![r(h0 + 1, 1), r(h0, 1)], true),
        (vec![r(h0, 69), r(free_slot, 1)], vec![], false),
        (vec![r(h0, 35)], vec![r(cached[3], 1)], false),
        (vec![r(h0, 35)], vec![r(h0 + 34, 2)], false),
        (vec![r(h0 + 1, 69)], vec![r(255, 2)], false),
        (vec![r(h0, 0)], vec![], false),
    ];
    let expanded =
        |v: &[SlotRun]| -> Vec<u32> { v.iter().flat_map(|x| x.start..x.start + x.len).collect() };
    let before = snapshot(&pool);
    for (adopt, free, valid) in &run_cases {
        let checked = pool.check_settle_runs(adopt, free);
        assert_eq!(checked.is_ok(), *valid, "{adopt:?} {free:?}: {checked:?}");
        if adopt.iter().chain(free).all(|x| x.len > 0) {
            // The same slots as lists (which cannot say "an empty run").
            let listed = pool.check_settle(&expanded(adopt), &expanded(free));
            assert_eq!(listed.is_ok(), *valid, "{adopt:?} {free:?}: {listed:?}");
        }
        assert_eq!(snapshot(&pool), before, "checks change nothing");
        if !valid {
            // settle refuses it with the same error, changing nothing.
            assert_eq!(pool.settle_runs(adopt, free), checked, "{adopt:?} {free:?}");
            assert_eq!(snapshot(&pool), before);
        }
    }
    // A valid case then settles as checked.
    let (adopt, free, _) = &run_cases[1];
    pool.settle_runs(adopt, free).unwrap();
    assert!(expanded(adopt).iter().all(|&s| pool.state(s) == Some(SlotState::Cached)));
    assert!(expanded(free).iter().all(|&s| pool.state(s) == Some(SlotState::Free)));
}

/// The runs a list becomes: maximal runs of consecutive ids, ascending or not.
#[test]
fn lists_become_runs() {
    let pool = SlotPool::new(64, 1).unwrap();
    let runs = |lists: &[(&[u32], u8)]| {
        let mut runs = Vec::new();
        let mut asc = true;
        for &(l, to) in lists {
            asc &= pool.push_runs(l, to, &mut runs).unwrap();
        }
        let spans: Vec<(usize, usize, u8)> = runs.iter().map(|r| (r.start, r.end, r.to)).collect();
        (spans, asc)
    };
    assert_eq!(runs(&[(&[], FREE)]), (vec![], true));
    assert_eq!(runs(&[(&[4, 5, 6, 7], FREE)]), (vec![(4, 8, FREE)], true));
    assert_eq!(runs(&[(&[4, 5, 9, 10], FREE)]), (vec![(4, 6, FREE), (9, 11, FREE)], true));
    assert_eq!(runs(&[(&[9, 10, 4, 5], FREE)]), (vec![(9, 11, FREE), (4, 6, FREE)], false));
    assert_eq!(runs(&[(&[7, 6], FREE)]), (vec![(7, 8, FREE), (6, 7, FREE)], false));
    assert_eq!(runs(&[(&[3, 3], FREE)]), (vec![(3, 4, FREE), (3, 4, FREE)], false));
    // Across lists: ascending only if the second starts past the end of the first.
    assert_eq!(
        runs(&[(&[0, 1], CACHED), (&[2, 3], FREE)]),
        (vec![(0, 2, CACHED), (2, 4, FREE)], true)
    );
    assert!(!runs(&[(&[2, 3], CACHED), (&[0, 1], FREE)]).1);
    assert!(!runs(&[(&[2, 3], CACHED), (&[3], FREE)]).1);
    let mut v = Vec::new();
    assert_eq!(pool.push_runs(&[1, 64, 65], FREE, &mut v), Err((64, Refusal::OutOfRange)));
    assert_eq!(pool.push_runs(&[u32::MAX], FREE, &mut v), Err((u32::MAX, Refusal::OutOfRange)));
}

#[test]
fn run_len_counts_consecutive_ids() {
    let up: Vec<u32> = (10..110).collect();
    for n in [1, 2, 15, 16, 17, 33, 100] {
        assert_eq!(run_len(&up[..n]), n);
        // A break anywhere (in a chunk or in the tail) ends the run there.
        for cut in 1..n {
            let mut v = up[..n].to_vec();
            v[cut] += 1;
            assert_eq!(run_len(&v), cut, "n {n} cut {cut}");
            v[cut] -= 2;
            assert_eq!(run_len(&v), cut, "n {n} cut {cut}");
        }
    }
    // Never across the top of u32.
    let top: Vec<u32> = (u32::MAX - 20..=u32::MAX).chain(0..20).collect();
    assert_eq!(run_len(&top), 21);
    assert_eq!(run_len(&top[20..]), 1);
    assert_eq!(run_len(&[u32::MAX, 0]), 1);
}

/// Slot states in two bit planes of 64 slots a word: runs that start and end inside words,
/// or straddle them, change only their own bits, and checks see only their own bits (a
/// slot in both planes would make `snapshot` panic).
#[test]
fn packed_states_change_only_their_fields() {
    let pool = SlotPool::with_shards(320, 1, 1).unwrap();
    let all = alloc(&pool, 320);
    let mut want = vec![SlotState::Held; 320];
    let adopted = [
        (3, 5),
        (7, 8),
        (8, 12),
        (13, 30),
        (31, 33),
        (40, 41),
        (44, 64),
        (70, 150),
        (190, 260),
        (300, 301),
    ];
    for (a, e) in adopted {
        pool.adopt(&all[a..e]).unwrap();
        want[a..e].fill(SlotState::Cached);
        assert_eq!(snapshot(&pool), want, "{a}..{e}");
    }
    assert_eq!(pool.first_not(0, 64, HELD), Some(3));
    assert_eq!(pool.first_not(5, 7, HELD), None);
    assert_eq!(pool.first_not(33, 40, HELD), None);
    assert_eq!(pool.first_not(33, 64, HELD), Some(40));
    assert_eq!(pool.first_not(12, 30, CACHED), Some(12));
    assert_eq!(pool.first_not(13, 30, CACHED), None);
    assert_eq!(pool.first_not(44, 64, CACHED), None);
    assert_eq!(pool.first_not(45, 46, CACHED), None);
    assert_eq!(pool.first_not(70, 150, CACHED), None);
    assert_eq!(pool.first_not(64, 160, HELD), Some(70));
    assert_eq!(pool.first_not(70, 160, CACHED), Some(150));
    assert_eq!(pool.first_not(100, 160, HELD), Some(100));
    // Release every other cached run, free every other held slot.
    pool.release_cached(&all[13..30]).unwrap();
    pool.release_cached(&all[40..41]).unwrap();
    want[13..30].fill(SlotState::Free);
    want[40] = SlotState::Free;
    pool.release_cached(&all[190..260]).unwrap();
    want[190..260].fill(SlotState::Free);
    assert_eq!(snapshot(&pool), want);
    let held: Vec<u32> = (0..320u32).filter(|&s| want[s as usize] == SlotState::Held).collect();
    pool.free(&held).unwrap();
    for &s in &held {
        want[s as usize] = SlotState::Free;
    }
    assert_eq!(snapshot(&pool), want);
    let cached: Vec<u32> = (0..320u32).filter(|&s| want[s as usize] == SlotState::Cached).collect();
    pool.release_cached(&cached).unwrap();
    assert!(snapshot(&pool).iter().all(|&s| s == SlotState::Free));
    assert_eq!((pool.available(), pool.allocatable()), (320, 320));
    assert!(pool.planes.iter().all(|p| p.iter().all(|w| w.load(Ordering::Relaxed) == 0)));
    assert_eq!(field_mask(0, 64), !0);
    assert_eq!(field_mask(1, 3), 0b110);
    assert_eq!(field_mask(63, 64), 1 << 63);
}

#[test]
fn runs_sort_merge_and_find_the_lowest_duplicate() {
    let run = |start, end, to| Run { start, end, to };
    let mut r = vec![run(9, 11, FREE), run(4, 6, FREE), run(6, 9, FREE), run(0, 2, CACHED)];
    sort_runs(&mut r).unwrap();
    assert_eq!(r, vec![run(0, 2, CACHED), run(4, 11, FREE)]);
    // Neighbours going to different states stay apart.
    let mut r = vec![run(2, 4, FREE), run(0, 2, CACHED)];
    sort_runs(&mut r).unwrap();
    assert_eq!(r, vec![run(0, 2, CACHED), run(2, 4, FREE)]);
    // A run inside a longer one, after a shorter overlap further up.
    let mut r = vec![run(0, 10, FREE), run(12, 14, FREE), run(13, 15, FREE), run(5, 6, FREE)];
    assert_eq!(sort_runs(&mut r), Err((5, Refusal::Twice)));
    let mut r = vec![run(3, 4, FREE), run(3, 4, CACHED)];
    assert_eq!(sort_runs(&mut r), Err((3, Refusal::Twice)));
}

/// Stripes: whole pages, `STRIPE_SLOTS` slots at most unless a page is larger; a run
/// spanning many stripes locks each once, and two runs sharing a stripe lock it once.
#[test]
fn stripes_hold_whole_pages() {
    assert_eq!(STRIPE_SLOTS, 4096);
    for (p, stripe) in [(1, 4096), (3, 4095), (16, 4096), (48, 4080), (4096, 4096), (8192, 8192)] {
        let pool = SlotPool::new(p * 8192, p).unwrap();
        assert_eq!(pool.stripe_slots, stripe, "page size {p}");
        assert_eq!(pool.stripe_lock.len(), (p * 8192).div_ceil(stripe));
        assert_eq!(pool.stripe_shift.is_some(), stripe.is_power_of_two());
        for s in [0, stripe - 1, stripe, p * 8192 - 1] {
            assert_eq!(pool.stripe_of(s), s / stripe);
        }
    }
    // 64-slot stripes (as the loom models use): a run locks every stripe it touches, once.
    let pool = SlotPool::with_layout(1024, 1, 4, 64).unwrap();
    let runs = [
        Run { start: 1, end: 3, to: FREE },
        Run { start: 5, end: 200, to: FREE },
        Run { start: 250, end: 251, to: FREE },
    ];
    pool.lock_runs(&runs);
    let locked: Vec<u8> = pool.stripe_lock.iter().map(|l| l.load(Ordering::Relaxed)).collect();
    assert_eq!(&locked[..5], &[1, 1, 1, 1, 0]);
    assert!(locked[4..].iter().all(|&l| l == 0));
    pool.unlock_runs(&runs);
    assert!(pool.stripe_lock.iter().all(|l| l.load(Ordering::Relaxed) == 0));
}

/// Long runs in any order, across many stripes and pages, at several page sizes: the
/// states, the counts and the free list stay exact, and runs freed together come back
/// as runs.
#[test]
fn long_runs_in_any_order() {
    for p in [1, 2, 3, 16, 64, 128] {
        let n = p * 600;
        let pool = SlotPool::with_shards(n, p, 1).unwrap();
        let v = alloc(&pool, n);
        assert_eq!(v, (0..n as u32).collect::<Vec<_>>(), "page size {p}");
        // Three runs, out of order, with page-splitting cuts; then the rest in reverse.
        let (c1, c2, c3) = (n / 7 + 1, n / 3, n / 2 + 2);
        let mut first: Vec<u32> = v[c2..c3].to_vec();
        first.extend_from_slice(&v[..c1]);
        pool.settle(&v[c3..], &first).unwrap();
        assert!(v[c3..].iter().all(|&s| pool.state(s) == Some(SlotState::Cached)));
        assert!(first.iter().all(|&s| pool.state(s) == Some(SlotState::Free)));
        let whole = |lo: usize, hi: usize| (hi / p).saturating_sub(lo.div_ceil(p)) * p;
        assert_eq!(pool.available(), first.len());
        assert_eq!(pool.allocatable(), whole(0, c1) + whole(c2, c3));
        let mid: Vec<u32> = v[c1..c2].iter().rev().copied().collect();
        pool.free(&mid).unwrap();
        assert_eq!(pool.available(), c3);
        assert_eq!(pool.allocatable(), whole(0, c3));
        let tail: Vec<u32> = v[c3..].iter().rev().copied().collect();
        pool.release_cached(&tail).unwrap();
        assert_eq!((pool.available(), pool.allocatable()), (n, n));
        let mut all = alloc(&pool, n);
        assert_whole_pages(&all, p);
        all.sort_unstable();
        assert_eq!(all, v);
        // Freed at once as one run, they come back as one run.
        pool.free(&all).unwrap();
        assert_eq!(alloc(&pool, n), v);
    }
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
            (Ok(()), Err(Error::Slot { .. })) => {
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
    assert!(matches!(pool.settle(&a[..4], &a[3..5]), Err(Error::Slot { .. })));
    let free_slot = (0..32u32).find(|s| !a.contains(s)).unwrap();
    assert!(matches!(pool.settle(&a[..4], &[a[4], free_slot]), Err(Error::Slot { .. })));
    assert!(matches!(pool.settle(&a[..4], &[a[4], 99]), Err(Error::Slot { .. })));
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

#[test]
fn refusals_name_the_slot_and_the_problem() {
    let pool = SlotPool::new(16, 4).unwrap();
    let mut held = Vec::new();
    pool.try_alloc(8, &mut held).unwrap();
    pool.adopt(&held[4..]).unwrap();
    let free_slot = (0..16u32).find(|s| !held.contains(s)).unwrap();
    let slot = |slot, problem| Err(Error::Slot { slot, problem });
    let (h, c) = (SlotState::Held, SlotState::Cached);
    let outside = SlotProblem::OutsidePool { capacity: 16 };
    assert_eq!(pool.adopt(&[held[0], 16]), slot(16, outside));
    assert_eq!(pool.adopt(&[held[0], held[0]]), slot(held[0], SlotProblem::ListedTwice));
    let free_not_held = SlotProblem::State { found: SlotState::Free, wanted: h };
    assert_eq!(pool.adopt(&[held[0], free_slot]), slot(free_slot, free_not_held));
    assert_eq!(
        pool.check_held(&[held[4]]),
        slot(held[4], SlotProblem::State { found: c, wanted: h })
    );
    let held_not_cached = SlotProblem::State { found: h, wanted: c };
    assert_eq!(pool.release_cached(&[held[0]]), slot(held[0], held_not_cached));
    let runs = [SlotRun { start: 12, len: 8 }];
    assert_eq!(pool.free_runs(&runs), slot(16, outside));
    // Every status of a slot refusal is INVALID_ARGUMENT; DoubleFree stays its own.
    assert_eq!(
        Error::Slot { slot: 1, problem: outside }.status(),
        crate::error::status::INVALID_ARGUMENT
    );
    assert_eq!(pool.free(&[free_slot]), Err(Error::DoubleFree { slot: free_slot }));
    // The messages, word for word.
    let text = |problem| Error::Slot { slot: 7, problem }.to_string();
    assert_eq!(text(outside), "invalid argument: slot 7 is outside the pool of 16 slots");
    assert_eq!(text(SlotProblem::ListedTwice), "invalid argument: slot 7 is listed twice");
    assert_eq!(text(free_not_held), "invalid argument: slot 7 is free, not held");
    assert_eq!(text(held_not_cached), "invalid argument: slot 7 is held by a caller, not cached");
    assert_eq!(snapshot(&pool).iter().filter(|s| **s == c).count(), 4, "nothing changed");
}
