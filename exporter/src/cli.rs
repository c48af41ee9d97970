//! Command-line interface (flags follow Prometheus exporter conventions: `--web.*`, `--log.*`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

pub use crate::values::{
    Invalid, MAX_DURATION, MIN_POLL_INTERVAL, at_least_one, duration_within, parse_duration,
};

/// bufscope: per-process socket-buffer telemetry for tunnels and VPN gateways.
#[derive(Parser, Debug)]
#[command(name = "bufscope", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub cmd: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Load the probes and serve Prometheus metrics.
    Run(Box<RunArgs>),
    /// Preflight: print, probe by probe, what this kernel supports and what is missing.
    Check(CheckArgs),
    /// Print the findings of a running bufscope (what to change, per process).
    Explain(ExplainArgs),
    /// Detach and remove everything `bufscope run --bpf.pin-path` pinned.
    Cleanup(CleanupArgs),
    /// Live terminal view of a running bufscope: processes by drop rate, findings and fixes.
    Top(TopArgs),
}

/// Flags of `bufscope explain`.
#[derive(clap::Args, Debug, Clone)]
pub struct ExplainArgs {
    /// The exporter to ask.
    #[command(flatten)]
    pub connect: bufscope_client::ConnectArgs,
    /// Only findings about this process id.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Only findings about processes with this name.
    #[arg(long)]
    pub comm: Option<String>,
    /// Only what changed in this time (new findings, verdicts that moved, resolved ones), e.g.
    /// `--since 10m` after applying a fix.
    #[arg(long, value_parser = duration_within(Duration::from_secs(1), Duration::from_secs(7 * 24 * 3600)), value_name = "DURATION")]
    pub since: Option<Duration>,
    /// Print the raw JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `--bpf.pin-path`, shared by `run`, `check` and `cleanup`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PinArgs {
    /// Pin the BPF maps and links in this bpffs directory (e.g. /sys/fs/bpf/bufscope) so that
    /// counting goes on while bufscope is not running (restarts, upgrades, crashes) and the
    /// next bufscope continues from the kernel's totals. bpffs is mounted at /sys/fs/bpf when
    /// absent. Without it, nothing outlives bufscope.
    #[arg(long = "bpf.pin-path", value_name = "DIR", value_parser = absolute_path())]
    pub pin_path: Option<PathBuf>,
}

/// Flags of `bufscope cleanup`.
#[derive(clap::Args, Debug, Clone)]
pub struct CleanupArgs {
    /// The directory `bufscope run --bpf.pin-path` pinned in.
    #[arg(
        long = "bpf.pin-path",
        value_name = "DIR",
        required = true,
        value_parser = absolute_path()
    )]
    pub pin_path: PathBuf,
    /// Remove the pins even while a running bufscope holds the directory (refused otherwise,
    /// naming its pid): that bufscope's pinned probes stop counting and it reports them
    /// detached. For a holder that cannot be stopped; one that died holds nothing.
    #[arg(long)]
    pub force: bool,
}

/// Flags of `bufscope top`.
#[derive(clap::Args, Debug, Clone)]
pub struct TopArgs {
    /// The exporter to read.
    #[command(flatten)]
    pub connect: bufscope_client::ConnectArgs,
    /// Time between two reads of the exporter.
    #[arg(long = "interval", default_value = "1s", value_name = "DURATION", value_parser = parse_duration)]
    pub interval: Duration,
}

/// Log output format.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    /// `key=value` pairs (human-friendly, the default).
    Logfmt,
    /// One JSON object per line.
    Json,
}

/// Flags shared by `run` and `check`.
#[derive(clap::Args, Debug, Clone)]
pub struct KernelArgs {
    /// Kernel BTF to resolve struct offsets and drop reasons from.
    #[arg(
        long = "kernel.btf-path",
        default_value = "/sys/kernel/btf/vmlinux",
        value_name = "FILE"
    )]
    pub btf_path: PathBuf,
    /// Probes to leave off (repeatable or comma-separated).
    #[arg(
        long = "probe.disable",
        value_delimiter = ',',
        value_name = "PROBE",
        value_parser = probe_names()
    )]
    pub disable: Vec<String>,
    /// Kernel drop reasons to count (names as in `enum skb_drop_reason`, without the
    /// `SKB_DROP_REASON_` prefix).
    #[arg(
        long = "drops.reasons",
        value_delimiter = ',',
        value_name = "REASON",
        value_parser = parse_reason,
        default_values_t = crate::kernel::reasons::DEFAULT_TRACKED.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    )]
    pub reasons: Vec<String>,
    /// Log level (error, warn, info, debug, trace).
    #[arg(long = "log.level", default_value = "info", value_name = "LEVEL")]
    pub log_level: tracing::Level,
    /// Log format.
    #[arg(long = "log.format", value_enum, default_value_t = LogFormat::Logfmt)]
    pub log_format: LogFormat,
    /// The host's cgroup2 mount (default: found in /proc/self/mountinfo). In a container with
    /// its own cgroup namespace, mount the host's /sys/fs/cgroup and name it here, or the
    /// cgroup hooks only see the container itself.
    #[arg(long = "path.cgroup2", value_name = "DIR")]
    pub cgroup2: Option<PathBuf>,
}

/// Flags of `bufscope run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Address to serve on (`:9477` = all interfaces).
    #[arg(
        long = "web.listen-address",
        default_value = ":9477",
        value_name = "ADDR"
    )]
    pub listen: String,
    /// Path under which metrics are served.
    #[arg(
        long = "web.telemetry-path",
        default_value = "/metrics",
        value_name = "PATH"
    )]
    pub telemetry_path: String,
    /// TLS and basic-auth configuration (Prometheus exporter-toolkit format).
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub web_config: Option<PathBuf>,
    /// Follow each OpenMetrics counter sample with its `_created` sample (when the series was
    /// last 0). For Prometheus 3.x with `--enable-feature=created-timestamp-zero-ingestion`,
    /// which then counts a series' first samples as an increase; Prometheus 2.x stores each
    /// as a series of its own (twice the counter series), hence off by default.
    #[arg(long = "web.openmetrics-created")]
    pub openmetrics_created: bool,
    /// Settings file (YAML); flags override it.
    #[arg(long = "config.file", value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// Window over which advice measures drop rates (1s to 5m, the drop history kept per
    /// socket).
    #[arg(long = "advice.window", default_value = "60s", value_parser = duration_within(Duration::from_secs(1), crate::advice::MAX_WINDOW), value_name = "DURATION")]
    pub advice_window: Duration,
    /// How long a finding that stopped costing after a fix (a larger buffer, the program
    /// restarted with one) is kept as `resolved` with its numbers before and after.
    #[arg(long = "advice.resolved-retention", default_value = "30m", value_parser = duration_within(Duration::from_secs(1), Duration::from_secs(7 * 24 * 3600)), value_name = "DURATION")]
    pub advice_resolved_retention: Duration,
    /// Most processes tracked one by one (status page, API, advice) and most identities;
    /// the least active beyond this leave the detail (their counts stay on their identity's
    /// series).
    #[arg(long = "max-processes", default_value_t = 1000, value_name = "N", value_parser = at_least_one::<usize>)]
    pub max_processes: usize,
    /// The node's budget of per-process series: identities (program and place) get series of
    /// their own while theirs fit (a fifth of it is for `bufscope_process_info`); the others
    /// count on each family's overflow series (`otel_metric_overflow="true"`).
    #[arg(long = "max-series", default_value_t = crate::store::DEFAULT_MAX_SERIES, value_name = "N", value_parser = at_least_one::<usize>)]
    pub max_series: usize,
    /// How long series of an exited process stay (e.g. `5m`, `30s`).
    #[arg(long = "retention", default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub retention: Duration,
    /// How often the probes' maps are read (scrapes also read them); at least 50ms.
    #[arg(long = "poll-interval", default_value = "1s", value_parser = duration_within(MIN_POLL_INTERVAL, MAX_DURATION), value_name = "DURATION")]
    pub poll_interval: Duration,
    /// `/proc` mount to read (set to the host's `/proc` when running in a container).
    #[arg(long = "path.procfs", default_value = "/proc", value_name = "DIR")]
    pub procfs: PathBuf,
    /// The kubelet's log directory, mounted read-only (its `containers/<pod>_<namespace>_<container>-<id>.log`
    /// links and `pods/<namespace>_<pod>_<uid>/` directories): processes in Kubernetes pods
    /// get `pod`, `namespace` and `container_name` labels from it, without API-server
    /// access. Default: /var/log (outside Kubernetes it has no such directories: no such
    /// labels); "": none.
    #[arg(long = "kubernetes.log-dir", value_name = "DIR")]
    pub kubernetes_log_dir: Option<PathBuf>,
    /// Size of the event ring buffer in bytes (a power of two, at least 4096): bursts of
    /// setsockopt calls or connections beyond what it holds between drains are counted in
    /// `bufscope_bpf_events_lost_total{cause="ringbuf_full"}`.
    #[arg(long = "bpf.events-ring-bytes", default_value_t = 1 << 20, value_parser = parse_ring_bytes, value_name = "BYTES")]
    pub events_ring_bytes: u32,
    /// Export each probe's BPF run time and run count (`bufscope_probe_run_seconds_total`,
    /// `bufscope_probe_runs_total`) from the kernel's run-time stats, which this turns on
    /// (BPF_ENABLE_STATS, needs CAP_SYS_ADMIN; or set kernel.bpf_stats_enabled=1 on the node).
    /// While on, every BPF program on the machine pays two clock reads per run (measured here:
    /// a setsockopt that runs one bufscope program 100.3% of the calls/s without it, a UDP
    /// socket+bind+close cycle 96.2%; README "What bufscope costs").
    #[arg(long = "bpf.run-stats")]
    pub run_stats: bool,
    /// Every signal's own flags (`--guard.*`, map sizes, attribution).
    #[command(flatten)]
    pub signals: crate::signals::Flags,
    /// `--bpf.pin-path`.
    #[command(flatten)]
    pub pins: PinArgs,
    /// Kernel, probe and log flags.
    #[command(flatten)]
    pub kernel: KernelArgs,
}

/// Flags of `bufscope check`.
#[derive(clap::Args, Debug, Clone)]
pub struct CheckArgs {
    /// Only inspect; do not try to load and attach the probes.
    #[arg(long)]
    pub no_attach: bool,
    /// Print what this build has instead of checking anything: every probe (its variants'
    /// hooks, whether `bufscope run` attaches it by default) and the status page's columns.
    #[arg(long)]
    pub list: bool,
    /// With `--list`: one JSON document (for tests and tools).
    #[arg(long, requires = "list")]
    pub json: bool,
    /// Evaluate another kernel offline from its BTF (raw BTF, e.g. its
    /// `/sys/kernel/btf/vmlinux`, or the `.BTF` section of its vmlinux): which hook each probe
    /// would use there and why. Loads nothing.
    #[arg(long = "btf", value_name = "FILE")]
    pub btf: Option<PathBuf>,
    /// `--bpf.pin-path`: also list what is pinned there.
    #[command(flatten)]
    pub pins: PinArgs,
    /// Kernel, probe and log flags.
    #[command(flatten)]
    pub kernel: KernelArgs,
}

/// An absolute path (`--bpf.pin-path`: a relative one would depend on the directory bufscope
/// was started in); not necessarily UTF-8.
fn absolute_path() -> impl clap::builder::TypedValueParser<Value = PathBuf> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PathBufValueParser::new().try_map(|p| {
        if p.is_absolute() {
            Ok(p)
        } else {
            Err("not an absolute path: name a directory on a bpffs, e.g. /sys/fs/bpf/bufscope")
        }
    })
}

/// A drop reason's name: what follows `SKB_DROP_REASON_` in the kernel's enum (whether this
/// kernel has it is checked against its BTF when loading).
fn parse_reason(s: &str) -> Result<String, String> {
    if let Some(rest) = s.strip_prefix("SKB_DROP_REASON_") {
        return Err(format!(
            "{s:?}: leave out the SKB_DROP_REASON_ prefix ({rest})"
        ));
    }
    if s.is_empty()
        || !s
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(format!(
            "invalid drop reason {s:?}: a name of the kernel's enum skb_drop_reason without \
             its SKB_DROP_REASON_ prefix, in capitals (e.g. SOCKET_RCVBUFF)"
        ));
    }
    Ok(s.to_string())
}

/// A ring-buffer size: a power of two of at least one page.
fn parse_ring_bytes(s: &str) -> Result<u32, String> {
    let v: u32 = s
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected a number of bytes"))?;
    if v < 4096 || !v.is_power_of_two() {
        return Err(format!("{v} is not a power of two of at least 4096"));
    }
    Ok(v)
}

/// `--probe.disable`'s values: the names in [`crate::signals::PROBES`].
fn probe_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(crate::signals::PROBES.iter().map(|p| p.name))
}

mod validate;
pub use validate::{check_telemetry_path, listen_addrs};

#[cfg(test)]
mod tests;
