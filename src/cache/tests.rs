//! Pool-mode behaviour of the cache: adoption, duplicates, refusals, eviction into the
//! pool, and the request cycle.

use super::*;
use crate::error::SlotProblem;
use crate::pool::SlotState;
use crate::slot_run::SlotRun;

fn pooled(n: usize, p: usize) -> Cache {
    Cache::new(CacheOptions {
        page_size: p,
        policy: EvictionPolicy::Lru,
        pool_slots: n,
        ..Default::default()
    })
    .unwrap()
}

fn conserved(c: &Cache, held: usize) {
    let s = c.stats();
    c.tree().check_invariants().unwrap();
    assert_eq!(s.free_slots + s.tree.cached_tokens + held as u64, s.pool_slots, "{s:?}");
}

#[test]
fn insert_adopts_and_frees_duplicates_and_tail() {
    let c = pooled(64, 4);
    let mut a = Vec::new();
    c.alloc(8, &mut a).unwrap();
    assert_eq!(c.insert(0, &[1, 2, 3, 4, 5, 6, 7, 8], &a).unwrap(), 0);
    conserved(&c, 0);
    assert!(a.iter().all(|&s| c.pool().unwrap().state(s) == Some(SlotState::Cached)));
    // A second request computing the same 8 tokens plus 2 more (an unaligned tail).
    let mut b = Vec::new();
    c.alloc(12, &mut b).unwrap();
    assert_eq!(c.insert(0, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], &b[..10]).unwrap(), 8);
    // b[..8] duplicated cached tokens and b[8..10] was the unaligned tail: all freed by
    // the insert; b[10..12] is still held by us.
    for &s in &b[..10] {
        assert_eq!(c.pool().unwrap().state(s), Some(SlotState::Free));
    }
    conserved(&c, 2);
    c.free(&b[10..]).unwrap();
    conserved(&c, 0);
}

#[test]
fn insert_keeps_slots_equal_to_the_cached_ones() {
    let c = pooled(64, 1);
    let mut a = Vec::new();
    c.alloc(3, &mut a).unwrap();
    c.insert(0, &[1, 2, 3], &a).unwrap();
    let mut out = Vec::new();
    let g = c.match_and_lock(0, &[1, 2, 3, 4], &mut out);
    assert_eq!(out, a);
    let mut more = Vec::new();
    c.alloc(1, &mut more).unwrap();
    out.extend_from_slice(&more);
    assert_eq!(c.insert(0, &[1, 2, 3, 4], &out).unwrap(), 3);
    drop(g);
    conserved(&c, 0);
    assert_eq!(c.stats().tree.cached_tokens, 4);
}

#[test]
fn bad_slots_are_refused_whole() {
    let c = pooled(16, 1);
    let mut a = Vec::new();
    c.alloc(4, &mut a).unwrap();
    c.insert(0, &[1, 2], &a[..2]).unwrap();
    let before = c.stats();
    // Each refusal names the slot and what is wrong with it (`Error::Slot`).
    let slot = |slot, problem| Err(Error::Slot { slot, problem });
    let (held, cached) = (SlotState::Held, SlotState::Cached);
    // Outside the pool.
    let outside = SlotProblem::OutsidePool { capacity: 16 };
    assert_eq!(c.insert(0, &[5, 6], &[a[2], 999]), slot(999, outside));
    // A free slot (never allocated).
    let free_slot = (0..16u32).find(|s| !a.contains(s)).unwrap();
    let free = SlotProblem::State { found: SlotState::Free, wanted: held };
    assert_eq!(c.insert(0, &[5, 6], &[a[2], free_slot]), slot(free_slot, free));
    // A slot the tree caches at another position.
    let at_another = SlotProblem::State { found: cached, wanted: held };
    assert_eq!(c.insert(0, &[5, 6], &[a[2], a[0]]), slot(a[0], at_another));
    // The same slot twice.
    assert_eq!(c.insert(0, &[5, 6], &[a[2], a[2]]), slot(a[2], SlotProblem::ListedTwice));
    // The messages the fronts show are the pool's, as before these were fields.
    let msg = |r: Result<usize>| r.unwrap_err().to_string();
    assert_eq!(
        msg(c.insert(0, &[5, 6], &[a[2], 999])),
        "invalid argument: slot 999 is outside the pool of 16 slots"
    );
    assert_eq!(
        msg(c.insert(0, &[5, 6], &[a[2], a[0]])),
        format!("invalid argument: slot {} is cached by the tree, not held", a[0])
    );
    assert_eq!(
        msg(c.insert(0, &[5, 6], &[a[2], a[2]])),
        format!("invalid argument: slot {} is listed twice", a[2])
    );
    // Length mismatch.
    assert!(matches!(c.insert(0, &[5, 6], &[a[2]]), Err(Error::InvalidArgument(_))));
    assert_eq!(c.stats(), before);
    assert_eq!(c.pool().unwrap().state(a[2]), Some(SlotState::Held));
    assert_eq!(c.pool().unwrap().state(a[3]), Some(SlotState::Held));
    conserved(&c, 2);
    // Double free and freeing a cached slot.
    c.free(&a[2..3]).unwrap();
    assert_eq!(c.free(&a[2..3]), Err(Error::DoubleFree { slot: a[2] }));
    assert_eq!(c.free(&a[..1]), Err(Error::DoubleFree { slot: a[0] }));
    assert_eq!(c.free(&[1000]), Err(Error::Slot { slot: 1000, problem: outside }));
    conserved(&c, 1);
}

#[test]
fn alloc_evicts_when_short_and_reports_out_of_slots() {
    let c = pooled(8, 2);
    let mut a = Vec::new();
    c.alloc(8, &mut a).unwrap();
    c.insert(0, &[1, 2, 3, 4], &a[..4]).unwrap();
    c.insert(0, &[5, 6, 7, 8], &a[4..]).unwrap();
    assert_eq!(c.stats().free_slots, 0);
    let mut b = Vec::new();
    c.alloc(4, &mut b).unwrap(); // evicts one leaf
    assert_eq!(c.stats().tree.cached_tokens, 4);
    assert!(matches!(c.alloc(3, &mut b), Err(Error::InvalidArgument(_))));
    assert!(matches!(c.alloc(6, &mut b), Err(Error::OutOfSlots { requested: 6, .. })));
    assert_eq!(b.len(), 4);
    conserved(&c, 4);
    let mut out: Vec<u32> = Vec::new();
    let g = c.match_and_lock(0, &[1, 2, 3, 4], &mut out);
    let g2 = c.match_and_lock(0, &[5, 6, 7, 8], &mut out);
    assert!(matches!(c.alloc(2, &mut b), Err(Error::OutOfSlots { .. })));
    drop((g, g2));
    c.alloc(2, &mut b).unwrap();
    conserved(&c, 6);
}

#[test]
fn evict_runs_hands_runs_in_both_modes() {
    let c = Cache::new(CacheOptions::default()).unwrap();
    assert!(matches!(c.evict_runs(1, None), Err(Error::InvalidArgument(_))));
    c.insert(0, &[1, 2, 3], &[7, 8, 9]).unwrap();
    let mut got = Vec::new();
    assert_eq!(c.evict_runs(1, Some(&mut |r: &[SlotRun]| got.extend_from_slice(r))).unwrap(), 3);
    assert_eq!(got, vec![SlotRun { start: 7, len: 3 }]);
    // Pool mode: the runs go back to the pool, after the callback saw them.
    let c = pooled(8, 1);
    let mut a = Vec::new();
    c.alloc(5, &mut a).unwrap();
    c.insert(0, &[1, 2, 3, 4, 5], &a).unwrap();
    let mut seen = Vec::new();
    assert_eq!(c.evict_runs(1, Some(&mut |r: &[SlotRun]| seen.extend_from_slice(r))).unwrap(), 5);
    let mut slots: Vec<u32> = seen.iter().flat_map(|r| r.slots()).collect();
    slots.sort();
    a.sort();
    assert_eq!(slots, a);
    assert_eq!(c.stats().free_slots, 8);
    c.alloc(8, &mut Vec::new()).unwrap();
    assert_eq!(c.evict_runs(1, None).unwrap(), 0);
    conserved(&c, 8);
}

fn expand(runs: &[SlotRun]) -> Vec<u32> {
    runs.iter().flat_map(|r| r.slots()).collect()
}

/// The first `n` slots of `runs`, as runs.
fn first(runs: &[SlotRun], n: usize) -> Vec<SlotRun> {
    let mut out = Vec::new();
    crate::tree::cut_runs(runs, 0, n, &mut out);
    out
}

#[test]
fn insert_runs_settles_the_pool_as_insert_does() {
    // Three caches given the same requests: one takes slot lists slot by slot (the list
    // path), one `insert` (which turns slots that come in runs into runs itself), one runs.
    for p in [1, 4] {
        let (l, a, b) = (pooled(512, p), pooled(512, p), pooled(512, p));
        let reqs: Vec<Vec<u32>> = vec![
            (0..40).collect(),
            (0..20).chain(100..131).collect(),
            (0..40).chain(200..203).collect(),
            (0..18).collect(),
            (0..20).chain(100..140).collect(),
            (7..60).collect(),
        ];
        for (i, t) in reqs.iter().enumerate() {
            let (mut sl, mut sa, mut rb) = (Vec::new(), Vec::new(), Vec::new());
            // Even requests reuse the cached prefix's slots (match first); odd ones bring
            // fresh slots for every token, so the cached prefix's given slots differ and go
            // back to the pool.
            let locks = if i % 2 == 0 {
                Some((
                    l.match_and_lock(0, t, &mut sl),
                    a.match_and_lock(0, t, &mut sa),
                    b.match_and_lock(0, t, &mut rb),
                ))
            } else {
                None
            };
            assert_eq!(expand(&rb), sa);
            assert_eq!(sl, sa);
            let need = (t.len() - sa.len()).div_ceil(p) * p;
            l.alloc(need, &mut sl).unwrap();
            a.alloc(need, &mut sa).unwrap();
            b.alloc_runs(need, &mut rb).unwrap();
            assert_eq!(expand(&rb), sa, "p {p} request {i}");
            assert_eq!(sl, sa, "p {p} request {i}");
            let n = t.len();
            let (el, _) = l
                .insert_list(0, t, &sl[..n], false, Default::default(), None, l.pool().unwrap())
                .unwrap();
            let ea = a.insert(0, t, &sa[..n]).unwrap();
            let eb = b.insert(0, t, &first(&rb, n)).unwrap();
            assert_eq!((el, ea), (eb, eb), "p {p} request {i}");
            l.free(&sl[n..]).unwrap();
            a.free(&sa[n..]).unwrap();
            let mut spare = Vec::new();
            crate::tree::cut_runs(&rb, n, sa.len(), &mut spare);
            b.free_runs(&spare).unwrap();
            drop(locks);
            for c in [&l, &a, &b] {
                conserved(c, 0);
            }
            let (pl, pa, pb) = (l.pool().unwrap(), a.pool().unwrap(), b.pool().unwrap());
            for s in 0..512 {
                assert_eq!(pl.state(s), pb.state(s), "p {p} request {i} slot {s}");
                assert_eq!(pa.state(s), pb.state(s), "p {p} request {i} slot {s}");
            }
            let (mut ol, mut oa, mut ob) =
                (Vec::<u32>::new(), Vec::<u32>::new(), Vec::<u32>::new());
            for t in &reqs {
                let m = b.match_prefix(0, t, &mut ob);
                assert_eq!((l.match_prefix(0, t, &mut ol), a.match_prefix(0, t, &mut oa)), (m, m));
                assert_eq!((&ol, &oa), (&ob, &ob));
            }
        }
    }
}

/// `insert` of slots that come in runs takes the runs path and of scattered slots the list
/// path: both refuse bad slots whole, and both cache what they are given.
#[test]
fn insert_refuses_bad_slots_on_both_paths() {
    let c = pooled(64, 1);
    let mut a = Vec::new();
    c.alloc(24, &mut a).unwrap();
    let toks: Vec<u32> = (1..=8).collect();
    let before = c.stats();
    // In runs (the runs path) and scattered (the list path), each with one bad slot.
    let runs_bad = [a[16], a[17], a[18], a[19], a[20], a[21], a[22], 999];
    let scattered_bad = [a[7], a[0], a[5], a[2], a[9], a[4], a[11], a[11]];
    for bad in [&runs_bad[..], &scattered_bad[..]] {
        assert!(matches!(c.insert(0, &toks, bad), Err(Error::Slot { .. })), "{bad:?}");
        assert_eq!(c.stats(), before);
    }
    let scattered = [a[7], a[0], a[5], a[2], a[9], a[4], a[11], a[13]];
    assert_eq!(c.insert(0, &toks, &scattered).unwrap(), 0);
    assert_eq!(c.insert(1, &toks, &a[16..24]).unwrap(), 0);
    let mut out: Vec<u32> = Vec::new();
    assert_eq!(c.match_prefix(0, &toks, &mut out), 8);
    assert_eq!(out, scattered);
    assert_eq!(c.match_prefix(1, &toks, &mut out), 8);
    assert_eq!(out, a[16..24]);
    let held: Vec<u32> =
        a.iter().copied().filter(|s| !scattered.contains(s) && !a[16..24].contains(s)).collect();
    conserved(&c, held.len());
    c.free(&held).unwrap();
    conserved(&c, 0);
}

#[test]
fn refused_inserts_leave_no_split_and_no_stamp() {
    // Found by an audit of the C ABI: a refused insert used to split the edge where its key
    // diverges (or, pinning, ends) and refresh the access stamps of its path before the pool
    // refused its slots, so a later eviction freed less, or another leaf, than before.
    let c = pooled(64, 1);
    let mut a = Vec::new();
    c.alloc(8, &mut a).unwrap();
    c.insert(0, &[1, 2, 3, 4], &a[..4]).unwrap(); // the older leaf
    c.insert(0, &[9, 9, 9, 9], &a[4..]).unwrap(); // the newer
    let mut h = Vec::new();
    c.alloc(8, &mut h).unwrap();
    let before = c.stats();
    let free_slot = (0..64u32).find(|&s| c.pool().unwrap().state(s) == Some(SlotState::Free));
    let free_slot = free_slot.unwrap();
    let r = |start: u32, len: u32| SlotRun { start, len };
    let key = [1, 2, 7, 8]; // diverges inside the first leaf's edge, after 2 tokens
    for bad in [999, free_slot, a[5]] {
        let slots = [h[0], h[1], h[2], bad];
        assert!(matches!(c.insert(0, &key, &slots), Err(Error::Slot { .. })), "{bad}");
        assert_eq!(c.stats(), before, "list path, {bad}");
        let err = c
            .insert_and_lock(0, &key, &slots, InsertOptions::default())
            .map(|(e, l)| (e, l.into_raw()));
        assert!(matches!(err, Err(Error::Slot { .. })), "{bad}");
        assert_eq!(c.stats(), before, "list path pinning, {bad}");
        let runs = [r(h[0], 1), r(h[1], 1), r(h[2], 1), r(bad, 1)];
        assert!(matches!(c.insert(0, &key, &runs), Err(Error::Slot { .. })));
        assert_eq!(c.stats(), before, "runs path, {bad}");
        let err = c
            .insert_and_lock(0, &key, &runs, InsertOptions::default())
            .map(|(e, l)| (e, l.into_raw()));
        assert!(matches!(err, Err(Error::Slot { .. })), "{bad}");
        assert_eq!(c.stats(), before, "runs path pinning, {bad}");
        // Pinning a prefix that ends inside the edge (the lock would split it), with a
        // given slot that differs from the cached one and is not the caller's to free.
        let err = c
            .insert_and_lock(0, &[1, 2], &[a[0], bad], InsertOptions::default())
            .map(|(e, l)| (e, l.into_raw()));
        assert!(matches!(err, Err(Error::Slot { .. })), "{bad}");
        assert_eq!(c.stats(), before, "pinned prefix, {bad}");
        let err = c
            .insert_and_lock(0, &[1, 2], &[r(a[0], 1), r(bad, 1)], InsertOptions::default())
            .map(|(e, l)| (e, l.into_raw()));
        assert!(matches!(err, Err(Error::Slot { .. })), "{bad}");
        assert_eq!(c.stats(), before, "pinned prefix by runs, {bad}");
        // Passing the whole first leaf, then refused where the new leaf would hang.
        let longer = [1, 2, 3, 4, 5, 6];
        let slots = [a[0], a[1], a[2], a[3], h[3], bad];
        assert!(matches!(c.insert(0, &longer, &slots), Err(Error::Slot { .. })));
        let runs = [r(a[0], 4), r(h[3], 1), r(bad, 1)];
        assert!(matches!(c.insert(0, &longer, &runs), Err(Error::Slot { .. })));
        assert_eq!(c.stats(), before, "below a leaf, {bad}");
    }
    // The refusals moved no stamp: the older leaf is still the first evicted, whole.
    let mut seen = Vec::new();
    c.evict(1, Some(&mut |s: &[u32]| seen.extend_from_slice(s))).unwrap();
    assert_eq!(seen, a[..4]);
    conserved(&c, 8);
    // The same inserts with good slots succeed and split as they should.
    assert_eq!(c.insert(0, &[9, 9, 1, 1], &h[..4]).unwrap(), 2);
    assert_eq!(c.stats().tree.nodes, before.tree.nodes + 1, "split 9999, added a leaf");
    conserved(&c, 4); // h[..2] duplicated cached tokens and went back; h[4..] still held
    c.free(&h[4..]).unwrap();
    conserved(&c, 0);
}

#[test]
fn bad_runs_are_refused_whole() {
    let c = pooled(16, 1);
    let mut a = Vec::new();
    c.alloc_runs(4, &mut a).unwrap();
    assert_eq!(a.len(), 1, "a fresh pool hands out one run");
    let b = a[0].start;
    assert_eq!(a[0].len, 4);
    let r = |start: u32, len: u32| SlotRun { start, len };
    c.insert(0, &[1, 2], &[r(b, 2)]).unwrap();
    let before = c.stats();
    let free_slot = (0..16u32).find(|s| !(b..b + 4).contains(s)).unwrap();
    let bad: [(&[SlotRun], &str); 7] = [
        (&[r(b + 2, 1), r(999, 1)], "outside the pool"),
        (&[r(b + 2, 1), r(free_slot, 1)], "a free slot"),
        (&[r(b + 2, 1), r(b, 1)], "a slot the tree caches"),
        (&[r(b + 2, 1), r(b + 2, 1)], "the same slot twice"),
        (&[r(b + 2, 1)], "fewer slots than tokens"),
        (&[r(b + 2, 1), r(b + 3, 0), r(b + 3, 1)], "an empty run"),
        (&[r(b + 2, 3)], "more slots than tokens"),
    ];
    for (runs, why) in bad {
        assert!(
            matches!(
                c.insert(0, &[5, 6], runs),
                Err(Error::InvalidArgument(_) | Error::Slot { .. })
            ),
            "{why}"
        );
        assert_eq!(c.stats(), before, "{why}");
    }
    assert_eq!(c.pool().unwrap().state(b + 2), Some(SlotState::Held));
    conserved(&c, 2);
    assert_eq!(c.free_runs(&[r(b, 1)]), Err(Error::DoubleFree { slot: b }));
    c.free_runs(&[r(b + 2, 2)]).unwrap();
    conserved(&c, 0);
    let no_pool = Cache::new(CacheOptions::default()).unwrap();
    assert_eq!(no_pool.alloc_runs(1, &mut Vec::new()), Err(Error::NoPool));
    assert_eq!(no_pool.free_runs(&[r(0, 1)]), Err(Error::NoPool));
    // Caller-managed mode indexes the runs as given.
    assert_eq!(no_pool.insert(0, &[1, 2, 3], &[r(7, 2), r(50, 1)]).unwrap(), 0);
    let mut out: Vec<u32> = Vec::new();
    assert_eq!(no_pool.match_prefix(0, &[1, 2, 3], &mut out), 3);
    assert_eq!(out, [7, 8, 50]);
}

#[test]
fn caller_managed_mode_needs_a_callback_and_has_no_pool() {
    let c = Cache::new(CacheOptions::default()).unwrap();
    assert_eq!(c.alloc(1, &mut Vec::new()), Err(Error::NoPool));
    assert_eq!(c.free(&[1]), Err(Error::NoPool));
    assert!(matches!(c.evict(1, None), Err(Error::InvalidArgument(_))));
    c.insert(0, &[1, 2], &[7, 8]).unwrap();
    let mut got = Vec::new();
    assert_eq!(c.evict(1, Some(&mut |s: &[u32]| got.extend_from_slice(s))).unwrap(), 2);
    assert_eq!(got, vec![7, 8]);
    assert!(
        Cache::new(CacheOptions { page_size: 4, pool_slots: 6, ..Default::default() }).is_err()
    );
}

#[test]
fn evict_in_pool_mode_returns_slots_and_calls_back() {
    let c = pooled(8, 1);
    let mut a = Vec::new();
    c.alloc(3, &mut a).unwrap();
    c.insert(0, &[1, 2, 3], &a).unwrap();
    let mut seen = Vec::new();
    c.evict(1, Some(&mut |s: &[u32]| seen.extend_from_slice(s))).unwrap();
    assert_eq!(seen, a);
    assert_eq!(c.stats().free_slots, 8);
    c.alloc(3, &mut a).unwrap();
    c.insert(1, &[1, 2, 3], &a[3..]).unwrap();
    c.reset(None).unwrap();
    assert_eq!(c.stats().free_slots, 8);
    conserved(&c, 0);
}

#[test]
fn request_cycle_admit_extend_checkpoint_finish() {
    let c = pooled(64, 4);
    let prompt: Vec<u32> = (1..=10).collect();
    let mut r = c.admit(0, &prompt).unwrap();
    assert_eq!(r.cached_len(), 0);
    assert_eq!(r.slots().len(), 10);
    conserved(&c, 12); // 3 pages held
    assert_eq!(r.checkpoint().unwrap(), 0);
    assert_eq!(r.locked_len(), 8);
    // Another request sees the checkpointed prefix.
    let r2 = c.admit(0, &prompt).unwrap();
    assert_eq!(r2.cached_len(), 8);
    assert_eq!(r2.slots()[..8], r.slots()[..8]);
    r.extend(&[11, 12, 13]).unwrap(); // 13 tokens: 4 pages
    assert_eq!(r.slots().len(), 13);
    let r_slots = r.slots().to_vec();
    assert_eq!(r.finish().unwrap(), 8);
    assert_eq!(c.stats().tree.cached_tokens, 12);
    // r2 finishes its 10 tokens: 8 cached already, 2 unaligned.
    assert_eq!(r2.finish().unwrap(), 8);
    conserved(&c, 0);
    let mut out: Vec<u32> = Vec::new();
    assert_eq!(c.match_prefix(0, &(1..=13).collect::<Vec<_>>(), &mut out), 12);
    assert_eq!(out, r_slots[..12]);
    // Aborting gives everything back.
    let r3 = c.admit(0, &(1..=20).collect::<Vec<_>>()).unwrap();
    assert_eq!(r3.cached_len(), 12);
    r3.abort();
    conserved(&c, 0);
    assert_eq!(c.stats().tree.protected_tokens, 0);
}

#[test]
fn request_errors_change_nothing() {
    let plain = Cache::new(CacheOptions::default()).unwrap();
    assert!(matches!(plain.admit(0, &[1, 2, 3]), Err(Error::NoPool)));
    let c = pooled(8, 2);
    // Larger than the whole pool: refused, nothing held.
    assert!(matches!(c.admit(0, &(0..10).collect::<Vec<_>>()), Err(Error::OutOfSlots { .. })));
    conserved(&c, 0);
    let mut r = c.admit(0, &[1, 2, 3, 4, 5]).unwrap(); // 3 pages
    assert_eq!(r.slots().len(), 5);
    let before = r.slots().to_vec();
    // One page left: extending by 4 tokens needs 2 more pages and fails whole.
    assert!(matches!(r.extend(&[6, 7, 8, 9]), Err(Error::OutOfSlots { .. })));
    assert_eq!((r.len(), r.slots()), (5, &before[..]));
    conserved(&c, 6);
    r.extend(&[6]).unwrap(); // fits in the spare slot of the last page
    assert_eq!(r.len(), 6);
    conserved(&c, 6);
    drop(r); // an unfinished request gives everything back
    conserved(&c, 0);
    assert_eq!(c.stats().tree.protected_tokens, 0);
}

/// A pool-mode `evict` / `evict_runs` whose `free` callback panics loses no slot: every slot
/// the tree handed over (those of the leaves evicted before the panic, and of the leaf whose
/// callback panicked) is back in the pool when the panic leaves the call.
#[test]
fn a_panicking_free_callback_returns_every_slot_to_the_pool() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    // Panic on the first leaf handed over, and on the third (two leaves handed over first).
    for (by_runs, panic_at) in [(false, 1), (false, 3), (true, 1), (true, 3)] {
        let c = pooled(16, 1);
        let mut a = Vec::new();
        c.alloc(16, &mut a).unwrap();
        // Five leaves (one below a split) and two slots still held by us.
        c.insert(0, &[1, 2, 3], &a[..3]).unwrap();
        c.insert(0, &[1, 2, 4, 5], &[a[0], a[1], a[3], a[4]]).unwrap();
        c.insert(0, &[7, 8], &a[5..7]).unwrap();
        c.insert(1, &[1, 2, 3], &a[7..10]).unwrap();
        c.insert(2, &[9, 9, 9, 9], &a[10..14]).unwrap();
        conserved(&c, 2);
        let mut calls = 0;
        let mut handed = Vec::new();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            if by_runs {
                c.evict_runs(
                    usize::MAX,
                    Some(&mut |r: &[SlotRun]| {
                        handed.extend(r.iter().flat_map(|r| r.slots()));
                        calls += 1;
                        assert!(calls < panic_at, "the engine's free callback failed");
                    }),
                )
            } else {
                c.evict(
                    usize::MAX,
                    Some(&mut |s: &[u32]| {
                        handed.extend_from_slice(s);
                        calls += 1;
                        assert!(calls < panic_at, "the engine's free callback failed");
                    }),
                )
            }
        }));
        assert!(outcome.is_err(), "the callback's panic propagates");
        assert_eq!(calls, panic_at, "by runs {by_runs}, panic at {panic_at}");
        // Every slot the callback saw is free again, and the rest is still cached.
        let pool = c.pool().unwrap();
        for &s in &handed {
            assert_eq!(pool.state(s), Some(SlotState::Free), "slot {s}, by runs {by_runs}");
        }
        conserved(&c, 2);
        // The cache still works: the rest evicts, and the whole pool can be allocated.
        c.free(&a[14..]).unwrap();
        c.reset(None).unwrap();
        conserved(&c, 0);
        assert_eq!(c.stats().tree.cached_tokens, 0, "by runs {by_runs}, panic at {panic_at}");
        let mut all = Vec::new();
        c.alloc(16, &mut all).unwrap();
        all.sort();
        assert_eq!(all, (0..16).collect::<Vec<_>>());
    }
}

/// An allocation that finds nothing to evict because another eviction call has just taken
/// the leaves waits for that call to hand their slots back to the pool, instead of failing
/// (it used to fail at once with `OutOfSlots` although the slots were on their way back).
#[test]
fn alloc_waits_for_the_slots_an_eviction_is_handing_back() {
    use std::sync::mpsc;
    use std::time::Duration;
    for by_runs in [false, true] {
        let c = pooled(8, 1);
        let mut a = Vec::new();
        c.alloc(8, &mut a).unwrap();
        c.insert(0, &[1, 2, 3, 4, 5, 6, 7, 8], &a).unwrap();
        let c = &c;
        let (popped_tx, popped_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::scope(|s| {
            // The evicting thread takes the only leaf and holds its slots (its callback sees
            // them before the pool gets them back) until told to go on.
            s.spawn(move || {
                let hold = &mut |_: &[u32]| {
                    popped_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                };
                assert_eq!(c.evict(1, Some(hold)).unwrap(), 8);
            });
            popped_rx.recv().unwrap();
            // The allocating thread needs half of the slots being handed back: nothing is
            // free and nothing is left to evict until the eviction call ends.
            s.spawn(move || {
                let (mut slots, mut runs) = (Vec::new(), Vec::new());
                let r = if by_runs { c.alloc_runs(4, &mut runs) } else { c.alloc(4, &mut slots) };
                slots.extend(runs.iter().flat_map(|r| r.slots()));
                done_tx.send((r, slots)).unwrap();
            });
            // It cannot succeed while the slots are held, so it must not return yet. (The
            // wait only gives an early return the time to show: a slow start makes this
            // check weaker, never wrong.)
            let early = done_rx.recv_timeout(Duration::from_millis(200));
            go_tx.send(()).unwrap(); // first, so that a failing check below cannot hang
            assert!(early.is_err(), "returned while the slots were in flight: {early:?}");
            let (r, slots) = done_rx.recv().unwrap();
            assert_eq!(r, Ok(()), "by runs {by_runs}");
            assert_eq!(slots.len(), 4);
            for &s in &slots {
                assert_eq!(c.pool().unwrap().state(s), Some(SlotState::Held));
            }
        });
        conserved(c, 4);
    }
}

#[test]
fn drop_namespace_returns_its_slots_to_the_pool() {
    let c = pooled(64, 4);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    c.alloc(8, &mut a).unwrap();
    c.alloc(8, &mut b).unwrap();
    c.insert(1, &[1, 2, 3, 4, 5, 6, 7, 8], &a).unwrap();
    c.insert(2, &[1, 2, 3, 4, 5, 6, 7, 8], &b).unwrap();
    assert_eq!(c.stats().tree.namespaces, 2);
    let st = c.namespace_stats(1);
    assert_eq!((st.cached_tokens, st.evictable_tokens, st.nodes), (8, 8, 1));
    // Pin the first page of namespace 1: it stays, the second page goes back to the pool.
    let mut out: Vec<u32> = Vec::new();
    let g = c.match_and_lock(1, &[1, 2, 3, 4], &mut out);
    let free0 = c.stats().free_slots;
    assert_eq!(c.drop_namespace(1, None).unwrap(), 4);
    assert_eq!(c.stats().free_slots, free0 + 4);
    assert!(a[4..].iter().all(|&s| c.pool().unwrap().state(s) == Some(SlotState::Free)));
    assert!(b.iter().all(|&s| c.pool().unwrap().state(s) == Some(SlotState::Cached)));
    conserved(&c, 0);
    drop(g);
    let mut seen = Vec::new();
    assert_eq!(c.drop_namespace(1, Some(&mut |s: &[u32]| seen.extend_from_slice(s))).unwrap(), 4);
    assert_eq!(seen, a[..4]);
    assert_eq!(c.stats().tree.namespaces, 1);
    assert_eq!(c.drop_namespace(1, None).unwrap(), 0);
    assert_eq!(c.drop_namespace(99, None).unwrap(), 0);
    conserved(&c, 0);
    // Without a pool the callback is required, as for evict.
    let plain = Cache::new(CacheOptions::default()).unwrap();
    assert!(plain.drop_namespace(1, None).is_err());
    assert_eq!(plain.drop_namespace(1, Some(&mut |_: &[u32]| {})).unwrap(), 0);
}

fn pooled_with(n: usize, p: usize, policy: EvictionPolicy) -> Cache {
    Cache::new(CacheOptions { page_size: p, policy, pool_slots: n, ..Default::default() }).unwrap()
}

/// A request's inserts carry its priority, and count one hit per node however often it
/// checkpoints (SGLang's `cache_inserted_len`); a second request over the same prefix
/// counts one more.
#[test]
fn the_request_cycle_passes_its_priority_and_counts_each_node_once() {
    let prompt: Vec<u32> = (0..8).collect();
    let c = pooled_with(64, 4, EvictionPolicy::Priority);
    let mut r = c.admit_with_priority(0, &prompt, 6).unwrap();
    assert_eq!(r.priority(), 6);
    r.checkpoint().unwrap();
    r.extend(&[100, 101, 102, 103]).unwrap();
    r.finish().unwrap();
    let path: Vec<(i32, usize)> = c
        .tree()
        .inspect(0, &[0, 1, 2, 3, 4, 5, 6, 7, 100, 101, 102, 103])
        .iter()
        .map(|i| (i.priority, i.len))
        .collect();
    assert_eq!(path, vec![(6, 8), (6, 4)]);
    conserved(&c, 0);

    let c = pooled_with(64, 4, EvictionPolicy::Lfu);
    let hits = |c: &Cache| -> Vec<u32> {
        c.tree()
            .inspect(0, &[0, 1, 2, 3, 4, 5, 6, 7, 100, 101, 102, 103])
            .iter()
            .map(|i| i.hits)
            .collect()
    };
    let mut r = c.admit(0, &prompt).unwrap();
    r.checkpoint().unwrap();
    r.checkpoint().unwrap();
    r.extend(&[100, 101, 102, 103]).unwrap();
    r.checkpoint().unwrap();
    r.finish().unwrap();
    assert_eq!(hits(&c), vec![1, 1]);
    let mut r = c.admit(0, &prompt).unwrap();
    assert_eq!(r.cached_len(), 8);
    r.extend(&[100, 101, 102, 103]).unwrap();
    r.finish().unwrap();
    assert_eq!(hits(&c), vec![2, 2]);
    conserved(&c, 0);
}

/// The pool's allocations evict in the cache's policy order.
#[test]
fn allocations_evict_in_policy_order() {
    // Leaves A, B, C inserted in that order, then A matched: by last access B < C < A.
    for (policy, victim) in
        [(EvictionPolicy::Lru, 1), (EvictionPolicy::Mru, 0), (EvictionPolicy::Fifo, 0)]
    {
        let c = pooled_with(12, 4, policy);
        let mut held = Vec::new();
        for k in 0..3u32 {
            let mut s = Vec::new();
            c.alloc(4, &mut s).unwrap();
            c.insert(0, &[k * 10, k * 10 + 1, k * 10 + 2, k * 10 + 3], &s).unwrap();
            held.push(s);
        }
        let mut out: Vec<u32> = Vec::new();
        c.match_prefix(0, &[0, 1, 2, 3], &mut out);
        let mut s = Vec::new();
        c.alloc(4, &mut s).unwrap();
        s.sort_unstable();
        held[victim].sort_unstable();
        assert_eq!(s, held[victim], "{policy}");
        conserved(&c, 4);
    }
}

#[test]
fn a_detached_request_holds_its_slots_and_pin_and_attaches_back_only_to_its_cache() {
    let c = pooled(64, 4);
    let other = pooled(64, 4);
    let prompt: Vec<u32> = (1..=10).collect();
    let mut r = c.admit(0, &prompt).unwrap();
    r.checkpoint().unwrap();
    let slots = r.slots().to_vec();
    let d = r.detach();
    assert_eq!(d.len(), 10);
    // Still held while detached: the pin on the 2 checkpointed pages and the third page.
    assert_eq!(c.stats().tree.protected_tokens, 8);
    conserved(&c, 4);
    // Another cache hands it back unchanged.
    let d = other.attach(d).unwrap_err();
    assert_eq!(other.stats().tree.protected_tokens, 0);
    let mut r = c.attach(d).unwrap();
    assert_eq!((r.slots(), r.cached_len(), r.locked_len()), (&slots[..], 0, 8));
    r.extend(&[11, 12]).unwrap();
    assert_eq!(r.finish().unwrap(), 8);
    conserved(&c, 0);
    assert_eq!(c.stats().tree.protected_tokens, 0);
    // Detached and attached again, then dropped: it aborts as a request does.
    let r = c.admit(0, &(1..=20).collect::<Vec<_>>()).unwrap();
    assert_eq!(r.cached_len(), 12);
    drop(c.attach(r.detach()).unwrap());
    conserved(&c, 0);
    assert_eq!(c.stats().tree.protected_tokens, 0);
}
