//! Placeholder; the tree benches land with the tree.
fn main() {}
