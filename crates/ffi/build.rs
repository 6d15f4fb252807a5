//! Build script: gives the shared library (cdylib) its SONAME on Linux, so that programs
//! linked against `libradixkv.so` record `libradixkv.so.1` (ABI version 1, see C_ABI.md)
//! and keep working with any later `libradixkv.so.1.x.y`. Other targets are left as they are.

/// The C ABI version; the SONAME's number. Bump it with `RKV_ABI_VERSION` in `src/lib.rs`.
const ABI_VERSION: u32 = 1;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" || os == "android" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libradixkv.so.{ABI_VERSION}");
    }
}
