//! IPsec (XFRM) errors per network namespace and reason: ESP is consumed inside the kernel,
//! only IKE reaches a socket, so an IPsec gateway's data-plane losses show only as the
//! namespace's `/proc/net/xfrm_stat` counters (`XfrmInNoStates`, `XfrmInStateSeqError`,
//! `XfrmOutPolBlock`, …). The kernel keeps them per namespace (`CONFIG_XFRM_STATISTICS`,
//! which every distribution kernel of the matrix has); a drop reason exists only for
//! policy checks (`XFRM_POLICY`), far coarser, so the probe reads the counters
//! ([`Hook::Procfs`]) through a process of each namespace and turns them into deltas.
//!
//! The owner: the IKE daemon of a namespace is the process holding an `NETLINK_XFRM` socket
//! bound to XFRM multicast groups there (strongSwan's charon and libreswan's pluto listen for
//! acquires and expires), else one holding a `PF_KEY` socket (`/proc/net/pfkey`). It is named
//! by `bufscope_xfrm_daemon_info` and gets the finding.
//!
//! Exact: the deltas are the kernel's counters. A namespace already there at bufscope's first
//! read counts from then on; one that appears later counts from its creation (the kernel
//! starts its counters at zero). Not seen: namespaces no process lives in.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashSet};
use prometheus::proto::MetricFamily;

use super::netlink::namespaces::Namespaces;
use super::netlink::table;
use super::{AdviceCx, BuildCx, NoFlags, PollCx, Room, Services, Signal};
use crate::advice::{Inputs, XfrmView};
use crate::attribution::Cause;
use crate::bpf::{Hook, LoadPlan, ProbeSpec};
use crate::exposition::Spec;
use crate::store::{ProcMeta, ProcRef};

/// The probe: the kernel's per-namespace counters, read from procfs.
pub const PROBE: ProbeSpec = ProbeSpec {
    name: "xfrm",
    what: "IPsec (XFRM) errors per network namespace and reason, from each namespace's /proc/<pid>/net/xfrm_stat, with the IKE daemon holding its NETLINK_XFRM or PF_KEY socket",
    variants: &[&[Hook::Procfs {
        file: "net/xfrm_stat",
    }]],
    is_drop_probe: false,
    attributed: false,
};

/// At most this many namespaces have series (beyond, the one counting least recently is folded
/// into `netns="_other"`).
pub const MAX_NAMESPACES: usize = 1024;

/// How often the daemon of a namespace with errors is looked for again.
const OWNER_REFRESH: Duration = Duration::from_secs(10);

/// `NETLINK_XFRM`.
const NETLINK_XFRM: u16 = 6;

const ERRORS: Spec = Spec::counter(
    "bufscope_xfrm_errors_total",
    "IPsec (XFRM) errors counted by the kernel per network namespace (/proc/net/xfrm_stat), by reason.",
    &["netns", "reason"],
);

const DAEMON: Spec = Spec::gauge(
    "bufscope_xfrm_daemon_info",
    "The IKE daemon of a network namespace with XFRM errors: the program (its identity, as on the per-process families; join bufscope_process_info on it for the pid) holding a NETLINK_XFRM socket bound to XFRM groups (else a PF_KEY socket) there.",
    &[
        "netns",
        "comm",
        "container",
        "pod",
        "namespace",
        "container_name",
        "cgroup",
    ],
);

/// Parses `/proc/net/xfrm_stat` (`XfrmInError   0` per line).
pub fn parse(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let name = f.next()?;
            let v = f.next()?.parse().ok()?;
            name.starts_with("Xfrm").then(|| (name.to_string(), v))
        })
        .collect()
}

/// One namespace's counters and what bufscope counted of them.
#[derive(Clone, Debug, Default)]
pub struct Netns {
    /// The kernel's counters at the last read.
    pub last: BTreeMap<String, u64>,
    /// Counted by bufscope (since its first read, or the namespace's creation), by reason.
    pub counted: BTreeMap<String, u64>,
    /// (time, counted of every reason) samples for rates, per reason.
    pub history: BTreeMap<String, Vec<(Instant, u64)>>,
    /// When a count last moved.
    pub changed: Option<Instant>,
    /// Whether a process of it was seen at the last poll.
    pub alive: bool,
    /// Its IKE daemon, when one was found, with its labels.
    pub owner: Option<(ProcRef, ProcMeta)>,
    /// When the daemon was last looked for.
    pub owner_at: Option<Instant>,
    /// Whether a look-up of its daemon's sockets has not answered yet (looked for again at
    /// the next poll, counts moving or not).
    pub owner_pending: bool,
}

/// Applies one read of a namespace's counters: returns the increments (reason, n).
/// `baseline`: the first read of this bufscope (counts from now on); a namespace first seen
/// later was made since (counts from its creation).
pub fn apply(
    ns: &mut Netns,
    now_counters: BTreeMap<String, u64>,
    baseline: bool,
) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let first = ns.last.is_empty();
    for (reason, v) in &now_counters {
        let before = match ns.last.get(reason) {
            Some(b) => *b,
            None if first && baseline => *v,
            None => 0,
        };
        // A counter below its last value: a new namespace with a reused inode.
        let d = if *v >= before { v - before } else { *v };
        if d > 0 {
            out.push((reason.clone(), d));
        }
    }
    ns.last = now_counters;
    out
}

/// The XFRM room.
#[derive(Default)]
pub struct Xfrm {
    ns: Namespaces,
    series: HashMap<u32, Netns>,
    other: BTreeMap<String, u64>,
    polled: bool,
}

impl Room for Xfrm {
    const PROBE: ProbeSpec = PROBE;
    type Part = ();
    type Flags = NoFlags;
    type Setup = ();

    fn prepare(_flags: &NoFlags, plan: &mut LoadPlan) -> anyhow::Result<()> {
        plan.unpinned(PROBE.name);
        Ok(())
    }

    /// Whether this kernel keeps the counters (offline too, from its BTF).
    fn check(kernel: &crate::kernel::KernelBtf) -> Vec<super::CheckLine> {
        let ok = kernel.has_func("xfrm_statistics_seq_show");
        vec![super::CheckLine {
            ok,
            what: "xfrm statistics",
            detail: if ok {
                "CONFIG_XFRM_STATISTICS: each namespace's /proc/net/xfrm_stat is read (no hook \
                 fires per XFRM error; the kernel's counters are exact)"
                    .into()
            } else {
                "the kernel's BTF has no xfrm_statistics_seq_show (CONFIG_XFRM_STATISTICS off): \
                 no XFRM error counters to read"
                    .into()
            },
        }]
    }

    fn take(
        _setup: (),
        _ebpf: &mut aya::Ebpf,
        env: &BuildCx<'_>,
        _services: &mut Services,
    ) -> anyhow::Result<Option<Box<dyn Signal>>> {
        Ok(env
            .attached(PROBE.name)
            .then(|| Box::new(Self::default()) as Box<dyn Signal>))
    }
}

impl Xfrm {
    /// The IKE daemon of namespace `netns` (read through `pid`): the holder of an XFRM
    /// netlink socket bound to groups, else of any XFRM netlink socket, else of a PF_KEY one.
    /// Also says whether a look-up for one of those sockets is still pending.
    fn find_owner(cx: &mut PollCx<'_>, pid: u32) -> (Option<ProcRef>, bool) {
        let procfs = cx.attr.procfs();
        let rows = procfs
            .read_text(pid, "net/netlink")
            .map(|t| table::parse(&t))
            .unwrap_or_default();
        let mut candidates: Vec<u64> = rows
            .iter()
            .filter(|r| r.protocol == NETLINK_XFRM && r.groups != 0 && r.inode != 0)
            .map(|r| r.inode)
            .collect();
        candidates.extend(
            rows.iter()
                .filter(|r| r.protocol == NETLINK_XFRM && r.groups == 0 && r.inode != 0)
                .map(|r| r.inode),
        );
        if let Some(t) = procfs.read_text(pid, "net/pfkey") {
            // sk RefCnt Rmem Wmem User Inode
            candidates.extend(
                t.lines()
                    .skip(1)
                    .filter_map(|l| l.split_whitespace().nth(5)?.parse::<u64>().ok())
                    .filter(|i| *i != 0),
            );
        }
        if candidates.is_empty() {
            return (None, false);
        }
        let wanted: HashSet<u64> = candidates.iter().copied().collect();
        cx.attr.resolve_inodes(Cause::Holders, &wanted);
        let found = candidates.iter().find_map(|i| cx.attr.lookup_inode(*i));
        let pending = found.is_none() && candidates.iter().any(|i| cx.attr.pending(*i));
        (found, pending)
    }

    /// Folds the namespace counting least recently into `_other` while over the bound.
    fn bound(&mut self) {
        while self.series.len() > MAX_NAMESPACES {
            let Some(victim) = self
                .series
                .iter()
                .min_by_key(|(_, n)| n.changed)
                .map(|(k, _)| *k)
            else {
                return;
            };
            if let Some(n) = self.series.remove(&victim) {
                for (r, v) in n.counted {
                    *self.other.entry(r).or_default() += v;
                }
            }
        }
    }
}

impl Signal for Xfrm {
    fn name(&self) -> &'static str {
        PROBE.name
    }

    fn poll(&mut self, cx: &mut PollCx<'_>) -> bool {
        let now = Instant::now();
        let pids = cx.attr.pids_this_poll().to_vec();
        let reps = self.ns.refresh_from(cx.attr.procfs(), &pids, now);
        let baseline = !self.polled;
        self.polled = true;
        for n in self.series.values_mut() {
            n.alive = false;
        }
        let mut moved = false;
        for (netns, pid) in reps {
            let Some(text) = cx.attr.procfs().read_text(pid, "net/xfrm_stat") else {
                self.ns.forget(pid);
                continue;
            };
            let counters = parse(&text);
            let n = self.series.entry(netns).or_default();
            n.alive = true;
            let inc = apply(n, counters, baseline);
            let waiting = n.owner_pending;
            if !inc.is_empty() {
                moved = true;
                n.changed = Some(now);
            }
            let look = waiting
                || (!inc.is_empty()
                    && n.owner_at
                        .is_none_or(|t| now.duration_since(t) >= OWNER_REFRESH));
            for (reason, d) in inc {
                let total = n.counted.entry(reason.clone()).or_default();
                *total += d;
                let h = n.history.entry(reason).or_default();
                h.push((now, *total));
                h.retain(|(t, _)| now.duration_since(*t) <= crate::advice::MAX_WINDOW);
            }
            if look {
                let (found, pending) = Self::find_owner(cx, pid);
                let found = found.map(|p| (p, cx.attr.meta(&p)));
                if let Some(n) = self.series.get_mut(&netns) {
                    n.owner_pending = pending;
                    if !pending {
                        n.owner_at = Some(now);
                    }
                    moved |= waiting && found.is_some();
                    let kept = n.owner.take().filter(|(p, _)| cx.attr.alive(p));
                    n.owner = found.or(kept);
                }
            }
        }
        // Namespaces without counts and without processes go; those with counts stay for
        // the retention (see gc).
        self.series.retain(|_, n| n.alive || !n.counted.is_empty());
        self.bound();
        moved
    }

    fn gc(&mut self, cx: &mut super::GcCx<'_>) -> usize {
        let now = Instant::now();
        let before = self.series.len();
        self.series.retain(|_, n| {
            n.alive
                || n.changed
                    .is_some_and(|t| now.duration_since(t) < cx.retention)
        });
        before - self.series.len()
    }

    fn referenced(&self, out: &mut foldhash::HashSet<ProcRef>) {
        out.extend(
            self.series
                .values()
                .filter_map(|n| n.owner.as_ref().map(|o| o.0)),
        );
    }

    fn advise(&self, cx: &AdviceCx<'_>, inputs: &mut Inputs) {
        for (netns, n) in &self.series {
            let Some((owner, _)) = n.owner.as_ref().map(|o| (o.0, ())) else {
                continue;
            };
            let window_start = cx.now.checked_sub(cx.window);
            let reasons = n
                .counted
                .iter()
                .map(|(r, total)| {
                    let h = n.history.get(r).map(Vec::as_slice).unwrap_or_default();
                    let base = h
                        .iter()
                        .rev()
                        .find(|(t, _)| window_start.is_some_and(|w| *t <= w))
                        .or(h.first());
                    let rate = match (base, h.last()) {
                        (Some((t0, v0)), Some((t1, v1)))
                            if v1 > v0 && cx.now.duration_since(*t1) <= cx.window =>
                        {
                            (v1 - v0) as f64 / cx.now.duration_since(*t0).as_secs_f64().max(1e-3)
                        }
                        _ => 0.0,
                    };
                    (r.clone(), *total, rate)
                })
                .collect();
            inputs.xfrm.push(XfrmView {
                owner,
                netns: *netns,
                reasons,
            });
        }
    }

    fn families(&self, _procs: &[super::Row], out: &mut Vec<MetricFamily>) {
        let mut f = ERRORS.family();
        let mut keys: Vec<&u32> = self.series.keys().collect();
        keys.sort_unstable();
        for ns in keys {
            let label = ns.to_string();
            for (reason, v) in &self.series[ns].counted {
                f.push(&[&label, reason], *v as f64);
            }
        }
        for (reason, v) in &self.other {
            f.push(&["_other", reason], *v as f64);
        }
        f.done(out);
        // The owners, labelled as the per-process families label identities (no pid).
        let mut f = DAEMON.family();
        for (ns, n) in &self.series {
            let Some((_, m)) = &n.owner else { continue };
            f.push(
                &[
                    &ns.to_string(),
                    &m.comm,
                    &m.container,
                    &m.pod,
                    &m.namespace,
                    &m.container_name,
                    &m.cgroup,
                ],
                1.0,
            );
        }
        f.done(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "XfrmInError             \t0\nXfrmInNoStates          \t3\nXfrmOutPolBlock         \t12\nXfrmOutNoQueueSpace     \t0\n";

    #[test]
    fn parses_the_counters() {
        let c = parse(SAMPLE);
        assert_eq!(c.len(), 4);
        assert_eq!(c["XfrmOutPolBlock"], 12);
        assert_eq!(c["XfrmInNoStates"], 3);
        assert!(parse("garbage\n").is_empty());
    }

    #[test]
    fn first_read_is_the_baseline_later_namespaces_count_from_zero() {
        let mut n = Netns::default();
        assert!(apply(&mut n, parse(SAMPLE), true).is_empty());
        let mut later = parse(SAMPLE);
        later.insert("XfrmOutPolBlock".into(), 20);
        assert_eq!(
            apply(&mut n, later, false),
            vec![("XfrmOutPolBlock".into(), 8)]
        );
        let mut fresh = Netns::default();
        let got = apply(&mut fresh, parse(SAMPLE), false);
        assert_eq!(
            got,
            vec![("XfrmInNoStates".into(), 3), ("XfrmOutPolBlock".into(), 12)],
            "a namespace made after the start counts from its creation"
        );
    }

    #[test]
    fn a_counter_that_went_back_is_a_new_namespace() {
        let mut n = Netns::default();
        apply(&mut n, parse(SAMPLE), true);
        let mut reset = parse(SAMPLE);
        reset.insert("XfrmOutPolBlock".into(), 2);
        assert_eq!(
            apply(&mut n, reset, false),
            vec![("XfrmOutPolBlock".into(), 2)]
        );
    }
}
