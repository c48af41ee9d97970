//! The rules for the data planes that live in the kernel: netlink overruns of the daemons that
//! follow route and XFRM events (inputs from the `netlink` room).

use super::*;

/// Finding kinds of these rules.
pub mod kinds {
    /// A netlink socket lost messages on a full receive buffer (`ENOBUFS`).
    pub const NETLINK_OVERRUNS: &str = "netlink_overruns";
}

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
            limit(b.inputs.rmem_max),
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
            }),
            summary,
            fix,
            evidence,
            NETLINK_RULE,
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
