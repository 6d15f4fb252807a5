//! loom models of the tree's atomic protocols. Run with
//! `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --test loom`.
//!
//! Each model is sized to cross exactly one split, eviction or reclamation, so loom can
//! explore every interleaving (up to the preemption bound) in seconds to minutes.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use radixkv::{EvictionPolicy, RadixTree, TreeConfig};

fn tree() -> RadixTree {
    RadixTree::new(TreeConfig { page_size: 1, policy: EvictionPolicy::Lru }).unwrap()
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b.check(f);
}

/// A reader matching across an edge while `match_and_lock` splits that edge: the reader
/// sees the edge whole or split, never half, and always gets the right slots.
#[test]
fn split_racing_a_match() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2, 3, 4], &[10, 20, 30, 40]).unwrap();
        let t2 = t.clone();
        let splitter = thread::spawn(move || {
            let mut out = Vec::new();
            let g = t2.match_and_lock(0, &[1, 2, 9], &mut out);
            assert_eq!(out, vec![10, 20]);
            drop(g);
        });
        let mut out = Vec::new();
        assert_eq!(t.match_prefix(0, &[1, 2, 3, 4], &mut out), 4);
        assert_eq!(out, vec![10, 20, 30, 40]);
        splitter.join().unwrap();
        let c = t.check_invariants().unwrap();
        assert_eq!((c.nodes, c.cached_tokens, c.pinned_tokens), (2, 4, 0));
    });
}

/// `match_and_lock` racing an eviction of the same leaf: either the pin lands first (and
/// nothing is evicted) or the eviction does (and the match finds nothing); never both.
#[test]
fn pin_racing_an_eviction_of_the_same_leaf() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        let t2 = t.clone();
        let evictor = thread::spawn(move || {
            let mut freed = Vec::new();
            t2.evict(2, &mut |s| freed.extend_from_slice(s));
            freed
        });
        let mut out = Vec::new();
        let g = t.match_and_lock(0, &[1, 2], &mut out);
        let pinned = g.len();
        let freed = evictor.join().unwrap();
        if pinned == 2 {
            assert_eq!(out, vec![10, 20]);
            assert!(freed.is_empty(), "evicted a pinned leaf");
            assert_eq!(t.stats().protected_tokens, 2);
        } else {
            assert_eq!(pinned, 0);
            assert_eq!(freed, vec![10, 20]);
        }
        drop(g);
        t.check_invariants().unwrap();
    });
}

/// Two inserts of the same key: exactly one adopts its slots, the other is told all of
/// it was cached already, and the tree keeps the winner's slots.
#[test]
fn two_inserts_of_the_same_key() {
    model(|| {
        let t = Arc::new(tree());
        let t2 = t.clone();
        let other = thread::spawn(move || t2.insert(0, &[1, 2], &[20, 21]).unwrap());
        let mine = t.insert(0, &[1, 2], &[10, 11]).unwrap();
        let theirs = other.join().unwrap();
        let mut out = Vec::new();
        assert_eq!(t.match_prefix(0, &[1, 2], &mut out), 2);
        match (mine, theirs) {
            (0, 2) => assert_eq!(out, vec![10, 11]),
            (2, 0) => assert_eq!(out, vec![20, 21]),
            x => panic!("existing counts {x:?}"),
        }
        let c = t.check_invariants().unwrap();
        assert_eq!((c.nodes, c.cached_tokens), (1, 2));
    });
}

/// A pin released while another thread splits the pinned edge (and pins its upper half):
/// the frozen-count handoff keeps every count exact.
#[test]
fn unpin_racing_a_split_of_the_pinned_edge() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2, 3], &[10, 20, 30]).unwrap();
        let mut out = Vec::new();
        let whole = t.match_and_lock_raw(0, &[1, 2, 3], &mut out);
        let t2 = t.clone();
        let splitter = thread::spawn(move || {
            let mut out = Vec::new();
            t2.match_and_lock_raw(0, &[1], &mut out)
        });
        t.release(whole).unwrap();
        let half = splitter.join().unwrap();
        let s = t.stats();
        assert_eq!((s.protected_tokens, s.evictable_tokens), (1, 2));
        t.check_invariants().unwrap();
        t.release(half).unwrap();
        assert_eq!(t.stats().protected_tokens, 0);
        t.check_invariants().unwrap();
    });
}

/// A pin taken while another thread splits the edge it pins: the pin lands on A (and is
/// inherited by U and L) or on U and L directly; release finds them either way.
#[test]
fn pin_racing_a_split() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2, 3], &[10, 20, 30]).unwrap();
        let t2 = t.clone();
        let splitter = thread::spawn(move || t2.insert(0, &[1, 9], &[0, 90]).unwrap());
        let mut out = Vec::new();
        let l = t.match_and_lock_raw(0, &[1, 2, 3], &mut out);
        assert_eq!(out, vec![10, 20, 30]);
        assert_eq!(splitter.join().unwrap(), 1);
        assert_eq!(t.stats().protected_tokens, 3);
        t.check_invariants().unwrap();
        t.release(l).unwrap();
        assert_eq!(t.stats().protected_tokens, 0);
        t.check_invariants().unwrap();
    });
}

/// An eviction pass that empties a parent (its two leaves go, then the parent, queued and
/// popped within the same pass, one index step per leaf) racing a pin of that parent: the
/// pin lands first and the parent stays (its children go), or the pass takes the parent
/// too and the pin finds nothing; every freed slot is handed out once, the counts end exact.
#[test]
fn pin_racing_an_eviction_pass_that_empties_the_parent() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        t.insert(0, &[1, 3], &[10, 30]).unwrap(); // [1] -> {[2], [3]}
        let t2 = t.clone();
        let evictor = thread::spawn(move || {
            let mut freed = Vec::new();
            let n = t2.evict(usize::MAX, &mut |s| freed.extend_from_slice(s));
            assert_eq!(n, freed.len());
            freed.sort();
            freed
        });
        let mut out = Vec::new();
        let g = t.match_and_lock(0, &[1], &mut out);
        let pinned = g.len();
        let freed = evictor.join().unwrap();
        match pinned {
            1 => {
                assert_eq!(out, vec![10]);
                assert_eq!(freed, vec![20, 30], "the pinned parent was evicted");
                assert_eq!(t.stats().protected_tokens, 1);
            }
            _ => {
                assert_eq!(pinned, 0);
                assert_eq!(freed, vec![10, 20, 30]);
            }
        }
        drop(g);
        let c = t.check_invariants().unwrap();
        assert_eq!(c.cached_tokens as usize, 3 - freed.len());
    });
}

/// Reclamation: a reader holds nodes that a writer replaces (split) and evicts; the
/// epoch keeps them alive until the reader is done, and the reader's answer is one the
/// tree had at some moment.
#[test]
fn reclamation_of_retired_nodes_while_a_reader_holds_them() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2, 3], &[10, 20, 30]).unwrap();
        let t2 = t.clone();
        let writer = thread::spawn(move || {
            t2.insert(0, &[1, 9], &[11, 90]).unwrap(); // splits [1,2,3]: retires it
            let mut freed = Vec::new();
            t2.evict(usize::MAX, &mut |s| freed.extend_from_slice(s)); // retires the rest
            freed.sort();
            assert_eq!(freed, vec![10, 20, 30, 90]);
        });
        let mut out = Vec::new();
        let m = t.match_prefix(0, &[1, 2, 3], &mut out);
        assert!(matches!(m, 0 | 1 | 3), "match of {m}");
        assert_eq!(out, [10, 20, 30][..m].to_vec());
        writer.join().unwrap();
        assert_eq!(t.check_invariants().unwrap().nodes, 0);
    });
}

/// Refcount transitions: two pins and unpins of one leaf race; whichever unpin is last
/// (1 -> 0) must put the leaf back in the eviction index, and the counts end exact.
#[test]
fn racing_pins_and_unpins_leave_the_leaf_evictable() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        let t2 = t.clone();
        let other = thread::spawn(move || {
            let mut out = Vec::new();
            let g = t2.match_and_lock(0, &[1, 2], &mut out);
            assert_eq!(out, vec![10, 20]);
            drop(g);
        });
        let mut out = Vec::new();
        let g = t.match_and_lock(0, &[1, 2], &mut out);
        assert_eq!(out, vec![10, 20]);
        drop(g);
        other.join().unwrap();
        let s = t.stats();
        assert_eq!((s.protected_tokens, s.evictable_tokens), (0, 2));
        let mut freed = Vec::new();
        assert_eq!(t.evict(1, &mut |s| freed.extend_from_slice(s)), 2);
        assert_eq!(freed, vec![10, 20]);
        t.check_invariants().unwrap();
    });
}

/// A split racing a split of its own lower half: the second splitter may reach L as soon
/// as U is published, and must not replace L while L's children still name A (or name L
/// after it was replaced). Every parent pointer ends right (`check_invariants`).
#[test]
fn split_racing_a_split_of_its_lower_half() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2, 3, 4], &[10, 20, 30, 40]).unwrap();
        t.insert(0, &[1, 2, 3, 4, 5], &[10, 20, 30, 40, 50]).unwrap(); // A=[1..4] -> C=[5]
        let t2 = t.clone();
        let second = thread::spawn(move || {
            let mut out = Vec::new();
            t2.match_and_lock_raw(0, &[1, 2, 3, 9], &mut out)
        });
        let mut out = Vec::new();
        let first = t.match_and_lock_raw(0, &[1, 2, 9], &mut out);
        assert_eq!(out, vec![10, 20]);
        let second = second.join().unwrap();
        assert_eq!(second.len(), 3);
        t.check_invariants().unwrap();
        t.release(first).unwrap();
        t.release(second).unwrap();
        let c = t.check_invariants().unwrap();
        assert_eq!((c.cached_tokens, c.pinned_tokens), (5, 0));
    });
}
