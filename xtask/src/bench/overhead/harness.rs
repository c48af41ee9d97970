//! What every section runs on: the release binaries, workloads, a running `bufscope run`, a
//! running bpftrace script, and the statistics the tables show. Child processes, the exporter,
//! HTTP and `/metrics` parsing are `bufscope-testkit`'s, shared with the integration tests.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bufscope_testkit::{Exporter, LineChild};

use super::Args;
use crate::bench::release_dir;
use crate::util::{cargo, run_cmd};

/// The release binaries under test.
pub(super) struct Bins {
    bufscope: PathBuf,
    workload: PathBuf,
}

impl Bins {
    pub(super) fn find_or_build(a: &Args) -> anyhow::Result<Self> {
        let dir = match &a.bin_dir {
            Some(d) => d.clone(),
            None => {
                run_cmd(cargo().args([
                    "build",
                    "--release",
                    "-p",
                    "bufscope",
                    "-p",
                    "bufscope-integration",
                ]))?;
                release_dir()
            }
        };
        let b = Self {
            bufscope: dir.join("bufscope"),
            workload: dir.join("bufscope-workload"),
        };
        for p in [&b.bufscope, &b.workload] {
            if !p.exists() {
                bail!(
                    "{} not found (build with `cargo build --release -p bufscope -p bufscope-integration`)",
                    p.display()
                );
            }
        }
        Ok(b)
    }

    /// The `bufscope-workload` binary.
    pub(super) fn workload_path(&self) -> &std::path::Path {
        &self.workload
    }

    /// Starts `bufscope-workload <args>` (in `netns`, when given) and waits for its `READY`
    /// line; returns it with the line's fields. Dropped: `exit` on its stdin, SIGTERM after 2 s.
    pub(super) fn workload(
        &self,
        netns: Option<&str>,
        args: &[&str],
    ) -> anyhow::Result<(LineChild, BTreeMap<String, String>)> {
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.workload);
                c
            }
            None => Command::new(&self.workload),
        };
        // Workloads are quiet unless something fails.
        cmd.args(args).stderr(Stdio::inherit());
        let mut p =
            LineChild::spawn(cmd, args[0])?.stop_with(Duration::from_secs(2), Some(libc::SIGTERM));
        let fields = p.wait_ready(Duration::from_secs(60))?;
        Ok((p, fields))
    }

    /// Starts `bufscope run` on 127.0.0.1:<ephemeral> at log level info with `extra` flags;
    /// fails when a probe that was not disabled did not attach.
    pub(super) fn exporter(&self, extra: &[&str]) -> anyhow::Result<Exporter> {
        let mut args = vec!["--log.level", "info"];
        args.extend(extra);
        self.checked(Exporter::start(&self.bufscope, &args)?)
    }

    /// [`Bins::exporter`] with `BUFSCOPE_REFUSE_HOOKS=<refuse>` (hook kinds bufscope must not
    /// use, e.g. `fentry,fexit`: it falls back to its next variant), through a wrapper script
    /// in the temporary directory.
    pub(super) fn exporter_refusing(
        &self,
        refuse: &str,
        extra: &[&str],
    ) -> anyhow::Result<Exporter> {
        use std::os::unix::fs::PermissionsExt as _;
        let script = std::env::temp_dir().join(format!("bufscope-refusing-{}", std::process::id()));
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nBUFSCOPE_REFUSE_HOOKS='{refuse}' exec '{}' \"$@\"\n",
                self.bufscope.display()
            ),
        )
        .with_context(|| format!("writing {}", script.display()))?;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("chmod {}", script.display()))?;
        let mut args = vec!["--log.level", "info"];
        args.extend(extra);
        self.checked(Exporter::start(&script, &args)?)
    }

    /// [`Bins::exporter`] with no flags, in a mount namespace without cgroup2 (`dir` holds the
    /// wrapper script): setsockopt and owners then run on the syscall tracepoints.
    pub(super) fn exporter_without_cgroup2(
        &self,
        dir: &std::path::Path,
    ) -> anyhow::Result<Exporter> {
        let wrapper = bufscope_testkit::without_cgroup2(&self.bufscope, dir)?;
        self.checked(Exporter::start(&wrapper, &["--log.level", "info"])?)
    }

    /// `e`, unless a probe that was not disabled did not attach at all.
    fn checked(&self, e: Exporter) -> anyhow::Result<Exporter> {
        let log = e.log();
        if log.contains("probe could not attach") {
            bail!("a bufscope probe did not attach:\n{log}");
        }
        Ok(e)
    }
}

/// A running bpftrace script (attached once it printed "Attaching"). Dropped with SIGINT.
pub(super) struct Bpftrace(LineChild);

impl Bpftrace {
    pub(super) fn start(script: &str) -> anyhow::Result<Self> {
        let mut cmd = Command::new("bpftrace");
        // bpftrace warns about things that do not matter here.
        cmd.args(["-e", script]).stderr(Stdio::null());
        let mut p = LineChild::spawn(cmd, "bpftrace")?
            .stop_with(Duration::from_secs(2), Some(libc::SIGINT));
        p.wait_line("Attaching", Duration::from_secs(120))
            .with_context(|| format!("bpftrace -e '{script}'"))?;
        // "Attaching N probes..." is printed before the attach calls return.
        std::thread::sleep(Duration::from_millis(500));
        Ok(Self(p))
    }

    pub(super) fn pid(&self) -> u32 {
        self.0.pid()
    }
}

/// Median of the finite values (NaN when there are none).
pub(super) fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Nearest-rank percentile (`p` in 0..=100).
pub(super) fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_percentiles() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }
}
