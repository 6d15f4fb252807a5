//! `find` with a caller's buffer allocates nothing once the buffers have grown: counted by
//! a global allocator that counts the calling thread's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use radixkv::events::Medium;
use radixkv_router::{FindScratch, RouterIndex, RouterOptions, Worker};

struct PerThread;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; the thread-local counter
// is const-initialised and has no destructor, so touching it allocates nothing.
unsafe impl GlobalAlloc for PerThread {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.with(|a| a.set(a.get() + 1));
        // SAFETY: forwarded as is.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from this allocator with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.with(|a| a.set(a.get() + 1));
        // SAFETY: forwarded as is.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static ALLOC: PerThread = PerThread;

fn allocs() -> u64 {
    ALLOCS.with(|a| a.get())
}

#[test]
fn find_allocates_nothing_with_a_callers_buffer() {
    let idx = RouterIndex::new(RouterOptions { block_size: 4, ..Default::default() }).unwrap();
    let t: Vec<u32> = (0..64).collect();
    let hashes: Vec<u64> = (1..=16).collect();
    for w in 0..20 {
        idx.stored(
            Worker::new(w, 0),
            None,
            None,
            None,
            &hashes[..(w as usize % 16) + 1],
            &t[..((w as usize % 16) + 1) * 4],
            Medium::Gpu,
        )
        .unwrap();
    }
    let mut scratch = FindScratch::new();
    let mut out = Vec::new();
    let mut contents = Vec::new();
    radixkv_router::content_hashes(&t, 4, None, None, &mut contents);
    // Warm up: the buffers grow to the request and the workers met.
    idx.find_with(&mut scratch, &t, None, None, &mut out);
    idx.find_hashes_with(&mut scratch, &contents, &mut out);
    idx.find(&t, None, None, &mut out);
    let before = allocs();
    for _ in 0..100 {
        idx.find_with(&mut scratch, &t, None, None, &mut out);
        idx.find_hashes_with(&mut scratch, &contents, &mut out);
        idx.find(&t, None, None, &mut out);
        idx.find_hashes(&contents, &mut out);
    }
    assert_eq!(allocs() - before, 0);
    assert_eq!(out.len(), 20);
}
