//! Request traces: the Mooncake and token formats, and the built-in synthetic workload.
//!
//! A trace is a JSON-lines file, one request a line (blank lines are skipped). Two formats
//! are understood, detected per line ([`Format::Auto`]) or forced:
//!
//! - **mooncake** (FAST'25 Mooncake release):
//!   `{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [h0, h1, ...]}`.
//!   Each hash id stands for one block of `B` tokens (`block_size`, default 512); the tokens
//!   are `concat over h of [h*B + i for i in 0..B]`, cut to `input_length`.
//! - **tokens**: `{"tokens": [u32...], "namespace": u64, "output_length": m, "timestamp": ms,
//!   "priority": p}` (all but `tokens` optional).
//!
//! Either format may carry a `"priority"`: the request's eviction priority (an integer in
//! the `i32` range, default 0), which a replay passes to its inserts
//! (radixkv's `InsertOptions::priority`, read by the `priority` eviction policy).
//!
//! Every bad input (unreadable file, malformed JSON, a token id or a length out of range,
//! an `input_length` larger than its blocks) is a [`TraceError`] naming the file and line.
//! Mooncake requests are kept as their hash ids and materialized on demand
//! ([`Trace::get`]), so a loaded trace stays small.

#![deny(unsafe_op_in_unsafe_fn, missing_docs, clippy::undocumented_unsafe_blocks)]

pub mod synthetic;

use serde::Deserialize;
use std::fmt;
use std::str::FromStr;

/// Default Mooncake block size (tokens per hash id).
pub const DEFAULT_BLOCK_SIZE: u32 = 512;

/// Largest accepted `input_length` / `output_length` / token count of one request: 2^28
/// tokens (1 GiB of token ids once materialized), far beyond any model's context, so that a
/// typo in a trace is a clear error rather than an allocation that fails or exhausts memory.
pub const MAX_REQUEST_LEN: u64 = 1 << 28;

/// One request of a trace, materialized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Cache namespace (0 for Mooncake traces).
    pub namespace: u64,
    /// The prompt tokens.
    pub tokens: Vec<u32>,
    /// Tokens the request generates (0 when the trace does not say).
    pub output_length: usize,
    /// Arrival time in milliseconds (0 when the trace does not say).
    pub timestamp_ms: u64,
    /// Eviction priority of the request's inserts (0 when the trace does not say).
    pub priority: i32,
}

/// A bad trace: what went wrong, in which file, on which line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    /// File (or source) name.
    pub file: String,
    /// 1-based line number, when the error belongs to one line.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl TraceError {
    fn at(file: &str, line: usize, message: impl Into<String>) -> Self {
        TraceError { file: file.to_string(), line: Some(line), message: message.into() }
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{}: {}", self.file, l, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for TraceError {}

/// Which format the lines of a trace are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Decide per line: `tokens` present means the tokens format, `hash_ids` Mooncake.
    #[default]
    Auto,
    /// Every line is a Mooncake record.
    Mooncake,
    /// Every line is a tokens record.
    Tokens,
}

impl FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Format::Auto),
            "mooncake" => Ok(Format::Mooncake),
            "tokens" => Ok(Format::Tokens),
            other => {
                Err(format!("unknown trace format '{other}' (expected auto, mooncake or tokens)"))
            }
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Auto => "auto",
            Format::Mooncake => "mooncake",
            Format::Tokens => "tokens",
        })
    }
}

/// How to read a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceOptions {
    /// Line format.
    pub format: Format,
    /// Mooncake block size `B >= 1`.
    pub block_size: u32,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions { format: Format::Auto, block_size: DEFAULT_BLOCK_SIZE }
    }
}

/// One stored request: Mooncake records keep their hash ids, token records their tokens.
#[derive(Debug, Clone)]
enum Entry {
    Blocks {
        hash_ids: Box<[u32]>,
        block_size: u32,
        input_length: usize,
        output_length: usize,
        timestamp_ms: u64,
        priority: i32,
    },
    Tokens(Request),
}

/// A loaded trace: requests in file order.
#[derive(Debug, Clone)]
pub struct Trace {
    name: String,
    entries: Vec<Entry>,
    input_tokens: u64,
    max_token: Option<u32>,
}

/// The fields either format may have; unknown fields are ignored.
#[derive(Deserialize)]
struct RawLine {
    timestamp: Option<serde_json::Number>,
    input_length: Option<u64>,
    output_length: Option<u64>,
    hash_ids: Option<Vec<u64>>,
    /// Kept as JSON numbers, so a negative or fractional id gets an error that says what a
    /// token id is (an integer in [0, 2^32)), not serde's generic one.
    tokens: Option<Vec<serde_json::Number>>,
    namespace: Option<u64>,
    /// A JSON number, so that one out of the `i32` range gets an error naming the range.
    priority: Option<serde_json::Number>,
}

fn priority(n: &Option<serde_json::Number>) -> Result<i32, String> {
    let Some(n) = n else { return Ok(0) };
    n.as_i64()
        .and_then(|v| i32::try_from(v).ok())
        .ok_or_else(|| format!("priority {n} out of range (expected an integer in [-2^31, 2^31))"))
}

fn timestamp_ms(n: &Option<serde_json::Number>) -> Result<u64, String> {
    let Some(n) = n else { return Ok(0) };
    if let Some(v) = n.as_u64() {
        return Ok(v);
    }
    match n.as_f64() {
        Some(v) if v.is_finite() && v >= 0.0 && v < u64::MAX as f64 => Ok(v as u64),
        _ => Err(format!("timestamp {n} out of range (expected a non-negative number of ms)")),
    }
}

fn output_length(v: Option<u64>) -> Result<usize, String> {
    let v = v.unwrap_or(0);
    if v > MAX_REQUEST_LEN {
        return Err(format!("output_length {v} out of range (at most {MAX_REQUEST_LEN})"));
    }
    Ok(v as usize)
}

impl Trace {
    /// Reads and checks a trace file.
    pub fn load(
        path: impl AsRef<std::path::Path>,
        opts: TraceOptions,
    ) -> Result<Trace, TraceError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let text = std::fs::read(path).map_err(|e| TraceError {
            file: name.clone(),
            line: None,
            message: format!("cannot read: {e}"),
        })?;
        Trace::parse_bytes(&name, text, opts)
    }

    /// Reads and checks a trace from `reader` to its end (standard input, a pipe); `name`
    /// is used in errors and as the trace's name.
    pub fn from_reader(
        name: &str,
        mut reader: impl std::io::Read,
        opts: TraceOptions,
    ) -> Result<Trace, TraceError> {
        let mut text = Vec::new();
        reader.read_to_end(&mut text).map_err(|e| TraceError {
            file: name.to_string(),
            line: None,
            message: format!("cannot read: {e}"),
        })?;
        Trace::parse_bytes(name, text, opts)
    }

    /// [`Trace::parse_str`] of bytes that must be UTF-8.
    fn parse_bytes(name: &str, text: Vec<u8>, opts: TraceOptions) -> Result<Trace, TraceError> {
        let text = String::from_utf8(text).map_err(|e| {
            let line = 1 + e.as_bytes()[..e.utf8_error().valid_up_to()]
                .iter()
                .filter(|&&b| b == b'\n')
                .count();
            TraceError::at(name, line, "not valid UTF-8")
        })?;
        Trace::parse_str(name, &text, opts)
    }

    /// Parses trace text; `name` is used in errors.
    pub fn parse_str(name: &str, text: &str, opts: TraceOptions) -> Result<Trace, TraceError> {
        if opts.block_size == 0 {
            return Err(TraceError {
                file: name.to_string(),
                line: None,
                message: "block size must be >= 1".into(),
            });
        }
        let mut trace =
            Trace { name: name.to_string(), entries: Vec::new(), input_tokens: 0, max_token: None };
        // A UTF-8 byte order mark (some editors write one) is not part of the first line.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let entry = parse_line(line, opts).map_err(|m| TraceError::at(name, i + 1, m))?;
            trace.push_entry(entry);
        }
        Ok(trace)
    }

    /// A trace of already materialized requests (the synthetic workload, tests).
    pub fn from_requests(name: impl Into<String>, requests: Vec<Request>) -> Trace {
        let mut trace = Trace {
            name: name.into(),
            entries: Vec::with_capacity(requests.len()),
            input_tokens: 0,
            max_token: None,
        };
        for r in requests {
            trace.push_entry(Entry::Tokens(r));
        }
        trace
    }

    fn push_entry(&mut self, e: Entry) {
        let (len, max) = match &e {
            Entry::Blocks { hash_ids, block_size, input_length, .. } => {
                let used = input_length.div_ceil(*block_size as usize);
                // Checked at parse time: every materialized token fits u32.
                let max = hash_ids[..used].iter().enumerate().map(|(j, &h)| {
                    let last = if j + 1 == used {
                        (input_length - j * *block_size as usize) as u64
                    } else {
                        *block_size as u64
                    };
                    (h as u64 * *block_size as u64 + last - 1) as u32
                });
                (*input_length, max.max())
            }
            Entry::Tokens(r) => (r.tokens.len(), r.tokens.iter().copied().max()),
        };
        self.input_tokens += len as u64;
        self.max_token = self.max_token.max(max);
        self.entries.push(e);
    }

    /// Name of the trace (its path, or `builtin`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the trace has no request.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Total input tokens over all requests.
    pub fn input_tokens(&self) -> u64 {
        self.input_tokens
    }

    /// Largest token id of any request (`None` for an empty trace).
    pub fn max_token(&self) -> Option<u32> {
        self.max_token
    }

    /// Input length of request `i` (without materializing it). Panics if `i >= len()`.
    pub fn input_len(&self, i: usize) -> usize {
        match &self.entries[i] {
            Entry::Blocks { input_length, .. } => *input_length,
            Entry::Tokens(r) => r.tokens.len(),
        }
    }

    /// Request `i`, materialized. Panics if `i >= len()`.
    pub fn get(&self, i: usize) -> Request {
        match &self.entries[i] {
            Entry::Blocks {
                hash_ids,
                block_size,
                input_length,
                output_length,
                timestamp_ms,
                priority,
            } => {
                let b = *block_size;
                let mut tokens = Vec::with_capacity(*input_length);
                for &h in hash_ids.iter() {
                    if tokens.len() >= *input_length {
                        break;
                    }
                    let base = h * b;
                    // take >= 1; the last id is checked at parse time to fit u32.
                    let take = (b as usize).min(input_length - tokens.len()) as u32;
                    tokens.extend(base..=base + (take - 1));
                }
                Request {
                    namespace: 0,
                    tokens,
                    output_length: *output_length,
                    timestamp_ms: *timestamp_ms,
                    priority: *priority,
                }
            }
            Entry::Tokens(r) => r.clone(),
        }
    }

    /// All requests in order, materialized one at a time.
    pub fn iter(&self) -> impl Iterator<Item = Request> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
}

fn parse_line(line: &str, opts: TraceOptions) -> Result<Entry, String> {
    // One JSON object a line: serde would also take an array for the struct's fields in order.
    if !line.starts_with('{') {
        return Err("expected a JSON object ('{...}')".into());
    }
    let raw: RawLine = serde_json::from_str(line).map_err(|e| {
        // serde_json says "at line 1 column C": the line is the trace's, named by the caller.
        let full = e.to_string();
        let msg = full.strip_suffix(&format!(" at line {} column {}", e.line(), e.column()));
        // serde_json reads an integer beyond u64 as a float: say what the field takes.
        let msg = msg.unwrap_or(&full).replace("expected u64", "expected an integer in [0, 2^64)");
        format!("malformed JSON at column {}: {msg}", e.column())
    })?;
    let format = match opts.format {
        Format::Auto => match (raw.tokens.is_some(), raw.hash_ids.is_some()) {
            (true, false) => Format::Tokens,
            (false, true) => Format::Mooncake,
            (true, true) => {
                return Err("both 'tokens' and 'hash_ids': force one with --format".into());
            }
            (false, false) => {
                return Err(
                    "neither 'tokens' nor 'hash_ids': not a tokens or mooncake record".into()
                );
            }
        },
        f => f,
    };
    let timestamp_ms = timestamp_ms(&raw.timestamp)?;
    let output_length = output_length(raw.output_length)?;
    let priority = priority(&raw.priority)?;
    match format {
        Format::Tokens => {
            let Some(toks) = raw.tokens else { return Err("missing 'tokens'".into()) };
            if toks.len() as u64 > MAX_REQUEST_LEN {
                return Err(format!("{} tokens: length out of range", toks.len()));
            }
            let mut tokens = Vec::with_capacity(toks.len());
            for (i, t) in toks.iter().enumerate() {
                let id = t.as_u64().and_then(|v| u32::try_from(v).ok()).ok_or_else(|| {
                    format!(
                        "token id {t} at position {i} out of range: token ids are integers in \
                         [0, 2^32)"
                    )
                })?;
                tokens.push(id);
            }
            Ok(Entry::Tokens(Request {
                namespace: raw.namespace.unwrap_or(0),
                tokens,
                output_length,
                timestamp_ms,
                priority,
            }))
        }
        _ => {
            let Some(ids) = raw.hash_ids else { return Err("missing 'hash_ids'".into()) };
            let Some(input_length) = raw.input_length else {
                return Err("missing 'input_length'".into());
            };
            if input_length > MAX_REQUEST_LEN {
                return Err(format!(
                    "input_length {input_length} out of range (at most {MAX_REQUEST_LEN})"
                ));
            }
            let b = opts.block_size as u64;
            let room = ids.len() as u64 * b;
            if input_length > room {
                return Err(format!(
                    "input_length {input_length} larger than its hash_ids cover ({} blocks of {b} = {room} tokens)",
                    ids.len()
                ));
            }
            let used = input_length.div_ceil(b) as usize;
            let mut hash_ids = Vec::with_capacity(used);
            for (j, &h) in ids[..used].iter().enumerate() {
                let last = if j + 1 == used { input_length - j as u64 * b } else { b };
                let top = (h as u128) * (b as u128) + last as u128 - 1;
                if top > u32::MAX as u128 {
                    return Err(format!(
                        "hash id {h} (block {j}) gives token id {top}, out of range (at most {}) with block size {b}",
                        u32::MAX
                    ));
                }
                hash_ids.push(h as u32);
            }
            Ok(Entry::Blocks {
                hash_ids: hash_ids.into_boxed_slice(),
                block_size: opts.block_size,
                input_length: input_length as usize,
                output_length,
                timestamp_ms,
                priority,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, format: Format, block_size: u32) -> Result<Trace, TraceError> {
        Trace::parse_str("t.jsonl", text, TraceOptions { format, block_size })
    }

    #[test]
    fn mooncake_materializes_blocks_cut_to_length() {
        let t = parse(
            r#"{"timestamp": 7, "input_length": 6, "output_length": 3, "hash_ids": [2, 0, 9]}"#,
            Format::Auto,
            4,
        )
        .unwrap();
        assert_eq!(t.len(), 1);
        let r = t.get(0);
        assert_eq!(r.tokens, vec![8, 9, 10, 11, 0, 1]);
        assert_eq!((r.namespace, r.output_length, r.timestamp_ms), (0, 3, 7));
        assert_eq!(t.input_tokens(), 6);
        assert_eq!(t.max_token(), Some(11));
        assert_eq!(t.input_len(0), 6);
    }

    #[test]
    fn mooncake_default_block_size() {
        let t = parse(
            r#"{"input_length": 513, "hash_ids": [0, 1]}"#,
            Format::Mooncake,
            DEFAULT_BLOCK_SIZE,
        )
        .unwrap();
        let r = t.get(0);
        assert_eq!(r.tokens.len(), 513);
        assert_eq!(r.tokens[511], 511);
        assert_eq!(r.tokens[512], 512);
    }

    #[test]
    fn tokens_format_and_optional_fields() {
        let text = "\n{\"tokens\": [1, 2, 3], \"namespace\": 5, \"output_length\": 2, \"timestamp\": 1.5}\n\n{\"tokens\": []}\n";
        let t = parse(text, Format::Auto, 512).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.get(0),
            Request {
                namespace: 5,
                tokens: vec![1, 2, 3],
                output_length: 2,
                timestamp_ms: 1,
                priority: 0
            }
        );
        assert_eq!(
            t.get(1),
            Request {
                namespace: 0,
                tokens: vec![],
                output_length: 0,
                timestamp_ms: 0,
                priority: 0
            }
        );
        assert_eq!(t.iter().count(), 2);
    }

    #[test]
    fn priorities_are_read_and_checked() {
        let text = concat!(
            r#"{"tokens": [1], "priority": -3}"#,
            "\n",
            r#"{"tokens": [2], "priority": 2147483647}"#,
            "\n",
            r#"{"input_length": 2, "hash_ids": [1], "priority": 9}"#,
            "\n",
            r#"{"tokens": [3]}"#,
        );
        let t = parse(text, Format::Auto, 4).unwrap();
        let p: Vec<i32> = t.iter().map(|r| r.priority).collect();
        assert_eq!(p, vec![-3, i32::MAX, 9, 0]);
        for bad in ["2147483648", "-2147483649", "1.5"] {
            let e = err(&format!("{{\"tokens\": [1], \"priority\": {bad}}}"), Format::Auto, 4);
            assert_eq!(e.line, Some(1));
            assert!(e.message.contains(&format!("priority {bad} out of range")), "{e}");
            assert!(e.message.contains("[-2^31, 2^31)"), "{e}");
        }
    }

    #[test]
    fn auto_detects_per_line() {
        let text = "{\"tokens\": [4294967295]}\n{\"input_length\": 2, \"hash_ids\": [1]}\n";
        let t = parse(text, Format::Auto, 3).unwrap();
        assert_eq!(t.get(0).tokens, vec![u32::MAX]);
        assert_eq!(t.get(1).tokens, vec![3, 4]);
    }

    fn err(text: &str, format: Format, b: u32) -> TraceError {
        parse(text, format, b).unwrap_err()
    }

    #[test]
    fn errors_name_file_and_line() {
        let e = err("{\"tokens\": [1]}\n\n{\"tokens\": [1,\n", Format::Auto, 512);
        assert_eq!((e.file.as_str(), e.line), ("t.jsonl", Some(3)));
        assert!(e.to_string().starts_with("t.jsonl:3: malformed JSON"), "{e}");

        let e = err("{\"tokens\": [1, 4294967296]}", Format::Auto, 512);
        assert_eq!(e.line, Some(1));
        assert!(e.message.contains("token id 4294967296 at position 1 out of range"), "{e}");

        let e = err("{\"tokens\": [-1]}", Format::Auto, 512);
        assert!(
            e.message.contains(
                "token id -1 at position 0 out of range: token ids are integers in [0, 2^32)"
            ),
            "{e}"
        );

        let e = err("{\"input_length\": 9, \"hash_ids\": [1, 2]}", Format::Auto, 4);
        assert!(
            e.message.contains(
                "input_length 9 larger than its hash_ids cover (2 blocks of 4 = 8 tokens)"
            ),
            "{e}"
        );

        let e = err("{\"input_length\": 5000000000, \"hash_ids\": [1]}", Format::Auto, 4);
        assert!(e.message.contains("input_length 5000000000 out of range"), "{e}");

        let e = err("{\"tokens\": [], \"output_length\": 5000000000}", Format::Auto, 4);
        assert!(e.message.contains("output_length 5000000000 out of range"), "{e}");

        let e = err("{\"foo\": 1}", Format::Auto, 4);
        assert!(e.message.contains("neither"), "{e}");

        let e = err("{\"tokens\": [1], \"hash_ids\": [1], \"input_length\": 1}", Format::Auto, 4);
        assert!(e.message.contains("both"), "{e}");
        // Forcing a format resolves it.
        assert_eq!(
            parse("{\"tokens\": [1], \"hash_ids\": [1], \"input_length\": 1}", Format::Mooncake, 4)
                .unwrap()
                .get(0)
                .tokens,
            vec![4]
        );
        assert_eq!(
            parse("{\"tokens\": [1], \"hash_ids\": [1], \"input_length\": 1}", Format::Tokens, 4)
                .unwrap()
                .get(0)
                .tokens,
            vec![1]
        );

        let e = err("{\"tokens\": [1]}", Format::Mooncake, 4);
        assert!(e.message.contains("missing 'hash_ids'"), "{e}");
        let e = err("{\"hash_ids\": [1]}", Format::Mooncake, 4);
        assert!(e.message.contains("missing 'input_length'"), "{e}");
        let e = err("{\"hash_ids\": [1], \"input_length\": 1}", Format::Tokens, 4);
        assert!(e.message.contains("missing 'tokens'"), "{e}");
    }

    #[test]
    fn mooncake_overflow_is_checked_on_materialized_tokens_only() {
        // 2^30 * 4 + 0 = 2^32: out of range.
        let e = err("{\"input_length\": 1, \"hash_ids\": [1073741824]}", Format::Auto, 4);
        assert!(e.message.contains("out of range"), "{e}");
        // (2^30 - 1) * 4 + 3 = u32::MAX: fits exactly.
        let t =
            parse("{\"input_length\": 4, \"hash_ids\": [1073741823]}", Format::Auto, 4).unwrap();
        assert_eq!(*t.get(0).tokens.last().unwrap(), u32::MAX);
        // A huge id beyond input_length is never materialized.
        let t = parse(
            "{\"input_length\": 4, \"hash_ids\": [0, 18446744073709551615]}",
            Format::Auto,
            4,
        )
        .unwrap();
        assert_eq!(t.get(0).tokens, vec![0, 1, 2, 3]);
        // Partial last block: only the used part counts.
        let t =
            parse("{\"input_length\": 1, \"hash_ids\": [1073741824]}", Format::Auto, 3).unwrap();
        assert_eq!(t.get(0).tokens, vec![3221225472]);
    }

    #[test]
    fn block_size_zero_is_an_error() {
        let e = err("", Format::Auto, 0);
        assert_eq!(e.line, None);
    }

    #[test]
    fn unreadable_file() {
        let e =
            Trace::load("/nonexistent/radixkv/trace.jsonl", TraceOptions::default()).unwrap_err();
        assert!(e.to_string().starts_with("/nonexistent/radixkv/trace.jsonl: cannot read"), "{e}");
    }

    #[test]
    fn format_from_str() {
        assert_eq!("Mooncake".parse::<Format>(), Ok(Format::Mooncake));
        assert_eq!("tokens".parse::<Format>(), Ok(Format::Tokens));
        assert_eq!("auto".parse::<Format>(), Ok(Format::Auto));
        assert!("csv".parse::<Format>().is_err());
        assert_eq!(Format::Tokens.to_string(), "tokens");
    }
}
