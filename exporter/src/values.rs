//! Flag values: the parsers the command line and the signal rooms' own flags share, and the
//! error of a value that parsed but cannot be used ([`Invalid`]).

use std::time::Duration;

/// A count that must be at least 1 (a clap value parser).
pub fn at_least_one<T: std::str::FromStr + PartialEq + From<u8>>(s: &str) -> Result<T, String> {
    let v: T = s.parse().map_err(|_| format!("invalid number {s:?}"))?;
    if v == T::from(0u8) {
        return Err("must be at least 1".into());
    }
    Ok(v)
}

pub use bufscope_policy::units::{MAX_DURATION, parse_duration};

/// The shortest `--poll-interval`.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A [`parse_duration`] value parser that also requires `min <= d <= max`.
pub fn duration_within(
    min: Duration,
    max: Duration,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |s| {
        let d = parse_duration(s)?;
        if d < min {
            return Err(format!("{s:?} is too short: at least {min:?}"));
        }
        if d > max {
            return Err(format!("{s:?} is too long: at most {max:?}"));
        }
        Ok(d)
    }
}

/// A flag whose value parsed but cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    /// The flag's long name without `--` (e.g. `web.telemetry-path`): a value that came from
    /// `--config.file` is traced back to its key with it.
    pub flag: &'static str,
    /// What is wrong and the fix, naming the flag.
    pub message: String,
}

impl Invalid {
    /// An unusable value of flag `flag` (its long name without `--`).
    pub fn new(flag: &'static str, message: impl Into<String>) -> Self {
        Self {
            flag,
            message: message.into(),
        }
    }
}
