//! `radixkv indexer`: the standalone KV indexer service (issue 28; `ROUTER.md`,
//! "Interfaces" → "Service"; `docs/indexer.md`).
//!
//! A drop-in for NVIDIA Dynamo's standalone `kv_indexer`: workers (engines publishing vLLM
//! KV events over ZMQ) are registered over HTTP, the service subscribes to each one's PUB
//! socket and keeps one [`radixkv_router::RouterIndex`] per (model, tenant); routers ask
//! it, per request, how many leading tokens each worker holds.
//!
//! # HTTP API (JSON)
//!
//! | Endpoint | Body / answer |
//! |---|---|
//! | `POST /register` | `{instance_id, endpoint, model_name, tenant_id?, block_size, dp_rank?, lora_name?, replay_endpoint?}` → 201 `{"status":"ok"}` |
//! | `POST /unregister` | `{instance_id, model_name, tenant_id?, dp_rank?}` → 200 `{"status":"ok"}`, 404 when not registered |
//! | `GET /workers` | `[{instance_id, endpoints: {dp_rank: endpoint}, ...}]` |
//! | `POST /query` | `{token_ids, model_name, tenant_id?, lora_name?}` → `{scores: {worker_id: {dp_rank: matched_tokens}}, frequencies, tree_sizes}` |
//! | `POST /query_by_hash` | `{block_hashes, model_name, tenant_id?}` → the same |
//! | `GET /dump` | the [`Snapshot`] (registrations, cursors, blocks) |
//! | `GET /metrics` | Prometheus text |
//! | `GET /healthz`, `GET /health` | 200 `ok` |
//!
//! Errors are 4xx with `{"error": "..."}` (a body over `--max-body` is 413 with a text
//! message): 400 for JSON that does not parse or lacks a field, 404 for an unknown model
//! (or an unregistered worker), 409 for a register that conflicts (the (instance, dp_rank)
//! is registered, or the model's index has another block size), 429 past `--max-workers`,
//! 507 past `--max-bytes`.
//!
//! # Streams
//!
//! Each registration has its own thread with a SUB socket connected to the worker's
//! endpoint (libzmq reconnects, backing off from 100 ms to 5 s) and, with a replay
//! endpoint, a DEALER socket to the worker's ROUTER replay socket; a slow or dead
//! publisher stalls only its own thread. Per stream the thread keeps the next `seq`
//! expected:
//!
//! - **Join.** What a worker published before the subscription (or since the snapshot's
//!   cursor) is learned through replay: at the stream's first live batch, the batches from
//!   the cursor (0 when it has none) up to it are replayed and applied, then it; if the
//!   stream stays silent for a second, everything from the cursor is replayed instead (an
//!   idle publisher).
//! - **Gap** (`seq` above the cursor: a batch lost on PUB, or dropped past the SUB
//!   socket's receive queue, `--queue-limit`): the batches from the cursor up to the live
//!   one are replayed and applied in order, then it; a gap replay cannot cover (the
//!   worker's ring no longer has it, or no replay endpoint) clears the worker and re-learns
//!   it from there (the router index's [`radixkv_router::GapPolicy::Clear`]).
//! - **Silence.** A second after messages came (and then backing off to 30 s while it finds
//!   nothing or fails), a stream replays from its cursor: batches lost just before a pause,
//!   which no later batch shows as a gap, are not lost for good.
//! - **Duplicate** (a live batch already applied from such a replay answer: same `seq`,
//!   same payload bytes): skipped.
//! - **Restart** (a `seq` below the cursor that is not a duplicate; or a replay from the
//!   cursor, which starts at the last batch applied, answering other bytes for it: the
//!   publisher came back with a new stream, at 0 or past the old cursor): the worker's
//!   blocks are dropped first, then it is re-learned from replay and the new stream. An
//!   idle publisher that never sends `AllBlocksCleared` is handled by the same rule.
//! - **Malformed**: a message that is not `[topic, seq (8 bytes), payload]`, or a payload
//!   that does not decode, is counted and skipped (the cursor moves past it, so it is not
//!   taken for a gap).
//!
//! Unregister drops the worker's blocks ([`radixkv_router::RouterIndex::remove_worker`])
//! under the stream's lock, so no batch of it applies after the answer; its thread then
//! ends at its next wake-up.
//!
//! # Snapshot, peers
//!
//! With `--snapshot PATH` the [`Snapshot`] is written atomically (a temporary file, then a
//! rename) every `--snapshot-interval` and at shutdown, and loaded at start; each worker's
//! stream then resumes from its cursor through replay. `--peer URL` loads a running
//! replica's `GET /dump` instead (the snapshot file if the peer cannot be had).
//!
//! # Differences from Dynamo's `kv_indexer`
//!
//! See `docs/indexer.md`: `/dump` is the [`Snapshot`] (not Dynamo's per-model event list);
//! `tree_sizes` is `{}`; `lora_name` on register is recorded, not used; `/healthz` and
//! `/metrics` are added; no `/register_peer`, `/peers` or `/test/*` endpoints.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod client;
mod http;
mod metrics;
mod snapshot;
mod sub;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use radixkv_router::{GapPolicy, RouterIndex, RouterOptions, Worker};

pub use snapshot::{
    Registration, SNAPSHOT_VERSION, Snapshot, SnapshotIndex, SnapshotWorker, StreamCursor,
};

/// The service's settings (the flags of `radixkv indexer`).
#[derive(Debug, Clone)]
pub struct Config {
    /// `HOST:PORT` to listen on (port 0: any free port; [`Indexer::local_addr`] says which).
    pub listen: String,
    /// The snapshot file (loaded at start, written on the interval and at shutdown).
    pub snapshot: Option<PathBuf>,
    /// How often the snapshot is written (`None`: only at shutdown).
    pub snapshot_interval: Option<Duration>,
    /// A replica's base URL (`http://host:port`) to bootstrap from (its `GET /dump`).
    pub peer: Option<String>,
    /// The largest request body accepted (bytes); larger is 413.
    pub max_body: usize,
    /// Messages a stream's SUB socket queues (libzmq's receive high-water mark); past it
    /// libzmq drops them, which the stream sees as a gap and replay repairs.
    pub queue_limit: usize,
    /// Registered streams at most (and each index's `max_workers`).
    pub max_workers: u32,
    /// The indexes' heap bytes past which registers are refused (507): a cap on admission
    /// (registered workers' streams go on applying). `None`: no cap.
    pub max_bytes: Option<u64>,
    /// How long a replay answer may stay silent before the request is given up.
    pub replay_timeout: Duration,
    /// The HTTP server's threads.
    pub http_threads: usize,
    /// How long one HTTP request may take, its body's arrival included; past it the
    /// request gets 408 and its connection's task is freed (a client that sends its body
    /// slowly holds nothing for longer).
    pub request_timeout: Duration,
    /// Log lines on stderr (logfmt).
    pub log: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8090".into(),
            snapshot: None,
            snapshot_interval: None,
            peer: None,
            max_body: 8 << 20,
            queue_limit: 100_000,
            max_workers: 4096,
            max_bytes: None,
            replay_timeout: Duration::from_secs(2),
            http_threads: 2,
            request_timeout: Duration::from_secs(30),
            log: true,
        }
    }
}

/// A failure to start or to stop the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// (model_name, tenant_id).
pub(crate) type IndexKey = (String, String);

/// One (model, tenant) index.
pub(crate) struct ModelIndex {
    pub(crate) block_size: u32,
    pub(crate) index: RouterIndex,
}

/// What a stream's lock guards: applying a batch and unregistering exclude each other.
pub(crate) struct StreamState {
    /// Unregistered (or the service stopping): apply nothing more.
    pub(crate) stopped: bool,
    /// The next `seq` expected.
    pub(crate) next: Option<u64>,
    /// The dp ranks its payloads named (the index's workers it made).
    pub(crate) ranks: Vec<u32>,
    /// The last batch applied: its seq and payload hash.
    pub(crate) last: Option<(u64, u64)>,
}

/// One registration and its subscriber thread.
pub(crate) struct Stream {
    pub(crate) reg: Registration,
    pub(crate) index: Arc<ModelIndex>,
    pub(crate) state: Mutex<StreamState>,
    /// Set with `state.stopped`: the thread ends at its next wake-up.
    pub(crate) stop: AtomicBool,
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
    pub(crate) ctx: Arc<CtxSlot>,
}

impl Stream {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, StreamState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops the worker's blocks and stops the thread (under the lock: no batch of it
    /// applies afterwards).
    fn retire(&self) {
        let mut st = self.lock();
        st.stopped = true;
        self.stop.store(true, Ordering::Relaxed);
        let mut ranks = st.ranks.clone();
        ranks.push(self.reg.dp_rank);
        ranks.sort_unstable();
        ranks.dedup();
        for r in ranks {
            self.index.index.remove_worker(Worker::new(self.reg.instance_id, r));
        }
    }
}

/// A ZMQ context with a count of the streams on it: libzmq allows 1,023 sockets per
/// context by default (and the zmq crate cannot raise it), so streams are spread over
/// contexts of at most [`STREAMS_PER_CONTEXT`] each.
pub(crate) struct CtxSlot {
    pub(crate) ctx: zmq::Context,
    streams: AtomicUsize,
}

const STREAMS_PER_CONTEXT: usize = 400;

impl Drop for Stream {
    fn drop(&mut self) {
        self.ctx.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The shared state of a running service.
pub(crate) struct State {
    pub(crate) cfg: Config,
    pub(crate) indexes: RwLock<HashMap<IndexKey, Arc<ModelIndex>>>,
    /// Registrations by (instance_id, dp_rank), as Dynamo keys them.
    pub(crate) streams: Mutex<BTreeMap<(u64, u32), Arc<Stream>>>,
    pub(crate) metrics: metrics::Metrics,
    contexts: Mutex<Vec<Arc<CtxSlot>>>,
    /// The service is shutting down: streams drain what they have and end.
    pub(crate) stopping: AtomicBool,
}

/// Why a register or unregister was refused: an HTTP status and a message.
pub(crate) struct Refused(pub(crate) u16, pub(crate) String);

pub(crate) fn log(state: &State, level: &str, msg: std::fmt::Arguments<'_>) {
    if state.cfg.log && level != "debug" {
        eprintln!("radixkv-indexer level={level} {msg}");
    }
}

impl State {
    fn new(cfg: Config) -> State {
        State {
            cfg,
            indexes: RwLock::new(HashMap::new()),
            streams: Mutex::new(BTreeMap::new()),
            metrics: metrics::Metrics::new(),
            contexts: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
        }
    }

    pub(crate) fn streams(&self) -> std::sync::MutexGuard<'_, BTreeMap<(u64, u32), Arc<Stream>>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn index(&self, model: &str, tenant: &str) -> Option<Arc<ModelIndex>> {
        let m = self.indexes.read().unwrap_or_else(|p| p.into_inner());
        m.get(&(model.to_owned(), tenant.to_owned())).cloned()
    }

    /// The indexes' heap bytes now.
    pub(crate) fn index_bytes(&self) -> u64 {
        let m = self.indexes.read().unwrap_or_else(|p| p.into_inner());
        m.values().map(|ix| ix.index.stats().bytes).sum()
    }

    fn context(&self) -> Arc<CtxSlot> {
        let mut cs = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cs.iter().find(|c| c.streams.load(Ordering::Relaxed) < STREAMS_PER_CONTEXT)
        {
            c.streams.fetch_add(1, Ordering::Relaxed);
            return c.clone();
        }
        let c = Arc::new(CtxSlot { ctx: zmq::Context::new(), streams: AtomicUsize::new(1) });
        cs.push(c.clone());
        c
    }

    /// The (model, tenant) index, made with `block_size` if it is new.
    fn index_for(
        &self,
        model: &str,
        tenant: &str,
        block_size: u32,
    ) -> Result<Arc<ModelIndex>, Refused> {
        let mut m = self.indexes.write().unwrap_or_else(|p| p.into_inner());
        if let Some(ix) = m.get(&(model.to_owned(), tenant.to_owned())) {
            if ix.block_size != block_size {
                return Err(Refused(
                    409,
                    format!(
                        "block_size mismatch for model={model} tenant={tenant}: existing={}, requested={block_size}",
                        ix.block_size
                    ),
                ));
            }
            return Ok(ix.clone());
        }
        let index = RouterIndex::new(self.router_options(block_size))
            .map_err(|e| Refused(400, format!("cannot make an index: {e}")))?;
        let ix = Arc::new(ModelIndex { block_size, index });
        m.insert((model.to_owned(), tenant.to_owned()), ix.clone());
        log(
            self,
            "info",
            format_args!(
                "msg=\"new index\" model={model:?} tenant={tenant:?} block_size={block_size}"
            ),
        );
        Ok(ix)
    }

    fn router_options(&self, block_size: u32) -> RouterOptions {
        RouterOptions {
            block_size,
            max_workers: self.cfg.max_workers,
            gap_policy: GapPolicy::Clear,
        }
    }

    /// Registers a stream and starts its thread (`next`: the cursor to resume from).
    pub(crate) fn register(
        self: &Arc<Self>,
        reg: Registration,
        next: Option<u64>,
        last: Option<(u64, u64)>,
    ) -> Result<(), Refused> {
        if reg.block_size == 0 {
            return Err(Refused(400, "block_size must be at least 1".into()));
        }
        for ep in std::iter::once(&reg.endpoint).chain(reg.replay_endpoint.as_ref()) {
            if !(ep.starts_with("tcp://") || ep.starts_with("ipc://")) || ep.contains('*') {
                return Err(Refused(
                    400,
                    format!("endpoint {ep:?}: not a tcp:// or ipc:// address to connect to"),
                ));
            }
        }
        if self.stopping.load(Ordering::Relaxed) {
            return Err(Refused(503, "the service is shutting down".into()));
        }
        let mut streams = self.streams();
        let key = (reg.instance_id, reg.dp_rank);
        if streams.contains_key(&key) {
            return Err(Refused(
                409,
                format!("instance {} dp_rank {} already registered", reg.instance_id, reg.dp_rank),
            ));
        }
        if streams.len() >= self.cfg.max_workers as usize {
            return Err(Refused(
                429,
                format!("{} workers are registered already (--max-workers)", streams.len()),
            ));
        }
        if let Some(cap) = self.cfg.max_bytes {
            let used = self.index_bytes();
            if used >= cap {
                return Err(Refused(
                    507,
                    format!(
                        "memory cap reached: the indexes hold {used} bytes (--max-bytes {cap})"
                    ),
                ));
            }
        }
        let index = self.index_for(&reg.model_name, &reg.tenant_id, reg.block_size)?;
        let stream = Arc::new(Stream {
            index,
            state: Mutex::new(StreamState { stopped: false, next, ranks: Vec::new(), last }),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            ctx: self.context(),
            reg,
        });
        let t = sub::spawn(self.clone(), stream.clone())
            .map_err(|e| Refused(503, format!("cannot start the stream's thread: {e}")))?;
        *stream.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
        log(
            self,
            "info",
            format_args!(
                "msg=registered instance_id={} dp_rank={} endpoint={:?} replay={:?} model={:?} tenant={:?}",
                stream.reg.instance_id,
                stream.reg.dp_rank,
                stream.reg.endpoint,
                stream.reg.replay_endpoint,
                stream.reg.model_name,
                stream.reg.tenant_id
            ),
        );
        streams.insert(key, stream);
        Ok(())
    }

    /// Unregisters the instance's streams of `model` (of `tenant` when given, of `dp_rank`
    /// when given); their blocks leave the index before this returns.
    pub(crate) fn unregister(
        &self,
        instance_id: u64,
        model: &str,
        tenant: Option<&str>,
        dp_rank: Option<u32>,
    ) -> Result<usize, Refused> {
        let mut streams = self.streams();
        let keys: Vec<(u64, u32)> = streams
            .range((instance_id, 0)..=(instance_id, u32::MAX))
            .filter(|(k, s)| {
                s.reg.model_name == model
                    && tenant.is_none_or(|t| s.reg.tenant_id == t)
                    && dp_rank.is_none_or(|r| k.1 == r)
            })
            .map(|(k, _)| *k)
            .collect();
        if keys.is_empty() {
            return Err(Refused(
                404,
                format!(
                    "instance {instance_id}{} not registered for model {model}",
                    dp_rank.map(|r| format!(" dp_rank {r}")).unwrap_or_default()
                ),
            ));
        }
        for k in &keys {
            if let Some(s) = streams.remove(k) {
                s.retire();
                s.index.index.reclaim();
            }
        }
        log(
            self,
            "info",
            format_args!("msg=unregistered instance_id={instance_id} streams={}", keys.len()),
        );
        Ok(keys.len())
    }

    /// The [`Snapshot`] now (each worker's cursor and blocks consistent with each other;
    /// registers and unregisters wait for it, so the registrations are those of the dumps).
    pub(crate) fn snapshot(&self) -> Snapshot {
        let streams = self.streams();
        // Every stream held still while the indexes are dumped: each stream's cursor and
        // last batch are those of its worker's dump.
        let held: Vec<_> = streams.values().map(|s| s.lock()).collect();
        let idx: Vec<(IndexKey, Arc<ModelIndex>)> = {
            let m = self.indexes.read().unwrap_or_else(|p| p.into_inner());
            m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        let mut indexes: Vec<SnapshotIndex> = idx
            .into_iter()
            .map(|((model_name, tenant_id), ix)| SnapshotIndex {
                model_name,
                tenant_id,
                block_size: ix.block_size,
                workers: ix.index.dump().iter().map(SnapshotWorker::from_dump).collect(),
            })
            .collect();
        indexes.sort_by(|a, b| (&a.model_name, &a.tenant_id).cmp(&(&b.model_name, &b.tenant_id)));
        let registrations = streams.values().map(|s| s.reg.clone()).collect();
        let cursors = streams
            .values()
            .zip(&held)
            .map(|(s, st)| StreamCursor {
                instance_id: s.reg.instance_id,
                dp_rank: s.reg.dp_rank,
                next_seq: st.next,
                last_seq: st.last.map(|l| l.0),
                last_hash: st.last.map(|l| l.1),
            })
            .collect();
        drop(held);
        Snapshot { version: SNAPSHOT_VERSION, indexes, registrations, streams: cursors }
    }

    /// Loads `snap` into an empty service: the indexes, then the streams (resuming from
    /// the cursors the dumps recorded).
    fn restore(self: &Arc<Self>, snap: &Snapshot) -> Result<(), Error> {
        {
            let mut m = self.indexes.write().unwrap_or_else(|p| p.into_inner());
            for si in &snap.indexes {
                // Only the workers of a registration (no stream would ever drop the others).
                let registered = |w: &&SnapshotWorker| {
                    snap.registrations.iter().any(|r| {
                        r.instance_id == w.worker_id
                            && r.model_name == si.model_name
                            && r.tenant_id == si.tenant_id
                    })
                };
                let dumps: Vec<_> =
                    si.workers.iter().filter(registered).map(SnapshotWorker::to_dump).collect();
                let index = RouterIndex::restore(self.router_options(si.block_size), &dumps)
                    .map_err(|e| {
                        Error(format!("snapshot: index {}/{}: {e}", si.model_name, si.tenant_id))
                    })?;
                m.insert(
                    (si.model_name.clone(), si.tenant_id.clone()),
                    Arc::new(ModelIndex { block_size: si.block_size, index }),
                );
            }
        }
        for r in &snap.registrations {
            if let Some(c) = snap
                .streams
                .iter()
                .find(|c| c.instance_id == r.instance_id && c.dp_rank == r.dp_rank)
            {
                let last = c.last_seq.zip(c.last_hash);
                self.register(r.clone(), c.next_seq, last)
                    .map_err(|Refused(_, m)| Error(format!("snapshot: {m}")))?;
                continue;
            }
            // A snapshot without stream cursors: the index's.
            let next = snap
                .indexes
                .iter()
                .find(|i| i.model_name == r.model_name && i.tenant_id == r.tenant_id)
                .and_then(|i| {
                    i.workers
                        .iter()
                        .find(|w| w.worker_id == r.instance_id && w.dp_rank == r.dp_rank)
                })
                .and_then(|w| w.next_seq);
            self.register(r.clone(), next, None)
                .map_err(|Refused(_, m)| Error(format!("snapshot: {m}")))?;
        }
        Ok(())
    }

    fn write_snapshot(&self) -> Result<(), Error> {
        let Some(path) = &self.cfg.snapshot else { return Ok(()) };
        let snap = self.snapshot();
        snapshot::write_atomic(path, &snap)
            .map_err(|e| Error(format!("cannot write snapshot {}: {e}", path.display())))?;
        self.metrics.snapshots.fetch_add(1, Ordering::Relaxed);
        log(
            self,
            "info",
            format_args!(
                "msg=\"snapshot written\" path={:?} registrations={}",
                path.display(),
                snap.registrations.len()
            ),
        );
        Ok(())
    }
}

/// A running service (see the crate docs). [`Indexer::shutdown`] stops it.
pub struct Indexer {
    state: Arc<State>,
    addr: SocketAddr,
    rt: Option<tokio::runtime::Runtime>,
    http: Option<tokio::task::JoinHandle<()>>,
    http_stop: Option<tokio::sync::oneshot::Sender<()>>,
    snapshotter: Option<(JoinHandle<()>, std::sync::mpsc::Sender<()>)>,
}

impl Indexer {
    /// Loads the peer's dump or the snapshot (when configured), starts the streams and the
    /// HTTP server. Returns once it listens.
    pub fn start(cfg: Config) -> Result<Indexer, Error> {
        let state = Arc::new(State::new(cfg.clone()));
        let mut restored = false;
        if let Some(peer) = &cfg.peer {
            let url = format!("{}/dump", peer.trim_end_matches('/'));
            match client::get(&url).and_then(|r| {
                if r.status == 200 {
                    snapshot::parse(&r.body)
                } else {
                    Err(format!("status {}: {}", r.status, r.text()))
                }
            }) {
                Ok(snap) => {
                    state.restore(&snap)?;
                    restored = true;
                    log(
                        &state,
                        "info",
                        format_args!(
                            "msg=\"bootstrapped from peer\" url={url:?} registrations={}",
                            snap.registrations.len()
                        ),
                    );
                }
                Err(e) => log(
                    &state,
                    "warn",
                    format_args!("msg=\"peer dump unavailable\" url={url:?} error={e:?}"),
                ),
            }
        }
        if !restored
            && let Some(path) = &cfg.snapshot
            && let Some(snap) = snapshot::read(path).map_err(Error)?
        {
            state.restore(&snap)?;
            log(
                &state,
                "info",
                format_args!(
                    "msg=\"snapshot loaded\" path={:?} registrations={}",
                    path.display(),
                    snap.registrations.len()
                ),
            );
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.http_threads.max(1))
            .thread_name("radixkv-indexer-http")
            .enable_all()
            .build()
            .map_err(|e| Error(format!("cannot start the HTTP runtime: {e}")))?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(&cfg.listen))
            .map_err(|e| Error(format!("cannot listen on {}: {e}", cfg.listen)))?;
        let addr = listener.local_addr().map_err(|e| Error(e.to_string()))?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let app = http::router(state.clone());
        let http = rt.spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        let snapshotter = match (&cfg.snapshot, cfg.snapshot_interval) {
            (Some(_), Some(every)) => {
                let (stx, srx) = std::sync::mpsc::channel::<()>();
                let st = state.clone();
                let t = std::thread::Builder::new()
                    .name("radixkv-indexer-snapshot".into())
                    .spawn(move || {
                        while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                            srx.recv_timeout(every)
                        {
                            if let Err(e) = st.write_snapshot() {
                                log(
                                    &st,
                                    "error",
                                    format_args!("msg=\"snapshot failed\" error={:?}", e.0),
                                );
                            }
                        }
                    })
                    .map_err(|e| Error(format!("cannot start the snapshot thread: {e}")))?;
                Some((t, stx))
            }
            _ => None,
        };
        Ok(Indexer {
            state,
            addr,
            rt: Some(rt),
            http: Some(http),
            http_stop: Some(tx),
            snapshotter,
        })
    }

    /// Where the HTTP server listens (the port bound when `listen` asked for 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until SIGTERM or SIGINT.
    pub fn wait_for_signal(&self) -> Result<(), Error> {
        let rt = self.rt.as_ref().expect("running");
        rt.block_on(async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .map_err(|e| Error(format!("cannot handle SIGTERM: {e}")))?;
            tokio::select! {
                _ = term.recv() => {}
                r = tokio::signal::ctrl_c() => { r.map_err(|e| Error(format!("cannot handle SIGINT: {e}")))?; }
            }
            Ok(())
        })
    }

    /// Stops: the HTTP server (requests in flight finish), the streams (each applies what
    /// its socket holds already), then writes the snapshot.
    pub fn shutdown(mut self) -> Result<(), Error> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), Error> {
        let Some(rt) = self.rt.take() else { return Ok(()) };
        if let Some(tx) = self.http_stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.http.take() {
            let _ = rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), h).await });
        }
        rt.shutdown_timeout(Duration::from_secs(1));
        if let Some((t, tx)) = self.snapshotter.take() {
            drop(tx);
            let _ = t.join();
        }
        self.state.stopping.store(true, Ordering::Relaxed);
        let streams: Vec<Arc<Stream>> = self.state.streams().values().cloned().collect();
        for s in &streams {
            s.stop.store(true, Ordering::Relaxed);
        }
        for s in &streams {
            let t = s.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(t) = t {
                let _ = t.join();
            }
        }
        self.state.write_snapshot()?;
        // The streams' sockets close with them (the registrations stay for the snapshot
        // taken above).
        self.state.streams().clear();
        log(&self.state, "info", format_args!("msg=stopped"));
        Ok(())
    }
}

impl Drop for Indexer {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Runs the service until SIGTERM or SIGINT, printing where it listens
/// (`radixkv indexer: listening on http://HOST:PORT`), then drains and writes the snapshot.
pub fn run(cfg: Config) -> Result<(), Error> {
    let svc = Indexer::start(cfg)?;
    println!("radixkv indexer: listening on http://{}", svc.local_addr());
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let waited = svc.wait_for_signal();
    let stopped = svc.shutdown();
    waited.and(stopped)
}
