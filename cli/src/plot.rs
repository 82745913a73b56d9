//! PNG charts: the building blocks (a titled canvas with the embedded font, a bar panel, a
//! panel of lines over time) and the charts made of them: `ladle bench fanout --plot` here,
//! `ladle report`'s in [`recorded`].

use std::path::Path;

use anyhow::{Context, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::fanout::{FanoutReport, Mode, ModeResult};

pub(crate) mod recorded;

/// The drawing area of a PNG being drawn.
pub(crate) type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// Shared (ladle) in charts.
pub(crate) const SHARED: RGBColor = RGBColor(38, 110, 190);
/// Private pipelines (independent) in charts.
pub(crate) const PRIVATE: RGBColor = RGBColor(200, 120, 40);

/// The colours of lines, in order (a colour-blind-safe palette).
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(213, 94, 0),
    RGBColor(120, 120, 120),
    RGBColor(240, 228, 66),
];

/// The `i`th line colour.
pub(crate) fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// A plotters error, which borrows the backend, as an owned one.
pub(crate) fn drawing<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing: {e}")
}

/// A white `size` canvas at `path` under `title`. The font is embedded: the chart renders on
/// machines without system fonts.
pub(crate) fn canvas<'a>(
    path: &'a Path,
    size: (u32, u32),
    title: &str,
) -> anyhow::Result<Area<'a>> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| anyhow!("cannot load the embedded font"))?;
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(drawing)?;
    root.titled(title, ("sans-serif", 22)).map_err(drawing)
}

/// Writes the canvas out.
pub(crate) fn present(root: &Area<'_>, path: &Path) -> anyhow::Result<()> {
    root.present()
        .with_context(|| format!("writing {}", path.display()))
}

/// One bar: its label, value and colour.
pub(crate) struct Bar {
    pub(crate) label: String,
    pub(crate) value: f64,
    pub(crate) colour: RGBColor,
}

/// A bar chart in `panel`, each bar's value written above it with `format`.
pub(crate) fn bars(
    panel: &Area<'_>,
    caption: &str,
    bars: &[Bar],
    format: impl Fn(f64) -> String,
) -> anyhow::Result<()> {
    let top = finite_top(bars.iter().map(|b| b.value).fold(0.0, f64::max).max(1e-9) * 1.15);
    let mut chart = ChartBuilder::on(panel)
        .caption(caption, ("sans-serif", 18))
        .margin(20)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d((0..bars.len().saturating_sub(1)).into_segmented(), 0.0..top)
        .map_err(drawing)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE.mix(0.0))
        .x_label_style(("sans-serif", 15))
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => bars.get(*i).map(|b| b.label.clone()).unwrap_or_default(),
            _ => String::new(),
        })
        .draw()
        .map_err(drawing)?;
    for (i, bar) in bars.iter().enumerate() {
        chart
            .draw_series(std::iter::once({
                let mut rectangle = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), 0.0),
                        (SegmentValue::Exact(i + 1), bar.value),
                    ],
                    bar.colour.filled(),
                );
                rectangle.set_margin(0, 0, 12, 12);
                rectangle
            }))
            .map_err(drawing)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format(bar.value),
                (SegmentValue::CenterOf(i), bar.value + top * 0.03),
                ("sans-serif", 16),
            )))
            .map_err(drawing)?;
    }
    Ok(())
}

/// One line over time.
pub(crate) struct Line {
    /// Its name in the legend (none: not in the legend).
    pub(crate) label: Option<String>,
    /// (x, y) points, x increasing.
    pub(crate) points: Vec<(f64, f64)>,
    pub(crate) colour: RGBColor,
    /// Dashed (a limit, such as a GPU's memory in all) rather than solid.
    pub(crate) dashed: bool,
}

/// Lines over `x_range` in `panel`, y from 0 to above the highest point (at least `y_min_top`),
/// with a legend when any line has a label.
pub(crate) fn lines(
    panel: &Area<'_>,
    caption: &str,
    (x_desc, x_range): (&str, std::ops::Range<f64>),
    y_desc: &str,
    y_min_top: f64,
    lines: &[Line],
) -> anyhow::Result<()> {
    // A recording is outside input: a value or time that is not finite (a clock that
    // jumped, an inf in a hand-edited CSV) is left out; plotters hangs on an infinite range.
    let finite = |p: &&(f64, f64)| p.0.is_finite() && p.1.is_finite();
    let x_range =
        if x_range.start.is_finite() && x_range.end.is_finite() && x_range.start < x_range.end {
            x_range
        } else {
            0.0..1.0
        };
    let highest = lines
        .iter()
        .flat_map(|l| l.points.iter().filter(finite).map(|p| p.1))
        .fold(y_min_top, f64::max);
    let labelled = lines.iter().filter(|l| l.label.is_some()).count();
    // Room above the lines for the legend.
    let top = finite_top(
        highest
            * if labelled > 0 {
                1.1 + 0.07 * labelled as f64
            } else {
                1.1
            },
    );
    let mut chart = ChartBuilder::on(panel)
        .caption(caption, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range, 0.0..top)
        .map_err(drawing)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels(10)
        .y_labels(6)
        .axis_desc_style(("sans-serif", 15))
        .label_style(("sans-serif", 13))
        .y_label_formatter(&|y| short_number(*y))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(drawing)?;
    for line in lines {
        let style = line.colour.stroke_width(2);
        let drawn = if line.dashed {
            chart.draw_series(DashedLineSeries::new(
                line.points.iter().filter(finite).copied(),
                8,
                6,
                style,
            ))
        } else {
            chart.draw_series(LineSeries::new(
                line.points.iter().filter(finite).copied(),
                style,
            ))
        }
        .map_err(drawing)?;
        if let Some(label) = &line.label {
            let colour = line.colour;
            drawn.label(label.as_str()).legend(move |(x, y)| {
                PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(3))
            });
        }
    }
    if labelled > 0 {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()
            .map_err(drawing)?;
    }
    Ok(())
}

/// The top of a y axis, finite and positive (plotters hangs on an infinite range).
fn finite_top(top: f64) -> f64 {
    if top.is_finite() && top > 0.0 {
        top
    } else if top > 0.0 {
        f64::MAX / 16.0
    } else {
        1.0
    }
}

/// 1234567 as `1.2M`, 12345 as `12k`, 0.25 as `0.25`: axis labels that fit.
pub(crate) fn short_number(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Draws aggregate samples/s and samples per CPU-second, shared against independent.
pub(crate) fn fanout(report: &FanoutReport, path: &Path) -> anyhow::Result<()> {
    let title = format!(
        "ladle: {} consumers, {} threads, {:.0} s per mode",
        report
            .modes
            .ran()
            .next()
            .map_or(0, |(_, m)| m.consumers.len()),
        report.threads,
        report.seconds
    );
    let root = canvas(path, (1000, 450), &title)?;
    let panels = root.split_evenly((1, 2));
    type Metric = fn(&ModeResult) -> f64;
    let metrics: [(&str, Metric); 2] = [
        ("aggregate samples/s", |m| m.aggregate_samples_per_s),
        ("samples per CPU-second", |m| m.samples_per_cpu_second),
    ];
    for (panel, (caption, metric)) in panels.iter().zip(metrics) {
        let modes: Vec<Bar> = report
            .modes
            .ran()
            .map(|(mode, m)| match mode {
                Mode::Shared => Bar {
                    label: "shared (ladle)".to_owned(),
                    value: metric(m),
                    colour: SHARED,
                },
                _ => Bar {
                    label: "independent".to_owned(),
                    value: metric(m),
                    colour: PRIVATE,
                },
            })
            .collect();
        bars(panel, caption, &modes, |v| format!("{v:.0}"))?;
    }
    present(&root, path)
}
