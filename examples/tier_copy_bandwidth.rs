//! Host-tier copy bandwidth on a GPU: device → pinned host and host → device through
//! [`radixkv::tier::CudaTierCopier`], for a model-sized layout (default 32 layers x 8 KV heads
//! x 128 x fp16 = 128 KiB per token), copying `--tokens` tokens in runs of `--run` slots.
//!
//! `cargo run --release --features cuda --example tier_copy_bandwidth -- [--tokens N]
//! [--run R] [--iters I]`; `scripts/gpu-check` runs it. Prints GB/s each way.

#[cfg(feature = "cuda")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use std::sync::Arc;
    use std::time::Instant;

    use radixkv::kv::{CudaKvStorage, KvLayout};
    use radixkv::tier::{CudaTierCopier, TierCopier};

    let mut args = std::env::args().skip(1);
    let (mut tokens, mut run, mut iters) = (4096usize, 16usize, 5usize);
    while let Some(a) = args.next() {
        let v = args.next().ok_or("missing value")?.parse()?;
        match a.as_str() {
            "--tokens" => tokens = v,
            "--run" => run = v,
            "--iters" => iters = v,
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    let slots = tokens * 2;
    let layout = KvLayout::new(32, slots, 8, 128, 2);
    let store = Arc::new(CudaKvStorage::new(0, layout)?);
    let copier = CudaTierCopier::new(store.clone(), slots)?;
    println!("device: {}", store.device_name()?);
    // Runs of `run` consecutive slots, every other run skipped (so runs stay separate).
    let src: Vec<u32> = (0..tokens).map(|i| ((i / run) * 2 * run + i % run) as u32).collect();
    let dst = src.clone();
    let bytes = (tokens * layout.bytes_per_token()) as f64;
    for (name, to_host) in [("device -> host", true), ("host -> device", false)] {
        let mut best = f64::MAX;
        for _ in 0..iters {
            let t0 = Instant::now();
            let t =
                if to_host { copier.to_host(&src, &dst)? } else { copier.to_device(&src, &dst)? };
            copier.wait(t)?;
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "{name}: {tokens} tokens in runs of {run}, {:.1} MiB: best {:.3} ms, {:.1} GB/s",
            bytes / (1 << 20) as f64,
            best * 1e3,
            bytes / best / 1e9
        );
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("tier_copy_bandwidth needs --features cuda");
    std::process::exit(2);
}
