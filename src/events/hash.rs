//! Page hashes: the block hashes a KV event names its pages by.
//!
//! Two modes, each the hash another component of a serving fleet computes itself, so a
//! router that hashes a request's tokens finds the pages radixkv published:
//!
//! - [`HashMode::Xxh3`] (the default): the Dynamo / Mooncake chain. A page's *local* hash
//!   is `XXH3-64` over its tokens as little-endian `u32`, seeded by the namespace's
//!   [`dynamo_seed`] (1337 for the base model); the *sequence* hash, the one published, is
//!   `seq[0] = local[0]`, `seq[i] = XXH3-64(le64(seq[i-1]) ++ le64(local[i]), 1337)`. It is
//!   what `dynamo_kv_router::protocols::compute_block_hash_for_seq` (local) and
//!   `compute_seq_hash_for_block` (sequence) compute, namespace seed included.
//! - [`HashMode::SglangSha256`]: SGLang 0.5.23's event hashes. The chain is SHA-256 over
//!   the previous page's 32-byte digest (none for the first page, or SGLang's salt seed
//!   `SHA-256("sglang-cache-salt-v1\0" ++ salt)` in a salted namespace) followed by the
//!   page's tokens as little-endian `u32`; the published hash is the digest's first 8
//!   bytes as a big-endian signed `i64`, wrapped, in a namespace with a LoRA name or a
//!   salt, by SGLang's `namespaced_block_hash` (the first 8 bytes of
//!   `SHA-256(namespace_seed ++ be64(hash))`). The LoRA name plays SGLang's `extra_key`.
//!
//! A page's children continue its chain from its [`ChainState`] (8 bytes in the XXH3 mode,
//! the 32-byte digest in the SGLang one); the tree keeps it per page so that neither a
//! child's insert nor a removal rehashes anything.

use std::borrow::Cow;

use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The seed of the chain step and of a base-model page's local hash (Dynamo's
/// `XXH3_SEED`, Mooncake's too).
pub const XXH3_SEED: u64 = 1337;

/// Which page hash a cache publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashMode {
    /// The Dynamo / Mooncake XXH3-64 sequence hash (unsigned on the wire).
    #[default]
    Xxh3,
    /// SGLang's SHA-256 page chain cut to a signed 64-bit integer (signed on the wire).
    SglangSha256,
}

impl HashMode {
    /// Whether the wire carries this mode's hashes as signed integers (SGLang's do: it
    /// publishes `i64`s), so a consumer comparing raw values sees what the engine it mimics
    /// would send. Dynamo accepts both forms.
    pub fn signed_on_wire(self) -> bool {
        matches!(self, HashMode::SglangSha256)
    }
}

/// Dynamo's local-hash seed for a namespace (`dynamo_kv_hashing::compute_salt_hash`):
/// `1337`, plus `XXH3-64(lora_name, 0)` when there is a LoRA name, plus
/// `XXH3-64(cache_salt, 1)` when there is a salt (wrapping adds). Empty strings count as
/// absent, as in Dynamo.
pub fn dynamo_seed(cache_salt: Option<&str>, lora_name: Option<&str>) -> u64 {
    let mut seed = XXH3_SEED;
    if let Some(l) = present(lora_name) {
        seed = seed.wrapping_add(xxh3_64_with_seed(l.as_bytes(), 0));
    }
    if let Some(s) = present(cache_salt) {
        seed = seed.wrapping_add(xxh3_64_with_seed(s.as_bytes(), 1));
    }
    seed
}

/// `s` unless it is empty. Written with `unwrap_or("")` rather than
/// `filter(|s| !s.is_empty())`: LLVM turns the filter into conditional moves that read the
/// length word of a `None` (never written), which valgrind's memcheck reports as a branch
/// on an uninitialised value in the C tests; here the emptiness test reads a length that is
/// always written (`""`'s when `None`).
fn present(s: Option<&str>) -> Option<&str> {
    let s = s.unwrap_or("");
    (!s.is_empty()).then_some(s)
}

/// Tokens as little-endian bytes: borrowed in place on a little-endian machine (no copy on
/// the insert path), copied elsewhere.
fn le_bytes(tokens: &[u32]) -> Cow<'_, [u8]> {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: the pointer and length cover exactly the `4 * len` initialized bytes of
        // `tokens` (`u32` has no padding), every byte is a valid `u8`, `u8` needs no
        // alignment, and the borrow keeps `tokens` alive and unchanged for the slice's
        // lifetime. On a little-endian machine these bytes are the tokens' LE encoding.
        Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), std::mem::size_of_val(tokens))
        })
    }
    #[cfg(not(target_endian = "little"))]
    {
        Cow::Owned(tokens.iter().flat_map(|t| t.to_le_bytes()).collect())
    }
}

/// A page's local hash: `XXH3-64` over its tokens as little-endian `u32`, with `seed`.
pub fn xxh3_local(page: &[u32], seed: u64) -> u64 {
    xxh3_64_with_seed(&le_bytes(page), seed)
}

/// One step of the sequence chain: `XXH3-64(le64(parent) ++ le64(local), 1337)`.
pub fn xxh3_next(parent: u64, local: u64) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&parent.to_le_bytes());
    bytes[8..].copy_from_slice(&local.to_le_bytes());
    xxh3_64_with_seed(&bytes, XXH3_SEED)
}

/// One SGLang page digest: `SHA-256(prior ++ tokens as LE u32)` (SGLang's `get_hash_str`
/// for one page of token ids that fit in `u32`).
pub fn sglang_page_digest(prior: Option<&[u8; 32]>, page: &[u32]) -> [u8; 32] {
    let mut h = Sha256::new();
    if let Some(p) = prior {
        h.update(p);
    }
    h.update(le_bytes(page));
    h.finalize().into()
}

/// The first 8 bytes of a digest as a big-endian signed integer (SGLang's
/// `hash_str_to_int64`), returned as its two's-complement bits.
pub fn sglang_to_i64(digest: &[u8; 32]) -> u64 {
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// SGLang's salt seed, the prior of a salted namespace's first page:
/// `SHA-256("sglang-cache-salt-v1\0" ++ salt)`.
pub fn sglang_salt_prior(cache_salt: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"sglang-cache-salt-v1\0");
    h.update(cache_salt.as_bytes());
    h.finalize().into()
}

/// SGLang's `kv_event_namespace_seed(extra_key, cache_salt)`: `None` for the base model;
/// else `SHA-256("sglang-kv-event-namespace-v1" ++ part(extra_key) ++ part(cache_salt))`
/// with `part(None) = 0x00` and `part(s) = 0x01 ++ le64(len(s)) ++ s`.
pub fn sglang_namespace_seed(
    extra_key: Option<&str>,
    cache_salt: Option<&str>,
) -> Option<[u8; 32]> {
    if extra_key.is_none() && cache_salt.is_none() {
        return None;
    }
    let mut h = Sha256::new();
    h.update(b"sglang-kv-event-namespace-v1");
    for part in [extra_key, cache_salt] {
        match part {
            None => h.update([0u8]),
            Some(s) => {
                h.update([1u8]);
                h.update((s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }
        }
    }
    Some(h.finalize().into())
}

/// SGLang's `namespaced_block_hash`: `hash` itself without a seed, else the first 8 bytes
/// of `SHA-256(seed ++ be64(hash))` as a signed integer (as its bits).
pub fn sglang_namespaced(hash: u64, seed: Option<&[u8; 32]>) -> u64 {
    let Some(seed) = seed else {
        return hash;
    };
    let mut h = Sha256::new();
    h.update(seed);
    h.update(hash.to_be_bytes());
    let d: [u8; 32] = h.finalize().into();
    sglang_to_i64(&d)
}

/// What a page's children continue the chain from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainState {
    /// The page's XXH3 sequence hash (also its published hash).
    Xxh3(u64),
    /// The page's SHA-256 digest (the published hash is derived from it).
    Sha256([u8; 32]),
}

/// The page hasher of one namespace: its mode and the seeds its namespace's LoRA name and
/// cache salt give it. Cheap to keep per namespace; immutable, so `Sync`.
#[derive(Debug, Clone)]
pub struct PageHasher {
    mode: HashMode,
    /// XXH3: the local-hash seed.
    seed: u64,
    /// SGLang: the first page's prior (the salt seed), if salted.
    prior: Option<[u8; 32]>,
    /// SGLang: the namespace wrap's seed, if namespaced.
    wrap: Option<[u8; 32]>,
}

impl PageHasher {
    /// The hasher of a namespace published with this LoRA name and cache salt (empty
    /// strings count as absent).
    pub fn new(mode: HashMode, lora_name: Option<&str>, cache_salt: Option<&str>) -> Self {
        let lora = present(lora_name);
        let salt = present(cache_salt);
        match mode {
            HashMode::Xxh3 => {
                PageHasher { mode, seed: dynamo_seed(salt, lora), prior: None, wrap: None }
            }
            HashMode::SglangSha256 => PageHasher {
                mode,
                seed: 0,
                prior: salt.map(sglang_salt_prior),
                wrap: sglang_namespace_seed(lora, salt),
            },
        }
    }

    /// The mode.
    pub fn mode(&self) -> HashMode {
        self.mode
    }

    /// The chain state of the page `page` (exactly one page of tokens) below `parent`
    /// (`None`: the namespace's first page).
    pub fn next(&self, parent: Option<&ChainState>, page: &[u32]) -> ChainState {
        match self.mode {
            HashMode::Xxh3 => {
                let local = xxh3_local(page, self.seed);
                ChainState::Xxh3(match parent {
                    None => local,
                    Some(ChainState::Xxh3(p)) => xxh3_next(*p, local),
                    Some(ChainState::Sha256(_)) => panic!("an SGLang chain state in an XXH3 chain"),
                })
            }
            HashMode::SglangSha256 => {
                let prior = match parent {
                    None => self.prior.as_ref(),
                    Some(ChainState::Sha256(d)) => Some(d),
                    Some(ChainState::Xxh3(_)) => panic!("an XXH3 chain state in an SGLang chain"),
                };
                ChainState::Sha256(sglang_page_digest(prior, page))
            }
        }
    }

    /// The hash a page with this chain state is published as (`block_hashes`; an SGLang
    /// hash is an `i64` given as its bits).
    pub fn block_hash(&self, state: &ChainState) -> u64 {
        match state {
            ChainState::Xxh3(h) => *h,
            ChainState::Sha256(d) => sglang_namespaced(sglang_to_i64(d), self.wrap.as_ref()),
        }
    }

    /// Hashes the pages of `tokens` (cut to a multiple of `page_size`) below `parent`,
    /// appending each page's chain state to `states` and its published hash to `hashes`.
    pub fn hash_pages(
        &self,
        parent: Option<&ChainState>,
        tokens: &[u32],
        page_size: usize,
        states: &mut Vec<ChainState>,
        hashes: &mut Vec<u64>,
    ) {
        assert!(page_size > 0, "page size 0");
        // Grown once: an insert of a long prompt hashes hundreds of pages.
        states.reserve(tokens.len() / page_size);
        hashes.reserve(tokens.len() / page_size);
        let mut prev = parent.copied();
        for page in tokens.chunks_exact(page_size) {
            let s = self.next(prev.as_ref(), page);
            states.push(s);
            hashes.push(self.block_hash(&s));
            prev = Some(s);
        }
    }

    /// [`PageHasher::hash_pages`] for the resolver: the published hashes, and the SGLang
    /// chain digests (none in the XXH3 mode, where a page's chain state is its published
    /// hash), without a [`ChainState`] per page.
    pub(crate) fn hash_pages_compact(
        &self,
        parent: Option<&ChainState>,
        tokens: &[u32],
        page_size: usize,
        digests: &mut Vec<[u8; 32]>,
        hashes: &mut Vec<u64>,
    ) {
        assert!(page_size > 0, "page size 0");
        let pages = tokens.chunks_exact(page_size);
        hashes.reserve_exact(pages.len());
        match (self.mode, parent) {
            (HashMode::Xxh3, None | Some(ChainState::Xxh3(_))) => {
                let mut prev = parent.map(|p| self.block_hash(p));
                for page in pages {
                    let local = xxh3_local(page, self.seed);
                    let h = prev.map_or(local, |p| xxh3_next(p, local));
                    hashes.push(h);
                    prev = Some(h);
                }
            }
            _ => {
                digests.reserve_exact(pages.len());
                let mut prev = parent.copied();
                for page in pages {
                    let s = self.next(prev.as_ref(), page);
                    if let ChainState::Sha256(d) = s {
                        digests.push(d);
                    }
                    hashes.push(self.block_hash(&s));
                    prev = Some(s);
                }
            }
        }
    }

    /// The published hashes of the pages of `tokens` from the namespace's first page (a
    /// request-side computation, as a router does it).
    pub fn block_hashes(&self, tokens: &[u32], page_size: usize) -> Vec<u64> {
        let (mut states, mut hashes) = (Vec::new(), Vec::new());
        self.hash_pages(None, tokens, page_size, &mut states, &mut hashes);
        hashes
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn spec_vectors() {
        let p1: Vec<u32> = (1..=16).collect();
        let p2: Vec<u32> = (17..=32).collect();
        assert_eq!(xxh3_local(&p1, XXH3_SEED), 16863443419780771464);
        assert_eq!(xxh3_local(&p2, XXH3_SEED), 2287610619914608821);
        let h = PageHasher::new(HashMode::Xxh3, None, None);
        let all: Vec<u32> = (1..=32).collect();
        assert_eq!(h.block_hashes(&all, 16), vec![16863443419780771464, 12466389667045779788]);
    }

    #[test]
    fn the_resolvers_compact_hashing_is_hash_pages() {
        for mode in [HashMode::Xxh3, HashMode::SglangSha256] {
            let h = PageHasher::new(mode, Some("a"), None);
            let all: Vec<u32> = (0..40).map(|i| i * 70_001).collect();
            let (mut st, mut hs) = (Vec::new(), Vec::new());
            h.hash_pages(None, &all[..8], 8, &mut st, &mut hs);
            let parent = *st.last().unwrap();
            for p in [None, Some(&parent)] {
                let (mut st, mut hs, mut ds, mut hc) = (vec![], vec![], vec![], vec![]);
                h.hash_pages(p, &all[8..], 8, &mut st, &mut hs);
                h.hash_pages_compact(p, &all[8..], 8, &mut ds, &mut hc);
                assert_eq!(hs, hc);
                let want: Vec<[u8; 32]> = st
                    .iter()
                    .filter_map(|s| match s {
                        ChainState::Sha256(d) => Some(*d),
                        ChainState::Xxh3(_) => None,
                    })
                    .collect();
                assert_eq!(ds, want);
            }
        }
    }

    #[test]
    fn chains_continue_from_a_parent_state() {
        for mode in [HashMode::Xxh3, HashMode::SglangSha256] {
            let h = PageHasher::new(mode, Some("a"), Some("s"));
            let all: Vec<u32> = (0..40).collect();
            let whole = h.block_hashes(&all, 8);
            let (mut st, mut hs) = (Vec::new(), Vec::new());
            h.hash_pages(None, &all[..16], 8, &mut st, &mut hs);
            let parent = *st.last().unwrap();
            h.hash_pages(Some(&parent), &all[16..], 8, &mut st, &mut hs);
            assert_eq!(hs, whole);
        }
    }
}
