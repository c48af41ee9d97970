//! `--config.file bufscope.yaml`: probe selection, cardinality knobs and the other `run`
//! settings in a file. Flags given on the command line override the file; the file overrides
//! built-in defaults. Unknown keys are errors (a typo must not silently do nothing).
//!
//! ```yaml
//! web:
//!   listen_address: ":9477"
//!   telemetry_path: /metrics
//!   config_file: /etc/bufscope/web.yml   # TLS / basic auth (exporter-toolkit format)
//! probes:
//!   disable: [autotune]
//! drops:
//!   reasons: [SOCKET_RCVBUFF, PROTO_MEM, SOCKET_BACKLOG, TCP_ZEROWINDOW, TCP_OFO_DROP, TCP_OFO_QUEUE_PRUNE, FULL_RING, NOMEM]
//! cardinality:
//!   max_processes: 1000
//!   retention: 5m
//! poll_interval: 1s
//! attribution:
//!   hold: 10s
//! advice:
//!   window: 60s
//! path:
//!   procfs: /host/proc
//! kernel:
//!   btf_path: /sys/kernel/btf/vmlinux
//! bpf:
//!   drops_map_entries: 16384
//!   owners_map_entries: 65536
//!   autotune_map_entries: 16384
//!   events_ring_bytes: 1048576
//!   pin_path: /sys/fs/bpf/bufscope   # keep counting across restarts (README)
//! log:
//!   level: info
//!   format: logfmt   # or json
//! guard:
//!   mode: observe            # off | observe | enforce
//!   cgroup: /sys/fs/cgroup/unified/vpn.slice
//!   comm: [openvpn, wireguard-go]   # or exclude_comm: [...]
//!   udp_floor: 7340032
//!   raise_sysctl: false
//!   persist: false           # with bpf.pin_path: keep the guard attached while bufscope is down
//! ```

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::ArgMatches;
use clap::parser::ValueSource;
use serde::Deserialize;

use crate::cli::{LogFormat, RunArgs, parse_duration};

/// The file's shape (every field optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    web: Web,
    #[serde(default)]
    probes: Probes,
    #[serde(default)]
    drops: Drops,
    #[serde(default)]
    cardinality: Cardinality,
    poll_interval: Option<String>,
    #[serde(default)]
    attribution: Attribution,
    #[serde(default)]
    advice: Advice,
    #[serde(default)]
    path: Paths,
    #[serde(default)]
    kernel: Kernel,
    #[serde(default)]
    bpf: Bpf,
    #[serde(default)]
    log: Log,
    #[serde(default)]
    guard: Guard,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Web {
    listen_address: Option<String>,
    telemetry_path: Option<String>,
    config_file: Option<PathBuf>,
}
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Probes {
    disable: Option<Vec<String>>,
}
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Drops {
    reasons: Option<Vec<String>>,
}
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cardinality {
    max_processes: Option<usize>,
    retention: Option<String>,
}
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Attribution {
    hold: Option<String>,
}
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Advice {
    window: Option<String>,
}
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Paths {
    procfs: Option<PathBuf>,
    cgroup2: Option<PathBuf>,
}
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Kernel {
    btf_path: Option<PathBuf>,
}
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Bpf {
    drops_map_entries: Option<u32>,
    owners_map_entries: Option<u32>,
    autotune_map_entries: Option<u32>,
    events_ring_bytes: Option<u32>,
    pin_path: Option<PathBuf>,
}
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Guard {
    mode: Option<crate::signals::guard::GuardMode>,
    cgroup: Option<PathBuf>,
    comm: Option<Vec<String>>,
    exclude_comm: Option<Vec<String>>,
    udp_floor: Option<u64>,
    raise_sysctl: Option<bool>,
    persist: Option<bool>,
}
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Log {
    level: Option<String>,
    format: Option<String>,
}

/// Reads `path`.
pub fn load(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --config.file {}", path.display()))?;
    serde_yaml::from_str(&text).with_context(|| format!("invalid --config.file {}", path.display()))
}

/// Applies `file` to `args` wherever the command line did not set the value itself.
pub fn apply(file: FileConfig, args: &mut RunArgs, m: &ArgMatches) -> anyhow::Result<()> {
    let from_cli = |id: &str| m.value_source(id) == Some(ValueSource::CommandLine);
    let dur = |v: &str, key: &str| {
        parse_duration(v).map_err(|e| anyhow::anyhow!("--config.file: {key}: {e}"))
    };
    macro_rules! set {
        ($id:literal, $field:expr, $val:expr) => {
            if let Some(v) = $val {
                if !from_cli($id) {
                    $field = v;
                }
            }
        };
    }
    set!("listen", args.listen, file.web.listen_address);
    set!(
        "telemetry_path",
        args.telemetry_path,
        file.web.telemetry_path
    );
    if let Some(v) = file.web.config_file
        && !from_cli("web_config")
    {
        args.web_config = Some(v);
    }
    set!("disable", args.kernel.disable, file.probes.disable);
    set!("reasons", args.kernel.reasons, file.drops.reasons);
    set!(
        "max_processes",
        args.max_processes,
        file.cardinality.max_processes
    );
    if let Some(v) = file.cardinality.retention {
        set!(
            "retention",
            args.retention,
            Some(dur(&v, "cardinality.retention")?)
        );
    }
    if let Some(v) = file.poll_interval {
        set!(
            "poll_interval",
            args.poll_interval,
            Some(dur(&v, "poll_interval")?)
        );
    }
    if let Some(v) = file.attribution.hold {
        set!(
            "attribution_hold",
            args.signals.drops.hold,
            Some(dur(&v, "attribution.hold")?)
        );
    }
    if let Some(v) = file.advice.window {
        set!(
            "advice_window",
            args.advice_window,
            Some(dur(&v, "advice.window")?)
        );
    }
    set!("procfs", args.procfs, file.path.procfs);
    if let Some(v) = file.path.cgroup2
        && !from_cli("cgroup2")
    {
        args.kernel.cgroup2 = Some(v);
    }
    set!("mode", args.signals.guard.mode, file.guard.mode);
    set!("comm", args.signals.guard.comm, file.guard.comm);
    set!(
        "exclude_comm",
        args.signals.guard.exclude_comm,
        file.guard.exclude_comm
    );
    set!(
        "raise_sysctl",
        args.signals.guard.raise_sysctl,
        file.guard.raise_sysctl
    );
    set!("persist", args.signals.guard.persist, file.guard.persist);
    if let Some(v) = file.bpf.pin_path
        && !from_cli("pin_path")
    {
        args.pins.pin_path = Some(v);
    }
    if let Some(v) = file.guard.cgroup
        && !from_cli("cgroup")
    {
        args.signals.guard.cgroup = Some(v);
    }
    if let Some(v) = file.guard.udp_floor
        && !from_cli("udp_floor")
    {
        if v == 0 {
            anyhow::bail!("--config.file: guard.udp_floor must be at least 1");
        }
        args.signals.guard.udp_floor = Some(v);
    }
    set!("btf_path", args.kernel.btf_path, file.kernel.btf_path);
    set!(
        "drops_entries",
        args.signals.drops.entries,
        file.bpf.drops_map_entries
    );
    set!(
        "owners_entries",
        args.signals.owners.entries,
        file.bpf.owners_map_entries
    );
    set!(
        "autotune_entries",
        args.signals.autotune.entries,
        file.bpf.autotune_map_entries
    );
    if let Some(v) = file.bpf.events_ring_bytes {
        if v < 4096 || !v.is_power_of_two() {
            anyhow::bail!(
                "--config.file: bpf.events_ring_bytes {v} is not a power of two of at least 4096"
            );
        }
        set!("events_ring_bytes", args.events_ring_bytes, Some(v));
    }
    for (key, v) in [
        ("bpf.drops_map_entries", args.signals.drops.entries),
        ("bpf.owners_map_entries", args.signals.owners.entries),
        ("bpf.autotune_map_entries", args.signals.autotune.entries),
    ] {
        if v == 0 {
            anyhow::bail!("--config.file: {key} must be at least 1");
        }
    }
    if args.max_processes == 0 {
        anyhow::bail!("--config.file: cardinality.max_processes must be at least 1");
    }
    if let Some(v) = file.log.level {
        let lvl = v.parse().map_err(|_| {
            anyhow::anyhow!("--config.file: log.level {v:?}: use error, warn, info, debug or trace")
        })?;
        set!("log_level", args.kernel.log_level, Some(lvl));
    }
    if let Some(v) = file.log.format {
        let f = match v.as_str() {
            "logfmt" => LogFormat::Logfmt,
            "json" => LogFormat::Json,
            o => anyhow::bail!("--config.file: log.format {o:?}: use logfmt or json"),
        };
        set!("log_format", args.kernel.log_format, Some(f));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::{CommandFactory as _, FromArgMatches as _};

    fn parse(argv: &[&str], yaml: &str) -> anyhow::Result<RunArgs> {
        let m = Cli::command().try_get_matches_from(argv).unwrap();
        let Command::Run(mut args) = Cli::from_arg_matches(&m).unwrap().cmd else {
            panic!("not run");
        };
        let sub = m.subcommand_matches("run").unwrap();
        let file: FileConfig = serde_yaml::from_str(yaml)?;
        apply(file, &mut args, sub)?;
        Ok(*args)
    }

    #[test]
    fn file_sets_and_flags_override() {
        let y = "cardinality:\n  max_processes: 10\n  retention: 30s\nprobes:\n  disable: [autotune]\nweb:\n  listen_address: ':9999'\n";
        let a = parse(&["bufscope", "run"], y).unwrap();
        assert_eq!(a.max_processes, 10);
        assert_eq!(a.retention, std::time::Duration::from_secs(30));
        assert_eq!(a.kernel.disable, vec!["autotune".to_string()]);
        assert_eq!(a.listen, ":9999");
        let a = parse(
            &[
                "bufscope",
                "run",
                "--max-processes",
                "5",
                "--web.listen-address",
                ":1",
            ],
            y,
        )
        .unwrap();
        assert_eq!(a.max_processes, 5, "the flag wins");
        assert_eq!(a.listen, ":1");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let e = parse(&["bufscope", "run"], "cardinality:\n  max_procs: 3\n").unwrap_err();
        assert!(format!("{e:#}").contains("max_procs"), "{e:#}");
        let e = parse(&["bufscope", "run"], "cardinality:\n  retention: soon\n").unwrap_err();
        assert!(format!("{e:#}").contains("retention"), "{e:#}");
    }

    #[test]
    fn pin_path_and_guard_persist_from_the_file() {
        let y =
            "bpf:\n  pin_path: /sys/fs/bpf/bufscope\nguard:\n  mode: observe\n  persist: true\n";
        let a = parse(&["bufscope", "run"], y).unwrap();
        assert_eq!(
            a.pins.pin_path.as_deref(),
            Some(std::path::Path::new("/sys/fs/bpf/bufscope"))
        );
        assert!(a.signals.guard.persist);
        let a = parse(
            &["bufscope", "run", "--bpf.pin-path", "/sys/fs/bpf/other"],
            y,
        )
        .unwrap();
        assert_eq!(
            a.pins.pin_path.as_deref(),
            Some(std::path::Path::new("/sys/fs/bpf/other")),
            "the flag wins"
        );
    }
}
