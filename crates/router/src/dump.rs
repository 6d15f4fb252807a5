//! A router index's dump and restore: per worker its cursor, its held engine hashes (each
//! with its chain key and media) and the KV cache group kinds its stores taught, sorted, so
//! that [`RouterIndex::restore`] rebuilds an index exactly (the byte form is the C ABI's,
//! `crates/ffi/src/router/dump.rs`; the indexer's snapshot is JSON).

use crate::sync::lock;
use crate::table::{GPU, HOST, MEDIA};
use crate::{RouterError, RouterIndex, RouterOptions, Worker};

/// One held engine hash of a dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DumpBlock {
    /// The engine's hash.
    pub engine_hash: u64,
    /// The block's chain key (the router's sequence hash of the prefix ending with it: it
    /// stands for the parent chain, so a restore needs no parent lookups).
    pub chain_key: u64,
    /// Media: bit 0 device, bit 1 host copy.
    pub media: u8,
}

/// One KV cache group whose kind a worker's stores taught (crate docs, "KV cache groups"):
/// whether its events are indexed. Only a group whose kind differs from what a group no
/// store has named gets (group 0 indexed, every other group skipped) is listed: a stream of
/// one full-attention group 0 has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DumpGroup {
    /// vLLM's `group_idx`.
    pub group_idx: u32,
    /// Its stores' kind is main attention (full, MLA, sink-full): its removals are indexed.
    /// `false`: another kind (sliding window, Mamba, unknown): its removals are skipped.
    pub main_attention: bool,
}

/// One worker of a dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerDump {
    /// The worker.
    pub worker: Worker,
    /// Its batch cursor (the next seq expected), if it has seen a batch.
    pub next_seq: Option<u64>,
    /// Its held engine hashes, sorted.
    pub blocks: Vec<DumpBlock>,
    /// The KV cache groups whose kinds its stores taught, sorted by `group_idx` (empty: none
    /// learned, what a dump made before groups were saved means). A removal of one of these
    /// groups after a restore is taken or skipped as it was before the dump.
    pub groups: Vec<DumpGroup>,
}

impl RouterIndex {
    /// Every worker's holdings, cursor and learned group kinds, sorted by worker and engine
    /// hash: given to [`RouterIndex::restore`], it rebuilds this index exactly.
    pub fn dump(&self) -> Vec<WorkerDump> {
        let mut ws: Vec<Worker> = Vec::new();
        for shard in self.registry.shards.iter() {
            ws.extend(lock(shard).keys().copied());
        }
        ws.sort();
        let mut out = Vec::with_capacity(ws.len());
        for w in ws {
            let d = self.with_worker(w, false, |_, st, _, _| {
                let mut blocks: Vec<DumpBlock> = st
                    .held
                    .iter()
                    .map(|(e, key, media)| DumpBlock {
                        engine_hash: e,
                        chain_key: key,
                        media: media as u8,
                    })
                    .collect();
                blocks.sort();
                let mut groups: Vec<DumpGroup> = st
                    .groups
                    .iter()
                    .map(|&(group_idx, main_attention)| DumpGroup { group_idx, main_attention })
                    .collect();
                groups.sort();
                WorkerDump { worker: w, next_seq: st.next_seq, blocks, groups }
            });
            if let Ok(Some(d)) = d {
                out.push(d);
            }
        }
        out
    }

    /// An index with `opts` holding exactly what `dump` records. A group listed twice for
    /// one worker, or a block with media 0 or past bit 1, is [`RouterError::BadDump`]; a
    /// group listed with the kind an unnamed group has anyway changes nothing (it is not
    /// kept: the next dump leaves it out).
    pub fn restore(opts: RouterOptions, dump: &[WorkerDump]) -> Result<RouterIndex, RouterError> {
        let idx = RouterIndex::new(opts)?;
        for wd in dump {
            let bad_media =
                wd.blocks.iter().any(|b| b.media == 0 || u32::from(b.media) & !MEDIA != 0);
            let mut named: Vec<u32> = wd.groups.iter().map(|g| g.group_idx).collect();
            named.sort_unstable();
            if bad_media || named.windows(2).any(|p| p[0] == p[1]) {
                return Err(RouterError::BadDump { worker: wd.worker });
            }
            idx.with_worker(wd.worker, true, |me, st, slot, g| {
                st.next_seq = wd.next_seq;
                st.groups = wd
                    .groups
                    .iter()
                    .filter(|d| d.main_attention != (d.group_idx == 0))
                    .map(|d| (d.group_idx, d.main_attention))
                    .collect();
                for b in &wd.blocks {
                    let media = u32::from(b.media);
                    let (key, new) = match st.held.find(b.engine_hash) {
                        Some(i) => {
                            let had = st.held.media(i);
                            st.held.set_media(i, had | media);
                            (st.held.key(i), media & !had)
                        }
                        None => {
                            st.held.insert_new(b.engine_hash, b.chain_key, media);
                            (b.chain_key, media)
                        }
                    };
                    for m in [GPU, HOST] {
                        if new & m != 0 {
                            me.hold(st, slot, key, m, g);
                        }
                    }
                }
            })?;
        }
        Ok(idx)
    }
}
