//! The router index's tests, one binary: the literal reference and the property test
//! against it, a concurrent stress test, bad input, and unit cases.

mod bad_input;
mod basic;
mod prop;
pub mod reference;
mod stress;
