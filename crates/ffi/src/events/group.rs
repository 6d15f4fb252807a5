//! The KV cache group a publisher's events belong to (an extension of version 1; issue 29):
//! `rkv_kv_group`, its default and `rkv_events_publish_ex`. `rkv_publisher_options` has no
//! size field, so it cannot grow: the group is a versioned struct of its own, passed next
//! to it.

use super::*;
use crate::args::read_sized;
use radixkv_core::events::wire::KvCacheSpecKind;

/// A KV cache group's kind, vLLM's `KVCacheSpecKind` (the `spec_kind` field of
/// `rkv_kv_group`, a `uint32_t`: other values are `RKV_INVALID_ARGUMENT`). Published as
/// `kv_cache_spec_kind` in every `BlockStored`, as the string each value names. A plain
/// value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_kv_cache_spec_kind {
    /// `"full_attention"` (the default).
    RKV_KV_FULL_ATTENTION = 0,
    /// `"mla_attention"`.
    RKV_KV_MLA_ATTENTION = 1,
    /// `"sliding_window"` (needs `sliding_window`).
    RKV_KV_SLIDING_WINDOW = 2,
    /// `"sliding_window_mla"` (needs `sliding_window`).
    RKV_KV_SLIDING_WINDOW_MLA = 3,
    /// `"mamba"`.
    RKV_KV_MAMBA = 4,
    /// `"chunked_local_attention"`.
    RKV_KV_CHUNKED_LOCAL_ATTENTION = 5,
    /// `"sink_full_attention"`.
    RKV_KV_SINK_FULL_ATTENTION = 6,
    /// `"encoder_only_attention"`.
    RKV_KV_ENCODER_ONLY_ATTENTION = 7,
    /// `"cross_attention"`.
    RKV_KV_CROSS_ATTENTION = 8,
    /// `"unknown"`.
    RKV_KV_UNKNOWN = 9,
}

// The C values are the core's kinds in order.
const _: () = assert!(
    KvCacheSpecKind::ALL.len() == rkv_kv_cache_spec_kind::RKV_KV_UNKNOWN as usize + 1
        && matches!(
            KvCacheSpecKind::ALL[rkv_kv_cache_spec_kind::RKV_KV_SLIDING_WINDOW as usize],
            KvCacheSpecKind::SlidingWindow
        )
        && matches!(
            KvCacheSpecKind::ALL[rkv_kv_cache_spec_kind::RKV_KV_MAMBA as usize],
            KvCacheSpecKind::Mamba
        )
);

/// The KV cache group a cache's events belong to (`rkv_events_publish_ex`): a hybrid
/// model keeps one cache per KV cache group, and each cache's publisher sends its group's
/// `group_idx` in every `BlockStored` and `BlockRemoved`, and its kind and sliding window
/// in every `BlockStored`. Get the defaults from `rkv_kv_group_default()` (group 0,
/// `RKV_KV_FULL_ATTENTION`, no window: what `rkv_events_publish` sends) and change fields.
/// A plain value: the caller owns it, and the call only reads it.
///
/// Versioned by `size`, as `rkv_insert_options`: it must be `sizeof(rkv_kv_group)` of this
/// header (16), which `rkv_kv_group_default()` sets; any other value is
/// `RKV_INVALID_ARGUMENT`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct rkv_kv_group {
    /// `sizeof(rkv_kv_group)`: 16.
    pub size: u32,
    /// The group's index, vLLM's `group_idx` (default 0). Any value.
    pub group_idx: u32,
    /// An `rkv_kv_cache_spec_kind` value (default `RKV_KV_FULL_ATTENTION`).
    pub spec_kind: u32,
    /// The window in tokens, `kv_cache_spec_sliding_window`: required (>= 1) with
    /// `RKV_KV_SLIDING_WINDOW` and `RKV_KV_SLIDING_WINDOW_MLA`, and 0 (none, sent as nil)
    /// with every other kind; else `RKV_INVALID_ARGUMENT`. Default 0.
    pub sliding_window: u32,
}

// No padding: every byte a caller passes is a field.
const _: () = assert!(std::mem::size_of::<rkv_kv_group>() == 16);

/// The default KV group: `size` set, group 0, `RKV_KV_FULL_ATTENTION`, no window (what
/// `rkv_events_publish` publishes). Returns a plain value. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_kv_group_default() -> rkv_kv_group {
    let d = KvGroup::default();
    rkv_kv_group {
        size: std::mem::size_of::<rkv_kv_group>() as u32,
        group_idx: d.idx(),
        spec_kind: rkv_kv_cache_spec_kind::RKV_KV_FULL_ATTENTION as u32,
        sliding_window: d.sliding_window().unwrap_or(0),
    }
}

/// The core's group for `*p` (NULL: the default group).
///
/// # Safety
/// `p` is NULL or points to a readable `rkv_kv_group` (or at least its `size` field).
pub(super) unsafe fn kv_group(p: *const rkv_kv_group) -> Res<KvGroup> {
    if p.is_null() {
        return Ok(KvGroup::default());
    }
    if !p.is_aligned() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("group = {p:p} is not aligned to {} bytes", align_of::<rkv_kv_group>()),
        ));
    }
    // SAFETY: non-null and aligned; the caller guarantees a readable `rkv_kv_group`.
    let g = unsafe { read_sized(p, "group", "rkv_kv_group") }?;
    let Some(&kind) = KvCacheSpecKind::ALL.get(g.spec_kind as usize) else {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!(
                "group->spec_kind = {} is not an rkv_kv_cache_spec_kind (0 = \
                 RKV_KV_FULL_ATTENTION ... 9 = RKV_KV_UNKNOWN)",
                g.spec_kind
            ),
        ));
    };
    let window = match (kind.has_window(), g.sliding_window) {
        (true, 0) => {
            return Err(fail(
                rkv_status::RKV_INVALID_ARGUMENT,
                format!(
                    "group->sliding_window = 0: spec kind {kind} needs its window (in tokens, \
                     >= 1)"
                ),
            ));
        }
        (_, 0) => None,
        (_, w) => Some(w),
    };
    KvGroup::new(g.group_idx, kind, window).map_err(|e| match e {
        // The refusal's own message (its field), not its text parsed back.
        radixkv_core::Error::InvalidArgument(m) => {
            fail(rkv_status::RKV_INVALID_ARGUMENT, format!("group: {m}"))
        }
        other => fail(rkv_status::RKV_INVALID_ARGUMENT, format!("group: {other}")),
    })
}

/// `rkv_events_publish` for a cache of KV cache group `*group` (NULL: the default group,
/// which makes this `rkv_events_publish`); an extension of version 1. Every `BlockStored`
/// the publisher sends carries the group's `group_idx`, `kv_cache_spec_kind` and
/// `kv_cache_spec_sliding_window`, every `BlockRemoved` its `group_idx`. `group` is only
/// read during the call. Besides `rkv_events_publish`'s refusals, `RKV_INVALID_ARGUMENT`
/// for a `group->size` other than `sizeof(rkv_kv_group)`, an unknown `spec_kind`, a
/// sliding kind without a window or another kind with one; nothing changed then.
/// Everything else as `rkv_events_publish`. Thread-safe.
///
/// # Safety
/// As `rkv_events_publish`; `group` NULL or a readable `rkv_kv_group`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_events_publish_ex(
    cache: *const rkv_cache,
    opts: *const rkv_publisher_options,
    group: *const rkv_kv_group,
    out_publisher: *mut *mut rkv_publisher,
) -> rkv_status {
    boundary("rkv_events_publish_ex", || {
        // SAFETY: the caller's contract is `publish_body`'s.
        unsafe { publish_body(cache, opts, group, out_publisher) }
    })
}
