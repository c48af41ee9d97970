//! `bufscope explain`: reads `/api/v1/findings` from a running bufscope and prints, grouped
//! per process, what is wrong (per socket: the buffer's story, the verdict with numbers),
//! where the fix can be made and what it costs, and what a fix changed (or the findings as
//! JSON). `--since` shows only what changed in that time: new findings, verdicts that moved,
//! resolved ones.

use bufscope_api::{Finding, Verdict};

use crate::Client;

/// Which findings to print.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Only about this process id.
    pub pid: Option<u32>,
    /// Only about processes with this name.
    pub comm: Option<String>,
    /// Only findings that appeared, changed or were resolved in the last this many seconds.
    pub since: Option<u64>,
}

impl Selection {
    /// Whether `f` is selected.
    pub fn matches(&self, f: &Finding) -> bool {
        self.pid.is_none_or(|p| f.process.pid == p)
            && self.comm.as_deref().is_none_or(|c| f.process.comm == c)
    }

    /// Whether `f` changed since `now - since` (always true without `since`).
    pub fn changed(&self, f: &Finding, now: u64) -> bool {
        let Some(since) = self.since else {
            return true;
        };
        let cutoff = now.saturating_sub(since);
        f.since >= cutoff
            || f.changed_at >= cutoff
            || f.resolved.as_ref().is_some_and(|r| r.at >= cutoff)
    }
}

/// The findings grouped per process (processes in the order of their first, most severe,
/// finding; a process's findings in the report's order).
pub fn grouped<'a>(findings: &[&'a Finding]) -> Vec<&'a Finding> {
    let mut order: Vec<u32> = Vec::new();
    for f in findings {
        if !order.contains(&f.process.pid) {
            order.push(f.process.pid);
        }
    }
    order
        .iter()
        .flat_map(|pid| {
            findings
                .iter()
                .filter(move |f| f.process.pid == *pid)
                .copied()
        })
        .collect()
}

/// Runs `bufscope explain`: the selected findings as text, or with `json` as a JSON array.
pub fn run(client: &Client, selection: &Selection, json: bool) -> anyhow::Result<()> {
    let report = client.findings()?;
    let findings: Vec<&Finding> = report
        .findings
        .iter()
        .filter(|f| selection.matches(f) && selection.changed(f, report.generated_at))
        .collect();
    let findings = grouped(&findings);
    if json {
        // Through serde_json's Value: keys in alphabetical order, as `explain --json` prints.
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::to_value(&findings)?)?
        );
        return Ok(());
    }
    if let Some(s) = selection.since {
        println!("What changed in the last {}:\n", duration_text(s));
        if findings.is_empty() {
            println!("Nothing changed.");
            return Ok(());
        }
    }
    print!("{}", render_at(&findings, report.generated_at));
    Ok(())
}

/// Seconds as a person reads them.
fn duration_text(s: u64) -> String {
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}

/// Bytes as a person reads them.
fn bytes_text(b: f64) -> String {
    if b.abs() >= (1 << 20) as f64 {
        format!("{:.1} MiB", b / (1 << 20) as f64)
    } else if b.abs() >= 1024.0 {
        format!("{:.0} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

/// The per-socket parts of a finding: its story, the limit, where to fix it, what changed.
fn socket_parts(f: &Finding, now: u64, out: &mut String) {
    if let Some(st) = &f.story {
        if !st.calls.is_empty() {
            out.push_str(&format!(
                "  story ({} buffer, {} call(s)):\n",
                st.direction, st.calls_total
            ));
            for (n, c) in st.calls.iter().enumerate() {
                if n == 8 && st.calls_omitted > 0 {
                    out.push_str(&format!("    … {} call(s) not kept\n", st.calls_omitted));
                }
                let result = match &c.error {
                    Some(e) => format!("error {e}"),
                    None => format!("-> {}", c.effective),
                };
                let notes = if c.notes.is_empty() {
                    String::new()
                } else {
                    format!(" [{}]", c.notes.join(", "))
                };
                out.push_str(&format!(
                    "    {:>2}. {} {} {result}{notes}\n",
                    n + 1,
                    c.option,
                    c.requested
                ));
            }
        }
        if let Some(l) = &st.limit {
            let v = l
                .bytes
                .map_or_else(|| "unknown".to_string(), |b| b.to_string());
            let unknown;
            let scope = match l.scope.as_str() {
                "host" => "the host's namespace",
                "read_only" => "read-only in the socket's namespace: raised only on the host",
                "absent" => "not visible in the socket's namespace: raised only on the host",
                "netns" => "the socket's namespace has its own",
                "unknown" => {
                    unknown = format!(
                        "the socket's namespace: {}; the value is the host's",
                        l.unreadable
                            .as_deref()
                            .unwrap_or("not readable from bufscope")
                    );
                    &unknown
                }
                other => other,
            };
            out.push_str(&format!(
                "  limit: {}={v} ({scope}); buffer now {}\n",
                l.sysctl, st.final_bytes
            ));
        }
    }
    if !f.fixes.is_empty() {
        out.push_str("  where to fix:\n");
        for x in &f.fixes {
            let cost = x
                .memory_bytes
                .map(|m| format!(" [memory: up to {}]", bytes_text(m as f64)))
                .unwrap_or_default();
            out.push_str(&format!(
                "    {:<11} {}{}{cost}\n",
                format!("{}:", x.scope),
                if x.possible { "" } else { "(not from here) " },
                x.how
            ));
        }
    }
    if let Some(r) = &f.resolved {
        out.push_str(&format!(
            "  resolved {} ago ({}): before {}, {:.1} drops/s (pid {}, socket {}) -> after {}, {:.1} drops/s (pid {}, socket {})\n",
            duration_text(now.saturating_sub(r.at)),
            r.change,
            bytes_text(r.before.bytes as f64),
            r.before.drops_per_second,
            r.before.pid,
            r.before.inode,
            bytes_text(r.after.bytes as f64),
            r.after.drops_per_second,
            r.after.pid,
            r.after.inode,
        ));
    }
    if f.since > 0 && now > 0 {
        out.push_str(&format!(
            "  seen: first {} ago, last changed {} ago\n",
            duration_text(now.saturating_sub(f.since)),
            duration_text(now.saturating_sub(f.changed_at))
        ));
    }
}

/// An evidence value as JSON writes it (`2997.0`, `861.7`; `null` for NaN).
fn number(v: f64) -> String {
    serde_json::to_string(&v).unwrap_or_else(|_| "null".into())
}

/// Text rendering of findings (times relative to now).
pub fn render(findings: &[&Finding]) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    render_at(findings, now)
}

/// Text rendering of findings, times relative to `now` (Unix seconds).
pub fn render_at(findings: &[&Finding], now: u64) -> String {
    let mut out = String::new();
    if findings.is_empty() {
        out.push_str("No findings: no buffer problem observed for the selected processes.\n");
        return out;
    }
    for f in findings {
        let p = &f.process;
        let container: String = p.container.chars().take(12).collect();
        let place = if !p.pod.is_empty() {
            // In a Kubernetes pod: where an operator looks it up (kubectl -n NS logs POD -c NAME).
            let name = if p.container_name.is_empty() {
                String::new()
            } else {
                format!(" container {}", p.container_name.escape_debug())
            };
            format!(
                " pod {}/{}{name}",
                p.namespace.escape_debug(),
                p.pod.escape_debug()
            )
        } else if container.is_empty() {
            String::new()
        } else {
            format!(" container {}", container.escape_debug())
        };
        let verdict = match f.verdict {
            Some(Verdict::Unknown) | None => String::new(),
            Some(v) => format!("  [{}]", v.as_str()),
        };
        out.push_str(&format!(
            "{:<8}  {}  {} (pid {}){place}{verdict}\n",
            f.severity.as_str().to_uppercase(),
            f.kind.escape_debug(),
            p.comm.escape_debug(),
            p.pid,
        ));
        out.push_str(&format!("  what: {}\n", f.summary));
        out.push_str(&format!("  fix:  {}\n", f.fix));
        if let Some(g) = &f.guard {
            out.push_str(&format!("  guard: {g}\n"));
        }
        if let Some(s) = &f.socket {
            let ns = if s.netns == 0 {
                String::new()
            } else {
                format!(", netns {}", s.netns)
            };
            out.push_str(&format!("  socket: inode {} ({}{ns})\n", s.inode, s.proto));
        }
        socket_parts(f, now, &mut out);
        if !f.evidence.is_empty() {
            let kv: Vec<String> = f
                .evidence
                .iter()
                .map(|(k, v)| format!("{k}={}", number(*v)))
                .collect();
            out.push_str(&format!("  evidence: {}\n", kv.join(" ")));
        }
        out.push_str(&format!("  why:  {}\n\n", f.rule));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn report() -> bufscope_api::Report {
        serde_json::from_str(
            r#"{"version": 1, "generated_at": 1, "findings": [
              {"kind": "udp_rcvbuf_drops", "severity": "critical",
               "process": {"pid": 4475, "comm": "wireguard-go", "container": ""},
               "socket": {"inode": 160047, "proto": "udp"},
               "summary": "UDP socket dropping", "fix": "request a 7.0 MiB receive buffer",
               "evidence": {"drops_total": 2997.0, "drops_per_second": 861.7},
               "rule": "UDP 7 MiB"},
              {"kind": "tcp_rcvbuf_lock", "severity": "info",
               "process": {"pid": 7, "comm": "x\u001b[2J",
                           "container": "0123456789abcdef0123456789abcdef"},
               "socket": null, "summary": "idle", "fix": "none", "evidence": {},
               "rule": "r", "guard": "the guard is fixing this"}]}"#,
        )
        .unwrap()
    }

    #[test]
    fn a_process_in_a_pod_is_named_by_namespace_pod_and_container_name() {
        let mut r = report();
        let p = &mut r.findings[0].process;
        p.container = "0123456789abcdef0123456789abcdef".into();
        p.pod = "wg-gw-0".into();
        p.namespace = "vpn-edge".into();
        p.container_name = "wireguard-go".into();
        let text = render_at(&[&r.findings[0]], 0);
        assert!(
            text.starts_with(
                "CRITICAL  udp_rcvbuf_drops  wireguard-go (pid 4475) pod vpn-edge/wg-gw-0 container wireguard-go\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn text_per_finding() {
        let r = report();
        let all: Vec<&Finding> = r.findings.iter().collect();
        assert_eq!(
            render_at(&all, 0),
            "CRITICAL  udp_rcvbuf_drops  wireguard-go (pid 4475)\n\
             \x20 what: UDP socket dropping\n\
             \x20 fix:  request a 7.0 MiB receive buffer\n\
             \x20 socket: inode 160047 (udp)\n\
             \x20 evidence: drops_per_second=861.7 drops_total=2997.0\n\
             \x20 why:  UDP 7 MiB\n\n\
             INFO      tcp_rcvbuf_lock  x\\u{1b}[2J (pid 7) container 0123456789ab\n\
             \x20 what: idle\n\
             \x20 fix:  none\n\
             \x20 guard: the guard is fixing this\n\
             \x20 why:  r\n\n"
        );
        assert!(render(&[]).starts_with("No findings"));
    }

    /// A per-socket finding: its calls, the limit as the socket's namespace sees it, the
    /// fixes with what they cost, and what a fix changed.
    #[test]
    fn a_socket_finding_tells_its_story_fixes_and_resolution() {
        let f: Finding = serde_json::from_str(
            r#"{"kind": "udp_rcvbuf_drops", "severity": "info", "verdict": "resolved",
               "process": {"pid": 2, "comm": "unbound", "container": ""},
               "socket": {"inode": 77, "proto": "udp", "netns": 4026532000},
               "summary": "resolved: …", "fix": "host: sysctl", "evidence": {},
               "rule": "r", "since": 1000, "changed_at": 1500,
               "story": {"direction": "receive", "calls_total": 2, "final_bytes": 425984,
                 "calls": [
                   {"at": 1000, "option": "SO_RCVBUFFORCE", "requested": 7340032,
                    "effective": 212992, "error": "EPERM", "notes": ["force", "refused"]},
                   {"at": 1000, "option": "SO_RCVBUF", "requested": 7340032,
                    "effective": 425984, "notes": ["fallback", "clamped"]}],
                 "limit": {"sysctl": "net.core.rmem_max", "bytes": 212992, "scope": "read_only"}},
               "fixes": [
                 {"scope": "application", "possible": true, "how": "set `so-rcvbuf: 7340032`",
                  "config_key": "so-rcvbuf", "memory_bytes": 14680064},
                 {"scope": "pod", "possible": false, "how": "read-only"}],
               "resolved": {"at": 1500, "change": "restarted",
                 "before": {"bytes": 425984, "drops_per_second": 120.0, "inode": 77, "pid": 1},
                 "after": {"bytes": 14680064, "drops_per_second": 0.0, "inode": 88, "pid": 2}}}"#,
        )
        .unwrap();
        let text = render_at(&[&f], 1560);
        for want in [
            "INFO      udp_rcvbuf_drops  unbound (pid 2)  [resolved]\n",
            "  socket: inode 77 (udp, netns 4026532000)\n",
            "  story (receive buffer, 2 call(s)):\n",
            "     1. SO_RCVBUFFORCE 7340032 error EPERM [force, refused]\n",
            "     2. SO_RCVBUF 7340032 -> 425984 [fallback, clamped]\n",
            "  limit: net.core.rmem_max=212992 (read-only in the socket's namespace: raised only on the host); buffer now 425984\n",
            "    application: set `so-rcvbuf: 7340032` [memory: up to 14.0 MiB]\n",
            "    pod:        (not from here) read-only\n",
            "  resolved 60s ago (restarted): before 416 KiB, 120.0 drops/s (pid 1, socket 77) -> after 14.0 MiB, 0.0 drops/s (pid 2, socket 88)\n",
            "  seen: first 9m ago, last changed 60s ago\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        let since = |s| Selection {
            since: Some(s),
            ..Selection::default()
        };
        assert!(since(120).changed(&f, 1560), "resolved 60s ago");
        assert!(!since(30).changed(&f, 1560), "nothing in the last 30s");
    }

    #[test]
    fn findings_are_grouped_per_process() {
        let mut r = report();
        let mut third = r.findings[0].clone();
        third.kind = "rcvbuf_clamped".into();
        r.findings.push(third);
        let all: Vec<&Finding> = r.findings.iter().collect();
        let pids: Vec<u32> = grouped(&all).iter().map(|f| f.process.pid).collect();
        assert_eq!(pids, [4475, 4475, 7]);
    }

    #[test]
    fn selection_by_pid_and_comm() {
        let r = report();
        let pick = |s: Selection| {
            r.findings
                .iter()
                .filter(|f| s.matches(f))
                .map(|f| f.process.pid)
                .collect::<Vec<_>>()
        };
        assert_eq!(pick(Selection::default()), [4475, 7]);
        let by_pid = Selection {
            pid: Some(7),
            ..Selection::default()
        };
        assert_eq!(pick(by_pid), [7]);
        let by_comm = Selection {
            comm: Some("wireguard-go".into()),
            ..Selection::default()
        };
        assert_eq!(pick(by_comm), [4475]);
    }
}
