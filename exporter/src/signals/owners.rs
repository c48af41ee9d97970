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
use bufscope_common::maps;

use super::{BuildCx, Room, Services, Signal, setsockopt, tcp_state};
use crate::bpf::table::Hash;
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
    /// Entries of the socket-owner map (LRU); the map of new UDP sockets (LRU) gets a
    /// quarter of it.
    #[arg(
        id = "owners_entries",
        long = "owners.map-entries",
        alias = "bpf.owners-map-entries",
        default_value_t = maps::OWNERS.default_entries,
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
        plan.map_entries(maps::OWNERS.name, flags.entries);
        plan.map_entries(
            maps::UDP_SOCKETS.name,
            maps::udp_sockets_entries(flags.entries),
        );
        Ok(())
    }

    /// Provides `OWNERS` when any program that fills it attached, `UDP_SOCKETS` when this
    /// probe's did.
    fn take(
        _setup: (),
        ebpf: &mut Ebpf,
        env: &BuildCx<'_>,
        services: &mut Services,
    ) -> anyhow::Result<Option<Box<dyn Signal>>> {
        if filled(env) {
            services.owners = Some(Hash::take(ebpf, maps::OWNERS)?);
        }
        // Filled by this probe's programs only.
        if env.attached(PROBE.name) {
            services.udp_sockets = Some(Hash::take(ebpf, maps::UDP_SOCKETS)?);
        }
        Ok(None)
    }
}

/// Whether a program that fills `OWNERS` attached: this room's, or the setsockopt and
/// tcp_state programs, which record the owners they see too.
fn filled(env: &BuildCx<'_>) -> bool {
    [PROBE.name, setsockopt::PROBE.name, tcp_state::PROBE.name]
        .iter()
        .any(|p| env.attached(p))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::bpf::ProbeStatus;
    use crate::kernel::DropReasons;
    use crate::signals::testkit::{Bench, gone_inode, me, my_proc, udp_socket};

    fn status(attached: &[&str]) -> Vec<ProbeStatus> {
        crate::signals::PROBES
            .iter()
            .map(|p| ProbeStatus {
                attached: attached.contains(&p.name),
                ..ProbeStatus::off(*p, "", true)
            })
            .collect()
    }

    /// `OWNERS` is provided when any program that fills it attached, not only this room's.
    #[test]
    fn owners_is_taken_when_any_program_fills_it() {
        let reasons = DropReasons::parse_format("");
        for (attached, want) in [
            (&["owners"][..], true),
            (&["tcp_state"][..], true),
            (&["setsockopt"][..], true),
            (&["drops", "autotune"][..], false),
        ] {
            let st = status(attached);
            let cx = BuildCx {
                status: &st,
                reasons: &reasons,
                pins: None,
            };
            assert_eq!(filled(&cx), want, "{attached:?}");
        }
    }

    /// What the room provides: a socket's recorded owner (`OWNERS`) when `/proc` no longer
    /// shows it, the live holder `/proc` shows otherwise, nobody for an unknown one.
    #[test]
    fn owners_answer_whose_socket_it_is() {
        let mut b = Bench::new();
        let closed = gone_inode(20);
        b.owners.set(closed, me());
        assert_eq!(b.attr.lookup_inode(closed), Some(my_proc()));
        assert_eq!(b.attr.lookup_inode(gone_inode(21)), None);
        let (_s, held) = udp_socket();
        b.attr.refresh_holders(&[held].into_iter().collect());
        assert_eq!(b.attr.lookup_inode(held), Some(my_proc()));
        assert_eq!(b.attr.holder_count(held), 1);
    }
}
