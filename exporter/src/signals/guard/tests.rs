//! The guard room's logic over fake maps (no root): what it reads from `GUARD_STATS` and
//! `GUARD_STATE`, what it writes there and into `GUARD_LEASE`, and how decisions reach the
//! owner's counters and the advice.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bufscope_common::{GuardEvent, event_kind, guard as g};

use super::{Guard, Settings, TimeOffsets};
use crate::advice::Inputs;
use crate::bpf::fake::FakeTable;
use crate::kernel::BufferLimits;
use crate::signals::Signal as _;
use crate::signals::testkit::{Bench, me, my_proc, record};

const FLOOR: i64 = 7 << 20;
const BUDGET: u64 = 1 << 30;

struct Maps {
    stats: FakeTable<u32, Vec<u64>>,
    state: FakeTable<u32, u64>,
    lease: FakeTable<u32, u64>,
}

fn settings(lease: Option<Duration>) -> Settings {
    Settings {
        enforce: true,
        udp_floor: FLOOR,
        applied_floor: (FLOOR, FLOOR),
        lease,
        scope: ("/".into(), "all", String::new()),
        udp_budget: BUDGET,
        generation: 0x5eed,
    }
}

/// The room over fresh fake maps, with `limits` as the ceilings it last wrote.
fn room(lease: Option<Duration>, limits: (u64, u64)) -> (Guard, Maps) {
    let m = Maps {
        stats: FakeTable::new(g::STAT_COUNT as usize),
        state: FakeTable::new(g::STATE_COUNT as usize),
        lease: FakeTable::new(1),
    };
    let r = Guard::new(
        settings(lease),
        m.stats.boxed(),
        m.state.boxed(),
        Some(m.lease.boxed()),
        limits,
        TimeOffsets::default(),
    );
    (r, m)
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec * 1_000_000_000 + ts.tv_nsec) as u64
}

/// The one sample of unlabelled family `name`.
fn value(b: &Bench, room: &Guard, name: &str) -> f64 {
    let fams = b.families(room);
    let f = fams
        .iter()
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("family {name}"));
    let m = &f.get_metric()[0];
    m.get_counter().get_value() + m.get_gauge().get_value()
}

fn event(rule: u32, action: u8, applied: i32) -> Vec<u8> {
    record(&GuardEvent {
        kind: event_kind::GUARD,
        owner: me(),
        inode: 1,
        requested: 212_992,
        applied,
        rule: rule as u8,
        action,
        ..Default::default()
    })
}

/// The TCP rule compares requests with `rmem_max`/`wmem_max` as the programs find them in
/// `GUARD_STATE`: a poll that reads other sysctl values writes them there (and only then),
/// and unreadable ones are written as 0 (the rule then skips rather than honours).
#[test]
fn poll_keeps_the_ceilings_in_guard_state_current() {
    let mut b = Bench::new();
    let limits = (4_194_304, 4_194_304);
    let (mut r, m) = room(None, limits);
    b.limits.rmem_max = Some(4_194_304);
    b.limits.wmem_max = Some(4_194_304);
    r.poll(&mut b.poll());
    assert_eq!(
        m.state.value(&g::STATE_RMEM_MAX),
        None,
        "unchanged: not written"
    );
    b.limits.rmem_max = Some(67_108_864);
    b.limits.wmem_max = Some(33_554_432);
    r.poll(&mut b.poll());
    assert_eq!(m.state.value(&g::STATE_RMEM_MAX), Some(67_108_864));
    assert_eq!(m.state.value(&g::STATE_WMEM_MAX), Some(33_554_432));
    b.limits = BufferLimits {
        rmem_max: None,
        wmem_max: None,
        tcp_rmem_max: None,
        tcp_wmem_max: None,
    };
    r.poll(&mut b.poll());
    assert_eq!(m.state.value(&g::STATE_RMEM_MAX), Some(0));
    assert_eq!(m.state.value(&g::STATE_WMEM_MAX), Some(0));
    // The programs' own slot is never written by the room.
    assert_eq!(m.state.value(&g::STATE_GRANTED), None);
}

/// A persisted guard's deadline lies `--guard.lease` ahead of the kernel's monotonic clock
/// after every poll; a guard without a lease writes none.
#[test]
fn poll_renews_the_lease_in_the_kernels_clock() {
    let mut b = Bench::new();
    let lease = Duration::from_secs(300);
    let (mut r, m) = room(Some(lease), (0, 0));
    let before = monotonic_ns();
    r.poll(&mut b.poll());
    let after = monotonic_ns();
    let d = m.lease.value(&0).expect("a deadline");
    let l = lease.as_nanos() as u64;
    assert!(
        (before + l..=after + l).contains(&d),
        "{d} not within [{before}, {after}] + lease"
    );
    let (mut r, m) = room(None, (0, 0));
    r.poll(&mut b.poll());
    assert_eq!(m.lease.value(&0), None);
}

/// The budget's figures come from the maps: granted bytes from `GUARD_STATE`, sockets left
/// out and their bytes summed over the CPUs of `GUARD_STATS`; the scope carries the
/// generation the marks are made under.
#[test]
fn families_read_the_budget_from_the_maps() {
    let b = Bench::new();
    let (r, m) = room(None, (0, 0));
    m.state.set(g::STATE_GRANTED, 29_360_128);
    m.stats.set(g::STAT_LEFT_OUT, vec![2, 1]);
    m.stats
        .set(g::STAT_LEFT_OUT_BYTES, vec![14_680_064, 14_680_064]);
    m.stats.set(g::STAT_UNREPORTED, vec![0, 5]);
    assert_eq!(
        value(&b, &r, "bufscope_guard_udp_granted_bytes"),
        29_360_128.0
    );
    assert_eq!(
        value(&b, &r, "bufscope_guard_udp_budget_bytes"),
        BUDGET as f64
    );
    assert_eq!(value(&b, &r, "bufscope_guard_udp_left_out_total"), 3.0);
    assert_eq!(
        value(&b, &r, "bufscope_guard_udp_left_out_bytes_total"),
        29_360_128.0
    );
    assert_eq!(value(&b, &r, "bufscope_guard_unreported_total"), 5.0);
    let fams = b.families(&r);
    let scope = fams
        .iter()
        .find(|f| f.name() == "bufscope_guard_scope_info")
        .unwrap();
    let labels = scope.get_metric()[0].get_label();
    let label = |k: &str| labels.iter().find(|l| l.name() == k).unwrap().value();
    assert_eq!(label("generation"), 0x5eed.to_string());
    assert_eq!(label("mode"), "enforce");
}

/// Each decision is counted on the caller by rule and action; a budget refusal also adds the
/// bytes the socket did not get; a record with an unknown rule or action is not counted.
#[test]
fn decisions_are_counted_on_their_owner() {
    let mut b = Bench::new();
    let (mut r, _m) = room(None, (0, 0));
    for (rule, action, applied) in [
        (g::RULE_TCP_AUTOTUNE, g::ACTION_SKIPPED, 0),
        (g::RULE_TCP_AUTOTUNE, g::ACTION_HONOURED, 0),
        (g::RULE_UDP_FLOOR, g::ACTION_RAISED, FLOOR as i32),
        (g::RULE_UDP_FLOOR, g::ACTION_RAISED, FLOOR as i32),
        (g::RULE_UDP_FLOOR, g::ACTION_OVER_BUDGET, 14_467_072),
        (g::RULE_UDP_FLOOR, 99, 0),
        (77, g::ACTION_RAISED, 0),
    ] {
        r.on_event(
            event_kind::GUARD,
            &event(rule, action, applied),
            &mut b.poll(),
        );
    }
    let pid = my_proc().tgid;
    let n = |rule: &str, action: &str| {
        b.sample(
            &r,
            "bufscope_guard_decisions_total",
            pid,
            &[("rule", rule), ("action", action)],
        )
    };
    assert_eq!(n("tcp-autotune", "skipped"), 1.0);
    assert_eq!(n("tcp-autotune", "honoured"), 1.0);
    assert_eq!(n("udp-floor", "raised"), 2.0);
    assert_eq!(n("udp-floor", "over_budget"), 1.0);
    let part = &b.store.get(&my_proc()).unwrap().parts.guard;
    assert_eq!(
        part.decisions.values().sum::<u64>(),
        5,
        "unknown ones dropped"
    );
    assert_eq!(part.left_out_bytes, 14_467_072);
}

/// Advice hears what the guard fixes, not what it left to the kernel: a honoured TCP request
/// is no finding; a budget refusal says how many sockets and bytes were left out.
#[test]
fn advice_gets_fixes_and_budget_refusals_not_honoured_requests() {
    let mut b = Bench::new();
    let (mut r, _m) = room(None, (0, 0));
    for (rule, action, applied) in [
        (g::RULE_TCP_AUTOTUNE, g::ACTION_HONOURED, 0),
        (g::RULE_UDP_FLOOR, g::ACTION_RAISED, FLOOR as i32),
        (g::RULE_UDP_FLOOR, g::ACTION_OVER_BUDGET, 1_000),
        (g::RULE_UDP_FLOOR, g::ACTION_OVER_BUDGET, 2_000),
    ] {
        r.on_event(
            event_kind::GUARD,
            &event(rule, action, applied),
            &mut b.poll(),
        );
    }
    let mut inputs = Inputs::default();
    r.advise(&b.advice(), &mut inputs);
    assert_eq!(inputs.guard.len(), 2, "{:?}", inputs.guard);
    assert!(
        inputs
            .guard
            .iter()
            .all(|a| a.rule == "udp-floor" && a.enforced)
    );
    let raised = inputs.guard.iter().find(|a| a.decisions > 0).unwrap();
    assert_eq!((raised.decisions, raised.floor), (1, FLOOR));
    let over = inputs.guard.iter().find(|a| a.left_out > 0).unwrap();
    assert_eq!((over.left_out, over.left_out_bytes), (2, 3_000));
    assert_eq!(over.budget, BUDGET);
}
