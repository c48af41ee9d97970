//! Drawing `bufscope top`: a three-line header (exporter, `rmem_max`, probe health, sort,
//! filter, errors), the process table (only the rows on screen are built, so 1,000 processes
//! cost what 20 do) or one process's findings, and a key line. Columns that do not fit are
//! dropped in a fixed order (container, clamped, shrunk, locked) and the finding column takes
//! what is left, so an 80-column terminal keeps every number that matters.

mod columns;
mod detail;
mod format;
mod header;
#[cfg(test)]
mod tests;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row as TableRow, Table};

use crate::top::app::{App, Mode};

use columns::*;
use detail::*;
use format::*;
use header::*;

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

pub(super) fn draw_table(f: &mut Frame, app: &mut App, area: Rect) {
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
