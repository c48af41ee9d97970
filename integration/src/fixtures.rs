//! Workloads and kernel settings that several integration tests set up the same way.
//!
//! Like the rest of the test library, these panic with a message instead of returning errors.

use crate::Workload;

/// `setpriv` arguments that drop CAP_NET_ADMIN from the bounding and inheritable sets, for
/// [`Workload::start_wrapped`]: a root process that may no longer use `SO_RCVBUFFORCE`.
pub const WITHOUT_CAP_NET_ADMIN: [&str; 6] = [
    "setpriv",
    "--bounding-set",
    "-net_admin",
    "--inh-caps",
    "-net_admin",
    "--",
];

/// `setpriv` arguments that run the command as `nobody` (uid and gid 65534, no supplementary
/// groups), for [`Workload::start_wrapped`]: a process of another user, whose sockets only
/// `/proc/<pid>/fd` can attribute.
pub const AS_NOBODY: [&str; 5] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--",
];

/// `bufscope-workload setsockopt`: one `setsockopt(opt, value)` call on a new `proto` (`udp` or
/// `tcp`) socket. Its READY line carries the call's `errno` and the kernel's readbacks
/// (`rcvbuf`, `locks`, …).
pub fn setsockopt(proto: &str, opt: &str, value: &str) -> Workload {
    Workload::start(&setsockopt_args(proto, opt, value))
}

/// [`setsockopt`] through a wrapper (e.g. [`WITHOUT_CAP_NET_ADMIN`], or `setpriv --reuid …`).
pub fn setsockopt_wrapped(wrapper: &[&str], proto: &str, opt: &str, value: &str) -> Workload {
    Workload::start_wrapped(wrapper, &setsockopt_args(proto, opt, value))
}

fn setsockopt_args<'a>(proto: &'a str, opt: &'a str, value: &'a str) -> [&'a str; 7] {
    [
        "setsockopt",
        "--proto",
        proto,
        "--opt",
        opt,
        "--value",
        value,
    ]
}

/// `net.core.rmem_max`: the most `SO_RCVBUF` may ask for before the kernel clamps it.
pub fn rmem_max() -> i64 {
    let path = "/proc/sys/net/core/rmem_max";
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path}: {text:?} is not a number: {e}"))
}
