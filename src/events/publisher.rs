//! The ZMQ publisher: vLLM's PUB stream and ROUTER replay, off the calling thread.
//!
//! [`Publisher::start`] attaches to an [`EventSink`]: from then on every batch the sink
//! closes ([`EventSink::flush`], or the publisher's own flush every
//! [`PublisherOptions::auto_flush`]) is handed, without blocking, to a bounded queue that
//! the publisher's thread empties. The thread encodes each batch ([`super::wire`]) and
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
//!   `inproc://`, and connects otherwise; the replay socket always binds. A bad endpoint or
//!   an address in use is an [`Error::InvalidArgument`](crate::Error::InvalidArgument)
//!   from `start`, naming the endpoint and libzmq's reason.
//! - **High-water mark.** libzmq's PUB socket drops messages for a subscriber whose queue
//!   holds [`PublisherOptions::hwm`] of them (100,000 by default, as vLLM); such drops are
//!   invisible to the publisher and show up as gaps the subscriber repairs by replay.
//!
//! The ZMQ binding is the `zmq` crate over libzmq (built from source by `zmq-sys`): the
//! same library vLLM's pyzmq and Dynamo's own listener use (`docs/kv-events.md` says why).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::wire::{WireOptions, encode_batch};
use super::{EventBatch, EventSink};
use crate::error::{Result, invalid};

/// The sequence number of the replay's end marker.
pub const REPLAY_END: u64 = u64::MAX;

/// A publisher's settings. `Default` gives vLLM's defaults on `tcp://*:5557`.
#[derive(Debug, Clone)]
pub struct PublisherOptions {
    /// The PUB endpoint (`tcp://*:5557` binds; `tcp://host:port` connects).
    pub endpoint: String,
    /// The ROUTER replay endpoint, if any (always bound).
    pub replay_endpoint: Option<String>,
    /// How many of the last batches replay keeps (vLLM's `buffer_steps`).
    pub buffer_steps: usize,
    /// The PUB socket's send high-water mark, in messages.
    pub hwm: i32,
    /// The most batches waiting for the publisher's thread; past it, batches are dropped.
    pub max_queue: usize,
    /// The topic frame (UTF-8; llm-d expects `kv@<pod-ip>:<port>@<model>`).
    pub topic: String,
    /// How payloads are encoded.
    pub wire: WireOptions,
    /// Flush the sink this often from the publisher's thread (`None`: only the caller's
    /// [`EventSink::flush`] closes batches).
    pub auto_flush: Option<Duration>,
    /// How long closing the publisher waits for unsent messages to leave (ZMQ linger).
    pub linger: Duration,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        PublisherOptions {
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
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

/// One closed batch, kept for replay; its payload is encoded once, by whoever needs it
/// first.
struct Item {
    seq: u64,
    batch: EventBatch,
    payload: OnceLock<Vec<u8>>,
}

impl Item {
    fn payload(&self, wire: &WireOptions) -> &[u8] {
        self.payload.get_or_init(|| encode_batch(&self.batch, wire))
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
    fn ring(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<Item>>> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The sink's end of a publisher: called under the sink's lock, in sequence order.
pub(crate) struct Feed {
    tx: SyncSender<Arc<Item>>,
    shared: Arc<Shared>,
}

impl Feed {
    /// Keeps the batch for replay and queues it for the thread, or drops it (counted)
    /// when the queue is full. Never blocks.
    pub(crate) fn submit(&mut self, seq: u64, batch: EventBatch) {
        let item = Arc::new(Item { seq, batch, payload: OnceLock::new() });
        if self.shared.buffer_steps > 0 {
            let mut r = self.shared.ring();
            if r.len() == self.shared.buffer_steps {
                r.pop_front();
            }
            r.push_back(item.clone());
        }
        match self.tx.try_send(item) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
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
    ctx: zmq::Context,
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

fn zmq_err(what: &str, endpoint: &str, e: zmq::Error) -> crate::Error {
    invalid(format!("events: cannot {what} {endpoint:?}: {e}"))
}

/// Whether vLLM's rule binds the PUB socket to `endpoint` (else it connects).
pub fn binds(endpoint: &str) -> bool {
    endpoint.contains('*') || endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://")
}

impl Publisher {
    /// Opens the sockets (errors come back here, before anything runs), attaches to
    /// `sink` (batches already in its drain queue are published first) and starts the
    /// thread. `InvalidArgument` for a bad endpoint, an address in use, `buffer_steps`
    /// or `max_queue` of 0 where they must not be, or a sink that has a publisher already.
    pub fn start(sink: &Arc<EventSink>, opts: PublisherOptions) -> Result<Publisher> {
        Self::start_in(zmq::Context::new(), sink, opts)
    }

    /// [`Publisher::start`] in a given ZMQ context (for `inproc://` endpoints shared with
    /// subscribers in the same process).
    pub fn start_in(
        ctx: zmq::Context,
        sink: &Arc<EventSink>,
        opts: PublisherOptions,
    ) -> Result<Publisher> {
        if opts.max_queue == 0 {
            return Err(invalid("events: max_queue must be at least 1"));
        }
        let linger = i32::try_from(opts.linger.as_millis()).unwrap_or(i32::MAX);
        let pub_sock = ctx
            .socket(zmq::PUB)
            .map_err(|e| zmq_err("open a PUB socket for", &opts.endpoint, e))?;
        pub_sock
            .set_sndhwm(opts.hwm)
            .map_err(|e| zmq_err("set the high-water mark of", &opts.endpoint, e))?;
        pub_sock.set_linger(linger).map_err(|e| zmq_err("set linger on", &opts.endpoint, e))?;
        let endpoint = if binds(&opts.endpoint) {
            pub_sock.bind(&opts.endpoint).map_err(|e| zmq_err("bind", &opts.endpoint, e))?;
            match pub_sock.get_last_endpoint() {
                Ok(Ok(s)) => s,
                _ => opts.endpoint.clone(),
            }
        } else {
            pub_sock
                .connect(&opts.endpoint)
                .map_err(|e| zmq_err("connect to", &opts.endpoint, e))?;
            opts.endpoint.clone()
        };
        let (replay, replay_endpoint) = match &opts.replay_endpoint {
            None => (None, None),
            Some(ep) => {
                let r = ctx
                    .socket(zmq::ROUTER)
                    .map_err(|e| zmq_err("open a ROUTER socket for", ep, e))?;
                // Unlimited: one answer is at most `buffer_steps` messages.
                r.set_sndhwm(0).map_err(|e| zmq_err("set the high-water mark of", ep, e))?;
                r.set_linger(linger).map_err(|e| zmq_err("set linger on", ep, e))?;
                r.bind(ep).map_err(|e| zmq_err("bind", ep, e))?;
                let bound = match r.get_last_endpoint() {
                    Ok(Ok(s)) => s,
                    _ => ep.clone(),
                };
                (Some(r), Some(bound))
            }
        };
        let shared = Arc::new(Shared {
            published: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            replay_requests: AtomicU64::new(0),
            ring: Mutex::new(VecDeque::new()),
            buffer_steps: opts.buffer_steps,
        });
        let (tx, rx) = sync_channel(opts.max_queue);
        sink.attach(Feed { tx, shared: shared.clone() })?;
        let worker = Worker {
            pub_sock,
            replay,
            rx,
            shared: shared.clone(),
            sink: Arc::downgrade(sink),
            topic: opts.topic.into_bytes(),
            wire: opts.wire,
            auto_flush: opts.auto_flush,
            horizon: 0,
        };
        let thread = std::thread::Builder::new()
            .name("radixkv-kv-events".into())
            .spawn(move || worker.run())
            .map_err(|e| {
                sink.detach();
                invalid(format!("events: cannot start the publisher thread: {e}"))
            })?;
        Ok(Publisher {
            sink: sink.clone(),
            shared,
            thread: Some(thread),
            ctx,
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

    /// The ZMQ context the sockets live in (for `inproc://` subscribers).
    pub fn context(&self) -> &zmq::Context {
        &self.ctx
    }

    /// The counters.
    pub fn stats(&self) -> PublisherStats {
        // Relaxed: counters.
        PublisherStats {
            published: self.shared.published.load(Ordering::Relaxed),
            dropped: self.shared.dropped.load(Ordering::Relaxed),
            replayed: self.shared.replayed.load(Ordering::Relaxed),
            replay_requests: self.shared.replay_requests.load(Ordering::Relaxed),
        }
    }

    /// Flushes the sink, detaches from it (later batches go to its drain queue again),
    /// publishes what is queued and closes the sockets (waiting up to the linger for
    /// unsent messages). Returns the final counters.
    pub fn stop(mut self) -> PublisherStats {
        self.shutdown();
        self.stats()
    }

    fn shutdown(&mut self) {
        if let Some(t) = self.thread.take() {
            self.sink.flush();
            // Dropping the feed disconnects the queue: the thread sends what is left, then
            // sees the disconnect and returns, closing its sockets.
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

/// The publisher's thread.
struct Worker {
    pub_sock: zmq::Socket,
    replay: Option<zmq::Socket>,
    rx: Receiver<Arc<Item>>,
    shared: Arc<Shared>,
    sink: Weak<EventSink>,
    topic: Vec<u8>,
    wire: WireOptions,
    auto_flush: Option<Duration>,
    /// One past the last sequence number taken from the queue: replay serves below it.
    horizon: u64,
}

impl Worker {
    fn run(mut self) {
        let mut tick = Duration::from_millis(100);
        if let Some(a) = self.auto_flush {
            tick = tick.min(a);
        }
        if self.replay.is_some() {
            tick = tick.min(Duration::from_millis(5));
        }
        let mut last_flush = Instant::now();
        loop {
            self.serve_replay();
            if self.auto_flush.is_some_and(|a| last_flush.elapsed() >= a) {
                last_flush = Instant::now();
                if let Some(s) = self.sink.upgrade() {
                    s.flush();
                }
            }
            match self.rx.recv_timeout(tick) {
                Ok(item) => {
                    self.publish(&item);
                    // Send a burst without waking for replay or flushes between batches.
                    while let Ok(item) = self.rx.try_recv() {
                        self.publish(&item);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        self.serve_replay();
    }

    fn publish(&mut self, item: &Item) {
        let payload = item.payload(&self.wire);
        let frames: [&[u8]; 3] = [&self.topic, &item.seq.to_be_bytes(), payload];
        // A PUB socket does not block: past the high-water mark libzmq drops the message
        // for that subscriber. An error (the context closing) leaves it unsent.
        if self.pub_sock.send_multipart(frames, 0).is_ok() {
            // Relaxed: a counter.
            self.shared.published.fetch_add(1, Ordering::Relaxed);
        }
        self.horizon = item.seq + 1;
    }

    /// Answers every replay request waiting.
    fn serve_replay(&mut self) {
        let Some(r) = &self.replay else {
            return;
        };
        while let Ok(frames) = r.recv_multipart(zmq::DONTWAIT) {
            // [identity, b"", start_seq]
            if frames.len() != 3 || !frames[1].is_empty() || frames[2].len() != 8 {
                continue;
            }
            let id = &frames[0];
            let start = u64::from_be_bytes(frames[2][..8].try_into().expect("8 bytes"));
            let kept: Vec<Arc<Item>> = self
                .shared
                .ring()
                .iter()
                .filter(|i| i.seq >= start && i.seq < self.horizon)
                .cloned()
                .collect();
            for item in &kept {
                let frames: [&[u8]; 4] =
                    [id, b"", &item.seq.to_be_bytes(), item.payload(&self.wire)];
                if r.send_multipart(frames, 0).is_ok() {
                    // Relaxed: a counter.
                    self.shared.replayed.fetch_add(1, Ordering::Relaxed);
                }
            }
            let end: [&[u8]; 4] = [id, b"", &REPLAY_END.to_be_bytes(), b""];
            let _ = r.send_multipart(end, 0);
            // Relaxed: a counter.
            self.shared.replay_requests.fetch_add(1, Ordering::Relaxed);
        }
    }
}
