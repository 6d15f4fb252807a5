//! The core library's integration tests, one binary with a module per concern (so the
//! library is linked once, not once per file). Separate binaries only where a test needs
//! a process of its own: `tests/index_memory.rs` and `tests/tree_memory.rs` (a counting
//! global allocator, which every other test's allocations would disturb), `tests/loom.rs`
//! (built with `--cfg loom`), `tests/kv_cuda.rs` and `tests/tier_cuda.rs` (the `cuda`
//! feature). Helpers shared with those binaries live in `tests/support/`.

#[path = "../support/replay.rs"]
mod replay;
#[path = "../support/rng.rs"]
mod rng;

mod cache_alloc_race;
mod cache_host;
mod cache_stress;
mod events_sink;
mod events_stress;
mod events_tree;
mod kv_host;
mod ns_stress;
mod pool_stress;
mod tier;
mod tier_audit;
mod tier_model;
mod tier_runs;
mod tier_stress;
mod tree_exact;
mod tree_model;
mod tree_stress;
mod tree_swa;
