//! `radixkv._radixkv.Prefix`: the matched prefix an SGLang backend node keeps.

use std::sync::Mutex;

use pyo3::prelude::*;
use radixkv::SlotRun;

/// A matched prefix the SGLang backend's node keeps (`prefix_match`, `span_checkpoint`):
/// its namespace, its tokens as `u32` (the request's key converted once), and the slots of
/// its latest match or lock (None: not known, matched again when asked for).
#[pyclass(frozen, module = "radixkv._radixkv")]
pub struct Prefix {
    pub(crate) ns: u64,
    pub(crate) toks: Vec<u32>,
    pub(crate) slots: Mutex<Option<Vec<SlotRun>>>,
}

#[pymethods]
impl Prefix {
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
