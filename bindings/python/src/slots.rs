//! Slot ids handed to Python: the `SlotBuffer` class (an `array('I')` subclass) and the
//! int64 byte rows SGLang's tensors are made from.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyList};
use std::sync::Mutex;

use radixkv::SlotRun;

/// The `SlotBuffer` class (an `array('I')` subclass), registered by `radixkv._cache`.
pub(crate) static SLOT_BUFFER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

pub fn register_slot_buffer(py: Python<'_>, cls: Bound<'_, PyAny>) -> PyResult<()> {
    let _ = SLOT_BUFFER.set(py, cls.unbind());
    Ok(())
}

/// `slots` as a `SlotBuffer` (an `array('I')`): no per-slot objects.
pub fn slot_buffer<'py>(py: Python<'py>, slots: &[u32]) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: any `u32` slice is readable as its bytes (native order, what array('I') holds).
    let raw = unsafe { std::slice::from_raw_parts(slots.as_ptr().cast::<u8>(), slots.len() * 4) };
    let bytes = PyBytes::new(py, raw);
    match SLOT_BUFFER.get(py) {
        Some(cls) => cls.bind(py).call1(("I", bytes)),
        None => py.import("array")?.getattr("array")?.call1(("I", bytes)),
    }
}

/// `out` (a buffer of 8-byte values from the allocator) as `i64`s.
pub(crate) fn as_i64s(out: &mut [u8]) -> &mut [i64] {
    // SAFETY: `align_to_mut` only yields the aligned middle as `i64`s; every bit pattern is
    // an `i64`. CPython's allocator aligns a bytearray's buffer to at least 8 bytes, so the
    // prefix and suffix are empty (checked).
    let (pre, mid, post) = unsafe { out.align_to_mut::<i64>() };
    assert!(pre.is_empty() && post.is_empty(), "a bytearray buffer aligned to 8 bytes");
    mid
}

/// Writes `slots` as native int64 values into `out` (`out.len() == 8 * slots.len()`).
pub(crate) fn fill_i64(out: &mut [u8], slots: &[u32]) {
    for (d, &s) in as_i64s(out).iter_mut().zip(slots) {
        *d = s as i64;
    }
}

/// Writes the slots of `runs` as native int64 values into `out`.
pub(crate) fn fill_i64_runs(out: &mut [u8], runs: &[SlotRun]) {
    let out = as_i64s(out);
    let mut at = 0;
    for r in runs {
        let d = &mut out[at..at + r.len as usize];
        for (k, x) in d.iter_mut().enumerate() {
            *x = r.start as i64 + k as i64;
        }
        at += r.len as usize;
    }
}

/// A new `bytearray` of `n` bytes whose content `fill` writes, with the GIL held throughout
/// (for callers holding a lock that GIL-holding threads wait on, such as the tree core's).
pub(crate) fn bytearray_held<'py>(
    py: Python<'py>,
    n: usize,
    fill: impl FnOnce(&mut [u8]),
) -> PyResult<Bound<'py, PyByteArray>> {
    // SAFETY: a NULL source makes an uninitialized bytearray of `n` bytes (or fails with a
    // Python error, turned into one here); it is filled in full below before anyone reads it.
    let ba = unsafe {
        let p = pyo3::ffi::PyByteArray_FromStringAndSize(std::ptr::null(), n as isize);
        Bound::from_owned_ptr_or_err(py, p)?.cast_into_unchecked::<PyByteArray>()
    };
    if n == 0 {
        return Ok(ba);
    }
    // SAFETY: the bytearray's buffer holds `n` bytes; only this function has a reference to
    // the new object until it returns, and nothing resizes it meanwhile.
    let buf = unsafe {
        std::slice::from_raw_parts_mut(pyo3::ffi::PyByteArray_AsString(ba.as_ptr()).cast::<u8>(), n)
    };
    fill(buf);
    Ok(ba)
}

/// A `bytearray` of `n` bytes whose content `fill` writes, with the GIL released when it
/// is large (the bytearray is new and unshared, so nothing else reads or moves it).
pub(crate) fn bytearray_filled<'py>(
    py: Python<'py>,
    n: usize,
    fill: impl FnOnce(&mut [u8]) + Send,
) -> PyResult<Bound<'py, PyByteArray>> {
    bytearray_held(py, n, |buf| {
        struct Buf<'a>(&'a mut [u8]);
        // SAFETY: the buffer is written by one thread at a time (this call) and read by no
        // one.
        unsafe impl Send for Buf<'_> {}
        let b = Buf(buf);
        if b.0.len() >= 1 << 16 {
            py.detach(move || {
                let b = b;
                fill(b.0)
            });
        } else {
            fill(b.0);
        }
    })
}

/// `slots` as native `int64` values in a `bytearray` (for `torch.frombuffer` /
/// `numpy.frombuffer`, which view it without a copy).
pub fn i64_bytes<'py>(py: Python<'py>, slots: &[u32]) -> PyResult<Bound<'py, PyByteArray>> {
    bytearray_filled(py, slots.len() * 8, |b| fill_i64(b, slots))
}

/// The slots of `runs`, in order, as native `int64` values in a `bytearray`.
pub fn i64_bytes_of_runs<'py>(
    py: Python<'py>,
    runs: &[SlotRun],
) -> PyResult<Bound<'py, PyByteArray>> {
    let n: usize = runs.iter().map(|r| r.len as usize).sum();
    bytearray_filled(py, n * 8, |b| fill_i64_runs(b, runs))
}

pub(crate) fn runs_list<'py>(py: Python<'py>, runs: &[SlotRun]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, runs.iter().map(|r| (r.start, r.len)))
}

/// Sets (`on`) or clears the slots of `runs` in a bitmap, a word at a time.
pub(crate) fn mark_runs(bits: &Mutex<Vec<u64>>, runs: &[SlotRun], on: bool) {
    let mut b = bits.lock().unwrap_or_else(|p| p.into_inner());
    for r in runs {
        let (mut s, end) = (r.start as u64, r.start as u64 + r.len as u64);
        if on && end.div_ceil(64) as usize > b.len() {
            b.resize(end.div_ceil(64) as usize, 0);
        }
        while s < end {
            let w = (s / 64) as usize;
            if w >= b.len() {
                break;
            }
            let lo = s % 64;
            let hi = (end - (s - lo)).min(64);
            let m = if hi - lo == 64 { u64::MAX } else { ((1u64 << (hi - lo)) - 1) << lo };
            if on {
                b[w] |= m;
            } else {
                b[w] &= !m;
            }
            s += hi - lo;
        }
    }
}

/// Clears the slots of `runs` in a bitmap.
pub(crate) fn clear_runs(bits: &Mutex<Vec<u64>>, runs: &[SlotRun]) {
    mark_runs(bits, runs, false)
}

/// Marks (`on`) or clears `slots` in a bitmap.
pub(crate) fn mark(bits: &Mutex<Vec<u64>>, slots: impl Iterator<Item = u32>, on: bool) {
    let mut b = bits.lock().unwrap_or_else(|p| p.into_inner());
    for s in slots {
        let (w, m) = ((s / 64) as usize, 1u64 << (s % 64));
        if on {
            if w >= b.len() {
                b.resize(w + 1, 0);
            }
            b[w] |= m;
        } else if w < b.len() {
            b[w] &= !m;
        }
    }
}
