//! Workload inputs: the Mooncake trace (docs/contract/CLI.md's materialization) and a generated branching
//! (agent-style) workload.

use crate::util::Rng;

/// One request: a namespace and its prompt tokens.
pub struct Req {
    pub ns: u64,
    pub tokens: Vec<u32>,
    /// Tokens known to be cached already when the request is inserted in file order (set by
    /// the branching generator, whose forks are known; the block-hash peers need it to name
    /// the parent block of a store event without a lookup).
    pub fork: usize,
    /// Offset of this request's fresh slots in the array from [`slot_array`].
    pub slot: usize,
    /// The same slots as runs of consecutive slots, as a pool hands them out (set with
    /// [`Req::set_runs`], outside every timing).
    pub runs: Vec<radixkv::SlotRun>,
}

/// One fresh slot per token of every request (`slots[r.slot..r.slot + len]`), made once,
/// outside every timing, and numbers the requests' offsets into it. Every request starts at
/// a multiple of [`SLOT_ALIGN`], so its pages (up to that size) are whole pool pages.
pub fn slot_array(reqs: &mut [Req]) -> Vec<u32> {
    let mut off = 0;
    for r in reqs.iter_mut() {
        r.slot = off;
        off = (off + r.tokens.len()).next_multiple_of(SLOT_ALIGN);
    }
    (0..off as u32).collect()
}

/// The alignment of each request's slots in [`slot_array`] (the largest page size run).
pub const SLOT_ALIGN: usize = 16;

impl Req {
    pub fn slots<'a>(&self, all: &'a [u32]) -> &'a [u32] {
        &all[self.slot..self.slot + self.tokens.len()]
    }

    /// Sets [`Req::runs`] from this request's slots in `all`.
    pub fn set_runs(&mut self, all: &[u32]) {
        self.runs.clear();
        radixkv::SlotRun::push_runs_of(
            &all[self.slot..self.slot + self.tokens.len()],
            &mut self.runs,
        );
    }
}

/// The Mooncake trace: `tokens = concat over h in hash_ids of [h*512+i for i in 0..512]`,
/// cut to `input_length`.
pub fn mooncake(path: &str) -> Vec<Req> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read the Mooncake trace {path}: {e}"));
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let n = v["input_length"].as_u64().expect("input_length") as usize;
        let mut t = Vec::with_capacity(n.next_multiple_of(512));
        for h in v["hash_ids"].as_array().expect("hash_ids") {
            let h = h.as_u64().expect("a hash id") as u32;
            t.extend((0..512).map(|i| h * 512 + i));
        }
        t.truncate(n);
        out.push(Req { ns: 0, tokens: t, fork: 0, slot: 0, runs: Vec::new() });
    }
    out
}

/// Shape of the branching workload.
#[derive(Clone, Copy, Debug)]
pub struct Branching {
    pub tenants: usize,
    pub per_tenant: usize,
    /// Tokens of each tenant's system prompt.
    pub system: usize,
    /// Tokens of one agent step (tool call, observation, ...); forks happen at step ends.
    pub step: usize,
    /// Most steps a conversation grows to.
    pub max_steps: usize,
    pub seed: u64,
}

impl Default for Branching {
    fn default() -> Self {
        Branching { tenants: 1000, per_tenant: 200, system: 64, step: 32, max_steps: 48, seed: 7 }
    }
}

/// Agent-style forks: each tenant (its own namespace, with its own system prompt) runs
/// `per_tenant` requests; each request takes an earlier request of the same tenant (or only
/// the system prompt), keeps a random number of its steps, and appends 1 to 4 new steps of
/// fresh tokens. Requests are interleaved across tenants. Every token id is used by one
/// tenant only, so the namespaces stay disjoint for the peers that have none. Forks fall on
/// step boundaries (multiples of 16 tokens), so page 1 and page 16 see the same prefixes.
pub fn branching(b: Branching) -> Vec<Req> {
    let mut rng = Rng::new(b.seed);
    let mut next_tok: u32 = 1;
    let mut fresh = |n: usize| -> Vec<u32> {
        let v: Vec<u32> = (next_tok..next_tok + n as u32).collect();
        next_tok += n as u32;
        v
    };
    // Per tenant: its system prompt and its requests so far.
    let sys: Vec<Vec<u32>> = (0..b.tenants).map(|_| fresh(b.system)).collect();
    let mut hist: Vec<Vec<usize>> = vec![Vec::new(); b.tenants];
    let mut out: Vec<Req> = Vec::with_capacity(b.tenants * b.per_tenant);
    for _round in 0..b.per_tenant {
        for t in 0..b.tenants {
            let (mut tokens, fork) = if hist[t].is_empty() {
                (sys[t].clone(), 0) // the system prompt is not cached yet
            } else if rng.below(8) == 0 {
                (sys[t].clone(), b.system)
            } else {
                let h = &hist[t];
                // Prefer recent requests (agents continue what they just did).
                let back = rng.below(h.len().min(16) as u64) as usize;
                let parent = &out[h[h.len() - 1 - back]].tokens;
                let steps = (parent.len() - b.system) / b.step;
                let keep = rng.below(steps as u64 + 1) as usize;
                let keep = keep.min(b.max_steps - 4);
                let cut = b.system + keep * b.step;
                (parent[..cut].to_vec(), cut)
            };
            let new_steps = 1 + rng.below(4) as usize;
            tokens.extend(fresh(new_steps * b.step));
            hist[t].push(out.len());
            out.push(Req { ns: t as u64 + 1, tokens, fork, slot: 0, runs: Vec::new() });
        }
    }
    out
}
