//! The built-in synthetic workload: what `radixkv replay` runs with no trace.
//!
//! It mixes the prefix-sharing patterns an LLM serving engine sees, each in its own
//! namespaces, interleaved by arrival time:
//!
//! - **multi-tenant chat** (namespaces 1..=4): each tenant has a few system prompts shared by
//!   its conversations; a conversation has several turns, and each turn's prompt is the
//!   previous prompt, plus the previous answer, plus the new user text;
//! - **few-shot prompts** (namespace 0): task headers followed by shared example blocks, in a
//!   canonical order most of the time, otherwise a random subset in random order, then a query;
//! - **agent forks** (namespace 5): one long context (tools and task) forked into several
//!   branches, each continuing for a few steps of action plus observation.
//!
//! Everything comes from a fixed-seed [`SplitMix64`], so the workload is the same on every
//! machine and every run.

use super::{Request, Trace};

/// The SplitMix64 generator (Steele, Lea and Flood): small, fast, and deterministic.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n >= 1`; 0 gives 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi` (`lo <= hi`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// Sizes of the synthetic workload ([`SyntheticConfig::default`] is the built-in one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyntheticConfig {
    /// PRNG seed.
    pub seed: u64,
    /// Chat conversations (spread over 4 tenants).
    pub conversations: usize,
    /// Few-shot requests.
    pub fewshot_requests: usize,
    /// Agent contexts, each forked into several branches.
    pub agent_contexts: usize,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        SyntheticConfig {
            seed: 0x5EED_CAFE,
            conversations: 320,
            fewshot_requests: 600,
            agent_contexts: 60,
        }
    }
}

/// Token ids of the synthetic vocabulary.
const VOCAB: u64 = 32_000;
/// Arrivals spread over this many milliseconds.
const SPAN_MS: u64 = 600_000;

fn text(rng: &mut SplitMix64, lo: u64, hi: u64) -> Vec<u32> {
    let n = rng.range(lo, hi);
    (0..n).map(|_| rng.below(VOCAB) as u32).collect()
}

/// The built-in workload: a few thousand requests, a few million tokens, always the same.
pub fn builtin() -> Trace {
    generate(&SyntheticConfig::default())
}

/// A synthetic workload of the given sizes.
pub fn generate(cfg: &SyntheticConfig) -> Trace {
    let mut rng = SplitMix64::new(cfg.seed);
    // (arrival ms, creation order, request)
    let mut events: Vec<(u64, usize, Request)> = Vec::new();
    let push =
        |events: &mut Vec<(u64, usize, Request)>, ns: u64, tokens: Vec<u32>, out: u64, t: u64| {
            let seq = events.len();
            events.push((
                t,
                seq,
                Request {
                    namespace: ns,
                    tokens,
                    output_length: out as usize,
                    timestamp_ms: t,
                    priority: 0,
                },
            ));
        };

    // Multi-tenant chat.
    let tenants: Vec<Vec<Vec<u32>>> =
        (0..4).map(|_| (0..3).map(|_| text(&mut rng, 300, 1500)).collect()).collect();
    for _ in 0..cfg.conversations {
        let tenant = rng.below(tenants.len() as u64) as usize;
        let sys = &tenants[tenant][rng.below(3) as usize];
        let turns = 1 + rng.below(8);
        let mut t = rng.below(SPAN_MS);
        let mut prompt = sys.clone();
        for _ in 0..turns {
            prompt.extend(text(&mut rng, 20, 300));
            let out = rng.range(30, 400);
            push(&mut events, 1 + tenant as u64, prompt.clone(), out, t);
            // The answer becomes part of the next prompt.
            prompt.extend((0..out).map(|_| rng.below(VOCAB) as u32));
            t += rng.range(5_000, 60_000);
        }
    }

    // Few-shot prompts: shared examples, canonical order or a random subset and order.
    let families: Vec<(Vec<u32>, Vec<Vec<u32>>)> = (0..2)
        .map(|_| (text(&mut rng, 150, 300), (0..10).map(|_| text(&mut rng, 80, 250)).collect()))
        .collect();
    for _ in 0..cfg.fewshot_requests {
        let (header, examples) = &families[rng.below(families.len() as u64) as usize];
        let k = rng.range(2, 5) as usize;
        let mut order: Vec<usize> = (0..examples.len()).collect();
        if !rng.chance(0.6) {
            rng.shuffle(&mut order);
        }
        let mut prompt = header.clone();
        for &e in &order[..k] {
            prompt.extend_from_slice(&examples[e]);
        }
        prompt.extend(text(&mut rng, 30, 120));
        let out = rng.range(10, 80);
        let t = rng.below(SPAN_MS);
        push(&mut events, 0, prompt, out, t);
    }

    // Agent forks: one context, several branches, a few steps each.
    for _ in 0..cfg.agent_contexts {
        let mut context = text(&mut rng, 800, 2500);
        context.extend(text(&mut rng, 100, 400));
        let t0 = rng.below(SPAN_MS);
        for _ in 0..rng.range(3, 6) {
            let mut prompt = context.clone();
            prompt.extend(text(&mut rng, 50, 300));
            let mut t = t0 + rng.below(1_000);
            for _ in 0..rng.range(1, 3) {
                let out = rng.range(50, 200);
                push(&mut events, 5, prompt.clone(), out, t);
                prompt.extend((0..out).map(|_| rng.below(VOCAB) as u32));
                prompt.extend(text(&mut rng, 100, 400));
                t += rng.range(2_000, 10_000);
            }
        }
    }

    events.sort_by_key(|&(t, seq, _)| (t, seq));
    Trace::from_requests("builtin", events.into_iter().map(|(_, _, r)| r).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // Reference outputs of SplitMix64 seeded with 1234567.
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
        assert_eq!(r.next_u64(), 9817491932198370423);
    }

    #[test]
    fn below_and_range_stay_in_bounds() {
        let mut r = SplitMix64::new(9);
        for n in 1..50 {
            assert!(r.below(n) < n);
            let x = r.range(n, n + 3);
            assert!((n..=n + 3).contains(&x));
        }
        assert_eq!(r.below(0), 0);
        let mut v: Vec<u32> = (0..20).collect();
        r.shuffle(&mut v);
        let mut s = v.clone();
        s.sort();
        assert_eq!(s, (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn deterministic_and_sorted_by_arrival() {
        let cfg =
            SyntheticConfig { seed: 3, conversations: 20, fewshot_requests: 30, agent_contexts: 4 };
        let a = generate(&cfg);
        let b = generate(&cfg);
        assert_eq!(a.len(), b.len());
        assert!(a.iter().zip(b.iter()).all(|(x, y)| x == y));
        let times: Vec<u64> = a.iter().map(|r| r.timestamp_ms).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        let c = generate(&SyntheticConfig { seed: 4, ..cfg });
        assert!(a.iter().zip(c.iter()).any(|(x, y)| x != y));
    }

    #[test]
    fn builtin_has_the_advertised_shape() {
        let t = builtin();
        assert!((2_000..10_000).contains(&t.len()), "{} requests", t.len());
        assert!((2_000_000..10_000_000).contains(&t.input_tokens()), "{} tokens", t.input_tokens());
        let namespaces: std::collections::BTreeSet<u64> = t.iter().map(|r| r.namespace).collect();
        assert_eq!(namespaces.into_iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5]);
        assert!(t.max_token().unwrap() < VOCAB as u32);
    }

    #[test]
    fn multi_turn_prompts_extend_the_previous_turn() {
        let t = generate(&SyntheticConfig {
            seed: 11,
            conversations: 30,
            fewshot_requests: 0,
            agent_contexts: 0,
        });
        let reqs: Vec<Request> = t.iter().collect();
        // Some request's prompt strictly extends an earlier prompt by more than its output.
        let extended = reqs.iter().enumerate().any(|(i, r)| {
            reqs[..i].iter().any(|p| {
                p.namespace == r.namespace
                    && r.tokens.len() > p.tokens.len() + p.output_length
                    && r.tokens.starts_with(&p.tokens)
            })
        });
        assert!(extended);
    }
}
