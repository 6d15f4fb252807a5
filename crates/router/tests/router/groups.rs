//! KV cache groups (issue 29): the index takes a full-attention group's events and skips
//! a hybrid model's other groups (sliding window, Mamba, unknown kinds), counted and not
//! refused, whatever hashes they name: Dynamo's rule, learned per worker from the stores.

use radixkv::events::wire::{Encoding, KvCacheSpecKind, KvGroup, WireOptions, encode_batch};
use radixkv::events::{EventBatch, KvEvent, Medium};
use radixkv_router::{BatchReport, RouterIndex, RouterOptions, Score, Worker};

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
