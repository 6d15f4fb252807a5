//! Worker slots: what readers read of a worker (one version word, its identity) and what
//! its writer keeps (the engine-hash map, the cursor), plus the registry from
//! `(worker_id, dp_rank)` to a slot.
//!
//! # The version word
//!
//! ```text
//! bit  63      live: the slot names a worker (0: free, or its worker is being removed)
//! bit  62      clear parity: flipped by every clear of the worker; entries made under the
//!              other parity are not the worker's any more (a clear is one store of this word)
//! bits 0..=61  change count: +1 before every change of the worker's entries, every clear,
//!              removal and assignment of the slot; never reset (a reused slot goes on
//!              counting), so equal words mean "no change in between"
//! ```
//!
//! Protocol (the word is written only by the holder of the slot's state lock):
//! - *a change* of one of the worker's (block, medium) holdings: `fetch_add(1, Release)`,
//!   then the entry's Release store (`table.rs`). A reader that observes the entry's new
//!   value (Acquire) therefore reads the word at or past the increment afterwards. A store
//!   event's changes share increments: one `fetch_add` before a *segment* of them (entry
//!   stores in the store's parent-first order, each segment ending at the first change
//!   that gives an existing entry its second medium; `RouterIndex::apply_stored` says why
//!   a reader that saw part of a segment saw a block-by-block prefix state).
//! - *clear*: one Release store of the word with the count +1 and the parity flipped;
//!   then the old entries are removed from the table (no further increments: readers that
//!   met the worker before the store see a different word at their check; readers that
//!   meet it after ignore entries of the old parity).
//! - *removal*: the same with `live` cleared; the slot goes back to the free list only
//!   after every entry of it left the table.
//! - *assignment* of a free slot: the index's assignment count +1 (Release), the identity
//!   (Release), then the word with `live` set and the count +1 (Release). Readers load the
//!   identity with Acquire, so one that reads a newer identity than its first word load's
//!   sees that word changed at its check; the assignment count lets a find tell that a
//!   worker may have moved slots under it (`find.rs`, step 4).
//!
//! A reader loads the word (Acquire) when it first meets the worker, makes its trusted
//! reads of the worker's entries after that, and loads the word again at the end: equal
//! words mean the worker changed at most once during the reads (the change whose increment
//! the first load saw, whose single entry store, or segment of a store's entry stores, may
//! have landed during them), so what the reader saw is the worker's state before or after
//! that one change (for a segment: after a prefix of it). Otherwise it walks that worker
//! again.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::mem::size_of;

use crate::Worker;
use crate::sync::{AtomicU32, AtomicU64, Mutex};
use radixkv::events::wire::EventGroup;

pub(crate) const LIVE: u64 = 1 << 63;
pub(crate) const PARITY: u64 = 1 << 62;
pub(crate) const COUNT: u64 = PARITY - 1;

/// Whether a version word names a live worker.
#[inline]
pub(crate) fn live(w: u64) -> bool {
    w & LIVE != 0
}
/// A version word's clear parity.
#[inline]
pub(crate) fn parity(w: u64) -> bool {
    w & PARITY != 0
}
/// The word after one more change, with `live` and `parity` as given.
#[inline]
pub(crate) fn next_word(w: u64, live: bool, parity: bool) -> u64 {
    ((w & COUNT) + 1) & COUNT | if live { LIVE } else { 0 } | if parity { PARITY } else { 0 }
}

/// A hasher for keys that are (mostly) hashes already: one multiply-xorshift round.
#[derive(Default, Clone, Copy)]
pub(crate) struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        let k = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        k ^ (k >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(23);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
}

pub(crate) type Mix = BuildHasherDefault<MixHasher>;

/// What a worker's writer keeps (under the slot's state lock).
pub(crate) struct WorkerState {
    pub(crate) worker: Worker,
    /// The next `seq` expected (`None` before the first batch).
    pub(crate) next_seq: Option<u64>,
    /// The writer's copy of the word's clear parity.
    pub(crate) parity: bool,
    /// Engine hash -> the block it names and its media.
    pub(crate) held: HeldMap,
    /// Second (third, ...) engine names of one (chain key, medium) this worker holds: how
    /// many more names than one. Empty unless an engine names a block twice.
    pub(crate) twins: HashMap<(u64, u32), u32, Mix>,
    /// KV cache groups whose kind this worker's stores taught (`group_idx`, indexed), only
    /// where that differs from the default for a group never seen (group 0 indexed, others
    /// not): empty for a stream of one full-attention group 0.
    pub(crate) groups: Vec<(u32, bool)>,
}

impl WorkerState {
    pub(crate) fn new(worker: Worker, parity: bool) -> WorkerState {
        WorkerState {
            worker,
            next_seq: None,
            parity,
            held: HeldMap::default(),
            twins: HashMap::default(),
            groups: Vec::new(),
        }
    }

    /// Whether the prefix index takes an event (a store when `stored`) with group fields
    /// `g`, Dynamo's rule (`dynamo_kv_router::zmq_wire::ZmqEventNormalizer`): a store's
    /// kind is learned for its `group_idx` first; an event with a kind is taken when the
    /// kind is main attention (full, MLA, sink-full); one without a kind (a removal) by its
    /// group's learned kind, else when it names no group or group 0.
    pub(crate) fn takes(&mut self, stored: bool, g: &EventGroup) -> bool {
        let unlearned = |idx: u32| idx == 0;
        if let (true, Some(idx), Some(kind)) = (stored, g.group_idx, g.kind) {
            let main = kind.is_main_attention();
            let at = self.groups.iter().position(|e| e.0 == idx);
            match (at, main == unlearned(idx)) {
                (Some(i), true) => {
                    self.groups.swap_remove(i);
                }
                (Some(i), false) => self.groups[i].1 = main,
                (None, false) => self.groups.push((idx, main)),
                (None, true) => {}
            }
        }
        if let Some(kind) = g.kind {
            return kind.is_main_attention();
        }
        match g.group_idx {
            None => true,
            Some(idx) => self.groups.iter().find(|e| e.0 == idx).map_or(unlearned(idx), |e| e.1),
        }
    }

    /// Heap bytes of the state (its box and its maps' tables).
    pub(crate) fn bytes(&self) -> usize {
        size_of::<WorkerState>()
            + self.held.bytes()
            + map_bytes(self.twins.capacity(), size_of::<((u64, u32), u32)>())
            + self.groups.capacity() * size_of::<(u32, bool)>()
    }
}

/// The allocation of a std (hashbrown) table of `capacity` items of `item` bytes: buckets
/// (capacity + 1 below 8 buckets, else capacity * 8 / 7) of items, padded to 16, then one
/// control byte per bucket plus a 16-byte group.
pub(crate) fn map_bytes(capacity: usize, item: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        (capacity + 1).next_power_of_two()
    } else {
        (capacity * 8 / 7).next_power_of_two()
    };
    (buckets * item).next_multiple_of(16) + buckets + 16
}

/// A worker slot: what readers read. (The writer's state and its lock are in an array of
/// their own, `RouterIndex::states`, so that taking the lock writes no line a reader
/// reads.)
pub(crate) struct Slot {
    /// The version word (layout above).
    pub(crate) word: AtomicU64,
    /// The worker's id and dp rank (valid while the word is live; read by readers, Acquire,
    /// between their two loads of the word; stored Release before the live word).
    pub(crate) id: AtomicU64,
    pub(crate) rank: AtomicU32,
}

/// A slot's writer state (`None`: the slot is free) under its lock.
pub(crate) type StateLock = Mutex<Option<Box<WorkerState>>>;

impl Slot {
    pub(crate) fn new() -> Slot {
        Slot { word: AtomicU64::new(0), id: AtomicU64::new(0), rank: AtomicU32::new(0) }
    }
}

/// Shards of the registry (2 under loom: fewer modelled locks).
#[cfg(not(loom))]
pub(crate) const REG_SHARDS: usize = 16;
#[cfg(loom)]
pub(crate) const REG_SHARDS: usize = 2;

/// `(worker_id, dp_rank)` -> slot, and the free slots.
pub(crate) struct Registry {
    pub(crate) shards: Box<[Mutex<HashMap<Worker, u32, Mix>>]>,
    /// Slots handed back, and the next never-used slot.
    pub(crate) free: Mutex<(Vec<u32>, u32)>,
}

impl Registry {
    pub(crate) fn new() -> Registry {
        Registry {
            shards: (0..REG_SHARDS).map(|_| Mutex::new(HashMap::default())).collect(),
            free: Mutex::new((Vec::new(), 0)),
        }
    }

    pub(crate) fn shard(&self, w: Worker) -> &Mutex<HashMap<Worker, u32, Mix>> {
        let h =
            (w.worker_id ^ (w.dp_rank as u64).rotate_left(32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        &self.shards[(h >> 60) as usize % REG_SHARDS]
    }
}

/// A worker's engine-hash map: engine hash -> (chain key, media), open addressing with
/// linear probing, in two arrays: one control byte per place (0: empty; else a 6-bit
/// fingerprint of the engine hash above the 2 media bits, never 0 while held) and the
/// `(engine hash, chain key)` pairs. 17 bytes a place at most 7/8 full; a probe scans
/// control bytes (one line holds 64) and reads a pair only on a fingerprint match; a
/// removal shifts the probe run back (no tombstones). [`HeldMap::prefetch`] asks for a
/// hash's first places ahead of its lookup (the writer's chunks, `lib.rs`).
#[derive(Default)]
pub(crate) struct HeldMap {
    ctrl: Box<[u8]>,
    pairs: Box<[(u64, u64)]>,
    len: usize,
}

/// Where a probe for engine hash `e` starts, and its control byte's fingerprint bits.
#[inline]
fn held_hash(e: u64) -> (usize, u8) {
    let h = (e ^ 0x2545_f491_4f6c_dd1d).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let h = h ^ (h >> 31);
    (h as usize, ((h >> 58) as u8) << 2)
}

const HELD_MEDIA: u8 = 3;
const HELD_MIN: usize = 8;

impl HeldMap {
    /// Held engine hashes.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Heap bytes of the map (its two arrays).
    pub(crate) fn bytes(&self) -> usize {
        self.ctrl.len() * (1 + size_of::<(u64, u64)>())
    }

    /// The place of `e`, if held.
    #[inline]
    pub(crate) fn find(&self, e: u64) -> Option<usize> {
        if self.ctrl.is_empty() {
            return None;
        }
        let mask = self.ctrl.len() - 1;
        let (h, fp) = held_hash(e);
        let mut i = h & mask;
        loop {
            let c = self.ctrl[i];
            if c == 0 {
                return None;
            }
            if c & !HELD_MEDIA == fp && self.pairs[i].0 == e {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// A hint: starts loading the places where `e`'s probe begins.
    #[inline]
    pub(crate) fn prefetch(&self, e: u64) {
        if self.ctrl.is_empty() {
            return;
        }
        let i = held_hash(e).0 & (self.ctrl.len() - 1);
        crate::table::prefetch_line(self.ctrl[i..].as_ptr().cast());
        crate::table::prefetch_line(self.pairs[i..].as_ptr().cast());
    }

    /// The chain key at place `i`.
    #[inline]
    pub(crate) fn key(&self, i: usize) -> u64 {
        self.pairs[i].1
    }

    /// The media at place `i`.
    #[inline]
    pub(crate) fn media(&self, i: usize) -> u32 {
        (self.ctrl[i] & HELD_MEDIA) as u32
    }

    /// Sets the media at place `i` (not 0: see [`HeldMap::remove_at`]).
    #[inline]
    pub(crate) fn set_media(&mut self, i: usize, media: u32) {
        debug_assert!(media != 0 && media <= HELD_MEDIA as u32);
        self.ctrl[i] = (self.ctrl[i] & !HELD_MEDIA) | media as u8;
    }

    /// Adds `e`, which is not held, with `key` and `media` (not 0).
    pub(crate) fn insert_new(&mut self, e: u64, key: u64, media: u32) {
        debug_assert!(media != 0 && media <= HELD_MEDIA as u32 && self.find(e).is_none());
        if (self.len + 1) * 8 > self.ctrl.len() * 7 {
            self.grow();
        }
        self.place(e, key, media as u8);
        self.len += 1;
    }

    fn place(&mut self, e: u64, key: u64, media: u8) {
        let mask = self.ctrl.len() - 1;
        let (h, fp) = held_hash(e);
        let mut i = h & mask;
        while self.ctrl[i] != 0 {
            i = (i + 1) & mask;
        }
        self.ctrl[i] = fp | media;
        self.pairs[i] = (e, key);
    }

    fn grow(&mut self) {
        let cap = (self.ctrl.len() * 2).max(HELD_MIN);
        let ctrl = std::mem::replace(&mut self.ctrl, vec![0; cap].into_boxed_slice());
        let pairs = std::mem::replace(&mut self.pairs, vec![(0, 0); cap].into_boxed_slice());
        for (c, &(e, key)) in ctrl.iter().zip(pairs.iter()) {
            if *c != 0 {
                self.place(e, key, c & HELD_MEDIA);
            }
        }
    }

    /// Removes the entry at place `i`: the places after it in its probe run move back.
    pub(crate) fn remove_at(&mut self, mut i: usize) {
        let mask = self.ctrl.len() - 1;
        let mut j = (i + 1) & mask;
        while self.ctrl[j] != 0 {
            let home = held_hash(self.pairs[j].0).0 & mask;
            // `j` may fill the hole at `i` when its home is not in (i, j] (cyclically).
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(i) & mask) {
                self.ctrl[i] = self.ctrl[j];
                self.pairs[i] = self.pairs[j];
                i = j;
            }
            j = (j + 1) & mask;
        }
        self.ctrl[i] = 0;
        self.len -= 1;
    }

    /// Every held `(engine hash, chain key, media)`.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64, u32)> + '_ {
        self.ctrl
            .iter()
            .zip(self.pairs.iter())
            .filter(|(c, _)| **c != 0)
            .map(|(c, &(e, k))| (e, k, (c & HELD_MEDIA) as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::HeldMap;
    use std::collections::HashMap;

    #[test]
    fn held_map_equals_a_hash_map() {
        let mut m = HeldMap::default();
        let mut r: HashMap<u64, (u64, u32)> = HashMap::new();
        let mut x: u64 = 1;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct engine hashes (collisions of homes), some clustered.
            let e = if step % 3 == 0 { x % 64 } else { (x % 5000) << 40 | (x % 7) };
            match (x >> 20) % 4 {
                0 | 1 => match m.find(e) {
                    Some(i) => {
                        let media = (m.media(i) % 3) + 1;
                        m.set_media(i, media);
                        r.get_mut(&e).unwrap().1 = media;
                    }
                    None => {
                        m.insert_new(e, !e, 1);
                        r.insert(e, (!e, 1));
                    }
                },
                _ => {
                    if let Some(i) = m.find(e) {
                        m.remove_at(i);
                        r.remove(&e).unwrap();
                    } else {
                        assert!(!r.contains_key(&e));
                    }
                }
            }
            assert_eq!(m.len(), r.len());
        }
        let mut got: Vec<_> = m.iter().collect();
        got.sort();
        let mut want: Vec<_> = r.iter().map(|(&e, &(k, md))| (e, k, md)).collect();
        want.sort();
        assert_eq!(got, want);
        for (&e, &(k, md)) in &r {
            let i = m.find(e).unwrap();
            assert_eq!((m.key(i), m.media(i)), (k, md));
        }
    }
}
