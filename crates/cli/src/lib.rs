//! The `radixkv` command line (see `docs/contract/CLI.md` and `docs/cli.md`): `radixkv replay` and
//! `radixkv sweep`, over the core library's [`radixkv::Cache`].
//!
//! A library as well as the binary only so the CLI's tests and benches reach its scheduler
//! ([`sched`]); the binary's `main` is [`main`].
#![deny(unsafe_op_in_unsafe_fn, missing_docs, clippy::undocumented_unsafe_blocks)]

mod cli;
pub mod sched;

pub use cli::main;
