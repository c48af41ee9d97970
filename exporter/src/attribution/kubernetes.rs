//! Pod, namespace and container name of a container, from the kubelet's node-local log
//! layout: no API server, no credentials, no new privilege.
//!
//! The kubelet keeps, for every container it runs (log agents rely on both):
//! - `<log-dir>/containers/<pod>_<namespace>_<container>-<container id>.log`, a symlink to the
//!   container's current log file: the container id names pod, namespace and container;
//! - `<log-dir>/pods/<namespace>_<pod>_<pod uid>/<container>/`: the pod's directory, found
//!   from the pod UID in the process's cgroup path (`kubepods-…-pod<uid>.slice`,
//!   `/kubepods/…/pod<uid>/`) when no link names the container id (the container's name then
//!   only when the pod has a single container directory).
//!
//! Pod and namespace names cannot hold `_` (DNS names), so the names split unambiguously.
//! The answers are cached by container id and pod UID (a listing of each directory at most
//! every [`REFRESH`] when an id is not found); outside Kubernetes the directories do not
//! exist and the labels are empty.
//!
//! **Only the kubelet's own hierarchy names a pod** ([`Pods::place`]): a process gets pod
//! labels (and its container id) from a cgroup that looks like a kubelet's only when the path
//! is the kubelet's layout from the top of the hierarchy — `kubepods.slice/[kubepods-<qos>.slice/]kubepods-[<qos>-]pod<uid>.slice/<runtime>-<id>.scope`
//! or, with the cgroupfs driver, `kubepods/[<qos>/]pod<uid>/<id>` — with the pod UID and
//! container id read at their fixed places (a cgroup a container made inside its own is
//! deeper, and names that container), and, where the host's cgroup2 is visible, with the
//! kubelet's root, the pod's and the container's directories owned by root. Any user can make
//! a cgroup named like a pod's in a subtree delegated to them (`user@UID.service/…`) with a
//! real pod's UID and container id (both are world-readable under `/var/log`): such a process
//! keeps its own identity (its cgroup, no container, no pod) and is counted in
//! `bufscope_pod_labels_refused_total{reason}`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashMapExt as _};

/// A directory listing is read again at most this often when an id is missing from it.
pub const REFRESH: Duration = Duration::from_secs(2);

/// The Kubernetes labels of a process (all empty outside a pod).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodLabels {
    /// Pod name.
    pub pod: String,
    /// Pod namespace.
    pub namespace: String,
    /// The container's name in the pod spec.
    pub container_name: String,
}

/// One directory's listing, keyed by id.
struct Listing<T> {
    by_id: HashMap<String, T>,
    read_at: Option<Instant>,
}

impl<T> Default for Listing<T> {
    fn default() -> Self {
        Self {
            by_id: HashMap::new(),
            read_at: None,
        }
    }
}

impl<T: Clone> Listing<T> {
    /// The entry of `id`, listing the directory again (at most every [`REFRESH`]) on a miss.
    fn get(&mut self, id: &str, list: impl FnOnce() -> HashMap<String, T>) -> Option<T> {
        if let Some(v) = self.by_id.get(id) {
            return Some(v.clone());
        }
        let now = Instant::now();
        if self
            .read_at
            .is_some_and(|t| now.duration_since(t) < REFRESH)
        {
            return None;
        }
        self.read_at = Some(now);
        self.by_id = list();
        self.by_id.get(id).cloned()
    }
}

/// Why a cgroup that looks like a kubelet's gave no pod labels
/// (`bufscope_pod_labels_refused_total{reason}`).
pub mod refused {
    /// In a subtree delegated to a user (`user@UID.service`).
    pub const USER_DELEGATED: &str = "user_delegated";
    /// Not under the kubelet's root at the top of the hierarchy.
    pub const OUTSIDE_ROOT: &str = "outside_kubepods_root";
    /// Under it, but not the kubelet's layout (a cgroup made inside a container's own).
    pub const LAYOUT: &str = "layout";
    /// The kubelet's root, the pod's or the container's directory is not owned by root.
    pub const NOT_ROOT_OWNED: &str = "not_root_owned";
    /// Every reason.
    pub const ALL: &[&str] = &[USER_DELEGATED, OUTSIDE_ROOT, LAYOUT, NOT_ROOT_OWNED];
}

/// Where a process runs, as its labels say it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Place {
    /// Container id (empty on the host, and for a refused kubelet-like path).
    pub container: String,
    /// Pod labels (empty outside a pod).
    pub pod: PodLabels,
    /// A host process's service cgroup ([`super::container::service_cgroup`]); empty in a
    /// container.
    pub cgroup: String,
    /// Why a kubelet-like path was refused (None: it was not, or there was none).
    pub refused: Option<&'static str>,
}

/// The kubelet's layout read from an absolute cgroup path: the pod UID, the container id
/// (empty for a pod-level cgroup), and how many leading components are the kubelet's
/// directories (root … container) whose owner must be root.
fn kubelet_layout(path: &str) -> Option<(String, String, usize)> {
    let c: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let qos = |s: &str| matches!(s, "besteffort" | "burstable");
    let (systemd, mut i) = match *c.first()? {
        "kubepods.slice" => (true, 1),
        "kubepods" => (false, 1),
        _ => return None,
    };
    let pod = if systemd {
        let q = c
            .get(1)
            .and_then(|s| s.strip_prefix("kubepods-")?.strip_suffix(".slice"))
            .filter(|q| qos(q));
        if q.is_some() {
            i = 2;
        }
        let stem = c.get(i)?.strip_suffix(".slice")?;
        let uid = match q {
            Some(q) => stem.strip_prefix(&format!("kubepods-{q}-pod"))?,
            None => stem.strip_prefix("kubepods-pod")?,
        };
        uid.replace('_', "-")
    } else {
        if c.get(1).is_some_and(|s| qos(s)) {
            i = 2;
        }
        c.get(i)?.strip_prefix("pod")?.to_string()
    };
    if pod.is_empty() || !pod.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return None;
    }
    let container = match c.get(i + 1) {
        None => String::new(),
        Some(comp) if comp.contains("conmon") => return None,
        Some(comp) => {
            let stem = comp.strip_suffix(".scope").unwrap_or(comp);
            let id = stem.rsplit(['-', ':']).next().unwrap_or(stem);
            if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            id.to_ascii_lowercase()
        }
    };
    let depth = if container.is_empty() { i + 1 } else { i + 2 };
    Some((pod, container, depth))
}

/// Why `path` (absolute) is not the kubelet's, for one that names a kubepods cgroup.
fn refusal(path: &str) -> &'static str {
    let c: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    if c.iter()
        .any(|c| c.starts_with("user@") && c.ends_with(".service"))
    {
        refused::USER_DELEGATED
    } else if !matches!(c.first(), Some(&"kubepods.slice" | &"kubepods")) {
        refused::OUTSIDE_ROOT
    } else {
        refused::LAYOUT
    }
}

/// The directory of our own process in the cgroup2 hierarchy mounted at `root` (to read the
/// paths a private cgroup namespace shows relative to it): a walk that stops at the first
/// `cgroup.procs` listing `pid` (at most 20,000 directories, 8 deep).
fn find_own_cgroup(root: &Path, pid: u32) -> Option<String> {
    let want = pid.to_string();
    let mut queue = std::collections::VecDeque::from([(root.to_path_buf(), 0usize)]);
    let mut seen = 0usize;
    while let Some((dir, depth)) = queue.pop_front() {
        seen += 1;
        if seen > 20_000 {
            return None;
        }
        if std::fs::read_to_string(dir.join("cgroup.procs"))
            .is_ok_and(|p| p.lines().any(|l| l.trim() == want))
        {
            let rel = dir.strip_prefix(root).ok()?;
            return Some(rel.to_string_lossy().into_owned());
        }
        if depth >= 8 {
            continue;
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.filter_map(Result::ok) {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    queue.push_back((e.path(), depth + 1));
                }
            }
        }
    }
    None
}

/// Reads the kubelet's layout under a log directory.
pub struct Pods {
    dir: Option<PathBuf>,
    /// Container id → labels (`containers/`).
    links: Mutex<Listing<PodLabels>>,
    /// Pod UID → (namespace, pod, the pod's directory) (`pods/`).
    pods: Mutex<Listing<(String, String, PathBuf)>>,
    /// The host's cgroup2 mount (None: not visible; ownership is then not checked).
    cgroup_root: Option<PathBuf>,
    /// Our own cgroup, found once when a path is relative to it (a private namespace).
    own: std::sync::OnceLock<Option<String>>,
    /// Processes refused pod labels, by reason.
    refused: Mutex<std::collections::BTreeMap<&'static str, u64>>,
}

impl Pods {
    /// Reads `dir` (the kubelet's `/var/log`, mounted read-only); `None`: never.
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self {
            dir,
            links: Mutex::new(Listing::default()),
            pods: Mutex::new(Listing::default()),
            cgroup_root: None,
            own: std::sync::OnceLock::new(),
            refused: Mutex::new(std::collections::BTreeMap::new()),
        }
    }

    /// Checks the owners of kubelet-like cgroup directories under the host's cgroup2 mount
    /// `root`.
    pub fn with_cgroup_root(mut self, root: Option<PathBuf>) -> Self {
        self.cgroup_root = root;
        self
    }

    /// Processes refused pod labels so far, by reason (every reason, 0 included).
    pub fn refused(&self) -> Vec<(&'static str, u64)> {
        let counts = self.refused.lock().map(|m| m.clone()).unwrap_or_default();
        refused::ALL
            .iter()
            .map(|r| (*r, counts.get(r).copied().unwrap_or(0)))
            .collect()
    }

    /// `path` from the top of the hierarchy: a path a private cgroup namespace shows
    /// relative to ours (`/../../x`) is resolved against our own cgroup (None when that
    /// cannot be found).
    fn absolute(&self, path: &str) -> Option<String> {
        if !path.starts_with("..") {
            return Some(path.to_string());
        }
        let own = self
            .own
            .get_or_init(|| find_own_cgroup(self.cgroup_root.as_deref()?, std::process::id()))
            .as_deref()?;
        let mut comps: Vec<&str> = own.split('/').filter(|c| !c.is_empty()).collect();
        for c in path.split('/').filter(|c| !c.is_empty()) {
            if c == ".." {
                comps.pop()?;
            } else {
                comps.push(c);
            }
        }
        Some(comps.join("/"))
    }

    /// Whether the first `depth` directories of `path` (absolute) are owned by root, where
    /// the host's cgroup2 is visible (a directory that is not, e.g. gone with its process,
    /// is not held against it).
    fn root_owned(&self, path: &str, depth: usize) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        let Some(root) = &self.cgroup_root else {
            return true;
        };
        let mut dir = root.clone();
        for c in path.split('/').filter(|c| !c.is_empty()).take(depth) {
            dir.push(c);
            if let Ok(m) = std::fs::symlink_metadata(&dir)
                && m.uid() != 0
            {
                return false;
            }
        }
        true
    }

    /// Where the process whose `/proc/<pid>/cgroup` is `cgroup_file` runs: its container,
    /// its pod (only from the kubelet's own hierarchy: see the module), else its service
    /// cgroup.
    pub fn place(&self, cgroup_file: &str) -> Place {
        let path = super::container::unified_path(cgroup_file);
        let kubelike = path.split('/').any(|c| c.starts_with("kubepods"));
        if !kubelike {
            let container = super::container::container_id(cgroup_file).unwrap_or_default();
            let cgroup = match container.is_empty() {
                true => super::container::service_cgroup(path),
                false => String::new(),
            };
            return Place {
                container,
                cgroup,
                ..Place::default()
            };
        }
        let abs = self.absolute(path);
        let verdict = match abs.as_deref().map(|a| (a, kubelet_layout(a))) {
            Some((a, Some((uid, container, depth)))) => match self.root_owned(a, depth) {
                true => Ok((uid, container)),
                false => Err(refused::NOT_ROOT_OWNED),
            },
            Some((a, None)) => Err(refusal(a)),
            None => Err(refusal(path)),
        };
        match verdict {
            Ok((uid, container)) => {
                let pod = self.labels_of(&container, Some(&uid));
                Place {
                    container,
                    pod,
                    ..Place::default()
                }
            }
            Err(reason) => {
                if let Ok(mut m) = self.refused.lock() {
                    *m.entry(reason).or_default() += 1;
                }
                Place {
                    cgroup: super::container::service_cgroup(abs.as_deref().unwrap_or(path)),
                    refused: Some(reason),
                    ..Place::default()
                }
            }
        }
    }

    /// The labels of the container `container_id` (may be empty) of a process whose
    /// `/proc/<pid>/cgroup` is `cgroup` (the layout unchecked: [`Pods::place`] checks it).
    pub fn labels(&self, container_id: &str, cgroup: &str) -> PodLabels {
        self.labels_of(container_id, pod_uid(cgroup).as_deref())
    }

    /// The labels of container `container_id` (may be empty) in the pod `uid`.
    fn labels_of(&self, container_id: &str, uid: Option<&str>) -> PodLabels {
        let Some(dir) = &self.dir else {
            return PodLabels::default();
        };
        if !container_id.is_empty()
            && let Ok(mut links) = self.links.lock()
            && let Some(l) = links.get(container_id, || list_links(&dir.join("containers")))
        {
            return l;
        }
        let Some(uid) = uid.map(str::to_string) else {
            return PodLabels::default();
        };
        let Some((namespace, pod, pod_dir)) = self
            .pods
            .lock()
            .ok()
            .and_then(|mut p| p.get(&uid, || list_pods(&dir.join("pods"))))
        else {
            return PodLabels::default();
        };
        PodLabels {
            pod,
            namespace,
            container_name: single_container(&pod_dir).unwrap_or_default(),
        }
    }
}

/// `<pod>_<namespace>_<container>-<64 hex>.log` → (container id, labels).
pub fn parse_link_name(name: &str) -> Option<(String, PodLabels)> {
    let stem = name.strip_suffix(".log")?;
    let (rest, id) = stem.rsplit_once('-')?;
    if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut parts = rest.splitn(3, '_');
    let (pod, namespace, container) = (parts.next()?, parts.next()?, parts.next()?);
    if pod.is_empty() || namespace.is_empty() || container.is_empty() {
        return None;
    }
    Some((
        id.to_ascii_lowercase(),
        PodLabels {
            pod: pod.to_string(),
            namespace: namespace.to_string(),
            container_name: container.to_string(),
        },
    ))
}

/// `<namespace>_<pod>_<uid>` → (uid, namespace, pod).
pub fn parse_pod_dir(name: &str) -> Option<(String, String, String)> {
    let mut parts = name.splitn(3, '_');
    let (namespace, pod, uid) = (parts.next()?, parts.next()?, parts.next()?);
    if namespace.is_empty() || pod.is_empty() || uid.is_empty() {
        return None;
    }
    Some((uid.to_string(), namespace.to_string(), pod.to_string()))
}

/// The pod UID in a `/proc/<pid>/cgroup` file: `kubepods-<qos>-pod<uid>.slice` (systemd
/// driver; the UID's `-` written as `_`) or `/kubepods/<qos>/pod<uid>/` (cgroupfs driver).
pub fn pod_uid(cgroup_file: &str) -> Option<String> {
    for line in cgroup_file.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        if !path.contains("kubepods") {
            continue;
        }
        for comp in path.rsplit('/') {
            let stem = comp.strip_suffix(".slice").unwrap_or(comp);
            let uid = match stem.rsplit_once("-pod") {
                Some((head, uid)) if head.starts_with("kubepods") => uid,
                _ => match stem.strip_prefix("pod") {
                    Some(uid) => uid,
                    None => continue,
                },
            };
            let uid = uid.replace('_', "-");
            if !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Some(uid);
            }
        }
    }
    None
}

/// Every link of `containers/`, by container id.
fn list_links(dir: &Path) -> HashMap<String, PodLabels> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return HashMap::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| parse_link_name(e.file_name().to_str()?))
        .collect()
}

/// Every pod directory of `pods/`, by pod UID.
fn list_pods(dir: &Path) -> HashMap<String, (String, String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return HashMap::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let (uid, ns, pod) = parse_pod_dir(e.file_name().to_str()?)?;
            Some((uid, (ns, pod, e.path())))
        })
        .collect()
}

/// The name of the pod directory's only container directory (None with several: which one
/// the process is in is not written there).
fn single_container(pod_dir: &Path) -> Option<String> {
    let mut names = std::fs::read_dir(pod_dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok());
    let first = names.next()?;
    names.next().is_none().then_some(first)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const ID: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
    const UID: &str = "8d2c7a9e-3b1f-4f6a-9c0d-2e5b7a1c4d3f";

    #[test]
    fn link_names() {
        let (id, l) =
            parse_link_name(&format!("wg-gw-7d9f_vpn-edge_wireguard-go-{ID}.log")).unwrap();
        assert_eq!(id, ID);
        assert_eq!(
            l,
            PodLabels {
                pod: "wg-gw-7d9f".into(),
                namespace: "vpn-edge".into(),
                container_name: "wireguard-go".into()
            }
        );
        assert_eq!(parse_link_name(&format!("a_b_c-{ID}")), None, "no .log");
        assert_eq!(parse_link_name("a_b_c-1234.log"), None, "not an id");
        assert_eq!(
            parse_link_name(&format!("a_b-{ID}.log")),
            None,
            "no container"
        );
    }

    #[test]
    fn pod_dirs() {
        assert_eq!(
            parse_pod_dir(&format!("vpn-edge_wg-gw-7d9f_{UID}")),
            Some((UID.into(), "vpn-edge".into(), "wg-gw-7d9f".into()))
        );
        assert_eq!(parse_pod_dir("justone"), None);
    }

    #[test]
    fn pod_uid_from_either_cgroup_driver() {
        let systemd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(pod_uid(&systemd).as_deref(), Some(UID));
        let guaranteed = format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/crio-{ID}.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(pod_uid(&guaranteed).as_deref(), Some(UID));
        let cgroupfs = format!("0::/kubepods/besteffort/pod{UID}/{ID}\n");
        assert_eq!(pod_uid(&cgroupfs).as_deref(), Some(UID));
        assert_eq!(
            pod_uid(&format!("0::/system.slice/docker-{ID}.scope\n")),
            None
        );
        assert_eq!(
            pod_uid("0::/kubepods.slice/kubepods-besteffort.slice\n"),
            None
        );
        assert_eq!(
            pod_uid("0::/user.slice/podman-pod1.slice\n"),
            None,
            "not kubepods"
        );
    }

    fn cg(path: &str) -> String {
        format!("0::/{path}\n")
    }

    /// Only the kubelet's layout from the top of the hierarchy names a pod; a user's
    /// delegated subtree, a path elsewhere or a cgroup made inside a container's own keep
    /// the process's own identity (its cgroup) and are counted.
    #[test]
    fn pod_labels_only_from_the_kubelets_hierarchy() {
        let root = std::env::temp_dir().join(format!("bufscope-k8s-forge-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let pod_dir = root.join(format!("pods/vpn-edge_wg-gw-7d9f_{UID}"));
        std::fs::create_dir_all(pod_dir.join("wireguard-go")).unwrap();
        std::fs::create_dir_all(root.join("containers")).unwrap();
        std::os::unix::fs::symlink(
            pod_dir.join("wireguard-go"),
            root.join(format!(
                "containers/wg-gw-7d9f_vpn-edge_wireguard-go-{ID}.log"
            )),
        )
        .unwrap();
        let pods = Pods::new(Some(root.clone()));
        let uid = UID.replace('-', "_");
        let real = format!(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/cri-containerd-{ID}.scope"
        );
        let place = pods.place(&cg(&real));
        assert_eq!(
            (
                place.pod.pod.as_str(),
                place.container.as_str(),
                place.cgroup.as_str()
            ),
            ("wg-gw-7d9f", ID, "")
        );
        assert_eq!(place.refused, None);
        let cgroupfs = pods.place(&cg(&format!("kubepods/burstable/pod{UID}/{ID}")));
        assert_eq!(cgroupfs.pod.namespace, "vpn-edge");
        let guaranteed = pods.place(&cg(&format!(
            "kubepods.slice/kubepods-pod{uid}.slice/crio-{ID}.scope"
        )));
        assert_eq!(guaranteed.pod.pod, "wg-gw-7d9f");
        for (path, reason, cgroup) in [
            (
                format!("user.slice/user-65534.slice/user@65534.service/{real}"),
                refused::USER_DELEGATED,
                "user.slice/user-65534.slice/user@65534.service",
            ),
            (
                format!("system.slice/{real}"),
                refused::OUTSIDE_ROOT,
                "system.slice/kubepods.slice/kubepods-besteffort.slice",
            ),
            (
                format!(
                    "kubepods.slice/evil.slice/kubepods-besteffort-pod{uid}.slice/cri-containerd-{ID}.scope"
                ),
                refused::LAYOUT,
                "kubepods.slice/evil.slice/kubepods-besteffort-pod",
            ),
        ] {
            let p = pods.place(&cg(&path));
            assert_eq!(p.refused, Some(reason), "{path}");
            assert_eq!(
                (p.container.as_str(), p.pod.clone()),
                ("", PodLabels::default()),
                "{path}"
            );
            // Its own cgroup, up to its service (or without its own scopes).
            assert!(
                p.cgroup.starts_with(cgroup) && !p.cgroup.ends_with(".scope"),
                "{path}: {}",
                p.cgroup
            );
        }
        // A cgroup a container made inside its own names that container, whatever it is
        // called.
        let other = "a".repeat(64);
        let nested = pods.place(&cg(&format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podffff.slice/cri-containerd-{other}.scope/{real}"
        )));
        assert_eq!(
            (nested.container.as_str(), nested.refused),
            (other.as_str(), None)
        );
        assert_ne!(nested.pod.pod, "wg-gw-7d9f");
        let counts: std::collections::BTreeMap<_, _> = pods.refused().into_iter().collect();
        assert_eq!(counts[refused::USER_DELEGATED], 1);
        assert_eq!(counts[refused::OUTSIDE_ROOT], 1);
        assert_eq!(counts[refused::LAYOUT], 1);
        // Outside kubepods: the container runtimes' own ids, and host services.
        let podman = pods.place(&cg(&format!(
            "user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"
        )));
        assert_eq!((podman.container.as_str(), podman.refused), (ID, None));
        let host = pods.place(&cg("system.slice/nginx.service"));
        assert_eq!(host.cgroup, "system.slice/nginx.service");
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Where the host's cgroup2 is visible, the kubelet's root, the pod's and the
    /// container's directories must be owned by root.
    #[test]
    fn kubelet_directories_not_owned_by_root_are_refused() {
        use std::os::unix::fs::MetadataExt as _;
        let root = std::env::temp_dir().join(format!("bufscope-cg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let path = format!(
            "kubepods.slice/kubepods-pod{}.slice/cri-containerd-{ID}.scope",
            "a1"
        );
        std::fs::create_dir_all(root.join(&path)).unwrap();
        let pods = Pods::new(None).with_cgroup_root(Some(root.clone()));
        let me_root = std::fs::metadata(&root).unwrap().uid() == 0;
        if me_root {
            assert_eq!(pods.place(&cg(&path)).refused, None, "root's: accepted");
            // A directory a user owns, even in the right place, names no pod.
            std::os::unix::fs::chown(
                root.join("kubepods.slice/kubepods-poda1.slice"),
                Some(65534),
                None,
            )
            .unwrap();
        }
        let p = pods.place(&cg(&path));
        assert_eq!(p.refused, Some(refused::NOT_ROOT_OWNED));
        assert_eq!(p.container, "");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn from_a_kubelet_layout_links_first_then_the_pod_uid() {
        let root = std::env::temp_dir().join(format!("bufscope-k8s-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let pod_dir = root.join(format!("pods/vpn-edge_wg-gw-7d9f_{UID}"));
        std::fs::create_dir_all(pod_dir.join("wireguard-go")).unwrap();
        std::fs::write(pod_dir.join("wireguard-go/0.log"), "").unwrap();
        std::fs::create_dir_all(root.join("containers")).unwrap();
        let pods = Pods::new(Some(root.clone()));
        let cgroup = format!("0::/kubepods/besteffort/pod{UID}/{ID}\n");
        // No link yet: from the pod UID (one container directory: its name too).
        let want = PodLabels {
            pod: "wg-gw-7d9f".into(),
            namespace: "vpn-edge".into(),
            container_name: "wireguard-go".into(),
        };
        assert_eq!(pods.labels(ID, &cgroup), want);
        // A second container: the pod is known, the container's name is not.
        std::fs::create_dir_all(pod_dir.join("sidecar")).unwrap();
        let l = pods.labels(ID, &cgroup);
        assert_eq!(
            (l.pod.as_str(), l.container_name.as_str()),
            ("wg-gw-7d9f", "")
        );
        // The link names the container by id.
        std::os::unix::fs::symlink(
            pod_dir.join("wireguard-go/0.log"),
            root.join(format!(
                "containers/wg-gw-7d9f_vpn-edge_wireguard-go-{ID}.log"
            )),
        )
        .unwrap();
        let fresh = Pods::new(Some(root.clone()));
        assert_eq!(fresh.labels(ID, "0::/\n"), want, "the link alone suffices");
        // Host processes and no directory: empty.
        assert_eq!(fresh.labels("", "0::/user.slice\n"), PodLabels::default());
        assert_eq!(Pods::new(None).labels(ID, &cgroup), PodLabels::default());
        let missing = Pods::new(Some(root.join("nope")));
        assert_eq!(missing.labels(ID, &cgroup), PodLabels::default());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
