//! The hybrid tree's tests: each component's rules on small trees, every refusal, and a
//! property test of random request cycles against a sequential model (hits while nothing
//! is evicted; no index lost or doubled ever; `check()` after every step).

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

fn tree(page_size: usize, swa_window: usize, mamba: bool) -> HybridTree {
    HybridTree::new(HybridOptions { page_size, first_id: 1, swa_window, mamba }).unwrap()
}

fn ok(t: &HybridTree) {
    assert_eq!(t.check(), None);
}

#[test]
fn full_insert_match_split_and_duplicates() {
    let mut t = tree(1, 0, false);
    let r = t.insert(0, &[1, 2, 3, 4], Some(&[10, 20, 30, 40]), 0).unwrap();
    assert_eq!((r.prefix_len, r.duplicates.len()), (0, 0));
    // A match that ends inside the node splits it: the prefix is a new node.
    let m = t.match_prefix(0, &[1, 2, 9]);
    assert_eq!((m.device_prefix_len, m.full_hit_len), (2, 2));
    assert_ne!(m.last_device_node, r.node);
    assert_eq!(t.key(m.last_device_node).unwrap(), &[1, 2]);
    assert_eq!(t.value(r.node).unwrap(), Some(&[30, 40][..]));
    assert_eq!(t.node_info(r.node).unwrap().parent, Some(m.last_device_node));
    // A second insert of the same tokens hands back the indices past prev_prefix_len.
    let r2 = t.insert(0, &[1, 2, 3, 4, 5], Some(&[10, 20, 31, 41, 51]), 2).unwrap();
    assert_eq!(r2.prefix_len, 4);
    assert_eq!(r2.duplicates, vec![31, 41]);
    assert_eq!(t.sizes(), Sizes { evictable: 5, protected: 0 });
    // Namespaces do not share.
    assert_eq!(t.match_prefix(1, &[1, 2, 3]).device_prefix_len, 0);
    assert_eq!(t.collect_indices(r2.node, t.root()).unwrap().concat(), vec![10, 20, 30, 40, 51]);
    ok(&t);
}

#[test]
fn pages_match_and_insert_whole() {
    let mut t = tree(4, 0, false);
    let r = t.insert(0, &[1, 2, 3, 4, 5, 6, 7], None, 0).unwrap();
    assert_eq!(t.key(r.node).unwrap().len(), 4, "the partial page is not inserted");
    assert_eq!(t.match_prefix(0, &[1, 2, 3, 4, 5]).device_prefix_len, 4);
    assert_eq!(t.match_prefix(0, &[1, 2, 3]).device_prefix_len, 0);
    ok(&t);
}

#[test]
fn locks_protect_and_the_walk_evicts_oldest_first() {
    let mut t = tree(1, 0, false);
    let a = t.insert(0, &[1, 2], None, 0).unwrap().node;
    let b = t.insert(0, &[3, 4, 5], None, 0).unwrap().node;
    let c = t.insert(0, &[6], None, 0).unwrap().node;
    assert_eq!(t.inc_lock_ref(b).unwrap(), 3);
    assert_eq!(t.sizes(), Sizes { evictable: 3, protected: 3 });
    let _ = t.match_prefix(0, &[1, 2]); // a is now the newest
    t.evict_start(10);
    let mut order = Vec::new();
    let mut evicted = 0;
    while let Some(n) = t.evict_next(evicted).unwrap() {
        let v = t.evict_leaf(n).unwrap();
        evicted += v.len() as u64;
        order.push(n);
        t.recycle(v);
    }
    t.evict_end();
    assert_eq!(order, vec![c, a], "oldest first; the locked leaf is never offered");
    assert_eq!(t.dec_lock_ref(b).unwrap(), 3);
    assert_eq!(t.sizes(), Sizes { evictable: 3, protected: 0 });
    assert!(matches!(t.node_info(a), Err(Error::NoNode { node }) if node == a));
    ok(&t);
}

#[test]
fn refusals_change_nothing() {
    assert!(matches!(
        HybridTree::new(HybridOptions { page_size: 0, ..Default::default() }),
        Err(Error::InvalidArgument(_))
    ));
    let mut t = tree(2, 0, false);
    let n = t.insert(0, &[1, 2, 3, 4], None, 0).unwrap().node;
    let before = t.dfs();
    // Values short of the page-aligned key.
    let e = t.insert(0, &[5, 6, 7, 8], Some(&[1, 2, 3]), 0).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("3 indices for 4")), "{e}");
    // Unknown nodes, unlocks of unlocked paths, walks never started, locked leaves.
    assert!(matches!(t.inc_lock_ref(999), Err(Error::NoNode { node: 999 })));
    assert!(matches!(t.dec_lock_ref(n), Err(Error::InvalidArgument(_))));
    assert!(matches!(t.evict_next(0), Err(Error::NoWalk { walk: "FULL" })));
    t.inc_lock_ref(n).unwrap();
    assert!(matches!(t.evict_leaf(n), Err(Error::InvalidArgument(_))));
    assert!(matches!(t.evict_leaf(t.root()), Err(Error::InvalidArgument(_))));
    t.dec_lock_ref(n).unwrap();
    // Components the tree was not made with.
    assert!(matches!(t.swa_inc_lock(n), Err(Error::InvalidArgument(m)) if m.contains("no SWA")));
    assert!(t.insert_swa(0, &[1, 2], None, 0, 0).is_err());
    assert!(
        matches!(t.mamba_inc_lock(n), Err(Error::InvalidArgument(m)) if m.contains("no Mamba"))
    );
    assert!(matches!(t.collect_indices(t.root(), n), Err(Error::InvalidArgument(_))));
    assert_eq!(t.dfs(), before);
    assert_eq!(t.sizes(), Sizes { evictable: 4, protected: 0 });
    ok(&t);
    // Releasing an ancestor of a locked node that holds no lock of its own: refused (it
    // would leave the ancestor locked less than its child).
    let leaf = t.insert(0, &[1, 2, 3, 4, 5, 6], None, 0).unwrap().node;
    t.inc_lock_ref(leaf).unwrap();
    let e = t.dec_lock_ref(n).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("no lock of its own")), "{e}");
    assert_eq!(t.node_info(n).unwrap().lock_ref, 1);
    t.dec_lock_ref(leaf).unwrap();
    ok(&t);
    // SWA spans: an edge inside a page is refused, an empty span changes nothing.
    let mut w = tree(2, 2, false);
    let r = w.insert_swa(0, &[1, 2, 3, 4], None, 0, 0).unwrap();
    run_swa_actions(&mut w, &r);
    let e = w.attach_swa_window(0, &[1, 2, 3, 4], 1, 3, &[0, 0]).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("page size")), "{e}");
    let before = w.dfs();
    w.attach_swa_window(0, &[1, 2, 3, 4], 2, 2, &[]).unwrap();
    assert_eq!(w.dfs(), before);
    ok(&w);
    // Every refusal maps to INVALID_ARGUMENT.
    assert_eq!(Error::NoNode { node: 1 }.status(), crate::error::status::INVALID_ARGUMENT);
    assert_eq!(Error::NoWalk { walk: "SWA" }.status(), crate::error::status::INVALID_ARGUMENT);
}

/// Carries out an SWA insert's actions as SGLang's cache does (SWA values = the FULL ones,
/// which is all a test needs), then the window refresh it left.
fn run_swa_actions(t: &mut HybridTree, r: &SwaInsert) -> Vec<i64> {
    let mut freed = Vec::new();
    for a in &r.actions {
        match a {
            CacheAction::FreeDeviceKv(v) | CacheAction::FreeDeviceKvFullOnly(v) => {
                freed.extend_from_slice(v)
            }
            CacheAction::SwaRebuild { node, full } => t.swa_set_value(*node, full.clone()).unwrap(),
            CacheAction::RecoverSwaWithLockedFull { node, incoming, .. } => {
                t.swa_set_value(*node, incoming.clone()).unwrap();
                freed.extend_from_slice(incoming);
            }
        }
    }
    if !r.refreshed {
        t.swa_refresh(r.node).unwrap();
    }
    freed
}

#[test]
fn swa_matches_only_where_the_window_is_covered() {
    let mut t = tree(1, 2, false);
    let key: Vec<i64> = (1..=6).collect();
    let r = t.insert_swa(0, &key, None, 0, 0).unwrap();
    // A new leaf longer than the window is split: its older part a parent, both rebuilt.
    let rebuilt: Vec<_> = r
        .actions
        .iter()
        .filter_map(|a| match a {
            CacheAction::SwaRebuild { node, full } => Some((*node, full.len())),
            _ => None,
        })
        .collect();
    assert_eq!(rebuilt.len(), 2, "{:?}", r.actions);
    assert_eq!(rebuilt[1], (r.node, 2));
    assert!(!r.refreshed);
    run_swa_actions(&mut t, &r);
    ok(&t);
    assert_eq!(t.match_prefix(0, &key).device_prefix_len, 6);
    // Tombstone the leaf's parent through the SWA walk: the leaf is offered first when
    // it is the least recent; make the parent the least recent by matching the leaf.
    let parent = t.node_info(r.node).unwrap().parent.unwrap();
    t.swa_evict_start(4).unwrap();
    let mut tomb = None;
    while let Some(step) = t.swa_evict_next(0).unwrap() {
        if let SwaStep::Tombstoned { node, full, mamba } = step {
            assert_eq!(mamba, None);
            tomb = Some((node, full));
            break;
        }
    }
    t.swa_evict_end();
    let (node, full) = tomb.expect("an internal SWA value was tombstoned");
    assert_eq!(node, parent);
    assert_eq!(full, (1..=4).collect::<Vec<_>>());
    assert_eq!(t.swa_value(parent).unwrap(), None);
    assert_eq!(t.value(parent).unwrap().map(<[i64]>::len), Some(4), "FULL KV stays");
    ok(&t);
    // The leaf's run alone (2 tokens) covers the window of 2: still a full match. A
    // match that ends on the tombstone is not valid, though its FULL KV is a hit.
    assert_eq!(t.match_prefix(0, &key).device_prefix_len, 6);
    let m = t.match_prefix(0, &key[..4]);
    assert_eq!((m.device_prefix_len, m.full_hit_len), (0, 4));
    assert_eq!(t.swa_tombstone_ranges(0, &key, 0, 6).unwrap(), vec![(0, 4)]);
    // attach_swa_window refuses a span with live SWA, then fills the tombstone.
    assert!(t.attach_swa_window(0, &key, 2, 6, &[0; 4]).is_err());
    t.attach_swa_window(0, &key, 2, 4, &[7, 8]).unwrap();
    assert_eq!(t.swa_tombstone_ranges(0, &key, 0, 6).unwrap(), vec![(0, 2)]);
    ok(&t);
    // Window locks: a stamp, and released once.
    let uuid = t.swa_inc_lock(r.node).unwrap();
    assert!(t.swa_sizes().protected >= 2);
    t.swa_dec_lock(r.node, uuid).unwrap();
    assert!(t.swa_dec_lock(r.node, uuid).is_err());
    assert!(matches!(t.swa_evict_next(0), Err(Error::NoWalk { walk: "SWA" })));
    ok(&t);
}

#[test]
fn mamba_states_live_where_sequences_end() {
    let mut t = tree(1, 0, true);
    let a = t.insert(0, &[1, 2, 3], None, 0).unwrap();
    assert!(!t.mamba_commit(a.node, true, &[100]).unwrap());
    // Without a state on the node it ends on, a match is not valid there.
    let b = t.insert(0, &[1, 2, 3, 4, 5], None, 3).unwrap();
    assert_eq!(t.match_prefix(0, &[1, 2, 3, 4, 5]).device_prefix_len, 3);
    assert!(!t.mamba_commit(b.node, true, &[101]).unwrap());
    assert_eq!(t.match_prefix(0, &[1, 2, 3, 4, 5]).device_prefix_len, 5);
    // A node that has a state keeps it: the request keeps its own.
    assert!(t.mamba_commit(b.node, false, &[102]).unwrap());
    assert_eq!(t.mamba_value(b.node).unwrap(), Some(&[101][..]));
    assert!(t.mamba_commit(t.root(), false, &[1]).is_err());
    assert!(t.mamba_commit(b.node, true, &[1]).is_err(), "not a new leaf: it has a state");
    assert_eq!(t.mamba_sizes(), Sizes { evictable: 2, protected: 0 });
    // The path cap: two states on b's path, cap 1, the shallower goes.
    assert_eq!(t.mamba_evict_excess(b.node, 1).unwrap(), vec![vec![100]]);
    assert!(t.mamba_evict_excess(b.node, 0).is_err());
    // The walk: b is a device leaf, handed to the caller whole.
    t.mamba_inc_lock(b.node).unwrap();
    t.mamba_evict_start(1).unwrap();
    assert_eq!(t.mamba_evict_next(0).unwrap(), None, "the only state is locked");
    t.mamba_evict_end();
    t.mamba_dec_lock(b.node).unwrap();
    assert!(t.mamba_dec_lock(b.node).is_err());
    t.mamba_evict_start(1).unwrap();
    assert_eq!(t.mamba_evict_next(0).unwrap(), Some(MambaStep::Leaf(b.node)));
    t.mamba_evict_end();
    assert!(matches!(t.mamba_evict_next(0), Err(Error::NoWalk { walk: "Mamba" })));
    ok(&t);
}

/// One step of the property test's workload.
#[derive(Debug, Clone)]
enum Op {
    /// A request: match, lock, insert its whole key with fresh indices past the match,
    /// unlock. `ns`, a base sequence and a length.
    Request(u32, u8, u8),
    /// Two requests for the same key, matched before either inserts.
    Pair(u32, u8, u8),
    /// Evict this many FULL tokens through the walk.
    Evict(u8),
    /// An SWA walk (on a tree with a window) for this many SWA tokens.
    SwaEvict(u8),
    /// A Mamba walk (on a tree with Mamba) for this many states.
    MambaEvict(u8),
    /// One component's whole walk through [`HybridTree::evict`] (0 FULL, 1 SWA, 2 Mamba).
    EvictAll(u8, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u32..2, 0u8..4, 1u8..24).prop_map(|(n, b, l)| Op::Request(n, b, l)),
        2 => (0u32..2, 0u8..4, 1u8..24).prop_map(|(n, b, l)| Op::Pair(n, b, l)),
        2 => (1u8..20).prop_map(Op::Evict),
        1 => (1u8..20).prop_map(Op::SwaEvict),
        1 => (1u8..8).prop_map(Op::MambaEvict),
        2 => (0u8..3, 1u8..20).prop_map(|(c, n)| Op::EvictAll(c, n)),
    ]
}

/// Four base sequences sharing prefixes, so requests fork and split nodes.
fn key_of(base: u8, len: u8) -> Vec<i64> {
    (0..len as i64).map(|i| if i < 5 { i } else { i * 7 + base as i64 * 1000 }).collect()
}

/// The model: indices handed out and not freed (every one is the tree's, exactly once),
/// the keys cached while nothing was evicted, and Mamba states likewise.
#[derive(Default)]
struct Model {
    next: i64,
    live: HashMap<i64, u32>,
    keys: Vec<(u32, Vec<i64>)>,
    evicted_any: bool,
    states: HashMap<i64, u32>,
}

impl Model {
    fn alloc(&mut self, n: usize) -> Vec<i64> {
        (0..n)
            .map(|_| {
                self.next += 1;
                self.live.insert(self.next, 0);
                self.next
            })
            .collect()
    }
    fn free(&mut self, v: &[i64]) {
        for x in v {
            assert!(self.live.remove(x).is_some(), "index {x} freed twice or never handed out");
        }
    }
    fn free_state(&mut self, v: &[i64]) {
        for x in v {
            assert!(self.states.remove(x).is_some(), "state {x} freed twice");
        }
    }
    fn expected_hit(&self, ns: u32, key: &[i64], page: usize) -> usize {
        let best = self
            .keys
            .iter()
            .filter(|(n, _)| *n == ns)
            .map(|(_, k)| k.iter().zip(key).take_while(|(a, b)| a == b).count())
            .max()
            .unwrap_or(0);
        best / page * page
    }
}

/// The tree holds exactly the model's live indices (FULL) and states (Mamba).
fn conserved(t: &HybridTree, m: &Model) {
    let mut held = Vec::new();
    let mut states = Vec::new();
    for n in t.dfs() {
        if let Some(v) = t.value(n).unwrap() {
            held.extend_from_slice(v);
        }
        if let Some(s) = t.mamba_value(n).unwrap() {
            states.extend_from_slice(s);
        }
    }
    held.sort_unstable();
    let mut live: Vec<i64> = m.live.keys().copied().collect();
    live.sort_unstable();
    assert_eq!(held, live, "FULL indices lost or doubled");
    states.sort_unstable();
    let mut want: Vec<i64> = m.states.keys().copied().collect();
    want.sort_unstable();
    assert_eq!(states, want, "Mamba states lost or doubled");
}

/// Evicts a whole leaf for a walk: its FULL indices, and its Mamba state, go back.
fn evict_whole(t: &mut HybridTree, m: &mut Model, node: NodeId) -> usize {
    if let Some(s) = t.mamba_value(node).unwrap() {
        let s = s.to_vec();
        m.free_state(&s);
    }
    let v = t.evict_leaf(node).unwrap();
    m.free(&v);
    m.evicted_any = true;
    let n = v.len();
    t.recycle(v);
    n
}

/// A request's match and lock: (anchor, its values, its matched length).
fn begin(t: &mut HybridTree, m: &mut Model, ns: u32, key: &[i64]) -> (NodeId, Vec<i64>, usize) {
    let page = t.page_size();
    let hit = t.match_prefix(ns, key);
    if !m.evicted_any && t.swa_window() == 0 && !t.has_mamba() {
        assert_eq!(hit.device_prefix_len, m.expected_hit(ns, key, page), "{key:?}");
    }
    assert!(hit.full_hit_len >= hit.device_prefix_len);
    let anchor = hit.last_device_node;
    t.inc_lock_ref(anchor).unwrap();
    let mut values = t.collect_indices(anchor, t.root()).unwrap().concat();
    assert_eq!(values.len(), hit.device_prefix_len);
    let aligned = key.len() / page * page;
    values.extend(m.alloc(aligned - hit.device_prefix_len));
    (anchor, values, hit.device_prefix_len)
}

/// A request's insert (its cache actions carried out), Mamba commit and unlock.
fn finish(
    t: &mut HybridTree,
    m: &mut Model,
    ns: u32,
    key: &[i64],
    (anchor, values, prev): (NodeId, Vec<i64>, usize),
) {
    let page = t.page_size();
    let aligned = key.len() / page * page;
    let (node, prefix_len) = if t.swa_window() > 0 {
        let r = t.insert_swa(ns, key, Some(&values), prev, 0).unwrap();
        let freed = run_swa_actions(t, &r);
        m.free(&freed);
        (r.node, r.prefix_len)
    } else {
        let r = t.insert(ns, key, Some(&values), prev).unwrap();
        m.free(&r.duplicates);
        (r.node, r.prefix_len)
    };
    if t.has_mamba() && node != t.root() {
        let state = vec![1_000_000 + m.next];
        m.next += 1;
        if !t.mamba_commit(node, prefix_len < aligned, &state).unwrap() {
            m.states.insert(state[0], 0);
        }
    }
    t.dec_lock_ref(anchor).unwrap();
    if t.swa_window() == 0 && !t.has_mamba() {
        m.keys.push((ns, key[..aligned].to_vec()));
    }
}

fn run(page: usize, window: usize, mamba: bool, ops: &[Op]) {
    let mut t = tree(page, window, mamba);
    let mut m = Model::default();
    for op in ops {
        match *op {
            Op::Request(ns, base, len) => {
                let key = key_of(base, len);
                let r = begin(&mut t, &mut m, ns, &key);
                finish(&mut t, &mut m, ns, &key, r);
            }
            Op::Pair(ns, base, len) => {
                // Two requests for the same tokens, both matched before either inserts:
                // the second's indices past its match are duplicates the tree hands back.
                let key = key_of(base, len);
                let a = begin(&mut t, &mut m, ns, &key);
                let b = begin(&mut t, &mut m, ns, &key);
                finish(&mut t, &mut m, ns, &key, a);
                finish(&mut t, &mut m, ns, &key, b);
            }
            Op::Evict(n) => {
                t.evict_start(n as u64);
                let mut done = 0u64;
                while let Some(v) = t.evict_next(done).unwrap() {
                    done += evict_whole(&mut t, &mut m, v) as u64;
                }
                t.evict_end();
            }
            Op::SwaEvict(n) if window > 0 => {
                t.swa_evict_start(n as u64).unwrap();
                let mut done = 0u64;
                while let Some(step) = t.swa_evict_next(done).unwrap() {
                    match step {
                        SwaStep::Leaf(v) => done += evict_whole(&mut t, &mut m, v) as u64,
                        SwaStep::Tombstoned { full, mamba, .. } => {
                            done += full.len() as u64;
                            if let Some(s) = mamba {
                                m.free_state(&s);
                            }
                        }
                    }
                }
                t.swa_evict_end();
            }
            Op::MambaEvict(n) if mamba => {
                t.mamba_evict_start(n as u64).unwrap();
                let mut done = 0u64;
                while let Some(step) = t.mamba_evict_next(done).unwrap() {
                    match step {
                        MambaStep::Leaf(v) => {
                            evict_whole(&mut t, &mut m, v);
                        }
                        MambaStep::Tombstoned { state, .. } => m.free_state(&state),
                    }
                    done += 1;
                }
                t.mamba_evict_end();
            }
            Op::EvictAll(c, n) => {
                let c = [Component::Full, Component::Swa, Component::Mamba][c as usize];
                let mut freed = Vec::new();
                let r = t.evict(c, n as u64, &mut freed);
                if !t.has(c) {
                    assert!(matches!(r, Err(Error::InvalidArgument(_))));
                    assert!(freed.is_empty());
                } else {
                    let evicted = r.unwrap();
                    let mut of_c = 0u64;
                    for f in &freed {
                        match f.component {
                            Component::Full => m.free(&f.indices),
                            Component::Mamba => m.free_state(&f.indices),
                            Component::Swa => {}
                        }
                        if f.component == c {
                            of_c += f.indices.len() as u64;
                        }
                    }
                    assert_eq!(evicted, of_c, "the count is of the walk's component");
                    m.evicted_any |= evicted > 0 || !freed.is_empty();
                }
            }
            _ => {}
        }
        if let Some(why) = t.check() {
            panic!("after {op:?}: {why}");
        }
        conserved(&t, &m);
    }
    assert_eq!(t.sizes().protected, 0, "every lock was released");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn full_cycles_keep_every_index(page in 1usize..4, ops in prop::collection::vec(op(), 1..60)) {
        run(page, 0, false, &ops);
    }

    #[test]
    fn swa_cycles_keep_every_index(window in 1usize..6, ops in prop::collection::vec(op(), 1..60)) {
        run(1, window, false, &ops);
    }

    #[test]
    fn mamba_cycles_keep_every_index(page in 1usize..3, ops in prop::collection::vec(op(), 1..60)) {
        run(page, 0, true, &ops);
    }

    #[test]
    fn swa_mamba_cycles_keep_every_index(window in 1usize..6, ops in prop::collection::vec(op(), 1..60)) {
        run(1, window, true, &ops);
    }
}

/// Any call, with any arguments (node ids live, gone or never made, spans past the key,
/// values of any length, walks in any order): a result or a refusal, never a panic, and
/// the tree consistent after each. A panic would poison every front's mutex for good.
#[derive(Debug, Clone)]
enum Any {
    Insert(u8, u8, u8, usize),
    InsertSwa(u8, u8, u8, usize, usize),
    Match(u8, u8),
    Lock(u8),
    Unlock(u8),
    SwaLock(u8),
    SwaUnlock(u8, u64),
    SwaRelease(u8, u64),
    SwaSet(u8, u8),
    SwaRefresh(u8),
    Ranges(u8, usize, usize),
    Attach(u8, usize, usize, u8),
    MambaCommit(u8, bool, u8),
    MambaSet(u8, u8),
    MambaLock(u8),
    MambaUnlock(u8),
    Excess(u8, usize),
    Step(u8, u64),
    EvictLeaf(u8),
    Evict(u8, u64),
    Collect(u8, u8),
}

fn any_op() -> impl Strategy<Value = Any> {
    let n = || 0u8..40;
    prop_oneof![
        (0u8..4, 0u8..24, 0u8..30, 0usize..30).prop_map(|(b, l, v, p)| Any::Insert(b, l, v, p)),
        (0u8..4, 0u8..24, 0u8..30, 0usize..30, 0usize..12)
            .prop_map(|(b, l, v, p, s)| Any::InsertSwa(b, l, v, p, s)),
        (0u8..4, 0u8..24).prop_map(|(b, l)| Any::Match(b, l)),
        n().prop_map(Any::Lock),
        n().prop_map(Any::Unlock),
        n().prop_map(Any::SwaLock),
        (n(), 0u64..6).prop_map(|(a, u)| Any::SwaUnlock(a, u)),
        (n(), 0u64..6).prop_map(|(a, u)| Any::SwaRelease(a, u)),
        (n(), 0u8..12).prop_map(|(a, l)| Any::SwaSet(a, l)),
        n().prop_map(Any::SwaRefresh),
        (0u8..4, 0usize..40, 0usize..40).prop_map(|(b, s, e)| Any::Ranges(b, s, e)),
        (0u8..4, 0usize..40, 0usize..40, 0u8..12).prop_map(|(b, s, e, l)| Any::Attach(b, s, e, l)),
        (n(), any::<bool>(), 0u8..3).prop_map(|(a, f, l)| Any::MambaCommit(a, f, l)),
        (n(), 0u8..3).prop_map(|(a, l)| Any::MambaSet(a, l)),
        n().prop_map(Any::MambaLock),
        n().prop_map(Any::MambaUnlock),
        (n(), 0usize..4).prop_map(|(a, c)| Any::Excess(a, c)),
        (0u8..8, 0u64..30).prop_map(|(w, e)| Any::Step(w, e)),
        n().prop_map(Any::EvictLeaf),
        (0u8..3, 0u64..30).prop_map(|(c, k)| Any::Evict(c, k)),
        (n(), n()).prop_map(|(a, b)| Any::Collect(a, b)),
    ]
}

fn call(t: &mut HybridTree, op: &Any) {
    // A node id: one of the tree's (by position in its DFS) or, past them, one it never had.
    let id = |t: &HybridTree, k: u8| {
        let all = t.dfs();
        all.get(k as usize).copied().unwrap_or(1000 + k as u64)
    };
    let vals = |l: u8| (0..l as i64).map(|i| 7000 + i).collect::<Vec<_>>();
    match *op {
        Any::Insert(b, l, v, p) => {
            let _ = t.insert(0, &key_of(b, l), Some(&vals(v)), p);
        }
        Any::InsertSwa(b, l, v, p, s) => {
            let _ = t.insert_swa(0, &key_of(b, l), Some(&vals(v)), p, s);
        }
        Any::Match(b, l) => {
            let _ = t.match_prefix(0, &key_of(b, l));
            let _ = t.match_full_device_prefix(0, &key_of(b, l));
        }
        Any::Lock(a) => {
            let n = id(t, a);
            let _ = t.inc_lock_ref(n);
        }
        Any::Unlock(a) => {
            let n = id(t, a);
            let _ = t.dec_lock_ref(n);
        }
        Any::SwaLock(a) => {
            let n = id(t, a);
            let _ = t.swa_inc_lock(n);
        }
        Any::SwaUnlock(a, u) => {
            let n = id(t, a);
            let _ = t.swa_dec_lock(n, u);
        }
        Any::SwaRelease(a, u) => {
            let n = id(t, a);
            let _ = t.swa_release_window(n, u);
        }
        Any::SwaSet(a, l) => {
            let n = id(t, a);
            let _ = t.swa_set_value(n, vals(l));
        }
        Any::SwaRefresh(a) => {
            let n = id(t, a);
            let _ = t.swa_refresh(n);
        }
        Any::Ranges(b, s, e) => {
            let _ = t.swa_tombstone_ranges(0, &key_of(b, 24), s, e);
        }
        Any::Attach(b, s, e, l) => {
            let _ = t.attach_swa_window(0, &key_of(b, 24), s, e, &vals(l));
        }
        Any::MambaCommit(a, f, l) => {
            let n = id(t, a);
            let _ = t.mamba_commit(n, f, &vals(l));
        }
        Any::MambaSet(a, l) => {
            let n = id(t, a);
            let _ = t.mamba_set_value(n, vals(l));
        }
        Any::MambaLock(a) => {
            let n = id(t, a);
            let _ = t.mamba_inc_lock(n);
        }
        Any::MambaUnlock(a) => {
            let n = id(t, a);
            let _ = t.mamba_dec_lock(n);
        }
        Any::Excess(a, c) => {
            let n = id(t, a);
            let _ = t.mamba_evict_excess(n, c);
        }
        Any::Step(w, e) => match w {
            0 => t.evict_start(e),
            1 => {
                let _ = t.evict_next(e);
            }
            2 => t.evict_end(),
            3 => {
                let _ = t.swa_evict_start(e);
            }
            4 => {
                let _ = t.swa_evict_next(e);
            }
            5 => {
                let _ = t.mamba_evict_start(e);
            }
            6 => {
                let _ = t.mamba_evict_next(e);
            }
            _ => {
                t.swa_evict_end();
                t.mamba_evict_end();
            }
        },
        Any::EvictLeaf(a) => {
            let n = id(t, a);
            let _ = t.evict_leaf(n);
        }
        Any::Evict(c, k) => {
            let c = [Component::Full, Component::Swa, Component::Mamba][c as usize];
            let _ = t.evict(c, k, &mut Vec::new());
        }
        Any::Collect(a, b) => {
            let (x, y) = (id(t, a), id(t, b));
            let _ = t.collect_indices(x, y);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_call_is_a_result_or_a_refusal_never_a_panic(
        page in 1usize..3,
        window in 0usize..5,
        mamba in any::<bool>(),
        ops in prop::collection::vec(any_op(), 1..80),
    ) {
        let mut t = tree(page, window, mamba);
        for op in &ops {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call(&mut t, op)));
            prop_assert!(r.is_ok(), "{:?} panicked", op);
            if let Some(why) = t.check() {
                prop_assert!(false, "after {:?}: {}", op, why);
            }
        }
    }
}
