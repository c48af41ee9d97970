//! Running external commands (`bpftool`, `ss`, `wg`, `promtool`, …).

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use anyhow::{Context as _, bail};

/// Runs `cmd`; its trimmed stdout, or an error with its stderr.
pub fn cmd_output(cmd: &mut Command) -> anyhow::Result<String> {
    let o = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !o.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// Runs `cmd` with `input` on its stdin and its stdout captured (stderr as the command has it:
/// inherited unless set); returns its output whatever its exit status.
pub fn output_with_input(cmd: &mut Command, input: &[u8]) -> anyhow::Result<Output> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    child
        .stdin
        .take()
        .context("child stdin")?
        .write_all(input)
        .with_context(|| format!("writing to {cmd:?}"))?;
    child
        .wait_with_output()
        .with_context(|| format!("waiting for {cmd:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_and_input() -> anyhow::Result<()> {
        assert_eq!(cmd_output(Command::new("echo").arg(" hi "))?, "hi");
        assert!(cmd_output(&mut Command::new("false")).is_err());
        let o = output_with_input(&mut Command::new("cat"), b"piped")?;
        assert_eq!(o.stdout, b"piped");
        Ok(())
    }
}
