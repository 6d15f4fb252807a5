//! The reader: scores of every worker holding a request's first block.
//!
//! A find takes no lock, writes nothing shared and never waits for a writer. It pins the
//! epoch (a thread-local write), hashes the request into chain keys (into the scratch),
//! then walks:
//!
//! 1. *discovery*: the first block's entries name the candidate workers; each one's
//!    version word is loaded (Acquire) the first time it is met. These reads of block 0
//!    are not trusted (they came before the word's load);
//! 2. *trusted walk*: block 0 again, then 1, 2, ...: for each alive candidate, whether its
//!    entry (of the parity its word had) holds the device copy and any copy; a candidate
//!    drops out of a medium at the first block it does not hold there; the walk ends when
//!    no candidate is left or the request is;
//! 3. *check*: each candidate's word is loaded again (Acquire). Equal to the first load:
//!    the worker changed at most once during the trusted reads, and that change is one
//!    entry store, so its score is the one after a prefix of its events (`workers.rs`).
//!    Different: the worker alone is walked again, with a fresh word, until a walk checks.
//! 4. *one score per worker*: a worker removed and added again during the find can be met in
//!    two slots, each reading a state it had during the find. Two candidates whose words
//!    checked cannot name one worker (each held it from its discovery to its check, and all
//!    discoveries come before all checks), so one of such a pair was walked again; and a
//!    worker is met in a second slot only through an assignment the find observed, which
//!    moves the index's assignment count (loaded, Acquire, at the start and the end). So
//!    when the count moved and a candidate was walked again, each walked-again score whose
//!    worker is listed already is dropped (the other, also a state of the worker during the
//!    find, stays).
//!
//! A worker's clear or removal is one store of its word: a reader that met it before sees
//! the word change and walks it again; one that meets it after sees the new parity (no old
//! entry counts) or no `live` bit (the worker is skipped).

use crate::sync::epoch::Guard;
use crate::table::{Block, GPU, entry_media, entry_parity, entry_slot};
use crate::workers::{live, parity};
use crate::{RouterIndex, Score, Worker, chain_key};
use radixkv::events::hash::{dynamo_seed, xxh3_local};

/// A candidate of one find.
#[derive(Clone, Copy)]
struct Cand {
    slot: u32,
    word: u64,
    worker: Worker,
    /// Scores once it dropped out (`u32::MAX`: still in).
    any: u32,
    dev: u32,
}

const IN: u32 = u32::MAX;

/// What a find keeps per worker slot (what the walk's inner loop touches per entry: one
/// 16-byte place, no candidate record).
#[derive(Clone, Copy, Default)]
struct Per {
    /// `stamp << 3 | dev_out << 2 | counting << 1 | parity`: met by the find of `stamp`;
    /// its device count ended already; its entries still count (a live candidate not yet
    /// out); the clear parity its word had.
    met: u32,
    /// The last position (+1) it was seen holding in any medium / on the device.
    any: u32,
    dev: u32,
    /// Its candidate index.
    cand: u32,
}

const DEV_OUT: u32 = 4;
const COUNTING: u32 = 2;
/// Stamps wrap below this (the per-slot marks are cleared then).
const STAMP_LIMIT: u32 = 1 << 29;

/// A reader's reusable buffers: with one, a find allocates nothing once the buffers have
/// grown to the request length and the number of workers met.
#[derive(Default)]
pub struct FindScratch {
    keys: Vec<u64>,
    cands: Vec<Cand>,
    /// Slots of the candidates still in (any medium).
    alive: Vec<u32>,
    /// Positions in the output of scores walked again in the check.
    rewalked: Vec<u32>,
    /// Per slot marks, valid when their stamp is this find's.
    per: Vec<Per>,
    /// The stamp of the find in progress.
    stamp: u32,
}

impl FindScratch {
    /// Empty buffers.
    pub fn new() -> FindScratch {
        FindScratch::default()
    }
}

#[cfg(not(loom))]
thread_local! {
    static SCRATCH: std::cell::RefCell<FindScratch> = std::cell::RefCell::new(FindScratch::new());
}

/// How far ahead the walk asks for table slots.
const PREFETCH: usize = 16;
/// How far ahead the walk asks for records.
const RECORD: usize = 8;
/// How far ahead the walk looks records up (and hints their overflow arrays).
const AHEAD: usize = 3;
/// The ring of records looked up ahead (a power of two above AHEAD).
const RING: usize = 4;

impl RouterIndex {
    /// Scores of `tokens` (cut into blocks of the index's block size; a partial last
    /// block is ignored) in namespace (`lora_name`, `cache_salt`): every worker holding the
    /// first block, once, with its leading blocks held on the device and in any medium.
    /// `out` is cleared first. Uses a thread-local scratch (see [`RouterIndex::find_with`]).
    pub fn find(
        &self,
        tokens: &[u32],
        lora_name: Option<&str>,
        cache_salt: Option<&str>,
        out: &mut Vec<Score>,
    ) {
        self.with_scratch(|me, s| me.find_with(s, tokens, lora_name, cache_salt, out));
    }

    /// [`RouterIndex::find`] for precomputed content hashes, one per block, namespace mixed
    /// in (as [`crate::content_hashes`] makes them).
    pub fn find_hashes(&self, content_hashes: &[u64], out: &mut Vec<Score>) {
        self.with_scratch(|me, s| me.find_hashes_with(s, content_hashes, out));
    }

    #[cfg(not(loom))]
    fn with_scratch(&self, f: impl FnOnce(&Self, &mut FindScratch)) {
        SCRATCH.with(|s| match s.try_borrow_mut() {
            Ok(mut s) => f(self, &mut s),
            // Re-entered from inside a find (not done by the index itself): own buffers.
            Err(_) => f(self, &mut FindScratch::new()),
        });
    }

    #[cfg(loom)]
    fn with_scratch(&self, f: impl FnOnce(&Self, &mut FindScratch)) {
        f(self, &mut FindScratch::new());
    }

    /// [`RouterIndex::find`] with the caller's scratch.
    pub fn find_with(
        &self,
        scratch: &mut FindScratch,
        tokens: &[u32],
        lora_name: Option<&str>,
        cache_salt: Option<&str>,
        out: &mut Vec<Score>,
    ) {
        let seed = dynamo_seed(cache_salt, lora_name);
        scratch.keys.clear();
        let mut prev = None;
        for b in tokens.chunks_exact(self.options().block_size as usize) {
            let k = chain_key(prev, xxh3_local(b, seed));
            scratch.keys.push(k);
            prev = Some(k);
        }
        self.walk(scratch, out);
    }

    /// [`RouterIndex::find_hashes`] with the caller's scratch.
    pub fn find_hashes_with(
        &self,
        scratch: &mut FindScratch,
        content_hashes: &[u64],
        out: &mut Vec<Score>,
    ) {
        scratch.keys.clear();
        let mut prev = None;
        for &c in content_hashes {
            let k = chain_key(prev, c);
            scratch.keys.push(k);
            prev = Some(k);
        }
        self.walk(scratch, out);
    }

    fn walk(&self, s: &mut FindScratch, out: &mut Vec<Score>) {
        out.clear();
        let Some(&k0) = s.keys.first() else {
            return;
        };
        let guard = self.domain.pin();
        let assigned = self.assigned.0.load(crate::sync::Ordering::Acquire);
        let Some(b0) = self.table.get(k0, &guard) else {
            return;
        };
        if s.per.len() < self.slots.len() {
            s.per.resize(self.slots.len(), Per::default());
        }
        s.stamp += 1;
        if s.stamp >= STAMP_LIMIT {
            // The stamps wrapped: old marks could read as this find's.
            s.per.iter_mut().for_each(|p| *p = Per::default());
            s.stamp = 1;
        }
        let stamp = s.stamp;
        s.cands.clear();
        s.alive.clear();
        // 1. Discovery.
        b0.for_each_entry(&guard, |e| {
            let slot = entry_slot(e);
            let p = &mut s.per[slot as usize];
            if p.met >> 3 == stamp {
                return;
            }
            let sl = &self.slots[slot as usize];
            let word = sl.word.load(crate::sync::Ordering::Acquire);
            if !live(word) {
                // Met, not counting.
                p.met = stamp << 3;
                return;
            }
            // Acquire: a newer identity (stored Release after the slot's removal) makes the
            // check's load of the word see that removal (a changed word).
            let worker = Worker::new(
                sl.id.load(crate::sync::Ordering::Acquire),
                sl.rank.load(crate::sync::Ordering::Acquire),
            );
            *p = Per {
                met: stamp << 3 | COUNTING | parity(word) as u32,
                any: 0,
                dev: 0,
                cand: s.cands.len() as u32,
            };
            s.alive.push(slot);
            s.cands.push(Cand { slot, word, worker, any: IN, dev: IN });
        });
        // An entry counts when its slot's mark, less the device bit, is this.
        let base = stamp << 3 | COUNTING;
        // 2. The trusted walk (with hints: the table slot of the block PREFETCH ahead, the
        // record of the block RECORD ahead, so the walk's dependent loads overlap).
        let n = s.keys.len();
        for k in s.keys.iter().take(PREFETCH).skip(1) {
            self.table.prefetch(*k, false, &guard);
        }
        for k in s.keys.iter().take(RECORD).skip(1) {
            self.table.prefetch(*k, true, &guard);
        }
        // The records of the next AHEAD positions are looked up ahead (a ring), and their
        // overflow arrays hinted. (Looking a record up early is no weaker a read: the
        // argument of `workers.rs` and `RouterIndex::apply_stored` takes a worker's reads
        // in any order, each read once, all between the two loads of its word.)
        let mut ring: [Option<&Block>; RING] = [None; RING];
        for (j, k) in s.keys.iter().enumerate().take(AHEAD) {
            ring[j] = self.table.get(*k, &guard);
            if let Some(b) = ring[j] {
                b.prefetch_overflow(&guard);
            }
        }
        let mut i = 0;
        // Candidates still in on the device.
        let mut dev_in = s.alive.len();
        while i < n && !s.alive.is_empty() {
            if let Some(k) = s.keys.get(i + PREFETCH) {
                self.table.prefetch(*k, false, &guard);
            }
            if let Some(k) = s.keys.get(i + RECORD) {
                self.table.prefetch(*k, true, &guard);
            }
            if let Some(k) = s.keys.get(i + AHEAD) {
                let b = self.table.get(*k, &guard);
                if let Some(b) = b {
                    b.prefetch_overflow(&guard);
                }
                ring[(i + AHEAD) % RING] = b;
            }
            let pos = i as u32 + 1;
            // The counting entries of this block, and those of candidates still in on the
            // device: when they are all the candidates, nobody drops out here.
            let (mut seen, mut seen_dev) = (0usize, 0usize);
            if let Some(b) = ring[i % RING] {
                let per = &mut s.per;
                b.for_each_entry(&guard, |e| {
                    let Some(p) = per.get_mut(entry_slot(e) as usize) else {
                        return;
                    };
                    if p.met & !DEV_OUT == base | entry_parity(e) as u32 {
                        // A candidate still in (one entry per worker in a block).
                        seen += 1;
                        p.any = pos;
                        if entry_media(e) & GPU != 0 {
                            seen_dev += (p.met & DEV_OUT == 0) as usize;
                            p.dev = pos;
                        }
                    }
                });
            }
            if seen == s.alive.len() && seen_dev == dev_in {
                i += 1;
                continue;
            }
            let (cands, alive, per) = (&mut s.cands, &mut s.alive, &mut s.per);
            alive.retain(|&slot| {
                let p = &mut per[slot as usize];
                if p.met & DEV_OUT == 0 && p.dev != pos {
                    p.met |= DEV_OUT;
                    dev_in -= 1;
                    cands[p.cand as usize].dev = i as u32;
                }
                if p.any != pos {
                    // Out: its entries stop counting.
                    p.met &= !COUNTING;
                    cands[p.cand as usize].any = i as u32;
                    return false;
                }
                true
            });
            i += 1;
        }
        // 3. The check.
        s.rewalked.clear();
        for c in &mut s.cands {
            if c.any == IN {
                c.any = n as u32;
            }
            if c.dev == IN {
                c.dev = n as u32;
            }
            let now = self.slots[c.slot as usize].word.load(crate::sync::Ordering::Acquire);
            let again = now != c.word;
            if again {
                match self.walk_one(c.slot, &s.keys, &guard) {
                    Some((worker, dev, any)) => {
                        c.worker = worker;
                        c.dev = dev;
                        c.any = any;
                    }
                    None => c.any = 0,
                }
            }
            if c.any > 0 {
                if again {
                    s.rewalked.push(out.len() as u32);
                }
                out.push(Score { worker: c.worker, device_blocks: c.dev, any_blocks: c.any });
            }
        }
        // 4. One score per worker.
        if !s.rewalked.is_empty()
            && self.assigned.0.load(crate::sync::Ordering::Acquire) != assigned
        {
            for &r in &s.rewalked {
                let w = out[r as usize].worker;
                // Dropped scores are marked `any_blocks == 0` (never a listed score).
                let twice = out
                    .iter()
                    .enumerate()
                    .any(|(j, o)| j != r as usize && o.worker == w && o.any_blocks > 0);
                if twice {
                    out[r as usize].any_blocks = 0;
                }
            }
            out.retain(|o| o.any_blocks > 0);
        }
    }

    /// One worker's walk, repeated until its word is the same before and after (`None`:
    /// the slot's worker is gone).
    fn walk_one(&self, slot: u32, keys: &[u64], guard: &Guard) -> Option<(Worker, u32, u32)> {
        let sl = &self.slots[slot as usize];
        loop {
            let word = sl.word.load(crate::sync::Ordering::Acquire);
            if !live(word) {
                return None;
            }
            // Acquire: a newer identity (stored Release after the slot's removal) makes the
            // check's load of the word see that removal (a changed word).
            let worker = Worker::new(
                sl.id.load(crate::sync::Ordering::Acquire),
                sl.rank.load(crate::sync::Ordering::Acquire),
            );
            let (mut dev, mut any) = (None, None);
            for (i, &k) in keys.iter().enumerate() {
                let mut media = 0;
                if let Some(b) = self.table.get(k, guard) {
                    b.for_each_entry(guard, |e| {
                        if entry_slot(e) == slot && entry_parity(e) == parity(word) {
                            media = entry_media(e);
                        }
                    });
                }
                if dev.is_none() && media & GPU == 0 {
                    dev = Some(i as u32);
                }
                if media == 0 {
                    any = Some(i as u32);
                    break;
                }
            }
            let n = keys.len() as u32;
            if sl.word.load(crate::sync::Ordering::Acquire) == word {
                return Some((worker, dev.unwrap_or(n), any.unwrap_or(n)));
            }
        }
    }
}
