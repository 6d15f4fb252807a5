//! A counting global allocator for the binaries that measure memory (included with
//! `#[path]` by `tests/index_memory.rs`, `tests/tree_memory.rs` and
//! `examples/namespaces.rs`): it forwards to the system allocator and keeps the live bytes
//! asked for.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// The allocator; install it with `#[global_allocator]`.
pub struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from `alloc` with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
}

/// The live bytes asked for and not given back, since the process started.
pub fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}
