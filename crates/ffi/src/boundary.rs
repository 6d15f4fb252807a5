//! The panic boundary every exported body runs in, the refusal it returns (`Fail`), this
//! thread's last error message, and the status functions (`rkv_status_str`,
//! `rkv_last_error_message`, the versions).

use std::cell::{Cell, RefCell};
use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use radixkv_core::error::{Error, status};

use crate::types::{RKV_ABI_VERSION, rkv_status, rkv_status_value};

/// A refused call: its status and what exactly was wrong (which argument, which value,
/// which limit), for `rkv_last_error_message`. Built only on the error path.
pub(crate) struct Fail {
    pub(crate) status: rkv_status,
    pub(crate) msg: String,
}

pub(crate) type Res<T> = Result<T, Fail>;

/// A [`Fail`] with `status` and the message `msg`.
pub(crate) fn fail(status: rkv_status, msg: impl Into<String>) -> Fail {
    Fail { status, msg: msg.into() }
}

thread_local! {
    /// This thread's last error message, NUL-terminated; empty when the last call that
    /// returns an `rkv_status` succeeded (or none ran yet).
    static LAST_ERROR: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Whether `LAST_ERROR` holds a message: a success checks only this (a plain
    /// thread-local load, no destructor to register), so clearing costs nothing when there
    /// is nothing to clear.
    static HAS_ERROR: Cell<bool> = const { Cell::new(false) };
}

/// Records `function: msg` as this thread's last error (NUL bytes in `msg` dropped, so the
/// C string is whole). Does nothing while the thread's locals are being destroyed.
pub(crate) fn set_last_error(function: &str, msg: &str) {
    let _ = LAST_ERROR.try_with(|b| {
        if let Ok(mut b) = b.try_borrow_mut() {
            b.clear();
            b.extend_from_slice(function.as_bytes());
            b.extend_from_slice(b": ");
            b.extend(msg.bytes().filter(|&c| c != 0));
            b.push(0);
            HAS_ERROR.set(true);
        }
    });
}

/// Empties this thread's last error (a successful call). Keeps the buffer.
#[inline]
pub(crate) fn clear_last_error() {
    if HAS_ERROR.get() {
        HAS_ERROR.set(false);
        let _ = LAST_ERROR.try_with(|b| {
            if let Ok(mut b) = b.try_borrow_mut() {
                b.clear();
            }
        });
    }
}

/// What a caught panic says, for the message of its `RKV_INTERNAL_ERROR`.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

/// The panic boundary around every body of `function`: `Ok` is `RKV_OK` and clears this
/// thread's last error; an `Err` returns its status and records its message; a panic is
/// `RKV_INTERNAL_ERROR` with a message saying so (the panic itself never crosses).
pub(crate) fn boundary(function: &str, f: impl FnOnce() -> Res<()>) -> rkv_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            clear_last_error();
            rkv_status::RKV_OK
        }
        Ok(Err(e)) => {
            set_last_error(function, &e.msg);
            e.status
        }
        Err(payload) => {
            // Formatting the payload cannot unwind past here: contain a second panic too.
            let msg = catch_unwind(AssertUnwindSafe(|| {
                format!(
                    "internal error: a panic inside radixkv (a bug, please report it): {}; \
                     the cache stays memory-safe, but its content may be partly changed",
                    panic_text(&*payload)
                )
            }));
            let msg = msg.as_deref().unwrap_or("internal error: a panic inside radixkv");
            set_last_error(function, msg);
            rkv_status::RKV_INTERNAL_ERROR
        }
    }
}

impl From<&Error> for rkv_status {
    /// The core's status of `e` ([`Error::status`], the one mapping every front shares).
    fn from(e: &Error) -> Self {
        rkv_status::from_code(e.status()).unwrap_or(rkv_status::RKV_INTERNAL_ERROR)
    }
}

/// A core error as a [`Fail`]: its status and its own message.
pub(crate) fn st(e: Error) -> Fail {
    fail(rkv_status::from(&e), e.to_string())
}

/// The message of a cache without a pool refusing a pool call.
pub(crate) fn no_pool() -> Fail {
    fail(
        rkv_status::RKV_NO_POOL,
        "this cache has no slot pool (it was created with pool_slots = 0: the caller \
         manages slots)",
    )
}

// ---------------------------------------------------------------------------------------
// Version and status.

static VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(s) => s,
        Err(_) => panic!("version string"),
    };

/// The crate version ("0.1.0"), a static NUL-terminated string the caller must not free.
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_version() -> *const c_char {
    VERSION.as_ptr()
}

/// The ABI version: 1 (same as `RKV_ABI_VERSION`). Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_abi_version() -> u32 {
    RKV_ABI_VERSION
}

/// A static NUL-terminated description of `status` ("RKV_OK: success", ...), never NULL;
/// a value outside the enum gives "unknown status". The caller must not free it.
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_status_str(status: rkv_status_value) -> *const c_char {
    status::describe(status).as_ptr()
}

/// This thread's message for the last call that failed: exactly what was wrong, naming
/// the function, the argument and the values, for example
/// `rkv_insert: slots[3] = 70000 is out of range: the pool has 65536 slots (ids 0 to 65535)`.
/// An extension of ABI version 1 (see docs/errors.md).
///
/// - Every function that returns an `rkv_status` sets it when it returns anything but
///   `RKV_OK` (also `RKV_BUFFER_TOO_SMALL`, and `RKV_INTERNAL_ERROR` for a caught panic),
///   and clears it (to "") when it returns `RKV_OK`: the message always describes the
///   last status-returning call on this thread. Functions that return no status
///   (`rkv_version`, `rkv_abi_version`, `rkv_status_str`, `rkv_options_default`,
///   `rkv_cache_free`, this one) leave it as it is.
/// - Per thread: a call on one thread never changes another thread's message, so read it
///   on the thread that made the failing call.
/// - Never NULL: "" when the last call succeeded or none has run on this thread.
/// - Owned by the library: do not free it. Valid until the next call of a status-returning
///   `rkv_*` function on this thread, or the thread's exit; copy it to keep it.
/// - Meant for people (logs, exceptions): the wording may change between versions; branch
///   on the `rkv_status`, not on the text.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_last_error_message() -> *const c_char {
    let none = c"".as_ptr();
    if !HAS_ERROR.get() {
        return none;
    }
    LAST_ERROR
        .try_with(|b| match b.try_borrow() {
            Ok(b) if !b.is_empty() => b.as_ptr().cast::<c_char>(),
            _ => none,
        })
        .unwrap_or(none)
}
