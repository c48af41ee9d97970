//! The drops probe: its hooks, best first, the room's flags, and what a kernel's choice costs
//! per received datagram (`bufscope check`).

use std::time::Duration;

use bufscope_common::maps;

use super::CheckLine;
use crate::bpf::{BtfNeed, Hook, ProbeSpec};
use crate::kernel::KernelBtf;

/// `kfree_skb` with its 4th argument, `rx_sk` (6.11+): every drop names its socket.
const RX_SK: &[BtfNeed] = &[BtfNeed::Args(4)];
/// `kfree_skb` with a drop reason (5.17+), used without `rx_sk`.
const REASON: &[BtfNeed] = &[BtfNeed::Args(3)];
/// `udp_fail_queue_rcv_skb` that the kernel also fires for IPv6 (the tracepoint gained a
/// `family` field with the IPv6 call; Debian's 6.1 has neither).
const UDP_FAIL_V6: &[BtfNeed] = &[BtfNeed::Member {
    strukt: "trace_event_raw_udp_fail_queue_rcv_skb",
    member: "family",
    why: "the kernel fires it for IPv4 only",
}];

/// Drops of everything the UDP hook beside it does not count: by the owning socket when the
/// skb has one, else per network namespace (IPv4 and IPv6 UDP queue drops are left to the
/// UDP hook).
const KFREE_SKB_NOKS: Hook = Hook::BtfTracepointWhere {
    prog: "kfree_skb_noks",
    name: "kfree_skb",
    needs: REASON,
};

/// The probe: the best variant the kernel's BTF (and the kernel's refusals) allow.
///
/// | variant | socket known for | kernels |
/// |---|---|---|
/// | `tp_btf/kfree_skb` (`rx_sk`) | every drop | 6.11+ |
/// | `tp_btf/udp_fail_queue_rcv_skb` + `tp_btf/kfree_skb` | UDP v4+v6; skbs a socket owns | `udp_fail` with `family`, no `rx_sk` |
/// | `fexit/__udp_enqueue_schedule_skb` + `tp_btf/kfree_skb` | UDP v4+v6; skbs a socket owns | fexit allowed (e.g. Debian 6.1) |
/// | `tp_btf/udp_fail_queue_rcv_skb` + `tp_btf/kfree_skb` | UDP v4; skbs a socket owns | 5.17+ |
/// | `fexit/__udp_enqueue_schedule_skb` | UDP v4+v6 only | no drop reasons (before 5.17) |
/// | `tp_btf/udp_fail_queue_rcv_skb` | UDP v4 only | no drop reasons, no fexit |
///
/// Without `rx_sk`, a drop of an skb no socket owns yet (TCP's receive-queue drops, IPv6 UDP
/// where only IPv4 is hooked) is counted per network namespace and reason
/// (`bufscope_netns_drops_total`).
pub const PROBE: ProbeSpec = ProbeSpec {
    name: "drops",
    what: "buffer-full drops by kernel drop reason, per socket",
    variants: &[
        &[Hook::BtfTracepointWhere {
            prog: "kfree_skb",
            name: "kfree_skb",
            needs: RX_SK,
        }],
        &[
            Hook::BtfTracepointWhere {
                prog: "udp_fail_queue_rcv_skb",
                name: "udp_fail_queue_rcv_skb",
                needs: UDP_FAIL_V6,
            },
            KFREE_SKB_NOKS,
        ],
        &[
            Hook::Fexit {
                prog: "udp_enqueue_exit",
                func: "__udp_enqueue_schedule_skb",
            },
            KFREE_SKB_NOKS,
        ],
        &[
            Hook::BtfTracepoint {
                prog: "udp_fail_queue_rcv_skb",
                name: "udp_fail_queue_rcv_skb",
            },
            Hook::BtfTracepointWhere {
                prog: "kfree_skb_noks_v4",
                name: "kfree_skb",
                needs: REASON,
            },
        ],
        // No drop reasons (before 5.17): UDP queue drops only, no kfree_skb.
        &[Hook::Fexit {
            prog: "udp_enqueue_exit",
            func: "__udp_enqueue_schedule_skb",
        }],
        &[Hook::BtfTracepoint {
            prog: "udp_fail_queue_rcv_skb",
            name: "udp_fail_queue_rcv_skb",
        }],
    ],
    is_drop_probe: true,
    attributed: true,
};

/// The drops room's own flags.
#[derive(clap::Args, Clone, Debug)]
#[group(skip)]
pub struct Flags {
    /// Entries of the per-socket drop map.
    #[arg(
        id = "drops_entries",
        long = "drops.map-entries",
        alias = "bpf.drops-map-entries",
        default_value_t = maps::DROPS.default_entries,
        value_name = "N",
        value_parser = crate::values::at_least_one::<u32>
    )]
    pub entries: u32,
    /// How long drops of a socket whose owner is not found yet are held before they are
    /// counted under `comm="_unknown"`.
    #[arg(
        id = "attribution_hold",
        long = "drops.attribution-hold",
        alias = "attribution.hold",
        default_value = "10s",
        value_parser = crate::values::parse_duration,
        value_name = "DURATION"
    )]
    pub hold: Duration,
    /// Never attach a drops hook that runs for every received datagram
    /// (`fexit/__udp_enqueue_schedule_skb`, chosen where the kernel has neither `kfree_skb`'s
    /// `rx_sk` (6.11+) nor an IPv6 `udp_fail_queue_rcv_skb` (≈6.4+), e.g. Debian 12's 6.1):
    /// IPv6 UDP buffer-full drops are then counted per network namespace
    /// (`bufscope_netns_drops_total`, kernels with drop reasons, 5.17+) instead of per process,
    /// and not at all before 5.17. `bufscope check` says whether this kernel needs it.
    #[arg(id = "drops_zero_per_packet", long = "drops.zero-per-packet")]
    pub zero_per_packet: bool,
}

/// Whether variant `v` of [`PROBE`] has a hook that runs for every received UDP datagram (the
/// fexit on the UDP enqueue; every other drops hook runs only when something is dropped).
pub(super) fn per_packet(v: usize) -> bool {
    PROBE
        .variants
        .get(v)
        .is_some_and(|hooks| hooks.iter().any(|h| matches!(h, Hook::Fexit { .. })))
}

/// What the drops probe costs per received datagram on `kernel`, and the trade-off of
/// `--drops.zero-per-packet`.
pub(super) fn per_packet_line(kernel: &KernelBtf) -> CheckLine {
    let first_usable = PROBE
        .variants
        .iter()
        .position(|hooks| crate::bpf::usable(hooks, kernel).is_ok());
    let detail = match first_usable {
        Some(v) if per_packet(v) => {
            let without = if kernel_has_reasons(kernel) {
                "are counted per network namespace (bufscope_netns_drops_total)"
            } else {
                "are not counted at all (no drop reasons before 5.17)"
            };
            format!(
                "fexit/__udp_enqueue_schedule_skb runs for every received UDP datagram: the \
                 price of IPv6 UDP drops per process on this kernel; with \
                 --drops.zero-per-packet they {without}"
            )
        }
        Some(_) => "none: drops are seen when they happen, nothing runs per datagram".into(),
        None => "no variant of the drops probe is usable".into(),
    };
    CheckLine {
        ok: true,
        what: "per-packet cost",
        detail,
    }
}

/// Whether `kfree_skb` carries a drop reason on this kernel (5.17+).
fn kernel_has_reasons(kernel: &KernelBtf) -> bool {
    crate::bpf::usable(&[KFREE_SKB_NOKS], kernel).is_ok()
}
