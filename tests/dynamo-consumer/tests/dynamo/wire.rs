//! The wire encodings byte for byte against msgspec (vLLM's encoder), and decoded by
//! radixkv's decoder and Dynamo's (`dynamo_kv_router::zmq_wire`).

use radixkv::events::wire::{
    Encoding, EventGroup, KvCacheSpecKind, KvGroup, WireOptions, decode_batch, encode_batch,
};
use radixkv::events::{EventBatch, KvEvent, Medium};

// Made by tests/golden/vllm_wire.py (msgspec 0.23.0; rerun it to remake them): one batch
// of four events (two stores, one salted and with a LoRA name, a removal, a clear) at
// ts = 1700000000.25, in each encoding, with unsigned hashes (data_parallel_rank 0) and
// signed ones (SGLang's; data_parallel_rank 3).
const ARRAY: &str = "93cb41d954fc40100000949cab426c6f636b53746f72656492cfea06fc71a5ee6e88cfad01835a37dd294cc0dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2010c0a3475055c0c000ae66756c6c5f617474656e74696f6ec09cab426c6f636b53746f7265649201cfad01835a37dd294ccfffffffffffffffff940001020302c0a3475055a9616461707465722d619291ba64796e616d6f2d63616368652d73616c743a74656e616e742d61c000ae66756c6c5f617474656e74696f6ec094ac426c6f636b52656d6f7665649205cfea06fc71a5ee6e88aa4350555f50494e4e45440091b0416c6c426c6f636b73436c656172656400";
const ARRAY_SIGNED: &str = "93cb41d954fc40100000949cab426c6f636b53746f72656492d3cf97adeedb59e05bcf4ebfa8a1f3c34151c0dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2010c0a3475055c0c000ae66756c6c5f617474656e74696f6ec09cab426c6f636b53746f7265649201cf4ebfa8a1f3c34151d3eddb4ab93695109c940001020302c0a3475055a9616461707465722d619291ba64796e616d6f2d63616368652d73616c743a74656e616e742d61c000ae66756c6c5f617474656e74696f6ec094ac426c6f636b52656d6f7665649205d3cf97adeedb59e05baa4350555f50494e4e45440091b0416c6c426c6f636b73436c656172656403";
const MAP: &str = "93cb41d954fc40100000948aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cfea06fc71a5ee6e88cfad01835a37dd294cb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e8ba474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739201cfad01835a37dd294cb1706172656e745f626c6f636b5f68617368cfffffffffffffffffa9746f6b656e5f6964739400010203aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65a9616461707465722d61aa65787472615f6b6579739291ba64796e616d6f2d63616368652d73616c743a74656e616e742d61c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739205cfea06fc71a5ee6e88a66d656469756daa4350555f50494e4e4544a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400";
const MAP_SIGNED: &str = "93cb41d954fc40100000948aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392d3cf97adeedb59e05bcf4ebfa8a1f3c34151b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e8ba474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739201cf4ebfa8a1f3c34151b1706172656e745f626c6f636b5f68617368d3eddb4ab93695109ca9746f6b656e5f6964739400010203aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65a9616461707465722d61aa65787472615f6b6579739291ba64796e616d6f2d63616368652d73616c743a74656e616e742d61c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739205d3cf97adeedb59e05ba66d656469756daa4350555f50494e4e4544a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656403";
// The same events (unsigned) published by a cache of a hybrid model's sliding-window KV
// group: group_idx 3, kv_cache_spec_kind "sliding_window", window 4096 (made by the same
// script).
const GROUP_ARRAY: &str = "93cb41d954fc40100000949cab426c6f636b53746f72656492cfea06fc71a5ee6e88cfad01835a37dd294cc0dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2010c0a3475055c0c003ae736c6964696e675f77696e646f77cd10009cab426c6f636b53746f7265649201cfad01835a37dd294ccfffffffffffffffff940001020302c0a3475055a9616461707465722d619291ba64796e616d6f2d63616368652d73616c743a74656e616e742d61c003ae736c6964696e675f77696e646f77cd100094ac426c6f636b52656d6f7665649205cfea06fc71a5ee6e88aa4350555f50494e4e45440391b0416c6c426c6f636b73436c656172656400";
const GROUP_MAP: &str = "93cb41d954fc40100000948ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cfea06fc71a5ee6e88cfad01835a37dd294cb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f69647803b26b765f63616368655f737065635f6b696e64ae736c6964696e675f77696e646f77bc6b765f63616368655f737065635f736c6964696e675f77696e646f77cd10008ca474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739201cfad01835a37dd294cb1706172656e745f626c6f636b5f68617368cfffffffffffffffffa9746f6b656e5f6964739400010203aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65a9616461707465722d61aa65787472615f6b6579739291ba64796e616d6f2d63616368652d73616c743a74656e616e742d61c0a967726f75705f69647803b26b765f63616368655f737065635f6b696e64ae736c6964696e675f77696e646f77bc6b765f63616368655f737065635f736c6964696e675f77696e646f77cd100084a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739205cfea06fc71a5ee6e88a66d656469756daa4350555f50494e4e4544a967726f75705f6964780381a474797065b0416c6c426c6f636b73436c656172656400";

fn sample(signed: bool) -> EventBatch {
    let (h, parent) = if signed {
        ([-3488128144981237669i64 as u64, 5674439469042975057], -1307369107475853156i64 as u64)
    } else {
        ([16863443419780771464, 12466389667045779788], u64::MAX)
    };
    EventBatch {
        ts: 1700000000.25,
        events: vec![
            KvEvent::BlockStored {
                block_hashes: h.to_vec(),
                parent_block_hash: None,
                token_ids: (1..=32).collect(),
                block_size: 16,
                lora_name: None,
                cache_salt: None,
                medium: Medium::Gpu,
            },
            KvEvent::BlockStored {
                block_hashes: vec![1, h[1]],
                parent_block_hash: Some(parent),
                token_ids: vec![0, 1, 2, 3],
                block_size: 2,
                lora_name: Some("adapter-a".into()),
                cache_salt: Some("tenant-a".into()),
                medium: Medium::Gpu,
            },
            KvEvent::BlockRemoved { block_hashes: vec![5, h[0]], medium: Medium::CpuPinned },
            KvEvent::AllBlocksCleared,
        ],
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn cases() -> [(Encoding, bool, &'static str); 4] {
    [
        (Encoding::VllmArray, false, ARRAY),
        (Encoding::VllmArray, true, ARRAY_SIGNED),
        (Encoding::VllmMap, false, MAP),
        (Encoding::VllmMap, true, MAP_SIGNED),
    ]
}

fn opts(encoding: Encoding, signed: bool) -> WireOptions {
    WireOptions {
        encoding,
        signed_hashes: signed,
        data_parallel_rank: if signed { 3 } else { 0 },
        ..Default::default()
    }
}

fn sliding_group() -> KvGroup {
    KvGroup::new(3, KvCacheSpecKind::SlidingWindow, Some(4096)).unwrap()
}

fn group_cases() -> [(Encoding, &'static str); 2] {
    [(Encoding::VllmArray, GROUP_ARRAY), (Encoding::VllmMap, GROUP_MAP)]
}

#[test]
fn a_groups_encodings_match_msgspec_byte_for_byte() {
    for (encoding, golden) in group_cases() {
        let o = WireOptions { group: sliding_group(), ..opts(encoding, false) };
        assert_eq!(hex(&encode_batch(&sample(false), &o)), golden, "{}", encoding.name());
        let d = decode_batch(&unhex(golden)).unwrap();
        assert_eq!(d.batch, sample(false));
        let stored = EventGroup {
            group_idx: Some(3),
            kind: Some(KvCacheSpecKind::SlidingWindow),
            sliding_window: Some(4096),
        };
        let removed = EventGroup { group_idx: Some(3), kind: None, sliding_window: None };
        assert_eq!(d.groups, vec![stored, stored, removed, EventGroup::default()]);
    }
}

/// Dynamo's decoder reads a group's fields as sent, and its normalizer does what it does
/// with a hybrid model's non-full-attention group: the stores are filtered for their kind,
/// the removals for their (learned) group; the full-attention group passes.
#[test]
fn dynamo_reads_the_group_as_sent_and_filters_other_groups() {
    use dynamo_kv_router::protocols::WorkerWithDpRank;
    use dynamo_kv_router::zmq_wire::{
        KvCacheSpecKind as DynKind, RawKvEvent, ZmqEventFilterReason, ZmqEventNormalizer,
        decode_event_batch,
    };
    let worker = WorkerWithDpRank { worker_id: 1, dp_rank: 0 };
    for (encoding, golden) in group_cases() {
        let what = encoding.name();
        let b = decode_event_batch(&unhex(golden)).unwrap_or_else(|e| panic!("{what}: {e}"));
        for raw in &b.events[..2] {
            match raw {
                RawKvEvent::BlockStored {
                    group_idx,
                    kv_cache_spec_kind,
                    kv_cache_spec_sliding_window,
                    ..
                } => {
                    assert_eq!(*group_idx, Some(3), "{what}");
                    assert_eq!(*kv_cache_spec_kind, Some(DynKind::SlidingWindow), "{what}");
                    assert_eq!(*kv_cache_spec_sliding_window, Some(4096), "{what}");
                }
                e => panic!("{what}: {e:?}"),
            }
        }
        match &b.events[2] {
            RawKvEvent::BlockRemoved { group_idx, .. } => assert_eq!(*group_idx, Some(3)),
            e => panic!("{what}: {e:?}"),
        }
        let mut n = ZmqEventNormalizer::new(16);
        let reasons: Vec<_> =
            b.events.into_iter().map(|raw| n.preprocess_with_reason(raw, worker).err()).collect();
        assert_eq!(
            reasons,
            [
                Some(ZmqEventFilterReason::NonMainAttentionKind),
                Some(ZmqEventFilterReason::NonMainAttentionKind),
                Some(ZmqEventFilterReason::NonMainAttentionGroup),
                None,
            ],
            "{what}"
        );
    }
    // Every kind radixkv sends is Dynamo's string for it, and only main attention passes.
    for kind in KvCacheSpecKind::ALL {
        let window = kind.has_window().then_some(128);
        let group = KvGroup::new(5, kind, window).unwrap();
        for encoding in [Encoding::VllmArray, Encoding::VllmMap] {
            let o = WireOptions { group, ..opts(encoding, false) };
            let b = decode_event_batch(&encode_batch(&sample(false), &o)).unwrap();
            let RawKvEvent::BlockStored {
                group_idx,
                kv_cache_spec_kind,
                kv_cache_spec_sliding_window,
                ..
            } = &b.events[0]
            else {
                panic!("{kind}: {:?}", b.events[0]);
            };
            // Dynamo's enum names its kinds as radixkv's does: the string it read mapped to
            // the same kind (a string it did not know would be its `Unknown`).
            let theirs = kv_cache_spec_kind.expect("a kind");
            assert_eq!(format!("{theirs:?}"), format!("{kind:?}"));
            assert_eq!((*group_idx, *kv_cache_spec_sliding_window), (Some(5), window));
            let mut n = ZmqEventNormalizer::new(16);
            let passed = n.preprocess_with_reason(b.events[0].clone(), worker).is_ok();
            assert_eq!(passed, kind.is_main_attention(), "{kind} {}", encoding.name());
        }
    }
}

#[test]
fn encodings_match_msgspec_byte_for_byte() {
    for (encoding, signed, golden) in cases() {
        let bytes = encode_batch(&sample(signed), &opts(encoding, signed));
        assert_eq!(hex(&bytes), golden, "{} signed={signed}", encoding.name());
    }
}

#[test]
fn radixkv_decodes_msgspec_bytes() {
    for (encoding, signed, golden) in cases() {
        let d = decode_batch(&unhex(golden)).unwrap();
        assert_eq!(d.batch, sample(signed), "{} signed={signed}", encoding.name());
        assert_eq!(d.data_parallel_rank, Some(if signed { 3 } else { 0 }));
    }
}

#[test]
fn dynamo_decodes_every_encoding() {
    use dynamo_kv_router::zmq_wire::{RawKvEvent, decode_event_batch};
    for (encoding, signed, golden) in cases() {
        let what = format!("{} signed={signed}", encoding.name());
        let b = decode_event_batch(&unhex(golden)).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(b.ts, 1700000000.25);
        assert_eq!(b.data_parallel_rank, Some(if signed { 3 } else { 0 }));
        assert_eq!(b.events.len(), 4, "{what}");
        let want = sample(signed);
        match (&b.events[0], &want.events[0]) {
            (
                RawKvEvent::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_name,
                    cache_namespace,
                    medium,
                    group_idx,
                    ..
                },
                KvEvent::BlockStored { block_hashes: wh, token_ids: wt, .. },
            ) => {
                assert_eq!(
                    block_hashes.iter().map(|h| h.into_u64()).collect::<Vec<_>>(),
                    *wh,
                    "{what}"
                );
                assert!(parent_block_hash.is_none());
                assert_eq!(token_ids, wt);
                assert_eq!(*block_size, 16);
                assert_eq!(
                    (lora_name.as_deref(), cache_namespace.as_deref()),
                    (None, None),
                    "{what}"
                );
                assert_eq!(medium.as_deref(), Some("GPU"));
                assert_eq!(*group_idx, Some(0));
            }
            e => panic!("{what}: {e:?}"),
        }
        match (&b.events[1], &want.events[1]) {
            (
                RawKvEvent::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    lora_name,
                    cache_namespace,
                    ..
                },
                KvEvent::BlockStored { block_hashes: wh, parent_block_hash: wp, .. },
            ) => {
                assert_eq!(
                    block_hashes.iter().map(|h| h.into_u64()).collect::<Vec<_>>(),
                    *wh,
                    "{what}"
                );
                assert_eq!(parent_block_hash.map(|h| h.into_u64()), *wp, "{what}");
                assert_eq!(lora_name.as_deref(), Some("adapter-a"), "{what}");
                assert_eq!(
                    cache_namespace.as_deref(),
                    Some("tenant-a"),
                    "{what}: the salt reaches Dynamo's namespace"
                );
            }
            e => panic!("{what}: {e:?}"),
        }
        match &b.events[2] {
            RawKvEvent::BlockRemoved { block_hashes, medium, .. } => {
                assert_eq!(block_hashes.len(), 2);
                assert_eq!(medium.as_deref(), Some("CPU_PINNED"));
            }
            e => panic!("{what}: {e:?}"),
        }
        assert!(matches!(b.events[3], RawKvEvent::AllBlocksCleared { .. }), "{what}");
    }
}

mod random {
    use super::*;
    use dynamo_kv_router::zmq_wire::{RawKvEvent, decode_event_batch};
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = Option<String>> {
        prop_oneof![Just(None), "[a-zA-Z0-9_\\-é]{1,40}".prop_map(Some)]
    }

    fn event() -> impl Strategy<Value = KvEvent> {
        let stored =
            (1u32..5, 1usize..40, any::<bool>(), name(), name(), any::<u64>(), any::<bool>())
                .prop_flat_map(|(bs, n, has_parent, lora, salt, parent, pinned)| {
                    (
                        proptest::collection::vec(any::<u64>(), n),
                        proptest::collection::vec(any::<u32>(), n * bs as usize),
                    )
                        .prop_map(move |(hashes, tokens)| {
                            KvEvent::BlockStored {
                                block_hashes: hashes,
                                parent_block_hash: has_parent.then_some(parent),
                                token_ids: tokens,
                                block_size: bs,
                                lora_name: lora.as_deref().map(Into::into),
                                cache_salt: salt.as_deref().map(Into::into),
                                medium: if pinned { Medium::CpuPinned } else { Medium::Gpu },
                            }
                        })
                });
        let removed = proptest::collection::vec(any::<u64>(), 0..40)
            .prop_map(|h| KvEvent::BlockRemoved { block_hashes: h, medium: Medium::Gpu });
        prop_oneof![4 => stored, 2 => removed, 1 => Just(KvEvent::AllBlocksCleared)]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Any batch round-trips through radixkv's decoder, and Dynamo's decoder reads the
        /// same hashes, tokens, LoRA name and salt, in both encodings and signednesses.
        #[test]
        fn random_batches_round_trip_and_dynamo_agrees(
            events in proptest::collection::vec(event(), 0..8),
            signed in any::<bool>(),
            map in any::<bool>(),
            rank in 0i64..8,
            group in (any::<u32>(), 1u32..),
            kind in proptest::sample::select(KvCacheSpecKind::ALL.to_vec()),
        ) {
            let batch = EventBatch { ts: 12.5, events };
            let encoding = if map { Encoding::VllmMap } else { Encoding::VllmArray };
            let group = KvGroup::new(group.0, kind, kind.has_window().then_some(group.1)).unwrap();
            let o = WireOptions { encoding, signed_hashes: signed, data_parallel_rank: rank, group };
            let bytes = encode_batch(&batch, &o);
            let ours = decode_batch(&bytes).unwrap();
            prop_assert_eq!(&ours.batch, &batch);
            prop_assert_eq!(ours.data_parallel_rank, Some(rank));
            let theirs = decode_event_batch(&bytes).unwrap();
            prop_assert_eq!(theirs.events.len(), batch.events.len());
            for (raw, ev) in theirs.events.iter().zip(&batch.events) {
                match (raw, ev) {
                    (
                        RawKvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size, lora_name, cache_namespace, group_idx, kv_cache_spec_sliding_window, .. },
                        KvEvent::BlockStored { block_hashes: h, parent_block_hash: p, token_ids: t, block_size: b, lora_name: l, cache_salt: s, .. },
                    ) => {
                        prop_assert_eq!(&block_hashes.iter().map(|x| x.into_u64()).collect::<Vec<_>>(), h);
                        prop_assert_eq!(parent_block_hash.map(|x| x.into_u64()), *p);
                        prop_assert_eq!(token_ids, t);
                        prop_assert_eq!(*block_size, *b as usize);
                        prop_assert_eq!(*group_idx, Some(group.idx()));
                        prop_assert_eq!(*kv_cache_spec_sliding_window, group.sliding_window());
                        prop_assert_eq!(lora_name.as_deref(), l.as_deref());
                        prop_assert_eq!(cache_namespace.as_deref(), s.as_deref());
                    }
                    (RawKvEvent::BlockRemoved { block_hashes, group_idx, .. }, KvEvent::BlockRemoved { block_hashes: h, .. }) => {
                        prop_assert_eq!(&block_hashes.iter().map(|x| x.into_u64()).collect::<Vec<_>>(), h);
                        prop_assert_eq!(*group_idx, Some(group.idx()));
                    }
                    (RawKvEvent::AllBlocksCleared { .. }, KvEvent::AllBlocksCleared) => {}
                    (r, e) => prop_assert!(false, "{:?} vs {:?}", r, e),
                }
            }
        }
    }
}
