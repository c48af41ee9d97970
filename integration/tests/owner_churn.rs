//! Owner churn at a long RTT: while a `socket()`/`close()` loop on the node pushes owners
//! through the `OWNERS` LRU as fast as one core can make sockets, 1,000 TCP connections are
//! opened over a 190 ms WAN (netlab); their ESTABLISHED events arrive a round trip after
//! `socket()`. bufscope must count every one on the process that holds it, equal to what
//! `ss -tnp` shows in each namespace, while the loop still runs, and `/healthz` (the heartbeat
//! of polls and drains) answers 200 throughout. Twice: with the default `OWNERS` (the kernel's
//! LRU keeps an entry that was read once — the connector's, read at `connect()` — over the
//! loop's, never read), and with an `OWNERS` smaller than the connections in flight, where
//! the loop evicts the connector's owners too and bufscope must find them by its batched
//! `/proc` look-ups off the collector's lock. The lock-hold histogram's p99 is printed (a
//! figure, not an assertion: `cargo xtask bench overhead --sections churn` reports it side by
//! side).
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bufscope_integration::{Exporter, Workload, eventually, http_get, require_root};
use bufscope_netlab::{Lab, LabConfig, LinkParams};

/// Connections opened through the WAN.
const CONNS: usize = 1000;
/// `OWNERS` entries of the evicting run: fewer than the connections in their handshake at
/// once, so that the loop evicts the connector's owners whatever the LRU keeps.
const SMALL_OWNERS: u32 = 256;

/// Established TCP connections `ss -tnp` shows held by `pid` in network namespace `ns`.
fn ss_established(ns: &str, pid: u32) -> usize {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-Htnp", "state", "established"])
        .output()
        .unwrap();
    assert!(out.status.success(), "ss in {ns}");
    let needle = format!("pid={pid},");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&needle))
        .count()
}

/// The `COUNT <sockets> <secs>` the churn loop answers.
fn churned(w: &mut Workload) -> u64 {
    w.send("count");
    let line = w.wait_line("COUNT ", Duration::from_secs(10));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn established_counts_stay_exact_while_a_socket_close_loop_churns_owners_at_190ms() {
    require_root();
    let lab = Lab::new(LabConfig::wan("bsoc", LinkParams::mbit(100).rtt_ms(190))).unwrap();
    scenario(&lab, None);
    let lookups = scenario(&lab, Some(SMALL_OWNERS));
    assert!(
        lookups > 0.0,
        "with {SMALL_OWNERS} OWNERS entries the connector's owners are evicted: bufscope looks them up"
    );
}

/// One run with `OWNERS` of `entries` (None: bufscope's default); returns the owner look-ups
/// bufscope made.
fn scenario(lab: &Lab, entries: Option<u32>) -> f64 {
    let flag = entries.map(|n| n.to_string());
    let e = match &flag {
        Some(n) => Exporter::start(&["--owners.map-entries", n]),
        None => Exporter::start(&[]),
    };
    let owners_entries =
        u64::from(entries.unwrap_or(bufscope_common::maps::OWNERS.default_entries));
    eprintln!("--- OWNERS with {owners_entries} entries");
    let before = e.scrape();

    // /healthz every 250 ms from now to the end.
    let stop = Arc::new(AtomicBool::new(false));
    let health = {
        let (stop, addr) = (stop.clone(), e.addr.clone());
        std::thread::spawn(move || {
            let mut bad = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let (status, body) = http_get(&addr, "/healthz");
                n += 1;
                if status != 200 {
                    bad.push(format!("{status} after {:?}: {}", t.elapsed(), body.trim()));
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            (n, bad)
        })
    };

    let ns_a = lab.a().name().to_string();
    let ns_b = lab.b().name().to_string();
    let listener = Workload::start_wrapped(
        &["ip", "netns", "exec", &ns_b],
        &["tcp-accept-hold", "--bind", &lab.addr_b().to_string()],
    );
    let dest = format!("{}:{}", lab.addr_b(), listener.get("port"));

    let mut churn = Workload::start(&["socket-churn"]);
    std::thread::sleep(Duration::from_secs(1));
    let churn_start = churned(&mut churn);
    let opened_at = Instant::now();
    let mut conns = Workload::start_wrapped(
        &["ip", "netns", "exec", &ns_a],
        &[
            "tcp-open",
            "--dest",
            &dest,
            "--count",
            &CONNS.to_string(),
            "--rate",
            "200",
        ],
    );
    let opened = conns.wait_line("OPENED ", Duration::from_secs(120));
    let open_secs = opened_at.elapsed().as_secs_f64();
    let churn_during = churned(&mut churn) - churn_start;
    eprintln!(
        "{opened}; the loop made {churn_during} sockets meanwhile ({:.0}/s, {:.0}× OWNERS)",
        churn_during as f64 / open_secs,
        churn_during as f64 / owners_entries as f64
    );
    assert!(
        opened.contains(&format!("ok={CONNS} failed=0")),
        "every connection opens: {opened}"
    );
    // The scenario: the loop pushed several times OWNERS' size through it meanwhile.
    assert!(
        churn_during > 2 * owners_entries,
        "the loop must cycle OWNERS many times over while the connections open \
         ({churn_during} sockets for {owners_entries} entries)"
    );

    // The kernel's truth, in each namespace.
    let (cpid, lpid) = (conns.pid(), listener.pid());
    // (The server's end completes half a round trip after the client's, then is accepted.)
    let (want_c, want_l) = eventually(Duration::from_secs(10), "ss: both ends established", || {
        let got = (ss_established(&ns_a, cpid), ss_established(&ns_b, lpid));
        (got == (CONNS, CONNS)).then_some(got)
    });

    // bufscope, while the loop still runs.
    let est = |m: &bufscope_integration::Metrics, pid: u32| {
        m.sum(
            "bufscope_tcp_established_total",
            &[("pid", &pid.to_string())],
        ) as usize
    };
    let unknown = |m: &bufscope_integration::Metrics| {
        m.sum("bufscope_tcp_established_total", &[("comm", "_unknown")])
    };
    let got = eventually(
        Duration::from_secs(30),
        "bufscope's established counts = ss's",
        || {
            let m = e.scrape();
            let got = (est(&m, cpid), est(&m, lpid));
            (got == (want_c, want_l)).then_some(got)
        },
    );
    let during = churned(&mut churn) - churn_start;
    assert!(
        during > churn_during,
        "the loop still ran while the counts were compared"
    );
    let after = e.scrape();
    drop(churn);
    // The node's `_unknown` (it has no namespace label): other tests' short-lived programs on
    // a shared machine can add a few; an owner lost to the churn would add hundreds of these
    // 2,000 ends (their own counts are exact above).
    let lost = unknown(&after) - unknown(&before);
    assert!(
        lost < CONNS as f64 / 100.0,
        "{lost} established connections on _unknown"
    );
    // Stays exact: nothing counted twice once the look-ups settle.
    std::thread::sleep(Duration::from_secs(3));
    let settled = e.scrape();
    assert_eq!((est(&settled, cpid), est(&settled, lpid)), got);

    let lookups = |m: &bufscope_integration::Metrics| {
        m.sum("bufscope_attribution_lookups_total", &[])
            - before.sum("bufscope_attribution_lookups_total", &[])
    };
    let p99 = settled.histogram_quantile(
        Some(&before),
        "bufscope_collector_lock_hold_seconds",
        &[],
        0.99,
    );
    let worst = settled
        .find("bufscope_collector_lock_hold_max_seconds", &[])
        .map(|s| format!("{}={:.1} ms", s.labels["holder"], s.value * 1000.0))
        .collect::<Vec<_>>();
    eprintln!(
        "bufscope: connector {} / listener {} established (ss: {want_c} / {want_l}); \
         {:.0} owner look-ups; collector lock hold p99 {:.1} ms over the run, worst {}",
        got.0,
        got.1,
        lookups(&settled),
        p99.unwrap_or(f64::NAN) * 1000.0,
        worst.join(", ")
    );

    stop.store(true, Ordering::Relaxed);
    let (n, bad) = health.join().unwrap();
    assert!(n > 10, "healthz was polled ({n})");
    assert!(bad.is_empty(), "/healthz not 200 during the run: {bad:?}");
    drop(conns);
    drop(listener);
    lookups(&settled)
}
