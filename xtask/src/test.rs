//! `cargo xtask test`: setup, unit tests, then the privileged integration tests, serially
//! (they share kernel state: BPF programs, namespaces, sysctls), then the kernel matrix; one
//! summary at the end: each test binary and guest step with its counts and seconds, the time
//! of each stage, and every failure again with the command that reruns just it.
//!
//! `cargo test` writes into a pipe read here (stdout and stderr on the same pipe, so cargo's
//! `Running …` lines and each binary's libtest lines stay in order) and every byte is echoed to
//! this process's stdout, so `cargo xtask test > file` and `| tee` keep the whole log.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::ExitStatus;
use std::time::Instant;

use anyhow::{Context as _, bail};

use crate::libtest::{Binary, Parser};
use crate::util::{cargo, is_root, shell_word, workspace_root};

/// Arguments of `cargo xtask test`.
#[derive(clap::Args)]
pub struct Args {
    /// Skip the kernel-matrix stage (guest kernels under QEMU; `cargo xtask matrix` runs it
    /// alone).
    #[arg(long)]
    pub no_matrix: bool,
    /// Only this package's tests (e.g. `bufscope-integration`); repeatable.
    #[arg(short = 'p', long = "package")]
    pub packages: Vec<String>,
    /// Only this integration test binary (e.g. `guard`); repeatable.
    #[arg(long = "test")]
    pub tests: Vec<String>,
    /// Only the library's unit tests.
    #[arg(long)]
    pub lib: bool,
    /// Only this binary's unit tests; repeatable.
    #[arg(long = "bin")]
    pub bins: Vec<String>,
    /// Only the doc tests.
    #[arg(long)]
    pub doc: bool,
    /// Kernel matrix: only these kernels (names from kernels.pin, e.g. `6.1`); repeatable.
    #[arg(long = "kernel")]
    pub kernels: Vec<String>,
    /// Kernel matrix: only the guest steps whose name contains this text; repeatable.
    #[arg(long = "step")]
    pub steps: Vec<String>,
    /// Extra arguments passed to the test binaries (e.g. a test name filter).
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// Runs every test of the workspace, ignored (privileged) ones included.
pub fn run(a: &Args) -> anyhow::Result<()> {
    if !is_root() {
        bail!("cargo xtask test runs privileged tests (BPF, namespaces): run it as root");
    }
    if !a.no_matrix {
        crate::matrix::check_filters(&a.kernels, &a.steps)?;
    }
    let started = Instant::now();
    let mut stages: Vec<(String, f64)> = Vec::new();
    let t = Instant::now();
    crate::setup::run(&crate::setup::Args::default())?;
    stages.push(("setup".into(), t.elapsed().as_secs_f64()));
    let t = Instant::now();
    crate::build::build(false)?;
    stages.push(("build".into(), t.elapsed().as_secs_f64()));

    let t = Instant::now();
    let host = host_suite(a)?;
    let host_secs = t.elapsed().as_secs_f64();
    stages.push((
        format!(
            "host suite (compiling {:.0} s, running {:.0} s)",
            host.compile_secs,
            host_secs - host.compile_secs
        ),
        host_secs,
    ));
    let mut failures = host_failures(a, &host);

    let mut matrix_steps = Vec::new();
    if !a.no_matrix {
        let t = Instant::now();
        match crate::matrix::stage(&a.kernels, &a.steps) {
            Ok(out) => {
                matrix_steps = out.steps;
                failures.extend(out.failures);
                let per: Vec<String> = out
                    .kernel_secs
                    .iter()
                    .map(|(k, s)| format!("{k}: {s} s"))
                    .collect();
                stages.push((
                    format!("kernel matrix ({})", per.join(", ")),
                    t.elapsed().as_secs_f64(),
                ));
            }
            Err(e) => {
                stages.push(("kernel matrix".into(), t.elapsed().as_secs_f64()));
                let mut again = String::from("cargo xtask matrix");
                for k in &a.kernels {
                    again.push_str(&format!(" --kernel {}", shell_word(k)));
                }
                for st in &a.steps {
                    again.push_str(&format!(" --step {}", shell_word(st)));
                }
                failures.push((format!("kernel matrix: {e:#}"), again));
            }
        }
    }
    stages.push(("total".into(), started.elapsed().as_secs_f64()));
    let mut text = String::new();
    if !host.slowest.is_empty() {
        text.push_str("\n== cargo xtask test: the slowest tests ==\n");
    }
    for (secs, label, name) in &host.slowest {
        text.push_str(&format!("{secs:>8.1} s  {name} ({label})\n"));
    }
    text.push_str(&summary(&stages, &host.binaries, &matrix_steps, &failures));
    print!("{text}");
    if failures.is_empty() {
        Ok(())
    } else {
        bail!(
            "cargo xtask test: {} failure(s), listed above",
            failures.len()
        )
    }
}

/// What the host suite's `cargo test` reported.
struct HostRun {
    /// Each binary, labelled with the `cargo test` selector that runs it alone.
    binaries: Vec<(String, Binary)>,
    /// The part of the stage before the first binary ran (compiling the tests).
    compile_secs: f64,
    status: ExitStatus,
    /// The cargo selector of each binary (`-p bufscope-integration --test guard`), by index.
    selectors: Vec<Option<String>>,
    /// The slowest tests: seconds, binary, name.
    slowest: Vec<(f64, String, String)>,
}

/// Runs `cargo test` for the workspace (or the packages and targets `a` names), echoing its
/// output and reading it.
fn host_suite(a: &Args) -> anyhow::Result<HostRun> {
    let root = workspace_root();
    let mut c = cargo();
    c.env("BUFSCOPE_BIN", root.join("target/debug/bufscope"))
        .args(["test", "--no-fail-fast"]);
    if a.packages.is_empty() {
        c.args(["--workspace", "--exclude", EXCLUDED]);
    }
    for p in &a.packages {
        c.args(["-p", p]);
    }
    for t in &a.tests {
        c.args(["--test", t]);
    }
    for b in &a.bins {
        c.args(["--bin", b]);
    }
    if a.lib {
        c.arg("--lib");
    }
    if a.doc {
        c.arg("--doc");
    }
    c.args(["--", "--include-ignored", "--test-threads=1"]);
    if a.no_matrix {
        // It boots a guest: part of the matrix, not of the fast loop.
        c.args(["--skip", MATRIX_LOG_TEST]);
    }
    c.args(&a.args);
    eprintln!("xtask: {c:?}");
    let (reader, writer) = std::io::pipe().context("creating a pipe for cargo test")?;
    c.stdout(writer.try_clone().context("cloning the pipe")?)
        .stderr(writer);
    let started = Instant::now();
    let mut child = c.spawn().context("starting cargo test")?;
    // The command holds the pipe's write end: drop it, or the pipe never ends.
    drop(c);
    let mut parser = Parser::default();
    let mut compile_secs = None;
    let mut r = BufReader::new(reader);
    let mut buf = Vec::new();
    let mut out = std::io::stdout();
    let mut tests = Vec::new();
    let mut last_line = Instant::now();
    loop {
        buf.clear();
        if r.read_until(b'\n', &mut buf)
            .context("reading cargo test's output")?
            == 0
        {
            break;
        }
        // A closed stdout (`| head`) must not stop the tests.
        let _ = out.write_all(&buf).and_then(|()| out.flush());
        let seen = parser.binaries.len();
        let line = String::from_utf8_lossy(&buf);
        parser.line(&line);
        if seen == 0 && !parser.binaries.is_empty() {
            compile_secs = Some(started.elapsed().as_secs_f64());
        }
        // One test at a time, output captured: a test's line ends when it does, and the line
        // before it ended when it started.
        if let Some(name) = finished_test(&line) {
            let label = parser
                .binaries
                .last()
                .map(|b| b.label.clone())
                .unwrap_or_default();
            tests.push((last_line.elapsed().as_secs_f64(), label, name.to_string()));
        }
        last_line = Instant::now();
    }
    tests.retain(|t| t.0 >= 1.0);
    tests.sort_by(|a, b| b.0.total_cmp(&a.0));
    tests.truncate(SLOWEST);
    let status = child.wait().context("waiting for cargo test")?;
    let compile_secs = compile_secs.unwrap_or_else(|| started.elapsed().as_secs_f64());
    let mut targets = workspace_targets().unwrap_or_else(|e| {
        eprintln!("xtask test: cannot name the test binaries' packages ({e:#})");
        Vec::new()
    });
    // Only the packages that ran (two packages may have a `bufscope` binary in src/main.rs).
    targets.retain(|t| {
        if a.packages.is_empty() {
            t.package != EXCLUDED
        } else {
            a.packages.contains(&t.package)
        }
    });
    let selectors: Vec<Option<String>> = parser
        .binaries
        .iter()
        .map(|b| selector(&targets, b))
        .collect();
    let binaries = parser
        .binaries
        .into_iter()
        .zip(&selectors)
        .map(|(b, s)| (s.clone().unwrap_or_else(|| b.label.clone()), b))
        .collect();
    Ok(HostRun {
        binaries,
        compile_secs,
        status,
        selectors,
        slowest: tests,
    })
}

/// The package the host suite leaves out: the BPF programs build only for the bpf target
/// (through the exporter's build script).
const EXCLUDED: &str = "bufscope-ebpf";

/// The test of xtask's own that boots a guest kernel (`xtask/tests/matrix_log.rs`):
/// `--no-matrix` skips it with the matrix.
const MATRIX_LOG_TEST: &str = "matrix_output_redirected_to_a_file_keeps_every_byte";

/// How many of the slowest tests (of those over a second) the summary names.
const SLOWEST: usize = 10;

/// The name in a libtest line that ends a test that ran (`test a::b ... ok`).
fn finished_test(line: &str) -> Option<&str> {
    let (name, result) = line.trim_end().strip_prefix("test ")?.split_once(" ... ")?;
    (result == "ok" || result == "FAILED").then_some(name)
}

/// The failures of the host suite, each with the command that reruns just it.
fn host_failures(a: &Args, host: &HostRun) -> Vec<(String, String)> {
    let mut failures = Vec::new();
    for ((label, b), sel) in host.binaries.iter().zip(&host.selectors) {
        if b.ok() {
            continue;
        }
        let mut again = String::from("cargo xtask test --no-matrix");
        match sel {
            Some(s) => {
                again.push(' ');
                again.push_str(s);
            }
            None => again.push_str(&format!(" # {}", b.label)),
        }
        let what = if b.failed.is_empty() {
            format!("{label}: ended without a test result (crashed or killed)")
        } else {
            again.push_str(" -- --exact");
            for t in &b.failed {
                again.push(' ');
                again.push_str(&shell_word(t));
            }
            format!("{label}: {}", b.failed.join(", "))
        };
        failures.push((what, again));
    }
    if failures.is_empty() && !host.status.success() {
        // Nothing ran, or cargo failed outside any binary (a build error is above).
        let mut again = String::from("cargo xtask test --no-matrix");
        for p in &a.packages {
            again.push_str(&format!(" -p {}", shell_word(p)));
        }
        for t in &a.tests {
            again.push_str(&format!(" --test {}", shell_word(t)));
        }
        failures.push((format!("cargo test exited with {}", host.status), again));
    }
    failures
}

/// A test target of the workspace, from `cargo metadata`.
#[derive(Clone)]
struct Target {
    package: String,
    name: String,
    kind: String,
    src_path: String,
}

fn workspace_targets() -> anyhow::Result<Vec<Target>> {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .output()
        .context("cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("cargo metadata")?;
    let mut targets = Vec::new();
    for p in v["packages"].as_array().into_iter().flatten() {
        let package = p["name"].as_str().unwrap_or_default();
        for t in p["targets"].as_array().into_iter().flatten() {
            targets.push(Target {
                package: package.to_string(),
                name: t["name"].as_str().unwrap_or_default().to_string(),
                kind: t["kind"][0].as_str().unwrap_or_default().to_string(),
                src_path: t["src_path"].as_str().unwrap_or_default().to_string(),
            });
        }
    }
    Ok(targets)
}

/// The `cargo test` arguments that select `b` alone (`-p bufscope-integration --test guard`).
fn selector(targets: &[Target], b: &Binary) -> Option<String> {
    let named = |t: &&Target| t.name.replace('-', "_") == b.target.replace('-', "_");
    if b.doc {
        let t = targets
            .iter()
            .filter(named)
            .find(|t| t.kind.contains("lib"))?;
        return Some(format!("-p {} --doc", t.package));
    }
    let path = b.label.strip_prefix("unittests ").unwrap_or(&b.label);
    let candidates: Vec<&Target> = targets.iter().filter(named).collect();
    let at_path: Vec<&&Target> = candidates
        .iter()
        .filter(|t| t.src_path.ends_with(path))
        .collect();
    let t = match (&at_path[..], &candidates[..]) {
        ([t], _) => **t,
        ([], [t]) => t,
        // Ambiguous or unknown: better no selector than a wrong one.
        _ => return None,
    };
    let which = match t.kind.as_str() {
        "test" => format!("--test {}", t.name),
        "bin" => format!("--bin {}", t.name),
        "bench" => format!("--bench {}", t.name),
        "example" => format!("--example {}", t.name),
        _ => "--lib".to_string(),
    };
    Some(format!("-p {} {which}", t.package))
}

/// The closing summary: stage times, one row per test binary and guest step, the totals, and
/// every failure with the command that reruns it.
fn summary(
    stages: &[(String, f64)],
    binaries: &[(String, Binary)],
    steps: &[crate::matrix::StepResult],
    failures: &[(String, String)],
) -> String {
    let mut s = String::from("\n== cargo xtask test: summary ==\n");
    for (name, secs) in stages {
        s.push_str(&format!("{secs:>8.0} s  {name}\n"));
    }
    s.push_str(&format!(
        "\n{:>7} {:>7} {:>8} {:>8}  test binary / guest step\n",
        "passed", "failed", "ignored", "secs"
    ));
    let (mut p, mut f, mut i, mut secs) = (0u32, 0u32, 0u32, 0f64);
    let mut row = |s: &mut String, pa: u32, fa: u32, ig: u32, sec: f64, name: &str| {
        s.push_str(&format!("{pa:>7} {fa:>7} {ig:>8} {sec:>8.1}  {name}\n"));
        (p, f, i, secs) = (p + pa, f + fa, i + ig, secs + sec);
    };
    let mut empty = 0;
    for (label, b) in binaries {
        match &b.counts {
            Some(c) if c.passed + c.failed + c.ignored == 0 && b.failed.is_empty() => empty += 1,
            Some(c) => row(
                &mut s,
                c.passed,
                c.failed.max(b.failed.len() as u32),
                c.ignored,
                c.secs,
                label,
            ),
            None => row(
                &mut s,
                0,
                b.failed.len().max(1) as u32,
                0,
                0.0,
                &format!("{label} (no test result: crashed or killed)"),
            ),
        }
    }
    for st in steps {
        row(
            &mut s,
            st.passed,
            st.failed,
            st.ignored,
            st.secs as f64,
            &format!("[{}] {}", st.kernel, st.name),
        );
    }
    s.push_str(&format!(
        "{p:>7} {f:>7} {i:>8} {secs:>8.1}  total ({} test binaries, {empty} of them without \
         tests and not shown; {} guest steps)\n",
        binaries.len(),
        steps.len()
    ));
    if failures.is_empty() {
        s.push_str("\nall passed\n");
    } else {
        s.push_str(&format!(
            "\nFAILED ({}); rerun each alone with:\n",
            failures.len()
        ));
        for (what, again) in failures {
            s.push_str(&format!("  {what}\n    {again}\n"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(package: &str, name: &str, kind: &str, src: &str) -> Target {
        Target {
            package: package.into(),
            name: name.into(),
            kind: kind.into(),
            src_path: format!("/w/{src}"),
        }
    }

    fn binaries(text: &str) -> Vec<Binary> {
        let mut p = Parser::default();
        for l in text.lines() {
            p.line(l);
        }
        p.binaries
    }

    #[test]
    fn each_binary_is_named_by_the_selector_that_reruns_it() {
        let targets = [
            target(
                "bufscope-common",
                "bufscope_common",
                "lib",
                "common/src/lib.rs",
            ),
            target("bufscope", "bufscope", "lib", "exporter/src/lib.rs"),
            target("bufscope", "bufscope", "bin", "exporter/src/main.rs"),
            target(
                "bufscope-integration",
                "guard",
                "test",
                "integration/tests/guard.rs",
            ),
            target(
                "bufscope-integration",
                "bufscope-workload",
                "bin",
                "integration/src/bin/bufscope-workload.rs",
            ),
        ];
        let b = binaries(
            "     Running unittests src/lib.rs (target/debug/deps/bufscope_common-0f3a)\n\
             \x20    Running unittests src/lib.rs (target/debug/deps/bufscope-1b2c)\n\
             \x20    Running unittests src/main.rs (target/debug/deps/bufscope-3d4e)\n\
             \x20    Running tests/guard.rs (target/debug/deps/guard-5f6a)\n\
             \x20    Running unittests src/bin/bufscope-workload.rs (target/debug/deps/bufscope_workload-7b8c)\n\
             \x20  Doc-tests bufscope_common\n",
        );
        let sel: Vec<Option<String>> = b.iter().map(|b| selector(&targets, b)).collect();
        assert_eq!(
            sel,
            [
                Some("-p bufscope-common --lib".to_string()),
                Some("-p bufscope --lib".to_string()),
                Some("-p bufscope --bin bufscope".to_string()),
                Some("-p bufscope-integration --test guard".to_string()),
                Some("-p bufscope-integration --bin bufscope-workload".to_string()),
                Some("-p bufscope-common --doc".to_string()),
            ]
        );
        // Another package's `bufscope` binary at the same relative path: no guess.
        let mut both = targets.to_vec();
        both.push(target(
            "bufscope-ebpf",
            "bufscope",
            "bin",
            "ebpf/src/main.rs",
        ));
        assert_eq!(selector(&both, &b[2]), None);
    }

    #[test]
    fn the_summary_totals_and_lists_each_failure_with_its_rerun() {
        let targets = [target(
            "bufscope-integration",
            "guard",
            "test",
            "integration/tests/guard.rs",
        )];
        let b = binaries(
            "     Running tests/guard.rs (target/debug/deps/guard-5f6a)\n\
             test a::keeps_limit ... FAILED\n\
             failures:\n    a::keeps_limit\n\n\
             test result: FAILED. 2 passed; 1 failed; 3 ignored; 0 measured; 0 filtered out; finished in 4.50s\n",
        );
        let sel = b.iter().map(|b| selector(&targets, b)).collect::<Vec<_>>();
        let host = HostRun {
            binaries: b
                .into_iter()
                .zip(&sel)
                .map(|(b, s)| (s.clone().unwrap_or_default(), b))
                .collect(),
            compile_secs: 1.0,
            status: std::os::unix::process::ExitStatusExt::from_raw(256),
            selectors: sel,
            slowest: vec![],
        };
        let a = Args {
            no_matrix: true,
            packages: vec![],
            tests: vec![],
            lib: false,
            bins: vec![],
            doc: false,
            kernels: vec![],
            steps: vec![],
            args: vec![],
        };
        let failures = host_failures(&a, &host);
        assert_eq!(
            failures,
            [(
                "-p bufscope-integration --test guard: a::keeps_limit".to_string(),
                "cargo xtask test --no-matrix -p bufscope-integration --test guard -- --exact a::keeps_limit"
                    .to_string()
            )]
        );
        let steps = [crate::matrix::StepResult {
            kernel: "6.1".into(),
            name: "TCP lock + wscale vs ss -tni".into(),
            passed: 1,
            failed: 0,
            ignored: 0,
            secs: 30,
        }];
        let s = summary(&[("total".into(), 40.0)], &host.binaries, &steps, &failures);
        assert!(
            s.contains("      2       1        3      4.5  -p bufscope-integration --test guard\n"),
            "{s}"
        );
        assert!(
            s.contains("      1       0        0     30.0  [6.1] TCP lock + wscale vs ss -tni\n"),
            "{s}"
        );
        assert!(
            s.contains(
                "      3       1        3     34.5  total (1 test binaries, 0 of them without tests and not shown; 1 guest steps)\n"
            ),
            "{s}"
        );
        assert!(s.ends_with(
            "FAILED (1); rerun each alone with:\n  -p bufscope-integration --test guard: a::keeps_limit\n    \
             cargo xtask test --no-matrix -p bufscope-integration --test guard -- --exact a::keeps_limit\n"
        ), "{s}");
    }
}
