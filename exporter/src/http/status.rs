//! The status page (`/`, self-contained: no external assets) and its data
//! (`/api/v1/status`, a [`StatusDocument`] of `bufscope-api`): a row per process, each
//! signal's room filling its columns, plus probe health.

use std::time::SystemTime;

use bufscope_api::{ProbeRow, ProcessRow, StatusDocument};

use crate::bpf::ProbeStatus;
use crate::collector::Collector;

/// The page.
pub const PAGE: &str = include_str!("status.html");

/// The `/api/v1/status` document.
pub fn document(c: &Collector, probes: &[ProbeStatus]) -> StatusDocument {
    let processes = c
        .store
        .iter()
        .map(|(pid, s)| {
            let mut row = ProcessRow {
                pid,
                comm: s.meta.comm.clone(),
                container: s.meta.container.clone(),
                pod: s.meta.pod.clone(),
                namespace: s.meta.namespace.clone(),
                container_name: s.meta.container_name.clone(),
                cgroup: s.meta.cgroup.clone(),
                ..ProcessRow::default()
            };
            s.parts.status(&mut row);
            row
        })
        .collect();
    let runs = c.probe_runs();
    let probes = probes
        .iter()
        .map(|p| {
            let run = runs.iter().find(|(name, _, _)| *name == p.spec.name);
            let lost = c.lost_probe(p.spec.name);
            ProbeRow {
                probe: p.spec.name.to_string(),
                hooks: p.hooks(),
                what: p.spec.what.to_string(),
                attached: p.attached && lost.is_none(),
                error: lost.map(str::to_string).or_else(|| p.error.clone()),
                run_time_ns: run.map(|r| r.1),
                run_count: run.map(|r| r.2),
            }
        })
        .collect();
    StatusDocument {
        version: c.health.version.clone(),
        kernel: c.health.kernel.clone(),
        generated_at: Some(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
        ),
        net_core_rmem_max: c.limits.rmem_max,
        net_core_wmem_max: c.limits.wmem_max,
        processes,
        probes,
        attribution_unknown: c
            .store
            .attribution_unknown
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        bpf_events_lost: c
            .health
            .bpf_lost
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        tracked_processes: c.store.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::*;

    /// The keys of the object `v` (and, for `process`, of its `process` object).
    fn keys(v: &Value) -> BTreeSet<String> {
        v.as_object().unwrap().keys().cloned().collect()
    }

    /// Every `name.key` in `js` (a whole identifier before the dot, not a method call after).
    fn reads(js: &str, name: &str) -> BTreeSet<String> {
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$';
        let pat = format!("{name}.");
        let mut out = BTreeSet::new();
        for (i, _) in js.match_indices(&pat) {
            if js[..i]
                .chars()
                .next_back()
                .is_some_and(|c| ident(c) || c == '.')
            {
                continue;
            }
            let rest = &js[i + pat.len()..];
            let key: String = rest.chars().take_while(|c| ident(*c)).collect();
            if !key.is_empty() && !rest[key.len()..].starts_with('(') {
                out.insert(key);
            }
        }
        out
    }

    /// The text of JS function `name` (up to the next top-level `function`).
    fn function<'a>(js: &'a str, name: &str) -> &'a str {
        let start = js.find(&format!("function {name}(")).unwrap();
        let end = js[start + 1..]
            .find("\nfunction ")
            .map_or(js.len(), |e| start + 1 + e);
        &js[start..end]
    }

    #[test]
    fn the_page_reads_only_keys_the_documents_have() {
        let status = serde_json::to_value(StatusDocument {
            processes: vec![ProcessRow::default()],
            probes: vec![ProbeRow::default()],
            ..StatusDocument::default()
        })
        .unwrap();
        let findings = serde_json::to_value(bufscope_api::Report {
            version: 1,
            generated_at: 0,
            findings: vec![bufscope_api::Finding {
                kind: "k".to_string(),
                severity: bufscope_api::Severity::Info,
                process: bufscope_api::ProcessRef {
                    pid: 1,
                    comm: String::new(),
                    container: String::new(),
                    // Serialized only when set (a process in a Kubernetes pod).
                    pod: "p".into(),
                    namespace: "n".into(),
                    container_name: "c".into(),
                },
                socket: Some(bufscope_api::SocketRef {
                    inode: 1,
                    proto: "udp".into(),
                    netns: 1,
                }),
                summary: String::new(),
                fix: String::new(),
                evidence: Default::default(),
                rule: String::new(),
                guard: Some(String::new()),
                verdict: Some(bufscope_api::Verdict::Resolved),
                story: Some(bufscope_api::Story {
                    direction: "receive".into(),
                    calls: Vec::new(),
                    calls_total: 0,
                    calls_omitted: 0,
                    final_bytes: 0,
                    limit: None,
                }),
                fixes: vec![bufscope_api::Fix {
                    scope: "host".into(),
                    possible: true,
                    how: String::new(),
                    config_key: None,
                    memory_bytes: None,
                }],
                resolved: Some(bufscope_api::Resolution {
                    at: 1,
                    before: bufscope_api::Snapshot {
                        bytes: 0,
                        drops_per_second: 0.0,
                        inode: 0,
                        pid: 0,
                    },
                    after: bufscope_api::Snapshot {
                        bytes: 0,
                        drops_per_second: 0.0,
                        inode: 0,
                        pid: 0,
                    },
                    change: String::new(),
                }),
                ..bufscope_api::Finding::default()
            }],
        })
        .unwrap();
        let js = &PAGE[PAGE.find("<script>").unwrap()..];
        let row = keys(&status["processes"][0]);
        let finding = &findings["findings"][0];
        let checks = [
            ("s", reads(js, "s"), keys(&status)),
            ("r", reads(js, "r"), row.clone()),
            (
                "p",
                reads(function(js, "renderProbes"), "p"),
                keys(&status["probes"][0]),
            ),
            ("doc", reads(js, "doc"), keys(&findings)),
            (
                "f",
                reads(js, "f"),
                keys(finding)
                    .into_iter()
                    .chain(["process".into()])
                    .collect(),
            ),
            (
                "f.process",
                reads(js, "f.process"),
                keys(&finding["process"]),
            ),
        ];
        for (name, read, have) in checks {
            assert!(!read.is_empty(), "the page reads no {name}. key");
            let missing: Vec<_> = read.difference(&have).collect();
            assert!(
                missing.is_empty(),
                "status.html reads {name}.{missing:?}, not in {have:?}"
            );
        }
        // The counter columns of the process table, listed by name.
        let procs = function(js, "renderProcs");
        let list = procs
            .split("of [")
            .nth(1)
            .unwrap()
            .split(']')
            .next()
            .unwrap();
        let columns: Vec<&str> = list
            .split(',')
            .map(|c| c.trim().trim_matches('"'))
            .collect();
        assert!(columns.len() >= 6, "{columns:?}");
        for c in columns {
            assert!(
                row.contains(c),
                "status.html shows column {c:?}, not in {row:?}"
            );
        }
    }
}
