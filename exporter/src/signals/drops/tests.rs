//! The drops room against a fake `DROPS` (no root): deltas, owners, `_unknown`, the
//! per-namespace series, GC, the counts of closed sockets kept across a restart, adopted maps.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bufscope_common::{DropKey, DropVal, drop_site, stat};
use foldhash::HashSet;

use super::*;
use crate::bpf::fake::FakeTable;
use crate::kernel::DropReasons;
use crate::signals::testkit::{Bench, gone_inode, me, my_proc, udp_socket};

const REASONS: &str = r#"{ 6, "SOCKET_RCVBUFF" } { 3, "PROTO_MEM" }"#;
const SOCKET_DROPS_TOTAL: &str = "bufscope_socket_drops_total";

fn key(site: u8, inode: u64, reason: u16) -> DropKey {
    DropKey {
        inode,
        netns: 4_026_531_840,
        id: 0,
        reason,
        proto: 17,
        site,
        _pad: 0,
    }
}

fn drops(packets: u64) -> DropVal {
    DropVal {
        packets,
        skbs: packets,
        last_ns: packets,
        rcvbuf: 212_992,
        rmem_alloc: 213_000,
        ..DropVal::default()
    }
}

fn room(kernel: &FakeTable<DropKey, Vec<DropVal>>, hold: Duration) -> Drops {
    Drops::new(kernel.boxed(), 64, DropReasons::parse_format(REASONS), hold)
}

fn udp_drops(b: &Bench, room: &Drops, reason: &str) -> f64 {
    b.sample(
        room,
        SOCKET_DROPS_TOTAL,
        my_proc().tgid,
        &[("proto", "udp"), ("reason", reason)],
    )
}

/// Drops on a socket this process holds go to it, by reason, as deltas of the kernel's
/// per-CPU counts; the map is read again only when the probe's generation moved.
///
/// `OWNERS` records the socket's creator, as the owners probe does: without it the holder rule
/// falls back to the newest holder, and any process this test binary forks meanwhile (the BTF
/// tests run `bpftool`) holds a copy of every descriptor between its fork and its exec.
#[test]
fn drops_go_to_the_process_that_holds_the_socket() {
    let mut b = Bench::new();
    let kernel = FakeTable::new(64);
    let mut d = room(&kernel, Duration::from_secs(10));
    let (_sock, ino) = udp_socket();
    b.owners.set(ino, me());
    kernel.set(key(drop_site::SOCKET, ino, 6), vec![drops(5), drops(2)]);
    kernel.set(key(drop_site::SOCKET, ino, 3), vec![drops(1)]);
    b.bump(stat::DROPS_SEEN);
    assert!(d.poll(&mut b.poll()));
    assert_eq!(udp_drops(&b, &d, "SOCKET_RCVBUFF"), 7.0);
    assert_eq!(udp_drops(&b, &d, "PROTO_MEM"), 1.0);
    kernel.set(key(drop_site::SOCKET, ino, 6), vec![drops(9), drops(2)]);
    assert!(!d.poll(&mut b.poll()), "generation unchanged: not read");
    assert_eq!(udp_drops(&b, &d, "SOCKET_RCVBUFF"), 7.0);
    b.bump(stat::DROPS_SEEN);
    d.poll(&mut b.poll());
    assert_eq!(udp_drops(&b, &d, "SOCKET_RCVBUFF"), 11.0);
    assert_eq!(d.map_fill().unwrap().entries, 2);
    assert_eq!(b.store.attribution_unknown.get("drops"), None);
}

/// Kills and reaps a child at the end of a test, whatever the test's outcome.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A second process holding the socket (a child that inherited it: a fork before its exec, a
/// helper that keeps it) does not take the drops while the creator `OWNERS` recorded still
/// holds it, although it is the newer holder.
#[test]
fn a_child_holding_the_socket_does_not_take_the_creators_drops() {
    let mut b = Bench::new();
    let kernel = FakeTable::new(64);
    let mut d = room(&kernel, Duration::from_secs(10));
    let (sock, ino) = udp_socket();
    b.owners.set(ino, me());
    // The child holds the socket as its stdin from before spawn() returns (spawn waits for
    // the exec): no waiting needed.
    let inherited = std::os::fd::OwnedFd::from(sock.try_clone().unwrap());
    let child = Reaped(
        std::process::Command::new("sleep")
            .arg("60")
            .stdin(std::process::Stdio::from(inherited))
            .spawn()
            .unwrap(),
    );
    let child_link = std::fs::read_link(format!("/proc/{}/fd/0", child.0.id())).unwrap();
    assert_eq!(
        child_link.to_string_lossy(),
        format!("socket:[{ino}]"),
        "the child holds the socket"
    );
    kernel.set(key(drop_site::SOCKET, ino, 6), vec![drops(5)]);
    b.bump(stat::DROPS_SEEN);
    d.poll(&mut b.poll());
    assert_eq!(udp_drops(&b, &d, "SOCKET_RCVBUFF"), 5.0);
    assert_eq!(
        b.sample(
            &d,
            SOCKET_DROPS_TOTAL,
            child.0.id(),
            &[("proto", "udp"), ("reason", "SOCKET_RCVBUFF")]
        ),
        0.0
    );
}

/// A closed socket's drops go to the owner `OWNERS` recorded.
#[test]
fn drops_of_a_closed_socket_go_to_its_recorded_owner() {
    let mut b = Bench::new();
    let kernel = FakeTable::new(64);
    let mut d = room(&kernel, Duration::from_secs(10));
    let ino = gone_inode(10);
    b.owners.set(ino, me());
    kernel.set(key(drop_site::SOCKET, ino, 6), vec![drops(4)]);
    d.poll(&mut b.poll());
    assert_eq!(udp_drops(&b, &d, "SOCKET_RCVBUFF"), 4.0);
}

/// Drops whose owner is not found are held for `--drops.attribution-hold`, then counted under
/// `_unknown` (never dropped silently).
#[test]
fn unattributed_drops_are_held_then_counted_as_unknown() {
    let mut b = Bench::new();
    let kernel = FakeTable::new(64);
    let mut d = room(&kernel, Duration::from_secs(3600));
    kernel.set(key(drop_site::SOCKET, gone_inode(11), 6), vec![drops(6)]);
    d.poll(&mut b.poll());
    assert_eq!(b.store.attribution_unknown.get("drops"), None, "held");
    let mut d = room(&kernel, Duration::ZERO);
    d.poll(&mut b.poll());
    assert_eq!(b.store.attribution_unknown.get("drops"), Some(&6));
}

/// Drops no hook can put on a socket are counted per network namespace.
#[test]
fn namespace_drops_have_their_own_family() {
    let mut b = Bench::new();
    let kernel = FakeTable::new(64);
    let mut d = room(&kernel, Duration::from_secs(10));
    let mut k = key(drop_site::NETNS, 0, 3);
    k.proto = 6;
    kernel.set(k, vec![drops(8)]);
    d.poll(&mut b.poll());
    let fams = b.families(&d);
    let netns = fams
        .iter()
        .find(|f| f.name() == "bufscope_netns_drops_total")
        .unwrap();
    let m = &netns.get_metric()[0];
    let labels: Vec<(&str, &str)> = m
        .get_label()
        .iter()
        .map(|l| (l.name(), l.value()))
        .collect();
    assert_eq!(
        labels,
        vec![
            ("netns", "4026531840"),
            ("proto", "tcp"),
            ("reason", "PROTO_MEM")
        ]
    );
    assert_eq!(m.get_counter().get_value(), 8.0);
}

/// GC deletes the idle entries of closed sockets (not those `/proc` still shows) and
/// forgets them; with pinned maps a live owner's counts are folded into one
/// `drop_site::RETIRED` entry the next bufscope reads back, written as the total the store
/// has (no double count).
#[test]
fn gc_folds_closed_sockets_into_a_retired_entry_with_pins() {
    let mut b = Bench::new();
    let kernel = FakeTable::new(64);
    let mut d = room(&kernel, Duration::from_secs(10));
    d.retire = true;
    let (closed, open) = (gone_inode(12), gone_inode(13));
    b.owners.set(closed, me());
    b.owners.set(open, me());
    kernel.set(key(drop_site::SOCKET, closed, 6), vec![drops(30)]);
    kernel.set(key(drop_site::SOCKET, open, 6), vec![drops(2)]);
    d.poll(&mut b.poll());
    let live: HashSet<u64> = [open].into_iter().collect();
    assert_eq!(b.gc(&mut d, &live), 1);
    assert!(kernel.value(&key(drop_site::SOCKET, closed, 6)).is_none());
    let p = my_proc();
    let retired = DropKey {
        inode: p.start_ticks,
        netns: 0,
        id: p.tgid,
        reason: 6,
        proto: 17,
        site: drop_site::RETIRED,
        _pad: 0,
    };
    let kept = kernel.value(&retired).unwrap();
    assert_eq!(kept.iter().map(|v| v.packets).sum::<u64>(), 30);
    // The next read sees the RETIRED entry as already counted.
    b.bump(stat::DROPS_SEEN);
    d.poll(&mut b.poll());
    assert_eq!(udp_drops(&b, &d, "SOCKET_RCVBUFF"), 32.0);

    // A restart adopting the maps reads the total back for the live process.
    let mut after = Bench::new();
    let mut d2 = room(&kernel, Duration::from_secs(10));
    d2.adopted = true;
    after.owners.set(open, me());
    d2.poll(&mut after.poll());
    assert_eq!(udp_drops(&after, &d2, "SOCKET_RCVBUFF"), 32.0);
    let mut inputs = crate::advice::Inputs::default();
    d2.advise(&after.advice(), &mut inputs);
    assert!(
        inputs.drops.iter().all(|s| s.rate == 0.0),
        "counts that accrued while no bufscope ran are no rate"
    );
}

/// With pins, a full `DROPS` refuses the fold: the store keeps the counts, nothing is
/// written twice.
#[test]
fn a_full_map_refuses_the_fold_without_losing_the_count() {
    let mut b = Bench::new();
    let kernel = FakeTable::new(1);
    let mut d = room(&kernel, Duration::from_secs(10));
    d.retire = true;
    let closed = gone_inode(14);
    b.owners.set(closed, me());
    kernel.set(key(drop_site::SOCKET, closed, 6), vec![drops(3)]);
    kernel.set(key(drop_site::NETNS, 0, 6), vec![drops(1)]);
    d.poll(&mut b.poll());
    assert_eq!(b.gc(&mut d, &HashSet::default()), 2);
    assert_eq!(udp_drops(&b, &d, "SOCKET_RCVBUFF"), 3.0);
}

/// A process that holds a UDP socket gets its `SOCKET_RCVBUFF` series at 0 before it drops.
#[test]
fn udp_holders_get_a_zero_series_before_their_first_drop() {
    let mut b = Bench::new();
    // The first look also finds every process of this machine that holds a UDP socket (a
    // busy test machine: hundreds): room for all of them, so this one gets its own entry.
    b.store = crate::signals::Store::new(1 << 20, Duration::from_secs(300));
    let kernel = FakeTable::new(64);
    let mut d = room(&kernel, Duration::from_secs(10));
    let (_sock, ino) = udp_socket();
    b.owners.set(ino, me());
    d.poll(&mut b.poll());
    let s = b.store.get(&my_proc()).unwrap();
    assert_eq!(
        s.parts
            .drops
            .packets
            .get(&(Proto::Udp, "SOCKET_RCVBUFF".to_string())),
        Some(&0)
    );
    assert!(s.placeholder);
}

/// GC candidates are the idle socket entries without held deltas.
#[test]
fn gc_candidates_are_idle_sockets() {
    let mut b = Bench::new();
    let kernel = FakeTable::new(64);
    let mut d = room(&kernel, Duration::from_secs(3600));
    b.owners.set(gone_inode(15), me());
    kernel.set(key(drop_site::SOCKET, gone_inode(15), 6), vec![drops(1)]);
    kernel.set(key(drop_site::SOCKET, gone_inode(16), 6), vec![drops(1)]);
    d.poll(&mut b.poll());
    assert_eq!(
        d.gc_candidates(Duration::ZERO),
        vec![gone_inode(15)],
        "the held one waits for its owner"
    );
    let mut referenced = HashSet::default();
    d.referenced(&mut referenced);
    assert!(referenced.contains(&my_proc()));
}

/// A dropping socket that was never sized has no story: the room passes its namespace on with
/// the drops, and how that namespace sees the limits, read through the socket's owner.
#[test]
fn dropping_sockets_bring_their_namespace_and_its_limits() {
    let mut b = Bench::new();
    let kernel = FakeTable::new(64);
    let mut d = room(&kernel, Duration::from_secs(10));
    let (_sock, ino) = udp_socket();
    b.owners.set(ino, me());
    let link = std::fs::read_link("/proc/self/ns/net").unwrap();
    let own: u32 = link
        .to_string_lossy()
        .trim_start_matches("net:[")
        .trim_end_matches(']')
        .parse()
        .unwrap();
    let mut k = key(drop_site::SOCKET, ino, 6);
    k.netns = own;
    kernel.set(k, vec![drops(4)]);
    b.bump(stat::DROPS_SEEN);
    assert!(d.poll(&mut b.poll()));
    let mut inputs = crate::advice::Inputs::default();
    d.advise(&b.advice(), &mut inputs);
    let mine = inputs.drops.iter().find(|s| s.inode == ino).unwrap();
    assert_eq!(mine.netns, own);
    let l = inputs.ns_limits.get(&own).expect("the namespace's view");
    assert_eq!(l.scope, crate::advice::LimitScope::Host, "bufscope's own");
}
