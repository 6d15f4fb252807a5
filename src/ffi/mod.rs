//! The C ABI (`include/radixkv.h`).
