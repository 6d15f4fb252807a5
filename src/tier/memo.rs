//! The page hashes of the last prompt each thread hashed, kept for the next call.
//!
//! A request's cycle hashes its prompt up to three times (the lookup's host run, the
//! load-back, the insert), each time from the namespace's first page: the chained hash
//! needs the whole prefix. Each thread keeps the tokens, chain states and hashes of the
//! prompt it hashed last; a call whose tokens start with whole pages of those (same
//! namespace, same page size, same hasher) takes their hashes and hashes only the pages
//! after them, so the cycle hashes each page once and compares the rest (a `memcmp`).
//!
//! It is a cache of a pure function (the hashes of `tokens` under one hasher), checked by
//! comparing the tokens, so it changes no answer. A namespace's hasher is compared by its
//! [`NamespaceInfo`] (`Arc::ptr_eq`; the memo holds the `Arc`, so no other info can take
//! its address); without events every tier hashes with the same default hasher. Not under
//! loom (nothing in it is shared between threads).

use std::cell::RefCell;
use std::sync::Arc;

use crate::events::NamespaceInfo;
use crate::events::hash::{ChainState, PageHasher};

/// One thread's last hashed prompt.
struct Memo {
    ns: u64,
    page_size: usize,
    /// The namespace's info when events were on (its hasher), else `None` (the default).
    info: Option<Arc<NamespaceInfo>>,
    /// The prompt's whole pages.
    tokens: Vec<u32>,
    states: Vec<ChainState>,
    hashes: Vec<u64>,
}

thread_local! {
    static MEMO: RefCell<Option<Memo>> = const { RefCell::new(None) };
}

/// The page hashes of `tokens` (whole pages: a multiple of `p`) in namespace `ns` under
/// `hasher` (`info`'s, or the default one when `info` is `None`), reusing the pages this
/// thread hashed last where `tokens` starts with them.
pub(super) fn hashes(
    ns: u64,
    p: usize,
    info: Option<Arc<NamespaceInfo>>,
    hasher: &PageHasher,
    tokens: &[u32],
) -> Vec<u64> {
    debug_assert!(tokens.len().is_multiple_of(p));
    MEMO.with(|cell| {
        let Ok(mut slot) = cell.try_borrow_mut() else {
            return hasher.block_hashes(tokens, p); // re-entered (cannot happen): no memo
        };
        let same = |m: &Memo| {
            m.ns == ns
                && m.page_size == p
                && match (&m.info, &info) {
                    (None, None) => true,
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    _ => false,
                }
        };
        let m = match slot.as_mut() {
            Some(m) if same(m) => m,
            _ => slot.insert(Memo {
                ns,
                page_size: p,
                info,
                tokens: Vec::new(),
                states: Vec::new(),
                hashes: Vec::new(),
            }),
        };
        let k = common_pages(&m.tokens, tokens, p);
        if k * p == tokens.len() {
            return m.hashes[..k].to_vec();
        }
        // Hash the pages after the common ones, then keep this prompt.
        m.tokens.truncate(k * p);
        m.tokens.extend_from_slice(&tokens[k * p..]);
        m.states.truncate(k);
        m.hashes.truncate(k);
        let parent = k.checked_sub(1).map(|j| m.states[j]);
        hasher.hash_pages(parent.as_ref(), &tokens[k * p..], p, &mut m.states, &mut m.hashes);
        m.hashes.clone()
    })
}

/// How many whole pages `a` and `b` start with in common.
fn common_pages(a: &[u32], b: &[u32], p: usize) -> usize {
    let k = a.len().min(b.len()) / p;
    if a[..k * p] == b[..k * p] {
        return k;
    }
    (0..k).position(|i| a[i * p..(i + 1) * p] != b[i * p..(i + 1) * p]).unwrap_or(k)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::events::hash::HashMode;

    /// Prompts sharing prefixes, growing, shrinking and forking, in two namespaces and two
    /// page sizes: the memo's hashes are always the ones hashing from scratch gives.
    #[test]
    fn the_memo_answers_as_hashing_from_scratch() {
        let h = PageHasher::new(HashMode::Xxh3, None, None);
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut prompt: Vec<u32> = Vec::new();
        for _ in 0..500 {
            let p = [1usize, 4][rnd(2) as usize];
            let ns = rnd(2);
            match rnd(4) {
                0 => prompt.truncate(rnd(prompt.len() as u64 + 1) as usize),
                1 => {
                    let at = rnd(prompt.len() as u64 + 1) as usize;
                    prompt.truncate(at);
                    prompt.extend((0..rnd(40)).map(|_| rnd(5) as u32));
                }
                _ => prompt.extend((0..rnd(40)).map(|_| rnd(5) as u32)),
            }
            let n = prompt.len() / p * p;
            let got = hashes(ns, p, None, &h, &prompt[..n]);
            assert_eq!(got, h.block_hashes(&prompt[..n], p));
        }
    }
}
