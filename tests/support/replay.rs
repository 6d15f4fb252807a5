//! Replays a drained KV-event stream into the page multiset a consumer would hold,
//! checking as it goes that no event names a page the consumer does not hold.

use std::collections::HashMap;

use radixkv::events::{EventBatch, KvEvent};

/// Applies `batches` (checked to be numbered 0, 1, 2, ... without gaps) and returns the
/// held pages' hashes, sorted. Panics on a store whose parent is not held, on a removal of
/// a page not held, and on a gap.
pub fn replay(batches: &[(u64, EventBatch)]) -> Vec<u64> {
    let mut held: HashMap<u64, u32> = HashMap::new();
    for (i, (seq, b)) in batches.iter().enumerate() {
        assert_eq!(*seq, i as u64, "batches are numbered without gaps");
        for ev in &b.events {
            match ev {
                KvEvent::BlockStored { block_hashes, parent_block_hash, .. } => {
                    if let Some(p) = parent_block_hash {
                        assert!(held.contains_key(p), "a store under parent {p} not held");
                    }
                    for h in block_hashes {
                        *held.entry(*h).or_default() += 1;
                    }
                }
                KvEvent::BlockRemoved { block_hashes, .. } => {
                    for h in block_hashes {
                        let c =
                            held.get_mut(h).unwrap_or_else(|| panic!("removal of {h}, not held"));
                        *c -= 1;
                        if *c == 0 {
                            held.remove(h);
                        }
                    }
                }
                KvEvent::AllBlocksCleared => held.clear(),
            }
        }
    }
    let mut out: Vec<u64> =
        held.into_iter().flat_map(|(h, c)| std::iter::repeat_n(h, c as usize)).collect();
    out.sort_unstable();
    out
}
