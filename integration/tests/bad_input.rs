//! Bad operator input against the real binary: flags of every subcommand with values that
//! must be refused (empty, huge, negative, malformed, non-UTF-8, a directory where a file is
//! expected, a file that is not YAML, a YAML list, a route bufscope serves itself…), given on
//! the command line and in `--config.file`. Each must end in a usage error (exit 2, clap's
//! message) or in one line on stderr (exit 1), naming the flag (and the key for the file),
//! never in a panic (101), and before bufscope reaches the kernel: bpftrace counts the
//! `bpf(2)`, `mount(2)`, `mkdir(2)` and `bind(2)` calls of every bufscope process meanwhile
//! (there must be none; a bufscope that does start, observed the same way, makes them) and
//! `bpftool prog show` lists no program that was not there before. The cases run twice, each
//! time in a mount namespace of their own: on a fresh node's `/sys/fs/bpf` (no bpffs mounted:
//! it must still be unmounted afterwards) and on one where bpffs is mounted.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use bufscope_integration::node::{Bpffs, bpffs_mounted, ensure_tracefs, in_mount_namespace};
use bufscope_integration::{Exporter, TempDir, bpftrace, bufscope_bin, require_root};

/// One bad input: the arguments, the exit code and a text the first error line must hold.
struct Case {
    args: Vec<OsString>,
    code: i32,
    names: String,
}

fn case(args: &[&str], code: i32, names: &str) -> Case {
    Case {
        args: args.iter().map(OsString::from).collect(),
        code,
        names: names.to_string(),
    }
}

/// `bufscope run <args>` on an ephemeral port (if it wrongly started, it would not take :9477).
fn run(args: &[&str], code: i32, names: &str) -> Case {
    let mut c = case(&["run"], code, names);
    c.args.extend(args.iter().map(OsString::from));
    if !args.contains(&"--web.listen-address") {
        c.args
            .extend(["--web.listen-address", "127.0.0.1:0"].map(OsString::from));
    }
    c
}

fn cases(dir: &Path, bpffs: Bpffs) -> Vec<Case> {
    let file = |name: &str, text: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let sub = dir.join("a-directory");
    std::fs::create_dir_all(&sub).unwrap();
    let sub = sub.display().to_string();
    let garbage = file("garbage.bin", b"\x7fELF\x00\x01\x02\xff\xfe");
    let list = file("list.yaml", b"- web\n- bpf\n");
    let scalar = file("scalar.yaml", b"just a string\n");
    let reserved = file("reserved.yaml", b"web:\n  telemetry_path: /healthz\n");
    let huge = file(
        "huge.yaml",
        b"cardinality:\n  retention: 99999999999999999999h\n",
    );
    let typo = file("typo.yaml", b"cardinality:\n  max_procs: 3\n");
    let probe = file("probe.yaml", b"probes:\n  disable: [dorps]\n");
    let broken = file("broken.yaml", b"web: {listen_address: ':1'\n");
    // Aliases that expand a thousandfold per level (a "billion laughs"), nesting deeper than
    // any parser should follow, a key given twice.
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for (prev, name) in ["a", "b", "c", "d", "e", "f", "g", "h"]
        .iter()
        .zip(["b", "c", "d", "e", "f", "g", "h", "i"])
    {
        let refs = vec![format!("*{prev}"); 10].join(", ");
        bomb.push_str(&format!("{name}: &{name} [{refs}]\n"));
    }
    let bomb = file("bomb.yaml", bomb.as_bytes());
    let deep = file(
        "deep.yaml",
        format!("a: {}{}\n", "[".repeat(5000), "]".repeat(5000)).as_bytes(),
    );
    let twice = file(
        "twice.yaml",
        b"web:\n  listen_address: ':1'\nweb:\n  listen_address: ':2'\n",
    );
    let pins = dir.join("pins").display().to_string();
    let mut v = vec![
        // Pod labels from a directory that is not there.
        run(
            &["--kubernetes.log-dir", &format!("{sub}/missing")],
            1,
            "--kubernetes.log-dir",
        ),
        // The telemetry path: bufscope's own routes and paths no route can have.
        run(
            &["--web.telemetry-path", "/healthz"],
            1,
            "--web.telemetry-path",
        ),
        run(&["--web.telemetry-path", "/"], 1, "--web.telemetry-path"),
        run(
            &["--web.telemetry-path", "/api/v1/findings"],
            1,
            "--web.telemetry-path",
        ),
        run(
            &["--web.telemetry-path", "/api/v1/status"],
            1,
            "--web.telemetry-path",
        ),
        run(&["--web.telemetry-path", ""], 1, "--web.telemetry-path"),
        run(
            &["--web.telemetry-path", "metrics"],
            1,
            "--web.telemetry-path",
        ),
        run(&["--web.telemetry-path", "/:x"], 1, "--web.telemetry-path"),
        run(&["--web.telemetry-path", "/*x"], 1, "--web.telemetry-path"),
        run(&["--web.telemetry-path", "/{x}"], 1, "--web.telemetry-path"),
        run(
            &["--web.telemetry-path", "/a//b"],
            1,
            "--web.telemetry-path",
        ),
        run(
            &["--web.telemetry-path", "/m etrics"],
            1,
            "--web.telemetry-path",
        ),
        // Durations: huge, over a year, negative, empty, below the minimum.
        run(&["--retention", "99999999999999999999h"], 2, "--retention"),
        run(&["--retention", "9000h"], 2, "--retention"),
        run(&["--retention=-5s"], 2, "--retention"),
        run(&["--retention", ""], 2, "--retention"),
        run(
            &["--drops.attribution-hold", "99999999999999999999h"],
            2,
            "--drops.attribution-hold",
        ),
        run(
            &["--advice.window", "99999999999999999999h"],
            2,
            "--advice.window",
        ),
        run(&["--advice.window", "0"], 2, "--advice.window"),
        run(
            &["--poll-interval", "99999999999999999999h"],
            2,
            "--poll-interval",
        ),
        run(&["--poll-interval", "0"], 2, "--poll-interval"),
        // Counts and sizes.
        run(&["--max-processes", "0"], 2, "--max-processes"),
        run(&["--max-processes=-1"], 2, "--max-processes"),
        run(
            &["--max-processes", "99999999999999999999999"],
            2,
            "--max-processes",
        ),
        run(&["--drops.map-entries", "0"], 2, "--drops.map-entries"),
        run(
            &["--owners.map-entries", "4294967296"],
            2,
            "--owners.map-entries",
        ),
        run(
            &["--bpf.events-ring-bytes", "4095"],
            2,
            "--bpf.events-ring-bytes",
        ),
        run(
            &["--guard.udp-floor", "99999999999"],
            2,
            "--guard.udp-floor",
        ),
        // Names.
        run(&["--probe.disable", "dorps"], 2, "--probe.disable"),
        run(&["--probe.disable", ""], 2, "--probe.disable"),
        run(&["--drops.reasons", ""], 2, "--drops.reasons"),
        run(&["--log.level", "loud"], 2, "--log.level"),
        run(&["--guard.mode", "on"], 2, "--guard.mode"),
        run(&["--guard.persist"], 1, "--guard.persist"),
        run(&["--guard.lease", "0s"], 2, "--guard.lease"),
        run(
            &["--guard.mode", "enforce", "--guard.lease", "1m"],
            1,
            "--guard.lease",
        ),
        run(
            &[
                "--guard.mode",
                "observe",
                "--guard.comm",
                "a-name-of-16-chr",
            ],
            1,
            "--guard.comm",
        ),
        run(
            &["--guard.mode", "observe", "--guard.cgroup", "/tmp"],
            1,
            "--guard.cgroup",
        ),
        run(
            &["--guard.mode", "observe", "--probe.disable", "guard"],
            1,
            "--probe.disable",
        ),
        run(
            &["--guard.mode", "enforce", "--probe.disable", "setsockopt"],
            1,
            "--probe.disable",
        ),
        // Addresses.
        run(&["--web.listen-address", ""], 1, "--web.listen-address"),
        run(
            &["--web.listen-address", ":99999"],
            1,
            "--web.listen-address",
        ),
        // Files and directories.
        run(&["--web.config.file", &sub], 1, "--web.config.file"),
        run(
            &["--web.config.file", "/nonexistent/web.yml"],
            1,
            "--web.config.file",
        ),
        run(&["--kernel.btf-path", &sub], 1, "--kernel.btf-path"),
        run(
            &["--kernel.btf-path", "/nonexistent/vmlinux"],
            1,
            "--kernel.btf-path",
        ),
        run(&["--path.procfs", &sub], 1, "--path.procfs"),
        run(&["--path.cgroup2", &sub], 1, "--path.cgroup2"),
        run(&["--bpf.pin-path", "relative"], 2, "--bpf.pin-path"),
        run(&["--bpf.pin-path", &garbage], 1, "--bpf.pin-path"),
        run(&["--bpf.pin-path", &pins], 1, "--bpf.pin-path"),
        // The bpffs itself: its root would get bufscope's maps/, links/ and META.
        run(&["--bpf.pin-path", "/sys/fs/bpf"], 1, "--bpf.pin-path"),
        run(&["--bpf.pin-path", "/sys/fs/bpf/"], 1, "--bpf.pin-path"),
        // The config file: missing, a directory, not text, not a mapping, bad keys and values.
        run(
            &["--config.file", "/nonexistent/bufscope.yaml"],
            1,
            "--config.file",
        ),
        run(&["--config.file", &sub], 1, "--config.file"),
        run(&["--config.file", &garbage], 1, "--config.file"),
        run(&["--config.file", &list], 1, "--config.file"),
        run(&["--config.file", &scalar], 1, "--config.file"),
        run(&["--config.file", &broken], 1, "--config.file"),
        run(&["--config.file", &bomb], 1, "--config.file"),
        run(&["--config.file", &deep], 1, "--config.file"),
        run(&["--config.file", &twice], 1, "--config.file"),
        run(&["--config.file", &typo], 1, "cardinality.max_processes"),
        run(&["--config.file", &huge], 1, "cardinality.retention"),
        run(&["--config.file", &probe], 1, "probes.disable"),
        run(&["--config.file", &reserved], 1, "web.telemetry_path"),
        // The other subcommands.
        case(&["check", "--probe.disable", "dorps"], 2, "--probe.disable"),
        case(
            &["check", "--bpf.pin-path", "relative"],
            2,
            "--bpf.pin-path",
        ),
        case(&["cleanup", "--bpf.pin-path", ""], 2, "--bpf.pin-path"),
        case(
            &["cleanup", "--bpf.pin-path", "relative"],
            2,
            "--bpf.pin-path",
        ),
        case(&["cleanup", "--bpf.pin-path", &sub], 1, "not on a bpffs"),
        case(
            &["cleanup", "--bpf.pin-path", "/sys/fs/bpf"],
            1,
            match bpffs {
                Bpffs::Mounted => "the root of a bpffs",
                Bpffs::Absent => "/sys/fs/bpf is not on a bpffs",
            },
        ),
        case(&["explain", "--url", "garbage"], 1, "--url"),
        case(&["explain", "--pid", "99999999999"], 2, "--pid"),
        case(
            &["top", "--interval", "99999999999999999999h"],
            2,
            "--interval",
        ),
    ];
    // Arguments that are not UTF-8: refused where a text is expected.
    let non_utf8 = || OsString::from_vec(b"\xff\xfe".to_vec());
    for flag in ["--web.listen-address", "--retention", "--guard.comm"] {
        let mut c = case(&["run", flag], 2, "invalid UTF-8");
        c.args.push(non_utf8());
        v.push(c);
    }
    v
}

/// Runs `cmd` with stdin closed; returns its exit code (None when it was still running after
/// `limit` and was killed: it started instead of refusing) and its stderr.
fn output_within(cmd: &mut Command, limit: Duration) -> (Option<i32>, String) {
    use std::io::Read as _;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    });
    let start = std::time::Instant::now();
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, reader.join().unwrap())
}

/// Ids of the programs the kernel has loaded (bpftool).
fn prog_ids() -> BTreeSet<u64> {
    let out = Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .expect("bpftool (cargo xtask setup installs it)");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["id"].as_u64())
        .collect()
}

/// The bpftrace probes that count the `bpf`, `mount`, `mkdir` and `bind` calls of every process
/// whose group leader's comm is `comm`.
fn syscall_probes(comm: &str) -> String {
    ["bpf", "mount", "mkdir", "mkdirat", "bind"]
        .iter()
        .map(|s| {
            format!(
                "tracepoint:syscalls:sys_enter_{s} /curtask->group_leader->comm == \"{comm}\"/ \
                 {{ @n[\"{s}\"] = count(); }}"
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs every case with `bin` while bpftrace counts `probes`; returns what went wrong and the
/// calls counted.
fn refuse_all(
    cases: &[Case],
    bin: &Path,
    probes: &str,
) -> (Vec<String>, std::collections::BTreeMap<String, u64>) {
    let mut failures = Vec::new();
    let calls = bpftrace::counts(probes, "", Duration::from_secs(60), || {
        for c in cases {
            let (code, err) = output_within(
                Command::new(bin)
                    .args(&c.args)
                    .env("NO_COLOR", "1")
                    .env("RUST_BACKTRACE", "0"),
                Duration::from_secs(20),
            );
            let first = err.lines().next().unwrap_or("");
            let what = format!("{:?} → {code:?}: {err}", c.args);
            if code != Some(c.code) || err.contains("panicked") {
                failures.push(format!("exit code, want {}: {what}", c.code));
            } else if !first.contains(&c.names) {
                failures.push(format!("first line lacks {:?}: {what}", c.names));
            } else if c.code == 1
                && (err.lines().count() != 1 || !first.starts_with("bufscope: error: "))
            {
                failures.push(format!("not one `bufscope: error:` line: {what}"));
            } else if c.code == 2 && !first.starts_with("error: ") {
                failures.push(format!("not clap's usage error: {what}"));
            }
        }
    });
    (failures, calls)
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn bad_input_is_refused_before_anything_is_loaded() {
    require_root();
    let bin = bufscope_bin();
    // The comm of bufscope's threads' group leader (the kernel keeps 15 bytes).
    let comm: String = bin
        .file_name()
        .unwrap()
        .to_string_lossy()
        .chars()
        .take(15)
        .collect();
    let probes = syscall_probes(&comm);
    let before = prog_ids();
    let mut refused = 0;
    for bpffs in [Bpffs::Absent, Bpffs::Mounted] {
        let d = TempDir::new("bad-input");
        let cases = cases(d.path(), bpffs);
        refused += cases.len();
        let (failures, calls, mounted_after) = in_mount_namespace(bpffs, || {
            // bpftrace's tracepoints need tracefs (a fresh node may have none mounted).
            ensure_tracefs();
            let (f, c) = refuse_all(&cases, &bin, &probes);
            (f, c, bpffs_mounted())
        });
        assert!(
            failures.is_empty(),
            "bpffs {bpffs:?}:\n{}",
            failures.join("\n")
        );
        assert!(
            calls.is_empty(),
            "bpffs {bpffs:?}: bufscope reached the kernel on bad input (syscall → calls): {calls:?}"
        );
        // The kernel's own word: a fresh node's /sys/fs/bpf is still no bpffs.
        assert_eq!(
            mounted_after,
            bpffs == Bpffs::Mounted,
            "bpffs {bpffs:?}: /sys/fs/bpf changed under bad input"
        );
        assert!(
            !d.path().join("pins").exists(),
            "--bpf.pin-path outside a bpffs was created"
        );
    }
    // The same observer sees a bufscope that does start: its calls are counted.
    let control = in_mount_namespace(Bpffs::Absent, || {
        ensure_tracefs();
        bpftrace::counts(&probes, "", Duration::from_secs(60), || {
            drop(Exporter::start(&[]));
        })
    });
    assert!(
        control.get("bpf").is_some_and(|n| *n > 0) && control.get("bind").is_some_and(|n| *n > 0),
        "the observer missed a bufscope that started: {control:?}"
    );
    let new: Vec<u64> = prog_ids().difference(&before).copied().collect();
    assert!(new.is_empty(), "programs loaded meanwhile: {new:?}");
    eprintln!(
        "{refused} bad inputs refused (on a fresh node's /sys/fs/bpf and on a mounted bpffs); \
         bufscope made no bpf/mount/mkdir/bind call (bpftrace); a good start made {control:?}"
    );
}
