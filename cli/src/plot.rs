//! The plots of the benchmarks, drawn with plotters' bitmap backend and encoded as PNG: `bench
//! shop --plot` (commit latency against percentile, one line per journal mode), `--plot-timeline`
//! (documents/s and memory over time), and `bench scale --plot` (ops/s against executors).
//!
//! plotters draws text only with a font feature that needs font files (system fonts, or TTF
//! bytes given to `ab_glyph`); to need none, the lines and grid are drawn with plotters and
//! the text with the public-domain 8x8 bitmap font of the `font8x8` crate, pixel by pixel.

use std::path::Path;

use font8x8::UnicodeFonts;
use plotters::coord::Shift;
use plotters::prelude::*;

const W: u32 = 1000;
const H: u32 = 600;
const LEFT: u32 = 90;
const RIGHT: u32 = 60;
const TOP: u32 = 60;
const BOTTOM: u32 = 60;
const COLORS: [RGBColor; 4] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
];

type Err = Box<dyn std::error::Error>;

/// Writes the x axis's title centred under the plot area.
fn x_axis_title(buf: &mut [u8], title: &str, color: RGBColor) {
    text(
        buf,
        (LEFT as i32 + (W - LEFT - RIGHT) as i32 / 2) - text_width(title, 1) / 2,
        (H - 22) as i32,
        title,
        color,
        1,
    );
}

/// Writes `text` into an RGB buffer at pixel (x, y) (top left), `scale` pixels per font pixel.
fn text(buf: &mut [u8], x: i32, y: i32, s: &str, color: RGBColor, scale: i32) {
    let mut cx = x;
    for ch in s.chars() {
        let glyph = font8x8::BASIC_FONTS
            .get(ch)
            .or_else(|| font8x8::LATIN_FONTS.get(ch))
            .unwrap_or([0; 8]);
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..8 {
                if bits & (1 << col) == 0 {
                    continue;
                }
                for dy in 0..scale {
                    for dx in 0..scale {
                        let px = cx + col * scale + dx;
                        let py = y + row as i32 * scale + dy;
                        if px < 0 || py < 0 || px >= W as i32 || py >= H as i32 {
                            continue;
                        }
                        let i = (py as usize * W as usize + px as usize) * 3;
                        buf[i] = color.0;
                        buf[i + 1] = color.1;
                        buf[i + 2] = color.2;
                    }
                }
            }
        }
        cx += 8 * scale;
    }
}

fn text_width(s: &str, scale: i32) -> i32 {
    s.chars().count() as i32 * 8 * scale
}

/// Percentile as "nines": 0% -> 0, 90% -> 1, 99% -> 2, 99.9% -> 3.
fn nines(q: f64) -> f64 {
    -(1.0 - q.min(1.0 - 1e-9)).log10()
}

/// Draws the series ((label, [(quantile 0..1, microseconds)])) to a PNG file at `path`.
pub fn latency_png(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(f64, u64)>)],
) -> Result<(), Err> {
    let mut buf = vec![255u8; (W * H * 3) as usize];
    let points: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|(_, v)| {
            v.iter()
                .map(|(q, us)| (nines(*q), (*us).max(1) as f64 / 1000.0))
                .collect()
        })
        .collect();
    let all = points.iter().flatten();
    let xmax = all
        .clone()
        .map(|p| p.0)
        .fold(1.0f64, f64::max)
        .ceil()
        .max(2.0);
    let ymin_raw = all.clone().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let ymax_raw = all.map(|p| p.1).fold(0.0f64, f64::max);
    let (ymin, ymax) = if ymax_raw > 0.0 {
        (
            10f64.powf(ymin_raw.log10().floor()),
            10f64
                .powf(ymax_raw.log10().ceil())
                .max(10f64.powf(ymin_raw.log10().floor() + 1.0)),
        )
    } else {
        (0.01, 10.0)
    };
    let mut labels: Vec<(i32, i32, String, RGBColor, i32)> = Vec::new();
    {
        let root: DrawingArea<BitMapBackend, Shift> =
            BitMapBackend::with_buffer(&mut buf, (W, H)).into_drawing_area();
        root.fill(&WHITE)?;
        let area = root.margin(TOP, BOTTOM, LEFT, RIGHT);
        let mut chart =
            ChartBuilder::on(&area).build_cartesian_2d(0f64..xmax, (ymin..ymax).log_scale())?;
        let grid = RGBColor(220, 220, 220);
        let axis = RGBColor(60, 60, 60);
        // Vertical grid at each nine, horizontal at each power of ten (and 2x, 5x lightly).
        for n in 0..=(xmax as i64) {
            let x = n as f64;
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x, ymin), (x, ymax)],
                grid,
            )))?;
            let (px, py) = chart.backend_coord(&(x, ymin));
            let label = match n {
                0 => "0%".to_string(),
                n => format!("{}%", 100.0 - 100.0 * 10f64.powi(-(n as i32))),
            };
            labels.push((px - text_width(&label, 1) / 2, py + 8, label, axis, 1));
        }
        let mut decade = ymin;
        while decade <= ymax * 1.0001 {
            for (m, c) in [
                (1.0, grid),
                (2.0, RGBColor(240, 240, 240)),
                (5.0, RGBColor(240, 240, 240)),
            ] {
                let y = decade * m;
                if y > ymax * 1.0001 {
                    continue;
                }
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(0.0, y), (xmax, y)],
                    c,
                )))?;
                if m == 1.0 {
                    let (px, py) = chart.backend_coord(&(0.0, y));
                    let label = if y >= 1.0 {
                        format!("{y:.0}")
                    } else {
                        format!("{y}")
                    };
                    labels.push((px - 8 - text_width(&label, 1), py - 4, label, axis, 1));
                }
            }
            decade *= 10.0;
        }
        // Axes.
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(0.0, ymax), (0.0, ymin), (xmax, ymin)],
            axis.stroke_width(2),
        )))?;
        for (i, pts) in points.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            chart.draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(3)))?;
        }
        // Legend swatches.
        for (i, _) in series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            let y = (TOP + 14 + 18 * i as u32) as i32;
            let x = (LEFT + 20) as i32;
            root.draw(&Rectangle::new([(x, y + 2), (x + 24, y + 6)], c.filled()))?;
        }
        root.present()?;
    }
    text(&mut buf, LEFT as i32, 18, title, RGBColor(0, 0, 0), 1);
    text(
        &mut buf,
        8,
        (TOP - 16) as i32,
        "latency (ms, log scale)",
        RGBColor(60, 60, 60),
        1,
    );
    x_axis_title(
        &mut buf,
        "percentile (0% .. the slowest commit)",
        RGBColor(60, 60, 60),
    );
    for (x, y, s, c, sc) in labels {
        text(&mut buf, x, y, &s, c, sc);
    }
    for (i, (label, _)) in series.iter().enumerate() {
        let y = (TOP + 14 + 18 * i as u32) as i32;
        text(
            &mut buf,
            (LEFT + 52) as i32,
            y,
            label,
            COLORS[i % COLORS.len()],
            1,
        );
    }
    save_png(path, &buf)
}

/// Encodes the RGB buffer (W x H) as a PNG file at `path`.
fn save_png(path: &Path, buf: &[u8]) -> Result<(), Err> {
    let file = std::fs::File::create(path)?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), W, H);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header()?;
    w.write_image_data(buf)?;
    w.finish()?;
    Ok(())
}

/// A round upper bound for an axis: 1, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten, at least
/// `v` (so a 600 s run gets a 600 s axis, not 1,000).
fn nice_max(v: f64) -> f64 {
    if !(v > 0.0 && v.is_finite()) {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|m| *m >= v)
        .unwrap_or(10.0 * p)
}

/// One line of the timeline plot: its label and (seconds, documents/s, MiB) points.
pub type TimelineSeries = (String, Vec<(f64, f64, f64)>);

/// Draws two panels over time, one line per series in each: documents/s (top) and anonymous
/// memory in MiB (bottom).
pub fn timeline_png(path: &Path, title: &str, series: &[TimelineSeries]) -> Result<(), Err> {
    let mut buf = vec![255u8; (W * H * 3) as usize];
    let all = series.iter().flat_map(|(_, v)| v.iter());
    let xmax = nice_max(all.clone().map(|p| p.0).fold(0.0, f64::max));
    let ymax = [
        nice_max(all.clone().map(|p| p.1).fold(0.0, f64::max)),
        nice_max(all.map(|p| p.2).fold(0.0, f64::max)),
    ];
    let axis = RGBColor(60, 60, 60);
    let grid = RGBColor(220, 220, 220);
    let mut labels: Vec<(i32, i32, String)> = Vec::new();
    let panel_h = (H - TOP - BOTTOM) / 2;
    {
        let root: DrawingArea<BitMapBackend, Shift> =
            BitMapBackend::with_buffer(&mut buf, (W, H)).into_drawing_area();
        root.fill(&WHITE)?;
        for (panel, ytop) in ymax.iter().enumerate() {
            let top = TOP + panel as u32 * panel_h;
            let area = root.margin(top + 10, H - top - panel_h + 20, LEFT, RIGHT);
            let mut chart = ChartBuilder::on(&area).build_cartesian_2d(0f64..xmax, 0f64..*ytop)?;
            for i in 0..=5 {
                let y = ytop * i as f64 / 5.0;
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(0.0, y), (xmax, y)],
                    grid,
                )))?;
                let (px, py) = chart.backend_coord(&(0.0, y));
                let l = format!("{y:.0}");
                labels.push((px - 8 - text_width(&l, 1), py - 4, l));
            }
            for i in 0..=10 {
                let x = xmax * i as f64 / 10.0;
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(x, 0.0), (x, *ytop)],
                    grid,
                )))?;
                if panel == 1 {
                    let (px, py) = chart.backend_coord(&(x, 0.0));
                    let l = format!("{x:.0}");
                    labels.push((px - text_width(&l, 1) / 2, py + 8, l));
                }
            }
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(0.0, *ytop), (0.0, 0.0), (xmax, 0.0)],
                axis.stroke_width(2),
            )))?;
            for (i, (_, pts)) in series.iter().enumerate() {
                let c = COLORS[i % COLORS.len()];
                let line = pts
                    .iter()
                    .map(|p| (p.0, if panel == 0 { p.1 } else { p.2 }));
                chart.draw_series(LineSeries::new(line, c.stroke_width(2)))?;
            }
        }
        for (i, _) in series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            let y = (TOP + 14 + 18 * i as u32) as i32;
            let x = (W - RIGHT - 260) as i32;
            root.draw(&Rectangle::new([(x, y + 2), (x + 24, y + 6)], c.filled()))?;
        }
        root.present()?;
    }
    text(&mut buf, LEFT as i32, 18, title, RGBColor(0, 0, 0), 1);
    text(&mut buf, 8, (TOP - 6) as i32, "documents/s", axis, 1);
    text(
        &mut buf,
        8,
        (TOP + panel_h - 6) as i32,
        "anonymous memory (MiB)",
        axis,
        1,
    );
    x_axis_title(&mut buf, "seconds", axis);
    for (x, y, s) in labels {
        text(&mut buf, x, y, &s, axis, 1);
    }
    for (i, (label, _)) in series.iter().enumerate() {
        let y = (TOP + 14 + 18 * i as u32) as i32;
        text(
            &mut buf,
            (W - RIGHT - 228) as i32,
            y,
            label,
            COLORS[i % COLORS.len()],
            1,
        );
    }
    save_png(path, &buf)
}

/// One line of the scale plot: its label and (executors, ops/s) points.
pub type ScaleSeries = (String, Vec<(usize, f64)>);

/// Draws `bench scale`'s throughput against executors: x the executor count (log 2 scale),
/// y ops/s (log 10 scale), one line with a dot per point per series, and a dashed vertical
/// line at `cpus` (counts right of it are oversubscribed).
pub fn scale_png(path: &Path, title: &str, cpus: usize, series: &[ScaleSeries]) -> Result<(), Err> {
    let mut buf = vec![255u8; (W * H * 3) as usize];
    let pts = series.iter().flat_map(|(_, v)| v.iter());
    let xmax_n = pts.clone().map(|p| p.0).max().unwrap_or(1).max(cpus).max(2);
    let xmax = (xmax_n as f64).log2().ceil().max(1.0);
    let ymin_raw = pts
        .clone()
        .map(|p| p.1)
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let ymax_raw = pts.map(|p| p.1).fold(0.0f64, f64::max);
    let (ymin, ymax) = if ymax_raw > 0.0 && ymin_raw.is_finite() {
        (
            10f64.powf(ymin_raw.log10().floor()),
            10f64
                .powf(ymax_raw.log10().ceil())
                .max(10f64.powf(ymin_raw.log10().floor() + 1.0)),
        )
    } else {
        (1.0, 10.0)
    };
    let axis = RGBColor(60, 60, 60);
    let grid = RGBColor(220, 220, 220);
    let mut labels: Vec<(i32, i32, String)> = Vec::new();
    {
        let root: DrawingArea<BitMapBackend, Shift> =
            BitMapBackend::with_buffer(&mut buf, (W, H)).into_drawing_area();
        root.fill(&WHITE)?;
        let area = root.margin(TOP, BOTTOM, LEFT, RIGHT);
        let mut chart =
            ChartBuilder::on(&area).build_cartesian_2d(0f64..xmax, (ymin..ymax).log_scale())?;
        for e in 0..=(xmax as u32) {
            let x = e as f64;
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x, ymin), (x, ymax)],
                grid,
            )))?;
            let (px, py) = chart.backend_coord(&(x, ymin));
            let l = (1u64 << e).to_string();
            labels.push((px - text_width(&l, 1) / 2, py + 8, l));
        }
        let mut decade = ymin;
        while decade <= ymax * 1.0001 {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(0.0, decade), (xmax, decade)],
                grid,
            )))?;
            let (px, py) = chart.backend_coord(&(0.0, decade));
            let l = if decade >= 1e6 {
                format!("{:.0}M", decade / 1e6)
            } else if decade >= 1e3 {
                format!("{:.0}k", decade / 1e3)
            } else {
                format!("{decade}")
            };
            labels.push((px - 8 - text_width(&l, 1), py - 4, l));
            decade *= 10.0;
        }
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(0.0, ymax), (0.0, ymin), (xmax, ymin)],
            axis.stroke_width(2),
        )))?;
        // The CPU count, dashed.
        let xc = (cpus.max(1) as f64).log2();
        if xc <= xmax {
            let steps = 40;
            let (l0, l1) = (ymin.log10(), ymax.log10());
            for i in (0..steps).step_by(2) {
                let a = 10f64.powf(l0 + (l1 - l0) * i as f64 / steps as f64);
                let b = 10f64.powf(l0 + (l1 - l0) * (i + 1) as f64 / steps as f64);
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(xc, a), (xc, b)],
                    RGBColor(150, 150, 150).stroke_width(2),
                )))?;
            }
            let (px, py) = chart.backend_coord(&(xc, ymax));
            labels.push((px + 6, py + 4, format!("{cpus} CPUs")));
        }
        for (i, (_, v)) in series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            let line: Vec<(f64, f64)> = v
                .iter()
                .filter(|p| p.1 > 0.0)
                .map(|p| ((p.0.max(1) as f64).log2(), p.1))
                .collect();
            chart.draw_series(LineSeries::new(line.iter().copied(), c.stroke_width(3)))?;
            chart.draw_series(line.iter().map(|p| Circle::new(*p, 4, c.filled())))?;
        }
        // The legend: one row above the chart, clear of the data.
        for (i, _) in series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            let x = (LEFT + 200 * i as u32) as i32;
            root.draw(&Rectangle::new([(x, 38), (x + 24, 42)], c.filled()))?;
        }
        root.present()?;
    }
    text(&mut buf, LEFT as i32, 18, title, RGBColor(0, 0, 0), 1);
    text(&mut buf, 8, (TOP - 12) as i32, "ops/s (log)", axis, 1);
    x_axis_title(&mut buf, "executors (log 2 scale)", axis);
    for (x, y, s) in labels {
        text(&mut buf, x, y, &s, axis, 1);
    }
    for (i, (label, _)) in series.iter().enumerate() {
        let x = (LEFT + 32 + 200 * i as u32) as i32;
        text(&mut buf, x, 36, label, COLORS[i % COLORS.len()], 1);
    }
    save_png(path, &buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_max_rounds_up_to_a_round_value() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(2.7), 3.0);
        assert_eq!(nice_max(1800.0), 2000.0);
        assert_eq!(nice_max(5000.0), 5000.0);
        assert_eq!(nice_max(600.2), 800.0);
        assert_eq!(nice_max(599.0), 600.0);
        assert_eq!(nice_max(9000.0), 10000.0);
    }
}
