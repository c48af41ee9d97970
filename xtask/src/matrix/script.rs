//! The shell script a guest runs: the guest's own `bufscope check`, then each step, framed by
//! `MATRIX …` lines the host reads back.

use std::path::PathBuf;

use anyhow::Context as _;

use super::BUFSCOPE;
use super::steps::Step;
use crate::util::workspace_root;

pub(super) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The script the guest runs (the host's filesystem is the guest's, read-only).
pub(super) fn guest_script(bins: &[(String, PathBuf)], steps: &[&Step]) -> anyhow::Result<String> {
    let root = workspace_root();
    let bufscope = root.join(BUFSCOPE);
    let mut s = format!(
        "#!/bin/sh\n\
         export BUFSCOPE_BIN={} NO_COLOR=1 RUST_BACKTRACE=1 \
         PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         cd {}\n\
         t0=$(date +%s)\n\
         echo \"MATRIX BEGIN $(uname -r)\"\n\
         echo MATRIX CHECK-BEGIN; \"$BUFSCOPE_BIN\" check > /tmp/matrix-check.txt 2>/dev/null; \
         rc=$?; cat /tmp/matrix-check.txt; echo \"MATRIX CHECK-END rc=$rc\"\n\
         step() {{ n=\"$1\"; shift; s=$(date +%s); \"$@\" 2>&1; \
         echo \"MATRIX STEP rc=$? secs=$(( $(date +%s) - s )) name=$n\"; }}\n",
        sh_quote(&bufscope.to_string_lossy()),
        sh_quote(&root.to_string_lossy()),
    );
    for st in steps {
        let exe = &bins
            .iter()
            .find(|(n, _)| n == st.test)
            .context("test binary")?
            .1;
        let mut cmd = vec!["env".to_string()];
        cmd.extend(st.env.split_whitespace().map(sh_quote));
        cmd.push(sh_quote(&exe.to_string_lossy()));
        cmd.extend(["--include-ignored", "--test-threads=1", "--nocapture"].map(String::from));
        cmd.extend(st.args.iter().map(|a| sh_quote(a)));
        let line = format!("step {} {}", sh_quote(st.name), cmd.join(" "));
        match st.when {
            None => s.push_str(&format!("{line}\n")),
            Some((probe, hook)) => s.push_str(&format!(
                "if grep -q {} /tmp/matrix-check.txt; then {line}; else \
                 echo \"MATRIX STEP rc=0 secs=0 skipped=1 name={}\"; fi\n",
                sh_quote(&format!("^\\[ ok \\] {probe} .*{hook}")),
                st.name
            )),
        }
    }
    s.push_str("echo \"MATRIX END secs=$(( $(date +%s) - t0 ))\"\n");
    Ok(s)
}
