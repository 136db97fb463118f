//! Charts drawn on the server as inline SVG: no script, no external asset.

use maud::{Markup, PreEscaped, html};

/// A bar chart of `values` (oldest first), `width` × `height` pixels, with
/// the largest value as its label.
pub(crate) fn bars(values: &[f64], label: &str, width: u32, height: u32) -> Markup {
    let max = values.iter().copied().fold(0.0_f64, f64::max);
    let n = values.len().max(1);
    #[allow(clippy::cast_precision_loss)] // a few hundred samples
    let step = f64::from(width) / n as f64;
    let mut rects = String::new();
    for (i, v) in values.iter().enumerate() {
        let h = if max > 0.0 {
            v / max * f64::from(height - 14)
        } else {
            0.0
        };
        #[allow(clippy::cast_precision_loss)]
        let x = i as f64 * step;
        rects.push_str(&format!(
            r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}"/>"#,
            y = f64::from(height) - h,
            w = (step - 1.0).max(1.0),
        ));
    }
    html! {
        svg class="chart" width=(width) height=(height) viewBox=(format!("0 0 {width} {height}")) role="img" aria-label=(label) {
            text x="2" y="11" { (label) " (max " (format!("{max:.1}")) ")" }
            (PreEscaped(rects))
        }
    }
}
