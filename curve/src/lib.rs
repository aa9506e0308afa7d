//! The training curve: loss and accuracy against step, drawn as a self-contained SVG (two panels:
//! loss, accuracy; training and test series), as a plain-text chart for a terminal, and as CSV for
//! other tools.
//!
//! Two front-ends draw with it: `tandem train` (the trainer's progress display records every job's
//! merged progress, one process or many, with [`Curve::record_merged`]) and `kubectl tandem plot`
//! (from the job's `status.history`). A value nobody measured (the training accuracy, the test
//! loss before the end) is NaN.
//!
//! Guarantees: the SVG needs no fonts or scripts beyond a browser's defaults; the text chart is
//! ASCII; an empty series is left out rather than drawn, and so are NaN values (an empty field in
//! the CSV); the SVG marks each test point (an evaluation) and joins only points that exist, so
//! neither panel shows a value nobody measured or a legend for a series it does not draw. No dependencies, no I/O but [`Curve::write`].

use std::fmt::Write as _;
use std::path::Path;

/// Points collected during a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Curve {
    /// (step, mean training loss, training accuracy).
    pub train: Vec<(u64, f64, f64)>,
    /// (step, test loss, test accuracy).
    pub test: Vec<(u64, f64, f64)>,
}

impl Curve {
    /// Records a point of a multi-process job's merged progress at `step`: the groups' mean
    /// training `loss` and the latest test `accuracy` (with `test_loss` at the end). A second point
    /// at the same step replaces the first, so each series keeps one point per step.
    pub fn record_merged(
        &mut self,
        step: u64,
        loss: Option<f64>,
        accuracy: Option<f64>,
        test_loss: Option<f64>,
    ) {
        fn put(series: &mut Vec<(u64, f64, f64)>, point: (u64, f64, f64)) {
            match series.last_mut() {
                Some(last) if last.0 == point.0 => *last = point,
                _ => series.push(point),
            }
        }
        if let Some(loss) = loss {
            put(&mut self.train, (step, loss, f64::NAN));
        }
        if let Some(accuracy) = accuracy {
            put(&mut self.test, (step, test_loss.unwrap_or(f64::NAN), accuracy));
        }
    }

    /// The curve as CSV: `series,step,loss,accuracy`; NaN values are empty fields.
    pub fn to_csv(&self) -> String {
        let field = |v: f64| if v.is_finite() { v.to_string() } else { String::new() };
        let mut s = String::from("series,step,loss,accuracy\n");
        for (name, pts) in [("train", &self.train), ("test", &self.test)] {
            for (step, loss, acc) in pts {
                let _ = writeln!(s, "{name},{step},{},{}", field(*loss), field(*acc));
            }
        }
        s
    }

    /// The curve as an SVG document titled `title`.
    pub fn to_svg(&self, title: &str) -> String {
        let (w, h) = (960.0, 400.0);
        let mut s = format!(
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="16">{}</text>
"##,
            w / 2.0,
            escape(title)
        );
        let max_step = self.train.iter().chain(&self.test).map(|p| p.0).max().unwrap_or(1).max(1) as f64;
        let loss_max =
            self.train.iter().chain(&self.test).map(|p| p.1).filter(|v| v.is_finite()).fold(0.0, f64::max);
        let loss_max = if loss_max > 0.0 { loss_max * 1.05 } else { 1.0 };
        let panels = [("loss", 60.0, loss_max, 1usize), ("accuracy", 540.0, 1.0, 2usize)];
        for (label, x0, ymax, field) in panels {
            let (pw, ph, y0) = (380.0, 300.0, 50.0);
            let px = |step: u64| x0 + pw * step as f64 / max_step;
            let py = |v: f64| y0 + ph * (1.0 - (v / ymax).clamp(0.0, 1.0));
            let _ = writeln!(
                s,
                r##"<g class="panel" id="{label}">
<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>
<text x="{}" y="{}" text-anchor="middle">{label}</text>
<text x="{}" y="{}" text-anchor="middle">step</text>"##,
                x0 + pw / 2.0,
                y0 - 6.0,
                x0 + pw / 2.0,
                y0 + ph + 32.0
            );
            for i in 0..=4 {
                let v = ymax * i as f64 / 4.0;
                let stp = (max_step * i as f64 / 4.0).round() as u64;
                let _ = writeln!(
                    s,
                    r##"<line x1="{x0}" x2="{}" y1="{y}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{v:.2}</text><text x="{}" y="{}" text-anchor="middle">{stp}</text>"##,
                    x0 + pw,
                    x0 - 4.0,
                    py(v) + 4.0,
                    px(stp),
                    y0 + ph + 16.0,
                    y = py(v)
                );
            }
            for (name, pts, color) in [("train", &self.train, "#1f77b4"), ("test", &self.test, "#d62728")] {
                let points: Vec<(f64, f64)> = pts
                    .iter()
                    .map(|p| (p.0, if field == 1 { p.1 } else { p.2 }))
                    .filter(|(_, v)| v.is_finite())
                    .map(|(step, v)| (px(step), py(v)))
                    .collect();
                if points.is_empty() {
                    continue;
                }
                if points.len() >= 2 {
                    let path: Vec<String> = points.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
                    let _ = writeln!(
                        s,
                        r##"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"##,
                        path.join(" ")
                    );
                }
                // Test points are evaluations, each a measurement: a mark at each (and a lone
                // training point would draw nothing as a line).
                if name == "test" || points.len() == 1 {
                    for (x, y) in &points {
                        let _ = writeln!(
                            s,
                            r##"<circle class="{name}" cx="{x:.1}" cy="{y:.1}" r="3" fill="{color}"/>"##
                        );
                    }
                }
                let ly = if name == "train" { y0 + 14.0 } else { y0 + 30.0 };
                let _ = writeln!(
                    s,
                    r##"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{}" y="{}">{name}</text>"##,
                    x0 + pw - 80.0,
                    x0 + pw - 60.0,
                    x0 + pw - 55.0,
                    ly + 4.0
                );
            }
            s.push_str("</g>\n");
        }
        s.push_str("</svg>\n");
        s
    }

    /// The curve as a plain-text chart for a terminal, `width` columns of plot by `height` rows per
    /// panel: a loss panel and, when anything measured it, an accuracy panel (0 to 1), each with its
    /// axis range, training points as `*` and test points as `o`, joined along the columns between
    /// consecutive points. An empty curve gives a line saying so.
    pub fn to_text(&self, width: usize, height: usize) -> String {
        let (width, height) = (width.max(10), height.max(3));
        let max_step = self.train.iter().chain(&self.test).map(|p| p.0).max().unwrap_or(1).max(1) as f64;
        let loss_max =
            self.train.iter().chain(&self.test).map(|p| p.1).filter(|v| v.is_finite()).fold(0.0, f64::max);
        let loss_max = if loss_max > 0.0 { loss_max * 1.05 } else { 1.0 };
        let col = |step: u64| ((step as f64 / max_step) * (width - 1) as f64).round() as usize;
        let row =
            |v: f64, ymax: f64| ((1.0 - (v / ymax).clamp(0.0, 1.0)) * (height - 1) as f64).round() as usize;
        let mut out = String::new();
        for (label, ymax, field) in [("loss", loss_max, 1usize), ("accuracy", 1.0, 2usize)] {
            let mut grid = vec![vec![' '; width]; height];
            let mut drawn = false;
            for (mark, pts) in [('*', &self.train), ('o', &self.test)] {
                let pts: Vec<(usize, f64)> = pts
                    .iter()
                    .map(|p| (col(p.0), if field == 1 { p.1 } else { p.2 }))
                    .filter(|(_, v)| v.is_finite())
                    .collect();
                drawn |= !pts.is_empty();
                if let [(c, v)] = pts[..] {
                    grid[row(v, ymax)][c] = mark;
                }
                for pair in pts.windows(2) {
                    let ((c0, v0), (c1, v1)) = (pair[0], pair[1]);
                    let cells = (c0..=c1.max(c0)).map(|c| {
                        let t = if c1 > c0 { (c - c0) as f64 / (c1 - c0) as f64 } else { 1.0 };
                        (row(v0 + t * (v1 - v0), ymax), c)
                    });
                    for (r, c) in cells {
                        grid[r][c] = mark;
                    }
                }
            }
            if !drawn {
                continue;
            }
            let _ = writeln!(out, "{label}");
            for (i, cells) in grid.iter().enumerate() {
                let tick = match i {
                    0 => format!("{ymax:.3}"),
                    i if i == height - 1 => format!("{:.3}", 0.0),
                    _ => String::new(),
                };
                let _ = writeln!(out, "{tick:>9} |{}", cells.iter().collect::<String>().trim_end());
            }
            let _ = writeln!(out, "{:>9} +{}", "", "-".repeat(width));
            let last = format!("{}", max_step as u64);
            let gap = width.saturating_sub(1 + last.len());
            let _ = writeln!(out, "{:>9}  0{}{last}  step", "", " ".repeat(gap));
        }
        if out.is_empty() {
            return "no points yet: nothing was reported\n".to_owned();
        }
        out.push_str("* train  o test\n");
        out
    }

    /// Writes `curve.svg` and `curve.csv` into `dir`; returns the SVG's path.
    pub fn write(&self, dir: &Path, title: &str) -> std::io::Result<std::path::PathBuf> {
        std::fs::create_dir_all(dir)?;
        let svg = dir.join("curve.svg");
        std::fs::write(&svg, self.to_svg(title))?;
        std::fs::write(dir.join("curve.csv"), self.to_csv())?;
        Ok(svg)
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_points_keep_one_per_step_and_leave_unmeasured_values_out() {
        let mut curve = Curve::default();
        curve.record_merged(100, Some(0.9), Some(0.80), None);
        curve.record_merged(100, Some(0.7), Some(0.85), None);
        curve.record_merged(200, Some(0.5), None, None);
        curve.record_merged(200, None, Some(0.91), Some(0.3));
        assert_eq!(curve.train.len(), 2);
        assert_eq!((curve.train[0].0, curve.train[0].1), (100, 0.7));
        assert_eq!(curve.test.iter().map(|p| (p.0, p.2)).collect::<Vec<_>>(), [(100, 0.85), (200, 0.91)]);
        assert_eq!(curve.test[1].1, 0.3);

        let csv = curve.to_csv();
        assert!(csv.contains("train,100,0.7,\n"), "{csv}");
        assert!(csv.contains("test,100,,0.85\n"), "{csv}");
        assert!(csv.contains("test,200,0.3,0.91\n"), "{csv}");
        let svg = curve.to_svg("merged");
        assert!(!svg.contains("NaN"), "{svg}");
        assert_eq!(svg.matches("<polyline").count(), 2, "train loss and test accuracy");
        assert_eq!(
            svg.matches("<circle class=\"test\"").count(),
            3,
            "two evaluations and the final test loss"
        );
    }

    /// The part of `svg` that draws panel `id`.
    fn panel<'a>(svg: &'a str, id: &str) -> &'a str {
        let start = svg.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no panel {id}: {svg}"));
        let end = svg[start..].find("</g>").map_or(svg.len(), |e| start + e);
        &svg[start..end]
    }

    /// Each panel draws what was measured: a mark per evaluation in the accuracy panel (none
    /// between them), and in the loss panel a test legend only with the test loss it labels.
    #[test]
    fn the_svg_marks_each_evaluation_and_labels_only_what_it_draws() {
        let mut curve = Curve::default();
        for step in (10..=100).step_by(10) {
            curve.record_merged(step, Some(2.0 - step as f64 / 100.0), None, None);
        }
        curve.record_merged(50, None, Some(0.8), None);
        curve.record_merged(100, None, Some(0.9), None);
        let svg = curve.to_svg("evaluations");
        let (loss, accuracy) = (panel(&svg, "loss"), panel(&svg, "accuracy"));
        assert_eq!(accuracy.matches("<circle class=\"test\"").count(), 2, "{accuracy}");
        assert_eq!(
            accuracy.matches("<polyline").count(),
            1,
            "a line between the two evaluations: {accuracy}"
        );
        assert_eq!(loss.matches("<polyline").count(), 1, "the training loss: {loss}");
        assert!(!loss.contains(">test</text>"), "no test loss was measured, so no test legend: {loss}");
        assert!(!loss.contains("<circle"), "{loss}");

        // The final evaluation's test loss: one measured point, drawn as a mark with its legend.
        curve.record_merged(100, None, Some(0.9), Some(0.4));
        let svg = curve.to_svg("evaluations");
        let loss = panel(&svg, "loss");
        assert_eq!(loss.matches("<circle class=\"test\"").count(), 1, "{loss}");
        assert!(loss.contains(">test</text>"), "{loss}");
    }

    #[test]
    fn the_text_chart_draws_a_falling_loss_from_top_left_to_bottom_right() {
        let mut curve = Curve::default();
        for (step, loss) in [(0, 2.0), (50, 1.0), (100, 0.1)] {
            curve.record_merged(step, Some(loss), None, None);
        }
        let text = curve.to_text(20, 5);
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(rows[0], "loss", "{text}");
        assert!(rows[1].starts_with("    2.100 |*"), "the first point is top left: {text}");
        assert!(
            rows[5].starts_with("    0.000 |") && rows[5].ends_with('*'),
            "the last is bottom right: {text}"
        );
        assert!(rows[7].ends_with("100  step"), "{text}");
        assert!(!text.contains("accuracy"), "no accuracy was measured: {text}");
        assert!(text.is_ascii());

        curve.record_merged(100, None, Some(0.9), None);
        assert!(curve.to_text(20, 5).contains("accuracy\n    1.000 |"), "{}", curve.to_text(20, 5));
        assert_eq!(Curve::default().to_text(20, 5), "no points yet: nothing was reported\n");
    }
}
