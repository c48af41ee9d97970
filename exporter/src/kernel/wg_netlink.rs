//! Kernel WireGuard's devices of a network namespace, read from the kernel the way `wg show`
//! does: the `wireguard` links from rtnetlink (`RTM_GETLINK` dump, `IFLA_INFO_KIND` =
//! "wireguard"), then each one's `WG_CMD_GET_DEVICE` dump from the module's generic netlink
//! family (its interface name and UDP listen port: the first message of the dump carries
//! them; and its peers, spread over the dump's messages: each peer's public key, last
//! handshake time, rx/tx bytes and persistent keepalive interval — `wg show … dump`'s
//! columns without the keys' secrets or the allowed IPs).
//!
//! Both answer for the network namespace the netlink socket was made in: another namespace
//! is read from a short-lived thread that enters it ([`super::netlink::in_netns`],
//! `setns`: `CAP_SYS_ADMIN` over it). `WG_CMD_GET_DEVICE` needs `CAP_NET_ADMIN` in that
//! namespace, and its answer carries the device's private key: only the name and the port are
//! kept, and the receive buffer is zeroed after each read.

use std::io;
use std::path::Path;

use super::netlink::{NLMSG_HDR, attrs, exchange, header, socket, u32_at};

/// `NETLINK_GENERIC`.
const NETLINK_GENERIC: i32 = 16;
/// `NETLINK_ROUTE`.
const NETLINK_ROUTE: i32 = 0;
/// `RTM_NEWLINK`, `RTM_GETLINK`.
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
/// `sizeof(struct ifinfomsg)`.
const IFINFOMSG: usize = 16;
/// `IFLA_IFNAME`, `IFLA_LINKINFO`, and `IFLA_INFO_KIND` inside it.
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
/// `GENL_ID_CTRL`, `CTRL_CMD_GETFAMILY`, `CTRL_ATTR_FAMILY_ID`, `CTRL_ATTR_FAMILY_NAME`.
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// `sizeof(struct genlmsghdr)`.
const GENL_HDR: usize = 4;
/// `WG_GENL_NAME`, `WG_GENL_VERSION`, `WG_CMD_GET_DEVICE`.
const WG_GENL_NAME: &str = "wireguard";
const WG_GENL_VERSION: u8 = 1;
const WG_CMD_GET_DEVICE: u8 = 0;
/// `WGDEVICE_A_IFINDEX`, `WGDEVICE_A_IFNAME`, `WGDEVICE_A_LISTEN_PORT`.
const WGDEVICE_A_IFINDEX: u16 = 1;
const WGDEVICE_A_IFNAME: u16 = 2;
const WGDEVICE_A_LISTEN_PORT: u16 = 6;
/// `WGDEVICE_A_PEERS` (nested: one nested attribute per peer).
const WGDEVICE_A_PEERS: u16 = 8;
/// `WGPEER_A_PUBLIC_KEY`, `WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL`,
/// `WGPEER_A_LAST_HANDSHAKE_TIME` (`struct __kernel_timespec`), `WGPEER_A_RX_BYTES`,
/// `WGPEER_A_TX_BYTES` (`include/uapi/linux/wireguard.h`).
const WGPEER_A_PUBLIC_KEY: u16 = 1;
const WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL: u16 = 5;
const WGPEER_A_LAST_HANDSHAKE_TIME: u16 = 6;
const WGPEER_A_RX_BYTES: u16 = 7;
const WGPEER_A_TX_BYTES: u16 = 8;
/// `WG_KEY_LEN`.
pub const KEY_LEN: usize = 32;

/// A kernel WireGuard device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// Its interface index.
    pub ifindex: u32,
    /// Its interface name (`wg0`).
    pub name: String,
    /// Its UDP listen port (0: not listening yet).
    pub listen_port: u16,
    /// Its peers, in the module's order.
    pub peers: Vec<Peer>,
}

/// A peer of a kernel WireGuard device, as `WG_CMD_GET_DEVICE` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its public key (what `wg show` prints, base64).
    pub public_key: [u8; KEY_LEN],
    /// `WGPEER_A_LAST_HANDSHAKE_TIME` in nanoseconds of the wall clock (0: never).
    pub last_handshake_ns: u64,
    /// Bytes the module accounted as received from it (`update_rx_stats`: data, keepalives
    /// and authenticated handshake messages, each without its UDP header).
    pub rx_bytes: u64,
    /// Bytes sent to it.
    pub tx_bytes: u64,
    /// Its persistent keepalive interval in seconds (0: off).
    pub persistent_keepalive: u16,
}

/// Why the devices of a namespace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WgNetlinkError {
    /// The `wireguard` generic netlink family is not registered (the module is not loaded).
    #[error("the kernel has no `wireguard` generic netlink family (module not loaded)")]
    NoFamily,
    /// Entering the namespace failed.
    #[error("entering network namespace {path}: {source} (setns needs CAP_SYS_ADMIN over it)")]
    Enter {
        /// The namespace's path.
        path: String,
        /// The error.
        source: io::Error,
    },
    /// A netlink request failed.
    #[error("{what}: {source}")]
    Netlink {
        /// The request.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
}

impl WgNetlinkError {
    /// A short, stable name of the cause (for saying each cause once).
    pub fn cause(&self) -> &'static str {
        match self {
            Self::NoFamily => "no_family",
            Self::Enter { .. } => "setns",
            Self::Netlink { what, .. } => what,
        }
    }
}

/// The id of the `wireguard` generic netlink family (global: the same in every namespace).
pub fn family_id() -> Result<u16, WgNetlinkError> {
    let what = "CTRL_CMD_GETFAMILY wireguard";
    let err = |source| WgNetlinkError::Netlink { what, source };
    let fd = socket(NETLINK_GENERIC).map_err(err)?;
    let mut name = WG_GENL_NAME.as_bytes().to_vec();
    name.push(0);
    let req = genl_request(
        GENL_ID_CTRL,
        libc::NLM_F_REQUEST | libc::NLM_F_ACK,
        CTRL_CMD_GETFAMILY,
        2,
        &[(CTRL_ATTR_FAMILY_NAME, &name)],
        1,
    );
    let mut id = None;
    let r = exchange(&fd, &req, 1, |kind, body| {
        if kind == GENL_ID_CTRL {
            id = id.or_else(|| parse_family_id(body));
        }
    });
    match r {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Err(WgNetlinkError::NoFamily),
        Err(e) => Err(err(e)),
        Ok(()) => id.ok_or(WgNetlinkError::NoFamily),
    }
}

/// The WireGuard devices of the calling thread's network namespace (`family`: from
/// [`family_id`]).
pub fn devices(family: u16) -> Result<Vec<Device>, WgNetlinkError> {
    let links = wireguard_links().map_err(|source| WgNetlinkError::Netlink {
        what: "RTM_GETLINK",
        source,
    })?;
    let what = "WG_CMD_GET_DEVICE";
    let err = |source| WgNetlinkError::Netlink { what, source };
    if links.is_empty() {
        return Ok(Vec::new());
    }
    let fd = socket(NETLINK_GENERIC).map_err(err)?;
    let mut out = Vec::with_capacity(links.len());
    for (seq, (ifindex, name)) in (1u32..).zip(links) {
        let req = genl_request(
            family,
            libc::NLM_F_REQUEST | libc::NLM_F_DUMP,
            WG_CMD_GET_DEVICE,
            WG_GENL_VERSION,
            &[(WGDEVICE_A_IFINDEX, &ifindex.to_ne_bytes())],
            seq,
        );
        let mut dev: Option<Device> = None;
        let mut peers = Vec::new();
        let r = exchange(&fd, &req, seq, |kind, body| {
            if kind == family {
                if dev.is_none() {
                    dev = parse_device(body);
                }
                parse_peers(body, &mut peers);
            }
        });
        match r {
            Ok(()) => {
                let mut d = dev.unwrap_or(Device {
                    ifindex,
                    name,
                    listen_port: 0,
                    peers: Vec::new(),
                });
                d.peers = peers;
                out.push(d);
            }
            // Deleted between the two dumps.
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {}
            Err(e) => return Err(err(e)),
        }
    }
    Ok(out)
}

/// [`devices`] of the namespace at `ns` (None: this process's own).
pub fn devices_in(ns: Option<&Path>, family: u16) -> Result<Vec<Device>, WgNetlinkError> {
    let Some(path) = ns else {
        return devices(family);
    };
    let mut inner = None;
    let entered = super::netlink::in_netns(path, || {
        inner = Some(devices(family));
        Ok(())
    });
    match entered {
        Err(source) => Err(WgNetlinkError::Enter {
            path: path.display().to_string(),
            source,
        }),
        Ok(()) => inner.unwrap_or(Ok(Vec::new())),
    }
}

/// The links of kind `wireguard` of the calling thread's namespace: (ifindex, name).
fn wireguard_links() -> io::Result<Vec<(u32, String)>> {
    let fd = socket(NETLINK_ROUTE)?;
    let mut req = header(
        RTM_GETLINK,
        libc::NLM_F_REQUEST | libc::NLM_F_DUMP,
        1,
        IFINFOMSG,
    );
    req.resize(NLMSG_HDR + IFINFOMSG, 0);
    let mut links = Vec::new();
    exchange(&fd, &req, 1, |kind, body| {
        if kind == RTM_NEWLINK
            && let Some((ifindex, name, Some(kind))) = parse_link(body)
            && kind == WG_GENL_NAME
        {
            links.push((ifindex, name));
        }
    })?;
    Ok(links)
}

/// A generic netlink request: header, `genlmsghdr` (`cmd`, `version`) and `attrs`.
fn genl_request(
    family: u16,
    flags: i32,
    cmd: u8,
    version: u8,
    attrs: &[(u16, &[u8])],
    seq: u32,
) -> Vec<u8> {
    let mut m = header(family, flags, seq, GENL_HDR);
    m.extend_from_slice(&[cmd, version, 0, 0]);
    for (kind, value) in attrs {
        m.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(value);
        m.resize(m.len().next_multiple_of(4), 0);
    }
    let len = m.len() as u32;
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    m
}

/// A NUL-terminated string attribute's text (lossy: interface names are bytes).
fn string(v: &[u8]) -> String {
    let end = v.iter().position(|c| *c == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

/// An `RTM_NEWLINK` body: (ifindex, name, `IFLA_INFO_KIND` where it has one).
fn parse_link(body: &[u8]) -> Option<(u32, String, Option<String>)> {
    let ifindex = u32_at(body.get(..IFINFOMSG)?, 4);
    let mut name = None;
    let mut kind = None;
    for (t, v) in attrs(&body[IFINFOMSG..]) {
        match t {
            IFLA_IFNAME => name = Some(string(v)),
            IFLA_LINKINFO => {
                kind = attrs(v)
                    .find(|(t, _)| *t == IFLA_INFO_KIND)
                    .map(|(_, v)| string(v));
            }
            _ => {}
        }
    }
    Some((ifindex, name?, kind))
}

/// The family id of a `CTRL_CMD_NEWFAMILY` body.
fn parse_family_id(body: &[u8]) -> Option<u16> {
    attrs(body.get(GENL_HDR..)?)
        .find(|(t, v)| *t == CTRL_ATTR_FAMILY_ID && v.len() >= 2)
        .map(|(_, v)| u16::from_ne_bytes([v[0], v[1]]))
}

/// The device of a `WG_CMD_GET_DEVICE` answer's first message (None: a later message of the
/// dump, which names no port).
fn parse_device(body: &[u8]) -> Option<Device> {
    let mut ifindex = None;
    let mut name = None;
    let mut port = None;
    for (t, v) in attrs(body.get(GENL_HDR..)?) {
        match t {
            WGDEVICE_A_IFINDEX if v.len() >= 4 => ifindex = Some(u32_at(v, 0)),
            WGDEVICE_A_IFNAME => name = Some(string(v)),
            WGDEVICE_A_LISTEN_PORT if v.len() >= 2 => port = Some(u16::from_ne_bytes([v[0], v[1]])),
            _ => {}
        }
    }
    Some(Device {
        ifindex: ifindex?,
        name: name?,
        listen_port: port?,
        peers: Vec::new(),
    })
}

/// Adds the peers of one message of a `WG_CMD_GET_DEVICE` dump to `out`. A peer whose
/// allowed IPs did not fit in one message comes again at the start of the next one with its
/// public key and more allowed IPs only: it is not added twice.
fn parse_peers(body: &[u8], out: &mut Vec<Peer>) {
    let Some(attributes) = body.get(GENL_HDR..) else {
        return;
    };
    for (t, list) in attrs(attributes) {
        if t != WGDEVICE_A_PEERS {
            continue;
        }
        for (_, peer) in attrs(list) {
            let mut key = None;
            let mut p = Peer {
                public_key: [0; KEY_LEN],
                last_handshake_ns: 0,
                rx_bytes: 0,
                tx_bytes: 0,
                persistent_keepalive: 0,
            };
            let mut stats = false;
            for (t, v) in attrs(peer) {
                match t {
                    WGPEER_A_PUBLIC_KEY => key = <[u8; KEY_LEN]>::try_from(v).ok(),
                    WGPEER_A_LAST_HANDSHAKE_TIME if v.len() >= 16 => {
                        let sec = u64_at(v, 0);
                        let nsec = u64_at(v, 8);
                        p.last_handshake_ns =
                            sec.saturating_mul(1_000_000_000).saturating_add(nsec);
                    }
                    WGPEER_A_RX_BYTES if v.len() >= 8 => {
                        p.rx_bytes = u64_at(v, 0);
                        stats = true;
                    }
                    WGPEER_A_TX_BYTES if v.len() >= 8 => p.tx_bytes = u64_at(v, 0),
                    WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL if v.len() >= 2 => {
                        p.persistent_keepalive = u16::from_ne_bytes([v[0], v[1]]);
                    }
                    _ => {}
                }
            }
            let Some(key) = key else {
                continue;
            };
            p.public_key = key;
            // The continuation of a peer split over two messages carries no counters.
            if !stats && out.last().is_some_and(|l| l.public_key == key) {
                continue;
            }
            out.push(p);
        }
    }
}

/// Reads a host-order `u64` at `off` of `b`, 0 when `b` is shorter.
fn u64_at(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::kernel::netlink::messages;

    /// A capture (`wg_netlink_testdata/*.hex`: the kernel's answer datagrams, hex) as bytes.
    fn capture(hex: &str) -> Vec<u8> {
        let hex: String = hex.split_whitespace().collect();
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Every message of a captured datagram of request `seq`: (type, body); and whether it
    /// ends the answer.
    fn walk(b: &[u8], seq: u32) -> (Vec<(u16, Vec<u8>)>, bool) {
        let mut out = Vec::new();
        let done = messages(b, seq, &mut |k, body| out.push((k, body.to_vec()))).unwrap();
        (out, done)
    }

    /// Captured in the matrix's Debian 6.12 guest (integration/tests/wireguard.rs's tunnel,
    /// namespace B): `CTRL_CMD_GETFAMILY` "wireguard" → family 0x24.
    #[test]
    fn captured_family_answer_names_the_id() {
        let (msgs, _) = walk(
            &capture(include_str!("wg_netlink_testdata/family-6.12.hex")),
            1,
        );
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].0, GENL_ID_CTRL);
        assert_eq!(parse_family_id(&msgs[0].1), Some(0x24));
    }

    /// The same guest: `RTM_GETLINK` of `wg0` → index 3, kind "wireguard" (from
    /// `IFLA_LINKINFO`, among the 33 attributes of a 1,428-byte message).
    #[test]
    fn captured_link_is_a_wireguard_link() {
        let (msgs, _) = walk(
            &capture(include_str!("wg_netlink_testdata/link-6.12.hex")),
            1,
        );
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].0, RTM_NEWLINK);
        assert_eq!(
            parse_link(&msgs[0].1),
            Some((3, "wg0".to_string(), Some("wireguard".to_string())))
        );
    }

    /// The same guest: the `WG_CMD_GET_DEVICE` dump of `wg0` (one peer; its private key
    /// zeroed in the captures) → name and listen port; `NLMSG_DONE` ends it. Also the 6.1
    /// guest's.
    #[test]
    fn captured_device_dump_names_the_device_and_port() {
        let b = capture(include_str!("wg_netlink_testdata/device-6.12.hex"));
        let (msgs, done) = walk(&b, 1);
        assert!(done, "the datagram ends with NLMSG_DONE");
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].0, 0x24);
        assert_eq!(
            parse_device(&msgs[0].1),
            Some(Device {
                ifindex: 3,
                name: "wg0".into(),
                listen_port: 52111,
                peers: Vec::new(),
            })
        );
        // Debian 12's 6.1: the same layout (its family is 0x21 there).
        let (msgs, done) = walk(
            &capture(include_str!("wg_netlink_testdata/device-6.1.hex")),
            1,
        );
        assert!(done);
        assert_eq!(msgs[0].0, 0x21);
        assert_eq!(
            parse_device(&msgs[0].1).map(|d| (d.ifindex, d.name, d.listen_port)),
            Some((3, "wg0".to_string(), 52075))
        );
        // A later message of a dump (peers only) names no device.
        let mut later = vec![WG_CMD_GET_DEVICE, WG_GENL_VERSION, 0, 0];
        later.extend_from_slice(&8u16.to_ne_bytes());
        later.extend_from_slice(&WGDEVICE_A_IFINDEX.to_ne_bytes());
        later.extend_from_slice(&3u32.to_ne_bytes());
        assert_eq!(parse_device(&later), None);
    }

    /// The peer of the captured 6.12 dump: its key, handshake time and counters, as
    /// `wg show wg0 dump` printed them in the guest.
    #[test]
    fn captured_device_dump_lists_its_peer() {
        let b = capture(include_str!("wg_netlink_testdata/device-6.12.hex"));
        let (msgs, _) = walk(&b, 1);
        let mut peers = Vec::new();
        parse_peers(&msgs[0].1, &mut peers);
        assert_eq!(peers.len(), 1, "{peers:?}");
        let p = &peers[0];
        assert_eq!(p.public_key[..4], [21, 98, 101, 207]);
        assert_eq!(p.last_handshake_ns, 1_796_571_088_210_960_584);
        // B answered A's handshake and one ping: rx = the initiation (148) + the echo
        // request (84 bytes padded to 96, + 32 of header and tag); tx = the response (92) +
        // the echo reply (128). `update_rx_stats` counts handshake messages too.
        assert_eq!((p.rx_bytes, p.tx_bytes), (148 + 128, 92 + 128));
        assert_eq!(p.persistent_keepalive, 0);
        // The same message again (a dump's next message repeating the peer with more
        // allowed IPs only): not a second peer.
        let mut cont = msgs[0].1[..GENL_HDR].to_vec();
        let mut peer = Vec::new();
        peer.extend_from_slice(&((4 + KEY_LEN) as u16).to_ne_bytes());
        peer.extend_from_slice(&WGPEER_A_PUBLIC_KEY.to_ne_bytes());
        peer.extend_from_slice(&p.public_key);
        let mut one = ((4 + peer.len()) as u16).to_ne_bytes().to_vec();
        one.extend_from_slice(&0u16.to_ne_bytes());
        one.extend_from_slice(&peer);
        cont.extend_from_slice(&((4 + one.len()) as u16).to_ne_bytes());
        cont.extend_from_slice(&(WGDEVICE_A_PEERS | 0x8000).to_ne_bytes());
        cont.extend_from_slice(&one);
        parse_peers(&cont, &mut peers);
        assert_eq!(peers.len(), 1, "a continuation is not a peer");
    }

    #[test]
    fn the_family_request_names_wireguard() {
        let r = genl_request(
            GENL_ID_CTRL,
            libc::NLM_F_REQUEST | libc::NLM_F_ACK,
            CTRL_CMD_GETFAMILY,
            2,
            &[(CTRL_ATTR_FAMILY_NAME, b"wireguard\0")],
            7,
        );
        // 16 header + 4 genl + 4 nla header + 10 name, padded to 36.
        assert_eq!(r.len(), 36);
        assert_eq!(u32_at(&r, 0), 36);
        assert_eq!(u16::from_ne_bytes([r[4], r[5]]), GENL_ID_CTRL);
        assert_eq!(u32_at(&r, 8), 7);
        assert_eq!(&r[16..20], &[CTRL_CMD_GETFAMILY, 2, 0, 0]);
        let a: Vec<_> = attrs(&r[20..]).collect();
        assert_eq!(a, vec![(CTRL_ATTR_FAMILY_NAME, &b"wireguard\0"[..])]);
    }

    /// This machine's own links, read with the same dump: every one has a name and an index,
    /// and a veth's kind is read from its link info.
    #[test]
    fn this_namespace_links_parse() {
        let fd = socket(NETLINK_ROUTE).unwrap();
        let mut req = header(
            RTM_GETLINK,
            libc::NLM_F_REQUEST | libc::NLM_F_DUMP,
            1,
            IFINFOMSG,
        );
        req.resize(NLMSG_HDR + IFINFOMSG, 0);
        let mut links = Vec::new();
        exchange(&fd, &req, 1, |kind, body| {
            if kind == RTM_NEWLINK {
                links.push(parse_link(body).unwrap());
            }
        })
        .unwrap();
        assert!(
            links.iter().any(|(i, n, _)| *i == 1 && n == "lo"),
            "{links:?}"
        );
        assert!(wireguard_links().is_ok());
    }
}
