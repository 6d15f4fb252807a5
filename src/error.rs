//! The error type shared by every interface, and the status codes every front reports.

use std::fmt;

use crate::pool::SlotState;

/// What went wrong. Every error leaves the cache unchanged.
///
/// Each variant maps to one `rkv_status` code of the C ABI (see `docs/contract/C_ABI.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A bad argument: page size 0, length mismatch, an unaligned allocation, ... (a bad
    /// slot is [`Error::Slot`]).
    InvalidArgument(String),
    /// A slot given to the pool (or to the cache, which hands it to the pool) that it
    /// refuses: which slot and what is wrong with it. Status `INVALID_ARGUMENT`; its message
    /// is `invalid argument: slot N ` and [`SlotProblem`]'s text. (A slot freed that is not
    /// held is [`Error::DoubleFree`] instead.)
    Slot {
        /// The first offending slot.
        slot: u32,
        /// What is wrong with it.
        problem: SlotProblem,
    },
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
    /// A host tier call (load-back, host eviction) on a cache built without host options
    /// ([`crate::Cache::with_host`]). Status `INVALID_ARGUMENT`.
    NoTier,
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
    /// A node id the hybrid tree ([`crate::hybrid::HybridTree`]) does not hold: evicted, or
    /// never made. Status `INVALID_ARGUMENT`.
    NoNode {
        /// The id asked for.
        node: u64,
    },
    /// A step of a hybrid tree's eviction walk with no walk of that component started
    /// ([`crate::hybrid::HybridTree::evict_next`] before `evict_start`). Status
    /// `INVALID_ARGUMENT`.
    NoWalk {
        /// The walk: `"FULL"`, `"SWA"` or `"Mamba"`.
        walk: &'static str,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::Slot { slot, problem } => write!(f, "invalid argument: slot {slot} {problem}"),
            Error::InvalidLock => {
                write!(f, "invalid lock: unknown, already released, or another cache's")
            }
            Error::OutOfSlots { requested, available } => {
                write!(f, "out of slots: {requested} requested, {available} free or evictable")
            }
            Error::NoPool => write!(f, "this cache has no slot pool (pool_slots == 0)"),
            Error::NoTier => write!(f, "this cache has no host tier (built without host options)"),
            Error::DoubleFree { slot } => {
                write!(f, "slot {slot} is already free or held by the tree")
            }
            Error::Device(m) => write!(f, "device error: {m}"),
            Error::Io(m) => write!(f, "I/O error: {m}"),
            Error::NoNode { node } => {
                write!(f, "node id {node} is not in this tree core (evicted, or never made)")
            }
            Error::NoWalk { walk } => match *walk {
                "FULL" => write!(f, "evict_device_next_node: no eviction walk started"),
                "Mamba" => write!(f, "evict_device_next_node(MAMBA): no Mamba walk started"),
                w => write!(f, "evict_device_next_node({w}): no {w} walk started"),
            },
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// The status code of this error ([`status`]): what the C ABI returns and what Python's
    /// exceptions carry as `.status`. Every front maps errors through this one function.
    pub fn status(&self) -> i32 {
        match self {
            Error::InvalidArgument(_)
            | Error::Slot { .. }
            | Error::NoTier
            | Error::NoNode { .. }
            | Error::NoWalk { .. } => status::INVALID_ARGUMENT,
            Error::InvalidLock => status::INVALID_LOCK,
            Error::OutOfSlots { .. } => status::OUT_OF_SLOTS,
            Error::NoPool => status::NO_POOL,
            Error::DoubleFree { .. } => status::DOUBLE_FREE,
            Error::Device(_) => status::DEVICE_ERROR,
            Error::Io(_) => status::IO_ERROR,
        }
    }

    /// The slot a slot refusal names ([`Error::Slot`] or [`Error::DoubleFree`]), with its
    /// problem when the pool said which ([`Error::Slot`]).
    pub fn slot(&self) -> Option<(u32, Option<SlotProblem>)> {
        match self {
            Error::Slot { slot, problem } => Some((*slot, Some(*problem))),
            Error::DoubleFree { slot } => Some((*slot, None)),
            _ => None,
        }
    }
}

/// What is wrong with a slot the pool refuses ([`Error::Slot`]). Its `Display` is the end
/// of the message: `slot 7 ` followed by `is outside the pool of 16 slots`, `is listed
/// twice`, or `is free, not held`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotProblem {
    /// Not a slot of the pool: its ids are `0..capacity`.
    OutsidePool {
        /// The pool's size.
        capacity: usize,
    },
    /// Given more than once in one call (in one list, or in two lists of one insert).
    ListedTwice,
    /// In state `found`, not in the state `wanted` the call needs: a free slot, or one the
    /// tree caches (at another position), given as a held one; or a slot to release from
    /// the tree that it does not cache.
    State {
        /// The state the slot is in.
        found: SlotState,
        /// The state the call needs it in.
        wanted: SlotState,
    },
}

impl fmt::Display for SlotProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlotProblem::OutsidePool { capacity } => {
                write!(f, "is outside the pool of {capacity} slots")
            }
            SlotProblem::ListedTwice => write!(f, "is listed twice"),
            SlotProblem::State { found, wanted } => {
                let found = match found {
                    SlotState::Free => "free",
                    SlotState::Held => "held by a caller",
                    SlotState::Cached => "cached by the tree",
                };
                let wanted = match wanted {
                    SlotState::Free => "free",
                    SlotState::Held => "held",
                    SlotState::Cached => "cached",
                };
                write!(f, "is {found}, not {wanted}")
            }
        }
    }
}

/// The status codes, defined once for every front: the C ABI's `rkv_status` (the C ABI
/// crate's enum, which cbindgen turns into the header's, is checked against these values
/// at compile time), Python's `radixkv.Status` (read from the extension's `STATUS_CODES`),
/// and C++ through the C header. [`Error::status`] maps an error to its code.
pub mod status {
    use std::ffi::CStr;

    /// Success.
    pub const OK: i32 = 0;
    /// A pointer that is required was NULL.
    pub const NULL_ARGUMENT: i32 = 1;
    /// A bad argument.
    pub const INVALID_ARGUMENT: i32 = 2;
    /// An unknown, already released, or another cache's lock.
    pub const INVALID_LOCK: i32 = 3;
    /// The output buffer is smaller than the result.
    pub const BUFFER_TOO_SMALL: i32 = 4;
    /// The pool is short even after evicting everything evictable.
    pub const OUT_OF_SLOTS: i32 = 5;
    /// A pool call on a cache without a pool.
    pub const NO_POOL: i32 = 6;
    /// A slot that is already free or held by the tree.
    pub const DOUBLE_FREE: i32 = 7;
    /// KV storage or device failure.
    pub const DEVICE_ERROR: i32 = 8;
    /// A bug (a caught panic) or an internal limit.
    pub const INTERNAL_ERROR: i32 = 9;
    /// The environment refused what a valid call needed.
    pub const IO_ERROR: i32 = 10;
    /// A batch's `seq` skips ahead of its worker's cursor under the refuse gap policy
    /// (the router index): nothing applied; replay from the cursor, then retry.
    pub const SEQUENCE_GAP: i32 = 11;
    /// What the call asks about is not there (the router index): an unknown worker, or one
    /// without a batch cursor yet.
    pub const NOT_FOUND: i32 = 12;

    /// One status code: its number, its name (without the C ABI's `RKV_` prefix) and its
    /// description (what `rkv_status_str` returns, NUL-terminated).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Code {
        /// The number.
        pub code: i32,
        /// The name, e.g. `"INVALID_ARGUMENT"` (C: `RKV_INVALID_ARGUMENT`).
        pub name: &'static str,
        /// The description, e.g. `"RKV_OK: success"`.
        pub text: &'static CStr,
    }

    /// Every status code, in number order (`ALL[i].code == i`).
    pub const ALL: [Code; 13] = [
        Code { code: OK, name: "OK", text: c"RKV_OK: success" },
        Code {
            code: NULL_ARGUMENT,
            name: "NULL_ARGUMENT",
            text: c"RKV_NULL_ARGUMENT: a required pointer is NULL",
        },
        Code {
            code: INVALID_ARGUMENT,
            name: "INVALID_ARGUMENT",
            text: c"RKV_INVALID_ARGUMENT: invalid argument",
        },
        Code {
            code: INVALID_LOCK,
            name: "INVALID_LOCK",
            text: c"RKV_INVALID_LOCK: unknown, already released, or another cache's lock",
        },
        Code {
            code: BUFFER_TOO_SMALL,
            name: "BUFFER_TOO_SMALL",
            text: c"RKV_BUFFER_TOO_SMALL: output buffer too small (required length in *out_len)",
        },
        Code {
            code: OUT_OF_SLOTS,
            name: "OUT_OF_SLOTS",
            text: c"RKV_OUT_OF_SLOTS: pool short even after evicting all that is evictable",
        },
        Code { code: NO_POOL, name: "NO_POOL", text: c"RKV_NO_POOL: this cache has no slot pool" },
        Code {
            code: DOUBLE_FREE,
            name: "DOUBLE_FREE",
            text: c"RKV_DOUBLE_FREE: slot already free or held by the tree",
        },
        Code {
            code: DEVICE_ERROR,
            name: "DEVICE_ERROR",
            text: c"RKV_DEVICE_ERROR: KV storage / device failure",
        },
        Code {
            code: INTERNAL_ERROR,
            name: "INTERNAL_ERROR",
            text: c"RKV_INTERNAL_ERROR: internal error (a bug in radixkv)",
        },
        Code {
            code: IO_ERROR,
            name: "IO_ERROR",
            text: c"RKV_IO_ERROR: the environment refused (an address in use, a socket or thread)",
        },
        Code {
            code: SEQUENCE_GAP,
            name: "SEQUENCE_GAP",
            text: c"RKV_SEQUENCE_GAP: the batch's seq skips ahead of the worker's cursor (nothing \
                    applied: replay from rkv_router_next_seq, then retry)",
        },
        Code {
            code: NOT_FOUND,
            name: "NOT_FOUND",
            text: c"RKV_NOT_FOUND: no such worker, or no batch cursor for it yet",
        },
    ];

    /// The status numbered `code`, if one is.
    pub fn get(code: i32) -> Option<&'static Code> {
        usize::try_from(code).ok().and_then(|i| ALL.get(i))
    }

    /// What `rkv_status_str` says about `code`: its description, or "unknown status".
    pub fn describe(code: i32) -> &'static CStr {
        get(code).map_or(c"unknown status", |c| c.text)
    }

    const _: () = {
        let mut i = 0;
        while i < ALL.len() {
            assert!(ALL[i].code == i as i32);
            i += 1;
        }
    };
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Shorthand for an [`Error::InvalidArgument`].
pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// What is wrong with the slot a refusal names, said for the caller who gave it: "`first`
/// is out of range: ...", "... is given twice (also ...)", "... is free, ...", "... is cached
/// by the tree, ...". `at` are the positions where the caller gave that slot, as the front
/// names them (at most two are read; the first starts the message); `alloc` is the front's
/// name for the allocation call. Read from the error's fields (`Error::Slot`'s problem, or
/// `Error::DoubleFree`'s slot and its state in `pool`), never from its text. `None` for an
/// error that names no slot, or a slot the caller did not give.
pub fn slot_refusal_message(
    e: &Error,
    at: &[String],
    pool: Option<&crate::pool::SlotPool>,
    alloc: &str,
) -> Option<String> {
    use crate::pool::SlotState;
    let (slot, problem) = e.slot()?;
    let first = at.first()?;
    let state = match problem {
        Some(SlotProblem::State { found, .. }) => Some(found),
        _ => pool.and_then(|p| p.state(slot)),
    };
    let outside = match problem {
        Some(SlotProblem::OutsidePool { capacity }) => Some(capacity),
        _ => pool.map(crate::pool::SlotPool::capacity).filter(|&c| slot as usize >= c),
    };
    let twice = problem == Some(SlotProblem::ListedTwice) || state == Some(SlotState::Held);
    let what = match outside {
        Some(c) => format!("is out of range: the pool has {c} slots (ids 0 to {})", c - 1),
        None if at.len() > 1 && twice => format!("is given twice (also {})", at[1]),
        None => match state {
            Some(SlotState::Free) => format!(
                "is free, not held by the caller (never allocated with {alloc}, or freed or \
                 evicted since)"
            ),
            Some(SlotState::Cached) => "is cached by the tree, not held by the caller (an \
                                        insert adopted it already; the tree owns it until it \
                                        is evicted)"
                .to_string(),
            _ => format!("is refused: {e}"),
        },
    };
    Some(format!("{first} {what}"))
}
