//! Command-line interface (flags follow Prometheus exporter conventions: `--web.*`, `--log.*`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

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
    /// Base URL of the running exporter (`https://…` with --tls.ca-file for TLS).
    #[arg(
        long = "url",
        default_value = "http://127.0.0.1:9477",
        value_name = "URL"
    )]
    pub url: String,
    /// Only findings about this process id.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Only findings about processes with this name.
    #[arg(long)]
    pub comm: Option<String>,
    /// Print the raw JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// CA certificate (PEM) to verify an https exporter with.
    #[arg(long = "tls.ca-file", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Basic-auth user (the password is read from $BUFSCOPE_PASSWORD).
    #[arg(long = "web.user", value_name = "USER")]
    pub user: Option<String>,
}

/// `--bpf.pin-path`, shared by `run`, `check` and `cleanup`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PinArgs {
    /// Pin the BPF maps and links in this bpffs directory (e.g. /sys/fs/bpf/bufscope) so that
    /// counting goes on while bufscope is not running (restarts, upgrades, crashes) and the
    /// next bufscope continues from the kernel's totals. bpffs is mounted at /sys/fs/bpf when
    /// absent. Without it, nothing outlives bufscope.
    #[arg(long = "bpf.pin-path", value_name = "DIR")]
    pub pin_path: Option<PathBuf>,
}

/// Flags of `bufscope cleanup`.
#[derive(clap::Args, Debug, Clone)]
pub struct CleanupArgs {
    /// The directory `bufscope run --bpf.pin-path` pinned in.
    #[arg(long = "bpf.pin-path", value_name = "DIR", required = true)]
    pub pin_path: PathBuf,
}

/// Flags of `bufscope top`.
#[derive(clap::Args, Debug, Clone)]
pub struct TopArgs {
    /// Base URL of the running exporter (`https://…` with --tls.ca-file for TLS).
    #[arg(
        long = "url",
        default_value = "http://127.0.0.1:9477",
        value_name = "URL"
    )]
    pub url: String,
    /// CA certificate (PEM) to verify an https exporter with.
    #[arg(long = "tls.ca-file", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Basic-auth user (the password is read from $BUFSCOPE_PASSWORD).
    #[arg(long = "web.user", value_name = "USER")]
    pub user: Option<String>,
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
    /// Probes to leave off (repeatable or comma-separated): drops, setsockopt, tcp_state,
    /// autotune, owners.
    #[arg(long = "probe.disable", value_delimiter = ',', value_name = "PROBE")]
    pub disable: Vec<String>,
    /// Kernel drop reasons to count (names as in `enum skb_drop_reason`, without the
    /// `SKB_DROP_REASON_` prefix).
    #[arg(
        long = "drops.reasons",
        value_delimiter = ',',
        value_name = "REASON",
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
    /// Settings file (YAML); flags override it.
    #[arg(long = "config.file", value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// Window over which advice measures drop rates.
    #[arg(long = "advice.window", default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub advice_window: Duration,
    /// Most processes with their own series; the least active beyond this are folded into
    /// `comm="_other"`.
    #[arg(long = "max-processes", default_value_t = 1000, value_name = "N", value_parser = at_least_one::<usize>)]
    pub max_processes: usize,
    /// How long series of an exited process stay (e.g. `5m`, `30s`).
    #[arg(long = "retention", default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub retention: Duration,
    /// How often the probes' maps are read (scrapes also read them).
    #[arg(long = "poll-interval", default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub poll_interval: Duration,
    /// `/proc` mount to read (set to the host's `/proc` when running in a container).
    #[arg(long = "path.procfs", default_value = "/proc", value_name = "DIR")]
    pub procfs: PathBuf,
    /// Size of the event ring buffer in bytes (a power of two, at least 4096): bursts of
    /// setsockopt calls or connections beyond what it holds between drains are counted in
    /// `bufscope_bpf_events_lost_total{cause="ringbuf_full"}`.
    #[arg(long = "bpf.events-ring-bytes", default_value_t = 1 << 20, value_parser = parse_ring_bytes, value_name = "BYTES")]
    pub events_ring_bytes: u32,
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

/// A count that must be at least 1 (a clap value parser).
pub fn at_least_one<T: std::str::FromStr + PartialEq + From<u8>>(s: &str) -> Result<T, String> {
    let v: T = s.parse().map_err(|_| format!("invalid number {s:?}"))?;
    if v == T::from(0u8) {
        return Err("must be at least 1".into());
    }
    Ok(v)
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

impl KernelArgs {
    /// Checks what clap cannot (values that name probes, the cgroup2 path), for every
    /// subcommand.
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(p) = &self.cgroup2 {
            crate::kernel::set_cgroup2_root(p)?;
        }
        let names: Vec<&str> = crate::signals::PROBES.iter().map(|s| s.name).collect();
        for p in &self.disable {
            if !names.contains(&p.as_str()) {
                anyhow::bail!(
                    "unknown probe {p:?} in --probe.disable (probes: {})",
                    names.join(", ")
                );
            }
        }
        Ok(())
    }
}

impl RunArgs {
    /// Checks the flags of `bufscope run` that clap cannot, once the config file is applied;
    /// returns the addresses to listen on.
    pub fn validate(&self) -> anyhow::Result<Vec<std::net::SocketAddr>> {
        let addrs = listen_addrs(&self.listen).map_err(anyhow::Error::msg)?;
        if !self.telemetry_path.starts_with('/') {
            anyhow::bail!(
                "invalid --web.telemetry-path {:?}: it must start with '/'",
                self.telemetry_path
            );
        }
        self.kernel.validate()?;
        self.signals.validate()?;
        if self.signals.guard.persist && self.pins.pin_path.is_none() {
            anyhow::bail!(
                "--guard.persist keeps the guard attached through pins: add --bpf.pin-path DIR \
                 (e.g. /sys/fs/bpf/bufscope)"
            );
        }
        if let Some(p) = &self.pins.pin_path
            && !p.is_absolute()
        {
            anyhow::bail!(
                "--bpf.pin-path {}: not an absolute path (name a directory on a bpffs, e.g. \
                 /sys/fs/bpf/bufscope)",
                p.display()
            );
        }
        if !self.kernel.btf_path.exists() {
            anyhow::bail!(
                "kernel BTF not found at {}: bufscope needs a kernel built with \
                 CONFIG_DEBUG_INFO_BTF=y (or a BTF file for this kernel passed with \
                 --kernel.btf-path)",
                self.kernel.btf_path.display()
            );
        }
        Ok(addrs)
    }
}

/// Parses `500ms`, `30s`, `5m`, `1h` (and a bare number of seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 500ms, 30s, 5m, 1h"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("invalid duration unit in {s:?}: use ms, s, m or h")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("invalid duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Turns `:9477` / `0.0.0.0:9477` / `[::1]:9477` / `localhost:9477` into socket addresses.
pub fn listen_addrs(s: &str) -> Result<Vec<std::net::SocketAddr>, String> {
    use std::net::ToSocketAddrs as _;
    let full = if s.starts_with(':') {
        format!("[::]{s}")
    } else {
        s.to_string()
    };
    let addrs: Vec<_> = full
        .to_socket_addrs()
        .map_err(|e| {
            format!("invalid --web.listen-address {s:?}: {e} (expected HOST:PORT or :PORT)")
        })?
        .collect();
    if addrs.is_empty() {
        return Err(format!("--web.listen-address {s:?} resolves to no address"));
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn listen_address_forms() {
        assert_eq!(listen_addrs(":9477").unwrap()[0].port(), 9477);
        assert!(listen_addrs("127.0.0.1:1").unwrap()[0].ip().is_loopback());
        assert!(listen_addrs("nonsense").is_err());
        assert!(listen_addrs("127.0.0.1:99999").is_err());
    }

    #[test]
    fn unknown_probe_is_an_error_for_every_subcommand() {
        for sub in ["run", "check"] {
            let cli =
                Cli::try_parse_from(["bufscope", sub, "--probe.disable", "drops,nope"]).unwrap();
            let k = match cli.cmd {
                Command::Run(a) => a.kernel.clone(),
                Command::Check(a) => a.kernel,
                Command::Explain(_) | Command::Top(_) | Command::Cleanup(_) => unreachable!(),
            };
            let e = format!("{:#}", k.validate().unwrap_err());
            assert!(e.contains("\"nope\"") && e.contains("owners"), "{e}");
        }
    }

    #[test]
    fn pin_flags_are_checked() {
        let run = |args: &[&str]| {
            let mut v = vec!["bufscope", "run"];
            v.extend(args);
            let Command::Run(a) = Cli::try_parse_from(v).unwrap().cmd else {
                unreachable!()
            };
            format!("{:#}", a.validate().unwrap_err())
        };
        let e = run(&["--guard.mode", "observe", "--guard.persist"]);
        assert!(e.contains("--bpf.pin-path"), "{e}");
        let e = run(&["--bpf.pin-path", "bufscope"]);
        assert!(e.contains("not an absolute path"), "{e}");
        let e = run(&["--guard.persist"]);
        assert!(e.contains("--guard.mode is off"), "{e}");
        let e = Cli::try_parse_from(["bufscope", "cleanup"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn unknown_flag_is_an_error() {
        let e = Cli::try_parse_from(["bufscope", "run", "--no-such-flag"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
    }
}
