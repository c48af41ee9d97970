//! `/metrics` is valid Prometheus exposition (`promtool check metrics`), including for
//! processes whose `comm` is hostile text; probes degrade one by one. (That every scrape
//! shows the kernel's count, in both formats, is `scrape_truth.rs`.)
#![allow(clippy::unwrap_used)]

use bufscope_integration::node::{Bpffs, in_mount_namespace};
use std::time::Duration;

use bufscope_integration::{Exporter, Workload, eventually, promtool_check_metrics};

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn promtool_accepts_metrics_with_a_hostile_comm() {
    let e = Exporter::start(&[]);
    // quotes, a backslash and a newline in the process name
    let w = Workload::start(&["hold-comm", "--comm", "q\"b\\\\s\\nnl"]);
    let pid = w.pid().to_string();
    let kernel_comm = std::fs::read(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(
        kernel_comm, b"q\"b\\s\nnl\n",
        "the kernel holds the hostile name"
    );
    let m = eventually(Duration::from_secs(10), "the process to appear", || {
        let m = e.scrape();
        (m.sum("bufscope_setsockopt_total", &[("pid", pid.as_str())]) == 1.0).then_some(m)
    });
    let want = [("pid", pid.as_str())];
    let s = m.find("bufscope_setsockopt_total", &want).next().unwrap();
    assert_eq!(
        s.labels["comm"], "q\"b\\s\nnl",
        "label round-trips to the kernel's comm"
    );
    let (ok, msg) = promtool_check_metrics(&e.scrape_text());
    assert!(ok, "promtool check metrics failed:\n{msg}");
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn promtool_accepts_every_comm_byte() {
    // Room in the series budget for every name, whatever else runs on this machine.
    let e = Exporter::start(&["--max-series", "100000"]);
    let calls = || {
        bufscope_integration::Metrics::parse(&e.scrape_text())
            .find("bufscope_setsockopt_total", &[])
            .count()
    };
    let before = calls();
    // Bytes 0x01..=0xff in 15-byte comms (the kernel keeps 15 + NUL).
    let mut workers = Vec::new();
    // Names as bufscope labels them (invalid UTF-8 replaced): names that only differ in
    // invalid bytes are one program.
    let mut labels = std::collections::BTreeSet::new();
    let mut b = 1u32;
    while b <= 0xff {
        let raw: Vec<u8> = (b..(b + 15).min(0x100)).map(|x| x as u8).collect();
        labels.insert(String::from_utf8_lossy(&raw).into_owned());
        let name: String = (b..(b + 15).min(0x100))
            .map(|x| format!("\\x{x:02x}"))
            .collect();
        workers.push(Workload::start(&["hold-comm", "--comm", &name]));
        b += 15;
    }
    let pids: Vec<u32> = workers.iter().map(|w| w.pid()).collect();
    // Each process counted its call (the per-process detail: its series carry its name, which
    // a test cannot compare byte for byte once escaped), then every name is in the scrape.
    eventually(Duration::from_secs(15), "every process to appear", || {
        let rows = e.processes();
        pids.iter()
            .all(|p| {
                rows.iter()
                    .any(|r| r.pid_number() == Some(*p) && r.setsockopt == 1)
            })
            .then_some(())
    });
    // A series per name (identities are admitted at the scrape after they appear).
    eventually(Duration::from_secs(15), "a series per name", || {
        (calls() >= before + labels.len()).then_some(())
    });
    let text = e.scrape_text();
    let (ok, msg) = promtool_check_metrics(&text);
    assert!(ok, "promtool check metrics failed:\n{msg}");
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn a_disabled_probe_reports_zero_and_the_rest_keep_working() {
    let e = Exporter::start(&["--probe.disable", "owners,autotune"]);
    let m = e.scrape();
    let attached = |p: &str| m.sum("bufscope_probe_attached", &[("probe", p)]);
    assert_eq!(attached("owners"), 0.0);
    assert_eq!(attached("autotune"), 0.0);
    assert_eq!(attached("drops"), 1.0);
    assert_eq!(attached("setsockopt"), 1.0);
    assert_eq!(attached("tcp_state"), 1.0);
    // Drops are still attributed (through /proc, since the owner hooks are off).
    let r = Workload::start(&["udp-recv", "--rcvbuf", "4096"]);
    let port = r.get("ports").to_string();
    let inode: u64 = r.get("inodes").parse().unwrap();
    assert!(Workload::start(&["udp-flood", "--port", &port, "--count", "3000"]).wait());
    let kernel = bufscope_integration::proc_udp_drops(r.pid(), inode).unwrap() as f64;
    let pid = r.pid().to_string();
    eventually(Duration::from_secs(10), "drops", || {
        let v = e
            .scrape()
            .sum("bufscope_socket_drops_total", &[("pid", pid.as_str())]);
        (v == kernel).then_some(())
    });
    let build = e.scrape().sum("bufscope_build_info", &[]);
    assert_eq!(build, 1.0);
}

/// Fields of `/proc/<pid>/stat` after the `(comm)`, numbered as in proc(5) (the first is 3).
fn stat_field(stat: &str, n: usize) -> u64 {
    let rest = stat.rsplit_once(')').unwrap().1;
    rest.split_ascii_whitespace()
        .nth(n - 3)
        .unwrap()
        .parse()
        .unwrap()
}

fn sysconf(name: libc::c_int) -> u64 {
    // SAFETY: reads a constant of the C library.
    u64::try_from(unsafe { libc::sysconf(name) }).unwrap()
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn the_process_metrics_are_the_kernels_figures_for_the_bufscope_process() {
    let e = Exporter::start(&[]);
    let pid = e.pid();
    let hz = sysconf(libc::_SC_CLK_TCK) as f64;
    let page = sysconf(libc::_SC_PAGESIZE);
    let btime: u64 = std::fs::read_to_string("/proc/stat")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let stat = || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count() as f64
    };
    // A scrape between two reads of the kernel's figures, until the memory figures did not
    // move across it (the scrape itself may map a new arena or thread stack).
    let (before, m, after) = eventually(Duration::from_secs(20), "a steady scrape", || {
        let before = stat();
        let m = e.scrape();
        let after = stat();
        (stat_field(&before, 23) == stat_field(&after, 23)
            && stat_field(&before, 24) == stat_field(&after, 24))
        .then_some((before, m, after))
    });
    let cpu = |s: &str| (stat_field(s, 14) + stat_field(s, 15)) as f64 / hz;
    let v = |name: &str| m.sum(name, &[]);
    assert!(
        cpu(&before) <= v("process_cpu_seconds_total")
            && v("process_cpu_seconds_total") <= cpu(&after),
        "cpu {} within the kernel's {} ..= {}",
        v("process_cpu_seconds_total"),
        cpu(&before),
        cpu(&after)
    );
    assert_eq!(
        v("process_virtual_memory_bytes"),
        stat_field(&after, 23) as f64,
        "vsize"
    );
    // The scrape allocates while it reads: its own buffers bound the difference.
    let rss = stat_field(&after, 24) as f64 * page as f64;
    assert!(
        (v("process_resident_memory_bytes") - rss).abs() <= 4.0 * 1024.0 * 1024.0,
        "rss {} vs the kernel's {rss}",
        v("process_resident_memory_bytes")
    );
    let start = btime as f64 + stat_field(&after, 22) as f64 / hz;
    assert!(
        (v("process_start_time_seconds") - start).abs() < 0.01,
        "start {} vs {start}",
        v("process_start_time_seconds")
    );
    // The scrape's own connection and the directory being listed come and go.
    let open = v("process_open_fds");
    let now = fds();
    assert!(
        (open - now).abs() <= 4.0,
        "open fds {open} vs ls /proc/{pid}/fd: {now}"
    );
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let soft: f64 = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_ascii_whitespace()
        .nth(3)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(v("process_max_fds"), soft, "soft RLIMIT_NOFILE");
    // One poll duration per running signal room, named as its probe (the owners probe is
    // attribution's, read by it, not a room that polls). Kernel WireGuard's room also runs
    // while its hook waits for the module (`--wireguard.queue-drops auto`: attached by the
    // room when the module loads; its probe is then not listed as configured).
    let mut polled: Vec<String> = m
        .find("bufscope_signal_poll_duration_seconds", &[])
        .map(|s| s.labels["signal"].clone())
        .collect();
    polled.sort();
    let mut attached: Vec<String> = m
        .find("bufscope_probe_attached", &[])
        .filter(|s| s.value == 1.0 && s.labels["probe"] != "owners")
        .map(|s| s.labels["probe"].clone())
        .collect();
    if polled.iter().any(|p| p == "wireguard")
        && m.find("bufscope_probe_attached", &[("probe", "wireguard")])
            .next()
            .is_none()
    {
        attached.push("wireguard".into());
    }
    attached.sort();
    assert_eq!(polled, attached);
    eprintln!(
        "bufscope pid {pid}: cpu {} s (kernel {}..={}), vsize {} (kernel {}), rss {} (kernel {rss}), \
         start {} (kernel {start}), fds {open} (ls {now}), max fds {soft}",
        v("process_cpu_seconds_total"),
        cpu(&before),
        cpu(&after),
        v("process_virtual_memory_bytes"),
        stat_field(&after, 23),
        v("process_resident_memory_bytes"),
        v("process_start_time_seconds"),
    );
    let (ok, msg) = promtool_check_metrics(&e.scrape_text());
    assert!(ok, "promtool check metrics failed:\n{msg}");
}

/// `run_cnt` and `run_time_ns` of BPF program `id`, as bpftool reads them from the kernel.
fn bpftool_run_stats(id: u32) -> (u64, u64) {
    let (ok, out, err) = bufscope_integration::output(
        std::process::Command::new("bpftool").args(["prog", "show", "id", &id.to_string()]),
        "",
    );
    assert!(ok, "bpftool prog show id {id}: {err}");
    let toks: Vec<&str> = out.split_whitespace().collect();
    let after = |key: &str| -> u64 {
        toks.iter()
            .position(|t| *t == key)
            .and_then(|i| toks.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (after("run_cnt"), after("run_time_ns"))
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn run_stats_are_the_kernels_run_count_and_time_of_bufscopes_programs() {
    // Without the flag: no such family.
    let e = Exporter::start(&[]);
    let m = e.scrape();
    assert_eq!(m.find("bufscope_probe_runs_total", &[]).count(), 0);
    drop(e);

    let e = Exporter::start(&["--bpf.run-stats"]);
    let r = Workload::start(&["udp-recv", "--rcvbuf", "4096"]);
    let port = r.get("ports").to_string();
    let inode: u64 = r.get("inodes").parse().unwrap();
    assert!(Workload::start(&["udp-flood", "--port", &port, "--count", "3000"]).wait());
    let dropped = bufscope_integration::proc_udp_drops(r.pid(), inode).unwrap() as f64;
    assert!(dropped > 0.0);
    // Every program bufscope holds (its links and program fds name them in fdinfo).
    let ids = bufscope_integration::held_bpf_ids(e.pid(), "prog_id:");
    assert!(!ids.is_empty());
    let kernel = || {
        ids.iter()
            .map(|id| bpftool_run_stats(*id))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    };
    let before = kernel();
    let m = e.scrape();
    let after = kernel();
    let runs = m.sum("bufscope_probe_runs_total", &[]);
    let secs = m.sum("bufscope_probe_run_seconds_total", &[]);
    assert!(
        before.0 as f64 <= runs && runs <= after.0 as f64,
        "runs {runs} within the kernel's {} ..= {}",
        before.0,
        after.0
    );
    assert!(
        before.1 as f64 / 1e9 <= secs + 1e-9 && secs <= after.1 as f64 / 1e9 + 1e-9,
        "run time {secs} s within the kernel's {} ..= {} ns",
        before.1,
        after.1
    );
    let drops = m.sum("bufscope_probe_runs_total", &[("probe", "drops")]);
    assert!(
        drops >= dropped,
        "the drop probe ran for each of the {dropped} datagrams the kernel dropped: {drops}"
    );
    // bufscope top's per-probe ns/run comes from the status document.
    let (_, body) = e.get("/api/v1/status");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let row = doc["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["probe"] == "drops")
        .unwrap();
    assert!(row["run_count"].as_u64().unwrap() >= drops as u64, "{row}");
    eprintln!(
        "--bpf.run-stats: {runs} runs, {secs:.6} s (kernel {}..={} runs); drops probe {drops} runs, {:.0} ns/run",
        before.0,
        after.0,
        m.sum("bufscope_probe_run_seconds_total", &[("probe", "drops")]) * 1e9 / drops
    );
    let (ok, msg) = promtool_check_metrics(&e.scrape_text());
    assert!(ok, "promtool check metrics failed:\n{msg}");
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn run_stats_cover_the_programs_adopted_from_the_pins() {
    // A bpffs of its own: pins and links go with the test, whatever the node has.
    in_mount_namespace(Bpffs::Mounted, || {
        let dir = format!("/sys/fs/bpf/bufscope-test-runstats-{}", std::process::id());
        let cleanup = || {
            let (ok, out, err) = bufscope_integration::output(
                std::process::Command::new(bufscope_integration::bufscope_bin()).args([
                    "cleanup",
                    "--bpf.pin-path",
                    &dir,
                ]),
                "",
            );
            assert!(ok, "bufscope cleanup: {out}{err}");
        };
        cleanup();
        let pin = format!("--bpf.pin-path={dir}");
        // The first run pins; the second adopts its links (nothing loaded) and reads their
        // programs' run time through them.
        let first = Exporter::start(&[&pin]);
        assert_eq!(first.scrape().sum("bufscope_probe_pinned", &[]), 5.0);
        let status = first.stop();
        assert!(status.success(), "{status:?}");
        let e = Exporter::start(&[&pin, "--bpf.run-stats"]);
        let m = e.scrape();
        let info = m.find("bufscope_bpf_pins_info", &[]).next().unwrap();
        assert_eq!(info.labels["outcome"], "adopted", "{info:?}");
        let r = Workload::start(&["udp-recv", "--rcvbuf", "4096"]);
        let inode: u64 = r.get("inodes").parse().unwrap();
        assert!(
            Workload::start(&["udp-flood", "--port", r.get("ports"), "--count", "2000"]).wait()
        );
        let dropped = bufscope_integration::proc_udp_drops(r.pid(), inode).unwrap() as f64;
        let ids = bufscope_integration::held_bpf_ids(e.pid(), "prog_id:");
        let kernel = || {
            ids.iter()
                .map(|id| bpftool_run_stats(*id))
                .fold(0, |a, b| a + b.0)
        };
        let before = kernel();
        let m = e.scrape();
        let after = kernel();
        let runs = m.sum("bufscope_probe_runs_total", &[]);
        assert!(
            before as f64 <= runs && runs <= after as f64,
            "runs {runs} within the kernel's {before} ..= {after}"
        );
        let drops = m.sum("bufscope_probe_runs_total", &[("probe", "drops")]);
        assert!(
            drops >= dropped,
            "adopted drop probe: {drops} runs, {dropped} drops"
        );
        eprintln!("adopted pins, --bpf.run-stats: drops probe {drops} runs for {dropped} drops");
        drop(e);
        cleanup();
    })
}
