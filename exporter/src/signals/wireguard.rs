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
//! one), so `--wireguard.queue-drops auto` (the default) runs it only while the `wireguard`
//! module is loaded: attached at start where it is; elsewhere the program is loaded at start
//! (the verifier's verdict is known then) and attached by the room at the first poll that sees
//! the module (a `modprobe wireguard`, or the first `ip link add … type wireguard`, after
//! bufscope started), detached again when the module is unloaded
//! (`bufscope_wireguard_hook_armed`, `bufscope_wireguard_hook_changes_total`). Before 6.3
//! `consume_skb` has no `location`: no tracepoint tells these frees from the ordinary ones,
//! so the second variant, `fentry/consume_skb`, reads the caller's return address from the
//! BPF trampoline's frame (x86-64; `ebpf/src/wireguard.rs` says how it recognises the
//! frame); where fentry is refused nothing is counted, and `bufscope check` says so.
//!
//! The `device` label (the interface's name) comes from the module's generic netlink,
//! per namespace and listen port, cached ([`devices`]).
//!
//! Stalled peers ([`stall`]): while the module is loaded, every `--wireguard.stall-period`
//! the room reads every network namespace's WireGuard devices (one `RTM_GETLINK` dump per
//! namespace — those without a device only every minute — and one `WG_CMD_GET_DEVICE` dump
//! per device) and follows each peer's last handshake time and rx bytes: a peer that keeps
//! handshaking while it sends only handshake and keepalive messages is stalled. That read
//! needs no hook: it runs whatever `--wireguard.queue-drops` says, on a thread of the room's
//! own, so that the collector's poll never waits on netlink (in a loaded emulated guest a read
//! took a worst of 40–729 ms).

mod devices;
mod stall;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use devices::{Devices, ScanThread, Scanner};
use stall::Stall;

use anyhow::Context as _;
use aya::Ebpf;
use aya::programs::{BtfTracePoint, FEntry};
use bufscope_common::{WgKey, WgSites, maps, wg_reason};
use clap::ValueEnum;
use prometheus::proto::MetricFamily;

use super::{BuildCx, CheckLine, PollCx, Room, Services, Signal};
use crate::bpf::switch::{Linked, Switch};
use crate::bpf::table::{PerCpuHash, Slots};
use crate::bpf::{Attached, BtfNeed, Hook, LoadPlan, PerCpuTable, ProbeSpec, Table, usable};
use crate::exposition::Spec;
use crate::kernel::KernelBtf;

/// `consume_skb` with its 2nd argument, `location` (6.3+).
const LOCATION: &[BtfNeed] = &[BtfNeed::Args(2)];

/// The hook: `tp_btf/consume_skb` with `location` (6.3+).
const HOOK: Hook = Hook::BtfTracepointWhere {
    prog: "wg_consume_skb",
    name: "consume_skb",
    needs: LOCATION,
};

/// Before 6.3: `fentry/consume_skb`, `location` read from the BPF trampoline's frame
/// (x86-64's layout; a frame it does not recognise counts nothing).
const ENTRY: Hook = Hook::Fentry {
    prog: "wg_consume_skb_entry",
    func: "consume_skb",
};

/// The probe: the tracepoint where it carries `location`, else the fentry that finds it.
pub const PROBE: ProbeSpec = ProbeSpec {
    name: "wireguard",
    what: "kernel WireGuard's queue drops (full per-peer, decrypt and handshake queues), per namespace, listen port and reason",
    variants: &[&[HOOK], &[ENTRY]],
    is_drop_probe: false,
    attributed: false,
};

/// `--wireguard.queue-drops`.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueDrops {
    /// Attach while the `wireguard` module is loaded (or built in): at start where it is,
    /// else when it loads.
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
    /// auto (attach `tp_btf/consume_skb` while the wireguard module is loaded: at start, or
    /// when it loads later) | on | off. The hook runs for every packet the kernel consumes
    /// (measured on 6.18: a reading UDP receiver at 95-97% of its rate without it); it counts
    /// only those kernel WireGuard discards.
    #[arg(long = "wireguard.queue-drops", value_enum, default_value_t = QueueDrops::Auto)]
    pub queue_drops: QueueDrops,

    /// How often kernel WireGuard's devices are read in every network namespace for the
    /// stall signal (bufscope_wireguard_stalled_peers), while the wireguard module is
    /// loaded: one rtnetlink dump per namespace (one with no WireGuard device: every minute)
    /// and one generic netlink dump per device. 0s: never.
    #[arg(long = "wireguard.stall-period", value_name = "DURATION", default_value = "10s", value_parser = crate::values::duration_within(Duration::ZERO, Duration::from_secs(3600)))]
    pub stall_period: Duration,
}

const DROPS: Spec = Spec::counter(
    "bufscope_wireguard_drops_total",
    "Packets kernel WireGuard discarded (consume_skb at its discard sites: no kernel counter), by the outer network namespace, the device's UDP listen port, its name (from the module's generic netlink; empty where it cannot be read) and reason.",
    &["netns", "port", "device", "reason"],
);

const ARMED: Spec = Spec::gauge(
    "bufscope_wireguard_hook_armed",
    "Whether tp_btf/consume_skb is attached (1; with --wireguard.queue-drops auto it runs only while the wireguard module is loaded).",
    &[],
);

const CHANGES: Spec = Spec::counter(
    "bufscope_wireguard_hook_changes_total",
    "Times --wireguard.queue-drops auto attached the hook (arm: the wireguard module appeared) or detached it (disarm: the module was unloaded).",
    &["action"],
);

/// Shortest time between two resolutions of the same module load that failed (kallsyms is
/// megabytes; a load seen in the middle of its setup may not list every symbol yet).
const RETRY_EVERY: Duration = Duration::from_secs(30);

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
    let wanted = [
        "wg_packet_receive",
        "wg_receive",
        "wg_packet_rx_poll",
        "consume_skb",
    ];
    let mut starts = [0u64; 4];
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
        consume: range(starts[3])?,
    })
}

/// What `prepare` decided, for `after_attach` and `take`.
#[derive(Debug, Default)]
pub struct Setup {
    /// `auto` without the module at start: the program is loaded after the others attached
    /// and the room attaches it when the module appears.
    arm_later: bool,
    /// The hook whose program is loaded for that.
    loaded: Option<Hook>,
    /// `--wireguard.stall-period` (None: 0s, no stall signal).
    stall_period: Option<Duration>,
}

/// Loads the best variant's program the kernel accepts without attaching it; never fails the
/// start-up (returns the program loaded, and logs why none was).
fn load_unattached(ebpf: &mut Ebpf, cx: &Attached<'_>) -> Option<Hook> {
    let mut why = Vec::new();
    for (i, hooks) in PROBE.variants.iter().enumerate() {
        let hook = hooks[0];
        if let Some(w) = passed_over(i) {
            why.push(format!("{}: {w}", hook.describe()));
            continue;
        }
        let loaded = usable(hooks, cx.kernel).and_then(|()| load_program(ebpf, cx, &hook));
        match loaded {
            Ok(()) => {
                tracing::info!(
                    probe = PROBE.name,
                    hook = %hook.describe(),
                    "no wireguard module loaded yet: the hook is loaded and attaches when the module appears"
                );
                return Some(hook);
            }
            Err(w) => why.push(format!("{}: {w}", hook.describe())),
        }
    }
    tracing::info!(
        probe = PROBE.name,
        "kernel WireGuard's drops will not be counted if its module loads later: {}",
        why.join("; ")
    );
    None
}

/// Loads `hook`'s program (unattached).
fn load_program(ebpf: &mut Ebpf, cx: &Attached<'_>, hook: &Hook) -> Result<(), String> {
    let prog = ebpf
        .program_mut(hook.prog())
        .with_context(|| format!("{} is missing from the BPF object", hook.prog()));
    let r = match hook {
        Hook::Fentry { func, .. } => prog.and_then(|p| {
            let p: &mut FEntry = p.try_into()?;
            Ok(p.load(func, cx.btf)?)
        }),
        _ => prog.and_then(|p| {
            let p: &mut BtfTracePoint = p.try_into()?;
            Ok(p.load("consume_skb", cx.btf)?)
        }),
    };
    r.map_err(|e| format!("{e:#}"))
}

/// Why variant `i` is not used on this machine, when it is not (the fentry variant reads
/// x86-64's trampoline frame).
fn passed_over(i: usize) -> Option<&'static str> {
    (PROBE.variants[i][0].prog() == ENTRY.prog() && !cfg!(target_arch = "x86_64"))
        .then_some("reads x86-64's BPF trampoline frame: not on this architecture")
}

/// First wait after a failed late attach; doubled after each failure up to [`ATTACH_RETRY_MAX`],
/// and back to this when the module is loaded again (another load may attach).
const ATTACH_RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest wait between two late-attach attempts of the same module load.
const ATTACH_RETRY_MAX: Duration = Duration::from_secs(300);

/// The late-attached hook of `auto` (None where the loader attached it at start).
struct LateHook {
    switch: Box<dyn Switch>,
    /// Its hook as `bufscope_probe_attached`'s `hook` label says it (`tp_btf/consume_skb`,
    /// `fentry/consume_skb`).
    hooks: String,
    /// Whether it stays attached when the module goes (the fentry variant: before ≈5.19 a
    /// tracing program's trampoline attaches once per load of the program — a second
    /// `BPF_RAW_TRACEPOINT_OPEN` after a detach fails with `ENOENT` in
    /// `bpf_tracing_prog_attach` — so detaching it would lose it for good; attached, with
    /// `WG_SITES` cleared, it returns at its first check).
    sticky: bool,
    armed: bool,
    arms: u64,
    disarms: u64,
    /// After a failed attach: when the next attempt may run, and the wait after that.
    retry: Option<(Instant, Duration)>,
}

impl LateHook {
    /// Takes a duplicate of the fd of `hook`'s loaded program out of `ebpf`.
    fn take(ebpf: &Ebpf, hook: &Hook) -> anyhow::Result<Self> {
        let p = ebpf
            .program(hook.prog())
            .with_context(|| format!("{} is missing from the BPF object", hook.prog()))?;
        let fd = match hook {
            Hook::Fentry { .. } => <&FEntry>::try_from(p)?.fd()?,
            _ => <&BtfTracePoint>::try_from(p)?.fd()?,
        };
        let prog = fd
            .try_clone()
            .context("duplicating the wireguard program fd")?;
        let sticky = matches!(hook, Hook::Fentry { .. });
        Ok(Self::new(
            Box::new(Linked::new(prog)),
            hook.describe(),
            sticky,
        ))
    }

    fn new(switch: Box<dyn Switch>, hooks: String, sticky: bool) -> Self {
        Self {
            switch,
            hooks,
            sticky,
            armed: false,
            arms: 0,
            disarms: 0,
            retry: None,
        }
    }

    /// A new module load: a failed attach may be tried again at once.
    fn reset_backoff(&mut self) {
        self.retry = None;
    }

    /// Attached while `wanted` (and, when [`LateHook::sticky`], from its first attach on);
    /// a failed attach is tried again after a wait that doubles up to [`ATTACH_RETRY_MAX`].
    fn follow(&mut self, wanted: bool, now: Instant) {
        if wanted && !self.armed {
            if self.retry.is_some_and(|(at, _)| now < at) {
                return;
            }
            match self.switch.attach() {
                Ok(()) => {
                    self.armed = true;
                    self.arms += 1;
                    self.retry = None;
                    tracing::info!(
                        probe = PROBE.name,
                        hook = %self.hooks,
                        "wireguard module loaded: {} attached",
                        self.hooks
                    );
                }
                Err(e) => {
                    let wait = self.retry.map_or(ATTACH_RETRY_MIN, |(_, w)| w);
                    self.retry = Some((now + wait, (wait * 2).min(ATTACH_RETRY_MAX)));
                    tracing::warn!(
                        probe = PROBE.name,
                        hook = %self.hooks,
                        "wireguard module loaded, but attaching {} failed (tried again in {}s): {e}",
                        self.hooks,
                        wait.as_secs()
                    );
                }
            }
        } else if !wanted && self.armed && !self.sticky {
            self.switch.detach();
            self.armed = false;
            self.disarms += 1;
            tracing::info!(
                probe = PROBE.name,
                hook = %self.hooks,
                "wireguard module unloaded: {} detached",
                self.hooks
            );
        } else if !wanted && self.armed && self.retry.is_none() {
            // Said once per unload (retry is None while armed; Some marks it said).
            self.retry = Some((now, ATTACH_RETRY_MIN));
            tracing::info!(
                probe = PROBE.name,
                hook = %self.hooks,
                "wireguard module unloaded: {} stays attached and counts nothing until it is \
                 loaded again (a tracing program may not attach a second time on older kernels)",
                self.hooks
            );
        }
    }
}

/// The kernel-WireGuard room.
pub struct Wireguard {
    sites: Box<dyn Table<u32, WgSites>>,
    drops: PerCpuTable<WgKey, u64>,
    /// With `auto` and no module at start: the hook this room attaches when it loads.
    late: Option<LateHook>,
    /// The module identity the sites were resolved for.
    resolved_for: Option<String>,
    /// When a resolution of that identity last failed (retried after [`RETRY_EVERY`]).
    failed_at: Option<Instant>,
    /// How many sites are resolved (0 or 3).
    resolved: usize,
    /// The counts at the last read (the map is cumulative; bufscope's start is zero).
    counts: BTreeMap<WgKey, u64>,
    /// The device names of (namespace, port).
    devices: Devices,
    /// Whether the drops hook runs (at start or late): false when only the stall signal does.
    counting: bool,
    /// `--wireguard.stall-period` (None: no stall signal).
    stall_period: Option<Duration>,
    /// When the devices are read next for the stall signal.
    next_scan: Option<Instant>,
    /// The namespaces processes live in (for the periodic read).
    namespaces: crate::signals::netlink::namespaces::Namespaces,
    /// The peers followed for the stall signal.
    stall: Stall,
    /// The thread the stall signal's reads run on, started at the first one (None before, and
    /// with no stall signal).
    reads: Option<ScanThread>,
    /// The reader that thread starts with (netlink when None; a fake in tests).
    scan_reader: Option<Box<dyn devices::Reader>>,
}

impl Room for Wireguard {
    const PROBE: ProbeSpec = PROBE;
    type Part = ();
    type Flags = Flags;
    type Setup = Setup;

    fn prepare(flags: &Flags, plan: &mut LoadPlan) -> anyhow::Result<Setup> {
        // The sites are addresses of this boot's module load: nothing to keep across a restart.
        plan.unpinned(PROBE.name);
        for i in 0..PROBE.variants.len() {
            if let Some(why) = passed_over(i) {
                plan.pass_over(PROBE.name, i, why);
            }
        }
        // `bufscope check` loads it wherever it could run, to say whether it would attach.
        if plan.purpose == crate::bpf::Purpose::Check {
            return Ok(Setup::default());
        }
        // `--probe.disable wireguard` turns the whole room off, the stall signal too.
        let stall = !flags.stall_period.is_zero() && !plan.disabled.contains(PROBE.name);
        let mut setup = Setup {
            stall_period: stall.then_some(flags.stall_period),
            ..Setup::default()
        };
        match flags.queue_drops {
            QueueDrops::On => {}
            QueueDrops::Off => {
                plan.leave_off(PROBE.name, "off (--wireguard.queue-drops off)");
            }
            QueueDrops::Auto if !module_present() => {
                plan.leave_off(
                    PROBE.name,
                    "off until the wireguard module loads (--wireguard.queue-drops auto: attached then; on: always)",
                );
                // `--probe.disable wireguard` keeps it off for good.
                setup.arm_later = !plan.disabled.contains(PROBE.name);
            }
            QueueDrops::Auto => {}
        }
        Ok(setup)
    }

    fn after_attach(setup: &mut Setup, ebpf: &mut Ebpf, cx: &Attached<'_>) -> anyhow::Result<()> {
        if setup.arm_later && !crate::bpf::hook::attached(cx.status, PROBE.name) {
            setup.loaded = load_unattached(ebpf, cx);
        }
        Ok(())
    }

    fn check(kernel: &KernelBtf) -> Vec<CheckLine> {
        let location = kernel
            .btf_tracepoint_args("consume_skb")
            .is_some_and(|n| n >= 2);
        let entry = usable(&[ENTRY], kernel).is_ok() && passed_over(1).is_none();
        let (ok, detail) = if location {
            (
                true,
                "consume_skb carries location: kernel WireGuard's discards (full per-peer, \
                 decrypt and handshake queues) are counted at the module's discard sites",
            )
        } else if entry {
            (
                true,
                "consume_skb has no location on this kernel (added in 6.3): fentry/consume_skb \
                 reads its caller's return address from the BPF trampoline's frame (x86-64) and \
                 counts kernel WireGuard's discards at the module's discard sites where fentry \
                 is allowed",
            )
        } else {
            (
                false,
                "consume_skb has no location on this kernel (added in 6.3) and fentry cannot \
                 stand in: kernel WireGuard's queue drops cannot be told from the packets it \
                 consumes; none are counted",
            )
        };
        vec![CheckLine {
            ok,
            what: "kernel wireguard drops",
            detail: detail.into(),
        }]
    }

    fn take(
        setup: Setup,
        ebpf: &mut Ebpf,
        env: &BuildCx<'_>,
        _services: &mut Services,
    ) -> anyhow::Result<Option<Box<dyn Signal>>> {
        let (late, counting) = if env.attached(PROBE.name) {
            (None, true)
        } else if let Some(hook) = &setup.loaded {
            (Some(LateHook::take(ebpf, hook)?), true)
        } else if setup.stall_period.is_some() {
            // No hook (off, refused): the stall signal still runs.
            (None, false)
        } else {
            return Ok(None);
        };
        let mut room = Self::new(
            Slots::take(ebpf, maps::WG_SITES)?,
            PerCpuHash::take(ebpf, maps::WG_DROPS)?,
            late,
            Devices::new(Box::new(devices::Netlink::new())),
        );
        room.counting = counting;
        room.stall_period = setup.stall_period;
        if counting {
            room.refresh_sites();
        }
        Ok(Some(Box::new(room)))
    }
}

impl Wireguard {
    fn new(
        sites: Box<dyn Table<u32, WgSites>>,
        drops: PerCpuTable<WgKey, u64>,
        late: Option<LateHook>,
        devices: Devices,
    ) -> Self {
        Self {
            sites,
            drops,
            late,
            resolved_for: None,
            failed_at: None,
            resolved: 0,
            counts: BTreeMap::new(),
            devices,
            counting: true,
            stall_period: None,
            next_scan: None,
            namespaces: crate::signals::netlink::namespaces::Namespaces::new(),
            stall: Stall::new(),
            reads: None,
            scan_reader: None,
        }
    }

    /// Resolves the discard sites again when the module appeared, went or was reloaded (and
    /// a failed resolution of the same load at most every [`RETRY_EVERY`]); then, with
    /// `auto`'s late hook, attaches it while the module is loaded. The sites are in
    /// `WG_SITES` before the hook runs.
    fn refresh_sites(&mut self) {
        self.refresh_with(module_identity(), || {
            crate::kernel::read_lossy("/proc/kallsyms")
        });
    }

    /// [`Self::refresh_sites`] for module load `id` (None: not loaded), reading kallsyms
    /// with `kallsyms` when it resolves. The late hook runs only while the sites are
    /// resolved: without them it would count nothing.
    fn refresh_with(&mut self, id: Option<String>, kallsyms: impl FnOnce() -> Option<String>) {
        let retry = self.failed_at.is_some_and(|t| t.elapsed() >= RETRY_EVERY);
        let changed = id != self.resolved_for;
        if changed || retry {
            self.resolve(id, kallsyms);
        }
        let wanted = self.resolved > 0;
        if let Some(l) = &mut self.late {
            if changed {
                l.reset_backoff();
            }
            l.follow(wanted, Instant::now());
        }
    }

    /// Resolves the sites of module load `id` (None: not loaded) into `WG_SITES`.
    fn resolve(&mut self, id: Option<String>, kallsyms: impl FnOnce() -> Option<String>) {
        let sites = match &id {
            None => Ok(WgSites::default()),
            Some(_) => kallsyms()
                .ok_or_else(|| "/proc/kallsyms unreadable".to_string())
                .and_then(|t| resolve_sites(&t)),
        };
        self.resolved_for = id;
        let sites = match sites {
            Ok(s) => s,
            Err(e) => {
                if self.failed_at.is_none() {
                    tracing::warn!(
                        "kernel WireGuard's discard sites not resolved ({e}): its drops are not counted (retried every {}s)",
                        RETRY_EVERY.as_secs()
                    );
                }
                self.failed_at = Some(Instant::now());
                // No stale ranges of an earlier load.
                if let Err(e) = self.sites.insert(0, WgSites::default()) {
                    tracing::warn!("{e:#}");
                }
                self.resolved = 0;
                return;
            }
        };
        self.failed_at = None;
        match self.sites.insert(0, sites) {
            Ok(()) => {
                self.resolved = if self.resolved_for.is_some() { 3 } else { 0 };
                if self.resolved_for.is_some() {
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
    }
}

impl Wireguard {
    /// Whether the hook runs (always where the loader attached it).
    fn armed(&self) -> bool {
        self.counting && self.late.as_ref().is_none_or(|l| l.armed)
    }

    /// The stall signal's periodic read, when the module is loaded (`present`): takes the
    /// result of a read that finished since the last poll into [`Stall`] and the device names,
    /// and when a read is due hands the namespaces to read to the room's own thread
    /// ([`ScanThread`]): the collector never waits for netlink. True when a peer's stalled
    /// state changed.
    fn scan(&mut self, cx: &mut PollCx<'_>, present: bool, now: Instant) -> bool {
        let Some(period) = self.stall_period else {
            return false;
        };
        let done = self.reads.as_mut().and_then(ScanThread::take);
        if !present {
            // No module, no devices (a read that was under way is dropped).
            self.stall.clear();
            self.next_scan = None;
            return false;
        }
        let mut changed = false;
        if let Some(done) = done {
            tracing::debug!(
                namespaces = done.targets.len(),
                took_ms = done.took.as_millis() as u64,
                "kernel WireGuard devices read for the stall signal"
            );
            self.stall
                .retain_namespaces(|ns| done.targets.contains(&ns));
            for (ns, devs) in &done.read {
                self.devices.learn(*ns, devs, done.at);
                changed |= self.stall.update(*ns, devs, done.at);
            }
        }
        if self.next_scan.is_some_and(|t| now < t) {
            return changed;
        }
        if self.reads.is_none() {
            let reader = self
                .scan_reader
                .take()
                .unwrap_or_else(|| Box::new(devices::Netlink::new()));
            match ScanThread::spawn(Scanner::new(reader)) {
                Ok(t) => self.reads = Some(t),
                Err(e) => {
                    tracing::warn!(
                        "kernel WireGuard stall signal off: its read thread did not start: {e}"
                    );
                    self.stall_period = None;
                    return changed;
                }
            }
        }
        let pids = cx.attr.pids_this_poll().to_vec();
        let targets = devices::scan_targets(&mut self.namespaces, cx.attr.procfs(), &pids, now);
        if self.reads.as_mut().is_some_and(|r| r.ask(targets, now)) {
            self.next_scan = Some(now + period);
        }
        changed
    }
}

impl Signal for Wireguard {
    fn name(&self) -> &'static str {
        PROBE.name
    }

    fn attached_late(&self) -> Option<&str> {
        self.late
            .as_ref()
            .filter(|l| l.armed)
            .map(|l| l.hooks.as_str())
    }

    fn poll(&mut self, cx: &mut PollCx<'_>) -> bool {
        let now = Instant::now();
        let stalls = self.scan(cx, module_present(), now);
        if !self.counting {
            return stalls;
        }
        self.refresh_sites();
        let mut moved = false;
        for (k, per_cpu) in self.drops.entries() {
            let v: u64 = per_cpu.iter().sum();
            let old = self.counts.insert(k, v);
            moved |= old != Some(v);
        }
        // Before the first scrape that shows a new (namespace, port): its name is in it.
        if moved {
            self.devices.update(
                self.counts.keys().map(|k| (k.netns, k.port)),
                cx.attr.procfs(),
                now,
            );
        }
        moved || stalls
    }

    fn families(&self, _procs: &[super::Row], out: &mut Vec<MetricFamily>) {
        self.stall.families(out);
        if !self.counting {
            return;
        }
        let mut f = DROPS.family();
        for (k, v) in &self.counts {
            f.push(
                &[
                    &k.netns.to_string(),
                    &k.port.to_string(),
                    self.devices.name(k.netns, k.port),
                    reason_name(k.reason),
                ],
                *v as f64,
            );
        }
        f.done(out);
        // A node without kernel WireGuard (auto's hook waiting for the module, never armed)
        // shows none of the room's own series: nothing happened there.
        let idle = self.resolved_for.is_none()
            && self.late.as_ref().is_some_and(|l| !l.armed && l.arms == 0);
        if idle {
            return;
        }
        let mut f = SITES.family();
        f.push(&[], self.resolved as f64);
        f.done(out);
        let mut f = ARMED.family();
        f.push(&[], if self.armed() { 1.0 } else { 0.0 });
        f.done(out);
        if let Some(l) = &self.late {
            // Switches that never happened are not shown at 0.
            let mut f = CHANGES.family();
            for (action, n) in [("arm", l.arms), ("disarm", l.disarms)] {
                if n > 0 {
                    f.push(&[action], n as f64);
                }
            }
            f.done(out);
        }
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
ffffffff81c3a1d0 T consume_skb
ffffffff81c3a2a0 T __consume_stateless_skb
";

    #[test]
    fn each_site_runs_to_the_next_text_symbol() {
        let s = resolve_sites(KALLSYMS).unwrap();
        assert_eq!(s.receive, [0xffffffffc0a07700, 0xffffffffc0a07e80]);
        assert_eq!(s.rx_poll, [0xffffffffc0a06c80, 0xffffffffc0a07100]);
        assert_eq!(s.socket_receive, [0xffffffffc0a08540, 0xffffffffc0a08600]);
        assert_eq!(s.consume, [0xffffffff81c3a1d0, 0xffffffff81c3a2a0]);
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

    /// The stall signal's read runs on the room's thread: a poll asks for it and returns while
    /// the read is still blocked (a poll that waited would hang here), and a later poll takes
    /// its result; no second read is asked for while one is under way.
    #[test]
    fn the_stall_read_never_holds_up_a_poll() {
        let (release, gate) = std::sync::mpsc::channel();
        let mut room = Wireguard::new(
            Box::new(FakeTable::<u32, WgSites>::new(1)),
            Box::new(FakeTable::<WgKey, Vec<u64>>::new(16)),
            None,
            Devices::new(one_device()),
        );
        room.counting = false;
        room.stall_period = Some(Duration::from_secs(10));
        room.scan_reader = Some(Box::new(Listing {
            netns: None,
            name: "wg9",
            port: 51999,
            gate: Some(gate),
        }));
        let own = crate::kernel::sock_diag::netns_of(Path::new("/proc/self/ns/net"))
            .and_then(|n| u32::try_from(n).ok())
            .unwrap();
        let mut bench = super::super::testkit::Bench::new();
        let t0 = Instant::now();
        // Asks for a read; the reader is blocked, and the poll returns all the same.
        assert!(!room.scan(&mut bench.poll(), true, t0));
        assert!(room.reads.as_ref().is_some_and(|r| r.busy()));
        // Due again, but one read at a time: nothing more asked, nothing learned yet.
        assert!(!room.scan(&mut bench.poll(), true, t0 + Duration::from_secs(20)));
        assert_eq!(room.devices.name(own, 51999), "");
        // Every namespace's read may go on now.
        drop(release);
        let deadline = Instant::now() + Duration::from_secs(10);
        while room.devices.name(own, 51999).is_empty() {
            assert!(Instant::now() < deadline, "the read's result never arrived");
            std::thread::sleep(Duration::from_millis(10));
            room.scan(&mut bench.poll(), true, t0 + Duration::from_secs(21));
        }
        assert_eq!(room.devices.name(own, 51999), "wg9");
    }

    /// A reader listing one device: in namespace `netns` only, or in every namespace; with a
    /// `gate`, once the test drops the other end of its channel (a read that takes as long as
    /// the test wants).
    struct Listing {
        netns: Option<u32>,
        name: &'static str,
        port: u16,
        gate: Option<std::sync::mpsc::Receiver<()>>,
    }

    /// Namespace 4026532177 has `wg0` on port 51820.
    fn one_device() -> Box<Listing> {
        Box::new(Listing {
            netns: Some(4026532177),
            name: "wg0",
            port: 51820,
            gate: None,
        })
    }

    impl devices::Reader for Listing {
        fn read_at(
            &mut self,
            netns: u32,
            _: &std::path::Path,
        ) -> Result<Vec<crate::kernel::wg_netlink::Device>, devices::Unreadable> {
            self.read(netns, &crate::attribution::Procfs::default())
        }

        fn read(
            &mut self,
            netns: u32,
            _: &crate::attribution::Procfs,
        ) -> Result<Vec<crate::kernel::wg_netlink::Device>, devices::Unreadable> {
            if let Some(g) = &self.gate {
                let _ = g.recv();
            }
            Ok(if self.netns.is_none_or(|n| n == netns) {
                vec![crate::kernel::wg_netlink::Device {
                    ifindex: 5,
                    name: self.name.into(),
                    listen_port: self.port,
                    peers: Vec::new(),
                }]
            } else {
                Vec::new()
            })
        }
    }

    /// The map is read as the program fills it: per-CPU slots summed, cumulative counts
    /// rendered per (namespace, port, device, reason); the device named from its namespace's
    /// devices.
    #[test]
    fn counts_render_per_namespace_port_and_reason() {
        let drops = FakeTable::<WgKey, Vec<u64>>::new(16);
        let mut room = Wireguard::new(
            Box::new(FakeTable::<u32, WgSites>::new(1)),
            Box::new(drops.clone()),
            None,
            Devices::new(one_device()),
        );
        room.resolved_for = Some("0xffffffffc0a00000".into());
        room.resolved = 3;
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
                ("4026532177,51820,wg0,peer_queue_full".to_string(), 4949.0),
                ("4026532177,51820,wg0,decrypt_ring_full".to_string(), 397.0),
            ]
        );
        let sites = out
            .iter()
            .find(|f| f.name() == "bufscope_wireguard_discard_sites")
            .unwrap();
        // This machine's module state decides the sites (none without the module).
        let want = if module_present() { 3.0 } else { 0.0 };
        assert_eq!(sites.get_metric()[0].get_gauge().get_value(), want);
        let armed = out
            .iter()
            .find(|f| f.name() == "bufscope_wireguard_hook_armed")
            .unwrap();
        assert_eq!(
            armed.get_metric()[0].get_gauge().get_value(),
            1.0,
            "attached by the loader: always armed"
        );
    }

    /// `auto` without the module arms later unless `--probe.disable wireguard` says never;
    /// `off` never does.
    #[test]
    fn only_auto_without_the_module_arms_later() {
        if module_present() {
            eprintln!("SKIPPED: this machine has the wireguard module: auto attaches at start");
            return;
        }
        let setup = |mode: QueueDrops, disabled: &[String]| {
            let mut plan = LoadPlan::new(crate::bpf::Purpose::Run, disabled, tracing::Level::INFO);
            let s = Wireguard::prepare(
                &Flags {
                    queue_drops: mode,
                    stall_period: Duration::from_secs(10),
                },
                &mut plan,
            )
            .unwrap();
            (
                s.arm_later,
                plan.off(PROBE.name).is_some(),
                s.stall_period.is_some(),
            )
        };
        assert_eq!(setup(QueueDrops::Auto, &[]), (true, true, true));
        assert_eq!(
            setup(QueueDrops::Auto, &["wireguard".into()]),
            (false, true, false),
            "disabled: no stall signal either"
        );
        assert_eq!(
            setup(QueueDrops::Off, &[]),
            (false, true, true),
            "off: the stall signal needs no hook"
        );
        assert_eq!(setup(QueueDrops::On, &[]), (false, false, true));
    }

    /// A fake switch recording whether the program is attached.
    #[derive(Clone, Default)]
    struct FakeSwitch(std::sync::Arc<std::sync::atomic::AtomicBool>);

    impl Switch for FakeSwitch {
        fn attach(&mut self) -> std::io::Result<()> {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
        fn detach(&mut self) {
            self.0.store(false, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// A switch whose attach fails with `ENOENT` (as 5.10 answers a second attach of an
    /// fentry program) until told otherwise, counting the attempts.
    #[derive(Clone, Default)]
    struct Refusing {
        ok: std::sync::Arc<std::sync::atomic::AtomicBool>,
        tries: std::sync::Arc<std::sync::atomic::AtomicU32>,
    }

    impl Switch for Refusing {
        fn attach(&mut self) -> std::io::Result<()> {
            self.tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.ok.load(std::sync::atomic::Ordering::SeqCst) {
                Ok(())
            } else {
                Err(std::io::Error::from_raw_os_error(libc::ENOENT))
            }
        }
        fn detach(&mut self) {}
    }

    /// A refused late attach is tried again after 1, 2, 4, … s (at most
    /// ATTACH_RETRY_MAX apart), not at every poll; a new module load tries at once.
    #[test]
    fn a_refused_late_attach_backs_off_and_a_new_load_resets_it() {
        use std::sync::atomic::Ordering::SeqCst;
        let sw = Refusing::default();
        let mut l = LateHook::new(Box::new(sw.clone()), "fentry/consume_skb".into(), true);
        let t0 = Instant::now();
        // A poll every second for 10 minutes.
        for s in 0..600 {
            l.follow(true, t0 + Duration::from_secs(s));
        }
        let tries = sw.tries.load(SeqCst);
        // 0, 1, 3, 7, 15, 31, 63, 127, 255, then every 300 s: 555.
        assert_eq!(tries, 10, "attempts in 10 minutes of polls");
        assert!(!l.armed);
        // The module is loaded again (new identity): tried at the next poll.
        l.reset_backoff();
        sw.ok.store(true, SeqCst);
        l.follow(true, t0 + Duration::from_secs(600));
        assert!(l.armed && l.arms == 1);
        // The fentry variant stays attached when the module goes (it could not come back).
        l.follow(false, t0 + Duration::from_secs(601));
        assert!(l.armed && l.disarms == 0);
    }

    /// `auto` without the module at start: the hook is attached once the module appears and
    /// its sites are in `WG_SITES`, re-resolved when it is reloaded elsewhere, detached when
    /// it goes; a load whose symbols are not (yet) readable leaves it detached.
    #[test]
    fn late_hook_follows_the_module() {
        let sites = FakeTable::<u32, WgSites>::new(1);
        let switch = FakeSwitch::default();
        let on = || switch.0.load(std::sync::atomic::Ordering::SeqCst);
        let mut room = Wireguard::new(
            Box::new(sites.clone()),
            Box::new(FakeTable::<WgKey, Vec<u64>>::new(16)),
            Some(LateHook::new(
                Box::new(switch.clone()),
                "tp_btf/consume_skb".into(),
                false,
            )),
            Devices::new(one_device()),
        );
        let table = || sites.clone().get(&0).unwrap_or_default();
        room.refresh_with(None, || unreachable!("no module: kallsyms is not read"));
        assert!(!on() && !room.armed());
        assert_eq!(room.attached_late(), None, "off by choice: not listed");
        // Nothing of it shown on a node that never had the module.
        let mut bench = super::super::testkit::Bench::new();
        let idle: Vec<String> = bench
            .families(&room)
            .iter()
            .filter(|f| !f.get_metric().is_empty())
            .map(|f| f.name().to_string())
            .collect();
        assert!(idle.is_empty(), "{idle:?}");
        // Loaded, but its addresses hidden: nothing to count, not attached.
        let hidden: String = KALLSYMS
            .lines()
            .map(|l| format!("0000000000000000{}\n", &l[16..]))
            .collect();
        room.refresh_with(Some("0xffffffffc0a00000".into()), || Some(hidden));
        assert!(!on());
        assert_eq!(room.resolved, 0);
        // Not read again for the same load before RETRY_EVERY.
        room.refresh_with(Some("0xffffffffc0a00000".into()), || {
            unreachable!("retried too early")
        });
        // A reload (new text address) whose symbols resolve: sites first, then attached.
        room.refresh_with(Some("0xffffffffc0b00000".into()), || {
            Some(KALLSYMS.to_string())
        });
        assert!(on() && room.armed());
        assert_eq!(room.attached_late(), Some("tp_btf/consume_skb"));
        assert_eq!(table().receive, [0xffffffffc0a07700, 0xffffffffc0a07e80]);
        room.refresh_with(Some("0xffffffffc0b00000".into()), || {
            unreachable!("same load: not read again")
        });
        // Unloaded: detached, the sites cleared.
        room.refresh_with(None, || unreachable!());
        assert!(!on() && !room.armed());
        assert_eq!(room.attached_late(), None);
        assert_eq!(table(), WgSites::default());
        room.poll(&mut bench.poll());
        let out = bench.families(&room);
        let changes = out
            .iter()
            .find(|f| f.name() == "bufscope_wireguard_hook_changes_total")
            .unwrap();
        let got: Vec<f64> = changes
            .get_metric()
            .iter()
            .map(|m| m.get_counter().get_value())
            .collect();
        assert_eq!(got, vec![1.0, 1.0], "one arm, one disarm");
    }
}
