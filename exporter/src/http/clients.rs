//! Per-client shares of what the HTTP side has a fixed amount of: open connections and request
//! slots. A client is a source address ([`Client`]). No client can take what another needs:
//!
//! - **Connections** ([`Connections`]): at most [`MAX_CONNECTIONS`] open, at most
//!   [`CLIENT_CONNECTIONS`] per client, and the last [`RESERVED_CONNECTIONS`] only for clients
//!   holding fewer than [`LIGHT_CLIENT`]; a connection refused by these rules is still
//!   answered when there is room among [`HEALTH_ONLY`] short-lived extra connections
//!   ([`CLIENT_HEALTH_ONLY`] per client): `/healthz` as usual, anything else 503.
//! - **Request slots** ([`Slots`]): [`MAX_IN_FLIGHT`] requests use the collector at once and
//!   [`MAX_QUEUED`] more wait, at most [`CLIENT_QUEUED`] of them from one client; a freed slot
//!   goes to the waiting client with the fewest requests in flight (ties: the one served least
//!   recently), and a client arriving at a full queue takes the place of the newest waiter of a
//!   client with more queued than it.
//!
//! The state is per client with something open or queued, so it is bounded by the caps.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// Most connections open at once (TLS handshakes included).
pub const MAX_CONNECTIONS: usize = 2048;
/// Most connections one client may hold.
pub const CLIENT_CONNECTIONS: usize = 512;
/// Connections kept for clients that hold few ([`LIGHT_CLIENT`]): a Prometheus, a kubelet.
pub const RESERVED_CONNECTIONS: usize = 256;
/// A client holding fewer connections than this may use the reserved ones.
pub const LIGHT_CLIENT: usize = 4;
/// Extra connections for clients the caps refuse: answered (`/healthz`, else 503) and closed.
pub const HEALTH_ONLY: usize = 64;
/// Most of the [`HEALTH_ONLY`] connections one client may hold.
pub const CLIENT_HEALTH_ONLY: usize = 4;

/// Most requests using the collector or waiting for its lock, each on a blocking thread.
pub const MAX_IN_FLIGHT: usize = 16;
/// Most requests waiting for a place in flight (without a thread).
pub const MAX_QUEUED: usize = 256;
/// Most of the waiting requests one client may have.
pub const CLIENT_QUEUED: usize = 64;

/// A client: a source address (an IPv4-mapped IPv6 address is its IPv4 one). Exact, IPv6
/// too: pods of one node often share an IPv6 /64, and a Prometheus must not share its budget
/// with a neighbour pod; an attacker with many addresses meets the bounds instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Client {
    /// An IPv4 address.
    V4(u32),
    /// An IPv6 address.
    V6(u128),
}

impl Client {
    /// The client `ip` belongs to.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self::V4(u32::from(v4)),
                None => Self::V6(u128::from(v6)),
            },
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The state stays consistent between statements: a panic elsewhere does not poison it.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The open connections, by client.
#[derive(Debug, Default)]
pub struct Connections {
    state: Mutex<ConnState>,
}

#[derive(Debug, Default)]
struct ConnState {
    open: usize,
    per: HashMap<Client, usize>,
    health_only: usize,
    health_only_per: HashMap<Client, usize>,
}

/// How a connection was admitted.
#[derive(Debug)]
pub enum Admitted {
    /// Served as usual.
    Full(ConnPermit),
    /// Over its client's share: `/healthz` is answered, anything else 503, then it is closed.
    HealthOnly(ConnPermit),
}

/// A connection's place, given back when dropped.
#[derive(Debug)]
pub struct ConnPermit {
    conns: Arc<Connections>,
    client: Client,
    health_only: bool,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let mut st = lock(&self.conns.state);
        let (total, per) = if self.health_only {
            let s = &mut *st;
            (&mut s.health_only, &mut s.health_only_per)
        } else {
            let s = &mut *st;
            (&mut s.open, &mut s.per)
        };
        *total = total.saturating_sub(1);
        if let Some(n) = per.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.client);
            }
        }
    }
}

impl Connections {
    /// No connection open.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// A place for a new connection from `ip` (None: close it at once).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Admitted> {
        let client = Client::of(ip);
        let mut st = lock(&self.state);
        let held = st.per.get(&client).copied().unwrap_or(0);
        let full = st.open < MAX_CONNECTIONS
            && held < CLIENT_CONNECTIONS
            && (st.open < MAX_CONNECTIONS - RESERVED_CONNECTIONS || held < LIGHT_CLIENT);
        if full {
            st.open += 1;
            *st.per.entry(client).or_default() += 1;
            return Some(Admitted::Full(ConnPermit {
                conns: self.clone(),
                client,
                health_only: false,
            }));
        }
        let held = st.health_only_per.get(&client).copied().unwrap_or(0);
        if st.health_only < HEALTH_ONLY && held < CLIENT_HEALTH_ONLY {
            st.health_only += 1;
            *st.health_only_per.entry(client).or_default() += 1;
            return Some(Admitted::HealthOnly(ConnPermit {
                conns: self.clone(),
                client,
                health_only: true,
            }));
        }
        None
    }

    /// (connections open, health-only connections open, clients holding any).
    pub fn counts(&self) -> (usize, usize, usize) {
        let st = lock(&self.state);
        (st.open, st.health_only, st.per.len())
    }
}

/// The request slots, shared fairly between clients.
#[derive(Debug)]
pub struct Slots {
    state: Mutex<SlotState>,
    max_in_flight: usize,
    max_queued: usize,
    client_queued: usize,
}

#[derive(Debug, Default)]
struct SlotState {
    in_flight: usize,
    queued: usize,
    per: HashMap<Client, PerClient>,
    /// Hand-offs so far: a client's `served` is the value at its last one.
    turns: u64,
}

#[derive(Debug, Default)]
struct PerClient {
    in_flight: usize,
    waiting: VecDeque<oneshot::Sender<Slot>>,
    served: u64,
}

/// A request slot, given back (to the next waiter, fairly) when dropped.
#[derive(Debug)]
pub struct Slot {
    /// None once handed on.
    slots: Option<Arc<Slots>>,
    client: Client,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(s) = self.slots.take() {
            s.release(self.client);
        }
    }
}

/// What [`Slots::acquire`] gives.
#[derive(Debug)]
pub enum Acquired {
    /// A slot at once.
    Now(Slot),
    /// A place in the queue: the slot arrives on it (an error: the place was given to another
    /// client, answer busy).
    Wait(oneshot::Receiver<Slot>),
    /// No place: answer busy.
    Busy,
}

impl Slots {
    /// [`MAX_IN_FLIGHT`] slots, [`MAX_QUEUED`] queue places, [`CLIENT_QUEUED`] per client.
    pub fn new() -> Arc<Self> {
        Self::with(MAX_IN_FLIGHT, MAX_QUEUED, CLIENT_QUEUED)
    }

    /// Slots with other sizes (tests).
    pub fn with(max_in_flight: usize, max_queued: usize, client_queued: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            max_in_flight,
            max_queued,
            client_queued,
        })
    }

    /// A slot for a request of the client at `ip`.
    pub fn acquire(self: &Arc<Self>, ip: IpAddr) -> Acquired {
        let client = Client::of(ip);
        let mut st = lock(&self.state);
        if st.in_flight < self.max_in_flight && st.queued == 0 {
            st.in_flight += 1;
            st.per.entry(client).or_default().in_flight += 1;
            return Acquired::Now(Slot {
                slots: Some(self.clone()),
                client,
            });
        }
        // Requests whose client hung up while waiting give their places back.
        if st.queued >= self.max_queued
            || st
                .per
                .get(&client)
                .is_some_and(|p| p.waiting.len() >= self.client_queued)
        {
            purge(&mut st);
        }
        let mine = st.per.get(&client).map_or(0, |p| p.waiting.len());
        if mine >= self.client_queued {
            return Acquired::Busy;
        }
        if st.queued >= self.max_queued {
            // The newest waiter of the client with the most queued gives way, if it has more
            // than this one would.
            let heaviest = st
                .per
                .iter()
                .filter(|(c, p)| **c != client && p.waiting.len() > mine + 1)
                .max_by_key(|(_, p)| p.waiting.len())
                .map(|(c, _)| *c);
            let Some(h) = heaviest else {
                return Acquired::Busy;
            };
            if let Some(p) = st.per.get_mut(&h) {
                // Dropping the sender tells that request it has no place.
                drop(p.waiting.pop_back());
            }
            st.queued -= 1;
        }
        let (tx, rx) = oneshot::channel();
        st.per.entry(client).or_default().waiting.push_back(tx);
        st.queued += 1;
        Acquired::Wait(rx)
    }

    /// Gives `client`'s slot to the next waiter (fewest in flight, then served least
    /// recently), or frees it.
    fn release(self: &Arc<Self>, mut client: Client) {
        loop {
            let next = {
                let mut st = lock(&self.state);
                if let Some(p) = st.per.get_mut(&client) {
                    p.in_flight = p.in_flight.saturating_sub(1);
                }
                prune(&mut st, client);
                let pick = st
                    .per
                    .iter()
                    .filter(|(_, p)| !p.waiting.is_empty())
                    .min_by_key(|(c, p)| (p.in_flight, p.served, **c))
                    .map(|(c, _)| *c);
                st.turns += 1;
                let turn = st.turns;
                match pick.and_then(|c| st.per.get_mut(&c).map(|p| (c, p))) {
                    Some((c, p)) => {
                        p.in_flight += 1;
                        p.served = turn;
                        let tx = p.waiting.pop_front();
                        st.queued -= 1;
                        tx.map(|tx| (c, tx))
                    }
                    None => {
                        st.in_flight = st.in_flight.saturating_sub(1);
                        None
                    }
                }
            };
            let Some((c, tx)) = next else { return };
            let slot = Slot {
                slots: Some(self.clone()),
                client: c,
            };
            match tx.send(slot) {
                Ok(()) => return,
                // The waiter is gone: hand the slot on from here (its drop would recurse).
                Err(mut slot) => {
                    slot.slots = None;
                    client = c;
                }
            }
        }
    }

    /// (requests in flight, queued, clients with either).
    pub fn counts(&self) -> (usize, usize, usize) {
        let st = lock(&self.state);
        (st.in_flight, st.queued, st.per.len())
    }
}

/// Forgets waiters whose request is gone.
fn purge(st: &mut SlotState) {
    let mut gone = 0;
    for p in st.per.values_mut() {
        let before = p.waiting.len();
        p.waiting.retain(|tx| !tx.is_closed());
        gone += before - p.waiting.len();
    }
    st.queued -= gone;
    st.per
        .retain(|_, p| p.in_flight > 0 || !p.waiting.is_empty());
}

/// Removes `client`'s entry when it has nothing in flight or queued.
fn prune(st: &mut SlotState, client: Client) {
    if st
        .per
        .get(&client)
        .is_some_and(|p| p.in_flight == 0 && p.waiting.is_empty())
    {
        st.per.remove(&client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn v4(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
    }

    #[test]
    fn clients_are_addresses() {
        assert_eq!(Client::of(v4(1)), Client::of(v4(1)));
        assert_ne!(Client::of(v4(1)), Client::of(v4(2)));
        let a: Ipv6Addr = "2001:db8:1:2::1".parse().unwrap_or(Ipv6Addr::LOCALHOST);
        let b: Ipv6Addr = "2001:db8:1:2::2".parse().unwrap_or(Ipv6Addr::LOCALHOST);
        assert_ne!(Client::of(IpAddr::V6(a)), Client::of(IpAddr::V6(b)));
        let mapped = Ipv4Addr::new(127, 0, 0, 1).to_ipv6_mapped();
        assert_eq!(Client::of(IpAddr::V6(mapped)), Client::of(v4(1)));
        // An IPv6 address never equals an IPv4 one.
        let low: Ipv6Addr = "::7f00:1".parse().unwrap_or(Ipv6Addr::LOCALHOST);
        assert_ne!(Client::of(IpAddr::V6(low)), Client::of(v4(1)));
    }

    #[test]
    fn one_client_cannot_take_every_connection() {
        let c = Connections::new();
        let mut held = Vec::new();
        while let Some(Admitted::Full(p)) = c.admit(v4(2)) {
            held.push(p);
        }
        assert_eq!(held.len(), CLIENT_CONNECTIONS);
        // Over its share: health-only places, a few.
        let mut extra = Vec::new();
        while let Some(a) = c.admit(v4(2)) {
            assert!(matches!(a, Admitted::HealthOnly(_)));
            extra.push(a);
        }
        assert_eq!(extra.len(), CLIENT_HEALTH_ONLY);
        // Four more clients take what they can: the reserve is left to light clients (the
        // last of the four, which reached the reserve holding none, is one for its first few).
        let mut others = Vec::new();
        for i in 3..=6u8 {
            while let Some(Admitted::Full(p)) = c.admit(v4(i)) {
                others.push(p);
            }
        }
        assert_eq!(
            c.counts().0,
            MAX_CONNECTIONS - RESERVED_CONNECTIONS + LIGHT_CLIENT
        );
        let (open, _, _) = c.counts();
        assert!(open <= MAX_CONNECTIONS, "{open}");
        // Light clients (a Prometheus, a kubelet) get in: each a few connections.
        let mut light = Vec::new();
        for i in 1..=16u8 {
            let newcomer = IpAddr::V4(Ipv4Addr::new(10, 0, 0, i));
            for _ in 0..LIGHT_CLIENT {
                match c.admit(newcomer) {
                    Some(Admitted::Full(p)) => light.push(p),
                    other => panic!("a light client is refused: {other:?} {:?}", c.counts()),
                }
            }
        }
        drop(light);
        drop(held);
        drop(extra);
        drop(others);
        assert_eq!(c.counts(), (0, 0, 0), "every place given back");
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_client_with_the_fewest_in_flight() {
        let s = Slots::with(2, 8, 4);
        let (Acquired::Now(a1), Acquired::Now(a2)) = (s.acquire(v4(2)), s.acquire(v4(2))) else {
            panic!("two slots free");
        };
        // The hog queues four, then a scraper queues one.
        let hog: Vec<_> = (0..4)
            .map(|_| match s.acquire(v4(2)) {
                Acquired::Wait(rx) => rx,
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(matches!(s.acquire(v4(2)), Acquired::Busy), "its share is 4");
        let Acquired::Wait(scraper) = s.acquire(v4(1)) else {
            panic!("the scraper queues");
        };
        drop(a1);
        let slot = scraper.await.expect("the scraper is served first");
        assert_eq!(slot.client, Client::of(v4(1)));
        drop(a2);
        drop(slot);
        // Then the hog's, in order.
        let mut served = 0;
        for rx in hog {
            drop(rx.await.expect("served"));
            served += 1;
        }
        assert_eq!(served, 4);
        assert_eq!(s.counts(), (0, 0, 0));
    }

    #[tokio::test]
    async fn a_newcomer_at_a_full_queue_takes_the_place_of_the_heaviest_client() {
        let s = Slots::with(1, 4, 4);
        let Acquired::Now(busy) = s.acquire(v4(2)) else {
            panic!("one slot free");
        };
        let mut hog: Vec<_> = (0..4)
            .map(|_| match s.acquire(v4(2)) {
                Acquired::Wait(rx) => rx,
                other => panic!("{other:?}"),
            })
            .collect();
        let Acquired::Wait(scraper) = s.acquire(v4(1)) else {
            panic!("the newcomer gets a place");
        };
        let evicted = hog.pop().expect("four waiting");
        assert!(evicted.await.is_err(), "the hog's newest waiter gave way");
        drop(busy);
        assert!(scraper.await.is_ok());
        // A waiter that hung up is skipped.
        drop(hog.remove(0));
        drop(hog);
        assert_eq!(s.counts(), (0, 0, 0));
    }
}
