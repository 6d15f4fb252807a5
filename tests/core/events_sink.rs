//! The event sink under concurrency: pushes from many threads, flushes from another, every
//! event once, each thread's in its push order, batch numbers gapless.

#![cfg(not(loom))]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use radixkv::events::{EventSink, KvEvent, SinkOptions};

#[test]
fn concurrent_pushes_and_flushes_lose_and_reorder_nothing() {
    let sink =
        Arc::new(EventSink::new(SinkOptions { block_size: 1, ..Default::default() }).unwrap());
    let (threads, per) = (4u64, 20_000u64);
    let done = Arc::new(AtomicBool::new(false));
    let flusher = {
        let (sink, done) = (sink.clone(), done.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !done.load(Ordering::Acquire) {
                n += sink.flush().is_some() as u64;
                std::thread::yield_now();
            }
            n
        })
    };
    let pushers: Vec<_> = (0..threads)
        .map(|t| {
            let sink = sink.clone();
            std::thread::spawn(move || {
                for i in 0..per {
                    // Stores do not merge, so each push stays one event.
                    sink.stored(0, vec![t << 32 | i], None, vec![i as u32]);
                }
            })
        })
        .collect();
    for p in pushers {
        p.join().unwrap();
    }
    done.store(true, Ordering::Release);
    let flushed = flusher.join().unwrap() + sink.flush().is_some() as u64;
    let batches = sink.drain();
    assert_eq!(batches.len() as u64, flushed);
    let mut next = vec![0u64; threads as usize];
    for (k, (seq, b)) in batches.iter().enumerate() {
        assert_eq!(*seq, k as u64, "gapless, in order");
        assert!(!b.events.is_empty(), "no empty batch");
        for e in &b.events {
            let KvEvent::BlockStored { block_hashes, .. } = e else { panic!("{e:?}") };
            let (t, i) = ((block_hashes[0] >> 32) as usize, block_hashes[0] & 0xffff_ffff);
            assert_eq!(i, next[t], "thread {t}'s events in push order, each once");
            next[t] += 1;
        }
    }
    assert!(next.iter().all(|&n| n == per), "every event: {next:?}");
    assert_eq!(sink.stats().events, threads * per);
    assert_eq!(sink.stats().dropped, 0);
}
