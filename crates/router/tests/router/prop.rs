//! The property test: random multi-worker streams (holes, duplicates, restarts, gaps,
//! clears, namespaces, media, worker removal, unknown parents and removals, typed calls and
//! msgpack batches in both encodings) through the index and the reference; after every
//! step every score, the memberships, the workers and the cursors are equal.

use std::sync::Arc;

use proptest::prelude::*;
use radixkv::events::hash::{dynamo_seed, xxh3_local};
use radixkv::events::wire::{Encoding, WireOptions, encode_batch};
use radixkv::events::{EventBatch, KvEvent, Medium};
use radixkv_router::{
    GapPolicy, RouterError, RouterIndex, RouterOptions, Score, Worker, chain_key,
};

use crate::reference::{GPU, HOST, Reference, SeqOutcome};

pub const BS: u32 = 2;
pub const NS: [(Option<&str>, Option<&str>); 3] =
    [(None, None), (Some("lora-a"), None), (None, Some("salt-1"))];
/// Block "letters" of each sequence: shared prefixes, and one content at several positions.
pub const SEQS: [[u32; 5]; 5] =
    [[1, 2, 3, 1, 2], [1, 2, 1, 1, 3], [2, 1, 3, 3, 1], [1, 2, 3, 1, 3], [3, 3, 3, 3, 3]];
pub const WORKERS: [Worker; 4] = [
    Worker { worker_id: 1, dp_rank: 0 },
    Worker { worker_id: 1, dp_rank: 1 },
    Worker { worker_id: 2, dp_rank: 0 },
    Worker { worker_id: 3, dp_rank: 0 },
];

pub fn block_tokens(x: u32) -> [u32; BS as usize] {
    [x, x * 7 + 100]
}

pub fn tokens(seq: usize) -> Vec<u32> {
    SEQS[seq].iter().flat_map(|&x| block_tokens(x)).collect()
}

/// Content hashes of a sequence in a namespace, computed here from the spec's recipe.
pub fn contents(ns: usize, seq: usize) -> Vec<u64> {
    let seed = dynamo_seed(NS[ns].1, NS[ns].0);
    SEQS[seq].iter().map(|&x| xxh3_local(&block_tokens(x), seed)).collect()
}

/// The engine hash worker `w` names block `i` of (ns, seq) by: its own scheme over the
/// chain (scheme 0 is the router's own sequence hash, as Dynamo-hashing engines publish).
pub fn engine_hash(w: usize, ns: usize, seq: usize, i: usize) -> u64 {
    let c = contents(ns, seq);
    let mut k = None;
    for &ci in &c[..=i] {
        k = Some(chain_key(k, ci));
    }
    let k = k.unwrap();
    match w % 4 {
        0 => k,
        1 => k ^ 0x5555_aaaa_0f0f_f0f0,
        2 => k.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 17,
        _ => k.rotate_left(7),
    }
}

#[derive(Debug, Clone, Copy)]
pub enum Via {
    Typed,
    /// A batch at the cursor (the first batch of a worker: an arbitrary seq).
    Next,
    /// A batch below the cursor (a restart).
    Back,
    /// A batch past the cursor (a gap).
    Skip,
}

#[derive(Debug, Clone)]
pub enum Op {
    Store {
        w: usize,
        ns: usize,
        seq: usize,
        from: usize,
        len: usize,
        host: bool,
        bogus_parent: bool,
        via: Via,
    },
    Remove {
        w: usize,
        ns: usize,
        seq: usize,
        mask: u8,
        host: bool,
        via: Via,
    },
    Clear {
        w: usize,
        via: Via,
    },
    RemoveWorker {
        w: usize,
    },
}

fn via() -> impl Strategy<Value = Via> {
    prop_oneof![4 => Just(Via::Typed), 4 => Just(Via::Next), 1 => Just(Via::Back), 1 => Just(Via::Skip)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0..4usize, 0..3usize, 0..5usize, 0..5usize, 1..=5usize, prop::bool::weighted(0.25), prop::bool::weighted(0.05), via())
            .prop_map(|(w, ns, seq, from, len, host, bogus_parent, via)| Op::Store { w, ns, seq, from, len, host, bogus_parent, via }),
        5 => (0..4usize, 0..3usize, 0..5usize, any::<u8>(), prop::bool::weighted(0.25), via())
            .prop_map(|(w, ns, seq, mask, host, via)| Op::Remove { w, ns, seq, mask, host, via }),
        1 => (0..4usize, via()).prop_map(|(w, via)| Op::Clear { w, via }),
        1 => (0..4usize).prop_map(|w| Op::RemoveWorker { w }),
    ]
}

/// Drives one index and the reference through the same ops.
pub struct Harness {
    pub idx: RouterIndex,
    pub reference: Reference,
    refuse_gaps: bool,
    n: u64,
}

impl Harness {
    pub fn new(refuse_gaps: bool) -> Harness {
        let opts = RouterOptions {
            block_size: BS,
            max_workers: 4096,
            gap_policy: if refuse_gaps { GapPolicy::Refuse } else { GapPolicy::Clear },
        };
        Harness {
            idx: RouterIndex::new(opts).unwrap(),
            reference: Reference::new(),
            refuse_gaps,
            n: 0,
        }
    }

    /// Sends `ev` to the index as a batch (seq by `via`) and mirrors the cursor in the
    /// reference; whether the event was applied.
    fn batch(&mut self, w: Worker, ev: KvEvent, via: Via) -> bool {
        self.n += 1;
        let cursor = self.reference.next_seq(w);
        let seq = match (via, cursor) {
            (_, None) => 1000 + self.n % 7,
            (Via::Back, Some(c)) if c > 0 => c - 1 - self.n % c.min(3),
            (Via::Skip, Some(c)) => c + 1 + self.n % 3,
            (_, Some(c)) => c,
        };
        let encoding =
            if self.n.is_multiple_of(2) { Encoding::VllmArray } else { Encoding::VllmMap };
        let opts = WireOptions {
            encoding,
            signed_hashes: self.n.is_multiple_of(3),
            data_parallel_rank: w.dp_rank as i64,
            ..Default::default()
        };
        let payload = encode_batch(&EventBatch { ts: 1.5, events: vec![ev] }, &opts);
        let outcome = self.reference.batch_seq(w, seq, self.refuse_gaps);
        let r = self.idx.apply_batch(w.worker_id, seq, &payload);
        match outcome {
            SeqOutcome::Refuse => {
                assert_eq!(
                    r,
                    Err(RouterError::SequenceGap {
                        worker: w,
                        expected: cursor.unwrap(),
                        got: seq
                    })
                );
                false
            }
            _ => {
                let rep = r.expect("a batch with a good seq applies");
                assert_eq!(rep.cleared_first, outcome == SeqOutcome::ClearThenApply);
                true
            }
        }
    }

    pub fn apply(&mut self, op: &Op) {
        match *op {
            Op::Store { w, ns, seq, from, len, host, bogus_parent, via } => {
                let worker = WORKERS[w];
                let to = (from + len).min(5);
                let c = contents(ns, seq);
                let hashes: Vec<u64> = (from..to).map(|i| engine_hash(w, ns, seq, i)).collect();
                let parent = if bogus_parent {
                    Some(0xdead_beef_0000 + from as u64)
                } else {
                    (from > 0).then(|| engine_hash(w, ns, seq, from - 1))
                };
                let toks: Vec<u32> =
                    SEQS[seq][from..to].iter().flat_map(|&x| block_tokens(x)).collect();
                let medium = if host { Medium::CpuPinned } else { Medium::Gpu };
                let pairs: Vec<(u64, u64)> =
                    hashes.iter().copied().zip(c[from..to].iter().copied()).collect();
                let (lora, salt) = NS[ns];
                match via {
                    Via::Typed => {
                        let ok = self.reference.stored(
                            worker,
                            parent,
                            &pairs,
                            if host { HOST } else { GPU },
                        );
                        let r = self.idx.stored(worker, lora, salt, parent, &hashes, &toks, medium);
                        if ok {
                            r.unwrap();
                        } else {
                            assert_eq!(
                                r,
                                Err(RouterError::UnknownParent { parent: parent.unwrap() })
                            );
                        }
                    }
                    via => {
                        let ev = KvEvent::BlockStored {
                            block_hashes: hashes.clone(),
                            parent_block_hash: parent,
                            token_ids: toks,
                            block_size: BS,
                            lora_name: lora.map(Arc::from),
                            cache_salt: salt.map(Arc::from),
                            medium,
                        };
                        if self.batch(worker, ev, via) {
                            self.reference.stored(
                                worker,
                                parent,
                                &pairs,
                                if host { HOST } else { GPU },
                            );
                        }
                    }
                }
            }
            Op::Remove { w, ns, seq, mask, host, via } => {
                let worker = WORKERS[w];
                let hashes: Vec<u64> = (0..5)
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| engine_hash(w, ns, seq, i))
                    .collect();
                let medium = if host { Medium::CpuPinned } else { Medium::Gpu };
                let m = if host { HOST } else { GPU };
                match via {
                    Via::Typed => {
                        let before = self.reference.unknown_removals;
                        self.reference.removed(worker, &hashes, m);
                        let unknown = (self.reference.unknown_removals - before) as usize;
                        let r = self.idx.removed(worker, &hashes, medium);
                        if unknown == 0 {
                            r.unwrap();
                        } else {
                            assert_eq!(r, Err(RouterError::UnknownRemovals { count: unknown }));
                        }
                    }
                    via => {
                        let ev = KvEvent::BlockRemoved { block_hashes: hashes.clone(), medium };
                        if self.batch(worker, ev, via) {
                            self.reference.removed(worker, &hashes, m);
                        }
                    }
                }
            }
            Op::Clear { w, via } => {
                let worker = WORKERS[w];
                match via {
                    Via::Typed => {
                        self.reference.cleared(worker);
                        self.idx.cleared(worker);
                    }
                    via => {
                        if self.batch(worker, KvEvent::AllBlocksCleared, via) {
                            self.reference.cleared(worker);
                        }
                    }
                }
            }
            Op::RemoveWorker { w } => {
                let worker = WORKERS[w];
                let known = self.reference.has_worker(worker);
                self.reference.remove_worker(worker);
                assert_eq!(self.idx.remove_worker(worker), known);
            }
        }
    }

    /// Every query of every namespace against the reference, and the counters.
    pub fn check(&self) {
        let mut out = Vec::new();
        #[allow(clippy::needless_range_loop)]
        for ns in 0..NS.len() {
            for seq in 0..SEQS.len() {
                let c = contents(ns, seq);
                for len in [1, 3, 5] {
                    let want = self.reference.find(&c[..len]);
                    let t = tokens(seq);
                    self.idx.find(
                        &t[..(len * BS as usize + 1).min(t.len())],
                        NS[ns].0,
                        NS[ns].1,
                        &mut out,
                    );
                    out.sort();
                    assert_eq!(out, want, "find ns {ns} seq {seq} len {len}");
                    self.idx.find_hashes(&c[..len], &mut out);
                    out.sort();
                    assert_eq!(out, want, "find_hashes ns {ns} seq {seq} len {len}");
                }
            }
        }
        let s = self.idx.stats();
        assert_eq!(s.memberships, self.reference.memberships());
        assert_eq!(s.workers, self.reference.workers());
        for w in WORKERS {
            assert_eq!(self.idx.next_seq(w), self.reference.next_seq(w), "cursor of {w:?}");
        }
    }

    pub fn scores(&self) -> Vec<Vec<Score>> {
        let mut all = Vec::new();
        for ns in 0..NS.len() {
            for seq in 0..SEQS.len() {
                let mut out = Vec::new();
                self.idx.find_hashes(&contents(ns, seq), &mut out);
                out.sort();
                all.push(out);
            }
        }
        all
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn index_equals_reference(ops in prop::collection::vec(op(), 1..120), refuse_gaps in any::<bool>()) {
        let mut h = Harness::new(refuse_gaps);
        for op in &ops {
            h.apply(op);
            h.check();
        }
        // Dump and restore rebuild it exactly.
        let dump = h.idx.dump();
        let restored = RouterIndex::restore(h.idx.options(), &dump).unwrap();
        prop_assert_eq!(restored.dump(), dump);
        let before = h.scores();
        let s0 = h.idx.stats();
        let mut h2 = Harness { idx: restored, reference: h.reference.clone(), refuse_gaps, n: 0 };
        prop_assert_eq!(h2.scores(), before);
        let s1 = h2.idx.stats();
        prop_assert_eq!((s1.blocks, s1.memberships, s1.workers), (s0.blocks, s0.memberships, s0.workers));
        h2.check();
        // Memory back to empty once every worker is gone.
        for hh in [&mut h, &mut h2] {
            for w in WORKERS {
                hh.idx.remove_worker(w);
                hh.reference.remove_worker(w);
            }
            hh.check();
            let s = hh.idx.stats();
            prop_assert_eq!((s.blocks, s.memberships, s.workers), (0, 0, 0));
            prop_assert_eq!(s.bytes, hh.idx.empty_bytes() as u64);
        }
        let s = h.idx.stats();
        prop_assert_eq!(s.refused(radixkv_router::Refusal::UnknownParent), h.reference.unknown_parents);
        prop_assert_eq!(s.refused(radixkv_router::Refusal::UnknownRemoval), h.reference.unknown_removals);
    }
}
