//! `radixkv sweep`: hit ratio against capacity, as a table, a CSV and an SVG plot.

use super::report::{Report, short, thousands};
use plotters::prelude::*;
use radixkv::trace::Trace;
use std::fmt::Write as _;
use std::path::Path;

/// Points of the default sweep.
const DEFAULT_POINTS: usize = 12;

/// `DEFAULT_POINTS` capacities, log-spaced from `total / 1000` up to `total`, rounded to two
/// significant digits and down to a page multiple (at least one page).
pub fn default_capacities(total: u64, page: u64) -> Vec<u64> {
    let hi = (total as f64).max(page as f64);
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

/// The CSV: one line per capacity, the unlimited run last (`inf`).
pub fn csv(reports: &[Report]) -> String {
    let mut s = String::from(
        "capacity,requests,input_tokens,hit_tokens,hit_ratio,evicted_tokens,skipped_requests,wall_s,tokens_per_s\n",
    );
    for r in reports {
        let _ = writeln!(
            s,
            "{},{},{},{},{:.6},{},{},{:.3},{:.0}",
            cap_cell(r),
            r.requests,
            r.input_tokens,
            r.hit_tokens,
            r.hit_ratio,
            r.evicted_tokens,
            r.skipped_requests,
            r.wall_s,
            r.tokens_per_s
        );
    }
    s
}

/// The table printed on stdout.
pub fn table(trace: &Trace, reports: &[Report]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "radixkv sweep: {} ({} requests, {} input tokens)",
        trace.name(),
        thousands(trace.len() as u64),
        thousands(trace.input_tokens())
    );
    let _ = writeln!(
        s,
        "  {:>14} {:>10} {:>14} {:>14} {:>8} {:>10}",
        "capacity", "hit ratio", "hit tokens", "evicted", "skipped", "wall s"
    );
    for r in reports {
        let _ = writeln!(
            s,
            "  {:>14} {:>10.6} {:>14} {:>14} {:>8} {:>10.3}",
            r.capacity.map_or("unlimited".to_string(), thousands),
            r.hit_ratio,
            thousands(r.hit_tokens),
            thousands(r.evicted_tokens),
            thousands(r.skipped_requests),
            r.wall_s
        );
    }
    s
}

/// Draws hit ratio against capacity (log x axis) with the unlimited ratio as a reference line.
pub fn plot(
    path: &Path,
    name: &str,
    points: &[Report],
    unlimited: &Report,
) -> Result<(), Box<dyn std::error::Error>> {
    let xy: Vec<(f64, f64)> =
        points.iter().filter_map(|r| r.capacity.map(|c| (c as f64, r.hit_ratio))).collect();
    let (xmin, xmax) = xy.iter().fold((f64::MAX, f64::MIN), |(a, b), &(x, _)| (a.min(x), b.max(x)));
    let (xmin, xmax) = if xy.is_empty() { (1.0, 10.0) } else { (xmin / 1.5, xmax * 1.5) };
    // What an unlimited cache ends up holding: beyond it, more capacity cannot help.
    let distinct = unlimited.cached_tokens as f64;
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
        .build_cartesian_2d((xmin..xmax).log_scale(), 0f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc("KV capacity (tokens, log scale)")
        .y_desc("hit ratio (hit tokens / input tokens)")
        .x_label_formatter(&|x| short(*x))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()?;
    let blue = RGBColor(31, 119, 180);
    let red = RGBColor(214, 39, 40);
    chart
        .draw_series(LineSeries::new(xy.iter().copied(), blue.stroke_width(2)))?
        .label(format!("hit ratio ({} eviction)", unlimited.policy.to_uppercase()))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], blue.stroke_width(2)));
    chart.draw_series(xy.iter().map(|&p| Circle::new(p, 4, blue.filled())))?;
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
            .label(format!("distinct tokens of the trace: {}", short(distinct)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_capacities_are_log_spaced_page_multiples() {
        let caps = default_capacities(61_194_628, 16);
        assert_eq!(caps.len(), DEFAULT_POINTS);
        assert!(caps.windows(2).all(|w| w[0] < w[1]));
        assert!(caps.iter().all(|c| c % 16 == 0));
        assert_eq!(caps[0], 61_000 / 16 * 16);
        assert_eq!(*caps.last().unwrap(), 61_000_000);
        let caps1 = default_capacities(61_194_628, 1);
        assert_eq!((caps1[0], caps1[1]), (61_000, 110_000));
        // Ratios between neighbours are about equal (log spacing).
        let r: Vec<f64> = caps.windows(2).map(|w| w[1] as f64 / w[0] as f64).collect();
        assert!(r.iter().all(|x| (1.6..2.2).contains(x)), "{r:?}");
        // Tiny traces still give at least one page.
        assert_eq!(default_capacities(3, 4), vec![4]);
    }
}
