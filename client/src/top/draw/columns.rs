//! The table's columns: which fit the terminal (dropped in a fixed order), their widths and
//! one cell of each.

use ratatui::text::{Line, Span};
use ratatui::widgets::Cell;

use crate::top::app::Row;

use super::*;

/// A table column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Col {
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
    pub(super) fn title(self) -> &'static str {
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

    pub(super) fn width(self) -> u16 {
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

    pub(super) fn right(self) -> bool {
        !matches!(self, Col::Comm | Col::Container | Col::Finding)
    }
}

/// Always shown (the finding column too, with what is left).
pub(super) const REQUIRED: [Col; 4] = [Col::Pid, Col::Comm, Col::Rate, Col::Total];

/// Shown while they fit next to a finding column of its minimum width, in this order.
pub(super) const OPTIONAL: [Col; 4] = [Col::Locked, Col::Shrunk, Col::Clamped, Col::Container];

/// The columns for a terminal `width` wide, with their widths, in screen order.
pub(super) fn columns(width: u16) -> Vec<(Col, u16)> {
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
pub(super) fn char_width(c: char) -> usize {
    let mut buf = [0u8; 4];
    Span::raw(&*c.encode_utf8(&mut buf)).width()
}

/// Cuts `s` to `width` columns, ending in `…` when cut.
pub(super) fn fit(s: &str, width: usize) -> String {
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

pub(super) fn cell(col: Col, r: &Row, width: u16) -> Cell<'static> {
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
