//! KV storage: the memory the slots index (host and CUDA backends).
//!
//! A slot (see `docs/contract/SEMANTICS.md`) is the index of one token's KV entry. For every layer a
//! [`KvStorage`] holds two buffers, K and V, each shaped
//! `[num_slots, num_kv_heads, head_dim]` with elements of `elem_bytes` bytes, row-major:
//! slot `s` of a buffer is the `slot_bytes()` bytes at offset `s * slot_bytes()`.
//! Attention kernels get the base addresses from [`KvStorage::k_ptr`] and
//! [`KvStorage::v_ptr`]; the cache moves whole slots with [`KvStorage::copy_slots`]
//! (copy-on-write of a partly filled page, host offload).
//!
//! Backends:
//! - [`HostKvStorage`]: ordinary host memory (always built).
//! - `CudaKvStorage` in `kv::cuda`: device memory through cudarc (cargo feature `cuda`).
//!
//! ## `copy_slots` semantics
//!
//! `copy_slots(src, dst)` copies slot `src[i]` to slot `dst[i]` for every `i`, in every
//! layer, in both K and V. It behaves as if **every source were read before any
//! destination is written** (a parallel assignment), so a slot may be both a source and a
//! destination in one call (`[1, 2] -> [2, 3]` moves the old contents of 1 and 2 into 2
//! and 3). Sources may repeat (one slot copied to many places); destinations may not,
//! since two values for one slot would be ambiguous. `src[i] == dst[i]` is allowed and
//! leaves that slot as it is.
//!
//! Argument errors (`src.len() != dst.len()`, a slot `>= num_slots`, a repeated
//! destination) are [`Error::InvalidArgument`] and change nothing: every argument is
//! checked before the first byte moves. A device failure in the middle of a copy is
//! [`Error::Device`] and may leave destinations partly written.
//!
//! This module is not modelled under loom, so its locks are plain `std::sync` locks.

mod host;
#[cfg(feature = "cuda")]
pub(crate) use host::check_pairs;

#[cfg(feature = "cuda")]
pub mod cuda;

#[cfg(feature = "cuda")]
pub use cuda::{CopyMethod, CudaKvStorage};
pub use host::HostKvStorage;

use crate::error::{Error, Result, invalid};

/// The shape of a KV store: how many layers and slots, and how big one slot is.
///
/// Per layer there is one K and one V buffer of `num_slots * slot_bytes()` bytes each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvLayout {
    /// Number of transformer layers (each has its own K and V buffer).
    pub num_layers: usize,
    /// Number of slots (tokens) per buffer; slot indices are `0..num_slots`.
    pub num_slots: usize,
    /// Number of KV heads per token.
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Bytes per element (2 for fp16/bf16, 1 for fp8, 4 for fp32).
    pub elem_bytes: usize,
}

impl KvLayout {
    /// A layout with the given dimensions (not yet validated, see [`KvLayout::validate`]).
    pub const fn new(
        num_layers: usize,
        num_slots: usize,
        num_kv_heads: usize,
        head_dim: usize,
        elem_bytes: usize,
    ) -> Self {
        KvLayout { num_layers, num_slots, num_kv_heads, head_dim, elem_bytes }
    }

    /// Checks that every dimension is at least 1, that slot indices fit in a `u32`
    /// (`num_slots <= 2^32`), and that no size below overflows (the whole store,
    /// [`KvLayout::total_bytes`], fits in an `isize`).
    ///
    /// The byte-size methods are exact for a layout that passes this check; for one that
    /// does not, they saturate at `usize::MAX` instead of overflowing.
    pub fn validate(&self) -> Result<()> {
        let dims = [
            ("num_layers", self.num_layers),
            ("num_slots", self.num_slots),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("elem_bytes", self.elem_bytes),
        ];
        for (name, value) in dims {
            if value == 0 {
                return Err(invalid(format!("KV layout: {name} must be at least 1")));
            }
        }
        if self.num_slots as u64 > 1u64 << 32 {
            return Err(invalid(format!(
                "KV layout: num_slots = {} does not fit u32 slot indices (at most 2^32)",
                self.num_slots
            )));
        }
        let total = self
            .num_kv_heads
            .checked_mul(self.head_dim)
            .and_then(|x| x.checked_mul(self.elem_bytes))
            .and_then(|x| x.checked_mul(self.num_slots))
            .and_then(|x| x.checked_mul(self.num_layers))
            .and_then(|x| x.checked_mul(2))
            .filter(|&x| x <= isize::MAX as usize);
        if total.is_none() {
            return Err(invalid(format!("KV layout: total size overflows ({self:?})")));
        }
        Ok(())
    }

    /// Bytes of one slot in one buffer (one layer, K or V):
    /// `num_kv_heads * head_dim * elem_bytes`.
    pub const fn slot_bytes(&self) -> usize {
        self.num_kv_heads.saturating_mul(self.head_dim).saturating_mul(self.elem_bytes)
    }

    /// Bytes of one buffer (one layer, K or V): `num_slots * slot_bytes()`.
    pub const fn buffer_bytes(&self) -> usize {
        self.num_slots.saturating_mul(self.slot_bytes())
    }

    /// Bytes one slot takes over all layers, K and V: `2 * num_layers * slot_bytes()`.
    /// This is what [`KvStorage::copy_slots`] moves per copied slot.
    pub const fn bytes_per_token(&self) -> usize {
        self.num_layers.saturating_mul(2).saturating_mul(self.slot_bytes())
    }

    /// Bytes of the whole store: `2 * num_layers * buffer_bytes()`.
    pub const fn total_bytes(&self) -> usize {
        self.num_layers.saturating_mul(2).saturating_mul(self.buffer_bytes())
    }

    /// Byte offset of `slot` inside a buffer: `slot * slot_bytes()`.
    pub const fn slot_offset(&self, slot: u32) -> usize {
        (slot as usize).saturating_mul(self.slot_bytes())
    }
}

/// The memory the slots index: per layer a K and a V buffer of
/// `[num_slots, num_kv_heads, head_dim]` elements (see the [module docs](self)).
///
/// Every method takes `&self` and may be called from many threads at once; each backend
/// serializes the calls that touch the buffers, so a `read_slot` never sees half of a
/// `write_slot` or `copy_slots`. Access through [`k_ptr`](KvStorage::k_ptr) /
/// [`v_ptr`](KvStorage::v_ptr) is outside that: the caller orders it (for example by
/// launching kernels after `copy_slots` returns).
pub trait KvStorage: Send + Sync {
    /// The shape of this store.
    fn layout(&self) -> &KvLayout;

    /// Address of layer `layer`'s K buffer (host address for the host backend, device
    /// address for CUDA). Stable for the lifetime of the store, aligned to 256 bytes.
    /// [`Error::InvalidArgument`] when `layer >= num_layers`.
    fn k_ptr(&self, layer: usize) -> Result<u64>;

    /// Address of layer `layer`'s V buffer; as [`KvStorage::k_ptr`].
    fn v_ptr(&self, layer: usize) -> Result<u64>;

    /// Copies whole slots, `src[i] -> dst[i]`, in every layer, K and V, and returns when
    /// the copy is complete. Sources are all read before any destination is written;
    /// repeated destinations are refused (see the [module docs](self)).
    fn copy_slots(&self, src: &[u32], dst: &[u32]) -> Result<()>;

    /// Writes one slot of one layer: `k` and `v` must each be exactly `slot_bytes()` long.
    /// Blocking; meant for tests and tools, not the serving path.
    fn write_slot(&self, layer: usize, slot: u32, k: &[u8], v: &[u8]) -> Result<()>;

    /// Reads one slot of one layer into `k_out` and `v_out`, each exactly `slot_bytes()`
    /// long. Blocking; meant for tests and tools. Slots never written read as zeros.
    fn read_slot(&self, layer: usize, slot: u32, k_out: &mut [u8], v_out: &mut [u8]) -> Result<()>;
}

/// One coalesced copy: `len` consecutive slots from `src` to `dst` (slot indices, or
/// indices into a scratch buffer for the two-phase copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub(crate) src: usize,
    pub(crate) dst: usize,
    pub(crate) len: usize,
}

/// A checked `copy_slots` request.
#[derive(Debug)]
pub(crate) enum CopyPlan {
    /// No destination is also a source: copy straight, in any order.
    Direct(Vec<Run>),
    /// Some destination is also a source: copy every source into scratch slot `i` first
    /// (`gather`: slot -> scratch index), then scratch into the destinations (`scatter`:
    /// scratch index -> slot). `scratch_slots` slots of scratch are needed per buffer.
    TwoPhase { gather: Vec<Run>, scatter: Vec<Run>, scratch_slots: usize },
}

impl CopyPlan {
    /// Checks a `copy_slots` request against `layout` and plans it. Pairs with
    /// `src[i] == dst[i]` are dropped (they change nothing).
    pub(crate) fn new(layout: &KvLayout, src: &[u32], dst: &[u32]) -> Result<CopyPlan> {
        if src.len() != dst.len() {
            return Err(invalid(format!(
                "copy_slots: src has {} slots but dst has {}",
                src.len(),
                dst.len()
            )));
        }
        for (name, list) in [("src", src), ("dst", dst)] {
            if let Some((i, &s)) =
                list.iter().enumerate().find(|&(_, &s)| s as usize >= layout.num_slots)
            {
                return Err(invalid(format!(
                    "copy_slots: {name}[{i}] = {s} is out of range (num_slots = {})",
                    layout.num_slots
                )));
            }
        }
        let mut sorted_dst = dst.to_vec();
        sorted_dst.sort_unstable();
        if let Some(w) = sorted_dst.windows(2).find(|w| w[0] == w[1]) {
            return Err(invalid(format!(
                "copy_slots: destination slot {} appears more than once in dst",
                w[0]
            )));
        }

        let pairs: Vec<(u32, u32)> =
            src.iter().zip(dst).map(|(&s, &d)| (s, d)).filter(|&(s, d)| s != d).collect();
        let mut moving_dst: Vec<u32> = pairs.iter().map(|&(_, d)| d).collect();
        moving_dst.sort_unstable();
        let overlap = pairs.iter().any(|&(s, _)| moving_dst.binary_search(&s).is_ok());

        if !overlap {
            let pairs = pairs.iter().map(|&(s, d)| (s as usize, d as usize));
            return Ok(CopyPlan::Direct(coalesce(pairs)));
        }
        let gather = coalesce(pairs.iter().enumerate().map(|(i, &(s, _))| (s as usize, i)));
        let scatter = coalesce(pairs.iter().enumerate().map(|(i, &(_, d))| (i, d as usize)));
        Ok(CopyPlan::TwoPhase { gather, scatter, scratch_slots: pairs.len() })
    }
}

/// Merges `(src, dst)` index pairs into runs where both sides are consecutive. The pairs
/// are sorted by source first, so a shuffled list of adjacent slots still merges.
pub(crate) fn coalesce(pairs: impl Iterator<Item = (usize, usize)>) -> Vec<Run> {
    let mut pairs: Vec<(usize, usize)> = pairs.collect();
    pairs.sort_unstable();
    let mut runs: Vec<Run> = Vec::new();
    for (s, d) in pairs {
        match runs.last_mut() {
            Some(r) if r.src + r.len == s && r.dst + r.len == d => r.len += 1,
            _ => runs.push(Run { src: s, dst: d, len: 1 }),
        }
    }
    runs
}

/// Checks the arguments of `write_slot` / `read_slot`.
pub(crate) fn check_slot_io(
    layout: &KvLayout,
    op: &str,
    layer: usize,
    slot: u32,
    k_len: usize,
    v_len: usize,
) -> Result<()> {
    check_layer(layout, op, layer)?;
    if slot as usize >= layout.num_slots {
        return Err(invalid(format!(
            "{op}: slot {slot} is out of range (num_slots = {})",
            layout.num_slots
        )));
    }
    let want = layout.slot_bytes();
    for (name, len) in [("K", k_len), ("V", v_len)] {
        if len != want {
            return Err(invalid(format!(
                "{op}: {name} buffer has {len} bytes, a slot has {want} \
                 (num_kv_heads * head_dim * elem_bytes)"
            )));
        }
    }
    Ok(())
}

/// Checks a layer index.
pub(crate) fn check_layer(layout: &KvLayout, op: &str, layer: usize) -> Result<()> {
    if layer >= layout.num_layers {
        return Err(invalid(format!(
            "{op}: layer {layer} is out of range (num_layers = {})",
            layout.num_layers
        )));
    }
    Ok(())
}

/// Shorthand for an [`Error::Device`].
pub(crate) fn device(msg: impl Into<String>) -> Error {
    Error::Device(msg.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesce_merges_only_when_both_sides_are_consecutive() {
        let runs = coalesce([(0, 10), (1, 11), (2, 13), (3, 14), (7, 20)].into_iter());
        assert_eq!(
            runs,
            vec![
                Run { src: 0, dst: 10, len: 2 },
                Run { src: 2, dst: 13, len: 2 },
                Run { src: 7, dst: 20, len: 1 },
            ]
        );
        // Shuffled input merges the same way.
        let runs = coalesce([(3, 14), (0, 10), (2, 13), (1, 11)].into_iter());
        assert_eq!(runs.len(), 2);
    }

    #[test]
    fn plan_detects_overlap_and_drops_identity_pairs() {
        let l = KvLayout::new(1, 16, 1, 1, 1);
        match CopyPlan::new(&l, &[1, 2, 5], &[1, 7, 8]).unwrap() {
            CopyPlan::Direct(runs) => assert_eq!(
                runs,
                vec![Run { src: 2, dst: 7, len: 1 }, Run { src: 5, dst: 8, len: 1 }]
            ),
            p => panic!("expected a direct plan, got {p:?}"),
        }
        match CopyPlan::new(&l, &[1, 2], &[2, 3]).unwrap() {
            CopyPlan::TwoPhase { gather, scatter, scratch_slots } => {
                assert_eq!(scratch_slots, 2);
                assert_eq!(gather, vec![Run { src: 1, dst: 0, len: 2 }]);
                assert_eq!(scatter, vec![Run { src: 0, dst: 2, len: 2 }]);
            }
            p => panic!("expected a two-phase plan, got {p:?}"),
        }
    }
}
