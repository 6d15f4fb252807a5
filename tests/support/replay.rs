//! Replays a drained KV-event stream into the page set a consumer would hold (a set, as
//! Dynamo's index is), checking as it goes that no event names a page the consumer does not
//! hold, that no page is stored while it is held (a re-store must follow the removal:
//! pushed the other way round, a set consumer would drop a page the cache holds), and that
//! no page is removed while a page stored under it is still held (a child's removal comes
//! before its parent's: `docs/contract/KV_EVENTS.md`, "its `BlockRemoved` after any event naming a page
//! below it").

use std::collections::{HashMap, HashSet};

use radixkv::events::{EventBatch, KvEvent};

/// Applies `batches` (checked to be numbered 0, 1, 2, ... without gaps) and returns the
/// held pages' hashes, sorted. Panics on a store whose parent is not held, on a store of a
/// page held already, on a removal of a page not held, on a removal that leaves a page
/// held whose parent it removed (checked after each whole removal event, which may list a
/// leaf's pages parent first), and on a gap.
pub fn replay(batches: &[(u64, EventBatch)]) -> Vec<u64> {
    let mut held: HashSet<u64> = HashSet::new();
    // Each held page's parent (`None` for a namespace's first page) and each page's number
    // of held children.
    let mut parent_of: HashMap<u64, Option<u64>> = HashMap::new();
    let mut children: HashMap<u64, usize> = HashMap::new();
    for (i, (seq, b)) in batches.iter().enumerate() {
        assert_eq!(*seq, i as u64, "batches are numbered without gaps");
        for ev in &b.events {
            match ev {
                KvEvent::BlockStored { block_hashes, parent_block_hash, .. } => {
                    if let Some(p) = parent_block_hash {
                        assert!(held.contains(p), "a store under parent {p} not held");
                    }
                    let mut parent = *parent_block_hash;
                    for h in block_hashes {
                        assert!(held.insert(*h), "page {h} stored while held");
                        parent_of.insert(*h, parent);
                        if let Some(p) = parent {
                            *children.entry(p).or_default() += 1;
                        }
                        parent = Some(*h);
                    }
                }
                KvEvent::BlockRemoved { block_hashes, .. } => {
                    for h in block_hashes {
                        assert!(held.remove(h), "removal of {h}, not held");
                        if let Some(Some(p)) = parent_of.remove(h) {
                            *children.get_mut(&p).expect("a held page's parent counts it") -= 1;
                        }
                    }
                    for h in block_hashes {
                        let left = children.remove(h).unwrap_or(0);
                        assert_eq!(
                            left, 0,
                            "removal of {h} while {left} page(s) under it are held"
                        );
                    }
                }
                KvEvent::AllBlocksCleared => {
                    held.clear();
                    parent_of.clear();
                    children.clear();
                }
            }
        }
    }
    let mut out: Vec<u64> = held.into_iter().collect();
    out.sort_unstable();
    out
}
