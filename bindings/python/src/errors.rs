//! Errors: a status (the C ABI's `rkv_status` numbers, which the Python classes carry as
//! `.status`) and the message `docs/errors.md` describes, naming the operation (by its C
//! name, as the C ABI's messages do), the argument, the value and the limit. A failed call
//! records its message as this thread's last error, a successful one clears it
//! (`radixkv._native.lib.rkv_last_error_message()`).

use std::cell::RefCell;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use radixkv::Error;
use radixkv::SlotRun;
use radixkv::pool::{SlotPool, SlotState};

pub const NULL_ARGUMENT: i32 = 1;
pub const INVALID_ARGUMENT: i32 = 2;
pub const INVALID_LOCK: i32 = 3;
pub const OUT_OF_SLOTS: i32 = 5;
pub const NO_POOL: i32 = 6;
pub const DOUBLE_FREE: i32 = 7;
pub const DEVICE_ERROR: i32 = 8;
pub const INTERNAL_ERROR: i32 = 9;
pub const IO_ERROR: i32 = 10;
/// Not a status: the cache (or publisher) was closed (`CacheClosedError`).
pub const CLOSED: i32 = -1;
/// Not a status: a plain `ValueError` of the Python layer (a bad id).
pub const VALUE: i32 = -2;
/// Not a status: a plain `TypeError`.
pub const TYPE: i32 = -3;

/// A refusal: its status and its message (without the operation's name).
#[derive(Debug)]
pub struct Fail {
    pub status: i32,
    pub msg: String,
}

pub fn fail(status: i32, msg: impl Into<String>) -> Fail {
    Fail { status, msg: msg.into() }
}

pub type Res<T> = Result<T, Fail>;

/// The status of a core error.
pub fn status_of(e: &Error) -> i32 {
    match e {
        Error::InvalidArgument(_) | Error::Slot { .. } => INVALID_ARGUMENT,
        Error::InvalidLock => INVALID_LOCK,
        Error::OutOfSlots { .. } => OUT_OF_SLOTS,
        Error::NoPool => NO_POOL,
        Error::DoubleFree { .. } => DOUBLE_FREE,
        Error::Device(_) => DEVICE_ERROR,
        Error::Io(_) => IO_ERROR,
    }
}

/// A core error with its own message.
pub fn st(e: Error) -> Fail {
    fail(status_of(&e), e.to_string())
}

thread_local! {
    static LAST: RefCell<String> = const { RefCell::new(String::new()) };
}

/// This thread's message for its last failed call ("" after a success).
pub fn last_error_message() -> String {
    LAST.with(|l| l.borrow().clone())
}

fn set_last(msg: &str) {
    LAST.with(|l| {
        let mut l = l.borrow_mut();
        l.clear();
        l.push_str(msg);
    });
}

fn clear_last() {
    LAST.with(|l| {
        if let Ok(mut l) = l.try_borrow_mut()
            && !l.is_empty()
        {
            l.clear();
        }
    });
}

/// The Python classes by status, registered by `radixkv._cache` at import.
static CLASSES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();

pub fn register_classes(py: Python<'_>, classes: Bound<'_, PyDict>) -> PyResult<()> {
    CLASSES
        .set(py, classes.unbind())
        .map_err(|_| PyRuntimeError::new_err("the error classes are registered already"))
}

/// The Python exception of a refusal by `function`.
pub fn to_pyerr(py: Python<'_>, function: &str, f: Fail) -> PyErr {
    match f.status {
        VALUE => return PyValueError::new_err(f.msg),
        TYPE => return PyTypeError::new_err(f.msg),
        _ => {}
    }
    let msg = if f.status == CLOSED { f.msg } else { format!("{function}: {}", f.msg) };
    if f.status != CLOSED {
        set_last(&msg);
    }
    let Some(classes) = CLASSES.get(py) else {
        return PyRuntimeError::new_err(msg);
    };
    let cls = classes.bind(py).get_item(f.status).ok().flatten();
    match cls {
        Some(cls) => {
            let status = (f.status >= 0).then_some(f.status);
            match cls.call1((msg.clone(), status)) {
                Ok(e) => PyErr::from_value(e),
                Err(e) => e,
            }
        }
        None => PyRuntimeError::new_err(msg),
    }
}

/// A call's result as Python sees it: a success clears this thread's last error.
pub fn done<T>(py: Python<'_>, function: &str, r: Res<T>) -> PyResult<T> {
    match r {
        Ok(v) => {
            clear_last();
            Ok(v)
        }
        Err(f) => Err(to_pyerr(py, function, f)),
    }
}

/// `rkv_status_str`'s descriptions.
pub fn status_str(status: i32) -> &'static str {
    match status {
        0 => "RKV_OK: success",
        1 => "RKV_NULL_ARGUMENT: a required pointer is NULL",
        2 => "RKV_INVALID_ARGUMENT: invalid argument",
        3 => "RKV_INVALID_LOCK: unknown, already released, or another cache's lock",
        4 => "RKV_BUFFER_TOO_SMALL: output buffer too small (required length in *out_len)",
        5 => "RKV_OUT_OF_SLOTS: pool short even after evicting all that is evictable",
        6 => "RKV_NO_POOL: this cache has no slot pool",
        7 => "RKV_DOUBLE_FREE: slot already free or held by the tree",
        8 => "RKV_DEVICE_ERROR: KV storage / device failure",
        9 => "RKV_INTERNAL_ERROR: internal error (a bug in radixkv)",
        10 => "RKV_IO_ERROR: the environment refused (an address in use, a socket or thread)",
        _ => "unknown status",
    }
}

// ---------------------------------------------------------------------------------------
// The C ABI's messages for refused slots (src/ffi/mod.rs): the core names the slot, these
// name its position among the given ones and its state in the pool.

pub fn no_pool() -> Fail {
    fail(
        NO_POOL,
        "this cache has no slot pool (it was created with pool_slots = 0: the caller manages \
         slots)",
    )
}

/// The slot a core error names.
fn named_slot(e: &Error) -> Option<u32> {
    match e {
        Error::DoubleFree { slot } => Some(*slot),
        Error::InvalidArgument(m) => {
            let rest = m.strip_prefix("slot ")?;
            rest.split(' ').next()?.parse().ok()
        }
        _ => None,
    }
}

/// Where a slot value is among the given slots.
pub enum Given<'a> {
    Slots(&'a [u32]),
    Runs(&'a [SlotRun]),
}

impl Given<'_> {
    fn find(&self, slot: u32) -> Vec<String> {
        match self {
            Given::Slots(s) => s
                .iter()
                .enumerate()
                .filter(|(_, x)| **x == slot)
                .take(2)
                .map(|(i, _)| format!("slots[{i}] = {slot}"))
                .collect(),
            Given::Runs(r) => r
                .iter()
                .enumerate()
                .filter(|(_, r)| {
                    (r.start as u64..r.start as u64 + r.len as u64).contains(&(slot as u64))
                })
                .take(2)
                .map(|(i, r)| {
                    format!("runs[{i}] = {{start {}, len {}}}: slot {slot}", r.start, r.len)
                })
                .collect(),
        }
    }
}

/// A core refusal of given slots, with the slot's position and state.
pub fn slot_refusal(e: Error, given: Given<'_>, pool: Option<&SlotPool>) -> Fail {
    let status = status_of(&e);
    let Some(slot) = named_slot(&e) else { return st(e) };
    let at = given.find(slot);
    let Some(first) = at.first() else { return st(e) };
    let core_says_twice = matches!(&e, Error::InvalidArgument(m) if m.contains("twice"));
    let state = pool.and_then(|p| p.state(slot));
    let what = match pool {
        Some(p) if slot as usize >= p.capacity() => format!(
            "is out of range: the pool has {} slots (ids 0 to {})",
            p.capacity(),
            p.capacity() - 1
        ),
        _ if at.len() > 1 && (core_says_twice || state == Some(SlotState::Held)) => {
            format!("is given twice (also {})", at[1])
        }
        _ => match state {
            Some(SlotState::Free) => "is free, not held by the caller (never allocated with \
                                      alloc, or freed or evicted since)"
                .to_string(),
            Some(SlotState::Cached) => "is cached by the tree, not held by the caller (an \
                                        insert adopted it already; the tree owns it until it \
                                        is evicted)"
                .to_string(),
            _ => format!("is refused: {e}"),
        },
    };
    fail(status, format!("{first} {what}"))
}

/// Why runs for `n_tokens` tokens are refused before any slot is looked at, if they are.
pub fn runs_shape(runs: &[SlotRun], n_tokens: usize) -> Option<Fail> {
    let mut total = 0u64;
    for (i, r) in runs.iter().enumerate() {
        if r.len == 0 {
            return Some(fail(
                INVALID_ARGUMENT,
                format!("runs[{i}] = {{start {}, len 0}} is empty", r.start),
            ));
        }
        if u64::from(r.start) + u64::from(r.len) > 1 << 32 {
            return Some(fail(
                INVALID_ARGUMENT,
                format!(
                    "runs[{i}] = {{start {}, len {}}} goes past the largest slot id 2^32 - 1",
                    r.start, r.len
                ),
            ));
        }
        total += u64::from(r.len);
    }
    (total != n_tokens as u64).then(|| {
        fail(
            INVALID_ARGUMENT,
            format!(
                "the {} runs hold {total} slots but there are {n_tokens} tokens (one slot per \
                 token)",
                runs.len()
            ),
        )
    })
}

pub fn more_than_pool(n: usize, pool_slots: usize) -> Fail {
    fail(OUT_OF_SLOTS, format!("n_slots = {n} is more than the whole pool of {pool_slots} slots"))
}

/// An allocation's refusal, naming the numbers.
pub fn alloc_refusal(e: Error, n: usize, page_size: usize) -> Fail {
    match e {
        Error::OutOfSlots { requested, available } => fail(
            OUT_OF_SLOTS,
            format!(
                "n_slots = {requested}, but only {available} slots are free or evictable even \
                 after evicting (the other slots are pinned by locks or held by callers)"
            ),
        ),
        Error::InvalidArgument(_) if !n.is_multiple_of(page_size) => fail(
            INVALID_ARGUMENT,
            format!(
                "n_slots = {n} is not a multiple of the page size {page_size} (slots come in \
                 whole pages)"
            ),
        ),
        e => st(e),
    }
}
