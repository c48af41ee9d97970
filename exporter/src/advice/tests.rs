//! The advice rules against hand-made inputs.
#![allow(clippy::unwrap_used)]
use super::*;
use bufscope_api::Verdict;

fn p(t: u32) -> ProcRef {
    ProcRef {
        tgid: t,
        start_ticks: 1,
    }
}

fn inputs() -> Inputs {
    let mut meta = BTreeMap::new();
    meta.insert(
        p(1),
        ProcMeta {
            comm: "wireguard-go".into(),
            container: String::new(),
            ..ProcMeta::default()
        },
    );
    Inputs {
        meta,
        rmem_max: Some(212_992),
        wmem_max: Some(212_992),
        tcp_rmem_max: 6_291_456,
        window: Duration::from_secs(60),
        ..Inputs::default()
    }
}

/// A call as the setsockopt room records it.
fn rec(option: BufOption, requested: i32, effective: i32, ret: i32, clamped: bool) -> CallRec {
    CallRec {
        at: 1_796_000_000,
        option,
        requested,
        applied: requested,
        effective,
        ret,
        clamped,
        locks_before: 0,
        locks_after: 0,
        state: 0,
        flags: 0,
    }
}

fn story(pid: u32, inode: u64, proto: Proto, calls: &[CallRec]) -> SocketStory {
    let mut s = SocketStory::new(p(pid), inode, proto, 4_026_532_000);
    s.rcvbuf = 212_992;
    s.sndbuf = 212_992;
    for c in calls {
        s.push(*c);
    }
    s
}

fn dropping(pid: u32, inode: u64, packets: u64, rate: f64, rcvbuf: i32) -> SocketDrops {
    SocketDrops {
        owner: Some(p(pid)),
        inode,
        netns: 0,
        proto: Proto::Udp,
        reason: "SOCKET_RCVBUFF".into(),
        packets,
        rate,
        rcvbuf,
        ifname: String::new(),
    }
}

/// wireguard-go without CAP_NET_ADMIN in a pod: SO_RCVBUFFORCE refused, then SO_RCVBUF
/// clamped, and the socket drops. One finding, one story, a verdict with numbers, and where
/// each fix can be made on this kernel.
#[test]
fn force_refused_then_clamped_fallback_is_one_costing_story() {
    let mut i = inputs();
    i.stories.push(std::sync::Arc::new(story(
        1,
        77,
        Proto::Udp,
        &[
            rec(
                BufOption::RcvbufForce,
                7 << 20,
                212_992,
                -libc::EPERM,
                false,
            ),
            rec(BufOption::Rcvbuf, 7 << 20, 425_984, 0, true),
        ],
    )));
    i.ns_limits.insert(
        4_026_532_000,
        NsLimits {
            scope: LimitScope::ReadOnly,
            rmem_max: Some(212_992),
            wmem_max: Some(212_992),
            user_ns: false,
            unreadable: None,
        },
    );
    i.drops.push(dropping(1, 77, 5000, 120.0, 425_984));
    let f = evaluate(&i);
    let mine: Vec<&Finding> = f
        .iter()
        .filter(|f| f.socket.as_ref().is_some_and(|s| s.inode == 77))
        .collect();
    assert_eq!(
        mine.len(),
        1,
        "one finding for the socket's receive buffer: {f:#?}"
    );
    let d = mine[0];
    assert_eq!(
        (d.kind, d.severity, d.verdict),
        (
            kind::UDP_RCVBUF_DROPS,
            Severity::Critical,
            Some(Verdict::Costing)
        )
    );
    let st = d.story.as_ref().unwrap();
    assert_eq!(st.calls.len(), 2);
    assert_eq!(st.calls[0].notes, vec!["force", "refused"]);
    assert_eq!(st.calls[1].notes, vec!["fallback", "clamped"]);
    assert_eq!(st.final_bytes, 425_984);
    let limit = st.limit.as_ref().unwrap();
    assert_eq!(
        (limit.sysctl, limit.bytes, limit.scope),
        ("net.core.rmem_max", Some(212_992), "read_only")
    );
    assert!(d.summary.contains("dropping 120/s"), "{}", d.summary);
    assert_eq!(d.evidence["drops_per_second"], 120.0);
    assert_eq!(d.process.comm, "wireguard-go");
    let scopes: Vec<(&str, bool)> = d.fixes.iter().map(|x| (x.scope, x.possible)).collect();
    assert_eq!(
        scopes,
        vec![("application", false), ("pod", true), ("host", true)],
        "wireguard-go has no setting; the pod can add CAP_NET_ADMIN (it tries FORCE); the host can raise rmem_max: {:#?}",
        d.fixes
    );
    assert!(
        d.fixes[1].how.contains("rmem_max is read-only"),
        "{}",
        d.fixes[1].how
    );
    assert_eq!(
        d.fixes[2].memory_bytes,
        Some(2 * (7 << 20)),
        "one socket x 2 x 7 MiB"
    );
    assert!(
        d.fixes[2]
            .how
            .contains("sysctl -w net.core.rmem_max=7340032"),
        "{}",
        d.fixes[2].how
    );
}

/// quic-go on 6.18's defaults: 7 MiB asked, clamped to rmem_max 4 MiB, read back as 8 MiB
/// (quic-go is satisfied and silent). One finding per socket; costing only where the socket
/// drops.
#[test]
fn quic_go_on_6_18_is_costing_only_where_it_drops() {
    let mut i = inputs();
    i.rmem_max = Some(4_194_304);
    i.meta.get_mut(&p(1)).unwrap().comm = "caddy".into();
    for inode in [10, 11] {
        i.stories.push(std::sync::Arc::new(story(
            1,
            inode,
            Proto::Udp,
            &[rec(BufOption::Rcvbuf, 7 << 20, 8_388_608, 0, true)],
        )));
    }
    i.drops.push(dropping(1, 11, 3000, 50.0, 8_388_608));
    let f = evaluate(&i);
    let by_inode = |n: u64| {
        f.iter()
            .find(|f| f.socket.as_ref().is_some_and(|s| s.inode == n))
            .unwrap()
    };
    let quiet = by_inode(10);
    assert_eq!(
        (quiet.kind, quiet.verdict, quiet.severity),
        (kind::RCVBUF_CLAMPED, Some(Verdict::Benign), Severity::Info)
    );
    assert!(quiet.summary.contains("no drops"), "{}", quiet.summary);
    let hot = by_inode(11);
    assert_eq!(
        (hot.kind, hot.verdict, hot.severity),
        (
            kind::UDP_RCVBUF_DROPS,
            Some(Verdict::Costing),
            Severity::Critical
        )
    );
    assert!(
        hot.fixes[0].how.contains("Caddy (quic-go) has no setting"),
        "{}",
        hot.fixes[0].how
    );
    assert_eq!(f.iter().filter(|f| f.process.pid == 1).count(), 2, "{f:#?}");
}

/// Debian 12's Caddy 2.6 (an older quic-go) on 6.18: one SO_RCVBUF of 2 MiB, granted in full
/// (4 MiB read back), and the socket drops under load. Neither a higher rmem_max nor
/// CAP_NET_ADMIN gives it more (it asked for no more, and this quic-go tries FORCE only when
/// the readback is short): the fixes say so and name the guard's floor.
#[test]
fn a_request_granted_in_full_is_not_fixed_by_the_ceiling_or_the_capability() {
    let mut i = inputs();
    i.rmem_max = Some(4_194_304);
    i.meta.get_mut(&p(1)).unwrap().comm = "caddy".into();
    let mut st = story(
        1,
        12,
        Proto::Udp,
        &[rec(BufOption::Rcvbuf, 2 << 20, 4 << 20, 0, false)],
    );
    st.rcvbuf = 4 << 20;
    i.stories.push(std::sync::Arc::new(st));
    i.ns_limits.insert(
        4_026_532_000,
        NsLimits {
            scope: LimitScope::ReadOnly,
            rmem_max: Some(4_194_304),
            wmem_max: Some(4_194_304),
            user_ns: false,
            unreadable: None,
        },
    );
    i.drops.push(dropping(1, 12, 6000, 40.0, 4 << 20));
    let f = evaluate(&i);
    let d = f
        .iter()
        .find(|f| f.socket.as_ref().is_some_and(|s| s.inode == 12))
        .unwrap();
    assert_eq!(
        (d.kind, d.verdict),
        (kind::UDP_RCVBUF_DROPS, Some(Verdict::Costing))
    );
    let scopes: Vec<(&str, bool)> = d.fixes.iter().map(|x| (x.scope, x.possible)).collect();
    assert_eq!(
        scopes,
        vec![("application", false), ("pod", false), ("host", true)],
        "{:#?}",
        d.fixes
    );
    assert!(
        d.fixes[1].how.contains("got it in full"),
        "{}",
        d.fixes[1].how
    );
    let host = &d.fixes[2].how;
    assert!(
        host.starts_with("its request (2.0 MiB) was granted in full") && host.contains("udp-floor"),
        "{host}"
    );
    assert!(
        d.fixes[0].how.contains("2 MiB"),
        "the note names the older quic-go's request: {}",
        d.fixes[0].how
    );
}

/// strongSwan's charon: its key (kernel-netlink's receive_buffer_size) sizes its XFRM netlink
/// socket, not the IKE UDP sockets it never sizes: a drop on UDP 500 is not fixed by that key.
#[test]
fn a_key_for_another_kind_of_socket_is_not_the_application_fix() {
    let mut i = inputs();
    i.meta.get_mut(&p(1)).unwrap().comm = "charon".into();
    i.drops.push(dropping(1, 13, 400, 30.0, 212_992));
    let f = evaluate(&i);
    let d = f
        .iter()
        .find(|f| f.socket.as_ref().is_some_and(|s| s.inode == 13))
        .unwrap();
    assert_eq!(d.fixes[0].scope, "application");
    assert!(!d.fixes[0].possible, "{:#?}", d.fixes);
    assert_eq!(d.fixes[0].config_key, None);
    assert!(
        d.fixes[0]
            .how
            .starts_with("strongSwan charon has no setting for it"),
        "{}",
        d.fixes[0].how
    );
}

/// A socket that dropped before the window and not in it costs nothing now.
#[test]
fn past_drops_on_a_default_buffer_are_benign() {
    let mut i = inputs();
    i.drops.push(dropping(1, 5, 10, 0.0, 212_992));
    let f = evaluate(&i);
    assert_eq!(
        (f[0].severity, f[0].verdict),
        (Severity::Info, Some(Verdict::Benign))
    );
    assert!(
        f[0].summary.contains("never sized by the program"),
        "{}",
        f[0].summary
    );
    assert!(
        f[0].summary
            .contains("no drops in the last 60s (10 before)"),
        "{}",
        f[0].summary
    );
    let host = f[0].fixes.iter().find(|x| x.scope == "host").unwrap();
    assert!(host.how.contains("never asks for a size"), "{}", host.how);
    assert!(f[0].rule.contains("wireguard-go"));
}

/// A socket that drops but was never sized (charon's IKE socket in a namespace): its finding
/// carries the namespace the drops were counted in, and the limit as that namespace reads it.
#[test]
fn a_never_sized_dropping_socket_keeps_its_namespace() {
    let mut i = inputs();
    let mut d = dropping(1, 6, 900, 15.0, 212_992);
    d.netns = 4_026_532_111;
    i.drops.push(d);
    i.ns_limits.insert(
        4_026_532_111,
        NsLimits {
            scope: LimitScope::ReadOnly,
            rmem_max: Some(4_194_304),
            wmem_max: Some(4_194_304),
            user_ns: false,
            unreadable: None,
        },
    );
    let f = evaluate(&i);
    let x = f
        .iter()
        .find(|f| f.socket.as_ref().is_some_and(|s| s.inode == 6))
        .unwrap();
    assert_eq!(x.socket.as_ref().unwrap().netns, 4_026_532_111);
    let limit = x.story.as_ref().unwrap().limit.as_ref().unwrap();
    assert_eq!((limit.scope, limit.bytes), ("read_only", Some(4_194_304)));
}

/// A request below the kernel's floor is granted more than asked.
#[test]
fn a_request_below_the_minimum_is_described_as_granted_more() {
    let mut i = inputs();
    i.stories.push(std::sync::Arc::new(story(
        1,
        9,
        Proto::Udp,
        &[rec(BufOption::Rcvbuf, 1000, 2304, 0, false)],
    )));
    std::sync::Arc::make_mut(&mut i.stories[0]).rcvbuf = 2304;
    i.drops.push(dropping(1, 9, 500, 20.0, 2304));
    let f = evaluate(&i);
    assert!(
        f[0].summary.contains("granted more than asked"),
        "{}",
        f[0].summary
    );
    assert_eq!(
        f[0].story.as_ref().unwrap().calls[0].notes,
        vec!["above_minimum"]
    );
}

fn sample(at: Instant, acked: u64, limited_us: u64) -> TcpSample {
    TcpSample {
        at,
        diag: crate::kernel::sock_diag::TcpDiag {
            state: 1,
            wscale_ok: true,
            rcv_wscale: 10,
            snd_wscale: 10,
            rtt_us: 190_000,
            bytes_acked: acked,
            sndbuf_limited_us: limited_us,
            sndbuf: 192_000,
            ..Default::default()
        },
    }
}

/// The VPN worker that sets 96,000 bytes on its accepted TLS socket: send buffer pinned at
/// 192,000 bytes, about 8 Mbit/s at 190 ms; the kernel says the send buffer limited it.
#[test]
fn a_send_lock_at_190ms_costs_about_8_mbit() {
    let mut i = inputs();
    i.meta.get_mut(&p(1)).unwrap().comm = "openvpn".into();
    let mut c = rec(BufOption::Sndbuf, 96_000, 192_000, 0, false);
    c.state = 1;
    c.locks_after = bufscope_common::SOCK_SNDBUF_LOCK;
    let mut s = story(1, 40, Proto::Tcp, &[c]);
    let t0 = Instant::now();
    s.sample(sample(t0, 0, 0));
    // 5 s at 1.0 MB/s (8 Mbit/s), 4.5 s of it limited by the send buffer.
    s.sample(sample(t0 + Duration::from_secs(5), 5_000_000, 4_500_000));
    i.stories.push(std::sync::Arc::new(s));
    i.tcp_wmem_max = 4_194_304;
    let f = evaluate(&i);
    let x = f.iter().find(|f| f.kind == kind::TCP_SNDBUF_LOCK).unwrap();
    assert_eq!(
        (x.severity, x.verdict),
        (Severity::Critical, Some(Verdict::Costing))
    );
    let cap = x.evidence["throughput_ceiling_bps"];
    assert!((cap - 192_000.0 * 8.0 / 0.19).abs() < 1.0, "{cap}");
    assert!((x.evidence["sndbuf_limited_ratio"] - 0.9).abs() < 1e-9);
    assert!(
        x.summary
            .contains("~8.1 Mbit/s at the measured RTT of 190.0 ms"),
        "{}",
        x.summary
    );
    assert!(
        x.summary.contains("on the established connection"),
        "{}",
        x.summary
    );
    assert_eq!(
        x.fixes[0].config_key.as_deref(),
        Some("sndbuf"),
        "OpenVPN's own key"
    );
    assert!(
        x.fixes[0].how.contains("does not change the window scale"),
        "{}",
        x.fixes[0].how
    );
    assert!(!x.fixes[1].possible, "the pod cannot undo a socket's lock");
    // The same lock on an idle connection costs nothing now.
    let mut i2 = inputs();
    let mut s2 = story(1, 41, Proto::Tcp, &[c]);
    s2.sample(sample(t0, 0, 0));
    s2.sample(sample(t0 + Duration::from_secs(5), 0, 0));
    i2.stories.push(std::sync::Arc::new(s2));
    let f2 = evaluate(&i2);
    assert_eq!(f2[0].verdict, Some(Verdict::Benign));
}

/// The kernel charges every queued skb's truesize against the send buffer: with a queue that
/// is 61% payload (MSS-sized skbs), a locked 192,000-byte buffer keeps ~117 KB in flight, and
/// the ceiling is that over the RTT. The share comes from the kernel's own counters
/// (`wmem_queued` against the bytes in flight plus not sent), not from a constant.
#[test]
fn a_send_ceiling_counts_only_the_payload_the_kernel_queues() {
    let mut i = inputs();
    let mut c = rec(BufOption::Sndbuf, 96_000, 192_000, 0, false);
    c.state = 1;
    c.locks_after = bufscope_common::SOCK_SNDBUF_LOCK;
    let mut s = story(1, 40, Proto::Tcp, &[c]);
    let t0 = Instant::now();
    let mut a = sample(t0, 1, 0);
    a.diag.rtt_us = 100_000;
    // A queue that held less than half the buffer is not read.
    a.diag.wmem_queued = 40_000;
    a.diag.bytes_sent = 20_000;
    assert_eq!(super::sockets::payload_fraction(&a.diag), None);
    // No time counted limited by the send buffer: the verdict rests on the rate alone.
    let mut b = sample(t0 + Duration::from_secs(5), 4_900_001, 0);
    b.diag.rtt_us = 100_000;
    // 101,000 in flight (one of them retransmitted) plus 16,000 not sent, in a queue of 192,000.
    b.diag.wmem_queued = 192_000;
    b.diag.bytes_sent = 4_900_001 + 101_000 + 1_448;
    b.diag.bytes_retrans = 1_448;
    b.diag.notsent_bytes = 16_000;
    s.sample(a);
    s.sample(b);
    i.stories.push(std::sync::Arc::new(s));
    let f = evaluate(&i);
    let x = f.iter().find(|f| f.kind == kind::TCP_SNDBUF_LOCK).unwrap();
    let ratio = 117_000.0 / 192_000.0;
    assert!((x.evidence["sndbuf_payload_ratio"] - ratio).abs() < 1e-9);
    let cap = x.evidence["throughput_ceiling_bps"];
    // 117,000 payload bytes, refilled from 2/3: 97,500 in flight on average per 100 ms.
    assert!((cap - 97_500.0 * 8.0 / 0.1).abs() < 1.0, "{cap}");
    // 4.9 MB in 5 s = 7.84 Mbit/s: at the 7.8 Mbit/s ceiling; against buffer / RTT alone
    // (15.36 Mbit/s) it would be 0.51x, and the "at the ceiling" rule could never fire.
    assert!(x.evidence["observed_bps"] >= 0.8 * cap);
    assert!(x.evidence["observed_bps"] < 0.8 * 192_000.0 * 8.0 / 0.1);
    assert_eq!(x.verdict, Some(Verdict::Costing));
    assert!(x.summary.contains("61% payload"), "{}", x.summary);
    // Without a filled queue in either read the buffer itself is the (upper) bound.
    let mut i2 = inputs();
    let mut s2 = story(1, 41, Proto::Tcp, &[c]);
    s2.sample(sample(t0, 0, 0));
    s2.sample(sample(t0 + Duration::from_secs(5), 0, 0));
    i2.stories.push(std::sync::Arc::new(s2));
    let f2 = evaluate(&i2);
    let y = f2.iter().find(|f| f.kind == kind::TCP_SNDBUF_LOCK).unwrap();
    assert!(!y.evidence.contains_key("sndbuf_payload_ratio"));
    assert!((y.evidence["throughput_ceiling_bps"] - 192_000.0 * 8.0 / 0.19).abs() < 1.0);
}

/// A fix applied while bufscope runs: the socket's buffer is raised and it stops dropping:
/// resolved with the numbers before and after.
#[test]
fn a_larger_buffer_that_stops_the_drops_is_resolved() {
    let mut h = History::default();
    let mut i = inputs();
    i.stories.push(std::sync::Arc::new(story(
        1,
        77,
        Proto::Udp,
        &[rec(BufOption::Rcvbuf, 7 << 20, 425_984, 0, true)],
    )));
    i.drops.push(dropping(1, 77, 6000, 100.0, 425_984));
    let t = 1_796_000_000;
    let f = evaluate_with(&i, &mut h, t);
    assert_eq!(f[0].verdict, Some(Verdict::Costing));
    assert_eq!(f[0].since, t);
    // rmem_max raised and the program set its buffer again: 14 MiB; no drop since.
    std::sync::Arc::make_mut(&mut i.stories[0]).push(rec(
        BufOption::Rcvbuf,
        7 << 20,
        14_680_064,
        0,
        false,
    ));
    i.drops[0].packets = 6100;
    let f = evaluate_with(&i, &mut h, t + 2);
    assert_ne!(
        f[0].verdict,
        Some(Verdict::Resolved),
        "too early to call it a fix"
    );
    assert!(
        f[0].summary.contains("the buffer changed 0s ago"),
        "{}",
        f[0].summary
    );
    // 15 s later, still 6100: none since the change.
    i.drops[0].rate = 20.0;
    let f = evaluate_with(&i, &mut h, t + 17);
    let x = &f[0];
    assert_eq!(
        (x.verdict, x.severity),
        (Some(Verdict::Resolved), Severity::Info),
        "{x:#?}"
    );
    let r = x.resolved.as_ref().unwrap();
    assert_eq!((r.before.bytes, r.after.bytes), (425_984, 14_680_064));
    assert_eq!(r.before.drops_per_second, 100.0);
    assert_eq!(r.after.drops_per_second, 0.0);
    assert_eq!(r.change, "resized");
    assert!(x.summary.starts_with("resolved:"), "{}", x.summary);
    assert_eq!(x.since, t, "first seen when it began");
}

/// Drops that stop without any change are not a fix: benign, not resolved.
#[test]
fn drops_that_just_stop_are_not_resolved() {
    let mut h = History::default();
    let mut i = inputs();
    i.drops.push(dropping(1, 77, 6000, 100.0, 212_992));
    let t = 1_796_000_000;
    evaluate_with(&i, &mut h, t);
    i.drops[0].rate = 0.0;
    let f = evaluate_with(&i, &mut h, t + 120);
    assert_eq!(f[0].verdict, Some(Verdict::Benign));
    assert_eq!(f[0].changed_at, t + 120, "its verdict changed then");
}

/// The program restarted with a larger buffer: its old socket is gone, the new one does not
/// cost: resolved (restarted) with the new socket's numbers; then kept for the retention.
#[test]
fn a_restart_with_a_larger_buffer_is_resolved() {
    let mut h = History::new(Duration::from_secs(600));
    let mut i = inputs();
    i.stories.push(std::sync::Arc::new(story(
        1,
        77,
        Proto::Udp,
        &[rec(BufOption::Rcvbuf, 7 << 20, 425_984, 0, true)],
    )));
    i.drops.push(dropping(1, 77, 6000, 100.0, 425_984));
    let t = 1_796_000_000;
    evaluate_with(&i, &mut h, t);
    // The process exits; a new one of the same program sets 7 MiB and gets it.
    i.meta.insert(p(2), i.meta[&p(1)].clone());
    i.meta.remove(&p(1));
    i.drops.clear();
    let mut s = story(
        2,
        88,
        Proto::Udp,
        &[rec(BufOption::Rcvbuf, 7 << 20, 14_680_064, 0, false)],
    );
    s.rcvbuf = 14_680_064;
    i.stories = vec![std::sync::Arc::new(s)];
    let f = evaluate_with(&i, &mut h, t + 30);
    let x = f
        .iter()
        .find(|f| f.verdict == Some(Verdict::Resolved))
        .unwrap();
    let r = x.resolved.as_ref().unwrap();
    assert_eq!(r.change, "restarted");
    assert_eq!(
        (r.before.pid, r.before.inode, r.before.bytes),
        (1, 77, 425_984)
    );
    assert_eq!(
        (r.after.pid, r.after.inode, r.after.bytes),
        (2, 88, 14_680_064)
    );
    assert_eq!(r.after.drops_per_second, 0.0);
    // Still shown a while later, gone after the retention.
    let f = evaluate_with(&i, &mut h, t + 300);
    assert!(f.iter().any(|f| f.verdict == Some(Verdict::Resolved)));
    let f = evaluate_with(&i, &mut h, t + 30 + 601);
    assert!(!f.iter().any(|f| f.verdict == Some(Verdict::Resolved)));
}

/// A costing socket whose program exits with no successor is not dropped silently: it is
/// shown as `gone` with its last numbers (not counted in `bufscope_finding`'s terms: info),
/// then goes after the retention.
#[test]
fn a_costing_socket_that_goes_away_is_kept_as_gone() {
    let mut h = History::new(Duration::from_secs(600));
    let mut i = inputs();
    i.drops.push(dropping(1, 77, 6000, 100.0, 212_992));
    let t = 1_796_000_000;
    let f = evaluate_with(&i, &mut h, t);
    assert_eq!(f[0].verdict, Some(Verdict::Costing));
    assert!(h.waiting().is_empty(), "still there");
    // The process exits: its socket and its drops go; nothing replaces it.
    i.meta.clear();
    i.drops.clear();
    let f = evaluate_with(&i, &mut h, t + 10);
    assert_eq!(f.len(), 1, "{f:?}");
    let g = &f[0];
    assert_eq!(
        (g.verdict, g.severity, g.kind),
        (Some(Verdict::Gone), Severity::Info, kind::UDP_RCVBUF_DROPS)
    );
    assert_eq!(g.socket.as_ref().map(|s| s.inode), Some(77));
    assert!(
        g.summary.starts_with("gone: ") && g.summary.contains("100.0 drops/s"),
        "{}",
        g.summary
    );
    assert_eq!(g.changed_at, t + 10);
    assert_eq!(h.waiting().len(), 1, "its program is looked for");
    // Still gone later (unchanged), then forgotten after the retention.
    let f = evaluate_with(&i, &mut h, t + 300);
    assert_eq!((f.len(), f[0].changed_at), (1, t + 10));
    let f = evaluate_with(&i, &mut h, t + 10 + 601);
    assert!(f.is_empty(), "{f:?}");
    assert!(h.waiting().is_empty());
}

/// A program that never sizes its buffer drops; it is fixed with net.core.rmem_default and a
/// restart. Its new socket has no calls and no drops, so no room knows it: the collector's
/// live sockets of the waiting program show it, and the finding turns resolved (restarted)
/// with the new size.
#[test]
fn a_never_sized_socket_fixed_by_rmem_default_and_a_restart_is_resolved() {
    let mut h = History::new(Duration::from_secs(600));
    let mut i = inputs();
    i.drops.push(dropping(1, 77, 6000, 100.0, 212_992));
    let t = 1_796_000_000;
    evaluate_with(&i, &mut h, t);
    // Exit: gone while the program is away.
    let meta = i.meta[&p(1)].clone();
    i.meta.clear();
    i.drops.clear();
    let f = evaluate_with(&i, &mut h, t + 5);
    assert_eq!(f[0].verdict, Some(Verdict::Gone));
    // The program is back (a new pid) with the default raised: one live socket, 8 MiB.
    i.meta.insert(p(2), meta);
    i.live.push(LiveSocket {
        owner: p(2),
        inode: 99,
        proto: Proto::Udp,
        rcvbuf: 8_388_608,
        sndbuf: 212_992,
        drops: 0,
    });
    let f = evaluate_with(&i, &mut h, t + 10);
    let x = f
        .iter()
        .find(|f| f.verdict == Some(Verdict::Resolved))
        .unwrap_or_else(|| panic!("{f:?}"));
    let r = x.resolved.as_ref().unwrap();
    assert_eq!(r.change, "restarted");
    assert_eq!(
        (
            r.before.pid,
            r.before.inode,
            r.before.bytes,
            r.before.drops_per_second
        ),
        (1, 77, 212_992, 100.0)
    );
    assert_eq!(
        (
            r.after.pid,
            r.after.inode,
            r.after.bytes,
            r.after.drops_per_second
        ),
        (2, 99, 8_388_608, 0.0)
    );
    assert!(
        x.summary.starts_with("resolved: ") && !x.summary.contains("gone:"),
        "the socket's story, not its absence: {}",
        x.summary
    );
    assert_eq!(f.len(), 1, "only the resolved one: {f:?}");
    assert!(h.waiting().is_empty(), "nothing to look for any more");
}

/// Many processes of one program that cost at once (a pool of short-lived workers) and all
/// exit: their gone findings are bounded per program, the newest kept. (A program whose next
/// socket costs too replaces the gone finding instead: that socket's own finding says so.)
#[test]
fn gone_findings_are_bounded_per_program() {
    let mut h = History::new(Duration::from_secs(600));
    let mut i = inputs();
    let meta = i.meta[&p(1)].clone();
    let t = 1_796_000_000;
    i.meta.clear();
    for n in 0..40u32 {
        i.meta.insert(p(100 + n), meta.clone());
        i.drops
            .push(dropping(100 + n, 1000 + u64::from(n), 10, 5.0, 212_992));
    }
    let f = evaluate_with(&i, &mut h, t);
    assert_eq!(
        f.iter()
            .filter(|f| f.verdict == Some(Verdict::Costing))
            .count(),
        40,
        "one per process"
    );
    i.meta.clear();
    i.drops.clear();
    let f = evaluate_with(&i, &mut h, t + 10);
    assert_eq!(f.len(), history::MAX_SHOWN_PER_PROGRAM, "{f:?}");
    assert!(f.iter().all(|f| f.verdict == Some(Verdict::Gone)));
    // What is remembered is what is shown: not the 40 sockets for the whole retention.
    assert_eq!(h.remembered(), history::MAX_SHOWN_PER_PROGRAM);
    let f = evaluate_with(&i, &mut h, t + 20);
    assert_eq!(f.len(), history::MAX_SHOWN_PER_PROGRAM, "{f:?}");
}

/// Many sockets of one process with the same finding: the costliest listed, the rest counted.
#[test]
fn per_socket_findings_are_bounded_per_process_and_kind() {
    let mut i = inputs();
    for n in 0..40u64 {
        i.drops
            .push(dropping(1, 1000 + n, 100, n as f64 + 1.0, 212_992));
    }
    let f = evaluate(&i);
    assert_eq!(f.len(), MAX_PER_KIND);
    assert_eq!(f[0].evidence["sockets"], 40.0);
    assert_eq!(
        f[0].evidence["drops_per_second"], 40.0,
        "the costliest first"
    );
    assert!(f[0].summary.contains("24 more sockets"), "{}", f[0].summary);
}

#[test]
fn shrunk_connections_are_critical() {
    let mut i = inputs();
    i.tcp.push((
        p(1),
        TcpShape {
            established: 4,
            shrunk: 3,
            example: Some((1, 10)),
            locks: 3,
        },
    ));
    let f = evaluate(&i);
    assert_eq!(f[0].kind, kind::TCP_WSCALE_SHRUNK);
    assert!(
        f[0].summary.contains("window scale 1 instead of 10"),
        "{}",
        f[0].summary
    );
    assert!(f.iter().any(|f| f.kind == kind::TCP_RCVBUF_LOCK));
}

#[test]
fn autotune_reports_cap_at_rtt() {
    let mut i = inputs();
    i.tunes.push(TuneView {
        owner: Some(p(1)),
        inode: 9,
        suppressed: 12,
        rtt_us: 190_000,
        rcvbuf: 131_072,
        copied: 65536,
        interval_us: 190_000,
    });
    let f = evaluate(&i);
    let a = f
        .iter()
        .find(|f| f.kind == kind::AUTOTUNE_SUPPRESSED)
        .unwrap();
    // 64 KiB window / 190 ms = 2.76 Mbit/s
    assert!((a.evidence["throughput_cap_bps"] - 2_759_410.5).abs() < 10.0);
    assert!(a.summary.contains("190.0 ms"), "{}", a.summary);
    // 64 KiB read per 190 ms: the connection runs at that ceiling.
    assert_eq!(a.severity, Severity::Critical, "{}", a.summary);
    assert!(
        a.summary.starts_with("costs throughput now"),
        "{}",
        a.summary
    );
    assert!(
        !a.summary.contains("  "),
        "one space between words: {}",
        a.summary
    );
    assert!(
        a.summary.contains("(48x)"),
        "6 MiB / 128 KiB: {}",
        a.summary
    );
}

fn tune(rtt_us: u32, rcvbuf: i32, copied: u64, interval_us: u64) -> TuneView {
    TuneView {
        owner: Some(p(1)),
        inode: 9,
        suppressed: 3,
        rtt_us,
        rcvbuf,
        copied,
        interval_us,
    }
}

fn autotune_finding(t: TuneView) -> Finding {
    let mut i = inputs();
    i.tcp_rmem_max = 33_554_432;
    i.tunes.push(t);
    evaluate(&i)
        .into_iter()
        .find(|f| f.kind == kind::AUTOTUNE_SUPPRESSED)
        .unwrap()
}

#[test]
fn a_lock_at_rtt_zero_costs_nothing_and_prints_no_absurd_figure() {
    // What the status page showed on loopback: 9 µs, 128 KiB, 78.8 Gbit/s observed.
    let f = autotune_finding(tune(9, 131_072, 88_650_000, 9_000));
    assert_eq!(f.severity, Severity::Info, "{}", f.summary);
    assert!(
        f.summary.starts_with("costs nothing at this RTT (9 µs"),
        "{}",
        f.summary
    );
    assert!(!f.summary.contains("0.0 ms"), "{}", f.summary);
    // No throughput figure beyond what the host moved: no "14913 Gbit/s".
    for w in f.summary.split_whitespace() {
        if let Ok(v) = w.parse::<f64>() {
            assert!(v < 1000.0, "absurd figure {v} in {}", f.summary);
        }
    }
    // On a WAN path the same lock would cap it: 64 KiB / 50 ms = 10.5 Mbit/s.
    assert!(f.summary.contains("~10.5 Mbit/s"), "{}", f.summary);
    // RTT 0 (unmeasured) is the same case, not a division by zero.
    let f = autotune_finding(tune(0, 131_072, 1_000_000, 1_000));
    assert_eq!(f.severity, Severity::Info);
    assert!(f.evidence["throughput_cap_bps"].is_finite());
}

#[test]
fn an_idle_locked_socket_costs_nothing_now() {
    let f = autotune_finding(tune(40_000, 131_072, 0, 0));
    assert_eq!(f.severity, Severity::Info);
    assert!(
        f.summary.starts_with("costs nothing now (idle)"),
        "{}",
        f.summary
    );
    assert!(
        !f.summary.contains("  "),
        "one space between words: {}",
        f.summary
    );
    assert_eq!(f.evidence["observed_bps"], 0.0);
}

#[test]
fn a_lock_below_its_ceiling_is_latent() {
    // 40 ms, 128 KiB: the ceiling is 13.1 Mbit/s; 1 Mbit/s is flowing.
    let f = autotune_finding(tune(40_000, 131_072, 5_000, 40_000));
    assert_eq!(f.severity, Severity::Warning, "{}", f.summary);
    assert!(
        f.summary.starts_with("not at its ceiling now"),
        "{}",
        f.summary
    );
    assert!(
        !f.summary.contains("  "),
        "one space between words: {}",
        f.summary
    );
    assert!(f.summary.contains("40.0 ms"), "{}", f.summary);
}

fn udp(pid: u32, packets: u64, rate: f64) -> SocketDrops {
    SocketDrops {
        owner: Some(p(pid)),
        inode: 100 + pid as u64,
        netns: 0,
        proto: Proto::Udp,
        reason: "SOCKET_RCVBUFF".into(),
        packets,
        rate,
        rcvbuf: 212_992,
        ifname: String::new(),
    }
}

#[test]
fn a_single_drop_is_sporadic_not_zero_per_second() {
    let mut i = inputs();
    i.drops.push(udp(1, 1, 1.0 / 60.0));
    let f = evaluate(&i);
    assert_eq!(f[0].severity, Severity::Warning, "{}", f[0].summary);
    assert!(
        f[0].summary
            .contains("dropped 1 in the last 60s (sporadic; 1 in total)"),
        "{}",
        f[0].summary
    );
    assert!(!f[0].summary.contains("0/s"), "{}", f[0].summary);
}

#[test]
fn findings_rank_by_what_they_cost_now() {
    let mut i = inputs();
    for (pid, comm) in [(1, "slow"), (2, "fast"), (3, "once")] {
        i.meta.insert(
            p(pid),
            ProcMeta {
                comm: comm.into(),
                container: String::new(),
                ..ProcMeta::default()
            },
        );
    }
    i.drops.push(udp(1, 600, 10.0));
    i.drops.push(udp(2, 60_000, 1000.0));
    i.drops.push(udp(3, 1, 1.0 / 60.0));
    i.tunes.push(tune(9, 131_072, 88_650_000, 9_000));
    let f = evaluate(&i);
    let order: Vec<(&str, &str)> = f
        .iter()
        .map(|f| (f.process.comm.as_str(), f.severity.as_str()))
        .collect();
    assert_eq!(
        order,
        vec![
            ("fast", "critical"),
            ("slow", "critical"),
            ("once", "warning"),
            ("slow", "info")
        ],
        "{f:#?}"
    );
    assert!(f[0].summary.contains("dropping 1000/s"), "{}", f[0].summary);
}

/// The socket closed: the setsockopt room forgot its story at its GC and its process left the
/// store, while its drops are still there. Its finding keeps the story and the name it had.
#[test]
fn a_closed_sockets_finding_keeps_its_story_while_its_drops_linger() {
    let mut h = History::new(Duration::from_secs(600));
    let mut i = inputs();
    i.stories.push(std::sync::Arc::new(story(
        1,
        77,
        Proto::Udp,
        &[
            rec(
                BufOption::RcvbufForce,
                7 << 20,
                212_992,
                -libc::EPERM,
                false,
            ),
            rec(BufOption::Rcvbuf, 7 << 20, 425_984, 0, true),
        ],
    )));
    i.drops.push(dropping(1, 77, 5000, 120.0, 425_984));
    let t = 1_796_000_000;
    let first = evaluate_with(&i, &mut h, t);
    let was = first
        .iter()
        .find(|f| f.socket.as_ref().is_some_and(|s| s.inode == 77))
        .unwrap()
        .clone();
    assert!(was.story.is_some());
    i.stories.clear();
    i.meta.clear();
    i.drops = vec![dropping(1, 77, 5000, 80.0, 425_984)];
    let f = evaluate_with(&i, &mut h, t + 5);
    let now = f
        .iter()
        .find(|f| f.socket.as_ref().is_some_and(|s| s.inode == 77))
        .unwrap_or_else(|| panic!("{f:#?}"));
    assert_eq!(now.story, was.story, "the story it had");
    assert_eq!(now.process.comm, "wireguard-go");
    assert_eq!(
        now.evidence["drops_per_second"], 80.0,
        "this evaluation's rate"
    );
}

/// An evaluation keeps per-socket findings as numbers: what `/metrics` reads of them (process,
/// kind, severity, verdict) is what they say when told, in the same order, and telling them
/// twice tells the same.
#[test]
fn findings_kept_as_numbers_tell_what_their_heads_say() {
    let mut h = History::new(Duration::from_secs(600));
    let mut i = inputs();
    for pid in 1..=3 {
        i.meta.insert(p(pid), ProcMeta::default());
        for k in 0..20 {
            let inode = u64::from(pid) * 100 + k;
            i.stories.push(std::sync::Arc::new(story(
                pid,
                inode,
                Proto::Udp,
                &[rec(BufOption::Rcvbuf, 4096, 8192, 0, false)],
            )));
            i.drops
                .push(dropping(pid, inode, 100 + k, k as f64 / 4.0, 8192));
        }
    }
    let t = 1_796_000_000;
    let found = evaluate_findings(&i, &mut h, t);
    let told = found.render();
    assert_eq!(found.len(), 3 * MAX_PER_KIND, "16 of 20 per process");
    let heads: Vec<Head> = found.heads().collect();
    let from_told: Vec<Head> = told
        .iter()
        .map(|f| Head {
            pid: f.process.pid,
            kind: f.kind,
            severity: f.severity,
            verdict: f.verdict,
        })
        .collect();
    assert_eq!(heads, from_told);
    assert_eq!(
        serde_json::to_string(&told).unwrap(),
        serde_json::to_string(&found.render()).unwrap()
    );
    let first = &told[0];
    assert_eq!(first.evidence.get("sockets"), Some(&20.0));
    assert!(
        first.summary.contains("4 more sockets of this process"),
        "{}",
        first.summary
    );
    // The process is one allocation per process, shared by its sockets' findings.
    assert_eq!(told.iter().filter(|f| f.process.pid == 1).count(), 16);
    // A selection tells only what it asks for, in the same order.
    let sel = |q: &str| Selection::parse(q).unwrap();
    let two = found.render_selected(&sel("pid=2&limit=3"));
    let want: Vec<&Finding> = told.iter().filter(|f| f.process.pid == 2).take(3).collect();
    assert_eq!(two.iter().collect::<Vec<_>>(), want);
    let critical = found.render_selected(&sel("severity=critical"));
    let want: Vec<&Finding> = told
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .collect();
    assert_eq!(critical.iter().collect::<Vec<_>>(), want);
    let warning = found.render_selected(&sel("severity=warning"));
    assert!(
        warning.iter().all(|f| f.severity <= Severity::Warning),
        "warning and worse"
    );
    assert_eq!(
        found.render_selected(&sel("severity=info")).len(),
        told.len(),
        "info and worse: all"
    );
    assert!(
        found
            .render_selected(&sel("kind=tcp_rcvbuf_lock"))
            .is_empty()
    );
    assert_eq!(found.render_selected(&sel("")).len(), told.len());
}

#[test]
fn a_findings_query_names_what_is_wrong() {
    assert_eq!(
        Selection::parse("pid=7&kind=udp_rcvbuf_drops&severity=warning&limit=5"),
        Ok(Selection {
            pid: Some(7),
            kind: Some("udp_rcvbuf_drops".into()),
            severity: Some(Severity::Warning),
            limit: Some(5),
        })
    );
    for (q, says) in [
        ("pid=-1", "pid=\"-1\": pid must be a non-negative integer"),
        ("pid=99999999999", "not a process id"),
        ("severity=high", "use critical, warning or info"),
        ("limit=x", "limit must be a non-negative integer"),
        ("sort=rate", "unknown query parameter \"sort\""),
        ("kind=", "name a kind"),
    ] {
        let e = Selection::parse(q).unwrap_err();
        assert!(e.contains(says), "{q}: {e}");
    }
}

/// Time alone changes a history's verdicts only at its deadlines: a changed buffer judged
/// after RESOLVE_AFTER, a program waiting for its costing socket's successor (every
/// evaluation), a resolved finding's retention; none for findings that merely persist.
#[test]
fn the_history_says_when_time_alone_changes_it() {
    let mut h = History::new(Duration::from_secs(600));
    let mut i = inputs();
    i.stories.push(std::sync::Arc::new(story(
        1,
        77,
        Proto::Udp,
        &[rec(BufOption::Rcvbuf, 7 << 20, 425_984, 0, true)],
    )));
    i.drops.push(dropping(1, 77, 6000, 100.0, 425_984));
    let t = 1_796_000_000;
    evaluate_with(&i, &mut h, t);
    assert_eq!(h.next_change(t), None, "costing, nothing pending");
    std::sync::Arc::make_mut(&mut i.stories[0]).push(rec(
        BufOption::Rcvbuf,
        7 << 20,
        14_680_064,
        0,
        false,
    ));
    i.drops[0].rate = 0.0;
    evaluate_with(&i, &mut h, t + 2);
    assert_eq!(
        h.next_change(t + 2),
        Some(t + 2 + history::RESOLVE_AFTER),
        "the change is judged after RESOLVE_AFTER"
    );
    let f = evaluate_with(&i, &mut h, t + 12);
    assert_eq!(f[0].verdict, Some(Verdict::Resolved));
    assert_eq!(
        h.next_change(t + 12),
        Some(t + 12 + 600 + 1),
        "kept for the retention"
    );
    // A costing socket that goes: its program is looked for at each evaluation.
    let mut h = History::new(Duration::from_secs(600));
    let mut i = inputs();
    i.drops.push(dropping(1, 78, 6000, 100.0, 212_992));
    evaluate_with(&i, &mut h, t);
    i.meta.clear();
    i.drops.clear();
    evaluate_with(&i, &mut h, t + 10);
    assert_eq!(h.next_change(t + 10), Some(t + 10));
}

/// Drop rates over the window decay with time alone; counts that stopped moving longer ago
/// than the window do not.
#[test]
fn inputs_with_rates_decay() {
    let mut i = inputs();
    i.drops.push(dropping(1, 77, 6000, 0.0, 212_992));
    assert!(!i.decaying());
    i.drops.push(dropping(1, 78, 6000, 0.5, 212_992));
    assert!(i.decaying());
}
