//! Token and slot arrays from Python, without a copy where the memory allows it.
//!
//! What a call may pass, in the order it is tried:
//!
//! 1. a `list` or `tuple` of ints: read item by item (the only path that builds a `Vec`
//!    while holding the GIL);
//! 2. any object with the buffer protocol (`array('I'/'i'/'q'/'l'/...)`, NumPy arrays,
//!    `memoryview`s): exported, copied, and released again, all with the GIL held;
//! 3. a CPU `torch.Tensor` (they have no buffer protocol): copied through `data_ptr()`,
//!    with the GIL held;
//! 4. an object with `__array_interface__` (version 3, CPU memory);
//! 5. any other iterable of ints.
//!
//! The memory of 2-4 is copied while the GIL is held ([`settle`]: one memcpy of the
//! caller's bytes, so no other Python thread can write it while the call reads it, and the
//! call sees one consistent array), and the copy is read with the GIL released
//! ([`View::get`]): `uint32` data is used as it is; `int32` data is checked to be
//! non-negative and then used as it is (the same bits); anything else (`int64`, other
//! widths, another byte order) is converted into a `Vec<u32>` with a range check, and a
//! value outside `[0, 2**32)` is a `ValueError` naming its position. Strings, bytes and
//! floats are a `TypeError`.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::marker::PhantomData;
use std::sync::Arc;

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyString, PyTuple};

/// CPython's `Py_buffer` (`Include/pybuffer.h`): its layout has not changed since Python
/// 3.3. It joined the limited API in 3.11; on 3.9 and 3.10 the same struct and the same
/// exported functions (`PyObject_GetBuffer`, `PyBuffer_Release`, present in every CPython
/// 3 build) are used, so the abi3 wheel reads buffers on every version it supports.
#[repr(C)]
struct PyBufferRaw {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

unsafe extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut PyBufferRaw, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut PyBufferRaw);
}

/// `PyBUF_FORMAT | PyBUF_STRIDES` (`PyBUF_RECORDS_RO`): shape, strides and format, any
/// contiguity, read-only allowed.
const PYBUF_RECORDS_RO: c_int = 0x0004 | 0x0010 | 0x0008;

/// An exported buffer, released (with the GIL held: it is dropped by the call that made it)
/// when dropped.
pub struct Exported {
    view: Box<PyBufferRaw>,
}

impl Drop for Exported {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful `PyObject_GetBuffer` and is released
        // once; an `Exported` lives only in a function that holds the GIL (see `Input`).
        unsafe { PyBuffer_Release(&mut *self.view) }
    }
}

/// The element type of a borrowed array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// Bytes per element: 1, 2, 4 or 8.
    size: usize,
    signed: bool,
    /// Stored in the other byte order than this machine's.
    swapped: bool,
}

#[cfg(test)]
const U32: Kind = Kind { size: 4, signed: false, swapped: false };

/// Memory to read with the GIL released: `n` elements of `kind`, `stride` bytes apart.
#[derive(Debug, Clone, Copy)]
pub struct Raw {
    ptr: *const u8,
    n: usize,
    stride: isize,
    kind: Kind,
}

/// An argument's memory as the call reads it with the GIL released: `Send`, and only valid
/// while the [`Input`] it came from lives (its lifetime says so).
#[derive(Clone, Copy)]
pub enum View<'a> {
    Raw(RawView<'a>),
    Slice(&'a [u32]),
}

#[derive(Clone, Copy)]
pub struct RawView<'a> {
    raw: Raw,
    _input: PhantomData<&'a ()>,
}

// SAFETY: the pointer names memory kept alive by the `Input` that outlives this view: for
// every call, its own copy (`Keep::Copy`, made under the GIL, written by nobody); the view
// only reads it.
unsafe impl Send for RawView<'_> {}

/// A converted argument: where its values are and what keeps them alive. Dropped only with
/// the GIL held (by the call that made it, or by the Python object that keeps it).
pub enum Input {
    /// Memory named by `Raw`, kept alive by `Keep`: once `to_input` returns, always the
    /// call's own copy ([`settle`]).
    Borrowed(Raw, #[allow(dead_code)] Keep),
    /// Values read from a Python sequence.
    Owned(Vec<u32>),
}

/// What keeps borrowed memory alive.
pub enum Keep {
    #[allow(dead_code)] // held for its Drop (the buffer's release)
    Buffer(Exported),
    #[allow(dead_code)] // held for its reference
    Object(Py<PyAny>),
    /// The caller's elements, copied while the GIL was held ([`settle`]): memory this
    /// `Input` owns and nobody writes, 8-byte aligned.
    Copy(#[allow(dead_code)] Vec<u64>),
}

// SAFETY: `Raw` is an address and a shape; the memory it names is only read, while the
// `Input` holding it keeps that memory alive (a call's `Input` owns it: `Keep::Copy`).
unsafe impl Send for Raw {}
// SAFETY: as above.
unsafe impl Sync for Raw {}
// SAFETY: an `Exported` is only released with the GIL held (an `Input` is dropped by the
// call that made it, or by the pyclass that keeps it, both holding the GIL); moving it
// between threads is what CPython allows for a `Py_buffer`.
unsafe impl Send for Exported {}
// SAFETY: no method reads it through a shared reference.
unsafe impl Sync for Exported {}

impl Input {
    /// Elements in the argument.
    pub fn len(&self) -> usize {
        match self {
            Input::Borrowed(r, _) => r.n,
            Input::Owned(v) => v.len(),
        }
    }

    /// The view the call reads with the GIL released.
    pub fn view(&self) -> View<'_> {
        match self {
            Input::Borrowed(raw, _) => View::Raw(RawView { raw: *raw, _input: PhantomData }),
            Input::Owned(v) => View::Slice(v),
        }
    }

    /// The address of the memory a call reads in place (for tests: a borrowed `uint32`
    /// buffer is read where it is), or `None` when the values are converted or copied.
    pub fn borrowed_address(&self) -> Option<usize> {
        match self {
            Input::Borrowed(_, Keep::Copy(_)) => None,
            Input::Borrowed(r, _) if in_place(r) => Some(r.ptr as usize),
            _ => None,
        }
    }
}

/// Whether `r` is read as a `&[u32]` where it is: native `uint32`, or `int32` (once
/// checked non-negative), contiguous and aligned.
fn in_place(r: &Raw) -> bool {
    r.kind.size == 4
        && !r.kind.swapped
        && (r.stride == 4 || r.n <= 1)
        && (r.ptr as usize).is_multiple_of(4)
}

/// A value that is not a token or slot id: `ValueError` naming the argument and position.
pub struct OutOfRange {
    pub what: &'static str,
    pub index: usize,
    pub value: i128,
}

impl OutOfRange {
    pub fn into_err(self) -> PyErr {
        PyValueError::new_err(format!(
            "{}[{}] = {} is out of range: ids must be in [0, 2**32)",
            self.what, self.index, self.value
        ))
    }
}

impl<'a> View<'a> {
    /// The elements `start..stop` (clamped to the view).
    pub fn narrow(self, start: usize, stop: usize) -> View<'a> {
        match self {
            View::Slice(s) => {
                let stop = stop.min(s.len());
                View::Slice(&s[start.min(stop)..stop])
            }
            View::Raw(mut v) => {
                let stop = stop.min(v.raw.n);
                let start = start.min(stop);
                // Within the memory the view names (start <= n): the pointer stays in bounds.
                v.raw.ptr = v.raw.ptr.wrapping_offset(start as isize * v.raw.stride);
                v.raw.n = stop - start;
                View::Raw(v)
            }
        }
    }

    /// The values as `u32`s: in place when the memory allows it (see the module docs),
    /// else converted into `scratch`. Runs with or without the GIL.
    pub fn get<'s>(
        self,
        what: &'static str,
        scratch: &'s mut Vec<u32>,
    ) -> Result<&'s [u32], OutOfRange>
    where
        'a: 's,
    {
        let r = match self {
            View::Slice(s) => return Ok(s),
            View::Raw(v) => v.raw,
        };
        if r.n == 0 {
            return Ok(&[]);
        }
        let aligned = (r.ptr as usize).is_multiple_of(r.kind.size);
        let contiguous = r.stride == r.kind.size as isize || r.n == 1;
        if contiguous && aligned && !r.kind.swapped {
            macro_rules! typed {
                ($t:ty) => {
                    // SAFETY: `r` names `n` readable, aligned, contiguous elements of `$t`,
                    // kept alive by the `Input` this view borrows ('a outlives 's): for a
                    // call, its own copy made under the GIL (`settle`), which nobody writes.
                    unsafe { std::slice::from_raw_parts(r.ptr.cast::<$t>(), r.n) }
                };
            }
            match (r.kind.size, r.kind.signed) {
                (4, false) => return Ok(typed!(u32)),
                (4, true) => {
                    // int32: the same bits when non-negative (one vectorized pass to check).
                    let s: &'s [u32] = typed!(u32);
                    if s.iter().fold(0, |a, &x| a | x) >> 31 != 0 {
                        let i = s.iter().position(|&x| x >> 31 != 0).unwrap_or(0);
                        return Err(OutOfRange { what, index: i, value: s[i] as i32 as i128 });
                    }
                    return Ok(s);
                }
                (8, signed) => {
                    let s: &[u64] = typed!(u64);
                    // One pass: narrow each value into the scratch's spare room (not zeroed
                    // first: one write per id) and gather the high bits (vectorized); look
                    // for the culprit only when some value was out of range.
                    scratch.clear();
                    scratch.reserve(s.len());
                    let mut high = 0u64;
                    for (d, &x) in scratch.spare_capacity_mut().iter_mut().zip(s) {
                        d.write(x as u32);
                        high |= x;
                    }
                    // SAFETY: the loop wrote the first `s.len()` elements of the spare
                    // capacity (reserved above: at least `s.len()` of it), so they are
                    // initialized `u32`s.
                    unsafe { scratch.set_len(s.len()) };
                    if high >> 32 != 0 {
                        let i = s.iter().position(|&x| x >> 32 != 0).unwrap_or(0);
                        let v = if signed { s[i] as i64 as i128 } else { s[i] as i128 };
                        return Err(OutOfRange { what, index: i, value: v });
                    }
                    return Ok(scratch);
                }
                (2, false) => {
                    let s: &[u16] = typed!(u16);
                    scratch.clear();
                    scratch.extend(s.iter().map(|&x| x as u32));
                    return Ok(scratch);
                }
                (1, false) => {
                    let s: &[u8] = typed!(u8);
                    scratch.clear();
                    scratch.extend(s.iter().map(|&x| x as u32));
                    return Ok(scratch);
                }
                _ => {} // signed 8- and 16-bit: the general loop below
            }
        }
        scratch.clear();
        scratch.reserve(r.n);
        for i in 0..r.n {
            // SAFETY: element `i` lies in the memory `r` names (`i < n`, `stride` apart),
            // kept alive by the `Input`; read unaligned, whatever the address.
            let v = unsafe { read_elem(r.ptr.offset(i as isize * r.stride), r.kind) };
            if !(0..1i128 << 32).contains(&v) {
                return Err(OutOfRange { what, index: i, value: v });
            }
            scratch.push(v as u32);
        }
        Ok(scratch)
    }
}

/// One element of `kind` at `p` (any alignment), as an integer.
///
/// # Safety
/// `p[0..kind.size]` is readable.
unsafe fn read_elem(p: *const u8, kind: Kind) -> i128 {
    let mut b = [0u8; 8];
    // SAFETY: the caller guarantees `kind.size` readable bytes at `p`; `b` holds 8.
    unsafe { std::ptr::copy_nonoverlapping(p, b.as_mut_ptr(), kind.size) };
    let bytes = &mut b[..kind.size];
    if kind.swapped {
        bytes.reverse();
    }
    macro_rules! ne {
        ($t:ty) => {
            <$t>::from_ne_bytes(bytes.try_into().unwrap()) as i128
        };
    }
    match (kind.size, kind.signed) {
        (1, false) => ne!(u8),
        (1, true) => ne!(i8),
        (2, false) => ne!(u16),
        (2, true) => ne!(i16),
        (4, false) => ne!(u32),
        (4, true) => ne!(i32),
        (8, false) => ne!(u64),
        _ => ne!(i64),
    }
}

/// The element kind of a struct-module format string (`"I"`, `"<q"`, `"=l"`, ...) with
/// `itemsize`, if it names an integer type.
fn kind_of_format(format: &str, itemsize: usize) -> Option<Kind> {
    let (order, code) = match format.as_bytes() {
        [c] => (b'@', *c),
        [o @ (b'@' | b'=' | b'<' | b'>' | b'!'), c] => (*o, *c),
        _ => return None,
    };
    let signed = match code {
        b'b' | b'h' | b'i' | b'l' | b'q' | b'n' => true,
        b'B' | b'H' | b'I' | b'L' | b'Q' | b'N' | b'?' => false,
        _ => return None,
    };
    if ![1, 2, 4, 8].contains(&itemsize) {
        return None;
    }
    let little = match order {
        b'<' => true,
        b'>' | b'!' => false,
        _ => cfg!(target_endian = "little"),
    };
    let swapped = itemsize > 1 && little != cfg!(target_endian = "little");
    Some(Kind { size: itemsize, signed, swapped })
}

/// The element kind of an `__array_interface__` typestr (`"<u4"`, `"|i1"`, ...).
fn kind_of_typestr(t: &str) -> Option<Kind> {
    let b = t.as_bytes();
    if b.len() < 3 {
        return None;
    }
    let signed = match b[1] {
        b'i' => true,
        b'u' | b'b' => false,
        _ => return None,
    };
    let size: usize = t[2..].parse().ok()?;
    if ![1, 2, 4, 8].contains(&size) {
        return None;
    }
    let little = match b[0] {
        b'<' => true,
        b'>' => false,
        _ => cfg!(target_endian = "little"), // '|' and '='
    };
    let swapped = size > 1 && little != cfg!(target_endian = "little");
    Some(Kind { size, signed, swapped })
}

fn not_ints(what: &str, obj: &Bound<'_, PyAny>, why: &str) -> PyErr {
    let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
    PyTypeError::new_err(format!("{what}: expected a sequence of integer ids, got {ty}{why}"))
}

/// Borrowed memory copied now, while the GIL is held, into memory the `Input` owns (the
/// same elements, kind and count, contiguous), the export or reference released: what the
/// call then reads with the GIL released is its own copy, which nobody else can write.
///
/// Why: a writable NumPy array, `array`, tensor or any other buffer can be written by
/// another Python thread as soon as the GIL is released, and even a read-only export may
/// be a view of memory that another view writes; reading the caller's memory through a
/// `&[u32]` without the GIL would be a data race behind a shared reference, and the core
/// would see values change under it. Holding the GIL during the copy excludes every Python
/// thread; a native writer in another thread that released the GIL itself (a NumPy
/// operation writing into the array) can still race the copy, but only the copy: the call
/// sees one consistent array, whatever it read. The copy is a memcpy of the caller's bytes
/// (per element for strided memory); the conversion and range check of non-`uint32` data
/// run on it later, with the GIL released, exactly as they did on the caller's memory.
fn settle(input: Input) -> PyResult<Input> {
    let Input::Borrowed(r, keep) = input else { return Ok(input) };
    let size = r.kind.size;
    let bytes = r.n * size;
    // Room for the bytes (whole words: 8-byte aligned), written once by the copy below;
    // the last word is zeroed first so that every word is initialized when its tail is not
    // an element's.
    let words = bytes.div_ceil(8);
    let mut buf: Vec<u64> = Vec::with_capacity(words);
    let dst = buf.as_mut_ptr().cast::<u8>();
    if r.n > 0 {
        // SAFETY: `words >= 1` here (n > 0, size >= 1), within the capacity just reserved.
        unsafe { buf.as_mut_ptr().add(words - 1).write(0) };
        if r.stride == size as isize || r.n == 1 {
            // SAFETY: `r` names `n` contiguous elements of `size` bytes at `r.ptr`, readable
            // and kept alive by `keep` (the export or the object) until it drops below; `buf`
            // holds at least `bytes` bytes and is our own, so the two do not overlap. The
            // GIL is held (`to_input` runs with it), so no Python thread writes meanwhile.
            unsafe { std::ptr::copy_nonoverlapping(r.ptr, dst, bytes) };
        } else {
            for i in 0..r.n {
                // SAFETY: element `i` (`i < n`, `stride` bytes apart) lies in the memory `r`
                // names, alive as above; its `size` bytes go to `buf[i * size..]`, in bounds.
                unsafe {
                    let src = r.ptr.offset(i as isize * r.stride);
                    std::ptr::copy_nonoverlapping(src, dst.add(i * size), size);
                }
            }
        }
    }
    // SAFETY: the `words` words are initialized: the copy wrote bytes `0..bytes`, and the
    // last word, which holds the end of them, was zeroed before it.
    unsafe { buf.set_len(words) };
    drop(keep); // the export (or reference) is released here, with the GIL held
    let raw = Raw { ptr: buf.as_ptr().cast::<u8>(), n: r.n, stride: size as isize, kind: r.kind };
    // Moving `buf` into the `Input` moves no element: `raw.ptr` stays valid while it lives.
    Ok(Input::Borrowed(raw, Keep::Copy(buf)))
}

/// `obj` as an argument of `u32` ids (see the module docs).
pub fn to_input(obj: &Bound<'_, PyAny>, what: &'static str) -> PyResult<Input> {
    if obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
    {
        return Err(not_ints(what, obj, ""));
    }
    if let Ok(l) = obj.cast_exact::<PyList>() {
        return from_items(l.iter(), l.len(), what).map(Input::Owned);
    }
    if let Ok(t) = obj.cast_exact::<PyTuple>() {
        return from_items(t.iter(), t.len(), what).map(Input::Owned);
    }
    if let Some(b) = buffer(obj, what)? {
        return settle(b);
    }
    if let Some(t) = tensor(obj, what)? {
        return settle(t);
    }
    if let Some(a) = array_interface(obj, what)? {
        return settle(a);
    }
    let iter = obj.try_iter().map_err(|_| not_ints(what, obj, ""))?;
    let mut v = Vec::new();
    for (i, item) in iter.enumerate() {
        v.push(one_id(&item?, what, i)?);
    }
    Ok(Input::Owned(v))
}

/// `obj[start:stop]` (clamped) as `u32` ids, converted in one pass while the GIL is held:
/// no copy of the rest of the buffer and no second pass over a copy, for calls that read a
/// span of a long key (the SGLang backend's). The result is always `Input::Owned`: its
/// indices start at 0 (the span's first element), so the caller does not narrow it again;
/// an out-of-range id is named by its index in `obj`.
pub fn to_input_span(
    obj: &Bound<'_, PyAny>,
    what: &'static str,
    start: usize,
    stop: usize,
) -> PyResult<Input> {
    let (sub, keep, start) = match span_memory(obj, what, start, stop)? {
        Spanned::Ids(v) => return Ok(Input::Owned(v)),
        Spanned::Memory { sub, keep, start } => (sub, keep, start),
    };
    read_memory(sub, keep, start, what).map(Input::Owned)
}

/// [`to_input_span`] into a shared, immutable buffer (what a radixkv lock can keep a
/// reference to instead of a copy: [`radixkv::tree::Key`]). Contiguous, aligned int64 or
/// uint64 memory in this machine's byte order (an `array('q')`, a CPU tensor, a NumPy
/// array) is narrowed straight into the buffer, one write per id; anything else is
/// converted as [`to_input_span`] converts it, then moved in (one copy).
pub fn to_shared_span(
    obj: &Bound<'_, PyAny>,
    what: &'static str,
    start: usize,
    stop: usize,
) -> PyResult<Arc<[u32]>> {
    let (sub, keep, start) = match span_memory(obj, what, start, stop)? {
        Spanned::Ids(v) => return Ok(v.into()),
        Spanned::Memory { sub, keep, start } => (sub, keep, start),
    };
    let k = sub.kind;
    let direct = k.size == 8
        && !k.swapped
        && (sub.stride == 8 || sub.n <= 1)
        && (sub.ptr as usize).is_multiple_of(8);
    if !direct || sub.n == 0 {
        return read_memory(sub, keep, start, what).map(Arc::from);
    }
    // SAFETY: `sub` names `n` readable, aligned, contiguous 8-byte elements of the caller's
    // memory (checked above), which `keep` keeps alive until it is dropped below; the GIL is
    // held throughout, so no Python thread writes them meanwhile. Every bit pattern is a
    // `u64`.
    let s: &[u64] = unsafe { std::slice::from_raw_parts(sub.ptr.cast::<u64>(), sub.n) };
    let mut buf = Arc::<[u32]>::new_uninit_slice(s.len());
    let dst = Arc::get_mut(&mut buf).expect("a new buffer has one owner");
    let mut high = 0u64;
    for (d, &x) in dst.iter_mut().zip(s) {
        d.write(x as u32);
        high |= x;
    }
    if high >> 32 != 0 {
        let i = s.iter().position(|&x| x >> 32 != 0).unwrap_or(0);
        let v = if k.signed { s[i] as i64 as i128 } else { s[i] as i128 };
        return Err(OutOfRange { what, index: i + start, value: v }.into_err());
    }
    drop(keep);
    // SAFETY: the loop above wrote every element (`dst` and `s` have the same length).
    Ok(unsafe { buf.assume_init() })
}

/// `obj[start:stop]`'s memory or ids (see [`to_input_span`]).
fn span_memory(
    obj: &Bound<'_, PyAny>,
    what: &'static str,
    start: usize,
    stop: usize,
) -> PyResult<Spanned> {
    if obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
    {
        return Err(not_ints(what, obj, ""));
    }
    let raw = if let Some(b) = buffer(obj, what)? {
        b
    } else if let Some(t) = tensor(obj, what)? {
        t
    } else if let Some(a) = array_interface(obj, what)? {
        a
    } else {
        // A sequence: converted whole (it is read item by item anyway), then cut.
        let mut v = match to_input(obj, what)? {
            Input::Owned(v) => v,
            b @ Input::Borrowed(..) => {
                let mut sc = Vec::new();
                let s = b.view().get(what, &mut sc).map_err(OutOfRange::into_err)?;
                s.to_vec()
            }
        };
        let stop = stop.min(v.len());
        v.truncate(stop);
        v.drain(..start.min(stop));
        return Ok(Spanned::Ids(v));
    };
    let Input::Borrowed(r, keep) = raw else { unreachable!("memory is borrowed") };
    let stop = stop.min(r.n);
    let start = start.min(stop);
    // The span's first element: `start < n` elements in when the span is not empty, so
    // within the memory `r` names (`wrapping_offset` computes the address, nothing is read).
    let sub = Raw {
        ptr: if stop > start { r.ptr.wrapping_offset(start as isize * r.stride) } else { r.ptr },
        n: stop - start,
        stride: r.stride,
        kind: r.kind,
    };
    Ok(Spanned::Memory { sub, keep, start })
}

/// The span of `obj` a conversion reads: ids already read off a sequence, or the caller's
/// memory (`sub`, kept alive by `keep`; `start`: the span's first index in `obj`).
enum Spanned {
    Ids(Vec<u32>),
    Memory { sub: Raw, keep: Keep, start: usize },
}

/// Reads a [`Spanned::Memory`] span into ids of its own (with the GIL held).
fn read_memory(sub: Raw, keep: Keep, start: usize, what: &'static str) -> PyResult<Vec<u32>> {
    let mut sc = Vec::new();
    // The view reads the caller's memory (kept alive by `keep`, dropped below) with the GIL
    // held, as `settle` copies it: no Python thread writes it meanwhile.
    let (p, n) = match View::Raw(RawView { raw: sub, _input: PhantomData }).get(what, &mut sc) {
        Ok(s) => (s.as_ptr(), s.len()),
        Err(e) => return Err(OutOfRange { index: e.index + start, ..e }.into_err()),
    };
    let v = if n == 0 {
        Vec::new()
    } else if std::ptr::eq(p, sc.as_ptr()) {
        sc.truncate(n);
        sc
    } else {
        // SAFETY: `get` returned `n` aligned, contiguous `u32`s of the caller's memory at `p`
        // (not the scratch), which `keep` keeps alive until after this copy; the GIL is
        // held, so no Python thread writes them meanwhile.
        unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
    };
    drop(keep);
    Ok(v)
}

/// `obj[start:stop]` (clamped) as `u32` ids **read in place**: for memory (buffers, CPU
/// tensors, `__array_interface__`), an `Input::Borrowed` naming the caller's own memory (no
/// copy; `uint32` and non-negative `int32` data is then read as it is by [`View::get`]);
/// anything else as [`to_input_span`]. The caller must read it (and drop it) with the GIL
/// held, without running Python code in between: that is what keeps another Python thread
/// from writing the memory while it is read (the argument [`settle`] makes with its copy).
pub fn to_input_span_held(
    obj: &Bound<'_, PyAny>,
    what: &'static str,
    start: usize,
    stop: usize,
) -> PyResult<Input> {
    if obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
    {
        return Err(not_ints(what, obj, ""));
    }
    let raw = if let Some(b) = buffer(obj, what)? {
        b
    } else if let Some(t) = tensor(obj, what)? {
        t
    } else if let Some(a) = array_interface(obj, what)? {
        a
    } else {
        return to_input_span(obj, what, start, stop);
    };
    let Input::Borrowed(r, keep) = raw else { return Ok(raw) };
    let stop = stop.min(r.n);
    let start = start.min(stop);
    let sub = Raw {
        // Within the memory `r` names (start <= n): nothing is read here.
        ptr: if stop > start { r.ptr.wrapping_offset(start as isize * r.stride) } else { r.ptr },
        n: stop - start,
        stride: r.stride,
        kind: r.kind,
    };
    Ok(Input::Borrowed(sub, keep))
}

fn from_items<'py>(
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    n: usize,
    what: &'static str,
) -> PyResult<Vec<u32>> {
    let mut v = Vec::with_capacity(n);
    for (i, item) in items.enumerate() {
        v.push(one_id(&item, what, i)?);
    }
    Ok(v)
}

/// One id of a Python sequence: an int (or any `__index__` integer) in `[0, 2**32)`.
fn one_id(item: &Bound<'_, PyAny>, what: &'static str, i: usize) -> PyResult<u32> {
    match item.extract::<i64>() {
        Ok(x) if (0..1i64 << 32).contains(&x) => Ok(x as u32),
        Ok(x) => Err(OutOfRange { what, index: i, value: x as i128 }.into_err()),
        Err(e) if e.is_instance_of::<PyOverflowError>(item.py()) => {
            let shown = item.str().map(|s| s.to_string()).unwrap_or_default();
            Err(PyValueError::new_err(format!(
                "{what}[{i}] = {shown} is out of range: ids must be in [0, 2**32)"
            )))
        }
        Err(_) => {
            let ty = item.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            Err(PyTypeError::new_err(format!("{what}[{i}]: expected an integer id, not {ty}")))
        }
    }
}

/// The buffer-protocol path: `None` when `obj` exports no buffer.
fn buffer(obj: &Bound<'_, PyAny>, what: &'static str) -> PyResult<Option<Input>> {
    let mut view = Box::new(PyBufferRaw {
        buf: std::ptr::null_mut(),
        obj: std::ptr::null_mut(),
        len: 0,
        itemsize: 0,
        readonly: 0,
        ndim: 0,
        format: std::ptr::null_mut(),
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        suboffsets: std::ptr::null_mut(),
        internal: std::ptr::null_mut(),
    });
    // SAFETY: `obj` is a live object (we hold the GIL through `obj`'s token) and `view` a
    // writable `Py_buffer`.
    let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, PYBUF_RECORDS_RO) };
    if rc != 0 {
        // No buffer protocol (a TypeError) or a refusal: fall through to the other paths.
        let _ = PyErr::take(obj.py());
        return Ok(None);
    }
    let ex = Exported { view };
    let v = &*ex.view;
    let format = if v.format.is_null() {
        "B".to_string()
    } else {
        // SAFETY: a successful export's `format` is a NUL-terminated string that lives as
        // long as the export.
        unsafe { CStr::from_ptr(v.format) }.to_string_lossy().into_owned()
    };
    let itemsize = v.itemsize.max(0) as usize;
    let Some(kind) = kind_of_format(&format, itemsize) else {
        return Err(not_ints(what, obj, &format!(" of format {format:?} (not integers)")));
    };
    let (n, stride) = match v.ndim {
        0 => return Err(not_ints(what, obj, " (a 0-dimensional buffer)")),
        1 => {
            // SAFETY: with PyBUF_STRIDES, shape and strides hold `ndim` entries.
            let (n, s) = unsafe { (*v.shape, *v.strides) };
            (n.max(0) as usize, s)
        }
        d => {
            return Err(not_ints(what, obj, &format!(" ({d}-dimensional; pass a 1-D array)")));
        }
    };
    if !v.suboffsets.is_null() {
        return Err(not_ints(what, obj, " (an indirect buffer)"));
    }
    let raw = Raw { ptr: v.buf as *const u8, n, stride, kind };
    Ok(Some(Input::Borrowed(raw, Keep::Buffer(ex))))
}

/// `torch.Tensor` when torch is loaded (never imported here).
fn torch_tensor_type(py: Python<'_>) -> Option<&Bound<'_, PyAny>> {
    static TENSOR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    if let Some(t) = TENSOR.get(py) {
        return Some(t.bind(py));
    }
    let modules = py.import("sys").ok()?.getattr("modules").ok()?;
    let torch = modules.cast_into::<PyDict>().ok()?.get_item("torch").ok()??;
    let tensor = torch.getattr("Tensor").ok()?;
    Some(TENSOR.get_or_init(py, || tensor.unbind()).bind(py))
}

/// The CPU-tensor path: `None` when `obj` is not a torch tensor.
fn tensor(obj: &Bound<'_, PyAny>, what: &'static str) -> PyResult<Option<Input>> {
    let py = obj.py();
    let Some(tt) = torch_tensor_type(py) else { return Ok(None) };
    if !obj.is_instance(tt)? {
        return Ok(None);
    }
    if !obj.getattr("is_cpu")?.is_truthy()? {
        return Err(not_ints(what, obj, " on a device (move it to the CPU first)"));
    }
    let dtype = obj.getattr("dtype")?;
    let kind = tensor_kind(&dtype)
        .ok_or_else(|| not_ints(what, obj, &format!(" of dtype {dtype} (not integers)")))?;
    let n: usize = obj.call_method0("numel")?.extract()?;
    let dim: usize = obj.call_method0("dim")?.extract()?;
    if dim > 1 {
        return Err(not_ints(what, obj, &format!(" ({dim}-dimensional; pass a 1-D tensor)")));
    }
    let stride: isize = if n > 1 && dim == 1 {
        let s: isize = obj.call_method1("stride", (0,))?.extract()?;
        s * kind.size as isize
    } else {
        kind.size as isize
    };
    let ptr: usize = obj.call_method0("data_ptr")?.extract()?;
    let raw = Raw { ptr: ptr as *const u8, n, stride, kind };
    Ok(Some(Input::Borrowed(raw, Keep::Object(obj.clone().unbind()))))
}

/// The element kind of a torch dtype, looked up once per dtype object.
fn tensor_kind(dtype: &Bound<'_, PyAny>) -> Option<Kind> {
    static KNOWN: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    let py = dtype.py();
    let known = KNOWN.get_or_init(py, || PyDict::new(py).unbind()).bind(py);
    if let Ok(Some(k)) = known.get_item(dtype) {
        let (size, signed): (usize, bool) = k.extract().ok()?;
        return (size > 0).then_some(Kind { size, signed, swapped: false });
    }
    let float = dtype.getattr("is_floating_point").ok()?.is_truthy().ok()?;
    let complex = dtype.getattr("is_complex").ok()?.is_truthy().ok()?;
    let size: usize = dtype.getattr("itemsize").ok()?.extract().ok()?;
    let signed = dtype.getattr("is_signed").ok()?.is_truthy().ok()?;
    let ok = !float && !complex && [1, 2, 4, 8].contains(&size);
    let _ = known.set_item(dtype, if ok { (size, signed) } else { (0, false) });
    ok.then_some(Kind { size, signed, swapped: false })
}

/// The `__array_interface__` path (version 3, memory in this process): `None` without one.
fn array_interface<'py>(obj: &Bound<'py, PyAny>, what: &'static str) -> PyResult<Option<Input>> {
    let Ok(ai) = obj.getattr("__array_interface__") else {
        let _ = PyErr::take(obj.py());
        return Ok(None);
    };
    let ai = ai
        .cast_into::<PyDict>()
        .map_err(|_| not_ints(what, obj, " (a bad __array_interface__)"))?;
    let get = |k: &str| -> PyResult<Bound<'py, PyAny>> {
        ai.get_item(k)?
            .ok_or_else(|| not_ints(what, obj, &format!(" (__array_interface__ without {k:?})")))
    };
    let typestr: String = get("typestr")?.extract()?;
    let kind = kind_of_typestr(&typestr)
        .ok_or_else(|| not_ints(what, obj, &format!(" of typestr {typestr:?} (not integers)")))?;
    let shape: Vec<usize> = get("shape")?.extract()?;
    let n = match shape.as_slice() {
        [n] => *n,
        [] => return Err(not_ints(what, obj, " (0-dimensional)")),
        s => {
            return Err(not_ints(
                what,
                obj,
                &format!(" ({}-dimensional; pass a 1-D array)", s.len()),
            ));
        }
    };
    let stride = match ai.get_item("strides")? {
        Some(s) if !s.is_none() => {
            let s: Vec<isize> = s.extract()?;
            s.first().copied().unwrap_or(kind.size as isize)
        }
        _ => kind.size as isize,
    };
    let (ptr, _readonly): (usize, bool) = get("data")?.extract().map_err(|_| {
        not_ints(what, obj, " (its __array_interface__ 'data' is not an (address, readonly) pair)")
    })?;
    let raw = Raw { ptr: ptr as *const u8, n, stride, kind };
    Ok(Some(Input::Borrowed(raw, Keep::Object(obj.clone().unbind()))))
}

/// `(start, length)` pairs as `SlotRun`s, range-checked.
pub fn to_runs(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<radixkv::SlotRun>> {
    let mut out = Vec::new();
    for (i, pair) in obj.try_iter()?.enumerate() {
        let pair = pair?;
        let r: PyResult<(i64, i64)> = pair.extract();
        let (start, len) = r.map_err(|e| {
            if e.is_instance_of::<PyOverflowError>(obj.py()) {
                PyValueError::new_err(format!(
                    "{what}[{i}]: start and length must be in [0, 2**32)"
                ))
            } else {
                PyTypeError::new_err(format!(
                    "{what}[{i}]: expected a (start, length) pair of ints"
                ))
            }
        })?;
        if !(0..1i64 << 32).contains(&start) || !(0..1i64 << 32).contains(&len) {
            return Err(PyValueError::new_err(format!(
                "{what}[{i}]: start and length must be in [0, 2**32)"
            )));
        }
        out.push(radixkv::SlotRun { start: start as u32, len: len as u32 });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// 64-bit values (block and content hashes) and raw bytes, for the router index.

/// An argument of `u64` values (64-bit hashes): buffers go the way of [`to_input`]'s (copied
/// while the GIL is held, read without it); Python sequences are read item by item.
pub enum Input64 {
    /// A buffer, tensor or `__array_interface__` object, copied ([`settle`]).
    Borrowed(Input),
    /// Values read from a Python sequence.
    Owned(Vec<u64>),
}

/// An [`Input64`]'s memory as the call reads it with the GIL released.
#[derive(Clone, Copy)]
pub enum View64<'a> {
    Raw(RawView<'a>),
    Slice(&'a [u64]),
}

impl Input64 {
    /// The view the call reads with the GIL released.
    pub fn view(&self) -> View64<'_> {
        match self {
            Input64::Borrowed(Input::Borrowed(raw, _)) => {
                View64::Raw(RawView { raw: *raw, _input: PhantomData })
            }
            // `to_input64` only makes `Borrowed` from buffers; kept total all the same.
            Input64::Borrowed(Input::Owned(_)) => View64::Slice(&[]),
            Input64::Owned(v) => View64::Slice(v),
        }
    }
}

impl<'a> View64<'a> {
    /// The values as `u64`s: 8-byte integers (signed ones as their bits, the way a NumPy
    /// `int64` array holds hashes) in place when contiguous and aligned, anything else
    /// converted into `scratch`; a negative value of a narrower signed type is out of range.
    pub fn get<'s>(
        self,
        what: &'static str,
        scratch: &'s mut Vec<u64>,
    ) -> Result<&'s [u64], OutOfRange>
    where
        'a: 's,
    {
        let r = match self {
            View64::Slice(s) => return Ok(s),
            View64::Raw(v) => v.raw,
        };
        if r.n == 0 {
            return Ok(&[]);
        }
        let aligned = (r.ptr as usize).is_multiple_of(r.kind.size);
        let contiguous = r.stride == r.kind.size as isize || r.n == 1;
        if r.kind.size == 8 && contiguous && aligned && !r.kind.swapped {
            // SAFETY: `r` names `n` readable, aligned, contiguous 8-byte elements, kept alive
            // by the `Input` this view borrows ('a outlives 's): the call's own copy made
            // under the GIL (`settle`), which nobody writes. Every bit pattern is a `u64`.
            return Ok(unsafe { std::slice::from_raw_parts(r.ptr.cast::<u64>(), r.n) });
        }
        scratch.clear();
        scratch.reserve(r.n);
        for i in 0..r.n {
            // SAFETY: element `i` lies in the memory `r` names (`i < n`, `stride` apart),
            // kept alive by the `Input`; read unaligned, whatever the address.
            let v = unsafe { read_elem(r.ptr.offset(i as isize * r.stride), r.kind) };
            if v < 0 && r.kind.size < 8 {
                return Err(OutOfRange { what, index: i, value: v });
            }
            scratch.push(v as i64 as u64);
        }
        Ok(scratch)
    }
}

/// One 64-bit value of a Python sequence: an int in `[-2**63, 2**64)`, a negative one taken
/// as its two's-complement bits (vLLM and SGLang hashes may be negative Python ints).
fn one_u64(item: &Bound<'_, PyAny>, what: &'static str, i: usize) -> PyResult<u64> {
    if let Ok(x) = item.extract::<u64>() {
        return Ok(x);
    }
    match item.extract::<i64>() {
        Ok(x) => Ok(x as u64),
        Err(e) if e.is_instance_of::<PyOverflowError>(item.py()) => {
            let shown = item.str().map(|s| s.to_string()).unwrap_or_default();
            Err(PyValueError::new_err(format!(
                "{what}[{i}] = {shown} is out of range: 64-bit hashes must be in [-2**63, 2**64)"
            )))
        }
        Err(_) => {
            let ty = item.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            Err(PyTypeError::new_err(format!("{what}[{i}]: expected an integer hash, not {ty}")))
        }
    }
}

/// `obj` as an argument of `u64` values (see [`Input64`]): the same kinds of object as
/// [`to_input`] takes.
pub fn to_input64(obj: &Bound<'_, PyAny>, what: &'static str) -> PyResult<Input64> {
    if obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
    {
        return Err(not_ints(what, obj, ""));
    }
    let items = |it: &mut dyn Iterator<Item = PyResult<Bound<'_, PyAny>>>| -> PyResult<Vec<u64>> {
        let mut v = Vec::new();
        for (i, item) in it.enumerate() {
            v.push(one_u64(&item?, what, i)?);
        }
        Ok(v)
    };
    if let Ok(l) = obj.cast_exact::<PyList>() {
        return items(&mut l.iter().map(Ok)).map(Input64::Owned);
    }
    if let Ok(t) = obj.cast_exact::<PyTuple>() {
        return items(&mut t.iter().map(Ok)).map(Input64::Owned);
    }
    if let Some(b) = buffer(obj, what)? {
        return settle(b).map(Input64::Borrowed);
    }
    if let Some(t) = tensor(obj, what)? {
        return settle(t).map(Input64::Borrowed);
    }
    if let Some(a) = array_interface(obj, what)? {
        return settle(a).map(Input64::Borrowed);
    }
    let mut iter = obj.try_iter().map_err(|_| not_ints(what, obj, ""))?;
    items(&mut iter).map(Input64::Owned)
}

/// `obj` as `u64` values like [`to_input64`], but a buffer, tensor or
/// `__array_interface__` object is read in place, not copied: for a caller that keeps the GIL
/// from here until it drops the result and runs no Python code in between (no object made,
/// no callback), so that no Python thread can write or free the memory meanwhile (the
/// export, or the object, is kept alive by the result). The tree core's calls are such.
pub fn to_input64_held(obj: &Bound<'_, PyAny>, what: &'static str) -> PyResult<Input64> {
    if obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
    {
        return Err(not_ints(what, obj, ""));
    }
    if obj.cast_exact::<PyList>().is_err() && obj.cast_exact::<PyTuple>().is_err() {
        if let Some(b) = buffer(obj, what)? {
            return Ok(Input64::Borrowed(b));
        }
        if let Some(t) = tensor(obj, what)? {
            return Ok(Input64::Borrowed(t));
        }
        if let Some(a) = array_interface(obj, what)? {
            return Ok(Input64::Borrowed(a));
        }
    }
    to_input64(obj, what)
}

/// The bytes of a contiguous buffer other than `bytes` (a `bytearray`, `memoryview`, NumPy
/// `uint8` array, ...), copied while the GIL is held; `None` when `obj` exports no buffer.
pub fn buffer_bytes(obj: &Bound<'_, PyAny>, what: &'static str) -> PyResult<Option<Vec<u8>>> {
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(Some(b.to_vec()));
    }
    let Some(Input::Borrowed(r, keep)) = buffer(obj, what)? else {
        return Ok(None);
    };
    if !(r.stride == r.kind.size as isize || r.n <= 1) {
        return Err(PyTypeError::new_err(format!(
            "{what}: expected contiguous bytes, got a strided buffer"
        )));
    }
    let len = r.n * r.kind.size;
    let out = if len == 0 {
        Vec::new()
    } else {
        // SAFETY: `r` names `len` contiguous readable bytes kept alive by `keep` (the export,
        // released below, after the copy); the GIL is held, so no Python thread writes them.
        unsafe { std::slice::from_raw_parts(r.ptr, len) }.to_vec()
    };
    drop(keep);
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_name_integer_kinds() {
        let k = |f: &str, n| kind_of_format(f, n);
        assert_eq!(k("I", 4), Some(U32));
        assert_eq!(k("=I", 4), Some(U32));
        assert_eq!(k("q", 8), Some(Kind { size: 8, signed: true, swapped: false }));
        assert_eq!(k("d", 8), None);
        assert_eq!(k("2I", 8), None);
        let big = k(">I", 4).unwrap();
        assert_eq!(big.swapped, cfg!(target_endian = "little"));
        assert_eq!(kind_of_typestr("<u4"), Some(U32).filter(|_| cfg!(target_endian = "little")));
        assert_eq!(kind_of_typestr("<f8"), None);
    }

    #[test]
    fn hash_views_take_64_bit_values_as_bits() {
        let v: Vec<i64> = vec![1, -1, i64::MIN];
        let k8 = Kind { size: 8, signed: true, swapped: false };
        let raw = Raw { ptr: v.as_ptr().cast(), n: 3, stride: 8, kind: k8 };
        let mut s = Vec::new();
        let got = View64::Raw(RawView { raw, _input: PhantomData }).get("h", &mut s);
        assert_eq!(got.ok().unwrap(), &[1, u64::MAX, 1 << 63]);
        // Strided: every other element, converted.
        let raw = Raw { n: 2, stride: 16, ..raw };
        let got = View64::Raw(RawView { raw, _input: PhantomData }).get("h", &mut s);
        assert_eq!(got.ok().unwrap(), &[1, 1 << 63]);
        // Narrower types widen; a negative narrower value is out of range.
        let w: Vec<i32> = vec![7, -3];
        let k4 = Kind { size: 4, signed: true, swapped: false };
        let raw = Raw { ptr: w.as_ptr().cast(), n: 2, stride: 4, kind: k4 };
        let e = View64::Raw(RawView { raw, _input: PhantomData }).get("h", &mut s).err().unwrap();
        assert_eq!((e.index, e.value), (1, -3));
        let raw = Raw { kind: U32, ..raw };
        let got = View64::Raw(RawView { raw, _input: PhantomData }).get("h", &mut s);
        assert_eq!(got.ok().unwrap(), &[7, u32::MAX as u64 - 2]);
    }

    #[test]
    fn views_convert_with_a_range_check() {
        let v: Vec<i64> = vec![1, 2, 1 << 32];
        let raw = Raw {
            ptr: v.as_ptr().cast(),
            n: 3,
            stride: 8,
            kind: Kind { size: 8, signed: true, swapped: false },
        };
        let view = View::Raw(RawView { raw, _input: PhantomData });
        let mut s = Vec::new();
        let e = view.get("tokens", &mut s).err().unwrap();
        assert_eq!((e.index, e.value), (2, 1 << 32));
        let raw = Raw { n: 2, ..raw };
        let view = View::Raw(RawView { raw, _input: PhantomData });
        assert_eq!(view.get("tokens", &mut s).ok().unwrap(), &[1, 2]);
    }
}
