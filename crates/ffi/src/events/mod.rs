//! The KV-event functions of the C ABI (`KV_EVENTS.md`, "Interfaces"), additive within
//! version 1: `rkv_events_*` on a cache (enable, name namespaces, flush, drain into caller
//! buffers, counters, start a publisher) and `rkv_publisher_*` on the publisher they start
//! (endpoints, counters, stop, free). Same conventions as the rest of `src/ffi/`: a literal
//! `#[unsafe(no_mangle)] extern "C"` item per function, the panic boundary, a numbered
//! status, outputs only on `RKV_OK`, every pointer checked, a message for every failure.
//!
//! The publisher's handle owns what it runs on (a reference to the cache's event sink, its
//! sockets, its thread), so it stays valid, and stopping or freeing it stays safe, after
//! its cache was freed.

use std::ffi::{CStr, c_char};
use std::time::Duration;

use super::{
    Res, boundary, cache_mut, cache_ref, check_out, check_out_array, fail, rkv_cache, rkv_status,
    st, write_array,
};
use radixkv_core::cache::EventOptions;
use radixkv_core::events::hash::HashMode;
use radixkv_core::events::wire::{Encoding, KvGroup};
use radixkv_core::events::{EventBatch, EventSink, KvEvent, Medium, NamespaceMeta};

/// What `rkv_events_flush` writes to `*out_seq` when there was nothing to close: no batch,
/// no sequence number used. Never a batch's number (it is also the replay's end marker).
pub const RKV_EVENTS_NO_SEQ: u64 = 0xFFFF_FFFF_FFFF_FFFF;

/// Which page hash a cache publishes (the `hash_mode` field of `rkv_events_options`, a
/// `uint32_t`: other values are `RKV_INVALID_ARGUMENT`). A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_hash_mode {
    /// Dynamo's and Mooncake's XXH3-64 sequence hash, seed 1337 (the default): the hashes
    /// routers compute themselves from `token_ids`.
    RKV_HASH_XXH3 = 0,
    /// SGLang's SHA-256 page chain cut to 64 bits. The hashes are the bits of SGLang's
    /// signed `int64` values (cast a `uint64_t` hash to `int64_t` to compare); the
    /// publisher sends them signed, as SGLang does.
    RKV_HASH_SGLANG_SHA256 = 1,
}

/// Where a cache's pages live, vLLM's `medium` (the `medium` fields of `rkv_events_options`
/// and `rkv_event`, `uint32_t`s). A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_medium {
    /// The device pool: `"GPU"` on the wire (the default).
    RKV_MEDIUM_GPU = 0,
    /// A host tier in pinned memory: `"CPU_PINNED"`.
    RKV_MEDIUM_CPU_PINNED = 1,
}

/// What an `rkv_event` is (its `kind` field, a `uint32_t`). A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_event_kind {
    /// Pages became cached (one insert that added pages), in token order.
    RKV_EVENT_BLOCK_STORED = 0,
    /// Pages stopped being cached (eviction, reset, a namespace dropped).
    RKV_EVENT_BLOCK_REMOVED = 1,
    /// Every page of the cache is gone.
    RKV_EVENT_ALL_BLOCKS_CLEARED = 2,
}

/// How a publisher encodes its payloads (the `encoding` field of `rkv_publisher_options`,
/// a `uint32_t`: other values are `RKV_INVALID_ARGUMENT`). A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum rkv_encoding {
    /// vLLM's tagged arrays, every field present (the default).
    RKV_ENCODING_VLLM_ARRAY = 0,
    /// vLLM's tagged maps, `"type"` first, fields equal to their default omitted.
    RKV_ENCODING_VLLM_MAP = 1,
}

/// How a cache publishes KV events (`rkv_events_enable`); the block size is the cache's
/// page size. Get the defaults from `rkv_events_options_default()` and change fields. A
/// plain value: the caller owns it, and `rkv_events_enable` only reads it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct rkv_events_options {
    /// An `rkv_hash_mode` value (default `RKV_HASH_XXH3`).
    pub hash_mode: u32,
    /// An `rkv_medium` value (default `RKV_MEDIUM_GPU`).
    pub medium: u32,
    /// The most closed batches the drain queue holds (while no publisher is attached)
    /// before it drops new ones, whole and counted (`rkv_events_stats.dropped`); default
    /// 65536. 0 drops every batch closed while no publisher is attached.
    pub max_drain_batches: u64,
}

/// One KV event, as `rkv_events_drain` writes it. Its arrays and strings point into the
/// buffers the caller passed to that call (`out_hashes`, `out_tokens`, `out_strings`): the
/// caller owns them, nothing is to be freed, and the pointers are valid as long as those
/// buffers are. A plain value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct rkv_event {
    /// The sequence number of the batch the event belongs to (batches are numbered 0, 1,
    /// 2, ... per cache, gapless, in the order they closed).
    pub seq: u64,
    /// When its batch closed: seconds since the Unix epoch.
    pub ts: f64,
    /// An `rkv_event_kind` value.
    pub kind: u32,
    /// An `rkv_medium` value: where the pages live (lived); `RKV_MEDIUM_GPU` for
    /// `RKV_EVENT_ALL_BLOCKS_CLEARED`.
    pub medium: u32,
    /// `RKV_EVENT_BLOCK_STORED`: the cache's page size (tokens per hash); else 0.
    pub block_size: u32,
    /// `RKV_EVENT_BLOCK_STORED`: 1 when `parent_block_hash` is set (the first new page
    /// follows a cached page), 0 when the first new page is its namespace's first; else 0.
    pub has_parent: u32,
    /// The hash of the page just before the first new one, when `has_parent` is 1; else 0.
    pub parent_block_hash: u64,
    /// The pages' hashes (one per page, in token order), `n_block_hashes` of them, in the
    /// caller's `out_hashes`; NULL when there are none (`RKV_EVENT_ALL_BLOCKS_CLEARED`).
    pub block_hashes: *const u64,
    /// How many hashes `block_hashes` holds.
    pub n_block_hashes: usize,
    /// `RKV_EVENT_BLOCK_STORED`: the new pages' tokens, concatenated (`block_size` per
    /// page), `n_token_ids` of them, in the caller's `out_tokens`; else NULL.
    pub token_ids: *const u32,
    /// How many tokens `token_ids` holds.
    pub n_token_ids: usize,
    /// `RKV_EVENT_BLOCK_STORED`: the namespace's LoRA name, a NUL-terminated UTF-8 string
    /// in the caller's `out_strings`; NULL when it has none (and for the other kinds).
    pub lora_name: *const c_char,
    /// `RKV_EVENT_BLOCK_STORED`: the namespace's cache salt as published, in
    /// `out_strings`, or NULL. A namespace other than 0 given neither a LoRA name nor a
    /// salt is published with its decimal id as the salt ("7").
    pub cache_salt: *const c_char,
}

/// What `rkv_events_drain` took, or needs (`rkv_events_drain`). A plain value owned by the
/// caller. On `RKV_OK`: the batches taken and the entries of each buffer they used, and how
/// many batches are still queued. On `RKV_BUFFER_TOO_SMALL`: the batches queued and the
/// entries each buffer needs to take all of them (nothing was taken).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rkv_events_drain_info {
    /// Batches taken (`RKV_OK`) or queued (`RKV_BUFFER_TOO_SMALL`).
    pub n_batches: usize,
    /// `rkv_event`s written to `out_events`, or needed there.
    pub n_events: usize,
    /// Hashes written to `out_hashes`, or needed there.
    pub n_hashes: usize,
    /// Tokens written to `out_tokens`, or needed there.
    pub n_tokens: usize,
    /// Bytes written to `out_strings` (each string with its NUL), or needed there.
    pub n_string_bytes: usize,
    /// Batches left in the queue after the call (those that did not fit, in sequence order
    /// after the ones taken); on `RKV_BUFFER_TOO_SMALL` every queued batch.
    pub batches_left: usize,
}

/// A cache's event counters (`rkv_events_counters`). A plain value owned by the caller.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rkv_events_stats {
    /// Batches closed (sequence numbers handed out).
    pub batches: u64,
    /// Events recorded (each push counts: two adjacent removals that merge into one
    /// drained event count two).
    pub events: u64,
    /// Batches dropped because the drain queue was full (a publisher counts its own).
    pub dropped: u64,
}

/// How `rkv_events_publish` publishes a cache's events on ZMQ (vLLM's KV-event stream).
/// Get the defaults from `rkv_publisher_options_default()` and change fields. A plain
/// value: the caller owns it and its strings, which `rkv_events_publish` only reads during
/// the call (the publisher copies what it keeps).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct rkv_publisher_options {
    /// The PUB endpoint, a NUL-terminated UTF-8 string (required; default
    /// "tcp://\*:5557"). It binds when it contains `*` or is `ipc://`, and connects
    /// otherwise (vLLM's rule); `*` as the host is every interface, as the port any free
    /// port (`rkv_publisher_endpoint` says which). `inproc://` is not supported.
    pub endpoint: *const c_char,
    /// The ROUTER replay endpoint (always bound), or NULL for none (default NULL).
    pub replay_endpoint: *const c_char,
    /// The topic frame of every message, or NULL for the empty topic (default NULL; llm-d
    /// expects `kv@<pod-ip>:<port>@<model>`).
    pub topic: *const c_char,
    /// An `rkv_encoding` value (default `RKV_ENCODING_VLLM_ARRAY`). Hashes go out unsigned
    /// with `RKV_HASH_XXH3` and signed with `RKV_HASH_SGLANG_SHA256`, as those engines
    /// send them.
    pub encoding: u32,
    /// How many of the last batches the replay socket keeps (vLLM's `buffer_steps`;
    /// default 10000; 0 keeps none).
    pub buffer_steps: u64,
    /// The most batches waiting for the publisher's thread, >= 1 (default 100000); past
    /// it, batches are dropped whole and counted (`rkv_publisher_stats.dropped`).
    pub max_queue: u64,
    /// Flush the cache's events this often, in milliseconds, from the publisher's thread,
    /// so events never wait for a caller that stopped calling `rkv_events_flush` (default
    /// 10; 0: only `rkv_events_flush` closes batches).
    pub auto_flush_ms: u64,
    /// How long stopping keeps the sockets open for messages still leaving, in
    /// milliseconds (default 1000).
    pub linger_ms: u64,
    /// The payload's `data_parallel_rank` (default 0).
    pub data_parallel_rank: i64,
}

/// A publisher's counters (`rkv_publisher_counters`). A plain value owned by the caller. Once
/// the publisher has stopped, `published + dropped` is the number of batches the cache
/// closed while it was attached.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rkv_publisher_stats {
    /// Batches sent on the PUB socket.
    pub published: u64,
    /// Batches dropped because the publisher's queue was full.
    pub dropped: u64,
    /// Batches sent through replay (each time one is).
    pub replayed: u64,
    /// Replay requests answered.
    pub replay_requests: u64,
}

/// A running (or stopped) ZMQ publisher of one cache's events: an opaque object created by
/// `rkv_events_publish` and destroyed by `rkv_publisher_free`. It holds its own reference
/// to the cache's event sink, so it stays valid after `rkv_cache_free` of its cache (it
/// then publishes what the cache closed before, and its auto-flush what was pushed before,
/// until it is stopped). `rkv_publisher_endpoint`, `rkv_publisher_counters` and
/// `rkv_publisher_stop` may run from many threads at once; `rkv_publisher_free` must not
/// run concurrently with any other call on the same publisher.
pub struct rkv_publisher {
    inner: imp::Inner,
}

// ---------------------------------------------------------------------------------------
// Helpers (not exported).

/// The cache's event sink, or the refusal of a cache without events.
fn sink(c: &rkv_cache) -> Res<&std::sync::Arc<EventSink>> {
    c.cache.events().ok_or_else(|| {
        fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            "events are not enabled on this cache (call rkv_events_enable right after \
             rkv_cache_new)",
        )
    })
}

/// The optional NUL-terminated UTF-8 string `name` at `p` (NULL is `None`).
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string readable during `'a`.
pub(crate) unsafe fn opt_str<'a>(p: *const c_char, name: &str) -> Res<Option<&'a str>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null; the caller guarantees a readable NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(Some).map_err(|e| {
        fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("{name} is not valid UTF-8 (the first bad byte is at {})", e.valid_up_to()),
        )
    })
}

/// A `u64` option as a `usize`.
fn to_usize(v: u64, name: &str) -> Res<usize> {
    usize::try_from(v).map_err(|_| {
        fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("{name} = {v} does not fit this platform's size_t"),
        )
    })
}

fn medium_of(m: Medium) -> u32 {
    match m {
        Medium::Gpu => rkv_medium::RKV_MEDIUM_GPU as u32,
        Medium::CpuPinned => rkv_medium::RKV_MEDIUM_CPU_PINNED as u32,
    }
}

/// The validated settings of `rkv_events_publish`.
struct PublishOpts {
    endpoint: String,
    replay_endpoint: Option<String>,
    topic: String,
    encoding: Encoding,
    buffer_steps: usize,
    max_queue: usize,
    auto_flush: Option<Duration>,
    linger: Duration,
    data_parallel_rank: i64,
    group: KvGroup,
}

// The publisher proper (the crate radixkv-publisher).
mod imp {
    use std::ffi::{CString, c_char};
    use std::sync::{Arc, Mutex};

    use super::{PublishOpts, rkv_publisher_stats};
    use radixkv_core::events::EventSink;
    use radixkv_core::events::wire::WireOptions;
    use radixkv_publisher::{Publisher, PublisherCounters, PublisherOptions};

    pub(super) struct Inner {
        /// `None` once stopped. The lock is held through a stop, so a second `stop` returns
        /// only once the first is done.
        running: Mutex<Option<Publisher>>,
        counters: PublisherCounters,
        endpoint: CString,
        replay_endpoint: Option<CString>,
    }

    pub(super) fn start(sink: &Arc<EventSink>, o: PublishOpts) -> radixkv_core::Result<Inner> {
        let wire = WireOptions {
            encoding: o.encoding,
            signed_hashes: sink.options().hash_mode.signed_on_wire(),
            data_parallel_rank: o.data_parallel_rank,
            group: o.group,
        };
        let p = Publisher::start(
            sink,
            PublisherOptions {
                endpoint: o.endpoint,
                replay_endpoint: o.replay_endpoint,
                buffer_steps: o.buffer_steps,
                max_queue: o.max_queue,
                topic: o.topic,
                wire,
                auto_flush: o.auto_flush,
                linger: o.linger,
                ..Default::default()
            },
        )?;
        // The endpoints came from C strings, so they hold no NUL; drop any all the same.
        let c = |s: &str| CString::new(s.replace('\0', "")).unwrap_or_default();
        Ok(Inner {
            counters: p.counters(),
            endpoint: c(p.endpoint()),
            replay_endpoint: p.replay_endpoint().map(c),
            running: Mutex::new(Some(p)),
        })
    }

    impl Inner {
        pub(super) fn stop(&self) {
            let mut g = self.running.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = g.take() {
                p.stop();
            }
        }

        pub(super) fn stats(&self) -> rkv_publisher_stats {
            let s = self.counters.get();
            rkv_publisher_stats {
                published: s.published,
                dropped: s.dropped,
                replayed: s.replayed,
                replay_requests: s.replay_requests,
            }
        }

        pub(super) fn endpoints(&self) -> (*const c_char, *const c_char) {
            let replay = self.replay_endpoint.as_ref().map_or(std::ptr::null(), |e| e.as_ptr());
            (self.endpoint.as_ptr(), replay)
        }
    }
}

/// The publisher behind `p`.
///
/// # Safety
/// `p` is NULL or was returned by `rkv_events_publish` and not yet freed, and no
/// `rkv_publisher_free` of it runs during `'a`.
unsafe fn publisher_ref<'a>(p: *const rkv_publisher) -> Res<&'a rkv_publisher> {
    if p.is_null() {
        return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "publisher is NULL"));
    }
    if !p.is_aligned() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("publisher = {p:p} is misaligned: not a pointer rkv_events_publish returned"),
        ));
    }
    // SAFETY: non-null and aligned; by the caller's contract it points to a live
    // `rkv_publisher` made by `rkv_events_publish` (a `Box`) that nobody frees during 'a;
    // only shared references to it are made (its state is behind a mutex and atomics).
    Ok(unsafe { &*p })
}

/// Checks and reads a required options struct `name` at `p`.
///
/// # Safety
/// `p` is NULL or points to a readable `T`, a plain-old-data struct whose every bit
/// pattern is valid.
pub(super) unsafe fn read_opts<T: Copy>(p: *const T, name: &str) -> Res<T> {
    if p.is_null() {
        return Err(fail(rkv_status::RKV_NULL_ARGUMENT, format!("{name} is NULL")));
    }
    if !p.is_aligned() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("{name} = {p:p} is not aligned to {} bytes", align_of::<T>()),
        ));
    }
    // SAFETY: non-null and aligned; the caller guarantees a readable `T` (plain old data).
    Ok(unsafe { p.read() })
}

/// The core's event options for `*opts` (`rkv_events_enable`'s and
/// `rkv_tier_events_enable`'s checks): NULL, an unknown hash mode or medium, or a
/// `max_drain_batches` past `size_t` are refused.
///
/// # Safety
/// `opts` is NULL or points to a readable `rkv_events_options`.
pub(super) unsafe fn event_options(opts: *const rkv_events_options) -> Res<EventOptions> {
    // SAFETY: the caller passes NULL or a readable `rkv_events_options` (plain data).
    let o = unsafe { read_opts(opts, "opts") }?;
    let bad = |m: String| Err(fail(rkv_status::RKV_INVALID_ARGUMENT, m));
    let hash_mode = match o.hash_mode {
        0 => HashMode::Xxh3,
        1 => HashMode::SglangSha256,
        h => {
            return bad(format!(
                "opts->hash_mode = {h} is not an rkv_hash_mode (0 = RKV_HASH_XXH3, 1 = \
                 RKV_HASH_SGLANG_SHA256)"
            ));
        }
    };
    let medium = match o.medium {
        0 => Medium::Gpu,
        1 => Medium::CpuPinned,
        m => {
            return bad(format!(
                "opts->medium = {m} is not an rkv_medium (0 = RKV_MEDIUM_GPU, 1 = \
                 RKV_MEDIUM_CPU_PINNED)"
            ));
        }
    };
    let max_drain_batches = to_usize(o.max_drain_batches, "opts->max_drain_batches")?;
    Ok(EventOptions { hash_mode, medium, max_drain_batches })
}

// ---------------------------------------------------------------------------------------
// Enabling, namespaces, flushing, counters.

/// Default event options: `RKV_HASH_XXH3`, `RKV_MEDIUM_GPU`, max_drain_batches 65536.
/// Returns a plain value. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_events_options_default() -> rkv_events_options {
    let d = EventOptions::default();
    rkv_events_options {
        hash_mode: match d.hash_mode {
            HashMode::Xxh3 => rkv_hash_mode::RKV_HASH_XXH3 as u32,
            HashMode::SglangSha256 => rkv_hash_mode::RKV_HASH_SGLANG_SHA256 as u32,
        },
        medium: medium_of(d.medium),
        max_drain_batches: d.max_drain_batches as u64,
    }
}

/// Turns KV events on for `cache` with `*opts` (required; read only during the call); an
/// extension of version 1. From then on every insert that adds pages records one
/// `RKV_EVENT_BLOCK_STORED`, every page that leaves (eviction, `rkv_cache_reset`,
/// `rkv_drop_namespace`) an `RKV_EVENT_BLOCK_REMOVED`; `rkv_events_flush` closes them into
/// numbered batches, which `rkv_events_drain` takes, or a publisher
/// (`rkv_events_publish`) sends. Only once per cache, and only while the cache is empty
/// (right after `rkv_cache_new`): `RKV_INVALID_ARGUMENT` otherwise, and for an unknown
/// hash_mode or medium. The block size of the events is the cache's page size.
///
/// Not thread-safe: it must not run concurrently with any other call on the same cache
/// (like `rkv_cache_free`), which is why it takes a non-const `rkv_cache *`.
///
/// # Safety
/// `cache` is NULL or live, and no other call on it runs concurrently; `opts` NULL or a
/// readable `rkv_events_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_events_enable(
    cache: *mut rkv_cache,
    opts: *const rkv_events_options,
) -> rkv_status {
    boundary("rkv_events_enable", || {
        // SAFETY: the caller passes NULL or a live cache that nothing else uses meanwhile.
        let c = unsafe { cache_mut(cache) }?;
        // SAFETY: the caller passes NULL or a readable `rkv_events_options` (plain data).
        let eo = unsafe { event_options(opts) }?;
        let bad = |m: String| Err(fail(rkv_status::RKV_INVALID_ARGUMENT, m));
        if c.cache.events().is_some() {
            return bad("events are enabled on this cache already (enable them once)".into());
        }
        let s = c.cache.stats();
        let namespaces = c.cache.tree().namespace_count();
        if s.tree.nodes != 0 || namespaces != 0 {
            return bad(format!(
                "the cache is not empty ({} tokens cached in {} namespaces): enable events \
                 right after rkv_cache_new, before the first insert",
                s.tree.cached_tokens, namespaces
            ));
        }
        c.cache.enable_events(eo).map_err(st)?;
        Ok(())
    })
}

/// Names namespace `ns` on the wire (an extension of version 1): `lora_name` (its LoRA
/// adapter) and `cache_salt` (tenant isolation), each a NUL-terminated UTF-8 string read
/// only during the call, or NULL for none. Must come before the namespace's first insert
/// (its pages' hashes depend on it): `RKV_INVALID_ARGUMENT` afterwards, for an empty
/// string, a string that is not UTF-8, or a cache without events. A namespace never named
/// is published with neither (namespace 0, the base model) or with its decimal id as the
/// salt (any other), so no router merges two namespaces. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `lora_name` and `cache_salt` NULL or NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_events_set_namespace(
    cache: *const rkv_cache,
    ns: u64,
    lora_name: *const c_char,
    cache_salt: *const c_char,
) -> rkv_status {
    boundary("rkv_events_set_namespace", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller passes NULL or NUL-terminated strings.
        let (lora_name, cache_salt) =
            unsafe { (opt_str(lora_name, "lora_name")?, opt_str(cache_salt, "cache_salt")?) };
        let s = sink(c)?;
        let meta = NamespaceMeta {
            lora_name: lora_name.map(str::to_owned),
            cache_salt: cache_salt.map(str::to_owned),
        };
        s.set_namespace(ns, meta).map_err(st)
    })
}

/// Closes the events recorded so far into one batch (an engine calls it once per scheduler
/// step; an extension of version 1) and writes its sequence number to `*out_seq`
/// (required), or `RKV_EVENTS_NO_SEQ` when there were none (no batch, no number used). The
/// batch goes to the drain queue (`rkv_events_drain`), or to the publisher when one is
/// attached. Never blocks on I/O. `RKV_INVALID_ARGUMENT` for a cache without events.
/// Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_seq` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_events_flush(
    cache: *const rkv_cache,
    out_seq: *mut u64,
) -> rkv_status {
    boundary("rkv_events_flush", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_seq, "out_seq")?;
        let seq = sink(c)?.flush().unwrap_or(RKV_EVENTS_NO_SEQ);
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_seq.write(seq) };
        Ok(())
    })
}

/// Writes the cache's event counters to `*out_stats` (required, owned by the caller); an
/// extension of version 1. `RKV_INVALID_ARGUMENT` for a cache without events.
/// Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_stats` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_events_counters(
    cache: *const rkv_cache,
    out_stats: *mut rkv_events_stats,
) -> rkv_status {
    boundary("rkv_events_counters", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_stats, "out_stats")?;
        let s = sink(c)?.stats();
        let s = rkv_events_stats { batches: s.batches, events: s.events, dropped: s.dropped };
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_stats.write(s) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// The publisher.

/// Default publisher options: endpoint "tcp://\*:5557" (a static string), no replay
/// endpoint, the empty topic, `RKV_ENCODING_VLLM_ARRAY`, buffer_steps 10000, max_queue
/// 100000, auto_flush_ms 10, linger_ms 1000, data_parallel_rank 0 (vLLM's defaults).
/// Returns a plain value. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_publisher_options_default() -> rkv_publisher_options {
    rkv_publisher_options {
        endpoint: c"tcp://*:5557".as_ptr(),
        replay_endpoint: std::ptr::null(),
        topic: std::ptr::null(),
        encoding: rkv_encoding::RKV_ENCODING_VLLM_ARRAY as u32,
        buffer_steps: 10_000,
        max_queue: 100_000,
        auto_flush_ms: 10,
        linger_ms: 1000,
        data_parallel_rank: 0,
    }
}

/// Starts a ZMQ publisher of `cache`'s events with `*opts` (required; it and its strings
/// are read only during the call) and writes it to `*out_publisher` (required); an
/// extension of version 1. The sockets are made and bound here, so what would keep them
/// from working is an error of this call, and then nothing changed (the cache keeps its
/// drain queue): `RKV_NULL_ARGUMENT` for a NULL `opts->endpoint`; `RKV_INVALID_ARGUMENT`
/// for an endpoint the transport cannot parse or does not have (`"nonsense"`,
/// "tcp://\*:notaport", `"inproc://x"`), a string that is not UTF-8, an unknown encoding,
/// max_queue 0, a cache without events, or a cache that has a publisher already;
/// `RKV_IO_ERROR` for an address in use (or another refusal by the operating system).
///
/// From then on every batch the cache closes (`rkv_events_flush`, or the publisher's
/// auto-flush) goes to the publisher, first what was in the drain queue: vLLM's stream
/// (three frames: topic, sequence number as big-endian u64, msgpack payload), off the
/// calling thread; a full queue drops whole batches and counts them. One publisher per
/// cache at a time; after `rkv_publisher_stop` another may start.
///
/// The caller owns the publisher and frees it with `rkv_publisher_free` (which stops it
/// first). It holds its own reference to the cache's events, so it may outlive the cache:
/// stopping and freeing it after `rkv_cache_free` is safe. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `opts` NULL or a readable `rkv_publisher_options` whose string
/// fields are NULL or NUL-terminated strings; `out_publisher` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_events_publish(
    cache: *const rkv_cache,
    opts: *const rkv_publisher_options,
    out_publisher: *mut *mut rkv_publisher,
) -> rkv_status {
    boundary("rkv_events_publish", || {
        // SAFETY: the caller's contract is `publish_body`'s; a NULL group is the default.
        unsafe { publish_body(cache, opts, std::ptr::null(), out_publisher) }
    })
}

/// `rkv_events_publish`'s body, with the KV group `group` (NULL: the default).
///
/// # Safety
/// As `rkv_events_publish_ex`.
unsafe fn publish_body(
    cache: *const rkv_cache,
    opts: *const rkv_publisher_options,
    group: *const rkv_kv_group,
    out_publisher: *mut *mut rkv_publisher,
) -> Res<()> {
    // SAFETY: the caller passes NULL or a live cache that is not being freed.
    let c = unsafe { cache_ref(cache) }?;
    // SAFETY: the caller passes NULL or a readable `rkv_publisher_options` (plain data:
    // its pointers are read as values here and checked below).
    let o = unsafe { read_opts(opts, "opts") }?;
    // SAFETY: the caller passes NULL or a readable `rkv_kv_group`.
    let group = unsafe { group::kv_group(group) }?;
    check_out(out_publisher, "out_publisher")?;
    // SAFETY: the caller guarantees each string field is NULL or NUL-terminated.
    let (endpoint, replay_endpoint, topic) = unsafe {
        (
            opt_str(o.endpoint, "opts->endpoint")?,
            opt_str(o.replay_endpoint, "opts->replay_endpoint")?,
            opt_str(o.topic, "opts->topic")?,
        )
    };
    let Some(endpoint) = endpoint else {
        return Err(fail(
            rkv_status::RKV_NULL_ARGUMENT,
            "opts->endpoint is NULL (give the PUB endpoint, e.g. \"tcp://*:5557\")",
        ));
    };
    let bad = |m: String| Err(fail(rkv_status::RKV_INVALID_ARGUMENT, m));
    let encoding = match o.encoding {
        0 => Encoding::VllmArray,
        1 => Encoding::VllmMap,
        e => {
            return bad(format!(
                "opts->encoding = {e} is not an rkv_encoding (0 = RKV_ENCODING_VLLM_ARRAY, \
                 1 = RKV_ENCODING_VLLM_MAP)"
            ));
        }
    };
    if o.max_queue == 0 {
        return bad("opts->max_queue = 0: the publisher's queue needs room for at least \
                    one batch"
            .into());
    }
    let opts = PublishOpts {
        endpoint: endpoint.to_owned(),
        replay_endpoint: replay_endpoint.map(str::to_owned),
        topic: topic.unwrap_or("").to_owned(),
        encoding,
        buffer_steps: to_usize(o.buffer_steps, "opts->buffer_steps")?,
        max_queue: to_usize(o.max_queue, "opts->max_queue")?,
        auto_flush: (o.auto_flush_ms > 0).then(|| Duration::from_millis(o.auto_flush_ms)),
        linger: Duration::from_millis(o.linger_ms),
        data_parallel_rank: o.data_parallel_rank,
        group,
    };
    let s = sink(c)?;
    let inner = imp::start(s, opts).map_err(st)?;
    let raw = Box::into_raw(Box::new(rkv_publisher { inner }));
    // SAFETY: `out_publisher` passed `check_out` (non-null, aligned) and the caller
    // guarantees it is writable.
    unsafe { out_publisher.write(raw) };
    Ok(())
}

/// Writes the publisher's endpoints (an extension of version 1): `*out_endpoint` (required)
/// the PUB endpoint as bound (a wildcard port resolved: `"tcp://127.0.0.1:40123"` for
/// `"tcp://127.0.0.1:*"`) or as connected, `*out_replay_endpoint` (required) the replay
/// endpoint as bound, or NULL without one. The strings are owned by the publisher: valid,
/// unchanged, until `rkv_publisher_free` (also after a stop); do not free them.
/// Thread-safe.
///
/// # Safety
/// `publisher` is NULL or live; `out_endpoint` and `out_replay_endpoint` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_publisher_endpoint(
    publisher: *const rkv_publisher,
    out_endpoint: *mut *const c_char,
    out_replay_endpoint: *mut *const c_char,
) -> rkv_status {
    boundary("rkv_publisher_endpoint", || {
        // SAFETY: the caller passes NULL or a live publisher that is not being freed.
        let p = unsafe { publisher_ref(publisher) }?;
        check_out(out_endpoint, "out_endpoint")?;
        check_out(out_replay_endpoint, "out_replay_endpoint")?;
        let (ep, replay) = p.inner.endpoints();
        // SAFETY: both passed `check_out`; writable by the caller's contract.
        unsafe {
            out_endpoint.write(ep);
            out_replay_endpoint.write(replay);
        }
        Ok(())
    })
}

/// Writes the publisher's counters to `*out_stats` (required, owned by the caller); an
/// extension of version 1. Never waits, also while another thread stops the publisher;
/// final once it has stopped. Thread-safe.
///
/// # Safety
/// `publisher` is NULL or live; `out_stats` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_publisher_counters(
    publisher: *const rkv_publisher,
    out_stats: *mut rkv_publisher_stats,
) -> rkv_status {
    boundary("rkv_publisher_counters", || {
        // SAFETY: the caller passes NULL or a live publisher that is not being freed.
        let p = unsafe { publisher_ref(publisher) }?;
        check_out(out_stats, "out_stats")?;
        let s = p.inner.stats();
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_stats.write(s) };
        Ok(())
    })
}

/// Stops the publisher (an extension of version 1): flushes the cache's events, detaches
/// from the cache (its later batches go to the drain queue again), sends what is queued,
/// keeps the sockets open for the linger (still answering replay) and closes them; returns
/// when all that is done (it blocks for about `linger_ms`). A publisher stopped already:
/// `RKV_OK`, nothing to do (a concurrent second stop returns once the first is done). Safe
/// after the cache was freed. The handle stays valid (endpoints, final counters) until
/// `rkv_publisher_free`. Thread-safe.
///
/// # Safety
/// `publisher` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_publisher_stop(publisher: *mut rkv_publisher) -> rkv_status {
    boundary("rkv_publisher_stop", || {
        // SAFETY: the caller passes NULL or a live publisher that is not being freed.
        let p = unsafe { publisher_ref(publisher) }?;
        p.inner.stop();
        Ok(())
    })
}

/// Destroys a publisher, stopping it first if it runs (as `rkv_publisher_stop`, which
/// blocks for the linger). NULL is a no-op. Safe after the cache was freed. Must not run
/// concurrently with any other call on the same publisher, and the publisher (and the
/// strings of `rkv_publisher_endpoint`) must not be used afterwards. Leaves
/// `rkv_last_error_message()` as it is.
///
/// # Safety
/// `publisher` is NULL or was returned by `rkv_events_publish` and not freed yet, and no
/// other call on it runs concurrently or follows.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_publisher_free(publisher: *mut rkv_publisher) {
    if publisher.is_null() || !publisher.is_aligned() {
        return;
    }
    // SAFETY: `publisher` came from `Box::into_raw` in `rkv_events_publish` and, by the
    // caller's contract, is freed once and used by no one else now, so we own it again.
    let owned = unsafe { Box::from_raw(publisher) };
    // A panic here would abort at the boundary; contain it (the publisher is dropped
    // either way, on a panic during unwinding).
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        owned.inner.stop();
        drop(owned);
    }));
}

mod drain;
pub use drain::*;
mod group;
pub use group::*;

#[cfg(test)]
mod tests;
