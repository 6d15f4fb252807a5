//! The C ABI (`include/radixkv.h`, contract in `C_ABI.md`, version 1).
//!
//! Every function here is a literal `#[unsafe(no_mangle)] extern "C"` item so cbindgen sees
//! it, and every body runs inside a panic boundary: a Rust panic comes out as
//! `RKV_INTERNAL_ERROR`, never as an unwind across the boundary. Outputs are written only on
//! `RKV_OK` (and `*out_len` on `RKV_BUFFER_TOO_SMALL`); every pointer is checked.
//!
//! Every error also leaves a message for the calling thread, `rkv_last_error_message()`
//! (see `docs/errors.md`): `boundary` records it from the `Fail` a check returns, and
//! each check builds its message where it refuses, naming the argument and the values.
//!
//! Lock handles (`rkv_lock`) are `u64` values looked up in a per-cache sharded slab (see
//! `handles.rs`), so an unknown, released or foreign handle is `RKV_INVALID_LOCK`, never
//! undefined behavior.
//!
//! After a panic (a bug) the cache stays memory-safe and every call keeps its contract on
//! pointers and handles; whether the tree's content is still exactly the model's is not
//! promised (a panic in the middle of a tree operation may leave it partly done).
#![deny(unsafe_op_in_unsafe_fn, missing_docs, clippy::undocumented_unsafe_blocks)]
#![allow(non_camel_case_types)]

// The modules, by noun. cbindgen reads them from these declarations, in this order.
mod args;
mod boundary;
mod refusal;
mod types;
pub use types::*;
mod cache;
pub use cache::*;
mod lookup;
pub use lookup::*;
mod insert;
pub use insert::*;
mod pool;
pub use pool::*;
mod swa;
pub use swa::*;
mod namespaces;
pub use namespaces::*;
mod request;
pub use request::*;
mod events;
pub use events::*;
mod handles;
mod hybrid;
pub use hybrid::*;
mod router;
mod tier;
pub use boundary::{rkv_abi_version, rkv_last_error_message, rkv_status_str, rkv_version};
pub use router::*;
pub use tier::*;

#[cfg(test)]
mod error_tests;
#[cfg(test)]
mod host_tests;
#[cfg(test)]
mod request_tests;
#[cfg(test)]
mod swa_tests;
#[cfg(test)]
mod tests;

// The helpers every noun shares, reachable from each module as `crate::name` (and from
// `events`, `tier` and the tests through `super::`).
use args::*;
use boundary::*;
use refusal::*;
