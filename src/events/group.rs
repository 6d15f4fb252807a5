//! The KV cache group a cache's events belong to (vLLM's `group_idx`,
//! `kv_cache_spec_kind` and `kv_cache_spec_sliding_window`).
//!
//! A hybrid model in vLLM (sliding-window layers beside full-attention ones, or Mamba
//! layers) keeps several KV cache groups, and publishes each group's blocks with its own
//! `group_idx` and cache spec. radixkv keeps one cache per group: each cache publishes as
//! one [`KvGroup`], set on its publisher ([`super::wire::WireOptions::group`]). The default
//! group is what radixkv always sent: group 0, `"full_attention"`, no window.
//!
//! The kinds are vLLM's `KVCacheSpecKind` (`vllm/v1/kv_cache_interface.py`), string for
//! string, which is also the set Dynamo's decoder knows (`dynamo_kv_router::zmq_wire::
//! KvCacheSpecKind`). A group's sliding window is required with the two sliding-window
//! kinds and refused with every other: [`KvGroup::new`] says why, and nothing is made.

use crate::error::{Result, invalid};

/// A KV cache group's kind: vLLM's `KVCacheSpecKind`, published as
/// `kv_cache_spec_kind` in every `BlockStored`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvCacheSpecKind {
    /// `"full_attention"` (the default).
    #[default]
    FullAttention,
    /// `"mla_attention"`: multi-head latent attention (DeepSeek).
    MlaAttention,
    /// `"sliding_window"`: a window of the last tokens (needs the window).
    SlidingWindow,
    /// `"sliding_window_mla"`: sliding-window MLA (needs the window).
    SlidingWindowMla,
    /// `"mamba"`: a state-space layer's state.
    Mamba,
    /// `"chunked_local_attention"`.
    ChunkedLocalAttention,
    /// `"sink_full_attention"`: full attention with sink tokens.
    SinkFullAttention,
    /// `"encoder_only_attention"`.
    EncoderOnlyAttention,
    /// `"cross_attention"`: encoder-decoder cross attention.
    CrossAttention,
    /// `"unknown"`: vLLM's name for a spec it cannot classify (and the decoder's for a
    /// string it does not know).
    Unknown,
}

impl KvCacheSpecKind {
    /// Every kind, in vLLM's order (the C ABI's `rkv_kv_cache_spec_kind` numbers them so).
    pub const ALL: [KvCacheSpecKind; 10] = [
        KvCacheSpecKind::FullAttention,
        KvCacheSpecKind::MlaAttention,
        KvCacheSpecKind::SlidingWindow,
        KvCacheSpecKind::SlidingWindowMla,
        KvCacheSpecKind::Mamba,
        KvCacheSpecKind::ChunkedLocalAttention,
        KvCacheSpecKind::SinkFullAttention,
        KvCacheSpecKind::EncoderOnlyAttention,
        KvCacheSpecKind::CrossAttention,
        KvCacheSpecKind::Unknown,
    ];

    /// The wire string (vLLM's enum value).
    pub fn as_str(self) -> &'static str {
        match self {
            KvCacheSpecKind::FullAttention => "full_attention",
            KvCacheSpecKind::MlaAttention => "mla_attention",
            KvCacheSpecKind::SlidingWindow => "sliding_window",
            KvCacheSpecKind::SlidingWindowMla => "sliding_window_mla",
            KvCacheSpecKind::Mamba => "mamba",
            KvCacheSpecKind::ChunkedLocalAttention => "chunked_local_attention",
            KvCacheSpecKind::SinkFullAttention => "sink_full_attention",
            KvCacheSpecKind::EncoderOnlyAttention => "encoder_only_attention",
            KvCacheSpecKind::CrossAttention => "cross_attention",
            KvCacheSpecKind::Unknown => "unknown",
        }
    }

    /// The kind a wire string names; `InvalidArgument` for another string (what a front
    /// door gives a caller; the decoder reads an unknown string as [`Self::Unknown`]).
    pub fn from_name(s: &str) -> Result<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| {
            let names: Vec<_> = Self::ALL.iter().map(|k| k.as_str()).collect();
            invalid(format!("unknown kv_cache_spec_kind {s:?} (one of {})", names.join(", ")))
        })
    }

    /// Whether a group of this kind has a sliding window (`sliding_window`,
    /// `sliding_window_mla`): its window is required, and refused for every other kind.
    pub fn has_window(self) -> bool {
        matches!(self, KvCacheSpecKind::SlidingWindow | KvCacheSpecKind::SlidingWindowMla)
    }

    /// Whether a prefix router indexes this kind's blocks: attention over the whole prefix
    /// (`full_attention`, `mla_attention`, `sink_full_attention`), Dynamo's "main
    /// attention" (`KvCacheSpecKind::is_main_attention` in `dynamo-kv-router`). A window's
    /// or a state's blocks do not say that a prefix is cached.
    pub fn is_main_attention(self) -> bool {
        matches!(
            self,
            KvCacheSpecKind::FullAttention
                | KvCacheSpecKind::MlaAttention
                | KvCacheSpecKind::SinkFullAttention
        )
    }
}

impl std::fmt::Display for KvCacheSpecKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The KV cache group a cache publishes as: its `group_idx`, kind and sliding window.
/// Always consistent (made by [`KvGroup::new`]); the default is group 0,
/// `"full_attention"`, no window, which publishes the bytes radixkv always sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KvGroup {
    idx: u32,
    kind: KvCacheSpecKind,
    sliding_window: Option<u32>,
}

impl KvGroup {
    /// Group `idx` of `kind`, with `sliding_window` tokens when the kind has a window.
    /// `InvalidArgument` for a window missing with `sliding_window`/`sliding_window_mla`,
    /// a window given with another kind, or a window of 0.
    pub fn new(idx: u32, kind: KvCacheSpecKind, sliding_window: Option<u32>) -> Result<Self> {
        match (kind.has_window(), sliding_window) {
            (true, None) => Err(invalid(format!(
                "KV group: kv_cache_spec_kind {kind} needs its sliding window (in tokens)"
            ))),
            (true, Some(0)) => Err(invalid("KV group: a sliding window of 0 tokens")),
            (false, Some(w)) => Err(invalid(format!(
                "KV group: a sliding window ({w}) only goes with kv_cache_spec_kind \
                 sliding_window or sliding_window_mla, not {kind}"
            ))),
            _ => Ok(KvGroup { idx, kind, sliding_window }),
        }
    }

    /// The group's index (`group_idx`).
    pub fn idx(&self) -> u32 {
        self.idx
    }

    /// The group's kind (`kv_cache_spec_kind`).
    pub fn kind(&self) -> KvCacheSpecKind {
        self.kind
    }

    /// The window in tokens (`kv_cache_spec_sliding_window`), with a sliding-window kind.
    pub fn sliding_window(&self) -> Option<u32> {
        self.sliding_window
    }
}

/// The group fields one decoded event carried (each `None` when absent or nil; an
/// `AllBlocksCleared` carries none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventGroup {
    /// `group_idx`.
    pub group_idx: Option<u32>,
    /// `kv_cache_spec_kind` (a string radixkv does not know reads as
    /// [`KvCacheSpecKind::Unknown`], as Dynamo's decoder reads it).
    pub kind: Option<KvCacheSpecKind>,
    /// `kv_cache_spec_sliding_window`.
    pub sliding_window: Option<u32>,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_vllms_strings_and_round_trip() {
        let names: Vec<_> = KvCacheSpecKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "full_attention",
                "mla_attention",
                "sliding_window",
                "sliding_window_mla",
                "mamba",
                "chunked_local_attention",
                "sink_full_attention",
                "encoder_only_attention",
                "cross_attention",
                "unknown",
            ]
        );
        for k in KvCacheSpecKind::ALL {
            assert_eq!(KvCacheSpecKind::from_name(k.as_str()).unwrap(), k);
        }
        let e = KvCacheSpecKind::from_name("Full_Attention").unwrap_err().to_string();
        assert!(e.contains("unknown kv_cache_spec_kind") && e.contains("mamba"), "{e}");
    }

    #[test]
    fn a_window_goes_with_the_sliding_kinds_only() {
        use KvCacheSpecKind::*;
        assert_eq!(KvGroup::default(), KvGroup::new(0, FullAttention, None).unwrap());
        let g = KvGroup::new(2, SlidingWindow, Some(4096)).unwrap();
        assert_eq!((g.idx(), g.kind(), g.sliding_window()), (2, SlidingWindow, Some(4096)));
        assert!(KvGroup::new(1, SlidingWindowMla, Some(1)).is_ok());
        assert!(KvGroup::new(1, Mamba, None).is_ok());
        let err = |r: Result<KvGroup>| r.unwrap_err().to_string();
        assert!(err(KvGroup::new(1, SlidingWindow, None)).contains("needs its sliding window"));
        assert!(err(KvGroup::new(1, SlidingWindowMla, None)).contains("needs"));
        assert!(err(KvGroup::new(1, SlidingWindow, Some(0))).contains("0 tokens"));
        for k in KvCacheSpecKind::ALL.into_iter().filter(|k| !k.has_window()) {
            assert!(err(KvGroup::new(0, k, Some(128))).contains("only goes with"), "{k}");
        }
    }

    #[test]
    fn main_attention_is_dynamos_set() {
        let main: Vec<_> =
            KvCacheSpecKind::ALL.into_iter().filter(|k| k.is_main_attention()).collect();
        assert_eq!(
            main,
            [
                KvCacheSpecKind::FullAttention,
                KvCacheSpecKind::MlaAttention,
                KvCacheSpecKind::SinkFullAttention
            ]
        );
    }
}
