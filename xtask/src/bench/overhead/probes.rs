//! Section 1: cost per event of each probe vs bpftrace.

use std::fmt::Write as _;

use super::Args;
use super::bpf_stats::{BpfStats, delta, snapshot};
use super::harness::{Bins, Bpftrace, median};
use super::hooks::{Hook, SameData, hooks, same_data};
use super::loads::Load;
use crate::bench::table;

/// Runs `load` once with each of `scripts` attached (all at once, no bufscope); the
/// (run_time_ns, run_cnt) each script's programs added meanwhile, in the order of `scripts`.
fn bpftrace_phase(scripts: &[&str], load: Load, bins: &Bins) -> anyhow::Result<Vec<(u64, u64)>> {
    let tracers: Vec<Bpftrace> = scripts
        .iter()
        .map(|s| Bpftrace::start(s))
        .collect::<anyhow::Result<_>>()?;
    let before: Vec<_> = tracers
        .iter()
        .map(|t| snapshot(t.pid()))
        .collect::<anyhow::Result<_>>()?;
    load.run(bins)?;
    tracers
        .iter()
        .zip(&before)
        .map(|(t, b)| Ok(delta(b, &snapshot(t.pid())?, |_| true)))
        .collect()
}

/// ns/event and events of one phase.
type Sample = (f64, u64);

pub(super) fn section(a: &Args, bins: &Bins) -> anyhow::Result<String> {
    let loads: Vec<Load> = a.loads.iter().filter_map(|l| Load::parse(l)).collect();
    let hooks: Vec<Hook> = hooks()?
        .into_iter()
        .filter(|h| loads.contains(&h.load))
        .collect();
    let same: Vec<SameData> = same_data()
        .into_iter()
        .filter(|d| loads.contains(&d.load))
        .collect();
    let _stats = BpfStats::enable()?;
    let mut ours: Vec<Vec<Sample>> = vec![Vec::new(); hooks.len()];
    let mut theirs: Vec<Vec<Sample>> = vec![Vec::new(); hooks.len()];
    let mut alike: Vec<Vec<f64>> = vec![Vec::new(); same.len()];
    for load in loads {
        let idx: Vec<usize> = (0..hooks.len())
            .filter(|i| hooks[*i].load == load)
            .collect();
        for run in 0..a.runs {
            let sdx: Vec<usize> = (0..same.len()).filter(|i| same[*i].load == load).collect();
            // The order of bufscope, the one-liners and the same-data scripts rotates per run.
            let order = [[0, 1, 2], [1, 2, 0], [2, 0, 1]][run % 3];
            for side in order {
                if side == 2 && sdx.is_empty() {
                    continue;
                }
                eprintln!(
                    "bench overhead: probes: {} run {}/{} {}",
                    load.label(),
                    run + 1,
                    a.runs,
                    [
                        "bufscope",
                        "bpftrace one-liners",
                        "bpftrace same-data scripts"
                    ][side]
                );
                if side == 2 {
                    let scripts: Vec<&str> = sdx.iter().map(|i| same[*i].script.as_str()).collect();
                    for (i, (tt, n)) in sdx.iter().zip(bpftrace_phase(&scripts, load, bins)?) {
                        let events = n as f64 / same[*i].runs_per_event;
                        alike[*i].push(tt as f64 / events.max(1.0));
                    }
                    continue;
                }
                if side == 0 {
                    let e = bins.exporter(&[])?;
                    let before = snapshot(e.pid())?;
                    load.run(bins)?;
                    let after = snapshot(e.pid())?;
                    for i in &idx {
                        let name = hooks[*i].bufscope_prog;
                        let (t, n) = delta(&before, &after, |p| {
                            !p.name.is_empty() && name.starts_with(&p.name)
                        });
                        ours[*i].push((t as f64 / n.max(1) as f64, n));
                    }
                } else {
                    let scripts: Vec<&str> =
                        idx.iter().map(|i| hooks[*i].bpftrace.as_str()).collect();
                    for (i, (tt, n)) in idx.iter().zip(bpftrace_phase(&scripts, load, bins)?) {
                        theirs[*i].push((tt as f64 / n.max(1) as f64, n));
                    }
                }
            }
        }
    }
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for (i, h) in hooks.iter().enumerate() {
        let o = median(&ours[i].iter().map(|s| s.0).collect::<Vec<_>>());
        let t = median(&theirs[i].iter().map(|s| s.0).collect::<Vec<_>>());
        let n = median(&ours[i].iter().map(|s| s.1 as f64).collect::<Vec<_>>());
        let ratio = o / t;
        rows.push(vec![
            h.load.label().to_string(),
            format!("`{}`", h.event),
            h.key.to_string(),
            format!("{n:.0}"),
            format!("{o:.0}"),
            format!("{t:.0}"),
            format!("{ratio:.2}×"),
        ]);
        let drop_path = matches!(h.load, Load::UdpDrops);
        let ok = ratio <= 1.0 && (!drop_path || o <= 100.0);
        notes.push(format!(
            "- `{}`: {o:.0} ns/event vs bpftrace {t:.0} ({ratio:.2}×; target ≤ 1.0×{}) {}",
            h.event,
            if drop_path { ", ≤ 100 ns" } else { "" },
            if ok { "✓" } else { "✗" }
        ));
    }
    let mut out = String::from("### Cost per event\n\n");
    out.push_str(&table(
        &[
            "workload",
            "event",
            "counted by",
            "events/run",
            "bufscope ns/event",
            "bpftrace ns/event",
            "bufscope ÷ bpftrace",
        ],
        &rows,
    ));
    out.push_str("\n\nTargets (probe cost per event, syscall tax, data path):\n");
    out.push_str(&notes.join("\n"));
    out.push_str("\n\nbpftrace one-liners (same run, own phases):\n\n");
    for h in &hooks {
        let _ = writeln!(out, "- `{}`: `bpftrace -e '{}'`", h.event, h.bpftrace);
    }
    if !same.is_empty() {
        let mut rows = Vec::new();
        for (i, d) in same.iter().enumerate() {
            let o: f64 = d
                .progs
                .iter()
                .filter_map(|p| hooks.iter().position(|h| h.bufscope_prog == *p))
                .map(|h| median(&ours[h].iter().map(|s| s.0).collect::<Vec<_>>()))
                .sum();
            let t = median(&alike[i]);
            rows.push(vec![
                d.load.label().to_string(),
                d.what.to_string(),
                format!("{o:.0}"),
                format!("{t:.0}"),
                format!("{:.2}×", o / t),
            ]);
        }
        out.push_str(
            "\n### Same data\n\nThe one-liners above count; bufscope's setsockopt, TCP-state, \
             owner and autotune probes also read the socket's state and keep it (or its owner) in \
             maps, and the setsockopt and TCP-state probes send one ring-buffer record per event. \
             Each bpftrace script below does that same work (the same reads and map updates, and \
             one `printf` record where bufscope sends one), measured in its own phase of the same \
             run:\n\n",
        );
        out.push_str(&table(
            &[
                "workload",
                "per",
                "bufscope ns",
                "bpftrace same-data ns",
                "bufscope ÷ bpftrace",
            ],
            &rows,
        ));
        out.push_str("\n\nScripts:\n\n");
        for d in &same {
            let _ = writeln!(out, "- {}: `bpftrace -e '{}'`", d.what, d.script);
        }
    }
    Ok(out)
}
