//! `cargo xtask dist`'s artifacts, built by the real command (twice: revision 1 and, as the
//! upgrade, revision 2) and checked the way an operator would use them:
//!
//! - `sha256sum -c SHA256SUMS`; each binary statically linked (`readelf`: no interpreter, no
//!   shared library) and `bufscope check` passing in a root that holds nothing but the binary
//!   (a chroot with only `/proc` and `/sys` mounted);
//! - each SBOM lists exactly the crates `cargo tree` says the binary's build takes for the musl
//!   target: the normal dependencies as `required`, the build dependencies as `excluded`;
//! - the units: `systemd-analyze security --offline` exposure ≤ 3.0 on the files the `.deb`
//!   installs, and `systemd-analyze verify` clean where they are installed (below);
//! - the `.deb` installed with dpkg into a clean Debian 12 container that runs systemd
//!   (`SYSTEMD_IMAGE`, made by `cargo xtask setup`): nothing enabled or started, the user made;
//!   then the service started as an operator does, under its sandbox as a non-root user with five
//!   ambient capabilities; its drop count for a receiver on this host equals the kernel's drops
//!   column; the revision-2 package installed over it restarts it (a new main pid), and the count
//!   goes on, drops during the upgrade included; purge removes the pins (the pinned programs
//!   leave the kernel), the user and `/etc/bufscope`;
//! - `bufscope-tunnel`'s `.deb`: an instance of its template brings a tunnel up under the unit's
//!   sandbox (dynamic user, `CAP_NET_ADMIN` only, the key file handed over as a credential);
//! - the `.rpm`s (no RPM-based image is reachable offline): `rpm -qlp`, `--scripts`,
//!   `--requires`, and the payload's files equal to the `.deb`'s.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::UdpSocket;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bufscope_testkit::{Metrics, proc_udp_drops};
use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Made by `cargo xtask setup` (xtask/src/dist.rs).
const SYSTEMD_IMAGE: &str = "localhost/bufscope-systemd:bookworm";
const DROPS: &str = "bufscope_socket_drops_total";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `cmd`'s (success, stdout, stderr).
fn run(cmd: &mut Command) -> (bool, String, String) {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `cmd`'s stdout; panics with its stderr when it fails.
fn ok(cmd: &mut Command) -> String {
    let shown = format!("{cmd:?}");
    let (good, out, err) = run(cmd);
    assert!(good, "{shown} failed:\n{out}\n{err}");
    out
}

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test needs root: run `cargo xtask test`"
    );
}

/// The two builds: revision 1 and revision 2 (the upgrade), once per test binary, and under
/// `cargo nextest` (a process per test) once per run: the first test builds them, holding
/// `target/dist-test/.lock`, and leaves the run's id (`NEXTEST_RUN_ID`) in a stamp; the others
/// of the same run wait on the lock and use them (or fail at once when that build failed).
struct Dist {
    a: PathBuf,
    b: PathBuf,
}

fn dist() -> &'static Dist {
    static DIST: OnceLock<Dist> = OnceLock::new();
    DIST.get_or_init(|| {
        require_root();
        let base = repo().join("target/dist-test");
        let a = base.join("rev1");
        let b = base.join("rev2");
        std::fs::create_dir_all(&base).unwrap();
        let lock = std::fs::File::create(base.join(".lock")).unwrap();
        lock.lock().unwrap();
        let run_id = std::env::var("NEXTEST_RUN_ID").ok();
        let stamp = base.join(".built-by-run");
        if let Some(id) = &run_id {
            match std::fs::read_to_string(&stamp) {
                Ok(s) if s == format!("{id} ok") => return Dist { a, b },
                Ok(s) if s == format!("{id} failed") => {
                    panic!("cargo xtask dist failed in this run (the first dist test's output says why)")
                }
                _ => {}
            }
        }
        let _ = std::fs::remove_file(&stamp);
        if let Some(id) = &run_id {
            // Replaced by "ok" below; left as "failed" when a build panics.
            std::fs::write(&stamp, format!("{id} failed")).unwrap();
        }
        for (out, rev, extra) in [(&a, "1", None), (&b, "2", Some("--no-setup"))] {
            let t = Instant::now();
            let mut c = Command::new(env!("CARGO_BIN_EXE_xtask"));
            c.args(["dist", "--revision", rev, "--out"]).arg(out);
            c.args(extra);
            let status = c.status().unwrap();
            assert!(status.success(), "cargo xtask dist --revision {rev} failed");
            eprintln!(
                "cargo xtask dist --revision {rev}: {:.0} s",
                t.elapsed().as_secs_f64()
            );
        }
        if let Some(id) = &run_id {
            std::fs::write(&stamp, format!("{id} ok")).unwrap();
        }
        Dist { a, b }
    })
}

fn deb(dir: &Path, package: &str, rev: u32) -> PathBuf {
    let p = dir.join(format!("{package}_{VERSION}-{rev}_amd64.deb"));
    assert!(p.exists(), "{} missing", p.display());
    p
}

fn rpm(dir: &Path, package: &str, rev: u32) -> PathBuf {
    let p = dir.join(format!("{package}-{VERSION}-{rev}.x86_64.rpm"));
    assert!(p.exists(), "{} missing", p.display());
    p
}

fn binary(dir: &Path, bin: &str) -> PathBuf {
    let p = dir.join(format!("{bin}-{VERSION}-x86_64-linux"));
    assert!(p.exists(), "{} missing", p.display());
    p
}

#[test]
#[ignore = "needs root; builds the release artifacts: run via cargo xtask test"]
fn sha256sums_cover_every_artifact_and_verify() {
    let d = dist();
    let sums = std::fs::read_to_string(d.a.join("SHA256SUMS")).unwrap();
    let listed: BTreeSet<String> = sums
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap().to_string())
        .collect();
    let present: BTreeSet<String> = std::fs::read_dir(&d.a)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "SHA256SUMS")
        .collect();
    assert_eq!(listed, present, "SHA256SUMS must list every artifact");
    let expected: BTreeSet<String> = [
        format!("bufscope-{VERSION}-x86_64-linux"),
        format!("bufscope-{VERSION}-x86_64-linux.cdx.json"),
        format!("bufscope_{VERSION}-1_amd64.deb"),
        format!("bufscope-{VERSION}-1.x86_64.rpm"),
        format!("bufscope-tunnel-{VERSION}-x86_64-linux"),
        format!("bufscope-tunnel-{VERSION}-x86_64-linux.cdx.json"),
        format!("bufscope-tunnel_{VERSION}-1_amd64.deb"),
        format!("bufscope-tunnel-{VERSION}-1.x86_64.rpm"),
    ]
    .into_iter()
    .collect();
    assert_eq!(present, expected);
    let out = ok(Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(&d.a));
    assert_eq!(
        out.lines().filter(|l| l.ends_with(": OK")).count(),
        8,
        "{out}"
    );
    // And it fails when a byte changes (the check is real).
    let tmp = d.a.parent().unwrap().join("tampered");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    for n in expected
        .iter()
        .chain(std::iter::once(&"SHA256SUMS".to_string()))
    {
        std::fs::copy(d.a.join(n), tmp.join(n)).unwrap();
    }
    let victim = tmp.join(format!("bufscope-{VERSION}-x86_64-linux.cdx.json"));
    let mut text = std::fs::read(&victim).unwrap();
    text.push(b'\n');
    std::fs::write(&victim, text).unwrap();
    let (good, out, _) = run(Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(&tmp));
    assert!(!good && out.contains("FAILED"), "{out}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// A root holding only `bin` (as `/bufscope`) and mounts of `/proc` and `/sys`, in a mount
/// namespace of its own; `bin args…` run there. Returns (exit ok, stdout, stderr).
fn run_alone(bin: &Path, args: &[&str]) -> (bool, String, String) {
    let root = std::env::temp_dir().join(format!("bufscope-alone-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    std::fs::copy(bin, root.join("bufscope")).unwrap();
    let script = format!(
        "set -e; cd {r}; mkdir proc sys; mount -t proc proc proc; mount --rbind /sys sys; \
         echo files: $(find . -path ./proc -prune -o -path ./sys -prune -o -print | sort | tr '\\n' ' '); \
         exec chroot . /bufscope {}",
        args.join(" "),
        r = root.display()
    );
    let r = run(Command::new("unshare").args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ]));
    let _ = std::fs::remove_dir_all(&root);
    r
}

#[test]
#[ignore = "needs root (loads BPF); builds the release artifacts: run via cargo xtask test"]
fn static_binaries_run_alone_and_check_passes() {
    let d = dist();
    for bin in ["bufscope", "bufscope-tunnel"] {
        let p = binary(&d.a, bin);
        let headers = ok(Command::new("readelf").args(["-l", "-d", "-W"]).arg(&p));
        assert!(
            !headers.contains("INTERP") && !headers.contains("(NEEDED)"),
            "{bin} is not static:\n{headers}"
        );
        let (good, out, err) = run_alone(&p, &["--version"]);
        assert!(good, "{bin} --version alone: {out}{err}");
        assert!(out.contains(VERSION), "{out}");
    }
    let (good, out, err) = run_alone(&binary(&d.a, "bufscope"), &["check"]);
    eprintln!("{out}{err}");
    assert!(good, "bufscope check in an empty root failed");
    assert!(
        out.lines().any(|l| l == "files: . ./bufscope"),
        "the root held more: {out}"
    );
    for probe in ["drops", "setsockopt", "tcp_state", "autotune", "owners"] {
        assert!(
            out.lines().any(|l| l.starts_with("[ ok ] ")
                && l[7..].trim_start().starts_with(probe)
                && l.ends_with("attached")),
            "probe {probe} did not attach in the empty root:\n{out}"
        );
    }
}

/// (name, version) of every crate `cargo tree` lists for `package` on the musl target with
/// `edges` (`normal`, `build`), the package itself excluded.
fn cargo_tree(package: &str, edges: &str) -> BTreeSet<(String, String)> {
    let out = ok(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(repo())
            .args([
                "tree",
                "--locked",
                "-p",
                package,
                "--target",
                "x86_64-unknown-linux-musl",
            ])
            .args(["-e", edges, "--prefix", "none", "--format", "{p}"]),
    );
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let name = w.next()?.to_string();
            let version = w.next()?.trim_start_matches('v').to_string();
            (name != package).then_some((name, version))
        })
        .collect()
}

#[test]
#[ignore = "builds the release artifacts: run via cargo xtask test"]
fn each_sbom_lists_the_crates_its_binary_is_built_from() {
    let d = dist();
    for bin in ["bufscope", "bufscope-tunnel"] {
        let sbom: Value = serde_json::from_str(
            &std::fs::read_to_string(d.a.join(format!("{bin}-{VERSION}-x86_64-linux.cdx.json")))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(sbom["bomFormat"], "CycloneDX");
        assert_eq!(sbom["metadata"]["component"]["name"], bin);
        let comps = sbom["components"].as_array().unwrap();
        let by_scope = |scope: &str| -> BTreeSet<(String, String)> {
            comps
                .iter()
                .filter(|c| c["scope"] == scope)
                .map(|c| {
                    (
                        c["name"].as_str().unwrap().to_string(),
                        c["version"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        };
        let required = by_scope("required");
        let excluded = by_scope("excluded");
        let linked = cargo_tree(bin, "normal");
        let all = cargo_tree(bin, "normal,build");
        let build_only: BTreeSet<_> = all.difference(&linked).cloned().collect();
        eprintln!(
            "{bin}: SBOM {} components ({} required, {} excluded); cargo tree: {} normal, {} more for the build",
            comps.len(),
            required.len(),
            excluded.len(),
            linked.len(),
            build_only.len()
        );
        assert_eq!(
            required, linked,
            "{bin}: the SBOM's required components differ from `cargo tree -e normal`"
        );
        assert_eq!(
            excluded, build_only,
            "{bin}: the SBOM's excluded components differ from the build-only crates of `cargo tree`"
        );
        assert_eq!(comps.len(), all.len());
        // Registry crates carry Cargo.lock's checksum; the workspace's own are path crates.
        let lock = lock_checksums();
        for c in comps {
            let key = (
                c["name"].as_str().unwrap().to_string(),
                c["version"].as_str().unwrap().to_string(),
            );
            let purl = c["purl"].as_str().unwrap();
            assert!(
                purl.starts_with(&format!("pkg:cargo/{}@{}", key.0, key.1)),
                "{c}"
            );
            match lock.get(&key) {
                Some(sum) => assert_eq!(
                    c["hashes"][0]["content"].as_str(),
                    Some(sum.as_str()),
                    "{bin}: {key:?} hash differs from Cargo.lock"
                ),
                None => assert!(
                    purl.contains("download_url=file"),
                    "{bin}: {key:?} neither in the registry nor ours"
                ),
            }
        }
    }
}

/// Cargo.lock's checksum of every registry package: (name, version) -> SHA-256.
fn lock_checksums() -> std::collections::BTreeMap<(String, String), String> {
    let text = std::fs::read_to_string(repo().join("Cargo.lock")).unwrap();
    let mut out = std::collections::BTreeMap::new();
    for block in text.split("[[package]]") {
        let field = |k: &str| {
            block.lines().find_map(|l| {
                l.strip_prefix(&format!("{k} = \""))
                    .and_then(|v| v.strip_suffix('"'))
                    .map(String::from)
            })
        };
        if let (Some(n), Some(v), Some(sum)) = (field("name"), field("version"), field("checksum"))
        {
            out.insert((n, v), sum);
        }
    }
    out
}

/// `dpkg-deb -x` of `deb` into a fresh directory.
fn unpack_deb(deb: &Path, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bufscope-deb-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    ok(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&dir));
    dir
}

/// The overall exposure `systemd-analyze security --offline=true` gives `unit`, and its table.
fn exposure(unit: &Path) -> (f64, String) {
    let (_, out, err) = run(Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(unit));
    let text = format!("{out}{err}");
    let score = text
        .lines()
        .find_map(|l| {
            let rest = l.split("Overall exposure level for ").nth(1)?;
            rest.split(": ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no exposure in:\n{text}"));
    (score, text)
}

#[test]
#[ignore = "builds the release artifacts: run via cargo xtask test"]
fn units_exposure_is_at_most_3() {
    let d = dist();
    for (package, unit, instance) in [
        ("bufscope", "bufscope.service", "bufscope.service"),
        (
            "bufscope-tunnel",
            "bufscope-tunnel@.service",
            "bufscope-tunnel@bst0.service",
        ),
    ] {
        let root = unpack_deb(&deb(&d.a, package, 1), package);
        let file = root.join("usr/lib/systemd/system").join(unit);
        assert!(file.exists(), "{package}.deb has no {unit}");
        // An instance of the template, as systemd would load it.
        let named = root.join(instance);
        std::fs::copy(&file, &named).unwrap();
        let (score, table) = exposure(&named);
        eprintln!("{table}");
        assert!(score <= 3.0, "{instance}: exposure {score} > 3.0");
        std::fs::remove_dir_all(&root).unwrap();
    }
}

/// A clean Debian 12 container running systemd as its init ([`SYSTEMD_IMAGE`]), privileged (it
/// is the host that systemd would run on), its own bpffs mounted at `/sys/fs/bpf` as systemd
/// mounts it at boot on a host (a fresh instance: removing the container drops every pin in it).
/// Removed on drop.
struct Container {
    name: String,
}

impl Container {
    fn start(tag: &str, network: &str) -> Self {
        require_root();
        let (has, _, _) = run(Command::new("podman").args(["image", "exists", SYSTEMD_IMAGE]));
        assert!(
            has,
            "{SYSTEMD_IMAGE} is missing: `cargo xtask setup` makes it (mmdebstrap)"
        );
        let name = format!("bufscope-dist-{tag}-{}", std::process::id());
        let _ = run(Command::new("podman").args(["rm", "-f", "-t", "0", &name]));
        ok(Command::new("podman").args([
            "run",
            "-d",
            "--name",
            &name,
            "--privileged",
            "--systemd=always",
            &format!("--network={network}"),
            // The host's processes, for attribution (as the DaemonSet's --path.procfs).
            "-v",
            "/proc:/host/proc:ro",
            SYSTEMD_IMAGE,
            "/sbin/init",
        ]));
        let c = Self { name };
        let t = Instant::now();
        loop {
            let (_, state, _) = c.exec(&["systemctl", "is-system-running"]);
            let state = state.trim().to_string();
            if state == "running" || state == "degraded" {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(90),
                "systemd in {} did not come up: {state}",
                c.name
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        c.ok(&["mount", "-t", "bpf", "bpf", "/sys/fs/bpf"]);
        // A host's systemd makes `/` a shared mount at boot; the container runtime made it
        // private, and then the credentials systemd mounts for a unit (LoadCredential=, in a
        // helper's namespace) never reach the unit.
        c.ok(&["mount", "--make-rshared", "/"]);
        c
    }

    fn exec(&self, args: &[&str]) -> (bool, String, String) {
        run(Command::new("podman").args(["exec", &self.name]).args(args))
    }

    fn ok(&self, args: &[&str]) -> String {
        let (good, out, err) = self.exec(args);
        assert!(good, "in the container: {args:?} failed:\n{out}\n{err}");
        out
    }

    fn sh(&self, script: &str) -> String {
        self.ok(&["sh", "-c", script])
    }

    /// Copies `file` into the container's /root; its path there.
    fn copy_in(&self, file: &Path) -> String {
        let dest = format!("/root/{}", file.file_name().unwrap().to_string_lossy());
        ok(Command::new("podman")
            .arg("cp")
            .arg(file)
            .arg(format!("{}:{dest}", self.name)));
        dest
    }

    /// The container's init as the host sees it.
    fn host_pid(&self) -> u32 {
        ok(Command::new("podman").args(["inspect", "--format", "{{.State.Pid}}", &self.name]))
            .trim()
            .parse()
            .unwrap()
    }

    fn main_pid(&self, unit: &str) -> u32 {
        self.ok(&["systemctl", "show", "--property=MainPID", "--value", unit])
            .trim()
            .parse()
            .unwrap()
    }

    /// A field of /proc/<pid>/status of a process in the container.
    fn status(&self, pid: u32, field: &str) -> String {
        let s = self.ok(&["cat", &format!("/proc/{pid}/status")]);
        s.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
            .trim()
            .to_string()
    }

    fn wait_active(&self, unit: &str) {
        let t = Instant::now();
        loop {
            let (_, state, _) = self.exec(&["systemctl", "is-active", unit]);
            match state.trim() {
                "active" => return,
                "failed" => panic!(
                    "{unit} failed:\n{}",
                    self.exec(&["journalctl", "-u", unit, "--no-pager"]).1
                ),
                _ => {}
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{unit} not active: {state}\n{}",
                self.exec(&["journalctl", "-u", unit, "--no-pager"]).1
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = run(Command::new("podman").args(["rm", "-f", "-t", "0", &self.name]));
    }
}

/// Capability mask of `names` (the numbers of linux/capability.h).
fn cap_mask(names: &[&str]) -> u64 {
    names
        .iter()
        .map(|n| match *n {
            "CAP_DAC_READ_SEARCH" => 1u64 << 2,
            "CAP_NET_ADMIN" => 1 << 12,
            "CAP_SYS_PTRACE" => 1 << 19,
            "CAP_PERFMON" => 1 << 38,
            "CAP_BPF" => 1 << 39,
            other => panic!("no number for {other}"),
        })
        .fold(0, |a, b| a | b)
}

fn hex_mask(s: &str) -> u64 {
    u64::from_str_radix(s.trim(), 16).unwrap()
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A UDP receiver on this host that never reads, with a 4 KiB receive buffer: datagrams sent
/// to it beyond that are dropped, and the kernel counts them in its drops column.
struct Receiver {
    sock: UdpSocket,
    inode: u64,
}

impl Receiver {
    fn new() -> Self {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let size: libc::c_int = 4096;
        // SAFETY: setsockopt on an open socket with an int of the size given.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&raw const size).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        // SAFETY: fstat fills the zeroed struct it is handed.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstat(sock.as_raw_fd(), &mut st) }, 0);
        Self {
            sock,
            inode: st.st_ino,
        }
    }

    fn flood(&self, n: usize) {
        let to = self.sock.local_addr().unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..n {
            let _ = tx.send_to(&[0x55; 512], to);
        }
    }

    /// The kernel's drops column for this socket.
    fn kernel_drops(&self) -> u64 {
        proc_udp_drops(std::process::id(), self.inode).unwrap()
    }
}

fn scrape(port: u16) -> Option<Metrics> {
    let (code, body) = bufscope_testkit::http_get(&format!("127.0.0.1:{port}"), "/metrics").ok()?;
    (code == 200).then(|| Metrics::parse(&body))
}

/// Waits until bufscope's drops of this process equal the kernel's column; both.
fn drops_agree(port: u16, r: &Receiver) -> (u64, u64) {
    let me = std::process::id().to_string();
    let t = Instant::now();
    let mut last = (0, 0);
    while t.elapsed() < Duration::from_secs(30) {
        let kernel = r.kernel_drops();
        if let Some(m) = scrape(port) {
            let ours = m.sum(DROPS, &[("pid", me.as_str()), ("proto", "udp")]) as u64;
            last = (kernel, ours);
            if ours == kernel && kernel > 0 {
                return last;
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("bufscope's drops never matched the kernel's (kernel, bufscope) = {last:?}");
}

#[test]
#[ignore = "needs root, podman and the systemd test image (loads BPF): run via cargo xtask test"]
fn deb_installs_nothing_running_then_the_service_counts_through_an_upgrade_and_purge_removes_all() {
    let d = dist();
    let c = Container::start("deb", "host");
    let a = c.copy_in(&deb(&d.a, "bufscope", 1));
    let b = c.copy_in(&deb(&d.b, "bufscope", 2));

    // Install: the user and the pin directory are made; nothing is enabled or started.
    let out = c.ok(&["dpkg", "-i", &a]);
    eprintln!("dpkg -i:\n{out}");
    assert_eq!(
        c.exec(&["systemctl", "is-enabled", "bufscope.service"])
            .1
            .trim(),
        "disabled"
    );
    assert_eq!(
        c.exec(&["systemctl", "is-active", "bufscope.service"])
            .1
            .trim(),
        "inactive"
    );
    let user = c.ok(&["getent", "passwd", "bufscope"]);
    let uid: u32 = user.split(':').nth(2).unwrap().parse().unwrap();
    assert!(uid > 0 && uid < 1000, "a system user: {user}");
    assert_eq!(
        c.ok(&["stat", "-c", "%U %a", "/sys/fs/bpf/bufscope"])
            .trim(),
        "bufscope 700"
    );
    // The unit as installed: verify finds nothing to complain about (unknown settings, missing
    // executables, bad dependencies).
    let (good, out, err) = c.exec(&["systemd-analyze", "verify", "bufscope.service"]);
    assert!(
        good && out.trim().is_empty() && err.trim().is_empty(),
        "verify:\n{out}{err}"
    );
    // The installed files: version and preflight (as root, as an operator first runs it).
    assert!(c.ok(&["bufscope", "--version"]).contains(VERSION));
    let check = c.ok(&["bufscope", "check"]);
    eprintln!("{check}");

    // The operator's configuration: a free port on loopback, the host's /proc (this container
    // has a pid namespace of its own; the receiver below is a host process).
    let port = free_port();
    c.sh(&format!(
        "sed -i 's/^  listen_address: .*/  listen_address: \"127.0.0.1:{port}\"/' /etc/bufscope/bufscope.yaml && \
         printf 'path:\\n  procfs: /host/proc\\n' >> /etc/bufscope/bufscope.yaml"
    ));
    c.ok(&["systemctl", "enable", "--now", "bufscope.service"]);
    c.wait_active("bufscope.service");
    let t = Instant::now();
    loop {
        let m = scrape(port);
        let attached = m.as_ref().map_or(0, |m| {
            ["drops", "setsockopt", "tcp_state", "autotune", "owners"]
                .iter()
                .filter(|p| m.sum("bufscope_probe_attached", &[("probe", p)]) >= 1.0)
                .count()
        });
        if attached == 5 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the service's probes did not all attach:\n{}",
            c.exec(&["journalctl", "-u", "bufscope", "--no-pager"]).1
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // The sandbox as the kernel applied it: the dedicated user, exactly the five capabilities
    // (ambient = effective = bounding), no_new_privs, a seccomp filter.
    let pid = c.main_pid("bufscope.service");
    let five = cap_mask(&[
        "CAP_BPF",
        "CAP_PERFMON",
        "CAP_NET_ADMIN",
        "CAP_SYS_PTRACE",
        "CAP_DAC_READ_SEARCH",
    ]);
    assert_eq!(
        c.status(pid, "Uid").split_whitespace().nth(1).unwrap(),
        uid.to_string()
    );
    for f in ["CapEff", "CapAmb", "CapBnd"] {
        assert_eq!(hex_mask(&c.status(pid, f)), five, "{f}");
    }
    assert_eq!(c.status(pid, "NoNewPrivs"), "1");
    assert_eq!(c.status(pid, "Seccomp"), "2");

    // Drops of a receiver on this host: bufscope (in the service) = the kernel's column.
    let r = Receiver::new();
    r.flood(2000);
    let (k1, b1) = drops_agree(port, &r);
    eprintln!("before the upgrade: kernel drops column {k1}, bufscope {b1}");
    let m = scrape(port).unwrap();
    assert_eq!(
        m.sum("bufscope_bpf_pins_info", &[("outcome", "created")]),
        1.0
    );

    // The upgrade, while datagrams keep being dropped: postinst restarts the service (a new
    // main pid); the new bufscope adopts the pins and its count goes on from the kernel's.
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                r.flood(50);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let out = c.ok(&["dpkg", "-i", "--force-confold", &b]);
        eprintln!("dpkg -i (upgrade):\n{out}");
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(
        c.ok(&["dpkg-query", "-W", "-f", "${Version}", "bufscope"])
            .trim(),
        format!("{VERSION}-2")
    );
    c.wait_active("bufscope.service");
    let pid2 = c.main_pid("bufscope.service");
    assert_ne!(pid, pid2, "the upgrade did not restart bufscope");
    let (k2, b2) = drops_agree(port, &r);
    eprintln!(
        "after the upgrade (restarted: pid {pid} -> {pid2}): kernel drops column {k2}, bufscope {b2}"
    );
    assert!(k2 > k1, "no drops during and after the upgrade");
    let m = scrape(port).unwrap();
    assert_eq!(
        m.sum("bufscope_bpf_pins_info", &[("outcome", "adopted")]),
        1.0,
        "the restarted bufscope did not adopt its pins"
    );
    let journal = c.ok(&["journalctl", "-u", "bufscope.service", "--no-pager"]);
    assert!(
        journal.contains("attached") || journal.contains("adopt"),
        "no bufscope logs in the journal:\n{journal}"
    );

    // Purge: service stopped, pins (and with them the programs), user and configuration gone.
    let links = PathBuf::from(format!(
        "/proc/{}/root/sys/fs/bpf/bufscope/links",
        c.host_pid()
    ));
    let mut progs = Vec::new();
    for e in std::fs::read_dir(&links).unwrap() {
        let out = ok(Command::new("bpftool")
            .args(["link", "show", "pinned"])
            .arg(e.unwrap().path())
            .arg("-j"));
        let v: Value = serde_json::from_str(&out).unwrap();
        progs.push(v["prog_id"].as_u64().unwrap());
    }
    assert!(!progs.is_empty(), "nothing pinned in {}", links.display());
    c.ok(&["dpkg", "--purge", "bufscope"]);
    assert_eq!(
        c.exec(&["systemctl", "is-active", "bufscope.service"])
            .1
            .trim(),
        "inactive"
    );
    assert!(
        !c.exec(&["test", "-e", "/sys/fs/bpf/bufscope"]).0,
        "pins left"
    );
    assert!(
        !c.exec(&["test", "-e", "/etc/bufscope"]).0,
        "/etc/bufscope left"
    );
    assert!(!c.exec(&["getent", "passwd", "bufscope"]).0, "user left");
    let t = Instant::now();
    loop {
        let alive: Vec<u64> = progs
            .iter()
            .copied()
            .filter(|id| {
                run(Command::new("bpftool").args(["prog", "show", "id", &id.to_string()])).0
            })
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "programs still loaded after purge: {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "needs root, podman and the systemd test image: run via cargo xtask test"]
fn tunnel_deb_brings_a_tunnel_up_under_its_sandbox_and_upgrades() {
    let d = dist();
    let c = Container::start("tunnel", "none");
    let a = c.copy_in(&deb(&d.a, "bufscope-tunnel", 1));
    let b = c.copy_in(&deb(&d.b, "bufscope-tunnel", 2));
    c.ok(&["dpkg", "-i", &a]);
    let (good, out, err) = c.exec(&["systemd-analyze", "verify", "bufscope-tunnel@bst0.service"]);
    assert!(
        good && out.trim().is_empty() && err.trim().is_empty(),
        "verify:\n{out}{err}"
    );
    assert_eq!(
        c.ok(&["stat", "-c", "%a", "/etc/bufscope-tunnel"]).trim(),
        "700"
    );
    assert!(c.ok(&["bufscope-tunnel", "--version"]).contains(VERSION));
    assert_eq!(
        c.exec(&[
            "systemctl",
            "list-units",
            "--no-legend",
            "bufscope-tunnel@*"
        ])
        .1
        .trim(),
        "",
        "an instance runs after install"
    );
    let key = |args: &[&str], input: &str| -> String {
        let mut child = Command::new("wg")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("wg (wireguard-tools; cargo xtask setup installs it)");
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let o = child.wait_with_output().unwrap();
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    };
    let private = key(&["genkey"], "");
    let peer = key(&["pubkey"], &key(&["genkey"], ""));
    let conf = format!(
        "[Interface]\nPrivateKey = {private}\nAddress = 10.231.77.1/30\nListenPort = 51999\n\n\
         [Peer]\nPublicKey = {peer}\nAllowedIPs = 10.231.77.2/32\n"
    );
    c.sh(&format!(
        "umask 077 && printf '%s' '{conf}' > /etc/bufscope-tunnel/bst0.conf"
    ));
    c.ok(&["systemctl", "start", "bufscope-tunnel@bst0.service"]);
    c.wait_active("bufscope-tunnel@bst0.service");
    let t = Instant::now();
    while !c
        .exec(&["ip", "-o", "addr", "show", "bst0"])
        .1
        .contains("10.231.77.1/30")
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "bst0 never got its address:\n{}",
            c.exec(&["journalctl", "-u", "bufscope-tunnel@bst0", "--no-pager"])
                .1
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let pid = c.main_pid("bufscope-tunnel@bst0.service");
    let uid: u32 = c
        .status(pid, "Uid")
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(uid != 0, "the tunnel runs as root");
    let net_admin = cap_mask(&["CAP_NET_ADMIN"]);
    for f in ["CapEff", "CapAmb", "CapBnd"] {
        assert_eq!(hex_mask(&c.status(pid, f)), net_admin, "{f}");
    }
    assert_eq!(c.status(pid, "NoNewPrivs"), "1");
    assert_eq!(
        c.ok(&["stat", "-c", "%U %a", "/etc/bufscope-tunnel/bst0.conf"])
            .trim(),
        "root 600"
    );
    let journal = c.ok(&["journalctl", "-u", "bufscope-tunnel@bst0", "--no-pager"]);
    assert!(journal.contains("bufscope-tunnel up"), "{journal}");

    // Upgrade: the running instance is restarted with the new binary.
    c.ok(&["dpkg", "-i", &b]);
    c.wait_active("bufscope-tunnel@bst0.service");
    let pid2 = c.main_pid("bufscope-tunnel@bst0.service");
    assert_ne!(pid, pid2, "the upgrade did not restart the tunnel");

    // Purge: the instance stops (its device goes); the operator's key file stays.
    c.ok(&["dpkg", "--purge", "bufscope-tunnel"]);
    assert_eq!(
        c.exec(&["systemctl", "is-active", "bufscope-tunnel@bst0.service"])
            .1
            .trim(),
        "inactive"
    );
    assert!(!c.exec(&["ip", "link", "show", "bst0"]).0, "bst0 left");
    assert!(c.exec(&["test", "-f", "/etc/bufscope-tunnel/bst0.conf"]).0);
}

#[test]
#[ignore = "builds the release artifacts: run via cargo xtask test"]
fn rpms_hold_the_debs_files_and_their_scripts() {
    let d = dist();
    for (package, bin) in [
        ("bufscope", "bufscope"),
        ("bufscope-tunnel", "bufscope-tunnel"),
    ] {
        let r = rpm(&d.a, package, 1);
        let files: BTreeSet<String> = ok(Command::new("rpm").arg("-qlp").arg(&r))
            .lines()
            .map(String::from)
            .collect();
        let deb_files: BTreeSet<String> = ok(Command::new("dpkg-deb")
            .arg("-c")
            .arg(deb(&d.a, package, 1)))
        .lines()
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().last())
        .map(|p| p.trim_start_matches('.').to_string())
        .collect();
        eprintln!("{package}.rpm: {files:?}");
        let only_deb: BTreeSet<&String> = deb_files
            .difference(&files)
            .filter(|p| !p.ends_with("/copyright") && !p.ends_with("/changelog.Debian.gz"))
            .collect();
        assert!(
            only_deb.is_empty(),
            "{package}: in the .deb, not the .rpm: {only_deb:?}"
        );
        let only_rpm: BTreeSet<&String> = files
            .difference(&deb_files)
            .filter(|p| {
                p.starts_with('/') && !files.iter().any(|f| f.starts_with(&format!("{p}/")))
            })
            .collect();
        assert!(
            only_rpm.is_empty(),
            "{package}: in the .rpm, not the .deb: {only_rpm:?}"
        );
        let scripts = ok(Command::new("rpm").args(["-qp", "--scripts"]).arg(&r));
        for s in [
            "postinstall scriptlet",
            "preuninstall scriptlet",
            "postuninstall scriptlet",
        ] {
            assert!(scripts.contains(s), "{package}: no {s}:\n{scripts}");
        }
        let requires = ok(Command::new("rpm").args(["-qp", "--requires"]).arg(&r));
        assert!(requires.contains("systemd"), "{requires}");
        assert!(
            !requires.contains(".so"),
            "a static binary requires no library: {requires}"
        );
        // Digests of header and payload.
        ok(Command::new("rpm").args(["-K", "--nosignature"]).arg(&r));
        // Its payload's binary is the shipped static binary, byte for byte.
        let root = std::env::temp_dir().join(format!("bufscope-rpmroot-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        ok(Command::new("rpm")
            .arg("--root")
            .arg(&root)
            .args(["-i", "--nodeps", "--noscripts", "--nosignature"])
            .arg(&r));
        assert_eq!(
            std::fs::read(root.join("usr/bin").join(bin)).unwrap(),
            std::fs::read(binary(&d.a, bin)).unwrap(),
            "{package}.rpm's /usr/bin/{bin} is not the shipped binary"
        );
        std::fs::remove_dir_all(&root).unwrap();
        if package == "bufscope" {
            for needle in [
                "systemd-sysusers bufscope.conf",
                "try-restart bufscope.service",
                "cafe4a11",
            ] {
                assert!(
                    scripts.contains(needle),
                    "{package}: scripts lack {needle:?}:\n{scripts}"
                );
            }
        }
    }
}
