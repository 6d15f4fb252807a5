//! The hybrid tree through the C ABI: a request cycle over FULL, SWA and Mamba with the
//! actions carried out by a callback that calls back into the tree, every eviction walk,
//! no index lost, and every bad input (refused with its status, nothing changed, no output
//! written).

use super::*;
use crate::boundary::rkv_last_error_message;
use rkv_hybrid_component::*;
use rkv_status::*;

use std::collections::HashMap;
use std::ffi::CStr;
use std::ptr::{null, null_mut};

fn last_error() -> String {
    // SAFETY: the library's message is a live NUL-terminated string until the next call.
    unsafe { CStr::from_ptr(rkv_last_error_message()) }.to_string_lossy().into_owned()
}

fn new_tree(page: u64, window: u64, mamba: bool) -> *mut rkv_hybrid {
    let mut o = rkv_hybrid_options_default();
    o.page_size = page;
    o.swa_window = window;
    o.mamba = u32::from(mamba);
    let mut t = null_mut();
    // SAFETY: `o` and `t` are live locals.
    assert_eq!(unsafe { rkv_hybrid_new(&o, &mut t) }, RKV_OK);
    t
}

/// What the callbacks saw: indices freed per component, and the tree to call back into.
struct Books {
    tree: *const rkv_hybrid,
    freed: HashMap<u32, Vec<i64>>,
    actions: Vec<(u32, u64, Vec<i64>, Vec<i64>)>,
    /// SWA slot of each FULL index whose SWA value the callback rebuilt.
    swa_of: HashMap<i64, i64>,
    set_status: Vec<rkv_status>,
}

impl Books {
    fn new(tree: *const rkv_hybrid) -> Books {
        Books {
            tree,
            freed: HashMap::new(),
            actions: Vec::new(),
            swa_of: HashMap::new(),
            set_status: Vec::new(),
        }
    }
    fn freed(&self, c: rkv_hybrid_component) -> Vec<i64> {
        let mut v = self.freed.get(&(c as u32)).cloned().unwrap_or_default();
        v.sort();
        v
    }
}

unsafe extern "C" fn on_free(ctx: *mut c_void, comp: u32, p: *const i64, n: usize) {
    // SAFETY: `ctx` is the test's `Books`; `p[0..n]` is valid during the call.
    let (b, v) = unsafe { (&mut *(ctx as *mut Books), std::slice::from_raw_parts(p, n)) };
    b.freed.entry(comp).or_default().extend_from_slice(v);
}

unsafe extern "C" fn on_action(ctx: *mut c_void, a: *const rkv_hybrid_action) {
    // SAFETY: `ctx` is the test's `Books`; `*a` and its arrays are valid during the call.
    unsafe {
        let b = &mut *(ctx as *mut Books);
        let a = &*a;
        let slice = |p: *const i64, n: usize| {
            if n == 0 { Vec::new() } else { std::slice::from_raw_parts(p, n).to_vec() }
        };
        let (va, vb) = (slice(a.a, a.a_len), slice(a.b, a.b_len));
        if a.kind == rkv_hybrid_action_kind::RKV_HYBRID_SWA_REBUILD as u32 {
            // Rebuild: an SWA slot per token (FULL index + 1000), stored by calling back
            // into the tree (its mutex is released).
            let swa: Vec<i64> = va.iter().map(|f| f + 1000).collect();
            for (f, s) in va.iter().zip(&swa) {
                b.swa_of.insert(*f, *s);
            }
            let st = rkv_hybrid_swa_set_value(b.tree, a.node, swa.as_ptr(), swa.len());
            b.set_status.push(st);
        }
        b.actions.push((a.kind, a.node, va, vb));
    }
}

fn insert(
    t: *const rkv_hybrid,
    b: &mut Books,
    key: &[i64],
    vals: &[i64],
    prev: usize,
    state: &[i64],
) -> rkv_hybrid_insert_result {
    insert_locked(t, b, key, vals, prev, state, null_mut())
}

fn insert_locked(
    t: *const rkv_hybrid,
    b: &mut Books,
    key: &[i64],
    vals: &[i64],
    prev: usize,
    state: &[i64],
    lock: *mut rkv_hybrid_receipt,
) -> rkv_hybrid_insert_result {
    let mut r = rkv_hybrid_insert_result::default();
    // SAFETY: every pointer is a live local of the stated length.
    let st = unsafe {
        rkv_hybrid_insert(
            t,
            0,
            key.as_ptr(),
            key.len(),
            vals.as_ptr(),
            vals.len(),
            prev,
            0,
            state.as_ptr(),
            state.len(),
            Some(on_action),
            (b as *mut Books).cast(),
            &mut r,
            lock,
        )
    };
    assert_eq!(st, RKV_OK, "{}", last_error());
    if r.refreshed == 0 {
        // SAFETY: `t` is live.
        assert_eq!(unsafe { rkv_hybrid_swa_refresh(t, r.node) }, RKV_OK);
    }
    r
}

fn matched(t: *const rkv_hybrid, key: &[i64]) -> rkv_hybrid_match_result {
    let mut m = rkv_hybrid_match_result::default();
    // SAFETY: `key` and `m` are live locals.
    assert_eq!(unsafe { rkv_hybrid_match(t, 0, key.as_ptr(), key.len(), &mut m) }, RKV_OK);
    m
}

fn collect(t: *const rkv_hybrid, from: u64, until: u64) -> Vec<i64> {
    let mut n = 0usize;
    // SAFETY: cap 0 with NULL asks for the length only.
    assert_eq!(unsafe { rkv_hybrid_collect(t, from, until, null_mut(), 0, &mut n) }, RKV_OK);
    let mut v = vec![0i64; n];
    // SAFETY: `v` holds `n` values.
    assert_eq!(unsafe { rkv_hybrid_collect(t, from, until, v.as_mut_ptr(), n, &mut n) }, RKV_OK);
    v
}

fn sizes(t: *const rkv_hybrid) -> rkv_hybrid_sizes {
    let mut s = rkv_hybrid_sizes::default();
    // SAFETY: `s` is a live local.
    assert_eq!(unsafe { rkv_hybrid_sizes_get(t, &mut s) }, RKV_OK);
    s
}

fn root(t: *const rkv_hybrid) -> u64 {
    let mut r = 0;
    // SAFETY: `r` is a live local.
    assert_eq!(unsafe { rkv_hybrid_root(t, &mut r) }, RKV_OK);
    r
}

fn evict(t: *const rkv_hybrid, b: &mut Books, c: rkv_hybrid_component, n: u64) -> u64 {
    let mut e = 0;
    // SAFETY: `b` and `e` are live locals.
    let st = unsafe {
        rkv_hybrid_evict(t, c as u32, n, Some(on_free), (b as *mut Books).cast(), &mut e)
    };
    assert_eq!(st, RKV_OK, "{}", last_error());
    e
}

fn check(t: *const rkv_hybrid) {
    // SAFETY: `t` is live.
    assert_eq!(unsafe { rkv_hybrid_check(t) }, RKV_OK, "{}", last_error());
}

#[test]
fn a_request_cycle_over_every_component_loses_no_index() {
    let t = new_tree(1, 4, true);
    let mut b = Books::new(t);
    let key1: Vec<i64> = (0..10).collect();
    let vals1: Vec<i64> = (100..110).collect();
    // A first request: nothing cached, then its insert with its Mamba state.
    let m = matched(t, &key1);
    assert_eq!((m.device_prefix_len, m.full_hit_len, m.last_device_node), (0, 0, root(t)));
    let r = insert(t, &mut b, &key1, &vals1, 0, &[7]);
    assert_eq!((r.prefix_len, r.mamba_exist), (0, 0));
    // The new leaf is longer than the window: it is split at the window, and both parts
    // get SWA values (rebuilt by the callback through the tree).
    assert!(b.actions.iter().any(|a| a.0 == rkv_hybrid_action_kind::RKV_HYBRID_SWA_REBUILD as u32));
    assert!(b.set_status.iter().all(|&s| s == RKV_OK));
    check(t);
    let s = sizes(t);
    assert_eq!((s.full_evictable, s.swa_evictable, s.mamba_evictable), (10, 10, 1));
    // A second request on the same prompt: all of it reusable, then locked over every
    // component.
    let m = matched(t, &key1);
    assert_eq!((m.device_prefix_len, m.full_hit_len), (10, 10));
    assert_eq!(m.has_last_visited, 1);
    assert_eq!(collect(t, m.last_device_node, root(t)), vals1);
    let mut rc = rkv_hybrid_receipt::default();
    // SAFETY: `rc` is a live local.
    assert_eq!(unsafe { rkv_hybrid_lock(t, m.last_device_node, &mut rc) }, RKV_OK);
    assert_ne!(rc.id, 0);
    let s = sizes(t);
    assert_eq!((s.full_protected, s.swa_protected, s.mamba_protected), (10, 4, 1));
    // Locked: neither FULL nor Mamba walks take anything; SWA takes the older part's window
    // values (outside the window lock) as a tombstone, its FULL KV kept.
    assert_eq!(evict(t, &mut b, RKV_HYBRID_FULL, 100), 0);
    assert_eq!(evict(t, &mut b, RKV_HYBRID_MAMBA, 100), 0);
    assert_eq!(evict(t, &mut b, RKV_HYBRID_SWA, 100), 6);
    assert_eq!(b.freed(RKV_HYBRID_SWA), (100..106).collect::<Vec<_>>());
    assert_eq!(matched(t, &key1).full_hit_len, 10);
    check(t);
    // It grows by 4 tokens and inserts: a new leaf with the request's new state.
    let key2: Vec<i64> = (0..14).collect();
    let mut vals2 = vals1.clone();
    vals2.extend(200..204);
    let r = insert(t, &mut b, &key2, &vals2, 10, &[8]);
    assert_eq!((r.prefix_len, r.mamba_exist), (10, 0));
    // SAFETY: `rc` is the live receipt.
    assert_eq!(unsafe { rkv_hybrid_unlock(t, &rc) }, RKV_OK);
    // SAFETY: as above; the second release is refused.
    assert_eq!(unsafe { rkv_hybrid_unlock(t, &rc) }, RKV_INVALID_LOCK);
    assert!(last_error().contains("not a live lock"), "{}", last_error());
    check(t);
    let s = sizes(t);
    assert_eq!((s.full_protected, s.swa_protected, s.mamba_protected), (0, 0, 0));
    assert_eq!((s.full_evictable, s.mamba_evictable), (14, 2));
    // Mamba: the oldest state goes first, as a tombstone (node 0..10 keeps its KV).
    assert_eq!(evict(t, &mut b, RKV_HYBRID_MAMBA, 1), 1);
    assert_eq!(b.freed(RKV_HYBRID_MAMBA), vec![7]);
    assert_eq!(matched(t, &key1).full_hit_len, 10);
    check(t);
    // SWA: walks its LRU; every SWA slot freed is one the callback rebuilt.
    let e = evict(t, &mut b, RKV_HYBRID_SWA, 2);
    assert!(e >= 2);
    for f in b.freed(RKV_HYBRID_SWA) {
        assert!(b.swa_of.contains_key(&f), "SWA freed by FULL index {f}, never rebuilt");
    }
    check(t);
    // FULL: everything.
    evict(t, &mut b, RKV_HYBRID_FULL, u64::MAX);
    check(t);
    assert_eq!(sizes(t), rkv_hybrid_sizes::default());
    assert_eq!(b.freed(RKV_HYBRID_FULL), (100..110).chain(200..204).collect::<Vec<_>>());
    assert_eq!(b.freed(RKV_HYBRID_MAMBA), vec![7, 8]);
    // Every SWA slot rebuilt was freed exactly once (by FULL index).
    let mut rebuilt: Vec<i64> = b.swa_of.keys().copied().collect();
    rebuilt.sort();
    assert_eq!(b.freed(RKV_HYBRID_SWA), rebuilt);
    // SAFETY: `t` came from `rkv_hybrid_new`; nothing uses it afterwards.
    unsafe { rkv_hybrid_free(t) };
}

#[test]
fn a_kept_mamba_state_and_duplicates_come_back_to_the_caller() {
    let t = new_tree(2, 0, true);
    let mut b = Books::new(t);
    let key: Vec<i64> = (0..6).collect();
    let r = insert(t, &mut b, &key, &[10, 11, 12, 13, 14, 15], 0, &[1]);
    assert_eq!((r.prefix_len, r.mamba_exist, r.refreshed), (0, 0, 1));
    // The same sequence again, from a request that matched nothing: its KV is all
    // duplicates (FREE_DEVICE_KV), and the node keeps its state (mamba_exist).
    let r = insert(t, &mut b, &key, &[20, 21, 22, 23, 24, 25], 0, &[2]);
    assert_eq!((r.prefix_len, r.mamba_exist), (6, 1));
    assert_eq!(b.actions.len(), 1);
    let (kind, node, a, _) = &b.actions[0];
    assert_eq!((*kind, *node), (rkv_hybrid_action_kind::RKV_HYBRID_FREE_DEVICE_KV as u32, 0));
    assert_eq!(a, &vec![20, 21, 22, 23, 24, 25]);
    // An odd key: only whole pages go in.
    let r = insert(t, &mut b, &[0, 1, 2, 3, 4, 5, 6], &[10, 11, 12, 13, 14, 15], 6, &[3]);
    assert_eq!((r.prefix_len, r.mamba_exist), (6, 1));
    check(t);
    // Reset hands back everything it held.
    let mut b2 = Books::new(t);
    let b2p: *mut Books = &mut b2;
    // SAFETY: `b2` is a live local.
    let st = unsafe { rkv_hybrid_reset(t, Some(on_free), b2p.cast()) };
    assert_eq!(st, RKV_OK);
    assert_eq!(b2.freed(RKV_HYBRID_FULL), vec![10, 11, 12, 13, 14, 15]);
    assert_eq!(b2.freed(RKV_HYBRID_MAMBA), vec![1]);
    assert_eq!(sizes(t), rkv_hybrid_sizes::default());
    check(t);
    // SAFETY: as in the first test.
    unsafe { rkv_hybrid_free(t) };
}

#[test]
fn an_early_window_release_frees_the_leafs_swa_and_the_mamba_lock() {
    let t = new_tree(1, 2, true);
    let mut b = Books::new(t);
    let r = insert(t, &mut b, &[1, 2, 3], &[31, 32, 33], 0, &[9]);
    let mut rc = rkv_hybrid_receipt::default();
    // SAFETY: live locals.
    unsafe {
        assert_eq!(rkv_hybrid_lock(t, r.node, &mut rc), RKV_OK);
        assert_eq!(sizes(t).mamba_protected, 1);
        // NULL on_free is refused where SWA slots may come back.
        assert_eq!(rkv_hybrid_release_window(t, &rc, None, null_mut()), RKV_NULL_ARGUMENT);
        assert_eq!(sizes(t).mamba_protected, 1, "nothing changed");
        let bp: *mut Books = &mut b;
        assert_eq!(rkv_hybrid_release_window(t, &rc, Some(on_free), bp.cast()), RKV_OK);
        let s = sizes(t);
        assert_eq!((s.swa_protected, s.mamba_protected, s.full_protected), (0, 0, 3));
        // The FULL lock keeps the leaf from being a device leaf, so nothing went at once;
        // the SWA walk may take its window now (tombstones: FULL stays locked), with the
        // Mamba state that went unlocked.
        assert!((*bp).freed(RKV_HYBRID_SWA).is_empty());
        assert_eq!(evict(t, &mut *bp, RKV_HYBRID_SWA, 3), 3);
        assert_eq!((*bp).freed(RKV_HYBRID_SWA), vec![31, 32, 33]);
        assert_eq!((*bp).freed(RKV_HYBRID_MAMBA), vec![9]);
        assert_eq!(sizes(t).full_protected, 3);
        // A second early release releases nothing; the unlock releases FULL only.
        assert_eq!(rkv_hybrid_release_window(t, &rc, Some(on_free), bp.cast()), RKV_OK);
        assert_eq!(rkv_hybrid_unlock(t, &rc), RKV_OK);
        assert_eq!(sizes(t).full_protected, 0);
        check(t);
        rkv_hybrid_free(t);
    }
}

#[test]
fn every_bad_input_is_refused_with_nothing_written() {
    let t = new_tree(2, 0, false);
    let mut b = Books::new(t);
    let bp: *mut Books = &mut b;
    let key = [1i64, 2, 3, 4];
    // SAFETY: every pointer is NULL, a live local, or deliberately bad where the ABI checks
    // it before any use.
    unsafe {
        // new: NULLs, the size, the page, mamba.
        let mut out = null_mut();
        assert_eq!(rkv_hybrid_new(null(), &mut out), RKV_NULL_ARGUMENT);
        let mut o = rkv_hybrid_options_default();
        assert_eq!(o.size, 32);
        assert_eq!(rkv_hybrid_new(&o, null_mut()), RKV_NULL_ARGUMENT);
        o.size = 16;
        assert_eq!(rkv_hybrid_new(&o, &mut out), RKV_INVALID_ARGUMENT);
        assert!(last_error().contains("opts->size = 16"), "{}", last_error());
        o = rkv_hybrid_options_default();
        o.page_size = 0;
        assert_eq!(rkv_hybrid_new(&o, &mut out), RKV_INVALID_ARGUMENT);
        o = rkv_hybrid_options_default();
        o.mamba = 2;
        assert_eq!(rkv_hybrid_new(&o, &mut out), RKV_INVALID_ARGUMENT);
        assert!(out.is_null(), "written only on RKV_OK");

        // A NULL tree everywhere.
        let mut m = rkv_hybrid_match_result { reserved: 77, ..Default::default() };
        assert_eq!(rkv_hybrid_match(null(), 0, key.as_ptr(), 4, &mut m), RKV_NULL_ARGUMENT);
        assert!(last_error().contains("tree is NULL"));
        assert_eq!(rkv_hybrid_check(null()), RKV_NULL_ARGUMENT);
        assert_eq!(rkv_hybrid_reset(null(), None, null_mut()), RKV_NULL_ARGUMENT);
        let mut s = rkv_hybrid_sizes { full_evictable: 5, ..Default::default() };
        assert_eq!(rkv_hybrid_sizes_get(null(), &mut s), RKV_NULL_ARGUMENT);
        assert_eq!(s.full_evictable, 5);
        rkv_hybrid_free(null_mut()); // a no-op

        // match: NULL key with a length, NULL out; a NULL key with 0 is the root.
        assert_eq!(rkv_hybrid_match(t, 0, null(), 4, &mut m), RKV_NULL_ARGUMENT);
        assert_eq!(rkv_hybrid_match(t, 0, key.as_ptr(), 4, null_mut()), RKV_NULL_ARGUMENT);
        assert_eq!(m.reserved, 77, "written only on RKV_OK");
        assert_eq!(rkv_hybrid_match(t, 0, null(), 0, &mut m), RKV_OK);
        assert_eq!((m.device_prefix_len, m.last_device_node, m.has_last_visited), (0, root(t), 0));

        // insert: short values, NULL callback, NULL out, a Mamba state or an SWA prefix
        // on a tree without them; nothing inserted.
        let mut r = rkv_hybrid_insert_result { prefix_len: 99, ..Default::default() };
        let ins = |vals: &[i64], swa: usize, st: &[i64], f: rkv_hybrid_action_fn, r: *mut _| {
            rkv_hybrid_insert(
                t,
                0,
                key.as_ptr(),
                4,
                vals.as_ptr(),
                vals.len(),
                0,
                swa,
                st.as_ptr(),
                st.len(),
                f,
                bp.cast(),
                r,
                null_mut(),
            )
        };
        assert_eq!(ins(&[1, 2, 3], 0, &[], Some(on_action), &mut r), RKV_INVALID_ARGUMENT);
        assert!(last_error().contains("values has 3 indices"), "{}", last_error());
        assert_eq!(ins(&[1, 2, 3, 4], 0, &[], None, &mut r), RKV_NULL_ARGUMENT);
        assert_eq!(ins(&[1, 2, 3, 4], 0, &[], Some(on_action), null_mut()), RKV_NULL_ARGUMENT);
        assert_eq!(ins(&[1, 2, 3, 4], 0, &[5], Some(on_action), &mut r), RKV_INVALID_ARGUMENT);
        assert!(last_error().contains("no Mamba component"), "{}", last_error());
        assert_eq!(ins(&[1, 2, 3, 4], 2, &[], Some(on_action), &mut r), RKV_INVALID_ARGUMENT);
        assert!(last_error().contains("no SWA component"), "{}", last_error());
        assert_eq!(r.prefix_len, 99, "written only on RKV_OK");
        assert_eq!(sizes(t), rkv_hybrid_sizes::default(), "nothing inserted");
        assert_eq!(ins(&[1, 2, 3, 4], 0, &[], Some(on_action), &mut r), RKV_OK);
        let leaf = r.node;

        // Components the tree does not have, and numbers that are not components.
        let mut e = 42u64;
        assert_eq!(
            rkv_hybrid_evict(t, 1, 4, Some(on_free), bp.cast(), &mut e),
            RKV_INVALID_ARGUMENT
        );
        assert!(last_error().contains("no such component"), "{}", last_error());
        assert_eq!(
            rkv_hybrid_evict(t, 2, 4, Some(on_free), bp.cast(), &mut e),
            RKV_INVALID_ARGUMENT
        );
        assert_eq!(
            rkv_hybrid_evict(t, 3, 4, Some(on_free), bp.cast(), &mut e),
            RKV_INVALID_ARGUMENT
        );
        assert!(last_error().contains("not an rkv_hybrid_component"), "{}", last_error());
        assert_eq!(rkv_hybrid_evict(t, 0, 4, None, null_mut(), &mut e), RKV_NULL_ARGUMENT);
        assert_eq!(
            rkv_hybrid_evict(t, 0, 4, Some(on_free), bp.cast(), null_mut()),
            RKV_NULL_ARGUMENT
        );
        assert_eq!(e, 42, "written only on RKV_OK");
        let v = [1i64, 2, 3, 4];
        assert_eq!(rkv_hybrid_swa_set_value(t, leaf, v.as_ptr(), 4), RKV_INVALID_ARGUMENT);
        assert_eq!(rkv_hybrid_swa_refresh(t, leaf), RKV_INVALID_ARGUMENT);
        let mut nf = 7usize;
        assert_eq!(
            rkv_hybrid_mamba_evict_excess(t, leaf, 1, Some(on_free), bp.cast(), &mut nf),
            RKV_INVALID_ARGUMENT
        );
        assert_eq!(nf, 7);

        // Missing nodes.
        let mut rc = rkv_hybrid_receipt { id: 5, ..Default::default() };
        assert_eq!(rkv_hybrid_lock(t, 12345, &mut rc), RKV_INVALID_ARGUMENT);
        assert!(last_error().contains("12345"), "{}", last_error());
        assert_eq!(rc.id, 5, "written only on RKV_OK");
        assert_eq!(rkv_hybrid_lock(t, leaf, null_mut()), RKV_NULL_ARGUMENT);
        let mut n = 3usize;
        let mut buf = [0i64; 4];
        assert_eq!(
            rkv_hybrid_collect(t, 12345, root(t), buf.as_mut_ptr(), 4, &mut n),
            RKV_INVALID_ARGUMENT
        );
        assert_eq!(
            rkv_hybrid_collect(t, leaf, 12345, buf.as_mut_ptr(), 4, &mut n),
            RKV_INVALID_ARGUMENT
        );
        // collect: NULL with a capacity, too small (the length written), not an ancestor.
        assert_eq!(rkv_hybrid_collect(t, leaf, root(t), null_mut(), 4, &mut n), RKV_NULL_ARGUMENT);
        assert_eq!(
            rkv_hybrid_collect(t, leaf, root(t), buf.as_mut_ptr(), 4, null_mut()),
            RKV_NULL_ARGUMENT
        );
        assert_eq!(n, 3);
        assert_eq!(
            rkv_hybrid_collect(t, leaf, root(t), buf.as_mut_ptr(), 2, &mut n),
            RKV_BUFFER_TOO_SMALL
        );
        assert_eq!((n, buf), (4, [0; 4]), "only the length on RKV_BUFFER_TOO_SMALL");
        assert_eq!(
            rkv_hybrid_collect(t, root(t), leaf, buf.as_mut_ptr(), 4, &mut n),
            RKV_INVALID_ARGUMENT
        );
        assert!(last_error().contains("not an ancestor"), "{}", last_error());
        assert_eq!(rkv_hybrid_collect(t, leaf, leaf, buf.as_mut_ptr(), 4, &mut n), RKV_OK);
        assert_eq!(n, 0);

        // Receipts: NULL, unknown, changed, released twice, from before a reset.
        assert_eq!(rkv_hybrid_unlock(t, null()), RKV_NULL_ARGUMENT);
        assert_eq!(
            rkv_hybrid_unlock(t, &rkv_hybrid_receipt { id: 9, node: leaf, swa_uuid: 0 }),
            RKV_INVALID_LOCK
        );
        assert_eq!(rkv_hybrid_lock(t, leaf, &mut rc), RKV_OK);
        let forged = rkv_hybrid_receipt { node: root(t), ..rc };
        assert_eq!(rkv_hybrid_unlock(t, &forged), RKV_INVALID_LOCK);
        assert!(last_error().contains("releases only what its lock returned"), "{}", last_error());
        assert_eq!(sizes(t).full_protected, 4, "a refused release changes nothing");
        assert_eq!(rkv_hybrid_unlock(t, &rc), RKV_OK);
        assert_eq!(rkv_hybrid_unlock(t, &rc), RKV_INVALID_LOCK);
        assert_eq!(rkv_hybrid_release_window(t, &rc, Some(on_free), bp.cast()), RKV_INVALID_LOCK);
        assert_eq!(rkv_hybrid_lock(t, leaf, &mut rc), RKV_OK);
        assert_eq!(rkv_hybrid_reset(t, None, null_mut()), RKV_OK);
        assert_eq!(rkv_hybrid_unlock(t, &rc), RKV_INVALID_LOCK);
        // Another tree's receipt is refused.
        let t2 = new_tree(2, 0, false);
        let mut other = rkv_hybrid_receipt::default();
        assert_eq!(rkv_hybrid_lock(t2, root(t2), &mut other), RKV_OK);
        assert_eq!(
            rkv_hybrid_unlock(t, &rkv_hybrid_receipt { node: root(t), ..other }),
            RKV_INVALID_LOCK
        );
        assert_eq!(rkv_hybrid_unlock(t2, &other), RKV_OK);
        rkv_hybrid_free(t2);
        // The root's lock locks nothing and is released once.
        assert_eq!(rkv_hybrid_lock(t, root(t), &mut rc), RKV_OK);
        assert_eq!(rkv_hybrid_unlock(t, &rc), RKV_OK);
        check(t);
        rkv_hybrid_free(t);
    }
}

#[test]
fn mamba_refusals_and_the_path_cap() {
    let t = new_tree(1, 0, true);
    let mut b = Books::new(t);
    let bp: *mut Books = &mut b;
    // Three states on one path: 0..2, 0..4, 0..6.
    insert(t, &mut b, &[1, 2], &[1, 2], 0, &[50]);
    insert(t, &mut b, &[1, 2, 3, 4], &[1, 2, 3, 4], 2, &[51]);
    let r = insert(t, &mut b, &[1, 2, 3, 4, 5, 6], &[1, 2, 3, 4, 5, 6], 4, &[52]);
    assert_eq!(sizes(t).mamba_evictable, 3);
    // SAFETY: live locals.
    unsafe {
        let mut n = 0usize;
        assert_eq!(
            rkv_hybrid_mamba_evict_excess(t, r.node, 0, Some(on_free), bp.cast(), &mut n),
            RKV_INVALID_ARGUMENT
        );
        assert_eq!(
            rkv_hybrid_mamba_evict_excess(t, r.node, 1, None, null_mut(), &mut n),
            RKV_NULL_ARGUMENT
        );
        assert_eq!(
            rkv_hybrid_mamba_evict_excess(t, 999, 1, Some(on_free), bp.cast(), &mut n),
            RKV_INVALID_ARGUMENT
        );
        assert_eq!(
            rkv_hybrid_mamba_evict_excess(t, r.node, 1, Some(on_free), bp.cast(), &mut n),
            RKV_OK
        );
        assert_eq!(n, 2);
        assert_eq!((*bp).freed(RKV_HYBRID_MAMBA), vec![50, 51]);
        assert_eq!(sizes(t).mamba_evictable, 1);
        check(t);
        rkv_hybrid_free(t);
    }
}

#[test]
fn a_poisoned_tree_refuses_every_call_without_a_panic() {
    let t = new_tree(1, 0, false);
    let addr = t as usize;
    // A thread panics holding the tree's mutex.
    let _ = std::thread::spawn(move || {
        // SAFETY: the tree is live for the whole test.
        let h = unsafe { &*(addr as *const rkv_hybrid) };
        let _g = h.inner.lock().unwrap();
        panic!("poison the tree's mutex");
    })
    .join();
    let mut s = rkv_hybrid_sizes::default();
    // SAFETY: `t` is live (its mutex poisoned), `s` a local.
    unsafe {
        assert_eq!(rkv_hybrid_sizes_get(t, &mut s), RKV_INTERNAL_ERROR);
        assert!(last_error().contains("poisoned"), "{}", last_error());
        assert_eq!(rkv_hybrid_check(t), RKV_INTERNAL_ERROR);
        rkv_hybrid_free(t);
    }
}

#[test]
fn many_threads_share_one_tree() {
    let t = new_tree(1, 2, true);
    let addr = t as usize;
    std::thread::scope(|s| {
        for th in 0..4i64 {
            s.spawn(move || {
                let t = addr as *const rkv_hybrid;
                let mut b = Books::new(t);
                for i in 0..50i64 {
                    let key: Vec<i64> = (0..6).map(|k| th * 1000 + (i % 5) * 10 + k).collect();
                    let mut m = rkv_hybrid_match_result::default();
                    let mut rc = rkv_hybrid_receipt::default();
                    // SAFETY: live locals; the tree outlives the scope.
                    let st = unsafe {
                        rkv_hybrid_match_lock(t, 0, key.as_ptr(), key.len(), &mut m, &mut rc)
                    };
                    assert_eq!(st, RKV_OK);
                    let vals: Vec<i64> = key.iter().map(|k| k + 1_000_000 * (i + 1)).collect();
                    // Locked from the insert on: another thread's eviction cannot take the
                    // new nodes before their SWA values and the refresh.
                    let mut r2 = rkv_hybrid_receipt::default();
                    let s = [th * 100 + i];
                    insert_locked(t, &mut b, &key, &vals, m.device_prefix_len, &s, &mut r2);
                    // SAFETY: as above.
                    assert_eq!(unsafe { rkv_hybrid_unlock(t, &rc) }, RKV_OK);
                    // SAFETY: as above.
                    assert_eq!(unsafe { rkv_hybrid_unlock(t, &r2) }, RKV_OK);
                    if i % 7 == 0 {
                        evict(t, &mut b, RKV_HYBRID_FULL, 8);
                    }
                }
            });
        }
    });
    check(t);
    // SAFETY: nothing uses `t` afterwards.
    unsafe { rkv_hybrid_free(t) };
}
