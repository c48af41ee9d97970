//! Container id from a process's cgroup path (docker, containerd/Kubernetes, cri-o, podman).

/// Extracts the container id (64 hex digits) from the contents of `/proc/<pid>/cgroup`, or
/// `None` for processes on the host. Understands, among others:
/// - docker (cgroupfs and systemd drivers): `/docker/<id>`, `/system.slice/docker-<id>.scope`
/// - containerd / Kubernetes: `/kubepods/…/pod<uid>/<id>`, `…/cri-containerd-<id>.scope`
/// - cri-o: `…/crio-<id>.scope`, `…/crio-conmon-<id>.scope` is the monitor, not the container
/// - podman: `…/libpod-<id>.scope`, `/machine.slice/libpod-<id>.scope/container`
pub fn container_id(cgroup_file: &str) -> Option<String> {
    for line in cgroup_file.lines() {
        // "hierarchy-id:controllers:path"
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        if let Some(id) = container_id_from_path(path) {
            return Some(id);
        }
    }
    None
}

/// Container id from one cgroup path.
pub fn container_id_from_path(path: &str) -> Option<String> {
    // Walk components from the leaf up: the innermost id-looking component is the container.
    for comp in path.rsplit('/') {
        if comp.contains("conmon") {
            continue;
        }
        let stem = comp.strip_suffix(".scope").unwrap_or(comp);
        let candidate = stem.rsplit(['-', ':']).next().unwrap_or(stem);
        if candidate.len() == 64 && candidate.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Some(candidate.to_ascii_lowercase());
        }
    }
    None
}

/// The cgroup v2 path of a `/proc/<pid>/cgroup` file (its `0::` line; on a v1-only host the
/// `name=systemd` hierarchy's), without the leading `/`.
pub fn unified_path(cgroup_file: &str) -> &str {
    let mut systemd = None;
    for line in cgroup_file.lines() {
        let mut f = line.splitn(3, ':');
        let (id, controllers, path) = (f.next(), f.next(), f.next().unwrap_or(""));
        if id == Some("0") && controllers == Some("") {
            return path.trim_start_matches('/');
        }
        if controllers == Some("name=systemd") {
            systemd = Some(path.trim_start_matches('/'));
        }
    }
    systemd.unwrap_or("")
}

/// What a host process's cgroup says about the service it belongs to: the path up to its
/// first systemd service (`system.slice/nginx.service`, a user's `user@1000.service`),
/// else the path without its trailing transient scopes (`session-4.scope`, `run-…scope`),
/// else the path; `/` for the root. Bounded like the services of a host, not like its
/// sessions or processes.
pub fn service_cgroup(path: &str) -> String {
    let comps: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != "..")
        .collect();
    if let Some(i) = comps.iter().position(|c| c.ends_with(".service")) {
        return comps[..=i].join("/");
    }
    let mut end = comps.len();
    while end > 0 && comps[end - 1].ends_with(".scope") && !(end == 1 && comps[0] == "init.scope") {
        end -= 1;
    }
    if end == 0 {
        return "/".to_string();
    }
    comps[..end].join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_cgroups_name_services_not_sessions() {
        for (path, want) in [
            ("system.slice/nginx.service", "system.slice/nginx.service"),
            (
                "/system.slice/nginx.service/worker",
                "system.slice/nginx.service",
            ),
            (
                "user.slice/user-1000.slice/user@1000.service/app.slice/x.scope",
                "user.slice/user-1000.slice/user@1000.service",
            ),
            (
                "user.slice/user-1000.slice/session-4.scope",
                "user.slice/user-1000.slice",
            ),
            ("init.scope", "init.scope"),
            ("", "/"),
            (
                "/../../system.slice/chronyd.service",
                "system.slice/chronyd.service",
            ),
            ("bufscope-test/child", "bufscope-test/child"),
        ] {
            assert_eq!(service_cgroup(path), want, "{path}");
        }
    }

    #[test]
    fn the_unified_path() {
        assert_eq!(unified_path("12:pids:/x\n0::/a/b.scope\n"), "a/b.scope");
        assert_eq!(
            unified_path("1:name=systemd:/system.slice/a.service\n"),
            "system.slice/a.service"
        );
        assert_eq!(unified_path(""), "");
    }

    const ID: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

    #[test]
    fn runtimes() {
        for path in [
            format!("/docker/{ID}"),
            format!("/system.slice/docker-{ID}.scope"),
            format!("/kubepods/burstable/pod1234-5678/{ID}"),
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice/cri-containerd-{ID}.scope"
            ),
            format!("/kubepods.slice/kubepods-pod1.slice/crio-{ID}.scope"),
            format!("/machine.slice/libpod-{ID}.scope/container"),
            format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"),
        ] {
            assert_eq!(container_id_from_path(&path).as_deref(), Some(ID), "{path}");
        }
    }

    #[test]
    fn host_and_monitor_processes_have_none() {
        assert_eq!(
            container_id("0::/user.slice/user-0.slice/session-1.scope\n"),
            None
        );
        assert_eq!(container_id("0::/\n"), None);
        let conmon = format!("0::/machine.slice/libpod-conmon-{ID}.scope\n");
        assert_eq!(container_id(&conmon), None);
    }

    #[test]
    fn hybrid_hierarchy_file() {
        let f = format!("12:pids:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/\n");
        assert_eq!(container_id(&f).as_deref(), Some(ID));
    }
}
