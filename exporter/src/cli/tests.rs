#![allow(clippy::unwrap_used)]
use super::*;

#[test]
fn durations() {
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
    assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
    assert!(parse_duration("2").unwrap_err().contains("2s or 2ms?"));
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
        let e =
            Cli::try_parse_from(["bufscope", sub, "--probe.disable", "drops,nope"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
        let e = e.render().to_string();
        assert!(e.contains("'nope'") && e.contains("owners"), "{e}");
    }
    for p in crate::signals::PROBES {
        Cli::try_parse_from(["bufscope", "check", "--probe.disable", p.name]).unwrap();
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

#[test]
fn durations_never_overflow() {
    for s in [
        "99999999999999999999h",
        "18446744073709551616",
        "1e308",
        "179769313486231570000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000h",
        "8761h",
    ] {
        assert!(parse_duration(s).is_err(), "{s}");
    }
    assert_eq!(parse_duration("8760h").unwrap(), MAX_DURATION);
    let poll = duration_within(MIN_POLL_INTERVAL, MAX_DURATION);
    assert!(poll("0ms").unwrap_err().contains("at least 50ms"));
    assert!(poll("0").unwrap_err().contains("0s or 0ms?"));
    assert_eq!(poll("50ms").unwrap(), MIN_POLL_INTERVAL);
}

/// How a bad input must be refused.
enum Refused {
    /// By clap (exit 2), its message containing the text.
    Usage(&'static str),
    /// By `RunArgs::validate` (exit 1): the flag, and a text of the one-line message.
    Invalid(&'static str, &'static str),
}
use Refused::{Invalid as Bad, Usage};

/// `bufscope run` with each of these refused before anything is loaded.
#[rustfmt::skip]
const BAD_RUN: &[(&[&str], Refused)] = &[
    (&["--web.telemetry-path", "/healthz"], Bad("web.telemetry-path", "taken by bufscope's own /healthz route")),
    (&["--web.telemetry-path", "/"], Bad("web.telemetry-path", "status page")),
    (&["--web.telemetry-path", "/api/v1/findings"], Bad("web.telemetry-path", "taken")),
    (&["--web.telemetry-path", "/api/v1/status"], Bad("web.telemetry-path", "taken")),
    (&["--web.telemetry-path", ""], Bad("web.telemetry-path", "must start with '/'")),
    (&["--web.telemetry-path", "metrics"], Bad("web.telemetry-path", "must start with '/'")),
    (&["--web.telemetry-path", "/:name"], Bad("web.telemetry-path", "':' is not allowed")),
    (&["--web.telemetry-path", "/*rest"], Bad("web.telemetry-path", "'*' is not allowed")),
    (&["--web.telemetry-path", "/{id}"], Bad("web.telemetry-path", "'{' is not allowed")),
    (&["--web.telemetry-path", "/a//b"], Bad("web.telemetry-path", "empty path segment")),
    (&["--web.telemetry-path", "/../metrics"], Bad("web.telemetry-path", "'..'")),
    (&["--web.telemetry-path", "/metrics?x=1"], Bad("web.telemetry-path", "'?' is not allowed")),
    (&["--web.telemetry-path", "/m etrics"], Bad("web.telemetry-path", "' ' is not allowed")),
    (&["--web.telemetry-path", "/métriques"], Bad("web.telemetry-path", "'é' is not allowed")),
    (&["--web.listen-address", ""], Bad("web.listen-address", "HOST:PORT")),
    (&["--web.listen-address", "127.0.0.1:99999"], Bad("web.listen-address", "HOST:PORT")),
    (&["--web.listen-address", ":"], Bad("web.listen-address", "HOST:PORT")),
    (&["--web.config.file", "/"], Bad("web.config.file", "a directory")),
    (&["--web.config.file", "/nonexistent/web.yml"], Bad("web.config.file", "no such file")),
    (&["--kernel.btf-path", "/nonexistent/vmlinux"], Bad("kernel.btf-path", "CONFIG_DEBUG_INFO_BTF")),
    (&["--kernel.btf-path", "/"], Bad("kernel.btf-path", "a directory")),
    (&["--path.procfs", "/"], Bad("path.procfs", "not a procfs mount")),
    (&["--path.procfs", "/nonexistent"], Bad("path.procfs", "not a procfs mount")),
    (&["--path.cgroup2", "/proc"], Bad("path.cgroup2", "not a cgroup2 mount")),
    (&["--path.cgroup2", "/nonexistent"], Bad("path.cgroup2", "--path.cgroup2")),
    (&["--bpf.pin-path", "bufscope"], Usage("not an absolute path")),
    (&["--bpf.pin-path", ""], Usage("a value is required for '--bpf.pin-path <DIR>'")),
    (&["--bpf.pin-path", "/proc/self/exe"], Bad("bpf.pin-path", "not a directory")),
    (&["--bpf.pin-path", "/proc/bufscope"], Bad("bpf.pin-path", "not on a bpffs")),
    (&["--guard.persist"], Bad("guard.persist", "--guard.mode is off")),
    (&["--guard.raise-sysctl"], Bad("guard.raise-sysctl", "--guard.mode is off")),
    (&["--guard.mode", "observe", "--probe.disable", "autotune,guard"], Bad("probe.disable", "remove guard from --probe.disable")),
    (&["--guard.mode", "enforce", "--probe.disable", "setsockopt"], Bad("probe.disable", "--guard.mode enforce needs the setsockopt probe")),
    (&["--guard.mode", "observe", "--guard.cgroup", "/proc"], Bad("guard.cgroup", "not a cgroup v2 directory")),
    (&["--drops.reasons", ""], Usage("invalid drop reason")),
    (&["--drops.reasons", "NOMEM,nomem"], Usage("in capitals")),
    (&["--drops.reasons", "SKB_DROP_REASON_NOMEM"], Usage("leave out the SKB_DROP_REASON_ prefix")),
    (&["--guard.mode", "observe", "--guard.persist"], Bad("guard.persist", "add --bpf.pin-path")),
    (&["--guard.mode", "observe", "--guard.comm", "a-name-of-16-chr", ], Bad("guard.comm", "1 to 15 bytes")),
    (&["--guard.mode", "observe", "--guard.exclude-comm", ""], Bad("guard.exclude-comm", "1 to 15 bytes")),
    (&["--guard.mode", "observe", "--guard.comm", "a", "--guard.exclude-comm", "b", ], Bad("guard.exclude-comm", "cannot be combined")),
    (&["--guard.mode", "observe", "--guard.cgroup", "/nonexistent"], Bad("guard.cgroup", "not a cgroup v2 directory")),
    (&["--retention", "99999999999999999999h"], Usage("too long")),
    (&["--retention", "8761h"], Usage("too long")),
    (&["--retention", ""], Usage("invalid duration")),
    (&["--retention=-5s"], Usage("invalid duration")),
    (&["--retention", "5 parsecs"], Usage("invalid duration unit")),
    (&["--drops.attribution-hold", "1e400"], Usage("invalid duration unit")),
    (&["--drops.attribution-hold", "NaN"], Usage("invalid duration")),
    (&["--poll-interval", "0"], Usage("0s or 0ms?")),
    (&["--poll-interval", "0ms"], Usage("at least 50ms")),
    (&["--poll-interval", "10ms"], Usage("at least 50ms")),
    (&["--poll-interval", "99999999999999999999h"], Usage("too long")),
    (&["--advice.window", "0s"], Usage("at least 1s")),
    (&["--advice.window", "1h"], Usage("at most 300s")),
    (&["--max-processes", "0"], Usage("at least 1")),
    (&["--max-processes=-5"], Usage("invalid number")),
    (&["--max-processes", "99999999999999999999999"], Usage("invalid number")),
    (&["--drops.map-entries", "0"], Usage("at least 1")),
    (&["--owners.map-entries", "4294967296"], Usage("invalid number")),
    (&["--autotune.map-entries", ""], Usage("invalid number")),
    (&["--bpf.events-ring-bytes", "4095"], Usage("power of two")),
    (&["--bpf.events-ring-bytes", "3000000"], Usage("power of two")),
    (&["--bpf.events-ring-bytes", "8589934592"], Usage("invalid size")),
    (&["--guard.udp-floor", "0"], Usage("1..=2147483647")),
    (&["--guard.udp-floor", "2147483648"], Usage("1..=2147483647")),
    (&["--guard.mode", "on"], Usage("possible values: off, observe, enforce")),
    (&["--probe.disable", ""], Usage("possible values")),
    (&["--probe.disable", "dorps"], Usage("drops")),
    (&["--log.level", "loud"], Usage("--log.level")),
    (&["--log.format", "xml"], Usage("possible values: logfmt, json")),
    (&["--no-such-flag"], Usage("unexpected argument '--no-such-flag'")),
];

#[test]
fn bad_run_flags_are_refused_with_the_flag_named() {
    for (flags, want) in BAD_RUN {
        let argv = ["bufscope", "run"].iter().chain(flags.iter());
        match (Cli::try_parse_from(argv), want) {
            (Err(e), Usage(text)) => {
                let e = e.render().to_string();
                assert!(e.contains(text), "{flags:?}: {e}");
            }
            (Ok(cli), Bad(flag, text)) => {
                let Command::Run(a) = cli.cmd else {
                    unreachable!()
                };
                let e = a.validate().unwrap_err();
                assert_eq!(e.flag, *flag, "{flags:?}: {e}");
                assert!(e.message.contains(text), "{flags:?}: {e}");
                assert!(e.message.contains(&format!("--{flag}")), "{flags:?}: {e}");
                assert!(!e.message.contains('\n'), "{flags:?}: one line: {e}");
            }
            (Ok(_), Usage(text)) => panic!("{flags:?}: accepted by clap, want {text:?}"),
            (Err(e), Bad(..)) => panic!("{flags:?}: refused by clap: {e}"),
        }
    }
}

#[test]
fn good_telemetry_paths_pass() {
    for p in [
        "/metrics",
        "/metrics/",
        "/bufscope/metrics",
        "/healthz/",
        "/x-y_z.~1",
    ] {
        check_telemetry_path(p).unwrap();
    }
}

#[test]
fn non_utf8_arguments_are_usage_errors_or_paths() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt as _;
    let bad = || OsString::from_vec(b"/tmp/\xff\xfe".to_vec());
    for flag in [
        "--web.listen-address",
        "--retention",
        "--probe.disable",
        "--guard.comm",
    ] {
        let e = Cli::try_parse_from([OsString::from("bufscope"), "run".into(), flag.into(), bad()])
            .unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidUtf8, "{flag}");
    }
    let cli = Cli::try_parse_from([
        OsString::from("bufscope"),
        "run".into(),
        "--bpf.pin-path".into(),
        bad(),
    ])
    .unwrap();
    let Command::Run(a) = cli.cmd else {
        unreachable!()
    };
    assert_eq!(a.validate().unwrap_err().flag, "bpf.pin-path");
}

#[test]
fn pin_paths_are_absolute_for_every_subcommand() {
    for sub in ["run", "check", "cleanup"] {
        for p in ["", "bufscope", "."] {
            let e = Cli::try_parse_from(["bufscope", sub, "--bpf.pin-path", p]).unwrap_err();
            let e = e.render().to_string();
            assert!(p.is_empty() || e.contains("not an absolute path"), "{e}");
        }
    }
}
