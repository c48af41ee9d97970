//! Finding and removing leftovers of killed runs by their name prefix.

use std::path::Path;
use std::time::Duration;

use crate::Error;
use crate::netns::{Netns, delete_netns, ip, kill_pids, pid_alive};

/// Where wireguard-go keeps its UAPI sockets (shared by all namespaces).
const WG_SOCKET_DIR: &str = "/run/wireguard";

/// What [`cleanup()`] removed and what it left alone.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CleanupReport {
    /// Namespaces deleted (their processes were killed first).
    pub namespaces: Vec<String>,
    /// Links deleted from the root namespace.
    pub links: Vec<String>,
    /// Stale wireguard-go UAPI sockets removed from `/run/wireguard`.
    pub sockets: Vec<String>,
    /// Namespaces left alone because the run that owns them is still alive.
    pub in_use: Vec<String>,
}

/// The pid embedded by [`crate::unique_name`] in `name` (`<prefix><hex pid>x…`), if any.
pub fn owner_pid(prefix: &str, name: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?;
    let (hex, _) = rest.split_once('x')?;
    if hex.is_empty() {
        return None;
    }
    u32::from_str_radix(hex, 16).ok()
}

/// True when `name` belongs to a run that is still alive (its embedded owner pid exists).
fn owned_by_live_run(prefix: &str, name: &str) -> bool {
    owner_pid(prefix, name)
        .and_then(|p| i32::try_from(p).ok())
        .is_some_and(|p| p as u32 == std::process::id() || pid_alive(p))
}

/// Namespaces whose names start with `prefix`, split into (leftovers, still in use). A name
/// counts as in use when it embeds the pid of a live process (see [`crate::unique_name`]).
pub fn leftovers(prefix: &str) -> Result<(Vec<String>, Vec<String>), Error> {
    if prefix.is_empty() {
        return Err(Error::InvalidName {
            name: prefix.into(),
            why: "an empty prefix matches everything",
        });
    }
    let (mut dead, mut live) = (Vec::new(), Vec::new());
    for ns in Netns::list()?.into_iter().filter(|n| n.starts_with(prefix)) {
        if owned_by_live_run(prefix, &ns) {
            live.push(ns);
        } else {
            dead.push(ns);
        }
    }
    Ok((dead, live))
}

/// Removes every namespace (killing its processes), root-namespace link and stale
/// wireguard-go socket whose name starts with `prefix` and whose owning run is gone. With
/// `include_live`, also removes those of runs that are still alive.
pub fn cleanup(prefix: &str, include_live: bool) -> Result<CleanupReport, Error> {
    crate::require_root()?;
    let (dead, live) = leftovers(prefix)?;
    let mut report = CleanupReport::default();
    let (targets, in_use) = if include_live {
        ([dead, live].concat(), Vec::new())
    } else {
        (dead, live)
    };
    report.in_use = in_use;
    let mut first_err = None;
    for ns in targets {
        match delete_netns(&ns) {
            Ok(()) => report.namespaces.push(ns),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    // Links in the root namespace (the lab never creates any, but other tools might have).
    let links = ip(["-o", "link", "show"])?;
    for name in links.lines().filter_map(|l| l.split(':').nth(1)) {
        let name = name.trim().split('@').next().unwrap_or_default();
        if name.starts_with(prefix) && (include_live || !owned_by_live_run(prefix, name)) {
            match ip(["link", "del", name]) {
                Ok(_) => report.links.push(name.to_string()),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
    }
    // wireguard-go sockets of interfaces that no longer exist: kill their owners too.
    if let Ok(dir) = std::fs::read_dir(WG_SOCKET_DIR) {
        for entry in dir.filter_map(Result::ok) {
            let file = entry.file_name().to_string_lossy().into_owned();
            let Some(ifname) = file.strip_suffix(".sock") else {
                continue;
            };
            if !ifname.starts_with(prefix) || (!include_live && owned_by_live_run(prefix, ifname)) {
                continue;
            }
            kill_pids(&wireguard_go_pids(ifname), Duration::from_millis(1000));
            if std::fs::remove_file(entry.path()).is_ok() {
                report.sockets.push(file);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

/// Pids of `wireguard-go … <ifname>` processes.
fn wireguard_go_pids(ifname: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read(Path::new("/proc").join(pid.to_string()).join("cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|&b| b == 0).collect();
                args.first().is_some_and(|a| a.ends_with(b"wireguard-go"))
                    && args.contains(&ifname.as_bytes())
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::owner_pid;

    #[test]
    fn owner_pid_parses_unique_names() {
        assert_eq!(owner_pid("bsl", "bsl1f3ax0a"), Some(0x1f3a));
        assert_eq!(
            owner_pid("bsl", &crate::unique_name("bsl", "b")),
            Some(std::process::id())
        );
        assert_eq!(owner_pid("bsl", "bslfoo"), None);
        assert_eq!(owner_pid("bsl", "bslx1a"), None);
        assert_eq!(owner_pid("bsl", "other1x1"), None);
    }
}
