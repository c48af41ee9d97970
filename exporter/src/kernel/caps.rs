//! Capability checks, so a missing privilege is a one-line error that names it.

/// A Linux capability bufscope may need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap {
    /// Capability number.
    pub bit: u32,
    /// Name (`CAP_BPF`).
    pub name: &'static str,
    /// What bufscope uses it for.
    pub why: &'static str,
}

/// CAP_BPF: create maps, load programs.
pub const CAP_BPF: Cap = Cap {
    bit: 39,
    name: "CAP_BPF",
    why: "load BPF programs and create maps",
};
/// CAP_PERFMON: tracing programs (tracepoints, tp_btf) and reading kernel memory from them.
pub const CAP_PERFMON: Cap = Cap {
    bit: 38,
    name: "CAP_PERFMON",
    why: "attach tracepoint/tp_btf programs and read kernel memory from them",
};
/// CAP_SYS_PTRACE: read `/proc/<pid>/fd` of other users' processes (socket → process).
pub const CAP_SYS_PTRACE: Cap = Cap {
    bit: 19,
    name: "CAP_SYS_PTRACE",
    why: "read /proc/<pid>/fd of other users' processes to attribute sockets created before bufscope started",
};
/// CAP_SYS_ADMIN: covers CAP_BPF + CAP_PERFMON on kernels before 5.8; mounting tracefs.
pub const CAP_SYS_ADMIN: Cap = Cap {
    bit: 21,
    name: "CAP_SYS_ADMIN",
    why: "mount tracefs when it is not mounted (and stands in for CAP_BPF/CAP_PERFMON before 5.8)",
};
/// CAP_NET_ADMIN: load cgroup socket programs (cgroup/setsockopt, cgroup/sock_create, the
/// guard's bind/connect/sendmsg hooks); `--guard.raise-sysctl`.
pub const CAP_NET_ADMIN: Cap = Cap {
    bit: 12,
    name: "CAP_NET_ADMIN",
    why: "load cgroup socket programs (setsockopt and owners without a syscall tax; the guard)",
};
/// CAP_DAC_READ_SEARCH: list `/proc/<pid>/fd` directories owned by other users.
pub const CAP_DAC_READ_SEARCH: Cap = Cap {
    bit: 2,
    name: "CAP_DAC_READ_SEARCH",
    why: "list /proc/<pid>/fd directories of processes running as other users",
};

/// The effective capability set of this process (`CapEff` in `/proc/self/status`).
pub fn effective() -> u64 {
    // Read lossily: the `Name:` line is this process's comm, any bytes.
    super::read_lossy("/proc/self/status")
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// True when `cap` is in the effective set.
pub fn has(cap: Cap) -> bool {
    effective() & (1u64 << cap.bit) != 0
}

/// The capabilities required to load and attach the probes that are missing, if any.
/// CAP_SYS_ADMIN satisfies both on any kernel.
pub fn missing_for_probes() -> Vec<Cap> {
    if has(CAP_SYS_ADMIN) {
        return Vec::new();
    }
    [CAP_BPF, CAP_PERFMON]
        .into_iter()
        .filter(|c| !has(*c))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_effective_set() {
        // Whatever we run as, the value must agree with the kernel's own view in /proc.
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let line = status
            .lines()
            .find(|l| l.starts_with("CapEff:"))
            .unwrap_or("");
        assert_eq!(format!("CapEff:\t{:016x}", effective()), line);
    }
}
