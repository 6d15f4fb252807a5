//! loom models of the sliding-window (SWA) component's atomic steps (included from
//! `tests/loom.rs`; the protocol is in `src/tree/swa.rs`): a window lock's SWA pin racing
//! the SWA eviction that would make the same node a tombstone, and a release's SWA unpin
//! racing an SWA eviction pass. Each doc comment names the mutation it fails on
//! (`docs/loom-mutants.md`, `scripts/loom-mutants`).

use loom::sync::Arc;
use loom::thread;
use radixkv::{EvictTarget, EvictionPolicy, Freed, RadixTree, TreeConfig};

use super::{model, model_with};

fn tree(window: usize) -> RadixTree {
    RadixTree::new(TreeConfig {
        page_size: 1,
        policy: EvictionPolicy::Lru,
        swa_window: window,
        ..Default::default()
    })
    .unwrap()
}

/// Window 1. X = [1] with the leaf Y = [2] below it, Y held by a window lock (whose window
/// is Y alone), so X (pinned, but in no window) is the only SWA candidate. A locking match
/// of [1] (its window: X) races an SWA eviction of one token (X's tombstone). Either the
/// SWA pin lands first (the lock holds X's SWA KV, the eviction frees nothing), or the
/// tombstone does (the match finds no valid prefix and locks nothing): never both, never
/// neither. Fails with an SWA pin that ignores a tombstone (S1), a tombstone that ignores
/// SWA pins (S2), and a locking match that keeps a window it could not pin (S3).
#[test]
fn swa_pin_racing_a_tombstone_of_the_same_node() {
    let mut b = loom::model::Builder::new();
    // A long execution (an SWA pass, a retried locking match, `check_invariants`' walk of
    // both indexes): past the default bound of 1,000 branches; the preemption bound is
    // unchanged.
    b.max_branches = 10_000;
    model_with(b, || {
        let t = Arc::new(tree(1));
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        let mut out: Vec<u32> = Vec::new();
        // Split [1, 2] at 1, then hold Y's window.
        t.release(t.match_and_lock(0, &[1], &mut out).into_raw()).unwrap();
        let ly = t.match_and_lock(0, &[1, 2], &mut out).into_raw();
        assert_eq!((ly.len(), ly.swa_from()), (2, Some(1)));
        let t2 = t.clone();
        let evictor = thread::spawn(move || {
            let mut got = Vec::new();
            t2.evict_kv(EvictTarget::Swa, 1, &mut |f, s| got.push((f, s.to_vec())));
            got
        });
        let mut out: Vec<u32> = Vec::new();
        let lx = t.match_and_lock(0, &[1], &mut out).into_raw();
        let got = evictor.join().unwrap();
        match lx.len() {
            1 => assert!(got.is_empty(), "X's SWA KV freed under a window lock: {got:?}"),
            0 => assert_eq!(got, vec![(Freed { full: false, swa: true }, vec![10])]),
            n => panic!("locked {n} tokens"),
        }
        t.release(lx).unwrap();
        t.release(ly).unwrap();
        t.check_invariants().unwrap();
    });
}

/// Window 1, one leaf [1] held by a window lock. Its release (the SWA unpin to 0, which
/// queues it in the SWA index) races an SWA eviction pass that pops the leaf's entry while
/// it is still pinned (and drops it). Whatever the order, once both are done the leaf is
/// queued (the invariants check it) and a second pass takes it. Fails when the SWA unpin
/// does not queue the node (S4).
#[test]
fn swa_release_racing_an_swa_eviction_pass() {
    model(|| {
        let t = Arc::new(tree(1));
        t.insert(0, &[1], &[10]).unwrap();
        let mut out: Vec<u32> = Vec::new();
        let l = t.match_and_lock(0, &[1], &mut out).into_raw();
        let t2 = t.clone();
        let evictor = thread::spawn(move || t2.evict_kv(EvictTarget::Swa, 1, &mut |_, _| {}));
        t.release(l).unwrap();
        let first = evictor.join().unwrap();
        t.check_invariants().unwrap();
        let second = t.evict_kv(EvictTarget::Swa, 1, &mut |_, _| {});
        assert_eq!(first + second, 1, "the released leaf was lost to SWA eviction");
        t.check_invariants().unwrap();
    });
}

/// Window 1, one leaf [1, 2] queued in the SWA index. A locking match of [1] splits it (the
/// split queues both halves and cuts the old leaf's SWA ticket before retiring it) while an
/// SWA eviction pass pops from the same index. Whatever the order, no SWA entry names a
/// retired node (the loom allocator's canary catches a use after free), the pass frees the
/// SWA KV of at most what the lock does not hold, and the invariants hold at the end (no SWA
/// entry naming a replaced node among them). Mutant S5 (the split's cut of the old node's
/// SWA ticket left out) survives this model (the epoch does not free the old leaf before
/// the race ends) and is killed by `swa_pin_racing_a_tombstone_of_the_same_node`, whose
/// setup splits a queued leaf and then runs long enough for the epoch to free it.
#[test]
fn split_of_an_swa_queued_leaf_racing_an_swa_pass() {
    let mut b = loom::model::Builder::new();
    // A long execution (a split, an SWA pass, `check_invariants`); the preemption bound is
    // unchanged.
    b.max_branches = 10_000;
    model_with(b, || {
        let t = Arc::new(tree(1));
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        let t2 = t.clone();
        let evictor = thread::spawn(move || {
            let mut got = Vec::new();
            t2.evict_kv(EvictTarget::Swa, 1, &mut |f, s| got.push((f, s.to_vec())));
            got
        });
        let mut out: Vec<u32> = Vec::new();
        let l = t.match_and_lock(0, &[1], &mut out).into_raw();
        let got = evictor.join().unwrap();
        if l.len() == 1 {
            assert!(got.iter().all(|(_, s)| !s.contains(&10)), "locked SWA KV freed: {got:?}");
        }
        t.release(l).unwrap();
        t.check_invariants().unwrap();
    });
}
