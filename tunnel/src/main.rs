//! `bufscope-tunnel`: a point-to-point WireGuard L3 tunnel (boringtun's noise protocol over a
//! Linux TUN device) whose outer transport is UDP, TCP or QUIC and whose outer socket buffers follow
//! `--buffer-policy` (bufscope's recommended policy by default). See `docs/tunnel.md`.

mod buffers;
mod config;
mod framing;
mod net;
mod offload;
mod quic;
mod sys;
mod tcp;
mod tun;
mod udp;
mod wg;

use std::io::IsTerminal as _;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Parser;

use crate::config::{Cli, TransportKind};
use crate::sys::Shutdown;

fn main() {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match run(&cli) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("bufscope-tunnel: error: {e:#}");
            std::process::exit(1);
        }
    }
}

fn run(cli: &Cli) -> Result<()> {
    let settings = cli.settings()?;
    if !bufscope_policy::has_cap_net_admin() {
        bail!(
            "missing CAP_NET_ADMIN: creating and configuring the TUN device needs it (run as root or `setcap cap_net_admin+ep bufscope-tunnel`)"
        );
    }
    // Signals are collected synchronously by this thread; block them before spawning others.
    sys::block_termination_signals()?;
    let shutdown = Shutdown::new()?;

    if let (TransportKind::Udp | TransportKind::Quic, Some(ep)) =
        (settings.transport, settings.endpoint)
    {
        // Fail before creating anything when there is no route to the peer.
        udp::check_reachable(ep)?;
    }
    let tun = Arc::new(tun::Tun::create(&settings.interface, settings.offload)?);
    tun.configure(
        settings.mtu,
        &settings.addresses,
        settings.allowed_ips.prefixes(),
    )?;
    let peer = Arc::new(wg::Peer::new(&settings));
    tracing::info!(
        interface = tun.name(),
        transport = %settings.transport,
        buffer_policy = %settings.buffer_policy,
        mtu = settings.mtu,
        offload = tun.vnet(),
        endpoint = ?settings.endpoint,
        "bufscope-tunnel up"
    );

    let threads = match settings.transport {
        TransportKind::Udp => udp::start(&settings, tun.clone(), peer.clone(), &shutdown)?,
        TransportKind::Tcp => tcp::start(&settings, tun.clone(), peer.clone(), &shutdown)?,
        TransportKind::Quic => quic::start(&settings, tun.clone(), peer.clone(), &shutdown)?,
    };
    let result = supervise(threads, &shutdown);
    tracing::info!("{}", peer.stats.summary());
    result
}

/// A data-path thread of either transport; it returns an error when it fails.
type Worker = JoinHandle<Result<()>>;
/// The data-path threads a transport starts, for [`supervise`].
type Workers = Vec<Worker>;

/// Starts a named data-path thread; [`supervise`] joins it and names it if it stops.
fn spawn(name: &str, f: impl FnOnce() -> Result<()> + Send + 'static) -> Result<Worker> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .with_context(|| format!("cannot start thread {name}"))
}

/// Waits for SIGINT/SIGTERM or for a data-path thread to fail, then stops everything.
fn supervise(mut threads: Workers, shutdown: &Shutdown) -> Result<()> {
    let mut failure = None;
    loop {
        if let Some(sig) = sys::wait_signal(Duration::from_millis(200)) {
            let name = if sig == libc::SIGINT {
                "SIGINT"
            } else {
                "SIGTERM"
            };
            tracing::info!("{name} received, shutting down");
            break;
        }
        if let Some(i) = threads.iter().position(JoinHandle::is_finished) {
            let t = threads.swap_remove(i);
            let name = t.thread().name().unwrap_or("worker").to_string();
            failure = Some(match t.join() {
                Ok(Ok(())) => anyhow::anyhow!("thread {name} stopped unexpectedly"),
                Ok(Err(e)) => e,
                Err(_) => anyhow::anyhow!("thread {name} panicked"),
            });
            break;
        }
    }
    shutdown.trigger();
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && !threads.iter().all(JoinHandle::is_finished) {
        std::thread::sleep(Duration::from_millis(10));
    }
    for t in threads {
        if t.is_finished()
            && let Ok(Err(e)) = t.join()
        {
            tracing::debug!("during shutdown: {e:#}");
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
