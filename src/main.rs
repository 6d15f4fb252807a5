//! The `radixkv` command line (see `CLI.md`): `radixkv replay` and `radixkv sweep`.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
