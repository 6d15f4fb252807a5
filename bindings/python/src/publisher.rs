//! `radixkv._radixkv.NativePublisher`: a KV-event ZMQ publisher (`radixkv::events::publisher`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use radixkv::events::EventSink;
use radixkv::events::wire::{Encoding, KvCacheSpecKind, KvGroup, WireOptions};
use radixkv_publisher::{Publisher, PublisherCounters, PublisherOptions};

use crate::errors::*;

pub struct Opts {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub topic: String,
    pub encoding: u32,
    pub buffer_steps: u64,
    pub max_queue: u64,
    pub auto_flush_ms: u64,
    pub linger_ms: u64,
    pub data_parallel_rank: i64,
    pub group_idx: u32,
    pub kv_cache_spec_kind: String,
    pub sliding_window: Option<u32>,
}

pub fn start(sink: &Arc<EventSink>, o: Opts) -> Res<NativePublisher> {
    let bad = |m: String| Err(fail(INVALID_ARGUMENT, m));
    let encoding = match o.encoding {
        0 => Encoding::VllmArray,
        1 => Encoding::VllmMap,
        e => {
            return bad(format!(
                "encoding = {e} is not an encoding (0 = vllm-array, 1 = vllm-map)"
            ));
        }
    };
    if o.max_queue == 0 {
        return bad("max_queue = 0: the publisher's queue needs room for at least one batch".into());
    }
    for (name, s) in [
        ("endpoint", Some(&o.endpoint)),
        ("replay_endpoint", o.replay_endpoint.as_ref()),
        ("topic", Some(&o.topic)),
    ] {
        if s.is_some_and(|s| s.contains('\0')) {
            return bad(format!("{name} holds a NUL character"));
        }
    }
    // The KV group this cache holds: vLLM's kind strings, a window only with a sliding kind.
    let group = KvCacheSpecKind::from_name(&o.kv_cache_spec_kind)
        .and_then(|k| KvGroup::new(o.group_idx, k, o.sliding_window))
        .map_err(st)?;
    let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    let wire = WireOptions {
        encoding,
        signed_hashes: sink.options().hash_mode.signed_on_wire(),
        data_parallel_rank: o.data_parallel_rank,
        group,
    };
    let p = Publisher::start(
        sink,
        PublisherOptions {
            endpoint: o.endpoint,
            replay_endpoint: o.replay_endpoint,
            buffer_steps: size(o.buffer_steps),
            max_queue: size(o.max_queue),
            topic: o.topic,
            wire,
            auto_flush: (o.auto_flush_ms > 0).then(|| Duration::from_millis(o.auto_flush_ms)),
            linger: Duration::from_millis(o.linger_ms),
            ..Default::default()
        },
    )
    .map_err(st)?;
    Ok(NativePublisher {
        counters: p.counters(),
        endpoint: p.endpoint().to_owned(),
        replay_endpoint: p.replay_endpoint().map(str::to_owned),
        running: Mutex::new(Some(p)),
    })
}

/// A running (or stopped) publisher. It may outlive its cache.
#[pyclass(frozen, module = "radixkv._radixkv")]
pub struct NativePublisher {
    /// `None` once stopped; held through a stop, so a second stop returns once the first
    /// is done.
    running: Mutex<Option<Publisher>>,
    counters: PublisherCounters,
    #[pyo3(get)]
    endpoint: String,
    #[pyo3(get)]
    replay_endpoint: Option<String>,
}

#[pymethods]
impl NativePublisher {
    /// `(published, dropped, replayed, replay_requests)`; never waits.
    fn stats(&self) -> (u64, u64, u64, u64) {
        let s = self.counters.get();
        (s.published, s.dropped, s.replayed, s.replay_requests)
    }

    /// Flushes, sends what is queued, lingers and closes (with the GIL released).
    /// Stopping again does nothing.
    fn stop(&self, py: Python<'_>) {
        py.detach(|| {
            let mut g = self.running.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = g.take() {
                p.stop();
            }
        });
    }
}
