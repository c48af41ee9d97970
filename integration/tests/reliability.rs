//! Reliability: bufscope stays exact under pressure, bounded under churn, clean across a
//! `kill -9`, robust against hostile input, and works with least privilege. Every expected
//! value comes from the kernel (`/proc/<pid>/net/udp` drops column, `/proc/<pid>/net/snmp`,
//! `bpftool`, `/proc/<pid>/status`), never from bufscope itself.
//!
//! Run with `cargo xtask test` (root; the node-wide group of .config/nextest.toml: alone). Each test prints the figures it saw
//! (`cargo xtask test -- --nocapture reliability` shows them).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::net::TcpStream;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use bufscope_integration::fixtures::{setsockopt, setsockopt_wrapped};
use bufscope_integration::{
    Exporter, GC_IDLE, Metrics, Workload, bpf_exists, bufscope_bin, default_probes, eventually,
    held_bpf_ids, http_get, proc_udp_drops, promtool_check_metrics, require_root, snmp, terminate,
    workload_bin,
};

const DROPS: &str = "bufscope_socket_drops_total";
const LOST: &str = "bufscope_bpf_events_lost_total";

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Sum of the kernel's drops columns over the sockets (`inodes=a,b,…`) of a `udp-recv`.
fn kernel_drops(w: &Workload) -> u64 {
    w.get("inodes")
        .split(',')
        .map(|i| {
            proc_udp_drops(w.pid(), i.parse().unwrap()).expect("socket in /proc/<pid>/net/udp")
        })
        .sum()
}

/// Waits until `f` returns the wanted value; panics with the last value seen otherwise.
fn wait_equal(timeout: Duration, what: &str, want: f64, mut f: impl FnMut() -> f64) -> f64 {
    let start = Instant::now();
    let mut last;
    loop {
        last = f();
        if last == want {
            return last;
        }
        if start.elapsed() > timeout {
            panic!("{what}: bufscope {last}, kernel {want} (after {timeout:?})");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `VmRSS` of `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Distinct non-empty `pid` label values over the per-process families.
/// The distinct identities (program and place) with series of their own in a scrape: what a
/// node's per-process series are keyed by (no pid).
fn distinct_pids(m: &Metrics) -> BTreeSet<String> {
    m.samples
        .iter()
        .filter(|s| s.labels.contains_key("comm") && !s.labels.contains_key("otel_metric_overflow"))
        .filter(|s| s.name != "bufscope_process_info")
        .map(|s| {
            [
                "comm",
                "container",
                "cgroup",
                "pod",
                "namespace",
                "container_name",
            ]
            .map(|k| s.labels.get(k).cloned().unwrap_or_default())
            .join("/")
        })
        .collect()
}

/// `bufscope_bpf_events_lost_total` by cause.
fn lost(m: &Metrics) -> BTreeMap<String, f64> {
    m.find(LOST, &[])
        .map(|s| (s.labels.get("cause").cloned().unwrap_or_default(), s.value))
        .collect()
}

/// Entries of bufscope's `DROPS` map (held by `exporter_pid`) whose key is in network namespace
/// `netns`, read with `bpftool map dump` (key: inode u64, netns u32, …, little endian).
fn drops_entries_in_netns(exporter_pid: u32, netns: u32) -> usize {
    let id = held_bpf_ids(exporter_pid, "map_id:")
        .into_iter()
        .find(|id| {
            Command::new("bpftool")
                .args(["map", "show", "id", &id.to_string()])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("name DROPS "))
                .unwrap_or(false)
        })
        .expect("the exporter holds its DROPS map");
    let out = Command::new("bpftool")
        .args(["map", "dump", "id", &id.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut n = 0;
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.trim() != "key:" {
            continue;
        }
        let mut key = Vec::new();
        for kl in lines.by_ref() {
            if kl.starts_with("value") {
                break;
            }
            key.extend(
                kl.split_whitespace()
                    .filter_map(|b| u8::from_str_radix(b, 16).ok()),
            );
        }
        if key.len() >= 12 && u32::from_le_bytes([key[8], key[9], key[10], key[11]]) == netns {
            n += 1;
        }
    }
    n
}

/// The network namespace inode of `pid`.
fn netns_of(pid: u32) -> u32 {
    let l = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    l.to_str()
        .and_then(|s| s.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok())
        .unwrap()
}

/// Every probe reports attached.
fn assert_all_attached(m: &Metrics, log: &str) {
    let probes: Vec<_> = m.find("bufscope_probe_attached", &[]).collect();
    assert_eq!(probes.len(), default_probes().len(), "probes: {probes:?}");
    for s in probes {
        assert_eq!(s.value, 1.0, "{s:?} not attached:\n{log}");
    }
}

// ---------------------------------------------------------------------------------------------
// Exact under pressure
// ---------------------------------------------------------------------------------------------

/// ≥ 1,000,000 drops across 8 receiving sockets in 4 processes, from two flooders at once:
/// every process's total equals the sum of its sockets' drops columns, exactly.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn a_million_drops_on_8_sockets_in_4_processes_are_counted_exactly() {
    let e = Exporter::start(&[]);
    let receivers: Vec<Workload> = (0..4)
        .map(|_| Workload::start(&["udp-recv", "--rcvbuf", "4096", "--count", "2"]))
        .collect();
    let ports: Vec<&str> = receivers.iter().map(|r| r.get("ports")).collect();
    let all_ports = ports.join(",");
    let total = || receivers.iter().map(kernel_drops).sum::<u64>();
    let mut flooders = Vec::new();
    while total() < 1_000_000 {
        // Two flooders in parallel (both cores), 16-byte datagrams to all 8 sockets.
        let per_socket = (1_000_000 - total()) / 16 + 2_000;
        let n = per_socket.to_string();
        let f: Vec<Workload> = (0..2)
            .map(|_| {
                Workload::start(&[
                    "udp-flood",
                    "--port",
                    &all_ports,
                    "--count",
                    &n,
                    "--size",
                    "16",
                ])
            })
            .collect();
        for w in f {
            flooders.push(w.pid().to_string());
            assert!(w.wait(), "flooder failed");
        }
    }
    let kernel_total = total();
    let mut counted_total = 0.0;
    for r in &receivers {
        let pid = r.pid().to_string();
        let want = kernel_drops(r) as f64;
        let got = wait_equal(
            Duration::from_secs(60),
            &format!("drops of receiver {pid}"),
            want,
            || {
                e.scrape().sum(
                    DROPS,
                    &[
                        ("pid", pid.as_str()),
                        ("proto", "udp"),
                        ("reason", "SOCKET_RCVBUFF"),
                    ],
                )
            },
        );
        counted_total += got;
        eprintln!("receiver {pid} (2 sockets): kernel {want} / bufscope {got}");
    }
    let m = e.scrape();
    for r in &receivers {
        // Nothing beyond the kernel's count under another reason or proto either.
        let pid = r.pid().to_string();
        assert_eq!(
            m.sum(DROPS, &[("pid", pid.as_str())]),
            kernel_drops(r) as f64,
            "receiver {pid}: double counted"
        );
    }
    for f in &flooders {
        assert_eq!(m.sum(DROPS, &[("pid", f.as_str())]), 0.0, "sender {f}");
    }
    assert_eq!(
        m.sum(LOST, &[("cause", "drops_map_full")]),
        0.0,
        "DROPS map full"
    );
    assert_eq!(counted_total, kernel_total as f64);
    assert!(kernel_total >= 1_000_000);
    eprintln!(
        "{kernel_total} drops on 8 sockets in 4 processes: bufscope {counted_total} = kernel \
         {kernel_total}; senders 0"
    );
}

// ---------------------------------------------------------------------------------------------
// Churn
// ---------------------------------------------------------------------------------------------

/// What one round of churn showed.
struct ChurnRound {
    secs: f64,
    kernel: u64,
    counted: f64,
    peak_pids: usize,
    peak_tracked: usize,
    peak_entries: usize,
    settle_secs: f64,
    rss_after: u64,
}

/// One round: 5,000 short-lived processes in a private network namespace, each with a
/// socket, an SO_RCVBUF call and ~19 drops; returns once the retention window and map GC
/// removed the round's series and `DROPS` entries.
fn churn_round(e: &Exporter, max: usize, comm: &str) -> ChurnRound {
    let base = e.scrape();
    let sampler = PeakSampler::start(&e.addr);
    let started = Instant::now();
    let churn = run_5000_short_lived_processes(comm);
    let secs = started.elapsed().as_secs_f64();
    let kernel = kernel_drops_of_the_churn(&churn);
    let peak_entries = assert_the_churn_was_in_the_drops_map(e, churn.netns);
    let counted = wait_until_the_churn_drops_are_counted(e, &base, kernel);
    let (peak_pids, peak_tracked) = sampler.stop();
    assert_no_bpf_side_losses_since(e, &base);
    assert_series_stayed_within_the_bound(peak_pids, peak_tracked, max);
    assert_a_new_process_is_still_seen(e);
    let settle_secs = wait_for_retention_and_map_gc_to_remove_the_round(e, churn.netns, comm);
    ChurnRound {
        secs,
        kernel,
        counted,
        peak_pids,
        peak_tracked,
        peak_entries,
        settle_secs,
        rss_after: rss_kib(e.pid()),
    }
}

/// Samples the exposition every 300 ms while the churn runs: the most distinct pid series and
/// the most tracked processes seen.
struct PeakSampler {
    stop: Arc<AtomicBool>,
    max_pids: Arc<AtomicUsize>,
    max_tracked: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<usize>,
}

impl PeakSampler {
    fn start(addr: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let max_pids = Arc::new(AtomicUsize::new(0));
        let max_tracked = Arc::new(AtomicUsize::new(0));
        let thread = {
            let addr = addr.to_string();
            let (stop, max_pids, max_tracked) =
                (stop.clone(), max_pids.clone(), max_tracked.clone());
            std::thread::spawn(move || {
                let mut samples = 0;
                while !stop.load(Ordering::Relaxed) {
                    let (status, body) = http_get(&addr, "/metrics");
                    assert_eq!(status, 200);
                    let m = Metrics::parse(&body);
                    max_pids.fetch_max(distinct_pids(&m).len(), Ordering::Relaxed);
                    max_tracked.fetch_max(
                        m.sum("bufscope_tracked_processes", &[]) as usize,
                        Ordering::Relaxed,
                    );
                    samples += 1;
                    std::thread::sleep(Duration::from_millis(300));
                }
                samples
            })
        };
        Self {
            stop,
            max_pids,
            max_tracked,
            thread,
        }
    }

    /// Stops sampling (it must have sampled at least 3 times); returns the peak pid series
    /// and the peak tracked processes.
    fn stop(self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        let samples = self.thread.join().unwrap();
        assert!(samples >= 3, "the sampler ran {samples} times");
        (
            self.max_pids.load(Ordering::Relaxed),
            self.max_tracked.load(Ordering::Relaxed),
        )
    }
}

/// A `churn` workload that printed `DONE`; still running, so its private network namespace
/// still exists.
struct Churn {
    w: Workload,
    /// Its network namespace inode.
    netns: u32,
    /// The `DONE` line.
    done: String,
}

impl Churn {
    /// A numeric field of the `DONE` line.
    fn field(&self, k: &str) -> u64 {
        self.done
            .split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} in {:?}", self.done))
    }
}

/// 5,000 processes, 4 at a time, in a new network namespace, each sending 20 datagrams to a
/// socket of its own with a 1-byte SO_RCVBUF; waits for all of them.
fn run_5000_short_lived_processes(comm: &str) -> Churn {
    let mut w = Workload::start(&[
        "churn",
        "--procs",
        "5000",
        "--parallel",
        "4",
        "--sends",
        "20",
        "--rcvbuf",
        "1",
        "--comm",
        comm,
        "--new-netns",
    ]);
    let netns = netns_of(w.pid());
    let done = w.wait_line("DONE", Duration::from_secs(600));
    Churn { w, netns, done }
}

/// The children's drops (their drops columns summed), checked against the private namespace's
/// `RcvbufErrors`: every child ran, reported, and dropped most of its datagrams.
fn kernel_drops_of_the_churn(churn: &Churn) -> u64 {
    assert_eq!(churn.field("failed"), 0, "{}", churn.done);
    assert_eq!(churn.field("reported"), 5000, "{}", churn.done);
    let kernel = churn.field("drops");
    // The namespace is private: its RcvbufErrors are exactly the children's drops.
    assert_eq!(
        snmp(churn.w.pid(), "Udp", "RcvbufErrors"),
        kernel,
        "sum of the children's drops columns vs the namespace's RcvbufErrors"
    );
    assert!(
        kernel >= 5000 * 10,
        "each child should drop most of its 20 datagrams: {kernel}"
    );
    kernel
}

/// `DROPS` entries of the churn's namespace right after it (must be well over 1,000).
fn assert_the_churn_was_in_the_drops_map(e: &Exporter, netns: u32) -> usize {
    let peak_entries = drops_entries_in_netns(e.pid(), netns);
    assert!(
        peak_entries > 1000,
        "the churn's sockets were in the DROPS map: {peak_entries}"
    );
    peak_entries
}

/// Waits until the drops counted since `base` reach the kernel's count for the churn (other
/// processes on the machine may add drops, never remove them); returns the count.
fn wait_until_the_churn_drops_are_counted(e: &Exporter, base: &Metrics, kernel: u64) -> f64 {
    let base_drops = base.sum(DROPS, &[]);
    eventually(Duration::from_secs(30), "the churn's drops", || {
        let d = e.scrape().sum(DROPS, &[]) - base_drops;
        (d >= kernel as f64).then_some(d)
    })
}

/// No BPF-side loss of any cause since `base`.
fn assert_no_bpf_side_losses_since(e: &Exporter, base: &Metrics) {
    let base_lost = lost(base);
    let after = e.scrape();
    for (cause, v) in lost(&after) {
        let before = base_lost.get(&cause).copied().unwrap_or(0.0);
        assert_eq!(
            v - before,
            0.0,
            "BPF-side losses ({cause}) during the churn"
        );
    }
}

/// At most `--max-processes` pid series and tracked processes at any sample.
fn assert_series_stayed_within_the_bound(peak_pids: usize, peak_tracked: usize, max: usize) {
    assert!(
        peak_pids <= max,
        "{peak_pids} identities with series > --max-processes {max}"
    );
    assert!(peak_tracked <= max, "{peak_tracked} tracked > {max}");
}

/// A new process after the churn is still seen (nothing is stuck).
fn assert_a_new_process_is_still_seen(e: &Exporter) {
    let probe = setsockopt("udp", "SO_RCVBUF", "65536");
    let probe_pid = probe.pid().to_string();
    eventually(
        Duration::from_secs(10),
        "a setsockopt after the churn",
        || {
            let m = e.scrape();
            (m.sum("bufscope_setsockopt_total", &[("pid", probe_pid.as_str())]) == 1.0)
                .then_some(())
        },
    );
    drop(probe);
}

/// Retention (4 s) and map GC (entries idle ≥ GC_IDLE, 3 s; every 2.5 s) remove the round: waits (up
/// to 150 s) until no `DROPS` entry of its namespace and no series of its comm is left;
/// returns how long that took, in seconds.
fn wait_for_retention_and_map_gc_to_remove_the_round(e: &Exporter, netns: u32, comm: &str) -> f64 {
    let settle = Instant::now();
    let deadline = settle + Duration::from_secs(150);
    loop {
        let entries = drops_entries_in_netns(e.pid(), netns);
        let series = e
            .scrape()
            .samples
            .iter()
            .filter(|s| s.labels.get("comm").map(String::as_str) == Some(comm))
            .count();
        if entries == 0 && series == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 150 s: {entries} DROPS entries of the churn's namespace, {series} {comm} \
             series left"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    settle.elapsed().as_secs_f64()
}

/// Two rounds of 5,000 short-lived processes (socket, SO_RCVBUF, 20 datagrams to itself →
/// drops, close, exit): every drop counted, no BPF map fills, at most `--max-processes`
/// series at any time, the churn's series and `DROPS` entries (read with bpftool) gone after
/// the retention window and map GC, and memory does not grow from one round to the next.
/// Other processes on the machine may come and go meanwhile: the checks look at the churn's
/// own comm and network namespace.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn churn_of_5000_processes_stays_bounded_and_memory_returns_to_baseline() {
    const MAX: usize = 100;
    let e = Exporter::start_env(
        &[GC_IDLE],
        &[
            "--max-processes",
            "100",
            "--retention",
            "4s",
            "--drops.attribution-hold",
            "2s",
        ],
    );
    std::thread::sleep(Duration::from_secs(2));
    let _ = e.scrape();
    let base_rss = rss_kib(e.pid());
    let one = churn_round(&e, MAX, "bsp-churn-1");
    let two = churn_round(&e, MAX, "bsp-churn-2");
    let three = churn_round(&e, MAX, "bsp-churn-3");
    let folded = e.scrape().sum("bufscope_folded_processes_total", &[]);
    assert!(
        folded >= (3 * (5000 - MAX)) as f64,
        "the bound was exercised: {folded} folded"
    );
    // The allocator keeps part of what the first rounds made it reserve (fragmentation: its
    // high-water mark, reached by the second round in a debug build under nextest — measured
    // 47.5 -> 72.6 -> 75.2 MiB after rounds 1, 2, 3); a third round of 5,000 processes must
    // not add a comparable amount again (the state itself is back to empty: checked above).
    // 16 MiB over 5,000 processes would be a leak of > 3 KiB per process, which every round
    // would show (remembering every gone socket's findings did: +50 MiB a round).
    assert!(
        three.rss_after <= two.rss_after + 16 * 1024,
        "RSS grew from {} KiB after round 2 to {} KiB after round 3 (round 1: {} KiB, start \
         {base_rss} KiB)",
        two.rss_after,
        three.rss_after,
        one.rss_after
    );
    for (n, r) in [(1, &one), (2, &two), (3, &three)] {
        eprintln!(
            "churn round {n}: 5000 processes in {:.1} s, kernel drops {} (= the namespace's \
             RcvbufErrors), bufscope counted ≥ {}; peak {} pid series / {} tracked (bound \
             {MAX}); no BPF map/ring losses; {} DROPS entries of the round's namespace, 0 and \
             no series {:.0} s later; RSS after {} KiB",
            r.secs,
            r.kernel,
            r.counted,
            r.peak_pids,
            r.peak_tracked,
            r.peak_entries,
            r.settle_secs,
            r.rss_after
        );
    }
    eprintln!(
        "churn: {folded} processes folded into _other; RSS {base_rss} KiB at start, {} after \
         round 1, {} after round 2",
        one.rss_after, two.rss_after
    );
}

// ---------------------------------------------------------------------------------------------
// Restart
// ---------------------------------------------------------------------------------------------

/// `kill -9` during a flood, then start again: the dead instance's programs and links are
/// gone (the kernel frees them with its fds), the new one attaches all probes, its counters
/// start from 0 (a counter reset, which Prometheus' rate() handles) and never include drops
/// from before it started, and it is exact from then on.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn kill_9_during_a_flood_then_restart_is_clean() {
    let recv = Workload::start(&["udp-recv", "--rcvbuf", "4096"]);
    let port = recv.get("ports").to_string();
    let pid = recv.pid().to_string();
    let labels = [("pid", pid.as_str()), ("reason", "SOCKET_RCVBUFF")];
    let col = || kernel_drops(&recv);

    let e1 = Exporter::start(&[]);
    let progs1 = held_bpf_ids(e1.pid(), "prog_id:");
    let links1 = held_bpf_ids(e1.pid(), "link_id:");
    // One program per default probe: kfree_skb, cgroup_setsockopt, inet_sock_set_state,
    // tcp_rcvbuf_grow, cgroup_sock_create (6 on the syscall-tracepoint fallback).
    assert!(progs1.len() >= 5, "programs held: {progs1:?}");

    // A long flood; kill the exporter in the middle of it.
    let flood = Workload::start(&[
        "udp-flood",
        "--port",
        &port,
        "--count",
        "5000000",
        "--size",
        "16",
    ]);
    let a = eventually(Duration::from_secs(20), "first instance counting", || {
        let v = e1.scrape().sum(DROPS, &labels);
        (v > 10_000.0).then_some(v)
    });
    e1.kill9();
    let at_kill = col();
    let e2 = Exporter::start(&[]);
    let at_restart = col();

    // The dead instance left nothing behind.
    let leaked = eventually(
        Duration::from_secs(10),
        "the dead instance's objects to go",
        || {
            let p: Vec<u32> = progs1
                .iter()
                .copied()
                .filter(|i| bpf_exists("prog", *i))
                .collect();
            let l: Vec<u32> = links1
                .iter()
                .copied()
                .filter(|i| bpf_exists("link", *i))
                .collect();
            (p.is_empty() && l.is_empty()).then_some((p, l))
        },
    );
    let progs2 = held_bpf_ids(e2.pid(), "prog_id:");
    let links2 = held_bpf_ids(e2.pid(), "link_id:");
    assert_eq!(progs2.len(), progs1.len(), "{progs2:?} vs {progs1:?}");
    assert_eq!(links2.len(), links1.len(), "{links2:?} vs {links1:?}");
    assert!(progs2.is_disjoint(&progs1));
    assert_all_attached(&e2.scrape(), &e2.log());
    assert!(
        !e2.log().contains("could not attach"),
        "clean attach:\n{}",
        e2.log()
    );

    // Counters during the rest of the flood: monotonic from a fresh start.
    let mut series = Vec::new();
    while !flood_done(&flood) {
        series.push(e2.scrape().sum(DROPS, &labels));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(flood.wait(), "flooder failed");
    let end = col();
    let b = eventually(Duration::from_secs(20), "the counter to settle", || {
        let v1 = e2.scrape().sum(DROPS, &labels);
        std::thread::sleep(Duration::from_millis(1200));
        let v2 = e2.scrape().sum(DROPS, &labels);
        (v1 == v2).then_some(v2)
    });
    series.push(b);
    assert!(
        series.windows(2).all(|w| w[0] <= w[1]),
        "monotonic after restart: {series:?}"
    );
    assert!(b > 0.0, "the new instance counted the rest of the flood");
    // Counters do not survive a restart: the new instance only counts what happened after
    // it attached (≤ drops since the kill), and the two instances together never exceed the
    // kernel's count (nothing counted twice across the restart).
    assert!(
        b <= (end - at_kill) as f64,
        "new instance {b} > drops after the kill {}",
        end - at_kill
    );
    assert!(a + b <= (end) as f64, "{a} + {b} > kernel {end}");
    // Prometheus increase() over the whole window: first instance's last value plus the new
    // series (a reset). Missing = drops while no instance was attached (plus the first
    // instance's last poll interval).
    let increase = a + b;
    eprintln!(
        "restart: kernel {end} drops; instance 1 counted {a} (then kill -9 at kernel {at_kill}); \
         instance 2 started at kernel {at_restart} and counted {b} from 0; increase() = {increase} \
         ({} not seen while restarting); leaked progs/links after restart: {:?}/{:?}; {} programs \
         and {} links before and after",
        end as f64 - increase,
        leaked.0,
        leaked.1,
        progs2.len(),
        links2.len()
    );

    // Exact again once running.
    let k0 = col();
    let c0 = e2.scrape().sum(DROPS, &labels);
    assert!(Workload::start(&["udp-flood", "--port", &port, "--count", "20000"]).wait());
    let want = c0 + (col() - k0) as f64;
    let got = wait_equal(Duration::from_secs(20), "drops after restart", want, || {
        e2.scrape().sum(DROPS, &labels)
    });
    eprintln!(
        "after restart: +{} kernel / +{} bufscope",
        col() - k0,
        got - c0
    );
}

/// True once a `udp-flood` printed its `SENT` line (it is about to exit).
fn flood_done(w: &Workload) -> bool {
    // The workload exits right after sending; /proc/<pid> lingers as a zombie until reaped,
    // so look at its state.
    std::fs::read_to_string(format!("/proc/{}/stat", w.pid()))
        .map(|s| {
            s.rfind(')')
                .and_then(|i| s[i + 2..].chars().next())
                .is_none_or(|st| st == 'Z' || st == 'X')
        })
        .unwrap_or(true)
}

// ---------------------------------------------------------------------------------------------
// Hostile input
// ---------------------------------------------------------------------------------------------

/// A directory chain created with `mkdirat` one level at a time (total paths may exceed
/// PATH_MAX); removed deepest first when dropped.
struct DeepDir {
    root: PathBuf,
    names: Vec<String>,
}

impl DeepDir {
    fn create(root: &Path, names: Vec<String>) -> Self {
        std::fs::create_dir(root).unwrap();
        let d = Self {
            root: root.to_path_buf(),
            names,
        };
        let mut dir = open_dir(&d.root);
        for n in &d.names {
            let c = std::ffi::CString::new(n.as_str()).unwrap();
            // SAFETY: dir is an open directory fd; c is NUL-terminated.
            let rc = unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) };
            assert_eq!(rc, 0, "mkdirat {n}: {}", std::io::Error::last_os_error());
            dir = open_at(&dir, n);
        }
        d
    }

    /// The names below the root, `/`-separated (for `bufscope-workload in-cgroup --chain`).
    fn chain(&self) -> String {
        self.names.join("/")
    }

    /// Length of the deepest path relative to the cgroup2 mount.
    fn depth_chars(&self, mount: &Path) -> usize {
        let rel = self.root.strip_prefix(mount).unwrap().display().to_string();
        1 + rel.len() + self.names.iter().map(|n| n.len() + 1).sum::<usize>()
    }
}

fn open_dir(p: &Path) -> OwnedFd {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: c is NUL-terminated; the fd is owned by the returned OwnedFd.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY) };
    assert!(
        fd >= 0,
        "open {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    // SAFETY: fd was just opened and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn open_at(dir: &OwnedFd, name: &str) -> OwnedFd {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: dir is an open directory fd; c is NUL-terminated.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_DIRECTORY | libc::O_RDONLY,
        )
    };
    assert!(
        fd >= 0,
        "openat {name}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: fd was just opened and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

impl Drop for DeepDir {
    fn drop(&mut self) {
        let mut fds = vec![open_dir(&self.root)];
        for n in &self.names {
            let c = std::ffi::CString::new(n.as_str()).unwrap();
            let last = fds.last().unwrap().as_raw_fd();
            // SAFETY: last is an open directory fd; c is NUL-terminated.
            let fd = unsafe { libc::openat(last, c.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY) };
            if fd < 0 {
                break;
            }
            // SAFETY: fd was just opened.
            fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        for (i, n) in self.names.iter().enumerate().rev() {
            if let Some(parent) = fds.get(i) {
                let c = std::ffi::CString::new(n.as_str()).unwrap();
                // SAFETY: parent is an open directory fd; c is NUL-terminated.
                unsafe { libc::unlinkat(parent.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) };
            }
        }
        drop(fds);
        let _ = std::fs::remove_dir(&self.root);
    }
}

/// The cgroup v2 mount (`/sys/fs/cgroup/unified` here, `/sys/fs/cgroup` on unified hosts).
fn cgroup2_mount() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    mounts
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .expect("a cgroup2 mount")
}

/// Processes in cgroups nested about 4,000 characters deep (a container-id-like leaf), and
/// deeper than PATH_MAX (the kernel refuses to print the path in /proc/<pid>/cgroup): their
/// setsockopt calls are counted, the container label is right or empty, the exposition stays
/// valid and memory bounded.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn very_long_cgroup_paths() {
    require_root();
    let mount = cgroup2_mount();
    let e = Exporter::start(&[]);
    let base_rss = rss_kib(e.pid());
    let id = "d1e2a3d4b5e6e7f8d1e2a3d4b5e6e7f8d1e2a3d4b5e6e7f8d1e2a3d4b5e6e7f8";
    let long_name = |i: usize| format!("bsp-rel-{i:03}-{}", "x".repeat(230));
    // Just under PATH_MAX: 16 levels of 243 characters, leaf docker-<id>.scope.
    let mut names: Vec<String> = (0..16).map(long_name).collect();
    names.push(format!("docker-{id}.scope"));
    let near = DeepDir::create(
        &mount.join(format!("bsp-rel-near-{}", std::process::id())),
        names,
    );
    // Beyond PATH_MAX: 20 levels.
    let far = DeepDir::create(
        &mount.join(format!("bsp-rel-far-{}", std::process::id())),
        (0..20).map(long_name).collect(),
    );
    let mut results = Vec::new();
    for (d, want_container) in [(&near, id), (&far, "")] {
        let (bin, root, chain) = (
            workload_bin().display().to_string(),
            d.root.display().to_string(),
            d.chain(),
        );
        let w = Workload::start_wrapped(
            &[&bin, "in-cgroup", "--root", &root, "--chain", &chain, "--"],
            &["hold-comm", "--comm", "bsp-deep-cg"],
        );
        let pid = w.pid();
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup"));
        // The process's own row (both runs share the name; each place is its own identity).
        let row = eventually(Duration::from_secs(15), "the deep-cgroup process", || {
            e.processes()
                .into_iter()
                .find(|r| r.pid_number() == Some(pid) && r.setsockopt == 1)
        });
        assert_eq!(row.comm, "bsp-deep-cg");
        assert_eq!(row.container, want_container, "container of the process");
        let want = [("comm", "bsp-deep-cg"), ("container", want_container)];
        let m = eventually(Duration::from_secs(15), "its identity's series", || {
            let m = e.scrape();
            (m.sum("bufscope_setsockopt_total", &want) == 1.0).then_some(m)
        });
        let s = m.find("bufscope_setsockopt_total", &want).next().unwrap();
        assert_eq!(s.labels["container"], want_container, "container label");
        let (ok, msg) = promtool_check_metrics(&e.scrape_text());
        assert!(ok, "promtool:\n{msg}");
        results.push(format!(
            "{} chars deep: /proc/<pid>/cgroup {}; container=\"{}\"",
            d.depth_chars(&mount),
            match &cg {
                Ok(c) => format!("{} bytes", c.len()),
                Err(err) => format!("unreadable ({err})"),
            },
            s.labels["container"]
        ));
        drop(w);
    }
    let rss = rss_kib(e.pid());
    assert!(rss < base_rss + 16 * 1024, "RSS {base_rss} → {rss} KiB");
    eprintln!(
        "long cgroup paths: {}; RSS {base_rss} → {rss} KiB",
        results.join("; ")
    );
}

/// 100 scrapes at the same instant from one client: its share (16 served, 64 queued) is
/// answered with a complete, valid exposition, the rest with 503 and a retry.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn a_hundred_concurrent_scrapes() {
    let e = Exporter::start(&[]);
    let _load = Workload::start(&["udp-recv", "--rcvbuf", "4096", "--count", "4"]);
    let _ = e.scrape();
    let base_rss = rss_kib(e.pid());
    let barrier = Arc::new(Barrier::new(100));
    let started = Instant::now();
    let handles: Vec<_> = (0..100)
        .map(|_| {
            let (addr, barrier) = (e.addr.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let t = Instant::now();
                let (status, body) = http_get(&addr, "/metrics");
                (status, body, t.elapsed())
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let wall = started.elapsed();
    let mut slowest = Duration::ZERO;
    // One client (one source address) has MAX_IN_FLIGHT (16) requests served and
    // CLIENT_QUEUED (64) waiting at most: the rest are told to retry, never dropped silently.
    let mut served = 0;
    for (status, body, took) in &results {
        if *status == 503 {
            assert!(body.contains("of one client): retry"), "{body}");
            continue;
        }
        assert_eq!(*status, 200, "{body}");
        assert!(body.contains("bufscope_build_info{"), "truncated body");
        assert!(body.ends_with('\n'), "truncated body");
        slowest = slowest.max(*took);
        served += 1;
    }
    assert!(served >= 16 + 64, "only {served} of 100 served");
    let last = results
        .iter()
        .rev()
        .find(|r| r.0 == 200)
        .map(|r| r.1.clone());
    let (ok, msg) = promtool_check_metrics(&last.unwrap_or_default());
    assert!(ok, "promtool:\n{msg}");
    let rss = rss_kib(e.pid());
    assert!(rss < base_rss + 16 * 1024, "RSS {base_rss} → {rss} KiB");
    eprintln!(
        "100 concurrent scrapes from one client: {served} served and valid, the rest told to \
         retry; slowest {slowest:?}, wall {wall:?}, RSS {base_rss} → {rss} KiB"
    );
}

/// Hundreds of clients that send a request header one byte at a time (slowloris) do not stop
/// bufscope from answering everyone else, and do not grow its memory without bound.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn slowloris_clients_do_not_block_scrapes() {
    let e = Exporter::start(&[]);
    let before = rss_kib(e.pid());
    let stop = Arc::new(AtomicBool::new(false));
    let open = Arc::new(AtomicUsize::new(0));
    let mut conns: Vec<TcpStream> = Vec::new();
    for _ in 0..500 {
        let mut s = TcpStream::connect(&e.addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        conns.push(s);
    }
    let conns = Arc::new(Mutex::new(conns));
    let dripper = {
        let (conns, stop, open) = (conns.clone(), stop.clone(), open.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let mut c = conns.lock().unwrap();
                // One more header byte on every connection each second; count who is still open.
                let alive = c
                    .iter_mut()
                    .map(|s| s.write_all(b"X").is_ok())
                    .filter(|ok| *ok)
                    .count();
                open.store(alive, Ordering::Relaxed);
                drop(c);
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let mut worst = Duration::ZERO;
    for _ in 0..10 {
        let t = Instant::now();
        let (status, body) = http_get(&e.addr, "/metrics");
        assert_eq!(status, 200, "scrape during slowloris: {body}");
        assert!(body.contains("bufscope_build_info{"));
        worst = worst.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(500));
    }
    let (status, _) = http_get(&e.addr, "/healthz");
    assert_eq!(status, 200);
    let still_open = open.load(Ordering::Relaxed);
    let during = rss_kib(e.pid());
    stop.store(true, Ordering::Relaxed);
    dripper.join().unwrap();
    drop(conns);
    assert!(
        during < before + 32 * 1024,
        "RSS {during} KiB with 500 slow clients vs {before} KiB"
    );
    eprintln!(
        "slowloris: 500 slow clients ({still_open} still open after ~6 s of dripping): 10/10 \
         scrapes answered, slowest {worst:?}; RSS {before} → {during} KiB"
    );
}

/// A run that must fail: exit code, one clear line naming the problem, no panic.
fn assert_refused(args: &[&str], code: i32, needles: &[&str]) -> String {
    let o = Command::new(bufscope_bin())
        .args(["run", "--web.listen-address", "127.0.0.1:0"])
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(
        o.status.code(),
        Some(code),
        "{args:?}: exit code; stderr:\n{err}"
    );
    assert!(!err.contains("panicked"), "{args:?}: panic:\n{err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: stderr lacks {n:?}:\n{err}");
    }
    err
}

/// Malformed numbers, paths and files beyond what tests/cli.rs covers: usage errors (2) or
/// one-line run-time errors (1) naming the flag or file, never a panic.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn malformed_flags_and_files_are_clear_errors() {
    require_root();
    let dir = std::env::temp_dir().join(format!("bsp-rel-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    struct Rm(PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _rm = Rm(dir.clone());
    let garbage = dir.join("garbage.btf");
    std::fs::write(&garbage, [0x7fu8, 0x45, 0x4c, 0x46, 0, 1, 2, 3]).unwrap();
    let bad_yaml = dir.join("web.yml");
    std::fs::write(&bad_yaml, "tls_server_config: [unclosed\n\0\x01").unwrap();
    let g = garbage.display().to_string();
    let y = bad_yaml.display().to_string();
    let cases: Vec<(Vec<&str>, i32, Vec<&str>)> = vec![
        (vec!["--max-processes", "lots"], 2, vec!["--max-processes"]),
        (vec!["--max-processes", "-5"], 2, vec!["-5"]),
        (
            vec!["--drops.map-entries", "99999999999"],
            2,
            vec!["--drops.map-entries"],
        ),
        (
            vec!["--poll-interval", "1fortnight"],
            2,
            vec!["invalid duration"],
        ),
        (vec!["--log.level", "loud"], 2, vec!["--log.level"]),
        (
            vec!["--web.telemetry-path", "metrics"],
            1,
            vec!["--web.telemetry-path"],
        ),
        (vec!["--kernel.btf-path", &g], 1, vec!["BTF", &g]),
        (vec!["--kernel.btf-path", "/tmp"], 1, vec!["BTF", "/tmp"]),
        (vec!["--web.config.file", &y], 1, vec!["--web.config.file"]),
        (
            vec!["--web.config.file", "/nonexistent/web.yml"],
            1,
            vec!["--web.config.file"],
        ),
        (
            vec!["--config.file", "/nonexistent/bufscope.yaml"],
            1,
            vec!["--config.file"],
        ),
    ];
    for (args, code, needles) in &cases {
        let err = assert_refused(args, *code, needles);
        if *code == 1 {
            let lines: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
            assert_eq!(lines.len(), 1, "{args:?}: one error line:\n{err}");
        }
    }
    eprintln!(
        "{} malformed inputs refused with a clear message, none panicked",
        cases.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Least privilege
// ---------------------------------------------------------------------------------------------

/// The four capabilities the DaemonSet grants, as setpriv spells them.
const CAPS: [&str; 4] = ["bpf", "perfmon", "sys_ptrace", "dac_read_search"];

/// `bufscope run` as uid/gid 65534 with exactly `caps` (bounding, inheritable, ambient: the
/// setcap/systemd `AmbientCapabilities=` way to run it without root).
struct Unprivileged {
    child: Child,
    addr: Option<String>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Unprivileged {
    fn start(caps: &[&str]) -> Self {
        let set = std::iter::once("-all".to_string())
            .chain(caps.iter().map(|c| format!("+{c}")))
            .collect::<Vec<_>>()
            .join(",");
        let mut child = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                &format!("--inh-caps={set}"),
                &format!("--ambient-caps={set}"),
                &format!("--bounding-set={set}"),
                "--",
            ])
            .arg(bufscope_bin())
            .args(["run", "--web.listen-address", "127.0.0.1:0"])
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut r = std::io::BufReader::new(stderr);
                let mut line = String::new();
                while {
                    line.clear();
                    std::io::BufRead::read_line(&mut r, &mut line).unwrap_or(0) > 0
                } {
                    let l = line.trim_end().to_string();
                    if let Some(rest) = l.split("serving metrics on ").nth(1) {
                        let a = rest.split("://").nth(1).unwrap_or("").split('/').next();
                        let _ = tx.send(a.unwrap_or("").to_string());
                    }
                    log.lock().unwrap().push(l);
                }
            })
        };
        let addr = rx.recv_timeout(Duration::from_secs(60)).ok();
        Self { child, addr, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    fn scrape(&self) -> Metrics {
        let (status, body) = http_get(self.addr.as_ref().unwrap(), "/metrics");
        assert_eq!(status, 200, "{body}");
        Metrics::parse(&body)
    }

    /// Waits for it to exit by itself (a refused start); returns its exit code.
    fn exit_code(&mut self) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                // Give the log reader a moment to collect the last line.
                std::thread::sleep(Duration::from_millis(200));
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Unprivileged {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

/// The capability sets of `pid` (`CapEff`, `CapPrm`) and its real uid.
fn caps_and_uid(pid: u32) -> (u64, u64, u32) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hex = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
            .unwrap()
    };
    let uid = s
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    (hex("CapEff:"), hex("CapPrm:"), uid)
}

/// Not root, exactly CAP_BPF + CAP_PERFMON + CAP_SYS_PTRACE + CAP_DAC_READ_SEARCH: every probe
/// attaches; drops on sockets of another user's processes — one created before bufscope
/// started (found through /proc/<pid>/fd) and one after (found by the owner probe) — equal
/// the kernel's drops columns, and that user's setsockopt calls are counted.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn runs_as_an_unprivileged_user_with_exactly_four_capabilities() {
    require_root();
    let other = [
        "setpriv",
        "--reuid=65533",
        "--regid=65533",
        "--clear-groups",
        "--",
    ];
    let before = Workload::start_wrapped(&other, &["udp-recv", "--rcvbuf", "4096"]);
    let b = Unprivileged::start(&CAPS);
    assert!(b.addr.is_some(), "did not start:\n{}", b.log());
    let (eff, prm, uid) = caps_and_uid(b.child.id());
    let want: u64 = (1 << 39) | (1 << 38) | (1 << 19) | (1 << 2);
    assert_eq!(uid, 65534, "runs as nobody");
    assert_eq!(eff, want, "CapEff {eff:x}");
    assert_eq!(prm, want, "CapPrm {prm:x}");
    assert_all_attached(&b.scrape(), &b.log());

    let after = Workload::start_wrapped(&other, &["udp-recv", "--rcvbuf", "4096"]);
    let opt = setsockopt_wrapped(&other, "udp", "SO_RCVBUF", "65536");
    let mut figures = Vec::new();
    for (what, r) in [
        ("created before bufscope", &before),
        ("created after", &after),
    ] {
        let port = r.get("ports").to_string();
        let k0 = kernel_drops(r);
        assert!(Workload::start(&["udp-flood", "--port", &port, "--count", "3000"]).wait());
        let want = (kernel_drops(r) - k0) as f64;
        assert!(want > 1000.0, "the flood overflowed the buffer: {want}");
        let pid = r.pid().to_string();
        let got = wait_equal(Duration::from_secs(30), what, want, || {
            b.scrape().sum(DROPS, &[("pid", pid.as_str())])
        });
        figures.push(format!("{what}: kernel {want} / bufscope {got}"));
    }
    let opt_pid = opt.pid().to_string();
    eventually(
        Duration::from_secs(10),
        "the other user's setsockopt",
        || {
            (b.scrape()
                .sum("bufscope_setsockopt_total", &[("pid", opt_pid.as_str())])
                == 1.0)
                .then_some(())
        },
    );
    eprintln!(
        "uid 65534 with CapEff {eff:x} (BPF, PERFMON, SYS_PTRACE, DAC_READ_SEARCH): uid 65533's \
         sockets {}; its setsockopt counted",
        figures.join(", ")
    );
}

/// The same unprivileged user with one of CAP_BPF / CAP_PERFMON taken away: bufscope refuses
/// to start, and its one-line error names exactly the missing capability.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn a_missing_capability_is_named() {
    require_root();
    for (missing, name, other) in [
        ("bpf", "CAP_BPF", "CAP_PERFMON"),
        ("perfmon", "CAP_PERFMON", "CAP_BPF"),
    ] {
        let caps: Vec<&str> = CAPS.iter().copied().filter(|c| *c != missing).collect();
        let mut b = Unprivileged::start(&caps);
        assert!(b.addr.is_none(), "started without {name}:\n{}", b.log());
        let code = b.exit_code();
        assert_eq!(code, Some(1), "exit code without {name}:\n{}", b.log());
        let log = b.log();
        let err: Vec<&str> = log.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(err.len(), 1, "one error line:\n{log}");
        let listed = err[0]
            .split("missing capabilities ")
            .nth(1)
            .and_then(|r| r.split(':').next())
            .unwrap_or_else(|| panic!("no list of missing capabilities: {}", err[0]));
        assert_eq!(
            listed, name,
            "names exactly the missing one (not {other}): {}",
            err[0]
        );
        assert!(!log.contains("panicked"));
        eprintln!("without {name}: {}", err[0]);
    }
}
