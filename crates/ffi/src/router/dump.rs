//! The byte form of a router index's dump (`rkv_router_dump`, `rkv_router_restore`).
//!
//! Little-endian, no padding:
//!
//! ```text
//! header  "RKVRDUMP" (8 bytes), u32 format version (2), u32 block_size, u64 n_workers
//! worker  u64 worker_id, u32 dp_rank, u32 flags (bit 0: has a cursor; other bits 0),
//!         u64 next_seq (0 without a cursor), u64 n_blocks, u64 n_groups, then n_groups
//!         groups, then n_blocks blocks
//! group   u32 group_idx, u32 kind (1: main attention, its removals indexed; 0: another
//!         kind, its removals skipped), sorted by group_idx, each group_idx once
//! block   u64 engine_hash, u64 chain_key, u32 media (bit 0 device, bit 1 host; 1 to 3),
//!         u32 reserved (0)
//! ```
//!
//! A worker's groups are the KV cache groups whose kinds its stores taught
//! ([`radixkv_router::DumpGroup`]). Version 1 (written before groups were saved) is read
//! too: its workers have no `n_groups` and no groups, which means none learned.

use radixkv_router::{DumpBlock, DumpGroup, Worker, WorkerDump};

use crate::boundary::{Res, fail};
use crate::types::rkv_status;

/// The dump's first bytes.
pub(crate) const MAGIC: &[u8; 8] = b"RKVRDUMP";
/// The format version this library writes (it reads this one and version 1).
pub(crate) const VERSION: u32 = 2;
/// The version before groups were saved.
pub(crate) const VERSION_1: u32 = 1;
const HEADER: usize = 8 + 4 + 4 + 8;
/// A worker's fixed fields in version 1; version 2 adds `n_groups`.
const WORKER_1: usize = 8 + 4 + 4 + 8 + 8;
const WORKER: usize = WORKER_1 + 8;
const GROUP: usize = 4 + 4;
const BLOCK: usize = 8 + 8 + 4 + 4;

/// The bytes of `dump`, made by an index of `block_size`.
pub(crate) fn encode_dump(block_size: u32, dump: &[WorkerDump]) -> Vec<u8> {
    let blocks: usize = dump.iter().map(|w| w.blocks.len()).sum();
    let groups: usize = dump.iter().map(|w| w.groups.len()).sum();
    let mut b = Vec::with_capacity(HEADER + WORKER * dump.len() + GROUP * groups + BLOCK * blocks);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&block_size.to_le_bytes());
    b.extend_from_slice(&(dump.len() as u64).to_le_bytes());
    for w in dump {
        b.extend_from_slice(&w.worker.worker_id.to_le_bytes());
        b.extend_from_slice(&w.worker.dp_rank.to_le_bytes());
        b.extend_from_slice(&u32::from(w.next_seq.is_some()).to_le_bytes());
        b.extend_from_slice(&w.next_seq.unwrap_or(0).to_le_bytes());
        b.extend_from_slice(&(w.blocks.len() as u64).to_le_bytes());
        b.extend_from_slice(&(w.groups.len() as u64).to_le_bytes());
        for g in &w.groups {
            b.extend_from_slice(&g.group_idx.to_le_bytes());
            b.extend_from_slice(&u32::from(g.main_attention).to_le_bytes());
        }
        for k in &w.blocks {
            b.extend_from_slice(&k.engine_hash.to_le_bytes());
            b.extend_from_slice(&k.chain_key.to_le_bytes());
            b.extend_from_slice(&u32::from(k.media).to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
        }
    }
    b
}

/// A cursor over the bytes, refusing reads past the end.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self, what: &str) -> Res<[u8; N]> {
        let end = self.at.checked_add(N).filter(|&e| e <= self.b.len()).ok_or_else(|| {
            bad(format!("truncated at byte {} of {} (reading {what})", self.at, self.b.len()))
        })?;
        let v = self.b[self.at..end].try_into().expect("N bytes");
        self.at = end;
        Ok(v)
    }
    fn u32(&mut self, what: &str) -> Res<u32> {
        self.take::<4>(what).map(u32::from_le_bytes)
    }
    fn u64(&mut self, what: &str) -> Res<u64> {
        self.take::<8>(what).map(u64::from_le_bytes)
    }
    fn left(&self) -> usize {
        self.b.len() - self.at
    }
}

fn bad(m: String) -> crate::boundary::Fail {
    fail(rkv_status::RKV_INVALID_ARGUMENT, format!("bytes are not a router dump: {m}"))
}

/// The dump in `bytes`, for an index of `block_size`.
pub(crate) fn decode_dump(block_size: u32, bytes: &[u8]) -> Res<Vec<WorkerDump>> {
    let mut r = Reader { b: bytes, at: 0 };
    if &r.take::<8>("the magic")? != MAGIC {
        return Err(bad("they do not start with \"RKVRDUMP\" (rkv_router_dump's magic)".into()));
    }
    let v = r.u32("the version")?;
    if v != VERSION && v != VERSION_1 {
        return Err(bad(format!(
            "format version {v}; this library reads versions {VERSION_1} and {VERSION}"
        )));
    }
    let worker_size = if v == VERSION_1 { WORKER_1 } else { WORKER };
    let bs = r.u32("block_size")?;
    if bs != block_size {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!(
                "the dump was made by an index of block_size {bs}, but opts->block_size = \
                 {block_size} (chain keys depend on the block size)"
            ),
        ));
    }
    let n = r.u64("n_workers")?;
    if n > (r.left() / worker_size) as u64 {
        return Err(bad(format!("n_workers = {n} does not fit in the {} bytes left", r.left())));
    }
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let worker_id = r.u64("a worker_id")?;
        let dp_rank = r.u32("a dp_rank")?;
        let flags = r.u32("a worker's flags")?;
        if flags > 1 {
            return Err(bad(format!("worker {i}'s flags = {flags:#x} (only bit 0 is defined)")));
        }
        let seq = r.u64("a next_seq")?;
        let nb = r.u64("n_blocks")?;
        let ng = if v == VERSION_1 { 0 } else { r.u64("n_groups")? };
        if ng > (r.left() / GROUP) as u64 {
            return Err(bad(format!(
                "worker {i}'s n_groups = {ng} does not fit in the {} bytes left",
                r.left()
            )));
        }
        let mut groups: Vec<DumpGroup> = Vec::with_capacity(ng as usize);
        for j in 0..ng {
            let group_idx = r.u32("a group_idx")?;
            let kind = r.u32("a group's kind")?;
            if kind > 1 {
                return Err(bad(format!(
                    "worker {i}'s group {j} has kind = {kind} (0 another kind, 1 main attention)"
                )));
            }
            if groups.last().is_some_and(|g| g.group_idx >= group_idx) {
                return Err(bad(format!(
                    "worker {i}'s group {j} has group_idx = {group_idx}, not above the one \
                     before it (sorted, each once)"
                )));
            }
            groups.push(DumpGroup { group_idx, main_attention: kind == 1 });
        }
        if nb > (r.left() / BLOCK) as u64 {
            return Err(bad(format!(
                "worker {i}'s n_blocks = {nb} does not fit in the {} bytes left",
                r.left()
            )));
        }
        let mut blocks = Vec::with_capacity(nb as usize);
        for j in 0..nb {
            let engine_hash = r.u64("an engine_hash")?;
            let chain_key = r.u64("a chain_key")?;
            let media = r.u32("a block's media")?;
            let reserved = r.u32("a block's reserved field")?;
            if !(1..=3).contains(&media) || reserved != 0 {
                return Err(bad(format!(
                    "worker {i}'s block {j} has media = {media}, reserved = {reserved} (media \
                     1 to 3, reserved 0)"
                )));
            }
            blocks.push(DumpBlock { engine_hash, chain_key, media: media as u8 });
        }
        out.push(WorkerDump {
            worker: Worker::new(worker_id, dp_rank),
            next_seq: (flags == 1).then_some(seq),
            blocks,
            groups,
        });
    }
    if r.left() != 0 {
        return Err(bad(format!("{} bytes follow the last worker", r.left())));
    }
    Ok(out)
}
