//! loom models of the eviction policies' atomic steps (included from `tests/loom.rs`):
//! the touch/queue pair of `mru` (a touch that makes a key smaller against the queueing of
//! the same node), and the metadata word's bumps (racing inserts, and an insert's bump
//! racing the split that freezes the word). Each doc comment names the mutation it fails
//! on (`docs/loom-mutants.md`, `scripts/loom-mutants`).

use loom::sync::Arc;
use loom::thread;
use radixkv::{EvictionPolicy, InsertOptions, RadixTree, TreeConfig};

use super::{model, model_with};

fn tree(policy: EvictionPolicy) -> RadixTree {
    RadixTree::new(TreeConfig { page_size: 1, policy, ..Default::default() }).unwrap()
}

/// (hits, len) of each node on the path `key`.
fn hits(t: &RadixTree, key: &[u32]) -> Vec<(u32, usize)> {
    t.inspect(0, key).iter().map(|i| (i.hits, i.len)).collect()
}

/// `mru`: a match touching leaf A (making it the most recent, so the first to go) while a
/// release queues A (its last unpin). A is not queued when the race starts (its entry was
/// dropped while it was pinned), and leaf B was accessed after A's lock. Each side writes
/// one place and reads the other (the touch: the stamp, then `evq`; the push: `evq`, then
/// the stamp): either the push reads the touch's stamp or the touch sees A queued and
/// re-keys it; otherwise A stays queued under its old key, behind B, and B goes first.
/// Fails with the push's stamp read a plain load (L1), with the touch a load and a store
/// instead of its RMW (L2), without the touch's re-key (L3), and with the push's RMW
/// Relaxed (L4).
#[test]
fn mru_touch_racing_the_queueing_of_the_leaf() {
    model(|| {
        let t = Arc::new(tree(EvictionPolicy::Mru));
        t.insert(0, &[1], &[10]).unwrap();
        let mut out: Vec<u32> = Vec::new();
        let l = t.match_and_lock(0, &[1], &mut out).into_raw();
        // A is pinned: this pass drops its entry and frees nothing.
        assert_eq!(t.evict(1, &mut |_| {}), 0);
        t.insert(0, &[2], &[20]).unwrap();
        let t2 = t.clone();
        let matcher = thread::spawn(move || {
            let mut out: Vec<u32> = Vec::new();
            assert_eq!(t2.match_prefix(0, &[1], &mut out), 1);
        });
        t.release(l).unwrap();
        matcher.join().unwrap();
        let mut freed = Vec::new();
        t.evict(1, &mut |s| freed.extend_from_slice(s));
        assert_eq!(freed, vec![10], "the leaf touched last is not the first to go (mru)");
        t.check_invariants().unwrap();
    });
}

/// `lfu`: an insert passing through edge [1, 2] (one hit) while a locking match splits it
/// at 1. Whichever lands first, both halves end with the two hits: a bump before the split
/// read the word is inherited, one between that read and the freeze is handed over by the
/// split, one after the freeze fails on the frozen word and goes to the halves. Fails
/// without the freeze (B1: the bump lands on the replaced edge and is lost), with the
/// hand-over to the lower half left out (B2), and with a bump that ignores the frozen bit
/// (B3).
#[test]
fn lfu_hit_racing_a_split_of_the_edge() {
    model(|| {
        let t = Arc::new(tree(EvictionPolicy::Lfu));
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        let t2 = t.clone();
        let inserter = thread::spawn(move || {
            assert_eq!(t2.insert(0, &[1, 2], &[10, 20]).unwrap(), 2);
        });
        let mut out: Vec<u32> = Vec::new();
        let l = t.match_and_lock(0, &[1], &mut out).into_raw();
        inserter.join().unwrap();
        t.release(l).unwrap();
        assert_eq!(hits(&t, &[1, 2]), vec![(2, 1), (2, 1)], "a hit was lost in the split");
        t.check_invariants().unwrap();
    });
}

/// `lfu`: two inserts passing through the same leaf count two hits (the bump is a CAS
/// loop). Fails with the bump a load and a store (C1).
#[test]
fn lfu_hits_of_two_racing_inserts() {
    model(|| {
        let t = Arc::new(tree(EvictionPolicy::Lfu));
        t.insert(0, &[1], &[10]).unwrap();
        let t2 = t.clone();
        let other = thread::spawn(move || {
            t2.insert(0, &[1], &[10]).unwrap();
        });
        t.insert(0, &[1], &[10]).unwrap();
        other.join().unwrap();
        assert_eq!(hits(&t, &[1]), vec![(3, 1)], "a racing insert's hit was lost");
        t.check_invariants().unwrap();
    });
}

/// `lru`: two matches touching leaf A race, and the release of A's lock queues A between
/// them (A's entry was dropped while it was pinned). The queued entry's key must stay a
/// lower bound of A's stamp (`evict_index.rs`, module docs: what makes the order exact at
/// quiescence). With the touch a load and a store, the main thread's match (the older
/// stamp: it reads the clock first) can load A's stamp, the other thread's match store its
/// newer stamp and its release queue A under it, and the main thread store its older stamp
/// last: A is queued as newer than it is, and a leaf touched between the two matches
/// would go before it. `check_invariants` checks the bound. The race takes one preemption
/// (the main thread's, after its load), so the model runs at bound 1 (at most
/// `LOOM_MAX_PREEMPTIONS`). Fails with the touch a load and a store (L6, the code before
/// 2026-12-02: "a queue entry's key ... is above its node's key ... (not a lower bound)").
#[test]
fn lru_racing_touches_keep_the_queued_key_a_lower_bound() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(b.preemption_bound.unwrap_or(1).min(1));
    model_with(b, || {
        let t = Arc::new(tree(EvictionPolicy::Lru));
        t.insert(0, &[1], &[10]).unwrap();
        let mut out: Vec<u32> = Vec::new();
        let l = t.match_and_lock(0, &[1], &mut out).into_raw();
        // A is pinned: this pass drops its entry and frees nothing.
        assert_eq!(t.evict(1, &mut |_| {}), 0);
        let t2 = t.clone();
        let other = thread::spawn(move || {
            let mut out: Vec<u32> = Vec::new();
            assert_eq!(t2.match_prefix(0, &[1], &mut out), 1);
            t2.release(l).unwrap();
        });
        assert_eq!(t.match_prefix(0, &[1], &mut out), 1);
        other.join().unwrap();
        t.check_invariants().unwrap();
    });
}

/// Two eviction passes racing over a parent's stale entry (`priority`). P = `[1]` was queued
/// as a leaf (priority 5), then got a child C = `[1,2]` (priority 0: C's key is smaller, so
/// P's old entry stays queued behind it). A pass that evicts C leaves P a leaf and queues P
/// at its next index step; the other pass may meanwhile pop P's old entry, find P an
/// unpinned leaf, evict it and retire it first. The queueing must then see P `DEAD` and
/// skip it (`push_locked`'s filter), or a new ticket names a retired node that the epoch
/// frees (a later pop reads freed memory). Whatever the interleaving, every slot is freed
/// once and the index names no dead node. Fails on P4 (no filter: `check_invariants`, "a
/// queue entry names a node in state 0x8000000000000000 (retired, not cut)", or loom's
/// "use of a freed node").
#[test]
fn two_passes_racing_over_the_stale_entry_of_a_parent() {
    model(|| {
        let t = Arc::new(tree(EvictionPolicy::Priority));
        t.insert_with(0, &[1], &[10], InsertOptions::with_priority(5)).unwrap();
        t.insert_with(0, &[1, 2], &[10, 20], InsertOptions::with_priority(0)).unwrap();
        let t2 = t.clone();
        let other = thread::spawn(move || {
            let mut freed = Vec::new();
            t2.evict(1, &mut |s| freed.extend_from_slice(s));
            freed
        });
        let mut freed = Vec::new();
        t.evict(1, &mut |s| freed.extend_from_slice(s));
        freed.extend(other.join().unwrap());
        t.check_invariants().unwrap();
        t.evict(usize::MAX, &mut |s| freed.extend_from_slice(s));
        freed.sort_unstable();
        assert_eq!(freed, vec![10, 20]);
        t.check_invariants().unwrap();
    });
}
