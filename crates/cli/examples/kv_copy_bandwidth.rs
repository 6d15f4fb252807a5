//! `copy_slots` bandwidth: how fast whole slots (all layers, K and V) move, for a
//! realistic layout, in runs of a few lengths.
//!
//! Built with `--features cuda` it measures `CudaKvStorage` on GPU 0, batched
//! (`cuMemcpyBatchAsync`) against per-run (`cuMemcpyDtoDAsync` in a loop); when no GPU is
//! usable it says why and measures the host backend instead (or exits with status 1 when
//! `RADIXKV_REQUIRE_GPU=1`). Built without it, it measures `HostKvStorage`.
//!
//! ```text
//! cargo run --release --example kv_copy_bandwidth                  # host
//! cargo run --release --features cuda --example kv_copy_bandwidth  # GPU
//! cargo run --release --example kv_copy_bandwidth -- --help
//! ```
//!
//! GB/s counts the bytes copied (each is read once and written once), 1 GB = 1e9 bytes.

use std::time::Instant;

use clap::Parser;
use radixkv::kv::{HostKvStorage, KvLayout, KvStorage};

#[derive(Parser, Debug)]
#[command(about = "copy_slots bandwidth of the KV storage backends")]
struct Args {
    /// Transformer layers.
    #[arg(long, default_value_t = 32)]
    layers: usize,
    /// Slots in the store [default: 65536 on a GPU, 16384 on the host (2 GiB)].
    #[arg(long)]
    slots: Option<usize>,
    /// KV heads.
    #[arg(long, default_value_t = 8)]
    kv_heads: usize,
    /// Elements per head.
    #[arg(long, default_value_t = 128)]
    head_dim: usize,
    /// Bytes per element (2 = fp16/bf16).
    #[arg(long, default_value_t = 2)]
    elem_bytes: usize,
    /// Slots copied per `copy_slots` call.
    #[arg(long, default_value_t = 4096)]
    copy: usize,
    /// Run lengths to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![16, 1])]
    runs: Vec<usize>,
    /// Timed calls per measurement (after one warm-up call).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// Measure the host backend even when built with `cuda`.
    #[arg(long)]
    host: bool,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
}

/// `copy` slots in runs of `run`: source runs in the lower half of the store, destination
/// runs in the upper half, each followed by a gap of `run` slots so neighbouring runs
/// never merge into longer ones.
fn slot_lists(slots: usize, copy: usize, run: usize) -> Result<(Vec<u32>, Vec<u32>), String> {
    if run == 0 || copy == 0 || !copy.is_multiple_of(run) {
        return Err(format!("--copy {copy} must be a positive multiple of the run length {run}"));
    }
    let half = slots / 2;
    if 2 * copy > half {
        return Err(format!(
            "--slots {slots} is too small to copy {copy} slots in separated runs (need {})",
            4 * copy
        ));
    }
    let mut src = Vec::with_capacity(copy);
    let mut dst = Vec::with_capacity(copy);
    for j in 0..copy / run {
        for i in 0..run {
            src.push((j * 2 * run + i) as u32);
            dst.push((half + j * 2 * run + i) as u32);
        }
    }
    Ok((src, dst))
}

/// Marks the first and last copied slot in the first and last layer, so a measurement
/// can check that the copy happened.
fn mark(s: &dyn KvStorage, src: &[u32], tag: u8) -> radixkv::Result<()> {
    let l = *s.layout();
    for layer in [0, l.num_layers - 1] {
        for &slot in [src[0], src[src.len() - 1]].iter() {
            let k = vec![tag ^ slot as u8 ^ layer as u8; l.slot_bytes()];
            let v = vec![!tag ^ slot as u8; l.slot_bytes()];
            s.write_slot(layer, slot, &k, &v)?;
        }
    }
    Ok(())
}

fn check(s: &dyn KvStorage, src: &[u32], dst: &[u32]) -> Result<(), String> {
    let l = *s.layout();
    let (mut ks, mut vs) = (vec![0; l.slot_bytes()], vec![0; l.slot_bytes()]);
    let (mut kd, mut vd) = (ks.clone(), vs.clone());
    for layer in [0, l.num_layers - 1] {
        for i in [0, src.len() - 1] {
            s.read_slot(layer, src[i], &mut ks, &mut vs).map_err(|e| e.to_string())?;
            s.read_slot(layer, dst[i], &mut kd, &mut vd).map_err(|e| e.to_string())?;
            if (&ks, &vs) != (&kd, &vd) {
                return Err(format!("layer {layer}: slot {} was not copied to {}", src[i], dst[i]));
            }
        }
    }
    Ok(())
}

/// One way to run `copy_slots(src, dst)`.
type CopyFn<'a> = dyn Fn(&[u32], &[u32]) -> radixkv::Result<()> + 'a;

/// Times `iters` calls of `copy` (after one warm-up), checks the result, prints a line.
fn measure(
    label: &str,
    s: &dyn KvStorage,
    src: &[u32],
    dst: &[u32],
    iters: usize,
    tag: u8,
    copy: &CopyFn,
) -> Result<(), String> {
    mark(s, src, tag).map_err(|e| e.to_string())?;
    copy(src, dst).map_err(|e| format!("{label}: {e}"))?;
    check(s, src, dst)?;
    let bytes = (src.len() * s.layout().bytes_per_token()) as f64;
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        copy(src, dst).map_err(|e| format!("{label}: {e}"))?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let best = times[0];
    println!(
        "  {label:<10} {:>8.1} GB/s median  {:>8.1} GB/s best  ({:.3} ms per call)",
        bytes / median / 1e9,
        bytes / best / 1e9,
        median * 1e3
    );
    Ok(())
}

fn layout(args: &Args, default_slots: usize) -> KvLayout {
    KvLayout::new(
        args.layers,
        args.slots.unwrap_or(default_slots),
        args.kv_heads,
        args.head_dim,
        args.elem_bytes,
    )
}

fn describe(l: &KvLayout, args: &Args) {
    println!(
        "layout: {} layers, {} slots, {} kv heads x {} x {} B: {} B per slot per buffer, \
         {} B per token (all layers, K+V), {:.2} GiB in all",
        l.num_layers,
        l.num_slots,
        l.num_kv_heads,
        l.head_dim,
        l.elem_bytes,
        l.slot_bytes(),
        l.bytes_per_token(),
        l.total_bytes() as f64 / (1u64 << 30) as f64
    );
    println!(
        "copy_slots of {} slots = {:.1} MiB per call, {} timed calls per line",
        args.copy,
        (args.copy * l.bytes_per_token()) as f64 / (1u64 << 20) as f64,
        args.iters
    );
}

fn run_host(args: &Args) -> Result<(), String> {
    let l = layout(args, 16384);
    describe(&l, args);
    let s = HostKvStorage::new(l).map_err(|e| e.to_string())?;
    println!(
        "backend: host memory ({} threads available, copy is single-threaded)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for (i, &run) in args.runs.iter().enumerate() {
        let (src, dst) = slot_lists(l.num_slots, args.copy, run)?;
        println!("runs of {run} ({} copies per call):", 2 * l.num_layers * args.copy / run);
        measure("host", &s, &src, &dst, args.iters, i as u8, &|a, b| s.copy_slots(a, b))?;
    }
    Ok(())
}

#[cfg(feature = "cuda")]
fn run_cuda(args: &Args) -> Result<bool, String> {
    use radixkv::kv::{CopyMethod, CudaKvStorage};
    let l = layout(args, 65536);
    let s = match CudaKvStorage::new(args.device, l) {
        Ok(s) => s,
        Err(e) => {
            if std::env::var("RADIXKV_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                return Err(format!("RADIXKV_REQUIRE_GPU=1 but the CUDA backend failed: {e}"));
            }
            println!("CUDA backend unavailable ({e}); measuring the host backend instead");
            return Ok(false);
        }
    };
    describe(&l, args);
    println!(
        "backend: CUDA device {} ({}), cuMemcpyBatchAsync available: {}",
        args.device,
        s.device_name().unwrap_or_else(|e| e.to_string()),
        if s.has_batched_copy() { "yes" } else { "no (CUDA 12.8+ driver needed)" }
    );
    let mut methods = vec![];
    if s.has_batched_copy() {
        methods.push(("batched", CopyMethod::Batched));
    }
    methods.push(("per-run", CopyMethod::PerRun));
    let mut tag = 0u8;
    for &run in &args.runs {
        let (src, dst) = slot_lists(l.num_slots, args.copy, run)?;
        println!("runs of {run} ({} copies per call):", 2 * l.num_layers * args.copy / run);
        for &(label, method) in &methods {
            tag = tag.wrapping_add(1);
            measure(label, &s, &src, &dst, args.iters, tag, &|a, b| {
                s.copy_slots_with(a, b, method)
            })?;
        }
    }
    Ok(true)
}

fn main() {
    let args = Args::parse();
    #[cfg(feature = "cuda")]
    let done = if args.host { Ok(false) } else { run_cuda(&args) };
    #[cfg(not(feature = "cuda"))]
    let done: Result<bool, String> = Ok(false);
    let r = done.and_then(|done| if done { Ok(()) } else { run_host(&args) });
    if let Err(e) = r {
        eprintln!("kv_copy_bandwidth: {e}");
        std::process::exit(1);
    }
}
