#![allow(clippy::unwrap_used)]
use std::time::Duration;

use clap::{CommandFactory as _, FromArgMatches as _};

use super::*;
use crate::cli::{Cli, Command as Sub, LogFormat, RunArgs};
use crate::signals::guard::GuardMode;

const FILE: &str = "/etc/bufscope/bufscope.yaml";

/// `bufscope run --config.file FILE <flags>` with `yaml` as the file.
fn parse(flags: &[&str], yaml: &str) -> Result<(RunArgs, Origins), String> {
    let cmd = Cli::command();
    let argv: Vec<OsString> = ["bufscope", "run", "--config.file", FILE]
        .iter()
        .chain(flags)
        .map(OsString::from)
        .collect();
    let m = cmd.clone().try_get_matches_from(&argv).unwrap();
    let (m, origins) = merge(&cmd, &argv, &m, Path::new(FILE), yaml)?;
    let Sub::Run(a) = Cli::from_arg_matches(&m).unwrap().cmd else {
        unreachable!()
    };
    Ok((*a, origins))
}

fn args(flags: &[&str], yaml: &str) -> RunArgs {
    parse(flags, yaml).unwrap().0
}

fn err(yaml: &str) -> String {
    parse(&[], yaml).unwrap_err()
}

#[test]
fn file_sets_and_flags_override() {
    let y = "cardinality:\n  max_processes: 10\n  retention: 30s\nprobes:\n  disable: [autotune]\nweb:\n  listen_address: ':9999'\n";
    let a = args(&[], y);
    assert_eq!(a.max_processes, 10);
    assert_eq!(a.retention, Duration::from_secs(30));
    assert_eq!(a.kernel.disable, vec!["autotune".to_string()]);
    assert_eq!(a.listen, ":9999");
    let a = args(&["--max-processes", "5", "--web.listen-address", ":1"], y);
    assert_eq!(a.max_processes, 5, "the flag wins");
    assert_eq!(a.listen, ":1");
    assert_eq!(
        a.retention,
        Duration::from_secs(30),
        "the file still sets the rest"
    );
}

#[test]
fn a_list_on_the_command_line_replaces_the_files() {
    let y = "probes:\n  disable: [autotune, owners]\ndrops:\n  reasons: [NOMEM]\n";
    let a = args(&["--probe.disable", "owners"], y);
    assert_eq!(a.kernel.disable, vec!["owners".to_string()]);
    assert_eq!(a.kernel.reasons, vec!["NOMEM".to_string()]);
    let a = args(
        &["--drops.reasons", "PROTO_MEM", "--drops.reasons=FULL_RING"],
        y,
    );
    assert_eq!(a.kernel.reasons, vec!["PROTO_MEM", "FULL_RING"]);
    assert_eq!(a.kernel.disable, vec!["autotune", "owners"]);
    // One comma-separated string, as on the command line.
    let a = args(&[], "probes:\n  disable: autotune,owners\n");
    assert_eq!(a.kernel.disable, vec!["autotune", "owners"]);
}

/// Every key the file took before it fed the parser, with a value other than the default.
#[test]
fn every_earlier_key_still_works() {
    let y = "\
web:
  listen_address: '127.0.0.1:9999'
  telemetry_path: /m
  config_file: /etc/bufscope/web.yml
probes:
  disable: [autotune]
drops:
  reasons: [NOMEM]
  map_entries: 11
  attribution_hold: 3s
owners:
  map_entries: 12
autotune:
  map_entries: 13
cardinality:
  max_processes: 7
  retention: 1m
poll_interval: 2s
advice:
  window: 30s
path:
  procfs: /host/proc
  cgroup2: /host/sys/fs/cgroup
kernel:
  btf_path: /btf
bpf:
  events_ring_bytes: 8192
  pin_path: /sys/fs/bpf/x
log:
  level: debug
  format: json
guard:
  mode: enforce
  cgroup: /sys/fs/cgroup/vpn.slice
  comm: [openvpn, wireguard-go]
  udp_floor: 4096
  raise_sysctl: true
  persist: true
";
    let a = args(&[], y);
    assert_eq!(a.listen, "127.0.0.1:9999");
    assert_eq!(a.telemetry_path, "/m");
    assert_eq!(a.web_config.unwrap(), Path::new("/etc/bufscope/web.yml"));
    assert_eq!(a.kernel.disable, vec!["autotune"]);
    assert_eq!(a.kernel.reasons, vec!["NOMEM"]);
    assert_eq!(a.max_processes, 7);
    assert_eq!(a.retention, Duration::from_secs(60));
    assert_eq!(a.poll_interval, Duration::from_secs(2));
    assert_eq!(a.signals.drops.hold, Duration::from_secs(3));
    assert_eq!(a.advice_window, Duration::from_secs(30));
    assert_eq!(a.procfs, Path::new("/host/proc"));
    assert_eq!(a.kernel.cgroup2.unwrap(), Path::new("/host/sys/fs/cgroup"));
    assert_eq!(a.kernel.btf_path, Path::new("/btf"));
    assert_eq!(
        (
            a.signals.drops.entries,
            a.signals.owners.entries,
            a.signals.autotune.entries
        ),
        (11, 12, 13)
    );
    assert_eq!(a.events_ring_bytes, 8192);
    assert_eq!(a.pins.pin_path.unwrap(), Path::new("/sys/fs/bpf/x"));
    assert_eq!(a.kernel.log_level, tracing::Level::DEBUG);
    assert_eq!(a.kernel.log_format, LogFormat::Json);
    assert_eq!(a.signals.guard.mode, GuardMode::Enforce);
    assert_eq!(
        a.signals.guard.cgroup.unwrap(),
        Path::new("/sys/fs/cgroup/vpn.slice")
    );
    assert_eq!(a.signals.guard.comm, vec!["openvpn", "wireguard-go"]);
    assert_eq!(a.signals.guard.udp_floor, Some(4096));
    assert!(a.signals.guard.raise_sysctl && a.signals.guard.persist);
}

#[test]
fn the_rules_keys_work_for_the_historical_flags_too() {
    let a = args(
        &[],
        "max_processes: 9\nretention: 2m\nprobe:\n  disable: [owners]\nweb:\n  config:\n    file: /w.yml\n",
    );
    assert_eq!(a.max_processes, 9);
    assert_eq!(a.retention, Duration::from_secs(120));
    assert_eq!(a.kernel.disable, vec!["owners"]);
    assert_eq!(a.web_config.unwrap(), Path::new("/w.yml"));
    // Dotted keys are the same keys.
    let a = args(
        &[],
        "web.listen_address: ':5'\nbpf:\n  pin_path: /sys/fs/bpf/y\n",
    );
    assert_eq!(a.listen, ":5");
    assert_eq!(a.pins.pin_path.unwrap(), Path::new("/sys/fs/bpf/y"));
    let e = err("max_processes: 9\ncardinality:\n  max_processes: 8\n");
    assert!(
        e.contains("max_processes and cardinality.max_processes both set --max-processes"),
        "{e}"
    );
}

#[test]
fn every_flag_of_run_has_a_key_and_every_alias_a_flag() {
    let cmd = Cli::command();
    let run = cmd.find_subcommand("run").unwrap();
    let schema = Schema::of(run);
    for arg in run.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if ["help", CONFIG_FLAG].contains(&long) {
            continue;
        }
        assert!(
            schema.keys.contains_key(&key_of(long)),
            "--{long} has no key"
        );
    }
    for (alias, flag) in ALIASES {
        assert_eq!(
            schema.keys.get(*alias).map(|s| s.long.as_str()),
            Some(*flag),
            "alias {alias}"
        );
    }
}

#[test]
fn switches_from_the_file() {
    let y = "bpf:\n  pin_path: /sys/fs/bpf/bufscope\nguard:\n  mode: observe\n  persist: true\n";
    let a = args(&[], y);
    assert_eq!(a.pins.pin_path.unwrap(), Path::new("/sys/fs/bpf/bufscope"));
    assert!(a.signals.guard.persist);
    let a = args(&["--bpf.pin-path", "/sys/fs/bpf/other"], y);
    assert_eq!(
        a.pins.pin_path.unwrap(),
        Path::new("/sys/fs/bpf/other"),
        "the flag wins"
    );
    let a = args(&[], "guard:\n  mode: observe\n  persist: false\n");
    assert!(!a.signals.guard.persist);
}

#[test]
fn empty_files_and_values_set_nothing() {
    for y in ["", "# nothing\n", "web:\n", "cardinality:\n  retention:\n"] {
        let a = args(&[], y);
        assert_eq!(a.retention, Duration::from_secs(300), "{y:?}");
    }
}

/// Bad files: each refused with the key (and, for values, the flag's own parser's words).
#[rustfmt::skip]
const BAD_FILES: &[(&str, &str)] = &[
    ("cardinality:\n  max_procs: 3\n", "unknown key cardinality.max_procs (did you mean cardinality.max_processes?)"),
    ("wbe:\n  listen_address: ':1'\n", "unknown key wbe.listen_address (did you mean web.listen_address?)"),
    ("web:\n  listen-address: ':1'\n", "did you mean web.listen_address?"),
    ("frobnicate: 1\n", "unknown key frobnicate (keys are the flags"),
    ("config:\n  file: /x.yaml\n", "config.file: a config file cannot name another one"),
    ("cardinality:\n  retention: soon\n", "cardinality.retention: invalid value 'soon' for '--retention <DURATION>': invalid duration"),
    ("cardinality:\n  retention: 99999999999999999999h\n", "cardinality.retention: invalid value"),
    ("cardinality:\n  max_processes: 0\n", "cardinality.max_processes: invalid value '0' for '--max-processes <N>': must be at least 1"),
    ("cardinality:\n  max_processes: -3\n", "cardinality.max_processes: invalid value '-3'"),
    ("poll_interval: 0\n", "poll_interval: invalid value '0' for '--poll-interval <DURATION>': duration \"0\" has no unit: 0s or 0ms?"),
    ("poll_interval: 0ms\n", "poll_interval: invalid value '0ms' for '--poll-interval <DURATION>': \"0ms\" is too short"),
    ("probes:\n  disable: [dorps]\n", "probes.disable: invalid value 'dorps' for '--probe.disable <PROBE>' [possible values: drops"),
    ("bpf:\n  events_ring_bytes: 4095\n", "bpf.events_ring_bytes: invalid value '4095'"),
    ("drops:\n  map_entries: 0\n", "drops.map_entries: invalid value '0'"),
    ("bpf:\n  drops_map_entries: 0\n", "bpf.drops_map_entries: invalid value '0' for '--drops.map-entries <N>'"),
    ("guard:\n  udp_floor: 0\n", "guard.udp_floor: invalid value '0'"),
    ("guard:\n  mode: on\n", "guard.mode: invalid value 'on'"),
    ("guard:\n  persist: yes\n", "guard.persist: expected true or false, found a string"),
    ("guard:\n  persist: [true]\n", "guard.persist: expected true or false, found a list"),
    ("log:\n  level: loud\n", "log.level: invalid value 'loud'"),
    ("log:\n  format: xml\n", "log.format: invalid value 'xml'"),
    ("web:\n  listen_address: [':1', ':2']\n", "web.listen_address: takes one value, found a list"),
    ("web:\n  listen_address:\n    port: 1\n", "web.listen_address: expected a value, found a mapping"),
    ("web: ':9477'\n", "web: expected a mapping of web.* settings, found a string"),
    ("drops:\n  reasons: []\n", "drops.reasons: an empty list"),
    ("drops:\n  reasons: [[NOMEM]]\n", "drops.reasons: a list of plain values is expected"),
    ("- web\n- bpf\n", "expected a mapping of settings (`key: value` lines), found a list"),
    ("just a string\n", "expected a mapping of settings (`key: value` lines), found a string"),
    ("1: x\n", "a key is a number: keys are names"),
    ("web: {listen_address: ':1'\n", "not valid YAML"),
    ("web:\n  listen_address: ':1'\nweb:\n  telemetry_path: /m\n", "not valid YAML: duplicate entry with key \"web\""),
    ("retention: !Duration 5m\n", "retention: expected a value, found a tagged value"),
];

#[test]
fn bad_files_name_the_key() {
    for (yaml, want) in BAD_FILES {
        let e = err(yaml);
        assert!(e.contains(want), "{yaml:?}:\n got  {e}\n want {want}");
        assert!(!e.contains('\n'), "{yaml:?}: one line: {e}");
    }
}

#[test]
fn a_broken_value_is_an_error_even_when_the_flag_overrides_it() {
    let e = parse(&["--retention", "1m"], "cardinality:\n  retention: soon\n").unwrap_err();
    assert!(e.contains("cardinality.retention"), "{e}");
}

#[test]
fn checks_after_the_parse_name_the_key_that_set_the_flag() {
    let (a, origins) = parse(&[], "web:\n  telemetry_path: /healthz\n").unwrap();
    let e = a.validate().unwrap_err();
    let msg = origins.explain(&e);
    assert!(
        msg.contains("--web.telemetry-path /healthz is taken"),
        "{msg}"
    );
    assert!(
        msg.ends_with(&format!(
            "(set by web.telemetry_path in --config.file {FILE})"
        )),
        "{msg}"
    );
    // The same value from the command line: no file named.
    let (a, origins) = parse(&["--web.telemetry-path", "/healthz"], "").unwrap();
    let msg = origins.explain(&a.validate().unwrap_err());
    assert!(!msg.contains("config.file"), "{msg}");
}

#[test]
fn nearest_key_needs_to_be_near() {
    let cmd = Cli::command();
    let schema = Schema::of(cmd.find_subcommand("run").unwrap());
    assert_eq!(schema.nearest("retnetion"), Some("retention"));
    assert_eq!(schema.nearest("bpf.pin_paht"), Some("bpf.pin_path"));
    assert_eq!(schema.nearest("zzzzzzzzzzzzzz"), None);
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(edit_distance("", "abc"), 3);
}

/// Renamed flags: the old names still work, on the command line and as keys, and each use is
/// reported once (the daemon logs it as a warning); the new names report nothing.
#[test]
fn old_names_of_renamed_flags_work_and_are_reported() {
    let cmd = Cli::command();
    let old = [
        "bufscope",
        "run",
        "--bpf.drops-map-entries=11",
        "--attribution.hold",
        "3s",
        "--bpf.owners-map-entries",
        "12",
        "--bpf.autotune-map-entries",
        "13",
    ];
    let argv: Vec<OsString> = old.iter().map(OsString::from).collect();
    let m = cmd.clone().try_get_matches_from(&argv).unwrap();
    let (m, origins) = apply(&cmd, &argv, m).unwrap();
    let Sub::Run(a) = Cli::from_arg_matches(&m).unwrap().cmd else {
        unreachable!()
    };
    assert_eq!(a.signals.drops.entries, 11);
    assert_eq!(a.signals.drops.hold, Duration::from_secs(3));
    assert_eq!(a.signals.owners.entries, 12);
    assert_eq!(a.signals.autotune.entries, 13);
    let said: Vec<String> = origins.deprecated.iter().map(ToString::to_string).collect();
    assert_eq!(said.len(), 4, "one per old name: {said:?}");
    assert!(
        said[0].contains("--bpf.drops-map-entries is deprecated")
            && said[0].contains("use --drops.map-entries"),
        "{said:?}"
    );
    assert!(said[1].contains("use --drops.attribution-hold"), "{said:?}");

    let (a, origins) = parse(
        &[],
        "attribution:\n  hold: 4s\nbpf:\n  owners_map_entries: 5\n",
    )
    .unwrap();
    assert_eq!(a.signals.drops.hold, Duration::from_secs(4));
    assert_eq!(a.signals.owners.entries, 5);
    let said: Vec<String> = origins.deprecated.iter().map(ToString::to_string).collect();
    assert_eq!(
        said,
        [
            format!(
                "key attribution.hold in --config.file {FILE} is deprecated and will be removed: use key drops.attribution_hold (same meaning, same values)"
            ),
            format!(
                "key bpf.owners_map_entries in --config.file {FILE} is deprecated and will be removed: use key owners.map_entries (same meaning, same values)"
            ),
        ]
    );
    assert!(
        err("attribution:\n  hold: 4s\ndrops:\n  attribution_hold: 5s\n").contains("both set"),
        "the old and the new key for one flag"
    );

    let new = ["bufscope", "run", "--drops.map-entries", "11"];
    let argv: Vec<OsString> = new.iter().map(OsString::from).collect();
    let m = cmd.clone().try_get_matches_from(&argv).unwrap();
    assert!(apply(&cmd, &argv, m).unwrap().1.deprecated.is_empty());
}
