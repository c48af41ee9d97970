//! `bufscope run`: check, bind, load and attach, build the signal rooms, start the background
//! tasks, serve until SIGINT/SIGTERM, detach.

use std::os::fd::{AsFd as _, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::unix::AsyncFd;

use bufscope_common::maps;

use crate::attribution::{Attributor, OwnersMap, Procfs, UdpSocketsMap};
use crate::bpf::ring::{Ring, RingPositions};
use crate::bpf::{self, LoadPlan, Probes, Purpose, Stats};
use crate::cli::RunArgs;
use crate::collector::pinned::Pins;
use crate::collector::{self, Collector, Timing};
use crate::exposition::{Health, ProbeHealth};
use crate::http::{self, App, auth::Auth, tls::TlsListener, web_config::WebConfig};
use crate::kernel::{self, KernelInfo, caps};
use crate::signals::{self, BuildCx, Store};
use crate::totals::Totals;

/// How often the event task drains the ring buffer when the kernel has not woken it.
const EVENTS_DRAIN_EVERY: Duration = Duration::from_secs(1);

/// Fails early, with the fix, when privileges are missing.
pub fn preflight() -> anyhow::Result<()> {
    let missing = caps::missing_for_probes();
    if !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|c| c.name).collect();
        bail!(
            "missing capabilities {}: bufscope needs CAP_BPF (load programs, create maps) and \
             CAP_PERFMON (attach tracepoints); run as root or grant them, e.g. \
             `setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search+ep bufscope`",
            names.join(", ")
        );
    }
    for cap in [caps::CAP_SYS_PTRACE, caps::CAP_DAC_READ_SEARCH] {
        if !caps::has(cap) {
            tracing::warn!(
                capability = cap.name,
                "{} is missing: bufscope cannot {}; drops on such sockets are counted under comm=\"_unknown\"",
                cap.name,
                cap.why
            );
        }
    }
    if !caps::has(caps::CAP_NET_ADMIN) {
        tracing::warn!(
            capability = caps::CAP_NET_ADMIN.name,
            "CAP_NET_ADMIN is missing: bufscope cannot load cgroup socket programs, so setsockopt \
             and owners fall back to syscall tracepoints (every syscall on the node pays for \
             them) and the guard cannot run"
        );
    }
    Ok(())
}

/// Runs the exporter until SIGINT/SIGTERM; `addrs` are [`RunArgs::validate`]'s.
pub async fn run(args: RunArgs, addrs: Vec<std::net::SocketAddr>) -> anyhow::Result<()> {
    preflight()?;
    http::serve::raise_nofile_limit();
    let web = match args.web_config.as_deref() {
        Some(p) => WebConfig::load(p)?,
        None => WebConfig::default(),
    };
    let tls = web.rustls()?;
    let auth = Auth::new(&web);
    // One bufscope per pin directory: taken before anything else, held until the end.
    let pin_dir = match args.pins.pin_path.as_deref() {
        Some(dir) => Some(bpf::pins::dir::PinLock::acquire(dir)?),
        None => None,
    };
    // Bind before loading anything: a busy port is the most common operator error.
    let listener = bind(&addrs).await?;
    kernel::ensure_tracefs()?;

    let (collector, events, mut loaded) = load(&args, pin_dir)?;
    forward_bpf_log(&mut loaded)?;
    let any_attached = loaded.any_attached();
    let heartbeat = collector.heartbeat();
    let collector = Arc::new(Mutex::new(collector));
    let events_task = spawn_event_task(collector.clone(), events)?;
    let poll_task = spawn_poll_task(collector.clone(), args.poll_interval);

    let app = App {
        collector,
        any_attached,
        probes: Arc::new(loaded.status.clone()),
        heartbeat,
        stale_after: (args.poll_interval.max(EVENTS_DRAIN_EVERY) * http::STALE_INTERVALS)
            .max(http::STALE_AT_LEAST),
        slots: http::clients::Slots::new(),
    };
    let health_only = http::health_only_router(app.clone());
    let router = http::router(app, &args.telemetry_path, auth);
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| args.listen.clone());
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!(
        address = %local,
        path = %args.telemetry_path,
        tls = tls.is_some(),
        basic_auth = !web.basic_auth_users.is_empty(),
        "serving metrics on {scheme}://{local}{}",
        args.telemetry_path
    );
    let permits = http::serve::connection_permits();
    match tls {
        Some(cfg) => {
            let l = TlsListener::new(listener, cfg, permits.clone()).context("TLS listener")?;
            http::serve::serve(l, router, health_only, permits, shutdown_signal()).await;
        }
        None => {
            http::serve::serve(listener, router, health_only, permits, shutdown_signal()).await;
        }
    }
    events_task.abort();
    poll_task.abort();
    // Dropping the object detaches every link and unloads every program.
    drop(loaded);
    tracing::info!("probes detached; bye");
    Ok(())
}

/// Loads the object, attaches the probes and builds the collector over the attached rooms.
/// Returns the collector, the event ring buffer's fd (to wake the drain) and the loaded object
/// (its programs stay attached while it lives).
fn load(
    args: &RunArgs,
    pin_dir: Option<bpf::pins::dir::PinLock>,
) -> anyhow::Result<(Collector, OwnedFd, Probes)> {
    let kinfo = KernelInfo::load(&args.kernel.btf_path, &args.kernel.reasons)?;
    let mut plan = LoadPlan::new(Purpose::Run, &args.kernel.disable, args.kernel.log_level);
    plan.map_entries(maps::EVENTS.name, args.events_ring_bytes);
    let mut setups = signals::prepare(&args.signals, &mut plan)?;
    let mut loaded = bpf::load(
        &kinfo,
        &args.kernel.btf_path,
        signals::PROBES,
        &plan,
        &mut setups,
        pin_dir,
    )?;
    if !loaded.any_attached() {
        bail!("no probe could attach (see the warnings above; `bufscope check` explains each)");
    }
    let env = BuildCx {
        status: &loaded.status,
        reasons: &kinfo.reasons,
        pins: loaded.pins.as_ref().map(|p| p.outcome.clone()),
    };
    let built = setups.build(&mut loaded.ebpf, &env)?;
    let health = health(&kinfo, &loaded);
    // The parsed kernel BTF (tens of MiB) is only needed to load: give it back.
    drop(kinfo);
    bpf::trim_heap();
    let (events, events_fd) = Ring::take(&mut loaded.ebpf)?;
    let ring_positions = RingPositions::map(events_fd.as_fd());
    if ring_positions.is_none() {
        tracing::debug!("cannot map the event ring buffer's positions: no backlog metrics");
    }
    let collector = collector::Config {
        rooms: built.rooms,
        stats: Some(Stats::take(&mut loaded.ebpf)?),
        events: Some(Box::new(events)),
        ring_positions,
        health,
        timing: Timing {
            // Each GC reads /proc/<pid>/stat of every tracked process: a quarter of the
            // retention window is often enough for exited processes to leave on time.
            gc_every: (args.retention / 4).clamp(Duration::from_secs(2), Duration::from_secs(60)),
            idle: gc_idle().max(args.poll_interval * 3),
        },
        advice_window: args.advice_window,
        advice_retention: args.advice_resolved_retention,
        pins: pins(&mut loaded),
        pinned_since: loaded
            .pins
            .as_ref()
            .filter(|p| p.outcome.kept_maps())
            .map(|p| p.meta.created_unix as f64),
        created_samples: args.openmetrics_created,
        run_stats: match args.run_stats {
            true => Some(bpf::RunStats::start(&loaded)?),
            false => None,
        },
        ..collector::Config::new(
            Store::new(args.max_processes, args.retention).with_series_budget(args.max_series),
            attributor(args, built.services.owners, built.services.udp_sockets),
        )
    }
    .build();
    Ok((collector, events_fd, loaded))
}

/// The attribution service: `/proc` (`--path.procfs`), `OWNERS` when a program fills it,
/// `UDP_SOCKETS` when the owners probe runs, pod labels from `--kubernetes.log-dir` (default
/// /var/log; "" for none).
fn attributor(
    args: &RunArgs,
    owners: Option<OwnersMap>,
    udp_sockets: Option<UdpSocketsMap>,
) -> Attributor {
    let log_dir = args
        .kubernetes_log_dir
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("/var/log"));
    Attributor::new(Procfs::new(&args.procfs), owners)
        .with_udp_sockets(udp_sockets)
        .with_pods(Some(log_dir).filter(|d| !d.as_os_str().is_empty()))
}

/// The health facts known at start. A probe its room's settings leave off (the guard
/// without --guard.mode) is not listed: off is a choice, not a detached probe.
fn health(kinfo: &KernelInfo, loaded: &Probes) -> Health {
    Health {
        version: env!("CARGO_PKG_VERSION").to_string(),
        kernel: kinfo.release.clone(),
        probes: loaded
            .status
            .iter()
            .filter(|s| s.configured)
            .map(|s| ProbeHealth {
                probe: s.spec.name.to_string(),
                hooks: s.hooks(),
                attached: s.attached,
                pinned: s.pinned,
                late: false,
            })
            .collect(),
        pins: loaded.pins.as_ref().map(|p| p.report(signals::PROBES)),
        ..Health::default()
    }
}

/// With `--bpf.pin-path`: the pinned `TOTALS` and links for the collector.
fn pins(loaded: &mut Probes) -> Option<Pins> {
    let p = loaded.pins.as_ref()?;
    let (adopted, links) = (p.outcome.kept_maps(), p.watch(signals::PROBES));
    let totals = match Totals::take(&mut loaded.ebpf) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(
                "{e:#}: counters built from events (setsockopt, TCP) restart at 0 with the next bufscope"
            );
            None
        }
    };
    Some(Pins {
        totals,
        adopted,
        links,
    })
}

/// Forwards the BPF programs' aya-log records to `tracing`.
fn forward_bpf_log(loaded: &mut Probes) -> anyhow::Result<()> {
    let logger = match aya_log::EbpfLogger::init(&mut loaded.ebpf) {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!("no BPF log buffer: {e}");
            return Ok(());
        }
    };
    let mut logger = register(logger).context("polling the BPF log buffer")?;
    tokio::spawn(async move {
        loop {
            match logger.readable_mut().await {
                Ok(mut guard) => {
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
                Err(e) => {
                    tracing::warn!("BPF log forwarding stopped: {e}");
                    break;
                }
            }
        }
    });
    Ok(())
}

/// Ring buffer → store. The BPF side wakes the reader only once `RINGBUF_WAKEUP_BYTES` wait
/// (a wake-up per event costs each event ~1 µs of irq_work); so this task also drains on a
/// timer, and every poll (every scrape) drains first, so events are never stale.
fn spawn_event_task(
    collector: Arc<Mutex<Collector>>,
    events_fd: OwnedFd,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut fd = register(events_fd).context("polling the BPF ring buffer")?;
    Ok(tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVENTS_DRAIN_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                ready = fd.readable_mut() => match ready {
                    // Readiness is only a hint to drain now; the drain below reads
                    // whatever is there, and a record committed after clear_ready() is
                    // picked up by the next tick at the latest.
                    Ok(mut guard) => guard.clear_ready(),
                    Err(e) => {
                        tracing::error!("ring buffer polling failed: {e}");
                        break;
                    }
                },
                _ = tick.tick() => {}
            }
            let collector = collector.clone();
            let r = tokio::task::spawn_blocking(move || {
                collector::lock_as(&collector, collector::Holder::Drain).drain_events();
            })
            .await;
            if let Err(e) = r {
                tracing::error!("event handler failed: {e}");
            }
        }
    }))
}

/// Periodic poll (keeps deltas small), GC and owner look-ups, with `/proc` read outside the
/// lock ([`collector::background`]).
fn spawn_poll_task(
    collector: Arc<Mutex<Collector>>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let every = every.max(Duration::from_millis(50));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let collector = collector.clone();
            let _ = tokio::task::spawn_blocking(move || collector::background(&collector)).await;
        }
    })
}

/// Registers a BPF map fd (owned by `inner` for its whole life) with the tokio reactor.
fn register<T: std::os::fd::AsRawFd>(inner: T) -> anyhow::Result<AsyncFd<T>> {
    // SAFETY: the fd belongs to `inner`, which the AsyncFd owns; it stays open until the
    // AsyncFd (and with it `inner`) is dropped.
    unsafe { AsyncFd::register_with_interest(inner, tokio::io::Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("{e}"))
}

async fn bind(addrs: &[std::net::SocketAddr]) -> anyhow::Result<tokio::net::TcpListener> {
    let mut last = None;
    for a in addrs {
        match tokio::net::TcpListener::bind(a).await {
            Ok(l) => return Ok(l),
            Err(e) => last = Some((a, e)),
        }
    }
    match last {
        Some((a, e)) => bail!(
            "cannot listen on {a}: {e} (pick another --web.listen-address, or stop what uses it)"
        ),
        None => bail!("no address to listen on"),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    tracing::info!("shutting down");
}

/// How long a map entry must be idle before the GC may collect it: 30 s. Debug builds (the
/// tests' binary, never a release) take `BUFSCOPE_DEBUG_GC_IDLE` (e.g. `3s`) instead, so the
/// tests that wait for the GC by design wait seconds, not half a minute.
fn gc_idle() -> Duration {
    const IDLE: Duration = Duration::from_secs(30);
    #[cfg(debug_assertions)]
    if let Ok(v) = std::env::var("BUFSCOPE_DEBUG_GC_IDLE") {
        match bufscope_policy::units::parse_duration(&v) {
            Ok(d) => return d,
            Err(e) => tracing::warn!("BUFSCOPE_DEBUG_GC_IDLE={v:?} ignored: {e}"),
        }
    }
    IDLE
}
