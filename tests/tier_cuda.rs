//! The host tier through the CUDA copier ([`radixkv::tier::CudaTierCopier`]): GPU memory ↔
//! pinned host memory. The same cycle as `tests/core/tier.rs` (write-through backup, device
//! eviction, load-back of the bytes that were backed up, write-back), on a GPU.
//!
//! `#[ignore]`d (they need a GPU): `scripts/gpu-check` runs them with `--include-ignored`
//! and `RADIXKV_REQUIRE_GPU=1`; run without a GPU, each prints a skip line and passes unless
//! `RADIXKV_REQUIRE_GPU=1`.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use radixkv::CacheOptions;
use radixkv::kv::cuda;
use radixkv::kv::{CudaKvStorage, KvLayout, KvStorage};
use radixkv::tier::CudaTierCopier;
use radixkv::tier::{LoadOutcome, TierCopier, TierOptions, TieredCache, WritePolicy};

const P: usize = 4;

fn gpu(test: &str) -> bool {
    let why = match cuda::device_count() {
        Ok(n) if n > 0 => return true,
        Ok(_) => "the driver reports 0 devices".to_string(),
        Err(e) => e.to_string(),
    };
    let require = std::env::var("RADIXKV_REQUIRE_GPU").is_ok_and(|v| v == "1");
    assert!(!require, "{test}: RADIXKV_REQUIRE_GPU=1 but there is no usable CUDA GPU: {why}");
    println!("skipping {test}: no CUDA driver/GPU ({why})");
    false
}

fn pattern(t: u32, l: usize, v: bool) -> Vec<u8> {
    let x = t.wrapping_mul(2654435761).wrapping_add(l as u32 * 7 + v as u32);
    x.to_le_bytes().repeat(4) // 16-byte slots
}

fn cycle(policy: WritePolicy) {
    let layout = KvLayout::new(3, 64, 2, 2, 4);
    let store = Arc::new(CudaKvStorage::new(0, layout).unwrap());
    let copier = Arc::new(CudaTierCopier::new(store.clone(), 128).unwrap());
    let cache = TieredCache::new(
        CacheOptions { page_size: P, pool_slots: 64, ..Default::default() },
        TierOptions { host_slots: 128, write_policy: policy, ..Default::default() },
        copier.clone() as Arc<dyn TierCopier>,
    )
    .unwrap();
    let keys: Vec<Vec<u32>> = (0..6u32).map(|k| (k * 100..k * 100 + 24).collect()).collect();
    for key in &keys {
        let mut slots = Vec::new();
        cache.alloc(key.len(), &mut slots).unwrap();
        for (&s, &t) in slots.iter().zip(key) {
            for l in 0..3 {
                store.write_slot(l, s, &pattern(t, l, false), &pattern(t, l, true)).unwrap();
            }
        }
        cache.insert(0, key, &slots).unwrap();
    }
    cache.wait_all();
    cache.evict(usize::MAX).unwrap();
    // Overwrite the whole device store so a load-back must really copy.
    let junk = vec![0xEEu8; 16];
    for s in 0..64 {
        for l in 0..3 {
            store.write_slot(l, s, &junk, &junk).unwrap();
        }
    }
    for key in &keys[..2] {
        let t = cache.load_back(0, key, usize::MAX).unwrap();
        let done = cache.wait_load(t).unwrap();
        assert_eq!((done.outcome, done.loaded), (LoadOutcome::Loaded, key.len()), "{policy:?}");
        let (mut k, mut v) = (vec![0u8; 16], vec![0u8; 16]);
        for (&s, &t) in done.slots.iter().zip(key) {
            for l in 0..3 {
                store.read_slot(l, s, &mut k, &mut v).unwrap();
                assert_eq!((k.clone(), v.clone()), (pattern(t, l, false), pattern(t, l, true)));
            }
        }
        cache.release(done.lock).unwrap();
    }
    cache.wait_all();
    cache.check().unwrap();
    let st = cache.stats();
    assert_eq!(st.tokens_to_device, 48);
    assert_eq!(st.copy_failures, 0);
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check runs it (--include-ignored)"]
fn cuda_tier_write_through_cycle() {
    if gpu("cuda_tier_write_through_cycle") {
        cycle(WritePolicy::WriteThrough);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check runs it (--include-ignored)"]
fn cuda_tier_write_back_cycle() {
    if gpu("cuda_tier_write_back_cycle") {
        cycle(WritePolicy::WriteBack);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check runs it (--include-ignored)"]
fn cuda_tier_bad_copies_are_refused() {
    if !gpu("cuda_tier_bad_copies_are_refused") {
        return;
    }
    let store = Arc::new(CudaKvStorage::new(0, KvLayout::new(1, 8, 1, 2, 4)).unwrap());
    let c = CudaTierCopier::new(store, 8).unwrap();
    assert!(c.to_host(&[0, 1], &[0]).is_err());
    assert!(c.to_host(&[8], &[0]).is_err());
    assert!(c.to_device(&[0], &[8]).is_err());
    assert!(c.to_host(&[0, 1], &[2, 2]).is_err());
    assert!(c.poll(12345).is_err());
    let t = c.to_host(&[0, 1], &[2, 3]).unwrap();
    c.wait(t).unwrap();
    assert!(c.wait(t).is_err(), "a spent ticket");
    assert!(
        CudaTierCopier::new(
            Arc::new(CudaKvStorage::new(0, KvLayout::new(1, 8, 1, 2, 4)).unwrap()),
            0
        )
        .is_err()
    );
}
