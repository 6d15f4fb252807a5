//! radixkv's router index: many engines' KV caches in one lock-free index
//! (`ROUTER.md`, issue 27).
//!
//! A KV-aware router asks, per request, how many leading blocks of it each engine worker
//! holds. [`RouterIndex`] answers that from the workers' KV-event streams (vLLM's msgpack
//! batches through [`RouterIndex::apply_batch`], or typed calls), while any number of
//! threads call [`RouterIndex::find`].
//!
//! # Design
//!
//! - **Blocks by content chain.** A stored block's content hash is computed here from its
//!   `token_ids` as Dynamo does (`XXH3-64` of the tokens as LE `u32`, seeded by the
//!   namespace's [`dynamo_seed`]); its **chain key** is the router-side sequence hash of the
//!   prefix ending with it (`key[0] = content[0]`, `key[i] = xxh3_next(key[i-1],
//!   content[i])`), so one key names one (namespace, position, content) block whatever
//!   hashes the engines use. A sharded open-addressing table (slots tagged with a key
//!   fingerprint) maps a key to a 32-byte record holding the block's members: one 4-byte
//!   entry per holding worker (media bits and a clear parity), three inline and the rest in
//!   an overflow array (`table.rs`).
//! - **Engine hashes per worker.** Each worker's writer state maps its engine hashes to
//!   chain keys (parents and removals resolve there; an open-addressing map of its own,
//!   17 bytes a place) and keeps the batch cursor (`workers.rs`). Writers of different
//!   workers run in parallel; one shard lock is taken per block changed, never by a reader.
//!   A store or removal goes in chunks of 16 blocks (map places and table slots asked for
//!   ahead, then the changes in order); a store's changes share version bumps
//!   (`apply_stored`); counters move once per event.
//! - **Readers** (`find.rs`) hash the request, probe the table position by position (slots,
//!   records and overflow arrays asked for ahead) and intersect holders, with no lock and
//!   no store to shared memory. Per-worker consistency comes from each worker's version
//!   word (`workers.rs`): read when the reader first meets the worker and again at the end;
//!   a worker that changed more than once in between is walked again on its own. A worker
//!   removed and added back into another slot during a find is listed once (the index's
//!   assignment count, read at both ends, says when to look).
//! - **Reclamation** is crossbeam-epoch: records, overflow arrays and tables are retired
//!   when unlinked, so the index returns to its empty size once every worker is gone.
//!
//! # Semantics beyond `ROUTER.md`
//!
//! - A second engine name for a (position, medium) the worker already holds (a *twin*) is
//!   counted; the position is held until its last name is removed.
//! - An engine hash names the same block for as long as the worker holds it: storing a
//!   held hash again (under any parent) only adds the medium.
//! - A removal lists several hashes: the held ones are removed, each hash the worker does not
//!   hold in that medium is refused and counted (`unknown_removal`), the call then returns
//!   [`RouterError::UnknownRemovals`].
//! - A batch's events apply one by one; an event refused for its content (unknown parent,
//!   unaligned or empty blocks, a block size other than the index's) is counted and skipped,
//!   the others apply. A payload that does not decode is refused whole.
//! - **KV cache groups** (a hybrid model's sliding-window or Mamba groups; vLLM's
//!   `group_idx` and `kv_cache_spec_kind`): the index holds prefixes, so it takes the
//!   events of full-attention groups only, as Dynamo's router does. A store or removal of
//!   another kind (sliding window, Mamba, an unknown one), or a removal of a group a store
//!   taught is of such a kind, or of a group other than 0 no store has named yet, is
//!   skipped and counted ([`RouterStats::other_groups`]), not refused: it changes nothing.
//!   Events without group fields (SGLang's) are taken. What stores taught is kept per
//!   worker, and in its dump ([`WorkerDump::groups`]). The cursor counts every batch: one stream per worker.

#![deny(unsafe_op_in_unsafe_fn, missing_docs)]

mod dump;
mod find;
mod sync;
mod table;
mod workers;

use std::collections::HashMap;
use std::mem::size_of;

pub use dump::{DumpBlock, DumpGroup, WorkerDump};
pub use find::FindScratch;
use radixkv::events::KvEvent;
pub use radixkv::events::Medium;
use radixkv::events::hash::{dynamo_seed, xxh3_local, xxh3_next};

use sync::epoch::{Domain, Guard};
use sync::{AtomicI64, AtomicU64, Ordering, lock};
use table::{BlockTable, Delta, GPU, HOST, MEDIA};
use workers::{Registry, Slot, StateLock, WorkerState, map_bytes, next_word};

/// What a sequence gap does (see [`RouterIndex::apply_batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GapPolicy {
    /// The worker is cleared (it will be re-learned), then the batch applies.
    #[default]
    Clear,
    /// Nothing applies; [`RouterError::SequenceGap`] names the expected seq so the caller
    /// replays from there and retries.
    Refuse,
}

/// The index's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterOptions {
    /// Tokens per block (every worker's `block_size`).
    pub block_size: u32,
    /// Distinct live `(worker_id, dp_rank)` pairs at most (at least 4096 is supported).
    pub max_workers: u32,
    /// What a gap in a worker's batch `seq` does.
    pub gap_policy: GapPolicy,
}

impl Default for RouterOptions {
    fn default() -> Self {
        RouterOptions { block_size: 16, max_workers: 4096, gap_policy: GapPolicy::Clear }
    }
}

/// An engine worker: its id and data-parallel rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Worker {
    /// The worker (instance) id.
    pub worker_id: u64,
    /// Its data-parallel rank.
    pub dp_rank: u32,
}

impl Worker {
    /// `(worker_id, dp_rank)`.
    pub fn new(worker_id: u64, dp_rank: u32) -> Worker {
        Worker { worker_id, dp_rank }
    }
}

/// One worker's answer to a [`RouterIndex::find`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Score {
    /// The worker.
    pub worker: Worker,
    /// Leading blocks of the request it holds on the device (GPU).
    pub device_blocks: u32,
    /// Leading blocks it holds in any medium (device or a host copy); at least 1.
    pub any_blocks: u32,
}

/// Why something was refused (the counters of [`RouterStats::refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A payload that does not decode as a vLLM KV-event batch.
    Malformed,
    /// A store whose parent hash the worker does not hold.
    UnknownParent,
    /// A removal of a hash the worker does not hold in that medium (counted per hash).
    UnknownRemoval,
    /// A store whose tokens are not `block_hashes.len() * block_size`, or whose block size
    /// is not the index's.
    Unaligned,
    /// A store with no blocks.
    Empty,
    /// A new worker beyond `max_workers`.
    TooManyWorkers,
    /// A batch refused for a sequence gap ([`GapPolicy::Refuse`]).
    SequenceGap,
}

const REFUSALS: usize = 7;

impl Refusal {
    /// Every reason, in counter order.
    pub const ALL: [Refusal; REFUSALS] = [
        Refusal::Malformed,
        Refusal::UnknownParent,
        Refusal::UnknownRemoval,
        Refusal::Unaligned,
        Refusal::Empty,
        Refusal::TooManyWorkers,
        Refusal::SequenceGap,
    ];
    fn index(self) -> usize {
        self as usize
    }
}

/// What went wrong; every error leaves the index as it was, except where a variant says
/// what applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouterError {
    /// Options out of range.
    InvalidOptions {
        /// `block_size` given (must be at least 1).
        block_size: u32,
        /// `max_workers` given (1 to 2^29).
        max_workers: u32,
    },
    /// The payload is not a vLLM KV-event batch: nothing of it applied.
    Malformed {
        /// The decoder's reason (for the log line; not for parsing).
        reason: String,
    },
    /// The batch's `seq` skips ahead of the worker's cursor ([`GapPolicy::Refuse`]):
    /// nothing applied.
    SequenceGap {
        /// The worker.
        worker: Worker,
        /// The seq the cursor expects (replay from here).
        expected: u64,
        /// The batch's seq.
        got: u64,
    },
    /// A store whose parent the worker does not hold: nothing of it applied.
    UnknownParent {
        /// The parent engine hash.
        parent: u64,
    },
    /// Some hashes of a removal were not held in its medium (those were refused; the held
    /// ones were removed).
    UnknownRemovals {
        /// How many.
        count: usize,
    },
    /// A store whose tokens do not cut into its blocks (or whose block size is not the
    /// index's): nothing of it applied.
    Unaligned {
        /// Blocks named.
        blocks: usize,
        /// Tokens given.
        tokens: usize,
        /// The block size the store claimed.
        block_size: u32,
        /// The index's block size.
        expected: u32,
    },
    /// A store with no blocks: nothing applied.
    Empty,
    /// `max_workers` workers are live already.
    TooManyWorkers {
        /// The cap.
        max_workers: u32,
    },
    /// A dump given to [`RouterIndex::restore`] is not one the index can hold.
    BadDump {
        /// The worker whose record is wrong.
        worker: Worker,
    },
}

impl std::fmt::Display for RouterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RouterError::InvalidOptions { block_size, max_workers } => {
                write!(f, "invalid options: block_size {block_size}, max_workers {max_workers}")
            }
            RouterError::Malformed { reason } => write!(f, "malformed KV-event batch: {reason}"),
            RouterError::SequenceGap { worker, expected, got } => write!(
                f,
                "sequence gap for worker {}/{}: expected seq {expected}, got {got}",
                worker.worker_id, worker.dp_rank
            ),
            RouterError::UnknownParent { parent } => {
                write!(f, "store under parent {parent:#x}, which the worker does not hold")
            }
            RouterError::UnknownRemovals { count } => {
                write!(f, "{count} removed hashes were not held in that medium")
            }
            RouterError::Unaligned { blocks, tokens, block_size, expected } => write!(
                f,
                "store of {blocks} blocks with {tokens} tokens at block size {block_size} (index: {expected})"
            ),
            RouterError::Empty => write!(f, "store with no blocks"),
            RouterError::TooManyWorkers { max_workers } => {
                write!(f, "{max_workers} workers are live already")
            }
            RouterError::BadDump { worker } => {
                write!(f, "bad dump record for worker {}/{}", worker.worker_id, worker.dp_rank)
            }
        }
    }
}

impl std::error::Error for RouterError {}

impl RouterError {
    /// The error's status code in the library's one table (`radixkv::error::status`, the C
    /// ABI's `rkv_status`): `SEQUENCE_GAP` for a gap the caller replays, `INVALID_ARGUMENT`
    /// for every other refusal. The C ABI and Python both map through this.
    pub fn status(&self) -> i32 {
        use radixkv::error::status;
        match self {
            RouterError::SequenceGap { .. } => status::SEQUENCE_GAP,
            RouterError::InvalidOptions { .. }
            | RouterError::Malformed { .. }
            | RouterError::UnknownParent { .. }
            | RouterError::UnknownRemovals { .. }
            | RouterError::Unaligned { .. }
            | RouterError::Empty
            | RouterError::TooManyWorkers { .. }
            | RouterError::BadDump { .. } => status::INVALID_ARGUMENT,
        }
    }
}

/// Counters and sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RouterStats {
    /// Live workers.
    pub workers: u64,
    /// Distinct blocks held by anyone.
    pub blocks: u64,
    /// (block, worker, medium) holdings.
    pub memberships: u64,
    /// The index's own heap bytes (retired memory the epoch has not freed yet excluded).
    pub bytes: u64,
    /// Events applied or refused (typed calls and batches' events).
    pub events: u64,
    /// Batches given to [`RouterIndex::apply_batch`].
    pub batches: u64,
    /// Sequence gaps seen.
    pub gaps: u64,
    /// Restarts seen (a seq below the cursor).
    pub restarts: u64,
    /// Events skipped for their KV cache group (not full attention; see the crate docs).
    pub other_groups: u64,
    /// Refusals by reason, in [`Refusal::ALL`] order (see [`RouterStats::refused`]).
    pub refused_by: [u64; REFUSALS],
}

impl RouterStats {
    /// Refusals of one reason.
    pub fn refused(&self, r: Refusal) -> u64 {
        self.refused_by[r.index()]
    }
    /// All refusals.
    pub fn refused_total(&self) -> u64 {
        self.refused_by.iter().sum()
    }
}

/// What [`RouterIndex::apply_batch`] did with a batch it accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchReport {
    /// Events in the batch.
    pub events: usize,
    /// Events refused (counted by reason in the stats).
    pub refused: usize,
    /// Events skipped for their KV cache group ([`RouterStats::other_groups`]).
    pub other_groups: usize,
    /// The worker was cleared first (a restart, or a gap under [`GapPolicy::Clear`]).
    pub cleared_first: bool,
}

fn medium_bit(m: Medium) -> u32 {
    match m {
        Medium::Gpu => GPU,
        Medium::CpuPinned => HOST,
    }
}

/// The namespace-mixed content hashes of `tokens`' full blocks (what
/// [`RouterIndex::find_hashes`] takes), appended to `out`.
pub fn content_hashes(
    tokens: &[u32],
    block_size: u32,
    lora_name: Option<&str>,
    cache_salt: Option<&str>,
    out: &mut Vec<u64>,
) {
    let seed = dynamo_seed(cache_salt, lora_name);
    out.extend(tokens.chunks_exact(block_size.max(1) as usize).map(|b| xxh3_local(b, seed)));
}

/// The chain key of a block with content hash `content` below the block with key
/// `parent` (`None`: the first block of its namespace).
#[inline]
pub fn chain_key(parent: Option<u64>, content: u64) -> u64 {
    match parent {
        None => content,
        Some(p) => xxh3_next(p, content),
    }
}

/// Blocks of a store whose table slots are asked for together (`apply_stored`).
const STORE_CHUNK: usize = 16;

/// A value on a cache line of its own (128 bytes: two lines, for adjacent-line prefetch).
#[repr(align(128))]
struct Padded<T>(T);

/// The router index (see the crate docs). `Send + Sync`; every method takes `&self`.
pub struct RouterIndex {
    opts: RouterOptions,
    domain: Domain,
    table: BlockTable,
    slots: Box<[Slot]>,
    /// Per slot: the writer's state under its lock (apart from `slots`: see `Slot`).
    states: Box<[StateLock]>,
    registry: Registry,
    /// Slot assignments so far (+1 before each assignment's live word, Release): a find
    /// that sees it unchanged from its start to its end met no worker in two slots
    /// (`find.rs`, step 4). On a line of its own: writers bump the counters below on every
    /// event, readers read this on every find.
    assigned: Padded<AtomicU64>,
    live_workers: AtomicU64,
    blocks: AtomicI64,
    memberships: AtomicI64,
    bytes: AtomicI64,
    events: AtomicU64,
    batches: AtomicU64,
    gaps: AtomicU64,
    restarts: AtomicU64,
    other_groups: AtomicU64,
    refused: [AtomicU64; REFUSALS],
}

impl RouterIndex {
    /// An empty index.
    pub fn new(opts: RouterOptions) -> Result<RouterIndex, RouterError> {
        if opts.block_size == 0 || opts.max_workers == 0 || opts.max_workers > table::MAX_SLOTS {
            return Err(RouterError::InvalidOptions {
                block_size: opts.block_size,
                max_workers: opts.max_workers,
            });
        }
        let slots: Box<[Slot]> = (0..opts.max_workers).map(|_| Slot::new()).collect();
        let states: Box<[StateLock]> =
            (0..opts.max_workers).map(|_| crate::sync::Mutex::new(None)).collect();
        let idx = RouterIndex {
            opts,
            domain: Domain::new(),
            table: BlockTable::new(),
            slots,
            states,
            registry: Registry::new(),
            assigned: Padded(AtomicU64::new(0)),
            live_workers: AtomicU64::new(0),
            blocks: AtomicI64::new(0),
            memberships: AtomicI64::new(0),
            bytes: AtomicI64::new(0),
            events: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            gaps: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            other_groups: AtomicU64::new(0),
            refused: std::array::from_fn(|_| AtomicU64::new(0)),
        };
        idx.bytes.store(idx.empty_bytes() as i64, Ordering::Relaxed);
        Ok(idx)
    }

    /// The heap bytes of an empty index with these options (what `stats().bytes` returns to
    /// once every worker is gone and the epoch has freed what they left).
    pub fn empty_bytes(&self) -> usize {
        table::empty_bytes()
            + self.slots.len() * (size_of::<Slot>() + size_of::<StateLock>())
            + workers::REG_SHARDS * size_of::<crate::sync::Mutex<HashMap<Worker, u32>>>()
    }

    /// The options.
    pub fn options(&self) -> RouterOptions {
        self.opts
    }

    fn refuse(&self, r: Refusal, n: u64) {
        self.refused[r.index()].fetch_add(n, Ordering::Relaxed);
    }

    fn account(&self, d: Delta) {
        if d.blocks != 0 {
            self.blocks.fetch_add(d.blocks, Ordering::Relaxed);
        }
        if d.memberships != 0 {
            self.memberships.fetch_add(d.memberships, Ordering::Relaxed);
        }
        if d.bytes != 0 {
            self.bytes.fetch_add(d.bytes, Ordering::Relaxed);
        }
    }

    // ------------------------------------------------------------------ workers

    /// The slot of `w`, assigning one if `create` (else `None` for an unknown worker).
    fn slot_of(&self, w: Worker, create: bool) -> Result<Option<u32>, RouterError> {
        let mut reg = lock(self.registry.shard(w));
        if let Some(&s) = reg.get(&w) {
            return Ok(Some(s));
        }
        if !create {
            return Ok(None);
        }
        let s = {
            let mut free = lock(&self.registry.free);
            match free.0.pop() {
                Some(s) => s,
                None if free.1 < self.opts.max_workers => {
                    free.1 += 1;
                    free.1 - 1
                }
                None => {
                    self.refuse(Refusal::TooManyWorkers, 1);
                    return Err(RouterError::TooManyWorkers { max_workers: self.opts.max_workers });
                }
            }
        };
        let slot = &self.slots[s as usize];
        let mut st = lock(&self.states[s as usize]);
        debug_assert!(st.is_none());
        let old = slot.word.load(Ordering::Relaxed);
        let parity = workers::parity(old);
        let state = Box::new(WorkerState::new(w, parity));
        self.bytes.fetch_add(state.bytes() as i64, Ordering::Relaxed);
        *st = Some(state);
        // Assignment: the assignment count (Release: a find whose first load of it sees this
        // one also sees `w`'s removal from any slot it had before, which came before this
        // under the registry shard's lock), the identity (Release: a reader that reads it
        // sees the slot's previous removal at its check), then the live word (Release).
        self.assigned.0.fetch_add(1, Ordering::Release);
        slot.id.store(w.worker_id, Ordering::Release);
        slot.rank.store(w.dp_rank, Ordering::Release);
        slot.word.store(next_word(old, true, parity), Ordering::Release);
        drop(st);
        let before = map_bytes(reg.capacity(), size_of::<(Worker, u32)>());
        reg.insert(w, s);
        let after = map_bytes(reg.capacity(), size_of::<(Worker, u32)>());
        self.bytes.fetch_add(after as i64 - before as i64, Ordering::Relaxed);
        self.live_workers.fetch_add(1, Ordering::Relaxed);
        Ok(Some(s))
    }

    /// Runs `f` on `w`'s writer state under its lock (assigning a slot if `create`).
    fn with_worker<R>(
        &self,
        w: Worker,
        create: bool,
        f: impl FnOnce(&Self, &mut WorkerState, u32, &Guard) -> R,
    ) -> Result<Option<R>, RouterError> {
        loop {
            let Some(s) = self.slot_of(w, create)? else {
                return Ok(None);
            };
            let mut g = lock(&self.states[s as usize]);
            match g.as_mut() {
                Some(st) if st.worker == w => {
                    let before = st.bytes();
                    let guard = self.domain.pin();
                    let r = f(self, st, s, &guard);
                    let after = st.bytes();
                    if after != before {
                        self.bytes.fetch_add(after as i64 - before as i64, Ordering::Relaxed);
                    }
                    return Ok(Some(r));
                }
                // Removed (and maybe reassigned) between the registry and the lock.
                _ => continue,
            }
        }
    }

    /// One change of `slot`'s holdings: the word's increment (Release) comes before the
    /// entry's store (see `workers.rs`).
    #[inline]
    fn bump(&self, slot: u32) {
        self.slots[slot as usize].word.fetch_add(1, Ordering::Release);
    }

    /// `st` (in `slot`) takes one more name for (key, medium bit `m`).
    fn hold(&self, st: &mut WorkerState, slot: u32, key: u64, m: u32, guard: &Guard) {
        self.bump(slot);
        let d = self.table.add(key, slot, st.parity, m, guard);
        if d.memberships == 0 {
            // The worker held (key, m) already under another engine name.
            *st.twins.entry((key, m)).or_insert(0) += 1;
        }
        self.account(d);
    }

    /// `st` drops one name for (key, medium bit `m`); the counter moves go to `acc`.
    fn unhold(
        &self,
        st: &mut WorkerState,
        slot: u32,
        key: u64,
        m: u32,
        guard: &Guard,
        acc: &mut Delta,
    ) {
        if let Some(n) = st.twins.get_mut(&(key, m)) {
            *n -= 1;
            if *n == 0 {
                st.twins.remove(&(key, m));
            }
            return;
        }
        self.bump(slot);
        let (d, _) = self.table.remove(key, slot, m, guard);
        acc.sum(d);
    }

    /// Drops everything `st` holds, atomically for readers (one store of the word), and
    /// keeps the worker (`live`) or not.
    fn drop_all(&self, st: &mut WorkerState, slot: u32, live: bool, guard: &Guard) {
        let word = &self.slots[slot as usize].word;
        st.parity = !st.parity;
        // The clear (or removal) point: one Release store.
        word.store(next_word(word.load(Ordering::Relaxed), live, st.parity), Ordering::Release);
        let held = std::mem::take(&mut st.held);
        let mut acc = Delta::default();
        for (_, key, _) in held.iter() {
            let (d, _) = self.table.remove(key, slot, MEDIA, guard);
            acc.sum(d);
        }
        self.account(acc);
        st.twins = HashMap::default();
    }

    #[allow(clippy::too_many_arguments)]
    fn apply_stored(
        &self,
        st: &mut WorkerState,
        slot: u32,
        parent: Option<u64>,
        hashes: &[u64],
        contents: impl Iterator<Item = u64>,
        m: u32,
        guard: &Guard,
    ) -> Result<(), RouterError> {
        let mut prev = match parent {
            None => None,
            Some(p) => match st.held.find(p) {
                Some(i) => Some(st.held.key(i)),
                None => {
                    self.refuse(Refusal::UnknownParent, 1);
                    return Err(RouterError::UnknownParent { parent: p });
                }
            },
        };
        // Parent first: each block's entry is published before its child's. One version
        // bump covers a run of the store's entry changes (a *segment*), not one each: a
        // reader whose two loads of the word are equal saw at most one segment in
        // progress. Take the first of the segment's changes (in store order) that it saw
        // undone, at request position p: every change before it was done when it was read
        // as done, so the reader saw the worker's state after the store's blocks before
        // that one (the block-by-block prefix rule of `workers.rs`) up to p; at p the
        // change makes a new entry, so the worker held p in neither medium then, both
        // counts stop at p, and what the reader saw past p does not matter (whatever
        // order it read positions in). An *upgrade* (an entry holding the other medium
        // gains this one) breaks that last step (the any-medium count goes on past p), so
        // a segment ends with an upgrade: the next change bumps again.
        //
        // The blocks go in chunks: their keys first (the worker's map), then a hint for
        // each key's table slot and record, then the table changes in order, so that the
        // chunk's table misses overlap.
        let mut acc = Delta::default();
        let mut bump = true;
        let mut chunk = [0u64; STORE_CHUNK];
        let mut contents = contents;
        for (c0, part) in hashes.chunks(STORE_CHUNK).enumerate() {
            // The worker's map places of this chunk and the next, asked for ahead.
            let ahead = hashes.get((c0 + 1) * STORE_CHUNK..).unwrap_or(&[]);
            if c0 == 0 {
                part.iter().for_each(|&e| st.held.prefetch(e));
            }
            ahead.iter().take(STORE_CHUNK).for_each(|&e| st.held.prefetch(e));
            let mut n = 0;
            for &e in part {
                let c = contents.next().expect("a content hash per block");
                let key = match st.held.find(e) {
                    Some(i) => {
                        let media = st.held.media(i);
                        if media & m == 0 {
                            st.held.set_media(i, media | m);
                            chunk[n] = st.held.key(i);
                            n += 1;
                        }
                        st.held.key(i)
                    }
                    None => {
                        let key = chain_key(prev, c);
                        st.held.insert_new(e, key, m);
                        chunk[n] = key;
                        n += 1;
                        key
                    }
                };
                prev = Some(key);
            }
            for &key in &chunk[..n] {
                self.table.prefetch(key, false, guard);
            }
            for &key in &chunk[..n] {
                self.table.prefetch(key, true, guard);
            }
            for &key in &chunk[..n] {
                if bump {
                    self.bump(slot);
                }
                let d = self.table.add(key, slot, st.parity, m, guard);
                if d.memberships == 0 {
                    // The worker held (key, m) already under another engine name.
                    *st.twins.entry((key, m)).or_insert(0) += 1;
                }
                bump = d.upgraded;
                acc.sum(d);
            }
        }
        self.account(acc);
        Ok(())
    }

    fn apply_removed(
        &self,
        st: &mut WorkerState,
        slot: u32,
        hashes: &[u64],
        m: u32,
        guard: &Guard,
    ) -> Result<(), RouterError> {
        let mut unknown = 0;
        let mut acc = Delta::default();
        // In chunks, as `apply_stored` does: the keys, the hints, then the table changes.
        let mut chunk = [0u64; STORE_CHUNK];
        for (c0, part) in hashes.chunks(STORE_CHUNK).enumerate() {
            let ahead = hashes.get((c0 + 1) * STORE_CHUNK..).unwrap_or(&[]);
            if c0 == 0 {
                part.iter().for_each(|&e| st.held.prefetch(e));
            }
            ahead.iter().take(STORE_CHUNK).for_each(|&e| st.held.prefetch(e));
            let mut n = 0;
            for &e in part {
                match st.held.find(e) {
                    Some(i) if st.held.media(i) & m != 0 => {
                        chunk[n] = st.held.key(i);
                        n += 1;
                        let left = st.held.media(i) & !m;
                        if left == 0 {
                            st.held.remove_at(i);
                        } else {
                            st.held.set_media(i, left);
                        }
                    }
                    _ => unknown += 1,
                }
            }
            for &key in &chunk[..n] {
                self.table.prefetch(key, false, guard);
            }
            for &key in &chunk[..n] {
                self.table.prefetch(key, true, guard);
            }
            for &key in &chunk[..n] {
                self.unhold(st, slot, key, m, guard, &mut acc);
            }
        }
        self.account(acc);
        if unknown > 0 {
            self.refuse(Refusal::UnknownRemoval, unknown as u64);
            return Err(RouterError::UnknownRemovals { count: unknown });
        }
        Ok(())
    }

    fn check_store(
        &self,
        blocks: usize,
        tokens: usize,
        block_size: u32,
    ) -> Result<(), RouterError> {
        if blocks == 0 {
            self.refuse(Refusal::Empty, 1);
            return Err(RouterError::Empty);
        }
        if block_size != self.opts.block_size || tokens != blocks * block_size as usize {
            self.refuse(Refusal::Unaligned, 1);
            return Err(RouterError::Unaligned {
                blocks,
                tokens,
                block_size,
                expected: self.opts.block_size,
            });
        }
        Ok(())
    }

    // ------------------------------------------------------------------ typed events

    /// `BlockStored`: `w` stores the blocks named `block_hashes` (its engine hashes) below
    /// its block `parent` (`None`: the namespace's first), with `token_ids` (`block_size`
    /// per block) in namespace (`lora_name`, `cache_salt`) and `medium`.
    #[allow(clippy::too_many_arguments)]
    pub fn stored(
        &self,
        w: Worker,
        lora_name: Option<&str>,
        cache_salt: Option<&str>,
        parent: Option<u64>,
        block_hashes: &[u64],
        token_ids: &[u32],
        medium: Medium,
    ) -> Result<(), RouterError> {
        self.events.fetch_add(1, Ordering::Relaxed);
        self.check_store(block_hashes.len(), token_ids.len(), self.opts.block_size)?;
        self.stored_checked(w, lora_name, cache_salt, parent, block_hashes, token_ids, medium)
    }

    #[allow(clippy::too_many_arguments)]
    fn stored_checked(
        &self,
        w: Worker,
        lora_name: Option<&str>,
        cache_salt: Option<&str>,
        parent: Option<u64>,
        block_hashes: &[u64],
        token_ids: &[u32],
        medium: Medium,
    ) -> Result<(), RouterError> {
        let seed = dynamo_seed(cache_salt, lora_name);
        let bs = self.opts.block_size as usize;
        let contents = token_ids.chunks_exact(bs).map(|b| xxh3_local(b, seed));
        let m = medium_bit(medium);
        self.store_as(w, parent, |me, st, slot, g| {
            me.apply_stored(st, slot, parent, block_hashes, contents, m, g)
        })
    }

    /// `BlockStored` with the blocks' content hashes computed by the caller (namespace
    /// mixed in, as [`content_hashes`] computes them) instead of tokens.
    pub fn stored_hashes(
        &self,
        w: Worker,
        parent: Option<u64>,
        block_hashes: &[u64],
        content_hashes: &[u64],
        medium: Medium,
    ) -> Result<(), RouterError> {
        self.events.fetch_add(1, Ordering::Relaxed);
        let bs = self.opts.block_size;
        self.check_store(block_hashes.len(), content_hashes.len() * bs as usize, bs)?;
        let contents = content_hashes.iter().copied();
        let m = medium_bit(medium);
        self.store_as(w, parent, |me, st, slot, g| {
            me.apply_stored(st, slot, parent, block_hashes, contents, m, g)
        })
    }

    /// Runs a store `f` as `w`. A store under a parent needs `w` known already (an unknown
    /// worker holds no parent: refused as [`RouterError::UnknownParent`] without
    /// registering it); a first block may register `w`.
    fn store_as(
        &self,
        w: Worker,
        parent: Option<u64>,
        f: impl FnOnce(&Self, &mut WorkerState, u32, &Guard) -> Result<(), RouterError>,
    ) -> Result<(), RouterError> {
        match (self.with_worker(w, parent.is_none(), f)?, parent) {
            (Some(r), _) => r,
            (None, Some(p)) => {
                self.refuse(Refusal::UnknownParent, 1);
                Err(RouterError::UnknownParent { parent: p })
            }
            (None, None) => unreachable!("with_worker creates the worker when asked"),
        }
    }

    /// `BlockRemoved`: `w` dropped its `medium` copy of the blocks `block_hashes`.
    pub fn removed(
        &self,
        w: Worker,
        block_hashes: &[u64],
        medium: Medium,
    ) -> Result<(), RouterError> {
        self.events.fetch_add(1, Ordering::Relaxed);
        let m = medium_bit(medium);
        match self.with_worker(w, false, |me, st, slot, g| {
            me.apply_removed(st, slot, block_hashes, m, g)
        })? {
            Some(r) => r,
            None if block_hashes.is_empty() => Ok(()),
            None => {
                self.refuse(Refusal::UnknownRemoval, block_hashes.len() as u64);
                Err(RouterError::UnknownRemovals { count: block_hashes.len() })
            }
        }
    }

    /// `AllBlocksCleared`: `w` holds nothing any more (atomic to a `find`). Its cursor is
    /// kept.
    pub fn cleared(&self, w: Worker) {
        self.events.fetch_add(1, Ordering::Relaxed);
        let _ = self.with_worker(w, false, |me, st, slot, g| me.drop_all(st, slot, true, g));
    }

    /// Forgets `w` (atomic to a `find`): its blocks and its cursor. Whether it was known.
    pub fn remove_worker(&self, w: Worker) -> bool {
        let mut reg = lock(self.registry.shard(w));
        let Some(s) = reg.remove(&w) else {
            return false;
        };
        {
            let mut g = lock(&self.states[s as usize]);
            let mut st = g.take().expect("a registered worker has a state");
            let guard = self.domain.pin();
            let before = st.bytes();
            self.drop_all(&mut st, s, false, &guard);
            self.bytes.fetch_sub(before as i64, Ordering::Relaxed);
        }
        let cap = reg.capacity();
        if reg.is_empty() && cap > 0 {
            // Give the registry shard's table back when it empties (the index returns to
            // its empty size).
            *reg = HashMap::default();
            self.bytes
                .fetch_sub(map_bytes(cap, size_of::<(Worker, u32)>()) as i64, Ordering::Relaxed);
        }
        drop(reg);
        // The slot is free only now: every entry of it has left the table.
        let mut free = lock(&self.registry.free);
        free.0.push(s);
        self.live_workers.fetch_sub(1, Ordering::Relaxed);
        if free.0.len() == free.1 as usize {
            // Every slot is free: forget them (the next worker takes slot 0 again), so
            // the free list's heap goes too.
            *free = (Vec::new(), 0);
        }
        true
    }

    /// The next `seq` `w`'s cursor expects (`None`: unknown worker, or no batch yet).
    pub fn next_seq(&self, w: Worker) -> Option<u64> {
        self.with_worker(w, false, |_, st, _, _| st.next_seq).ok().flatten().flatten()
    }

    /// Applies one vLLM KV-event batch `payload` (the msgpack frame) numbered `seq` from
    /// worker `worker_id` (its dp rank is the payload's `data_parallel_rank`, 0 when nil).
    ///
    /// The worker's first batch sets its cursor; a `seq` below the cursor is a restart (the
    /// worker is cleared, then the batch applies); a `seq` above it is a gap, handled by
    /// the [`GapPolicy`]. A payload that does not decode is refused whole
    /// ([`RouterError::Malformed`]); events refused for their content are counted and
    /// skipped ([`BatchReport::refused`]), and so are events of a KV cache group the index
    /// does not hold, without a refusal ([`BatchReport::other_groups`], crate docs).
    pub fn apply_batch(
        &self,
        worker_id: u64,
        seq: u64,
        payload: &[u8],
    ) -> Result<BatchReport, RouterError> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        let decoded = match radixkv::events::wire::decode_batch(payload) {
            Ok(d) => d,
            Err(e) => {
                self.refuse(Refusal::Malformed, 1);
                let reason = match e {
                    radixkv::Error::InvalidArgument(m) => m,
                    other => other.to_string(),
                };
                return Err(RouterError::Malformed { reason });
            }
        };
        let dp_rank = match decoded.data_parallel_rank {
            None => 0,
            Some(r) => match u32::try_from(r) {
                Ok(r) => r,
                Err(_) => {
                    self.refuse(Refusal::Malformed, 1);
                    return Err(RouterError::Malformed {
                        reason: format!("data_parallel_rank {r}"),
                    });
                }
            },
        };
        let w = Worker::new(worker_id, dp_rank);
        let (events, groups) = (decoded.batch.events, decoded.groups);
        let gap_policy = self.opts.gap_policy;
        self.with_worker(w, true, |me, st, slot, g| {
            let mut report = BatchReport { events: events.len(), ..Default::default() };
            match st.next_seq {
                Some(next) if seq < next => {
                    me.restarts.fetch_add(1, Ordering::Relaxed);
                    me.drop_all(st, slot, true, g);
                    report.cleared_first = true;
                }
                Some(next) if seq > next => {
                    me.gaps.fetch_add(1, Ordering::Relaxed);
                    match gap_policy {
                        GapPolicy::Clear => {
                            me.drop_all(st, slot, true, g);
                            report.cleared_first = true;
                        }
                        GapPolicy::Refuse => {
                            me.refuse(Refusal::SequenceGap, 1);
                            return Err(RouterError::SequenceGap {
                                worker: w,
                                expected: next,
                                got: seq,
                            });
                        }
                    }
                }
                _ => {}
            }
            st.next_seq = Some(seq.wrapping_add(1));
            me.events.fetch_add(events.len() as u64, Ordering::Relaxed);
            for (ev, group) in events.iter().zip(&groups) {
                if !st.takes(matches!(ev, KvEvent::BlockStored { .. }), group) {
                    report.other_groups += 1;
                    continue;
                }
                let r = match ev {
                    KvEvent::BlockStored {
                        block_hashes,
                        parent_block_hash,
                        token_ids,
                        block_size,
                        lora_name,
                        cache_salt,
                        medium,
                    } => me.check_store(block_hashes.len(), token_ids.len(), *block_size).and_then(
                        |()| {
                            let seed = dynamo_seed(cache_salt.as_deref(), lora_name.as_deref());
                            let contents = token_ids
                                .chunks_exact(*block_size as usize)
                                .map(|b| xxh3_local(b, seed));
                            me.apply_stored(
                                st,
                                slot,
                                *parent_block_hash,
                                block_hashes,
                                contents,
                                medium_bit(*medium),
                                g,
                            )
                        },
                    ),
                    KvEvent::BlockRemoved { block_hashes, medium } => {
                        me.apply_removed(st, slot, block_hashes, medium_bit(*medium), g)
                    }
                    KvEvent::AllBlocksCleared => {
                        me.drop_all(st, slot, true, g);
                        Ok(())
                    }
                };
                if r.is_err() {
                    report.refused += 1;
                }
            }
            me.other_groups.fetch_add(report.other_groups as u64, Ordering::Relaxed);
            Ok(report)
        })?
        .expect("created")
    }

    // ------------------------------------------------------------------ stats (dump: dump.rs)

    /// Counters and sizes (each read on its own: a snapshot only at quiescence).
    pub fn stats(&self) -> RouterStats {
        RouterStats {
            workers: self.live_workers.load(Ordering::Relaxed),
            blocks: self.blocks.load(Ordering::Relaxed).max(0) as u64,
            memberships: self.memberships.load(Ordering::Relaxed).max(0) as u64,
            bytes: self.bytes.load(Ordering::Relaxed).max(0) as u64,
            events: self.events.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            gaps: self.gaps.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
            other_groups: self.other_groups.load(Ordering::Relaxed),
            refused_by: std::array::from_fn(|i| self.refused[i].load(Ordering::Relaxed)),
        }
    }

    /// Runs the epoch garbage that can be freed now (a few rounds): what a memory figure
    /// should be read after.
    pub fn reclaim(&self) {
        // Each flush advances the epoch when it can and frees a bounded batch.
        for _ in 0..256 {
            self.domain.pin().flush();
        }
    }
}
