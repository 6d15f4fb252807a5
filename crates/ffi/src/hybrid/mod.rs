//! The hybrid tree in the C ABI (an extension of version 1): `rkv_hybrid`, a handle owning
//! one [`HybridTree`] (SGLang 0.5.23's `UnifiedRadixCache` tree with its components FULL,
//! SWA and Mamba, see `radixkv::hybrid`) behind a mutex, so every function taking
//! `const rkv_hybrid *` is thread-safe (calls are serialized). Same conventions as the rest
//! of the ABI: a literal `#[unsafe(no_mangle)] extern "C"` item per function, the panic
//! boundary, a numbered status, outputs only on `RKV_OK` (and `*out_len` on
//! `RKV_BUFFER_TOO_SMALL`), every pointer checked, a message for every failure.
//!
//! Callbacks (`rkv_hybrid_action_fn`, `rkv_hybrid_free_fn`) run after the tree's mutex is
//! released, on the calling thread, before the call returns: they may call back into the
//! same tree (an `SWA_REBUILD` action stores its values with `rkv_hybrid_swa_set_value`).
//!
//! This file: the types, the handle's life, match, collect, the request lock and its
//! release, sizes, check and reset. `ops.rs`: insert, the SWA values and window, eviction.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

use radixkv_core::hybrid::{HybridOptions, HybridTree, NodeId};

use crate::args::{check_out, check_out_array, input, read_sized, write_array};
use crate::boundary::{Res, boundary, fail, st};
use crate::types::rkv_status;

mod ops;
pub use ops::*;

#[cfg(test)]
mod tests;

/// A hybrid tree's node id (SGLang's node id): stable for the node's life, never reused
/// within a tree (a split gives the new prefix node a fresh id). A plain value, valid only
/// with the tree that made it; a node the tree no longer holds is `RKV_INVALID_ARGUMENT`.
pub type rkv_hybrid_node = u64;

/// A component of a hybrid tree (the `component` arguments, `uint32_t`s: other values are
/// `RKV_INVALID_ARGUMENT`). A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_hybrid_component {
    /// Full attention's KV (every tree has it): indices of the FULL pool.
    RKV_HYBRID_FULL = 0,
    /// Sliding-window attention's KV (a tree made with `swa_window > 0`). SWA slots are
    /// named by the FULL indices of the same tokens, as SGLang frees them.
    RKV_HYBRID_SWA = 1,
    /// Mamba's recurrent states (a tree made with `mamba = 1`): Mamba pool slots.
    RKV_HYBRID_MAMBA = 2,
}

/// The component numbered `n`, if one is.
pub(crate) fn component_of(n: u32) -> Option<rkv_hybrid_component> {
    use rkv_hybrid_component::*;
    [RKV_HYBRID_FULL, RKV_HYBRID_SWA, RKV_HYBRID_MAMBA].into_iter().find(|&c| c as u32 == n)
}

/// What a hybrid tree is made with (`rkv_hybrid_new`). Get the defaults from
/// `rkv_hybrid_options_default()` (page 1, ids from 1, FULL only) and change fields. A
/// plain value: the caller owns it, and the call only reads it.
///
/// Versioned by `size`, as `rkv_kv_group`: it must be `sizeof(rkv_hybrid_options)` of this
/// header (32), which `rkv_hybrid_options_default()` sets; any other value is
/// `RKV_INVALID_ARGUMENT`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct rkv_hybrid_options {
    /// `sizeof(rkv_hybrid_options)`: 32.
    pub size: u32,
    /// 1: the tree has a Mamba component (one recurrent state per node where a sequence
    /// ended); 0: none (the default). Other values are `RKV_INVALID_ARGUMENT`.
    pub mamba: u32,
    /// Tokens per page, >= 1 (default 1): keys are matched and inserted in whole pages.
    pub page_size: u64,
    /// The first node id handed out (the root's; default 1).
    pub first_id: u64,
    /// SGLang's `swa_retain_window` in tokens: > 0 adds the SWA component; 0 none (the
    /// default).
    pub swa_window: u64,
}

// No padding: every byte a caller passes is a field.
const _: () = assert!(std::mem::size_of::<rkv_hybrid_options>() == 32);

/// What `rkv_hybrid_match` matched: a plain value the caller owns and the call writes
/// (whole, on `RKV_OK` only).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rkv_hybrid_match_result {
    /// Tokens matched with every component valid (SGLang's `device_indices` length): what
    /// the request may reuse.
    pub device_prefix_len: usize,
    /// Tokens whose FULL KV is on the device (SGLang's `full_kv_hit_length`), at least
    /// `device_prefix_len`.
    pub full_hit_len: usize,
    /// The deepest node of the reusable prefix (the root when `device_prefix_len` is 0):
    /// what `rkv_hybrid_lock` and `rkv_hybrid_collect` take.
    pub last_device_node: rkv_hybrid_node,
    /// The last node the walk visited, when `has_last_visited` is 1 (else 0).
    pub last_visited: rkv_hybrid_node,
    /// 1 when the walk visited a node past the root (`last_visited` is it), else 0.
    pub has_last_visited: u32,
    /// Always 0.
    pub reserved: u32,
}

/// A request's lock on a hybrid tree (`rkv_hybrid_lock`), the receipt its release
/// (`rkv_hybrid_unlock`, `rkv_hybrid_release_window`) takes: a plain value the caller
/// owns. Each receipt is released once: a second `rkv_hybrid_unlock` of it is
/// `RKV_INVALID_LOCK`, and so is another tree's receipt (ids carry a per-tree tag).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rkv_hybrid_receipt {
    /// The receipt's number in its tree (never 0).
    pub id: u64,
    /// The node the lock is anchored on.
    pub node: rkv_hybrid_node,
    /// The SWA window lock's boundary stamp (SGLang's `lock_uuid`; 0: no SWA component,
    /// or the window segment reached the root).
    pub swa_uuid: u64,
}

/// A hybrid tree's sizes per component (`rkv_hybrid_sizes_get`): FULL and SWA in tokens,
/// Mamba in state slots; evictable is held by no lock, protected by one. A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rkv_hybrid_sizes {
    /// FULL tokens held by no lock.
    pub full_evictable: u64,
    /// FULL tokens on a locked path.
    pub full_protected: u64,
    /// SWA tokens held by no window lock (0 without SWA).
    pub swa_evictable: u64,
    /// SWA tokens under a window lock.
    pub swa_protected: u64,
    /// Mamba state slots held by no lock (0 without Mamba).
    pub mamba_evictable: u64,
    /// Mamba state slots under a lock.
    pub mamba_protected: u64,
}

/// Receives indices a hybrid tree call frees (`rkv_hybrid_evict`,
/// `rkv_hybrid_release_window`, `rkv_hybrid_mamba_evict_excess`, `rkv_hybrid_reset`):
/// `indices[0..len]` of `component` (an `rkv_hybrid_component` value; SWA slots are named
/// by their FULL indices), valid only during the call (copy what you keep); the caller
/// frees them in that component's pool. Called on the calling thread after the tree's
/// mutex is released, so it may call into the same tree; every freed index is passed
/// exactly once. It must return normally (no longjmp, no C++ exception).
pub type rkv_hybrid_free_fn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, component: u32, indices: *const i64, len: usize)>;

/// A hybrid tree: an opaque object created by `rkv_hybrid_new` and destroyed by
/// `rkv_hybrid_free`. Every function taking `const rkv_hybrid *` is safe to call from many
/// threads at once (the tree is sequential: the calls take one mutex in turn);
/// `rkv_hybrid_free` must not run concurrently with any other call on the same tree.
pub struct rkv_hybrid {
    pub(crate) inner: Mutex<Inner>,
}

/// What the mutex guards: the tree and the live receipts.
pub(crate) struct Inner {
    pub(crate) tree: HybridTree,
    /// Live receipts by id: what each still holds.
    pub(crate) receipts: HashMap<u64, Held>,
    /// The next receipt id: this tree's tag in the high 24 bits, a count below.
    pub(crate) next_receipt: u64,
}

/// Bits of a receipt id below the tree's tag.
const RECEIPT_COUNT_BITS: u32 = 40;

/// Tags of trees, so that another tree's receipt is refused: the next one (24 bits, never
/// 0; it comes back after 2^24 - 1 trees were made).
static NEXT_TAG: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The first receipt id of a new tree.
fn first_receipt() -> u64 {
    let n = NEXT_TAG.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tag = n % ((1 << 24) - 1) + 1;
    (tag << RECEIPT_COUNT_BITS) | 1
}

/// What a live receipt still holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    pub(crate) node: NodeId,
    pub(crate) swa_uuid: u64,
    /// The SWA window lock (until `rkv_hybrid_release_window` or the unlock).
    pub(crate) swa: bool,
    /// The Mamba lock (likewise).
    pub(crate) mamba: bool,
}

/// The tree behind `p`, locked.
///
/// # Safety
/// `p` is NULL or was returned by `rkv_hybrid_new` and not yet freed, and no
/// `rkv_hybrid_free` of it runs during `'a`.
pub(crate) unsafe fn hybrid_lock<'a>(p: *const rkv_hybrid) -> Res<MutexGuard<'a, Inner>> {
    if p.is_null() {
        return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "tree is NULL"));
    }
    if !p.is_aligned() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("tree = {p:p} is misaligned: not a pointer rkv_hybrid_new returned"),
        ));
    }
    // SAFETY: non-null and aligned; by the caller's contract it points to a live
    // `rkv_hybrid` made by `rkv_hybrid_new` (a `Box`), which nobody frees during 'a. Only
    // shared references to it are made while it is published.
    let h: &'a rkv_hybrid = unsafe { &*p };
    h.inner.lock().map_err(|_| {
        fail(
            rkv_status::RKV_INTERNAL_ERROR,
            "the tree's mutex is poisoned: an earlier call panicked while holding it (a bug, \
             please report it); the tree refuses every call but rkv_hybrid_free",
        )
    })
}

/// The component behind `n`, refused when it is not one or not in the tree.
pub(crate) fn tree_component(t: &HybridTree, n: u32, name: &str) -> Res<rkv_hybrid_component> {
    use rkv_hybrid_component::*;
    let Some(c) = component_of(n) else {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!(
                "{name} = {n} is not an rkv_hybrid_component (0 = RKV_HYBRID_FULL, 1 = \
                 RKV_HYBRID_SWA, 2 = RKV_HYBRID_MAMBA)"
            ),
        ));
    };
    let missing = match c {
        RKV_HYBRID_FULL => None,
        RKV_HYBRID_SWA => (t.swa_window() == 0).then_some("made with swa_window = 0"),
        RKV_HYBRID_MAMBA => (!t.has_mamba()).then_some("made with mamba = 0"),
    };
    if let Some(why) = missing {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("{name} = {c:?}: this tree has no such component ({why})"),
        ));
    }
    Ok(c)
}

/// `node`, refused when the tree does not hold it.
pub(crate) fn live(t: &HybridTree, node: NodeId, name: &str) -> Res<()> {
    t.is_root(node)
        .map(|_| ())
        .map_err(|e| fail(rkv_status::from(&e), format!("{name} = {node}: {e}")))
}

/// Calls `f` for each `(component, indices)` in `frees` (non-empty ones), if `f` is set.
///
/// # Safety
/// `f` is NULL or a function safe to call with `ctx` and an index array.
pub(crate) unsafe fn tell_frees(
    f: rkv_hybrid_free_fn,
    ctx: *mut c_void,
    frees: &[(rkv_hybrid_component, Vec<i64>)],
) {
    let Some(f) = f else { return };
    for (c, v) in frees {
        if !v.is_empty() {
            // SAFETY: the caller guarantees `f` may be called with `ctx` and an array; `v`
            // is a live slice for the duration of the call.
            unsafe { f(ctx, *c as u32, v.as_ptr(), v.len()) }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Life.

/// The default hybrid options: `size = sizeof(rkv_hybrid_options)`, page 1, node ids from
/// 1, no SWA window, no Mamba (a FULL-only tree). Returns a plain value. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_hybrid_options_default() -> rkv_hybrid_options {
    let d = HybridOptions::default();
    rkv_hybrid_options {
        size: size_of::<rkv_hybrid_options>() as u32,
        mamba: u32::from(d.mamba),
        page_size: d.page_size as u64,
        first_id: d.first_id,
        swa_window: d.swa_window as u64,
    }
}

/// Creates a hybrid tree from `*opts` (required; read only during the call) and writes it
/// to `*out_tree` (required). The caller owns the new tree and frees it with
/// `rkv_hybrid_free`. `RKV_INVALID_ARGUMENT` for `opts->size` other than
/// `sizeof(rkv_hybrid_options)`, page_size 0, a mamba other than 0 or 1, or a page size or
/// window that does not fit this platform's `size_t`. Thread-safe.
///
/// # Safety
/// `opts` is NULL or points to a readable `rkv_hybrid_options` (or at least its `size`);
/// `out_tree` is NULL or points to a writable `rkv_hybrid *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_new(
    opts: *const rkv_hybrid_options,
    out_tree: *mut *mut rkv_hybrid,
) -> rkv_status {
    boundary("rkv_hybrid_new", || {
        if opts.is_null() {
            return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "opts is NULL"));
        }
        check_out(opts.cast_mut(), "opts")?;
        check_out(out_tree, "out_tree")?;
        // SAFETY: non-null and aligned; the caller guarantees a readable struct.
        let o = unsafe { read_sized(opts, "opts", "rkv_hybrid_options") }?;
        let bad = |m: String| Err(fail(rkv_status::RKV_INVALID_ARGUMENT, m));
        if o.mamba > 1 {
            return bad(format!("opts->mamba = {} must be 0 or 1", o.mamba));
        }
        let Ok(page_size) = usize::try_from(o.page_size) else {
            return bad(format!("opts->page_size = {} does not fit size_t", o.page_size));
        };
        let Ok(swa_window) = usize::try_from(o.swa_window) else {
            return bad(format!("opts->swa_window = {} does not fit size_t", o.swa_window));
        };
        let hopts =
            HybridOptions { page_size, first_id: o.first_id, swa_window, mamba: o.mamba == 1 };
        let tree =
            HybridTree::new(hopts).map_err(|e| fail(rkv_status::from(&e), format!("opts: {e}")))?;
        let raw = Box::into_raw(Box::new(rkv_hybrid {
            inner: Mutex::new(Inner {
                tree,
                receipts: HashMap::new(),
                next_receipt: first_receipt(),
            }),
        }));
        // SAFETY: `out_tree` passed `check_out` and is writable by the caller's contract.
        unsafe { out_tree.write(raw) };
        Ok(())
    })
}

/// Destroys a hybrid tree and everything it owns (its receipts become meaningless; the
/// indices it held are not reported: evict or reset with a callback first if you need
/// them back). NULL is a no-op. Must not run concurrently with any other call on the same
/// tree, and the tree must not be used afterwards. Leaves `rkv_last_error_message()` as it
/// is.
///
/// # Safety
/// `tree` is NULL or was returned by `rkv_hybrid_new` and not freed yet, and no other call
/// on it runs concurrently or follows.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_free(tree: *mut rkv_hybrid) {
    if tree.is_null() || !tree.is_aligned() {
        return;
    }
    // SAFETY: `tree` came from `Box::into_raw` in `rkv_hybrid_new` and, by the caller's
    // contract, is freed once and used by no one else now, so we own it again.
    let owned = unsafe { Box::from_raw(tree) };
    // Dropping plain data cannot panic in practice; contain it anyway.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(owned)));
}

/// Writes the root's node id to `*out_node` (required): the `until` of a collect from the
/// root. Thread-safe.
///
/// # Safety
/// `tree` is NULL or live; `out_node` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_root(
    tree: *const rkv_hybrid,
    out_node: *mut rkv_hybrid_node,
) -> rkv_status {
    boundary("rkv_hybrid_root", || {
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let g = unsafe { hybrid_lock(tree) }?;
        check_out(out_node, "out_node")?;
        let root = g.tree.root();
        drop(g);
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_node.write(root) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Match and collect.

/// Matches `key[0..len]` in namespace `ns` (SGLang's `match_prefix`; whole pages only):
/// splits the node the match ends inside and stamps the matched path, so it changes the
/// tree (eviction order). Writes the result to `*out` (required). `key` may be NULL when
/// `len == 0` (then the result is the root, 0 tokens). Thread-safe.
///
/// # Safety
/// `tree` is NULL or live; `key[0..len]` readable (or NULL); `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_match(
    tree: *const rkv_hybrid,
    ns: u32,
    key: *const i64,
    len: usize,
    out: *mut rkv_hybrid_match_result,
) -> rkv_status {
    boundary("rkv_hybrid_match", || {
        // SAFETY: the caller guarantees key[0..len] is readable (or NULL).
        let k = unsafe { input(key, len, "key", "len") }?;
        check_out(out, "out")?;
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let mut g = unsafe { hybrid_lock(tree) }?;
        let m = g.tree.match_prefix(ns, k);
        drop(g);
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out.write(match_result(&m)) };
        Ok(())
    })
}

fn match_result(m: &radixkv_core::hybrid::HybridMatch) -> rkv_hybrid_match_result {
    rkv_hybrid_match_result {
        device_prefix_len: m.device_prefix_len,
        full_hit_len: m.full_hit_len,
        last_device_node: m.last_device_node,
        last_visited: m.last_visited.unwrap_or(0),
        has_last_visited: u32::from(m.last_visited.is_some()),
        reserved: 0,
    }
}

/// `rkv_hybrid_match`, then `rkv_hybrid_lock` on the match's `last_device_node`, under one
/// hold of the tree's mutex: no other thread's eviction can take the matched prefix in
/// between. Writes the match to `*out` and the receipt to `*out_lock` (both required);
/// release the receipt exactly once with `rkv_hybrid_unlock`. Thread-safe.
///
/// # Safety
/// As `rkv_hybrid_match`; `out_lock` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_match_lock(
    tree: *const rkv_hybrid,
    ns: u32,
    key: *const i64,
    len: usize,
    out: *mut rkv_hybrid_match_result,
    out_lock: *mut rkv_hybrid_receipt,
) -> rkv_status {
    boundary("rkv_hybrid_match_lock", || {
        // SAFETY: the caller guarantees key[0..len] is readable (or NULL).
        let k = unsafe { input(key, len, "key", "len") }?;
        check_out(out, "out")?;
        check_out(out_lock, "out_lock")?;
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let mut g = unsafe { hybrid_lock(tree) }?;
        let m = g.tree.match_prefix(ns, k);
        let lock = take_lock(&mut g, m.last_device_node)?;
        drop(g);
        // SAFETY: both passed `check_out`; writable by the caller's contract.
        unsafe {
            out.write(match_result(&m));
            out_lock.write(lock);
        }
        Ok(())
    })
}

/// Writes the FULL device indices from node `from` up to, not including, its ancestor
/// `until` (the root: the whole path), in root order, to `out[0..*out_len]`, and their
/// number to `*out_len` (required). `out` may be NULL when `cap == 0`: then only `*out_len`
/// is written and the status is `RKV_OK`. If `cap > 0` is smaller than the path, returns
/// `RKV_BUFFER_TOO_SMALL` with the length in `*out_len` (nothing else written).
/// `RKV_INVALID_ARGUMENT` for a node the tree does not hold or an `until` that is not an
/// ancestor of `from` (or `from` itself: 0 indices). Thread-safe.
///
/// # Safety
/// `tree` is NULL or live; `out[0..cap]` writable (or NULL); `out_len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_collect(
    tree: *const rkv_hybrid,
    from: rkv_hybrid_node,
    until: rkv_hybrid_node,
    out: *mut i64,
    cap: usize,
    out_len: *mut usize,
) -> rkv_status {
    boundary("rkv_hybrid_collect", || {
        check_out_array(out, cap, "out", "cap")?;
        check_out(out_len, "out_len")?;
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let g = unsafe { hybrid_lock(tree) }?;
        let chunks = g.tree.collect_indices(from, until).map_err(st)?;
        let n: usize = chunks.iter().map(|c| c.len()).sum();
        if cap > 0 && n > cap {
            // SAFETY: `out_len` passed `check_out`; writable by the caller's contract.
            unsafe { out_len.write(n) };
            return Err(fail(
                rkv_status::RKV_BUFFER_TOO_SMALL,
                format!(
                    "cap = {cap} is smaller than the path's {n} indices (*out_len = {n}; pass \
                     cap = 0 for the length only)"
                ),
            ));
        }
        if cap > 0 {
            let mut at = 0;
            for c in chunks {
                // SAFETY: `out[0..cap]` passed `check_out_array`, `at + c.len() <= n <= cap`,
                // and the tree's values cannot overlap the caller's buffer.
                unsafe { write_array(out.add(at), c) };
                at += c.len();
            }
        }
        drop(g);
        // SAFETY: as above.
        unsafe { out_len.write(n) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// The request lock.

/// Locks `node` over every component of the tree (FULL path, SWA window, Mamba node) and
/// records the receipt; a refusal (a node the tree does not hold) changes nothing, and a
/// failure midway undoes what was taken.
pub(crate) fn take_lock(inner: &mut Inner, node: NodeId) -> Res<rkv_hybrid_receipt> {
    let t = &mut inner.tree;
    live(t, node, "node")?;
    let (swa, mamba) = (t.swa_window() > 0, t.has_mamba());
    t.inc_lock_ref(node).map_err(st)?;
    let mut uuid = 0;
    if swa {
        match t.swa_inc_lock(node) {
            Ok(u) => uuid = u,
            Err(e) => {
                let _ = t.dec_lock_ref(node);
                return Err(st(e));
            }
        }
    }
    if mamba && let Err(e) = t.mamba_inc_lock(node) {
        if swa {
            let _ = t.swa_dec_lock(node, uuid);
        }
        let _ = t.dec_lock_ref(node);
        return Err(st(e));
    }
    let id = inner.next_receipt;
    // 2^40 receipts per tree: the count never reaches the tag's bits in practice.
    inner.next_receipt += 1;
    inner.receipts.insert(id, Held { node, swa_uuid: uuid, swa, mamba });
    Ok(rkv_hybrid_receipt { id, node, swa_uuid: uuid })
}

/// Locks `node` for a request as SGLang's controller does (`inc_lock_ref` over every
/// component): FULL on the node's root path, the SWA window lock back from the node when the
/// tree has SWA, the Mamba lock on the node alone when it has Mamba. Writes the receipt to
/// `*out` (required); release it exactly once with `rkv_hybrid_unlock`. A lock on the
/// root locks nothing and still gives a receipt. `RKV_INVALID_ARGUMENT` for a node the
/// tree does not hold; a refusal changes nothing. Thread-safe.
///
/// # Safety
/// `tree` is NULL or live; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_lock(
    tree: *const rkv_hybrid,
    node: rkv_hybrid_node,
    out: *mut rkv_hybrid_receipt,
) -> rkv_status {
    boundary("rkv_hybrid_lock", || {
        check_out(out, "out")?;
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let mut g = unsafe { hybrid_lock(tree) }?;
        let r = take_lock(&mut g, node)?;
        drop(g);
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out.write(r) };
        Ok(())
    })
}

/// The live receipt `*r` names, checked: its id live and its node and stamp the lock's.
pub(crate) fn held(inner: &Inner, r: &rkv_hybrid_receipt) -> Res<Held> {
    match inner.receipts.get(&r.id) {
        Some(h) if h.node == r.node && h.swa_uuid == r.swa_uuid => Ok(*h),
        Some(h) => Err(fail(
            rkv_status::RKV_INVALID_LOCK,
            format!(
                "receipt {} names node {} stamp {}, but the lock it stands for is on node {} \
                 stamp {} (a receipt releases only what its lock returned)",
                r.id, r.node, r.swa_uuid, h.node, h.swa_uuid
            ),
        )),
        None => Err(fail(
            rkv_status::RKV_INVALID_LOCK,
            format!(
                "receipt {} is not a live lock of this tree (released already, reset since, \
                 another tree's, or never handed out)",
                r.id
            ),
        )),
    }
}

/// Reads the receipt `p` (required).
///
/// # Safety
/// `p` is NULL or points to a readable `rkv_hybrid_receipt`.
pub(crate) unsafe fn read_receipt(p: *const rkv_hybrid_receipt) -> Res<rkv_hybrid_receipt> {
    if p.is_null() {
        return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "receipt is NULL"));
    }
    check_out(p.cast_mut(), "receipt")?;
    // SAFETY: non-null and aligned; readable by the caller's contract (plain integers).
    Ok(unsafe { p.read() })
}

/// Releases the lock of receipt `*receipt` (required; read only), as SGLang's controller
/// does (`dec_lock_ref`): the Mamba lock, then the SWA window lock (those still held: not
/// after `rkv_hybrid_release_window`), then FULL. `RKV_INVALID_LOCK` for a receipt that is
/// not live (released already, from before a reset, or another tree's) or whose fields
/// were changed; nothing changes then. Thread-safe.
///
/// # Safety
/// `tree` is NULL or live; `receipt` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_unlock(
    tree: *const rkv_hybrid,
    receipt: *const rkv_hybrid_receipt,
) -> rkv_status {
    boundary("rkv_hybrid_unlock", || {
        // SAFETY: the caller passes NULL or a readable receipt.
        let r = unsafe { read_receipt(receipt) }?;
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let mut g = unsafe { hybrid_lock(tree) }?;
        let inner = &mut *g;
        let h = held(inner, &r)?;
        let t = &mut inner.tree;
        // The tree checks each release before it changes anything; a lock the receipt
        // holds is there, so these succeed (a failure is a bug, reported as is).
        if h.mamba {
            t.mamba_dec_lock(h.node).map_err(st)?;
            inner.receipts.get_mut(&r.id).expect("live").mamba = false;
        }
        if h.swa {
            t.swa_dec_lock(h.node, h.swa_uuid).map_err(st)?;
            inner.receipts.get_mut(&r.id).expect("live").swa = false;
        }
        t.dec_lock_ref(h.node).map_err(st)?;
        inner.receipts.remove(&r.id);
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Sizes, check, reset.

/// Writes the tree's sizes per component to `*out` (required). Thread-safe.
///
/// # Safety
/// `tree` is NULL or live; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_sizes_get(
    tree: *const rkv_hybrid,
    out: *mut rkv_hybrid_sizes,
) -> rkv_status {
    boundary("rkv_hybrid_sizes_get", || {
        check_out(out, "out")?;
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let g = unsafe { hybrid_lock(tree) }?;
        let (f, s, m) = (g.tree.sizes(), g.tree.swa_sizes(), g.tree.mamba_sizes());
        drop(g);
        let r = rkv_hybrid_sizes {
            full_evictable: f.evictable,
            full_protected: f.protected,
            swa_evictable: s.evictable,
            swa_protected: s.protected,
            mamba_evictable: m.evictable,
            mamba_protected: m.protected,
        };
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out.write(r) };
        Ok(())
    })
}

/// Checks the tree's consistency (sizes against a recount, leaves, lock refs, parent
/// links, the LRU lists): `RKV_OK`, or `RKV_INTERNAL_ERROR` (a bug) with the first problem
/// found as the message. For tests and debugging: it walks every node. Thread-safe.
///
/// # Safety
/// `tree` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_check(tree: *const rkv_hybrid) -> rkv_status {
    boundary("rkv_hybrid_check", || {
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let g = unsafe { hybrid_lock(tree) }?;
        match g.tree.check() {
            None => Ok(()),
            Some(why) => Err(fail(rkv_status::RKV_INTERNAL_ERROR, why)),
        }
    })
}

/// Drops every node, locked ones too (the new root gets a fresh id; every receipt becomes
/// invalid: `rkv_hybrid_unlock` refuses it with `RKV_INVALID_LOCK`). `on_free(ctx, ..)`, if
/// not NULL, receives everything the tree held, after the mutex is released: each node's
/// FULL indices, its SWA slots (by FULL index) where it had an SWA value, its Mamba state.
/// With NULL nothing is reported. Thread-safe.
///
/// # Safety
/// `tree` is NULL or live; `on_free` NULL or a function safe to call with `ctx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_reset(
    tree: *const rkv_hybrid,
    on_free: rkv_hybrid_free_fn,
    ctx: *mut c_void,
) -> rkv_status {
    boundary("rkv_hybrid_reset", || {
        use rkv_hybrid_component::*;
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let mut g = unsafe { hybrid_lock(tree) }?;
        let inner = &mut *g;
        let mut frees = Vec::new();
        if on_free.is_some() {
            let t = &inner.tree;
            for n in t.dfs() {
                let full = t.value(n).map_err(st)?.map(<[i64]>::to_vec).unwrap_or_default();
                if t.swa_value(n).map_err(st)?.is_some() {
                    frees.push((RKV_HYBRID_SWA, full.clone()));
                }
                if let Some(m) = t.mamba_value(n).map_err(st)? {
                    frees.push((RKV_HYBRID_MAMBA, m.to_vec()));
                }
                frees.push((RKV_HYBRID_FULL, full));
            }
        }
        inner.tree.reset();
        inner.receipts.clear();
        drop(g);
        // SAFETY: the caller's contract for `on_free` and `ctx`.
        unsafe { tell_frees(on_free, ctx, &frees) };
        Ok(())
    })
}
