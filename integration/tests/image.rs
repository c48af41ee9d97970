//! The container image, built from `Dockerfile` by a real engine (rootful podman 4.3 + runc,
//! installed and configured by `cargo xtask setup`) and run the way the DaemonSet runs it: the
//! pod spec is read from the `kubectl kustomize` output — capabilities, uid/gid, read-only root,
//! no_new_privs, seccomp and AppArmor profile, hostPID, hostNetwork, ports, resource limits,
//! every hostPath/configMap mount, init containers, command and args — and turned into `podman
//! run` flags, nothing hand-copied.
//!
//! Both sides of seccomp: under the engine's default profile (RuntimeDefault; Debian 12's
//! containers-common allows bpf()/perf_event_open() only with CAP_SYS_ADMIN) bufscope must fail
//! and say that a seccomp filter blocks bpf(); with deploy/seccomp (its init container installs
//! the Localhost profile, which must be generate.py of the engine default for the DaemonSet's
//! capabilities) every probe attaches, and the drops of a UDP receiver on the host and of one in
//! another container (its own network namespace) equal the kernel's drops column, the
//! container's under podman's container id.
//!
//! No registry is reachable: the base image is the Debian 12 one `cargo xtask setup` makes with
//! mmdebstrap, the init container's busybox image a stand-in built from Debian's busybox-static.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bufscope_integration::fixtures::AS_NOBODY;
use bufscope_integration::manifests::{docs, kind, quantity, render, strings, validate};
use bufscope_integration::{
    Metrics, TempDir, Workload, bufscope_bin, default_probes, http_get, output, proc_udp_drops,
    repo, require_root, workload_bin,
};
use serde_json::Value;

/// Made by `cargo xtask setup` (xtask/src/image.rs `LOCAL_BASE`).
const LOCAL_BASE: &str = "localhost/bufscope-base:bookworm";
/// The image under test: `Dockerfile` stage `prebuilt` with the binary under test, one tag per
/// test process (`localhost/bufscope:test-<pid>`: concurrent runs do not remove each other's).
fn image() -> String {
    format!("localhost/bufscope:test-{}", std::process::id())
}
/// Stand-in for the seccomp component's init-container image (busybox).
const BUSYBOX: &str = "localhost/bufscope-test-busybox:latest";
const SECCOMP_ERROR: &str = "seccomp filter blocks bpf(): see docs/kubernetes.md";

/// The rendered DaemonSet.
fn daemonset(docs: &[Value]) -> &Value {
    kind(docs, "DaemonSet").expect("no DaemonSet rendered")
}

/// `podman <args>`'s stdout; panics with its stderr.
fn podman(args: &[&str]) -> String {
    let (ok, out, err) = output(Command::new("podman").args(args), "");
    assert!(
        ok,
        "podman {}: {err} (cargo xtask setup installs and configures podman)",
        args.join(" ")
    );
    out.trim().to_string()
}

/// Builds [`image`] from `Dockerfile` (stage `prebuilt`, base [`LOCAL_BASE`], the binary under
/// test) and [`BUSYBOX`], once per test binary.
fn images() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        require_root();
        let (has_base, _, _) = output(
            Command::new("podman").args(["image", "exists", LOCAL_BASE]),
            "",
        );
        assert!(
            has_base,
            "{LOCAL_BASE} is missing: `cargo xtask setup` makes it (mmdebstrap + podman import)"
        );
        let ctx = TempDir::new("image-context");
        std::fs::copy(bufscope_bin(), ctx.path().join("bufscope")).unwrap();
        // Images of earlier runs whose process is gone go.
        let tags = podman(&["images", "--format", "{{.Repository}}:{{.Tag}}"]);
        for t in tags.lines() {
            let Some(pid) = t.strip_prefix("localhost/bufscope:test-") else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = output(Command::new("podman").args(["rmi", t]), "");
            }
        }
        let image = image();
        let dockerfile = repo().join("Dockerfile");
        let t = Instant::now();
        podman(&[
            "build",
            "--quiet",
            "--file",
            dockerfile.to_str().unwrap(),
            "--target",
            "prebuilt",
            "--build-arg",
            &format!("BASE={LOCAL_BASE}"),
            "--build-arg",
            "BINARY=bufscope",
            "--tag",
            &image,
            ctx.path().to_str().unwrap(),
        ]);
        let size = |i: &str| podman(&["image", "inspect", "--format", "{{.Size}}", i]);
        eprintln!(
            "built {image} from Dockerfile in {:.1} s: {} bytes (base {LOCAL_BASE}: {} bytes; binary {})",
            t.elapsed().as_secs_f64(),
            size(&image),
            size(LOCAL_BASE),
            bufscope_bin().display()
        );
        let bb = TempDir::new("image-busybox");
        std::fs::copy("/bin/busybox", bb.path().join("busybox"))
            .expect("/bin/busybox (Debian busybox-static; cargo xtask setup installs it)");
        std::fs::write(
            bb.path().join("Containerfile"),
            "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n",
        )
        .unwrap();
        podman(&[
            "build",
            "--quiet",
            "--tag",
            BUSYBOX,
            bb.path().to_str().unwrap(),
        ]);
    });
}

/// The engine's RuntimeDefault profile as Debian 12 ships it (bpf/perf_event_open only with
/// CAP_SYS_ADMIN). On an engine whose default already allows them with CAP_BPF/CAP_PERFMON, those
/// rules are taken out to get the older profile back. Returns its path and whether the engine's
/// own file is that old profile.
fn old_default_profile(dir: &Path) -> (PathBuf, bool) {
    let info: Value = serde_json::from_str(&podman(&["info", "--format", "json"])).unwrap();
    let path = PathBuf::from(
        info["host"]["security"]["seccompProfilePath"]
            .as_str()
            .unwrap(),
    );
    let mut p: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let newer = |r: &Value| {
        let names = strings(&r["names"]);
        r["action"] == "SCMP_ACT_ALLOW"
            && (names.contains(&"bpf".into()) || names.contains(&"perf_event_open".into()))
            && !strings(&r["includes"]["caps"]).contains(&"CAP_SYS_ADMIN".into())
    };
    let rules = p["syscalls"].as_array_mut().unwrap();
    let before = rules.len();
    rules.retain(|r| !newer(r));
    if rules.len() == before {
        return (path, true);
    }
    let old = dir.join("engine-default-without-cap-bpf.json");
    std::fs::write(&old, p.to_string()).unwrap();
    (old, false)
}

/// A node as far as the pod sees it: hostPaths are the host's, except under the kubelet's
/// root (/var/lib/kubelet), which lives in a scratch directory, and so do configMap volumes.
struct Node {
    dir: TempDir,
    /// RuntimeDefault.
    default_seccomp: PathBuf,
    /// The node's bpffs (its /sys/fs/bpf): an instance of its own, so the pod's pins go away
    /// with the test.
    bpffs: PathBuf,
}

impl Node {
    fn new(default_seccomp: Option<PathBuf>) -> Self {
        let dir = TempDir::new("image-node");
        let default_seccomp = default_seccomp.unwrap_or_else(|| old_default_profile(dir.path()).0);
        let bpffs = dir.path().join("sys/fs/bpf");
        std::fs::create_dir_all(&bpffs).unwrap();
        let (ok, _, err) = output(
            Command::new("mount").args(["-t", "bpf", "bpf"]).arg(&bpffs),
            "",
        );
        assert!(ok, "mounting the node's bpffs: {err}");
        Self {
            dir,
            default_seccomp,
            bpffs,
        }
    }

    fn host_path(&self, p: &str) -> PathBuf {
        if p.starts_with("/var/lib/kubelet/") || p.starts_with("/var/log/") {
            self.dir.path().join(p.trim_start_matches('/'))
        } else if p == "/sys/fs/bpf" {
            self.bpffs.clone()
        } else {
            PathBuf::from(p)
        }
    }

    /// What the pod pinned (`--bpf.pin-path` of the DaemonSet, on the node's bpffs).
    fn pinned(&self) -> Vec<String> {
        std::fs::read_dir(self.bpffs.join("bufscope/links"))
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `<kubelet root>/seccomp`, where `localhostProfile` is resolved.
    fn seccomp_root(&self) -> PathBuf {
        self.host_path("/var/lib/kubelet/seccomp")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Detach what the pod pinned, then let the bpffs instance go.
        let _ = Command::new(bufscope_bin())
            .args(["cleanup", "--bpf.pin-path"])
            .arg(self.bpffs.join("bufscope"))
            .status();
        let _ = Command::new("umount").arg(&self.bpffs).status();
    }
}

/// A podman container, removed on drop.
struct Container {
    name: String,
}

impl Container {
    fn inspect(&self, format: &str) -> String {
        podman(&["inspect", "--format", format, &self.name])
    }

    fn pid(&self) -> u32 {
        self.inspect("{{.State.Pid}}").parse().unwrap()
    }

    fn id(&self) -> String {
        self.inspect("{{.Id}}")
    }

    fn logs(&self) -> String {
        let (_, out, err) = output(Command::new("podman").args(["logs", &self.name]), "");
        format!("{out}{err}")
    }

    /// Waits for it to exit; its exit code.
    fn wait(&self) -> i32 {
        podman(&["wait", &self.name]).parse().unwrap()
    }

    /// `127.0.0.1:<port>` that container port `port` is published on.
    fn published(&self, port: u64) -> String {
        let p = podman(&["port", &self.name, &format!("{port}/tcp")]);
        p.lines().next().unwrap().trim().to_string()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = output(
            Command::new("podman").args(["rm", "--force", "--time", "10", &self.name]),
            "",
        );
    }
}

/// The `podman run` flags for container `c` of pod spec `pod` (rendered `docs` hold its
/// ConfigMaps) on `node`, with `image` in place of the registry image.
fn run_flags(docs: &[Value], pod: &Value, c: &Value, node: &Node, image: &str) -> Vec<String> {
    let mut f: Vec<String> = Vec::new();
    fn arg(f: &mut Vec<String>, a: &str, v: String) {
        f.push(a.to_string());
        f.push(v);
    }
    let sc = &c["securityContext"];
    let psc = &pod["securityContext"];
    let field = |k: &str| {
        if sc[k].is_null() {
            psc[k].clone()
        } else {
            sc[k].clone()
        }
    };
    assert_ne!(sc["privileged"], true, "{}: privileged", c["name"]);
    let (uid, gid) = (field("runAsUser"), field("runAsGroup"));
    assert!(
        uid.is_u64() && gid.is_u64(),
        "{}: uid and gid are set",
        c["name"]
    );
    arg(&mut f, "--user", format!("{uid}:{gid}"));
    for cap in strings(&sc["capabilities"]["drop"]) {
        arg(&mut f, "--cap-drop", cap.to_lowercase());
    }
    for cap in strings(&sc["capabilities"]["add"]) {
        arg(&mut f, "--cap-add", cap.to_lowercase());
    }
    if sc["readOnlyRootFilesystem"] == true {
        f.push("--read-only".into());
        // Kubernetes gives no writable /tmp, /run, … on a read-only root
        f.push("--read-only-tmpfs=false".into());
    }
    if sc["allowPrivilegeEscalation"] == false {
        arg(&mut f, "--security-opt", "no-new-privileges".into());
    }
    let seccomp = field("seccompProfile");
    let seccomp = match seccomp["type"].as_str() {
        Some("RuntimeDefault") | None => node.default_seccomp.display().to_string(),
        Some("Localhost") => node
            .seccomp_root()
            .join(seccomp["localhostProfile"].as_str().unwrap())
            .display()
            .to_string(),
        Some("Unconfined") => "unconfined".into(),
        Some(t) => panic!("seccompProfile type {t}"),
    };
    arg(&mut f, "--security-opt", format!("seccomp={seccomp}"));
    if field("appArmorProfile")["type"] == "Unconfined" {
        arg(&mut f, "--security-opt", "apparmor=unconfined".into());
    }
    if pod["hostPID"] == true {
        arg(&mut f, "--pid", "host".into());
    }
    if pod["hostNetwork"] == true {
        arg(&mut f, "--network", "host".into());
    } else {
        for p in c["ports"].as_array().into_iter().flatten() {
            arg(
                &mut f,
                "--publish",
                format!("127.0.0.1::{}", p["containerPort"]),
            );
        }
    }
    let limits = &c["resources"]["limits"];
    if !limits["cpu"].is_null() {
        arg(&mut f, "--cpus", format!("{}", quantity(&limits["cpu"])));
    }
    if !limits["memory"].is_null() {
        arg(
            &mut f,
            "--memory",
            format!("{}", quantity(&limits["memory"]) as u64),
        );
    }
    if let Some(g) = pod["terminationGracePeriodSeconds"].as_u64() {
        arg(&mut f, "--stop-timeout", g.to_string());
    }
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let v = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap_or_else(|| panic!("volume {}", m["name"]));
        let src = if !v["hostPath"].is_null() {
            let p = node.host_path(v["hostPath"]["path"].as_str().unwrap());
            match v["hostPath"]["type"].as_str() {
                Some("Directory") => assert!(p.is_dir(), "hostPath {} is a directory", p.display()),
                Some("DirectoryOrCreate") => std::fs::create_dir_all(&p).unwrap(),
                t => panic!("hostPath type {t:?}"),
            }
            p
        } else if !v["configMap"].is_null() {
            let name = v["configMap"]["name"].as_str().unwrap();
            let cm = docs
                .iter()
                .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("ConfigMap {name} is not rendered"));
            let dir = node.dir.path().join("configmaps").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            for (k, val) in cm["data"].as_object().unwrap() {
                std::fs::write(dir.join(k), val.as_str().unwrap()).unwrap();
            }
            dir
        } else {
            panic!("volume kind of {v}")
        };
        let ro = if m["readOnly"] == true { ":ro" } else { "" };
        arg(
            &mut f,
            "--volume",
            format!("{}:{}{ro}", src.display(), m["mountPath"].as_str().unwrap()),
        );
    }
    if !c["command"].is_null() {
        arg(&mut f, "--entrypoint", c["command"].to_string());
    }
    f.push(image.to_string());
    f.extend(strings(&c["args"]));
    f
}

/// The DaemonSet's pod on `node` as podman runs it: the init containers to completion, then
/// the bufscope container (detached) and when its `podman run` started ([`boottime`]).
fn start_pod(docs: &[Value], node: &Node, tag: &str) -> (Container, f64) {
    images();
    let pod = &daemonset(docs)["spec"]["template"]["spec"];
    for (i, c) in pod["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        assert!(
            c["image"].as_str().unwrap().contains("busybox"),
            "init container image {} (the test has a stand-in for busybox only)",
            c["image"]
        );
        let ct = Container {
            name: format!("bufscope-test-{}-{tag}-init{i}", std::process::id()),
        };
        let mut flags = vec!["run".to_string(), "--name".into(), ct.name.clone()];
        flags.extend(run_flags(docs, pod, c, node, BUSYBOX));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let (_, out, err) = output(Command::new("podman").args(&flags), "");
        assert_eq!(
            ct.wait(),
            0,
            "init container {}: {out}{err}\n{}",
            c["name"],
            ct.logs()
        );
    }
    let cs = pod["containers"].as_array().unwrap();
    assert_eq!(cs.len(), 1);
    let c = &cs[0];
    let wanted = c["image"].as_str().unwrap();
    assert!(
        wanted.rsplit('/').next().unwrap().starts_with("bufscope:"),
        "the DaemonSet runs the bufscope image: {wanted}"
    );
    let ct = Container {
        name: format!("bufscope-test-{}-{tag}", std::process::id()),
    };
    let mut flags = vec![
        "run".to_string(),
        "--detach".into(),
        "--name".into(),
        ct.name.clone(),
    ];
    flags.extend(run_flags(docs, pod, c, node, &image()));
    eprintln!("podman {}", flags.join(" "));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let t0 = boottime();
    podman(&flags);
    (ct, t0)
}

/// CLOCK_BOOTTIME in seconds (the clock of /proc/<pid>/stat's starttime).
fn boottime() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// When process `pid` started ([`boottime`]; clock-tick resolution).
fn process_start(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    // field 22 (starttime) is the 20th after the comm
    let ticks: f64 = after_comm
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

/// CPU time (user + system) process `pid` has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(i) = stat.rfind(')') else {
        return f64::NAN;
    };
    let f: Vec<f64> = stat[i + 2..]
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(f64::NAN))
        .collect();
    // utime and stime: fields 14 and 15, the 12th and 13th after the comm
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f[11] + f[12]) / hz
}

/// A `/proc/<pid>/status` field.
fn status_field(pid: u32, name: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

/// Capability bits of `names` (`BPF`, …), as /proc/<pid>/status shows them.
fn cap_mask(names: &BTreeSet<String>) -> u64 {
    names
        .iter()
        .map(|n| match n.as_str() {
            "DAC_READ_SEARCH" => 2,
            "NET_ADMIN" => 12,
            "SYS_PTRACE" => 19,
            "SYS_ADMIN" => 21,
            "PERFMON" => 38,
            "BPF" => 39,
            other => panic!("capability {other}: add its number"),
        })
        .fold(0, |m, bit| m | 1u64 << bit)
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn under_the_engines_old_default_seccomp_profile_bufscope_fails_and_names_the_cause() {
    require_root();
    let docs = docs(&render("overlays/gateway"));
    let pod = &daemonset(&docs)["spec"]["template"]["spec"];
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
        "the base DaemonSet runs under the runtime's default profile"
    );
    let node = Node::new(None);
    let (ct, _) = start_pod(&docs, &node, "runtimedefault");
    let code = ct.wait();
    let logs = ct.logs();
    assert_ne!(
        code, 0,
        "bufscope ran under the old default profile:\n{logs}"
    );
    assert!(
        logs.contains(SECCOMP_ERROR),
        "the error names the seccomp filter:\n{logs}"
    );
    eprintln!(
        "RuntimeDefault ({}): exit {code}: {}",
        node.default_seccomp.display(),
        logs.lines()
            .find(|l| l.contains(SECCOMP_ERROR))
            .unwrap_or("")
    );
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn with_the_shipped_seccomp_profile_the_image_runs_as_the_daemonset_and_counts_host_and_container_drops()
 {
    require_root();
    let yaml = render("overlays/gateway-seccomp");
    let docs = docs(&yaml);
    // Valid for Kubernetes, strictly, like the other targets (integration/tests/deploy.rs).
    let (ok, report) = validate(&yaml);
    assert!(ok, "overlays/gateway-seccomp:\n{report}");
    let ds = daemonset(&docs);
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let caps: BTreeSet<String> = strings(&c["securityContext"]["capabilities"]["add"])
        .into_iter()
        .collect();

    // The profile: what the ConfigMap ships is deploy/seccomp/bufscope.json, which has no
    // capability conditions (containerd ignores them) and is generate.py of the engine's
    // default for exactly the DaemonSet's capabilities.
    let shipped = std::fs::read_to_string(repo().join("deploy/seccomp/bufscope.json")).unwrap();
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["data"]["bufscope.json"].is_string())
        .expect("the component's ConfigMap");
    assert_eq!(cm["data"]["bufscope.json"].as_str().unwrap(), shipped);
    let profile: Value = serde_json::from_str(&shipped).unwrap();
    for r in profile["syscalls"].as_array().unwrap() {
        assert!(
            r["includes"]["caps"].is_null() && r["excludes"]["caps"].is_null(),
            "capability condition in {r}"
        );
    }
    let node = Node::new(None);
    let (engine_default, engine_is_old) = old_default_profile(node.dir.path());
    if engine_is_old {
        let (ok, generated, err) = output(
            Command::new("python3")
                .arg(repo().join("deploy/seccomp/generate.py"))
                .arg(&engine_default)
                .arg("--caps")
                .arg(caps.iter().cloned().collect::<Vec<_>>().join(",")),
            "",
        );
        assert!(ok, "generate.py: {err}");
        assert!(
            generated == shipped,
            "deploy/seccomp/bufscope.json is not generate.py of {} for {caps:?}: regenerate it \
             (see deploy/seccomp/generate.py)",
            engine_default.display()
        );
    } else {
        eprintln!(
            "the engine's default profile already allows bpf with CAP_BPF: drift check skipped"
        );
    }

    // Receivers: one on the host as another user, created before bufscope starts (only
    // /proc/<pid>/fd through the host's /proc can tell whose it is).
    let host_recv = Workload::start_wrapped(&AS_NOBODY, &["udp-recv", "--rcvbuf", "4096"]);
    let host_inode: u64 = host_recv.get("inodes").parse().unwrap();

    let (bufscope, t0) = start_pod(&docs, &node, "localhost");
    let installed = node.seccomp_root().join(
        c["securityContext"]["seccompProfile"]["localhostProfile"]
            .as_str()
            .unwrap(),
    );
    assert_eq!(
        std::fs::read_to_string(&installed).unwrap_or_default(),
        shipped,
        "the init container installed the profile where the kubelet looks for it"
    );
    let addr = bufscope.published(c["ports"][0]["containerPort"].as_u64().unwrap());
    let startup = &c["startupProbe"];
    let patience = Duration::from_secs(
        startup["periodSeconds"].as_u64().unwrap() * startup["failureThreshold"].as_u64().unwrap(),
    );
    let probe_path = startup["httpGet"]["path"].as_str().unwrap().to_string();
    let pid = bufscope.pid();
    let started = process_start(pid);
    // First successful scrape, polled every 10 ms (the kubelet's startupProbe would give up
    // after periodSeconds x failureThreshold).
    let (m, scraped, cpu) = bufscope_testkit::wait_until(
        patience,
        Duration::from_millis(10),
        "the first scrape of the container",
        || match bufscope_testkit::http_get(&addr, "/metrics") {
            Ok((200, body)) => Some((Metrics::parse(&body), boottime(), cpu_seconds(pid))),
            _ => {
                let running = Path::new(&format!("/proc/{pid}")).exists();
                assert!(running, "bufscope exited:\n{}", bufscope.logs());
                None
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}:\n{}", bufscope.logs()));
    eprintln!(
        "start-up: `podman run` → container process {:.2} s, its start → first scrape {:.2} s \
         (total {:.2} s; {cpu:.2} s of CPU used by then, CPU limit {} cores)",
        started - t0,
        scraped - started,
        scraped - t0,
        quantity(&c["resources"]["limits"]["cpu"])
    );
    assert_eq!(http_get(&addr, &probe_path).0, 200, "{probe_path}");

    // The security context the engine applied, as the kernel reports it.
    let mask = cap_mask(&caps);
    let hex = |f: &str| u64::from_str_radix(&status_field(pid, f), 16).unwrap();
    assert_eq!(
        hex("CapEff"),
        mask,
        "effective = the DaemonSet's capabilities"
    );
    assert_eq!(
        hex("CapBnd"),
        mask,
        "bounding = the DaemonSet's capabilities"
    );
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "Seccomp"), "2", "a seccomp filter");
    let uid = c["securityContext"]["runAsUser"].to_string();
    assert!(
        status_field(pid, "Uid")
            .split_whitespace()
            .all(|u| u == uid),
        "uid {uid}"
    );
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .unwrap();
    assert!(
        root.split_whitespace()
            .nth(5)
            .unwrap()
            .split(',')
            .any(|o| o == "ro"),
        "read-only root: {root}"
    );
    let attached: Vec<_> = m.find("bufscope_probe_attached", &[]).collect();
    assert_eq!(attached.len(), default_probes().len(), "{attached:?}");
    // Its links are pinned on the node's bpffs (--bpf.pin-path of the DaemonSet).
    let pinned = node.pinned();
    assert!(
        pinned.len() >= 5 && m.sum("bufscope_probe_pinned", &[]) == 5.0,
        "pinned links {pinned:?}:\n{}",
        bufscope.logs()
    );
    for s in &attached {
        assert_eq!(s.value, 1.0, "{s:?} not attached:\n{}", bufscope.logs());
    }

    // The other receiver in another container (own network namespace), started now: its socket's
    // owner comes from the cgroup/sock_create hook at the host's cgroup2 root.
    let recv_name = format!("bufscope-test-{}-receiver", std::process::id());
    let _recv_ct = Container {
        name: recv_name.clone(),
    };
    let wl = workload_bin().display().to_string();
    let ct_recv = Workload::start_wrapped(
        &[
            "podman",
            "run",
            "--interactive",
            "--rm",
            "--name",
            &recv_name,
            "--network",
            "none",
            "--read-only",
            "--volume",
            &format!("{wl}:{wl}:ro"),
            LOCAL_BASE,
        ],
        &["udp-recv", "--rcvbuf", "4096"],
    );
    let receiver = Container { name: recv_name };
    let ct_pid = receiver.pid();
    let ct_id = receiver.id();
    let ct_inode: u64 = ct_recv.get("inodes").parse().unwrap();
    assert_ne!(
        std::fs::read_link(format!("/proc/{ct_pid}/ns/net")).unwrap(),
        std::fs::read_link("/proc/self/ns/net").unwrap(),
        "the receiver container has its own network namespace"
    );

    for (what, recv_pid, inode, port, netns, container) in [
        (
            "host receiver (uid 65534)",
            host_recv.pid(),
            host_inode,
            host_recv.get("ports").to_string(),
            None,
            String::new(),
        ),
        (
            "receiver in another container",
            ct_pid,
            ct_inode,
            ct_recv.get("ports").to_string(),
            Some(ct_pid.to_string()),
            ct_id.clone(),
        ),
    ] {
        let before = proc_udp_drops(recv_pid, inode).unwrap();
        let mut flood = vec!["udp-flood", "--port", &port, "--count", "2000"];
        if let Some(n) = &netns {
            flood.extend(["--netns-of", n]);
        }
        assert!(Workload::start(&flood).wait(), "flood");
        let kernel = (proc_udp_drops(recv_pid, inode).unwrap() - before) as f64;
        assert!(kernel > 0.0, "{what}: the kernel dropped nothing");
        let pid_s = recv_pid.to_string();
        let mut last = String::new();
        let got = bufscope_testkit::wait_until(
            Duration::from_secs(20),
            Duration::from_millis(100),
            what,
            || {
                let m = Metrics::parse(&http_get(&addr, "/metrics").1);
                let v = m.sum("bufscope_socket_drops_total", &[("pid", pid_s.as_str())]);
                let folded = m.sum("bufscope_folded_processes_total", &[]);
                last = format!(
                    "{v} for pid {pid_s}; {folded} processes folded into comm=\"_other\" \
                     (--max-processes: more processes than that dropping at once, e.g. another \
                     test running concurrently, push ours out: run this test alone)"
                );
                (v == kernel).then_some(m)
            },
        )
        .unwrap_or_else(|e| {
            panic!(
                "{e:#}: the kernel dropped {kernel}, bufscope has {last}\n{}",
                bufscope.logs()
            )
        });
        let want = [("pid", pid_s.as_str())];
        let series: Vec<_> = got.find("bufscope_socket_drops_total", &want).collect();
        for s in &series {
            assert_eq!(
                s.labels.get("container").map_or("", String::as_str),
                container,
                "{what}: container label of {s:?}"
            );
        }
        eprintln!(
            "{what}: kernel drops column {kernel} = bufscope {kernel} (container=\"{container}\")"
        );
    }
    drop(ct_recv);
    drop(receiver);
    let log = bufscope.logs();
    assert!(!log.contains(SECCOMP_ERROR), "{log}");
}
