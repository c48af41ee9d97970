//! The workloads the per-probe section runs: each fires some of the hooks it measures.

use std::time::Duration;

use anyhow::Context as _;

use super::harness::Bins;

/// A workload that fires some hooks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Load {
    UdpDrops,
    Setsockopt,
    TcpConnect,
    TcpBulk,
}

impl Load {
    pub(super) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "udp-drops" => Self::UdpDrops,
            "setsockopt" => Self::Setsockopt,
            "tcp-connect" => Self::TcpConnect,
            "tcp-bulk" => Self::TcpBulk,
            _ => return None,
        })
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Load::UdpDrops => "UDP flood, all dropped (200k datagrams)",
            Load::Setsockopt => "setsockopt loop (50k SO_RCVBUF/SO_SNDBUF)",
            Load::TcpConnect => "TCP connect loop (2k connections)",
            Load::TcpBulk => "TCP bulk (40 × 8 MiB, half locked)",
        }
    }

    /// Runs the workload once (it fires the hooks while running).
    pub(super) fn run(self, bins: &Bins) -> anyhow::Result<()> {
        match self {
            Load::UdpDrops => {
                let (recv, f) = bins.workload(None, &["udp-recv", "--rcvbuf", "4096"])?;
                let port = f.get("ports").context("udp-recv ports")?.clone();
                let (flood, _) = bins.workload(
                    None,
                    &[
                        "udp-flood",
                        "--port",
                        &port,
                        "--count",
                        "200000",
                        "--size",
                        "64",
                    ],
                )?;
                flood.finish(Duration::from_secs(120))?;
                drop(recv);
            }
            Load::Setsockopt => {
                let (p, _) = bins.workload(None, &["setsockopt-loop", "--count", "50000"])?;
                p.finish(Duration::from_secs(120))?;
            }
            Load::TcpConnect => {
                let (p, _) = bins.workload(None, &["tcp-connect-loop", "--count", "2000"])?;
                p.finish(Duration::from_secs(120))?;
            }
            Load::TcpBulk => {
                let (p, _) = bins.workload(
                    None,
                    &[
                        "tcp-bulk-loop",
                        "--conns",
                        "40",
                        "--bytes",
                        "8388608",
                        "--lock-every",
                        "2",
                    ],
                )?;
                p.finish(Duration::from_secs(300))?;
            }
        }
        Ok(())
    }
}
