//! The built-in KV slot pool: `N` slots in pages of `P` consecutive slots, handed out and
//! taken back by many threads at once without one global lock.
//!
//! # Slot states
//!
//! Every slot has one owner, kept in one [`AtomicU8`] per slot:
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
//! * **Sharded free list.** Free page ids live in `K` cache-padded shards, each a small
//!   `Mutex<Vec<u32>>` (`K` = the next power of two `>= 2 * available_parallelism`, at least
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
//! * **Page locks for state changes.** `free`, `adopt` and `release_cached` change slot
//!   states under per-page locks (one `AtomicU8` spin lock per page, a test-and-set), by
//!   strict two-phase locking: lock every page the call touches, check every slot, and only
//!   if all pass change them (and the page counts), then unlock. A call made of whole pages
//!   in order (what `try_alloc` hands out: the common case) costs one lock per page, not one
//!   atomic read-modify-write per slot. Locks are first taken in the order given with
//!   try-lock, never waiting; if one is taken (by another call on the same page, or because
//!   the list names a page twice) the call drops its locks and goes the second way: it sorts
//!   a copy (finding slots listed twice), and locks the pages in ascending order, waiting for
//!   each. A call waits only for a page above every page it holds, and calls on the first
//!   way never wait, so every chain of waiting ends: there is no deadlock. Waiting happens
//!   only when two calls touch one page at once.
//!
//! # Consistency
//!
//! * `free`, `adopt`, `release_cached` and `state` are linearizable with respect to the slot
//!   states: each holds the locks of all the pages it reads or changes at once (strict
//!   two-phase locking; `state` locks the slot's page), so each takes effect at an instant
//!   while it holds them all. A refused call changes nothing, and nobody saw its locks' pages
//!   in between. Two callers freeing the same slot at once therefore get exactly one success
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
//!   and it re-enters a shard only through the single call that, under the page's lock, made
//!   all its slots Free.
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

use crate::error::{Error, Result, invalid};
use crate::sync::{AtomicU8, AtomicUsize, Mutex, MutexGuard, Ordering, lock, yield_now};

const FREE: u8 = 0;
const HELD: u8 = 1;
const CACHED: u8 = 2;

/// The owner of one slot, as stored (`repr(u8)`) in the pool's per-slot `AtomicU8`.
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
    /// One owner per slot (the values of [`SlotState`]); changed under the page's lock,
    /// except `Free -> Held` by the allocation that popped the page.
    states: Box<[AtomicU8]>,
    /// One spin lock per page (0 unlocked, 1 locked).
    page_lock: Box<[AtomicU8]>,
    /// Per page (empty when `P == 1`), under the page's lock: Free slots of a page that is
    /// not whole (0 for a whole free page and for a page all out).
    page_free: Box<[AtomicUsize]>,
    /// The free list: page ids, sharded.
    shards: Box<[CachePadded<Mutex<Vec<u32>>>]>,
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
        if page_size == 0 {
            return Err(invalid("page size must be at least 1"));
        }
        if num_slots == 0 {
            return Err(invalid("a pool needs at least one slot"));
        }
        if num_slots % page_size != 0 {
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
        let states = (0..num_slots).map(|_| AtomicU8::new(FREE)).collect();
        let page_lock = (0..num_pages).map(|_| AtomicU8::new(0)).collect();
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
                let v: Vec<u32> = (lo..hi).rev().map(|p| p as u32).collect();
                CachePadded::new(Mutex::new(v))
            })
            .collect();
        Ok(SlotPool {
            states,
            page_lock,
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
        self.states.len()
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
        let p = self.page_size;
        if n % p != 0 {
            return Err(invalid(format!(
                "cannot allocate {n} slots: not a multiple of the page size {p}"
            )));
        }
        if n == 0 {
            return Ok(true);
        }
        let k = n / p;
        if k > self.num_pages {
            return Ok(false);
        }
        out.reserve(n);
        // Reserve k pages (Acquire: pairs with the Release increment of the frees whose pages
        // we count, so their pushes happen before our pops).
        let mut cur = self.free_pages.load(Ordering::Relaxed);
        loop {
            if cur < k {
                return Ok(false);
            }
            match self.free_pages.compare_exchange_weak(
                cur,
                cur - k,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        let start = out.len();
        self.pop_pages(k, out);
        debug_assert_eq!(out.len(), start + k);
        // Expand the k page ids at out[start..] into their slots in place, last page first
        // (page j's slots go to start + j*P.., at or after its own id's index start + j).
        out.resize(start + n, 0);
        for j in (0..k).rev() {
            let base = out[start + j] as usize * p;
            for i in 0..p {
                let s = base + i;
                self.states[s].store(HELD, Ordering::Release);
                out[start + j * p + i] = s as u32;
            }
        }
        Ok(true)
    }

    /// Returns Held slots to the pool (`Held -> Free`). A page goes back to the free list once
    /// all `P` of its slots are Free; its slots may be freed in separate calls.
    ///
    /// Refused whole, changing nothing: `InvalidArgument` if any slot is outside the pool;
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
        let a = self.states.get(slot as usize)?;
        let page = slot as usize / self.page_size;
        self.lock_page(page);
        let v = a.load(Ordering::Acquire);
        self.unlock_page(page);
        Some(SlotState::from_u8(v))
    }

    /// Hands Held slots over to the tree (`Held -> Cached`).
    ///
    /// Refused whole, changing nothing, with `InvalidArgument` if any slot is outside the
    /// pool, not Held, or listed twice.
    pub fn adopt(&self, slots: &[u32]) -> Result<()> {
        self.change(slots, HELD, CACHED).map_err(|(slot, why)| self.refusal(slot, why, "held"))
    }

    /// Takes back slots the tree evicted (`Cached -> Free`), returning whole pages to the
    /// free list as [`SlotPool::free`] does.
    ///
    /// Refused whole, changing nothing, with `InvalidArgument` if any slot is outside the
    /// pool, not Cached, or listed twice.
    pub fn release_cached(&self, slots: &[u32]) -> Result<()> {
        self.change(slots, CACHED, FREE).map_err(|(slot, why)| self.refusal(slot, why, "cached"))
    }

    /// The pool half of an insert, as one all-or-nothing step: `adopt` go to the tree
    /// (`Held -> Cached`) and `free` back to the pool (`Held -> Free`).
    ///
    /// Refused whole, changing nothing, with `InvalidArgument` if any slot of either list is
    /// outside the pool, not Held (free, or cached by the tree), or listed twice in either
    /// or both lists.
    pub fn settle(&self, adopt: &[u32], free: &[u32]) -> Result<()> {
        let r = if free.is_empty() {
            self.change(adopt, HELD, CACHED)
        } else if adopt.is_empty() {
            self.change(free, HELD, FREE)
        } else {
            self.settle_sorted(adopt, free)
        };
        r.map_err(|(slot, why)| self.refusal(slot, why, "held"))
    }

    /// Checks, changing nothing, that every slot is in the pool, Held, and listed once (to
    /// validate an insert before it mutates); `InvalidArgument` naming the first offender.
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
            let v = self.states[s as usize].load(Ordering::Acquire);
            if v != HELD {
                return Err(self.refusal(s, Refusal::State(v), "held"));
            }
        }
        if let Some(s) = first_duplicate(slots) {
            return Err(self.refusal(s, Refusal::Twice, "held"));
        }
        Ok(())
    }

    fn out_of_range(&self, slot: u32) -> Error {
        invalid(format!("slot {slot} is outside the pool of {} slots", self.capacity()))
    }

    fn refusal(&self, slot: u32, why: Refusal, wanted: &str) -> Error {
        match why {
            Refusal::OutOfRange => self.out_of_range(slot),
            Refusal::Twice => invalid(format!("slot {slot} is listed twice")),
            Refusal::State(v) => invalid(format!(
                "slot {slot} is {}, not {wanted}",
                match v {
                    FREE => "free",
                    HELD => "held by a caller",
                    _ => "cached by the tree",
                }
            )),
        }
    }

    /// Moves every slot from `from` to `to` (`to == FREE` gives whole pages back), or none.
    fn change(&self, slots: &[u32], from: u8, to: u8) -> std::result::Result<(), (u32, Refusal)> {
        if let Some(&s) = slots.iter().find(|&&s| s as usize >= self.capacity()) {
            return Err((s, Refusal::OutOfRange));
        }
        let p = self.page_size;
        if slots.len() % p == 0 && slots.chunks_exact(p).all(is_whole_page) {
            // First way: whole pages in order; try-lock each, never waiting.
            let pages = slots.chunks_exact(p).map(|c| c[0] as usize / p);
            let mut locked = 0;
            for page in pages.clone() {
                if !self.try_lock_page(page) {
                    break;
                }
                locked += 1;
            }
            if locked < slots.len() / p {
                pages.take(locked).for_each(|page| self.unlock_page(page));
                return self.change_sorted(slots, from, to);
            }
            let checked = self.check_locked(slots, from);
            if checked.is_ok() {
                for &s in slots {
                    self.states[s as usize].store(to, Ordering::Release);
                }
            }
            pages.clone().for_each(|page| self.unlock_page(page));
            checked?;
            if to == FREE {
                // Every slot of these pages was `from` (not Free): their counts are 0.
                self.push_pages(pages.map(|page| page as u32), 0);
            }
            return Ok(());
        }
        self.change_sorted(slots, from, to)
    }

    /// Second way: on a sorted copy, locking pages in ascending order and waiting for each.
    #[cold]
    fn change_sorted(
        &self,
        slots: &[u32],
        from: u8,
        to: u8,
    ) -> std::result::Result<(), (u32, Refusal)> {
        let p = self.page_size;
        let mut sorted = slots.to_vec();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err((w[0], Refusal::Twice));
        }
        // The pages touched, ascending, each with its slots in the call.
        let groups = || sorted.chunk_by(|a, b| *a as usize / p == *b as usize / p);
        for g in groups() {
            self.lock_page(g[0] as usize / p);
        }
        let unlock_all = || groups().for_each(|g| self.unlock_page(g[0] as usize / p));
        if let Err(e) = self.check_locked(&sorted, from) {
            unlock_all();
            return Err(e);
        }
        for &s in &sorted {
            self.states[s as usize].store(to, Ordering::Release);
        }
        if to != FREE {
            unlock_all();
            return Ok(());
        }
        let (whole, left) = self.count_freed_locked(&sorted);
        unlock_all();
        self.push_pages(whole.into_iter(), left);
        Ok(())
    }

    /// With the pages of `sorted` (ascending, distinct slots just made Free) locked: updates
    /// the page counts and returns the pages made whole and how many Free slots they had
    /// before (to leave `loose` once the pages are pushed).
    ///
    /// A page made whole goes back; the Free slots other calls had left on it leave
    /// `loose`. The slots left on pages not yet whole join `loose` before the unlock, so
    /// before any call that could complete their page.
    fn count_freed_locked(&self, sorted: &[u32]) -> (Vec<u32>, usize) {
        let p = self.page_size;
        let mut whole = Vec::new();
        let (mut joined, mut left) = (0, 0);
        for g in sorted.chunk_by(|a, b| *a as usize / p == *b as usize / p) {
            let page = g[0] as usize / p;
            if g.len() == p {
                whole.push(page as u32);
                continue;
            }
            let count = &self.page_free[page];
            let before = count.load(Ordering::Relaxed);
            if before + g.len() == p {
                count.store(0, Ordering::Relaxed);
                whole.push(page as u32);
                left += before;
            } else {
                count.store(before + g.len(), Ordering::Relaxed);
                joined += g.len();
            }
        }
        if joined > 0 {
            self.loose.fetch_add(joined, Ordering::AcqRel);
        }
        (whole, left)
    }

    /// [`SlotPool::settle`] with both lists non-empty: the pages of both, ascending, locked
    /// together, so the two changes are one all-or-nothing step.
    fn settle_sorted(
        &self,
        adopt: &[u32],
        free: &[u32],
    ) -> std::result::Result<(), (u32, Refusal)> {
        let p = self.page_size;
        let mut all: Vec<u32> = adopt.iter().chain(free).copied().collect();
        if let Some(&s) = all.iter().find(|&&s| s as usize >= self.capacity()) {
            return Err((s, Refusal::OutOfRange));
        }
        all.sort_unstable();
        if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
            return Err((w[0], Refusal::Twice));
        }
        let groups = || all.chunk_by(|a, b| *a as usize / p == *b as usize / p);
        for g in groups() {
            self.lock_page(g[0] as usize / p);
        }
        let unlock_all = || groups().for_each(|g| self.unlock_page(g[0] as usize / p));
        if let Err(e) = self.check_locked(&all, HELD) {
            unlock_all();
            return Err(e);
        }
        for &s in adopt {
            self.states[s as usize].store(CACHED, Ordering::Release);
        }
        let mut freed = free.to_vec();
        freed.sort_unstable();
        for &s in &freed {
            self.states[s as usize].store(FREE, Ordering::Release);
        }
        let (whole, left) = self.count_freed_locked(&freed);
        unlock_all();
        self.push_pages(whole.into_iter(), left);
        Ok(())
    }

    /// With the slots' pages locked: is every slot `from`?
    fn check_locked(&self, slots: &[u32], from: u8) -> std::result::Result<(), (u32, Refusal)> {
        for &s in slots {
            let v = self.states[s as usize].load(Ordering::Relaxed);
            if v != from {
                return Err((s, Refusal::State(v)));
            }
        }
        Ok(())
    }

    /// Puts pages made whole onto the home shard, then counts them as allocatable; `left`
    /// Free slots they had before this call leave `loose`.
    fn push_pages(&self, pages: impl Iterator<Item = u32>, left: usize) {
        let mut shard: Option<MutexGuard<'_, Vec<u32>>> = None;
        let mut pushed = 0;
        for page in pages {
            shard.get_or_insert_with(|| self.lock_home()).push(page);
            pushed += 1;
        }
        drop(shard);
        if pushed > 0 {
            // Release: the push happens before any allocation that counts these pages.
            self.free_pages.fetch_add(pushed, Ordering::Release);
        }
        if left > 0 {
            self.loose.fetch_sub(left, Ordering::AcqRel);
        }
    }

    fn try_lock_page(&self, page: usize) -> bool {
        self.page_lock[page].compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Takes a page's lock, waiting (test-and-test-and-set) while another call holds it.
    fn lock_page(&self, page: usize) {
        let mut backoff = Backoff::default();
        while !self.try_lock_page(page) {
            while self.page_lock[page].load(Ordering::Relaxed) != 0 {
                backoff.snooze();
            }
        }
    }

    fn unlock_page(&self, page: usize) {
        self.page_lock[page].store(0, Ordering::Release);
    }

    /// Locks the calling thread's home shard, moving home once if it is contended.
    fn lock_home(&self) -> MutexGuard<'_, Vec<u32>> {
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

    /// Pops `k` reserved pages, appending their ids to `out`: home shard first, then the
    /// others; a first round skips locked shards, later rounds wait for them.
    fn pop_pages(&self, k: usize, out: &mut Vec<u32>) {
        fn take(v: &mut Vec<u32>, need: &mut usize, out: &mut Vec<u32>) {
            let t = (*need).min(v.len());
            out.extend(v.drain(v.len() - t..).rev());
            *need -= t;
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

/// Whether `chunk` (`P` slots) is one whole page in order: `p*P, p*P+1, .., p*P+P-1`.
fn is_whole_page(chunk: &[u32]) -> bool {
    let first = chunk[0] as usize;
    first % chunk.len() == 0 && chunk.iter().enumerate().all(|(j, &t)| t as usize == first + j)
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
