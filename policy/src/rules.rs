//! The rules: pure functions from (transport, platform, target) to buffer sizes.

use std::fmt;
use std::time::Duration;

/// One mebibyte.
pub const MIB: usize = 1 << 20;

/// Default UDP receive and send buffer: 7 MiB.
///
/// Source: wireguard-go's commit sizing its UDP sockets to 7 MiB with `SO_{SND,RCV}BUFFORCE`
/// (seed `wireguard-go-udp-buffers.txt`): iperf3 through the tunnel went from 4.08 Gbit/s with
/// 2742 retransmits (system default 212992, drops on both sides) to 5.27 Gbit/s with 0
/// retransmits at ~125 µs RTT. 7 MiB is also the largest a default macOS configuration allows.
/// Firezone (seed `firezone-udp-buffers.txt`) uses 10 MB receive and almost doubled a Windows
/// iperf3 download with it (274 → 529 Mbit/s).
pub const UDP_DEFAULT_BUFFER: usize = 7 * MIB;

/// Upper bound for a BDP-derived UDP buffer: 64 MiB.
///
/// Source: wireguard-go's seed warns that more than 7 MiB helps at higher latency but adds
/// latency under load (bufferbloat); 64 MiB is the largest window any seed uses (the QUIC
/// tunnel's connection window, seed `quic-tunnel-windows.txt`), so a BDP-derived buffer never
/// exceeds what the transport on top would keep in flight anyway.
pub const UDP_BUFFER_CEILING: usize = 64 * MIB;

/// Multiplier applied to bandwidth × RTT when sizing a UDP buffer from a target.
///
/// Source: Firezone's seed sizes its 10 MB receive buffer as exactly one BDP (80 Mb / 50 ms =
/// 1.6 Gbit/s). One BDP only holds a window that arrives evenly; the receive queue must also
/// absorb bursts while the reading thread is descheduled, so bufscope asks for twice that.
pub const BDP_HEADROOM: u64 = 2;

/// QUIC stream receive window: 16 MiB.
///
/// Source: seed `quic-tunnel-windows.txt`: quinn's default 1.25 MB stream window capped a single
/// tunnelled TCP stream; 16 MiB stream / 64 MiB connection / 64 MiB send, with 256 KiB I/O
/// chunks, took loopback iperf3 from 568 to 763 MB/s (+34%).
pub const QUIC_STREAM_RECEIVE_WINDOW: u64 = 16 << 20;

/// QUIC connection receive window: 64 MiB (seed `quic-tunnel-windows.txt`, see
/// [`QUIC_STREAM_RECEIVE_WINDOW`]).
pub const QUIC_CONNECTION_RECEIVE_WINDOW: u64 = 64 << 20;

/// QUIC send window: 64 MiB (seed `quic-tunnel-windows.txt`, see
/// [`QUIC_STREAM_RECEIVE_WINDOW`]).
pub const QUIC_SEND_WINDOW: u64 = 64 << 20;

/// Outer transport of a tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Datagrams (WireGuard's own transport).
    Udp,
    /// One TCP connection carrying length-prefixed packets.
    Tcp,
    /// QUIC over UDP: the UDP socket is sized like [`Transport::Udp`], and the plan also carries
    /// the QUIC flow-control windows.
    Quic,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
            Transport::Quic => "quic",
        })
    }
}

/// Operating system the socket lives on; the rules differ per platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    /// Linux: `SO_RCVBUF` is capped at `net.core.rmem_max` and the kernel doubles the value.
    Linux,
    /// macOS: capped at `kern.ipc.maxsockbuf`.
    MacOs,
    /// Windows.
    Windows,
    /// Anything else: treated like Linux for UDP, left alone for TCP.
    Other,
}

impl Platform {
    /// The platform this code was compiled for.
    pub const fn current() -> Self {
        if cfg!(target_os = "linux") || cfg!(target_os = "android") {
            Platform::Linux
        } else if cfg!(target_os = "macos") || cfg!(target_os = "ios") {
            Platform::MacOs
        } else if cfg!(windows) {
            Platform::Windows
        } else {
            Platform::Other
        }
    }
}

impl Default for Platform {
    fn default() -> Self {
        Platform::current()
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Platform::Linux => "linux",
            Platform::MacOs => "macos",
            Platform::Windows => "windows",
            Platform::Other => "other",
        })
    }
}

/// Which socket buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// `SO_RCVBUF`.
    Receive,
    /// `SO_SNDBUF`.
    Send,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Receive => "receive",
            Direction::Send => "send",
        })
    }
}

/// The path the tunnel is expected to carry: its bottleneck bandwidth and round-trip time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// Bottleneck bandwidth in bits per second.
    pub bandwidth_bps: u64,
    /// Round-trip time of the path.
    pub rtt: Duration,
}

impl Target {
    /// A target of `bandwidth_bps` bits per second at `rtt`.
    pub const fn new(bandwidth_bps: u64, rtt: Duration) -> Self {
        Self { bandwidth_bps, rtt }
    }

    /// Bandwidth-delay product of this target in bytes, see [`bdp_bytes`].
    pub fn bdp_bytes(&self) -> u64 {
        bdp_bytes(self.bandwidth_bps, self.rtt)
    }
}

/// Which rule of the policy decided a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// UDP (or QUIC's UDP socket) gets [`UDP_DEFAULT_BUFFER`] in both directions.
    UdpDefault,
    /// UDP gets [`BDP_HEADROOM`] × bandwidth × RTT because that is more than the default.
    UdpBdp,
    /// UDP gets [`UDP_BUFFER_CEILING`] because the BDP-derived size is larger still.
    UdpCeiling,
    /// TCP on Linux and Windows: do not touch the buffers, let the kernel autotune.
    ///
    /// Source: Lightway (seed `lightway-tcp-buffers.txt`) at 190 ms RTT on Linux: setting the
    /// buffers gave 11.22 Mbit/s down / 8.59 up, not setting them 160.86 / 59.29; on Windows
    /// 326.50 / 256.90 set vs 457.56 / 450.68 not set. Setting `SO_RCVBUF` locks the buffer
    /// (`SOCK_RCVBUF_LOCK`) and, before connect/listen, also shrinks the window scale the
    /// connection advertises for its whole life: the kernel patch in seed
    /// `so-rcvbufauto-kernel-patch.txt` measured 9.34 Gbit/s (wscale 10) falling to
    /// 2.73 Gbit/s (wscale 2) just from `iperf -w 425984`, a value equal to the default.
    TcpAutotune,
    /// TCP on macOS: set the buffers explicitly, sized like UDP.
    ///
    /// Source: Lightway (seed `lightway-tcp-buffers.txt`) at 190 ms RTT on macOS: upload
    /// 101.17 Mbit/s when not set, 249.29 when set; download unchanged (167.37 vs 166.05).
    /// 7 MiB is the largest a default macOS configuration allows (seed
    /// `wireguard-go-udp-buffers.txt`).
    TcpMacOsExplicit,
    /// TCP on an unknown platform: leave alone, as autotuning is the common case.
    TcpOtherAutotune,
}

impl Rule {
    /// One line saying what the rule does and which measurement it comes from.
    pub const fn citation(&self) -> &'static str {
        match self {
            Rule::UdpDefault => {
                "UDP 7 MiB rcv+snd: wireguard-go 4.08 -> 5.27 Gbit/s, 2742 -> 0 retransmits \
                 (7 MiB + SO_RCVBUFFORCE); Firezone 10 MB receive doubled a Windows download"
            }
            Rule::UdpBdp => {
                "UDP 2 x bandwidth x RTT: the BDP says more than 7 MiB (Firezone sizes 10 MB as \
                 one BDP: 1.6 Gbit/s at 50 ms)"
            }
            Rule::UdpCeiling => {
                "UDP capped at 64 MiB: larger buffers add latency under load (wireguard-go); \
                 64 MiB is the largest window the seeds use (QUIC connection window)"
            }
            Rule::TcpAutotune => {
                "TCP left to autotuning: Lightway at 190 ms on Linux 11 -> 160 Mbit/s down when \
                 not setting buffers; SO_RCVBUF before connect shrinks wscale (9.34 -> 2.73 Gbit/s)"
            }
            Rule::TcpMacOsExplicit => {
                "TCP on macOS set explicitly: Lightway at 190 ms upload 101 -> 249 Mbit/s when set"
            }
            Rule::TcpOtherAutotune => {
                "TCP on an unknown platform left to autotuning (setting SO_RCVBUF disables it)"
            }
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.citation())
    }
}

/// What to do with a socket's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffers {
    /// Do not call `setsockopt` at all (keeps TCP autotuning).
    LeaveAlone,
    /// Request these sizes in bytes (before the kernel's doubling on Linux).
    Set {
        /// `SO_RCVBUF` request.
        receive: usize,
        /// `SO_SNDBUF` request.
        send: usize,
    },
}

/// QUIC flow-control windows, in bytes, for whatever QUIC stack sits on the socket (e.g.
/// quinn's `TransportConfig::stream_receive_window`, `receive_window`, `send_window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuicWindows {
    /// Per-stream receive window ([`QUIC_STREAM_RECEIVE_WINDOW`]).
    pub stream_receive: u64,
    /// Per-connection receive window ([`QUIC_CONNECTION_RECEIVE_WINDOW`]).
    pub connection_receive: u64,
    /// Send window ([`QUIC_SEND_WINDOW`]).
    pub send: u64,
}

/// The recommended QUIC windows: 16 MiB per stream, 64 MiB per connection, 64 MiB send
/// (seed `quic-tunnel-windows.txt`, see [`QUIC_STREAM_RECEIVE_WINDOW`]).
pub const fn quic_windows() -> QuicWindows {
    QuicWindows {
        stream_receive: QUIC_STREAM_RECEIVE_WINDOW,
        connection_receive: QUIC_CONNECTION_RECEIVE_WINDOW,
        send: QUIC_SEND_WINDOW,
    }
}

/// A decision of the policy for one socket; apply it with `Plan::apply` (unix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Transport the plan is for.
    pub transport: Transport,
    /// Platform the plan is for.
    pub platform: Platform,
    /// Target path, if one was given.
    pub target: Option<Target>,
    /// What to do with the socket buffers.
    pub buffers: Buffers,
    /// The rule that decided [`Plan::buffers`].
    pub rule: Rule,
    /// QUIC windows, for [`Transport::Quic`] only.
    pub quic: Option<QuicWindows>,
}

impl Plan {
    /// The plan for `transport` on the current platform.
    pub fn for_current(transport: Transport, target: Option<Target>) -> Self {
        plan(transport, Platform::current(), target)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}: ", self.transport, self.platform)?;
        match self.buffers {
            Buffers::LeaveAlone => f.write_str("leave buffers alone")?,
            Buffers::Set { receive, send } => write!(f, "rcvbuf {receive} sndbuf {send}")?,
        }
        if let Some(q) = self.quic {
            write!(
                f,
                ", quic windows stream {} connection {} send {}",
                q.stream_receive, q.connection_receive, q.send
            )?;
        }
        write!(f, " ({})", self.rule.citation())
    }
}

/// The policy: what to do with the buffers of a `transport` socket on `platform`, optionally
/// for a known path `target`.
///
/// - UDP, any platform: [`recommended_udp_buffer`] in both directions.
/// - QUIC: the same for its UDP socket, plus [`quic_windows`].
/// - TCP on Linux, Windows and unknown platforms: [`Buffers::LeaveAlone`] ([`Rule::TcpAutotune`]).
/// - TCP on macOS: set explicitly, sized like UDP ([`Rule::TcpMacOsExplicit`]).
pub fn plan(transport: Transport, platform: Platform, target: Option<Target>) -> Plan {
    let (buffers, rule, quic) = match (transport, platform) {
        (Transport::Udp, _) => {
            let (size, rule) = recommended_udp_buffer(target);
            (set_both(size), rule, None)
        }
        (Transport::Quic, _) => {
            let (size, rule) = recommended_udp_buffer(target);
            (set_both(size), rule, Some(quic_windows()))
        }
        (Transport::Tcp, Platform::Linux | Platform::Windows) => {
            (Buffers::LeaveAlone, Rule::TcpAutotune, None)
        }
        (Transport::Tcp, Platform::MacOs) => {
            let (size, _) = recommended_udp_buffer(target);
            (set_both(size), Rule::TcpMacOsExplicit, None)
        }
        (Transport::Tcp, Platform::Other) => (Buffers::LeaveAlone, Rule::TcpOtherAutotune, None),
    };
    Plan {
        transport,
        platform,
        target,
        buffers,
        rule,
        quic,
    }
}

fn set_both(size: usize) -> Buffers {
    Buffers::Set {
        receive: size,
        send: size,
    }
}

/// Bandwidth-delay product in bytes: `bandwidth_bps` × `rtt` / 8, saturating.
///
/// ```
/// # use std::time::Duration;
/// // Firezone's example: 1.6 Gbit/s at 50 ms is 10 MB in flight.
/// assert_eq!(bufscope_policy::bdp_bytes(1_600_000_000, Duration::from_millis(50)), 10_000_000);
/// ```
pub fn bdp_bytes(bandwidth_bps: u64, rtt: Duration) -> u64 {
    let bits = u128::from(bandwidth_bps) * rtt.as_nanos() / 1_000_000_000;
    u64::try_from(bits / 8).unwrap_or(u64::MAX)
}

/// The UDP buffer size to request (each direction) and the rule that chose it:
/// [`UDP_DEFAULT_BUFFER`], or [`BDP_HEADROOM`] × BDP of `target` when that is larger, never more
/// than [`UDP_BUFFER_CEILING`].
pub fn recommended_udp_buffer(target: Option<Target>) -> (usize, Rule) {
    let Some(t) = target else {
        return (UDP_DEFAULT_BUFFER, Rule::UdpDefault);
    };
    let want = t.bdp_bytes().saturating_mul(BDP_HEADROOM);
    if want <= UDP_DEFAULT_BUFFER as u64 {
        (UDP_DEFAULT_BUFFER, Rule::UdpDefault)
    } else if want >= UDP_BUFFER_CEILING as u64 {
        (UDP_BUFFER_CEILING, Rule::UdpCeiling)
    } else {
        // `want` < UDP_BUFFER_CEILING, which is a usize.
        (
            usize::try_from(want).unwrap_or(UDP_BUFFER_CEILING),
            Rule::UdpBdp,
        )
    }
}

/// What `getsockopt` should return after successfully requesting `requested` bytes on
/// `platform`: Linux doubles the value to account for bookkeeping overhead (`struct sk_buff`),
/// other platforms report the request as is.
pub fn expected_readback(platform: Platform, requested: usize) -> usize {
    match platform {
        Platform::Linux => requested.saturating_mul(2),
        Platform::MacOs | Platform::Windows | Platform::Other => requested,
    }
}

/// Whether the kernel gave less than asked: the effective (read back) size is below
/// [`expected_readback`] of the request. On Linux that is the silent cap at
/// `net.core.rmem_max` / `wmem_max` (the readback is then 2 × the limit).
pub fn is_clamped(platform: Platform, requested: usize, effective: usize) -> bool {
    effective < expected_readback(platform, requested)
}

/// The fix for a clamped `direction` buffer of `requested` bytes on `platform`: the sysctl that
/// raises the limit, and on Linux the capability that bypasses it.
pub fn clamp_fix(platform: Platform, direction: Direction, requested: usize) -> String {
    match platform {
        Platform::Linux => {
            let (sysctl, force) = match direction {
                Direction::Receive => ("net.core.rmem_max", "SO_RCVBUFFORCE"),
                Direction::Send => ("net.core.wmem_max", "SO_SNDBUFFORCE"),
            };
            format!(
                "sysctl -w {sysctl}={requested} (or give the process CAP_NET_ADMIN so {force} \
                 bypasses the limit)"
            )
        }
        Platform::MacOs => format!(
            "sysctl -w kern.ipc.maxsockbuf={} (the {direction} buffer limit)",
            requested.saturating_mul(2)
        ),
        Platform::Windows | Platform::Other => format!(
            "raise the operating system's {direction} socket buffer limit to at least {requested} bytes"
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn bdp_matches_firezone_example_and_saturates() {
        // Firezone seed: 80 Mb / 0.05 s = 1600 Mbit/s, i.e. 10 MB in flight.
        assert_eq!(bdp_bytes(1_600_000_000, MS(50)), 10_000_000);
        // Lightway's path: 190 ms; 160 Mbit/s needs 3.8 MB.
        assert_eq!(bdp_bytes(160_000_000, MS(190)), 3_800_000);
        assert_eq!(bdp_bytes(0, MS(190)), 0);
        assert_eq!(bdp_bytes(1_000_000_000, Duration::ZERO), 0);
        assert_eq!(bdp_bytes(u64::MAX, Duration::from_secs(3600)), u64::MAX);
    }

    #[test]
    fn udp_default_is_7_mib_both_directions_on_every_platform() {
        for platform in [
            Platform::Linux,
            Platform::MacOs,
            Platform::Windows,
            Platform::Other,
        ] {
            let p = plan(Transport::Udp, platform, None);
            assert_eq!(
                p.buffers,
                Buffers::Set {
                    receive: 7 * 1024 * 1024,
                    send: 7 * 1024 * 1024
                },
                "{platform}"
            );
            assert_eq!(p.rule, Rule::UdpDefault);
            assert_eq!(p.quic, None);
        }
    }

    #[test]
    fn udp_small_bdp_keeps_the_default() {
        // 1 Gbit/s at 50 ms = 6.25 MB, x2 = 12.5 MB > 7 MiB: BDP rule. 100 Mbit/s at 50 ms
        // = 625 kB, x2 = 1.25 MB < 7 MiB: default.
        let (size, rule) = recommended_udp_buffer(Some(Target::new(100_000_000, MS(50))));
        assert_eq!((size, rule), (UDP_DEFAULT_BUFFER, Rule::UdpDefault));
    }

    #[test]
    fn udp_large_bdp_wins_with_headroom() {
        let t = Target::new(1_000_000_000, MS(50));
        let (size, rule) = recommended_udp_buffer(Some(t));
        assert_eq!(rule, Rule::UdpBdp);
        assert_eq!(size, 12_500_000);
        assert_eq!(size as u64, 2 * t.bdp_bytes());
        let p = plan(Transport::Udp, Platform::Linux, Some(t));
        assert_eq!(
            p.buffers,
            Buffers::Set {
                receive: 12_500_000,
                send: 12_500_000
            }
        );
    }

    #[test]
    fn udp_bdp_is_capped_at_the_ceiling() {
        // 10 Gbit/s at 190 ms = 237.5 MB: far above the ceiling.
        let (size, rule) = recommended_udp_buffer(Some(Target::new(10_000_000_000, MS(190))));
        assert_eq!((size, rule), (64 * 1024 * 1024, Rule::UdpCeiling));
        // Exactly at the boundary: 2 x BDP just below the ceiling is still the BDP rule.
        let bps = (UDP_BUFFER_CEILING as u64 / 2 - 1) * 8; // over 1 s
        let (size, rule) = recommended_udp_buffer(Some(Target::new(bps, Duration::from_secs(1))));
        assert_eq!(rule, Rule::UdpBdp);
        assert_eq!(size, UDP_BUFFER_CEILING - 2);
    }

    #[test]
    fn tcp_is_left_to_autotuning_on_linux_windows_and_unknown() {
        for (platform, rule) in [
            (Platform::Linux, Rule::TcpAutotune),
            (Platform::Windows, Rule::TcpAutotune),
            (Platform::Other, Rule::TcpOtherAutotune),
        ] {
            // Even a huge BDP does not make bufscope lock a TCP buffer.
            let p = plan(
                Transport::Tcp,
                platform,
                Some(Target::new(1_000_000_000, MS(190))),
            );
            assert_eq!(p.buffers, Buffers::LeaveAlone, "{platform}");
            assert_eq!(p.rule, rule);
        }
    }

    #[test]
    fn tcp_on_macos_is_set_explicitly() {
        let p = plan(Transport::Tcp, Platform::MacOs, None);
        assert_eq!(p.rule, Rule::TcpMacOsExplicit);
        assert_eq!(
            p.buffers,
            Buffers::Set {
                receive: UDP_DEFAULT_BUFFER,
                send: UDP_DEFAULT_BUFFER
            }
        );
        let p = plan(
            Transport::Tcp,
            Platform::MacOs,
            Some(Target::new(1_000_000_000, MS(190))),
        );
        assert_eq!(
            p.buffers,
            Buffers::Set {
                receive: 47_500_000,
                send: 47_500_000
            }
        );
    }

    #[test]
    fn quic_gets_16_64_64_mib_windows_and_udp_socket_buffers() {
        let p = plan(Transport::Quic, Platform::Linux, None);
        assert_eq!(
            p.quic,
            Some(QuicWindows {
                stream_receive: 16 * 1024 * 1024,
                connection_receive: 64 * 1024 * 1024,
                send: 64 * 1024 * 1024,
            })
        );
        assert_eq!(
            p.buffers,
            plan(Transport::Udp, Platform::Linux, None).buffers
        );
    }

    #[test]
    fn linux_readback_doubles_and_clamp_detection_uses_it() {
        assert_eq!(expected_readback(Platform::Linux, 65536), 131072);
        assert_eq!(expected_readback(Platform::MacOs, 65536), 65536);
        // Measured with rmem_max = 4 MiB: 16 MiB requested reads back 8 MiB (clamped, doubled).
        assert!(is_clamped(Platform::Linux, 16 * MIB, 8 * MIB));
        assert!(!is_clamped(Platform::Linux, 4 * MIB, 8 * MIB));
        // Kernel minimums round small requests up: not a clamp.
        assert!(!is_clamped(Platform::Linux, 1, 4608));
        assert!(is_clamped(Platform::MacOs, 8 * MIB, 7 * MIB));
    }

    #[test]
    fn clamp_fix_names_the_sysctl_and_the_capability() {
        let r = clamp_fix(Platform::Linux, Direction::Receive, UDP_DEFAULT_BUFFER);
        assert!(r.starts_with("sysctl -w net.core.rmem_max=7340032"), "{r}");
        assert!(
            r.contains("CAP_NET_ADMIN") && r.contains("SO_RCVBUFFORCE"),
            "{r}"
        );
        let s = clamp_fix(Platform::Linux, Direction::Send, 1234);
        assert!(s.starts_with("sysctl -w net.core.wmem_max=1234"), "{s}");
        assert!(s.contains("SO_SNDBUFFORCE"), "{s}");
        assert!(
            clamp_fix(Platform::MacOs, Direction::Receive, 10).contains("kern.ipc.maxsockbuf=20")
        );
    }

    #[test]
    fn every_rule_cites_a_measurement() {
        for rule in [
            Rule::UdpDefault,
            Rule::UdpBdp,
            Rule::UdpCeiling,
            Rule::TcpAutotune,
            Rule::TcpMacOsExplicit,
            Rule::TcpOtherAutotune,
        ] {
            assert!(!rule.citation().is_empty());
        }
        assert!(Rule::UdpDefault.citation().contains("4.08 -> 5.27"));
        assert!(Rule::TcpAutotune.citation().contains("11 -> 160"));
        assert!(Rule::TcpMacOsExplicit.citation().contains("101 -> 249"));
    }

    #[test]
    fn current_platform_is_the_default() {
        assert_eq!(Platform::default(), Platform::current());
        #[cfg(target_os = "linux")]
        assert_eq!(Platform::current(), Platform::Linux);
        let p = Plan::for_current(Transport::Tcp, None);
        assert_eq!(p.platform, Platform::current());
    }
}
