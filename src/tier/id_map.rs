//! The host index's map from a page's identity to its entry, holding only ids.
//!
//! An open-addressing table of one word per bucket: `[63..32]` the key's 32-bit tag (the
//! high half of its hash), `[31..0]` the entry id plus one (0: the bucket is empty, so a
//! fresh table is zeroed memory; the host index's is written at construction instead, see
//! [`IdMap::with_capacity`]). The keys themselves
//! live in the entries (the slab), so a bucket is 8 bytes instead of the 24 of a
//! `HashMap<(u64, u64), u32>` with its control bytes: the table is a third of the size, an
//! insert of a new key writes one word and reads no entry (a tag that matches is checked
//! against the entry's key, which for a new key happens about once in 2^32 probes), and a
//! growth rehashes words without touching the entries (a bucket's home is its tag's low
//! bits). Linear probing, at most 3/4 full (it doubles past that), removal by backward
//! shift (no tombstones), so a probe ends at the first empty bucket.
//!
//! No unsafe code and no atomics: the table lives inside [`super::host_index::HostIndex`],
//! under the tier's host mutex, as the `HashMap` it replaces did.

use super::host_index::PageKey;

/// The smallest table (buckets).
const MIN_BUCKETS: usize = 64;

/// The tag of `key`: the high half of a multiply-mix of its words (keys are hashes
/// already, so this only spreads the namespace in). Its low bits pick the home bucket.
fn tag(key: &PageKey) -> u32 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let h = (key.0.wrapping_mul(K).rotate_left(29) ^ key.1).wrapping_mul(K);
    (h >> 32) as u32
}

/// Ids of entries by `(namespace, page hash)`; the keys are read off the entries through
/// the `key_of` closures the lookups take.
#[derive(Debug)]
pub(crate) struct IdMap {
    words: Vec<u64>,
    len: usize,
}

impl IdMap {
    /// A table for `entries` entries without growing. With `prefault`, its memory is
    /// written now (resident before the first insert: the inserts of a filling host land on
    /// random buckets, so they would soon fault in every page of it anyway, one page fault
    /// per 512 buckets, in the caller's hot path); without, it is zeroed memory, faulted in
    /// where inserts land.
    pub(crate) fn with_capacity(entries: usize, prefault: bool) -> IdMap {
        let buckets = (entries + entries / 3 + 1).next_power_of_two().max(MIN_BUCKETS);
        let words = if prefault {
            // Written (`vec![0; n]` would take zeroed pages and leave them untouched).
            super::resident::resident_vec(buckets, buckets, std::hint::black_box(0))
        } else {
            vec![0; buckets]
        };
        IdMap { words, len: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn mask(&self) -> usize {
        self.words.len() - 1
    }

    /// The id of `key`'s entry, if any (`key_of(id)`: the key entry `id` holds).
    pub(crate) fn get(&self, key: &PageKey, key_of: impl Fn(u32) -> PageKey) -> Option<u32> {
        let t = tag(key);
        let mask = self.mask();
        let mut i = t as usize & mask;
        loop {
            let w = self.words[i];
            if w == 0 {
                return None;
            }
            let id = (w as u32).wrapping_sub(1);
            if (w >> 32) as u32 == t && key_of(id) == *key {
                return Some(id);
            }
            i = (i + 1) & mask;
        }
    }

    /// Maps `key` to `id` unless `key` is mapped already: then `Err` with its id, and
    /// nothing changes. One probe either way.
    pub(crate) fn insert(
        &mut self,
        key: &PageKey,
        id: u32,
        key_of: impl Fn(u32) -> PageKey,
    ) -> Result<(), u32> {
        debug_assert!(id < u32::MAX, "ids are below u32::MAX");
        let t = tag(key);
        let mask = self.mask();
        let mut i = t as usize & mask;
        loop {
            let w = self.words[i];
            if w == 0 {
                break;
            }
            let other = (w as u32).wrapping_sub(1);
            if (w >> 32) as u32 == t && key_of(other) == *key {
                return Err(other);
            }
            i = (i + 1) & mask;
        }
        self.words[i] = (t as u64) << 32 | (id as u64 + 1);
        self.len += 1;
        if self.len * 4 > self.words.len() * 3 {
            self.grow();
        }
        Ok(())
    }

    /// Doubles the table: each word goes to its home in the larger table (its tag says
    /// where), without reading any entry.
    fn grow(&mut self) {
        let n = self.words.len() * 2;
        let old = std::mem::replace(&mut self.words, vec![0; n]);
        let mask = self.mask();
        for w in old.into_iter().filter(|&w| w != 0) {
            let mut i = (w >> 32) as usize & mask;
            while self.words[i] != 0 {
                i = (i + 1) & mask;
            }
            self.words[i] = w;
        }
    }

    /// A prefetch hint for `key`'s home bucket (a lookup or insert of `key` soon): a run of
    /// pages' probes are cache misses each, independent of one another, so hinting a few
    /// ahead overlaps them.
    #[inline]
    pub(crate) fn prefetch(&self, key: &PageKey) {
        let i = tag(key) as usize & self.mask();
        crate::tree::prefetch(std::ptr::from_ref(&self.words[i]).cast());
    }

    /// Unmaps `key`, mapped to `id` (the caller knows both: ids are unique, so the bucket
    /// holding `id` is found without reading any entry). Returns whether it was mapped.
    pub(crate) fn remove(&mut self, key: &PageKey, id: u32) -> bool {
        let want = (tag(key) as u64) << 32 | (id as u64 + 1);
        let mask = self.mask();
        let mut i = (want >> 32) as usize & mask;
        loop {
            let w = self.words[i];
            if w == 0 {
                return false;
            }
            if w == want {
                break;
            }
            i = (i + 1) & mask;
        }
        // Backward shift: a later word of the cluster moves into the hole when its home is
        // not between the hole and it (cyclically), so every word stays reachable from its
        // home without crossing an empty bucket.
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let w = self.words[j];
            if w == 0 {
                break;
            }
            let home = (w >> 32) as usize & mask;
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(i) & mask) {
                self.words[i] = w;
                i = j;
            }
        }
        self.words[i] = 0;
        self.len -= 1;
        true
    }

    /// Every mapped id (for checks).
    pub(crate) fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().filter(|&&w| w != 0).map(|&w| (w as u32).wrapping_sub(1))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Random inserts and removals against a `HashMap`, with keys crowded into few home
    /// buckets now and then (a namespace of its own, hashes that differ in high bits only),
    /// through several growths: every lookup agrees, and every mapped id stays reachable.
    #[test]
    fn agrees_with_a_hash_map() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut keys: Vec<PageKey> = Vec::new(); // by id
        let mut m = IdMap::with_capacity(0, false);
        let mut want: HashMap<PageKey, u32> = HashMap::new();
        for step in 0..200_000u64 {
            let key = match rnd(3) {
                0 => (rnd(3), rnd(5000)),
                1 => (7, rnd(64) << 40),
                _ => (rnd(2), rnd(1 << 62)),
            };
            let id = keys.len() as u32;
            keys.push(key);
            let key_of = |i: u32| keys[i as usize];
            match rnd(3) {
                0 | 1 => {
                    let got = m.insert(&key, id, key_of);
                    match want.get(&key) {
                        Some(&had) => assert_eq!(got, Err(had)),
                        None => {
                            assert_eq!(got, Ok(()));
                            want.insert(key, id);
                        }
                    }
                }
                _ => match want.remove(&key) {
                    Some(had) => assert!(m.remove(&key, had)),
                    None => assert!(!m.remove(&key, id)),
                },
            }
            assert_eq!(m.len(), want.len());
            if step % 997 == 0 {
                for (k, &v) in &want {
                    assert_eq!(m.get(k, |i| keys[i as usize]), Some(v));
                }
                assert_eq!(m.ids().count(), want.len());
            }
            assert_eq!(m.get(&key, |i| keys[i as usize]), want.get(&key).copied());
        }
        assert!(m.words.len() > MIN_BUCKETS, "the test never grew the table");
    }
}
