//! The probes' `STATS` per-CPU array: loss counters (a full map or ring buffer) and the
//! generations rooms compare to skip reading maps that did not change.

use bufscope_common::{maps, stat};

use super::table::{PerCpuSlots, PerCpuTable};

/// The loss slots and the `cause` label of `bufscope_bpf_events_lost_total` each has (declared
/// with the slots themselves).
const LOST: &[(u32, &str)] = stat::LOSSES;

/// The `STATS` map.
pub struct Stats {
    map: PerCpuTable<u32, u64>,
}

impl Stats {
    /// Wraps the map (the kernel's, or a fake in tests).
    pub fn new(map: PerCpuTable<u32, u64>) -> Self {
        Self { map }
    }

    /// Takes `STATS` out of the loaded object.
    pub fn take(ebpf: &mut aya::Ebpf) -> anyhow::Result<Self> {
        Ok(Self::new(PerCpuSlots::take(ebpf, maps::STATS)?))
    }

    /// One slot ([`stat`]) summed over CPUs (None when the map cannot be read).
    pub fn total(&self, idx: u32) -> Option<u64> {
        Some(self.map.get(&idx)?.iter().sum())
    }

    /// Every loss counter by cause (0 when unreadable).
    pub fn lost(&self) -> Vec<(&'static str, u64)> {
        LOST.iter()
            .map(|(idx, name)| (*name, self.total(*idx).unwrap_or(0)))
            .collect()
    }
}

/// The kernel's run-time stats of the probes' programs (`--bpf.run-stats`): `run_time_ns` and
/// `run_cnt` of each program, summed per probe. The kernel counts them only while some process
/// holds stats enabled (`BPF_ENABLE_STATS`, which this holds) or `kernel.bpf_stats_enabled=1`,
/// and then every program on the machine pays two clock reads per run.
pub struct RunStats {
    /// Keeps the kernel counting (None: `kernel.bpf_stats_enabled=1` does).
    _enabled: Option<std::os::fd::OwnedFd>,
    /// Each probe's programs, each program once (under the first probe that runs it).
    progs: Vec<(&'static str, aya::programs::ProgramFd)>,
}

/// `kernel.bpf_stats_enabled`.
const BPF_STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl RunStats {
    /// Turns the kernel's run-time stats on: the fd that holds them on, or None when
    /// `kernel.bpf_stats_enabled=1` already does (the error names the fix otherwise).
    fn enable() -> Result<Option<std::os::fd::OwnedFd>, String> {
        match super::sys::enable_run_time_stats() {
            Ok(fd) => Ok(Some(fd)),
            Err(_) if std::fs::read_to_string(BPF_STATS_SYSCTL).is_ok_and(|v| v.trim() == "1") => {
                Ok(None)
            }
            Err(e) => Err(format!(
                "--bpf.run-stats: the kernel refused to count BPF run time ({e}): \
                 BPF_ENABLE_STATS needs CAP_SYS_ADMIN; without it set kernel.bpf_stats_enabled=1 \
                 on the node (sysctl), or drop the flag"
            )),
        }
    }

    /// Whether [`RunStats::start`] can turn the stats on (checked before anything is loaded).
    pub fn check() -> Result<(), String> {
        Self::enable().map(drop)
    }

    /// Turns the kernel's run-time stats on and finds the programs of every attached probe:
    /// loaded by this run, or adopted from the pins (through their pinned links).
    pub fn start(probes: &super::Probes) -> anyhow::Result<Self> {
        let enabled = Self::enable().map_err(anyhow::Error::msg)?;
        let mut seen = foldhash::HashSet::default();
        let mut progs = Vec::new();
        for st in probes.status.iter().filter(|s| s.attached) {
            let Some(hooks) = st.spec.variants.get(st.variant) else {
                continue;
            };
            for (n, hook) in hooks.iter().enumerate() {
                if matches!(hook, super::Hook::Procfs { .. }) {
                    continue;
                }
                let info = probes
                    .ebpf
                    .program(hook.prog())
                    .and_then(|p| p.info().ok())
                    .or_else(|| {
                        let path = probes.pins.as_ref()?.link_path(st.spec.name, n);
                        let link = aya::programs::links::PinnedLink::from_pin(path).ok()?;
                        let id = aya::programs::links::FdLink::from(link)
                            .info()
                            .ok()?
                            .program_id();
                        aya::programs::loaded_programs()
                            .filter_map(Result::ok)
                            .find(|p| p.id() == id)
                    });
                let Some(info) = info else {
                    tracing::debug!(probe = st.spec.name, hook = %hook.describe(), "no program to read run time of");
                    continue;
                };
                if seen.insert(info.id())
                    && let Ok(fd) = info.fd()
                {
                    progs.push((st.spec.name, fd));
                }
            }
        }
        Ok(Self {
            _enabled: enabled,
            progs,
        })
    }

    /// (probe, run time ns, runs) per probe with programs, in probe order.
    pub fn read(&self) -> Vec<(&'static str, u64, u64)> {
        use std::os::fd::AsFd as _;
        let mut out: Vec<(&'static str, u64, u64)> = Vec::new();
        for (probe, fd) in &self.progs {
            let Ok((ns, runs)) = super::sys::prog_run_stats(fd.as_fd()) else {
                continue;
            };
            match out.iter_mut().find(|(p, _, _)| p == probe) {
                Some(row) => {
                    row.1 += ns;
                    row.2 += runs;
                }
                None => out.push((probe, ns, runs)),
            }
        }
        out
    }
}
