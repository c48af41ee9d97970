//! What `bufscope top` reads: the exporter's `/api/v1/status` and `/api/v1/findings`
//! documents as `bufscope-api` types ([`StatusDocument`], [`Finding`]), with the text that
//! came from outside cleaned for a terminal: `comm` is whatever a process named itself, so
//! control characters (escape sequences) become `?` before anything is drawn.

use bufscope_api::{Finding, StatusDocument};

/// One read of both documents, cleaned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// The status document (its `processes` are taken into the rows by the app).
    pub status: StatusDocument,
    /// Findings, in the document's order (most severe first).
    pub findings: Vec<Finding>,
}

impl Snapshot {
    /// Both documents, cleaned for the terminal.
    pub fn new(mut status: StatusDocument, mut findings: Vec<Finding>) -> Self {
        clean_status(&mut status);
        findings.iter_mut().for_each(clean_finding);
        Self { status, findings }
    }
}

/// Replaces control characters (terminal escapes in a hostile `comm`) with `?`.
pub fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn clean_in_place(s: &mut String) {
    if s.chars().any(char::is_control) {
        *s = clean(s);
    }
}

fn clean_keys(m: &mut std::collections::BTreeMap<String, u64>) {
    if m.keys().any(|k| k.chars().any(char::is_control)) {
        *m = std::mem::take(m)
            .into_iter()
            .map(|(k, v)| (clean(&k), v))
            .collect();
    }
}

fn clean_status(s: &mut StatusDocument) {
    clean_in_place(&mut s.version);
    clean_in_place(&mut s.kernel);
    for p in &mut s.processes {
        clean_in_place(&mut p.pid);
        clean_in_place(&mut p.comm);
        clean_in_place(&mut p.container);
        clean_in_place(&mut p.pod);
        clean_in_place(&mut p.namespace);
        clean_in_place(&mut p.container_name);
        clean_keys(&mut p.drops);
        clean_keys(&mut p.guard);
    }
    for p in &mut s.probes {
        clean_in_place(&mut p.probe);
        clean_in_place(&mut p.hooks);
        clean_in_place(&mut p.what);
        if let Some(e) = &mut p.error {
            clean_in_place(e);
        }
    }
}

fn clean_finding(f: &mut Finding) {
    clean_in_place(&mut f.kind);
    clean_in_place(&mut f.process.comm);
    clean_in_place(&mut f.process.container);
    clean_in_place(&mut f.process.pod);
    clean_in_place(&mut f.process.namespace);
    clean_in_place(&mut f.process.container_name);
    clean_in_place(&mut f.summary);
    clean_in_place(&mut f.fix);
    clean_in_place(&mut f.rule);
    if let Some(g) = &mut f.guard {
        clean_in_place(g);
    }
    if let Some(s) = &mut f.socket {
        clean_in_place(&mut s.proto);
    }
    if f.evidence.keys().any(|k| k.chars().any(char::is_control)) {
        f.evidence = std::mem::take(&mut f.evidence)
            .into_iter()
            .map(|(k, v)| (clean(&k), v))
            .collect();
    }
}

/// A process's drops by `proto/REASON`, most first (then by name).
pub fn drops_by(p: &bufscope_api::ProcessRow) -> Vec<(&str, u64)> {
    let mut v: Vec<(&str, u64)> = p.drops.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    v
}

/// An evidence value: whole numbers without `.0`, others with two decimals at most; `null`
/// for what is not a number (NaN).
pub fn number(v: f64) -> String {
    if !v.is_finite() {
        "null".into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A finding's evidence as `key=value` pairs, keys in alphabetical order.
pub fn evidence(f: &Finding) -> String {
    f.evidence
        .iter()
        .map(|(k, v)| format!("{k}={}", number(*v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A socket's calls in one line: `SO_RCVBUFFORCE 7340032 EPERM; SO_RCVBUF 7340032 -> 425984
/// (fallback, clamped)`.
pub fn story(st: &bufscope_api::Story) -> String {
    let mut parts: Vec<String> = st
        .calls
        .iter()
        .map(|c| {
            let r = match &c.error {
                Some(e) => e.clone(),
                None => format!("-> {}", c.effective),
            };
            let n = if c.notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", c.notes.join(", "))
            };
            format!("{} {} {r}{n}", c.option, c.requested)
        })
        .collect();
    if st.calls_omitted > 0 {
        parts.insert(
            parts.len().min(8),
            format!("… {} not kept", st.calls_omitted),
        );
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn status(doc: &str) -> anyhow::Result<StatusDocument> {
        Ok(serde_json::from_str(doc)?)
    }

    #[test]
    fn status_rows_and_health() {
        let doc = r#"{
            "version": "0.1.0", "kernel": "6.12.0", "generated_at": 1796000000.5,
            "net_core_rmem_max": 212992, "tracked_processes": 2,
            "processes": [
                {"pid": "4475", "comm": "wireguard-go", "container": "",
                 "drops": {"udp/SOCKET_RCVBUFF": 10, "udp/PROTO_MEM": 30}, "drops_total": 40,
                 "rcvbuf_locks": 1, "clamped": 2, "tcp_wscale_shrunk": 3, "setsockopt": 4},
                {"pid": "", "comm": "_other\u001b[2J", "drops": {"udp/\u0007X": 1}}
            ],
            "probes": [{"probe": "drops", "attached": true, "error": null},
                       {"probe": "autotune", "attached": false, "error": "disabled\u001b"}]
        }"#;
        let s = Snapshot::new(status(doc).unwrap(), Vec::new()).status;
        assert_eq!(s.net_core_rmem_max, Some(212992));
        assert_eq!(s.processes.len(), 2);
        let p = &s.processes[0];
        assert_eq!(
            (p.pid_number(), p.drops_total, p.rcvbuf_locks),
            (Some(4475), 40, 1)
        );
        assert_eq!((p.clamped, p.tcp_wscale_shrunk, p.setsockopt), (2, 3, 4));
        assert_eq!(drops_by(p)[0], ("udp/PROTO_MEM", 30));
        assert_eq!(
            s.processes[1].comm, "_other?[2J",
            "escape sequences never reach the terminal"
        );
        assert!(s.processes[1].drops.contains_key("udp/?X"));
        assert_eq!(s.processes[1].pid_number(), None);
        assert!(!s.probes[1].attached);
        assert_eq!(s.probes[1].error.as_deref(), Some("disabled?"));
    }

    #[test]
    fn malformed_documents_are_errors_that_name_the_field() {
        assert!(status("[1, 2]").is_err());
        let e = status(r#"{"processes": "many"}"#).unwrap_err().to_string();
        assert!(
            e.contains("invalid type: string \"many\", expected a sequence"),
            "{e}"
        );
        let e = status(r#"{"processes": [{"pid": "5", "drops_total": "x"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected u64"), "{e}");
        assert!(status(r#"{"probes": []}"#).is_err(), "no processes");
        assert!(serde_json::from_str::<bufscope_api::Report>(r#"{"findings": {}}"#).is_err());
    }

    #[test]
    fn findings_are_cleaned_and_evidence_is_text() {
        let doc = r#"{"version": 1, "generated_at": 1, "findings": [{
            "kind": "udp_rcvbuf_drops", "severity": "critical",
            "process": {"pid": 4475, "comm": "wire\u001bguard", "container": ""},
            "socket": {"inode": 160047, "proto": "udp"},
            "summary": "UDP socket dropping", "fix": "request a 7.0 MiB receive buffer",
            "evidence": {"drops_total": 2997.0, "drops_per_second": 861.666, "x": null},
            "rule": "UDP 7 MiB"
        }]}"#;
        let r: bufscope_api::Report = serde_json::from_str(doc).unwrap();
        let f = &Snapshot::new(StatusDocument::default(), r.findings).findings[0];
        assert_eq!(f.process.comm, "wire?guard");
        assert_eq!(
            evidence(f),
            "drops_per_second=861.67 drops_total=2997 x=null",
            "keys in alphabetical order"
        );
        assert_eq!((number(0.5), number(-3.0)), ("0.5".into(), "-3".into()));
    }
}
