//! KV cache groups (issue 29): the index takes a full-attention group's events and skips
//! a hybrid model's other groups (sliding window, Mamba, unknown kinds), counted and not
//! refused, whatever hashes they name: Dynamo's rule, learned per worker from the stores.

use radixkv::events::wire::{Encoding, KvCacheSpecKind, KvGroup, WireOptions, encode_batch};
use radixkv::events::{EventBatch, KvEvent, Medium};
use radixkv_router::{
    BatchReport, DumpGroup, RouterError, RouterIndex, RouterOptions, Score, Worker, WorkerDump,
};

fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids: tokens.to_vec(),
        block_size: 4,
        lora_name: None,
        cache_salt: None,
        medium: Medium::Gpu,
    }
}

fn removed(hashes: &[u64]) -> KvEvent {
    KvEvent::BlockRemoved { block_hashes: hashes.to_vec(), medium: Medium::Gpu }
}

/// One batch of `events` published by a cache of `group`, in `encoding`.
fn batch(group: KvGroup, encoding: Encoding, events: Vec<KvEvent>) -> Vec<u8> {
    let o = WireOptions { encoding, group, ..Default::default() };
    encode_batch(&EventBatch { ts: 0.0, events }, &o)
}

fn group(idx: u32, kind: KvCacheSpecKind, window: Option<u32>) -> KvGroup {
    KvGroup::new(idx, kind, window).unwrap()
}

fn scores(idx: &RouterIndex, tokens: &[u32]) -> Vec<Score> {
    let mut out = Vec::new();
    idx.find(tokens, None, None, &mut out);
    out.sort();
    out
}

fn report(events: usize, other_groups: usize) -> BatchReport {
    BatchReport { events, other_groups, ..Default::default() }
}

#[test]
fn other_groups_are_skipped_counted_and_change_nothing() {
    use KvCacheSpecKind::*;
    for encoding in [Encoding::VllmArray, Encoding::VllmMap] {
        let idx = RouterIndex::new(RouterOptions { block_size: 4, ..Default::default() }).unwrap();
        let empty = idx.stats().bytes;
        let t: Vec<u32> = (0..8).collect();
        let w = Worker::new(1, 0);
        let full = KvGroup::default();
        let sliding = group(1, SlidingWindow, Some(4));
        // One engine stream, as vLLM's: the full-attention group 0 and a sliding-window
        // group 1 over the same tokens (the window group names its own hashes).
        let ok = idx.apply_batch(1, 0, &batch(full, encoding, vec![stored(&[1, 2], None, &t)]));
        assert_eq!(ok, Ok(report(1, 0)));
        let held = |idx: &RouterIndex| {
            let d = idx.dump();
            (d[0].blocks.clone(), idx.stats().blocks, idx.stats().memberships)
        };
        let before = held(&idx);
        let r =
            idx.apply_batch(1, 1, &batch(sliding, encoding, vec![stored(&[101, 102], None, &t)]));
        assert_eq!(r, Ok(report(1, 1)));
        // Its removals (a removal carries no kind: the group's, learned from its store),
        // even of hashes the full group holds, are skipped: nothing refused or removed.
        let r = idx.apply_batch(1, 2, &batch(sliding, encoding, vec![removed(&[101, 1, 2])]));
        assert_eq!(r, Ok(report(1, 1)));
        // A Mamba group, an unknown kind, and a removal of a group no store has named.
        let mamba = group(2, Mamba, None);
        let r = idx.apply_batch(1, 3, &batch(mamba, encoding, vec![stored(&[201], None, &t[..4])]));
        assert_eq!(r, Ok(report(1, 1)));
        let unknown = group(4, Unknown, None);
        let r =
            idx.apply_batch(1, 4, &batch(unknown, encoding, vec![stored(&[301], None, &t[..4])]));
        assert_eq!(r, Ok(report(1, 1)));
        let unseen = group(5, FullAttention, None);
        let r = idx.apply_batch(1, 5, &batch(unseen, encoding, vec![removed(&[1])]));
        assert_eq!(r, Ok(report(1, 1)), "a removal of a group never stored to");
        assert_eq!(held(&idx), before);
        assert_eq!(scores(&idx, &t), vec![Score { worker: w, device_blocks: 2, any_blocks: 2 }]);
        let s = idx.stats();
        assert_eq!((s.other_groups, s.refused_total()), (5, 0));
        assert_eq!(idx.next_seq(w), Some(6), "skipped events still move the cursor");

        // Another full-attention kind in a group other than 0 is indexed, and its removals
        // (learned from its store) apply.
        let mla = group(3, MlaAttention, None);
        let t2: Vec<u32> = (100..108).collect();
        let r = idx.apply_batch(1, 6, &batch(mla, encoding, vec![stored(&[7, 8], None, &t2)]));
        assert_eq!(r, Ok(report(1, 0)));
        assert_eq!(scores(&idx, &t2), vec![Score { worker: w, device_blocks: 2, any_blocks: 2 }]);
        let r = idx.apply_batch(1, 7, &batch(mla, encoding, vec![removed(&[8])]));
        assert_eq!(r, Ok(report(1, 0)));
        assert_eq!(scores(&idx, &t2), vec![Score { worker: w, device_blocks: 1, any_blocks: 1 }]);
        // The full group's own removal applies; AllBlocksCleared (no group) clears all.
        let r = idx.apply_batch(1, 8, &batch(full, encoding, vec![removed(&[2])]));
        assert_eq!(r, Ok(report(1, 0)));
        assert_eq!(scores(&idx, &t), vec![Score { worker: w, device_blocks: 1, any_blocks: 1 }]);
        let r = idx.apply_batch(1, 9, &batch(sliding, encoding, vec![KvEvent::AllBlocksCleared]));
        assert_eq!(r, Ok(report(1, 0)));
        assert!(scores(&idx, &t).is_empty() && scores(&idx, &t2).is_empty());
        // What the stores taught goes with the worker: the index is back to its empty size.
        assert!(idx.remove_worker(w));
        idx.reclaim();
        assert_eq!(idx.stats().bytes, empty, "{encoding:?}");
    }
}

/// A model whose group 0 is the sliding-window one: once its store says so, group 0's
/// removals are skipped too, and the full-attention group 1 is the one indexed.
#[test]
fn group_0_of_another_kind_is_learned_and_skipped() {
    let idx = RouterIndex::new(RouterOptions { block_size: 4, ..Default::default() }).unwrap();
    let t: Vec<u32> = (0..8).collect();
    let w = Worker::new(9, 0);
    let g0 = group(0, KvCacheSpecKind::SlidingWindowMla, Some(128));
    let g1 = group(1, KvCacheSpecKind::FullAttention, None);
    let a = Encoding::VllmArray;
    assert_eq!(
        idx.apply_batch(9, 0, &batch(g1, a, vec![stored(&[1, 2], None, &t)])),
        Ok(report(1, 0))
    );
    assert_eq!(
        idx.apply_batch(9, 1, &batch(g0, a, vec![stored(&[1], None, &t[..4])])),
        Ok(report(1, 1))
    );
    assert_eq!(idx.apply_batch(9, 2, &batch(g0, a, vec![removed(&[1])])), Ok(report(1, 1)));
    assert_eq!(scores(&idx, &t), vec![Score { worker: w, device_blocks: 2, any_blocks: 2 }]);
    assert_eq!(idx.apply_batch(9, 3, &batch(g1, a, vec![removed(&[2])])), Ok(report(1, 0)));
    assert_eq!(scores(&idx, &t), vec![Score { worker: w, device_blocks: 1, any_blocks: 1 }]);
    assert_eq!(idx.stats().refused_total(), 0);
}

/// Events without group fields (SGLang's short store, ending at `lora_id`) are taken.
#[test]
fn events_without_group_fields_are_taken() {
    let idx = RouterIndex::new(RouterOptions { block_size: 4, ..Default::default() }).unwrap();
    let t: Vec<u32> = (0..4).collect();
    let ev = ("BlockStored", [5u64], Option::<u64>::None, t.clone(), 4u32, Option::<u64>::None);
    let payload = rmp_serde::to_vec(&(0.0f64, [ev], 0u32)).unwrap();
    assert_eq!(idx.apply_batch(4, 0, &payload), Ok(report(1, 0)));
    let w = Worker::new(4, 0);
    assert_eq!(scores(&idx, &t), vec![Score { worker: w, device_blocks: 1, any_blocks: 1 }]);
}

/// A dump keeps what the stores taught (issue 29's follow-up): after a restore, a removal
/// of a group a store taught is main attention (group 3, MLA) still applies, and one of a
/// group 0 taught to be a sliding window is still skipped. A dump without the kinds (one
/// from before they were saved) restores as "none learned": those removals go the other way.
#[test]
fn a_dump_keeps_the_group_kinds_stores_taught() {
    use KvCacheSpecKind::*;
    let opts = RouterOptions { block_size: 4, ..Default::default() };
    let idx = RouterIndex::new(opts).unwrap();
    let a = Encoding::VllmArray;
    let (t, t2): (Vec<u32>, Vec<u32>) = ((0..8).collect(), (100..108).collect());
    let (w1, w2) = (Worker::new(1, 0), Worker::new(2, 0));
    let (full, mla) = (KvGroup::default(), group(3, MlaAttention, None));
    let (sliding0, full1) = (group(0, SlidingWindow, Some(4)), group(1, FullAttention, None));
    // Worker 1: group 0 full (the default), group 3 MLA (learned: indexed).
    idx.apply_batch(1, 0, &batch(full, a, vec![stored(&[1, 2], None, &t)])).unwrap();
    idx.apply_batch(1, 1, &batch(mla, a, vec![stored(&[7, 8], None, &t2)])).unwrap();
    // Worker 2: group 0 a sliding window (learned: skipped), group 1 full (learned: indexed).
    idx.apply_batch(2, 0, &batch(full1, a, vec![stored(&[5, 6], None, &t)])).unwrap();
    let r = idx.apply_batch(2, 1, &batch(sliding0, a, vec![stored(&[5], None, &t[..4])]));
    assert_eq!(r, Ok(report(1, 1)));
    let d = idx.dump();
    let kinds = |d: &[WorkerDump]| -> Vec<Vec<(u32, bool)>> {
        d.iter()
            .map(|w| w.groups.iter().map(|g| (g.group_idx, g.main_attention)).collect())
            .collect()
    };
    assert_eq!(kinds(&d), vec![vec![(3, true)], vec![(0, false), (1, true)]]);

    // Removals with group fields and no kind, as vLLM sends them.
    let removals = |idx: &RouterIndex| {
        let r1 = idx.apply_batch(1, 2, &batch(mla, a, vec![removed(&[8])])).unwrap();
        let r2 = idx.apply_batch(2, 2, &batch(sliding0, a, vec![removed(&[6])])).unwrap();
        let r3 = idx.apply_batch(2, 3, &batch(full1, a, vec![removed(&[6])])).unwrap();
        (r1.other_groups, r2.other_groups, r3.other_groups, scores(idx, &t2), scores(idx, &t))
    };
    let one = |w: Worker, n: u32| Score { worker: w, device_blocks: n, any_blocks: n };
    let restored = RouterIndex::restore(opts, &d).unwrap();
    assert_eq!(restored.dump(), d, "the kinds round-trip");
    let before = removals(&idx);
    assert_eq!(before, (0, 1, 0, vec![one(w1, 1)], vec![one(w1, 2), one(w2, 1)]));
    assert_eq!(removals(&restored), before, "a restored index takes and skips them alike");

    // A dump without kinds: group 3's removal is skipped (a group other than 0 no store
    // named) and so is group 1's; group 0's is taken (it removes worker 2's hash 6, which
    // its group 1 stored).
    let old: Vec<WorkerDump> =
        d.iter().map(|w| WorkerDump { groups: vec![], ..w.clone() }).collect();
    let unlearned = RouterIndex::restore(opts, &old).unwrap();
    assert_eq!(kinds(&unlearned.dump()), vec![vec![], vec![]]);
    let after = removals(&unlearned);
    assert_eq!((after.0, after.1, after.2), (1, 0, 1));
    assert_eq!(after.3, vec![one(w1, 2)], "group 3's removal skipped");
}

/// A restore refuses a group listed twice for a worker; a group listed with the kind an
/// unnamed group has anyway is dropped (the next dump leaves it out).
#[test]
fn restore_checks_the_group_kinds() {
    let opts = RouterOptions { block_size: 4, ..Default::default() };
    let g = |group_idx, main_attention| DumpGroup { group_idx, main_attention };
    let wd =
        |groups| WorkerDump { worker: Worker::new(1, 0), next_seq: None, blocks: vec![], groups };
    let twice = [wd(vec![g(3, true), g(3, false)])];
    assert_eq!(
        RouterIndex::restore(opts, &twice).err(),
        Some(RouterError::BadDump { worker: Worker::new(1, 0) })
    );
    let defaults = [wd(vec![g(0, true), g(2, false), g(4, true)])];
    let idx = RouterIndex::restore(opts, &defaults).unwrap();
    assert_eq!(idx.dump(), [wd(vec![g(4, true)])]);
}
