//! `radixkv._radixkv.Prefix`: the matched prefix an SGLang backend node keeps.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use radixkv::SlotRun;

/// A matched prefix the SGLang backend's node keeps (`prefix_match`, `span_checkpoint`):
/// its namespace, the request's key as `u32` in a shared buffer (the whole token array
/// from the span's start, converted once per request: the node's prefix is its first
/// tokens, the request's checkpoint takes the rest instead of converting the key again, and
/// the locks of it keep a reference to the buffer, not a copy), and the slots of its latest
/// match or lock (None: not known, matched again when asked for).
#[pyclass(frozen, module = "radixkv._radixkv")]
pub struct Prefix {
    pub(crate) ns: u64,
    pub(crate) toks: Arc<[u32]>,
    pub(crate) slots: Mutex<Option<Vec<SlotRun>>>,
}

impl Prefix {
    pub(crate) fn new(ns: u64, toks: Arc<[u32]>, slots: Option<Vec<SlotRun>>) -> Self {
        Prefix { ns, toks, slots: Mutex::new(slots) }
    }
}

#[pymethods]
impl Prefix {
    /// The tokens it keeps (the node's prefix and the rest of the key it was matched for).
    fn __len__(&self) -> usize {
        self.toks.len()
    }
}

/// The slots of positions `from..to` of `runs` (clamped), as runs.
pub(crate) fn runs_cut(runs: &[SlotRun], from: usize, to: usize) -> Vec<SlotRun> {
    let mut out = Vec::new();
    let mut at = 0usize;
    for r in runs {
        let (lo, hi) = (at, at + r.len as usize);
        at = hi;
        let (a, b) = (lo.max(from), hi.min(to));
        if a < b {
            out.push(SlotRun { start: r.start + (a - lo) as u32, len: (b - a) as u32 });
        }
        if at >= to {
            break;
        }
    }
    out
}
