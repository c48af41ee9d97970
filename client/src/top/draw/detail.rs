//! One process's view: its counters and its findings, wrapped to the screen.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use crate::top::app::{App, Mode, Row};
use bufscope_api::Finding;

use crate::top::data;

use super::*;

/// The lines of one process's detail view.
pub(super) fn detail_lines(r: &Row, width: usize) -> Vec<Line<'static>> {
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

pub(super) fn finding_lines(f: &Finding, width: usize) -> Vec<Line<'static>> {
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

pub(super) fn draw_detail(f: &mut Frame, app: &mut App, area: Rect) {
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
