//! `bufscope_netns_drops_total`: drops this kernel's hooks cannot put on a socket, per network
//! namespace, bounded like the per-process series.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use prometheus::proto::MetricFamily;

use crate::exposition::Spec;
use crate::labels::Proto;

/// Most `bufscope_netns_drops_total` series (network namespace × proto × reason); beyond, the
/// least recently counting one is folded into `netns="_other"` (sums never go down).
pub const MAX_NETNS_SERIES: usize = 1024;
/// The `netns` key that stands for folded namespaces (rendered `_other`).
const NETNS_OTHER: u32 = u32::MAX;

/// One `bufscope_netns_drops_total` series.
#[derive(Clone, Copy, Debug)]
pub struct NetnsSeries {
    /// Drops so far.
    pub packets: u64,
    /// When it last counted.
    pub changed: Instant,
}

/// The `bufscope_netns_drops_total` series, bounded: a series leaves `retention` after its
/// last count once no process is in its namespace (as an exited process's), and at most
/// [`MAX_NETNS_SERIES`] exist.
#[derive(Default)]
pub struct NetnsDrops {
    series: BTreeMap<(u32, Proto, String), NetnsSeries>,
}

impl NetnsDrops {
    /// Counts `n` drops in `netns`.
    pub fn add(&mut self, netns: u32, proto: Proto, reason: String, n: u64, now: Instant) {
        let key = (netns, proto, reason);
        if !self.series.contains_key(&key) {
            // (`_other` counts against the bound too.)
            while self.series.len() >= MAX_NETNS_SERIES && self.fold_least_recent() {}
        }
        let s = self.series.entry(key).or_insert(NetnsSeries {
            packets: 0,
            changed: now,
        });
        s.packets += n;
        s.changed = now;
    }

    /// Folds the series that counted least recently into `netns="_other"` (false: nothing
    /// left to fold).
    fn fold_least_recent(&mut self) -> bool {
        let victim = self
            .series
            .iter()
            .filter(|((ns, _, _), _)| *ns != NETNS_OTHER)
            .min_by_key(|(_, s)| s.changed)
            .map(|(k, _)| k.clone());
        let Some(k) = victim else { return false };
        let Some(old) = self.series.remove(&k) else {
            return false;
        };
        let other = self
            .series
            .entry((NETNS_OTHER, k.1, k.2))
            .or_insert(NetnsSeries {
                packets: 0,
                changed: old.changed,
            });
        other.packets += old.packets;
        true
    }

    /// Forgets the series idle for `retention` whose namespace `alive` says is gone; returns
    /// how many went.
    pub fn expire(
        &mut self,
        retention: Duration,
        now: Instant,
        alive: impl Fn(u32) -> bool,
    ) -> usize {
        let before = self.series.len();
        self.series.retain(|(ns, _, _), s| {
            *ns == NETNS_OTHER || now.duration_since(s.changed) < retention || alive(*ns)
        });
        before - self.series.len()
    }

    /// Whether a series has been idle for `retention` (only then are namespaces looked up).
    pub fn any_idle(&self, retention: Duration, now: Instant) -> bool {
        self.series
            .iter()
            .any(|((ns, _, _), s)| *ns != NETNS_OTHER && now.duration_since(s.changed) >= retention)
    }

    /// Drops over every series.
    pub fn total(&self) -> u64 {
        self.series.values().map(|s| s.packets).sum()
    }

    /// Number of series.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

pub(super) const NETNS_DROPS: Spec = Spec::counter(
    "bufscope_netns_drops_total",
    "Buffer-full drops this kernel's hooks cannot put on a socket (no kfree_skb rx_sk, before 6.11), by network namespace and kernel drop reason.",
    &["netns", "proto", "reason"],
);

/// `bufscope_netns_drops_total{netns,proto,reason}`: drops this kernel's hooks cannot put on a
/// socket (no `kfree_skb.rx_sk`, before 6.11: e.g. TCP receive-queue drops), by the network
/// namespace of the receiving device (inode number as in `/proc/<pid>/ns/net`; 0 when the
/// skb had no device; `_other` for namespaces folded beyond [`MAX_NETNS_SERIES`]) and reason.
pub(super) fn netns_family(netns: &NetnsDrops, out: &mut Vec<MetricFamily>) {
    let mut f = NETNS_DROPS.family();
    for ((ns, proto, reason), s) in &netns.series {
        let label = if *ns == NETNS_OTHER {
            "_other".to_string()
        } else {
            ns.to_string()
        };
        f.push(&[&label, proto.as_str(), reason], s.packets as f64);
    }
    f.done(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netns_series_are_capped_and_sums_kept() {
        let mut n = NetnsDrops::default();
        let t0 = Instant::now();
        for i in 0..(MAX_NETNS_SERIES as u32 + 50) {
            let at = t0 + Duration::from_millis(i as u64);
            n.add(i + 1, Proto::Tcp, "TCP_ZEROWINDOW".into(), 2, at);
        }
        assert!(n.len() <= MAX_NETNS_SERIES, "{}", n.len());
        let total: u64 = n.series.values().map(|s| s.packets).sum();
        assert_eq!(
            total,
            2 * (MAX_NETNS_SERIES as u64 + 50),
            "folded, not lost"
        );
        assert!(
            n.series
                .contains_key(&(NETNS_OTHER, Proto::Tcp, "TCP_ZEROWINDOW".into()))
        );
        // The oldest went first: the newest namespace is still there.
        assert!(n.series.contains_key(&(
            MAX_NETNS_SERIES as u32 + 50,
            Proto::Tcp,
            "TCP_ZEROWINDOW".into()
        )));
    }

    #[test]
    fn netns_series_leave_with_their_namespace_after_the_retention() {
        let mut n = NetnsDrops::default();
        let t0 = Instant::now();
        n.add(7, Proto::Udp, "SOCKET_RCVBUFF".into(), 5, t0);
        n.add(8, Proto::Udp, "SOCKET_RCVBUFF".into(), 5, t0);
        let r = Duration::from_secs(60);
        assert!(!n.any_idle(r, t0 + Duration::from_secs(59)));
        assert_eq!(
            n.expire(r, t0 + Duration::from_secs(59), |_| false),
            0,
            "within retention"
        );
        assert!(n.any_idle(r, t0 + r));
        assert_eq!(n.expire(r, t0 + r, |ns| ns == 8), 1, "namespace 7 is gone");
        assert_eq!(n.len(), 1);
    }
}
