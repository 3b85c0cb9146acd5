//! The status page's plots: the last 15 minutes of [`Sample`]s drawn as
//! inline SVG on the server (no script, no external asset), one small
//! chart per measure, leader changes marked on every time axis. Each
//! `<svg>` carries its figures as `data-` attributes (`data-points`,
//! `data-peak`, `data-last`) for tests and scrapers.

use std::fmt::Write as _;

use super::escape;
use crate::series::{Sample, EVERY, KEPT};

/// The chart's size in SVG units, and its margins (axis labels).
const WIDTH: f64 = 440.0;
const HEIGHT: f64 = 150.0;
const LEFT: f64 = 48.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 20.0;

/// One chart: its id, title, how a value is printed, and a value per sample
/// (`None`: not measured in that interval, drawn as a gap).
struct Plot {
    id: &'static str,
    title: &'static str,
    format: fn(f64) -> String,
    /// The axis's top for a peak ([`ceiling`], or [`whole_ceiling`] for
    /// counts, whose half-way label must be a whole number too).
    top: fn(f64) -> f64,
    values: Vec<(u64, Option<f64>)>,
}

/// The span shown: 15 minutes, ending now.
fn span_ms() -> u64 {
    EVERY.as_millis() as u64 * KEPT as u64
}

fn per_second(v: f64) -> String {
    format!("{v:.1}/s")
}

fn count(v: f64) -> String {
    format!("{v:.0}")
}

fn millis(v: f64) -> String {
    if v < 1.0 {
        format!("{:.0} µs", v * 1000.0)
    } else {
        format!("{v:.1} ms")
    }
}

/// The plots section of the page: six charts of the cluster's `samples`
/// (oldest first, `cluster.rs`) ending at `now_ms`; `answered` of
/// `members` nodes gave theirs.
pub(super) fn section(
    html: &mut String,
    samples: &[Sample],
    (answered, members): (usize, usize),
    now_ms: u64,
) {
    let series = |f: fn(&Sample) -> Option<f64>| -> Vec<(u64, Option<f64>)> {
        samples.iter().map(|s| (s.at_ms, f(s))).collect()
    };
    let plots = [
        Plot {
            id: "plot-renewals",
            title: "Renewals answered",
            format: per_second,
            top: ceiling,
            values: series(|s| Some(s.renewals)),
        },
        Plot {
            id: "plot-grants",
            title: "New grants",
            format: per_second,
            top: ceiling,
            values: series(|s| Some(s.grants)),
        },
        Plot {
            id: "plot-refused",
            title: "Writes refused by the gateway",
            format: per_second,
            top: ceiling,
            values: series(|s| s.refused),
        },
        Plot {
            id: "plot-held",
            title: "Leases held",
            format: count,
            top: whole_ceiling,
            values: series(|s| Some(s.held as f64)),
        },
        Plot {
            id: "plot-waiters",
            title: "Waiters",
            format: count,
            top: whole_ceiling,
            values: series(|s| Some(s.waiters as f64)),
        },
        Plot {
            id: "plot-renew-p99",
            title: "Renewal p99",
            format: millis,
            top: ceiling,
            values: series(|s| s.renew_p99_ms),
        },
    ];
    let changes: Vec<(u64, Option<u64>)> = samples
        .iter()
        .filter(|s| s.leader_changed)
        .map(|s| (s.at_ms, s.leader))
        .collect();
    let _ = write!(
        html,
        "<h2>Last 15 minutes</h2><p id=\"plots-source\">the cluster's, from {answered} of \
         {members} nodes (a node that did not answer is left out), one sample every {} s: \
         renewals and waiters summed over the nodes, the rest the highest any node saw; \
         <span class=\"leader-change-note\">dashed red</span>: the leader changed</p>\
         <div id=\"plots\">",
        EVERY.as_secs()
    );
    for plot in &plots {
        chart(html, plot, &changes, now_ms);
    }
    html.push_str("</div>");
}

/// A round number at or above `peak` (1, 2 or 5 times a power of ten), so
/// the axis reads well; at least 1.
fn ceiling(peak: f64) -> f64 {
    if peak.is_nan() || peak <= 1.0 {
        return 1.0;
    }
    let power = 10_f64.powf(peak.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|v| *v >= peak)
        .unwrap_or(10.0 * power)
}

/// [`ceiling`] for counts: 2, 4 or 10 times a power of ten, at least 2,
/// so the half-way label is a whole number too (a top of 1 read `1/0/0`).
fn whole_ceiling(peak: f64) -> f64 {
    if !peak.is_finite() || peak <= 2.0 {
        return 2.0;
    }
    let power = 10_f64.powf(peak.log10().floor());
    [2.0, 4.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|v| *v >= peak)
        .unwrap_or(10.0 * power)
}

/// One chart, in a `<figure>`.
fn chart(html: &mut String, plot: &Plot, changes: &[(u64, Option<u64>)], now_ms: u64) {
    let measured: Vec<f64> = plot.values.iter().filter_map(|(_, v)| *v).collect();
    let peak = measured.iter().copied().fold(0.0, f64::max);
    let top = (plot.top)(peak);
    let last = plot.values.last().and_then(|(_, v)| *v);
    let (inner_w, inner_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let start = now_ms.saturating_sub(span_ms());
    let x = |at: u64| LEFT + at.saturating_sub(start) as f64 / span_ms() as f64 * inner_w;
    let y = |v: f64| TOP + inner_h - (v / top).min(1.0) * inner_h;
    let _ = write!(
        html,
        "<figure><svg id=\"{id}\" xmlns=\"http://www.w3.org/2000/svg\" \
         width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" \
         aria-label=\"{title}\" data-points=\"{points}\" data-peak=\"{peak}\" data-last=\"{last}\" \
         font-family=\"sans-serif\" font-size=\"10\">\
         <rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{inner_w}\" height=\"{inner_h}\" fill=\"#fafafa\" stroke=\"#ccc\"/>",
        id = plot.id,
        title = escape(plot.title),
        points = measured.len(),
        last = last.map_or_else(String::new, |v| v.to_string()),
    );
    axes(html, top, plot.format, now_ms);
    for (at, leader) in changes {
        let who = leader.map_or_else(|| "no leader".to_owned(), |id| format!("node {id}"));
        let _ = write!(
            html,
            "<line class=\"leader-change\" x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{TOP}\" y2=\"{1:.1}\" \
             stroke=\"#c0392b\" stroke-dasharray=\"4 3\"><title>leader changed: {who}</title></line>",
            x(*at),
            TOP + inner_h,
        );
    }
    // A polyline per run of measured samples: an unmeasured interval is a gap.
    for run in plot.values.split(|(_, v)| v.is_none()) {
        let points: Vec<(f64, f64)> = run
            .iter()
            .filter_map(|(at, v)| v.map(|v| (x(*at), y(v))))
            .collect();
        match points.as_slice() {
            [] => {}
            [(cx, cy)] => {
                let _ = write!(
                    html,
                    "<circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"2\" fill=\"#2c6fbb\"/>"
                );
            }
            points => {
                html.push_str(
                    "<polyline fill=\"none\" stroke=\"#2c6fbb\" stroke-width=\"1.5\" points=\"",
                );
                for (px, py) in points {
                    let _ = write!(html, "{px:.1},{py:.1} ");
                }
                html.push_str("\"/>");
            }
        }
    }
    let _ = write!(
        html,
        "</svg><figcaption><b>{}</b> · now {} · peak {}</figcaption></figure>",
        escape(plot.title),
        last.map_or_else(|| "–".to_owned(), plot.format),
        (plot.format)(peak),
    );
}

/// The y axis (0, half, top) and the time axis (−15, −10, −5 min, and
/// now as a UTC time of day).
fn axes(html: &mut String, top: f64, format: fn(f64) -> String, now_ms: u64) {
    let (inner_w, inner_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    for (fraction, value) in [(0.0, 0.0), (0.5, top / 2.0), (1.0, top)] {
        let y = TOP + inner_h - fraction * inner_h;
        let _ = write!(
            html,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#e4e4e4\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555\">{}</text>",
            WIDTH - RIGHT,
            LEFT - 4.0,
            y + 3.0,
            escape(&format(value)),
        );
    }
    for (minutes, anchor) in [(15, "start"), (10, "middle"), (5, "middle"), (0, "end")] {
        let label = if minutes == 0 {
            // HH:MM:SS of the RFC 3339 time, in UTC.
            let now = palisade_names::time::rfc3339_ms(now_ms);
            format!("{} UTC", now.get(11..19).unwrap_or("now"))
        } else {
            format!("−{minutes} min")
        };
        let _ = write!(
            html,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"{anchor}\" fill=\"#555\">{label}</text>",
            LEFT + f64::from(15 - minutes) / 15.0 * inner_w,
            HEIGHT - 6.0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{ceiling, count, section, whole_ceiling};
    use crate::series::Sample;

    /// A count's axis reads whole numbers at the top and half-way (a top
    /// of 1 read `1/0/0`).
    #[test]
    fn a_count_axis_reads_whole_numbers() {
        for (peak, top) in [
            (0.0, 2.0),
            (1.0, 2.0),
            (3.0, 4.0),
            (5.0, 10.0),
            (11.0, 20.0),
            (400.0, 400.0),
        ] {
            assert_eq!(whole_ceiling(peak), top, "peak {peak}");
            let half = count(top / 2.0);
            assert_eq!(
                half.parse::<f64>().ok(),
                Some(top / 2.0),
                "peak {peak}: {half}"
            );
        }
    }

    #[test]
    fn the_axis_top_is_a_round_number_at_or_above_the_peak() {
        assert_eq!(ceiling(0.0), 1.0);
        assert_eq!(ceiling(f64::NAN), 1.0);
        assert_eq!(ceiling(1.5), 2.0);
        assert_eq!(ceiling(3.2), 5.0);
        assert_eq!(ceiling(7.0), 10.0);
        assert_eq!(ceiling(100.0), 100.0);
        assert_eq!(ceiling(4_321.0), 5_000.0);
    }

    #[test]
    fn charts_show_the_samples_gaps_and_leader_changes() {
        let now = 1_000_000_000;
        let sample = |ago_s: u64, renewals: f64, refused: Option<f64>, changed: bool| Sample {
            at_ms: now - ago_s * 1000,
            renewals,
            refused,
            held: 3,
            leader: Some(2),
            leader_changed: changed,
            ..Sample::default()
        };
        let samples = [
            sample(20, 10.0, Some(1.0), false),
            sample(15, 30.0, None, true),
            sample(10, 20.0, Some(2.0), false),
            sample(5, 40.0, Some(4.0), false),
        ];
        let mut html = String::new();
        section(&mut html, &samples, (1, 1), now);
        let svg = |id: &str| {
            let start = html.find(&format!("<svg id=\"{id}\"")).expect(id);
            let end = start + html[start..].find("</svg>").expect("end");
            html[start..end].to_owned()
        };
        let renewals = svg("plot-renewals");
        assert!(renewals.contains("data-points=\"4\" data-peak=\"40\" data-last=\"40\""));
        assert_eq!(renewals.matches("<polyline").count(), 1);
        // The unmeasured interval splits the refused writes in two runs: a
        // lone point, then a line.
        let refused = svg("plot-refused");
        assert!(refused.contains("data-points=\"3\""));
        assert_eq!(refused.matches("<circle").count(), 1);
        assert_eq!(refused.matches("<polyline").count(), 1);
        // One leader change, marked on every chart.
        assert_eq!(html.matches("class=\"leader-change\"").count(), 6);
        assert!(html.contains("leader changed: node 2"));
        assert!(html.contains("Renewals answered</b> · now 40.0/s · peak 40.0/s"));
    }
}
