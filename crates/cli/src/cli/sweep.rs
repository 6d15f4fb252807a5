//! `radixkv sweep`: hit ratio against capacity, as a table, a CSV and an SVG plot.

use super::kv::{KvSize, gib};
use super::report::{Report, short, thousands};
use plotters::prelude::*;
use radixkv_trace::Trace;
use std::fmt::Write as _;
use std::path::Path;

/// Points of the default sweep.
const DEFAULT_POINTS: usize = 12;

/// How far past the distinct tokens the default sweep goes: up to 1.5 x distinct, so the
/// curve shows its plateau (beyond the distinct tokens more capacity cannot help).
pub const DEFAULT_TOP: f64 = 1.5;

/// `DEFAULT_POINTS` capacities, log-spaced from `top / 1000` up to
/// `top = DEFAULT_TOP x distinct`, rounded to two significant digits and down to a page
/// multiple (at least one page). `distinct` is the trace's distinct tokens: what a cache of
/// unlimited capacity holds at the end of the replay.
pub fn default_capacities(distinct: u64, page: u64) -> Vec<u64> {
    let hi = (distinct as f64 * DEFAULT_TOP).max(page as f64);
    let lo = (hi / 1000.0).max(page as f64);
    let mut out: Vec<u64> = (0..DEFAULT_POINTS)
        .map(|i| {
            let f = i as f64 / (DEFAULT_POINTS - 1) as f64;
            let v = lo * (hi / lo).powf(f);
            let mag = 10f64.powi(v.log10().floor() as i32 - 1).max(1.0);
            let v = ((v / mag).round() * mag) as u64;
            (v / page * page).max(page)
        })
        .collect();
    out.dedup();
    out
}

fn cap_cell(r: &Report) -> String {
    r.capacity.map_or("inf".to_string(), |c| c.to_string())
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or(String::new(), |v| v.to_string())
}

/// The CSV: one line per capacity, the unlimited run last (`inf`), for each policy swept in
/// turn (the `policy` column, last). The KV columns are there when a KV size was given
/// (`kv` true).
///
/// With a host tier (`host` true) the host columns come before `policy`: the same capacity
/// replayed with the host tier behind it (`host_capacity`, its device and host hits, the
/// combined hit ratio, the tokens copied each way); empty on the unlimited row.
pub fn csv(reports: &[Report], kv: bool, host: bool) -> String {
    let mut s = String::from(
        "capacity,requests,input_tokens,hit_tokens,hit_ratio,evicted_tokens,skipped_requests,wall_s,tokens_per_s,cached_tokens,index_bytes,index_bytes_per_token",
    );
    if kv {
        s.push_str(",kv_bytes_per_token,capacity_kv_bytes,capacity_kv_gib");
    }
    if host {
        s.push_str(",host_capacity,write_policy,tier_device_hit_tokens,host_hit_tokens,combined_hit_tokens,combined_hit_ratio,tokens_to_host,tokens_to_device,copies_per_request,tier_wall_s");
    }
    s.push_str(",policy\n");
    for r in reports {
        let _ = write!(
            s,
            "{},{},{},{},{:.6},{},{},{:.3},{:.0},{},{},{}",
            cap_cell(r),
            r.requests,
            r.input_tokens,
            r.hit_tokens,
            r.hit_ratio,
            r.evicted_tokens,
            r.skipped_requests,
            r.wall_s,
            r.tokens_per_s,
            r.cached_tokens,
            r.index_bytes,
            opt(r.index_bytes_per_token.map(|b| format!("{b:.3}")))
        );
        if kv {
            let _ = write!(
                s,
                ",{},{},{}",
                opt(r.kv_bytes_per_token),
                opt(r.capacity_kv_bytes),
                opt(r.capacity_kv_gib.map(|g| format!("{g:.6}")))
            );
        }
        if host {
            match r.with_host.as_deref().and_then(|h| h.tier.as_ref().map(|t| (h, t))) {
                Some((h, t)) => {
                    let _ = write!(
                        s,
                        ",{},{},{},{},{},{:.6},{},{},{:.4},{:.3}",
                        t.host_capacity,
                        t.write_policy,
                        t.device_hit_tokens,
                        t.host_hit_tokens,
                        t.combined_hit_tokens,
                        t.combined_hit_ratio,
                        t.tokens_to_host,
                        t.tokens_to_device,
                        t.copies_per_request,
                        h.wall_s
                    );
                }
                None => s.push_str(",,,,,,,,,,"),
            }
        }
        let _ = writeln!(s, ",{}", r.policy);
    }
    s
}

/// The first lines of the table printed on stdout, before any replay finishes.
pub fn table_header(trace: &Trace, kv: Option<&KvSize>, jobs: usize, host: Option<u64>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "radixkv sweep: {} ({} requests, {} input tokens), {jobs} job{}",
        trace.name(),
        thousands(trace.len() as u64),
        thousands(trace.input_tokens()),
        if jobs == 1 { "" } else { "s" }
    );
    if let Some(kv) = kv {
        let model = kv.model.as_ref().map_or(String::new(), |m| format!(" ({m})"));
        let _ = writeln!(s, "  KV size {} bytes per token{model}", thousands(kv.bytes_per_token));
    }
    let gib = if kv.is_some() { format!(" {:>10}", "GiB") } else { String::new() };
    if let Some(h) = host {
        let _ = writeln!(s, "  host tier {} tokens behind each capacity", thousands(h));
    }
    let host_col = if host.is_some() { format!(" {:>12}", "+host ratio") } else { String::new() };
    let _ = writeln!(
        s,
        "  {:>14}{gib} {:>10}{host_col} {:>14} {:>14} {:>8} {:>11} {:>10}",
        "capacity", "hit ratio", "hit tokens", "evicted", "skipped", "index B/tok", "wall s"
    );
    s
}

/// One row of the table (one capacity); `host`: the sweep has a host tier (its column).
pub fn table_row(r: &Report, host: bool) -> String {
    let gib = match (r.kv_bytes_per_token, r.capacity_kv_gib) {
        (None, _) => String::new(),
        (Some(_), Some(g)) => format!(" {g:>10.3}"),
        (Some(_), None) => format!(" {:>10}", "-"),
    };
    let host = match (host, r.with_host.as_ref().and_then(|h| h.tier.as_ref())) {
        (false, _) => String::new(),
        (true, Some(t)) => format!(" {:>12.6}", t.combined_hit_ratio),
        (true, None) => format!(" {:>12}", "-"),
    };
    format!(
        "  {:>14}{gib} {:>10.6}{host} {:>14} {:>14} {:>8} {:>11} {:>10.3}\n",
        r.capacity.map_or("unlimited".to_string(), thousands),
        r.hit_ratio,
        thousands(r.hit_tokens),
        thousands(r.evicted_tokens),
        thousands(r.skipped_requests),
        r.index_bytes_per_token.map_or("-".to_string(), |b| format!("{b:.2}")),
        r.wall_s
    )
}

/// Line colours of the curves, one per policy (matplotlib's first ten).
const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
    RGBColor(127, 127, 127),
    RGBColor(214, 39, 40),
];

/// Draws hit ratio against capacity (log x axis), one curve per policy (`curves`: each
/// policy's points and its unlimited run), with the unlimited ratio as a reference line.
pub fn plot(
    path: &Path,
    name: &str,
    curves: &[(&[Report], &Report)],
) -> Result<(), Box<dyn std::error::Error>> {
    let (_, unlimited) = *curves.first().ok_or("nothing to draw")?;
    let xy: Vec<Vec<(f64, f64)>> = curves
        .iter()
        .map(|(points, _)| {
            points.iter().filter_map(|r| r.capacity.map(|c| (c as f64, r.hit_ratio))).collect()
        })
        .collect();
    let (xmin, xmax) =
        xy.iter().flatten().fold((f64::MAX, f64::MIN), |(a, b), &(x, _)| (a.min(x), b.max(x)));
    let (xmin, xmax) =
        if xy.iter().all(|c| c.is_empty()) { (1.0, 10.0) } else { (xmin / 1.5, xmax * 1.5) };
    // What an unlimited cache ends up holding: beyond it, more capacity cannot help.
    let distinct = unlimited.cached_tokens as f64;
    let bpt = unlimited.kv_bytes_per_token;
    // Tokens -> GiB for the top axis (1:1 without a KV size: that axis is not drawn).
    let gb = |tokens: f64| bpt.map_or(tokens, |b| tokens * b as f64 / (1u64 << 30) as f64);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let title =
        Path::new(name).file_name().map_or(name.to_string(), |f| f.to_string_lossy().into_owned());
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("radixkv: prefix-cache hit ratio vs capacity ({title})"),
            ("sans-serif", 22),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .top_x_label_area_size(if bpt.is_some() { 45 } else { 0 })
        .build_cartesian_2d((xmin..xmax).log_scale(), 0f64..1f64)?
        .set_secondary_coord((gb(xmin)..gb(xmax)).log_scale(), 0f64..1f64);
    chart
        .configure_mesh()
        .x_desc("KV capacity (tokens, log scale)")
        .y_desc("hit ratio (hit tokens / input tokens)")
        .x_label_formatter(&|x| short(*x))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()?;
    if let Some(b) = bpt {
        // The same capacities in GiB along the top.
        chart
            .configure_secondary_axes()
            .x_desc(format!("KV capacity (GiB at {} bytes per token)", thousands(b)))
            .x_label_formatter(&|g| gib_label(*g))
            .draw()?;
    }
    let red = RGBColor(214, 39, 40);
    for (i, ((_, u), pts)) in curves.iter().zip(&xy).enumerate() {
        // Red is the unlimited line's; a seventh policy and beyond reuse the palette.
        let c = COLOURS[i % (COLOURS.len() - 1)];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))?
            .label(format!("hit ratio ({} eviction)", u.policy.to_uppercase()))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
    }
    // With a host tier: each policy's device + host curve, dashed, in its colour.
    for (i, (points, u)) in curves.iter().enumerate() {
        let c = COLOURS[i % (COLOURS.len() - 1)];
        let host: Vec<(f64, f64)> = points
            .iter()
            .filter_map(|r| {
                let t = r.with_host.as_ref()?.tier.as_ref()?;
                Some((r.capacity? as f64, t.combined_hit_ratio))
            })
            .collect();
        let Some(t) = points.iter().find_map(|r| r.with_host.as_ref()?.tier.clone()) else {
            continue;
        };
        chart
            .draw_series(DashedLineSeries::new(host.iter().copied(), 6, 4, c.stroke_width(2)))?
            .label(format!(
                "device + {} host tokens ({}, {} eviction)",
                short(t.host_capacity as f64),
                t.write_policy,
                u.policy.to_uppercase()
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(host.iter().map(|&p| TriangleMarker::new(p, 5, c.filled())))?;
    }
    let u = unlimited.hit_ratio;
    chart
        .draw_series(DashedLineSeries::new(vec![(xmin, u), (xmax, u)], 8, 6, red.stroke_width(2)))?
        .label(format!("unlimited capacity: {u:.4}"))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red.stroke_width(2)));
    if distinct > xmin && distinct < xmax {
        let gray = RGBColor(110, 110, 110);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(distinct, 0.0), (distinct, 1.0)],
                4,
                4,
                gray.stroke_width(1),
            ))?
            .label(match bpt {
                None => format!("distinct tokens of the trace: {}", short(distinct)),
                Some(b) => format!(
                    "distinct tokens of the trace: {} ({:.2} GiB)",
                    short(distinct),
                    gib(unlimited.cached_tokens.saturating_mul(b))
                ),
            })
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], gray.stroke_width(1))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Rasterizes the SVG plot at `svg` into a PNG at `png` (twice its size, for sharp text),
/// with the system's fonts: an error says so when there are none (text would be missing).
pub fn png(svg: &Path, png: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use resvg::{tiny_skia, usvg, usvg::fontdb};
    let data = std::fs::read(svg)?;
    let mut opt = usvg::Options::default();
    opt.fontdb_mut().load_system_fonts();
    if opt.fontdb.is_empty() {
        return Err("no fonts on this system for the PNG's text (install one, e.g. Debian's \
                    fonts-dejavu-core; the SVG needs none)"
            .into());
    }
    // The plot asks for `sans-serif`, which fontdb maps to Arial unless told otherwise: a
    // sans face this system has (DejaVu Sans, Debian's default, when present).
    let sans = {
        let db = &opt.fontdb;
        let family = |f: &fontdb::FaceInfo| f.families.first().map(|(n, _)| n.clone());
        let names: Vec<String> = db.faces().filter_map(family).collect();
        ["DejaVu Sans", "Liberation Sans", "Noto Sans", "FreeSans", "Arial"]
            .iter()
            .map(|n| n.to_string())
            .find(|n| names.contains(n))
            .or_else(|| names.iter().find(|n| n.contains("Sans") && !n.contains("Mono")).cloned())
            .or_else(|| names.first().cloned())
    };
    if let Some(f) = sans {
        opt.fontdb_mut().set_sans_serif_family(f);
    }
    let tree = usvg::Tree::from_data(&data, &opt)?;
    let size = tree.size().to_int_size().scale_by(2.0).ok_or("the plot has no size")?;
    let mut pixmap =
        tiny_skia::Pixmap::new(size.width(), size.height()).ok_or("the plot is too large")?;
    resvg::render(&tree, tiny_skia::Transform::from_scale(2.0, 2.0), &mut pixmap.as_mut());
    pixmap.save_png(png)?;
    Ok(())
}

/// A GiB figure for an axis label: `0.5`, `12`, `1.2k`.
fn gib_label(g: f64) -> String {
    if g >= 1000.0 {
        short(g)
    } else if g >= 10.0 {
        format!("{g:.0}")
    } else if g >= 0.1 {
        let s = format!("{g:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{g:.1e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_capacities_are_log_spaced_page_multiples() {
        // Distinct tokens 40M: the top is 60M (1.5x), the bottom 60k.
        let caps = default_capacities(40_000_000, 16);
        assert_eq!(caps.len(), DEFAULT_POINTS);
        assert!(caps.windows(2).all(|w| w[0] < w[1]));
        assert!(caps.iter().all(|c| c % 16 == 0));
        assert_eq!(caps[0], 60_000 / 16 * 16);
        assert_eq!(*caps.last().unwrap(), 60_000_000);
        let caps1 = default_capacities(40_000_000, 1);
        assert_eq!((caps1[0], caps1[1]), (60_000, 110_000));
        // Ratios between neighbours are about equal (log spacing).
        let r: Vec<f64> = caps.windows(2).map(|w| w[1] as f64 / w[0] as f64).collect();
        assert!(r.iter().all(|x| (1.6..2.2).contains(x)), "{r:?}");
        // Tiny traces still give at least one page.
        assert_eq!(default_capacities(2, 4), vec![4]);
        // The top is about 1.5x the distinct tokens (two significant digits).
        for d in [400u64, 12_345, 21_000_001, 987_654_321] {
            let top = *default_capacities(d, 1).last().unwrap() as f64;
            assert!((top / d as f64 - 1.5).abs() < 0.05, "{d}: {top}");
        }
    }

    #[test]
    fn gib_labels() {
        assert_eq!(gib_label(0.5), "0.5");
        assert_eq!(gib_label(12.4), "12");
        assert_eq!(gib_label(1500.0), "1.5k");
        assert_eq!(gib_label(0.01), "1.0e-2");
    }
}
