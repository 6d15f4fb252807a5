//! Replays a drained KV-event stream into the page set a consumer would hold (a set, as
//! Dynamo's index is), checking as it goes that no event names a page the consumer does not
//! hold and that no page is stored while it is held (a re-store must follow the removal:
//! pushed the other way round, a set consumer would drop a page the cache holds).

use std::collections::HashSet;

use radixkv::events::{EventBatch, KvEvent};

/// Applies `batches` (checked to be numbered 0, 1, 2, ... without gaps) and returns the
/// held pages' hashes, sorted. Panics on a store whose parent is not held, on a store of a
/// page held already, on a removal of a page not held, and on a gap.
pub fn replay(batches: &[(u64, EventBatch)]) -> Vec<u64> {
    let mut held: HashSet<u64> = HashSet::new();
    for (i, (seq, b)) in batches.iter().enumerate() {
        assert_eq!(*seq, i as u64, "batches are numbered without gaps");
        for ev in &b.events {
            match ev {
                KvEvent::BlockStored { block_hashes, parent_block_hash, .. } => {
                    if let Some(p) = parent_block_hash {
                        assert!(held.contains(p), "a store under parent {p} not held");
                    }
                    for h in block_hashes {
                        assert!(held.insert(*h), "page {h} stored while held");
                    }
                }
                KvEvent::BlockRemoved { block_hashes, .. } => {
                    for h in block_hashes {
                        assert!(held.remove(h), "removal of {h}, not held");
                    }
                }
                KvEvent::AllBlocksCleared => held.clear(),
            }
        }
    }
    let mut out: Vec<u64> = held.into_iter().collect();
    out.sort_unstable();
    out
}
