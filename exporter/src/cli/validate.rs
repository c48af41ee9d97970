//! What clap cannot check about the flags, checked once they are parsed (and merged with
//! `--config.file`) and before anything is loaded: addresses, files and mounts that must
//! exist, a telemetry path no other route has, flags that contradict each other (the rooms
//! check their own: `signals::Flags::validate`). Each error names its flag ([`Invalid`]).

use super::{Invalid, KernelArgs, RunArgs};
use crate::kernel::{BPF_FS_MAGIC, PROC_SUPER_MAGIC};

impl KernelArgs {
    /// Checks what clap cannot (the cgroup2 mount), for every subcommand; probe names are
    /// checked by the parser.
    pub fn validate(&self) -> Result<(), Invalid> {
        if let Some(p) = &self.cgroup2 {
            crate::kernel::set_cgroup2_root(p)
                .map_err(|e| Invalid::new("path.cgroup2", format!("{e:#}")))?;
        }
        Ok(())
    }
}

/// Where bufscope mounts a bpffs when `--bpf.pin-path` is below it and none is mounted.
const BPFFS: &str = crate::bpf::pins::dir::BPFFS;

impl RunArgs {
    /// Checks the flags of `bufscope run` that clap cannot, once the config file is merged
    /// and before anything is loaded; returns the addresses to listen on.
    pub fn validate(&self) -> Result<Vec<std::net::SocketAddr>, Invalid> {
        let addrs =
            listen_addrs(&self.listen).map_err(|e| Invalid::new("web.listen-address", e))?;
        check_telemetry_path(&self.telemetry_path)
            .map_err(|e| Invalid::new("web.telemetry-path", e))?;
        if let Some(p) = &self.web_config
            && !p.is_file()
        {
            return Err(Invalid::new(
                "web.config.file",
                format!(
                    "--web.config.file {}: {} (name the TLS/basic-auth YAML file, or leave the \
                     flag out)",
                    p.display(),
                    not_a_file(p)
                ),
            ));
        }
        self.kernel.validate()?;
        self.signals.validate(&crate::signals::ValidateCx {
            disabled: &self.kernel.disable,
            pinned: self.pins.pin_path.is_some(),
            poll_interval: self.poll_interval,
        })?;
        if let Some(p) = &self.pins.pin_path {
            check_pin_path(p).map_err(|e| Invalid::new("bpf.pin-path", e))?;
        }
        if let Some(p) = self
            .kubernetes_log_dir
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty() && !p.is_dir())
        {
            return Err(Invalid::new(
                "kubernetes.log-dir",
                format!(
                    "--kubernetes.log-dir {}: not a directory (name where the kubelet's \
                     /var/log/pods and /var/log/containers are mounted, e.g. /host/var/log, or \
                     \"\" for no pod labels)",
                    p.display()
                ),
            ));
        }
        if self.run_stats {
            crate::bpf::RunStats::check().map_err(|e| Invalid::new("bpf.run-stats", e))?;
        }
        let btf = &self.kernel.btf_path;
        if !btf.exists() {
            return Err(Invalid::new(
                "kernel.btf-path",
                format!(
                    "kernel BTF not found at {}: bufscope needs a kernel built with \
                     CONFIG_DEBUG_INFO_BTF=y (or a BTF file for this kernel passed with \
                     --kernel.btf-path)",
                    btf.display()
                ),
            ));
        }
        if !btf.is_file() {
            return Err(Invalid::new(
                "kernel.btf-path",
                format!(
                    "--kernel.btf-path {}: {}: name the kernel's BTF file (e.g. \
                     /sys/kernel/btf/vmlinux)",
                    btf.display(),
                    not_a_file(btf)
                ),
            ));
        }
        if crate::kernel::fs_magic(&self.procfs).ok() != Some(PROC_SUPER_MAGIC) {
            return Err(Invalid::new(
                "path.procfs",
                format!(
                    "--path.procfs {}: not a procfs mount (name the host's /proc; in a container \
                     mount it, e.g. a hostPath volume of /proc at /host/proc)",
                    self.procfs.display()
                ),
            ));
        }
        Ok(addrs)
    }
}

/// Why `p` is not a regular file.
fn not_a_file(p: &std::path::Path) -> &'static str {
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => "a directory, not a file",
        Ok(_) => "not a regular file",
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => "permission denied",
        Err(_) => "no such file",
    }
}

/// `--bpf.pin-path` of `run` (absolute, see [`absolute_path`]): a directory on a bpffs, or
/// below /sys/fs/bpf (where bufscope mounts one). Checked before anything is created there.
fn check_pin_path(p: &std::path::Path) -> Result<(), String> {
    let fix = "name a directory on a bpffs, e.g. /sys/fs/bpf/bufscope";
    if p.exists() && !p.is_dir() {
        return Err(format!(
            "--bpf.pin-path {}: not a directory ({fix})",
            p.display()
        ));
    }
    // /sys/fs/bpf itself is where bufscope mounts a bpffs when none is there: refused whether
    // or not it is mounted yet (a fresh node has it as a plain sysfs directory).
    if p == std::path::Path::new(BPFFS) || (p.exists() && crate::bpf::pins::dir::is_mount_root(p)) {
        return Err(format!(
            "--bpf.pin-path {}: the root of a file system, not a directory of its own (name \
             one below it, e.g. {BPFFS}/bufscope)",
            p.display()
        ));
    }
    // The nearest existing directory decides where the pin directory would be created.
    let existing = p.ancestors().find(|a| a.exists()).unwrap_or(p);
    if crate::kernel::fs_magic(existing).ok() != Some(BPF_FS_MAGIC) && !p.starts_with(BPFFS) {
        return Err(format!(
            "--bpf.pin-path {}: not on a bpffs ({fix}, or mount one: `mount -t bpf bpf DIR`)",
            p.display()
        ));
    }
    Ok(())
}

/// `--web.telemetry-path`: an absolute URL path of plain segments (letters, digits and
/// `-._~!$&'()+,;=@`) that is none of the other routes.
pub fn check_telemetry_path(p: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "invalid --web.telemetry-path {p:?}: {why} (e.g. /metrics)"
        ))
    };
    if !p.starts_with('/') {
        return bad("it must start with '/'");
    }
    if let Some(r) = crate::http::ROUTES.iter().find(|r| **r == p) {
        return Err(format!(
            "--web.telemetry-path {r} is taken by bufscope's own {} route: pick another path \
             (e.g. /metrics)",
            if *r == "/" { "status page" } else { r }
        ));
    }
    if let Some(c) = p
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "/-._~!$&'()+,;=@".contains(*c)))
    {
        return bad(&format!(
            "{c:?} is not allowed: use letters, digits, '/' and -._~!$&'()+,;=@"
        ));
    }
    let segments: Vec<&str> = p[1..].split('/').collect();
    let last = segments.len() - 1;
    for (i, seg) in segments.iter().enumerate() {
        if seg.is_empty() && i != last {
            return bad("empty path segment ('//')");
        }
        if *seg == "." || *seg == ".." {
            return bad("'.' and '..' segments are removed by clients");
        }
    }
    Ok(())
}

/// Turns `:9477` / `0.0.0.0:9477` / `[::1]:9477` / `localhost:9477` into socket addresses.
pub fn listen_addrs(s: &str) -> Result<Vec<std::net::SocketAddr>, String> {
    use std::net::ToSocketAddrs as _;
    let full = if s.starts_with(':') {
        format!("[::]{s}")
    } else {
        s.to_string()
    };
    let addrs: Vec<_> = full
        .to_socket_addrs()
        .map_err(|e| {
            format!("invalid --web.listen-address {s:?}: {e} (expected HOST:PORT or :PORT)")
        })?
        .collect();
    if addrs.is_empty() {
        return Err(format!("--web.listen-address {s:?} resolves to no address"));
    }
    Ok(addrs)
}
