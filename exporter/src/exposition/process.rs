//! What bufscope itself costs: the standard process metrics every Prometheus client library
//! serves (`process_*`, as client_golang and the Rust `prometheus` crate define them), read
//! from `/proc/self` at scrape time, how long each signal's last poll took, and with
//! `--bpf.run-stats` the kernel's run time and count of each probe's programs.

use std::time::Duration;

use prometheus::proto::MetricFamily;

use super::Spec;

const CPU: Spec = Spec::counter(
    "process_cpu_seconds_total",
    "Total user and system CPU time spent in seconds.",
    &[],
);
const OPEN_FDS: Spec = Spec::gauge("process_open_fds", "Number of open file descriptors.", &[]);
const MAX_FDS: Spec = Spec::gauge(
    "process_max_fds",
    "Maximum number of open file descriptors.",
    &[],
);
const VIRTUAL: Spec = Spec::gauge(
    "process_virtual_memory_bytes",
    "Virtual memory size in bytes.",
    &[],
);
const RESIDENT: Spec = Spec::gauge(
    "process_resident_memory_bytes",
    "Resident memory size in bytes.",
    &[],
);
const START: Spec = Spec::gauge(
    "process_start_time_seconds",
    "Start time of the process since unix epoch in seconds.",
    &[],
);
const POLL_DURATION: Spec = Spec::gauge(
    "bufscope_signal_poll_duration_seconds",
    "How long the last read of each signal's maps took (the poll that runs every \
     --poll-interval and before each scrape).",
    &["signal"],
);

const PROBE_RUN_SECONDS: Spec = Spec::counter(
    "bufscope_probe_run_seconds_total",
    "CPU time the probe's BPF programs ran, as the kernel counts it (run_time_ns of each \
     program; only with --bpf.run-stats, and counted only while it is on).",
    &["probe"],
);
const PROBE_RUNS: Spec = Spec::counter(
    "bufscope_probe_runs_total",
    "Runs of the probe's BPF programs, as the kernel counts them (run_cnt; only with \
     --bpf.run-stats).",
    &["probe"],
);

/// This process as `/proc/<pid>/stat`, `/proc/<pid>/fd` and `/proc/<pid>/limits` show it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SelfStats {
    /// User + system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// The soft limit on open files (`RLIMIT_NOFILE`; None: unlimited or unreadable).
    pub max_fds: Option<u64>,
    /// Virtual memory size, bytes.
    pub virtual_bytes: u64,
    /// Resident set size, bytes.
    pub resident_bytes: u64,
    /// Start time, seconds since the Unix epoch.
    pub start_time: f64,
}

/// The fields of a `stat` file after the `(comm)` (which may hold spaces and parentheses):
/// the first is field 3, `state`.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_ascii_whitespace().collect())
}

/// Parses `stat` (the text of `/proc/<pid>/stat`) with `hz` clock ticks per second, `page`
/// bytes per page and the boot time `btime` (Unix seconds, `/proc/stat`).
pub fn parse_stat(stat: &str, hz: u64, page: u64, btime: u64) -> Option<SelfStats> {
    let f = stat_fields(stat)?;
    let field = |n: usize| -> Option<u64> { f.get(n - 3)?.parse().ok() };
    let hz = hz.max(1) as f64;
    Some(SelfStats {
        cpu_seconds: (field(14)? + field(15)?) as f64 / hz,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)? * page,
        start_time: btime as f64 + field(22)? as f64 / hz,
        open_fds: None,
        max_fds: None,
    })
}

/// The soft `Max open files` of a `limits` file (None when `unlimited` or absent).
pub fn parse_max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_ascii_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `btime` of `/proc/stat`: when the system booted, Unix seconds.
pub fn parse_btime(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// Reads this process's figures from `/proc/self` (None when `/proc` is unreadable).
pub fn read_self() -> Option<SelfStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let btime = parse_btime(&std::fs::read_to_string("/proc/stat").ok()?)?;
    // SAFETY: sysconf reads a constant of the C library; no memory is handed over.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = u64::try_from(page).ok().filter(|p| *p > 0).unwrap_or(4096);
    let mut s = parse_stat(&stat, crate::attribution::procfs::clk_tck(), page, btime)?;
    // The directory listing's own fd is not one of ours: read_dir holds it while iterating,
    // and client libraries count it too (client_golang does), so the figure matches theirs.
    s.open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.filter(|e| e.is_ok()).count() as u64);
    s.max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| parse_max_fds(&l));
    Some(s)
}

/// The `process_*` families of `s`, the last poll duration of each signal and the (probe,
/// run time ns, runs) of `runs`.
pub fn families(
    s: Option<&SelfStats>,
    polls: &[(&'static str, Duration)],
    runs: &[(&'static str, u64, u64)],
    out: &mut Vec<MetricFamily>,
) {
    let single = |spec: &Spec, v: f64, out: &mut Vec<MetricFamily>| {
        let mut f = spec.family();
        f.push(&[], v);
        f.done(out);
    };
    if let Some(s) = s {
        single(&CPU, s.cpu_seconds, out);
        if let Some(n) = s.open_fds {
            single(&OPEN_FDS, n as f64, out);
        }
        if let Some(n) = s.max_fds {
            single(&MAX_FDS, n as f64, out);
        }
        single(&VIRTUAL, s.virtual_bytes as f64, out);
        single(&RESIDENT, s.resident_bytes as f64, out);
        single(&START, s.start_time, out);
    }
    let mut f = POLL_DURATION.family();
    for (signal, d) in polls {
        f.push(&[signal], d.as_secs_f64());
    }
    f.done(out);
    let mut secs = PROBE_RUN_SECONDS.family();
    let mut count = PROBE_RUNS.family();
    for (probe, ns, n) in runs {
        secs.push(&[probe], *ns as f64 / 1e9);
        count.push(&[probe], *n as f64);
    }
    secs.done(out);
    count.done(out);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stat_fields_after_a_comm_with_spaces_and_parentheses() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        // utime stime cutime cstime priority nice threads itrealvalue starttime vsize rss …
        let stat = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 7 3 20 0 4 0 \
                    12345 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0";
        let s = parse_stat(stat, 100, 4096, 1_700_000_000).unwrap();
        assert_eq!(
            s.cpu_seconds, 3.0,
            "(250 + 50) ticks at 100 Hz; children excluded"
        );
        assert_eq!(s.virtual_bytes, 104_857_600);
        assert_eq!(s.resident_bytes, 2560 * 4096);
        assert_eq!(s.start_time, 1_700_000_000.0 + 123.45);
        assert_eq!(parse_stat("4242 (a) S 1", 100, 4096, 0), None);
        assert_eq!(parse_stat("no parenthesis", 100, 4096, 0), None);
    }

    #[test]
    fn limits_and_btime() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             95733                95733                processes \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_max_fds(unlimited), None);
        assert_eq!(
            parse_btime("cpu  1 2 3\nbtime 1764662400\nprocesses 9\n"),
            Some(1_764_662_400)
        );
        assert_eq!(parse_btime("cpu 1\n"), None);
    }

    #[test]
    fn this_process_reads_itself() {
        let s = read_self().unwrap();
        assert!(s.resident_bytes > 0 && s.virtual_bytes >= s.resident_bytes);
        assert!(s.open_fds.unwrap() >= 3, "stdin, stdout, stderr at least");
        let mut out = Vec::new();
        families(
            Some(&s),
            &[("drops", Duration::from_micros(1500))],
            &[("drops", 2_500_000_000, 10)],
            &mut out,
        );
        let text = super::super::encode(&out).unwrap();
        for name in [
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_virtual_memory_bytes",
            "process_resident_memory_bytes",
            "process_start_time_seconds",
            "bufscope_signal_poll_duration_seconds{signal=\"drops\"} 0.0015",
            "bufscope_probe_run_seconds_total{probe=\"drops\"} 2.5",
            "bufscope_probe_runs_total{probe=\"drops\"} 10",
        ] {
            assert!(text.contains(name), "{name} in\n{text}");
        }
    }
}
