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

/// Reads the kubelet's layout under a log directory.
pub struct Pods {
    dir: Option<PathBuf>,
    /// Container id → labels (`containers/`).
    links: Mutex<Listing<PodLabels>>,
    /// Pod UID → (namespace, pod, the pod's directory) (`pods/`).
    pods: Mutex<Listing<(String, String, PathBuf)>>,
}

impl Pods {
    /// Reads `dir` (the kubelet's `/var/log`, mounted read-only); `None`: never.
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self {
            dir,
            links: Mutex::new(Listing::default()),
            pods: Mutex::new(Listing::default()),
        }
    }

    /// The labels of the container `container_id` (may be empty) of a process whose
    /// `/proc/<pid>/cgroup` is `cgroup`.
    pub fn labels(&self, container_id: &str, cgroup: &str) -> PodLabels {
        let Some(dir) = &self.dir else {
            return PodLabels::default();
        };
        if !container_id.is_empty()
            && let Ok(mut links) = self.links.lock()
            && let Some(l) = links.get(container_id, || list_links(&dir.join("containers")))
        {
            return l;
        }
        let Some(uid) = pod_uid(cgroup) else {
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
