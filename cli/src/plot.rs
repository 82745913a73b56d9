//! `--plot FILE.png`: a bar chart of `ladle bench fanout`'s two modes.

use std::path::Path;

use anyhow::{Context, anyhow};
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::fanout::{FanoutReport, Mode, ModeResult};

/// Draws aggregate samples/s and samples per CPU-second, shared against independent.
pub(crate) fn fanout(report: &FanoutReport, path: &Path) -> anyhow::Result<()> {
    // An embedded font: the chart must render on machines without system fonts.
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| anyhow!("cannot load the embedded font"))?;
    let root = BitMapBackend::new(path, (1000, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
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
    let root = root
        .titled(&title, ("sans-serif", 22))
        .map_err(|e| anyhow!("{e}"))?;
    let panels = root.split_evenly((1, 2));
    type Metric = fn(&ModeResult) -> f64;
    let metrics: [(&str, Metric); 2] = [
        ("aggregate samples/s", |m| m.aggregate_samples_per_s),
        ("samples per CPU-second", |m| m.samples_per_cpu_second),
    ];
    for (panel, (caption, metric)) in panels.iter().zip(metrics) {
        let bars: Vec<(String, f64, RGBColor)> = report
            .modes
            .ran()
            .map(|(mode, m)| match mode {
                Mode::Shared => (
                    "shared (ladle)".to_owned(),
                    metric(m),
                    RGBColor(38, 110, 190),
                ),
                _ => ("independent".to_owned(), metric(m), RGBColor(200, 120, 40)),
            })
            .collect();
        let top = bars.iter().map(|b| b.1).fold(1.0, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 18))
            .margin(20)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d((0..bars.len().saturating_sub(1)).into_segmented(), 0.0..top)
            .map_err(|e| anyhow!("{e}"))?;
        let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&|x| match x {
                SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        for (i, (_, value, colour)) in bars.iter().enumerate() {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [
                        (SegmentValue::Exact(i), 0.0),
                        (SegmentValue::Exact(i + 1), *value),
                    ],
                    colour.filled(),
                )))
                .map_err(|e| anyhow!("{e}"))?;
            chart
                .draw_series(std::iter::once(Text::new(
                    format!("{value:.0}"),
                    (SegmentValue::CenterOf(i), *value * 1.02 + top * 0.02),
                    ("sans-serif", 16),
                )))
                .map_err(|e| anyhow!("{e}"))?;
        }
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
