//! Errors: a status (the C ABI's `rkv_status` numbers, which the Python classes carry as
//! `.status`) and the message `docs/errors.md` describes, naming the operation (by the
//! Python method that was called: `Cache.insert: ...`), the argument, the value and the
//! limit. A failed call
//! records its message as this thread's last error, a successful one clears it
//! (`radixkv._native.lib.rkv_last_error_message()`).

use std::cell::RefCell;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use radixkv::Error;
use radixkv::SlotRun;
use radixkv::pool::SlotPool;

// The status codes, from the core's one table (`radixkv::error::status`, which the C ABI's
// `rkv_status` is pinned to); `STATUS_CODES` hands the table to Python.
pub use radixkv::error::status::{
    INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_LOCK, NO_POOL, NULL_ARGUMENT, OUT_OF_SLOTS,
};
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

/// The status of a core error (the core's one mapping, [`Error::status`]).
pub fn status_of(e: &Error) -> i32 {
    e.status()
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

pub(crate) fn set_last(msg: &str) {
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

/// `rkv_status_str`'s descriptions (the core's table).
pub fn status_str(status: i32) -> &'static str {
    radixkv::error::status::describe(status).to_str().unwrap_or("unknown status")
}

/// The status codes as `(name, code)` pairs in number order, for `radixkv.Status`.
pub fn status_codes() -> Vec<(&'static str, i32)> {
    radixkv::error::status::ALL.iter().map(|c| (c.name, c.code)).collect()
}

// ---------------------------------------------------------------------------------------
// The C ABI's messages for refused slots (crates/ffi/src/refusal.rs): the core names the
// slot and its problem, these name its position among the given ones.

pub fn no_pool() -> Fail {
    fail(
        NO_POOL,
        "this cache has no slot pool (it was created with pool_slots = 0: the caller manages \
         slots)",
    )
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

/// A core refusal of given slots, with the slot's position and what is wrong with it, read
/// from the error's fields (`Error::Slot`'s problem, or `Error::DoubleFree`'s slot and its
/// state in the pool), never from its text.
pub fn slot_refusal(e: Error, given: Given<'_>, pool: Option<&SlotPool>) -> Fail {
    let status = status_of(&e);
    let at = e.slot().map(|(slot, _)| given.find(slot)).unwrap_or_default();
    match radixkv::error::slot_refusal_message(&e, &at, pool, "alloc") {
        Some(msg) => fail(status, msg),
        None => st(e),
    }
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
    fail(OUT_OF_SLOTS, format!("n = {n} is more than the whole pool of {pool_slots} slots"))
}

/// An allocation's refusal, naming the numbers.
pub fn alloc_refusal(e: Error, n: usize, page_size: usize) -> Fail {
    match e {
        Error::OutOfSlots { requested, available } => fail(
            OUT_OF_SLOTS,
            format!(
                "n = {requested}, but only {available} slots are free or evictable even \
                 after evicting (the other slots are pinned by locks or held by callers)"
            ),
        ),
        Error::InvalidArgument(_) if !n.is_multiple_of(page_size) => fail(
            INVALID_ARGUMENT,
            format!(
                "n = {n} is not a multiple of the page size {page_size} (slots come in \
                 whole pages)"
            ),
        ),
        e => st(e),
    }
}
