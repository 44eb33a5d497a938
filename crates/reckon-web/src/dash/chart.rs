//! The overview's chart: unresolved count and oldest age per hour over 7 or 30 days, as
//! plain SVG numbers for `templates/chart.html` (no script, no inline style: the CSP
//! allows neither). Hours without a snapshot (reckon was down) break the line rather
//! than being drawn as zero.

use reckon_ledger::Snapshot;

pub const WIDTH: f64 = 720.0;
pub const HEIGHT: f64 = 200.0;
const LEFT: f64 = 48.0;
const RIGHT: f64 = 56.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 28.0;

#[derive(Debug, Clone)]
pub struct Chart {
    pub days: u32,
    /// SVG path data (`M x y L x y ...`) of the unresolved count, left axis.
    pub count_path: String,
    /// SVG path data of the oldest age in hours, right axis.
    pub age_path: String,
    pub max_count: i64,
    pub max_age_hours: f64,
    pub points: usize,
    /// Snapshots with no neighbour within the hour and a half (the first hour of a fresh
    /// ledger, or one hour between two gaps): a path through one point draws nothing, so
    /// these are drawn as dots.
    pub dots: Vec<Dot>,
    pub ticks: Vec<Tick>,
    /// A sentence for screen readers and for the table below the chart.
    pub summary: String,
    pub plot_left: f64,
    pub plot_right: f64,
    pub plot_top: f64,
    pub plot_bottom: f64,
}

#[derive(Debug, Clone)]
pub struct Dot {
    pub x: f64,
    /// The count's height (left axis) and the oldest age's (right axis).
    pub count_y: f64,
    pub age_y: f64,
}

#[derive(Debug, Clone)]
pub struct Tick {
    pub x: f64,
    pub label: String,
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if v <= m * mag {
            return m * mag;
        }
    }
    10.0 * mag
}

pub fn build(snapshots: &[Snapshot], now: f64, days: u32) -> Chart {
    let end = reckon_ledger::hour_of(now);
    let start = end - f64::from(days) * 86400.0;
    let span = (end - start).max(3600.0);
    let (x0, x1) = (LEFT, WIDTH - RIGHT);
    let (y0, y1) = (HEIGHT - BOTTOM, TOP);
    let in_range: Vec<&Snapshot> = snapshots
        .iter()
        .filter(|s| s.hour >= start && s.hour <= end)
        .collect();
    let max_count = nice_max(in_range.iter().map(|s| s.unresolved).max().unwrap_or(0) as f64);
    let age_h = |s: &Snapshot| {
        s.oldest_since
            .map_or(0.0, |o| ((s.hour - o) / 3600.0).max(0.0))
    };
    let max_age = nice_max(in_range.iter().map(|s| age_h(s)).fold(0.0, f64::max));
    let x = |t: f64| x0 + (t - start) / span * (x1 - x0);
    let mut count_path = String::new();
    let mut age_path = String::new();
    let mut dots = Vec::new();
    // A gap of more than an hour and a half starts a new segment.
    let near =
        |a: Option<&&Snapshot>, b: &Snapshot| a.is_some_and(|a| (b.hour - a.hour).abs() <= 5400.0);
    for (i, s) in in_range.iter().enumerate() {
        let joined = i > 0 && near(in_range.get(i - 1), s);
        let cmd = if joined { 'L' } else { 'M' };
        let cy = y0 - (s.unresolved as f64 / max_count) * (y0 - y1);
        let ay = y0 - (age_h(s) / max_age) * (y0 - y1);
        count_path.push_str(&format!("{cmd}{:.1} {:.1} ", x(s.hour), cy));
        age_path.push_str(&format!("{cmd}{:.1} {:.1} ", x(s.hour), ay));
        if !joined && !near(in_range.get(i + 1), s) {
            dots.push(Dot {
                x: (x(s.hour) * 10.0).round() / 10.0,
                count_y: (cy * 10.0).round() / 10.0,
                age_y: (ay * 10.0).round() / 10.0,
            });
        }
    }
    let step = if days <= 7 { 1 } else { 5 };
    let ticks = (0..=days)
        .step_by(step)
        .map(|d| {
            let t = start + f64::from(d) * 86400.0;
            Tick {
                x: x(t),
                label: jiff::Timestamp::from_second(t as i64)
                    .map(|ts| ts.strftime("%d %b").to_string())
                    .unwrap_or_default(),
            }
        })
        .collect();
    let summary = match in_range.last() {
        None => format!("No snapshots in the last {days} days yet."),
        Some(last) => format!(
            "Last {days} days: at most {} unresolved at once; now {} unresolved{}.",
            in_range.iter().map(|s| s.unresolved).max().unwrap_or(0),
            last.unresolved,
            match last.oldest_since {
                Some(o) => format!(", the oldest for {}", super::fmt::age(now - o)),
                None => String::new(),
            }
        ),
    };
    Chart {
        days,
        count_path: count_path.trim_end().to_owned(),
        age_path: age_path.trim_end().to_owned(),
        max_count: max_count as i64,
        max_age_hours: max_age,
        points: in_range.len(),
        dots,
        ticks,
        summary,
        plot_left: x0,
        plot_right: x1,
        plot_top: y1,
        plot_bottom: y0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(hour: f64, n: i64, oldest: Option<f64>) -> Snapshot {
        Snapshot {
            hour,
            unresolved: n,
            oldest_since: oldest,
            needs_attention: 0,
        }
    }

    #[test]
    fn a_missing_hour_breaks_the_line_and_old_snapshots_are_left_out() {
        let now = 100.0 * 86400.0;
        let h = reckon_ledger::hour_of(now);
        let s = [
            snap(h - 40.0 * 86400.0, 9, None), // older than 30 days
            snap(h - 7200.0, 4, Some(h - 7200.0 - 3600.0)),
            snap(h - 3600.0, 5, Some(h - 7200.0 - 3600.0)),
            snap(h, 2, Some(h - 1800.0)),
        ];
        let c = build(&s, now, 7);
        assert_eq!(c.points, 3);
        assert_eq!(c.count_path.matches('M').count(), 1);
        assert_eq!(c.count_path.matches('L').count(), 2);
        assert_eq!(c.max_count, 5);
        let gap = [snap(h - 5.0 * 3600.0, 1, None), snap(h, 1, None)];
        assert_eq!(build(&gap, now, 7).count_path.matches('M').count(), 2);
        // Each of those two hours stands alone: drawn as a dot, as a path through one
        // point draws nothing.
        assert_eq!(build(&gap, now, 7).dots.len(), 2);
        assert!(c.dots.is_empty(), "a joined line needs no dots");
        assert!(build(&s, now, 30).summary.contains("at most 5 unresolved"));
    }

    #[test]
    fn the_first_snapshot_of_a_fresh_ledger_is_a_dot_at_the_right_edge() {
        let now = 100.0 * 86400.0 + 1200.0;
        let h = reckon_ledger::hour_of(now);
        let c = build(&[snap(h, 6, Some(h - 20.0 * 3600.0))], now, 7);
        assert_eq!(c.points, 1);
        assert_eq!(c.dots.len(), 1);
        assert!((c.dots[0].x - c.plot_right).abs() < 0.1, "{:?}", c.dots);
        assert!(c.dots[0].count_y < c.plot_bottom, "{:?}", c.dots);
    }

    #[test]
    fn no_snapshots_is_said_in_words() {
        let c = build(&[], 1_000_000.0, 30);
        assert_eq!(c.points, 0);
        assert!(c.count_path.is_empty());
        assert_eq!(c.summary, "No snapshots in the last 30 days yet.");
    }
}
