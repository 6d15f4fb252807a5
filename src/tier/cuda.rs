//! [`CudaTierCopier`] (feature `cuda`): the host tier's copies between a [`CudaKvStorage`] (GPU memory) and
//! pinned host memory, on a stream of its own, one completion event per copy.
//!
//! The host side is `2 * num_layers` page-locked buffers (`cuMemHostAlloc`), shaped like
//! the device store's buffers but with `host_slots` slots. A copy coalesces its slot pairs
//! into runs (both sides consecutive) and queues one `cuMemcpyDtoHAsync` /
//! `cuMemcpyHtoDAsync` per run per buffer on the copier's non-blocking stream, then
//! records an event: [`TierCopier::poll`] is `cuEventQuery`, [`TierCopier::wait`] is
//! `cuEventSynchronize`. Copies on the one stream run in the order they were started.
//!
//! **Ordering with the engine's streams** is the engine's: the copier's stream does not
//! wait for kernels on other streams, so start a backup only after the KV of its slots is
//! written (as SGLang does, after the forward pass that wrote them completes), and use
//! loaded slots only after the load-back's copy completed (`wait_load`, or its poll
//! saying done). The tier itself never hands out a loaded page before that.
//!
//! A driver error while queueing a copy synchronizes the stream (nothing of it stays
//! queued) and is [`Error::Device`]; an error reported by the event is [`Error::Device`]
//! from `poll`/`wait`. Either way the tier rolls the copy back.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaStream, DriverError, result, sys};

use super::{CopyTicket, TierCopier};
use crate::error::{Error, Result, invalid};
use crate::kv::{CudaKvStorage, KvLayout, KvStorage, check_pairs, device};

/// One pinned host buffer (`cuMemHostAlloc`), freed by the copier's drop.
struct Pinned(*mut u8);

/// What the lock guards: the events of the copies in flight, by ticket.
struct State {
    next: u64,
    events: HashMap<u64, sys::CUevent>,
}

/// Copies between a [`CudaKvStorage`] and pinned host memory (see the module docs).
/// `Send + Sync`; the calls that queue copies or touch events are serialized by a lock.
pub struct CudaTierCopier {
    device: Arc<CudaKvStorage>,
    /// The host side's shape (the device store's, with `host_slots` slots).
    host_layout: KvLayout,
    /// Layer `l`'s K at `2 * l`, V at `2 * l + 1`.
    host: Vec<Pinned>,
    stream: Arc<CudaStream>,
    state: Mutex<State>,
}

// SAFETY: the raw pointers are page-locked host allocations owned by the copier, freed
// only in its drop; every write through them is queued by a call holding `state`'s lock or
// made by the caller through `write_host_slot` / `read_host_slot` (also under the lock).
// The CUDA handles (events, stream) are usable from any thread once the context is bound,
// which every call does first.
unsafe impl Send for CudaTierCopier {}
// SAFETY: as for `Send`: shared access goes through `state`'s lock.
unsafe impl Sync for CudaTierCopier {}

impl std::fmt::Debug for CudaTierCopier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaTierCopier")
            .field("host_layout", &self.host_layout)
            .finish_non_exhaustive()
    }
}

fn drv(op: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |e| device(format!("{op}: {e}"))
}

impl CudaTierCopier {
    /// A copier between `device` and `host_slots` slots of pinned host memory (zeroed).
    /// [`Error::Device`] when the pinned memory cannot be had; `InvalidArgument` for
    /// `host_slots` 0 or beyond `2^32`.
    pub fn new(store: Arc<CudaKvStorage>, host_slots: usize) -> Result<CudaTierCopier> {
        let d = *store.layout();
        let host_layout = KvLayout { num_slots: host_slots, ..d };
        host_layout.validate()?;
        let ctx = store.context().clone();
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        let mut c = CudaTierCopier {
            device: store,
            host_layout,
            host: Vec::with_capacity(2 * d.num_layers),
            stream,
            state: Mutex::new(State { next: 0, events: HashMap::new() }),
        };
        let bytes = host_layout.buffer_bytes();
        for _ in 0..2 * d.num_layers {
            // SAFETY: the context is current; the allocation is zeroed below before use
            // and freed once in drop (a failure here drops `c`, freeing the earlier ones).
            let p = unsafe { result::malloc_host(bytes, 0) }
                .map_err(|e| device(format!("cuMemHostAlloc of {bytes} pinned bytes: {e}")))?;
            // SAFETY: `p` is a fresh host allocation of `bytes` bytes.
            unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
            c.host.push(Pinned(p.cast()));
        }
        Ok(c)
    }

    /// The device store.
    pub fn device(&self) -> &Arc<CudaKvStorage> {
        &self.device
    }

    /// The host side's shape.
    pub fn host_layout(&self) -> &KvLayout {
        &self.host_layout
    }

    /// Host address of layer `layer`'s K (`v = false`) or V buffer in pinned memory.
    pub fn host_ptr(&self, layer: usize, v: bool) -> Result<u64> {
        crate::kv::check_layer(&self.host_layout, "host_ptr", layer)?;
        Ok(self.host[2 * layer + v as usize].0 as u64)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Each critical section leaves the map consistent: a poisoned lock is taken over.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads one host slot of one layer (tests and tools; no copy may be writing it).
    pub fn read_host_slot(
        &self,
        layer: usize,
        slot: u32,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<()> {
        crate::kv::check_slot_io(
            &self.host_layout,
            "read_host_slot",
            layer,
            slot,
            k.len(),
            v.len(),
        )?;
        let _g = self.lock();
        let off = self.host_layout.slot_offset(slot);
        for (buf, out) in [(&self.host[2 * layer], k), (&self.host[2 * layer + 1], v)] {
            // SAFETY: `off + slot_bytes` is inside the buffer (slot < num_slots, checked);
            // the output has exactly slot_bytes bytes; the host buffer is a separate
            // allocation, so the ranges do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(buf.0.add(off), out.as_mut_ptr(), out.len()) };
        }
        Ok(())
    }

    /// Queues the copies of `runs` between the two sides and records their event.
    fn start(&self, to_host: bool, src: &[u32], dst: &[u32]) -> Result<CopyTicket> {
        let (ns, nd) = if to_host {
            (self.device.layout().num_slots, self.host_layout.num_slots)
        } else {
            (self.host_layout.num_slots, self.device.layout().num_slots)
        };
        let runs = check_pairs(ns, nd, src, dst)?;
        let sb = self.host_layout.slot_bytes();
        let mut st = self.lock();
        let ctx = self.device.context();
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let stream = self.stream.cu_stream();
        let dev = self.device.raw_bufs();
        let mut queued = Ok(());
        'bufs: for (b, h) in self.host.iter().enumerate() {
            for r in &runs {
                let bytes = r.len * sb;
                // SAFETY: every run's slots are below each side's num_slots (`check_pairs`),
                // so both ranges lie inside live allocations (the device buffer of
                // num_slots * sb bytes; the pinned host buffer of host_slots * sb bytes);
                // the host memory is page-locked and lives until drop, which synchronizes
                // the stream first, so the asynchronous copy never outlives it.
                let rc = unsafe {
                    if to_host {
                        sys::cuMemcpyDtoHAsync_v2(
                            h.0.add(r.dst * sb).cast::<c_void>(),
                            dev[b] + (r.src * sb) as u64,
                            bytes,
                            stream,
                        )
                    } else {
                        sys::cuMemcpyHtoDAsync_v2(
                            dev[b] + (r.dst * sb) as u64,
                            h.0.add(r.src * sb).cast::<c_void>().cast_const(),
                            bytes,
                            stream,
                        )
                    }
                };
                if let Err(e) = rc.result() {
                    queued = Err(device(format!("tier copy: cuMemcpyAsync failed: {e}")));
                    break 'bufs;
                }
            }
        }
        if let Err(e) = queued {
            // Nothing of a refused copy stays queued.
            let _ = self.stream.synchronize();
            return Err(e);
        }
        let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(drv("cuEventCreate"))?;
        // SAFETY: `ev` is a live event of the current context and `stream` a live stream.
        if let Err(e) = unsafe { result::event::record(ev, stream) } {
            // SAFETY: `ev` was created above and is not recorded anywhere.
            let _ = unsafe { result::event::destroy(ev) };
            let _ = self.stream.synchronize();
            return Err(device(format!("cuEventRecord: {e}")));
        }
        st.next += 1;
        let t = st.next;
        st.events.insert(t, ev);
        Ok(t)
    }

    fn take(&self, st: &mut State, t: CopyTicket) -> Result<sys::CUevent> {
        st.events.remove(&t).ok_or_else(|| invalid(format!("copy ticket {t} is unknown or spent")))
    }
}

impl TierCopier for CudaTierCopier {
    fn to_host(&self, dev: &[u32], host: &[u32]) -> Result<CopyTicket> {
        self.start(true, dev, host)
    }

    fn to_device(&self, host: &[u32], dev: &[u32]) -> Result<CopyTicket> {
        self.start(false, host, dev)
    }

    fn poll(&self, t: CopyTicket) -> Result<bool> {
        let mut st = self.lock();
        let Some(&ev) = st.events.get(&t) else {
            return Err(invalid(format!("copy ticket {t} is unknown or spent")));
        };
        self.device.context().bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: `ev` is a live event recorded by `start` (destroyed only after it is
        // removed from the map, under this lock).
        match unsafe { result::event::query(ev) } {
            Ok(()) => {
                let ev = self.take(&mut st, t)?;
                // SAFETY: complete and removed from the map: destroyed once.
                let _ = unsafe { result::event::destroy(ev) };
                Ok(true)
            }
            Err(DriverError(sys::cudaError_enum::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(e) => {
                let ev = self.take(&mut st, t)?;
                // SAFETY: removed from the map: destroyed once.
                let _ = unsafe { result::event::destroy(ev) };
                Err(device(format!("tier copy failed: {e}")))
            }
        }
    }

    fn wait(&self, t: CopyTicket) -> Result<()> {
        let ev = {
            let mut st = self.lock();
            self.take(&mut st, t)?
        };
        self.device.context().bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: `ev` is a live event recorded by `start`, now owned by this call alone
        // (removed from the map); destroyed once after the wait.
        let r = unsafe { result::event::synchronize(ev) };
        // SAFETY: as above.
        let _ = unsafe { result::event::destroy(ev) };
        r.map_err(|e| device(format!("tier copy failed: {e}")))
    }
}

impl Drop for CudaTierCopier {
    fn drop(&mut self) {
        let _ = self.device.context().bind_to_thread();
        // Copies in flight write into or read from the pinned buffers: let them finish.
        let _ = self.stream.synchronize();
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, ev) in st.events.drain() {
            // SAFETY: each event is live and destroyed only here.
            let _ = unsafe { result::event::destroy(ev) };
        }
        for h in self.host.drain(..) {
            // SAFETY: allocated by `cuMemHostAlloc` in `new`, freed once here; the stream
            // was synchronized above, so no copy uses it.
            let _ = unsafe { result::free_host(h.0.cast()) };
        }
    }
}
