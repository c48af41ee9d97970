//! bpftrace as an observer that shares no code with bufscope: it counts kernel events while a
//! test's workload runs.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use bufscope_testkit::LineChild;

use crate::ok;

/// Runs bpftrace with `probes` (probes that `count()` into the map `@n`, keyed or not), calls
/// `run` once bpftrace has attached (waiting up to `attach` for that: 20–45 s for kprobes under
/// QEMU TCG), stops it with SIGINT and returns `@n` as bpftrace prints it then: key → count, the
/// key `""` for an unkeyed `@n`, no entry when nothing fired. `clear` holds END statements that
/// clear the program's other maps, so that bpftrace prints `@n` alone.
pub fn counts(
    probes: &str,
    clear: &str,
    attach: Duration,
    run: impl FnOnce(),
) -> BTreeMap<String, u64> {
    try_counts(probes, clear, attach, run).unwrap_or_else(|e| panic!("{e}"))
}

/// [`counts`], or an error when bpftrace printed no counts within 60 s of SIGINT (seen once
/// in a 6.12 guest under TCG: bpftrace hung after SIGINT without running its END block, where
/// it normally prints within a second or two), for a caller that can run its workload again.
pub fn try_counts(
    probes: &str,
    clear: &str,
    attach: Duration,
    run: impl FnOnce(),
) -> Result<BTreeMap<String, u64>, String> {
    let prog = format!(
        "{probes} BEGIN {{ printf(\"ATTACHED\\n\"); }} \
         END {{ printf(\"COUNTS\\n\"); print(@n); printf(\"DONE\\n\"); clear(@n); {clear} }}"
    );
    let mut cmd = Command::new("bpftrace");
    cmd.args(["-e", &prog]).stderr(Stdio::inherit());
    // bpftrace 0.17 resolves the structs of kprobe casts from the kernel's BTF only when told
    // where it is on some kernels (Debian 11's 5.10: "Unknown struct/union" otherwise).
    let vmlinux = std::path::Path::new("/sys/kernel/btf/vmlinux");
    if vmlinux.exists() && std::env::var_os("BPFTRACE_BTF").is_none() {
        cmd.env("BPFTRACE_BTF", vmlinux);
    }
    // Dropped: 10 s to exit by itself after END, then SIGKILL.
    let mut child = LineChild::spawn(cmd, "bpftrace")
        .unwrap_or_else(|e| panic!("{e:#} (cargo xtask setup installs bpftrace)"))
        .stop_with(Duration::from_secs(10), None);
    ok(child.wait_line("ATTACHED", attach));
    run();
    ok(bufscope_testkit::signal(child.pid(), libc::SIGINT));
    let mut counts = BTreeMap::new();
    loop {
        let Some(l) = child.next_line(Duration::from_secs(60)) else {
            return Err("bpftrace stopped without printing its counts".into());
        };
        if l == "DONE" {
            return Ok(counts);
        }
        // "@n[41013]: 5", "@n: 42"
        if let Some((key, n)) = l.strip_prefix("@n").and_then(|r| r.split_once(": "))
            && let Ok(n) = n.trim().parse()
        {
            let key = key.strip_prefix('[').and_then(|k| k.strip_suffix(']'));
            counts.insert(key.unwrap_or("").trim().to_string(), n);
        }
    }
}
