//! TCP: connections, window-scale shrink and SOCK_RCVBUF_LOCK, against `ss -tni` and
//! `getsockopt(SO_BUF_LOCK)`; autotuning suppressed, against an independent bpftrace count.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::Duration;

use bufscope_integration::{Exporter, SsConn, Workload, bpftrace, eventually, ss_tcp};

fn locked(bits: &str) -> bool {
    bits.parse::<u32>().unwrap() & 2 != 0
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn wscale_shrink_locks_and_established_match_ss() {
    // Judged on its own connections only: a shared bufscope (the matrix's guests) will do.
    let e = Exporter::shared(&[]);
    let la = Workload::start(&["tcp-listen"]); // control listener
    let mut lb = Workload::start(&["tcp-listen", "--rcvbuf", "65536"]); // locked before listen()
    let pa = la.get("port").to_string();
    let pb = lb.get("port").to_string();
    let c1 = Workload::start(&["tcp-connect", "--port", &pa, "--count", "2"]); // control
    let c2 = Workload::start(&[
        "tcp-connect",
        "--port",
        &pa,
        "--rcvbuf",
        "65536",
        "--count",
        "3",
    ]);
    let c3 = Workload::start(&["tcp-connect", "--port", &pb, "--count", "2"]);
    let lb_children: Vec<String> = (0..2)
        .map(|_| lb.wait_line("ACCEPTED", Duration::from_secs(10)))
        .collect();

    // Kernel ground truth: each process's connections as ss sees them.
    let ss = ss_tcp();
    let lports = |w: &Workload| -> Vec<u16> {
        w.get("lports")
            .split(',')
            .map(|p| p.parse().unwrap())
            .collect()
    };
    let of_client = |w: &Workload| -> Vec<SsConn> {
        let ports = lports(w);
        ss.iter()
            .filter(|c| ports.contains(&c.local_port))
            .cloned()
            .collect()
    };
    let of_listener = |port: &str| -> Vec<SsConn> {
        let p: u16 = port.parse().unwrap();
        ss.iter().filter(|c| c.local_port == p).cloned().collect()
    };
    let control_wscale = of_client(&c1)[0].rcv_wscale;
    assert!(
        control_wscale > 1,
        "control connection scale {control_wscale}"
    );
    let mut expected: HashMap<u32, (usize, usize, usize)> = HashMap::new(); // pid -> (estab, shrunk, locks)
    for (w, conns, locks) in [
        (
            &c1,
            of_client(&c1),
            c1.get("locks").split(',').filter(|b| locked(b)).count(),
        ),
        (
            &c2,
            of_client(&c2),
            c2.get("locks").split(',').filter(|b| locked(b)).count(),
        ),
        (
            &c3,
            of_client(&c3),
            c3.get("locks").split(',').filter(|b| locked(b)).count(),
        ),
        (&la, of_listener(&pa), usize::from(locked(la.get("locks")))),
    ] {
        let shrunk = conns
            .iter()
            .filter(|c| c.rcv_wscale < control_wscale)
            .count();
        expected.insert(w.pid(), (conns.len(), shrunk, locks));
    }
    let lb_conns = of_listener(&pb);
    let lb_locks = usize::from(locked(lb.get("locks")))
        + lb_children
            .iter()
            .filter(|l| locked(l.trim_start_matches("ACCEPTED locks=")))
            .count();
    let lb_shrunk = lb_conns
        .iter()
        .filter(|c| c.rcv_wscale < control_wscale)
        .count();
    expected.insert(lb.pid(), (lb_conns.len(), lb_shrunk, lb_locks));

    // The scenario really is the shrunken-window-scale one (sanity of the ground truth).
    assert_eq!(expected[&c2.pid()], (3, 3, 3));
    assert_eq!(expected[&lb.pid()], (2, 2, 3));
    assert_eq!(expected[&c1.pid()], (2, 0, 0));
    assert_eq!(expected[&la.pid()], (5, 0, 0));

    let observe = || -> HashMap<u32, (usize, usize, usize)> {
        let m = e.scrape();
        expected
            .keys()
            .map(|pid| {
                let p = pid.to_string();
                let l = [("pid", p.as_str())];
                let tcp = [("pid", p.as_str()), ("proto", "tcp")];
                (
                    *pid,
                    (
                        m.sum("bufscope_tcp_established_total", &l) as usize,
                        m.sum("bufscope_tcp_wscale_shrunk_total", &l) as usize,
                        m.sum("bufscope_rcvbuf_locks_total", &tcp) as usize,
                    ),
                )
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut got = observe();
    while got != expected && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        got = observe();
    }
    // pid -> (established, shrunk, locks): bufscope vs the kernel
    assert_eq!(got, expected);
    eprintln!(
        "control wscale {control_wscale}; pid -> (established, shrunk, locks): {got:?} (lock bits from {})",
        la.get("locks_source")
    );
}

/// Counts `tcp:tcp_rcvbuf_grow` events on local port `port` while `run` runs, with bpftrace:
/// an observer independent of bufscope.
fn bpftrace_count(port: u16, run: impl FnOnce()) -> u64 {
    let probes =
        format!("tracepoint:tcp:tcp_rcvbuf_grow /args->sport == {port}/ {{ @n = count(); }}");
    let counts = bpftrace::counts(&probes, "", Duration::from_secs(60), run);
    counts.get("").copied().unwrap_or(0)
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn autotune_suppressed_matches_an_independent_count() {
    let e = Exporter::start(&[]);
    for (lock, name) in [(true, "locked"), (false, "control")] {
        let mut args = vec!["tcp-bulk-recv", "--bytes", "209715200"];
        if lock {
            args.extend(["--rcvbuf-after", "65536"]);
        }
        let mut rx = Workload::start(&args);
        let port: u16 = rx.get("port").parse().unwrap();
        let rpid = rx.pid().to_string();
        let grows = bpftrace_count(port, || {
            let tx = Workload::start(&[
                "tcp-bulk-send",
                "--port",
                &port.to_string(),
                "--bytes",
                "209715200",
            ]);
            assert!(tx.wait());
            rx.wait_line("RECEIVED", Duration::from_secs(60));
        });
        assert!(
            grows > 0,
            "{name}: the kernel wanted to grow the buffer at least once"
        );
        let want = if lock { grows as f64 } else { 0.0 };
        let got = eventually(Duration::from_secs(10), "autotune metric", || {
            let v = e.scrape().sum(
                "bufscope_tcp_autotune_suppressed_total",
                &[("pid", rpid.as_str())],
            );
            (v == want).then_some(v)
        });
        assert_eq!(
            got, want,
            "{name}: bpftrace counted {grows} tcp_rcvbuf_grow events"
        );
        eprintln!("{name}: bpftrace tcp_rcvbuf_grow {grows}, bufscope suppressed {got}");
    }
}
