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

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Costs throughput now (drops in the last window, connections born crippled).
    Critical,
    /// A latent problem, or one that was not active in the last window.
    Warning,
}

impl Severity {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Critical => "critical",
            Self::Warning => "warning",
        }
    }
}

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
    } else {
        format!("{:.1} Mbit/s", bps / 1e6)
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
    b.out.sort_by(|x, y| {
        (x.severity, x.process.pid, x.kind).cmp(&(y.severity, y.process.pid, y.kind))
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
        let severity = if rate > 0.0 {
            Severity::Critical
        } else {
            Severity::Warning
        };
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
        let what = if rate > 0.0 {
            format!("dropping {rate:.0}/s over the last {window}s")
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
            if rate > 0.0 && locked {
                Severity::Critical
            } else {
                Severity::Warning
            },
            None,
            format!(
                "TCP segments dropped for buffer reasons ({}): {total} in total, {rate:.0}/s now",
                reasons.join(", ")
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
            if rate > 0.0 { Severity::Critical } else { Severity::Warning },
            None,
            format!(
                "TUN device {} queue overflowed: {total} packets dropped before the tunnel read them ({rate:.0}/s now)",
                devs.join(", ")
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
        let Some(t) = socks.iter().max_by_key(|t| t.suppressed) else {
            continue;
        };
        let rtt = Duration::from_micros(t.rtt_us.max(1) as u64);
        // About half of sk_rcvbuf is advertised as window (tcp_adv_win_scale/scaling_ratio).
        let window = t.rcvbuf.max(0) as f64 / 2.0;
        let cap_bps = window * 8.0 / rtt.as_secs_f64();
        let observed_bps = if t.interval_us > 0 {
            t.copied as f64 * 8.0 / (t.interval_us as f64 / 1e6)
        } else {
            0.0
        };
        let auto_cap = b.inputs.tcp_rmem_max as f64 / 2.0 * 8.0 / rtt.as_secs_f64();
        let bdp_obs = policy::bdp_bytes(observed_bps as u64, rtt);
        b.push(
            &p,
            kind::AUTOTUNE_SUPPRESSED,
            Severity::Warning,
            Some(SocketRef {
                inode: t.inode,
                proto: "tcp",
            }),
            format!(
                "the kernel wanted to grow a locked {} TCP receive buffer {total} time(s); at the \
                 measured RTT of {:.1} ms that caps the connection at about {} (observed {}); \
                 autotuning could grow it to {} (~{})",
                kib(t.rcvbuf as f64),
                t.rtt_us as f64 / 1000.0,
                mbit(cap_bps),
                mbit(observed_bps),
                kib(b.inputs.tcp_rmem_max as f64),
                mbit(auto_cap)
            ),
            format!(
                "remove setsockopt(SO_RCVBUF) so autotuning can follow the bandwidth-delay product \
                 (the observed rate needs a {} window at this RTT; autotuning sizes it)",
                kib(bdp_obs as f64)
            ),
            vec![
                ("suppressed_total", total as f64),
                ("rtt_us", t.rtt_us as f64),
                ("rcvbuf_bytes", t.rcvbuf as f64),
                ("throughput_cap_bps", cap_bps),
                ("observed_bps", observed_bps),
                ("bdp_bytes", bdp_obs as f64),
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
    }
}
