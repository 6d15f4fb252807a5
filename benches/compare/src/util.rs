//! Measuring helpers: a counting allocator (on only in memory child processes), resident set
//! size, medians with ranges, a CPU spin loop, a small deterministic RNG.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Instant;

/// The system allocator, counting live heap bytes while `COUNTING` is set. Off by default, so
/// the timed workloads pay one relaxed load of a never-written flag per allocation; the memory
/// figures are taken in child processes that turn it on before they build anything.
pub struct Counting;

pub static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        }
        // SAFETY: forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        }
        // SAFETY: forwarded.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_sub(l.size() as i64, Ordering::Relaxed);
        }
        // SAFETY: forwarded.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(new as i64 - l.size() as i64, Ordering::Relaxed);
        }
        // SAFETY: forwarded.
        unsafe { System.realloc(p, l, new) }
    }
}

/// Live heap bytes counted since counting was turned on (frees of blocks allocated before
/// that are counted too, so take differences over a window where none happen).
pub fn heap_live() -> i64 {
    LIVE.load(Ordering::SeqCst)
}

/// Resident set size in bytes, from `/proc/self/statm`.
pub fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s.split_whitespace().nth(1).and_then(|x| x.parse().ok()).unwrap_or(0);
    pages * 4096
}

/// Seconds of `f`.
pub fn time<R>(f: impl FnOnce() -> R) -> (R, f64) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed().as_secs_f64())
}

/// Median and range of a sample.
#[derive(Clone, Copy, Debug, Default)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

pub fn summarize(xs: &[f64]) -> Summary {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return Summary { median: f64::NAN, min: f64::NAN, max: f64::NAN, n: 0 };
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Summary { median, min: v[0], max: v[n - 1], n }
}

/// Nearest-rank percentile of an unsorted sample.
pub fn percentile(xs: &mut [f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = ((p / 100.0) * xs.len() as f64).ceil() as usize;
    xs[rank.clamp(1, xs.len()) - 1]
}

/// Pure CPU work: `iters` rounds of xorshift on a register, no memory traffic.
#[inline(never)]
pub fn spin(iters: u64, seed: u64) -> u64 {
    let mut x = seed | 1;
    for _ in 0..iters {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    x
}

/// xorshift64*: deterministic, seedable, fast.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next() >> 32) * n) >> 32
    }
}

/// `1234567` as `1,234,567`.
pub fn commas(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Seconds in a readable unit.
pub fn secs(x: f64) -> String {
    if !x.is_finite() {
        "-".into()
    } else if x >= 1.0 {
        format!("{x:.2} s")
    } else if x >= 1e-3 {
        format!("{:.1} ms", x * 1e3)
    } else if x >= 1e-6 {
        format!("{:.2} µs", x * 1e6)
    } else if x >= 1e-8 {
        format!("{:.0} ns", x * 1e9)
    } else {
        format!("{:.2} ns", x * 1e9)
    }
}

/// `median [min–max]` of seconds.
pub fn secs_range(s: &Summary) -> String {
    format!("{} [{}–{}]", secs(s.median), secs(s.min), secs(s.max))
}

/// A rate (per second) with an SI suffix.
pub fn rate(x: f64) -> String {
    if !x.is_finite() {
        "-".into()
    } else if x >= 1e9 {
        format!("{:.2} G", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.1} M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1} k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}
