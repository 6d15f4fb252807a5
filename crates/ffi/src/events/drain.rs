//! Draining: closed batches taken from the cache's queue into the caller's buffers
//! (`rkv_events_drain`, and the tier's through [`drain_into`]).

use super::*;

/// Takes closed batches from the cache's drain queue, in sequence order, as many whole
/// batches as fit in the caller's buffers (an extension of version 1), and writes their
/// events to `out_events[0..events_cap]`, the events' hashes to `out_hashes[0..hashes_cap]`,
/// their tokens to `out_tokens[0..tokens_cap]` and their LoRA names and salts
/// (NUL-terminated) to `out_strings[0..strings_cap]`; each `rkv_event` points into those
/// buffers (see `rkv_event`). `*out_info` (required) says what was taken and how many
/// batches are left (`rkv_events_drain_info`). A batch is never split: it is taken with all
/// its events, or left queued.
///
/// - Nothing queued: `RKV_OK` with all counts 0 (also while a publisher is attached, which
///   takes every batch itself).
/// - The first queued batch does not fit: `RKV_BUFFER_TOO_SMALL`, nothing taken, nothing
///   written but `*out_info`, which gives the entries each buffer needs to take every
///   batch queued now; grow the buffers to that and call again.
/// - `RKV_OK` with `batches_left > 0`: the buffers held only the first batches; call again.
///
/// Any buffer may be NULL when its capacity is 0 (all four with capacity 0 just measure).
/// The buffers must not overlap one another. `RKV_INVALID_ARGUMENT` for a cache without
/// events. Thread-safe: concurrent drains take disjoint batches; the measuring runs under
/// the lock every insert's event push takes, so it costs them O(queued events) once.
///
/// # Safety
/// `cache` is NULL or live; each buffer NULL or writable for its capacity; `out_info` NULL
/// or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_events_drain(
    cache: *const rkv_cache,
    out_events: *mut rkv_event,
    events_cap: usize,
    out_hashes: *mut u64,
    hashes_cap: usize,
    out_tokens: *mut u32,
    tokens_cap: usize,
    out_strings: *mut c_char,
    strings_cap: usize,
    out_info: *mut rkv_events_drain_info,
) -> rkv_status {
    boundary("rkv_events_drain", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller's contract for the buffers and `out_info` is `drain_into`'s.
        unsafe {
            drain_into(
                || sink(c),
                out_events,
                events_cap,
                out_hashes,
                hashes_cap,
                out_tokens,
                tokens_cap,
                out_strings,
                strings_cap,
                out_info,
            )
        }
    })
}

/// The body of `rkv_events_drain` (and `rkv_tier_events_drain`) inside its boundary: checks
/// the buffers, then takes the sink from `get_sink` (which refuses a cache without events)
/// and drains it as `rkv_events_drain` documents.
///
/// # Safety
/// Each buffer NULL or writable for its capacity; `out_info` NULL or writable.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn drain_into<'a>(
    get_sink: impl FnOnce() -> Res<&'a std::sync::Arc<EventSink>>,
    out_events: *mut rkv_event,
    events_cap: usize,
    out_hashes: *mut u64,
    hashes_cap: usize,
    out_tokens: *mut u32,
    tokens_cap: usize,
    out_strings: *mut c_char,
    strings_cap: usize,
    out_info: *mut rkv_events_drain_info,
) -> Res<()> {
    check_out_array(out_events, events_cap, "out_events", "events_cap")?;
    check_out_array(out_hashes, hashes_cap, "out_hashes", "hashes_cap")?;
    check_out_array(out_tokens, tokens_cap, "out_tokens", "tokens_cap")?;
    check_out_array(out_strings, strings_cap, "out_strings", "strings_cap")?;
    check_out(out_info, "out_info")?;
    let s = get_sink()?;
    let cap =
        Need { events: events_cap, hashes: hashes_cap, tokens: tokens_cap, strings: strings_cap };
    let t = take_fitting(s, cap);
    if t.batches.is_empty() && t.queued > 0 {
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_info.write(t.all.info(t.queued, t.queued)) };
        return Err(nothing_fits(t.queued, cap, t.all));
    }
    let mut laid = Laid::new(t.taken, out_hashes, out_tokens, out_strings);
    for (seq, b) in &t.batches {
        for e in &b.events {
            laid.push(*seq, b.ts, e);
        }
    }
    debug_assert_eq!(laid.need(), t.taken);
    let info = laid.need().info(t.batches.len(), t.queued - t.batches.len());
    // SAFETY: every buffer passed `check_out_array` with its capacity, and what is
    // written fits it (`t.taken.fits(cap)`); the sources are our own vectors. The
    // caller guarantees the buffers are writable.
    unsafe {
        write_array(out_events, &laid.events);
        write_array(out_hashes, &laid.hashes);
        write_array(out_tokens, &laid.tokens);
        write_array(out_strings.cast::<u8>(), &laid.strings);
        out_info.write(info);
    }
    Ok(())
}

/// The batches `rkv_events_drain` took from the front of the queue, and the counts it
/// measured under the sink's lock.
struct Taken {
    /// The batches that fit, in order (taken off the queue).
    batches: Vec<(u64, EventBatch)>,
    /// What they need.
    taken: Need,
    /// What every queued batch needs.
    all: Need,
    /// Batches queued when the drain looked.
    queued: usize,
}

/// Takes the longest run of front batches that fits `cap` together, measuring what the
/// whole queue needs meanwhile (under the sink's lock).
fn take_fitting(s: &EventSink, cap: Need) -> Taken {
    let (mut taken, mut all) = (Need::default(), Need::default());
    let (mut queued, mut fit) = (0usize, 0usize);
    let batches = s.drain_front(|q| {
        let mut fitting = true;
        for (_, b) in q {
            let n = Need::of(b);
            queued += 1;
            all = all.plus(n);
            if fitting && taken.plus(n).fits(cap) {
                taken = taken.plus(n);
                fit += 1;
            } else {
                fitting = false;
            }
        }
        fit
    });
    debug_assert_eq!(batches.len(), fit);
    Taken { batches, taken, all, queued }
}

/// `RKV_BUFFER_TOO_SMALL` when not even the first of `queued` batches fits `cap`.
fn nothing_fits(queued: usize, cap: Need, all: Need) -> crate::Fail {
    fail(
        rkv_status::RKV_BUFFER_TOO_SMALL,
        format!(
            "the first of the {queued} queued batches does not fit (events_cap = {}, \
             hashes_cap = {}, tokens_cap = {}, strings_cap = {}); all of them need {} events, \
             {} hashes, {} tokens, {} string bytes (in *out_info); nothing was taken",
            cap.events,
            cap.hashes,
            cap.tokens,
            cap.strings,
            all.events,
            all.hashes,
            all.tokens,
            all.strings
        ),
    )
}

/// Drained events laid out in our own vectors, to be copied to the caller's buffers: each
/// event points into those buffers at the offsets its arrays get there.
struct Laid {
    events: Vec<rkv_event>,
    hashes: Vec<u64>,
    tokens: Vec<u32>,
    strings: Vec<u8>,
    out_hashes: *mut u64,
    out_tokens: *mut u32,
    out_strings: *mut c_char,
}

/// The address of element `off` of a caller buffer, or NULL for an empty array.
/// `wrapping_add` computes it without asserting anything; it stays in the buffer, since
/// `off + n <= cap` for everything laid out (they fit).
fn at<T>(base: *mut T, off: usize, n: usize) -> *const T {
    if n == 0 { std::ptr::null() } else { base.wrapping_add(off).cast_const() }
}

impl Laid {
    /// Room for `need`, pointing into the caller's three array buffers.
    fn new(
        need: Need,
        out_hashes: *mut u64,
        out_tokens: *mut u32,
        out_strings: *mut c_char,
    ) -> Laid {
        Laid {
            events: Vec::with_capacity(need.events),
            hashes: Vec::with_capacity(need.hashes),
            tokens: Vec::with_capacity(need.tokens),
            strings: Vec::with_capacity(need.strings),
            out_hashes,
            out_tokens,
            out_strings,
        }
    }

    /// What is laid out so far.
    fn need(&self) -> Need {
        Need {
            events: self.events.len(),
            hashes: self.hashes.len(),
            tokens: self.tokens.len(),
            strings: self.strings.len(),
        }
    }

    /// A string's copy (NUL-terminated) and its address in the caller's buffer; NULL for none.
    fn put_str(&mut self, s: &Option<std::sync::Arc<str>>) -> *const c_char {
        let Some(s) = s else { return std::ptr::null() };
        let p = self.out_strings.wrapping_add(self.strings.len()).cast_const();
        self.strings.extend_from_slice(s.as_bytes());
        self.strings.push(0);
        p
    }

    /// Hashes' copy and their address in the caller's buffer.
    fn put_hashes(&mut self, h: &[u64]) -> *const u64 {
        let p = at(self.out_hashes, self.hashes.len(), h.len());
        self.hashes.extend_from_slice(h);
        p
    }

    /// Event `e` of batch `seq` (timestamp `ts`), its arrays appended.
    fn push(&mut self, seq: u64, ts: f64, e: &KvEvent) {
        let mut ev = rkv_event {
            seq,
            ts,
            kind: rkv_event_kind::RKV_EVENT_ALL_BLOCKS_CLEARED as u32,
            medium: rkv_medium::RKV_MEDIUM_GPU as u32,
            block_size: 0,
            has_parent: 0,
            parent_block_hash: 0,
            block_hashes: std::ptr::null(),
            n_block_hashes: 0,
            token_ids: std::ptr::null(),
            n_token_ids: 0,
            lora_name: std::ptr::null(),
            cache_salt: std::ptr::null(),
        };
        match e {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                cache_salt,
                medium,
            } => {
                ev.kind = rkv_event_kind::RKV_EVENT_BLOCK_STORED as u32;
                ev.medium = medium_of(*medium);
                ev.block_size = *block_size;
                ev.has_parent = u32::from(parent_block_hash.is_some());
                ev.parent_block_hash = parent_block_hash.unwrap_or(0);
                ev.block_hashes = self.put_hashes(block_hashes);
                ev.n_block_hashes = block_hashes.len();
                ev.token_ids = at(self.out_tokens, self.tokens.len(), token_ids.len());
                ev.n_token_ids = token_ids.len();
                self.tokens.extend_from_slice(token_ids);
                ev.lora_name = self.put_str(lora_name);
                ev.cache_salt = self.put_str(cache_salt);
            }
            KvEvent::BlockRemoved { block_hashes, medium } => {
                ev.kind = rkv_event_kind::RKV_EVENT_BLOCK_REMOVED as u32;
                ev.medium = medium_of(*medium);
                ev.block_hashes = self.put_hashes(block_hashes);
                ev.n_block_hashes = block_hashes.len();
            }
            KvEvent::AllBlocksCleared => {}
        }
        self.events.push(ev);
    }
}

/// The entries one batch needs in each of `rkv_events_drain`'s buffers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Need {
    events: usize,
    hashes: usize,
    tokens: usize,
    strings: usize,
}

impl Need {
    fn of(b: &EventBatch) -> Need {
        let str_bytes = |s: &Option<std::sync::Arc<str>>| s.as_ref().map_or(0, |s| s.len() + 1);
        let mut n = Need { events: b.events.len(), ..Need::default() };
        for e in &b.events {
            match e {
                KvEvent::BlockStored { block_hashes, token_ids, lora_name, cache_salt, .. } => {
                    n.hashes += block_hashes.len();
                    n.tokens += token_ids.len();
                    n.strings += str_bytes(lora_name) + str_bytes(cache_salt);
                }
                KvEvent::BlockRemoved { block_hashes, .. } => n.hashes += block_hashes.len(),
                KvEvent::AllBlocksCleared => {}
            }
        }
        n
    }

    fn plus(self, o: Need) -> Need {
        Need {
            events: self.events.saturating_add(o.events),
            hashes: self.hashes.saturating_add(o.hashes),
            tokens: self.tokens.saturating_add(o.tokens),
            strings: self.strings.saturating_add(o.strings),
        }
    }

    /// `rkv_events_drain`'s `*out_info` for `n_batches` batches needing `self`, `left` left.
    fn info(self, n_batches: usize, left: usize) -> rkv_events_drain_info {
        rkv_events_drain_info {
            n_batches,
            n_events: self.events,
            n_hashes: self.hashes,
            n_tokens: self.tokens,
            n_string_bytes: self.strings,
            batches_left: left,
        }
    }

    fn fits(self, cap: Need) -> bool {
        self.events <= cap.events
            && self.hashes <= cap.hashes
            && self.tokens <= cap.tokens
            && self.strings <= cap.strings
    }
}
