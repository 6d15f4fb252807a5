//! The `radixkv` command line (see `CLI.md`): `radixkv replay` and `radixkv sweep`.

// Not in loom builds (`--cfg loom`, for the models in tests/loom.rs): the CLI publishes KV
// events through the ZMQ publisher, which loom builds leave out; cargo still builds the
// binary for the integration tests, so there it is a stub.
#[cfg(not(loom))]
mod cli;

#[cfg(not(loom))]
fn main() {
    std::process::exit(cli::main());
}

#[cfg(loom)]
fn main() {
    eprintln!("radixkv: this is a loom build (--cfg loom), which has no command line");
    std::process::exit(2);
}
