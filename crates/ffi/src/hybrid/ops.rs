//! The hybrid tree's insert (FULL or SWA, then the Mamba commit) with its cache actions,
//! the SWA values and window, and the per-component eviction walks.

use std::ffi::c_void;

use radixkv_core::hybrid::{CacheAction, Component, HybridTree};

use super::*;

/// What an `rkv_hybrid_action` asks of the caller (its `kind` field, a `uint32_t`): SGLang's
/// cache actions (`cache_action.py`), in the order the insert emits them. A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_hybrid_action_kind {
    /// `FreeDeviceKV`: free `a[0..a_len]` in the FULL pool and, on a tree with SWA, the SWA
    /// slots of the same tokens (SGLang frees SWA by FULL index). `node` is 0.
    RKV_HYBRID_FREE_DEVICE_KV = 0,
    /// `FreeDeviceKVFullOnly`: free `a[0..a_len]` in the FULL pool only. `node` is 0.
    RKV_HYBRID_FREE_DEVICE_KV_FULL_ONLY = 1,
    /// `SWARebuild`, a barrier: allocate SWA slots for `node`'s tokens (their FULL indices
    /// are `a[0..a_len]`), copy the KV, and store them with `rkv_hybrid_swa_set_value`;
    /// once every action is carried out, call `rkv_hybrid_swa_refresh` on the insert's
    /// node (`refreshed` is 0 then).
    RKV_HYBRID_SWA_REBUILD = 2,
    /// `RecoverSWAWithLockedFull`, a barrier: `node`'s FULL value is locked by another
    /// request and kept (`a[0..a_len]`); recover its SWA value from the request's indices for
    /// the same tokens (`b[0..b_len]`), then store it and refresh as for `SWA_REBUILD`.
    RKV_HYBRID_RECOVER_SWA_WITH_LOCKED_FULL = 3,
}

/// One cache action of an insert (`rkv_hybrid_insert`), handed to `rkv_hybrid_action_fn`:
/// a plain value valid only during the callback (its arrays too: copy what you keep).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rkv_hybrid_action {
    /// An `rkv_hybrid_action_kind` value.
    pub kind: u32,
    /// Always 0.
    pub reserved: u32,
    /// The node the action is about (`SWA_REBUILD`, `RECOVER_SWA_WITH_LOCKED_FULL`), else 0.
    pub node: rkv_hybrid_node,
    /// The action's indices (see the kind); NULL when `a_len` is 0.
    pub a: *const i64,
    /// How many.
    pub a_len: usize,
    /// `RECOVER_SWA_WITH_LOCKED_FULL`'s incoming indices; NULL and 0 for the other kinds.
    pub b: *const i64,
    /// How many.
    pub b_len: usize,
}

/// Receives an insert's cache actions (`rkv_hybrid_insert`), one call per action, in
/// order, on the calling thread after the tree's mutex is released and before the insert
/// returns: it may call into the same tree (`rkv_hybrid_swa_set_value` for a rebuild).
/// `*action` and its arrays are valid only during the call. It must return normally (no
/// longjmp, no C++ exception).
pub type rkv_hybrid_action_fn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, action: *const rkv_hybrid_action)>;

/// What `rkv_hybrid_insert` did: a plain value the caller owns and the call writes (whole,
/// on `RKV_OK` only).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rkv_hybrid_insert_result {
    /// Tokens the tree already held (SGLang's `prefix_len`).
    pub prefix_len: usize,
    /// The node the key ends on (SGLang's `last_device_node`; the root for an empty key).
    pub node: rkv_hybrid_node,
    /// 1 when the insert ended SGLang's way, with the SWA window refreshed (always on a
    /// tree without SWA); 0 when an action was a barrier (`SWA_REBUILD`,
    /// `RECOVER_SWA_WITH_LOCKED_FULL`): carry the actions out, then call
    /// `rkv_hybrid_swa_refresh(tree, node)`.
    pub refreshed: u32,
    /// SGLang's `mamba_exist`: 1 when the node kept the Mamba state it had (the request's
    /// own state stays the caller's: free or reuse it), or no state was committed (an empty
    /// key, or no state given); 0 when the tree took the request's state.
    pub mamba_exist: u32,
}

/// The actions of one insert, owned (for the callbacks after the mutex is released).
fn action_of(a: &CacheAction) -> (rkv_hybrid_action_kind, u64, &[i64], &[i64]) {
    use rkv_hybrid_action_kind::*;
    match a {
        CacheAction::FreeDeviceKv(v) => (RKV_HYBRID_FREE_DEVICE_KV, 0, v, &[]),
        CacheAction::FreeDeviceKvFullOnly(v) => (RKV_HYBRID_FREE_DEVICE_KV_FULL_ONLY, 0, v, &[]),
        CacheAction::SwaRebuild { node, full } => (RKV_HYBRID_SWA_REBUILD, *node, full, &[]),
        CacheAction::RecoverSwaWithLockedFull { node, kept, incoming } => {
            (RKV_HYBRID_RECOVER_SWA_WITH_LOCKED_FULL, *node, kept, incoming)
        }
    }
}

fn ptr_or_null(v: &[i64]) -> *const i64 {
    if v.is_empty() { std::ptr::null() } else { v.as_ptr() }
}

/// Inserts `key[0..key_len]`'s whole pages in namespace `ns` with their FULL device indices
/// `values[0..values_len]` (at least the page-aligned key length), SGLang's insert over
/// every component: FULL's rules, or SWA's on a tree with SWA (`swa_evicted_len`: the
/// request's SWA-evicted prefix, SGLang's `get_evicted_seqlen(SWA)`, a multiple of the
/// page size; 0 on a tree without SWA), then, on a tree with Mamba and a state given
/// (`mamba_state[0..mamba_len]`, `mamba_len > 0`), the Mamba commit on the node the key
/// ends on. `prev_prefix_len` is the prefix the request already holds from the tree (its
/// match), so only duplicates past it are handed back to free.
///
/// Writes the result to `*out` (required), then calls `on_action(ctx, &action)`
/// (required) for each cache action the caller must carry out, in order, after the tree's
/// mutex is released: the callback may call back into the tree (store a rebuilt SWA value
/// with `rkv_hybrid_swa_set_value`). When `out->refreshed` is 0, call
/// `rkv_hybrid_swa_refresh(tree, out->node)` after the actions. If you cap Mamba states per
/// path (SGLang's `mamba_max_states_per_path`), call `rkv_hybrid_mamba_evict_excess` on
/// `out->node` when `out->mamba_exist` is 0.
///
/// `out_lock` (optional): when not NULL, the node the key ends on is also locked over every
/// component, as `rkv_hybrid_lock` does, under the same hold of the mutex, and the receipt
/// written there (release it exactly once with `rkv_hybrid_unlock`). Use it when other
/// threads evict from the same tree: the new nodes are unlocked otherwise, so an eviction
/// running between this call and the `rkv_hybrid_swa_set_value` / `rkv_hybrid_swa_refresh`
/// that follow could take them (those calls then fail with `RKV_INVALID_ARGUMENT`); it is
/// also what a running request does with its grown prefix (SGLang's
/// `cache_unfinished_req`).
///
/// Refused, with nothing changed: `RKV_INVALID_ARGUMENT` for values shorter than the
/// page-aligned key, an `swa_evicted_len` not a multiple of the page size or non-zero
/// without SWA, a Mamba state on a tree without Mamba; `RKV_NULL_ARGUMENT` for a NULL
/// `out` or `on_action`, or a NULL array with a length. Thread-safe.
///
/// # Safety
/// `tree` is NULL or live; the arrays readable for their lengths (or NULL with 0); `out`
/// NULL or writable; `on_action` NULL or a function safe to call with `ctx`; `out_lock`
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_insert(
    tree: *const rkv_hybrid,
    ns: u32,
    key: *const i64,
    key_len: usize,
    values: *const i64,
    values_len: usize,
    prev_prefix_len: usize,
    swa_evicted_len: usize,
    mamba_state: *const i64,
    mamba_len: usize,
    on_action: rkv_hybrid_action_fn,
    ctx: *mut c_void,
    out: *mut rkv_hybrid_insert_result,
    out_lock: *mut rkv_hybrid_receipt,
) -> rkv_status {
    boundary("rkv_hybrid_insert", || {
        // SAFETY: the caller guarantees each array is readable for its length (or NULL).
        let (k, v, m) = unsafe {
            (
                input(key, key_len, "key", "key_len")?,
                input(values, values_len, "values", "values_len")?,
                input(mamba_state, mamba_len, "mamba_state", "mamba_len")?,
            )
        };
        check_out(out, "out")?;
        if !out_lock.is_null() {
            check_out(out_lock, "out_lock")?;
        }
        let Some(on_action) = on_action else {
            return Err(fail(
                rkv_status::RKV_NULL_ARGUMENT,
                "on_action is NULL: an insert's actions (indices to free, SWA values to \
                 rebuild) must reach the caller",
            ));
        };
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let mut g = unsafe { hybrid_lock(tree) }?;
        let inner = &mut *g;
        let t: &mut HybridTree = &mut inner.tree;
        let bad = |m: String| Err(fail(rkv_status::RKV_INVALID_ARGUMENT, m));
        if !m.is_empty() && !t.has_mamba() {
            return bad(format!(
                "mamba_len = {}: this tree has no Mamba component (made with mamba = 0); \
                 nothing was inserted",
                m.len()
            ));
        }
        if t.swa_window() == 0 && swa_evicted_len != 0 {
            return bad(format!(
                "swa_evicted_len = {swa_evicted_len}: this tree has no SWA component (made \
                 with swa_window = 0); nothing was inserted"
            ));
        }
        let total = key_len / t.page_size() * t.page_size();
        let (prefix_len, node, actions, refreshed) = if t.swa_window() > 0 {
            let r = t.insert_swa(ns, k, Some(v), prev_prefix_len, swa_evicted_len).map_err(st)?;
            (r.prefix_len, r.node, r.actions, r.refreshed)
        } else {
            let r = t.insert(ns, k, Some(v), prev_prefix_len).map_err(st)?;
            let a = if r.duplicates.is_empty() {
                Vec::new()
            } else {
                vec![CacheAction::FreeDeviceKv(r.duplicates)]
            };
            (r.prefix_len, r.node, a, true)
        };
        let mut mamba_exist = true;
        if !m.is_empty() && total > 0 {
            mamba_exist = t.mamba_commit(node, prefix_len < total, m).map_err(st)?;
        }
        let lock = if out_lock.is_null() { None } else { Some(take_lock(inner, node)?) };
        drop(g);
        let r = rkv_hybrid_insert_result {
            prefix_len,
            node,
            refreshed: u32::from(refreshed),
            mamba_exist: u32::from(mamba_exist),
        };
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out.write(r) };
        if let Some(lock) = lock {
            // SAFETY: non-NULL here, so it passed `check_out`; writable by the contract.
            unsafe { out_lock.write(lock) };
        }
        for a in &actions {
            let (kind, node, a, b) = action_of(a);
            let c = rkv_hybrid_action {
                kind: kind as u32,
                reserved: 0,
                node,
                a: ptr_or_null(a),
                a_len: a.len(),
                b: ptr_or_null(b),
                b_len: b.len(),
            };
            // SAFETY: the caller guarantees `on_action` may be called with `ctx`; `c` and
            // the arrays it points to live until the call returns.
            unsafe { on_action(ctx, &c) };
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// SWA values and the window.

/// Stores `node`'s SWA value, `values[0..len]` (its SWA pool indices, one per token of the
/// node: SGLang's `set_component_device_value`, what an `SWA_REBUILD` asks), the most
/// recent in the SWA LRU. `RKV_INVALID_ARGUMENT`, with nothing changed, on a tree without
/// SWA, for a node the tree does not hold, the root, a node that has an SWA value, or a
/// length other than the node's. Thread-safe (and callable from an `rkv_hybrid_action_fn`).
///
/// # Safety
/// `tree` is NULL or live; `values[0..len]` readable (or NULL with 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_swa_set_value(
    tree: *const rkv_hybrid,
    node: rkv_hybrid_node,
    values: *const i64,
    len: usize,
) -> rkv_status {
    boundary("rkv_hybrid_swa_set_value", || {
        // SAFETY: the caller guarantees values[0..len] is readable (or NULL).
        let v = unsafe { input(values, len, "values", "len") }?;
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let mut g = unsafe { hybrid_lock(tree) }?;
        tree_component(&g.tree, rkv_hybrid_component::RKV_HYBRID_SWA as u32, "component")?;
        live(&g.tree, node, "node")?;
        g.tree.swa_set_value(node, v.to_vec()).map_err(st)
    })
}

/// Refreshes the SWA window back from `node` in the SWA LRU (the window refresh that ends
/// SGLang's insert, for an insert whose `refreshed` was 0, once its actions are carried
/// out). `RKV_INVALID_ARGUMENT` on a tree without SWA or for a node it does not hold. The
/// root refreshes nothing. Thread-safe.
///
/// # Safety
/// `tree` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_swa_refresh(
    tree: *const rkv_hybrid,
    node: rkv_hybrid_node,
) -> rkv_status {
    boundary("rkv_hybrid_swa_refresh", || {
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let mut g = unsafe { hybrid_lock(tree) }?;
        tree_component(&g.tree, rkv_hybrid_component::RKV_HYBRID_SWA as u32, "component")?;
        live(&g.tree, node, "node")?;
        if g.tree.is_root(node).map_err(st)? {
            return Ok(());
        }
        g.tree.swa_refresh(node).map_err(st)
    })
}

/// Releases the SWA window lock of receipt `*receipt` early (SGLang's `dec_swa_lock_only`,
/// when the request's window has moved past its cached prefix), and with it the Mamba lock
/// (a lower priority). An SWA value whose last window lock goes on a device leaf is
/// evicted at once: its slots (by FULL index) go to `on_free(ctx, RKV_HYBRID_SWA, ..)`
/// (required when the tree has SWA), after the mutex is released. The receipt stays live:
/// `rkv_hybrid_unlock` releases its FULL lock. On a tree without SWA, or a second call, it
/// releases nothing. `RKV_INVALID_LOCK` for a receipt that is not live; nothing changes
/// then. Thread-safe.
///
/// # Safety
/// `tree` is NULL or live; `receipt` NULL or readable; `on_free` NULL or a function safe to
/// call with `ctx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_release_window(
    tree: *const rkv_hybrid,
    receipt: *const rkv_hybrid_receipt,
    on_free: rkv_hybrid_free_fn,
    ctx: *mut c_void,
) -> rkv_status {
    boundary("rkv_hybrid_release_window", || {
        // SAFETY: the caller passes NULL or a readable receipt.
        let r = unsafe { read_receipt(receipt) }?;
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let mut g = unsafe { hybrid_lock(tree) }?;
        let inner = &mut *g;
        let h = held(inner, &r)?;
        if inner.tree.swa_window() == 0 || !h.swa {
            return Ok(()); // nothing to release early (SGLang's no-SWA and root cases)
        }
        if on_free.is_none() {
            return Err(fail(
                rkv_status::RKV_NULL_ARGUMENT,
                "on_free is NULL: the SWA slots an early release evicts must reach the caller",
            ));
        }
        let t = &mut inner.tree;
        let freed = t.swa_release_window(h.node, h.swa_uuid).map_err(st)?;
        let e = inner.receipts.get_mut(&r.id).expect("live");
        e.swa = false;
        if h.mamba {
            inner.tree.mamba_dec_lock(h.node).map_err(st)?;
            inner.receipts.get_mut(&r.id).expect("live").mamba = false;
        }
        drop(g);
        // SAFETY: the caller's contract for `on_free` and `ctx`.
        unsafe { tell_frees(on_free, ctx, &[(rkv_hybrid_component::RKV_HYBRID_SWA, freed)]) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Eviction.

/// The C enum of a core component.
fn c_component(c: Component) -> rkv_hybrid_component {
    match c {
        Component::Full => rkv_hybrid_component::RKV_HYBRID_FULL,
        Component::Swa => rkv_hybrid_component::RKV_HYBRID_SWA,
        Component::Mamba => rkv_hybrid_component::RKV_HYBRID_MAMBA,
    }
}

/// The core component of a C enum.
fn core_component(c: rkv_hybrid_component) -> Component {
    match c {
        rkv_hybrid_component::RKV_HYBRID_FULL => Component::Full,
        rkv_hybrid_component::RKV_HYBRID_SWA => Component::Swa,
        rkv_hybrid_component::RKV_HYBRID_MAMBA => Component::Mamba,
    }
}

/// Evicts at least `request` of component `component` (an `rkv_hybrid_component`: FULL and
/// SWA in tokens, Mamba in state slots; fewer only when nothing more of it is evictable),
/// running SGLang's eviction walk for that component to its end: FULL takes the evictable
/// leaves, oldest first; SWA and Mamba walk their LRU from the least recent unlocked value,
/// evicting a device leaf whole and making any other node a tombstone of that component
/// (an SWA tombstone takes the node's Mamba state with it). Writes the amount evicted of
/// `component` to `*out_evicted` (required).
///
/// `on_free(ctx, comp, indices, len)` (required) receives everything freed, after the
/// tree's mutex is released: a leaf evicted whole gives its FULL indices (`RKV_HYBRID_FULL`),
/// its SWA slots by the same FULL indices (`RKV_HYBRID_SWA`, where it had an SWA value) and
/// its Mamba state (`RKV_HYBRID_MAMBA`); a tombstone gives the component's value (and, for
/// SWA, the node's Mamba state). `RKV_INVALID_ARGUMENT` for a component that is not one or
/// not in the tree; nothing changes then. Thread-safe.
///
/// # Safety
/// `tree` is NULL or live; `on_free` NULL or a function safe to call with `ctx`;
/// `out_evicted` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_evict(
    tree: *const rkv_hybrid,
    component: u32,
    request: u64,
    on_free: rkv_hybrid_free_fn,
    ctx: *mut c_void,
    out_evicted: *mut u64,
) -> rkv_status {
    boundary("rkv_hybrid_evict", || {
        check_out(out_evicted, "out_evicted")?;
        if on_free.is_none() {
            return Err(fail(
                rkv_status::RKV_NULL_ARGUMENT,
                "on_free is NULL: what an eviction frees must reach the caller",
            ));
        }
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let mut g = unsafe { hybrid_lock(tree) }?;
        let comp = tree_component(&g.tree, component, "component")?;
        let mut freed = Vec::new();
        let r = g.tree.evict(core_component(comp), request, &mut freed).map_err(st);
        drop(g);
        let frees: Vec<_> =
            freed.into_iter().map(|f| (c_component(f.component), f.indices)).collect();
        // What was freed before a failure (a bug) is still the caller's.
        // SAFETY: the caller's contract for `on_free` and `ctx`.
        unsafe { tell_frees(on_free, ctx, &frees) };
        let evicted = r?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_evicted.write(evicted) };
        Ok(())
    })
}

/// SGLang's `evict_excess_path_states` (`mamba_max_states_per_path = cap`, at least 1):
/// past `cap` Mamba states on `node`'s root path, the shallowest eligible ones (not `node`,
/// unlocked, one child, not a device leaf) become Mamba tombstones; their states go to
/// `on_free(ctx, RKV_HYBRID_MAMBA, ..)` (required), shallowest first, after the mutex is
/// released. Writes the number of states freed to `*out_freed` (required).
/// `RKV_INVALID_ARGUMENT` on a tree without Mamba, for a node it does not hold, or cap 0;
/// nothing changes then. Thread-safe.
///
/// # Safety
/// `tree` is NULL or live; `on_free` NULL or a function safe to call with `ctx`;
/// `out_freed` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_hybrid_mamba_evict_excess(
    tree: *const rkv_hybrid,
    node: rkv_hybrid_node,
    cap: usize,
    on_free: rkv_hybrid_free_fn,
    ctx: *mut c_void,
    out_freed: *mut usize,
) -> rkv_status {
    boundary("rkv_hybrid_mamba_evict_excess", || {
        check_out(out_freed, "out_freed")?;
        if on_free.is_none() {
            return Err(fail(
                rkv_status::RKV_NULL_ARGUMENT,
                "on_free is NULL: the Mamba states this frees must reach the caller",
            ));
        }
        // SAFETY: the caller passes NULL or a live tree that is not being freed.
        let mut g = unsafe { hybrid_lock(tree) }?;
        tree_component(&g.tree, rkv_hybrid_component::RKV_HYBRID_MAMBA as u32, "component")?;
        live(&g.tree, node, "node")?;
        let states = g.tree.mamba_evict_excess(node, cap).map_err(st)?;
        drop(g);
        let n = states.len();
        let frees: Vec<_> =
            states.into_iter().map(|s| (rkv_hybrid_component::RKV_HYBRID_MAMBA, s)).collect();
        // SAFETY: the caller's contract for `on_free` and `ctx`.
        unsafe { tell_frees(on_free, ctx, &frees) };
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_freed.write(n) };
        Ok(())
    })
}
