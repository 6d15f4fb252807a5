//! The built-in KV slot pool: `N` slots in pages of `P` consecutive slots, handed out and
//! taken back by many threads at once without one global lock.
//!
//! # Slot states
//!
//! Every slot has one owner, kept in two bits per slot (one in each of two bit planes; see
//! "States in two bit planes" below):
//!
//! | value | state                 | owner                                             |
//! |-------|-----------------------|---------------------------------------------------|
//! | 0     | [`SlotState::Free`]   | the pool                                          |
//! | 1     | [`SlotState::Held`]   | a caller ([`SlotPool::try_alloc`] handed it out)  |
//! | 2     | [`SlotState::Cached`] | the radix tree ([`SlotPool::adopt`] gave it over) |
//!
//! Transitions: `Free -> Held` (`try_alloc`), `Held -> Free` (`free`), `Held -> Cached`
//! (`adopt`), `Cached -> Free` (`release_cached`).
//!
//! # Design
//!
//! * **Pages.** Allocation is by whole pages (page `p` is slots `p*P .. p*P+P`). A page is on
//!   the free list exactly when all its `P` slots are Free. Slots of a page may be freed in
//!   separate calls: a per-page count of Free slots decides which call makes the page whole
//!   and puts it back (a call that frees all `P` slots of a page skips the count).
//! * **Sharded free list.** Free pages live in `K` cache-padded shards, each a small
//!   `Mutex<Vec<PageRun>>`, a stack of runs of consecutive page ids (a bulk free pushes one
//!   entry per run, not one per page; an allocation takes pages off the top run, lowest
//!   first) (`K` = the next power of two `>= 2 * available_parallelism`, at least
//!   4). A thread works on its *home* shard (a thread-local probe): a free pushes there, an
//!   allocation pops there first and steals from the other shards when short. A thread that
//!   finds its home shard locked by another moves to another home (as Java's `LongAdder`
//!   does), so threads spread over the shards by themselves.
//! * **Reservation counter.** `free_pages` counts the pages on the shards that no allocation
//!   has claimed. A free pushes its pages onto a shard *before* it adds them to
//!   `free_pages`; an allocation of `k` pages first takes `k` off `free_pages` with a CAS loop
//!   (failing at once, with nothing changed, if fewer are there) and only then pops `k`
//!   pages, which are then certain to be on the shards: at every instant the pages on the
//!   shards number at least `free_pages` plus the pages reserved and not yet popped. So an
//!   allocation is all or nothing and never fails for want of pages that merely sat on
//!   another shard.
//! * **States in two bit planes.** A slot's state is its bit in two bitmaps of `AtomicU64`
//!   words, 64 slots a word: the Held plane and the Cached plane (Free: neither; a slot is
//!   never in both). A run of consecutive slots is checked and changed a word (64 slots) at
//!   a time, and a change touches only the planes whose bit changes: an eviction's
//!   `Cached -> Free` reads and writes the Cached plane alone (half the cache lines of
//!   2-bit fields, which is what a large eviction call mostly spends its pool time on). A
//!   word may hold slots of several owners: a write to part of a word is an atomic
//!   `fetch_or` / `fetch_and` of its own slots' bits only, and a plain store writes only a
//!   word whose 64 slots all belong to the writing call, so calls on neighbouring slots
//!   never lose each other's writes.
//! * **Stripe locks for state changes.** `free`, `adopt`, `release_cached` and `settle`
//!   change slot states under per-stripe locks (one `AtomicU8` spin lock, a test-and-set,
//!   per stripe of `4096 / P` whole pages, at least one page), by strict two-phase locking:
//!   lock every stripe the call touches, check and change every slot in one pass (undoing
//!   the changes if a slot fails the check: the call is refused, and nobody that takes a
//!   stripe lock sees the changes it undid), change the page counts, then unlock. A call's lists become maximal runs of consecutive
//!   slots; if the runs do not already ascend they are sorted (two runs sharing a slot: a
//!   slot listed twice) and neighbours merged. So a run of `n` slots costs about `n / 4096`
//!   locks and `n / 64` word reads and writes per plane, whatever the page size (eviction hands the
//!   pool runs directly: [`SlotPool::release_cached_runs`]). Every call locks its
//!   stripes in ascending order, each once, waiting for each: a call waits only for a stripe
//!   above every stripe it holds, so every chain of waiting ends: there is no deadlock.
//!   Waiting happens only when two calls touch one stripe at once.
//! * **Runs stay runs.** Pages freed together go onto the shard as runs, highest first, so
//!   that the pops (from the top) hand them out ascending again: an allocation after a bulk free
//!   gets long runs, which its free, adopt and release then handle a word at a time.
//!
//! # Consistency
//!
//! * `free`, `adopt`, `release_cached` and `state` are linearizable with respect to the slot
//!   states: each holds the locks of all the stripes it reads or changes at once (strict
//!   two-phase locking; `state` locks the slot's stripe), so each takes effect at an
//!   instant while it holds them all. A refused call changes nothing, and nobody saw its
//!   stripes in between. Two callers freeing the same slot at once therefore get exactly one success
//!   and one [`Error::DoubleFree`], never two failures.
//! * `check_held` reads each slot once without locks: exact for slots the caller owns (which
//!   nobody else may change), not a snapshot of others.
//! * `try_alloc` is linearizable with respect to the count of allocatable pages: it takes
//!   effect at its reservation CAS, and returns `Ok(false)` only when, at that read, fewer
//!   than `k` whole pages were free and not reserved by allocations in flight. A page becomes
//!   allocatable inside the `free`/`release_cached` call that makes it whole, before that call
//!   returns: an allocation that begins after such a call returned always counts its pages.
//!   Between a page's pop and `try_alloc`'s return its slots still read Free; only a caller
//!   that looks at slots it does not own can see that.
//! * No slot is ever handed to two owners: a page id is at any time in exactly one place (one
//!   shard, one allocation in flight, or out in callers' hands with not all its slots Free),
//!   and it re-enters a shard only through the single call that, under the lock of the page's
//!   stripe, made all its slots Free.
//! * [`SlotPool::available`] and [`SlotPool::allocatable`] add counters read one after the
//!   other: exact at quiescence, approximate while calls are in flight.
//!
//! A caller can still break the pool's promise by freeing slots it does not own (for example
//! slots another thread just allocated): no pool can tell those from its own.

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;

use std::fmt;
use std::sync::TryLockError;

use crossbeam_utils::CachePadded;

use crate::error::{Error, Result, SlotProblem, invalid};
use crate::slot_run::{SlotRun, run_len};
use crate::sync::{AtomicU8, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering, lock, yield_now};

const FREE: u8 = 0;
const HELD: u8 = 1;
const CACHED: u8 = 2;

/// Most slots under one lock (a stripe is `STRIPE_SLOTS / P` whole pages, at least one): a
/// run of `n` consecutive slots takes about `n / STRIPE_SLOTS` locks. 4096 (128 state words,
/// 16 cache lines): an eviction's p99 call on the Mooncake trace (about 200k slots) took 31 µs
/// with 64-slot stripes and 16 µs with 1024-slot ones (session 3); with `reclaim()` between
/// requests, 1024 -> 4096 cut the pool's locking from 1.43 to 0.73 µs and its unlocking from
/// 0.85 to 0.51 µs in calls freeing over 150k slots (three A/B runs, `--measure w4a cache`
/// with phase timers). Calls on one stripe at once stay rare: a thread allocates from its
/// home shard's page runs.
const STRIPE_SLOTS: usize = 4096;

/// The owner of one slot, as stored (`repr(u8)`, two bits) in the pool's per-slot field.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotState {
    /// 0: in the pool (its page may be on the free list, or waiting for its other slots).
    Free = FREE,
    /// 1: handed out by [`SlotPool::try_alloc`], owned by a caller.
    Held = HELD,
    /// 2: adopted by the radix tree ([`SlotPool::adopt`]).
    Cached = CACHED,
}

impl SlotState {
    fn from_u8(v: u8) -> SlotState {
        match v {
            FREE => SlotState::Free,
            HELD => SlotState::Held,
            CACHED => SlotState::Cached,
            _ => unreachable!("slot state {v}"),
        }
    }
}

/// Why a state change was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The slot is not in the pool.
    OutOfRange,
    /// The slot is listed more than once.
    Twice,
    /// The slot was in this state, not the one asked for.
    State(u8),
}

/// A concurrent pool of KV slots; see the [module docs](self) for the design and what is
/// linearizable. `Send + Sync`: share it by reference or in an `Arc`.
pub struct SlotPool {
    /// One owner per slot (the values of [`SlotState`]) as bit planes: `planes[0]` has slot
    /// `s`'s bit (bit `s % 64` of word `s / 64`) set while it is Held, `planes[1]` while it
    /// is Cached; Free is neither, and never both (so one plane's bit tells Held, or Cached,
    /// exactly). Bit `i` of a state's value is its bit in plane `i`. Changed under the slot's
    /// stripe lock, except `Free -> Held` by the allocation that popped the page. A word may
    /// hold slots of several owners, so a write to part of a word is an atomic `fetch_or` /
    /// `fetch_and` of those slots' bits only; a plain store only writes a word whose 64
    /// slots all belong to the writing call.
    planes: [Box<[AtomicU64]>; 2],
    /// Number of slots `N`.
    num_slots: usize,
    /// One spin lock per stripe of `stripe_slots` slots (0 unlocked, 1 locked).
    stripe_lock: Box<[AtomicU8]>,
    /// Slots per stripe: a whole number of pages.
    stripe_slots: usize,
    /// `log2(stripe_slots)` when that is a power of two.
    stripe_shift: Option<u32>,
    /// Per page (empty when `P == 1`), under the page's stripe lock: Free slots of a page
    /// that is not whole (0 for a whole free page and for a page all out).
    page_free: Box<[AtomicUsize]>,
    /// The free list: page ids, sharded.
    shards: Box<[CachePadded<Mutex<Vec<PageRun>>>]>,
    /// `shards.len() - 1` (a power of two minus one).
    shard_mask: usize,
    /// Pages on the shards that no allocation has reserved.
    free_pages: CachePadded<AtomicUsize>,
    /// Free slots of pages that are not whole.
    loose: CachePadded<AtomicUsize>,
    page_size: usize,
    num_pages: usize,
}

impl fmt::Debug for SlotPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotPool")
            .field("capacity", &self.capacity())
            .field("page_size", &self.page_size)
            .field("shards", &self.shards.len())
            .field("available", &self.available())
            .field("allocatable", &self.allocatable())
            .finish()
    }
}

impl SlotPool {
    /// A pool of `num_slots` slots, all Free, in pages of `page_size`, with the default number
    /// of shards (the next power of two `>= 2 * available_parallelism`, at least 4).
    ///
    /// `InvalidArgument` unless `page_size >= 1`, `num_slots >= 1`, `num_slots` is a multiple
    /// of `page_size`, and `num_slots <= 2^32` (slot ids are `u32`).
    pub fn new(num_slots: usize, page_size: usize) -> Result<SlotPool> {
        let par = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_shards(num_slots, page_size, (2 * par).max(4))
    }

    /// As [`SlotPool::new`], with `shards` rounded up to a power of two (at least 1) shards.
    pub fn with_shards(num_slots: usize, page_size: usize, shards: usize) -> Result<SlotPool> {
        Self::with_layout(num_slots, page_size, shards, STRIPE_SLOTS)
    }

    /// As [`SlotPool::with_shards`], with stripes of `stripe_max / page_size` pages (at
    /// least one page).
    fn with_layout(
        num_slots: usize,
        page_size: usize,
        shards: usize,
        stripe_max: usize,
    ) -> Result<SlotPool> {
        if page_size == 0 {
            return Err(invalid("page size must be at least 1"));
        }
        if num_slots == 0 {
            return Err(invalid("a pool needs at least one slot"));
        }
        if !num_slots.is_multiple_of(page_size) {
            return Err(invalid(format!(
                "pool size {num_slots} is not a multiple of the page size {page_size}"
            )));
        }
        if num_slots - 1 > u32::MAX as usize {
            return Err(invalid(format!(
                "pool size {num_slots} exceeds 2^32 slots (slot ids are u32)"
            )));
        }
        let num_pages = num_slots / page_size;
        let k = shards.max(1).next_power_of_two();
        let plane = || (0..num_slots.div_ceil(PER_WORD)).map(|_| AtomicU64::new(0)).collect();
        let planes = [plane(), plane()];
        let stripe_slots = (stripe_max / page_size).max(1) * page_size;
        let stripe_lock = (0..num_slots.div_ceil(stripe_slots)).map(|_| AtomicU8::new(0)).collect();
        let page_free = if page_size == 1 {
            Box::default()
        } else {
            (0..num_pages).map(|_| AtomicUsize::new(0)).collect()
        };
        // Shard i gets the i-th contiguous run of pages, stored so that pops go upwards.
        let shards = (0..k)
            .map(|i| {
                let lo = i * num_pages / k;
                let hi = (i + 1) * num_pages / k;
                let mut v = Vec::new();
                push_pages_below(&mut v, lo, hi - lo);
                CachePadded::new(Mutex::new(v))
            })
            .collect();
        Ok(SlotPool {
            planes,
            num_slots,
            stripe_lock,
            stripe_slots,
            stripe_shift: stripe_slots.is_power_of_two().then(|| stripe_slots.trailing_zeros()),
            page_free,
            shards,
            shard_mask: k - 1,
            free_pages: CachePadded::new(AtomicUsize::new(num_pages)),
            loose: CachePadded::new(AtomicUsize::new(0)),
            page_size,
            num_pages,
        })
    }

    /// Number of slots `N`.
    pub fn capacity(&self) -> usize {
        self.num_slots
    }

    /// Page size `P`.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Number of shards of the free list.
    pub fn num_shards(&self) -> usize {
        self.shards.len()
    }

    /// Free slots: those of whole free pages plus the Free slots of pages still partly out.
    /// Exact at quiescence, so that then `available() + held + cached == capacity()`.
    pub fn available(&self) -> usize {
        let pages = self.free_pages.load(Ordering::Acquire);
        let loose = self.loose.load(Ordering::Acquire);
        (pages * self.page_size + loose).min(self.capacity())
    }

    /// Slots [`SlotPool::try_alloc`] could hand out now: whole free pages times `P` (equal to
    /// [`SlotPool::available`] when `P == 1` or no page is partly freed). Exact at quiescence.
    pub fn allocatable(&self) -> usize {
        self.free_pages.load(Ordering::Acquire) * self.page_size
    }

    /// Allocates `n` slots, all or nothing, appending them to `out` in whole pages (`P`
    /// consecutive slots starting at a multiple of `P`) and marking them Held.
    ///
    /// `Ok(false)`, appending nothing and changing nothing, when fewer than `n` slots can be
    /// allocated (see [`SlotPool::allocatable`]). `n == 0` is `Ok(true)`. `InvalidArgument`
    /// when `n` is not a multiple of the page size.
    pub fn try_alloc(&self, n: usize, out: &mut Vec<u32>) -> Result<bool> {
        let Some(pages) = self.alloc_pages(n, |n| out.reserve(n))? else {
            return Ok(false);
        };
        for r in pages {
            let (a, e) = self.slots_of(r);
            out.extend(a as u32..=(e - 1) as u32);
        }
        Ok(true)
    }

    /// [`SlotPool::try_alloc`] appending the slots to `out` as runs of consecutive slots
    /// (ascending within a run; neighbours that continue one another are joined, also with
    /// the run `out` ends with): O(runs) to hand out instead of O(slots). A pool hands out
    /// long runs (a fresh pool one run per shard it takes from).
    pub fn try_alloc_runs(&self, n: usize, out: &mut Vec<SlotRun>) -> Result<bool> {
        let Some(pages) = self.alloc_pages(n, |_| {})? else {
            return Ok(false);
        };
        for r in pages {
            let (a, e) = self.slots_of(r);
            // Runs of at most 2^31 slots, so that `len` fits and joins stay in range.
            let mut at = a;
            while at < e {
                let m = (e - at).min(1 << 31);
                SlotRun::push_joined(out, at as u32, m as u32);
                at += m;
            }
        }
        Ok(true)
    }

    /// The allocation behind both variants: checks `n`, calls `prepare(n)` (to make room
    /// before anything changes), reserves and pops `n / P` pages and marks their slots Held.
    /// Returns the runs of pages popped, in order, or `None` (nothing changed) when fewer
    /// pages are allocatable.
    fn alloc_pages(&self, n: usize, prepare: impl FnOnce(usize)) -> Result<Option<Vec<PageRun>>> {
        let p = self.page_size;
        if !n.is_multiple_of(p) {
            return Err(invalid(format!(
                "cannot allocate {n} slots: not a multiple of the page size {p}"
            )));
        }
        if n == 0 {
            return Ok(Some(Vec::new()));
        }
        let k = n / p;
        if k > self.num_pages {
            return Ok(None);
        }
        prepare(n);
        if !self.reserve(k) {
            return Ok(None);
        }
        let mut pages = Vec::new();
        self.pop_pages(k, &mut pages);
        debug_assert_eq!(pages.iter().map(|r| r.len as usize).sum::<usize>(), k);
        for &r in &pages {
            let (a, e) = self.slots_of(r);
            self.store_range(a, e, FREE, HELD);
        }
        Ok(Some(pages))
    }

    /// The slots `a..e` of a run of pages.
    fn slots_of(&self, r: PageRun) -> (usize, usize) {
        let p = self.page_size;
        (r.start as usize * p, (r.start as usize + r.len as usize) * p)
    }

    /// Takes `k` pages off `free_pages` (all or none); false if fewer are there.
    fn reserve(&self, k: usize) -> bool {
        // Acquire: pairs with the Release increment of the frees whose pages we count, so
        // their pushes happen before our pops.
        let mut cur = self.free_pages.load(Ordering::Relaxed);
        loop {
            if cur < k {
                return false;
            }
            match self.free_pages.compare_exchange_weak(
                cur,
                cur - k,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Returns Held slots to the pool (`Held -> Free`). A page goes back to the free list once
    /// all `P` of its slots are Free; its slots may be freed in separate calls.
    ///
    /// Refused whole, changing nothing: [`Error::Slot`] if any slot is outside the pool;
    /// [`Error::DoubleFree`] if any is not Held (Free already, or Cached by the tree) or is
    /// listed twice.
    pub fn free(&self, slots: &[u32]) -> Result<()> {
        self.change(slots, HELD, FREE).map_err(|(slot, why)| match why {
            Refusal::OutOfRange => self.out_of_range(slot),
            Refusal::Twice | Refusal::State(_) => Error::DoubleFree { slot },
        })
    }

    /// The state of `slot`, or `None` if it is outside the pool.
    pub fn state(&self, slot: u32) -> Option<SlotState> {
        let s = slot as usize;
        if s >= self.capacity() {
            return None;
        }
        let stripe = self.stripe_of(s);
        self.lock_stripe(stripe);
        let v = self.load_state(s, Ordering::Acquire);
        self.unlock_stripe(stripe);
        Some(SlotState::from_u8(v))
    }

    /// [`SlotPool::state`] of each of `slots` (each inside the pool), in order, into `out`:
    /// one stripe lock at a time, taken once for each stretch of slots in that stripe.
    pub(crate) fn states(&self, slots: &[u32], out: &mut Vec<SlotState>) {
        out.clear();
        let mut held: Option<usize> = None;
        for &slot in slots {
            let s = slot as usize;
            let stripe = self.stripe_of(s);
            if held != Some(stripe) {
                if let Some(h) = held {
                    self.unlock_stripe(h);
                }
                self.lock_stripe(stripe);
                held = Some(stripe);
            }
            out.push(SlotState::from_u8(self.load_state(s, Ordering::Acquire)));
        }
        if let Some(h) = held {
            self.unlock_stripe(h);
        }
    }

    /// Hands Held slots over to the tree (`Held -> Cached`).
    ///
    /// Refused whole, changing nothing, with [`Error::Slot`] if any slot is outside the
    /// pool, not Held, or listed twice.
    pub fn adopt(&self, slots: &[u32]) -> Result<()> {
        self.change(slots, HELD, CACHED)
            .map_err(|(slot, why)| self.refusal(slot, why, SlotState::Held))
    }

    /// Takes back slots the tree evicted (`Cached -> Free`), returning whole pages to the
    /// free list as [`SlotPool::free`] does.
    ///
    /// Refused whole, changing nothing, with [`Error::Slot`] if any slot is outside the
    /// pool, not Cached, or listed twice.
    pub fn release_cached(&self, slots: &[u32]) -> Result<()> {
        self.change(slots, CACHED, FREE)
            .map_err(|(slot, why)| self.refusal(slot, why, SlotState::Cached))
    }

    /// [`SlotPool::release_cached`] for slots given as runs (as
    /// [`crate::RadixTree::evict_runs`] hands them out): O(runs + slots / 32) instead of
    /// O(slots), and the same refusals (a slot in two runs is "listed twice"). The runs may
    /// come in any order.
    pub fn release_cached_runs(&self, runs: &[SlotRun]) -> Result<()> {
        let mut own = Vec::with_capacity(runs.len());
        let ascending = self.take_runs(runs, FREE, &mut own)?;
        self.apply_runs(own, ascending, CACHED)
            .map_err(|(slot, why)| self.refusal(slot, why, SlotState::Cached))
    }

    /// [`SlotPool::free`] for slots given as runs (as [`SlotPool::try_alloc_runs`] hands
    /// them out): O(runs + slots / 32), the same refusals (a slot in two runs is listed
    /// twice; an empty run is `InvalidArgument`).
    pub fn free_runs(&self, runs: &[SlotRun]) -> Result<()> {
        let mut own = Vec::with_capacity(runs.len());
        let ascending = self.take_runs(runs, FREE, &mut own)?;
        self.apply_runs(own, ascending, HELD).map_err(|(slot, why)| match why {
            Refusal::OutOfRange => self.out_of_range(slot),
            Refusal::Twice | Refusal::State(_) => Error::DoubleFree { slot },
        })
    }

    /// [`SlotPool::settle`] for slots given as runs: the same all-or-nothing step and
    /// refusals, O(runs + slots / 32).
    pub fn settle_runs(&self, adopt: &[SlotRun], free: &[SlotRun]) -> Result<()> {
        let mut own = Vec::with_capacity(adopt.len() + free.len());
        let a = self.take_runs(adopt, CACHED, &mut own)?;
        let b = self.take_runs(free, FREE, &mut own)?;
        self.apply_runs(own, a && b, HELD)
            .map_err(|(slot, why)| self.refusal(slot, why, SlotState::Held))
    }

    /// Appends `runs` to `own`, all going to `to`: `InvalidArgument` for an empty run or one
    /// reaching past the pool. Returns whether `own` still ascends (each run starting past
    /// the end of the one before), so that sorting can be skipped.
    fn take_runs(&self, runs: &[SlotRun], to: u8, own: &mut Vec<Run>) -> Result<bool> {
        let mut ascending = true;
        let mut prev_end = own.last().map_or(0, |r| r.end);
        for r in runs {
            let (start, end) = (r.start as usize, r.start as usize + r.len as usize);
            if r.len == 0 {
                return Err(invalid(format!("empty slot run at {}", r.start)));
            }
            if end > self.capacity() {
                let first_out = start.max(self.capacity()) as u32;
                return Err(self.out_of_range(first_out));
            }
            ascending &= start >= prev_end;
            prev_end = end;
            own.push(Run { start, end, to });
        }
        Ok(ascending)
    }

    /// The pool half of an insert, as one all-or-nothing step: `adopt` go to the tree
    /// (`Held -> Cached`) and `free` back to the pool (`Held -> Free`).
    ///
    /// Refused whole, changing nothing, with [`Error::Slot`] if any slot of either list is
    /// outside the pool, not Held (free, or cached by the tree), or listed twice in either
    /// or both lists.
    pub fn settle(&self, adopt: &[u32], free: &[u32]) -> Result<()> {
        self.change_lists(&[(adopt, CACHED), (free, FREE)], HELD)
            .map_err(|(slot, why)| self.refusal(slot, why, SlotState::Held))
    }

    /// Checks, changing nothing, that every slot is in the pool, Held, and listed once (to
    /// validate an insert before it mutates); [`Error::Slot`] naming the first offender.
    ///
    /// Reads each slot once, without locks: exact for slots the caller owns, which nobody
    /// else may change; not a snapshot of slots others are changing.
    pub fn check_held(&self, slots: &[u32]) -> Result<()> {
        for &s in slots {
            if s as usize >= self.capacity() {
                return Err(self.out_of_range(s));
            }
        }
        for &s in slots {
            let v = self.load_state(s as usize, Ordering::Acquire);
            if v != HELD {
                return Err(self.refusal(s, Refusal::State(v), SlotState::Held));
            }
        }
        if let Some(s) = first_duplicate(slots) {
            return Err(self.refusal(s, Refusal::Twice, SlotState::Held));
        }
        Ok(())
    }

    /// [`SlotPool::settle`]'s checks alone, changing nothing (an insert asks this before it
    /// changes the tree's shape): the error `settle` would give, or `Ok`. Reads without
    /// locks, as [`SlotPool::check_held`] does.
    pub fn check_settle(&self, adopt: &[u32], free: &[u32]) -> Result<()> {
        if free.is_empty() {
            return self.check_held(adopt);
        }
        let mut all = Vec::with_capacity(adopt.len() + free.len());
        all.extend_from_slice(adopt);
        all.extend_from_slice(free);
        self.check_held(&all)
    }

    /// [`SlotPool::settle_runs`]'s checks alone, changing nothing: O(runs log runs) plus a
    /// word of the Held plane per 64 slots. Reads without locks, as
    /// [`SlotPool::check_held`] does.
    pub fn check_settle_runs(&self, adopt: &[SlotRun], free: &[SlotRun]) -> Result<()> {
        let mut own = Vec::with_capacity(adopt.len() + free.len());
        let a = self.take_runs(adopt, CACHED, &mut own)?;
        let b = self.take_runs(free, FREE, &mut own)?;
        if !(a && b) {
            sort_runs(&mut own).map_err(|(slot, why)| self.refusal(slot, why, SlotState::Held))?;
        }
        for r in &own {
            if let Some(s) = self.first_not_held(r.start, r.end) {
                let why = Refusal::State(self.load_state(s, Ordering::Acquire));
                return Err(self.refusal(s as u32, why, SlotState::Held));
            }
        }
        Ok(())
    }

    /// The first slot of `a..e` (non-empty) that is not Held, by whole words of the Held
    /// plane (a slot is Held exactly when its bit there is set).
    fn first_not_held(&self, a: usize, e: usize) -> Option<usize> {
        let held = &self.planes[(HELD >> 1) as usize];
        let (first, last) = (a / PER_WORD, (e - 1) / PER_WORD);
        let miss = |w: usize, mask: u64| {
            let x = !held[w].load(Ordering::Acquire) & mask;
            (x != 0).then(|| w * PER_WORD + x.trailing_zeros() as usize)
        };
        if first == last {
            return miss(first, field_mask(a % PER_WORD, (e - 1) % PER_WORD + 1));
        }
        miss(first, field_mask(a % PER_WORD, PER_WORD))
            .or_else(|| (first + 1..last).find_map(|w| miss(w, !0)))
            .or_else(|| miss(last, field_mask(0, (e - 1) % PER_WORD + 1)))
    }

    fn out_of_range(&self, slot: u32) -> Error {
        Error::Slot { slot, problem: SlotProblem::OutsidePool { capacity: self.capacity() } }
    }

    /// The error for `slot` refused as `why` by a call that needs it `wanted`.
    fn refusal(&self, slot: u32, why: Refusal, wanted: SlotState) -> Error {
        let problem = match why {
            Refusal::OutOfRange => return self.out_of_range(slot),
            Refusal::Twice => SlotProblem::ListedTwice,
            Refusal::State(v) => {
                let found = match v {
                    FREE => SlotState::Free,
                    HELD => SlotState::Held,
                    _ => SlotState::Cached,
                };
                SlotProblem::State { found, wanted }
            }
        };
        Error::Slot { slot, problem }
    }

    /// Moves every slot from `from` to `to` (`to == FREE` gives whole pages back), or none.
    fn change(&self, slots: &[u32], from: u8, to: u8) -> std::result::Result<(), (u32, Refusal)> {
        self.change_lists(&[(slots, to)], from)
    }

    /// Moves every slot of every list from `from` to its list's target, or none: the lists
    /// become ascending runs of consecutive slots, whose stripes are locked in ascending
    /// order (strict two-phase locking), checked, changed, and unlocked.
    fn change_lists(
        &self,
        lists: &[(&[u32], u8)],
        from: u8,
    ) -> std::result::Result<(), (u32, Refusal)> {
        let mut runs = Vec::new();
        let mut ascending = true;
        for &(slots, to) in lists {
            ascending &= self.push_runs(slots, to, &mut runs)?;
        }
        if runs.is_empty() {
            return Ok(());
        }
        self.apply_runs(runs, ascending, from)
    }

    /// [`SlotPool::change_lists`] for runs already made: sorts them unless `ascending`
    /// (refusing a slot in two runs), then locks, checks, changes and unlocks.
    fn apply_runs(
        &self,
        mut runs: Vec<Run>,
        ascending: bool,
        from: u8,
    ) -> std::result::Result<(), (u32, Refusal)> {
        if runs.is_empty() {
            return Ok(());
        }
        if !ascending {
            sort_runs(&mut runs)?;
        }
        self.lock_runs(&runs);
        // One pass checks and changes each word; a slot that is not `from` undoes what the
        // pass changed before the unlock, so no caller that takes a stripe lock ever sees it.
        for (i, r) in runs.iter().enumerate() {
            if let Err((bad, changed_to)) = self.swap_range(r.start, r.end, from, r.to) {
                for q in &runs[..i] {
                    self.store_range(q.start, q.end, q.to, from);
                }
                if changed_to > r.start {
                    self.store_range(r.start, changed_to, r.to, from);
                }
                let why = Refusal::State(self.load_state(bad, Ordering::Relaxed));
                self.unlock_runs(&runs);
                return Err((bad as u32, why));
            }
        }
        let frees = runs.iter().any(|r| r.to == FREE);
        if !frees {
            self.unlock_runs(&runs);
            return Ok(());
        }
        let (completed, left) = self.count_freed_locked(&runs);
        self.unlock_runs(&runs);
        self.push_pages(&runs, &completed, left);
        Ok(())
    }

    /// Appends `slots` to `runs` as maximal runs of consecutive ids, all going to `to`;
    /// `OutOfRange` (naming the first such slot, in the order given) if any is outside the
    /// pool. Returns whether `runs` still ascends (each run starts past the end of the one
    /// before), so that sorting them can be skipped.
    fn push_runs(
        &self,
        slots: &[u32],
        to: u8,
        runs: &mut Vec<Run>,
    ) -> std::result::Result<bool, (u32, Refusal)> {
        let mut ascending = true;
        let mut prev_end = runs.last().map_or(0, |r| r.end);
        let mut i = 0;
        while i < slots.len() {
            let len = run_len(&slots[i..]);
            let start = slots[i] as usize;
            let run = Run { start, end: start + len, to };
            if run.end > self.capacity() {
                let &s = slots.iter().find(|&&s| s as usize >= self.capacity()).unwrap();
                return Err((s, Refusal::OutOfRange));
            }
            ascending &= start >= prev_end;
            prev_end = run.end;
            runs.push(run);
            i += len;
        }
        Ok(ascending)
    }

    /// The stripe (lock) of `slot`.
    fn stripe_of(&self, slot: usize) -> usize {
        match self.stripe_shift {
            Some(shift) => slot >> shift,
            None => slot / self.stripe_slots,
        }
    }

    /// Locks the stripes of `runs` (ascending, disjoint) in ascending order, each once,
    /// waiting for each.
    fn lock_runs(&self, runs: &[Run]) {
        let mut next = 0;
        for r in runs {
            let last = self.stripe_of(r.end - 1);
            for stripe in self.stripe_of(r.start).max(next)..=last {
                self.lock_stripe(stripe);
            }
            next = last + 1;
        }
    }

    /// Unlocks what [`SlotPool::lock_runs`] locked.
    fn unlock_runs(&self, runs: &[Run]) {
        let mut next = 0;
        for r in runs {
            let last = self.stripe_of(r.end - 1);
            for stripe in self.stripe_of(r.start).max(next)..=last {
                self.unlock_stripe(stripe);
            }
            next = last + 1;
        }
    }

    /// The state of slot `s`, read without locks.
    fn load_state(&self, s: usize, order: Ordering) -> u8 {
        let bit =
            |p: usize| ((self.planes[p][s / PER_WORD].load(order) >> (s % PER_WORD)) & 1) as u8;
        bit(0) | bit(1) << 1
    }

    /// The first slot of `a..e` (non-empty) whose state is not `from`, if any.
    #[cfg(all(test, not(loom)))] // used by the unit tests, not the loom models
    fn first_not(&self, a: usize, e: usize, from: u8) -> Option<usize> {
        (a..e).find(|&s| self.load_state(s, Ordering::Relaxed) != from)
    }

    /// With the stripes of `a..e` (non-empty) locked: checks and moves its slots from `from`
    /// (Held or Cached) to `to` a word at a time, in one pass. The check reads `from`'s plane
    /// only (its bit alone tells the state, as no slot is in both); the change clears that
    /// plane's bits and sets `to`'s (whole words by a store, the partial words at either end
    /// by a `fetch_and` / `fetch_or` of their slots' bits). At the first slot that is not
    /// `from` it stops with that slot and the end of what it changed (`a..changed_to`, for
    /// the caller to undo).
    fn swap_range(
        &self,
        a: usize,
        e: usize,
        from: u8,
        to: u8,
    ) -> std::result::Result<(), (usize, usize)> {
        debug_assert!(from == HELD || from == CACHED, "checked moves start Held or Cached");
        debug_assert_ne!(from, to);
        let check = &self.planes[(from >> 1) as usize];
        let set = (to != FREE).then(|| &self.planes[(to >> 1) as usize]);
        let (first, last) = (a / PER_WORD, (e - 1) / PER_WORD);
        // Checks and changes the slots of word `w` under `mask`; `done` is where the
        // changes made so far end.
        let part = |w: usize, mask: u64, done: usize| {
            let x = !check[w].load(Ordering::Relaxed) & mask;
            if x != 0 {
                return Err((w * PER_WORD + x.trailing_zeros() as usize, done));
            }
            if mask == !0 {
                check[w].store(0, Ordering::Release);
                if let Some(p) = set {
                    p[w].store(!0, Ordering::Release);
                }
            } else {
                check[w].fetch_and(!mask, Ordering::Release);
                if let Some(p) = set {
                    p[w].fetch_or(mask, Ordering::Release);
                }
            }
            Ok(())
        };
        if first == last {
            return part(first, field_mask(a % PER_WORD, (e - 1) % PER_WORD + 1), a);
        }
        part(first, field_mask(a % PER_WORD, PER_WORD), a)?;
        for w in first + 1..last {
            part(w, !0, w * PER_WORD)?;
        }
        part(last, field_mask(0, (e - 1) % PER_WORD + 1), last * PER_WORD)
    }

    /// Moves the slots `a..e` (non-empty), all `from` and all the caller's, to `to`: in each
    /// plane whose bit differs between the two, whole words by a store, the partial words at
    /// either end by a `fetch_and` / `fetch_or` of their slots' bits (other calls may be
    /// changing the word's other slots).
    fn store_range(&self, a: usize, e: usize, from: u8, to: u8) {
        let (first, last) = (a / PER_WORD, (e - 1) / PER_WORD);
        for (i, plane) in self.planes.iter().enumerate() {
            let (f, t) = ((from >> i) & 1, (to >> i) & 1);
            if f == t {
                continue;
            }
            let part = |w: usize, mask: u64| {
                if mask == !0 {
                    plane[w].store(if t == 1 { !0 } else { 0 }, Ordering::Release);
                } else if t == 1 {
                    plane[w].fetch_or(mask, Ordering::Release);
                } else {
                    plane[w].fetch_and(!mask, Ordering::Release);
                }
            };
            if first == last {
                part(first, field_mask(a % PER_WORD, (e - 1) % PER_WORD + 1));
                continue;
            }
            part(first, field_mask(a % PER_WORD, PER_WORD));
            for w in first + 1..last {
                part(w, !0);
            }
            part(last, field_mask(0, (e - 1) % PER_WORD + 1));
        }
    }

    /// With the stripes of `runs` (ascending, disjoint) locked and the slots of the runs
    /// going to Free just made Free: updates the counts of the pages those runs cover in
    /// part, and returns the pages so made whole and how many Free slots they had before
    /// (to leave `loose` once the pages are pushed). Pages a run covers whole need no count
    /// (all their slots were `from`, not Free, so their count is 0): [`SlotPool::push_pages`]
    /// finds them from the runs.
    ///
    /// The Free slots other calls had left on a page made whole leave `loose`. The slots left
    /// on pages not yet whole join `loose` before the unlock, so before any call that could
    /// complete their page.
    fn count_freed_locked(&self, runs: &[Run]) -> (Vec<u32>, usize) {
        let p = self.page_size;
        let mut completed = Vec::new();
        if p == 1 {
            return (completed, 0);
        }
        let (mut joined, mut left) = (0, 0);
        // The page being counted and the slots this call frees on it (pieces of one page may
        // come from several runs, in order).
        let mut cur: Option<(usize, usize)> = None;
        let mut flush = |cur: Option<(usize, usize)>, completed: &mut Vec<u32>| {
            let Some((page, n)) = cur else { return };
            let count = &self.page_free[page];
            let before = count.load(Ordering::Relaxed);
            if before + n == p {
                count.store(0, Ordering::Relaxed);
                completed.push(page as u32);
                left += before;
            } else {
                count.store(before + n, Ordering::Relaxed);
                joined += n;
            }
        };
        for r in runs.iter().filter(|r| r.to == FREE) {
            let (a, e) = (r.start, r.end);
            let head_end = e.min(a.next_multiple_of(p));
            let tail_start = head_end.max(e / p * p);
            for (lo, hi) in [(a, head_end), (tail_start, e)] {
                if lo == hi {
                    continue;
                }
                let page = lo / p;
                match &mut cur {
                    Some((q, n)) if *q == page => *n += hi - lo,
                    _ => flush(cur.replace((page, hi - lo)), &mut completed),
                }
            }
        }
        flush(cur, &mut completed);
        if joined > 0 {
            self.loose.fetch_add(joined, Ordering::AcqRel);
        }
        (completed, left)
    }

    /// Puts pages made whole onto the home shard (one lock for the call), then counts them as
    /// allocatable: `completed`, and every page a run going to Free covers whole; `left` Free
    /// slots `completed` had before this call leave `loose`.
    ///
    /// The runs' pages go on highest first, so that later pops (from the top) hand them out
    /// ascending again: long runs stay long.
    fn push_pages(&self, runs: &[Run], completed: &[u32], left: usize) {
        let p = self.page_size;
        let whole = |r: &Run| {
            let lo = r.start.div_ceil(p);
            let hi = r.end / p;
            lo..hi.max(lo)
        };
        let frees = || runs.iter().filter(|r| r.to == FREE);
        let pushed = completed.len() + frees().map(|r| whole(r).len()).sum::<usize>();
        if pushed > 0 {
            let mut shard = self.lock_home();
            for &page in completed.iter().rev() {
                push_pages_below(&mut shard, page as usize, 1);
            }
            for r in frees().rev() {
                let w = whole(r);
                push_pages_below(&mut shard, w.start, w.len());
            }
            drop(shard);
            // Release: the push happens before any allocation that counts these pages.
            self.free_pages.fetch_add(pushed, Ordering::Release);
        }
        if left > 0 {
            self.loose.fetch_sub(left, Ordering::AcqRel);
        }
    }

    fn try_lock_stripe(&self, stripe: usize) -> bool {
        self.stripe_lock[stripe]
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Takes a stripe's lock, waiting (test-and-test-and-set) while another call holds it.
    fn lock_stripe(&self, stripe: usize) {
        let mut backoff = Backoff::default();
        while !self.try_lock_stripe(stripe) {
            while self.stripe_lock[stripe].load(Ordering::Relaxed) != 0 {
                backoff.snooze();
            }
        }
    }

    fn unlock_stripe(&self, stripe: usize) {
        self.stripe_lock[stripe].store(0, Ordering::Release);
    }

    /// Locks the calling thread's home shard, moving home once if it is contended.
    fn lock_home(&self) -> MutexGuard<'_, Vec<PageRun>> {
        let home = probe() & self.shard_mask;
        if let Some(g) = try_lock(&self.shards[home]) {
            return g;
        }
        let home = rehome() & self.shard_mask;
        if let Some(g) = try_lock(&self.shards[home]) {
            return g;
        }
        lock(&self.shards[home])
    }

    /// Pops `k` reserved pages, appending them to `out` as runs of page ids: home shard
    /// first, then the others; a first round skips locked shards, later rounds wait for them.
    fn pop_pages(&self, k: usize, out: &mut Vec<PageRun>) {
        fn take(v: &mut Vec<PageRun>, need: &mut usize, out: &mut Vec<PageRun>) {
            while *need > 0 {
                let Some(top) = v.last_mut() else { return };
                let t = (*need).min(top.len as usize) as u32;
                out.push(PageRun { start: top.start, len: t });
                top.start += t;
                top.len -= t;
                if top.len == 0 {
                    v.pop();
                }
                *need -= t as usize;
            }
        }
        let mut need = k;
        let mask = self.shard_mask;
        let home = probe();
        for i in 0..=mask {
            match try_lock(&self.shards[(home + i) & mask]) {
                Some(mut g) => take(&mut g, &mut need, out),
                None if i == 0 => {
                    rehome();
                }
                None => {}
            }
            if need == 0 {
                return;
            }
        }
        // The reservation guarantees the pages are on the shards (a free pushes before it
        // counts), maybe on shards skipped above as locked, maybe being popped by others
        // who reserved them. Each round either finds some or lets the others run.
        loop {
            for i in 0..=mask {
                take(&mut lock(&self.shards[(home + i) & mask]), &mut need, out);
                if need == 0 {
                    return;
                }
            }
            yield_now();
        }
    }
}

/// A run of free page ids on a shard: pages `start .. start + len` (`len >= 1`).
type PageRun = SlotRun;

/// Pushes pages `start .. start + n` onto a shard's stack of runs, to be popped before the
/// runs below: joined to the top run when they end where it begins (so pages pushed
/// highest first pop ascending as one run). Runs hold at most `u32::MAX` pages.
fn push_pages_below(v: &mut Vec<PageRun>, start: usize, mut n: usize) {
    while n > 0 {
        // The highest part first, so that the lowest ends on top.
        let m = n.min(u32::MAX as usize);
        let lo = start + n - m;
        match v.last_mut() {
            Some(top)
                if lo + m == top.start as usize && top.len as usize + m <= u32::MAX as usize =>
            {
                top.start = lo as u32;
                top.len += m as u32;
            }
            _ => v.push(PageRun { start: lo as u32, len: m as u32 }),
        }
        n -= m;
    }
}

/// Slots per word of a plane.
const PER_WORD: usize = 64;

const _: () = assert!(HELD == 1 && CACHED == 2 && FREE == 0, "bit i of a state is plane i");

/// The bits of slots `lo..hi` of a plane word (`lo < hi <= 64`), all ones.
fn field_mask(lo: usize, hi: usize) -> u64 {
    (!0u64 >> (64 - (hi - lo))) << lo
}

/// A run of consecutive slots `start .. end`, all going to state `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    start: usize,
    end: usize,
    to: u8,
}

/// Sorts runs by start and merges neighbours going to the same state; `Twice` naming the
/// lowest slot two runs share, if any.
#[cold]
fn sort_runs(runs: &mut Vec<Run>) -> std::result::Result<(), (u32, Refusal)> {
    runs.sort_unstable_by_key(|r| r.start);
    // A slot in two runs: the first run starting below the end of one before it starts at
    // the lowest such slot.
    let mut max_end = 0;
    for r in runs.iter() {
        if r.start < max_end {
            return Err((r.start as u32, Refusal::Twice));
        }
        max_end = max_end.max(r.end);
    }
    runs.dedup_by(|next, prev| {
        let join = prev.to == next.to && prev.end == next.start;
        if join {
            prev.end = next.end;
        }
        join
    });
    Ok(())
}

/// The first slot (in sorted order) listed twice, if any.
fn first_duplicate(slots: &[u32]) -> Option<u32> {
    if slots.len() <= 16 {
        let mut dup: Option<u32> = None;
        for (i, &s) in slots.iter().enumerate() {
            if slots[i + 1..].contains(&s) {
                dup = Some(dup.map_or(s, |d| d.min(s)));
            }
        }
        return dup;
    }
    let mut sorted = slots.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// Spin a little, then yield (always yield under loom).
#[derive(Default)]
struct Backoff(#[cfg_attr(loom, allow(dead_code))] u32);

impl Backoff {
    #[cfg(not(loom))]
    fn snooze(&mut self) {
        if self.0 < 6 {
            for _ in 0..1u32 << self.0 {
                std::hint::spin_loop();
            }
            self.0 += 1;
        } else {
            yield_now();
        }
    }

    #[cfg(loom)]
    fn snooze(&mut self) {
        yield_now();
    }
}

#[cfg(not(loom))]
thread_local! {
    /// This thread's home-shard probe (0: not chosen yet).
    static PROBE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The calling thread's home-shard probe (mask it with the shard count).
#[cfg(not(loom))]
fn probe() -> usize {
    PROBE.with(|c| {
        let mut v = c.get();
        if v == 0 {
            // Seed from the address of this thread's own cell: distinct per live thread.
            let addr = c as *const std::cell::Cell<u32> as usize as u64;
            v = ((addr >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32 | 1;
            c.set(v);
        }
        v as usize
    })
}

/// Moves the calling thread's home to another shard (xorshift step); returns the new probe.
#[cfg(not(loom))]
fn rehome() -> usize {
    let v = probe() as u32;
    let mut x = v;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    PROBE.with(|c| c.set(x));
    x as usize
}

/// Under loom every thread shares one OS thread's locals, and state kept across executions
/// would make the model nondeterministic: the home is always shard 0.
#[cfg(loom)]
fn probe() -> usize {
    0
}

/// Under loom the home never moves (see [`probe`]).
#[cfg(loom)]
fn rehome() -> usize {
    0
}
