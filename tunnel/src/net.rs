//! IP prefixes (`Address`, `AllowedIPs`) and the few IP header fields the data path reads.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An address with a prefix length, e.g. `10.0.0.1/24` or `fd00::/64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The address as written (host bits kept, as `ip addr add` wants them).
    pub addr: IpAddr,
    /// Prefix length.
    pub prefix: u8,
}

impl Cidr {
    /// The network part (host bits cleared), e.g. `10.0.0.0/24` for `10.0.0.1/24`.
    pub fn network(&self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask32(self.prefix))),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask128(self.prefix))),
        };
        Cidr {
            addr,
            prefix: self.prefix,
        }
    }

    /// Whether `ip` falls inside this prefix.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let m = mask32(self.prefix);
                u32::from(n) & m == u32::from(a) & m
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let m = mask128(self.prefix);
                u128::from(n) & m == u128::from(a) & m
            }
            _ => false,
        }
    }

    /// Whether every address of `other` is inside `self`.
    pub fn covers(&self, other: &Cidr) -> bool {
        other.prefix >= self.prefix && self.contains(other.addr)
    }
}

fn mask32(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    }
}

fn mask128(prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(prefix.min(128)))
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or prefix"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= max)
                .ok_or_else(|| format!("{s:?}: prefix length must be 0..={max}"))?,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The peer's `AllowedIPs`: which inner addresses may be sent to it and may come from it
/// (WireGuard's cryptokey routing, for a single peer).
#[derive(Debug, Clone, Default)]
pub struct AllowedIps(Vec<Cidr>);

impl AllowedIps {
    /// From a list of prefixes.
    pub fn new(prefixes: Vec<Cidr>) -> Self {
        Self(prefixes)
    }

    /// Whether `ip` is inside any prefix.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }

    /// The prefixes.
    pub fn prefixes(&self) -> &[Cidr] {
        &self.0
    }
}

/// Destination address of an IP packet, `None` if it is not a well-formed IPv4/IPv6 header.
pub fn packet_dst(packet: &[u8]) -> Option<IpAddr> {
    match packet.first()? >> 4 {
        4 => {
            let b: [u8; 4] = packet.get(16..20)?.try_into().ok()?;
            Some(IpAddr::from(b))
        }
        6 => {
            let b: [u8; 16] = packet.get(24..40)?.try_into().ok()?;
            Some(IpAddr::from(b))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parse_contains_and_network() {
        let c: Cidr = "10.0.0.1/24".parse().unwrap();
        assert!(c.contains("10.0.0.200".parse().unwrap()));
        assert!(!c.contains("10.0.1.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        assert_eq!(c.network().to_string(), "10.0.0.0/24");
        let h: Cidr = "10.0.0.2".parse().unwrap();
        assert_eq!(h.prefix, 32);
        assert!(c.covers(&h));
        assert!(!h.covers(&c));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("192.0.2.1".parse().unwrap()));
        let v6: Cidr = "fd00::1/64".parse().unwrap();
        assert!(v6.contains("fd00::abcd".parse().unwrap()));
        assert!(!v6.contains("fd01::1".parse().unwrap()));
        assert!("10.0.0.1/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
    }

    #[test]
    fn packet_destination() {
        let mut v4 = [0u8; 20];
        v4[0] = 0x45;
        v4[16..20].copy_from_slice(&[10, 0, 0, 2]);
        assert_eq!(packet_dst(&v4), Some("10.0.0.2".parse().unwrap()));
        assert_eq!(packet_dst(&v4[..10]), None);
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[39] = 1;
        assert_eq!(packet_dst(&v6), Some("::1".parse().unwrap()));
        assert_eq!(packet_dst(&[0u8; 40]), None);
    }
}
