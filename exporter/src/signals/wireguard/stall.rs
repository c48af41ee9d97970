//! Kernel WireGuard's stalled peers: a peer that keeps completing handshakes while it sends
//! us nothing but handshake and keepalive messages — the tunnel is up as far as the protocol
//! sees it, and no data comes through (a path that passes handshakes but drops data messages,
//! an MTU black hole for large messages, a peer whose decryption or routing is broken).
//!
//! What the module counts (`drivers/net/wireguard/receive.c`): `update_rx_stats(peer, len)`
//! adds to the peer's `rx_bytes` (and the device's) each authenticated handshake message it
//! receives, at its full size without the UDP header (`skb->len` at the end of
//! `wg_receive_handshake_packet`: an initiation is [`HANDSHAKE_INITIATION`] bytes, a response
//! [`HANDSHAKE_RESPONSE`]; cookie replies are not counted), each keepalive as
//! `message_data_len(0)` = [`KEEPALIVE`] bytes, and each data message as
//! `message_data_len(padded plaintext)` (≥ 64 bytes for the smallest IPv4 packet). So rx never
//! stays flat while handshakes go on, and a per-peer read of the counters alone cannot tell
//! data from control: the rule bounds what control traffic can amount to instead.
//!
//! When a handshake completes (`WGPEER_A_LAST_HANDSHAKE_TIME` set, `wg_timers_handshake_complete`:
//! on the initiator when the response arrives, on the responder when the first message of the
//! new session does) and the sender keeps sending data without receiving an authenticated
//! packet back, its `new_handshake` timer starts another handshake after
//! `KEEPALIVE_TIMEOUT + REKEY_TIMEOUT` (15 s): a stalled peer's handshakes come every ~15 s
//! (or whenever data is sent again after a pause). A healthy session is rekeyed only after
//! [`REKEY_AFTER_TIME`] (120 s), and a one-way flow gets passive keepalives back (which cancel
//! that timer).
//!
//! **The rule**, per peer, between two consecutive reads that saw its last handshake time
//! move (a *window*): the window is *control-only* when the handshakes are less than
//! [`REKEY_AFTER_TIME`] apart and the peer's `rx_bytes` grew by no more than
//! [`control_allowance`] of the window's length (every handshake message and keepalive the
//! protocol's timers allow in that time). A peer is **stalled** after [`STALL_WINDOWS`]
//! control-only windows in a row, and stays so until its rx grows past the allowance (data
//! came back), a window is not control-only, or no handshake completed for
//! [`REKEY_AFTER_TIME`] (nothing is being sent: nothing to tell). Two windows, not one: two
//! handshakes a moment apart (both ends initiating at once) on an idle tunnel would otherwise
//! look like one. Data below the allowance (≈ 80 bytes/s) cannot be told from control and
//! counts as none.
//!
//! Series stay bounded: per device (at most [`MAX_DEVICES`]) its peers, stalled peers and a
//! counter of stalls; per stalled peer a gauge, at most [`MAX_PEER_SERIES`] on the node.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use base64::Engine as _;
use prometheus::proto::MetricFamily;

use crate::exposition::Spec;
use crate::kernel::wg_netlink::{Device, KEY_LEN, Peer};

/// `sizeof(struct message_handshake_initiation)`: what the responder's rx counts per
/// initiation.
pub const HANDSHAKE_INITIATION: u64 = 148;
/// `sizeof(struct message_handshake_response)`: what the initiator's rx counts per response.
pub const HANDSHAKE_RESPONSE: u64 = 92;
/// `message_data_len(0)`: a keepalive (16 bytes of header, 16 of tag).
pub const KEEPALIVE: u64 = 32;
/// `REKEY_TIMEOUT`: a peer sends at most one initiation this often.
pub const REKEY_TIMEOUT: Duration = Duration::from_secs(5);
/// `KEEPALIVE_TIMEOUT`: the passive keepalive's delay.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// `REKEY_AFTER_TIME`: a healthy session's keys are renewed no sooner.
pub const REKEY_AFTER_TIME: Duration = Duration::from_secs(120);
/// Control-only windows in a row before a peer counts as stalled.
pub const STALL_WINDOWS: u32 = 2;
/// Stalled peers shown one by one, node-wide (the rest only in their device's count).
pub const MAX_PEER_SERIES: usize = 32;
/// Devices followed, node-wide.
pub const MAX_DEVICES: usize = 64;

const PEERS: Spec = Spec::gauge(
    "bufscope_wireguard_peers",
    "Peers of a kernel WireGuard device at the last read (its generic netlink dump), by the network namespace it was read in, its UDP listen port and its name.",
    &["netns", "port", "device"],
);

const STALLED: Spec = Spec::gauge(
    "bufscope_wireguard_stalled_peers",
    "Peers of a kernel WireGuard device that keep completing handshakes while they send nothing but handshake and keepalive messages (two windows between handshakes in a row, each under 120 s, whose rx bytes protocol control traffic explains).",
    &["netns", "port", "device"],
);

const STALLS: Spec = Spec::counter(
    "bufscope_wireguard_peer_stalls_total",
    "Times a peer of a kernel WireGuard device became stalled (see bufscope_wireguard_stalled_peers).",
    &["netns", "port", "device"],
);

const PEER_STALLED: Spec = Spec::gauge(
    "bufscope_wireguard_peer_stalled",
    "1 for each stalled peer of a kernel WireGuard device (peer: its public key, as wg show prints it); at most 32 on a node, the rest only in bufscope_wireguard_stalled_peers.",
    &["netns", "port", "device", "peer"],
);

/// Every handshake and keepalive message a peer can send us in `elapsed`, in rx bytes: one
/// initiation and one response per [`REKEY_TIMEOUT`] (it initiates at most that often, and
/// we receive responses only to our own initiations, as rate-limited), one keepalive per
/// [`KEEPALIVE_TIMEOUT`] (passive), one per handshake (the initiator's confirmation) and one
/// per persistent-keepalive interval (`persistent_keepalive` seconds, 0: off); each count
/// rounded up.
pub fn control_allowance(elapsed: Duration, persistent_keepalive: u16) -> u64 {
    let per = |every: Duration| -> u64 {
        let every = every.as_millis().max(1);
        u64::try_from(elapsed.as_millis().div_ceil(every)).unwrap_or(u64::MAX)
    };
    let handshakes = per(REKEY_TIMEOUT).saturating_add(1);
    let mut keepalives = per(KEEPALIVE_TIMEOUT)
        .saturating_add(1)
        .saturating_add(handshakes);
    if persistent_keepalive > 0 {
        keepalives = keepalives
            .saturating_add(per(Duration::from_secs(u64::from(persistent_keepalive))))
            .saturating_add(1);
    }
    handshakes
        .saturating_mul(HANDSHAKE_INITIATION + HANDSHAKE_RESPONSE)
        .saturating_add(keepalives.saturating_mul(KEEPALIVE))
}

/// A peer's counters when a read first saw its current handshake.
#[derive(Clone, Copy, Debug)]
struct Anchor {
    at: Instant,
    rx: u64,
    handshake_ns: u64,
}

/// One peer, between reads.
#[derive(Debug, Default)]
struct PeerState {
    anchor: Option<Anchor>,
    /// Control-only windows in a row.
    control_windows: u32,
    stalled: bool,
}

impl PeerState {
    /// Applies a read of the peer at `now`; true when it just became stalled.
    fn observe(&mut self, now: Instant, p: &Peer) -> bool {
        let Some(a) = self.anchor else {
            self.anchor = Some(Anchor {
                at: now,
                rx: p.rx_bytes,
                handshake_ns: p.last_handshake_ns,
            });
            return false;
        };
        if p.rx_bytes < a.rx {
            // Counters reset (the peer was removed and added again): start over.
            *self = Self::default();
            return self.observe(now, p);
        }
        let grown = p.rx_bytes - a.rx;
        let elapsed = now.saturating_duration_since(a.at);
        let was = self.stalled;
        if p.last_handshake_ns != a.handshake_ns && p.last_handshake_ns != 0 {
            let gap = p.last_handshake_ns.saturating_sub(a.handshake_ns);
            let forced = a.handshake_ns != 0 && gap < REKEY_AFTER_TIME.as_nanos() as u64;
            let control = grown <= control_allowance(elapsed, p.persistent_keepalive);
            if forced && control {
                self.control_windows = self.control_windows.saturating_add(1);
            } else {
                self.control_windows = 0;
            }
            self.stalled = self.control_windows >= STALL_WINDOWS;
            self.anchor = Some(Anchor {
                at: now,
                rx: p.rx_bytes,
                handshake_ns: p.last_handshake_ns,
            });
        } else if self.stalled
            && (grown > control_allowance(elapsed, p.persistent_keepalive)
                || elapsed >= REKEY_AFTER_TIME)
        {
            // Data came back, or the handshakes stopped (nothing sent: nothing to tell).
            self.stalled = false;
            self.control_windows = 0;
        }
        self.stalled && !was
    }
}

/// One device, between reads.
#[derive(Debug)]
struct DeviceState {
    name: String,
    port: u16,
    peers: HashMap<[u8; KEY_LEN], PeerState>,
    /// Times a peer became stalled.
    stalls: u64,
}

impl DeviceState {
    fn stalled(&self) -> impl Iterator<Item = &[u8; KEY_LEN]> {
        self.peers.iter().filter(|(_, p)| p.stalled).map(|(k, _)| k)
    }
}

/// Every kernel WireGuard device's peers, followed between reads.
#[derive(Debug, Default)]
pub struct Stall {
    /// (namespace, ifindex) → its state.
    devices: BTreeMap<(u32, u32), DeviceState>,
    /// Whether [`MAX_DEVICES`] was said to be reached.
    said_full: bool,
}

impl Stall {
    /// An empty follower.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one read of namespace `netns` (its devices, all of them): devices it no longer
    /// lists go, with their series. True when a peer's stalled state changed.
    pub fn update(&mut self, netns: u32, devices: &[Device], now: Instant) -> bool {
        let listed: Vec<u32> = devices.iter().map(|d| d.ifindex).collect();
        self.devices
            .retain(|(ns, ifindex), _| *ns != netns || listed.contains(ifindex));
        let mut changed = false;
        for d in devices {
            let key = (netns, d.ifindex);
            if !self.devices.contains_key(&key) {
                if self.devices.len() >= MAX_DEVICES {
                    if !self.said_full {
                        self.said_full = true;
                        tracing::warn!(
                            "more than {MAX_DEVICES} kernel WireGuard devices: the others' stalls are not followed (said once)"
                        );
                    }
                    continue;
                }
                self.devices.insert(
                    key,
                    DeviceState {
                        name: String::new(),
                        port: 0,
                        peers: HashMap::new(),
                        stalls: 0,
                    },
                );
            }
            let Some(s) = self.devices.get_mut(&key) else {
                continue;
            };
            s.name.clone_from(&d.name);
            s.port = d.listen_port;
            s.peers
                .retain(|k, _| d.peers.iter().any(|p| p.public_key == *k));
            for p in &d.peers {
                let st = s.peers.entry(p.public_key).or_default();
                let was = st.stalled;
                if st.observe(now, p) {
                    s.stalls += 1;
                    tracing::info!(
                        netns,
                        device = %d.name,
                        peer = %peer_label(&p.public_key),
                        "kernel WireGuard peer stalled: it keeps handshaking and sends only handshake and keepalive messages"
                    );
                }
                changed |= st.stalled != was;
            }
        }
        changed
    }

    /// Forgets the devices of namespaces not in `live` (gone, or no longer read).
    pub fn retain_namespaces(&mut self, live: impl Fn(u32) -> bool) {
        self.devices.retain(|(ns, _), _| live(*ns));
    }

    /// Forgets every device (the module was unloaded).
    pub fn clear(&mut self) {
        self.devices.clear();
    }

    /// (namespace, device, peer key) of every stalled peer.
    #[cfg(test)]
    pub fn stalled(&self) -> Vec<(u32, String, String)> {
        self.devices
            .iter()
            .flat_map(|((ns, _), d)| {
                d.stalled()
                    .map(move |k| (*ns, d.name.clone(), peer_label(k)))
            })
            .collect()
    }

    /// The stall families.
    pub fn families(&self, out: &mut Vec<MetricFamily>) {
        if self.devices.is_empty() {
            return;
        }
        let mut peers = PEERS.family();
        let mut stalled = STALLED.family();
        let mut stalls = STALLS.family();
        let mut each = PEER_STALLED.family();
        let mut shown = 0;
        for ((ns, _), d) in &self.devices {
            let (ns, port) = (ns.to_string(), d.port.to_string());
            let labels = [ns.as_str(), port.as_str(), d.name.as_str()];
            peers.push(&labels, d.peers.len() as f64);
            let mut keys: Vec<String> = d.stalled().map(peer_label).collect();
            stalled.push(&labels, keys.len() as f64);
            if d.stalls > 0 {
                stalls.push(&labels, d.stalls as f64);
            }
            keys.sort_unstable();
            for k in keys {
                if shown >= MAX_PEER_SERIES {
                    break;
                }
                shown += 1;
                each.push(&[ns.as_str(), port.as_str(), d.name.as_str(), &k], 1.0);
            }
        }
        peers.done(out);
        stalled.done(out);
        stalls.done(out);
        each.done(out);
    }
}

/// A public key as `wg show` prints it (standard base64).
pub fn peer_label(key: &[u8; KEY_LEN]) -> String {
    base64::engine::general_purpose::STANDARD.encode(key)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const S: u64 = 1_000_000_000;

    fn peer(rx: u64, handshake_s: u64) -> Peer {
        Peer {
            public_key: [7; KEY_LEN],
            last_handshake_ns: handshake_s * S,
            rx_bytes: rx,
            tx_bytes: 0,
            persistent_keepalive: 0,
        }
    }

    fn device(peers: Vec<Peer>) -> Device {
        Device {
            ifindex: 3,
            name: "wg0".into(),
            listen_port: 51820,
            peers,
        }
    }

    #[test]
    fn the_allowance_counts_every_message_the_timers_allow() {
        // 15 s: 3+1 handshakes of 148+92, (2+1) passive + 4 confirmation keepalives of 32.
        assert_eq!(
            control_allowance(Duration::from_secs(15), 0),
            4 * 240 + 7 * 32
        );
        // A persistent keepalive every 25 s adds one, plus one rounding.
        assert_eq!(
            control_allowance(Duration::from_secs(15), 25),
            4 * 240 + 9 * 32
        );
        // A ping a second over 15 s (128 rx bytes each) is more than control explains.
        assert!(15 * 128 > control_allowance(Duration::from_secs(15), 0));
    }

    /// The stalled initiator as the matrix step sees it: data messages blocked, a handshake
    /// every ~15 s, each adding one response (92 bytes) to rx.
    #[test]
    fn handshakes_every_15_s_with_only_responses_stall_after_two_windows() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut st = PeerState::default();
        // The session's first handshake at wall 1000 s, then healthy traffic.
        assert!(!st.observe(at(0), &peer(10_000, 1000)));
        assert!(!st.observe(at(10), &peer(30_000, 1000)));
        // Blocked from 10 s: a handshake at 25 s; the window since 0 s had data.
        assert!(!st.observe(at(26), &peer(30_092, 1025)));
        assert!(!st.stalled);
        // 40 s: one control-only window.
        assert!(!st.observe(at(41), &peer(30_184, 1040)));
        assert_eq!(st.control_windows, 1);
        // 55 s: the second: stalled.
        assert!(st.observe(at(56), &peer(30_276, 1055)));
        assert!(st.stalled);
        // Reads between handshakes keep it.
        assert!(!st.observe(at(60), &peer(30_276, 1055)));
        assert!(st.stalled);
        // Data again: rx past the allowance since the last handshake.
        st.observe(at(66), &peer(40_000, 1055));
        assert!(!st.stalled);
    }

    #[test]
    fn rekeys_of_a_healthy_idle_tunnel_are_no_stall() {
        // Persistent keepalive every 25 s: a handshake every ~125 s, keepalives only.
        let t0 = Instant::now();
        let mut st = PeerState::default();
        let mut rx = 1000;
        for i in 0..10u64 {
            rx += 5 * KEEPALIVE + HANDSHAKE_RESPONSE;
            let mut p = peer(rx, 1000 + 125 * i);
            p.persistent_keepalive = 25;
            st.observe(t0 + Duration::from_secs(125 * i + 1), &p);
            assert!(!st.stalled, "rekey {i}");
        }
        // Two handshakes a moment apart (both ends initiated), then the usual rekey: not
        // two short windows in a row.
        let mut st = PeerState::default();
        st.observe(t0, &peer(1000, 1000));
        st.observe(t0 + Duration::from_secs(3), &peer(1092, 1002));
        st.observe(t0 + Duration::from_secs(125), &peer(1400, 1122));
        assert!(!st.stalled);
    }

    #[test]
    fn data_between_handshakes_is_no_stall() {
        // Handshakes every 15 s (e.g. a lossy path), but 2 KB of data in each window.
        let t0 = Instant::now();
        let mut st = PeerState::default();
        for i in 0..6u64 {
            st.observe(
                t0 + Duration::from_secs(15 * i),
                &peer(2000 * i, 1000 + 15 * i),
            );
            assert!(!st.stalled);
        }
    }

    #[test]
    fn a_stall_ends_when_handshakes_stop_and_counters_reset_start_over() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut st = PeerState::default();
        st.observe(at(0), &peer(100, 1000));
        st.observe(at(15), &peer(192, 1015));
        assert!(st.observe(at(30), &peer(284, 1030)));
        // The sender stopped: no handshake for REKEY_AFTER_TIME.
        st.observe(at(30 + REKEY_AFTER_TIME.as_secs()), &peer(284, 1030));
        assert!(!st.stalled);
        // Removed and added again: counters from 0, no verdict from the old ones.
        st.observe(at(200), &peer(0, 0));
        assert!(!st.stalled && st.control_windows == 0);
    }

    #[test]
    fn devices_render_bounded_series_and_go_when_unlisted() {
        let t0 = Instant::now();
        let mut s = Stall::new();
        for (i, (rx, hs)) in [(100, 1000), (192, 1015), (284, 1030)].iter().enumerate() {
            let other = Peer {
                public_key: [9; KEY_LEN],
                ..peer(5000 * (i as u64 + 1), 1000)
            };
            s.update(
                4026531840,
                &[device(vec![peer(*rx, *hs), other])],
                t0 + Duration::from_secs(15 * i as u64),
            );
        }
        let key = peer_label(&[7; KEY_LEN]);
        assert_eq!(
            s.stalled(),
            vec![(4026531840, "wg0".to_string(), key.clone())]
        );
        let mut out = Vec::new();
        s.families(&mut out);
        let get = |name: &str| {
            out.iter()
                .find(|f| f.name() == name)
                .map(|f| {
                    f.get_metric()
                        .iter()
                        .map(|m| {
                            let l: Vec<&str> = m.get_label().iter().map(|l| l.value()).collect();
                            let v = m.get_counter().get_value() + m.get_gauge().get_value();
                            (l.join(","), v)
                        })
                        .collect::<Vec<_>>()
                })
                .unwrap()
        };
        assert_eq!(
            get("bufscope_wireguard_peers"),
            [("4026531840,51820,wg0".into(), 2.0)]
        );
        assert_eq!(
            get("bufscope_wireguard_stalled_peers"),
            [("4026531840,51820,wg0".into(), 1.0)]
        );
        assert_eq!(
            get("bufscope_wireguard_peer_stalls_total"),
            [("4026531840,51820,wg0".into(), 1.0)]
        );
        assert_eq!(
            get("bufscope_wireguard_peer_stalled"),
            [(format!("4026531840,51820,wg0,{key}"), 1.0)]
        );
        // The namespace's next read no longer lists the device: its series go.
        s.update(4026531840, &[], t0 + Duration::from_secs(50));
        let mut out = Vec::new();
        s.families(&mut out);
        assert!(out.is_empty());
    }
}
