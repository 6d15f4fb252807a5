//! The `radixkv` command's tests, one binary with a module per command (the binary is
//! run as a child process through `CARGO_BIN_EXE_radixkv`): `replay`, `sweep`, the host
//! tier's replay, KV events and the indexer service; `common` holds the shared helpers.

mod common;
mod events;
mod indexer;
mod replay;
#[path = "../../../../tests/support/replay.rs"]
mod stream;
mod sweep;
mod tier;
