//! The built-in KV slot pool.
