//! A tier's life: option defaults, create (options checked piece by piece), free, and the
//! `RKV_COPIER_HOST` stores' addresses.

use super::*;

use radixkv_core::cache::CacheOptions;
use radixkv_core::tree::EvictionPolicy;

// ---------------------------------------------------------------------------------------
// Lifecycle.

/// Default tier options: `size = sizeof(rkv_tier_options)`, `RKV_COPIER_NONE`, host_slots 0
/// (set it), `RKV_WRITE_THROUGH_SELECTIVE` with write_threshold 2, load_back_min 1,
/// `RKV_HOST_POLICY_SAME_AS_DEVICE`, the layout fields 0, the callbacks NULL. Returns a plain
/// value. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_tier_options_default() -> rkv_tier_options {
    let d = TierOptions::default();
    rkv_tier_options {
        size: size_of::<rkv_tier_options>() as u32,
        copier: rkv_copier_kind::RKV_COPIER_NONE as u32,
        host_slots: d.host_slots as u64,
        write_policy: rkv_write_policy::RKV_WRITE_THROUGH_SELECTIVE as u32,
        write_threshold: d.write_threshold,
        load_back_min: d.load_back_min as u64,
        host_policy: RKV_HOST_POLICY_SAME_AS_DEVICE,
        num_layers: 0,
        num_kv_heads: 0,
        head_dim: 0,
        elem_bytes: 0,
        reserved: 0,
        callbacks: rkv_copier {
            user_data: std::ptr::null_mut(),
            to_host: None,
            to_device: None,
            poll: None,
            wait: None,
        },
    }
}

/// Creates a host tier (an extension of version 1): a device cache from `*opts` (required;
/// as `rkv_cache_new` reads it, and it must have a pool: `pool_slots > 0`) and a host tier
/// from `*tier_opts` (required); both are read only during the call. Writes it to
/// `*out_tier` (required); the caller owns it and frees it with `rkv_tier_free`.
/// `RKV_INVALID_ARGUMENT` (nothing created) for every option `rkv_cache_new` refuses, no
/// pool, `tier_opts->size` other than `sizeof(rkv_tier_options)`, a host_slots that is not a
/// positive multiple of the page size below 2^32, an unknown write_policy, copier or
/// host_policy, write_threshold 0, reserved not 0, or a bad layout for `RKV_COPIER_HOST`;
/// `RKV_NULL_ARGUMENT` for an `RKV_COPIER_CALLBACK` with a NULL callback;
/// `RKV_DEVICE_ERROR` when `RKV_COPIER_HOST`'s memory cannot be had. Thread-safe.
///
/// # Safety
/// `opts` NULL or a readable `rkv_options`; `tier_opts` NULL or a readable
/// `rkv_tier_options`; `out_tier` NULL or a writable `rkv_tier *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_new(
    opts: *const rkv_options,
    tier_opts: *const rkv_tier_options,
    out_tier: *mut *mut rkv_tier,
) -> rkv_status {
    boundary("rkv_tier_new", || {
        if opts.is_null() {
            return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "opts is NULL"));
        }
        if tier_opts.is_null() {
            return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "tier_opts is NULL"));
        }
        check_out(out_tier, "out_tier")?;
        check_opt_in(tier_opts, "tier_opts")?;
        // SAFETY: the caller passes a readable `rkv_options`; NULL policy is the default.
        let dev = unsafe { cache_options(opts, std::ptr::null()) }?;
        // SAFETY: non-null and aligned (checked above); readable by the caller's contract.
        let o = unsafe { read_sized(tier_opts, "tier_opts", "rkv_tier_options") }?;
        let topts = tier_options(&o, &dev)?;
        let (copier, host) = copier_of(&o, dev.pool_slots, topts.host_slots)?;
        let raw = Box::into_raw(Box::new(new_tier(dev, topts, copier, host)?));
        // SAFETY: `out_tier` passed `check_out` and is writable by the caller's contract.
        unsafe { out_tier.write(raw) };
        Ok(())
    })
}

/// The core's tier options for `*tier_opts` (`o`) over a device cache of `dev`, checked
/// field by field as `rkv_tier_new` documents (the copier and layout: [`copier_of`]).
pub(super) fn tier_options(o: &rkv_tier_options, dev: &CacheOptions) -> Res<TierOptions> {
    if dev.pool_slots == 0 {
        return Err(bad(
            "opts->pool_slots = 0: a host tier needs the device pool (pool_slots > 0)".into(),
        ));
    }
    if o.reserved != 0 {
        return Err(bad(format!("tier_opts->reserved = {} must be 0", o.reserved)));
    }
    let write_policy = write_policy_of(o.write_policy)?;
    let host_policy = host_policy_of(o.host_policy)?;
    let p = dev.page_size as u64;
    if o.host_slots == 0 || !o.host_slots.is_multiple_of(p) || o.host_slots > u64::from(u32::MAX) {
        return Err(bad(format!(
            "tier_opts->host_slots = {} must be a positive multiple of the page size {p}, \
             below 2^32",
            o.host_slots
        )));
    }
    if o.write_threshold == 0 {
        return Err(bad("tier_opts->write_threshold = 0: it must be at least 1".into()));
    }
    Ok(TierOptions {
        host_slots: o.host_slots as usize,
        write_policy,
        write_threshold: o.write_threshold,
        load_back_min: usize::try_from(o.load_back_min).unwrap_or(usize::MAX),
        host_policy,
    })
}

/// The write policy numbered `w` (an `rkv_write_policy`).
fn write_policy_of(w: u32) -> Res<WritePolicy> {
    match w {
        0 => Ok(WritePolicy::WriteThrough),
        1 => Ok(WritePolicy::WriteThroughSelective),
        2 => Ok(WritePolicy::WriteBack),
        w => Err(bad(format!(
            "tier_opts->write_policy = {w} is not an rkv_write_policy (0 = RKV_WRITE_THROUGH, \
             1 = RKV_WRITE_THROUGH_SELECTIVE, 2 = RKV_WRITE_BACK)"
        ))),
    }
}

/// The host policy numbered `n`: `None` (the device's) for `RKV_HOST_POLICY_SAME_AS_DEVICE`.
fn host_policy_of(n: u32) -> Res<Option<EvictionPolicy>> {
    if n == RKV_HOST_POLICY_SAME_AS_DEVICE {
        return Ok(None);
    }
    let p = policy_of(n).ok_or_else(|| {
        bad(format!(
            "tier_opts->host_policy = {n} is neither RKV_HOST_POLICY_SAME_AS_DEVICE nor an \
             rkv_eviction_policy ({})",
            valid_policies()
        ))
    })?;
    Ok(Some(p))
}

/// A tier's copier, and the stores it owns when it is `RKV_COPIER_HOST`'s.
type Copier = (Arc<dyn TierCopier>, Option<Arc<HostCopier>>);

/// The copier `tier_opts->copier` names, and the stores it owns for `RKV_COPIER_HOST`
/// (`pool_slots` device slots, `host_slots` host slots).
pub(super) fn copier_of(o: &rkv_tier_options, pool_slots: usize, host_slots: usize) -> Res<Copier> {
    match o.copier {
        0 => Ok((Arc::new(NullCopier::default()), None)),
        1 => {
            let c = host_copier(o, pool_slots, host_slots)?;
            Ok((c.clone(), Some(c)))
        }
        2 => Ok((callback_copier(&o.callbacks)?, None)),
        k => Err(bad(format!(
            "tier_opts->copier = {k} is not an rkv_copier_kind (0 = RKV_COPIER_NONE, 1 = \
             RKV_COPIER_HOST, 2 = RKV_COPIER_CALLBACK)"
        ))),
    }
}

/// `RKV_COPIER_HOST`'s two stores, laid out as `tier_opts` says (`RKV_INVALID_ARGUMENT` for
/// a bad layout, `RKV_DEVICE_ERROR` when the memory cannot be had).
fn host_copier(o: &rkv_tier_options, pool_slots: usize, host_slots: usize) -> Res<Arc<HostCopier>> {
    let l = |slots| {
        KvLayout::new(
            o.num_layers as usize,
            slots,
            o.num_kv_heads as usize,
            o.head_dim as usize,
            o.elem_bytes as usize,
        )
    };
    let (ld, lh) = (l(pool_slots), l(host_slots));
    for x in [ld, lh] {
        x.validate().map_err(|e| bad(format!("tier_opts (RKV_COPIER_HOST): {e}")))?;
    }
    let d = HostKvStorage::new(ld).map_err(st)?;
    let h = HostKvStorage::new(lh).map_err(st)?;
    Ok(Arc::new(HostCopier::new(Arc::new(d), Arc::new(h))))
}

/// `RKV_COPIER_CALLBACK`'s copier: all four callbacks are required (`RKV_NULL_ARGUMENT`).
fn callback_copier(cb: &rkv_copier) -> Res<Arc<dyn TierCopier>> {
    let missing = [
        ("to_host", cb.to_host.is_none()),
        ("to_device", cb.to_device.is_none()),
        ("poll", cb.poll.is_none()),
        ("wait", cb.wait.is_none()),
    ];
    if let Some((name, _)) = missing.iter().find(|(_, m)| *m) {
        return Err(fail(
            rkv_status::RKV_NULL_ARGUMENT,
            format!(
                "tier_opts->callbacks.{name} is NULL (RKV_COPIER_CALLBACK needs all four \
                 callbacks)"
            ),
        ));
    }
    Ok(Arc::new(CallbackCopier { c: *cb }))
}

/// The tier itself, with its lock table (`RKV_INTERNAL_ERROR` when the process has the most
/// live tables it can).
fn new_tier(
    dev: CacheOptions,
    topts: TierOptions,
    copier: Arc<dyn TierCopier>,
    host: Option<Arc<HostCopier>>,
) -> Res<rkv_tier> {
    let cache = Cache::with_host(dev, topts, copier)
        .map_err(|e| fail(rkv_status::from(&e), format!("tier_opts: {e}")))?;
    let locks = LockTable::new().ok_or_else(|| {
        fail(
            rkv_status::RKV_INTERNAL_ERROR,
            "too many live caches and tiers: 2^20 - 1 exist in this process (free some)",
        )
    })?;
    Ok(rkv_tier { cache, locks, host, loads: Loads::default() })
}

/// Destroys a tier: waits for every copy in flight (a callback copier is called, so it must
/// still be valid), releases its outstanding locks and the results of load-backs never
/// taken (their handles and tickets become invalid), and frees everything it owns, the
/// `RKV_COPIER_HOST` stores included (pointers from `rkv_tier_kv_ptr` dangle afterwards).
/// NULL is a no-op. Must not run concurrently with any other call on the same tier, and
/// the tier must not be used afterwards. Leaves `rkv_last_error_message()` as it is.
///
/// # Safety
/// `tier` is NULL or was returned by `rkv_tier_new` and not freed yet, and no other call on
/// it runs concurrently or follows.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_free(tier: *mut rkv_tier) {
    if tier.is_null() || !tier.is_aligned() {
        return;
    }
    // SAFETY: `tier` came from `Box::into_raw` in `rkv_tier_new` and, by the caller's
    // contract, is freed once and used by no one else now, so we own it again.
    let mut owned = unsafe { Box::from_raw(tier) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        owned.cache.wait_all();
        owned.loads.finish(&owned.cache);
        for l in owned.locks.drain() {
            let _ = owned.cache.release(l);
        }
        drop(owned);
    }));
}

/// Writes the base addresses of layer `layer`'s K and V buffers of one store of an
/// `RKV_COPIER_HOST` tier to `*out_k` and `*out_v` (both required): `side` is an
/// `rkv_tier_side` (the device-side store, `pool_slots` slots, or the host-side one,
/// `host_slots` slots). Each buffer holds `num_slots * num_kv_heads * head_dim *
/// elem_bytes` bytes, slot `s` at offset `s * num_kv_heads * head_dim * elem_bytes`,
/// 256-byte aligned, zeroed at creation, valid until `rkv_tier_free`. The engine writes a
/// token's KV into its device slot before inserting it and reads loaded slots after a
/// load-back returns; the tier's copies run inside `rkv_tier_*` calls, so the caller orders
/// its own accesses against the calls that copy (inserts that back pages up, evictions under
/// `RKV_WRITE_BACK`, load-backs). `RKV_INVALID_ARGUMENT` for a tier with another copier, an
/// unknown side, or a layer out of range. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_k` and `out_v` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_kv_ptr(
    tier: *const rkv_tier,
    side: u32,
    layer: u32,
    out_k: *mut *mut c_void,
    out_v: *mut *mut c_void,
) -> rkv_status {
    boundary("rkv_tier_kv_ptr", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        check_out(out_k, "out_k")?;
        check_out(out_v, "out_v")?;
        let Some(h) = &t.host else {
            return Err(bad(
                "this tier has no KV stores of its own (only RKV_COPIER_HOST allocates them)"
                    .into(),
            ));
        };
        let store = match side {
            0 => h.device(),
            1 => h.host(),
            s => {
                return Err(bad(format!(
                    "side = {s} is not an rkv_tier_side (0 = RKV_SIDE_DEVICE, 1 = RKV_SIDE_HOST)"
                )));
            }
        };
        let layers = store.layout().num_layers;
        if layer as usize >= layers {
            return Err(bad(format!("layer = {layer} is out of range: the store has {layers}")));
        }
        let k = store.k_ptr(layer as usize).map_err(st)? as usize as *mut c_void;
        let v = store.v_ptr(layer as usize).map_err(st)? as usize as *mut c_void;
        // SAFETY: both passed `check_out`; writable by the caller's contract.
        unsafe {
            out_k.write(k);
            out_v.write(v);
        }
        Ok(())
    })
}
