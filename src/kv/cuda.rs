//! [`CudaKvStorage`]: KV buffers in NVIDIA GPU memory, through cudarc's driver API.
//!
//! The driver library (`libcuda`) is loaded at run time (cudarc's `dynamic-loading`), so
//! this builds without a CUDA toolkit and a machine without a GPU gets [`Error::Device`]
//! from [`CudaKvStorage::new`], never a panic: before the first driver call it checks that
//! `libcuda` can be loaded and that the device exists, and the whole initialization runs
//! under `catch_unwind` as a last resort (cudarc panics on a missing library or symbol).
//!
//! ## Copies
//!
//! [`KvStorage::copy_slots`] coalesces the slot pairs into runs (source and destination
//! both consecutive) and issues one device-to-device copy per run per layer per K/V, on a
//! private non-blocking stream, then synchronizes that stream before returning. The copies
//! go out either
//! - in one `cuMemcpyBatchAsync` call (CUDA 12.8+ driver API; chunked at
//!   [`MAX_BATCH`] copies per call), or
//! - one `cuMemcpyDtoDAsync` per copy.
//!
//! [`CopyMethod`] picks one ([`CopyMethod::Auto`]: batched when the driver has it), so the
//! two can be compared (`examples/kv_copy_bandwidth.rs`). `cuMemcpyBatchAsync` is looked
//! up with `cuGetProcAddress_v2(..., 12080, ...)` (the CUDA 12.8 signature, which takes a
//! `failIdx`), falling back to the exported symbol; it is never called through cudarc's
//! lazily loading wrapper, which panics when the symbol is missing.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};

use super::{CopyPlan, KvLayout, KvStorage, Run, check_layer, check_slot_io, device};
use crate::error::{Error, Result};

/// Most copies handed to one `cuMemcpyBatchAsync` call; longer lists take several calls
/// (a conservative bound on the driver's per-call work and our argument arrays).
pub const MAX_BATCH: usize = 1 << 15;

/// How [`CudaKvStorage`] issues the device-to-device copies of `copy_slots`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CopyMethod {
    /// `cuMemcpyBatchAsync` when the driver has it, else one copy call per run.
    #[default]
    Auto,
    /// Always `cuMemcpyBatchAsync` ([`Error::Device`] when the driver lacks it).
    Batched,
    /// Always one `cuMemcpyDtoDAsync` call per run per layer per K/V.
    PerRun,
}

/// `cuMemcpyBatchAsync`, CUDA 12.8 ABI. The result is taken as a plain integer (0 is
/// `CUDA_SUCCESS`) so an unexpected code is never read into a Rust enum.
type BatchFn = unsafe extern "C" fn(
    dsts: *mut sys::CUdeviceptr,
    srcs: *mut sys::CUdeviceptr,
    sizes: *mut usize,
    count: usize,
    attrs: *mut sys::CUmemcpyAttributes,
    attrs_idxs: *mut usize,
    num_attrs: usize,
    fail_idx: *mut usize,
    stream: sys::CUstream,
) -> c_uint;

/// `cuGetProcAddress_v2` (CUDA 12.0+ drivers), with integer result and status.
type GetProcFn = unsafe extern "C" fn(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> c_uint;

/// KV storage in the memory of one NVIDIA GPU: `2 * num_layers` separate `cuMemAlloc`
/// allocations (256-byte aligned or better), zeroed at creation and freed on drop.
///
/// All calls of the safe API are serialized by an internal lock and run on one private
/// stream that is synchronized before each call returns, so when a call returns its
/// effect is complete on the device. Kernels that use [`k_ptr`](KvStorage::k_ptr) /
/// [`v_ptr`](KvStorage::v_ptr) on other streams are the caller's to order.
pub struct CudaKvStorage {
    layout: KvLayout,
    ordinal: usize,
    /// K buffer of layer `l` at `2 * l`, V buffer at `2 * l + 1`.
    bufs: Vec<sys::CUdeviceptr>,
    /// `cuMemcpyBatchAsync`, when the driver has it.
    batch_fn: Option<BatchFn>,
    /// Serializes every use of `stream` and the buffers, and holds the copy method.
    state: Mutex<CopyMethod>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

impl std::fmt::Debug for CudaKvStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKvStorage")
            .field("layout", &self.layout)
            .field("ordinal", &self.ordinal)
            .field("batched_copy", &self.batch_fn.is_some())
            .finish_non_exhaustive()
    }
}

/// Maps a driver error to [`Error::Device`], naming the operation.
fn drv(op: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |e| device(format!("{op}: {e}"))
}

/// Runs `f`, turning a panic (cudarc panics when a library or symbol is missing) into
/// [`Error::Device`].
fn guarded<T>(op: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(device(format!("{op}: panicked in the CUDA driver layer: {msg}")))
        }
    }
}

/// Number of CUDA devices, after checking that the driver library loads and
/// initializes. [`Error::Device`] when it does not (no driver, no GPU, driver too old).
pub fn device_count() -> Result<usize> {
    guarded("CUDA device count", || {
        // SAFETY: `is_culib_present` only tries to dlopen the candidate library names and
        // drops what it opened; it has no preconditions.
        if !unsafe { sys::is_culib_present() } {
            return Err(device(
                "no CUDA driver: libcuda could not be loaded (no NVIDIA driver installed?)",
            ));
        }
        result::init().map_err(drv("cuInit"))?;
        let n = result::device::get_count().map_err(drv("cuDeviceGetCount"))?;
        Ok(usize::try_from(n).unwrap_or(0))
    })
}

/// Finds `cuMemcpyBatchAsync` (CUDA 12.8 ABI) in the loaded driver, or `None`.
///
/// Only call after `is_culib_present()` returned true and `cuInit` succeeded.
fn resolve_batch_fn() -> Option<BatchFn> {
    let mut version: c_int = 0;
    // SAFETY: `cuDriverGetVersion` writes one int through a valid pointer; the symbol is
    // in every libcuda (CUDA 2.2+), and the library is present (see above).
    unsafe { sys::cuDriverGetVersion(&mut version) }.result().ok()?;
    if version < 12080 {
        return None;
    }
    // SAFETY: the library is present (checked by the caller's caller), so `culib` loads it
    // instead of panicking; it is kept loaded for the life of the process.
    let lib = unsafe { sys::culib() };
    // SAFETY: `GetProcFn` is the C signature of `cuGetProcAddress_v2` (cuda.h, 12.0+),
    // with the enum result and status widened to plain integers of the same size.
    if let Ok(get) = unsafe { lib.get::<GetProcFn>(b"cuGetProcAddress_v2\0") } {
        let mut pfn: *mut c_void = std::ptr::null_mut();
        let mut status: c_int = -1;
        // SAFETY: a nul-terminated symbol name and two valid out-pointers; version 12080
        // asks for the CUDA 12.8 ABI of the symbol, which `BatchFn` spells out.
        let rc = unsafe { get(c"cuMemcpyBatchAsync".as_ptr(), &mut pfn, 12080, 0, &mut status) };
        if rc == 0 && status == 0 && !pfn.is_null() {
            // SAFETY: the driver returned the 12.8 entry point of `cuMemcpyBatchAsync`,
            // whose C signature `BatchFn` matches (cuda.h, 12.8).
            return Some(unsafe { std::mem::transmute::<*mut c_void, BatchFn>(pfn) });
        }
        return None;
    }
    // SAFETY: the exported `cuMemcpyBatchAsync` keeps the 12.8 signature (CUDA 13 added
    // `cuMemcpyBatchAsync_v2` for the new one), which `BatchFn` matches.
    unsafe { lib.get::<BatchFn>(b"cuMemcpyBatchAsync\0") }.ok().map(|f| *f)
}

/// One device-to-device copy.
#[derive(Clone, Copy)]
struct Memcpy {
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: usize,
}

/// Appends the copies of `runs` (slot units of `sb` bytes) from buffer `src` to `dst`.
fn push_runs(out: &mut Vec<Memcpy>, src: u64, dst: u64, runs: &[Run], sb: usize) {
    out.extend(runs.iter().map(|r| Memcpy {
        dst: dst + (r.dst * sb) as u64,
        src: src + (r.src * sb) as u64,
        bytes: r.len * sb,
    }));
}

/// A temporary device buffer for two-phase copies; synchronizes the stream and frees on
/// drop.
struct Scratch<'a> {
    ptr: sys::CUdeviceptr,
    stream: &'a CudaStream,
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        // Copies into or out of the scratch may still be queued (an error path): let them
        // finish before the memory goes back.
        let _ = self.stream.synchronize();
        // SAFETY: `ptr` came from `malloc_sync` in this context (bound on this thread by
        // the caller, which holds the storage lock) and nothing on the stream uses it any
        // more (synchronized above).
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

impl CudaKvStorage {
    /// Allocates a zeroed store of `layout` on CUDA device `ordinal`.
    ///
    /// [`Error::InvalidArgument`] for an invalid layout; [`Error::Device`] when there is
    /// no driver, no such device, or not enough device memory. Never panics.
    pub fn new(ordinal: usize, layout: KvLayout) -> Result<CudaKvStorage> {
        layout.validate()?;
        guarded("CudaKvStorage::new", || Self::init(ordinal, layout))
    }

    fn init(ordinal: usize, layout: KvLayout) -> Result<CudaKvStorage> {
        let count = device_count()?;
        if count == 0 {
            return Err(device("no CUDA device: the driver reports 0 GPUs"));
        }
        if ordinal >= count {
            return Err(device(format!(
                "CUDA device {ordinal} does not exist ({count} device(s))"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("cuDevicePrimaryCtxRetain"))?;
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        let mut kv = CudaKvStorage {
            layout,
            ordinal,
            bufs: Vec::with_capacity(2 * layout.num_layers),
            batch_fn: resolve_batch_fn(),
            state: Mutex::new(CopyMethod::Auto),
            stream,
            ctx,
        };
        // From here on, `kv`'s Drop frees whatever was allocated if a step fails.
        kv.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let bytes = layout.buffer_bytes();
        for _ in 0..2 * layout.num_layers {
            // SAFETY: the context is current on this thread; the memory is zeroed below
            // before anything reads it.
            let p = unsafe { result::malloc_sync(bytes) }.map_err(|e| {
                device(format!("cuMemAlloc of a {bytes}-byte KV buffer on device {ordinal}: {e}"))
            })?;
            kv.bufs.push(p);
            // SAFETY: `p` is a live allocation of `bytes` bytes in this context.
            unsafe { result::memset_d8_async(p, 0, bytes, kv.stream.cu_stream()) }
                .map_err(drv("cuMemsetD8Async"))?;
        }
        kv.stream.synchronize().map_err(drv("cuStreamSynchronize"))?;
        Ok(kv)
    }

    /// The device addresses of the buffers: layer `l`'s K at `2 * l`, V at `2 * l + 1`
    /// (for the host tier's copier, `tier::cuda`).
    pub(crate) fn raw_bufs(&self) -> &[sys::CUdeviceptr] {
        &self.bufs
    }

    /// The context the buffers live in.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device ordinal this store lives on.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name as the driver reports it (e.g. "NVIDIA H200").
    pub fn device_name(&self) -> Result<String> {
        guarded("device_name", || self.ctx.name().map_err(drv("cuDeviceGetName")))
    }

    /// Whether the driver has `cuMemcpyBatchAsync` (CUDA 12.8+), so
    /// [`CopyMethod::Batched`] can be used.
    pub fn has_batched_copy(&self) -> bool {
        self.batch_fn.is_some()
    }

    /// The method [`KvStorage::copy_slots`] uses (initially [`CopyMethod::Auto`]).
    pub fn copy_method(&self) -> CopyMethod {
        *self.lock()
    }

    /// Sets the method [`KvStorage::copy_slots`] uses. [`Error::Device`] (and no change)
    /// for [`CopyMethod::Batched`] when the driver lacks `cuMemcpyBatchAsync`.
    pub fn set_copy_method(&self, method: CopyMethod) -> Result<()> {
        self.check_method(method)?;
        *self.lock() = method;
        Ok(())
    }

    /// [`KvStorage::copy_slots`] with an explicit copy method for this call only.
    pub fn copy_slots_with(&self, src: &[u32], dst: &[u32], method: CopyMethod) -> Result<()> {
        let plan = CopyPlan::new(&self.layout, src, dst)?;
        let batched = self.check_method(method)?;
        let _guard = self.lock();
        guarded("copy_slots", || self.run_plan(plan, batched))
    }

    /// Whether `method` means the batched path; an error if it needs one we lack.
    fn check_method(&self, method: CopyMethod) -> Result<bool> {
        match method {
            CopyMethod::Auto => Ok(self.batch_fn.is_some()),
            CopyMethod::PerRun => Ok(false),
            CopyMethod::Batched if self.batch_fn.is_some() => Ok(true),
            CopyMethod::Batched => Err(device(
                "cuMemcpyBatchAsync is not available (it needs a CUDA 12.8 or newer driver)",
            )),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CopyMethod> {
        // The guarded value is a plain enum and the device state does not depend on where
        // a panicking holder stopped, so poisoning is ignored.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Executes a checked plan. The caller holds the lock.
    fn run_plan(&self, plan: CopyPlan, batched: bool) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let sb = self.layout.slot_bytes();
        let queued = match plan {
            CopyPlan::Direct(runs) => {
                if runs.is_empty() {
                    return Ok(());
                }
                let mut copies = Vec::with_capacity(runs.len() * self.bufs.len());
                for &b in &self.bufs {
                    push_runs(&mut copies, b, b, &runs, sb);
                }
                self.enqueue(&copies, batched)
            }
            CopyPlan::TwoPhase { gather, scatter, scratch_slots } => {
                let bytes = scratch_slots * sb;
                // SAFETY: the context is current; every byte of the scratch is written by
                // a gather copy before a scatter copy reads it (stream order).
                let ptr = unsafe { result::malloc_sync(bytes) }
                    .map_err(drv("cuMemAlloc (copy scratch)"))?;
                let scratch = Scratch { ptr, stream: &self.stream };
                // One buffer at a time: gather into the scratch, then scatter out of it.
                // The stream runs these in order, so the next gather waits for the scatter.
                let mut copies = Vec::new();
                let queued = self.bufs.iter().try_for_each(|&b| {
                    copies.clear();
                    push_runs(&mut copies, b, scratch.ptr, &gather, sb);
                    self.enqueue(&copies, batched)?;
                    copies.clear();
                    push_runs(&mut copies, scratch.ptr, b, &scatter, sb);
                    self.enqueue(&copies, batched)
                });
                drop(scratch);
                queued
            }
        };
        // Synchronize on every path, so nothing of this call is still queued when it returns.
        let synced = self.stream.synchronize().map_err(drv("cuStreamSynchronize"));
        queued.and(synced)
    }

    /// Queues `copies` on the stream. No two copies of one call may touch overlapping
    /// bytes where one of them writes (a batch runs in no particular order).
    fn enqueue(&self, copies: &[Memcpy], batched: bool) -> Result<()> {
        let stream = self.stream.cu_stream();
        if !batched {
            for c in copies {
                // SAFETY: both ranges lie inside live allocations of this context (the
                // plan checked every slot < num_slots; scratch indices < scratch_slots);
                // source and destination do not overlap (see `CopyPlan`).
                unsafe { result::memcpy_dtod_async(c.dst, c.src, c.bytes, stream) }
                    .map_err(drv("cuMemcpyDtoDAsync"))?;
            }
            return Ok(());
        }
        let Some(batch) = self.batch_fn else {
            return Err(device("cuMemcpyBatchAsync is not available"));
        };
        let loc = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.ordinal as c_int,
        };
        let mut attrs = [sys::CUmemcpyAttributes {
            srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            srcLocHint: loc,
            dstLocHint: loc,
            flags: 0,
        }];
        for chunk in copies.chunks(MAX_BATCH) {
            let mut dsts: Vec<sys::CUdeviceptr> = chunk.iter().map(|c| c.dst).collect();
            let mut srcs: Vec<sys::CUdeviceptr> = chunk.iter().map(|c| c.src).collect();
            let mut sizes: Vec<usize> = chunk.iter().map(|c| c.bytes).collect();
            let mut attrs_idxs = [0usize];
            let mut fail_idx = usize::MAX;
            // SAFETY: `batch` is the CUDA 12.8 `cuMemcpyBatchAsync` (see
            // `resolve_batch_fn`); the three arrays hold `chunk.len()` entries, `attrs` and
            // `attrs_idxs` one each (attribute 0 applies from copy 0 on), `fail_idx` is a
            // valid out-pointer, and `stream` is a live non-default stream of the current
            // context. The ranges are in bounds and independent as for the per-run path;
            // sources are read in stream order, after earlier work on the stream.
            let rc = unsafe {
                batch(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    chunk.len(),
                    attrs.as_mut_ptr(),
                    attrs_idxs.as_mut_ptr(),
                    attrs.len(),
                    &mut fail_idx,
                    stream,
                )
            };
            if rc != 0 {
                let at = if fail_idx == usize::MAX {
                    String::new()
                } else {
                    format!(" at copy {fail_idx} of {}", chunk.len())
                };
                return Err(device(format!("cuMemcpyBatchAsync failed with CUresult {rc}{at}")));
            }
        }
        Ok(())
    }
}

impl KvStorage for CudaKvStorage {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }

    fn k_ptr(&self, layer: usize) -> Result<u64> {
        check_layer(&self.layout, "k_ptr", layer)?;
        Ok(self.bufs[2 * layer])
    }

    fn v_ptr(&self, layer: usize) -> Result<u64> {
        check_layer(&self.layout, "v_ptr", layer)?;
        Ok(self.bufs[2 * layer + 1])
    }

    fn copy_slots(&self, src: &[u32], dst: &[u32]) -> Result<()> {
        let plan = CopyPlan::new(&self.layout, src, dst)?;
        let guard = self.lock();
        let batched = self.check_method(*guard)?;
        guarded("copy_slots", || self.run_plan(plan, batched))
    }

    fn write_slot(&self, layer: usize, slot: u32, k: &[u8], v: &[u8]) -> Result<()> {
        check_slot_io(&self.layout, "write_slot", layer, slot, k.len(), v.len())?;
        let off = self.layout.slot_offset(slot) as u64;
        let _guard = self.lock();
        guarded("write_slot", || {
            self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
            let stream = self.stream.cu_stream();
            let (kb, vb) = (self.bufs[2 * layer], self.bufs[2 * layer + 1]);
            // SAFETY: the destination ranges `base + off .. + slot_bytes` are inside live
            // allocations (slot < num_slots); `k` and `v` are exactly slot_bytes long and
            // stay borrowed until the stream is synchronized below, on every path.
            let queued = unsafe {
                result::memcpy_htod_async(kb + off, k, stream)
                    .and_then(|()| result::memcpy_htod_async(vb + off, v, stream))
            }
            .map_err(drv("cuMemcpyHtoDAsync"));
            let synced = self.stream.synchronize().map_err(drv("cuStreamSynchronize"));
            queued.and(synced)
        })
    }

    fn read_slot(&self, layer: usize, slot: u32, k_out: &mut [u8], v_out: &mut [u8]) -> Result<()> {
        check_slot_io(&self.layout, "read_slot", layer, slot, k_out.len(), v_out.len())?;
        let off = self.layout.slot_offset(slot) as u64;
        let _guard = self.lock();
        guarded("read_slot", || {
            self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
            let stream = self.stream.cu_stream();
            let (kb, vb) = (self.bufs[2 * layer], self.bufs[2 * layer + 1]);
            // SAFETY: the source ranges are inside live allocations (slot < num_slots),
            // initialized (zeroed at creation); the outputs are exactly slot_bytes long and
            // stay mutably borrowed until the stream is synchronized below, on every path.
            let queued = unsafe {
                result::memcpy_dtoh_async(&mut *k_out, kb + off, stream)
                    .and_then(|()| result::memcpy_dtoh_async(&mut *v_out, vb + off, stream))
            }
            .map_err(drv("cuMemcpyDtoHAsync"));
            let synced = self.stream.synchronize().map_err(drv("cuStreamSynchronize"));
            queued.and(synced)
        })
    }
}

impl Drop for CudaKvStorage {
    fn drop(&mut self) {
        let bufs = std::mem::take(&mut self.bufs);
        let _ = guarded("CudaKvStorage::drop", || {
            // Without the context current nothing can be freed; the memory then leaks
            // (until the context is destroyed) rather than being freed in the wrong one.
            self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
            let _ = self.stream.synchronize();
            for p in bufs {
                // SAFETY: `p` came from `malloc_sync` in this context, is freed only here,
                // and no queued work uses it (stream synchronized above; every public call
                // synchronizes before returning).
                let _ = unsafe { result::free_sync(p) };
            }
            Ok(())
        });
    }
}
