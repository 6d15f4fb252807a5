//! The `radixkv` command line (see `docs/contract/CLI.md`): `radixkv replay` and `radixkv sweep`.

fn main() {
    std::process::exit(radixkv_cli::main());
}
