//! The signals: one room each, and [`the list`](signals!) that registers them. A room owns
//! everything about its signal on the userspace side:
//!
//! - its probe (`Room::PROBE`: which BPF programs, on which hooks) and what the loader must do
//!   for it (`Room::prepare`: globals, map sizes, a cgroup, pinning; `before_attach` and
//!   `after_attach`: maps to fill, programs attached later);
//! - its flags (`Room::Flags`, flattened into `bufscope run` and `bufscope.yaml`);
//! - the maps it takes from the loaded object (`Room::take`) and the decoding of its map
//!   entries or ring-buffer records;
//! - its per-socket state (deltas, rates, last values for advice);
//! - its part of a process's counters (`Room::Part`, one field of [`Parts`]) and the metric
//!   families and status-page columns that part renders to;
//! - the inputs it hands to the advice rules.
//!
//! | room | probe | BPF → userspace | per-process part | metric families |
//! |---|---|---|---|---|
//! | [`drops`] | `drops` | `DROPS` per-CPU hash (socket × reason) | [`drops::ProcDrops`] | `bufscope_socket_drops_total`, `bufscope_netns_drops_total` |
//! | [`setsockopt`] | `setsockopt` | ring buffer, [`SockoptEvent`](bufscope_common::SockoptEvent) | [`setsockopt::ProcSockopt`] | `bufscope_setsockopt{,_clamped,_failed}_total`, `bufscope_rcvbuf_locks_total` |
//! | [`tcp_state`] | `tcp_state` | ring buffer, [`EstablishedEvent`](bufscope_common::EstablishedEvent) | [`tcp_state::ProcTcp`] | `bufscope_tcp_established_total`, `bufscope_tcp_wscale_shrunk_total` |
//! | [`autotune`] | `autotune` | `AUTOTUNE` per-CPU hash (socket) | [`autotune::ProcAutotune`] | `bufscope_tcp_autotune_suppressed_total` |
//! | [`owners`] | `owners` | `OWNERS` hash (socket → process), read by the [`Attributor`](crate::attribution::Attributor) | — | — |
//! | [`netlink`] | `netlink` (procfs: no hook fires per overrun) | `/proc/<pid>/net/netlink` per network namespace | [`netlink::ProcNetlink`] | `bufscope_netlink_overruns_total` |
//! | [`xfrm`] | `xfrm` (procfs: the kernel's per-namespace counters) | `/proc/<pid>/net/xfrm_stat` per network namespace | — | `bufscope_xfrm_errors_total`, `bufscope_xfrm_daemon_info` |
//! | [`wireguard`] | `wireguard` (`tp_btf/consume_skb` with `location`, 6.3+; before, `fentry/consume_skb`) | `WG_SITES` (discard sites from `/proc/kallsyms`), `WG_DROPS` per-CPU hash (namespace × port × reason) | — | `bufscope_wireguard_drops_total`, `bufscope_wireguard_discard_sites`, `bufscope_wireguard_hook_armed`, `bufscope_wireguard_hook_changes_total` |
//! | [`guard`] | `guard` (+ decisions in `cgroup/setsockopt`) | ring buffer, [`GuardEvent`](bufscope_common::GuardEvent) | [`guard::ProcGuard`] | `bufscope_guard_decisions_total` |
//!
//! The collector drives the running rooms through the [`Signal`] trait and the loader reads
//! the [`LoadPlan`] they fill; neither names a room. Adding a signal: see
//! docs/architecture.md.

pub mod autotune;
mod counted;
pub mod drops;
pub mod guard;
pub mod netlink;
#[cfg(test)]
mod object_test;
pub mod owners;
mod room;
pub mod setsockopt;
pub mod tcp_state;
#[cfg(test)]
pub mod testkit;
pub mod wireguard;
pub mod xfrm;

use aya::Ebpf;
use prometheus::proto::MetricFamily;

use crate::bpf::{LoadHooks, LoadPlan, ProbeSpec};
use crate::kernel::KernelBtf;

pub use crate::bpf::Attached;
pub use crate::bpf::{decode, take_map};
pub use room::{
    AdviceCx, BuildCx, CheckLine, GcCx, MapFill, NoFlags, Part, PollCx, RingRoom, Room, Services,
    Signal, ValidateCx, absorb_counts, counters_of, when_attached, who_or_unknown,
};

/// One process's counters, with one part per room.
pub type ProcStats = crate::store::ProcStats<Parts>;
/// The per-process counters of every room.
pub type Store = crate::store::Store<Parts>;
/// One identity's counters as the exposition shows them (its processes summed).
pub type Row = crate::store::Row<Parts>;

/// The rooms, in the order their probes attach and are listed (`bufscope check`, metrics).
/// Each line is `field: Room`: `field` names the room's part of [`Parts`], its flags in
/// [`Flags`] and its setup in [`Setups`].
macro_rules! signals {
    ($($field:ident: $room:ty),* $(,)?) => {
        /// Every probe, in list order.
        pub const PROBES: &[ProbeSpec] = &[$(<$room as Room>::PROBE),*];

        /// Every room's own flags.
        #[derive(clap::Args, Clone, Debug)]
        #[group(skip)]
        pub struct Flags {
            $(
                #[allow(missing_docs)]
                #[command(flatten)]
                pub $field: <$room as Room>::Flags,
            )*
        }

        impl Flags {
            /// Every room checks its flags beyond what clap checks.
            pub fn validate(&self, cx: &ValidateCx<'_>) -> Result<(), crate::values::Invalid> {
                $( <$room as Room>::validate(&self.$field, cx)?; )*
                Ok(())
            }
        }

        /// One part per room of a process's counters.
        #[derive(Clone, Debug, Default)]
        pub struct Parts {
            $(
                #[allow(missing_docs)]
                pub $field: <$room as Room>::Part,
            )*
        }

        impl crate::store::Parts for Parts {
            fn absorb(&mut self, o: &Self) {
                $( Part::absorb(&mut self.$field, &o.$field); )*
            }

            fn has_counts(&self) -> bool {
                false $( || Part::has_counts(&self.$field) )*
            }

            fn after_exec(&self) -> Self {
                Self { $( $field: Part::after_exec(&self.$field), )* }
            }
        }

        impl Parts {
            /// Every room's columns of one process's row on the status page.
            pub fn status(&self, row: &mut bufscope_api::ProcessRow) {
                $( Part::status(&self.$field, row); )*
            }

            /// Every room's counters built from events ([`Part::totals`]).
            pub fn totals(&self) -> Vec<crate::totals::Total> {
                let mut out = Vec::new();
                $( Part::totals(&self.$field, &mut out); )*
                out
            }

            /// Gives a counter kept across a restart back to the room it belongs to.
            pub fn restore(&mut self, t: &crate::totals::Total) {
                $( Part::restore(&mut self.$field, t); )*
            }

            /// Every room's every counter ([`Part::counters`]).
            pub fn counters(&self) -> Vec<crate::totals::Total> {
                let mut out = Vec::new();
                $( Part::counters(&self.$field, &mut out); )*
                out
            }

            /// Gives a counter of [`Parts::counters`] back to the room it belongs to.
            pub fn restore_counter(&mut self, t: &crate::totals::Total) {
                $( Part::restore_counter(&mut self.$field, t); )*
            }
        }

        /// What each room resolved from its flags before loading.
        pub struct Setups {
            $( $field: <$room as Room>::Setup, )*
        }

        /// Every room prepares the load (see [`Room::prepare`]).
        pub fn prepare(flags: &Flags, plan: &mut LoadPlan) -> anyhow::Result<Setups> {
            Ok(Setups { $( $field: <$room as Room>::prepare(&flags.$field, plan)?, )* })
        }

        impl LoadHooks for Setups {
            fn before_attach(&mut self, ebpf: &mut Ebpf) -> anyhow::Result<()> {
                $( <$room as Room>::before_attach(&mut self.$field, ebpf)?; )*
                Ok(())
            }

            fn after_attach(&mut self, ebpf: &mut Ebpf, cx: &Attached<'_>) -> anyhow::Result<()> {
                $( <$room as Room>::after_attach(&mut self.$field, ebpf, cx)?; )*
                Ok(())
            }
        }

        impl Setups {
            /// The running rooms (those whose probe attached) and the services they provide.
            pub fn build(self, ebpf: &mut Ebpf, env: &BuildCx<'_>) -> anyhow::Result<Built> {
                let mut services = Services::default();
                let mut rooms: Vec<Box<dyn Signal>> = Vec::new();
                $(
                    if let Some(r) = <$room as Room>::take(self.$field, ebpf, env, &mut services)? {
                        rooms.push(r);
                    }
                )*
                Ok(Built { rooms, services })
            }
        }

        /// Every room's lines in `bufscope check`.
        pub fn checks(kernel: &KernelBtf) -> Vec<CheckLine> {
            let mut out = Vec::new();
            $( out.extend(<$room as Room>::check(kernel)); )*
            out
        }
    };
}

signals! {
    drops: drops::Drops,
    setsockopt: setsockopt::Setsockopt,
    tcp_state: tcp_state::TcpState,
    autotune: autotune::Autotune,
    owners: owners::Owners,
    guard: guard::Guard,
    netlink: netlink::Netlink,
    xfrm: xfrm::Xfrm,
    wireguard: wireguard::Wireguard,
}

/// The running rooms and what they provide.
pub struct Built {
    /// The rooms whose probe attached, in list order.
    pub rooms: Vec<Box<dyn Signal>>,
    /// Shared services.
    pub services: Services,
}

impl Flags {
    /// Every room's flags at their defaults (`bufscope check` loads with them).
    pub fn defaults() -> anyhow::Result<Self> {
        use clap::{Args as _, FromArgMatches as _};
        let cmd = Self::augment_args(clap::Command::new("bufscope"));
        let m = cmd.try_get_matches_from(["bufscope"])?;
        Ok(Self::from_arg_matches(&m)?)
    }
}

/// Probes whose events are attributed to processes (the `probe` label of
/// `bufscope_attribution_unknown_total`).
pub fn attributed() -> impl Iterator<Item = &'static str> {
    PROBES.iter().filter(|p| p.attributed).map(|p| p.name)
}

/// Every running room's metric families, in list order.
pub fn families(rooms: &[Box<dyn Signal>], procs: &[Row]) -> Vec<MetricFamily> {
    let mut out = Vec::new();
    for r in rooms {
        r.families(procs, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_room_registers_a_distinct_probe() {
        let mut names: Vec<&str> = PROBES.iter().map(|p| p.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), PROBES.len());
        assert!(PROBES.len() <= crate::bpf::pins::MAX_PROBES);
        assert!(PROBES.iter().all(|p| !p.variants.is_empty()));
    }

    #[test]
    fn flag_defaults_parse() {
        Flags::defaults().unwrap();
    }

    /// What a room hands to `TOTALS` comes back whole after a restart, and each counter
    /// lands in its own room only.
    #[test]
    fn event_counters_survive_a_round_trip_through_totals() {
        use crate::labels::{BufOption, Proto};
        let mut p = Parts::default();
        let c = p
            .setsockopt
            .calls
            .entry((Proto::Udp, BufOption::RcvbufForce))
            .or_default();
        c.calls = 7;
        c.clamped = 2;
        c.failed = 3;
        p.setsockopt
            .calls
            .entry((Proto::Tcp, BufOption::BufLock))
            .or_default()
            .calls = 1;
        p.setsockopt.rcvbuf_locks.insert(Proto::Tcp, 4);
        p.tcp_state.established = 9;
        p.tcp_state.wscale_shrunk = 5;
        p.autotune.suppressed = 11;
        p.autotune.retired = 6;
        // Not kept there: read back from the pinned DROPS map.
        p.drops.add(Proto::Udp, "SOCKET_RCVBUFF", 100);
        let kept = p.totals();
        let mut back = Parts::default();
        for t in &kept {
            back.restore(t);
        }
        assert_eq!(back.setsockopt.calls, p.setsockopt.calls);
        assert_eq!(back.setsockopt.rcvbuf_locks, p.setsockopt.rcvbuf_locks);
        assert_eq!(
            (back.tcp_state.established, back.tcp_state.wscale_shrunk),
            (9, 5)
        );
        assert_eq!(
            (back.autotune.suppressed, back.autotune.retired),
            (6, 6),
            "only the closed sockets' part: the live ones are in AUTOTUNE"
        );
        assert!(back.drops.packets.is_empty(), "drops go on from DROPS");
        let mut keys: Vec<_> = kept.iter().map(|t| (t.family, t.proto, t.option)).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), kept.len(), "one entry per counter");
    }
}
