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
//! - **High-water mark.** The PUB socket keeps at most [`PublisherOptions::hwm`] messages
//!   (default 100,000, vLLM's `hwm`) for each subscriber that is not reading; past it,
//!   libzmq drops whole messages for that subscriber alone (the others go on getting
//!   them), so a stalled subscriber costs the publisher's process a bounded amount of
//!   memory: about `hwm` x (the payload + 3 x 64 bytes of message headers + the
//!   allocator's overhead), plus at most two replay answers per replay client (below). Those drops
//!   are the subscriber's gaps in `seq`, repaired through replay; the publisher does not
//!   see them (libzmq does not report them), so they are not in [`PublisherStats::dropped`].
//! - **Replay.** With a replay endpoint, a ROUTER socket answers `[b"", start_seq]`
//!   (u64 big-endian) with `[b"", seq, payload]` for each kept batch with
//!   `seq >= start_seq` (the last [`PublisherOptions::buffer_steps`] closed, published or
//!   dropped, up to the last the thread has taken from the queue), then
//!   `[b"", 0xffff_ffff_ffff_ffff, b""]`. The ROUTER socket's high-water mark is two whole
//!   answers (2 x (`buffer_steps` + 1) messages) per client, so an answer always fits
//!   behind one the client has read (libzmq learns what a reader took only every half
//!   high-water mark); a client that asks again and again without reading, once its pipe
//!   is full, gets the rest of an answer (and its end marker) dropped, and asks again
//!   after its own timeout.
//! - **Endpoints.** The PUB socket binds when the endpoint contains `*` or is `ipc://` or
//!   `inproc://`, and connects otherwise; the replay socket always binds. `*` as the host
//!   means every interface and as the port any free port ([`Publisher::endpoint`] says which).
//!   A bad endpoint or `inproc://` (which would reach only the publisher's own private ZMQ
//!   context: use `ipc://`) is an [`Error::InvalidArgument`]
//!   from `start`, and an address in use (or any other refusal by the operating system: a
//!   bind without permission, a context or thread that cannot be had) an
//!   [`Error::Io`], each naming the endpoint and the reason. A connecting
//!   PUB socket connects in the background and keeps trying until its peer listens.
//!
//! The ZMQ implementation is libzmq 4.3 (the `zmq` crate; `zmq-sys` builds it from source),
//! what vLLM (pyzmq) and Dynamo run: one context with one I/O thread per publisher, and the
//! publisher's own thread, which polls its queue (through a wake-up socket pair) and the
//! ROUTER socket with `zmq_poll`. libzmq is C++: a program linking `libradixkv.a` adds
//! `-lstdc++` (the pkg-config file and the CMake package do; `docs/kv-events.md`, "The ZMQ
//! crate", says why libzmq and not the pure-Rust `zeromq`).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use radixkv::Error;
use radixkv::error::Result;
use radixkv::events::wire::WireOptions;
use radixkv::events::{BatchOutlet, ClosedBatch, EventSink};

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
    /// The PUB socket's high-water mark (libzmq's `ZMQ_SNDHWM`, vLLM's `hwm`, default
    /// 100,000): the most messages kept for one subscriber that is not reading; past it
    /// they are dropped for that subscriber. 0 is no limit (unbounded memory for a stalled
    /// subscriber); at most `i32::MAX`.
    pub hwm: usize,
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
            hwm: 100_000,
        }
    }
}

/// A publisher's counters. Once the publisher has stopped (or its queue is empty),
/// `published + dropped` is the number of batches the sink closed while it was attached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Batches sent on the PUB socket (handed to libzmq, which drops them for a subscriber
    /// past its high-water mark without saying so).
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
/// first (the publisher's thread, publishing or replaying it), and the batch itself is
/// dropped then (replay keeps only the payload). Its pages are hashed just before
/// ([`ClosedBatch::into_payload`], in sequence order with the sink's other batches): on the
/// publisher's thread, not the one that pushed or flushed. Without replay nothing keeps
/// it: the thread encodes it and hands the payload to libzmq without a copy
/// ([`Item::take_payload`]).
struct Item {
    seq: u64,
    batch: Mutex<Option<ClosedBatch>>,
    payload: OnceLock<Vec<u8>>,
}

impl Item {
    fn encode(&self, wire: &WireOptions) -> Vec<u8> {
        let b = self.batch.lock().unwrap_or_else(|p| p.into_inner()).take();
        b.expect("a batch is encoded once").into_payload(wire)
    }

    fn payload(&self, wire: &WireOptions) -> &[u8] {
        self.payload.get_or_init(|| self.encode(wire))
    }

    /// The payload, for an item nothing else holds (no replay ring): encoded into a
    /// message that owns its bytes (libzmq frees them once sent), not copied into one.
    fn take_payload(&self, wire: &WireOptions) -> zmq::Message {
        match self.payload.get() {
            Some(p) => zmq::Message::from(&p[..]),
            None => zmq::Message::from(self.encode(wire)),
        }
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
    /// The thread is about to wait (or waiting) in `zmq_poll` and wants a wake-up byte for
    /// the next batch queued (see [`Feed::submit`] and [`Worker::park`]).
    parked: AtomicBool,
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
///
/// Dropping it (the sink's detach) drops `tx` and then `wake`, in declaration order: the
/// thread's queue is disconnected before the wake-up socket's peer sees end-of-file, so
/// the thread, woken by that, finds the queue closed.
pub(crate) struct Feed {
    tx: SyncSender<Arc<Item>>,
    wake: UnixStream,
    /// The wake-up socket's read end, shared with the thread: while the feed lives its
    /// peer is open, so a write never meets a closed socket (`EPIPE`, and a `SIGPIPE` that
    /// would kill a C or Python host that does not ignore it), even if the thread is gone.
    _wake_peer: Arc<UnixStream>,
    shared: Arc<Shared>,
}

impl BatchOutlet for Feed {
    /// Keeps the batch for replay and queues it for the thread, or drops it (counted)
    /// when the queue is full. Never blocks: the wake-up write is non-blocking, and made
    /// only when the thread is parked.
    fn submit(&mut self, seq: u64, batch: ClosedBatch) {
        let item = Arc::new(Item { seq, batch: Mutex::new(Some(batch)), payload: OnceLock::new() });
        if self.shared.buffer_steps > 0 {
            let mut r = self.shared.ring();
            if r.len() == self.shared.buffer_steps {
                r.pop_front();
            }
            r.push_back(item.clone());
        }
        match self.tx.try_send(item) {
            Ok(()) => {
                // SeqCst fence, paired with the one in `Worker::park`: either the thread's
                // last look at the queue (after it raised `parked`) sees this batch, or
                // this load sees `parked` raised and wakes it. Never neither.
                std::sync::atomic::fence(Ordering::SeqCst);
                if self.shared.parked.load(Ordering::Relaxed)
                    && self.shared.parked.swap(false, Ordering::Relaxed)
                {
                    // Non-blocking: a full socket buffer already holds a wake-up.
                    let _ = (&self.wake).write(&[1]);
                }
            }
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

/// A libzmq refusal: an endpoint it cannot parse or a transport it does not have is
/// [`Error::InvalidArgument`]; the operating system's
/// refusal (an address in use, no permission, no such interface, no file descriptors) is
/// [`Error::Io`].
fn zmq_error(what: &str, endpoint: &str, e: zmq::Error) -> Error {
    let msg = format!("events: cannot {what} {endpoint:?}: {e}");
    match e {
        zmq::Error::EINVAL | zmq::Error::EPROTONOSUPPORT | zmq::Error::ENOCOMPATPROTO => {
            invalid(msg)
        }
        _ => io(msg),
    }
}

/// A socket option libzmq refused (none should be).
fn option_err(what: &str, e: zmq::Error) -> Error {
    io(format!("events: cannot set the {what}: {e}"))
}

/// Whether vLLM's rule binds the PUB socket to `endpoint` (else it connects).
pub fn binds(endpoint: &str) -> bool {
    endpoint.contains('*') || endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://")
}

/// Refuses `inproc://`: the publisher's ZMQ context is its own, so no other socket could
/// reach it.
fn check_endpoint(endpoint: &str) -> Result<()> {
    if endpoint.starts_with("inproc://") {
        return Err(invalid(format!(
            "events: cannot use {endpoint:?}: inproc:// is not supported by radixkv's publisher \
             (its ZMQ context is private: use ipc:// or tcp://)"
        )));
    }
    Ok(())
}

/// The address a socket bound, wildcards resolved.
fn last_endpoint(s: &zmq::Socket, asked: &str) -> String {
    match s.get_last_endpoint() {
        Ok(Ok(e)) if !e.is_empty() => e,
        _ => asked.to_owned(),
    }
}

fn hwm_option(n: usize, what: &str) -> Result<i32> {
    i32::try_from(n).map_err(|_| invalid(format!("events: {what} must be at most {}", i32::MAX)))
}

impl Publisher {
    /// Opens the sockets (errors come back here, before anything runs), attaches to
    /// `sink` (batches already in its drain queue are published first) and starts the
    /// thread. `InvalidArgument` for a bad endpoint, `max_queue` of 0, an `hwm` past
    /// `i32::MAX`, or a sink that has a publisher already; `Io` for an address in use (or
    /// another refusal by the operating system, a context or a thread that cannot be had).
    pub fn start(sink: &Arc<EventSink>, opts: PublisherOptions) -> Result<Publisher> {
        if opts.max_queue == 0 {
            return Err(invalid("events: max_queue must be at least 1"));
        }
        let hwm = hwm_option(opts.hwm, "hwm")?;
        check_endpoint(&opts.endpoint)?;
        if let Some(ep) = &opts.replay_endpoint {
            check_endpoint(ep)?;
        }
        // One context per publisher, its one I/O thread, and sockets that close at once
        // (the publisher's own linger comes first: see `Worker::run`).
        let ctx = zmq::Context::new();
        let pub_sock = ctx
            .socket(zmq::PUB)
            .map_err(|e| io(format!("events: cannot open a ZMQ PUB socket: {e}")))?;
        pub_sock.set_linger(0).map_err(|e| option_err("PUB socket's linger", e))?;
        pub_sock.set_sndhwm(hwm).map_err(|e| option_err("PUB socket's high-water mark", e))?;
        let endpoint = if binds(&opts.endpoint) {
            pub_sock.bind(&opts.endpoint).map_err(|e| zmq_error("bind", &opts.endpoint, e))?;
            last_endpoint(&pub_sock, &opts.endpoint)
        } else {
            // libzmq checks the endpoint now and connects in the background, retrying
            // (every 100 ms) until the peer listens.
            pub_sock
                .connect(&opts.endpoint)
                .map_err(|e| zmq_error("connect to", &opts.endpoint, e))?;
            opts.endpoint.clone()
        };
        let (replay, replay_endpoint) = match &opts.replay_endpoint {
            None => (None, None),
            Some(ep) => {
                let r = ctx
                    .socket(zmq::ROUTER)
                    .map_err(|e| io(format!("events: cannot open a ZMQ ROUTER socket: {e}")))?;
                r.set_linger(0).map_err(|e| option_err("ROUTER socket's linger", e))?;
                // A whole answer (the ring and the end marker) fits a client's pipe even
                // when the client has read the previous one: libzmq's writer learns of
                // what its reader took only every half high-water mark, hence twice the
                // answer. A send past it fails (`EAGAIN`) instead of vanishing.
                // (Capped at libzmq's `int`: past it, a practically unlimited pipe.)
                let answer = opts.buffer_steps.saturating_add(1).saturating_mul(2);
                let answer = i32::try_from(answer).unwrap_or(i32::MAX);
                r.set_sndhwm(answer)
                    .map_err(|e| option_err("ROUTER socket's high-water mark", e))?;
                r.set_router_mandatory(true)
                    .map_err(|e| option_err("ROUTER socket's mandatory routing", e))?;
                r.bind(ep).map_err(|e| zmq_error("bind", ep, e))?;
                let bound = last_endpoint(&r, ep);
                (Some(r), Some(bound))
            }
        };
        let (wake_rx, wake_tx) = UnixStream::pair()
            .map_err(|e| io(format!("events: cannot open the publisher's wake-up socket: {e}")))?;
        for s in [&wake_rx, &wake_tx] {
            s.set_nonblocking(true)
                .map_err(|e| io(format!("events: cannot set up the wake-up socket: {e}")))?;
        }
        let shared = Arc::new(Shared {
            published: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            replay_requests: AtomicU64::new(0),
            ring: Mutex::new(VecDeque::new()),
            // Without a replay socket nothing reads the ring: keep nothing (a replay of a
            // long trace would otherwise hold its last 10,000 batches for nobody).
            buffer_steps: if opts.replay_endpoint.is_some() { opts.buffer_steps } else { 0 },
            parked: AtomicBool::new(false),
        });
        let (tx, rx) = std::sync::mpsc::sync_channel(opts.max_queue);
        let wake_rx = Arc::new(wake_rx);
        sink.attach(Box::new(Feed {
            tx,
            wake: wake_tx,
            _wake_peer: wake_rx.clone(),
            shared: shared.clone(),
        }))?;
        let worker = Worker {
            pub_sock,
            replay,
            wake: wake_rx,
            shared: shared.clone(),
            sink: Arc::downgrade(sink),
            topic: opts.topic.into_bytes(),
            wire: opts.wire,
            // `zmq_poll` counts milliseconds: a zero period would spin.
            auto_flush: opts.auto_flush.map(|d| d.max(Duration::from_millis(1))),
            linger: opts.linger,
            horizon: 0,
        };
        let thread = std::thread::Builder::new()
            .name("radixkv-kv-events".into())
            .spawn(move || {
                worker.run(rx);
                // The sockets are closed (dropped with the worker); the context's
                // termination, which waits for them, follows here, off the caller.
                drop(ctx);
            })
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
            // Dropping the feed closes the queue and wakes the thread: it sends what is
            // left, then sees the close, lingers and returns, closing its sockets.
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
    /// The read end of the wake-up socket pair (the feed writes a byte when it queues a
    /// batch for a parked thread; end-of-file when the feed is dropped).
    wake: Arc<UnixStream>,
    shared: Arc<Shared>,
    sink: Weak<EventSink>,
    topic: Vec<u8>,
    wire: WireOptions,
    auto_flush: Option<Duration>,
    linger: Duration,
    /// One past the last sequence number taken from the queue: replay serves below it.
    horizon: u64,
}

/// How many batches the thread sends in a burst before it looks at the replay socket.
const BURST: u32 = 256;

/// Milliseconds until `at` for `zmq_poll`, rounded up (a 0 ms poll would spin until then).
fn millis_until(at: Instant) -> i64 {
    let left = at.saturating_duration_since(Instant::now());
    left.as_micros().div_ceil(1000).min(i64::MAX as u128) as i64
}

impl Worker {
    fn run(mut self, rx: Receiver<Arc<Item>>) {
        let mut next_flush = self.auto_flush.map(|d| Instant::now() + d);
        'live: loop {
            // Send what is queued, looking at the replay socket every BURST batches.
            let mut n = 0u32;
            loop {
                match rx.try_recv() {
                    Ok(item) => {
                        self.publish(&item);
                        n += 1;
                        if n.is_multiple_of(BURST) {
                            self.serve_requests();
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => break 'live,
                }
            }
            // And after every burst, so a steady trickle of batches (each found just as
            // the thread parks) cannot keep a replay request waiting.
            if n > 0 {
                self.serve_requests();
            }
            if let (Some(d), Some(at)) = (self.auto_flush, next_flush)
                && Instant::now() >= at
            {
                // Missed ticks are skipped, not caught up.
                next_flush = Some(Instant::now() + d);
                if let Some(s) = self.sink.upgrade() {
                    s.flush();
                }
                continue;
            }
            match self.park(&rx) {
                Ok(Some(item)) => {
                    self.publish(&item);
                    self.serve_requests();
                }
                Ok(None) => {
                    self.wait(true, next_flush.map_or(-1, millis_until));
                    self.shared.parked.store(false, Ordering::Relaxed);
                    self.drain_wake();
                    self.serve_requests();
                }
                Err(()) => break 'live,
            }
        }
        self.shared.parked.store(false, Ordering::Relaxed);
        // Give what was queued in the sockets time to leave, still answering replay.
        let end = Instant::now() + self.linger;
        while Instant::now() < end {
            // The wake-up socket is at end-of-file now (always readable): left out.
            self.wait(false, millis_until(end));
            self.serve_requests();
        }
    }

    /// Raises `parked` and looks at the queue once more: a batch queued meanwhile comes
    /// back (and `parked` is lowered); `Ok(None)` means any later one writes a wake-up
    /// byte; `Err` that the queue is closed.
    fn park(&self, rx: &Receiver<Arc<Item>>) -> std::result::Result<Option<Arc<Item>>, ()> {
        self.shared.parked.store(true, Ordering::Relaxed);
        // SeqCst fence, paired with the one in `Feed::submit` (a store-buffer pattern: the
        // flag's store here and the queue's store there, each followed by a fence and a
        // load of the other).
        std::sync::atomic::fence(Ordering::SeqCst);
        match rx.try_recv() {
            Ok(item) => {
                self.shared.parked.store(false, Ordering::Relaxed);
                Ok(Some(item))
            }
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(()),
        }
    }

    /// Waits in `zmq_poll` for a replay request or (with `woken`) a wake-up byte or the
    /// feed's end-of-file, at most `timeout_ms` (-1: no limit).
    fn wait(&self, woken: bool, timeout_ms: i64) {
        let mut items = Vec::with_capacity(2);
        if woken {
            items.push(zmq::PollItem::from_fd(self.wake.as_raw_fd(), zmq::POLLIN));
        }
        if let Some(r) = &self.replay {
            items.push(r.as_poll_item(zmq::POLLIN));
        }
        // An interrupted poll (EINTR) just goes round again.
        let _ = zmq::poll(&mut items, timeout_ms);
    }

    /// Reads the wake-up bytes that have come. Once the feed is dropped the socket reads
    /// end-of-file for ever; the caller then finds the queue closed.
    fn drain_wake(&self) {
        let mut buf = [0u8; 64];
        while matches!((&*self.wake).read(&mut buf), Ok(1..)) {}
    }

    fn publish(&mut self, item: &Item) {
        // Without replay the ring keeps nothing, so nobody reads the payload again.
        let payload = if self.replay.is_none() {
            item.take_payload(&self.wire)
        } else {
            zmq::Message::from(item.payload(&self.wire))
        };
        // A PUB socket never blocks: past a subscriber's high-water mark libzmq drops the
        // whole message for that subscriber (a multi-part message is all or nothing).
        let sent = self
            .pub_sock
            .send(&self.topic[..], zmq::SNDMORE | zmq::DONTWAIT)
            .and_then(|()| {
                self.pub_sock.send(&item.seq.to_be_bytes()[..], zmq::SNDMORE | zmq::DONTWAIT)
            })
            .and_then(|()| self.pub_sock.send(payload, zmq::DONTWAIT));
        if sent.is_ok() {
            // Relaxed: a counter.
            self.shared.published.fetch_add(1, Ordering::Relaxed);
        }
        self.horizon = item.seq + 1;
    }

    /// Answers the replay requests that have come, without waiting.
    fn serve_requests(&self) {
        let Some(r) = &self.replay else { return };
        while let Ok(req) = r.recv_multipart(zmq::DONTWAIT) {
            self.serve(r, req);
        }
    }

    /// Answers one replay request: `[identity, b"", start_seq]`.
    fn serve(&self, r: &zmq::Socket, frames: Vec<Vec<u8>>) {
        if frames.len() != 3 || !frames[1].is_empty() || frames[2].len() != 8 {
            return;
        }
        let id = &frames[0][..];
        let start = u64::from_be_bytes(frames[2][..8].try_into().expect("8 bytes"));
        let kept: Vec<Arc<Item>> = self
            .shared
            .ring()
            .iter()
            .filter(|i| i.seq >= start && i.seq < self.horizon)
            .cloned()
            .collect();
        // With mandatory routing, a client whose pipe is full (`EAGAIN`) or that has gone
        // (`EHOSTUNREACH`) fails the first frame and nothing of that message is queued: the
        // answer stops there, without its end marker.
        let send = |seq: u64, payload: &[u8]| {
            r.send(id, zmq::SNDMORE | zmq::DONTWAIT)
                .and_then(|()| r.send(&b""[..], zmq::SNDMORE | zmq::DONTWAIT))
                .and_then(|()| r.send(&seq.to_be_bytes()[..], zmq::SNDMORE | zmq::DONTWAIT))
                .and_then(|()| r.send(payload, zmq::DONTWAIT))
        };
        for item in &kept {
            if send(item.seq, item.payload(&self.wire)).is_err() {
                return;
            }
            // Relaxed: a counter.
            self.shared.replayed.fetch_add(1, Ordering::Relaxed);
        }
        if send(REPLAY_END, &[]).is_ok() {
            // Relaxed: a counter.
            self.shared.replay_requests.fetch_add(1, Ordering::Relaxed);
        }
    }
}
