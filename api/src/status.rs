//! `/api/v1/status`: the data of the status page (`/`) and of `bufscope top`: a row per
//! tracked process with every signal's counters, the health of each probe, and the buffer
//! limits.
//!
//! These structs define the document's keys: the status page's script
//! (exporter/src/http/status.html) reads them by name. Every field but `processes` may be
//! absent when read (an older or stand-in exporter): it then reads as zero or empty.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where the daemon serves the [`StatusDocument`].
pub const PATH: &str = "/api/v1/status";

/// The `/api/v1/status` document.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusDocument {
    /// bufscope version of the exporter.
    #[serde(default)]
    pub version: String,
    /// Kernel release it runs on.
    #[serde(default)]
    pub kernel: String,
    /// When the document was made, in seconds since the Unix epoch (fractional).
    #[serde(default)]
    pub generated_at: Option<f64>,
    /// `net.core.rmem_max` (`null`: not readable there).
    #[serde(default)]
    pub net_core_rmem_max: Option<i64>,
    /// `net.core.wmem_max` (`null`: not readable there).
    #[serde(default)]
    pub net_core_wmem_max: Option<i64>,
    /// A row per tracked process (including the `_other` and `_unknown` pseudo-processes).
    pub processes: Vec<ProcessRow>,
    /// A row per probe, in the order they attach.
    #[serde(default)]
    pub probes: Vec<ProbeRow>,
    /// Events no process could be found for, by probe.
    #[serde(default)]
    pub attribution_unknown: BTreeMap<String, u64>,
    /// Events the probes could not hand over (full ring buffer, full map), by reason.
    #[serde(default)]
    pub bpf_events_lost: BTreeMap<String, u64>,
    /// Processes the exporter tracks now.
    #[serde(default)]
    pub tracked_processes: u64,
}

/// One process's row: its labels, then each signal's counters (cumulative since the
/// exporter began tracking the process). Each signal's room fills its own fields.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessRow {
    /// Process id as the metrics label it (empty for the `_other`/`_unknown`
    /// pseudo-processes).
    pub pid: String,
    /// Process name (whatever the process named itself: clean it before it reaches a
    /// terminal).
    pub comm: String,
    /// Container id (empty on the host).
    pub container: String,
    /// Kubernetes pod name (empty outside a pod).
    pub pod: String,
    /// Kubernetes namespace (empty outside a pod).
    pub namespace: String,
    /// The container's name in its pod (empty outside a pod or when not known).
    pub container_name: String,
    /// A host process's service cgroup (`system.slice/nginx.service`; empty in a
    /// container): with `comm`, what its series are keyed by.
    pub cgroup: String,

    // The drops room.
    /// Buffer drops by `proto/REASON` (`udp/SOCKET_RCVBUFF`, …).
    pub drops: BTreeMap<String, u64>,
    /// All buffer drops.
    pub drops_total: u64,

    // The setsockopt room.
    /// Buffer `setsockopt` calls.
    pub setsockopt: u64,
    /// Of those, requests the kernel clamped at `net.core.rmem_max`/`wmem_max`.
    pub clamped: u64,
    /// Of those, calls that failed.
    pub failed: u64,
    /// Sockets that got `SOCK_RCVBUF_LOCK` (TCP receive autotuning off).
    pub rcvbuf_locks: u64,
    /// Sockets that got `SOCK_SNDBUF_LOCK` (TCP send autotuning off).
    pub sndbuf_locks: u64,

    // The tcp_state room.
    /// TCP connections established.
    pub tcp_established: u64,
    /// Of those, connections born with a shrunken window scale.
    pub tcp_wscale_shrunk: u64,

    // The autotune room.
    /// Autotuning grows the kernel wanted but a buffer lock suppressed.
    pub tcp_autotune_suppressed: u64,

    // The netlink room.
    /// Netlink messages lost on a full receive buffer (overruns, `ENOBUFS`), all families.
    pub netlink_overruns: u64,

    // The guard room.
    /// Guard decisions by `rule/action` (`tcp-autotune/skip`, …).
    pub guard: BTreeMap<String, u64>,
}

impl ProcessRow {
    /// The pid as a number (None for the pseudo-processes).
    pub fn pid_number(&self) -> Option<u32> {
        self.pid.parse().ok()
    }
}

/// One probe's health.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProbeRow {
    /// Probe name (`drops`, `setsockopt`, …).
    pub probe: String,
    /// The hooks of the variant in use (`tracepoint/skb/kfree_skb`, …).
    pub hooks: String,
    /// What it observes.
    pub what: String,
    /// Attached and running.
    pub attached: bool,
    /// Why not, when not (`disabled` when switched off by configuration); `null` otherwise.
    pub error: Option<String>,
    /// With `--bpf.run-stats`: the kernel's total run time of the probe's programs, in
    /// nanoseconds (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_time_ns: Option<u64>,
    /// With `--bpf.run-stats`: how many times the probe's programs ran (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_count: Option<u64>,
}

impl ProbeRow {
    /// Nanoseconds per run, when the run-time stats are known and the programs ran.
    pub fn ns_per_run(&self) -> Option<f64> {
        let (t, n) = (self.run_time_ns?, self.run_count?);
        (n > 0).then(|| t as f64 / n as f64)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The keys (and value shapes) of the document as the status page and `bufscope top`
    /// have read them since the page exists.
    #[test]
    fn keys_and_shapes() {
        let doc = StatusDocument {
            version: "0.1.0".into(),
            kernel: "6.18.0".into(),
            generated_at: Some(1796000000.5),
            net_core_rmem_max: Some(212992),
            net_core_wmem_max: None,
            processes: vec![ProcessRow {
                pid: "4475".into(),
                comm: "wireguard-go".into(),
                drops: [("udp/SOCKET_RCVBUFF".to_string(), 3)].into(),
                drops_total: 3,
                ..ProcessRow::default()
            }],
            probes: vec![ProbeRow {
                probe: "drops".into(),
                attached: true,
                ..ProbeRow::default()
            }],
            attribution_unknown: [("drops".to_string(), 1)].into(),
            bpf_events_lost: BTreeMap::new(),
            tracked_processes: 1,
        };
        let v = serde_json::to_value(&doc).unwrap();
        let keys = |v: &serde_json::Value| {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(
            keys(&v),
            [
                "attribution_unknown",
                "bpf_events_lost",
                "generated_at",
                "kernel",
                "net_core_rmem_max",
                "net_core_wmem_max",
                "probes",
                "processes",
                "tracked_processes",
                "version"
            ]
        );
        let row = &v["processes"][0];
        assert_eq!(
            keys(row),
            [
                "cgroup",
                "clamped",
                "comm",
                "container",
                "container_name",
                "drops",
                "drops_total",
                "failed",
                "guard",
                "namespace",
                "netlink_overruns",
                "pid",
                "pod",
                "rcvbuf_locks",
                "setsockopt",
                "sndbuf_locks",
                "tcp_autotune_suppressed",
                "tcp_established",
                "tcp_wscale_shrunk"
            ]
        );
        assert_eq!(row["pid"], "4475", "the pid is a string");
        assert_eq!(row["drops"]["udp/SOCKET_RCVBUFF"], 3);
        assert!(row["guard"].as_object().unwrap().is_empty());
        assert_eq!(
            keys(&v["probes"][0]),
            ["attached", "error", "hooks", "probe", "what"]
        );
        assert!(v["probes"][0]["error"].is_null());
        assert!(v["net_core_wmem_max"].is_null());
        assert_eq!(v["generated_at"], 1796000000.5);
        let back: StatusDocument = serde_json::from_value(v).unwrap();
        assert_eq!(back, doc);
    }

    #[test]
    fn absent_fields_read_as_zero_but_processes_are_required() {
        let s: StatusDocument = serde_json::from_str(
            r#"{"version": "fake", "net_core_rmem_max": 4242,
                "processes": [{"pid": "4242", "comm": "fake-proc", "drops_total": 77}],
                "probes": [{"probe": "drops", "attached": true}], "new": {}}"#,
        )
        .unwrap();
        assert_eq!(s.processes[0].drops_total, 77);
        assert_eq!(s.processes[0].pid_number(), Some(4242));
        assert_eq!((s.generated_at, s.tracked_processes), (None, 0));
        assert_eq!(s.probes[0].error, None);
        let e = serde_json::from_str::<StatusDocument>(r#"{"version": "x"}"#).unwrap_err();
        assert!(e.to_string().contains("missing field `processes`"), "{e}");
    }
}
