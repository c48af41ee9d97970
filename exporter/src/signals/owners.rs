//! Socket owners: which process created or accepted each socket.
//!
//! Probe: `sys_exit_socket`, `sys_exit_accept` and `sys_exit_accept4` record, in process
//! context, socket inode → (pid, start time) in `OWNERS` (LRU). The setsockopt and tcp_state
//! programs add the owners they see too. This room has no counters of its own: it hands the
//! map to the shared [`Attributor`](crate::attribution::Attributor), which every other room
//! asks "whose socket is this".

use aya::Ebpf;
use aya::maps::{HashMap as BpfHashMap, MapData};
use bufscope_common::Owner;

use super::{BuildEnv, setsockopt, take_map, tcp_state};
use crate::probes::{Hook, ProbeSpec};

/// The probe.
pub const PROBE: ProbeSpec = ProbeSpec {
    name: "owners",
    what: "which process created or accepted each socket",
    variants: &[
        // Runs only when an inet socket is created: no cost to any other syscall. Accepted
        // sockets are not created this way: they are attributed to their listener's owner
        // (tcp_state) or found in /proc when they drop.
        &[Hook::CgroupSockCreate {
            prog: "cgroup_sock_create",
        }],
        // Without cgroup2: the syscall tracepoints (every syscall pays while attached).
        &[
            Hook::Tracepoint {
                prog: "sys_exit_new_socket",
                category: "syscalls",
                name: "sys_exit_socket",
            },
            Hook::Tracepoint {
                prog: "sys_exit_new_socket",
                category: "syscalls",
                name: "sys_exit_accept",
            },
            Hook::Tracepoint {
                prog: "sys_exit_new_socket",
                category: "syscalls",
                name: "sys_exit_accept4",
            },
        ],
    ],
    is_drop_probe: false,
};

/// The `OWNERS` map, when any program that fills it attached.
pub fn take(
    ebpf: &mut Ebpf,
    env: &BuildEnv<'_>,
) -> anyhow::Result<Option<BpfHashMap<MapData, u64, Owner>>> {
    let filled = [PROBE.name, setsockopt::PROBE.name, tcp_state::PROBE.name]
        .iter()
        .any(|p| env.attached(p));
    if !filled {
        return Ok(None);
    }
    take_map(ebpf, "OWNERS").map(Some)
}
