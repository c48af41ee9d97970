//! Drawing `bufscope top`: a three-line header (exporter, `rmem_max`, probe health, sort,
//! filter, errors), the process table (only the rows on screen are built, so 1,000 processes
//! cost what 20 do) or one process's findings, and a key line. Columns that do not fit are
//! dropped in a fixed order (container, clamped, shrunk, locked) and the finding column takes
//! what is left, so an 80-column terminal keeps every number that matters.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row as TableRow, Table};

use super::app::{App, Mode, Row};
use bufscope_api::{Finding, ProbeRow, Severity, StatusDocument};

use super::data;

/// A table column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Col {
    Pid,
    Comm,
    Rate,
    Total,
    Locked,
    Shrunk,
    Clamped,
    Container,
    Finding,
}

impl Col {
    fn title(self) -> &'static str {
        match self {
            Col::Pid => "PID",
            Col::Comm => "COMM",
            Col::Rate => "DROPS/S",
            Col::Total => "DROPS",
            Col::Locked => "LOCKED",
            Col::Shrunk => "SHRUNK",
            Col::Clamped => "CLAMPED",
            Col::Container => "CONTAINER",
            Col::Finding => "TOP FINDING",
        }
    }

    fn width(self) -> u16 {
        match self {
            Col::Pid => 7,
            Col::Comm => 15,
            Col::Rate => 7,
            Col::Total => 9,
            Col::Locked => 6,
            Col::Shrunk => 6,
            Col::Clamped => 7,
            Col::Container => 12,
            Col::Finding => 14,
        }
    }

    fn right(self) -> bool {
        !matches!(self, Col::Comm | Col::Container | Col::Finding)
    }
}

/// Always shown (the finding column too, with what is left).
const REQUIRED: [Col; 4] = [Col::Pid, Col::Comm, Col::Rate, Col::Total];
/// Shown while they fit next to a finding column of its minimum width, in this order.
const OPTIONAL: [Col; 4] = [Col::Locked, Col::Shrunk, Col::Clamped, Col::Container];

/// The columns for a terminal `width` wide, with their widths, in screen order.
fn columns(width: u16) -> Vec<(Col, u16)> {
    let mut used: u16 = REQUIRED.iter().map(|c| c.width() + 1).sum();
    let mut shown: Vec<Col> = REQUIRED.to_vec();
    for c in OPTIONAL {
        if used + c.width() + 1 + Col::Finding.width() <= width {
            used += c.width() + 1;
            shown.push(c);
        }
    }
    let order = [
        Col::Pid,
        Col::Comm,
        Col::Rate,
        Col::Total,
        Col::Locked,
        Col::Shrunk,
        Col::Clamped,
        Col::Container,
    ];
    let mut out: Vec<(Col, u16)> = order
        .into_iter()
        .filter(|c| shown.contains(c))
        .map(|c| (c, c.width()))
        .collect();
    let rest = width.saturating_sub(used);
    if rest > 0 {
        out.push((Col::Finding, rest));
    }
    out
}

/// Display width of one character (as ratatui measures it).
fn char_width(c: char) -> usize {
    let mut buf = [0u8; 4];
    Span::raw(&*c.encode_utf8(&mut buf)).width()
}

/// Cuts `s` to `width` columns, ending in `…` when cut.
fn fit(s: &str, width: usize) -> String {
    if Span::raw(s).width() <= width {
        return s.to_string();
    }
    let mut out = String::new();
    let mut w = 0;
    for c in s.chars() {
        let cw = char_width(c);
        if w + cw + 1 > width {
            break;
        }
        w += cw;
        out.push(c);
    }
    if width > 0 {
        out.push('…');
    }
    out
}

/// A count in at most `width` characters: exact when it fits, else 12.3k / 4.5M / 6.7G.
pub fn count(n: u64, width: usize) -> String {
    let exact = n.to_string();
    if exact.len() <= width {
        return exact;
    }
    si(n as f64)
}

fn si(v: f64) -> String {
    for (div, unit) in [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")] {
        if v >= div {
            return format!("{:.1}{unit}", v / div);
        }
    }
    format!("{v:.0}")
}

/// A rate: `-` when unknown, one decimal below 10, whole numbers below 100k, else 123.4k.
pub fn rate(r: Option<f64>) -> String {
    match r {
        None => "-".into(),
        Some(r) if r < 0.05 => "0".into(),
        Some(r) if r < 10.0 => format!("{r:.1}"),
        Some(r) if r < 100_000.0 => format!("{r:.0}"),
        Some(r) => si(r),
    }
}

/// Bytes as KiB/MiB.
fn bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    } else {
        format!("{} KiB", n / 1024)
    }
}

fn severity_style(s: Severity) -> Style {
    match s {
        Severity::Critical => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        Severity::Warning => Style::new().fg(Color::Yellow),
        Severity::Info => Style::new().fg(Color::Cyan),
    }
}

/// Upper-case label (`CRITICAL`, `WARNING`, `INFO`).
fn severity_label(s: Severity) -> &'static str {
    match s {
        Severity::Critical => "CRITICAL",
        Severity::Warning => "WARNING",
        Severity::Info => "INFO",
    }
}

fn cell(col: Col, r: &Row, width: u16) -> Cell<'static> {
    let w = width as usize;
    let p = &r.proc;
    let text = match col {
        Col::Pid => {
            if p.pid.is_empty() {
                "-".to_string()
            } else {
                p.pid.clone()
            }
        }
        Col::Comm => p.comm.clone(),
        Col::Rate => rate(r.rate),
        Col::Total => count(p.drops_total, w),
        Col::Locked => count(p.rcvbuf_locks, w),
        Col::Shrunk => count(p.tcp_wscale_shrunk, w),
        Col::Clamped => count(p.clamped, w),
        Col::Container => {
            if !p.pod.is_empty() {
                // The pod says more than an id; the detail view has both.
                p.pod.clone()
            } else if p.container.is_empty() {
                "-".to_string()
            } else {
                p.container.chars().take(12).collect()
            }
        }
        Col::Finding => {
            let Some(f) = r.top_finding() else {
                return Cell::from("");
            };
            let more = r.findings.len() - 1;
            let s = if more > 0 {
                format!("{} +{more}", f.kind)
            } else {
                f.kind.clone()
            };
            return Cell::from(Span::styled(fit(&s, w), severity_style(f.severity)));
        }
    };
    let text = fit(&text, w);
    if col.right() {
        Cell::from(Line::from(text).right_aligned())
    } else {
        Cell::from(text)
    }
}

fn header_lines(app: &App, width: u16) -> Vec<Line<'static>> {
    let dim = Style::new().fg(Color::DarkGray);
    let bold = Style::new().add_modifier(Modifier::BOLD);
    let mut l0 = vec![
        Span::styled("bufscope top", bold),
        Span::raw(format!("  {}", app.url)),
    ];
    let mut l1 = Vec::new();
    match &app.snap {
        Some(s) => {
            let rmem_max = s
                .status
                .net_core_rmem_max
                .and_then(|v| u64::try_from(v).ok());
            l0.push(Span::raw(match rmem_max {
                Some(r) => format!("  rmem_max {r} ({})", bytes(r)),
                None => "  rmem_max ?".into(),
            }));
            l0.push(Span::raw(format!("  {} procs", app.rows.len())));
            let version = format!("  v{} kernel {}", s.status.version, s.status.kernel);
            let used: usize = l0.iter().map(Span::width).sum();
            if !s.status.version.is_empty() && used + version.len() <= width as usize {
                l0.push(Span::styled(version, dim));
            }
            l1 = probe_line(&s.status);
        }
        None => {
            l0.push(Span::raw("  rmem_max ?"));
            l1.push(Span::styled("probes: ? (no data yet)", dim));
        }
    }
    let l2 = if let Some(e) = &app.error {
        let mut t = format!("error: {e}; retrying");
        if let Some(u) = app.updated {
            t.push_str(&format!(
                " (data from {}s ago)",
                u.elapsed().as_secs().max(1)
            ));
        }
        Line::from(Span::styled(
            fit(&t, width as usize),
            Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        ))
    } else if app.snap.is_none() {
        Line::from(Span::styled(format!("connecting to {}…", app.url), dim))
    } else {
        let mut spans = vec![
            Span::raw("sort: "),
            Span::styled(app.sort.label(), bold),
            Span::raw("  filter: "),
        ];
        if app.filter.is_empty() {
            spans.push(Span::styled("none", dim));
        } else {
            spans.push(Span::styled(app.filter.clone(), bold));
        }
        spans.push(Span::raw(format!(
            "  {} of {} shown",
            app.view.len(),
            app.rows.len()
        )));
        if let Some(u) = app.updated
            && u.elapsed().as_secs() >= 3
        {
            spans.push(Span::styled(
                format!("  updated {}s ago", u.elapsed().as_secs()),
                Style::new().fg(Color::Yellow),
            ));
        }
        Line::from(spans)
    };
    vec![Line::from(l0), Line::from(l1), l2]
}

/// A probe switched off by configuration (`--probe.disable`, `--guard.mode off`), not a
/// failure.
fn switched_off(p: &ProbeRow) -> bool {
    !p.attached
        && p.error
            .as_deref()
            .is_some_and(|e| e == "disabled" || e.starts_with("off "))
}

fn probe_line(s: &StatusDocument) -> Vec<Span<'static>> {
    let up = s.probes.iter().filter(|p| p.attached).count();
    let wanted = s.probes.iter().filter(|p| !switched_off(p)).count();
    let mut spans = vec![Span::raw(format!("probes {up}/{wanted}:"))];
    for p in &s.probes {
        if p.attached {
            spans.push(Span::styled(
                format!(" {}", p.probe),
                Style::new().fg(Color::Green),
            ));
            // With --bpf.run-stats: what each run of its programs costs (kernel run time).
            if let Some(ns) = p.ns_per_run() {
                spans.push(Span::raw(format!(" {ns:.0}ns/run")));
            }
        } else if switched_off(p) {
            spans.push(Span::styled(
                format!(" {}:off", p.probe),
                Style::new().fg(Color::DarkGray),
            ));
        } else {
            let why = p.error.as_deref().unwrap_or("not attached");
            spans.push(Span::styled(
                format!(" {} FAILED ({why})", p.probe),
                Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
            ));
        }
    }
    spans
}

fn footer(app: &App) -> Line<'static> {
    let key = Style::new().add_modifier(Modifier::BOLD);
    let pairs: &[(&str, &str)] = if app.editing {
        return Line::from(vec![
            Span::styled("filter comm: ", key),
            Span::raw(format!("{}_", app.filter)),
            Span::raw("   Enter keep  Esc clear"),
        ]);
    } else if matches!(app.mode, Mode::Detail { .. }) {
        &[
            ("Esc", "back"),
            ("q", "quit"),
            ("Up/Down PgUp/PgDn Home/End", "scroll"),
        ]
    } else {
        &[
            ("q", "quit"),
            ("s", "sort"),
            ("/", "filter"),
            ("Enter", "findings"),
            ("Up/Down PgUp/PgDn Home/End", ""),
        ]
    };
    let mut spans = Vec::new();
    for (k, what) in pairs {
        spans.push(Span::styled(k.to_string(), key));
        if !what.is_empty() {
            spans.push(Span::raw(format!(" {what}")));
        }
        spans.push(Span::raw("  "));
    }
    Line::from(spans)
}

/// Draws the whole screen and tells `app` how many rows fit.
pub fn draw(f: &mut Frame, app: &mut App) {
    let area = f.area();
    let [head, body, foot] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(area);
    f.render_widget(Paragraph::new(header_lines(app, area.width)), head);
    f.render_widget(Paragraph::new(footer(app)), foot);
    if matches!(app.mode, Mode::Detail { .. }) {
        draw_detail(f, app, body);
    } else {
        draw_table(f, app, body);
    }
}

fn draw_table(f: &mut Frame, app: &mut App, area: Rect) {
    app.set_page(area.height.saturating_sub(1) as usize);
    let cols = columns(area.width);
    let head = TableRow::new(cols.iter().map(|(c, _)| {
        if c.right() {
            Cell::from(Line::from(c.title()).right_aligned())
        } else {
            Cell::from(c.title())
        }
    }))
    .style(Style::new().add_modifier(Modifier::REVERSED));
    let end = (app.offset + app.page).min(app.view.len());
    let rows: Vec<TableRow> = (app.offset..end)
        .map(|pos| {
            let r = &app.rows[app.view[pos]];
            let row = TableRow::new(cols.iter().map(|(c, w)| cell(*c, r, *w)));
            if pos == app.selected {
                row.style(Style::new().bg(Color::Blue).add_modifier(Modifier::BOLD))
            } else {
                row
            }
        })
        .collect();
    let empty = rows.is_empty();
    let widths: Vec<Constraint> = cols.iter().map(|(_, w)| Constraint::Length(*w)).collect();
    f.render_widget(
        Table::new(rows, widths).header(head).column_spacing(1),
        area,
    );
    if empty && app.snap.is_some() && area.height > 1 {
        let msg = if app.rows.is_empty() {
            "no processes with socket-buffer activity yet".to_string()
        } else {
            format!("no process name contains {:?}", app.filter)
        };
        let line = Rect {
            y: area.y + 1,
            height: 1,
            ..area
        };
        f.render_widget(
            Paragraph::new(Span::styled(msg, Style::new().fg(Color::DarkGray))),
            line,
        );
    }
}

/// Word-wraps `text` to `width`, the first line after `label`, the others indented to match.
fn wrapped(label: &str, text: &str, width: usize, style: Style) -> Vec<Line<'static>> {
    let indent = label.chars().count();
    let room = width.saturating_sub(indent).max(10);
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in text.split_whitespace() {
        let mut word = word.to_string();
        // Hard-break words longer than a line.
        while word.chars().count() > room {
            if !cur.is_empty() {
                lines.push(std::mem::take(&mut cur));
            }
            let head: String = word.chars().take(room).collect();
            word = word.chars().skip(room).collect();
            lines.push(head);
        }
        if cur.is_empty() {
            cur = word;
        } else if cur.chars().count() + 1 + word.chars().count() <= room {
            cur.push(' ');
            cur.push_str(&word);
        } else {
            lines.push(std::mem::replace(&mut cur, word));
        }
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    lines
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let lead = if i == 0 {
                label.to_string()
            } else {
                " ".repeat(indent)
            };
            Line::from(vec![
                Span::styled(lead, Style::new().fg(Color::DarkGray)),
                Span::styled(l, style),
            ])
        })
        .collect()
}

/// The lines of one process's detail view.
fn detail_lines(r: &Row, width: usize) -> Vec<Line<'static>> {
    let p = &r.proc;
    let bold = Style::new().add_modifier(Modifier::BOLD);
    let mut out = Vec::new();
    let pid = if p.pid.is_empty() { "-" } else { &p.pid };
    let container = if p.container.is_empty() {
        "host".to_string()
    } else {
        format!("container {}", p.container)
    };
    let container = if p.pod.is_empty() {
        container
    } else {
        format!(
            "pod {}/{} {}  {container}",
            p.namespace, p.pod, p.container_name
        )
    };
    out.push(Line::from(vec![
        Span::styled(p.comm.clone(), bold),
        Span::raw(format!(" (pid {pid})  {container}")),
    ]));
    let by: Vec<String> = data::drops_by(p)
        .into_iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let drops = if by.is_empty() {
        format!("{} total, {}/s", p.drops_total, rate(r.rate))
    } else {
        format!(
            "{} total, {}/s ({})",
            p.drops_total,
            rate(r.rate),
            by.join(", ")
        )
    };
    out.extend(wrapped("drops: ", &drops, width, Style::new()));
    out.extend(wrapped(
        "sockets: ",
        &format!(
            "{} locked, {} of {} TCP connections shrunk, {} clamped requests, {} setsockopt calls ({} failed), {} autotune grows suppressed",
            p.rcvbuf_locks,
            p.tcp_wscale_shrunk,
            p.tcp_established,
            p.clamped,
            p.setsockopt,
            p.failed,
            p.tcp_autotune_suppressed
        ),
        width,
        Style::new(),
    ));
    out.push(Line::from(""));
    if r.findings.is_empty() {
        out.push(Line::from(Span::styled(
            "No findings: no buffer problem observed for this process.",
            Style::new().fg(Color::Green),
        )));
    }
    for f in &r.findings {
        out.extend(finding_lines(f, width));
        out.push(Line::from(""));
    }
    out
}

fn finding_lines(f: &Finding, width: usize) -> Vec<Line<'static>> {
    let mut head = vec![
        Span::styled(severity_label(f.severity), severity_style(f.severity)),
        Span::raw("  "),
        Span::styled(f.kind.clone(), Style::new().add_modifier(Modifier::BOLD)),
    ];
    if let Some(v) = f.verdict {
        head.push(Span::raw(format!("  [{}]", v.as_str())));
    }
    if let Some(s) = &f.socket {
        head.push(Span::raw(format!(
            "  socket inode {} ({})",
            s.inode, s.proto
        )));
    }
    let mut out = vec![Line::from(head)];
    out.extend(wrapped("  what:  ", &f.summary, width, Style::new()));
    if let Some(st) = &f.story
        && !st.calls.is_empty()
    {
        out.extend(wrapped("  calls: ", &data::story(st), width, Style::new()));
    }
    for x in &f.fixes {
        let label = format!(
            "  {:<6} ",
            match x.scope.as_str() {
                "application" => "app:",
                "pod" => "pod:",
                _ => "host:",
            }
        );
        let cost = x
            .memory_bytes
            .map(|m| format!(" [up to {:.1} MiB]", m as f64 / f64::from(1u32 << 20)))
            .unwrap_or_default();
        let text = format!(
            "{}{}{cost}",
            if x.possible { "" } else { "(not from here) " },
            x.how
        );
        out.extend(wrapped(
            &label,
            &text,
            width,
            Style::new().fg(if x.possible {
                Color::Cyan
            } else {
                Color::DarkGray
            }),
        ));
    }
    if let Some(r) = &f.resolved {
        out.extend(wrapped(
            "  took:  ",
            &format!(
                "{}: {} B at {:.1} drops/s -> {} B at {:.1} drops/s",
                r.change,
                r.before.bytes,
                r.before.drops_per_second,
                r.after.bytes,
                r.after.drops_per_second
            ),
            width,
            Style::new().fg(Color::Green),
        ));
    }
    if f.fixes.is_empty() {
        out.extend(wrapped(
            "  fix:   ",
            &f.fix,
            width,
            Style::new().fg(Color::Cyan),
        ));
    }
    if let Some(g) = &f.guard {
        out.extend(wrapped("  guard: ", g, width, Style::new()));
    }
    if !f.evidence.is_empty() {
        out.extend(wrapped(
            "  data:  ",
            &data::evidence(f),
            width,
            Style::new(),
        ));
    }
    if !f.rule.is_empty() {
        out.extend(wrapped(
            "  why:   ",
            &f.rule,
            width,
            Style::new().fg(Color::DarkGray),
        ));
    }
    out
}

fn draw_detail(f: &mut Frame, app: &mut App, area: Rect) {
    let Mode::Detail { row, scroll, .. } = &app.mode else {
        return;
    };
    let lines = detail_lines(row, area.width as usize);
    let page = area.height as usize;
    let max = lines.len().saturating_sub(page);
    let start = (*scroll).min(max);
    let shown: Vec<Line> = lines.iter().skip(start).take(page).cloned().collect();
    let n = lines.len();
    f.render_widget(Paragraph::new(shown), area);
    app.detail_lines = max + 1;
    app.page = page.max(1);
    if let Mode::Detail { scroll, .. } = &mut app.mode {
        *scroll = start;
    }
    if n > page && area.width > 12 {
        let tag = format!(" {}-{}/{n} ", start + 1, (start + page).min(n));
        let w = tag.len() as u16;
        let r = Rect {
            x: area.x + area.width.saturating_sub(w),
            y: area.y,
            width: w.min(area.width),
            height: 1,
        };
        f.render_widget(
            Paragraph::new(Span::styled(
                tag,
                Style::new().add_modifier(Modifier::REVERSED),
            )),
            r,
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    use bufscope_api::{ProcessRef, ProcessRow, SocketRef};

    use super::super::app::{Sort, Update};
    use super::super::data::Snapshot;
    use super::*;

    fn screen(t: &Terminal<TestBackend>) -> Vec<String> {
        let b = t.backend().buffer();
        (0..b.area.height)
            .map(|y| {
                (0..b.area.width)
                    .map(|x| b[(x, y)].symbol().to_string())
                    .collect::<String>()
            })
            .collect()
    }

    fn finding(pid: u32, comm: &str, kind: &str, sev: Severity) -> Finding {
        Finding {
            process: ProcessRef {
                pid,
                comm: comm.into(),
                container: String::new(),
                ..ProcessRef::default()
            },
            kind: kind.into(),
            severity: sev,
            summary: "UDP socket dropping 862/s over the last 60s with an effective 8 KiB receive buffer".into(),
            fix: "request a 7.0 MiB receive buffer: SO_RCVBUFFORCE (with CAP_NET_ADMIN), else SO_RCVBUF with net.core.rmem_max >= 7340032 (now 212992); UDP has no autotuning".into(),
            guard: None,
            socket: Some(SocketRef {
                inode: 42,
                proto: "udp".into(),
                netns: 0,
            }),
            evidence: [("drops_total".to_string(), 2997.0)].into(),
            rule: "UDP 7 MiB rcv+snd".into(),
            ..Finding::default()
        }
    }

    /// 1,000 processes; process i drops 1000-i in total and i*3 per second.
    fn thousand(at: f64, step: u64) -> Update {
        let processes = (0..1000u32)
            .map(|i| ProcessRow {
                pid: (10_000 + i).to_string(),
                comm: format!("proc-{i:04}-with-a-long-name"),
                container: if i % 2 == 0 {
                    "0123456789abcdef0123".into()
                } else {
                    String::new()
                },
                drops_total: 1_000_000 + (1000 - i as u64) + step * i as u64 * 3,
                rcvbuf_locks: i as u64 % 7,
                tcp_wscale_shrunk: i as u64 % 5,
                clamped: i as u64 % 3,
                ..ProcessRow::default()
            })
            .collect();
        let probe = |name: &str, attached: bool, error: Option<&str>| ProbeRow {
            probe: name.into(),
            attached,
            error: error.map(str::to_string),
            ..ProbeRow::default()
        };
        Update::Data(Box::new(Snapshot {
            status: StatusDocument {
                generated_at: Some(at),
                version: "0.1.0".into(),
                kernel: "6.12.0".into(),
                net_core_rmem_max: Some(212992),
                tracked_processes: 1000,
                processes,
                probes: vec![
                    probe("drops", true, None),
                    probe("autotune", false, Some("disabled")),
                    probe("tcp_state", false, Some("EPERM")),
                ],
                ..StatusDocument::default()
            },
            findings: vec![
                finding(
                    10_999,
                    "proc-0999-with-a-long-name",
                    "udp_rcvbuf_drops",
                    Severity::Critical,
                ),
                finding(
                    10_999,
                    "proc-0999-with-a-long-name",
                    "rcvbuf_clamped",
                    Severity::Warning,
                ),
            ],
        }))
    }

    fn press(app: &mut App, code: KeyCode) {
        app.key(KeyEvent::new(code, KeyModifiers::NONE));
    }

    #[test]
    fn probe_line_shows_ns_per_run_when_the_exporter_has_run_stats() {
        let s = StatusDocument {
            probes: vec![
                ProbeRow {
                    probe: "drops".into(),
                    attached: true,
                    run_time_ns: Some(2_500_000),
                    run_count: Some(10_000),
                    ..ProbeRow::default()
                },
                ProbeRow {
                    probe: "owners".into(),
                    attached: true,
                    ..ProbeRow::default()
                },
            ],
            ..StatusDocument::default()
        };
        let text: String = probe_line(&s).iter().map(|x| x.content.as_ref()).collect();
        assert_eq!(text, "probes 2/2: drops 250ns/run owners");
    }

    #[test]
    fn thousand_processes_at_80x24() {
        let mut t = Terminal::new(TestBackend::new(80, 24)).unwrap();
        let mut app = App::new("http://127.0.0.1:9477");
        app.apply(thousand(100.0, 0), 0.0);
        app.apply(thousand(101.0, 1), 0.0);
        t.draw(|f| draw(f, &mut app)).unwrap();
        let s = screen(&t);
        assert!(
            s[0].contains("rmem_max 212992 (208 KiB)") && s[0].contains("1000 procs"),
            "{}",
            s[0]
        );
        assert!(
            s[1].contains("probes 1/2: drops autotune:off tcp_state FAILED (EPERM)"),
            "{}",
            s[1]
        );
        assert!(
            s[2].contains("sort: drops/s") && s[2].contains("1000 of 1000 shown"),
            "{}",
            s[2]
        );
        let head: Vec<&str> = s[3].split_whitespace().collect();
        assert_eq!(
            head,
            [
                "PID", "COMM", "DROPS/S", "DROPS", "LOCKED", "SHRUNK", "CLAMPED", "TOP", "FINDING"
            ],
            "80 columns: everything but the container"
        );
        // The fastest dropper first: pid 10999 drops 2997/s.
        let first: Vec<&str> = s[4].split_whitespace().collect();
        assert_eq!(&first[..4], ["10999", "proc-0999-with…", "2997", "1002998"]);
        assert_eq!(&first[4..7], ["5", "4", "0"], "999 % 7, % 5, % 3");
        assert_eq!(first[7], "udp_rcvbuf_drop…", "truncated to the room left");
        assert_eq!(s.len(), 24);
        assert!(
            s[23].contains("q quit") && s[23].contains("s sort"),
            "{}",
            s[23]
        );
        // 19 process rows fit: 24 - 3 header - 1 column header - 1 key line.
        assert_eq!(app.page, 19);
        assert!(s[22].trim_start().starts_with("10981"), "{}", s[22]);

        // End shows the last (slowest) process at the bottom, selected.
        press(&mut app, KeyCode::End);
        t.draw(|f| draw(f, &mut app)).unwrap();
        let s = screen(&t);
        assert!(s[22].trim_start().starts_with("10000"), "{}", s[22]);
        assert_eq!(app.selected, 999);
        press(&mut app, KeyCode::PageUp);
        press(&mut app, KeyCode::Up);
        t.draw(|f| draw(f, &mut app)).unwrap();
        let s = screen(&t);
        assert!(s[4].trim_start().starts_with("10020"), "{}", s[4]);
        assert_eq!(app.selected_row().unwrap().proc.pid, "10020");

        // Wider terminals get the container column.
        t.backend_mut().resize(120, 24);
        t.draw(|f| draw(f, &mut app)).unwrap();
        let s = screen(&t);
        assert!(s[3].contains("CONTAINER"), "{}", s[3]);
        assert!(
            s.iter().any(|l| l.contains("0123456789ab ")),
            "12 characters of the id"
        );
    }

    #[test]
    fn detail_shows_findings_and_fixes_wrapped() {
        let mut t = Terminal::new(TestBackend::new(80, 24)).unwrap();
        let mut app = App::new("http://127.0.0.1:9477");
        app.apply(thousand(100.0, 0), 0.0);
        app.apply(thousand(101.0, 1), 0.0);
        press(&mut app, KeyCode::Enter);
        t.draw(|f| draw(f, &mut app)).unwrap();
        let s = screen(&t);
        let body = s[3..23].join("\n");
        assert!(
            s[3].contains("proc-0999-with-a-long-name (pid 10999)"),
            "{body}"
        );
        assert!(
            body.contains("CRITICAL  udp_rcvbuf_drops  socket inode 42 (udp)"),
            "{body}"
        );
        assert!(body.contains("WARNING  rcvbuf_clamped"), "{body}");
        let flat = body.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(flat.contains("fix: request a 7.0 MiB receive buffer: SO_RCVBUFFORCE (with CAP_NET_ADMIN), else SO_RCVBUF with net.core.rmem_max >= 7340032 (now 212992); UDP has no autotuning"), "{body}");
        assert!(s[23].contains("Esc back"), "{}", s[23]);
        // Scrolling to the end and back.
        press(&mut app, KeyCode::End);
        t.draw(|f| draw(f, &mut app)).unwrap();
        let end = screen(&t);
        assert!(
            end[3..23].join("\n").contains("why:"),
            "the last lines are on screen"
        );
        press(&mut app, KeyCode::Home);
        press(&mut app, KeyCode::Esc);
        t.draw(|f| draw(f, &mut app)).unwrap();
        assert!(screen(&t)[3].contains("DROPS/S"));
    }

    #[test]
    fn errors_and_small_terminals() {
        let mut t = Terminal::new(TestBackend::new(80, 24)).unwrap();
        let mut app = App::new("http://127.0.0.1:1");
        t.draw(|f| draw(f, &mut app)).unwrap();
        assert!(screen(&t)[2].contains("connecting to http://127.0.0.1:1"));
        app.apply(
            Update::Error("connecting to http://127.0.0.1:1 (is `bufscope run` running there?): Connection refused (os error 111)".into()),
            0.0,
        );
        t.draw(|f| draw(f, &mut app)).unwrap();
        let s = screen(&t);
        assert!(
            s[2].starts_with("error: connecting to http://127.0.0.1:1"),
            "{}",
            s[2]
        );
        assert!(s[2].trim_end().ends_with('…'), "one line, cut: {}", s[2]);
        // Tiny terminals draw without panicking; sorting by every key works.
        app.apply(thousand(1.0, 0), 0.0);
        for (w, h) in [(20, 5), (1, 1), (40, 10), (200, 60)] {
            t.backend_mut().resize(w, h);
            for _ in 0..Sort::ALL.len() {
                press(&mut app, KeyCode::Char('s'));
                t.draw(|f| draw(f, &mut app)).unwrap();
            }
        }
    }

    #[test]
    fn every_severity_has_its_label() {
        let text = |sev| {
            finding_lines(&finding(1, "p", "tcp_rcvbuf_lock", sev), 80)[0]
                .spans
                .iter()
                .map(|s| s.content.to_string())
                .collect::<String>()
        };
        assert!(text(Severity::Critical).starts_with("CRITICAL  tcp_rcvbuf_lock"));
        assert!(text(Severity::Warning).starts_with("WARNING  tcp_rcvbuf_lock"));
        assert!(
            text(Severity::Info).starts_with("INFO  tcp_rcvbuf_lock  socket inode 42 (udp)"),
            "{}",
            text(Severity::Info)
        );
    }

    #[test]
    fn columns_and_numbers() {
        let names = |w| columns(w).into_iter().map(|(c, _)| c).collect::<Vec<_>>();
        assert!(!names(80).contains(&Col::Container));
        assert!(names(80).contains(&Col::Clamped));
        assert_eq!(columns(80).iter().map(|(_, w)| w + 1).sum::<u16>(), 81);
        assert_eq!(
            names(50),
            [Col::Pid, Col::Comm, Col::Rate, Col::Total, Col::Finding]
        );
        assert!(names(120).contains(&Col::Container));
        assert_eq!(count(123_456_789, 9), "123456789");
        assert_eq!(count(12_345_678_901, 9), "12.3G");
        assert_eq!(rate(Some(2.25)), "2.2");
        assert_eq!(rate(Some(862.4)), "862");
        assert_eq!(rate(Some(1_234_567.0)), "1.2M");
        assert_eq!(rate(None), "-");
        assert_eq!(fit("wireguard-go-long", 8), "wiregua…");
        assert_eq!(fit("abc", 3), "abc");
    }
}
