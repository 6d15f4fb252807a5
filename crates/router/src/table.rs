//! The block table: chain key -> block record with its holders, read without locks.
//!
//! A **block** is one position of one content chain: its key is the router-side chain
//! hash of the request prefix that ends with it (`key[0] = content[0]`,
//! `key[i] = xxh3_next(key[i-1], content[i])`, the namespace already in the content
//! hashes' seed), so one key names one (namespace, position, content) block. A record
//! holds the block's **member entries**, one `u32` per worker holding it (layout below):
//! three inline in the record (most blocks have few holders), the rest in an overflow
//! array that grows and shrinks by copy.
//!
//! The table is [`SHARDS`] shards of open-addressing (linear probing) tables of record
//! pointers, each tagged with a 3-bit fingerprint of its key (a probe loads only the
//! records whose fingerprint matches). Readers probe with no lock and write nothing; writers take their shard's
//! mutex for every change of a record or a table (a change is short: one entry, or one
//! rebuild).
//!
//! Publish / retire order (each step is one atomic store, so a reader sees it whole):
//! - *new block*: the record is built with its first entry, then its pointer is stored
//!   into an empty or tombstoned slot (Release); a reader that loads the pointer (Acquire)
//!   sees the record and the entry.
//! - *new entry* in a live record: an empty inline slot or an empty overflow slot is
//!   written (Release) with the whole entry. A full overflow array is copied into a larger
//!   one, the new entry written into the copy, then the copy's pointer is stored (Release)
//!   and the old array retired to the epoch (readers still scanning it see the entries as
//!   they were before the change).
//! - *entry change* (a medium added or dropped): one store of the new entry word.
//! - *entry removal*: the entry's word is stored 0. Entries never move while live: a
//!   reader scans each live entry exactly where it was put, or in a copy made under the
//!   shard lock, so it never misses a holder that did not change.
//! - *block removal* (its last entry gone): the slot gets a tombstone (Release), then the
//!   record is retired to the epoch; a reader that still holds the record reads only
//!   empty entries.
//! - *table rebuild* (growth at 3/4 of slots used, shrink below 1/8 live): the live
//!   pointers are copied into a new table, its pointer stored (Release), the old one
//!   retired. Records are shared by both (only the table is freed).

use std::mem::size_of;

use crate::sync::epoch::{Atomic, Guard, Owned, Shared};
use crate::sync::{AtomicU32, Mutex, Ordering, lock};

/// Shards of the table (a power of two): writers of different shards never meet. Under
/// loom one shard, so that a model's few blocks share one table and reach its rebuilds.
#[cfg(not(loom))]
pub(crate) const SHARDS: usize = 64;
#[cfg(loom)]
pub(crate) const SHARDS: usize = 1;
const SHARD_BITS: u32 = SHARDS.trailing_zeros();
/// Member entries inline in a record.
pub(crate) const INLINE: usize = 3;
/// Slots of a shard's smallest table (under loom 4: a fourth block rebuilds it).
#[cfg(not(loom))]
const MIN_SLOTS: usize = 8;
#[cfg(loom)]
const MIN_SLOTS: usize = 4;
/// Overflow arrays' smallest capacity (under loom 1: a fifth holder grows a non-empty
/// array, so the models reach the copy).
#[cfg(not(loom))]
const MIN_OVERFLOW: usize = 4;
#[cfg(loom)]
const MIN_OVERFLOW: usize = 1;

// --- member entry words -------------------------------------------------------------------
//
// A member entry (`AtomicU32`):
//   bits 0..=1  media held: bit 0 the device copy (GPU), bit 1 a host copy (CPU_PINNED);
//               never 0 in a live entry, so an entry word of 0 is an empty place
//   bit  2      the clear parity of the worker when the entry was made (see `workers.rs`):
//               a reader counts an entry only if it matches the parity the worker's word
//               had when the reader first met the worker
//   bits 3..=31 the worker's slot (at most 2^29 slots)

/// The device medium's bit in an entry.
pub(crate) const GPU: u32 = 1;
/// A host copy's bit in an entry.
pub(crate) const HOST: u32 = 2;
/// Both media.
pub(crate) const MEDIA: u32 = GPU | HOST;
const PARITY: u32 = 4;
const SLOT_SHIFT: u32 = 3;
/// The most worker slots an entry can name.
pub(crate) const MAX_SLOTS: u32 = 1 << (32 - SLOT_SHIFT);

/// An entry word for `slot` holding `media`, made under clear parity `parity`.
#[inline]
pub(crate) fn entry(slot: u32, parity: bool, media: u32) -> u32 {
    debug_assert!(slot < MAX_SLOTS && media != 0 && media & !MEDIA == 0);
    (slot << SLOT_SHIFT) | if parity { PARITY } else { 0 } | media
}
/// The slot an entry names.
#[inline]
pub(crate) fn entry_slot(e: u32) -> u32 {
    e >> SLOT_SHIFT
}
/// The clear parity an entry was made under.
#[inline]
pub(crate) fn entry_parity(e: u32) -> bool {
    e & PARITY != 0
}
/// The media an entry holds.
#[inline]
pub(crate) fn entry_media(e: u32) -> u32 {
    e & MEDIA
}

/// A block's overflow array of member entries (0 = empty place).
pub(crate) struct Overflow {
    entries: Box<[AtomicU32]>,
}

impl Overflow {
    fn new(cap: usize) -> Overflow {
        Overflow { entries: (0..cap).map(|_| AtomicU32::new(0)).collect() }
    }
    fn bytes(cap: usize) -> usize {
        size_of::<Overflow>() + cap * size_of::<AtomicU32>()
    }
}

/// One block: its chain key and its holders. Aligned to 16 (what the allocator gives a
/// 32-byte allocation anyway) so that a table slot's pointer has four tag bits: the
/// tombstone and a 3-bit fingerprint of the key ([`fingerprint`]).
#[repr(align(16))]
pub(crate) struct Block {
    /// The chain key (immutable).
    pub(crate) key: u64,
    inline: [AtomicU32; INLINE],
    /// Live entries in `over` (written under the shard lock only; atomic so that the
    /// record stays `Sync`, always accessed `Relaxed` by the lock holder).
    over_live: AtomicU32,
    over: Atomic<Overflow>,
}

// 32 bytes (loom's atomics are larger).
#[cfg(not(loom))]
const _: () = assert!(size_of::<Block>() == 32);

impl Block {
    /// Calls `f` with every non-empty entry word (readers: no lock, nothing written).
    /// Each entry is loaded Acquire: it pairs with the Release store that wrote it.
    #[inline]
    pub(crate) fn for_each_entry(&self, guard: &Guard, mut f: impl FnMut(u32)) {
        for e in &self.inline {
            let v = e.load(Ordering::Acquire);
            if v != 0 {
                f(v);
            }
        }
        let over = self.over.load(Ordering::Acquire, guard);
        // SAFETY: `over` was loaded under `guard`; an overflow array is retired to the
        // epoch only after its pointer was replaced, so it stays allocated while `guard`
        // is held. Null is handled by `as_ref`.
        if let Some(over) = unsafe { over.as_ref() } {
            for e in over.entries.iter() {
                let v = e.load(Ordering::Acquire);
                if v != 0 {
                    f(v);
                }
            }
        }
    }
}

impl Block {
    /// A hint: starts loading the overflow array's header, if there is one.
    #[inline]
    pub(crate) fn prefetch_overflow(&self, guard: &Guard) {
        let over = self.over.load(Ordering::Relaxed, guard);
        if !over.is_null() {
            prefetch_line(over.as_raw().cast());
        }
    }
}

struct Table {
    slots: Box<[Atomic<Block>]>,
}

impl Table {
    fn new(n: usize) -> Table {
        debug_assert!(n.is_power_of_two());
        Table { slots: (0..n).map(|_| Atomic::null()).collect() }
    }
    fn bytes(n: usize) -> usize {
        size_of::<Table>() + n * size_of::<Atomic<Block>>()
    }
}

/// A tombstone: a null pointer with tag 1 (a removed record; probes go on past it).
const TOMB: usize = 1;

/// The tag of a live slot for a key of mixed hash `h`: three bits of the hash (none of the
/// bits that pick the shard or, below 2^48 slots, the probe start) above the tombstone
/// bit, stored with the record's pointer, so a probe skips most other keys' records
/// without loading them.
#[inline]
fn fingerprint(h: u64) -> usize {
    (((h >> 48) & 7) << 1) as usize
}

/// What the lock holder keeps of a shard.
struct ShardState {
    /// Live records.
    live: usize,
    /// Live records plus tombstones.
    used: usize,
}

struct Shard {
    lock: Mutex<ShardState>,
    table: Atomic<Table>,
}

/// The outcome of a membership change: what the caller's counters should move by.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delta {
    /// Records added (1), removed (-1) or neither.
    pub(crate) blocks: i64,
    /// (block, worker, medium) holdings added or removed.
    pub(crate) memberships: i64,
    /// Heap bytes allocated (+) or retired (-).
    pub(crate) bytes: i64,
    /// An add gave an existing entry one more medium (the worker held the block already, in
    /// the other medium): what a store's grouped version bump must not run past
    /// (`RouterIndex::apply_stored`).
    pub(crate) upgraded: bool,
}

impl Delta {
    /// Adds `d`'s counter moves to these.
    #[inline]
    pub(crate) fn sum(&mut self, d: Delta) {
        self.blocks += d.blocks;
        self.memberships += d.memberships;
        self.bytes += d.bytes;
    }
}

/// A 64-bit finalizer (murmur3's): keys a caller supplies (`find_hashes`) need not be
/// well mixed.
#[inline]
fn mix(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// The sharded block table.
pub(crate) struct BlockTable {
    shards: Box<[Shard]>,
}

/// Bytes of an empty table.
pub(crate) fn empty_bytes() -> usize {
    SHARDS * (size_of::<Shard>() + Table::bytes(MIN_SLOTS))
}

impl BlockTable {
    pub(crate) fn new() -> BlockTable {
        BlockTable {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    lock: Mutex::new(ShardState { live: 0, used: 0 }),
                    table: Atomic::new(Table::new(MIN_SLOTS)),
                })
                .collect(),
        }
    }

    #[inline]
    fn shard(&self, h: u64) -> &Shard {
        // The top SHARD_BITS bits (the probe uses the low ones).
        &self.shards[h.rotate_left(SHARD_BITS) as usize & (SHARDS - 1)]
    }

    /// The record of `key`, if the block is held by anyone (readers: no lock).
    #[inline]
    pub(crate) fn get<'g>(&self, key: u64, guard: &'g Guard) -> Option<&'g Block> {
        let h = mix(key);
        let t = self.shard(h).table.load(Ordering::Acquire, guard);
        // SAFETY: a table is retired only after the shard's pointer moved to its successor,
        // and `t` was loaded under `guard`, so it is allocated while `guard` lives; a shard
        // always has a table (never null).
        let t = unsafe { t.deref() };
        find_slot(t, h, key, guard).map(|(_, b)| {
            // SAFETY: a record is retired only after its slot got a tombstone; it was loaded
            // under `guard`, so it is allocated while `guard` lives.
            unsafe { b.deref() }
        })
    }

    /// A hint: starts loading the table slot where `key`'s probe begins (`record`: also the
    /// record that slot points to, if any). No effect on what any access returns.
    #[inline]
    pub(crate) fn prefetch(&self, key: u64, record: bool, guard: &Guard) {
        let h = mix(key);
        let t = self.shard(h).table.load(Ordering::Acquire, guard);
        // SAFETY: as in `get` (loaded under `guard`, never null).
        let t = unsafe { t.deref() };
        let mask = t.slots.len() - 1;
        let i = h as usize & mask;
        let slot = &t.slots[i];
        if record {
            // The first record of the probe whose fingerprint matches (the slots the probe
            // starts with: within its cache line, most often).
            let fp = fingerprint(h);
            for j in 0..4 {
                let b = t.slots[(i + j) & mask].load(Ordering::Acquire, guard);
                if b.is_null() {
                    if b.tag() != TOMB {
                        return;
                    }
                } else if b.tag() == fp {
                    prefetch_line(b.as_raw().cast());
                    return;
                }
            }
        } else {
            prefetch_line((slot as *const Atomic<Block>).cast());
        }
    }

    /// Sets `media` in `slot`'s entry of block `key` (creating the record or the entry),
    /// the entry made under `parity`. Writers: takes the shard lock.
    pub(crate) fn add(
        &self,
        key: u64,
        slot: u32,
        parity: bool,
        media: u32,
        guard: &Guard,
    ) -> Delta {
        let h = mix(key);
        let shard = self.shard(h);
        let mut st = lock(&shard.lock);
        // SAFETY (every `deref` below): tables and records are retired only under this
        // shard's lock, which we hold, so what the shard points to now stays allocated.
        let t = unsafe { shard.table.load(Ordering::Relaxed, guard).deref() };
        if let Some((_, b)) = find_slot(t, h, key, guard) {
            let b = unsafe { b.deref() };
            return add_entry(b, slot, parity, media, guard);
        }
        // A new record, with its entry, published by one pointer store.
        let rec = Block {
            key,
            inline: [
                AtomicU32::new(entry(slot, parity, media)),
                AtomicU32::new(0),
                AtomicU32::new(0),
            ],
            over_live: AtomicU32::new(0),
            over: Atomic::null(),
        };
        let mut d = Delta {
            blocks: 1,
            memberships: media.count_ones() as i64,
            bytes: size_of::<Block>() as i64,
            upgraded: false,
        };
        if (st.used + 1) * 4 > t.slots.len() * 3 {
            let n = target(st.live + 1);
            d.bytes += rebuild(shard, &mut st, n, guard);
        }
        let t = unsafe { shard.table.load(Ordering::Relaxed, guard).deref() };
        let mask = t.slots.len() - 1;
        let mut i = h as usize & mask;
        loop {
            let s = t.slots[i].load(Ordering::Relaxed, guard);
            if s.tag() == TOMB {
                break; // a tombstone is reused (`used` already counts it)
            }
            if s.is_null() {
                st.used += 1;
                break;
            }
            i = (i + 1) & mask;
        }
        st.live += 1;
        // Publish: Release, so a reader's Acquire load of the pointer sees the record.
        t.slots[i].store(Owned::new(rec).with_tag(fingerprint(h)), Ordering::Release);
        d
    }

    /// Drops `media` from `slot`'s entry of block `key` (all of it with `MEDIA`), removing
    /// the entry when nothing is left and the record with its last entry. Returns the delta
    /// and the media the entry still holds (`None`: there was no entry).
    pub(crate) fn remove(
        &self,
        key: u64,
        slot: u32,
        media: u32,
        guard: &Guard,
    ) -> (Delta, Option<u32>) {
        let h = mix(key);
        let shard = self.shard(h);
        let mut st = lock(&shard.lock);
        // SAFETY: as in `add` (the shard lock is held).
        let t = unsafe { shard.table.load(Ordering::Relaxed, guard).deref() };
        let Some((i, bp)) = find_slot(t, h, key, guard) else {
            return (Delta::default(), None);
        };
        // SAFETY: as above.
        let b = unsafe { bp.deref() };
        let (mut d, left) = remove_entry(b, slot, media, guard);
        if left.is_some() && block_is_empty(b) {
            // Retire order: tombstone first (Release), then the record to the epoch.
            t.slots[i].store(Shared::null().with_tag(TOMB), Ordering::Release);
            st.live -= 1;
            d.blocks -= 1;
            d.bytes -= size_of::<Block>() as i64;
            // SAFETY: the record is unlinked (its slot holds a tombstone) and no writer can
            // reach it again (writers find records only through the table, under this
            // lock); readers that loaded it are pinned, and the epoch frees it after them.
            unsafe { guard.defer_destroy(bp) };
            if st.live * 8 < t.slots.len() && t.slots.len() > MIN_SLOTS {
                let n = target(st.live);
                d.bytes += rebuild(shard, &mut st, n, guard);
            }
        }
        (d, left)
    }

    /// Frees everything (the index is being dropped: no reader or writer is left).
    fn destroy(&mut self) {
        // SAFETY: `&mut self`: no other thread holds a reference into the table, so
        // nothing is pinned on any of these pointers; each is freed exactly once.
        unsafe {
            let guard = crossbeam_epoch::unprotected();
            for shard in self.shards.iter() {
                let t = shard.table.load(Ordering::Relaxed, guard);
                for s in t.deref().slots.iter() {
                    let b = s.load(Ordering::Relaxed, guard);
                    if !b.is_null() {
                        let o = b.deref().over.load(Ordering::Relaxed, guard);
                        if !o.is_null() {
                            drop(o.into_owned());
                        }
                        drop(b.into_owned());
                    }
                }
                drop(t.into_owned());
            }
        }
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        self.destroy();
    }
}

/// Asks the CPU to start loading the cache line at `p` (a hint; `p` is never dereferenced).
#[inline(always)]
pub(crate) fn prefetch_line(p: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch does not access memory architecturally: any address is allowed,
    // and SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// A table size for `live` records: at most half full.
fn target(live: usize) -> usize {
    (live * 2).next_power_of_two().max(MIN_SLOTS)
}

/// Probes `t` for `key`: the slot index and the record.
#[inline]
fn find_slot<'g>(
    t: &Table,
    h: u64,
    key: u64,
    guard: &'g Guard,
) -> Option<(usize, Shared<'g, Block>)> {
    let mask = t.slots.len() - 1;
    let mut i = h as usize & mask;
    let fp = fingerprint(h);
    for _ in 0..t.slots.len() {
        let s = t.slots[i].load(Ordering::Acquire, guard);
        if s.is_null() {
            if s.tag() != TOMB {
                return None;
            }
        } else if s.tag() == fp {
            // SAFETY: loaded under `guard` (see `BlockTable::get`).
            if unsafe { s.deref() }.key == key {
                return Some((i, s));
            }
        }
        i = (i + 1) & mask;
    }
    None
}

/// Rebuilds the shard's table at `n` slots (the shard lock held). Returns the bytes delta.
fn rebuild(shard: &Shard, st: &mut ShardState, n: usize, guard: &Guard) -> i64 {
    let old = shard.table.load(Ordering::Relaxed, guard);
    // SAFETY: the shard lock is held (see `BlockTable::add`).
    let ot = unsafe { old.deref() };
    let nt = Table::new(n);
    let mask = n - 1;
    for s in ot.slots.iter() {
        let b = s.load(Ordering::Relaxed, guard);
        if b.is_null() {
            continue;
        }
        // SAFETY: live records of the table, under the shard lock.
        let mut i = mix(unsafe { b.deref() }.key) as usize & mask;
        while !nt.slots[i].load(Ordering::Relaxed, guard).is_null() {
            i = (i + 1) & mask;
        }
        nt.slots[i].store(b, Ordering::Relaxed);
    }
    st.used = st.live;
    let delta = Table::bytes(n) as i64 - Table::bytes(ot.slots.len()) as i64;
    // Publish the copy (Release: its slots are visible with it), then retire the old table
    // (its records live on in the copy).
    shard.table.store(Owned::new(nt), Ordering::Release);
    // SAFETY: the old table is unlinked; readers pinned on it finish before the epoch frees
    // it, and dropping a `Table` frees only its slot array, never the records.
    unsafe { guard.defer_destroy(old) };
    delta
}

fn block_is_empty(b: &Block) -> bool {
    b.inline.iter().all(|e| e.load(Ordering::Relaxed) == 0)
        && b.over_live.load(Ordering::Relaxed) == 0
}

/// Adds `media` to `slot`'s entry of the live record `b` (shard lock held).
fn add_entry(b: &Block, slot: u32, parity: bool, media: u32, guard: &Guard) -> Delta {
    let mut d = Delta::default();
    let over = b.over.load(Ordering::Relaxed, guard);
    // SAFETY: the shard lock is held: overflow arrays are replaced and retired only under it.
    let over_ref = unsafe { over.as_ref() };
    let places = b.inline.iter().chain(over_ref.into_iter().flat_map(|o| o.entries.iter()));
    let mut free_inline = None;
    for (n, e) in places.enumerate() {
        let v = e.load(Ordering::Relaxed);
        if v != 0 && entry_slot(v) == slot {
            debug_assert_eq!(entry_parity(v), parity, "an entry of an older clear survived it");
            let nv = entry(slot, parity, entry_media(v) | media);
            d.memberships += (entry_media(nv) & !entry_media(v)).count_ones() as i64;
            if nv != v {
                d.upgraded = true;
                e.store(nv, Ordering::Release);
            }
            return d;
        }
        if v == 0 && n < INLINE && free_inline.is_none() {
            free_inline = Some(n);
        }
    }
    d.memberships = media.count_ones() as i64;
    let word = entry(slot, parity, media);
    if let Some(n) = free_inline {
        b.inline[n].store(word, Ordering::Release);
        return d;
    }
    if let Some(e) =
        over_ref.and_then(|o| o.entries.iter().find(|e| e.load(Ordering::Relaxed) == 0))
    {
        e.store(word, Ordering::Release);
        b.over_live.fetch_add(1, Ordering::Relaxed);
        return d;
    }
    // No room: a larger overflow array, the live entries copied in place order, the new one
    // after them; published by one pointer store, the old array retired.
    let old_cap = over_ref.map_or(0, |o| o.entries.len());
    let cap = (old_cap * 2).max(MIN_OVERFLOW);
    let n = Overflow::new(cap);
    let mut k = 0;
    if let Some(o) = over_ref {
        for e in o.entries.iter() {
            let v = e.load(Ordering::Relaxed);
            if v != 0 {
                n.entries[k].store(v, Ordering::Relaxed);
                k += 1;
            }
        }
    }
    n.entries[k].store(word, Ordering::Relaxed);
    b.over_live.store(k as u32 + 1, Ordering::Relaxed);
    b.over.store(Owned::new(n), Ordering::Release);
    d.bytes += Overflow::bytes(cap) as i64;
    if !over.is_null() {
        d.bytes -= Overflow::bytes(old_cap) as i64;
        // SAFETY: the old array is unlinked (replaced above) under the shard lock; pinned
        // readers finish with it before the epoch frees it.
        unsafe { guard.defer_destroy(over) };
    }
    d
}

/// Drops `media` from `slot`'s entry in `b` (shard lock held). Returns the delta and the
/// media left (`None`: no entry for `slot`).
fn remove_entry(b: &Block, slot: u32, media: u32, guard: &Guard) -> (Delta, Option<u32>) {
    let mut d = Delta::default();
    let over = b.over.load(Ordering::Relaxed, guard);
    // SAFETY: the shard lock is held (see `add_entry`).
    let over_ref = unsafe { over.as_ref() };
    let places = b.inline.iter().chain(over_ref.into_iter().flat_map(|o| o.entries.iter()));
    for (n, e) in places.enumerate() {
        let v = e.load(Ordering::Relaxed);
        if v == 0 || entry_slot(v) != slot {
            continue;
        }
        let left = entry_media(v) & !media;
        d.memberships -= (entry_media(v) & media).count_ones() as i64;
        if left != 0 {
            e.store(entry(slot, entry_parity(v), left), Ordering::Release);
            return (d, Some(left));
        }
        e.store(0, Ordering::Release);
        if n >= INLINE {
            let o = over_ref.expect("an overflow entry");
            let live = b.over_live.load(Ordering::Relaxed) - 1;
            b.over_live.store(live, Ordering::Relaxed);
            let cap = o.entries.len();
            if live == 0 || (live as usize * 4 <= cap && cap > MIN_OVERFLOW) {
                // Shrink (or drop) the overflow array: the live entries copied in place
                // order into a smaller one, published, the old retired.
                d.bytes -= Overflow::bytes(cap) as i64;
                if live == 0 {
                    b.over.store(Shared::null(), Ordering::Release);
                } else {
                    let ncap = (cap / 2).max(MIN_OVERFLOW);
                    let no = Overflow::new(ncap);
                    let mut k = 0;
                    for e in o.entries.iter() {
                        let v = e.load(Ordering::Relaxed);
                        if v != 0 {
                            no.entries[k].store(v, Ordering::Relaxed);
                            k += 1;
                        }
                    }
                    d.bytes += Overflow::bytes(ncap) as i64;
                    b.over.store(Owned::new(no), Ordering::Release);
                }
                // SAFETY: unlinked just above under the shard lock; pinned readers finish
                // with it before the epoch frees it.
                unsafe { guard.defer_destroy(over) };
            }
        }
        return (d, Some(0));
    }
    (d, None)
}
