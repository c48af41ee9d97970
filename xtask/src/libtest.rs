//! Reads the plain-text output of `cargo test` (cargo's `Running …` / `Doc-tests …` lines and
//! each binary's libtest lines) into one record per test binary: its counts, its time and the
//! names of the tests that failed. `cargo xtask test` summarises the doc tests with it, the
//! kernel matrix each guest step.

/// The `test result:` line of one binary.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counts {
    /// Tests that passed.
    pub passed: u32,
    /// Tests that failed.
    pub failed: u32,
    /// Tests that were ignored.
    pub ignored: u32,
    /// libtest's own `finished in` figure.
    pub secs: f64,
}

/// One test binary as cargo announced it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Binary {
    /// What cargo printed after `Running` (`tests/guard.rs`, `unittests src/lib.rs`) or
    /// `Doc-tests <crate>`.
    pub label: String,
    /// The target name from the executable's file name (`guard` for `deps/guard-1a2b…`), or
    /// the crate of a doc-test run.
    pub target: String,
    /// True for a `Doc-tests` run.
    pub doc: bool,
    /// Its `test result:` line; `None` when the binary ended without one (it crashed, or was
    /// killed).
    pub counts: Option<Counts>,
    /// Names of the failed tests, in the order libtest reported them.
    pub failed: Vec<String>,
}

impl Binary {
    /// True when it reported a result with no failure.
    #[cfg(test)]
    pub fn ok(&self) -> bool {
        self.counts.as_ref().is_some_and(|c| c.failed == 0) && self.failed.is_empty()
    }
}

/// Feeds on output lines one at a time.
#[derive(Debug, Default)]
pub struct Parser {
    /// Every binary seen so far, in order.
    pub binaries: Vec<Binary>,
    /// The previous line was `failures:`.
    after_failures: bool,
    /// Inside the indented name list that follows the second `failures:` line.
    in_list: bool,
}

impl Parser {
    /// Reads one line (without its newline).
    pub fn line(&mut self, raw: &str) {
        let l = raw.trim_end_matches(['\r', '\n']);
        let after_failures = std::mem::take(&mut self.after_failures);
        if self.in_list || after_failures {
            if let Some(name) = l.strip_prefix("    ")
                && !name.trim().is_empty()
            {
                self.in_list = true;
                let name = name.trim().to_string();
                self.current().failed_once(name);
                return;
            }
            self.in_list = false;
        }
        let t = l.trim();
        if let Some(rest) = t.strip_prefix("Running ") {
            self.binaries.push(running(rest));
        } else if let Some(krate) = t.strip_prefix("Doc-tests ") {
            self.binaries.push(Binary {
                label: t.to_string(),
                target: krate.trim().to_string(),
                doc: true,
                ..Default::default()
            });
        } else if let Some(rest) = t.strip_prefix("test result: ") {
            self.current().counts = Some(counts(rest));
        } else if t == "failures:" {
            self.after_failures = true;
        } else if let Some(rest) = t.strip_prefix("test ")
            && let Some(name) = rest.strip_suffix(" ... FAILED")
        {
            self.current().failed_once(name.to_string());
        }
    }

    /// The binary being read (an anonymous one when no `Running` line came first, as for a
    /// test binary run directly).
    fn current(&mut self) -> &mut Binary {
        if self.binaries.is_empty() {
            self.binaries.push(Binary::default());
        }
        let n = self.binaries.len() - 1;
        &mut self.binaries[n]
    }
}

impl Binary {
    fn failed_once(&mut self, name: String) {
        if !self.failed.contains(&name) {
            self.failed.push(name);
        }
    }
}

/// `tests/guard.rs (target/debug/deps/guard-1a2b3c)` → label and target name.
fn running(rest: &str) -> Binary {
    let rest = rest.trim();
    let (label, exe) = match rest.rsplit_once(" (") {
        Some((label, exe)) if exe.ends_with(')') => (label, exe.trim_end_matches(')')),
        _ => (rest, rest),
    };
    let file = exe.rsplit('/').next().unwrap_or(exe);
    let target = match file.rsplit_once('-') {
        Some((stem, hash)) if !hash.is_empty() && hash.chars().all(|c| c.is_ascii_hexdigit()) => {
            stem
        }
        _ => file,
    };
    Binary {
        label: label.to_string(),
        target: target.to_string(),
        ..Default::default()
    }
}

/// `ok. 3 passed; 1 failed; 2 ignored; 0 measured; 0 filtered out; finished in 1.50s`.
fn counts(rest: &str) -> Counts {
    let mut c = Counts::default();
    let rest = rest.split_once(". ").map_or(rest, |(_, r)| r);
    for part in rest.split(';') {
        let part = part.trim();
        if let Some(secs) = part.strip_prefix("finished in ") {
            c.secs = secs.trim_end_matches('s').parse().unwrap_or(0.0);
            continue;
        }
        let Some((n, what)) = part.split_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse() else {
            continue;
        };
        match what {
            "passed" => c.passed = n,
            "failed" => c.failed = n,
            "ignored" => c.ignored = n,
            _ => {}
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Vec<Binary> {
        let mut p = Parser::default();
        for l in text.lines() {
            p.line(l);
        }
        p.binaries
    }

    /// Captured from `cargo test --no-fail-fast -- --test-threads=1` (stdout and stderr on
    /// one pipe), a failing test included.
    const CAPTURED: &str = r#"   Compiling bufscope-common v0.1.0 (/work/bufscope/common)
    Finished `test` profile [unoptimized + debuginfo] target(s) in 9.87s
     Running unittests src/lib.rs (target/debug/deps/bufscope_common-0f3a1c2d4e5b6a79)

running 3 tests
test tests::layout ... ok
test tests::names ... ok
test tests::slow ... ignored, needs root

test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s

     Running tests/guard.rs (target/debug/deps/guard-9e8d7c6b5a493827)

running 3 tests
test refuses_bad_port ... ok
test keeps_limit ... FAILED
test survives_restart ... ok

failures:

---- keeps_limit stdout ----
metric line:
    bufscope_guard_total 3

thread 'keeps_limit' panicked at integration/tests/guard.rs:10:5:
assertion `left == right` failed
  left: 3
 right: 4
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace


failures:
    keeps_limit

test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 41.27s

error: test failed, to rerun pass `-p bufscope-integration --test guard`
     Running tests/cli.rs (target/debug/deps/cli-0123456789abcdef)

running 1 test
test help_names_every_command ... 
thread 'main' panicked at 'boom'
error: test failed, to rerun pass `-p bufscope-integration --test cli`

Caused by:
  process didn't exit successfully: `/work/bufscope/target/debug/deps/cli-0123456789abcdef` (signal: 9, SIGKILL: kill)
   Doc-tests bufscope_common

running 1 test
test common/src/lib.rs - Key (line 12) ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.20s

error: 2 targets failed:
    `-p bufscope-integration --test guard`
    `-p bufscope-integration --test cli`
"#;

    #[test]
    fn reads_each_binary_its_counts_and_its_failures() {
        let b = parse(CAPTURED);
        let labels: Vec<_> = b
            .iter()
            .map(|b| (b.label.as_str(), b.target.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("unittests src/lib.rs", "bufscope_common"),
                ("tests/guard.rs", "guard"),
                ("tests/cli.rs", "cli"),
                ("Doc-tests bufscope_common", "bufscope_common"),
            ]
        );
        assert_eq!(
            b[0].counts,
            Some(Counts {
                passed: 2,
                failed: 0,
                ignored: 1,
                secs: 0.01
            })
        );
        assert!(b[0].ok() && b[0].failed.is_empty());
        assert_eq!(
            b[1].counts,
            Some(Counts {
                passed: 2,
                failed: 1,
                ignored: 0,
                secs: 41.27
            })
        );
        // The indented line of captured output is not a failure name; the list is.
        assert_eq!(b[1].failed, ["keeps_limit"]);
        assert!(!b[1].ok());
        // Killed before its result line: no counts, not ok.
        assert_eq!(b[2].counts, None);
        assert!(!b[2].ok());
        assert!(b[3].doc && b[3].ok());
        // cargo's closing list of failed targets is not read as anyone's failure names.
        assert_eq!(b[3].failed, Vec::<String>::new());
    }

    #[test]
    fn a_binary_run_directly_is_read_without_a_running_line() {
        let b = parse(
            "running 1 test\ntest udp_drops ... FAILED\n\nfailures:\n    udp_drops\n\n\
             test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 12 filtered out; \
             finished in 30.02s\n",
        );
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].failed, ["udp_drops"]);
        assert_eq!(
            b[0].counts.as_ref().map(|c| (c.failed, c.secs)),
            Some((1, 30.02))
        );
    }

    #[test]
    fn a_target_name_with_dashes_and_no_hash_is_kept_whole() {
        assert_eq!(
            running("tests/x.rs (target/debug/deps/kernel_matrix-0a1b)").target,
            "kernel_matrix"
        );
        assert_eq!(
            running("src/main.rs (target/debug/my-tool)").target,
            "my-tool"
        );
    }
}
