//! A fresh node, reproduced in a mount namespace of the test's own: no tracefs mounted (a
//! node may have none until something mounts it). bufscope mounts tracefs itself, in its own
//! mount namespace, and the probes that need classic tracepoints (the syscall fallbacks,
//! forced with `BUFSCOPE_REFUSE_HOOKS`) attach there. Ground truth: `statfs(2)` of
//! `/sys/kernel/tracing` before and after, and `bufscope_probe_attached`.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use bufscope_integration::node::{Bpffs, in_mount_namespace, tracefs_mounted, without_tracefs};
use bufscope_integration::{Exporter, TempDir, bufscope_bin, output};
use bufscope_testkit::check_probes;

/// The hooks whose refusal moves setsockopt and owners onto classic (tracefs) tracepoints.
const REFUSE: &str = "cgroup/setsockopt,cgroup/sock_create";

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn without_tracefs_bufscope_mounts_it_and_attaches_its_tracepoints() {
    let d = TempDir::new("no-tracefs");
    let (before, check_ok, check, after_check, attached) =
        in_mount_namespace(Bpffs::Absent, || {
            without_tracefs();
            let before = tracefs_mounted();
            let (ok, out, err) = output(
                Command::new(bufscope_bin())
                    .arg("check")
                    .env("NO_COLOR", "1")
                    .env("BUFSCOPE_REFUSE_HOOKS", REFUSE),
                "",
            );
            let after_check = tracefs_mounted();
            // The daemon as well, on a namespace that lost tracefs again.
            without_tracefs();
            let bin = d.path().join("bufscope-refusing");
            std::fs::write(
                &bin,
                format!(
                    "#!/bin/sh\nBUFSCOPE_REFUSE_HOOKS='{REFUSE}' exec '{}' \"$@\"\n",
                    bufscope_bin().display()
                ),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
            let e = Exporter::start_bin(&bin, &[]);
            let m = e.scrape();
            let attached: Vec<(String, String)> = m
                .find("bufscope_probe_attached", &[])
                .filter(|s| s.value == 1.0)
                .map(|s| (s.labels["probe"].clone(), s.labels["hook"].clone()))
                .collect();
            (before, ok, format!("{out}{err}"), after_check, attached)
        });
    assert!(!before, "tracefs was still mounted in the test's namespace");
    assert!(check_ok, "bufscope check without tracefs:\n{check}");
    assert!(
        after_check,
        "bufscope check did not mount tracefs:\n{check}"
    );
    let lines = check_probes(&check);
    for probe in ["setsockopt", "owners"] {
        let line = lines
            .iter()
            .find(|c| c.probe == probe)
            .unwrap_or_else(|| panic!("no {probe} line:\n{check}"));
        let hooks = &line.hooks;
        assert!(
            line.ok && hooks.contains("syscalls/"),
            "{probe}: {hooks} (want the syscall tracepoints):\n{check}"
        );
        let on = attached
            .iter()
            .find(|(p, _)| p == probe)
            .unwrap_or_else(|| panic!("{probe} not attached by the daemon: {attached:?}"));
        assert!(on.1.contains("syscalls/"), "{probe}: {}", on.1);
    }
    eprintln!("without tracefs: check mounted it; the daemon attached {attached:?}");
}
