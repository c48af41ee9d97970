//! The collector's two ways in, each holding its lock only for what needs it: a request's
//! fresh view ([`fresh`]) and the background cycle ([`background`]: poll, advice, GC, owner
//! look-ups). Passes over `/proc` (GC's, the look-ups') and the evaluation of the advice
//! rules run between two holds: a scrape waits for the lock only while the maps are read and
//! the answers filed.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a request waits for a running owner look-up pass its counts wait for (a pass
/// over `/proc` takes milliseconds to a few hundred on a busy node).
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(2);

use super::{Collector, Held, Holder, lock_as};
use crate::advice::{Report, Selection};
use crate::attribution::{Found, Lookup};

impl Collector {
    /// The owner look-up pass to run without the lock: in the background when one is due
    /// (the per-cause rate limits); for a request (`for_request`) only when counts wait for
    /// it, and then at once, whatever the limits say — a scrape shows every count that
    /// happened before it, and the pass runs between its two holds of the lock.
    pub fn lookup_plan(&mut self, for_request: bool) -> Option<Lookup> {
        if for_request && !self.attr.lookups_urgent() {
            return None;
        }
        self.attr.take_lookup(Instant::now(), for_request)
    }

    /// Files what a look-up pass found; the rooms count what waited for it at their next
    /// poll.
    pub fn lookup_apply(&mut self, found: Found) {
        self.attr.apply_lookup(found);
        self.advice.dirty();
        self.render.changed();
    }
}

/// The collector, locked for a request that arrived at `arrived`, after a poll that started
/// after it: a scrape reflects everything that happened before it. When counts wait for an
/// owner look-up, the pass runs between two holds of the lock and a second poll counts them
/// (the first scrape after a burst on a new socket shows the burst).
pub fn fresh(c: &Mutex<Collector>, arrived: Instant) -> Held<'_> {
    let mut held = lock_as(c, Holder::Request);
    if held.last_poll_started().is_some_and(|t| t >= arrived) {
        return held;
    }
    held.poll();
    // A background pass may be answering what this request's counts wait for (one pass runs
    // at a time): wait for its answer without the lock, then count what it found.
    if held.attr.urgent_in_flight() {
        held = wait_unlocked(c, held, |h| h.attr.urgent_in_flight());
        held.poll();
    }
    let Some(plan) = held.lookup_plan(true) else {
        return held;
    };
    drop(held);
    look_up(c, plan, Holder::Request, true)
}

/// Releases the lock while `busy` says another holder's work (run between its own two
/// holds) is not done, for at most [`IN_FLIGHT_WAIT`]; returns the lock held as a request.
fn wait_unlocked<'a>(
    c: &'a Mutex<Collector>,
    mut held: Held<'a>,
    busy: impl Fn(&Held<'a>) -> bool,
) -> Held<'a> {
    let deadline = Instant::now() + IN_FLIGHT_WAIT;
    while busy(&held) && Instant::now() < deadline {
        drop(held);
        std::thread::sleep(Duration::from_millis(2));
        held = lock_as(c, Holder::Request);
    }
    held
}

/// Runs the owner look-up pass `plan` without the lock, then files its answers holding the
/// lock as `who`, and with `count` polls so that what waited for them is counted.
fn look_up(c: &Mutex<Collector>, plan: Lookup, who: Holder, count: bool) -> Held<'_> {
    let found = plan.run();
    let mut held = lock_as(c, who);
    held.lookup_apply(found);
    if count {
        held.poll();
    }
    held
}

/// The `/api/v1/findings` document (the findings `sel` asks for) for a request that arrived
/// at `arrived`: the rules
/// evaluated after a poll that started after it. When the poll task is evaluating them
/// without the lock, the request waits for that (without the lock) and evaluates after it.
/// The findings are told after the lock is released (10,000 sockets' findings take tens of
/// milliseconds to tell).
pub fn report(c: &Mutex<Collector>, arrived: Instant, sel: &Selection) -> Report {
    let held = fresh(c, arrived);
    let mut held = wait_unlocked(c, held, |h| h.advice_running());
    let findings = held.findings(Duration::ZERO);
    drop(held);
    super::tell(&findings, sel)
}

/// One background cycle (the poll task's, every `--poll-interval`): a poll; the advice
/// rules when due, evaluated between two holds; GC when due,
/// its `/proc` pass between two holds; the owner look-ups when due, likewise, then a poll
/// when counts waited for them.
pub fn background(c: &Mutex<Collector>) {
    let (advice, gc) = {
        let mut held = lock_as(c, Holder::Poll);
        held.poll();
        (held.advice_plan(), held.gc_due().then(|| held.gc_plan()))
    };
    if let Some(job) = advice {
        let done = job.run();
        // The guard drops at the end of the statement: the replaced findings after it.
        let replaced = lock_as(c, Holder::Poll).advice_apply(done);
        drop(replaced);
    }
    if let Some(plan) = gc {
        let scan = plan.scan();
        lock_as(c, Holder::Gc).gc_apply(scan);
        // What churn freed (exited processes, closed sockets) goes back to the kernel
        // instead of staying in the allocator's arenas.
        crate::bpf::trim_heap();
    }
    let (plan, urgent) = {
        let mut held = lock_as(c, Holder::Lookup);
        let urgent = held.attr.lookups_urgent();
        (held.lookup_plan(false), urgent)
    };
    if let Some(plan) = plan {
        look_up(c, plan, Holder::Lookup, urgent);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::bpf::fake::FakeRing;
    use crate::collector::Config;
    use crate::signals::Signal;
    use crate::signals::tcp_state::TcpState;
    use crate::signals::testkit::{Bench, me, my_proc, udp_socket};
    use bufscope_common::{EstablishedEvent, event_kind};

    /// A collector with the tcp_state room fed by a fake ring, owner look-ups left to the
    /// background pass, and a socket this test holds (kept open by the returned socket).
    fn tcp_state_collector() -> (Mutex<Collector>, FakeRing, std::net::UdpSocket, u64) {
        let mut b = Bench::new();
        b.attr = b.attr.with_inline_lookups(false);
        let ring = FakeRing::default();
        let (sock, held_inode) = udp_socket();
        let rooms: Vec<Box<dyn Signal>> = vec![Box::new(TcpState::new())];
        let c = Mutex::new(
            Config {
                rooms,
                events: Some(Box::new(ring.clone())),
                ..Config::new(b.store, b.attr)
            }
            .build(),
        );
        (c, ring, sock, held_inode)
    }

    /// A connection whose owner `OWNERS` lost (evicted) is held, not looked up under the
    /// lock; the next cycle's pass over `/proc` (between two holds) finds its owner and the
    /// connection counts on it, once.
    #[test]
    fn an_evicted_owner_is_found_off_the_lock_and_counted_once() {
        let (c, ring, _sock, held_inode) = tcp_state_collector();
        // The socket this test holds reaches ESTABLISHED; OWNERS has no entry for it.
        ring.push_pod(&EstablishedEvent {
            kind: event_kind::ESTABLISHED,
            inode: held_inode,
            owner: me(),
            ..Default::default()
        });
        {
            let mut g = lock_as(&c, Holder::Poll);
            g.poll();
            assert!(
                g.attr.pending(held_inode),
                "queued, not looked up under the lock"
            );
            assert!(
                g.store.get(&my_proc()).is_none(),
                "held, not counted on _unknown"
            );
            assert_eq!(g.store.attribution_unknown.get("tcp_state"), None);
        }
        background(&c);
        let g = lock_as(&c, Holder::Request);
        let s = g.store.get(&my_proc()).unwrap();
        assert_eq!(
            s.parts.tcp_state.established, 1,
            "counted on its owner, once"
        );
        assert!(!g.attr.pending(held_inode));
    }

    /// A request finds the counts that waited for a look-up counted: the pass ran between
    /// its two holds.
    #[test]
    fn a_request_counts_what_waited_for_a_due_look_up() {
        let (c, ring, _sock, held_inode) = tcp_state_collector();
        ring.push_pod(&EstablishedEvent {
            kind: event_kind::ESTABLISHED,
            inode: held_inode,
            ..Default::default()
        });
        let g = fresh(&c, Instant::now());
        assert_eq!(
            g.store.get(&my_proc()).unwrap().parts.tcp_state.established,
            1
        );
        assert!(g.lock_stats.worst(Holder::Request) > std::time::Duration::ZERO);
    }
}
