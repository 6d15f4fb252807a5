use super::*;

use std::ffi::CStr;

use radixkv_core::error::{Error, SlotProblem};
use radixkv_core::tree::{EvictionPolicy, InsertOptions};

#[test]
fn a_panic_becomes_internal_error() {
    assert_eq!(boundary("f", || panic!("a bug")), rkv_status::RKV_INTERNAL_ERROR);
    assert_eq!(boundary("f", || Ok(())), rkv_status::RKV_OK);
    assert_eq!(boundary("f", || Err(no_pool())), rkv_status::RKV_NO_POOL);
}

#[test]
fn every_error_maps_to_its_status() {
    let cases = [
        (Error::InvalidArgument("x".into()), 2),
        (Error::Slot { slot: 3, problem: SlotProblem::ListedTwice }, 2),
        (Error::InvalidLock, 3),
        (Error::OutOfSlots { requested: 2, available: 1 }, 5),
        (Error::NoPool, 6),
        (Error::DoubleFree { slot: 4 }, 7),
        (Error::Device("x".into()), 8),
        (Error::Io("x".into()), 10),
    ];
    for (e, code) in cases {
        assert_eq!(rkv_status::from(&e) as i32, code, "{e}");
    }
}

#[test]
fn status_strings_are_static_and_total() {
    for code in -3..15 {
        let p = rkv_status_str(code);
        assert!(!p.is_null());
        // SAFETY: rkv_status_str returns a pointer to a static NUL-terminated string.
        let s = unsafe { CStr::from_ptr(p) }.to_str().unwrap();
        if (0..=12).contains(&code) {
            assert!(s.starts_with("RKV_"), "{code}: {s}");
        } else {
            assert_eq!(s, "unknown status");
        }
    }
    // SAFETY: as above.
    let v = unsafe { CStr::from_ptr(rkv_version()) }.to_str().unwrap();
    assert_eq!(v, env!("CARGO_PKG_VERSION"));
    assert_eq!(rkv_abi_version(), 1);
}

#[test]
fn matches_write_in_place_or_through_a_copy_with_the_same_result() {
    let mut o = rkv_options_default();
    o.pool_slots = 64;
    let mut c = std::ptr::null_mut();
    // SAFETY: every pointer below points to a live local of the stated length.
    unsafe {
        assert_eq!(rkv_cache_new(&o, &mut c), rkv_status::RKV_OK);
        let tokens: Vec<u32> = (100..120).collect();
        let mut slots = vec![0u32; 20];
        assert_eq!(rkv_alloc(c, 20, slots.as_mut_ptr()), rkv_status::RKV_OK);
        // The runs the pool handed out, expanded: 20 distinct slots of the pool.
        let mut sorted = slots.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert!(sorted.len() == 20 && sorted[19] < 64, "{slots:?}");
        let mut s = std::mem::zeroed();
        assert_eq!(rkv_cache_stats(c, &mut s), rkv_status::RKV_OK);
        assert_eq!(s.free_slots, 44);
        let mut existing = 9;
        let st = rkv_insert(c, 0, tokens.as_ptr(), slots.as_ptr(), 20, &mut existing);
        assert_eq!((st, existing), (rkv_status::RKV_OK, 0));
        let query: Vec<u32> = (100..110).chain([7, 8, 9]).collect();
        // In place: a buffer that holds any match, apart from the query.
        let mut out = vec![u32::MAX; 13];
        let mut len = 0;
        let st = rkv_match(c, 0, query.as_ptr(), 13, out.as_mut_ptr(), 13, &mut len);
        assert_eq!((st, len), (rkv_status::RKV_OK, 10));
        assert_eq!(&out[..10], &slots[..10]);
        // The query's own array as the output (overlapping): the copying path, same answer.
        let mut both = query.clone();
        let st = rkv_match(c, 0, both.as_ptr(), 13, both.as_mut_ptr(), 13, &mut len);
        assert_eq!((st, len), (rkv_status::RKV_OK, 10));
        assert_eq!(&both[..10], &slots[..10]);
        // The locking match, both ways; each lock pins the 10 tokens.
        let mut out = vec![u32::MAX; 13];
        let mut lock = 0;
        let p = out.as_mut_ptr();
        let st = rkv_match_lock(c, 0, query.as_ptr(), 13, p, 13, &mut len, &mut lock);
        assert_eq!((st, len), (rkv_status::RKV_OK, 10));
        assert_eq!(&out[..10], &slots[..10]);
        let mut both = query.clone();
        let mut lock2 = 0;
        let (q, p) = (both.as_ptr(), both.as_mut_ptr());
        let st = rkv_match_lock(c, 0, q, 13, p, 13, &mut len, &mut lock2);
        assert_eq!((st, len), (rkv_status::RKV_OK, 10));
        assert_eq!(&both[..10], &slots[..10]);
        assert_eq!(rkv_cache_stats(c, &mut s), rkv_status::RKV_OK);
        assert_eq!((s.protected_tokens, s.cached_tokens), (10, 20));
        assert_eq!(rkv_release(c, lock), rkv_status::RKV_OK);
        assert_eq!(rkv_release(c, lock2), rkv_status::RKV_OK);
        assert_eq!(rkv_cache_stats(c, &mut s), rkv_status::RKV_OK);
        assert_eq!(s.protected_tokens, 0);
        rkv_cache_free(c);
    }
}

#[test]
fn cache_new_checks_its_arguments_and_writes_only_on_ok() {
    let sentinel = std::ptr::dangling_mut::<rkv_cache>();
    let mut out = sentinel;
    let ok = rkv_options_default();
    // SAFETY: the pointers (in all calls below) are NULL or point to live locals.
    unsafe {
        assert_eq!(rkv_cache_new(std::ptr::null(), &mut out), rkv_status::RKV_NULL_ARGUMENT);
        assert_eq!(rkv_cache_new(&ok, std::ptr::null_mut()), rkv_status::RKV_NULL_ARGUMENT);
        for bad in [
            rkv_options { page_size: 0, ..ok },
            rkv_options { eviction_policy: 7, ..ok },
            rkv_options { pool_slots: (1 << 32) + 1, ..ok },
            rkv_options { page_size: 16, pool_slots: 100, ..ok },
        ] {
            assert_eq!(rkv_cache_new(&bad, &mut out), rkv_status::RKV_INVALID_ARGUMENT, "{bad:?}");
        }
        assert_eq!(out, sentinel);
        let fifo =
            rkv_options { eviction_policy: rkv_eviction_policy::RKV_EVICT_FIFO as u32, ..ok };
        assert_eq!(rkv_cache_new(&fifo, &mut out), rkv_status::RKV_OK);
        assert_ne!(out, sentinel);
        assert_eq!(rkv_release(out, 0), rkv_status::RKV_INVALID_LOCK);
        let mut n = 7usize;
        assert_eq!(rkv_lock_len(out, 12345, &mut n), rkv_status::RKV_INVALID_LOCK);
        assert_eq!(n, 7);
        let mut slot = 0u32;
        assert_eq!(rkv_alloc(out, 1, &mut slot), rkv_status::RKV_NO_POOL);
        assert_eq!(rkv_free(out, &slot, 1), rkv_status::RKV_NO_POOL);
        assert_eq!(
            rkv_evict(out, 1, None, std::ptr::null_mut(), &mut n),
            rkv_status::RKV_NULL_ARGUMENT
        );
        rkv_cache_free(out);
        rkv_cache_free(std::ptr::null_mut());
    }
}

#[test]
fn every_policy_has_its_number_and_name() {
    let mut numbers: Vec<u32> = EvictionPolicy::ALL.map(|p| c_policy(p) as u32).into();
    numbers.sort_unstable();
    assert_eq!(numbers, (0..7).collect::<Vec<u32>>(), "numbers 0.. without a gap");
    assert_eq!(c_policy(EvictionPolicy::Lru) as u32, 0);
    assert_eq!(c_policy(EvictionPolicy::Fifo) as u32, 1);
    for p in EvictionPolicy::ALL {
        let n = c_policy(p) as u32;
        assert_eq!(policy_of(n), Some(p));
        assert_eq!(policy_cname(p).to_str().unwrap(), p.name());
        // SAFETY: a non-NULL result is a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(rkv_eviction_policy_name(n)) };
        assert_eq!(name.to_str().unwrap(), p.name());
        let mut got = u32::MAX;
        let upper = std::ffi::CString::new(p.name().to_uppercase()).unwrap();
        // SAFETY: a live NUL-terminated string and a live local.
        let st = unsafe { rkv_eviction_policy_from_name(upper.as_ptr(), &mut got) };
        assert_eq!((st, got), (rkv_status::RKV_OK, n));
    }
    assert!(rkv_eviction_policy_name(7).is_null());
    assert!(rkv_eviction_policy_name(u32::MAX).is_null());
    let list = valid_policies();
    assert!(list.starts_with("0 = RKV_EVICT_LRU, 1 = RKV_EVICT_FIFO, 2 = RKV_EVICT_LFU"));
    assert!(list.ends_with("6 = RKV_EVICT_SLRU"), "{list}");
}

#[test]
fn the_versioned_structs_default_to_their_size() {
    let p = rkv_policy_options_default();
    assert_eq!((p.size, p.slru_threshold, p.swa_window), (12, 2, 0));
    let i = rkv_insert_options_default();
    assert_eq!((i.size, i.reserved, i.priority, i.inserted_len), (24, 0, 0, 0));
    // SAFETY: `i` is a live local.
    assert_eq!(unsafe { insert_options(&i) }.ok(), Some(InsertOptions::default()));
    // SAFETY: NULL is allowed.
    assert_eq!(unsafe { insert_options(std::ptr::null()) }.ok(), Some(InsertOptions::default()));
    let wide = rkv_insert_options { priority: -5, inserted_len: u64::MAX, ..i };
    // SAFETY: `wide` is a live local.
    let o = unsafe { insert_options(&wide) }.ok().unwrap();
    assert_eq!((o.priority, o.inserted_len), (-5, usize::MAX));
}

#[test]
fn cache_new_with_sets_the_policy_and_its_threshold() {
    let mut c = std::ptr::null_mut();
    let (mut pol, mut thr) = (u32::MAX, u32::MAX);
    // SAFETY: every pointer is NULL or points to a live local.
    unsafe {
        let o = rkv_options {
            eviction_policy: rkv_eviction_policy::RKV_EVICT_SLRU as u32,
            ..rkv_options_default()
        };
        let p = rkv_policy_options { slru_threshold: 5, ..rkv_policy_options_default() };
        assert_eq!(rkv_cache_new_with(&o, &p, &mut c), rkv_status::RKV_OK);
        assert_eq!(rkv_cache_eviction_policy(c, &mut pol, &mut thr), rkv_status::RKV_OK);
        assert_eq!((pol, thr), (6, 5));
        assert_eq!(c.as_ref().unwrap().cache.options().slru_threshold, 5);
        rkv_cache_free(c);
        assert_eq!(rkv_cache_new_with(&o, std::ptr::null(), &mut c), rkv_status::RKV_OK);
        assert_eq!(rkv_cache_eviction_policy(c, &mut pol, &mut thr), rkv_status::RKV_OK);
        assert_eq!((pol, thr), (6, RKV_DEFAULT_SLRU_THRESHOLD));
        rkv_cache_free(c);
    }
}

#[test]
fn the_status_enum_is_the_cores_table() {
    use radixkv_core::error::status;
    for (s, c) in rkv_status::ALL.iter().zip(status::ALL) {
        assert_eq!(*s as i32, c.code);
        assert_eq!(format!("{s:?}"), format!("RKV_{}", c.name));
        assert_eq!(rkv_status::from_code(c.code), Some(*s));
        // SAFETY: rkv_status_str returns a static NUL-terminated string.
        assert_eq!(unsafe { CStr::from_ptr(rkv_status_str(c.code)) }, c.text);
    }
    assert_eq!(rkv_status::from_code(13), None);
    assert_eq!(rkv_status::from_code(-1), None);
}

#[test]
fn a_cache_made_with_host_options_has_the_tier_through_the_plain_calls() {
    let o = rkv_options { page_size: 4, pool_slots: 16, ..rkv_options_default() };
    let t = rkv_tier_options {
        host_slots: 32,
        write_policy: rkv_write_policy::RKV_WRITE_THROUGH as u32,
        ..rkv_tier_options_default()
    };
    let sentinel = std::ptr::dangling_mut::<rkv_cache>();
    let mut c = sentinel;
    // SAFETY: the pointers (in all calls below) are NULL, point to live locals, or are the
    // cache made here, freed once at the end.
    unsafe {
        let no_pool = rkv_options { pool_slots: 0, ..o };
        let null = std::ptr::null();
        assert_eq!(
            rkv_cache_new_host(&no_pool, null, &t, &mut c),
            rkv_status::RKV_INVALID_ARGUMENT
        );
        assert_eq!(
            rkv_cache_new_host(&o, null, std::ptr::null(), &mut c),
            rkv_status::RKV_NULL_ARGUMENT
        );
        let odd = rkv_tier_options { host_slots: 6, ..t };
        assert_eq!(rkv_cache_new_host(&o, null, &odd, &mut c), rkv_status::RKV_INVALID_ARGUMENT);
        assert_eq!(c, sentinel);
        assert_eq!(rkv_cache_new_host(&o, null, &t, &mut c), rkv_status::RKV_OK);
        let tokens: Vec<u32> = (1..=8).collect();
        let mut slots = [0u32; 8];
        assert_eq!(rkv_alloc(c, 8, slots.as_mut_ptr()), rkv_status::RKV_OK);
        let mut n = 0usize;
        let st = rkv_insert(c, 0, tokens.as_ptr(), slots.as_ptr(), 8, &mut n);
        assert_eq!((st, n), (rkv_status::RKV_OK, 0));
        assert_eq!(rkv_cache_wait_all(c), rkv_status::RKV_OK);
        let mut s = rkv_tier_stats::default();
        assert_eq!(rkv_cache_tier_stats(c, &mut s), rkv_status::RKV_OK);
        assert_eq!((s.tokens_to_host, s.host_backed_slots), (8, 8), "the insert backed up");
        // A device eviction leaves the host copies; a plain match counts the host's hit.
        assert_eq!(rkv_evict(c, 8, None, std::ptr::null_mut(), &mut n), rkv_status::RKV_OK);
        assert_eq!(n, 8);
        let mut out = [0u32; 8];
        let st = rkv_match(c, 0, tokens.as_ptr(), 8, out.as_mut_ptr(), 8, &mut n);
        assert_eq!((st, n), (rkv_status::RKV_OK, 0));
        assert_eq!(rkv_cache_tier_stats(c, &mut s), rkv_status::RKV_OK);
        assert_eq!((s.host_hit_tokens, s.host_backed_slots, s.host_resident_pages), (8, 8, 0));
        rkv_cache_free(c);
        // Without a tier: the tier's statistics are refused, waiting is nothing to do.
        assert_eq!(rkv_cache_new(&o, &mut c), rkv_status::RKV_OK);
        assert_eq!(rkv_cache_tier_stats(c, &mut s), rkv_status::RKV_INVALID_ARGUMENT);
        assert_eq!(rkv_cache_wait_all(c), rkv_status::RKV_OK);
        rkv_cache_free(c);
    }
}
