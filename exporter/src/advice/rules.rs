//! The rules, one function per finding kind: each reads its part of [`Inputs`] and pushes
//! findings through the [`Builder`].

use super::*;

pub(super) fn tcp_drops(b: &mut Builder<'_>) {
    let groups = by_owner(b.inputs.drops.iter().filter_map(|d| {
        (d.proto == Proto::Tcp)
            .then(|| d.owner.map(|o| (o, d)))
            .flatten()
    }));
    for (p, drops) in groups {
        let total: u64 = drops.iter().map(|d| d.packets).sum();
        let rate: f64 = drops.iter().map(|d| d.rate).sum();
        let mut reasons: Vec<&str> = drops.iter().map(|d| &*d.reason).collect();
        reasons.sort_unstable();
        reasons.dedup();
        let locked = b.tcp_locked.contains(&p);
        let fix = if locked {
            "this process locks its TCP receive buffers (SO_RCVBUF): remove the setsockopt so \
             autotuning can size them"
                .to_string()
        } else {
            "the application reads too slowly for the arrival rate (zero window / receive queue \
             full); these are retransmitted, costing throughput and latency"
                .to_string()
        };
        b.push(
            &p,
            kind::TCP_BUFFER_DROPS,
            if rate >= SUSTAINED_DROPS_PER_SECOND && locked {
                Severity::Critical
            } else {
                Severity::Warning
            },
            None,
            format!(
                "TCP segments dropped for buffer reasons ({}): {total} in total, {}",
                reasons.join(", "),
                if rate > 0.0 {
                    format!("{} now", drop_rate_text(rate, b.inputs.window))
                } else {
                    format!("none in the last {}s", b.inputs.window.as_secs())
                }
            ),
            fix,
            vec![("drops_total", total as f64), ("drops_per_second", rate)],
            Rule::TcpAutotune.citation(),
        );
    }
}

pub(super) fn tun_ring(b: &mut Builder<'_>) {
    let groups = by_owner(b.inputs.drops.iter().filter_map(|d| {
        (&*d.reason == "FULL_RING" && d.inode == 0)
            .then(|| d.owner.map(|o| (o, d)))
            .flatten()
    }));
    for (p, drops) in groups {
        let total: u64 = drops.iter().map(|d| d.packets).sum();
        let rate: f64 = drops.iter().map(|d| d.rate).sum();
        let mut devs: Vec<&str> = drops.iter().map(|d| d.ifname.as_str()).collect();
        devs.sort_unstable();
        devs.dedup();
        b.push(
            &p,
            kind::TUN_RING_FULL,
            drop_severity(rate),
            None,
            format!(
                "TUN device {} queue overflowed: {total} packets dropped before the tunnel read them ({})",
                devs.join(", "),
                if rate > 0.0 {
                    format!("{} now", drop_rate_text(rate, b.inputs.window))
                } else {
                    format!("none in the last {}s", b.inputs.window.as_secs())
                }
            ),
            format!(
                "read the TUN device faster (batching, offloads, a reader thread per queue with \
                 IFF_MULTI_QUEUE) or deepen its queue: ip link set dev {} txqueuelen 5000",
                devs.first().copied().unwrap_or("<tun>")
            ),
            vec![("drops_total", total as f64), ("drops_per_second", rate)],
            "TUN tx queue = txqueuelen packets (drivers/net/tun.c tun_net_xmit, reason FULL_RING)",
        );
    }
}

pub(super) fn tcp_locks(b: &mut Builder<'_>) {
    for (p, s) in &b.inputs.tcp.clone() {
        if s.shrunk > 0 {
            let (actual, expected) = s.example.unwrap_or((0, 0));
            let ratio = (1u64 << expected.min(14)) as f64 / (1u64 << actual.min(14)) as f64;
            b.push(
                p,
                kind::TCP_WSCALE_SHRUNK,
                Severity::Critical,
                None,
                format!(
                    "{} of {} TCP connections born with window scale {actual} instead of {expected}: \
                     the receive buffer was set before connect()/listen(); their window is capped at {} \
                     for life ({ratio:.0}x smaller)",
                    s.shrunk,
                    s.established,
                    kib((65535u64 << actual.min(14)) as f64)
                ),
                "remove setsockopt(SO_RCVBUF) before connect()/listen() on Linux (setting it later \
                 cannot raise the scale); let autotuning size the buffer"
                    .to_string(),
                vec![
                    ("connections_shrunk", s.shrunk as f64),
                    ("connections", s.established as f64),
                    ("wscale", actual as f64),
                    ("wscale_expected", expected as f64),
                    ("max_window_bytes", (65535u64 << actual.min(14)) as f64),
                ],
                Rule::TcpAutotune.citation(),
            );
        }
        // Locks set by a call of the process have their own per-socket findings; those
        // inherited by accepted connections from a locked listener are told here.
        let own = b
            .inputs
            .stories
            .iter()
            .filter(|x| {
                x.owner == *p
                    && x.proto == Proto::Tcp
                    && x.calls()
                        .any(|c| c.ret == 0 && c.locks_before & 2 == 0 && c.locks_after & 2 != 0)
            })
            .count() as u64;
        let inherited = s.locks.saturating_sub(own);
        if inherited > 0 {
            b.push(
                p,
                kind::TCP_RCVBUF_LOCK,
                Severity::Warning,
                None,
                format!(
                    "{inherited} TCP socket(s) with SOCK_RCVBUF_LOCK they did not set themselves \
                     (accepted from a locked listener, which they inherit it from): receive \
                     autotuning is off for them"
                ),
                "remove setsockopt(SO_RCVBUF) on the listening socket (its accepted connections \
                 inherit the lock, and the listener's buffer sizes their window scale); \
                 autotuning grows the buffer up to net.ipv4.tcp_rmem[2]"
                    .to_string(),
                vec![
                    ("sockets_locked", inherited as f64),
                    ("tcp_rmem_max_bytes", b.inputs.tcp_rmem_max as f64),
                ],
                Rule::TcpAutotune.citation(),
            );
        }
    }
}

/// How much a locked TCP receive buffer costs now, from what `tcp_rcvbuf_grow` measured.
struct LockCost {
    /// The ceiling the locked window sets at the measured RTT (≈ rcvbuf/2 per RTT), bit/s.
    cap_bps: f64,
    /// What the reader consumed over the last measured interval, bit/s (0: idle).
    observed_bps: f64,
    /// The window the observed rate needs at this RTT (bytes).
    bdp_bytes: u64,
    severity: Severity,
}

fn lock_cost(t: &TuneView) -> LockCost {
    let rtt = Duration::from_micros(t.rtt_us.max(1) as u64);
    // About half of sk_rcvbuf is advertised as window (tcp_adv_win_scale/scaling_ratio).
    let window = t.rcvbuf.max(0) as f64 / 2.0;
    let cap_bps = window * 8.0 / rtt.as_secs_f64();
    let observed_bps = if t.interval_us > 0 {
        t.copied as f64 * 8.0 / (t.interval_us as f64 / 1e6)
    } else {
        0.0
    };
    let ratio = if cap_bps > 0.0 {
        observed_bps / cap_bps
    } else {
        0.0
    };
    let severity = if observed_bps <= 0.0 || t.rtt_us < SAME_HOST_RTT_US {
        // Idle, or the same host: nothing is limited by the buffer now.
        Severity::Info
    } else if (0.8..=1.25).contains(&ratio) {
        // Running at the ceiling the lock sets: it costs throughput now. (Far above it the
        // window/RTT model does not bind: the buffer is not what limits.)
        Severity::Critical
    } else {
        Severity::Warning
    };
    LockCost {
        cap_bps,
        observed_bps,
        bdp_bytes: policy::bdp_bytes(observed_bps as u64, rtt),
        severity,
    }
}

/// What a suppressed-autotuning finding says: what the lock costs now, at the measured RTT.
fn lock_summary(t: &TuneView, c: &LockCost, total: u64, tcp_rmem_max: i64) -> String {
    let buf = kib(t.rcvbuf as f64);
    let grow = if tcp_rmem_max > t.rcvbuf as i64 && t.rcvbuf > 0 {
        format!(
            "autotuning could grow it to {} ({:.0}x)",
            kib(tcp_rmem_max as f64),
            tcp_rmem_max as f64 / t.rcvbuf as f64
        )
    } else {
        format!(
            "autotuning could grow it up to {}",
            kib(tcp_rmem_max as f64)
        )
    };
    let wan_cap = t.rcvbuf.max(0) as f64 / 2.0 * 8.0 / WAN_RTT.as_secs_f64();
    match c.severity {
        Severity::Critical => format!(
            "costs throughput now: the connection runs at the ~{} its locked {buf} receive buffer allows at the measured RTT of {} (observed {}); the kernel wanted to grow the buffer {total} time(s); {grow}",
            mbit(c.cap_bps),
            rtt_text(t.rtt_us),
            mbit(c.observed_bps),
        ),
        Severity::Warning => format!(
            "not at its ceiling now: a locked {buf} TCP receive buffer allows ~{} at the measured RTT of {} (observed {}); it limits the connection once traffic grows; the kernel wanted to grow it {total} time(s); {grow}",
            mbit(c.cap_bps),
            rtt_text(t.rtt_us),
            mbit(c.observed_bps),
        ),
        Severity::Info if c.observed_bps <= 0.0 => format!(
            "costs nothing now (idle): a locked {buf} TCP receive buffer, which the kernel wanted to grow {total} time(s); on a {} ms path it would cap a connection at ~{}",
            WAN_RTT.as_millis(),
            mbit(wan_cap)
        ),
        Severity::Info => format!(
            "costs nothing at this RTT ({}, the same host): a locked {buf} TCP receive buffer is not what limits this connection (observed {}); on a {} ms path it would cap it at ~{}; the kernel wanted to grow it {total} time(s)",
            rtt_text(t.rtt_us),
            mbit(c.observed_bps),
            WAN_RTT.as_millis(),
            mbit(wan_cap)
        ),
    }
}

pub(super) fn autotune(b: &mut Builder<'_>) {
    let groups = by_owner(
        b.inputs
            .tunes
            .iter()
            .filter(|t| t.suppressed > 0)
            .filter_map(|t| t.owner.map(|o| (o, t))),
    );
    for (p, socks) in groups {
        let total: u64 = socks.iter().map(|t| t.suppressed).sum();
        // The socket whose lock costs most now (then the most suppressed).
        let Some((t, c)) = socks
            .iter()
            .map(|t| (*t, lock_cost(t)))
            .min_by(|(a, x), (b, y)| {
                x.severity
                    .cmp(&y.severity)
                    .then(y.observed_bps.total_cmp(&x.observed_bps))
                    .then(b.suppressed.cmp(&a.suppressed))
            })
        else {
            continue;
        };
        let summary = lock_summary(t, &c, total, b.inputs.tcp_rmem_max);
        b.push(
            &p,
            kind::AUTOTUNE_SUPPRESSED,
            c.severity,
            Some(SocketRef {
                inode: t.inode,
                proto: "tcp",
                netns: 0,
            }),
            summary,
            format!(
                "remove setsockopt(SO_RCVBUF) so autotuning can follow the bandwidth-delay product \
                 (the observed rate needs a {} window at this RTT; autotuning sizes it)",
                kib(c.bdp_bytes as f64)
            ),
            vec![
                ("suppressed_total", total as f64),
                ("rtt_us", t.rtt_us as f64),
                ("rcvbuf_bytes", t.rcvbuf as f64),
                ("throughput_cap_bps", c.cap_bps),
                ("observed_bps", c.observed_bps),
                ("bdp_bytes", c.bdp_bytes as f64),
            ],
            Rule::TcpAutotune.citation(),
        );
    }
}
