//! Programs whose buffer sizing bufscope knows: how each sizes its sockets and where an
//! operator changes it (a configuration key), so a finding can name the fix in the program's
//! own terms. Matched by the kernel's `comm` (at most 15 bytes, so a prefix for long names).
//!
//! Each entry says where its facts come from (`source`): the program's manual page or
//! configuration file as Debian packages it, or the source file that makes the calls. A
//! program not in the table gets the generic fixes (the option, the sysctl, the capability).

use crate::Direction;

/// How a program asks for its buffer, as its calls show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizing {
    /// Only the plain option (`SO_RCVBUF`/`SO_SNDBUF`): capped at `rmem_max`/`wmem_max`.
    Plain,
    /// `*FORCE` first, then the plain option when it is refused (no `CAP_NET_ADMIN`), silently.
    ForceThenPlain,
    /// The plain option, then `*FORCE` when the readback is short.
    PlainThenForce,
    /// Only `*FORCE`: without `CAP_NET_ADMIN` the buffer stays at the default.
    ForceOnly,
}

impl Sizing {
    /// Whether the program tries a `*FORCE` option (so `CAP_NET_ADMIN` alone lifts the cap).
    pub fn tries_force(self) -> bool {
        !matches!(self, Sizing::Plain)
    }

    /// In words, for a finding.
    pub fn describe(self) -> &'static str {
        match self {
            Sizing::Plain => "sets the plain option (capped at the sysctl)",
            Sizing::ForceThenPlain => {
                "tries the FORCE option first and falls back to the plain one silently"
            }
            Sizing::PlainThenForce => {
                "sets the plain option, then FORCE when the readback is short"
            }
            Sizing::ForceOnly => "sets only the FORCE option (needs CAP_NET_ADMIN)",
        }
    }
}

/// A configuration key that sizes one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knob {
    /// The key as the operator writes it.
    pub key: &'static str,
    /// Where it goes.
    pub file: &'static str,
    /// How a value is written (`{}` is replaced by the size in bytes).
    pub example: &'static str,
    /// The sockets it sizes (`udp`, `tcp`, `netlink`): a key for another kind of socket is
    /// no fix for this one.
    pub sockets: &'static [&'static str],
}

impl Knob {
    /// Whether it sizes sockets of `proto` (`udp`, `tcp`, `netlink`).
    pub fn sizes(&self, proto: &str) -> bool {
        self.sockets.contains(&proto)
    }

    /// The key set to `bytes`, as the operator would write it.
    pub fn with(&self, bytes: u64) -> String {
        self.example.replace("{}", &bytes.to_string())
    }
}

/// A program bufscope knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Program {
    /// Its name.
    pub name: &'static str,
    /// `comm` values (exact, or a prefix when it ends in `*`).
    pub comms: &'static [&'static str],
    /// What kind of program (`resolver`, `vpn`, `ike`, `quic`, `dns proxy`, `overlay`).
    pub kind: &'static str,
    /// How it sizes its buffers.
    pub sizing: Sizing,
    /// The receive buffer's key, if it has one.
    pub receive: Option<Knob>,
    /// The send buffer's key, if it has one.
    pub send: Option<Knob>,
    /// What else to know (what the key applies to, its default).
    pub note: &'static str,
    /// Where these facts come from.
    pub source: &'static str,
}

impl Program {
    /// The key for `direction`, if the program has one.
    pub fn knob(&self, direction: Direction) -> Option<&Knob> {
        match direction {
            Direction::Receive => self.receive.as_ref(),
            Direction::Send => self.send.as_ref(),
        }
    }
}

/// quic-go's requests (`protocol.DesiredReceiveBufferSize`, and the send side's twin), by
/// generation.
const QUIC_GO_NOTE: &str = "quic-go sizes its UDP socket itself: \
    the generation Debian 12's Caddy 2.6 vendors (github.com/lucas-clemente/quic-go) asks \
    SO_RCVBUF 2 MiB on the receive side only, and only when the socket has less; current \
    releases ask 7 MiB in each direction and then the FORCE option when the readback is short. \
    It warns (\"failed to sufficiently increase receive buffer size\") only when the readback \
    is below its request";

/// The programs bufscope knows.
pub const PROGRAMS: &[Program] = &[
    Program {
        name: "unbound",
        comms: &["unbound"],
        kind: "resolver",
        sizing: Sizing::ForceThenPlain,
        receive: Some(Knob {
            key: "so-rcvbuf",
            file: "unbound.conf (server:)",
            example: "so-rcvbuf: {}",
            sockets: &["udp"],
        }),
        send: Some(Knob {
            key: "so-sndbuf",
            file: "unbound.conf (server:)",
            example: "so-sndbuf: {}",
            sockets: &["udp"],
        }),
        note: "applies to the UDP port 53 sockets; 0 (the default) leaves the system value",
        source: "unbound.conf(5) so-rcvbuf/so-sndbuf (Debian 12 unbound 1.17): \"on linux \
                 Unbound needs root permission to bypass the limit, or the admin can use \
                 sysctl net.core.rmem_max\"; calls seen by bufscope: SO_RCVBUFFORCE, then \
                 SO_RCVBUF when refused",
    },
    Program {
        name: "OpenVPN",
        comms: &["openvpn"],
        kind: "vpn",
        sizing: Sizing::Plain,
        receive: Some(Knob {
            key: "rcvbuf",
            file: "the OpenVPN config (or --rcvbuf)",
            example: "rcvbuf {}",
            sockets: &["udp", "tcp"],
        }),
        send: Some(Knob {
            key: "sndbuf",
            file: "the OpenVPN config (or --sndbuf)",
            example: "sndbuf {}",
            sockets: &["udp", "tcp"],
        }),
        note: "applies to its TCP or UDP socket; on TCP any value turns autotuning off, so \
               remove both options there rather than raise them",
        source: "openvpn(8) --rcvbuf/--sndbuf (Debian 12 OpenVPN 2.6): \"Set the TCP/UDP socket \
                 receive buffer size. Defaults to operating system default\"",
    },
    Program {
        name: "strongSwan charon",
        comms: &["charon", "charon-systemd"],
        kind: "ike",
        sizing: Sizing::Plain,
        receive: Some(Knob {
            key: "charon.plugins.kernel-netlink.receive_buffer_size (with force_receive_buffer_size = yes for SO_RCVBUFFORCE)",
            file: "strongswan.d/charon/kernel-netlink.conf",
            example: "receive_buffer_size = {}",
            sockets: &["netlink"],
        }),
        send: None,
        note: "the key sizes charon's XFRM netlink event socket (its IKE UDP sockets are not \
               sized); force_receive_buffer_size = yes uses SO_RCVBUFFORCE",
        source: "strongswan.d/charon/kernel-netlink.conf (Debian 12 strongSwan 5.9): \
                 \"receive_buffer_size = 0 — Maximum Netlink socket receive buffer in bytes\", \
                 \"force_receive_buffer_size = no — Force maximum Netlink receive buffer on \
                 Netlink socket\"",
    },
    Program {
        name: "wireguard-go",
        comms: &["wireguard-go"],
        kind: "vpn",
        sizing: Sizing::ForceThenPlain,
        receive: None,
        send: None,
        note: "asks for 7 MiB in each direction on its UDP sockets and has no setting: \
               CAP_NET_ADMIN (FORCE) or rmem_max/wmem_max >= 7 MiB lets it have them",
        source: "wireguard-go conn/controlfns_linux.go: SO_RCVBUFFORCE/SO_SNDBUFFORCE of \
                 socketBufferSize (7 << 20), then SO_RCVBUF/SO_SNDBUF",
    },
    Program {
        name: "nebula",
        comms: &["nebula"],
        kind: "overlay",
        sizing: Sizing::ForceOnly,
        receive: Some(Knob {
            key: "listen.read_buffer",
            file: "nebula config.yml",
            example: "listen:\n  read_buffer: {}",
            sockets: &["udp"],
        }),
        send: Some(Knob {
            key: "listen.write_buffer",
            file: "nebula config.yml",
            example: "listen:\n  write_buffer: {}",
            sockets: &["udp"],
        }),
        note: "unset by default (the system value)",
        source: "nebula examples/config.yml listen.read_buffer/write_buffer; udp/udp_linux.go \
                 SetRecvBuffer/SetSendBuffer use SO_RCVBUFFORCE/SO_SNDBUFFORCE",
    },
    Program {
        name: "dnsdist",
        comms: &["dnsdist"],
        kind: "dns proxy",
        sizing: Sizing::Plain,
        receive: Some(Knob {
            key: "setUDPSocketBufferSizes(recv, send)",
            file: "dnsdist.conf",
            example: "setUDPSocketBufferSizes({}, 0)",
            sockets: &["udp"],
        }),
        send: Some(Knob {
            key: "setUDPSocketBufferSizes(recv, send)",
            file: "dnsdist.conf",
            example: "setUDPSocketBufferSizes(0, {})",
            sockets: &["udp"],
        }),
        note: "applies to its UDP frontends (1.7.0+)",
        source: "dnsdist reference, setUDPSocketBufferSizes (new in 1.7.0): SO_RCVBUF/SO_SNDBUF \
                 of the incoming UDP sockets, capped by net.core.rmem_max/wmem_max",
    },
    Program {
        name: "Caddy (quic-go)",
        comms: &["caddy"],
        kind: "quic",
        sizing: Sizing::PlainThenForce,
        receive: None,
        send: None,
        note: QUIC_GO_NOTE,
        source: "quic-go sys_conn_buffers*.go: SetReadBuffer(7 MiB), readback, then \
                 SO_RCVBUFFORCE when short; Debian 12 caddy 2.6.2 as bufscope saw it \
                 (integration/tests/findings_live.rs): one SO_RCVBUF of 2097152, read back \
                 4194304 on 6.18, no FORCE, no warning",
    },
    Program {
        name: "cloudflared (quic-go)",
        comms: &["cloudflared"],
        kind: "quic",
        sizing: Sizing::PlainThenForce,
        receive: None,
        send: None,
        note: QUIC_GO_NOTE,
        source: "quic-go sys_conn_buffers*.go (vendored by cloudflared)",
    },
    Program {
        name: "syncthing (quic-go)",
        comms: &["syncthing"],
        kind: "quic",
        sizing: Sizing::PlainThenForce,
        receive: None,
        send: None,
        note: QUIC_GO_NOTE,
        source: "quic-go sys_conn_buffers*.go (vendored by syncthing)",
    },
    Program {
        name: "bufscope-tunnel",
        comms: &["bufscope-tunne*"],
        kind: "vpn",
        sizing: Sizing::ForceThenPlain,
        receive: None,
        send: None,
        note: "applies this crate's plan (FORCE with CAP_NET_ADMIN, else the plain option)",
        source: "bufscope-policy Plan::apply",
    },
];

/// The program `comm` is, if bufscope knows it.
pub fn program(comm: &str) -> Option<&'static Program> {
    PROGRAMS.iter().find(|p| {
        p.comms.iter().any(|c| match c.strip_suffix('*') {
            Some(prefix) => comm.starts_with(prefix),
            None => comm == *c,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comms_match_exactly_or_by_prefix() {
        assert_eq!(program("unbound").map(|p| p.name), Some("unbound"));
        assert_eq!(program("unbound-anchor"), None, "exact unless a prefix");
        assert_eq!(
            program("bufscope-tunne").map(|p| p.name),
            Some("bufscope-tunnel")
        );
        assert_eq!(program("charon-systemd").map(|p| p.kind), Some("ike"));
        assert_eq!(program("nginx"), None);
    }

    #[test]
    fn every_entry_is_sourced_and_knobs_take_a_size() {
        for p in PROGRAMS {
            assert!(!p.source.is_empty() && !p.comms.is_empty(), "{}", p.name);
            for c in p.comms {
                assert!(c.trim_end_matches('*').len() <= 15, "{c}: comm is 15 bytes");
            }
            for k in [p.receive, p.send].into_iter().flatten() {
                assert!(k.example.contains("{}"), "{}: {}", p.name, k.key);
                assert!(k.with(8 << 20).contains("8388608"));
            }
        }
        assert!(program("nebula").is_some_and(|p| p.sizing.tries_force()));
        let charon = program("charon")
            .and_then(|p| p.receive)
            .expect("charon has a receive key");
        assert!(charon.sizes("netlink") && !charon.sizes("udp"));
        assert!(program("openvpn").is_some_and(|p| !p.sizing.tries_force()));
    }
}
