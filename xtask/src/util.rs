//! Small helpers shared by the xtask commands.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context as _, bail};

/// The workspace root (the parent of this crate's manifest directory).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// Runs a command, failing with its rendering when it does not exit successfully.
pub fn run_cmd(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    eprintln!("xtask: {shown}");
    let status = cmd
        .status()
        .with_context(|| format!("failed to start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed: {status}");
    }
    Ok(())
}

/// `cargo` as invoked by this xtask (honours `$CARGO`), run at the workspace root.
///
/// Without the variables `cargo run` set for this xtask (`CARGO_MANIFEST_DIR`,
/// `CARGO_PKG_NAME`, …): build scripts that watch them (ring's does) would otherwise see them
/// change between `cargo xtask …` and a plain `cargo build`, and rebuild every crate above
/// them at each switch.
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(set_by_cargo_run) {
            c.env_remove(k);
        }
    }
    c
}

/// A variable `cargo run` and `cargo test` set for the program they start.
fn set_by_cargo_run(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_EXE_")
        || [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_MANIFEST_LINKS",
            "CARGO_CRATE_NAME",
            "CARGO_BIN_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_RUSTC_CURRENT_DIR",
        ]
        .contains(&name)
}

/// True when running as uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions. Avoids a libc dependency for one call.
    unsafe extern "C" {
        fn geteuid() -> u32;
    }
    unsafe { geteuid() == 0 }
}

/// `s` as one shell word: unchanged when it needs no quoting, else in single quotes.
pub fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=,+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_cargo_does_not_inherit_what_cargo_run_set_for_xtask() {
        // `cargo test` set these for this test binary as `cargo run` does for xtask.
        let removed: Vec<String> = cargo()
            .get_envs()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        for k in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
        ] {
            assert!(std::env::var_os(k).is_some(), "cargo test did not set {k}");
            assert!(
                removed.iter().any(|r| r == k),
                "{k} is passed on: {removed:?}"
            );
        }
        // What a user sets for cargo itself is kept.
        assert!(!set_by_cargo_run("CARGO_TARGET_DIR") && !set_by_cargo_run("CARGO_HOME"));
    }
}
