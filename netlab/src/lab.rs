//! Two namespaces joined by a veth pair or by an emulated WAN link.

use std::net::Ipv4Addr;

use crate::netns::{Netns, VethPair, unique_name};
use crate::wan::{Forwarder, LinkParams, WanStats};
use crate::{Error, tun};

/// How the two namespaces are joined.
#[derive(Debug, Clone, PartialEq)]
pub enum LinkKind {
    /// A plain veth pair (no emulation, ~20 Gbit/s).
    Veth,
    /// Two TUN devices and a userspace forwarder applying a [`LinkParams`] per direction.
    Wan {
        /// Namespace `a` → namespace `b` (e.g. upload when `a` is the client).
        a_to_b: LinkParams,
        /// Namespace `b` → namespace `a`.
        b_to_a: LinkParams,
    },
}

/// What [`Lab::new`] builds.
#[derive(Debug, Clone, PartialEq)]
pub struct LabConfig {
    /// Name prefix of the namespaces and devices (`bsl` for bufscope's own lab). Names are
    /// `<prefix><pid>x<n>a` / `…b` (see [`unique_name`]).
    pub prefix: String,
    /// The link between the two namespaces.
    pub link: LinkKind,
    /// MTU of the link devices.
    pub mtu: u32,
    /// Address of namespace `a` on the link.
    pub addr_a: Ipv4Addr,
    /// Address of namespace `b` on the link.
    pub addr_b: Ipv4Addr,
    /// Prefix length of the link's subnet.
    pub prefix_len: u8,
    /// Raise `tcp_rmem`/`tcp_wmem` maxima inside both namespaces
    /// ([`Netns::set_big_tcp_buffers`]).
    pub big_tcp_buffers: bool,
    /// Disable IPv6 inside both namespaces (no router solicitations crossing the link).
    pub disable_ipv6: bool,
    /// `txqueuelen` of the link devices (5000 avoids drops before the forwarder, LAB-FACTS §2).
    pub txqueuelen: u32,
    /// Run the forwarder threads with `SCHED_FIFO` priority 10 (best effort), so that delay
    /// stays accurate while other processes load the CPUs (without it, three busy loops on two
    /// cores added ~10 ms to a 190 ms RTT).
    pub realtime: bool,
}

impl LabConfig {
    fn base(prefix: &str, link: LinkKind) -> LabConfig {
        LabConfig {
            prefix: prefix.into(),
            link,
            mtu: 1500,
            addr_a: Ipv4Addr::new(10, 77, 0, 1),
            addr_b: Ipv4Addr::new(10, 77, 0, 2),
            prefix_len: 24,
            big_tcp_buffers: true,
            disable_ipv6: true,
            txqueuelen: 5000,
            realtime: true,
        }
    }

    /// Two namespaces joined by a plain veth pair.
    pub fn veth(prefix: &str) -> LabConfig {
        LabConfig::base(prefix, LinkKind::Veth)
    }

    /// Two namespaces joined by an emulated link with the same parameters both ways. Use
    /// [`LinkParams::rtt_ms`] to set the round trip (each direction gets half).
    pub fn wan(prefix: &str, link: LinkParams) -> LabConfig {
        LabConfig::base(
            prefix,
            LinkKind::Wan {
                a_to_b: link.clone(),
                b_to_a: link,
            },
        )
    }

    /// Two namespaces joined by an emulated link with different parameters per direction.
    pub fn wan_asymmetric(prefix: &str, a_to_b: LinkParams, b_to_a: LinkParams) -> LabConfig {
        LabConfig::base(prefix, LinkKind::Wan { a_to_b, b_to_a })
    }

    /// Sets the MTU of the link devices.
    pub fn mtu(mut self, mtu: u32) -> LabConfig {
        self.mtu = mtu;
        self
    }
}

/// Two namespaces, `a` and `b`, joined by the configured link, with addresses, IPv6 off and
/// big TCP buffers (by default). Dropping it stops the forwarder, kills every process left in
/// the namespaces and deletes them (devices included).
#[derive(Debug)]
pub struct Lab {
    // Field order is drop order after `Drop::drop`: forwarder, veth, then namespaces.
    forwarder: Option<Forwarder>,
    veth: Option<VethPair>,
    a: Netns,
    b: Netns,
    dev_a: String,
    dev_b: String,
    config: LabConfig,
}

impl Lab {
    /// Builds the lab. Needs root and, for a WAN link, `/dev/net/tun`.
    pub fn new(config: LabConfig) -> Result<Lab, Error> {
        crate::require_root()?;
        if !(68..=65535).contains(&config.mtu) {
            return Err(Error::Config(format!(
                "MTU {} is not within 68..=65535",
                config.mtu
            )));
        }
        if config.prefix_len > 30 {
            return Err(Error::Config(
                "the link subnet needs a prefix length of at most /30".into(),
            ));
        }
        if let LinkKind::Wan { a_to_b, b_to_a } = &config.link {
            a_to_b.validate()?;
            b_to_a.validate()?;
            if !std::path::Path::new("/dev/net/tun").exists() {
                return Err(Error::NoTun);
            }
        }
        let id = unique_name(&config.prefix, "");
        let a = Netns::create(format!("{id}a"))?;
        let b = Netns::create(format!("{id}b"))?;
        for ns in [&a, &b] {
            if config.disable_ipv6 {
                ns.set_sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
                ns.set_sysctl("net.ipv6.conf.default.disable_ipv6", "1")?;
            }
            if config.big_tcp_buffers {
                ns.set_big_tcp_buffers()?;
            }
        }
        // Device names only need to be unique per namespace; reuse the namespace names so a
        // device is recognisable wherever it shows up.
        let (dev_a, dev_b) = (a.name().to_string(), b.name().to_string());
        let mut lab = Lab {
            forwarder: None,
            veth: None,
            a,
            b,
            dev_a,
            dev_b,
            config,
        };
        match lab.config.link.clone() {
            LinkKind::Veth => {
                lab.veth = Some(VethPair::create(&lab.a, &lab.dev_a, &lab.b, &lab.dev_b)?);
            }
            LinkKind::Wan { a_to_b, b_to_a } => {
                let tun_a = tun::open_tun_in(&lab.a, &lab.dev_a)?;
                let tun_b = tun::open_tun_in(&lab.b, &lab.dev_b)?;
                lab.forwarder = Some(Forwarder::start(
                    tun_a,
                    tun_b,
                    &a_to_b,
                    &b_to_a,
                    lab.config.mtu,
                    lab.config.realtime,
                )?);
            }
        }
        let mtu = lab.config.mtu.to_string();
        let qlen = lab.config.txqueuelen.to_string();
        for (ns, dev, addr) in [
            (&lab.a, &lab.dev_a, lab.config.addr_a),
            (&lab.b, &lab.dev_b, lab.config.addr_b),
        ] {
            ns.ip(["link", "set", "dev", dev, "mtu", &mtu, "txqueuelen", &qlen])?;
            ns.add_addr(dev, &format!("{addr}/{}", lab.config.prefix_len))?;
            ns.link_up(dev)?;
        }
        Ok(lab)
    }

    /// Namespace `a`.
    pub fn a(&self) -> &Netns {
        &self.a
    }

    /// Namespace `b`.
    pub fn b(&self) -> &Netns {
        &self.b
    }

    /// Address of `a` on the link.
    pub fn addr_a(&self) -> Ipv4Addr {
        self.config.addr_a
    }

    /// Address of `b` on the link.
    pub fn addr_b(&self) -> Ipv4Addr {
        self.config.addr_b
    }

    /// The link device inside `a`.
    pub fn dev_a(&self) -> &str {
        &self.dev_a
    }

    /// The link device inside `b`.
    pub fn dev_b(&self) -> &str {
        &self.dev_b
    }

    /// The configuration the lab was built with.
    pub fn config(&self) -> &LabConfig {
        &self.config
    }

    /// The forwarder's counters (`None` for a veth lab).
    pub fn stats(&self) -> Option<WanStats> {
        self.forwarder.as_ref().map(Forwarder::stats)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Stop the forwarder first: closing the TUN fds removes the devices before the
        // namespaces go.
        self.forwarder.take();
    }
}
