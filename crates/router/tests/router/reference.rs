//! The literal reference index of `ROUTER.md`: per worker, a map from engine hash to
//! (parent engine hash, content hash, media), applied in order; a score walks the request
//! position by position through the map.

use std::collections::{BTreeMap, HashMap, HashSet};

use radixkv_router::{Score, Worker};

/// Device and host bits (as the index's dump writes them).
pub const GPU: u8 = 1;
pub const HOST: u8 = 2;

#[derive(Clone, Debug)]
struct Block {
    parent: Option<u64>,
    content: u64,
    media: u8,
}

#[derive(Clone, Debug, Default)]
struct RefWorker {
    map: HashMap<u64, Block>,
    next_seq: Option<u64>,
}

/// The reference.
#[derive(Clone, Debug, Default)]
pub struct Reference {
    workers: BTreeMap<Worker, RefWorker>,
    pub unknown_parents: u64,
    pub unknown_removals: u64,
}

/// What a batch's seq does to the cursor (the index's rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqOutcome {
    Apply,
    ClearThenApply,
    Refuse,
}

impl Reference {
    pub fn new() -> Reference {
        Reference::default()
    }

    /// A store of `blocks` (engine hash, content hash) below `parent`; false if refused.
    pub fn stored(
        &mut self,
        w: Worker,
        parent: Option<u64>,
        blocks: &[(u64, u64)],
        medium: u8,
    ) -> bool {
        // A refused store registers no worker (an unknown worker holds no parent).
        if let Some(p) = parent
            && !self.workers.get(&w).is_some_and(|rw| rw.map.contains_key(&p))
        {
            self.unknown_parents += 1;
            return false;
        }
        let rw = self.workers.entry(w).or_default();
        let mut prev = parent;
        for &(e, c) in blocks {
            rw.map.entry(e).and_modify(|b| b.media |= medium).or_insert(Block {
                parent: prev,
                content: c,
                media: medium,
            });
            prev = Some(e);
        }
        true
    }

    pub fn removed(&mut self, w: Worker, hashes: &[u64], medium: u8) {
        let Some(rw) = self.workers.get_mut(&w) else {
            self.unknown_removals += hashes.len() as u64;
            return;
        };
        for e in hashes {
            match rw.map.get_mut(e) {
                Some(b) if b.media & medium != 0 => {
                    b.media &= !medium;
                    if b.media == 0 {
                        rw.map.remove(e);
                    }
                }
                _ => self.unknown_removals += 1,
            }
        }
    }

    pub fn cleared(&mut self, w: Worker) {
        if let Some(rw) = self.workers.get_mut(&w) {
            rw.map.clear();
        }
    }

    pub fn remove_worker(&mut self, w: Worker) {
        self.workers.remove(&w);
    }

    /// A batch numbered `seq` arrives for `w`: the cursor's verdict (and the clear it
    /// implies, done here), under the gap policy `refuse_gaps`.
    pub fn batch_seq(&mut self, w: Worker, seq: u64, refuse_gaps: bool) -> SeqOutcome {
        let rw = self.workers.entry(w).or_default();
        let out = match rw.next_seq {
            Some(n) if seq < n => SeqOutcome::ClearThenApply,
            Some(n) if seq > n && refuse_gaps => SeqOutcome::Refuse,
            Some(n) if seq > n => SeqOutcome::ClearThenApply,
            _ => SeqOutcome::Apply,
        };
        match out {
            SeqOutcome::Refuse => {}
            SeqOutcome::ClearThenApply => {
                rw.map.clear();
                rw.next_seq = Some(seq + 1);
            }
            SeqOutcome::Apply => rw.next_seq = Some(seq + 1),
        }
        out
    }

    pub fn next_seq(&self, w: Worker) -> Option<u64> {
        self.workers.get(&w).and_then(|rw| rw.next_seq)
    }

    pub fn has_block(&self, w: Worker, e: u64) -> bool {
        self.workers.get(&w).is_some_and(|rw| rw.map.contains_key(&e))
    }

    pub fn has_worker(&self, w: Worker) -> bool {
        self.workers.contains_key(&w)
    }

    /// Leading positions of `contents` the worker holds with a medium in `mask`.
    fn walk(map: &HashMap<u64, Block>, contents: &[u64], mask: u8) -> u32 {
        let mut prev: Option<HashSet<u64>> = None;
        for (i, &c) in contents.iter().enumerate() {
            let here: HashSet<u64> = map
                .iter()
                .filter(|(_, b)| {
                    b.content == c
                        && b.media & mask != 0
                        && match (&prev, b.parent) {
                            (None, None) => true,
                            (Some(p), Some(parent)) => p.contains(&parent),
                            _ => false,
                        }
                })
                .map(|(&e, _)| e)
                .collect();
            if here.is_empty() {
                return i as u32;
            }
            prev = Some(here);
        }
        contents.len() as u32
    }

    /// The scores of a request given as its content hashes, sorted by worker.
    pub fn find(&self, contents: &[u64]) -> Vec<Score> {
        let mut out = Vec::new();
        for (&w, rw) in &self.workers {
            let any = Self::walk(&rw.map, contents, GPU | HOST);
            if any > 0 {
                let dev = Self::walk(&rw.map, contents, GPU);
                out.push(Score { worker: w, device_blocks: dev, any_blocks: any });
            }
        }
        out
    }

    /// (engine hash, medium) holdings over every worker.
    pub fn memberships(&self) -> u64 {
        self.workers
            .values()
            .flat_map(|rw| rw.map.values())
            .map(|b| b.media.count_ones() as u64)
            .sum()
    }

    pub fn workers(&self) -> u64 {
        self.workers.len() as u64
    }
}
