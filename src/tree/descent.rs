//! Descent: the shared step every walker takes from a node to the child that holds the
//! next page, and the lock-free match built on it.

use super::*;

impl RadixTree {
    /// The node that replaced `n`'s beginning, following `forward` while `REPLACED`.
    #[inline]
    pub(super) fn resolve<'g>(&self, mut n: &'g Node, g: &'g Guard) -> &'g Node {
        while n.state.load(Ordering::SeqCst) & REPLACED != 0 {
            let f = n.forward.load(Ordering::SeqCst);
            // SAFETY: `forward` is stored before REPLACED is set, and U is retired no
            // earlier than A (its own split or eviction comes after A's retirement), so
            // U is valid for any guard under which A is.
            n = unsafe { node_ref(f, g) }.expect("REPLACED implies forward");
        }
        n
    }

    /// For a node this thread has pinned (so its pages stay cached): the current node that
    /// ends where `n` ends (after splits of `n`, the last of its replacements).
    pub(super) fn last_of<'g>(&self, n: &'g Node, g: &'g Guard) -> &'g Node {
        if n.state.load(Ordering::SeqCst) & REPLACED == 0 {
            return n;
        }
        let key = n.key();
        let p = self.cfg.page_size;
        let mut x = self.resolve(n, g);
        let mut off = x.len();
        while off < key.len() {
            let c = x.child(&key[off..off + p], g).expect("pinned pages stay cached");
            x = self.resolve(c, g);
            off += x.len();
        }
        debug_assert_eq!(off, key.len());
        x
    }

    /// Whether the first `k` tokens of `n` (measured from `n`'s start) are still cached.
    pub(super) fn is_live(&self, n: &Node, k: usize, g: &Guard) -> bool {
        let p = self.cfg.page_size;
        let key = &n.key()[..k];
        let mut off = 0;
        let mut x = n;
        loop {
            x = self.resolve(x, g);
            if x.state.load(Ordering::SeqCst) & DEAD != 0 {
                return false;
            }
            off += x.len();
            if off >= key.len() {
                return true;
            }
            match x.child(&key[off..off + p], g) {
                Some(c) => x = c,
                None => return false,
            }
        }
    }

    /// Longest cached prefix of `tokens` (cut to a page multiple) in namespace `ns`: clears
    /// `out`, writes the matched slots, returns the match length (a multiple of the page
    /// size). Lock-free; changes no structure; refreshes access stamps.
    ///
    /// In a concurrent cache this is an estimate: the prefix may be evicted the moment it
    /// returns. Admit requests with [`RadixTree::match_and_lock`].
    pub fn match_prefix(&self, ns: u64, tokens: &[u32], out: &mut Vec<u32>) -> usize {
        self.match_into(ns, tokens, out)
    }

    /// [`RadixTree::match_prefix`] writing the matched slots to `out` (cleared first) as
    /// runs of consecutive slots ([`SlotRun`], in token order; neighbours that continue one
    /// another are joined): O(runs) to write instead of O(tokens) when slots come in runs,
    /// as a pool hands them out. The runs' lengths add up to the match length returned.
    pub fn match_prefix_runs(&self, ns: u64, tokens: &[u32], out: &mut Vec<SlotRun>) -> usize {
        self.match_into(ns, tokens, out)
    }

    pub(super) fn match_into<S: SlotSink>(&self, ns: u64, tokens: &[u32], out: &mut S) -> usize {
        let m = self.match_unrecorded(ns, tokens, out);
        self.matches.record(tokens.len(), m);
        m
    }

    /// A match that the statistics do not count (the C ABI's size check before a locking
    /// match, which counts itself): otherwise [`RadixTree::match_prefix`] /
    /// [`RadixTree::match_prefix_runs`], access stamps included.
    pub(crate) fn match_unrecorded<S: SlotSink>(
        &self,
        ns: u64,
        tokens: &[u32],
        out: &mut S,
    ) -> usize {
        out.clear();
        let n = self.aligned(tokens.len());
        let g = self.domain.pin();
        match self.root(ns, &g) {
            None => 0,
            Some(root) => loop {
                if let Some(m) = self.try_match(root, &tokens[..n], out, &g) {
                    break m;
                }
                out.clear();
            },
        }
    }

    /// One optimistic descent; `None` if a racing split or eviction invalidated it.
    pub(super) fn try_match<S: SlotSink>(
        &self,
        root: &Node,
        key: &[u32],
        out: &mut S,
        g: &Guard,
    ) -> Option<usize> {
        let p = self.cfg.page_size;
        let now = self.now();
        let mut cur = root;
        let mut pos = 0;
        let mut last: Option<(&Node, usize)> = None;
        while pos < key.len() {
            if cur.state.load(Ordering::SeqCst) & REPLACED != 0 {
                return None; // cur's table is frozen: start over on the current tree
            }
            let Some(c) = cur.child_candidate(&key[pos..pos + p], g) else {
                break;
            };
            let c = self.resolve(c, g);
            if c.state.load(Ordering::SeqCst) & DEAD != 0 {
                break; // being evicted: absent
            }
            let k = common_prefix(c.key(), &key[pos..]) / p * p;
            if k == 0 {
                break; // the candidate differs within the first page: no child matches
            }
            out.take(c, k);
            self.touch(c, now);
            pos += k;
            last = Some((c, k));
            if k < c.len() {
                break;
            }
            cur = c;
        }
        match last {
            Some((n, k)) if !self.is_live(n, k, g) => None,
            _ => Some(pos),
        }
    }
}
