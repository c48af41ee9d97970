//! Whose drops: each socket's new drops go to its live holder, to the processes that read a
//! shared socket ([`super::shared`]), to a TUN device's reader, to a listener's owner, or,
//! after `--drops.attribution-hold`, to `comm="_unknown"`.

use std::time::Instant;

use bufscope_common::{DropKey, drop_site};
use foldhash::HashSet;

use super::{Drops, shared};
use crate::attribution::{Attributor, Cause};
use crate::labels::Proto;
use crate::signals::{PollCx, Store, counters_of, who_or_unknown};
use crate::store::{ProcRef, Who};

impl Drops {
    fn resolve(&self, k: &DropKey, attr: &mut Attributor) -> Option<ProcRef> {
        match k.site {
            drop_site::SOCKET => attr.lookup_inode(k.inode),
            drop_site::SOCKET_NO_INODE => attr.listener(k.netns, k.id as u16),
            drop_site::RETIRED => {
                let p = ProcRef {
                    tgid: k.id,
                    start_ticks: k.inode,
                };
                attr.alive(&p).then_some(p)
            }
            drop_site::DEVICE => {
                let name = self
                    .map
                    .last
                    .get(k)
                    .map(|s| s.ifname.clone())
                    .unwrap_or_default();
                attr.tun(k.netns, &name)
            }
            _ => None,
        }
    }

    /// Counts the drops entries gained between their last read and their deletion (GC), on
    /// the owner they had (their socket is gone: no holder to look for).
    fn count_late(&mut self, attr: &Attributor, store: &mut Store, now: Instant) {
        for (k, n, owner) in std::mem::take(&mut self.late) {
            let name = self.reasons.name(k.reason);
            let proto = Proto::from_ip(k.proto);
            if k.site == drop_site::NETNS {
                self.netns.add(k.netns, proto, name, n, now);
                continue;
            }
            let who = who_or_unknown(store, "drops", owner, n);
            counters_of(store, attr, who)
                .parts
                .drops
                .add(proto, &name, n);
        }
    }

    pub(super) fn attribute(&mut self, attr: &mut Attributor, store: &mut Store, now: Instant) {
        self.count_late(attr, store, now);
        if self.held.is_empty() {
            if let Some(sh) = &mut self.shared {
                sh.update(&HashSet::default(), attr, now);
            }
            return;
        }
        // The live holder of each socket with new drops (fork, fd passing, exec: the counts
        // follow the socket, not its creator).
        let dropping: HashSet<u64> = self
            .held
            .keys()
            .filter(|k| k.site == drop_site::SOCKET)
            .map(|k| k.inode)
            .collect();
        attr.refresh_holders(&dropping);
        attr.apply_renames(store);
        let unknown: HashSet<u64> = self
            .held
            .keys()
            .filter(|k| k.site == drop_site::SOCKET && attr.lookup_inode(k.inode).is_none())
            .map(|k| k.inode)
            .collect();
        attr.resolve_inodes(Cause::Drops, &unknown);
        if let Some(sh) = &mut self.shared {
            sh.read_readers();
        }
        let keys: Vec<DropKey> = self.held.keys().copied().collect();
        for k in keys {
            if self.route_shared(&k, attr, store, now) {
                continue;
            }
            let who = self.resolve(&k, attr);
            let expired = self
                .held
                .get(&k)
                .is_some_and(|h| now.duration_since(h.since) >= self.hold);
            if self.adopted && k.site == drop_site::SOCKET && who.is_some_and(|p| !attr.alive(&p)) {
                // The first read of adopted maps: a closed socket of a process that exited
                // before the restart. Its counts are on its identity already (kept in
                // `TOTALS` with the process's), or left with it while no bufscope ran.
                self.held.remove(&k);
                continue;
            }
            if who.is_none() && k.site == drop_site::RETIRED {
                // Folded counts of a process that exited while no bufscope ran: its series
                // would have left with it (the entry goes at the next GC).
                self.held.remove(&k);
                continue;
            }
            if who.is_none() && !expired && k.site != drop_site::NETNS {
                continue;
            }
            if let Some(h) = self.held.remove(&k) {
                self.count(&k, who, h.packets, attr, store, now);
            }
        }
        if let Some(sh) = &mut self.shared {
            sh.update(&dropping, attr, now);
        }
    }

    /// Counts `packets` drops of `k` on `who` (`_unknown` without one), or on its namespace.
    fn count(
        &mut self,
        k: &DropKey,
        who: Option<ProcRef>,
        packets: u64,
        attr: &Attributor,
        store: &mut Store,
        now: Instant,
    ) {
        if k.site == drop_site::NETNS {
            let name = self.reasons.name(k.reason);
            self.netns
                .add(k.netns, Proto::from_ip(k.proto), name, packets, now);
            return;
        }
        let who = who_or_unknown(store, "drops", who, packets);
        if let (Some(seen), Who::Proc(p)) = (self.map.last.get_mut(k), who) {
            seen.owner = Some(p);
            seen.credit(p, packets);
        }
        let s = counters_of(store, attr, who);
        let reasons = &self.reasons;
        let name = self
            .names
            .entry(k.reason)
            .or_insert_with(|| reasons.name(k.reason));
        s.parts.drops.add(Proto::from_ip(k.proto), name, packets);
    }

    /// Counts the held delta of `k` when its socket is shared (more than one live holder)
    /// and the reader hook says, or will say, who reads it ([`shared`]). Returns true when
    /// the delta was counted or must wait; false for the usual rule.
    fn route_shared(
        &mut self,
        k: &DropKey,
        attr: &mut Attributor,
        store: &mut Store,
        now: Instant,
    ) -> bool {
        let Some(sh) = &mut self.shared else {
            return false;
        };
        if k.site != drop_site::SOCKET || attr.holder_count(k.inode) <= 1 {
            return false;
        }
        let Some(h) = self.held.get(k) else {
            return false;
        };
        let parts = match sh.route(k.inode, h.packets, h.since, now, attr) {
            shared::Route::Holder => return false,
            shared::Route::Wait => return true,
            shared::Route::Split(parts) => parts,
        };
        self.held.remove(k);
        if let (Some(seen), Some((p, _))) = (
            self.map.last.get_mut(k),
            parts.iter().max_by_key(|(_, n)| *n),
        ) {
            seen.owner = Some(*p);
        }
        let reasons = &self.reasons;
        let name = self
            .names
            .entry(k.reason)
            .or_insert_with(|| reasons.name(k.reason));
        if let Some(seen) = self.map.last.get_mut(k) {
            for (p, n) in &parts {
                seen.credit(*p, *n);
            }
        }
        for (p, n) in parts {
            let s = store.proc_mut(Who::Proc(p), || attr.meta(&p));
            s.parts.drops.add(Proto::from_ip(k.proto), name, n);
        }
        true
    }
}

/// The reason a full UDP receive buffer drops with (the series made at 0 in advance).
const UDP_RCVBUF_REASON: &str = "SOCKET_RCVBUFF";

impl Drops {
    /// Gives each process newly known to hold a UDP socket its identity's
    /// `{proto="udp",reason="SOCKET_RCVBUFF"}` series at 0 ([`Store::zero_series`]), so that
    /// Prometheus sees its first drops as an increase.
    pub(super) fn zero_udp_series(&self, cx: &mut PollCx<'_>) {
        if self.reasons.value(UDP_RCVBUF_REASON).is_none() {
            return;
        }
        for p in cx.attr.new_udp_holders() {
            let attr = &*cx.attr;
            cx.store.zero_series(
                p,
                || attr.meta(&p),
                |parts| parts.drops.add(Proto::Udp, UDP_RCVBUF_REASON, 0),
            );
        }
    }
}
