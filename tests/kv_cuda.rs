//! KV storage behaviour on the CUDA backend: the suite of `tests/core/kv_host.rs`, once per
//! copy method, plus CUDA-specific checks.
//!
//! The tests that need a GPU are `#[ignore]`d, so a run without one reports them as ignored
//! (skipped), not passed; `scripts/gpu-check` runs them with `--include-ignored` and
//! `RADIXKV_REQUIRE_GPU=1`. Run anyway without a usable NVIDIA driver and GPU, each prints
//! `skipping <test>: no CUDA driver/GPU (<why>)` and passes, unless `RADIXKV_REQUIRE_GPU=1`
//! turns that into a failure. The tests that need no GPU (errors instead of panics) run
//! everywhere.
#![cfg(feature = "cuda")]

#[path = "core/kv_host.rs"]
mod kv_host;

use std::panic::{AssertUnwindSafe, catch_unwind};

use kv_host::suite::{self, SMALL};
use radixkv::Error;
use radixkv::kv::cuda::{self, MAX_BATCH};
use radixkv::kv::{CopyMethod, CudaKvStorage, KvLayout, KvStorage};

fn require_gpu() -> bool {
    std::env::var("RADIXKV_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Whether a GPU is usable; prints the skip line (or fails under RADIXKV_REQUIRE_GPU=1)
/// when not.
fn gpu(test: &str) -> bool {
    let why = match cuda::device_count() {
        Ok(n) if n > 0 => return true,
        Ok(_) => "the driver reports 0 devices".to_string(),
        Err(e) => e.to_string(),
    };
    assert!(!require_gpu(), "{test}: RADIXKV_REQUIRE_GPU=1 but there is no usable CUDA GPU: {why}");
    println!("skipping {test}: no CUDA driver/GPU ({why})");
    false
}

/// The copy methods this machine's driver supports.
fn methods() -> Vec<CopyMethod> {
    let probe = CudaKvStorage::new(0, SMALL).expect("CudaKvStorage::new on device 0");
    let mut m = vec![CopyMethod::Auto, CopyMethod::PerRun];
    if probe.has_batched_copy() {
        m.push(CopyMethod::Batched);
    } else {
        println!(
            "note: the driver has no cuMemcpyBatchAsync (needs CUDA 12.8+); batched path not tested"
        );
    }
    m
}

/// Runs `check` against the CUDA backend with every supported copy method.
fn on_gpu(test: &str, check: impl Fn(suite::Make)) {
    if !gpu(test) {
        return;
    }
    for method in methods() {
        println!("{test}: copy method {method:?}");
        let make = move |l: KvLayout| -> Box<dyn KvStorage> {
            let s = CudaKvStorage::new(0, l).expect("CudaKvStorage::new on device 0");
            s.set_copy_method(method).unwrap();
            assert_eq!(s.copy_method(), method);
            Box::new(s)
        };
        check(&make);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check runs it (--include-ignored)"]
fn cuda_round_trip() {
    on_gpu("cuda_round_trip", suite::round_trip);
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check runs it (--include-ignored)"]
fn cuda_pointers() {
    on_gpu("cuda_pointers", suite::pointers);
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check runs it (--include-ignored)"]
fn cuda_copy_gathered() {
    on_gpu("cuda_copy_gathered", suite::copy_gathered);
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check runs it (--include-ignored)"]
fn cuda_copy_overlapping() {
    on_gpu("cuda_copy_overlapping", suite::copy_overlapping);
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check runs it (--include-ignored)"]
fn cuda_copy_random() {
    on_gpu("cuda_copy_random", |make| suite::copy_random(make, 100));
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check runs it (--include-ignored)"]
fn cuda_copy_many_exceeds_one_batch() {
    // copy_many copies slots/4 single-slot runs in each of 2 * 3 buffers: make that more
    // than one cuMemcpyBatchAsync call holds.
    let slots = 4 * (MAX_BATCH / 6 + 1000);
    on_gpu("cuda_copy_many_exceeds_one_batch", |make| suite::copy_many(make, slots));
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check runs it (--include-ignored)"]
fn cuda_bad_inputs() {
    on_gpu("cuda_bad_inputs", suite::bad_inputs);
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check runs it (--include-ignored)"]
fn cuda_concurrent_writes_are_atomic() {
    on_gpu("cuda_concurrent_writes_are_atomic", |make| {
        suite::concurrent_writes_are_atomic(make, 2_000)
    });
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check runs it (--include-ignored)"]
fn cuda_batched_and_per_run_agree() {
    if !gpu("cuda_batched_and_per_run_agree") {
        return;
    }
    let l = KvLayout { num_slots: 256, ..SMALL };
    let s = CudaKvStorage::new(0, l).unwrap();
    let mut rng = suite::Rng(0x9E37_79B9_7F4A_7C15);
    let dst = rng.distinct(96, l.num_slots);
    let src: Vec<u32> = (0..96).map(|_| rng.below(l.num_slots) as u32).collect();
    let mut results = Vec::new();
    for method in [CopyMethod::PerRun, CopyMethod::Batched] {
        if method == CopyMethod::Batched && !s.has_batched_copy() {
            println!("note: no cuMemcpyBatchAsync on this driver; comparing per-run only");
            continue;
        }
        let before = suite::fill(&s, 21);
        s.copy_slots_with(&src, &dst, method).unwrap();
        let after = suite::snapshot(&s);
        suite::assert_same(&after, &suite::model_copy(&before, &src, &dst), &format!("{method:?}"));
        results.push(after);
    }
    if let [a, b] = &results[..] {
        suite::assert_same(a, b, "batched vs per-run");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check runs it (--include-ignored)"]
fn cuda_forcing_batched_without_driver_support_is_an_error() {
    if !gpu("cuda_forcing_batched_without_driver_support_is_an_error") {
        return;
    }
    let s = CudaKvStorage::new(0, SMALL).unwrap();
    if s.has_batched_copy() {
        s.set_copy_method(CopyMethod::Batched).unwrap();
        return;
    }
    assert!(matches!(s.set_copy_method(CopyMethod::Batched), Err(Error::Device(_))));
    assert_eq!(s.copy_method(), CopyMethod::Auto);
    assert!(matches!(s.copy_slots_with(&[1], &[2], CopyMethod::Batched), Err(Error::Device(_))));
}

// ---- No GPU needed: these run everywhere. ----

/// On a machine without a driver or GPU, `new` is an `Error::Device`, not a panic; on a
/// GPU machine it succeeds.
#[test]
fn new_without_gpu_is_an_error_not_a_panic() {
    let r = catch_unwind(AssertUnwindSafe(|| CudaKvStorage::new(0, SMALL)))
        .expect("CudaKvStorage::new panicked");
    let count = catch_unwind(cuda::device_count).expect("device_count panicked");
    match (r, count) {
        (Ok(s), Ok(n)) => {
            assert!(n >= 1);
            assert_eq!(*s.layout(), SMALL);
        }
        (Ok(_), Err(e)) => panic!("new succeeded but device_count failed: {e}"),
        (Err(Error::Device(msg)), _) => {
            assert!(!require_gpu(), "RADIXKV_REQUIRE_GPU=1 but new failed: {msg}");
            assert!(!msg.is_empty());
            println!("no GPU here, as expected: {msg}");
        }
        (Err(e), _) => panic!("expected Error::Device, got {e:?}"),
    }
}

#[test]
fn missing_device_ordinal_is_a_device_error() {
    let r = catch_unwind(AssertUnwindSafe(|| CudaKvStorage::new(1 << 20, SMALL)))
        .expect("CudaKvStorage::new panicked");
    match r {
        Err(Error::Device(msg)) => assert!(!msg.is_empty()),
        other => panic!("expected Error::Device, got {other:?}"),
    }
}

#[test]
fn invalid_layout_is_refused_before_touching_the_driver() {
    let bad = KvLayout { head_dim: 0, ..SMALL };
    match CudaKvStorage::new(0, bad) {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("head_dim"), "{msg}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn cuda_storage_is_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CudaKvStorage>();
}
