//! The error type shared by every interface.

use std::fmt;

/// What went wrong. Every error leaves the cache unchanged.
///
/// Each variant maps to one `rkv_status` code of the C ABI (see `C_ABI.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A bad argument: page size 0, length mismatch, a slot outside the pool, an
    /// unaligned allocation, a slot the tree caches at another position, ...
    InvalidArgument(String),
    /// An unknown, already released, or another cache's lock.
    InvalidLock,
    /// The pool is short even after evicting everything evictable.
    OutOfSlots {
        /// Slots asked for.
        requested: usize,
        /// Slots that could be had (free plus evictable).
        available: usize,
    },
    /// A pool call on a cache without a pool.
    NoPool,
    /// Freeing a slot that is already free or that the tree holds.
    DoubleFree {
        /// The first offending slot.
        slot: u32,
    },
    /// KV storage or CUDA failure.
    Device(String),
    /// The environment refused what a valid request needed: an address already in use, a
    /// socket, runtime or thread that could not be had (the KV-event publisher). A bad
    /// endpoint or option is [`Error::InvalidArgument`] instead.
    Io(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::InvalidLock => {
                write!(f, "invalid lock: unknown, already released, or another cache's")
            }
            Error::OutOfSlots { requested, available } => {
                write!(f, "out of slots: {requested} requested, {available} free or evictable")
            }
            Error::NoPool => write!(f, "this cache has no slot pool (pool_slots == 0)"),
            Error::DoubleFree { slot } => {
                write!(f, "slot {slot} is already free or held by the tree")
            }
            Error::Device(m) => write!(f, "device error: {m}"),
            Error::Io(m) => write!(f, "I/O error: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Shorthand for an [`Error::InvalidArgument`].
pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}
