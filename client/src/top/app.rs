//! The state of `bufscope top`: the latest snapshot, drop rates from successive polls, the
//! sorted and filtered view, the selection and scrolling, and what each key does.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::time::Instant;

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use bufscope_api::{Finding, ProcessRow};

use super::data::Snapshot;

/// Identifies a process across polls (a reused pid with another name is another process).
pub type Key = (String, String);

/// The sort orders `s` cycles through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sort {
    /// Drops per second, highest first (then total drops).
    DropRate,
    /// Total drops.
    Drops,
    /// Locked sockets.
    Locked,
    /// Shrunken connections.
    Shrunk,
    /// Clamped requests.
    Clamped,
    /// Process name, A to Z.
    Comm,
    /// Process id, ascending.
    Pid,
}

impl Sort {
    /// Every order, in cycling order.
    pub const ALL: [Sort; 7] = [
        Sort::DropRate,
        Sort::Drops,
        Sort::Locked,
        Sort::Shrunk,
        Sort::Clamped,
        Sort::Comm,
        Sort::Pid,
    ];

    /// How the header names it.
    pub fn label(self) -> &'static str {
        match self {
            Sort::DropRate => "drops/s",
            Sort::Drops => "total drops",
            Sort::Locked => "locked sockets",
            Sort::Shrunk => "shrunken conns",
            Sort::Clamped => "clamped requests",
            Sort::Comm => "comm",
            Sort::Pid => "pid",
        }
    }

    fn next(self) -> Sort {
        let i = Sort::ALL.iter().position(|s| *s == self).unwrap_or(0);
        Sort::ALL[(i + 1) % Sort::ALL.len()]
    }
}

/// The order of two rows under `sort`; ties go to the higher drop rate, the higher total,
/// then the lower pid.
fn compare(sort: Sort, a: &Row, b: &Row) -> Ordering {
    let rate = |r: &Row| r.rate.unwrap_or(0.0);
    let pid = |r: &Row| r.proc.pid_number().map_or(u64::MAX, u64::from);
    let by_rate = || {
        rate(b)
            .total_cmp(&rate(a))
            .then_with(|| b.proc.drops_total.cmp(&a.proc.drops_total))
    };
    let desc = |f: fn(&ProcessRow) -> u64| f(&b.proc).cmp(&f(&a.proc)).then_with(by_rate);
    match sort {
        Sort::DropRate => by_rate(),
        Sort::Drops => desc(|p| p.drops_total),
        Sort::Locked => desc(|p| p.rcvbuf_locks),
        Sort::Shrunk => desc(|p| p.tcp_wscale_shrunk),
        Sort::Clamped => desc(|p| p.clamped),
        Sort::Comm => a.proc.comm.cmp(&b.proc.comm),
        Sort::Pid => Ordering::Equal,
    }
    .then_with(|| pid(a).cmp(&pid(b)))
    .then_with(|| a.proc.comm.cmp(&b.proc.comm))
}

/// A process as shown: its counters, its drop rate and its findings.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Its row of the status document.
    pub proc: ProcessRow,
    /// Drops per second since the previous poll (None on first sight).
    pub rate: Option<f64>,
    /// Its findings (most severe first).
    pub findings: Vec<Finding>,
}

impl Row {
    /// Its identity across polls.
    pub fn key(&self) -> Key {
        (self.proc.pid.clone(), self.proc.comm.clone())
    }

    /// The most severe finding.
    pub fn top_finding(&self) -> Option<&Finding> {
        self.findings.first()
    }
}

/// What the screen shows.
#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    /// The process table.
    List,
    /// One process's findings and fixes.
    Detail {
        /// The process.
        key: Key,
        /// Its last known row (kept when it leaves the exporter's table).
        row: Box<Row>,
        /// First line shown.
        scroll: usize,
    },
}

/// An update from the poller.
#[derive(Debug)]
pub enum Update {
    /// Both documents read.
    Data(Box<Snapshot>),
    /// A read failed (one line).
    Error(String),
}

/// The whole state.
pub struct App {
    /// The exporter's URL (for the header).
    pub url: String,
    /// The latest good snapshot (its findings are also in the rows).
    pub snap: Option<Snapshot>,
    /// All rows of the latest snapshot, unsorted.
    pub rows: Vec<Row>,
    /// Indices into `rows`: filtered and sorted.
    pub view: Vec<usize>,
    /// Sort order.
    pub sort: Sort,
    /// Comm filter (case-insensitive substring; empty: none).
    pub filter: String,
    /// The filter is being typed.
    pub editing: bool,
    /// List or detail.
    pub mode: Mode,
    /// Selected position in `view`.
    pub selected: usize,
    /// First position of `view` shown.
    pub offset: usize,
    /// Rows that fit on the screen (set when drawing).
    pub page: usize,
    /// Lines of the detail view (set when drawing).
    pub detail_lines: usize,
    /// The last read's error, while reads fail.
    pub error: Option<String>,
    /// When the last good snapshot arrived.
    pub updated: Option<Instant>,
    /// Reads so far (good or not).
    pub polls: u64,
    /// `q` was pressed.
    pub quit: bool,
    /// Previous totals per process: (drops, time in seconds).
    prev: HashMap<Key, (u64, f64)>,
    selected_key: Option<Key>,
}

impl App {
    /// An empty state for the exporter at `url`.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_string(),
            snap: None,
            rows: Vec::new(),
            view: Vec::new(),
            sort: Sort::DropRate,
            filter: String::new(),
            editing: false,
            mode: Mode::List,
            selected: 0,
            offset: 0,
            page: 1,
            detail_lines: 0,
            error: None,
            updated: None,
            polls: 0,
            quit: false,
            prev: HashMap::new(),
            selected_key: None,
        }
    }

    /// Applies a poll result; `now` (Unix seconds) times the rates when the document has no
    /// `generated_at`.
    pub fn apply(&mut self, update: Update, now: f64) {
        self.polls += 1;
        match update {
            Update::Error(e) => self.error = Some(e),
            Update::Data(snap) => {
                self.error = None;
                self.updated = Some(Instant::now());
                self.set_snapshot(*snap, now);
            }
        }
    }

    fn set_snapshot(&mut self, mut snap: Snapshot, now: f64) {
        let t = snap.status.generated_at.unwrap_or(now);
        let mut by_pid: HashMap<(u32, String), Vec<Finding>> = HashMap::new();
        for f in &snap.findings {
            by_pid
                .entry((f.process.pid, f.process.comm.clone()))
                .or_default()
                .push(f.clone());
        }
        let mut prev = HashMap::with_capacity(snap.status.processes.len());
        let rows: Vec<Row> = std::mem::take(&mut snap.status.processes)
            .into_iter()
            .map(|p| {
                let key = (p.pid.clone(), p.comm.clone());
                let rate = self.prev.get(&key).and_then(|(total, at)| {
                    let dt = t - at;
                    (dt > 0.0 && p.drops_total >= *total)
                        .then(|| (p.drops_total - total) as f64 / dt)
                });
                let entry = (p.drops_total, t);
                let mut findings = p
                    .pid_number()
                    .and_then(|pid| by_pid.remove(&(pid, p.comm.clone())))
                    .unwrap_or_default();
                findings.sort_by_key(|f| f.severity);
                prev.insert(key, entry);
                Row {
                    proc: p,
                    rate,
                    findings,
                }
            })
            .collect();
        self.prev = prev;
        self.rows = rows;
        if let Mode::Detail { key, row, .. } = &mut self.mode
            && let Some(r) = self.rows.iter().find(|r| r.key() == *key)
        {
            **row = r.clone();
        }
        self.snap = Some(snap);
        // A refresh keeps the cursor where it is (the rows move under it, as in top(1)); a new
        // sort or filter keeps the selected process selected.
        self.selected_key = None;
        self.rebuild();
    }

    /// Re-filters and re-sorts, keeping the selected process selected (the position when no
    /// process is remembered).
    pub fn rebuild(&mut self) {
        let needle = self.filter.to_lowercase();
        let mut view: Vec<usize> = (0..self.rows.len())
            .filter(|&i| {
                needle.is_empty() || self.rows[i].proc.comm.to_lowercase().contains(&needle)
            })
            .collect();
        let (rows, sort) = (&self.rows, self.sort);
        view.sort_by(|&a, &b| compare(sort, &rows[a], &rows[b]));
        self.view = view;
        let found = self
            .selected_key
            .as_ref()
            .and_then(|k| self.view.iter().position(|&i| self.rows[i].key() == *k));
        self.selected = found.unwrap_or(self.selected);
        self.clamp();
    }

    /// The selected row.
    pub fn selected_row(&self) -> Option<&Row> {
        self.view.get(self.selected).map(|&i| &self.rows[i])
    }

    fn clamp(&mut self) {
        self.selected = self.selected.min(self.view.len().saturating_sub(1));
        self.selected_key = self.selected_row().map(Row::key);
        let page = self.page.max(1);
        if self.selected < self.offset {
            self.offset = self.selected;
        } else if self.selected >= self.offset + page {
            self.offset = self.selected + 1 - page;
        }
        // No empty space below the last row when the view shrank.
        self.offset = self.offset.min(self.view.len().saturating_sub(page));
    }

    /// Sets the number of rows that fit (from the drawing) and keeps the selection visible.
    pub fn set_page(&mut self, page: usize) {
        self.page = page.max(1);
        self.clamp();
    }

    fn select(&mut self, pos: isize) {
        let last = self.view.len().saturating_sub(1) as isize;
        self.selected = pos.clamp(0, last.max(0)) as usize;
        self.clamp();
    }

    /// Handles one key.
    pub fn key(&mut self, k: KeyEvent) {
        if k.kind == KeyEventKind::Release {
            return;
        }
        if k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c') {
            self.quit = true;
            return;
        }
        if self.editing {
            match k.code {
                KeyCode::Enter => self.editing = false,
                KeyCode::Esc => {
                    self.editing = false;
                    self.filter.clear();
                    self.rebuild();
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                    self.rebuild();
                }
                KeyCode::Char(c) if !c.is_control() && self.filter.chars().count() < 64 => {
                    self.filter.push(c);
                    self.rebuild();
                }
                KeyCode::Up | KeyCode::Down | KeyCode::PageUp | KeyCode::PageDown => {
                    self.move_list(k.code)
                }
                _ => {}
            }
            return;
        }
        if let Mode::Detail { scroll, .. } = &mut self.mode {
            let page = self.page.max(1);
            let max = self.detail_lines.saturating_sub(1);
            match k.code {
                KeyCode::Char('q') => self.quit = true,
                KeyCode::Esc | KeyCode::Backspace | KeyCode::Left | KeyCode::Enter => {
                    self.mode = Mode::List
                }
                KeyCode::Up | KeyCode::Char('k') => *scroll = scroll.saturating_sub(1),
                KeyCode::Down | KeyCode::Char('j') => *scroll = (*scroll + 1).min(max),
                KeyCode::PageUp => *scroll = scroll.saturating_sub(page),
                KeyCode::PageDown => *scroll = (*scroll + page).min(max),
                KeyCode::Home | KeyCode::Char('g') => *scroll = 0,
                KeyCode::End | KeyCode::Char('G') => *scroll = max,
                _ => {}
            }
            return;
        }
        match k.code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Char('s') => {
                self.sort = self.sort.next();
                self.rebuild();
            }
            KeyCode::Char('/') => self.editing = true,
            KeyCode::Esc if !self.filter.is_empty() => {
                self.filter.clear();
                self.rebuild();
            }
            KeyCode::Enter => {
                if let Some(r) = self.selected_row() {
                    self.mode = Mode::Detail {
                        key: r.key(),
                        row: Box::new(r.clone()),
                        scroll: 0,
                    };
                }
            }
            KeyCode::Char('k') => self.move_list(KeyCode::Up),
            KeyCode::Char('j') => self.move_list(KeyCode::Down),
            KeyCode::Char('g') => self.move_list(KeyCode::Home),
            KeyCode::Char('G') => self.move_list(KeyCode::End),
            code => self.move_list(code),
        }
    }

    fn move_list(&mut self, code: KeyCode) {
        let cur = self.selected as isize;
        let page = self.page.max(1) as isize;
        match code {
            KeyCode::Up => self.select(cur - 1),
            KeyCode::Down => self.select(cur + 1),
            KeyCode::PageUp => self.select(cur - page),
            KeyCode::PageDown => self.select(cur + page),
            KeyCode::Home => self.select(0),
            KeyCode::End => self.select(isize::MAX),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn proc(pid: u32, comm: &str, drops: u64) -> ProcessRow {
        ProcessRow {
            pid: pid.to_string(),
            comm: comm.to_string(),
            drops_total: drops,
            ..ProcessRow::default()
        }
    }

    fn snap(at: f64, processes: Vec<ProcessRow>) -> Update {
        Update::Data(Box::new(Snapshot {
            status: bufscope_api::StatusDocument {
                generated_at: Some(at),
                processes,
                ..Default::default()
            },
            findings: Vec::new(),
        }))
    }

    fn press(app: &mut App, code: KeyCode) {
        app.key(KeyEvent::new(code, KeyModifiers::NONE));
    }

    fn order(app: &App) -> Vec<String> {
        app.view
            .iter()
            .map(|&i| app.rows[i].proc.comm.clone())
            .collect()
    }

    #[test]
    fn rates_from_successive_polls_sort_first() {
        let mut app = App::new("http://x");
        app.apply(snap(10.0, vec![proc(1, "a", 1000), proc(2, "b", 10)]), 0.0);
        assert_eq!(app.rows[0].rate, None, "no rate on first sight");
        assert_eq!(order(&app), ["a", "b"], "by total while no rate is known");
        app.apply(snap(12.0, vec![proc(1, "a", 1000), proc(2, "b", 410)]), 0.0);
        let rate = |app: &App, c: &str| app.rows.iter().find(|r| r.proc.comm == c).unwrap().rate;
        assert_eq!(rate(&app, "a"), Some(0.0));
        assert_eq!(rate(&app, "b"), Some(200.0));
        assert_eq!(order(&app), ["b", "a"]);
        // A pid reused by another process, or a counter that went down: no rate.
        app.apply(snap(13.0, vec![proc(1, "c", 5), proc(2, "b", 0)]), 0.0);
        assert_eq!(rate(&app, "c"), None);
        assert_eq!(rate(&app, "b"), None);
        // An error keeps the data.
        app.apply(Update::Error("down".into()), 0.0);
        assert_eq!(app.rows.len(), 2);
        assert_eq!(app.error.as_deref(), Some("down"));
    }

    #[test]
    fn keys_sort_filter_select_and_detail() {
        let mut app = App::new("http://x");
        app.apply(
            snap(
                1.0,
                vec![proc(1, "zeta", 1), proc(2, "alpha", 3), proc(3, "wg-z", 2)],
            ),
            0.0,
        );
        assert_eq!(order(&app), ["alpha", "wg-z", "zeta"]);
        while app.sort != Sort::Comm {
            press(&mut app, KeyCode::Char('s'));
        }
        assert_eq!(order(&app), ["alpha", "wg-z", "zeta"]);
        press(&mut app, KeyCode::Char('s'));
        assert_eq!(app.sort, Sort::Pid);
        assert_eq!(order(&app), ["zeta", "alpha", "wg-z"]);
        press(&mut app, KeyCode::Char('/'));
        for c in "Z".chars() {
            press(&mut app, KeyCode::Char(c));
        }
        assert_eq!(order(&app), ["zeta", "wg-z"], "case-insensitive substring");
        press(&mut app, KeyCode::Char('q'));
        assert!(!app.quit, "q is text while typing the filter");
        assert!(app.filter == "Zq" && app.view.is_empty());
        press(&mut app, KeyCode::Backspace);
        press(&mut app, KeyCode::Enter);
        press(&mut app, KeyCode::Down);
        assert_eq!(app.selected_row().unwrap().proc.comm, "wg-z");
        // The selection follows the process when the order changes.
        while app.sort != Sort::Comm {
            press(&mut app, KeyCode::Char('s'));
        }
        assert_eq!(app.selected_row().unwrap().proc.comm, "wg-z");
        assert_eq!(app.selected, 0);
        press(&mut app, KeyCode::Enter);
        assert!(matches!(&app.mode, Mode::Detail { key, .. } if key.1 == "wg-z"));
        press(&mut app, KeyCode::Esc);
        assert_eq!(app.mode, Mode::List);
        press(&mut app, KeyCode::Esc);
        assert!(app.filter.is_empty() && app.view.len() == 3);
        press(&mut app, KeyCode::Char('q'));
        assert!(app.quit);
    }

    #[test]
    fn scrolling_keeps_the_selection_on_screen() {
        let mut app = App::new("http://x");
        let procs = (0..1000)
            .map(|i| proc(i + 1, "p", 1000 - i as u64))
            .collect();
        app.apply(snap(1.0, procs), 0.0);
        app.set_page(19);
        press(&mut app, KeyCode::PageDown);
        assert_eq!((app.selected, app.offset), (19, 1));
        press(&mut app, KeyCode::End);
        assert_eq!((app.selected, app.offset), (999, 981));
        press(&mut app, KeyCode::PageUp);
        assert_eq!((app.selected, app.offset), (980, 980));
        press(&mut app, KeyCode::Home);
        assert_eq!((app.selected, app.offset), (0, 0));
        press(&mut app, KeyCode::Up);
        assert_eq!(app.selected, 0);
        // The view shrinks under the selection: it stays in range.
        press(&mut app, KeyCode::End);
        app.apply(snap(2.0, vec![proc(1, "p", 1000)]), 0.0);
        assert_eq!((app.selected, app.offset), (0, 0));
    }
}
