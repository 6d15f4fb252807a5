//! KV storage behaviour on the host backend, plus layout math.
//!
//! The behaviour checks live in `suite`, written against `dyn KvStorage`;
//! `tests/kv_cuda.rs` includes this file as a module and runs the same suite on the CUDA
//! backend (so its binary also re-runs these host tests, which takes milliseconds).

#![allow(dead_code)] // when included from kv_cuda.rs, not every helper is used there

use radixkv::Error;
use radixkv::kv::{HostKvStorage, KvLayout, KvStorage};

/// Backend-independent checks. Each takes a constructor for the backend under test.
pub mod suite {
    use super::*;

    /// Builds a store of the given layout for the backend under test.
    pub type Make<'a> = &'a dyn Fn(KvLayout) -> Box<dyn KvStorage>;

    /// 3 layers, 40 slots, 2 heads x 8 elements of 2 bytes: 32-byte slots.
    pub const SMALL: KvLayout =
        KvLayout { num_layers: 3, num_slots: 40, num_kv_heads: 2, head_dim: 8, elem_bytes: 2 };

    /// A deterministic byte pattern for (layer, slot, K/V, generation): differs between
    /// any two of them with overwhelming probability, and is never all zeros.
    pub fn pattern(
        layout: &KvLayout,
        layer: usize,
        slot: u32,
        kv: usize,
        generation: u64,
    ) -> Vec<u8> {
        let mut x =
            (layer as u64) << 48 ^ (slot as u64) << 8 ^ (kv as u64) << 40 ^ generation << 56;
        let mut out: Vec<u8> = (0..layout.slot_bytes())
            .map(|_| {
                // splitmix64
                x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                (z ^ (z >> 31)) as u8
            })
            .collect();
        out[0] |= 1;
        out
    }

    /// The whole contents: `[layer][slot] -> (K bytes, V bytes)`, read through `read_slot`.
    pub type Snapshot = Vec<Vec<(Vec<u8>, Vec<u8>)>>;

    pub fn snapshot(s: &dyn KvStorage) -> Snapshot {
        let l = *s.layout();
        (0..l.num_layers)
            .map(|layer| {
                (0..l.num_slots as u32)
                    .map(|slot| {
                        let mut k = vec![0u8; l.slot_bytes()];
                        let mut v = vec![0u8; l.slot_bytes()];
                        s.read_slot(layer, slot, &mut k, &mut v).unwrap();
                        (k, v)
                    })
                    .collect()
            })
            .collect()
    }

    /// Writes a distinct pattern into every slot of every layer, returns the snapshot.
    pub fn fill(s: &dyn KvStorage, generation: u64) -> Snapshot {
        let l = *s.layout();
        for layer in 0..l.num_layers {
            for slot in 0..l.num_slots as u32 {
                let k = pattern(&l, layer, slot, 0, generation);
                let v = pattern(&l, layer, slot, 1, generation);
                s.write_slot(layer, slot, &k, &v).unwrap();
            }
        }
        snapshot(s)
    }

    /// The model of `copy_slots`: every source read before any destination is written.
    pub fn model_copy(before: &Snapshot, src: &[u32], dst: &[u32]) -> Snapshot {
        let mut after = before.clone();
        for (layer, slots) in after.iter_mut().enumerate() {
            for (&s, &d) in src.iter().zip(dst) {
                slots[d as usize] = before[layer][s as usize].clone();
            }
        }
        after
    }

    /// Asserts two snapshots are equal, naming the first difference.
    pub fn assert_same(got: &Snapshot, want: &Snapshot, what: &str) {
        for (layer, (g, w)) in got.iter().zip(want).enumerate() {
            for (slot, (gs, ws)) in g.iter().zip(w).enumerate() {
                assert!(gs.0 == ws.0, "{what}: layer {layer} slot {slot}: K differs");
                assert!(gs.1 == ws.1, "{what}: layer {layer} slot {slot}: V differs");
            }
        }
        assert_eq!(got.len(), want.len());
    }

    /// Asserts `r` is an `InvalidArgument` whose message contains `needle`.
    pub fn assert_invalid(r: radixkv::Result<()>, needle: &str, what: &str) {
        match r {
            Err(Error::InvalidArgument(msg)) => {
                assert!(msg.contains(needle), "{what}: message {msg:?} does not mention {needle:?}")
            }
            other => panic!("{what}: expected InvalidArgument, got {other:?}"),
        }
    }

    /// A small xorshift generator, so runs are reproducible without extra crates.
    pub struct Rng(pub u64);
    impl Rng {
        pub fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        pub fn below(&mut self, n: usize) -> usize {
            (self.next_u64() % n as u64) as usize
        }
        /// `k` distinct values below `n` in random order.
        pub fn distinct(&mut self, k: usize, n: usize) -> Vec<u32> {
            let mut all: Vec<u32> = (0..n as u32).collect();
            for i in 0..k {
                let j = i + self.below(n - i);
                all.swap(i, j);
            }
            all.truncate(k);
            all
        }
    }

    /// Written slots read back exactly, in every layer, K and V separately; untouched
    /// slots read as zeros; the layout is the one asked for.
    pub fn round_trip(make: Make) {
        let s = make(SMALL);
        let l = SMALL;
        assert_eq!(*s.layout(), l);
        let written: Vec<u32> = (0..l.num_slots as u32).filter(|x| x % 3 != 1).collect();
        for layer in 0..l.num_layers {
            for &slot in &written {
                let k = pattern(&l, layer, slot, 0, 1);
                let v = pattern(&l, layer, slot, 1, 1);
                s.write_slot(layer, slot, &k, &v).unwrap();
            }
        }
        let snap = snapshot(&*s);
        assert_eq!(snap.len(), l.num_layers);
        for (layer, slots) in snap.iter().enumerate() {
            assert_eq!(slots.len(), l.num_slots);
            for (slot, (k, v)) in (0u32..).zip(slots) {
                if written.contains(&slot) {
                    assert_eq!(*k, pattern(&l, layer, slot, 0, 1), "layer {layer} slot {slot} K");
                    assert_eq!(*v, pattern(&l, layer, slot, 1, 1), "layer {layer} slot {slot} V");
                } else {
                    assert!(k.iter().all(|&b| b == 0), "unwritten K at {layer}/{slot}");
                    assert!(v.iter().all(|&b| b == 0), "unwritten V at {layer}/{slot}");
                }
            }
        }
        // Overwriting replaces.
        let k = pattern(&l, 2, 5, 0, 9);
        let v = pattern(&l, 2, 5, 1, 9);
        s.write_slot(2, 5, &k, &v).unwrap();
        let (mut k2, mut v2) = (vec![0; l.slot_bytes()], vec![0; l.slot_bytes()]);
        s.read_slot(2, 5, &mut k2, &mut v2).unwrap();
        assert_eq!((k2, v2), (k, v));
    }

    /// K/V base pointers: non-null, 256-byte aligned, stable, and the `2 * num_layers`
    /// buffers do not overlap.
    pub fn pointers(make: Make) {
        let s = make(SMALL);
        let bytes = SMALL.buffer_bytes() as u64;
        let mut ranges = Vec::new();
        for layer in 0..SMALL.num_layers {
            for p in [s.k_ptr(layer).unwrap(), s.v_ptr(layer).unwrap()] {
                assert_ne!(p, 0);
                assert_eq!(p % 256, 0, "buffer at {p:#x} is not 256-byte aligned");
                ranges.push((p, p + bytes));
            }
            assert_eq!(s.k_ptr(layer).unwrap(), ranges[2 * layer].0, "k_ptr moved");
        }
        ranges.sort();
        for w in ranges.windows(2) {
            assert!(w[0].1 <= w[1].0, "buffers overlap: {w:?}");
        }
        assert_invalid(s.k_ptr(SMALL.num_layers).map(drop), "layer", "k_ptr past the last layer");
        assert_invalid(s.v_ptr(usize::MAX).map(drop), "layer", "v_ptr(usize::MAX)");
    }

    /// A gathered copy (scattered sources, a repeated source, an identity pair) moves
    /// whole slots in every layer, K and V, and nothing else.
    pub fn copy_gathered(make: Make) {
        let s = make(SMALL);
        let before = fill(&*s, 2);
        let src = [3, 4, 5, 17, 1, 1, 39, 8];
        let dst = [20, 21, 22, 30, 31, 0, 2, 8];
        s.copy_slots(&src, &dst).unwrap();
        assert_same(&snapshot(&*s), &model_copy(&before, &src, &dst), "gathered copy");
        // Empty copy: a no-op.
        let before = snapshot(&*s);
        s.copy_slots(&[], &[]).unwrap();
        assert_same(&snapshot(&*s), &before, "empty copy");
    }

    /// A destination that is also a source gets the source's value from before the call
    /// (shift, swap, rotation, chains).
    pub fn copy_overlapping(make: Make) {
        let s = make(SMALL);
        let cases: [(&[u32], &[u32]); 4] = [
            (&[1, 2, 3], &[2, 3, 4]),        // shift right by one
            (&[11, 10], &[10, 11]),          // swap
            (&[20, 21, 22], &[21, 22, 20]),  // rotation
            (&[5, 6, 7, 30], &[4, 5, 6, 7]), // shift left plus a far source
        ];
        for (generation, (src, dst)) in cases.into_iter().enumerate() {
            let before = fill(&*s, 10 + generation as u64);
            s.copy_slots(src, dst).unwrap();
            assert_same(
                &snapshot(&*s),
                &model_copy(&before, src, dst),
                &format!("copy {src:?} -> {dst:?}"),
            );
        }
    }

    /// Many random copies, some with overlapping sources and destinations, against the
    /// model.
    pub fn copy_random(make: Make, rounds: usize) {
        let l = KvLayout { num_slots: 64, ..SMALL };
        let s = make(l);
        let mut model = fill(&*s, 3);
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        for round in 0..rounds {
            let n = 1 + rng.below(24);
            let dst = rng.distinct(n, l.num_slots);
            let src: Vec<u32> = if round % 2 == 0 {
                // Often a contiguous run, so coalescing is exercised.
                let start = rng.below(l.num_slots - n + 1) as u32;
                (start..start + n as u32).collect()
            } else {
                (0..n).map(|_| rng.below(l.num_slots) as u32).collect()
            };
            s.copy_slots(&src, &dst).unwrap();
            model = model_copy(&model, &src, &dst);
        }
        assert_same(&snapshot(&*s), &model, "random copies");
    }

    /// Long runs and many short ones across a bigger store (more copies per call than the
    /// CUDA batch limit when `slots` is large enough).
    pub fn copy_many(make: Make, slots: usize) {
        let l = KvLayout {
            num_layers: 3,
            num_slots: slots,
            num_kv_heads: 1,
            head_dim: 2,
            elem_bytes: 2,
        };
        let s = make(l);
        // Distinct contents only for the slots we use as sources; the rest stay zero.
        let half = slots / 2;
        let src: Vec<u32> = (0..half as u32).step_by(2).collect();
        let dst: Vec<u32> = src.iter().map(|&x| x + half as u32 + 1).collect();
        for layer in 0..l.num_layers {
            for &slot in &src {
                s.write_slot(
                    layer,
                    slot,
                    &pattern(&l, layer, slot, 0, 4),
                    &pattern(&l, layer, slot, 1, 4),
                )
                .unwrap();
            }
        }
        s.copy_slots(&src, &dst).unwrap();
        let (mut k, mut v) = (vec![0; l.slot_bytes()], vec![0; l.slot_bytes()]);
        for layer in 0..l.num_layers {
            for (&a, &b) in src.iter().zip(&dst) {
                s.read_slot(layer, b, &mut k, &mut v).unwrap();
                assert_eq!(k, pattern(&l, layer, a, 0, 4), "layer {layer}: K of {a} -> {b}");
                assert_eq!(v, pattern(&l, layer, a, 1, 4), "layer {layer}: V of {a} -> {b}");
            }
            // The gaps between destinations were not written.
            for &b in &dst {
                if (b as usize) + 1 < slots {
                    s.read_slot(layer, b + 1, &mut k, &mut v).unwrap();
                    assert!(
                        k.iter().chain(&v).all(|&x| x == 0),
                        "layer {layer}: slot {} touched",
                        b + 1
                    );
                }
            }
        }
    }

    /// Every bad argument is a clear `InvalidArgument` and changes nothing.
    pub fn bad_inputs(make: Make) {
        let s = make(SMALL);
        let l = SMALL;
        let before = fill(&*s, 5);
        let n = l.num_slots as u32;
        let sb = l.slot_bytes();

        assert_invalid(
            s.copy_slots(&[1, 2, 3], &[4, 5]),
            "src has 3 slots but dst has 2",
            "length mismatch",
        );
        assert_invalid(s.copy_slots(&[1], &[]), "dst has 0", "length mismatch, empty dst");
        assert_invalid(s.copy_slots(&[1, n], &[2, 3]), "src[1]", "src out of range");
        assert_invalid(s.copy_slots(&[1, 2], &[3, u32::MAX]), "out of range", "dst out of range");
        assert_invalid(s.copy_slots(&[1, 2, 3], &[4, 5, 4]), "more than once", "duplicate dst");
        assert_invalid(s.copy_slots(&[7, 7], &[7, 7]), "more than once", "duplicate identity dst");

        let k = vec![0xAB; sb];
        let v = vec![0xCD; sb];
        assert_invalid(s.write_slot(0, n, &k, &v), "slot", "write_slot slot out of range");
        assert_invalid(
            s.write_slot(l.num_layers, 0, &k, &v),
            "layer",
            "write_slot layer out of range",
        );
        assert_invalid(s.write_slot(0, 0, &k[1..], &v), "K buffer has", "write_slot short K");
        assert_invalid(s.write_slot(0, 0, &k, &[0xCD; 1000]), "V buffer has", "write_slot long V");
        assert_invalid(s.write_slot(0, 0, &[], &[]), "buffer has 0 bytes", "write_slot empty");

        let (mut ko, mut vo) = (vec![0; sb], vec![0; sb]);
        assert_invalid(s.read_slot(0, n, &mut ko, &mut vo), "slot", "read_slot slot out of range");
        assert_invalid(
            s.read_slot(3, 0, &mut ko, &mut vo),
            "layer",
            "read_slot layer out of range",
        );
        assert_invalid(
            s.read_slot(0, 0, &mut vec![0; sb + 1], &mut vo),
            "K buffer has",
            "read_slot long K",
        );
        assert_invalid(
            s.read_slot(0, 0, &mut ko, &mut vec![0; sb - 1]),
            "V buffer has",
            "read_slot short V",
        );

        assert_same(&snapshot(&*s), &before, "after refused calls");
    }

    /// Readers never see a slot half written: concurrent `write_slot`s of uniform
    /// patterns and `read_slot`s of the same slots.
    pub fn concurrent_writes_are_atomic(make: Make, iters: usize) {
        let l = KvLayout { num_slots: 4, num_layers: 1, ..SMALL };
        let s = make(l);
        let sb = l.slot_bytes();
        std::thread::scope(|scope| {
            for t in 0..2u8 {
                let s = &*s;
                scope.spawn(move || {
                    for i in 0..iters {
                        let b = (i as u8).wrapping_mul(2).wrapping_add(t);
                        s.write_slot(0, (i % 4) as u32, &vec![b; sb], &vec![b; sb]).unwrap();
                    }
                });
            }
            let s = &*s;
            scope.spawn(move || {
                let (mut k, mut v) = (vec![0; sb], vec![0; sb]);
                for i in 0..iters {
                    s.read_slot(0, (i % 4) as u32, &mut k, &mut v).unwrap();
                    assert!(k.iter().chain(&v).all(|&x| x == k[0]), "torn slot read: {k:?} {v:?}");
                }
            });
        });
    }
}

use suite::*;

fn host(l: KvLayout) -> Box<dyn KvStorage> {
    Box::new(HostKvStorage::new(l).unwrap())
}

#[test]
fn layout_math() {
    let l = KvLayout::new(32, 65536, 8, 128, 2);
    l.validate().unwrap();
    assert_eq!(l.slot_bytes(), 8 * 128 * 2);
    assert_eq!(l.buffer_bytes(), 65536 * 8 * 128 * 2);
    assert_eq!(l.bytes_per_token(), 2 * 32 * 8 * 128 * 2);
    assert_eq!(l.total_bytes(), 2 * 32 * 65536 * 8 * 128 * 2);
    assert_eq!(l.slot_offset(0), 0);
    assert_eq!(l.slot_offset(7), 7 * l.slot_bytes());
    assert_eq!(l.slot_offset(u32::MAX), u32::MAX as usize * l.slot_bytes());
    assert_eq!(SMALL.slot_bytes(), 32);
    // Every slot index of a u32 is allowed; one more is not.
    KvLayout::new(1, 1 << 32, 1, 1, 1).validate().unwrap();
}

#[test]
fn layout_validation() {
    let good = KvLayout::new(2, 16, 2, 4, 2);
    good.validate().unwrap();
    for (i, field) in
        ["num_layers", "num_slots", "num_kv_heads", "head_dim", "elem_bytes"].iter().enumerate()
    {
        let mut dims = [2usize, 16, 2, 4, 2];
        dims[i] = 0;
        let l = KvLayout::new(dims[0], dims[1], dims[2], dims[3], dims[4]);
        assert_invalid(l.validate(), field, &format!("{field} = 0"));
        assert_invalid(HostKvStorage::new(l).map(drop), field, &format!("new with {field} = 0"));
    }
    assert_invalid(KvLayout::new(1, (1 << 32) + 1, 1, 1, 1).validate(), "u32", "2^32 + 1 slots");
    let huge = KvLayout::new(usize::MAX / 2, 1 << 20, 8, 128, 2);
    assert_invalid(huge.validate(), "overflow", "overflowing layout");
    // Saturating, not wrapping, for layouts that fail validation.
    assert_eq!(huge.total_bytes(), usize::MAX);
}

#[test]
fn host_allocation_failure_is_a_device_error() {
    // Validates (2^62 bytes fits an isize) but no machine has that much memory.
    let l = KvLayout::new(1, 1 << 32, 1, 1 << 29, 1);
    l.validate().unwrap();
    match HostKvStorage::new(l) {
        Err(Error::Device(msg)) => assert!(msg.contains("out of memory"), "{msg}"),
        other => panic!("expected Error::Device, got {other:?}"),
    }
}

#[test]
fn host_round_trip() {
    round_trip(&host);
}

#[test]
fn host_pointers() {
    pointers(&host);
}

#[test]
fn host_copy_gathered() {
    copy_gathered(&host);
}

#[test]
fn host_copy_overlapping() {
    copy_overlapping(&host);
}

#[test]
fn host_copy_random() {
    copy_random(&host, 300);
}

#[test]
fn host_copy_many() {
    copy_many(&host, 40_000);
}

#[test]
fn host_bad_inputs() {
    bad_inputs(&host);
}

#[test]
fn host_concurrent_writes_are_atomic() {
    concurrent_writes_are_atomic(&host, 20_000);
}

#[test]
fn host_storage_is_send_sync_and_object_safe() {
    fn assert_send_sync<T: Send + Sync + ?Sized>() {}
    assert_send_sync::<HostKvStorage>();
    assert_send_sync::<dyn KvStorage>();
    let shared: std::sync::Arc<dyn KvStorage> =
        std::sync::Arc::new(HostKvStorage::new(SMALL).unwrap());
    let t = {
        let shared = shared.clone();
        std::thread::spawn(move || shared.write_slot(1, 2, &[7; 32], &[8; 32]))
    };
    t.join().unwrap().unwrap();
    let (mut k, mut v) = ([0u8; 32], [0u8; 32]);
    shared.read_slot(1, 2, &mut k, &mut v).unwrap();
    assert_eq!((k, v), ([7; 32], [8; 32]));
}

/// `copy_to` between two stores: bytes move slot for slot, bad arguments change nothing,
/// and copies in opposite directions from two threads at once finish (the two stores'
/// locks are taken in one global order; the watchdog only turns a deadlock into a failure).
#[test]
fn host_copy_to_between_stores() {
    let a = std::sync::Arc::new(HostKvStorage::new(KvLayout::new(2, 8, 1, 2, 2)).unwrap());
    let b = std::sync::Arc::new(HostKvStorage::new(KvLayout::new(2, 16, 1, 2, 2)).unwrap());
    for s in 0..8u32 {
        let k = [s as u8, 1, 2, 3];
        let v = [s as u8, 9, 9, 9];
        a.write_slot(1, s, &k, &v).unwrap();
    }
    a.copy_to(&[0, 5], &b, &[15, 3]).unwrap();
    let (mut k, mut v) = ([0u8; 4], [0u8; 4]);
    b.read_slot(1, 15, &mut k, &mut v).unwrap();
    assert_eq!((k, v), ([0, 1, 2, 3], [0, 9, 9, 9]));
    b.read_slot(1, 3, &mut k, &mut v).unwrap();
    assert_eq!((k, v), ([5, 1, 2, 3], [5, 9, 9, 9]));
    for (src, dst) in [(&[0u32][..], &[16u32][..]), (&[8], &[0]), (&[0, 1], &[2, 2]), (&[0], &[])] {
        assert!(
            matches!(a.copy_to(src, &b, dst), Err(Error::InvalidArgument(_))),
            "{src:?} {dst:?}"
        );
    }
    assert!(matches!(a.copy_to(&[0], &a, &[1]), Err(Error::InvalidArgument(_))));
    let other = HostKvStorage::new(KvLayout::new(1, 8, 1, 2, 2)).unwrap();
    assert!(matches!(a.copy_to(&[0], &other, &[0]), Err(Error::InvalidArgument(_))));
    let (a2, b2) = (a.clone(), b.clone());
    let t1 = std::thread::spawn(move || {
        for i in 0..20_000u32 {
            a2.copy_to(&[i % 8], &b2, &[i % 16]).unwrap();
        }
    });
    let t2 = std::thread::spawn(move || {
        for i in 0..20_000u32 {
            b.copy_to(&[i % 16], &a, &[i % 8]).unwrap();
        }
    });
    let start = std::time::Instant::now();
    while !(t1.is_finished() && t2.is_finished()) {
        assert!(start.elapsed().as_secs() < 120, "opposite copies deadlocked");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    t1.join().unwrap();
    t2.join().unwrap();
}
