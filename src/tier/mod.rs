//! A host memory tier behind the device pool (SGLang HiCache's semantics): a two-level
//! prefix cache, as an optional part of [`Cache`] (as the pool is).
//!
//! # Where it lives
//!
//! A cache built with host options ([`Cache::with_host`]: the cache's options, the
//! tier's [`TierOptions`] and a [`TierCopier`]) owns a tier (`Tier`, this module's state:
//! the host index, the host pool, the copies in flight) and installs the tier's eviction
//! hook in itself; every front gets the tier through the cache's plain calls, without a
//! second type. [`Cache::lookup`] / [`Cache::lookup_and_lock`] return a [`TierMatch`]
//! ([`crate::PrefixMatch`]: device length and host length, 0 without a tier) and
//! [`Cache::match_prefix`] / [`Cache::match_and_lock`] its device part; `insert`,
//! `insert_with`, `insert_and_lock` and the [`crate::Request`] cycle back pages up by the
//! write policy; `evict`, `alloc`'s evictions, `reset` and `drop_namespace` go through the
//! hook; [`Cache::load_back`], [`Cache::try_load`], [`Cache::wait_load`], [`Cache::poll`],
//! [`Cache::wait_all`], [`Cache::evict_host`], [`Cache::tier_stats`] and
//! [`Cache::check_tier`] are the tier's own. Without a tier each hot path costs one
//! `Option` test (`Cache::tiered`), and the tier's own calls refuse with
//! [`crate::Error::NoTier`] (or answer `None`, or 0 for `poll`). The cache's drop finishes
//! every copy in flight first. The tier's methods work on a `Tiered` view (the cache and
//! its tier); they reach the device level through the tree and the cache's pool-level
//! calls (`insert_impl`, `alloc`, `free`, `release`), never back through the routed door.
//! [`TieredCache`] is a thin compatibility wrapper over such a cache, kept for one release.
//!
//! The device level is a pool-mode [`Cache`] (the radix tree and the device slot pool) and
//! is unchanged: its matches, pins and evictions keep every promise of [`crate::tree`] and
//! [`crate::cache`]. The host level is a slot pool of `host_slots` host slots and an index
//! of the pages that have a host copy (`host_index.rs`), keyed by `(namespace, page hash)`,
//! the chained hash of the page's whole prefix (the KV-event hash). A cached page is on the
//! device, on the host, or both:
//!
//! - **Matching** returns the device prefix (pinned, as [`Cache::match_and_lock`]) and how
//!   far host copies extend it ([`TierMatch::host_len`], SGLang's `host_hit_length`): the
//!   consecutive host pages right after the device prefix.
//! - **Write policies** ([`WritePolicy`]): `write_through` backs a page up when it is first
//!   inserted, `write_through_selective` once its hit count (inserts that reached it, as
//!   SGLang counts) reaches [`TierOptions::write_threshold`] (2 by default), `write_back`
//!   only when the device evicts it.
//! - **Device eviction** frees device slots; a page with a host copy stays on the host
//!   (host-only); under `write_back` a page without one is copied to the host first (the
//!   eviction waits for that copy).
//! - **Load-back** ([`Cache::load_back`]) allocates device slots for the host pages
//!   that extend a match, copies host → device and, once the copy completes, inserts them
//!   and hands the caller a lock over the whole prefix. Below
//!   [`TierOptions::load_back_min`] tokens it is not worth it and says so
//!   ([`LoadOutcome::TooShort`]).
//! - **Host eviction**: host-only leaves (no host page below them), by the host policy
//!   (the device's by default), never a page being copied or pinned, never one the device
//!   still holds.
//!
//! Copies go through a [`TierCopier`] ([`HostCopier`] between two host stores, the CUDA
//! copier between GPU memory and pinned host memory, [`NullCopier`] for an index-only
//! replay). They complete in the background: [`Cache::poll`] finishes the copies
//! that are done, [`Cache::wait_all`] and [`Cache::wait_load`] block.
//!
//! A copier call that **panics** (the trait is public: any Rust copier can) counts as its
//! copy failing: the tier rolls it back as a failed copy (below), with the other copies it
//! had taken back in flight, before the panic goes on to the caller, whether in `poll`,
//! `wait_all`, `wait_load`, the insert or load-back that started the copy, or the
//! `write_back` eviction hook (whose reserved host entries go; the tree's pass and the
//! pool's guard return the evicted slots). So `wait_all` returns and dropping the tier ends
//! (its drop finishes every copy even past such panics, then passes the first on).
//!
//! # Consistency and the protocols
//!
//! One mutex guards the host index and the host pool (each host step below is atomic), and
//! it is never held while calling into the device cache (whose eviction calls back into the
//! host index through the eviction hook). What makes each race come out right:
//!
//! - **Backup in flight vs device eviction.** A backup holds a device lock on the pages it
//!   copies (the pinning insert it starts from, or for `insert_and_lock` a second lock over
//!   the pages that insert pinned) from before the copy starts until the host entries are
//!   committed, so the device cannot evict (and reuse) a slot the copy reads. Its host
//!   entries are *writing* until then: no hit, not evictable, and a second backup of the
//!   same page finds them and skips it. A failed copy
//!   removes them (their host pages go back to the free list) before the device lock goes;
//!   an insert that found a writing entry meanwhile marked it resident and flagged its
//!   device page `BACKED`, so the removal clears that flag too (under the host lock), or the
//!   page would never be backed up again while it stays on the device.
//! - **Ops taken to finish vs a waiter.** `poll`, `wait_all` and `wait_load` take ops out of
//!   the pending list and raise `finishing` under its lock; the ops still running and those
//!   not yet asked about go back, and `finishing` comes down only after that and after the
//!   finished ops' results are stored, also when a copier's panic unwinds (a drop guard).
//!   So a waiter that finds its op neither pending nor finished while `finishing` is 0
//!   knows the ticket is unknown or taken, and never spins on a count a panic left up.
//! - **Load-back vs a racing match.** A load-back pins the host entries it copies (host
//!   eviction skips them) and holds the device slots it allocated (no other owner) until
//!   the copy completes; only then are the pages inserted into the device tree. So a racing
//!   match sees the loaded pages only with their bytes in place, or not at all. Two
//!   load-backs of one prefix both copy; the first insert adopts its slots, the second
//!   finds the pages cached and its slots go back to the pool (the pool-mode insert rule).
//!   A failed copy frees the allocated slots and unpins: nothing is inserted.
//! - **Host eviction vs a pin.** Host eviction takes only evictable entries (host-only,
//!   ready, unpinned, without a host child), in one step under the mutex; a load-back pins
//!   under the same mutex, so it either pins first (the entry is skipped) or finds the
//!   entry gone (the page is no host hit).
//! - **The eviction hook without a lookup.** `BACKED` and the entry id beside it
//!   (`DevPage::entry`) are written together under the host lock, by whoever makes an
//!   entry name the page (a backup's commit, an insert marking a host copy resident, a
//!   load-back's unpin), and read by the hook under the same lock. A page without `BACKED`
//!   has no entry naming it, so the hook leaves the host alone for it (but under
//!   `write_back`, which looks the page up to copy it); with `BACKED`, the id is used only
//!   if that entry is live with the page's identity (keys are unique among live entries, so
//!   it is the entry a lookup by key would find), else the hook looks the key up as before:
//!   an entry re-pointed at another device page meanwhile keeps its resident mark (the
//!   hook un-names only its own page).
//! - **The device evicting a page that is being backed up under another page identity**
//!   cannot happen: one device page holds one `(namespace, tokens)` prefix, and its
//!   identity is written (device page metadata) before the insert that caches it is
//!   published, and read by the eviction hook only after the page was unlinked.
//!
//! Invariants at quiescence (no copy in flight; [`Cache::check_tier`]): device
//! `free + cached + held == N_dev` (the cache's), host `free + backed == N_host`, every host
//! page owned by one entry or free, every resident entry's device page cached with that
//! identity, a cached page flagged `BACKED` exactly when an entry names it (but for
//! `write_back`'s documented window: an entry that names no page), no page that is not
//! cached flagged, and no host entry still writing or pinned.
//!
//! The backup pin of [`Cache::insert_and_lock`] (a second lock over the pages its
//! insert pinned) is taken without counting a match: the device's match statistics
//! (`match_calls`, hit tokens) count only the caller's matches.

mod check;
mod compat;
pub mod copier;
#[cfg(feature = "cuda")]
pub mod cuda;
mod hook;
pub(crate) mod host_index;
mod id_map;
mod load;
#[cfg(not(loom))]
mod memo;
mod pages;
mod resident;
mod types;
pub use compat::TieredCache;
pub use types::{LoadOutcome, LoadTicket, Loaded, TierMatch, TierOptions, TierStats, WritePolicy};

use std::collections::HashMap;
use std::sync::Arc;

pub use copier::{CopyTicket, DeferredCopier, FailPlan, HostCopier, NullCopier, TierCopier};
#[cfg(feature = "cuda")]
pub use cuda::CudaTierCopier;
use host_index::{EntryId, HostIndex, NO_PAGE, PageKey, Removed, Reserved};

use crate::cache::{Cache, CacheOptions, EvictHook};
use crate::error::{Result, invalid};
use crate::events::hash::{HashMode, PageHasher};
use crate::events::{EventSink, KvEvent, Medium};
use crate::pool::SlotState;
use crate::slot_run::Slots;
use crate::sync::{AtomicU32, AtomicU64, Mutex, Ordering, lock};
use crate::tree::{InsertOptions, LockGuard, PrefixLock, SlotSink};

/// What the tier knows of one device page: whose tokens it holds (written before the
/// insert that caches it is published) and how often inserts reached it.
struct DevPage {
    /// Namespace.
    ns: AtomicU64,
    /// Page hash.
    hash: AtomicU64,
    /// Parent page's hash, or [`NO_PARENT`].
    parent: AtomicU64,
    /// `BACKED` or 0. `BACKED`: a host entry names this page as resident; set only while
    /// the page is pinned and under the host lock (a backup's commit, an insert finding the
    /// host copy, a load-back), cleared when the page leaves the device (the eviction hook,
    /// under the host lock) or is reused (`set_page`, by the insert that holds the slots),
    /// and when the entry that named it goes without becoming ready (an insert marked a
    /// *writing* entry resident, then its copy failed: [`Shared::abort`], under the host
    /// lock). So a page without it has no resident host copy, and inserts and evictions skip
    /// the host index for it when nothing else is to be done; and a page with it has one
    /// (`check()` tests both).
    flags: AtomicU32,
    /// The id of the host entry that named this page when `BACKED` was last set (written
    /// with it, under the host lock): the eviction hook reaches the entry without hashing,
    /// after checking that the id still holds this page's identity
    /// ([`HostIndex::live_with`]); meaningless without `BACKED`.
    entry: AtomicU32,
    /// Inserts that reached it since it was cached (counted only under
    /// `write_through_selective`, the one policy that compares the count with a threshold
    /// above 1), reset with `flags`. A word of its own, counted with a load and a store (no
    /// locked add per page per insert): inserts of the same page racing may lose a count,
    /// which delays that page's backup by an insert; `flags` is never written by a count.
    hits: AtomicU32,
}

/// How many pages ahead an insert's host step hints the index's map probes.
const PREFETCH_AHEAD: usize = 16;

/// See [`DevPage::flags`].
const BACKED: u32 = 1;
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<DevPage>() == 40);

/// The bit of an insert's per-page counts (`insert_inner`) saying the page was `BACKED`.
const HOST_BACKED: u64 = 1 << 63;

/// [`DevPage::parent`] of a namespace's first page.
const NO_PARENT: u64 = u64::MAX;

/// A copy in flight and what completes it.
enum Op {
    /// A backup: commit `pages` and release `lock` once done; `tokens` holds the pages'
    /// tokens (for their `BlockStored`) when events were on as it started, else nothing
    /// (a backup started before [`Tier::set_events`] publishes no `BlockStored`).
    Backup {
        ticket: CopyTicket,
        lock: PrefixLock,
        ns: u64,
        pages: Vec<BackupPage>,
        tokens: Vec<u32>,
    },
    /// A load-back.
    Load(Box<LoadOp>),
}

/// One page of a backup.
#[derive(Debug, Clone, Copy)]
struct BackupPage {
    hash: u64,
    parent: Option<u64>,
    dev_page: u32,
    /// Its reserved (writing) host entry.
    entry: EntryId,
}

struct LoadOp {
    id: u64,
    ticket: CopyTicket,
    ns: u64,
    /// The tokens of the device prefix and the loaded pages.
    tokens: Vec<u32>,
    /// The device prefix's slots, then the allocated ones.
    slots: Vec<u32>,
    device_len: usize,
    /// Pins the device prefix meanwhile.
    lock: PrefixLock,
    /// The loaded pages' host entries (pinned).
    entries: Vec<EntryId>,
}

/// What the eviction hook and the tier share.
struct Shared {
    page_size: usize,
    opts: TierOptions,
    host: Mutex<HostIndex>,
    pages: Box<[DevPage]>,
    copier: Arc<dyn TierCopier>,
    /// The device cache's event sink, once events are on.
    events: std::sync::OnceLock<Arc<EventSink>>,
    default_hasher: PageHasher,
    /// Page tokens by device slot, kept for `write_back` with events on (a write-back
    /// publishes the page's tokens).
    tokens: Option<Box<[AtomicU32]>>,
    counters: Counters,
}

/// A statistics counter. Under loom a plain `std` atomic: the counters are no part of any
/// protocol (every access is `Relaxed` and nothing is ordered by them), and modelling them
/// would only multiply the interleavings loom explores.
#[cfg(not(loom))]
type StatU64 = AtomicU64;
#[cfg(loom)]
type StatU64 = std::sync::atomic::AtomicU64;

#[derive(Default)]
struct Counters {
    device_hit_tokens: StatU64,
    host_hit_tokens: StatU64,
    tokens_to_host: StatU64,
    tokens_written_back: StatU64,
    tokens_to_device: StatU64,
    copies_to_host: StatU64,
    copies_to_device: StatU64,
    copy_failures: StatU64,
    load_backs: StatU64,
    load_backs_skipped: StatU64,
    host_evicted_pages: StatU64,
}

/// The host tier's state, owned by a [`Cache`] built with host options
/// ([`Cache::with_host`]); the device level is that cache. `Send + Sync`.
pub(crate) struct Tier {
    shared: Arc<Shared>,
    pending: Mutex<Vec<Op>>,
    /// How many ops `pending` held when its lock was last let go: a hint that lets
    /// [`Tiered::poll`], which every method calls first, skip the lock when nothing
    /// is in flight (so a match takes no tier lock then). A stale read only delays a poll;
    /// `wait_all` and `wait_load` never read it. Not part of any protocol, so a plain
    /// atomic under loom too, like the statistics.
    queued: StatU64,
    results: Mutex<HashMap<u64, Result<Loaded>>>,
    /// Load-back ids (a counter: no part of any protocol, so `std` under loom too).
    next_load: StatU64,
    /// Threads finishing ops they took out of `pending` (raised under `pending`'s lock,
    /// lowered once their results are stored and the unfinished ops are back, by [`Taken`]'s
    /// drop, also on a panic), so a waiter that finds its op in neither place knows whether
    /// it is on its way.
    finishing: AtomicU64,
}

/// A cache with its tier: what the tier's methods work on (the device level is `dev`, the
/// host level `tier`). Got from [`Cache::tiered`]; `Copy`.
#[derive(Clone, Copy)]
pub(crate) struct Tiered<'a> {
    /// The device level (the cache that owns `tier`).
    pub(crate) dev: &'a Cache,
    tier: &'a Tier,
}

impl std::ops::Deref for Tiered<'_> {
    type Target = Tier;
    fn deref(&self) -> &Tier {
        self.tier
    }
}

impl<'a> Tiered<'a> {
    /// `dev`'s tier.
    pub(crate) fn new(dev: &'a Cache, tier: &'a Tier) -> Self {
        Tiered { dev, tier }
    }
}

fn bump(c: &StatU64, n: usize) {
    // Relaxed: statistics.
    c.fetch_add(n as u64, Ordering::Relaxed);
}

impl Shared {
    #[cfg(loom)]
    fn hasher(&self, ns: u64) -> PageHasher {
        match self.events.get() {
            Some(s) => s.namespace(ns).hasher.clone(),
            None => self.default_hasher.clone(),
        }
    }

    /// The page hashes of `tokens` (whole pages) in namespace `ns` (the thread's memo
    /// hashes a request's prompt once for its lookup, load-back and insert: `memo.rs`).
    fn hashes(&self, ns: u64, tokens: &[u32]) -> Vec<u64> {
        let p = self.page_size;
        let n = tokens.len() / p * p;
        #[cfg(not(loom))]
        {
            let info = self.events.get().map(|s| s.namespace(ns));
            let hasher = info.as_ref().map_or(&self.default_hasher, |i| &i.hasher).clone();
            memo::hashes(ns, p, info, &hasher, &tokens[..n])
        }
        #[cfg(loom)]
        self.hasher(ns).block_hashes(&tokens[..n], p)
    }

    fn host(&self) -> crate::sync::MutexGuard<'_, HostIndex> {
        lock(&self.host)
    }

    /// Records device page `page`'s identity (before the insert that caches it).
    fn set_page(&self, page: u32, ns: u64, hash: u64, parent: Option<u64>, tokens: &[u32]) {
        let d = &self.pages[page as usize];
        // Relaxed: published to the eviction hook by the tree's own publish (the insert's
        // Release store of the leaf, read with Acquire by the eviction that unlinks it).
        d.ns.store(ns, Ordering::Relaxed);
        d.hash.store(hash, Ordering::Relaxed);
        d.parent.store(parent.unwrap_or(NO_PARENT), Ordering::Relaxed);
        d.flags.store(0, Ordering::Relaxed);
        d.hits.store(0, Ordering::Relaxed);
        if let Some(t) = &self.tokens {
            let base = page as usize * self.page_size;
            for (i, &x) in tokens.iter().enumerate() {
                t[base + i].store(x, Ordering::Relaxed);
            }
        }
    }

    /// Marks device page `page` as holding a resident host copy, host entry `entry` (see
    /// [`DevPage::flags`]); only while the page is pinned, and under the host lock (`_host`:
    /// the eviction hook reads both fields under it).
    fn set_backed(&self, _host: &HostIndex, page: u32, entry: EntryId) {
        let d = &self.pages[page as usize];
        // Relaxed: see `DevPage::flags`; the host lock orders them with the hook's reads.
        d.entry.store(entry, Ordering::Relaxed);
        d.flags.fetch_or(BACKED, Ordering::Relaxed);
    }

    /// Removes the writing entry of `key` (its copy failed or never started; `host` is the
    /// locked index) and clears `BACKED` of the device page it named, if any: an insert that
    /// cached the same tokens while the copy ran marked the entry resident and set `BACKED`
    /// ([`HostIndex::mark_resident`]), and a page left `BACKED` without an entry would never
    /// be backed up again while it stays on the device.
    ///
    /// Under the host lock, so no hook or insert interleaves: an entry that still names
    /// device page `d` means `d`'s eviction hook has not run since the insert marked it (the
    /// hook un-names its page under this lock before the slots can be reused), so `d` still
    /// holds `key` and clearing its flag touches no other page's state. An insert reading
    /// the flag just before the clear skips the host step once (a backup delayed, not a
    /// state broken); every later one sees it clear.
    fn abort(&self, host: &mut HostIndex, id: EntryId) {
        let d = host.abort(id);
        if d != NO_PAGE {
            // Relaxed: see `DevPage::flags`; the host lock orders it with the flag's writers.
            self.pages[d as usize].flags.fetch_and(!BACKED, Ordering::Relaxed);
        }
    }

    fn page_id(&self, page: u32) -> (PageKey, Option<u64>) {
        let d = &self.pages[page as usize];
        // Relaxed: see `set_page`.
        let ns = d.ns.load(Ordering::Relaxed);
        let h = d.hash.load(Ordering::Relaxed);
        let p = d.parent.load(Ordering::Relaxed);
        ((ns, h), (p != NO_PARENT).then_some(p))
    }

    /// Publishes host removals (`BlockRemoved`, medium `CPU_PINNED`) and counts them.
    fn removed(&self, r: Removed) {
        if r.pages.is_empty() {
            return;
        }
        bump(&self.counters.host_evicted_pages, r.pages.len());
        if let Some(s) = self.events.get() {
            s.push(KvEvent::BlockRemoved {
                block_hashes: r.pages.iter().map(|k| k.1).collect(),
                medium: Medium::CpuPinned,
            });
        }
    }

    /// Publishes host copies that became ready (`BlockStored`, medium `CPU_PINNED`):
    /// consecutive pages of one namespace, `tokens` holding theirs.
    fn stored(&self, ns: u64, hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32>) {
        if let Some(s) = self.events.get()
            && !hashes.is_empty()
        {
            let info = s.namespace(ns);
            if let KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                cache_salt,
                ..
            } = s.stored_event(&info, hashes, parent, tokens)
            {
                s.push(KvEvent::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_name,
                    cache_salt,
                    medium: Medium::CpuPinned,
                });
            }
        }
    }
}

/// What a copier's panic unwinds with.
type Panic = Box<dyn std::any::Any + Send + 'static>;

/// Calls the copier, catching a panic: then the copy counts as failed (`Device`), and the
/// panic is handed back for the caller to [`resume`] once it has rolled the copy back. The
/// tier holds no lock of its own across a copier call and `call` touches none of its
/// state, so nothing of the tier's is half-changed when it unwinds (`AssertUnwindSafe`);
/// what the copier's own state is after its panic is its business.
fn call_copier<T>(call: impl FnOnce() -> Result<T>) -> (Result<T>, Option<Panic>) {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)) {
        Ok(r) => (r, None),
        Err(p) => (Err(crate::error::Error::Device("the tier's copier panicked".into())), Some(p)),
    }
}

/// Goes on with a copier's panic [`call_copier`] caught, if any.
fn resume(panic: Option<Panic>) {
    if let Some(p) = panic {
        std::panic::resume_unwind(p);
    }
}

impl Tier {
    /// Locks `pending` (see [`Pending`]).
    fn pending(&self) -> Pending<'_> {
        Pending { guard: lock(&self.pending), queued: &self.queued }
    }

    /// The host tier of a cache of `device` (pool mode: `pool_slots > 0`): `tier.host_slots`
    /// host slots, copying through `copier`; and the eviction hook to install in the
    /// device cache. `InvalidArgument` for a device cache without a pool, a host size that
    /// is not a positive multiple of the page size, or a zero `write_threshold`.
    pub(crate) fn new(
        device: CacheOptions,
        tier: TierOptions,
        copier: Arc<dyn TierCopier>,
    ) -> Result<(Self, EvictHook)> {
        let p = device.page_size.max(1);
        if device.pool_slots == 0 {
            return Err(invalid("a host tier needs the device pool (pool_slots > 0)"));
        }
        if tier.host_slots == 0 || !tier.host_slots.is_multiple_of(p) {
            return Err(invalid(format!(
                "host_slots = {} must be a positive multiple of the page size {p}",
                tier.host_slots
            )));
        }
        if tier.host_slots > u32::MAX as usize {
            return Err(invalid("host_slots must fit u32 slot indices"));
        }
        if tier.write_threshold == 0 {
            return Err(invalid("write_threshold must be at least 1"));
        }
        let n_pages = device.pool_slots / p;
        let pages = (0..n_pages)
            .map(|_| DevPage {
                ns: AtomicU64::new(0),
                hash: AtomicU64::new(0),
                parent: AtomicU64::new(NO_PARENT),
                flags: AtomicU32::new(0),
                entry: AtomicU32::new(NO_PAGE),
                hits: AtomicU32::new(0),
            })
            .collect();
        let host_policy = tier.host_policy.unwrap_or(device.policy);
        let shared = Arc::new(Shared {
            page_size: p,
            opts: tier,
            host: Mutex::new(HostIndex::new(
                tier.host_slots,
                p,
                host_policy,
                device.slru_threshold,
            )),
            pages,
            copier,
            events: std::sync::OnceLock::new(),
            default_hasher: PageHasher::new(HashMode::Xxh3, None, None),
            // Only `write_back` needs a page's tokens at eviction (for its `BlockStored`).
            tokens: (tier.write_policy == WritePolicy::WriteBack)
                .then(|| (0..device.pool_slots).map(|_| AtomicU32::new(0)).collect()),
            counters: Counters::default(),
        });
        let hook = shared.clone();
        let hook: EvictHook = Arc::new(move |runs| hook.device_evicted(runs));
        let t = Tier {
            shared,
            pending: Mutex::new(Vec::new()),
            results: Mutex::new(HashMap::new()),
            next_load: StatU64::new(1),
            finishing: AtomicU64::new(0),
            queued: StatU64::new(0),
        };
        Ok((t, hook))
    }

    /// Publishes host copies through `sink` from now on (the device cache's, once its
    /// events are on): `BlockStored` when a copy becomes ready, `BlockRemoved` when host
    /// eviction drops it, medium `CPU_PINNED`.
    pub(crate) fn set_events(&self, sink: Arc<EventSink>) {
        let _ = self.shared.events.set(sink);
    }

    /// The tier's options.
    pub(crate) fn options(&self) -> TierOptions {
        self.shared.opts
    }

    /// The copier.
    pub(crate) fn copier(&self) -> &Arc<dyn TierCopier> {
        &self.shared.copier
    }
}

impl<'a> Tiered<'a> {
    /// How far host copies extend a device match of `device_len` tokens.
    fn host_run(&self, ns: u64, tokens: &[u32], device_len: usize) -> usize {
        let p = self.shared.page_size;
        if tokens.len() / p <= device_len / p {
            return 0;
        }
        let hashes = self.shared.hashes(ns, tokens);
        let start = device_len / p;
        let n = self.shared.host().run(ns, &hashes[start..]);
        n * p
    }

    /// The device prefix of `tokens` (slots into `out`, not pinned, as the tree's match)
    /// and how far the host extends it ([`Cache::lookup`] with a tier).
    pub(crate) fn match_prefix<S: SlotSink>(
        &self,
        ns: u64,
        tokens: &[u32],
        out: &mut S,
    ) -> TierMatch {
        self.poll();
        let d = self.dev.tree().match_prefix(ns, tokens, out);
        let h = self.host_run(ns, tokens, d);
        bump(&self.shared.counters.device_hit_tokens, d);
        bump(&self.shared.counters.host_hit_tokens, h);
        TierMatch { device_len: d, host_len: h }
    }

    /// [`Tiered::match_prefix`], pinning the device prefix ([`Cache::lookup_and_lock`]
    /// with a tier).
    pub(crate) fn match_and_lock<S: SlotSink>(
        &self,
        ns: u64,
        tokens: &[u32],
        out: &mut S,
    ) -> (LockGuard<'a>, TierMatch) {
        self.poll();
        let lock = self.dev.tree().match_and_lock(ns, tokens, out);
        let d = lock.len();
        let h = self.host_run(ns, tokens, d);
        bump(&self.shared.counters.device_hit_tokens, d);
        bump(&self.shared.counters.host_hit_tokens, h);
        (lock, TierMatch { device_len: d, host_len: h })
    }

    /// Evicts at least `k` host tokens (host-only leaves, by the host policy); returns the
    /// host tokens freed.
    pub(crate) fn evict_host(&self, k: usize) -> usize {
        let p = self.shared.page_size;
        let mut removed = Removed::default();
        let n = self.shared.host().evict(k.div_ceil(p), &mut removed);
        self.shared.removed(removed);
        n * p
    }

    /// The insert of a cache with a tier ([`Cache::insert_with`] and
    /// [`Cache::insert_and_lock`]): inserts `tokens` with their device `slots` (each page
    /// one whole pool page), then backs the pages up as the write policy says (the copy
    /// runs in the background, pinning the pages on the device until it completes). With
    /// `pin`, the caller gets a lock over the inserted prefix. `InvalidArgument` (nothing
    /// changed) for slots of a page that are not one whole pool page, or as the device's
    /// insert.
    pub(crate) fn insert_slots(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: Slots<'_>,
        pin: bool,
        opts: InsertOptions,
    ) -> Result<(usize, Option<PrefixLock>)> {
        let (existing, lock) = self.insert_inner(ns, tokens, slots, opts, pin, None)?;
        match (pin, lock) {
            (false, Some(l)) => {
                self.dev.release(l)?;
                Ok((existing, None))
            }
            (_, l) => Ok((existing, l)),
        }
    }

    /// The insert and its backup. With `keep`, the insert's lock is the caller's (a backup
    /// pins the pages with a second lock, taken while the first holds them); without, a
    /// backup takes it (then `None`: the backup releases it when its copy completes).
    /// `cached_out` (if given) receives the cached slots of `tokens[..existing]` (as the
    /// device's insert).
    pub(crate) fn insert_inner(
        &self,
        ns: u64,
        tokens: &[u32],
        slots: Slots<'_>,
        opts: InsertOptions,
        keep: bool,
        cached_out: Option<&mut Vec<u32>>,
    ) -> Result<(usize, Option<PrefixLock>)> {
        self.poll();
        let sh = &*self.shared;
        let p = sh.page_size;
        let count = pages::slot_count(slots);
        if tokens.len() != count {
            return Err(invalid(format!(
                "{} tokens but {count} slots (one slot per token)",
                tokens.len(),
            )));
        }
        let n = self.dev.tree().aligned(tokens.len());
        let pool = self.dev.pool().expect("a tiered cache has a device pool");
        // Each page's first slot (the pages are whole pool pages, checked): O(pages + runs).
        let mut bases = Vec::new();
        if let Err(i) = pages::page_bases(slots, n, p, &mut bases) {
            let page = pages::page_slots(slots, i, p);
            return Err(invalid(format!(
                "page {i}'s slots {page:?} are not one whole pool page (with a host tier, \
                 each page's slots are the {p} consecutive slots of one pool page)"
            )));
        }
        if let Some(&b) = bases.iter().find(|&&b| b as usize >= pool.capacity()) {
            return Err(invalid(format!("slot {b} is outside the device pool")));
        }
        let hashes = sh.hashes(ns, &tokens[..n]);
        // Identity of the pages this insert may adopt (the caller's held slots), before the
        // insert publishes them.
        let mut states = Vec::new();
        pool.states(&bases, &mut states);
        for (i, &b) in bases.iter().enumerate() {
            if states[i] == SlotState::Held {
                let parent = i.checked_sub(1).map(|j| hashes[j]);
                sh.set_page(b / p as u32, ns, hashes[i], parent, page_tokens(tokens, i, p));
            }
        }
        // The insert; the cached pages of `tokens[..existing]` replace the given ones in
        // `bases` (a list's cached slots, or the runs the runs' insert hands back).
        let (existing, lock) = match slots {
            Slots::List(list) => {
                let mut cached = Vec::new();
                let r = self.dev.insert_impl(ns, tokens, list, true, opts, Some(&mut cached))?;
                for (i, b) in bases.iter_mut().enumerate().take(r.0 / p) {
                    *b = cached[i * p];
                }
                if let Some(out) = cached_out {
                    *out = cached;
                }
                r
            }
            Slots::Runs(runs) => {
                let mut cached = Vec::new();
                let r =
                    self.dev.insert_runs_impl(ns, tokens, runs, true, opts, Some(&mut cached))?;
                let mut have = Vec::new();
                if pages::page_bases(Slots::Runs(&cached), r.0, p, &mut have).is_err() {
                    unreachable!("the cached pages are whole pool pages");
                }
                debug_assert_eq!(have.len(), r.0 / p, "the cached runs cover the existing pages");
                bases[..have.len()].copy_from_slice(&have);
                if let Some(out) = cached_out {
                    out.clear();
                    out.extend(cached.iter().flat_map(|r| r.slots()));
                }
                r
            }
        };
        let lock = lock.expect("a pinning insert returns a lock");
        let dev_page = |i: usize| -> u32 { bases[i] / p as u32 };
        let threshold = match sh.opts.write_policy {
            WritePolicy::WriteThrough => 1,
            WritePolicy::WriteThroughSelective => sh.opts.write_threshold as u64,
            WritePolicy::WriteBack => u64::MAX,
        };
        // Only `write_through_selective` compares the count with a threshold above 1: the
        // other policies read `flags` (for `BACKED`) without counting. `hits[i]`: the page's
        // count after this insert, with `HOST_BACKED` when the page was `BACKED`.
        let count = sh.opts.write_policy == WritePolicy::WriteThroughSelective;
        let mut hits = Vec::with_capacity(n / p);
        for i in 0..n / p {
            let d = &sh.pages[dev_page(i) as usize];
            // Relaxed: a counter; its races only shift when a backup starts (a count lost to
            // a racing insert of the same page delays the page's backup by one insert: see
            // `DevPage::hits`). A read of `BACKED` that misses a racing change takes the host
            // step needlessly (under the host lock it finds the entry) or skips it once (a
            // backup delayed), as a read just before the change would (see `Shared::abort`).
            let b = if d.flags.load(Ordering::Relaxed) & BACKED != 0 { HOST_BACKED } else { 0 };
            let h = if count {
                let h = d.hits.load(Ordering::Relaxed);
                d.hits.store(h.wrapping_add(1), Ordering::Relaxed);
                h as u64
            } else {
                0
            };
            hits.push(b | (h + 1));
        }
        // Host step: pages with a host copy are resident again; pages at the threshold
        // without one get a writing entry. A page that was on the device before this insert
        // and is not BACKED has no host copy (one appears only through a backup or a
        // load-back of this very page, which set BACKED, or when the device lets it go):
        // it needs the host only if it reached the threshold now.
        let existing_pages = existing / p;
        let mut backup: Vec<(usize, EntryId)> = Vec::new();
        let mut removed = Removed::default();
        let needs_host = |i: usize| {
            let h = hits[i];
            h & HOST_BACKED == 0 && (i >= existing_pages || h >= threshold)
        };
        if (0..n / p).any(needs_host) {
            let mut host = sh.host();
            // The entry of the page before (found or reserved here): its child's reserve
            // counts the kid without a lookup.
            let mut prev: (usize, EntryId) = (usize::MAX, NO_PAGE);
            // The entry before was reserved here (not found): the page's entry, if any, is
            // not expected right after it (a guess at `prev + 1` would read a free entry,
            // a cache miss for nothing; the map answers instead).
            let mut prev_new = false;
            let todo: Vec<usize> = (0..n / p).filter(|&i| needs_host(i)).collect();
            // Each page's map probe is a cache miss of its own, and so is the slab entry a
            // reserve fills: hint the ones a few pages (reserves) ahead, so they overlap (a
            // hint only; it changes nothing).
            for (k, &i) in todo.iter().take(PREFETCH_AHEAD).enumerate() {
                host.prefetch(&(ns, hashes[i]));
                host.prefetch_free(k);
            }
            for (k, &i) in todo.iter().enumerate() {
                if let Some(&j) = todo.get(k + PREFETCH_AHEAD) {
                    host.prefetch(&(ns, hashes[j]));
                    host.prefetch_free(PREFETCH_AHEAD); // the top moved with each reserve
                }
                let key = (ns, hashes[i]);
                let after = if prev.0.wrapping_add(1) == i { prev.1 } else { NO_PAGE };
                // The page's entry, if any, or a new one at the threshold: one map probe at
                // most (none when the entry follows the one before on the host).
                let r = match host.guess_after(if prev_new { NO_PAGE } else { after }, &key) {
                    Some(id) => Reserved::Have(id),
                    None if hits[i] & !HOST_BACKED >= threshold => {
                        let parent = i.checked_sub(1).map(|j| hashes[j]);
                        host.reserve(key, parent, after, opts.priority, &mut removed)
                    }
                    None => match host.find(&key) {
                        Some(id) => Reserved::Have(id),
                        None => continue,
                    },
                };
                match r {
                    Reserved::Have(id) => {
                        host.mark_resident(id, dev_page(i));
                        sh.set_backed(&host, dev_page(i), id);
                        (prev, prev_new) = ((i, id), false);
                    }
                    Reserved::New(id) => {
                        backup.push((i, id));
                        (prev, prev_new) = ((i, id), true);
                    }
                    Reserved::Full => break, // the host is full of pages it may not drop
                }
            }
        }
        sh.removed(removed);
        if backup.is_empty() {
            return Ok((existing, Some(lock)));
        }
        // The copy's slot lists (one slot per token, as the copier takes them) and, with
        // events on, the pages' tokens (for their `BlockStored`), a range and a slice per page.
        let (mut dev, mut hst) =
            (Vec::with_capacity(backup.len() * p), Vec::with_capacity(backup.len() * p));
        let events = sh.events.get().is_some();
        let mut op_tokens: Vec<u32> = Vec::with_capacity(if events { backup.len() * p } else { 0 });
        for &(i, id) in &backup {
            let (d, h) = (dev_page(i) * p as u32, id * p as u32);
            dev.extend(d..d + p as u32);
            hst.extend(h..h + p as u32);
            if events {
                op_tokens.extend_from_slice(page_tokens(tokens, i, p));
            }
        }
        let pages: Vec<BackupPage> = backup
            .iter()
            .map(|&(i, id)| BackupPage {
                hash: hashes[i],
                parent: i.checked_sub(1).map(|j| hashes[j]),
                dev_page: dev_page(i),
                entry: id,
            })
            .collect();
        bump(&sh.counters.copies_to_host, 1);
        // The backup's own pin: the insert's lock, or (when the caller keeps that one) a
        // second lock over the same pages, taken while the first still pins them all. That
        // one is no match of the caller's: the tree's match statistics do not count it.
        let (backup_lock, caller) = if keep {
            let mut scratch: Vec<crate::SlotRun> = Vec::new();
            (self.dev.tree().lock_unrecorded(ns, &tokens[..n], &mut scratch), Some(lock))
        } else {
            (lock, None)
        };
        // If the copier panics, the caller's lock goes with the unwinding guard, and the
        // backup is finished as failed (`finish`: its entries go, its pin is released).
        let caller = caller.map(|l| self.dev.tree().guard(l));
        let op = Op::Backup { ticket: 0, lock: backup_lock, ns, pages, tokens: op_tokens };
        let (mut op, started) = self.ask(op, |_| sh.copier.to_host(&dev, &hst));
        match started {
            Ok(t) => {
                if let Op::Backup { ticket, .. } = &mut op {
                    *ticket = t;
                }
                self.settle_or_queue(op);
            }
            // Rolled back as a failed copy.
            Err(e) => self.finish(op, Err(e)),
        }
        Ok((existing, caller.map(|g| g.into_raw())))
    }

    /// Finishes `op` now if its copy is done, else queues it.
    fn settle_or_queue(&self, op: Op) {
        let (op, r) = self.ask(op, |op| self.shared.copier.poll(op_ticket(op)));
        match r {
            Ok(false) => self.pending().push(op),
            r => self.finish(op, r.map(|_| ())),
        }
    }

    /// Asks the copier about `op`'s copy (`call`) and hands `op` back with the answer. If
    /// the copier panics, the copy counts as failed: `op` is finished so (its host entries
    /// go or are unpinned, its device locks and slots released, a load-back's result
    /// stored) before the panic goes on to the caller. A copier that panics on a ticket is
    /// never asked about it again (as after an `Err`, the ticket is spent).
    fn ask<T>(&self, op: Op, call: impl FnOnce(&Op) -> Result<T>) -> (Op, Result<T>) {
        let (r, panic) = call_copier(|| call(&op));
        if let Some(p) = panic {
            self.finish(op, r.map(|_| ()));
            std::panic::resume_unwind(p);
        }
        (op, r)
    }

    /// Takes `ops` out of `pending` as one finishing thread: raises `finishing`. Call it
    /// with `pending` locked (see [`Taken`]).
    fn taken(&self, ops: Vec<Op>) -> Taken<'a> {
        // SeqCst: see `finishing`.
        self.finishing.fetch_add(1, Ordering::SeqCst);
        Taken { tier: *self, left: ops.into_iter(), keep: Vec::new() }
    }

    /// Completes an op whose copy ended with `r`.
    fn finish(&self, op: Op, r: Result<()>) {
        let sh = &*self.shared;
        match op {
            Op::Backup { lock, ns, pages, tokens, .. } => {
                let ok = r.is_ok();
                {
                    let mut host = sh.host();
                    for pg in &pages {
                        if ok {
                            host.commit(pg.entry, pg.dev_page);
                            sh.set_backed(&host, pg.dev_page, pg.entry);
                        } else {
                            sh.abort(&mut host, pg.entry);
                        }
                    }
                }
                if ok {
                    bump(&sh.counters.tokens_to_host, pages.len() * sh.page_size);
                    // Events on when the backup started (the sink, once set, stays).
                    if !tokens.is_empty() {
                        self.publish_runs(ns, &pages, &tokens);
                    }
                } else {
                    bump(&sh.counters.copy_failures, 1);
                }
                // Cannot fail: the lock came from this tree and is released once.
                let _ = self.dev.release(lock);
            }
            Op::Load(l) => {
                let id = l.id;
                let res = self.finish_load(*l, r);
                lock(&self.results).insert(id, res);
            }
        }
    }

    /// Publishes a backup's stored pages: one `BlockStored` per run of pages each the
    /// child of the one before (a backup skips pages that had a host copy already).
    fn publish_runs(&self, ns: u64, pages: &[BackupPage], tokens: &[u32]) {
        let p = self.shared.page_size;
        let mut start = 0;
        for i in 1..=pages.len() {
            if i == pages.len() || pages[i].parent != Some(pages[i - 1].hash) {
                let hs = pages[start..i].iter().map(|x| x.hash).collect();
                self.shared.stored(ns, hs, pages[start].parent, tokens[start * p..i * p].to_vec());
                start = i;
            }
        }
    }

    /// Finishes the copies that are done (backups commit their host copies and unpin the
    /// device pages; load-backs insert their pages). Returns how many finished. Every
    /// method of the tier calls it; an engine calls it once per step. If the copier panics,
    /// the copy it was polling is rolled back as failed, the others stay in flight, and the
    /// panic goes on.
    pub(crate) fn poll(&self) -> usize {
        // Relaxed: a hint (see `queued`).
        if self.queued.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let mut taken = {
            let mut pend = self.pending();
            if pend.is_empty() {
                return 0;
            }
            self.taken(std::mem::take(&mut *pend))
        };
        let mut done = 0;
        while let Some(finished) = taken.finish_next(|op| self.shared.copier.poll(op_ticket(op))) {
            done += finished as usize;
        }
        drop(taken); // the copies still running go back to `pending`, then `finishing` comes down
        done
    }

    /// Waits for every copy in flight and finishes it. If the copier panics, the copy it was
    /// waiting on is rolled back as failed, the rest stay in flight (a later call finishes
    /// them), and the panic goes on.
    pub(crate) fn wait_all(&self) {
        loop {
            let taken = {
                let mut pend = self.pending();
                if pend.is_empty() {
                    if self.finishing.load(Ordering::SeqCst) == 0 {
                        return;
                    }
                    None
                } else {
                    Some(self.taken(std::mem::take(&mut *pend)))
                }
            };
            let Some(mut taken) = taken else {
                crate::sync::yield_now();
                continue;
            };
            while taken
                .finish_next(|op| self.shared.copier.wait(op_ticket(op)).map(|()| true))
                .is_some()
            {}
            drop(taken);
        }
    }
}

/// `pending`, locked; letting it go records its length in `queued`.
struct Pending<'a> {
    guard: crate::sync::MutexGuard<'a, Vec<Op>>,
    queued: &'a StatU64,
}

impl std::ops::Deref for Pending<'_> {
    type Target = Vec<Op>;
    fn deref(&self) -> &Vec<Op> {
        &self.guard
    }
}

impl std::ops::DerefMut for Pending<'_> {
    fn deref_mut(&mut self) -> &mut Vec<Op> {
        &mut self.guard
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        // Relaxed: a hint (see `Tier::queued`), stored while the lock is held.
        self.queued.store(self.guard.len() as u64, Ordering::Relaxed);
    }
}

/// Ops one thread took out of `pending` to finish, counted in `finishing` (raised by
/// [`Tiered::taken`] under `pending`'s lock). Dropped, also by a panic unwinding (a
/// copier's, which [`Tiered::ask`] turned into a failed copy first), it puts the ops
/// still in flight and those not yet looked at back in `pending`, and only then lowers
/// `finishing`. The order waiters rely on: every op taken is, at each moment, in `pending`,
/// in `results` (a finished load-back), or counted in `finishing`; `finishing` comes down
/// only after the ops' results are stored and the rest are back. So `wait_all` and
/// `wait_load` never spin on a count that a panic left up, and no op is dropped unfinished.
struct Taken<'a> {
    tier: Tiered<'a>,
    /// Not yet asked about.
    left: std::vec::IntoIter<Op>,
    /// Asked about and still in flight.
    keep: Vec<Op>,
}

impl Taken<'_> {
    /// Asks the copier about the next op (`call`, `Ok(false)` while its copy runs) and
    /// finishes it if its copy completed or failed (`Some(true)`), or keeps it (`Some(false)`);
    /// `None` when no op is left.
    fn finish_next(&mut self, call: impl FnOnce(&Op) -> Result<bool>) -> Option<bool> {
        let op = self.left.next()?;
        let (op, r) = self.tier.ask(op, call);
        match r {
            Ok(false) => {
                self.keep.push(op);
                Some(false)
            }
            r => {
                self.tier.finish(op, r.map(|_| ()));
                Some(true)
            }
        }
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        let mut rest = std::mem::take(&mut self.keep);
        rest.extend(self.left.by_ref());
        if !rest.is_empty() {
            self.tier.pending().extend(rest);
        }
        // SeqCst: see `Tier::finishing`; after the results and `pending` above.
        self.tier.finishing.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The ticket of an op's copy.
fn op_ticket(op: &Op) -> CopyTicket {
    match op {
        Op::Backup { ticket, .. } => *ticket,
        Op::Load(l) => l.ticket,
    }
}

/// Page `i`'s tokens.
fn page_tokens(tokens: &[u32], i: usize, p: usize) -> &[u32] {
    &tokens[i * p..(i + 1) * p]
}

impl Tiered<'_> {
    /// What dropping a cache with a tier does first: copies in flight read or write memory
    /// the caller may free next, so it finishes them, all of them even when the copier
    /// panics. Each such panic finishes the copy it came from as failed (`ask`) and puts
    /// the rest back (`Taken`), so this loop ends; the first panic goes on afterwards,
    /// unless the thread is unwinding already.
    pub(crate) fn finish_on_drop(&self) {
        let mut first = None;
        while let Err(p) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.wait_all()))
        {
            first.get_or_insert(p);
        }
        if let Some(p) = first
            && !std::thread::panicking()
        {
            std::panic::resume_unwind(p);
        }
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn f<T: Send + Sync>() {}
    f::<Tier>();
}
