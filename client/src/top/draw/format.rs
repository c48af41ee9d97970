//! Numbers and severities as the table shows them: counts, SI rates, byte sizes, wrapped text.

use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};

use bufscope_api::Severity;

/// A count in at most `width` characters: exact when it fits, else 12.3k / 4.5M / 6.7G.
pub fn count(n: u64, width: usize) -> String {
    let exact = n.to_string();
    if exact.len() <= width {
        return exact;
    }
    si(n as f64)
}

pub(super) fn si(v: f64) -> String {
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
pub(super) fn bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    } else {
        format!("{} KiB", n / 1024)
    }
}

pub(super) fn severity_style(s: Severity) -> Style {
    match s {
        Severity::Critical => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        Severity::Warning => Style::new().fg(Color::Yellow),
        Severity::Info => Style::new().fg(Color::Cyan),
    }
}

/// Upper-case label (`CRITICAL`, `WARNING`, `INFO`).
pub(super) fn severity_label(s: Severity) -> &'static str {
    match s {
        Severity::Critical => "CRITICAL",
        Severity::Warning => "WARNING",
        Severity::Info => "INFO",
    }
}

/// Word-wraps `text` to `width`, the first line after `label`, the others indented to match.
pub(super) fn wrapped(label: &str, text: &str, width: usize, style: Style) -> Vec<Line<'static>> {
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
