//! The command line (binary only).
