//! The shell script a guest runs: the guest's own `bufscope check`, then each step, framed by
//! `MATRIX …` lines the host reads back.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::steps::Step;
use crate::util::workspace_root;

pub(super) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The script the guest runs (the host's filesystem is the guest's, read-only). Its tests
/// wait 4 times as long as on the host (`BUFSCOPE_TEST_PATIENCE`): beside `cargo xtask
/// test`'s host stage a guest runs only on CPU time the host tests leave, and stands still
/// while one of them keeps both CPUs busy.
///
/// `shared N FLAGS…` starts the N-th shared `bufscope run` (on 127.0.0.1:1947N: the guest's
/// loopback is its own) unless it runs already, and waits until it serves; the steps that
/// name it get its address, pid, log and flags in `BUFSCOPE_TEST_EXPORTER*`. At the end each
/// is stopped with SIGTERM and its log printed.
pub(super) fn guest_script(
    bins: &[(String, PathBuf)],
    bufscope: &Path,
    steps: &[&Step],
) -> anyhow::Result<String> {
    let root = workspace_root();
    let mut s = format!(
        "#!/bin/sh\n\
         export BUFSCOPE_BIN={} NO_COLOR=1 RUST_BACKTRACE=1 {}=4 \
         PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         cd {}\n\
         t0=$(date +%s)\n\
         echo \"MATRIX BEGIN $(uname -r)\"\n\
         echo MATRIX CHECK-BEGIN; \"$BUFSCOPE_BIN\" check > {CHECK} 2>/dev/null; \
         rc=$?; cat {CHECK}; echo \"MATRIX CHECK-END rc=$rc\"\n\
         step() {{ n=\"$1\"; shift; s=$(date +%s); \"$@\" 2>&1; \
         echo \"MATRIX STEP rc=$? secs=$(( $(date +%s) - s )) name=$n\"; }}\n\
         shared() {{ n=$1; shift; [ -e /tmp/matrix-exporter-$n.pid ] && return; \
         \"$BUFSCOPE_BIN\" run --web.listen-address 127.0.0.1:1947$n \"$@\" \
         >/dev/null 2>/tmp/matrix-exporter-$n.log & echo $! > /tmp/matrix-exporter-$n.pid; \
         i=0; until grep -q 'serving metrics' /tmp/matrix-exporter-$n.log; do \
         i=$((i+1)); [ $i -gt 1200 ] && break; kill -0 $(cat /tmp/matrix-exporter-$n.pid) || break; \
         sleep 0.1; done; }}\n",
        sh_quote(&bufscope.to_string_lossy()),
        bufscope_testkit::PATIENCE_ENV,
        sh_quote(&root.to_string_lossy()),
    );
    let mut flag_sets: Vec<&[&str]> = Vec::new();
    for st in steps {
        let exe = &bins
            .iter()
            .find(|(n, _)| n == st.test)
            .context("test binary")?
            .1;
        let mut start = String::new();
        let mut cmd = vec!["env".to_string()];
        if let Some(flags) = st.shared {
            let n = match flag_sets.iter().position(|f| *f == flags) {
                Some(n) => n,
                None => {
                    flag_sets.push(flags);
                    flag_sets.len() - 1
                }
            };
            let quoted: Vec<String> = flags.iter().map(|f| sh_quote(f)).collect();
            start = format!("shared {n} {}; ", quoted.join(" "));
            cmd.extend([
                format!("BUFSCOPE_TEST_EXPORTER=127.0.0.1:1947{n}"),
                format!("BUFSCOPE_TEST_EXPORTER_PID=$(cat /tmp/matrix-exporter-{n}.pid)"),
                format!("BUFSCOPE_TEST_EXPORTER_LOG=/tmp/matrix-exporter-{n}.log"),
                sh_quote(&format!("BUFSCOPE_TEST_EXPORTER_ARGS={}", flags.join(" "))),
            ]);
        }
        cmd.push(format!("BUFSCOPE_TEST_CHECK={CHECK}"));
        cmd.extend(st.env.iter().map(|(k, v)| sh_quote(&format!("{k}={v}"))));
        cmd.push(sh_quote(&exe.to_string_lossy()));
        cmd.extend(["--include-ignored", "--test-threads=1", "--nocapture"].map(String::from));
        cmd.extend(st.args.iter().map(|a| sh_quote(a)));
        let line = format!("{start}step {} {}", sh_quote(st.name), cmd.join(" "));
        match st.when {
            None => s.push_str(&format!("{line}\n")),
            Some((probe, hook)) => s.push_str(&format!(
                "if grep -q {} {CHECK}; then {line}; else \
                 echo \"MATRIX STEP rc=0 secs=0 skipped=1 name={}\"; fi\n",
                sh_quote(&format!("^\\[ ok \\] {probe} .*{hook}")),
                st.name
            )),
        }
    }
    for n in 0..flag_sets.len() {
        s.push_str(&format!(
            "if [ -e /tmp/matrix-exporter-{n}.pid ]; then p=$(cat /tmp/matrix-exporter-{n}.pid); \
             kill -TERM $p; wait $p; echo \"shared bufscope {n} exited $?; its log:\"; \
             cat /tmp/matrix-exporter-{n}.log; fi\n"
        ));
    }
    s.push_str("echo \"MATRIX END secs=$(( $(date +%s) - t0 ))\"\n");
    Ok(s)
}

/// Where the guest's own `bufscope check` output goes (the check step's test reads it).
const CHECK: &str = "/tmp/matrix-check.txt";
