//! `/api/v1/findings`: what is wrong, per process, and what to change (docs/findings.md).
//!
//! The string fields that the daemon takes from tables of its own (the kind, the rule's
//! citation, the evidence keys, the socket's protocol) are of type `S`: `&'static str` where
//! the daemon builds a finding, `String` (the default) where a client reads one. The JSON is
//! the same either way.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// Where the daemon serves the [`Report`].
pub const PATH: &str = "/api/v1/findings";

/// Version of the `/api/v1/findings` schema. Bumped only on incompatible changes; new fields
/// and kinds may be added without a bump.
pub const SCHEMA_VERSION: u32 = 1;

/// How bad a finding is: what it costs now. Ordered most severe first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
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
    /// Every severity, most severe first.
    pub const ALL: [Severity; 3] = [Severity::Critical, Severity::Warning, Severity::Info];

    /// The JSON value and the `severity` label value (`critical`, `warning`, `info`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Critical => "critical",
            Self::Warning => "warning",
            Self::Info => "info",
        }
    }

    /// Reads a JSON value; one this version does not know is the mildest, [`Severity::Info`]
    /// (docs/findings.md: consumers treat unknown severities as the mildest).
    pub fn parse(s: &str) -> Self {
        Self::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .unwrap_or(Self::Info)
    }
}

impl<'de> Deserialize<'de> for Severity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(Self::parse(&s))
    }
}

/// The process a finding is about.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRef {
    /// Process id.
    pub pid: u32,
    /// Process name (lossy UTF-8 of the kernel's `comm`: whatever the process named itself).
    pub comm: String,
    /// Container id, empty on the host.
    pub container: String,
    /// Kubernetes pod name (absent outside a pod).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod: String,
    /// Kubernetes namespace (absent outside a pod).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The container's name in its pod (absent outside a pod or when not known).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container_name: String,
}

/// The socket a finding is about (a per-socket finding's own socket; for a per-process kind,
/// the worst one of the process).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketRef<S = String> {
    /// Socket inode (`/proc/<pid>/fd/* -> socket:[inode]`, `ss -e ino:`).
    pub inode: u64,
    /// `udp`, `tcp` or `other`.
    pub proto: S,
    /// Inode number of the socket's network namespace (`/proc/<pid>/ns/net -> net:[N]`;
    /// absent when not known).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub netns: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Whether a finding costs anything now (per-socket findings; absent on per-process kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// It costs now: the socket drops (drops/s over the window), or a TCP connection runs at
    /// the ceiling its locked buffer or shrunk window scale sets at the measured RTT.
    Costing,
    /// Nothing measurable now: e.g. a clamped request on a socket that does not drop at the
    /// observed rate, a lock on a connection below its ceiling.
    Benign,
    /// It cost before and stopped after a change (a larger buffer on the socket, or the
    /// program restarted with one): kept for a while with the numbers before and after.
    Resolved,
    /// It cost, then its socket closed (or its process exited) and no socket of the same
    /// program has replaced it yet: kept for a while with its last numbers; it becomes
    /// `resolved` if the program comes back with a socket that does not cost.
    Gone,
    /// A value this version does not know.
    #[serde(other)]
    Unknown,
}

impl Verdict {
    /// The JSON value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Costing => "costing",
            Self::Benign => "benign",
            Self::Resolved => "resolved",
            Self::Gone => "gone",
            Self::Unknown => "unknown",
        }
    }
}

/// One buffer `setsockopt` call on the socket, as the kernel handled it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "S: Deserialize<'de>"))]
pub struct Call<S = String> {
    /// When (Unix seconds, as bufscope decoded the event).
    pub at: u64,
    /// `SO_RCVBUF`, `SO_SNDBUF`, `SO_RCVBUFFORCE`, `SO_SNDBUFFORCE`, `SO_BUF_LOCK`.
    pub option: S,
    /// The value the program passed.
    pub requested: i64,
    /// The buffer size after the call (`getsockopt`'s value: the kernel doubles the request).
    pub effective: i64,
    /// The error the call returned (`EPERM`, `EINVAL`), absent on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<S>,
    /// What happened, as facts: `force` (a *FORCE option), `refused` (EPERM: no
    /// CAP_NET_ADMIN in the initial user namespace), `fallback` (a plain call after a refused
    /// FORCE of the same direction), `clamped` (capped at rmem_max/wmem_max),
    /// `above_minimum` (below the kernel's floor: granted more than asked), `locked` (this
    /// call set the buffer's lock bit: autotuning off for that direction), `before_connect`,
    /// `listening`, `established` (the TCP state at the call: a receive buffer set before
    /// connect()/listen() also sizes the window scale, one set later cannot change it),
    /// `guard_raised`, `guard_skipped`.
    #[serde(default)]
    pub notes: Vec<S>,
}

/// The limiting sysctl of a socket's buffer, as its network namespace sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(bound(deserialize = "S: Deserialize<'de>"))]
pub struct Limit<S = String> {
    /// `net.core.rmem_max` or `net.core.wmem_max`.
    pub sysctl: S,
    /// Its value (absent: not readable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<i64>,
    /// How the socket's namespace sees it: `host` (the socket is in the host's namespace),
    /// `read_only` (the namespace shows the host's value read-only, 6.11+: it cannot be raised
    /// from there), `absent` (the namespace has no such file: only the host sets it), `netns`
    /// (the namespace has its own, writable value), `unknown` (bufscope could not look:
    /// `unreadable` says why; `bytes` is then the host's value, which the kernel clamps with).
    pub scope: S,
    /// Why the namespace's view could not be read (with scope `unknown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

/// The story of one socket's buffer in one direction: every call in order, the final size,
/// the limit, the drops.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "S: Deserialize<'de>"))]
pub struct Story<S = String> {
    /// `receive` or `send`.
    pub direction: S,
    /// The calls in order (at most the first 8 and the last 24; `calls_omitted` between).
    pub calls: Vec<Call<S>>,
    /// Calls made in all.
    pub calls_total: u64,
    /// Calls not listed (between the first and the last ones kept).
    #[serde(default)]
    pub calls_omitted: u64,
    /// The buffer's size now (bytes, as `getsockopt` and `ss -m` rb/tb report it).
    pub final_bytes: i64,
    /// The sysctl that caps plain requests, as the socket's namespace sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<Limit<S>>,
}

/// One place a fix can be made, what it is, and what it costs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "S: Deserialize<'de>"))]
pub struct Fix<S = String> {
    /// `application`, `pod` or `host`.
    pub scope: S,
    /// Whether it can work from there on this kernel with this program.
    pub possible: bool,
    /// What to do (or, when not possible, why not).
    pub how: String,
    /// The program's configuration key, when bufscope knows the program (bufscope-policy's
    /// program table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_key: Option<String>,
    /// Memory the fix lets the sockets it touches use at most (sockets × size after the fix;
    /// buffers are charged as data queues, not reserved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

/// The numbers of a finding at one moment (before or after a change).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The buffer's size (bytes, as `getsockopt` reports it).
    pub bytes: i64,
    /// Drops per second on the socket (over the window before; since the change after).
    pub drops_per_second: f64,
    /// The socket (after a restart, the program's new one).
    #[serde(default)]
    pub inode: u64,
    /// The process (after a restart, the new one).
    #[serde(default)]
    pub pid: u32,
}

/// What changed for a resolved finding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Resolution {
    /// When bufscope saw it stop (Unix seconds).
    pub at: u64,
    /// The last numbers while it cost.
    pub before: Snapshot,
    /// The numbers since the change.
    pub after: Snapshot,
    /// What changed: `resized` (the same socket got a larger buffer) or `restarted` (the
    /// program's socket was replaced by one that does not cost).
    pub change: String,
}

/// One finding: one per socket and buffer direction for the per-socket kinds, one per
/// (process, kind) for the others.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "S: Deserialize<'de> + Ord"))]
pub struct Finding<S = String> {
    /// What is wrong, as a stable name (`udp_rcvbuf_drops`, `tcp_rcvbuf_lock`, …; the `kind`
    /// label of `bufscope_finding`).
    pub kind: S,
    /// How bad.
    pub severity: Severity,
    /// Who.
    pub process: ProcessRef,
    /// Which socket, when one is to blame (`null` otherwise).
    pub socket: Option<SocketRef<S>>,
    /// What is wrong, with the numbers.
    pub summary: String,
    /// What to change.
    pub fix: String,
    /// The numbers behind it (bytes, packets, per second, microseconds), by name. A value
    /// that is not a number (`null`, as serde_json writes NaN) reads as NaN.
    #[serde(deserialize_with = "evidence")]
    pub evidence: BTreeMap<S, f64>,
    /// The measurement the recommendation comes from (bufscope-policy's citation).
    pub rule: S,
    /// What the guard (`--guard.mode`) is already doing about it for this process, if anything
    /// (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<String>,
    /// Per-socket findings: whether it costs now (absent on per-process kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    /// Per-socket findings: the buffer's story (absent on per-process kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub story: Option<Story<S>>,
    /// Where the fix can be made (application, pod, host) and what each costs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fixes: Vec<Fix<S>>,
    /// A resolved finding's numbers before and after the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<Resolution>,
    /// When bufscope first saw it (Unix seconds; 0 when not tracked).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub since: u64,
    /// When its verdict or severity last changed (Unix seconds; 0 when not tracked).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub changed_at: u64,
}

impl<S: Default> Default for Finding<S> {
    fn default() -> Self {
        Self {
            kind: S::default(),
            severity: Severity::Info,
            process: ProcessRef::default(),
            socket: None,
            summary: String::new(),
            fix: String::new(),
            evidence: BTreeMap::new(),
            rule: S::default(),
            guard: None,
            verdict: None,
            story: None,
            fixes: Vec::new(),
            resolved: None,
            since: 0,
            changed_at: 0,
        }
    }
}

/// Reads the evidence map, `null` values as NaN.
fn evidence<'de, D, S>(d: D) -> Result<BTreeMap<S, f64>, D::Error>
where
    D: Deserializer<'de>,
    S: Deserialize<'de> + Ord,
{
    let m = BTreeMap::<S, Option<f64>>::deserialize(d)?;
    Ok(m.into_iter()
        .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
        .collect())
}

/// The `/api/v1/findings` document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "S: Deserialize<'de> + Ord"))]
pub struct Report<S = String> {
    /// [`SCHEMA_VERSION`] of the daemon that made it.
    pub version: u32,
    /// Seconds since the Unix epoch when the report was made (0 when absent).
    #[serde(default)]
    pub generated_at: u64,
    /// Findings, most severe first; within a severity, the highest drop rate first.
    pub findings: Vec<Finding<S>>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn daemon_finding() -> Finding<&'static str> {
        Finding {
            kind: "udp_rcvbuf_drops",
            severity: Severity::Critical,
            process: ProcessRef {
                pid: 4475,
                comm: "wireguard-go".into(),
                container: String::new(),
                ..ProcessRef::default()
            },
            socket: Some(SocketRef {
                inode: 160047,
                proto: "udp",
                netns: 0,
            }),
            summary: "UDP socket dropping".into(),
            fix: "request a 7.0 MiB receive buffer".into(),
            evidence: [("drops_total", 2997.0), ("drops_per_second", 861.7)]
                .into_iter()
                .collect(),
            rule: "UDP 7 MiB",
            guard: None,
            ..Finding::default()
        }
    }

    /// The bytes `/api/v1/findings` served before these types existed (field order, `null`
    /// socket, no `guard` key when the guard does nothing, floats with `.0`).
    #[test]
    fn the_daemons_json_is_the_schema_1_document() {
        let mut quiet = daemon_finding();
        quiet.severity = Severity::Info;
        quiet.socket = None;
        quiet.guard = Some("the guard is fixing this".into());
        let r = Report {
            version: SCHEMA_VERSION,
            generated_at: 1796000000,
            findings: vec![daemon_finding(), quiet],
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            "{\"version\":1,\"generated_at\":1796000000,\"findings\":[\
             {\"kind\":\"udp_rcvbuf_drops\",\"severity\":\"critical\",\
             \"process\":{\"pid\":4475,\"comm\":\"wireguard-go\",\"container\":\"\"},\
             \"socket\":{\"inode\":160047,\"proto\":\"udp\"},\"summary\":\"UDP socket dropping\",\
             \"fix\":\"request a 7.0 MiB receive buffer\",\
             \"evidence\":{\"drops_per_second\":861.7,\"drops_total\":2997.0},\
             \"rule\":\"UDP 7 MiB\"},\
             {\"kind\":\"udp_rcvbuf_drops\",\"severity\":\"info\",\
             \"process\":{\"pid\":4475,\"comm\":\"wireguard-go\",\"container\":\"\"},\
             \"socket\":null,\"summary\":\"UDP socket dropping\",\
             \"fix\":\"request a 7.0 MiB receive buffer\",\
             \"evidence\":{\"drops_per_second\":861.7,\"drops_total\":2997.0},\
             \"rule\":\"UDP 7 MiB\",\"guard\":\"the guard is fixing this\"}]}"
        );
    }

    #[test]
    fn a_client_reads_what_the_daemon_wrote() {
        let r = Report {
            version: SCHEMA_VERSION,
            generated_at: 1,
            findings: vec![daemon_finding()],
        };
        let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        let f = &back.findings[0];
        assert_eq!(
            (f.kind.as_str(), f.severity),
            ("udp_rcvbuf_drops", Severity::Critical)
        );
        assert_eq!(f.socket.as_ref().map(|s| s.proto.as_str()), Some("udp"));
        assert_eq!(f.evidence["drops_total"], 2997.0);
        assert_eq!(f.guard, None);
    }

    #[test]
    fn newer_daemons_are_read_as_the_schema_says() {
        let doc = r#"{"version": 1, "extra": [1], "findings": [
            {"kind": "new_kind", "severity": "notice", "new_field": {"a": 1},
             "process": {"pid": 7, "comm": "x", "container": ""},
             "summary": "s", "fix": "f", "evidence": {"x": null}, "rule": "r"}]}"#;
        let r: Report = serde_json::from_str(doc).unwrap();
        assert_eq!(r.generated_at, 0, "absent");
        assert_eq!(r.findings[0].severity, Severity::Info, "unknown: mildest");
        assert_eq!(r.findings[0].socket, None, "absent socket");
        assert_eq!(r.findings[0].kind, "new_kind");
        assert!(
            r.findings[0].evidence["x"].is_nan(),
            "null as the daemon writes NaN"
        );
    }

    #[test]
    fn severities_order_and_name() {
        assert!(Severity::Critical < Severity::Warning && Severity::Warning < Severity::Info);
        for s in Severity::ALL {
            assert_eq!(Severity::parse(s.as_str()), s);
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
    }
}
