//! `bufscope top`: a terminal view of a running bufscope for the person on the gateway.
//!
//! A poller thread reads `/api/v1/status` and `/api/v1/findings` every `--interval` (1 s)
//! with the same [`Client`] as `bufscope explain` (`--url`, `--tls.ca-file`, `--web.user`) and
//! hands each result, or a one-line error, to the UI loop, which never waits on the network:
//! an unreachable or misbehaving exporter is a red line in the header while the last data stays
//! on screen and the poller keeps trying. Drop rates come from the totals of successive reads
//! ([`app`]); [`draw`] renders only the rows on screen. The terminal is restored on exit, on
//! error and on panic.

pub mod app;
pub mod data;
pub mod draw;

use std::io::IsTerminal as _;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail};
use crossterm::event::{self, Event};
use crossterm::execute;
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

use crate::cli::TopArgs;
use crate::explain::Client;
use app::{App, Update};

/// How long one read may take before it counts as failed.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads both documents once.
pub fn fetch(client: &Client) -> anyhow::Result<data::Snapshot> {
    let status = client
        .get_json("/api/v1/status")
        .context("/api/v1/status")?;
    let mut snap = data::parse_status(&status)?;
    let findings = client
        .get_json("/api/v1/findings")
        .context("/api/v1/findings")?;
    snap.findings = data::parse_findings(&findings)?;
    Ok(snap)
}

/// An error as one line for the header, what matters first: the endpoint, the root cause
/// (`Connection refused`, the JSON error), then the steps in between.
pub fn one_line(e: &anyhow::Error) -> String {
    let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    let text = match chain.as_slice() {
        [] => String::new(),
        [only] => only.clone(),
        [outer, root] => format!("{outer}: {root}"),
        [outer, middle @ .., root] => format!("{outer}: {root} — {}", middle.join(": ")),
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn poll_loop(client: Client, interval: Duration, tx: mpsc::Sender<Update>) {
    loop {
        let started = Instant::now();
        let update = match fetch(&client) {
            Ok(s) => Update::Data(Box::new(s)),
            Err(e) => Update::Error(one_line(&e)),
        };
        if tx.send(update).is_err() {
            return;
        }
        std::thread::sleep(interval.saturating_sub(started.elapsed()));
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Leaves raw mode and the alternate screen and shows the cursor (best effort: also called
/// from the panic hook).
fn restore_terminal() {
    let _ = disable_raw_mode();
    let _ = execute!(
        std::io::stdout(),
        LeaveAlternateScreen,
        crossterm::cursor::Show
    );
}

/// The terminal in raw mode on the alternate screen; dropping it restores the terminal.
struct Screen {
    terminal: Terminal<CrosstermBackend<std::io::Stdout>>,
}

impl Screen {
    fn enter() -> anyhow::Result<Self> {
        // Restore before the panic message is printed, so it is readable.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
        enable_raw_mode().context("cannot switch the terminal to raw mode")?;
        let screen = (|| {
            execute!(std::io::stdout(), EnterAlternateScreen)?;
            let mut terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
            terminal.hide_cursor()?;
            terminal.clear()?;
            anyhow::Ok(Self { terminal })
        })();
        if screen.is_err() {
            restore_terminal();
        }
        screen.context("cannot set up the terminal")
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// Runs `bufscope top`.
pub fn run(a: &TopArgs) -> anyhow::Result<()> {
    let client =
        Client::new(&a.url, a.ca_file.as_deref(), a.user.as_deref())?.with_timeout(READ_TIMEOUT);
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        bail!(
            "bufscope top needs a terminal (stdin and stdout are not both a tty): for scripts \
             use `bufscope explain --json` or {}/api/v1/status",
            a.url.trim_end_matches('/')
        );
    }
    let interval = a.interval.max(Duration::from_millis(100));
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("top-poll".into())
        .spawn(move || poll_loop(client, interval, tx))
        .context("cannot start the poller thread")?;
    let mut screen = Screen::enter()?;
    let mut app = App::new(&a.url);
    let result = event_loop(&mut screen.terminal, &mut app, &rx);
    drop(screen);
    result
}

fn event_loop(
    terminal: &mut Terminal<CrosstermBackend<std::io::Stdout>>,
    app: &mut App,
    rx: &mpsc::Receiver<Update>,
) -> anyhow::Result<()> {
    loop {
        terminal.draw(|f| draw::draw(f, app))?;
        if app.quit {
            return Ok(());
        }
        // Keys first (all that are pending), then whatever the poller brought.
        if event::poll(Duration::from_millis(200))? {
            loop {
                if let Event::Key(k) = event::read()? {
                    app.key(k);
                }
                if app.quit || !event::poll(Duration::ZERO)? {
                    break;
                }
            }
        }
        loop {
            match rx.try_recv() {
                Ok(u) => app.apply(u, unix_now()),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    bail!("the poller thread stopped")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_put_the_cause_first_on_one_line() {
        let e = anyhow::anyhow!("Connection refused (os error 111)")
            .context("connecting to http://127.0.0.1:1\n(is it running?)")
            .context("/api/v1/status");
        assert_eq!(
            one_line(&e),
            "/api/v1/status: Connection refused (os error 111) — connecting to \
             http://127.0.0.1:1 (is it running?)"
        );
        let e = anyhow::anyhow!("HTTP 500").context("/api/v1/findings");
        assert_eq!(one_line(&e), "/api/v1/findings: HTTP 500");
    }
}
