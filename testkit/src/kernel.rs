//! The running kernel's own descriptions, as tools that share no code with bufscope print them:
//! its BTF (`bpftool`) and what `bufscope check` says about it.

use std::process::Command;

use anyhow::Context as _;

use crate::cmd::cmd_output;

/// The running kernel's BTF as `bpftool btf dump file /sys/kernel/btf/vmlinux format <format>`
/// prints it (`c`: C declarations; `raw`: one line per type and member, with offsets).
pub fn btf_dump(format: &str) -> anyhow::Result<String> {
    cmd_output(Command::new("bpftool").args([
        "btf",
        "dump",
        "file",
        "/sys/kernel/btf/vmlinux",
        "format",
        format,
    ]))
    .context("bpftool btf dump (cargo xtask setup installs bpftool)")
}

/// How many arguments tracepoint `tp` passes after its context, from the prototype
/// `typedef void (*btf_trace_<tp>)(void *, …);` of a C BTF dump ([`btf_dump`]`("c")`); `None`
/// when the kernel has no such tracepoint.
pub fn btf_tracepoint_args(c: &str, tp: &str) -> Option<usize> {
    let proto = format!("(*btf_trace_{tp})(");
    let line = c.lines().find(|l| l.contains(&proto))?;
    Some(line.matches(',').count())
}

/// One probe line of `bufscope check`'s `probes:` section (`[ ok ] drops tp_btf/kfree_skb — …`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedProbe {
    /// The probe's name (`drops`, `autotune`, …).
    pub probe: String,
    /// `[ ok ]` (attached, or usable offline) rather than `[FAIL]`.
    pub ok: bool,
    /// Its hooks in the label form of `bufscope_probe_attached{hook}`: `a,b` (the online check
    /// prints `a + b`, the offline one `a,b`).
    pub hooks: String,
}

/// The probe lines of `bufscope check` output (online, or offline with `--btf`), in order: the
/// `[ ok ]`/`[FAIL]` lines after its `probes:` line.
pub fn check_probes(text: &str) -> Vec<CheckedProbe> {
    let mut out = Vec::new();
    let lines = text.lines().map(|l| l.trim_end_matches('\r'));
    for l in lines.skip_while(|l| *l != "probes:").skip(1) {
        let (ok, rest) = if let Some(rest) = l.strip_prefix("[ ok ]") {
            (true, rest)
        } else if let Some(rest) = l.strip_prefix("[FAIL]") {
            (false, rest)
        } else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(probe), Some(first)) = (words.next(), words.next()) else {
            continue;
        };
        let mut hooks = first.to_string();
        while words.next() == Some("+") {
            let Some(h) = words.next() else { break };
            hooks.push(',');
            hooks.push_str(h);
        }
        out.push(CheckedProbe {
            probe: probe.to_string(),
            ok,
            hooks,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_probes_reads_both_forms_after_the_probes_line() {
        let text = "bufscope 0.1.0\n[ ok ] CAP_BPF                present\nprobes:\n\
                    [ ok ] drops                  tp_btf/kfree_skb + fexit/__udp_enqueue_schedule_skb — UDP drops: attached\n\
                    \x20      (skipped tp_btf/kfree_skb: …)\n\
                    [FAIL] autotune               tp_btf/tcp_rcvbuf_grow — autotuning: hook missing\n\
                    [ ok ] owners                 cgroup/sock_create,tracepoint/syscalls/sys_exit_socket — owners\r\n\
                    missing capabilities CAP_PERFMON: run as root or grant them\n";
        let p = check_probes(text);
        let got: Vec<(&str, bool, &str)> = p
            .iter()
            .map(|c| (c.probe.as_str(), c.ok, c.hooks.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "drops",
                    true,
                    "tp_btf/kfree_skb,fexit/__udp_enqueue_schedule_skb"
                ),
                ("autotune", false, "tp_btf/tcp_rcvbuf_grow"),
                (
                    "owners",
                    true,
                    "cgroup/sock_create,tracepoint/syscalls/sys_exit_socket"
                ),
            ]
        );
    }

    #[test]
    fn tracepoint_arguments_from_the_c_dump() {
        let c = "typedef void (*btf_trace_kfree_skb)(void *, struct sk_buff *, void *, enum \
                 skb_drop_reason, struct sock *);\n";
        assert_eq!(btf_tracepoint_args(c, "kfree_skb"), Some(4));
        assert_eq!(btf_tracepoint_args(c, "tcp_rcvbuf_grow"), None);
    }
}
