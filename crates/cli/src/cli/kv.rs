//! KV sizes: the bytes one token's KV takes (given, or from a model shape), capacities in
//! tokens or in bytes, and byte counts for people.

use clap::{Args, ValueEnum};

/// Most bytes per token accepted (1 GiB; a real model takes well under 1 MiB per token).
pub const MAX_BYTES_PER_TOKEN: u64 = 1 << 30;

/// Bytes of one element of the KV cache.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// bfloat16, 2 bytes.
    Bf16,
    /// IEEE half, 2 bytes.
    Fp16,
    /// An 8-bit float (e4m3, e5m2), 1 byte.
    Fp8,
    /// IEEE single, 4 bytes.
    Fp32,
}

impl Dtype {
    fn size(self) -> u64 {
        match self {
            Dtype::Bf16 | Dtype::Fp16 => 2,
            Dtype::Fp8 => 1,
            Dtype::Fp32 => 4,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
            Dtype::Fp8 => "fp8",
            Dtype::Fp32 => "fp32",
        }
    }
}

/// How many bytes of KV one cached token takes: `--kv-bytes-per-token`, or a model shape.
#[derive(Args, Debug, Clone, Default)]
pub struct KvArgs {
    /// KV bytes one token takes, K and V over all layers (131072, 128KiB); or give the
    /// model shape (--layers, --kv-heads, --head-dim, --dtype).
    ///
    /// With a KV size, the report, the sweep's table, CSV and plot show bytes and GiB
    /// beside tokens, and capacities may be given in bytes (--capacity 40GiB: rounded
    /// down to whole tokens). Binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB)
    /// units are understood, in any case.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes_per_token, allow_hyphen_values = true,
          conflicts_with_all = ["layers", "kv_heads", "head_dim", "dtype"], help_heading = "KV size")]
    pub kv_bytes_per_token: Option<u64>,
    /// Model layers: with --kv-heads and --head-dim, bytes per token =
    /// 2 (K and V) x layers x kv-heads x head-dim x the size of --dtype.
    #[arg(long, value_name = "L", value_parser = shape_dim, allow_hyphen_values = true,
          requires_all = ["kv_heads", "head_dim"], help_heading = "KV size")]
    pub layers: Option<u64>,
    /// KV heads per layer (with grouped-query attention, the KV heads, not the query heads).
    #[arg(long, value_name = "H", value_parser = shape_dim, allow_hyphen_values = true,
          requires_all = ["layers", "head_dim"], help_heading = "KV size")]
    pub kv_heads: Option<u64>,
    /// Dimension of one head.
    #[arg(long, value_name = "D", value_parser = shape_dim, allow_hyphen_values = true,
          requires_all = ["layers", "kv_heads"], help_heading = "KV size")]
    pub head_dim: Option<u64>,
    /// KV element type of the model shape: bf16 or fp16 (2 bytes), fp8 (1), fp32 (4)
    /// [default: bf16].
    #[arg(long, value_enum, requires_all = ["layers", "kv_heads", "head_dim"], help_heading = "KV size")]
    pub dtype: Option<Dtype>,
}

/// A known KV size per token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvSize {
    /// Bytes per token.
    pub bytes_per_token: u64,
    /// The model shape it came from (`None`: given as --kv-bytes-per-token).
    pub model: Option<String>,
}

impl KvArgs {
    /// The KV size the flags give, `None` without any.
    pub fn kv_size(&self) -> Result<Option<KvSize>, String> {
        if let Some(b) = self.kv_bytes_per_token {
            return Ok(Some(KvSize { bytes_per_token: b, model: None }));
        }
        let (Some(l), Some(h), Some(d)) = (self.layers, self.kv_heads, self.head_dim) else {
            if self.layers.is_some() || self.kv_heads.is_some() || self.head_dim.is_some() {
                // clap enforces this; kept for callers that build KvArgs by hand.
                return Err("--layers, --kv-heads and --head-dim go together".into());
            }
            return Ok(None);
        };
        let dt = self.dtype.unwrap_or(Dtype::Bf16);
        let model = format!("{l} layers x {h} KV heads x head dim {d} x {}", dt.name());
        let b = [l, h, d, dt.size()].iter().try_fold(2u64, |acc, &x| acc.checked_mul(x));
        match b {
            Some(b) if b <= MAX_BYTES_PER_TOKEN => {
                Ok(Some(KvSize { bytes_per_token: b, model: Some(model) }))
            }
            _ => Err(format!(
                "the model shape ({model}) gives more than {} bytes per token (2 x layers x kv-heads x head-dim x dtype size); check the numbers",
                bytes_label(MAX_BYTES_PER_TOKEN)
            )),
        }
    }
}

fn shape_dim(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(v) if v > 1 << 20 => Err(format!("'{s}' is implausibly large (at most 1048576)")),
        Ok(v) => Ok(v),
        Err(_) => Err(format!("'{s}' is not a positive integer")),
    }
}

fn parse_bytes_per_token(s: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "'{s}' is not a byte count per token (a positive integer such as 131072, or 128KiB)"
        )
    };
    let b = match byte_count(s) {
        Some(Ok(b)) => b,
        Some(Err(e)) => return Err(e),
        None => {
            let t = s.trim();
            if t.is_empty() || !t.bytes().all(|c| c.is_ascii_digit()) {
                return Err(bad());
            }
            t.parse::<u64>().map_err(|_| bad())?
        }
    };
    if b == 0 {
        return Err("must be at least 1 byte per token".into());
    }
    if b > MAX_BYTES_PER_TOKEN {
        return Err(format!(
            "'{s}' is more than {} per token; a real model takes well under 1 MiB",
            bytes_label(MAX_BYTES_PER_TOKEN)
        ));
    }
    Ok(b)
}

/// Byte units, longest suffix first.
const BYTE_UNITS: [(&str, f64); 9] = [
    ("kib", 1024.0),
    ("mib", 1048576.0),
    ("gib", 1073741824.0),
    ("tib", 1099511627776.0),
    ("kb", 1e3),
    ("mb", 1e6),
    ("gb", 1e9),
    ("tb", 1e12),
    ("b", 1.0),
];

/// `Some` when `s` ends in a byte unit (`B`, `KB`..`TB`, `KiB`..`TiB`, any case): the whole
/// number of bytes (rounded down), or why it is not one. `None`: no byte unit.
fn byte_count(s: &str) -> Option<Result<u64, String>> {
    let t = s.trim().to_ascii_lowercase();
    let (unit, mult) = BYTE_UNITS.iter().find(|(u, _)| t.ends_with(u))?;
    let num = t[..t.len() - unit.len()].trim();
    let bad = || {
        format!("'{s}' is not a byte count (a number with B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)")
    };
    let Ok(v) = num.parse::<f64>() else { return Some(Err(bad())) };
    let v = v * mult;
    if !v.is_finite() || v < 1.0 {
        return Some(Err(format!("'{s}' must be at least 1 byte")));
    }
    if v >= u64::MAX as f64 {
        return Some(Err(format!("'{s}' is too many bytes")));
    }
    Some(Ok(v.floor() as u64))
}

/// A capacity as given: tokens, bytes (converted once the KV size is known), or unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capacity {
    /// `inf`.
    Unlimited,
    /// A token count.
    Tokens(u64),
    /// A byte count (`40GiB`).
    Bytes(u64),
}

/// Most tokens a capacity may hold (slot ids are u32).
const MAX_CAPACITY_TOKENS: u64 = 1 << 32;

/// `2000000`, `2e6`, `2.5M`, `100k` (tokens), `40GiB`, `500MB` (bytes), `inf`.
pub fn parse_capacity(s: &str) -> Result<Capacity, String> {
    let t = s.trim().to_ascii_lowercase();
    if matches!(t.as_str(), "inf" | "infinite" | "unlimited" | "none") {
        return Ok(Capacity::Unlimited);
    }
    if let Some(b) = byte_count(s) {
        return b.map(Capacity::Bytes);
    }
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1e3),
        Some('m') => (&t[..t.len() - 1], 1e6),
        Some('g') => (&t[..t.len() - 1], 1e9),
        _ => (t.as_str(), 1.0),
    };
    let bad = || {
        format!(
            "'{s}' is not a capacity (a token count such as 2000000, 2e6 or 2M, a size such as 40GiB, or inf)"
        )
    };
    let v = if mult == 1.0 && num.bytes().all(|b| b.is_ascii_digit()) && !num.is_empty() {
        num.parse::<u64>().map_err(|_| bad())? as f64
    } else {
        num.parse::<f64>().map_err(|_| bad())? * mult
    };
    if !v.is_finite() || v.fract() != 0.0 {
        return Err(bad());
    }
    if v < 1.0 {
        return Err(format!("capacity '{s}' must be at least 1 token"));
    }
    if v > MAX_CAPACITY_TOKENS as f64 {
        return Err(format!("capacity '{s}' exceeds 2^32 slots (slot ids are u32)"));
    }
    Ok(Capacity::Tokens(v as u64))
}

impl Capacity {
    /// Tokens (`None`: unlimited); a byte count is converted with `kv` (rounded down to
    /// whole tokens), an error without it.
    pub fn tokens(self, kv: Option<&KvSize>) -> Result<Option<u64>, String> {
        match self {
            Capacity::Unlimited => Ok(None),
            Capacity::Tokens(t) => Ok(Some(t)),
            Capacity::Bytes(b) => {
                let Some(kv) = kv else {
                    return Err(format!(
                        "capacity {} is in bytes: converting it to tokens needs --kv-bytes-per-token or the model shape (--layers, --kv-heads, --head-dim, --dtype)",
                        bytes_label(b)
                    ));
                };
                let t = b / kv.bytes_per_token;
                if t == 0 {
                    return Err(format!(
                        "capacity {} holds less than one token ({} bytes per token)",
                        bytes_label(b),
                        kv.bytes_per_token
                    ));
                }
                if t > MAX_CAPACITY_TOKENS {
                    return Err(format!(
                        "capacity {} is {t} tokens at {} bytes per token, beyond 2^32 slots (slot ids are u32)",
                        bytes_label(b),
                        kv.bytes_per_token
                    ));
                }
                Ok(Some(t))
            }
        }
    }
}

/// Bytes in GiB (2^30).
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// `512 B`, `1.5 KiB`, `7.63 GiB`: binary units, at most two decimals.
pub fn bytes_label(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        return format!("{b} B");
    }
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s} {}", UNITS[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_parse() {
        assert_eq!(parse_capacity("2000000"), Ok(Capacity::Tokens(2_000_000)));
        assert_eq!(parse_capacity("2e6"), Ok(Capacity::Tokens(2_000_000)));
        assert_eq!(parse_capacity("2.5M"), Ok(Capacity::Tokens(2_500_000)));
        assert_eq!(parse_capacity("100k"), Ok(Capacity::Tokens(100_000)));
        assert_eq!(parse_capacity("1e5"), Ok(Capacity::Tokens(100_000)));
        assert_eq!(parse_capacity("inf"), Ok(Capacity::Unlimited));
        assert_eq!(parse_capacity("Unlimited"), Ok(Capacity::Unlimited));
        assert!(parse_capacity("0").is_err());
        assert!(parse_capacity("1.5").is_err());
        assert!(parse_capacity("-5").is_err());
        assert!(parse_capacity("abc").is_err());
        assert!(parse_capacity("").is_err());
        assert!(parse_capacity("1e30").is_err());
        assert!(parse_capacity("nan").is_err());
        assert_eq!(parse_capacity("4294967296"), Ok(Capacity::Tokens(1 << 32)));
        assert!(parse_capacity("4294967297").is_err());
        // Bytes.
        assert_eq!(parse_capacity("40GiB"), Ok(Capacity::Bytes(40 << 30)));
        assert_eq!(parse_capacity("1.5 gib"), Ok(Capacity::Bytes(3 << 29)));
        assert_eq!(parse_capacity("500MB"), Ok(Capacity::Bytes(500_000_000)));
        assert_eq!(parse_capacity("4096b"), Ok(Capacity::Bytes(4096)));
        assert_eq!(parse_capacity("2KiB"), Ok(Capacity::Bytes(2048)));
        assert!(parse_capacity("0GiB").is_err());
        assert!(parse_capacity("xGiB").is_err());
        assert!(parse_capacity("-1GiB").is_err());
    }

    #[test]
    fn bytes_become_tokens() {
        let kv = KvSize { bytes_per_token: 131_072, model: None };
        assert_eq!(Capacity::Bytes(40 << 30).tokens(Some(&kv)), Ok(Some(327_680)));
        assert_eq!(Capacity::Bytes(131_071 + 131_072).tokens(Some(&kv)), Ok(Some(1)));
        assert!(Capacity::Bytes(1000).tokens(Some(&kv)).unwrap_err().contains("less than one"));
        assert!(Capacity::Bytes(1 << 30).tokens(None).unwrap_err().contains("in bytes"));
        assert_eq!(Capacity::Tokens(7).tokens(None), Ok(Some(7)));
        assert_eq!(Capacity::Unlimited.tokens(Some(&kv)), Ok(None));
        let one = KvSize { bytes_per_token: 1, model: None };
        assert!(Capacity::Bytes(1 << 40).tokens(Some(&one)).unwrap_err().contains("2^32"));
    }

    #[test]
    fn model_shapes() {
        let a = KvArgs {
            layers: Some(32),
            kv_heads: Some(8),
            head_dim: Some(128),
            ..KvArgs::default()
        };
        let kv = a.kv_size().unwrap().unwrap();
        assert_eq!(kv.bytes_per_token, 131_072);
        assert_eq!(kv.model.as_deref(), Some("32 layers x 8 KV heads x head dim 128 x bf16"));
        let b = KvArgs { dtype: Some(Dtype::Fp8), ..a.clone() };
        assert_eq!(b.kv_size().unwrap().unwrap().bytes_per_token, 65_536);
        let c = KvArgs { dtype: Some(Dtype::Fp32), ..a.clone() };
        assert_eq!(c.kv_size().unwrap().unwrap().bytes_per_token, 262_144);
        let huge = KvArgs { layers: Some(1 << 20), kv_heads: Some(1 << 20), ..a.clone() };
        assert!(huge.kv_size().is_err());
        assert_eq!(KvArgs::default().kv_size(), Ok(None));
        assert!(KvArgs { layers: Some(2), ..KvArgs::default() }.kv_size().is_err());
        assert_eq!(parse_bytes_per_token("131072"), Ok(131_072));
        assert_eq!(parse_bytes_per_token("128KiB"), Ok(131_072));
        assert!(parse_bytes_per_token("0").is_err());
        assert!(parse_bytes_per_token("-1").is_err());
        assert!(parse_bytes_per_token("1.5").is_err());
        assert!(parse_bytes_per_token("2GiB").is_err());
        assert!(shape_dim("0").is_err() && shape_dim("x").is_err() && shape_dim("-3").is_err());
    }

    #[test]
    fn byte_labels() {
        assert_eq!(bytes_label(512), "512 B");
        assert_eq!(bytes_label(1536), "1.5 KiB");
        assert_eq!(bytes_label(40 << 30), "40 GiB");
        assert_eq!(bytes_label(8_193_000_000), "7.63 GiB");
        assert_eq!(gib(3 << 29), 1.5);
    }
}
