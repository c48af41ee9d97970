//! Per-program cost from the kernel's own counters: `run_time_ns` and `run_cnt` of every BPF
//! program a process holds, with `kernel.bpf_stats_enabled=1` for the duration.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::Context as _;
use bufscope_testkit::{cmd_output, held_bpf_ids};

/// Sets `kernel.bpf_stats_enabled=1` and restores the previous value when dropped.
pub(super) struct BpfStats {
    pub(super) previous: String,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    pub(super) fn enable() -> anyhow::Result<Self> {
        let previous = std::fs::read_to_string(BPF_STATS)
            .context("reading kernel.bpf_stats_enabled")?
            .trim()
            .to_string();
        std::fs::write(BPF_STATS, "1").context("setting kernel.bpf_stats_enabled=1")?;
        Ok(Self { previous })
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(BPF_STATS, &self.previous) {
            eprintln!(
                "bench overhead: could not restore kernel.bpf_stats_enabled={}: {e}",
                self.previous
            );
        }
    }
}

/// One program's counters, from `bpftool prog show id N`.
#[derive(Clone, Debug, Default)]
pub(super) struct ProgStat {
    pub(super) name: String,
    pub(super) run_time_ns: u64,
    pub(super) run_cnt: u64,
}

fn prog_stat(id: u32) -> anyhow::Result<ProgStat> {
    let text = cmd_output(Command::new("bpftool").args(["prog", "show", "id", &id.to_string()]))?;
    let toks: Vec<&str> = text.split_whitespace().collect();
    let after = |key: &str| {
        toks.iter()
            .position(|t| *t == key)
            .and_then(|i| toks.get(i + 1))
            .map(|s| s.to_string())
    };
    Ok(ProgStat {
        name: after("name").unwrap_or_default(),
        run_time_ns: after("run_time_ns")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        run_cnt: after("run_cnt").and_then(|v| v.parse().ok()).unwrap_or(0),
    })
}

/// Counters of every program `pid` holds (program and link fds both name their `prog_id` in
/// `/proc/<pid>/fdinfo`), by program id.
pub(super) fn snapshot(pid: u32) -> anyhow::Result<BTreeMap<u32, ProgStat>> {
    held_bpf_ids(pid, "prog_id:")?
        .into_iter()
        .map(|id| Ok((id, prog_stat(id)?)))
        .collect()
}

/// (run_time_ns, run_cnt) added between two snapshots, summed over programs `pick` accepts.
pub(super) fn delta(
    before: &BTreeMap<u32, ProgStat>,
    after: &BTreeMap<u32, ProgStat>,
    pick: impl Fn(&ProgStat) -> bool,
) -> (u64, u64) {
    let mut t = (0, 0);
    for (id, a) in after {
        if !pick(a) {
            continue;
        }
        let b = before.get(id).cloned().unwrap_or_default();
        t.0 += a.run_time_ns.saturating_sub(b.run_time_ns);
        t.1 += a.run_cnt.saturating_sub(b.run_cnt);
    }
    t
}
