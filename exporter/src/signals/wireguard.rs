//! Kernel WireGuard's queue drops. Kernel WireGuard (wg-quick gateways, Calico's and Cilium's
//! node encryption, netbird, kilo) receives through a UDP encapsulation hook, so its socket
//! never queues; when a peer's receive queue, the device's decrypt ring or its handshake
//! queue is full it frees the packet with `dev_kfree_skb()` = `consume_skb()`: no
//! `kfree_skb` event, no drop reason, no device counter (`ip -s link` shows nothing).
//!
//! Probe: `tp_btf/consume_skb`, whose `location` (the caller's return address, 6.3+) the
//! program compares with the module's discard sites — `wg_packet_receive` (and `wg_receive`,
//! where its tail-called frees return), `wg_packet_rx_poll` — which this room resolves from
//! `/proc/kallsyms` whenever the module is (re)loaded and writes into `WG_SITES`. The skb
//! says why (`WgKey::reason`: a full per-peer queue, a full handshake queue, a packet queued
//! dead because the decrypt ring was full, …) and where (the outer namespace and the
//! device's UDP listen port).
//!
//! `consume_skb` runs for every packet the kernel consumes (every UDP datagram read, for
//! one), so `--wireguard.queue-drops auto` (the default) attaches it only where the
//! `wireguard` module is loaded at start. Before 6.3 `consume_skb` has no `location`: no
//! tracepoint tells these frees from the ordinary ones, and `bufscope check` says so.

use std::collections::BTreeMap;
use std::path::Path;

use bufscope_common::{WgKey, WgSites, maps, wg_reason};
use clap::ValueEnum;
use prometheus::proto::MetricFamily;

use super::{BuildCx, CheckLine, PollCx, Room, Services, Signal};
use crate::bpf::table::{PerCpuHash, Slots};
use crate::bpf::{BtfNeed, Hook, LoadPlan, PerCpuTable, ProbeSpec, Table};
use crate::exposition::Spec;
use crate::kernel::KernelBtf;

/// `consume_skb` with its 2nd argument, `location` (6.3+).
const LOCATION: &[BtfNeed] = &[BtfNeed::Args(2)];

/// The probe: one variant (before 6.3 no tracepoint can tell these frees apart).
pub const PROBE: ProbeSpec = ProbeSpec {
    name: "wireguard",
    what: "kernel WireGuard's queue drops (full per-peer, decrypt and handshake queues), per namespace, listen port and reason",
    variants: &[&[Hook::BtfTracepointWhere {
        prog: "wg_consume_skb",
        name: "consume_skb",
        needs: LOCATION,
    }]],
    is_drop_probe: false,
    attributed: false,
};

/// `--wireguard.queue-drops`.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueDrops {
    /// Attach where the `wireguard` module is loaded (or built in) when bufscope starts.
    #[default]
    Auto,
    /// Attach wherever the kernel allows (the hook runs for every consumed packet).
    On,
    /// Never attach.
    Off,
}

/// The kernel-WireGuard room's flags.
#[derive(clap::Args, Clone, Debug)]
#[group(skip)]
pub struct Flags {
    /// auto (attach `tp_btf/consume_skb` where the wireguard module is loaded at start) | on |
    /// off. The hook runs for every packet the kernel consumes (measured on 6.18: a reading
    /// UDP receiver at 95-97% of its rate without it); it counts only those kernel WireGuard
    /// discards.
    #[arg(long = "wireguard.queue-drops", value_enum, default_value_t = QueueDrops::Auto)]
    pub queue_drops: QueueDrops,
}

const DROPS: Spec = Spec::counter(
    "bufscope_wireguard_drops_total",
    "Packets kernel WireGuard discarded (consume_skb at its discard sites: no kernel counter), by the outer network namespace, the device's UDP listen port and reason.",
    &["netns", "port", "reason"],
);

const SITES: Spec = Spec::gauge(
    "bufscope_wireguard_discard_sites",
    "Discard sites of the wireguard module resolved from /proc/kallsyms (3 when loaded and resolved; 0: the module is not loaded, or kallsyms hides addresses).",
    &[],
);

/// The label of a [`wg_reason`].
pub fn reason_name(r: u16) -> &'static str {
    match r {
        wg_reason::PEER_QUEUE_FULL => "peer_queue_full",
        wg_reason::HANDSHAKE_QUEUE_FULL => "handshake_queue_full",
        wg_reason::UNKNOWN_SESSION => "unknown_session",
        wg_reason::MALFORMED => "malformed",
        wg_reason::DECRYPT_RING_FULL => "decrypt_ring_full",
        wg_reason::REPLAYED_OR_INVALID => "replayed_or_invalid",
        _ => "other",
    }
}

/// Whether the `wireguard` module is loaded (or built in).
fn module_present() -> bool {
    Path::new("/sys/module/wireguard").exists()
}

/// What identifies the loaded module: its text address (a reload moves it), "builtin", or
/// None when it is not there.
fn module_identity() -> Option<String> {
    if !module_present() {
        return None;
    }
    Some(
        std::fs::read_to_string("/sys/module/wireguard/sections/.text")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "builtin".into()),
    )
}

/// The discard sites in `kallsyms` (its text): each function's `[start, next symbol)`.
/// Errors name what is missing.
pub fn resolve_sites(kallsyms: &str) -> Result<WgSites, String> {
    let wanted = ["wg_packet_receive", "wg_receive", "wg_packet_rx_poll"];
    let mut starts = [0u64; 3];
    let mut text: Vec<u64> = Vec::new();
    for l in kallsyms.lines() {
        let mut f = l.split_whitespace();
        let (Some(a), Some(t), Some(name)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if !matches!(t, "t" | "T") {
            continue;
        }
        let Ok(addr) = u64::from_str_radix(a, 16) else {
            continue;
        };
        text.push(addr);
        if let Some(i) = wanted.iter().position(|w| *w == name) {
            starts[i] = addr;
        }
    }
    if let Some(i) = starts.iter().position(|s| *s == 0) {
        return Err(format!(
            "{} not in /proc/kallsyms (addresses hidden: kptr_restrict, or no CAP_SYSLOG?)",
            wanted[i]
        ));
    }
    text.sort_unstable();
    let range = |s: u64| -> Result<[u64; 2], String> {
        let i = text.partition_point(|a| *a <= s);
        text.get(i)
            .map(|e| [s, *e])
            .ok_or_else(|| format!("no symbol after {s:#x} in /proc/kallsyms"))
    };
    Ok(WgSites {
        receive: range(starts[0])?,
        socket_receive: range(starts[1])?,
        rx_poll: range(starts[2])?,
    })
}

/// The kernel-WireGuard room.
pub struct Wireguard {
    sites: Box<dyn Table<u32, WgSites>>,
    drops: PerCpuTable<WgKey, u64>,
    /// The module identity the sites were resolved for.
    resolved_for: Option<String>,
    /// How many sites are resolved (0 or 3).
    resolved: usize,
    /// The counts at the last read (the map is cumulative; bufscope's start is zero).
    counts: BTreeMap<WgKey, u64>,
}

impl Room for Wireguard {
    const PROBE: ProbeSpec = PROBE;
    type Part = ();
    type Flags = Flags;
    type Setup = ();

    fn prepare(flags: &Flags, plan: &mut LoadPlan) -> anyhow::Result<()> {
        // The sites are addresses of this boot's module load: nothing to keep across a restart.
        plan.unpinned(PROBE.name);
        // `bufscope check` loads it wherever it could run, to say whether it would attach.
        if plan.purpose == crate::bpf::Purpose::Check {
            return Ok(());
        }
        match flags.queue_drops {
            QueueDrops::On => {}
            QueueDrops::Off => {
                plan.leave_off(PROBE.name, "off (--wireguard.queue-drops off)");
            }
            QueueDrops::Auto if !module_present() => {
                plan.leave_off(
                    PROBE.name,
                    "off (no wireguard module loaded at start; --wireguard.queue-drops auto: on attaches anyway)",
                );
            }
            QueueDrops::Auto => {}
        }
        Ok(())
    }

    fn check(kernel: &KernelBtf) -> Vec<CheckLine> {
        let ok = kernel
            .btf_tracepoint_args("consume_skb")
            .is_some_and(|n| n >= 2);
        vec![CheckLine {
            ok,
            what: "kernel wireguard drops",
            detail: if ok {
                "consume_skb carries location: kernel WireGuard's discards (full per-peer, \
                 decrypt and handshake queues) are counted at the module's discard sites"
                    .into()
            } else {
                "consume_skb has no location on this kernel (added in 6.3): kernel WireGuard's \
                 queue drops cannot be told from the packets it consumes; none are counted"
                    .into()
            },
        }]
    }

    fn take(
        _setup: (),
        ebpf: &mut aya::Ebpf,
        env: &BuildCx<'_>,
        _services: &mut Services,
    ) -> anyhow::Result<Option<Box<dyn Signal>>> {
        if !env.attached(PROBE.name) {
            return Ok(None);
        }
        let mut room = Self {
            sites: Slots::take(ebpf, maps::WG_SITES)?,
            drops: PerCpuHash::take(ebpf, maps::WG_DROPS)?,
            resolved_for: None,
            resolved: 0,
            counts: BTreeMap::new(),
        };
        room.refresh_sites();
        Ok(Some(Box::new(room)))
    }
}

impl Wireguard {
    /// Resolves the discard sites again when the module appeared, went or was reloaded.
    fn refresh_sites(&mut self) {
        // Once per module load: a failed resolution (hidden addresses) is not retried on
        // every poll (kallsyms is megabytes), only when the module changes.
        let id = module_identity();
        if id == self.resolved_for {
            return;
        }
        let sites = match &id {
            None => Ok(WgSites::default()),
            Some(_) => crate::kernel::read_lossy("/proc/kallsyms")
                .ok_or_else(|| "/proc/kallsyms unreadable".to_string())
                .and_then(|t| resolve_sites(&t)),
        };
        let sites = match sites {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(
                    "kernel WireGuard's discard sites not resolved ({e}): its drops are not counted"
                );
                // No stale ranges of an earlier load.
                if let Err(e) = self.sites.insert(0, WgSites::default()) {
                    tracing::warn!("{e:#}");
                }
                self.resolved_for = id;
                self.resolved = 0;
                return;
            }
        };
        match self.sites.insert(0, sites) {
            Ok(()) => {
                self.resolved = if id.is_some() { 3 } else { 0 };
                if id.is_some() {
                    tracing::info!(
                        "kernel WireGuard's discard sites resolved (wg_packet_receive {:#x}, wg_packet_rx_poll {:#x})",
                        sites.receive[0],
                        sites.rx_poll[0]
                    );
                }
            }
            Err(e) => {
                tracing::warn!("{e:#}");
                self.resolved = 0;
            }
        }
        self.resolved_for = id;
    }
}

impl Signal for Wireguard {
    fn name(&self) -> &'static str {
        PROBE.name
    }

    fn poll(&mut self, _cx: &mut PollCx<'_>) -> bool {
        self.refresh_sites();
        let mut moved = false;
        for (k, per_cpu) in self.drops.entries() {
            let v: u64 = per_cpu.iter().sum();
            let old = self.counts.insert(k, v);
            moved |= old != Some(v);
        }
        moved
    }

    fn families(&self, _procs: &[super::Row], out: &mut Vec<MetricFamily>) {
        let mut f = DROPS.family();
        for (k, v) in &self.counts {
            f.push(
                &[
                    &k.netns.to_string(),
                    &k.port.to_string(),
                    reason_name(k.reason),
                ],
                *v as f64,
            );
        }
        f.done(out);
        let mut f = SITES.family();
        f.push(&[], self.resolved as f64);
        f.done(out);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::bpf::fake::FakeTable;

    const KALLSYMS: &str = "\
ffffffffc0a00000 t wg_xmit\t[wireguard]
ffffffffc0a07700 t wg_packet_receive\t[wireguard]
ffffffffc0a07e80 t wg_packet_decrypt_worker\t[wireguard]
ffffffffc0a06c80 T wg_packet_rx_poll\t[wireguard]
ffffffffc0a07100 t wg_packet_handshake_receive_worker\t[wireguard]
ffffffffc0a08540 t wg_receive\t[wireguard]
ffffffffc0a08600 t wg_socket_send_skb_to_peer\t[wireguard]
ffffffffc0a20000 d wg_netdev_ops\t[wireguard]
";

    #[test]
    fn each_site_runs_to_the_next_text_symbol() {
        let s = resolve_sites(KALLSYMS).unwrap();
        assert_eq!(s.receive, [0xffffffffc0a07700, 0xffffffffc0a07e80]);
        assert_eq!(s.rx_poll, [0xffffffffc0a06c80, 0xffffffffc0a07100]);
        assert_eq!(s.socket_receive, [0xffffffffc0a08540, 0xffffffffc0a08600]);
    }

    #[test]
    fn hidden_or_missing_symbols_are_an_error_naming_them() {
        // What a reader without CAP_SYSLOG (or with kptr_restrict=2) sees.
        let hidden: String = KALLSYMS
            .lines()
            .map(|l| format!("0000000000000000{}\n", &l[16..]))
            .collect();
        let e = resolve_sites(&hidden).unwrap_err();
        assert!(e.contains("kptr_restrict"), "{e}");
        let e = resolve_sites("ffffffffc0a07700 t wg_packet_receive\t[wireguard]\n").unwrap_err();
        assert!(e.contains("wg_receive"), "{e}");
    }

    /// The map is read as the program fills it: per-CPU slots summed, cumulative counts
    /// rendered per (namespace, port, reason).
    #[test]
    fn counts_render_per_namespace_port_and_reason() {
        let drops = FakeTable::<WgKey, Vec<u64>>::new(16);
        let mut room = Wireguard {
            sites: Box::new(FakeTable::<u32, WgSites>::new(1)),
            drops: Box::new(drops.clone()),
            resolved_for: Some("0xffffffffc0a00000".into()),
            resolved: 3,
            counts: BTreeMap::new(),
        };
        let key = WgKey {
            netns: 4026532177,
            port: 51820,
            reason: wg_reason::PEER_QUEUE_FULL,
        };
        let mut t = drops.clone();
        t.insert(key, vec![4000, 949]).unwrap();
        t.insert(
            WgKey {
                reason: wg_reason::DECRYPT_RING_FULL,
                ..key
            },
            vec![0, 397],
        )
        .unwrap();
        let mut bench = super::super::testkit::Bench::new();
        assert!(room.poll(&mut bench.poll()));
        assert!(!room.poll(&mut bench.poll()), "nothing moved");
        let out = bench.families(&room);
        let f = out
            .iter()
            .find(|f| f.name() == "bufscope_wireguard_drops_total")
            .unwrap();
        let got: Vec<(String, f64)> = f
            .get_metric()
            .iter()
            .map(|m| {
                (
                    m.get_label()
                        .iter()
                        .map(|l| l.value())
                        .collect::<Vec<_>>()
                        .join(","),
                    m.get_counter().get_value(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("4026532177,51820,peer_queue_full".to_string(), 4949.0),
                ("4026532177,51820,decrypt_ring_full".to_string(), 397.0),
            ]
        );
        let sites = out
            .iter()
            .find(|f| f.name() == "bufscope_wireguard_discard_sites")
            .unwrap();
        // This machine's module state decides the sites (none without the module).
        let want = if module_present() { 3.0 } else { 0.0 };
        assert_eq!(sites.get_metric()[0].get_gauge().get_value(), want);
    }
}
