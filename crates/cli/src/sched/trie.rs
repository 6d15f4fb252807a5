//! A small compressed trie over the requests of one scheduling window.
//!
//! Edges borrow the requests' own token slices, so building it copies no token; a window of
//! `W` requests makes at most `2W` nodes per namespace.

use std::cmp::Reverse;

struct Node<'a> {
    edge: &'a [u32],
    children: Vec<usize>,
    /// Requests whose path goes through this node (its subtree's weight).
    count: usize,
    /// Longest cached prefix of a request in the subtree.
    best_cached: usize,
    /// Smallest arrival id in the subtree.
    first: usize,
    /// Items whose tokens end exactly here.
    here: Vec<(usize, usize)>,
}

impl Node<'_> {
    fn new(edge: &[u32]) -> Node<'_> {
        Node {
            edge,
            children: Vec::new(),
            count: 0,
            best_cached: 0,
            first: usize::MAX,
            here: Vec::new(),
        }
    }
    fn bump(&mut self, cached: usize, arrival: usize) {
        self.count += 1;
        self.best_cached = self.best_cached.max(cached);
        self.first = self.first.min(arrival);
    }
    /// Visit order among siblings: heaviest subtree first, then the longest cached prefix,
    /// then the earliest arrival.
    fn key(&self) -> (Reverse<usize>, Reverse<usize>, usize) {
        (Reverse(self.count), Reverse(self.best_cached), self.first)
    }
}

fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The trie of a window's requests, keyed by (namespace, tokens).
pub(crate) struct WindowTrie<'a> {
    nodes: Vec<Node<'a>>,
    /// One root per namespace.
    roots: Vec<(u64, usize)>,
}

impl<'a> WindowTrie<'a> {
    pub(crate) fn new() -> Self {
        WindowTrie { nodes: Vec::new(), roots: Vec::new() }
    }

    fn root(&mut self, ns: u64) -> usize {
        if let Some(&(_, r)) = self.roots.iter().find(|(n, _)| *n == ns) {
            return r;
        }
        self.nodes.push(Node::new(&[]));
        let r = self.nodes.len() - 1;
        self.roots.push((ns, r));
        r
    }

    fn child(&self, node: usize, first: u32) -> Option<(usize, usize)> {
        self.nodes[node]
            .children
            .iter()
            .enumerate()
            .find(|&(_, &c)| self.nodes[c].edge[0] == first)
            .map(|(i, &c)| (i, c))
    }

    /// Adds item `item` (arrival id `arrival`, cached prefix `cached`).
    pub(crate) fn insert(
        &mut self,
        ns: u64,
        tokens: &'a [u32],
        item: usize,
        arrival: usize,
        cached: usize,
    ) {
        let mut cur = self.root(ns);
        self.nodes[cur].bump(cached, arrival);
        let mut pos = 0;
        loop {
            if pos == tokens.len() {
                self.nodes[cur].here.push((arrival, item));
                return;
            }
            let Some((slot, c)) = self.child(cur, tokens[pos]) else {
                let mut leaf = Node::new(&tokens[pos..]);
                leaf.bump(cached, arrival);
                leaf.here.push((arrival, item));
                self.nodes.push(leaf);
                let id = self.nodes.len() - 1;
                self.nodes[cur].children.push(id);
                return;
            };
            let edge = self.nodes[c].edge;
            let l = lcp(edge, &tokens[pos..]);
            let next = if l < edge.len() {
                // Split the edge: a new middle node takes the shared part.
                let mut mid = Node::new(&edge[..l]);
                mid.count = self.nodes[c].count;
                mid.best_cached = self.nodes[c].best_cached;
                mid.first = self.nodes[c].first;
                mid.children.push(c);
                self.nodes[c].edge = &edge[l..];
                self.nodes.push(mid);
                let m = self.nodes.len() - 1;
                self.nodes[cur].children[slot] = m;
                m
            } else {
                c
            };
            self.nodes[next].bump(cached, arrival);
            cur = next;
            pos += l;
        }
    }

    /// Items depth first, heaviest subtree first (SGLang's DFS-weight order): at each node
    /// the children's subtrees in [`Node::key`] order, then the items ending at the node
    /// (by arrival).
    pub(crate) fn dfs_order(&self) -> Vec<usize> {
        let mut roots: Vec<usize> = self.roots.iter().map(|&(_, r)| r).collect();
        roots.sort_by_key(|&r| self.nodes[r].key());
        let mut out = Vec::new();
        // (node, children already pushed)
        let mut stack: Vec<(usize, bool)> = roots.into_iter().rev().map(|r| (r, false)).collect();
        while let Some((n, expanded)) = stack.pop() {
            if expanded {
                let mut here = self.nodes[n].here.clone();
                here.sort();
                out.extend(here.into_iter().map(|(_, item)| item));
                continue;
            }
            stack.push((n, true));
            let mut kids = self.nodes[n].children.clone();
            kids.sort_by_key(|&c| self.nodes[c].key());
            stack.extend(kids.into_iter().rev().map(|c| (c, false)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_keep_weights() {
        let a = [1, 2, 3, 4];
        let b = [1, 2, 9];
        let c = [1, 2, 3, 4, 5];
        let d = [7];
        let mut t = WindowTrie::new();
        t.insert(0, &d, 0, 0, 0);
        t.insert(0, &a, 1, 1, 0);
        t.insert(0, &b, 2, 2, 0);
        t.insert(0, &c, 3, 3, 0);
        t.insert(1, &a, 4, 4, 0);
        // Namespace 0: [1,2] weighs 3 ([3,4] weighs 2: c's [5] then a; then b); then d.
        // Namespace 1 (one request) last.
        assert_eq!(t.dfs_order(), vec![3, 1, 2, 0, 4]);
    }

    #[test]
    fn duplicates_and_prefixes() {
        let a = [5, 6];
        let mut t = WindowTrie::new();
        t.insert(0, &a, 0, 0, 0);
        t.insert(0, &a, 1, 1, 0);
        t.insert(0, &a[..1], 2, 2, 0);
        t.insert(0, &[], 3, 3, 0);
        // [5] node: child [6] (items 0 and 1), then item 2; root: item 3 last.
        assert_eq!(t.dfs_order(), vec![0, 1, 2, 3]);
    }
}
