//! The guest steps: which integration test each runs, with which environment, and when; the
//! selection `--step` makes; the test binaries they need.

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{Context as _, bail};

use crate::util::cargo;

/// One step inside a guest: an integration test binary, its filters, and environment.
///
/// To add a step, append one to [`STEPS`]; `--step` selects it by part of its name.
pub(super) struct Step {
    pub(super) name: &'static str,
    pub(super) test: &'static str,
    /// Extra environment of the test binary (name, value).
    pub(super) env: &'static [(&'static str, &'static str)],
    pub(super) args: &'static [&'static str],
    /// Run only when the guest's `bufscope check` line of this probe names this hook kind
    /// (a fallback test is pointless where the better hook is not the one in use).
    pub(super) when: Option<(&'static str, &'static str)>,
    /// The flags of the shared `bufscope run` the step's tests may use
    /// (`Exporter::shared`: a test whose flags are exactly these uses it instead of starting
    /// its own); the script starts one per set of flags, at the first step that names it.
    pub(super) shared: Option<&'static [&'static str]>,
}

/// The shared exporter of the steps that run with `--drops.zero-per-packet`.
const ZERO_PER_PACKET: &[&str] = &["--drops.zero-per-packet", "--retention", "4s"];

/// The test binary of the step that runs `cargo xtask dist`'s static binary alone (the matrix
/// builds that binary before booting when the step is selected).
pub(super) const STATIC_BINARY: &str = "static_binary";

/// The guest subset, in order (under TCG a bufscope start costs ≈10–40 s: the steps share
/// one per set of flags).
pub(super) const STEPS: &[Step] = &[
    Step {
        name: "check: hooks vs the kernel's BTF; check --btf; bufscope_probe_attached",
        test: "kernel_matrix",
        env: &[],
        args: &["check_names_the_hook"],
        when: None,
        shared: Some(&[]),
    },
    Step {
        name: "UDP drops vs /proc/<pid>/net/udp{,6}: receivers before and after bufscope, v4/v6, netns",
        test: "kernel_matrix",
        env: &[],
        args: &["udp_drops_before_and_after"],
        when: None,
        shared: Some(&[]),
    },
    Step {
        name: "UDP drops with --drops.zero-per-packet (no fexit: the tracepoint-only variant)",
        test: "kernel_matrix",
        env: &[(
            "BUFSCOPE_TEST_ARGS",
            "--drops.zero-per-packet --retention 4s",
        )],
        args: &["udp_drops_before_and_after"],
        when: Some(("drops", "fexit/")),
        shared: Some(ZERO_PER_PACKET),
    },
    Step {
        name: "netns drops with --drops.zero-per-packet: exact per namespace, series leave with their namespace",
        test: "kernel_matrix",
        env: &[("BUFSCOPE_TEST_ARGS", "--drops.zero-per-packet")],
        args: &["netns_series_leave_with_their_namespace"],
        when: Some(("drops", "fexit/")),
        shared: Some(ZERO_PER_PACKET),
    },
    Step {
        name: "TCP lock + wscale vs ss -tni",
        test: "tcp",
        env: &[],
        args: &["wscale_shrink_locks_and_established_match_ss"],
        when: None,
        shared: Some(&[]),
    },
    Step {
        name: "setsockopt clamp / SO_RCVBUFFORCE / EPERM vs errno and getsockopt",
        test: "kernel_matrix",
        env: &[],
        args: &["setsockopt_clamp_force_and_eperm"],
        when: None,
        shared: Some(&[]),
    },
    Step {
        name: "guard: TCP requests honoured/skipped vs ss -tm, children, scope, UDP floor and budget vs ss -uam",
        test: "guard",
        env: &[],
        args: &[
            "tcp_requests_above_autotuning_are_honoured_small_ones_skipped",
            "accepted_children_inherit_the_listeners_decision",
            "out_of_scope_binder_then_in_scope_user",
            "udp_floor_raises_never_asking_and_small_requests",
            "the_budget_stops_raises_at_its_bound_and_says_so",
        ],
        // Where the guard attaches (not 5.10: its cgroup/bind4 has no bpf_getsockopt).
        when: Some(("guard", "cgroup/bind4")),
        // Each test starts its own bufscope with its guard flags.
        shared: None,
    },
    Step {
        name: "autotune vs an independent bpftrace count (best hook and tracepoint fallback)",
        test: "kernel_matrix",
        env: &[],
        args: &["autotune_suppressed"],
        when: None,
        shared: Some(&[]),
    },
    Step {
        name: "IPsec ESP without an SA vs /proc/net/xfrm_stat (XfrmInNoStates) and the finding on the daemon",
        test: "xfrm",
        env: &[],
        args: &["inbound_esp_without_an_sa"],
        when: None,
        // Its own exporter: the test reads findings on processes it starts.
        shared: None,
    },
    Step {
        name: "kernel WireGuard drops vs the module's loss (veth rx - wg0 rx): junk to its port, a tunnel data message sent again faster than it decrypts",
        test: "wireguard",
        env: &[],
        args: &["kernel_wireguard_queue_drops"],
        when: None,
        // Its own exporter, started once the test has loaded the wireguard module.
        shared: None,
    },
    Step {
        name: "kernel WireGuard stall: data messages to one device pair dropped, handshakes passing: its peer stalled (vs wg show), the healthy pair and the far side not",
        test: "wireguard",
        env: &[],
        args: &["kernel_wireguard_stall"],
        when: None,
        // Its own exporter (--wireguard.stall-period 2s).
        shared: None,
    },
    Step {
        name: "static binary (cargo xtask dist) alone in an empty root: check passes, same hooks",
        test: STATIC_BINARY,
        env: &[],
        args: &["static_bufscope_runs_alone_and_check_passes"],
        when: None,
        // It starts no exporter: `bufscope check`, once per binary, in a root of its own.
        shared: None,
    },
];

/// The steps `filters` select (every step when empty): a step is selected when its name
/// contains one of them, case-insensitively.
pub(super) fn selected_steps(filters: &[String]) -> anyhow::Result<Vec<&'static Step>> {
    let wanted: Vec<String> = filters.iter().map(|f| f.to_lowercase()).collect();
    let steps: Vec<&Step> = STEPS
        .iter()
        .filter(|s| wanted.is_empty() || wanted.iter().any(|w| s.name.to_lowercase().contains(w)))
        .collect();
    if steps.is_empty() {
        let names: Vec<String> = STEPS.iter().map(|s| format!("'{}'", s.name)).collect();
        bail!(
            "no guest step matches --step {filters:?}: give part of one of {}",
            names.join(", ")
        );
    }
    Ok(steps)
}

/// The integration test binaries the steps run (cargo's JSON: target name → executable).
pub(super) fn test_binaries(steps: &[&Step]) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut tests: Vec<&str> = steps.iter().map(|s| s.test).collect();
    tests.sort_unstable();
    tests.dedup();
    let mut c = cargo();
    c.args([
        "test",
        "-p",
        "bufscope-integration",
        "--no-run",
        "--message-format=json",
    ]);
    for t in &tests {
        c.args(["--test", t]);
    }
    let out = c
        .stderr(Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the integration tests failed");
    }
    let mut found = Vec::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        if !l.contains("\"compiler-artifact\"") {
            continue;
        }
        let Some(exe) = json_str(l, "executable") else {
            continue;
        };
        if let Some(t) = tests
            .iter()
            .find(|t| l.contains(&format!("\"name\":\"{t}\"")))
        {
            found.push((t.to_string(), PathBuf::from(exe)));
        }
    }
    for t in &tests {
        if !found.iter().any(|(n, _)| n == t) {
            bail!("cargo built no test binary {t}");
        }
    }
    Ok(found)
}

/// The string value of `"key":"…"` in one line of JSON (cargo's paths have no escapes here).
fn json_str(line: &str, key: &str) -> Option<String> {
    let rest = line.split(&format!("\"{key}\":\"")).nth(1)?;
    Some(rest.split('"').next()?.to_string())
}
