//! [`HostKvStorage`]: KV buffers in ordinary host memory.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{CopyPlan, KvLayout, KvStorage, Run, check_layer, check_slot_io, device};
use crate::error::{Result, invalid};

/// Alignment of every buffer, in bytes (what vectorized kernels and DMA engines like).
const ALIGN: usize = 256;

/// One zero-initialized, `ALIGN`-aligned heap allocation that never moves and is freed on
/// drop.
struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl AlignedBuf {
    /// Allocates `bytes` zeroed bytes (`bytes > 0`).
    fn zeroed(bytes: usize) -> Result<AlignedBuf> {
        debug_assert!(bytes > 0);
        let layout = Layout::from_size_align(bytes, ALIGN)
            .map_err(|e| device(format!("host KV buffer of {bytes} bytes: {e}")))?;
        // SAFETY: `layout` has a non-zero size (`bytes > 0`: every dimension of a validated
        // KvLayout is at least 1) and a power-of-two alignment, as `alloc_zeroed` requires.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw)
            .ok_or_else(|| device(format!("host KV buffer of {bytes} bytes: out of memory")))?;
        Ok(AlignedBuf { ptr, layout })
    }

    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed(self.layout)` and is freed only here, once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: an `AlignedBuf` owns its allocation outright (no aliasing owner, no thread
// affinity); moving it to another thread is like moving a `Box<[u8]>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: `&AlignedBuf` only hands out the raw pointer. Every read and write through it
// inside this crate happens under `HostKvStorage::lock` (reads shared, writes exclusive),
// so shared references on many threads never race.
unsafe impl Sync for AlignedBuf {}

/// KV storage in host memory: `2 * num_layers` separate zero-initialized allocations,
/// each aligned to 256 bytes, that never move and are freed on drop.
///
/// [`write_slot`](KvStorage::write_slot) and [`copy_slots`](KvStorage::copy_slots) take an
/// internal lock exclusively, [`read_slot`](KvStorage::read_slot) shares it, so the safe
/// API never races with itself. Memory touched through [`k_ptr`](KvStorage::k_ptr) /
/// [`v_ptr`](KvStorage::v_ptr) is the caller's to order.
pub struct HostKvStorage {
    layout: KvLayout,
    /// K buffer of layer `l` at `2 * l`, V buffer at `2 * l + 1`.
    bufs: Vec<AlignedBuf>,
    /// Guards the contents of `bufs` for the safe API (the `RwLock` holds no data: the
    /// bytes live behind raw pointers).
    lock: RwLock<()>,
}

impl std::fmt::Debug for HostKvStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostKvStorage").field("layout", &self.layout).finish_non_exhaustive()
    }
}

impl HostKvStorage {
    /// Allocates a zeroed store of `layout` ([`Error::InvalidArgument`] when the layout is
    /// invalid, [`Error::Device`] when the memory cannot be had).
    ///
    /// [`Error::InvalidArgument`]: crate::Error::InvalidArgument
    /// [`Error::Device`]: crate::Error::Device
    pub fn new(layout: KvLayout) -> Result<HostKvStorage> {
        layout.validate()?;
        let bytes = layout.buffer_bytes();
        let bufs = (0..2 * layout.num_layers)
            .map(|_| AlignedBuf::zeroed(bytes))
            .collect::<Result<Vec<_>>>()?;
        Ok(HostKvStorage { layout, bufs, lock: RwLock::new(()) })
    }

    fn read(&self) -> RwLockReadGuard<'_, ()> {
        // The lock guards no data of its own and the bytes are valid whatever a panicking
        // writer left, so poisoning is ignored.
        self.lock.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, ()> {
        self.lock.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Base pointers of layer `layer`'s K and V buffers.
    fn kv(&self, layer: usize) -> [*mut u8; 2] {
        [self.bufs[2 * layer].as_ptr(), self.bufs[2 * layer + 1].as_ptr()]
    }

    /// Copies `runs` from buffer `src` to buffer `dst` (slot units of `sb` bytes).
    ///
    /// # Safety
    /// The caller holds the write lock; every run lies inside both buffers (`src` and
    /// `dst` hold at least `(run.src + run.len) * sb` and `(run.dst + run.len) * sb`
    /// bytes); no source range overlaps a destination range.
    unsafe fn copy_runs(src: *const u8, dst: *mut u8, runs: &[Run], sb: usize) {
        for r in runs {
            // SAFETY: in bounds and non-overlapping by this function's contract; `u8` has
            // no alignment requirement.
            unsafe {
                std::ptr::copy_nonoverlapping(src.add(r.src * sb), dst.add(r.dst * sb), r.len * sb)
            }
        }
    }
}

impl HostKvStorage {
    /// Copies slot `src_slots[i]` of `self` to slot `dst_slots[i]` of `dst`, in every layer,
    /// K and V: the host tier's copy between two stores ([`crate::tier`]). The layouts must
    /// agree in everything but `num_slots`; slots must be in range and destinations
    /// distinct (`InvalidArgument` otherwise, nothing copied). `self` and `dst` must be
    /// different stores. Copies in both directions between two stores may run at once from
    /// any threads (the two stores' locks are taken in one global order).
    pub fn copy_to(&self, src_slots: &[u32], dst: &HostKvStorage, dst_slots: &[u32]) -> Result<()> {
        let (a, b) = (&self.layout, &dst.layout);
        if std::ptr::eq(self, dst) {
            return Err(invalid(
                "copy_to: source and destination are the same store (use copy_slots)",
            ));
        }
        if (a.num_layers, a.num_kv_heads, a.head_dim, a.elem_bytes)
            != (b.num_layers, b.num_kv_heads, b.head_dim, b.elem_bytes)
        {
            return Err(invalid(format!(
                "copy_to: layouts differ beyond num_slots ({a:?} vs {b:?})"
            )));
        }
        let runs = check_pairs(a.num_slots, b.num_slots, src_slots, dst_slots)?;
        let sb = a.slot_bytes();
        // Lock order: the store at the lower address first, whichever side it is, so two
        // copies in opposite directions between the same two stores (a backup racing a
        // load-back) cannot each hold the lock the other waits for.
        let (_r, _w) = if (self as *const Self) < (dst as *const Self) {
            let r = self.read();
            (r, dst.write())
        } else {
            let w = dst.write();
            (self.read(), w)
        };
        for (sbuf, dbuf) in self.bufs.iter().zip(&dst.bufs) {
            // SAFETY: we hold the source's read lock and the destination's write lock (two
            // different stores, so two different allocations: no range overlaps); every
            // run's slots are below each side's num_slots (`check_pairs`), and each buffer
            // holds num_slots * sb bytes.
            unsafe { Self::copy_runs(sbuf.as_ptr(), dbuf.as_ptr(), &runs, sb) }
        }
        Ok(())
    }
}

/// Checks slot pairs for a copy between two stores of `ns` and `nd` slots and coalesces
/// them into runs: equal lengths, every slot in range, no destination twice.
pub(crate) fn check_pairs(ns: usize, nd: usize, src: &[u32], dst: &[u32]) -> Result<Vec<Run>> {
    if src.len() != dst.len() {
        return Err(invalid(format!(
            "copy: {} source slots but {} destinations",
            src.len(),
            dst.len()
        )));
    }
    if let Some(s) = src.iter().find(|&&s| s as usize >= ns) {
        return Err(invalid(format!("copy: source slot {s} is out of range (num_slots = {ns})")));
    }
    if let Some(d) = dst.iter().find(|&&d| d as usize >= nd) {
        return Err(invalid(format!(
            "copy: destination slot {d} is out of range (num_slots = {nd})"
        )));
    }
    let mut seen = dst.to_vec();
    seen.sort_unstable();
    if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
        return Err(invalid(format!("copy: destination slot {} is given twice", w[0])));
    }
    Ok(super::coalesce(src.iter().zip(dst).map(|(&s, &d)| (s as usize, d as usize))))
}

impl KvStorage for HostKvStorage {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }

    fn k_ptr(&self, layer: usize) -> Result<u64> {
        check_layer(&self.layout, "k_ptr", layer)?;
        Ok(self.kv(layer)[0] as u64)
    }

    fn v_ptr(&self, layer: usize) -> Result<u64> {
        check_layer(&self.layout, "v_ptr", layer)?;
        Ok(self.kv(layer)[1] as u64)
    }

    fn copy_slots(&self, src: &[u32], dst: &[u32]) -> Result<()> {
        let plan = CopyPlan::new(&self.layout, src, dst)?;
        let sb = self.layout.slot_bytes();
        match plan {
            CopyPlan::Direct(runs) => {
                let _guard = self.write();
                for buf in &self.bufs {
                    let p = buf.as_ptr();
                    // SAFETY: we hold the write lock. Every run's slots are < num_slots
                    // (checked by CopyPlan::new) and the buffer holds num_slots * sb
                    // bytes. A direct plan has no destination that is also a source and
                    // distinct destinations, and runs are whole slots, so no source range
                    // overlaps a destination range.
                    unsafe { Self::copy_runs(p, p, &runs, sb) }
                }
            }
            CopyPlan::TwoPhase { gather, scatter, scratch_slots } => {
                let mut scratch = vec![0u8; scratch_slots * sb];
                let _guard = self.write();
                for buf in &self.bufs {
                    let p = buf.as_ptr();
                    // SAFETY: we hold the write lock. Gather runs read slots < num_slots
                    // of `p` and write scratch indices < scratch_slots of `scratch`
                    // (exactly scratch_slots * sb bytes); scatter runs the reverse. The
                    // scratch vector is a separate allocation, so no range overlaps.
                    unsafe {
                        Self::copy_runs(p, scratch.as_mut_ptr(), &gather, sb);
                        Self::copy_runs(scratch.as_ptr(), p, &scatter, sb);
                    }
                }
            }
        }
        Ok(())
    }

    fn write_slot(&self, layer: usize, slot: u32, k: &[u8], v: &[u8]) -> Result<()> {
        check_slot_io(&self.layout, "write_slot", layer, slot, k.len(), v.len())?;
        let off = self.layout.slot_offset(slot);
        let _guard = self.write();
        for (base, data) in self.kv(layer).into_iter().zip([k, v]) {
            // SAFETY: we hold the write lock; `off + slot_bytes <= buffer_bytes` since
            // slot < num_slots, and `data` is exactly slot_bytes long (both checked above);
            // `data` is caller memory, a different allocation from ours.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base.add(off), data.len()) }
        }
        Ok(())
    }

    fn read_slot(&self, layer: usize, slot: u32, k_out: &mut [u8], v_out: &mut [u8]) -> Result<()> {
        check_slot_io(&self.layout, "read_slot", layer, slot, k_out.len(), v_out.len())?;
        let off = self.layout.slot_offset(slot);
        let _guard = self.read();
        for (base, out) in self.kv(layer).into_iter().zip([k_out, v_out]) {
            // SAFETY: we hold the read lock, so no writer runs; the range is in bounds and
            // `out` is exactly slot_bytes long (checked above); the buffer was zeroed at
            // allocation, so every byte read is initialized; `out` is a separate
            // allocation.
            unsafe { std::ptr::copy_nonoverlapping(base.add(off), out.as_mut_ptr(), out.len()) }
        }
        Ok(())
    }
}
