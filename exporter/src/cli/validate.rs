//! What clap cannot check about the flags, checked once they are parsed (and merged with
//! `--config.file`) and before anything is loaded: addresses, files and mounts that must
//! exist, a telemetry path no other route has, flags that contradict each other. Each error
//! names its flag ([`Invalid`]).

use super::{GuardArgs, GuardMode, KernelArgs, RunArgs};

impl GuardArgs {
    /// Checks the guard flags that clap cannot.
    pub fn validate(&self) -> Result<(), Invalid> {
        if !self.comm.is_empty() && !self.exclude_comm.is_empty() {
            return Err(Invalid::new(
                "guard.exclude-comm",
                "--guard.comm and --guard.exclude-comm cannot be combined: use one list",
            ));
        }
        for (flag, list) in [
            ("guard.comm", &self.comm),
            ("guard.exclude-comm", &self.exclude_comm),
        ] {
            if let Some(c) = list.iter().find(|c| c.is_empty() || c.len() > 15) {
                return Err(Invalid::new(
                    flag,
                    format!(
                        "invalid comm {c:?} in --{flag}: a process name is 1 to 15 bytes (the \
                         kernel's comm)"
                    ),
                ));
            }
        }
        if let Some(p) = &self.cgroup
            && crate::kernel::fs_magic(p).ok() != Some(CGROUP2_SUPER_MAGIC)
        {
            return Err(Invalid::new(
                "guard.cgroup",
                format!(
                    "--guard.cgroup {}: not a cgroup v2 directory (give one under the cgroup2 \
                     mount, e.g. /sys/fs/cgroup/system.slice)",
                    p.display()
                ),
            ));
        }
        let given = [
            ("guard.cgroup", self.cgroup.is_some()),
            ("guard.comm", !self.comm.is_empty()),
            ("guard.exclude-comm", !self.exclude_comm.is_empty()),
            ("guard.udp-floor", self.udp_floor.is_some()),
            ("guard.raise-sysctl", self.raise_sysctl),
            ("guard.persist", self.persist),
        ];
        if self.mode == GuardMode::Off
            && let Some((flag, _)) = given.iter().find(|(_, set)| *set)
        {
            return Err(Invalid::new(
                flag,
                format!(
                    "--{flag} is a guard flag but --guard.mode is off: add --guard.mode \
                     observe or enforce"
                ),
            ));
        }
        Ok(())
    }
}

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

/// `statfs` magic of cgroup2 (`CGROUP2_SUPER_MAGIC`).
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// `statfs` magic of procfs (`PROC_SUPER_MAGIC`).
const PROC_SUPER_MAGIC: i64 = 0x9fa0;
/// `statfs` magic of bpffs (`BPF_FS_MAGIC`).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// Where bufscope mounts a bpffs when `--bpf.pin-path` is below it and none is mounted.
const BPFFS: &str = "/sys/fs/bpf";

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
        self.guard.validate()?;
        let disabled = |name: &str| self.kernel.disable.iter().any(|d| d == name);
        let guard = crate::signals::guard::PROBE.name;
        if self.guard.mode != GuardMode::Off && disabled(guard) {
            return Err(Invalid::new(
                "probe.disable",
                format!(
                    "--probe.disable {guard} turns off what --guard.mode asks for: remove {guard} \
                     from --probe.disable, or leave --guard.mode off"
                ),
            ));
        }
        let setsockopt = crate::signals::setsockopt::PROBE.name;
        if self.guard.mode == GuardMode::Enforce && disabled(setsockopt) {
            return Err(Invalid::new(
                "probe.disable",
                format!(
                    "--guard.mode enforce needs the setsockopt probe on cgroup/setsockopt: \
                     remove {setsockopt} from --probe.disable"
                ),
            ));
        }
        if self.guard.persist && self.pins.pin_path.is_none() {
            return Err(Invalid::new(
                "guard.persist",
                "--guard.persist keeps the guard attached through pins: add --bpf.pin-path DIR \
                 (e.g. /sys/fs/bpf/bufscope)",
            ));
        }
        if let Some(p) = &self.pins.pin_path {
            check_pin_path(p).map_err(|e| Invalid::new("bpf.pin-path", e))?;
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

/// A flag whose value parsed but cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    /// The flag's long name without `--` (e.g. `web.telemetry-path`): a value that came from
    /// `--config.file` is traced back to its key with it.
    pub flag: &'static str,
    /// What is wrong and the fix, naming the flag.
    pub message: String,
}

impl Invalid {
    fn new(flag: &'static str, message: impl Into<String>) -> Self {
        Self {
            flag,
            message: message.into(),
        }
    }
}
