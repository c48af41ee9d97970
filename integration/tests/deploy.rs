//! `deploy/`: the Kubernetes manifests and the Dockerfile. Every kustomize target is rendered
//! with the real kustomize (`kubectl kustomize`) and validated offline and strictly against the
//! Kubernetes 1.30 OpenAPI schemas (`kubernetes-validate`) and the Prometheus Operator's
//! PodMonitor/ServiceMonitor schemas (`deploy/validate.py`); the DaemonSet's security properties
//! are asserted, its capabilities against what the real `bufscope check` says it needs and its
//! arguments against the real `bufscope run --help`. Privileged: the real binary runs the way
//! the DaemonSet runs it (exactly those capabilities, no_new_privs, read-only root, the host's
//! /proc at the mount path) and must attach every probe and attribute a socket of another user's
//! process; without CAP_SYS_PTRACE + CAP_DAC_READ_SEARCH it must not.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::channel;
use std::time::Duration;

use bufscope_integration::fixtures::AS_NOBODY;
use bufscope_integration::manifests::{
    KUBERNETES_VERSION, docs, kind, quantity, render, strings, validate,
};
use bufscope_integration::{
    Metrics, TempDir, Workload, bufscope_bin, default_probes, eventually, http_get, output,
    proc_udp_drops, repo, terminate,
};

const TARGETS: [&str; 4] = [
    "base",
    "overlays/gateway",
    "overlays/gateway-servicemonitor",
    "overlays/gateway-network-policy",
];

#[test]
fn every_kustomize_target_validates_strictly_against_kubernetes_and_operator_schemas() {
    for t in TARGETS {
        let yaml = render(t);
        let ds = docs(&yaml);
        let (ok, report) = validate(&yaml);
        assert!(ok, "{t}:\n{report}");
        let oks = report.lines().filter(|l| l.starts_with("OK ")).count();
        assert_eq!(oks, ds.len(), "{t}: every document validated:\n{report}");
        let kinds: BTreeSet<&str> = ds.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        for k in [
            "Namespace",
            "ServiceAccount",
            "DaemonSet",
            "Service",
            "PrometheusRule",
        ] {
            assert!(kinds.contains(k), "{t} lacks a {k}");
        }
        assert!(
            kinds.contains("PodMonitor") ^ kinds.contains("ServiceMonitor"),
            "{t}: exactly one of PodMonitor/ServiceMonitor: {kinds:?}"
        );
        eprintln!(
            "{t}: {} documents valid for Kubernetes {KUBERNETES_VERSION}",
            ds.len()
        );
    }
    // The validator is not a rubber stamp: a misspelt field in each kind of document fails.
    let yaml = render("overlays/gateway-servicemonitor") + "---\n" + &render("base");
    for (from, to) in [
        ("readOnlyRootFilesystem", "readOnlyRootFileSystem"),
        ("clusterIP: None", "clusterIp: None"),
        ("sourceLabels:", "sourceLabel:"),
        ("interval: 15s", "interval: 15 seconds"),
        (
            "automountServiceAccountToken",
            "automountServiceAccountTokens",
        ),
        ("- alert: BufscopeDown", "- alrt: BufscopeDown"),
    ] {
        assert!(yaml.contains(from), "{from}");
        let (ok, report) = validate(&yaml.replacen(from, to, 1));
        assert!(!ok, "{from} → {to} was accepted:\n{report}");
    }
}

#[test]
fn prometheusrule_is_dashboards_alerts_yaml() {
    let alerts = std::fs::read_to_string(repo().join("dashboards/alerts.yaml")).unwrap();
    let alerts = &docs(&alerts)[0];
    for t in TARGETS {
        let ds = docs(&render(t));
        let rule = kind(&ds, "PrometheusRule").unwrap();
        assert_eq!(
            rule["spec"]["groups"], alerts["groups"],
            "{t}: deploy/kustomize/base/prometheusrule.yaml differs from dashboards/alerts.yaml: \
             regenerate it"
        );
    }
}

/// The capabilities the real binary says it needs (`bufscope check --no-attach`), without
/// CAP_SYS_ADMIN, which it only wants to mount tracefs when the host has none.
fn capabilities_bufscope_checks() -> BTreeSet<String> {
    let (_, out, err) = output(
        Command::new(bufscope_bin()).args(["check", "--no-attach"]),
        "",
    );
    let caps: BTreeSet<String> = format!("{out}{err}")
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("CAP_")))
        .map(|c| c.trim_start_matches("CAP_").to_string())
        .filter(|c| c != "SYS_ADMIN")
        .collect();
    assert!(caps.contains("BPF"), "bufscope check output: {out}{err}");
    caps
}

/// Long flags `bufscope run --help` lists.
fn run_flags() -> BTreeSet<String> {
    let (ok, out, _) = output(Command::new(bufscope_bin()).args(["run", "--help"]), "");
    assert!(ok);
    out.split_whitespace()
        .filter(|w| w.starts_with("--"))
        .map(|w| {
            w.trim_end_matches(',')
                .split(['=', '<'])
                .next()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// The capability names in docs/kubernetes.md's capability table (`| CAP_X | … |` rows).
fn capabilities_documented() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(repo().join("docs/kubernetes.md")).unwrap();
    doc.lines()
        .filter(|l| l.starts_with("| `CAP_"))
        .filter(|l| !l.contains("not granted"))
        .map(|l| {
            l.trim_start_matches("| `CAP_")
                .split('`')
                .next()
                .unwrap()
                .to_string()
        })
        .collect()
}

#[test]
fn daemonset_is_least_privilege_and_consistent_with_the_binary() {
    let needed = capabilities_bufscope_checks();
    let documented = capabilities_documented();
    assert_eq!(documented, needed, "docs/kubernetes.md vs bufscope check");
    let flags = run_flags();
    assert!(flags.contains("--path.procfs"), "{flags:?}");
    for t in TARGETS {
        let ds = docs(&render(t));
        let d = kind(&ds, "DaemonSet").unwrap();
        let pod = &d["spec"]["template"]["spec"];
        let labels = &d["spec"]["template"]["metadata"]["labels"];
        assert_eq!(
            pod["hostPID"], true,
            "{t}: hostPID (host pids for attribution)"
        );
        assert_ne!(pod["hostNetwork"], true, "{t}: hostNetwork is not needed");
        assert_eq!(pod["automountServiceAccountToken"], false, "{t}");
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{t}"
        );
        assert_eq!(
            pod["securityContext"]["appArmorProfile"]["type"], "Unconfined",
            "{t}"
        );
        let cs = pod["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 1);
        assert!(pod["initContainers"].is_null(), "{t}: no init containers");
        let c = &cs[0];
        let sc = &c["securityContext"];
        assert_ne!(sc["privileged"], true, "{t}: not privileged");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{t}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{t}");
        assert_eq!(
            sc["runAsUser"], 0,
            "{t}: root, so added capabilities are effective"
        );
        assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{t}");
        let add: BTreeSet<String> = strings(&sc["capabilities"]["add"]).into_iter().collect();
        assert_eq!(add, needed, "{t}: capabilities = what bufscope check needs");
        // NET_ADMIN loads the cgroup socket programs (no syscall tax; the guard): it is in
        // `needed` because `bufscope check` asks for it. SYS_ADMIN never is.
        assert!(!add.contains("SYS_ADMIN"), "{t}");
        // mounts: exactly the host paths bufscope reads, all read-only but the bpffs it pins in
        let mounts = c["volumeMounts"].as_array().unwrap();
        assert!(
            mounts
                .iter()
                .all(|m| (m["readOnly"] == true) != (m["mountPath"] == "/sys/fs/bpf")),
            "{t}: read-only mounts, the bpffs writable"
        );
        let host: BTreeSet<(String, String)> = mounts
            .iter()
            .map(|m| {
                let v = pod["volumes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|v| v["name"] == m["name"])
                    .unwrap();
                (
                    v["hostPath"]["path"].as_str().unwrap().to_string(),
                    m["mountPath"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let want: BTreeSet<(String, String)> = [
            ("/proc", "/host/proc"),
            ("/sys/kernel/btf", "/sys/kernel/btf"),
            ("/sys/kernel/tracing", "/sys/kernel/tracing"),
            ("/sys/fs/cgroup", "/host/sys/fs/cgroup"),
            ("/sys/fs/bpf", "/sys/fs/bpf"),
            ("/var/log/pods", "/host/var/log/pods"),
            ("/var/log/containers", "/host/var/log/containers"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(host, want, "{t}: host mounts");
        // args: `run` and only flags the binary has; procfs is the mounted host /proc
        let args = strings(&c["args"]);
        assert!(
            args.contains(&"--bpf.pin-path=/sys/fs/bpf/bufscope".to_string()),
            "{t}: counting across restarts, pinned on the mounted bpffs"
        );
        assert_eq!(args[0], "run", "{t}");
        for a in &args[1..] {
            let flag = a.split('=').next().unwrap();
            assert!(
                flags.contains(flag),
                "{t}: {flag} is not a `bufscope run` flag"
            );
        }
        assert!(
            args.contains(&"--path.procfs=/host/proc".to_string()),
            "{t}"
        );
        assert!(
            args.contains(&"--path.cgroup2=/host/sys/fs/cgroup".to_string()),
            "{t}: the cgroup hooks attach at the host's cgroup2 root"
        );
        assert!(
            args.contains(&"--kubernetes.log-dir=/host/var/log".to_string()),
            "{t}: pod labels from the mounted kubelet log layout"
        );
        let port = c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "metrics")
            .unwrap();
        assert_eq!(port["containerPort"], 9477);
        assert!(
            args.contains(&"--web.listen-address=:9477".to_string()),
            "{t}"
        );
        for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
            assert_eq!(c[probe]["httpGet"]["path"], "/healthz", "{t} {probe}");
            assert_eq!(c[probe]["httpGet"]["port"], "metrics", "{t} {probe}");
        }
        let r = &c["resources"];
        for res in ["cpu", "memory"] {
            let (req, lim) = (quantity(&r["requests"][res]), quantity(&r["limits"][res]));
            assert!(
                req > 0.0 && req <= lim,
                "{t}: {res} request {req} limit {lim}"
            );
        }
        // Service, monitors and the namespace fit the pods
        let ns = kind(&ds, "Namespace").unwrap();
        assert_eq!(
            ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged",
            "{t}: hostPID/hostPath/capabilities need the privileged PSA level"
        );
        let svc = kind(&ds, "Service").unwrap();
        for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
            assert_eq!(&labels[k], v, "{t}: Service selects the pods");
        }
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], "metrics");
        for (mk, ep) in [
            ("PodMonitor", "podMetricsEndpoints"),
            ("ServiceMonitor", "endpoints"),
        ] {
            let Some(m) = kind(&ds, mk) else { continue };
            let target_labels = if mk == "PodMonitor" {
                labels
            } else {
                &svc["metadata"]["labels"]
            };
            for (k, v) in m["spec"]["selector"]["matchLabels"].as_object().unwrap() {
                assert_eq!(&target_labels[k], v, "{t}: {mk} selects its targets");
            }
            let job = m["spec"]["jobLabel"].as_str().unwrap();
            assert_eq!(
                target_labels[job], "bufscope",
                "{t}: job=\"bufscope\" as dashboards/alerts.yaml expects"
            );
            assert_eq!(m["spec"][ep][0]["port"], "metrics");
            assert_eq!(m["spec"][ep][0]["path"], "/metrics");
        }
        // The NetworkPolicy component: it selects bufscope's pods and admits only
        // Prometheus (a namespace and a pod selector in one peer) to the metrics port.
        match kind(&ds, "NetworkPolicy") {
            Some(np) => {
                assert_eq!(
                    t, "overlays/gateway-network-policy",
                    "only the overlay that asks for it"
                );
                for (k, v) in np["spec"]["podSelector"]["matchLabels"]
                    .as_object()
                    .unwrap()
                {
                    assert_eq!(
                        &labels[k], v,
                        "{t}: the NetworkPolicy selects bufscope's pods"
                    );
                }
                assert_eq!(strings(&np["spec"]["policyTypes"]), ["Ingress"], "{t}");
                let rules = np["spec"]["ingress"].as_array().unwrap();
                assert_eq!(rules.len(), 1, "{t}: one rule");
                let peers = rules[0]["from"].as_array().unwrap();
                assert_eq!(peers.len(), 1, "{t}: one peer");
                let peer = &peers[0];
                assert!(
                    peer["namespaceSelector"]["matchLabels"].is_object()
                        && peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
                            == "prometheus",
                    "{t}: Prometheus pods of one namespace, not every pod: {peer}"
                );
                let port = &rules[0]["ports"][0]["port"];
                let c = &pod["containers"][0];
                assert!(
                    c["ports"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| &p["name"] == port),
                    "{t}: the policy's port {port} is the container's"
                );
            }
            None => assert_ne!(
                t, "overlays/gateway-network-policy",
                "{t}: its NetworkPolicy"
            ),
        }
        if t.starts_with("overlays/gateway") {
            assert!(
                pod["nodeSelector"]
                    .as_object()
                    .unwrap()
                    .contains_key("node-role.kubernetes.io/gateway"),
                "{t}"
            );
            assert!(!pod["tolerations"].as_array().unwrap().is_empty(), "{t}");
            assert_ne!(
                c["image"], "bufscope:0.1.0",
                "{t}: the overlay sets the image"
            );
        }
    }
}

#[test]
fn dockerfile_builds_the_binary_the_daemonset_runs() {
    let df = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let froms: Vec<&str> = df.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert!(froms.len() >= 2, "multi-stage: {froms:?}");
    // the runtime stage starts `bufscope` with the DaemonSet's args (`run …`)
    assert!(
        df.contains(r#"ENTRYPOINT ["/usr/bin/bufscope"]"#),
        "ENTRYPOINT is the binary"
    );
    // the builder builds the exporter package the way the workspace does
    assert!(
        df.contains("cargo xtask setup") && df.contains("-p bufscope"),
        "builder"
    );
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    assert!(
        ignore.lines().any(|l| l.trim() == "target"),
        "the build context skips target/"
    );
}

// ---------------------------------------------------------------------------------------------
// Privileged: the DaemonSet's security context, emulated.

/// `bufscope run` as the pod would run it; SIGTERM and reaped on drop.
struct PodLike {
    child: Child,
    addr: String,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl PodLike {
    /// Runs the rendered DaemonSet's container args in a private mount namespace with a
    /// read-only root, /sys and tracefs, a bpffs of its own at /sys/fs/bpf (the node's, as the
    /// hostPath gives it; its pins go with the namespace), the host's /proc bind-mounted at `<dir>/host/proc`,
    /// bounding/inheritable capabilities = `caps`, and no_new_privs.
    fn start(args: &[String], caps: &BTreeSet<String>, dir: &Path) -> Self {
        // The DaemonSet's /var/log volumes (DirectoryOrCreate) on a node without pods yet.
        for d in ["host/var/log/pods", "host/var/log/containers"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        Self::start_with_binds(args, caps, dir, &[])
    }

    /// [`PodLike::start`] with more hostPath volumes: each (node directory, mountPath) bound
    /// read-only at `<dir><mountPath>`.
    fn start_with_binds(
        args: &[String],
        caps: &BTreeSet<String>,
        dir: &Path,
        binds: &[(std::path::PathBuf, String)],
    ) -> Self {
        let mut extra = String::new();
        for (src, at) in binds {
            let to = dir.join(at.trim_start_matches('/'));
            std::fs::create_dir_all(&to).unwrap();
            extra.push_str(&format!(
                "mount --bind {s} {t}; mount -o remount,bind,ro {t}; ",
                s = src.display(),
                t = to.display()
            ));
        }
        let host_proc = dir.join("host/proc");
        std::fs::create_dir_all(&host_proc).unwrap();
        // The DaemonSet's hostPath volume of the host's /sys/fs/cgroup.
        let host_cgroup = dir.join("host/sys/fs/cgroup");
        std::fs::create_dir_all(&host_cgroup).unwrap();
        let caps_arg = format!(
            "-all,{}",
            caps.iter()
                .map(|c| format!("+{}", c.to_lowercase()))
                .collect::<Vec<_>>()
                .join(",")
        );
        let mut bufscope_args: Vec<String> = args
            .iter()
            .map(|a| {
                if a.starts_with("--web.listen-address") {
                    "--web.listen-address=127.0.0.1:0".to_string()
                } else if let Some(p) = a.strip_prefix("--path.procfs=") {
                    format!("--path.procfs={}{p}", dir.display())
                } else if let Some(p) = a.strip_prefix("--path.cgroup2=") {
                    format!("--path.cgroup2={}{p}", dir.display())
                } else if let Some(p) = a.strip_prefix("--kubernetes.log-dir=") {
                    format!("--kubernetes.log-dir={}{p}", dir.display())
                } else {
                    a.clone()
                }
            })
            .collect();
        bufscope_args.insert(0, bufscope_bin().display().to_string());
        let script = format!(
            "set -e; mount --rbind /proc {hp}; mount -o remount,bind,ro {hp}; \
             mount --rbind /sys/fs/cgroup {hc}; {extra}\
             mount -t bpf bpf /sys/fs/bpf; \
             mount -o remount,bind,ro /; mount -o remount,bind,ro /sys; \
             mount -o remount,bind,ro /sys/kernel/tracing; \
             exec setpriv --bounding-set {c} --inh-caps {c} --no-new-privs -- \"$@\"",
            hp = host_proc.display(),
            hc = host_cgroup.display(),
            c = caps_arg
        );
        let mut child = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
                "sh",
            ])
            .args(&bufscope_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("unshare");
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.split("serving metrics on http://").nth(1) {
                        let _ = tx.send(rest.split('/').next().unwrap_or("").to_string());
                    }
                    log.lock().unwrap().push(line);
                }
            });
        }
        let addr = rx.recv_timeout(Duration::from_secs(60));
        let mut p = Self {
            child,
            addr: String::new(),
            log,
        };
        match addr {
            Ok(a) => p.addr = a,
            Err(_) => panic!("bufscope did not serve as the pod would:\n{}", p.log()),
        }
        p
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    fn scrape(&self) -> Metrics {
        let (status, body) = http_get(&self.addr, "/metrics");
        assert_eq!(status, 200, "{body}");
        Metrics::parse(&body)
    }
}

impl Drop for PodLike {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn the_daemonsets_capabilities_are_enough_and_each_attribution_capability_is_needed() {
    bufscope_integration::require_root();
    let ds = docs(&render("overlays/gateway"));
    let c = &kind(&ds, "DaemonSet").unwrap()["spec"]["template"]["spec"]["containers"][0];
    let args = strings(&c["args"]);
    let caps: BTreeSet<String> = strings(&c["securityContext"]["capabilities"]["add"])
        .into_iter()
        .collect();

    // A UDP receiver of another user, created before bufscope starts: only /proc/<pid>/fd can
    // tell whose socket it is.
    let recv = Workload::start_wrapped(&AS_NOBODY, &["udp-recv", "--rcvbuf", "4096"]);
    let port = recv.get("ports").to_string();
    let inode: u64 = recv.get("inodes").parse().unwrap();
    let pid = recv.pid().to_string();

    for (name, granted, attributable) in [
        ("the DaemonSet's capabilities", caps.clone(), true),
        (
            "without CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH",
            caps.iter()
                .filter(|c| *c != "SYS_PTRACE" && *c != "DAC_READ_SEARCH")
                .cloned()
                .collect(),
            false,
        ),
    ] {
        let dir = TempDir::new("pod");
        let pod = PodLike::start(&args, &granted, dir.path());
        let m = pod.scrape();
        for s in m.find("bufscope_probe_attached", &[]) {
            assert_eq!(s.value, 1.0, "{name}: {s:?} not attached:\n{}", pod.log());
        }
        assert_eq!(
            m.find("bufscope_probe_attached", &[]).count(),
            default_probes().len(),
            "{name}"
        );
        let before = proc_udp_drops(recv.pid(), inode).unwrap();
        assert!(
            Workload::start(&["udp-flood", "--port", &port, "--count", "2000"]).wait(),
            "flood"
        );
        let kernel = (proc_udp_drops(recv.pid(), inode).unwrap() - before) as f64;
        assert!(kernel > 0.0);
        if attributable {
            let got = eventually(Duration::from_secs(20), "drops on the receiver", || {
                let v = pod
                    .scrape()
                    .sum("bufscope_socket_drops_total", &[("pid", pid.as_str())]);
                (v == kernel).then_some(v)
            });
            eprintln!("{name}: receiver (uid 65534) drops kernel {kernel} / bufscope {got}");
        } else {
            // Past the attribution hold, the drops are counted as unknown, not on the receiver.
            let unknown = eventually(Duration::from_secs(30), "unattributed drops", || {
                let m = pod.scrape();
                let u = m.sum("bufscope_socket_drops_total", &[("comm", "_unknown")]);
                (u >= kernel).then_some((u, m))
            });
            assert_eq!(
                unknown
                    .1
                    .sum("bufscope_socket_drops_total", &[("pid", pid.as_str())]),
                0.0,
                "{name}: attributed anyway"
            );
            eprintln!("{name}: {} drops under comm=\"_unknown\"", unknown.0);
        }
    }
}

/// Made by `cargo xtask setup` (xtask/src/image.rs `LOCAL_BASE`).
const LOCAL_BASE: &str = "localhost/bufscope-base:bookworm";

/// `podman <args>`'s stdout, trimmed; panics with its stderr.
fn podman(args: &[&str]) -> String {
    let (ok, out, err) = output(Command::new("podman").args(args), "");
    assert!(
        ok,
        "podman {}: {err} (cargo xtask setup installs podman and {LOCAL_BASE})",
        args.join(" ")
    );
    out.trim().to_string()
}

/// A podman container, removed on drop.
struct Podman(String);

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = output(
            Command::new("podman").args(["rm", "--force", "--time", "2", &self.0]),
            "",
        );
    }
}

/// The cgroup directories podman made for a `--cgroup-parent` (`/kubepods/…/pod<uid>`, and
/// its `conmon` beside the container's) in every hierarchy, removed when dropped after the
/// container: the pod's subtree deepest first, then each parent once empty.
struct KubepodsCgroups(String);

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

impl Drop for KubepodsCgroups {
    fn drop(&mut self) {
        let Ok(mounts) = std::fs::read_dir("/sys/fs/cgroup") else {
            return;
        };
        let mut roots: Vec<std::path::PathBuf> = mounts.flatten().map(|e| e.path()).collect();
        roots.push("/sys/fs/cgroup".into());
        for root in roots {
            let mut dir = root.join(self.0.trim_start_matches('/'));
            remove_cgroup_tree(&dir);
            dir.pop();
            while dir != root && dir.starts_with(&root) {
                if std::fs::remove_dir(&dir).is_err() {
                    break;
                }
                if !dir.pop() {
                    break;
                }
            }
        }
    }
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn a_container_laid_out_as_the_kubelet_does_gets_its_pod_namespace_and_name() {
    bufscope_integration::require_root();
    let ds = docs(&render("overlays/gateway"));
    let pod_spec = &kind(&ds, "DaemonSet").unwrap()["spec"]["template"]["spec"];
    let c = &pod_spec["containers"][0];
    let args = strings(&c["args"]);
    let caps: BTreeSet<String> = strings(&c["securityContext"]["capabilities"]["add"])
        .into_iter()
        .collect();
    let dir = TempDir::new("kubelet");
    // The node: its /var/log as the kubelet lays it out, and the DaemonSet's hostPath volumes
    // under /var/log bound where the pod mounts them.
    let node = dir.path().join("node");
    let binds: Vec<(std::path::PathBuf, String)> = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| {
            let v = pod_spec["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == m["name"])?;
            let host = v["hostPath"]["path"].as_str()?;
            host.starts_with("/var/log/").then(|| {
                assert_eq!(m["readOnly"], true, "{host} is mounted read-only");
                let src = node.join(host.trim_start_matches('/'));
                std::fs::create_dir_all(&src).unwrap();
                (src, m["mountPath"].as_str().unwrap().to_string())
            })
        })
        .collect();
    assert_eq!(
        binds.len(),
        2,
        "the DaemonSet mounts /var/log/pods and /var/log/containers"
    );

    let (ns, pod, uid, cname) = (
        "vpn-edge",
        "wg-gw-7d9f4",
        "8d2c7a9e-3b1f-4f6a-9c0d-2e5b7a1c4d3f",
        "wireguard-go",
    );
    // A real container (its own network namespace), created first so that its id is laid out
    // before its process runs, as the kubelet links a container's log before starting it. It
    // runs where the kubelet puts a pod's containers (`/kubepods/besteffort/pod<uid>/`,
    // podman's cgroupfs driver here; root-owned): pod labels come only from that hierarchy.
    let name = format!("bufscope-test-{}-k8s", std::process::id());
    let pod_cgroup = format!("/kubepods/besteffort/pod{uid}");
    let _cgroups = KubepodsCgroups(pod_cgroup.clone());
    let wl = bufscope_integration::workload_bin().display().to_string();
    let id = podman(&[
        "create",
        "--interactive",
        "--name",
        &name,
        "--network",
        "none",
        "--read-only",
        "--cgroup-parent",
        &pod_cgroup,
        "--volume",
        &format!("{wl}:{wl}:ro"),
        LOCAL_BASE,
        &wl,
        "udp-recv",
        "--rcvbuf",
        "4096",
    ]);
    let _ct = Podman(name.clone());
    assert_eq!(id.len(), 64, "a container id: {id}");
    let log_dir = node.join(format!("var/log/pods/{ns}_{pod}_{uid}/{cname}"));
    std::fs::create_dir_all(&log_dir).unwrap();
    std::fs::write(log_dir.join("0.log"), "").unwrap();
    std::os::unix::fs::symlink(
        format!("/var/log/pods/{ns}_{pod}_{uid}/{cname}/0.log"),
        node.join(format!("var/log/containers/{pod}_{ns}_{cname}-{id}.log")),
    )
    .unwrap();
    // A second pod's container on the same node that is not this one: not confused with it.
    let other = "f".repeat(64);
    std::os::unix::fs::symlink(
        "/var/log/pods/x/y/0.log",
        node.join(format!("var/log/containers/other_default_side-{other}.log")),
    )
    .unwrap();

    let bufscope = PodLike::start_with_binds(&args, &caps, dir.path(), &binds);
    let mut cmd = Command::new("podman");
    cmd.args(["start", "--attach", "--interactive", &name])
        .stderr(Stdio::inherit());
    let mut recv = bufscope_testkit::LineChild::spawn(cmd, "receiver").unwrap();
    let ready: std::collections::HashMap<String, String> =
        recv.wait_ready(Duration::from_secs(30)).unwrap();
    let ct_pid: u32 = podman(&["inspect", "--format", "{{.State.Pid}}", &name])
        .parse()
        .unwrap();
    let inode: u64 = ready["inodes"].parse().unwrap();
    let cgroup = std::fs::read_to_string(format!("/proc/{ct_pid}/cgroup")).unwrap();
    assert!(
        cgroup.contains(&id),
        "podman's cgroup names the id: {cgroup}"
    );

    let before = proc_udp_drops(ct_pid, inode).unwrap();
    let pid_s = ct_pid.to_string();
    assert!(
        Workload::start(&[
            "udp-flood",
            "--port",
            &ready["ports"],
            "--count",
            "2000",
            "--netns-of",
            &pid_s
        ])
        .wait(),
        "flood"
    );
    let kernel = (proc_udp_drops(ct_pid, inode).unwrap() - before) as f64;
    assert!(kernel > 0.0, "the kernel dropped nothing");
    let m = eventually(Duration::from_secs(20), "the container's drops", || {
        let m = bufscope.scrape();
        (m.sum("bufscope_socket_drops_total", &[("pid", pid_s.as_str())]) == kernel).then_some(m)
    });
    let want = [
        ("container", id.as_str()),
        ("pod", pod),
        ("namespace", ns),
        ("container_name", cname),
    ];
    let by_pid = [("pid", pid_s.as_str())];
    let series: Vec<_> = m.find("bufscope_socket_drops_total", &by_pid).collect();
    assert!(!series.is_empty());
    for s in &series {
        for (k, v) in want {
            assert_eq!(s.labels.get(k).map(String::as_str), Some(v), "{k} of {s:?}");
        }
    }
    assert_eq!(
        m.sum("bufscope_socket_drops_total", &want),
        kernel,
        "the kernel's drops column, by pod"
    );
    // Host processes carry none of them (bufscope's own series have no pid).
    for s in m.find("bufscope_socket_drops_total", &[]) {
        if bufscope_integration::comm_of(&pid_s).as_ref() != s.labels.get("comm") {
            assert!(!s.labels.contains_key("pod"), "{s:?}");
        }
    }
    // The finding, the status page's document and explain's JSON name the pod too.
    let finding = eventually(Duration::from_secs(10), "a finding", || {
        bufscope
            .scrape()
            .find("bufscope_finding", &want[..1])
            .next()
            .cloned()
    });
    for (k, v) in want {
        assert_eq!(
            finding.labels.get(k).map(String::as_str),
            Some(v),
            "{finding:?}"
        );
    }
    let (status, body) = http_get(&bufscope.addr, "/api/v1/status");
    assert_eq!(status, 200);
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let row = doc["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pid"] == pid_s.as_str())
        .unwrap();
    assert_eq!(
        (&row["pod"], &row["namespace"], &row["container_name"]),
        (&pod.into(), &ns.into(), &cname.into())
    );
    let (_, body) = http_get(&bufscope.addr, "/api/v1/findings");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let f = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["process"]["pid"] == ct_pid)
        .unwrap();
    assert_eq!(f["process"]["pod"], pod, "{f}");
    assert_eq!(f["process"]["namespace"], ns, "{f}");
    eprintln!(
        "container {}: kernel drops {kernel} = bufscope {kernel} on pod={pod} namespace={ns} container_name={cname}",
        &id[..12]
    );
    drop(recv);
}
