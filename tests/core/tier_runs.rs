//! A tiered cache's inserts of slot runs (the pages read off the runs, no slot list): the
//! same answers as the list inserts, runs cut inside a page, pages that are not one pool
//! page refused, and a backed-up run of pages partly evicted from the device, forked
//! inside by a later insert, partly loaded back, or lost to a failed copy; the tier's
//! invariants (`check_tier`) after each step.

use std::sync::Arc;

use radixkv::kv::{HostKvStorage, KvLayout, KvStorage};
use radixkv::tier::{
    DeferredCopier, FailPlan, HostCopier, LoadOutcome, NullCopier, TierCopier, TierOptions,
    WritePolicy,
};
use radixkv::{Cache, CacheOptions, Error, PrefixLock, PrefixMatch, SlotRun};

const P: usize = 4;

fn bytes(t: u32) -> ([u8; 4], [u8; 4]) {
    let x = t.wrapping_mul(2654435761);
    (x.to_le_bytes(), (x ^ 0x5555_5555).to_le_bytes())
}

fn tiered(
    dev_slots: usize,
    host_slots: usize,
    policy: WritePolicy,
    copier: Arc<dyn TierCopier>,
) -> Cache {
    Cache::with_host(
        CacheOptions { page_size: P, pool_slots: dev_slots, ..Default::default() },
        TierOptions { host_slots, write_policy: policy, ..Default::default() },
        copier,
    )
    .unwrap()
}

/// A cache copying between two host stores (so bytes can be checked), and its device store.
fn with_bytes(dev_slots: usize, host_slots: usize) -> (Cache, Arc<HostKvStorage>) {
    let dev = Arc::new(HostKvStorage::new(KvLayout::new(1, dev_slots, 1, 1, 4)).unwrap());
    let host = Arc::new(HostKvStorage::new(KvLayout::new(1, host_slots, 1, 1, 4)).unwrap());
    let copier = Arc::new(HostCopier::new(dev.clone(), host));
    (tiered(dev_slots, host_slots, WritePolicy::WriteThrough, copier), dev)
}

/// Allocates runs for `tokens`, writes their bytes, and inserts them as runs, each run cut
/// in two inside its first page (the cut slots go on: still whole pool pages).
fn put_runs(c: &Cache, dev: &HostKvStorage, tokens: &[u32]) {
    let mut runs: Vec<SlotRun> = Vec::new();
    c.alloc_runs(tokens.len(), &mut runs).unwrap();
    let slots: Vec<u32> = runs.iter().flat_map(|r| r.slots()).collect();
    for (&s, &t) in slots.iter().zip(tokens) {
        let (k, v) = bytes(t);
        dev.write_slot(0, s, &k, &v).unwrap();
    }
    let cut: Vec<SlotRun> = runs
        .iter()
        .flat_map(|r| match r.len {
            0 | 1 => vec![*r],
            _ => vec![
                SlotRun { start: r.start, len: 1 },
                SlotRun { start: r.start + 1, len: r.len - 1 },
            ],
        })
        .collect();
    c.insert(0, tokens, &cut).unwrap();
}

/// Inserts `tokens` whose first `shared` tokens are cached: locks them, allocates runs for
/// the rest (writing their bytes), and inserts by runs.
fn put_runs_after(c: &Cache, dev: &HostKvStorage, tokens: &[u32], shared: usize) {
    let mut runs: Vec<SlotRun> = Vec::new();
    let g = c.match_and_lock(0, tokens, &mut runs);
    assert_eq!(g.len(), shared);
    let mut rest: Vec<SlotRun> = Vec::new();
    c.alloc_runs(tokens.len() - shared, &mut rest).unwrap();
    let slots: Vec<u32> = rest.iter().flat_map(|r| r.slots()).collect();
    for (&s, &t) in slots.iter().zip(&tokens[shared..]) {
        let (k, v) = bytes(t);
        dev.write_slot(0, s, &k, &v).unwrap();
    }
    runs.extend(rest);
    assert_eq!(c.insert(0, tokens, &runs).unwrap(), shared);
    drop(g);
}

fn look(c: &Cache, tokens: &[u32]) -> PrefixMatch {
    let mut out: Vec<u32> = Vec::new();
    c.lookup(0, tokens, &mut out)
}

fn check_bytes(dev: &HostKvStorage, slots: &[u32], tokens: &[u32]) {
    for (&s, &t) in slots.iter().zip(tokens) {
        let (mut k, mut v) = ([0u8; 4], [0u8; 4]);
        dev.read_slot(0, s, &mut k, &mut v).unwrap();
        assert_eq!((k, v), bytes(t), "token {t} in slot {s}");
    }
}

/// One request's cycle as the replay runs it (lookup and lock, load back what the host
/// extends, allocate the rest, insert the prompt), inserting by runs or by a slot list.
/// Returns the device length, host length and the insert's existing length.
fn cycle(c: &Cache, q: &[u32], by_runs: bool) -> (usize, usize, usize) {
    let mut runs: Vec<SlotRun> = Vec::new();
    let (g, m) = c.lookup_and_lock(0, q, &mut runs);
    let mut locks: Vec<PrefixLock> = vec![g.into_raw()];
    let mut have = m.device_len;
    if m.host_len > 0 {
        match c.load_back(0, q, usize::MAX) {
            Ok(t) => {
                let l = c.wait_load(t).unwrap();
                have = l.lock.len();
                runs.clear();
                SlotRun::push_runs_of(&l.slots, &mut runs);
                locks.push(l.lock);
            }
            Err(Error::OutOfSlots { .. }) => {}
            Err(e) => panic!("load_back: {e}"),
        }
    }
    let need = q.len() - have;
    let free = c.stats().free_slots as usize;
    if free < need {
        c.evict(need - free, None).unwrap();
    }
    let mut existing = usize::MAX;
    if c.alloc_runs(need, &mut runs).is_ok() {
        existing = if by_runs {
            c.insert(0, q, &runs).unwrap()
        } else {
            let list: Vec<u32> = runs.iter().flat_map(|r| r.slots()).collect();
            c.insert(0, q, &list).unwrap()
        };
    }
    for l in locks {
        c.release(l).unwrap();
    }
    c.reclaim();
    (m.device_len, m.host_len, existing)
}

/// Random prompts sharing prefixes and forking, on a small device and host (evictions
/// both ways): inserting by runs and by slot lists gives the same matches, host runs,
/// existing lengths and tier counts, under every write policy.
#[test]
fn runs_and_lists_give_the_same_tier() {
    for policy in
        [WritePolicy::WriteThrough, WritePolicy::WriteThroughSelective, WritePolicy::WriteBack]
    {
        let a = tiered(64, 96, policy, Arc::new(NullCopier::default()));
        let b = tiered(64, 96, policy, Arc::new(NullCopier::default()));
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut prompts: Vec<Vec<u32>> = vec![Vec::new()];
        for step in 0..400 {
            let base = prompts[rnd(prompts.len() as u64) as usize].clone();
            let keep = rnd(base.len() as u64 / P as u64 + 1) as usize * P;
            let mut q = base[..keep].to_vec();
            let extra = rnd(6) as usize * P;
            q.extend((0..extra).map(|_| rnd(3) as u32));
            q.truncate(40);
            if prompts.len() < 24 {
                prompts.push(q.clone());
            }
            let ra = cycle(&a, &q, true);
            let rb = cycle(&b, &q, false);
            assert_eq!(ra, rb, "{policy:?} step {step}");
            a.wait_all();
            b.wait_all();
            a.check_tier().unwrap().unwrap();
            b.check_tier().unwrap().unwrap();
        }
        let (sa, sb) = (a.tier_stats().unwrap(), b.tier_stats().unwrap());
        assert_eq!(
            (sa.host_hit_tokens, sa.tokens_to_host, sa.tokens_to_device, sa.host_backed_slots),
            (sb.host_hit_tokens, sb.tokens_to_host, sb.tokens_to_device, sb.host_backed_slots),
            "{policy:?}"
        );
        assert!(sa.tokens_to_device > 0 && sa.tokens_to_host > 0, "{policy:?}: both ways");
    }
}

/// Runs whose page is not one pool page (a run ending inside a page, the next not going
/// on; a run starting off a page boundary) are refused, changing nothing.
#[test]
fn runs_that_are_not_whole_pool_pages_are_refused() {
    let c = tiered(32, 64, WritePolicy::WriteThrough, Arc::new(NullCopier::default()));
    let a: Vec<u32> = (1..=8).collect();
    let mut runs: Vec<SlotRun> = Vec::new();
    c.alloc_runs(12, &mut runs).unwrap();
    let s: Vec<u32> = runs.iter().flat_map(|r| r.slots()).collect();
    let gap = [SlotRun { start: s[0], len: 2 }, SlotRun { start: s[0] + 3, len: 6 }];
    let off = [SlotRun { start: s[0] + 1, len: 8 }];
    for bad in [&gap[..], &off[..]] {
        let e = c.insert(0, &a, bad).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(e.to_string().contains("not one whole pool page"), "{e}");
    }
    assert_eq!(look(&c, &a), PrefixMatch::default());
    assert_eq!(c.tier_stats().unwrap().tokens_to_host, 0);
    c.check_tier().unwrap().unwrap();
}

/// A run of six pages backed up as one copy: its device tail evicted (the host keeps the
/// run: the match is the device part, the host extends it), loaded back in part (one page
/// of the two, with its bytes), forked inside by a later insert (the fork's own pages are
/// backed up, the shared ones not again), and all found on the host once the device is
/// emptied.
#[test]
fn a_backed_up_run_partly_evicted_forked_and_partly_loaded_back() {
    let (c, dev) = with_bytes(32, 64);
    let a: Vec<u32> = (1..=24).collect();
    put_runs(&c, &dev, &a);
    c.wait_all();
    let s = c.tier_stats().unwrap();
    assert_eq!((s.tokens_to_host, s.copies_to_host), (24, 1), "one copy for the run");
    // A later insert forks after the run's fourth page: the device splits the run there,
    // and the fork's own pages are backed up (the shared ones are already).
    let mut f: Vec<u32> = a[..16].to_vec();
    f.extend(200..208);
    put_runs_after(&c, &dev, &f, 16);
    c.wait_all();
    assert_eq!(c.tier_stats().unwrap().tokens_to_host, 32);
    // The device lets the run's tail go (the older leaf).
    assert_eq!(c.evict(8, None).unwrap(), 8);
    assert_eq!(look(&c, &f), PrefixMatch { device_len: 24, host_len: 0 });
    assert_eq!(look(&c, &a), PrefixMatch { device_len: 16, host_len: 8 });
    c.check_tier().unwrap().unwrap();
    // A partial load-back: one page of the two.
    let t = c.load_back(0, &a, P).unwrap();
    let l = c.wait_load(t).unwrap();
    assert_eq!((l.outcome, l.loaded, l.lock.len()), (LoadOutcome::Loaded, P, 20));
    check_bytes(&dev, &l.slots, &a[..20]);
    c.release(l.lock).unwrap();
    assert_eq!(look(&c, &a), PrefixMatch { device_len: 20, host_len: 4 });
    c.check_tier().unwrap().unwrap();
    // A fork inside the run: two pages shared, then its own.
    let mut b: Vec<u32> = a[..10].to_vec();
    b.extend(100..110);
    let b = &b[..20];
    let before = c.tier_stats().unwrap().tokens_to_host;
    let mut out: Vec<u32> = Vec::new();
    let (g, m) = c.lookup_and_lock(0, b, &mut out);
    assert_eq!((m.device_len, m.host_len), (8, 0), "the fork diverges in page 2");
    let mut runs: Vec<SlotRun> = Vec::new();
    SlotRun::push_runs_of(&out, &mut runs);
    let free = c.stats().free_slots as usize;
    if free < 12 {
        c.evict(12 - free, None).unwrap();
    }
    c.alloc_runs(12, &mut runs).unwrap();
    let slots: Vec<u32> = runs.iter().flat_map(|r| r.slots()).collect();
    for (&s, &t) in slots[8..].iter().zip(&b[8..]) {
        let (k, v) = bytes(t);
        dev.write_slot(0, s, &k, &v).unwrap();
    }
    assert_eq!(c.insert(0, b, &runs).unwrap(), 8);
    drop(g);
    c.wait_all();
    assert_eq!(c.tier_stats().unwrap().tokens_to_host, before + 12, "only the fork's pages");
    c.check_tier().unwrap().unwrap();
    // Empty the device: both prompts are whole on the host.
    c.evict(usize::MAX, None).unwrap();
    assert_eq!(look(&c, &a), PrefixMatch { device_len: 0, host_len: 24 });
    assert_eq!(look(&c, b), PrefixMatch { device_len: 0, host_len: 20 });
    assert_eq!(look(&c, &f), PrefixMatch { device_len: 0, host_len: 24 });
    let t = c.load_back(0, b, usize::MAX).unwrap();
    let l = c.wait_load(t).unwrap();
    assert_eq!(l.loaded, 20);
    check_bytes(&dev, &l.slots, b);
    c.release(l.lock).unwrap();
    c.check_tier().unwrap().unwrap();
}

/// A run's backup that fails: none of its pages is on the host, its host pages are free
/// again, and the device pages are backed up by the next insert that reaches them.
#[test]
fn a_failed_copy_of_a_run_leaves_nothing_on_the_host() {
    let dev = Arc::new(HostKvStorage::new(KvLayout::new(1, 32, 1, 1, 4)).unwrap());
    let host = Arc::new(HostKvStorage::new(KvLayout::new(1, 64, 1, 1, 4)).unwrap());
    let inner = HostCopier::new(dev.clone(), host);
    let copier = Arc::new(DeferredCopier::new(inner, 1, FailPlan::Every(2)));
    let c = tiered(32, 64, WritePolicy::WriteThrough, copier);
    let a: Vec<u32> = (1..=16).collect();
    let b: Vec<u32> = (101..=116).collect();
    put_runs(&c, &dev, &a); // copy 1: completes
    put_runs(&c, &dev, &b); // copy 2: fails
    c.wait_all();
    let s = c.tier_stats().unwrap();
    assert_eq!((s.tokens_to_host, s.copy_failures), (16, 1));
    assert_eq!(s.host_backed_slots, 16);
    c.check_tier().unwrap().unwrap();
    // Reinserting `b` (all cached) backs it up now (copy 3 completes).
    let mut out: Vec<u32> = Vec::new();
    let g = c.match_and_lock(0, &b, &mut out);
    assert_eq!(g.len(), 16);
    assert_eq!(c.insert(0, &b, &out).unwrap(), 16);
    drop(g);
    c.wait_all();
    assert_eq!(c.tier_stats().unwrap().tokens_to_host, 32);
    c.evict(usize::MAX, None).unwrap();
    assert_eq!(look(&c, &b), PrefixMatch { device_len: 0, host_len: 16 });
    c.check_tier().unwrap().unwrap();
}
