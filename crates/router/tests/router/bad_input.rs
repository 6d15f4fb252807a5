//! Bad input: payloads that do not decode, wrong types and lengths, unaligned and empty
//! stores. Each is refused and counted; the index and the other workers are untouched.

use radixkv::events::wire::{Encoding, WireOptions, encode_batch};
use radixkv::events::{EventBatch, KvEvent, Medium};
use radixkv_router::{Refusal, RouterError, RouterIndex, RouterOptions, Score, Worker};

fn good_payload(hashes: &[u64], tokens: &[u32]) -> Vec<u8> {
    let ev = KvEvent::BlockStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: None,
        token_ids: tokens.to_vec(),
        block_size: 4,
        lora_name: None,
        cache_salt: None,
        medium: Medium::Gpu,
    };
    encode_batch(&EventBatch { ts: 0.0, events: vec![ev] }, &WireOptions::default())
}

fn msgpack(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut v = Vec::new();
    f(&mut v);
    v
}

#[test]
fn malformed_batches_are_refused_whole() {
    let idx = RouterIndex::new(RouterOptions { block_size: 4, ..Default::default() }).unwrap();
    let t: Vec<u32> = (0..8).collect();
    idx.apply_batch(1, 0, &good_payload(&[1, 2], &t)).unwrap();
    let before = idx.dump();
    let good = good_payload(&[3, 4], &t);
    let mut bad: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xc1],                      // a reserved byte
        good[..good.len() / 2].to_vec(), // truncated
        msgpack(|v| rmp::encode::write_str(v, "not a batch").unwrap()),
        msgpack(|v| {
            // [ts, events: 7, rank]
            rmp::encode::write_array_len(v, 3).unwrap();
            rmp::encode::write_f64(v, 0.0).unwrap();
            rmp::encode::write_uint(v, 7).unwrap();
            rmp::encode::write_nil(v).unwrap();
        }),
        msgpack(|v| {
            // An unknown event tag.
            rmp::encode::write_array_len(v, 3).unwrap();
            rmp::encode::write_f64(v, 0.0).unwrap();
            rmp::encode::write_array_len(v, 1).unwrap();
            rmp::encode::write_array_len(v, 1).unwrap();
            rmp::encode::write_str(v, "BlockExploded").unwrap();
            rmp::encode::write_nil(v).unwrap();
        }),
        msgpack(|v| {
            // A token id that is not an integer, after a good event: nothing applies.
            rmp::encode::write_array_len(v, 3).unwrap();
            rmp::encode::write_f64(v, 0.0).unwrap();
            rmp::encode::write_array_len(v, 2).unwrap();
            rmp::encode::write_array_len(v, 1).unwrap();
            rmp::encode::write_str(v, "AllBlocksCleared").unwrap();
            rmp::encode::write_array_len(v, 5).unwrap();
            rmp::encode::write_str(v, "BlockStored").unwrap();
            rmp::encode::write_array_len(v, 1).unwrap();
            rmp::encode::write_uint(v, 5).unwrap();
            rmp::encode::write_nil(v).unwrap();
            rmp::encode::write_array_len(v, 1).unwrap();
            rmp::encode::write_str(v, "x").unwrap();
            rmp::encode::write_uint(v, 4).unwrap();
            rmp::encode::write_nil(v).unwrap();
        }),
        msgpack(|v| {
            // An absurd array length with nothing behind it.
            rmp::encode::write_array_len(v, 3).unwrap();
            rmp::encode::write_f64(v, 0.0).unwrap();
            rmp::encode::write_array_len(v, u32::MAX).unwrap();
        }),
        msgpack(|v| {
            // A negative dp rank.
            rmp::encode::write_array_len(v, 3).unwrap();
            rmp::encode::write_f64(v, 0.0).unwrap();
            rmp::encode::write_array_len(v, 0).unwrap();
            rmp::encode::write_sint(v, -3).unwrap();
        }),
    ];
    bad.push(msgpack(|v| {
        // Unknown medium.
        rmp::encode::write_array_len(v, 3).unwrap();
        rmp::encode::write_f64(v, 0.0).unwrap();
        rmp::encode::write_array_len(v, 1).unwrap();
        rmp::encode::write_array_len(v, 4).unwrap();
        rmp::encode::write_str(v, "BlockRemoved").unwrap();
        rmp::encode::write_array_len(v, 1).unwrap();
        rmp::encode::write_uint(v, 1).unwrap();
        rmp::encode::write_str(v, "FLOPPY").unwrap();
        rmp::encode::write_uint(v, 0).unwrap();
    }));
    for (i, p) in bad.iter().enumerate() {
        let r = idx.apply_batch(1, 1, p);
        assert!(matches!(r, Err(RouterError::Malformed { .. })), "payload {i}: {r:?}");
    }
    assert_eq!(idx.dump(), before, "nothing applied");
    assert_eq!(idx.stats().refused(Refusal::Malformed), bad.len() as u64);
    // The cursor did not move: seq 1 is still the next one.
    assert_eq!(idx.next_seq(Worker::new(1, 0)), Some(1));
    idx.apply_batch(1, 1, &good).unwrap();
    let mut out = Vec::new();
    idx.find(&t, None, None, &mut out);
    assert_eq!(out, vec![Score { worker: Worker::new(1, 0), device_blocks: 2, any_blocks: 2 }]);
}

#[test]
fn unaligned_and_empty_stores_are_refused() {
    let idx = RouterIndex::new(RouterOptions { block_size: 4, ..Default::default() }).unwrap();
    let w = Worker::new(1, 0);
    let t: Vec<u32> = (0..8).collect();
    assert!(matches!(
        idx.stored(w, None, None, None, &[1, 2], &t[..7], Medium::Gpu),
        Err(RouterError::Unaligned { blocks: 2, tokens: 7, block_size: 4, expected: 4 })
    ));
    assert_eq!(idx.stored(w, None, None, None, &[], &[], Medium::Gpu), Err(RouterError::Empty));
    // In a batch: a block size other than the index's, and an empty store; the good event
    // between them applies.
    let mk = |hashes: Vec<u64>, tokens: Vec<u32>, block_size| KvEvent::BlockStored {
        block_hashes: hashes,
        parent_block_hash: None,
        token_ids: tokens,
        block_size,
        lora_name: None,
        cache_salt: None,
        medium: Medium::Gpu,
    };
    let events =
        vec![mk(vec![1], t[..2].to_vec(), 2), mk(vec![1, 2], t.clone(), 4), mk(vec![], vec![], 4)];
    let p = encode_batch(
        &EventBatch { ts: 0.0, events },
        &WireOptions { encoding: Encoding::VllmMap, ..Default::default() },
    );
    let rep = idx.apply_batch(1, 0, &p).unwrap();
    assert_eq!((rep.events, rep.refused), (3, 2));
    let s = idx.stats();
    assert_eq!(s.refused(Refusal::Unaligned), 2);
    assert_eq!(s.refused(Refusal::Empty), 2);
    assert_eq!(s.memberships, 2);
}

#[test]
fn restarts_and_gaps() {
    let t: Vec<u32> = (0..8).collect();
    for refuse in [false, true] {
        let policy = if refuse {
            radixkv_router::GapPolicy::Refuse
        } else {
            radixkv_router::GapPolicy::Clear
        };
        let idx = RouterIndex::new(RouterOptions {
            block_size: 4,
            gap_policy: policy,
            ..Default::default()
        })
        .unwrap();
        let w = Worker::new(4, 0);
        idx.apply_batch(4, 10, &good_payload(&[1], &t[..4])).unwrap();
        assert_eq!(idx.next_seq(w), Some(11));
        // A gap.
        let r = idx.apply_batch(4, 13, &good_payload(&[7], &t[4..]));
        let mut out = Vec::new();
        idx.find(&t, None, None, &mut out);
        if refuse {
            assert_eq!(r, Err(RouterError::SequenceGap { worker: w, expected: 11, got: 13 }));
            assert_eq!(out[0].any_blocks, 1, "nothing applied");
            assert_eq!(idx.next_seq(w), Some(11));
        } else {
            assert!(r.unwrap().cleared_first);
            assert!(out.is_empty(), "the old block is gone; the new one is not a first block");
            assert_eq!(idx.next_seq(w), Some(14));
        }
        // A restart at 0: the worker's old blocks are never credited to it again.
        let rep =
            idx.apply_batch(4, 0, &good_payload(&[2], &(100..104).collect::<Vec<_>>())).unwrap();
        assert!(rep.cleared_first);
        idx.find(&t, None, None, &mut out);
        assert!(out.is_empty());
        let s = idx.stats();
        assert_eq!((s.gaps, s.restarts), (1, 1));
    }
}

/// A typed store under a parent from a worker the index does not know is refused
/// (`UnknownParent`) and registers nothing: no worker, no cursor, no dump record, no place
/// of `max_workers` taken (found by the Python front's tests).
#[test]
fn a_refused_store_from_an_unknown_worker_registers_nothing() {
    let idx =
        RouterIndex::new(RouterOptions { block_size: 4, max_workers: 1, ..Default::default() })
            .unwrap();
    let t: Vec<u32> = (0..4).collect();
    let (stranger, other) = (Worker::new(9, 0), Worker::new(1, 0));
    for hashes in [[5u64], [6]] {
        assert_eq!(
            idx.stored(stranger, None, None, Some(4), &hashes, &t, Medium::Gpu),
            Err(RouterError::UnknownParent { parent: 4 })
        );
        assert_eq!(
            idx.stored_hashes(stranger, Some(4), &hashes, &[77], Medium::Gpu),
            Err(RouterError::UnknownParent { parent: 4 })
        );
    }
    let s = idx.stats();
    assert_eq!((s.workers, s.refused(Refusal::UnknownParent)), (0, 4));
    assert!(idx.dump().is_empty());
    assert_eq!(idx.next_seq(stranger), None);
    // The one place of max_workers is still free.
    idx.stored(other, None, None, None, &[1], &t, Medium::Gpu).unwrap();
    assert_eq!(idx.stats().workers, 1);
}
