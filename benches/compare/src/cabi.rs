//! radixkv driven through its C ABI, as a C engine drives it: `libradixkv.so` is loaded at
//! run time (`dlopen`, not linked), its functions are looked up by name (`dlsym`), and every
//! call passes raw pointers to caller-owned buffers (`include/radixkv.h`; contract in
//! `docs/contract/C_ABI.md`). The contestants here do the same logical work per request as their Rust
//! counterparts (`rkv` in `peers.rs`, the Cache cycle of workload 4a in `work.rs`), call for
//! call, so any difference between the two is what the ABI costs.
//!
//! The library is the one named by `--lib PATH`, else `$RADIXKV_COMPARE_LIB`, else
//! `libradixkv.so` next to this binary (`target/release/` when both are built there). Build
//! it with `cargo build --release --lib` at the repository root.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::peers::{Index, Scratch};
use crate::trace::Req;
use crate::work::EvictRun;

/// `rkv_status` (a C enum: an `int`).
type Status = c_int;
const RKV_OK: Status = 0;

/// `rkv_options`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Options {
    page_size: u32,
    eviction_policy: u32,
    pool_slots: u64,
}

/// `rkv_stats`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Stats {
    pub cached_tokens: u64,
    pub evictable_tokens: u64,
    pub protected_tokens: u64,
    pub nodes: u64,
    pub pool_slots: u64,
    pub free_slots: u64,
    pub match_calls: u64,
    pub match_query_tokens: u64,
    pub match_hit_tokens: u64,
    pub inserted_tokens: u64,
    pub evicted_tokens: u64,
}

/// `rkv_cache` (opaque).
#[repr(C)]
pub struct CCache {
    _opaque: [u8; 0],
}

type FreeFn = Option<unsafe extern "C" fn(*mut c_void, *const u32, usize)>;

/// The library's functions, looked up once per process.
pub struct Lib {
    status_str: unsafe extern "C" fn(Status) -> *const c_char,
    options_default: unsafe extern "C" fn() -> Options,
    cache_new: unsafe extern "C" fn(*const Options, *mut *mut CCache) -> Status,
    cache_free: unsafe extern "C" fn(*mut CCache),
    cache_stats: unsafe extern "C" fn(*const CCache, *mut Stats) -> Status,
    #[allow(clippy::type_complexity)]
    match_: unsafe extern "C" fn(
        *const CCache,
        u64,
        *const u32,
        usize,
        *mut u32,
        usize,
        *mut usize,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    match_lock: unsafe extern "C" fn(
        *const CCache,
        u64,
        *const u32,
        usize,
        *mut u32,
        usize,
        *mut usize,
        *mut u64,
    ) -> Status,
    insert: unsafe extern "C" fn(
        *const CCache,
        u64,
        *const u32,
        *const u32,
        usize,
        *mut usize,
    ) -> Status,
    release: unsafe extern "C" fn(*const CCache, u64) -> Status,
    evict: unsafe extern "C" fn(*const CCache, usize, FreeFn, *mut c_void, *mut usize) -> Status,
    alloc: unsafe extern "C" fn(*const CCache, usize, *mut u32) -> Status,
    reclaim: unsafe extern "C" fn(*const CCache) -> Status,
}

unsafe extern "C" {
    fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
    fn dlerror() -> *const c_char;
}
const RTLD_NOW: c_int = 2;
const RTLD_LOCAL: c_int = 0;

static PATH: OnceLock<String> = OnceLock::new();
static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

/// Sets the library's path (`--lib`), before anything loads it.
pub fn set_path(p: String) {
    let _ = PATH.set(p);
}

/// Where the library is looked for: `--lib`, else `$RADIXKV_COMPARE_LIB`, else next to this
/// binary.
pub fn path() -> String {
    if let Some(p) = PATH.get() {
        return p.clone();
    }
    if let Some(p) = std::env::var_os("RADIXKV_COMPARE_LIB") {
        return p.to_string_lossy().into_owned();
    }
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("libradixkv.so")))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "libradixkv.so".into())
}

/// For the report's header: which library the C ABI contestants load, when it was built, and
/// whether a file under the crate's `src/` is newer (then it may not be the code the Rust
/// contestants run).
pub fn describe() -> String {
    let p = path();
    let Ok(m) = std::fs::metadata(&p).and_then(|m| m.modified()) else {
        return format!("{p} (missing: `cargo build --release --lib` at the repository root)");
    };
    fn newest(dir: &std::path::Path) -> Option<std::time::SystemTime> {
        let mut t = None;
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            let ft = e.file_type().ok()?;
            let x =
                if ft.is_dir() { newest(&e.path()) } else { e.metadata().ok()?.modified().ok() };
            t = t.max(x);
        }
        t
    }
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../src");
    let age = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
    };
    let stale = match newest(&src) {
        Some(s) if s > m => format!(
            "; older than src/ by {} s: rebuild it with `cargo build --release -p radixkv-ffi`",
            age(s) - age(m)
        ),
        _ => String::new(),
    };
    format!("{p}{stale}")
}

/// The loaded library; without it the process says how to build it and exits (the
/// message is then the last line of the child's stderr, which the table's row shows).
pub fn lib() -> &'static Lib {
    match LIB.get_or_init(|| load(&path())) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1)
        }
    }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call
    // on this thread; it is copied at once.
    unsafe {
        let e = dlerror();
        if e.is_null() {
            "unknown error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into()
        }
    }
}

/// A looked-up symbol as the function pointer type `F`.
///
/// # Safety
/// `p` is a function whose signature is `F`'s, and `F` is a function pointer type.
unsafe fn func<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
    // SAFETY: same size (checked); the caller guarantees `p` is a function of type `F`.
    unsafe { std::mem::transmute_copy(&p) }
}

fn load(path: &str) -> Result<Lib, String> {
    let how = "build it with `cargo build --release --lib` at the repository root, or name another \
               with --lib PATH or RADIXKV_COMPARE_LIB=PATH";
    if !std::path::Path::new(path).exists() {
        return Err(format!("rkv-c: {path} does not exist: {how}"));
    }
    let c = CString::new(path).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated path; loading runs the library's initializers, which a Rust
    // cdylib has none of beyond std's.
    let h = unsafe { dlopen(c.as_ptr(), RTLD_NOW | RTLD_LOCAL) };
    if h.is_null() {
        return Err(format!("rkv-c: cannot load {path}: {}; {how}", dl_error()));
    }
    let sym = |name: &CStr| -> Result<*mut c_void, String> {
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { dlsym(h, name.as_ptr()) };
        if p.is_null() {
            Err(format!("rkv-c: {path} has no {}: {}; {how}", name.to_string_lossy(), dl_error()))
        } else {
            Ok(p)
        }
    };
    // SAFETY (every `func` below): each symbol is the function of that name declared in
    // include/radixkv.h, with exactly the signature it is transmuted to; the library stays
    // loaded for the rest of the process (never dlclose'd).
    unsafe {
        let abi: unsafe extern "C" fn() -> u32 = func(sym(c"rkv_abi_version")?);
        if abi() != 1 {
            return Err(format!("rkv-c: {path} has C ABI version {}, not 1", abi()));
        }
        Ok(Lib {
            status_str: func(sym(c"rkv_status_str")?),
            options_default: func(sym(c"rkv_options_default")?),
            cache_new: func(sym(c"rkv_cache_new")?),
            cache_free: func(sym(c"rkv_cache_free")?),
            cache_stats: func(sym(c"rkv_cache_stats")?),
            match_: func(sym(c"rkv_match")?),
            match_lock: func(sym(c"rkv_match_lock")?),
            insert: func(sym(c"rkv_insert")?),
            release: func(sym(c"rkv_release")?),
            evict: func(sym(c"rkv_evict")?),
            alloc: func(sym(c"rkv_alloc")?),
            reclaim: func(sym(c"rkv_reclaim")?),
        })
    }
}

/// A call that did not return `RKV_OK`: the harness stops, as the Rust contestants'
/// `unwrap()`s do.
#[cold]
#[inline(never)]
fn failed(l: &Lib, what: &str, st: Status) -> ! {
    // SAFETY: rkv_status_str returns a static NUL-terminated string for any value.
    let s = unsafe { CStr::from_ptr((l.status_str)(st)) };
    panic!("{what} returned {st}: {}", s.to_string_lossy())
}

#[inline(always)]
fn ok(l: &Lib, what: &str, st: Status) {
    if st != RKV_OK {
        failed(l, what, st);
    }
}

/// One `rkv_cache *`, freed on drop.
pub struct Cache {
    lib: &'static Lib,
    raw: *mut CCache,
}

// SAFETY: docs/contract/C_ABI.md: every function taking `const rkv_cache *` is safe to call from many
// threads at once; `rkv_cache_free` runs only in `drop`, which has the cache to itself.
unsafe impl Send for Cache {}
// SAFETY: as above.
unsafe impl Sync for Cache {}

impl Cache {
    /// `rkv_cache_new` with LRU eviction, `page` tokens per page and a pool of `pool_slots`
    /// (0: the caller manages slots).
    pub fn new(page: usize, pool_slots: usize) -> Cache {
        let lib = lib();
        // SAFETY: plain calls with a readable options struct and a writable out pointer.
        unsafe {
            let mut o = (lib.options_default)();
            o.page_size = page as u32;
            o.eviction_policy = 0; // RKV_EVICT_LRU
            o.pool_slots = pool_slots as u64;
            let mut raw = std::ptr::null_mut();
            ok(lib, "rkv_cache_new", (lib.cache_new)(&o, &mut raw));
            Cache { lib, raw }
        }
    }

    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        // SAFETY: a live cache and a writable stats struct.
        ok(self.lib, "rkv_cache_stats", unsafe { (self.lib.cache_stats)(self.raw, &mut s) });
        s
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        // SAFETY: made by rkv_cache_new, freed once, nobody else uses it any more.
        unsafe { (self.lib.cache_free)(self.raw) }
    }
}

/// Makes sure `out` can take `n` slots and returns the pointer a C engine passes as its
/// output buffer (`out` itself is left empty: its length is set after the call).
#[inline(always)]
fn buffer(out: &mut Vec<u32>, n: usize) -> *mut u32 {
    out.clear();
    out.reserve(n);
    out.as_mut_ptr()
}

// ------------------------------------------------------------------------ workloads 1 and 2

/// The `rkv` contestant through the C ABI, caller-managed slots (`pool_slots = 0`, as `rkv`
/// is the bare tree with the harness's slots): a lookup is `rkv_match` writing the matched
/// slots into the caller's buffer (capacity `n_tokens`, so it always fits); a store is
/// `rkv_insert` with the request's fresh slots.
pub struct RkvC {
    cache: Cache,
}

impl RkvC {
    pub fn new(page: usize) -> Self {
        RkvC { cache: Cache::new(page, 0) }
    }
}

impl Index for RkvC {
    fn lookup(&self, r: &Req, s: &mut Scratch) -> usize {
        let l = self.cache.lib;
        let n = r.tokens.len();
        let out = buffer(&mut s.out, n);
        let mut len = 0usize;
        // SAFETY: a live cache; `tokens[0..n]` readable; `out[0..n]` writable (reserved).
        let st =
            unsafe { (l.match_)(self.cache.raw, r.ns, r.tokens.as_ptr(), n, out, n, &mut len) };
        ok(l, "rkv_match", st);
        // SAFETY: rkv_match wrote `len <= n` slots to the buffer.
        unsafe { s.out.set_len(len) };
        len
    }
    fn store(&self, r: &Req, _cached: usize, slots: &[u32], _s: &mut Scratch) {
        let l = self.cache.lib;
        let mut existing = 0usize;
        // SAFETY: a live cache; tokens and slots readable for `r.tokens.len()` values.
        let st = unsafe {
            (l.insert)(
                self.cache.raw,
                r.ns,
                r.tokens.as_ptr(),
                slots.as_ptr(),
                r.tokens.len(),
                &mut existing,
            )
        };
        ok(l, "rkv_insert", st);
    }
    fn cached_tokens(&self) -> Option<u64> {
        Some(self.cache.stats().cached_tokens)
    }
    fn holds(&self) -> &'static str {
        "token + slot"
    }
}

// ------------------------------------------------------------------------ workload 4a

/// [`crate::work::evict_replay_rkv`]'s slot-list cycle (`CacheCycle::Lists`) through the C
/// ABI, call for call, on a cache with a pool of `cap` slots (page 1): `rkv_match_lock`
/// (slots into the request's buffer), `rkv_evict(short, NULL, ..)` when the pool has fewer
/// free slots than the request needs (timed), `rkv_alloc` of the rest into the same buffer
/// after the matched slots, `rkv_insert` of the whole request with that buffer,
/// `rkv_release`, `rkv_reclaim`.
pub fn evict_replay_c(reqs: &[Req], cap: usize) -> EvictRun {
    let cache = Cache::new(1, cap);
    let (l, c) = (cache.lib, cache.raw as *const CCache);
    let mut slots: Vec<u32> = Vec::new();
    let mut calls = Vec::new();
    let mut sizes = Vec::new();
    let mut nodes_evicted = 0u64;
    let mut hits = 0u64;
    let t0 = std::time::Instant::now();
    for r in reqs {
        let n = r.tokens.len();
        let buf = buffer(&mut slots, n);
        let (mut m, mut lock) = (0usize, 0u64);
        // SAFETY (every call in this loop): a live cache; `r.tokens[0..n]` readable;
        // `buf[0..n]` writable (reserved above, not moved since); the lock is this cache's.
        unsafe {
            let st = (l.match_lock)(c, r.ns, r.tokens.as_ptr(), n, buf, n, &mut m, &mut lock);
            ok(l, "rkv_match_lock", st);
            hits += m as u64;
            let need = n - m;
            let short = need.saturating_sub(cache.stats().free_slots as usize);
            if short > 0 {
                let n0 = cache.stats().nodes;
                let t = std::time::Instant::now();
                let mut freed = 0usize;
                ok(l, "rkv_evict", (l.evict)(c, short, None, std::ptr::null_mut(), &mut freed));
                calls.push(t.elapsed().as_secs_f64());
                sizes.push((short as f64, freed as f64));
                nodes_evicted += n0 - cache.stats().nodes;
            }
            ok(l, "rkv_alloc", (l.alloc)(c, need, buf.add(m)));
            let mut existing = 0usize;
            ok(l, "rkv_insert", (l.insert)(c, r.ns, r.tokens.as_ptr(), buf, n, &mut existing));
            ok(l, "rkv_release", (l.release)(c, lock));
            ok(l, "rkv_reclaim", (l.reclaim)(c)); // between requests, as the Rust cycle does
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let evicted = cache.stats().evicted_tokens;
    crate::work::finish_run(secs, hits, calls, sizes, nodes_evicted as f64, evicted)
}
