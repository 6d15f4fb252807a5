//! The loom test binary's global allocator: it keeps the most recently freed blocks out of
//! use (a FIFO of up to [`HELD`] frees) before handing them back to the system allocator.
//! A node used after it was freed then still holds the poison its drop wrote, and
//! `Node::check_alive` (under `cfg(loom)`) turns the use into a failed model instead of a
//! silent read of whatever was allocated there next. Memory held is bounded by `HELD`
//! blocks.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Freed blocks held back before they go to the system allocator.
const HELD: usize = 1 << 16;

/// See the module docs.
pub struct Quarantine;

struct Ring {
    blocks: [(usize, Layout); HELD],
    next: usize,
    full: bool,
}

struct Shared(UnsafeCell<Ring>);

// SAFETY: the ring is only touched while `LOCK` is held.
unsafe impl Sync for Shared {}

static LOCK: AtomicBool = AtomicBool::new(false);
static RING: Shared = Shared(UnsafeCell::new(Ring {
    blocks: [(0, Layout::new::<u8>()); HELD],
    next: 0,
    full: false,
}));

// SAFETY: allocation is the system allocator's; a free is delayed, never lost or doubled:
// each block is handed to `System.dealloc` once, with its own layout, when it leaves the
// ring.
unsafe impl GlobalAlloc for Quarantine {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // A spin lock: a std Mutex could allocate, which would re-enter this allocator.
        while LOCK.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: `LOCK` is held.
        let ring = unsafe { &mut *RING.0.get() };
        let out = ring.full.then(|| ring.blocks[ring.next]);
        ring.blocks[ring.next] = (ptr as usize, layout);
        ring.next = (ring.next + 1) % HELD;
        ring.full |= ring.next == 0;
        LOCK.store(false, Ordering::Release);
        if let Some((old, old_layout)) = out {
            // SAFETY: `old` was allocated by `System` with `old_layout` and freed once.
            unsafe { System.dealloc(old as *mut u8, old_layout) };
        }
    }
}
