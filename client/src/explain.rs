//! `bufscope explain`: reads `/api/v1/findings` from a running bufscope and prints, per
//! process, what is wrong and what to change (or the findings as JSON).

use bufscope_api::Finding;

use crate::Client;

/// Which findings to print.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Only about this process id.
    pub pid: Option<u32>,
    /// Only about processes with this name.
    pub comm: Option<String>,
}

impl Selection {
    /// Whether `f` is selected.
    pub fn matches(&self, f: &Finding) -> bool {
        self.pid.is_none_or(|p| f.process.pid == p)
            && self.comm.as_deref().is_none_or(|c| f.process.comm == c)
    }
}

/// Runs `bufscope explain`: the selected findings as text, or with `json` as a JSON array.
pub fn run(client: &Client, selection: &Selection, json: bool) -> anyhow::Result<()> {
    let report = client.findings()?;
    let findings: Vec<&Finding> = report
        .findings
        .iter()
        .filter(|f| selection.matches(f))
        .collect();
    if json {
        // Through serde_json's Value: keys in alphabetical order, as `explain --json` prints.
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::to_value(&findings)?)?
        );
        return Ok(());
    }
    print!("{}", render(&findings));
    Ok(())
}

/// An evidence value as JSON writes it (`2997.0`, `861.7`; `null` for NaN).
fn number(v: f64) -> String {
    serde_json::to_string(&v).unwrap_or_else(|_| "null".into())
}

/// Text rendering of findings.
pub fn render(findings: &[&Finding]) -> String {
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
        out.push_str(&format!(
            "{:<8}  {}  {} (pid {}){place}\n",
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
            out.push_str(&format!("  socket: inode {} ({})\n", s.inode, s.proto));
        }
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
        let text = render(&[&r.findings[0]]);
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
            render(&all),
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
