//! KV events under concurrency: threads (2x the cores) insert, insert-and-lock, match,
//! lock (splitting edges), evict and drop namespaces on a small pooled cache with events
//! on, flushing and draining as they go. At quiescence the drained stream, applied in
//! sequence order (gapless, no store under a parent not held, no removal of a page not
//! held), must hold exactly the tree's cached pages.

use radixkv::InsertOptions;
use std::sync::{Arc, Mutex};

use radixkv::events::{EventBatch, NamespaceMeta};
use radixkv::{Cache, CacheOptions, Error, EventOptions, EvictionPolicy};

use crate::replay;
use crate::rng;
use rng::Rng;

fn run(page: usize, pool: usize, policy: EvictionPolicy, cycles: usize) {
    let mut cache = Cache::new(CacheOptions {
        page_size: page,
        policy,
        pool_slots: pool,
        ..Default::default()
    })
    .unwrap();
    cache.enable_events(EventOptions::default()).unwrap();
    cache
        .set_namespace_meta(
            2,
            NamespaceMeta { lora_name: Some("adapter".into()), cache_salt: None },
        )
        .unwrap();
    let cache = Arc::new(cache);
    let drained: Arc<Mutex<Vec<(u64, EventBatch)>>> = Arc::default();
    let threads = 2 * std::thread::available_parallelism().map_or(2, |n| n.get());
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (cache, drained) = (cache.clone(), drained.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ ((t as u64 + 1) * 0x9e37_79b9));
                let mut out: Vec<u32> = Vec::new();
                for _ in 0..cycles {
                    let ns = rng.below(3);
                    let fam = rng.below(4) as u32;
                    let len = 1 + rng.below(12 * page as u64) as usize;
                    // Shared prefixes (one per family), then a tail from a small alphabet,
                    // so inserts share edges, split them and race on them.
                    let tokens: Vec<u32> =
                        (0..len)
                            .map(|i| {
                                if i < 2 * page {
                                    fam * 100 + i as u32
                                } else {
                                    rng.below(3) as u32
                                }
                            })
                            .collect();
                    let n = tokens.len() / page * page;
                    let op = rng.below(10);
                    match if n == 0 && op <= 4 { 5 } else { op } {
                        0..=3 => {
                            let mut slots = Vec::new();
                            match cache.alloc(n, &mut slots) {
                                Ok(()) => {
                                    cache.insert(ns, &tokens[..n], &slots).unwrap();
                                }
                                Err(Error::OutOfSlots { .. }) => {}
                                Err(e) => panic!("{e}"),
                            }
                        }
                        4 => {
                            let mut slots = Vec::new();
                            if cache.alloc(n, &mut slots).is_ok() {
                                let (_, l) = cache
                                    .insert_and_lock(
                                        ns,
                                        &tokens[..n],
                                        &slots,
                                        InsertOptions::default(),
                                    )
                                    .map(|(e, l)| (e, l.into_raw()))
                                    .unwrap();
                                cache.match_prefix(ns, &tokens, &mut out);
                                cache.release(l).unwrap();
                            }
                        }
                        5 | 6 => {
                            cache.match_prefix(ns, &tokens, &mut out);
                        }
                        7 => {
                            let l = cache.match_and_lock(ns, &tokens, &mut out);
                            drop(l);
                        }
                        8 => {
                            cache.evict(rng.below(8 * page as u64) as usize, None).unwrap();
                        }
                        _ => {
                            if rng.below(8) == 0 {
                                cache.drop_namespace(ns, None).unwrap();
                            } else {
                                cache.flush_events();
                                if rng.below(4) == 0 {
                                    drained.lock().unwrap().extend(cache.drain_events());
                                }
                            }
                        }
                    }
                    if rng.below(16) == 0 {
                        cache.flush_events();
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    cache.flush_events();
    let mut all = std::mem::take(&mut *drained.lock().unwrap());
    all.extend(cache.drain_events());
    all.sort_by_key(|b| b.0);
    assert_eq!(cache.events().unwrap().stats().dropped, 0);
    let held = replay::replay(&all);
    let cached = cache.tree().cached_page_hashes();
    assert!(!all.is_empty());
    assert_eq!(held.len(), cached.len(), "pages held by the stream vs cached");
    assert_eq!(held, cached);
    cache.tree().check_invariants().unwrap();
    let st = cache.stats().tree;
    assert!(
        st.evicted_tokens > 0 && st.inserted_tokens > st.evicted_tokens,
        "the run evicted and re-inserted"
    );
    // Exactly as many hashes as cached pages: every node kept its share.
    assert_eq!(cached.len() as u64 * page as u64, cache.stats().tree.cached_tokens);
}

#[test]
fn stream_replays_to_the_tree_s_pages_page_1() {
    run(1, 96, EvictionPolicy::Lru, 50_000);
}

#[test]
fn stream_replays_to_the_tree_s_pages_page_4_fifo() {
    run(4, 256, EvictionPolicy::Fifo, 50_000);
}

#[test]
fn stream_replays_to_the_tree_s_pages_page_2_mru() {
    run(2, 128, EvictionPolicy::Mru, 30_000);
}

#[test]
fn stream_replays_to_the_tree_s_pages_page_1_priority() {
    run(1, 96, EvictionPolicy::Priority, 30_000);
}
