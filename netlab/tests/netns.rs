//! Namespaces, veth pairs, sysctls and cleanup, checked against `ip` and `sysctl` themselves.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bufscope_netlab::{Netns, VethPair, cleanup, unique_name};

fn ns_listed(name: &str) -> bool {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.split_whitespace().next() == Some(name))
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn netns_veth_sysctl_and_drop() {
    let (na, nb) = (unique_name("bsl", "a"), unique_name("bsl", "b"));
    let child_pid = {
        let a = Netns::create(&na).unwrap();
        let b = Netns::create(&nb).unwrap();
        assert!(ns_listed(&na) && ns_listed(&nb));
        assert!(matches!(
            Netns::create(&na),
            Err(bufscope_netlab::Error::Exists(_))
        ));

        let _veth = VethPair::create(&a, "bslv0", &b, "bslv1").unwrap();
        // Not 10.88.0.0/16: that is podman's default network (cni-podman0 on hosts that run it).
        a.add_addr("bslv0", "10.251.88.1/24").unwrap();
        b.add_addr("bslv1", "10.251.88.2/24").unwrap();
        let ping = a
            .exec("ping", ["-c", "2", "-i", "0.2", "-W", "2", "10.251.88.2"])
            .unwrap();
        assert!(ping.contains(" 0% packet loss"), "{ping}");
        // The veth ends live only inside the namespaces.
        let root_links = std::process::Command::new("ip")
            .args(["-o", "link"])
            .output()
            .unwrap();
        assert!(!String::from_utf8_lossy(&root_links.stdout).contains("bslv"));

        // Per-namespace sysctl: set in `a`, seen by sysctl(8) in `a`, untouched in `b`.
        let before_b = b.exec("sysctl", ["-n", "net.ipv4.tcp_rmem"]).unwrap();
        a.set_big_tcp_buffers().unwrap();
        let in_a = a.exec("sysctl", ["-n", "net.ipv4.tcp_rmem"]).unwrap();
        assert_eq!(
            in_a.split_whitespace().collect::<Vec<_>>(),
            ["4096", "131072", "134217728"]
        );
        assert_eq!(a.sysctl("net.ipv4.tcp_rmem").unwrap(), in_a.trim());
        assert_eq!(
            b.exec("sysctl", ["-n", "net.ipv4.tcp_rmem"]).unwrap(),
            before_b
        );

        // run_in: a socket bound on the namespace's address only works inside it.
        let bound = a
            .run_in(|| std::net::UdpSocket::bind("10.251.88.1:0").is_ok())
            .unwrap();
        assert!(bound);
        assert!(std::net::UdpSocket::bind("10.251.88.1:0").is_err());

        // A process left running inside is killed when the namespace goes.
        let p = a.spawn("sleep", ["600"]).unwrap();
        let child_pid = p.pid();
        // `ip netns exec` enters the namespace just after the fork: wait for it to get there.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !a.pids().unwrap().contains(&child_pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(a.pids().unwrap().contains(&child_pid));
        std::mem::forget(p); // leave it to the namespace's drop
        child_pid
    };
    assert!(!ns_listed(&na) && !ns_listed(&nb), "namespaces left behind");
    std::thread::sleep(Duration::from_millis(100));
    let stat = std::fs::read_to_string(format!("/proc/{child_pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z"),
        "process survived: {stat}"
    );
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn cleanup_removes_leftovers_of_dead_runs_only() {
    // A leftover of a dead owner (pid 0x7ffffffe cannot exist: pid_max is at most 2^22).
    let dead = "bsl7ffffffex0a";
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", dead])
        .status();
    assert!(
        std::process::Command::new("ip")
            .args(["netns", "add", dead])
            .status()
            .unwrap()
            .success()
    );
    // A namespace of this (live) process.
    let live = Netns::create(unique_name("bsl", "l")).unwrap();

    let report = cleanup("bsl", false).unwrap();
    assert!(report.namespaces.contains(&dead.to_string()), "{report:?}");
    assert!(
        report.in_use.contains(&live.name().to_string()),
        "{report:?}"
    );
    assert!(!ns_listed(dead));
    assert!(ns_listed(live.name()));
}
