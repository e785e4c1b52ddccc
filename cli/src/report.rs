//! `simulate --report`: a run as one self-contained HTML page.
//!
//! Everything is inline (SVG charts, one style sheet, no script), and the
//! page's Content-Security-Policy forbids loading anything, so it opens the
//! same from a mail attachment, an artifact store or a laptop without network.
//!
//! Per policy: every request over virtual time (allowed / denied), the
//! shadow rules' would-be denials of admitted requests, the most denied
//! clients, and each rule over virtual time. With `--compare`, two columns
//! share every axis, row by row (rules matched by name). Colours differ in lightness as well as hue, and denials are also
//! hatched, so the charts read the same printed in grey. Every name (rules,
//! files, phases, attribute values) is escaped.

use std::fmt::Write as _;
use std::path::Path;

use throttlegate::duration::format_duration;
use throttlegate::Policy;

use crate::error::{CliError, CliResult};
use crate::outcome::{algorithm_text, clock_text, pct, top_clients, Counts, Report};
use crate::traffic::Scenario;

/// The page: the traffic, then one column per policy.
pub(crate) struct Page<'a> {
    /// The traffic both policies saw.
    pub scenario: &'a Scenario,
    /// `memory` or `redis`.
    pub backend: &'a str,
    /// How many of the most denied clients to draw.
    pub top: usize,
    /// One or two policies.
    pub sides: Vec<Side<'a>>,
}

/// One policy's run.
pub(crate) struct Side<'a> {
    /// The policy file, as given.
    pub rules_file: String,
    pub policy: &'a Policy,
    pub report: &'a Report,
}

/// Write the page to `path`.
pub(crate) fn write(path: &Path, page: &Page) -> CliResult<()> {
    std::fs::write(path, render(page))
        .map_err(|e| CliError::usage(format!("cannot write --report {}: {e}", path.display())))
}

/// Text for HTML content and attribute values.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

// ---- look ------------------------------------------------------------------

/// Admitted requests: a light fill (reads as light grey).
const ALLOWED: &str = "#9ecae1";
/// Denied requests: a dark fill, hatched (reads as dark grey with stripes).
const DENIED: &str = "url(#tg-denied)";
/// A shadow rule's would-be denials: mid-dark, cross-hatched.
const WOULD_DENY: &str = "url(#tg-would-deny)";
/// Shadow rules' lines: dark to mid grey-safe colours, each with its own dash and marker.
const LINES: [(&str, &str); 4] = [
    ("#1b1b1b", ""),
    ("#b35806", "7 4"),
    ("#542788", "2 3"),
    ("#4d7f17", "10 3 2 3"),
];

const STYLE: &str = "\
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',Roboto,'Liberation Sans',Arial,sans-serif;color:#1b1b1b;background:#fff;margin:24px auto;padding:0 16px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:17px;margin:0 0 6px;word-break:break-all}h3{font-size:14px;margin:18px 0 2px}
.meta{color:#444;margin:0 0 16px}.meta li{margin:0}
.row{display:grid;gap:0 28px}
svg.chart{width:100%;height:auto;display:block}
svg text{font-family:inherit;fill:#1b1b1b}
.axis line,.axis path{stroke:#555;stroke-width:1}.grid line{stroke:#ddd;stroke-width:1}
.note{color:#555;margin:2px 0}
table{border-collapse:collapse;margin-top:8px;font-size:13px}th,td{padding:2px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}thead th{border-bottom:1px solid #999}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;margin:2px 0 0;padding:0;list-style:none;font-size:13px}
.legend li{display:flex;align-items:center;gap:6px}.legend svg{flex:none}";

/// Hatch patterns the charts refer to (one hidden SVG holds them for the page).
const DEFS: &str = "<svg width=\"0\" height=\"0\" style=\"position:absolute\" aria-hidden=\"true\"><defs>\
<pattern id=\"tg-denied\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" patternTransform=\"rotate(45)\">\
<rect width=\"6\" height=\"6\" fill=\"#b2182b\"/><rect width=\"2\" height=\"6\" fill=\"#5c0a14\"/></pattern>\
<pattern id=\"tg-would-deny\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\">\
<rect width=\"6\" height=\"6\" fill=\"#f4a582\"/><path d=\"M0 0L6 6M6 0L0 6\" stroke=\"#7f3b08\" stroke-width=\"1\"/></pattern>\
</defs></svg>";

// ---- scales ----------------------------------------------------------------

/// A round upper bound for `max` and its tick step (1, 2, 2.5 or 5 times a
/// power of ten, about five ticks).
fn nice(max: f64) -> (f64, f64) {
    if max <= 0.0 {
        return (1.0, 1.0);
    }
    let raw = max / 5.0;
    let p = 10f64.powf(raw.log10().floor());
    // 2.5 only where it keeps the ticks whole numbers.
    let steps: &[f64] = if p >= 10.0 {
        &[1.0, 2.0, 2.5, 5.0, 10.0]
    } else {
        &[1.0, 2.0, 5.0, 10.0]
    };
    let step = steps
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
        .max(1.0);
    ((max / step).ceil() * step, step)
}

fn number(v: f64) -> String {
    if v >= 1e6 && v % 1e5 == 0.0 {
        format!("{}M", v / 1e6)
    } else if v >= 1e4 && v % 1e3 == 0.0 {
        format!("{}k", v / 1e3)
    } else {
        format!("{v}")
    }
}

/// A time-series frame: intervals along x, requests per interval along y.
struct Frame {
    w: f64,
    h: f64,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    ymax: f64,
    step: f64,
    n: usize,
}

impl Frame {
    fn new(h: f64, n: usize, max: u64) -> Frame {
        let (ymax, step) = nice(max as f64);
        Frame {
            w: 560.0,
            h,
            left: 56.0,
            right: 24.0,
            top: 10.0,
            bottom: 40.0,
            ymax,
            step,
            n: n.max(1),
        }
    }
    fn plot_w(&self) -> f64 {
        self.w - self.left - self.right
    }
    fn x(&self, i: f64) -> f64 {
        self.left + i * self.plot_w() / self.n as f64
    }
    fn y(&self, v: f64) -> f64 {
        let ph = self.h - self.top - self.bottom;
        self.top + ph - v / self.ymax * ph
    }
    fn open(&self, out: &mut String, chart: &str, label: &str) {
        let _ = write!(
            out,
            "<svg class=\"chart\" data-chart=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\">",
            esc(chart),
            self.w,
            self.h,
            esc(label)
        );
    }
    /// Grid, y ticks, x ticks (virtual time) and both axis titles.
    fn axes(&self, out: &mut String, y_title: &str, interval_us: i64) {
        out.push_str("<g class=\"grid\">");
        let mut v = self.step;
        while v <= self.ymax + 1e-9 {
            let y = self.y(v);
            let _ = write!(
                out,
                "<line x1=\"{}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\"/>",
                self.left,
                self.w - self.right
            );
            v += self.step;
        }
        out.push_str("</g><g class=\"axis\">");
        let base = self.y(0.0);
        let _ = write!(
            out,
            "<path d=\"M{l} {t}V{b:.1}H{r}\" fill=\"none\"/>",
            l = self.left,
            t = self.top,
            b = base,
            r = self.w - self.right
        );
        let mut v = 0.0;
        while v <= self.ymax + 1e-9 {
            let y = self.y(v);
            let _ = write!(
                out,
                "<line x1=\"{}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"11\">{}</text>",
                self.left - 4.0,
                self.left,
                self.left - 6.0,
                y + 4.0,
                number(v)
            );
            v += self.step;
        }
        let every = self.n.div_ceil(6).max(1);
        let mut i = 0;
        while i <= self.n {
            let x = self.x(i as f64);
            let _ = write!(
                out,
                "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{base:.1}\" y2=\"{:.1}\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">{}</text>",
                base + 4.0,
                base + 15.0,
                clock_text(i as i64 * interval_us)
            );
            i += every;
        }
        out.push_str("</g>");
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">virtual time (h:mm:ss since the start)</text>",
            self.left + self.plot_w() / 2.0,
            self.h - 6.0
        );
        let mid = self.top + (self.h - self.top - self.bottom) / 2.0;
        let _ = write!(
            out,
            "<text transform=\"translate(13 {mid:.1}) rotate(-90)\" text-anchor=\"middle\" font-size=\"11\">{}</text>",
            esc(y_title)
        );
    }
}

/// A legend entry's swatch: a filled square or a dashed line with its marker.
fn swatch_fill(fill: &str) -> String {
    format!("<svg width=\"14\" height=\"14\" aria-hidden=\"true\"><rect width=\"14\" height=\"14\" fill=\"{fill}\" stroke=\"#555\" stroke-width=\"0.5\"/></svg>")
}

fn swatch_line(i: usize) -> String {
    let (colour, dash) = LINES[i % LINES.len()];
    format!(
        "<svg width=\"30\" height=\"14\" aria-hidden=\"true\"><line x1=\"1\" x2=\"29\" y1=\"7\" y2=\"7\" stroke=\"{colour}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\"/>{}</svg>",
        marker(i, 15.0, 7.0)
    )
}

/// Shadow line `i`'s marker at (x, y): circle, square, triangle, diamond.
fn marker(i: usize, x: f64, y: f64) -> String {
    let (colour, _) = LINES[i % LINES.len()];
    match (i / LINES.len() + i) % 4 {
        0 => format!("<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3\" fill=\"{colour}\"/>"),
        1 => format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"6\" height=\"6\" fill=\"{colour}\"/>",
            x - 3.0,
            y - 3.0
        ),
        2 => format!(
            "<path d=\"M{x:.1} {:.1}L{:.1} {:.1}H{:.1}Z\" fill=\"{colour}\"/>",
            y - 4.0,
            x + 4.0,
            y + 3.0,
            x - 4.0
        ),
        _ => format!(
            "<path d=\"M{x:.1} {:.1}L{:.1} {y:.1}L{x:.1} {:.1}L{:.1} {y:.1}Z\" fill=\"{colour}\"/>",
            y - 4.0,
            x + 4.0,
            y + 4.0,
            x - 4.0
        ),
    }
}

/// `text` cut to `max` characters, with an ellipsis when cut.
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max - 1).collect();
    s.push('…');
    s
}

fn legend(out: &mut String, chart: &str, entries: &[(String, String)]) {
    let _ = write!(out, "<ul class=\"legend\" data-legend=\"{}\">", esc(chart));
    for (swatch, label) in entries {
        let _ = write!(out, "<li>{swatch}<span>{}</span></li>", esc(label));
    }
    out.push_str("</ul>");
}

// ---- charts ----------------------------------------------------------------

/// Stacked bars per interval: allowed below, denied (or would-deny) above.
fn bars_chart(
    out: &mut String,
    height: f64,
    chart: &str,
    label: &str,
    counts: &[&Counts],
    max: u64,
    interval_us: i64,
    y_title: &str,
    denied_name: &str,
    denied_fill: &str,
) {
    let f = Frame::new(height, counts.len(), max);
    f.open(out, chart, label);
    f.axes(out, y_title, interval_us);
    let bw = f.plot_w() / f.n as f64;
    let gap = if bw > 6.0 { 1.0 } else { 0.0 };
    for (series, fill) in [("allowed", ALLOWED), (denied_name, denied_fill)] {
        let _ = write!(
            out,
            "<g class=\"series\" data-series=\"{}\" fill=\"{fill}\">",
            esc(series)
        );
        for (i, c) in counts.iter().enumerate() {
            let (low, high) = if series == "allowed" {
                (0, c.allowed)
            } else {
                (c.allowed, c.allowed + c.denied)
            };
            let (y0, y1) = (f.y(low as f64), f.y(high as f64));
            let _ = write!(
                out,
                "<rect x=\"{:.1}\" y=\"{y1:.1}\" width=\"{:.1}\" height=\"{:.1}\"><title>{}–{}: {} {}</title></rect>",
                f.x(i as f64) + gap / 2.0,
                (bw - gap).max(0.5),
                (y0 - y1).max(0.0),
                clock_text(i as i64 * interval_us),
                clock_text((i as i64 + 1) * interval_us),
                high - low,
                esc(series)
            );
        }
        out.push_str("</g>");
    }
    out.push_str("</svg>");
    legend(
        out,
        chart,
        &[
            (swatch_fill(ALLOWED), "allowed".into()),
            (swatch_fill(denied_fill), denied_name.into()),
        ],
    );
}

/// One line per shadow rule: would-be denials of requests the policy admitted.
fn shadow_chart(
    out: &mut String,
    side: &Side,
    shadows: &[usize],
    max: u64,
    interval_us: i64,
    y_title: &str,
) {
    let rules = side.policy.rules();
    let n = side.report.intervals.len();
    let f = Frame::new(190.0, n, max);
    f.open(
        out,
        "shadow",
        &format!("{}: shadow rules' would-be denials", side.rules_file),
    );
    f.axes(out, y_title, interval_us);
    let mut entries = Vec::new();
    for (k, &ri) in shadows.iter().enumerate() {
        let (colour, dash) = LINES[k % LINES.len()];
        let name = &rules[ri].name;
        let points: Vec<(f64, f64, u64)> = side
            .report
            .intervals
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let v = row.rules[ri].would_deny_admitted;
                (f.x(i as f64 + 0.5), f.y(v as f64), v)
            })
            .collect();
        let _ = write!(out, "<g class=\"series\" data-series=\"{}\">", esc(name));
        let path: Vec<String> = points
            .iter()
            .map(|(x, y, _)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = write!(
            out,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\"/>",
            path.join(" ")
        );
        // Markers on every point up to 40 of them, then on every few.
        let every = n.div_ceil(40).max(1);
        for (i, (x, y, v)) in points.iter().enumerate() {
            if i % every == 0 {
                let _ = write!(
                    out,
                    "<g>{}<title>{}, {}–{}: would deny {v}</title></g>",
                    marker(k, *x, *y),
                    esc(name),
                    clock_text(i as i64 * interval_us),
                    clock_text((i as i64 + 1) * interval_us)
                );
            }
        }
        out.push_str("</g>");
        entries.push((
            swatch_line(k),
            format!("{name} (shadow): would deny, of admitted requests"),
        ));
    }
    out.push_str("</svg>");
    legend(out, "shadow", &entries);
}

/// Horizontal bars: each of the most denied clients' requests, allowed then denied.
fn clients_chart(out: &mut String, side: &Side, scenario: &Scenario, top: usize, max: u64) {
    let clients = top_clients(side.report, top);
    let row = 36.0;
    let (left, right, top_pad) = (8.0, 24.0, 6.0);
    let h = top_pad + row * clients.len() as f64 + 34.0;
    let w = 560.0;
    let (xmax, step) = nice(max as f64);
    let pw = w - left - right;
    let x = |v: f64| left + v / xmax * pw;
    let _ = write!(
        out,
        "<svg class=\"chart\" data-chart=\"clients\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"{}: most denied clients\">",
        esc(&side.rules_file)
    );
    let base = top_pad + row * clients.len() as f64;
    out.push_str("<g class=\"grid\">");
    let mut v = step;
    while v <= xmax + 1e-9 {
        let _ = write!(
            out,
            "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{top_pad}\" y2=\"{base:.1}\"/>",
            x(v)
        );
        v += step;
    }
    out.push_str("</g>");
    let multi = scenario.phases.len() > 1;
    let labels: Vec<String> = clients
        .iter()
        .map(|((pi, client), c)| {
            let who = if c.label.is_empty() {
                format!("client {client}")
            } else {
                c.label.clone()
            };
            if multi {
                format!("{who} in “{}”", scenario.phases[*pi].name)
            } else {
                who
            }
        })
        .collect();
    for (series, fill) in [("allowed", ALLOWED), ("denied", DENIED)] {
        let _ = write!(
            out,
            "<g class=\"series\" data-series=\"{series}\" fill=\"{fill}\">"
        );
        for (i, (_, c)) in clients.iter().enumerate() {
            let allowed = c.requests - c.denied;
            let (a, b) = if series == "allowed" {
                (0, allowed)
            } else {
                (allowed, c.requests)
            };
            let y = top_pad + row * i as f64 + 17.0;
            let _ = write!(
                out,
                "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"14\"><title>{}: {} {series}</title></rect>",
                x(a as f64),
                (x(b as f64) - x(a as f64)).max(0.0),
                esc(&labels[i]),
                b - a
            );
        }
        out.push_str("</g>");
    }
    for (i, (_, c)) in clients.iter().enumerate() {
        let y = top_pad + row * i as f64 + 13.0;
        let _ = write!(
            out,
            "<text x=\"{left}\" y=\"{y:.1}\" font-size=\"11\">{}<title>{}</title></text><text x=\"{:.1}\" y=\"{y:.1}\" font-size=\"11\" text-anchor=\"end\">{} of {} denied ({})</text>",
            esc(&shorten(&labels[i], 56)),
            esc(&labels[i]),
            w - right,
            c.denied,
            c.requests,
            pct(c.denied, c.requests)
        );
    }
    let _ = write!(
        out,
        "<g class=\"axis\"><path d=\"M{left} {base:.1}H{:.1}\" fill=\"none\"/>",
        w - right
    );
    let mut v = 0.0;
    while v <= xmax + 1e-9 {
        let _ = write!(
            out,
            "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{base:.1}\" y2=\"{1:.1}\"/><text x=\"{0:.1}\" y=\"{2:.1}\" text-anchor=\"middle\" font-size=\"11\">{3}</text>",
            x(v),
            base + 4.0,
            base + 15.0,
            number(v)
        );
        v += step;
    }
    let _ = write!(
        out,
        "</g><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">requests over the whole run</text></svg>",
        left + pw / 2.0,
        h - 4.0
    );
    legend(
        out,
        "clients",
        &[
            (swatch_fill(ALLOWED), "allowed".into()),
            (swatch_fill(DENIED), "denied".into()),
        ],
    );
}

/// Shared maxima, so that both columns of a comparison read on the same axes.
struct Scales {
    total: u64,
    rule: u64,
    shadow: u64,
    clients: u64,
}

fn scales(page: &Page) -> Scales {
    let mut s = Scales {
        total: 0,
        rule: 0,
        shadow: 0,
        clients: 0,
    };
    for side in &page.sides {
        let shadow: Vec<bool> = side.policy.rules().iter().map(|r| r.shadow).collect();
        for row in &side.report.intervals {
            s.total = s.total.max(row.total.allowed + row.total.denied);
            for (c, sh) in row.rules.iter().zip(&shadow) {
                s.rule = s.rule.max(c.allowed + c.denied);
                if *sh {
                    s.shadow = s.shadow.max(c.would_deny_admitted);
                }
            }
        }
        for (_, c) in top_clients(side.report, page.top) {
            s.clients = s.clients.max(c.requests);
        }
    }
    s
}

/// One row of the page: a cell per policy, so that both columns of a
/// comparison line up section by section.
fn row(out: &mut String, page: &Page, mut cell: impl FnMut(&mut String, &Side)) {
    out.push_str("<div class=\"row\">");
    for side in &page.sides {
        let _ = write!(
            out,
            "<div class=\"cell\" data-policy=\"{}\">",
            esc(&side.rules_file)
        );
        cell(out, side);
        out.push_str("</div>");
    }
    out.push_str("</div>");
}

/// Every rule name of the page, in the first policy's order, then the second's new ones.
fn rule_names(page: &Page) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for side in &page.sides {
        for r in side.policy.rules() {
            if !names.contains(&r.name) {
                names.push(r.name.clone());
            }
        }
    }
    names
}

fn per_interval(report: &Report) -> String {
    format!("requests per {}", format_duration(report.interval))
}

fn header_cell(out: &mut String, side: &Side) {
    let report = side.report;
    let requests = report.total.allowed + report.total.denied;
    let _ = write!(
        out,
        "<h2>{}</h2><p class=\"note\">{requests} requests: {} allowed ({}), {} denied ({})</p>",
        esc(&side.rules_file),
        report.total.allowed,
        pct(report.total.allowed, requests),
        report.total.denied,
        pct(report.total.denied, requests)
    );
}

fn total_cell(out: &mut String, side: &Side, scales: &Scales) {
    let report = side.report;
    out.push_str("<h3>Every request</h3>");
    let totals: Vec<&Counts> = report.intervals.iter().map(|r| &r.total).collect();
    bars_chart(
        out,
        170.0,
        "total",
        &format!("{}: every request", side.rules_file),
        &totals,
        scales.total,
        report.interval.as_micros() as i64,
        &per_interval(report),
        "denied",
        DENIED,
    );
}

fn shadow_cell(out: &mut String, side: &Side, scales: &Scales) {
    let report = side.report;
    let rules = side.policy.rules();
    let requests = report.total.allowed + report.total.denied;
    out.push_str("<h3>Shadow rules: would-be denials of admitted requests</h3>");
    let shadows: Vec<usize> = rules
        .iter()
        .enumerate()
        .filter(|(_, r)| r.shadow)
        .map(|(i, _)| i)
        .collect();
    if shadows.is_empty() {
        out.push_str("<p class=\"note\">This policy has no shadow rule.</p>");
        return;
    }
    for &i in &shadows {
        let t = &report.rules[i];
        let _ = write!(
            out,
            "<p class=\"note\">{} would have denied {} admitted request(s), {} of all requests.</p>",
            esc(&rules[i].name),
            t.would_deny_admitted,
            pct(t.would_deny_admitted, requests)
        );
    }
    shadow_chart(
        out,
        side,
        &shadows,
        scales.shadow,
        report.interval.as_micros() as i64,
        &per_interval(report),
    );
}

fn clients_cell(out: &mut String, page: &Page, side: &Side, scales: &Scales) {
    out.push_str("<h3>Most denied clients</h3>");
    if top_clients(side.report, page.top).is_empty() {
        out.push_str("<p class=\"note\">No client was denied.</p>");
    } else {
        clients_chart(out, side, page.scenario, page.top, scales.clients);
    }
}

fn rule_cell(out: &mut String, side: &Side, name: &str, scales: &Scales) {
    let report = side.report;
    let Some(i) = side.policy.rules().iter().position(|r| r.name == name) else {
        let _ = write!(
            out,
            "<h3>Rule {}</h3><p class=\"note\">Not in this policy.</p>",
            esc(name)
        );
        return;
    };
    let rule = &side.policy.rules()[i];
    let title = if rule.shadow {
        format!("{name} (shadow: reported, not enforced)")
    } else {
        name.to_string()
    };
    let t = &report.rules[i];
    let _ = write!(
        out,
        "<h3>Rule {}</h3><p class=\"note\">{} · applied to {} · denied {} ({})</p>",
        esc(&title),
        esc(&algorithm_text(&rule.algorithm)),
        t.applied,
        t.denied,
        pct(t.denied, t.applied)
    );
    let counts: Vec<&Counts> = report.intervals.iter().map(|r| &r.rules[i]).collect();
    let (denied, fill) = if rule.shadow {
        ("would deny", WOULD_DENY)
    } else {
        ("denied", DENIED)
    };
    bars_chart(
        out,
        140.0,
        &format!("rule:{name}"),
        &format!("{}: rule {title}", side.rules_file),
        &counts,
        scales.rule,
        report.interval.as_micros() as i64,
        &per_interval(report),
        denied,
        fill,
    );
}

fn table_cell(out: &mut String, side: &Side) {
    out.push_str("<h3>Rules</h3><table><thead><tr><th>rule</th><th>limit</th><th>applied</th><th>allowed</th><th>denied</th><th>denied %</th><th>decided denials</th></tr></thead><tbody>");
    for (r, t) in side.policy.rules().iter().zip(&side.report.rules) {
        let name = if r.shadow {
            format!("{} (shadow)", r.name)
        } else {
            r.name.clone()
        };
        let caused = if r.shadow {
            "-".to_string()
        } else {
            t.caused.to_string()
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{caused}</td></tr>",
            esc(&name),
            esc(&algorithm_text(&r.algorithm)),
            t.applied,
            t.allowed,
            t.denied,
            pct(t.denied, t.applied)
        );
    }
    out.push_str("</tbody></table><p class=\"note\">Decided denials: the rule was the most restrictive one, whose Retry-After was sent.</p>");
}

/// The whole page.
pub(crate) fn render(page: &Page) -> String {
    let files: Vec<String> = page.sides.iter().map(|s| s.rules_file.clone()).collect();
    let title = format!("throttlegate simulate: {}", files.join(" compared with "));
    let cols = page.sides.len().max(1);
    let width = if cols > 1 { 1240 } else { 820 };
    let mut out = String::with_capacity(64 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{}</title>\
<style>{STYLE}body{{max-width:{width}px}}.row{{grid-template-columns:repeat({cols},minmax(0,1fr))}}</style></head><body>{DEFS}",
        esc(&title)
    );
    let sc = page.scenario;
    let _ = write!(
        out,
        "<h1>{}</h1><ul class=\"meta\"><li>{} of virtual time on the {} backend, seed {}; one bar per {}</li>",
        esc(&title),
        format_duration(sc.duration()),
        if page.backend == "memory" { "embedded (in-memory)" } else { page.backend },
        sc.seed,
        format_duration(page.sides.first().map(|s| s.report.interval).unwrap_or_default())
    );
    for p in &sc.phases {
        let attrs: Vec<String> = p
            .attributes
            .iter()
            .map(|(k, t)| format!("{k}={}", t.describe()))
            .collect();
        let _ = write!(
            out,
            "<li>phase “{}”: {} at {} req/s, {} clients (skew {}), burst {}, cost {}; {}</li>",
            esc(&p.name),
            format_duration(p.duration),
            p.rate,
            p.clients,
            p.skew,
            p.burst,
            p.cost,
            esc(&attrs.join(" "))
        );
    }
    out.push_str("<li>A request passes only when every rule that applies allows it, and only then counts against all of them.</li></ul>");
    let scales = scales(page);
    row(&mut out, page, header_cell);
    row(&mut out, page, |o, side| total_cell(o, side, &scales));
    row(&mut out, page, |o, side| shadow_cell(o, side, &scales));
    row(&mut out, page, |o, side| {
        clients_cell(o, page, side, &scales)
    });
    for name in rule_names(page) {
        row(&mut out, page, |o, side| rule_cell(o, side, &name, &scales));
    }
    row(&mut out, page, table_cell);
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped() {
        assert_eq!(
            esc("<a href=\"x\">&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn axes_end_on_round_numbers() {
        assert_eq!(nice(0.0), (1.0, 1.0));
        assert_eq!(nice(3.0), (3.0, 1.0));
        assert_eq!(nice(93.0), (100.0, 20.0));
        assert_eq!(nice(1234.0), (1250.0, 250.0));
        assert_eq!(number(20000.0), "20k");
        assert_eq!(number(250.0), "250");
    }
}
