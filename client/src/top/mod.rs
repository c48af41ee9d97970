//! `bufscope top`: a terminal view of a running bufscope for the person on the gateway.
//!
//! A poller thread reads `/api/v1/status` and `/api/v1/findings` every `--interval` (1 s)
//! with the same [`Client`] as `bufscope explain` (`--url`, `--tls.ca-file`, `--web.user`) and
//! hands each result, or a one-line error, to the UI loop, which never waits on the network:
//! an unreachable or misbehaving exporter is a red line in the header while the last data stays
//! on screen and the poller keeps trying. Drop rates come from the totals of successive reads
//! (`app`); `draw` renders only the rows on screen. The terminal is restored on exit, on
//! error and on panic.
//!
//! The terminal side (`app`, `draw`, the screen) is the crate's `tui` feature; [`data`] (the
//! documents as read, cleaned for a terminal) is always built.

#[cfg(feature = "tui")]
pub mod app;
pub mod data;
#[cfg(feature = "tui")]
pub mod draw;
#[cfg(feature = "tui")]
mod screen;

use std::time::Duration;

use anyhow::Context as _;

use crate::Client;

#[cfg(feature = "tui")]
pub use screen::run;

/// How long one read may take before it counts as failed.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads both documents once.
pub fn fetch(client: &Client) -> anyhow::Result<data::Snapshot> {
    let status = client.status().context(bufscope_api::status::PATH)?;
    let findings = client.findings().context(bufscope_api::findings::PATH)?;
    Ok(data::Snapshot::new(status, findings.findings))
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

/// Why `bufscope top` fails in a build without the terminal UI, and where it is.
pub fn not_built(url: &str) -> String {
    format!(
        "this bufscope is built without the terminal UI of `bufscope top` (as the container \
         image is): run `bufscope top --url {url}` from a default build (`cargo build --release \
         -p bufscope`), or read the same data with `bufscope explain` or the status page at \
         {}/",
        url.trim_end_matches('/')
    )
}

/// Runs `bufscope top` against the exporter at `url`: in this build (without the `tui`
/// feature), an error saying which build has it.
#[cfg(not(feature = "tui"))]
pub fn run(
    url: &str,
    _ca_file: Option<&std::path::Path>,
    _user: Option<&str>,
    _interval: Duration,
) -> anyhow::Result<()> {
    anyhow::bail!(not_built(url))
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

    #[test]
    fn the_missing_ui_is_one_line_naming_the_build_that_has_it() {
        let m = not_built("http://10.0.0.1:9477/");
        assert!(!m.contains('\n'), "{m}");
        assert!(
            m.contains("cargo build --release -p bufscope") && m.contains("http://10.0.0.1:9477/"),
            "{m}"
        );
    }
}
