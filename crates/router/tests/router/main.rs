//! The router index's tests, one binary: the literal reference and the property test
//! against it, a concurrent stress test, bad input, allocation-free finds, and unit
//! cases. Not under loom (`tests/loom.rs` is).
#![cfg(not(loom))]

mod alloc_free;
mod bad_input;
mod basic;
mod prop;
pub mod reference;
mod stress;
