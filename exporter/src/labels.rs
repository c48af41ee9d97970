//! The label vocabularies the signal rooms and the advice rules share: a socket's transport
//! (`proto`) and a buffer-size socket option (`option`).

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
