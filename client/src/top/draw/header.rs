//! The three header lines (exporter, `rmem_max`, probe health, sort, filter, errors) and the
//! key line.

use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};

use crate::top::app::{App, Mode};
use bufscope_api::{ProbeRow, StatusDocument};

use super::*;

pub(super) fn header_lines(app: &App, width: u16) -> Vec<Line<'static>> {
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
pub(super) fn switched_off(p: &ProbeRow) -> bool {
    !p.attached
        && p.error
            .as_deref()
            .is_some_and(|e| e == "disabled" || e.starts_with("off "))
}

pub(super) fn probe_line(s: &StatusDocument) -> Vec<Span<'static>> {
    let up = s.probes.iter().filter(|p| p.attached).count();
    let wanted = s.probes.iter().filter(|p| !switched_off(p)).count();
    let mut spans = vec![Span::raw(format!("probes {up}/{wanted}:"))];
    // Failed probes first, switched-off ones last: on a narrow terminal what is cut is what
    // was meant to be off.
    let rank = |p: &&ProbeRow| match (p.attached, switched_off(p)) {
        (false, false) => 0,
        (true, _) => 1,
        (false, true) => 2,
    };
    let mut probes: Vec<_> = s.probes.iter().collect();
    probes.sort_by_key(rank);
    for p in probes {
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

pub(super) fn footer(app: &App) -> Line<'static> {
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
