//! IPsec (XFRM) errors per network namespace and reason equal the deltas of the namespace's
//! own `/proc/net/xfrm_stat`, and the namespace's daemon (a process holding a NETLINK_XFRM
//! socket bound to XFRM groups there: `ip xfrm monitor`) is named. Two namespaces the test
//! creates, joined by a veth (policies on `lo` never reach XFRM): an `action block` out
//! policy in A (every send fails with EPERM: `XfrmOutPolBlock`), an ESP tunnel policy in A
//! whose SA the daemon never installs (the kernel sends it an acquire and drops every packet:
//! `XfrmOutNoStates`, which gets the finding and its advice) and an `action block` in policy
//! in B (`XfrmInPolBlock`). bufscope reads a namespace through a process living in it, so B
//! gets one (a namespace no process lives in is not seen). Every process the test starts is
//! a [`Spawned`] or a [`Workload`]: killed and reaped when dropped, also on a failed assertion.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use bufscope_integration::{Exporter, Spawned, Workload};
use bufscope_netlab::{Netns, PREFIX, VethPair, unique_name};

const ERRORS: &str = "bufscope_xfrm_errors_total";

/// The namespace's `/proc/net/xfrm_stat`, by name.
fn xfrm_stat(ns: &Netns) -> BTreeMap<String, u64> {
    ns.exec("cat", ["/proc/net/xfrm_stat"])
        .unwrap()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.to_string(), f.next()?.parse().ok()?))
        })
        .collect()
}

/// Sends UDP datagrams from `ns` to `dest` for a second.
fn blast(ns: &Netns, dest: &str) {
    let mut w = Workload::start_wrapped(
        &["ip", "netns", "exec", ns.name()],
        &[
            "udp-blast",
            "--dest",
            dest,
            "--seconds",
            "1",
            "--size",
            "64",
        ],
    );
    let sent = w.wait_line("SENT", Duration::from_secs(20));
    eprintln!("{}: {sent}", ns.name());
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn xfrm_errors_equal_the_namespace_counters_and_name_the_daemon() {
    let exporter = Exporter::start(&[]);
    let a = Netns::create(unique_name(PREFIX, "xa")).unwrap();
    let b = Netns::create(unique_name(PREFIX, "xb")).unwrap();
    let (va, vb) = (
        format!("bsxa{}", std::process::id() % 100_000),
        format!("bsxb{}", std::process::id() % 100_000),
    );
    let _veth = VethPair::create(&a, &va, &b, &vb).unwrap();
    a.ip(["addr", "add", "10.77.0.1/24", "dev", &va]).unwrap();
    a.ip(["addr", "add", "10.78.0.1/24", "dev", &va]).unwrap();
    a.ip(["addr", "add", "10.76.0.1/24", "dev", &va]).unwrap();
    b.ip(["addr", "add", "10.77.0.2/24", "dev", &vb]).unwrap();
    b.ip(["addr", "add", "10.78.0.2/24", "dev", &vb]).unwrap();
    b.ip(["addr", "add", "10.76.0.2/24", "dev", &vb]).unwrap();
    // bufscope reads a namespace through a process living in it: B's is a plain sleeper.
    let _b_resident =
        Spawned::new(Command::new("ip").args(["netns", "exec", b.name(), "sleep", "120"]));
    // A's daemon stand-in: an XFRM event listener (it receives the kernel's acquires).
    let monitor = Spawned::new(
        Command::new("ip")
            .args(["-n", a.name(), "xfrm", "monitor"])
            .stdout(Stdio::null()),
    );
    a.ip([
        "xfrm",
        "policy",
        "add",
        "src",
        "10.77.0.1/32",
        "dst",
        "10.77.0.2/32",
        "dir",
        "out",
        "action",
        "block",
    ])
    .unwrap();
    // ESP in tunnel mode to B, but no SA: the daemon would have to negotiate one.
    a.ip([
        "xfrm",
        "policy",
        "add",
        "src",
        "10.76.0.1/32",
        "dst",
        "10.76.0.2/32",
        "dir",
        "out",
        "tmpl",
        "src",
        "10.76.0.1",
        "dst",
        "10.76.0.2",
        "proto",
        "esp",
        "mode",
        "tunnel",
    ])
    .unwrap();
    b.ip([
        "xfrm",
        "policy",
        "add",
        "src",
        "10.78.0.1/32",
        "dst",
        "10.78.0.2/32",
        "dir",
        "in",
        "action",
        "block",
    ])
    .unwrap();
    let (a0, b0) = (xfrm_stat(&a), xfrm_stat(&b));
    // Let bufscope read both namespaces once.
    std::thread::sleep(Duration::from_millis(2500));
    blast(&a, "10.77.0.2:9");
    blast(&a, "10.78.0.2:9");
    blast(&a, "10.76.0.2:9");
    let (a1, b1) = (xfrm_stat(&a), xfrm_stat(&b));
    let delta = |x: &BTreeMap<String, u64>, y: &BTreeMap<String, u64>, k: &str| y[k] - x[k];
    let out_block = delta(&a0, &a1, "XfrmOutPolBlock");
    let in_block = delta(&b0, &b1, "XfrmInPolBlock");
    assert!(out_block > 100, "A's sends should be blocked: {out_block}");
    assert!(in_block > 100, "B should block A's packets: {in_block}");
    let no_states = delta(&a0, &a1, "XfrmOutNoStates");
    assert!(no_states > 0, "A's ESP policy without an SA: {no_states}");
    let (ans, bns) = (
        a.inode().unwrap().to_string(),
        b.inode().unwrap().to_string(),
    );
    let read = || {
        let m = exporter.scrape();
        (
            m.sum(ERRORS, &[("netns", &ans), ("reason", "XfrmOutPolBlock")]),
            m.sum(ERRORS, &[("netns", &bns), ("reason", "XfrmInPolBlock")]),
        )
    };
    let want = (out_block as f64, in_block as f64);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut got = read();
    while got != want && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        got = read();
    }
    assert_eq!(got, want, "bufscope (out, in) vs the kernel's deltas");
    eprintln!(
        "XfrmOutPolBlock in A: kernel delta {out_block}, bufscope {}; XfrmInPolBlock in B: kernel delta {in_block}, bufscope {}",
        got.0, got.1
    );
    // Every other reason equals its delta too (zero here).
    let m = exporter.scrape();
    for (ns, before, after) in [(&ans, &a0, &a1), (&bns, &b0, &b1)] {
        for (k, v) in after {
            let want = (v - before[k]) as f64;
            assert_eq!(
                m.sum(ERRORS, &[("netns", ns), ("reason", k)]),
                want,
                "{ns} {k}"
            );
        }
    }
    let want = [("netns", ans.as_str())];
    let daemon = m
        .find("bufscope_xfrm_daemon_info", &want)
        .next()
        .unwrap_or_else(|| panic!("no daemon named for A"));
    assert_eq!(daemon.labels["comm"], "ip");
    assert!(
        !daemon.labels.contains_key("pid"),
        "the daemon is named by its identity, not its pid"
    );
    assert!(
        m.find("bufscope_xfrm_daemon_info", &[("netns", &bns)])
            .next()
            .is_none(),
        "B has no XFRM listener"
    );
    // The finding: on the daemon, for the missing SAs only (blocks are configuration), with
    // the kernel's count and the advice.
    let (code, body) = exporter.get("/api/v1/findings");
    assert_eq!(code, 200);
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let findings = doc["findings"].as_array().unwrap();
    let f = findings
        .iter()
        .find(|f| f["kind"] == "xfrm_errors" && f["process"]["pid"] == monitor.pid())
        .unwrap_or_else(|| panic!("no xfrm_errors finding on the daemon: {body}"));
    assert_eq!(
        f["evidence"]["errors_total"].as_f64(),
        Some(no_states as f64),
        "{f}"
    );
    assert_eq!(
        f["evidence"]["netns"].as_f64(),
        Some(a.inode().unwrap() as f64),
        "{f}"
    );
    let summary = f["summary"].as_str().unwrap();
    assert!(
        summary.contains(&format!("XfrmOutNoStates {no_states}")),
        "{summary}"
    );
    assert!(!summary.contains("PolBlock"), "{summary}");
    assert!(f["fix"].as_str().unwrap().contains("acquire"), "{f}");
    assert!(
        !findings.iter().any(|f| f["kind"] == "xfrm_errors"
            && f["evidence"]["netns"].as_f64() == Some(b.inode().unwrap() as f64)),
        "B has only a configured block and no daemon"
    );
    eprintln!(
        "XfrmOutNoStates in A: kernel delta {no_states}, finding errors_total {}",
        f["evidence"]["errors_total"]
    );
}

/// Whether this kernel has ESP (`esp4`, loaded here when it is a module). The host of the
/// fast loop may have none (no modules at all); the matrix's Debian guest kernels have it.
fn have_esp4() -> bool {
    let _ = Command::new("modprobe")
        .arg("esp4")
        .stderr(Stdio::null())
        .status();
    std::path::Path::new("/sys/module/esp4").exists()
}

/// Real ESP from A (an SA and a policy in transport mode) to B, where the daemon installed no
/// SA: B's kernel counts every packet as `XfrmInNoStates`, bufscope counts the same, and the
/// finding on B's daemon explains it. Needs ESP (the kernel matrix's step); on a kernel
/// without it the test says so and checks nothing.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn inbound_esp_without_an_sa_counts_as_no_states_and_advises_the_daemon() {
    if !have_esp4() {
        eprintln!(
            "SKIPPED: this kernel has no esp4 (no /sys/module/esp4 after modprobe); \
             `cargo xtask matrix --step ESP` runs this on the Debian guest kernels"
        );
        return;
    }
    let exporter = Exporter::start(&[]);
    let a = Netns::create(unique_name(PREFIX, "ea")).unwrap();
    let b = Netns::create(unique_name(PREFIX, "eb")).unwrap();
    let (va, vb) = (
        format!("bsea{}", std::process::id() % 100_000),
        format!("bseb{}", std::process::id() % 100_000),
    );
    let _veth = VethPair::create(&a, &va, &b, &vb).unwrap();
    a.ip(["addr", "add", "10.75.0.1/24", "dev", &va]).unwrap();
    b.ip(["addr", "add", "10.75.0.2/24", "dev", &vb]).unwrap();
    // B's daemon stand-in, and A's resident (bufscope reads a namespace through a process).
    let daemon = Spawned::new(
        Command::new("ip")
            .args(["-n", b.name(), "xfrm", "monitor"])
            .stdout(Stdio::null()),
    );
    let _a_resident =
        Spawned::new(Command::new("ip").args(["netns", "exec", a.name(), "sleep", "300"]));
    a.ip([
        "xfrm",
        "state",
        "add",
        "src",
        "10.75.0.1",
        "dst",
        "10.75.0.2",
        "proto",
        "esp",
        "spi",
        "0x4242",
        "mode",
        "transport",
        "enc",
        "cbc(aes)",
        "0x00112233445566778899aabbccddeeff",
        "auth-trunc",
        "hmac(sha256)",
        "0x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        "128",
    ])
    .unwrap();
    a.ip([
        "xfrm",
        "policy",
        "add",
        "src",
        "10.75.0.1/32",
        "dst",
        "10.75.0.2/32",
        "dir",
        "out",
        "tmpl",
        "src",
        "10.75.0.1",
        "dst",
        "10.75.0.2",
        "proto",
        "esp",
        "mode",
        "transport",
    ])
    .unwrap();
    let (a0, b0) = (xfrm_stat(&a), xfrm_stat(&b));
    std::thread::sleep(Duration::from_millis(2500));
    blast(&a, "10.75.0.2:9");
    let (a1, b1) = (xfrm_stat(&a), xfrm_stat(&b));
    let no_states = b1["XfrmInNoStates"] - b0["XfrmInNoStates"];
    assert!(
        no_states > 0,
        "B should count A's ESP to an SPI it has no SA for: {no_states}"
    );
    let bns = b.inode().unwrap().to_string();
    let labels = [("netns", bns.as_str()), ("reason", "XfrmInNoStates")];
    let got = bufscope_integration::eventually(
        Duration::from_secs(15),
        "XfrmInNoStates to reach the kernel's",
        || {
            let v = exporter.scrape().sum(ERRORS, &labels);
            (v == no_states as f64).then_some(v)
        },
    );
    eprintln!("XfrmInNoStates in B (inbound ESP, no SA): kernel delta {no_states}, bufscope {got}");
    let m = exporter.scrape();
    let ans = a.inode().unwrap().to_string();
    for (ns, before, after) in [(&ans, &a0, &a1), (&bns, &b0, &b1)] {
        for (k, v) in after {
            let want = (v - before.get(k).copied().unwrap_or(0)) as f64;
            assert_eq!(
                m.sum(ERRORS, &[("netns", ns), ("reason", k)]),
                want,
                "{ns} {k}"
            );
        }
    }
    let (code, body) = exporter.get("/api/v1/findings");
    assert_eq!(code, 200);
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let f = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "xfrm_errors" && f["process"]["pid"] == daemon.pid())
        .unwrap_or_else(|| panic!("no xfrm_errors finding on B's daemon: {body}"));
    assert_eq!(
        f["evidence"]["errors_total"].as_f64(),
        Some(no_states as f64),
        "{f}"
    );
    assert!(f["fix"].as_str().unwrap().contains("SPI with no SA"), "{f}");
}
