#![deny(unsafe_op_in_unsafe_fn, missing_docs, clippy::undocumented_unsafe_blocks)]

//! The ZMQ publisher: vLLM's PUB stream and ROUTER replay, off the calling thread.
//!
//! [`Publisher::start`] attaches to an [`EventSink`]: from then on every batch the sink
//! closes ([`EventSink::flush`], or the publisher's own flush every
//! [`PublisherOptions::auto_flush`]) is handed, without blocking, to a bounded queue that
//! the publisher's thread empties. The thread encodes each batch ([`radixkv::events::wire`]) and
//! sends it as three frames: `topic`, `seq` (u64 big-endian), `payload`.
//!
//! - **Dropping.** When the queue is full, the sink's flush drops the whole batch and
//!   counts it ([`PublisherStats::dropped`]); a batch is never split. Its sequence number
//!   is used all the same, so a subscriber sees the gap, and the batch is still kept for
//!   replay. A push or flush never waits for the thread or the socket.
//! - **Replay.** With a replay endpoint, a ROUTER socket answers `[b"", start_seq]`
//!   (u64 big-endian) with `[b"", seq, payload]` for each kept batch with
//!   `seq >= start_seq` (the last [`PublisherOptions::buffer_steps`] closed, published or
//!   dropped, up to the last the thread has taken from the queue), then
//!   `[b"", 0xffff_ffff_ffff_ffff, b""]`.
//! - **Endpoints.** The PUB socket binds when the endpoint contains `*` or is `ipc://` or
//!   `inproc://`, and connects otherwise; the replay socket always binds. `*` as the host
//!   means every interface and as the port any free port ([`Publisher::endpoint`] says which).
//!   A bad endpoint or `inproc://` (which the transport does not have: use `ipc://`) is an
//!   [`Error::InvalidArgument`] from `start`, and an address
//!   in use (or any other refusal by the operating system: a bind without permission, a
//!   runtime or thread that cannot be had) an [`Error::Io`], each naming
//!   the endpoint and the reason. A connecting PUB socket connects in the background and
//!   keeps trying until its peer listens.
//! - **High-water mark.** The transport means to drop messages for a subscriber whose queue
//!   holds 100,000 of them (its fixed high-water mark, vLLM's default `hwm`), but as built
//!   (`zeromq` 0.7) it does not: it sends through a fresh clone of the subscriber's
//!   `futures` channel sender each time, and each clone is granted a slot past the
//!   channel's bound, so a subscriber that stops reading makes the publisher's process
//!   hold every message it has not taken, without limit (measured: 1,000,000 one-page
//!   batches to a stalled subscriber, all delivered once it read again, the publisher's
//!   RSS peaking at 632 MiB; `BENCHMARKS.md`, "KV events"). Nothing is dropped there, and
//!   the publisher cannot see that queue; the batches dropped at its own queue are counted.
//!
//! The ZMQ implementation is the pure-Rust `zeromq` crate (zmq.rs), run on a one-thread
//! tokio runtime inside the publisher's thread: it speaks ZMTP 3 to libzmq peers (vLLM's
//! and Dynamo's), and keeps `libradixkv.a` free of a C++ runtime (`docs/kv-events.md` says
//! why it, not libzmq's binding).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc::{Receiver, Sender, error::TrySendError};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use radixkv::Error;
use radixkv::error::Result;
use radixkv::events::wire::{WireOptions, encode_batch};
use radixkv::events::{BatchOutlet, EventBatch, EventSink};

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

fn io(msg: impl Into<String>) -> Error {
    Error::Io(msg.into())
}

/// The sequence number of the replay's end marker.
pub const REPLAY_END: u64 = u64::MAX;

/// A publisher's settings. `Default` gives vLLM's defaults on `tcp://*:5557`.
#[derive(Debug, Clone)]
pub struct PublisherOptions {
    /// The PUB endpoint (`tcp://*:5557` binds; `tcp://host:port` connects).
    pub endpoint: String,
    /// The ROUTER replay endpoint, if any (always bound).
    pub replay_endpoint: Option<String>,
    /// How many of the last batches replay keeps (vLLM's `buffer_steps`; none are kept
    /// without a replay endpoint).
    pub buffer_steps: usize,
    /// The most batches waiting for the publisher's thread; past it, batches are dropped.
    pub max_queue: usize,
    /// The topic frame (UTF-8; llm-d expects `kv@<pod-ip>:<port>@<model>`).
    pub topic: String,
    /// How payloads are encoded.
    pub wire: WireOptions,
    /// Flush the sink this often from the publisher's thread (`None`: only the caller's
    /// [`EventSink::flush`] closes batches).
    pub auto_flush: Option<Duration>,
    /// How long closing the publisher keeps its sockets open for messages still leaving.
    pub linger: Duration,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        PublisherOptions {
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            max_queue: 100_000,
            topic: String::new(),
            wire: WireOptions::default(),
            auto_flush: Some(Duration::from_millis(10)),
            linger: Duration::from_secs(1),
        }
    }
}

/// A publisher's counters. Once the publisher has stopped (or its queue is empty),
/// `published + dropped` is the number of batches the sink closed while it was attached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Batches sent on the PUB socket.
    pub published: u64,
    /// Batches dropped because the queue was full.
    pub dropped: u64,
    /// Batches sent through replay (each time one is).
    pub replayed: u64,
    /// Replay requests answered.
    pub replay_requests: u64,
}

/// A publisher's counters, readable from any thread, before, during and after its
/// [`Publisher::stop`] ([`Publisher::counters`]). Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct PublisherCounters(Arc<Shared>);

impl PublisherCounters {
    /// The counters now (final once the publisher has stopped).
    pub fn get(&self) -> PublisherStats {
        self.0.stats()
    }
}

impl std::fmt::Debug for PublisherCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PublisherCounters").field(&self.get()).finish()
    }
}

/// One closed batch, kept for replay; its payload is encoded once, by whoever needs it
/// first, and the batch itself is dropped then (replay keeps only the payload).
struct Item {
    seq: u64,
    batch: Mutex<Option<EventBatch>>,
    payload: OnceLock<Bytes>,
}

impl Item {
    fn payload(&self, wire: &WireOptions) -> Bytes {
        self.payload
            .get_or_init(|| {
                let b = self.batch.lock().unwrap_or_else(|p| p.into_inner()).take();
                Bytes::from(encode_batch(&b.expect("a batch is encoded once"), wire))
            })
            .clone()
    }
}

struct Shared {
    published: AtomicU64,
    dropped: AtomicU64,
    replayed: AtomicU64,
    replay_requests: AtomicU64,
    /// The last `buffer_steps` batches closed, in sequence order.
    ring: Mutex<VecDeque<Arc<Item>>>,
    buffer_steps: usize,
}

impl Shared {
    fn stats(&self) -> PublisherStats {
        // Relaxed: counters.
        PublisherStats {
            published: self.published.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            replayed: self.replayed.load(Ordering::Relaxed),
            replay_requests: self.replay_requests.load(Ordering::Relaxed),
        }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<Item>>> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The sink's end of a publisher: called under the sink's lock, in sequence order.
pub(crate) struct Feed {
    tx: Sender<Arc<Item>>,
    shared: Arc<Shared>,
}

impl BatchOutlet for Feed {
    /// Keeps the batch for replay and queues it for the thread, or drops it (counted)
    /// when the queue is full. Never blocks.
    fn submit(&mut self, seq: u64, batch: EventBatch) {
        let item = Arc::new(Item { seq, batch: Mutex::new(Some(batch)), payload: OnceLock::new() });
        if self.shared.buffer_steps > 0 {
            let mut r = self.shared.ring();
            if r.len() == self.shared.buffer_steps {
                r.pop_front();
            }
            r.push_back(item.clone());
        }
        match self.tx.try_send(item) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Closed(_)) => {
                // Relaxed: a counter.
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A running publisher (see the module docs). Stopped by [`Publisher::stop`] or drop.
pub struct Publisher {
    sink: Arc<EventSink>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    endpoint: String,
    replay_endpoint: Option<String>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("endpoint", &self.endpoint)
            .field("replay_endpoint", &self.replay_endpoint)
            .field("stats", &self.stats())
            .finish()
    }
}

fn zmq_err(what: &str, endpoint: &str, e: impl std::fmt::Display) -> radixkv::Error {
    invalid(format!("events: cannot {what} {endpoint:?}: {e}"))
}

/// A failed bind: the operating system's refusal (an address in use, no permission) is
/// [`Error::Io`]; an endpoint the transport cannot parse or does not
/// have is [`Error::InvalidArgument`].
fn bind_err(endpoint: &str, e: zeromq::ZmqError) -> radixkv::Error {
    match e {
        zeromq::ZmqError::Network(e) => io(format!("events: cannot bind {endpoint:?}: {e}")),
        e => zmq_err("bind", endpoint, e),
    }
}

/// Whether vLLM's rule binds the PUB socket to `endpoint` (else it connects).
pub fn binds(endpoint: &str) -> bool {
    endpoint.contains('*') || endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://")
}

/// An endpoint in the transport's terms: `tcp://*:p` is every interface, `tcp://h:*` any
/// free port; `inproc://` is refused (the transport has none).
fn transport_endpoint(endpoint: &str) -> Result<String> {
    if endpoint.starts_with("inproc://") {
        return Err(zmq_err(
            "use",
            endpoint,
            "inproc:// is not supported by radixkv's ZMQ transport (use ipc:// or tcp://)",
        ));
    }
    let Some(rest) = endpoint.strip_prefix("tcp://") else {
        return Ok(endpoint.to_owned());
    };
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err(zmq_err("use", endpoint, "a tcp endpoint needs host:port"));
    };
    let host = if host == "*" { "0.0.0.0" } else { host };
    let port = if port == "*" { "0" } else { port };
    Ok(format!("tcp://{host}:{port}"))
}

impl Publisher {
    /// Opens the sockets (errors come back here, before anything runs), attaches to
    /// `sink` (batches already in its drain queue are published first) and starts the
    /// thread. `InvalidArgument` for a bad endpoint, `max_queue` of 0, or a sink that has a
    /// publisher already; `Io` for an address in use (or another refusal by the operating
    /// system, a runtime or a thread that cannot be had).
    pub fn start(sink: &Arc<EventSink>, opts: PublisherOptions) -> Result<Publisher> {
        if opts.max_queue == 0 {
            return Err(invalid("events: max_queue must be at least 1"));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| io(format!("events: cannot start the publisher's runtime: {e}")))?;
        // The sockets start tasks on the runtime they are made in: make them (and bind, and
        // attach) inside it, so whatever fails drops them there too.
        let (shared, worker, rx, endpoint, replay_endpoint) = {
            let _in_runtime = rt.enter();
            let ep = transport_endpoint(&opts.endpoint)?;
            let mut pub_sock = zeromq::PubSocket::new();
            let endpoint = if binds(&opts.endpoint) {
                let bound =
                    rt.block_on(pub_sock.bind(&ep)).map_err(|e| bind_err(&opts.endpoint, e))?;
                bound.to_string()
            } else {
                // Parse now, so a bad endpoint is an error here; connect in the background.
                ep.parse::<zeromq::Endpoint>()
                    .map_err(|e| zmq_err("connect to", &opts.endpoint, e))?;
                opts.endpoint.clone()
            };
            let (replay, replay_endpoint) = match &opts.replay_endpoint {
                None => (None, None),
                Some(ep) => {
                    let mut r = zeromq::RouterSocket::new();
                    let bound = rt
                        .block_on(r.bind(&transport_endpoint(ep)?))
                        .map_err(|e| bind_err(ep, e))?;
                    (Some(r), Some(bound.to_string()))
                }
            };
            let shared = Arc::new(Shared {
                published: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                replayed: AtomicU64::new(0),
                replay_requests: AtomicU64::new(0),
                ring: Mutex::new(VecDeque::new()),
                // Without a replay socket nothing reads the ring: keep nothing (a replay of a
                // long trace would otherwise hold its last 10,000 batches for nobody).
                buffer_steps: if opts.replay_endpoint.is_some() { opts.buffer_steps } else { 0 },
            });
            let (tx, rx) = tokio::sync::mpsc::channel(opts.max_queue);
            sink.attach(Box::new(Feed { tx, shared: shared.clone() }))?;
            let worker = Worker {
                pub_sock,
                connect: (!binds(&opts.endpoint)).then_some(ep),
                replay,
                shared: shared.clone(),
                sink: Arc::downgrade(sink),
                topic: Bytes::from(opts.topic.into_bytes()),
                wire: opts.wire,
                auto_flush: opts.auto_flush,
                linger: opts.linger,
                horizon: 0,
            };
            (shared, worker, rx, endpoint, replay_endpoint)
        };
        let thread = std::thread::Builder::new()
            .name("radixkv-kv-events".into())
            .spawn(move || rt.block_on(worker.run(rx)))
            .map_err(|e| {
                sink.detach();
                io(format!("events: cannot start the publisher thread: {e}"))
            })?;
        Ok(Publisher {
            sink: sink.clone(),
            shared,
            thread: Some(thread),
            endpoint,
            replay_endpoint,
        })
    }

    /// The PUB endpoint, as bound (a wildcard port resolved) or as connected.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The replay endpoint as bound, if any.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// The counters.
    pub fn stats(&self) -> PublisherStats {
        self.shared.stats()
    }

    /// A handle on the counters that stays valid after the publisher stops (and reads them
    /// without it): the C ABI's publisher reads its counters while another thread stops it.
    pub fn counters(&self) -> PublisherCounters {
        PublisherCounters(self.shared.clone())
    }

    /// Flushes the sink, detaches from it (later batches go to its drain queue again),
    /// publishes what is queued and closes the sockets after the linger. Returns the final
    /// counters.
    pub fn stop(mut self) -> PublisherStats {
        self.shutdown();
        self.stats()
    }

    fn shutdown(&mut self) {
        if let Some(t) = self.thread.take() {
            self.sink.flush();
            // Dropping the feed closes the queue: the thread sends what is left, then sees
            // the close, lingers and returns, closing its sockets.
            self.sink.detach();
            let _ = t.join();
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The publisher's thread (a task on its one-thread runtime).
struct Worker {
    pub_sock: zeromq::PubSocket,
    /// The endpoint to connect the PUB socket to, when it does not bind.
    connect: Option<String>,
    replay: Option<zeromq::RouterSocket>,
    shared: Arc<Shared>,
    sink: Weak<EventSink>,
    topic: Bytes,
    wire: WireOptions,
    auto_flush: Option<Duration>,
    linger: Duration,
    /// One past the last sequence number taken from the queue: replay serves below it.
    horizon: u64,
}

/// The next replay request, or never without a replay socket.
async fn next_request(r: &mut Option<zeromq::RouterSocket>) -> Option<ZmqMessage> {
    match r {
        Some(r) => r.recv().await.ok(),
        None => std::future::pending().await,
    }
}

impl Worker {
    async fn run(mut self, mut rx: Receiver<Arc<Item>>) {
        let mut tick = tokio::time::interval(self.auto_flush.unwrap_or(Duration::from_secs(3600)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut replay = self.replay.take();
        let mut open = true;
        if let Some(ep) = self.connect.take() {
            // Connect in the background, retrying until the peer listens (each attempt backs
            // off inside the transport for up to its 30 s connect timeout). Meanwhile batches
            // go nowhere, as from a libzmq PUB socket no subscriber has reached yet, and
            // replay and the auto-flush go on.
            let mut pub_sock = std::mem::replace(&mut self.pub_sock, zeromq::PubSocket::new());
            'connect: while open {
                let attempt = pub_sock.connect(&ep);
                tokio::pin!(attempt);
                loop {
                    tokio::select! {
                        r = &mut attempt => {
                            if r.is_ok() {
                                break 'connect;
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            break;
                        }
                        item = rx.recv() => match item {
                            Some(item) => self.unsent(&item),
                            None => { open = false; break 'connect; }
                        },
                        req = next_request(&mut replay) => {
                            if let (Some(req), Some(r)) = (req, replay.as_mut()) {
                                self.serve(r, req).await;
                            }
                        }
                        _ = tick.tick(), if self.auto_flush.is_some() => {
                            if let Some(s) = self.sink.upgrade() {
                                s.flush();
                            }
                        }
                    }
                }
            }
            self.pub_sock = pub_sock;
        }
        // The queue closed while connecting: straight to the linger.
        while open {
            tokio::select! {
                item = rx.recv() => {
                    let Some(item) = item else {
                        open = false;
                        continue;
                    };
                    self.publish(&item).await;
                    // Send a burst without going back to the select between batches, but
                    // every 64 let the socket's own tasks (on this one-thread runtime)
                    // write the messages out: without the yield they would not run until
                    // the burst ended, and the socket's queue would overflow meanwhile.
                    let mut n = 0u32;
                    while let Ok(item) = rx.try_recv() {
                        n += 1;
                        if n.is_multiple_of(64) {
                            tokio::task::yield_now().await;
                        }
                        self.publish(&item).await;
                    }
                }
                req = next_request(&mut replay) => {
                    if let (Some(req), Some(r)) = (req, replay.as_mut()) {
                        self.serve(r, req).await;
                    }
                }
                _ = tick.tick(), if self.auto_flush.is_some() => {
                    if let Some(s) = self.sink.upgrade() {
                        s.flush();
                    }
                }
            }
        }
        // Give what was queued in the sockets time to leave, still answering replay.
        let linger = tokio::time::sleep(self.linger);
        tokio::pin!(linger);
        loop {
            tokio::select! {
                _ = &mut linger => break,
                req = next_request(&mut replay) => {
                    if let (Some(req), Some(r)) = (req, replay.as_mut()) {
                        self.serve(r, req).await;
                    }
                }
            }
        }
    }

    /// A batch taken while no peer is connected: sent to no one (counted as published, as
    /// a PUB socket without subscribers sends it), kept for replay.
    fn unsent(&mut self, item: &Item) {
        // Relaxed: a counter.
        self.shared.published.fetch_add(1, Ordering::Relaxed);
        self.horizon = item.seq + 1;
    }

    async fn publish(&mut self, item: &Item) {
        let mut m = ZmqMessage::from(self.topic.clone());
        m.push_back(Bytes::copy_from_slice(&item.seq.to_be_bytes()));
        m.push_back(item.payload(&self.wire));
        // A PUB socket does not wait for subscribers (libzmq drops a message for a subscriber
        // past its high-water mark; `zeromq` 0.7 queues it: see the module docs).
        if self.pub_sock.send(m).await.is_ok() {
            // Relaxed: a counter.
            self.shared.published.fetch_add(1, Ordering::Relaxed);
        }
        self.horizon = item.seq + 1;
    }

    /// Answers one replay request: `[identity, b"", start_seq]`.
    async fn serve(&mut self, r: &mut zeromq::RouterSocket, req: ZmqMessage) {
        let frames = req.into_vec();
        if frames.len() != 3 || !frames[1].is_empty() || frames[2].len() != 8 {
            return;
        }
        let id = frames[0].clone();
        let start = u64::from_be_bytes(frames[2][..8].try_into().expect("8 bytes"));
        let kept: Vec<Arc<Item>> = self
            .shared
            .ring()
            .iter()
            .filter(|i| i.seq >= start && i.seq < self.horizon)
            .cloned()
            .collect();
        for item in &kept {
            let mut m = ZmqMessage::from(id.clone());
            m.push_back(Bytes::new());
            m.push_back(Bytes::copy_from_slice(&item.seq.to_be_bytes()));
            m.push_back(item.payload(&self.wire));
            if r.send(m).await.is_ok() {
                // Relaxed: a counter.
                self.shared.replayed.fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut end = ZmqMessage::from(id);
        end.push_back(Bytes::new());
        end.push_back(Bytes::copy_from_slice(&REPLAY_END.to_be_bytes()));
        end.push_back(Bytes::new());
        let _ = r.send(end).await;
        // Relaxed: a counter.
        self.shared.replay_requests.fetch_add(1, Ordering::Relaxed);
    }
}
