//! Fault injection for the integration tests, compiled into debug builds only (release builds
//! have none): `BUFSCOPE_DEBUG_FAULT=wedge-poll:SECS` makes the first poll that starts SECS
//! after start-up hang forever holding the collector's lock (as a hung `/proc` read or a
//! deadlock would); `panic-poll:SECS` makes it panic.

use std::time::Duration;

/// Runs the configured fault when the poll starts `since_start` after start-up.
pub fn at_poll(since_start: Duration) {
    static FAULT: std::sync::OnceLock<Option<(String, Duration)>> = std::sync::OnceLock::new();
    let fault = FAULT.get_or_init(|| {
        let v = std::env::var("BUFSCOPE_DEBUG_FAULT").ok()?;
        let (kind, secs) = v.split_once(':')?;
        Some((kind.to_string(), Duration::from_secs(secs.parse().ok()?)))
    });
    match fault {
        Some((kind, after)) if since_start >= *after => match kind.as_str() {
            "wedge-poll" => {
                tracing::warn!("BUFSCOPE_DEBUG_FAULT: this poll never returns");
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            }
            "panic-poll" => std::panic::panic_any("BUFSCOPE_DEBUG_FAULT: a panic in a poll"),
            _ => {}
        },
        _ => {}
    }
}
