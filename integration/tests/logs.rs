//! Log lines carry ANSI colours only on a terminal, and never with `NO_COLOR` set
//! (`cargo xtask run > log` must give plain text).
#![allow(clippy::unwrap_used)]

use std::process::Command;

use bufscope_integration::{bufscope_bin, require_root};

const ESC: char = '\u{1b}';

/// `bufscope check --log.level debug`: its log lines (stderr) are what is looked at.
fn check_cmd() -> String {
    format!("{} check --log.level debug", bufscope_bin().display())
}

/// Runs `sh -c cmd` under a pseudo-terminal (`script`), with `no_color` as `NO_COLOR`;
/// returns what the terminal showed.
fn on_a_terminal(cmd: &str, no_color: Option<&str>) -> String {
    let mut c = Command::new("script");
    c.args(["-qec", cmd, "/dev/null"]).env_remove("NO_COLOR");
    if let Some(v) = no_color {
        c.env("NO_COLOR", v);
    }
    let out = c.output().expect("script (util-linux)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn logs_are_plain_in_a_pipe_and_coloured_only_on_a_terminal_without_no_color() {
    require_root();
    let piped = Command::new(bufscope_bin())
        .args(["check", "--log.level", "debug"])
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&piped.stderr);
    assert!(log.contains("DEBUG"), "debug lines were logged: {log}");
    assert!(!log.contains(ESC), "no ANSI codes in a pipe:\n{log}");

    let tty = on_a_terminal(&check_cmd(), None);
    assert!(tty.contains("DEBUG"), "{tty}");
    assert!(
        tty.contains(&format!("{ESC}[")),
        "colour on a terminal:\n{tty}"
    );

    let no_color = on_a_terminal(&check_cmd(), Some("1"));
    assert!(no_color.contains("DEBUG"), "{no_color}");
    assert!(
        !no_color.contains(&format!("{ESC}[2m")) && !no_color.contains(&format!("{ESC}[34m")),
        "NO_COLOR=1 turns the colours off:\n{no_color}"
    );
}
