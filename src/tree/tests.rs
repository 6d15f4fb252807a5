//! Unit tests: SGLang's `RadixCache` scenarios, and the first-version matching bug.

use super::*;

fn tree(p: usize) -> RadixTree {
    RadixTree::new(TreeConfig { page_size: p, policy: EvictionPolicy::Lru, ..Default::default() })
        .unwrap()
}

fn m(t: &RadixTree, ns: u64, tokens: &[u32]) -> Vec<u32> {
    let mut out = Vec::new();
    let n = t.match_prefix(ns, tokens, &mut out);
    assert_eq!(n, out.len());
    out
}

fn drain(t: &RadixTree) -> Vec<u32> {
    let mut freed = Vec::new();
    t.evict(usize::MAX, &mut |s| freed.extend_from_slice(s));
    freed.sort();
    freed
}

#[test]
fn insert_then_reinsert_then_match() {
    let t = tree(1);
    assert_eq!(t.insert(0, &[1, 2, 3], &[10, 20, 30]).unwrap(), 0);
    assert_eq!(t.insert(0, &[1, 2, 3], &[11, 21, 31]).unwrap(), 3);
    assert_eq!(m(&t, 0, &[1, 2]), vec![10, 20]);
    assert_eq!(m(&t, 0, &[1, 2, 3, 4]), vec![10, 20, 30]);
    assert_eq!(m(&t, 0, &[2]), Vec::<u32>::new());
    assert_eq!(t.stats().cached_tokens, 3);
    t.check_invariants().unwrap();
}

#[test]
fn namespaces_are_isolated() {
    let t = tree(1);
    for ns in 0..3u64 {
        let base = 100 * (ns as u32 + 1);
        assert_eq!(t.insert(ns, &[1, 2, 3], &[base, base + 1, base + 2]).unwrap(), 0);
    }
    for ns in 0..3u64 {
        let base = 100 * (ns as u32 + 1);
        assert_eq!(m(&t, ns, &[1, 2, 3]), vec![base, base + 1, base + 2]);
    }
    assert_eq!(m(&t, 99, &[1, 2, 3]), Vec::<u32>::new());
    assert_eq!(t.stats().cached_tokens, 9);
    t.check_invariants().unwrap();
}

#[test]
fn an_empty_namespace_is_reclaimed_and_comes_back_on_insert() {
    let t = tree(1);
    t.insert(5, &[1, 2], &[10, 20]).unwrap();
    t.insert(5, &[1, 3], &[10, 30]).unwrap();
    t.insert(6, &[1], &[40]).unwrap();
    assert_eq!(t.stats().namespaces, 2);
    assert_eq!(t.check_invariants().unwrap().namespaces, 2);
    // Evicting everything of 5 but [1] keeps it; its last page takes the namespace along.
    let mut freed = Vec::new();
    t.evict(2, &mut |s| freed.extend_from_slice(s));
    freed.sort();
    assert_eq!(freed, vec![20, 30]);
    assert_eq!(t.stats().namespaces, 2);
    assert_eq!(drain(&t), vec![10, 40]);
    assert_eq!(t.stats().namespaces, 0);
    assert_eq!(t.check_invariants().unwrap().namespaces, 0);
    assert_eq!(m(&t, 5, &[1, 2]), Vec::<u32>::new());
    // The id is reused: a fresh namespace, nothing of the old one in it.
    assert_eq!(t.insert(5, &[1, 3], &[11, 31]).unwrap(), 0);
    assert_eq!(m(&t, 5, &[1, 3]), vec![11, 31]);
    assert_eq!(m(&t, 5, &[1, 2]), vec![11]);
    assert_eq!(t.check_invariants().unwrap().namespaces, 1);
}

#[test]
fn inserts_that_cache_nothing_leave_no_namespace_behind() {
    let t = tree(4);
    // Shorter than a page: nothing to cache, no namespace created.
    assert_eq!(t.insert(9, &[1, 2, 3], &[1, 2, 3]).unwrap(), 0);
    let (e, l) = t
        .insert_and_lock(9, &[], &[0u32; 0], InsertOptions::default())
        .map(|(e, l)| (e, l.into_raw()))
        .unwrap();
    assert_eq!((e, l.len()), (0, 0));
    t.release(l).unwrap();
    let mut out: Vec<u32> = Vec::new();
    let g = t.match_and_lock(9, &[1, 2, 3, 4], &mut out);
    assert!(g.is_empty());
    drop(g);
    assert_eq!(t.stats().namespaces, 0);
    // A refused insert (its prepare step fails) that created the root reclaims it.
    let r = t.insert_core::<Vec<u32>>(
        9,
        Key::Borrowed(&[1, 2, 3, 4]),
        SlotSource::List(&[1, 2, 3, 4]),
        false,
        InsertOptions::default(),
        None,
        &mut |_, _, stage| match stage {
            Stage::Check => Ok(()),
            Stage::Commit => Err(invalid("refused")),
        },
    );
    assert!(r.is_err());
    assert_eq!(t.stats().namespaces, 0);
    assert_eq!(t.check_invariants().unwrap().namespaces, 0);
}

#[test]
fn drop_namespace_frees_its_unpinned_pages_only() {
    let t = tree(1);
    t.insert(1, &[1, 2, 3], &[10, 20, 30]).unwrap();
    t.insert(1, &[1, 2, 4], &[10, 20, 40]).unwrap();
    t.insert(1, &[5], &[50]).unwrap();
    t.insert(2, &[1, 2, 3], &[11, 21, 31]).unwrap();
    let st = t.namespace_stats(1);
    assert_eq!(
        (st.cached_tokens, st.evictable_tokens, st.protected_tokens, st.nodes),
        (5, 5, 0, 4)
    );
    // Pin [1, 2] of namespace 1: it stays, everything else of 1 goes.
    let mut out: Vec<u32> = Vec::new();
    let g = t.match_and_lock(1, &[1, 2], &mut out);
    assert_eq!(g.len(), 2);
    let st = t.namespace_stats(1);
    assert_eq!((st.cached_tokens, st.evictable_tokens, st.protected_tokens), (5, 3, 2));
    let mut freed = Vec::new();
    assert_eq!(t.drop_namespace(1, &mut |s| freed.extend_from_slice(s)), 3);
    freed.sort();
    assert_eq!(freed, vec![30, 40, 50]);
    assert_eq!(m(&t, 1, &[1, 2, 3]), vec![10, 20]);
    assert_eq!(m(&t, 2, &[1, 2, 3]), vec![11, 21, 31], "another namespace was touched");
    let st = t.namespace_stats(1);
    assert_eq!(
        (st.cached_tokens, st.evictable_tokens, st.protected_tokens, st.nodes),
        (2, 0, 2, 1)
    );
    assert_eq!(t.stats().namespaces, 2);
    t.check_invariants().unwrap();
    // Released, the rest goes too, and the namespace with it.
    drop(g);
    let mut runs = Vec::new();
    assert_eq!(t.drop_namespace_runs(1, &mut |r| runs.extend_from_slice(r)), 2);
    let mut slots: Vec<u32> = runs.iter().flat_map(|r| r.start..r.start + r.len).collect();
    slots.sort();
    assert_eq!(slots, vec![10, 20]);
    assert_eq!(t.namespace_stats(1), NamespaceStats::default());
    assert_eq!(t.stats().namespaces, 1);
    // Unknown (or gone) namespaces: nothing to do, not an error.
    assert_eq!(t.drop_namespace(1, &mut |_| panic!("nothing to free")), 0);
    assert_eq!(t.drop_namespace(77, &mut |_| panic!("nothing to free")), 0);
    let s = t.stats();
    assert_eq!((s.cached_tokens, s.evicted_tokens, s.nodes), (3, 5, 1));
    t.check_invariants().unwrap();
}

#[test]
fn namespace_map_grows_and_shrinks_with_its_namespaces() {
    let t = tree(1);
    let n = 20_000u64;
    for ns in 0..n {
        t.insert(ns, &[ns as u32, 1], &[ns as u32, 7]).unwrap();
    }
    assert_eq!(t.stats().namespaces, n);
    for ns in (0..n).step_by(97) {
        assert_eq!(m(&t, ns, &[ns as u32, 1]), vec![ns as u32, 7]);
    }
    // Drop all but every 1000th; the rest must still be found after the shrinks.
    for ns in 0..n {
        if ns % 1000 != 0 {
            assert_eq!(t.drop_namespace(ns, &mut |_| {}), 2);
        }
    }
    assert_eq!(t.stats().namespaces, n / 1000);
    for ns in 0..n {
        let want = if ns % 1000 == 0 { vec![ns as u32, 7] } else { vec![] };
        assert_eq!(m(&t, ns, &[ns as u32, 1]), want);
    }
    assert_eq!(t.check_invariants().unwrap().namespaces, n / 1000);
}

#[test]
fn lock_moves_tokens_between_evictable_and_protected() {
    let t = tree(1);
    t.insert(0, &[1, 2, 3], &[10, 20, 30]).unwrap();
    let s = t.stats();
    assert_eq!((s.evictable_tokens, s.protected_tokens), (3, 0));
    let mut out: Vec<u32> = Vec::new();
    let g = t.match_and_lock(0, &[1, 2, 3], &mut out);
    assert_eq!(out, vec![10, 20, 30]);
    assert_eq!(g.len(), 3);
    let s = t.stats();
    assert_eq!((s.evictable_tokens, s.protected_tokens), (0, 3));
    // Pinned: nothing can be evicted.
    assert_eq!(t.evict(10, &mut |_| panic!("evicted a pinned token")), 0);
    t.check_invariants().unwrap();
    drop(g);
    let s = t.stats();
    assert_eq!((s.evictable_tokens, s.protected_tokens), (3, 0));
    t.check_invariants().unwrap();
}

#[test]
fn evict_frees_at_least_what_was_asked_lru_first() {
    let t = tree(1);
    t.insert(0, &[1, 2, 3], &[10, 20, 30]).unwrap();
    t.insert(0, &[5, 6], &[50, 60]).unwrap();
    t.insert(0, &[7, 8, 9, 10], &[70, 80, 90, 100]).unwrap();
    // Touch [1,2,3] and [7..] so [5,6] is the least recently used.
    m(&t, 0, &[1, 2, 3]);
    m(&t, 0, &[7, 8, 9, 10]);
    let mut freed = Vec::new();
    let n = t.evict(1, &mut |s| freed.extend_from_slice(s));
    assert!(n >= 1);
    assert_eq!(freed, vec![50, 60]);
    assert_eq!(n, 2);
    assert_eq!(t.stats().cached_tokens, 7);
    assert_eq!(t.stats().evicted_tokens, 2);
    t.check_invariants().unwrap();
    assert_eq!(drain(&t), vec![10, 20, 30, 70, 80, 90, 100]);
    assert_eq!(t.stats().cached_tokens, 0);
    assert_eq!(t.stats().nodes, 0);
    t.check_invariants().unwrap();
}

#[test]
fn parent_becomes_a_leaf_after_its_last_child_goes() {
    let t = tree(1);
    t.insert(0, &[1, 2, 3, 4], &[1, 2, 3, 4]).unwrap();
    t.insert(0, &[1, 2, 5, 6], &[1, 2, 5, 6]).unwrap(); // splits: [1,2] -> {[3,4],[5,6]}
    assert_eq!(t.stats().nodes, 3);
    let mut freed = Vec::new();
    t.evict(5, &mut |s| freed.extend_from_slice(s));
    freed.sort();
    assert_eq!(freed, vec![1, 2, 3, 4, 5, 6]);
    t.check_invariants().unwrap();
}

#[test]
fn page_sizes_give_page_multiple_matches() {
    for p in [1usize, 2, 4] {
        let t = tree(p);
        let toks: Vec<u32> = (1..=10).collect();
        let slots: Vec<u32> = (101..=110).collect();
        let e = t.insert(0, &toks, &slots).unwrap();
        assert_eq!(e, 0);
        let cached = 10 / p * p;
        assert_eq!(t.stats().cached_tokens as usize, cached);
        // A query of 7 tokens matches floor(7/p)*p.
        let got = m(&t, 0, &toks[..7]);
        assert_eq!(got.len(), 7 / p * p);
        assert_eq!(got, slots[..7 / p * p].to_vec());
        // A query diverging at token 6 (index 5) matches floor(5/p)*p.
        let mut q = toks.clone();
        q[5] = 999;
        let got = m(&t, 0, &q);
        assert_eq!(got.len(), 5 / p * p, "page size {p}");
        t.check_invariants().unwrap();
    }
}

#[test]
fn page_keyed_children_differ_after_the_first_token() {
    let t = tree(2);
    t.insert(0, &[1, 2, 3, 4], &[10, 20, 30, 40]).unwrap();
    t.insert(0, &[1, 5, 6, 7], &[11, 51, 61, 71]).unwrap();
    assert_eq!(m(&t, 0, &[1, 2, 3, 4]), vec![10, 20, 30, 40]);
    assert_eq!(m(&t, 0, &[1, 5, 6, 7]), vec![11, 51, 61, 71]);
    assert_eq!(m(&t, 0, &[1, 9]), Vec::<u32>::new());
    assert_eq!(t.stats().nodes, 2);
    t.check_invariants().unwrap();
}

#[test]
fn split_keeps_all_values() {
    let t = tree(1);
    let a: Vec<u32> = (1..=8).collect();
    let av: Vec<u32> = a.iter().map(|x| x * 10).collect();
    t.insert(0, &a, &av).unwrap();
    assert_eq!(t.insert(0, &[1, 2, 9, 10], &[0, 0, 90, 100]).unwrap(), 2);
    assert_eq!(m(&t, 0, &a), av);
    assert_eq!(m(&t, 0, &[1, 2, 9, 10]), vec![10, 20, 90, 100]);
    assert_eq!(m(&t, 0, &[1, 2]), vec![10, 20]);
    assert_eq!(t.stats().nodes, 3);
    t.check_invariants().unwrap();
}

/// The first version's bug (fixed 8 days after release): a match that forks inside an
/// edge went on matching below it. As tokens: "Hello_L.A.!" cached, then "Hello_world".
#[test]
fn match_that_forks_inside_an_edge_stops_there() {
    let t = tree(1);
    let la: Vec<u32> = "Hello_L.A.!".bytes().map(u32::from).collect();
    let world: Vec<u32> = "Hello_world".bytes().map(u32::from).collect();
    let la_slots: Vec<u32> = (0..la.len() as u32).collect();
    t.insert(0, &la, &la_slots).unwrap();
    // "Hello_" matches, then 'w' vs 'L' forks inside the edge.
    assert_eq!(m(&t, 0, &world), la_slots[..6].to_vec());
    let mut out: Vec<u32> = Vec::new();
    let g = t.match_and_lock(0, &world, &mut out);
    assert_eq!(out, la_slots[..6].to_vec());
    assert_eq!(g.len(), 6);
    drop(g);
    let world_slots: Vec<u32> = (100..100 + world.len() as u32).collect();
    assert_eq!(t.insert(0, &world, &world_slots).unwrap(), 6);
    // Each branch keeps its own slots after the fork.
    let mut want = la_slots[..6].to_vec();
    want.extend_from_slice(&world_slots[6..]);
    assert_eq!(m(&t, 0, &world), want);
    assert_eq!(m(&t, 0, &la), la_slots);
    // A query that shares "Hello_" and then a token found deeper in another branch must
    // not pick up that branch's slots.
    let tricky: Vec<u32> = "Hello_orld".bytes().map(u32::from).collect();
    assert_eq!(m(&t, 0, &tricky), la_slots[..6].to_vec());
    t.check_invariants().unwrap();
}

#[test]
fn match_and_lock_splits_and_pins_only_the_matched_part() {
    let t = tree(1);
    t.insert(0, &[1, 2, 3, 4, 5, 6], &[1, 2, 3, 4, 5, 6]).unwrap();
    let mut out: Vec<u32> = Vec::new();
    let g = t.match_and_lock(0, &[1, 2, 3, 9], &mut out);
    assert_eq!(out, vec![1, 2, 3]);
    let s = t.stats();
    assert_eq!((s.protected_tokens, s.evictable_tokens, s.nodes), (3, 3, 2));
    let mut freed = Vec::new();
    assert_eq!(t.evict(100, &mut |s| freed.extend_from_slice(s)), 3);
    assert_eq!(freed, vec![4, 5, 6]);
    t.check_invariants().unwrap();
    drop(g);
    assert_eq!(drain(&t), vec![1, 2, 3]);
    t.check_invariants().unwrap();
}

#[test]
fn pins_survive_a_split_of_the_pinned_edge() {
    let t = tree(1);
    t.insert(0, &[1, 2, 3, 4], &[1, 2, 3, 4]).unwrap();
    let mut out: Vec<u32> = Vec::new();
    let whole = t.match_and_lock(0, &[1, 2, 3, 4], &mut out).into_raw();
    // Split the pinned edge by locking a shorter prefix.
    let half = t.match_and_lock(0, &[1, 2], &mut out);
    assert_eq!(t.stats().nodes, 2);
    assert_eq!(t.stats().protected_tokens, 4);
    t.check_invariants().unwrap();
    t.release(whole).unwrap();
    let s = t.stats();
    assert_eq!((s.protected_tokens, s.evictable_tokens), (2, 2));
    t.check_invariants().unwrap();
    drop(half);
    assert_eq!(t.stats().protected_tokens, 0);
    t.check_invariants().unwrap();
}

#[test]
fn a_lock_on_a_shared_key_references_it_and_unpins_the_same_path() {
    use std::sync::Arc;
    let t = tree(2);
    // The buffer is longer than what is inserted and locked: the locks keep its first tokens.
    let buf: Arc<[u32]> = vec![1, 2, 3, 4, 5, 6, 9].into();
    let (e, g) = t
        .insert_and_lock(0, Key::Shared(&buf, 5), &[1, 2, 3, 4, 5], InsertOptions::default())
        .unwrap();
    assert_eq!((e, g.len()), (0, 4));
    let lock = g.into_raw();
    assert_eq!(lock.tokens(), &[1, 2, 3, 4]);
    assert_eq!(Arc::strong_count(&buf), 2, "the insert's lock shares the buffer");
    // A match-and-lock of a shorter prefix splits the edge; its lock shares the buffer too.
    let mut out: Vec<u32> = Vec::new();
    let l2 = t.match_and_lock(0, Key::Shared(&buf, 2), &mut out).into_raw();
    assert_eq!((&out[..], l2.tokens()), (&[1u32, 2][..], &[1u32, 2][..]));
    assert_eq!(Arc::strong_count(&buf), 3);
    assert_eq!(t.stats().protected_tokens, 4);
    t.release(lock).unwrap();
    assert_eq!((t.stats().protected_tokens, t.stats().evictable_tokens), (2, 2));
    t.release(l2).unwrap();
    assert_eq!(Arc::strong_count(&buf), 1, "released locks drop their share");
    assert_eq!((t.stats().protected_tokens, t.stats().evictable_tokens), (0, 4));
    // A miss keeps nothing of the buffer.
    let other: Arc<[u32]> = vec![8, 8].into();
    let l3 = t.match_and_lock(0, &other, &mut out).into_raw();
    assert_eq!(Arc::strong_count(&other), 1);
    assert!(l3.is_empty());
    t.release(l3).unwrap();
    t.check_invariants().unwrap();
    assert_eq!(drain(&t), vec![1, 2, 3, 4]);
}

#[test]
fn insert_and_lock_pins_atomically() {
    let t = tree(2);
    let (e, g) =
        t.insert_and_lock(0, &[1, 2, 3, 4, 5], &[1, 2, 3, 4, 5], InsertOptions::default()).unwrap();
    assert_eq!(e, 0);
    assert_eq!(g.len(), 4);
    assert_eq!(t.stats().protected_tokens, 4);
    assert_eq!(t.evict(100, &mut |_| panic!("pinned")), 0);
    // Re-inserting a prefix that ends inside the edge splits it and pins only that.
    let (e2, g2) = t.insert_and_lock(0, &[1, 2], &[7, 7], InsertOptions::default()).unwrap();
    assert_eq!((e2, g2.len()), (2, 2));
    drop(g);
    let s = t.stats();
    assert_eq!((s.protected_tokens, s.evictable_tokens), (2, 2));
    t.check_invariants().unwrap();
    drop(g2);
    assert_eq!(drain(&t), vec![1, 2, 3, 4]);
}

#[test]
fn empty_and_bad_inputs() {
    assert!(
        RadixTree::new(TreeConfig {
            page_size: 0,
            policy: EvictionPolicy::Lru,
            ..Default::default()
        })
        .is_err()
    );
    let t = tree(4);
    assert!(matches!(t.insert(0, &[1, 2], &[1]), Err(Error::InvalidArgument(_))));
    assert_eq!(t.stats().cached_tokens, 0);
    assert_eq!(t.insert(0, &[1, 2, 3], &[1, 2, 3]).unwrap(), 0); // shorter than a page
    assert_eq!(t.stats().cached_tokens, 0);
    assert_eq!(m(&t, 0, &[]), Vec::<u32>::new());
    let mut out: Vec<u32> = Vec::new();
    let g = t.match_and_lock(0, &[], &mut out);
    assert!(g.is_empty());
    drop(g);
    let other = tree(4);
    let mut out: Vec<u32> = Vec::new();
    let l = other.match_and_lock(0, &[1], &mut out).into_raw();
    assert_eq!(t.release(l), Err(Error::InvalidLock));
    t.check_invariants().unwrap();
}

#[test]
fn reset_drops_unpinned_only() {
    let t = tree(1);
    t.insert(0, &[1, 2, 3], &[1, 2, 3]).unwrap();
    t.insert(1, &[4, 5], &[4, 5]).unwrap();
    let mut out: Vec<u32> = Vec::new();
    let g = t.match_and_lock(1, &[4, 5], &mut out);
    let mut freed = Vec::new();
    t.reset(&mut |s| freed.extend_from_slice(s));
    assert_eq!(freed, vec![1, 2, 3]);
    assert_eq!(t.stats().cached_tokens, 2);
    drop(g);
    t.check_invariants().unwrap();
}

#[test]
fn fifo_ignores_accesses() {
    let t = RadixTree::new(TreeConfig {
        page_size: 1,
        policy: EvictionPolicy::Fifo,
        ..Default::default()
    })
    .unwrap();
    t.insert(0, &[1], &[1]).unwrap();
    t.insert(0, &[2], &[2]).unwrap();
    m(&t, 0, &[1]);
    let mut freed = Vec::new();
    t.evict(1, &mut |s| freed.extend_from_slice(s));
    assert_eq!(freed, vec![1]);
}

#[test]
fn lock_guard_is_send() {
    fn assert_send<T: Send>() {}
    fn assert_sync<T: Send + Sync>() {}
    assert_send::<LockGuard<'static>>();
    assert_send::<PrefixLock>();
    assert_sync::<RadixTree>();
}

#[test]
fn paged_slots_are_stored_compactly_and_read_back_exactly() {
    let t = tree(4);
    let toks: Vec<u32> = (0..12).collect();
    // Pages of consecutive slots (not page-aligned, not in page order): compact form.
    let slots: Vec<u32> = (40..44).chain(8..12).chain(100..104).collect();
    t.insert(0, &toks, &slots).unwrap();
    let compact = t.check_invariants().unwrap().heap_bytes;
    assert_eq!(m(&t, 0, &toks), slots);
    // A split inside the edge keeps every slot.
    let mut q = toks.clone();
    q[9] = 77;
    assert_eq!(t.insert(0, &q, &(200..212).collect::<Vec<_>>()).unwrap(), 8);
    assert_eq!(m(&t, 0, &toks), slots);
    let mut want = slots[..8].to_vec();
    want.extend(208..212);
    assert_eq!(m(&t, 0, &q), want);
    // A page whose slots do not run consecutively: stored one by one, still exact.
    let t2 = tree(4);
    let odd: Vec<u32> = (40..44).chain([9, 8, 10, 11]).chain(100..104).collect();
    t2.insert(0, &toks, &odd).unwrap();
    assert_eq!(m(&t2, 0, &toks), odd);
    assert!(t2.check_invariants().unwrap().heap_bytes > compact);
    t.check_invariants().unwrap();
    let mut freed = drain(&t);
    freed.sort();
    let mut all: Vec<u32> = slots.iter().copied().chain(208..212).collect();
    all.sort();
    assert_eq!(freed, all);
}

#[test]
fn a_lone_child_differing_inside_the_first_page_is_no_match() {
    let t = tree(2);
    t.insert(0, &[1, 2, 3, 4], &[10, 20, 30, 40]).unwrap();
    t.insert(0, &[5, 6], &[50, 60]).unwrap();
    assert_eq!(m(&t, 0, &[1, 9, 3, 4]), Vec::<u32>::new());
    let mut out: Vec<u32> = Vec::new();
    let g = t.match_and_lock(0, &[1, 9, 3, 4], &mut out);
    assert!(g.is_empty() && out.is_empty());
    drop(g);
    let g = t.match_and_lock(0, &[1, 2, 9, 9], &mut out);
    assert_eq!(out, vec![10, 20]);
    drop(g);
    assert_eq!(t.insert(0, &[1, 9, 3, 4], &[11, 91, 31, 41]).unwrap(), 0);
    assert_eq!(m(&t, 0, &[1, 9, 3, 4]), vec![11, 91, 31, 41]);
    assert_eq!(m(&t, 0, &[1, 2, 3, 4]), vec![10, 20, 30, 40]);
    let c = t.check_invariants().unwrap();
    assert_eq!((c.nodes, c.cached_tokens), (4, 10)); // [1,2]->[3,4], [1,9,3,4], [5,6]
}

#[test]
fn a_run_of_consecutive_slots_is_stored_as_one_base_at_any_page_size() {
    for p in [1, 4] {
        let toks: Vec<u32> = (0..64).collect();
        // A run that wraps past u32::MAX is still a run (expansion adds wrapping).
        let run: Vec<u32> = (0..64u32).map(|i| (u32::MAX - 9).wrapping_add(i)).collect();
        let t = tree(p);
        t.insert(0, &toks, &run).unwrap();
        let one_base = t.check_invariants().unwrap().heap_bytes;
        assert_eq!(m(&t, 0, &toks), run);
        // The same edge with two slots swapped: four runs, and a fifth where the run passes
        // u32::MAX (only a single run may wrap): 9 words.
        let mut odd = run.clone();
        odd.swap(5, 6);
        let t2 = tree(p);
        t2.insert(0, &toks, &odd).unwrap();
        assert_eq!(m(&t2, 0, &toks), odd);
        let four_runs = t2.check_invariants().unwrap().heap_bytes;
        assert_eq!(four_runs, one_base + 4 * 8, "p {p}");
        // Descending slots (64 runs of one): every slot stored.
        let down: Vec<u32> = run.iter().rev().copied().collect();
        let t3 = tree(p);
        t3.insert(0, &toks, &down).unwrap();
        assert_eq!(m(&t3, 0, &toks), down);
        let per_token = t3.check_invariants().unwrap().heap_bytes;
        assert_eq!(per_token, one_base + 4 * 63, "p {p}");
        // Splits of the four-run edge at every page boundary keep every slot.
        for cut in (p..64).step_by(p) {
            let t4 = tree(p);
            t4.insert(0, &toks, &odd).unwrap();
            let mut q = toks.clone();
            q[cut] = 1000;
            let l = t4.match_and_lock(0, &q, &mut Vec::<u32>::new()).into_raw();
            assert_eq!(l.len(), cut);
            assert_eq!(m(&t4, 0, &toks), odd, "p {p} cut {cut}");
            assert_eq!(m(&t4, 0, &q), odd[..cut], "p {p} cut {cut}");
            t4.release(l).unwrap();
            let mut all = odd.clone();
            all.sort();
            assert_eq!(drain(&t4), all, "p {p} cut {cut}");
        }
        // Splits inside the run (a fork at token 40, a lock ending at 24) keep every slot.
        let mut q = toks.clone();
        q[40] = 1000;
        let fresh: Vec<u32> = (5000..5064).collect();
        assert_eq!(t.insert(0, &q, &fresh).unwrap(), 40);
        let l = t.match_and_lock(0, &toks[..24], &mut Vec::<u32>::new()).into_raw();
        assert_eq!(l.len(), 24);
        assert_eq!(m(&t, 0, &toks), run);
        let mut want = run[..40].to_vec();
        want.extend_from_slice(&fresh[40..]);
        assert_eq!(m(&t, 0, &q), want);
        t.release(l).unwrap();
        t.check_invariants().unwrap();
        let mut all: Vec<u32> = run.iter().copied().chain(5040..5064).collect();
        all.sort();
        assert_eq!(drain(&t), all);
    }
}

#[test]
fn evict_runs_hands_over_every_slot_once_as_runs() {
    for p in [1, 4] {
        let t = tree(p);
        let toks = |a: u32| (a..a + 16).collect::<Vec<u32>>();
        // One run, two runs, one base per page, and one per token.
        let layouts: [Vec<u32>; 4] = [
            (100..116).collect(),
            (208..216).chain(200..208).collect(),
            (0..4).flat_map(|i| (300 + 10 * i)..(304 + 10 * i)).collect(),
            (400..416).rev().collect(),
        ];
        for (i, slots) in layouts.iter().enumerate() {
            t.insert(i as u64, &toks(0), slots).unwrap();
        }
        let mut calls = Vec::new();
        let n = t.evict_runs(usize::MAX, &mut |runs| calls.push(runs.to_vec()));
        assert_eq!(n, 64);
        // LRU order is insertion order here; each leaf's runs are maximal.
        let lens: Vec<usize> = calls.iter().map(|c| c.len()).collect();
        assert_eq!(lens, [1, 2, 4, 16], "p {p}");
        for (c, slots) in calls.iter().zip(&layouts) {
            let got: Vec<u32> = c.iter().flat_map(|r| r.slots()).collect();
            assert_eq!(&got, slots, "p {p}");
        }
        assert_eq!(t.stats().cached_tokens, 0);
        t.check_invariants().unwrap();
    }
}

#[test]
fn short_runs_are_counted_before_choosing_runs() {
    // Heap bytes of an edge of these slots, after checking that it reads back exactly and
    // that a split in its middle keeps every slot.
    let bytes = |slots: &[u32]| {
        let toks: Vec<u32> = (0..slots.len() as u32).collect();
        let t = tree(1);
        t.insert(0, &toks, slots).unwrap();
        let heap = t.check_invariants().unwrap().heap_bytes;
        assert_eq!(m(&t, 0, &toks), slots);
        let l = t.match_and_lock(0, &toks[..slots.len() / 2], &mut Vec::<u32>::new()).into_raw();
        assert_eq!(m(&t, 0, &toks), slots);
        t.release(l).unwrap();
        let mut all = slots.to_vec();
        all.sort();
        assert_eq!(drain(&t), all);
        heap
    };
    let one = |n: u32| bytes(&(1000..1000 + n).collect::<Vec<u32>>());
    // Ten runs of 3, then a run of 100: eleven runs, 21 words.
    let mut short: Vec<u32> = (0..10u32).flat_map(|r| 10 * r..10 * r + 3).collect();
    short.extend(500..600);
    assert_eq!(bytes(&short), one(130) + 4 * 20);
    // Long edges: 100 runs of 3 then a run of 300 (a head averaging 3 slots a run: the
    // runs are walked and counted), and 300 single slots then a run of 300 (a scattered
    // head: taken as scattered, one slot per token).
    let mut walked: Vec<u32> = (0..100u32).flat_map(|r| 10 * r..10 * r + 3).collect();
    walked.extend(5000..5300);
    assert_eq!(bytes(&walked), one(600) + 4 * 200);
    let mut head: Vec<u32> = (0..300u32).map(|r| 10 * r).collect();
    head.extend(5000..5300);
    assert_eq!(bytes(&head), one(600) + 4 * 599);
}

#[test]
fn match_prefix_runs_names_the_same_slots_as_runs() {
    for p in [1, 4] {
        let t = tree(p);
        let toks: Vec<u32> = (0..16).collect();
        // One run, two runs, one base per page, one per token, and runs a page apart that
        // join across the pages (stored per page) or not.
        let layouts: [Vec<u32>; 5] = [
            (100..116).collect(),
            (208..216).chain(200..208).collect(),
            (0..4).flat_map(|i| (300 + 10 * i)..(304 + 10 * i)).collect(),
            (400..416).rev().collect(),
            (500..516)
                .collect::<Vec<u32>>()
                .iter()
                .map(|&s| if s >= 508 { s + 1 } else { s })
                .collect(),
        ];
        for (i, slots) in layouts.iter().enumerate() {
            t.insert(i as u64, &toks, slots).unwrap();
            // A fork after 8 tokens splits the edge; a second fork at 12 inside the rest.
            let mut q = toks.clone();
            q[8] = 1000;
            t.insert(i as u64, &q, &(600..616).collect::<Vec<u32>>()).unwrap();
        }
        for (i, slots) in layouts.iter().enumerate() {
            let ns = i as u64;
            for cut in 0..=16 {
                let mut q = toks[..cut].to_vec();
                q.push(2000);
                let mut want = Vec::new();
                let m = t.match_prefix(ns, &q, &mut want);
                let mut runs = vec![SlotRun { start: 9, len: 9 }]; // cleared first
                assert_eq!(t.match_prefix(ns, &q, &mut runs), m, "p {p} layout {i} cut {cut}");
                let got: Vec<u32> = runs.iter().flat_map(|r| r.slots()).collect();
                assert_eq!(got, want, "p {p} layout {i} cut {cut}");
                assert_eq!(&got[..], &slots[..m]);
                // Maximal: as many runs as the slots form.
                let mut maximal = Vec::new();
                SlotRun::push_runs_of(&want, &mut maximal);
                assert_eq!(runs, maximal, "p {p} layout {i} cut {cut}");
                // The locking variant names the same slots and pins the match.
                let mut lruns = Vec::new();
                let l = t.match_and_lock(ns, &q, &mut lruns);
                assert_eq!((l.len(), &lruns), (m, &runs));
                assert_eq!(t.stats().protected_tokens as usize, m);
                drop(l);
                assert_eq!(t.stats().protected_tokens, 0);
            }
        }
        t.check_invariants().unwrap();
    }
}

/// A `free` callback that panics part-way through an eviction: the leaves unlinked so far
/// are counted out (the counters still equal a walk of the tree), and the tree keeps working.
#[test]
fn a_panicking_free_callback_leaves_the_counts_exact() {
    let t = tree(1);
    for i in 0..6u32 {
        t.insert(0, &[i, 100 + i], &[10 * i, 10 * i + 1]).unwrap();
    }
    let mut calls = 0;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        t.evict(usize::MAX, &mut |_| {
            calls += 1;
            if calls == 3 {
                panic!("the caller's free failed");
            }
        })
    }));
    assert!(r.is_err());
    let census = t.check_invariants().unwrap();
    assert_eq!(census.cached_tokens, 6, "three leaves of two tokens went");
    assert_eq!(t.stats().evicted_tokens, 6);
    assert_eq!(drain(&t).len(), 6);
    t.check_invariants().unwrap();
}

#[test]
fn slot_sinks_rewind_to_a_mark() {
    // An insert checks its outcome with an edge's slots appended, then rewinds: the sink
    // must be exactly as before, also when the edge's first run continued the sink's last.
    let node = Node::new(super::slots::Edge::new(&[1, 2, 3, 4], &[10, 11, 12, 40], 1), 0, 0, 0);
    let mut runs = vec![SlotRun { start: 5, len: 1 }, SlotRun { start: 8, len: 2 }];
    let before = runs.clone();
    let m = runs.mark();
    runs.take(&node, 4);
    assert_eq!(runs[1], SlotRun { start: 8, len: 5 }, "10, 11, 12 continue 8, 9");
    assert_eq!(runs.len(), 3);
    runs.rewind(m);
    assert_eq!(runs, before);
    let mut empty: Vec<SlotRun> = Vec::new();
    let m = empty.mark();
    empty.take(&node, 2);
    empty.rewind(m);
    assert!(empty.is_empty());
    let mut list = vec![7u32, 9];
    let m = list.mark();
    list.take(&node, 3);
    assert_eq!(list, [7, 9, 10, 11, 12]);
    list.rewind(m);
    assert_eq!(list, [7, 9]);
}

/// A `free` callback that panics on a leaf whose eviction leaves its parent a leaf: the
/// pending leaf is still retired and its parent queued (the pass's drop), so the parent can
/// be evicted afterwards. (Before, the parent was never queued and stayed cached for good,
/// and the leaf was never retired: a leak, which `scripts/test-all` checks under valgrind.)
#[test]
fn a_panicking_free_callback_still_queues_the_parent() {
    let t = tree(1);
    t.insert(0, &[1, 2], &[10, 20]).unwrap();
    t.insert(0, &[1, 2, 3], &[10, 20, 30]).unwrap(); // [1, 2] -> [3]
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        t.evict(1, &mut |_| panic!("the caller's free failed"))
    }));
    assert!(r.is_err());
    assert_eq!(t.check_invariants().unwrap().cached_tokens, 2);
    assert_eq!(drain(&t), vec![10, 20], "the parent left a leaf is evictable");
    assert_eq!(t.check_invariants().unwrap().nodes, 0);
}

/// LRU order is exact in one thread: every access gets its own stamp, so the least recently
/// used leaf goes first even when no insert ran between the accesses. (Before, the clock
/// moved only on inserts: both matches got the same stamp and B, the most recently used,
/// was evicted.)
#[test]
fn lru_order_is_exact_between_inserts() {
    let t = tree(1);
    t.insert(0, &[1, 2], &[10, 11]).unwrap(); // A
    t.insert(0, &[5, 6], &[50, 51]).unwrap(); // B
    m(&t, 0, &[1, 2]);
    m(&t, 0, &[5, 6]);
    let mut freed = Vec::new();
    t.evict(1, &mut |s| freed.extend_from_slice(s));
    assert_eq!(freed, vec![10, 11], "A is the least recently used");
    // And the other way round, with a locking match and a partial match as the accesses.
    t.insert(0, &[1, 2], &[10, 11]).unwrap();
    m(&t, 0, &[5]);
    let mut out: Vec<u32> = Vec::new();
    drop(t.match_and_lock(0, &[1, 2], &mut out));
    freed.clear();
    t.evict(1, &mut |s| freed.extend_from_slice(s));
    assert_eq!(freed, vec![50, 51], "B is the least recently used now");
}

#[test]
fn child_table_without_tells_not_found_from_empty() {
    let (a, b) =
        (std::ptr::without_provenance_mut::<Node>(8), std::ptr::without_provenance_mut(16));
    let one = ChildTable::single(1, a);
    assert!(one.without(1, b).is_none(), "not in the table");
    assert!(matches!(one.without(1, a), Some(node::Without::Empty)));
    let two = one.with_added(2, b);
    match two.without(1, a) {
        Some(node::Without::Rest(t)) => assert_eq!(t.nodes().collect::<Vec<_>>(), vec![b]),
        _ => panic!("one child is left"),
    }
    assert!(two.without(3, a).is_none(), "wrong first token");
}

// ---------------------------------------------------------------- eviction policies

fn policy_tree(policy: EvictionPolicy, p: usize) -> RadixTree {
    RadixTree::new(TreeConfig { page_size: p, policy, ..Default::default() }).unwrap()
}

/// Evicts one leaf at a time until nothing is left: the first slot of each, in order.
fn order(t: &RadixTree) -> Vec<u32> {
    let mut seq = Vec::new();
    loop {
        let mut freed = Vec::new();
        t.evict(1, &mut |s| freed.extend_from_slice(s));
        match freed.first() {
            Some(&f) => seq.push(f),
            None => return seq,
        }
    }
}

/// (priority, hits, len) of each node on the path `key`.
fn meta_of(t: &RadixTree, key: &[u32]) -> Vec<(i32, u32, usize)> {
    t.inspect(0, key).iter().map(|i| (i.priority, i.hits, i.len)).collect()
}

#[test]
fn each_policy_orders_three_leaves_as_sglang_does() {
    // Leaves [1], [2], [3] inserted in that order; [1] matched since; [3] inserted again
    // (a hit) with priority 2, [2] with priority 1.
    let build = |policy| {
        let t = policy_tree(policy, 1);
        t.insert(0, &[1], &[1]).unwrap();
        t.insert(0, &[2], &[2]).unwrap();
        t.insert(0, &[3], &[3]).unwrap();
        m(&t, 0, &[1]);
        t.insert_with(0, &[3], &[3], InsertOptions::with_priority(2)).unwrap();
        t.insert_with(0, &[2], &[2], InsertOptions::with_priority(1)).unwrap();
        t
    };
    // Last accesses: [1] < [3] < [2] (the re-inserts access); creation: [1] < [2] < [3].
    let want = [
        (EvictionPolicy::Lru, vec![1, 3, 2]),
        (EvictionPolicy::Fifo, vec![1, 2, 3]),
        (EvictionPolicy::Mru, vec![2, 3, 1]),
        (EvictionPolicy::Filo, vec![3, 2, 1]),
        // Hits: [1] 1, [2] 2, [3] 2; then by last access.
        (EvictionPolicy::Lfu, vec![1, 3, 2]),
        // Threshold 2: [1] probationary, [2] and [3] protected.
        (EvictionPolicy::Slru, vec![1, 3, 2]),
        // Priorities: [1] 0, [2] 1, [3] 2.
        (EvictionPolicy::Priority, vec![1, 2, 3]),
    ];
    for (policy, w) in want {
        let t = build(policy);
        assert_eq!(order(&t), w, "{policy}");
        t.check_invariants().unwrap();
    }
}

#[test]
fn lfu_counts_inserts_not_matches_and_slru_reads_its_threshold() {
    let t = policy_tree(EvictionPolicy::Lfu, 1);
    t.insert(0, &[1], &[1]).unwrap();
    t.insert(0, &[2], &[2]).unwrap();
    for _ in 0..5 {
        m(&t, 0, &[1]); // matches count no hit
    }
    t.insert(0, &[2], &[2]).unwrap();
    assert_eq!(meta_of(&t, &[1]), vec![(0, 1, 1)]);
    assert_eq!(meta_of(&t, &[2]), vec![(0, 2, 1)]);
    assert_eq!(order(&t), vec![1, 2]);
    // Threshold 3: both probationary, LRU between them; 2: [1] protected.
    for (threshold, want) in [(3, vec![1, 2]), (2, vec![2, 1])] {
        let cfg = TreeConfig {
            policy: EvictionPolicy::Slru,
            slru_threshold: threshold,
            page_size: 1,
            swa_window: 0,
        };
        let t = RadixTree::new(cfg).unwrap();
        t.insert(0, &[1], &[1]).unwrap();
        t.insert(0, &[1], &[1]).unwrap(); // 2 hits
        t.insert(0, &[2], &[2]).unwrap(); // 1 hit, accessed last
        assert_eq!(order(&t), want, "threshold {threshold}");
    }
}

#[test]
fn split_halves_inherit_priority_and_hit_count() {
    let key: Vec<u32> = (1..=8).collect();
    let slots: Vec<u32> = (10..18).collect();
    let mut out: Vec<u32> = Vec::new();
    // Priority: a locking match splits [1..8] at 4; both halves keep priority 5.
    let t = policy_tree(EvictionPolicy::Priority, 2);
    t.insert_with(0, &key, &slots, InsertOptions::with_priority(5)).unwrap();
    let g = t.match_and_lock(0, &key[..4], &mut out);
    assert_eq!(meta_of(&t, &key), vec![(5, 0, 4), (5, 0, 4)]);
    // An insert diverging after [1..4] raises the upper half only (its path), and the new
    // leaf takes its priority.
    t.insert_with(0, &[1, 2, 3, 4, 9, 9], &[0, 0, 0, 0, 20, 21], InsertOptions::with_priority(7))
        .unwrap();
    assert_eq!(meta_of(&t, &key), vec![(7, 0, 4), (5, 0, 4)]);
    assert_eq!(meta_of(&t, &[1, 2, 3, 4, 9, 9]), vec![(7, 0, 4), (7, 0, 2)]);
    drop(g);
    t.check_invariants().unwrap();

    // Hits: [1..8] inserted twice (2 hits), then split by a locking match; an insert of
    // [1..4] passes the upper half only.
    let t = policy_tree(EvictionPolicy::Lfu, 2);
    t.insert(0, &key, &slots).unwrap();
    t.insert(0, &key, &slots).unwrap();
    assert_eq!(meta_of(&t, &key), vec![(0, 2, 8)]);
    let g = t.match_and_lock(0, &key[..4], &mut out);
    assert_eq!(meta_of(&t, &key), vec![(0, 2, 4), (0, 2, 4)]);
    t.insert(0, &key[..4], &slots[..4]).unwrap();
    assert_eq!(meta_of(&t, &key), vec![(0, 3, 4), (0, 2, 4)]);
    // A split inside the lower half: both of its halves keep its 2 hits.
    t.insert(0, &[1, 2, 3, 4, 5, 6, 0, 0], &[0; 8]).unwrap();
    assert_eq!(meta_of(&t, &key), vec![(0, 4, 4), (0, 3, 2), (0, 2, 2)]);
    drop(g);
    t.check_invariants().unwrap();
}

#[test]
fn an_insert_ending_inside_an_edge_splits_only_when_its_policy_reads_what_changes() {
    let key: Vec<u32> = (1..=8).collect();
    let slots: Vec<u32> = (10..18).collect();
    for policy in EvictionPolicy::ALL {
        let t = policy_tree(policy, 2);
        t.insert(0, &key, &slots).unwrap();
        // Same priority (0): splits only where it counts a hit.
        t.insert(0, &key[..4], &slots[..4]).unwrap();
        let nodes = t.stats().nodes;
        let split = matches!(policy, EvictionPolicy::Lfu | EvictionPolicy::Slru);
        assert_eq!(nodes, 1 + split as u64, "{policy}");
        // A higher priority: splits under `priority` too (only the inserted part is raised).
        t.insert_with(0, &key[..2], &slots[..2], InsertOptions::with_priority(3)).unwrap();
        let want = match policy {
            EvictionPolicy::Lfu | EvictionPolicy::Slru => 3,
            EvictionPolicy::Priority => 2,
            _ => 1,
        };
        assert_eq!(t.stats().nodes, want, "{policy}");
        if policy == EvictionPolicy::Priority {
            assert_eq!(meta_of(&t, &key), vec![(3, 0, 2), (0, 0, 6)]);
        }
        // Counted once per request: `inserted_len` covers what it inserted before.
        if policy == EvictionPolicy::Lfu {
            let before = meta_of(&t, &key);
            let o = InsertOptions { priority: 0, inserted_len: 8 };
            t.insert_with(0, &key, &slots, o).unwrap();
            assert_eq!(meta_of(&t, &key), before);
            let o = InsertOptions { priority: 0, inserted_len: 4 };
            t.insert_with(0, &key, &slots, o).unwrap();
            let hits: Vec<u32> = meta_of(&t, &key).iter().map(|x| x.1).collect();
            let was: Vec<u32> = before.iter().map(|x| x.1).collect();
            // Nodes ending at 2 and 4 count nothing, the one ending at 8 one more.
            assert_eq!(hits, vec![was[0], was[1], was[2] + 1]);
        }
        t.check_invariants().unwrap();
    }
}

#[test]
fn mru_rekeys_a_queued_leaf_on_every_kind_of_access() {
    let t = policy_tree(EvictionPolicy::Mru, 1);
    for i in 1..=4 {
        t.insert(0, &[i], &[i]).unwrap();
    }
    // [2] matched, [3] locked and released, [1] re-inserted: [1] is now the most recent.
    m(&t, 0, &[2]);
    let mut out: Vec<u32> = Vec::new();
    drop(t.match_and_lock(0, &[3], &mut out));
    t.insert(0, &[1], &[1]).unwrap();
    t.check_invariants().unwrap();
    assert_eq!(order(&t), vec![1, 3, 2, 4]);
    // No stale entry is left behind by re-keying: the map holds one entry per queued leaf.
    for i in 1..=50 {
        t.insert(0, &[i], &[i]).unwrap();
    }
    for _ in 0..1000 {
        m(&t, 0, &[7]);
    }
    assert_eq!(t.eviction_queue_len(), 50);
}

#[test]
fn a_parent_left_without_children_competes_with_its_own_key() {
    // [1] -> {[1, 2], [1, 3]}; under filo the newest goes first, and once both children
    // went, the parent [1] (created first) competes: it goes last.
    let t = policy_tree(EvictionPolicy::Filo, 1);
    t.insert(0, &[1], &[1]).unwrap();
    t.insert(0, &[5], &[5]).unwrap();
    t.insert(0, &[1, 2], &[1, 2]).unwrap();
    t.insert(0, &[1, 3], &[1, 3]).unwrap();
    assert_eq!(order(&t), vec![3, 2, 5, 1]);
}

#[test]
fn priorities_outside_i32_are_refused_at_wide_boundaries() {
    assert!(checked_priority(1 << 40).is_err());
    assert_eq!(checked_priority(-(1 << 31)).unwrap(), i32::MIN);
    let t = policy_tree(EvictionPolicy::Priority, 1);
    t.insert_with(0, &[1], &[1], InsertOptions::with_priority(i32::MIN)).unwrap();
    t.insert_with(0, &[2], &[2], InsertOptions::with_priority(i32::MAX)).unwrap();
    t.insert(0, &[3], &[3]).unwrap();
    assert_eq!(order(&t), vec![1, 3, 2]);
}
