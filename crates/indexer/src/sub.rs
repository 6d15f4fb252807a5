//! A stream's thread: the SUB socket, sequence tracking, replay (see the crate docs,
//! "Streams").

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use radixkv::events::EventBatch;
use radixkv::events::wire::{WireOptions, encode_batch};
use radixkv_router::{RouterError, Worker};
use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};

use crate::{State, Stream, StreamState, log};

/// How often a thread with nothing to read looks at its stop flag.
const WAKE_MS: i64 = 200;

/// How long a stream is silent before it replays from its cursor once.
const IDLE_REPLAY: Duration = Duration::from_secs(1);

/// The longest wait between replay attempts while they fail.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The most messages read in one burst before the stop flag is looked at again.
const BURST: usize = 1024;

/// The replay end marker's seq (`radixkv_publisher::REPLAY_END`, vLLM's).
const REPLAY_END: u64 = u64::MAX;

/// Replayed batches remembered (seq → payload hash) to recognize their live copies.
const MAX_DUPS: usize = 200_000;

pub(crate) fn spawn(state: Arc<State>, stream: Arc<Stream>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("radixkv-sub-{}", stream.reg.instance_id))
        .stack_size(256 << 10)
        .spawn(move || {
            let replay = stream.reg.replay_endpoint.clone().map(|endpoint| Replayer {
                endpoint,
                sock: None,
                timeout: state.cfg.replay_timeout,
            });
            Sub {
                state,
                stream,
                replay,
                dups: HashMap::new(),
                warned: 0,
                replay_at: None,
                backoff: IDLE_REPLAY,
            }
            .run()
        })
}

/// A payload's hash (stable across builds: snapshots keep it).
pub(crate) fn hash(payload: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(payload)
}

/// The payload's `data_parallel_rank` (`[ts, events, data_parallel_rank]`), skipping the
/// rest without building it.
fn payload_rank(payload: &[u8]) -> Option<u32> {
    struct Rank(Option<i64>);
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Rank;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a KV-event batch array")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Rank, A::Error> {
            let _: Option<IgnoredAny> = a.next_element()?;
            let _: Option<IgnoredAny> = a.next_element()?;
            let r: Option<Option<i64>> = a.next_element()?;
            while a.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Rank(r.flatten()))
        }
    }
    impl<'de> serde::Deserialize<'de> for Rank {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Rank, D::Error> {
            d.deserialize_seq(V)
        }
    }
    let r: Rank = rmp_serde::from_slice(payload).ok()?;
    u32::try_from(r.0.unwrap_or(0)).ok()
}

struct Replayer {
    endpoint: String,
    sock: Option<zmq::Socket>,
    timeout: Duration,
}

impl Replayer {
    /// Asks for every kept batch from `from` and hands each to `f` in order; `Ok` once the
    /// end marker came.
    fn fetch(
        &mut self,
        ctx: &zmq::Context,
        from: u64,
        stop: &AtomicBool,
        mut f: impl FnMut(u64, &[u8]),
    ) -> Result<usize, String> {
        if self.sock.is_none() {
            let s = ctx.socket(zmq::DEALER).map_err(|e| format!("DEALER socket: {e}"))?;
            s.set_linger(0).map_err(|e| e.to_string())?;
            s.set_rcvhwm(0).map_err(|e| e.to_string())?;
            s.connect(&self.endpoint).map_err(|e| format!("connect {}: {e}", self.endpoint))?;
            self.sock = Some(s);
        }
        let r = self.ask(from, stop, &mut f);
        if r.is_err() {
            // An answer may still come: a fresh socket never reads it.
            self.sock = None;
        }
        r
    }

    fn ask(
        &self,
        from: u64,
        stop: &AtomicBool,
        f: &mut impl FnMut(u64, &[u8]),
    ) -> Result<usize, String> {
        let s = self.sock.as_ref().expect("opened");
        let timeout_ms = self.timeout.as_millis().max(1) as i64;
        if s.poll(zmq::POLLOUT, timeout_ms).map_err(|e| e.to_string())? == 0 {
            return Err("the replay socket cannot send".into());
        }
        s.send_multipart([&b""[..], &from.to_be_bytes()[..]], zmq::DONTWAIT)
            .map_err(|e| format!("send: {e}"))?;
        let mut n = 0;
        let mut silent_since = Instant::now();
        loop {
            if stop.load(Ordering::Relaxed) {
                return Err("stopped".into());
            }
            if s.poll(zmq::POLLIN, WAKE_MS).map_err(|e| e.to_string())? == 0 {
                if silent_since.elapsed() >= self.timeout {
                    return Err(format!("no answer for {:?} ({n} batches came)", self.timeout));
                }
                continue;
            }
            let mut m = s.recv_multipart(zmq::DONTWAIT).map_err(|e| e.to_string())?;
            silent_since = Instant::now();
            if m.len() == 3 && m[0].is_empty() {
                m.remove(0);
            }
            if m.len() != 2 || m[0].len() != 8 {
                return Err(format!("a replay message of {} frames", m.len()));
            }
            let seq = u64::from_be_bytes(m[0][..].try_into().expect("8 bytes"));
            if seq == REPLAY_END {
                return Ok(n);
            }
            f(seq, &m[1]);
            n += 1;
        }
    }
}

struct Sub {
    state: Arc<State>,
    stream: Arc<Stream>,
    replay: Option<Replayer>,
    /// seq → payload hash of the batches applied from replay answers since the last live
    /// batch applied in order.
    dups: HashMap<u64, u64>,
    /// Warnings logged about bad messages (the first few only).
    warned: u32,
    /// When to replay from the cursor if the stream is silent then: a second after messages
    /// came or a replay found new batches, then backing off (to [`MAX_BACKOFF`]) while
    /// replays find nothing or fail. So batches lost just before a pause, or before the SUB
    /// socket joined (nothing after them shows the gap), are not lost for good.
    replay_at: Option<Instant>,
    backoff: Duration,
}

/// Applies one batch under the stream's lock (`st`), moving the cursor past it.
fn apply(state: &State, stream: &Stream, st: &mut StreamState, seq: u64, payload: &[u8]) {
    let m = &state.metrics;
    let id = stream.reg.instance_id;
    let index = &stream.index.index;
    st.last = Some((seq, hash(payload)));
    match index.apply_batch(id, seq, payload) {
        Ok(r) => {
            m.batches.fetch_add(1, Ordering::Relaxed);
            m.events.fetch_add(r.events as u64, Ordering::Relaxed);
            if r.cleared_first {
                m.gap_clears.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(rank) = payload_rank(payload)
                && !st.ranks.contains(&rank)
            {
                st.ranks.push(rank);
            }
        }
        Err(RouterError::Malformed { .. }) => {
            m.malformed.fetch_add(1, Ordering::Relaxed);
            // Move the index's cursors past it with an empty batch of the same seq, so the
            // next batch is not a gap.
            let ranks =
                if st.ranks.is_empty() { vec![stream.reg.dp_rank] } else { st.ranks.clone() };
            for r in ranks {
                if index.next_seq(Worker::new(id, r)) == Some(seq) {
                    let empty = EventBatch { ts: 0.0, events: Vec::new() };
                    let p = encode_batch(
                        &empty,
                        &WireOptions { data_parallel_rank: i64::from(r), ..Default::default() },
                    );
                    let _ = index.apply_batch(id, seq, &p);
                }
            }
        }
        // Counted by the index (refused_by): too many workers.
        Err(_) => {}
    }
    st.next = Some(seq.wrapping_add(1));
}

impl Sub {
    fn warn(&mut self, msg: std::fmt::Arguments<'_>) {
        if self.warned < 20 {
            self.warned += 1;
            log(
                &self.state,
                "warn",
                format_args!("instance_id={} {msg}", self.stream.reg.instance_id),
            );
        }
    }

    fn run(mut self) {
        let ctx = self.stream.ctx.ctx.clone();
        let sock = match self.open(&ctx) {
            Ok(s) => s,
            Err(e) => {
                log(
                    &self.state,
                    "error",
                    format_args!(
                        "msg=\"cannot subscribe\" instance_id={} endpoint={:?} error={e:?}",
                        self.stream.reg.instance_id, self.stream.reg.endpoint
                    ),
                );
                return;
            }
        };
        // What the worker published before the subscription (or since the snapshot) is
        // learned through replay: from the first live batch (replayed up to it, the rest
        // comes live, in order), or after a second of silence (an idle publisher).
        if self.replay.is_some() {
            self.replay_at = Some(Instant::now() + IDLE_REPLAY);
        }
        while !self.stream.stop.load(Ordering::Relaxed) {
            match sock.poll(zmq::POLLIN, WAKE_MS) {
                Ok(n) if n > 0 => {}
                _ => {
                    // Silent: the replay due (see `replay_at`).
                    if self.replay_at.is_some_and(|t| Instant::now() >= t) {
                        let from = self.stream.lock().next.unwrap_or(0);
                        self.catch_up(&ctx, from, None);
                    }
                    continue;
                }
            }
            if self.replay.is_some() {
                self.backoff = IDLE_REPLAY;
                let soon = Instant::now() + IDLE_REPLAY;
                if self.replay_at.is_none_or(|t| t > soon) {
                    self.replay_at = Some(soon);
                }
            }
            for _ in 0..BURST {
                match sock.recv_multipart(zmq::DONTWAIT) {
                    Ok(m) => self.message(&ctx, m),
                    Err(zmq::Error::EAGAIN) => break,
                    Err(e) => {
                        self.warn(format_args!("msg=\"recv failed\" error={e:?}"));
                        break;
                    }
                }
                if self.stream.stop.load(Ordering::Relaxed) {
                    break;
                }
            }
        }
        if self.state.stopping.load(Ordering::Relaxed) {
            // Shutting down: apply what the socket holds already (the drain).
            let mut left = self.state.cfg.queue_limit.max(1);
            while left > 0 {
                match sock.recv_multipart(zmq::DONTWAIT) {
                    Ok(m) => self.message(&ctx, m),
                    Err(_) => break,
                }
                left -= 1;
            }
        }
    }

    fn open(&self, ctx: &zmq::Context) -> Result<zmq::Socket, zmq::Error> {
        let s = ctx.socket(zmq::SUB)?;
        s.set_linger(0)?;
        s.set_rcvhwm(i32::try_from(self.state.cfg.queue_limit).unwrap_or(i32::MAX))?;
        s.set_reconnect_ivl(100)?;
        s.set_reconnect_ivl_max(5000)?;
        s.set_subscribe(b"")?;
        s.connect(&self.stream.reg.endpoint)?;
        Ok(s)
    }

    fn message(&mut self, ctx: &zmq::Context, m: Vec<Vec<u8>>) {
        let state = self.state.clone();
        let metrics = &state.metrics;
        metrics.frames.fetch_add(1, Ordering::Relaxed);
        if m.len() != 3 || m[1].len() != 8 {
            metrics.bad_frames.fetch_add(1, Ordering::Relaxed);
            let n = m.len();
            self.warn(format_args!("msg=\"bad message\" frames={n}"));
            return;
        }
        let seq = u64::from_be_bytes(m[1][..].try_into().expect("8 bytes"));
        self.batch(ctx, seq, &m[2]);
    }

    fn batch(&mut self, ctx: &zmq::Context, seq: u64, payload: &[u8]) {
        let state = self.state.clone();
        let stream = self.stream.clone();
        let metrics = &state.metrics;
        metrics.bytes_in.fetch_add(payload.len() as u64, Ordering::Relaxed);
        let next = {
            let st = stream.lock();
            if st.stopped {
                return;
            }
            st.next
        };
        match next {
            None => {
                self.catch_up(ctx, 0, Some(seq));
            }
            Some(n) if seq > n => {
                metrics.gaps.fetch_add(1, Ordering::Relaxed);
                self.warn(format_args!("msg=gap expected={n} got={seq}"));
                self.catch_up(ctx, n, Some(seq));
            }
            _ => {}
        }
        let mut st = stream.lock();
        if st.stopped {
            return;
        }
        if let Some(n) = st.next
            && seq < n
        {
            if self.dups.get(&seq) == Some(&hash(payload)) {
                metrics.duplicates.fetch_add(1, Ordering::Relaxed);
                return;
            }
            // A restart: a new stream below the old cursor.
            metrics.restarts.fetch_add(1, Ordering::Relaxed);
            log(
                &self.state,
                "info",
                format_args!(
                    "msg=\"publisher restart\" instance_id={} cursor={n} seq={seq}",
                    self.stream.reg.instance_id
                ),
            );
            self.forget(&mut st);
            drop(st);
            self.catch_up(ctx, 0, Some(seq));
            st = stream.lock();
            if st.stopped {
                return;
            }
        }
        apply(&self.state, &self.stream, &mut st, seq, payload);
        // In order again: no live batch below this one comes any more.
        self.dups.clear();
    }

    /// Drops the worker's blocks and cursor (a restart: its new stream is learned anew).
    fn forget(&mut self, st: &mut StreamState) {
        let mut ranks = std::mem::take(&mut st.ranks);
        ranks.push(self.stream.reg.dp_rank);
        for r in ranks {
            self.stream.index.index.remove_worker(Worker::new(self.stream.reg.instance_id, r));
        }
        st.next = None;
        st.last = None;
        self.dups.clear();
    }

    /// Replays from `from` (when the worker has a replay endpoint) and applies what comes
    /// in order, skipping what is applied already; with `upto` (the live batch in hand)
    /// only the batches below it (the others come live, in order, after it). Without it,
    /// the batches applied are remembered, to know their live copies if those come after.
    ///
    /// Replaying from the cursor, the answer starts one batch earlier, at the last batch
    /// applied: if its bytes are not the ones applied, the worker restarted (its new stream
    /// has passed the old cursor): the worker is dropped and learned from the start again.
    fn catch_up(&mut self, ctx: &zmq::Context, from: u64, upto: Option<u64>) -> bool {
        if self.replay.is_none() {
            return true;
        }
        let verify = {
            let st = self.stream.lock();
            st.last
                .filter(|&(s, _)| st.next == Some(s.wrapping_add(1)) && from == s.wrapping_add(1))
        };
        let mut restarted = false;
        let ok = self.fetch_and_apply(
            ctx,
            verify.map_or(from, |(s, _)| s),
            upto,
            verify,
            &mut restarted,
        );
        if restarted {
            let state = self.state.clone();
            state.metrics.restarts.fetch_add(1, Ordering::Relaxed);
            log(
                &state,
                "info",
                format_args!(
                    "msg=\"publisher restart\" instance_id={} cursor={from} reason=\"replay differs at the last batch applied\"",
                    self.stream.reg.instance_id
                ),
            );
            let stream = self.stream.clone();
            let mut st = stream.lock();
            if st.stopped {
                return ok;
            }
            self.forget(&mut st);
            drop(st);
            let mut again = false;
            return self.fetch_and_apply(ctx, 0, upto, None, &mut again);
        }
        ok
    }

    fn fetch_and_apply(
        &mut self,
        ctx: &zmq::Context,
        from: u64,
        upto: Option<u64>,
        verify: Option<(u64, u64)>,
        restarted: &mut bool,
    ) -> bool {
        let Some(rp) = self.replay.as_mut() else { return true };
        let (state, stream, dups) = (&self.state, &self.stream, &mut self.dups);
        state.metrics.replays.fetch_add(1, Ordering::Relaxed);
        if dups.len() > MAX_DUPS {
            dups.clear();
        }
        let mut applied = 0usize;
        let r = rp.fetch(ctx, from, &stream.stop, |seq, payload| {
            if *restarted {
                return;
            }
            if let Some((vs, vh)) = verify
                && seq == vs
            {
                *restarted = hash(payload) != vh;
                return;
            }
            let mut st = stream.lock();
            if st.stopped {
                return;
            }
            state.metrics.bytes_in.fetch_add(payload.len() as u64, Ordering::Relaxed);
            if upto.is_some_and(|u| seq >= u) {
                return;
            }
            if upto.is_none() {
                dups.insert(seq, hash(payload));
            }
            if st.next.is_some_and(|n| seq < n) {
                return;
            }
            state.metrics.replayed_batches.fetch_add(1, Ordering::Relaxed);
            applied += 1;
            apply(state, stream, &mut st, seq, payload);
        });
        match r {
            Ok(n) => {
                // Found something new: look again soon; nothing: back off.
                self.backoff =
                    if applied > 0 { IDLE_REPLAY } else { (self.backoff * 2).min(MAX_BACKOFF) };
                self.replay_at = Some(Instant::now() + self.backoff);
                log(
                    state,
                    "debug",
                    format_args!(
                        "msg=replayed instance_id={} from={from} batches={n}",
                        stream.reg.instance_id
                    ),
                );
                true
            }
            Err(e) => {
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                self.replay_at = Some(Instant::now() + self.backoff);
                state.metrics.replay_failures.fetch_add(1, Ordering::Relaxed);
                if !stream.stop.load(Ordering::Relaxed) {
                    self.warn(format_args!("msg=\"replay failed\" from={from} error={e:?}"));
                }
                false
            }
        }
    }
}
