//! The label vocabularies the signal rooms and the advice rules share: a socket's transport
//! (`proto`), a buffer-size socket option (`option`), and the kernel's drop reasons by number
//! (for counters kept across restarts).

use std::sync::RwLock;

/// The running kernel's drop reasons (number, name), as the drops room resolved them.
static DROP_REASONS: RwLock<Vec<(u16, String)>> = RwLock::new(Vec::new());

/// Registers the running kernel's drop reasons (the drops room, at start).
pub fn register_drop_reasons(reasons: impl IntoIterator<Item = (u16, String)>) {
    if let Ok(mut r) = DROP_REASONS.write() {
        *r = reasons.into_iter().collect();
    }
}

/// The number of drop reason `name` on this kernel, if registered.
pub fn drop_reason_number(name: &str) -> Option<u16> {
    let r = DROP_REASONS.read().ok()?;
    r.iter().find(|(_, n)| n == name).map(|(v, _)| *v)
}

/// The name of drop reason `v` on this kernel, if registered.
pub fn drop_reason_name(v: u16) -> Option<String> {
    let r = DROP_REASONS.read().ok()?;
    r.iter()
        .find(|(n, _)| *n == v)
        .map(|(_, name)| name.clone())
}

/// Transport of a socket, as the `proto` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    /// UDP (and UDP-Lite).
    Udp,
    /// TCP (and MPTCP subflows).
    Tcp,
    /// Anything else (raw, ICMP, unix, …) or unknown.
    Other,
}

impl Proto {
    /// From an `IPPROTO_*` number.
    pub fn from_ip(p: u8) -> Self {
        match p {
            6 => Self::Tcp,
            17 | 136 => Self::Udp,
            _ => Self::Other,
        }
    }

    /// The `IPPROTO_*` number standing for it (0 for other).
    pub fn to_ip(self) -> u8 {
        match self {
            Self::Udp => 17,
            Self::Tcp => 6,
            Self::Other => 0,
        }
    }

    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Udp => "udp",
            Self::Tcp => "tcp",
            Self::Other => "other",
        }
    }
}

/// A buffer-size socket option, as the `option` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BufOption {
    /// `SO_RCVBUF`.
    Rcvbuf,
    /// `SO_SNDBUF`.
    Sndbuf,
    /// `SO_RCVBUFFORCE`.
    RcvbufForce,
    /// `SO_SNDBUFFORCE`.
    SndbufForce,
    /// `SO_BUF_LOCK`.
    BufLock,
}

impl BufOption {
    /// From the `optname` number.
    pub fn from_optname(o: i32) -> Option<Self> {
        use bufscope_common as c;
        Some(match o {
            c::SO_RCVBUF => Self::Rcvbuf,
            c::SO_SNDBUF => Self::Sndbuf,
            c::SO_RCVBUFFORCE => Self::RcvbufForce,
            c::SO_SNDBUFFORCE => Self::SndbufForce,
            c::SO_BUF_LOCK => Self::BufLock,
            _ => return None,
        })
    }

    /// Its optname (`SO_*`).
    pub fn optname(self) -> i32 {
        use bufscope_common as c;
        match self {
            Self::Rcvbuf => c::SO_RCVBUF,
            Self::Sndbuf => c::SO_SNDBUF,
            Self::RcvbufForce => c::SO_RCVBUFFORCE,
            Self::SndbufForce => c::SO_SNDBUFFORCE,
            Self::BufLock => c::SO_BUF_LOCK,
        }
    }

    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rcvbuf => "SO_RCVBUF",
            Self::Sndbuf => "SO_SNDBUF",
            Self::RcvbufForce => "SO_RCVBUFFORCE",
            Self::SndbufForce => "SO_SNDBUFFORCE",
            Self::BufLock => "SO_BUF_LOCK",
        }
    }

    /// True for the options that size the send buffer.
    pub fn is_send(self) -> bool {
        matches!(self, Self::Sndbuf | Self::SndbufForce)
    }
}
