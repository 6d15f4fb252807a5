//! The tree's KV-event hooks, one behaviour at a time: one `BlockStored` per insert that
//! adds pages (right hashes, right parent), nothing for splits, pins and matches, the right
//! hashes removed by eviction and `drop_namespace`, and the exclusive reset.

use radixkv::InsertOptions;
use radixkv::events::hash::{HashMode, PageHasher};
use radixkv::events::{KvEvent, NamespaceMeta, SinkOptions};
use radixkv::{Cache, CacheOptions, EventOptions, EvictionPolicy, RadixTree, TreeConfig};

use crate::replay;

const P: usize = 2;

fn tree() -> RadixTree {
    let mut t = RadixTree::new(TreeConfig {
        page_size: P,
        policy: EvictionPolicy::Lru,
        ..Default::default()
    })
    .unwrap();
    t.enable_events(SinkOptions { block_size: P as u32, ..Default::default() }).unwrap();
    t
}

fn events(t: &RadixTree) -> Vec<KvEvent> {
    let s = t.events().unwrap();
    s.flush();
    s.drain().into_iter().flat_map(|(_, b)| b.events).collect()
}

fn hashes(tokens: &[u32]) -> Vec<u64> {
    PageHasher::new(HashMode::Xxh3, None, None).block_hashes(tokens, P)
}

fn slots(n: usize) -> Vec<u32> {
    (0..n as u32).collect()
}

fn stored(e: &KvEvent) -> (&[u64], Option<u64>, &[u32]) {
    match e {
        KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size, .. } => {
            assert_eq!(*block_size as usize, P);
            (block_hashes, *parent_block_hash, token_ids)
        }
        e => panic!("not a store: {e:?}"),
    }
}

#[test]
fn one_store_per_insert_with_its_parent() {
    let t = tree();
    let a = [1, 2, 3, 4, 5, 6];
    assert_eq!(t.insert(0, &a, &slots(6)).unwrap(), 0);
    let ev = events(&t);
    assert_eq!(ev.len(), 1);
    let (h, parent, toks) = stored(&ev[0]);
    assert_eq!((h, parent, toks), (&hashes(&a)[..], None, &a[..]));

    // Extends the cached path by two pages (and a ragged tail that is not cached).
    let b = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
    assert_eq!(t.insert(0, &b, &slots(11)).unwrap(), 6);
    let ev = events(&t);
    assert_eq!(ev.len(), 1);
    let full = hashes(&b[..10]);
    let (h, parent, toks) = stored(&ev[0]);
    assert_eq!((h, parent, toks), (&full[3..], Some(full[2]), &b[6..10]));

    // Everything cached already: nothing.
    t.insert(0, &b[..8], &slots(8)).unwrap();
    assert!(events(&t).is_empty());
    assert_eq!(t.cached_page_hashes(), sorted(full));
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

#[test]
fn splits_pins_and_matches_publish_nothing() {
    let t = tree();
    let a = [1, 2, 3, 4, 5, 6, 7, 8];
    t.insert(0, &a, &slots(8)).unwrap();
    events(&t);
    let mut out: Vec<u32> = Vec::new();
    // A lock ending inside the edge splits it; a match reads.
    let l = t.match_and_lock(0, &a[..4], &mut out).into_raw();
    assert_eq!(t.match_prefix(0, &a, &mut out), 8);
    assert!(events(&t).is_empty(), "split, pin, match: no event");
    // Diverges inside the lower half: a split, and one store for the new page only.
    let b = [1, 2, 3, 4, 5, 6, 9, 9];
    assert_eq!(t.insert(0, &b, &slots(8)).unwrap(), 6);
    let ev = events(&t);
    assert_eq!(ev.len(), 1);
    let hb = hashes(&b);
    let (h, parent, _) = stored(&ev[0]);
    assert_eq!((h, parent), (&hb[3..], Some(hb[2])));
    t.release(l).unwrap();
    assert!(events(&t).is_empty(), "an unpin publishes nothing");
    let mut want = hashes(&a);
    want.push(hb[3]);
    assert_eq!(t.cached_page_hashes(), sorted(want.clone()));
    // The halves kept their share: evicting everything removes exactly these hashes.
    t.reset(&mut |_| {});
    let ev = events(&t);
    let mut removed = Vec::new();
    for e in &ev {
        match e {
            KvEvent::BlockRemoved { block_hashes, .. } => removed.extend_from_slice(block_hashes),
            e => panic!("{e:?}"),
        }
    }
    assert_eq!(sorted(removed), sorted(want));
    assert!(t.cached_page_hashes().is_empty());
}

#[test]
fn eviction_removes_the_leaf_s_hashes_leaf_first() {
    let t = tree();
    let a = [1, 2, 3, 4];
    let b = [1, 2, 3, 4, 5, 6, 7, 8];
    t.insert(0, &a, &slots(4)).unwrap();
    t.insert(0, &b, &slots(8)).unwrap();
    events(&t);
    let hb = hashes(&b);
    assert_eq!(t.evict(1, &mut |_| {}), 4);
    let ev = events(&t);
    assert_eq!(
        ev,
        vec![KvEvent::BlockRemoved { block_hashes: hb[2..].to_vec(), medium: Default::default() }]
    );
    assert_eq!(t.evict(1, &mut |_| {}), 4);
    let ev = events(&t);
    assert_eq!(
        ev,
        vec![KvEvent::BlockRemoved { block_hashes: hb[..2].to_vec(), medium: Default::default() }]
    );
    // Stored again after its removal: a fresh store with the same hashes.
    t.insert(0, &a, &slots(4)).unwrap();
    let ev = events(&t);
    assert_eq!(stored(&ev[0]).0, &hb[..2]);
}

#[test]
fn drop_namespace_removes_its_pages_and_metadata_names_them() {
    let t = tree();
    let s = t.events().unwrap();
    s.set_namespace(5, NamespaceMeta { lora_name: None, cache_salt: Some("tenant".into()) })
        .unwrap();
    let a = [1, 2, 3, 4];
    t.insert(0, &a, &slots(4)).unwrap();
    t.insert(5, &a, &slots(4)).unwrap();
    let ev = events(&t);
    assert_eq!(ev.len(), 2);
    let h5 = PageHasher::new(HashMode::Xxh3, None, Some("tenant")).block_hashes(&a, P);
    assert_eq!(stored(&ev[1]).0, &h5[..]);
    assert_ne!(h5, hashes(&a), "namespaces never share hashes");
    match &ev[1] {
        KvEvent::BlockStored { cache_salt, .. } => {
            assert_eq!(cache_salt.as_deref(), Some("tenant"))
        }
        _ => unreachable!(),
    }
    assert_eq!(t.drop_namespace(5, &mut |_| {}), 4);
    let ev = events(&t);
    assert_eq!(ev, vec![KvEvent::BlockRemoved { block_hashes: h5, medium: Default::default() }]);
    assert_eq!(t.cached_page_hashes(), sorted(hashes(&a)));
}

#[test]
fn exclusive_reset_clears_all_or_removes_what_left() {
    let mut c = Cache::new(CacheOptions {
        page_size: P,
        policy: EvictionPolicy::Lru,
        pool_slots: 64,
        ..Default::default()
    })
    .unwrap();
    c.enable_events(EventOptions::default()).unwrap();
    assert!(c.enable_events(EventOptions::default()).is_err(), "once");
    let a = [1, 2, 3, 4];
    let b = [7, 7, 8, 8];
    let mut s = Vec::new();
    c.alloc(4, &mut s).unwrap();
    c.insert(0, &a, &s).unwrap();
    let mut s = Vec::new();
    c.alloc(4, &mut s).unwrap();
    c.insert(0, &b, &s).unwrap();
    c.clear(None).unwrap();
    c.flush_events();
    let d = c.drain_events();
    let all: Vec<KvEvent> = d.iter().flat_map(|(_, b)| b.events.clone()).collect();
    assert_eq!(all.last(), Some(&KvEvent::AllBlocksCleared));
    assert_eq!(replay::replay(&d), Vec::<u64>::new());

    // With a page pinned, the exclusive reset removes what it dropped instead.
    let mut s = Vec::new();
    c.alloc(4, &mut s).unwrap();
    let (_, l) = c
        .insert_and_lock(0, &a, &s, InsertOptions::default())
        .map(|(e, l)| (e, l.into_raw()))
        .unwrap();
    let mut s = Vec::new();
    c.alloc(4, &mut s).unwrap();
    c.insert(0, &b, &s).unwrap();
    c.clear(None).unwrap();
    c.flush_events();
    let d2 = c.drain_events();
    let evs: Vec<KvEvent> = d2.iter().flat_map(|(_, b)| b.events.clone()).collect();
    assert!(!evs.contains(&KvEvent::AllBlocksCleared));
    assert_eq!(
        evs.last(),
        Some(&KvEvent::BlockRemoved { block_hashes: hashes(&b), medium: Default::default() })
    );
    let mut both = d;
    both.extend(d2);
    assert_eq!(replay::replay(&both), c.tree().cached_page_hashes());
    c.release(l).unwrap();
}

#[test]
fn events_off_and_enabling_rules() {
    let mut t = RadixTree::new(TreeConfig {
        page_size: P,
        policy: EvictionPolicy::Lru,
        ..Default::default()
    })
    .unwrap();
    t.insert(0, &[1, 2], &[0, 1]).unwrap();
    assert!(t.events().is_none());
    assert!(t.cached_page_hashes().is_empty());
    assert!(
        t.enable_events(SinkOptions { block_size: P as u32, ..Default::default() }).is_err(),
        "not empty"
    );
    let mut u = RadixTree::new(TreeConfig {
        page_size: P,
        policy: EvictionPolicy::Lru,
        ..Default::default()
    })
    .unwrap();
    assert!(
        u.enable_events(SinkOptions { block_size: 3, ..Default::default() }).is_err(),
        "block size"
    );
    let c = Cache::new(CacheOptions { page_size: P, ..Default::default() }).unwrap();
    assert!(c.set_namespace_meta(1, NamespaceMeta::default()).is_err());
    assert_eq!(c.flush_events(), None);
    assert!(c.drain_events().is_empty());
}

/// The SGLang mode through the tree (the hashes are computed when the batch is taken, from
/// the parent page's 32-byte digest, not on the inserting thread): a named namespace, an
/// extension, a split by a divergence inside an edge, a removal; every store and removal
/// carries what SGLang's own hashing of the tokens gives.
#[test]
fn sglang_mode_hashes_through_the_tree_as_the_hasher_does() {
    let mut t = RadixTree::new(TreeConfig {
        page_size: P,
        policy: EvictionPolicy::Lru,
        ..Default::default()
    })
    .unwrap();
    let opts = SinkOptions {
        block_size: P as u32,
        hash_mode: HashMode::SglangSha256,
        ..Default::default()
    };
    t.enable_events(opts).unwrap();
    let meta = NamespaceMeta { lora_name: Some("lora".into()), cache_salt: Some("salt".into()) };
    t.events().unwrap().set_namespace(3, meta).unwrap();
    let h = PageHasher::new(HashMode::SglangSha256, Some("lora"), Some("salt"));
    let a = [1, 2, 3, 4, 5, 6];
    let b = [1, 2, 3, 4, 5, 6, 7, 8];
    let c = [1, 2, 9, 9];
    t.insert(3, &a, &slots(6)).unwrap();
    t.insert(3, &b, &slots(8)).unwrap();
    t.insert(3, &c, &slots(4)).unwrap(); // splits [1..6] after its first page
    let ev = events(&t);
    let (ha, hb, hc) = (h.block_hashes(&a, P), h.block_hashes(&b, P), h.block_hashes(&c, P));
    let got: Vec<(Vec<u64>, Option<u64>)> =
        ev.iter().map(stored).map(|(h, p, _)| (h.to_vec(), p)).collect();
    assert_eq!(
        got,
        vec![(ha.clone(), None), (hb[3..].to_vec(), Some(hb[2])), (hc[1..].to_vec(), Some(hc[0]))]
    );
    assert_ne!(ha, hashes(&a), "not the XXH3 chain");
    let mut want = hb.clone();
    want.push(hc[1]);
    assert_eq!(t.cached_page_hashes(), sorted(want.clone()));
    t.reset(&mut |_| {});
    let mut removed = Vec::new();
    for e in events(&t) {
        match e {
            KvEvent::BlockRemoved { block_hashes, .. } => removed.extend(block_hashes),
            e => panic!("{e:?}"),
        }
    }
    assert_eq!(sorted(removed), sorted(want));
}

/// A batch dropped at a full drain queue is still hashed, in order, when a later batch is
/// taken: a store below a page stored in a dropped batch names that page's right hash, and
/// its removal lists the right hashes.
#[test]
fn a_dropped_batch_is_still_hashed_for_the_batches_after_it() {
    let mut t = RadixTree::new(TreeConfig {
        page_size: P,
        policy: EvictionPolicy::Lru,
        ..Default::default()
    })
    .unwrap();
    let opts = SinkOptions { block_size: P as u32, max_drain_batches: 1, ..Default::default() };
    t.enable_events(opts).unwrap();
    let s = t.events().unwrap().clone();
    let a = [1, 2, 3, 4, 5, 6];
    t.insert(0, &a[..2], &slots(2)).unwrap();
    s.flush(); // kept
    t.insert(0, &a[..4], &slots(4)).unwrap();
    s.flush(); // dropped: the queue holds one batch
    assert_eq!(s.stats().dropped, 1);
    let d = s.drain();
    assert_eq!(d.len(), 1);
    t.insert(0, &a, &slots(6)).unwrap();
    let ev = events(&t);
    let full = hashes(&a);
    let (h, parent, _) = stored(&ev[0]);
    assert_eq!((h, parent), (&full[2..], Some(full[1])), "the parent's store was dropped");
    assert_eq!(t.cached_page_hashes(), sorted(full.clone()));
    t.reset(&mut |_| {});
    let removed: Vec<u64> = events(&t)
        .into_iter()
        .flat_map(|e| match e {
            KvEvent::BlockRemoved { block_hashes, .. } => block_hashes,
            e => panic!("{e:?}"),
        })
        .collect();
    assert_eq!(sorted(removed), sorted(full));
    assert_eq!(s.stats().unresolved, 0);
}
