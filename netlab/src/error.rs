//! The library's error type.

use std::io;

/// Everything that can go wrong while building or running a lab.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The process is not root.
    #[error(
        "netlab needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN): run as root, e.g. via `cargo xtask test`"
    )]
    NotRoot,
    /// `/dev/net/tun` does not exist.
    #[error(
        "/dev/net/tun is missing: load the tun module (modprobe tun) or expose it to the container"
    )]
    NoTun,
    /// A namespace with that name exists already.
    #[error("network namespace {0} already exists (a leftover? run `netlab cleanup`)")]
    Exists(String),
    /// A namespace or interface name is not acceptable.
    #[error("invalid name {name:?}: {why}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        why: &'static str,
    },
    /// A lab configuration value is out of range.
    #[error("invalid lab configuration: {0}")]
    Config(String),
    /// A command could not be started or exited unsuccessfully.
    #[error("`{cmd}` failed: {detail}")]
    Command {
        /// The command line.
        cmd: String,
        /// Exit status and standard error, or the spawn error.
        detail: String,
    },
    /// A system call or file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}
