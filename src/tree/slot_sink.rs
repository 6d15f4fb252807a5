//! Where a match writes the slots of the edges it passes: one slot per token (`Vec<u32>`)
//! or runs of consecutive slots (`Vec<SlotRun>`, O(runs) to write instead of O(tokens)).

use super::node::Node;
use crate::slot_run::SlotRun;

/// A match's output: cleared when a descent starts over, then given each matched edge's
/// leading tokens in order.
pub(crate) trait SlotSink {
    /// Forgets what earlier (abandoned) descents wrote.
    fn clear(&mut self);
    /// Appends the slots of `node`'s first `k` tokens.
    fn take(&mut self, node: &Node, k: usize);
}

impl SlotSink for Vec<u32> {
    fn clear(&mut self) {
        Vec::clear(self);
    }
    #[inline]
    fn take(&mut self, node: &Node, k: usize) {
        node.extend_slots(self, 0, k);
    }
}

impl SlotSink for Vec<SlotRun> {
    fn clear(&mut self) {
        Vec::clear(self);
    }
    #[inline]
    fn take(&mut self, node: &Node, k: usize) {
        node.push_runs(self, k);
    }
}
