//! `Plan::apply` against the running kernel: every figure is checked against `getsockopt`
//! readback (through libc, not through the crate) and the machine's real
//! `net.core.rmem_max`/`wmem_max`, read at test time. No global sysctl is changed.
//!
//! The FORCE tests need root; they run the fallback path in child processes that lack
//! `CAP_NET_ADMIN` for real (`setpriv` dropping it, or a user namespace whose capability does
//! not extend to the socket's network namespace).
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::process::Command;

use bufscope_policy::{
    Buffers, Direction, Force, Platform, Transport, has_cap_net_admin, plan, set_buffer,
};

/// Environment variable telling a re-executed test binary which child role to play.
const CHILD_ENV: &str = "BUFSCOPE_POLICY_TEST_CHILD";

fn sysctl(name: &str) -> usize {
    let path = format!("/proc/sys/{}", name.replace('.', "/"));
    std::fs::read_to_string(&path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Ground truth, independent of the crate: `getsockopt(SOL_SOCKET, opt)`.
fn getsockopt(fd: &impl AsFd, opt: libc::c_int) -> usize {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "getsockopt: {}", std::io::Error::last_os_error());
    v as usize
}

fn udp() -> UdpSocket {
    UdpSocket::bind("127.0.0.1:0").unwrap()
}

/// Plain `SO_RCVBUF`/`SO_SNDBUF` above the limit: the kernel caps at 2 x `{r,w}mem_max`, and the
/// outcome says so, with the sysctl that fixes it.
#[test]
fn plain_request_above_the_limit_is_reported_clamped() {
    let rmem_max = sysctl("net.core.rmem_max");
    let wmem_max = sysctl("net.core.wmem_max");
    let s = udp();
    let r = set_buffer(&s, Direction::Receive, 2 * rmem_max, Force::Never).unwrap();
    let w = set_buffer(&s, Direction::Send, 2 * wmem_max, Force::Never).unwrap();

    let rcv = getsockopt(&s, libc::SO_RCVBUF);
    let snd = getsockopt(&s, libc::SO_SNDBUF);
    assert_eq!(r.effective, rcv);
    assert_eq!(w.effective, snd);
    // Kernel behaviour: request capped at rmem_max, then doubled.
    assert_eq!(rcv, 2 * rmem_max, "readback {rcv} with rmem_max {rmem_max}");
    assert_eq!(snd, 2 * wmem_max, "readback {snd} with wmem_max {wmem_max}");
    assert!(r.clamped && w.clamped);
    assert!(!r.forced && !r.force_attempted && !w.forced);
    assert_eq!(r.requested, Some(2 * rmem_max));
    let fix = r.fix.unwrap();
    assert!(
        fix.contains(&format!("sysctl -w net.core.rmem_max={}", 2 * rmem_max)),
        "{fix}"
    );
    let fix = w.fix.unwrap();
    assert!(
        fix.contains(&format!("sysctl -w net.core.wmem_max={}", 2 * wmem_max)),
        "{fix}"
    );
}

/// A request within the limit is doubled by the kernel and is not a clamp.
#[test]
fn plain_request_within_the_limit_is_not_clamped() {
    let rmem_max = sysctl("net.core.rmem_max");
    let s = udp();
    let want = rmem_max / 2;
    let r = set_buffer(&s, Direction::Receive, want, Force::Never).unwrap();
    let rcv = getsockopt(&s, libc::SO_RCVBUF);
    assert_eq!(r.effective, rcv);
    assert_eq!(rcv, 2 * want);
    assert!(!r.clamped);
    assert_eq!(r.fix, None);
    assert_eq!(
        r.before,
        sysctl("net.core.rmem_default"),
        "a new UDP socket starts at rmem_default"
    );
}

/// The recommended UDP plan on this machine: clamped exactly when 7 MiB exceeds the limits
/// and FORCE is unavailable, as `getsockopt` shows.
#[test]
fn recommended_udp_plan_matches_readback() {
    let s = udp();
    let p = plan(Transport::Udp, Platform::Linux, None);
    let o = p.apply(&s).unwrap();
    let rcv = getsockopt(&s, libc::SO_RCVBUF);
    let snd = getsockopt(&s, libc::SO_SNDBUF);
    assert_eq!(o.receive.effective, rcv);
    assert_eq!(o.send.effective, snd);
    let Buffers::Set { receive, send } = p.buffers else {
        panic!("UDP plan must set buffers")
    };
    assert_eq!(o.receive.clamped, rcv < 2 * receive);
    assert_eq!(o.send.clamped, snd < 2 * send);
    assert_eq!(o.receive.force_attempted, has_cap_net_admin());
    if !o.receive.forced {
        assert_eq!(rcv, 2 * receive.min(sysctl("net.core.rmem_max")));
    }
}

/// TCP on Linux: the plan sets nothing, so the kernel keeps autotuning. Proven on a loopback
/// connection: the receiver's buffer grows past its initial size when left alone, and stays
/// locked at 2 x the request when set before connect (the anti-pattern).
#[test]
fn tcp_plan_leaves_autotuning_on() {
    fn transfer(set_before_connect: Option<usize>) -> (usize, usize) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sender = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let chunk = vec![0x5au8; 256 * 1024];
            for _ in 0..256 {
                s.write_all(&chunk).unwrap();
            }
        });
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let outcome = match set_before_connect {
            None => {
                plan(Transport::Tcp, Platform::Linux, None)
                    .apply(&sock)
                    .unwrap()
                    .receive
            }
            Some(n) => set_buffer(&sock, Direction::Receive, n, Force::Never).unwrap(),
        };
        sock.connect(&addr.into()).unwrap();
        let mut stream: TcpStream = sock.into();
        let before = getsockopt(&stream, libc::SO_RCVBUF);
        assert_eq!(before, outcome.effective);
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0;
        loop {
            let n = stream.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            total += n;
        }
        sender.join().unwrap();
        assert_eq!(total, 64 * 1024 * 1024);
        (before, getsockopt(&stream, libc::SO_RCVBUF))
    }

    let p = plan(Transport::Tcp, Platform::Linux, None);
    assert_eq!(p.buffers, Buffers::LeaveAlone);
    let (before, after) = transfer(None);
    assert!(
        after > before,
        "autotuning should grow SO_RCVBUF: {before} -> {after}"
    );
    let (before, after) = transfer(Some(64 * 1024));
    assert_eq!(
        (before, after),
        (128 * 1024, 128 * 1024),
        "a set buffer is locked"
    );
}

/// Root: with CAP_NET_ADMIN, FORCE bypasses `rmem_max`/`wmem_max`.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn force_bypasses_the_limit_with_cap_net_admin() {
    assert!(has_cap_net_admin(), "this test needs CAP_NET_ADMIN");
    let rmem_max = sysctl("net.core.rmem_max");
    let wmem_max = sysctl("net.core.wmem_max");
    let s = udp();
    let r = set_buffer(&s, Direction::Receive, 2 * rmem_max, Force::Auto).unwrap();
    let w = set_buffer(&s, Direction::Send, 2 * wmem_max, Force::Auto).unwrap();
    let rcv = getsockopt(&s, libc::SO_RCVBUF);
    let snd = getsockopt(&s, libc::SO_SNDBUF);
    assert!(r.force_attempted && r.forced && w.forced);
    assert_eq!((r.effective, w.effective), (rcv, snd));
    assert_eq!(rcv, 4 * rmem_max, "FORCE is not capped by rmem_max");
    assert_eq!(snd, 4 * wmem_max);
    assert!(!r.clamped && !w.clamped);
    assert_eq!(r.fix, None);
}

/// What a child process does: apply 2 x the limits with `Force::Auto` and print one line
/// `CHILD <direction> capeff=<hex> attempted=<bool> forced=<bool> clamped=<bool> effective=<n>
/// readback=<n> max=<n> fix=<text>`
/// per direction.
fn child_apply_and_report() {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let capeff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim()
        .to_string();
    let s = udp();
    for (direction, opt, max) in [
        (
            Direction::Receive,
            libc::SO_RCVBUF,
            sysctl("net.core.rmem_max"),
        ),
        (
            Direction::Send,
            libc::SO_SNDBUF,
            sysctl("net.core.wmem_max"),
        ),
    ] {
        let o = set_buffer(&s, direction, 2 * max, Force::Auto).unwrap();
        println!(
            "CHILD {direction} capeff={capeff} attempted={} forced={} clamped={} effective={} readback={} max={max} fix={}",
            o.force_attempted,
            o.forced,
            o.clamped,
            o.effective,
            getsockopt(&s, opt),
            o.fix.unwrap_or_default(),
        );
    }
}

struct ChildLine {
    capeff: u64,
    attempted: bool,
    forced: bool,
    clamped: bool,
    effective: usize,
    readback: usize,
    max: usize,
    fix: String,
}

fn run_child(wrapper: &[&str], test_name: &str) -> Vec<ChildLine> {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(wrapper[0])
        .args(&wrapper[1..])
        .arg(&exe)
        .args([
            "--exact",
            test_name,
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<ChildLine> = stdout
        .lines()
        // The harness may print "test name ... " on the same line before the child's output.
        .filter_map(|l| l.find("CHILD ").map(|i| &l[i..]))
        .map(|l| {
            let field = |k: &str| {
                l.split(' ')
                    .find_map(|f| f.strip_prefix(&format!("{k}=")))
                    .unwrap()
                    .to_string()
            };
            ChildLine {
                capeff: u64::from_str_radix(&field("capeff"), 16).unwrap(),
                attempted: field("attempted").parse().unwrap(),
                forced: field("forced").parse().unwrap(),
                clamped: field("clamped").parse().unwrap(),
                effective: field("effective").parse().unwrap(),
                readback: field("readback").parse().unwrap(),
                max: field("max").parse().unwrap(),
                // `fix=` is last on the line and may contain spaces.
                fix: l.split_once(" fix=").unwrap().1.to_string(),
            }
        })
        .collect();
    assert_eq!(lines.len(), 2, "expected two CHILD lines in:\n{stdout}");
    lines
}

/// Root: a child without CAP_NET_ADMIN (dropped from its bounding, inheritable and hence
/// effective set by `setpriv`) does not attempt FORCE, and the plain option is clamped.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn fallback_without_cap_net_admin_is_clamped() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return child_apply_and_report();
    }
    let lines = run_child(
        &[
            "setpriv",
            "--inh-caps=-net_admin",
            "--bounding-set=-net_admin",
            "--",
        ],
        "fallback_without_cap_net_admin_is_clamped",
    );
    let sysctls = ["net.core.rmem_max", "net.core.wmem_max"];
    for (l, sysctl_name) in lines.iter().zip(sysctls) {
        assert_eq!(l.capeff & (1 << 12), 0, "child still had CAP_NET_ADMIN");
        assert!(!l.attempted && !l.forced);
        assert_eq!(l.effective, l.readback);
        assert_eq!(l.readback, 2 * l.max, "plain option capped at the sysctl");
        assert!(l.clamped);
        assert!(
            l.fix
                .contains(&format!("sysctl -w {sysctl_name}={}", 2 * l.max)),
            "{}",
            l.fix
        );
    }
}

/// Root: a child in a new user namespace holds CAP_NET_ADMIN there, so FORCE is attempted, but
/// the socket belongs to the initial network namespace, so the kernel refuses (`EPERM`) and the
/// plain option takes over, clamped.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn force_refused_by_the_kernel_falls_back_to_plain() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return child_apply_and_report();
    }
    let lines = run_child(
        &["unshare", "--user", "--map-root-user", "--"],
        "force_refused_by_the_kernel_falls_back_to_plain",
    );
    for l in &lines {
        assert_ne!(
            l.capeff & (1 << 12),
            0,
            "child should hold CAP_NET_ADMIN in its userns"
        );
        assert!(l.attempted, "FORCE should have been tried");
        assert!(!l.forced, "the kernel should have refused FORCE");
        assert_eq!(l.effective, l.readback);
        assert_eq!(l.readback, 2 * l.max);
        assert!(l.clamped);
    }
}
