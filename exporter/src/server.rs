//! `bufscope run`: load, attach, serve.

use std::collections::HashSet;
use std::os::fd::AsFd as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf};
use tokio::io::unix::AsyncFd;

use crate::attribution::{Attributor, Procfs};
use crate::cli::{RunArgs, listen_addrs};
use crate::collector::{Collector, Timing};
use crate::kernel::{self, KernelInfo, caps};
use crate::metrics::Health;
use crate::probes::{self, MapSizes};
use crate::signals::{autotune::Autotune, drops::Drops};
use crate::store::Store;

/// Shared between the HTTP handlers and the background tasks.
#[derive(Clone)]
struct App {
    collector: Arc<Mutex<Collector>>,
    map_sizes: MapSizes,
    any_attached: bool,
    probes: Arc<Vec<probes::ProbeStatus>>,
}

/// How often the event task drains the ring buffer when the kernel has not woken it.
const EVENTS_DRAIN_EVERY: Duration = Duration::from_secs(1);

/// The status page (self-contained: no external assets).
const STATUS_PAGE: &str = include_str!("status.html");

fn take<T>(ebpf: &mut aya::Ebpf, name: &str) -> anyhow::Result<T>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .take_map(name)
        .with_context(|| format!("map {name} missing from the BPF object"))?;
    T::try_from(map).with_context(|| format!("map {name} has an unexpected type"))
}

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
    Ok(())
}

/// Runs the exporter until SIGINT/SIGTERM.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let addrs = listen_addrs(&args.listen).map_err(anyhow::Error::msg)?;
    if !args.telemetry_path.starts_with('/') {
        bail!(
            "invalid --web.telemetry-path {:?}: it must start with '/'",
            args.telemetry_path
        );
    }
    preflight()?;
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
    crate::serve::raise_nofile_limit();
    if !args.kernel.btf_path.exists() {
        bail!(
            "kernel BTF not found at {}: bufscope needs a kernel built with CONFIG_DEBUG_INFO_BTF=y \
             (or a BTF file for this kernel passed with --kernel.btf-path)",
            args.kernel.btf_path.display()
        );
    }
    for p in &args.kernel.disable {
        if !probes::PROBES.iter().any(|s| s.name == p) {
            let names: Vec<&str> = probes::PROBES.iter().map(|s| s.name).collect();
            bail!(
                "unknown probe {p:?} in --probe.disable (probes: {})",
                names.join(", ")
            );
        }
    }
    let web = match args.web_config.as_deref() {
        Some(p) => crate::web::WebConfig::load(p)?,
        None => crate::web::WebConfig::default(),
    };
    let tls = web.rustls()?;
    let auth = crate::web::Auth::new(&web);
    // Bind before loading anything: a busy port is the most common operator error.
    let listener = bind(&addrs).await?;
    kernel::ensure_tracefs()?;
    let kinfo = KernelInfo::load(&args.kernel.btf_path, &args.kernel.reasons)?;
    let map_sizes = MapSizes {
        drops: args.drops_entries,
        owners: args.owners_entries,
        autotune: args.autotune_entries,
        events_bytes: args.events_ring_bytes,
    };
    let disabled: HashSet<String> = args.kernel.disable.iter().cloned().collect();
    let mut loaded = probes::load(
        &kinfo,
        &args.kernel.btf_path,
        &disabled,
        map_sizes,
        args.kernel.log_level,
    )?;
    let attached = |name: &str| {
        loaded
            .status
            .iter()
            .any(|s| s.spec.name == name && s.attached)
    };
    let any_attached = loaded.status.iter().any(|s| s.attached);
    if !any_attached {
        bail!("no probe could attach (see the warnings above; `bufscope check` explains each)");
    }

    match aya_log::EbpfLogger::init(&mut loaded.ebpf) {
        Ok(logger) => {
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
        }
        Err(e) => tracing::debug!("no BPF log buffer: {e}"),
    }

    let drops_on = attached("drops");
    let autotune_on = attached("autotune");
    let owners_on = attached("owners") || attached("setsockopt") || attached("tcp_state");
    let ebpf = &mut loaded.ebpf;
    let drops = if drops_on {
        let m: PerCpuHashMap<MapData, _, _> = take(ebpf, "DROPS")?;
        Some(Drops::new(m, kinfo.reasons.clone(), args.attribution_hold))
    } else {
        None
    };
    let autotune = if autotune_on {
        let m: PerCpuHashMap<MapData, _, _> = take(ebpf, "AUTOTUNE")?;
        Some(Autotune::new(m))
    } else {
        None
    };
    let owners: Option<BpfHashMap<MapData, _, _>> = if owners_on {
        Some(take(ebpf, "OWNERS")?)
    } else {
        None
    };
    let stats: PerCpuArray<MapData, u64> = take(ebpf, "STATS")?;
    let kernel_release = kinfo.release.clone();
    // The parsed kernel BTF (tens of MiB) is only needed to load: give it back.
    drop(kinfo);
    probes::trim_heap();
    let events: RingBuf<MapData> = take(ebpf, "EVENTS")?;

    let health = Health {
        version: env!("CARGO_PKG_VERSION").to_string(),
        kernel: kernel_release,
        probes: loaded
            .status
            .iter()
            .map(|s| (s.spec.name.to_string(), s.hooks(), s.attached))
            .collect(),
        ..Health::default()
    };
    let collector = Collector::new(
        Store::new(args.max_processes, args.retention),
        Attributor::new(Procfs::new(&args.procfs), owners),
        drops,
        autotune,
        Some(stats),
        health,
        Timing {
            // Each GC reads /proc/<pid>/stat of every tracked process: a quarter of the
            // retention window is often enough for exited processes to leave on time.
            gc_every: (args.retention / 4).clamp(Duration::from_secs(2), Duration::from_secs(60)),
            idle: Duration::from_secs(30).max(args.poll_interval * 3),
        },
    );
    let mut collector = collector;
    collector.advice_window = args.advice_window;

    // Ring buffer → store. The BPF side wakes the reader only once `RINGBUF_WAKEUP_BYTES` wait
    // (a wake-up per event costs each event ~1 µs of irq_work); so this task also drains on a
    // 1 s timer, and every poll (every scrape) drains first, so events are never stale.
    let events_fd = events
        .as_fd()
        .try_clone_to_owned()
        .context("duplicating the ring buffer fd")?;
    collector.set_events(events);
    let collector = Arc::new(Mutex::new(collector));
    let events_task = {
        let collector = collector.clone();
        let mut fd = register(events_fd).context("polling the BPF ring buffer")?;
        tokio::spawn(async move {
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
                    if let Ok(mut c) = collector.lock() {
                        c.drain_events();
                    }
                })
                .await;
                if let Err(e) = r {
                    tracing::error!("event handler failed: {e}");
                }
            }
        })
    };

    // Periodic poll (keeps deltas small) and GC.
    let poll_task = {
        let collector = collector.clone();
        let every = args.poll_interval.max(Duration::from_millis(50));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let collector = collector.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    let plan = {
                        let Ok(mut c) = collector.lock() else {
                            return;
                        };
                        c.poll();
                        if !c.gc_due() {
                            return;
                        }
                        c.gc_plan()
                    };
                    // `/proc` is read without the lock: scrapes go on meanwhile.
                    let scan = plan.scan();
                    if let Ok(mut c) = collector.lock() {
                        c.gc_apply(scan);
                    }
                })
                .await;
            }
        })
    };

    let app = App {
        collector,
        map_sizes,
        any_attached,
        probes: Arc::new(loaded.status.clone()),
    };
    let router = Router::new()
        .route(&args.telemetry_path, get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/api/v1/findings", get(findings_handler))
        .route("/api/v1/status", get(status_handler))
        .route("/", get(index))
        .with_state(app)
        .layer(axum::middleware::from_fn_with_state(
            auth,
            crate::web::middleware,
        ));
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
    match tls {
        Some(cfg) => {
            let l = crate::web::TlsListener::new(listener, cfg).context("TLS listener")?;
            crate::serve::serve(l, router, shutdown_signal()).await;
        }
        None => crate::serve::serve(listener, router, shutdown_signal()).await,
    }
    events_task.abort();
    poll_task.abort();
    // Dropping the object detaches every link and unloads every program.
    drop(loaded);
    tracing::info!("probes detached; bye");
    Ok(())
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

async fn metrics_handler(State(app): State<App>) -> Response {
    let sizes = app.map_sizes;
    match with_fresh(&app, move |c| c.render(&sizes)).await {
        Some(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "collector unavailable\n").into_response(),
    }
}

async fn healthz(State(app): State<App>) -> Response {
    if app.any_attached {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no probe attached\n").into_response()
    }
}

async fn index() -> Html<&'static str> {
    Html(STATUS_PAGE)
}

/// Runs `f` on the collector in a blocking thread after a poll that started after this request
/// arrived: a scrape always reflects everything that happened before it. Concurrent requests
/// share one poll (they queue on the lock and find it already done).
async fn with_fresh<T: Send + 'static>(
    app: &App,
    f: impl FnOnce(&mut Collector) -> T + Send + 'static,
) -> Option<T> {
    let collector = app.collector.clone();
    let arrived = Instant::now();
    tokio::task::spawn_blocking(move || {
        let mut c = collector.lock().ok()?;
        if c.last_poll_started().is_none_or(|t| t < arrived) {
            c.poll();
        }
        Some(f(&mut c))
    })
    .await
    .ok()
    .flatten()
}

async fn findings_handler(State(app): State<App>) -> Response {
    match with_fresh(&app, |c| c.report()).await {
        Some(r) => axum::Json(r).into_response(),
        None => (StatusCode::INTERNAL_SERVER_ERROR, "collector unavailable\n").into_response(),
    }
}

async fn status_handler(State(app): State<App>) -> Response {
    let probes = app.probes.clone();
    match with_fresh(&app, move |c| c.status(&probes)).await {
        Some(v) => axum::Json(v).into_response(),
        None => (StatusCode::INTERNAL_SERVER_ERROR, "collector unavailable\n").into_response(),
    }
}
