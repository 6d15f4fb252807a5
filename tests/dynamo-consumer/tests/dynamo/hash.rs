//! Page hashes: the spec's vectors, Dynamo's own functions on random inputs, and SGLang's
//! vectors computed by SGLang.

use radixkv::events::hash::{HashMode, PageHasher, XXH3_SEED, xxh3_local};

use dynamo_kv_router::protocols::{
    BlockHashOptions, compute_block_hash_for_seq, compute_seq_hash_for_block,
};

#[test]
fn spec_test_vectors() {
    let p1: Vec<u32> = (1..=16).collect();
    let p2: Vec<u32> = (17..=32).collect();
    assert_eq!(xxh3_local(&p1, XXH3_SEED), 16863443419780771464);
    assert_eq!(xxh3_local(&p2, XXH3_SEED), 2287610619914608821);
    let all: Vec<u32> = (1..=32).collect();
    let h = PageHasher::new(HashMode::Xxh3, None, None);
    assert_eq!(h.block_hashes(&all, 16), [16863443419780771464, 12466389667045779788]);
}

/// A small xorshift, so the inputs are the same on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Dynamo's request-side hash: local hashes with the namespace's seed, then its sequence
/// chain.
fn dynamo(tokens: &[u32], page: u32, lora: Option<&str>, salt: Option<&str>) -> Vec<u64> {
    let opts = BlockHashOptions { lora_name: lora, cache_namespace: salt, ..Default::default() };
    let local = compute_block_hash_for_seq(tokens, page, opts);
    compute_seq_hash_for_block(&local)
}

#[test]
fn xxh3_mode_equals_dynamo_on_random_inputs() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let names = [None, Some("adapter-a"), Some("x"), Some("")];
    let salts = [None, Some("tenant-a"), Some("7"), Some("")];
    for case in 0..400 {
        let page = [1u32, 2, 4, 16, 32][case % 5];
        let len = (r.next() % 300) as usize;
        let tokens: Vec<u32> = (0..len).map(|_| r.next() as u32).collect();
        let lora = names[(r.next() % 4) as usize];
        let salt = salts[(r.next() % 4) as usize];
        let ours = PageHasher::new(HashMode::Xxh3, lora, salt).block_hashes(&tokens, page as usize);
        assert_eq!(
            ours,
            dynamo(&tokens, page, lora, salt),
            "case {case}: page {page} lora {lora:?} salt {salt:?}"
        );
    }
}

#[test]
fn namespaces_with_equal_tokens_hash_apart() {
    let tokens: Vec<u32> = (0..64).collect();
    let ids = [
        (None, None),
        (Some("a"), None),
        (None, Some("a")),
        (Some("a"), Some("a")),
        (None, Some("1")),
    ];
    for mode in [HashMode::Xxh3, HashMode::SglangSha256] {
        let all: Vec<Vec<u64>> = ids
            .iter()
            .map(|(l, s)| PageHasher::new(mode, *l, *s).block_hashes(&tokens, 16))
            .collect();
        for i in 0..all.len() {
            for j in 0..i {
                for h in &all[i] {
                    assert!(
                        !all[j].contains(h),
                        "{mode:?}: {:?} and {:?} share a page hash",
                        ids[i],
                        ids[j]
                    );
                }
            }
        }
    }
}

// Computed once by tests/golden/sglang_hashes.py with SGLang 0.5.23's own functions
// (sglang.srt.mem_cache.utils.get_hash_str / compute_node_event_hash_values /
// hash_str_to_int64, and sglang.srt.disaggregation.kv_events.kv_event_namespace_seed /
// namespaced_block_hash with extra_key = the LoRA name); rerun that script to remake them.
const BASE_1_32_P16: [i64; 2] = [8635429971592222890, 1256577331724852459];
const BASE_1_12_P4: [i64; 3] = [-3488128144981237669, 5674439469042975057, -1307369107475853156];
const SALT_1_32_P16: [i64; 2] = [-6866860737164470112, -5869357062886784643];
const LORA_1_32_P16: [i64; 2] = [5222357457538373008, -6475519914903919890];
const BOTH_1_32_P16: [i64; 2] = [-3092770637934081153, -3235757797632630279];
const BIG_TOKENS_P2: [i64; 2] = [6449551850172071658, -4818901889349070219];

fn sglang(tokens: &[u32], page: usize, lora: Option<&str>, salt: Option<&str>) -> Vec<i64> {
    PageHasher::new(HashMode::SglangSha256, lora, salt)
        .block_hashes(tokens, page)
        .into_iter()
        .map(|h| h as i64)
        .collect()
}

#[test]
fn sglang_mode_matches_sglang() {
    let t32: Vec<u32> = (1..=32).collect();
    let t12: Vec<u32> = (1..=12).collect();
    assert_eq!(sglang(&t32, 16, None, None), BASE_1_32_P16);
    assert_eq!(sglang(&t12, 4, None, None), BASE_1_12_P4);
    assert_eq!(sglang(&t32, 16, None, Some("tenant-a")), SALT_1_32_P16);
    assert_eq!(sglang(&t32, 16, Some("adapter-a"), None), LORA_1_32_P16);
    assert_eq!(sglang(&t32, 16, Some("adapter-a"), Some("tenant-a")), BOTH_1_32_P16);
    assert_eq!(sglang(&[0, u32::MAX, 7, 100000], 2, None, None), BIG_TOKENS_P2);
}
