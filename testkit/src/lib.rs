//! What bufscope's privileged integration tests (`bufscope-integration`) and its benchmarks
//! (`cargo xtask bench`) both need, in one place: start the real `bufscope run` and wait until
//! it serves ([`Exporter`]), run a child whose stdout lines arrive on a channel ([`LineChild`]),
//! stop children ([`terminate`]), run commands ([`cmd_output`], [`output_with_input`]), a
//! minimal HTTP GET ([`http_get`], [`http_get_with`]), a real Prometheus server
//! ([`Prometheus`]), the Prometheus text format
//! ([`Metrics`]), the few `/proc` readings both take ([`held_bpf_ids`], [`proc_udp_drops`],
//! [`skmem_rb`]), the kernel's BTF as bpftool prints it ([`btf_dump`]) and the probe lines of
//! `bufscope check` ([`check_probes`]).
//!
//! Everything that can fail returns [`anyhow::Result`]; the test library wraps these in
//! functions that panic with the message, the benchmarks propagate them.

#![warn(missing_docs)]

mod cgroup;
mod cmd;
mod exporter;
mod http;
mod kernel;
mod metrics;
mod process;
mod procfs;
mod prometheus;

pub use cgroup::{cgroup2_mounts, without_cgroup2};
pub use cmd::{cmd_output, output_with_input};
pub use exporter::Exporter;
pub use http::{Headers, http_get, http_get_with};
pub use kernel::{CheckedProbe, btf_dump, btf_tracepoint_args, check_probes};
pub use metrics::{Metrics, Sample, comm_of};
pub use process::{
    LineChild, PATIENCE_ENV, line_channel, patience, ready_fields, signal, terminate,
    terminate_with, wait_exit, wait_until,
};
pub use procfs::{held_bpf_ids, proc_udp_drops, skmem_rb};
pub use prometheus::{Prometheus, urlencode};
