//! loom models of the tree's atomic protocols. Run with
//! `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --test loom`
//! (add `-- --nocapture` to see each model's executions and time).
//!
//! Each model is sized to cross exactly one split, eviction, insert or reclamation race, so
//! loom can explore every interleaving (up to the preemption bound) in seconds. Each one's
//! doc comment names the race and the protocol mutation it fails on; `scripts/loom-mutants`
//! applies those mutations and checks that every one of them makes some model fail.
#![cfg(loom)]

#[path = "loom_support/quarantine.rs"]
mod quarantine;

/// Freed blocks stay unused for a while, so a node used after it was freed still shows the
/// poison its drop wrote (see `quarantine`).
#[global_allocator]
static ALLOC: quarantine::Quarantine = quarantine::Quarantine;

use loom::sync::Arc;
use loom::thread;
use radixkv::{Cache, CacheOptions, EvictionPolicy, InsertOptions, RadixTree, TreeConfig};

fn tree() -> RadixTree {
    RadixTree::new(TreeConfig { page_size: 1, policy: EvictionPolicy::Lru, ..Default::default() })
        .unwrap()
}

/// Explores `f` with loom (preemption bound 2 unless `LOOM_MAX_PREEMPTIONS` says otherwise)
/// and prints how many executions it took (shown with `--nocapture`).
fn model(f: impl Fn() + Sync + Send + 'static) {
    model_with(loom::model::Builder::new(), f)
}

/// [`model`] with a builder set up by the caller (a longer execution: `max_branches`).
fn model_with(mut b: loom::model::Builder, f: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    let runs = std::sync::Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    let t0 = std::time::Instant::now();
    b.check(move || {
        r.fetch_add(1, Relaxed);
        f()
    });
    let name = std::thread::current().name().unwrap_or("?").to_string();
    let secs = t0.elapsed().as_secs_f64();
    println!("loom model {name}: {} executions, {secs:.1} s", runs.load(Relaxed));
}

/// The slots `t` holds for the longest cached prefix of `key` (in a model that caches one
/// path, every slot the tree holds).
fn held(t: &RadixTree, key: &[u32]) -> Vec<u32> {
    let mut out = Vec::new();
    t.match_prefix(0, key, &mut out);
    out
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
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
            let mut out: Vec<u32> = Vec::new();
            let g = t2.match_and_lock(0, &[1, 2, 9], &mut out);
            assert_eq!(out, vec![10, 20]);
            drop(g);
        });
        let mut out: Vec<u32> = Vec::new();
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
        let mut out: Vec<u32> = Vec::new();
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
        let mut out: Vec<u32> = Vec::new();
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
        let mut out: Vec<u32> = Vec::new();
        let whole = t.match_and_lock(0, &[1, 2, 3], &mut out).into_raw();
        let t2 = t.clone();
        let splitter = thread::spawn(move || {
            let mut out: Vec<u32> = Vec::new();
            t2.match_and_lock(0, &[1], &mut out).into_raw()
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
        let mut out: Vec<u32> = Vec::new();
        let l = t.match_and_lock(0, &[1, 2, 3], &mut out).into_raw();
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
        let mut out: Vec<u32> = Vec::new();
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

/// Reclamation of an evicted leaf: a reader matches across a leaf that a writer evicts; the
/// epoch keeps the leaf's memory until the reader's guard is gone, and the reader's answer
/// is one the tree had at some moment (all of it, or nothing). Fails on M6a (the evicted
/// leaf freed at once: the reader's next access meets the poisoned canary).
#[test]
fn reclamation_of_an_evicted_leaf_while_a_reader_holds_it() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        let t2 = t.clone();
        let writer = thread::spawn(move || {
            let mut freed = Vec::new();
            t2.evict(1, &mut |s| freed.extend_from_slice(s));
            assert_eq!(freed, vec![10, 20]);
        });
        let mut out: Vec<u32> = Vec::new();
        let m = t.match_prefix(0, &[1, 2], &mut out);
        assert!(matches!(m, 0 | 2), "match of {m}");
        assert_eq!(out, [10, 20][..m].to_vec());
        writer.join().unwrap();
        assert_eq!(t.check_invariants().unwrap().nodes, 0);
    });
}

/// Reclamation of a replaced edge: a reader matches across an edge that a writer's insert
/// splits (A = [1, 2, 3] becomes U = [1] -> L = [2, 3], then [1] -> [9] is added); the
/// epoch keeps A until the reader is done, and the reader gets the right slots from A or
/// from U and L. Fails on M6b (the replaced edge freed at once).
#[test]
fn reclamation_of_a_replaced_edge_while_a_reader_holds_it() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2, 3], &[10, 20, 30]).unwrap();
        let t2 = t.clone();
        let writer = thread::spawn(move || {
            assert_eq!(t2.insert(0, &[1, 9], &[11, 90]).unwrap(), 1);
        });
        let mut out: Vec<u32> = Vec::new();
        assert_eq!(t.match_prefix(0, &[1, 2, 3], &mut out), 3);
        assert_eq!(out, vec![10, 20, 30]);
        writer.join().unwrap();
        let c = t.check_invariants().unwrap();
        assert_eq!((c.nodes, c.cached_tokens), (3, 4));
    });
}

/// Refcount transitions: a lock released while another thread pins and unpins the same
/// leaf (the main thread's lock is taken before the spawn). Whichever unpin is last (1 -> 0)
/// must queue the leaf again, as an eviction pass that met it pinned dropped its entry; the
/// counts end exact (the 0 -> 1 and 1 -> 0 transitions are decided by the CAS that made
/// them, so each is counted once). Fails on P1 (no re-queue: "the leaf is not queued") and
/// on P2 and P3 (a transition decided by a second read: the counts).
#[test]
fn racing_pins_and_unpins_leave_the_leaf_evictable() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        let mut out: Vec<u32> = Vec::new();
        let mine = t.match_and_lock(0, &[1, 2], &mut out).into_raw();
        // The pass meets the leaf pinned and drops its entry: only an unpin re-queues it.
        assert_eq!(t.evict(usize::MAX, &mut |_: &[u32]| panic!("evicted a pinned leaf")), 0);
        let t2 = t.clone();
        let other = thread::spawn(move || {
            let mut out: Vec<u32> = Vec::new();
            let g = t2.match_and_lock(0, &[1, 2], &mut out);
            assert_eq!(out, vec![10, 20]);
            drop(g);
        });
        t.release(mine).unwrap();
        other.join().unwrap();
        let s = t.stats();
        assert_eq!((s.protected_tokens, s.evictable_tokens), (0, 2));
        let mut freed = Vec::new();
        assert_eq!(t.evict(1, &mut |s| freed.extend_from_slice(s)), 2, "the leaf is not queued");
        assert_eq!(freed, vec![10, 20]);
        t.check_invariants().unwrap();
    });
}

/// A split racing a split of its own lower half: the second splitter may reach L as soon
/// as U is published, and must not replace L while L's children still name A (or name L
/// after it was replaced). Every parent pointer ends right (`check_invariants`).
#[test]
fn split_racing_a_split_of_its_lower_half() {
    let mut b = loom::model::Builder::new();
    // A long execution since `check_invariants` also walks the index's entries (past the
    // default bound of 1,000 branches); the preemption bound is unchanged.
    b.max_branches = 10_000;
    model_with(b, || {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2, 3, 4], &[10, 20, 30, 40]).unwrap();
        t.insert(0, &[1, 2, 3, 4, 5], &[10, 20, 30, 40, 50]).unwrap(); // A=[1..4] -> C=[5]
        let t2 = t.clone();
        let second = thread::spawn(move || {
            let mut out: Vec<u32> = Vec::new();
            t2.match_and_lock(0, &[1, 2, 3, 9], &mut out).into_raw()
        });
        let mut out: Vec<u32> = Vec::new();
        let first = t.match_and_lock(0, &[1, 2, 9], &mut out).into_raw();
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

/// A split of a child edge racing a split of its parent edge (tree `[1,2] -> [3,4]`): one
/// thread pins `[1,2]` and splits `[3,4]` at 1 (`match_and_lock [1,2,3]`) while the other
/// splits `[1,2]` at 1 (`match_and_lock [1]`), which moves `[3,4]` under its new L. The
/// child's splitter may read the child's parent before the parent's split and lock it
/// after: under the locks it must see that the parent pointer moved and start over, or it
/// publishes the child's halves in the replaced parent's table and the real parent L keeps
/// naming the replaced child. Fails on M1 (`check_invariants`: "reachable node in state
/// 0x4000000000000000", REPLACED; the process may then crash unwinding, as the mutant also
/// retired the table L still uses).
#[test]
fn split_racing_a_split_of_the_parent_edge() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        t.insert(0, &[1, 2, 3, 4], &[10, 20, 30, 40]).unwrap(); // [1,2] -> [3,4]
        let t2 = t.clone();
        let child = thread::spawn(move || {
            let mut out: Vec<u32> = Vec::new();
            let l = t2.match_and_lock(0, &[1, 2, 3], &mut out).into_raw();
            assert_eq!(out, vec![10, 20, 30]);
            l
        });
        let mut out = Vec::new();
        let parent = t.match_and_lock(0, &[1], &mut out).into_raw();
        assert_eq!((parent.len(), out), (1, vec![10]));
        let child = child.join().unwrap();
        assert_eq!(child.len(), 3);
        let c = t.check_invariants().unwrap();
        assert_eq!((c.nodes, c.cached_tokens, c.pinned_tokens), (4, 4, 3));
        // (The locks are not released: the model is at loom's default branch limit.)
        drop((child, parent));
    });
}

/// An eviction of a leaf racing a split of its parent (tree `[1,2] -> [3]`; `evict(1)`
/// against `match_and_lock [1]`, which moves `[3]` under the split's L). The evictor may
/// read the leaf's parent before the split and lock it after: under the parent's lock it
/// must see that the parent pointer moved and start over, or it unlinks the leaf from the
/// replaced parent's table while L keeps naming the dead leaf. Fails on M2
/// (`check_invariants`: "reachable node in state 0x8000000000000000", DEAD; the process may
/// then crash unwinding, as the mutant also retired the table L still uses).
#[test]
fn eviction_racing_a_split_of_the_parent() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        t.insert(0, &[1, 2, 3], &[10, 20, 30]).unwrap(); // [1,2] -> [3]
        let t2 = t.clone();
        let evictor = thread::spawn(move || {
            let mut freed = Vec::new();
            assert_eq!(t2.evict(1, &mut |s| freed.extend_from_slice(s)), 1);
            freed
        });
        let mut out = Vec::new();
        let l = t.match_and_lock(0, &[1], &mut out).into_raw();
        assert_eq!((l.len(), out), (1, vec![10]));
        assert_eq!(evictor.join().unwrap(), vec![30], "the only unpinned leaf is [3]");
        let c = t.check_invariants().unwrap();
        assert_eq!((c.nodes, c.cached_tokens, c.pinned_tokens), (2, 2, 1));
        assert_eq!(held(&t, &[1, 2, 3]), vec![10, 20], "a match found an evicted slot");
        t.release(l).unwrap();
        t.check_invariants().unwrap();
    });
}

/// An insert of a child racing the eviction of its parent leaf (tree `[1,2]`;
/// `evict(usize::MAX)` against `insert [1,2,3]`). The insert hangs its leaf under `[1,2]`
/// holding `[1,2]`'s lock, so it must find `[1,2]` still live there (else start over), and
/// the evictor must find `[1,2]` still a leaf under that lock (else skip it); otherwise a
/// leaf is published under an unlinked node and its slot is neither cached nor freed.
/// What the insert reported must be what the tree holds: the slots it kept
/// (`[10,20]`) and adopted (`slots[existing..]`) are each either freed by the evictor or
/// still cached, exactly once. Fails on M3 (the evictor unlinks `[1,2]` with its new child)
/// and M4 (the insert publishes under the dead `[1,2]`): "slots kept and adopted".
#[test]
fn insert_of_a_child_racing_the_eviction_of_its_parent_leaf() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        let t2 = t.clone();
        let inserter = thread::spawn(move || t2.insert(0, &[1, 2, 3], &[11, 21, 31]).unwrap());
        let mut freed = Vec::new();
        t.evict(usize::MAX, &mut |s| freed.extend_from_slice(s));
        let existing = inserter.join().unwrap();
        assert!(matches!(existing, 0 | 2), "existing = {existing}");
        let mut owned = vec![10, 20];
        owned.extend_from_slice(&[11, 21, 31][existing..]);
        let now = held(&t, &[1, 2, 3]);
        let mut all = freed.clone();
        all.extend_from_slice(&now);
        assert_eq!(
            sorted(all),
            sorted(owned.clone()),
            "slots kept and adopted (existing {existing}) vs freed {freed:?} + held {now:?}"
        );
        let c = t.check_invariants().unwrap();
        assert_eq!(c.cached_tokens as usize, now.len());
        // Everything left is unpinned and queued: a second pass frees exactly the rest.
        let mut rest = Vec::new();
        t.evict(usize::MAX, &mut |s| rest.extend_from_slice(s));
        assert_eq!(sorted(rest), sorted(now));
        assert_eq!(t.check_invariants().unwrap().nodes, 0);
    });
}

/// Two inserts diverging inside one edge (tree `[1,2,3]`; `insert [1,2,9]` against
/// `insert [1,5]`): each splits the edge where it diverges (or the other's upper half) and
/// hangs its leaf under an upper half, so one may have to lock a node that the other just
/// replaced; it must see `REPLACED` under the lock and look again, or its leaf goes into a
/// table nobody reads. Both leaves end cached with their slots, every count exact. Fails
/// on M4: the insert into the replaced node also retires that node's child table, which
/// the split's L took over, so the first match after the join reads freed memory and the
/// process crashes (SIGSEGV); were the table kept, that match would find `[1,2]` only.
#[test]
fn two_inserts_diverging_inside_one_edge() {
    let mut b = loom::model::Builder::new();
    // A long execution since `check_invariants` also walks the index's entries (past the
    // default bound of 1,000 branches); the preemption bound is unchanged.
    b.max_branches = 10_000;
    model_with(b, || {
        let t = Arc::new(tree());
        t.insert(0, &[1, 2, 3], &[10, 20, 30]).unwrap();
        let t2 = t.clone();
        let other = thread::spawn(move || t2.insert(0, &[1, 2, 9], &[11, 21, 90]).unwrap());
        assert_eq!(t.insert(0, &[1, 5], &[12, 50]).unwrap(), 1);
        assert_eq!(other.join().unwrap(), 2);
        assert_eq!(held(&t, &[1, 2, 3]), vec![10, 20, 30]);
        assert_eq!(held(&t, &[1, 2, 9]), vec![10, 20, 90]);
        assert_eq!(held(&t, &[1, 5]), vec![10, 50]);
        let c = t.check_invariants().unwrap();
        assert_eq!((c.nodes, c.cached_tokens, c.leaves), (5, 5, 3));
    });
}

/// The unpin/evict pair: a parent `[1]` pinned only by a lock on `[1]`, with one unpinned
/// child leaf `[2]`. The lock's release (unpin 1 -> 0, then "is it a leaf?") races an
/// eviction of the child (the parent's table stored without it, then "is the parent
/// unpinned?"): at least one of the two must see the other's write and queue the parent,
/// or it is an unpinned leaf outside the eviction index, which `evict`/`reset` never free.
/// Fails on M5 (either side's read weakened so both can miss: "not in the eviction index").
///
/// With both reads SeqCst loads after SeqCst writes (as at the time of writing) this needs
/// the SeqCst total order. loom does not model that order in general (tokio-rs/loom#180),
/// but a SeqCst load there never reads a SeqCst store that a newer one superseded, which is
/// enough here: the model passes, and fails with either read Relaxed. With Acquire/Release
/// accesses loom models the pair exactly: it passes with the evictor's read an AcqRel (or
/// Release) RMW, and fails with a plain Acquire load, a Relaxed or Acquire RMW, or the
/// unpin's CAS without Acquire.
#[test]
fn last_unpin_of_a_parent_racing_the_eviction_of_its_last_child() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(0, &[1], &[10]).unwrap();
        t.insert(0, &[1, 2], &[10, 20]).unwrap(); // [1] -> [2]
        let mut out: Vec<u32> = Vec::new();
        let l = t.match_and_lock(0, &[1], &mut out).into_raw();
        let t2 = t.clone();
        let evictor = thread::spawn(move || {
            let mut freed = Vec::new();
            t2.evict(1, &mut |s| freed.extend_from_slice(s));
            freed
        });
        t.release(l).unwrap();
        assert_eq!(evictor.join().unwrap(), vec![20]);
        let mut freed = Vec::new();
        t.evict(usize::MAX, &mut |s| freed.extend_from_slice(s));
        assert_eq!(freed, vec![10], "the unpinned leaf [1] is not in the eviction index");
        let c = t.check_invariants().unwrap();
        assert_eq!((c.nodes, c.cached_tokens), (0, 0));
    });
}

/// The reclaim of an empty namespace racing an insert into it (ns 7 holds `[1]`;
/// `evict(1)` against `insert [2]`). The eviction of the last leaf marks the root `DEAD`
/// under the root's lock, then unlinks it from the namespace map and retires it; the insert
/// hangs its leaf under the root's lock after checking the root is live. So the insert
/// lands first (the root keeps a child and stays) or sees the dead root and creates the
/// namespace afresh; never a leaf under an unlinked root. Fails on N1 (the root marked dead
/// after its lock is dropped: the insert's leaf is lost with the unlinked root) and on N3
/// (the reclaimer removes the map's entry without checking it still names the dead root:
/// the namespace the insert created afresh vanishes).
#[test]
fn reclaim_of_an_empty_namespace_racing_an_insert_into_it() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(7, &[1], &[10]).unwrap();
        let t2 = t.clone();
        let evictor = thread::spawn(move || {
            let mut freed = Vec::new();
            t2.evict(1, &mut |s| freed.extend_from_slice(s));
            freed
        });
        assert_eq!(t.insert(7, &[2], &[20]).unwrap(), 0);
        let freed = evictor.join().unwrap();
        assert_eq!(freed, vec![10]);
        let mut out: Vec<u32> = Vec::new();
        assert_eq!(t.match_prefix(7, &[2], &mut out), 1, "the insert's page was lost");
        assert_eq!(out, vec![20]);
        let c = t.check_invariants().unwrap();
        assert_eq!((c.namespaces, c.nodes, c.cached_tokens), (1, 1, 1));
    });
}

/// The reclaim of an empty namespace racing a `match_and_lock` of its last page (ns 7
/// holds `[1]`; `evict(1)` against `match_and_lock [1]`): the pin lands first (nothing is
/// evicted, the namespace stays) or the match finds the namespace empty or gone; the root it
/// read stays valid memory until its guard is gone. Fails on N4 (the dead root freed at once
/// instead of through the epoch: the match's next access meets the poisoned canary).
#[test]
fn reclaim_of_an_empty_namespace_racing_a_match_and_lock() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(7, &[1], &[10]).unwrap();
        let t2 = t.clone();
        let evictor = thread::spawn(move || {
            let mut freed = Vec::new();
            t2.evict(1, &mut |s| freed.extend_from_slice(s));
            freed
        });
        let mut out: Vec<u32> = Vec::new();
        let g = t.match_and_lock(7, &[1], &mut out);
        let freed = evictor.join().unwrap();
        if g.len() == 1 {
            assert_eq!(out, vec![10]);
            assert!(freed.is_empty(), "evicted a pinned leaf");
            assert_eq!(t.stats().namespaces, 1);
        } else {
            assert_eq!(freed, vec![10]);
            assert_eq!(t.stats().namespaces, 0);
        }
        drop(g);
        t.check_invariants().unwrap();
    });
}

/// Two inserts creating the same namespace (ns 7 is new; `insert [1]` against `insert
/// [2]`): the creators serialize on the map shard's lock and the second finds the first's
/// root there, so both pages land under one root. Fails on N5 (no re-check under the
/// shard lock: the second creator replaces the first's root and its page is lost).
#[test]
fn two_inserts_creating_the_same_namespace() {
    model(|| {
        let t = Arc::new(tree());
        let t2 = t.clone();
        let other = thread::spawn(move || t2.insert(7, &[2], &[20]).unwrap());
        assert_eq!(t.insert(7, &[1], &[10]).unwrap(), 0);
        assert_eq!(other.join().unwrap(), 0);
        let mut out: Vec<u32> = Vec::new();
        assert_eq!(t.match_prefix(7, &[1], &mut out), 1, "a page was lost");
        assert_eq!(t.match_prefix(7, &[2], &mut out), 1, "a page was lost");
        let c = t.check_invariants().unwrap();
        assert_eq!((c.namespaces, c.nodes), (1, 2));
    });
}

/// The namespace map's rebuild racing a lookup (namespaces 1 and 2 exist; creating 3 fills
/// the shard's first table past half, so the creator copies the two slots into a new table,
/// publishes it and retires the old one, while the main thread matches in namespace 1): the
/// lookup finds namespace 1 in the old table or the new one, never neither, and the old
/// table stays valid memory while it reads it. Fails on N6 (the new table published with a
/// Relaxed store: a reader may see it without the slots the copy filled, and namespace 1
/// looks absent).
#[test]
fn namespace_map_rebuild_racing_a_lookup() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(1, &[1], &[10]).unwrap();
        t.insert(2, &[1], &[20]).unwrap();
        let t2 = t.clone();
        let creator = thread::spawn(move || t2.insert(3, &[1], &[30]).unwrap());
        let mut out: Vec<u32> = Vec::new();
        assert_eq!(t.match_prefix(1, &[1], &mut out), 1, "namespace 1 looked absent");
        assert_eq!(out, vec![10]);
        assert_eq!(creator.join().unwrap(), 0);
        let c = t.check_invariants().unwrap();
        assert_eq!((c.namespaces, c.nodes), (3, 3));
    });
}

/// A refused insert's reclaim racing an insert that hangs the namespace's first page (pool
/// mode; ns 7 is new: `insert [1]` with a slot it allocated, against `insert [2]` with a
/// slot out of the pool's range, refused when the pool settles it). The refused insert may
/// find the root the other one just created, hang nothing, see the root childless and try
/// to reclaim it (`try_reclaim_root`) while the other hangs its page: under the root's
/// lock it must find the root still childless, or it unlinks the namespace with the page in
/// it. Fails on N7 (no is-a-leaf re-check under the root's lock: "the insert's page was
/// lost").
#[test]
fn refused_insert_reclaiming_a_root_racing_an_insert_into_it() {
    model(|| {
        let c = Arc::new(Cache::new(CacheOptions { pool_slots: 2, ..Default::default() }).unwrap());
        let mut s = Vec::new();
        c.alloc(1, &mut s).unwrap();
        let c2 = c.clone();
        // The refused insert is the spawned thread: the race then takes two preemptions
        // (into it once the root is in the map, and back once it saw the root childless).
        let refused = thread::spawn(move || c2.insert(7, &[2], &[1000]).is_err());
        assert_eq!(c.insert(7, &[1], &s).unwrap(), 0);
        assert!(refused.join().unwrap(), "a slot out of the pool was adopted");
        let mut out: Vec<u32> = Vec::new();
        assert_eq!(c.match_prefix(7, &[1], &mut out), 1, "the insert's page was lost");
        let census = c.tree().check_invariants().unwrap();
        assert_eq!((census.namespaces, census.nodes), (1, 1));
        assert_eq!(c.stats().free_slots, 1);
    });
}

/// The namespace map's slot reuse racing a lookup. Namespaces 1 and 3 have the same home
/// slot in the loom map (one shard of 4 slots): ns 1 holds `[1]`; one thread evicts it
/// (which reclaims ns 1 and tombs its slot) and then inserts `[2]` into ns 3, whose new
/// entry reuses that slot (the tag, then the root); the main thread matches `[1]` in ns 3.
/// The lookup can read the slot's old root (ns 1's) together with its new tag (3): only the
/// root's own namespace tells them apart, and ns 3 never held `[1]`. Fails on N8 (the
/// lookup trusts the tag: "namespace 3 matched namespace 1's page").
#[test]
fn namespace_map_slot_reuse_racing_a_lookup() {
    model(|| {
        let t = Arc::new(tree());
        t.insert(1, &[1], &[10]).unwrap();
        let t2 = t.clone();
        let writer = thread::spawn(move || {
            let mut freed = Vec::new();
            t2.evict(1, &mut |s| freed.extend_from_slice(s));
            assert_eq!(freed, vec![10]);
            assert_eq!(t2.insert(3, &[2], &[20]).unwrap(), 0);
        });
        let mut out: Vec<u32> = Vec::new();
        assert_eq!(t.match_prefix(3, &[1], &mut out), 0, "namespace 3 matched namespace 1's page");
        writer.join().unwrap();
        let c = t.check_invariants().unwrap();
        assert_eq!((c.namespaces, c.nodes), (1, 1));
    });
}

#[path = "support/replay.rs"]
mod replay;

/// A tree with KV events on (page size 1).
fn events_tree() -> RadixTree {
    let mut t = tree();
    t.enable_events(radixkv::events::SinkOptions { block_size: 1, ..Default::default() }).unwrap();
    t
}

/// The tree's event stream so far (`seen` holds what earlier calls drained), applied by a
/// consumer (`replay` checks no event names a page it does not hold), must hold exactly the
/// tree's cached pages.
fn stream_matches_tree(t: &RadixTree, seen: &mut Vec<(u64, radixkv::events::EventBatch)>) {
    let s = t.events().unwrap();
    s.flush();
    seen.extend(s.drain());
    let held = replay::replay(seen);
    assert_eq!(held, t.cached_page_hashes(), "the stream's pages vs the tree's");
    assert_eq!(s.stats().unresolved, 0, "an event named a page id the sink never stored");
}

/// KV events: an insert of a child `[1,2,3]` racing the eviction of its parent leaf
/// `[1,2]`. Either the child is stored under `[1,2]` (whose removal then never comes, or
/// comes after the child's) or `[1,2]` is removed first and the insert stores `[1,2,3]`
/// afresh from the root. At the end the replayed stream holds exactly the tree's pages, and
/// after a second full eviction nothing. Fails if `hang` pushes its store after the unlock
/// (a removal can then precede the store it removes) or if `evict_leaf` pushes its removal
/// after dropping the parent's lock (the re-store can precede it).
#[test]
fn events_insert_of_a_child_racing_the_eviction_of_its_parent_leaf() {
    model(|| {
        let t = Arc::new(events_tree());
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        let t2 = t.clone();
        let inserter = thread::spawn(move || t2.insert(0, &[1, 2, 3], &[11, 21, 31]).unwrap());
        t.evict(usize::MAX, &mut |_| {});
        inserter.join().unwrap();
        let mut seen = Vec::new();
        stream_matches_tree(&t, &mut seen);
        t.evict(usize::MAX, &mut |_| {});
        stream_matches_tree(&t, &mut seen);
        assert!(t.cached_page_hashes().is_empty());
    });
}

/// KV events: two inserts diverging inside one edge (`[1,2,3]` cached; `[1,2,9]` against
/// `[1,5]`), each splitting it. Splits publish nothing and the halves keep their hashes, so
/// each insert stores exactly its new page with the right parent, whichever split first:
/// the replayed stream holds the tree's five pages.
#[test]
fn events_two_inserts_diverging_inside_one_edge() {
    model(|| {
        let t = Arc::new(events_tree());
        t.insert(0, &[1, 2, 3], &[10, 20, 30]).unwrap();
        let t2 = t.clone();
        let other = thread::spawn(move || t2.insert(0, &[1, 2, 9], &[11, 21, 90]).unwrap());
        t.insert(0, &[1, 5], &[12, 50]).unwrap();
        other.join().unwrap();
        let s = t.events().unwrap();
        s.flush();
        let d = s.drain();
        let stores = d.iter().flat_map(|(_, b)| &b.events).count();
        assert_eq!(stores, 3, "one store per insert that added pages, none for the splits");
        assert_eq!(replay::replay(&d), t.cached_page_hashes());
        assert_eq!(t.cached_page_hashes().len(), 5);
    });
}

/// KV events: the eviction of leaf `[1,2]` racing a re-insert of the same key. The insert
/// either finds it cached (nothing stored) or waits for its unlink and stores it again; the
/// re-store must follow the removal, or a consumer drops pages the tree holds.
#[test]
fn events_eviction_racing_a_reinsert_of_the_same_key() {
    model(|| {
        let t = Arc::new(events_tree());
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        let t2 = t.clone();
        let evictor = thread::spawn(move || {
            t2.evict(usize::MAX, &mut |_| {});
        });
        t.insert(0, &[1, 2], &[11, 21]).unwrap();
        evictor.join().unwrap();
        stream_matches_tree(&t, &mut Vec::new());
    });
}

/// KV events: an insert of a leaf `[1,2]` racing an insert of its child `[1,2,3]` (`[1]`
/// cached). When the child hangs under the new leaf, it reached the leaf through the
/// leaf's publish, so the leaf's store must already be in the sink: the child's store
/// names it as its parent. Fails if `hang` pushes its store after the publish ("a store
/// under parent ... not held").
#[test]
fn events_insert_of_a_leaf_racing_an_insert_of_its_child() {
    model(|| {
        let t = Arc::new(events_tree());
        t.insert(0, &[1], &[10]).unwrap();
        let t2 = t.clone();
        let child = thread::spawn(move || t2.insert(0, &[1, 2, 3], &[11, 21, 31]).unwrap());
        t.insert(0, &[1, 2], &[12, 22]).unwrap();
        child.join().unwrap();
        stream_matches_tree(&t, &mut Vec::new());
        assert_eq!(t.cached_page_hashes().len(), 3);
    });
}

/// KV events: the last child's removal comes before its parent's. `[1,2]` has two leaf
/// children `[3]` and `[4]`; two eviction passes race, so either may unlink the last child
/// and queue the parent, and either may then evict it; the full pass then inserts `[9]`
/// (its store ends the run of removals, which the sink would otherwise merge into one
/// event). A consumer must never be told the parent left while a page under it is still
/// held. Fails if `evict_leaf` pushes a removal after dropping the parent's lock (E3: the
/// pass that unlinked `[4]` can push its removal after the other pass removed `[1,2]` and
/// stored `[9]`).
#[test]
fn events_last_child_removal_comes_before_its_parents() {
    let mut b = loom::model::Builder::new();
    // Two full eviction passes, an insert and the replays make a long execution (the default
    // bound of 1,000 branches is for the shorter models); the preemption bound is unchanged.
    b.max_branches = 10_000;
    model_with(b, || {
        let t = Arc::new(events_tree());
        t.insert(0, &[1, 2, 3], &[10, 20, 30]).unwrap();
        t.insert(0, &[1, 2, 4], &[10, 20, 40]).unwrap(); // [1,2] -> {[3], [4]}
        // A pinned page keeps the namespace's root alive (no reclaim and re-creation for
        // the insert of `[9]`: a smaller model).
        t.insert(0, &[7], &[70]).unwrap();
        let mut out: Vec<u32> = Vec::new();
        let keep = t.match_and_lock(0, &[7], &mut out);
        let t2 = t.clone();
        let other = thread::spawn(move || {
            t2.evict(1, &mut |_| {});
        });
        t.evict(usize::MAX, &mut |_| {});
        t.insert(0, &[9], &[90]).unwrap();
        other.join().unwrap();
        drop(keep);
        let mut seen = Vec::new();
        stream_matches_tree(&t, &mut seen);
        t.evict(usize::MAX, &mut |_| {});
        stream_matches_tree(&t, &mut seen);
        assert!(t.cached_page_hashes().is_empty());
    });
}

/// KV events: a pinned insert (`insert_and_lock` of `[1,2,3]`, extending the unpinned leaf
/// `[1,2]`) and its release race an eviction pass. The pass either evicts `[1,2]` before
/// the insert pins it (the insert then stores all three pages from the root) or finds it
/// pinned or with a child; the new leaf enters the eviction index only at the release, so
/// its removal, if the pass gets it, follows its store. Whatever the interleaving, the
/// replayed stream holds exactly the tree's pages, and after a full eviction nothing.
#[test]
fn events_pinned_insert_and_release_racing_an_eviction() {
    model(|| {
        let t = Arc::new(events_tree());
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        let t2 = t.clone();
        let evictor = thread::spawn(move || {
            t2.evict(usize::MAX, &mut |_| {});
        });
        let (_, g) =
            t.insert_and_lock(0, &[1, 2, 3], &[11, 21, 31], InsertOptions::default()).unwrap();
        assert_eq!(g.len(), 3);
        drop(g);
        evictor.join().unwrap();
        let mut seen = Vec::new();
        stream_matches_tree(&t, &mut seen);
        t.evict(usize::MAX, &mut |_| {});
        stream_matches_tree(&t, &mut seen);
        assert!(t.cached_page_hashes().is_empty());
        t.check_invariants().unwrap();
    });
}

/// An outlet that keeps the closed batches' handles, for a model to resolve where it likes.
struct Collect(Arc<loom::sync::Mutex<Vec<radixkv::events::ClosedBatch>>>);

impl radixkv::events::BatchOutlet for Collect {
    fn submit(&mut self, _seq: u64, batch: radixkv::events::ClosedBatch) {
        self.0.lock().unwrap().push(batch);
    }
}

/// KV events, deferred hashing (`src/events/resolve.rs`): two threads resolve (hash) the
/// batches of one sink while a third batch closes. Batch 0 stores `[1]`, batch 1 `[2]`
/// under it (named by page id); one thread takes batch 1, which must resolve batch 0
/// first, while the main thread takes batch 0 and then stores `[3]` under `[2]` and closes
/// batch 2 (the queue's push racing the other thread's pops). Whoever resolves what, each
/// batch is resolved in sequence order: every store names its parent's hash and has the
/// hashes a router computes from the tokens, and no id is unknown. Fails on R1 (the front
/// batch popped before the resolver's lock is taken: batch 1 can be resolved first, its
/// parent unknown, or its handle taken while another thread still resolves it).
#[test]
fn events_resolution_in_sequence_order_by_racing_consumers() {
    use radixkv::events::KvEvent;
    use radixkv::events::hash::{HashMode, PageHasher};
    model(|| {
        let t = Arc::new(events_tree());
        let got = Arc::new(loom::sync::Mutex::new(Vec::new()));
        t.events().unwrap().attach(Box::new(Collect(got.clone()))).unwrap();
        let s = t.events().unwrap().clone();
        t.insert(0, &[1], &[10]).unwrap();
        s.flush();
        t.insert(0, &[1, 2], &[10, 20]).unwrap();
        s.flush();
        let (b1, b0) = {
            let mut g = got.lock().unwrap();
            (g.pop().unwrap(), g.pop().unwrap())
        };
        assert_eq!((b0.seq(), b1.seq()), (0, 1));
        let other = thread::spawn(move || b1.into_batch());
        let first = b0.into_batch();
        t.insert(0, &[1, 2, 3], &[10, 20, 30]).unwrap();
        s.flush();
        let second = other.join().unwrap();
        let third = got.lock().unwrap().pop().unwrap().into_batch();
        let want = PageHasher::new(HashMode::Xxh3, None, None).block_hashes(&[1, 2, 3], 1);
        let stores: Vec<(Vec<u64>, Option<u64>)> = [&first, &second, &third]
            .iter()
            .flat_map(|b| &b.events)
            .map(|e| match e {
                KvEvent::BlockStored { block_hashes, parent_block_hash, .. } => {
                    (block_hashes.clone(), *parent_block_hash)
                }
                e => panic!("only stores: {e:?}"),
            })
            .collect();
        assert_eq!(
            stores,
            vec![
                (vec![want[0]], None),
                (vec![want[1]], Some(want[0])),
                (vec![want[2]], Some(want[1])),
            ],
            "each store's hashes and parent, as a router computes them"
        );
        assert_eq!(s.stats().unresolved, 0, "an event named a page id the sink never stored");
        let mut cached = want.clone();
        cached.sort_unstable();
        assert_eq!(t.cached_page_hashes(), cached);
    });
}

#[path = "loom_support/policy.rs"]
mod policy;

#[path = "loom_support/tier.rs"]
mod tier;

#[path = "loom_support/swa.rs"]
mod swa;
