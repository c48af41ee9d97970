//! The rules for the data planes that live in the kernel: netlink overruns of the daemons that
//! follow route and XFRM events, and the XFRM errors of an IKE daemon's namespace (inputs from
//! the `netlink` and `xfrm` rooms).

use super::*;

/// Finding kinds of these rules.
pub mod kinds {
    /// A netlink socket lost messages on a full receive buffer (`ENOBUFS`).
    pub const NETLINK_OVERRUNS: &str = "netlink_overruns";
    /// The kernel counted IPsec (XFRM) errors in the namespace of an IKE daemon.
    pub const XFRM_ERRORS: &str = "xfrm_errors";
}

/// Where the XFRM advice comes from.
const XFRM_RULE: &str = "Documentation/networking/xfrm_proc.rst: the per-namespace \
     /proc/net/xfrm_stat counters; net/xfrm/xfrm_input.c, xfrm_output.c, xfrm_policy.c count them";

/// One namespace's XFRM errors, with its IKE daemon.
#[derive(Clone, Debug)]
pub struct XfrmView {
    /// The IKE daemon (the holder of the namespace's XFRM netlink or PF_KEY socket).
    pub owner: ProcRef,
    /// Network namespace inode.
    pub netns: u32,
    /// (reason, counted so far, per second over the advice window).
    pub reasons: Vec<(String, u64, f64)>,
}

/// What an XFRM error counter means and what to change (None: expected by configuration,
/// such as `action block` policies, or not actionable from the host). The meanings follow where
/// the kernel counts each one (net/xfrm/xfrm_input.c, xfrm_policy.c, xfrm_state.c, xfrm_iptfs.c).
fn xfrm_advice(reason: &str) -> Option<&'static str> {
    Some(match reason {
        // The buffer-related ones.
        "XfrmOutNoQueueSpace" => {
            "an IP-TFS SA's send queue was full and the kernel dropped what did not fit: \
             raise the SA's queue (max-queue-size among ip xfrm state's iptfs options, \
             strongSwan iptfs_max_queue)"
        }
        "XfrmNoSkbError" => {
            "the kernel could not allocate a packet buffer while (de)aggregating IP-TFS: the \
             host is short of atomic memory; check vm.min_free_kbytes and slab usage"
        }
        "XfrmInBufferError" => {
            "a packet needed more than XFRM_MAX_DEPTH (6) transforms (nested SAs, or the \
             templates of the policies it matched), or an offloaded packet came back \
             unprocessed from the NIC: flatten stacked policies or check the NIC's IPsec \
             offload"
        }
        // SAs the daemon lost or installed late: its own buffer (netlink) comes first.
        "XfrmInNoStates" => {
            "inbound ESP for an SPI with no SA: the daemon deleted or never installed the SA \
             the peer uses (a rekey race, or SA events it lost); rekey with make-before-break \
             (strongSwan make_before_break = yes) and keep its netlink socket from overrunning"
        }
        "XfrmOutNoStates" => {
            "outbound packets matched an IPsec policy with no SA: the IKE daemon has not \
             negotiated one (it missed or did not answer the kernel's acquire, or the peer is \
             down); check that it runs, that its connection is up and that its netlink socket \
             keeps up"
        }
        "XfrmAcquireError" => {
            "packets hit an SA still being negotiated (larval acquire): the daemon installs \
             SAs too slowly or not at all; check its connection and its netlink socket"
        }
        "XfrmInStateSeqError" => {
            "inbound sequence numbers outside the anti-replay window: reordering (multi-queue \
             NICs, ECMP, pcrypt) exceeds the window; raise the replay window (strongSwan \
             replay_window, libreswan replay-window) to 1024 or more"
        }
        "XfrmOutStateSeqError" => {
            "an SA's 32-bit sequence number ran out: enable extended sequence numbers (esn) or \
             rekey by packets before 2^32"
        }
        "XfrmInStateExpired" | "XfrmOutStateExpired" => {
            "packets hit an SA past its hard lifetime: rekeying starts too late; rekey earlier \
             (strongSwan rekey_time/rand_time, libreswan rekeymargin)"
        }
        "XfrmInStateProtoError" | "XfrmOutStateProtoError" => {
            "ESP/AH processing failed (on input: integrity check, i.e. the peers' keys or \
             algorithms disagree): check the SA's keys and the peer"
        }
        "XfrmInNoPols"
        | "XfrmInTmplMismatch"
        | "XfrmInStateMismatch"
        | "XfrmInStateDirError"
        | "XfrmOutStateDirError" => {
            "packets matched no policy, the wrong SA or an SA of the other direction: the \
             peers' traffic selectors disagree"
        }
        "XfrmFwdHdrError" | "XfrmInHdrError" | "XfrmInError" | "XfrmOutError" => {
            "malformed or unroutable packets: check the path MTU and the peer"
        }
        _ => return None,
    })
}

/// Reasons whose cause can be an IKE daemon that lost XFRM events on its netlink socket.
fn lost_events_matter(reason: &str) -> bool {
    matches!(
        reason,
        "XfrmInNoStates" | "XfrmOutNoStates" | "XfrmAcquireError"
    )
}

/// `xfrm_errors`: one finding per namespace with a known IKE daemon and actionable errors.
/// When the daemon's own netlink sockets overran, the finding says so first: a daemon that
/// lost acquire or expire events leaves the kernel without SAs.
pub(super) fn xfrm_errors(b: &mut Builder<'_>) {
    for v in &b.inputs.xfrm {
        let mut actionable: Vec<&(String, u64, f64)> = v
            .reasons
            .iter()
            .filter(|(r, n, _)| *n > 0 && xfrm_advice(r).is_some())
            .collect();
        if actionable.is_empty() {
            continue;
        }
        actionable.sort_by(|a, c| {
            (c.2, c.1)
                .partial_cmp(&(a.2, a.1))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        let rate: f64 = actionable.iter().map(|r| r.2).sum();
        let total: u64 = actionable.iter().map(|r| r.1).sum();
        let worst = actionable[0];
        let list: Vec<String> = actionable
            .iter()
            .take(3)
            .map(|(r, n, _)| format!("{r} {n}"))
            .collect();
        let summary = format!(
            "IPsec errors in network namespace {} ({}): {}",
            v.netns,
            if rate > 0.0 {
                drop_rate_text(rate, b.inputs.window)
            } else {
                format!("none in the last {}s", b.inputs.window.as_secs())
            },
            list.join(", ")
        );
        // The daemon's overrun XFRM netlink sockets (protocol 6).
        let lost: u64 = b
            .inputs
            .netlink
            .iter()
            .filter(|n| n.owner == Some(v.owner) && n.protocol == NETLINK_XFRM)
            .map(|n| n.overruns)
            .sum();
        let mut fixes = Vec::new();
        if lost > 0 && actionable.iter().any(|(r, _, _)| lost_events_matter(r)) {
            fixes.push(format!(
                "first: the IKE daemon's NETLINK_XFRM socket lost {lost} events (see its \
                 netlink_overruns finding), so acquires and expires it never saw leave the \
                 kernel without SAs"
            ));
        }
        fixes.extend(
            actionable
                .iter()
                .take(3)
                .filter_map(|(r, _, _)| Some(format!("{r}: {}", xfrm_advice(r)?))),
        );
        let fix = fixes.join("; ");
        let mut evidence = vec![
            ("errors_total", total as f64),
            ("drops_per_second", rate),
            ("netns", f64::from(v.netns)),
            ("worst_reason_total", worst.1 as f64),
        ];
        if lost > 0 {
            evidence.push(("daemon_netlink_overruns", lost as f64));
        }
        b.push(
            &v.owner,
            kinds::XFRM_ERRORS,
            drop_severity(rate),
            None,
            summary,
            fix,
            evidence,
            XFRM_RULE,
        );
    }
}

/// `NETLINK_XFRM`.
const NETLINK_XFRM: u16 = 6;

/// Where the netlink advice comes from.
const NETLINK_RULE: &str = "net/netlink/af_netlink.c: netlink_overrun drops a message when the \
     socket's queued bytes exceed its receive buffer and counts it in sk_drops (/proc/net/netlink \
     Drops); the reader gets ENOBUFS once and must dump the table again";

/// Netlink buffer bufscope recommends at least (bytes, as requested with `SO_RCVBUFFORCE`).
pub const NETLINK_MIN_RCVBUF: i64 = 8 << 20;

/// One netlink socket that overran.
#[derive(Clone, Debug)]
pub struct NetlinkView {
    /// The process holding it.
    pub owner: Option<ProcRef>,
    /// Socket inode.
    pub inode: u64,
    /// Inode of its network namespace.
    pub netns: u32,
    /// Netlink protocol (`NETLINK_ROUTE` = 0, `NETLINK_XFRM` = 6, …).
    pub protocol: u16,
    /// Multicast groups it listens to (the first 32).
    pub groups: u32,
    /// Overruns counted so far.
    pub overruns: u64,
    /// Overruns per second over the advice window.
    pub rate: f64,
    /// `SO_RCVBUF` as `getsockopt` reports it, when bufscope could read it.
    pub rcvbuf: Option<i32>,
    /// `NETLINK_NO_ENOBUFS` set, when bufscope could read it.
    pub no_enobufs: Option<bool>,
}

/// What the daemons that commonly own such a socket call the setting.
fn daemon_hint(protocol: u16) -> &'static str {
    match protocol {
        6 => {
            " (strongSwan: charon.plugins.kernel-netlink.receive_buffer_size with \
             force_receive_buffer_size = yes)"
        }
        0 => " (FRR zebra: --nl-bufsize)",
        _ => "",
    }
}

/// `netlink_overruns`: one finding per process, naming its worst socket.
pub(super) fn netlink_overruns(b: &mut Builder<'_>) {
    let groups = by_owner(
        b.inputs
            .netlink
            .iter()
            .filter_map(|v| v.owner.map(|o| (o, v))),
    );
    for (p, socks) in groups {
        let total: u64 = socks.iter().map(|v| v.overruns).sum();
        let rate: f64 = socks.iter().map(|v| v.rate).sum();
        let Some(worst) = socks.iter().max_by(|a, c| {
            (a.rate, a.overruns)
                .partial_cmp(&(c.rate, c.overruns))
                .unwrap_or(std::cmp::Ordering::Equal)
        }) else {
            continue;
        };
        let family = crate::signals::netlink::table::family_name(worst.protocol);
        let what = if rate > 0.0 {
            format!(
                "lost {} NETLINK_{family} messages (overruns, ENOBUFS)",
                drop_rate_text(rate, b.inputs.window)
            )
        } else {
            format!(
                "lost {total} NETLINK_{family} messages (overruns, ENOBUFS; none in the last {}s)",
                b.inputs.window.as_secs()
            )
        };
        let buffer = match worst.rcvbuf {
            Some(r) => format!(" with a {} receive buffer", kib(r as f64)),
            None => String::new(),
        };
        let mut summary = format!("netlink socket {what}{buffer}");
        if socks.len() > 1 {
            summary.push_str(&format!(" ({} sockets affected)", socks.len()));
        }
        let want = worst.rcvbuf.map_or(NETLINK_MIN_RCVBUF, |r| {
            (4 * i64::from(r) / 2).max(NETLINK_MIN_RCVBUF)
        });
        let mut fix = format!(
            "raise the socket's receive buffer to at least {}: SO_RCVBUFFORCE (with \
             CAP_NET_ADMIN; not capped by net.core.rmem_max={}), else SO_RCVBUF with \
             net.core.rmem_max >= {want}{}",
            kib(want as f64),
            b.inputs
                .rmem_max
                .map_or_else(|| "unknown".to_string(), |v| v.to_string()),
            daemon_hint(worst.protocol)
        );
        if worst.no_enobufs == Some(true) {
            summary.push_str("; NETLINK_NO_ENOBUFS is set, so the daemon is not told");
            fix.push_str(
                "; the daemon set NETLINK_NO_ENOBUFS and never learns of the loss: its view \
                 of the kernel's tables is stale until it dumps them again",
            );
        } else {
            fix.push_str(
                "; a daemon that dumps the tables again on ENOBUFS recovers but pays a full \
                 resync per overrun",
            );
        }
        let mut evidence = vec![
            ("overruns_total", total as f64),
            ("drops_per_second", rate),
            ("sockets", socks.len() as f64),
            ("netlink_protocol", f64::from(worst.protocol)),
            ("recommended_bytes", want as f64),
        ];
        if let Some(r) = worst.rcvbuf {
            evidence.push(("rcvbuf_bytes", f64::from(r)));
        }
        if let Some(r) = b.inputs.rmem_max {
            evidence.push(("rmem_max_bytes", r as f64));
        }
        b.push(
            &p,
            kinds::NETLINK_OVERRUNS,
            drop_severity(rate),
            Some(SocketRef {
                inode: worst.inode,
                proto: "netlink",
                netns: u64::from(worst.netns),
            }),
            summary,
            fix,
            evidence,
            NETLINK_RULE,
        );
    }
}

#[cfg(test)]
mod xfrm_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn replay_errors_get_a_window_fix_and_blocks_none() {
        let owner = ProcRef {
            tgid: 7,
            start_ticks: 1,
        };
        let mut i = Inputs {
            window: Duration::from_secs(60),
            ..Inputs::default()
        };
        i.xfrm.push(XfrmView {
            owner,
            netns: 4026532177,
            reasons: vec![
                ("XfrmOutPolBlock".into(), 500, 8.0),
                ("XfrmInStateSeqError".into(), 40, 2.0),
            ],
        });
        let f = evaluate(&i);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, kinds::XFRM_ERRORS);
        assert!(f[0].fix.contains("replay window"), "{}", f[0].fix);
        assert!(
            !f[0].summary.contains("PolBlock"),
            "blocks are configuration: {}",
            f[0].summary
        );
        assert_eq!(f[0].severity, Severity::Critical);
        i.xfrm[0].reasons.truncate(1);
        assert!(
            evaluate(&i).is_empty(),
            "only a block policy: nothing to fix"
        );
    }

    #[test]
    fn missing_sas_point_at_the_daemons_lost_events_first() {
        let owner = ProcRef {
            tgid: 9,
            start_ticks: 3,
        };
        let mut i = Inputs {
            window: Duration::from_secs(60),
            ..Inputs::default()
        };
        i.xfrm.push(XfrmView {
            owner,
            netns: 4026532200,
            reasons: vec![("XfrmOutNoStates".into(), 1200, 20.0)],
        });
        let lost = NetlinkView {
            owner: Some(owner),
            inode: 5,
            netns: 4026531840,
            protocol: NETLINK_XFRM,
            groups: 0x1,
            overruns: 340,
            rate: 5.0,
            rcvbuf: Some(8192),
            no_enobufs: Some(false),
        };
        // The same daemon's ROUTE socket is not its XFRM events.
        i.netlink.push(NetlinkView {
            protocol: 0,
            overruns: 7,
            ..lost.clone()
        });
        let f = evaluate(&i);
        let x = f.iter().find(|f| f.kind == kinds::XFRM_ERRORS).unwrap();
        assert!(!x.fix.starts_with("first"), "no XFRM overruns: {}", x.fix);
        assert!(x.fix.contains("acquire"), "{}", x.fix);
        assert!(!x.evidence.contains_key("daemon_netlink_overruns"));
        i.netlink.push(lost);
        let f = evaluate(&i);
        let x = f.iter().find(|f| f.kind == kinds::XFRM_ERRORS).unwrap();
        assert!(x.fix.starts_with("first"), "{}", x.fix);
        assert!(x.fix.contains("lost 340 events"), "{}", x.fix);
        assert_eq!(x.evidence["daemon_netlink_overruns"], 340.0);
        assert_eq!(x.evidence["errors_total"], 1200.0);
        // A replay-window problem is not the daemon's events.
        i.xfrm[0].reasons = vec![("XfrmInStateSeqError".into(), 10, 0.0)];
        let f = evaluate(&i);
        let x = f.iter().find(|f| f.kind == kinds::XFRM_ERRORS).unwrap();
        assert!(!x.fix.starts_with("first"), "{}", x.fix);
        assert_eq!(x.severity, Severity::Warning);
        assert!(x.summary.contains("none in the last 60s"), "{}", x.summary);
    }

    #[test]
    fn every_counter_of_the_kernel_is_classified() {
        // The names of net/xfrm/xfrm_proc.c (6.18): each is advice or a configured outcome.
        let configured = [
            "XfrmInPolBlock",
            "XfrmOutPolBlock",
            "XfrmInPolError",
            "XfrmOutPolError",
            "XfrmOutPolDead",
            "XfrmInStateModeError",
            "XfrmOutStateModeError",
            "XfrmInStateInvalid",
            "XfrmOutStateInvalid",
            "XfrmOutBundleGenError",
            "XfrmOutBundleCheckError",
            "XfrmInIptfsError",
        ];
        for r in [
            "XfrmInError",
            "XfrmInBufferError",
            "XfrmInHdrError",
            "XfrmInNoStates",
            "XfrmInStateProtoError",
            "XfrmInStateSeqError",
            "XfrmInStateExpired",
            "XfrmInStateMismatch",
            "XfrmInTmplMismatch",
            "XfrmInNoPols",
            "XfrmFwdHdrError",
            "XfrmOutError",
            "XfrmOutNoStates",
            "XfrmOutStateProtoError",
            "XfrmOutStateSeqError",
            "XfrmOutStateExpired",
            "XfrmAcquireError",
            "XfrmOutStateDirError",
            "XfrmInStateDirError",
            "XfrmNoSkbError",
            "XfrmOutNoQueueSpace",
        ] {
            assert!(xfrm_advice(r).is_some(), "{r} has no advice");
        }
        for r in configured {
            assert!(xfrm_advice(r).is_none(), "{r}");
        }
        assert!(
            xfrm_advice("XfrmOutNoQueueSpace")
                .unwrap()
                .contains("max-queue-size")
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn inputs(v: NetlinkView) -> Inputs {
        let mut i = Inputs {
            window: Duration::from_secs(60),
            rmem_max: Some(212_992),
            ..Inputs::default()
        };
        i.netlink.push(v);
        i
    }

    fn view(rate: f64, rcvbuf: Option<i32>, no_enobufs: Option<bool>) -> NetlinkView {
        NetlinkView {
            owner: Some(ProcRef {
                tgid: 42,
                start_ticks: 1,
            }),
            inode: 93093,
            netns: 4026531840,
            protocol: 6,
            groups: 0x4,
            overruns: 5991,
            rate,
            rcvbuf,
            no_enobufs,
        }
    }

    #[test]
    fn names_family_buffer_and_fix() {
        let f = evaluate(&inputs(view(120.0, Some(8192), Some(false))));
        assert_eq!(f.len(), 1);
        let f = &f[0];
        assert_eq!(f.kind, kinds::NETLINK_OVERRUNS);
        assert_eq!(f.severity, Severity::Critical);
        assert!(f.summary.contains("NETLINK_XFRM"), "{}", f.summary);
        assert!(f.summary.contains("8 KiB receive buffer"), "{}", f.summary);
        assert!(f.fix.contains("SO_RCVBUFFORCE"), "{}", f.fix);
        assert!(f.fix.contains("strongSwan"), "{}", f.fix);
        assert_eq!(f.evidence["recommended_bytes"], NETLINK_MIN_RCVBUF as f64);
        assert_eq!(f.socket.as_ref().unwrap().proto, "netlink");
    }

    #[test]
    fn sporadic_is_a_warning_and_no_enobufs_is_said() {
        let f = evaluate(&inputs(view(0.0, None, Some(true))));
        assert_eq!(f[0].severity, Severity::Warning);
        assert!(f[0].fix.contains("NETLINK_NO_ENOBUFS"), "{}", f[0].fix);
        assert!(f[0].summary.contains("5991"), "{}", f[0].summary);
    }

    #[test]
    fn a_large_buffer_is_raised_fourfold() {
        let f = evaluate(&inputs(view(5.0, Some(32 << 20), None)));
        assert_eq!(f[0].evidence["recommended_bytes"], (64 << 20) as f64);
    }
}
