//! The `netlab up` command line, shared by the `netlab` binary and `cargo xtask lab`.

use std::io::Write as _;
use std::time::Duration;

use crate::{Error, Lab, LabConfig, LinkParams, TerminationSignals};

/// Flags of `netlab up` / `cargo xtask lab`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Round-trip time in ms added by the link (each direction gets half).
    #[arg(long, default_value_t = 50.0)]
    pub rtt_ms: f64,
    /// Rate limit in Mbit/s, both directions (0: unlimited).
    #[arg(long, default_value_t = 200.0)]
    pub rate_mbit: f64,
    /// Jitter in ms: each packet's one-way delay varies within ± this (no reordering).
    #[arg(long, default_value_t = 0.0)]
    pub jitter_ms: f64,
    /// Random loss in percent, per direction.
    #[arg(long, default_value_t = 0.0)]
    pub loss_pct: f64,
    /// Mean length of a loss burst in packets (1: independent losses; e.g. 8: the same loss
    /// rate in bursts of 8 packets on average).
    #[arg(long, default_value_t = 1.0)]
    pub loss_burst: f64,
    /// Bottleneck buffer in KiB (default: one bandwidth-delay product, at least 128 KiB).
    #[arg(long)]
    pub queue_kib: Option<u64>,
    /// MTU of the link devices.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
    /// Join the namespaces by a plain veth pair instead of the emulated link.
    #[arg(long)]
    pub veth: bool,
    /// Name prefix of the namespaces and devices.
    #[arg(long, default_value = crate::PREFIX)]
    pub prefix: String,
}

impl UpArgs {
    /// The lab these flags describe.
    pub fn to_config(&self) -> Result<LabConfig, Error> {
        for (name, v) in [
            ("rtt-ms", self.rtt_ms),
            ("rate-mbit", self.rate_mbit),
            ("jitter-ms", self.jitter_ms),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(Error::Config(format!(
                    "--{name} must be a non-negative number"
                )));
            }
        }
        if self.veth {
            return Ok(LabConfig::veth(&self.prefix).mtu(self.mtu));
        }
        let mut link = LinkParams::unlimited()
            .delay(Duration::from_secs_f64(self.rtt_ms / 2000.0))
            .jitter(Duration::from_secs_f64(self.jitter_ms / 1000.0))
            .loss(self.loss_pct / 100.0)
            .loss_burst(self.loss_burst);
        if self.rate_mbit > 0.0 {
            link = link.rate_bps(Some((self.rate_mbit * 1e6) as u64));
        }
        if let Some(q) = self.queue_kib {
            link = link.queue_bytes(q.saturating_mul(1024));
        }
        Ok(LabConfig::wan(&self.prefix, link).mtu(self.mtu))
    }
}

/// How to use a lab, for people: one line per side plus examples.
pub fn describe(lab: &Lab) -> String {
    let (a, b) = (lab.a().name(), lab.b().name());
    let link = match &lab.config().link {
        crate::LinkKind::Veth => "plain veth pair".to_string(),
        crate::LinkKind::Wan { a_to_b, .. } => format!("{a_to_b} (RTT {:?})", a_to_b.delay * 2),
    };
    format!(
        "netlab: lab up: {link}, MTU {mtu}\n\
         \x20 side a: ip netns exec {a} bash    # {addr_a} on {dev_a}\n\
         \x20 side b: ip netns exec {b} bash    # {addr_b} on {dev_b}\n\
         \x20 e.g.    ip netns exec {b} iperf3 -s   and   ip netns exec {a} iperf3 -c {addr_b} -t 10\n\
         \x20         ip netns exec {a} ping {addr_b}\n\
         Ctrl-C tears the lab down (processes left inside are killed).",
        mtu = lab.config().mtu,
        addr_a = lab.addr_a(),
        addr_b = lab.addr_b(),
        dev_a = lab.dev_a(),
        dev_b = lab.dev_b(),
    )
}

/// `netlab up`: builds the lab, prints how to enter it, waits for Ctrl-C/SIGTERM/SIGHUP,
/// tears it down and prints the forwarder's counters. Call it before the process starts any
/// thread (signals are blocked and collected synchronously).
pub fn up(args: &UpArgs) -> Result<(), Error> {
    let signals = TerminationSignals::block()?;
    let config = args.to_config()?;
    let lab = Lab::new(config)?;
    println!("{}", describe(&lab));
    let _ = std::io::stdout().flush();
    let sig = signals.wait()?;
    eprintln!("netlab: signal {sig}, tearing down");
    if let Some(s) = lab.stats() {
        eprintln!("netlab: a->b {:?}", s.a_to_b);
        eprintln!("netlab: b->a {:?}", s.b_to_a);
    }
    drop(lab);
    Ok(())
}
