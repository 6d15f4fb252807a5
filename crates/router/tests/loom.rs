//! Loom models of the router index's protocols (`RUSTFLAGS="--cfg loom --cfg
//! crossbeam_loom"`, `LOOM_MAX_PREEMPTIONS=2`, `--release`): publication of a new block, a
//! coverage change (an entry into a full record: its overflow array published), a medium
//! change, a store's grouped version bump ending at an upgrade, removal and reclaim, the
//! per-worker prefix rule under two removals, worker removal, a worker moving slots under a
//! find, clear, a table rebuild, and two writers on one block. Each model is small
//! (block size 1, at most four blocks, one shard, five worker slots).
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use radixkv::events::Medium;
use radixkv_router::{FindScratch, GapPolicy, RouterIndex, RouterOptions, Worker};

const A: Worker = Worker { worker_id: 1, dp_rank: 0 };
const B: Worker = Worker { worker_id: 2, dp_rank: 0 };
const C: Worker = Worker { worker_id: 3, dp_rank: 0 };
const D: Worker = Worker { worker_id: 4, dp_rank: 1 };
const E: Worker = Worker { worker_id: 5, dp_rank: 0 };

/// `loom::model` with room for the index's many atomic steps per execution (the
/// preemption bound still comes from `LOOM_MAX_PREEMPTIONS`).
fn model(f: impl Fn() + Sync + Send + 'static) {
    model_bounded(usize::MAX, f);
}

/// [`model`] with at most `bound` preemptions (fewer than `LOOM_MAX_PREEMPTIONS` when a
/// model's race needs fewer and its writer is long).
fn model_bounded(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.max_branches = 100_000;
    b.preemption_bound = b.preemption_bound.map(|p| p.min(bound)).or(Some(bound));
    b.check(f);
}

fn index() -> RouterIndex {
    RouterIndex::new(RouterOptions { block_size: 1, max_workers: 5, gap_policy: GapPolicy::Clear })
        .unwrap()
}

/// (worker id, device blocks, any blocks), sorted.
fn find(idx: &RouterIndex, tokens: &[u32]) -> Vec<(u64, u32, u32)> {
    let mut out = Vec::new();
    idx.find_with(&mut FindScratch::new(), tokens, None, None, &mut out);
    let mut v: Vec<_> =
        out.iter().map(|s| (s.worker.worker_id, s.device_blocks, s.any_blocks)).collect();
    v.sort();
    v
}

fn store(idx: &RouterIndex, w: Worker, parent: Option<u64>, hashes: &[u64], tokens: &[u32]) {
    idx.stored(w, None, None, parent, hashes, tokens, Medium::Gpu).unwrap();
}

fn empty_after_all_gone(idx: &RouterIndex, ws: &[Worker]) {
    for w in ws {
        idx.remove_worker(*w);
    }
    let s = idx.stats();
    assert_eq!((s.workers, s.blocks, s.memberships), (0, 0, 0));
    assert_eq!(s.bytes, idx.empty_bytes() as u64);
}

#[test]
fn new_block_is_published_parent_first() {
    model(|| {
        let idx = Arc::new(index());
        let i2 = idx.clone();
        let t = thread::spawn(move || store(&i2, A, None, &[1, 2], &[10, 11]));
        let got = find(&idx, &[10, 11]);
        assert!(got.is_empty() || got == [(1, 1, 1)] || got == [(1, 2, 2)], "{got:?}");
        t.join().unwrap();
        assert_eq!(find(&idx, &[10, 11]), [(1, 2, 2)]);
        empty_after_all_gone(&idx, &[A]);
    });
}

#[test]
fn upgrade_ends_a_store_segment() {
    model(|| {
        let idx = Arc::new(index());
        idx.stored(A, None, None, None, &[1], &[10], Medium::CpuPinned).unwrap();
        let i2 = idx.clone();
        // One device store: block 1 gains the device copy (an upgrade), block 2 is new;
        // the upgrade ends the store's segment, so the new block has a bump of its own.
        let t = thread::spawn(move || store(&i2, A, None, &[1, 2], &[10, 11]));
        let got = find(&idx, &[10, 11]);
        // Before, after block 1, after both; never the new block without the upgrade.
        assert!(got == [(1, 0, 1)] || got == [(1, 1, 1)] || got == [(1, 2, 2)], "{got:?}");
        t.join().unwrap();
        assert_eq!(find(&idx, &[10, 11]), [(1, 2, 2)]);
        empty_after_all_gone(&idx, &[A]);
    });
}

#[test]
fn coverage_change_into_a_full_record() {
    model(|| {
        let idx = Arc::new(index());
        // Three holders inline, a fourth in a one-entry overflow array (its loom size).
        for w in [B, C, D, E] {
            store(&idx, w, None, &[1], &[10]);
        }
        let i2 = idx.clone();
        // A fifth holder: the overflow array is full, so a larger one is made, the old
        // entry copied in, and published.
        let t = thread::spawn(move || store(&i2, A, None, &[1], &[10]));
        let got = find(&idx, &[10]);
        let others = [(2, 1, 1), (3, 1, 1), (4, 1, 1), (5, 1, 1)];
        assert!(
            got == others || got == [(1, 1, 1), (2, 1, 1), (3, 1, 1), (4, 1, 1), (5, 1, 1)],
            "{got:?}"
        );
        t.join().unwrap();
        assert_eq!(find(&idx, &[10]).len(), 5);
        empty_after_all_gone(&idx, &[A, B, C, D, E]);
    });
}

#[test]
fn medium_change_is_one_store() {
    model(|| {
        let idx = Arc::new(index());
        store(&idx, A, None, &[1], &[10]);
        let i2 = idx.clone();
        let t = thread::spawn(move || {
            i2.stored(A, None, None, None, &[1], &[10], Medium::CpuPinned).unwrap();
            i2.removed(A, &[1], Medium::Gpu).unwrap();
        });
        let got = find(&idx, &[10]);
        assert!(got == [(1, 1, 1)] || got == [(1, 0, 1)], "{got:?}");
        t.join().unwrap();
        assert_eq!(find(&idx, &[10]), [(1, 0, 1)]);
        empty_after_all_gone(&idx, &[A]);
    });
}

#[test]
fn removal_unlinks_and_reclaims() {
    model(|| {
        let idx = Arc::new(index());
        store(&idx, A, None, &[1, 2], &[10, 11]);
        let i2 = idx.clone();
        let t = thread::spawn(move || i2.removed(A, &[1], Medium::Gpu).unwrap());
        let got = find(&idx, &[10, 11]);
        assert!(got.is_empty() || got == [(1, 2, 2)], "{got:?}");
        t.join().unwrap();
        assert!(find(&idx, &[10, 11]).is_empty());
        assert_eq!(idx.stats().blocks, 1);
        empty_after_all_gone(&idx, &[A]);
    });
}

#[test]
fn two_removals_give_a_prefix_state() {
    model(|| {
        let idx = Arc::new(index());
        store(&idx, A, None, &[1, 2, 3], &[10, 11, 12]);
        let i2 = idx.clone();
        // States: 3 blocks, then 0 (block 0 gone), then 0. Reading block 0 before the first
        // removal and block 2 after the second must not give 2.
        let t = thread::spawn(move || {
            i2.removed(A, &[1], Medium::Gpu).unwrap();
            i2.removed(A, &[3], Medium::Gpu).unwrap();
        });
        let got = find(&idx, &[10, 11, 12]);
        assert!(got.is_empty() || got == [(1, 3, 3)], "{got:?}");
        t.join().unwrap();
        empty_after_all_gone(&idx, &[A]);
    });
}

#[test]
fn worker_removal_is_atomic() {
    model(|| {
        let idx = Arc::new(index());
        store(&idx, A, None, &[1, 2, 3], &[10, 11, 12]);
        let i2 = idx.clone();
        let t = thread::spawn(move || assert!(i2.remove_worker(A)));
        let got = find(&idx, &[10, 11, 12]);
        assert!(got.is_empty() || got == [(1, 3, 3)], "{got:?}");
        t.join().unwrap();
        assert!(find(&idx, &[10, 11, 12]).is_empty());
        empty_after_all_gone(&idx, &[]);
    });
}

/// A worker removed and added again under a find can be met in two slots: A, B and C hold
/// block 1 (C keeps the record alive and a third slot taken, so the free list is not
/// reset); the writer removes A then B, and A comes back in B's old slot. A find lists A
/// at most once. Sized to the race: it needs one preemption (the reader stopped between its
/// checks of A's slot and B's, the writer running to its end), and the writer's three calls
/// make two take about 8 minutes (one: 30 s; the mutants R8 and R9 fail it at one).
#[test]
fn a_worker_moving_slots_is_listed_once() {
    model_bounded(1, || {
        let idx = Arc::new(index());
        store(&idx, A, None, &[1], &[10]);
        store(&idx, B, None, &[1], &[10]);
        store(&idx, C, None, &[1], &[10]);
        let i2 = idx.clone();
        let t = thread::spawn(move || {
            assert!(i2.remove_worker(A));
            assert!(i2.remove_worker(B));
            store(&i2, A, None, &[1], &[10]);
        });
        let got = find(&idx, &[10]);
        let ids: Vec<u64> = got.iter().map(|g| g.0).collect();
        assert!(
            [&[1, 2, 3][..], &[2, 3], &[3], &[1, 3]].contains(&&ids[..]),
            "a worker listed twice, or a state no order of the events gives: {got:?}"
        );
        t.join().unwrap();
        assert_eq!(find(&idx, &[10]), [(1, 1, 1), (3, 1, 1)]);
        empty_after_all_gone(&idx, &[A, C]);
    });
}

#[test]
fn clear_is_atomic() {
    model(|| {
        let idx = Arc::new(index());
        store(&idx, A, None, &[1, 2, 3], &[10, 11, 12]);
        let i2 = idx.clone();
        let t = thread::spawn(move || {
            i2.cleared(A);
            store(&i2, A, None, &[1], &[10]);
        });
        let got = find(&idx, &[10, 11, 12]);
        assert!(got.is_empty() || got == [(1, 3, 3)] || got == [(1, 1, 1)], "{got:?}");
        t.join().unwrap();
        assert_eq!(find(&idx, &[10, 11, 12]), [(1, 1, 1)]);
        empty_after_all_gone(&idx, &[A]);
    });
}

#[test]
fn table_rebuild_keeps_every_block() {
    model(|| {
        let idx = Arc::new(index());
        store(&idx, A, None, &[1, 2, 3], &[10, 11, 12]);
        let i2 = idx.clone();
        // A fourth record: the shard's 4-slot table is rebuilt into a larger one.
        let t = thread::spawn(move || store(&i2, B, None, &[7], &[20]));
        assert_eq!(find(&idx, &[10, 11, 12]), [(1, 3, 3)]);
        t.join().unwrap();
        assert_eq!(find(&idx, &[20]), [(2, 1, 1)]);
        empty_after_all_gone(&idx, &[A, B]);
    });
}

#[test]
fn two_writers_one_block() {
    model(|| {
        let idx = Arc::new(index());
        let i1 = idx.clone();
        // Two threads write the same block (one record, one shard lock) for two workers;
        // the main thread reads after its own store.
        let t1 = thread::spawn(move || store(&i1, A, None, &[1], &[10]));
        store(&idx, B, None, &[5], &[10]);
        let got = find(&idx, &[10]);
        assert!(got == [(2, 1, 1)] || got == [(1, 1, 1), (2, 1, 1)], "{got:?}");
        t1.join().unwrap();
        assert_eq!(find(&idx, &[10]), [(1, 1, 1), (2, 1, 1)]);
        empty_after_all_gone(&idx, &[A, B]);
    });
}
