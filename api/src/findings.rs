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

/// The socket a finding names (the worst one of the process for that kind).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketRef<S = String> {
    /// Socket inode (`/proc/<pid>/fd/* -> socket:[inode]`, `ss -e ino:`).
    pub inode: u64,
    /// `udp`, `tcp` or `other`.
    pub proto: S,
}

/// One finding: one per (process, kind).
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
            }),
            summary: "UDP socket dropping".into(),
            fix: "request a 7.0 MiB receive buffer".into(),
            evidence: [("drops_total", 2997.0), ("drops_per_second", 861.7)]
                .into_iter()
                .collect(),
            rule: "UDP 7 MiB",
            guard: None,
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
