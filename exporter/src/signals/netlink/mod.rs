//! Netlink overruns: messages the kernel dropped for a netlink socket whose receive buffer was
//! full — route, link and XFRM events an IKE daemon, a routing daemon or a CNI agent never
//! got (`netlink_overrun`: the reader sees `ENOBUFS` once and must resync).
//!
//! No hook fires per overrun on any kernel: a broadcast that finds a full socket keeps its
//! skb for the next listener (no `kfree_skb`/`consume_skb` per drop), `netlink_overrun` is
//! static and inlined, and there is no tracepoint in `af_netlink.c` but `netlink_extack`. The
//! only record is the socket's own counter, the `Drops` column of `/proc/net/netlink`. So the
//! probe is [`Hook::Procfs`]: every poll reads that table once per network namespace (through
//! a process living in it, [`namespaces`]), turns each socket's `Drops` into deltas and gives
//! them to the process that holds the socket (the shared attribution, by socket inode).
//!
//! Exact: the deltas are the kernel's own count, per socket. Not seen: overruns of a socket
//! that was created and closed between two polls, and of sockets in a namespace no process
//! lives in. A socket already there when bufscope starts counts from then on; one that
//! appears later counts from its creation.

pub mod namespaces;
pub mod sockopt;
pub mod table;

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashSet, HashSetExt as _};
use prometheus::proto::MetricFamily;

use super::{AdviceCx, BuildCx, NoFlags, Part, PollCx, Room, Services, Signal};
use crate::advice::{Inputs, NetlinkView};
use crate::attribution::Cause;
use crate::bpf::{Hook, LoadPlan, ProbeSpec};
use crate::exposition::Spec;
use crate::store::{ProcRef, Who};
use crate::totals::Total;
use bufscope_common::total_family;

use namespaces::Namespaces;
use table::Row;

/// The probe: the kernel's per-socket counter, read from procfs.
pub const PROBE: ProbeSpec = ProbeSpec {
    name: "netlink",
    what: "netlink overruns (messages dropped on a full receive buffer, ENOBUFS) per socket, from each network namespace's /proc/<pid>/net/netlink Drops column (no kernel hook fires per overrun)",
    variants: &[&[Hook::Procfs {
        file: "net/netlink",
    }]],
    is_drop_probe: false,
    attributed: true,
};

/// How often the receive buffer of a socket that keeps overrunning is read again.
pub const INFO_REFRESH: Duration = Duration::from_secs(30);

/// How much history per socket is kept for rates.
const HISTORY: Duration = crate::advice::MAX_WINDOW;

const OVERRUNS: Spec = Spec::counter(
    "bufscope_netlink_overruns_total",
    "Netlink messages the kernel dropped because the receiving socket's buffer was full (the Drops column of /proc/net/netlink; the reader got ENOBUFS), by the process holding the socket and netlink family.",
    &["family"],
);

const NAMESPACES: Spec = Spec::gauge(
    "bufscope_netlink_namespaces",
    "Network namespaces whose netlink table was read at the last poll.",
    &[],
);

/// What this signal adds to a process: overruns by netlink protocol.
#[derive(Clone, Debug, Default)]
pub struct ProcNetlink {
    /// Overruns by netlink protocol number (`NETLINK_ROUTE` = 0, …).
    pub overruns: BTreeMap<u16, u64>,
}

impl Part for ProcNetlink {
    fn absorb(&mut self, o: &Self) {
        for (p, n) in &o.overruns {
            *self.overruns.entry(*p).or_default() += n;
        }
    }

    fn has_counts(&self) -> bool {
        self.overruns.values().any(|n| *n > 0)
    }

    fn status(&self, row: &mut bufscope_api::ProcessRow) {
        row.netlink_overruns = self.overruns.values().sum();
    }

    fn totals(&self, out: &mut Vec<Total>) {
        for (p, n) in &self.overruns {
            if let Ok(proto) = u8::try_from(*p) {
                out.push(Total {
                    family: total_family::NETLINK_OVERRUNS,
                    proto,
                    option: 0,
                    value: *n,
                });
            }
        }
    }

    fn restore(&mut self, t: &Total) {
        if t.family == total_family::NETLINK_OVERRUNS {
            *self.overruns.entry(u16::from(t.proto)).or_default() += t.value;
        }
    }
}

/// One netlink socket as the last poll saw it.
#[derive(Clone, Debug)]
pub struct Sock {
    /// Netlink protocol.
    pub protocol: u16,
    /// Its network namespace.
    pub netns: u32,
    /// Multicast groups (the first 32).
    pub groups: u32,
    /// Cumulative `Drops`.
    pub drops: u64,
    /// Of them, those bufscope counted (since its start or the socket's creation).
    pub counted: u64,
    /// Who its overruns went to.
    pub owner: Option<ProcRef>,
    /// Overruns read while its owner was being looked up: counted once the look-up answers.
    pub held: u64,
    /// Receive buffer and `NETLINK_NO_ENOBUFS`, when read.
    pub options: Option<sockopt::Options>,
    /// When `options` was last read (or tried).
    pub options_at: Option<Instant>,
    /// (time, cumulative drops) samples, for rates.
    pub history: VecDeque<(Instant, u64)>,
}

impl Sock {
    /// Overruns per second over the last `window`.
    pub fn rate(&self, window: Duration, now: Instant) -> f64 {
        let Some(&(t_last, last)) = self.history.back() else {
            return 0.0;
        };
        if now.duration_since(t_last) > window {
            return 0.0;
        }
        let since = now.checked_sub(window).unwrap_or(t_last);
        let base = self
            .history
            .iter()
            .rev()
            .find(|(t, _)| *t <= since)
            .or(self.history.front())
            .copied();
        match base {
            Some((t0, v0)) if last > v0 => {
                (last - v0) as f64 / now.duration_since(t0).as_secs_f64().max(1e-3)
            }
            _ => 0.0,
        }
    }
}

/// What one poll's tables change: the sockets that overran since the last poll (inode,
/// new overruns) and those gone from a namespace that was read.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// (inode, overruns since the last poll).
    pub counted: Vec<(u64, u64)>,
    /// Inodes no longer listed.
    pub gone: Vec<u64>,
}

/// Applies one poll's rows (`(netns, row)`, from the namespaces in `read`) to `socks`.
/// `baseline`: the first poll of this bufscope, whose sockets count from now on; a socket
/// first seen later was made since, and counts from its creation.
pub fn apply(
    socks: &mut HashMap<u64, Sock>,
    rows: &[(u32, Row)],
    read: &HashSet<u32>,
    baseline: bool,
    now: Instant,
) -> Changes {
    let mut out = Changes::default();
    let mut listed = HashSet::with_capacity(rows.len());
    for (netns, r) in rows {
        if r.inode == 0 {
            continue;
        }
        listed.insert(r.inode);
        match socks.get_mut(&r.inode) {
            Some(s) => {
                if r.drops > s.drops {
                    out.counted.push((r.inode, r.drops - s.drops));
                    s.counted += r.drops - s.drops;
                }
                let moved = r.drops != s.drops;
                s.drops = r.drops;
                s.groups = r.groups;
                record(&mut s.history, now, r.drops, moved);
            }
            None => {
                if !baseline && r.drops > 0 {
                    out.counted.push((r.inode, r.drops));
                }
                let mut history = VecDeque::new();
                history.push_back((now, if baseline { r.drops } else { 0 }));
                if !baseline && r.drops > 0 {
                    history.push_back((now, r.drops));
                }
                socks.insert(
                    r.inode,
                    Sock {
                        protocol: r.protocol,
                        netns: *netns,
                        groups: r.groups,
                        drops: r.drops,
                        counted: if baseline { 0 } else { r.drops },
                        owner: None,
                        held: 0,
                        options: None,
                        options_at: None,
                        history,
                    },
                );
            }
        }
    }
    out.gone = socks
        .iter()
        .filter(|(ino, s)| read.contains(&s.netns) && !listed.contains(*ino))
        .map(|(ino, _)| *ino)
        .collect();
    for ino in &out.gone {
        socks.remove(ino);
    }
    out
}

/// Adds a sample to a rate history (at most one per 10 s while it moves; older than
/// [`HISTORY`] forgotten).
fn record(h: &mut VecDeque<(Instant, u64)>, now: Instant, v: u64, moved: bool) {
    if moved || h.len() < 2 {
        let n = h.len();
        let recent = n >= 2 && now.duration_since(h[n - 2].0) < Duration::from_secs(10);
        match h.back_mut() {
            Some(last) if recent => *last = (now, v),
            _ => h.push_back((now, v)),
        }
    }
    while h.len() > 2
        && h.front()
            .is_some_and(|(t, _)| now.duration_since(*t) > HISTORY)
    {
        h.pop_front();
    }
}

/// The netlink room.
#[derive(Default)]
pub struct Netlink {
    ns: Namespaces,
    socks: HashMap<u64, Sock>,
    polled: bool,
    namespaces_read: usize,
}

impl Room for Netlink {
    const PROBE: ProbeSpec = PROBE;
    type Part = ProcNetlink;
    type Flags = NoFlags;
    type Setup = ();

    fn prepare(_flags: &NoFlags, plan: &mut LoadPlan) -> anyhow::Result<()> {
        // Nothing runs in the kernel: nothing to pin.
        plan.unpinned(PROBE.name);
        Ok(())
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

impl Netlink {
    /// Reads the receive buffer of `inode` (held by `owner`) when not read lately.
    fn refresh_options(&mut self, inode: u64, cx: &PollCx<'_>, now: Instant) {
        let Some(s) = self.socks.get_mut(&inode) else {
            return;
        };
        if s.options_at
            .is_some_and(|t| now.duration_since(t) < INFO_REFRESH)
        {
            return;
        }
        s.options_at = Some(now);
        let Some(owner) = s.owner else { return };
        let fd = cx
            .attr
            .procfs()
            .socket_fds(owner.tgid)
            .into_iter()
            .find(|(_, ino)| *ino == inode)
            .map(|(fd, _)| fd);
        let Some(fd) = fd else { return };
        match sockopt::read(owner.tgid, fd, inode) {
            Ok(o) => s.options = Some(o),
            Err(e) => tracing::debug!(inode, pid = owner.tgid, "netlink socket options: {e}"),
        }
    }
}

impl Signal for Netlink {
    fn name(&self) -> &'static str {
        PROBE.name
    }

    fn poll(&mut self, cx: &mut PollCx<'_>) -> bool {
        let now = Instant::now();
        let pids = cx.attr.pids_this_poll().to_vec();
        let reps = self.ns.refresh_from(cx.attr.procfs(), &pids, now);
        let mut rows = Vec::new();
        let mut read = HashSet::new();
        for (netns, pid) in reps {
            match cx.attr.procfs().read_text(pid, "net/netlink") {
                Some(text) => {
                    read.insert(netns);
                    rows.extend(table::parse(&text).into_iter().map(|r| (netns, r)));
                }
                None => self.ns.forget(pid),
            }
        }
        self.namespaces_read = read.len();
        let baseline = !self.polled;
        self.polled = true;
        // Overruns held for a look-up of a socket that is now gone go to `_unknown` below.
        let held_before: HashMap<u64, u64> = self
            .socks
            .iter()
            .filter(|(_, s)| s.held > 0)
            .map(|(i, s)| (*i, s.held))
            .collect();
        let changes = apply(&mut self.socks, &rows, &read, baseline, now);
        for ino in &changes.gone {
            if let Some(h) = held_before.get(ino) {
                cx.store.count_unknown(PROBE.name, *h);
            }
            cx.attr.forget_inode(*ino);
        }
        // New overruns, and those held at earlier polls (their look-up may have answered).
        let mut due: HashMap<u64, u64> = self
            .socks
            .iter()
            .filter(|(_, s)| s.held > 0)
            .map(|(i, _)| (*i, 0))
            .collect();
        for (ino, d) in &changes.counted {
            *due.entry(*ino).or_default() += d;
        }
        if due.is_empty() {
            return !changes.gone.is_empty();
        }
        let moved: HashSet<u64> = changes.counted.iter().map(|(i, _)| *i).collect();
        cx.attr.refresh_holders(&moved);
        cx.attr.apply_renames(cx.store);
        let unknown: HashSet<u64> = moved
            .iter()
            .filter(|i| cx.attr.lookup_inode(**i).is_none())
            .copied()
            .collect();
        cx.attr.resolve_inodes(Cause::Drops, &unknown);
        let mut counted_any = !changes.gone.is_empty();
        for (ino, d) in due {
            let Some(s) = self.socks.get_mut(&ino) else {
                continue;
            };
            let owner = cx.attr.lookup_inode(ino).or(s.owner);
            s.owner = owner;
            // Its owner is being looked up: the overruns wait for the answer (no `_unknown`
            // for a socket whose owner is found a poll later).
            if owner.is_none() && cx.attr.pending(ino) {
                s.held += d;
                continue;
            }
            let d = d + std::mem::take(&mut s.held);
            if d == 0 {
                continue;
            }
            counted_any = true;
            let protocol = s.protocol;
            if owner.is_none() {
                cx.store.count_unknown(PROBE.name, d);
            }
            let attr = &*cx.attr;
            *cx.store
                .proc_mut(owner.map_or(Who::Unknown, Who::Proc), || {
                    owner.map(|p| attr.meta(&p)).unwrap_or_default()
                })
                .parts
                .netlink
                .overruns
                .entry(protocol)
                .or_default() += d;
            self.refresh_options(ino, cx, now);
        }
        counted_any
    }

    fn referenced(&self, out: &mut foldhash::HashSet<ProcRef>) {
        out.extend(self.socks.values().filter_map(|s| s.owner));
    }

    fn advise(&self, cx: &AdviceCx<'_>, inputs: &mut Inputs) {
        inputs.netlink.extend(
            self.socks
                .iter()
                .filter(|(_, s)| s.owner.is_some() && s.counted > 0)
                .map(|(ino, s)| NetlinkView {
                    owner: s.owner,
                    inode: *ino,
                    netns: s.netns,
                    protocol: s.protocol,
                    groups: s.groups,
                    overruns: s.counted,
                    rate: s.rate(cx.window, cx.now),
                    rcvbuf: s.options.map(|o| o.rcvbuf),
                    no_enobufs: s.options.map(|o| o.no_enobufs),
                }),
        );
    }

    fn families(&self, procs: &[super::Row], out: &mut Vec<MetricFamily>) {
        OVERRUNS.per_process(procs, out, |s, emit| {
            for (p, n) in &s.parts.netlink.overruns {
                emit(&[&table::family_name(*p)], *n as f64);
            }
        });
        let mut f = NAMESPACES.family();
        f.push(&[], self.namespaces_read as f64);
        f.done(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foldhash::HashMapExt as _;

    fn row(inode: u64, protocol: u16, drops: u64) -> Row {
        Row {
            protocol,
            portid: 1,
            groups: 0x41,
            rmem: 0,
            drops,
            inode,
        }
    }

    #[test]
    fn first_poll_is_the_baseline_later_sockets_count_from_birth() {
        let mut socks = HashMap::new();
        let t0 = Instant::now();
        let read = HashSet::from_iter([7]);
        let c = apply(&mut socks, &[(7, row(1, 0, 500))], &read, true, t0);
        assert!(
            c.counted.is_empty(),
            "overruns before bufscope are not claimed"
        );
        let t1 = t0 + Duration::from_secs(1);
        let c = apply(
            &mut socks,
            &[(7, row(1, 0, 520)), (7, row(2, 6, 30))],
            &read,
            false,
            t1,
        );
        assert_eq!(c.counted, vec![(1, 20), (2, 30)]);
        assert!(c.gone.is_empty());
        let t2 = t1 + Duration::from_secs(1);
        let c = apply(&mut socks, &[(7, row(2, 6, 30))], &read, false, t2);
        assert!(c.counted.is_empty());
        assert_eq!(c.gone, vec![1], "closed");
        assert!(!socks.contains_key(&1));
    }

    #[test]
    fn a_namespace_not_read_keeps_its_sockets() {
        let mut socks = HashMap::new();
        let t0 = Instant::now();
        apply(
            &mut socks,
            &[(7, row(1, 0, 0)), (8, row(2, 0, 0))],
            &HashSet::from_iter([7, 8]),
            true,
            t0,
        );
        let c = apply(
            &mut socks,
            &[(7, row(1, 0, 3))],
            &HashSet::from_iter([7]),
            false,
            t0 + Duration::from_secs(1),
        );
        assert_eq!(c.counted, vec![(1, 3)]);
        assert!(c.gone.is_empty(), "namespace 8 was not read this poll");
        assert!(socks.contains_key(&2));
    }

    #[test]
    fn rate_over_the_window() {
        let mut socks = HashMap::new();
        let t0 = Instant::now();
        let read = HashSet::from_iter([1]);
        apply(&mut socks, &[(1, row(9, 0, 0))], &read, true, t0);
        for i in 1..=30u64 {
            apply(
                &mut socks,
                &[(1, row(9, 0, i * 100))],
                &read,
                false,
                t0 + Duration::from_secs(i),
            );
        }
        let s = &socks[&9];
        let r = s.rate(Duration::from_secs(60), t0 + Duration::from_secs(30));
        assert!((r - 100.0).abs() < 1.0, "{r}");
        assert_eq!(
            s.rate(Duration::from_secs(10), t0 + Duration::from_secs(100)),
            0.0,
            "quiet for longer than the window"
        );
    }

    #[test]
    fn totals_round_trip() {
        let mut p = ProcNetlink::default();
        p.overruns.insert(0, 5991);
        p.overruns.insert(6, 3);
        let mut kept = Vec::new();
        p.totals(&mut kept);
        let mut back = ProcNetlink::default();
        for t in &kept {
            back.restore(t);
        }
        assert_eq!(back.overruns, p.overruns);
    }
}
