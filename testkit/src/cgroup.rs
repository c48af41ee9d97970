//! Running the exporter as if the host had no cgroup2 hierarchy: in a mount namespace of its
//! own with every cgroup2 mount removed (the tests of the tracepoint fallback, the benchmark
//! rows of what the fallback costs).

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// Every cgroup2 mount point in `/proc/self/mountinfo`.
pub fn cgroup2_mounts() -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    Ok(text
        .lines()
        .filter(|l| {
            l.split_once(" - ")
                .is_some_and(|(_, t)| t.starts_with("cgroup2 "))
        })
        .filter_map(|l| l.split_whitespace().nth(4).map(String::from))
        .collect())
}

/// Writes (into `dir`) an executable that runs `bin` with its arguments in a private mount
/// namespace without any cgroup2 mount; returns its path, for [`crate::Exporter::start`].
pub fn without_cgroup2(bin: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let mounts = cgroup2_mounts()?;
    anyhow::ensure!(!mounts.is_empty(), "this host has no cgroup2 mount to hide");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let umounts: String = mounts
        .iter()
        .map(|m| format!("umount -l '{m}'; "))
        .collect();
    let script = dir.join("bufscope-without-cgroup2");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec unshare -m --propagation private sh -c \"{umounts}exec \\\"\\$0\\\" \\\"\\$@\\\"\" '{}' \"$@\"\n",
            bin.display()
        ),
    )
    .with_context(|| format!("writing {}", script.display()))?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("chmod {}", script.display()))?;
    Ok(script)
}
