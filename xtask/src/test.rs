//! `cargo xtask test`: setup, the build, the host stage (`cargo nextest run`: unit tests and
//! the privileged integration tests, in parallel but for the `node-wide` group of
//! `.config/nextest.toml`, which runs alone; then `cargo test --doc`) and, beside it, the
//! kernel matrix (its QEMU guests under `SCHED_IDLE`, on the CPU time the host tests leave);
//! one summary at the end: each test binary and guest step with its counts and
//! seconds, the time of each stage, and every failure again with the command that reruns just
//! it.
//!
//! The runners write into a pipe read here (stdout and stderr on the same pipe, so their lines
//! stay in order) and every byte is echoed to this process's stdout, so `cargo xtask test >
//! file` and `| tee` keep the whole log, each test's line with its seconds included. The
//! counts come from nextest's JUnit report, the doc tests' from libtest's text.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Command, ExitStatus};
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
    if needs_static(a) {
        crate::dist::build_static(crate::dist::Arch::X86_64)?;
    }
    stages.push(("build".into(), t.elapsed().as_secs_f64()));

    // The kernel matrix runs beside the host stage, its guests on CPU time the host tests
    // leave idle (`Priority::Background`): most host tests wait on the network or the
    // kernel, and the node-wide group runs one test at a time.
    let matrix = (!a.no_matrix).then(|| {
        let (kernels, steps) = (a.kernels.clone(), a.steps.clone());
        std::thread::spawn(move || {
            let t = Instant::now();
            let out = crate::matrix::stage(&kernels, &steps, crate::matrix::Priority::Background);
            (out, t.elapsed().as_secs_f64())
        })
    });

    let t = Instant::now();
    let host = host_suite(a);
    let host_secs = t.elapsed().as_secs_f64();
    let mut failures = Vec::new();
    let mut host_binaries = Vec::new();
    let mut slowest = Vec::new();
    match host {
        Ok(host) => {
            stages.push((
                format!(
                    "host suite (compiling {:.0} s, running {:.0} s)",
                    host.compile_secs,
                    host_secs - host.compile_secs
                ),
                host_secs,
            ));
            failures = host_failures(a, &host);
            host_binaries = host.binaries;
            slowest = host.slowest;
        }
        Err(e) => {
            stages.push(("host suite".into(), host_secs));
            failures.push((
                format!("host suite: {e:#}"),
                "cargo xtask test --no-matrix".into(),
            ));
        }
    }

    let mut matrix_steps = Vec::new();
    if let Some(m) = matrix {
        let (out, secs) = m
            .join()
            .unwrap_or_else(|_| (Err(anyhow::anyhow!("the matrix's thread panicked")), 0.0));
        match out {
            Ok(out) => {
                matrix_steps = out.steps;
                failures.extend(out.failures);
                let per: Vec<String> = out
                    .kernel_secs
                    .iter()
                    .map(|(k, s)| format!("{k}: {s} s"))
                    .collect();
                stages.push((
                    format!("kernel matrix, beside the host suite ({})", per.join(", ")),
                    secs,
                ));
            }
            Err(e) => {
                stages.push(("kernel matrix".into(), secs));
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
    if !slowest.is_empty() {
        text.push_str("\n== cargo xtask test: the slowest tests ==\n");
    }
    for (secs, label, name) in &slowest {
        text.push_str(&format!("{secs:>8.1} s  {name} ({label})\n"));
    }
    text.push_str(&summary(&stages, &host_binaries, &matrix_steps, &failures));
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

/// True when the selection runs a test of the release artifacts (`xtask/tests/dist.rs`,
/// `integration/tests/static_binary.rs`) or the kernel matrix (its guests run the static
/// binary): the build stage then builds the static binaries of `cargo xtask dist` too (a
/// release build for musl: the one build besides the debug one), so no test builds them under
/// its timeout.
fn needs_static(a: &Args) -> bool {
    let every_target = a.tests.is_empty() && a.bins.is_empty() && !a.lib && !a.doc;
    let package = |p: &str| a.packages.is_empty() || a.packages.iter().any(|q| q == p);
    let test = |t: &str| every_target || a.tests.iter().any(|q| q == t);
    (package("xtask") && test("dist"))
        || (package("bufscope-integration") && test("static_binary"))
        || !a.no_matrix
}

/// One test binary of the host stage as the summary shows it.
#[derive(Clone, Debug, Default, PartialEq)]
struct Row {
    /// The `cargo xtask test` selector that runs it alone (`-p bufscope-integration --test
    /// guard`), else what the runner called it.
    label: String,
    /// True when `label` is a selector.
    selector: bool,
    passed: u32,
    failed: u32,
    ignored: u32,
    secs: f64,
    /// Names of the failed tests.
    failed_tests: Vec<String>,
    /// It ended without reporting its tests (crashed or killed).
    no_result: bool,
}

/// What the host stage reported.
struct HostRun {
    /// Each binary, labelled with the selector that runs it alone.
    binaries: Vec<Row>,
    /// The part of the stage before the first test ran (compiling the tests).
    compile_secs: f64,
    /// How the runners exited (the first failure).
    status: ExitStatus,
    /// The slowest tests: seconds, binary, name.
    slowest: Vec<(f64, String, String)>,
}

/// The host stage: `cargo nextest run` for every test but the doc tests (the groups and
/// timeouts of `.config/nextest.toml`), then `cargo test --doc` (nextest runs no doc tests);
/// each echoed into this process's stdout and read back — nextest through its JUnit report.
fn host_suite(a: &Args) -> anyhow::Result<HostRun> {
    let started = Instant::now();
    let only_doc = a.doc && a.tests.is_empty() && a.bins.is_empty() && !a.lib;
    // Doc tests live in library targets: a selection of packages without one (the tunnel's
    // binary crate) has none, and `cargo test --doc` refuses it.
    let with_doc = (a.doc || (a.tests.is_empty() && a.bins.is_empty() && !a.lib))
        && (a.packages.is_empty() || a.packages.iter().any(|p| has_lib(p)));
    let mut binaries = Vec::new();
    let mut slowest = Vec::new();
    let mut status = ExitStatus::default();
    let mut compile_secs = None;
    if !only_doc {
        let junit = workspace_root().join("target/nextest/default/junit.xml");
        let _ = std::fs::remove_file(&junit);
        let mut c = cargo();
        c.args(["nextest", "run", "--no-fail-fast", "--run-ignored", "all"]);
        selection(&mut c, a);
        for t in &a.tests {
            c.args(["--test", t]);
        }
        for b in &a.bins {
            c.args(["--bin", b]);
        }
        if a.lib {
            c.arg("--lib");
        }
        if !a.args.is_empty() {
            c.arg("--").args(&a.args);
        }
        let (st, first) = echo(c, |l| l.trim_start().starts_with("Starting "))?;
        status = st;
        compile_secs = first.map(|t| t.duration_since(started).as_secs_f64());
        match std::fs::read_to_string(&junit) {
            Ok(xml) => {
                let suites = crate::junit::parse(&xml)
                    .with_context(|| format!("reading {}", junit.display()))?;
                for s in &suites {
                    let label = binary_selector(&s.name);
                    for c in s.cases.iter().filter(|c| c.secs >= 1.0) {
                        slowest.push((c.secs, label.clone(), c.name.clone()));
                    }
                    binaries.push(suite_row(s));
                }
            }
            // No report: nextest stopped before running (a build error is above).
            Err(e) => eprintln!("xtask test: no JUnit report at {} ({e})", junit.display()),
        }
    }
    if with_doc {
        let mut c = cargo();
        c.env(
            "BUFSCOPE_BIN",
            workspace_root().join("target/debug/bufscope"),
        )
        .args(["test", "--doc", "--no-fail-fast"]);
        selection(&mut c, a);
        c.arg("--").args(&a.args);
        let mut parser = Parser::default();
        let (st, first) = echo(c, |l| {
            let seen = parser.binaries.len();
            parser.line(l);
            seen == 0 && !parser.binaries.is_empty()
        })?;
        if status.success() {
            status = st;
        }
        if compile_secs.is_none() {
            compile_secs = first.map(|t| t.duration_since(started).as_secs_f64());
        }
        binaries.extend(doc_rows(parser.binaries));
    }
    slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
    slowest.truncate(SLOWEST);
    Ok(HostRun {
        binaries,
        compile_secs: compile_secs.unwrap_or_else(|| started.elapsed().as_secs_f64()),
        status,
        slowest,
    })
}

/// The packages `a` selects (the workspace but the BPF crate when none), and the binary
/// under test.
/// Whether workspace package `name` has a library target (true when `cargo metadata` cannot
/// tell: `cargo test --doc` then says what is wrong).
fn has_lib(name: &str) -> bool {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .output();
    let Ok(out) = out else {
        return true;
    };
    let Ok(meta) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        return true;
    };
    lib_in_metadata(&meta, name).unwrap_or(true)
}

/// Whether `cargo metadata`'s package `name` has a `lib` target (None: no such package).
fn lib_in_metadata(meta: &serde_json::Value, name: &str) -> Option<bool> {
    let pkg = meta["packages"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)?;
    Some(pkg["targets"].as_array()?.iter().any(|t| {
        t["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "lib"))
    }))
}

fn selection(c: &mut Command, a: &Args) {
    c.env(
        "BUFSCOPE_BIN",
        workspace_root().join("target/debug/bufscope"),
    );
    if a.packages.is_empty() {
        c.args(["--workspace", "--exclude", EXCLUDED]);
    }
    for p in &a.packages {
        c.args(["-p", p]);
    }
}

/// Runs `c` with stdout and stderr on one pipe, echoing every byte to this process's stdout;
/// returns its exit status and when the first line `first` accepts arrived (`first` sees
/// every line).
fn echo(
    mut c: Command,
    mut first: impl FnMut(&str) -> bool,
) -> anyhow::Result<(ExitStatus, Option<Instant>)> {
    eprintln!("xtask: {c:?}");
    let (reader, writer) = std::io::pipe().context("creating a pipe")?;
    c.stdout(writer.try_clone().context("cloning the pipe")?)
        .stderr(writer);
    let mut child = c.spawn().with_context(|| format!("starting {c:?}"))?;
    // The command holds the pipe's write end: drop it, or the pipe never ends.
    drop(c);
    let mut r = BufReader::new(reader);
    let mut buf = Vec::new();
    let mut out = std::io::stdout();
    let mut at = None;
    loop {
        buf.clear();
        if r.read_until(b'\n', &mut buf)
            .context("reading the tests' output")?
            == 0
        {
            break;
        }
        // A closed stdout (`| head`) must not stop the tests.
        let _ = out.write_all(&buf).and_then(|()| out.flush());
        let line = String::from_utf8_lossy(&buf);
        // Every line goes to `first` (it may parse them all); the first it accepts is timed.
        if first(&line) && at.is_none() {
            at = Some(Instant::now());
        }
    }
    Ok((child.wait().context("waiting for the tests")?, at))
}

/// nextest's binary id as the `cargo test` selector that runs it alone: `pkg` is the
/// library's unit tests, `pkg::bin/name` a binary's, `pkg::name` an integration test (`pkg::
/// bench/name`, `pkg::example/name` likewise).
fn binary_selector(id: &str) -> String {
    let Some((pkg, rest)) = id.split_once("::") else {
        return format!("-p {id} --lib");
    };
    match rest.split_once('/') {
        Some((kind @ ("bin" | "bench" | "example" | "test"), name)) => {
            format!("-p {pkg} --{kind} {name}")
        }
        _ => format!("-p {pkg} --test {rest}"),
    }
}

/// A suite of the JUnit report as a summary row.
fn suite_row(s: &crate::junit::Suite) -> Row {
    let failed_tests: Vec<String> = s
        .cases
        .iter()
        .filter(|c| c.failed)
        .map(|c| c.name.clone())
        .collect();
    Row {
        label: binary_selector(&s.name),
        selector: true,
        passed: (s.cases.len() - failed_tests.len()) as u32,
        failed: failed_tests.len() as u32,
        ignored: 0,
        secs: s.cases.iter().map(|c| c.secs).sum(),
        failed_tests,
        no_result: false,
    }
}

/// The doc-test runs `cargo test --doc` reported, as summary rows.
fn doc_rows(binaries: Vec<Binary>) -> Vec<Row> {
    binaries
        .into_iter()
        .map(|b| {
            let c = b.counts.clone().unwrap_or_default();
            let krate = b.target.replace('_', "-");
            Row {
                label: format!("-p {krate} --doc"),
                selector: b.doc,
                passed: c.passed,
                failed: c.failed.max(b.failed.len() as u32),
                ignored: c.ignored,
                secs: c.secs,
                no_result: b.counts.is_none(),
                failed_tests: b.failed,
            }
        })
        .collect()
}

/// The package the host suite leaves out: the BPF programs build only for the bpf target
/// (through the exporter's build script).
const EXCLUDED: &str = "bufscope-ebpf";

/// How many of the slowest tests (of those over a second) the summary names.
const SLOWEST: usize = 10;

/// The failures of the host suite, each with the command that reruns just it.
fn host_failures(a: &Args, host: &HostRun) -> Vec<(String, String)> {
    let mut failures = Vec::new();
    for b in &host.binaries {
        if b.failed == 0 && !b.no_result {
            continue;
        }
        let mut again = String::from("cargo xtask test --no-matrix");
        if b.selector {
            again.push(' ');
            again.push_str(&b.label);
        } else {
            again.push_str(&format!(" # {}", b.label));
        }
        let what = if b.failed_tests.is_empty() {
            format!(
                "{}: ended without a test result (crashed or killed)",
                b.label
            )
        } else {
            again.push_str(" -- --exact");
            for t in &b.failed_tests {
                again.push(' ');
                again.push_str(&shell_word(t));
            }
            format!("{}: {}", b.label, b.failed_tests.join(", "))
        };
        failures.push((what, again));
    }
    if failures.is_empty() && !host.status.success() {
        // Nothing ran, or the runner failed outside any test (a build error is above).
        let mut again = String::from("cargo xtask test --no-matrix");
        for p in &a.packages {
            again.push_str(&format!(" -p {}", shell_word(p)));
        }
        for t in &a.tests {
            again.push_str(&format!(" --test {}", shell_word(t)));
        }
        failures.push((format!("the host stage exited with {}", host.status), again));
    }
    failures
}

/// The closing summary: stage times, one row per test binary and guest step, the totals, and
/// every failure with the command that reruns it.
fn summary(
    stages: &[(String, f64)],
    binaries: &[Row],
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
    for b in binaries {
        if b.no_result {
            row(
                &mut s,
                0,
                b.failed.max(1),
                0,
                0.0,
                &format!("{} (no test result: crashed or killed)", b.label),
            );
        } else if b.passed + b.failed + b.ignored == 0 {
            empty += 1;
        } else {
            row(&mut s, b.passed, b.failed, b.ignored, b.secs, &b.label);
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

    fn args(line: &[&str]) -> Args {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: Args,
        }
        let mut argv = vec!["test"];
        argv.extend(line);
        <Cli as clap::Parser>::try_parse_from(argv)
            .map(|c| c.a)
            .unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    #[test]
    fn the_static_binaries_are_built_only_for_the_tests_and_the_matrix_that_run_them() {
        for (line, want) in [
            (&[][..], true),
            (&["--no-matrix"][..], true),
            (&["--no-matrix", "-p", "xtask"][..], true),
            (
                &["--no-matrix", "-p", "xtask", "--test", "matrix_log"][..],
                false,
            ),
            (
                &[
                    "--no-matrix",
                    "-p",
                    "bufscope-integration",
                    "--test",
                    "guard",
                ][..],
                false,
            ),
            (
                &[
                    "--no-matrix",
                    "-p",
                    "bufscope-integration",
                    "--test",
                    "static_binary",
                ][..],
                true,
            ),
            (&["--no-matrix", "--test", "dist"][..], true),
            (&["--no-matrix", "-p", "bufscope", "--lib"][..], false),
            (&["--no-matrix", "--doc"][..], false),
            // The matrix's guests run the static binary, whichever steps are chosen.
            (&["--doc", "--step", "wscale"][..], true),
            (&["--doc", "--step", "static binary"][..], true),
            (&["--doc"][..], true),
        ] {
            assert_eq!(needs_static(&args(line)), want, "{line:?}");
        }
    }

    /// The tunnel (a binary crate) has no library, so no doc tests; the exporter has one.
    #[test]
    fn doc_tests_only_for_packages_with_a_library() {
        let meta = serde_json::json!({"packages": [
            {"name": "bufscope-tunnel", "targets": [{"kind": ["bin"]}, {"kind": ["test"]}]},
            {"name": "bufscope", "targets": [{"kind": ["lib"]}, {"kind": ["bin"]}]},
        ]});
        assert_eq!(lib_in_metadata(&meta, "bufscope-tunnel"), Some(false));
        assert_eq!(lib_in_metadata(&meta, "bufscope"), Some(true));
        assert_eq!(lib_in_metadata(&meta, "nope"), None);
        assert!(!has_lib("bufscope-tunnel"), "this workspace's tunnel crate");
        assert!(has_lib("bufscope"));
    }

    #[test]
    fn each_binary_is_named_by_the_selector_that_reruns_it() {
        let sel: Vec<String> = [
            "bufscope-common",
            "bufscope::bin/bufscope",
            "bufscope-integration::guard",
            "bufscope-integration::bin/bufscope-workload",
            "bufscope-tunnel::bench/throughput",
        ]
        .iter()
        .map(|id| binary_selector(id))
        .collect();
        assert_eq!(
            sel,
            [
                "-p bufscope-common --lib",
                "-p bufscope --bin bufscope",
                "-p bufscope-integration --test guard",
                "-p bufscope-integration --bin bufscope-workload",
                "-p bufscope-tunnel --bench throughput",
            ]
        );
        let mut p = Parser::default();
        for l in [
            "   Doc-tests bufscope_policy",
            "test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.20s",
        ] {
            p.line(l);
        }
        let rows = doc_rows(p.binaries);
        assert_eq!(
            (rows[0].label.as_str(), rows[0].passed, rows[0].selector),
            ("-p bufscope-policy --doc", 2, true)
        );
    }

    #[test]
    fn the_summary_totals_and_lists_each_failure_with_its_rerun() {
        let suites = crate::junit::parse(
            r#"<testsuites><testsuite name="bufscope-integration::guard">
            <testcase name="a::keeps_limit" time="4.0"><failure type="x"/></testcase>
            <testcase name="b" time="0.25"/><testcase name="c" time="0.25"/>
            </testsuite></testsuites>"#,
        )
        .unwrap_or_default();
        let host = HostRun {
            binaries: suites.iter().map(suite_row).collect(),
            compile_secs: 1.0,
            status: std::os::unix::process::ExitStatusExt::from_raw(256),
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
            s.contains("      2       1        0      4.5  -p bufscope-integration --test guard\n"),
            "{s}"
        );
        assert!(
            s.contains("      1       0        0     30.0  [6.1] TCP lock + wscale vs ss -tni\n"),
            "{s}"
        );
        assert!(
            s.contains(
                "      3       1        0     34.5  total (1 test binaries, 0 of them without tests and not shown; 1 guest steps)\n"
            ),
            "{s}"
        );
        assert!(s.ends_with(
            "FAILED (1); rerun each alone with:\n  -p bufscope-integration --test guard: a::keeps_limit\n    \
             cargo xtask test --no-matrix -p bufscope-integration --test guard -- --exact a::keeps_limit\n"
        ), "{s}");
    }
}
