//! Stress: writer threads (2x the cores) apply different workers' streams while reader
//! threads `find`. Every answer is checked against each worker's history: its score must
//! be the reference's after some prefix of that worker's events (a multi-block store or
//! removal counting block by block) that lies between the call's start and its end. At
//! quiescence the answers equal the reference exactly; once every worker is removed the
//! index is back to its empty size.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use radixkv::events::Medium;
use radixkv_router::{RouterIndex, RouterOptions, Worker, chain_key, content_hashes};

use crate::reference::{GPU, HOST, Reference};

const BS: u32 = 4;
const LEN: usize = 8;
const QUERIES: usize = 4;
const WORKERS_PER_WRITER: usize = 3;
const OPS_PER_WRITER: usize = 20_000;

/// Block letters of the queries: shared prefixes so workers meet on the same blocks.
const SEQS: [[u32; LEN]; QUERIES] = [
    [1, 2, 3, 4, 5, 6, 7, 8],
    [1, 2, 3, 9, 9, 9, 9, 9],
    [1, 2, 7, 7, 7, 1, 2, 3],
    [5, 5, 5, 5, 5, 5, 5, 5],
];

fn toks(q: usize, from: usize, to: usize) -> Vec<u32> {
    SEQS[q][from..to].iter().flat_map(|&x| (0..BS).map(move |j| x * 10 + j)).collect()
}

fn contents(q: usize) -> Vec<u64> {
    let mut c = Vec::new();
    content_hashes(&toks(q, 0, LEN), BS, None, None, &mut c);
    c
}

fn engine(w: usize, q: usize, i: usize) -> u64 {
    let c = contents(q);
    let mut k = None;
    for &ci in &c[..=i] {
        k = Some(chain_key(k, ci));
    }
    k.unwrap() ^ ((w as u64 % 3) * 0x1234_5678)
}

/// One worker's history: the reference's scores for every query after each step.
#[derive(Default)]
struct History {
    steps: Mutex<Vec<[(u32, u32); QUERIES]>>,
    /// Steps fully applied to the index.
    done: AtomicU64,
    /// Steps of the op in progress, counted to its end (published before it starts).
    started: AtomicU64,
}

fn snapshot(r: &Reference, w: Worker, cs: &[Vec<u64>]) -> [(u32, u32); QUERIES] {
    std::array::from_fn(|q| {
        r.find(&cs[q])
            .into_iter()
            .find(|s| s.worker == w)
            .map_or((0, 0), |s| (s.device_blocks, s.any_blocks))
    })
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn concurrent_writers_and_readers() {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let writers = (2 * cores).max(4);
    let nworkers = writers * WORKERS_PER_WRITER;
    let idx =
        Arc::new(RouterIndex::new(RouterOptions { block_size: BS, ..Default::default() }).unwrap());
    let workers: Vec<Worker> =
        (0..nworkers).map(|i| Worker::new(100 + i as u64 / 2, i as u32 % 2)).collect();
    let hist: Arc<Vec<History>> = Arc::new((0..nworkers).map(|_| History::default()).collect());
    for h in hist.iter() {
        h.steps.lock().unwrap().push([(0, 0); QUERIES]);
    }
    let cs: Arc<Vec<Vec<u64>>> = Arc::new((0..QUERIES).map(contents).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));

    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (idx, hist, cs, stop, checked, workers) = (
                idx.clone(),
                hist.clone(),
                cs.clone(),
                stop.clone(),
                checked.clone(),
                workers.clone(),
            );
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let mut q = r;
                while !stop.load(Ordering::Relaxed) {
                    q = (q + 1) % QUERIES;
                    let lo: Vec<u64> =
                        hist.iter().map(|h| h.done.load(Ordering::Acquire)).collect();
                    if q % 2 == 0 {
                        idx.find(&toks(q, 0, LEN), None, None, &mut out);
                    } else {
                        idx.find_hashes(&cs[q], &mut out);
                    }
                    let hi: Vec<u64> =
                        hist.iter().map(|h| h.started.load(Ordering::Acquire)).collect();
                    let mut seen = std::collections::HashSet::new();
                    for s in &out {
                        assert!(seen.insert(s.worker), "a worker listed twice");
                        assert!(s.any_blocks >= 1 && s.device_blocks <= s.any_blocks);
                    }
                    for (wi, w) in workers.iter().enumerate() {
                        let got = out
                            .iter()
                            .find(|s| s.worker == *w)
                            .map_or((0, 0), |s| (s.device_blocks, s.any_blocks));
                        let steps = hist[wi].steps.lock().unwrap();
                        let ok = (lo[wi]..=hi[wi]).any(|n| steps[n as usize][q] == got);
                        assert!(
                            ok,
                            "worker {w:?} query {q}: {got:?} is no state in steps {}..={}",
                            lo[wi], hi[wi]
                        );
                    }
                    checked.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();

    let writer_threads: Vec<_> = (0..writers)
        .map(|t| {
            let (idx, hist, cs, workers) = (idx.clone(), hist.clone(), cs.clone(), workers.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9 + t as u64 * 7919);
                let mine: Vec<usize> =
                    (t * WORKERS_PER_WRITER..(t + 1) * WORKERS_PER_WRITER).collect();
                let mut refs: Vec<Reference> = mine.iter().map(|_| Reference::new()).collect();
                for _ in 0..OPS_PER_WRITER {
                    let k = rng.below(mine.len() as u64) as usize;
                    let wi = mine[k];
                    let w = workers[wi];
                    let r = &mut refs[k];
                    let h = &hist[wi];
                    let q = rng.below(QUERIES as u64) as usize;
                    let roll = rng.below(100);
                    // Each op: the reference's states for each of its steps go into the history
                    // first, then `started` moves to its end, then the index applies it, then
                    // `done` follows.
                    let mut steps = Vec::new();
                    let apply: Box<dyn FnOnce(&RouterIndex)>;
                    if roll < 55 {
                        let from = rng.below(LEN as u64) as usize;
                        let to = (from + 1 + rng.below(4) as usize).min(LEN);
                        let medium = if rng.below(5) == 0 { HOST } else { GPU };
                        let parent = (from > 0).then(|| engine(wi, q, from - 1));
                        let blocks: Vec<(u64, u64)> =
                            (from..to).map(|i| (engine(wi, q, i), cs[q][i])).collect();
                        if parent.is_none_or(|p| r.has_block(w, p)) {
                            for j in 0..blocks.len() {
                                let mut rr = r.clone();
                                rr.stored(w, parent, &blocks[..=j], medium);
                                steps.push(snapshot(&rr, w, &cs));
                            }
                        }
                        r.stored(w, parent, &blocks, medium);
                        let hashes: Vec<u64> = blocks.iter().map(|b| b.0).collect();
                        let t = toks(q, from, to);
                        let m = if medium == HOST { Medium::CpuPinned } else { Medium::Gpu };
                        apply = Box::new(move |idx| {
                            let _ = idx.stored(w, None, None, parent, &hashes, &t, m);
                        });
                    } else if roll < 90 {
                        let n = 1 + rng.below(3) as usize;
                        let hashes: Vec<u64> =
                            (0..n).map(|_| engine(wi, q, rng.below(LEN as u64) as usize)).collect();
                        let medium = if rng.below(5) == 0 { HOST } else { GPU };
                        for j in 0..hashes.len() {
                            r.removed(w, &hashes[j..=j], medium);
                            steps.push(snapshot(r, w, &cs));
                        }
                        let m = if medium == HOST { Medium::CpuPinned } else { Medium::Gpu };
                        apply = Box::new(move |idx| {
                            let _ = idx.removed(w, &hashes, m);
                        });
                    } else if roll < 96 {
                        r.cleared(w);
                        steps.push(snapshot(r, w, &cs));
                        apply = Box::new(move |idx| idx.cleared(w));
                    } else {
                        r.remove_worker(w);
                        steps.push(snapshot(r, w, &cs));
                        apply = Box::new(move |idx| {
                            idx.remove_worker(w);
                        });
                    }
                    let n = steps.len() as u64;
                    let end = {
                        let mut s = h.steps.lock().unwrap();
                        s.extend(steps);
                        s.len() as u64 - 1
                    };
                    h.started.store(end, Ordering::Release);
                    apply(&idx);
                    let _ = n;
                    h.done.store(end, Ordering::Release);
                }
                refs
            })
        })
        .collect();

    let mut merged: Vec<(usize, Reference)> = Vec::new();
    for (t, th) in writer_threads.into_iter().enumerate() {
        for (k, r) in th.join().unwrap().into_iter().enumerate() {
            merged.push((t * WORKERS_PER_WRITER + k, r));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    assert!(checked.load(Ordering::Relaxed) > 0);
    eprintln!("stress: {} answers checked", checked.load(Ordering::Relaxed));

    // Quiescence: exact equality with the references, worker by worker.
    let mut out = Vec::new();
    for q in 0..QUERIES {
        idx.find_hashes(&cs[q], &mut out);
        for (wi, r) in &merged {
            let w = workers[*wi];
            let want = r.find(&cs[q]).into_iter().find(|s| s.worker == w);
            let got = out.iter().copied().find(|s| s.worker == w);
            assert_eq!(got, want, "worker {w:?} query {q} at quiescence");
        }
    }
    let mems: u64 = merged.iter().map(|(_, r)| r.memberships()).sum();
    assert_eq!(idx.stats().memberships, mems);

    // Memory back to empty.
    for w in &workers {
        idx.remove_worker(*w);
    }
    idx.reclaim();
    let s = idx.stats();
    assert_eq!((s.workers, s.blocks, s.memberships), (0, 0, 0));
    assert_eq!(s.bytes, idx.empty_bytes() as u64);
}
