//! `--config.file bufscope.yaml`: the flags of `bufscope run` in a file.
//!
//! The file is not parsed on its own: its keys name flags and its values become arguments of
//! one parse with the command line, so every value goes through the flag's own parser and
//! every check runs once, whichever side it came from. A flag given on the command line
//! replaces the file's value (a list too: it is not appended to); the file replaces the
//! built-in default.
//!
//! Each dot of a flag's long name nests a mapping and `-` is spelled `_`: `--a.b-c` is `b_c`
//! under `a:` (`--drops.map-entries` is `drops: {map_entries: …}`, `--poll-interval` is
//! `poll_interval` at the top; `web: {listen_address: …}` may also be written
//! `web.listen_address: …`). Four keys of earlier releases keep working ([`ALIASES`]); a
//! renamed flag's old name (its clap alias) works as a key too and is reported as deprecated
//! ([`Origins::deprecated`]), as on the command line ([`deprecated_flags`]). Lists
//! are YAML lists (or one comma-separated string, as on the command line); a switch is `true`
//! or `false`; an empty value (`key:`) is as if the key were absent. Unknown keys are errors (a
//! typo must not silently do nothing), with the nearest valid key when there is one.
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
//!   map_entries: 16384
//!   attribution_hold: 10s
//! owners:
//!   map_entries: 65536
//! autotune:
//!   map_entries: 16384
//! cardinality:
//!   max_processes: 1000
//!   retention: 5m
//! poll_interval: 1s
//! advice:
//!   window: 60s
//! path:
//!   procfs: /host/proc
//!   cgroup2: /host/sys/fs/cgroup
//! kernel:
//!   btf_path: /sys/kernel/btf/vmlinux
//! bpf:
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
//!   # lease: 5m              # with persist: how long it outlives bufscope before failing open
//! ```

mod renamed;
mod yaml;

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command};
pub use renamed::{Deprecated, deprecated_flags, renamed_flags};
use yaml::entries;

/// The flag that names the file; the file cannot set it.
const CONFIG_FLAG: &str = "config.file";

/// Keys of earlier releases that do not follow the rule (`--a.b-c` is `a: {b_c: …}`), and the
/// flag (long name) each sets. The rule's key for these flags works too.
pub const ALIASES: &[(&str, &str)] = &[
    ("web.config_file", "web.config.file"),
    ("probes.disable", "probe.disable"),
    ("cardinality.max_processes", "max-processes"),
    ("cardinality.retention", "retention"),
];

/// How a flag takes its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Takes {
    /// A switch (`--guard.persist`): `true` or `false`.
    Switch,
    /// One value.
    One,
    /// A list (repeatable, comma-separated).
    List,
}

/// A flag the file can set.
#[derive(Clone, Debug)]
struct Setting {
    /// clap's id (for [`ArgMatches::value_source`]).
    id: String,
    /// Long name without `--`.
    long: String,
    takes: Takes,
    /// Whether the flag has a default value (an empty list in the file cannot clear it).
    has_default: bool,
}

/// The file's keys, derived from a subcommand's flags (whichever struct declares them).
#[derive(Debug)]
pub struct Schema {
    keys: BTreeMap<String, Setting>,
    /// Keys of renamed flags (their clap aliases) → the key that replaces each.
    renamed: BTreeMap<String, String>,
}

/// The key for a flag: its long name with `-` spelled `_` (the dots nest).
pub fn key_of(long: &str) -> String {
    long.replace('-', "_")
}

impl Schema {
    /// The keys for the flags of `cmd` (a subcommand).
    pub fn of(cmd: &Command) -> Self {
        let mut keys = BTreeMap::new();
        let mut renamed = BTreeMap::new();
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else {
                continue;
            };
            let takes = match arg.get_action() {
                ArgAction::SetTrue => Takes::Switch,
                ArgAction::Set => Takes::One,
                ArgAction::Append => Takes::List,
                // Help, version, counters: nothing a file sets.
                _ => continue,
            };
            if long == CONFIG_FLAG {
                continue;
            }
            let setting = Setting {
                id: arg.get_id().to_string(),
                long: long.to_string(),
                takes,
                has_default: !arg.get_default_values().is_empty(),
            };
            for (alias, _) in ALIASES.iter().filter(|(_, flag)| *flag == long) {
                keys.insert((*alias).to_string(), setting.clone());
            }
            for old in arg.get_all_aliases().unwrap_or_default() {
                keys.insert(key_of(old), setting.clone());
                renamed.insert(key_of(old), key_of(long));
            }
            keys.insert(key_of(long), setting);
        }
        Self { keys, renamed }
    }

    /// Every key, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// Whether `prefix` is a section (`web`, `bpf`): some key is below it.
    fn is_section(&self, prefix: &str) -> bool {
        self.keys
            .keys()
            .any(|k| k.strip_prefix(prefix).is_some_and(|r| r.starts_with('.')))
    }

    /// The valid key nearest to `key`, if it is near enough to be a typo of it.
    fn nearest(&self, key: &str) -> Option<&str> {
        let (best, d) = self
            .keys()
            .map(|k| (k, edit_distance(key, k)))
            .min_by_key(|(_, d)| *d)?;
        (d <= (key.len() / 3).max(2)).then_some(best)
    }
}

/// One key of the file, as arguments.
#[derive(Debug)]
struct Entry {
    key: String,
    setting: Setting,
    args: Vec<OsString>,
}

/// Where the flags set by the file came from, to name the key when a later check refuses
/// one of them.
#[derive(Debug, Default)]
pub struct Origins {
    file: Option<PathBuf>,
    /// Flag long name → key.
    keys: HashMap<String, String>,
    /// Old flag names and keys that were used (warned about once logging is set up).
    pub deprecated: Vec<Deprecated>,
}

impl Origins {
    /// Logs one warning per deprecated name used (call once logging is set up).
    pub fn warn_deprecated(&self) {
        for d in &self.deprecated {
            tracing::warn!("{d}");
        }
    }

    /// The key that set `flag` (long name without `--`), when the file set it.
    pub fn key(&self, flag: &str) -> Option<&str> {
        self.keys.get(flag).map(String::as_str)
    }

    /// `e`'s message, with the file and key when the value came from the file.
    pub fn explain(&self, e: &crate::cli::Invalid) -> String {
        match (&self.file, self.key(e.flag)) {
            (Some(f), Some(key)) => {
                format!(
                    "{} (set by {key} in --config.file {})",
                    e.message,
                    f.display()
                )
            }
            _ => e.message.clone(),
        }
    }
}

/// When the subcommand in `matches` names a `--config.file`, parses `argv` again with the
/// file's settings added for every flag the command line leaves unset, and returns those
/// matches; otherwise returns `matches` as they are. `cmd` is the whole command `argv` was
/// parsed with (into `matches`). Every error names the file and the key.
pub fn apply(
    cmd: &Command,
    argv: &[OsString],
    matches: ArgMatches,
) -> anyhow::Result<(ArgMatches, Origins)> {
    let flags = deprecated_flags(cmd, argv);
    let Some(path) = config_path(cmd, &matches) else {
        return Ok((
            matches,
            Origins {
                deprecated: flags,
                ..Origins::default()
            },
        ));
    };
    let text = std::fs::read(&path)
        .map_err(|e| anyhow::anyhow!("--config.file {}: {e}", path.display()))
        .and_then(|b| {
            String::from_utf8(b).map_err(|_| {
                anyhow::anyhow!(
                    "--config.file {}: not UTF-8 text (the file must be YAML)",
                    path.display()
                )
            })
        })?;
    let (m, mut origins) = merge(cmd, argv, &matches, &path, &text)
        .map_err(|e| anyhow::anyhow!("--config.file {}: {e}", path.display()))?;
    origins.deprecated.splice(0..0, flags);
    Ok((m, origins))
}

/// The `--config.file` of the subcommand in `matches`, if given.
fn config_path(cmd: &Command, matches: &ArgMatches) -> Option<PathBuf> {
    let (name, sub) = matches.subcommand()?;
    let arg = cmd
        .find_subcommand(name)?
        .get_arguments()
        .find(|a| a.get_long() == Some(CONFIG_FLAG))?;
    sub.get_one::<PathBuf>(arg.get_id().as_str()).cloned()
}

/// [`apply`] with the file's `text`; errors without the file's name.
fn merge(
    cmd: &Command,
    argv: &[OsString],
    matches: &ArgMatches,
    path: &Path,
    text: &str,
) -> Result<(ArgMatches, Origins), String> {
    let Some((name, sub)) = matches.subcommand() else {
        return Err("no subcommand".into());
    };
    let Some(subcmd) = cmd.find_subcommand(name) else {
        return Err(format!("no subcommand {name}"));
    };
    let schema = Schema::of(subcmd);
    let entries = entries(&schema, text)?;
    let argv0 = argv.first().cloned().unwrap_or_else(|| "bufscope".into());
    let mut extra = Vec::new();
    let mut origins = Origins {
        file: Some(path.to_path_buf()),
        keys: HashMap::new(),
        deprecated: Vec::new(),
    };
    for e in &entries {
        if let Some(new) = schema.renamed.get(&e.key) {
            origins.deprecated.push(Deprecated {
                old: format!("key {} in --config.file {}", e.key, path.display()),
                new: format!("key {new}"),
            });
        }
    }
    for e in entries {
        // The flag's own parser, alone, so that a refusal names the key (whether or not the
        // command line overrides the value: a broken file is an error either way).
        let alone = [argv0.clone(), name.into()]
            .into_iter()
            .chain(e.args.clone());
        cmd.clone()
            .try_get_matches_from(alone)
            .map_err(|err| format!("{}: {}", e.key, one_line(&err)))?;
        let from_cli = matches!(
            sub.value_source(&e.setting.id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        if !from_cli {
            origins.keys.insert(e.setting.long.clone(), e.key);
            extra.extend(e.args);
        }
    }
    // The file's arguments go right after the subcommand's name, the command line's after them.
    let at = argv
        .iter()
        .skip(1)
        .position(|a| a.as_os_str() == name)
        .map_or(argv.len(), |i| i + 2);
    let merged: Vec<OsString> = argv[..at]
        .iter()
        .cloned()
        .chain(extra)
        .chain(argv[at..].iter().cloned())
        .collect();
    let m = cmd
        .clone()
        .try_get_matches_from(merged)
        .map_err(|err| one_line(&err))?;
    Ok((m, origins))
}

/// clap's message on one line, without the `error:` prefix and the `--help` hint.
fn one_line(e: &clap::Error) -> String {
    e.render()
        .to_string()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
        .map(|l| l.strip_prefix("error: ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Levenshtein distance (bytes).
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests;
