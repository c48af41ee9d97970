//! The terminal of `bufscope top`: raw mode on the alternate screen, the poller thread and
//! the UI loop.

use std::io::IsTerminal as _;
use std::path::Path;
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

use super::app::{App, Update};
use super::{READ_TIMEOUT, draw, fetch, one_line};
use crate::Client;

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

/// Runs `bufscope top` against the exporter at `url` (`--url`; `--tls.ca-file`, `--web.user`
/// as [`Client::new`] takes them), reading it every `interval` (100 ms at least).
pub fn run(
    url: &str,
    ca_file: Option<&Path>,
    user: Option<&str>,
    interval: Duration,
) -> anyhow::Result<()> {
    let client = Client::new(url, ca_file, user)?.with_timeout(READ_TIMEOUT);
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        bail!(
            "bufscope top needs a terminal (stdin and stdout are not both a tty): for scripts \
             use `bufscope explain --json` or {}{}",
            url.trim_end_matches('/'),
            bufscope_api::status::PATH
        );
    }
    let interval = interval.max(Duration::from_millis(100));
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("top-poll".into())
        .spawn(move || poll_loop(client, interval, tx))
        .context("cannot start the poller thread")?;
    let mut screen = Screen::enter()?;
    let mut app = App::new(url);
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
