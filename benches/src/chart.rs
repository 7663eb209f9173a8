//! A dependency-free SVG bar chart of the comparison's headline figures.

use std::fmt::Write as _;

/// One panel: a title, a unit and labelled values drawn as horizontal bars.
pub struct Panel {
    pub title: String,
    pub unit: &'static str,
    pub bars: Vec<(String, f64)>,
    /// Log-scale bars, for values that span orders of magnitude.
    pub log_scale: bool,
}

/// Width of the whole chart, in SVG user units (pixels).
const WIDTH: f64 = 900.0;
/// Space for the bar labels on the left.
const LABEL_WIDTH: f64 = 420.0;
/// Height of one bar row.
const ROW_HEIGHT: f64 = 26.0;
/// Height of a panel's title line.
const TITLE_HEIGHT: f64 = 34.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn bar_length(value: f64, max: f64, log_scale: bool) -> f64 {
    let span = WIDTH - LABEL_WIDTH - 110.0;
    if value <= 0.0 || max <= 0.0 {
        return 0.0;
    }
    if log_scale {
        // One decade below the smallest useful value maps to zero length.
        let top = max.log10() + 1.0;
        (value.log10() + 1.0).max(0.0) / top * span
    } else {
        value / max * span
    }
}

/// The panels stacked into one SVG document.
pub fn render(panels: &[Panel]) -> String {
    let height: f64 = panels
        .iter()
        .map(|panel| TITLE_HEIGHT + ROW_HEIGHT * panel.bars.len() as f64 + 16.0)
        .sum();
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let mut y = 0.0;
    for panel in panels {
        let scale = if panel.log_scale { ", log scale" } else { "" };
        let _ = writeln!(
            svg,
            r#"<text x="8" y="{:.0}" font-weight="bold">{} ({}{scale})</text>"#,
            y + 22.0,
            escape(&panel.title),
            panel.unit
        );
        y += TITLE_HEIGHT;
        let max = panel
            .bars
            .iter()
            .map(|(_, value)| *value)
            .fold(0.0, f64::max);
        for (label, value) in &panel.bars {
            let length = bar_length(*value, max, panel.log_scale);
            let colour = if label.starts_with("dshdb") {
                "#2b6cb0"
            } else {
                "#a0aec0"
            };
            let _ = writeln!(
                svg,
                r#"<text x="{:.0}" y="{:.0}" text-anchor="end">{}</text><rect x="{LABEL_WIDTH}" y="{:.0}" width="{length:.1}" height="{:.0}" fill="{colour}"/><text x="{:.1}" y="{:.0}">{}</text>"#,
                LABEL_WIDTH - 8.0,
                y + 17.0,
                escape(label),
                y + 4.0,
                ROW_HEIGHT - 8.0,
                LABEL_WIDTH + length + 6.0,
                y + 17.0,
                format_value(*value)
            );
            y += ROW_HEIGHT;
        }
        y += 16.0;
    }
    svg.push_str("</svg>\n");
    svg
}

fn format_value(value: f64) -> String {
    if value >= 10_000.0 {
        format!("{:.0}k", value / 1000.0)
    } else if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_bar_with_its_label_and_escapes_text() {
        let svg = render(&[Panel {
            title: "fleet <64>".to_owned(),
            unit: "events/s",
            bars: vec![
                ("dshdb".to_owned(), 500_000.0),
                ("SQLite".to_owned(), 5_000.0),
            ],
            log_scale: true,
        }]);
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("fleet &lt;64&gt;"));
        assert!(svg.contains(">500k<") && svg.contains(">5000<"));
        assert_eq!(svg.matches("<rect x=").count(), 2);
    }

    #[test]
    fn log_bars_keep_their_order() {
        let big = bar_length(500_000.0, 500_000.0, true);
        let small = bar_length(5_000.0, 500_000.0, true);
        assert!(big > small && small > 0.0, "{big} {small}");
    }
}
