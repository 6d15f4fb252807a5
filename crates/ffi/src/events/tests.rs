//! Every error path of the KV-event functions of the C ABI: the status, the message
//! `rkv_last_error_message` gives, that no output was written and that the cache is
//! unchanged; and the drained events against the spec's hash vectors.

use super::*;

use std::ffi::{CStr, CString};
use std::ptr::{null, null_mut};

use crate::{
    rkv_alloc, rkv_cache_free, rkv_cache_new, rkv_cache_stats, rkv_evict, rkv_insert,
    rkv_last_error_message, rkv_options, rkv_options_default, rkv_stats,
};

/// This thread's last error message.
fn last() -> String {
    // SAFETY: `rkv_last_error_message` returns a NUL-terminated string, never NULL, valid
    // until the next status-returning call on this thread (it is copied at once).
    unsafe { CStr::from_ptr(rkv_last_error_message()) }.to_str().unwrap().to_owned()
}

/// Asserts that `got` is `want` and that the message contains every one of `needles`.
#[track_caller]
fn check(got: rkv_status, want: rkv_status, needles: &[&str]) {
    let m = last();
    assert_eq!(got, want, "message: {m}");
    for n in needles {
        assert!(m.contains(n), "{m:?} lacks {n:?}");
    }
}

#[track_caller]
fn ok(got: rkv_status) {
    assert_eq!(got, rkv_status::RKV_OK, "{}", last());
    assert_eq!(last(), "", "a success clears the message");
}

/// A cache of page size `page` with a pool of `pool` slots; freed by the caller.
fn new_cache(page: u32, pool: u64) -> *mut rkv_cache {
    let o = rkv_options { page_size: page, pool_slots: pool, ..rkv_options_default() };
    let mut c = null_mut();
    // SAFETY: both pointers point to live locals.
    ok(unsafe { rkv_cache_new(&o, &mut c) });
    c
}

/// A cache with events on (default options).
fn events_cache(page: u32, pool: u64) -> *mut rkv_cache {
    let c = new_cache(page, pool);
    // SAFETY: `c` is live and used by this thread only.
    ok(unsafe { rkv_events_enable(c, &rkv_events_options_default()) });
    c
}

/// Inserts `tokens` into namespace `ns` of pooled cache `c` with fresh slots.
fn insert(c: *const rkv_cache, ns: u64, tokens: &[u32]) {
    let mut slots = vec![0u32; tokens.len()];
    let mut existing = 0;
    // SAFETY: `c` is live; the arrays have `tokens.len()` entries.
    unsafe {
        ok(rkv_alloc(c, tokens.len(), slots.as_mut_ptr()));
        ok(rkv_insert(c, ns, tokens.as_ptr(), slots.as_ptr(), tokens.len(), &mut existing));
    }
}

fn stats(c: *const rkv_cache) -> rkv_stats {
    let mut s = rkv_stats::default();
    // SAFETY: `c` is live; `s` is a live local.
    ok(unsafe { rkv_cache_stats(c, &mut s) });
    s
}

fn flush(c: *const rkv_cache) -> u64 {
    let mut seq = 7;
    // SAFETY: `c` is live; `seq` a live local.
    ok(unsafe { rkv_events_flush(c, &mut seq) });
    seq
}

fn counters(c: *const rkv_cache) -> rkv_events_stats {
    let mut s = rkv_events_stats::default();
    // SAFETY: `c` is live; `s` a live local.
    ok(unsafe { rkv_events_counters(c, &mut s) });
    s
}

/// An event as owned values, copied out of the caller buffers it points into.
#[derive(Debug, Clone, PartialEq)]
struct Ev {
    seq: u64,
    kind: u32,
    hashes: Vec<u64>,
    parent: Option<u64>,
    tokens: Vec<u32>,
    block_size: u32,
    lora: Option<String>,
    salt: Option<String>,
}

fn owned(e: &rkv_event) -> Ev {
    // SAFETY: the event was just written by `rkv_events_drain`, and its arrays and strings
    // point into buffers that are still alive (the caller's `Buffers`).
    unsafe {
        let arr = |p: *const u64, n| {
            if n == 0 { vec![] } else { std::slice::from_raw_parts(p, n).to_vec() }
        };
        let s = |p: *const c_char| {
            (!p.is_null()).then(|| CStr::from_ptr(p).to_str().unwrap().to_owned())
        };
        Ev {
            seq: e.seq,
            kind: e.kind,
            hashes: arr(e.block_hashes, e.n_block_hashes),
            parent: (e.has_parent == 1).then_some(e.parent_block_hash),
            tokens: if e.n_token_ids == 0 {
                vec![]
            } else {
                std::slice::from_raw_parts(e.token_ids, e.n_token_ids).to_vec()
            },
            block_size: e.block_size,
            lora: s(e.lora_name),
            salt: s(e.cache_salt),
        }
    }
}

/// Caller buffers for `rkv_events_drain`.
struct Buffers {
    events: Vec<rkv_event>,
    hashes: Vec<u64>,
    tokens: Vec<u32>,
    strings: Vec<c_char>,
}

const BLANK: rkv_event = rkv_event {
    seq: 0xdead,
    ts: 0.0,
    kind: 0xdead,
    medium: 0,
    block_size: 0,
    has_parent: 0,
    parent_block_hash: 0,
    block_hashes: null(),
    n_block_hashes: 0,
    token_ids: null(),
    n_token_ids: 0,
    lora_name: null(),
    cache_salt: null(),
};

impl Buffers {
    fn new(events: usize, hashes: usize, tokens: usize, strings: usize) -> Self {
        Buffers {
            events: vec![BLANK; events],
            hashes: vec![0xdead; hashes],
            tokens: vec![0xdead; tokens],
            strings: vec![0x55; strings],
        }
    }

    /// `rkv_events_drain` into these buffers.
    fn drain(&mut self, c: *const rkv_cache) -> (rkv_status, rkv_events_drain_info) {
        let mut info = rkv_events_drain_info { n_batches: 0xdead, ..Default::default() };
        // SAFETY: `c` is live; every buffer is a live Vec of the capacity passed.
        let st = unsafe {
            rkv_events_drain(
                c,
                self.events.as_mut_ptr(),
                self.events.len(),
                self.hashes.as_mut_ptr(),
                self.hashes.len(),
                self.tokens.as_mut_ptr(),
                self.tokens.len(),
                self.strings.as_mut_ptr(),
                self.strings.len(),
                &mut info,
            )
        };
        (st, info)
    }

    fn untouched(&self) -> bool {
        self.events.iter().all(|e| e.seq == 0xdead && e.kind == 0xdead)
            && self.hashes.iter().all(|&h| h == 0xdead)
            && self.tokens.iter().all(|&t| t == 0xdead)
            && self.strings.iter().all(|&b| b == 0x55)
    }
}

/// Drains everything queued into buffers large enough, as owned events.
fn drain_all(c: *const rkv_cache) -> Vec<Ev> {
    let mut b = Buffers::new(0, 0, 0, 0);
    let (st, info) = b.drain(c);
    if st == rkv_status::RKV_OK {
        assert_eq!(info.n_batches, 0);
        return vec![];
    }
    assert_eq!(st, rkv_status::RKV_BUFFER_TOO_SMALL, "{}", last());
    let mut b = Buffers::new(info.n_events, info.n_hashes, info.n_tokens, info.n_string_bytes);
    let (st, got) = b.drain(c);
    ok(st);
    assert_eq!((got.n_events, got.batches_left), (info.n_events, 0));
    b.events[..got.n_events].iter().map(owned).collect()
}

const STORED: u32 = rkv_event_kind::RKV_EVENT_BLOCK_STORED as u32;
const REMOVED: u32 = rkv_event_kind::RKV_EVENT_BLOCK_REMOVED as u32;
/// The spec's vectors (KV_EVENTS.md, "Block hashes"): tokens 1..16 as one page, and the
/// sequence hash of the next page 17..32.
const PAGE_1: u64 = 16863443419780771464;
const PAGE_2: u64 = 12466389667045779788;

#[test]
fn options_defaults() {
    let o = rkv_events_options_default();
    assert_eq!((o.hash_mode, o.medium, o.max_drain_batches), (0, 0, 1 << 16));
    let p = rkv_publisher_options_default();
    // SAFETY: the default endpoint is a static NUL-terminated string.
    assert_eq!(unsafe { CStr::from_ptr(p.endpoint) }.to_str().unwrap(), "tcp://*:5557");
    assert!(p.replay_endpoint.is_null() && p.topic.is_null());
    assert_eq!(
        (p.encoding, p.buffer_steps, p.max_queue, p.auto_flush_ms, p.linger_ms),
        (0, 10_000, 100_000, 10, 1000)
    );
    assert_eq!(p.data_parallel_rank, 0);
}

#[test]
fn enable_checks_its_arguments_and_the_cache() {
    let d = rkv_events_options_default();
    let c = new_cache(16, 256);
    let mut buf = [0u64; 8];
    let misaligned = buf.as_mut_ptr().cast::<u8>().wrapping_add(1).cast::<rkv_events_options>();
    // SAFETY: `c` is live and used by this thread only; the other pointers are NULL,
    // misaligned (refused before use) or live locals.
    unsafe {
        check(
            rkv_events_enable(null_mut(), &d),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_events_enable: cache is NULL"],
        );
        check(
            rkv_events_enable(c, null()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_events_enable: opts is NULL"],
        );
        check(
            rkv_events_enable(c, misaligned),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["opts = 0x", "is not aligned to 8 bytes"],
        );
        let bad = rkv_events_options { hash_mode: 2, ..d };
        check(
            rkv_events_enable(c, &bad),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["opts->hash_mode = 2 is not an rkv_hash_mode"],
        );
        let bad = rkv_events_options { medium: 9, ..d };
        check(
            rkv_events_enable(c, &bad),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["opts->medium = 9 is not an rkv_medium"],
        );
        // None of those turned events on.
        let mut seq = 7;
        check(
            rkv_events_flush(c, &mut seq),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_events_flush: events are not enabled on this cache"],
        );
        assert_eq!(seq, 7);
        ok(rkv_events_enable(c, &d));
        check(
            rkv_events_enable(c, &d),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_events_enable: events are enabled on this cache already"],
        );
        rkv_cache_free(c);

        // A cache with pages: refused, and it keeps working without events.
        let c = new_cache(16, 256);
        insert(c, 0, &(1..=16).collect::<Vec<_>>());
        check(
            rkv_events_enable(c, &d),
            rkv_status::RKV_INVALID_ARGUMENT,
            &[
                "the cache is not empty (16 tokens cached in 1 namespaces)",
                "right after rkv_cache_new",
            ],
        );
        insert(c, 0, &(1..=32).collect::<Vec<_>>());
        assert_eq!(stats(c).cached_tokens, 32);
        let mut s = rkv_events_stats::default();
        check(
            rkv_events_counters(c, &mut s),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["events are not enabled"],
        );
        rkv_cache_free(c);
    }
}

#[test]
fn set_namespace_names_and_refuses() {
    let c = events_cache(16, 256);
    let plain = new_cache(16, 0);
    // SAFETY: the caches are live; the strings are NUL-terminated literals or NULL.
    unsafe {
        check(
            rkv_events_set_namespace(null(), 1, c"a".as_ptr(), null()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_events_set_namespace: cache is NULL"],
        );
        check(
            rkv_events_set_namespace(plain, 1, c"a".as_ptr(), null()),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["events are not enabled"],
        );
        let bad_utf8 = [b'a' as c_char, 0xff_u8 as c_char, 0];
        check(
            rkv_events_set_namespace(c, 1, null(), bad_utf8.as_ptr()),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["cache_salt is not valid UTF-8 (the first bad byte is at 1)"],
        );
        check(
            rkv_events_set_namespace(c, 1, c"".as_ptr(), null()),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["may not be empty"],
        );
        ok(rkv_events_set_namespace(c, 1, c"adapter-a".as_ptr(), c"tenant".as_ptr()));
        ok(rkv_events_set_namespace(c, 2, c"adapter-b".as_ptr(), null()));
        insert(c, 1, &(1..=16).collect::<Vec<_>>());
        insert(c, 2, &(1..=16).collect::<Vec<_>>());
        insert(c, 3, &(1..=16).collect::<Vec<_>>());
        check(
            rkv_events_set_namespace(c, 1, null(), null()),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["namespace 1 already has hashed pages"],
        );
        assert_eq!(flush(c), 0);
        let ev = drain_all(c);
        assert_eq!(ev.len(), 3);
        assert_eq!(
            (ev[0].lora.as_deref(), ev[0].salt.as_deref()),
            (Some("adapter-a"), Some("tenant"))
        );
        assert_eq!((ev[1].lora.as_deref(), ev[1].salt.as_deref()), (Some("adapter-b"), None));
        assert_eq!((ev[2].lora.as_deref(), ev[2].salt.as_deref()), (None, Some("3")));
        assert!(ev.iter().all(|e| e.kind == STORED && e.block_size == 16));
        // Three namespaces with the same tokens: three different hashes, none the base's.
        let mut h: Vec<u64> = ev.iter().map(|e| e.hashes[0]).chain([PAGE_1]).collect();
        h.sort_unstable();
        h.dedup();
        assert_eq!(h.len(), 4);
        rkv_cache_free(plain);
        rkv_cache_free(c);
    }
}

#[test]
fn flush_and_counters() {
    let c = events_cache(16, 256);
    let mut seq = 7u64;
    // SAFETY: `c` is live; the outputs are NULL or live locals.
    unsafe {
        check(
            rkv_events_flush(null(), &mut seq),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_events_flush: cache is NULL"],
        );
        check(
            rkv_events_flush(c, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_events_flush: out_seq is NULL"],
        );
        check(
            rkv_events_counters(c, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_events_counters: out_stats is NULL"],
        );
        assert_eq!(seq, 7);
    }
    assert_eq!(flush(c), RKV_EVENTS_NO_SEQ, "nothing recorded: no batch");
    insert(c, 0, &(1..=16).collect::<Vec<_>>());
    assert_eq!(flush(c), 0);
    assert_eq!(flush(c), RKV_EVENTS_NO_SEQ);
    insert(c, 0, &(1..=32).collect::<Vec<_>>());
    assert_eq!(flush(c), 1);
    assert_eq!(counters(c), rkv_events_stats { batches: 2, events: 2, dropped: 0 });
    // SAFETY: `c` is live and no longer used.
    unsafe { rkv_cache_free(c) };
}

#[test]
fn drain_checks_its_buffers_and_a_too_small_one_takes_nothing() {
    let c = events_cache(16, 256);
    insert(c, 0, &(1..=16).collect::<Vec<_>>());
    assert_eq!(flush(c), 0);
    insert(c, 0, &(1..=32).collect::<Vec<_>>());
    assert_eq!(flush(c), 1);
    let mut info = rkv_events_drain_info { n_batches: 0xdead, ..Default::default() };
    let untouched = rkv_events_drain_info { n_batches: 0xdead, ..Default::default() };
    let mut h = [0u64; 4];
    // SAFETY: `c` is live; every buffer is NULL (with or without a capacity, refused
    // before use), misaligned (refused before use) or a live local of the capacity passed.
    unsafe {
        let z = null_mut();
        check(
            rkv_events_drain(null(), z, 0, z.cast(), 0, z.cast(), 0, z.cast(), 0, &mut info),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_events_drain: cache is NULL"],
        );
        check(
            rkv_events_drain(c, z, 3, z.cast(), 0, z.cast(), 0, z.cast(), 0, &mut info),
            rkv_status::RKV_NULL_ARGUMENT,
            &["out_events is NULL but events_cap = 3"],
        );
        check(
            rkv_events_drain(c, z, 0, z.cast(), 1, z.cast(), 0, z.cast(), 0, &mut info),
            rkv_status::RKV_NULL_ARGUMENT,
            &["out_hashes is NULL but hashes_cap = 1"],
        );
        check(
            rkv_events_drain(c, z, 0, z.cast(), 0, z.cast(), 2, z.cast(), 0, &mut info),
            rkv_status::RKV_NULL_ARGUMENT,
            &["out_tokens is NULL but tokens_cap = 2"],
        );
        check(
            rkv_events_drain(c, z, 0, z.cast(), 0, z.cast(), 0, z.cast(), 5, &mut info),
            rkv_status::RKV_NULL_ARGUMENT,
            &["out_strings is NULL but strings_cap = 5"],
        );
        let odd = h.as_mut_ptr().cast::<u8>().wrapping_add(1).cast::<u64>();
        check(
            rkv_events_drain(c, z, 0, odd, 2, z.cast(), 0, z.cast(), 0, &mut info),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["out_hashes = 0x", "is not aligned to 8 bytes"],
        );
        check(
            rkv_events_drain(c, z, 0, z.cast(), 0, z.cast(), 0, z.cast(), 0, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_events_drain: out_info is NULL"],
        );
        assert_eq!(info, untouched);
        let plain = new_cache(16, 0);
        check(
            rkv_events_drain(plain, z, 0, z.cast(), 0, z.cast(), 0, z.cast(), 0, &mut info),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["events are not enabled"],
        );
        rkv_cache_free(plain);
    }
    assert_eq!(info, untouched);

    // Room for all but one token of the first batch: nothing taken, the sizes of all of
    // it reported.
    let mut b = Buffers::new(2, 2, 15, 0);
    let (st, info) = b.drain(c);
    check(
        st,
        rkv_status::RKV_BUFFER_TOO_SMALL,
        &[
            "rkv_events_drain: the first of the 2 queued batches does not fit",
            "all of them need 2 events, 2 hashes, 32 tokens, 0 string bytes",
            "nothing was taken",
        ],
    );
    let need = rkv_events_drain_info {
        n_batches: 2,
        n_events: 2,
        n_hashes: 2,
        n_tokens: 32,
        n_string_bytes: 0,
        batches_left: 2,
    };
    assert_eq!(info, need);
    assert!(b.untouched(), "only *out_info is written on RKV_BUFFER_TOO_SMALL");
    // Room for the first batch only: it is taken, the second stays queued.
    let mut b = Buffers::new(1, 1, 16, 0);
    let (st, info) = b.drain(c);
    ok(st);
    assert_eq!(
        info,
        rkv_events_drain_info {
            n_batches: 1,
            n_events: 1,
            n_hashes: 1,
            n_tokens: 16,
            n_string_bytes: 0,
            batches_left: 1
        }
    );
    let first = owned(&b.events[0]);
    assert_eq!((first.seq, first.hashes.clone(), first.parent), (0, vec![PAGE_1], None));
    assert_eq!(first.tokens, (1..=16).collect::<Vec<_>>());
    // The rest, exactly sized.
    let ev = drain_all(c);
    assert_eq!(ev.len(), 1);
    assert_eq!((ev[0].seq, ev[0].hashes.clone(), ev[0].parent), (1, vec![PAGE_2], Some(PAGE_1)));
    assert_eq!(ev[0].tokens, (17..=32).collect::<Vec<_>>());
    let (st, info) = Buffers::new(0, 0, 0, 0).drain(c);
    ok(st);
    assert_eq!(info, rkv_events_drain_info::default(), "nothing queued: all zeros");
    // SAFETY: `c` is live and no longer used.
    unsafe { rkv_cache_free(c) };
}

#[test]
fn an_insert_and_evict_cycle_drains_the_spec_hashes() {
    let c = events_cache(16, 256);
    let mut n = 0;
    insert(c, 0, &(1..=32).collect::<Vec<_>>());
    // SAFETY: `c` is live (pool mode: no callback needed); `n` a live local.
    ok(unsafe { rkv_evict(c, usize::MAX, None, null_mut(), &mut n) });
    assert_eq!(n, 32);
    insert(c, 0, &(1..=16).collect::<Vec<_>>());
    assert_eq!(flush(c), 0);
    let ev = drain_all(c);
    assert_eq!(ev.len(), 3, "{ev:?}");
    assert_eq!((ev[0].kind, &ev[0].hashes, ev[0].parent), (STORED, &vec![PAGE_1, PAGE_2], None));
    assert_eq!(ev[0].tokens, (1..=32).collect::<Vec<_>>());
    assert_eq!((ev[0].block_size, ev[0].lora.as_deref(), ev[0].salt.as_deref()), (16, None, None));
    assert_eq!(ev[1].kind, REMOVED);
    let mut removed = ev[1].hashes.clone();
    removed.sort_unstable();
    assert_eq!(removed, {
        let mut v = vec![PAGE_1, PAGE_2];
        v.sort_unstable();
        v
    });
    assert!(ev[1].tokens.is_empty() && ev[1].block_size == 0);
    assert_eq!((ev[2].kind, &ev[2].hashes), (STORED, &vec![PAGE_1]));
    assert!(ev.iter().all(|e| e.seq == 0));
    // SAFETY: `c` is live and no longer used.
    unsafe { rkv_cache_free(c) };
}

#[test]
fn a_full_drain_queue_drops_whole_batches() {
    let c = new_cache(16, 256);
    let o = rkv_events_options { max_drain_batches: 1, ..rkv_events_options_default() };
    // SAFETY: `c` is live and used by this thread only.
    ok(unsafe { rkv_events_enable(c, &o) });
    insert(c, 0, &(1..=16).collect::<Vec<_>>());
    assert_eq!(flush(c), 0);
    insert(c, 0, &(1..=32).collect::<Vec<_>>());
    assert_eq!(flush(c), 1);
    assert_eq!(counters(c).dropped, 1);
    let ev = drain_all(c);
    assert_eq!(ev.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![0]);
    // SAFETY: `c` is live and no longer used.
    unsafe { rkv_cache_free(c) };
}

/// `rkv_events_publish` with `o`; the publisher on success.
fn publish(c: *const rkv_cache, o: &rkv_publisher_options) -> (rkv_status, *mut rkv_publisher) {
    let sentinel = std::ptr::dangling_mut::<rkv_publisher>();
    let mut p = sentinel;
    // SAFETY: `c` is live; `o`'s strings are NULL or NUL-terminated; `p` a live local.
    let st = unsafe { rkv_events_publish(c, o, &mut p) };
    if st != rkv_status::RKV_OK {
        assert_eq!(p, sentinel, "no output on failure");
    }
    (st, p)
}

fn quick() -> rkv_publisher_options {
    rkv_publisher_options {
        endpoint: c"tcp://127.0.0.1:*".as_ptr(),
        linger_ms: 0,
        auto_flush_ms: 0,
        ..rkv_publisher_options_default()
    }
}

#[test]
fn publish_refuses_bad_options_and_endpoints_and_leaves_the_cache_alone() {
    let c = events_cache(16, 256);
    let plain = new_cache(16, 0);
    let mut out = null_mut();
    // SAFETY: the caches are live; the pointers are NULL or live locals.
    unsafe {
        check(
            rkv_events_publish(null(), &quick(), &mut out),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_events_publish: cache is NULL"],
        );
        check(
            rkv_events_publish(c, null(), &mut out),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_events_publish: opts is NULL"],
        );
        check(
            rkv_events_publish(c, &quick(), null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_events_publish: out_publisher is NULL"],
        );
    }
    let not_utf8 = [0xc3_u8 as c_char, 0];
    let cases: [(rkv_publisher_options, rkv_status, &str); 7] = [
        (
            rkv_publisher_options { endpoint: null(), ..quick() },
            rkv_status::RKV_NULL_ARGUMENT,
            "opts->endpoint is NULL",
        ),
        (
            rkv_publisher_options { endpoint: c"nonsense".as_ptr(), ..quick() },
            rkv_status::RKV_INVALID_ARGUMENT,
            "cannot connect to \"nonsense\": Invalid argument",
        ),
        (
            rkv_publisher_options { endpoint: c"tcp://*:notaport".as_ptr(), ..quick() },
            rkv_status::RKV_INVALID_ARGUMENT,
            "tcp://*:notaport",
        ),
        (
            rkv_publisher_options { endpoint: c"inproc://x".as_ptr(), ..quick() },
            rkv_status::RKV_INVALID_ARGUMENT,
            "inproc:// is not supported",
        ),
        (
            rkv_publisher_options { encoding: 5, ..quick() },
            rkv_status::RKV_INVALID_ARGUMENT,
            "opts->encoding = 5 is not an rkv_encoding",
        ),
        (
            rkv_publisher_options { max_queue: 0, ..quick() },
            rkv_status::RKV_INVALID_ARGUMENT,
            "opts->max_queue = 0",
        ),
        (
            rkv_publisher_options { topic: not_utf8.as_ptr(), ..quick() },
            rkv_status::RKV_INVALID_ARGUMENT,
            "opts->topic is not valid UTF-8",
        ),
    ];
    for (o, want, needle) in cases {
        let (st, _) = publish(c, &o);
        check(st, want, &["rkv_events_publish: ", needle]);
    }
    let (st, _) = publish(plain, &quick());
    check(st, rkv_status::RKV_INVALID_ARGUMENT, &["events are not enabled"]);

    // An address in use: RKV_IO_ERROR, on the PUB and on the replay endpoint.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    // The PUB socket binds an endpoint with a `*` (else it connects); replay always binds.
    let taken_pub = CString::new(format!("tcp://*:{port}")).unwrap();
    let taken = CString::new(format!("tcp://127.0.0.1:{port}")).unwrap();
    let (st, _) = publish(c, &rkv_publisher_options { endpoint: taken_pub.as_ptr(), ..quick() });
    check(st, rkv_status::RKV_IO_ERROR, &["rkv_events_publish: I/O error", "in use"]);
    let (st, _) = publish(c, &rkv_publisher_options { replay_endpoint: taken.as_ptr(), ..quick() });
    check(st, rkv_status::RKV_IO_ERROR, &["in use"]);

    // None of the failures attached anything: events still drain, and a publisher starts.
    insert(c, 0, &(1..=16).collect::<Vec<_>>());
    assert_eq!(flush(c), 0);
    assert_eq!(drain_all(c).len(), 1);
    let (st, p) = publish(c, &quick());
    ok(st);
    let (st, _) = publish(c, &quick());
    check(st, rkv_status::RKV_INVALID_ARGUMENT, &["a publisher is attached to this sink already"]);
    // SAFETY: `p` and the caches are live and no longer used afterwards.
    unsafe {
        rkv_publisher_free(p);
        rkv_cache_free(plain);
        rkv_cache_free(c);
    }
}

#[test]
fn a_publisher_starts_reports_stops_and_outlives_its_cache() {
    let c = events_cache(16, 256);
    let o = rkv_publisher_options { replay_endpoint: c"tcp://127.0.0.1:*".as_ptr(), ..quick() };
    let (st, p) = publish(c, &o);
    ok(st);
    let (mut ep, mut replay) = (null(), null());
    let mut s = rkv_publisher_stats::default();
    // SAFETY: `p` is live; the outputs are NULL or live locals; the endpoint strings are
    // owned by `p` and read before it is freed.
    unsafe {
        check(
            rkv_publisher_endpoint(null(), &mut ep, &mut replay),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_publisher_endpoint: publisher is NULL"],
        );
        check(
            rkv_publisher_endpoint(p, null_mut(), &mut replay),
            rkv_status::RKV_NULL_ARGUMENT,
            &["out_endpoint is NULL"],
        );
        check(
            rkv_publisher_endpoint(p, &mut ep, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["out_replay_endpoint is NULL"],
        );
        check(
            rkv_publisher_counters(null(), &mut s),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_publisher_counters: publisher is NULL"],
        );
        check(
            rkv_publisher_counters(p, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["out_stats is NULL"],
        );
        check(
            rkv_publisher_stop(null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_publisher_stop: publisher is NULL"],
        );
        assert!(ep.is_null() && replay.is_null());
        ok(rkv_publisher_endpoint(p, &mut ep, &mut replay));
        let ep = CStr::from_ptr(ep).to_str().unwrap();
        let replay = CStr::from_ptr(replay).to_str().unwrap();
        assert!(ep.starts_with("tcp://127.0.0.1:") && !ep.ends_with(":*"), "{ep}");
        assert!(replay.starts_with("tcp://127.0.0.1:") && replay != ep, "{replay}");
    }
    insert(c, 0, &(1..=16).collect::<Vec<_>>());
    assert_eq!(flush(c), 0);
    // Batches go to the publisher now: the drain queue stays empty.
    assert!(drain_all(c).is_empty());
    // SAFETY: the cache is freed first; the publisher stays valid, and is stopped (twice)
    // and freed after.
    unsafe {
        rkv_cache_free(c);
        ok(rkv_publisher_stop(p));
        ok(rkv_publisher_stop(p));
        ok(rkv_publisher_counters(p, &mut s));
        assert_eq!(s.published + s.dropped, 1, "{s:?}");
        rkv_publisher_free(p);
        rkv_publisher_free(null_mut());
    }
}

#[test]
fn stopping_detaches_so_the_cache_drains_again() {
    let c = events_cache(16, 256);
    let (st, p) = publish(c, &quick());
    ok(st);
    insert(c, 0, &(1..=16).collect::<Vec<_>>());
    // SAFETY: `p` is live; stopped, then freed.
    unsafe {
        ok(rkv_publisher_stop(p));
        // The stop flushed the pending store to the publisher.
        let mut s = rkv_publisher_stats::default();
        ok(rkv_publisher_counters(p, &mut s));
        assert_eq!(s.published + s.dropped, 1);
        rkv_publisher_free(p);
    }
    insert(c, 0, &(1..=32).collect::<Vec<_>>());
    assert_eq!(flush(c), 1);
    let ev = drain_all(c);
    assert_eq!((ev.len(), ev[0].seq, ev[0].parent), (1, 1, Some(PAGE_1)));
    // SAFETY: `c` is live and no longer used.
    unsafe { rkv_cache_free(c) };
}

/// `rkv_events_publish_ex` with `group`; the publisher on success.
fn publish_ex(c: *const rkv_cache, group: *const rkv_kv_group) -> (rkv_status, *mut rkv_publisher) {
    let sentinel = std::ptr::dangling_mut::<rkv_publisher>();
    let mut p = sentinel;
    let o = rkv_publisher_options { replay_endpoint: c"tcp://127.0.0.1:*".as_ptr(), ..quick() };
    // SAFETY: `c` is live; `o`'s strings are NULL or NUL-terminated; `group` NULL or a
    // live local; `p` a live local.
    let st = unsafe { rkv_events_publish_ex(c, &o, group, &mut p) };
    if st != rkv_status::RKV_OK {
        assert_eq!(p, sentinel, "no output on failure");
    }
    (st, p)
}

#[test]
fn kv_group_defaults_are_the_plain_publishers() {
    let d = rkv_kv_group_default();
    assert_eq!(
        (d.size, d.group_idx, d.spec_kind, d.sliding_window),
        (16, 0, rkv_kv_cache_spec_kind::RKV_KV_FULL_ATTENTION as u32, 0)
    );
}

#[test]
fn publish_ex_refuses_a_bad_group_and_leaves_the_cache_alone() {
    let c = events_cache(16, 256);
    let g = rkv_kv_group_default;
    let sliding = rkv_kv_cache_spec_kind::RKV_KV_SLIDING_WINDOW as u32;
    let cases: [(rkv_kv_group, &str); 6] = [
        (rkv_kv_group { size: 12, ..g() }, "group->size = 12 is not the size of an rkv_kv_group"),
        (
            rkv_kv_group { spec_kind: 10, ..g() },
            "group->spec_kind = 10 is not an rkv_kv_cache_spec_kind",
        ),
        (
            rkv_kv_group { spec_kind: sliding, ..g() },
            "group->sliding_window = 0: spec kind sliding_window needs its window",
        ),
        (
            rkv_kv_group {
                spec_kind: rkv_kv_cache_spec_kind::RKV_KV_SLIDING_WINDOW_MLA as u32,
                ..g()
            },
            "sliding_window_mla needs its window",
        ),
        (rkv_kv_group { sliding_window: 128, ..g() }, "a sliding window (128) only goes with"),
        (
            rkv_kv_group {
                spec_kind: rkv_kv_cache_spec_kind::RKV_KV_MAMBA as u32,
                sliding_window: 4,
                ..g()
            },
            "not mamba",
        ),
    ];
    for (group, needle) in cases {
        let (st, _) = publish_ex(c, &group);
        check(st, rkv_status::RKV_INVALID_ARGUMENT, &["rkv_events_publish_ex: ", needle]);
    }
    let mut out = null_mut();
    // SAFETY: the pointers are NULL or live locals.
    unsafe {
        check(
            rkv_events_publish_ex(null(), &quick(), &g(), &mut out),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_events_publish_ex: cache is NULL"],
        );
        check(
            rkv_events_publish_ex(c, &quick(), &g(), null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_events_publish_ex: out_publisher is NULL"],
        );
    }
    // Nothing was attached: events still drain, and a NULL group publishes the default.
    insert(c, 0, &(1..=16).collect::<Vec<_>>());
    assert_eq!(flush(c), 0);
    assert_eq!(drain_all(c).len(), 1);
    let (st, p) = publish_ex(c, null());
    ok(st);
    // SAFETY: `p` and `c` are live and no longer used afterwards.
    unsafe {
        rkv_publisher_free(p);
        rkv_cache_free(c);
    }
}

/// The group `rkv_events_publish_ex` was given is in the batches it sends (read back
/// through its replay socket and decoded).
#[test]
fn publish_ex_sends_the_group_in_every_store_and_removal() {
    use radixkv_core::events::wire::{EventGroup, KvCacheSpecKind, decode_batch};
    let c = events_cache(16, 16);
    let group = rkv_kv_group {
        group_idx: 3,
        spec_kind: rkv_kv_cache_spec_kind::RKV_KV_SLIDING_WINDOW as u32,
        sliding_window: 4096,
        ..rkv_kv_group_default()
    };
    let (st, p) = publish_ex(c, &group);
    ok(st);
    insert(c, 0, &(1..=16).collect::<Vec<_>>());
    let mut n = 0;
    // SAFETY: `c` is live; `n` a live local.
    ok(unsafe { rkv_evict(c, 16, None, null_mut(), &mut n) });
    assert_eq!(n, 16);
    assert_eq!(flush(c), 0);
    let (mut ep, mut replay) = (null(), null());
    let mut s = rkv_publisher_stats::default();
    // SAFETY: `p` is live; the outputs are live locals; the replay endpoint string is owned
    // by `p` and copied before it is freed.
    let replay = unsafe {
        ok(rkv_publisher_endpoint(p, &mut ep, &mut replay));
        for _ in 0..1000 {
            ok(rkv_publisher_counters(p, &mut s));
            if s.published == 1 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        CStr::from_ptr(replay).to_str().unwrap().to_owned()
    };
    assert_eq!(s.published, 1);
    let ctx = zmq::Context::new();
    let client = ctx.socket(zmq::DEALER).unwrap();
    client.set_rcvtimeo(5000).unwrap();
    client.connect(&replay).unwrap();
    client.send_multipart([&b""[..], &0u64.to_be_bytes()], 0).unwrap();
    let m = client.recv_multipart(0).expect("a replay answer");
    let d = decode_batch(&m[2]).unwrap();
    let stored = EventGroup {
        group_idx: Some(3),
        kind: Some(KvCacheSpecKind::SlidingWindow),
        sliding_window: Some(4096),
    };
    let removed = EventGroup { group_idx: Some(3), kind: None, sliding_window: None };
    assert_eq!(d.groups, vec![stored, removed]);
    // SAFETY: `p` and `c` are live and no longer used afterwards.
    unsafe {
        rkv_publisher_free(p);
        rkv_cache_free(c);
    }
}
