//! Property test: random operation sequences against a simple sequential model (a map from
//! pages to slots with pin counts), comparing every result and every count, per namespace
//! too (a namespace lives while it has a page: `stats().namespaces`, `namespace_stats`).

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use radixkv::{EvictionPolicy, PrefixLock, RadixTree, SlotRun, TreeConfig};

#[derive(Debug, Clone)]
enum Op {
    Match(u64, Vec<u32>),
    MatchLock(u64, Vec<u32>),
    Insert(u64, Vec<u32>),
    InsertLock(u64, Vec<u32>),
    Release(usize),
    Evict(usize),
    Reset,
    DropNamespace(u64),
}

fn tokens() -> impl Strategy<Value = Vec<u32>> {
    // A tiny alphabet and short keys: lots of shared prefixes, forks and splits.
    prop::collection::vec(0u32..3, 0..10)
}

fn op() -> impl Strategy<Value = Op> {
    let ns = 0u64..3;
    prop_oneof![
        3 => (ns.clone(), tokens()).prop_map(|(n, t)| Op::Match(n, t)),
        2 => (ns.clone(), tokens()).prop_map(|(n, t)| Op::MatchLock(n, t)),
        4 => (ns.clone(), tokens()).prop_map(|(n, t)| Op::Insert(n, t)),
        1 => (ns, tokens()).prop_map(|(n, t)| Op::InsertLock(n, t)),
        2 => (0usize..8).prop_map(Op::Release),
        2 => (0usize..12).prop_map(Op::Evict),
        1 => Just(Op::Reset),
        1 => (0u64..4).prop_map(Op::DropNamespace),
    ]
}

/// The sequential model: cached pages `(ns, t[..(j+1)*P])` -> (slots of the page, pins).
struct Model {
    p: usize,
    pages: HashMap<(u64, Vec<u32>), (Vec<u32>, u32)>,
}

impl Model {
    fn matched(&self, ns: u64, t: &[u32]) -> (usize, Vec<u32>) {
        let mut slots = Vec::new();
        let mut m = 0;
        while m + self.p <= t.len() {
            match self.pages.get(&(ns, t[..m + self.p].to_vec())) {
                Some((s, _)) => slots.extend_from_slice(s),
                None => break,
            }
            m += self.p;
        }
        (m, slots)
    }

    fn pin(&mut self, ns: u64, t: &[u32], delta: i32) {
        let mut m = self.p;
        while m <= t.len() {
            let e = self.pages.get_mut(&(ns, t[..m].to_vec())).expect("pinned page cached");
            e.1 = (e.1 as i32 + delta) as u32;
            m += self.p;
        }
    }

    fn counts(&self) -> (u64, u64) {
        let cached = (self.pages.len() * self.p) as u64;
        let pinned = self.pages.values().filter(|(_, pins)| *pins > 0).count() * self.p;
        (cached, pinned as u64)
    }
}

/// The slots named by `runs`, after checking that the runs are maximal: no empty run, none
/// continuing the one before it.
fn expand(runs: &[SlotRun]) -> Result<Vec<u32>, TestCaseError> {
    for w in runs.windows(2) {
        prop_assert!(w[0].start.checked_add(w[0].len) != Some(w[1].start), "not joined: {:?}", w);
    }
    prop_assert!(runs.iter().all(|r| r.len > 0));
    Ok(runs.iter().flat_map(|r| r.slots()).collect())
}

fn run(p: usize, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let tree = RadixTree::new(TreeConfig {
        page_size: p,
        policy: EvictionPolicy::Lru,
        ..Default::default()
    })
    .unwrap();
    let mut model = Model { p, pages: HashMap::new() };
    let mut locks: Vec<(PrefixLock, u64, Vec<u32>)> = Vec::new();
    let mut next_slot = 0u32;
    let mut out = Vec::new();
    let mut runs = Vec::new();
    for op in ops {
        match op {
            Op::Match(ns, t) => {
                let m = tree.match_prefix(ns, &t, &mut out);
                let (mm, ms) = model.matched(ns, &t);
                prop_assert_eq!(m, mm);
                prop_assert_eq!(&out, &ms);
                // The same match as runs: they expand to the same slots, joined maximally.
                prop_assert_eq!(tree.match_prefix_runs(ns, &t, &mut runs), mm);
                prop_assert_eq!(&expand(&runs)?, &ms);
            }
            Op::MatchLock(ns, t) => {
                // Odd query lengths lock through the runs variant.
                let l = if t.len() % 2 == 1 {
                    let l = tree.match_and_lock_runs_raw(ns, &t, &mut runs);
                    out = expand(&runs)?;
                    l
                } else {
                    tree.match_and_lock_raw(ns, &t, &mut out)
                };
                let (mm, ms) = model.matched(ns, &t);
                prop_assert_eq!(l.len(), mm);
                prop_assert_eq!(&out, &ms);
                model.pin(ns, &t[..mm], 1);
                locks.push((l, ns, t[..mm].to_vec()));
            }
            Op::Insert(ns, t) => {
                insert(&tree, &mut model, &mut locks, &mut next_slot, ns, t, false)?
            }
            Op::InsertLock(ns, t) => {
                insert(&tree, &mut model, &mut locks, &mut next_slot, ns, t, true)?
            }
            Op::Release(i) => {
                if !locks.is_empty() {
                    let (l, ns, t) = locks.swap_remove(i % locks.len());
                    tree.release(l).unwrap();
                    model.pin(ns, &t, -1);
                }
            }
            Op::Evict(k) => {
                let mut freed = Vec::new();
                // Odd k: the slots come as runs.
                let n = if k % 2 == 1 {
                    tree.evict_runs(k, &mut |runs| {
                        freed.extend(runs.iter().flat_map(|r| r.slots()))
                    })
                } else {
                    tree.evict(k, &mut |s| freed.extend_from_slice(s))
                };
                prop_assert_eq!(n, freed.len());
                evict_model(&mut model, k, &freed)?;
            }
            Op::Reset => {
                let mut freed = Vec::new();
                tree.reset(&mut |s| freed.extend_from_slice(s));
                evict_model(&mut model, usize::MAX, &freed)?;
                prop_assert!(model.pages.values().all(|(_, pins)| *pins > 0));
            }
            Op::DropNamespace(ns) => {
                // Every unpinned page of `ns` goes (pins are path pins: an unpinned page has
                // no pinned extension), nothing of another namespace.
                let mut freed = Vec::new();
                let n = if ns % 2 == 1 {
                    tree.drop_namespace_runs(ns, &mut |runs| {
                        freed.extend(runs.iter().flat_map(|r| r.slots()))
                    })
                } else {
                    tree.drop_namespace(ns, &mut |s| freed.extend_from_slice(s))
                };
                prop_assert_eq!(n, freed.len());
                let mut want: Vec<u32> = Vec::new();
                model.pages.retain(|(pns, _), (slots, pins)| {
                    let gone = *pns == ns && *pins == 0;
                    if gone {
                        want.extend_from_slice(slots);
                    }
                    !gone
                });
                freed.sort_unstable();
                want.sort_unstable();
                prop_assert_eq!(freed, want);
            }
        }
        let (cached, pinned) = model.counts();
        let st = tree.stats();
        prop_assert_eq!(st.cached_tokens, cached);
        prop_assert_eq!(st.protected_tokens, pinned);
        prop_assert_eq!(st.evictable_tokens, cached - pinned);
        let live: HashSet<u64> = model.pages.keys().map(|(ns, _)| *ns).collect();
        prop_assert_eq!(st.namespaces, live.len() as u64);
        for ns in 0..4u64 {
            let nst = tree.namespace_stats(ns);
            let mine = || model.pages.iter().filter(|((pns, _), _)| *pns == ns);
            let c = (mine().count() * p) as u64;
            let pin = (mine().filter(|(_, (_, pins))| *pins > 0).count() * p) as u64;
            prop_assert_eq!(
                (nst.cached_tokens, nst.protected_tokens, nst.evictable_tokens),
                (c, pin, c - pin),
                "namespace {}",
                ns
            );
            prop_assert_eq!(nst.nodes == 0, c == 0);
        }
        tree.check_invariants().map_err(TestCaseError::fail)?;
    }
    for (l, _, _) in locks {
        tree.release(l).unwrap();
    }
    prop_assert_eq!(tree.stats().protected_tokens, 0);
    Ok(())
}

fn insert(
    tree: &RadixTree,
    model: &mut Model,
    locks: &mut Vec<(PrefixLock, u64, Vec<u32>)>,
    next_slot: &mut u32,
    ns: u64,
    t: Vec<u32>,
    lock: bool,
) -> Result<(), TestCaseError> {
    let p = model.p;
    // Fresh slots in one of four layouts, so every slot encoding of a node (one run,
    // several runs, one base per page, one slot per token) is built, split and read back.
    let base = *next_slot;
    let pages = t.len().div_ceil(p);
    let len = t.len() as u32;
    let slots: Vec<u32> = match (base as usize + t.len()) % 4 {
        // One consecutive run.
        0 => (base..base + len).collect(),
        // Nothing consecutive.
        1 => (base..base + len).rev().collect(),
        // Two runs: the upper half first (a run per tokens' half).
        2 => (base + len / 2..base + len).chain(base..base + len / 2).collect(),
        // Pages of consecutive slots, in reverse page order.
        _ => (0..t.len()).map(|i| base + ((pages - 1 - i / p) * p + i % p) as u32).collect(),
    };
    *next_slot += t.len().div_ceil(p) as u32 * p as u32;
    let n = t.len() / p * p;
    let (want, _) = model.matched(ns, &t[..n]);
    // Half the inserts pass the slots as runs: maximal ones, or cut into pieces of at most
    // 3 (runs need not be maximal).
    let by_runs = (base as usize / 4 + t.len()) % 2 == 1;
    let mut runs = Vec::new();
    SlotRun::push_runs_of(&slots, &mut runs);
    if base.is_multiple_of(3) {
        runs = runs
            .iter()
            .flat_map(|r| {
                (0..r.len)
                    .step_by(3)
                    .map(|o| SlotRun { start: r.start + o, len: (r.len - o).min(3) })
            })
            .collect();
    }
    let e = if lock {
        let (e, l) = if by_runs {
            tree.insert_and_lock_runs_raw(ns, &t, &runs).unwrap()
        } else {
            tree.insert_and_lock_raw(ns, &t, &slots).unwrap()
        };
        prop_assert_eq!(l.len(), n);
        locks.push((l, ns, t[..n].to_vec()));
        e
    } else if by_runs {
        tree.insert_runs(ns, &t, &runs).unwrap()
    } else {
        tree.insert(ns, &t, &slots).unwrap()
    };
    prop_assert_eq!(e, want);
    let mut m = e;
    while m < n {
        model.pages.insert((ns, t[..m + p].to_vec()), (slots[m..m + p].to_vec(), 0));
        m += p;
    }
    if lock {
        model.pin(ns, &t[..n], 1);
    }
    Ok(())
}

/// Checks a set of evicted slots against the model, then applies it: each slot belonged
/// to a cached, unpinned page; whole pages went; the model stays prefix-closed; at least
/// `k` tokens went, or everything evictable.
fn evict_model(model: &mut Model, k: usize, freed: &[u32]) -> Result<(), TestCaseError> {
    let evictable_before = model.counts().0 - model.counts().1;
    let set: HashSet<u32> = freed.iter().copied().collect();
    prop_assert_eq!(set.len(), freed.len(), "a slot freed twice");
    let gone: Vec<(u64, Vec<u32>)> = model
        .pages
        .iter()
        .filter(|(_, (s, _))| s.iter().any(|x| set.contains(x)))
        .map(|(key, _)| key.clone())
        .collect();
    for key in &gone {
        let (s, pins) = &model.pages[key];
        prop_assert_eq!(*pins, 0, "evicted a pinned page");
        prop_assert!(s.iter().all(|x| set.contains(x)), "evicted part of a page");
    }
    prop_assert_eq!(gone.len() * model.p, freed.len());
    for key in &gone {
        model.pages.remove(key);
    }
    for (ns, t) in model.pages.keys() {
        if t.len() > model.p {
            prop_assert!(
                model.pages.contains_key(&(*ns, t[..t.len() - model.p].to_vec())),
                "eviction left a hole (removed a non-leaf)"
            );
        }
    }
    prop_assert!(freed.len() >= k.min(evictable_before as usize));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn page_1_matches_the_model(ops in prop::collection::vec(op(), 1..60)) {
        run(1, ops)?;
    }

    #[test]
    fn page_2_matches_the_model(ops in prop::collection::vec(op(), 1..60)) {
        run(2, ops)?;
    }
}

/// Eviction order against a sequential model of the policy: keys with distinct first tokens
/// (each its own leaf edge: no splits, no shared parents), random inserts, matches (whole
/// or partial, plain or locking-and-released) and `evict(1)` calls. Each eviction must take
/// exactly the key the model names: the least recently accessed (LRU: an insert or a match
/// that reaches the key is an access) or the first inserted (FIFO).
fn run_order(policy: EvictionPolicy, ops: Vec<(u8, u32, usize)>) -> Result<(), TestCaseError> {
    let tree = RadixTree::new(TreeConfig { page_size: 1, policy, ..Default::default() }).unwrap();
    let key = |i: u32| -> Vec<u32> { (0..4).map(|j| 10 * i + j).collect() };
    // Cached keys -> (last access, creation), both in operation order.
    let mut model: HashMap<u32, (usize, usize)> = HashMap::new();
    let mut out = Vec::new();
    for (step, (kind, i, len)) in ops.into_iter().enumerate() {
        match kind {
            0 => {
                let slots: Vec<u32> = key(i).iter().map(|t| t + 1000).collect();
                let existing = tree.insert(0, &key(i), &slots).unwrap();
                let e = model.entry(i).or_insert((step, step));
                prop_assert_eq!(existing, if e.1 == step { 0 } else { 4 });
                e.0 = step;
            }
            1 | 2 => {
                // Partial matches stop inside the edge; a locking one would split it, so
                // locking matches take the whole key.
                let q = if kind == 1 { &key(i)[..len] } else { &key(i)[..] };
                let m = if kind == 1 {
                    tree.match_prefix(0, q, &mut out)
                } else {
                    let g = tree.match_and_lock(0, q, &mut out);
                    g.len()
                };
                match model.get_mut(&i) {
                    Some(e) => {
                        prop_assert_eq!(m, q.len());
                        e.0 = step;
                    }
                    None => prop_assert_eq!(m, 0),
                }
            }
            _ => {
                let mut freed = Vec::new();
                tree.evict(1, &mut |s| freed.extend_from_slice(s));
                let by = |e: &(usize, usize)| match policy {
                    EvictionPolicy::Fifo => e.1,
                    _ => e.0,
                };
                let want = model.iter().min_by_key(|(_, e)| by(e)).map(|(&i, _)| i);
                match want {
                    None => prop_assert!(freed.is_empty()),
                    Some(w) => {
                        let slots: Vec<u32> = key(w).iter().map(|t| t + 1000).collect();
                        prop_assert_eq!(&freed, &slots, "step {}: evicted the wrong key", step);
                        model.remove(&w);
                    }
                }
            }
        }
    }
    prop_assert_eq!(tree.stats().cached_tokens as usize, 4 * model.len());
    tree.check_invariants().map_err(TestCaseError::fail)?;
    Ok(())
}

fn order_op() -> impl Strategy<Value = (u8, u32, usize)> {
    (0u8..5, 1u32..6, 1usize..5)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn lru_order_matches_the_sequential_model(ops in prop::collection::vec(order_op(), 1..80)) {
        run_order(EvictionPolicy::Lru, ops)?;
    }

    #[test]
    fn fifo_order_matches_the_sequential_model(ops in prop::collection::vec(order_op(), 1..80)) {
        run_order(EvictionPolicy::Fifo, ops)?;
    }
}
