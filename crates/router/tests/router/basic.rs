//! Unit cases: the spec's hash vectors, options, media, namespaces, cursors.

use radixkv::events::Medium;
use radixkv_router::{
    GapPolicy, Refusal, RouterError, RouterIndex, RouterOptions, Score, Worker, chain_key,
    content_hashes,
};

fn idx16() -> RouterIndex {
    RouterIndex::new(RouterOptions::default()).unwrap()
}

#[test]
fn keys_are_the_dynamo_sequence_hashes() {
    // KV_EVENTS.md's vectors: tokens 1..16 and 17..32, seed 1337.
    let t: Vec<u32> = (1..=32).collect();
    let mut c = Vec::new();
    content_hashes(&t, 16, None, None, &mut c);
    assert_eq!(c, vec![16863443419780771464, 2287610619914608821]);
    assert_eq!(chain_key(Some(c[0]), c[1]), 12466389667045779788);
    // An engine that publishes those hashes is found by tokens.
    let idx = idx16();
    let w = Worker::new(7, 0);
    idx.stored(w, None, None, None, &[16863443419780771464, 12466389667045779788], &t, Medium::Gpu)
        .unwrap();
    let mut out = Vec::new();
    idx.find(&t, None, None, &mut out);
    assert_eq!(out, vec![Score { worker: w, device_blocks: 2, any_blocks: 2 }]);
    // Another namespace with the same tokens does not overlap.
    idx.find(&t, Some("adapter"), None, &mut out);
    assert!(out.is_empty());
    idx.find(&t, None, Some("tenant"), &mut out);
    assert!(out.is_empty());
}

#[test]
fn engines_with_other_hashes_share_blocks() {
    let idx = idx16();
    let t: Vec<u32> = (0..48).collect();
    let (a, b) = (Worker::new(1, 0), Worker::new(2, 3));
    idx.stored(a, None, None, None, &[10, 11, 12], &t, Medium::Gpu).unwrap();
    idx.stored(b, None, None, None, &[900, 901], &t[..32], Medium::Gpu).unwrap();
    let mut out = Vec::new();
    idx.find(&t, None, None, &mut out);
    out.sort();
    assert_eq!(
        out,
        vec![
            Score { worker: a, device_blocks: 3, any_blocks: 3 },
            Score { worker: b, device_blocks: 2, any_blocks: 2 }
        ]
    );
    let s = idx.stats();
    assert_eq!((s.workers, s.blocks, s.memberships), (2, 3, 5));
}

#[test]
fn media_holes_and_host_copies() {
    let idx = idx16();
    let t: Vec<u32> = (0..64).collect();
    let w = Worker::new(1, 0);
    idx.stored(w, None, None, None, &[1, 2, 3, 4], &t, Medium::Gpu).unwrap();
    idx.stored(w, None, None, Some(2), &[3], &t[32..48], Medium::CpuPinned).unwrap();
    // Block 2 leaves the device but keeps its host copy: device 2, any 4.
    idx.removed(w, &[3], Medium::Gpu).unwrap();
    let mut out = Vec::new();
    idx.find(&t, None, None, &mut out);
    assert_eq!(out, vec![Score { worker: w, device_blocks: 2, any_blocks: 4 }]);
    // A hole at block 1: both stop there.
    idx.removed(w, &[2], Medium::Gpu).unwrap();
    idx.find(&t, None, None, &mut out);
    assert_eq!(out, vec![Score { worker: w, device_blocks: 1, any_blocks: 1 }]);
    // Unknown removals are refused and counted; storing under a removed parent too.
    assert_eq!(
        idx.removed(w, &[2, 99], Medium::Gpu),
        Err(RouterError::UnknownRemovals { count: 2 })
    );
    assert_eq!(
        idx.stored(w, None, None, Some(2), &[3], &t[32..48], Medium::Gpu),
        Err(RouterError::UnknownParent { parent: 2 })
    );
    // A host-only worker is listed with device 0.
    let h = Worker::new(5, 0);
    idx.stored(h, None, None, None, &[50], &t[..16], Medium::CpuPinned).unwrap();
    idx.find(&t, None, None, &mut out);
    out.sort();
    assert_eq!(out[1], Score { worker: h, device_blocks: 0, any_blocks: 1 });
    let s = idx.stats();
    assert_eq!(s.refused(Refusal::UnknownRemoval), 2);
    assert_eq!(s.refused(Refusal::UnknownParent), 1);
}

#[test]
fn duplicates_change_nothing_and_one_removal_removes() {
    let idx = idx16();
    let t: Vec<u32> = (0..32).collect();
    let w = Worker::new(1, 0);
    for _ in 0..3 {
        idx.stored(w, None, None, None, &[1, 2], &t, Medium::Gpu).unwrap();
    }
    assert_eq!(idx.stats().memberships, 2);
    idx.removed(w, &[2], Medium::Gpu).unwrap();
    let mut out = Vec::new();
    idx.find(&t, None, None, &mut out);
    assert_eq!(out[0].any_blocks, 1);
}

#[test]
fn twins_hold_until_the_last_name_goes() {
    let idx = idx16();
    let t: Vec<u32> = (0..16).collect();
    let w = Worker::new(1, 0);
    idx.stored(w, None, None, None, &[1], &t, Medium::Gpu).unwrap();
    idx.stored(w, None, None, None, &[2], &t, Medium::Gpu).unwrap();
    assert_eq!(idx.stats().memberships, 1);
    idx.removed(w, &[1], Medium::Gpu).unwrap();
    let mut out = Vec::new();
    idx.find(&t, None, None, &mut out);
    assert_eq!(out.len(), 1);
    idx.removed(w, &[2], Medium::Gpu).unwrap();
    idx.find(&t, None, None, &mut out);
    assert!(out.is_empty());
    assert_eq!(idx.stats().blocks, 0);
}

#[test]
fn options_and_worker_cap() {
    assert!(matches!(
        RouterIndex::new(RouterOptions { block_size: 0, ..Default::default() }),
        Err(RouterError::InvalidOptions { block_size: 0, .. })
    ));
    let idx = RouterIndex::new(RouterOptions {
        block_size: 1,
        max_workers: 2,
        gap_policy: GapPolicy::Clear,
    })
    .unwrap();
    idx.stored(Worker::new(1, 0), None, None, None, &[1], &[5], Medium::Gpu).unwrap();
    idx.stored(Worker::new(2, 0), None, None, None, &[1], &[5], Medium::Gpu).unwrap();
    assert_eq!(
        idx.stored(Worker::new(3, 0), None, None, None, &[1], &[5], Medium::Gpu),
        Err(RouterError::TooManyWorkers { max_workers: 2 })
    );
    assert!(idx.remove_worker(Worker::new(1, 0)));
    idx.stored(Worker::new(3, 0), None, None, None, &[1], &[5], Medium::Gpu).unwrap();
    let mut out = Vec::new();
    idx.find(&[5], None, None, &mut out);
    out.sort();
    assert_eq!(out.iter().map(|s| s.worker.worker_id).collect::<Vec<_>>(), vec![2, 3]);
    // 4096 workers are supported.
    let big =
        RouterIndex::new(RouterOptions { block_size: 1, max_workers: 4096, ..Default::default() })
            .unwrap();
    for i in 0..4096u64 {
        big.stored(Worker::new(i, 0), None, None, None, &[i], &[9], Medium::Gpu).unwrap();
    }
    big.find(&[9], None, None, &mut out);
    assert_eq!(out.len(), 4096);
    assert_eq!(big.stats().blocks, 1);
}
