//! Socket owners: which process created or accepted each socket.
//!
//! Probe: `cgroup/sock_create` (fallback: `sys_exit_socket`, `sys_exit_accept` and
//! `sys_exit_accept4`) records, in process context, socket inode → (pid, start time) in
//! `OWNERS` (LRU), and the inode of each UDP socket in `UDP_SOCKETS` (LRU: which new sockets
//! can have UDP buffer drops). The setsockopt and tcp_state programs add the owners they see
//! too. This room
//! has no counters of its own: it hands the map to the shared
//! [`Attributor`](crate::attribution::Attributor), which every other room asks "whose socket is
//! this".

use aya::Ebpf;

use super::{BuildEnv, Room, Services, Signal, setsockopt, take_map, tcp_state};
use crate::bpf::{Hook, LoadPlan, ProbeSpec};

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
    attributed: false,
};

/// The owners room's own flags.
#[derive(clap::Args, Clone, Debug)]
#[group(skip)]
pub struct Flags {
    /// Entries of the socket-owner map (LRU).
    #[arg(
        id = "owners_entries",
        long = "bpf.owners-map-entries",
        default_value_t = 65536,
        value_name = "N",
        value_parser = crate::values::at_least_one::<u32>
    )]
    pub entries: u32,
}

/// The owners room: it runs nothing; it provides `OWNERS` and `UDP_SOCKETS` to the
/// attribution service.
pub struct Owners;

impl Room for Owners {
    const PROBE: ProbeSpec = PROBE;
    type Part = ();
    type Flags = Flags;
    type Setup = ();

    fn prepare(flags: &Flags, plan: &mut LoadPlan) -> anyhow::Result<()> {
        plan.map_entries("OWNERS", flags.entries);
        Ok(())
    }

    /// Provides `OWNERS` when any program that fills it attached.
    fn take(
        _setup: (),
        ebpf: &mut Ebpf,
        env: &BuildEnv<'_>,
        services: &mut Services,
    ) -> anyhow::Result<Option<Box<dyn Signal>>> {
        let filled = [PROBE.name, setsockopt::PROBE.name, tcp_state::PROBE.name]
            .iter()
            .any(|p| env.attached(p));
        if filled {
            services.owners = Some(take_map(ebpf, "OWNERS")?);
        }
        // Filled by this probe's programs only.
        if env.attached(PROBE.name) {
            services.udp_sockets = Some(take_map(ebpf, "UDP_SOCKETS")?);
        }
        Ok(None)
    }
}
