//! The host tier's audit findings (issue 30, section 5): a failed backup raced by a
//! re-insert, copiers that panic (in `poll`, `wait`, `to_host`: the tier finishes the copy
//! as failed and loses nothing), a panic in the write-back eviction hook, and the backup
//! pin of `insert_and_lock` counted as a match. Each test failed on the code before its fix
//! (noted on the test).

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use radixkv::kv::{HostKvStorage, KvLayout};
use radixkv::tier::{
    CopyTicket, DeferredCopier, FailPlan, HostCopier, LoadOutcome, TierCopier, TierOptions,
    TieredCache, WritePolicy,
};
use radixkv::tree::InsertOptions;
use radixkv::{CacheOptions, Error};

const P: usize = 4;
const DEV: usize = 32;
const HOST: usize = 64;

/// A copier that fails, panics or blocks on demand, over a [`DeferredCopier`] (so copies
/// stay in flight until polled past their delay, or waited on) over a [`HostCopier`].
/// Each `panic_*` / `fail_next` flag fires once.
struct Faulty {
    inner: DeferredCopier<HostCopier>,
    /// The next copy started fails (reported by its `poll` or `wait`).
    fail_next: AtomicBool,
    failing: Mutex<HashSet<CopyTicket>>,
    panic_poll: AtomicBool,
    panic_wait: AtomicBool,
    panic_to_host: AtomicBool,
    /// The next `wait` says so on the first channel, then blocks until the second speaks.
    gate: Mutex<Option<(Sender<()>, Receiver<()>)>>,
}

impl Faulty {
    fn new(dev: Arc<HostKvStorage>, host: Arc<HostKvStorage>, delay: u32) -> Faulty {
        Faulty {
            inner: DeferredCopier::new(HostCopier::new(dev, host), delay, FailPlan::Never),
            fail_next: AtomicBool::new(false),
            failing: Mutex::new(HashSet::new()),
            panic_poll: AtomicBool::new(false),
            panic_wait: AtomicBool::new(false),
            panic_to_host: AtomicBool::new(false),
            gate: Mutex::new(None),
        }
    }

    /// Whether `flag` was armed (disarming it).
    fn fires(flag: &AtomicBool) -> bool {
        flag.swap(false, Ordering::SeqCst)
    }

    fn started(&self, t: radixkv::Result<CopyTicket>) -> radixkv::Result<CopyTicket> {
        let t = t?;
        if Faulty::fires(&self.fail_next) {
            self.failing.lock().unwrap().insert(t);
        }
        Ok(t)
    }

    /// `r`, or a failure for a ticket marked failing.
    fn outcome<T>(&self, t: CopyTicket, r: radixkv::Result<T>) -> radixkv::Result<T> {
        let r = r?;
        if self.failing.lock().unwrap().remove(&t) {
            return Err(Error::Device("injected failure (Faulty)".into()));
        }
        Ok(r)
    }

    /// Arms the gate: returns (it is waiting, let it go).
    fn arm_gate(&self) -> (Receiver<()>, Sender<()>) {
        let (at_tx, at_rx) = channel();
        let (go_tx, go_rx) = channel();
        *self.gate.lock().unwrap() = Some((at_tx, go_rx));
        (at_rx, go_tx)
    }
}

impl TierCopier for Faulty {
    fn to_host(&self, dev: &[u32], host: &[u32]) -> radixkv::Result<CopyTicket> {
        if Faulty::fires(&self.panic_to_host) {
            panic!("Faulty: to_host panics");
        }
        self.started(self.inner.to_host(dev, host))
    }

    fn to_device(&self, host: &[u32], dev: &[u32]) -> radixkv::Result<CopyTicket> {
        self.started(self.inner.to_device(host, dev))
    }

    fn poll(&self, t: CopyTicket) -> radixkv::Result<bool> {
        if Faulty::fires(&self.panic_poll) {
            panic!("Faulty: poll panics");
        }
        match self.inner.poll(t) {
            Ok(false) => Ok(false),
            r => self.outcome(t, r),
        }
    }

    fn wait(&self, t: CopyTicket) -> radixkv::Result<()> {
        let gate = self.gate.lock().unwrap().take();
        if let Some((at, go)) = gate {
            at.send(()).unwrap();
            go.recv().unwrap();
        }
        if Faulty::fires(&self.panic_wait) {
            panic!("Faulty: wait panics");
        }
        let r = self.inner.wait(t);
        self.outcome(t, r)
    }
}

struct Rig {
    cache: TieredCache,
    copier: Arc<Faulty>,
}

fn layout(slots: usize) -> KvLayout {
    KvLayout::new(1, slots, 1, 1, 4)
}

/// A tier of [`DEV`] device and [`HOST`] host slots whose copies are held `delay` polls.
fn rig(policy: WritePolicy, delay: u32) -> Rig {
    let dev = Arc::new(HostKvStorage::new(layout(DEV)).unwrap());
    let host = Arc::new(HostKvStorage::new(layout(HOST)).unwrap());
    let copier = Arc::new(Faulty::new(dev, host, delay));
    let cache = TieredCache::new(
        CacheOptions { page_size: P, pool_slots: DEV, ..Default::default() },
        TierOptions { host_slots: HOST, write_policy: policy, ..Default::default() },
        copier.clone(),
    )
    .unwrap();
    Rig { cache, copier }
}

impl Rig {
    /// The request cycle: match, allocate the rest, insert, release.
    fn request(&self, tokens: &[u32]) {
        let mut slots = Vec::new();
        let (lock, m) = self.cache.match_and_lock(0, tokens, &mut slots);
        let mut fresh = Vec::new();
        self.cache.alloc(tokens.len() - m.device_len, &mut fresh).unwrap();
        slots.extend_from_slice(&fresh);
        self.cache.insert(0, tokens, &slots).unwrap();
        self.cache.release(lock).unwrap();
    }

    /// Nothing lost: the invariants, `free + backed == N_host`, `free + cached + held ==
    /// N_dev` with nothing held or pinned, and no copy in flight.
    fn assert_whole(&self) {
        self.cache.check().unwrap();
        let st = self.cache.stats();
        assert_eq!(st.in_flight, 0, "{st:?}");
        assert_eq!(st.host_free_slots + st.host_backed_slots, HOST as u64, "{st:?}");
        assert_eq!(st.host_pinned_pages, 0, "{st:?}");
        assert_eq!(st.device.tree.protected_tokens, 0, "a device lock was lost: {st:?}");
        assert_eq!(st.device.free_slots + st.device.tree.cached_tokens, DEV as u64, "{st:?}");
    }
}

fn key(start: u32, n: usize) -> Vec<u32> {
    (start..start + n as u32).collect()
}

/// Runs `f` on a thread of its own and returns what it returns (or resumes its panic);
/// fails if it has not ended after a generous while. Only a guard against a hang (so a
/// wedged tier fails the test rather than the whole run), never a timing assert.
fn ends<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = channel();
    let h = std::thread::spawn(move || {
        let r = catch_unwind(AssertUnwindSafe(f));
        let _ = tx.send(());
        r
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        panic!("{what} hangs");
    }
    match h.join().unwrap() {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Whether `f` panicked.
fn panics(f: impl FnOnce()) -> bool {
    catch_unwind(AssertUnwindSafe(f)).is_err()
}

/// A rig with copies in flight: two backups (write_through, held 1000 polls) and a
/// load-back of a host-only page `c`. Returns the load-back's ticket.
fn busy_rig() -> (Arc<Rig>, radixkv::tier::LoadTicket) {
    let r = rig(WritePolicy::WriteThrough, 1000);
    let c = key(900, P);
    r.request(&c);
    r.cache.wait_all();
    assert_eq!(r.cache.evict(usize::MAX).unwrap(), P, "c is host-only now");
    r.request(&key(100, 2 * P));
    r.request(&key(200, P));
    let t = r.cache.load_back(0, &c, usize::MAX).unwrap();
    assert_eq!(r.cache.stats().in_flight, 3);
    (Arc::new(r), t)
}

/// §5.1: write_through; insert A of a page starts its backup, insert B of the same tokens
/// finds the writing entry (marking it resident, the page BACKED), then A's copy fails.
/// The page must not stay BACKED without a host entry: a later insert backs it up again.
/// Before the fix: `host_backed_slots` stayed 0 (the page was never backed up again).
#[test]
fn a_failed_backup_raced_by_a_reinsert_leaves_the_page_backed_up_later() {
    let r = rig(WritePolicy::WriteThrough, 1000);
    let a = key(10, P);
    r.copier.fail_next.store(true, Ordering::SeqCst);
    r.request(&a); // A: the backup (failing) is in flight
    r.request(&a); // B: finds the writing entry
    r.cache.wait_all();
    let st = r.cache.stats();
    assert_eq!((st.copy_failures, st.host_backed_slots), (1, 0), "{st:?}");
    r.assert_whole();
    r.request(&a); // reaches the page again: it has no host copy, so it gets one
    r.cache.wait_all();
    let st = r.cache.stats();
    assert_eq!(st.host_backed_slots, P as u64, "the page is backed up again: {st:?}");
    assert_eq!(st.host_resident_pages, 1, "{st:?}");
    r.assert_whole();
}

/// §5.1 under write_back: an eviction's write-back of page A is in flight (held in the
/// copier's `wait`) when an insert caches A again on another device page and finds the
/// writing entry; the write-back then fails. `check()` (BACKED implies an entry naming the
/// page) fails before the fix: the new page stayed BACKED with no host entry.
#[test]
fn a_failed_write_back_raced_by_a_reinsert_leaves_no_stale_backed_page() {
    let r = Arc::new(rig(WritePolicy::WriteBack, 0));
    let a = key(10, P);
    r.request(&a);
    r.copier.fail_next.store(true, Ordering::SeqCst);
    let (at, go) = r.copier.arm_gate();
    let r2 = r.clone();
    let evict = std::thread::spawn(move || r2.cache.evict(P).unwrap());
    at.recv().unwrap(); // the write-back is copying (its entry writing)
    r.request(&a); // caches A again, on another device page
    go.send(()).unwrap();
    assert_eq!(evict.join().unwrap(), P);
    let st = r.cache.stats();
    assert_eq!((st.copy_failures, st.host_backed_slots), (1, 0), "{st:?}");
    r.assert_whole();
    // The device lets A go: written back now.
    assert_eq!(r.cache.evict(usize::MAX).unwrap(), P);
    let st = r.cache.stats();
    assert_eq!((st.host_backed_slots, st.tokens_written_back), (P as u64, P as u64), "{st:?}");
    r.assert_whole();
}

/// §5.2: a copier whose `poll` panics. The panic reaches the caller; the copy it was
/// polling counts as failed (rolled back), the others stay in flight and finish, so
/// `wait_all` returns and nothing is lost. Before the fix: `wait_all` spun for ever
/// (`finishing` never came down; "wait_all after a panicking poll hangs").
#[test]
fn a_copier_panicking_in_poll_wedges_nothing() {
    let (r, t) = busy_rig();
    r.copier.panic_poll.store(true, Ordering::SeqCst);
    assert!(panics(|| {
        r.cache.poll();
    }));
    let r2 = r.clone();
    ends("wait_all after a panicking poll", move || r2.cache.wait_all());
    let st = r.cache.stats();
    assert_eq!(st.copy_failures, 1, "the copy being polled failed, the others did not: {st:?}");
    match r.cache.wait_load(t) {
        Ok(l) => {
            assert_eq!(l.outcome, LoadOutcome::Loaded);
            r.cache.release(l.lock).unwrap();
        }
        Err(e) => assert!(matches!(e, Error::Device(_)), "{e}"),
    }
    r.assert_whole();
    // Every device page can go: no lock was lost.
    r.cache.evict(usize::MAX).unwrap();
    assert_eq!(r.cache.stats().device.tree.cached_tokens, 0);
    r.assert_whole();
}

/// §5.2: dropping the tier after a panicking `poll` finishes (drop waits for the copies).
/// Before the fix: the drop hung ("drop after a panicking poll hangs").
#[test]
fn dropping_the_tier_after_a_panicking_poll_ends() {
    let (r, _t) = busy_rig();
    r.copier.panic_poll.store(true, Ordering::SeqCst);
    assert!(panics(|| {
        r.cache.poll();
    }));
    let r = Arc::into_inner(r).unwrap();
    ends("drop after a panicking poll", move || drop(r));
}

/// §5.2: a copier whose `wait` panics under `wait_all`. The panic reaches the caller; the
/// copy it waited on failed, the others are back in flight, and the next `wait_all`
/// finishes them. Before the fix: the second `wait_all` spun for ever.
#[test]
fn a_copier_panicking_in_wait_all_wedges_nothing() {
    let (r, t) = busy_rig();
    r.copier.panic_wait.store(true, Ordering::SeqCst);
    assert!(panics(|| r.cache.wait_all()));
    let r2 = r.clone();
    ends("wait_all after a panicking wait", move || r2.cache.wait_all());
    assert_eq!(r.cache.stats().copy_failures, 1);
    if let Ok(l) = r.cache.wait_load(t) {
        r.cache.release(l.lock).unwrap();
    }
    r.assert_whole();
    r.cache.evict(usize::MAX).unwrap();
    assert_eq!(r.cache.stats().device.tree.cached_tokens, 0);
    r.assert_whole();
}

/// §5.2: a copier whose `wait` panics under `wait_load`. The load-back fails (rolled back:
/// its device slots freed, its host copies unpinned) and a second `wait_load` says so.
/// Before the fix: the second `wait_load` spun for ever (and the host copies stayed pinned).
#[test]
fn a_copier_panicking_in_wait_load_wedges_nothing() {
    let (r, t) = busy_rig();
    r.copier.panic_wait.store(true, Ordering::SeqCst);
    assert!(panics(|| {
        let _ = r.cache.wait_load(t);
    }));
    let r2 = r.clone();
    let again = ends("wait_load after a panicking wait", move || r2.cache.wait_load(t).map(|_| ()));
    assert!(matches!(again, Err(Error::Device(_))), "{again:?}");
    r.cache.wait_all();
    assert_eq!(r.cache.stats().copy_failures, 1);
    r.assert_whole();
    // The host copy is a hit again (unpinned, kept).
    let mut out = Vec::new();
    assert_eq!(r.cache.match_prefix(0, &key(900, P), &mut out).host_len, P);
}

/// §5.2: dropping the tier while its copier's `wait` panics: every copy is still finished
/// (the panic goes on once they are), and the drop ends.
#[test]
fn dropping_the_tier_with_a_copier_panicking_in_wait_ends() {
    let (r, _t) = busy_rig();
    r.copier.panic_wait.store(true, Ordering::SeqCst);
    let r = Arc::into_inner(r).unwrap();
    let copier = r.copier.clone();
    let dropped = ends("drop with a panicking wait", move || panics(move || drop(r)));
    assert!(dropped, "the copier's panic is not swallowed");
    drop(copier);
}

/// §5.2: a copier whose `to_host` panics as an insert starts a backup: the reserved host
/// entries go and the pins are released (the panic reaches the caller).
#[test]
fn a_copier_panicking_in_to_host_loses_nothing() {
    for keep in [false, true] {
        let r = rig(WritePolicy::WriteThrough, 1000);
        let a = key(10, 2 * P);
        let mut slots = Vec::new();
        r.cache.alloc(a.len(), &mut slots).unwrap();
        r.copier.panic_to_host.store(true, Ordering::SeqCst);
        assert!(panics(|| {
            if keep {
                let _ = r.cache.insert_and_lock(0, &a, &slots, InsertOptions::default());
            } else {
                let _ = r.cache.insert(0, &a, &slots);
            }
        }));
        let st = r.cache.stats();
        assert_eq!((st.host_backed_slots, st.device.tree.cached_tokens), (0, 2 * P as u64));
        r.assert_whole();
        r.request(&a);
        r.cache.wait_all();
        assert_eq!(r.cache.stats().host_backed_slots, 2 * P as u64);
        r.assert_whole();
    }
}

/// §5.3: a panic in the write-back eviction hook (the copier's `to_host` or `wait`). The
/// panic reaches the evicting caller, the device slots are back in the pool (the pool's
/// guard), and the host entries the hook reserved are gone, not writing for ever. Before
/// the fix: `check()` failed ("host entry ... is still writing at quiescence") and the
/// host pages were lost (`free + backed` counted them, but no write-back could use them).
#[test]
fn a_panic_in_the_write_back_hook_loses_no_host_page() {
    for in_wait in [false, true] {
        let r = rig(WritePolicy::WriteBack, 0);
        let (a, b) = (key(10, 2 * P), key(50, P));
        r.request(&a);
        r.request(&b);
        let flag = if in_wait { &r.copier.panic_wait } else { &r.copier.panic_to_host };
        flag.store(true, Ordering::SeqCst);
        assert!(panics(|| {
            let _ = r.cache.evict(usize::MAX);
        }));
        let st = r.cache.stats();
        assert_eq!(st.host_backed_slots, 0, "no entry left writing: {st:?}");
        r.assert_whole();
        // The device evicts again, the copier works: written back, all of the host usable.
        r.request(&a);
        r.request(&b);
        r.cache.evict(usize::MAX).unwrap();
        let st = r.cache.stats();
        assert_eq!(st.device.tree.cached_tokens, 0, "{st:?}");
        assert_eq!(st.host_backed_slots, 3 * P as u64, "{st:?}");
        r.assert_whole();
    }
}

/// §5.5: `insert_and_lock`'s backup pin is no match: the device's match statistics count
/// only the caller's matches. Before the fix: `match_calls` was 1 and `match_hit_tokens`
/// 8 after one `insert_and_lock` and no match.
#[test]
fn insert_and_lock_counts_no_match_for_its_backup_pin() {
    for policy in WritePolicy::ALL {
        let r = rig(policy, 1000);
        let a = key(10, 2 * P);
        let mut slots = Vec::new();
        r.cache.alloc(a.len(), &mut slots).unwrap();
        let (existing, lock) =
            r.cache.insert_and_lock(0, &a, &slots, InsertOptions::default()).unwrap();
        assert_eq!((existing, lock.len()), (0, 2 * P));
        let st = r.cache.stats();
        let tree = st.device.tree;
        assert_eq!((tree.match_calls, tree.match_hit_tokens), (0, 0), "{policy:?}: {st:?}");
        assert_eq!(st.in_flight, (policy == WritePolicy::WriteThrough) as u64);
        r.cache.release(lock).unwrap();
        r.cache.wait_all();
        r.assert_whole();
        // The backup's pin went with its copy: everything can go.
        r.cache.evict(usize::MAX).unwrap();
        assert_eq!(r.cache.stats().device.tree.cached_tokens, 0);
    }
}
