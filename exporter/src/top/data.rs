//! What `bufscope top` reads: the exporter's `/api/v1/status` (a row per process, probe
//! health, `net.core.rmem_max`) and `/api/v1/findings` documents, parsed leniently. A missing
//! or mistyped field reads as 0 or empty; only a document without its `processes` (status) or
//! `findings` (findings) array is an error. Text from the exporter (`comm` is whatever a
//! process named itself) is cleaned of control characters before it reaches the terminal.

use serde_json::Value;

/// One probe's health, from the status document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Probe name (`drops`, `setsockopt`, …).
    pub name: String,
    /// Attached and running.
    pub attached: bool,
    /// Why not (or `disabled`), when not.
    pub error: Option<String>,
}

/// How bad a finding is (ordered: critical first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Costs throughput now.
    Critical,
    /// Worth fixing.
    Warning,
    /// A severity this version does not know.
    Other,
}

impl Severity {
    fn parse(s: &str) -> Self {
        match s {
            "critical" => Self::Critical,
            "warning" => Self::Warning,
            _ => Self::Other,
        }
    }

    /// Upper-case label (`CRITICAL`, `WARNING`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Critical => "CRITICAL",
            Self::Warning => "WARNING",
            Self::Other => "NOTE",
        }
    }
}

/// One finding (docs/findings.md), as text.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    /// Process id it is about.
    pub pid: Option<u64>,
    /// That process's name.
    pub comm: String,
    /// Kind (`udp_rcvbuf_drops`, …).
    pub kind: String,
    /// Severity.
    pub severity: Severity,
    /// What is wrong.
    pub summary: String,
    /// What to change.
    pub fix: String,
    /// What the guard does about it, when running.
    pub guard: Option<String>,
    /// The worst socket (`inode N (proto)`), when known.
    pub socket: Option<String>,
    /// Evidence as `key=value` pairs.
    pub evidence: String,
    /// The measurement behind the recommendation.
    pub rule: String,
}

/// One process row of the status document.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Proc {
    /// Process id as the exporter labels it (empty for `_other`/`_unknown`).
    pub pid: String,
    /// Process name.
    pub comm: String,
    /// Container id (empty on the host).
    pub container: String,
    /// All buffer drops.
    pub drops_total: u64,
    /// Drops by `proto/REASON`.
    pub drops_by: Vec<(String, u64)>,
    /// Sockets that got `SOCK_RCVBUF_LOCK`.
    pub locked: u64,
    /// TCP connections born with a shrunken window scale.
    pub shrunk: u64,
    /// TCP connections established.
    pub established: u64,
    /// Buffer requests clamped at `rmem_max`/`wmem_max`.
    pub clamped: u64,
    /// Buffer `setsockopt` calls.
    pub setsockopt: u64,
    /// Failed buffer `setsockopt` calls.
    pub failed: u64,
    /// Autotuning grows suppressed by a lock.
    pub suppressed: u64,
}

impl Proc {
    /// The pid as a number (None for pseudo-processes).
    pub fn pid_num(&self) -> Option<u64> {
        self.pid.parse().ok()
    }
}

/// One read of both documents.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// The status document's `generated_at` (Unix seconds), when present.
    pub generated_at: Option<f64>,
    /// bufscope version of the exporter.
    pub version: String,
    /// Its kernel release.
    pub kernel: String,
    /// `net.core.rmem_max` as the exporter read it.
    pub rmem_max: Option<u64>,
    /// Processes the exporter tracks.
    pub tracked: Option<u64>,
    /// Process rows.
    pub procs: Vec<Proc>,
    /// Probe health.
    pub probes: Vec<Probe>,
    /// Findings, in the document's order (critical first).
    pub findings: Vec<Finding>,
}

/// Replaces control characters (terminal escapes in a hostile `comm`) with `?`.
pub fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => clean(s),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

fn count(v: &Value) -> u64 {
    match v {
        Value::Number(n) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
            .unwrap_or(0),
        Value::String(s) => s.parse().unwrap_or(0),
        _ => 0,
    }
}

/// Parses `/api/v1/status` into a snapshot without findings.
pub fn parse_status(doc: &Value) -> anyhow::Result<Snapshot> {
    let rows = doc
        .get("processes")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            anyhow::anyhow!("/api/v1/status: unexpected document (no \"processes\" array)")
        })?;
    let procs = rows
        .iter()
        .filter(|r| r.is_object())
        .map(|r| {
            let mut drops_by: Vec<(String, u64)> = r
                .get("drops")
                .and_then(Value::as_object)
                .map(|m| m.iter().map(|(k, v)| (clean(k), count(v))).collect())
                .unwrap_or_default();
            drops_by.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            Proc {
                pid: text(&r["pid"]),
                comm: text(&r["comm"]),
                container: text(&r["container"]),
                drops_total: count(&r["drops_total"]),
                drops_by,
                locked: count(&r["rcvbuf_locks"]),
                shrunk: count(&r["tcp_wscale_shrunk"]),
                established: count(&r["tcp_established"]),
                clamped: count(&r["clamped"]),
                setsockopt: count(&r["setsockopt"]),
                failed: count(&r["failed"]),
                suppressed: count(&r["tcp_autotune_suppressed"]),
            }
        })
        .collect();
    let probes = doc
        .get("probes")
        .and_then(Value::as_array)
        .map(|ps| {
            ps.iter()
                .filter(|p| p.is_object())
                .map(|p| Probe {
                    name: text(&p["probe"]),
                    attached: p["attached"].as_bool().unwrap_or(false),
                    error: p["error"].as_str().map(clean),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Snapshot {
        generated_at: doc["generated_at"].as_f64(),
        version: text(&doc["version"]),
        kernel: text(&doc["kernel"]),
        rmem_max: doc["net_core_rmem_max"]
            .as_i64()
            .and_then(|v| u64::try_from(v).ok()),
        tracked: doc["tracked_processes"].as_u64(),
        procs,
        probes,
        findings: Vec::new(),
    })
}

/// An evidence value: whole numbers without `.0`, others with two decimals at most.
fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{f:.0}"),
        Some(f) => {
            let s = format!("{f:.2}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        }
        None => clean(&v.to_string()),
    }
}

/// Parses `/api/v1/findings`.
pub fn parse_findings(doc: &Value) -> anyhow::Result<Vec<Finding>> {
    let list = doc
        .get("findings")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            anyhow::anyhow!("/api/v1/findings: unexpected document (no \"findings\" array)")
        })?;
    Ok(list
        .iter()
        .filter(|f| f.is_object())
        .map(|f| {
            let p = &f["process"];
            let socket = f["socket"].as_object().map(|s| {
                format!(
                    "inode {} ({})",
                    text(s.get("inode").unwrap_or(&Value::Null)),
                    text(s.get("proto").unwrap_or(&Value::Null))
                )
            });
            let evidence = f["evidence"]
                .as_object()
                .map(|ev| {
                    ev.iter()
                        .map(|(k, v)| format!("{}={}", clean(k), number(v)))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            Finding {
                pid: p["pid"]
                    .as_u64()
                    .or_else(|| p["pid"].as_str().and_then(|s| s.parse().ok())),
                comm: text(&p["comm"]),
                kind: text(&f["kind"]),
                severity: Severity::parse(f["severity"].as_str().unwrap_or("")),
                summary: text(&f["summary"]),
                fix: text(&f["fix"]),
                guard: f["guard"].as_str().map(clean),
                socket,
                evidence,
                rule: text(&f["rule"]),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    #[test]
    fn status_rows_and_health() {
        let doc = json!({
            "version": "0.1.0", "kernel": "6.12.0", "generated_at": 1796000000.5,
            "net_core_rmem_max": 212992, "tracked_processes": 2,
            "processes": [
                {"pid": "4475", "comm": "wireguard-go", "container": "",
                 "drops": {"udp/SOCKET_RCVBUFF": 10, "udp/PROTO_MEM": 30}, "drops_total": 40,
                 "rcvbuf_locks": 1, "clamped": 2, "tcp_wscale_shrunk": 3, "setsockopt": 4},
                {"pid": "", "comm": "_other\u{1b}[2J"}
            ],
            "probes": [{"probe": "drops", "attached": true, "error": null},
                       {"probe": "autotune", "attached": false, "error": "disabled"}]
        });
        let s = parse_status(&doc).unwrap();
        assert_eq!(s.rmem_max, Some(212992));
        assert_eq!(s.procs.len(), 2);
        let p = &s.procs[0];
        assert_eq!((p.pid_num(), p.drops_total, p.locked), (Some(4475), 40, 1));
        assert_eq!((p.clamped, p.shrunk, p.setsockopt), (2, 3, 4));
        assert_eq!(p.drops_by[0], ("udp/PROTO_MEM".to_string(), 30));
        assert_eq!(
            s.procs[1].comm, "_other?[2J",
            "escape sequences never reach the terminal"
        );
        assert_eq!(s.procs[1].pid_num(), None);
        assert!(!s.probes[1].attached);
        assert_eq!(s.probes[1].error.as_deref(), Some("disabled"));
    }

    #[test]
    fn malformed_documents_are_errors_or_zeros_never_panics() {
        assert!(parse_status(&json!([1, 2])).is_err());
        assert!(parse_status(&json!({"processes": "many"})).is_err());
        assert!(parse_findings(&json!({"findings": {}})).is_err());
        let s = parse_status(&json!({
            "processes": [7, null, {"pid": 5, "drops_total": "x", "drops": [1], "clamped": -3}],
            "probes": "none", "net_core_rmem_max": "big"
        }))
        .unwrap();
        assert_eq!(s.procs.len(), 1);
        assert_eq!(s.procs[0].pid, "5");
        assert_eq!((s.procs[0].drops_total, s.procs[0].clamped), (0, 0));
        assert!(s.probes.is_empty() && s.rmem_max.is_none());
        let f = parse_findings(&json!({"findings": [1, {"process": 3, "evidence": 2}]})).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].pid, f[0].severity), (None, Severity::Other));
    }

    #[test]
    fn findings() {
        let doc = json!({"version": 1, "findings": [{
            "kind": "udp_rcvbuf_drops", "severity": "critical",
            "process": {"pid": 4475, "comm": "wireguard-go", "container": ""},
            "socket": {"inode": 160047, "proto": "udp"},
            "summary": "UDP socket dropping", "fix": "request a 7.0 MiB receive buffer",
            "evidence": {"drops_total": 2997.0, "drops_per_second": 861.666, "x": "y"},
            "rule": "UDP 7 MiB"
        }]});
        let f = parse_findings(&doc).unwrap();
        assert_eq!(f[0].pid, Some(4475));
        assert_eq!(f[0].severity, Severity::Critical);
        assert_eq!(f[0].socket.as_deref(), Some("inode 160047 (udp)"));
        assert_eq!(
            f[0].evidence, "drops_per_second=861.67 drops_total=2997 x=\"y\"",
            "key order as serde_json keeps it"
        );
    }
}
