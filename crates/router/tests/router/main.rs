//! The router index's tests, one binary: the literal reference and the property test
//! against it, a concurrent stress test, bad input, allocation-free finds, unit cases, and
//! the differential test against kv-index's and Dynamo's indexes. Not under loom (`tests/loom.rs` is).
#![cfg(not(loom))]

mod alloc_free;
mod bad_input;
mod basic;
mod groups;
mod peers;
mod prop;
pub mod reference;
mod stress;
