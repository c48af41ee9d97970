//! What the probes section compares: each bufscope program next to a bpftrace one-liner that
//! counts the same events by the same key, and bpftrace scripts that gather the same data.

use anyhow::{Context as _, bail};

use super::loads::Load;

/// One compared hook: a bufscope program and the bpftrace one-liner counting the same events
/// by the same key.
pub(super) struct Hook {
    pub(super) event: &'static str,
    pub(super) load: Load,
    pub(super) bufscope_prog: &'static str,
    pub(super) key: &'static str,
    pub(super) bpftrace: String,
}

/// Drop-reason numbers of this kernel (from the `skb:kfree_skb` format's symbol table).
fn reason_numbers(names: &[&str]) -> anyhow::Result<Vec<u32>> {
    let fmt = std::fs::read_to_string("/sys/kernel/tracing/events/skb/kfree_skb/format")
        .context("reading the skb:kfree_skb tracepoint format")?;
    let mut out = Vec::new();
    for name in names {
        let needle = format!("\"{name}\" }}");
        let Some(i) = fmt.find(&needle) else {
            continue;
        };
        let before = &fmt[..i];
        let num = before
            .rsplit('{')
            .next()
            .and_then(|s| s.trim().trim_end_matches(',').trim().parse().ok());
        if let Some(n) = num {
            out.push(n);
        }
    }
    if out.is_empty() {
        bail!("no drop reason numbers found in the kfree_skb format");
    }
    Ok(out)
}

/// True when the kernel's `struct sock` has `sk_ino` (6.18+).
fn kernel_has_sk_ino() -> bool {
    bufscope_testkit::btf_dump("c").is_ok_and(|text| {
        text.split("\nstruct sock {")
            .nth(1)
            .and_then(|rest| rest.split("\n};").next())
            .is_some_and(|body| body.contains(" sk_ino;"))
    })
}

pub(super) fn hooks() -> anyhow::Result<Vec<Hook>> {
    // The reasons bufscope counts by default.
    let reasons = reason_numbers(bufscope_common::TRACKED_DROP_REASONS)?;
    let filter = reasons
        .iter()
        .map(|r| format!("args->reason == {r}"))
        .collect::<Vec<_>>()
        .join(" || ");
    // The cheapest way to the same key (the socket's inode) bpftrace has on this kernel.
    let (sk_inode, tcp_inode) = if kernel_has_sk_ino() {
        (
            "((struct sock *)args->rx_sk)->sk_ino",
            "((struct sock *)args->skaddr)->sk_ino",
        )
    } else {
        (
            "((struct sock *)args->rx_sk)->sk_socket->file->f_inode->i_ino",
            "((struct sock *)args->skaddr)->sk_socket->file->f_inode->i_ino",
        )
    };
    let fd_inode = "((struct file *)*kptr((uint64 *)((uint64)curtask->files->fdt->fd + (uint64)args->ret * 8)))->f_inode->i_ino";
    Ok(vec![
        Hook {
            event: "kfree_skb, tracked reason",
            load: Load::UdpDrops,
            bufscope_prog: "kfree_skb",
            key: "socket inode × reason",
            bpftrace: format!(
                "tracepoint:skb:kfree_skb /{filter}/ {{ @[{sk_inode}, args->reason] = count(); }}"
            ),
        },
        // bufscope's default hook runs once per setsockopt call (cgroup/setsockopt: no cost to
        // other syscalls); bpftrace has no cgroup hook, so its one-liner counts the same calls
        // on the syscall-entry tracepoint (which taxes every syscall while attached: see the
        // syscalls section).
        Hook {
            event: "cgroup/setsockopt",
            load: Load::Setsockopt,
            bufscope_prog: "cgroup_setsockopt",
            key: "process × option",
            bpftrace: "tracepoint:syscalls:sys_enter_setsockopt /args->level == 1 && \
                       (args->optname == 7 || args->optname == 8 || args->optname == 32 || \
                       args->optname == 33 || args->optname == 72)/ \
                       { @[pid, args->optname] = count(); }"
                .into(),
        },
        Hook {
            event: "inet_sock_set_state",
            load: Load::TcpConnect,
            bufscope_prog: "inet_sock_set_state",
            key: "process (ESTABLISHED)",
            bpftrace: "tracepoint:sock:inet_sock_set_state /args->protocol == 6 && \
                       args->newstate == 1/ { @[pid, comm] = count(); }"
                .into(),
        },
        Hook {
            event: "cgroup/sock_create",
            load: Load::TcpConnect,
            bufscope_prog: "cgroup_sock_create",
            key: "process × socket inode",
            bpftrace: format!(
                "tracepoint:syscalls:sys_exit_socket /args->ret >= 0/ \
                 {{ @[pid, {fd_inode}] = count(); }}"
            ),
        },
        Hook {
            event: "tcp_rcvbuf_grow",
            load: Load::TcpBulk,
            bufscope_prog: "tcp_rcvbuf_grow",
            key: "socket inode",
            bpftrace: format!("tracepoint:tcp:tcp_rcvbuf_grow {{ @[{tcp_inode}] = count(); }}"),
        },
    ])
}

/// A bpftrace script that gathers what a bufscope probe (or pair) gathers — the same reads,
/// map updates and one output record per event — for a like-for-like cost comparison next to
/// the counting one-liners.
pub(super) struct SameData {
    pub(super) what: &'static str,
    pub(super) load: Load,
    /// The bufscope programs whose per-event costs add up to one event of this row.
    pub(super) progs: &'static [&'static str],
    /// Program runs per event in the script (2 for an enter/exit pair).
    pub(super) runs_per_event: f64,
    pub(super) script: String,
}

pub(super) fn same_data() -> Vec<SameData> {
    // `sk->sk_ino` (6.18+) or the socket's inode through its file, as in `hooks()`.
    let ino = if kernel_has_sk_ino() {
        "$sk->sk_ino"
    } else {
        "$sk->sk_socket->file->f_inode->i_ino"
    };
    let fd_file = |fd: &str| {
        format!(
            "((struct file *)*kptr((uint64 *)((uint64)curtask->files->fdt->fd + (uint64){fd} * 8)))"
        )
    };
    let sockopt = format!(
        "tracepoint:syscalls:sys_enter_setsockopt /args->level == 1 && (args->optname == 7 || \
         args->optname == 8 || args->optname == 32 || args->optname == 33 || args->optname == 72)/ \
         {{ $f = {file}; $sk = ((struct socket *)$f->private_data)->sk; \
         @pend[tid] = ((uint64)$f, (uint64)$sk, args->optname, *(int32 *)uptr(args->optval), \
         $sk->sk_userlocks); }} \
         tracepoint:syscalls:sys_exit_setsockopt /@pend[tid].1 != 0/ {{ $p = @pend[tid]; \
         delete(@pend[tid]); $sk = (struct sock *)$p.1; \
         $ino = ((struct file *)$p.0)->f_inode->i_ino; \
         if (@own[$ino].0 != pid) {{ @own[$ino] = (pid, tid, cgroup, comm); }} \
         printf(\"%d %s %lu %u %d %d %d %d %d %d %d %d\\n\", pid, comm, $ino, \
         $sk->__sk_common.skc_net.net->ns.inum, $p.2, $p.3, args->ret, $sk->sk_rcvbuf, \
         $sk->sk_sndbuf, $p.4, $sk->sk_userlocks, $sk->sk_protocol); }}",
        file = fd_file("args->fd")
    );
    let state = format!(
        "tracepoint:sock:inet_sock_set_state /args->protocol == 6 && (args->newstate == 1 || \
         args->newstate == 10 || args->newstate == 2 || (args->oldstate == 10 && \
         args->newstate == 7))/ {{ $sk = (struct sock *)args->skaddr; \
         $net = $sk->__sk_common.skc_net.net; $ns = $net->ns.inum; \
         if (args->newstate == 10) {{ @lis[$ns, args->sport] = (pid, tid, cgroup, comm); }} \
         else if (args->newstate == 2) {{ if (@own[{ino}].0 != pid) {{ \
         @own[{ino}] = (pid, tid, cgroup, comm); }} }} \
         else if (args->newstate == 7) {{ delete(@lis[$ns, args->sport]); }} \
         else {{ $tp = (struct tcp_sock *)$sk; \
         if (args->oldstate == 3) {{ $o = @lis[$ns, args->sport]; }} else {{ $o = @own[{ino}]; }} \
         printf(\"%d %s %lu %u %d %u %d %d %d %d %d %d\\n\", $o.0, $o.3, {ino}, $ns, \
         $sk->sk_rcvbuf, $net->ipv4.sysctl_tcp_rmem[2], $tp->window_clamp, \
         $tp->rx_opt.rcv_wscale, $tp->rx_opt.snd_wscale, $tp->rx_opt.wscale_ok, \
         $sk->sk_userlocks, $net->ipv4.sysctl_tcp_window_scaling); }} }}"
    );
    let owners = format!(
        "tracepoint:syscalls:sys_exit_socket /args->ret >= 0/ \
         {{ @own[{file}->f_inode->i_ino] = (pid, tid, cgroup, \
         curtask->group_leader->start_boottime, comm); }}",
        file = fd_file("args->ret")
    );
    let grow = format!(
        "tracepoint:tcp:tcp_rcvbuf_grow {{ $sk = (struct sock *)args->skaddr; \
         $tp = (struct tcp_sock *)$sk; @g[{ino}] = count(); \
         @last[{ino}] = ($tp->copied_seq - $tp->rcvq_space.seq, $tp->rcv_rtt_est.rtt_us >> 3, \
         $sk->sk_rcvbuf, $sk->sk_userlocks, args->time, nsecs, \
         $sk->__sk_common.skc_net.net->ipv4.sysctl_tcp_moderate_rcvbuf); }}"
    );
    vec![
        SameData {
            what: "setsockopt call",
            load: Load::Setsockopt,
            progs: &["cgroup_setsockopt"],
            runs_per_event: 2.0,
            script: sockopt,
        },
        SameData {
            what: "TCP state change",
            load: Load::TcpConnect,
            progs: &["inet_sock_set_state"],
            runs_per_event: 1.0,
            script: state,
        },
        SameData {
            what: "new socket",
            load: Load::TcpConnect,
            progs: &["cgroup_sock_create"],
            runs_per_event: 1.0,
            script: owners,
        },
        SameData {
            what: "tcp_rcvbuf_grow",
            load: Load::TcpBulk,
            progs: &["tcp_rcvbuf_grow"],
            runs_per_event: 1.0,
            script: grow,
        },
    ]
}
