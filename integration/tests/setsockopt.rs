//! Buffer setsockopt calls: clamped / not clamped / failed, each decided by the kernel's own
//! answer (the call's errno and the getsockopt readback), then compared with bufscope.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bufscope_integration::fixtures::{
    WITHOUT_CAP_NET_ADMIN, rmem_max, setsockopt, setsockopt_wrapped,
};
use bufscope_integration::{Exporter, Workload, eventually};

/// Waits until bufscope shows `calls` calls of `option` for `pid` and returns
/// (calls, clamped, failed).
fn counts(e: &Exporter, pid: u32, proto: &str, option: &str, calls: f64) -> (f64, f64, f64) {
    let p = pid.to_string();
    let l = [("pid", p.as_str()), ("proto", proto), ("option", option)];
    eventually(Duration::from_secs(10), "the setsockopt event", || {
        let m = e.scrape();
        let c = m.sum("bufscope_setsockopt_total", &l);
        (c == calls).then(|| {
            (
                c,
                m.sum("bufscope_setsockopt_clamped_total", &l),
                m.sum("bufscope_setsockopt_failed_total", &l),
            )
        })
    })
}

/// Asserts bufscope counted `w`'s one call of `option` as (calls, clamped, failed) = `want`.
fn assert_counted(e: &Exporter, w: &Workload, proto: &str, option: &str, want: (f64, f64, f64)) {
    assert_eq!(counts(e, w.pid(), proto, option, 1.0), want);
}

/// `bufscope_rcvbuf_locks_total` of `w`'s `proto` sockets.
fn rcvbuf_locks(e: &Exporter, w: &Workload, proto: &str) -> f64 {
    let p = w.pid().to_string();
    e.scrape().sum(
        "bufscope_rcvbuf_locks_total",
        &[("pid", p.as_str()), ("proto", proto)],
    )
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn udp_rcvbuf_above_rmem_max_is_reported_clamped() {
    let e = Exporter::start(&[]);
    let req = (rmem_max() * 2).min(i32::MAX as i64 / 2);
    let w = setsockopt("udp", "SO_RCVBUF", &req.to_string());
    // Kernel: the call succeeded and gave less than 2x the request.
    assert_eq!(w.get("errno"), "0");
    let readback: i64 = w.get("rcvbuf").parse().unwrap();
    assert!(
        readback < 2 * req,
        "kernel readback {readback} shows no clamp"
    );
    assert_counted(&e, &w, "udp", "SO_RCVBUF", (1.0, 1.0, 0.0));
    // The socket got SOCK_RCVBUF_LOCK (kernel: SO_BUF_LOCK readback has bit 2).
    assert_eq!(w.get("locks").parse::<u32>().unwrap() & 2, 2);
    assert_eq!(rcvbuf_locks(&e, &w, "udp"), 1.0);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn rcvbufforce_as_root_is_not_clamped() {
    let e = Exporter::start(&[]);
    let req = rmem_max() * 2;
    let w = setsockopt("udp", "SO_RCVBUFFORCE", &req.to_string());
    assert_eq!(w.get("errno"), "0");
    let readback: i64 = w.get("rcvbuf").parse().unwrap();
    assert_eq!(readback, 2 * req, "FORCE bypasses rmem_max");
    assert_counted(&e, &w, "udp", "SO_RCVBUFFORCE", (1.0, 0.0, 0.0));
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn rcvbufforce_without_cap_net_admin_is_reported_failed() {
    let e = Exporter::start(&[]);
    let w = setsockopt_wrapped(&WITHOUT_CAP_NET_ADMIN, "udp", "SO_RCVBUFFORCE", "8388608");
    assert_eq!(
        w.get("errno"),
        libc::EPERM.to_string(),
        "kernel refused the call"
    );
    assert_counted(&e, &w, "udp", "SO_RCVBUFFORCE", (1.0, 0.0, 1.0));
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn tcp_sndbuf_negative_is_clamped_and_small_rcvbuf_is_not() {
    let e = Exporter::start(&[]);
    // -1 is min_t(u32, -1, wmem_max): the kernel treats it as huge and clamps it.
    let w = setsockopt("tcp", "SO_SNDBUF", "-1");
    assert_eq!(w.get("errno"), "0");
    assert_counted(&e, &w, "tcp", "SO_SNDBUF", (1.0, 1.0, 0.0));
    let w2 = setsockopt("tcp", "SO_RCVBUF", "65536");
    assert_eq!(w2.get("rcvbuf"), "131072", "kernel doubled, no clamp");
    assert_counted(&e, &w2, "tcp", "SO_RCVBUF", (1.0, 0.0, 0.0));
    assert_eq!(rcvbuf_locks(&e, &w2, "tcp"), 1.0);
}

/// The `key=value` fields of bufscope's debug line for `pid`'s call of `option` on `inode`.
fn outcome_line(e: &Exporter, pid: &str, inode: &str, option: &str) -> Vec<(String, String)> {
    eventually(
        Duration::from_secs(10),
        "bufscope's setsockopt outcome line",
        || {
            e.scrape(); // a scrape drains the event ring buffer
            let log = e.log();
            let line = log.lines().find(|l| {
                l.contains("setsockopt outcome")
                    && l.contains(&format!(" pid={pid} "))
                    && l.contains(&format!(" inode={inode} "))
                    && l.contains(&format!("option=\"{option}\""))
            })?;
            Some(
                line.split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
                    .collect(),
            )
        },
    )
}

/// With `cgroup/setsockopt` bufscope sees a call before the kernel handles it and derives the
/// outcome from the kernel's rules. Every case here is decided by the kernel itself (errno and
/// the `getsockopt` readbacks of the same socket right after the call); bufscope's derived
/// return value, sizes and lock bits must equal them.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn derived_outcomes_equal_the_kernel_readback() {
    let e = Exporter::start(&["--log.level", "debug"]);
    let m = e.scrape();
    assert_eq!(
        m.sum(
            "bufscope_probe_attached",
            &[("probe", "setsockopt"), ("hook", "cgroup/setsockopt")]
        ),
        1.0,
        "the setsockopt probe should use cgroup/setsockopt on this kernel"
    );
    let over = (rmem_max() * 2).min(i32::MAX as i64 / 2).to_string();
    let cases: Vec<(&[&str], &str, &str, &str)> = vec![
        (&[], "udp", "SO_RCVBUF", "0"),
        (&[], "udp", "SO_RCVBUF", "65536"),
        (&[], "udp", "SO_RCVBUF", over.as_str()),
        (&[], "udp", "SO_RCVBUF", "-1"),
        (&[], "tcp", "SO_RCVBUF", "1000"),
        (&[], "udp", "SO_SNDBUF", "0"),
        (&[], "tcp", "SO_SNDBUF", "-1"),
        (&[], "tcp", "SO_SNDBUF", "65536"),
        (&[], "udp", "SO_RCVBUFFORCE", "67108864"),
        (&[], "udp", "SO_RCVBUFFORCE", "-1"),
        (&[], "udp", "SO_SNDBUFFORCE", "67108864"),
        (&WITHOUT_CAP_NET_ADMIN, "udp", "SO_RCVBUFFORCE", "8388608"),
        (&WITHOUT_CAP_NET_ADMIN, "tcp", "SO_SNDBUFFORCE", "8388608"),
        // Root of a new user namespace: every capability there, none in the initial one.
        (&["unshare", "-Ur"], "udp", "SO_RCVBUFFORCE", "8388608"),
        (&[], "tcp", "SO_BUF_LOCK", "3"),
        (&[], "udp", "SO_BUF_LOCK", "1"),
        (&[], "tcp", "SO_BUF_LOCK", "4"),
    ];
    for (wrapper, proto, option, value) in cases {
        let w = if wrapper.is_empty() {
            setsockopt(proto, option, value)
        } else {
            setsockopt_wrapped(wrapper, proto, option, value)
        };
        let got = outcome_line(&e, w.get("pid"), w.get("inode"), option);
        let field = |k: &str| {
            got.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no {k} in {got:?}"))
        };
        let case = format!("{proto} {option}={value} wrapper={wrapper:?}");
        assert_eq!(field("derived"), "true", "{case}: {got:?}");
        let errno: i32 = w.get("errno").parse().unwrap();
        assert_eq!(field("ret"), (-errno).to_string(), "{case}: return value");
        assert_eq!(
            field("rcvbuf"),
            w.get("rcvbuf"),
            "{case}: SO_RCVBUF readback"
        );
        assert_eq!(
            field("sndbuf"),
            w.get("sndbuf"),
            "{case}: SO_SNDBUF readback"
        );
        assert_eq!(
            field("locks"),
            w.get("locks"),
            "{case}: SO_BUF_LOCK readback"
        );
        eprintln!(
            "{case}: kernel errno={errno} rcvbuf={} sndbuf={} locks={} = bufscope",
            w.get("rcvbuf"),
            w.get("sndbuf"),
            w.get("locks")
        );
    }
}

/// Where no cgroup2 hierarchy is mounted, setsockopt falls back to the syscall tracepoints
/// (which read the outcome themselves) and says so; the counts stay exact. The exporter runs
/// in a mount namespace of its own with every cgroup2 mount removed.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn without_cgroup2_setsockopt_falls_back_to_tracepoints() {
    let dir = std::env::temp_dir().join(format!("bufscope-nocg2-{}", std::process::id()));
    let script =
        bufscope_testkit::without_cgroup2(&bufscope_integration::bufscope_bin(), &dir).unwrap();
    let e = Exporter::start_bin(&script, &[]);
    let m = e.scrape();
    let hook = "tracepoint/syscalls/sys_enter_setsockopt,tracepoint/syscalls/sys_exit_setsockopt";
    assert_eq!(
        m.sum(
            "bufscope_probe_attached",
            &[("probe", "setsockopt"), ("hook", hook)]
        ),
        1.0,
        "fallback hooks in use: {:?}",
        m.samples
            .iter()
            .filter(|s| s.name == "bufscope_probe_attached")
            .collect::<Vec<_>>()
    );
    assert!(
        e.log().contains("no cgroup2 hierarchy is mounted"),
        "the log says why: {}",
        e.log()
    );
    let req = (rmem_max() * 2).min(i32::MAX as i64 / 2);
    let w = setsockopt("udp", "SO_RCVBUF", &req.to_string());
    assert_eq!(w.get("errno"), "0");
    assert_counted(&e, &w, "udp", "SO_RCVBUF", (1.0, 1.0, 0.0));
    let w = setsockopt_wrapped(&WITHOUT_CAP_NET_ADMIN, "udp", "SO_RCVBUFFORCE", "8388608");
    assert_eq!(w.get("errno"), libc::EPERM.to_string());
    assert_counted(&e, &w, "udp", "SO_RCVBUFFORCE", (1.0, 0.0, 1.0));
    drop(e);
    let _ = std::fs::remove_dir_all(&dir);
}
