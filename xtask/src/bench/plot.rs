//! `target/bench/latency_bandwidth.png`: latency and bandwidth against message size (log axes),
//! C and Rust on the same axes, and Rust/C per tool with the targets.
//!
//! Text is drawn with a TrueType font read at run time (DejaVu Sans from Debian's
//! `fonts-dejavu-core`) and registered with plotters' `ab_glyph` backend: no fontconfig.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::analysis::{Analysis, Cell, Side};
use super::plan::{Impl, TOOLS};
use super::report;

/// Fonts tried in order (Debian's fonts-dejavu-core, then other common places).
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

pub(crate) const FAMILY: &str = "sans-serif";

/// Limits of the ratio axis; ratios beyond are marked on the edge.
const RATIO_MIN: f64 = 0.5;
const RATIO_MAX: f64 = 2.0;

/// Okabe–Ito colours (distinguishable with colour-blindness), by position in the tool table.
pub(crate) const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(120, 120, 120),
];

fn colour(cell: &Cell) -> RGBColor {
    let i = TOOLS
        .iter()
        .position(|t| t.key == cell.tool.key)
        .unwrap_or(0);
    PALETTE[i % PALETTE.len()]
}

static FONT_ONCE: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();

/// Registers the TTF as plotters' "sans-serif" (once per process).
pub(crate) fn register_font() -> Result<()> {
    FONT_ONCE
        .get_or_init(|| {
            let path = FONTS
                .iter()
                .find(|p| Path::new(p).is_file())
                .ok_or_else(|| {
                    format!(
                    "no TrueType font found (looked for {}); install Debian's fonts-dejavu-core",
                    FONTS.join(", ")
                )
                })?;
            let bytes = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            for style in [FontStyle::Normal, FontStyle::Bold] {
                plotters::style::register_font(FAMILY, style, bytes)
                    .map_err(|_| format!("{path} is not a usable TrueType font"))?;
            }
            Ok(())
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// One line of a panel: a tool's implementation, (size, median, min, max) per size.
struct Line {
    label: String,
    colour: RGBColor,
    imp: Impl,
    points: Vec<(f64, f64, f64, f64)>,
}

fn line(cells: &[&Cell], imp: Impl) -> Option<Line> {
    let first = cells.first()?;
    let points: Vec<(f64, f64, f64, f64)> = cells
        .iter()
        .filter_map(|c| {
            let side: &Side = match imp {
                Impl::C => &c.c,
                Impl::Rust => &c.rust,
            };
            side.summary
                .map(|s| (c.size as f64, s.median, s.min, s.max))
        })
        .collect();
    if points.is_empty() {
        return None;
    }
    Some(Line {
        label: format!("{} {}", first.tool.label, imp.name()),
        colour: colour(first),
        imp,
        points,
    })
}

/// Cells grouped by tool, in table order, filtered by metric kind.
fn by_tool(a: &Analysis, latency: bool) -> Vec<Vec<&Cell>> {
    let mut groups: Vec<Vec<&Cell>> = Vec::new();
    for c in a
        .cells
        .iter()
        .filter(|c| c.tool.metric.is_latency() == latency)
    {
        match groups.last_mut() {
            Some(g) if g[0].tool.key == c.tool.key => g.push(c),
            _ => groups.push(vec![c]),
        }
    }
    groups
}

fn size_label(x: &f64) -> String {
    report::size(x.round() as u64)
        .replace(" KiB", "K")
        .replace(" B", "")
}

/// Axis tick: `100`, `2.5`, `0.01` (no trailing zeros).
fn tick(v: &f64) -> String {
    let s = if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn x_range(a: &Analysis) -> (f64, f64) {
    let lo = a.cells.iter().map(|c| c.size).min().unwrap_or(1) as f64;
    let hi = a.cells.iter().map(|c| c.size).max().unwrap_or(65536) as f64;
    (lo / 1.6, hi * 1.6)
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn value_panel(area: &Area, a: &Analysis, latency: bool) -> Result<()> {
    let (title, ylabel) = if latency {
        (
            "Latency (lower is better)",
            "µs (t_typical; pingpong: µs/iter)",
        )
    } else {
        ("Bandwidth (higher is better)", "MB/s (BW average)")
    };
    let lines: Vec<Line> = by_tool(a, latency)
        .iter()
        .flat_map(|g| [line(g, Impl::C), line(g, Impl::Rust)])
        .flatten()
        .collect();
    if lines.is_empty() {
        area.titled(title, (FAMILY, 24))?
            .draw(&Text::new("no data", (40, 40), (FAMILY, 20)))?;
        return Ok(());
    }
    let (x0, x1) = x_range(a);
    let ys = lines
        .iter()
        .flat_map(|l| l.points.iter().flat_map(|p| [p.2, p.3]));
    let (y0, y1) = ys.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (y0, y1) = ((y0 / 1.5).max(1e-6), y1 * 1.5);
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FAMILY, 24))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d((x0..x1).log_scale().base(4.0), (y0..y1).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc(ylabel)
        .x_labels(12)
        .y_labels(12)
        .x_label_formatter(&size_label)
        .y_label_formatter(&tick)
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 16))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    for l in &lines {
        // C just left of the size, Rust just right, so the whiskers do not hide each other
        let shift = if l.imp == Impl::C { 1.0 / 1.06 } else { 1.06 };
        let pts: Vec<(f64, f64)> = l.points.iter().map(|p| (p.0 * shift, p.1)).collect();
        let style = l.colour.stroke_width(2);
        match l.imp {
            Impl::C => {
                let c = l.colour;
                let label = l.label.trim_end_matches(" C").to_string();
                chart
                    .draw_series(LineSeries::new(pts.clone(), style))?
                    .label(label)
                    .legend(move |(x, y)| {
                        EmptyElement::at((0, 0))
                            + PathElement::new(vec![(x, y), (x + 19, y)], c.stroke_width(2))
                            + Circle::new((x + 9, y), 4, c.filled())
                    });
            }
            Impl::Rust => {
                chart.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style))?;
            }
        }
        let filled = l.imp == Impl::C;
        chart.draw_series(l.points.iter().map(|p| {
            let x = p.0 * shift;
            PathElement::new(vec![(x, p.2), (x, p.3)], l.colour.stroke_width(1))
        }))?;
        chart.draw_series(pts.iter().map(|&(x, y)| {
            Circle::new(
                (x, y),
                4,
                if filled {
                    l.colour.filled()
                } else {
                    l.colour.stroke_width(2)
                },
            )
        }))?;
    }
    chart
        .configure_series_labels()
        .position(if latency {
            SeriesLabelPosition::UpperLeft
        } else {
            SeriesLabelPosition::LowerRight
        })
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .label_font((FAMILY, 14))
        .draw()?;
    Ok(())
}

fn ratio_panel(area: &Area, a: &Analysis) -> Result<()> {
    let title = "Rust / C of the medians: latency should stay ≤ 1.03, bandwidth ≥ 0.97 \
                 (▲ on the edge: off the scale, value shown)";
    let groups: Vec<Vec<&Cell>> = by_tool(a, true)
        .into_iter()
        .chain(by_tool(a, false))
        .collect();
    let ratios: Vec<f64> = a.cells.iter().filter_map(Cell::ratio).collect();
    if ratios.is_empty() {
        area.titled(title, (FAMILY, 22))?.draw(&Text::new(
            "no ratios (one side has no data)",
            (40, 40),
            (FAMILY, 20),
        ))?;
        return Ok(());
    }
    // 0.9–1.1 at least, so the targets are apart; at most 0.5–2, so one far-off ratio does not
    // squash the rest: points beyond are drawn on the edge as triangles, labelled with their value
    let lo = (ratios.iter().copied().fold(0.9f64, f64::min) - 0.03).max(RATIO_MIN);
    let hi = (ratios.iter().copied().fold(1.1f64, f64::max) + 0.03).min(RATIO_MAX);
    let clamp = |r: f64| r.clamp(lo, hi);
    let (x0, x1) = x_range(a);
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FAMILY, 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d((x0..x1).log_scale().base(4.0), lo..hi)?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("Rust / C")
        .x_labels(12)
        .y_labels(10)
        .x_label_formatter(&size_label)
        .y_label_formatter(&|v| format!("{v:.2}"))
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 16))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    let refs = [
        (1.0, RGBColor(90, 90, 90), "1.00 (parity)"),
        (1.03, RGBColor(200, 0, 0), "1.03 latency limit"),
        (0.97, RGBColor(0, 0, 200), "0.97 bandwidth limit"),
    ];
    for (y, c, label) in refs {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x0, y), (x1, y)],
                6,
                6,
                c.stroke_width(1),
            ))?
            .label(label)
            .legend(move |(x, yy)| PathElement::new(vec![(x, yy), (x + 19, yy)], c));
    }
    let mut offscale: std::collections::HashMap<(u64, bool), usize> = Default::default();
    for g in groups {
        let raw: Vec<(f64, f64)> = g
            .iter()
            .filter_map(|c| c.ratio().map(|r| (c.size as f64, r)))
            .collect();
        if raw.is_empty() {
            continue;
        }
        let pts: Vec<(f64, f64)> = raw.iter().map(|&(x, r)| (x, clamp(r))).collect();
        let c = colour(g[0]);
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            .label(g[0].tool.label)
            .legend(move |(x, y)| {
                EmptyElement::at((0, 0))
                    + PathElement::new(vec![(x, y), (x + 19, y)], c.stroke_width(2))
                    + Circle::new((x + 9, y), 4, c.filled())
            });
        for (&(x, r), &p) in raw.iter().zip(&pts) {
            if r == p.1 {
                chart.draw_series(std::iter::once(Circle::new(p, 4, c.filled())))?;
            } else {
                let up = r > p.1;
                // several off-scale labels at one size are stacked, not drawn over each other
                let k = offscale.entry((x as u64, up)).or_insert(0usize);
                let dy = if up {
                    4 + 16 * *k as i32
                } else {
                    -20 - 16 * *k as i32
                };
                *k += 1;
                chart.draw_series(std::iter::once(TriangleMarker::new(p, 7, c.filled())))?;
                chart.draw_series(std::iter::once(
                    EmptyElement::at(p)
                        + Text::new(
                            format!("{r:.2}{}", if up { " ↑" } else { " ↓" }),
                            (10, dy),
                            (FAMILY, 14).into_font().color(&c),
                        ),
                ))?;
            }
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .label_font((FAMILY, 14))
        .draw()?;
    Ok(())
}

/// Draws the figure into `path`.
pub fn draw(a: &Analysis, subtitle: &str, path: &Path) -> Result<()> {
    if a.cells.is_empty() {
        bail!("nothing to plot");
    }
    register_font()?;
    let root = BitMapBackend::new(path, (1600, 1200)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "rc_pingpong & perftest-style tools: Rust (dashed, hollow) vs rdma-core C (solid, filled)",
        (FAMILY, 26),
    )?;
    let (body, foot) = root.split_vertically(1200 - 40 - 30);
    foot.draw(&Text::new(subtitle.to_string(), (16, 4), (FAMILY, 15)))?;
    let (top, bottom) = body.split_vertically(680);
    let (left, right) = top.split_horizontally(800);
    value_panel(&left, a, true)?;
    value_panel(&right, a, false)?;
    ratio_panel(&bottom, a)?;
    root.present()
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
