//! Advice: turns what the probes observed into per-process findings that say what to change.
//!
//! The rules live in `bufscope-policy` (the same crate the reference tunnel applies), so the
//! exporter and the tunnel never disagree about what "right" is. This module is pure: the
//! collector hands it an [`Inputs`] snapshot, it returns [`Finding`]s. One finding per
//! (process, kind); the worst socket is named in the evidence.
//!
//! The JSON served at `/api/v1/findings` is [`Report`] (schema version [`SCHEMA_VERSION`],
//! documented in `docs/findings.md`).

use std::collections::BTreeMap;
use std::time::Duration;

use bufscope_policy::{self as policy, Direction, Platform, Rule};
use serde::Serialize;

use crate::signals::setsockopt::BufOption;
use crate::store::{ProcMeta, ProcRef, Proto};

/// Version of the `/api/v1/findings` schema. Bumped only on incompatible changes.
pub const SCHEMA_VERSION: u32 = 1;

/// How bad a finding is: what it costs now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Costs throughput now (sustained drops in the last window, a connection running at the
    /// ceiling its locked buffer sets, connections born crippled).
    Critical,
    /// A latent problem, sporadic drops, or one that was not active in the last window.
    Warning,
    /// Observed, but costs nothing measurable now (e.g. a locked buffer at an RTT where it
    /// cannot limit, an idle connection).
    Info,
}

impl Severity {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Critical => "critical",
            Self::Warning => "warning",
            Self::Info => "info",
        }
    }
}

/// Drops per second from which drops are *sustained* (critical): the threshold of the shipped
/// `BufscopeSocketDropsSustained` alert. Fewer are sporadic (a warning).
pub const SUSTAINED_DROPS_PER_SECOND: f64 = 1.0;

/// RTTs below this are the same host (loopback, veth): no buffer limits a flow there.
const SAME_HOST_RTT_US: u32 = 100;

/// A WAN round trip to say what a lock would cost on a real path (a VPN across a continent).
const WAN_RTT: Duration = Duration::from_millis(50);

/// Finding kinds (the `kind` label and JSON field).
pub mod kind {
    /// A UDP socket drops datagrams because its receive buffer is full.
    pub const UDP_RCVBUF_DROPS: &str = "udp_rcvbuf_drops";
    /// A TCP socket drops segments for buffer reasons (zero window, rmem, backlog, OFO).
    pub const TCP_BUFFER_DROPS: &str = "tcp_buffer_drops";
    /// A TUN/TAP device's queue overflows: the tunnel process does not read it fast enough.
    pub const TUN_RING_FULL: &str = "tun_ring_full";
    /// A receive-buffer request was clamped to `net.core.rmem_max`.
    pub const RCVBUF_CLAMPED: &str = "rcvbuf_clamped";
    /// A send-buffer request was clamped to `net.core.wmem_max`.
    pub const SNDBUF_CLAMPED: &str = "sndbuf_clamped";
    /// `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE` refused (no CAP_NET_ADMIN).
    pub const FORCE_REFUSED: &str = "force_refused";
    /// TCP sockets with `SOCK_RCVBUF_LOCK`: receive autotuning off.
    pub const TCP_RCVBUF_LOCK: &str = "tcp_rcvbuf_lock";
    /// TCP connections born with a shrunken window scale.
    pub const TCP_WSCALE_SHRUNK: &str = "tcp_wscale_shrunk";
    /// The kernel wanted to grow a locked TCP receive buffer.
    pub const AUTOTUNE_SUPPRESSED: &str = "autotune_suppressed";
}

/// The process a finding is about.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProcessRef {
    /// Process id.
    pub pid: u32,
    /// Process name.
    pub comm: String,
    /// Container id, empty on the host.
    pub container: String,
}

/// The socket a finding names (the worst one of the process for that kind).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SocketRef {
    /// Socket inode (`/proc/<pid>/fd/* -> socket:[inode]`, `ss -e ino:`).
    pub inode: u64,
    /// `udp`, `tcp` or `other`.
    pub proto: &'static str,
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    /// See [`kind`].
    pub kind: &'static str,
    /// How bad.
    pub severity: Severity,
    /// Who.
    pub process: ProcessRef,
    /// Which socket, when one is to blame.
    pub socket: Option<SocketRef>,
    /// What is wrong, with the numbers.
    pub summary: String,
    /// What to change.
    pub fix: String,
    /// The numbers behind it (bytes, packets, per second, microseconds).
    pub evidence: BTreeMap<&'static str, f64>,
    /// The measurement the recommendation comes from (bufscope-policy's citation).
    pub rule: &'static str,
    /// What the guard (`--guard.mode`) is already doing about it for this process, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guard: Option<String>,
}

/// What `/api/v1/findings` returns.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub version: u32,
    /// Seconds since the Unix epoch when the report was made.
    pub generated_at: u64,
    /// Findings, most severe first.
    pub findings: Vec<Finding>,
}

/// Drops of one socket (or device).
#[derive(Clone, Debug)]
pub struct SocketDrops {
    /// Owner, when known.
    pub owner: Option<ProcRef>,
    /// Socket inode (0 for device drops / sockets without inode).
    pub inode: u64,
    /// Transport.
    pub proto: Proto,
    /// Kernel drop reason name (shared: thousands of sockets drop for the same few reasons).
    pub reason: std::sync::Arc<str>,
    /// Packets dropped so far.
    pub packets: u64,
    /// Packets per second over the advice window.
    pub rate: f64,
    /// Effective receive buffer at the last drop (bytes, as `getsockopt` reports it).
    pub rcvbuf: i32,
    /// Device name for TUN ring drops.
    pub ifname: String,
}

/// The last setsockopt of one option on one socket.
#[derive(Clone, Debug)]
pub struct SocketOpt {
    /// Caller.
    pub owner: ProcRef,
    /// Socket inode.
    pub inode: u64,
    /// Transport.
    pub proto: Proto,
    /// Which option.
    pub option: BufOption,
    /// Requested value.
    pub requested: i64,
    /// Effective size after the call (`sk_rcvbuf`/`sk_sndbuf`).
    pub effective: i64,
    /// Syscall return (0 or -errno).
    pub ret: i32,
    /// Whether the kernel clamped it.
    pub clamped: bool,
}

/// TCP connection shape of one process.
#[derive(Clone, Debug, Default)]
pub struct TcpShape {
    /// Connections established.
    pub established: u64,
    /// Born with a shrunken scale.
    pub shrunk: u64,
    /// Last shrunk connection's (actual, expected) scale.
    pub example: Option<(u8, u8)>,
    /// Sockets that got SOCK_RCVBUF_LOCK (setsockopt or inherited).
    pub locks: u64,
}

/// `tcp_rcvbuf_grow` view of one TCP socket.
#[derive(Clone, Debug)]
pub struct TuneView {
    /// Owner.
    pub owner: Option<ProcRef>,
    /// Socket inode.
    pub inode: u64,
    /// Growth attempts while locked.
    pub suppressed: u64,
    /// Receiver RTT (µs).
    pub rtt_us: u32,
    /// Current receive buffer (bytes).
    pub rcvbuf: i32,
    /// Bytes read in the last RTT-long interval.
    pub copied: u64,
    /// That interval (µs).
    pub interval_us: u64,
}

/// What the guard did for one process under one rule (from the guard room).
#[derive(Clone, Debug)]
pub struct GuardAct {
    /// The process.
    pub owner: ProcRef,
    /// `tcp-autotune` or `udp-floor`.
    pub rule: &'static str,
    /// Enforced (false: observe mode, counted only).
    pub enforced: bool,
    /// Decisions so far.
    pub decisions: u64,
    /// The UDP floor applied (bytes requested, before the kernel doubles it).
    pub floor: i64,
    /// The floor was capped at `rmem_max` below what the policy asks.
    pub floor_capped: bool,
}

/// `net.ipv4.tcp_rmem[2]`'s kernel default, assumed when the sysctl cannot be read.
pub const TCP_RMEM_MAX_DEFAULT: i64 = 6_291_456;

/// Everything the rules look at.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// Per-socket drops.
    pub drops: Vec<SocketDrops>,
    /// Per-socket setsockopt outcomes.
    pub opts: Vec<SocketOpt>,
    /// Per-process TCP shape.
    pub tcp: Vec<(ProcRef, TcpShape)>,
    /// Per-socket autotune state.
    pub tunes: Vec<TuneView>,
    /// Labels of each process.
    pub meta: BTreeMap<ProcRef, ProcMeta>,
    /// `net.core.rmem_max` (None: not readable here).
    pub rmem_max: Option<i64>,
    /// `net.core.wmem_max` (None: not readable here).
    pub wmem_max: Option<i64>,
    /// Host `net.ipv4.tcp_rmem[2]` (autotuning's ceiling).
    pub tcp_rmem_max: i64,
    /// Window over which drop rates are measured.
    pub window: Duration,
    /// What the guard did, per process and rule.
    pub guard: Vec<GuardAct>,
}

fn kib(b: f64) -> String {
    if b >= (1 << 20) as f64 {
        format!("{:.1} MiB", b / (1 << 20) as f64)
    } else {
        format!("{:.0} KiB", b / 1024.0)
    }
}

/// A sysctl value, or "unknown".
fn limit(v: Option<i64>) -> String {
    v.map_or_else(|| "unknown".to_string(), |v| v.to_string())
}

fn mbit(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.2} Gbit/s", bps / 1e9)
    } else if bps >= 1e6 {
        format!("{:.1} Mbit/s", bps / 1e6)
    } else {
        format!("{:.0} kbit/s", bps / 1e3)
    }
}

/// An RTT in the unit that shows it (µs below a millisecond).
fn rtt_text(us: u32) -> String {
    if us < 1000 {
        format!("{us} µs")
    } else {
        format!("{:.1} ms", us as f64 / 1000.0)
    }
}

/// A drop rate as a person reads it: per second when there is about one a second or more,
/// else how many in the window (a single drop is "1 in the last 60s", never "0/s").
fn drop_rate_text(rate: f64, window: Duration) -> String {
    if rate >= 10.0 {
        format!("{rate:.0}/s")
    } else if rate >= SUSTAINED_DROPS_PER_SECOND {
        format!("{rate:.1}/s")
    } else {
        let n = (rate * window.as_secs_f64()).round().max(1.0);
        format!("{n:.0} in the last {}s", window.as_secs())
    }
}

/// Critical when sustained, warning when sporadic or past.
fn drop_severity(rate: f64) -> Severity {
    if rate >= SUSTAINED_DROPS_PER_SECOND {
        Severity::Critical
    } else {
        Severity::Warning
    }
}

struct Builder<'a> {
    inputs: &'a Inputs,
    out: Vec<Finding>,
    /// Clamped receive-buffer requests by socket inode (looked up once per process).
    clamped_rcv: foldhash::HashMap<u64, &'a SocketOpt>,
    /// Processes with locked TCP sockets.
    tcp_locked: foldhash::HashSet<ProcRef>,
}

impl Builder<'_> {
    fn process(&self, p: &ProcRef) -> ProcessRef {
        let m = self.inputs.meta.get(p).cloned().unwrap_or_default();
        ProcessRef {
            pid: p.tgid,
            comm: m.comm,
            container: m.container,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        p: &ProcRef,
        kind: &'static str,
        severity: Severity,
        socket: Option<SocketRef>,
        summary: String,
        fix: String,
        evidence: Vec<(&'static str, f64)>,
        rule: &'static str,
    ) {
        let process = self.process(p);
        self.out.push(Finding {
            kind,
            severity,
            process,
            socket,
            summary,
            fix,
            evidence: evidence.into_iter().collect(),
            rule,
            guard: None,
        });
    }

    /// The clamped receive request of `inode`, if any.
    fn clamped_request(&self, inode: u64) -> Option<&SocketOpt> {
        self.clamped_rcv.get(&inode).copied()
    }
}

/// Group `items` by owner.
fn by_owner<T>(items: impl Iterator<Item = (ProcRef, T)>) -> BTreeMap<ProcRef, Vec<T>> {
    let mut m: BTreeMap<ProcRef, Vec<T>> = BTreeMap::new();
    for (p, t) in items {
        m.entry(p).or_default().push(t);
    }
    m
}

/// Evaluates every rule.
pub fn evaluate(inputs: &Inputs) -> Vec<Finding> {
    let mut b = Builder {
        inputs,
        out: Vec::new(),
        clamped_rcv: inputs
            .opts
            .iter()
            .filter(|o| o.clamped && matches!(o.option, BufOption::Rcvbuf | BufOption::RcvbufForce))
            .map(|o| (o.inode, o))
            .collect(),
        tcp_locked: inputs
            .tcp
            .iter()
            .filter(|(_, s)| s.locks > 0)
            .map(|(p, _)| *p)
            .collect(),
    };
    udp_drops(&mut b);
    tcp_drops(&mut b);
    tun_ring(&mut b);
    clamps(&mut b);
    tcp_locks(&mut b);
    autotune(&mut b);
    mark_guarded(&mut b.out, &inputs.guard);
    // Most severe first; within a severity, what costs most now (drop rate) first.
    let cost = |f: &Finding| f.evidence.get("drops_per_second").copied().unwrap_or(0.0);
    b.out.sort_by(|x, y| {
        x.severity
            .cmp(&y.severity)
            .then(cost(y).total_cmp(&cost(x)))
            .then((x.process.pid, x.kind).cmp(&(y.process.pid, y.kind)))
    });
    b.out
}

/// The guard rule that addresses findings of `kind`, if one does.
fn guard_rule_for(kind: &str) -> Option<&'static str> {
    match kind {
        kind::TCP_RCVBUF_LOCK | kind::TCP_WSCALE_SHRUNK | kind::AUTOTUNE_SUPPRESSED => {
            Some("tcp-autotune")
        }
        kind::UDP_RCVBUF_DROPS | kind::RCVBUF_CLAMPED | kind::SNDBUF_CLAMPED => Some("udp-floor"),
        _ => None,
    }
}

/// Says, on each finding the guard addresses for its process, what the guard did.
fn mark_guarded(out: &mut [Finding], acts: &[GuardAct]) {
    for f in out.iter_mut() {
        let Some(rule) = guard_rule_for(f.kind) else {
            continue;
        };
        let mine: Vec<&GuardAct> = acts
            .iter()
            .filter(|a| a.owner.tgid == f.process.pid && a.rule == rule)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let enforced: u64 = mine
            .iter()
            .filter(|a| a.enforced)
            .map(|a| a.decisions)
            .sum();
        let observed: u64 = mine
            .iter()
            .filter(|a| !a.enforced)
            .map(|a| a.decisions)
            .sum();
        let what = match rule {
            "tcp-autotune" => "buffer requests skipped so autotuning stays on".to_string(),
            _ => {
                let floor = mine.iter().map(|a| a.floor).max().unwrap_or(0);
                let capped = mine.iter().any(|a| a.floor_capped);
                format!(
                    "UDP buffers raised to {}{}",
                    kib(floor as f64),
                    if capped {
                        " (capped at net.core.rmem_max: raise it for the full floor)"
                    } else {
                        ""
                    }
                )
            }
        };
        f.guard = Some(if enforced > 0 {
            format!("the guard is fixing this ({rule}): {enforced} decisions, {what}")
        } else {
            format!(
                "the guard (observe mode) would fix this ({rule}): {observed} decisions, {what}"
            )
        });
    }
}

fn udp_drops(b: &mut Builder<'_>) {
    let window = b.inputs.window.as_secs();
    let groups = by_owner(b.inputs.drops.iter().filter_map(|d| {
        let udp = d.proto == Proto::Udp && d.inode != 0;
        let full = matches!(&*d.reason, "SOCKET_RCVBUFF" | "PROTO_MEM");
        (udp && full).then(|| d.owner.map(|o| (o, d))).flatten()
    }));
    let (want, rule) = policy::recommended_udp_buffer(None);
    for (p, socks) in groups {
        let total: u64 = socks.iter().map(|d| d.packets).sum();
        let rate: f64 = socks.iter().map(|d| d.rate).sum();
        let Some(worst) = socks.iter().max_by(|a, c| {
            (a.rate, a.packets)
                .partial_cmp(&(c.rate, c.packets))
                .unwrap_or(std::cmp::Ordering::Equal)
        }) else {
            continue;
        };
        let severity = drop_severity(rate);
        let mut evidence = vec![
            ("drops_total", total as f64),
            ("drops_per_second", rate),
            ("rcvbuf_bytes", worst.rcvbuf as f64),
            ("sockets", socks.len() as f64),
            ("recommended_bytes", want as f64),
        ];
        if let Some(r) = b.inputs.rmem_max {
            evidence.push(("rmem_max_bytes", r as f64));
        }
        let what = if rate >= SUSTAINED_DROPS_PER_SECOND {
            format!(
                "dropping {} over the last {window}s",
                drop_rate_text(rate, b.inputs.window)
            )
        } else if rate > 0.0 {
            format!(
                "dropped {} (sporadic; {total} in total)",
                drop_rate_text(rate, b.inputs.window)
            )
        } else {
            format!("dropped {total} datagrams (none in the last {window}s)")
        };
        let mut summary = format!(
            "UDP socket {what} with an effective {} receive buffer",
            kib(worst.rcvbuf as f64)
        );
        if socks.len() > 1 {
            summary.push_str(&format!(" ({} sockets affected)", socks.len()));
        }
        let fix = match b.clamped_request(worst.inode) {
            Some(o) => {
                evidence.push(("requested_bytes", o.requested as f64));
                summary.push_str(&format!(
                    "; requested {} was clamped by net.core.rmem_max={}",
                    kib(o.requested as f64),
                    limit(b.inputs.rmem_max)
                ));
                format!(
                    "raise it: {} — then the {} request takes effect",
                    policy::clamp_fix(
                        Platform::Linux,
                        Direction::Receive,
                        o.requested.max(want as i64) as usize
                    ),
                    kib(o.requested as f64)
                )
            }
            None if (worst.rcvbuf as i64) < 2 * want as i64 => format!(
                "request a {} receive buffer: SO_RCVBUFFORCE (with CAP_NET_ADMIN), else SO_RCVBUF \
                 with net.core.rmem_max >= {want} (now {}); UDP has no autotuning",
                kib(want as f64),
                limit(b.inputs.rmem_max)
            ),
            None => "the buffer is already large: the reader is too slow for the arrival rate \
                     (read in batches with recvmmsg/GRO, more reader threads or SO_REUSEPORT)"
                .to_string(),
        };
        b.push(
            &p,
            kind::UDP_RCVBUF_DROPS,
            severity,
            Some(SocketRef {
                inode: worst.inode,
                proto: "udp",
            }),
            summary,
            fix,
            evidence,
            rule.citation(),
        );
    }
}

fn tcp_drops(b: &mut Builder<'_>) {
    let groups = by_owner(b.inputs.drops.iter().filter_map(|d| {
        (d.proto == Proto::Tcp)
            .then(|| d.owner.map(|o| (o, d)))
            .flatten()
    }));
    for (p, drops) in groups {
        let total: u64 = drops.iter().map(|d| d.packets).sum();
        let rate: f64 = drops.iter().map(|d| d.rate).sum();
        let mut reasons: Vec<&str> = drops.iter().map(|d| &*d.reason).collect();
        reasons.sort_unstable();
        reasons.dedup();
        let locked = b.tcp_locked.contains(&p);
        let fix = if locked {
            "this process locks its TCP receive buffers (SO_RCVBUF): remove the setsockopt so \
             autotuning can size them"
                .to_string()
        } else {
            "the application reads too slowly for the arrival rate (zero window / receive queue \
             full); these are retransmitted, costing throughput and latency"
                .to_string()
        };
        b.push(
            &p,
            kind::TCP_BUFFER_DROPS,
            if rate >= SUSTAINED_DROPS_PER_SECOND && locked {
                Severity::Critical
            } else {
                Severity::Warning
            },
            None,
            format!(
                "TCP segments dropped for buffer reasons ({}): {total} in total, {}",
                reasons.join(", "),
                if rate > 0.0 {
                    format!("{} now", drop_rate_text(rate, b.inputs.window))
                } else {
                    format!("none in the last {}s", b.inputs.window.as_secs())
                }
            ),
            fix,
            vec![("drops_total", total as f64), ("drops_per_second", rate)],
            Rule::TcpAutotune.citation(),
        );
    }
}

fn tun_ring(b: &mut Builder<'_>) {
    let groups = by_owner(b.inputs.drops.iter().filter_map(|d| {
        (&*d.reason == "FULL_RING" && d.inode == 0)
            .then(|| d.owner.map(|o| (o, d)))
            .flatten()
    }));
    for (p, drops) in groups {
        let total: u64 = drops.iter().map(|d| d.packets).sum();
        let rate: f64 = drops.iter().map(|d| d.rate).sum();
        let mut devs: Vec<&str> = drops.iter().map(|d| d.ifname.as_str()).collect();
        devs.sort_unstable();
        devs.dedup();
        b.push(
            &p,
            kind::TUN_RING_FULL,
            drop_severity(rate),
            None,
            format!(
                "TUN device {} queue overflowed: {total} packets dropped before the tunnel read them ({})",
                devs.join(", "),
                if rate > 0.0 {
                    format!("{} now", drop_rate_text(rate, b.inputs.window))
                } else {
                    format!("none in the last {}s", b.inputs.window.as_secs())
                }
            ),
            format!(
                "read the TUN device faster (batching, offloads, a reader thread per queue with \
                 IFF_MULTI_QUEUE) or deepen its queue: ip link set dev {} txqueuelen 5000",
                devs.first().copied().unwrap_or("<tun>")
            ),
            vec![("drops_total", total as f64), ("drops_per_second", rate)],
            "TUN tx queue = txqueuelen packets (drivers/net/tun.c tun_net_xmit, reason FULL_RING)",
        );
    }
}

fn clamps(b: &mut Builder<'_>) {
    let groups = by_owner(b.inputs.opts.iter().map(|o| (o.owner, o)));
    for (p, opts) in groups {
        for (k, dir, cap) in [
            (kind::RCVBUF_CLAMPED, Direction::Receive, b.inputs.rmem_max),
            (kind::SNDBUF_CLAMPED, Direction::Send, b.inputs.wmem_max),
        ] {
            let of_dir = |o: &&&SocketOpt| match dir {
                Direction::Receive => {
                    matches!(o.option, BufOption::Rcvbuf | BufOption::RcvbufForce)
                }
                Direction::Send => matches!(o.option, BufOption::Sndbuf | BufOption::SndbufForce),
            };
            let clamped: Vec<&&SocketOpt> =
                opts.iter().filter(of_dir).filter(|o| o.clamped).collect();
            if let Some(o) = clamped.iter().max_by_key(|o| o.requested) {
                let tcp = o.proto == Proto::Tcp;
                let fix = if tcp {
                    "do not set TCP buffers on Linux at all: autotuning grows them up to tcp_rmem[2]/tcp_wmem[2]"
                        .to_string()
                } else {
                    policy::clamp_fix(Platform::Linux, dir, o.requested.max(0) as usize)
                };
                let sysctl = match dir {
                    Direction::Receive => "rmem_max",
                    Direction::Send => "wmem_max",
                };
                b.push(
                    &p,
                    k,
                    Severity::Warning,
                    Some(SocketRef {
                        inode: o.inode,
                        proto: o.proto.as_str(),
                    }),
                    format!(
                        "{} requested {} but the kernel capped it at net.core.{sysctl}={} \
                         (getsockopt reports {}, twice the cap); {} call(s) clamped",
                        o.option.as_str(),
                        kib(o.requested as f64),
                        limit(cap),
                        kib(o.effective as f64),
                        clamped.len()
                    ),
                    fix,
                    vec![
                        ("requested_bytes", o.requested as f64),
                        ("effective_bytes", o.effective as f64),
                        ("limit_bytes", cap.unwrap_or(o.effective / 2) as f64),
                        ("calls", clamped.len() as f64),
                    ],
                    if tcp {
                        Rule::TcpAutotune.citation()
                    } else {
                        Rule::UdpDefault.citation()
                    },
                );
            }
        }
        let refused: Vec<&&SocketOpt> = opts
            .iter()
            .filter(|o| {
                o.ret == -libc::EPERM
                    && matches!(o.option, BufOption::RcvbufForce | BufOption::SndbufForce)
            })
            .collect();
        if let Some(o) = refused.first() {
            b.push(
                &p,
                kind::FORCE_REFUSED,
                Severity::Warning,
                Some(SocketRef {
                    inode: o.inode,
                    proto: o.proto.as_str(),
                }),
                format!(
                    "{} refused (EPERM) {} time(s): the process lacks CAP_NET_ADMIN in the initial user namespace",
                    o.option.as_str(),
                    refused.len()
                ),
                format!(
                    "grant CAP_NET_ADMIN (e.g. AmbientCapabilities=CAP_NET_ADMIN, or the container's \
                     capabilities.add), or raise net.core.rmem_max/wmem_max to {} so the plain option suffices",
                    o.requested
                ),
                vec![("requested_bytes", o.requested as f64), ("calls", refused.len() as f64)],
                Rule::UdpDefault.citation(),
            );
        }
    }
}

fn tcp_locks(b: &mut Builder<'_>) {
    for (p, s) in &b.inputs.tcp.clone() {
        if s.shrunk > 0 {
            let (actual, expected) = s.example.unwrap_or((0, 0));
            let ratio = (1u64 << expected.min(14)) as f64 / (1u64 << actual.min(14)) as f64;
            b.push(
                p,
                kind::TCP_WSCALE_SHRUNK,
                Severity::Critical,
                None,
                format!(
                    "{} of {} TCP connections born with window scale {actual} instead of {expected}: \
                     the receive buffer was set before connect()/listen(); their window is capped at {} \
                     for life ({ratio:.0}x smaller)",
                    s.shrunk,
                    s.established,
                    kib((65535u64 << actual.min(14)) as f64)
                ),
                "remove setsockopt(SO_RCVBUF) before connect()/listen() on Linux (setting it later \
                 cannot raise the scale); let autotuning size the buffer"
                    .to_string(),
                vec![
                    ("connections_shrunk", s.shrunk as f64),
                    ("connections", s.established as f64),
                    ("wscale", actual as f64),
                    ("wscale_expected", expected as f64),
                    ("max_window_bytes", (65535u64 << actual.min(14)) as f64),
                ],
                Rule::TcpAutotune.citation(),
            );
        }
        if s.locks > 0 {
            b.push(
                p,
                kind::TCP_RCVBUF_LOCK,
                Severity::Warning,
                None,
                format!(
                    "{} TCP socket(s) with SOCK_RCVBUF_LOCK: receive autotuning is off for them",
                    s.locks
                ),
                "remove setsockopt(SO_RCVBUF) on Linux TCP sockets (autotuning grows the buffer up \
                 to net.ipv4.tcp_rmem[2]); if a library sets it, SO_BUF_LOCK=0 clears the lock"
                    .to_string(),
                vec![("sockets_locked", s.locks as f64), ("tcp_rmem_max_bytes", b.inputs.tcp_rmem_max as f64)],
                Rule::TcpAutotune.citation(),
            );
        }
    }
}

/// How much a locked TCP receive buffer costs now, from what `tcp_rcvbuf_grow` measured.
struct LockCost {
    /// The ceiling the locked window sets at the measured RTT (≈ rcvbuf/2 per RTT), bit/s.
    cap_bps: f64,
    /// What the reader consumed over the last measured interval, bit/s (0: idle).
    observed_bps: f64,
    /// The window the observed rate needs at this RTT (bytes).
    bdp_bytes: u64,
    severity: Severity,
}

fn lock_cost(t: &TuneView) -> LockCost {
    let rtt = Duration::from_micros(t.rtt_us.max(1) as u64);
    // About half of sk_rcvbuf is advertised as window (tcp_adv_win_scale/scaling_ratio).
    let window = t.rcvbuf.max(0) as f64 / 2.0;
    let cap_bps = window * 8.0 / rtt.as_secs_f64();
    let observed_bps = if t.interval_us > 0 {
        t.copied as f64 * 8.0 / (t.interval_us as f64 / 1e6)
    } else {
        0.0
    };
    let ratio = if cap_bps > 0.0 {
        observed_bps / cap_bps
    } else {
        0.0
    };
    let severity = if observed_bps <= 0.0 || t.rtt_us < SAME_HOST_RTT_US {
        // Idle, or the same host: nothing is limited by the buffer now.
        Severity::Info
    } else if (0.8..=1.25).contains(&ratio) {
        // Running at the ceiling the lock sets: it costs throughput now. (Far above it the
        // window/RTT model does not bind: the buffer is not what limits.)
        Severity::Critical
    } else {
        Severity::Warning
    };
    LockCost {
        cap_bps,
        observed_bps,
        bdp_bytes: policy::bdp_bytes(observed_bps as u64, rtt),
        severity,
    }
}

fn autotune(b: &mut Builder<'_>) {
    let groups = by_owner(
        b.inputs
            .tunes
            .iter()
            .filter(|t| t.suppressed > 0)
            .filter_map(|t| t.owner.map(|o| (o, t))),
    );
    for (p, socks) in groups {
        let total: u64 = socks.iter().map(|t| t.suppressed).sum();
        // The socket whose lock costs most now (then the most suppressed).
        let Some((t, c)) = socks
            .iter()
            .map(|t| (*t, lock_cost(t)))
            .min_by(|(a, x), (b, y)| {
                x.severity
                    .cmp(&y.severity)
                    .then(y.observed_bps.total_cmp(&x.observed_bps))
                    .then(b.suppressed.cmp(&a.suppressed))
            })
        else {
            continue;
        };
        let buf = kib(t.rcvbuf as f64);
        let grow = if b.inputs.tcp_rmem_max > t.rcvbuf as i64 && t.rcvbuf > 0 {
            format!(
                "autotuning could grow it to {} ({:.0}x)",
                kib(b.inputs.tcp_rmem_max as f64),
                b.inputs.tcp_rmem_max as f64 / t.rcvbuf as f64
            )
        } else {
            format!(
                "autotuning could grow it up to {}",
                kib(b.inputs.tcp_rmem_max as f64)
            )
        };
        let wan_cap = t.rcvbuf.max(0) as f64 / 2.0 * 8.0 / WAN_RTT.as_secs_f64();
        let summary = match c.severity {
            Severity::Critical => format!(
                "costs throughput now: the connection runs at the ~{} its locked {buf} receive                  buffer allows at the measured RTT of {} (observed {}); the kernel wanted to                  grow the buffer {total} time(s); {grow}",
                mbit(c.cap_bps),
                rtt_text(t.rtt_us),
                mbit(c.observed_bps),
            ),
            Severity::Warning => format!(
                "not at its ceiling now: a locked {buf} TCP receive buffer allows ~{} at the                  measured RTT of {} (observed {}); it limits the connection once traffic grows;                  the kernel wanted to grow it {total} time(s); {grow}",
                mbit(c.cap_bps),
                rtt_text(t.rtt_us),
                mbit(c.observed_bps),
            ),
            Severity::Info if c.observed_bps <= 0.0 => format!(
                "costs nothing now (idle): a locked {buf} TCP receive buffer, which the kernel                  wanted to grow {total} time(s); on a {} ms path it would cap a connection at                  ~{}",
                WAN_RTT.as_millis(),
                mbit(wan_cap)
            ),
            Severity::Info => format!(
                "costs nothing at this RTT ({}, the same host): a locked {buf} TCP receive                  buffer is not what limits this connection (observed {}); on a {} ms path it                  would cap it at ~{}; the kernel wanted to grow it {total} time(s)",
                rtt_text(t.rtt_us),
                mbit(c.observed_bps),
                WAN_RTT.as_millis(),
                mbit(wan_cap)
            ),
        };
        b.push(
            &p,
            kind::AUTOTUNE_SUPPRESSED,
            c.severity,
            Some(SocketRef {
                inode: t.inode,
                proto: "tcp",
            }),
            summary,
            format!(
                "remove setsockopt(SO_RCVBUF) so autotuning can follow the bandwidth-delay product \
                 (the observed rate needs a {} window at this RTT; autotuning sizes it)",
                kib(c.bdp_bytes as f64)
            ),
            vec![
                ("suppressed_total", total as f64),
                ("rtt_us", t.rtt_us as f64),
                ("rcvbuf_bytes", t.rcvbuf as f64),
                ("throughput_cap_bps", c.cap_bps),
                ("observed_bps", c.observed_bps),
                ("bdp_bytes", c.bdp_bytes as f64),
            ],
            Rule::TcpAutotune.citation(),
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn p(t: u32) -> ProcRef {
        ProcRef {
            tgid: t,
            start_ticks: 1,
        }
    }

    fn inputs() -> Inputs {
        let mut meta = BTreeMap::new();
        meta.insert(
            p(1),
            ProcMeta {
                comm: "wireguard-go".into(),
                container: String::new(),
            },
        );
        Inputs {
            meta,
            rmem_max: Some(212_992),
            wmem_max: Some(212_992),
            tcp_rmem_max: 6_291_456,
            window: Duration::from_secs(60),
            ..Inputs::default()
        }
    }

    #[test]
    fn clamped_udp_request_names_the_sysctl() {
        let mut i = inputs();
        i.drops.push(SocketDrops {
            owner: Some(p(1)),
            inode: 77,
            proto: Proto::Udp,
            reason: "SOCKET_RCVBUFF".into(),
            packets: 5000,
            rate: 120.0,
            rcvbuf: 425_984,
            ifname: String::new(),
        });
        i.opts.push(SocketOpt {
            owner: p(1),
            inode: 77,
            proto: Proto::Udp,
            option: BufOption::Rcvbuf,
            requested: 8 << 20,
            effective: 425_984,
            ret: 0,
            clamped: true,
        });
        let f = evaluate(&i);
        let drops = f.iter().find(|f| f.kind == kind::UDP_RCVBUF_DROPS).unwrap();
        assert_eq!(drops.severity, Severity::Critical);
        assert!(
            drops.summary.contains("dropping 120/s"),
            "{}",
            drops.summary
        );
        assert!(drops.summary.contains("416 KiB"), "{}", drops.summary);
        assert!(
            drops.summary.contains("net.core.rmem_max=212992"),
            "{}",
            drops.summary
        );
        assert!(
            drops.fix.contains("sysctl -w net.core.rmem_max=8388608"),
            "{}",
            drops.fix
        );
        assert_eq!(drops.process.comm, "wireguard-go");
        assert!(f.iter().any(|f| f.kind == kind::RCVBUF_CLAMPED));
    }

    #[test]
    fn unclamped_small_udp_buffer_recommends_policy_size() {
        let mut i = inputs();
        i.drops.push(SocketDrops {
            owner: Some(p(1)),
            inode: 5,
            proto: Proto::Udp,
            reason: "SOCKET_RCVBUFF".into(),
            packets: 10,
            rate: 0.0,
            rcvbuf: 212_992,
            ifname: String::new(),
        });
        let f = evaluate(&i);
        assert_eq!(f[0].severity, Severity::Warning, "no drops in the window");
        assert!(f[0].fix.contains("7.0 MiB"), "{}", f[0].fix);
        assert!(f[0].rule.contains("wireguard-go"));
    }

    #[test]
    fn shrunk_connections_are_critical() {
        let mut i = inputs();
        i.tcp.push((
            p(1),
            TcpShape {
                established: 4,
                shrunk: 3,
                example: Some((1, 10)),
                locks: 3,
            },
        ));
        let f = evaluate(&i);
        assert_eq!(f[0].kind, kind::TCP_WSCALE_SHRUNK);
        assert!(
            f[0].summary.contains("window scale 1 instead of 10"),
            "{}",
            f[0].summary
        );
        assert!(f.iter().any(|f| f.kind == kind::TCP_RCVBUF_LOCK));
    }

    #[test]
    fn autotune_reports_cap_at_rtt() {
        let mut i = inputs();
        i.tunes.push(TuneView {
            owner: Some(p(1)),
            inode: 9,
            suppressed: 12,
            rtt_us: 190_000,
            rcvbuf: 131_072,
            copied: 65536,
            interval_us: 190_000,
        });
        let f = evaluate(&i);
        let a = f
            .iter()
            .find(|f| f.kind == kind::AUTOTUNE_SUPPRESSED)
            .unwrap();
        // 64 KiB window / 190 ms = 2.76 Mbit/s
        assert!((a.evidence["throughput_cap_bps"] - 2_759_410.5).abs() < 10.0);
        assert!(a.summary.contains("190.0 ms"), "{}", a.summary);
        // 64 KiB read per 190 ms: the connection runs at that ceiling.
        assert_eq!(a.severity, Severity::Critical, "{}", a.summary);
        assert!(
            a.summary.starts_with("costs throughput now"),
            "{}",
            a.summary
        );
        assert!(
            a.summary.contains("(48x)"),
            "6 MiB / 128 KiB: {}",
            a.summary
        );
    }

    fn tune(rtt_us: u32, rcvbuf: i32, copied: u64, interval_us: u64) -> TuneView {
        TuneView {
            owner: Some(p(1)),
            inode: 9,
            suppressed: 3,
            rtt_us,
            rcvbuf,
            copied,
            interval_us,
        }
    }

    fn autotune_finding(t: TuneView) -> Finding {
        let mut i = inputs();
        i.tcp_rmem_max = 33_554_432;
        i.tunes.push(t);
        evaluate(&i)
            .into_iter()
            .find(|f| f.kind == kind::AUTOTUNE_SUPPRESSED)
            .unwrap()
    }

    #[test]
    fn a_lock_at_rtt_zero_costs_nothing_and_prints_no_absurd_figure() {
        // What the status page showed on loopback: 9 µs, 128 KiB, 78.8 Gbit/s observed.
        let f = autotune_finding(tune(9, 131_072, 88_650_000, 9_000));
        assert_eq!(f.severity, Severity::Info, "{}", f.summary);
        assert!(
            f.summary.starts_with("costs nothing at this RTT (9 µs"),
            "{}",
            f.summary
        );
        assert!(!f.summary.contains("0.0 ms"), "{}", f.summary);
        // No throughput figure beyond what the host moved: no "14913 Gbit/s".
        for w in f.summary.split_whitespace() {
            if let Ok(v) = w.parse::<f64>() {
                assert!(v < 1000.0, "absurd figure {v} in {}", f.summary);
            }
        }
        // On a WAN path the same lock would cap it: 64 KiB / 50 ms = 10.5 Mbit/s.
        assert!(f.summary.contains("~10.5 Mbit/s"), "{}", f.summary);
        // RTT 0 (unmeasured) is the same case, not a division by zero.
        let f = autotune_finding(tune(0, 131_072, 1_000_000, 1_000));
        assert_eq!(f.severity, Severity::Info);
        assert!(f.evidence["throughput_cap_bps"].is_finite());
    }

    #[test]
    fn an_idle_locked_socket_costs_nothing_now() {
        let f = autotune_finding(tune(40_000, 131_072, 0, 0));
        assert_eq!(f.severity, Severity::Info);
        assert!(
            f.summary.starts_with("costs nothing now (idle)"),
            "{}",
            f.summary
        );
        assert_eq!(f.evidence["observed_bps"], 0.0);
    }

    #[test]
    fn a_lock_below_its_ceiling_is_latent() {
        // 40 ms, 128 KiB: the ceiling is 13.1 Mbit/s; 1 Mbit/s is flowing.
        let f = autotune_finding(tune(40_000, 131_072, 5_000, 40_000));
        assert_eq!(f.severity, Severity::Warning, "{}", f.summary);
        assert!(
            f.summary.starts_with("not at its ceiling now"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("40.0 ms"), "{}", f.summary);
    }

    fn udp(pid: u32, packets: u64, rate: f64) -> SocketDrops {
        SocketDrops {
            owner: Some(p(pid)),
            inode: 100 + pid as u64,
            proto: Proto::Udp,
            reason: "SOCKET_RCVBUFF".into(),
            packets,
            rate,
            rcvbuf: 212_992,
            ifname: String::new(),
        }
    }

    #[test]
    fn a_single_drop_is_sporadic_not_zero_per_second() {
        let mut i = inputs();
        i.drops.push(udp(1, 1, 1.0 / 60.0));
        let f = evaluate(&i);
        assert_eq!(f[0].severity, Severity::Warning, "{}", f[0].summary);
        assert!(
            f[0].summary
                .contains("dropped 1 in the last 60s (sporadic; 1 in total)"),
            "{}",
            f[0].summary
        );
        assert!(!f[0].summary.contains("0/s"), "{}", f[0].summary);
    }

    #[test]
    fn findings_rank_by_what_they_cost_now() {
        let mut i = inputs();
        for (pid, comm) in [(1, "slow"), (2, "fast"), (3, "once")] {
            i.meta.insert(
                p(pid),
                ProcMeta {
                    comm: comm.into(),
                    container: String::new(),
                },
            );
        }
        i.drops.push(udp(1, 600, 10.0));
        i.drops.push(udp(2, 60_000, 1000.0));
        i.drops.push(udp(3, 1, 1.0 / 60.0));
        i.tunes.push(tune(9, 131_072, 88_650_000, 9_000));
        let f = evaluate(&i);
        let order: Vec<(&str, &str)> = f
            .iter()
            .map(|f| (f.process.comm.as_str(), f.severity.as_str()))
            .collect();
        assert_eq!(
            order,
            vec![
                ("fast", "critical"),
                ("slow", "critical"),
                ("once", "warning"),
                ("slow", "info")
            ],
            "{f:#?}"
        );
        assert!(f[0].summary.contains("dropping 1000/s"), "{}", f[0].summary);
    }
}
