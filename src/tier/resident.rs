//! The host index's large tables, resident from the start.
//!
//! The slab of entries and the map's buckets are sized for the host's capacity up front
//! (`host_index.rs`, `id_map.rs`). Left to fault in where backups land, their first
//! touches were page faults in the replay loop (one per 51 slab entries, one per 512 map
//! buckets, and each first touch is a page cleared by the kernel): 16-18% of a
//! `write_through` loop on a VM. [`resident_vec`] writes them at construction instead, on
//! Linux asking for transparent huge pages first (`madvise(MADV_HUGEPAGE)`: one fault per
//! 2 MiB instead of per 4 KiB, and a TLB entry covering 512 times the memory, which the
//! map's random probes and the slab's scattered entries want).

/// A vector of capacity `cap` holding `len` copies of `value` (`len <= cap`), its buffer
/// advised for huge pages (Linux; a hint) before `value` is written over it, so those
/// `len` elements are resident when this returns. The rest of the capacity is left
/// untouched (faulted in where it is first written).
///
/// A `value` of all-zero bits must be opaque to the compiler (`std::hint::black_box`), or
/// the fill may fold into a zeroed allocation whose pages stay untouched.
pub(super) fn resident_vec<T: Clone>(cap: usize, len: usize, value: T) -> Vec<T> {
    let mut v = Vec::with_capacity(cap);
    advise_huge(&v);
    v.resize(len.min(cap), value);
    v
}

#[cfg(all(target_os = "linux", not(loom), not(miri)))]
fn advise_huge<T>(v: &Vec<T>) {
    /// Below this, a buffer is not worth a system call (and may share its pages with other
    /// allocations on the heap).
    const HUGE_MIN_BYTES: usize = 4 << 20;
    const PAGE: usize = 4096;
    const MADV_HUGEPAGE: i32 = 14;
    unsafe extern "C" {
        fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
    }
    let bytes = v.capacity() * std::mem::size_of::<T>();
    if bytes < HUGE_MIN_BYTES {
        return;
    }
    let start = v.as_ptr() as usize;
    let (lo, hi) = (start.div_ceil(PAGE) * PAGE, (start + bytes) / PAGE * PAGE);
    if hi > lo {
        // SAFETY: `[lo, hi)` is whole pages inside `v`'s own allocation (a live buffer of
        // `bytes` bytes that nothing else references yet); MADV_HUGEPAGE changes no byte of
        // it and no mapping's protection, only which pages may back it, so no Rust value is
        // affected. The result is ignored: on a kernel without THP, or with pages larger than
        // `PAGE` (an unaligned `lo`: EINVAL), the advice is simply not taken.
        let _ = unsafe { madvise(lo as *mut std::ffi::c_void, hi - lo, MADV_HUGEPAGE) };
    }
}

#[cfg(not(all(target_os = "linux", not(loom), not(miri))))]
fn advise_huge<T>(_v: &Vec<T>) {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn holds_len_copies_within_cap() {
        let v = resident_vec(1 << 20, 1000, 7u64);
        assert_eq!(v.len(), 1000);
        assert!(v.capacity() >= 1 << 20);
        assert!(v.iter().all(|&x| x == 7));
        let z = resident_vec(10, 20, std::hint::black_box(0u64));
        assert_eq!(z.len(), 10);
    }
}
