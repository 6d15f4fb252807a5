//! `radixkv._radixkv`: the native extension behind the `radixkv` Python package.
//!
//! It calls radixkv's Rust API directly (not the C ABI): [`cache::NativeCache`] wraps a
//! `radixkv::Cache` (its host tier's calls on [`tier::NativeTier`]),
//! [`publisher::NativePublisher`] a KV-event publisher,
//! [`router::NativeRouterIndex`] the router index (`radixkv_router::RouterIndex`). The Python layer
//! (`radixkv/_cache.py`) keeps the public API: namespaces, error classes, `Lock` objects,
//! dataclasses. Built by maturin as one abi3 wheel for CPython >= 3.9.

#![deny(unsafe_op_in_unsafe_fn, missing_docs, clippy::undocumented_unsafe_blocks)]

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyDict;

mod cache;
mod cache_new;
mod closable;
mod errors;
mod event_rows;
mod input;
mod locks;
mod prefix;
mod publisher;
mod requests;
mod router;
mod slots;
mod tier;
mod tree_core;

/// Registers the error classes (by status; -1 for a closed cache) and the `SlotBuffer`
/// class the native calls create.
#[pyfunction]
fn _register(
    py: Python<'_>,
    errors: Bound<'_, PyDict>,
    slot_buffer: Bound<'_, PyAny>,
) -> PyResult<()> {
    errors::register_classes(py, errors)?;
    cache::register_slot_buffer(py, slot_buffer)
}

/// This thread's message for its last failed call ("" after a successful one).
#[pyfunction]
fn last_error_message() -> String {
    errors::last_error_message()
}

/// The description of a status code (`rkv_status_str`).
#[pyfunction]
fn status_str(status: i32) -> &'static str {
    errors::status_str(status)
}

/// The library's version.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// How an argument is read: a `Borrow` with `n` and `ptr` (the address of the caller's memory
/// when a call would read it in place, or None when the values are copied or converted), for
/// tests. Every buffer, tensor and `__array_interface__` argument is copied while the GIL is
/// held (see `input::settle`), so `ptr` is None for them, and the copy, not the caller's
/// object, is what the `Borrow` keeps.
#[pyfunction]
fn borrow(obj: Bound<'_, PyAny>) -> PyResult<Borrow> {
    let input = input::to_input(&obj, "array")?;
    Ok(Borrow { n: input.len(), ptr: input.borrowed_address(), input: Mutex::new(Some(input)) })
}

/// An argument kept borrowed until `release()` or collection.
#[pyclass(module = "radixkv._radixkv")]
struct Borrow {
    #[pyo3(get)]
    n: usize,
    #[pyo3(get)]
    ptr: Option<usize>,
    input: Mutex<Option<input::Input>>,
}

#[pymethods]
impl Borrow {
    /// Ends the borrow now.
    fn release(&self) {
        self.input.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

#[pymodule]
fn _radixkv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<cache::NativeCache>()?;
    m.add_class::<cache::Prefix>()?;
    m.add_class::<publisher::NativePublisher>()?;
    m.add_class::<tier::NativeTier>()?;
    m.add_class::<requests::NativeRequests>()?;
    m.add_class::<router::NativeRouterIndex>()?;
    m.add_class::<tree_core::NativeTreeCore>()?;
    m.add_class::<Borrow>()?;
    m.add_function(wrap_pyfunction!(_register, m)?)?;
    m.add_function(wrap_pyfunction!(last_error_message, m)?)?;
    m.add_function(wrap_pyfunction!(status_str, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(borrow, m)?)?;
    m.add_function(wrap_pyfunction!(router::_register_router_errors, m)?)?;
    m.add_function(wrap_pyfunction!(router::router_content_hashes, m)?)?;
    m.add("SEQUENCE_GAP", router::SEQUENCE_GAP)?;
    // The status codes, `(name, code)` in number order: `radixkv.Status` is built from them.
    m.add("STATUS_CODES", errors::status_codes())?;
    Ok(())
}
