//! Advice: turns what the probes observed into per-process findings that say what to change.
//!
//! The rules live in `bufscope-policy` (the same crate the reference tunnel applies), so the
//! exporter and the tunnel never disagree about what "right" is. This module is pure: the
//! collector hands it an [`Inputs`] snapshot and the [`History`] of earlier evaluations, it
//! returns [`Finding`]s: one per socket and buffer direction for what a socket's buffer does
//! (its story, a verdict with numbers, where the fix can be made and what it costs:
//! `sockets.rs`, `fixes.rs`; resolved ones from `history.rs`), one per (process, kind) for
//! the rest (`rules.rs`).
//!
//! The JSON served at `/api/v1/findings` is [`Report`] (schema version [`SCHEMA_VERSION`],
//! documented in `docs/findings.md`), a type of `bufscope-api`, the crate the clients read it
//! with.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bufscope_policy::{self as policy, Rule};

use crate::labels::{BufOption, Proto};
use crate::store::{ProcMeta, ProcRef};

/// The longest window advice measures drop rates over (`--advice.window`): the drop history a
/// room keeps per socket.
pub const MAX_WINDOW: Duration = Duration::from_secs(300);

pub use bufscope_api::{ProcessRef, SCHEMA_VERSION, Severity};

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
    /// A TCP socket with `SOCK_SNDBUF_LOCK`: send autotuning off.
    pub const TCP_SNDBUF_LOCK: &str = "tcp_sndbuf_lock";
    /// TCP connections born with a shrunken window scale.
    pub const TCP_WSCALE_SHRUNK: &str = "tcp_wscale_shrunk";
    /// The kernel wanted to grow a locked TCP receive buffer.
    pub const AUTOTUNE_SUPPRESSED: &str = "autotune_suppressed";
}

/// The socket a finding names (`bufscope-api`'s, with the protocol from [`Proto::as_str`]).
pub type SocketRef = bufscope_api::SocketRef<&'static str>;

/// One finding (`bufscope-api`'s, with the kind, the rule and the evidence keys from this
/// module's tables).
pub type Finding = bufscope_api::Finding<&'static str>;

/// What `/api/v1/findings` returns.
pub type Report = bufscope_api::Report<&'static str>;

/// Drops of one socket (or device).
#[derive(Clone, Debug)]
pub struct SocketDrops {
    /// Owner, when known.
    pub owner: Option<ProcRef>,
    /// Socket inode (0 for device drops / sockets without inode).
    pub inode: u64,
    /// The socket's (or device's) network namespace inode (0 when unknown).
    pub netns: u32,
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

/// One buffer `setsockopt` call as the kernel handled it (derived by the setsockopt room).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallRec {
    /// When (Unix seconds).
    pub at: u64,
    /// Which option.
    pub option: BufOption,
    /// The value the program passed.
    pub requested: i32,
    /// The value the kernel's handler got (the guard may raise it).
    pub applied: i32,
    /// The size of the option's buffer after the call (bytes, as `getsockopt` reports it).
    pub effective: i32,
    /// Return (0 or -errno).
    pub ret: i32,
    /// Capped at `rmem_max`/`wmem_max`.
    pub clamped: bool,
    /// `sk_userlocks & 3` before and after.
    pub locks_before: u8,
    /// After.
    pub locks_after: u8,
    /// `sk_state` at the call (0: not recorded).
    pub state: u8,
    /// `sockopt_flags` of the event (guard decisions).
    pub flags: u8,
}

/// Calls of one socket kept in full at its start.
pub const STORY_FIRST: usize = 8;
/// Calls of one socket kept at its end (the ones between are counted, not kept).
pub const STORY_LAST: usize = 24;

/// What sock_diag said of a TCP socket at one read.
#[derive(Clone, Copy, Debug)]
pub struct TcpSample {
    /// When it was read.
    pub at: Instant,
    /// What it said.
    pub diag: crate::kernel::sock_diag::TcpDiag,
}

/// Every buffer call of one socket, in order (bounded: [`STORY_FIRST`] + [`STORY_LAST`]).
#[derive(Clone, Debug)]
pub struct SocketStory {
    /// The caller of its first call.
    pub owner: ProcRef,
    /// Socket inode.
    pub inode: u64,
    /// Transport.
    pub proto: Proto,
    /// Network namespace inode.
    pub netns: u32,
    /// The first calls.
    pub first: Vec<CallRec>,
    /// The last calls (after `first`).
    pub last: std::collections::VecDeque<CallRec>,
    /// Calls in all.
    pub total: u64,
    /// `sk_rcvbuf` after the last call.
    pub rcvbuf: i32,
    /// `sk_sndbuf` after the last call.
    pub sndbuf: i32,
    /// Lock bits after the last call.
    pub locks: u8,
    /// The last two sock_diag reads (TCP sockets with a lock), oldest first.
    pub tcp: Vec<TcpSample>,
    /// Why sock_diag could not read it, when it could not.
    pub tcp_error: Option<String>,
}

impl SocketStory {
    /// A socket with no calls yet.
    pub fn new(owner: ProcRef, inode: u64, proto: Proto, netns: u32) -> Self {
        Self {
            owner,
            inode,
            proto,
            netns,
            first: Vec::new(),
            last: std::collections::VecDeque::new(),
            total: 0,
            rcvbuf: 0,
            sndbuf: 0,
            locks: 0,
            tcp: Vec::new(),
            tcp_error: None,
        }
    }

    /// Adds a call (the first [`STORY_FIRST`] and the last [`STORY_LAST`] are kept).
    pub fn push(&mut self, c: CallRec) {
        self.total += 1;
        if self.first.len() < STORY_FIRST {
            self.first.push(c);
        } else {
            if self.last.len() == STORY_LAST {
                self.last.pop_front();
            }
            self.last.push_back(c);
        }
        if c.ret == 0 {
            match c.option {
                BufOption::Sndbuf | BufOption::SndbufForce => self.sndbuf = c.effective,
                BufOption::Rcvbuf | BufOption::RcvbufForce => self.rcvbuf = c.effective,
                BufOption::BufLock => {}
            }
            self.locks = c.locks_after;
        }
    }

    /// The calls kept, in order.
    pub fn calls(&self) -> impl Iterator<Item = &CallRec> {
        self.first.iter().chain(self.last.iter())
    }

    /// Calls made but not kept.
    pub fn omitted(&self) -> u64 {
        self.total - (self.first.len() + self.last.len()) as u64
    }

    /// Adds a sock_diag read (the last two are kept: rates are measured between them).
    pub fn sample(&mut self, s: TcpSample) {
        if self.tcp.len() == 2 {
            self.tcp.remove(0);
        }
        self.tcp.push(s);
        self.tcp_error = None;
    }
}

/// How a network namespace sees `net.core.rmem_max`/`wmem_max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitScope {
    /// The socket is in the host's (bufscope's) namespace.
    Host,
    /// The namespace shows the host's value read-only (6.11+): raised only on the host.
    ReadOnly,
    /// The namespace has its own writable value: it can be raised inside it.
    Writable,
    /// The namespace has no such file (before 6.11): only the host sets it.
    Absent,
    /// bufscope could not look (entering the namespace failed: no `CAP_SYS_ADMIN` over it,
    /// or its processes exited first).
    Unknown,
}

impl LimitScope {
    /// The JSON value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::ReadOnly => "read_only",
            Self::Writable => "netns",
            Self::Absent => "absent",
            Self::Unknown => "unknown",
        }
    }
}

/// `rmem_max`/`wmem_max` as one network namespace sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NsLimits {
    /// How the namespace sees them.
    pub scope: LimitScope,
    /// `rmem_max` as read there (None: absent or unreadable).
    pub rmem_max: Option<i64>,
    /// `wmem_max` as read there.
    pub wmem_max: Option<i64>,
    /// The socket's owner runs in a user namespace other than the initial one: a capability
    /// it holds there does not pass `capable(CAP_NET_ADMIN)` for `*FORCE`.
    pub user_ns: bool,
    /// Why the namespace's view could not be read (an errno of entering it), with
    /// [`LimitScope::Unknown`].
    pub unreadable: Option<i32>,
}

impl NsLimits {
    /// Why the namespace's view could not be read, in words (None when it was read).
    pub fn unreadable_text(&self) -> Option<String> {
        let errno = self.unreadable?;
        let why = match errno {
            libc::EPERM => "EPERM: setns needs CAP_SYS_ADMIN over the namespace".to_string(),
            libc::ENOENT | libc::ESRCH => {
                "the process exited before bufscope could enter its namespace".to_string()
            }
            e => std::io::Error::from_raw_os_error(e).to_string(),
        };
        Some(format!("not readable from bufscope ({why})"))
    }
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
    /// Sockets `--guard.udp-budget` left at the kernel's size (not raised).
    pub left_out: u64,
    /// The receive bytes they did not get.
    pub left_out_bytes: u64,
    /// `--guard.udp-budget` (bytes).
    pub budget: u64,
}

/// `net.ipv4.tcp_rmem[2]`'s kernel default, assumed when the sysctl cannot be read.
pub const TCP_RMEM_MAX_DEFAULT: i64 = 6_291_456;

/// `net.ipv4.tcp_wmem[2]`'s kernel default, assumed when the sysctl cannot be read.
pub const TCP_WMEM_MAX_DEFAULT: i64 = 4_194_304;

/// Everything the rules look at.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// Per-socket drops.
    pub drops: Vec<SocketDrops>,
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
    /// Netlink sockets that overran.
    pub netlink: Vec<NetlinkView>,
    /// XFRM errors of namespaces with a known IKE daemon.
    pub xfrm: Vec<XfrmView>,
    /// Every socket with buffer calls (the setsockopt room's, shared: evaluations and the
    /// findings they keep copy none).
    pub stories: Vec<std::sync::Arc<SocketStory>>,
    /// How each network namespace of those sockets sees the limits.
    pub ns_limits: BTreeMap<u32, NsLimits>,
    /// `net.ipv4.tcp_wmem[2]` (send autotuning's ceiling) of the host.
    pub tcp_wmem_max: i64,
    /// UDP sockets in use in the host's namespace (`/proc/net/sockstat`), for what a raised
    /// default would cost.
    pub udp_sockets: Option<u64>,
    /// Live sockets of the programs whose costing socket is gone ([`History::waiting`]),
    /// including ones they never sized: a restart's new socket.
    pub live: Vec<LiveSocket>,
}

impl Inputs {
    /// Whether time alone changes what the rules find in these inputs: a drop or error rate
    /// over the window that is not 0 yet decays as the window slides.
    pub fn decaying(&self) -> bool {
        self.drops.iter().any(|d| d.rate > 0.0)
            || self.netlink.iter().any(|n| n.rate > 0.0)
            || self
                .xfrm
                .iter()
                .any(|x| x.reasons.iter().any(|(_, _, rate)| *rate > 0.0))
    }
}

/// A live socket of a program, as sock_diag shows it (`ss -m` `rb`, `tb`, `d`).
#[derive(Clone, Debug)]
pub struct LiveSocket {
    /// Its holder.
    pub owner: ProcRef,
    /// Socket inode.
    pub inode: u64,
    /// Transport.
    pub proto: Proto,
    /// `sk_rcvbuf`.
    pub rcvbuf: i64,
    /// `sk_sndbuf`.
    pub sndbuf: i64,
    /// Drops so far (`SK_MEMINFO_DROPS`).
    pub drops: u64,
}

fn kib(b: f64) -> String {
    if b >= (1 << 20) as f64 {
        format!("{:.1} MiB", b / (1 << 20) as f64)
    } else {
        format!("{:.0} KiB", b / 1024.0)
    }
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
    /// Per-process findings.
    out: Vec<Finding>,
    /// Per-socket findings (`sockets.rs`).
    sockets: Vec<sockets::Listed>,
    /// Each process as findings name it, shared by its per-socket findings.
    processes: foldhash::HashMap<ProcRef, std::sync::Arc<ProcessRef>>,
    /// Each process's program, shared by its sockets' observations.
    programs: foldhash::HashMap<ProcRef, std::sync::Arc<history::Program>>,
    /// What per-socket findings are told with, per (process, namespace, protocol).
    scenes: foldhash::HashMap<(ProcRef, u32, Proto), std::sync::Arc<sockets::Scene>>,
    /// Processes with locked TCP sockets.
    tcp_locked: foldhash::HashSet<ProcRef>,
    /// How many of the stories' sockets each process has per protocol (counted once, not
    /// once per finding: 10,000 sockets made that 10⁸ comparisons per evaluation).
    sockets_like: foldhash::HashMap<(ProcRef, Proto), u64>,
}

impl Builder<'_> {
    fn process(&self, p: &ProcRef) -> ProcessRef {
        let m = self.inputs.meta.get(p).cloned().unwrap_or_default();
        ProcessRef {
            pid: p.tgid,
            comm: m.comm,
            container: m.container,
            pod: m.pod,
            namespace: m.namespace,
            container_name: m.container_name,
        }
    }

    /// [`Builder::process`], made once per process and shared.
    fn process_shared(&mut self, p: &ProcRef) -> std::sync::Arc<ProcessRef> {
        if let Some(r) = self.processes.get(p) {
            return r.clone();
        }
        let r = std::sync::Arc::new(self.process(p));
        self.processes.insert(*p, r.clone());
        r
    }

    /// What the candidate's finding is told with, made once per (process, namespace,
    /// protocol) and shared.
    fn scene(
        &mut self,
        c: &sockets::Candidate,
        host: sockets::HostLimits,
    ) -> std::sync::Arc<sockets::Scene> {
        let key = (c.owner, c.netns, c.proto);
        if let Some(s) = self.scenes.get(&key) {
            return s.clone();
        }
        let s = std::sync::Arc::new(sockets::Scene {
            host,
            ns: self.inputs.ns_limits.get(&c.netns).copied(),
            process: self.process_shared(&c.owner),
            sockets_like: self.sockets_like_of(c),
        });
        self.scenes.insert(key, s.clone());
        s
    }

    /// Sockets of the candidate's process and protocol (the ones a program-wide fix touches).
    fn sockets_like_of(&self, c: &sockets::Candidate) -> u64 {
        self.sockets_like
            .get(&(c.owner, c.proto))
            .copied()
            .unwrap_or(0)
            .max(1)
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
            ..Finding::default()
        });
    }

    /// Who the program is across restarts (made once per process and shared).
    fn program(&mut self, p: &ProcRef) -> std::sync::Arc<history::Program> {
        if let Some(r) = self.programs.get(p) {
            return r.clone();
        }
        let m = self.inputs.meta.get(p).cloned().unwrap_or_default();
        let r = std::sync::Arc::new((m.comm, m.container, m.pod, m.namespace));
        self.programs.insert(*p, r.clone());
        r
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

/// Evaluates every rule once, with no past (tests, one-shot use).
pub fn evaluate(inputs: &Inputs) -> Vec<Finding> {
    evaluate_with(inputs, &mut History::default(), unix_now())
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Evaluates every rule at `now` (Unix seconds), keeping the findings' past in `history`;
/// every finding told.
pub fn evaluate_with(inputs: &Inputs, history: &mut History, now: u64) -> Vec<Finding> {
    evaluate_findings(inputs, history, now).render()
}

/// Evaluates every rule at `now` (Unix seconds), keeping the findings' past in `history`:
/// the per-socket findings as numbers ([`Findings`]), told when served.
pub fn evaluate_findings(inputs: &Inputs, history: &mut History, now: u64) -> Findings {
    let mut b = Builder {
        inputs,
        out: Vec::new(),
        sockets: Vec::new(),
        processes: foldhash::HashMap::default(),
        programs: foldhash::HashMap::default(),
        scenes: foldhash::HashMap::default(),
        tcp_locked: inputs
            .tcp
            .iter()
            .filter(|(_, s)| s.locks > 0)
            .map(|(p, _)| *p)
            .collect(),
        sockets_like: inputs
            .stories
            .iter()
            .fold(foldhash::HashMap::default(), |mut m, s| {
                *m.entry((s.owner, s.proto)).or_default() += 1;
                m
            }),
    };
    history.begin();
    sockets::socket_findings(&mut b, history, now);
    tcp_drops(&mut b);
    tun_ring(&mut b);
    tcp_locks(&mut b);
    autotune(&mut b);
    dataplanes::netlink_overruns(&mut b);
    dataplanes::xfrm_errors(&mut b);
    for f in &mut b.out {
        history.stamp(f, now);
    }
    let kept = history.finish(now);
    let mut items: Vec<Item> = std::mem::take(&mut b.sockets)
        .into_iter()
        .map(Item::Socket)
        .chain(b.out.into_iter().map(|f| Item::Process(Box::new(f))))
        .chain(
            kept.into_iter()
                .map(|f| Item::Socket(sockets::Listed::kept(f))),
        )
        .collect();
    mark_guarded(&mut items, &inputs.guard);
    // Most severe first; within a severity, what costs most now (drop rate) first.
    items.sort_by(|x, y| {
        let (hx, hy) = (x.head(), y.head());
        hx.severity
            .cmp(&hy.severity)
            .then(y.drops_per_second().total_cmp(&x.drops_per_second()))
            .then((hx.pid, hx.kind).cmp(&(hy.pid, hy.kind)))
    });
    Findings { items }
}

/// What one evaluation found, in the order served: per-socket findings as numbers and
/// shared references (told by [`Findings::render`] where they are served: `/metrics` reads
/// only [`Findings::heads`]), per-process ones told.
#[derive(Clone, Debug, Default)]
pub struct Findings {
    items: Vec<Item>,
}

/// One finding of an evaluation.
#[derive(Clone, Debug)]
enum Item {
    /// Per socket and buffer direction, told on demand.
    Socket(sockets::Listed),
    /// Per process (and the data planes'), told (boxed: an item per socket is small).
    Process(Box<Finding>),
}

/// What `/metrics` reads of a finding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Head {
    /// Its process.
    pub pid: u32,
    /// Its kind.
    pub kind: &'static str,
    /// Its severity.
    pub severity: Severity,
    /// Its verdict (per-socket kinds).
    pub verdict: Option<bufscope_api::Verdict>,
}

impl Head {
    /// A finding that counts now (not `resolved`, not `gone`).
    pub fn active(&self) -> bool {
        !matches!(
            self.verdict,
            Some(bufscope_api::Verdict::Resolved | bufscope_api::Verdict::Gone)
        )
    }
}

impl Item {
    fn head(&self) -> Head {
        match self {
            Self::Socket(s) => Head {
                pid: s.finding.pid(),
                kind: s.finding.kind(),
                severity: s.finding.severity(),
                verdict: Some(s.finding.verdict()),
            },
            Self::Process(f) => Head {
                pid: f.process.pid,
                kind: f.kind,
                severity: f.severity,
                verdict: f.verdict,
            },
        }
    }

    /// `drops_per_second` as its evidence shows it (0 without).
    fn drops_per_second(&self) -> f64 {
        match self {
            Self::Socket(s) => s.finding.drops_per_second(),
            Self::Process(f) => f.evidence.get("drops_per_second").copied().unwrap_or(0.0),
        }
    }

    fn render(&self) -> Finding {
        match self {
            Self::Socket(s) => s.render(),
            Self::Process(f) => Finding::clone(f),
        }
    }
}

impl Findings {
    /// Findings in all.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// None.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Each finding's process, kind, severity and verdict, in order.
    pub fn heads(&self) -> impl Iterator<Item = Head> + '_ {
        self.items.iter().map(Item::head)
    }

    /// Keeps the findings whose head `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&Head) -> bool) {
        self.items.retain(|i| keep(&i.head()));
    }

    /// Every finding told, in order (what `/api/v1/findings` serves).
    pub fn render(&self) -> Vec<Finding> {
        self.items.iter().map(Item::render).collect()
    }

    /// The findings `sel` asks for told, in order: the others are not told at all (telling a
    /// socket's finding builds its text, story and fixes).
    pub fn render_selected(&self, sel: &Selection) -> Vec<Finding> {
        self.items
            .iter()
            .filter(|i| sel.wants(&i.head()))
            .take(sel.limit.unwrap_or(usize::MAX))
            .map(Item::render)
            .collect()
    }
}

/// Which findings a `/api/v1/findings` request asks for (its query parameters; none: all).
/// A gateway with 1,000 dropping programs has up to 16 findings per program and kind: a
/// dashboard link or a script asks for one process's, or the costliest few.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    /// Only this process's (`pid=`).
    pub pid: Option<u32>,
    /// Only this kind's (`kind=`).
    pub kind: Option<String>,
    /// Only findings at least this severe (`severity=critical|warning|info`).
    pub severity: Option<Severity>,
    /// At most this many, in the document's order: the costliest first (`limit=`).
    pub limit: Option<usize>,
}

impl Selection {
    /// Reads a request's query string (`pid=4475&severity=critical&limit=20`); an unknown
    /// parameter or a bad value is an error that names it and what is allowed.
    pub fn parse(query: &str) -> Result<Self, String> {
        let mut sel = Self::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let number = |what: &str| -> Result<u64, String> {
                v.parse::<u64>()
                    .map_err(|_| format!("{k}={v:?}: {what} must be a non-negative integer"))
            };
            match k {
                "pid" => {
                    sel.pid = Some(
                        u32::try_from(number("pid")?)
                            .map_err(|_| format!("pid={v}: not a process id"))?,
                    )
                }
                "kind" => {
                    if v.is_empty() {
                        return Err("kind=: name a kind (docs/findings.md lists them)".into());
                    }
                    sel.kind = Some(v.to_string());
                }
                "severity" => {
                    sel.severity = Some(
                        Severity::ALL
                            .into_iter()
                            .find(|s| s.as_str() == v)
                            .ok_or_else(|| {
                                format!("severity={v:?}: use critical, warning or info")
                            })?,
                    )
                }
                "limit" => sel.limit = Some(number("limit")? as usize),
                _ => {
                    return Err(format!(
                        "unknown query parameter {k:?}: /api/v1/findings takes pid, kind, severity and limit"
                    ));
                }
            }
        }
        Ok(sel)
    }

    /// Whether the finding with `head` is one asked for (before the limit).
    fn wants(&self, head: &Head) -> bool {
        self.pid.is_none_or(|p| p == head.pid)
            && self.kind.as_deref().is_none_or(|k| k == head.kind)
            && self.severity.is_none_or(|s| head.severity <= s)
    }
}

impl From<Vec<Finding>> for Findings {
    /// Findings already told (tests).
    fn from(findings: Vec<Finding>) -> Self {
        Self {
            items: findings
                .into_iter()
                .map(|f| Item::Process(Box::new(f)))
                .collect(),
        }
    }
}

/// The guard rule that addresses findings of `kind`, if one does.
fn guard_rule_for(kind: &str) -> Option<&'static str> {
    match kind {
        kind::TCP_RCVBUF_LOCK
        | kind::TCP_SNDBUF_LOCK
        | kind::TCP_WSCALE_SHRUNK
        | kind::AUTOTUNE_SUPPRESSED => Some("tcp-autotune"),
        kind::UDP_RCVBUF_DROPS | kind::RCVBUF_CLAMPED | kind::SNDBUF_CLAMPED => Some("udp-floor"),
        _ => None,
    }
}

/// Says, on each finding the guard addresses for its process, what the guard did (told once
/// per process and rule, shared by its per-socket findings).
fn mark_guarded(items: &mut [Item], acts: &[GuardAct]) {
    if acts.is_empty() {
        return;
    }
    let mut told: foldhash::HashMap<(u32, &'static str), Option<std::sync::Arc<str>>> =
        foldhash::HashMap::default();
    for item in items.iter_mut() {
        let head = item.head();
        let Some(rule) = guard_rule_for(head.kind) else {
            continue;
        };
        let text = told
            .entry((head.pid, rule))
            .or_insert_with(|| guard_text(head.pid, rule, acts).map(std::sync::Arc::from))
            .clone();
        match item {
            Item::Socket(s) => s.guard = text,
            Item::Process(f) => f.guard = text.as_deref().map(str::to_string),
        }
    }
}

/// What the guard did for process `pid` under `rule`, in words (None: nothing).
fn guard_text(pid: u32, rule: &'static str, acts: &[GuardAct]) -> Option<String> {
    let mine: Vec<&GuardAct> = acts
        .iter()
        .filter(|a| a.owner.tgid == pid && a.rule == rule)
        .collect();
    if mine.is_empty() {
        return None;
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
    let left_out: u64 = mine.iter().map(|a| a.left_out).sum();
    let budget = if left_out > 0 {
        let bytes: u64 = mine.iter().map(|a| a.left_out_bytes).sum();
        let limit = mine.iter().map(|a| a.budget).max().unwrap_or(0);
        format!(
            "; {left_out} socket(s) left at the kernel's size, {} not granted: \
             --guard.udp-budget {} is spent (raise it, or narrow the scope)",
            kib(bytes as f64),
            kib(limit as f64)
        )
    } else {
        String::new()
    };
    Some(if enforced > 0 {
        format!("the guard is fixing this ({rule}): {enforced} decisions, {what}{budget}")
    } else if left_out > 0 {
        format!("the guard would fix this ({rule}) but cannot{budget}")
    } else {
        format!("the guard (observe mode) would fix this ({rule}): {observed} decisions, {what}")
    })
}

mod dataplanes;
mod fixes;
pub mod history;
mod rules;
mod sockets;
#[cfg(test)]
mod tests;

pub use dataplanes::{NetlinkView, XfrmView, kinds as dataplane_kinds};
pub use history::History;
use rules::{autotune, tcp_drops, tcp_locks, tun_ring};
pub use sockets::{MAX_PER_KIND, SocketFinding};
