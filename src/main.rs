//! The `radixkv` command line (see `CLI.md`).
fn main() {
    eprintln!("radixkv: the CLI is not built yet");
    std::process::exit(2);
}
