//! Where a match writes the slots of the edges it passes: one slot per token (`Vec<u32>`)
//! or runs of consecutive slots (`Vec<SlotRun>`, O(runs) to write instead of O(tokens)).

// The trait is public so other crates can name it and pass the sinks below, and sealed in
// effect: its methods take the tree's crate-private `Node`, so only this crate implements it.
#![allow(private_interfaces)]

use crate::slot_run::SlotRun;
use crate::tree::node::Node;

/// A match's output: cleared when a descent starts over, then given each matched edge's
/// leading tokens in order.
pub trait SlotSink {
    /// Forgets what earlier (abandoned) descents wrote.
    fn clear(&mut self);
    /// Appends the slots of `node`'s first `k` tokens.
    fn take(&mut self, node: &Node, k: usize);
    /// Where the output stands now, for [`SlotSink::rewind`].
    fn mark(&self) -> Mark;
    /// Forgets what was written since `mark` was taken.
    fn rewind(&mut self, mark: Mark);
}

/// A point in a sink's output: its length, and the length of its last run (a `take` may
/// extend the last run instead of pushing a new one).
#[derive(Clone, Copy, Debug)]
pub struct Mark {
    len: usize,
    last: u32,
}

/// A caller's buffer of `cap` slots (the C ABI's `out_slots`), written in place.
pub struct OutBuf {
    ptr: *mut u32,
    cap: usize,
    len: usize,
}

impl OutBuf {
    /// # Safety
    /// `ptr[0..cap]` is writable, aligned, and nothing else reads or writes it while the
    /// `OutBuf` lives.
    pub unsafe fn new(ptr: *mut u32, cap: usize) -> OutBuf {
        OutBuf { ptr, cap, len: 0 }
    }
    /// Slots the match wrote (or would have written, past `cap`).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the match wrote nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The next `n` slots of the buffer (None past its end: then only the length grows).
    #[inline]
    pub(super) fn next(&mut self, n: usize) -> Option<&mut [u32]> {
        let at = self.len;
        self.len += n;
        if self.len > self.cap {
            return None;
        }
        // SAFETY: `at + n <= cap`, in the caller's writable buffer (`new`'s contract).
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), n) })
    }
}

impl SlotSink for OutBuf {
    fn clear(&mut self) {
        self.len = 0;
    }
    #[inline]
    fn take(&mut self, node: &Node, k: usize) {
        node.edge.extend_slots(self, 0, k);
    }
    fn mark(&self) -> Mark {
        Mark { len: self.len, last: 0 }
    }
    fn rewind(&mut self, mark: Mark) {
        self.len = mark.len;
    }
}

impl SlotSink for Vec<u32> {
    fn clear(&mut self) {
        Vec::clear(self);
    }
    #[inline]
    fn take(&mut self, node: &Node, k: usize) {
        node.edge.extend_slots(self, 0, k);
    }
    fn mark(&self) -> Mark {
        Mark { len: self.len(), last: 0 }
    }
    fn rewind(&mut self, mark: Mark) {
        self.truncate(mark.len);
    }
}

impl SlotSink for Vec<SlotRun> {
    fn clear(&mut self) {
        Vec::clear(self);
    }
    #[inline]
    fn take(&mut self, node: &Node, k: usize) {
        node.edge.push_runs(self, k);
    }
    fn mark(&self) -> Mark {
        Mark { len: self.len(), last: self.last().map_or(0, |r| r.len) }
    }
    fn rewind(&mut self, mark: Mark) {
        self.truncate(mark.len);
        if let Some(r) = self.last_mut() {
            r.len = mark.last;
        }
    }
}
