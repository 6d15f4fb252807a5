//! vLLM's KV-event wire format: msgpack, encoded with `rmp` (decoded with `rmp-serde`).
//!
//! A payload is `[ts: float64, events: [...], data_parallel_rank: int]`. Each event is
//! one of (field for field as vLLM's `msgspec` structs in `vllm/distributed/kv_events.py`):
//!
//! ```text
//! ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
//!  medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
//!  kv_cache_spec_sliding_window]
//! ["BlockRemoved", block_hashes, medium, group_idx]
//! ["AllBlocksCleared"]
//! ```
//!
//! in the [`Encoding::VllmArray`] form (msgspec `array_like=True, tag=True`, every field
//! present), or as maps with `"type"` first and the fields whose value is their default
//! left out ([`Encoding::VllmMap`]: msgspec `tag=True, omit_defaults=True`; the fields
//! without a default, `lora_id`, `medium`, `lora_name`, `parent_block_hash`, are always
//! there). radixkv sends `lora_id` nil, and the cache's KV group ([`WireOptions::group`],
//! [`KvGroup`]) in every `BlockStored` (`group_idx`, `kv_cache_spec_kind`,
//! `kv_cache_spec_sliding_window`) and `BlockRemoved` (`group_idx`); the default group is
//! `group_idx` 0, `kv_cache_spec_kind` `"full_attention"`, `kv_cache_spec_sliding_window`
//! nil (left out of a map).
//!
//! vLLM has no `cache_salt` field: it folds the salt into the first block's `extra_keys`.
//! A salted `BlockStored` therefore carries `extra_keys = [["dynamo-cache-salt:<salt>"],
//! nil, ...]` (one entry per block), the tagged form Dynamo's decoder
//! (`dynamo_kv_router::zmq_wire::extra_keys_to_cache_namespace`) maps to its cache
//! namespace; an unsalted one has `extra_keys` nil. The salt rides on every `BlockStored`
//! of the namespace, not only on its first page's, so a router that joins mid-stream still
//! places a continuation in the right namespace. The tests pin the bytes against msgspec's
//! (`tests/golden/vllm_wire.py`).

use std::sync::Arc;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

pub use super::group::{EventGroup, KvCacheSpecKind, KvGroup};
use super::{EventBatch, KvEvent, Medium};
use crate::error::{Result, invalid};

/// The tag Dynamo's decoder looks for in a block's `extra_keys` to find its cache salt
/// (`dynamo_kv_router::zmq_wire::DYNAMO_CACHE_SALT_PREFIX`).
pub const CACHE_SALT_PREFIX: &str = "dynamo-cache-salt:";

/// The `kv_cache_spec_kind` of the default group ([`KvGroup::default`]).
pub const KV_CACHE_SPEC_KIND: &str = "full_attention";

/// How events are laid out in a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// Tagged arrays, every field present (the default).
    #[default]
    VllmArray,
    /// Tagged maps, `"type"` first, fields equal to their default omitted.
    VllmMap,
}

impl Encoding {
    /// The name the CLI and docs use: `vllm-array` or `vllm-map`.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::VllmArray => "vllm-array",
            Encoding::VllmMap => "vllm-map",
        }
    }

    /// The encoding a name gives; `InvalidArgument` for another name.
    pub fn from_name(s: &str) -> Result<Self> {
        match s {
            "vllm-array" => Ok(Encoding::VllmArray),
            "vllm-map" => Ok(Encoding::VllmMap),
            _ => Err(invalid(format!("unknown KV-event encoding {s:?} (vllm-array or vllm-map)"))),
        }
    }
}

/// How a payload is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WireOptions {
    /// The event layout.
    pub encoding: Encoding,
    /// Send block hashes as signed integers (their bits as `i64`), as SGLang does; see
    /// [`super::hash::HashMode::signed_on_wire`].
    pub signed_hashes: bool,
    /// The payload's `data_parallel_rank`.
    pub data_parallel_rank: i64,
    /// The KV cache group the cache's events belong to (default: group 0,
    /// `"full_attention"`, no window: the bytes radixkv always sent).
    pub group: KvGroup,
}

/// Encodes one batch as a payload.
///
/// Written straight into one buffer reserved up front with `rmp`'s encoders, in the compact
/// forms msgspec (and `rmp-serde`) choose: the smallest array, map, string and integer
/// headers that fit, a `float64` `ts`. A store's `token_ids` are most of a payload, and
/// going through serde's per-value dispatch for each of them cost the publisher's thread
/// about 9 ns a token (`BENCHMARKS.md`, "KV events"). The unit tests check the bytes equal
/// `rmp-serde`'s encoding of the same structure, the integration tests equal msgspec's.
pub fn encode_batch(batch: &EventBatch, opts: &WireOptions) -> Vec<u8> {
    encode_with(batch.ts, &batch.events, KvEvent::view, opts)
}

/// An event borrowed for encoding: what [`encode_batch`] writes of a [`KvEvent`], and what
/// a sink's resolved batch gives without copying a store's tokens out of the tree's leaf
/// ([`super::ClosedBatch::into_payload`]). One writer for both, so the bytes are one.
#[derive(Debug, Clone, Copy)]
pub(crate) enum EventView<'a> {
    /// A `BlockStored`'s fields.
    Stored {
        block_hashes: &'a [u64],
        parent_block_hash: Option<u64>,
        token_ids: &'a [u32],
        block_size: u32,
        lora_name: Option<&'a str>,
        cache_salt: Option<&'a str>,
        medium: Medium,
    },
    /// A `BlockRemoved`'s.
    Removed { block_hashes: &'a [u64], medium: Medium },
    /// `AllBlocksCleared`.
    Cleared,
}

impl KvEvent {
    /// The event borrowed for encoding.
    pub(crate) fn view(&self) -> EventView<'_> {
        match self {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                cache_salt,
                medium,
            } => EventView::Stored {
                block_hashes,
                parent_block_hash: *parent_block_hash,
                token_ids,
                block_size: *block_size,
                lora_name: lora_name.as_deref(),
                cache_salt: cache_salt.as_deref(),
                medium: *medium,
            },
            KvEvent::BlockRemoved { block_hashes, medium } => {
                EventView::Removed { block_hashes, medium: *medium }
            }
            KvEvent::AllBlocksCleared => EventView::Cleared,
        }
    }
}

/// Encodes a payload of `ts` and `events`, each seen through `view` (see [`encode_batch`]).
pub(crate) fn encode_with<T>(
    ts: f64,
    events: &[T],
    view: impl Fn(&T) -> EventView<'_>,
    opts: &WireOptions,
) -> Vec<u8> {
    let size: usize = events
        .iter()
        .map(|e| match view(e) {
            EventView::Stored { block_hashes, token_ids, lora_name, cache_salt, .. } => {
                160 + 9 * block_hashes.len()
                    + 5 * token_ids.len()
                    + lora_name.map_or(0, str::len)
                    + cache_salt.map_or(0, str::len)
            }
            EventView::Removed { block_hashes, .. } => 48 + 9 * block_hashes.len(),
            EventView::Cleared => 24,
        })
        .sum();
    let mut w = Mp(Vec::with_capacity(24 + size));
    w.arr(3);
    w.f64(ts);
    w.arr(events.len());
    for e in events {
        w.event(view(e), opts);
    }
    w.sint(opts.data_parallel_rank);
    w.0
}

/// A msgpack writer: `rmp`'s encoders (the crate under `rmp-serde`) writing into one
/// `Vec`, without serde's per-value dispatch. Each picks the smallest form that fits, as
/// msgspec and `rmp-serde` do.
struct Mp(Vec<u8>);

/// Writing into a `Vec` cannot fail (it grows or aborts), so an encoder's error is a bug.
fn infallible<T, E: std::fmt::Debug>(r: std::result::Result<T, E>) {
    r.map(|_| ()).expect("msgpack into a Vec cannot fail");
}

/// A msgpack length (arrays, maps: at most `u32::MAX` entries; a batch is far smaller).
fn len32(n: usize) -> u32 {
    u32::try_from(n).expect("a msgpack array or map holds at most u32::MAX entries")
}

/// Writes token id `x` at `out[n..]` in the smallest msgpack form (positive fixint,
/// `uint8`, `uint16`, `uint32`) and returns the offset past it; `out[n..n + 8]` must exist.
/// Branch-free: the id's bytes are built as one little-endian word (first byte lowest), the
/// form picked with selects, written as 8 bytes and the cursor moved by the form's length
/// (token ids of mixed sizes made the branches mispredict).
#[inline(always)]
fn put_token(out: &mut [u8], n: usize, x: u32) -> usize {
    let v = x as u64;
    let w1 = v; // positive fixint
    let w2 = 0xcc | (v << 8); // uint8
    let w3 = 0xcd | ((x as u16 as u64).swap_bytes() >> 40); // uint16, big-endian
    let w5 = 0xce | ((x.swap_bytes() as u64) << 8); // uint32, big-endian
    let (c2, c3, c5) = ((x >= 128) as u64, (x >= 256) as u64, (x >= 65536) as u64);
    // `b ^ ((a ^ b) & -c)`: `a` when `c`, else `b`, without a branch.
    let pick = |c: u64, a: u64, b: u64| b ^ ((a ^ b) & c.wrapping_neg());
    let w = pick(c5, w5, pick(c3, w3, pick(c2, w2, w1)));
    out[n..n + 8].copy_from_slice(&w.to_le_bytes());
    n + (1 + c2 + c3 + 2 * c5) as usize
}

impl Mp {
    fn arr(&mut self, n: usize) {
        infallible(rmp::encode::write_array_len(&mut self.0, len32(n)));
    }

    fn map(&mut self, n: usize) {
        infallible(rmp::encode::write_map_len(&mut self.0, len32(n)));
    }

    fn str(&mut self, s: &str) {
        infallible(rmp::encode::write_str(&mut self.0, s));
    }

    fn nil(&mut self) {
        infallible(rmp::encode::write_nil(&mut self.0));
    }

    fn uint(&mut self, v: u64) {
        infallible(rmp::encode::write_uint(&mut self.0, v));
    }

    fn sint(&mut self, v: i64) {
        infallible(rmp::encode::write_sint(&mut self.0, v));
    }

    fn f64(&mut self, v: f64) {
        infallible(rmp::encode::write_f64(&mut self.0, v));
    }

    /// An array of token ids: most of a store's bytes, so written out by hand (`write_uint`
    /// per id took 5.9 ns a token), in `write_uint`'s forms (positive fixint, `uint8`,
    /// `uint16`, `uint32`; the tests check the bytes against `rmp-serde`'s). Eight at a time: when all eight take the same form of a fixed width (`uint32`,
    /// ids of 65,536 and more, as a large vocabulary's and the Mooncake trace's are; or
    /// `uint16`, 256 to 65,535), each is written at a fixed offset, with no select and no
    /// moving cursor (0.6-0.8 ns a token against 2.0, measured side by side). Otherwise, and
    /// for the last ids, one at a time, branch-free ([`put_token`]); after eight of mixed
    /// forms the next 56 go that way without the check, so that ids of mixed sizes (a
    /// vocabulary's text: fixint punctuation among `uint16` words) pay no more than before
    /// (1.9 ns a token against 2.0; checking every eight cost them 2.5).
    fn tokens(&mut self, t: &[u32]) {
        self.arr(t.len());
        let start = self.0.len();
        // 5 bytes at most per id, and 3 of slack for the last 8-byte write.
        self.0.resize(start + 5 * t.len() + 3, 0);
        let out = &mut self.0[start..];
        let mut n = 0;
        let mut eights = t.chunks_exact(8);
        // Eights left to write one id at a time without the check.
        let mut mixed = 0u32;
        for c in &mut eights {
            if mixed > 0 {
                mixed -= 1;
                for &x in c {
                    n = put_token(out, n, x);
                }
                continue;
            }
            let (lo, hi) = c.iter().fold((u32::MAX, 0), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            if lo >= 65536 {
                // `uint32`: 0xce and the id big-endian, 5 bytes each, written as 8 (the
                // next id's write covers the 3 past its 5; the last's land in the slack
                // or the next ids' room).
                let o = &mut out[n..n + 43];
                for (k, &x) in c.iter().enumerate() {
                    let w = 0xce | (u64::from(x.swap_bytes()) << 8);
                    o[5 * k..5 * k + 8].copy_from_slice(&w.to_le_bytes());
                }
                n += 40;
            } else if lo >= 256 && hi < 65536 {
                // `uint16`: 0xcd and the id big-endian, 3 bytes each, written as 4.
                let o = &mut out[n..n + 25];
                for (k, &x) in c.iter().enumerate() {
                    let w = 0xcd | (u32::from((x as u16).swap_bytes()) << 8);
                    o[3 * k..3 * k + 4].copy_from_slice(&w.to_le_bytes());
                }
                n += 24;
            } else {
                mixed = 7;
                for &x in c {
                    n = put_token(out, n, x);
                }
            }
        }
        for &x in eights.remainder() {
            n = put_token(out, n, x);
        }
        self.0.truncate(start + n);
    }

    fn hash(&mut self, h: u64, signed: bool) {
        if signed { self.sint(h as i64) } else { self.uint(h) }
    }

    /// An array of block hashes. A hash is nearly always past 32 bits, so that form is
    /// written directly (`uint64`, or `int64` for a signed one below `i32::MIN`: the marker
    /// and 8 bytes big-endian, what `write_uint` and `write_sint` write for it) and the
    /// others go through `rmp`.
    fn hashes(&mut self, hs: &[u64], signed: bool) {
        self.arr(hs.len());
        self.0.reserve(9 * hs.len());
        for &h in hs {
            let v = h as i64;
            if !signed && h > u64::from(u32::MAX) || signed && v > i64::from(u32::MAX) {
                self.0.push(0xcf);
                self.0.extend_from_slice(&h.to_be_bytes());
            } else if signed && v < i64::from(i32::MIN) {
                self.0.push(0xd3);
                self.0.extend_from_slice(&h.to_be_bytes());
            } else {
                self.hash(h, signed);
            }
        }
    }

    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.str(s),
            None => self.nil(),
        }
    }

    /// `extra_keys` of a salted store: the tagged salt on the first block, nil on the
    /// others.
    fn extra_keys(&mut self, salt: &str, blocks: usize) {
        self.arr(blocks);
        for i in 0..blocks {
            if i == 0 {
                self.arr(1);
                self.str(&format!("{CACHE_SALT_PREFIX}{salt}"));
            } else {
                self.nil();
            }
        }
    }

    fn event(&mut self, e: EventView<'_>, opts: &WireOptions) {
        let signed = opts.signed_hashes;
        let map = opts.encoding == Encoding::VllmMap;
        match e {
            EventView::Stored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                cache_salt,
                medium,
            } => {
                let key = |w: &mut Mp, k: &str| {
                    if map {
                        w.str(k);
                    }
                };
                let group = &opts.group;
                let window = group.sliding_window();
                if map {
                    self.map(10 + cache_salt.is_some() as usize + window.is_some() as usize);
                } else {
                    self.arr(12);
                }
                key(self, "type");
                self.str("BlockStored");
                key(self, "block_hashes");
                self.hashes(block_hashes, signed);
                key(self, "parent_block_hash");
                match parent_block_hash {
                    Some(h) => self.hash(h, signed),
                    None => self.nil(),
                }
                key(self, "token_ids");
                self.tokens(token_ids);
                key(self, "block_size");
                self.uint(u64::from(block_size));
                key(self, "lora_id");
                self.nil();
                key(self, "medium");
                self.str(medium.as_str());
                key(self, "lora_name");
                self.opt_str(lora_name);
                match (cache_salt, map) {
                    (Some(c), _) => {
                        key(self, "extra_keys");
                        self.extra_keys(c, block_hashes.len());
                    }
                    (None, false) => self.nil(),
                    (None, true) => {}
                }
                key(self, "group_idx");
                self.uint(u64::from(group.idx()));
                key(self, "kv_cache_spec_kind");
                self.str(group.kind().as_str());
                match window {
                    Some(w) => {
                        key(self, "kv_cache_spec_sliding_window");
                        self.uint(u64::from(w));
                    }
                    None if !map => self.nil(),
                    None => {}
                }
            }
            EventView::Removed { block_hashes, medium } => {
                if map {
                    self.map(4);
                    self.str("type");
                    self.str("BlockRemoved");
                    self.str("block_hashes");
                    self.hashes(block_hashes, signed);
                    self.str("medium");
                    self.str(medium.as_str());
                    self.str("group_idx");
                } else {
                    self.arr(4);
                    self.str("BlockRemoved");
                    self.hashes(block_hashes, signed);
                    self.str(medium.as_str());
                }
                self.uint(u64::from(opts.group.idx()));
            }
            EventView::Cleared => {
                if map {
                    self.map(1);
                    self.str("type");
                } else {
                    self.arr(1);
                }
                self.str("AllBlocksCleared");
            }
        }
    }
}

/// A decoded payload.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedBatch {
    /// The batch (its `ts` and events).
    pub batch: EventBatch,
    /// Its `data_parallel_rank` (`None` when nil or absent).
    pub data_parallel_rank: Option<i64>,
    /// The group fields of each event (one per event of `batch.events`, in order).
    pub groups: Vec<EventGroup>,
}

/// Decodes a payload in either encoding (and either hash signedness: a signed hash comes
/// back as its bits). Unknown trailing fields and map keys are ignored, as vLLM's
/// consumers do; a payload that is not a batch, an unknown event tag, a missing field or
/// an unknown medium is `InvalidArgument`.
pub fn decode_batch(payload: &[u8]) -> Result<DecodedBatch> {
    let v: Val =
        rmp_serde::from_slice(payload).map_err(|e| invalid(format!("KV-event payload: {e}")))?;
    let Val::Arr(parts) = v else {
        return Err(invalid("KV-event payload: not an array [ts, events, data_parallel_rank]"));
    };
    let ts = match parts.first() {
        Some(Val::F(f)) => *f,
        Some(Val::U(u)) => *u as f64,
        Some(Val::I(i)) => *i as f64,
        _ => return Err(invalid("KV-event payload: ts is not a number")),
    };
    let Some(Val::Arr(evs)) = parts.get(1) else {
        return Err(invalid("KV-event payload: events is not an array"));
    };
    let data_parallel_rank = match parts.get(2) {
        None | Some(Val::Nil) => None,
        Some(v) => Some(v.int().ok_or_else(|| invalid("KV-event payload: data_parallel_rank"))?),
    };
    let (events, groups) = evs.iter().map(decode_event).collect::<Result<(Vec<_>, Vec<_>)>>()?;
    Ok(DecodedBatch { batch: EventBatch { ts, events }, data_parallel_rank, groups })
}

/// The fields of an event, by name, whichever the encoding.
enum Fields<'a> {
    /// An array event and the names of its positions.
    Arr(&'a [Val], &'static [&'static str]),
    /// A map event.
    Map(&'a [(Val, Val)]),
}

impl<'a> Fields<'a> {
    fn get(&self, k: &str) -> Option<&'a Val> {
        match self {
            Fields::Arr(a, names) => names.iter().position(|n| *n == k).and_then(|i| a.get(i)),
            Fields::Map(m) => {
                m.iter().find_map(|(n, v)| matches!(n, Val::Str(n) if n == k).then_some(v))
            }
        }
    }
}

const STORED: [&str; 12] = [
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
];
const REMOVED: [&str; 4] = ["type", "block_hashes", "medium", "group_idx"];

/// An event's tag and fields.
fn fields(v: &Val) -> Result<(&str, Fields<'_>)> {
    match v {
        Val::Arr(a) => {
            let Some(Val::Str(tag)) = a.first() else {
                return Err(invalid("KV event: an array event must start with its tag"));
            };
            let names: &'static [&'static str] = match tag.as_str() {
                "BlockStored" => &STORED,
                "BlockRemoved" => &REMOVED,
                _ => &["type"],
            };
            Ok((tag, Fields::Arr(a, names)))
        }
        Val::Map(m) => {
            let tag = m.iter().find_map(|(k, v)| match (k, v) {
                (Val::Str(k), Val::Str(v)) if k == "type" => Some(v.as_str()),
                _ => None,
            });
            let Some(tag) = tag else {
                return Err(invalid("KV event: a map event needs a \"type\""));
            };
            Ok((tag, Fields::Map(m)))
        }
        _ => Err(invalid("KV event: neither an array nor a map")),
    }
}

fn hashes(v: Option<&Val>) -> Result<Vec<u64>> {
    match v {
        Some(Val::Arr(a)) => a
            .iter()
            .map(|h| h.bits().ok_or_else(|| invalid("KV event: a block hash is not an integer")))
            .collect(),
        _ => Err(invalid("KV event: block_hashes missing or not an array")),
    }
}

fn medium(v: Option<&Val>) -> Result<Medium> {
    match v {
        None | Some(Val::Nil) => Ok(Medium::Gpu),
        Some(Val::Str(s)) => {
            Medium::from_wire(s).ok_or_else(|| invalid(format!("KV event: unknown medium {s:?}")))
        }
        _ => Err(invalid("KV event: medium is not a string")),
    }
}

/// An optional `u32` field (absent or nil: `None`).
fn opt_u32(v: Option<&Val>, name: &str) -> Result<Option<u32>> {
    match v {
        None | Some(Val::Nil) => Ok(None),
        Some(v) => v
            .int()
            .and_then(|i| u32::try_from(i).ok())
            .map(Some)
            .ok_or_else(|| invalid(format!("KV event: {name} is not a u32"))),
    }
}

/// The group fields of an event.
fn event_group(f: &Fields<'_>) -> Result<EventGroup> {
    let kind = match f.get("kv_cache_spec_kind") {
        None | Some(Val::Nil) => None,
        Some(Val::Str(s)) => {
            Some(KvCacheSpecKind::from_name(s).unwrap_or(KvCacheSpecKind::Unknown))
        }
        Some(_) => return Err(invalid("KV event: kv_cache_spec_kind is not a string")),
    };
    Ok(EventGroup {
        group_idx: opt_u32(f.get("group_idx"), "group_idx")?,
        kind,
        sliding_window: opt_u32(
            f.get("kv_cache_spec_sliding_window"),
            "kv_cache_spec_sliding_window",
        )?,
    })
}

fn decode_event(v: &Val) -> Result<(KvEvent, EventGroup)> {
    let (tag, f) = fields(v)?;
    let event = decode_fields(tag, &f)?;
    let group = match event {
        KvEvent::AllBlocksCleared => EventGroup::default(),
        _ => event_group(&f)?,
    };
    Ok((event, group))
}

fn decode_fields(tag: &str, f: &Fields<'_>) -> Result<KvEvent> {
    let get = |k| f.get(k);
    match tag {
        "BlockStored" => {
            let block_hashes = hashes(get("block_hashes"))?;
            let parent_block_hash = match get("parent_block_hash") {
                None | Some(Val::Nil) => None,
                Some(h) => Some(h.bits().ok_or_else(|| invalid("KV event: parent_block_hash"))?),
            };
            let token_ids = match get("token_ids") {
                Some(Val::Arr(a)) => a
                    .iter()
                    .map(|t| t.int().and_then(|t| u32::try_from(t).ok()))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| invalid("KV event: a token id is not a u32"))?,
                _ => return Err(invalid("KV event: token_ids missing")),
            };
            let block_size = get("block_size")
                .and_then(Val::int)
                .and_then(|b| u32::try_from(b).ok())
                .ok_or_else(|| invalid("KV event: block_size missing"))?;
            let lora_name = match get("lora_name") {
                Some(Val::Str(s)) => Some(Arc::from(s.as_str())),
                _ => None,
            };
            let cache_salt = match get("extra_keys") {
                Some(Val::Arr(blocks)) => match blocks.first() {
                    Some(Val::Arr(keys)) => keys.iter().find_map(|k| match k {
                        Val::Str(s) => s.strip_prefix(CACHE_SALT_PREFIX).map(Arc::from),
                        _ => None,
                    }),
                    _ => None,
                },
                _ => None,
            };
            Ok(KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                cache_salt,
                medium: medium(get("medium"))?,
            })
        }
        "BlockRemoved" => Ok(KvEvent::BlockRemoved {
            block_hashes: hashes(get("block_hashes"))?,
            medium: medium(get("medium"))?,
        }),
        "AllBlocksCleared" => Ok(KvEvent::AllBlocksCleared),
        t => Err(invalid(format!("KV event: unknown tag {t:?}"))),
    }
}

/// A msgpack value, keeping integers' signedness.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Nil,
    Bool(bool),
    U(u64),
    I(i64),
    F(f64),
    Str(String),
    Bin(Vec<u8>),
    Arr(Vec<Val>),
    Map(Vec<(Val, Val)>),
}

impl Val {
    /// An integer that fits `i64`.
    fn int(&self) -> Option<i64> {
        match self {
            Val::U(u) => i64::try_from(*u).ok(),
            Val::I(i) => Some(*i),
            _ => None,
        }
    }

    /// A 64-bit hash as its bits, signed or unsigned.
    fn bits(&self) -> Option<u64> {
        match self {
            Val::U(u) => Some(*u),
            Val::I(i) => Some(*i as u64),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for Val {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(ValVisitor)
    }
}

struct ValVisitor;

impl<'de> Visitor<'de> for ValVisitor {
    type Value = Val;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a msgpack value")
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<Val, E> {
        Ok(Val::Nil)
    }
    fn visit_none<E: de::Error>(self) -> std::result::Result<Val, E> {
        Ok(Val::Nil)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Val, D::Error> {
        Val::deserialize(d)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Val, E> {
        Ok(Val::Bool(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Val, E> {
        Ok(Val::U(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Val, E> {
        Ok(if v >= 0 { Val::U(v as u64) } else { Val::I(v) })
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Val, E> {
        Ok(Val::F(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Val, E> {
        Ok(Val::Str(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Val, E> {
        Ok(Val::Str(v))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> std::result::Result<Val, E> {
        Ok(Val::Bin(v.to_vec()))
    }
    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> std::result::Result<Val, E> {
        Ok(Val::Bin(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> std::result::Result<Val, A::Error> {
        let mut v = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(x) = a.next_element()? {
            v.push(x);
        }
        Ok(Val::Arr(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> std::result::Result<Val, A::Error> {
        let mut v = Vec::new();
        while let Some(kv) = a.next_entry()? {
            v.push(kv);
        }
        Ok(Val::Map(v))
    }
}

/// The serde encoder `encode_batch` replaced, kept as the tests' reference for its bytes.
#[cfg(all(test, not(loom)))]
mod reference {
    use serde::Serialize;
    use serde::ser::{SerializeMap, SerializeSeq, SerializeTuple, Serializer};

    use super::{CACHE_SALT_PREFIX, Encoding, WireOptions};
    use crate::events::{EventBatch, KvEvent};

    /// The payload as `rmp-serde` writes it.
    pub fn encode(batch: &EventBatch, opts: &WireOptions) -> Vec<u8> {
        rmp_serde::to_vec(&WireBatch { batch, opts }).expect("encoding into a Vec cannot fail")
    }

    struct WireBatch<'a> {
        batch: &'a EventBatch,
        opts: &'a WireOptions,
    }

    impl Serialize for WireBatch<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            let mut t = s.serialize_tuple(3)?;
            t.serialize_element(&self.batch.ts)?;
            t.serialize_element(&Events(self))?;
            t.serialize_element(&self.opts.data_parallel_rank)?;
            t.end()
        }
    }

    struct Events<'a>(&'a WireBatch<'a>);

    impl Serialize for Events<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            let mut q = s.serialize_seq(Some(self.0.batch.events.len()))?;
            for e in &self.0.batch.events {
                q.serialize_element(&WireEvent { e, opts: self.0.opts })?;
            }
            q.end()
        }
    }

    struct WireEvent<'a> {
        e: &'a KvEvent,
        opts: &'a WireOptions,
    }

    /// A list of block hashes, unsigned or signed.
    struct Hashes<'a>(&'a [u64], bool);

    impl Serialize for Hashes<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            let mut q = s.serialize_seq(Some(self.0.len()))?;
            for h in self.0 {
                q.serialize_element(&Hash(*h, self.1))?;
            }
            q.end()
        }
    }

    struct Hash(u64, bool);

    impl Serialize for Hash {
        fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            if self.1 { s.serialize_i64(self.0 as i64) } else { s.serialize_u64(self.0) }
        }
    }

    /// `extra_keys` of a salted store: the tagged salt on the first block, nil on the others.
    struct ExtraKeys<'a>(&'a str, usize);

    impl Serialize for ExtraKeys<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            let mut q = s.serialize_seq(Some(self.1))?;
            for i in 0..self.1 {
                if i == 0 {
                    q.serialize_element(&[format!("{CACHE_SALT_PREFIX}{}", self.0)])?;
                } else {
                    q.serialize_element(&Option::<()>::None)?;
                }
            }
            q.end()
        }
    }

    impl Serialize for WireEvent<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            let signed = self.opts.signed_hashes;
            let map = self.opts.encoding == Encoding::VllmMap;
            match self.e {
                KvEvent::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_name,
                    cache_salt,
                    medium,
                } => {
                    let hashes = Hashes(block_hashes, signed);
                    let parent = parent_block_hash.map(|h| Hash(h, signed));
                    let extra = cache_salt.as_deref().map(|c| ExtraKeys(c, block_hashes.len()));
                    let group = &self.opts.group;
                    let window = group.sliding_window();
                    if map {
                        let n = 10 + extra.is_some() as usize + window.is_some() as usize;
                        let mut m = s.serialize_map(Some(n))?;
                        m.serialize_entry("type", "BlockStored")?;
                        m.serialize_entry("block_hashes", &hashes)?;
                        m.serialize_entry("parent_block_hash", &parent)?;
                        m.serialize_entry("token_ids", token_ids)?;
                        m.serialize_entry("block_size", block_size)?;
                        m.serialize_entry("lora_id", &Option::<()>::None)?;
                        m.serialize_entry("medium", medium.as_str())?;
                        m.serialize_entry("lora_name", &lora_name.as_deref())?;
                        if let Some(x) = &extra {
                            m.serialize_entry("extra_keys", x)?;
                        }
                        m.serialize_entry("group_idx", &group.idx())?;
                        m.serialize_entry("kv_cache_spec_kind", group.kind().as_str())?;
                        if let Some(w) = window {
                            m.serialize_entry("kv_cache_spec_sliding_window", &w)?;
                        }
                        m.end()
                    } else {
                        let mut t = s.serialize_tuple(12)?;
                        t.serialize_element("BlockStored")?;
                        t.serialize_element(&hashes)?;
                        t.serialize_element(&parent)?;
                        t.serialize_element(token_ids)?;
                        t.serialize_element(block_size)?;
                        t.serialize_element(&Option::<()>::None)?;
                        t.serialize_element(medium.as_str())?;
                        t.serialize_element(&lora_name.as_deref())?;
                        t.serialize_element(&extra)?;
                        t.serialize_element(&group.idx())?;
                        t.serialize_element(group.kind().as_str())?;
                        t.serialize_element(&window)?;
                        t.end()
                    }
                }
                KvEvent::BlockRemoved { block_hashes, medium } => {
                    let hashes = Hashes(block_hashes, signed);
                    if map {
                        let mut m = s.serialize_map(Some(4))?;
                        m.serialize_entry("type", "BlockRemoved")?;
                        m.serialize_entry("block_hashes", &hashes)?;
                        m.serialize_entry("medium", medium.as_str())?;
                        m.serialize_entry("group_idx", &self.opts.group.idx())?;
                        m.end()
                    } else {
                        let mut t = s.serialize_tuple(4)?;
                        t.serialize_element("BlockRemoved")?;
                        t.serialize_element(&hashes)?;
                        t.serialize_element(medium.as_str())?;
                        t.serialize_element(&self.opts.group.idx())?;
                        t.end()
                    }
                }
                KvEvent::AllBlocksCleared => {
                    if map {
                        let mut m = s.serialize_map(Some(1))?;
                        m.serialize_entry("type", "AllBlocksCleared")?;
                        m.end()
                    } else {
                        let mut t = s.serialize_tuple(1)?;
                        t.serialize_element("AllBlocksCleared")?;
                        t.end()
                    }
                }
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn sample() -> EventBatch {
        EventBatch {
            ts: 1.5,
            events: vec![
                KvEvent::BlockStored {
                    block_hashes: vec![1, u64::MAX],
                    parent_block_hash: Some(7),
                    token_ids: vec![1, 2, 3, 4],
                    block_size: 2,
                    lora_name: Some("a".into()),
                    cache_salt: Some("s".into()),
                    medium: Medium::Gpu,
                },
                KvEvent::BlockRemoved { block_hashes: vec![1 << 63], medium: Medium::CpuPinned },
                KvEvent::AllBlocksCleared,
            ],
        }
    }

    /// Groups that cross the encodings' choices: the default, a window (one more map
    /// entry), a large index and every kind.
    fn groups() -> Vec<KvGroup> {
        let mut g = vec![
            KvGroup::default(),
            KvGroup::new(1, KvCacheSpecKind::SlidingWindow, Some(4096)).unwrap(),
            KvGroup::new(u32::MAX, KvCacheSpecKind::SlidingWindowMla, Some(u32::MAX)).unwrap(),
            KvGroup::new(300, KvCacheSpecKind::SlidingWindow, Some(1)).unwrap(),
        ];
        for (i, k) in KvCacheSpecKind::ALL.into_iter().enumerate() {
            if !k.has_window() {
                g.push(KvGroup::new(i as u32 * 40, k, None).unwrap());
            }
        }
        g
    }

    #[test]
    fn round_trips_in_both_encodings_and_signedness() {
        for encoding in [Encoding::VllmArray, Encoding::VllmMap] {
            for signed_hashes in [false, true] {
                for group in groups() {
                    let o = WireOptions { encoding, signed_hashes, data_parallel_rank: 3, group };
                    let d = decode_batch(&encode_batch(&sample(), &o)).unwrap();
                    assert_eq!(d.batch, sample());
                    assert_eq!(d.data_parallel_rank, Some(3));
                    let sent = EventGroup {
                        group_idx: Some(group.idx()),
                        kind: Some(group.kind()),
                        sliding_window: group.sliding_window(),
                    };
                    let removed = EventGroup { group_idx: Some(group.idx()), ..sent };
                    let removed = EventGroup { kind: None, sliding_window: None, ..removed };
                    assert_eq!(d.groups, vec![sent, removed, EventGroup::default()], "{o:?}");
                }
            }
        }
    }

    /// What vLLM sends and radixkv does not (an unknown kind, fields absent) decodes; a
    /// group field of the wrong type is refused.
    #[test]
    fn group_fields_decode_leniently_and_refuse_wrong_types() {
        use serde::Serialize;
        fn stored(
            idx: impl Serialize,
            kind: impl Serialize,
            w: impl Serialize,
        ) -> Result<DecodedBatch> {
            let nil = Option::<()>::None;
            let ev =
                ("BlockStored", [1u64], nil, [1u32, 2], 2u32, nil, "GPU", nil, nil, idx, kind, w);
            decode_batch(&rmp_serde::to_vec(&(0.0f64, [ev], 0u32)).unwrap())
        }
        let nil = Option::<()>::None;
        let g = stored(nil, "linear_attention", nil).unwrap().groups[0];
        assert_eq!(
            g,
            EventGroup {
                group_idx: None,
                kind: Some(KvCacheSpecKind::Unknown),
                sliding_window: None
            }
        );
        let g = stored(7u32, "mamba", nil).unwrap().groups[0];
        assert_eq!((g.group_idx, g.kind), (Some(7), Some(KvCacheSpecKind::Mamba)));
        assert!(stored(-1i64, nil, nil).is_err(), "group_idx -1");
        assert!(stored(1u64 << 32, nil, nil).is_err(), "group_idx past u32");
        assert!(stored(0u32, 5u32, nil).is_err(), "kind not a string");
        assert!(stored(0u32, nil, "x").is_err(), "window not an integer");
    }

    /// The direct encoder writes exactly the bytes `rmp-serde` wrote through serde (which
    /// the integration tests pin against msgspec's), on batches whose lengths and values
    /// cross every msgpack header and integer boundary.
    #[test]
    fn the_direct_encoder_writes_rmp_serdes_bytes() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        const INTS: [u64; 18] = [
            0,
            1,
            31,
            32,
            127,
            128,
            255,
            256,
            65535,
            65536,
            (1 << 31) - 1,
            1 << 31,
            (1 << 32) - 1,
            1 << 32,
            (1 << 63) - 1,
            1 << 63,
            u64::MAX - 127,
            u64::MAX,
        ];
        const LENS: [usize; 9] = [0, 1, 15, 16, 31, 32, 255, 256, 300];
        let int = |r: u64| {
            if r.is_multiple_of(3) { INTS[(r / 3) as usize % INTS.len()] } else { r >> (r % 64) }
        };
        let name = |r: u64| match r % 4 {
            0 => None,
            _ => Some(Arc::<str>::from("n".repeat(LENS[(r / 4) as usize % LENS.len()]))),
        };
        let mut batches = Vec::new();
        for round in 0..400 {
            let mut events = Vec::new();
            let n_events = [0usize, 1, 2, 15, 16, 17][round % 6];
            for _ in 0..n_events {
                let r = rnd();
                events.push(match r % 4 {
                    0 | 1 => {
                        let pages = LENS[(r >> 8) as usize % LENS.len()].min(40);
                        let block = 1 + (r >> 16) as u32 % 4;
                        KvEvent::BlockStored {
                            block_hashes: (0..pages).map(|_| int(rnd())).collect(),
                            parent_block_hash: (r % 8 != 0).then(|| int(rnd())),
                            token_ids: (0..pages * block as usize)
                                .map(|_| int(rnd()) as u32)
                                .collect(),
                            block_size: block,
                            lora_name: name(rnd()),
                            cache_salt: name(rnd()),
                            medium: if r % 16 == 1 { Medium::CpuPinned } else { Medium::Gpu },
                        }
                    }
                    2 => KvEvent::BlockRemoved {
                        block_hashes: (0..LENS[(r >> 8) as usize % LENS.len()])
                            .map(|_| int(rnd()))
                            .collect(),
                        medium: Medium::Gpu,
                    },
                    _ => KvEvent::AllBlocksCleared,
                });
            }
            batches.push(EventBatch { ts: f64::from_bits(rnd() >> 2), events });
        }
        // One store long enough for the 32-bit array header (65,536 tokens and more).
        batches.push(EventBatch {
            ts: 0.0,
            events: vec![KvEvent::BlockStored {
                block_hashes: (0..4097).collect(),
                parent_block_hash: None,
                token_ids: (0..4097 * 16).collect(),
                block_size: 16,
                lora_name: None,
                cache_salt: Some("s".into()),
                medium: Medium::Gpu,
            }],
        });
        for b in &batches {
            for encoding in [Encoding::VllmArray, Encoding::VllmMap] {
                for signed_hashes in [false, true] {
                    for data_parallel_rank in [0, 5, -1, -40, 1 << 40, i64::MIN] {
                        let o = WireOptions {
                            encoding,
                            signed_hashes,
                            data_parallel_rank,
                            ..Default::default()
                        };
                        assert_eq!(encode_batch(b, &o), reference::encode(b, &o), "{o:?}");
                    }
                    for group in groups() {
                        let o =
                            WireOptions { encoding, signed_hashes, data_parallel_rank: 1, group };
                        assert_eq!(encode_batch(b, &o), reference::encode(b, &o), "{o:?}");
                    }
                }
            }
        }
    }

    /// Token ids in runs of one msgpack form (the encoder's eight-at-a-time paths) and
    /// mixed, at every offset and length around a multiple of eight: the bytes are
    /// `rmp-serde`'s.
    #[test]
    fn token_runs_of_each_form_encode_as_rmp_serde_does() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // Each form's range, its edges included: fixint, uint8, uint16, uint32.
        const FORMS: [(u32, u32); 4] = [(0, 127), (128, 255), (256, 65535), (65536, u32::MAX)];
        for round in 0..3000 {
            let len = if round < 64 { round } else { rnd() as usize % 700 };
            let mut t = Vec::with_capacity(len);
            while t.len() < len {
                let (lo, hi) = FORMS[rnd() as usize % 4];
                // Short runs (mixed eights) and long ones (the fixed-width paths, also
                // after the 56 ids a mixed eight sends one at a time).
                let run = 1 + rnd() as usize % [20, 150][rnd() as usize % 2];
                for _ in 0..run.min(len - t.len()) {
                    let r = rnd();
                    t.push(match r % 8 {
                        0 => lo,
                        1 => hi,
                        _ => lo + (r >> 8) as u32 % (hi - lo).max(1),
                    });
                }
            }
            let b = EventBatch {
                ts: 0.5,
                events: vec![KvEvent::BlockStored {
                    block_hashes: vec![1; len],
                    parent_block_hash: None,
                    token_ids: t,
                    block_size: 1,
                    lora_name: None,
                    cache_salt: None,
                    medium: Medium::Gpu,
                }],
            };
            let o = WireOptions::default();
            assert_eq!(encode_batch(&b, &o), reference::encode(&b, &o), "{b:?}");
        }
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(decode_batch(&[0xc1]).is_err());
        assert!(decode_batch(&rmp_serde::to_vec(&(1.0, vec![("Nope",)], 0)).unwrap()).is_err());
        assert!(Encoding::from_name("json").is_err());
    }
}
